/*
 * Internal helpers shared by every file of lib/: cache-line layout, the two kinds of assert, the futex,
 * and (through lib/clock.h) the clocks. Not installed.
 */
#ifndef MBP__COMMON_H
#define MBP__COMMON_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* One cache line. Hot fields of different owners sit on different lines with a guard line between, because
 * the adjacent-line prefetcher pulls lines in pairs. */
#define MBP_CACHELINE	      64
#define MBP_CACHELINE_ALIGNED _Alignas(MBP_CACHELINE)

#define MBP_LIKELY(x)			     __builtin_expect(!!(x), 1)
#define MBP_UNLIKELY(x)			     __builtin_expect(!!(x), 0)
#define MBP_ARRAY_SIZE(a)		     (sizeof(a) / sizeof((a)[0]))
#define mbp__container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* An options struct's field that is 0 takes the default's value (`d` filled by the struct's _init). */
#define MBP__DEFAULT(o, d, field) ((o)->field = (o)->field ? (o)->field : (d)->field)

/* Replace every 0 of `o` that means a default (mbp_opts) by that default (lib/opts.c). */
struct mbp_opts;
void mbp__opts_fill(struct mbp_opts *o);

void mbp__verify_failed(const char *expr, const char *file, int line, const char *func)
    __attribute__((noreturn));

/* Always on: an invariant whose breakage would corrupt data or lose work. */
#define MBP_VERIFY(expr)                                                                                     \
	do {                                                                                                 \
		if (MBP_UNLIKELY(!(expr)))                                                                   \
			mbp__verify_failed(#expr, __FILE__, __LINE__, __func__);                             \
	} while (0)

/* Debug builds only, for fast-path checks; a disabled assert still compiles its expression. */
#ifdef MBP_DEBUG
#define MBP_ASSERT(expr) MBP_VERIFY(expr)
#else
#define MBP_ASSERT(expr)                                                                                     \
	do {                                                                                                 \
		if (0)                                                                                       \
			(void)(expr);                                                                        \
	} while (0)
#endif

/* What a file's st_mode says it is, for messages: "a FIFO", "a character device", "a directory" ... */
const char *mbp__file_kind(unsigned mode);

/* Singular or plural by count, for messages: PLURAL(n, "row", "rows") (the tools' macro too). */
#include "util/plural.h"
/* The clocks: mbp__now_ns, mbp__clock_ns, mbp__deadline, mbp__timespec (lib/clock.h). */
#include "clock.h"

static inline void mbp__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/* Futex on a 32-bit word, process-private. Wait returns 0 when woken or when *word != expected,
 * -ETIMEDOUT when the deadline passed. */
int mbp__futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t deadline);
void mbp__futex_wake(_Atomic uint32_t *word, int n);

/* Single-writer counter update: relaxed load + relaxed store, no read-modify-write (only the owner
 * writes; readers take relaxed loads and may see a slightly old value). */
static inline void mbp__counter_add(_Atomic uint64_t *c, uint64_t v)
{
	/* relaxed: only the owner writes *c, and a reader needs no other write ordered with it */
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

static inline uint64_t mbp__counter_get(_Atomic uint64_t *c)
{
	/* relaxed: a statistic; the owner's stores are relaxed too */
	return atomic_load_explicit(c, memory_order_relaxed);
}

/* The single writer's high-water mark: raise *c to v when v is above it (as mbp__counter_add: no
 * read-modify-write, readers may see an older mark). */
static inline void mbp__counter_max(_Atomic uint64_t *c, uint64_t v)
{
	/* relaxed: only the owner writes *c */
	if (v > atomic_load_explicit(c, memory_order_relaxed))
		atomic_store_explicit(c, v, memory_order_relaxed);
}

/* The single writer starts its counter again (a step's figures). */
static inline void mbp__counter_reset(_Atomic uint64_t *c)
{
	/* relaxed: only the owner writes *c; a reader during the reset sees the old or the new count */
	atomic_store_explicit(c, 0, memory_order_relaxed);
}

/* TSan cannot see liburcu's hand-written atomics: annotate the hand-off of a node through a wfcqueue. */
#ifdef MBP_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define MBP_TSAN_RELEASE(p) __tsan_release(p)
#define MBP_TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define MBP_TSAN_RELEASE(p) ((void)(p))
#define MBP_TSAN_ACQUIRE(p) ((void)(p))
#endif

/* Power-of-two helpers. */
static inline bool mbp__is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

/* Checked size arithmetic: returns false on overflow. */
static inline bool mbp__mul_size(size_t a, size_t b, size_t *out)
{
	return !__builtin_mul_overflow(a, b, out);
}

/* a * b, saturating at UINT64_MAX (a byte count that large fits no limit but is no limit either). */
static inline uint64_t mbp__mul_sat(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

#endif

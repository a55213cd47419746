/*
 * Waiting for a peer: spin briefly, then yield, then park on a futex.
 *
 * A thread that finds its ring empty (consumer) or full (producer) calls mbp__backoff_step() in a loop,
 * re-checking its condition between calls. The budgets are in time, not iterations:
 *   1. spin (pause instruction) while elapsed < spin_ns, skipped entirely when worker threads outnumber the
 *      CPUs this process may use (spinning then only steals the slice the peer needs);
 *   2. sched_yield() while elapsed < spin_ns + yield_ns;
 *   3. park: the thread raises its parker flag, re-checks the condition once more and sleeps on a futex.
 *
 * The parking handshake is an asymmetric Dekker pattern. The waiter (rare, slow path) does
 *     store flag = 1; heavy fence; re-check condition; futex_wait
 * and the publisher (every push or pop, fast path) does
 *     store index; compiler barrier; if (flag) wake
 * The heavy fence executes a full barrier on every CPU that runs a thread of the process, so the publisher
 * needs no fence of its own: either the publisher's index store is visible to the waiter's re-check, or the
 * publisher's flag load comes after that barrier and sees 1. The heavy fence is membarrier(PRIVATE_EXPEDITED)
 * where the kernel has it, else an mprotect() that takes write access away from a private page, whose TLB
 * shootdown interrupts every CPU that runs a thread of the process (an interrupt drains the store buffer);
 * .NET's FlushProcessWriteBuffers does the same on Linux. Either way the publisher's side is decided at
 * compile time: nothing on the fast path asks which. TSan builds, which model neither, fence on both sides.
 * A wake is a syscall only when the peer really sleeps.
 */
#ifndef MBP__WAIT_H
#define MBP__WAIT_H

#include <mbpipe.h>

#include "common.h"

struct mbp__wait_opts {
	uint64_t spin_ns;  /* budget of the spin step */
	uint64_t yield_ns; /* budget of the yield step, after the spin */
	bool no_spin;	   /* skip the spin step: threads outnumber allowed CPUs */
	/* NULL, or a word whose raising (non-zero, stored with release) ends the wait too, with -ECANCELED:
	 * the trainer's abort. Whoever raises it wakes the parkers it may concern (mbp__ring_wake). */
	const _Atomic uint32_t *abort;
};

#define MBP__SPIN_NS_DEFAULT  20000u
#define MBP__YIELD_NS_DEFAULT 200000u

/* A budget of the public options (mbp_opts, mbp_train_opts, mbp_mpi_opts) as a wait uses it: their 0 is
 * the default, MBP_SPIN_NONE (MBP_YIELD_NONE, the same value) none. */
static inline uint64_t mbp__wait_budget(uint64_t v, uint64_t dflt)
{
	return v == 0 ? dflt : v == MBP_SPIN_NONE ? 0 : v;
}

/* One parked thread at most: the futex word is 1 while its owner sleeps or is about to. */
struct mbp__parker {
	_Atomic uint32_t parked;
};

/* Where a waiting thread stands in its backoff. Stack object, one per wait. */
struct mbp__backoff {
	uint64_t start;
	uint32_t iter;
	uint32_t spin_left; /* spin steps left before the next clock read */
};

/* The spin step is one pause, so the waiter re-checks its condition within about one pause (60 ns here)
 * of the peer's publication; the clock (about as costly as a pause on these VMs) is read once every
 * MBP__SPIN_STEPS_PER_CLOCK steps, so the spin budget may overrun by that many pauses. */
#define MBP__SPIN_STEPS_PER_CLOCK 32u

enum mbp__backoff_next {
	MBP__BACKOFF_AGAIN, /* re-check the condition now */
	MBP__BACKOFF_PARK,  /* budgets spent: park */
};

/* Which heavy fence: membarrier (true) or the mprotect shootdown (false); tests may clear it to run the
 * fallback. Set by mbp__wait_global_init(), which every user of a parker calls first. */
extern bool mbp__membarrier_ok;
void mbp__wait_global_init(void);

/* A full fence. TSan does not support atomic_thread_fence (gcc refuses it), so TSan builds use a seq_cst
 * read-modify-write of a thread-local word instead: a locked instruction, a full barrier on x86. */
static inline void mbp__full_fence(void)
{
#ifdef MBP_TSAN
	static _Thread_local _Atomic uint32_t word;
	atomic_fetch_add_explicit(&word, 0, memory_order_seq_cst);
#else
	atomic_thread_fence(memory_order_seq_cst); /* seq_cst: the callers name the pair it is half of */
#endif
}

/* The publisher's half of the handshake: a compiler barrier (the heavy fence is the other half); in TSan
 * builds a full fence, which TSan does see. */
static inline void mbp__light_fence(void)
{
#ifdef MBP_TSAN
	mbp__full_fence();
#else
	atomic_signal_fence(
	    memory_order_seq_cst); /* seq_cst: a compiler barrier; the heavy fence pairs with it */
#endif
}

void mbp__heavy_fence(void);

static inline void mbp__backoff_init(struct mbp__backoff *b)
{
	b->start = 0;
	b->iter = 0;
	b->spin_left = 0;
}

/* One step of the backoff; the caller re-checks its condition after MBP__BACKOFF_AGAIN. */
enum mbp__backoff_next mbp__backoff_step(struct mbp__backoff *b, const struct mbp__wait_opts *o);

/*
 * Publisher side: call after the store that may satisfy the peer's condition. Cheap when nobody sleeps:
 * a compiler barrier and one load of a line that is written only when the peer parks.
 */
static inline void mbp__parker_wake(struct mbp__parker *pk)
{
	/* Light half of the Dekker pair; partner: the heavy fence in mbp__parker_prepare(). Orders the
	 * caller's index store before the flag load below, so the load itself is relaxed. */
	mbp__light_fence();
	if (MBP_UNLIKELY(atomic_load_explicit(&pk->parked, memory_order_relaxed))) {
		/* relaxed: the futex syscall orders what follows; the waiter re-checks its condition anyway */
		atomic_store_explicit(&pk->parked, 0, memory_order_relaxed);
		mbp__futex_wake(&pk->parked, 1);
	}
}

/* Waiter side: raise the flag and fence. The caller must re-check its condition after this and either
 * cancel (mbp__parker_cancel) or sleep (mbp__parker_sleep). */
static inline void mbp__parker_prepare(struct mbp__parker *pk)
{
	/* relaxed store, ordered by the heavy fence that follows */
	atomic_store_explicit(&pk->parked, 1, memory_order_relaxed);
	/* Heavy half of the Dekker pair; partner: the light fence in mbp__parker_wake(). */
	mbp__heavy_fence();
}

static inline void mbp__parker_cancel(struct mbp__parker *pk)
{
	/* relaxed: the flag carries no data; the waker's wake at most goes unused */
	atomic_store_explicit(&pk->parked, 0, memory_order_relaxed);
}

/* Sleep until woken or the deadline; returns 0 or -ETIMEDOUT. Clears the flag either way. */
int mbp__parker_sleep(struct mbp__parker *pk, uint64_t deadline);

/*
 * The same handshake, seq_cst on both sides (the mode of a parker whose waiter parks often): the waiter's
 * flag store and the publisher's store of what it publishes are seq_cst, and so are the loads that
 * follow them, so one of the two sees the other; no membarrier. For the MPI link loop, which parks between
 * polls (an MPI arrival cannot wake it) up to tens of thousands of times a second: a membarrier per park
 * is an IPI to every CPU that runs a thread of the process (tens of us of CPU per park on these VMs),
 * against a locked instruction on each side here. The publisher publishes with a seq_cst store, then
 * calls mbp__parker_wake_sc(); the waiter calls mbp__parker_prepare_sc(), re-checks with a seq_cst load,
 * then cancels or sleeps (mbp__parker_cancel, mbp__parker_sleep).
 */
static inline void mbp__parker_wake_sc(struct mbp__parker *pk)
{
	/* seq_cst; partner: the seq_cst flag store in mbp__parker_prepare_sc() */
	if (MBP_UNLIKELY(atomic_load_explicit(&pk->parked, memory_order_seq_cst))) {
		/* relaxed: the futex syscall orders what follows; the waiter re-checks its condition anyway */
		atomic_store_explicit(&pk->parked, 0, memory_order_relaxed);
		mbp__futex_wake(&pk->parked, 1);
	}
}

static inline void mbp__parker_prepare_sc(struct mbp__parker *pk)
{
	/* seq_cst; partner: the publisher's seq_cst store before mbp__parker_wake_sc() */
	atomic_store_explicit(&pk->parked, 1, memory_order_seq_cst);
}

/*
 * The whole wait: the backoff, then park on `pk` until ready(arg) holds, o->abort is raised or the deadline
 * passes (UINT64_MAX: none). `idle(arg)`, if not NULL, runs before each park (a worker hands back its
 * cached buffers there). Returns 0 once ready (also when the abort is raised too), -ECANCELED (aborted),
 * or -ETIMEDOUT. The publisher of what `ready` checks calls mbp__parker_wake(pk).
 */
int mbp__wait_until(struct mbp__parker *pk, const struct mbp__wait_opts *o, bool (*ready)(void *), void *arg,
		    void (*idle)(void *), uint64_t deadline);

/* The same wait where the readiness check and the idle hook take arguments of their own (a queue's check,
 * its consumer's idle hook): ready(ready_arg), idle(idle_arg). */
int mbp__wait_for(struct mbp__parker *pk, const struct mbp__wait_opts *o, bool (*ready)(void *),
		  void *ready_arg, void (*idle)(void *), void *idle_arg, uint64_t deadline);

/*
 * A generation word: a value that any number of threads wait to see change (a step handed to a crew, a
 * barrier's phase, a step's end). The publisher writes what the waiters will read, then bumps the word
 * (mbp__gen_bump: release, then a wake of every sleeper); a waiter reads it (mbp__gen_get: acquire;
 * partner: that bump) and waits for it to leave the value it saw (mbp__gen_wait). No spin: these waits
 * are once or twice a step, and a sleeper costs the bump one syscall.
 */
static inline uint32_t mbp__gen_get(_Atomic uint32_t *w)
{
	/* acquire; partner: the release increment in mbp__gen_bump(): what the bumper wrote is visible */
	return atomic_load_explicit(w, memory_order_acquire);
}

static inline void mbp__gen_bump(_Atomic uint32_t *w)
{
	/* release; partner: the acquire load in mbp__gen_get(): publishes what this thread wrote before */
	atomic_fetch_add_explicit(w, 1, memory_order_release);
	mbp__futex_wake(w, INT32_MAX);
}

/* Wait until *w is no longer `seen`; returns what it is now (read with acquire, as mbp__gen_get). */
uint32_t mbp__gen_wait(_Atomic uint32_t *w, uint32_t seen);

/* mbp__gen_wait after a spin of o->spin_ns (none with o->no_spin; no yield step, and its abort word is
 * not looked at): for the waits whose bump comes soon, where a park would hand the CPU to another process
 * and the wake would wait for it back (a crew's barrier). Where threads outnumber the CPUs it parks at
 * once: a yield there put the waiter behind other processes' whole slices (a median step of 3 ms, 3
 * threads on 2 loaded CPUs), where a woken sleeper is run soon. */
uint32_t mbp__gen_wait_spin(_Atomic uint32_t *w, uint32_t seen, const struct mbp__wait_opts *o);

#endif

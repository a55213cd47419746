/*
 * mbp_pool: recycled activation buffers (see include/mbpipe/pool.h for the contract).
 *
 * Layout. Headers (struct mbp__buf, lib/pool_internal.h) live in one array reserved at creation with mmap
 * (zero pages, touched only as the pool grows), so that "did this pointer come from this pool" is a range
 * check that never dereferences a foreign pointer. Payloads are allocated one by one as the pool grows, from
 * a dedicated jemalloc arena without thread cache (MALLOCX_TCACHE_NONE: the pool is the cache) or, in
 * sanitizer builds, from aligned_alloc. Nothing is freed before mbp_pool_destroy().
 *
 * Recycling. A cache is a LIFO stack owned by one thread. get pops its top; put pushes on top, so the buffer
 * a stage releases (its input, just read, hot in its core's cache) is the one it writes next. An empty cache
 * refills half its capacity from the depot in one locked step; a full one moves its bottom (coldest) half to
 * the depot. The depot (struct depot_mpmc) is the one multi-party structure: a stack under a mutex, taken
 * once per batch by cache owners and once per call by callers without a cache.
 *
 * Exhaustion. A getter that finds the depot empty and the pool at its bound sleeps on the depot's condition
 * variable. Buffers it could use may sit in other threads' caches; two rules bring them back:
 *   1. while a getter waits (pool->waiters != 0), every release goes to the depot and takes the releasing
 *      cache's content with it, and every move into the depot wakes the waiters;
 *   2. an owner flushes its cache (mbp_pool_cache_flush) before it goes idle.
 * A release that reads waiters == 0 just before a getter registers lands in the releaser's cache; rule 2 (or
 * the owner's next release, which sees the waiter) delivers it. Every path that moves buffers into the depot
 * (cache_to_depot, a release without cache) broadcasts under the lock when waiters != 0, and waiters is
 * written only under that lock, so a waiter cannot miss a delivery made through the depot.
 *
 * Checks. Always on: a release of something that is not a buffer of this pool, or of a buffer that is not
 * held, aborts with a message (it would otherwise corrupt the free lists). A trusted pool (the engine's own,
 * mbp__pool_trust) keeps only the first check in release builds: it has no per-buffer state. MBP_DEBUG builds
 * also fill a released payload with POISON_BYTE and verify it at the next get (a write after release aborts
 * there); AddressSanitizer builds mark a released payload unaddressable, so a use after release is reported
 * where it happens.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>

#ifdef MBP_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POOL_ASAN_POISON(p, n)	 ASAN_POISON_MEMORY_REGION(p, n)
#define POOL_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POOL_ASAN_POISON(p, n)	 ((void)(p), (void)(n))
#define POOL_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#include <mbpipe.h>

#include "common.h"
#include "pool_internal.h"

#define BUF_MAGIC   0x6d627066u /* "mbpf" */
#define POISON_BYTE 0x6b
#define HUGE_PAGE   ((size_t)2 << 20)

/* A header's state. BUF_NEW: never handed out (no poison to check). BUF_LENT: held by a caller who lent it
 * to the pipeline (mbp__pool_lend): neither a second lend nor a put may take it until it comes back. */
enum { BUF_NEW = 0, BUF_FREE = 1, BUF_OUT = 2, BUF_LENT = 3 };

struct mbp_pool_cache {
	/* Only the owner touches these. */
	MBP_CACHELINE_ALIGNED mbp_pool *pool;
	uint32_t count;
	uint32_t cap;
	struct mbp__buf **stack; /* stack[count - 1] is the most recently released */
	/* Single writer (the owner, relaxed load + store); mbp_pool_stats_get reads them relaxed. */
	_Atomic uint64_t gets, hits, puts;
	/* Registry links, under the depot lock. */
	struct mbp_pool_cache *next, *prev;
};

/*
 * The depot: multi-producer, multi-consumer, everything guarded by lock. Its own cache lines, apart from the
 * read-mostly fields that every put reads.
 */
struct depot_mpmc {
	MBP_CACHELINE_ALIGNED pthread_mutex_t lock;
	pthread_cond_t cond;
	struct mbp__buf *
	    *free; /* stack, capacity max_buffers; free[nfree - 1] is the most recently released */
	uint32_t nfree;
	struct mbp_pool_cache *caches; /* registry of live caches */
	/* Written under lock (so a plain single-writer add is enough), read relaxed by stats. */
	_Atomic uint32_t allocated;
	_Atomic uint64_t refills, flushes, grows, waits, high_water;
	/* Gets and puts without cache, and the counters of destroyed caches. Gets without cache are counted
	 * outside the lock by any thread: read-modify-write. */
	_Atomic uint64_t direct_gets, direct_puts, retired_hits;
};

struct mbp_pool {
	/* Read-mostly: set at creation. */
	MBP_CACHELINE_ALIGNED size_t buf_bytes; /* what the caller asked for, mb.capacity */
	size_t payload_bytes;			/* buf_bytes rounded up to the alignment */
	size_t align;				/* effective alignment (2 MiB on the huge-page path) */
	bool huge;				/* madvise(MADV_HUGEPAGE) every payload */
	uint32_t max_buffers;			/* effective bound */
	uint32_t cache_size;
	bool trusted;	       /* mbp__pool_trust(): no header state bookkeeping */
	struct mbp__buf *hdrs; /* max_buffers headers, mmap'ed */
	size_t hdrs_map_bytes;
#ifdef MBP_HAVE_JEMALLOC
	unsigned arena;
	int mallocx_flags;
#endif
	/* Getters sleeping on depot.cond. Written under depot.lock (rarely: only around waits); read relaxed
	 * by put's fast path as a hint (see the file comment for why a stale read is harmless). */
	_Atomic uint32_t waiters;
	struct depot_mpmc depot;
	struct mbp_pool *pub_next; /* in the published list (mbp__pool_publish), under pub_lock */
};

__attribute__((noreturn, format(printf, 1, 2))) static void pool_die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("mbpipe: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}

void mbp_pool_opts_init(mbp_pool_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->align = 64;
	o->max_buffers = 1024;
	o->max_bytes = (size_t)1 << 30;
	o->cache_size = 8;
}

static void *payload_alloc(mbp_pool *p)
{
#ifdef MBP_HAVE_JEMALLOC
	return mallocx(p->payload_bytes, p->mallocx_flags);
#else
	return aligned_alloc(p->align, p->payload_bytes);
#endif
}

static void payload_free(mbp_pool *p, void *ptr)
{
#ifdef MBP_HAVE_JEMALLOC
	dallocx(ptr, p->mallocx_flags);
#else
	(void)p;
	free(ptr);
#endif
}

int mbp_pool_new(mbp_pool **pp, const mbp_pool_opts *opts)
{
	if (!pp)
		return -EINVAL;
	*pp = NULL;
	if (!opts)
		return -EINVAL;
	/* a field's 0 is its default */
	mbp_pool_opts d, filled = *opts;
	mbp_pool_opts *o = &filled;
	mbp_pool_opts_init(&d);
	MBP__DEFAULT(o, &d, align);
	MBP__DEFAULT(o, &d, max_buffers);
	MBP__DEFAULT(o, &d, max_bytes);
	MBP__DEFAULT(o, &d, cache_size);
	if (o->buf_bytes == 0 || o->align < 64 || !mbp__is_pow2(o->align))
		return -EINVAL;
	bool huge = o->huge_pages && o->buf_bytes >= HUGE_PAGE;
	size_t align = huge && o->align < HUGE_PAGE ? HUGE_PAGE : o->align;
	if (o->buf_bytes > SIZE_MAX - align - sizeof(struct mbp__buf))
		return -EOVERFLOW;
	size_t payload = (o->buf_bytes + align - 1) & ~(align - 1);
	size_t per_buf = payload + sizeof(struct mbp__buf);
	size_t by_bytes = o->max_bytes / per_buf;
	uint32_t max = by_bytes < o->max_buffers ? (uint32_t)by_bytes : o->max_buffers;
	if (max == 0)
		return -EINVAL; /* the byte bound cannot hold a single buffer */
	size_t hdrs_bytes;
	if (!mbp__mul_size(max, sizeof(struct mbp__buf), &hdrs_bytes))
		return -EOVERFLOW;

	mbp_pool *p = aligned_alloc(MBP_CACHELINE, sizeof(*p));
	if (!p)
		return -ENOMEM;
	memset(p, 0, sizeof(*p));
	p->buf_bytes = o->buf_bytes;
	p->payload_bytes = payload;
	p->align = align;
	p->huge = huge;
	p->max_buffers = max;
	p->cache_size = o->cache_size;
	p->hdrs_map_bytes = hdrs_bytes;
	/* mmap: page-aligned (whole cache lines per header) and zero pages that cost nothing until touched,
	 * so a generous bound in buffers does not cost memory up front. */
	void *h = mmap(NULL, hdrs_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (h == MAP_FAILED) {
		free(p);
		return -ENOMEM;
	}
	p->hdrs = h;
	p->depot.free = calloc(max, sizeof(*p->depot.free));
	if (!p->depot.free)
		goto nomem;
#ifdef MBP_HAVE_JEMALLOC
	size_t sz = sizeof(p->arena);
	if (mallctl("arenas.create", &p->arena, &sz, NULL, 0) != 0)
		goto nomem;
	p->mallocx_flags = MALLOCX_ARENA(p->arena) | MALLOCX_ALIGN(align) | MALLOCX_TCACHE_NONE;
#endif
	/* Adaptive (glibc): the critical sections are a few dozen instructions, so a contending cache owner
	 * spins briefly instead of paying a futex sleep and wake-up (tens of microseconds here). */
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
	int rc = pthread_mutex_init(&p->depot.lock, &ma);
	pthread_mutexattr_destroy(&ma);
	if (rc != 0)
		goto nomem_arena;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* mbp__deadline() is CLOCK_MONOTONIC */
	rc = pthread_cond_init(&p->depot.cond, &ca);
	pthread_condattr_destroy(&ca);
	if (rc != 0) {
		pthread_mutex_destroy(&p->depot.lock);
		goto nomem_arena;
	}
	*pp = p;
	return 0;
nomem_arena :
#ifdef MBP_HAVE_JEMALLOC
{
	char name[64];
	snprintf(name, sizeof(name), "arena.%u.destroy", p->arena);
	mallctl(name, NULL, NULL, NULL, 0);
}
#endif
nomem:
	free(p->depot.free);
	munmap(p->hdrs, p->hdrs_map_bytes);
	free(p);
	return -ENOMEM;
}

size_t mbp_pool_buf_bytes(const mbp_pool *p)
{
	return p->buf_bytes;
}

/*
 * Buffers held by callers: gets minus puts over every cache and the direct path. Under the depot lock
 * (the registry is stable). Exact when the pool is quiet; while other threads run, their counters are read
 * at slightly different moments, so the sum may be off by the operations in flight: clamped to
 * [0, allocated].
 */
static uint64_t in_use_locked(mbp_pool *p, uint64_t *gets, uint64_t *puts, uint64_t *hits)
{
	struct depot_mpmc *d = &p->depot;
	uint64_t g = mbp__counter_get(&d->direct_gets), u = mbp__counter_get(&d->direct_puts);
	uint64_t h = mbp__counter_get(&d->retired_hits);
	for (struct mbp_pool_cache *c = d->caches; c; c = c->next) {
		g += mbp__counter_get(&c->gets);
		u += mbp__counter_get(&c->puts);
		h += mbp__counter_get(&c->hits);
	}
	if (gets) {
		*gets = g;
		*puts = u;
		*hits = h;
	}
	int64_t in_use = (int64_t)(g - u); /* modular: a buffer may be got in one cache, put in another */
	/* relaxed: written under the lock this caller holds */
	uint32_t allocated = atomic_load_explicit(&d->allocated, memory_order_relaxed);
	if (in_use < 0)
		return 0;
	return (uint64_t)in_use > allocated ? allocated : (uint64_t)in_use;
}

/* Sample the high-water mark. Under lock; `extra` counts a get that is not in the counters yet. */
static void note_high_water(mbp_pool *p, uint64_t extra)
{
	uint64_t now = in_use_locked(p, NULL, NULL, NULL) + extra;
	if (now > mbp__counter_get(&p->depot.high_water)) /* relaxed: writers hold the lock */
		atomic_store_explicit(&p->depot.high_water, now, memory_order_relaxed);
}

void mbp_pool_stats_get(mbp_pool *p, mbp_pool_stats *st)
{
	struct depot_mpmc *d = &p->depot;
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&d->lock);
	st->in_use = in_use_locked(p, &st->gets, &st->puts, &st->cache_hits);
	if (st->in_use > mbp__counter_get(&d->high_water)) /* relaxed: writers hold the lock */
		atomic_store_explicit(&d->high_water, st->in_use, memory_order_relaxed);
	st->high_water = mbp__counter_get(&d->high_water);
	pthread_mutex_unlock(&d->lock);
	st->refills = mbp__counter_get(&d->refills);
	st->flushes = mbp__counter_get(&d->flushes);
	st->grows = mbp__counter_get(&d->grows);
	st->waits = mbp__counter_get(&d->waits);
	st->allocated = atomic_load_explicit(&d->allocated, memory_order_relaxed); /* relaxed: a statistic */
	st->bytes = st->allocated * (p->payload_bytes + sizeof(struct mbp__buf));
	st->max_buffers = p->max_buffers;
}

static void wake_waiters_locked(mbp_pool *p)
{
	/* relaxed: written under this lock */
	if (atomic_load_explicit(&p->waiters, memory_order_relaxed))
		pthread_cond_broadcast(&p->depot.cond);
}

/* Move the bottom (coldest) n buffers of the cache to the depot. Under lock. */
static void cache_to_depot_locked(mbp_pool *p, struct mbp_pool_cache *c, uint32_t n)
{
	struct depot_mpmc *d = &p->depot;
	if (MBP_UNLIKELY(n > c->count || d->nfree + n > p->max_buffers))
		pool_die("pool %p: moving %" PRIu32 " of %" PRIu32
			 " cached buffers into a depot holding %" PRIu32 " of %" PRIu32 ": corrupt counts",
			 (void *)p, n, c->count, d->nfree, p->max_buffers);
	if (n == 0)
		return;
	memcpy(&d->free[d->nfree], c->stack, n * sizeof(*c->stack));
	d->nfree += n;
	memmove(c->stack, c->stack + n, (c->count - n) * sizeof(*c->stack));
	c->count -= n;
	mbp__counter_add(&d->flushes, 1);
	wake_waiters_locked(p);
}

int mbp_pool_cache_new(mbp_pool *p, mbp_pool_cache **cp)
{
	if (!cp)
		return -EINVAL;
	*cp = NULL;
	if (!p)
		return -EINVAL;
	/* its own cache lines: the owner writes its counters on every get and put */
	struct mbp_pool_cache *c = aligned_alloc(MBP_CACHELINE, sizeof(*c));
	if (!c)
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	c->cap = p->cache_size;
	c->stack = calloc(c->cap, sizeof(*c->stack));
	if (!c->stack) {
		free(c);
		return -ENOMEM;
	}
	c->pool = p;
	pthread_mutex_lock(&p->depot.lock);
	c->next = p->depot.caches;
	if (c->next)
		c->next->prev = c;
	p->depot.caches = c;
	pthread_mutex_unlock(&p->depot.lock);
	*cp = c;
	return 0;
}

void mbp_pool_cache_flush(mbp_pool_cache *c)
{
	if (!c || c->count == 0)
		return;
	mbp_pool *p = c->pool;
	pthread_mutex_lock(&p->depot.lock);
	cache_to_depot_locked(p, c, c->count);
	pthread_mutex_unlock(&p->depot.lock);
}

/* Remove a cache from the registry, keeping its counters in the totals. Under lock. */
static void cache_unlink_locked(mbp_pool *p, struct mbp_pool_cache *c)
{
	struct depot_mpmc *d = &p->depot;
	if (c->prev)
		c->prev->next = c->next;
	else
		d->caches = c->next;
	if (c->next)
		c->next->prev = c->prev;
	/* relaxed, the three: statistics, also added to by getters without a cache (read-modify-write) */
	atomic_fetch_add_explicit(&d->direct_gets, mbp__counter_get(&c->gets), memory_order_relaxed);
	atomic_fetch_add_explicit(&d->direct_puts, mbp__counter_get(&c->puts), memory_order_relaxed);
	atomic_fetch_add_explicit(&d->retired_hits, mbp__counter_get(&c->hits), memory_order_relaxed);
}

void mbp_pool_cache_destroy(mbp_pool_cache *c)
{
	if (!c)
		return;
	mbp_pool *p = c->pool;
	pthread_mutex_lock(&p->depot.lock);
	cache_to_depot_locked(p, c, c->count);
	cache_unlink_locked(p, c);
	pthread_mutex_unlock(&p->depot.lock);
	free(c->stack);
	free(c);
}

/* The published pools; a put through the list holds the read side while it finds the pool and gives the
 * buffer back, so the pool cannot go meanwhile (destroy unpublishes first). */
static pthread_rwlock_t pub_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct mbp_pool *published;

void mbp__pool_publish(mbp_pool *p, bool on)
{
	pthread_rwlock_wrlock(&pub_lock);
	struct mbp_pool **q = &published;
	while (*q && *q != p)
		q = &(*q)->pub_next;
	if (on && !*q) {
		p->pub_next = published;
		published = p;
	} else if (!on && *q) {
		*q = p->pub_next;
	}
	pthread_rwlock_unlock(&pub_lock);
}

bool mbp__pool_put_published(mbp_mb *mb)
{
	pthread_rwlock_rdlock(&pub_lock);
	struct mbp_pool *q = published;
	while (q && !mbp__pool_owns(q, mb))
		q = q->pub_next;
	if (q)
		mbp_pool_put(q, NULL, mb); /* checks that the caller holds it */
	pthread_rwlock_unlock(&pub_lock);
	return q != NULL;
}

int mbp_pool_destroy(mbp_pool *p)
{
	if (!p)
		return 0;
	mbp__pool_publish(p, false);
	struct depot_mpmc *d = &p->depot;
	pthread_mutex_lock(&d->lock);
	uint32_t cached = 0;
	for (struct mbp_pool_cache *c = d->caches; c; c = c->next)
		cached += c->count; /* the owners have stopped (contract) */
	/* relaxed: written under the lock held here */
	uint32_t allocated = atomic_load_explicit(&d->allocated, memory_order_relaxed);
	uint32_t held = allocated - d->nfree - cached;
	pthread_mutex_unlock(&d->lock);
	if (held != 0) {
#ifdef MBP_DEBUG
		fprintf(stderr,
			"mbpipe: mbp_pool_destroy: %" PRIu32 " buffer(s) still held by callers; pool kept\n",
			held);
#endif
		return -EBUSY;
	}
	while (d->caches) {
		struct mbp_pool_cache *c = d->caches;
		cache_unlink_locked(p, c);
		free(c->stack);
		free(c);
	}
	for (uint32_t i = 0; i < allocated; i++) {
		POOL_ASAN_UNPOISON(p->hdrs[i].payload, p->payload_bytes);
		payload_free(p, p->hdrs[i].payload);
	}
#ifdef MBP_HAVE_JEMALLOC
	char name[64];
	snprintf(name, sizeof(name), "arena.%u.destroy", p->arena);
	mallctl(name, NULL, NULL, NULL,
		0); /* no thread is bound to it (we use MALLOCX_ARENA), so it succeeds */
#endif
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
	munmap(p->hdrs, p->hdrs_map_bytes);
	free(d->free);
	free(p);
	return 0;
}

/* Allocate one more buffer. Under lock: growth is rare (never in steady state) and holding the lock keeps
 * the header array dense. */
static int grow_locked(mbp_pool *p, struct mbp__buf **out)
{
	struct depot_mpmc *d = &p->depot;
	uint32_t idx = atomic_load_explicit(&d->allocated, memory_order_relaxed); /* relaxed: under lock */
	void *mem = payload_alloc(p);
	if (!mem)
		return -ENOMEM;
	/* Advice only: failure (THP disabled, madvise mode "never") just means 4 KiB pages. The memory is
	 * fresh from the arena and untouched, so the first write faults in huge pages. */
	if (p->huge)
		(void)madvise(mem, p->payload_bytes, MADV_HUGEPAGE);
	struct mbp__buf *b = &p->hdrs[idx];
	b->magic = BUF_MAGIC;
	b->state = BUF_NEW;
	b->pool = p;
	b->payload = mem;
	/* relaxed: writers hold the lock; lock-free readers (statistics) want no more */
	atomic_store_explicit(&d->allocated, idx + 1, memory_order_relaxed);
	mbp__counter_add(&d->grows, 1);
	*out = b;
	return 0;
}

int mbp__pool_reserve(mbp_pool *p, uint32_t n)
{
	struct depot_mpmc *d = &p->depot;
	int rc = 0;
	pthread_mutex_lock(&d->lock);
	/* relaxed: written under the lock held here */
	while (rc == 0 && atomic_load_explicit(&d->allocated, memory_order_relaxed) < n &&
	       atomic_load_explicit(&d->allocated, memory_order_relaxed) < p->max_buffers) {
		struct mbp__buf *b;
		if ((rc = grow_locked(p, &b)) == 0) {
			POOL_ASAN_POISON(b->payload, p->payload_bytes); /* free, as a released one */
			d->free[d->nfree++] = b; /* BUF_NEW: no poison pattern to check at its first get */
		}
	}
	wake_waiters_locked(p);
	pthread_mutex_unlock(&d->lock);
	return rc;
}

/*
 * Take one buffer from the depot (refilling the cache when there is one), grow, or wait. The caller's cache,
 * if any, is empty.
 */
__attribute__((noinline)) static int depot_mpmc_get(mbp_pool *p, struct mbp_pool_cache *c,
						    struct mbp__buf **out, int64_t timeout_ns)
{
	struct depot_mpmc *d = &p->depot;
	uint64_t deadline = 0;
	int rc = 0;
	pthread_mutex_lock(&d->lock);
	for (;;) {
		if (d->nfree) {
			/* Refill half the cache, unless other getters wait: then take one, leave them the rest. */
			uint32_t n = 1; /* relaxed: waiters is written under the lock held here */
			if (c && atomic_load_explicit(&p->waiters, memory_order_relaxed) == 0)
				n = c->cap / 2 ? c->cap / 2 : 1;
			if (n > d->nfree)
				n = d->nfree;
			d->nfree -= n;
			/* hand out the most recently released; the rest keep their order in the cache */
			*out = d->free[d->nfree + n - 1];
			if (n > 1) {
				memcpy(&c->stack[c->count], &d->free[d->nfree], (n - 1) * sizeof(*c->stack));
				c->count += n - 1;
			}
			if (c)
				mbp__counter_add(&d->refills, 1);
			break;
		}
		/* relaxed: written under the lock held here */
		if (atomic_load_explicit(&d->allocated, memory_order_relaxed) < p->max_buffers) {
			rc = grow_locked(p, out);
			break;
		}
		if (timeout_ns == 0) {
			rc = -EAGAIN;
			break;
		}
		if (deadline == 0) {
			deadline = mbp__deadline(timeout_ns);
			mbp__counter_add(&d->waits, 1);
		} else if (deadline != UINT64_MAX && mbp__now_ns() >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		/* Registered under the lock that every delivery to the depot holds when it reads waiters
		 * (wake_waiters_locked): a delivery after this point sees us. relaxed: the lock orders it. */
		atomic_store_explicit(&p->waiters,
				      atomic_load_explicit(&p->waiters, memory_order_relaxed) + 1,
				      memory_order_relaxed);
		if (deadline == UINT64_MAX) {
			pthread_cond_wait(&d->cond, &d->lock);
		} else {
			struct timespec ts = mbp__timespec(deadline);
			pthread_cond_timedwait(&d->cond, &d->lock, &ts);
		}
		/* relaxed: under the lock again */
		atomic_store_explicit(&p->waiters,
				      atomic_load_explicit(&p->waiters, memory_order_relaxed) - 1,
				      memory_order_relaxed);
	}
	if (rc == 0 && !c) {
		/* counted under the lock, as a put without a cache is, so that a pool no cache uses samples
		 * its high-water mark exactly (relaxed: a statistic; read-modify-write, other getters add) */
		atomic_fetch_add_explicit(&d->direct_gets, 1, memory_order_relaxed);
		note_high_water(p, 0);
	} else if (rc == 0) {
		note_high_water(p, 1); /* the cache's own count of this get follows, on its owner's thread */
	}
	pthread_mutex_unlock(&d->lock);
	return rc;
}

#ifdef MBP_DEBUG
static void poison_check(const struct mbp__buf *b, size_t n)
{
	const unsigned char *data = b->payload;
	uint64_t pattern;
	memset(&pattern, POISON_BYTE, sizeof(pattern));
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, data + i, 8);
		if (w != pattern)
			break;
	}
	for (; i < n; i++)
		if (data[i] != POISON_BYTE)
			pool_die("mbp_pool_get: buffer %p of pool %p was written after its release "
				 "(byte %zu is 0x%02x, poison 0x%02x)",
				 b->payload, (void *)b->pool, i, data[i], POISON_BYTE);
}
#endif

void mbp__pool_trust(mbp_pool *p)
{
#ifndef MBP_DEBUG
	p->trusted = true;
#else
	(void)p;
#endif
}

int mbp_pool_get(mbp_pool *p, mbp_pool_cache *c, mbp_mb **mbp, int64_t timeout_ns)
{
	if (MBP_UNLIKELY(!p || !mbp || (c && c->pool != p)))
		return -EINVAL;
	struct mbp__buf *b;
	if (c && c->count) {
		b = c->stack[--c->count];
		mbp__counter_add(&c->hits, 1);
	} else {
		int rc = depot_mpmc_get(p, c, &b, timeout_ns);
		if (rc)
			return rc;
	}
	POOL_ASAN_UNPOISON(b->payload, p->payload_bytes);
	if (!p->trusted) {
		if (MBP_UNLIKELY(b->magic != BUF_MAGIC || b->state == BUF_OUT || b->state == BUF_LENT))
			pool_die("mbp_pool_get: free list of pool %p is corrupt (buffer header %p: magic "
				 "0x%08" PRIx32 ", state %" PRIu32 ")",
				 (void *)p, (void *)b, b->magic, b->state);
#ifdef MBP_DEBUG
		if (b->state == BUF_FREE)
			poison_check(b, p->buf_bytes);
#endif
		b->state = BUF_OUT;
		b->link[0] = b->link[1] = NULL;
		b->kind = 0;
	}
	mbp_mb *mb = &b->mb;
	mb->data = b->payload; /* restored: a caller may have changed the public copy */
	mb->capacity = p->buf_bytes;
	mb->rows = 0;
	mb->row_bytes = 0;
	mb->status = 0;
	mb->stage = UINT32_MAX;
	mb->seq = 0;
	mb->job = NULL;
	mb->user = NULL;
	mb->carry = NULL;
	if (c) /* without a cache the get was counted under the depot's lock */
		mbp__counter_add(&c->gets, 1);
	*mbp = mb;
	return 0;
}

/* The header of mb when it is one of p's headers, else NULL. Integer arithmetic only: mb may be anything,
 * and is not dereferenced. */
static struct mbp__buf *buf_in_range(const mbp_pool *p, const mbp_mb *mb)
{
	uintptr_t a = (uintptr_t)mb - offsetof(struct mbp__buf, mb);
	uintptr_t lo = (uintptr_t)p->hdrs;
	uintptr_t hi = lo + (uintptr_t)p->max_buffers * sizeof(struct mbp__buf);
	if (MBP_UNLIKELY(a < lo || a >= hi || (a - lo) % sizeof(struct mbp__buf) != 0))
		return NULL;
	return (struct mbp__buf *)a;
}

bool mbp__pool_owns(const mbp_pool *p, const mbp_mb *mb)
{
	return p && buf_in_range(p, mb) != NULL;
}

/* The header of mb, after proving it is a held buffer of p. */
static struct mbp__buf *checked_buf(mbp_pool *p, mbp_mb *mb)
{
	if (MBP_UNLIKELY(!p))
		pool_die("mbp_pool_put: NULL pool (buffer %p)", (void *)mb);
	struct mbp__buf *b = buf_in_range(p, mb);
	if (MBP_UNLIKELY(!b))
		pool_die("mbp_pool_put: %p is not a buffer of pool %p (foreign pointer)", (void *)mb,
			 (void *)p);
	if (p->trusted)
		return b; /* do not touch the getter's line */
	if (MBP_UNLIKELY(b->magic != BUF_MAGIC))
		pool_die("mbp_pool_put: %p is not a buffer of pool %p (slot never allocated)", (void *)mb,
			 (void *)p);
	if (MBP_UNLIKELY(b->state == BUF_LENT))
		pool_die(
		    "mbp_pool_put: buffer %p (pool %p) is lent to a pipeline (submitted, result not back)",
		    (void *)mb, (void *)p);
	if (MBP_UNLIKELY(b->state != BUF_OUT))
		pool_die("mbp_pool_put: double release of buffer %p (pool %p)", (void *)mb, (void *)p);
	return b;
}

int mbp__pool_lend(mbp_pool *p, mbp_mb *mb)
{
	struct mbp__buf *b = buf_in_range(p, mb);
	if (!b || b->magic != BUF_MAGIC) /* the slot's header is ours to read even if never allocated */
		return -EINVAL;
	/* A compare-and-swap: two threads submitting one buffer at once (a caller's bug) must not both
	 * win. Acquire on success; partner: the release in mbp__pool_unlend(), so that a buffer coming back
	 * from a result is seen whole by its next submitter. */
	uint32_t out = BUF_OUT;
	return __atomic_compare_exchange_n(&b->state, &out, BUF_LENT, false, __ATOMIC_ACQUIRE,
					   __ATOMIC_RELAXED)
		   ? 0
		   : -EINVAL;
}

void mbp__pool_unlend(mbp_mb *mb)
{
	struct mbp__buf *b = mbp__buf_of(mb);
	MBP_VERIFY(b->state == BUF_LENT);
	/* release; partner: the acquire compare-and-swap of the next mbp__pool_lend() */
	__atomic_store_n(&b->state, BUF_OUT, __ATOMIC_RELEASE);
}

/* A release that goes through the depot: no cache, a full cache, or a getter waiting. */
__attribute__((noinline)) static void put_slow(mbp_pool *p, struct mbp_pool_cache *c, struct mbp__buf *b)
{
	struct depot_mpmc *d = &p->depot;
	pthread_mutex_lock(&d->lock);
	/* relaxed: waiters is written under the lock held here */
	if (c && atomic_load_explicit(&p->waiters, memory_order_relaxed) == 0) {
		/* No getter waits (any more): keep this one on top of the cache, moving the coldest half of
		 * the cache to the depot first if it is full. */
		if (c->count == c->cap)
			cache_to_depot_locked(p, c, c->cap - c->cap / 2);
		pthread_mutex_unlock(&d->lock);
		c->stack[c->count++] = b;
		mbp__counter_add(&c->puts, 1);
		return;
	}
	if (c) {
		/* a getter waits: give it this buffer and everything the cache holds */
		cache_to_depot_locked(p, c, c->count);
		mbp__counter_add(&c->puts, 1);
	} else { /* relaxed: a statistic, read-modify-write (several threads put without a cache) */
		atomic_fetch_add_explicit(&d->direct_puts, 1, memory_order_relaxed);
	}
	d->free[d->nfree++] = b; /* on top: the hottest is the next one out */
	wake_waiters_locked(p);
	pthread_mutex_unlock(&d->lock);
}

void mbp_pool_put(mbp_pool *p, mbp_pool_cache *c, mbp_mb *mb)
{
	struct mbp__buf *b = checked_buf(p, mb);
	if (MBP_UNLIKELY(c && c->pool != p))
		pool_die("mbp_pool_put: cache %p belongs to pool %p, not %p", (void *)c, (void *)c->pool,
			 (void *)p);
	if (!p->trusted)
		b->state = BUF_FREE;
#ifdef MBP_DEBUG
	memset(b->payload, POISON_BYTE, p->buf_bytes);
#endif
	POOL_ASAN_POISON(b->payload, p->payload_bytes);
	/* relaxed: a hint; see the file comment for the release that races with a getter registering */
	if (c && MBP_LIKELY(atomic_load_explicit(&p->waiters, memory_order_relaxed) == 0) &&
	    MBP_LIKELY(c->count < c->cap)) {
		c->stack[c->count++] = b;
		mbp__counter_add(&c->puts, 1);
		return;
	}
	put_slow(p, c, b);
}

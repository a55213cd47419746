/*
 * mbp_pool: recycled activation buffers (see include/mbpipe/pool.h for the contract).
 *
 * Layout. Headers (struct buf) live in one array allocated at creation, so that "did this pointer come from
 * this pool" is a range check; payloads are allocated one by one as the pool grows, from a dedicated
 * jemalloc arena without thread cache (MALLOCX_TCACHE_NONE: the pool is the cache) or, in sanitizer builds,
 * from aligned_alloc. Nothing is freed before mbp_pool_destroy().
 *
 * Recycling. A cache is a LIFO stack owned by one thread. get pops its top; put pushes on top, so the
 * buffer a stage releases (its input, just read, hot in its core's cache) is the one it writes next. An
 * empty cache refills half its capacity from the depot in one locked step; a full one moves its bottom
 * (coldest) half to the depot. When a getter waits on an exhausted pool, releases bypass caches and go to
 * the depot, where the waiter is signalled; owners flush their caches before going idle.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#ifdef MBP_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include <mbpipe.h>

#include "common.h"
#include "pool_internal.h"

#define BUF_MAGIC   0x6d627066u /* "mbpf" */
#define POISON_BYTE 0x6b
#define HUGE_PAGE   (2u << 20)

enum { BUF_FREE = 1, BUF_OUT = 2 };

struct mbp_pool_cache {
	mbp_pool *pool;
	uint32_t count;
	uint32_t cap;
	struct mbp__buf **stack;	    /* stack[count - 1] is the most recently released */
	struct mbp_pool_cache *next, *prev; /* registry, under pool->lock */
	/* Single writer (the owner); any thread reads them for stats. */
	_Atomic uint64_t gets, hits, puts;
	_Atomic uint32_t held; /* mirror of count for readers */
};

struct mbp_pool {
	mbp_pool_opts o;
	size_t payload_bytes;  /* buf_bytes rounded up to the alignment (huge pages: to 2 MiB) */
	uint32_t max_buffers;  /* effective bound */
	struct mbp__buf *hdrs; /* max_buffers headers */
#ifdef MBP_HAVE_JEMALLOC
	unsigned arena;
	int mallocx_flags;
#endif
	/* Depot: everything below is guarded by lock. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct mbp__buf **free; /* depot stack, capacity max_buffers */
	uint32_t nfree;
	_Atomic uint32_t allocated; /* written under lock; read relaxed by stats */
	_Atomic uint32_t waiters;   /* getters sleeping on cond; read relaxed by put's fast path */
	struct mbp_pool_cache *caches;
	/* Counters written under lock, read relaxed. */
	_Atomic uint64_t refills, flushes, grows, waits, high_water;
	_Atomic uint64_t direct_gets, direct_puts; /* cache NULL, and destroyed caches' counters (RMW) */
	_Atomic uint64_t cache_hits_done;	   /* folded-in hits of destroyed caches */
};

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
	size_t align = p->o.align;
	if (p->o.huge_pages && p->payload_bytes >= HUGE_PAGE && align < HUGE_PAGE)
		align = HUGE_PAGE;
	return aligned_alloc(align, p->payload_bytes);
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

int mbp_pool_new(mbp_pool **pp, const mbp_pool_opts *o)
{
	if (!pp)
		return -EINVAL;
	*pp = NULL;
	if (!o || o->buf_bytes == 0 || o->align < 64 || !mbp__is_pow2(o->align) || o->max_buffers == 0 ||
	    o->cache_size == 0)
		return -EINVAL;
	size_t align = o->align;
	if (o->huge_pages && o->buf_bytes >= HUGE_PAGE && align < HUGE_PAGE)
		align = HUGE_PAGE;
	if (o->buf_bytes > SIZE_MAX - align)
		return -EOVERFLOW;
	size_t payload = (o->buf_bytes + align - 1) & ~(align - 1);
	size_t per_buf = payload + sizeof(struct mbp__buf);
	uint64_t by_bytes = o->max_bytes / per_buf;
	uint32_t max = o->max_buffers;
	if (by_bytes < max)
		max = (uint32_t)by_bytes;
	if (max == 0)
		return -EINVAL; /* the byte bound cannot hold a single buffer */

	mbp_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->o = *o;
	p->o.align = align;
	p->payload_bytes = payload;
	p->max_buffers = max;
	p->hdrs = calloc(max, sizeof(*p->hdrs));
	p->free = calloc(max, sizeof(*p->free));
	if (!p->hdrs || !p->free)
		goto nomem;
#ifdef MBP_HAVE_JEMALLOC
	size_t sz = sizeof(p->arena);
	if (mallctl("arenas.create", &p->arena, &sz, NULL, 0) != 0)
		goto nomem;
	p->mallocx_flags = MALLOCX_ARENA(p->arena) | MALLOCX_ALIGN(align) | MALLOCX_TCACHE_NONE;
#endif
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutex_init(&p->lock, &ma);
	pthread_mutexattr_destroy(&ma);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cond, &ca);
	pthread_condattr_destroy(&ca);
	*pp = p;
	return 0;
nomem:
	free(p->hdrs);
	free(p->free);
	free(p);
	return -ENOMEM;
}

static uint64_t cache_in_use(const struct mbp_pool_cache *c)
{
	return mbp__counter_get((_Atomic uint64_t *)&c->gets) -
	       mbp__counter_get((_Atomic uint64_t *)&c->puts);
}

void mbp_pool_stats_get(mbp_pool *p, mbp_pool_stats *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&p->lock);
	int64_t in_use =
	    (int64_t)mbp__counter_get(&p->direct_gets) - (int64_t)mbp__counter_get(&p->direct_puts);
	st->gets = mbp__counter_get(&p->direct_gets);
	st->cache_hits = mbp__counter_get(&p->cache_hits_done);
	for (struct mbp_pool_cache *c = p->caches; c; c = c->next) {
		in_use += (int64_t)cache_in_use(c);
		st->gets += mbp__counter_get(&c->gets);
		st->cache_hits += mbp__counter_get(&c->hits);
	}
	pthread_mutex_unlock(&p->lock);
	st->refills = mbp__counter_get(&p->refills);
	st->flushes = mbp__counter_get(&p->flushes);
	st->grows = mbp__counter_get(&p->grows);
	st->waits = mbp__counter_get(&p->waits);
	st->high_water = mbp__counter_get(&p->high_water);
	st->in_use = in_use < 0 ? 0 : (uint64_t)in_use; /* counters of two threads read at slightly
							    different times */
	st->allocated = atomic_load_explicit(&p->allocated, memory_order_relaxed);
	st->bytes = st->allocated * (p->payload_bytes + sizeof(struct mbp__buf));
	st->max_buffers = p->max_buffers;
}

size_t mbp_pool_buf_bytes(const mbp_pool *p)
{
	return p->o.buf_bytes;
}

/* Buffers outside the depot; called under lock after a depot operation. */
static void note_high_water(mbp_pool *p)
{
	uint64_t out = atomic_load_explicit(&p->allocated, memory_order_relaxed) - p->nfree;
	if (out > mbp__counter_get(&p->high_water))
		mbp__counter_add(&p->high_water, out - mbp__counter_get(&p->high_water));
}

/* Move the bottom n buffers of the cache to the depot. Under lock. */
static void cache_to_depot(mbp_pool *p, struct mbp_pool_cache *c, uint32_t n)
{
	if (n == 0)
		return;
	memcpy(&p->free[p->nfree], c->stack, n * sizeof(*c->stack));
	p->nfree += n;
	memmove(c->stack, c->stack + n, (c->count - n) * sizeof(*c->stack));
	c->count -= n;
	atomic_store_explicit(&c->held, c->count, memory_order_relaxed);
	mbp__counter_add(&p->flushes, 1);
	if (atomic_load_explicit(&p->waiters, memory_order_relaxed))
		pthread_cond_broadcast(&p->cond);
}

int mbp_pool_cache_new(mbp_pool *p, mbp_pool_cache **cp)
{
	if (!p || !cp)
		return -EINVAL;
	struct mbp_pool_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->cap = p->o.cache_size;
	c->stack = calloc(c->cap, sizeof(*c->stack));
	if (!c->stack) {
		free(c);
		return -ENOMEM;
	}
	c->pool = p;
	pthread_mutex_lock(&p->lock);
	c->next = p->caches;
	if (p->caches)
		p->caches->prev = c;
	p->caches = c;
	pthread_mutex_unlock(&p->lock);
	*cp = c;
	return 0;
}

void mbp_pool_cache_flush(mbp_pool_cache *c)
{
	if (!c || c->count == 0)
		return;
	mbp_pool *p = c->pool;
	pthread_mutex_lock(&p->lock);
	cache_to_depot(p, c, c->count);
	pthread_mutex_unlock(&p->lock);
}

static void cache_unlink(mbp_pool *p, struct mbp_pool_cache *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		p->caches = c->next;
	if (c->next)
		c->next->prev = c->prev;
	/* keep the counters of the departed cache in the totals */
	atomic_fetch_add_explicit(&p->direct_gets, mbp__counter_get(&c->gets), memory_order_relaxed);
	atomic_fetch_add_explicit(&p->direct_puts, mbp__counter_get(&c->puts), memory_order_relaxed);
	atomic_fetch_add_explicit(&p->cache_hits_done, mbp__counter_get(&c->hits), memory_order_relaxed);
}

void mbp_pool_cache_destroy(mbp_pool_cache *c)
{
	if (!c)
		return;
	mbp_pool *p = c->pool;
	pthread_mutex_lock(&p->lock);
	cache_to_depot(p, c, c->count);
	cache_unlink(p, c);
	pthread_mutex_unlock(&p->lock);
	free(c->stack);
	free(c);
}

int mbp_pool_destroy(mbp_pool *p)
{
	if (!p)
		return 0;
	pthread_mutex_lock(&p->lock);
	uint32_t cached = 0;
	for (struct mbp_pool_cache *c = p->caches; c; c = c->next)
		cached += c->count;
	uint32_t allocated = atomic_load_explicit(&p->allocated, memory_order_relaxed);
	bool busy = p->nfree + cached != allocated;
	pthread_mutex_unlock(&p->lock);
	if (busy) {
#ifdef MBP_DEBUG
		fprintf(stderr, "mbp_pool_destroy: %u buffer(s) still held by callers; pool kept\n",
			allocated - p->nfree - cached);
#endif
		return -EBUSY;
	}
	while (p->caches) {
		struct mbp_pool_cache *c = p->caches;
		cache_unlink(p, c);
		free(c->stack);
		free(c);
	}
	for (uint32_t i = 0; i < allocated; i++)
		payload_free(p, p->hdrs[i].mb.data);
#ifdef MBP_HAVE_JEMALLOC
	char name[64];
	snprintf(name, sizeof(name), "arena.%u.destroy", p->arena);
	mallctl(name, NULL, NULL, NULL, 0);
#endif
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p->hdrs);
	free(p->free);
	free(p);
	return 0;
}

/* Allocate one more buffer. Under lock: growth is rare (never in steady state) and holding the lock keeps
 * the header array dense. */
static int grow(mbp_pool *p, struct mbp__buf **out)
{
	uint32_t idx = atomic_load_explicit(&p->allocated, memory_order_relaxed);
	void *mem = payload_alloc(p);
	if (!mem)
		return -ENOMEM;
	if (p->o.huge_pages && p->payload_bytes >= HUGE_PAGE)
		madvise(mem, p->payload_bytes,
			MADV_HUGEPAGE); /* advice only: failure just means 4 KiB pages */
	struct mbp__buf *b = &p->hdrs[idx];
	b->magic = BUF_MAGIC;
	b->pool = p;
	b->mb.data = mem;
	b->mb.capacity = p->o.buf_bytes;
	atomic_store_explicit(&p->allocated, idx + 1, memory_order_relaxed);
	mbp__counter_add(&p->grows, 1);
	*out = b;
	return 0;
}

static int depot_get(mbp_pool *p, struct mbp_pool_cache *c, struct mbp__buf **out, int64_t timeout_ns)
{
	uint64_t deadline = 0;
	int rc = 0;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		if (p->nfree) {
			if (c) {
				/* refill half the cache; hand out the most recently released of the batch */
				uint32_t n = c->cap / 2 ? c->cap / 2 : 1;
				if (n > p->nfree)
					n = p->nfree;
				p->nfree -= n;
				*out = p->free[p->nfree + n - 1];
				memcpy(&c->stack[c->count], &p->free[p->nfree], (n - 1) * sizeof(*c->stack));
				c->count += n - 1;
				atomic_store_explicit(&c->held, c->count, memory_order_relaxed);
				mbp__counter_add(&p->refills, 1);
			} else {
				*out = p->free[--p->nfree];
			}
			break;
		}
		if (atomic_load_explicit(&p->allocated, memory_order_relaxed) < p->max_buffers) {
			rc = grow(p, out);
			break;
		}
		if (timeout_ns == 0) {
			rc = -EAGAIN;
			break;
		}
		if (deadline == 0) {
			deadline = mbp__deadline(timeout_ns);
			mbp__counter_add(&p->waits, 1);
		}
		atomic_store_explicit(&p->waiters,
				      atomic_load_explicit(&p->waiters, memory_order_relaxed) + 1,
				      memory_order_relaxed);
		if (deadline == UINT64_MAX) {
			pthread_cond_wait(&p->cond, &p->lock);
		} else {
			struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
					      .tv_nsec = (long)(deadline % 1000000000u)};
			pthread_cond_timedwait(&p->cond, &p->lock, &ts);
		}
		atomic_store_explicit(&p->waiters,
				      atomic_load_explicit(&p->waiters, memory_order_relaxed) - 1,
				      memory_order_relaxed);
		if (p->nfree == 0 && deadline != UINT64_MAX && mbp__now_ns() >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
	}
	if (rc == 0)
		note_high_water(p);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static void poison_check(const struct mbp__buf *b)
{
#ifdef MBP_DEBUG
	const unsigned char *d = b->mb.data;
	size_t n = b->mb.capacity < 64 ? b->mb.capacity : 64;
	for (size_t i = 0; i < n; i++)
		if (d[i] != POISON_BYTE || d[b->mb.capacity - 1 - i] != POISON_BYTE) {
			fprintf(stderr, "mbp_pool_get: buffer %p was written after its release\n",
				b->mb.data);
			abort();
		}
#else
	(void)b;
#endif
}

int mbp_pool_get(mbp_pool *p, mbp_pool_cache *c, mbp_mb **mbp, int64_t timeout_ns)
{
	if (MBP_UNLIKELY(!p || !mbp || (c && c->pool != p)))
		return -EINVAL;
	struct mbp__buf *b;
	if (c && c->count) {
		b = c->stack[--c->count];
		atomic_store_explicit(&c->held, c->count, memory_order_relaxed);
		mbp__counter_add(&c->hits, 1);
	} else {
		int rc = depot_get(p, c, &b, timeout_ns);
		if (rc)
			return rc;
	}
	MBP_VERIFY(b->magic == BUF_MAGIC && b->state != BUF_OUT);
	if (b->state == BUF_FREE)
		poison_check(b);
	b->state = BUF_OUT;
	mbp_mb *mb = &b->mb;
	mb->rows = 0;
	mb->row_bytes = 0;
	mb->status = 0;
	mb->stage = UINT32_MAX;
	mb->seq = 0;
	mb->job = NULL;
	mb->user = NULL;
	mb->carry = NULL;
	if (c) {
		mbp__counter_add(&c->gets, 1);
	} else {
		/* several threads may go to the depot directly: a read-modify-write, not a single-writer add */
		atomic_fetch_add_explicit(&p->direct_gets, 1, memory_order_relaxed);
	}
	*mbp = mb;
	return 0;
}

static struct mbp__buf *checked_buf(mbp_pool *p, mbp_mb *mb)
{
	struct mbp__buf *b = mbp__container_of(mb, struct mbp__buf, mb);
	uintptr_t lo = (uintptr_t)p->hdrs, hi = (uintptr_t)(p->hdrs + p->max_buffers);
	if ((uintptr_t)b < lo || (uintptr_t)b >= hi || ((uintptr_t)b - lo) % sizeof(*b) != 0 ||
	    b->magic != BUF_MAGIC) {
		fprintf(stderr, "mbp_pool_put: %p is not a buffer of pool %p\n", (void *)mb, (void *)p);
		abort();
	}
	if (b->state != BUF_OUT) {
		fprintf(stderr, "mbp_pool_put: double release of buffer %p (pool %p)\n", (void *)mb,
			(void *)p);
		abort();
	}
	return b;
}

void mbp_pool_put(mbp_pool *p, mbp_pool_cache *c, mbp_mb *mb)
{
	struct mbp__buf *b = checked_buf(p, mb);
	MBP_VERIFY(!c || c->pool == p);
	b->state = BUF_FREE;
#ifdef MBP_DEBUG
	memset(b->mb.data, POISON_BYTE, b->mb.capacity);
#endif
	/* relaxed: a hint; a waiter that registers just after this load is served by a later release
	 * or by an owner's flush before it goes idle */
	bool waiters = atomic_load_explicit(&p->waiters, memory_order_relaxed) != 0;
	if (c && MBP_LIKELY(!waiters)) {
		if (c->count == c->cap) {
			pthread_mutex_lock(&p->lock);
			cache_to_depot(p, c, c->cap - c->cap / 2);
			pthread_mutex_unlock(&p->lock);
		}
		c->stack[c->count++] = b;
		atomic_store_explicit(&c->held, c->count, memory_order_relaxed);
		mbp__counter_add(&c->puts, 1);
		return;
	}
	pthread_mutex_lock(&p->lock);
	p->free[p->nfree++] = b;
	if (c) {
		cache_to_depot(p, c, c->count); /* a getter is waiting: give it everything */
		mbp__counter_add(&c->puts, 1);
	} else {
		atomic_fetch_add_explicit(&p->direct_puts, 1, memory_order_relaxed);
	}
	if (atomic_load_explicit(&p->waiters, memory_order_relaxed))
		pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/*
 * bench_pool: what the buffer pool costs and what its LIFO recycling buys, against allocators, in one run.
 *
 * Part 1, get+put: one thread takes a buffer, writes one byte of it and gives it back, over and over, for
 * 4 KiB, 64 KiB and 1 MiB buffers:
 *   pool     mbp_pool_get/put through a per-thread cache (the engine's hot path)
 *   pool0    mbp_pool_get/put without cache (the depot's mutex on every call)
 *   jem      jemalloc mallocx/dallocx, default flags (thread cache on; jemalloc 5.3 caches sizes up to
 *            opt.tcache_max, printed, so 64 KiB and 1 MiB go to the arena anyway)
 *   jemnt    jemalloc mallocx/dallocx with MALLOCX_TCACHE_NONE
 *   glibc    glibc's allocator through __libc_malloc/__libc_free (linking jemalloc replaces malloc; the
 *            program prints which library each symbol resolves to)
 * Methods alternate within each round (A B C D E, A B C D E, ...); the table shows medians of the rounds.
 *
 * Part 2, two-stage hand-off: stage 1 (pinned to the first allowed CPU) takes a buffer and writes all of
 * it; an SPSC ring of RING_CAP pointers carries it to stage 2 (the second allowed CPU), which reads all of it
 * (sums its bytes, checked against what stage 1 wrote) and releases it. Three recycling policies over
 * HANDOFF_BUFS buffers:
 *   lifo     the pool, each stage with its own cache of 8 (the default; most recently released first)
 *   lifo2    the same with caches of 2: a shorter reuse distance for a stage that only gets and one
 *            that only releases, for one lock round trip per item and side
 *   fifo     a FIFO ring of free buffers from stage 2 back to stage 1 (least recently released first)
 *   malloc   malloc per item in stage 1, free in stage 2 (the process's malloc: jemalloc when linked)
 * so the cache effect of recycling order is measured, not claimed. Policies alternate per round.
 *
 * Output: a table, then one line `bench_pool: key=value ...` with fixed keys. Exit status 1 when an
 * invariant breaks (a payload that does not add up, pool conservation, an allocation failure).
 */
#include "config.h"

#include <dlfcn.h> /* dladdr: config.h defines _GNU_SOURCE */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef MBP_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include <mbpipe.h>

#include "bench_util.h"

/* glibc's own allocator, reachable under these names whichever malloc the program is linked with. */
extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);

#define ROUNDS	     7
#define ROUND_NS     (30 * 1000000ull) /* part 1: each method runs at least this long per round */
#define HANDOFF_BUFS 64u
#define RING_CAP     4u /* part 2: a short ring, as between pipeline stages */

static int failures;

#define CHECK(expr)                                                                                          \
	do {                                                                                                 \
		if (!(expr)) {                                                                               \
			fprintf(stderr, "bench_pool: invariant broken: %s (line %d)\n", #expr, __LINE__);    \
			failures++;                                                                          \
		}                                                                                            \
	} while (0)

/* ---- CPUs ---- */

static int cpus[CPU_SETSIZE], ncpus;

static void cpus_init(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) != 0) {
		perror("sched_getaffinity");
		exit(1);
	}
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set))
			cpus[ncpus++] = i;
}

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	if (rc != 0) {
		fprintf(stderr, "bench_pool: pinning to CPU %d failed: %s\n", cpu, strerror(rc));
		exit(1);
	}
}

static const char *lib_of(void *fn)
{
	Dl_info info;
	if (!dladdr(fn, &info) || !info.dli_fname)
		return "?";
	const char *slash = strrchr(info.dli_fname, '/');
	return slash ? slash + 1 : info.dli_fname;
}

/* ---- Part 1: get+put ---- */

enum { M_POOL, M_POOL0, M_JEM, M_JEMNT, M_GLIBC, M_COUNT };
static const char *const method_name[M_COUNT] = {"pool", "pool0", "jem", "jemnt", "glibc"};

struct gp_ctx {
	size_t size;
	mbp_pool *pool;
	mbp_pool_cache *cache;
};

/* n get+put pairs; returns elapsed ns. Each pair writes one byte so no variant can skip the memory. */
static uint64_t gp_run(struct gp_ctx *x, int method, unsigned long n)
{
	uint64_t t0 = mbt_now_ns();
	for (unsigned long i = 0; i < n; i++) {
		void *p = NULL;
		mbp_mb *mb = NULL;
		switch (method) {
		case M_POOL:
		case M_POOL0: {
			mbp_pool_cache *c = method == M_POOL ? x->cache : NULL;
			if (mbp_pool_get(x->pool, c, &mb, 0) != 0) {
				CHECK(!"pool get");
				return 1;
			}
			*(volatile char *)mb->data = (char)i;
			mbp_pool_put(x->pool, c, mb);
			continue;
		}
#ifdef MBP_HAVE_JEMALLOC
		case M_JEM:
			p = mallocx(x->size, MALLOCX_ALIGN(64));
			break;
		case M_JEMNT:
			p = mallocx(x->size, MALLOCX_ALIGN(64) | MALLOCX_TCACHE_NONE);
			break;
#endif
		case M_GLIBC:
			p = __libc_malloc(x->size);
			break;
		}
		if (!p) {
			CHECK(!"allocation");
			return 1;
		}
		*(volatile char *)p = (char)i;
		switch (method) {
#ifdef MBP_HAVE_JEMALLOC
		case M_JEM:
			dallocx(p, MALLOCX_ALIGN(64));
			break;
		case M_JEMNT:
			dallocx(p, MALLOCX_ALIGN(64) | MALLOCX_TCACHE_NONE);
			break;
#endif
		case M_GLIBC:
			__libc_free(p);
			break;
		}
	}
	return mbt_now_ns() - t0;
}

/* ns per pair for one method: run batches until ROUND_NS has passed. */
static double gp_measure(struct gp_ctx *x, int method)
{
	unsigned long n = 0;
	uint64_t ns = 0;
	unsigned long batch = 256;
	while (ns < ROUND_NS) {
		ns += gp_run(x, method, batch);
		n += batch;
		if (batch < (1ul << 16))
			batch *= 2;
	}
	return (double)ns / (double)n;
}

static bool method_available(int m)
{
#ifndef MBP_HAVE_JEMALLOC
	if (m == M_JEM || m == M_JEMNT)
		return false;
#endif
	(void)m;
	return true;
}

static void part1(const size_t *sizes, int nsizes, double res[][M_COUNT])
{
	pin(cpus[0]);
	for (int s = 0; s < nsizes; s++) {
		struct gp_ctx x = {.size = sizes[s]};
		mbp_pool_opts o;
		mbp_pool_opts_init(&o);
		o.buf_bytes = sizes[s];
		o.max_buffers = 16;
		o.max_bytes = (size_t)64 << 20;
		CHECK(mbp_pool_new(&x.pool, &o) == 0);
		CHECK(mbp_pool_cache_new(x.pool, &x.cache) == 0);
		if (failures)
			return;
		double r[M_COUNT][ROUNDS];
		for (int m = 0; m < M_COUNT; m++) /* warm-up: first touches, arena growth, glibc thresholds */
			if (method_available(m))
				gp_run(&x, m, 1000);
		for (int round = 0; round < ROUNDS; round++)
			for (int m = 0; m < M_COUNT; m++)
				r[m][round] = method_available(m) ? gp_measure(&x, m) : 0;
		for (int m = 0; m < M_COUNT; m++)
			res[s][m] = bench_median(r[m], ROUNDS);
		mbp_pool_cache_destroy(x.cache);
		mbp_pool_stats st;
		mbp_pool_stats_get(x.pool, &st);
		CHECK(st.gets == st.puts && st.in_use == 0);
		CHECK(mbp_pool_destroy(x.pool) == 0);
	}
}

/* ---- Part 2: two-stage hand-off ---- */

enum { P_LIFO, P_LIFO2, P_FIFO, P_MALLOC, P_COUNT };
static const char *const policy_name[P_COUNT] = {"lifo", "lifo2", "fifo", "malloc"};
#define IS_POOL(policy) ((policy) == P_LIFO || (policy) == P_LIFO2)

/* SPSC ring of pointers; spin, then yield (the machine is shared: never spin alone). */
struct spsc {
	_Alignas(64) _Atomic uint64_t head; /* consumer's */
	_Alignas(64) _Atomic uint64_t tail; /* producer's */
	_Alignas(64) void *slot[HANDOFF_BUFS];
	uint64_t cap;
};

static void spsc_push(struct spsc *q, void *p)
{
	uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed); /* only the producer writes tail */
	/* acquire: pairs with the consumer's release of head (it has read the slot we reuse) */
	for (unsigned spins = 0; t - atomic_load_explicit(&q->head, memory_order_acquire) == q->cap; spins++)
		if (spins > 64)
			sched_yield();
	q->slot[t % q->cap] = p;
	/* release: pairs with the consumer's acquire of tail; publishes the slot and the payload */
	atomic_store_explicit(&q->tail, t + 1, memory_order_release);
}

static void *spsc_pop(struct spsc *q)
{
	uint64_t h = atomic_load_explicit(&q->head, memory_order_relaxed); /* only the consumer writes head */
	/* acquire: pairs with the producer's release of tail */
	for (unsigned spins = 0; h == atomic_load_explicit(&q->tail, memory_order_acquire); spins++)
		if (spins > 64)
			sched_yield();
	void *p = q->slot[h % q->cap];
	/* release: pairs with the producer's acquire of head */
	atomic_store_explicit(&q->head, h + 1, memory_order_release);
	return p;
}

/* What one round of a policy measured: medians over its items, and the wall time per item. */
enum { T_GET, T_WRITE, T_READ, T_PUT, T_COUNT };
static const char *const phase_name[T_COUNT] = {"get", "write", "read", "put"};
struct ho_result {
	double phase[T_COUNT]; /* median ns per item of each phase */
	double wall;	       /* ns per item, start to end, both stages */
};

struct handoff {
	int policy;
	size_t size;
	unsigned long items;
	mbp_pool *pool;
	struct spsc fwd;  /* stage 1 -> stage 2: full buffers */
	struct spsc back; /* fifo: stage 2 -> stage 1: free buffers */
	pthread_barrier_t start;
	uint32_t *t[T_COUNT]; /* per item: ns of each phase (stage 1: get, write; stage 2: read, put) */
	uint64_t bad;	      /* stage 2: payloads whose sum was wrong */
};

static void *stage2_main(void *arg)
{
	struct handoff *h = arg;
	pin(cpus[ncpus > 1 ? 1 : 0]);
	mbp_pool_cache *c = NULL;
	if (IS_POOL(h->policy) && mbp_pool_cache_new(h->pool, &c) != 0)
		abort();
	pthread_barrier_wait(&h->start);
	for (unsigned long i = 0; i < h->items; i++) {
		void *p = spsc_pop(&h->fwd);
		const void *data = IS_POOL(h->policy) ? ((mbp_mb *)p)->data : p;
		uint64_t t0 = mbt_now_ns();
		if (bench_byte_sum(data, h->size) != (uint64_t)(i & 0xff) * h->size)
			h->bad++;
		uint64_t t1 = mbt_now_ns();
		if (IS_POOL(h->policy))
			mbp_pool_put(h->pool, c, p);
		else if (h->policy == P_FIFO)
			spsc_push(&h->back, p);
		else
			free(p);
		h->t[T_READ][i] = (uint32_t)(t1 - t0);
		h->t[T_PUT][i] = (uint32_t)(mbt_now_ns() - t1);
	}
	mbp_pool_cache_destroy(c);
	return NULL;
}

static double median_u32(uint32_t *v, unsigned long n)
{
	double *d = malloc(n * sizeof(*d));
	if (!d)
		abort();
	for (unsigned long i = 0; i < n; i++)
		d[i] = v[i];
	double m = bench_median(d, (int)n);
	free(d);
	return m;
}

/* One round of a policy. The wall time per item is what the two stages achieve together (preemption on
 * a shared machine lands there); the per-phase medians are what each step costs when it runs. */
static struct ho_result handoff_round(int policy, size_t size, unsigned long items)
{
	static struct handoff h;
	memset(&h, 0, sizeof(h));
	h.policy = policy;
	h.size = size;
	h.items = items;
	h.fwd.cap = RING_CAP;
	h.back.cap = HANDOFF_BUFS;
	for (int k = 0; k < T_COUNT; k++) {
		h.t[k] = calloc(items, sizeof(uint32_t));
		CHECK(h.t[k] != NULL);
	}
	void *fifo_mem[HANDOFF_BUFS];
	mbp_pool_cache *c = NULL;
	if (IS_POOL(policy)) {
		mbp_pool_opts o;
		mbp_pool_opts_init(&o);
		o.buf_bytes = size;
		o.cache_size = policy == P_LIFO2 ? 2 : 8;
		o.max_buffers = HANDOFF_BUFS;
		o.max_bytes = (size_t)1 << 30;
		CHECK(mbp_pool_new(&h.pool, &o) == 0);
		CHECK(mbp_pool_cache_new(h.pool, &c) == 0);
		/* allocate all of them first, as the FIFO policy does */
		mbp_mb *all[HANDOFF_BUFS];
		for (unsigned i = 0; i < HANDOFF_BUFS; i++)
			CHECK(mbp_pool_get(h.pool, NULL, &all[i], 0) == 0);
		for (unsigned i = 0; i < HANDOFF_BUFS; i++)
			mbp_pool_put(h.pool, NULL, all[i]);
	} else if (policy == P_FIFO) {
		for (unsigned i = 0; i < HANDOFF_BUFS; i++) {
			fifo_mem[i] = aligned_alloc(64, (size + 63) & ~(size_t)63);
			CHECK(fifo_mem[i] != NULL);
			memset(fifo_mem[i], 0, size);
			spsc_push(&h.back, fifo_mem[i]);
		}
	}
	if (failures)
		exit(1);
	pthread_barrier_init(&h.start, NULL, 2);
	pthread_t t;
	if (pthread_create(&t, NULL, stage2_main, &h) != 0)
		abort();
	pthread_barrier_wait(&h.start);
	uint64_t start = mbt_now_ns();
	for (unsigned long i = 0; i < items; i++) {
		void *p;
		void *data;
		uint64_t t0 = mbt_now_ns();
		if (IS_POOL(policy)) {
			mbp_mb *mb;
			CHECK(mbp_pool_get(h.pool, c, &mb, -1) == 0);
			p = mb;
			data = mb->data;
		} else if (policy == P_FIFO) {
			p = data = spsc_pop(&h.back);
		} else {
			p = data = malloc(size);
			CHECK(p != NULL);
		}
		uint64_t t1 = mbt_now_ns();
		memset(data, (int)(i & 0xff), size);
		h.t[T_GET][i] = (uint32_t)(t1 - t0);
		h.t[T_WRITE][i] = (uint32_t)(mbt_now_ns() - t1);
		spsc_push(&h.fwd, p);
	}
	pthread_join(t, NULL);
	struct ho_result r = {.wall = (double)(mbt_now_ns() - start) / (double)items};
	pthread_barrier_destroy(&h.start);
	CHECK(h.bad == 0);
	for (int k = 0; k < T_COUNT; k++) {
		r.phase[k] = median_u32(h.t[k], items);
		free(h.t[k]);
	}
	if (IS_POOL(policy)) {
		mbp_pool_cache_destroy(c);
		mbp_pool_stats st;
		mbp_pool_stats_get(h.pool, &st);
		CHECK(st.gets == st.puts && st.in_use == 0);
		CHECK(st.allocated == HANDOFF_BUFS);
		CHECK(mbp_pool_destroy(h.pool) == 0);
	} else if (policy == P_FIFO) {
		for (unsigned i = 0; i < HANDOFF_BUFS; i++)
			free(fifo_mem[i]);
	}
	return r;
}

static void part2(const size_t *sizes, int nsizes, struct ho_result res[][P_COUNT])
{
	pin(cpus[0]);
	for (int s = 0; s < nsizes; s++) {
		/* 128 MiB written and read per round: at least 32 passes over the 64 buffers */
		unsigned long items = (unsigned long)((128ull << 20) / sizes[s]);
		double r[P_COUNT][T_COUNT + 1][ROUNDS];
		for (int p = 0; p < P_COUNT; p++)
			handoff_round(p, sizes[s], items / 8); /* warm-up */
		for (int round = 0; round < ROUNDS; round++)
			for (int p = 0; p < P_COUNT; p++) {
				struct ho_result one = handoff_round(p, sizes[s], items);
				for (int k = 0; k < T_COUNT; k++)
					r[p][k][round] = one.phase[k];
				r[p][T_COUNT][round] = one.wall;
			}
		for (int p = 0; p < P_COUNT; p++) {
			for (int k = 0; k < T_COUNT; k++)
				res[s][p].phase[k] = bench_median(r[p][k], ROUNDS);
			res[s][p].wall = bench_median(r[p][T_COUNT], ROUNDS);
		}
	}
}

int main(void)
{
	cpus_init();
	static const size_t gp_sizes[] = {4096, 64 << 10, 1 << 20};
	static const char *const gp_keys[] = {"4k", "64k", "1m"};
	static const size_t ho_sizes[] = {16 << 10, 64 << 10, 256 << 10};
	static const char *const ho_keys[] = {"16k", "64k", "256k"};
	enum { NGP = 3, NHO = 3 };

	size_t tcache_max = 0;
#ifdef MBP_HAVE_JEMALLOC
	size_t sz = sizeof(tcache_max);
	mallctl("opt.tcache_max", &tcache_max, &sz, NULL, 0);
#endif
	printf("bench_pool: %d allowed CPUs (", ncpus);
	for (int i = 0; i < ncpus; i++)
		printf("%s%d", i ? "," : "", cpus[i]);
	printf("), %ld online; %d rounds, medians\n", sysconf(_SC_NPROCESSORS_ONLN), ROUNDS);
	printf("symbols: malloc -> %s, mallocx -> %s, __libc_malloc -> %s; jemalloc opt.tcache_max %zu\n",
	       lib_of((void *)malloc),
#ifdef MBP_HAVE_JEMALLOC
	       lib_of((void *)mallocx),
#else
	       "(not linked)",
#endif
	       lib_of((void *)__libc_malloc), tcache_max);

	double gp[NGP][M_COUNT];
	part1(gp_sizes, NGP, gp);
	if (failures)
		return 1;
	printf("\nget+put, ns per pair (one thread, pinned to CPU %d; one byte written per pair)\n", cpus[0]);
	printf("%-6s", "size");
	for (int m = 0; m < M_COUNT; m++)
		printf(" %9s", method_name[m]);
	printf(" %12s %12s\n", "jem/pool", "jemnt/pool");
	for (int s = 0; s < NGP; s++) {
		printf("%-6s", gp_keys[s]);
		for (int m = 0; m < M_COUNT; m++)
			printf(" %9.1f", gp[s][m]);
		printf(" %12.1f %12.1f\n", gp[s][M_JEM] / gp[s][M_POOL], gp[s][M_JEMNT] / gp[s][M_POOL]);
	}

	struct ho_result ho[NHO][P_COUNT];
	part2(ho_sizes, NHO, ho);
	if (failures)
		return 1;
	printf("\nhand-off (stage 1 on CPU %d: get, write all; stage 2 on CPU %d: read all, put; ring %u, "
	       "%u buffers)\nns per item: phases are medians over items, wall is the pair's throughput\n",
	       cpus[0], cpus[ncpus > 1 ? 1 : 0], RING_CAP, HANDOFF_BUFS);
	printf("%-6s %-7s %8s %8s %8s %8s %9s %9s %10s\n", "size", "policy", "get", "write", "read", "put",
	       "wr+rd", "vs lifo", "wall");
	for (int s = 0; s < NHO; s++)
		for (int p = 0; p < P_COUNT; p++) {
			const struct ho_result *x = &ho[s][p];
			double mem = x->phase[T_WRITE] + x->phase[T_READ];
			double lifo = ho[s][P_LIFO].phase[T_WRITE] + ho[s][P_LIFO].phase[T_READ];
			printf("%-6s %-7s %8.0f %8.0f %8.0f %8.0f %9.0f %9.2f %10.0f\n", ho_keys[s],
			       policy_name[p], x->phase[T_GET], x->phase[T_WRITE], x->phase[T_READ],
			       x->phase[T_PUT], mem, mem / lifo, x->wall);
		}

	bool target = gp[1][M_JEM] >= 5 * gp[1][M_POOL] && gp[2][M_JEM] >= 5 * gp[2][M_POOL];
	printf("\nbench_pool: cpus=%d", ncpus);
	for (int s = 0; s < NGP; s++)
		for (int m = 0; m < M_COUNT; m++)
			printf(" %s_%s_ns=%.1f", method_name[m], gp_keys[s], gp[s][m]);
	for (int s = 0; s < NHO; s++)
		for (int p = 0; p < P_COUNT; p++) {
			for (int k = 0; k < T_COUNT; k++)
				printf(" %s_%s_%s_ns=%.0f", policy_name[p], ho_keys[s], phase_name[k],
				       ho[s][p].phase[k]);
			printf(" %s_%s_wall_ns=%.0f", policy_name[p], ho_keys[s], ho[s][p].wall);
		}
	printf(" target_5x_jem_64k_1m=%s\n", target ? "met" : "missed");
	return failures ? 1 : 0;
}

/*
 * bench_ring: mbpipe's SPSC ring against a plain C11 ring, ck_ring, boost::lockfree::spsc_queue and
 * moodycamel's queues.
 *
 * Measures, in one run, alternating the implementations and repeating (medians of the rounds):
 *   1. items/s between two pinned threads, one item per call and, where the queue allows, bursts of 32:
 *      over the whole run, and "steady", the run's median chunk of 8192 items (bench_ring.h), which
 *      leaves out the time the scheduler kept a spinning side off its CPU on a shared machine;
 *      mbpipe twice: its non-blocking calls spun on by the caller like the peers, and its blocking forms
 *      (push/pop, then the ring's wait_push / wait_pop), which carry the parking handshake;
 *   2. the round trip of one item bouncing between two rings (ping-pong), in ns;
 *   3. the CPU time a consumer parked in wait_pop on an empty ring uses over one second;
 *   4. "solo": ns per push + pop on one thread (no line moving between cores; best round), and the steady
 *      rate's fraction of 2 / solo, what two cores would reach doing their halves at that speed.
 * Prints a table, the ratios of mbpipe to the best peer and one summary line:
 *   bench_ring: mbpipe_mops=... best_peer=... ratio=... mbpipe_steady=... steady_ratio=... rtt_ns=...
 *   idle_cpu_pct=... cores=N ...
 * Exits non-zero if any item is lost or out of order (every item is a stamped pointer, checked).
 *
 * Usage: bench_ring [-n items] [-r rounds] [-l round_trips] [-c capacity] [-s row,row,...]
 * -s runs only the named rows (for investigation; the ratios then need their peers among them).
 * The C++ peers live in bench_ring_peers.cc (ring.h's C11 atomics are not C++); both files are compiled
 * with -O2 (see perf/ring.mk).
 */
#include "config.h"

#include <ck_ring.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_ring.h"
#include "bench_util.h"
#include "ring.h"

/* ----------------------------------------------------------------------------------------------------- */
/* mbpipe                                                                                                */
/* ----------------------------------------------------------------------------------------------------- */

static void *mbp_create(unsigned capacity)
{
	struct mbp__ring *r = NULL;
	int rc = mbp__ring_new(&r, capacity, NULL, 0);
	if (rc) {
		fprintf(stderr, "bench_ring: mbp__ring_new(%u): %s\n", capacity, strerror(-rc));
		exit(2);
	}
	return r;
}

static void mbp_destroy(void *q)
{
	mbp__ring_destroy(q);
}

static unsigned mbp_push(void *q, void *const *items, unsigned n)
{
	return mbp__ring_push_burst_sp(q, items, n);
}

static unsigned mbp_pop(void *q, void **items, unsigned n)
{
	return mbp__ring_pop_burst_sc(q, items, n);
}

/* Blocking, as the pipeline's workers block: the non-blocking form, then the ring's one wait
 * (mbp__ring_wait_push/_pop: spin-yield-park) until it can proceed; 0 moved: closed. A burst is pushed one
 * item at a time, as a worker pushes. */
static unsigned mbpw_push(void *q, void *const *items, unsigned n)
{
	for (unsigned k = 0; k < n; k++)
		while (!mbp__ring_push_sp(q, items[k]))
			if (mbp__ring_wait_push(q, NULL, NULL, UINT64_MAX) != 0)
				return k;
	return n;
}

static unsigned mbpw_pop(void *q, void **items, unsigned n)
{
	for (;;) {
		unsigned k = mbp__ring_pop_burst_sc(q, items, n);
		if (k || mbp__ring_wait_pop(q, NULL, NULL, UINT64_MAX) != 0)
			return k;
	}
}

BENCH_LOOPS(mbp1, 1, mbp_push, mbp_pop)
BENCH_LOOPS(mbp32, 32, mbp_push, mbp_pop)
BENCH_LOOPS(mbpw1, 1, mbpw_push, mbpw_pop)
BENCH_LOOPS(mbpw32, 32, mbpw_push, mbpw_pop)

static const struct bench_impl bench_mbp = {"mbpipe",
					    "mbpipe push_sp/pop_sc (non-blocking, caller spins)",
					    1,
					    false,
					    mbp_create,
					    mbp_destroy,
					    mbp1_produce,
					    mbp1_consume,
					    mbp1_lead,
					    mbp1_echo};
static const struct bench_impl bench_mbp_b32 = {"mbpipe-b32",
						"mbpipe push_burst_sp/pop_burst_sc of 32",
						32,
						false,
						mbp_create,
						mbp_destroy,
						mbp32_produce,
						mbp32_consume,
						NULL,
						NULL};
static const struct bench_impl bench_mbp_wait = {
    "mbpipe-wait",
    "mbpipe push_sp/pop_sc + wait_push/wait_pop (blocking, spin-yield-park)",
    1,
    true,
    mbp_create,
    mbp_destroy,
    mbpw1_produce,
    mbpw1_consume,
    mbpw1_lead,
    mbpw1_echo};
static const struct bench_impl bench_mbp_wait_b32 = {"mbpipe-wait-b32",
						     "mbpipe bursts of 32 + wait_push/wait_pop",
						     32,
						     true,
						     mbp_create,
						     mbp_destroy,
						     mbpw32_produce,
						     mbpw32_consume,
						     NULL,
						     NULL};

/* ----------------------------------------------------------------------------------------------------- */
/* ck_ring                                                                                               */
/* ----------------------------------------------------------------------------------------------------- */

struct ck_q {
	struct ck_ring ring;
	struct ck_ring_buffer *buf;
};

static void *ck_create(unsigned capacity)
{
	struct ck_q *q = aligned_alloc(64, sizeof(*q));
	if (q)
		q->buf = aligned_alloc(64, capacity * sizeof(*q->buf));
	if (!q || !q->buf) {
		fprintf(stderr, "bench_ring: out of memory\n");
		exit(2);
	}
	ck_ring_init(&q->ring, capacity); /* holds capacity - 1 items */
	return q;
}

static void ck_destroy(void *q)
{
	free(((struct ck_q *)q)->buf);
	free(q);
}

/* ck_ring has no SPSC burst call: a burst is a loop of single calls, as a ck user would write it. */
static unsigned ck_push(void *q, void *const *items, unsigned n)
{
	struct ck_q *c = q;
	for (unsigned k = 0; k < n; k++)
		if (!ck_ring_enqueue_spsc(&c->ring, c->buf, items[k]))
			return k;
	return n;
}

static unsigned ck_pop(void *q, void **items, unsigned n)
{
	struct ck_q *c = q;
	for (unsigned k = 0; k < n; k++)
		if (!ck_ring_dequeue_spsc(&c->ring, c->buf, &items[k]))
			return k;
	return n;
}

BENCH_LOOPS(ck1, 1, ck_push, ck_pop)
BENCH_LOOPS(ck32, 32, ck_push, ck_pop)

static const struct bench_impl bench_ck = {"ck",	"ck_ring_enqueue_spsc/dequeue_spsc",
					   1,		false,
					   ck_create,	ck_destroy,
					   ck1_produce, ck1_consume,
					   ck1_lead,	ck1_echo};
static const struct bench_impl bench_ck_x32 = {
    "ck-x32",	  "ck_ring, 32 single calls per burst (no SPSC burst API)",
    32,		  false,
    ck_create,	  ck_destroy,
    ck32_produce, ck32_consume,
    NULL,	  NULL};

/* ----------------------------------------------------------------------------------------------------- */
/* A plain C11 ring                                                                                      */
/* ----------------------------------------------------------------------------------------------------- */

/*
 * What a user would write instead: the textbook SPSC ring in C11 (Lamport's ring with each side caching the
 * other's index, as in Rigtorp's SPSCQueue or DPDK's SP/SC mode). Power-of-two capacity, free-running
 * indices, head and tail on their own cache lines with the side's copy of the other's index and of the
 * read-only fields beside it, acquire/release, nothing else: no close, no parking.
 */
struct c11_ring {
	_Alignas(64) _Atomic uint32_t head; /* producer line */
	uint32_t tail_cache, pmask;
	void **pslots;
	_Alignas(64) _Atomic uint32_t tail; /* consumer line */
	uint32_t head_cache, cmask;
	void **cslots; /* the struct's size rounds up to 128: nothing else shares the consumer line */
};

static void *c11_create(unsigned capacity)
{
	struct c11_ring *q = aligned_alloc(64, sizeof(*q));
	void **slots = aligned_alloc(64, capacity * sizeof(void *));
	if (!q || !slots) {
		fprintf(stderr, "bench_ring: out of memory\n");
		exit(2);
	}
	*q =
	    (struct c11_ring){.pmask = capacity - 1, .pslots = slots, .cmask = capacity - 1, .cslots = slots};
	return q;
}

static void c11_destroy(void *q)
{
	free(((struct c11_ring *)q)->pslots);
	free(q);
}

static inline unsigned c11_push(void *q, void *const *items, unsigned n)
{
	(void)n; /* one item per call */
	struct c11_ring *c = q;
	uint32_t h = atomic_load_explicit(&c->head, memory_order_relaxed);
	if (h - c->tail_cache > c->pmask) { /* full by the cached tail: look at the real one */
		/* acquire; partner: pop's release store of tail */
		c->tail_cache = atomic_load_explicit(&c->tail, memory_order_acquire);
		if (h - c->tail_cache > c->pmask)
			return 0;
	}
	c->pslots[h & c->pmask] = items[0];
	atomic_store_explicit(&c->head, h + 1, memory_order_release); /* publishes the slot */
	return 1;
}

static inline unsigned c11_pop(void *q, void **items, unsigned n)
{
	(void)n;
	struct c11_ring *c = q;
	uint32_t t = atomic_load_explicit(&c->tail, memory_order_relaxed);
	if (t == c->head_cache) { /* empty by the cached head: look at the real one */
		/* acquire; partner: push's release store of head */
		c->head_cache = atomic_load_explicit(&c->head, memory_order_acquire);
		if (t == c->head_cache)
			return 0;
	}
	items[0] = c->cslots[t & c->cmask];
	/* release: the producer's licence to overwrite the slot */
	atomic_store_explicit(&c->tail, t + 1, memory_order_release);
	return 1;
}

BENCH_LOOPS(c11, 1, c11_push, c11_pop)

static const struct bench_impl bench_c11 = {"c11",	 "plain C11 ring (cached indices, acquire/release)",
					    1,		 false,
					    c11_create,	 c11_destroy,
					    c11_produce, c11_consume,
					    c11_lead,	 c11_echo};

/* ----------------------------------------------------------------------------------------------------- */
/* Harness                                                                                               */
/* ----------------------------------------------------------------------------------------------------- */

/* The rows, in the order of the table; peer groups for the ratios are below. */
static const struct bench_impl *const rows[] = {
    &bench_mbp,	   &bench_c11,	     &bench_ck,	      &bench_boost,	   &bench_rwq,	     &bench_mbp_b32,
    &bench_ck_x32, &bench_boost_b32, &bench_mbp_wait, &bench_mbp_wait_b32, &bench_rwcb_wait,
};
enum { NROWS = sizeof(rows) / sizeof(rows[0]), MAX_ROUNDS = 64 };

static int cpus[CPU_SETSIZE], ncpus;
static bool skip[NROWS]; /* rows left out by -s */

/* Is `name` one of the comma-separated names in `list`? */
static bool listed(const char *list, const char *name)
{
	size_t len = strlen(name);
	for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, name, len) == 0 && (p[len] == ',' || p[len] == '\0'))
			return true;
	return false;
}
static uint64_t failures; /* lost, duplicated or out-of-order items, pinning errors */

static void pin(int k)
{
	if (ncpus < 2)
		return;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpus[k % ncpus], &set);
	int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	if (rc) {
		fprintf(stderr, "bench_ring: pinning to cpu %d: %s\n", cpus[k % ncpus], strerror(rc));
		exit(2);
	}
}

enum role { PRODUCE, CONSUME, LEAD, ECHO };

struct side {
	const struct bench_impl *im;
	enum role role;
	void *a, *b;
	uint64_t n;
	int cpu;
	pthread_barrier_t *go;
	uint64_t t0, t1, bad;
};

static void *side_main(void *arg)
{
	struct side *s = arg;
	pin(s->cpu);
	pthread_barrier_wait(s->go);
	s->t0 = mbp__now_ns();
	switch (s->role) {
	case PRODUCE:
		s->im->produce(s->a, s->n);
		break;
	case CONSUME:
		s->bad = s->im->consume(s->a, s->n);
		break;
	case LEAD:
		s->bad = s->im->lead(s->a, s->b, s->n);
		break;
	case ECHO:
		s->im->echo(s->a, s->b, s->n);
		break;
	}
	s->t1 = mbp__now_ns();
	return NULL;
}

/* Run two sides on two threads started on one barrier; returns the elapsed ns of the pair. */
static uint64_t run_pair(struct side *a, struct side *b)
{
	pthread_barrier_t go;
	pthread_barrier_init(&go, NULL, 2);
	a->go = b->go = &go;
	pthread_t ta, tb;
	if (pthread_create(&ta, NULL, side_main, a) || pthread_create(&tb, NULL, side_main, b)) {
		fprintf(stderr, "bench_ring: pthread_create failed\n");
		exit(2);
	}
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	pthread_barrier_destroy(&go);
	uint64_t t0 = a->t0 < b->t0 ? a->t0 : b->t0;
	uint64_t t1 = a->t1 > b->t1 ? a->t1 : b->t1;
	return t1 - t0;
}

double bench_chunks[BENCH_MAX_CHUNKS];
unsigned bench_nchunks;

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Millions of items per second from producer to consumer over the whole run; *steady: the median of the
 * run's chunks of BENCH_CHUNK items (bench_ring.h), the run's rate while both threads held their CPUs
 * (the whole run when it is shorter than two chunks). */
static double throughput(const struct bench_impl *im, unsigned capacity, uint64_t n, double *steady)
{
	bench_nchunks = 0;
	void *q = im->create(capacity);
	struct side p = {.im = im, .role = PRODUCE, .a = q, .n = n, .cpu = 0};
	struct side c = {.im = im, .role = CONSUME, .a = q, .n = n, .cpu = 1};
	uint64_t ns = run_pair(&p, &c);
	im->destroy(q);
	if (c.bad) {
		fprintf(stderr, "bench_ring: %s: %llu items lost or out of order\n", im->name,
			(unsigned long long)c.bad);
		failures += c.bad;
	}
	double whole = (double)n / ((double)ns / 1e9) / 1e6;
	qsort(bench_chunks, bench_nchunks, sizeof(double), cmp_double);
	*steady = bench_nchunks >= 2 ? bench_chunks[bench_nchunks / 2] : whole;
	return whole;
}

/* ns per item for a push and a pop on one thread (bursts of 256 pushed, then popped; the caller pinned):
 * the queue's own cost with no cache line moving between cores. Two threads, each doing its half at
 * this speed with nothing to move, would reach 2 / solo items per ns: the limit the table's fraction uses. */
static double solo(const struct bench_impl *im, unsigned capacity, uint64_t n)
{
	enum { SOLO_BATCH = 256 };
	void *q = im->create(capacity);
	uint64_t bad = 0, t0 = mbp__now_ns();
	for (uint64_t k = 0; k < n; k += SOLO_BATCH) {
		im->produce(q, SOLO_BATCH);
		bad += im->consume(q, SOLO_BATCH);
	}
	double ns = (double)(mbp__now_ns() - t0) / (double)n;
	im->destroy(q);
	if (bad) {
		fprintf(stderr, "bench_ring: %s: %llu items lost or out of order on one thread\n", im->name,
			(unsigned long long)bad);
		failures += bad;
	}
	return ns;
}

/* Mean round trip of one item, lead -> echo -> lead, in ns. */
static double round_trip(const struct bench_impl *im, unsigned capacity, uint64_t n)
{
	void *a = im->create(capacity), *b = im->create(capacity);
	struct side l = {.im = im, .role = LEAD, .a = a, .b = b, .n = n, .cpu = 0};
	struct side e = {.im = im, .role = ECHO, .a = a, .b = b, .n = n, .cpu = 1};
	run_pair(&l, &e);
	im->destroy(a);
	im->destroy(b);
	if (l.bad) {
		fprintf(stderr, "bench_ring: %s: %llu round trips came back wrong\n", im->name,
			(unsigned long long)l.bad);
		failures += l.bad;
	}
	return (double)(l.t1 - l.t0) / (double)n;
}

struct idle {
	struct mbp__ring *r;
	double cpu_ns, wall_ns;
	int rc;
};

static double rusage_thread_ns(void)
{
	struct rusage ru;
	getrusage(RUSAGE_THREAD, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e9 +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e3;
}

static void *idle_consumer(void *arg)
{
	struct idle *s = arg;
	pin(1);
	void *item = NULL;
	double c0 = rusage_thread_ns();
	uint64_t t0 = mbp__now_ns();
	while (!mbp__ring_pop_sc(s->r, &item) &&
	       (s->rc = mbp__ring_wait_pop(s->r, NULL, NULL, UINT64_MAX)) == 0)
		;
	s->wall_ns = (double)(mbp__now_ns() - t0);
	s->cpu_ns = rusage_thread_ns() - c0;
	if (s->rc == 0 && item != bench_stamp(1))
		s->rc = -EBADMSG;
	return NULL;
}

/* Percent of one core used by a consumer blocked in wait_pop (default budgets) on an empty ring for 1 s. */
static double idle_cpu_pct(void)
{
	struct idle s = {.r = mbp_create(64)};
	pthread_t t;
	if (pthread_create(&t, NULL, idle_consumer, &s)) {
		fprintf(stderr, "bench_ring: pthread_create failed\n");
		exit(2);
	}
	struct timespec one_s = {1, 0};
	while (nanosleep(&one_s, &one_s) == -1 && errno == EINTR)
		;
	if (!mbp__ring_push_sp(s.r, bench_stamp(1)))
		failures++;
	pthread_join(t, NULL);
	mbp__ring_destroy(s.r);
	if (s.rc) {
		fprintf(stderr, "bench_ring: idle consumer: %s\n", strerror(-s.rc));
		failures++;
	}
	return 100.0 * s.cpu_ns / s.wall_ns;
}

struct stat3 {
	double med, min, max;
};

static struct stat3 stats(const double *v, int n)
{
	double s[MAX_ROUNDS];
	memcpy(s, v, (size_t)n * sizeof(*v));
	qsort(s, (size_t)n, sizeof(*s), cmp_double);
	return (struct stat3){n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2, s[0], s[n - 1]};
}

static int row_index(const struct bench_impl *im)
{
	for (int i = 0; i < NROWS; i++)
		if (rows[i] == im)
			return i;
	return -1;
}

/* The best of a group of peer rows that ran: the highest median when `higher` (throughput), else the
 * lowest (round trip). */
static const struct bench_impl *best_of(const struct bench_impl *const *group, int n, const struct stat3 *v,
					bool higher)
{
	const struct bench_impl *best = group[0];
	for (int i = 1; i < n; i++) {
		int g = row_index(group[i]), b = row_index(best);
		if (skip[g])
			continue;
		if (skip[b] || (higher ? v[g].med > v[b].med : v[g].med < v[b].med))
			best = group[i];
	}
	return best;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: bench_ring [-n items] [-r rounds] [-l round_trips] [-c capacity] [-s row,...]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	uint64_t n = 10000000, trips = 200000;
	int rounds = 7;
	unsigned capacity = 1024;
	int opt;
	const char *only = NULL;
	while ((opt = getopt(argc, argv, "n:r:l:c:s:")) != -1) {
		switch (opt) {
		case 'n':
			n = bench_opt_u64("-n", optarg, 1, UINT64_MAX);
			break;
		case 'r':
			rounds = (int)bench_opt_u64("-r", optarg, 1, MAX_ROUNDS);
			break;
		case 'l':
			trips = bench_opt_u64("-l", optarg, 1, UINT64_MAX);
			break;
		case 'c':
			capacity = (unsigned)bench_opt_u64("-c", optarg, 64, 1u << 30);
			break;
		case 's':
			only = optarg;
			break;
		default:
			usage();
		}
	}
	if (n == 0 || trips == 0 || rounds < 1 || rounds > MAX_ROUNDS || !mbp__is_pow2(capacity) ||
	    capacity < 64)
		usage();

	cpu_set_t set;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof(set), &set)) {
		perror("sched_getaffinity");
		return 2;
	}
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set))
			cpus[ncpus++] = c;
	for (int i = 0; i < NROWS; i++)
		skip[i] = only && !listed(only, rows[i]->name);
	mbp__wait_global_init();
	printf(
	    "bench_ring: %d allowed CPUs (producer/lead on cpu %d, consumer/echo on cpu %d), capacity %u,\n"
	    "  %llu items per throughput run, %llu round trips per latency run, %d rounds, membarrier %s\n",
	    ncpus, cpus[0], cpus[1 % ncpus], capacity, (unsigned long long)n, (unsigned long long)trips,
	    rounds, mbp__membarrier_ok ? "on" : "off (seq_cst fences)");
	if (ncpus < 2)
		printf("  warning: one CPU only; spinning queues measure the scheduler, not the queue\n");

	static double tp[NROWS][MAX_ROUNDS], st[NROWS][MAX_ROUNDS], rtt[NROWS][MAX_ROUNDS], idle[MAX_ROUNDS];
	static double solo_ns[NROWS];
	for (int r = 0; r < rounds; r++) {
		/* alternate: every implementation once per round, starting at a different row each round */
		for (int k = 0; k < NROWS; k++) {
			int i = (r + k) % NROWS;
			if (!skip[i])
				tp[i][r] = throughput(rows[i], capacity, n, &st[i][r]);
		}
		for (int k = 0; k < NROWS; k++) {
			int i = (r + k) % NROWS;
			if (!skip[i] && rows[i]->lead)
				rtt[i][r] = round_trip(rows[i], capacity, trips);
		}
		pin(0);
		for (int k = 0; k < NROWS; k++) {
			int i = (r + k) % NROWS;
			if (!skip[i] && rows[i]->burst == 1 && !rows[i]->blocking) {
				double v = solo(rows[i], capacity, n / 4 < 1024 ? 1024 : n / 4);
				if (r == 0 || v < solo_ns[i])
					solo_ns[i] = v; /* the best round: the least disturbed */
			}
		}
		idle[r] = idle_cpu_pct();
		fprintf(stderr, "bench_ring: round %d/%d done\n", r + 1, rounds);
	}

	struct stat3 tps[NROWS] = {{0}}, sts[NROWS] = {{0}}, rtts[NROWS] = {{0}};
	printf("\n%-16s %5s %10s %8s %8s %8s %8s %8s %8s %8s %8s %8s  %s\n", "row", "burst", "Mitems/s",
	       "min", "max", "steady", "min", "max", "solo ns", "of limit", "rtt ns", "rtt min", "what");
	for (int i = 0; i < NROWS; i++) {
		if (skip[i])
			continue;
		tps[i] = stats(tp[i], rounds);
		sts[i] = stats(st[i], rounds);
		printf("%-16s %5u %10.1f %8.1f %8.1f %8.1f %8.1f %8.1f ", rows[i]->name, rows[i]->burst,
		       tps[i].med, tps[i].min, tps[i].max, sts[i].med, sts[i].min, sts[i].max);
		if (solo_ns[i] > 0)
			printf("%8.2f %8.2f ", solo_ns[i], sts[i].med / (2e3 / solo_ns[i]));
		else
			printf("%8s %8s ", "-", "-");
		if (rows[i]->lead) {
			rtts[i] = stats(rtt[i], rounds);
			printf("%8.0f %8.0f", rtts[i].med, rtts[i].min);
		} else {
			printf("%8s %8s", "-", "-");
		}
		printf("  %s\n", rows[i]->what);
	}
	struct stat3 idl = stats(idle, rounds);

	/* ratios of mbpipe to the best peer of the same kind */
	static const struct bench_impl *const peers1[] = {&bench_c11, &bench_ck, &bench_boost, &bench_rwq};
	static const struct bench_impl *const peers32[] = {&bench_ck_x32, &bench_boost_b32};
	const struct bench_impl *best1 = best_of(peers1, (int)MBP_ARRAY_SIZE(peers1), tps, true);
	const struct bench_impl *best32 = best_of(peers32, (int)MBP_ARRAY_SIZE(peers32), tps, true);
	const struct bench_impl *best_rtt = best_of(peers1, (int)MBP_ARRAY_SIZE(peers1), rtts, false);
	const struct bench_impl *best_st = best_of(peers1, (int)MBP_ARRAY_SIZE(peers1), sts, true);
	int m1 = row_index(&bench_mbp), m32 = row_index(&bench_mbp_b32), mw = row_index(&bench_mbp_wait);
	int mw32 = row_index(&bench_mbp_wait_b32), pw = row_index(&bench_rwcb_wait);
	double ratio1 = tps[m1].med / tps[row_index(best1)].med;
	double ratio32 = tps[m32].med / tps[row_index(best32)].med;
	double ratiow = tps[mw].med / tps[pw].med;
	double rtt_ratio = rtts[m1].med / rtts[row_index(best_rtt)].med;
	double st_ratio = sts[m1].med / sts[row_index(best_st)].med;
	printf("\nmbpipe / best peer, one item per call: %.2f (best peer %s); steady: %.2f (best peer %s)\n",
	       ratio1, best1->name, st_ratio, best_st->name);
	printf("mbpipe / best peer, bursts of 32:      %.2f (best peer %s)\n", ratio32, best32->name);
	printf("mbpipe-wait / rwcb-wait (blocking):    %.2f; mbpipe-wait / mbpipe: %.2f\n", ratiow,
	       tps[mw].med / tps[m1].med);
	printf("round trip, mbpipe / best peer:        %.2f (best peer %s, %.0f ns; mbpipe-wait %.0f ns)\n",
	       rtt_ratio, best_rtt->name, rtts[row_index(best_rtt)].med, rtts[mw].med);
	printf("idle parked consumer: %.3f%% of a core over 1 s (median; max %.3f%%)\n", idl.med, idl.max);
	printf(
	    "bench_ring: mbpipe_mops=%.1f best_peer=%s best_peer_mops=%.1f ratio=%.2f mbpipe_steady=%.1f "
	    "steady_best_peer=%s steady_peer=%.1f steady_ratio=%.2f b32_mops=%.1f "
	    "b32_best_peer=%s b32_ratio=%.2f wait_mops=%.1f wait_b32_mops=%.1f rtt_ns=%.0f peer_rtt_ns=%.0f "
	    "rtt_ratio=%.2f solo_ns=%.2f peer_solo_ns=%.2f limit_frac=%.2f idle_cpu_pct=%.3f failures=%llu "
	    "cores=%d\n",
	    tps[m1].med, best1->name, tps[row_index(best1)].med, ratio1, sts[m1].med, best_st->name,
	    sts[row_index(best_st)].med, st_ratio, tps[m32].med, best32->name, ratio32, tps[mw].med,
	    tps[mw32].med, rtts[m1].med, rtts[row_index(best_rtt)].med, rtt_ratio, solo_ns[m1],
	    solo_ns[row_index(best_st)], solo_ns[m1] > 0 ? sts[m1].med / (2e3 / solo_ns[m1]) : 0, idl.med,
	    (unsigned long long)failures, ncpus);
	return failures ? 1 : 0;
}

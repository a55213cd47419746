/*
 * bench_pipeline: the pipeline engine against oneTBB's parallel_pipeline and a plain mutex+condvar
 * pipeline, on S stages that each do W microseconds of calibrated busy work per item.
 *
 * The work is a chain of dependent 64-bit multiply-adds (bp_work), calibrated once at start (the fastest of
 * many timed trials), so every implementation runs the same instructions per item and no clock is polled
 * while working. Items are sequence numbers: stage 0 reads in[i], every stage checks that it sees 0, 1, 2,
 * ... (each exactly once, in order), the last stage writes out[i], and the driver checks out[] after every
 * run. Any broken invariant makes the program exit 1.
 *
 * Implementations, one process, one compiler invocation for the work loop:
 *   mbpipe     one job of n rows with mb_rows = 1 (stage 0 splits it: no per-item submit call); the
 *              caller sleeps in mbp_job_wait(). In flight: bounded by the rings (ring_capacity per hop).
 *   mbpipe_mb  single micro-batches: one producer thread acquires, fills and submits, a window of 64 in
 *              flight, results released in on_result. Shown for comparison; the job path is the fast one.
 *   tbb        tbb::parallel_pipeline, every filter serial_in_order, `tokens` live tokens (64).
 *   condvar    one thread per stage, unpinned, bounded queues of ring_capacity slots, each a mutex and two
 *              condition variables (signalled only when a waiter is counted).
 * For each point (S, W) the implementations run round by round (A B C D A B C D ...) and the medians are
 * reported. Run sizes aim at -t seconds each from the previous round's rate, at least 2000 items.
 *
 * Figures, with cores c = min(S, CPUs this process may use):
 *   items/s      n / wall
 *   eff          items/s divided by the ideal c / (S * W): the work spread perfectly over c cores
 *   cpu/work     process CPU time (getrusage user+sys, all threads) / (n * S * W)
 *   hop_ns       (wall * c / n - S * W) / S: the core time per item per stage that is not the work,
 *                i.e. the cost of one hand-off including idle (bubble) time it causes
 *   cpu_hop_ns   (cpu / n - S * W) / S: the same from CPU time actually burnt (spinning counts, sleeping not)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <mbpipe.h>

#include "bench_pipeline.h"

#define MAX_ROUNDS 64
#define MIN_ITEMS  2000

/* ---- clocks and the work ---- */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

void bp_meter_start(struct bp_meter *m)
{
	m->cpu0 = cpu_ns();
	m->wall0 = now_ns();
}

void bp_meter_stop(const struct bp_meter *m, struct bp_run *r)
{
	r->wall_ns = now_ns() - m->wall0;
	r->cpu_ns = cpu_ns() - m->cpu0;
}

__attribute__((noinline)) uint64_t bp_work(uint64_t iters, uint64_t x)
{
	for (uint64_t i = 0; i < iters; i++) {
		x = x * 6364136223846793005u + 1442695040888963407u;
		__asm__ volatile("" : "+r"(x)); /* keep the chain: no vectorising, no closed form */
	}
	return x;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(const double *v, unsigned n)
{
	double t[MAX_ROUNDS];
	memcpy(t, v, n * sizeof(*t));
	qsort(t, n, sizeof(*t), cmp_double);
	return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* Nanoseconds per iteration of bp_work: the fastest of many trials (the undisturbed cost). */
static double calibrate(void)
{
	const uint64_t iters = 200000;
	volatile uint64_t sink = 0;
	uint64_t t_end = now_ns() + 20000000u; /* 20 ms of warm-up: let the core clock settle */
	while (now_ns() < t_end)
		sink += bp_work(iters, sink);
	double best = 1e30;
	for (int k = 0; k < 31; k++) {
		uint64_t t0 = now_ns();
		sink += bp_work(iters, (uint64_t)k);
		double ns = (double)(now_ns() - t0) / (double)iters;
		if (ns < best)
			best = ns;
	}
	return best;
}

/* ---- mbpipe: one job, mb_rows = 1 ---- */

static mbp_opts g_mbp_opts; /* in_row_bytes 8, max_mb_rows 1, then MBPIPE_OPTS and -o applied */

static int stage_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	uint64_t v = *(const uint64_t *)in->data;
	bp_step(ctx, v);
	*(uint64_t *)out->data = v;
	return 0;
}

static bool g_verbose;

static void print_mbp_stats(mbp_pipeline *p, unsigned S)
{
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[BP_MAX_STAGES];
	mbp_pipeline_stats_get(p, &ps, ss, S);
	printf("    mbpipe stats: bubble=%.3f", ps.bubble);
	for (unsigned i = 0; i < S; i++)
		printf(" | s%u cpu%d busy=%.1fms starved=%.1fms blocked=%.1fms", i, ss[i].cpu,
		       ss[i].busy_ns / 1e6, ss[i].starved_ns / 1e6, ss[i].blocked_ns / 1e6);
	printf("\n");
}

static int make_pipeline(const struct bp_task *t, mbp_opts *o, mbp_pipeline **pp)
{
	int rc = mbp_pipeline_new(pp, o);
	for (unsigned i = 0; rc == 0 && i < t->S; i++) {
		mbp_stage_desc d = {.fn = stage_fn, .ctx = &t->st[i], .cpu = -1};
		rc = mbp_pipeline_add_stage(*pp, &d);
	}
	if (rc == 0)
		rc = mbp_pipeline_start(*pp);
	if (rc)
		fprintf(stderr, "bench_pipeline: mbpipe set-up: %s\n", mbp_strerror(rc));
	return rc;
}

static int run_mbpipe(const struct bp_task *t, struct bp_run *r)
{
	mbp_opts o = g_mbp_opts;
	mbp_pipeline *p;
	int rc = make_pipeline(t, &o, &p);
	if (rc) {
		mbp_pipeline_destroy(p);
		return -1;
	}
	mbp_job job;
	struct bp_meter m;
	bp_meter_start(&m);
	mbp_job_init(&job, t->in, t->out, t->n, 1);
	rc = mbp_job_submit(p, &job, -1);
	if (rc == 0)
		rc = mbp_job_wait(&job, -1);
	bp_meter_stop(&m, r);
	r->items = t->n;
	r->errors = rc || job.status || job.mbs_failed;
	if (g_verbose)
		print_mbp_stats(p, t->S);
	rc = mbp_pipeline_drain(p, -1);
	mbp_pipeline_destroy(p);
	return rc ? -1 : 0;
}

/* ---- mbpipe: single micro-batches from one producer, a bounded window ---- */

#define MB_WINDOW 64

struct mb_state {
	/* written by the last stage (on_result) */
	_Atomic uint64_t done;
	uint64_t expect, errors, n;
	uint64_t *out;
	mbp_pipeline *p;
	/* written by the producer */
	_Alignas(64) _Atomic uint32_t sleeping; /* futex word */
	_Atomic uint64_t wake_at;		/* wake the producer once done reaches this */
};

static void futex_wait(_Atomic uint32_t *w, uint32_t val)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void mb_on_result(void *arg, mbp_mb *mb)
{
	struct mb_state *s = arg;
	uint64_t v = *(const uint64_t *)mb->data;
	if (mb->status || mb->seq != s->expect || v != mb->seq || v >= s->n)
		s->errors++;
	else
		s->out[v] = v;
	s->expect = mb->seq + 1;
	mbp_mb_release(s->p, mb);
	uint64_t d = atomic_load_explicit(&s->done, memory_order_relaxed) + 1;
	/* seq_cst store: a Dekker pair with the producer's store of `sleeping` and its re-check of `done` */
	atomic_store(&s->done, d);
	if (atomic_load(&s->sleeping) && d >= atomic_load_explicit(&s->wake_at, memory_order_relaxed)) {
		atomic_store(&s->sleeping, 0);
		futex_wake(&s->sleeping);
	}
}

static int run_mbpipe_mb(const struct bp_task *t, struct bp_run *r)
{
	struct mb_state s;
	memset(&s, 0, sizeof(s));
	s.out = t->out;
	s.n = t->n;
	mbp_opts o = g_mbp_opts;
	o.on_result = mb_on_result;
	o.on_result_arg = &s;
	mbp_pipeline *p;
	if (make_pipeline(t, &o, &p)) {
		mbp_pipeline_destroy(p);
		return -1;
	}
	s.p = p;
	int rc = 0;
	struct bp_meter m;
	bp_meter_start(&m);
	for (uint64_t i = 0; i < t->n && rc == 0; i++) {
		if (i - atomic_load(&s.done) >= MB_WINDOW) {
			/* Full window: sleep until half of it has drained (one wake per MB_WINDOW / 2 items). */
			atomic_store_explicit(&s.wake_at, i - MB_WINDOW / 2, memory_order_relaxed);
			for (;;) {
				atomic_store(&s.sleeping, 1);
				if (i - atomic_load(&s.done) <= MB_WINDOW / 2) {
					atomic_store(&s.sleeping, 0);
					break;
				}
				futex_wait(&s.sleeping, 1);
			}
		}
		mbp_mb *mb;
		rc = mbp_mb_acquire(p, &mb, -1);
		if (rc)
			break;
		*(uint64_t *)mb->data = t->in[i];
		mb->rows = 1;
		mb->seq = i;
		rc = mbp_mb_submit(p, mb, -1);
		if (rc)
			mbp_mb_release(p, mb);
	}
	while (rc == 0 && atomic_load(&s.done) < t->n) {
		atomic_store_explicit(&s.wake_at, t->n, memory_order_relaxed);
		atomic_store(&s.sleeping, 1);
		if (atomic_load(&s.done) < t->n)
			futex_wait(&s.sleeping, 1);
		atomic_store(&s.sleeping, 0);
	}
	bp_meter_stop(&m, r);
	r->items = t->n;
	if (g_verbose)
		print_mbp_stats(p, t->S);
	int drc = mbp_pipeline_drain(p, -1);
	mbp_pipeline_destroy(p);
	r->errors = (rc != 0) + s.errors;
	return drc ? -1 : 0;
}

/* ---- plain mutex + condvar pipeline ---- */

struct cvq {
	pthread_mutex_t m;
	pthread_cond_t not_empty, not_full;
	uint64_t *buf;
	uint64_t head, tail; /* free-running; slot = index % cap */
	uint32_t cap;
	unsigned wait_ne, wait_nf; /* waiters counted, so that a signal is sent only when one waits */
	bool closed;
};

static void cvq_init(struct cvq *q, uint32_t cap)
{
	memset(q, 0, sizeof(*q));
	pthread_mutex_init(&q->m, NULL);
	pthread_cond_init(&q->not_empty, NULL);
	pthread_cond_init(&q->not_full, NULL);
	q->buf = calloc(cap, sizeof(*q->buf));
	q->cap = cap;
}

static void cvq_fini(struct cvq *q)
{
	pthread_mutex_destroy(&q->m);
	pthread_cond_destroy(&q->not_empty);
	pthread_cond_destroy(&q->not_full);
	free(q->buf);
}

static void cvq_push(struct cvq *q, uint64_t v)
{
	pthread_mutex_lock(&q->m);
	while (q->head - q->tail == q->cap) {
		q->wait_nf++;
		pthread_cond_wait(&q->not_full, &q->m);
		q->wait_nf--;
	}
	q->buf[q->head++ % q->cap] = v;
	if (q->wait_ne)
		pthread_cond_signal(&q->not_empty);
	pthread_mutex_unlock(&q->m);
}

static bool cvq_pop(struct cvq *q, uint64_t *v)
{
	pthread_mutex_lock(&q->m);
	while (q->head == q->tail && !q->closed) {
		q->wait_ne++;
		pthread_cond_wait(&q->not_empty, &q->m);
		q->wait_ne--;
	}
	bool ok = q->head != q->tail;
	if (ok) {
		*v = q->buf[q->tail++ % q->cap];
		if (q->wait_nf)
			pthread_cond_signal(&q->not_full);
	}
	pthread_mutex_unlock(&q->m);
	return ok;
}

static void cvq_close(struct cvq *q)
{
	pthread_mutex_lock(&q->m);
	q->closed = true;
	pthread_cond_broadcast(&q->not_empty);
	pthread_mutex_unlock(&q->m);
}

struct cv_pipe {
	const struct bp_task *t;
	struct cvq q[BP_MAX_STAGES]; /* q[i]: stage i -> stage i + 1 */
	pthread_barrier_t go;
};

struct cv_arg {
	struct cv_pipe *cp;
	unsigned idx;
};

static void *cv_stage(void *arg)
{
	struct cv_arg *a = arg;
	struct cv_pipe *cp = a->cp;
	const struct bp_task *t = cp->t;
	struct bp_stage *st = &t->st[a->idx];
	bool last = a->idx + 1 == t->S;
	pthread_barrier_wait(&cp->go);
	if (a->idx == 0) {
		for (uint64_t i = 0; i < t->n; i++) {
			uint64_t v = t->in[i];
			bp_step(st, v);
			cvq_push(&cp->q[0], v);
		}
		cvq_close(&cp->q[0]);
		return NULL;
	}
	uint64_t v;
	while (cvq_pop(&cp->q[a->idx - 1], &v)) {
		bp_step(st, v);
		if (last)
			t->out[v] = v;
		else
			cvq_push(&cp->q[a->idx], v);
	}
	if (!last)
		cvq_close(&cp->q[a->idx]);
	return NULL;
}

static int run_condvar(const struct bp_task *t, struct bp_run *r)
{
	struct cv_pipe cp;
	struct cv_arg args[BP_MAX_STAGES];
	pthread_t th[BP_MAX_STAGES];
	cp.t = t;
	for (unsigned i = 0; i + 1 < t->S; i++)
		cvq_init(&cp.q[i], g_mbp_opts.ring_capacity);
	pthread_barrier_init(&cp.go, NULL, t->S + 1);
	for (unsigned i = 0; i < t->S; i++) {
		args[i] = (struct cv_arg){&cp, i};
		if (pthread_create(&th[i], NULL, cv_stage, &args[i]) != 0) {
			fprintf(stderr, "bench_pipeline: pthread_create failed\n");
			exit(2);
		}
	}
	struct bp_meter m;
	bp_meter_start(&m);
	pthread_barrier_wait(&cp.go);
	for (unsigned i = 0; i < t->S; i++)
		pthread_join(th[i], NULL);
	bp_meter_stop(&m, r);
	r->items = t->n;
	r->errors = 0;
	for (unsigned i = 0; i + 1 < t->S; i++)
		cvq_fini(&cp.q[i]);
	pthread_barrier_destroy(&cp.go);
	return 0;
}

/* ---- the driver ---- */

struct impl {
	const char *name;
	int (*run)(const struct bp_task *t, struct bp_run *r);
};

static const struct impl impls[] = {
    {"mbpipe", run_mbpipe},
    {"mbpipe_mb", run_mbpipe_mb},
    {"tbb", bp_run_tbb},
    {"condvar", run_condvar},
};
#define NIMPL (sizeof(impls) / sizeof(impls[0]))

struct point_stats {
	double items_s[MAX_ROUNDS], cpu_work[MAX_ROUNDS], hop[MAX_ROUNDS], cpu_hop[MAX_ROUNDS];
	unsigned n;
};

static uint64_t *g_in, *g_out;
static uint64_t g_cap;
static struct bp_stage g_st[BP_MAX_STAGES];

static void ensure_capacity(uint64_t n)
{
	if (n <= g_cap)
		return;
	free(g_in);
	free(g_out);
	g_in = malloc(n * sizeof(*g_in));
	g_out = malloc(n * sizeof(*g_out));
	if (!g_in || !g_out) {
		fprintf(stderr, "bench_pipeline: out of memory for %llu items\n", (unsigned long long)n);
		exit(2);
	}
	for (uint64_t i = 0; i < n; i++)
		g_in[i] = i;
	g_cap = n;
}

/* Run one implementation on n items and check every invariant. Returns false when one broke. */
static bool run_one(const struct impl *im, unsigned S, uint64_t iters, uint64_t n, unsigned tokens,
		    struct bp_run *r)
{
	ensure_capacity(n);
	memset(g_out, 0xff, n * sizeof(*g_out));
	for (unsigned i = 0; i < S; i++)
		g_st[i] = (struct bp_stage){.iters = iters};
	struct bp_task t = {.S = S, .n = n, .in = g_in, .out = g_out, .st = g_st, .tokens = tokens};
	memset(r, 0, sizeof(*r));
	bool ok = im->run(&t, r) == 0 && r->errors == 0 && r->items == n;
	for (unsigned i = 0; i < S; i++)
		ok = ok && g_st[i].errors == 0 && g_st[i].expect == n;
	uint64_t bad = 0;
	for (uint64_t i = 0; i < n; i++)
		bad += g_out[i] != i;
	if (!ok || bad) {
		fprintf(
		    stderr,
		    "bench_pipeline: %s S=%u n=%llu: invariant broken (run errors %llu, %llu wrong outputs",
		    im->name, S, (unsigned long long)n, (unsigned long long)r->errors,
		    (unsigned long long)bad);
		for (unsigned i = 0; i < S; i++)
			fprintf(stderr, "; stage %u saw %llu, %llu out of order", i,
				(unsigned long long)g_st[i].expect, (unsigned long long)g_st[i].errors);
		fprintf(stderr, ")\n");
		return false;
	}
	return true;
}

static int parse_list(const char *s, double *v, unsigned max)
{
	unsigned n = 0;
	while (*s && n < max) {
		char *end;
		v[n++] = strtod(s, &end);
		if (end == s)
			return -1;
		s = *end == ',' ? end + 1 : end;
	}
	return (int)n;
}

static void usage(void)
{
	fprintf(
	    stderr,
	    "usage: bench_pipeline [-r rounds] [-t seconds_per_run] [-S 2,4] [-W 0.2,1,10,100] [-k tokens]\n"
	    "                      [-o mbpipe_opts] [-v]\n"
	    "  mbpipe options come from MBPIPE_OPTS, then -o (key=value,..., see mbp_opts_parse)\n");
	exit(2);
}

int main(int argc, char **argv)
{
	unsigned rounds = 5, tokens = 64;
	double run_s = 0.3;
	double Ss[8] = {2, 4}, Ws[8] = {0.2, 1, 10, 100};
	int nS = 2, nW = 4;
	const char *cli_opts = NULL;
	int c;
	while ((c = getopt(argc, argv, "r:t:S:W:k:o:v")) != -1) {
		switch (c) {
		case 'r':
			rounds = (unsigned)atoi(optarg);
			break;
		case 't':
			run_s = atof(optarg);
			break;
		case 'S':
			nS = parse_list(optarg, Ss, 8);
			break;
		case 'W':
			nW = parse_list(optarg, Ws, 8);
			break;
		case 'k':
			tokens = (unsigned)atoi(optarg);
			break;
		case 'o':
			cli_opts = optarg;
			break;
		case 'v':
			g_verbose = true;
			break;
		default:
			usage();
		}
	}
	if (rounds < 1 || rounds > MAX_ROUNDS || run_s <= 0 || nS < 1 || nW < 1 || tokens < 1)
		usage();
	for (int i = 0; i < nS; i++)
		if (Ss[i] < 1 || Ss[i] > BP_MAX_STAGES || Ss[i] != floor(Ss[i]))
			usage();
	for (int i = 0; i < nW; i++)
		if (!(Ws[i] > 0))
			usage();

	mbp_opts_init(&g_mbp_opts);
	g_mbp_opts.in_row_bytes = sizeof(uint64_t);
	g_mbp_opts.max_mb_rows = 1;
	size_t errpos = 0;
	const char *env = getenv("MBPIPE_OPTS");
	if (mbp_opts_parse(&g_mbp_opts, env, &errpos) || mbp_opts_parse(&g_mbp_opts, cli_opts, &errpos)) {
		fprintf(stderr, "bench_pipeline: bad mbpipe options at offset %zu\n", errpos);
		return 2;
	}

	int cpus[MBP_MAX_CPUS];
	unsigned quota = 0;
	int nallowed = mbp_cpus_allowed(cpus, MBP_MAX_CPUS, &quota);
	if (nallowed < 1) {
		fprintf(stderr, "bench_pipeline: cannot read the allowed CPUs\n");
		return 2;
	}
	unsigned ncpu = (unsigned)nallowed;
	if (quota && quota < ncpu)
		ncpu = quota;

	double ns_iter = calibrate();
	printf("bench_pipeline: %u CPUs allowed; work loop %.4f ns/iteration (fastest of 31 trials)\n", ncpu,
	       ns_iter);
	printf("mbpipe: ring_capacity=%u cache_size=%u spin_ns=%llu yield_ns=%llu pin=%d; mode: one job, "
	       "mb_rows=1\n",
	       g_mbp_opts.ring_capacity, g_mbp_opts.cache_size, (unsigned long long)g_mbp_opts.spin_ns,
	       (unsigned long long)g_mbp_opts.yield_ns, g_mbp_opts.pin);
	printf("mbpipe_mb: single micro-batches, one producer, window %u; tbb: parallel_pipeline, "
	       "serial_in_order, "
	       "%u live tokens;\ncondvar: one unpinned thread per stage, queues of %u slots; "
	       "%u rounds, about %.2f s per run, medians shown\n",
	       MB_WINDOW, tokens, g_mbp_opts.ring_capacity, rounds, run_s);
	printf("hop_ns = (wall * cores / items - S * W) / S; cpu_hop_ns = (cpu / items - S * W) / S; cores = "
	       "min(S, CPUs)\n\n");
	printf("%2s %7s %-10s %12s %6s %8s %9s %10s %9s %s\n", "S", "W_us", "impl", "items/s", "eff",
	       "cpu/work", "hop_ns", "cpu_hop_ns", "items/run", "items/s min..max");

	int failed = 0;
	unsigned targets = 0, targets_met = 0;
	for (int si = 0; si < nS; si++) {
		for (int wi = 0; wi < nW; wi++) {
			unsigned S = (unsigned)Ss[si];
			double W_ns = Ws[wi] * 1000.0;
			uint64_t iters = (uint64_t)llround(W_ns / ns_iter);
			double W_eff = (double)iters * ns_iter; /* the work actually asked for */
			unsigned cores = S < ncpu ? S : ncpu;
			double ideal = cores / (S * W_eff * 1e-9);
			struct point_stats ps[NIMPL];
			double est[NIMPL];
			uint64_t last_n[NIMPL];
			memset(ps, 0, sizeof(ps));
			/* pilot run: warms up each implementation and estimates its rate */
			for (unsigned k = 0; k < NIMPL; k++) {
				uint64_t n = (uint64_t)(ideal * 0.02);
				n = n < MIN_ITEMS ? MIN_ITEMS : n > 200000 ? 200000 : n;
				struct bp_run r;
				if (!run_one(&impls[k], S, iters, n, tokens, &r)) {
					failed = 1;
					goto out;
				}
				est[k] = (double)r.items / (r.wall_ns * 1e-9);
			}
			for (unsigned round = 0; round < rounds; round++) {
				for (unsigned k = 0; k < NIMPL; k++) {
					uint64_t n = (uint64_t)(est[k] * run_s);
					n = n < MIN_ITEMS ? MIN_ITEMS : n;
					struct bp_run r;
					if (!run_one(&impls[k], S, iters, n, tokens, &r)) {
						failed = 1;
						goto out;
					}
					double wall = (double)r.wall_ns, items = (double)r.items;
					double rate = items / (wall * 1e-9);
					struct point_stats *p = &ps[k];
					p->items_s[p->n] = rate;
					p->cpu_work[p->n] = (double)r.cpu_ns / (items * S * W_eff);
					p->hop[p->n] = (wall * cores / items - S * W_eff) / S;
					p->cpu_hop[p->n] = ((double)r.cpu_ns / items - S * W_eff) / S;
					p->n++;
					est[k] = rate;
					last_n[k] = n;
					if (g_verbose)
						printf("    round %u %-10s %12.0f items/s eff %.3f cpu/work "
						       "%.3f\n",
						       round, impls[k].name, rate, rate / ideal,
						       p->cpu_work[p->n - 1]);
				}
			}
			double med[NIMPL], eff[NIMPL], cw[NIMPL], hop[NIMPL];
			for (unsigned k = 0; k < NIMPL; k++) {
				struct point_stats *p = &ps[k];
				med[k] = median(p->items_s, p->n);
				eff[k] = med[k] / ideal;
				cw[k] = median(p->cpu_work, p->n);
				hop[k] = median(p->hop, p->n);
				double lo = p->items_s[0], hi = p->items_s[0];
				for (unsigned i = 1; i < p->n; i++) {
					lo = p->items_s[i] < lo ? p->items_s[i] : lo;
					hi = p->items_s[i] > hi ? p->items_s[i] : hi;
				}
				printf("%2u %7.1f %-10s %12.0f %6.3f %8.3f %9.0f %10.0f %9llu %.0f..%.0f\n",
				       S, Ws[wi], impls[k].name, med[k], eff[k], cw[k], hop[k],
				       median(p->cpu_hop, p->n), (unsigned long long)last_n[k], lo, hi);
			}
			/* impls[]: 0 mbpipe, 1 mbpipe_mb, 2 tbb, 3 condvar */
			printf("bench_pipeline: S=%u W_us=%g mbpipe_items_s=%.0f mbpipe_mb_items_s=%.0f "
			       "tbb_items_s=%.0f "
			       "condvar_items_s=%.0f eff=%.3f eff_tbb=%.3f eff_condvar=%.3f ratio_tbb=%.2f "
			       "ratio_condvar=%.2f cpu_over_work=%.3f tbb_cpu_over_work=%.3f hop_ns=%.0f "
			       "tbb_hop_ns=%.0f "
			       "cores=%u cpus=%u rounds=%u\n",
			       S, Ws[wi], med[0], med[1], med[2], med[3], eff[0], eff[2], eff[3],
			       med[0] / med[2], med[0] / med[3], cw[0], cw[2], hop[0], hop[2], cores, ncpu,
			       rounds);
			/* the targets, for a 2-core machine; only where they apply */
			if (ncpu == 2) {
				struct {
					bool applies;
					const char *what;
					double got, want;
				} tg[] = {
				    {S == 2 && Ws[wi] == 10, "eff >= 0.95", eff[0], 0.95},
				    {S == 2 && Ws[wi] == 1, "eff >= 0.90", eff[0], 0.90},
				    {Ws[wi] <= 1, "ratio_tbb >= 1.5", med[0] / med[2], 1.5},
				    {S == 4, "eff >= 0.85", eff[0], 0.85},
				    {S == 4, "cpu_over_work <= 1.1", -cw[0], -1.1},
				};
				for (unsigned i = 0; i < sizeof(tg) / sizeof(tg[0]); i++) {
					if (!tg[i].applies)
						continue;
					bool met = tg[i].got >= tg[i].want;
					targets++;
					targets_met += met;
					printf("  target S=%u W_us=%g %s: %.3f %s\n", S, Ws[wi], tg[i].what,
					       tg[i].got < 0 ? -tg[i].got : tg[i].got,
					       met ? "met" : "MISSED");
				}
			}
			printf("\n");
		}
	}
out:;
	double ns_iter2 = calibrate();
	printf("bench_pipeline: work loop re-calibrated at the end: %.4f ns/iteration (%+.1f%%)\n", ns_iter2,
	       (ns_iter2 / ns_iter - 1) * 100);
	if (targets)
		printf("bench_pipeline: targets met %u of %u\n", targets_met, targets);
	free(g_in);
	free(g_out);
	if (failed)
		printf("bench_pipeline: FAILED: an invariant broke\n");
	return failed;
}

/*
 * bench_pipeline: the pipeline engine against oneTBB's parallel_pipeline and a plain mutex+condvar
 * pipeline, on S stages that each do W microseconds of calibrated busy work per item.
 *
 * The work is a chain of dependent 64-bit multiply-adds (bp_work), calibrated once at start (the median of 31
 * timed chunks), so every implementation runs the same instructions per item and no clock is polled while
 * working. Its speed drifts a few per cent with the host's load, so every round also times the work alone on
 * one thread, and the figures use the median of those (W = work_ns). Items are sequence numbers: stage 0
 * reads in[i], every stage checks that it sees 0, 1, 2, ... (each exactly once, in order), the last stage
 * writes out[i], and the driver checks out[] after every run. Any broken invariant makes the program exit 1.
 *
 * Implementations, one process, one compiler invocation for the work loop:
 *   mbpipe     one job of n rows with mb_rows = 1 (stage 0 splits it: no per-item submit call); the
 *              caller sleeps in mbp_job_wait(). In flight: bounded by the rings (ring_capacity per hop).
 *              Default options: where S > CPUs, consecutive stages share a thread (opts.threads).
 *   mb_thr_S   only where S > CPUs: the same with one thread per stage (opts.threads = S), the threads
 *              of a CPU time-slicing it.
 *   mb_fused   only where S > CPUs: min(S, CPUs) engine stages, each running a balanced run of
 *              consecutive benchmark stages in one call of its own: the bound for the engine's threads
 *              shared by stages (no per-stage accounting or buffer between the stages of a thread).
 *   mbpipe_mb  single micro-batches: one producer thread acquires, fills and submits, a window of 64 in
 *              flight, results released in on_result. Shown for comparison; the job path is the fast one.
 *   tbb        tbb::parallel_pipeline, every filter serial_in_order, `tokens` live tokens (64).
 *   condvar    one thread per stage, unpinned, bounded queues of ring_capacity slots, each a mutex and two
 *              condition variables (signalled only when a waiter is counted).
 * For each point (S, W) the implementations run round by round, each round starting with the next one (A B C
 * D, B C D A, ...), and the medians are reported. Run sizes aim at -t seconds each from the previous round's
 * rate, at least 2000 items.
 *
 * Figures, with cores c = min(S, CPUs this process may use):
 *   items/s      n / wall
 *   eff          items/s divided by the ideal c / (S * W): the work spread perfectly over c cores
 *   others       CPUs kept busy by other processes during the run (/proc/stat minus this process): a
 *                run with others well above 0 shared the machine and says little
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

#include "bench_util.h"
#include "bench_pipeline.h"

#define MAX_ROUNDS 64
#define MIN_ITEMS  2000

/* ---- clocks and the work ---- */

static uint64_t cpu_ns(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

/* Busy time of all CPUs of the machine (everything but idle and iowait) in ns, from /proc/stat; 0 if
 * unreadable. Clock ticks of 10 ms: good enough to tell a quiet machine from a shared one. */
static uint64_t sys_busy_ns(void)
{
	unsigned long long v[10] = {0};
	FILE *f = fopen("/proc/stat", "r");
	if (!f)
		return 0;
	int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
		       &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]);
	fclose(f);
	if (n < 8)
		return 0;
	unsigned long long ticks = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]; /* guest time is inside user */
	return (uint64_t)(ticks * (1000000000.0 / (double)sysconf(_SC_CLK_TCK)));
}

void bp_meter_start(struct bp_meter *m)
{
	m->sys_busy0 = sys_busy_ns();
	m->cpu0 = cpu_ns();
	m->wall0 = mbt_now_ns();
}

void bp_meter_stop(const struct bp_meter *m, struct bp_run *r)
{
	r->wall_ns = mbt_now_ns() - m->wall0;
	r->cpu_ns = cpu_ns() - m->cpu0;
	double others = (double)(sys_busy_ns() - m->sys_busy0) - (double)r->cpu_ns;
	r->others = others > 0 ? others / (double)r->wall_ns : 0;
}

__attribute__((noinline)) uint64_t bp_work(uint64_t iters, uint64_t x)
{
	for (uint64_t i = 0; i < iters; i++) {
		x = x * 6364136223846793005u + 1442695040888963407u;
		__asm__ volatile("" : "+r"(x)); /* keep the chain: no vectorising, no closed form */
	}
	return x;
}

/* Median nanoseconds of one call bp_work(iters): `trials` timed chunks of about `chunk_ns` each. The median,
 * not the fastest: the loop's speed here varies by a few per cent with the host's load, and the fastest
 * chunk would flatter every implementation's efficiency alike. */
static double work_cost(uint64_t iters, unsigned trials, double chunk_ns, double ns_guess)
{
	double t[MAX_ROUNDS];
	uint64_t calls = (uint64_t)(chunk_ns / (ns_guess * (double)(iters ? iters : 1)));
	calls = calls ? calls : 1;
	volatile uint64_t sink = 0;
	trials = trials < MAX_ROUNDS ? trials : MAX_ROUNDS;
	for (unsigned k = 0; k < trials; k++) {
		uint64_t x = k, t0 = mbt_now_ns();
		for (uint64_t j = 0; j < calls; j++)
			x = bp_work(iters, x);
		t[k] = (double)(mbt_now_ns() - t0) / (double)calls;
		sink += x;
	}
	return bench_median(t, trials);
}

/* Nanoseconds per iteration of bp_work: the median of 31 chunks of 1 ms, after 20 ms of warm-up. */
static double calibrate(void)
{
	volatile uint64_t sink = 0;
	uint64_t t_end = mbt_now_ns() + 20000000u; /* let the core clock settle */
	while (mbt_now_ns() < t_end)
		sink += bp_work(100000, sink);
	return work_cost(1000000, 31, 1e6, 1.0) / 1e6;
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
static int g_cpus[MBP_MAX_CPUS];
static unsigned g_ncpu;

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

/* Consecutive benchmark stages run by one engine stage (mbpipe_fused). */
struct stage_group {
	struct bp_stage *st;
	unsigned n;
};

static int group_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	const struct stage_group *g = ctx;
	uint64_t v = *(const uint64_t *)in->data;
	for (unsigned j = 0; j < g->n; j++)
		bp_step(&g->st[j], v);
	*(uint64_t *)out->data = v;
	return 0;
}

/* A started pipeline of the task's S stages, or, with `groups`, of min(S, CPUs) engine stages that each run
 * a balanced run of consecutive benchmark stages (what the engine could do itself when stages outnumber
 * CPUs). Returns the engine's stage count, or a negative error. */
static int make_pipeline(const struct bp_task *t, mbp_opts *o, struct stage_group *groups, mbp_pipeline **pp)
{
	unsigned n = t->S;
	if (groups) {
		n = t->S < g_ncpu ? t->S : g_ncpu;
		for (unsigned g = 0; g < n; g++) {
			unsigned lo = g * t->S / n, hi = (g + 1) * t->S / n;
			groups[g] = (struct stage_group){&t->st[lo], hi - lo};
		}
	}
	int rc = mbp_pipeline_new(pp, o);
	for (unsigned i = 0; rc == 0 && i < n; i++) {
		mbp_stage_desc d = {.fn = stage_fn, .ctx = &t->st[i]};
		if (groups)
			d = (mbp_stage_desc){.fn = group_fn, .ctx = &groups[i]};
		rc = mbp_pipeline_add_stage(*pp, &d);
	}
	if (rc == 0)
		rc = mbp_pipeline_start(*pp);
	if (rc)
		fprintf(stderr, "bench_pipeline: mbpipe set-up: %s\n", mbp_strerror(rc));
	return rc ? rc : (int)n;
}

enum job_mode { JOB_ENGINE, JOB_THREAD_PER_STAGE, JOB_HAND_FUSED };

static int run_job(const struct bp_task *t, struct bp_run *r, enum job_mode mode)
{
	mbp_opts o = g_mbp_opts;
	if (mode == JOB_THREAD_PER_STAGE)
		o.threads = t->S;
	mbp_pipeline *p;
	struct stage_group groups[BP_MAX_STAGES];
	int rc = make_pipeline(t, &o, mode == JOB_HAND_FUSED ? groups : NULL, &p);
	if (rc < 0) {
		mbp_pipeline_destroy(p);
		return -1;
	}
	unsigned nstages = (unsigned)rc;
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
		print_mbp_stats(p, nstages);
	rc = mbp_pipeline_drain(p, -1);
	mbp_pipeline_destroy(p);
	return rc ? -1 : 0;
}

static int run_mbpipe(const struct bp_task *t, struct bp_run *r)
{
	return run_job(t, r, JOB_ENGINE);
}

static int run_mbpipe_thr(const struct bp_task *t, struct bp_run *r)
{
	return run_job(t, r, JOB_THREAD_PER_STAGE);
}

static int run_mbpipe_fused(const struct bp_task *t, struct bp_run *r)
{
	return run_job(t, r, JOB_HAND_FUSED);
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
	if (make_pipeline(t, &o, NULL, &p) < 0) {
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

/* The summary line and the targets refer to these by index. */
enum { I_MBPIPE, I_MBPIPE_THR, I_MBPIPE_FUSED, I_MBPIPE_MB, I_TBB, I_CONDVAR, NIMPL };
static const struct impl impls[NIMPL] = {
    [I_MBPIPE] = {"mbpipe", run_mbpipe},
    [I_MBPIPE_THR] = {"mb_thr_S", run_mbpipe_thr},
    [I_MBPIPE_FUSED] = {"mb_fused", run_mbpipe_fused},
    [I_MBPIPE_MB] = {"mbpipe_mb", run_mbpipe_mb},
    [I_TBB] = {"tbb", bp_run_tbb},
    [I_CONDVAR] = {"condvar", run_condvar},
};

struct cfg {
	bool sel[NIMPL]; /* implementations to run */
	unsigned rounds, tokens, ncpu;
	double run_s, ns_iter;
};

/* One implementation at one point: the runs, then the medians. */
struct im_stats {
	struct bp_run runs[MAX_ROUNDS];
	unsigned n;
	double med, eff, cpu_work, hop, cpu_hop, others, lo, hi; /* see the file comment */
};

/* One point (S, W). */
struct point {
	unsigned S, cores;
	double W_us;		   /* nominal */
	uint64_t iters;		   /* bp_work iterations for W_us at the calibrated speed */
	double w_meas[MAX_ROUNDS]; /* the work alone, measured in each round */
	double W_ns, ideal;	   /* median of w_meas; cores / (S * W_ns) items per second */
	struct im_stats im[NIMPL];
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

/* Whether implementation k runs at this point: mb_thr_S and mb_fused only where stages outnumber CPUs
 * (elsewhere they are mbpipe itself). */
static bool runs(const struct cfg *c, const struct point *pt, unsigned k)
{
	return c->sel[k] && ((k != I_MBPIPE_FUSED && k != I_MBPIPE_THR) || pt->S > pt->cores);
}

/* Medians over the rounds, against the work as measured alone in the same rounds. */
static void point_finish(struct point *pt, unsigned rounds)
{
	pt->W_ns = bench_median(pt->w_meas, rounds);
	pt->ideal = pt->cores / (pt->S * pt->W_ns * 1e-9);
	double work = pt->S * pt->W_ns;
	for (unsigned k = 0; k < NIMPL; k++) {
		struct im_stats *m = &pt->im[k];
		if (m->n == 0)
			continue;
		double items_s[MAX_ROUNDS], cpu_work[MAX_ROUNDS], hop[MAX_ROUNDS], cpu_hop[MAX_ROUNDS],
		    others[MAX_ROUNDS];
		for (unsigned i = 0; i < m->n; i++) {
			const struct bp_run *r = &m->runs[i];
			double wall = (double)r->wall_ns, items = (double)r->items;
			items_s[i] = items / (wall * 1e-9);
			cpu_work[i] = (double)r->cpu_ns / (items * work);
			hop[i] = (wall * pt->cores / items - work) / pt->S;
			cpu_hop[i] = ((double)r->cpu_ns / items - work) / pt->S;
			others[i] = r->others;
		}
		m->med = bench_median(items_s, m->n);
		m->eff = m->med / pt->ideal;
		m->cpu_work = bench_median(cpu_work, m->n);
		m->hop = bench_median(hop, m->n);
		m->cpu_hop = bench_median(cpu_hop, m->n);
		m->others = bench_median(others, m->n);
		qsort(items_s, m->n, sizeof(*items_s), bench_cmp_double);
		m->lo = items_s[0];
		m->hi = items_s[m->n - 1];
	}
}

/* Measure one point: a pilot run of each implementation (warm-up and rate estimate), then the rounds,
 * alternating the implementations. Returns false when an invariant broke. */
static bool run_point(const struct cfg *c, struct point *pt)
{
	double est[NIMPL];
	for (unsigned k = 0; k < NIMPL; k++) {
		if (!runs(c, pt, k))
			continue;
		uint64_t n = (uint64_t)(pt->ideal * 0.02);
		n = n < MIN_ITEMS ? MIN_ITEMS : n > 200000 ? 200000 : n;
		struct bp_run r;
		if (!run_one(&impls[k], pt->S, pt->iters, n, c->tokens, &r))
			return false;
		est[k] = (double)r.items / (r.wall_ns * 1e-9);
	}
	for (unsigned round = 0; round < c->rounds; round++) {
		/* the work alone, on this thread, 11 chunks of about 1 ms */
		pt->w_meas[round] = work_cost(pt->iters, 11, 1e6, c->ns_iter);
		if (g_verbose)
			printf("  round %u: work alone %.1f ns (nominal %.1f)\n", round, pt->w_meas[round],
			       pt->W_us * 1000);
		/* rotate: round r starts with implementation r mod NIMPL, so that none always runs first */
		for (unsigned j = 0; j < NIMPL; j++) {
			unsigned k = (round + j) % NIMPL;
			if (!runs(c, pt, k))
				continue;
			uint64_t n = (uint64_t)(est[k] * c->run_s);
			n = n < MIN_ITEMS ? MIN_ITEMS : n;
			struct bp_run r;
			if (!run_one(&impls[k], pt->S, pt->iters, n, c->tokens, &r))
				return false;
			pt->im[k].runs[pt->im[k].n++] = r;
			est[k] = (double)r.items / (r.wall_ns * 1e-9);
			if (g_verbose)
				printf("    %-10s %12.0f items/s cpu %.3f s others %.2f\n", impls[k].name,
				       est[k], r.cpu_ns * 1e-9, r.others);
		}
	}
	point_finish(pt, c->rounds);
	return true;
}

static void print_point(const struct cfg *c, const struct point *pt)
{
	for (unsigned k = 0; k < NIMPL; k++) {
		const struct im_stats *m = &pt->im[k];
		if (!runs(c, pt, k))
			continue;
		printf("%2u %7.1f %7.0f %-10s %12.0f %6.3f %8.3f %9.0f %10.0f %6.2f %9llu %.0f..%.0f\n",
		       pt->S, pt->W_us, pt->W_ns, impls[k].name, m->med, m->eff, m->cpu_work, m->hop,
		       m->cpu_hop, m->others, (unsigned long long)m->runs[m->n - 1].items, m->lo, m->hi);
	}
	const struct im_stats *mb = &pt->im[I_MBPIPE], *tbb = &pt->im[I_TBB], *cv = &pt->im[I_CONDVAR];
	const struct im_stats *fu = &pt->im[I_MBPIPE_FUSED], *th = &pt->im[I_MBPIPE_THR];
	printf("bench_pipeline: S=%u W_us=%g work_ns=%.0f mbpipe_items_s=%.0f mbpipe_mb_items_s=%.0f "
	       "mb_thr_S_items_s=%.0f mbpipe_fused_items_s=%.0f tbb_items_s=%.0f condvar_items_s=%.0f "
	       "eff=%.3f eff_thr_S=%.3f eff_fused=%.3f eff_tbb=%.3f eff_condvar=%.3f ratio_tbb=%.2f "
	       "ratio_condvar=%.2f cpu_over_work=%.3f thr_S_cpu_over_work=%.3f fused_cpu_over_work=%.3f "
	       "tbb_cpu_over_work=%.3f hop_ns=%.0f tbb_hop_ns=%.0f others_cpus=%.2f cores=%u cpus=%u "
	       "rounds=%u\n",
	       pt->S, pt->W_us, pt->W_ns, mb->med, pt->im[I_MBPIPE_MB].med, th->med, fu->med, tbb->med,
	       cv->med, mb->eff, th->eff, fu->eff, tbb->eff, cv->eff, mb->med / tbb->med, mb->med / cv->med,
	       mb->cpu_work, th->cpu_work, fu->cpu_work, tbb->cpu_work, mb->hop, tbb->hop, mb->others,
	       pt->cores, c->ncpu, c->rounds);
}

/* The targets (for this 2-core machine), where they apply to the point. */
static void check_targets(const struct point *pt, unsigned *targets, unsigned *met)
{
	const struct im_stats *mb = &pt->im[I_MBPIPE];
	double ratio = mb->med / pt->im[I_TBB].med;
	struct {
		bool applies, at_most;
		const char *what;
		double got, want;
	} tg[] = {
	    {pt->S == 2 && pt->W_us == 10, false, "eff >= 0.95", mb->eff, 0.95},
	    {pt->S == 2 && pt->W_us == 1, false, "eff >= 0.90", mb->eff, 0.90},
	    {pt->W_us <= 1, false, "ratio_tbb >= 1.5", ratio, 1.5},
	    {pt->S == 4, false, "eff >= 0.85", mb->eff, 0.85},
	    {pt->S == 4, true, "cpu_over_work <= 1.1", mb->cpu_work, 1.1},
	};
	for (unsigned i = 0; i < sizeof(tg) / sizeof(tg[0]); i++) {
		if (!tg[i].applies)
			continue;
		bool ok = tg[i].at_most ? tg[i].got <= tg[i].want : tg[i].got >= tg[i].want;
		++*targets;
		*met += ok;
		printf("  target S=%u W_us=%g %s: %.3f %s\n", pt->S, pt->W_us, tg[i].what, tg[i].got,
		       ok ? "met" : "MISSED");
	}
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

/* -i mbpipe,tbb,...: which implementations run (all by default; the summary shows 0 for the others). */
static int parse_impls(const char *s, bool *sel)
{
	memset(sel, 0, NIMPL * sizeof(*sel));
	while (*s) {
		size_t len = strcspn(s, ",");
		unsigned k = 0;
		while (k < NIMPL && !(strlen(impls[k].name) == len && strncmp(impls[k].name, s, len) == 0))
			k++;
		if (k == NIMPL)
			return -1;
		sel[k] = true;
		s += len + (s[len] == ',');
	}
	return 0;
}

static void usage(void)
{
	fprintf(
	    stderr,
	    "usage: bench_pipeline [-r rounds] [-t seconds_per_run] [-S 2,4] [-W 0.2,1,10,100] [-k tokens]\n"
	    "                      [-o mbpipe_opts] [-i mbpipe,mb_thr_S,mb_fused,mbpipe_mb,tbb,condvar]\n"
	    "                      [-v]\n"
	    "  mbpipe options come from MBPIPE_OPTS, then -o (key=value,..., see mbp_opts_parse)\n");
	exit(2);
}

static unsigned allowed_cpus(void)
{
	unsigned quota = 0;
	int n = mbp_cpus_allowed(g_cpus, MBP_MAX_CPUS, &quota);
	if (n < 1) {
		fprintf(stderr, "bench_pipeline: cannot read the allowed CPUs\n");
		exit(2);
	}
	n = n < MBP_MAX_CPUS ? n : MBP_MAX_CPUS;
	return quota && quota < (unsigned)n ? quota : (unsigned)n;
}

static void print_header(const struct cfg *c)
{
	printf("bench_pipeline: %u CPUs allowed; work loop %.4f ns/iteration (median of 31 chunks of 1 ms)\n",
	       c->ncpu, c->ns_iter);
	printf("mbpipe: one job, mb_rows=1; ring_capacity=%u cache_size=%u spin_ns=%llu yield_ns=%llu pin=%d "
	       "threads=%u (0: min(S, CPUs), consecutive stages sharing a thread)\n",
	       g_mbp_opts.ring_capacity, g_mbp_opts.cache_size,
	       g_mbp_opts.spin_ns == MBP_SPIN_NONE ? 0ull : (unsigned long long)g_mbp_opts.spin_ns,
	       g_mbp_opts.yield_ns == MBP_YIELD_NONE ? 0ull : (unsigned long long)g_mbp_opts.yield_ns,
	       g_mbp_opts.pinning == MBP_PIN_PLAN, g_mbp_opts.threads);
	printf("mb_thr_S (only where S > CPUs): the same with one thread per stage (threads=S)\n");
	printf("mb_fused (only where S > CPUs): min(S, CPUs) engine stages, each running S / CPUs "
	       "consecutive stages in one call of its own\n");
	printf("mbpipe_mb: single micro-batches from one producer, window %u, same options\n", MB_WINDOW);
	printf("tbb: parallel_pipeline, serial_in_order filters, %u live tokens, default arena\n", c->tokens);
	printf("condvar: one unpinned thread per stage, mutex+condvar queues of %u slots\n",
	       g_mbp_opts.ring_capacity);
	printf("%u rounds per point, implementations alternating (rotated), about %.2f s per run; medians "
	       "shown\n",
	       c->rounds, c->run_s);
	printf("W = work_ns: one unit of work alone on one thread, measured in every round (median)\n"
	       "cores = min(S, CPUs); eff = items/s / (cores / (S * W)); cpu/work = process user+sys / "
	       "(items * S * W)\n"
	       "hop_ns = (wall * cores / items - S * W) / S; cpu_hop_ns = (cpu / items - S * W) / S\n"
	       "others = CPUs kept busy by other processes meanwhile (/proc/stat minus this process)\n\n");
	printf("%2s %7s %7s %-10s %12s %6s %8s %9s %10s %6s %9s %s\n", "S", "W_us", "work_ns", "impl",
	       "items/s", "eff", "cpu/work", "hop_ns", "cpu_hop_ns", "others", "items/run",
	       "items/s min..max");
}

int main(int argc, char **argv)
{
	struct cfg c = {.rounds = 5, .tokens = 64, .run_s = 0.3};
	for (unsigned k = 0; k < NIMPL; k++)
		c.sel[k] = true;
	double Ss[8] = {2, 4}, Ws[8] = {0.2, 1, 10, 100};
	int nS = 2, nW = 4;
	const char *cli_opts = NULL;
	int opt;
	while ((opt = getopt(argc, argv, "r:t:S:W:k:o:i:v")) != -1) {
		switch (opt) {
		case 'r':
			c.rounds = (unsigned)bench_opt_u64("-r", optarg, 1, MAX_ROUNDS);
			break;
		case 't':
			c.run_s = bench_opt_double("-t", optarg, 1e-3, 3600);
			break;
		case 'S':
			nS = parse_list(optarg, Ss, 8);
			break;
		case 'W':
			nW = parse_list(optarg, Ws, 8);
			break;
		case 'k':
			c.tokens = (unsigned)bench_opt_u64("-k", optarg, 1, 1u << 20);
			break;
		case 'o':
			cli_opts = optarg;
			break;
		case 'i':
			if (parse_impls(optarg, c.sel))
				usage();
			break;
		case 'v':
			g_verbose = true;
			break;
		default:
			usage();
		}
	}
	if (c.rounds < 1 || c.rounds > MAX_ROUNDS || !(c.run_s > 0) || nS < 1 || nW < 1 || c.tokens < 1)
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
	if (mbp_opts_parse(&g_mbp_opts, getenv("MBPIPE_OPTS"), &errpos) ||
	    mbp_opts_parse(&g_mbp_opts, cli_opts, &errpos)) {
		fprintf(stderr, "bench_pipeline: bad mbpipe options at offset %zu\n", errpos);
		return 2;
	}
	c.ncpu = g_ncpu = allowed_cpus();
	c.ns_iter = calibrate();
	print_header(&c);

	int failed = 0;
	unsigned targets = 0, met = 0;
	for (int si = 0; si < nS && !failed; si++) {
		for (int wi = 0; wi < nW && !failed; wi++) {
			struct point pt;
			memset(&pt, 0, sizeof(pt));
			pt.S = (unsigned)Ss[si];
			pt.W_us = Ws[wi];
			pt.iters = (uint64_t)llround(Ws[wi] * 1000.0 / c.ns_iter);
			pt.W_ns = (double)pt.iters * c.ns_iter; /* the work actually asked for */
			pt.cores = pt.S < c.ncpu ? pt.S : c.ncpu;
			pt.ideal = pt.cores / (pt.S * pt.W_ns * 1e-9);
			if (!run_point(&c, &pt)) {
				failed = 1;
				break;
			}
			print_point(&c, &pt);
			if (c.ncpu == 2 && c.sel[I_MBPIPE] && c.sel[I_TBB])
				check_targets(&pt, &targets, &met);
			printf("\n");
		}
	}
	double ns_iter2 = calibrate();
	printf("bench_pipeline: work loop re-calibrated at the end: %.4f ns/iteration (%+.1f%%)\n", ns_iter2,
	       (ns_iter2 / c.ns_iter - 1) * 100);
	if (targets)
		printf("bench_pipeline: targets (2-CPU machine) met %u of %u\n", met, targets);
	free(g_in);
	free(g_out);
	if (failed)
		printf("bench_pipeline: FAILED: an invariant broke\n");
	return failed;
}

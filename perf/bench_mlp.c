/*
 * bench_mlp: an MLP (8 layers of 1024 by default) run three ways, in one process, at several batch sizes:
 *
 *   seq1      mbp_model_forward on one thread, OpenBLAS single-threaded (the sequential reference)
 *   seqmt     mbp_model_forward on one thread, OpenBLAS with one thread per allowed CPU inside each sgemm
 *             (what a user would do instead of a pipeline)
 *   pipe      the model's layers split into S = allowed CPUs balanced stages, one batch at a time (mbp_run),
 *             the batch cut into micro-batches of m rows (the fastest of B, B/2, ..., B/16 in a short
 *             calibration: best of three trials each)
 *   pipe-str  the pipeline fed a stream of batches back to back (a window of jobs in flight), as a server
 *             sees them; each batch is cut into micro-batches of m rows (calibrated too)
 *
 *   dp        the ceiling for any use of the CPUs: one thread per allowed CPU, pinned, each running whole
 *             batches with mbp_model_forward and one OpenBLAS thread (data parallel, sharing the weights);
 *             a stream only (it needs several batches at once)
 *
 * For the sequential peers a stream is the same as one batch after another (one thread cannot overlap
 * batches), so their one-batch figure is also their stream figure.
 *
 * Rounds alternate the peers (seq1, seqmt, pipe, pipe-str, then again) and the table shows medians of
 * samples/s; "others" is the median number of CPUs kept busy by other processes during the measurements
 * (from /proc/stat): on a shared machine, read the figures with it. Invariant checked (exit 1 when broken): the pipeline's output equals mbp_model_forward's with
 * the same micro-batch size bit for bit, and the multi-threaded output agrees within 1e-4.
 *
 * The OpenBLAS kernel is printed: Debian's 0.3.21 may pick generic kernels on recent CPUs; run once as is
 * and once with OPENBLAS_CORETYPE exported in the shell (both peers then share it).
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include <mbpipe.h>

#include "bench_util.h"

#define MAX_BATCHES 16
#define MAX_ROUNDS  64
#define WINDOW	    8 /* jobs in flight in stream mode */

enum { P_SEQ1, P_SEQMT, P_PIPE, P_STREAM, P_DP, NPEERS };

struct conf {
	unsigned rounds, layers, hidden, nb;
	uint32_t batch[MAX_BATCHES];
	double seconds;
	const char *opts;
	bool verbose;
	uint32_t
	    force_mb; /* -m: micro-batch size for both pipeline modes (capped at the batch); 0: calibrate */
	int ncpus, cpus[MBP_MAX_CPUS];
};

static double now_s(void)
{
	return (double)mbt_now_ns() * 1e-9;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "bench_mlp: %s: %s\n", what, mbp_strerror(rc));
	exit(2);
}

/* ---- the peers; each returns the seconds `iters` batches took ---- */

static double run_seq(mbp_model *m, const float *x, float *y, uint32_t B, int threads, unsigned iters)
{
	openblas_set_num_threads(threads);
	double t0 = now_s();
	for (unsigned i = 0; i < iters; i++) {
		int rc = mbp_model_forward(m, x, y, B, 0);
		if (rc)
			die("forward", rc);
	}
	return now_s() - t0;
}

static double run_pipe(mbp_pipeline *p, const float *x, float *y, uint32_t B, uint32_t mb, unsigned iters)
{
	openblas_set_num_threads(1); /* the stages' setting; seqmt changed it */
	double t0 = now_s();
	for (unsigned i = 0; i < iters; i++) {
		int rc = mbp_run(p, x, y, B, mb);
		if (rc)
			die("mbp_run", rc);
	}
	return now_s() - t0;
}

/* `iters` batches back to back, at most WINDOW in flight, each with its own output. */
static double run_stream(mbp_pipeline *p, const float *x, float *const *y, uint32_t B, uint32_t mb,
			 unsigned iters)
{
	openblas_set_num_threads(1);
	mbp_job job[WINDOW];
	double t0 = now_s();
	for (unsigned i = 0; i < iters + WINDOW; i++) {
		unsigned k = i % WINDOW;
		if (i >= WINDOW) {
			int rc = mbp_job_wait(&job[k], -1);
			if (rc || job[k].status)
				die("stream job", rc ? rc : job[k].status);
		}
		if (i < iters) {
			mbp_job_init(&job[k], x, y[k], B, mb);
			int rc = mbp_job_submit(p, &job[k], -1);
			if (rc)
				die("mbp_job_submit", rc);
		}
	}
	return now_s() - t0;
}

struct dp_arg {
	mbp_model *m;
	const float *x;
	float *y;
	uint32_t B;
	unsigned iters;
	int cpu;
};

static void *dp_thread(void *p)
{
	struct dp_arg *a = p;
	bench_pin(a->cpu);
	for (unsigned i = 0; i < a->iters; i++) {
		int rc = mbp_model_forward(a->m, a->x, a->y, a->B, 0);
		if (rc)
			die("forward", rc);
	}
	return NULL;
}

/* `iters` batches shared out to one pinned thread per allowed CPU. */
static double run_dp(const struct conf *c, mbp_model *m, const float *x, float *const *y, uint32_t B,
		     unsigned iters)
{
	openblas_set_num_threads(1);
	unsigned n = (unsigned)c->ncpus < WINDOW ? (unsigned)c->ncpus : WINDOW;
	struct dp_arg a[WINDOW];
	pthread_t t[WINDOW];
	double t0 = now_s();
	for (unsigned i = 0; i < n; i++) {
		a[i] = (struct dp_arg){m, x, y[i], B, iters / n + (i < iters % n), c->cpus[i]};
		if (pthread_create(&t[i], NULL, dp_thread, &a[i]))
			die("pthread_create", -EAGAIN);
	}
	for (unsigned i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	return now_s() - t0;
}

/* ---- one batch size ---- */

struct point {
	uint32_t B, m_one, m_stream;
	double sps[NPEERS][MAX_ROUNDS];
	double others[NPEERS * MAX_ROUNDS]; /* CPUs busy outside this process during each measurement */
	double med[NPEERS], others_med;
	mbp_model_plan plan;
	char stats[NPEERS][256]; /* the pipeline's view of its last pipe / pipe-str measurement */
};

/* Stage by stage: share of the window busy, starved (waiting for input), blocked (waiting for room). */
static void stats_line(mbp_pipeline *p, const mbp_pipeline_stats *a, const mbp_stage_stats *as, char *buf,
		       size_t n)
{
	mbp_pipeline_stats b;
	mbp_stage_stats bs[MBP_MAX_STAGES];
	int S = mbp_pipeline_stats_get(p, &b, bs, MBP_MAX_STAGES);
	if (S < 1) {
		snprintf(buf, n, "(no stats)");
		return;
	}
	mbp_stats_window(&b, bs, a, as, (unsigned)S);
	double w = (double)(b.now_ns - b.start_ns);
	int len = snprintf(buf, n, "bubble %.2f", b.bubble);
	for (int i = 0; i < S && len > 0 && (size_t)len < n; i++)
		len +=
		    snprintf(buf + len, n - (size_t)len,
			     " | s%d cpu%d busy %.0f%% starved %.0f%% blocked %.0f%%", i, bs[i].cpu,
			     100 * bs[i].busy_ns / w, 100 * bs[i].starved_ns / w, 100 * bs[i].blocked_ns / w);
}

static mbp_pipeline *make_pipeline(const struct conf *c, mbp_model *m, uint32_t B, mbp_model_stages **st,
				   mbp_model_plan *plan)
{
	unsigned S = (unsigned)c->ncpus < mbp_model_layers(m) ? (unsigned)c->ncpus : mbp_model_layers(m);
	int rc = mbp_model_balance(m, S, B, c->cpus[0], plan);
	if (rc)
		die("balance", rc);
	if ((rc = mbp_model_stages_new(st, m, plan, B)))
		die("stages", rc);
	mbp_opts o;
	mbp_opts_init(&o);
	size_t errpos;
	if (mbp_opts_parse(&o, c->opts, &errpos)) {
		fprintf(stderr, "bench_mlp: bad -o options at offset %zu\n", errpos);
		exit(2);
	}
	o.in_row_bytes = mbp_model_in_width(m) * sizeof(float);
	o.max_mb_rows = B;
	mbp_pipeline *p;
	if ((rc = mbp_pipeline_new(&p, &o)) || (rc = mbp_model_stages_add(*st, p)) ||
	    (rc = mbp_pipeline_start(p)))
		die("pipeline", rc);
	return p;
}

/* Fastest micro-batch size among B, B/2, ..., B/16 (at least 1 row) for one mode: three short trials of
 * each, candidates alternating (so that another process's burst hits them all alike), best trial counts. */
static uint32_t calibrate(mbp_pipeline *p, const float *x, float *const *y, uint32_t B, bool stream,
			  double trial_s)
{
	uint32_t mb[5];
	unsigned it[5], n = 0;
	double best_t[5];
	for (uint32_t div = 1; div <= 16 && B / div >= 1; div *= 2) {
		if (n && B / div == mb[n - 1])
			break;
		mb[n] = B / div;
		double one =
		    stream ? run_stream(p, x, y, B, mb[n], 2) / 2 : run_pipe(p, x, y[0], B, mb[n], 1);
		/* a stream needs many batches: its fill and drain cost one stage time each */
		it[n] = (unsigned)fmax(stream ? 4 * WINDOW : 2, fmin(400, trial_s / fmax(one, 1e-6)));
		best_t[n++] = INFINITY;
	}
	for (int trial = 0; trial < 3; trial++)
		for (unsigned k = 0; k < n; k++) {
			double t = (stream ? run_stream(p, x, y, B, mb[k], it[k])
					   : run_pipe(p, x, y[0], B, mb[k], it[k])) /
				   it[k];
			best_t[k] = fmin(best_t[k], t);
		}
	unsigned best = 0;
	for (unsigned k = 1; k < n; k++)
		if (best_t[k] < best_t[best])
			best = k;
	return mb[best];
}

static bool run_point(const struct conf *c, mbp_model *m, struct point *pt)
{
	const uint32_t B = pt->B, in = mbp_model_in_width(m), out = mbp_model_out_width(m);
	float *x = malloc((size_t)B * in * sizeof(float)), *ref = malloc((size_t)B * out * sizeof(float));
	float *y[WINDOW];
	for (unsigned i = 0; i < WINDOW; i++)
		y[i] = malloc((size_t)B * out * sizeof(float));
	uint64_t s = 0x2545f4914f6cdd1du + B;
	for (size_t i = 0; i < (size_t)B * in; i++) {
		s = s * 6364136223846793005u + 1442695040888963407u;
		x[i] = (float)((double)(s >> 40) / (double)(1u << 23) - 1.0);
	}
	mbp_model_stages *st;
	mbp_pipeline *p = make_pipeline(c, m, B, &st, &pt->plan);
	if (c->force_mb) {
		pt->m_one = pt->m_stream = c->force_mb < B ? c->force_mb : B;
	} else {
		pt->m_one = calibrate(p, x, y, B, false, 0.04);
		pt->m_stream = calibrate(p, x, y, B, true, 0.04);
	}

	/* invariants: bit for bit against the reference at the same micro-batch size; seqmt within 1e-4 */
	bool ok = true;
	uint32_t ms[2] = {pt->m_one, pt->m_stream};
	for (int k = 0; k < 2; k++) {
		openblas_set_num_threads(1);
		mbp_model_forward(m, x, ref, B, ms[k]);
		run_pipe(p, x, y[0], B, ms[k], 1);
		if (memcmp(ref, y[0], (size_t)B * out * sizeof(float))) {
			fprintf(stderr,
				"bench_mlp: INVARIANT: batch %u, micro-batch %u: pipeline != reference\n", B,
				ms[k]);
			ok = false;
		}
	}
	run_seq(m, x, ref, B, 1, 1);
	run_seq(m, x, y[0], B, c->ncpus, 1);
	for (size_t i = 0; i < (size_t)B * out; i++)
		if (fabsf(ref[i] - y[0][i]) > 1e-4f * fmaxf(1.0f, fabsf(ref[i]))) {
			fprintf(stderr,
				"bench_mlp: INVARIANT: batch %u: multi-threaded OpenBLAS differs at %zu\n", B,
				i);
			ok = false;
			break;
		}

	/* iterations per measurement from one timed batch of the slowest-looking peer */
	double one = run_seq(m, x, ref, B, 1, 1);
	unsigned iters = (unsigned)fmax(3, ceil(c->seconds / fmax(one, 1e-6)));
	/* A stream pays one stage time to fill and one to drain: with at least 8 x WINDOW batches that is
	 * under 3% of a measurement at 2 stages. dp (a stream too) splits the same count over its threads. */
	unsigned iters_stream = iters > 8 * WINDOW ? iters : 8 * WINDOW;
	for (unsigned r = 0; r < c->rounds; r++) {
		for (int k = 0; k < NPEERS; k++) {
			double t;
			mbp_pipeline_stats a;
			mbp_stage_stats as[MBP_MAX_STAGES];
			mbp_pipeline_stats_get(p, &a, as, MBP_MAX_STAGES);
			double busy0 = bench_sys_busy_s(),
			       cpu0 = (double)mbt_clock_ns(CLOCK_PROCESS_CPUTIME_ID) * 1e-9;
			switch (k) {
			case P_SEQ1:
				t = run_seq(m, x, ref, B, 1, iters);
				break;
			case P_SEQMT:
				t = run_seq(m, x, ref, B, c->ncpus, iters);
				break;
			case P_PIPE:
				t = run_pipe(p, x, y[0], B, pt->m_one, iters);
				break;
			case P_STREAM:
				t = run_stream(p, x, y, B, pt->m_stream, iters_stream);
				break;
			default:
				t = run_dp(c, m, x, y, B, iters_stream);
				break;
			}
			pt->sps[k][r] = (double)(k >= P_STREAM ? iters_stream : iters) * B / t;
			pt->others[r * NPEERS + k] =
			    fmax(0, (bench_sys_busy_s() - busy0) -
					((double)mbt_clock_ns(CLOCK_PROCESS_CPUTIME_ID) * 1e-9 - cpu0)) /
			    t;
			if (k == P_PIPE || k == P_STREAM)
				stats_line(p, &a, as, pt->stats[k], sizeof(pt->stats[k]));
		}
	}
	for (int k = 0; k < NPEERS; k++)
		pt->med[k] = bench_median(pt->sps[k], c->rounds);
	pt->others_med = bench_median(pt->others, c->rounds * NPEERS);
	openblas_set_num_threads(1);
	int rc = mbp_pipeline_drain(p, -1);
	if (rc)
		die("drain", rc);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	for (unsigned i = 0; i < WINDOW; i++)
		free(y[i]);
	free(x);
	free(ref);
	return ok;
}

static int parse_batches(const char *s, struct conf *c)
{
	c->nb = 0;
	while (*s && c->nb < MAX_BATCHES) {
		char *end;
		unsigned long v = strtoul(s, &end, 10);
		if (end == s || v < 1 || v > 65536)
			return -1;
		c->batch[c->nb++] = (uint32_t)v;
		s = *end == ',' ? end + 1 : end;
	}
	return c->nb ? 0 : -1;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: bench_mlp [-r rounds] [-t seconds_per_measurement] [-b 1,8,64,256] [-L layers]\n"
		"                 [-H hidden] [-o mbpipe_opts] [-m micro_batch_rows] [-v]\n"
		"  -m: micro-batch size of both pipeline modes (default: calibrated per batch size)\n"
		"  -v: print the pipeline's stage statistics of the last pipe and pipe-str measurement\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct conf c = {.rounds = 5, .layers = 8, .hidden = 1024, .seconds = 0.25, .opts = ""};
	parse_batches("1,8,64,256", &c);
	int opt;
	while ((opt = getopt(argc, argv, "r:t:b:L:H:o:m:vh")) != -1) {
		switch (opt) {
		case 'm':
			c.force_mb = (uint32_t)atoi(optarg);
			break;
		case 'v':
			c.verbose = true;
			break;
		case 'r':
			c.rounds = (unsigned)atoi(optarg);
			break;
		case 't':
			c.seconds = atof(optarg);
			break;
		case 'b':
			if (parse_batches(optarg, &c))
				usage();
			break;
		case 'L':
			c.layers = (unsigned)atoi(optarg);
			break;
		case 'H':
			c.hidden = (unsigned)atoi(optarg);
			break;
		case 'o':
			c.opts = optarg;
			break;
		default:
			usage();
		}
	}
	if (c.rounds < 1 || c.rounds > MAX_ROUNDS || c.layers < 1 || c.hidden < 1 || !(c.seconds > 0))
		usage();
	c.ncpus = mbp_cpus_allowed(c.cpus, MBP_MAX_CPUS, NULL);
	if (c.ncpus < 1)
		die("allowed CPUs", c.ncpus < 0 ? c.ncpus : -EINVAL);
	if (c.ncpus > MBP_MAX_CPUS)
		c.ncpus = MBP_MAX_CPUS;

	char dir[] = "/tmp/bench_mlp-XXXXXX", path[64];
	if (!mkdtemp(dir))
		die("mkdtemp", -errno);
	snprintf(path, sizeof(path), "%s/mlp.safetensors", dir);
	mbp_model_spec sp = {.layers = c.layers,
			     .in = c.hidden,
			     .hidden = c.hidden,
			     .out = c.hidden,
			     .act = MBP_ACT_RELU,
			     .seed = 1};
	int rc = mbp_model_write_random(path, &sp);
	mbp_model *m = NULL;
	if (!rc)
		rc = mbp_model_load(&m, path, NULL);
	unlink(path);
	rmdir(dir);
	if (rc)
		die("model", rc);

	double load[3];
	bench_loadavg(load);
	const char *coretype = getenv("OPENBLAS_CORETYPE");
	printf("bench_mlp: %d CPUs allowed; MLP %u x %u, ReLU, float32 (%.1f MiB of weights); load %.2f %.2f "
	       "%.2f\n",
	       c.ncpus, c.layers, c.hidden, (double)c.layers * c.hidden * c.hidden * 4 / 1048576.0, load[0],
	       load[1], load[2]);
	printf("%s; OPENBLAS_CORETYPE=%s\n", mbp_blas_info(), coretype ? coretype : "(unset)");
	if (mbp_blas_warning())
		printf("warning: %s\n", mbp_blas_warning());
	printf("seq1: forward, 1 OpenBLAS thread; seqmt: forward, %d OpenBLAS threads; pipe: %u stages, one "
	       "batch "
	       "at a time;\npipe-str: %u stages, %u batches in flight. %u rounds alternating peers, ~%.2f s "
	       "each; "
	       "medians of samples/s.\n",
	       c.ncpus, (unsigned)c.ncpus < c.layers ? (unsigned)c.ncpus : c.layers,
	       (unsigned)c.ncpus < c.layers ? (unsigned)c.ncpus : c.layers, WINDOW, c.rounds, c.seconds);

	struct point *pts = calloc(c.nb, sizeof(*pts));
	bool ok = true;
	printf("%6s %5s %5s %10s %10s %10s %10s %9s %9s %9s %9s %10s %7s %7s\n", "batch", "m", "m_str",
	       "seq1", "seqmt", "pipe", "pipe-str", "pipe/s1", "pipe/mt", "str/s1", "str/mt", "dp", "str/dp",
	       "others");
	for (unsigned i = 0; i < c.nb; i++) {
		pts[i].B = c.batch[i];
		ok &= run_point(&c, m, &pts[i]);
		const double *d = pts[i].med;
		printf("%6u %5u %5u %10.1f %10.1f %10.1f %10.1f %9.2f %9.2f %9.2f %9.2f %10.1f %7.2f %7.2f\n",
		       pts[i].B, pts[i].m_one, pts[i].m_stream, d[P_SEQ1], d[P_SEQMT], d[P_PIPE], d[P_STREAM],
		       d[P_PIPE] / d[P_SEQ1], d[P_PIPE] / d[P_SEQMT], d[P_STREAM] / d[P_SEQ1],
		       d[P_STREAM] / d[P_SEQMT], d[P_DP], d[P_STREAM] / d[P_DP], pts[i].others_med);
		if (c.verbose) {
			char plan[1024];
			mbp_model_plan_describe(&pts[i].plan, plan, sizeof(plan));
			printf("         pipe: %s\n         pipe-str: %s\n         plan: ",
			       pts[i].stats[P_PIPE], pts[i].stats[P_STREAM]);
			for (char *l = strtok(plan, "\n"); l; l = strtok(NULL, "\n"))
				printf("%s%s", l, l[0] == 's' && strncmp(l, "stage", 5) == 0 ? "; " : "\n");
		}
		fflush(stdout);
	}
	char plan[1024];
	mbp_model_plan_describe(&pts[c.nb - 1].plan, plan, sizeof(plan));
	printf("plan at %u rows:\n%s", pts[c.nb - 1].B, plan);

	/* targets of the issue (2 CPUs): >= 1.8x seq1 at batch >= 64; stream of batches <= 8 >= seqmt */
	unsigned targets = 0, met = 0;
	for (unsigned i = 0; i < c.nb; i++) {
		const double *d = pts[i].med;
		if (pts[i].B >= 64) {
			bool t1 = d[P_PIPE] / d[P_SEQ1] >= 1.8, t2 = d[P_STREAM] / d[P_SEQ1] >= 1.8;
			targets += 2, met += t1 + t2;
			printf("  target batch %u: pipe >= 1.8 x seq1: %.2f %s; pipe-str >= 1.8 x seq1: %.2f "
			       "%s\n",
			       pts[i].B, d[P_PIPE] / d[P_SEQ1], t1 ? "met" : "MISSED",
			       d[P_STREAM] / d[P_SEQ1], t2 ? "met" : "MISSED");
		}
		if (pts[i].B <= 8) {
			bool t = d[P_STREAM] >= d[P_SEQMT];
			targets++, met += t;
			printf("  target batch %u: pipe-str >= seqmt: %.2f %s\n", pts[i].B,
			       d[P_STREAM] / d[P_SEQMT], t ? "met" : "MISSED");
		}
	}
	printf("bench_mlp: cpus=%d stages=%u layers=%u hidden=%u kernel=%s coretype=%s rounds=%u", c.ncpus,
	       pts[0].plan.stages, c.layers, c.hidden, openblas_get_corename(), coretype ? coretype : "unset",
	       c.rounds);
	for (unsigned i = 0; i < c.nb; i++) {
		const double *d = pts[i].med;
		printf(" b%u_seq1=%.0f b%u_seqmt=%.0f b%u_pipe=%.0f b%u_stream=%.0f b%u_m=%u b%u_mstream=%u",
		       pts[i].B, d[P_SEQ1], pts[i].B, d[P_SEQMT], pts[i].B, d[P_PIPE], pts[i].B, d[P_STREAM],
		       pts[i].B, pts[i].m_one, pts[i].B, pts[i].m_stream);
		printf(" b%u_dp=%.0f", pts[i].B, d[P_DP]);
	}
	printf(" others_cpus=");
	for (unsigned i = 0; i < c.nb; i++)
		printf("%s%.2f", i ? "," : "", pts[i].others_med);
	printf(" targets_met=%u/%u\n", met, targets);
	free(pts);
	mbp_model_destroy(m);
	if (!ok) {
		printf("bench_mlp: FAILED: an invariant broke\n");
		return 1;
	}
	return 0;
}

/*
 * bench_mlp: an MLP (8 layers of 1024 by default, ReLU after all but the last) run these ways, in one
 * process, at several batch sizes:
 *
 *   seq1      the layers through OpenBLAS on one thread: per layer the bias copied into the output, one
 *             cblas_sgemm (cblas_sgemv for one row) with beta = 1, the ReLU (what a user writes by hand;
 *             the ReLU is the stages' own vector loop, mbp__relu, so that the peers differ from the
 *             pipeline in the products' scheduling alone)
 *   seqmt     the same calls with OpenBLAS on one thread per allowed CPU inside each product (what a user
 *             calls to use both cores without mbpipe)
 *   pipe      the model's layers split into S = allowed CPUs balanced stages, one batch at a time (mbp_run),
 *             the batch cut into micro-batches of m rows (the fastest of B, B/2, ..., B/16 in a short
 *             calibration: best of three trials each)
 *   pipe-str  the pipeline fed a stream of batches back to back (a window of jobs in flight), as a server
 *             sees them; each batch is cut into micro-batches of m rows (calibrated too)
 *   dp        one thread per allowed CPU, pinned, each running whole batches with mbp_model_forward (data
 *             parallel, sharing the weights): a stream only (it needs several batches at once)
 *   roof2     the 2-core roofline (S-core, for S allowed CPUs): one pinned thread per CPU, each running
 *             nothing but single-threaded cblas_sgemm at the layers' shape (batch x hidden -> hidden) on
 *             its own copies of a stage's share of the weights (perf/bench_blas.h, as bench_roofline's
 *             blas1x2), summed and turned into samples/s: what S stages would reach with no hand-off, no
 *             bias, no activation and no fill or drain. Each peer's fraction of it is its GFLOP/s over
 *             roof2's (str/roof, mt/roof; with -v every peer's)
 *   str-blas  pipe-str with the dense layers on OpenBLAS (the same weights loaded a second time under
 *             mbp_kernel_set(MBP_KERNEL_BLAS): a version keeps the kernel it was loaded under, and a
 *             pipeline of its own), when the default kernel is the packed one: the two kernels
 *             alternated in one run (str/sb is pipe-str over it)
 *   roof2pk   roof2 with the library's packed kernel over packed weights (bench_roofline's packed1x2):
 *             the 2-core limit of the packed kernel (str/rpk is pipe-str's fraction of it)
 *
 * For the sequential peers a stream is the same as one batch after another (one thread cannot overlap
 * batches), so their one-batch figure is also their stream figure.
 *
 * Rounds alternate the peers (seq1, seqmt, pipe, pipe-str, dp, roof2, then again) and the table shows
 * medians of samples/s; "others" is the median number of CPUs kept busy by other processes during the
 * measurements (from /proc/stat): on a shared machine, read the figures with it. -k runs only some peers
 * (for a profiler: perf record -e cpu-clock). Invariants checked (exit 1 when broken): the pipeline's
 * output equals mbp_model_forward's with the same micro-batch size bit for bit, and the OpenBLAS peers
 * agree with it within 1e-4.
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

#include "bench_blas.h"
#include "bench_util.h"
#include "model/model_internal.h" /* mbp__relu: the peers' ReLU is the stages' */
#include "util/plural.h"

#define MAX_BATCHES 16
#define MAX_ROUNDS  64
#define WINDOW	    8 /* jobs in flight in stream mode */

enum { P_SEQ1, P_SEQMT, P_PIPE, P_STREAM, P_DP, P_ROOF, P_STRB, P_ROOFP, NPEERS };
static const char *const peer_name[NPEERS] = {"seq1", "seqmt", "pipe",	   "pipe-str",
					      "dp",   "roof2", "str-blas", "roof2pk"};

/* The layers as a user holds them for OpenBLAS: each layer's weights [out][in] and bias. */
struct blas_net {
	unsigned layers;
	uint32_t w[65]; /* widths: w[0] in, w[i + 1] layer i's out */
	const float *wt[64], *b[64];
	bool relu[64];	/* the model's activation of the layer: ReLU or none */
	float *s0, *s1; /* activations between layers, max rows x widest */
	mbp_mlp *n;	/* owns the parameters */
};

struct conf {
	unsigned rounds, layers, hidden, nb;
	uint32_t batch[MAX_BATCHES];
	double seconds;
	const char *opts;
	bool verbose;
	uint32_t
	    force_mb; /* -m: micro-batch size for both pipeline modes (capped at the batch); 0: calibrate */
	int ncpus, cpus[MBP_MAX_CPUS];
	bool run[NPEERS]; /* -k: the peers measured */
	double row_flops; /* of one row through every layer */
	struct blas_net net;
	mbp_model *m_blas; /* str-blas: the model loaded again under OpenBLAS (NULL without str-blas) */
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

/* The OpenBLAS peer's forward pass over `rows` rows: bias, product, ReLU, layer after layer. */
static void blas_forward(struct blas_net *bn, const float *x, float *y, uint32_t rows)
{
	const float *cur = x;
	for (unsigned l = 0; l < bn->layers; l++) {
		const int in = (int)bn->w[l], out = (int)bn->w[l + 1];
		float *dst = l + 1 == bn->layers ? y : (l & 1) ? bn->s1 : bn->s0;
		for (uint32_t r = 0; r < rows; r++)
			memcpy(dst + (size_t)r * out, bn->b[l], (size_t)out * sizeof(float));
		if (rows == 1)
			cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, bn->wt[l], in, cur, 1, 1.0f,
				    dst, 1);
		else
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, out, in, 1.0f, cur,
				    in, bn->wt[l], in, 1.0f, dst, out);
		if (bn->relu[l])
			mbp__relu(dst, (size_t)rows * out);
		cur = dst;
	}
}

static void blas_net_init(struct blas_net *bn, mbp_model *m, uint32_t max_rows)
{
	memset(bn, 0, sizeof(*bn));
	int rc = mbp_mlp_new_from_model(&bn->n, m, NULL);
	if (rc)
		die("the OpenBLAS peer's copy of the weights", rc);
	bn->layers = mbp_model_layers(m);
	uint32_t widest = 0;
	for (unsigned l = 0; l < bn->layers; l++) {
		mbp_layer_info li;
		if ((rc = mbp_model_layer_info(m, l, &li)))
			die("layer info", rc);
		bn->w[l] = li.in;
		bn->w[l + 1] = li.out;
		bn->relu[l] = li.act == MBP_ACT_RELU;
		if (li.norm || (li.act != MBP_ACT_RELU && li.act != MBP_ACT_NONE))
			die("the OpenBLAS peer computes dense layers with ReLU or none only", -ENOTSUP);
		widest = li.out > widest ? li.out : widest;
		bn->wt[l] = mbp_mlp_tensor(bn->n, l, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL);
		bn->b[l] = mbp_mlp_tensor(bn->n, l, MBP_PART_BIAS, MBP_ARRAY_PARAM, NULL);
	}
	bn->s0 = malloc((size_t)max_rows * widest * sizeof(float));
	bn->s1 = malloc((size_t)max_rows * widest * sizeof(float));
	if (!bn->s0 || !bn->s1)
		die("scratch", -ENOMEM);
}

static void blas_net_fini(struct blas_net *bn)
{
	free(bn->s0);
	free(bn->s1);
	mbp_mlp_destroy(bn->n);
}

static double run_seq(struct blas_net *bn, const float *x, float *y, uint32_t B, int threads, unsigned iters)
{
	openblas_set_num_threads(threads);
	double t0 = now_s();
	for (unsigned i = 0; i < iters; i++)
		blas_forward(bn, x, y, B);
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
	double window_s[2]; /* CLOCK_MONOTONIC at the first and the end of the last measurement */
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

/* One measurement of peer k: seconds for its batches; *batches says how many. */
static double measure(struct conf *c, mbp_model *m, mbp_pipeline *p, mbp_pipeline *pb, struct point *pt,
		      int k, const float *x, float *const *y, float *ref, unsigned iters,
		      unsigned iters_stream, unsigned *batches)
{
	const uint32_t B = pt->B;
	/* The streams run iters_stream batches, the others iters. The count is the one the run is given, so
	 * that the two cannot part (4add26a's str-blas ran iters_stream counted as iters: 0.1-0.3 its rate). */
	const unsigned n = k == P_STREAM || k == P_DP || k == P_STRB ? iters_stream : iters;
	*batches = n;
	switch (k) {
	case P_SEQ1:
		return run_seq(&c->net, x, ref, B, 1, n);
	case P_SEQMT:
		return run_seq(&c->net, x, ref, B, c->ncpus, n);
	case P_PIPE:
		return run_pipe(p, x, y[0], B, pt->m_one, n);
	case P_STREAM:
		return run_stream(p, x, y, B, pt->m_stream, n);
	case P_DP:
		return run_dp(c, m, x, y, B, n);
	case P_STRB: /* the OpenBLAS model's pipeline, at pipe-str's micro-batch */
		return run_stream(pb, x, y, B, pt->m_stream, n);
	default: { /* roof2(pk): the rate of the products alone, as the seconds its n batches would take */
		const unsigned share = c->layers / (unsigned)c->ncpus ? c->layers / (unsigned)c->ncpus : 1;
		double gflops = bench_pinned_rate_k(BENCH_FWD, k == P_ROOFP, B, c->hidden, c->hidden, c->cpus,
						    (unsigned)c->ncpus, share, c->seconds);
		if (!(gflops > 0))
			die("roof2", -ENOMEM);
		return (double)n * B * c->row_flops / (gflops * 1e9);
	}
	}
}

static bool run_point(struct conf *c, mbp_model *m, struct point *pt)
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
	mbp_model_stages *st, *stb = NULL;
	mbp_pipeline *p = make_pipeline(c, m, B, &st, &pt->plan), *pb = NULL;
	mbp_model_plan plan_b;
	if (c->run[P_STRB]) /* idle while the others run: its workers park after their spin */
		pb = make_pipeline(c, c->m_blas, B, &stb, &plan_b);
	if (c->force_mb) {
		pt->m_one = pt->m_stream = c->force_mb < B ? c->force_mb : B;
	} else {
		pt->m_one = c->run[P_PIPE] ? calibrate(p, x, y, B, false, 0.04) : B;
		pt->m_stream = c->run[P_STREAM] ? calibrate(p, x, y, B, true, 0.04) : B;
	}

	/* invariants: bit for bit against the reference at the same micro-batch size; OpenBLAS within 1e-4 */
	bool ok = true;
	uint32_t ms[2] = {pt->m_one, pt->m_stream};
	for (int k = 0; k < (c->run[P_STRB] ? 4 : 2); k++) { /* then the OpenBLAS model's, for str-blas */
		mbp_model *mk = k < 2 ? m : c->m_blas;
		openblas_set_num_threads(1);
		mbp_model_forward(mk, x, ref, B, ms[k % 2]);
		run_pipe(k < 2 ? p : pb, x, y[0], B, ms[k % 2], 1);
		if (memcmp(ref, y[0], (size_t)B * out * sizeof(float))) {
			fprintf(stderr,
				"bench_mlp: INVARIANT: batch %u, micro-batch %u, %s kernel: pipeline != "
				"reference\n",
				B, ms[k % 2], k < 2 ? mbp_kernel_name(mbp_kernel_get()) : "blas");
			ok = false;
		}
	}
	mbp_model_forward(m, x, ref, B, ms[1]); /* the default kernel's, for the OpenBLAS peers' check */
	for (int threads = 1; threads <= c->ncpus; threads += c->ncpus > 1 ? c->ncpus - 1 : 1) {
		run_seq(&c->net, x, y[1], B, threads, 1);
		for (size_t i = 0; i < (size_t)B * out; i++)
			if (fabsf(ref[i] - y[1][i]) > 1e-4f * fmaxf(1.0f, fabsf(ref[i]))) {
				fprintf(stderr,
					"bench_mlp: INVARIANT: batch %u: OpenBLAS on %d %s differs at %zu "
					"(%g, reference %g)\n",
					B, threads, PLURAL(threads, "thread", "threads"), i, (double)y[1][i],
					(double)ref[i]);
				ok = false;
				break;
			}
	}

	/* iterations per measurement from one timed batch of the slowest-looking peer */
	double one = run_seq(&c->net, x, ref, B, 1, 1);
	unsigned iters = (unsigned)fmax(3, ceil(c->seconds / fmax(one, 1e-6)));
	/* A stream pays one stage time to fill and one to drain: with at least 8 x WINDOW batches that is
	 * under 3% of a measurement at 2 stages. dp (a stream too) splits the same count over its threads. */
	unsigned iters_stream = iters > 8 * WINDOW ? iters : 8 * WINDOW;
	unsigned samples = 0;
	pt->window_s[0] = now_s();
	for (unsigned r = 0; r < c->rounds; r++) {
		for (int k = 0; k < NPEERS; k++) {
			if (!c->run[k])
				continue;
			mbp_pipeline_stats a;
			mbp_stage_stats as[MBP_MAX_STAGES];
			mbp_pipeline *pk = k == P_STRB ? pb : p;
			mbp_pipeline_stats_get(pk, &a, as, MBP_MAX_STAGES);
			bench_others o = bench_others_start();
			unsigned batches;
			double t = measure(c, m, p, pb, pt, k, x, y, ref, iters, iters_stream, &batches);
			pt->sps[k][r] = (double)batches * B / t;
			if (k == P_ROOF ||
			    k == P_ROOFP) /* t is not its wall time: it warms its own weights */
				continue;
			pt->others[samples++] = bench_others_cpus(o);
			if (k == P_PIPE || k == P_STREAM || k == P_STRB)
				stats_line(pk, &a, as, pt->stats[k], sizeof(pt->stats[k]));
		}
	}
	pt->window_s[1] = now_s();
	for (int k = 0; k < NPEERS; k++)
		pt->med[k] = c->run[k] ? bench_median(pt->sps[k], c->rounds) : 0;
	pt->others_med = bench_median(pt->others, samples);
	openblas_set_num_threads(1);
	int rc = mbp_pipeline_drain(p, -1);
	if (!rc && pb)
		rc = mbp_pipeline_drain(pb, -1);
	if (rc)
		die("drain", rc);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	mbp_pipeline_destroy(pb);
	mbp_model_stages_destroy(stb);
	for (unsigned i = 0; i < WINDOW; i++)
		free(y[i]);
	free(x);
	free(ref);
	return ok;
}

/* -k seq1,pipe-str,...: the peers to measure (all by default). */
static int parse_peers(const char *s, struct conf *c)
{
	memset(c->run, 0, sizeof(c->run));
	while (*s) {
		size_t n = strcspn(s, ",");
		int k = 0;
		while (k < NPEERS && (strlen(peer_name[k]) != n || strncmp(s, peer_name[k], n)))
			k++;
		if (k == NPEERS)
			return -1;
		c->run[k] = true;
		s += n + (s[n] == ',');
	}
	return 0;
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
		"                 [-H hidden] [-o mbpipe_opts] [-m micro_batch_rows] [-k peers] [-v]\n"
		"  -m: micro-batch size of both pipeline modes (default: calibrated per batch size)\n"
		"  -k: the peers to measure, of seq1,seqmt,pipe,pipe-str,dp,roof2,str-blas,roof2pk\n"
		"      (default: all; the last two only where the default kernel is the packed one)\n"
		"  -v: print the pipeline's stage statistics of the last pipe and pipe-str measurement\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct conf c = {.rounds = 5, .layers = 8, .hidden = 1024, .seconds = 0.25, .opts = ""};
	parse_batches("1,8,64,256", &c);
	parse_peers("seq1,seqmt,pipe,pipe-str,dp,roof2,str-blas,roof2pk", &c);
	int opt;
	while ((opt = getopt(argc, argv, "r:t:b:L:H:o:m:k:vh")) != -1) {
		switch (opt) {
		case 'm':
			c.force_mb = (uint32_t)bench_opt_u64("-m", optarg, 1, 65536);
			break;
		case 'k':
			if (parse_peers(optarg, &c))
				usage();
			break;
		case 'v':
			c.verbose = true;
			break;
		case 'r':
			c.rounds = (unsigned)bench_opt_u64("-r", optarg, 1, MAX_ROUNDS);
			break;
		case 't':
			c.seconds = bench_opt_double("-t", optarg, 1e-3, 3600);
			break;
		case 'b':
			if (parse_batches(optarg, &c))
				usage();
			break;
		case 'L':
			c.layers = (unsigned)bench_opt_u64("-L", optarg, 1, 64);
			break;
		case 'H':
			c.hidden = (unsigned)bench_opt_u64("-H", optarg, 1, MBP_MODEL_MAX_WIDTH);
			break;
		case 'o':
			c.opts = optarg;
			break;
		default:
			usage();
		}
	}
	if (c.rounds < 1 || c.rounds > MAX_ROUNDS || c.layers < 1 || c.layers > 64 || c.hidden < 1 ||
	    !(c.seconds > 0))
		usage();
	c.ncpus = mbp_cpus_allowed(c.cpus, MBP_MAX_CPUS, NULL);
	if (c.ncpus < 1)
		die("allowed CPUs", c.ncpus < 0 ? c.ncpus : -EINVAL);
	if (mbp_kernel_get() != MBP_KERNEL_PACKED) /* nothing to compare the stream's kernel with */
		c.run[P_STRB] = c.run[P_ROOFP] = false;
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
	if (!rc && c.run[P_STRB]) { /* the same weights again, loaded under OpenBLAS: the str-blas peer's */
		const mbp_kernel kern = mbp_kernel_get();
		mbp_kernel_set(MBP_KERNEL_BLAS);
		rc = mbp_model_load(&c.m_blas, path, NULL);
		mbp_kernel_set(kern);
	}
	unlink(path);
	rmdir(dir);
	if (rc)
		die("model", rc);
	uint32_t max_b = 1;
	for (unsigned i = 0; i < c.nb; i++)
		max_b = c.batch[i] > max_b ? c.batch[i] : max_b;
	blas_net_init(&c.net, m, max_b);
	/* flops of one row through every layer */
	const double row_flops = 2.0 * c.layers * c.hidden * c.hidden;
	c.row_flops = row_flops;

	double load[3];
	bench_loadavg(load);
	const char *coretype = getenv("OPENBLAS_CORETYPE");
	printf("bench_mlp: %d CPUs allowed; MLP %u x %u, ReLU, float32 (%.1f MiB of weights); load %.2f %.2f "
	       "%.2f\n",
	       c.ncpus, c.layers, c.hidden, (double)c.layers * c.hidden * c.hidden * 4 / 1048576.0, load[0],
	       load[1], load[2]);
	printf("%s; OPENBLAS_CORETYPE=%s; dense layers: %s kernel (MBP_KERNEL)\n", mbp_blas_info(),
	       coretype ? coretype : "(unset)", mbp_kernel_name(mbp_kernel_get()));
	if (mbp_blas_warning())
		printf("warning: %s\n", mbp_blas_warning());
	unsigned S = (unsigned)c.ncpus < c.layers ? (unsigned)c.ncpus : c.layers;
	printf("seq1: the layers through OpenBLAS, 1 thread; seqmt: the same, %d OpenBLAS threads;\npipe: %u "
	       "stages, one batch at a time; pipe-str: %u stages, %u batches in flight; dp: %d threads of "
	       "mbp_model_forward;\nroof2: %d pinned threads of sgemm alone at batch x %u x %u on %u of the "
	       "layers' weights each.\n%u rounds alternating peers, ~%.2f s each; medians of samples/s.\n",
	       c.ncpus, S, S, WINDOW, c.ncpus, c.ncpus, c.hidden, c.hidden,
	       c.layers / (unsigned)c.ncpus ? c.layers / (unsigned)c.ncpus : 1, c.rounds, c.seconds);

	struct point *pts = calloc(c.nb, sizeof(*pts));
	bool ok = true;
	printf("%6s %5s %5s %9s %9s %9s %9s %9s %9s %9s %9s %7s %7s %8s %7s %7s %7s %7s %7s\n", "batch", "m",
	       "m_str", "seq1", "seqmt", "pipe", "pipe-str", "dp", "roof2", "str-blas", "roof2pk", "str/s1",
	       "str/mt", "str/roof", "mt/roof", "str/sb", "str/rpk", "str_gf", "others");
	for (unsigned i = 0; i < c.nb; i++) {
		pts[i].B = c.batch[i];
		ok &= run_point(&c, m, &pts[i]);
		const double *d = pts[i].med;
		printf("%6u %5u %5u %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7.2f %7.2f %8.2f %7.2f "
		       "%7.2f "
		       "%7.2f %7.1f %7.2f\n",
		       pts[i].B, pts[i].m_one, pts[i].m_stream, d[P_SEQ1], d[P_SEQMT], d[P_PIPE], d[P_STREAM],
		       d[P_DP], d[P_ROOF], d[P_STRB], d[P_ROOFP], d[P_STREAM] / d[P_SEQ1],
		       d[P_STREAM] / d[P_SEQMT], d[P_STREAM] / d[P_ROOF], d[P_SEQMT] / d[P_ROOF],
		       d[P_STRB] > 0 ? d[P_STREAM] / d[P_STRB] : 0,
		       d[P_ROOFP] > 0 ? d[P_STREAM] / d[P_ROOFP] : 0, d[P_STREAM] * row_flops * 1e-9,
		       pts[i].others_med);
		if (c.verbose) {
			char plan[1024];
			mbp_model_plan_describe(&pts[i].plan, plan, sizeof(plan));
			printf("         GFLOP/s (fraction of roof2):");
			for (int k = 0; k < NPEERS; k++)
				printf(" %s %.1f (%.2f)", peer_name[k], d[k] * row_flops * 1e-9,
				       d[P_ROOF] > 0 ? d[k] / d[P_ROOF] : 0);
			printf("\n         measured: %.6f-%.6f s (CLOCK_MONOTONIC: perf report --time)\n",
			       pts[i].window_s[0], pts[i].window_s[1]);
			printf("         pipe: %s\n         pipe-str: %s\n         str-blas: %s\n         "
			       "plan: ",
			       pts[i].stats[P_PIPE], pts[i].stats[P_STREAM], pts[i].stats[P_STRB]);
			for (char *l = strtok(plan, "\n"); l; l = strtok(NULL, "\n"))
				printf("%s%s", l, l[0] == 's' && strncmp(l, "stage", 5) == 0 ? "; " : "\n");
		}
		fflush(stdout);
	}
	char plan[1024];
	mbp_model_plan_describe(&pts[c.nb - 1].plan, plan, sizeof(plan));
	printf("plan at %u rows:\n%s", pts[c.nb - 1].B, plan);

	/* targets of issue 22 (2 CPUs): the stream >= 1.8 x seq1 at batch >= 64, >= 1.1 x seqmt at batch >= 8 */
	unsigned targets = 0, met = 0;
	for (unsigned i = 0; i < c.nb; i++) {
		const double *d = pts[i].med;
		if (!c.run[P_STREAM])
			break;
		if (pts[i].B >= 64 && c.run[P_SEQ1]) {
			bool t = d[P_STREAM] / d[P_SEQ1] >= 1.8;
			targets++, met += t;
			printf("  target batch %u: pipe-str >= 1.8 x seq1: %.2f %s\n", pts[i].B,
			       d[P_STREAM] / d[P_SEQ1], t ? "met" : "MISSED");
		}
		if (pts[i].B >= 8 && c.run[P_SEQMT]) {
			bool t = d[P_STREAM] / d[P_SEQMT] >= 1.1;
			targets++, met += t;
			printf("  target batch %u: pipe-str >= 1.1 x seqmt: %.2f %s\n", pts[i].B,
			       d[P_STREAM] / d[P_SEQMT], t ? "met" : "MISSED");
		}
	}
	printf("bench_mlp: cpus=%d stages=%u layers=%u hidden=%u kernel=%s coretype=%s dense=%s rounds=%u",
	       c.ncpus, pts[0].plan.stages, c.layers, c.hidden, openblas_get_corename(),
	       coretype ? coretype : "unset", mbp_kernel_name(mbp_kernel_get()), c.rounds);
	for (unsigned i = 0; i < c.nb; i++) {
		const double *d = pts[i].med;
		const uint32_t b = pts[i].B;
		printf(
		    " b%u_seq1=%.0f b%u_seqmt=%.0f b%u_pipe=%.0f b%u_stream=%.0f b%u_dp=%.0f b%u_roof2=%.0f",
		    b, d[P_SEQ1], b, d[P_SEQMT], b, d[P_PIPE], b, d[P_STREAM], b, d[P_DP], b, d[P_ROOF]);
		printf(" b%u_stream_blas=%.0f b%u_roof2pk=%.0f", b, d[P_STRB], b, d[P_ROOFP]);
		printf(" b%u_m=%u b%u_mstream=%u b%u_stream_gflops=%.1f b%u_stream_roof=%.2f", b,
		       pts[i].m_one, b, pts[i].m_stream, b, d[P_STREAM] * row_flops * 1e-9, b,
		       d[P_ROOF] > 0 ? d[P_STREAM] / d[P_ROOF] : 0);
	}
	printf(" others_cpus=");
	for (unsigned i = 0; i < c.nb; i++)
		printf("%s%.2f", i ? "," : "", pts[i].others_med);
	printf(" targets_met=%u/%u\n", met, targets);
	free(pts);
	blas_net_fini(&c.net);
	mbp_model_destroy(c.m_blas);
	mbp_model_destroy(m);
	if (!ok) {
		printf("bench_mlp: FAILED: an invariant broke\n");
		return 1;
	}
	return 0;
}

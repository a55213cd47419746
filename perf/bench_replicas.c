/*
 * bench_replicas: replicated stages (issue 25's targets), in one process, rounds alternating the peers.
 *
 *   model   an MLP whose one layer is most of the work (default widths 256-1536-1536-256-256-256: the
 *           1536 x 1536 layer is about 70 % of the multiply-adds; its measured share is printed), fed a
 *           stream of batches (a window of jobs in flight), through
 *             unrep   the best partition without replicas over the CPUs (mbp_model_partition for 1 .. CPUs
 *                     stages, the least predicted period; ties to fewer stages)
 *             rep     the plan of mbp_model_partition_replicas over the CPUs (-s: that many stages; 0, the
 *                     default: any number)
 *           rows/s of each and rep/unrep (the target on 2 cores: at least 1.3; the plans' predicted
 *           ratio is printed as ideal: 1/0.7 = 1.43 for a layer of 70 % on 2 cores). Every job's output
 *           is compared with mbp_model_forward's at the same micro-batch size, bit for bit.
 *   merge   the ordered merge's cost where nothing is replicated: S = 2 stages of W us of calibrated busy
 *           work per item (W = 1 and 10), one job of items of one row, replicas 1,1 (the rings: the path
 *           without replicas) and, beside it, 1,2 (the second stage's replicas behind windows). Against
 *           main's pipeline, run bench_pipeline in both builds with perf/ab.sh (its mbpipe figures are
 *           this path): perf/ab.sh -i S,W_us -m mbpipe_items_s MAIN_BUILD BUILD 5 perf/bench_pipeline
 *
 * Summary lines (grep-able, one per configuration):
 *   bench_replicas: mode=model ... unrep_rows_s=.. rep_rows_s=.. ratio=.. bits=ok others=..
 *   bench_replicas: mode=merge S=2 W_us=.. r=1,1 items_s=.. others=..
 * Exit 1 when an output differs from the reference or a count does not add up; 2 for bad arguments.
 * -q: a quick run at small sizes (proves the benchmark runs; no figure to quote).
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include <mbpipe.h>

#include "bench_util.h"
#include "util/burn.h"

#define WINDOW	  8 /* jobs in flight */
#define MAX_ROUND 32

struct conf {
	uint32_t widths[16];
	unsigned layers, rounds, stages;
	uint32_t batch, mb;
	double seconds;
	int ncpus;
	bool quick;
};

static void die(const char *what, int rc)
{
	fprintf(stderr, "bench_replicas: %s: %s\n", what, mbp_strerror(rc));
	exit(2);
}

static bool failed;

/* ---- model mode ---- */

struct model_run {
	mbp_model *m;
	const mbp_model_plan *plan;
	const float *x, *ref;
	size_t in_w, out_w;
};

/* Rows per second of a stream of jobs through the plan's stages for about `seconds`. */
static double stream_rows_s(const struct conf *c, const struct model_run *mr)
{
	mbp_model_stages *st;
	int rc = mbp_model_stages_new(&st, mr->m, mr->plan, c->mb);
	if (rc)
		die("stages", rc);
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = mr->in_w * sizeof(float);
	o.max_mb_rows = c->mb;
	mbp_pipeline *p;
	if ((rc = mbp_pipeline_new(&p, &o)) || (rc = mbp_model_stages_add(st, p)) ||
	    (rc = mbp_pipeline_start(p)))
		die("pipeline", rc);
	static mbp_job job[WINDOW];
	float *out = malloc((size_t)WINDOW * c->batch * mr->out_w * sizeof(float));
	const size_t out_n = (size_t)c->batch * mr->out_w;
	uint64_t t0 = mbt_now_ns(), end = t0 + (uint64_t)(c->seconds * 1e9), submitted = 0, done = 0;
	for (;;) {
		bool more = mbt_now_ns() < end;
		if (submitted - done == WINDOW || (!more && submitted > done)) { /* the oldest job */
			mbp_job *jb = &job[done % WINDOW];
			mbp_job_wait(jb, -1);
			if (jb->status || memcmp(jb->out, mr->ref, out_n * sizeof(float))) {
				fprintf(stderr,
					"bench_replicas: a job's output is not mbp_model_forward's bits\n");
				failed = true;
			}
			done++;
			continue;
		}
		if (!more)
			break;
		mbp_job *jb = &job[submitted % WINDOW];
		mbp_job_init(jb, mr->x, out + (submitted % WINDOW) * out_n, c->batch, c->mb);
		if ((rc = mbp_job_submit(p, jb, -1)))
			die("submit", rc);
		submitted++;
	}
	double s = (double)(mbt_now_ns() - t0) / 1e9;
	mbp_pipeline_stats ps;
	mbp_pipeline_drain(p, -1);
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	if (ps.mbs_accepted != ps.mbs_completed || ps.mbs_failed) {
		fprintf(stderr, "bench_replicas: %llu accepted, %llu completed, %llu failed\n",
			(unsigned long long)ps.mbs_accepted, (unsigned long long)ps.mbs_completed,
			(unsigned long long)ps.mbs_failed);
		failed = true;
	}
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	free(out);
	return (double)done * c->batch / s;
}

static void plan_line(const char *name, const mbp_model_plan *pl)
{
	printf("%s:", name);
	for (unsigned s = 0; s < pl->stages; s++)
		printf(" [%u-%u]x%u", pl->first[s], pl->first[s + 1] - 1,
		       pl->replicas[s] ? pl->replicas[s] : 1);
	printf("  predicted period %.1f us\n", pl->slowest_ns / 1e3);
}

static void model_mode(const struct conf *c)
{
	char path[] = "/tmp/bench-replicas-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		die("mkstemp", -errno);
	close(fd);
	mbp_model_spec sp = {.layers = c->layers, .widths = c->widths, .act = MBP_ACT_RELU, .seed = 7};
	int rc = mbp_model_write_random(path, &sp);
	mbp_model *m;
	if (rc || (rc = mbp_model_load(&m, path, NULL)))
		die("model", rc);
	unlink(path);
	openblas_set_num_threads(1);
	double cost[32], hand[32];
	if ((rc = mbp_model_profile(m, c->mb, 5, -1, cost, hand)))
		die("profile", rc);
	double sum = 0, top = 0;
	for (unsigned i = 0; i < c->layers; i++) {
		sum += cost[i];
		top = fmax(top, cost[i]);
	}
	unsigned cpus = (unsigned)c->ncpus > MBP_MAX_STAGES ? MBP_MAX_STAGES : (unsigned)c->ncpus;
	mbp_model_plan unrep, rep, q;
	for (unsigned S = 1; S <= c->layers && S <= cpus; S++) {
		if ((rc = mbp_model_partition(cost, hand, c->layers, S, &q)))
			die("partition", rc);
		if (S == 1 || q.slowest_ns < unrep.slowest_ns)
			unrep = q;
	}
	if ((rc = mbp_model_partition_replicas(cost, hand, c->layers, c->stages, cpus, &rep)))
		die("partition with replicas", rc);
	printf("bench_replicas: model");
	for (unsigned i = 0; i <= c->layers; i++)
		printf("%s%u", i ? "-" : " ", c->widths[i]);
	printf(", batch %u rows, micro-batches of %u, %d CPUs; the heaviest layer is %.0f%% of the "
	       "profiled work\n",
	       c->batch, c->mb, c->ncpus, 100 * top / sum);
	plan_line("  unrep", &unrep);
	plan_line("  rep  ", &rep);
	size_t in_w = c->widths[0], out_w = c->widths[c->layers];
	float *x = malloc((size_t)c->batch * in_w * sizeof(float)),
	      *ref = malloc((size_t)c->batch * out_w * sizeof(float));
	for (size_t i = 0; i < (size_t)c->batch * in_w; i++)
		x[i] = (float)sin((double)i * 0.37);
	if ((rc = mbp_model_forward(m, x, ref, c->batch, c->mb)))
		die("forward", rc);
	struct model_run ru = {m, &unrep, x, ref, in_w, out_w}, rr = {m, &rep, x, ref, in_w, out_w};
	double a[MAX_ROUND], b[MAX_ROUND], ratio[MAX_ROUND], others = 0;
	for (unsigned r = 0; r < c->rounds; r++) {
		bench_others o = bench_others_start();
		if (r & 1) { /* alternate which goes first */
			b[r] = stream_rows_s(c, &rr);
			a[r] = stream_rows_s(c, &ru);
		} else {
			a[r] = stream_rows_s(c, &ru);
			b[r] = stream_rows_s(c, &rr);
		}
		others += bench_others_cpus(o);
		ratio[r] = b[r] / a[r];
		printf("  round %u: unrep %.0f rows/s, rep %.0f rows/s, ratio %.3f\n", r, a[r], b[r],
		       ratio[r]);
	}
	printf("bench_replicas: mode=model heavy_share=%.3f cpus=%d unrep_stages=%u rep_stages=%u "
	       "rep_threads=%u unrep_rows_s=%.0f rep_rows_s=%.0f ratio=%.3f ideal=%.3f target=1.30 "
	       "bits=%s others=%.2f\n",
	       top / sum, c->ncpus, unrep.stages, rep.stages, rep.threads, bench_median(a, c->rounds),
	       bench_median(b, c->rounds), bench_median(ratio, c->rounds), unrep.slowest_ns / rep.slowest_ns,
	       failed ? "WRONG" : "ok", others / c->rounds);
	free(x);
	free(ref);
	mbp_model_destroy(m);
}

/* ---- merge mode ---- */

static double per_us;

struct work {
	uint64_t iters, sink[MBP_MAX_REPLICAS];
};

static int work_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	struct work *w = ctx;
	unsigned r = mbp_stage_replica();
	w->sink[r] = burn(w->iters, w->sink[r] + *(const uint64_t *)in->data);
	memcpy(out->data, in->data, (size_t)in->rows * in->row_bytes);
	return 0;
}

/* Items per second of one job of n one-row items through stages of w_us each, replicas r0, r1. */
static double merge_items_s(uint64_t n, double w_us, unsigned r0, unsigned r1)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = sizeof(uint64_t);
	mbp_pipeline *p;
	int rc = mbp_pipeline_new(&p, &o);
	if (rc)
		die("pipeline", rc);
	static struct work w[2];
	const unsigned reps[2] = {r0, r1};
	for (unsigned s = 0; s < 2; s++) {
		w[s].iters = (uint64_t)(w_us * per_us);
		mbp_stage_desc d = {.fn = work_fn, .ctx = &w[s], .replicas = reps[s]};
		if ((rc = mbp_pipeline_add_stage(p, &d)))
			die("stage", rc);
	}
	if ((rc = mbp_pipeline_start(p)))
		die("start", rc);
	uint64_t *in = malloc(n * sizeof(*in)), *out = malloc(n * sizeof(*out));
	for (uint64_t i = 0; i < n; i++)
		in[i] = i;
	uint64_t t0 = mbt_now_ns();
	rc = mbp_run(p, in, out, n, 1);
	double s = (double)(mbt_now_ns() - t0) / 1e9;
	if (rc)
		die("run", rc);
	for (uint64_t i = 0; i < n; i++)
		if (out[i] != i) {
			fprintf(stderr, "bench_replicas: item %llu came back as %llu\n",
				(unsigned long long)i, (unsigned long long)out[i]);
			failed = true;
			break;
		}
	mbp_pipeline_destroy(p);
	free(in);
	free(out);
	return (double)n / s;
}

static void merge_mode(const struct conf *c)
{
	per_us = burn_calibrate();
	static const double ws[2] = {1, 10};
	static const unsigned rs[2][2] = {{1, 1}, {1, 2}};
	for (unsigned k = 0; k < 2; k++)
		for (unsigned v = 0; v < 2; v++) {
			double rate[MAX_ROUND], others = 0;
			uint64_t n = (uint64_t)(c->seconds * 1e6 / ws[k]);
			for (unsigned r = 0; r < c->rounds; r++) {
				bench_others o = bench_others_start();
				rate[r] = merge_items_s(n, ws[k], rs[v][0], rs[v][1]);
				others += bench_others_cpus(o);
			}
			printf("bench_replicas: mode=merge S=2 W_us=%g r=%u,%u items_s=%.0f others=%.2f\n",
			       ws[k], rs[v][0], rs[v][1], bench_median(rate, c->rounds), others / c->rounds);
		}
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_replicas [-q] [-k model|merge] [-w W0-W1-..] [-b ROWS] [-m ROWS] "
			"[-s STAGES] [-r ROUNDS] [-t SECONDS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const uint32_t dflt[] = {256, 1536, 1536, 256, 256, 256};
	struct conf c = {.layers = 5, .rounds = 5, .batch = 256, .mb = 32, .seconds = 1.0};
	memcpy(c.widths, dflt, sizeof(dflt));
	const char *only = NULL;
	int o;
	while ((o = getopt(argc, argv, "qk:w:b:m:s:r:t:")) != -1) {
		switch (o) {
		case 'q':
			c.quick = true;
			break;
		case 'k':
			only = optarg;
			break;
		case 'w': {
			unsigned n = 0;
			for (char *s = optarg, *e; *s && n < 16; s = *e ? e + 1 : e) {
				c.widths[n++] = (uint32_t)strtoul(s, &e, 10);
				if (e == s || c.widths[n - 1] == 0 || (*e && *e != '-'))
					usage();
			}
			if (n < 2)
				usage();
			c.layers = n - 1;
			break;
		}
		case 'b':
			c.batch = (uint32_t)bench_opt_u64("-b", optarg, 1, 1u << 20);
			break;
		case 'm':
			c.mb = (uint32_t)bench_opt_u64("-m", optarg, 1, 1u << 20);
			break;
		case 's':
			c.stages = (unsigned)bench_opt_u64("-s", optarg, 1, MBP_MAX_STAGES);
			break;
		case 'r':
			c.rounds = (unsigned)bench_opt_u64("-r", optarg, 1, MAX_ROUND);
			break;
		case 't':
			c.seconds = bench_opt_double("-t", optarg, 1e-3, 3600);
			break;
		default:
			usage();
		}
	}
	if (c.quick) {
		static const uint32_t small[] = {32, 192, 192, 32, 32, 32};
		memcpy(c.widths, small, sizeof(small));
		c.layers = 5;
		c.batch = 32;
		c.mb = 8;
		c.rounds = 2;
		c.seconds = 0.1;
	}
	if (!c.batch || !c.mb || c.mb > c.batch || !c.rounds || c.rounds > MAX_ROUND || c.seconds <= 0 ||
	    (only && strcmp(only, "model") && strcmp(only, "merge")))
		usage();
	c.ncpus = mbp_cpus_allowed(NULL, 0, NULL);
	if (c.ncpus < 1)
		die("cpus", c.ncpus);
	if (!only || !strcmp(only, "model"))
		model_mode(&c);
	if (!only || !strcmp(only, "merge"))
		merge_mode(&c);
	if (failed)
		printf("bench_replicas: FAILED: an invariant broke\n");
	return failed ? 1 : 0;
}

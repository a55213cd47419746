/*
 * pipebench: the throughput tool of mbpipe.
 *
 * For each micro-batch size of the sweep: run the sequential baseline (the same stages in order on one
 * thread) a few times, then the pipeline for the warm-up and measured batches, alternating the two so that
 * both see the same machine; check every output. Then choose the best size, measure the whole batch as
 * one unit for the Gantt chart if the sweep did not, write the trace of the chosen size if asked, and
 * print the report. See pipebench.h for the files and pipebench.1 for the user's view.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "pipebench.h"

#define PB_DEF_BATCH_MLP       256
#define PB_DEF_BATCH_SYNTHETIC 64
#define PB_DEF_MAX_STAGES      4

static int usage_error(const char *msg)
{
	fprintf(stderr, "pipebench: %s (try --help)\n", msg);
	return PB_EXIT_USAGE;
}

static unsigned terminal_width(void)
{
	struct winsize ws;
	if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
		return ws.ws_col;
	const char *cols = getenv("COLUMNS");
	long v = cols ? strtol(cols, NULL, 10) : 0;
	return v >= 40 && v <= 400 ? (unsigned)v : 100;
}

/* Prepare the stages for size m and compute the reference output for that size. */
static int prepare_size(pb_bench *b, uint32_t m, bool baseline, char *err, size_t errlen)
{
	pb_workload *w = b->w;
	const pb_config *cfg = b->cfg;
	if (w->prepare && w->prepare(w, m, err, errlen))
		return -1;
	if (baseline && pb_baseline_run(b, cfg->baseline_runs, err, errlen))
		return -1;
	if (w->reference) {
		if (w->reference(w, b->in, b->ref, cfg->batch, m, err, errlen))
			return -1;
	} else if (baseline) {
		memcpy(b->ref, b->seq, (size_t)cfg->batch * w->out_row_bytes);
	}
	if (baseline) { /* the baseline is checked like the pipeline: a broken stage shows here too */
		char why[PB_ERR_MAX];
		if (w->check(w, b->seq, b->ref, cfg->batch, why, sizeof(why))) {
			snprintf(err, errlen, "the sequential baseline is wrong: %.200s", why);
			return -1;
		}
	}
	return 0;
}

/* The sweep: for each size the baseline runs, then the pipeline, so that the two alternate. Stops at the
 * first failure, which goes into rep. */
static void sweep(pb_bench *b, pb_result *res, pb_report *rep)
{
	const pb_config *cfg = b->cfg;
	char err[PB_ERR_MAX];
	for (unsigned i = 0; i < cfg->nsizes && rep->status == 0; i++) {
		uint32_t m = cfg->sizes[i];
		if (prepare_size(b, m, true, err, sizeof(err))) {
			rep->status = PB_EXIT_FAIL;
			snprintf(rep->error, sizeof(rep->error), "%s", err);
			break;
		}
		pb_measure(b, m, cfg->warmup, cfg->batches, cfg->duration_s, NULL, &res[i]);
		rep->nres = i + 1;
		if (res[i].status) {
			rep->status = PB_EXIT_FAIL;
			snprintf(rep->error, sizeof(rep->error), "m=%u: %.200s", m, res[i].error);
		}
	}
	/* against the median of every baseline run, known only now */
	for (unsigned i = 0; i < rep->nres; i++)
		res[i].speedup = b->base.throughput > 0 ? res[i].throughput / b->base.throughput : 0;
	if (rep->nres)
		rep->best = pb_choose(res, rep->nres, cfg->latency_target_ms, rep->why, sizeof(rep->why));
}

/* After the sweep: the whole batch as one unit for the Gantt chart, unless the sweep measured it; and the
 * trace of the chosen size, a short run of its own with the activity log on. */
static void measure_extras(pb_bench *b, pb_result *res, pb_result *single, pb_result *traced, pb_report *rep)
{
	const pb_config *cfg = b->cfg;
	char err[PB_ERR_MAX];
	if (rep->status || !pb_best(rep))
		return;
	if (cfg->gantt) {
		for (unsigned i = 0; i < rep->nres; i++)
			if (res[i].mb_rows == cfg->batch)
				rep->single = &res[i];
		if (!rep->single) {
			if (prepare_size(b, cfg->batch, false, err, sizeof(err)) ||
			    pb_measure(b, cfg->batch, 1, 1, 0, NULL, single)) {
				rep->status = PB_EXIT_FAIL;
				snprintf(rep->error, sizeof(rep->error), "whole batch: %.200s",
					 single->status ? single->error : err);
			}
			rep->single = single;
		}
	}
	if (rep->status == 0 && cfg->trace_path) {
		uint32_t m = pb_best(rep)->mb_rows;
		if (prepare_size(b, m, false, err, sizeof(err)) ||
		    pb_measure(b, m, 1, 2, 0, cfg->trace_path, traced)) {
			rep->status = PB_EXIT_FAIL;
			snprintf(rep->error, sizeof(rep->error), "trace run: %.200s",
				 traced->status ? traced->error : err);
		}
	}
}

static void print_report(pb_report *rep)
{
	const pb_config *cfg = rep->cfg;
	switch (cfg->format) {
	case PB_FMT_JSON:
		if (pb_print_json(stdout, rep))
			rep->status = PB_EXIT_FAIL;
		break;
	case PB_FMT_CSV:
		pb_print_csv(stdout, rep);
		break;
	case PB_FMT_TABLE:
		pb_print_table(stdout, rep);
		if (cfg->gantt && pb_best(rep)) {
			const pb_result *best = pb_best(rep);
			pb_gantt_print(stdout, &best->tl,
				       rep->single && rep->single != best ? &rep->single->tl : NULL,
				       terminal_width());
		}
		if (cfg->trace_path && rep->status == 0)
			printf("\ntrace of m=%u written to %s (open it in Perfetto or chrome://tracing)\n",
			       pb_best(rep)->mb_rows, cfg->trace_path);
		break;
	}
}

int main(int argc, char **argv)
{
	pb_config cfg;
	char err[PB_ERR_MAX];
	unsigned allowed = 0;
	pb_workload *w = NULL;
	pb_bench b;
	pb_result *res = NULL, single, traced;
	pb_report rep;
	int rc;

	rc = pb_options_parse(&cfg, argc, argv, err, sizeof(err));
	if (rc < 0)
		return usage_error(err);
	if (rc > 0)
		return PB_EXIT_OK;
	const char *env = getenv("MBPIPE_OPTS");
	if (env) {
		mbp_opts o;
		size_t pos = 0;
		mbp_opts_init(&o);
		if (mbp_opts_parse(&o, env, &pos)) {
			snprintf(err, sizeof(err), "MBPIPE_OPTS: %s (at '%.*s')", mbp_opts_rule(env + pos),
				 (int)strcspn(env + pos, ","), env + pos);
			return usage_error(err);
		}
	}
	int ncpus = pb_cpus_resolve(&cfg, &allowed, err, sizeof(err));
	if (ncpus < 0)
		return usage_error(err);
	if (cfg.stages == 0 && cfg.workload == PB_WL_SYNTHETIC)
		cfg.stages = ncpus < PB_DEF_MAX_STAGES ? (unsigned)ncpus : PB_DEF_MAX_STAGES;
	if (cfg.batch == 0)
		cfg.batch = cfg.workload == PB_WL_MLP ? PB_DEF_BATCH_MLP : PB_DEF_BATCH_SYNTHETIC;
	if (pb_sizes_resolve(&cfg, err, sizeof(err)))
		return usage_error(err);

	pb_progress_init(cfg.progress);
	rc = cfg.workload == PB_WL_MLP ? pb_mlp_new(&w, &cfg, err, sizeof(err))
				       : pb_synthetic_new(&w, &cfg, err, sizeof(err));
	if (rc == PB_EXIT_USAGE)
		return usage_error(err);
	if (rc) {
		fprintf(stderr, "pipebench: %s\n", err);
		return PB_EXIT_FAIL;
	}
	cfg.stages = w->stages;

	if (pb_bench_init(&b, &cfg, w, (unsigned)ncpus, allowed, err, sizeof(err))) {
		fprintf(stderr, "pipebench: %s\n", err);
		w->destroy(w);
		return PB_EXIT_FAIL;
	}
	res = calloc(cfg.nsizes, sizeof(*res));
	if (!res) {
		fprintf(stderr, "pipebench: out of memory\n");
		return PB_EXIT_FAIL;
	}
	memset(&single, 0, sizeof(single));
	memset(&traced, 0, sizeof(traced));
	memset(&rep, 0, sizeof(rep));
	rep.cfg = &cfg;
	rep.w = w;
	rep.b = &b;
	rep.res = res;
	b.total_units =
	    (uint64_t)cfg.nsizes * (cfg.warmup + cfg.baseline_runs + (cfg.duration_s > 0 ? 0 : cfg.batches));

	sweep(&b, res, &rep);
	measure_extras(&b, res, &single, &traced, &rep);
	pb_progress_end();
	b.load_end = pb_loadavg();
	print_report(&rep);
	fflush(stdout);
	if (rep.status)
		fprintf(stderr, "pipebench: FAILED: %s\n", rep.error);

	for (unsigned i = 0; i < cfg.nsizes; i++)
		pb_result_fini(&res[i]);
	pb_result_fini(&single);
	pb_result_fini(&traced);
	free(res);
	pb_bench_fini(&b);
	w->destroy(w);
	return rep.status ? PB_EXIT_FAIL : PB_EXIT_OK;
}

/*
 * pipebench: the throughput tool of mbpipe.
 *
 * Check the output paths, wait for other processes to leave the CPUs (at most --wait-quiet seconds), make
 * a pipeline for every micro-batch size of the sweep, then measure them and the sequential baseline (the
 * same stages in order on one thread) interleaved, a few batches per visit, round after round, until the
 * intervals of the medians are within the tolerance or the time budget is spent; check every output.
 * Then check each result's figures against each other, choose the size, measure the whole batch as one
 * unit for the Gantt chart if the sweep did not, write the trace of the chosen size if asked, and print
 * the report. See pipebench.h for the files and pipebench.1 for the user's view.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipebench.h"
#include "util/mpirank.h"

#define PB_DEF_BATCH_MLP       256
#define PB_DEF_BATCH_SYNTHETIC 64
#define PB_DEF_MAX_STAGES      4
#define PB_VISIT_S	       0.02 /* measured time per visit to a size */

/* Every size and the baseline as arms of one interleaved schedule. `arms` (nsizes + 1) outlives the
 * report: the results point at their samples. A failure goes into rep; every size is closed either way. */
static void sweep(pb_bench *b, pb_result *res, pb_arm *arms, pb_report *rep)
{
	const pb_config *cfg = b->cfg;
	pb_workload *w = b->w;
	const unsigned n = cfg->nsizes;
	pb_cand *cand[PB_MAX_SIZES] = {0};
	static char labels[PB_MAX_SIZES][24];
	char err[PB_ERR_MAX];

	/* before preparing: the mlp profiles its layers at every size to split them */
	pb_noise_settle(&b->noise, cfg->wait_quiet_s);
	b->load_start = pb_loadavg();
	rep->nres = n;
	for (unsigned i = 0; i < n; i++) {
		snprintf(labels[i], sizeof(labels[i]), "m=%u", cfg->sizes[i]);
		pb_progress(i, n, "preparing");
		if (pb_cand_open(b, cfg->sizes[i], false, &cand[i], &res[i])) {
			rep->status = PB_EXIT_FAIL;
			snprintf(rep->error, sizeof(rep->error), "m=%u: %.200s", cfg->sizes[i], res[i].error);
			goto close;
		}
		arms[i + 1] = (pb_arm){.label = labels[i], .ctx = cand[i], .visit = pb_cand_visit};
	}
	/* the baseline runs stages of its own over the whole batch: a size's are in use by its pipeline (the
	 * mlp's stages keep their scratch buffers from init to fini) */
	if (w->prepare) {
		if (w->prepare(w, cfg->batch, b->base.desc, &b->base_inst, err, sizeof(err))) {
			rep->status = PB_EXIT_FAIL;
			snprintf(rep->error, sizeof(rep->error), "baseline: %.200s", err);
			goto close;
		}
	} else {
		memcpy(b->base.desc, w->desc_of, sizeof(b->base.desc));
	}
	if (w->reference) {
		if (w->reference(w, b->in, b->base.ref, cfg->batch, cfg->batch, err, sizeof(err))) {
			rep->status = PB_EXIT_FAIL;
			snprintf(rep->error, sizeof(rep->error), "%s", err);
			goto close;
		}
		b->base_ref_ok = true;
	}
	arms[0] = (pb_arm){.label = "baseline", .ctx = b, .visit = pb_baseline_visit};
	pb_schedule sch = {.min_repeats = cfg->batches,
			   .tolerance = cfg->tolerance,
			   .budget_s = cfg->duration_s,
			   .warmup = cfg->warmup,
			   .visit_s = PB_VISIT_S,
			   .pause_s = cfg->wait_quiet_s - b->noise.waited_s};
	if (pb_interleave(arms, n + 1, &sch, &b->noise, err, sizeof(err))) {
		rep->status = PB_EXIT_FAIL;
		snprintf(rep->error, sizeof(rep->error), "%s", err);
	}
close:
	for (unsigned i = 0; i < n; i++)
		if (cand[i] && pb_cand_close(cand[i], &arms[i + 1], NULL) && rep->status == 0) {
			rep->status = PB_EXIT_FAIL;
			snprintf(rep->error, sizeof(rep->error), "m=%u: %.200s", cfg->sizes[i], res[i].error);
		}
	if (arms[0].n == 0)
		return;
	pb_baseline_sum(b, &arms[0]);
	const pb_baseline *base = &b->base;
	pb_check_input ci = {.cpus = b->ncpus, .base_loud = base->loud, .base_ms = base->median_ms};
	for (unsigned i = 0; i < n; i++) {
		pb_result *r = &res[i];
		if (r->batches == 0 || base->thr.median <= 0)
			continue;
		r->speedup = r->thr.median / base->thr.median;
		r->speedup_lo = base->thr.hi > 0 ? r->thr.lo / base->thr.hi : 0;
		r->speedup_hi = base->thr.lo > 0 ? r->thr.hi / base->thr.lo : 0;
		pb_check(r, &ci);
	}
	pb_choose(res, n, cfg->latency_target_ms, PB_TIE_MARGIN, &rep->choice);
}

/* A short run of size m outside the schedule: `warm` unmeasured batches, then `batches` measured. */
static int run_once(pb_bench *b, uint32_t m, unsigned batches, const char *trace_path, pb_result *r)
{
	pb_cand *c = NULL;
	double rate;
	char err[PB_ERR_MAX];
	if (pb_cand_open(b, m, trace_path != NULL, &c, r) == 0)
		(void)pb_cand_visit(c, 1, batches, &rate, err, sizeof(err));
	return pb_cand_close(c, NULL, trace_path);
}

/* After the sweep: the whole batch as one unit for the Gantt chart, unless the sweep measured it; and the
 * trace of the chosen size, a short run of its own with the activity log on. */
static void measure_extras(pb_bench *b, pb_result *res, pb_result *single, pb_result *traced, pb_report *rep)
{
	const pb_config *cfg = b->cfg;
	if (rep->status || !pb_best(rep))
		return;
	if (cfg->gantt || cfg->svg_path) {
		for (unsigned i = 0; i < rep->nres; i++)
			if (res[i].mb_rows == cfg->batch)
				rep->single = &res[i];
		if (!rep->single) {
			if (run_once(b, cfg->batch, 1, NULL, single)) {
				rep->status = PB_EXIT_FAIL;
				snprintf(rep->error, sizeof(rep->error), "whole batch: %.200s",
					 single->error);
			}
			rep->single = single;
		}
	}
	if (rep->status == 0 && cfg->trace_path &&
	    run_once(b, pb_best(rep)->mb_rows, 2, cfg->trace_path, traced)) {
		rep->status = PB_EXIT_FAIL;
		snprintf(rep->error, sizeof(rep->error), "trace run: %.200s", traced->error);
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
				       pb_terminal_width());
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
	pb_arm *arms = NULL;
	pb_report rep;
	int rc;

	rc = pb_options_parse(&cfg, argc, argv, err, sizeof(err));
	if (rc < 0)
		return pb_usage("%s", err);
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
			return pb_usage("%s", err);
		}
	}
	int ncpus = pb_cpus_resolve(&cfg, &allowed, err, sizeof(err));
	if (ncpus < 0)
		return pb_usage("%s", err);
	/* Before the measurements, not after them; under mpirun both are refused (mpi.c), and every rank
	 * trying the same path at once would race. */
	if (cfg.svg_path && !mbt_mpi_launched() && pb_output_check("--svg", cfg.svg_path, err, sizeof(err)))
		return pb_usage("%s", err);
	if (cfg.workload == PB_WL_TRAIN) {
		if (mbt_mpi_launched())
			return pb_usage("--workload=train does not run under mpirun (one process: its "
					"stages are threads)");
		if (cfg.plan_auto)
			return pb_train_plan_main(&cfg, (unsigned)ncpus);
		return pb_train_main(&cfg, (unsigned)ncpus, allowed);
	}
	const bool stages_default = cfg.stages == 0; /* under mpirun: one stage per rank */
	if (cfg.stages == 0 && cfg.workload == PB_WL_SYNTHETIC)
		cfg.stages = ncpus < PB_DEF_MAX_STAGES ? (unsigned)ncpus : PB_DEF_MAX_STAGES;
	if (cfg.batch == 0)
		cfg.batch = cfg.workload == PB_WL_MLP ? PB_DEF_BATCH_MLP : PB_DEF_BATCH_SYNTHETIC;
	if (pb_sizes_resolve(&cfg, err, sizeof(err)))
		return pb_usage("%s", err);
	if (cfg.trace_path && !mbt_mpi_launched() &&
	    pb_output_check("--trace", cfg.trace_path, err, sizeof(err)))
		return pb_usage("%s", err);
	if (mbt_mpi_launched() && cfg.rebalance)
		return pb_usage(
		    "--rebalance does not run under mpirun (a rank's layers are the ones it loaded)");
	if (mbt_mpi_launched()) { /* stages spread over the ranks (mpi.c) */
#ifdef PB_WITH_MPI
		pb_progress_init(cfg.progress);
		return pb_mpi_main(&cfg, stages_default, &argc, &argv);
#else
		(void)stages_default;
		return pb_usage("started by mpirun, but this pipebench was built without MPI (configure "
				"--with-mpi)");
#endif
	}

	pb_progress_init(cfg.progress);
	rc = cfg.workload == PB_WL_MLP ? pb_mlp_new(&w, &cfg, err, sizeof(err))
				       : pb_synthetic_new(&w, &cfg, err, sizeof(err));
	if (rc == PB_EXIT_USAGE)
		return pb_usage("%s", err);
	if (rc)
		return pb_failure("%s", err);
	cfg.stages = w->stages;

	if (pb_bench_init(&b, &cfg, w, (unsigned)ncpus, allowed, err, sizeof(err))) {
		w->destroy(w);
		return pb_failure("%s", err);
	}
	res = calloc(cfg.nsizes, sizeof(*res));
	arms = calloc(cfg.nsizes + 1, sizeof(*arms));
	if (!res || !arms)
		return pb_failure("out of memory");
	memset(&single, 0, sizeof(single));
	memset(&traced, 0, sizeof(traced));
	memset(&rep, 0, sizeof(rep));
	rep.cfg = &cfg;
	rep.w = w;
	rep.b = &b;
	rep.res = res;
	sweep(&b, res, arms, &rep);
	measure_extras(&b, res, &single, &traced, &rep);
	pb_progress_end();
	b.load_end = pb_loadavg();
	/* the picture first: its failure is the run's, in the report too */
	if (cfg.svg_path && rep.status == 0 && pb_best(&rep)) {
		const pb_result *best = pb_best(&rep);
		if (pb_gantt_svg(cfg.svg_path, &best->tl,
				 rep.single && rep.single != best ? &rep.single->tl : NULL, err,
				 sizeof(err))) {
			rep.status = PB_EXIT_FAIL;
			snprintf(rep.error, sizeof(rep.error), "%s", err);
		}
	}
	print_report(&rep);
	fflush(stdout);
	if (rep.status)
		pb_failure("FAILED: %s", rep.error);

	for (unsigned i = 0; i < cfg.nsizes; i++)
		pb_result_fini(&res[i]);
	pb_result_fini(&single);
	pb_result_fini(&traced);
	free(res);
	for (unsigned i = 0; i <= cfg.nsizes; i++)
		pb_arm_fini(&arms[i]);
	free(arms);
	pb_bench_fini(&b);
	w->destroy(w);
	return rep.status ? PB_EXIT_FAIL : PB_EXIT_OK;
}

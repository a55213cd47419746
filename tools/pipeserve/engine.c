/*
 * The engine behind the batcher: see engine.h.
 *
 * Options come in layers, later ones winning: mbpipe's defaults, the pinning this process wants (none
 * under mpirun, or where --rebalance-replicas makes more threads than CPUs: the plan would pin two active
 * threads to one CPU and the OS could not move either), the
 * MBPIPE_OPTS environment variable (the one pipebench reads), --engine, and last what the served model
 * fixes (its input row width, and --max-batch-rows as the micro-batch size). Both strings were checked
 * with the flags, so a failure here is not expected. The batcher keeps at most --max-inflight micro-batches
 * in the pipeline, by default two per thread made (every rank's stages under mpirun): with
 * --rebalance-replicas those a move may turn on, not only the plan's active at start.
 */
#include "config.h"

#include "engine.h"

#include <stdlib.h>
#include <string.h>

#ifdef PS_WITH_MPI
#include "mpi.h"
#endif

int ps_engine_opts(ps_server *s, mbp_opts *op, mbp_stage_desc *d, unsigned *n)
{
	*n = mbp_model_stages_count(s->stages);
	unsigned threads = 0;
	for (unsigned i = 0; i < *n; i++) {
		int rc = mbp_model_stage_desc(s->stages, i, &d[i]);
		if (rc)
			return rc;
		threads += d[i].replicas ? d[i].replicas : 1;
	}
	int ncpu = mbp_cpus_allowed(NULL, 0, NULL);
	mbp_opts o;
	mbp_opts_init(&o);
	o.pinning = s->mpi || (s->cfg.rebalance_replicas && ncpu > 0 && threads > (unsigned)ncpu)
			? MBP_PIN_NONE
			: MBP_PIN_PLAN;
	char err[512];
	if (ps_flags_engine_opts(&o, "MBPIPE_OPTS", getenv("MBPIPE_OPTS"), err, sizeof err) ||
	    ps_flags_engine_opts(&o, "--engine", s->cfg.mbp_conf, err, sizeof err)) {
		ps_log("%s", err);
		return -EINVAL;
	}
	o.in_row_bytes = (size_t)mbp_model_in_width(s->model) * sizeof(float);
	o.max_mb_rows = s->cfg.max_batch_rows;
	*op = o;
	return 0;
}

unsigned ps_engine_threads(const ps_server *s, unsigned nst)
{
	if (s->mpi)
		return s->all_stages;
	/* the threads made (the descriptors' replicas): the plan's, or --rebalance-replicas' where more,
	 * since a move may turn every one of them on */
	unsigned t = 0;
	for (unsigned i = 0; i < nst; i++) {
		mbp_stage_desc d;
		t += mbp_model_stage_desc(s->stages, i, &d) == 0 && d.replicas ? d.replicas : 1;
	}
	return t > nst ? t : nst;
}

int ps_engine_start(ps_server *s)
{
	mbp_opts o;
	mbp_stage_desc d[MBP_MAX_STAGES];
	unsigned nst;
	int rc = ps_engine_opts(s, &o, d, &nst);
	if (rc)
		return rc;
	unsigned all = ps_engine_threads(s, nst); /* micro-batches in flight: 2 per thread, all ranks' */
	ps_batcher_cfg bc = {.max_batch_rows = s->cfg.max_batch_rows,
			     .max_delay_ns = s->cfg.max_queue_delay_us * 1000,
			     .max_queue_rows = s->cfg.max_queue_rows,
			     .timeout_ns = s->cfg.timeout_ms * 1000000,
			     .out_row_bytes = s->info.out_width * sizeof(float),
			     .max_inflight = s->cfg.max_inflight ? s->cfg.max_inflight : 2 * all,
			     .model = s->model,
			     .stages = s->mpi ? NULL : s->stages};
#ifdef PS_WITH_MPI
	if (s->mpi)
		bc.engine = ps_mpi_engine();
#endif
	rc = ps_batcher_new(&s->batcher, &bc, &o, d, nst, &s->metrics);
	if (rc)
		ps_say("cannot start the pipeline: %s", mbp_strerror(rc));
	return rc;
}

void ps_engine_log_placement(ps_server *s)
{
	mbp_pipeline *p = ps_batcher_pipeline(s->batcher);
	mbp_placement pl[MBP_MAX_STAGES];
	mbp_stage_stats ss[MBP_MAX_STAGES];
	int n = mbp_pipeline_placement(p, pl, MBP_MAX_STAGES);
	mbp_pipeline_stats ps;
	int ns = mbp_pipeline_stats_get(p, &ps, ss, MBP_MAX_STAGES);
	for (int i = 0; i < n && i < MBP_MAX_STAGES; i++) {
		const char *name = i < ns ? ss[i].name : "?";
		if (pl[i].pin_error)
			ps_log("placement: stage %d (%s) -> thread %u, unpinned (pinning failed: %s)", i,
			       name, pl[i].thread, mbp_strerror(pl[i].pin_error));
		else if (pl[i].cpu < 0)
			ps_log("placement: stage %d (%s) -> thread %u, not pinned", i, name, pl[i].thread);
		else if (pl[i].sharing)
			ps_log("placement: stage %d (%s) -> thread %u, cpu %d, shared with %u other threads "
			       "or ranks",
			       i, name, pl[i].thread, pl[i].cpu, pl[i].sharing);
		else
			ps_log("placement: stage %d (%s) -> thread %u, cpu %d", i, name, pl[i].thread,
			       pl[i].cpu);
	}
	char text[4096]; /* the replicated stages, each replica's CPU: "stage 1 (layer 3) x2 -> CPUs 1,2" */
	if (s->mpi || mbp_model_plan_placement(&s->plan, p, text, sizeof text) < 0)
		return;
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		if (strstr(line, ") x"))
			ps_log("placement: %s", line);
}

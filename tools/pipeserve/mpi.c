/*
 * pipeserve under mpirun: the model's stages run on several ranks (libmbpipe-mpi, <mbpipe/mpi.h>).
 *
 * Every rank parses the same command line and loads only its stages' layers (util/mpirank.h: S stages,
 * one per rank by default, split by layer count, contiguous ranges with rank 0 the first). Rank 0 serves
 * HTTP: its batcher feeds the pipeline across the ranks through the engine below (mbp_mpi_mb_acquire /
 * _submit, results on the communication thread) exactly as it feeds a local pipeline. The other ranks run
 * their stages (ps_mpi_serve) until rank 0 ends the run: its shutdown drains the pipeline across the
 * ranks (mbp_mpi_drain), which ends every rank's wait, and every rank exits 0. The rank 0 /metrics and
 * the start-up log show rank 0's own stages.
 */
#include "config.h"

#include "mpi.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <mbpipe/mpi.h>

#include "util/mpirank.h"
#include "util/mpiutil.h"
#include "util/plural.h"

static mbp_mpi *g_mp; /* this process's part of the pipeline across the ranks */

int ps_mpi_init(int *argc, char ***argv, ps_server *s)
{
	int rc = mbp_mpi_init(argc, argv);
	if (rc)
		return rc;
	s->mpi = true;
	s->rank = (unsigned)mbp_mpi_rank();
	s->ranks = (unsigned)mbp_mpi_size();
	return 0;
}

int ps_mpi_load(ps_server *s, const char *path)
{
	mbp_model_error e;
	uint32_t out_width = 0;
	int rc = mbt_file_layers(path, &s->all_layers, &out_width, &e);
	if (rc) { /* every rank reads the same path: rank 0 says it */
		if (s->rank == 0)
			ps_say("--model: %s", e.msg[0] ? e.msg : mbp_strerror(rc));
		return rc == -ENOMEM || rc == -EIO ? rc : PS_EUSAGE;
	}
	unsigned S = ps_flags_stages(&s->cfg, s->all_layers, s->ranks); /* as in one process */
	if (!S)
		return PS_EUSAGE;
	if (S < s->ranks) {
		if (s->rank == 0)
			ps_say("%u %s (the model has %u %s) over %u ranks: every rank needs a stage", S,
			       PLURAL(S, "stage", "stages"), s->all_layers,
			       PLURAL(s->all_layers, "layer", "layers"), s->ranks);
		return PS_EUSAGE;
	}
	rc = mbt_load_part(path, s->all_layers, S, s->ranks, s->rank, &s->model, &s->plan, &s->first_layer,
			   &e);
	if (rc) {
		ps_log("rank %u: cannot load its layers of the model: %s", s->rank,
		       e.msg[0] ? e.msg : mbp_strerror(rc));
		return rc;
	}
	s->all_stages = S;
	mbt_rank_stages(S, s->ranks, s->rank, &s->stage_lo, &s->stage_hi);
	s->out_width = out_width;
	return 0;
}

int ps_mpi_agree(int status)
{
	int v = status;
	int rc = mbp_mpi_exec(mbt_mpi_agree_max, &v);
	return rc ? 1 : v;
}

/* ---- rank 0's engine ---- */

static int start_part(const mbp_opts *o, const mbp_stage_desc *stages, unsigned n)
{
	int rc = mbp_mpi_new(&g_mp, o, NULL);
	for (unsigned i = 0; !rc && i < n; i++)
		rc = mbp_mpi_add_stage(g_mp, &stages[i]);
	/* start is collective: the other ranks wait in it, so it is called even after a local error */
	int src = g_mp ? mbp_mpi_start(g_mp) : rc;
	rc = rc ? rc : src;
	if (rc)
		ps_log("rank %d: cannot start the pipeline across the ranks: %s%s%s", mbp_mpi_rank(),
		       mbp_strerror(rc), g_mp && *mbp_mpi_error(g_mp) ? ": " : "",
		       g_mp ? mbp_mpi_error(g_mp) : "");
	return rc;
}

static int eng_start(void *ctx, const mbp_opts *o, const mbp_stage_desc *stages, unsigned n)
{
	(void)ctx;
	return start_part(o, stages, n);
}

static int eng_acquire(void *ctx, mbp_mb **mb, int64_t timeout_ns)
{
	(void)ctx;
	return mbp_mpi_mb_acquire(g_mp, mb, timeout_ns);
}

static int eng_submit(void *ctx, mbp_mb *mb, int64_t timeout_ns)
{
	(void)ctx;
	return mbp_mpi_mb_submit(g_mp, mb, timeout_ns);
}

static void eng_release(void *ctx, mbp_mb *mb)
{
	(void)ctx;
	mbp_mpi_mb_release(g_mp, mb);
}

static int eng_drain(void *ctx, int64_t timeout_ns)
{
	(void)ctx;
	int rc = mbp_mpi_drain(g_mp, timeout_ns);
	if (rc && rc != -ETIMEDOUT)
		ps_log("draining the pipeline across the ranks: %s %s", mbp_strerror(rc),
		       mbp_mpi_error(g_mp));
	return rc == -ETIMEDOUT && *mbp_mpi_error(g_mp) ? -EIO : rc;
}

static void eng_destroy(void *ctx)
{
	(void)ctx;
	mbp_mpi_destroy(g_mp);
	g_mp = NULL;
}

static mbp_pipeline *eng_pipeline(void *ctx)
{
	(void)ctx;
	return g_mp ? mbp_mpi_pipeline(g_mp) : NULL;
}

const ps_engine *ps_mpi_engine(void)
{
	static const ps_engine e = {.start = eng_start,
				    .acquire = eng_acquire,
				    .submit = eng_submit,
				    .release = eng_release,
				    .drain = eng_drain,
				    .destroy = eng_destroy,
				    .pipeline = eng_pipeline};
	return &e;
}

/* ---- the other ranks ---- */

int ps_mpi_serve(ps_server *s, const mbp_opts *o, const mbp_stage_desc *stages, unsigned n)
{
	int rc = start_part(o, stages, n);
	if (!rc) {
		ps_log("rank %u: serving stages %u-%u of %u (layers %u-%u of %u)", s->rank, s->stage_lo,
		       s->stage_hi - 1, s->all_stages, s->first_layer,
		       s->first_layer + mbp_model_layers(s->model) - 1, s->all_layers);
		rc = mbp_mpi_wait(g_mp, -1);
		if (rc == -ECANCELED)
			rc = 0;
		if (rc)
			ps_log("rank %u: the run ended with an error: %s %s", s->rank, mbp_strerror(rc),
			       mbp_mpi_error(g_mp));
	}
	mbp_mpi_stats st;
	if (g_mp && mbp_mpi_stats_get(g_mp, &st) == 0)
		ps_log("rank %u: stopped: %llu micro-batches completed, %llu failed", s->rank,
		       (unsigned long long)st.rank[s->rank].mbs_completed,
		       (unsigned long long)st.rank[s->rank].mbs_failed);
	mbp_mpi_destroy(g_mp);
	g_mp = NULL;
	return rc;
}

void ps_mpi_finalize(void)
{
	mbp_mpi_finalize();
}

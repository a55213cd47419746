/*
 * pipebench under mpirun: the ranks' protocol, the stages spread over the ranks (libmbpipe-mpi,
 * <mbpipe/mpi.h>). The stages are stamped by measure.c's wrapper (pb_stamp) and the figures printed by
 * output.c (pb_print_mpi_table, pb_print_mpi_json); what is here is the runs across the ranks and their
 * sums.
 *
 * main.c comes here when an MPI launcher started the process (mbt_mpi_launched()). Every rank parses the
 * same command line; rank r runs a contiguous range of the S stages (rank 0 the first ones, the first
 * S mod R ranks one more; S defaults to R), and with the mlp each rank loads only its stages' layers
 * (mbp_model_load_layers; a generated model is written by every rank itself, from the same seed). Rank 0
 * measures and reports; the other ranks serve.
 *
 * A visit to a micro-batch size is one run across the ranks: rank 0 broadcasts the size and the number
 * of batches, every rank makes its part (mbp_mpi_new, its stages stamped, mbp_mpi_start), rank 0 submits the batches one at a time (a job each, waited for and checked: the
 * synthetic workload recomputes its stamps, the mlp's output must be the same bit for bit in every batch
 * of a size and have no row left unwritten), then drains, which ends the run on every rank; the ranks then
 * send rank 0 their stamps. The sizes are visited in turn by the schedule of the single-process tool
 * (interleave.c, with its noise watch on rank 0's CPUs). There is no sequential baseline here: compare
 * with pipebench in one process (perf/results/mpi.md does).
 *
 * The link's share of a hop (from rank r's last stage to rank r+1's first): per micro-batch, the time the
 * next stage waited for it beyond the later of (a) its leaving rank r and (b) that stage finishing the
 * micro-batch before: the link's exposed time (the wire, both communication threads, a wait for credit),
 * zero when the transfer hid behind compute. Against the stage compute per micro-batch (the slowest
 * stage's mean time inside its function): share = link / (link + compute). Other ranks' clocks are
 * brought onto rank 0's by a ping-pong before measuring (their offset: about 0 on one machine).
 *
 * MPI calls are made on the communication thread (mbp_mpi_exec) and wait by polling with short sleeps, so
 * that a rank waiting for the next visit does not spin a core the measured one needs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <mpi.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

#include "pipebench.h"
#include "util/mpirank.h"
#include "util/mpiutil.h"
#include "util/parse.h"
#include "util/plural.h"

#define VISIT_S	       0.05 /* measured time per visit: a run's set-up costs a few ms */
#define JOB_TIMEOUT_NS (120 * INT64_C(1000000000))
#define TAG_STAMPS     7001
#define TAG_CLOCK      7002
#define MAX_STAMPS     (1u << 20) /* micro-batches stamped per visit, at most */

enum { CMD_RUN = 1, CMD_STOP = 2 };

typedef struct pm_cmd {
	int32_t op;
	uint32_t mb_rows, warm, units;
} pm_cmd;

/* One hop's figures over the measured batches of a size. */
typedef struct pm_hop {
	double link_ns, n; /* summed exposed link time, micro-batches */
} pm_hop;

/* A size: its samples and figures, on rank 0. */
typedef struct pm_size {
	struct pm *pm;
	uint32_t mb_rows, mbs;
	char label[24];
	double *lat; /* measured batch latencies, ns */
	size_t nlat, cap;
	double busy_ns[MBP_MAX_STAGES], busy_n[MBP_MAX_STAGES]; /* time inside each stage, micro-batches */
	pm_hop hop[MBP_MAX_STAGES];
	void *ref; /* mlp: the first output at this size */
	bool have_ref;
	mbp_mpi_stats st; /* of the last visit */
	pb_interval thr;
} pm_size;

typedef struct pm {
	pb_config *cfg;
	unsigned rank, ranks, S, lo, hi;
	pb_workload *w; /* synthetic: every stage's descriptor (this rank runs [lo, hi)) */
	mbp_model *part;
	mbp_model_stages *mst;
	char desc[240];
	size_t in_rb, out_rb, my_in_rb; /* the pipeline's input and output rows; this rank's input rows */
	void *in, *out;
	int64_t offset[MBP_MAX_STAGES]; /* rank 0: each rank's clock minus rank 0's */
	pm_size *sizes;
} pm;

/* ---- MPI on the communication thread ---- */

static int bcast_task(void *arg)
{
	MPI_Request rq;
	MPI_Ibcast(arg, sizeof(pm_cmd), MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
	mbt_mpi_wait_req(&rq);
	return 0;
}

struct gather {
	pm *pm;
	uint64_t *all;	      /* rank 0: [S][n][2] */
	const uint64_t *mine; /* [hi - lo][n][2] */
	size_t n;
};

static int gather_task(void *arg)
{
	struct gather *g = arg;
	pm *p = g->pm;
	size_t words = 2 * g->n;
	if (p->rank != 0) {
		MPI_Request rq;
		MPI_Isend(g->mine, (int)((p->hi - p->lo) * words), MPI_UINT64_T, 0, TAG_STAMPS,
			  MPI_COMM_WORLD, &rq);
		mbt_mpi_wait_req(&rq);
		return 0;
	}
	memcpy(g->all, g->mine, (p->hi - p->lo) * words * sizeof(uint64_t));
	for (unsigned r = 1; r < p->ranks; r++) {
		unsigned lo, hi;
		mbt_rank_stages(p->S, p->ranks, r, &lo, &hi);
		MPI_Request rq;
		MPI_Irecv(g->all + lo * words, (int)((hi - lo) * words), MPI_UINT64_T, (int)r, TAG_STAMPS,
			  MPI_COMM_WORLD, &rq);
		mbt_mpi_wait_req(&rq);
	}
	return 0;
}

/* Rank 0 pings every rank on another host a few times; the round trip with the least delay gives its
 * clock's offset. Ranks on rank 0's host share its CLOCK_MONOTONIC: offset 0. */
static int clock_task(void *arg)
{
	pm *p = arg;
	char host[MPI_MAX_PROCESSOR_NAME] = "", root[MPI_MAX_PROCESSOR_NAME] = "";
	int len = 0;
	MPI_Get_processor_name(host, &len);
	memcpy(root, host, sizeof(root));
	MPI_Bcast(root, sizeof(root), MPI_CHAR, 0, MPI_COMM_WORLD);
	int remote = strcmp(root, host) != 0;
	int flags[MBP_MAX_STAGES] = {0};
	MPI_Gather(&remote, 1, MPI_INT, flags, 1, MPI_INT, 0, MPI_COMM_WORLD);
	MPI_Bcast(flags, MBP_MAX_STAGES, MPI_INT, 0, MPI_COMM_WORLD);
	for (unsigned r = 1; r < p->ranks; r++) {
		uint64_t best = UINT64_MAX;
		for (int k = 0; flags[r] && k < 16; k++) {
			uint64_t t0 = mbt_now_ns(), tr = 0;
			if (p->rank == 0) {
				MPI_Send(&t0, 1, MPI_UINT64_T, (int)r, TAG_CLOCK, MPI_COMM_WORLD);
				MPI_Recv(&tr, 1, MPI_UINT64_T, (int)r, TAG_CLOCK, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				uint64_t t1 = mbt_now_ns();
				if (t1 - t0 < best) {
					best = t1 - t0;
					p->offset[r] = (int64_t)(tr - (t0 + (t1 - t0) / 2));
				}
			} else if (p->rank == r) {
				MPI_Recv(&t0, 1, MPI_UINT64_T, 0, TAG_CLOCK, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				tr = mbt_now_ns();
				MPI_Send(&tr, 1, MPI_UINT64_T, 0, TAG_CLOCK, MPI_COMM_WORLD);
			}
		}
	}
	return 0;
}

static int exec(int (*fn)(void *), void *arg)
{
	int rc = mbp_mpi_exec(fn, arg);
	if (rc)
		mbp_mpi_abort(pb_failure("rank %u: MPI: %s", (unsigned)mbp_mpi_rank(), mbp_strerror(rc)));
	return 0;
}

/* ---- one visit: a run across the ranks ---- */

/* Rank 0: check one batch's output. */
static int check_output(pm *p, pm_size *z, char *err, size_t errlen)
{
	const size_t bytes = (size_t)p->cfg->batch * p->out_rb;
	char why[PB_ERR_MAX] = "";
	if (p->w) {
		if (p->w->check(p->w, p->out, p->out, p->cfg->batch, why, sizeof(why)))
			return fail(err, errlen, "m=%u: wrong output: %s", z->mb_rows, why);
		return 0;
	}
	const float *o = p->out;
	for (size_t i = 0; i < bytes / sizeof(float); i++)
		if (isnan(o[i]))
			return fail(err, errlen, "m=%u: row %zu was never written (a micro-batch lost)",
				    z->mb_rows, i / (p->out_rb / sizeof(float)));
	if (!z->have_ref) {
		memcpy(z->ref, p->out, bytes);
		z->have_ref = true;
	} else if (memcmp(z->ref, p->out, bytes)) {
		return fail(err, errlen, "m=%u: a batch's output differs from the first one's", z->mb_rows);
	}
	return 0;
}

/* Rank 0: the batches of a visit. */
static int submit_batches(pm *p, mbp_mpi *mp, pm_size *z, const pm_cmd *c, double *ns, char *err,
			  size_t errlen)
{
	const pb_config *cfg = p->cfg;
	*ns = 0;
	for (unsigned b = 0; b < c->warm + c->units; b++) {
		mbp_job job;
		memset(p->out, 0xff, (size_t)cfg->batch * p->out_rb); /* NaN and impossible stamps */
		mbp_job_init(&job, p->in, p->out, cfg->batch, c->mb_rows);
		uint64_t t0 = mbt_now_ns();
		int rc = mbp_mpi_job_submit(mp, &job, -1);
		if (rc)
			return fail(err, errlen, "m=%u: submit failed: %s", c->mb_rows, mbp_strerror(rc));
		rc = mbp_mpi_job_wait(mp, &job, JOB_TIMEOUT_NS);
		uint64_t t1 = mbt_now_ns();
		if (rc)
			return fail(err, errlen, "m=%u: a batch did not complete in %.0f s: %s", c->mb_rows,
				    JOB_TIMEOUT_NS / 1e9, mbp_strerror(rc));
		if (job.status) {
			const char *why = p->w && p->w->stage_error ? p->w->stage_error(p->w) : NULL;
			return fail(err, errlen, "m=%u: a batch failed (%u of %u %s): %s%s%s", c->mb_rows,
				    job.mbs_failed, job.mbs, PLURAL(job.mbs, "micro-batch", "micro-batches"),
				    mbp_strerror(job.status), why ? ": " : "", why ? why : "");
		}
		if (check_output(p, z, err, errlen))
			return -1;
		if (b < c->warm)
			continue;
		*ns += (double)(t1 - t0);
		if (z->nlat == z->cap) {
			size_t cap = z->cap ? 2 * z->cap : 64;
			double *v = realloc(z->lat, cap * sizeof(*v));
			if (!v)
				return fail(err, errlen, "out of memory");
			z->lat = v;
			z->cap = cap;
		}
		z->lat[z->nlat++] = (double)(t1 - t0);
	}
	return 0;
}

/* Rank 0: add a visit's measured stamps (all ranks', on rank 0's clock) into the size's figures. */
static void add_stamps(pm *p, pm_size *z, const pm_cmd *c, const uint64_t *all, size_t n)
{
	const unsigned M = z->mbs;
	uint64_t *t = malloc(n * 2 * p->S * sizeof(*t));
	if (!t)
		return;
	for (unsigned s = 0; s < p->S; s++) {
		unsigned r = 0;
		for (unsigned q = 0; q < p->ranks; q++) {
			unsigned lo, hi;
			mbt_rank_stages(p->S, p->ranks, q, &lo, &hi);
			if (s >= lo && s < hi)
				r = q;
		}
		for (size_t k = 0; k < 2 * n; k++) {
			uint64_t v = all[s * 2 * n + k];
			t[s * 2 * n + k] = v == UINT64_MAX ? v : v - (uint64_t)p->offset[r];
		}
	}
	for (size_t k = (size_t)c->warm * M; k < n; k++)
		for (unsigned s = 0; s < p->S; s++) {
			const uint64_t *e = t + s * 2 * n + 2 * k;
			if (e[0] != UINT64_MAX && e[1] >= e[0]) {
				z->busy_ns[s] += (double)(e[1] - e[0]);
				z->busy_n[s]++;
			}
		}
	for (unsigned r = 0; r + 1 < p->ranks; r++) {
		unsigned lo, hi;
		mbt_rank_stages(p->S, p->ranks, r, &lo, &hi);
		const uint64_t *up = t + (hi - 1) * 2 * n, *down = t + hi * 2 * n;
		for (size_t k = (size_t)c->warm * M; k < n; k++) {
			if (up[2 * k + 1] == UINT64_MAX || down[2 * k] == UINT64_MAX)
				continue;
			/* ready: it left rank r and the next stage had finished the one before (of this batch) */
			uint64_t ready = up[2 * k + 1];
			if (k % M && down[2 * k - 1] != UINT64_MAX && down[2 * k - 1] > ready)
				ready = down[2 * k - 1];
			z->hop[r].link_ns += down[2 * k] > ready ? (double)(down[2 * k] - ready) : 0;
			z->hop[r].n++;
		}
	}
	free(t);
}

/* Every rank: one run at c->mb_rows. Rank 0 returns the measured rows per second in *rate. */
static int run(pm *p, const pm_cmd *c, double *rate, char *err, size_t errlen)
{
	pb_config *cfg = p->cfg;
	pm_size *z = NULL;
	if (p->rank == 0)
		for (unsigned i = 0; i < cfg->nsizes; i++)
			if (p->sizes[i].mb_rows == c->mb_rows)
				z = &p->sizes[i];
	const unsigned M = (cfg->batch + c->mb_rows - 1) / c->mb_rows, L = p->hi - p->lo;
	size_t n = (size_t)(c->warm + c->units) * M;
	if (n > MAX_STAMPS)
		n = MAX_STAMPS;
	uint64_t *mine = malloc(L * 2 * n * sizeof(uint64_t));
	uint64_t *all = p->rank == 0 ? malloc(p->S * 2 * n * sizeof(uint64_t)) : NULL;
	if (!mine || (p->rank == 0 && !all)) /* the ranks are in a collective run: end them all */
		mbp_mpi_abort(
		    pb_failure("rank %u: out of memory for the stamps of %zu micro-batches", p->rank, n));
	memset(mine, 0xff, L * 2 * n * sizeof(uint64_t));
	pb_stamp st[MBP_MAX_STAGES];
	mbp_mpi *mp = NULL;

	mbp_opts o;
	mbp_opts_init(&o);
	o.pinning = MBP_PIN_NONE; /* ranks on one machine would pin their stages onto the same CPUs */
	const char *env = getenv("MBPIPE_OPTS");
	if (env)
		(void)mbp_opts_parse(&o, env, NULL); /* validated by main */
	if (cfg->engine_opts)
		(void)mbp_opts_parse(&o, cfg->engine_opts, NULL);
	o.in_row_bytes = p->my_in_rb;
	o.max_mb_rows = c->mb_rows;
	o.spin_ns = pb_spin_ns(cfg, o.spin_ns);
	int rc = mbp_mpi_new(&mp, &o, NULL);
	for (unsigned i = 0; rc == 0 && i < L; i++) {
		mbp_stage_desc d;
		if (p->w)
			d = p->w->desc_of[p->lo + i];
		else if ((rc = mbp_model_stage_desc(p->mst, i, &d)))
			break;
		st[i] = (pb_stamp){.inner = d, .rec = mine + i * 2 * n, .cap = n, .seq_of = mbp_mpi_mb_seq};
		mbp_stage_desc w = pb_stamp_desc(&st[i]);
		rc = mbp_mpi_add_stage(mp, &w);
	}
	if (rc == 0 && p->w && p->w->reset)
		p->w->reset(p->w);
	/* every rank calls start, even after a local error: the others wait in it (it fails on all ranks) */
	int src = mp ? mbp_mpi_start(mp) : -EINVAL;
	if (rc == 0)
		rc = src;
	if (rc)
		fail(err, errlen, "m=%u: cannot start the pipeline across the ranks: %s%s%s", c->mb_rows,
		     mbp_strerror(rc), mp && *mbp_mpi_error(mp) ? ": " : "", mp ? mbp_mpi_error(mp) : "");
	double ns = 0;
	if (rc == 0 && p->rank == 0) {
		int drc;
		if (submit_batches(p, mp, z, c, &ns, err, errlen)) {
			rc = -EIO;
			drc = mbp_mpi_cancel(mp);
		} else {
			drc = mbp_mpi_drain(mp, JOB_TIMEOUT_NS);
		}
		if (drc && !rc) {
			rc = drc;
			fail(err, errlen, "m=%u: drain: %s %s", c->mb_rows, mbp_strerror(drc),
			     mbp_mpi_error(mp));
		}
		mbp_mpi_stats_get(mp, &z->st);
		if (!rc && z->st.mbs_accepted != z->st.mbs_completed + z->st.mbs_failed) {
			rc = -EIO;
			fail(err, errlen,
			     "m=%u: %" PRIu64 " micro-batches accepted, %" PRIu64 " completed, %" PRIu64
			     " failed",
			     c->mb_rows, z->st.mbs_accepted, z->st.mbs_completed, z->st.mbs_failed);
		}
	} else if (rc == 0) {
		int wrc = mbp_mpi_wait(mp, -1);
		if (wrc && wrc != -ECANCELED) {
			rc = wrc;
			fail(err, errlen, "rank %u: %s %s", p->rank, mbp_strerror(wrc), mbp_mpi_error(mp));
		}
	}
	mbp_mpi_destroy(mp);
	struct gather g = {.pm = p, .all = all, .mine = mine, .n = n};
	if (src == 0) /* a run that started on every rank: every rank gathers */
		exec(gather_task, &g);
	if (rc == 0 && p->rank == 0)
		add_stamps(p, z, c, all, n);
	free(mine);
	free(all);
	*rate = ns > 0 ? (double)cfg->batch * c->units / (ns / 1e9) : 0;
	return rc ? -1 : 0;
}

static int visit(void *ctx, unsigned warm, unsigned units, double *rate, char *err, size_t errlen)
{
	pm_size *z = ctx;
	pm_cmd c = {.op = CMD_RUN, .mb_rows = z->mb_rows, .warm = warm, .units = units};
	exec(bcast_task, &c);
	err[0] = '\0';
	return run(z->pm, &c, rate, err, errlen);
}

/* Ranks other than 0: serve runs until rank 0 says stop. */
static int serve(pm *p)
{
	int status = PB_EXIT_OK;
	for (;;) {
		pm_cmd c;
		exec(bcast_task, &c);
		if (c.op != CMD_RUN)
			return status;
		double rate;
		char err[PB_ERR_MAX] = "";
		if (run(p, &c, &rate, err, sizeof(err)))
			status = pb_failure("rank %u: %s", p->rank, err);
	}
}

/* ---- set-up ---- */

static void fill_mlp(float *x, size_t n)
{
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		x[i] = (float)((double)(s >> 40) / 16777216.0 * 2.0 - 1.0);
	}
}

/* The mlp: every rank writes the generated model itself (the same seed gives the same weights). */
static int setup_mlp(pm *p, char *path, size_t pathlen, bool *tmp, char *err, size_t errlen)
{
	pb_config *cfg = p->cfg;
	*tmp = false;
	if (cfg->model_path) {
		snprintf(path, pathlen, "%s", cfg->model_path);
	} else {
		const char *dir = getenv("TMPDIR");
		snprintf(path, pathlen, "%s/pipebench-mpi-XXXXXX", dir && *dir ? dir : "/tmp");
		int fd = mkstemp(path);
		if (fd < 0)
			return snprintf(err, errlen, "mlp: cannot create a temporary model file: %s",
					strerror(errno)),
			       PB_EXIT_FAIL;
		close(fd);
		*tmp = true;
		mbp_model_spec spec = {.layers = cfg->layers,
				       .in = cfg->hidden,
				       .hidden = cfg->hidden,
				       .out = cfg->hidden,
				       .act = MBP_ACT_RELU,
				       .dtype = MBP_DTYPE_F32,
				       .seed = cfg->seed};
		int rc = mbp_model_write_random(path, &spec);
		if (rc)
			return snprintf(err, errlen, "mlp: cannot write a random model: %s",
					mbp_strerror(rc)),
			       PB_EXIT_FAIL;
	}
	mbp_model_error e;
	unsigned layers = 0; /* set on success; zeroed for the compiler, which cannot see it */
	uint32_t out_w = 0;
	int rc = mbt_file_layers(path, &layers, &out_w, &e);
	if (rc)
		return snprintf(err, errlen, "%.200s", e.msg[0] ? e.msg : mbp_strerror(rc)), PB_EXIT_USAGE;
	if (p->S > layers)
		return snprintf(err, errlen, "%u stages but the model has %u %s: at most one stage per layer",
				p->S, layers, PLURAL(layers, "layer", "layers")),
		       PB_EXIT_USAGE;
	mbp_model_plan plan;
	unsigned first;
	rc = mbt_load_part(path, layers, p->S, p->ranks, p->rank, &p->part, &plan, &first, &e);
	if (rc)
		return snprintf(err, errlen, "%.200s", e.msg[0] ? e.msg : mbp_strerror(rc)), PB_EXIT_FAIL;
	rc = mbp_model_stages_new(&p->mst, p->part, &plan, cfg->sizes[cfg->nsizes - 1]);
	if (rc)
		return snprintf(err, errlen, "mlp: cannot make the stages: %s", mbp_strerror(rc)),
		       PB_EXIT_FAIL;
	p->my_in_rb = (size_t)mbp_model_in_width(p->part) * sizeof(float);
	p->out_rb = (size_t)out_w * sizeof(float);
	snprintf(p->desc, sizeof(p->desc), "mlp %s%.100s, %u %s, %u %s", cfg->model_path ? "" : "generated ",
		 cfg->model_path ? cfg->model_path : "(random weights)", layers,
		 PLURAL(layers, "layer", "layers"), p->S, PLURAL(p->S, "stage", "stages"));
	return 0;
}

/* ---- the report (rank 0; output.c prints it) ---- */

static double mean_of(double sum, double n)
{
	return n > 0 ? sum / n : 0;
}

static void fill_report(const pm *p, unsigned best, pb_mpi_row *rows, pb_mpi_report *rep)
{
	const pb_config *cfg = p->cfg;
	*rep = (pb_mpi_report){.cfg = cfg,
			       .desc = p->desc,
			       .ranks = p->ranks,
			       .stages = p->S,
			       .load = pb_loadavg(),
			       .rows = rows,
			       .best = best};
	for (unsigned r = 0; r < p->ranks; r++) {
		unsigned lo, hi;
		mbt_rank_stages(p->S, p->ranks, r, &lo, &hi);
		rep->first[r] = lo;
		rep->count[r] = hi - lo;
		rep->clock_offset_ns[r] = p->offset[r];
	}
	for (unsigned i = 0; i < cfg->nsizes; i++) {
		const pm_size *z = &p->sizes[i];
		pb_mpi_row *row = &rows[i];
		*row = (pb_mpi_row){.mb_rows = z->mb_rows,
				    .mbs = z->mbs,
				    .batches = (unsigned)z->nlat,
				    .thr = z->thr,
				    .p50_ms = pb_percentile(z->lat, (unsigned)z->nlat, 0.50) / 1e6,
				    .p99_ms = pb_percentile(z->lat, (unsigned)z->nlat, 0.99) / 1e6};
		for (unsigned s = 0; s < p->S; s++) {
			row->stage_us[s] = mean_of(z->busy_ns[s], z->busy_n[s]) / 1e3;
			row->compute_us = fmax(row->compute_us, row->stage_us[s]);
		}
		for (unsigned r = 0; r + 1 < p->ranks; r++)
			row->link_us[r] = mean_of(z->hop[r].link_ns, z->hop[r].n) / 1e3;
		for (unsigned r = 0; r < p->ranks && r < z->st.reported; r++) {
			row->link[r].sent = z->st.rank[r].sent;
			row->link[r].received = z->st.rank[r].received;
			row->link[r].credit_waits = z->st.rank[r].credit_waits;
			row->links = r + 1;
		}
	}
}

/* ---- entry ---- */

static int setup(pm *p, bool stages_default, char *path, size_t pathlen, bool *tmp, char *err, size_t errlen)
{
	pb_config *cfg = p->cfg;
	if (cfg->format == PB_FMT_CSV)
		return pb_usage("--csv is not available under mpirun (table or --json)");
	if (cfg->trace_path || cfg->svg_path)
		return pb_usage("%s is not available under mpirun", cfg->trace_path ? "--trace" : "--svg");
	p->S = stages_default ? p->ranks : cfg->stages;
	if (p->S < p->ranks)
		return pb_usage(
		    "%u %s over %u ranks: every rank needs a stage (--stages %u or more, or fewer "
		    "ranks)",
		    p->S, PLURAL(p->S, "stage", "stages"), p->ranks, p->ranks);
	if (p->S > MBP_MAX_STAGES)
		return pb_usage("%u stages: at most %d", p->S, MBP_MAX_STAGES);
	cfg->stages = p->S;
	mbt_rank_stages(p->S, p->ranks, p->rank, &p->lo, &p->hi);
	int rc;
	if (cfg->workload == PB_WL_SYNTHETIC) {
		rc = pb_synthetic_new(&p->w, cfg, err, errlen);
		if (rc == 0) {
			p->my_in_rb = p->out_rb = p->w->in_row_bytes;
			snprintf(p->desc, sizeof(p->desc), "%s", p->w->desc);
		}
	} else {
		rc = setup_mlp(p, path, pathlen, tmp, err, errlen);
	}
	if (rc == PB_EXIT_USAGE)
		return pb_usage("%s", err);
	if (rc)
		return pb_failure("rank %u: %s", p->rank, err);
	return 0;
}

/* Rank 0: the schedule over the sizes, then stop the other ranks and print. */
static int measure(pm *p)
{
	pb_config *cfg = p->cfg;
	char err[PB_ERR_MAX] = "";
	int status = PB_EXIT_OK;
	const size_t in_bytes = (size_t)cfg->batch * p->my_in_rb, out_bytes = (size_t)cfg->batch * p->out_rb;
	p->in = aligned_alloc(64, (in_bytes + 63) / 64 * 64);
	p->out = aligned_alloc(64, (out_bytes + 63) / 64 * 64);
	p->sizes = calloc(cfg->nsizes, sizeof(*p->sizes));
	pb_arm *arms = calloc(cfg->nsizes, sizeof(*arms));
	if (!p->in || !p->out || !p->sizes || !arms) {
		snprintf(err, sizeof(err), "out of memory");
		status = PB_EXIT_FAIL;
		goto stop;
	}
	if (p->w)
		p->w->fill(p->w, p->in, cfg->batch);
	else
		fill_mlp(p->in, in_bytes / sizeof(float));
	for (unsigned i = 0; i < cfg->nsizes; i++) {
		pm_size *z = &p->sizes[i];
		z->pm = p;
		z->mb_rows = cfg->sizes[i];
		z->mbs = (cfg->batch + z->mb_rows - 1) / z->mb_rows;
		snprintf(z->label, sizeof(z->label), "m=%u", z->mb_rows);
		z->ref = p->w ? NULL : malloc(out_bytes);
		if (!p->w && !z->ref) {
			snprintf(err, sizeof(err), "out of memory");
			status = PB_EXIT_FAIL;
			goto stop;
		}
		arms[i] = (pb_arm){.label = z->label, .ctx = z, .visit = visit};
	}
	pb_noise nz;
	pb_noise_init(&nz, cfg->cpus, cfg->ncpus);
	pb_noise_settle(&nz, cfg->wait_quiet_s);
	pb_schedule sch = {.min_repeats = cfg->batches,
			   .tolerance = cfg->tolerance,
			   .budget_s = cfg->duration_s,
			   .warmup = cfg->warmup,
			   .visit_s = VISIT_S,
			   .pause_s = cfg->wait_quiet_s - nz.waited_s};
	if (pb_interleave(arms, cfg->nsizes, &sch, &nz, err, sizeof(err)))
		status = PB_EXIT_FAIL;
stop:;
	pm_cmd c = {.op = CMD_STOP};
	exec(bcast_task, &c);
	pb_progress_end();
	unsigned best = cfg->nsizes;
	if (status == PB_EXIT_OK) {
		for (unsigned i = 0; i < cfg->nsizes; i++) {
			p->sizes[i].thr = arms[i].iv;
			if (best == cfg->nsizes || arms[i].iv.median > arms[best].iv.median)
				best = i;
		}
		pb_mpi_report rep;
		pb_mpi_row *rows = calloc(cfg->nsizes, sizeof(*rows));
		if (!rows) {
			snprintf(err, sizeof(err), "out of memory");
			status = PB_EXIT_FAIL;
		} else {
			fill_report(p, best, rows, &rep);
			if (cfg->format != PB_FMT_JSON)
				pb_print_mpi_table(stdout, &rep);
			else if (pb_print_mpi_json(stdout, &rep))
				status = PB_EXIT_FAIL;
		}
		free(rows);
		fflush(stdout);
	}
	if (status)
		pb_failure("FAILED: %s", err);
	for (unsigned i = 0; arms && i < cfg->nsizes; i++)
		pb_arm_fini(&arms[i]);
	free(arms);
	for (unsigned i = 0; p->sizes && i < cfg->nsizes; i++) {
		free(p->sizes[i].lat);
		free(p->sizes[i].ref);
	}
	free(p->sizes);
	free(p->in);
	free(p->out);
	return status;
}

int pb_mpi_main(pb_config *cfg, bool stages_default, int *argc, char ***argv)
{
	int rc = mbp_mpi_init(argc, argv);
	if (rc)
		return pb_failure("MPI: %s", mbp_strerror(rc));
	pm p = {.cfg = cfg, .rank = (unsigned)mbp_mpi_rank(), .ranks = (unsigned)mbp_mpi_size()};
	char err[PB_ERR_MAX] = "", path[512] = "";
	bool tmp = false;
	int status = setup(&p, stages_default, path, sizeof(path), &tmp, err, sizeof(err));
	if (tmp)
		unlink(path);
	/* every rank goes on, or none does (a rank's set-up may fail alone: its file, its memory) */
	exec(mbt_mpi_agree_max, &status);
	if (status == 0) {
		exec(clock_task, &p);
		status = p.rank == 0 ? measure(&p) : serve(&p);
	}
	if (p.mst)
		mbp_model_stages_destroy(p.mst);
	mbp_model_destroy(p.part);
	if (p.w)
		p.w->destroy(p.w);
	mbp_mpi_finalize();
	return status;
}

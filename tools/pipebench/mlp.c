/*
 * pipebench mlp workload: a float32 MLP (a safetensors file, or one generated with random weights) whose
 * layers are split into balanced stages by the model API.
 *
 * For each micro-batch size the layers are profiled at that size and repartitioned (mbp_model_balance),
 * as a user tuning the pipeline would do, into a set of stages of its own (the sizes are measured in turn,
 * so every size's stages stay alive for the run); the stages are made for the whole batch as well, so the
 * same stage functions also run the sequential baseline. The reference output is mbp_model_forward() with the
 * same micro-batch split, which the model API promises equal bit for bit to the pipeline's; the check
 * allows a relative 1e-4 so that a BLAS whose kernels differ by row count does not fail it, and reports
 * anything beyond that (or a row never written) as a wrong result.
 *
 * --rebalance: the stages are made with rebalancing on (--rebalance-replicas: each stage with threads to
 * spare, the plan's active, over the CPUs of --cpus) and attached to the pipeline that measure.c builds
 * from their stamped descriptors (mbp_model_stages_attach), so that a move may set the active replicas;
 * their statistics go into each size's result. PIPEBENCH_LAYER_US=u0,u1,... (tests only): the rebalancer
 * counts layer l at u_l microseconds per micro-batch, whatever it measured, so that a test's moves do not
 * depend on the machine's load.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipebench.h"
#include "util/blas.h"
#include "util/plural.h"

#define PB_MAX_LAYERS_US 256 /* PIPEBENCH_LAYER_US's values at most (--layers' most) */

struct mlp {
	pb_workload w;
	mbp_model *model;
	uint32_t batch;
	int profile_cpu;
	uint64_t seed;
	bool rebalance;
	const pb_config *cfg;		   /* --replicas */
	unsigned nlayer_us;		   /* PIPEBENCH_LAYER_US: one per layer, or none */
	double layer_us[PB_MAX_LAYERS_US]; /* its values */
};

/* PIPEBENCH_LAYER_US: the modelled cost of the layer, in place of the measured one. */
static double modelled_cost(void *arg, unsigned stage, unsigned layer, const mbp_mb *mb, double measured_ns)
{
	const struct mlp *m = arg;
	(void)stage;
	(void)mb;
	return layer < m->nlayer_us ? m->layer_us[layer] * 1e3 : measured_ns;
}

/* --rebalance: each move, on stderr (stage 0's thread); the reason names the new cuts. */
static void log_move(void *arg, const mbp_model_move *mv)
{
	uint32_t mb_rows = (uint32_t)(uintptr_t)arg;
	fprintf(stderr, "pipebench: rebalance at %u %s: plan %llu: %s\n", mb_rows,
		PLURAL(mb_rows, "row", "rows"), (unsigned long long)mv->plan, mv->reason);
}

/* The plan for micro-batches of mb_rows: balanced stages (mbp_model_balance), with --replicas applied,
 * or with --replicas=auto boundaries and replicas chosen together over the CPUs. */
static int mlp_plan(struct mlp *m, uint32_t mb_rows, int cpu, mbp_model_plan *plan)
{
	const pb_config *cfg = m->cfg;
	if (cfg->replicas_auto)
		return mbp_model_balance_replicas(m->model, m->w.stages, cfg->ncpus, mb_rows, cpu, plan);
	int rc = mbp_model_balance(m->model, m->w.stages, mb_rows, cpu, plan);
	for (unsigned s = 0; rc == 0 && cfg->nreplicas && s < plan->stages; s++)
		plan->replicas[s] = cfg->replicas[cfg->nreplicas > 1 ? s : 0];
	return rc;
}

static int mlp_prepare(pb_workload *w, uint32_t mb_rows, mbp_stage_desc *desc, void **inst, char *err,
		       size_t errlen)
{
	struct mlp *m = (struct mlp *)w;
	mbp_model_plan plan;
	mbp_model_stages *st = NULL;
	*inst = NULL;
	int rc = mlp_plan(m, mb_rows, m->profile_cpu, &plan);
	if (rc < 0 && m->profile_cpu >= 0) /* a pin refused: profile where the thread is */
		rc = mlp_plan(m, mb_rows, -1, &plan);
	if (rc < 0) {
		snprintf(err, errlen, "mlp: cannot balance %u %s at %u %s: %s", w->stages,
			 PLURAL(w->stages, "stage", "stages"), mb_rows, PLURAL(mb_rows, "row", "rows"),
			 mbp_strerror(rc));
		return -1;
	}
	mbp_model_stages_opts so = {.rebalance = {.on = m->rebalance,
						  .on_move = log_move,
						  .on_move_arg = (void *)(uintptr_t)mb_rows,
						  .cost = m->nlayer_us ? modelled_cost : NULL,
						  .cost_arg = m,
						  .replicas = m->cfg->rebalance_replicas,
						  .cpus = m->cfg->ncpus}};
	rc = mbp_model_stages_new_opts(&st, m->model, &plan, mb_rows > m->batch ? mb_rows : m->batch, &so);
	if (rc < 0) {
		snprintf(err, errlen, "mlp: cannot make the stages: %s", mbp_strerror(rc));
		return -1;
	}
	*inst = st;
	for (unsigned s = 0; s < w->stages; s++) {
		rc = mbp_model_stage_desc(st, s, &desc[s]);
		if (rc < 0) {
			snprintf(err, errlen, "mlp: stage %u: %s", s, mbp_strerror(rc));
			return -1;
		}
	}
	return 0;
}

static int mlp_attach(pb_workload *w, void *inst, mbp_pipeline *p, char *err, size_t errlen)
{
	(void)w;
	int rc = mbp_model_stages_attach(inst, p);
	if (rc < 0)
		snprintf(err, errlen, "mlp: cannot attach the stages to their pipeline: %s",
			 mbp_strerror(rc));
	return rc < 0 ? -1 : 0;
}

static void mlp_rebalance_stats(pb_workload *w, void *inst, mbp_model_rebalance_stats *out)
{
	(void)w;
	if (mbp_model_stages_rebalance_stats(inst, out) < 0)
		memset(out, 0, sizeof(*out));
}

static void mlp_release(pb_workload *w, void *inst)
{
	(void)w;
	mbp_model_stages_destroy(inst);
}

/* Inputs in [-1, 1), from a small deterministic generator (the same for every batch). */
static void mlp_fill(pb_workload *w, void *in, size_t rows)
{
	struct mlp *m = (struct mlp *)w;
	float *x = in;
	size_t n = rows * (w->in_row_bytes / sizeof(float));
	uint64_t s = m->seed * 2862933555777941757ull + 3037000493ull;
	for (size_t i = 0; i < n; i++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
	}
}

static int mlp_reference(pb_workload *w, const void *in, void *ref, size_t rows, uint32_t mb_rows, char *err,
			 size_t errlen)
{
	struct mlp *m = (struct mlp *)w;
	int rc = mbp_model_forward(m->model, in, ref, rows, mb_rows);
	if (rc < 0) {
		snprintf(err, errlen, "mlp: sequential forward failed: %s", mbp_strerror(rc));
		return -1;
	}
	return 0;
}

static int mlp_check(pb_workload *w, const void *out, const void *ref, size_t rows, char *err, size_t errlen)
{
	size_t width = w->out_row_bytes / sizeof(float);
	const float *o = out, *r = ref;
	for (size_t row = 0; row < rows; row++)
		for (size_t i = 0; i < width; i++) {
			float a = o[row * width + i], b = r[row * width + i];
			float tol = 1e-4f * fmaxf(1.0f, fabsf(b));
			if (!(fabsf(a - b) <= tol)) { /* NaN (a row never written) fails too */
				if (isnan(a))
					snprintf(err, errlen,
						 "row %zu was never written (a micro-batch lost)", row);
				else
					snprintf(err, errlen,
						 "row %zu column %zu is %g, the sequential output %g (wrong "
						 "result)",
						 row, i, (double)a, (double)b);
				return -1;
			}
		}
	return 0;
}

static void mlp_destroy(pb_workload *w)
{
	struct mlp *m = (struct mlp *)w;
	mbp_model_destroy(m->model);
	free(m);
}

/* PIPEBENCH_LAYER_US: one number of microseconds (above 0) per layer. 0, or -1 with err set. */
static int layer_costs(struct mlp *m, const char *s, unsigned layers, char *err, size_t errlen)
{
	unsigned n = 0;
	for (const char *p = s;;) {
		char *end;
		double v = strtod(p, &end);
		if (end == p || !(v > 0 && v < 1e9) || (*end && *end != ',') || n == PB_MAX_LAYERS_US)
			goto bad;
		m->layer_us[n++] = v;
		if (!*end)
			break;
		p = end + 1;
	}
	if (n == layers) {
		m->nlayer_us = n;
		return 0;
	}
bad:
	snprintf(err, errlen,
		 "PIPEBENCH_LAYER_US: '%s' is not %u numbers of microseconds above 0, one per layer", s,
		 layers);
	return -1;
}

/* A generated model goes through a file, as a user's would: written, loaded, unlinked. */
static int generate(struct mlp *m, const pb_config *cfg, char *err, size_t errlen)
{
	const char *dir = getenv("TMPDIR");
	char path[512];
	snprintf(path, sizeof(path), "%s/pipebench-XXXXXX", dir && *dir ? dir : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0) {
		snprintf(err, errlen, "mlp: cannot create a temporary model file in %s: %s",
			 dir ? dir : "/tmp", strerror(errno));
		return -1;
	}
	close(fd);
	mbp_model_spec spec = {
	    .layers = cfg->layers,
	    .in = cfg->hidden,
	    .hidden = cfg->hidden,
	    .out = cfg->hidden,
	    .act = MBP_ACT_RELU,
	    .dtype = MBP_DTYPE_F32,
	    .seed = cfg->seed,
	};
	int rc = mbp_model_write_random(path, &spec);
	if (rc < 0) {
		unlink(path);
		snprintf(err, errlen, "mlp: cannot write a random model: %s", mbp_strerror(rc));
		return -1;
	}
	mbp_model_error e;
	rc = mbp_model_load(&m->model, path, &e);
	unlink(path);
	if (rc < 0) {
		snprintf(err, errlen, "mlp: cannot load the generated model: %s", e.msg);
		return -1;
	}
	return 0;
}

int pb_mlp_new(pb_workload **out, const pb_config *cfg, char *err, size_t errlen)
{
	struct mlp *m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, errlen, "out of memory");
		return PB_EXIT_FAIL;
	}
	pb_workload *w = &m->w;
	w->kind = "mlp";
	w->prepare = mlp_prepare;
	w->release = mlp_release;
	w->attach = mlp_attach;
	w->rebalance_stats = mlp_rebalance_stats;
	w->fill = mlp_fill;
	w->reference = mlp_reference;
	w->check = mlp_check;
	w->destroy = mlp_destroy;
	m->batch = cfg->batch;
	m->seed = cfg->seed;
	m->rebalance = cfg->rebalance;
	m->profile_cpu = cfg->ncpus ? cfg->cpus[0] : -1;
	m->cfg = cfg;

	if (cfg->model_path) {
		mbp_model_error e;
		int rc = mbp_model_load(&m->model, cfg->model_path, &e);
		if (rc < 0) {
			snprintf(err, errlen, "%s", e.msg[0] ? e.msg : mbp_strerror(rc));
			free(m);
			return PB_EXIT_USAGE; /* the user's file: a bad argument */
		}
	} else if (generate(m, cfg, err, errlen)) {
		free(m);
		return PB_EXIT_FAIL;
	}
	unsigned layers = mbp_model_layers(m->model);
	unsigned stages = cfg->stages;
	if (stages == 0) { /* the default: one stage per CPU, at most 4, at most one per layer */
		stages = cfg->ncpus < 4 ? cfg->ncpus : 4;
		stages = stages < layers ? stages : layers;
		stages = stages ? stages : 1;
	}
	if (stages > layers) {
		snprintf(err, errlen, "%u stages but the model has %u layer%s: at most one stage per layer",
			 stages, layers, layers == 1 ? "" : "s");
		mlp_destroy(w);
		return PB_EXIT_USAGE;
	}
	w->stages = stages;
	const char *lus = getenv("PIPEBENCH_LAYER_US");
	if (lus && *lus && layer_costs(m, lus, layers, err, errlen)) {
		mlp_destroy(w);
		return PB_EXIT_USAGE;
	}
	w->in_row_bytes = (size_t)mbp_model_in_width(m->model) * sizeof(float);
	w->out_row_bytes = (size_t)mbp_model_out_width(m->model) * sizeof(float);

	uint64_t flops = 0;
	for (unsigned i = 0; i < layers; i++) {
		mbp_layer_info li;
		if (mbp_model_layer_info(m->model, i, &li) == 0)
			flops += li.flops;
	}
	char work[32];
	if (flops >= 1000000)
		snprintf(work, sizeof(work), "%.1f MFLOP", (double)flops / 1e6);
	else
		snprintf(work, sizeof(work), "%.1f kFLOP", (double)flops / 1e3);
	if (cfg->model_path)
		snprintf(w->desc, sizeof(w->desc), "mlp %.100s, %u %s, %u -> %u, %s per row, %u %s",
			 cfg->model_path, layers, PLURAL(layers, "layer", "layers"),
			 mbp_model_in_width(m->model), mbp_model_out_width(m->model), work, w->stages,
			 PLURAL(w->stages, "stage", "stages"));
	else
		snprintf(w->desc, sizeof(w->desc),
			 "mlp generated (seed %llu), %u %s x %u wide, relu, %s per row, %u %s",
			 (unsigned long long)cfg->seed, layers, PLURAL(layers, "layer", "layers"),
			 cfg->hidden, work, w->stages, PLURAL(w->stages, "stage", "stages"));
	snprintf(w->blas, sizeof(w->blas), "%s", mbp_blas_info());
	const char *warn = mbp_blas_warning();
	snprintf(w->blas_warning, sizeof(w->blas_warning), "%s", warn ? warn : "");
	snprintf(w->kernel, sizeof(w->kernel), "%s", dense_kernel_name());
	*out = w;
	return 0;
}

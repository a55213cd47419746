/*
 * What the model's suites share (test_model.c, test_model_replicas.c): a temporary folder of model files
 * made per test (setup, teardown), a model written there and loaded, random input rows, and a started
 * pipeline of a plan's stages. Include after check_main.h.
 */
#ifndef MBP_MODEL_RIG_H
#define MBP_MODEL_RIG_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cblas.h>

#include <mbpipe.h>

static char dir[64];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/mbp-model-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	openblas_set_num_threads(1);
}

static void teardown(void)
{
	char p[128];
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof(p), "%s/m%d.safetensors", dir, i);
		unlink(p);
	}
	rmdir(dir);
}

/* Write model file number `k` of a spec and load it. */
static mbp_model *make_model(int k, const mbp_model_spec *sp)
{
	char p[128];
	snprintf(p, sizeof(p), "%s/m%d.safetensors", dir, k);
	ck_assert_int_eq(mbp_model_write_random(p, sp), 0);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load(&m, p, &e) == 0, "%s", e.msg);
	return m;
}

static float *random_rows(size_t n, uint64_t seed)
{
	float *x = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		x[i] = (float)((double)(seed >> 40) / (double)(1u << 23) - 1.0);
	}
	return x;
}

/* A started pipeline of the stages st of m, results to on_result. */
static mbp_pipeline *stages_pipeline(mbp_model *m, mbp_model_stages *st, uint32_t max_mb,
				     mbp_result_fn on_result, void *arg)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = mbp_model_in_width(m) * sizeof(float);
	o.max_mb_rows = max_mb;
	o.on_result = on_result;
	o.on_result_arg = arg;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	ck_assert_int_eq(mbp_model_stages_add(st, p), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	return p;
}

/* A started pipeline of the plan's stages (replicas included), results to on_result. */
static mbp_pipeline *model_pipeline_plan(mbp_model *m, mbp_model_stages **st, const mbp_model_plan *plan,
					 uint32_t max_mb, mbp_result_fn on_result, void *arg)
{
	ck_assert_int_eq(mbp_model_stages_new(st, m, plan, max_mb), 0);
	return stages_pipeline(m, *st, max_mb, on_result, arg);
}

#endif

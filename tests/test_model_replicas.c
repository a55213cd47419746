/*
 * A model's replicated stages: the partitioner that chooses boundaries and replica counts together
 * against brute force; the plan's description and placement lines; a pipeline of replicated model stages
 * against mbp_model_forward, bit for bit and in order (test_model.c's swap under load runs through a
 * replicated stage 0 too); a job failing in a replicated stage 0 lets its version go.
 */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include <mbpipe.h>

#include "check_main.h"
#include "model_rig.h"

/* ---- the partitioner ---- */

/* Brute force: every split of layers [start, L) into `S` more stages (-1: any number), each with 1 .. C
 * replicas, C threads left. The least period. */
static double brute(const double *c, const double *h, unsigned L, int S, unsigned C, unsigned start)
{
	if (start == L)
		return S <= 0 ? 0 : INFINITY;
	if (S == 0)
		return INFINITY;
	double best = INFINITY, cost = start > 0 && h ? h[start - 1] : 0;
	for (unsigned end = start + 1; end <= L; end++) {
		cost += c[end - 1];
		for (unsigned r = 1; r <= C; r++)
			best = fmin(best, fmax(brute(c, h, L, S < 0 ? -1 : S - 1, C - r, end), cost / r));
	}
	return best;
}

START_TEST(partition_with_replicas_equals_brute_force_on_random_costs)
{
	uint64_t seed = 777;
	unsigned trials = (unsigned)mbp_iters(2000, 200);
	for (unsigned t = 0; t < trials; t++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		unsigned L = 1 + (unsigned)(seed >> 33) % 7;
		unsigned C = 1 + (unsigned)(seed >> 40) % 5;
		unsigned S = (unsigned)(seed >> 50) % (L < C ? L + 1 : C + 1); /* 0: any */
		bool with_h = (seed >> 20) & 1;
		double c[8], h[8];
		for (unsigned i = 0; i < L; i++) {
			seed = seed * 6364136223846793005u + 1442695040888963407u;
			c[i] = (double)((seed >> 33) % 1000);
			h[i] = (double)((seed >> 50) % 100);
		}
		mbp_model_plan p;
		ck_assert_int_eq(mbp_model_partition_replicas(c, with_h ? h : NULL, L, S, C, &p), 0);
		double want = brute(c, with_h ? h : NULL, L, S == 0 ? -1 : (int)S, C, 0);
		ck_assert_msg(p.slowest_ns == want, "L %u S %u C %u: %g, brute force %g", L, S, C,
			      p.slowest_ns, want);
		if (S)
			ck_assert_uint_eq(p.stages, S);
		ck_assert_uint_le(p.threads, C);
		ck_assert_uint_eq(p.first[0], 0);
		ck_assert_uint_eq(p.first[p.stages], L);
		unsigned threads = 0;
		double mx = 0;
		for (unsigned s = 0; s < p.stages; s++) {
			ck_assert_uint_lt(p.first[s], p.first[s + 1]);
			ck_assert_uint_ge(p.replicas[s], 1);
			threads += p.replicas[s];
			double cost = s > 0 && with_h ? h[p.first[s] - 1] : 0;
			for (unsigned i = p.first[s]; i < p.first[s + 1]; i++)
				cost += c[i];
			ck_assert_double_eq(p.stage_ns[s], cost);
			mx = fmax(mx, cost / p.replicas[s]);
		}
		ck_assert_uint_eq(threads, p.threads);
		ck_assert_double_eq(mx, p.slowest_ns);
		/* the fewest threads: one fewer cannot reach the period */
		if (p.threads > (S ? S : 1)) {
			mbp_model_plan q;
			ck_assert_int_eq(
			    mbp_model_partition_replicas(c, with_h ? h : NULL, L, S, p.threads - 1, &q), 0);
			ck_assert_double_gt(q.slowest_ns, p.slowest_ns);
		}
	}
}
END_TEST

START_TEST(the_heavy_layer_is_replicated_and_the_plan_says_so)
{
	/* one layer 70 % of the work */
	double c[4] = {1, 7, 1, 1};
	mbp_model_plan p;
	ck_assert_int_eq(mbp_model_partition_replicas(c, NULL, 4, 3, 4, &p), 0);
	ck_assert_uint_eq(p.stages, 3);
	ck_assert_uint_eq(p.first[1], 1);
	ck_assert_uint_eq(p.first[2], 2);
	ck_assert_uint_eq(p.replicas[0], 1);
	ck_assert_uint_eq(p.replicas[1], 2);
	ck_assert_uint_eq(p.replicas[2], 1);
	ck_assert_double_eq(p.slowest_ns, 3.5);
	ck_assert_uint_eq(p.threads, 4);
	char buf[512];
	ck_assert_int_gt(mbp_model_plan_describe(&p, buf, sizeof(buf)), 0);
	ck_assert_ptr_nonnull(strstr(buf, "stage 1: layers 1-1  0.0 us x2"));
	/* any number of stages on 2 CPUs: every layer on both (the bound sum / CPUs) */
	ck_assert_int_eq(mbp_model_partition_replicas(c, NULL, 4, 0, 2, &p), 0);
	ck_assert_uint_eq(p.stages, 1);
	ck_assert_uint_eq(p.replicas[0], 2);
	ck_assert_double_eq(p.slowest_ns, 5);
	/* without replicas the best is the heavy layer alone: 7 */
	ck_assert_int_eq(mbp_model_partition(c, NULL, 4, 2, &p), 0);
	ck_assert_double_eq(p.slowest_ns, 8);
	ck_assert_int_eq(mbp_model_partition(c, NULL, 4, 3, &p), 0);
	ck_assert_double_eq(p.slowest_ns, 7);
	ck_assert_uint_eq(p.replicas[1], 1);
	/* limits */
	ck_assert_int_eq(mbp_model_partition_replicas(c, NULL, 4, 5, 8, &p), -ERANGE);
	ck_assert_int_eq(mbp_model_partition_replicas(c, NULL, 4, 3, 2, &p), -ERANGE);
	ck_assert_int_eq(mbp_model_partition_replicas(c, NULL, 4, 0, MBP_MAX_STAGES + 1, &p), -ERANGE);
	ck_assert_int_eq(mbp_model_partition_replicas(c, NULL, 4, 0, 0, &p), -EINVAL);
	double bad[2] = {1, -1};
	ck_assert_int_eq(mbp_model_partition_replicas(bad, NULL, 2, 0, 2, &p), -EINVAL);
}
END_TEST

/* ---- a pipeline of replicated model stages ---- */

struct ordered {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned got, out_of_order;
	mbp_mb *mb[64];
};

static void on_result(void *arg, mbp_mb *mb)
{
	struct ordered *r = arg;
	pthread_mutex_lock(&r->lock);
	if (mb->seq != r->got)
		r->out_of_order++;
	r->mb[mb->seq % 64] = mb;
	r->got++;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

/* Plans by hand over 6 layers: a replicated middle, first and last stage, and one stage replicated. */
static const mbp_model_plan plans[] = {
    {.stages = 3, .layers = 6, .first = {0, 2, 4, 6}, .replicas = {1, 3, 1}},
    {.stages = 3, .layers = 6, .first = {0, 1, 5, 6}, .replicas = {2, 1, 3}},
    {.stages = 1, .layers = 6, .first = {0, 6}, .replicas = {3}},
    {.stages = 2, .layers = 6, .first = {0, 3, 6}, .replicas = {2, 2}},
};

START_TEST(replicated_model_stages_give_the_forward_bits_in_order)
{
	uint32_t widths[] = {40, 96, 64, 128, 32, 72, 24};
	mbp_model_spec sp = {.layers = 6, .widths = widths, .act = MBP_ACT_GELU, .norm = true, .seed = 21};
	mbp_model *m = make_model(0, &sp);
	const size_t rows = 61;
	float *x = random_rows(rows * 40, 3), *ref = malloc(rows * 24 * 4), *y = malloc(rows * 24 * 4);
	struct ordered res = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
	mbp_model_stages *st;
	mbp_pipeline *p = model_pipeline_plan(m, &st, &plans[_i], 16, on_result, &res);
	char text[512];
	ck_assert_int_gt(mbp_model_plan_placement(&plans[_i], p, text, sizeof(text)), 0);
	ck_assert_ptr_nonnull(strstr(text, "stage 0 ("));
	char want[32];
	if (plans[_i].replicas[0] > 1)
		snprintf(want, sizeof(want), ") x%u -> CPUs ", plans[_i].replicas[0]);
	else
		snprintf(want, sizeof(want), ") -> CPU ");
	ck_assert_msg(strstr(text, want), "%s: no '%s'", text, want);
	static const uint32_t mbs[] = {1, 5, 16};
	for (unsigned k = 0; k < 3; k++) {
		memset(y, 0xff, rows * 24 * 4);
		ck_assert_int_eq(mbp_run(p, x, y, rows, mbs[k]), 0);
		ck_assert_int_eq(mbp_model_forward(m, x, ref, rows, mbs[k]), 0);
		ck_assert_msg(!memcmp(y, ref, rows * 24 * 4), "plan %d, micro-batch %u: not bit for bit", _i,
			      mbs[k]);
	}
	/* single micro-batches: in order, each the reference's bits */
	enum { N = 48 };
	for (uint32_t k = 0; k < N; k++) {
		mbp_mb *mb;
		ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
		mb->rows = 1 + k % 7;
		mb->seq = k;
		memcpy(mb->data, x + k * 40, mb->rows * 40 * 4);
		ck_assert_int_eq(mbp_mb_submit(p, mb, -1), 0);
		pthread_mutex_lock(&res.lock);
		while (res.got + 8 < k) /* the buffers of mbp_mb_acquire() are few: keep up */
			pthread_cond_wait(&res.cond, &res.lock);
		for (unsigned j = 0; j < res.got; j++)
			if (res.mb[j % 64]) {
				mbp_mb *d = res.mb[j % 64];
				float expect[7 * 24];
				ck_assert_int_eq(
				    mbp_model_forward(m, x + d->seq * 40, expect, d->rows, d->rows), 0);
				ck_assert_int_eq(d->status, 0);
				ck_assert_mem_eq(d->data, expect, d->rows * 24 * 4);
				res.mb[j % 64] = NULL;
				mbp_mb_release(p, d);
			}
		pthread_mutex_unlock(&res.lock);
	}
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_uint_eq(res.got, N);
	ck_assert_uint_eq(res.out_of_order, 0);
	for (unsigned j = 0; j < 64; j++)
		if (res.mb[j])
			mbp_mb_release(p, res.mb[j]);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	free(x);
	free(ref);
	free(y);
	mbp_model_destroy(m);
}
END_TEST

/* A job whose first micro-batch fails stage 0's checks (more rows than the stages were made for) passes a
 * replicated stage 0: its entry in the replicas' shared table, and the version it holds, go with the
 * job's last micro-batch, so that after a swap the old version is freed while the pipeline runs, not at
 * its end; the job's other micro-batch has the forward's bits. More jobs than the table has entries. */
START_TEST(a_job_failing_in_a_replicated_stage_0_does_not_keep_its_version)
{
	uint32_t widths[] = {16, 40, 8};
	mbp_model_spec sp = {.layers = 2, .widths = widths, .act = MBP_ACT_RELU, .seed = 5};
	mbp_model *m = make_model(0, &sp);
	sp.seed = 6;
	mbp_model *next = make_model(1, &sp);
	const mbp_model_plan plan = {.stages = 2, .layers = 2, .first = {0, 1, 2}, .replicas = {2, 1}};
	mbp_model_stages *st;
	ck_assert_int_eq(mbp_model_stages_new(&st, m, &plan, 4), 0); /* 4 rows at most ... */
	mbp_pipeline *p = stages_pipeline(m, st, 8, NULL, NULL);     /* ... of micro-batches of 8 */
	enum { ROWS = 12, JOBS = 5 };				     /* 8 rows (too many), then 4 */
	float *x = random_rows(ROWS * 16, 9), y[ROWS * 8], ref[4 * 8];
	ck_assert_int_eq(mbp_model_forward(m, x + 8 * 16, ref, 4, 4), 0);
	for (int k = 0; k < JOBS; k++) {
		mbp_job job;
		mbp_job_init(&job, x, y, ROWS, 8);
		ck_assert_int_eq(mbp_job_submit(p, &job, -1), 0);
		ck_assert_int_eq(mbp_job_wait(&job, -1), 0);
		ck_assert_int_eq(job.status, -E2BIG);
		ck_assert_uint_eq(job.mbs, 2);
		ck_assert_uint_eq(job.mbs_failed, 1);
		ck_assert_mem_eq(y + 8 * 8, ref, sizeof(ref));
	}
	ck_assert_int_eq(mbp_model_swap(m, next), 0);
	ck_assert_msg(mbp_model_versions_alive(m) == 1,
		      "%u versions alive after the swap: the old one is held", mbp_model_versions_alive(m));
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	free(x);
	mbp_model_destroy(m);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("model_replicas");
	TCase *tc = tcase_create("model_replicas");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, partition_with_replicas_equals_brute_force_on_random_costs);
	tcase_add_test(tc, the_heavy_layer_is_replicated_and_the_plan_says_so);
	tcase_add_loop_test(tc, replicated_model_stages_give_the_forward_bits_in_order, 0,
			    (int)(sizeof(plans) / sizeof(plans[0])));
	tcase_add_test(tc, a_job_failing_in_a_replicated_stage_0_does_not_keep_its_version);
	suite_add_tcase(s, tc);
	return s;
}

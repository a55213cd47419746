/*
 * Tests of the planner (mbp_mlp_plan, mbp_mlp_plan_predict) on a synthetic profile whose answers are worked out by hand.
 *
 * The profile: two layers, each F = B_in = B_w = 1 at 16 rows and 2 at 32 (the same speed per row), 4
 * bytes a row kept per layer and 4 of output, a batch of 64 rows, 1000 bytes of state, up to 2 threads.
 * Chunked schedules need 2T chunks, more than the 2 layers on 2 threads: the plans are 1 stage or 2
 * chunks on 1 thread, or 2 stages on 2 threads, one layer each (the only split), under gpipe, 1f1b,
 * zbh1 and zbh2.
 *
 * Memory of a one-layer stage: 4 bytes x 16 rows = 64 bytes a micro-batch, stashed or (recomputing) in a
 * work buffer. 1F1B on 2 stages, M = 4: stage 0 holds 2 stashes (128), stage 1 one (64): 192; stage 0
 * recomputing holds one work buffer at a time, during its B (64): 128 with stage 1 either way, the least
 * of any plan (GPipe holds all 4, 256 a stage, 64 recomputing; one stage of both layers holds 12 bytes a
 * row, 192 a micro-batch; 32 rows double everything).
 *
 * Times. Unlimited: ZB-H1 at 16 rows on 2 threads, 13 (stage 1 waits for one F, then runs its 12 units
 * back to back: the least any plan on one stage per thread can take), no recomputation. At 1000 + 128
 * bytes: 1F1B with stage 0 recomputing (F 1, B 3) is 18 (played by hand in the test's comment below),
 * GPipe with both recomputing 20, 1F1B with both 20.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <mbpipe.h>

#define STATE 1000

static const uint32_t sizes[2] = {16, 32};
static mbp_op_costs costs[4] = {{1, 1, 1}, {1, 1, 1}, {2, 2, 2}, {2, 2, 2}};
static const uint64_t keep[2] = {4, 4}, outb[2] = {4, 4};

static mbp_plan_profile profile(void)
{
	return (mbp_plan_profile){.layers = 2,
				  .sizes = 2,
				  .mb = sizes,
				  .cost = costs,
				  .keep_bytes = keep,
				  .out_bytes = outb,
				  .state_bytes = STATE,
				  .batch = 64};
}

START_TEST(a_loose_budget_keeps_every_activation_and_takes_the_fastest_schedule)
{
	mbp_plan_profile p = profile();
	mbp_train_plan pl;
	uint64_t need = 0;
	ck_assert_int_eq(mbp_mlp_plan(&p, UINT64_MAX, 2, &pl, &need), 0);
	ck_assert_int_eq(pl.threads, 2);
	ck_assert_int_eq(pl.stages, 2);
	ck_assert_int_eq(pl.schedule, MBP_SCHED_ZBH1);
	ck_assert_uint_eq(pl.mb, 16);
	ck_assert_uint_eq(pl.mbs, 4);
	ck_assert_uint_eq(pl.recompute, 0);
	ck_assert_msg(pl.step_ns == 13, "step %g, not 13", pl.step_ns);
	ck_assert_msg(fabs(pl.bubble - 1.0 / 13) < 1e-12, "bubble %g", pl.bubble);
	ck_assert_uint_eq(pl.first[0], 0);
	ck_assert_uint_eq(pl.first[1], 1);
	ck_assert_uint_eq(pl.first[2], 2);
	/* ZB-H1: stage 0 holds 2 stashes (1F1B's), stage 1 its stash and the one its deferred W keeps */
	ck_assert_uint_eq(pl.stage_act_bytes[0], 128);
	ck_assert_uint_eq(pl.stage_act_bytes[1], 128);
	ck_assert_uint_eq(pl.act_bytes, 256);
	ck_assert_uint_eq(pl.state_bytes, STATE);
	ck_assert_uint_eq(pl.peak_bytes, STATE + 256);
	ck_assert_uint_eq(need, STATE + 128);
	ck_assert_uint_eq(pl.fitted, pl.considered);
}
END_TEST

/*
 * 1F1B on 2 stages, 4 micro-batches, stage 0 recomputing (F 1, B 3), stage 1 (F 1, B 2), by hand:
 *   s0 F0 0-1, F1 1-2; s1 F0 1-2, B0 2-4; s0 B0 4-7; s1 F1 4-5, B1 5-7; s0 F2 7-8, B1 8-11;
 *   s1 F2 8-9, B2 9-11; s0 F3 11-12, B2 12-15; s1 F3 12-13, B3 13-15; s0 B3 15-18: 18.
 */
START_TEST(a_budget_that_forbids_keeping_everything_recomputes_only_where_it_must)
{
	mbp_plan_profile p = profile();
	mbp_train_plan pl;
	uint64_t need = 0;
	ck_assert_int_eq(mbp_mlp_plan(&p, STATE + 128, 2, &pl, &need), 0);
	ck_assert_int_eq(pl.schedule, MBP_SCHED_1F1B);
	ck_assert_int_eq(pl.stages, 2);
	ck_assert_int_eq(pl.threads, 2);
	ck_assert_uint_eq(pl.mb, 16);
	ck_assert_uint_eq(pl.recompute, 1); /* stage 0 only: stage 1 saves nothing by recomputing */
	ck_assert_msg(pl.step_ns == 18, "step %g, not 18", pl.step_ns);
	ck_assert_uint_eq(pl.stage_act_bytes[0], 64);
	ck_assert_uint_eq(pl.stage_act_bytes[1], 64);
	ck_assert_uint_eq(pl.peak_bytes, STATE + 128);
	ck_assert_uint_eq(need, STATE + 128);
	ck_assert(pl.fitted > 0 && pl.fitted < pl.considered);

	/* 1F1B keeping everything (192) fits 1000 + 192: a faster plan, whatever it recomputes, fits it */
	mbp_train_plan wide;
	ck_assert_int_eq(mbp_mlp_plan(&p, STATE + 192, 2, &wide, NULL), 0);
	ck_assert(wide.peak_bytes <= STATE + 192);
	ck_assert(wide.step_ns <= 15); /* 1F1B keeping: (M + S - 1) x 3 = 15 */
}
END_TEST

START_TEST(a_budget_no_plan_fits_is_refused_with_the_least_memory_plans_peak)
{
	mbp_plan_profile p = profile();
	mbp_train_plan pl;
	uint64_t need = 0;
	ck_assert_int_eq(mbp_mlp_plan(&p, STATE + 127, 2, &pl, &need), -ENOSPC);
	ck_assert_uint_eq(need, STATE + 128);
	ck_assert_uint_eq(pl.peak_bytes, STATE + 128); /* the least memory plan is handed back */
	ck_assert_uint_eq(pl.fitted, 0);
	/* exactly that budget fits */
	ck_assert_int_eq(mbp_mlp_plan(&p, need, 2, &pl, NULL), 0);
	ck_assert_uint_eq(pl.peak_bytes, need);
	/* one thread: one stage of both layers under 1F1B holds 12 bytes a row x 16 rows, 192, and takes
	 * 24 (every operation one after another: nothing on one thread is faster); below that budget only
	 * a recomputing plan fits (two chunks on the thread, one recomputing), slower */
	ck_assert_int_eq(mbp_mlp_plan(&p, STATE + 192, 1, &pl, &need), 0);
	ck_assert_int_eq(pl.stages, 1);
	ck_assert_uint_eq(pl.recompute, 0);
	ck_assert_msg(pl.step_ns == 24, "step %g, not 24", pl.step_ns);
	ck_assert_uint_eq(pl.peak_bytes, STATE + 192);
	ck_assert_int_eq(mbp_mlp_plan(&p, STATE + 191, 1, &pl, &need), 0);
	ck_assert(pl.recompute != 0 && pl.step_ns > 24 && pl.peak_bytes <= STATE + 191);
	ck_assert_int_eq(mbp_mlp_plan(&p, 1, 2, &pl, &need), -ENOSPC);
	ck_assert_uint_eq(need, STATE + 128);
}
END_TEST

/* Every budget from the least to the loose one: the plan fits it, and more memory never slows it. */
START_TEST(every_plan_fits_its_budget_and_a_larger_budget_is_never_slower)
{
	mbp_plan_profile p = profile();
	double prev = INFINITY;
	for (uint64_t b = STATE + 128; b <= STATE + 600; b += 8) {
		mbp_train_plan pl;
		ck_assert_int_eq(mbp_mlp_plan(&p, b, 2, &pl, NULL), 0);
		ck_assert_msg(pl.peak_bytes <= b, "budget %llu: peak %llu", (unsigned long long)b,
			      (unsigned long long)pl.peak_bytes);
		uint64_t sum = 0;
		for (unsigned s = 0; s < pl.stages; s++)
			sum += pl.stage_act_bytes[s];
		ck_assert_uint_eq(sum, pl.act_bytes);
		ck_assert_uint_eq(pl.act_bytes + pl.state_bytes, pl.peak_bytes);
		ck_assert_msg(pl.step_ns <= prev, "budget %llu: %g after %g", (unsigned long long)b,
			      pl.step_ns, prev);
		prev = pl.step_ns;
	}
	ck_assert(prev == 13);
}
END_TEST

START_TEST(the_same_profile_gives_the_same_plan)
{
	/* a profile with uneven costs and more layers, so that the search has choices to make */
	enum { L = 6 };
	static const uint32_t mb[3] = {16, 32, 64};
	mbp_op_costs c[3 * L];
	uint64_t kb[L], ob[L];
	for (unsigned k = 0; k < 3; k++)
		for (unsigned i = 0; i < L; i++) {
			double w = (1 + i % 3) * (1 << k) * (k ? 0.9 : 1);
			c[k * L + i] = (mbp_op_costs){w, w * 1.1, w * 0.9};
		}
	for (unsigned i = 0; i < L; i++)
		kb[i] = 8 + 4 * i, ob[i] = 16;
	mbp_plan_profile p = {.layers = L,
			      .sizes = 3,
			      .mb = mb,
			      .cost = c,
			      .keep_bytes = kb,
			      .out_bytes = ob,
			      .state_bytes = 5000,
			      .batch = 256};
	mbp_train_plan a, b;
	uint64_t need;
	ck_assert_int_eq(mbp_mlp_plan(&p, UINT64_MAX, 3, &a, &need), 0);
	for (uint64_t budget = need; budget < a.peak_bytes; budget += (a.peak_bytes - need) / 7 + 1) {
		memset(&a, 0xa5, sizeof a);
		memset(&b, 0x5a, sizeof b);
		ck_assert_int_eq(mbp_mlp_plan(&p, budget, 3, &a, NULL), 0);
		ck_assert_int_eq(mbp_mlp_plan(&p, budget, 3, &b, NULL), 0);
		ck_assert(a.peak_bytes <= budget);
		ck_assert(a.stages == b.stages && a.threads == b.threads && a.schedule == b.schedule &&
			  a.mb == b.mb && a.recompute == b.recompute && a.step_ns == b.step_ns &&
			  a.peak_bytes == b.peak_bytes && a.considered == b.considered);
		ck_assert(!memcmp(a.first, b.first, sizeof a.first));
		ck_assert(!memcmp(a.stage_act_bytes, b.stage_act_bytes, sizeof a.stage_act_bytes));
	}
}
END_TEST

START_TEST(bad_profiles_and_arguments_are_refused)
{
	mbp_plan_profile p = profile();
	mbp_train_plan pl;
	ck_assert_int_eq(mbp_mlp_plan(NULL, 1, 1, &pl, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_plan(&p, 1 << 20, 1, NULL, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_plan(&p, 0, 1, &pl, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_plan(&p, 1 << 20, 0, &pl, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_plan(&p, 1 << 20, MBP_MAX_STAGES + 1, &pl, NULL), -EINVAL);
	mbp_plan_profile q = p;
	q.layers = 0;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q = p;
	q.sizes = 0;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q.sizes = MBP_PLAN_MAX_SIZES + 1;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q = p;
	q.op_ns = -1;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q.op_ns = NAN;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q = p;
	q.batch = 0;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q = p;
	q.keep_bytes = NULL;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q = p;
	static const uint32_t down[2] = {32, 16}, zero[2] = {0, 16};
	q.mb = down;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q.mb = zero;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	const double bad[] = {-1, NAN, INFINITY};
	for (unsigned k = 0; k < 3; k++) {
		mbp_op_costs saved = costs[3];
		costs[3].b_w = bad[k];
		ck_assert_int_eq(mbp_mlp_plan(&p, 1 << 20, 1, &pl, NULL), -EINVAL);
		costs[3] = saved;
	}
	/* sizes above the batch are not planned; none at or below it: nothing to plan */
	q = p;
	q.batch = 8;
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 1, &pl, NULL), -EINVAL);
	q.batch = 16; /* one micro-batch of 16 */
	ck_assert_int_eq(mbp_mlp_plan(&q, 1 << 20, 2, &pl, NULL), 0);
	ck_assert_uint_eq(pl.mb, 16);
	ck_assert_uint_eq(pl.mbs, 1);
}
END_TEST

/* A plan predicted again gives the planner's own figures, and a point worked out by hand (the header's
 * 1F1B at 16 rows, stage 0 recomputing: 18 units, 128 bytes; keeping: 15, 192) its figures. */
START_TEST(a_plan_predicted_again_gives_its_own_figures_and_a_hand_made_point_its_own)
{
	mbp_plan_profile p = profile();
	for (uint64_t budget = STATE + 128; budget <= STATE + 512; budget += 64) {
		mbp_train_plan pl, again;
		ck_assert_int_eq(mbp_mlp_plan(&p, budget, 2, &pl, NULL), 0);
		again = (mbp_train_plan){.threads = pl.threads,
					 .stages = pl.stages,
					 .schedule = pl.schedule,
					 .mb = pl.mb,
					 .recompute = pl.recompute};
		memcpy(again.first, pl.first, sizeof again.first);
		ck_assert_int_eq(mbp_mlp_plan_predict(&p, &again), 0);
		ck_assert_msg(again.step_ns == pl.step_ns && again.bubble == pl.bubble,
			      "budget %llu: step %g bubble %g, the plan's %g %g", (unsigned long long)budget,
			      again.step_ns, again.bubble, pl.step_ns, pl.bubble);
		ck_assert_uint_eq(again.mbs, pl.mbs);
		ck_assert_uint_eq(again.act_bytes, pl.act_bytes);
		ck_assert_uint_eq(again.peak_bytes, pl.peak_bytes);
		ck_assert_uint_eq(again.state_bytes, STATE);
	}
	mbp_train_plan x = {.threads = 2,
			    .stages = 2,
			    .schedule = MBP_SCHED_1F1B,
			    .mb = 16,
			    .recompute = 1,
			    .first = {0, 1, 2}};
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), 0);
	ck_assert_msg(x.step_ns == 18, "step %g, not 18", x.step_ns);
	ck_assert_uint_eq(x.mbs, 4);
	ck_assert_uint_eq(x.stage_act_bytes[0], 64);
	ck_assert_uint_eq(x.stage_act_bytes[1], 64);
	ck_assert_uint_eq(x.peak_bytes, STATE + 128);
	x.recompute = 0;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), 0);
	ck_assert_msg(x.step_ns == 15, "step %g, not 15", x.step_ns);
	ck_assert_uint_eq(x.peak_bytes, STATE + 192);
}
END_TEST

/* A point the planner could not weigh is refused: an unprofiled size, a stage count that is not the
 * schedule's for the threads, a split that is not the layers in order, a recomputing stage that is not
 * there, a custom or automatic schedule, NULL. */
START_TEST(a_point_the_planner_cannot_weigh_is_refused)
{
	mbp_plan_profile p = profile();
	const mbp_train_plan ok = {
	    .threads = 2, .stages = 2, .schedule = MBP_SCHED_1F1B, .mb = 16, .first = {0, 1, 2}};
	mbp_train_plan x = ok;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), 0);
	ck_assert_int_eq(mbp_mlp_plan_predict(NULL, &x), -EINVAL);
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, NULL), -EINVAL);
	x = ok, x.mb = 24;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
	x = ok, x.stages = 1, x.first[1] = 2;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
	x = ok, x.schedule = MBP_SCHED_ZBV; /* 2 chunks on 2 threads: 4 stages */
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
	x = ok, x.first[1] = 2;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
	x = ok, x.first[2] = 1;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
	x = ok, x.recompute = 4;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
	x = ok, x.schedule = MBP_SCHED_AUTO;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
	x = ok, x.threads = 0;
	ck_assert_int_eq(mbp_mlp_plan_predict(&p, &x), -EINVAL);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("planner");
	TCase *tc = tcase_create("plan");
	tcase_add_test(tc, a_loose_budget_keeps_every_activation_and_takes_the_fastest_schedule);
	tcase_add_test(tc, a_budget_that_forbids_keeping_everything_recomputes_only_where_it_must);
	tcase_add_test(tc, a_budget_no_plan_fits_is_refused_with_the_least_memory_plans_peak);
	tcase_add_test(tc, every_plan_fits_its_budget_and_a_larger_budget_is_never_slower);
	tcase_add_test(tc, the_same_profile_gives_the_same_plan);
	tcase_add_test(tc, bad_profiles_and_arguments_are_refused);
	tcase_add_test(tc, a_plan_predicted_again_gives_its_own_figures_and_a_hand_made_point_its_own);
	tcase_add_test(tc, a_point_the_planner_cannot_weigh_is_refused);
	suite_add_tcase(s, tc);
	return s;
}

#include "check_main.h"

/*
 * The trainer: a toy pipeline of small tanh layers with hand-written backward, checked bit for bit against
 * a sequential reference (forward then backward of each micro-batch in turn, gradients accumulated in
 * micro-batch order), under every schedule and thread count; stash figures; failures, cancel and drain in
 * the middle of a step.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mbpipe.h>
#ifdef MBP_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "affinity.h"
#include "check_main.h"
#include "pipeline_internal.h"
#include "train_internal.h"

#include "train_toy.h"

struct rig {
	mbp_trainer *t;
	struct toy st[MBP_MAX_STAGES];
	unsigned S;
};

/* A trainer of S toy stages under `o`, not started; `edit` (NULL: none) changes stage s's descriptor. */
static void rig_build(struct rig *r, unsigned S, const mbp_train_opts *o, bool whole,
		      void (*edit)(mbp_train_stage_desc *d, unsigned s))
{
	r->S = S;
	ck_assert_int_eq(mbp_trainer_new(&r->t, o), 0);
	for (unsigned s = 0; s < S; s++) {
		toy_init(&r->st[s], s + 1);
		mbp_train_stage_desc d = toy_desc(&r->st[s], whole);
		if (edit)
			edit(&d, s);
		ck_assert_int_eq(mbp_trainer_add_stage(r->t, &d), 0);
	}
}

static void rig_new(struct rig *r, unsigned S, mbp_sched_kind kind, unsigned threads, bool whole)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .max_mb_rows = 16,
			    .max_mbs = 32,
			    .schedule = kind,
			    .threads = threads,
			    .trace_events = 512,
			    .loss = mse};
	rig_build(r, S, &o, whole, NULL);
	ck_assert_int_eq(mbp_trainer_start(r->t), 0);
}

static void params_equal(const struct toy *a, const struct toy *b, unsigned S)
{
	for (unsigned s = 0; s < S; s++) {
		ck_assert_msg(memcmp(a[s].w, b[s].w, sizeof(a[s].w)) == 0, "stage %u weights differ", s);
		ck_assert_msg(memcmp(a[s].b, b[s].b, sizeof(a[s].b)) == 0, "stage %u biases differ", s);
	}
}

static void no_buffer_out(mbp_trainer *t)
{
	mbp_train_stats st;
	ck_assert_int_eq(mbp_trainer_stats_get(t, &st, NULL, 0), (int)st.stages);
	ck_assert_uint_eq(st.pool.in_use, 0);
}

START_TEST(toy_pipeline_gradients_equal_a_sequential_reference)
{
	struct rig r;
	rig_new(&r, 4, MBP_SCHED_1F1B, 0, false);
	struct toy ref[4];
	for (unsigned s = 0; s < 4; s++)
		toy_init(&ref[s], s + 1);
	float in[22 * N], tg[22 * N];
	for (unsigned step = 0; step < 3; step++) {
		make_data(in, tg, 22, step);
		double loss = -1,
		       want = reference_step(ref, 4, in, tg, 22, 4); /* 6 mbs, the last of 2 rows */
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 22, 4, &loss), 0);
		ck_assert(loss == want);
		params_equal(r.st, ref, 4);
		ck_assert(r.st[0].last_norm > 0 && isfinite(r.st[0].last_norm));
		ck_assert(r.st[3].last_loss == want);
	}
	mbp_train_stats st;
	ck_assert_int_eq(mbp_trainer_stats_get(r.t, &st, NULL, 0), 4);
	ck_assert_uint_eq(st.steps, 3);
	ck_assert_uint_eq(st.mbs, 6);
	no_buffer_out(r.t);
	mbp_trainer_destroy(r.t);
}
END_TEST

static bool zero_bubble(mbp_sched_kind k)
{
	return k == MBP_SCHED_ZBH1 || k == MBP_SCHED_ZBH2 || k == MBP_SCHED_ZBV || k == MBP_SCHED_DUALPIPEV;
}

/* The thread counts a schedule of S stages runs on: any up to S for the block ones, those that divide S
 * for interleaved and looped BFS (v = S / T chunks each), S / 2 for the V ones. */
static bool runs_on(mbp_sched_kind k, unsigned S, unsigned T)
{
	if (k == MBP_SCHED_INTERLEAVED || k == MBP_SCHED_LOOPED_BFS)
		return S % T == 0;
	if (k == MBP_SCHED_ZBV || k == MBP_SCHED_DUALPIPEV)
		return S == 2 * T;
	return T <= S;
}

START_TEST(every_schedule_and_thread_count_gives_identical_parameters)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE,	      MBP_SCHED_1F1B,	    MBP_SCHED_ZBH1,
					       MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS, MBP_SCHED_ZBH2,
					       MBP_SCHED_ZBV,	      MBP_SCHED_DUALPIPEV};
	static const unsigned threads[] = {1, 2, 3, 4};
	float in[40 * N], tg[40 * N];
	for (unsigned S = 1; S <= 8; S++) {
		struct toy ref[8];
		for (unsigned s = 0; s < S; s++)
			toy_init(&ref[s], s + 1);
		for (unsigned step = 0; step < 2; step++) {
			make_data(in, tg, 40, step);
			reference_step(ref, S, in, tg, 40, 5);
		}
		for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++)
			for (size_t ti = 0; ti < MBP_ARRAY_SIZE(threads); ti++) {
				if (threads[ti] > S || !runs_on(kinds[k], S, threads[ti]))
					continue;
				struct rig r;
				rig_new(&r, S, kinds[k], threads[ti], !zero_bubble(kinds[k]) && (S & 1));
				for (unsigned step = 0; step < 2; step++) {
					make_data(in, tg, 40, step);
					ck_assert_msg(mbp_trainer_step(r.t, in, tg, 40, 5, NULL) == 0,
						      "%s S=%u T=%u", mbp_sched_name(kinds[k]), S,
						      threads[ti]);
				}
				params_equal(r.st, ref, S);
				no_buffer_out(r.t);
				/* each chunk ran on the thread its placement names */
				mbp_train_stage_stats ss[8];
				ck_assert_int_eq(mbp_trainer_stats_get(r.t, NULL, ss, S), (int)S);
				const mbp_schedule *sc = mbp_trainer_schedule(r.t);
				for (unsigned s = 0; s < S; s++)
					ck_assert_uint_eq(ss[s].thread,
							  mbp_schedule_thread_of(sc, s, threads[ti]));
				mbp_trainer_destroy(r.t);
			}
	}
}
END_TEST

/* A schedule of 3 stages on 2 threads as CSV into text (cap bytes), its length: stages 0 and 2 on thread 0
 * (placed as no rule of ours places them), 8 micro-batches, a GPipe-like order with stage 1's weight
 * gradients deferred to its end. */
static size_t custom_text(char *text, size_t cap)
{
	size_t k = 0;
	for (unsigned j = 0; j < 8; j++)
		k += (size_t)snprintf(text + k, cap - k, "0F%u,", j);
	for (unsigned j = 0; j < 8; j++)
		k += (size_t)snprintf(text + k, cap - k, "2F%u,2B%u,", j, j);
	for (unsigned j = 0; j < 8; j++)
		k += (size_t)snprintf(text + k, cap - k, "0B%u%s", j, j < 7 ? "," : "\n");
	for (unsigned j = 0; j < 8; j++)
		k += (size_t)snprintf(text + k, cap - k, "1F%u,", j);
	for (unsigned j = 0; j < 8; j++)
		k += (size_t)snprintf(text + k, cap - k, "1I%u,", j);
	for (unsigned j = 0; j < 8; j++)
		k += (size_t)snprintf(text + k, cap - k, "1W%u%s", j, j < 7 ? "," : "\n");
	return k;
}

START_TEST(a_schedule_read_from_text_trains_bit_for_bit)
{
	/* custom_text's schedule, micro-batches of 5 rows */
	char text[1024];
	size_t k = custom_text(text, sizeof(text));
	mbp_schedule *sc;
	mbp_sched_text_error e;
	ck_assert_msg(mbp_schedule_read_csv(&sc, text, k, 0, &e) == 0, "line %u %s: %s", e.line, e.action,
		      e.what);
	struct toy ref[3];
	float in[40 * N], tg[40 * N];
	for (unsigned s = 0; s < 3; s++)
		toy_init(&ref[s], s + 1);
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .max_mb_rows = 16,
			    .max_mbs = 32,
			    .schedule = MBP_SCHED_CUSTOM,
			    .custom = sc,
			    .loss = mse};
	struct rig r;
	rig_build(&r, 3, &o, false, NULL);
	mbp_schedule_destroy(sc); /* the trainer has its copy */
	ck_assert_int_eq(mbp_trainer_start(r.t), 0);
	for (unsigned step = 0; step < 2; step++) {
		make_data(in, tg, 40, step);
		reference_step(ref, 3, in, tg, 40, 5);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 40, 5, NULL), 0);
	}
	params_equal(r.st, ref, 3);
	mbp_train_stage_stats ss[3];
	ck_assert_int_eq(mbp_trainer_stats_get(r.t, NULL, ss, 3), 3);
	ck_assert(ss[0].thread == 0 && ss[1].thread == 1 && ss[2].thread == 0);
	/* the schedule's 8 micro-batches, no other count */
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 40, 10, NULL), -EINVAL);
	no_buffer_out(r.t);
	mbp_trainer_destroy(r.t);
	/* its stage count must be the trainer's; a custom kind needs a schedule, a schedule the kind */
	ck_assert_int_eq(mbp_schedule_read_csv(&sc, text, k, 0, NULL), 0);
	o.custom = sc;
	rig_build(&r, 2, &o, false, NULL);
	ck_assert_int_eq(mbp_trainer_start(r.t), -EINVAL);
	mbp_trainer_destroy(r.t);
	mbp_trainer *t;
	o.schedule = MBP_SCHED_1F1B;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), -EINVAL);
	o.schedule = MBP_SCHED_CUSTOM;
	o.custom = NULL;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), -EINVAL);
	mbp_schedule_destroy(sc);
}
END_TEST

/* The parts of a pipeline across ranks make one decision from their votes (train_place.c, no MPI): an
 * update only if every part is ok, each stage's squared norm from the part that holds it and the loss
 * from the last stage's part; a failed step's error the failing stage with the lowest index, whichever
 * part says it first, one of no stage only where no stage failed, -ECANCELED where no part says why. */
START_TEST(the_parts_votes_make_one_decision_with_the_lowest_failing_stages_error)
{
	struct rec {
		int pad; /* a part's record holds more than its vote */
		struct mbp__train_vote v;
	} r[3] = {0};
	const int rank_of[] = {0, 1, 1, 2};
	for (int k = 0; k < 3; k++) {
		r[k].v.ok = true;
		for (unsigned s = 0; s < 4; s++)
			r[k].v.grad_sq[s] =
			    rank_of[s] == k ? 10.0 * s + 1 : -1; /* not its part's: never read */
	}
	r[2].v.loss = 7.5;
	struct mbp__train_vote out;
	mbp__train_vote_tally(&r[0].v, sizeof(r[0]), 3, rank_of, 4, &out);
	ck_assert(out.ok);
	ck_assert_int_eq(out.err.err, 0);
	for (unsigned s = 0; s < 4; s++)
		ck_assert_double_eq(out.grad_sq[s], 10.0 * s + 1);
	ck_assert_double_eq(out.loss, 7.5);

	/* part 0 fails with no stage, part 2 at stage 3, part 1 at stage 1: stage 1's error */
	r[0].v.ok = r[1].v.ok = r[2].v.ok = false;
	r[0].v.err = (mbp_train_error){.err = -ECONNRESET, .stage = -1, .mb = -1};
	r[2].v.err = (mbp_train_error){.err = -EDOM, .stage = 3, .mb = 2};
	r[1].v.err = (mbp_train_error){.err = -EIO, .stage = 1, .mb = 0};
	mbp__train_vote_tally(&r[0].v, sizeof(r[0]), 3, rank_of, 4, &out);
	ck_assert(!out.ok);
	ck_assert_int_eq(out.err.err, -EIO);
	ck_assert_int_eq(out.err.stage, 1);
	/* only failures of no stage: the first part's */
	r[1].v.err = (mbp_train_error){.err = -ETIMEDOUT, .stage = -1, .mb = -1};
	r[2].v.err = (mbp_train_error){0};
	mbp__train_vote_tally(&r[0].v, sizeof(r[0]), 3, rank_of, 4, &out);
	ck_assert_int_eq(out.err.err, -ECONNRESET);
	/* one part not ok and no part saying why */
	r[0].v.err = r[1].v.err = (mbp_train_error){0};
	r[0].v.ok = r[2].v.ok = true;
	mbp__train_vote_tally(&r[0].v, sizeof(r[0]), 3, rank_of, 4, &out);
	ck_assert(!out.ok);
	ck_assert_int_eq(out.err.err, -ECANCELED);
	ck_assert_int_eq(out.err.stage, -1);
}
END_TEST
/* The trainer across ranks places the whole pipeline's stages from each rank's count (train_place.c, no
 * MPI): a block kind by rank, a chunked one as its schedule puts the stages on threads, the ranks taking
 * whole threads in rank order; a rank whose stages are not whole threads, or too many stages, is refused
 * with a reason. */
START_TEST(stages_over_ranks_follow_the_block_rule_or_the_chunked_schedules_threads)
{
	char err[160];
	int rank_of[MBP_MAX_STAGES];
	unsigned stages = 0;
	struct mbp__train_remote rem = {0};
	mbp_train_opts o = {.schedule = MBP_SCHED_1F1B};
	const unsigned n3[] = {2, 1, 3}, th0[MBP_MAX_STAGES + 1] = {0};
	ck_assert_int_eq(mbp__train_place_ranks(&o, 3, 1, n3, th0, rank_of, &stages, &rem, err, sizeof err),
			 0);
	ck_assert_uint_eq(stages, 6);
	const int block[] = {0, 0, 1, 2, 2, 2};
	for (unsigned g = 0; g < 6; g++)
		ck_assert_int_eq(rank_of[g], block[g]);
	ck_assert_uint_eq(rem.sched_threads, 0); /* the block rule: nothing placed */

	/* interleaved, 4 stages on 2 threads (two chunks a thread): stages 0 and 2 on thread 0, 1 and 3 on 1 */
	o.schedule = MBP_SCHED_INTERLEAVED;
	const unsigned n2[] = {2, 2};
	for (int me = 0; me < 2; me++) {
		rem = (struct mbp__train_remote){0};
		ck_assert_int_eq(
		    mbp__train_place_ranks(&o, 2, me, n2, th0, rank_of, &stages, &rem, err, sizeof err), 0);
		ck_assert_uint_eq(stages, 4);
		for (unsigned g = 0; g < 4; g++)
			ck_assert_int_eq(rank_of[g], (int)(g % 2));
		ck_assert_uint_eq(rem.sched_threads, 2);
		ck_assert_uint_eq(rem.threads, 1);
		ck_assert_uint_eq(rem.global[0], (unsigned)me);
		ck_assert_uint_eq(rem.global[1], (unsigned)me + 2);
		ck_assert_uint_eq(rem.thread_of[0], 0);
		ck_assert_uint_eq(rem.thread_of[1], 0);
	}
	/* rank 0 holds one stage, but its thread holds two */
	const unsigned n13[] = {1, 3};
	err[0] = 0;
	ck_assert_int_eq(mbp__train_place_ranks(&o, 2, 0, n13, th0, rank_of, &stages, &rem, err, sizeof err),
			 -EINVAL);
	ck_assert_msg(strstr(err, "rank 0's 1 stages are not whole threads"), "%s", err);
	/* threads asked by every rank (4: a chunk a thread) that are not what its stages take there */
	const unsigned th2[] = {1, 3};
	err[0] = 0;
	ck_assert_int_eq(mbp__train_place_ranks(&o, 2, 0, n2, th2, rank_of, &stages, &rem, err, sizeof err),
			 -EINVAL);
	ck_assert_msg(strstr(err, "rank 0's 2 stages on its threads are not whole threads"), "%s", err);
	/* more stages than a pipeline holds, also with more ranks than that */
	unsigned many[MBP_MAX_STAGES + 1];
	for (unsigned k = 0; k <= MBP_MAX_STAGES; k++)
		many[k] = 1;
	o.schedule = MBP_SCHED_1F1B;
	const unsigned n33[] = {33, 32};
	ck_assert_int_eq(mbp__train_place_ranks(&o, 2, 0, n33, th0, rank_of, &stages, &rem, err, sizeof err),
			 -E2BIG);
	ck_assert_msg(strstr(err, "more than 64 stages"), "%s", err);
	ck_assert_int_eq(mbp__train_place_ranks(&o, MBP_MAX_STAGES + 1, 0, many, th0, rank_of, &stages, &rem,
						err, sizeof err),
			 -E2BIG);
	/* ranks given different custom schedules disagree at start: their hashes differ */
	mbp_schedule *a, *b;
	ck_assert_int_eq(mbp_schedule_new(&a, MBP_SCHED_1F1B, 2, 4), 0);
	ck_assert_int_eq(mbp_schedule_new(&b, MBP_SCHED_GPIPE, 2, 4), 0);
	ck_assert(mbp__train_schedule_hash(a) != mbp__train_schedule_hash(b));
	ck_assert(mbp__train_schedule_hash(a) != 0);
	ck_assert_uint_eq(mbp__train_schedule_hash(NULL), 0);
	mbp_schedule_destroy(a);
	mbp_schedule_destroy(b);
}
END_TEST

START_TEST(a_chunked_schedule_refuses_a_thread_count_it_cannot_place)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .schedule = MBP_SCHED_ZBV,
			    .threads = 3,
			    .loss = mse};
	struct rig r;
	rig_build(&r, 4, &o, false, NULL);
	ck_assert_int_eq(mbp_trainer_start(r.t), -EINVAL);
	mbp_train_error e;
	ck_assert_int_eq(mbp_trainer_error(r.t, &e), 0);
	ck_assert_int_eq(e.stage, -1);
	ck_assert_ptr_nonnull(e.what);
	ck_assert_ptr_nonnull(strstr(e.what, "threads"));
	mbp_trainer_destroy(r.t);
	/* 0 threads: two chunks a thread */
	o.threads = 0;
	o.schedule = MBP_SCHED_INTERLEAVED;
	rig_build(&r, 4, &o, false, NULL);
	ck_assert_int_eq(mbp_trainer_start(r.t), 0);
	mbp_train_stats st;
	ck_assert_int_eq(mbp_trainer_stats_get(r.t, &st, NULL, 0), 4);
	ck_assert_uint_eq(st.threads, 2);
	mbp_trainer_destroy(r.t);
}
END_TEST

START_TEST(stash_high_water_marks_equal_the_schedules_figures)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	float in[64 * N], tg[64 * N];
	make_data(in, tg, 64, 1);
	for (size_t k = 0; k < 3; k++)
		for (unsigned T = 1; T <= 4; T *= 2) {
			struct rig r;
			rig_new(&r, 4, kinds[k], T, false);
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 8, NULL), 0); /* M = 8 */
			const mbp_schedule *sc = mbp_trainer_schedule(r.t);
			mbp_train_stage_stats ss[4];
			ck_assert_int_eq(mbp_trainer_stats_get(r.t, NULL, ss, 4), 4);
			for (unsigned s = 0; s < 4; s++) {
				ck_assert_uint_eq(ss[s].stash_peak, mbp_schedule_stash_peak(sc, s));
				ck_assert_uint_eq(ss[s].held_peak, mbp_schedule_held_peak(sc, s));
				ck_assert_uint_eq(ss[s].stash_peak, kinds[k] == MBP_SCHED_GPIPE ? 8 : 4 - s);
				ck_assert_uint_eq(ss[s].f_count, 8);
				if (kinds[k] == MBP_SCHED_ZBH1) {
					ck_assert_uint_eq(ss[s].bin_count, 8);
					ck_assert_uint_eq(ss[s].w_count, 8);
					ck_assert_uint_eq(ss[s].b_count, 0);
				} else {
					ck_assert_uint_eq(ss[s].b_count, 8);
				}
				ck_assert_uint_eq(ss[s].thread, s * T / 4);
			}
			mbp_trainer_destroy(r.t);
		}
}
END_TEST

/* Thread t's hand-offs and local passes over its stages' counts equal the schedule's figures. */
static void hops_match_figures(mbp_trainer *t, unsigned S)
{
	mbp_train_stats st;
	mbp_train_stage_stats ss[MBP_MAX_STAGES];
	ck_assert_int_eq(mbp_trainer_stats_get(t, &st, ss, S), (int)S);
	const mbp_schedule *sc = mbp_trainer_schedule(t);
	for (unsigned th = 0; th < st.threads; th++) {
		unsigned hops = 0, local = 0;
		for (unsigned s = 0; s < S; s++)
			if (ss[s].thread == th) {
				hops += ss[s].hops;
				local += ss[s].local_hops;
			}
		mbp_sched_thread_figures f;
		ck_assert_int_eq(mbp_schedule_thread_figures(sc, st.threads, th, &f), 0);
		ck_assert_msg(hops == f.hops && local == f.local_hops,
			      "%s, %u threads, thread %u: %u hops and %u local, the schedule's %u and %u",
			      mbp_sched_name(mbp_schedule_kind(sc)), st.threads, th, hops, local, f.hops,
			      f.local_hops);
	}
}

START_TEST(hops_between_stages_of_one_thread_pass_locally_as_the_schedule_counts_them)
{
	/* two chunks a thread (interleaved v = 2, ZB-V) on one and two threads, and 1F1B's block of two
	 * stages a thread: a hop inside a thread is a local pass, the others a ring's */
	static const mbp_sched_kind kinds[] = {MBP_SCHED_INTERLEAVED, MBP_SCHED_ZBV, MBP_SCHED_1F1B};
	float in[64 * N], tg[64 * N];
	make_data(in, tg, 64, 1);
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++)
		for (unsigned T = 1; T <= 2; T++) {
			unsigned S = 2 * T;
			struct rig r;
			struct toy ref[4];
			rig_new(&r, S, kinds[k], T, kinds[k] != MBP_SCHED_ZBV);
			memcpy(ref, r.st, sizeof(ref));
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 8, NULL), 0); /* M = 8 */
			hops_match_figures(r.t, S);
			mbp_train_stage_stats ss[4];
			ck_assert_int_eq(mbp_trainer_stats_get(r.t, NULL, ss, S), (int)S);
			unsigned hops = 0, local = 0;
			for (unsigned s = 0; s < S; s++) {
				hops += ss[s].hops;
				local += ss[s].local_hops;
			}
			/* every hop is one or the other: M forwards and M input gradients a boundary */
			ck_assert_uint_eq(hops + local, 2 * 8 * (S - 1));
			/* one thread: nothing handed off; two: under ZB-V only the middle pair of chunks shares
			 * one, under interleaved none, under 1F1B each thread's two stages do */
			unsigned want_local = T == 1				  ? 2 * 8 * (S - 1)
					      : kinds[k] == MBP_SCHED_INTERLEAVED ? 0
					      : kinds[k] == MBP_SCHED_ZBV	  ? 2 * 8
										  : 2 * 2 * 8;
			ck_assert_uint_eq(local, want_local);
			reference_step(ref, S, in, tg, 64, 8);
			params_equal(r.st, ref, S);
			mbp_trainer_destroy(r.t);
		}
}
END_TEST

START_TEST(a_chunk_failing_while_items_wait_in_a_local_slot_leaks_nothing_and_the_next_step_is_exact)
{
	/* every stage on one thread: the last stage's first forward fails while outputs of the stage
	 * before it, run ahead by the schedule (looped BFS: all of them; 1F1B, GPipe: their global order's
	 * lag), wait in the local FIFO between them */
	static const mbp_sched_kind kinds[] = {MBP_SCHED_LOOPED_BFS, MBP_SCHED_1F1B, MBP_SCHED_GPIPE};
	static const unsigned stages[] = {2, 3, 3};
	float in[64 * N], tg[64 * N];
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++) {
		unsigned S = stages[k];
		struct rig r;
		struct toy before[4], ref[4];
		rig_new(&r, S, kinds[k], 1, kinds[k] != MBP_SCHED_ZBV);
		memcpy(before, r.st, sizeof(before));
		r.st[S - 1].fail_kind = MBP_OP_F;
		r.st[S - 1].fail_mb = 0;
		make_data(in, tg, 64, 0);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 8, NULL), -EIO);
		mbp_train_error e;
		ck_assert_int_eq(mbp_trainer_error(r.t, &e), 0);
		ck_assert_int_eq(e.stage, (int)S - 1);
		ck_assert_int_eq(e.mb, 0);
		ck_assert_int_eq(e.op, MBP_OP_F);
		mbp_train_stage_stats ss[4];
		ck_assert_int_eq(mbp_trainer_stats_get(r.t, NULL, ss, S), (int)S);
		/* the chunk before passed more outputs on than the failing one took (its forwards ran) */
		ck_assert_uint_eq(ss[S - 2].hops, 0);
		ck_assert_msg(ss[S - 2].local_hops > ss[S - 1].f_count, "%s: %u passed, %u taken",
			      mbp_sched_name(kinds[k]), ss[S - 2].local_hops, ss[S - 1].f_count);
		params_equal(r.st, before, S);
		for (unsigned s = 0; s < S; s++) {
			ck_assert_uint_eq(r.st[s].updates, 0);
			ck_assert_uint_eq(r.st[s].discards, 1);
		}
		no_buffer_out(r.t); /* what sat in the local FIFOs went back to the pool */
		r.st[S - 1].fail_kind = -1;
		memcpy(ref, r.st, sizeof(ref));
		make_data(in, tg, 64, 1);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 8, NULL), 0);
		reference_step(ref, S, in, tg, 64, 8);
		params_equal(r.st, ref, S);
		hops_match_figures(r.t, S);
		no_buffer_out(r.t);
		mbp_trainer_destroy(r.t); /* the pool checks that every buffer came back */
	}
}
END_TEST

/* start refuses the stages with -EINVAL, and mbp_trainer_error names the stage */
static void start_refused_naming(mbp_trainer *t, int stage)
{
	ck_assert_int_eq(mbp_trainer_start(t), -EINVAL);
	mbp_train_error e;
	ck_assert_int_eq(mbp_trainer_error(t, &e), 0);
	ck_assert_int_eq(e.err, -EINVAL);
	ck_assert_int_eq(e.stage, stage);
	ck_assert_ptr_nonnull(e.what); /* in words */
}

START_TEST(zbh1_refuses_a_stage_without_split_backward)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .schedule = MBP_SCHED_ZBH1,
			    .loss = mse};
	mbp_trainer *t;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	struct toy a, b;
	toy_init(&a, 1);
	toy_init(&b, 2);
	mbp_train_stage_desc d = toy_desc(&a, true);
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	d = toy_desc(&b, true);
	d.backward_in = d.backward_w = NULL; /* a single backward only */
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	start_refused_naming(t, 1);
	mbp_trainer_destroy(t);
}
END_TEST

START_TEST(injected_failure_at_any_operation_leaves_every_parameter_unchanged)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	float in[24 * N], tg[24 * N];
	for (size_t k = 0; k < 3; k++)
		for (unsigned fs = 0; fs < 3; fs++)
			for (int kind = MBP_OP_F; kind <= MBP_OP_W; kind++) {
				if ((kinds[k] == MBP_SCHED_ZBH1) != (kind == MBP_OP_BIN || kind == MBP_OP_W))
					if (kind != MBP_OP_F)
						continue;
				for (int mb = 0; mb < 6; mb += 5) {
					struct rig r;
					rig_new(&r, 3, kinds[k], (unsigned)(1 + (mb & 1) + fs % 2), true);
					struct toy before[3], ref[3];
					memcpy(before, r.st, sizeof(before));
					memcpy(ref, r.st, sizeof(ref));
					r.st[fs].fail_kind = kind;
					r.st[fs].fail_mb = mb;
					make_data(in, tg, 24, 0);
					ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 24, 4, NULL), -EIO);
					mbp_train_error e;
					mbp_trainer_error(r.t, &e);
					ck_assert_int_eq(e.err, -EIO);
					ck_assert_int_eq(e.stage, (int)fs);
					ck_assert_int_eq(e.mb, mb);
					ck_assert_int_eq(e.op, kind);
					params_equal(r.st, before, 3);
					for (unsigned s = 0; s < 3; s++) {
						ck_assert_uint_eq(r.st[s].updates, 0);
						ck_assert_uint_eq(r.st[s].discards, 1);
					}
					no_buffer_out(r.t);
					/* the next step runs normally */
					r.st[fs].fail_kind = -1;
					make_data(in, tg, 24, 1);
					ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 24, 4, NULL), 0);
					for (unsigned s = 0; s < 3; s++)
						ref[s].fail_kind = -1;
					reference_step(ref, 3, in, tg, 24, 4);
					params_equal(r.st, ref, 3);
					mbp_train_stats st;
					mbp_trainer_stats_get(r.t, &st, NULL, 0);
					ck_assert_uint_eq(st.steps, 1);
					ck_assert_uint_eq(st.steps_failed, 1);
					mbp_trainer_destroy(r.t);
				}
			}
}
END_TEST

static int nan_loss(void *arg, const mbp_train_io *io, double *loss)
{
	int rc = mse(arg, io, loss);
	if (io->mb == 2)
		*loss = NAN;
	return rc;
}

START_TEST(non_finite_loss_fails_the_step_with_edom)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .threads = 2,
			    .loss = nan_loss};
	struct rig r;
	rig_build(&r, 2, &o, false, NULL);
	mbp_trainer *t = r.t;
	struct toy *st = r.st, before[2];
	memcpy(before, st, sizeof(before));
	ck_assert_int_eq(mbp_trainer_start(t), 0);
	float in[16 * N], tg[16 * N];
	make_data(in, tg, 16, 0);
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 16, 4, NULL), -EDOM);
	mbp_train_error e;
	mbp_trainer_error(t, &e);
	ck_assert_int_eq(e.stage, 1);
	ck_assert_int_eq(e.mb, 2);
	ck_assert_int_eq(e.op, MBP_OP_F);
	params_equal(st, before, 2);
	no_buffer_out(t);
	mbp_trainer_destroy(t);
}
END_TEST

/* The last step failed at stage `stage`'s update (its check, grad_sq or update) with `err`, in words. */
static void failed_at_update(mbp_trainer *t, int err, int stage)
{
	mbp_train_error e;
	ck_assert_int_eq(mbp_trainer_error(t, &e), 0);
	ck_assert_int_eq(e.err, err);
	ck_assert_int_eq(e.stage, stage);
	ck_assert_int_eq(e.mb, -1);
	ck_assert_int_eq(e.op, MBP_OP_UPDATE);
	ck_assert_ptr_nonnull(e.what);
}

static double nan_grad_sq(void *ctx)
{
	(void)ctx;
	return NAN;
}

static void nan_grad_sq_at_1(mbp_train_stage_desc *d, unsigned s)
{
	if (s == 1)
		d->grad_sq = nan_grad_sq;
}

START_TEST(non_finite_gradient_norm_fails_the_step_before_any_update)
{
	struct rig r;
	mbp_train_opts o = {
	    .in_row_bytes = N * sizeof(float), .target_row_bytes = N * sizeof(float), .loss = mse};
	rig_build(&r, 3, &o, false, nan_grad_sq_at_1);
	ck_assert_int_eq(mbp_trainer_start(r.t), 0);
	struct toy before[3];
	memcpy(before, r.st, sizeof(before));
	float in[16 * N], tg[16 * N];
	make_data(in, tg, 16, 0);
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 16, 4, NULL), -EDOM);
	failed_at_update(r.t, -EDOM, 1);
	params_equal(r.st, before, 3);
	for (unsigned s = 0; s < 3; s++)
		ck_assert_uint_eq(r.st[s].updates, 0);
	no_buffer_out(r.t);
	mbp_trainer_destroy(r.t);
}
END_TEST

static void no_grad_sq(mbp_train_stage_desc *d, unsigned s)
{
	(void)s;
	d->grad_sq = NULL;
}

/* A stage's check refuses (stage 1 of 4, no stage giving grad_sq): under every schedule and thread count
 * the step fails naming stage 1 and no stage's parameters change; the next step runs normally, its norm
 * unknown (NaN) without grad_sq. */
START_TEST(a_refusing_check_fails_the_step_before_any_stage_updates)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	float in[24 * N], tg[24 * N];
	for (size_t k = 0; k < 3; k++)
		for (unsigned T = 1; T <= 4; T *= 2) {
			mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
					    .target_row_bytes = N * sizeof(float),
					    .schedule = kinds[k],
					    .threads = T,
					    .loss = mse};
			struct rig r;
			rig_build(&r, 4, &o, false, no_grad_sq);
			ck_assert_int_eq(mbp_trainer_start(r.t), 0);
			struct toy before[4], ref[4];
			memcpy(before, r.st, sizeof(before));
			memcpy(ref, r.st, sizeof(ref));
			r.st[1].fail_kind = TOY_FAIL_CHECK;
			make_data(in, tg, 24, 0);
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 24, 4, NULL), -EIO);
			failed_at_update(r.t, -EIO, 1);
			params_equal(r.st, before, 4);
			for (unsigned s = 0; s < 4; s++) {
				ck_assert_uint_eq(r.st[s].updates, 0);
				ck_assert_uint_eq(r.st[s].discards, 1);
			}
			no_buffer_out(r.t);
			r.st[1].fail_kind = -1;
			make_data(in, tg, 24, 1);
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 24, 4, NULL), 0);
			reference_step(ref, 4, in, tg, 24, 4);
			params_equal(r.st, ref, 4);
			ck_assert(isnan(r.st[0].last_norm)); /* unknown: no stage gives grad_sq */
			mbp_trainer_destroy(r.t);
		}
}
END_TEST

/* An update that refuses after its check accepted (a broken contract) is reported, not silent: the step
 * fails with -ENOTRECOVERABLE naming the stage, and so does every later step, which runs nothing. */
START_TEST(an_update_that_refuses_after_its_check_breaks_the_trainer_and_says_so)
{
	struct rig r;
	rig_new(&r, 3, MBP_SCHED_1F1B, 2, false);
	r.st[2].fail_kind = TOY_FAIL_UPDATE;
	float in[16 * N], tg[16 * N];
	make_data(in, tg, 16, 0);
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 16, 4, NULL), -ENOTRECOVERABLE);
	failed_at_update(r.t, -ENOTRECOVERABLE, 2);
	r.st[2].fail_kind = -1;
	unsigned ops = atomic_load(&r.st[0].ops);
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 16, 4, NULL), -ENOTRECOVERABLE);
	failed_at_update(r.t, -ENOTRECOVERABLE, 2);
	ck_assert_uint_eq(atomic_load(&r.st[0].ops), ops);
	mbp_train_stats st;
	mbp_trainer_stats_get(r.t, &st, NULL, 0);
	ck_assert_uint_eq(st.steps, 0);
	ck_assert_uint_eq(st.steps_failed, 1);
	no_buffer_out(r.t);
	mbp_trainer_destroy(r.t);
}
END_TEST

struct later {
	mbp_trainer *t;
	struct toy *watch;
	unsigned after_ops;
	bool drain;
};

static void *stop_later(void *arg)
{
	struct later *l = arg;
	while (atomic_load(&l->watch->ops) < (unsigned)l->after_ops)
		usleep(200);
	if (l->drain)
		mbp_trainer_drain(l->t);
	else
		mbp_trainer_cancel(l->t);
	return NULL;
}

START_TEST(cancel_mid_step_fails_it_with_nothing_updated_and_refuses_later_steps)
{
	for (unsigned T = 1; T <= 3; T++) {
		struct rig r;
		rig_new(&r, 3, MBP_SCHED_1F1B, T, false);
		for (unsigned s = 0; s < 3; s++)
			r.st[s].sleep_us = 300;
		struct toy before[3];
		memcpy(before, r.st, sizeof(before));
		struct later l = {r.t, &r.st[1], 5, false};
		pthread_t th;
		pthread_create(&th, NULL, stop_later, &l);
		float in[64 * N], tg[64 * N];
		make_data(in, tg, 64, 0);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 4, NULL), -ECANCELED);
		pthread_join(th, NULL);
		params_equal(r.st, before, 3);
		no_buffer_out(r.t);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 4, NULL), -ESHUTDOWN);
		mbp_trainer_destroy(r.t);
	}
}
END_TEST

START_TEST(drain_mid_step_lets_it_finish_then_refuses_later_steps)
{
	struct rig r;
	rig_new(&r, 3, MBP_SCHED_ZBH1, 2, false);
	struct toy ref[3];
	memcpy(ref, r.st, sizeof(ref));
	for (unsigned s = 0; s < 3; s++)
		r.st[s].sleep_us = 200;
	struct later l = {r.t, &r.st[1], 5, true};
	pthread_t th;
	pthread_create(&th, NULL, stop_later, &l);
	float in[32 * N], tg[32 * N];
	make_data(in, tg, 32, 0);
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 32, 4, NULL), 0);
	pthread_join(th, NULL);
	reference_step(ref, 3, in, tg, 32, 4);
	params_equal(r.st, ref, 3);
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 32, 4, NULL), -ESHUTDOWN);
	no_buffer_out(r.t);
	mbp_trainer_destroy(r.t);
}
END_TEST

/* The trainer's Chrome trace, written to a temporary file and read back into buf (NUL-terminated). */
static void trace_text(mbp_trainer *t, char *buf, size_t cap)
{
	char path[] = "/tmp/mbp_train_traceXXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(mbp_trainer_trace_write(t, path), 0);
	FILE *f = fopen(path, "r");
	size_t n = fread(buf, 1, cap - 1, f);
	buf[n] = 0;
	fclose(f);
	unlink(path);
}

START_TEST(trace_shows_forward_backward_and_weight_operations_as_distinct_events)
{
	struct rig r;
	rig_new(&r, 2, MBP_SCHED_ZBH1, 2, false);
	float in[16 * N], tg[16 * N];
	make_data(in, tg, 16, 0);
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 16, 4, NULL), 0);
	char buf[65536];
	trace_text(r.t, buf, sizeof(buf));
	ck_assert_ptr_nonnull(strstr(buf, "\"name\":\"F0\""));
	ck_assert_ptr_nonnull(strstr(buf, "\"name\":\"B_in3\""));
	ck_assert_ptr_nonnull(strstr(buf, "\"name\":\"W3\""));
	unsigned events = 0;
	for (char *p = buf; (p = strstr(p, "\"ph\":\"X\"")); p++)
		events++;
	ck_assert_uint_eq(events, 2 * 4 * 3); /* S x M x (F, B_in, W) */
	mbp_train_stats st;
	mbp_trainer_stats_get(r.t, &st, NULL, 0);
	ck_assert(st.bubble > -0.05 && st.bubble < 1);
	ck_assert(st.bubble_predicted >= 0 && st.bubble_predicted < 1);
	mbp_trainer_destroy(r.t);
}
END_TEST

/* The events of a step are its operations: per stage in the order of the schedule's list (same kinds and
 * micro-batches), ordered in time without overlap, inside the step; a short buffer gets the count. */
START_TEST(events_of_a_step_follow_each_stages_schedule_list_in_time_order)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	for (unsigned k = 0; k < 3; k++) {
		struct rig r;
		rig_new(&r, 3, kinds[k], 2, false);
		float in[16 * N], tg[16 * N];
		make_data(in, tg, 16, 0);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 16, 2, NULL), 0);
		const mbp_schedule *sc = mbp_trainer_schedule(r.t);
		size_t total = 0;
		for (unsigned s = 0; s < 3; s++) {
			const mbp_sched_op *ops;
			total += mbp_schedule_stage_ops(sc, s, &ops);
		}
		ck_assert_int_eq(mbp_trainer_events_get(r.t, NULL, 0), (int)total);
		mbp_train_event ev[256], one;
		ck_assert_int_eq(mbp_trainer_events_get(r.t, &one, 1), (int)total);
		ck_assert_int_eq(mbp_trainer_events_get(r.t, ev, 256), (int)total);
		ck_assert_uint_eq(one.stage, 0);
		mbp_train_stats st;
		mbp_trainer_stats_get(r.t, &st, NULL, 0);
		size_t i = 0;
		for (unsigned s = 0; s < 3; s++) {
			const mbp_sched_op *ops;
			size_t n = mbp_schedule_stage_ops(sc, s, &ops);
			uint64_t prev_end = 0;
			for (size_t j = 0; j < n; j++, i++) {
				ck_assert_uint_eq(ev[i].stage, s);
				ck_assert_uint_eq(ev[i].kind, ops[j].kind);
				ck_assert_uint_eq(ev[i].mb, ops[j].mb);
				ck_assert(ev[i].t0_ns >= prev_end && ev[i].t1_ns >= ev[i].t0_ns);
				ck_assert(ev[i].t1_ns <= st.step_ns);
				prev_end = ev[i].t1_ns;
			}
		}
		ck_assert_uint_eq(i, total);
		if (kinds[k] == MBP_SCHED_ZBH1)
			ck_assert_uint_eq(total, 3 * 8 * 3); /* S x M x (F, B_in, W) */
		else
			ck_assert_uint_eq(total, 3 * 8 * 2); /* S x M x (F, B) */
		mbp_trainer_destroy(r.t);
	}
	mbp_train_event e;
	ck_assert_int_eq(mbp_trainer_events_get(NULL, &e, 1), -EINVAL);
	struct rig r;
	rig_new(&r, 1, MBP_SCHED_1F1B, 1, false);
	ck_assert_int_eq(mbp_trainer_events_get(r.t, NULL, 1), -EINVAL);
	ck_assert_int_eq(mbp_trainer_events_get(r.t, NULL, 0), 0); /* no step yet */
	mbp_trainer_destroy(r.t);
	mbp_train_opts o = {.in_row_bytes = 4, .target_row_bytes = 4, .loss = mse}; /* tracing off */
	mbp_trainer *t;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	ck_assert_int_eq(mbp_trainer_events_get(t, &e, 1), -EINVAL);
	mbp_trainer_destroy(t);
}
END_TEST

/* A gradient wider than the activation (grad_row_bytes): stage 1 sends back, after the gradient of its
 * input, a block stamped with the micro-batch and position; stage 0 finds every stamp in its B_in and in
 * its W (the trainer keeps the gradient until then), and the parameters are the plain pipeline's. */
static _Atomic unsigned stamps_bad, stamps_seen;

static float stamp(const mbp_train_io *io, uint32_t e)
{
	return (float)(io->mb * 1000u + e);
}

static int wide_bin_sender(void *ctx, const mbp_train_io *io)
{
	int rc = toy_bin(ctx, io);
	float *extra = (float *)io->din + (size_t)io->rows * N;
	for (uint32_t e = 0; e < io->rows * N; e++)
		extra[e] = stamp(io, e);
	return rc;
}

static void check_stamps(const mbp_train_io *io)
{
	const float *extra = (const float *)io->dout + (size_t)io->rows * N;
	for (uint32_t e = 0; e < io->rows * N; e++)
		if (extra[e] != stamp(io, e))
			atomic_fetch_add(&stamps_bad, 1);
	atomic_fetch_add(&stamps_seen, 1);
}

static int wide_bin_receiver(void *ctx, const mbp_train_io *io)
{
	check_stamps(io);
	return toy_bin(ctx, io);
}

static int wide_bw_receiver(void *ctx, const mbp_train_io *io)
{
	check_stamps(io);
	return toy_bw(ctx, io);
}

START_TEST(a_gradient_wider_than_the_activation_reaches_the_previous_stage_whole)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	float in[40 * N], tg[40 * N];
	struct toy ref[2];
	for (unsigned s = 0; s < 2; s++)
		toy_init(&ref[s], s + 1);
	for (unsigned step = 0; step < 2; step++) {
		make_data(in, tg, 40, step);
		reference_step(ref, 2, in, tg, 40, 5);
	}
	for (size_t k = 0; k < 3; k++)
		for (unsigned threads = 1; threads <= 2; threads++) {
			/* max_mb_rows the step's: the pool's buffers are as small as the wide gradient allows */
			mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
					    .target_row_bytes = N * sizeof(float),
					    .max_mb_rows = 5,
					    .max_mbs = 8,
					    .schedule = kinds[k],
					    .threads = threads,
					    .loss = mse};
			mbp_trainer *t;
			struct toy st[2];
			ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
			toy_init(&st[0], 1);
			toy_init(&st[1], 2);
			mbp_train_stage_desc d0 = toy_desc(&st[0], false), d1 = toy_desc(&st[1], false);
			d0.grad_row_bytes = 2 * N * sizeof(float);
			d0.backward_in = wide_bin_receiver;
			d0.backward_w = wide_bw_receiver;
			d1.backward_in = wide_bin_sender;
			ck_assert_int_eq(mbp_trainer_add_stage(t, &d0), 0);
			ck_assert_int_eq(mbp_trainer_add_stage(t, &d1), 0);
			ck_assert_int_eq(mbp_trainer_start(t), 0);
			atomic_store(&stamps_bad, 0);
			atomic_store(&stamps_seen, 0);
			for (unsigned step = 0; step < 2; step++) {
				make_data(in, tg, 40, step);
				ck_assert_int_eq(mbp_trainer_step(t, in, tg, 40, 5, NULL), 0);
			}
			ck_assert_uint_eq(atomic_load(&stamps_seen),
					  2 * 2 * 8); /* B_in and W, 8 mbs, 2 steps */
			ck_assert_uint_eq(atomic_load(&stamps_bad), 0);
			params_equal(st, ref, 2);
			no_buffer_out(t);
			mbp_trainer_destroy(t);
		}
}
END_TEST

START_TEST(a_last_stage_whose_gradient_is_not_its_output_is_refused)
{
	mbp_train_opts o = {
	    .in_row_bytes = N * sizeof(float), .target_row_bytes = N * sizeof(float), .loss = mse};
	mbp_trainer *t;
	struct toy a, b;
	toy_init(&a, 1);
	toy_init(&b, 2);
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	mbp_train_stage_desc d = toy_desc(&a, false);
	d.grad_row_bytes = (size_t)UINT32_MAX + 1;
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	d.grad_row_bytes = 0; /* 0: the output's width */
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	d = toy_desc(&b, false);
	d.grad_row_bytes = 2 * N * sizeof(float); /* the loss writes rows of the output */
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	start_refused_naming(t, 1);
	mbp_trainer_destroy(t);
}
END_TEST

START_TEST(invalid_arguments_return_documented_errors)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float), .target_row_bytes = 4, .loss = mse};
	mbp_trainer *t;
	mbp_train_opts bad = o;
	bad.loss = NULL;
	ck_assert_int_eq(mbp_trainer_new(&t, &bad), -EINVAL);
	bad = o;
	bad.in_row_bytes = 0;
	ck_assert_int_eq(mbp_trainer_new(&t, &bad), -EINVAL);
	bad = o;
	bad.target_row_bytes = (size_t)UINT32_MAX + 1; /* its products with the row counts must not wrap */
	ck_assert_int_eq(mbp_trainer_new(&t, &bad), -EINVAL);
	bad = o;
	bad.schedule = (mbp_sched_kind)99;
	ck_assert_int_eq(mbp_trainer_new(&t, &bad), -EINVAL);
	ck_assert_int_eq(mbp_trainer_new(NULL, &o), -EINVAL);
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	float in[8] = {0}, tg[8] = {0}; /* a finite step: the last call must succeed */
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 2, 1, NULL), -ENOTCONN);
	ck_assert_int_eq(mbp_trainer_start(t), -EINVAL); /* no stages */
	struct toy a;
	toy_init(&a, 0);
	mbp_train_stage_desc d = toy_desc(&a, false);
	d.forward = NULL;
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	d = toy_desc(&a, false);
	d.backward_w = NULL; /* neither form of backward */
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	d = toy_desc(&a, false);
	d.discard = NULL;
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	d = toy_desc(&a, false);
	d.out_row_bytes = 0;
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	d = toy_desc(&a, false);
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	ck_assert_int_eq(mbp_trainer_start(t), 0);
	ck_assert_int_eq(mbp_trainer_start(t), -EALREADY);
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	ck_assert_int_eq(mbp_trainer_step(t, NULL, tg, 2, 1, NULL), -EINVAL);
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 0, 1, NULL), -EINVAL);
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 2, 0, NULL), -EINVAL);
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 2, 65, NULL), -E2BIG); /* above max_mb_rows (64) */
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 65, 1, NULL), -E2BIG); /* 65 mbs, above max_mbs */
	/* rows + mb_rows - 1 wraps to 0 here: the count of micro-batches must not be rounded up by adding */
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, SIZE_MAX, 2, NULL), -E2BIG);
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, SIZE_MAX - 62, 64, NULL), -E2BIG);
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 2, 1, NULL), 0);	      /* and the next step runs */
	ck_assert_int_eq(mbp_trainer_trace_write(t, "/tmp/x.json"), -EINVAL); /* tracing off */
	ck_assert_int_eq(mbp_trainer_stats_get(NULL, NULL, NULL, 0), -EINVAL);
	mbp_trainer_destroy(t);
	mbp_trainer_destroy(NULL);
}
END_TEST

/* ---- where the trainer's threads run: the pipeline's placement plan ---- */

/* A started trainer of S toy stages, pinned (or not), its thread count left to the plan. */
static mbp_trainer *pinned_trainer(struct toy *st, unsigned S, bool pin)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .pinning = pin ? MBP_PIN_PLAN : MBP_PIN_NONE,
			    .loss = mse};
	mbp_trainer *t;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	for (unsigned s = 0; s < S; s++) {
		toy_init(&st[s], s + 1);
		mbp_train_stage_desc d = toy_desc(&st[s], true);
		ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	}
	ck_assert_int_eq(mbp_trainer_start(t), 0);
	return t;
}

/* The pool is sized from the schedule when a step of a new micro-batch count M first runs: from then on
 * no step allocates a buffer, whatever the timing (train.h's promise), under every schedule, stage count
 * and thread count, and again after M changes. */
START_TEST(the_pool_never_grows_after_the_first_step_of_a_micro_batch_count)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	float in[64 * N], tg[64 * N];
	make_data(in, tg, 64, 3);
	for (size_t k = 0; k < 3; k++)
		for (unsigned S = 1; S <= 4; S++)
			for (unsigned T = 1; T <= S; T++) {
				struct rig r;
				rig_new(&r, S, kinds[k], T, false);
				static const uint32_t mb_rows[] = {8, 4}; /* M = 8, then 16 */
				for (unsigned m = 0; m < 2; m++) {
					mbp_train_stats first, st;
					for (unsigned step = 0; step < 20; step++) {
						/* one slow stage per step lets the others run ahead of it */
						for (unsigned s = 0; s < S; s++)
							r.st[s].sleep_us = s == step % S ? 20 : 0;
						ck_assert_int_eq(
						    mbp_trainer_step(r.t, in, tg, 64, mb_rows[m], NULL), 0);
						mbp_trainer_stats_get(r.t, &st, NULL, 0);
						if (step == 0)
							first = st;
						ck_assert_msg(st.pool.grows == first.pool.grows &&
								  st.pool.allocated == first.pool.allocated,
							      "%s S=%u T=%u M=%u step %u: grew %llu -> %llu",
							      mbp_sched_name(kinds[k]), S, T, 64 / mb_rows[m],
							      step, (unsigned long long)first.pool.allocated,
							      (unsigned long long)st.pool.allocated);
						ck_assert_uint_eq(st.pool.waits, 0);
					}
				}
				no_buffer_out(r.t);
				mbp_trainer_destroy(r.t);
			}
}
END_TEST

/* A step of a micro-batch count seen before allocates nothing on the controlling thread (jemalloc's
 * per-thread count): its bubble_predicted is played in room made with the schedule, where each step
 * replayed the schedule in five fresh allocations. */
START_TEST(a_step_allocates_nothing_on_the_controlling_thread_once_its_schedule_is_built)
{
#ifdef MBP_HAVE_JEMALLOC
	uint64_t *allocated;
	size_t sz = sizeof(allocated);
	ck_assert_int_eq(mallctl("thread.allocatedp", &allocated, &sz, NULL, 0), 0);
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	for (size_t k = 0; k < 3; k++) {
		struct rig r;
		rig_new(&r, 3, kinds[k], 2, false);
		float in[32 * N], tg[32 * N];
		make_data(in, tg, 32, 1);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 32, 4, NULL), 0); /* builds M = 8 */
		int rc[10];
		uint64_t before = *allocated;
		for (unsigned i = 0; i < 10; i++) /* no assertion in between: Check's own may allocate */
			rc[i] = mbp_trainer_step(r.t, in, tg, 32, 4, NULL);
		uint64_t after = *allocated;
		for (unsigned i = 0; i < 10; i++)
			ck_assert_int_eq(rc[i], 0);
		ck_assert_msg(after == before, "%s: %llu bytes allocated over 10 steps",
			      mbp_sched_name(kinds[k]), (unsigned long long)(after - before));
		mbp_train_stats st;
		mbp_trainer_stats_get(r.t, &st, NULL, 0);
		ck_assert(st.bubble_predicted > 0 && st.bubble_predicted < 1); /* still predicted */
		mbp_trainer_destroy(r.t);
	}
#endif
}
END_TEST

/* More threads than stages is refused at start as mbp_schedule_simulate refuses it (no longer started
 * with fewer threads than asked, silently); as many as the stages starts. */
START_TEST(more_threads_than_stages_is_refused_as_the_simulator_refuses_it)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .threads = 8,
			    .loss = mse};
	struct rig r;
	rig_build(&r, 2, &o, false, NULL);
	start_refused_naming(r.t, -1);
	mbp_train_error e;
	mbp_trainer_error(r.t, &e);
	ck_assert_ptr_nonnull(strstr(e.what, "threads"));
	mbp_trainer_destroy(r.t);

	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_1F1B, 2, 4), 0);
	mbp_op_costs c[2] = {{1, 1, 1}, {1, 1, 1}};
	mbp_sched_sim sim;
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, 8, &sim, NULL), -EINVAL);
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, 2, &sim, NULL), 0);
	mbp_schedule_destroy(sc);

	rig_new(&r, 2, MBP_SCHED_1F1B, 2, false);
	mbp_train_stats ts;
	mbp_trainer_stats_get(r.t, &ts, NULL, 0);
	ck_assert_uint_eq(ts.threads, 2);
	mbp_trainer_destroy(r.t);
}
END_TEST

static int copy_rows(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	(void)ctx;
	memcpy(out->data, in->data, (size_t)in->rows * in->row_bytes);
	return 0;
}

/* A zeroed mbp_train_opts with its required fields set runs steps on every default, and the trainer
 * defaults as the pipeline does: pinned per the placement plan (mbp_pipeline_placement, the trainer's
 * stage figures), the same spin budget; MBP_PIN_NONE and MBP_SPIN_NONE mean the same in both too. */
START_TEST(a_zeroed_opts_trainer_runs_and_pins_and_spins_as_the_pipeline_does)
{
	for (int none = 0; none < 2; none++) {
		mbp_opts po = {.in_row_bytes = N * sizeof(float)};
		mbp_train_opts o = {
		    .in_row_bytes = N * sizeof(float), .target_row_bytes = N * sizeof(float), .loss = mse};
		if (none) {
			po.pinning = o.pinning = MBP_PIN_NONE;
			po.spin_ns = o.spin_ns = MBP_SPIN_NONE;
		}
		mbp_pipeline *p;
		ck_assert_int_eq(mbp_pipeline_new(&p, &po), 0);
		for (unsigned s = 0; s < 2; s++) {
			mbp_stage_desc d = {.fn = copy_rows};
			ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
		}
		ck_assert_int_eq(mbp_pipeline_start(p), 0);
		mbp_placement pl[2];
		ck_assert_int_eq(mbp_pipeline_placement(p, pl, 2), 2);
		uint64_t pipeline_spin = p->crew.wopts.no_spin ? 0 : p->crew.wopts.spin_ns;
		bool oversubscribed = p->crew.wopts.no_spin; /* more threads than CPUs: no spin in either */
		ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
		mbp_pipeline_destroy(p);

		struct rig r;
		rig_build(&r, 2, &o, false, NULL);
		ck_assert_int_eq(mbp_trainer_start(r.t), 0);
		float in[16 * N], tg[16 * N];
		make_data(in, tg, 16, 0);
		for (unsigned step = 0; step < 2; step++)
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 16, 4, NULL), 0);
		mbp_train_stage_stats ss[2];
		ck_assert_int_eq(mbp_trainer_stats_get(r.t, NULL, ss, 2), 2);
		for (unsigned s = 0; s < 2; s++) {
			ck_assert_msg((ss[s].cpu >= 0) == !none, "trainer stage %u on cpu %d", s, ss[s].cpu);
			ck_assert_msg((pl[s].cpu >= 0) == !none, "pipeline stage %u on cpu %d", s, pl[s].cpu);
		}
		ck_assert_uint_eq(mbp__trainer_spin_ns(r.t), pipeline_spin);
		ck_assert_uint_eq(pipeline_spin, none || oversubscribed ? 0 : MBP__SPIN_NS_DEFAULT);
		mbp_trainer_destroy(r.t);
	}
	mbp_train_opts bad = {
	    .in_row_bytes = 4, .target_row_bytes = 4, .pinning = (mbp_pin_mode)2, .loss = mse};
	mbp_trainer *t;
	ck_assert_int_eq(mbp_trainer_new(&t, &bad), -EINVAL);
}
END_TEST

/* A pipeline and a trainer of one process take different CPUs while there are enough (on 2 CPUs: a
 * 1-stage pipeline and a 1-stage trainer take CPUs 0 and 1; both took CPU 0), and share the least taken
 * one, saying so, when there are not. */
START_TEST(a_trainer_beside_a_pipeline_takes_the_cpu_the_pipeline_left_free)
{
	int allowed[MBP_MAX_CPUS];
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL);
	ck_assert_int_ge(n, 1);
	mbp_opts po;
	mbp_opts_init(&po);
	po.in_row_bytes = 16;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &po), 0);
	mbp_stage_desc pd = {.fn = copy_rows};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &pd), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_placement pl;
	ck_assert_int_eq(mbp_pipeline_placement(p, &pl, 1), 1);
	ck_assert_int_eq(pl.cpu, allowed[0]);

	struct toy st[1];
	mbp_trainer *t = pinned_trainer(st, 1, true);
	mbp_train_stage_stats ss;
	ck_assert_int_eq(mbp_trainer_stats_get(t, NULL, &ss, 1), 1);
	ck_assert_int_eq(ss.pin_error, 0);
	ck_assert_int_eq(ss.cpu, allowed[n > 1 ? 1 : 0]);
	ck_assert_uint_eq(ss.sharing, n > 1 ? 0 : 1);
	ck_assert_int_eq(mbp_pipeline_placement(p, &pl, 1), 1);
	ck_assert_uint_eq(pl.sharing, n > 1 ? 0 : 1);
	float in[4 * N] = {0.5f}, tg[4 * N] = {0.25f};
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 4, 2, NULL), 0); /* it runs there */
	mbp_trainer_destroy(t);					      /* gives its CPU back */
	ck_assert_uint_eq(mbp__cpu_claims(allowed[n > 1 ? 1 : 0]), n > 1 ? 0 : 1);
	mbp_pipeline_destroy(p);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0);
}
END_TEST

/* Under a cgroup CPU quota (faked: cpu.max of one CPU) the trainer runs as many threads as the plan gives
 * a pipeline: the quota's, not the cpuset's (it ignored the quota). */
START_TEST(a_trainer_under_a_cgroup_quota_runs_the_plans_thread_count)
{
	char file[] = "/tmp/mbp-cpu-max-XXXXXX";
	int fd = mkstemp(file);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "150000 100000\n", 14), 14); /* 1.5 CPUs: rounded up to 2 */
	close(fd);
	mbp__cgroup_cpu_max_set(file);
	struct mbp__placement_req rq = {.nstages = 3, .pin = true, .named = (int[]){-1, -1, -1}};
	struct mbp__placement_plan plan;
	ck_assert_int_eq(mbp__placement_plan(&rq, &plan), 0);
	for (unsigned i = 0; i < plan.nthreads; i++)
		mbp__cpu_release(plan.thread_cpu[i]);
	ck_assert_uint_le(plan.nthreads, 2);
	struct toy st[3];
	mbp_trainer *t = pinned_trainer(st, 3, true);
	mbp_train_stats ts;
	ck_assert_int_eq(mbp_trainer_stats_get(t, &ts, NULL, 0), 3);
	ck_assert_uint_eq(ts.threads, plan.nthreads);
	mbp_trainer_destroy(t);
	/* a quota of one CPU: one thread */
	fd = open(file, O_WRONLY | O_TRUNC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "100000 100000\n", 14), 14);
	close(fd);
	t = pinned_trainer(st, 3, false);
	ck_assert_int_eq(mbp_trainer_stats_get(t, &ts, NULL, 0), 3);
	ck_assert_uint_eq(ts.threads, 1);
	mbp_trainer_destroy(t);
	mbp__cgroup_cpu_max_set(NULL);
	unlink(file);
}
END_TEST

/* A pin that fails in the trainer is reported (cpu -1 and pin_error; it was -1 alone, as if unpinned),
 * and the stage runs unpinned; a pipeline whose pins fail the same way reports every field alike (one
 * report, the crew's). */
START_TEST(a_failed_pin_in_the_trainer_is_reported)
{
	mbp__pin_fail_set(-EPERM);
	struct toy st[2];
	mbp_trainer *t = pinned_trainer(st, 2, true);
	mbp_opts po = {.in_row_bytes = N * sizeof(float)};
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &po), 0);
	for (unsigned s = 0; s < 2; s++)
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &(mbp_stage_desc){.fn = copy_rows}), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp__pin_fail_set(0);
	mbp_train_stage_stats ss[2];
	ck_assert_int_eq(mbp_trainer_stats_get(t, NULL, ss, 2), 2);
	mbp_placement pl[2];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, 2), 2);
	for (unsigned s = 0; s < 2; s++) {
		ck_assert_int_eq(ss[s].cpu, -1);
		ck_assert_int_eq(ss[s].pin_error, -EPERM);
		ck_assert_uint_eq(ss[s].sharing, 0);
		ck_assert_int_eq(pl[s].cpu, ss[s].cpu);
		ck_assert_int_eq(pl[s].pin_error, ss[s].pin_error);
		ck_assert_uint_eq(pl[s].sharing, ss[s].sharing);
		ck_assert_uint_eq(pl[s].thread, ss[s].thread);
	}
	mbp_pipeline_destroy(p);
	float in[4 * N] = {0.5f}, tg[4 * N] = {0.25f};
	ck_assert_int_eq(mbp_trainer_step(t, in, tg, 4, 2, NULL), 0);
	mbp_trainer_destroy(t);
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL), 1);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0); /* given back at the failed pin, not twice */
	/* unpinned: no CPU, no error */
	t = pinned_trainer(st, 2, false);
	ck_assert_int_eq(mbp_trainer_stats_get(t, NULL, ss, 2), 2);
	ck_assert_int_eq(ss[0].cpu, -1);
	ck_assert_int_eq(ss[0].pin_error, 0);
	mbp_trainer_destroy(t);
}
END_TEST

/* ---- the trainer's threads: the crew's rules, the pipeline's ---- */

/* What each stage's init and fini saw: the trainer's stages are toys, found by their place in `probed`. */
static struct toy probed[MBP_MAX_STAGES];
static struct {
	_Atomic unsigned inits, finis;
	int init_err;
	pthread_t init_tid, fini_tid;
	char name[16]; /* its thread's, read in its init */
} probe[MBP_MAX_STAGES];

static int probe_init(void *ctx, unsigned stage)
{
	ck_assert_ptr_eq(ctx, &probed[stage]);
	atomic_fetch_add(&probe[stage].inits, 1);
	probe[stage].init_tid = pthread_self();
	pthread_getname_np(pthread_self(), probe[stage].name, sizeof(probe[stage].name));
	return probe[stage].init_err;
}

static void probe_fini(void *ctx)
{
	unsigned s = (unsigned)((struct toy *)ctx - probed);
	atomic_fetch_add(&probe[s].finis, 1);
	probe[s].fini_tid = pthread_self();
}

static void probed_stage(mbp_train_stage_desc *d, unsigned s)
{
	*d = toy_desc(&probed[s], false);
	d->init = probe_init;
	d->fini = probe_fini;
}

/* A trainer of S probed stages on `threads` threads, the inits returning `err[s]`; its start's result. */
static int probed_start(mbp_trainer **tp, unsigned S, unsigned threads, const int *err)
{
	memset(probe, 0, sizeof(probe));
	for (unsigned s = 0; s < S; s++) {
		toy_init(&probed[s], s + 1);
		probe[s].init_err = err ? err[s] : 0;
	}
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .threads = threads,
			    .pinning = MBP_PIN_NONE,
			    .loss = mse};
	struct rig r;
	rig_build(&r, S, &o, false, probed_stage);
	*tp = r.t;
	return mbp_trainer_start(r.t);
}

/* After a failing init the trainer runs every other init, also those after it on the same thread (it
 * skipped them), and the fini of each one that succeeded, on its thread, as the pipeline does; start
 * returns the first failing stage's error, and a positive one is -EPROTO. */
START_TEST(after_a_failing_init_the_trainer_runs_every_init_and_each_successful_inits_fini)
{
	for (unsigned threads = 1; threads <= 3; threads++) {
		mbp_trainer *t;
		ck_assert_int_eq(probed_start(&t, 3, threads, (const int[]){0, -EIO, 0}), -EIO);
		for (unsigned s = 0; s < 3; s++) {
			ck_assert_msg(probe[s].inits == 1, "threads %u: stage %u: %u inits", threads, s,
				      probe[s].inits);
			ck_assert_uint_eq(probe[s].finis, s == 1 ? 0 : 1);
			if (s != 1)
				ck_assert(pthread_equal(probe[s].init_tid, probe[s].fini_tid));
		}
		ck_assert_int_eq(mbp_trainer_step(t, probed, probed, 4, 2, NULL), -ESHUTDOWN);
		mbp_trainer_destroy(t);
		for (unsigned s = 0; s < 3; s++) /* nothing runs twice at destroy */
			ck_assert_uint_eq(probe[s].finis, s == 1 ? 0 : 1);
	}
	mbp_trainer *t;
	ck_assert_int_eq(probed_start(&t, 2, 1, (const int[]){0, 5}), -EPROTO);
	ck_assert_uint_eq(probe[0].finis, 1);
	mbp_trainer_destroy(t);
	ck_assert_int_eq(probed_start(&t, 2, 2, NULL), 0); /* and all well: each fini once, at destroy */
	ck_assert_uint_eq(probe[0].finis + probe[1].finis, 0);
	mbp_trainer_destroy(t);
	ck_assert_uint_eq(probe[0].finis + probe[1].finis, 2);
}
END_TEST

/* The trainer's threads are named for their stages, as the pipeline's (they had the process's name). */
START_TEST(the_trainers_threads_are_named_for_their_stages)
{
	mbp_trainer *t;
	ck_assert_int_eq(probed_start(&t, 3, 2, NULL), 0); /* stages 0-1 on thread 0, 2 on thread 1 */
	ck_assert_str_eq(probe[0].name, "mbp-train-0-1");
	ck_assert_str_eq(probe[1].name, "mbp-train-0-1");
	ck_assert_str_eq(probe[2].name, "mbp-train-2");
	mbp_trainer_destroy(t);
}
END_TEST

/* The trainer's trace comes from the pipeline's writer: the same header and process row, each stage's row
 * labelled "<stage> <name> (cpu <cpu>)" with the CPU its statistics give, each operation with its
 * micro-batch and stage as args. */
START_TEST(the_trainers_trace_has_the_pipelines_header_rows_and_args)
{
	struct rig r;
	rig_new(&r, 2, MBP_SCHED_1F1B, 2, false);
	float in[8 * N], tg[8 * N];
	make_data(in, tg, 8, 0);
	ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 8, 4, NULL), 0);
	static char buf[65536];
	trace_text(r.t, buf, sizeof(buf));
	ck_assert_msg(
	    strncmp(buf,
		    "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":"
		    "\"M\",\"pid\":1,\"args\":{\"name\":\"mbpipe\"}}",
		    95) == 0,
	    "%.120s", buf);
	mbp_train_stage_stats ss[2];
	ck_assert_int_eq(mbp_trainer_stats_get(r.t, NULL, ss, 2), 2);
	for (unsigned s = 0; s < 2; s++) {
		char label[64];
		snprintf(label, sizeof(label), "\"args\":{\"name\":\"%u stage%u (cpu %d)\"}", s, s,
			 ss[s].cpu);
		ck_assert_msg(strstr(buf, label) != NULL, "no row %s", label);
	}
	ck_assert_ptr_nonnull(strstr(buf, "\"name\":\"F1\",\"cat\":\"F\",\"ph\":\"X\""));
	ck_assert_ptr_nonnull(strstr(buf, "\"args\":{\"mb\":1,\"stage\":1}"));
	mbp_trainer_destroy(r.t);
}
END_TEST

/* ---- replicas ---- */

static const unsigned *rep_counts; /* the replicas of each stage, for rig_build's edit */

static void replicated(mbp_train_stage_desc *d, unsigned s)
{
	d->replicas = rep_counts[s];
}

/* S toy stages with `reps` replicas each under `kind` (`custom`: its schedule, or NULL), started. */
static void rig_replicas_of(struct rig *r, unsigned S, const unsigned *reps, mbp_sched_kind kind,
			    const mbp_schedule *custom)
{
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .max_mb_rows = 16,
			    .max_mbs = 32,
			    .schedule = kind,
			    .custom = custom,
			    .trace_events = 512,
			    .loss = mse};
	rep_counts = reps;
	rig_build(r, S, &o, false, replicated);
	int rc = mbp_trainer_start(r->t);
	ck_assert_msg(rc == 0, "%s: %s", mbp_sched_name(kind), mbp_strerror(rc));
}

static void rig_replicas(struct rig *r, unsigned S, const unsigned *reps, mbp_sched_kind kind)
{
	rig_replicas_of(r, S, reps, kind, NULL);
}

/* One step of a rig with replicas (plan p of a test under `kind`) on `rows` rows in micro-batches of 4,
 * and of the sequential reference `ref`: the loss and every stage's parameters bit for bit; norm[s], the
 * norm each stage's update was given, recorded (p == 0: no replicas) or checked (the checks and grad_sq
 * saw every replica's gradient). */
static void replicated_step(struct rig *r, struct toy *ref, size_t rows, unsigned step, double *norm,
			    mbp_sched_kind kind, size_t p)
{
	float in[32 * N], tg[32 * N];
	make_data(in, tg, rows, step);
	double loss = -1, want = reference_step(ref, r->S, in, tg, rows, 4);
	int rc = mbp_trainer_step(r->t, in, tg, rows, 4, &loss);
	ck_assert_msg(rc == 0, "%s plan %zu step %u: %s", mbp_sched_name(kind), p, step, mbp_strerror(rc));
	ck_assert_msg(loss == want, "%s plan %zu step %u: loss", mbp_sched_name(kind), p, step);
	for (unsigned s = 0; s < r->S; s++) {
		ck_assert_msg(memcmp(r->st[s].w, ref[s].w, sizeof(ref[s].w)) == 0 &&
				  memcmp(r->st[s].b, ref[s].b, sizeof(ref[s].b)) == 0,
			      "%s plan %zu step %u: stage %u's parameters differ", mbp_sched_name(kind), p,
			      step, s);
		if (p == 0)
			norm[s] = r->st[s].last_norm;
		else
			ck_assert_msg(r->st[s].last_norm == norm[s],
				      "%s plan %zu step %u: stage %u's norm %.17g, not %.17g",
				      mbp_sched_name(kind), p, step, s, r->st[s].last_norm, norm[s]);
	}
}

/* The figures of the last step of M micro-batches, per replica: each ran its micro-batches (j mod r), the
 * stage's sums them; no buffer allocated since `ps` (taken after the first step of this count). */
static void replica_figures(struct rig *r, const unsigned *reps, uint32_t M, const mbp_train_stats *ps)
{
	mbp_train_stats ts;
	mbp_train_stage_stats ss[MBP_MAX_STAGES], rs[MBP_TRAIN_MAX_REPLICAS];
	ck_assert_int_eq(mbp_trainer_stats_get(r->t, &ts, ss, r->S), (int)r->S);
	ck_assert_uint_eq(ts.pool.allocated, ps->pool.allocated);
	ck_assert_uint_eq(ts.act_pool.allocated, ps->act_pool.allocated);
	ck_assert(ts.bubble_predicted >= 0 && ts.bubble_predicted < 1);
	const mbp_schedule *sc = mbp_trainer_schedule(r->t);
	/* the predicted bubble is the replicas' play (mbp_schedule_simulate_replicas) with the measured mean
	 * costs, as summarise() takes them (the toy recomputes nothing) */
	mbp_op_costs c[MBP_MAX_STAGES];
	bool replicated = mbp_schedule_threads(sc) > 0;
	for (unsigned s = 0; s < r->S; s++) {
		const mbp_train_stage_stats *x = &ss[s];
		replicated |= reps[s] > 1;
		c[s].f = x->f_count ? (double)x->f_ns / x->f_count : 0;
		bool apart = x->bin_count && x->w_count;
		c[s].b_in = apart	 ? (double)x->bin_ns / x->bin_count
			    : x->b_count ? (double)x->b_ns / x->b_count
					 : 0;
		c[s].b_w = apart ? (double)x->w_ns / x->w_count : 0;
	}
	mbp_sched_sim sim;
	ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, reps, &sim, NULL), 0);
	if (replicated) /* (else the plain play on the trainer's threads) */
		ck_assert_msg(ts.bubble_predicted == sim.bubble, "bubble_predicted %.17g, the play %.17g",
			      ts.bubble_predicted, sim.bubble);
	for (unsigned s = 0; s < r->S; s++) {
		ck_assert_uint_eq(ss[s].f_count, M);
		ck_assert_uint_le(ss[s].held_peak, mbp_schedule_held_peak(sc, s) * reps[s]);
		ck_assert_int_eq(mbp_trainer_replica_stats_get(r->t, s, rs, MBP_TRAIN_MAX_REPLICAS),
				 (int)reps[s]);
		for (unsigned q = 0; q < reps[s]; q++)
			ck_assert_uint_eq(rs[q].f_count, (M - q + reps[s] - 1) / reps[s]);
	}
	no_buffer_out(r->t);
}

START_TEST(replicated_stages_give_the_parameters_of_one_replica_bit_for_bit_under_every_schedule)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1,
					       MBP_SCHED_ZBH2};
	/* replicas 1, 2 and 3 of a middle stage, of the ends, of every stage; 3 on 2 CPUs */
	static const unsigned plans[][3] = {{1, 1, 1}, {1, 2, 1}, {1, 3, 1}, {2, 1, 3}, {2, 2, 2}};
	double norm[3][3]; /* per step and stage, without replicas: the norm the updates were given */
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++)
		for (size_t p = 0; p < MBP_ARRAY_SIZE(plans); p++) {
			struct rig r;
			rig_replicas(&r, 3, plans[p], kinds[k]);
			r.st[1].sleep_us = p == 2 ? 50 : 0; /* another interleaving of the replicas */
			struct toy ref[3];
			for (unsigned s = 0; s < 3; s++)
				toy_init(&ref[s], s + 1);
			mbp_train_stats ps;
			for (unsigned step = 0; step < 3; step++) {
				if (step ==
				    2) /* a micro-batch count seen before: the pools are reserved already */
					mbp_trainer_stats_get(r.t, &ps, NULL, 0);
				/* 6 and 8 micro-batches, short last ones */
				replicated_step(&r, ref, step == 1 ? 30 : 22, step, norm[step], kinds[k], p);
			}
			mbp_train_stats ts;
			ck_assert_int_eq(mbp_trainer_stats_get(r.t, &ts, NULL, 0), 3);
			if (p > 0) /* a thread per replica */
				ck_assert_uint_eq(ts.threads, plans[p][0] + plans[p][1] + plans[p][2]);
			replica_figures(&r, plans[p], 6, &ps);
			mbp_trainer_destroy(r.t);
		}
}
END_TEST

START_TEST(replicated_threads_give_the_parameters_of_one_replica_under_chunked_built_and_custom_schedules)
{
	/* a replica is a copy of a thread (train.h, "Replicas"): the chunks of one thread replicated
	 * together, alike (1,2,1,2 under the interleaved placement, 1,2,2,1 under the V) or not (one chunk
	 * of a thread replicated, the other not), 3 copies on 2 CPUs */
	static const mbp_sched_kind kinds[] = {MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS, MBP_SCHED_ZBV,
					       MBP_SCHED_DUALPIPEV,   MBP_SCHED_AUTO,	    MBP_SCHED_CUSTOM};
	static const unsigned plans[][4] = {
	    {1, 1, 1, 1}, {1, 2, 1, 2}, {1, 2, 2, 1}, {2, 1, 1, 1}, {2, 3, 3, 2}};
	char text[1024];
	size_t text_len = custom_text(text, sizeof(text));
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++) {
		unsigned S = kinds[k] == MBP_SCHED_CUSTOM ? 3 : 4;
		double norm[3][4]; /* per step and stage, without replicas */
		for (size_t p = 0; p < MBP_ARRAY_SIZE(plans); p++) {
			mbp_schedule *own = NULL;
			if (kinds[k] == MBP_SCHED_CUSTOM) {
				ck_assert_int_eq(mbp_schedule_read_csv(&own, text, text_len, 0, NULL), 0);
			} else if (kinds[k] == MBP_SCHED_AUTO) {
				mbp_op_costs c[4] = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
				mbp_sched_build b = {
				    .stages = 4, .mbs = 8, .threads = 2, .costs = c, .split = true};
				ck_assert_int_eq(mbp_schedule_build(&own, &b), 0);
			}
			struct rig r;
			rig_replicas_of(&r, S, plans[p], kinds[k], own);
			mbp_schedule_destroy(own);	    /* the trainer has its copy */
			r.st[1].sleep_us = p == 4 ? 50 : 0; /* another interleaving of the replicas */
			struct toy ref[4];
			for (unsigned s = 0; s < S; s++)
				toy_init(&ref[s], s + 1);
			mbp_train_stats ps;
			for (unsigned step = 0; step < 3; step++) {
				if (step == 1) /* the first step of its count reserved the pools */
					mbp_trainer_stats_get(r.t, &ps, NULL, 0);
				replicated_step(&r, ref, 30, step, norm[step], kinds[k], p); /* 8 mbs */
			}
			/* the threads: per thread of the schedule the most replicas of its chunks; each
			 * replica ran its micro-batches (j mod r); no buffer allocated after the first step */
			const mbp_schedule *sc = mbp_trainer_schedule(r.t);
			unsigned copies[4] = {0}, want_threads = 0;
			for (unsigned s = 0; s < S; s++) {
				unsigned th = mbp_schedule_thread_of(sc, s, 0);
				copies[th] = plans[p][s] > copies[th] ? plans[p][s] : copies[th];
			}
			for (unsigned th = 0; th < mbp_schedule_threads(sc); th++)
				want_threads += copies[th];
			mbp_train_stats ts;
			ck_assert_int_eq(mbp_trainer_stats_get(r.t, &ts, NULL, 0), (int)S);
			ck_assert_uint_eq(ts.threads, want_threads);
			replica_figures(&r, plans[p], 8, &ps);
			mbp_trainer_destroy(r.t);
		}
	}
}
END_TEST

/* ---- the end-of-step work by pieces (train.h, "Replicas") ---- */

/* The toy's in N + 1 pieces: the rows of its weights, then its biases (the same arithmetic as toy_update
 * element by element). fail_kind TOY_FAIL_CHECK: the check of the range that holds the last piece
 * refuses (on the last replica). */
enum { TOY_PIECES = N + 1 };

static void toy_piece(struct toy *t, size_t p, float **w, float **g)
{
	*w = p < N ? t->w + p * N : t->b;
	*g = p < N ? t->gw + p * N : t->gb;
}

static int toy_check_pieces(void *ctx, size_t begin, size_t end, double *sq)
{
	struct toy *t = ctx;
	for (size_t p = begin; p < end; p++) {
		float *w, *g;
		toy_piece(t, p, &w, &g);
		sq[p - begin] = 0;
		for (int i = 0; i < N; i++)
			sq[p - begin] += (double)g[i] * g[i];
	}
	return t->fail_kind == TOY_FAIL_CHECK && end == TOY_PIECES ? -EIO : 0;
}

static pthread_t toy_upd_by[3][TOY_PIECES]; /* the thread that last updated each piece of stages 0-2 */
static struct toy *toy_upd_st[3];	    /* those stages' toys, for it */

static int toy_update_pieces(void *ctx, const mbp_train_update *u, size_t begin, size_t end)
{
	(void)u;
	struct toy *t = ctx;
	for (unsigned s = 0; s < 3; s++)
		for (size_t p = begin; toy_upd_st[s] == t && p < end; p++)
			toy_upd_by[s][p] = pthread_self();
	for (size_t p = begin; p < end; p++) {
		float *w, *g;
		toy_piece(t, p, &w, &g);
		for (int i = 0; i < N; i++)
			w[i] -= LR * g[i];
		memset(g, 0, N * sizeof(float));
	}
	/* TOY_FAIL_UPDATE: the range that holds the last piece refuses after its check accepted */
	return t->fail_kind == TOY_FAIL_UPDATE && end == TOY_PIECES ? -EIO : 0;
}

static void toy_discard_pieces(void *ctx, size_t begin, size_t end)
{
	struct toy *t = ctx;
	for (size_t p = begin; p < end; p++) {
		float *w, *g;
		toy_piece(t, p, &w, &g);
		memset(g, 0, N * sizeof(float));
	}
}

static void toy_update_end(void *ctx, const mbp_train_update *u)
{
	struct toy *t = ctx;
	t->last_norm = u->grad_norm;
	t->last_loss = u->loss;
	t->updates++;
}

static void pieced(mbp_train_stage_desc *d, unsigned s)
{
	replicated(d, s);
	d->check = NULL;
	d->grad_sq = NULL;
	d->update = NULL;
	d->discard = NULL;
	d->pieces = TOY_PIECES;
	d->check_pieces = toy_check_pieces;
	d->update_pieces = toy_update_pieces;
	d->discard_pieces = toy_discard_pieces;
	d->update_end = toy_update_end;
}

/* Stages whose check, norm and update go by pieces, on 1, 2, 3 and 6 replicas (each a range of the 5
 * pieces, or none), under GPipe, 1F1B and ZB-H1: the parameters of the sequential reference bit for bit, the norm
 * the same for every replica count, update_end once a step. A check refused on the last replica's range
 * fails the step: no stage updated, every range's gradient discarded; an update refused there breaks
 * the trainer and runs no update_end. Pieces without their callbacks
 * are refused; with them, update and discard may be left out. */
START_TEST(updates_by_pieces_on_replicas_run_once_a_step_and_give_the_parameters_of_one_thread)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	/* 6 replicas of 5 pieces: two of them have none (ranges k * 5 / 6 .. (k + 1) * 5 / 6) */
	static const unsigned plans[][3] = {{1, 1, 1}, {1, 2, 1}, {1, 3, 1}, {2, 1, 3}, {1, 6, 1}};
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .max_mb_rows = 16,
			    .max_mbs = 32,
			    .loss = mse};
	double norm[3][3]; /* per step and stage, on one replica each */
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++)
		for (size_t p = 0; p < MBP_ARRAY_SIZE(plans); p++) {
			struct rig r;
			o.schedule = kinds[k];
			rep_counts = plans[p];
			rig_build(&r, 3, &o, false, pieced);
			ck_assert_int_eq(mbp_trainer_start(r.t), 0);
			struct toy ref[3];
			for (unsigned s = 0; s < 3; s++)
				toy_init(&ref[s], s + 1);
			for (unsigned step = 0; step < 3; step++)
				replicated_step(&r, ref, 22, step, norm[step], kinds[k], p);
			for (unsigned s = 0; s < 3; s++)
				ck_assert_uint_eq(r.st[s].updates, 3);
			/* a refusal on the last replica's range */
			struct toy before[3];
			float in[22 * N], tg[22 * N];
			make_data(in, tg, 22, 9);
			memcpy(before, r.st, sizeof(before));
			r.st[1].fail_kind = TOY_FAIL_CHECK;
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 22, 4, NULL), -EIO);
			mbp_train_error e;
			mbp_trainer_error(r.t, &e);
			ck_assert_int_eq(e.stage, 1);
			ck_assert_int_eq(e.op, MBP_OP_UPDATE);
			static const float zero[N * N];
			for (unsigned s = 0; s < 3; s++) {
				ck_assert(memcmp(r.st[s].w, before[s].w, sizeof(before[s].w)) == 0);
				ck_assert(memcmp(r.st[s].b, before[s].b, sizeof(before[s].b)) == 0);
				ck_assert_uint_eq(r.st[s].updates, 3);
				ck_assert(memcmp(r.st[s].gw, zero, sizeof(r.st[s].gw)) == 0);
				ck_assert(memcmp(r.st[s].gb, zero, sizeof(r.st[s].gb)) == 0);
			}
			r.st[1].fail_kind = -1;
			double scratch[3]; /* (a step after the failure: its norm recorded, not checked) */
			replicated_step(&r, ref, 22, 0, scratch, kinds[k], 0);
			no_buffer_out(r.t);
			/* an update that refuses after its check accepted breaks the trainer: that step did not
			 * succeed, so no stage's update_end runs (its step count stays) */
			r.st[1].fail_kind = TOY_FAIL_UPDATE;
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 22, 4, NULL), -ENOTRECOVERABLE);
			for (unsigned s = 0; s < 3; s++)
				ck_assert_uint_eq(r.st[s].updates, 4);
			mbp_trainer_destroy(r.t);
		}
	mbp_trainer *t;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	struct toy toy;
	toy_init(&toy, 1);
	mbp_train_stage_desc d = toy_desc(&toy, false);
	pieced(&d, 0);
	d.replicas = 2;
	d.check_pieces = NULL;
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	d.check_pieces = toy_check_pieces;
	d.discard_pieces = NULL;
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	d = toy_desc(&toy, false);
	d.update = NULL;
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), -EINVAL);
	pieced(&d, 0);
	ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	mbp_trainer_destroy(t);
}
END_TEST

/* Where every stage goes by pieces and none is replicated, the end of the step is shared by all threads:
 * 3 stages of 5 pieces on 2 threads (stages 0 and 1 on thread 0), the 15 pieces in stage order cut in
 * two, so the second thread updates some of stage 1's pieces besides stage 2's; the parameters are the
 * sequential reference's bit for bit, under GPipe, 1F1B and ZB-H1. */
START_TEST(a_stage_by_pieces_shares_its_update_with_a_thread_that_holds_fewer_pieces)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	static const unsigned ones[] = {1, 1, 1};
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .max_mb_rows = 16,
			    .max_mbs = 32,
			    .threads = 2,
			    .loss = mse};
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++) {
		struct rig r;
		o.schedule = kinds[k];
		rep_counts = ones;
		rig_build(&r, 3, &o, false, pieced);
		ck_assert_int_eq(mbp_trainer_start(r.t), 0);
		struct toy ref[3];
		double norm[3];
		for (unsigned s = 0; s < 3; s++) {
			toy_init(&ref[s], s + 1);
			toy_upd_st[s] = &r.st[s];
		}
		for (unsigned step = 0; step < 2; step++)
			replicated_step(&r, ref, 22, step, norm, kinds[k], 0);
		/* stage 0's 5 pieces and 2 of stage 1's on one thread, the other 3 and stage 2's on the other */
		for (size_t p = 0; p < TOY_PIECES; p++) {
			ck_assert(pthread_equal(toy_upd_by[0][p], toy_upd_by[0][0]));
			ck_assert(pthread_equal(toy_upd_by[2][p], toy_upd_by[2][0]));
			ck_assert(pthread_equal(toy_upd_by[1][p], toy_upd_by[p < 2 ? 0 : 2][0]));
		}
		ck_assert(!pthread_equal(toy_upd_by[0][0], toy_upd_by[2][0]));
		for (unsigned s = 0; s < 3; s++) {
			ck_assert_uint_eq(r.st[s].updates, 2);
			toy_upd_st[s] = NULL;
		}
		mbp_trainer_destroy(r.t);
	}
}
END_TEST

START_TEST(a_single_stage_on_replicas_trains_as_one_thread_does)
{
	/* the whole model replicated (data parallelism): no ring at all, only the ordered merge */
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	float in[30 * N], tg[30 * N];
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++)
		for (unsigned reps = 2; reps <= 3; reps++) {
			struct rig r;
			rig_replicas(&r, 1, (unsigned[]){reps}, kinds[k]);
			struct toy ref;
			toy_init(&ref, 1);
			for (unsigned step = 0; step < 3; step++) {
				make_data(in, tg, 30, step);
				double loss = -1, want = reference_step(&ref, 1, in, tg, 30, 4);
				ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 30, 4, &loss), 0);
				ck_assert(loss == want);
				params_equal(r.st, &ref, 1);
			}
			no_buffer_out(r.t);
			mbp_trainer_destroy(r.t);
		}
}
END_TEST

START_TEST(a_failure_inside_a_replica_fails_the_step_and_no_stage_updates)
{
	/* interleaved: the 3 chunks on one thread, copied twice for stage 1 */
	static const mbp_sched_kind kinds[] = {MBP_SCHED_1F1B, MBP_SCHED_ZBH1, MBP_SCHED_INTERLEAVED};
	static const unsigned reps[3] = {1, 2, 1};
	static const int ops[] = {MBP_OP_F, MBP_OP_BIN, MBP_OP_W};
	float in[24 * N], tg[24 * N];
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++)
		for (size_t o = 0; o < MBP_ARRAY_SIZE(ops); o++) {
			struct rig r;
			rig_replicas(&r, 3, reps, kinds[k]);
			struct toy before[3];
			memcpy(before, r.st, sizeof(before));
			r.st[1].fail_kind = ops[o];
			r.st[1].fail_mb = 3; /* replica 1's */
			make_data(in, tg, 24, 1);
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 24, 4, NULL), -EIO);
			mbp_train_error e;
			ck_assert_int_eq(mbp_trainer_error(r.t, &e), 0);
			ck_assert_int_eq(e.stage, 1);
			ck_assert_int_eq(e.mb, 3);
			/* under 1F1B and interleaved the weight part runs inside B */
			ck_assert_int_eq(e.op, kinds[k] != MBP_SCHED_ZBH1 && ops[o] != MBP_OP_F ? MBP_OP_B
												: ops[o]);
			for (unsigned s = 0; s < 3; s++) {
				ck_assert_uint_eq(r.st[s].updates, 0);
				ck_assert(memcmp(r.st[s].w, before[s].w, sizeof(before[s].w)) == 0);
			}
			no_buffer_out(r.t);
			/* the next step runs normally, as the reference's first */
			r.st[1].fail_kind = -1;
			for (unsigned s = 0; s < 3; s++)
				toy_init(&before[s], s + 1);
			double want = reference_step(before, 3, in, tg, 24, 4), loss = -1;
			ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 24, 4, &loss), 0);
			ck_assert(loss == want);
			for (unsigned s = 0; s < 3; s++)
				ck_assert(memcmp(r.st[s].w, before[s].w, sizeof(before[s].w)) == 0);
			mbp_trainer_destroy(r.t);
		}
}
END_TEST

START_TEST(cancel_and_drain_mid_step_hold_with_replicas)
{
	static const unsigned reps[3] = {1, 2, 1};
	float in[64 * N], tg[64 * N];
	make_data(in, tg, 64, 0);
	for (int arm = 0; arm < 4; arm++) {
		bool drain = arm & 1; /* and arms 2, 3: the chunks of one thread (interleaved), copied */
		struct rig r;
		rig_replicas(&r, 3, reps, arm < 2 ? MBP_SCHED_1F1B : MBP_SCHED_INTERLEAVED);
		for (unsigned s = 0; s < 3; s++)
			r.st[s].sleep_us = 300;
		struct toy ref[3];
		for (unsigned s = 0; s < 3; s++)
			toy_init(&ref[s], s + 1);
		struct later l = {r.t, &r.st[1], 5, drain};
		pthread_t th;
		pthread_create(&th, NULL, stop_later, &l);
		/* a cancel fails the step with nothing updated (a replica parked for its turn wakes too); a
		 * drain lets it finish as one replica would */
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 4, NULL), drain ? 0 : -ECANCELED);
		pthread_join(th, NULL);
		if (drain)
			reference_step(ref, 3, in, tg, 64, 4);
		params_equal(r.st, ref, 3);
		no_buffer_out(r.t);
		ck_assert_int_eq(mbp_trainer_step(r.t, in, tg, 64, 4, NULL), -ESHUTDOWN);
		mbp_trainer_destroy(r.t);
	}
}
END_TEST

START_TEST(replicas_take_a_thread_each_by_the_placement_rule_and_refuse_other_counts)
{
	static const unsigned reps[4] = {1, 2, 1, 1};
	mbp_train_opts o = {.in_row_bytes = N * sizeof(float),
			    .target_row_bytes = N * sizeof(float),
			    .schedule = MBP_SCHED_INTERLEAVED,
			    .loss = mse};
	struct rig r;
	rep_counts = reps;
	/* a chunked schedule: `threads` is its own, copied per replica (thread 1 of chunks 1 and 3 twice) */
	rig_build(&r, 4, &o, false, replicated);
	ck_assert_int_eq(mbp_trainer_start(r.t), 0);
	mbp_train_stats st;
	ck_assert_int_eq(mbp_trainer_stats_get(r.t, &st, NULL, 0), 4);
	ck_assert_uint_eq(st.threads, 3);
	mbp_trainer_destroy(r.t);
	o.threads = 3; /* the replicas' sum is no thread count of the placement */
	rig_build(&r, 4, &o, false, replicated);
	ck_assert_int_eq(mbp_trainer_start(r.t), -EINVAL);
	mbp_train_error e;
	ck_assert_int_eq(mbp_trainer_error(r.t, &e), 0);
	ck_assert_ptr_nonnull(e.what);
	ck_assert_ptr_nonnull(strstr(e.what, "threads"));
	mbp_trainer_destroy(r.t);
	o.threads = 0;
	o.schedule = MBP_SCHED_1F1B;
	o.threads = 4; /* one short of a thread per replica */
	rig_build(&r, 4, &o, false, replicated);
	ck_assert_int_eq(mbp_trainer_start(r.t), -EINVAL);
	mbp_trainer_destroy(r.t);
	o.threads = 5;
	rig_build(&r, 4, &o, false, replicated);
	ck_assert_int_eq(mbp_trainer_start(r.t), 0);
	mbp_trainer_destroy(r.t);
	/* more than MBP_TRAIN_MAX_REPLICAS */
	ck_assert_int_eq(mbp_trainer_new(&r.t, &o), 0);
	toy_init(&r.st[0], 1);
	mbp_train_stage_desc d = toy_desc(&r.st[0], false);
	d.replicas = MBP_TRAIN_MAX_REPLICAS + 1;
	ck_assert_int_eq(mbp_trainer_add_stage(r.t, &d), -EINVAL);
	mbp_trainer_destroy(r.t);
}
END_TEST

START_TEST(the_simulator_plays_replicas_with_the_ordered_merge)
{
	mbp_schedule *sc, *one_sc, *two_sc;
	unsigned one[2] = {1, 1}, two[2] = {1, 2};
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_1F1B, 2, 8), 0);
	ck_assert_int_eq(mbp_schedule_new_replicated(&one_sc, MBP_SCHED_1F1B, 2, 8, one), 0);
	ck_assert_int_eq(mbp_schedule_new_replicated(&two_sc, MBP_SCHED_1F1B, 2, 8, two), 0);
	/* replicas of 1: the published lists */
	const mbp_sched_op *a_ops, *b_ops;
	size_t n = mbp_schedule_order(sc, &a_ops);
	ck_assert_uint_eq(mbp_schedule_order(one_sc, &b_ops), n);
	ck_assert(memcmp(a_ops, b_ops, n * sizeof(*a_ops)) == 0);
	/* two replicas of stage 1: stage 0 runs one forward more ahead, one for each of them */
	ck_assert_uint_eq(mbp_schedule_stash_peak(sc, 0), 2);
	ck_assert_uint_eq(mbp_schedule_stash_peak(two_sc, 0), 3);
	mbp_op_costs c[2] = {{1, 1, 1}, {3, 3, 3}};
	mbp_sched_sim a, b, d;
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, 0, &a, NULL), 0);
	ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, one, &b, NULL), 0);
	ck_assert(a.makespan == b.makespan && a.bubble == b.bubble); /* the plain play */
	ck_assert_int_eq(mbp_schedule_simulate_replicas(two_sc, c, two, &d, NULL), 0);
	/* the heavy stage's 72 units on two threads, its weight parts (24) one at a time: 42 against 75 */
	ck_assert(d.makespan < 0.6 * a.makespan);
	ck_assert(d.busy == a.busy);
	ck_assert(d.bubble == 1.0 - d.busy / (3 * d.makespan));
	/* weight parts as long as the rest: their chain (8 x 6 = 48) binds */
	mbp_op_costs w[2] = {{1, 1, 1}, {1, 1, 6}};
	ck_assert_int_eq(mbp_schedule_simulate_replicas(two_sc, w, two, &d, NULL), 0);
	ck_assert(d.makespan >= 48);
	unsigned many[2] = {1, MBP_TRAIN_MAX_REPLICAS + 1};
	ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, many, &d, NULL), -EINVAL);
	mbp_schedule_destroy(sc);
	mbp_schedule_destroy(two_sc);
	mbp_schedule_destroy(one_sc);
	ck_assert_int_eq(mbp_schedule_new_replicated(&sc, MBP_SCHED_ZBV, 2, 8, one), -EINVAL);
}
END_TEST

START_TEST(the_simulator_plays_the_copies_of_a_chunked_schedules_threads)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS, MBP_SCHED_ZBV,
					       MBP_SCHED_DUALPIPEV};
	for (size_t k = 0; k < MBP_ARRAY_SIZE(kinds); k++) {
		mbp_schedule *sc;
		ck_assert_int_eq(mbp_schedule_new_placed(&sc, kinds[k], 4, 8, 2), 0);
		/* thread 1's chunks three times the others' cost */
		unsigned one[4] = {1, 1, 1, 1}, heavy[4], t1[4], many[4] = {1, 16, 16, 16};
		mbp_op_costs c[4];
		for (unsigned s = 0; s < 4; s++) {
			bool on1 = mbp_schedule_thread_of(sc, s, 0) == 1;
			c[s] = on1 ? (mbp_op_costs){3, 3, 1} : (mbp_op_costs){1, 1, 1};
			heavy[s] = on1 ? 2 : 1;
			t1[s] = on1 ? 3 : 1;
		}
		mbp_sched_sim a, b, d;
		ck_assert_int_eq(mbp_schedule_simulate(sc, c, 0, &a, NULL), 0);
		ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, one, &b, NULL), 0);
		ck_assert(a.makespan == b.makespan && a.bubble == b.bubble); /* the plain play */
		/* the heavy thread on 2 and 3 copies: the same work, sooner, on 3 and 4 threads */
		ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, heavy, &d, NULL), 0);
		/* (train.h: 1.85x, 1.9x, 1.6x and 1.6x, no forward more ahead) */
		ck_assert_msg(1.5 * d.makespan < a.makespan, "%s: %g against %g", mbp_sched_name(kinds[k]),
			      d.makespan, a.makespan);
		ck_assert(d.busy == a.busy);
		ck_assert(d.bubble == 1.0 - d.busy / (3 * d.makespan));
		double two = d.makespan;
		ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, t1, &d, NULL), 0);
		ck_assert(d.makespan <= two && d.bubble == 1.0 - d.busy / (4 * d.makespan));
		/* 16 copies of each thread (32 lists) play; a 17th replica of a stage is refused */
		ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, many, &d, NULL), 0);
		many[0] = MBP_TRAIN_MAX_REPLICAS + 1;
		ck_assert_int_eq(mbp_schedule_simulate_replicas(sc, c, many, &d, NULL), -EINVAL);
		mbp_schedule_destroy(sc);
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("train");
	TCase *tc = tcase_create("train");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, toy_pipeline_gradients_equal_a_sequential_reference);
	tcase_add_test(tc, every_schedule_and_thread_count_gives_identical_parameters);
	tcase_add_test(tc, a_chunked_schedule_refuses_a_thread_count_it_cannot_place);
	tcase_add_test(tc, stages_over_ranks_follow_the_block_rule_or_the_chunked_schedules_threads);
	tcase_add_test(tc, the_parts_votes_make_one_decision_with_the_lowest_failing_stages_error);
	tcase_add_test(tc, a_schedule_read_from_text_trains_bit_for_bit);
	tcase_add_test(tc, stash_high_water_marks_equal_the_schedules_figures);
	tcase_add_test(tc, hops_between_stages_of_one_thread_pass_locally_as_the_schedule_counts_them);
	tcase_add_test(
	    tc, a_chunk_failing_while_items_wait_in_a_local_slot_leaks_nothing_and_the_next_step_is_exact);
	tcase_add_test(tc, zbh1_refuses_a_stage_without_split_backward);
	tcase_add_test(tc, injected_failure_at_any_operation_leaves_every_parameter_unchanged);
	tcase_add_test(tc, non_finite_loss_fails_the_step_with_edom);
	tcase_add_test(tc, non_finite_gradient_norm_fails_the_step_before_any_update);
	tcase_add_test(tc, a_refusing_check_fails_the_step_before_any_stage_updates);
	tcase_add_test(tc, an_update_that_refuses_after_its_check_breaks_the_trainer_and_says_so);
	tcase_add_test(tc, cancel_mid_step_fails_it_with_nothing_updated_and_refuses_later_steps);
	tcase_add_test(tc, drain_mid_step_lets_it_finish_then_refuses_later_steps);
	tcase_add_test(tc, trace_shows_forward_backward_and_weight_operations_as_distinct_events);
	tcase_add_test(tc, events_of_a_step_follow_each_stages_schedule_list_in_time_order);
	tcase_add_test(tc, a_gradient_wider_than_the_activation_reaches_the_previous_stage_whole);
	tcase_add_test(tc, a_last_stage_whose_gradient_is_not_its_output_is_refused);
	tcase_add_test(tc, invalid_arguments_return_documented_errors);
	tcase_add_test(tc, more_threads_than_stages_is_refused_as_the_simulator_refuses_it);
	tcase_add_test(tc, a_zeroed_opts_trainer_runs_and_pins_and_spins_as_the_pipeline_does);
	tcase_add_test(tc, the_pool_never_grows_after_the_first_step_of_a_micro_batch_count);
	tcase_add_test(tc, a_step_allocates_nothing_on_the_controlling_thread_once_its_schedule_is_built);
	tcase_add_test(tc, a_trainer_beside_a_pipeline_takes_the_cpu_the_pipeline_left_free);
	tcase_add_test(tc, a_trainer_under_a_cgroup_quota_runs_the_plans_thread_count);
	tcase_add_test(tc, a_failed_pin_in_the_trainer_is_reported);
	tcase_add_test(tc, after_a_failing_init_the_trainer_runs_every_init_and_each_successful_inits_fini);
	tcase_add_test(tc, the_trainers_threads_are_named_for_their_stages);
	tcase_add_test(tc, the_trainers_trace_has_the_pipelines_header_rows_and_args);
	tcase_add_test(tc,
		       replicated_stages_give_the_parameters_of_one_replica_bit_for_bit_under_every_schedule);
	tcase_add_test(
	    tc,
	    replicated_threads_give_the_parameters_of_one_replica_under_chunked_built_and_custom_schedules);
	tcase_add_test(tc, a_single_stage_on_replicas_trains_as_one_thread_does);
	tcase_add_test(tc,
		       updates_by_pieces_on_replicas_run_once_a_step_and_give_the_parameters_of_one_thread);
	tcase_add_test(tc, a_stage_by_pieces_shares_its_update_with_a_thread_that_holds_fewer_pieces);
	tcase_add_test(tc, a_failure_inside_a_replica_fails_the_step_and_no_stage_updates);
	tcase_add_test(tc, cancel_and_drain_mid_step_hold_with_replicas);
	tcase_add_test(tc, replicas_take_a_thread_each_by_the_placement_rule_and_refuse_other_counts);
	tcase_add_test(tc, the_simulator_plays_replicas_with_the_ordered_merge);
	tcase_add_test(tc, the_simulator_plays_the_copies_of_a_chunked_schedules_threads);
	suite_add_tcase(s, tc);
	return s;
}

/*
 * Schedules: the published stage lists, one global order they are projections of, the stash and held
 * figures, and the bubble the player predicts.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbpipe.h>

#include "check_main.h"
#include "schedule.h"

/* A stage's list as text: "F0 F1 B0 ..." (b: B_in, W: weight gradient). */
static void list_text(const mbp_schedule *sc, unsigned s, char *buf, size_t cap)
{
	const mbp_sched_op *ops;
	size_t n = mbp_schedule_stage_ops(sc, s, &ops);
	size_t k = 0;
	buf[0] = 0;
	for (size_t i = 0; i < n && k < cap; i++)
		k += (size_t)snprintf(buf + k, cap - k, "%s%c%u", i ? " " : "", "FBbW"[ops[i].kind],
				      ops[i].mb);
}

static void expect_list(mbp_sched_kind kind, unsigned S, unsigned M, unsigned s, const char *want)
{
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new(&sc, kind, S, M), 0);
	char got[1024];
	list_text(sc, s, got, sizeof(got));
	ck_assert_msg(strcmp(got, want) == 0, "%s S=%u M=%u stage %u:\n got  %s\n want %s",
		      mbp_sched_name(kind), S, M, s, got, want);
	mbp_schedule_destroy(sc);
}

START_TEST(stage_lists_match_the_published_orders)
{
	/* GPipe: all forwards, then all backwards */
	expect_list(MBP_SCHED_GPIPE, 2, 3, 0, "F0 F1 F2 B0 B1 B2");
	expect_list(MBP_SCHED_GPIPE, 2, 3, 1, "F0 F1 F2 B0 B1 B2");
	/* 1F1B (PipeDream-Flush, DeepSpeed's TrainSchedule), S = 4, M = 6: S - s - 1 warm-up forwards */
	expect_list(MBP_SCHED_1F1B, 4, 6, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
	expect_list(MBP_SCHED_1F1B, 4, 6, 1, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
	expect_list(MBP_SCHED_1F1B, 4, 6, 2, "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
	expect_list(MBP_SCHED_1F1B, 4, 6, 3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
	/* fewer micro-batches than the warm-up wants */
	expect_list(MBP_SCHED_1F1B, 4, 2, 0, "F0 F1 B0 B1");
	/* ZB-H1, S = 3, M = 4: 1F1B with B_in for B; stage s defers its first s weight
	 * gradients, runs each later one right after a B_in, the deferred ones at the end */
	expect_list(MBP_SCHED_ZBH1, 3, 4, 0, "F0 F1 F2 b0 W0 F3 b1 W1 b2 W2 b3 W3");
	expect_list(MBP_SCHED_ZBH1, 3, 4, 1, "F0 F1 b0 F2 b1 W0 F3 b2 W1 b3 W2 W3");
	expect_list(MBP_SCHED_ZBH1, 3, 4, 2, "F0 b0 F1 b1 F2 b2 W0 F3 b3 W1 W2 W3");
}
END_TEST

/* Index of (kind class, stage, mb) in the global order; kind class: 0 forward, 1 input backward (B or
 * B_in), 2 weight (B or W). */
static long find(const mbp_sched_op *ops, size_t n, unsigned cls, unsigned s, unsigned j)
{
	for (size_t i = 0; i < n; i++) {
		if (ops[i].stage != s || ops[i].mb != j)
			continue;
		unsigned k = ops[i].kind;
		if ((cls == 0 && k == MBP_OP_F) || (cls == 1 && (k == MBP_OP_B || k == MBP_OP_BIN)) ||
		    (cls == 2 && (k == MBP_OP_B || k == MBP_OP_W)))
			return (long)i;
	}
	return -1;
}

START_TEST(global_order_is_topological_and_stage_lists_are_its_projections)
{
	mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	for (size_t ki = 0; ki < 3; ki++)
		for (unsigned S = 1; S <= 8; S++)
			for (unsigned M = 1; M <= 3 * S + 1; M += (M < 4 ? 1 : 3)) {
				mbp_schedule *sc;
				ck_assert_int_eq(mbp_schedule_new(&sc, kinds[ki], S, M), 0);
				const mbp_sched_op *g;
				size_t n = mbp_schedule_order(sc, &g);
				ck_assert_uint_eq(n, (size_t)S * M * (kinds[ki] == MBP_SCHED_ZBH1 ? 3 : 2));
				for (unsigned s = 0; s < S; s++)
					for (unsigned j = 0; j < M; j++) {
						long f = find(g, n, 0, s, j), b = find(g, n, 1, s, j),
						     w = find(g, n, 2, s, j);
						ck_assert(f >= 0 && b >= 0 && w >= 0);
						ck_assert(f < b && b <= w);
						if (s > 0)
							ck_assert(find(g, n, 0, s - 1, j) < f);
						if (s + 1 < S)
							ck_assert(find(g, n, 1, s + 1, j) < b);
					}
				/* projection: the stage's ops in global order are its list */
				for (unsigned s = 0; s < S; s++) {
					const mbp_sched_op *l;
					size_t ln = mbp_schedule_stage_ops(sc, s, &l), k = 0;
					for (size_t i = 0; i < n; i++)
						if (g[i].stage == s) {
							ck_assert_uint_lt(k, ln);
							ck_assert(memcmp(&g[i], &l[k], sizeof(*l)) == 0);
							k++;
						}
					ck_assert_uint_eq(k, ln);
				}
				mbp_schedule_destroy(sc);
			}
}
END_TEST

START_TEST(stash_and_held_peaks_are_the_schedules_figures)
{
	for (unsigned S = 1; S <= 8; S++)
		for (unsigned M = 1; M <= 20; M++) {
			mbp_schedule *g, *o, *z;
			ck_assert_int_eq(mbp_schedule_new(&g, MBP_SCHED_GPIPE, S, M), 0);
			ck_assert_int_eq(mbp_schedule_new(&o, MBP_SCHED_1F1B, S, M), 0);
			ck_assert_int_eq(mbp_schedule_new(&z, MBP_SCHED_ZBH1, S, M), 0);
			for (unsigned s = 0; s < S; s++) {
				unsigned one = S - s < M ? S - s : M;
				ck_assert_uint_eq(mbp_schedule_stash_peak(g, s), M);
				ck_assert_uint_eq(mbp_schedule_held_peak(g, s), M);
				ck_assert_uint_eq(mbp_schedule_stash_peak(o, s), one);
				ck_assert_uint_eq(mbp_schedule_held_peak(o, s), one);
				ck_assert_uint_eq(mbp_schedule_stash_peak(z, s), one);
				ck_assert_uint_eq(mbp_schedule_held_peak(z, s), S < M ? S : M);
			}
			mbp_schedule_destroy(g);
			mbp_schedule_destroy(o);
			mbp_schedule_destroy(z);
		}
}
END_TEST

static double sim_bubble(mbp_sched_kind kind, unsigned S, unsigned M, mbp_op_costs c, unsigned T)
{
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new(&sc, kind, S, M), 0);
	mbp_op_costs costs[MBP_MAX_STAGES];
	for (unsigned s = 0; s < S; s++)
		costs[s] = c;
	mbp_sched_sim r;
	ck_assert_int_eq(mbp_schedule_simulate(sc, costs, T, &r, NULL), 0);
	mbp_schedule_destroy(sc);
	return r.bubble;
}

START_TEST(simulated_bubbles_match_the_closed_forms)
{
	mbp_op_costs eq = {1, 1, 1};
	for (unsigned S = 2; S <= 8; S *= 2)
		for (unsigned M = S; M <= 8 * S; M *= 2) {
			double gp = (double)(S - 1) / (M + S - 1); /* GPipe and 1F1B: (S-1)/(M+S-1) */
			ck_assert_double_eq_tol(sim_bubble(MBP_SCHED_GPIPE, S, M, eq, 0), gp, 1e-12);
			ck_assert_double_eq_tol(sim_bubble(MBP_SCHED_1F1B, S, M, eq, 0), gp, 1e-12);
			/* ZB-H1 with F = B_in = W: makespan 3M + S - 1, a bubble of (S-1)/(3M+S-1) */
			double zb = (double)(S - 1) / (3.0 * M + S - 1);
			ck_assert_double_eq_tol(sim_bubble(MBP_SCHED_ZBH1, S, M, eq, 0), zb, 1e-12);
			ck_assert(zb < gp / 2); /* about a third */
		}
	/* one thread runs everything: no bubble */
	ck_assert_double_eq_tol(sim_bubble(MBP_SCHED_1F1B, 4, 8, eq, 1), 0, 1e-12);
	/* B_w free: ZB-H1 has nothing to move, its bubble is 1F1B's */
	mbp_op_costs now = {1, 2, 0};
	ck_assert_double_eq_tol(sim_bubble(MBP_SCHED_ZBH1, 4, 8, now, 0),
				sim_bubble(MBP_SCHED_1F1B, 4, 8, now, 0), 1e-12);
}
END_TEST

START_TEST(simulate_gives_each_operation_its_start)
{
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_GPIPE, 2, 2), 0);
	mbp_op_costs c[2] = {{1, 1, 1}, {1, 1, 1}};
	double start[8];
	mbp_sched_sim r;
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, 2, &r, start), 0);
	const mbp_sched_op *g;
	size_t n = mbp_schedule_order(sc, &g);
	ck_assert_uint_eq(n, 8);
	ck_assert_double_eq(r.makespan, 9); /* F F, F F shifted by 1, B B (2 each) back up */
	for (size_t i = 1; i < n; i++)
		ck_assert(start[i] >= start[i - 1]); /* the global order is the order of start times */
	mbp_schedule_destroy(sc);
}
END_TEST

/* ---- chunks: the placed schedules ---- */

static const mbp_sched_kind every_kind[] = {MBP_SCHED_GPIPE,	   MBP_SCHED_1F1B,	 MBP_SCHED_ZBH1,
					    MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS, MBP_SCHED_ZBH2,
					    MBP_SCHED_ZBV,	   MBP_SCHED_DUALPIPEV};

static bool kind_is_block(mbp_sched_kind k)
{
	return k == MBP_SCHED_GPIPE || k == MBP_SCHED_1F1B || k == MBP_SCHED_ZBH1 || k == MBP_SCHED_ZBH2;
}

/* Thread t's list in PyTorch's action notation: "0F0 3I1 3W1 2B0" (I: B_in). */
static void thread_text(const mbp_schedule *sc, unsigned T, unsigned t, char *buf, size_t cap)
{
	const mbp_sched_op *g;
	size_t n = mbp_schedule_order(sc, &g), k = 0;
	buf[0] = 0;
	for (size_t i = 0; i < n && k < cap; i++)
		if (mbp_schedule_thread_of(sc, g[i].stage, T) == t)
			k += (size_t)snprintf(buf + k, cap - k, "%s%u%c%u", k ? " " : "", g[i].stage,
					      "FBIW"[g[i].kind], g[i].mb);
}

static void expect_thread(mbp_sched_kind kind, unsigned S, unsigned M, unsigned T, unsigned t,
			  const char *want)
{
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new_placed(&sc, kind, S, M, T), 0);
	char got[2048];
	thread_text(sc, T, t, got, sizeof(got));
	ck_assert_msg(strcmp(got, want) == 0, "%s S=%u M=%u T=%u thread %u:\n got  %s\n want %s",
		      mbp_sched_name(kind), S, M, T, t, got, want);
	mbp_schedule_destroy(sc);
}

START_TEST(chunked_thread_lists_match_the_published_orders)
{
	/* interleaved 1F1B (Megatron-LM; PyTorch's ScheduleInterleaved1F1B), p = 2, v = 2, M = 4: rounds of
	 * p micro-batches through chunk 0 (stage t) then chunk 1 (stage 2 + t); thread t warms up with
	 * (v - 1) * p + 2 (p - 1 - t) forwards; the backwards take the chunks in reverse */
	expect_thread(MBP_SCHED_INTERLEAVED, 4, 4, 2, 0,
		      "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
	expect_thread(MBP_SCHED_INTERLEAVED, 4, 4, 2, 1,
		      "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
	/* looped BFS: every micro-batch through a chunk, then the next; backwards in micro-batch order */
	expect_thread(MBP_SCHED_LOOPED_BFS, 4, 2, 2, 1, "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1");
	/* ZB-V (PyTorch's ScheduleZBVZeroBubble), p = 2, M = 4: thread 0 holds chunks 0 and 3, warms up with
	 * 2p - 1 forwards of chunk 0, then chunk 3's F, I, W, then F0 I0 W0 F3 I3 W3 in turn */
	expect_thread(MBP_SCHED_ZBV, 4, 4, 2, 0,
		      "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 "
		      "0W2 0I3 0W3");
}
END_TEST

/* Every rule a schedule keeps, checked from its global order alone. */
static void check_valid(const mbp_schedule *sc, unsigned T)
{
	unsigned S = mbp_schedule_stages(sc), M = mbp_schedule_mbs(sc);
	const mbp_sched_op *g;
	size_t n = mbp_schedule_order(sc, &g);
	long at[MBP_MAX_STAGES][3][64];
	memset(at, -1, sizeof(at));
	unsigned next[MBP_MAX_STAGES][3] = {{0}};
	for (size_t i = 0; i < n; i++) {
		unsigned s = g[i].stage, j = g[i].mb, k = g[i].kind;
		ck_assert_uint_lt(s, S);
		ck_assert_uint_lt(j, M);
		int cls = k == MBP_OP_F ? 0 : k == MBP_OP_W ? 2 : 1;
		/* once, in micro-batch order (which keeps the weight gradients bit for bit) */
		ck_assert_uint_eq(next[s][cls]++, j);
		at[s][cls][j] = (long)i;
		if (k == MBP_OP_B) {
			ck_assert_uint_eq(next[s][2]++, j);
			at[s][2][j] = (long)i;
		}
		/* dependencies come earlier */
		if (cls == 0 && s > 0)
			ck_assert(at[s - 1][0][j] >= 0 && at[s - 1][0][j] < (long)i);
		if (cls == 1)
			ck_assert(s + 1 < S ? at[s + 1][1][j] >= 0 : at[s][0][j] >= 0);
		if (k == MBP_OP_W)
			ck_assert(at[s][1][j] >= 0 && at[s][1][j] < (long)i);
	}
	for (unsigned s = 0; s < S; s++)
		for (int c = 0; c < 3; c++)
			ck_assert_uint_eq(next[s][c], M); /* none missing */
	/* stage lists: projections of the global order */
	for (unsigned s = 0; s < S; s++) {
		const mbp_sched_op *l;
		size_t ln = mbp_schedule_stage_ops(sc, s, &l), k = 0;
		for (size_t i = 0; i < n; i++)
			if (g[i].stage == s)
				ck_assert(k < ln && memcmp(&g[i], &l[k++], sizeof(*l)) == 0);
		ck_assert_uint_eq(k, ln);
	}
	/* the placement rule */
	mbp_sched_kind kind = mbp_schedule_kind(sc);
	for (unsigned s = 0; s < S; s++) {
		unsigned want = kind == MBP_SCHED_INTERLEAVED || kind == MBP_SCHED_LOOPED_BFS ? s % T
				: kind == MBP_SCHED_ZBV || kind == MBP_SCHED_DUALPIPEV
				    ? (s < T ? s : 2 * T - 1 - s)
				    : s * T / S;
		ck_assert_uint_eq(mbp_schedule_thread_of(sc, s, T), want);
	}
}

START_TEST(every_schedule_is_valid_with_any_chunk_and_thread_count)
{
	for (size_t k = 0; k < MBP_ARRAY_SIZE(every_kind); k++)
		for (unsigned p = 1; p <= 6; p++)
			for (unsigned v = 1; v <= 4; v++)
				for (unsigned M = 1; M <= 24; M++) {
					mbp_sched_kind kind = every_kind[k];
					bool block = kind_is_block(kind),
					     vee = kind == MBP_SCHED_ZBV || kind == MBP_SCHED_DUALPIPEV;
					if ((block && v > 1) || (vee && v != 2) || p * v > 16)
						continue;
					unsigned S = p * v;
					mbp_schedule *sc;
					int rc = mbp_schedule_new_placed(&sc, kind, S, M, block ? 0 : p);
					if (kind == MBP_SCHED_DUALPIPEV && M < S) {
						ck_assert_int_eq(rc, -EINVAL); /* documented: M >= stages */
						continue;
					}
					ck_assert_msg(rc == 0, "%s p=%u v=%u M=%u: %d", mbp_sched_name(kind),
						      p, v, M, rc);
					check_valid(sc, p);
					if (block)
						check_valid(sc, 1); /* any thread count */
					ck_assert_uint_eq(mbp_schedule_threads(sc), block ? 0 : p);
					mbp_schedule_destroy(sc);
				}
}
END_TEST

/* check_valid's rules but the placement (a built schedule places its own way) */
static void check_valid_ops(const mbp_schedule *sc)
{
	unsigned S = mbp_schedule_stages(sc), M = mbp_schedule_mbs(sc);
	const mbp_sched_op *g;
	size_t n = mbp_schedule_order(sc, &g);
	unsigned next[MBP_MAX_STAGES][3] = {{0}};
	bool fdone[MBP_MAX_STAGES][64] = {{false}}, bdone[MBP_MAX_STAGES][64] = {{false}};
	for (size_t i = 0; i < n; i++) {
		unsigned s = g[i].stage, j = g[i].mb, k = g[i].kind;
		int cls = k == MBP_OP_F ? 0 : k == MBP_OP_W ? 2 : 1;
		ck_assert_uint_eq(next[s][cls]++, j);
		if (k == MBP_OP_B)
			ck_assert_uint_eq(next[s][2]++, j);
		if (cls == 0)
			ck_assert(s == 0 || fdone[s - 1][j]);
		if (cls == 1)
			ck_assert(s + 1 < S ? bdone[s + 1][j] : fdone[s][j]);
		if (cls == 2)
			ck_assert(bdone[s][j]);
		(cls == 0 ? fdone : bdone)[s][j] |= cls != 2;
	}
	for (unsigned s = 0; s < S; s++)
		for (int c = 0; c < 3; c++)
			ck_assert_uint_eq(next[s][c], M);
}

static unsigned thread_held(const mbp_schedule *sc, unsigned T, unsigned t, bool stash)
{
	mbp_sched_thread_figures f;
	ck_assert_int_eq(mbp_schedule_thread_figures(sc, T, t, &f), 0);
	return stash ? f.stash_peak : f.held_peak;
}

START_TEST(thread_peaks_are_the_documented_figures)
{
	for (unsigned p = 1; p <= 6; p++)
		for (unsigned M = 2 * p; M <= 20; M++) {
			mbp_schedule *one, *zbv, *il, *bfs;
			ck_assert_int_eq(mbp_schedule_new(&one, MBP_SCHED_1F1B, p, M), 0);
			ck_assert_int_eq(mbp_schedule_new_placed(&zbv, MBP_SCHED_ZBV, 2 * p, M, p), 0);
			ck_assert_int_eq(mbp_schedule_new_placed(&il, MBP_SCHED_INTERLEAVED, 2 * p, M, p), 0);
			ck_assert_int_eq(mbp_schedule_new_placed(&bfs, MBP_SCHED_LOOPED_BFS, 2 * p, M, p), 0);
			unsigned most_zbv = 0;
			for (unsigned t = 0; t < p; t++) {
				/* ZB-V holds at most what 1F1B's stage 0 does: p micro-batches of a stage, two
				 * chunks each */
				ck_assert_uint_le(thread_held(zbv, p, t, false), 2 * p);
				most_zbv = thread_held(zbv, p, t, false) > most_zbv
					       ? thread_held(zbv, p, t, false)
					       : most_zbv;
				/* looped BFS: every micro-batch of both chunks */
				ck_assert_uint_eq(thread_held(bfs, p, t, true), 2 * M);
				/* interleaved: its warm-up and one more */
				unsigned per = M / (M / p), rounds = M / p;
				unsigned warm = per + (M % rounds ? 1 : 0) + 2 * (p - 1 - t);
				ck_assert_uint_eq(thread_held(il, p, t, true),
						  warm + 1 < 2 * M ? warm + 1 : 2 * M);
			}
			ck_assert_uint_eq(most_zbv,
					  2 * thread_held(one, p, 0, false)); /* the same as 1F1B's */
			mbp_schedule_destroy(one);
			mbp_schedule_destroy(zbv);
			mbp_schedule_destroy(il);
			mbp_schedule_destroy(bfs);
		}
	/* ZB-H2 holds up to 2S - 1 at stage 0, about twice 1F1B's S */
	mbp_schedule *h2;
	ck_assert_int_eq(mbp_schedule_new(&h2, MBP_SCHED_ZBH2, 4, 16), 0);
	ck_assert_uint_eq(mbp_schedule_held_peak(h2, 0), 7);
	mbp_schedule_destroy(h2);
}
END_TEST

START_TEST(hops_between_chunks_of_one_thread_are_local)
{
	/* ZB-V: chunks p - 1 and p meet on thread p - 1: its hops between them (M forwards, M input
	 * gradients) stay there; every other hop goes to another thread */
	for (unsigned p = 1; p <= 4; p++) {
		mbp_schedule *sc;
		unsigned M = 8;
		ck_assert_int_eq(mbp_schedule_new_placed(&sc, MBP_SCHED_ZBV, 2 * p, M, p), 0);
		unsigned hops = 0, local = 0;
		for (unsigned t = 0; t < p; t++) {
			mbp_sched_thread_figures f;
			ck_assert_int_eq(mbp_schedule_thread_figures(sc, p, t, &f), 0);
			ck_assert_uint_eq(f.local_hops, t == p - 1 ? 2 * M : 0);
			hops += f.hops;
			local += f.local_hops;
		}
		ck_assert_uint_eq(hops + local, 2 * (2 * p - 1) * M); /* 2p - 1 links, both ways */
		mbp_schedule_destroy(sc);
	}
	/* 1F1B of 4 stages on 2 threads: stages 0-1 and 2-3 share a thread */
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_1F1B, 4, 8), 0);
	mbp_sched_thread_figures f;
	ck_assert_int_eq(mbp_schedule_thread_figures(sc, 2, 0, &f), 0);
	ck_assert_uint_eq(f.local_hops, 16);
	ck_assert_uint_eq(f.hops, 8);
	ck_assert_int_eq(mbp_schedule_thread_figures(sc, 3, 3, &f), -EINVAL);
	mbp_schedule_destroy(sc);
}
END_TEST

static double chunk_bubble(mbp_sched_kind kind, unsigned S, unsigned M, unsigned T)
{
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new_placed(&sc, kind, S, M, kind_is_block(kind) ? 0 : T), 0);
	mbp_op_costs c[MBP_MAX_STAGES];
	for (unsigned s = 0; s < S; s++) /* a thread's work per micro-batch is the same in every layout */
		c[s] = (mbp_op_costs){(double)T / S, (double)T / S, (double)T / S};
	mbp_sched_sim r;
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, T, &r, NULL), 0);
	mbp_schedule_destroy(sc);
	return r.bubble;
}

START_TEST(predicted_bubbles_are_ordered_as_the_targets_say)
{
	/* F = B_in = B_w; 1F1B, ZB-H1 and ZB-H2 with one stage per thread, the chunked ones with two */
	for (unsigned p = 2; p <= 8; p *= 2)
		for (unsigned M = 2 * p; M <= 8 * p; M *= 2) {
			double one = chunk_bubble(MBP_SCHED_1F1B, p, M, p);
			double il = chunk_bubble(MBP_SCHED_INTERLEAVED, 2 * p, M, p);
			double bfs = chunk_bubble(MBP_SCHED_LOOPED_BFS, 2 * p, M, p);
			double zbv = chunk_bubble(MBP_SCHED_ZBV, 2 * p, M, p);
			double dpv = chunk_bubble(MBP_SCHED_DUALPIPEV, 2 * p, M, p);
			double h1 = chunk_bubble(MBP_SCHED_ZBH1, p, M, p);
			double h2 = chunk_bubble(MBP_SCHED_ZBH2, p, M, p);
			ck_assert_msg(il <= 0.6 * one, "p=%u M=%u interleaved %g 1f1b %g", p, M, il, one);
			ck_assert_double_le_tol(bfs, il, 1e-12); /* the same bubble, at M times the memory */
			ck_assert_msg(zbv <= 0.25 * one, "p=%u M=%u zbv %g 1f1b %g", p, M, zbv, one);
			ck_assert_double_le_tol(dpv, zbv, 1e-12);
			/* ZB-H1 already reaches the least bubble one stage a thread allows with these costs (the
			 * last stage starts after S - 1 forwards: (S-1)/(3M+S-1)), so ZB-H2 can only equal it */
			ck_assert_double_eq_tol(h2, (double)(p - 1) / (3.0 * M + p - 1), 1e-12);
			ck_assert_double_le_tol(h2, h1, 1e-12);
			ck_assert(h1 < one / 2);
		}
	/* the configuration: 2 threads, M = 8 */
	double one = chunk_bubble(MBP_SCHED_1F1B, 2, 8, 2);
	ck_assert(chunk_bubble(MBP_SCHED_INTERLEAVED, 4, 8, 2) <= 0.55 * one);
	ck_assert(chunk_bubble(MBP_SCHED_ZBV, 4, 8, 2) <= 0.25 * one);
}
END_TEST

/* ---- built from costs ---- */

static double makespan_of(const mbp_schedule *sc, const mbp_op_costs *c, unsigned T)
{
	mbp_sched_sim r;
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, T, &r, NULL), 0);
	return r.makespan;
}

START_TEST(the_built_schedule_plays_no_slower_than_any_fixed_one_at_its_held_limit)
{
	unsigned seed = 12345;
	unsigned beat = 0, tries = 0;
	for (unsigned round = 0; round < 60; round++) {
		unsigned T = 2 + round % 2, S = round % 3 == 0 ? T : 2 * T, M = 4 + 2 * (round % 5);
		unsigned limit = round % 4 == 0 ? 0 : S + round % 3;
		mbp_op_costs c[MBP_MAX_STAGES];
		double f = 0.5 + rand_r(&seed) % 100 / 40.0, bi = 0.5 + rand_r(&seed) % 100 / 40.0,
		       bw = 0.5 + rand_r(&seed) % 100 / 40.0;
		for (unsigned s = 0; s < S; s++) /* the same triple, each stage a little off it */
			c[s] = (mbp_op_costs){f * (1 + s % 3 * 0.05), bi, bw * (1 + s % 2 * 0.1)};
		mbp_sched_build b = {
		    .stages = S, .mbs = M, .threads = T, .costs = c, .held_limit = limit, .split = true};
		mbp_schedule *sc;
		ck_assert_int_eq(mbp_schedule_build(&sc, &b), 0);
		ck_assert_int_eq(mbp_schedule_kind(sc), MBP_SCHED_AUTO);
		check_valid_ops(sc);
		double mine = makespan_of(sc, c, T);
		for (unsigned t = 0; limit && t < T; t++)
			ck_assert_uint_le(thread_held(sc, T, t, false), limit);
		for (size_t k = 0; k < MBP_ARRAY_SIZE(every_kind); k++) {
			mbp_schedule *x;
			if (mbp_schedule_new_placed(&x, every_kind[k], S, M,
						    kind_is_block(every_kind[k]) ? 0 : T) < 0)
				continue;
			bool fits = true;
			for (unsigned t = 0; limit && t < T; t++)
				fits &= thread_held(x, T, t, false) <= limit;
			if (fits) {
				double theirs = makespan_of(x, c, T);
				ck_assert_msg(mine <= theirs * (1 + 1e-9), "round %u: auto %g, %s %g", round,
					      mine, mbp_sched_name(every_kind[k]), theirs);
				tries++;
				beat += mine < theirs * (1 - 1e-9);
			}
			mbp_schedule_destroy(x);
		}
		mbp_schedule_destroy(sc);
	}
	ck_assert_uint_gt(tries, 100);
	ck_assert_uint_gt(beat, tries / 2); /* strictly better than most */
	/* the triples on 2 threads, M = 8, at 1F1B's memory on chunks (4 per thread) */
	static const mbp_op_costs triples[] = {{1, 2, 1}, {2, 1, 1}, {1, 1, 2}};
	for (size_t i = 0; i < 3; i++) {
		mbp_op_costs c[4] = {triples[i], triples[i], triples[i], triples[i]};
		mbp_sched_build b = {
		    .stages = 4, .mbs = 8, .threads = 2, .costs = c, .held_limit = 4, .split = true};
		mbp_schedule *sc, *v;
		ck_assert_int_eq(mbp_schedule_build(&sc, &b), 0);
		ck_assert_int_eq(mbp_schedule_new_placed(&v, MBP_SCHED_ZBV, 4, 8, 2), 0);
		ck_assert(makespan_of(sc, c, 2) <= makespan_of(v, c, 2));
		mbp_schedule_destroy(sc);
		mbp_schedule_destroy(v);
	}
	/* refusals */
	mbp_op_costs c[2] = {{1, 1, 1}, {-1, 1, 1}};
	mbp_sched_build b = {.stages = 2, .mbs = 4, .threads = 2, .costs = c, .split = true};
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_build(&sc, &b), -EINVAL);
	c[1].f = 1;
	b.threads = 3;
	ck_assert_int_eq(mbp_schedule_build(&sc, &b), -EINVAL);
	b.threads = 2;
	b.held_limit = 0;
	ck_assert_int_eq(mbp_schedule_build(NULL, &b), -EINVAL);
}
END_TEST

/* ---- schedules as text ---- */

START_TEST(every_schedule_written_as_csv_reads_back_the_same)
{
	for (size_t k = 0; k < MBP_ARRAY_SIZE(every_kind); k++)
		for (unsigned p = 1; p <= 4; p++)
			for (unsigned M = 1; M <= 9; M += 4) {
				mbp_sched_kind kind = every_kind[k];
				bool block = kind_is_block(kind);
				unsigned S = block ? p + 1 : 2 * p;
				mbp_schedule *sc, *back;
				if (mbp_schedule_new_placed(&sc, kind, S, M, block ? 0 : p) < 0)
					continue; /* DualPipeV with M < S */
				size_t need = mbp_schedule_write_csv(sc, p, NULL, 0);
				char *text = malloc(need + 1);
				ck_assert_uint_eq(mbp_schedule_write_csv(sc, p, text, need + 1), need);
				ck_assert_uint_eq(strlen(text), need);
				mbp_sched_text_error e;
				ck_assert_msg(mbp_schedule_read_csv(&back, text, need, 0, &e) == 0,
					      "%s: line %u %s: %s", mbp_sched_name(kind), e.line, e.action,
					      e.what);
				ck_assert_int_eq(mbp_schedule_kind(back), MBP_SCHED_CUSTOM);
				ck_assert_uint_eq(mbp_schedule_stages(back), S);
				ck_assert_uint_eq(mbp_schedule_mbs(back), M);
				ck_assert_uint_eq(mbp_schedule_threads(back), p);
				for (unsigned s = 0; s < S; s++) {
					ck_assert_uint_eq(mbp_schedule_thread_of(back, s, 0),
							  mbp_schedule_thread_of(sc, s, p));
					ck_assert_uint_eq(mbp_schedule_held_peak(back, s),
							  mbp_schedule_held_peak(sc, s));
					const mbp_sched_op *x, *y;
					size_t nx = mbp_schedule_stage_ops(sc, s, &x),
					       ny = mbp_schedule_stage_ops(back, s, &y);
					ck_assert(nx == ny && memcmp(x, y, nx * sizeof(*x)) == 0);
				}
				/* and the same text again */
				char *again = malloc(need + 1);
				ck_assert_uint_eq(mbp_schedule_write_csv(back, 0, again, need + 1), need);
				ck_assert_str_eq(again, text);
				free(again);
				free(text);
				mbp_schedule_destroy(back);
				mbp_schedule_destroy(sc);
			}
}
END_TEST

START_TEST(pytorchs_csv_reads_with_bubbles_and_overlapped_pairs)
{
	/* PyTorch's _dump_csv writes an empty cell for a bubble, and DualPipeV's overlapped pairs */
	static const char text[] = "0F0,0F1,,0B0,(0F2;0B1)OVERLAP_F_B,0B2\r\n"
				   ",1F0,1B0,1F1,1I1,1W1,1F2 , 1I2,1W2\n";
	mbp_schedule *sc;
	mbp_sched_text_error e;
	ck_assert_msg(mbp_schedule_read_csv(&sc, text, strlen(text), 0, &e) == 0, "line %u col %u %s: %s",
		      e.line, e.column, e.action, e.what);
	ck_assert_uint_eq(mbp_schedule_stages(sc), 2);
	ck_assert_uint_eq(mbp_schedule_mbs(sc), 3);
	check_valid(sc, 2);
	char got[256];
	list_text(sc, 0, got, sizeof(got));
	ck_assert_str_eq(got, "F0 F1 B0 F2 B1 B2");
	list_text(sc, 1, got, sizeof(got));
	ck_assert_str_eq(got, "F0 B0 F1 b1 W1 F2 b2 W2");
	mbp_schedule_destroy(sc);
}
END_TEST

/* The text is refused naming line `line`, column `col` (0: any) and `action`, saying `what` (a part). */
static void expect_refused(const char *text, unsigned limit, unsigned line, unsigned col, const char *action,
			   const char *what)
{
	mbp_schedule *sc = (mbp_schedule *)1;
	mbp_sched_text_error e;
	ck_assert_int_eq(mbp_schedule_read_csv(&sc, text, strlen(text), limit, &e), -EINVAL);
	ck_assert_ptr_null(sc);
	ck_assert_msg(e.line == line && (col == 0 || e.column == col) && strcmp(e.action, action) == 0 &&
			  strstr(e.what, what),
		      "%s: line %u column %u action '%s': %s", text, e.line, e.column, e.action, e.what);
}

START_TEST(a_bad_schedule_is_refused_naming_its_line_and_action)
{
	expect_refused("0F0,0X0,0B0\n", 0, 1, 2, "0X0", "not a compute action");
	expect_refused("0F0,0F0,0B0\n", 0, 1, 2, "0F0", "repeated");
	expect_refused("0F0,0F1,0B0\n", 0, 1, 0, "0B1", "missing");
	/* PyTorch's looped BFS runs its backwards in reverse: the gradients would sum in another order */
	expect_refused("0F0,0F1,0B1,0B0\n", 0, 1, 3, "0B1", "micro-batch order");
	expect_refused("0F0,0W0,0I0\n", 0, 1, 2, "0W0", "before its B_in");
	/* a stage on two lines */
	expect_refused("0F0,1F0,1B0\n0B0\n", 0, 2, 1, "0B0", "another thread");
	/* a dependency broken: stage 1's backward before its own forward, on its own line */
	expect_refused("0F0,0B0\n1B0,1F0\n", 0, 2, 1, "1B0", "dependency broken");
	/* a deadlock: stage 0 waits for stage 1's B0, which waits behind 1F1, which needs 0F1 */
	expect_refused("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n", 0, 1, 2, "0B0", "deadlock");
	/* memory: 1F1B's stage 0 holds two micro-batches */
	expect_refused("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", 1, 1, 2, "0F1", "above the limit of 1");
	expect_refused("", 0, 1, 0, "", "no action");
	expect_refused("0F0,0B0\n,,\n", 0, 2, 0, "", "no action");
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_read_csv(&sc, "99F0,99B0", 9, 0, NULL), -E2BIG);
	ck_assert_int_eq(mbp_schedule_read_csv(NULL, "0F0", 3, 0, NULL), -EINVAL);
	ck_assert_uint_eq(mbp_schedule_write_csv(NULL, 0, NULL, 0), 0);
}
END_TEST

/* ---- the buffers a part holds at most, against every reachable state ---- */

/* One process of the brute force: a thread of the part or a remote neighbour, its list in global stages. */
struct bf_proc {
	mbp_sched_op ops[64];
	size_t L;
};

struct bf {
	const mbp_schedule *sc;
	unsigned first, count, lo, hi; /* the part; the stages modelled (the part and its neighbours) */
	const bool *stash;
	struct bf_proc p[8];
	unsigned K;
	unsigned x[8];			    /* positions: 2k ended k operations, 2k + 1 runs operation k */
	int where[MBP_MAX_STAGES][3][8][2]; /* (stage, F / B or B_in / W, mb): process and index */
};

static int bf_class(unsigned kind)
{
	return kind == MBP_OP_F ? 0 : kind == MBP_OP_W ? 2 : 1;
}

static bool bf_started(const struct bf *b, unsigned s, int cls, unsigned j)
{
	const int *w = b->where[s][cls][j];
	return (unsigned)w[1] < (b->x[w[0]] + 1) / 2;
}

static bool bf_ended(const struct bf *b, unsigned s, int cls, unsigned j)
{
	const int *w = b->where[s][cls][j];
	return (unsigned)w[1] < b->x[w[0]] / 2;
}

/* the micro-batch's last operation at stage s ended (B, or W under ZB-H1) */
static bool bf_done(const struct bf *b, unsigned s, unsigned j)
{
	return bf_ended(b, s, mbp_schedule_kind(b->sc) == MBP_SCHED_ZBH1 ? 2 : 1, j);
}

static bool bf_reachable(const struct bf *b)
{
	unsigned S = mbp_schedule_stages(b->sc);
	for (unsigned a = 0; a < b->K; a++)
		for (size_t i = 0; i < (b->x[a] + 1) / 2; i++) {
			const mbp_sched_op *op = &b->p[a].ops[i];
			unsigned s = op->stage, j = op->mb;
			int c = bf_class(op->kind);
			if (c == 0 && s > b->lo && !bf_ended(b, s - 1, 0, j))
				return false;
			if (c == 1 && s < b->hi && !bf_ended(b, s + 1, 1, j))
				return false;
			if (c == 1 && s == S - 1 && !bf_ended(b, s, 0, j))
				return false;
			if (c == 2 && !bf_ended(b, s, 1, j))
				return false;
		}
	return true;
}

/* What the part holds in this state, buffer by buffer. */
static unsigned bf_held(const struct bf *b)
{
	unsigned S = mbp_schedule_stages(b->sc), M = mbp_schedule_mbs(b->sc), n = 0;
	for (unsigned s = b->lo; s <= b->hi; s++)
		for (unsigned j = 0; j < M; j++) {
			bool local = s >= b->first && s < b->first + b->count;
			bool held = bf_started(b, s, 0, j) && !bf_done(b, s, j);
			if (local) {
				n += held && b->stash[s - b->first]; /* stash */
				n += held && s == S - 1;	     /* the loss's gradient */
				n += bf_started(b, s, 0, j) &&
				     !bf_ended(b, s, 0, j); /* F filling its output */
				n += s > 0 && bf_started(b, s, 1, j) &&
				     !bf_ended(b, s, 1, j); /* B filling din */
			}
			bool link =
			    s < b->hi && (local || (s + 1 >= b->first && s + 1 < b->first + b->count));
			if (link) {
				n += bf_ended(b, s, 0, j) &&
				     !bf_done(b, s + 1, j); /* output, then next's input */
				n += bf_ended(b, s + 1, 1, j) && !bf_done(b, s, j); /* input gradient */
			}
		}
	return n;
}

static uint64_t brute_peak(const mbp_schedule *sc, unsigned first, unsigned count, unsigned threads,
			   const bool *stash)
{
	static struct bf b;
	memset(&b, 0, sizeof(b));
	unsigned S = mbp_schedule_stages(sc);
	b.sc = sc;
	b.first = first;
	b.count = count;
	b.stash = stash;
	b.lo = first ? first - 1 : 0;
	b.hi = first + count < S ? first + count : S - 1;
	const mbp_sched_op *ops;
	if (first) {
		b.p[b.K].L = mbp_schedule_stage_ops(sc, first - 1, &ops);
		memcpy(b.p[b.K++].ops, ops, b.p[0].L * sizeof(*ops));
	}
	mbp_sched_op part[512];
	size_t off[MBP_MAX_STAGES + 1];
	ck_assert_int_eq(mbp__schedule_part_lists(sc, first, count, threads, part, off), 0);
	for (unsigned t = 0; t < threads; t++, b.K++) {
		b.p[b.K].L = off[t + 1] - off[t];
		for (size_t i = 0; i < b.p[b.K].L; i++) {
			b.p[b.K].ops[i] = part[off[t] + i];
			b.p[b.K].ops[i].stage = (uint16_t)(b.p[b.K].ops[i].stage + first);
		}
	}
	if (first + count < S) {
		b.p[b.K].L = mbp_schedule_stage_ops(sc, first + count, &ops);
		memcpy(b.p[b.K].ops, ops, b.p[b.K].L * sizeof(*ops));
		b.K++;
	}
	for (unsigned a = 0; a < b.K; a++)
		for (size_t i = 0; i < b.p[a].L; i++) {
			const mbp_sched_op *op = &b.p[a].ops[i];
			b.where[op->stage][bf_class(op->kind)][op->mb][0] = (int)a;
			b.where[op->stage][bf_class(op->kind)][op->mb][1] = (int)i;
			if (op->kind == MBP_OP_B) /* a whole backward is also the last */
				b.where[op->stage][2][op->mb][0] = (int)a,
				b.where[op->stage][2][op->mb][1] = (int)i;
		}
	uint64_t most = 0;
	for (;;) {
		if (bf_reachable(&b)) {
			unsigned n = bf_held(&b);
			most = n > most ? n : most;
		}
		unsigned a = 0;
		while (a < b.K && b.x[a] == 2 * b.p[a].L)
			b.x[a++] = 0;
		if (a == b.K)
			break;
		b.x[a]++;
	}
	return most;
}

START_TEST(buffer_peak_is_the_most_any_reachable_state_holds)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	static const bool stash[2][4] = {{true, true, true, true}, {false, true, false, true}};
	for (size_t k = 0; k < 3; k++)
		for (unsigned S = 1; S <= 4; S++)
			for (unsigned M = 1; M <= (S <= 2 ? 4u : S == 3 ? 3u : 2u); M++) {
				mbp_schedule *sc;
				ck_assert_int_eq(mbp_schedule_new(&sc, kinds[k], S, M), 0);
				/* the whole pipeline on 1..S threads, and parts of it (one rank's stages) */
				for (unsigned first = 0; first < S; first++)
					for (unsigned count = 1; first + count <= S; count++)
						for (unsigned T = 1; T <= count; T++) {
							if (first > 0 && T > 1 && S > 3)
								continue; /* keeps the brute force small */
							const bool *st =
							    stash[(first + count + T) & 1] + first;
							mbp_sched_op ops[512];
							size_t off[MBP_MAX_STAGES + 1];
							mbp__schedule_part_lists(sc, first, count, T, ops,
										 off);
							struct mbp__sched_part part = {first, count, T,
										       ops,   off,   st};
							uint64_t got = 0;
							ck_assert_int_eq(
							    mbp__schedule_buffer_peak(sc, &part, &got), 0);
							uint64_t want = brute_peak(sc, first, count, T, st);
							ck_assert_msg(
							    got == want,
							    "%s S=%u M=%u stages %u-%u on %u threads: %llu, "
							    "brute force %llu",
							    mbp_sched_name(kinds[k]), S, M, first,
							    first + count - 1, T, (unsigned long long)got,
							    (unsigned long long)want);
						}
				mbp_schedule_destroy(sc);
			}
}
END_TEST

START_TEST(invalid_arguments_return_documented_errors)
{
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new(NULL, MBP_SCHED_1F1B, 2, 2), -EINVAL);
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_1F1B, 0, 2), -EINVAL);
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_1F1B, MBP_MAX_STAGES + 1, 2), -EINVAL);
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_1F1B, 2, 0), -EINVAL);
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_1F1B, 2, MBP_TRAIN_MAX_MBS + 1), -EINVAL);
	ck_assert_int_eq(mbp_schedule_new(&sc, (mbp_sched_kind)9, 2, 2), -EINVAL);
	ck_assert_int_eq(mbp_schedule_new(&sc, MBP_SCHED_DEFAULT, 2, 2), 0);
	ck_assert_int_eq(mbp_schedule_kind(sc), MBP_SCHED_1F1B); /* zero means the default */
	mbp_op_costs c[2] = {{1, 1, 1}, {-1, 1, 1}};
	mbp_sched_sim r;
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, 2, &r, NULL), -EINVAL);
	c[1].f = 1;
	ck_assert_int_eq(mbp_schedule_simulate(sc, c, 3, &r, NULL), -EINVAL);
	const mbp_sched_op *ops;
	ck_assert_uint_eq(mbp_schedule_stage_ops(sc, 2, &ops), 0);
	ck_assert_uint_eq(mbp_schedule_stash_peak(sc, 2), 0);
	mbp_schedule_destroy(sc);
	mbp_schedule_destroy(NULL);
	mbp_sched_kind k;
	ck_assert_int_eq(mbp_sched_parse("ZB-H1", &k), 0);
	ck_assert_int_eq(k, MBP_SCHED_ZBH1);
	ck_assert_int_eq(mbp_sched_parse("gpipe", &k), 0);
	ck_assert_int_eq(k, MBP_SCHED_GPIPE);
	ck_assert_int_eq(mbp_sched_parse("2f2b", &k), -EINVAL);
	ck_assert_str_eq(mbp_sched_name(MBP_SCHED_DEFAULT), "1f1b");
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("schedule");
	TCase *tc = tcase_create("schedule");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, stage_lists_match_the_published_orders);
	tcase_add_test(tc, global_order_is_topological_and_stage_lists_are_its_projections);
	tcase_add_test(tc, stash_and_held_peaks_are_the_schedules_figures);
	tcase_add_test(tc, simulated_bubbles_match_the_closed_forms);
	tcase_add_test(tc, simulate_gives_each_operation_its_start);
	tcase_add_test(tc, buffer_peak_is_the_most_any_reachable_state_holds);
	tcase_add_test(tc, invalid_arguments_return_documented_errors);
	tcase_add_test(tc, chunked_thread_lists_match_the_published_orders);
	tcase_add_test(tc, every_schedule_is_valid_with_any_chunk_and_thread_count);
	tcase_add_test(tc, thread_peaks_are_the_documented_figures);
	tcase_add_test(tc, hops_between_chunks_of_one_thread_are_local);
	tcase_add_test(tc, predicted_bubbles_are_ordered_as_the_targets_say);
	tcase_add_test(tc, the_built_schedule_plays_no_slower_than_any_fixed_one_at_its_held_limit);
	tcase_add_test(tc, every_schedule_written_as_csv_reads_back_the_same);
	tcase_add_test(tc, pytorchs_csv_reads_with_bubbles_and_overlapped_pairs);
	tcase_add_test(tc, a_bad_schedule_is_refused_naming_its_line_and_action);
	suite_add_tcase(s, tc);
	return s;
}

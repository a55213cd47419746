/*
 * Training across MPI ranks: run under `mpirun -np R` (tests/mpi.sh runs it with R = 2 and 4). Every rank
 * holds two stages of the toy pipeline of test_train.c (train_toy.h), 2R stages in all (consecutive ones,
 * or under a chunked schedule the two chunks its placement gives its one thread), and runs the same
 * tests in the same order; rank 0 gives the inputs and targets, the others serve. Each rank also runs the
 * whole pipeline in one process (an mbp_trainer of 2R stages on the same data) and compares its own stages'
 * parameters with that trainer's, bit for bit, after every step.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>
#include <mbpipe.h>
#include <mbpipe/mpi.h>

#include "train_internal.h"
#include "train_toy.h"

#define SPR  2	/* stages per rank */
#define ROWS 22 /* rows per step: 6 micro-batches of 4, the last of 2 */
#define MBR  4
#define SEC  ((int64_t)1000000000)

static int rank, size;

static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};

static unsigned total_stages(void)
{
	return (unsigned)size * SPR;
}

static mbp_train_opts toy_opts(mbp_sched_kind kind)
{
	return (mbp_train_opts){.in_row_bytes = N * sizeof(float),
				.target_row_bytes = N * sizeof(float),
				.max_mb_rows = 16,
				.max_mbs = 32,
				.schedule = kind,
				.spin_ns = 1000, /* ranks share 2 CPUs */
				.loss = mse};
}

/* The chunked schedules, the block one that is not above, and one read from text. */
static const mbp_sched_kind chunked[] = {MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS, MBP_SCHED_ZBV,
					 MBP_SCHED_DUALPIPEV,	MBP_SCHED_ZBH2,	      MBP_SCHED_CUSTOM};

/* Stage g's whole backward or the split one: mixed where the schedule takes a whole B, split for the
 * zero-bubble ones (and a schedule read from text). */
static bool whole_backward(mbp_sched_kind kind, unsigned g)
{
	return (kind == MBP_SCHED_GPIPE || kind == MBP_SCHED_1F1B || kind == MBP_SCHED_INTERLEAVED ||
		kind == MBP_SCHED_LOOPED_BFS) &&
	       (g & 1);
}

struct part {
	mbp_mpi_trainer *t;
	unsigned g[SPR]; /* the global stages it holds, ascending */
	struct toy st[SPR];
};

/* The rows of a step of the chunked tests: 2R micro-batches (DualPipeV's least), the last short. */
static size_t chunk_rows(void)
{
	return (size_t)total_stages() * MBR - 2;
}

/* The schedule "read from a file": ZB-V on R threads for the chunked tests' step, written as PyTorch's
 * CSV and read back (every rank reads the same text). */
static mbp_schedule *read_schedule(mbp_sched_kind kind)
{
	mbp_schedule *sc, *back = NULL;
	unsigned M = (unsigned)((chunk_rows() + MBR - 1) / MBR);
	ck_assert_int_eq(mbp_schedule_new_placed(&sc, kind, total_stages(), M, (unsigned)size), 0);
	char text[16384];
	size_t len = mbp_schedule_write_csv(sc, 0, text, sizeof(text));
	ck_assert(len > 0 && len < sizeof(text));
	mbp_sched_text_error err;
	ck_assert_int_eq(mbp_schedule_read_csv(&back, text, len, 0, &err), 0);
	mbp_schedule_destroy(sc);
	return back;
}

/* The stages this rank holds: by its placement on one thread a rank (a chunked or custom schedule), else
 * the rank's SPR consecutive ones. */
static void stages_here(const mbp_train_opts *o, unsigned *g)
{
	mbp_schedule *own = NULL;
	const mbp_schedule *sc = o->custom;
	unsigned T = o->threads ? o->threads : 1; /* threads a rank */
	if (!sc && mbp_schedule_new_placed(&own, o->schedule, total_stages(), total_stages(),
					   T * (unsigned)size) == 0)
		sc = own;
	unsigned k = 0;
	for (unsigned s = 0; s < total_stages(); s++)
		if (sc && mbp_schedule_threads(sc) ? mbp_schedule_thread_of(sc, s, 0) / T == (unsigned)rank
						   : s / SPR == (unsigned)rank)
			g[k < SPR ? k++ : k] = s;
	ck_assert_uint_eq(k, SPR);
	mbp_schedule_destroy(own);
}

/* A trainer under test: a failed assertion leaves it running (Check without fork jumps out of the test),
 * and the next test could not start one; the fixture's teardown then ends every rank at once. */
static mbp_mpi_trainer *live;

static void end_live(void)
{
	if (live) {
		fprintf(stderr,
			"test_mpi_train: rank %d: a test failed with its trainer running; ending every "
			"rank\n",
			rank);
		mbp_mpi_abort(1);
	}
}

static void part_destroy(struct part *p)
{
	live = NULL;
	mbp_mpi_trainer_destroy(p->t);
}

/* The failing-step test's gate: a forward that is to fail waits until its rank has sent more than
 * `gate_sent` items (what it ran before is on the wire). NULL: no gate. */
static mbp_mpi_trainer *gate;
static uint64_t gate_sent;

static int gated_forward(void *ctx, const mbp_train_io *io)
{
	struct toy *t = ctx;
	if (gate && t->fail_kind == MBP_OP_F && (int)io->mb == t->fail_mb)
		for (mbp_mpi_train_stats st = {0}; st.sent <= gate_sent; usleep(200))
			ck_assert_int_eq(mbp_mpi_trainer_stats_get(gate, &st, NULL, 0), SPR);
	return toy_forward(ctx, io);
}

static bool cancel_before_start; /* part_start: rank 0 cancels between its stages and the start */

static int part_start(struct part *p, mbp_train_opts o)
{
	mbp_sched_kind kind = o.schedule;
	stages_here(&o, p->g);
	mbp_mpi_opts mo;
	mbp_mpi_opts_init(&mo);
	mo.window = 2; /* fewer than a step's micro-batches: credits are needed */
	mo.peer_timeout_ns = 20 * SEC;
	int rc = mbp_mpi_trainer_new(&p->t, &o, &mo);
	if (rc)
		return rc;
	live = p->t;
	for (unsigned i = 0; i < SPR; i++) {
		unsigned g = p->g[i];
		toy_init(&p->st[i], g + 1);
		mbp_train_stage_desc d = toy_desc(&p->st[i], whole_backward(kind, g));
		d.forward = gated_forward;
		rc = mbp_mpi_trainer_add_stage(p->t, &d);
		if (rc)
			return rc;
	}
	if (cancel_before_start && rank == 0)
		ck_assert_int_eq(mbp_mpi_trainer_cancel(p->t), 0);
	return mbp_mpi_trainer_start(p->t);
}

static int part_new(struct part *p, mbp_sched_kind kind, size_t in_row_bytes)
{
	mbp_train_opts o = toy_opts(kind);
	if (in_row_bytes)
		o.in_row_bytes = in_row_bytes;
	return part_start(p, o);
}

/* A part under a chunked kind (or ZB-H2), or under a schedule read from text (MBP_SCHED_CUSTOM), on
 * `threads` threads a rank (0: the schedule's default). */
static int part_threads(struct part *p, mbp_sched_kind kind, uint32_t threads)
{
	mbp_train_opts o = toy_opts(kind);
	o.threads = threads;
	mbp_schedule *sc = kind == MBP_SCHED_CUSTOM ? read_schedule(MBP_SCHED_ZBV) : NULL;
	o.custom = sc;
	int rc = part_start(p, o);
	mbp_schedule_destroy(sc); /* the trainer has its copy */
	return rc;
}

static int part_chunked(struct part *p, mbp_sched_kind kind)
{
	return part_threads(p, kind, 0);
}

/* The whole pipeline in this process, one thread. */
struct single {
	mbp_trainer *t;
	struct toy st[MBP_MAX_STAGES];
};

static void single_new(struct single *s, mbp_sched_kind kind)
{
	/* a chunked or custom schedule's reference: one thread in 1F1B's order, the same stages */
	mbp_train_opts o = toy_opts(mbp__sched_kind_placed(kind) ? MBP_SCHED_1F1B : kind);
	o.threads = 1;
	ck_assert_int_eq(mbp_trainer_new(&s->t, &o), 0);
	for (unsigned g = 0; g < total_stages(); g++) {
		toy_init(&s->st[g], g + 1);
		mbp_train_stage_desc d = toy_desc(&s->st[g], whole_backward(kind, g));
		ck_assert_int_eq(mbp_trainer_add_stage(s->t, &d), 0);
	}
	ck_assert_int_eq(mbp_trainer_start(s->t), 0);
}

/* Rank 0 gives the data; the others run their part of its step. */
static int step_rows(struct part *p, const float *in, const float *tg, size_t rows, double *loss)
{
	if (rank == 0)
		return mbp_mpi_trainer_step(p->t, in, tg, rows, MBR, loss);
	return mbp_mpi_trainer_step(p->t, NULL, NULL, 0, 0, loss);
}

static int step(struct part *p, const float *in, const float *tg, double *loss)
{
	return step_rows(p, in, tg, ROWS, loss);
}

/* This rank's stages hold the single trainer's parameters, bit for bit. */
static void same_params(const struct part *p, const struct single *s)
{
	for (unsigned i = 0; i < SPR; i++) {
		unsigned g = p->g[i];
		ck_assert_msg(memcmp(p->st[i].w, s->st[g].w, sizeof(p->st[i].w)) == 0,
			      "rank %d: stage %u weights differ", rank, g);
		ck_assert_msg(memcmp(p->st[i].b, s->st[g].b, sizeof(p->st[i].b)) == 0,
			      "rank %d: stage %u biases differ", rank, g);
	}
}

/* One step on every rank and on the single trainer: the same loss, the same parameters. */
static void step_as_single(struct part *p, struct single *s, const float *in, const float *tg)
{
	double loss = -1, want = -2;
	ck_assert_int_eq(step(p, in, tg, &loss), 0);
	ck_assert_int_eq(mbp_trainer_step(s->t, in, tg, ROWS, MBR, &want), 0);
	ck_assert(loss == want);
	same_params(p, s);
}

/* Three steps of `rows` rows on every rank and on the single trainer: the same losses, every rank's
 * parameters the single process's, bit for bit, every update given the norm over all stages of all
 * ranks and the step's loss. */
static void three_steps_as_single(struct part *p, struct single *s, mbp_sched_kind kind, size_t rows)
{
	float in[32 * MBR * N], tg[32 * MBR * N];
	ck_assert(rows <= 32 * MBR);
	for (unsigned n = 0; n < 3; n++) {
		make_data(in, tg, rows, n);
		double loss = -1, want = -2;
		ck_assert_int_eq(step_rows(p, in, tg, rows, &loss), 0);
		ck_assert_int_eq(mbp_trainer_step(s->t, in, tg, rows, MBR, &want), 0);
		ck_assert_msg(loss == want, "rank %d, %s: loss %.17g, one process %.17g", rank,
			      mbp_sched_name(kind), loss, want);
		same_params(p, s);
		for (unsigned i = 0; i < SPR; i++) {
			const struct toy *ref = &s->st[p->g[i]];
			ck_assert(p->st[i].last_norm == ref->last_norm);
			ck_assert(p->st[i].last_loss == want);
		}
	}
}

/* After three steps of M micro-batches: M items per step over each hop to or from another rank (the
 * activations out of a stage whose next is another rank's, the gradients out of one whose previous is),
 * nothing dropped. */
static void links_carried_three_steps(const struct part *p, const mbp_mpi_train_stats *st, unsigned M)
{
	unsigned hops = 0;
	for (unsigned i = 0; i < SPR; i++) {
		bool prev_here = i > 0 && p->g[i - 1] + 1 == p->g[i];
		bool next_here = i + 1 < SPR && p->g[i + 1] == p->g[i] + 1;
		hops += (p->g[i] > 0 && !prev_here) + (p->g[i] + 1 < total_stages() && !next_here);
	}
	ck_assert_uint_eq(st->sent, 3 * M * hops);
	ck_assert_uint_eq(st->received, 3 * M * hops);
	ck_assert_uint_eq(st->dropped, 0);
}

START_TEST(every_schedule_across_ranks_gives_the_single_process_parameters_bit_for_bit)
{
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		struct part p;
		struct single s;
		ck_assert_int_eq(part_new(&p, kinds[k], 0), 0);
		single_new(&s, kinds[k]);
		three_steps_as_single(&p, &s, kinds[k], ROWS);
		mbp_mpi_train_stats st;
		ck_assert_int_eq(mbp_mpi_trainer_stats_get(p.t, &st, NULL, 0), SPR);
		ck_assert_uint_eq(st.local.steps, 3);
		ck_assert_uint_eq(st.stage0, (unsigned)rank * SPR);
		ck_assert_uint_eq(st.stages, total_stages());
		/* 6 activations forward and 6 gradients back per step and link, nothing dropped */
		links_carried_three_steps(&p, &st, 6);
		part_destroy(&p); /* the trainer's pool checks that every buffer came back */
		mbp_trainer_destroy(s.t);
	}
}
END_TEST

/* Step n fails at stage g (operation `kind`, micro-batch mb) on whichever rank holds g. */
static void failing_step(struct part *p, struct single *s, unsigned n, unsigned g, int kind, int mb,
			 mbp_op_kind reported)
{
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, n);
	struct toy before[SPR];
	memcpy(before, p->st, sizeof(before));
	int mine = -1;
	for (int i = 0; i < SPR; i++)
		mine = p->g[i] == g ? i : mine;
	if (mine >= 0) {
		p->st[mine].fail_kind = kind;
		p->st[mine].fail_mb = mb;
	}
	ck_assert_int_eq(step(p, in, tg, NULL), -EIO);
	mbp_train_error e;
	ck_assert_int_eq(mbp_mpi_trainer_error(p->t, &e), 0);
	ck_assert_int_eq(e.err, -EIO);
	ck_assert_int_eq(e.stage, (int)g);
	ck_assert_int_eq(e.mb, mb);
	ck_assert_int_eq(e.op, reported);
	for (unsigned i = 0; i < SPR; i++) {
		/* no update anywhere: the parameters are those before the step, the gradient discarded */
		ck_assert(memcmp(p->st[i].w, before[i].w, sizeof(before[i].w)) == 0);
		ck_assert(memcmp(p->st[i].b, before[i].b, sizeof(before[i].b)) == 0);
		ck_assert_uint_eq(p->st[i].updates, before[i].updates);
		ck_assert_uint_eq(p->st[i].discards, before[i].discards + 1);
	}
	if (mine >= 0)
		p->st[mine].fail_kind = -1;
	/* the next step runs normally */
	make_data(in, tg, ROWS, n + 1);
	step_as_single(p, s, in, tg);
}

/* This rank's steps that succeeded and failed; then the end (the pool checks every buffer came back). */
static void end_counted(struct part *p, struct single *s, uint64_t steps, uint64_t failed)
{
	mbp_mpi_train_stats st;
	ck_assert_int_eq(mbp_mpi_trainer_stats_get(p->t, &st, NULL, 0), SPR);
	ck_assert_uint_eq(st.local.steps, steps);
	ck_assert_uint_eq(st.local.steps_failed, failed);
	part_destroy(p);
	mbp_trainer_destroy(s->t);
}

START_TEST(a_stage_failure_on_another_rank_fails_the_step_everywhere_and_the_next_step_runs)
{
	struct part p;
	struct single s;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_ZBH1, 0), 0);
	single_new(&s, MBP_SCHED_ZBH1);
	unsigned S = total_stages();
	/* the last stage's forward; the last rank's first stage's B_in; rank 1's first stage's weight
	 * gradient at the last micro-batch */
	failing_step(&p, &s, 0, S - 1, MBP_OP_F, 2, MBP_OP_F);
	failing_step(&p, &s, 2, S - SPR, MBP_OP_BIN, 0, MBP_OP_BIN);
	failing_step(&p, &s, 4, SPR, MBP_OP_W, 5, MBP_OP_W);
	end_counted(&p, &s, 3, 3);
}
END_TEST

/* Items of a failed step still on the wire are not taken by the next step: rank 0's last stage fails its
 * second forward once its first output is sent, and rank 1 holds every arrival of that step at the head
 * of its link until the step has closed there; the held activation is then dropped (counted), and the
 * next step gives the single process's parameters, bit for bit, on every rank. */
START_TEST(items_of_a_failed_step_left_on_the_wire_are_dropped_and_the_next_step_is_exact)
{
	struct part p;
	struct single s;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_1F1B, 0), 0);
	single_new(&s, MBP_SCHED_1F1B);
	mbp_mpi_train_stats st;
	ck_assert_int_eq(mbp_mpi_trainer_stats_get(p.t, &st, NULL, 0), SPR);
	gate = rank == 0 ? p.t : NULL;
	gate_sent = st.sent;
	if (rank == 1)
		mbp__mpi_trainer_test_hold(p.t, true);
	/* rank 0's last stage, SPR - 1: its output of micro-batch 0 goes to rank 1, its forward of 1 fails */
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	struct toy before[SPR];
	memcpy(before, p.st, sizeof(before));
	if (rank == 0) {
		p.st[SPR - 1].fail_kind = MBP_OP_F;
		p.st[SPR - 1].fail_mb = 1;
	}
	ck_assert_int_eq(step(&p, in, tg, NULL), -EIO);
	mbp_train_error e;
	ck_assert_int_eq(mbp_mpi_trainer_error(p.t, &e), 0);
	ck_assert_int_eq(e.stage, SPR - 1);
	ck_assert_int_eq(e.mb, 1);
	for (unsigned i = 0; i < SPR; i++) {
		ck_assert(memcmp(p.st[i].w, before[i].w, sizeof(before[i].w)) == 0);
		ck_assert_uint_eq(p.st[i].updates, 0);
	}
	gate = NULL;
	if (rank == 1)
		mbp__mpi_trainer_test_hold(p.t, false);
	p.st[SPR - 1].fail_kind = -1;
	/* the held item stands before the next step's in rank 1's link: dropped before they are taken */
	make_data(in, tg, ROWS, 1);
	step_as_single(&p, &s, in, tg);
	make_data(in, tg, ROWS, 2);
	step_as_single(&p, &s, in, tg);
	ck_assert_int_eq(mbp_mpi_trainer_stats_get(p.t, &st, NULL, 0), SPR);
	ck_assert_msg(st.dropped == (rank == 1 ? 1u : 0u), "rank %d dropped %llu", rank,
		      (unsigned long long)st.dropped);
	end_counted(&p, &s, 2, 1);
}
END_TEST

/* The events a rank gives name its stages by their index in the whole pipeline, as many as its
 * schedule's lists hold, under a block schedule and a chunked one (a rank's chunks not consecutive). */
START_TEST(events_across_ranks_name_the_stages_by_their_global_index)
{
	const mbp_sched_kind ks[] = {MBP_SCHED_1F1B, MBP_SCHED_ZBV};
	for (size_t k = 0; k < 2; k++) {
		struct part p;
		mbp_train_opts o = toy_opts(ks[k]);
		o.trace_events = 256;
		ck_assert_int_eq(part_start(&p, o), 0);
		size_t rows = ks[k] == MBP_SCHED_ZBV ? chunk_rows() : ROWS;
		float in[32 * MBR * N], tg[32 * MBR * N];
		make_data(in, tg, rows, 0);
		ck_assert_int_eq(step_rows(&p, in, tg, rows, NULL), 0);
		mbp_train_event ev[512];
		int n = mbp_mpi_trainer_events_get(p.t, ev, 512);
		ck_assert_int_gt(n, 0);
		ck_assert_int_le(n, 512);
		ck_assert_int_eq(mbp_mpi_trainer_events_get(p.t, NULL, 0), n);
		const mbp_schedule *sc = mbp_trainer_schedule(mbp__mpi_trainer_local(p.t));
		int want = 0;
		for (unsigned i = 0; i < SPR; i++) {
			const mbp_sched_op *ops;
			size_t m = mbp_schedule_stage_ops(sc, p.g[i], &ops), got = 0;
			for (int j = 0; j < n; j++)
				got += ev[j].stage == p.g[i];
			ck_assert_msg(got == m, "rank %d, %s: %zu events of stage %u, its list %zu", rank,
				      mbp_sched_name(ks[k]), got, p.g[i], m);
			want += (int)m;
		}
		ck_assert_int_eq(n, want); /* none of another stage */
		part_destroy(&p);
	}
	ck_assert_int_eq(mbp_mpi_trainer_events_get(NULL, NULL, 0), -EINVAL);
}
END_TEST

/* A stage's check that refuses its update, on whichever rank holds the stage, fails the step on every rank
 * before any rank updates (the check is part of the vote), naming the stage; the next step runs. */
START_TEST(a_refusing_check_on_any_rank_fails_the_step_everywhere_before_any_update)
{
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		struct part p;
		struct single s;
		ck_assert_int_eq(part_new(&p, kinds[k], 0), 0);
		single_new(&s, kinds[k]);
		unsigned S = total_stages();
		failing_step(&p, &s, 0, S - 1, TOY_FAIL_CHECK, -1, MBP_OP_UPDATE);
		failing_step(&p, &s, 2, 1, TOY_FAIL_CHECK, -1, MBP_OP_UPDATE);
		failing_step(&p, &s, 4, SPR, TOY_FAIL_CHECK, -1, MBP_OP_UPDATE);
		end_counted(&p, &s, 3, 3);
	}
}
END_TEST

/* An update that refuses after its check accepted (a broken contract) on one rank: that rank's step
 * fails with -ENOTRECOVERABLE (the others updated, and could not know), and every later step fails on every
 * rank with it, naming the stage. */
START_TEST(an_update_that_breaks_its_contract_fails_every_later_step_on_every_rank)
{
	struct part p;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_1F1B, 0), 0);
	unsigned g = SPR; /* rank 1's first stage */
	bool mine = g / SPR == (unsigned)rank;
	if (mine)
		p.st[0].fail_kind = TOY_FAIL_UPDATE;
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	ck_assert_int_eq(step(&p, in, tg, NULL), mine ? -ENOTRECOVERABLE : 0);
	for (unsigned n = 1; n < 3; n++) {
		ck_assert_int_eq(step(&p, in, tg, NULL), -ENOTRECOVERABLE);
		mbp_train_error e;
		ck_assert_int_eq(mbp_mpi_trainer_error(p.t, &e), 0);
		ck_assert_int_eq(e.stage, (int)g);
		ck_assert_int_eq(e.op, MBP_OP_UPDATE);
	}
	for (unsigned i = 0; i < SPR; i++)
		ck_assert_uint_eq(p.st[i].updates, 1); /* the first step only */
	part_destroy(&p);
}
END_TEST

/* Ten steps of `rows` rows, one slow stage per step somewhere: no step after the first allocates a
 * buffer on this rank, nor waits for one. */
static void ten_steps_allocate_nothing_after_the_first(struct part *p, mbp_sched_kind kind, size_t rows)
{
	float in[32 * MBR * N], tg[32 * MBR * N];
	ck_assert(rows <= 32 * MBR);
	mbp_train_stats first, st;
	for (unsigned n = 0; n < 10; n++) {
		for (unsigned i = 0; i < SPR; i++)
			p->st[i].sleep_us = p->g[i] == n % total_stages() ? 300 : 0;
		make_data(in, tg, rows, n);
		ck_assert_int_eq(step_rows(p, in, tg, rows, NULL), 0);
		mbp_trainer_stats_get(mbp__mpi_trainer_local(p->t), &st, NULL, 0);
		if (n == 0)
			first = st;
		ck_assert_msg(st.pool.allocated == first.pool.allocated && st.pool.waits == 0,
			      "rank %d, %s, step %u: %llu buffers, %llu after the first step", rank,
			      mbp_sched_name(kind), n, (unsigned long long)st.pool.allocated,
			      (unsigned long long)first.pool.allocated);
	}
}

/* Each rank's pool is grown to its part's peak (its stages, the links to its neighbours, the agent's
 * windows) before the first step: no later step allocates on any rank, whatever the timing. */
START_TEST(no_rank_allocates_a_buffer_after_the_first_step)
{
	const size_t nk = sizeof(kinds) / sizeof(kinds[0]), nc = sizeof(chunked) / sizeof(chunked[0]);
	for (size_t k = 0; k < nk + nc; k++) {
		/* the block kinds, then the chunked ones (and one read from text) in their steps of 2R
		 * micro-batches */
		mbp_sched_kind kind = k < nk ? kinds[k] : chunked[k - nk];
		size_t rows = k < nk ? ROWS : chunk_rows();
		struct part p;
		ck_assert_int_eq(k < nk ? part_new(&p, kind, 0) : part_chunked(&p, kind), 0);
		ten_steps_allocate_nothing_after_the_first(&p, kind, rows);
		part_destroy(&p);
	}
}
END_TEST

struct canceller {
	struct part *p;
	int (*fn)(mbp_mpi_trainer *t); /* cancel or drain */
};

static void *mid_step(void *arg)
{
	struct canceller *c = arg;
	/* once the step is under way here (stage 0 ran an operation), and a little later */
	while (atomic_load(&c->p->st[0].ops) == 0)
		usleep(200);
	usleep(5000);
	c->fn(c->p->t);
	return NULL;
}

START_TEST(cancel_from_rank_0_mid_step_fails_it_on_every_rank_with_no_update)
{
	/* a block schedule, and ZB-V (the last chunk on rank 0, a hop between two chunks of one rank) */
	for (int k = 0; k < 2; k++) {
		struct part p;
		ck_assert_int_eq(part_chunked(&p, k ? MBP_SCHED_ZBV : MBP_SCHED_1F1B), 0);
		float in[ROWS * N], tg[ROWS * N];
		make_data(in, tg, ROWS, 0);
		for (unsigned i = 0; i < SPR; i++)
			p.st[i].sleep_us = 2000; /* a step of 6 micro-batches takes tens of ms */
		struct toy before[SPR];
		memcpy(before, p.st, sizeof(before));
		pthread_t th;
		struct canceller c = {&p, mbp_mpi_trainer_cancel};
		if (rank == 0)
			ck_assert_int_eq(pthread_create(&th, NULL, mid_step, &c), 0);
		ck_assert_int_eq(step(&p, in, tg, NULL), -ECANCELED);
		if (rank == 0)
			pthread_join(th, NULL);
		mbp_train_error e;
		ck_assert_int_eq(mbp_mpi_trainer_error(p.t, &e), 0);
		ck_assert_int_eq(e.err, -ECANCELED);
		ck_assert_int_eq(e.stage, -1);
		for (unsigned i = 0; i < SPR; i++) {
			ck_assert(memcmp(p.st[i].w, before[i].w, sizeof(before[i].w)) == 0);
			ck_assert_uint_eq(p.st[i].updates, 0);
		}
		if (rank == 0) {
			ck_assert_int_eq(step(&p, in, tg, NULL), -ESHUTDOWN);
		} else {
			ck_assert_int_eq(mbp_mpi_trainer_serve(p.t),
					 -ECANCELED); /* returns once rank 0 ends the run */
		}
		part_destroy(&p);
	}
}
END_TEST

/* A cancel that rank 0 makes before the start, when no rank could be told yet, reaches every rank once the
 * run starts: rank 0's steps are refused, every other rank's serve returns -ECANCELED (not waiting on). */
START_TEST(cancel_before_the_start_reaches_every_rank_once_started)
{
	struct part p;
	cancel_before_start = true;
	int rc = part_new(&p, MBP_SCHED_1F1B, 0);
	cancel_before_start = false;
	ck_assert_int_eq(rc, 0);
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	if (rank == 0)
		ck_assert_int_eq(step(&p, in, tg, NULL), -ESHUTDOWN);
	else
		ck_assert_int_eq(mbp_mpi_trainer_serve(p.t), -ECANCELED);
	for (unsigned i = 0; i < SPR; i++)
		ck_assert_uint_eq(p.st[i].updates, 0);
	part_destroy(&p);
}
END_TEST

START_TEST(drain_from_rank_0_mid_step_lets_it_finish_and_ends_the_run_on_every_rank)
{
	struct part p;
	struct single s;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_GPIPE, 0), 0);
	single_new(&s, MBP_SCHED_GPIPE);
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	for (unsigned i = 0; i < SPR; i++)
		p.st[i].sleep_us = 1000;
	pthread_t th;
	struct canceller c = {&p, mbp_mpi_trainer_drain};
	if (rank == 0)
		ck_assert_int_eq(pthread_create(&th, NULL, mid_step, &c), 0);
	double loss = -1, want = -2;
	ck_assert_int_eq(step(&p, in, tg, &loss), 0);
	if (rank == 0)
		pthread_join(th, NULL);
	ck_assert_int_eq(mbp_trainer_step(s.t, in, tg, ROWS, MBR, &want), 0);
	ck_assert(loss == want);
	same_params(&p, &s);
	if (rank == 0)
		ck_assert_int_eq(step(&p, in, tg, NULL), -ESHUTDOWN);
	else
		ck_assert_int_eq(mbp_mpi_trainer_serve(p.t), 0); /* returns once rank 0 ends the run */
	part_destroy(&p);
	mbp_trainer_destroy(s.t);
}
END_TEST

START_TEST(a_step_too_large_for_max_mbs_is_refused_on_rank_0_and_the_next_step_runs)
{
	struct part p;
	struct single s;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_1F1B, 0), 0);
	single_new(&s, MBP_SCHED_1F1B);
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	if (rank == 0) {
		/* rows + mb_rows - 1 wraps to 0: refused before any rank hears of the step (had it run,
		 * the targets' byte count would wrap too and MPI would end every rank) */
		ck_assert_int_eq(mbp_mpi_trainer_step(p.t, in, tg, SIZE_MAX, 2, NULL), -E2BIG);
		ck_assert_int_eq(mbp_mpi_trainer_step(p.t, in, tg, 32 * 16 + 1, 16, NULL), -E2BIG);
	}
	step_as_single(&p, &s, in, tg);
	part_destroy(&p);
	mbp_trainer_destroy(s.t);
}
END_TEST

/* Step n: rank r cannot start its part (its schedule fails to build, as on -ENOMEM). */
static void unstartable_step(struct part *p, struct single *s, unsigned n, int r)
{
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, n);
	struct toy before[SPR];
	memcpy(before, p->st, sizeof(before));
	if (rank == r)
		mbp__trainer_fail_next_prepare(mbp__mpi_trainer_local(p->t), -ENOMEM);
	/* every rank fails the step with rank r's error (without its vote the others would wait) */
	ck_assert_int_eq(step(p, in, tg, NULL), -ENOMEM);
	mbp_train_error e;
	ck_assert_int_eq(mbp_mpi_trainer_error(p->t, &e), 0);
	ck_assert_int_eq(e.err, -ENOMEM);
	ck_assert_int_eq(e.stage, -1);
	for (unsigned i = 0; i < SPR; i++) {
		ck_assert(memcmp(p->st[i].w, before[i].w, sizeof(before[i].w)) == 0);
		ck_assert_uint_eq(p->st[i].updates, before[i].updates);
	}
	make_data(in, tg, ROWS, n + 1);
	step_as_single(p, s, in, tg);
}

START_TEST(a_rank_that_cannot_start_its_step_fails_it_everywhere_and_the_next_step_runs)
{
	struct part p;
	struct single s;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_1F1B, 0), 0);
	single_new(&s, MBP_SCHED_1F1B);
	unstartable_step(&p, &s, 0, size - 1); /* the last rank: it holds the step's targets */
	unstartable_step(&p, &s, 2, 0);
	end_counted(&p, &s, 2, 2);
}
END_TEST

/* The ranks other than 0 hold their links' credits until rank 0 ends the run, as when the last
 * micro-batches of a failed step land while it ends: they must not go out then. A message a rank sends
 * after its last word can land once its peer has freed the run's communicator, whose context MPI gives to
 * the next run's: there it takes the place of one of that run's messages (by its sequence number), which is
 * lost, a vote or a gradient, and that run hangs. Rank 0 looks for such messages after the run. */
START_TEST(no_rank_sends_a_message_after_its_last_word_of_the_run)
{
	float in[ROWS * N], tg[ROWS * N];
	struct part p;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_1F1B, 0), 0);
	mbp__mpi_trainer_test_late(p.t);
	make_data(in, tg, ROWS, 0);
	uint64_t late0 = mbp__mpi_trainer_late_seen();
	/* two micro-batches: the window's credits, none needed back */
	if (rank == 0)
		ck_assert_int_eq(mbp_mpi_trainer_step(p.t, in, tg, 2 * MBR, MBR, NULL), 0);
	else
		ck_assert_int_eq(step(&p, in, tg, NULL), 0);
	part_destroy(&p);
	ck_assert_msg(mbp__mpi_trainer_late_seen() == late0,
		      "rank 0 got %llu messages after the run's last words",
		      (unsigned long long)(mbp__mpi_trainer_late_seen() - late0));
}
END_TEST

START_TEST(a_rank_that_destroys_its_trainer_mid_run_ends_the_run_on_every_rank_with_econnreset)
{
	struct part p;
	ck_assert_int_eq(part_new(&p, MBP_SCHED_1F1B, 0), 0);
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	ck_assert_int_eq(step(&p, in, tg, NULL), 0);
	int leaver = size - 1;
	if (rank == leaver) {
		/* without serving to the end: rank 0 is not told to stop, and would wait for its votes */
		part_destroy(&p);
		return;
	}
	if (rank == 0) {
		/* refused (rank 0 heard of it) or failed by the leaver's vote: either way its reason */
		ck_assert_int_eq(step(&p, in, tg, NULL), -ECONNRESET);
		char want[64];
		snprintf(want, sizeof(want), "rank %d left the run", leaver);
		ck_assert_msg(strstr(mbp_mpi_trainer_run_error(p.t), want) != NULL, "%s",
			      mbp_mpi_trainer_run_error(p.t));
		ck_assert_int_eq(step(&p, in, tg, NULL), -ECONNRESET);
	} else {
		ck_assert_int_eq(mbp_mpi_trainer_serve(p.t), -ECONNRESET);
	}
	part_destroy(&p);
}
END_TEST

START_TEST(widths_that_disagree_between_ranks_fail_start_on_every_rank)
{
	struct part p;
	int rc = part_new(&p, MBP_SCHED_1F1B, rank == 1 ? 3 * sizeof(float) : 0);
	ck_assert_int_eq(rc, -EINVAL);
	ck_assert_msg(strstr(mbp_mpi_trainer_run_error(p.t),
			     "rank 0's output rows are 16 bytes, rank 1's input "
			     "rows 12") != NULL,
		      "%s", mbp_mpi_trainer_run_error(p.t));
	/* every later call says why the run is over: start's error, on every rank */
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	ck_assert_int_eq(step(&p, in, tg, NULL), -EINVAL);
	if (rank != 0)
		ck_assert_int_eq(mbp_mpi_trainer_serve(p.t), -EINVAL);
	part_destroy(&p);
}
END_TEST

START_TEST(a_gradient_wider_than_the_activation_is_refused_across_ranks)
{
	mbp_train_opts o = toy_opts(MBP_SCHED_1F1B);
	mbp_mpi_trainer *t;
	ck_assert_int_eq(mbp_mpi_trainer_new(&t, &o, NULL), 0);
	struct toy a;
	toy_init(&a, 1);
	mbp_train_stage_desc d = toy_desc(&a, false);
	d.grad_row_bytes = 2 * d.out_row_bytes; /* the links carry gradients of the activations' width */
	ck_assert_int_eq(mbp_mpi_trainer_add_stage(t, &d), -ENOTSUP);
	d.grad_row_bytes = d.out_row_bytes; /* the same width, said explicitly: accepted */
	ck_assert_int_eq(mbp_mpi_trainer_add_stage(t, &d), 0);
	mbp_mpi_trainer_destroy(t);
}
END_TEST

/* Three steps under `kind` on `threads` threads a rank (0: one): every rank's parameters are the single
 * process's, bit for bit; M items per step over each hop between ranks, nothing dropped. */
static void chunked_as_single(mbp_sched_kind kind, uint32_t threads)
{
	size_t rows = chunk_rows();
	uint32_t M = (uint32_t)((rows + MBR - 1) / MBR);
	struct part p;
	struct single s;
	ck_assert_int_eq(part_threads(&p, kind, threads), 0);
	single_new(&s, kind);
	three_steps_as_single(&p, &s, kind, rows);
	mbp_mpi_train_stats st;
	mbp_train_stage_stats ss[SPR];
	ck_assert_int_eq(mbp_mpi_trainer_stats_get(p.t, &st, ss, SPR), SPR);
	ck_assert_uint_eq(st.local.steps, 3);
	ck_assert_uint_eq(st.local.threads, threads ? threads : 1);
	/* the last step's hops: M outputs on and M input gradients back a stage (none past the ends), to
	 * another thread or rank through a ring, to a chunk of the same thread directly, as the schedule's
	 * figures count them over this rank's threads (a placed schedule: they are the rank's own) */
	unsigned sh = 0, sl = 0, all = 0;
	for (unsigned i = 0; i < SPR; i++) {
		sh += ss[i].hops;
		sl += ss[i].local_hops;
		all += M * ((p.g[i] + 1 < total_stages()) + (p.g[i] > 0));
	}
	ck_assert_uint_eq(sh + sl, all);
	const mbp_schedule *sc = mbp_trainer_schedule(mbp__mpi_trainer_local(p.t));
	if (mbp_schedule_threads(sc)) {
		unsigned fh = 0, fl = 0, seen[SPR], nseen = 0;
		for (unsigned i = 0; i < SPR; i++) {
			unsigned th = mbp_schedule_thread_of(sc, p.g[i], 0), k = 0;
			while (k < nseen && seen[k] != th)
				k++;
			if (k < nseen)
				continue;
			seen[nseen++] = th;
			mbp_sched_thread_figures f;
			ck_assert_int_eq(mbp_schedule_thread_figures(sc, 0, th, &f), 0);
			fh += f.hops;
			fl += f.local_hops;
		}
		ck_assert_msg(sh == fh && sl == fl,
			      "rank %d, %s: %u hops and %u local, the schedule's %u, %u", rank,
			      mbp_sched_name(kind), sh, sl, fh, fl);
	}
	ck_assert_uint_eq(st.stage0, p.g[0]);
	ck_assert_uint_eq(st.stages, total_stages());
	links_carried_three_steps(&p, &st, M);
	part_destroy(&p);
	mbp_trainer_destroy(s.t);
}

START_TEST(every_chunked_schedule_and_one_read_from_text_across_ranks_gives_the_single_process_parameters)
{
	for (size_t k = 0; k < sizeof(chunked) / sizeof(chunked[0]); k++)
		chunked_as_single(chunked[k], 0);
	/* interleaved on two threads a rank (a chunk each): a rank's two chunks hop between its threads */
	chunked_as_single(MBP_SCHED_INTERLEAVED, 2);
}
END_TEST

START_TEST(a_stage_failure_under_a_chunked_schedule_fails_the_step_everywhere_and_the_next_step_runs)
{
	const mbp_sched_kind ks[] = {MBP_SCHED_INTERLEAVED, MBP_SCHED_ZBV};
	for (size_t k = 0; k < 2; k++) {
		struct part p;
		struct single s;
		ck_assert_int_eq(part_chunked(&p, ks[k]), 0);
		single_new(&s, ks[k]);
		unsigned S = total_stages();
		/* the last chunk's forward (rank 0's under ZB-V); chunk 1's whole backward (interleaved), the
		 * middle chunk's B_in (ZB-V: the hop between two chunks of one rank) */
		bool v = ks[k] == MBP_SCHED_ZBV;
		failing_step(&p, &s, 0, S - 1, MBP_OP_F, 2, MBP_OP_F);
		failing_step(&p, &s, 2, v ? S / 2 : 1, v ? MBP_OP_BIN : MBP_OP_B, 0,
			     v ? MBP_OP_BIN : MBP_OP_B);
		end_counted(&p, &s, 2, 2);
	}
}
END_TEST

START_TEST(a_chunked_schedule_that_cannot_place_the_ranks_is_refused_on_every_rank_alike)
{
	/* two threads a rank: ZB-V would need four chunks a rank */
	struct part p;
	mbp_train_opts o = toy_opts(MBP_SCHED_ZBV);
	o.threads = 2;
	ck_assert_int_eq(part_start(&p, o), -EINVAL);
	ck_assert_str_eq(mbp_mpi_trainer_run_error(p.t),
			 "the schedule across ranks: threads: a chunked schedule needs the stages a multiple "
			 "of the threads (interleaved, looped BFS) or twice them (ZB-V, DualPipeV)");
	part_destroy(&p);
}
END_TEST

START_TEST(ranks_given_different_schedules_are_refused_at_start_on_every_rank)
{
	struct part p;
	ck_assert_int_eq(part_chunked(&p, rank == 1 ? MBP_SCHED_ZBV : MBP_SCHED_INTERLEAVED), -EINVAL);
	ck_assert_str_eq(mbp_mpi_trainer_run_error(p.t), "rank 1 has schedule 7, rank 0 4");
	part_destroy(&p);
	/* the same kind, other actions: two texts */
	mbp_train_opts o = toy_opts(MBP_SCHED_CUSTOM);
	mbp_schedule *sc = read_schedule(rank == 1 ? MBP_SCHED_INTERLEAVED : MBP_SCHED_ZBV);
	o.custom = sc;
	ck_assert_int_eq(part_start(&p, o), -EINVAL);
	ck_assert_msg(strstr(mbp_mpi_trainer_run_error(p.t),
			     "rank 1 has custom schedule (a hash of its actions)") != NULL,
		      "%s", mbp_mpi_trainer_run_error(p.t));
	mbp_schedule_destroy(sc);
	part_destroy(&p);
}
END_TEST

/* The replicas of global stage g in the replica tests: 2, 1, 3, 2, 1, 1, 2, 1, ... (a replicated stage at
 * either end of a rank's part, sending to and receiving from another rank's, replicated or not; with 4
 * ranks, rank 2's part has no replicas but plays the replicated order of the others). */
static unsigned reps_of(unsigned g)
{
	static const unsigned r[] = {2, 1, 3, 2, 1, 1, 2, 1};
	return r[g % 8];
}

/* A part whose stages have reps_of() replicas each (the toy's operations write only their buffers, so
 * the replicas share its context), under `kind` (`custom`: its schedule, or NULL). */
static int part_replicated(struct part *p, mbp_sched_kind kind, const mbp_schedule *custom)
{
	mbp_train_opts o = toy_opts(kind);
	o.custom = custom;
	stages_here(&o, p->g);
	mbp_mpi_opts mo;
	mbp_mpi_opts_init(&mo);
	mo.window = 2;
	mo.peer_timeout_ns = 20 * SEC;
	int rc = mbp_mpi_trainer_new(&p->t, &o, &mo);
	if (rc)
		return rc;
	live = p->t;
	for (unsigned i = 0; i < SPR && rc == 0; i++) {
		toy_init(&p->st[i], p->g[i] + 1);
		mbp_train_stage_desc d = toy_desc(&p->st[i], whole_backward(kind, p->g[i]));
		d.replicas = reps_of(p->g[i]);
		rc = mbp_mpi_trainer_add_stage(p->t, &d);
	}
	return rc ? rc : mbp_mpi_trainer_start(p->t);
}

/* The kinds the replica tests run: every block kind, and every chunked one (their placement copied per
 * replica) but text; their count. */
#define REPLICA_KINDS (sizeof(kinds) / sizeof(kinds[0]) + sizeof(chunked) / sizeof(chunked[0]))
static size_t replica_kinds(mbp_sched_kind *all)
{
	size_t n = 0;
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
		all[n++] = kinds[k];
	for (size_t k = 0; k < sizeof(chunked) / sizeof(chunked[0]); k++)
		if (chunked[k] != MBP_SCHED_CUSTOM)
			all[n++] = chunked[k];
	return n;
}

/* A replica test's rows a step under `kind`: 2R micro-batches for a chunked kind and ZB-H2, else ROWS. */
static size_t replica_rows(mbp_sched_kind kind)
{
	return mbp__sched_kind_placed(kind) || kind == MBP_SCHED_ZBH2 ? chunk_rows() : ROWS;
}

/* Replicated stages across ranks (train.h, "Replicas"): every rank learns every stage's replicas at
 * start and plays the same replicated order; a replica at a part's edge has its own links, the sender
 * sends a replicated stage's items in micro-batch order, the receiver hands micro-batch j to replica j
 * mod r. Losses and parameters are the single process's without replicas, bit for bit, every step; the
 * links carry each micro-batch once each way. */
START_TEST(replicated_stages_across_ranks_give_the_single_process_parameters_bit_for_bit)
{
	mbp_sched_kind all[REPLICA_KINDS];
	size_t nk = replica_kinds(all);
	for (size_t k = 0; k < nk; k++) {
		mbp_sched_kind kind = all[k];
		size_t rows = replica_rows(kind);
		unsigned M = (unsigned)((rows + MBR - 1) / MBR);
		struct part p;
		struct single s;
		ck_assert_int_eq(part_replicated(&p, kind, NULL), 0);
		single_new(&s, kind);
		three_steps_as_single(&p, &s, kind, rows);
		mbp_mpi_train_stats st;
		ck_assert_int_eq(mbp_mpi_trainer_stats_get(p.t, &st, NULL, 0), SPR);
		ck_assert_uint_eq(st.local.steps, 3);
		links_carried_three_steps(&p, &st, M);
		part_destroy(&p);
		mbp_trainer_destroy(s.t);
	}
}
END_TEST

/* A part with replicated stages (here or on another rank) is grown before its first step to a bound over
 * every timing too (train.h's promise for mbp_train_stats.pool): no later step allocates on any rank,
 * under every block kind and every chunked one but text, with one slow stage per step somewhere. */
START_TEST(no_rank_with_replicated_stages_allocates_a_buffer_after_the_first_step)
{
	mbp_sched_kind all[REPLICA_KINDS];
	size_t nk = replica_kinds(all);
	for (size_t k = 0; k < nk; k++) {
		mbp_sched_kind kind = all[k];
		size_t rows = replica_rows(kind);
		struct part p;
		ck_assert_int_eq(part_replicated(&p, kind, NULL), 0);
		ten_steps_allocate_nothing_after_the_first(&p, kind, rows);
		part_destroy(&p);
	}
}
END_TEST

/* A stage failing on one replica fails the step on every rank with nothing updated; the next step is
 * the single process's. */
START_TEST(a_replica_failing_across_ranks_fails_the_step_everywhere_and_the_next_step_is_exact)
{
	struct part p;
	struct single s;
	ck_assert_int_eq(part_replicated(&p, MBP_SCHED_1F1B, NULL), 0);
	single_new(&s, MBP_SCHED_1F1B);
	float in[ROWS * N], tg[ROWS * N];
	make_data(in, tg, ROWS, 0);
	step_as_single(&p, &s, in, tg);
	/* global stage 2 (three replicas): micro-batch 4 runs on its replica 1 */
	failing_step(&p, &s, 1, 2, MBP_OP_F, 4, MBP_OP_F);
	end_counted(&p, &s, 2, 1);
}
END_TEST

/* Under a schedule read from text or built from costs (MBP_SCHED_CUSTOM, MBP_SCHED_AUTO) a stage may run
 * its micro-batches out of order, which the ordered links of replicas across ranks cannot follow: refused
 * at start on every rank alike, the reason naming both. */
START_TEST(replicas_under_a_custom_or_built_schedule_are_refused_across_ranks_on_every_rank)
{
	for (int built = 0; built < 2; built++) {
		mbp_schedule *sc = NULL;
		if (built) {
			mbp_op_costs c[MBP_MAX_STAGES];
			for (unsigned g = 0; g < total_stages(); g++)
				c[g] = (mbp_op_costs){1, 1, 1};
			mbp_sched_build b = {.stages = total_stages(),
					     .mbs = (uint32_t)((chunk_rows() + MBR - 1) / MBR),
					     .threads = (unsigned)size,
					     .costs = c,
					     .split = true};
			ck_assert_int_eq(mbp_schedule_build(&sc, &b), 0);
		} else {
			sc = read_schedule(MBP_SCHED_ZBV);
		}
		struct part p;
		ck_assert_int_eq(part_replicated(&p, built ? MBP_SCHED_AUTO : MBP_SCHED_CUSTOM, sc),
				 -ENOTSUP);
		const char *why = mbp_mpi_trainer_run_error(p.t);
		ck_assert_msg(strstr(why, "failed to start") &&
				  strstr(why, "not under a custom or built schedule"),
			      "%s", why);
		mbp_schedule_destroy(sc);
		part_destroy(&p);
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("mpi_train");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, NULL, end_live);
	tcase_add_test(tc, every_schedule_across_ranks_gives_the_single_process_parameters_bit_for_bit);
	tcase_add_test(tc, a_stage_failure_on_another_rank_fails_the_step_everywhere_and_the_next_step_runs);
	tcase_add_test(tc, a_refusing_check_on_any_rank_fails_the_step_everywhere_before_any_update);
	tcase_add_test(tc, items_of_a_failed_step_left_on_the_wire_are_dropped_and_the_next_step_is_exact);
	tcase_add_test(tc, events_across_ranks_name_the_stages_by_their_global_index);
	tcase_add_test(tc, an_update_that_breaks_its_contract_fails_every_later_step_on_every_rank);
	tcase_add_test(tc, no_rank_allocates_a_buffer_after_the_first_step);
	tcase_add_test(tc, cancel_from_rank_0_mid_step_fails_it_on_every_rank_with_no_update);
	tcase_add_test(tc, cancel_before_the_start_reaches_every_rank_once_started);
	tcase_add_test(tc, drain_from_rank_0_mid_step_lets_it_finish_and_ends_the_run_on_every_rank);
	tcase_add_test(tc, a_step_too_large_for_max_mbs_is_refused_on_rank_0_and_the_next_step_runs);
	tcase_add_test(tc, a_rank_that_cannot_start_its_step_fails_it_everywhere_and_the_next_step_runs);
	tcase_add_test(tc, no_rank_sends_a_message_after_its_last_word_of_the_run);
	tcase_add_test(tc, widths_that_disagree_between_ranks_fail_start_on_every_rank);
	tcase_add_test(tc, a_gradient_wider_than_the_activation_is_refused_across_ranks);
	tcase_add_test(
	    tc,
	    every_chunked_schedule_and_one_read_from_text_across_ranks_gives_the_single_process_parameters);
	tcase_add_test(
	    tc, a_stage_failure_under_a_chunked_schedule_fails_the_step_everywhere_and_the_next_step_runs);
	tcase_add_test(tc, a_chunked_schedule_that_cannot_place_the_ranks_is_refused_on_every_rank_alike);
	tcase_add_test(tc, ranks_given_different_schedules_are_refused_at_start_on_every_rank);
	tcase_add_test(tc, replicated_stages_across_ranks_give_the_single_process_parameters_bit_for_bit);
	tcase_add_test(tc, no_rank_with_replicated_stages_allocates_a_buffer_after_the_first_step);
	tcase_add_test(tc,
		       a_replica_failing_across_ranks_fails_the_step_everywhere_and_the_next_step_is_exact);
	tcase_add_test(tc, replicas_under_a_custom_or_built_schedule_are_refused_across_ranks_on_every_rank);
	/* last: the items the others sent the rank that left, still on the wire as it closed, may land in the
	 * next run's communicator (MPI gives it the freed one's context) and take the place of that run's */
	tcase_add_test(tc,
		       a_rank_that_destroys_its_trainer_mid_run_ends_the_run_on_every_rank_with_econnreset);
	suite_add_tcase(s, tc);
	return s;
}

#include "mpi_main.h"

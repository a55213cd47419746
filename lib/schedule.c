/*
 * Training schedules: each stage's order of forward (F), backward (B, or B_in and W) operations.
 *
 * Stages may be chunks placed on fewer threads (train.h, "Chunks"): the chunked schedules are built as
 * each thread's list (below), ZB-H2 by the greedy list scheduler, and every one of them then goes the
 * way the stage lists go here: one global order from a play with unit costs, each stage's list its
 * projection.
 *
 * The stage lists are the published ones (train.h): GPipe, 1F1B (PipeDream-Flush) and ZB-H1 (1F1B's
 * forwards and input-gradient backwards, stage s deferring its first s weight gradients). From them one
 * global order is derived by playing them with unit costs, one thread per stage: every operation starts
 * when its stage is free and what it depends on has ended, and the global order is the operations sorted
 * by start time (then stage). An operation's dependencies end no later than it starts and costs are
 * positive, so they start strictly earlier and precede it in the order: the order is topological, and
 * every stage list (and every merge of consecutive stages' lists for one thread) is a subsequence of it,
 * so a thread blocked on an operation always waits for one that comes earlier in the global order, which
 * rules out a cycle of waits. The same player, given measured costs and a thread count, predicts the
 * bubble (mbp_schedule_simulate).
 *
 * Dependencies of (stage s, micro-batch j): F needs F(s-1, j); B or B_in needs B or B_in of (s+1, j), or
 * at the last stage its own F(j) (the loss follows the forward); W needs B_in(s, j). Each stage's list
 * already orders its own F before its backward of the same micro-batch.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <mbpipe.h>

#include "schedule.h"

static void push(struct mbp_schedule *sc, size_t *n, unsigned s, unsigned kind, unsigned mb)
{
	sc->stage_ops[*n] = (mbp_sched_op){.mb = mb, .stage = (uint16_t)s, .kind = (uint8_t)kind};
	(*n)++;
}

/* The published list of stage s, appended at sc->stage_ops + *n. With replicas (`reps`, per stage; NULL:
 * none) 1F1B's and ZB-H1's warm-up counts threads, not stages: stage s runs as many forwards ahead as
 * there are replicas from it to the last stage, less one (S - s - 1 with one each), so that a replicated
 * stage finds a micro-batch for each of its replicas. */
static void build_stage(struct mbp_schedule *sc, unsigned s, size_t *n, const unsigned *reps)
{
	unsigned S = sc->stages, M = sc->mbs;
	if (sc->kind == MBP_SCHED_GPIPE) {
		for (unsigned j = 0; j < M; j++)
			push(sc, n, s, MBP_OP_F, j);
		for (unsigned j = 0; j < M; j++)
			push(sc, n, s, MBP_OP_B, j);
		return;
	}
	bool zb = sc->kind == MBP_SCHED_ZBH1;
	unsigned bk = zb ? MBP_OP_BIN : MBP_OP_B;
	unsigned ahead = S - s - 1;
	if (reps) {
		ahead = 0;
		for (unsigned k = s; k < S; k++)
			ahead += reps[k] ? reps[k] : 1;
		ahead--;
	}
	unsigned warm = ahead < M ? ahead : M;
	unsigned w = 0; /* next weight gradient (ZB-H1) */
	for (unsigned j = 0; j < warm; j++)
		push(sc, n, s, MBP_OP_F, j);
	for (unsigned i = 0; i < M; i++) {
		if (i < M - warm)
			push(sc, n, s, MBP_OP_F, warm + i); /* steady: one forward, one backward */
		push(sc, n, s, bk, i);			    /* cool-down: backwards only */
		if (zb && i >= s)
			push(sc, n, s, MBP_OP_W, w++); /* the first s are deferred */
	}
	while (zb && w < M)
		push(sc, n, s, MBP_OP_W, w++);
}

static double op_cost(const mbp_op_costs *c, unsigned kind)
{
	switch (kind) {
	case MBP_OP_F:
		return c->f;
	case MBP_OP_B:
		return c->b_in + c->b_w;
	case MBP_OP_BIN:
		return c->b_in;
	default:
		return c->b_w;
	}
}

/*
 * The player. `lists[t]` (lengths len[t]) are the threads' operations in order; an operation starts at
 * max(its thread's clock, the end of what it needs). Writes each operation's start into start[] at the
 * index that idx[t][k] gives (NULL: not wanted). Returns the makespan and the busy sum, or -EDEADLK if the
 * lists cannot all run (a bug in a list: never for the published ones).
 */
struct player {
	const struct mbp_schedule *sc;
	const mbp_op_costs *costs;
	double *end_f, *end_b, *end_w; /* per (stage, mb): end time, or -1 while not run */
	const unsigned *reps;	       /* per stage: replicas (NULL: one each) */
};

/* A replicated stage's weight gradients run in micro-batch order (train.h, "Replicas"): the weight part
 * of (s, j) waits for that of (s, j - 1), which may run on another replica. */
static bool merges(const struct player *pl, const mbp_sched_op *op)
{
	return pl->reps && pl->reps[op->stage] > 1 && op->mb > 0 &&
	       (op->kind == MBP_OP_W || op->kind == MBP_OP_B);
}

static double dep_end(const struct player *pl, const mbp_sched_op *op)
{
	unsigned S = pl->sc->stages, M = pl->sc->mbs, s = op->stage, j = op->mb;
	switch (op->kind) {
	case MBP_OP_F:
		return s == 0 ? 0 : pl->end_f[(s - 1) * M + j];
	case MBP_OP_B:
	case MBP_OP_BIN:
		return s == S - 1 ? pl->end_f[s * M + j] : pl->end_b[(s + 1) * M + j];
	default:
		return pl->end_b[s * M + j];
	}
}

static int play(const struct mbp_schedule *sc, const mbp_op_costs *costs, const unsigned *reps,
		unsigned threads, const mbp_sched_op *const *lists, const size_t *len,
		const uint32_t *const *pos, double *start, double *makespan, double *busy,
		struct mbp__sched_scratch *x)
{
	size_t nm = (size_t)sc->stages * sc->mbs;
	MBP_VERIFY(x->n == sc->n && x->nm == nm && threads <= x->threads); /* made for this schedule */
	double *ends = x->ends, *clock = x->clock;
	size_t *next = x->next;
	int rc = 0;
	for (size_t i = 0; i < 3 * nm; i++)
		ends[i] = -1;
	for (unsigned t = 0; t < threads; t++) {
		next[t] = 0;
		clock[t] = 0;
	}
	struct player pl = {sc, costs, ends, ends + nm, ends + 2 * nm, reps};
	*makespan = 0;
	*busy = 0;
	for (bool progress = true; progress;) {
		progress = false;
		for (unsigned t = 0; t < threads; t++) {
			while (next[t] < len[t]) {
				const mbp_sched_op *op = &lists[t][next[t]];
				double dep = dep_end(&pl, op);
				if (dep < 0)
					break;
				size_t k = (size_t)op->stage * sc->mbs + op->mb;
				double wprev = merges(&pl, op) ? pl.end_w[k - 1] : 0;
				if (wprev < 0)
					break;
				double c = op_cost(&costs[op->stage], op->kind);
				double t0 = clock[t] > dep ? clock[t] : dep;
				clock[t] = t0 + c;
				if (wprev >
				    0) { /* the weight part (a B's after its b_in) waits for j - 1's */
					double w0 = op->kind == MBP_OP_B ? t0 + costs[op->stage].b_in : t0;
					double w = wprev > w0 ? wprev : w0;
					if (op->kind == MBP_OP_W)
						t0 = w;
					clock[t] = w + costs[op->stage].b_w;
				}
				(op->kind == MBP_OP_F	? pl.end_f
				 : op->kind == MBP_OP_W ? pl.end_w
							: pl.end_b)[k] = clock[t];
				if (op->kind == MBP_OP_B) /* a whole backward also ends the weight gradient */
					pl.end_w[k] = clock[t];
				/* a replica's B sends its input gradient after its b_in, before its merge */
				if (op->kind == MBP_OP_B && pl.reps && pl.reps[op->stage] > 1)
					pl.end_b[k] = t0 + costs[op->stage].b_in;
				if (start)
					start[pos ? pos[t][next[t]] : next[t]] = t0;
				*busy += c;
				if (clock[t] > *makespan)
					*makespan = clock[t];
				next[t]++;
				progress = true;
			}
		}
	}
	for (unsigned t = 0; t < threads; t++)
		if (next[t] != len[t])
			rc = -EDEADLK;
	return rc;
}

int mbp__sched_scratch_new(struct mbp__sched_scratch *x, const mbp_schedule *sc, unsigned threads)
{
	size_t n = sc->n, nm = (size_t)sc->stages * sc->mbs;
	/* one block: the doubles and size_t first (8-byte alignment), then the operations and positions */
	size_t bytes = (3 * nm + threads) * sizeof(double) + threads * sizeof(size_t) +
		       n * (sizeof(mbp_sched_op) + sizeof(uint32_t));
	char *p = malloc(bytes);
	*x = (struct mbp__sched_scratch){.mem = p, .n = n, .nm = nm, .threads = threads};
	if (!p)
		return -ENOMEM;
	x->ends = (double *)(void *)p;
	x->clock = x->ends + 3 * nm;
	x->next = (size_t *)(void *)(x->clock + threads);
	x->ops = (mbp_sched_op *)(void *)(x->next + threads);
	x->pos = (uint32_t *)(void *)(x->ops + n);
	return 0;
}

void mbp__sched_scratch_free(struct mbp__sched_scratch *x)
{
	free(x->mem);
	x->mem = NULL;
}

struct keyed {
	double start;
	size_t idx; /* index in stage_ops */
	unsigned stage;
};

static int by_start(const void *a, const void *b)
{
	const struct keyed *x = a, *y = b;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static void peaks(struct mbp_schedule *sc, unsigned s)
{
	unsigned stash = 0, held = 0, ps = 0, ph = 0;
	for (size_t k = sc->stage_off[s]; k < sc->stage_off[s + 1]; k++) {
		switch (sc->stage_ops[k].kind) {
		case MBP_OP_F:
			stash++;
			held++;
			break;
		case MBP_OP_B:
			stash--;
			held--;
			break;
		case MBP_OP_BIN:
			stash--;
			break;
		default:
			held--;
		}
		ps = stash > ps ? stash : ps;
		ph = held > ph ? held : ph;
	}
	sc->stash_peak[s] = ps;
	sc->held_peak[s] = ph;
}

/* ---- the chunked schedules' thread lists (global stage numbers) ----
 *
 * Each writes thread t's list at ops + *n: the published constructions (torch.distributed.pipelining's
 * ScheduleInterleaved1F1B, ScheduleLoopedBFS, ScheduleZBVZeroBubble and ScheduleDualPipeV, which follow
 * Megatron-LM, Lamy-Poirier 2022, Qi et al. 2024 and DeepSeek's DualPipe), written here from their rules,
 * with one change: every stage runs its forwards, its backwards and its weight gradients in micro-batch
 * order (looped BFS's backwards included, which PyTorch runs in reverse), so that the parameters after a
 * step are bit for bit the same under every schedule.
 */

struct tl {
	mbp_sched_op *ops;
	size_t n;
	unsigned mbs;
};

static void tl_push(struct tl *l, unsigned s, unsigned kind, unsigned mb)
{
	if (mb < l->mbs) /* ZB-V plans for at least 2p - 1 micro-batches and drops the others */
		l->ops[l->n++] = (mbp_sched_op){.mb = mb, .stage = (uint16_t)s, .kind = (uint8_t)kind};
}

/* Interleaved 1F1B and looped BFS on p threads, v = S / p chunks each (chunk l of thread t is stage
 * l * p + t). Interleaved: the forwards go round by round (a round: `per` micro-batches through every
 * chunk of the thread in turn, per = M / max(1, M / p) as PyTorch's flexible rounds, the last round
 * shorter when it does not divide M), the backwards the same with the chunks in reverse; thread t warms
 * up with (v - 1) * per + 2 (p - 1 - t) forwards, then one forward one backward, then the backwards left. */
static void build_looped(struct tl *l, unsigned S, unsigned M, unsigned p, unsigned t, bool bfs)
{
	unsigned v = S / p;
	if (bfs) {
		for (unsigned c = 0; c < v; c++)
			for (unsigned j = 0; j < M; j++)
				tl_push(l, c * p + t, MBP_OP_F, j);
		for (unsigned c = v; c-- > 0;)
			for (unsigned j = 0; j < M; j++)
				tl_push(l, c * p + t, MBP_OP_B, j);
		return;
	}
	/* rounds of `per` or per + 1 micro-batches (the first M mod rounds of them the longer), none
	 * shorter than p: PyTorch's flexible rounds where they divide M */
	unsigned rounds = M / p ? M / p : 1, per = M / rounds, q = M % rounds, total = v * M;
	unsigned warm = (v - 1) * (q ? per + 1 : per) + 2 * (p - 1 - t);
	warm = warm < total ? warm : total;
	unsigned kf = 0, kb = 0; /* forwards, backwards so far */
	while (kb < total) {
		bool fwd = kf < total && (kf < warm || kf - warm == kb);
		unsigned k = fwd ? kf++ : kb++;
		/* the k-th of its kind: its round (from `first`, `size` long), chunk and micro-batch */
		unsigned long_ops = v * (per + 1) * q, first, size, in;
		if (k < long_ops) {
			size = per + 1;
			first = k / (v * size) * size;
			in = k % (v * size);
		} else {
			size = per;
			first = q * (per + 1) + (k - long_ops) / (v * size) * size;
			in = (k - long_ops) % (v * size);
		}
		unsigned c = in / size, j = first + in % size;
		tl_push(l, (fwd ? c : v - 1 - c) * p + t, fwd ? MBP_OP_F : MBP_OP_B, j);
	}
}

/* ZB-V on p threads (thread t: chunks t and 2p - 1 - t), as ScheduleZBVZeroBubble builds it. */
static void build_zbv(struct tl *l, unsigned M, unsigned p, unsigned t)
{
	unsigned n = M > 2 * p - 1 ? M : 2 * p - 1, s0 = t, s1 = 2 * p - 1 - t;
	unsigned f0 = 0, f1 = 0, b0 = 0, b1 = 0;
	for (unsigned i = 0; i < 2 * (p - t) - 1; i++)
		tl_push(l, s0, MBP_OP_F, f0++);
	for (unsigned i = 0; i < t; i++) {
		tl_push(l, s1, MBP_OP_F, f1++);
		tl_push(l, s0, MBP_OP_F, f0++);
	}
	for (unsigned i = 0; i < p - t; i++) {
		tl_push(l, s1, MBP_OP_F, f1++);
		tl_push(l, s1, MBP_OP_BIN, b1);
		tl_push(l, s1, MBP_OP_W, b1++);
	}
	while (f1 < f0 || f0 < n) {
		if (f0 < n)
			tl_push(l, s0, MBP_OP_F, f0++);
		tl_push(l, s0, MBP_OP_BIN, b0);
		tl_push(l, s0, MBP_OP_W, b0++);
		tl_push(l, s1, MBP_OP_F, f1++);
		tl_push(l, s1, MBP_OP_BIN, b1);
		tl_push(l, s1, MBP_OP_W, b1++);
	}
	unsigned w0 = b0, w1 = b1;
	for (unsigned i = 0; i < t; i++) {
		tl_push(l, s0, MBP_OP_BIN, b0++);
		tl_push(l, s1, MBP_OP_BIN, b1++);
	}
	for (unsigned i = 0; i < p - t; i++) {
		tl_push(l, s0, MBP_OP_BIN, b0++);
		tl_push(l, s0, MBP_OP_W, w0++);
	}
	while (w1 < b1)
		tl_push(l, s1, MBP_OP_W, w1++);
	while (w0 < b0)
		tl_push(l, s0, MBP_OP_W, w0++);
}

/* DualPipeV on p threads, as ScheduleDualPipeV builds it (M >= 2p). Its overlapped forward and backward
 * of two micro-batches run back to back here, the forward first. */
struct dpv {
	struct tl *l;
	unsigned nf[2], nb[2]; /* per chunk of the thread: next forward, next backward */
	unsigned st[2];
	unsigned *wq; /* pending weight gradients, oldest first: chunk * mbs + micro-batch (room for 2M) */
	size_t wh, wt;
	bool zb;
};

static void dpv_f(struct dpv *d, unsigned c)
{
	tl_push(d->l, d->st[c], MBP_OP_F, d->nf[c]++);
}

static void dpv_b(struct dpv *d, unsigned c, bool whole)
{
	unsigned j = d->nb[c]++;
	tl_push(d->l, d->st[c], whole ? MBP_OP_B : MBP_OP_BIN, j);
	if (!whole)
		d->wq[d->wt++] = c * d->l->mbs + j;
}

static void dpv_w(struct dpv *d)
{
	if (d->wh == d->wt)
		return;
	unsigned q = d->wq[d->wh++];
	tl_push(d->l, d->st[q / d->l->mbs], MBP_OP_W, q % d->l->mbs);
}

static void build_dualpipev(struct tl *l, unsigned M, unsigned p, unsigned t, unsigned *wq)
{
	struct dpv d = {.l = l, .st = {t, 2 * p - 1 - t}, .wq = wq};
	for (unsigned i = 0; i < (p - t - 1) * 2; i++)
		dpv_f(&d, 0);
	for (unsigned i = 0; i < t + 1; i++) {
		dpv_f(&d, 0);
		dpv_f(&d, 1);
	}
	for (unsigned i = 0; i < p - t - 1; i++) {
		dpv_b(&d, 1, false);
		dpv_w(&d);
		dpv_f(&d, 1);
	}
	for (unsigned i = 0; i < M - 2 * p + t + 1; i++) {
		dpv_f(&d,
		      0); /* with the backward of chunk 1 (on the last thread, at first, not overlapped) */
		dpv_b(&d, 1, true);
		dpv_f(&d, 1);
		dpv_b(&d, 0, true);
	}
	for (unsigned i = 0; i < p - t - 1; i++) {
		dpv_b(&d, 1, true);
		dpv_f(&d, 1);
		dpv_b(&d, 0, true);
	}
	unsigned n6 = t + 1;
	for (unsigned i = 0; i < n6; i++) {
		if (i == n6 / 2 && t % 2 == 1)
			d.zb = true;
		dpv_b(&d, 1, !d.zb);
		if (i == n6 / 2 && t % 2 == 0)
			d.zb = true;
		dpv_b(&d, 0, !d.zb);
	}
	for (unsigned i = 0; i < p - t - 1; i++) {
		dpv_w(&d);
		dpv_b(&d, 0, !d.zb);
	}
	while (d.wh != d.wt)
		dpv_w(&d);
}

/* ---- the greedy list scheduler (ZB-H2, and mbp_schedule_build) ----
 *
 * Plays the step with the given costs and builds each thread's list as it goes: of the threads, the one
 * that can start an operation earliest takes one (ties: the lower thread); of its operations ready by
 * then, a backward (B or B_in) first, then a forward if the thread holds fewer micro-batch chunks than
 * its limit, then a weight gradient (the oldest); among several of one kind, the chunk nearest the loss
 * (the higher stage). Each stage runs its forwards, backwards and weight gradients in micro-batch order.
 * A thread that can start nothing waits for the others; when none can, the limit is too small: -EDEADLK.
 */
struct greedy {
	unsigned S, M, T;
	const uint16_t *thread_of;
	const mbp_op_costs *costs;
	const unsigned *limit; /* per thread; 0: none */
	bool split;	       /* B_in and W apart (else whole backwards) */
};

static int greedy_lists(const struct greedy *g, mbp_sched_op *ops, size_t *off)
{
	unsigned S = g->S, M = g->M, T = g->T;
	size_t nm = (size_t)S * M;
	double *ef = malloc(2 * nm * sizeof(double)), *eb = ef ? ef + nm : NULL;
	mbp_sched_op *tmp = malloc(nm * 3 * sizeof(*tmp));
	size_t *cnt = calloc(T, sizeof(size_t));
	if (!ef || !tmp || !cnt) {
		free(ef);
		free(tmp);
		free(cnt);
		return -ENOMEM;
	}
	unsigned nf[MBP_MAX_STAGES] = {0}, nb[MBP_MAX_STAGES] = {0}, nw[MBP_MAX_STAGES] = {0};
	double clock[MBP_MAX_STAGES] = {0};
	unsigned held[MBP_MAX_STAGES] = {0};
	size_t left = nm * (g->split ? 3 : 2);
	int rc = 0;
	/* tmp: the threads' lists one after another, each filled as the play goes */
	mbp_sched_op *lst[MBP_MAX_STAGES];
	size_t per[MBP_MAX_STAGES] = {0};
	for (unsigned s = 0; s < S; s++)
		per[g->thread_of[s]] += (size_t)M * (g->split ? 3 : 2);
	size_t acc = 0;
	for (unsigned t = 0; t < T; t++) {
		lst[t] = tmp + acc;
		acc += per[t];
	}
	while (left > 0) {
		unsigned bt = UINT_MAX;
		double best = INFINITY;
		for (unsigned t = 0; t < T; t++) {
			double e = INFINITY;
			for (unsigned s = 0; s < S; s++) {
				if (g->thread_of[s] != t)
					continue;
				unsigned j = nf[s];
				if (j < M && (!g->limit[t] || held[t] < g->limit[t]) &&
				    (s == 0 || nf[s - 1] > j))
					e = fmin(e, s == 0 ? 0 : ef[(s - 1) * M + j]);
				j = nb[s];
				if (j < nf[s] && (s == S - 1 || nb[s + 1] > j))
					e = fmin(e, s == S - 1 ? ef[s * M + j] : eb[(s + 1) * M + j]);
				j = nw[s];
				if (g->split && j < nb[s])
					e = fmin(e, eb[s * M + j]);
			}
			e = fmax(e, clock[t]);
			if (e < best) {
				best = e;
				bt = t;
			}
		}
		if (bt == UINT_MAX) {
			rc = -EDEADLK;
			break;
		}
		/* the thread's choice at `best`: a backward (the highest stage), else a forward (the
		 * highest stage), else a weight gradient (the oldest micro-batch, then the highest stage) */
		unsigned t = bt, cb = UINT_MAX, cf = UINT_MAX, cw = UINT_MAX;
		for (unsigned s = S; s-- > 0;) {
			if (g->thread_of[s] != t)
				continue;
			unsigned j = nb[s];
			if (cb == UINT_MAX && j < nf[s] && (s == S - 1 || nb[s + 1] > j) &&
			    (s == S - 1 ? ef[s * M + j] : eb[(s + 1) * M + j]) <= best)
				cb = s;
			j = nf[s];
			if (cf == UINT_MAX && j < M && (!g->limit[t] || held[t] < g->limit[t]) &&
			    (s == 0 || (nf[s - 1] > j && ef[(s - 1) * M + j] <= best)))
				cf = s;
			j = nw[s];
			if (g->split && j < nb[s] && eb[s * M + j] <= best && (cw == UINT_MAX || j < nw[cw]))
				cw = s;
		}
		unsigned cs = cb != UINT_MAX ? cb : cf != UINT_MAX ? cf : cw;
		unsigned ck = cb != UINT_MAX   ? (g->split ? MBP_OP_BIN : MBP_OP_B)
			      : cf != UINT_MAX ? MBP_OP_F
					       : MBP_OP_W;
		MBP_VERIFY(cs != UINT_MAX);
		const mbp_op_costs *c = &g->costs[cs];
		double end = best + (ck == MBP_OP_F	? c->f
				     : ck == MBP_OP_W	? c->b_w
				     : ck == MBP_OP_BIN ? c->b_in
							: c->b_in + c->b_w);
		unsigned j = ck == MBP_OP_F ? nf[cs]++ : ck == MBP_OP_W ? nw[cs]++ : nb[cs]++;
		if (ck == MBP_OP_F) {
			ef[cs * M + j] = end;
			held[t]++;
		} else if (ck != MBP_OP_W) {
			eb[cs * M + j] = end;
		}
		if (ck == MBP_OP_B || ck == MBP_OP_W)
			held[t]--;
		clock[t] = end;
		lst[t][cnt[t]++] = (mbp_sched_op){.mb = j, .stage = (uint16_t)cs, .kind = (uint8_t)ck};
		left--;
	}
	if (rc == 0) {
		off[0] = 0;
		for (unsigned t = 0; t < T; t++) {
			memcpy(ops + off[t], lst[t], cnt[t] * sizeof(*ops));
			off[t + 1] = off[t] + cnt[t];
		}
	}
	free(ef);
	free(tmp);
	free(cnt);
	return rc;
}

/* ---- from lists to a schedule ---- */

static void fault_set(struct mbp__sched_fault *f, unsigned list, size_t pos, const mbp_sched_op *op,
		      const char *what)
{
	if (!f)
		return;
	f->list = list;
	f->pos = pos;
	f->op = op ? *op : (mbp_sched_op){0};
	f->has_op = op != NULL;
	f->what = what;
}

/* The rules a list must keep before it is played: stages and micro-batches in range, each stage on one
 * list, per stage every micro-batch's forward once, and its backward once (B, or B_in and W), each kind in
 * micro-batch order (the rings hand micro-batches on in order; weight gradients in order keep the
 * parameters bit for bit), a W after its B_in. */
static int lists_check(const struct mbp_schedule *sc, const mbp_sched_op *ops, const size_t *off, unsigned nl,
		       struct mbp__sched_fault *f)
{
	unsigned S = sc->stages, M = sc->mbs;
	unsigned nf[MBP_MAX_STAGES] = {0}, nb[MBP_MAX_STAGES] = {0}, nw[MBP_MAX_STAGES] = {0};
	int owner[MBP_MAX_STAGES];
	uint8_t *how = calloc((size_t)S * M + 1, 1); /* 1: B, 2: B_in */
	if (!how)
		return -ENOMEM;
	for (unsigned s = 0; s < S; s++)
		owner[s] = -1;
	int rc = -EINVAL;
	for (unsigned t = 0; t < nl; t++)
		for (size_t k = off[t]; k < off[t + 1]; k++) {
			const mbp_sched_op *op = &ops[k];
			unsigned s = op->stage, j = op->mb;
			size_t pos = k - off[t];
			if (s >= S || op->kind > MBP_OP_W) {
				fault_set(f, t, pos, op, "no such stage or kind");
				goto out;
			}
			if (j >= M) {
				fault_set(f, t, pos, op, "no such micro-batch");
				goto out;
			}
			if (owner[s] >= 0 && (unsigned)owner[s] != t) {
				fault_set(f, t, pos, op, "the stage is on another thread's list too");
				goto out;
			}
			owner[s] = (int)t;
			unsigned *next = op->kind == MBP_OP_F	? &nf[s]
					 : op->kind == MBP_OP_W ? &nw[s]
								: &nb[s];
			if (j < *next) {
				fault_set(f, t, pos, op, "micro-batch repeated");
				goto out;
			}
			if (j > *next) {
				fault_set(
				    f, t, pos, op,
				    "out of micro-batch order (each stage runs each kind in micro-batch "
				    "order)");
				goto out;
			}
			if (op->kind == MBP_OP_W && how[(size_t)s * M + j] != 2) {
				fault_set(f, t, pos, op,
					  how[(size_t)s * M + j] == 1 ? "a W after a whole B"
								      : "a W before its B_in (I)");
				goto out;
			}
			if (op->kind == MBP_OP_B || op->kind == MBP_OP_BIN)
				how[(size_t)s * M + j] = op->kind == MBP_OP_B ? 1 : 2;
			if (op->kind == MBP_OP_B) /* a whole backward is its weight gradient too */
				nw[s]++;
			(*next)++;
		}
	for (unsigned s = 0; s < S; s++) {
		unsigned t = owner[s] >= 0 ? (unsigned)owner[s] : 0;
		mbp_sched_op miss = {.stage = (uint16_t)s};
		if (nf[s] < M || nb[s] < M || nw[s] < M) {
			miss.kind = nf[s] < M ? MBP_OP_F : nb[s] < M ? MBP_OP_B : MBP_OP_W;
			miss.mb = nf[s] < M ? nf[s] : nb[s] < M ? nb[s] : nw[s];
			fault_set(f, t, SIZE_MAX, &miss, "micro-batch missing");
			goto out;
		}
	}
	rc = 0;
out:
	free(how);
	return rc;
}

static void peaks(struct mbp_schedule *sc, unsigned s);

/*
 * Make sc (kind, stages, mbs, placement set) from nl lists: the stage lists (nl = S, block placement) or
 * the threads' lists. Checked (lists_check), played with unit costs to find the global order (a list that
 * cannot run names its first operation that waits forever), then each stage's list is its projection.
 */
static int sched_from_lists(struct mbp_schedule *sc, const mbp_sched_op *ops, const size_t *off, unsigned nl,
			    struct mbp__sched_fault *f)
{
	size_t n = off[nl];
	int rc = lists_check(sc, ops, off, nl, f);
	if (rc < 0)
		return rc;
	sc->n = n;
	sc->stage_ops = malloc(n * sizeof(mbp_sched_op));
	sc->order = malloc(n * sizeof(mbp_sched_op));
	struct keyed *key = malloc(n * sizeof(*key));
	double *start = malloc(n * sizeof(double));
	struct mbp__sched_scratch x = {0};
	rc = -ENOMEM;
	if (!sc->stage_ops || !sc->order || !key || !start || mbp__sched_scratch_new(&x, sc, nl) < 0)
		goto out;
	mbp_op_costs unit[MBP_MAX_STAGES];
	const mbp_sched_op *lists[MBP_MAX_STAGES];
	size_t len[MBP_MAX_STAGES];
	for (unsigned s = 0; s < sc->stages; s++)
		unit[s] = (mbp_op_costs){1, 1, 1};
	uint32_t *pos[MBP_MAX_STAGES];
	for (unsigned t = 0; t < nl; t++) {
		lists[t] = ops + off[t];
		len[t] = off[t + 1] - off[t];
		pos[t] = x.pos + off[t];
		for (size_t i = 0; i < len[t]; i++)
			pos[t][i] = (uint32_t)(off[t] + i);
	}
	double makespan, busy;
	rc = play(sc, unit, NULL, nl, lists, len, (const uint32_t *const *)pos, start, &makespan, &busy, &x);
	if (rc < 0) {
		/* name a list whose next operation needs one later in the same list (its own fault), else the
		 * first list that waits */
		int stuck = -1;
		bool own = false;
		for (unsigned t = 0; t < nl && !own; t++) {
			if (x.next[t] == len[t])
				continue;
			const mbp_sched_op *op = &lists[t][x.next[t]];
			for (size_t k = x.next[t] + 1; k < len[t] && !own; k++) {
				const mbp_sched_op *o = &lists[t][k];
				own = o->mb == op->mb &&
				      (op->kind == MBP_OP_F ? o->kind == MBP_OP_F && o->stage + 1 == op->stage
				       : op->kind == MBP_OP_W ? o->stage == op->stage
				       : op->stage + 1u == sc->stages
					   ? o->stage == op->stage && o->kind == MBP_OP_F
					   : o->stage == op->stage + 1 &&
						 (o->kind == MBP_OP_B || o->kind == MBP_OP_BIN));
			}
			if (stuck < 0 || own)
				stuck = (int)t;
		}
		fault_set(f, (unsigned)stuck, x.next[stuck], &lists[stuck][x.next[stuck]],
			  own ? "dependency broken: what it needs comes later in the same list"
			      : "deadlock: it waits for an operation that waits for it");
		rc = -EDEADLK;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		key[i] = (struct keyed){start[i], i, ops[i].stage};
	qsort(key, n, sizeof(*key), by_start);
	for (size_t i = 0; i < n; i++)
		sc->order[i] = ops[key[i].idx];
	/* each stage's list: its projection of the global order */
	size_t k = 0;
	for (unsigned s = 0; s < sc->stages; s++) {
		sc->stage_off[s] = k;
		for (size_t i = 0; i < n; i++)
			if (sc->order[i].stage == s)
				sc->stage_ops[k++] = sc->order[i];
	}
	sc->stage_off[sc->stages] = k;
	for (unsigned s = 0; s < sc->stages; s++)
		peaks(sc, s);
	rc = 0;
out:
	mbp__sched_scratch_free(&x);
	free(key);
	free(start);
	return rc;
}

static struct mbp_schedule *sched_alloc(mbp_sched_kind kind, unsigned stages, unsigned mbs)
{
	struct mbp_schedule *sc = calloc(1, sizeof(*sc));
	if (sc) {
		sc->kind = kind;
		sc->stages = stages;
		sc->mbs = mbs;
	}
	return sc;
}

/* Set sc's placement for `threads` threads: 0 or -EINVAL where the kind cannot place them. */
static int place(struct mbp_schedule *sc, unsigned threads)
{
	unsigned S = sc->stages;
	switch (sc->kind) {
	case MBP_SCHED_INTERLEAVED:
	case MBP_SCHED_LOOPED_BFS:
		if (!threads)
			threads = S / 2;
		if (threads == 0 || S % threads != 0)
			return -EINVAL;
		sc->place = MBP_PLACE_INTERLEAVED;
		for (unsigned s = 0; s < S; s++)
			sc->thread_of[s] = (uint16_t)(s % threads);
		break;
	case MBP_SCHED_ZBV:
	case MBP_SCHED_DUALPIPEV:
		if (!threads)
			threads = S / 2;
		if (threads == 0 || S != 2 * threads)
			return -EINVAL;
		sc->place = MBP_PLACE_V;
		for (unsigned s = 0; s < S; s++)
			sc->thread_of[s] = (uint16_t)(s < threads ? s : 2 * threads - 1 - s);
		break;
	default:
		sc->place = MBP_PLACE_BLOCK;
		threads = 0;
	}
	sc->threads = threads;
	return 0;
}

static int new_schedule(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs,
			unsigned threads, const unsigned *reps);

int mbp_schedule_new_placed(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs,
			    unsigned threads)
{
	return new_schedule(sp, kind, stages, mbs, threads, NULL);
}

int mbp_schedule_new_replicated(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs,
				const unsigned *replicas)
{
	if (!replicas || (kind != MBP_SCHED_GPIPE && kind != MBP_SCHED_1F1B && kind != MBP_SCHED_DEFAULT &&
			  kind != MBP_SCHED_ZBH1 && kind != MBP_SCHED_ZBH2))
		return -EINVAL;
	for (unsigned s = 0; s < stages && s < MBP_MAX_STAGES; s++)
		if (replicas[s] > MBP_TRAIN_MAX_REPLICAS)
			return -EINVAL;
	return new_schedule(sp, kind, stages, mbs, 0, replicas);
}

static int new_schedule(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs,
			unsigned threads, const unsigned *reps)
{
	if (!sp || stages == 0 || stages > MBP_MAX_STAGES || mbs == 0 || mbs > MBP_TRAIN_MAX_MBS ||
	    threads > stages)
		return -EINVAL;
	*sp = NULL;
	if (kind == MBP_SCHED_DEFAULT)
		kind = MBP_SCHED_1F1B;
	if ((unsigned)kind > MBP_SCHED_DUALPIPEV)
		return -EINVAL;
	struct mbp_schedule *sc = sched_alloc(kind, stages, mbs);
	if (!sc)
		return -ENOMEM;
	int rc = place(sc, threads);
	if (rc == 0 && kind == MBP_SCHED_DUALPIPEV && mbs < stages)
		rc = -EINVAL;
	if (rc < 0) {
		free(sc);
		return rc;
	}
	unsigned nl = sc->threads ? sc->threads : stages;
	size_t cap = (size_t)stages * mbs * 3;
	mbp_sched_op *ops = malloc(cap * sizeof(*ops));
	unsigned *wq = malloc(2 * (size_t)mbs * sizeof(*wq));
	size_t off[MBP_MAX_STAGES + 1];
	rc = -ENOMEM;
	if (!ops || !wq)
		goto fail;
	if (kind == MBP_SCHED_ZBH2) {
		/* the greedy player with unit costs, one thread per stage, each holding at most 2S - 1 */
		uint16_t self[MBP_MAX_STAGES];
		unsigned limit[MBP_MAX_STAGES];
		mbp_op_costs unit[MBP_MAX_STAGES];
		for (unsigned s = 0; s < stages; s++) {
			self[s] = (uint16_t)s;
			limit[s] = 2 * stages - 1;
			unit[s] = (mbp_op_costs){1, 1, 1};
		}
		struct greedy g = {stages, mbs, stages, self, unit, limit, true};
		rc = greedy_lists(&g, ops, off);
		if (rc < 0)
			goto fail;
	} else {
		struct tl l = {ops, 0, mbs};
		for (unsigned t = 0; t < nl; t++) {
			off[t] = l.n;
			switch (kind) {
			case MBP_SCHED_INTERLEAVED:
			case MBP_SCHED_LOOPED_BFS:
				build_looped(&l, stages, mbs, nl, t, kind == MBP_SCHED_LOOPED_BFS);
				break;
			case MBP_SCHED_ZBV:
				build_zbv(&l, mbs, nl, t);
				break;
			case MBP_SCHED_DUALPIPEV:
				build_dualpipev(&l, mbs, nl, t, wq);
				break;
			default:
				sc->stage_ops = ops; /* build_stage appends there */
				build_stage(sc, t, &l.n, reps);
				sc->stage_ops = NULL;
			}
		}
		off[nl] = l.n;
	}
	struct mbp__sched_fault f = {0};
	rc = sched_from_lists(sc, ops, off, nl, &f);
	MBP_VERIFY(rc != -EINVAL && rc != -EDEADLK); /* the published lists always run (test_schedule) */
	if (rc < 0)
		goto fail;
	free(ops);
	free(wq);
	*sp = sc;
	return 0;
fail:
	free(ops);
	free(wq);
	mbp_schedule_destroy(sc);
	return rc;
}

int mbp_schedule_new(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs)
{
	return mbp_schedule_new_placed(sp, kind, stages, mbs, 0);
}

void mbp_schedule_destroy(mbp_schedule *sc)
{
	if (!sc)
		return;
	free(sc->stage_ops);
	free(sc->order);
	free(sc);
}

mbp_sched_kind mbp_schedule_kind(const mbp_schedule *sc)
{
	return sc ? sc->kind : MBP_SCHED_DEFAULT;
}

unsigned mbp_schedule_stages(const mbp_schedule *sc)
{
	return sc ? sc->stages : 0;
}

unsigned mbp_schedule_mbs(const mbp_schedule *sc)
{
	return sc ? sc->mbs : 0;
}

size_t mbp_schedule_order(const mbp_schedule *sc, const mbp_sched_op **ops)
{
	if (!sc || !ops)
		return 0;
	*ops = sc->order;
	return sc->n;
}

size_t mbp_schedule_stage_ops(const mbp_schedule *sc, unsigned stage, const mbp_sched_op **ops)
{
	if (!sc || !ops || stage >= sc->stages)
		return 0;
	*ops = sc->stage_ops + sc->stage_off[stage];
	return sc->stage_off[stage + 1] - sc->stage_off[stage];
}

unsigned mbp_schedule_stash_peak(const mbp_schedule *sc, unsigned stage)
{
	return sc && stage < sc->stages ? sc->stash_peak[stage] : 0;
}

unsigned mbp_schedule_held_peak(const mbp_schedule *sc, unsigned stage)
{
	return sc && stage < sc->stages ? sc->held_peak[stage] : 0;
}

int mbp__schedule_thread_lists(const mbp_schedule *sc, unsigned threads, mbp_sched_op *ops, size_t *off)
{
	return sc ? mbp__schedule_part_lists(sc, 0, sc->stages, threads, ops, off) : -EINVAL;
}

/* The thread count a call means: `threads`, or the schedule's own, or one per stage; 0 when it cannot. */
static unsigned threads_meant(const mbp_schedule *sc, unsigned threads)
{
	if (sc->threads)
		return threads == 0 || threads == sc->threads ? sc->threads : 0;
	return threads == 0 ? sc->stages : threads <= sc->stages ? threads : 0;
}

/* The thread of local stage s of a part of `count` stages on `threads` threads. */
static unsigned part_thread(const mbp_schedule *sc, unsigned s, unsigned count, unsigned threads)
{
	return sc->threads ? sc->thread_of[s] : mbp__stage_thread(s, count, threads);
}

int mbp__schedule_part_lists(const mbp_schedule *sc, unsigned first, unsigned count, unsigned threads,
			     mbp_sched_op *ops, size_t *off)
{
	if (!sc || count == 0 || first + count > sc->stages || threads == 0 || threads > count)
		return -EINVAL;
	if (sc->threads && (first != 0 || count != sc->stages || threads != sc->threads))
		return -EINVAL; /* a placed schedule runs whole, on its own threads */
	uint16_t global[MBP_MAX_STAGES], thread[MBP_MAX_STAGES];
	for (unsigned s = 0; s < count; s++) {
		global[s] = (uint16_t)(first + s);
		thread[s] = (uint16_t)part_thread(sc, s, count, threads);
	}
	mbp__schedule_local_lists(sc, global, thread, NULL, count, threads, ops, off);
	return 0;
}

void mbp__schedule_local_lists(const mbp_schedule *sc, const uint16_t *global, const uint16_t *thread,
			       const unsigned *reps, unsigned count, unsigned threads, mbp_sched_op *ops,
			       size_t *off)
{
	int16_t local[MBP_MAX_STAGES];
	uint16_t nrep[MBP_MAX_STAGES];
	for (unsigned s = 0; s < sc->stages; s++)
		local[s] = -1;
	for (unsigned k = 0; k < count; k++) {
		local[global[k]] = (int16_t)k;
		nrep[k] = (uint16_t)(reps && reps[k] ? reps[k] : 1);
	}
	/* the list of an operation of local stage k: its thread, plus its replica (micro-batch mod r) */
#define LIST_OF(o) (thread[local[(o).stage]] + (o).mb % nrep[local[(o).stage]])
	/* counting pass, then placement: each thread's operations in global order */
	for (unsigned t = 0; t <= threads; t++)
		off[t] = 0;
	for (size_t i = 0; i < sc->n; i++)
		if (local[sc->order[i].stage] >= 0)
			off[LIST_OF(sc->order[i]) + 1]++;
	for (unsigned t = 0; t < threads; t++)
		off[t + 1] += off[t];
	size_t fill[MBP_MAX_STAGES + 1];
	memcpy(fill, off, (threads + 1) * sizeof(size_t));
	for (size_t i = 0; i < sc->n; i++) {
		mbp_sched_op o = sc->order[i];
		int k = local[o.stage];
		if (k < 0)
			continue;
		size_t at = fill[LIST_OF(o)]++;
		o.stage = (uint16_t)k;
		ops[at] = o;
	}
#undef LIST_OF
}

/* A play in a room of its own on `threads` threads: with replicas `reps` (one thread each), or without. */
static int simulate_once(const mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
			 const unsigned *reps, mbp_sched_sim *out, double *start)
{
	struct mbp__sched_scratch x;
	int rc = mbp__sched_scratch_new(&x, sc, threads);
	if (rc == 0)
		rc = reps ? mbp__schedule_simulate_rep_in(sc, costs, reps, out, start, &x)
			  : mbp__schedule_simulate_in(sc, costs, threads, out, start, &x);
	mbp__sched_scratch_free(&x);
	return rc;
}

int mbp_schedule_simulate(const mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
			  mbp_sched_sim *out, double *start)
{
	if (!sc || !costs || !out || !(threads = threads_meant(sc, threads)))
		return -EINVAL;
	return simulate_once(sc, costs, threads, NULL, out, start);
}

int mbp__schedule_simulate_in(const mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
			      mbp_sched_sim *out, double *start, struct mbp__sched_scratch *x)
{
	if (!sc || !costs || !out || !(threads = threads_meant(sc, threads)))
		return -EINVAL;
	for (unsigned s = 0; s < sc->stages; s++)
		if (!(costs[s].f >= 0 && costs[s].b_in >= 0 && costs[s].b_w >= 0))
			return -EINVAL;
	mbp_sched_op *ops = x->ops;
	uint32_t *posbuf = x->pos;
	size_t off[MBP_MAX_STAGES + 1];
	mbp__schedule_thread_lists(sc, threads, ops, off);
	/* position of each thread-list entry in the global order: threads' lists keep the global order, so
	 * a merge walk recovers it */
	size_t fill[MBP_MAX_STAGES + 1];
	memcpy(fill, off, sizeof(fill));
	for (size_t i = 0; i < sc->n; i++)
		posbuf[fill[mbp__sched_thread(sc, sc->order[i].stage, threads)]++] = (uint32_t)i;
	const mbp_sched_op *lists[MBP_MAX_STAGES];
	size_t len[MBP_MAX_STAGES];
	const uint32_t *pos[MBP_MAX_STAGES];
	for (unsigned t = 0; t < threads; t++) {
		lists[t] = ops + off[t];
		len[t] = off[t + 1] - off[t];
		pos[t] = posbuf + off[t];
	}
	double makespan, busy;
	int rc = play(sc, costs, NULL, threads, lists, len, pos, start, &makespan, &busy, x);
	if (rc == 0) {
		out->makespan = makespan;
		out->busy = busy;
		out->bubble = makespan > 0 ? 1.0 - busy / (threads * makespan) : 0;
	}
	return rc;
}

int mbp__replica_bases(unsigned stages, unsigned threads, const uint16_t *thread_of, const unsigned *reps,
		       uint16_t *base, unsigned *lists)
{
	if (!reps || stages == 0 || stages > MBP_MAX_STAGES)
		return -EINVAL;
	/* copies[t]: the threads of the schedule's thread t (the block placement: one per stage), the most
	 * replicas of its stages */
	unsigned nt = threads ? threads : stages, copies[MBP_MAX_STAGES] = {0}, first[MBP_MAX_STAGES], U = 0;
	for (unsigned s = 0; s < stages; s++) {
		unsigned r = reps[s] ? reps[s] : 1, t = threads ? thread_of[s] : s;
		if (r > MBP_TRAIN_MAX_REPLICAS)
			return -EINVAL;
		copies[t] = r > copies[t] ? r : copies[t];
	}
	for (unsigned t = 0; t < nt; t++) {
		first[t] = U;
		if ((U += copies[t]) > MBP_MAX_STAGES)
			return -EINVAL;
	}
	for (unsigned s = 0; s < stages; s++)
		base[s] = (uint16_t)first[threads ? thread_of[s] : s];
	*lists = U;
	return 0;
}

int mbp__schedule_replica_lists(const mbp_schedule *sc, const unsigned *reps, mbp_sched_op *ops, size_t *off,
				unsigned *units)
{
	uint16_t global[MBP_MAX_STAGES], base[MBP_MAX_STAGES];
	unsigned U;
	int rc = sc ? mbp__replica_bases(sc->stages, sc->threads, sc->thread_of, reps, base, &U) : -EINVAL;
	if (rc < 0)
		return rc;
	for (unsigned s = 0; s < sc->stages; s++)
		global[s] = (uint16_t)s;
	/* replica k of stage s on list base[s] + k: copy k of its thread */
	mbp__schedule_local_lists(sc, global, base, reps, sc->stages, U, ops, off);
	*units = U;
	return 0;
}

int mbp__schedule_simulate_rep_in(const mbp_schedule *sc, const mbp_op_costs *costs, const unsigned *reps,
				  mbp_sched_sim *out, double *start, struct mbp__sched_scratch *x)
{
	if (!sc || !costs || !reps || !out)
		return -EINVAL;
	for (unsigned s = 0; s < sc->stages; s++)
		if (!(costs[s].f >= 0 && costs[s].b_in >= 0 && costs[s].b_w >= 0))
			return -EINVAL;
	size_t off[MBP_MAX_STAGES + 1];
	unsigned U;
	int rc = mbp__schedule_replica_lists(sc, reps, x->ops, off, &U);
	if (rc < 0 || U > x->threads)
		return -EINVAL;
	/* each list entry's position in the global order: the lists keep it, so a merge walk recovers it */
	size_t fill[MBP_MAX_STAGES + 1];
	memcpy(fill, off, sizeof(fill));
	uint16_t base[MBP_MAX_STAGES];
	mbp__replica_bases(sc->stages, sc->threads, sc->thread_of, reps, base, &U); /* checked above */
	for (size_t i = 0; i < sc->n; i++) {
		const mbp_sched_op *o = &sc->order[i];
		x->pos[fill[base[o->stage] + o->mb % (reps[o->stage] ? reps[o->stage] : 1)]++] = (uint32_t)i;
	}
	const mbp_sched_op *lists[MBP_MAX_STAGES];
	size_t len[MBP_MAX_STAGES];
	const uint32_t *pos[MBP_MAX_STAGES];
	for (unsigned u = 0; u < U; u++) {
		lists[u] = x->ops + off[u];
		len[u] = off[u + 1] - off[u];
		pos[u] = x->pos + off[u];
	}
	double makespan, busy;
	rc = play(sc, costs, reps, U, lists, len, pos, start, &makespan, &busy, x);
	if (rc == 0) {
		out->makespan = makespan;
		out->busy = busy;
		out->bubble = makespan > 0 ? 1.0 - busy / (U * makespan) : 0;
	}
	return rc;
}

int mbp_schedule_simulate_replicas(const mbp_schedule *sc, const mbp_op_costs *costs,
				   const unsigned *replicas, mbp_sched_sim *out, double *start)
{
	uint16_t base[MBP_MAX_STAGES];
	unsigned U;
	int rc =
	    sc ? mbp__replica_bases(sc->stages, sc->threads, sc->thread_of, replicas, base, &U) : -EINVAL;
	return rc < 0 ? rc : simulate_once(sc, costs, U, replicas, out, start);
}

static const struct {
	const char *name;
	mbp_sched_kind kind;
} sched_names[] = {{"gpipe", MBP_SCHED_GPIPE},
		   {"1f1b", MBP_SCHED_1F1B},
		   {"zbh1", MBP_SCHED_ZBH1},
		   {"interleaved", MBP_SCHED_INTERLEAVED},
		   {"looped-bfs", MBP_SCHED_LOOPED_BFS},
		   {"zbh2", MBP_SCHED_ZBH2},
		   {"zbv", MBP_SCHED_ZBV},
		   {"dualpipev", MBP_SCHED_DUALPIPEV},
		   {"auto", MBP_SCHED_AUTO},
		   {"custom", MBP_SCHED_CUSTOM},
		   /* other spellings, parsed only */
		   {"zb-h1", MBP_SCHED_ZBH1},
		   {"zb", MBP_SCHED_ZBH1},
		   {"zb-h2", MBP_SCHED_ZBH2},
		   {"zb-v", MBP_SCHED_ZBV},
		   {"interleaved-1f1b", MBP_SCHED_INTERLEAVED},
		   {"i1f1b", MBP_SCHED_INTERLEAVED},
		   {"loopedbfs", MBP_SCHED_LOOPED_BFS},
		   {"bfs", MBP_SCHED_LOOPED_BFS},
		   {"dualpipe-v", MBP_SCHED_DUALPIPEV}};

const char *mbp_sched_name(mbp_sched_kind kind)
{
	if (kind == MBP_SCHED_DEFAULT)
		kind = MBP_SCHED_1F1B;
	for (size_t i = 0; i < MBP_ARRAY_SIZE(sched_names); i++)
		if (sched_names[i].kind == kind)
			return sched_names[i].name;
	return "?";
}

int mbp_sched_parse(const char *name, mbp_sched_kind *kind)
{
	if (!name || !kind)
		return -EINVAL;
	for (size_t i = 0; i < MBP_ARRAY_SIZE(sched_names); i++)
		if (sched_names[i].kind != MBP_SCHED_CUSTOM && strcasecmp(name, sched_names[i].name) == 0) {
			*kind = sched_names[i].kind;
			return 0;
		}
	return -EINVAL;
}

mbp_sched_place mbp_schedule_placement(const mbp_schedule *sc)
{
	return sc ? sc->place : MBP_PLACE_BLOCK;
}

unsigned mbp_schedule_threads(const mbp_schedule *sc)
{
	return sc ? sc->threads : 0;
}

unsigned mbp_schedule_thread_of(const mbp_schedule *sc, unsigned stage, unsigned threads)
{
	if (!sc || stage >= sc->stages || !(threads = threads_meant(sc, threads)))
		return UINT32_MAX;
	return mbp__sched_thread(sc, stage, threads);
}

int mbp_schedule_thread_figures(const mbp_schedule *sc, unsigned threads, unsigned thread,
				mbp_sched_thread_figures *out)
{
	if (!sc || !out || !(threads = threads_meant(sc, threads)) || thread >= threads)
		return -EINVAL;
	unsigned S = sc->stages, stash = 0, held = 0;
	*out = (mbp_sched_thread_figures){0};
	for (size_t i = 0; i < sc->n; i++) {
		const mbp_sched_op *op = &sc->order[i];
		unsigned s = op->stage;
		if (mbp__sched_thread(sc, s, threads) != thread)
			continue;
		/* the hop it ends with: F's output to s + 1, a backward's input gradient to s - 1 */
		int to = op->kind == MBP_OP_F	? (s + 1 < S ? (int)s + 1 : -1)
			 : op->kind != MBP_OP_W ? (s > 0 ? (int)s - 1 : -1)
						: -1;
		if (to >= 0 && mbp__sched_thread(sc, (unsigned)to, threads) == thread)
			out->local_hops++;
		else if (to >= 0)
			out->hops++;
		stash += op->kind == MBP_OP_F;
		held += op->kind == MBP_OP_F;
		stash -= op->kind == MBP_OP_B || op->kind == MBP_OP_BIN;
		held -= op->kind == MBP_OP_B || op->kind == MBP_OP_W;
		out->stash_peak = stash > out->stash_peak ? stash : out->stash_peak;
		out->held_peak = held > out->held_peak ? held : out->held_peak;
	}
	return 0;
}

/* ---- the buffers a part holds at most (the trainer's pool size) ----
 *
 * A state of a step is where each thread is in its list: position 2k once its first k operations have
 * ended, 2k + 1 while operation k runs. The states a run can reach are exactly those in which every started
 * operation's dependencies have ended (a cut of the operations' partial order: some interleaving has it as
 * a prefix). Dependencies link neighbouring stages only, so with the part's threads in pipeline order, and
 * each remote neighbour as one more process that runs its stage's list, reachability is a condition on each
 * pair of neighbours: the last stage of process a at position x and the first of process a + 1 at y need
 * lo(y) <= x <= hi(y) (the forwards a + 1 started need a's ended; the backwards a started need a + 1's
 * ended), both bounds non-decreasing in y. Every buffer's life starts and ends with operations of one
 * process or of two neighbours, and each side of it counts in its own process (a link holds
 * F ended at s - last backward ended at s + 1, plus B ended at s + 1 - last backward ended at s, which
 * regroups per stage), so the buffers held are a sum of one term per process, V_a(x_a). The most over the
 * reachable states is then a longest path along the chain: best_a(y) = V_a(y) + the most of best_{a-1}
 * over [lo(y), hi(y)], a sliding-window maximum: linear in the operations.
 */

struct bproc {
	const mbp_sched_op *ops; /* global stage numbers */
	size_t L;
	unsigned s0, s1; /* its stages */
	bool local;	 /* a thread of the part (not a remote neighbour) */
};

#define PEAK_NONE INT64_MIN

static bool is_bwd(unsigned kind)
{
	return kind == MBP_OP_B || kind == MBP_OP_BIN;
}

/* V(x) for x = 0 .. 2L of process p; `prev`, `next`: it has a neighbour process before, after. */
static void proc_values(const struct mbp_schedule *sc, const struct mbp__sched_part *part,
			const struct bproc *p, bool prev, bool next, int64_t *val)
{
	int64_t v = 0;
	val[0] = 0;
	for (size_t k = 0; k < p->L; k++) {
		const mbp_sched_op *op = &p->ops[k];
		unsigned s = op->stage;
		/* the links this stage's buffers count on: to the stage after it and to the one before */
		int64_t up = s < p->s1 || next, down = s > p->s0 || prev;
		/* per micro-batch held: its stash, and at the global last stage the loss's gradient */
		int64_t w = p->local ? (int64_t)part->stash[s - part->first] + (s == sc->stages - 1) : 0;
		int64_t filling =
		    0; /* the buffer the running operation fills: F's output, B's input gradient */
		if (op->kind == MBP_OP_F) {
			v += w;
			filling = p->local;
		} else if (is_bwd(op->kind)) {
			filling = p->local && s > 0;
		}
		val[2 * k + 1] = v + filling;
		if (op->kind == MBP_OP_F)
			v += up; /* the output, pushed: the next stage's input until its last backward */
		if (is_bwd(op->kind))
			v +=
			    down; /* the input gradient, pushed: the previous stage's until its last backward */
		if (op->kind == MBP_OP_B || op->kind == MBP_OP_W)
			v -= w + up + down; /* the micro-batch's last: stash, input and output gradient go */
		val[2 * k + 2] = v;
	}
}

int mbp__schedule_buffer_peak(const mbp_schedule *sc, const struct mbp__sched_part *part, uint64_t *peak)
{
	unsigned S = sc->stages, M = sc->mbs, first = part->first, T = part->threads;
	struct bproc pr[MBP_MAX_STAGES + 2];
	unsigned K = 0;
	if (first > 0) {
		unsigned s = first - 1;
		pr[K++] = (struct bproc){sc->stage_ops + sc->stage_off[s],
					 sc->stage_off[s + 1] - sc->stage_off[s], s, s, false};
	}
	size_t longest = 0, local_n = part->off[T];
	mbp_sched_op *gops = malloc((local_n ? local_n : 1) * sizeof(*gops));
	if (!gops)
		return -ENOMEM;
	for (unsigned t = 0; t < T; t++) {
		struct bproc *p = &pr[K++];
		*p = (struct bproc){gops + part->off[t], part->off[t + 1] - part->off[t], UINT_MAX, 0, true};
		for (size_t k = part->off[t]; k < part->off[t + 1]; k++) {
			gops[k] = part->ops[k];
			gops[k].stage = (uint16_t)(gops[k].stage + first);
			p->s0 = gops[k].stage < p->s0 ? gops[k].stage : p->s0;
			p->s1 = gops[k].stage > p->s1 ? gops[k].stage : p->s1;
		}
	}
	if (first + part->count < S) {
		unsigned s = first + part->count;
		pr[K++] = (struct bproc){sc->stage_ops + sc->stage_off[s],
					 sc->stage_off[s + 1] - sc->stage_off[s], s, s, false};
	}
	for (unsigned a = 0; a < K; a++)
		longest = pr[a].L > longest ? pr[a].L : longest;
	size_t np = 2 * longest + 1;
	int64_t *val = malloc(np * sizeof(int64_t)), *best = malloc(np * sizeof(int64_t)),
		*cur = malloc(np * sizeof(int64_t));
	size_t *dq = malloc(np * sizeof(size_t)), *fpos = malloc(M * sizeof(size_t)),
	       *bpos = malloc(M * sizeof(size_t));
	int rc = -ENOMEM;
	if (!val || !best || !cur || !dq || !fpos || !bpos)
		goto out;
	proc_values(sc, part, &pr[0], false, K > 1, best);
	for (unsigned a = 1; a < K; a++) {
		const struct bproc *pa = &pr[a - 1], *pb = &pr[a];
		/* where a - 1's last stage runs each micro-batch's forward and backward */
		for (size_t k = 0; k < pa->L; k++)
			if (pa->ops[k].stage == pa->s1 && pa->ops[k].kind == MBP_OP_F)
				fpos[pa->ops[k].mb] = k;
			else if (pa->ops[k].stage == pa->s1 && is_bwd(pa->ops[k].kind))
				bpos[pa->ops[k].mb] = k;
		proc_values(sc, part, pb, true, a + 1 < K, val);
		size_t head = 0, tail = 0, nx = 0, xmax = 2 * pa->L;
		unsigned f = 0, bb = 0; /* forwards of b's first stage started, its backwards ended */
		for (size_t y = 0; y <= 2 * pb->L; y++) {
			const mbp_sched_op *op = y ? &pb->ops[(y - 1) / 2] : NULL;
			if (op && op->stage == pb->s0 && (y & 1) && op->kind == MBP_OP_F)
				f++;
			if (op && op->stage == pb->s0 && !(y & 1) && is_bwd(op->kind))
				bb++;
			size_t lo = f ? 2 * fpos[f - 1] + 2 : 0, hi = bb < M ? 2 * bpos[bb] : xmax;
			for (; nx <= hi; nx++) {
				if (best[nx] == PEAK_NONE)
					continue;
				while (tail > head && best[dq[tail - 1]] <= best[nx])
					tail--;
				dq[tail++] = nx;
			}
			while (head < tail && dq[head] < lo)
				head++;
			cur[y] = head < tail ? best[dq[head]] + val[y] : PEAK_NONE;
		}
		int64_t *sw = best;
		best = cur;
		cur = sw;
	}
	int64_t most = 0;
	for (size_t y = 0; y <= 2 * pr[K - 1].L; y++)
		most = best[y] > most ? best[y] : most;
	*peak = (uint64_t)most;
	rc = 0;
out:
	free(gops);
	free(val);
	free(best);
	free(cur);
	free(dq);
	free(fpos);
	free(bpos);
	return rc;
}

/* ---- schedules as text (train.h: torch.distributed.pipelining's compute-only CSV) ---- */

int mbp_schedule_copy(mbp_schedule **sp, const mbp_schedule *sc)
{
	if (!sp || !sc)
		return -EINVAL;
	*sp = NULL;
	struct mbp_schedule *c = malloc(sizeof(*c));
	if (!c)
		return -ENOMEM;
	*c = *sc;
	c->order = malloc(sc->n * sizeof(mbp_sched_op));
	c->stage_ops = malloc(sc->n * sizeof(mbp_sched_op));
	if (!c->order || !c->stage_ops) {
		mbp_schedule_destroy(c);
		return -ENOMEM;
	}
	memcpy(c->order, sc->order, sc->n * sizeof(mbp_sched_op));
	memcpy(c->stage_ops, sc->stage_ops, sc->n * sizeof(mbp_sched_op));
	*sp = c;
	return 0;
}

static const char kind_char[] = "FBIW"; /* per mbp_op_kind: PyTorch's F, B (full), I (input), W */

size_t mbp_schedule_write_csv(const mbp_schedule *sc, unsigned threads, char *buf, size_t cap)
{
	if (!sc || (!buf && cap) || !(threads = threads_meant(sc, threads)))
		return 0;
	size_t len = 0;
	for (unsigned t = 0; t < threads; t++) {
		bool first = true;
		for (size_t i = 0; i < sc->n; i++) {
			const mbp_sched_op *op = &sc->order[i];
			if (mbp__sched_thread(sc, op->stage, threads) != t)
				continue;
			char cell[32];
			int k = snprintf(cell, sizeof(cell), "%s%u%c%u", first ? "" : ",", op->stage,
					 kind_char[op->kind], op->mb);
			if (len + (size_t)k < cap)
				memcpy(buf + len, cell, (size_t)k);
			len += (size_t)k;
			first = false;
		}
		if (len + 1 < cap)
			buf[len] = '\n';
		len++;
	}
	if (cap)
		buf[len < cap ? len : cap - 1] = 0;
	return len;
}

/* Where each parsed action came from, to name it. */
struct text_pos {
	unsigned line, column;
};

static void text_error(mbp_sched_text_error *e, unsigned line, unsigned column, const char *action,
		       size_t alen, const char *what)
{
	if (!e)
		return;
	e->line = line;
	e->column = column;
	alen = alen < sizeof(e->action) - 1 ? alen : sizeof(e->action) - 1;
	memcpy(e->action, action, alen);
	e->action[alen] = 0;
	snprintf(e->what, sizeof(e->what), "%s", what);
}

/* One action "<stage><F|B|I|W><mb>" (no spaces) into op: 0, or -EINVAL; -E2BIG for numbers too large. */
static int parse_action(const char *s, size_t n, mbp_sched_op *op)
{
	size_t i = 0;
	unsigned long st = 0, mb = 0;
	if (i == n || !isdigit((unsigned char)s[i]))
		return -EINVAL;
	for (; i < n && isdigit((unsigned char)s[i]); i++)
		if ((st = st * 10 + (unsigned long)(s[i] - '0')) >= MBP_MAX_STAGES)
			return -E2BIG;
	if (i == n)
		return -EINVAL;
	const char *k = strchr(kind_char, s[i]);
	if (!k || !s[i])
		return -EINVAL;
	i++;
	if (i == n || !isdigit((unsigned char)s[i]))
		return -EINVAL;
	for (; i < n && isdigit((unsigned char)s[i]); i++)
		if ((mb = mb * 10 + (unsigned long)(s[i] - '0')) >= MBP_TRAIN_MAX_MBS)
			return -E2BIG;
	if (i != n)
		return -EINVAL;
	*op = (mbp_sched_op){.mb = (uint32_t)mb, .stage = (uint16_t)st, .kind = (uint8_t)(k - kind_char)};
	return 0;
}

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* Narrow [*x, *y) of text to its part without blanks at either end. */
static void trim(const char *text, size_t *x, size_t *y)
{
	while (*x < *y && is_space(text[*x]))
		(*x)++;
	while (*y > *x && is_space(text[*y - 1]))
		(*y)--;
}

int mbp_schedule_read_csv(mbp_schedule **sp, const char *text, size_t len, unsigned held_limit,
			  mbp_sched_text_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	if (!sp || (!text && len))
		return -EINVAL;
	*sp = NULL;
	/* every action of the text, line by line: at most one per comma or byte */
	size_t cap = 1;
	for (size_t i = 0; i < len; i++)
		cap += text[i] == ',' || text[i] == ';' || text[i] == '\n';
	mbp_sched_op *ops = malloc(cap * sizeof(*ops));
	struct text_pos *pos = malloc(cap * sizeof(*pos));
	size_t off[MBP_MAX_STAGES + 1] = {0};
	struct mbp_schedule *sc = NULL;
	int rc = -ENOMEM;
	if (!ops || !pos)
		goto out;
	rc = -EINVAL;
	size_t n = 0;
	unsigned lines = 0, S = 0, M = 0;
	for (size_t i = 0; i < len;) {
		size_t eol = i;
		while (eol < len && text[eol] != '\n')
			eol++;
		size_t a = i, b = eol;
		while (a < b && is_space(text[a]))
			a++;
		bool blank = a == b;
		if (!blank || eol < len) { /* a last empty line after the final newline is no thread */
			if (lines == MBP_MAX_STAGES) {
				text_error(err, lines + 1, 0, "", 0,
					   "more lines (threads) than stages can be");
				rc = -E2BIG;
				goto out;
			}
			off[lines] = n;
			unsigned col = 0;
			for (size_t c = i; c <= eol;) {
				size_t e = c;
				int depth = 0;
				while (e < eol && (text[e] != ',' || depth > 0)) {
					depth += text[e] == '(';
					depth -= text[e] == ')';
					e++;
				}
				size_t x = c, y = e;
				trim(text, &x, &y);
				col++;
				if (x < y) {
					/* "(a;b)OVERLAP_F_B": its actions in turn */
					static const char ov[] = "OVERLAP_F_B";
					size_t ol = sizeof(ov) - 1;
					bool pair = text[x] == '(' && y - x > ol + 2 &&
						    text[y - ol - 1] == ')' &&
						    memcmp(text + y - ol, ov, ol) == 0;
					size_t px = pair ? x + 1 : x, py = pair ? y - ol - 1 : y;
					for (size_t u = px; u < py || (u == px && !pair);) {
						size_t v = u;
						while (v < py && text[v] != ';')
							v++;
						size_t ux = u, vy = v;
						trim(text, &ux, &vy);
						int prc = parse_action(text + ux, vy - ux, &ops[n]);
						if (prc < 0) {
							text_error(
							    err, lines + 1, col, text + x, y - x,
							    prc == -E2BIG
								? "a stage or micro-batch number too large"
								: "not a compute action "
								  "(<stage><F|B|I|W><micro-"
								  "batch>, such as 0F1)");
							rc = prc;
							goto out;
						}
						pos[n] = (struct text_pos){lines + 1, col};
						S = ops[n].stage + 1u > S ? ops[n].stage + 1u : S;
						M = ops[n].mb + 1u > M ? ops[n].mb + 1u : M;
						n++;
						u = v + 1;
						if (v >= py)
							break;
					}
				}
				c = e + 1;
			}
			lines++;
		}
		i = eol + 1;
	}
	off[lines] = n;
	if (n == 0 || lines == 0) {
		text_error(err, 1, 0, "", 0, "no action");
		goto out;
	}
	for (unsigned t = 0; t < lines; t++)
		if (off[t] == off[t + 1]) {
			text_error(err, t + 1, 0, "", 0, "a line (thread) with no action");
			goto out;
		}
	sc = sched_alloc(MBP_SCHED_CUSTOM, S, M);
	rc = -ENOMEM;
	if (!sc)
		goto out;
	sc->place = MBP_PLACE_CUSTOM;
	sc->threads = lines;
	bool placed[MBP_MAX_STAGES] = {false};
	for (unsigned t = 0; t < lines; t++)
		for (size_t k = off[t]; k < off[t + 1]; k++) {
			placed[ops[k].stage] = true;
			sc->thread_of[ops[k].stage] = (uint16_t)t;
		}
	for (unsigned s = 0; s < S; s++)
		if (!placed[s]) {
			char a[16];
			int k = snprintf(a, sizeof(a), "%uF0", s);
			text_error(err, 0, 0, a, (size_t)k,
				   "a stage on no line (every action of it missing)");
			rc = -EINVAL;
			goto out;
		}
	struct mbp__sched_fault f = {0};
	rc = sched_from_lists(sc, ops, off, lines, &f);
	if (rc == -EINVAL || rc == -EDEADLK) {
		char a[32];
		int k = snprintf(a, sizeof(a), "%u%c%u", f.op.stage, kind_char[f.op.kind], f.op.mb);
		size_t at = f.pos == SIZE_MAX ? SIZE_MAX : off[f.list] + f.pos;
		text_error(err, at == SIZE_MAX ? f.list + 1 : pos[at].line,
			   at == SIZE_MAX ? 0 : pos[at].column, a, (size_t)k, f.what);
		rc = -EINVAL;
		goto out;
	}
	if (rc < 0)
		goto out;
	/* memory: each thread's held micro-batch chunks, in its order */
	for (unsigned t = 0; held_limit && t < lines; t++) {
		unsigned held = 0;
		for (size_t k = off[t]; k < off[t + 1]; k++) {
			held += ops[k].kind == MBP_OP_F;
			held -= ops[k].kind == MBP_OP_B || ops[k].kind == MBP_OP_W;
			if (held > held_limit) {
				char a[32];
				int m = snprintf(a, sizeof(a), "%u%c%u", ops[k].stage, kind_char[ops[k].kind],
						 ops[k].mb);
				char what[96];
				snprintf(what, sizeof(what),
					 "memory: the thread would hold %u micro-batch chunks, "
					 "above the limit of %u",
					 held, held_limit);
				text_error(err, pos[k].line, pos[k].column, a, (size_t)m, what);
				rc = -EINVAL;
				goto out;
			}
		}
	}
	*sp = sc;
	sc = NULL;
	rc = 0;
out:
	mbp_schedule_destroy(sc);
	free(ops);
	free(pos);
	return rc;
}

int mbp_schedule_load_csv(mbp_schedule **sp, const char *path, unsigned held_limit, mbp_sched_text_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	if (!sp || !path)
		return -EINVAL;
	*sp = NULL;
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int rc = 0;
	for (;;) {
		if (len == cap) {
			size_t ncap = cap ? 2 * cap : 4096;
			char *p = ncap <= ((size_t)1 << 30) ? realloc(buf, ncap) : NULL;
			if (!p) {
				rc = -ENOMEM;
				break;
			}
			buf = p;
			cap = ncap;
		}
		size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (got == 0) {
			rc = ferror(f) ? -EIO : 0;
			break;
		}
	}
	fclose(f);
	if (rc == 0)
		rc = mbp_schedule_read_csv(sp, buf, len, held_limit, err);
	free(buf);
	return rc;
}

/* ---- built from costs (mbp_schedule_build) ---- */

/* The most a thread of sc holds on `threads` threads. */
static unsigned most_held(const mbp_schedule *sc, unsigned threads)
{
	unsigned most = 0;
	for (unsigned t = 0; t < threads; t++) {
		mbp_sched_thread_figures f;
		if (mbp_schedule_thread_figures(sc, threads, t, &f) == 0 && f.held_peak > most)
			most = f.held_peak;
	}
	return most;
}

struct build_best {
	const mbp_sched_build *b;
	unsigned T;
	mbp_schedule *sc;
	double makespan;
};

/* Keep candidate c (taken) if it fits the limit and plays faster than the best so far. */
static void consider(struct build_best *bb, mbp_schedule *c)
{
	mbp_sched_sim sim;
	bool fits = !bb->b->held_limit || most_held(c, bb->T) <= bb->b->held_limit;
	if (fits && mbp_schedule_simulate(c, bb->b->costs, bb->T, &sim, NULL) == 0 &&
	    (!bb->sc || sim.makespan < bb->makespan * (1 - 1e-12))) {
		mbp_schedule_destroy(bb->sc);
		bb->sc = c;
		bb->makespan = sim.makespan;
		return;
	}
	mbp_schedule_destroy(c);
}

int mbp_schedule_build(mbp_schedule **sp, const mbp_sched_build *b)
{
	if (!sp || !b || !b->costs || b->stages == 0 || b->stages > MBP_MAX_STAGES || b->mbs == 0 ||
	    b->mbs > MBP_TRAIN_MAX_MBS || b->threads > b->stages)
		return -EINVAL;
	*sp = NULL;
	unsigned S = b->stages, M = b->mbs, T = b->threads ? b->threads : S;
	for (unsigned s = 0; s < S; s++) {
		const mbp_op_costs *c = &b->costs[s];
		if (!(c->f >= 0 && c->b_in >= 0 && c->b_w >= 0 && isfinite(c->f + c->b_in + c->b_w)))
			return -EINVAL;
	}
	struct build_best bb = {.b = b, .T = T};
	int rc = 0;
	/* the fixed schedules that run on T threads */
	static const mbp_sched_kind fixed[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B,	       MBP_SCHED_ZBH1,
					       MBP_SCHED_ZBH2,	MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS,
					       MBP_SCHED_ZBV,	MBP_SCHED_DUALPIPEV};
	for (size_t k = 0; k < MBP_ARRAY_SIZE(fixed); k++) {
		mbp_sched_kind kind = fixed[k];
		bool zb = kind == MBP_SCHED_ZBH1 || kind == MBP_SCHED_ZBH2 || kind == MBP_SCHED_ZBV ||
			  kind == MBP_SCHED_DUALPIPEV;
		bool block = kind <= MBP_SCHED_ZBH1 || kind == MBP_SCHED_ZBH2;
		if (zb && !b->split)
			continue;
		if (!block && (T == S && kind != MBP_SCHED_INTERLEAVED && kind != MBP_SCHED_LOOPED_BFS))
			continue;
		mbp_schedule *c;
		int r = mbp_schedule_new_placed(&c, kind, S, M, block ? 0 : T);
		if (r == -ENOMEM)
			rc = r;
		if (r == 0)
			consider(&bb, c);
	}
	/* the greedy player on each placement that fits, at limits up to held_limit */
	mbp_sched_op *ops = malloc((size_t)S * M * 3 * sizeof(*ops));
	if (!ops)
		rc = -ENOMEM;
	for (int pl = 0; rc == 0 && pl < 3; pl++) {
		struct mbp_schedule *c = sched_alloc(MBP_SCHED_AUTO, S, M);
		if (!c) {
			rc = -ENOMEM;
			break;
		}
		c->place = pl == 0 ? MBP_PLACE_BLOCK : pl == 1 ? MBP_PLACE_INTERLEAVED : MBP_PLACE_V;
		if ((pl == 1 && S % T != 0) || (pl == 1 && S == T) || (pl == 2 && S != 2 * T)) {
			free(c);
			continue;
		}
		c->threads = T;
		for (unsigned s = 0; s < S; s++)
			c->thread_of[s] = (uint16_t)(pl == 0   ? mbp__stage_thread(s, S, T)
						     : pl == 1 ? s % T
						     : s < T   ? s
							       : 2 * T - 1 - s);
		unsigned hi = b->held_limit ? b->held_limit : 2 * S, lo = 1,
			 step = hi - lo > 16 ? (hi - lo) / 16 : 1;
		for (unsigned L = hi + (b->held_limit ? 0 : step);; L -= step) {
			unsigned limit[MBP_MAX_STAGES];
			for (unsigned t = 0; t < T; t++)
				limit[t] = L > hi ? 0 : L; /* above hi: no limit */
			struct greedy g = {S, M, T, c->thread_of, b->costs, limit, b->split};
			size_t off[MBP_MAX_STAGES + 1];
			int r = greedy_lists(&g, ops, off);
			if (r == 0) {
				struct mbp_schedule *d = sched_alloc(MBP_SCHED_AUTO, S, M);
				if (!d) {
					rc = -ENOMEM;
					break;
				}
				d->place = c->place;
				d->threads = T;
				memcpy(d->thread_of, c->thread_of, sizeof(d->thread_of));
				r = sched_from_lists(d, ops, off, T, NULL);
				if (r == 0)
					consider(&bb, d);
				else
					mbp_schedule_destroy(d);
			}
			if (r == -ENOMEM)
				rc = r;
			if (rc < 0 || L < lo + step)
				break;
		}
		free(c);
	}
	free(ops);
	if (rc < 0 || !bb.sc) {
		mbp_schedule_destroy(bb.sc);
		return rc < 0 ? rc : -ENOSPC;
	}
	struct mbp_schedule *w = bb.sc;
	if (!w->threads) { /* a block schedule: on the T threads it was played on */
		w->threads = T;
		for (unsigned s = 0; s < S; s++)
			w->thread_of[s] = (uint16_t)mbp__stage_thread(s, S, T);
	}
	w->kind = MBP_SCHED_AUTO;
	*sp = w;
	return 0;
}

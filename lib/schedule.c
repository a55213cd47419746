/*
 * Training schedules: each stage's order of forward (F), backward (B, or B_in and W) operations.
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

/* The published list of stage s, appended at sc->stage_ops + *n. */
static void build_stage(struct mbp_schedule *sc, unsigned s, size_t *n)
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
	unsigned warm = S - s - 1 < M ? S - s - 1 : M;
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
};

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

static int play(const struct mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
		const mbp_sched_op *const *lists, const size_t *len, const uint32_t *const *pos,
		double *start, double *makespan, double *busy, struct mbp__sched_scratch *x)
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
	struct player pl = {sc, costs, ends, ends + nm, ends + 2 * nm};
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
				double c = op_cost(&costs[op->stage], op->kind);
				double t0 = clock[t] > dep ? clock[t] : dep;
				clock[t] = t0 + c;
				size_t k = (size_t)op->stage * sc->mbs + op->mb;
				(op->kind == MBP_OP_F	? pl.end_f
				 : op->kind == MBP_OP_W ? pl.end_w
							: pl.end_b)[k] = clock[t];
				if (op->kind == MBP_OP_B) /* a whole backward also ends the weight gradient */
					pl.end_w[k] = clock[t];
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

int mbp_schedule_new(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs)
{
	if (!sp || stages == 0 || stages > MBP_MAX_STAGES || mbs == 0 || mbs > MBP_TRAIN_MAX_MBS)
		return -EINVAL;
	if (kind == MBP_SCHED_DEFAULT)
		kind = MBP_SCHED_1F1B;
	if (kind != MBP_SCHED_GPIPE && kind != MBP_SCHED_1F1B && kind != MBP_SCHED_ZBH1)
		return -EINVAL;
	*sp = NULL;
	unsigned per = kind == MBP_SCHED_ZBH1 ? 3 : 2;
	size_t n = (size_t)stages * mbs * per;
	struct mbp_schedule *sc = calloc(1, sizeof(*sc));
	if (!sc)
		return -ENOMEM;
	sc->kind = kind;
	sc->stages = stages;
	sc->mbs = mbs;
	sc->n = n;
	sc->stage_ops = malloc(n * sizeof(mbp_sched_op));
	sc->order = malloc(n * sizeof(mbp_sched_op));
	struct keyed *key = malloc(n * sizeof(*key));
	double *start = malloc(n * sizeof(double));
	const mbp_sched_op **lists = malloc(stages * sizeof(*lists));
	size_t *len = malloc(stages * sizeof(*len));
	int rc = -ENOMEM;
	if (!sc->stage_ops || !sc->order || !key || !start || !lists || !len)
		goto fail;
	size_t k = 0;
	for (unsigned s = 0; s < stages; s++) {
		sc->stage_off[s] = k;
		build_stage(sc, s, &k);
		lists[s] = sc->stage_ops + sc->stage_off[s];
		len[s] = k - sc->stage_off[s];
	}
	sc->stage_off[stages] = k;
	MBP_VERIFY(k == n);
	/* unit costs, a whole backward twice a forward, one thread per stage; start[] in stage_ops order */
	mbp_op_costs unit[MBP_MAX_STAGES];
	for (unsigned s = 0; s < stages; s++)
		unit[s] = (mbp_op_costs){1, 1, 1};
	double makespan, busy;
	uint32_t *pos[MBP_MAX_STAGES];
	struct mbp__sched_scratch x;
	if (mbp__sched_scratch_new(&x, sc, stages) < 0)
		goto fail;
	for (unsigned s = 0; s < stages; s++) {
		pos[s] = x.pos + sc->stage_off[s];
		for (size_t i = 0; i < len[s]; i++)
			pos[s][i] = (uint32_t)(sc->stage_off[s] + i);
	}
	rc = play(sc, unit, stages, lists, len, (const uint32_t *const *)pos, start, &makespan, &busy, &x);
	mbp__sched_scratch_free(&x);
	if (rc < 0)
		goto fail;
	for (size_t i = 0; i < n; i++)
		key[i] = (struct keyed){start[i], i, sc->stage_ops[i].stage};
	qsort(key, n, sizeof(*key), by_start);
	for (size_t i = 0; i < n; i++)
		sc->order[i] = sc->stage_ops[key[i].idx];
	for (unsigned s = 0; s < stages; s++)
		peaks(sc, s);
	free(key);
	free(start);
	free(lists);
	free(len);
	*sp = sc;
	return 0;
fail:
	free(key);
	free(start);
	free(lists);
	free(len);
	mbp_schedule_destroy(sc);
	return rc;
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

int mbp__schedule_part_lists(const mbp_schedule *sc, unsigned first, unsigned count, unsigned threads,
			     mbp_sched_op *ops, size_t *off)
{
	if (!sc || count == 0 || first + count > sc->stages || threads == 0 || threads > count)
		return -EINVAL;
	/* counting pass, then placement: each thread's operations in global order */
	for (unsigned t = 0; t <= threads; t++)
		off[t] = 0;
	for (size_t i = 0; i < sc->n; i++)
		if ((unsigned)sc->order[i].stage - first < count)
			off[mbp__stage_thread(sc->order[i].stage - first, count, threads) + 1]++;
	for (unsigned t = 0; t < threads; t++)
		off[t + 1] += off[t];
	size_t fill[MBP_MAX_STAGES + 1];
	memcpy(fill, off, (threads + 1) * sizeof(size_t));
	for (size_t i = 0; i < sc->n; i++) {
		mbp_sched_op o = sc->order[i];
		if ((unsigned)o.stage - first >= count)
			continue;
		o.stage = (uint16_t)(o.stage - first);
		ops[fill[mbp__stage_thread(o.stage, count, threads)]++] = o;
	}
	return 0;
}

int mbp_schedule_simulate(const mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
			  mbp_sched_sim *out, double *start)
{
	if (!sc || !costs || !out || threads > sc->stages)
		return -EINVAL;
	struct mbp__sched_scratch x;
	int rc = mbp__sched_scratch_new(&x, sc, threads ? threads : sc->stages);
	if (rc == 0)
		rc = mbp__schedule_simulate_in(sc, costs, threads, out, start, &x);
	mbp__sched_scratch_free(&x);
	return rc;
}

int mbp__schedule_simulate_in(const mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
			      mbp_sched_sim *out, double *start, struct mbp__sched_scratch *x)
{
	if (!sc || !costs || !out || threads > sc->stages)
		return -EINVAL;
	if (threads == 0)
		threads = sc->stages;
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
		posbuf[fill[mbp__stage_thread(sc->order[i].stage, sc->stages, threads)]++] = (uint32_t)i;
	const mbp_sched_op *lists[MBP_MAX_STAGES];
	size_t len[MBP_MAX_STAGES];
	const uint32_t *pos[MBP_MAX_STAGES];
	for (unsigned t = 0; t < threads; t++) {
		lists[t] = ops + off[t];
		len[t] = off[t + 1] - off[t];
		pos[t] = posbuf + off[t];
	}
	double makespan, busy;
	int rc = play(sc, costs, threads, lists, len, pos, start, &makespan, &busy, x);
	if (rc == 0) {
		out->makespan = makespan;
		out->busy = busy;
		out->bubble = makespan > 0 ? 1.0 - busy / (threads * makespan) : 0;
	}
	return rc;
}

const char *mbp_sched_name(mbp_sched_kind kind)
{
	switch (kind) {
	case MBP_SCHED_DEFAULT:
	case MBP_SCHED_1F1B:
		return "1f1b";
	case MBP_SCHED_GPIPE:
		return "gpipe";
	case MBP_SCHED_ZBH1:
		return "zbh1";
	}
	return "?";
}

int mbp_sched_parse(const char *name, mbp_sched_kind *kind)
{
	if (!name || !kind)
		return -EINVAL;
	static const struct {
		const char *name;
		mbp_sched_kind kind;
	} names[] = {{"gpipe", MBP_SCHED_GPIPE},
		     {"1f1b", MBP_SCHED_1F1B},
		     {"zbh1", MBP_SCHED_ZBH1},
		     {"zb-h1", MBP_SCHED_ZBH1},
		     {"zb", MBP_SCHED_ZBH1}};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcasecmp(name, names[i].name) == 0) {
			*kind = names[i].kind;
			return 0;
		}
	return -EINVAL;
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

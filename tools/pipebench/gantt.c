/*
 * pipebench Gantt chart: which stage computes which micro-batch when, during one batch, in the terminal.
 *
 * The batch shown is the fastest one measured at that size: the one the machine's other load disturbed least.
 * Two panels share one time scale: the chosen micro-batch size, and the whole batch sent as one unit. In the
 * second, each stage works only while the others wait (the bubble is (S-1)/S); in the first, the stages
 * overlap on different micro-batches and the batch ends sooner. The panels stand side by side when the width
 * allows, else one above the other.
 *
 * Each column covers span/width of time. A cell shows the micro-batch that occupied most of it, by its
 * index (0-9, a-z, A-Z, then again), when the stage was busy for at least half the cell (half its share
 * of the cell where k stages share a thread: half of 1/k); '.' when the stage was mostly idle; blank
 * after the batch completed.
 *
 * Training (--workload=train): the fastest measured step of each schedule, one panel above the other on
 * one time scale, drawn the same way from the trainer's operations (mbp_trainer_events_get): a forward
 * shows its micro-batch as a digit, a backward (B, or B_in) as a lowercase letter, a weight gradient (W)
 * as an uppercase one. Below each, the model: the schedule played (mbp_schedule_simulate) with that
 * step's mean cost of each stage's operations, where they would run with no noise and no hand-off cost.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipebench.h"
#include "../plural.h"

#define LABEL 5 /* "s12 |" */
#define GAP   4

static char mb_char(uint32_t seq)
{
	static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
	return digits[seq % (sizeof(digits) - 1)];
}

static void fmt_ms(char *buf, size_t n, double ns)
{
	double ms = ns / 1e6;
	snprintf(buf, n, ms >= 100 ? "%.0f ms" : ms >= 10 ? "%.1f ms" : "%.2f ms", ms);
}

/* Something a stage did from t0 to t1 (ns), drawn as c. */
struct span {
	uint64_t t0, t1;
	char c;
};

/* One row of `cols` cells over [0, scale_ns) from n spans: a cell shows the span that covers most of it
 * when they cover at least half of its 1/k share (k stages on the thread), '.' otherwise, ' ' from end_ns
 * on. */
static void render_spans(const struct span *sp, size_t n, unsigned k, double end_ns, unsigned cols,
			 double scale_ns, char *row)
{
	double dt = scale_ns / cols;
	double *busy = calloc(cols, sizeof(double)), *best = calloc(cols, sizeof(double));
	char *who = calloc(cols, 1);
	if (!busy || !best || !who) {
		memset(row, '?', cols);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		const struct span *x = &sp[i];
		if (x->t1 < x->t0)
			continue;
		unsigned c0 = (unsigned)((double)x->t0 / dt), c1 = (unsigned)((double)x->t1 / dt);
		for (unsigned c = c0; c <= c1 && c < cols; c++) {
			double lo = c * dt, hi = lo + dt;
			double a = (double)x->t0 > lo ? (double)x->t0 : lo,
			       b = (double)x->t1 < hi ? (double)x->t1 : hi;
			if (b <= a)
				continue;
			busy[c] += b - a;
			if (b - a > best[c]) {
				best[c] = b - a;
				who[c] = x->c;
			}
		}
	}
	k = k ? k : 1;
	for (unsigned c = 0; c < cols; c++) {
		if (c * dt >= end_ns)
			row[c] = ' ';
		else if (busy[c] >= dt / 2 / k)
			row[c] = who[c];
		else
			row[c] = '.';
	}
out:
	row[cols] = 0;
	free(busy);
	free(best);
	free(who);
}

/* One stage's row of `cols` cells, over [0, scale_ns). */
static void render_row(const pb_timeline *tl, unsigned stage, unsigned cols, double scale_ns, char *row)
{
	struct span *sp = calloc(tl->mbs ? tl->mbs : 1, sizeof(*sp));
	size_t n = 0;
	if (!sp) {
		memset(row, '?', cols);
		row[cols] = 0;
		return;
	}
	for (uint32_t j = 0; j < tl->mbs; j++) {
		const uint64_t *t = tl->t + ((size_t)stage * tl->mbs + j) * 2;
		if (t[0] == UINT64_MAX || t[1] == UINT64_MAX)
			continue;
		sp[n++] = (struct span){t[0], t[1], mb_char(j)};
	}
	render_spans(sp, n, tl->share[stage], (double)tl->span_ns, cols, scale_ns, row);
	free(sp);
}

static void title(char *buf, size_t n, const pb_timeline *tl, bool whole)
{
	char span[32];
	fmt_ms(span, sizeof(span), (double)tl->span_ns);
	if (whole)
		snprintf(buf, n, "whole batch as one unit: %s", span);
	else
		snprintf(buf, n, "m=%u, %u %s: %s", tl->mb_rows, tl->mbs,
			 PLURAL(tl->mbs, "micro-batch", "micro-batches"), span);
}

/* The time axis under a panel: "0" at the left, the scale's end at the right. */
static void axis(char *buf, unsigned cols, double scale_ns)
{
	char end[32];
	fmt_ms(end, sizeof(end), scale_ns);
	memset(buf, ' ', LABEL + cols + 1);
	buf[LABEL + cols + 1] = 0;
	buf[LABEL - 1] = '0';
	size_t len = strlen(end);
	if (len < cols)
		memcpy(buf + LABEL + cols - len, end, len);
}

void pb_gantt_print(FILE *f, const pb_timeline *a, const pb_timeline *b, unsigned width)
{
	const pb_timeline *tl[2] = {a, b};
	unsigned n = 0;
	const pb_timeline *panels[2];
	bool whole[2];
	for (unsigned i = 0; i < 2; i++)
		if (tl[i] && tl[i]->t && tl[i]->mbs) {
			whole[n] = i == 1;
			panels[n++] = tl[i];
		}
	if (n == 0)
		return;
	double scale = 0;
	unsigned stages = 0;
	for (unsigned i = 0; i < n; i++) {
		scale = (double)panels[i]->span_ns > scale ? (double)panels[i]->span_ns : scale;
		stages = panels[i]->stages > stages ? panels[i]->stages : stages;
	}
	if (scale <= 0)
		return;
	if (width < 40)
		width = 40;
	bool side = n == 2 && (width - GAP) / 2 >= LABEL + 1 + 24;
	unsigned cols = side ? (width - GAP) / 2 - LABEL - 1 : width - LABEL - 1;
	char *rows[2][MBP_MAX_STAGES] = {{NULL}};
	char t[2][128], ax[2][512];

	for (unsigned p = 0; p < n; p++) {
		title(t[p], sizeof(t[p]), panels[p], whole[p]);
		axis(ax[p], cols, scale);
		for (unsigned s = 0; s < panels[p]->stages; s++) {
			rows[p][s] = malloc(cols + 1);
			if (rows[p][s])
				render_row(panels[p], s, cols, scale, rows[p][s]);
		}
	}
	fprintf(f,
		"\nThe fastest measured batch, stage by stage (each column %.3g ms; a character names the "
		"micro-batch, '.' idle):\n",
		scale / cols / 1e6);
	int pw = (int)(LABEL + cols + 1);
	if (side) {
		fprintf(f, "%-*s%*s%s\n", pw, t[0], GAP, "", t[1]);
		for (unsigned s = 0; s < stages; s++) {
			for (unsigned p = 0; p < 2; p++) {
				if (s < panels[p]->stages && rows[p][s])
					fprintf(f, "s%-2u |%s|", s, rows[p][s]);
				else
					fprintf(f, "%*s", pw, "");
				fprintf(f, "%*s", p == 0 ? GAP : 0, "");
			}
			fputc('\n', f);
		}
		fprintf(f, "%s%*s%s\n", ax[0], GAP, "", ax[1]);
	} else {
		for (unsigned p = 0; p < n; p++) {
			fprintf(f, "%s\n", t[p]);
			for (unsigned s = 0; s < panels[p]->stages; s++)
				if (rows[p][s])
					fprintf(f, "s%-2u |%s|\n", s, rows[p][s]);
			fprintf(f, "%s\n", ax[p]);
		}
	}
	for (unsigned p = 0; p < n; p++)
		for (unsigned s = 0; s < panels[p]->stages; s++)
			free(rows[p][s]);
}

/* ---- training steps ---- */

/* F: the micro-batch's digit; a backward (B, or B_in): a lowercase letter; a weight gradient: uppercase. */
static char op_char(const mbp_train_event *e)
{
	switch (e->kind) {
	case MBP_OP_F:
		return (char)('0' + e->mb % 10);
	case MBP_OP_W:
		return (char)('A' + e->mb % 26);
	default:
		return (char)('a' + e->mb % 26);
	}
}

/* The schedule's prediction for the step drawn: its operations played (mbp_schedule_simulate) on the same
 * threads with that step's own mean cost of each stage's F, backward (B or B_in) and W, as spans of every
 * stage (sp: 3 x S x M), each tagged with its stage in st. Returns the number of spans and sets *makespan;
 * 0 when it cannot (no memory). */
static size_t predicted_spans(const pb_train_result *r, unsigned S, unsigned M, unsigned T, struct span *sp,
			      unsigned *st, double *makespan)
{
	mbp_schedule *sc = NULL;
	double sum[MBP_MAX_STAGES][3] = {{0}}, cnt[MBP_MAX_STAGES][3] = {{0}};
	for (size_t e = 0; e < r->nev; e++) {
		const mbp_train_event *ev = &r->ev[e];
		int k = ev->kind == MBP_OP_F ? 0 : ev->kind == MBP_OP_W ? 2 : 1;
		if (ev->stage < S) {
			sum[ev->stage][k] += (double)(ev->t1_ns - ev->t0_ns);
			cnt[ev->stage][k]++;
		}
	}
	mbp_op_costs c[MBP_MAX_STAGES];
	for (unsigned s = 0; s < S; s++) {
		double m[3];
		for (int k = 0; k < 3; k++)
			m[k] = cnt[s][k] ? sum[s][k] / cnt[s][k] : 0;
		c[s] = (mbp_op_costs){m[0], m[1], m[2]}; /* a B costs b_in + b_w: its W is 0 here */
	}
	if (mbp_schedule_new(&sc, r->kind, S, M) < 0)
		return 0;
	const mbp_sched_op *ops;
	size_t n = mbp_schedule_order(sc, &ops);
	double *start = malloc(n * sizeof(double));
	mbp_sched_sim sim;
	if (!start || mbp_schedule_simulate(sc, c, T, &sim, start) < 0)
		n = 0;
	for (size_t i = 0; i < n; i++) {
		const mbp_op_costs *k = &c[ops[i].stage];
		double cost = ops[i].kind == MBP_OP_F	  ? k->f
			      : ops[i].kind == MBP_OP_B	  ? k->b_in + k->b_w
			      : ops[i].kind == MBP_OP_BIN ? k->b_in
							  : k->b_w;
		mbp_train_event e = {.mb = ops[i].mb, .stage = ops[i].stage, .kind = ops[i].kind};
		sp[i] = (struct span){(uint64_t)start[i], (uint64_t)(start[i] + cost), op_char(&e)};
		st[i] = ops[i].stage;
	}
	*makespan = n ? sim.makespan : 0;
	free(start);
	mbp_schedule_destroy(sc);
	return n;
}

/* Stages that share stage s's thread (stage s runs on thread s T / S). */
static unsigned sharing(unsigned s, unsigned S, unsigned T)
{
	unsigned k = 0;
	for (unsigned q = 0; q < S; q++)
		k += q * T / S == s * T / S;
	return k;
}

void pb_train_gantt_print(FILE *f, const pb_train_report *rep, unsigned width)
{
	const unsigned S = rep->cfg->stages, M = rep->cfg->mbs;
	const size_t nmax = (size_t)3 * S * M;
	struct span *pred[PB_TRAIN_SCHEDS] = {NULL};
	unsigned *pst[PB_TRAIN_SCHEDS] = {NULL};
	size_t npred[PB_TRAIN_SCHEDS] = {0};
	double makespan[PB_TRAIN_SCHEDS] = {0};
	double scale = 0;
	for (unsigned i = 0; i < PB_TRAIN_SCHEDS; i++) {
		const pb_train_result *r = &rep->r[i];
		if (!r->nev)
			continue;
		if ((double)r->ev_step_ns > scale)
			scale = (double)r->ev_step_ns;
		pred[i] = malloc(nmax * sizeof(struct span));
		pst[i] = malloc(nmax * sizeof(unsigned));
		if (pred[i] && pst[i])
			npred[i] = predicted_spans(r, S, M, r->threads ? r->threads : S, pred[i], pst[i],
						   &makespan[i]);
		if (makespan[i] > scale)
			scale = makespan[i];
	}
	if (width < 40)
		width = 40;
	unsigned cols = width - LABEL - 1;
	char *row = malloc(cols + 1), ax[512];
	struct span *sp = malloc(nmax * sizeof(*sp));
	if (scale <= 0)
		goto out;
	if (!row || !sp)
		goto out;
	axis(ax, cols, scale);
	fprintf(
	    f,
	    "\nThe fastest measured step of each schedule, stage by stage (s0, s1, ...), and below it the "
	    "schedule\nplayed with that step's mean operation costs (p0, p1, ...), on one time scale (each "
	    "column %.3g ms):\n",
	    scale / cols / 1e6);
	for (unsigned i = 0; i < PB_TRAIN_SCHEDS; i++) {
		const pb_train_result *r = &rep->r[i];
		if (!r->nev)
			continue;
		double busy = 0;
		for (size_t e = 0; e < r->nev; e++)
			busy += (double)(r->ev[e].t1_ns - r->ev[e].t0_ns);
		unsigned T = r->threads ? r->threads : S;
		char span[32];
		fmt_ms(span, sizeof(span), (double)r->ev_step_ns);
		fprintf(f, "%s: %s, bubble %.3f (median of the steps %.3f, predicted %.3f)\n",
			mbp_sched_name(r->kind), span, 1 - busy / (T * (double)r->ev_step_ns),
			r->bubble.median, r->bubble_predicted);
		for (unsigned s = 0; s < S; s++) {
			size_t n = 0;
			for (size_t e = 0; e < r->nev; e++)
				if (r->ev[e].stage == s)
					sp[n++] =
					    (struct span){r->ev[e].t0_ns, r->ev[e].t1_ns, op_char(&r->ev[e])};
			render_spans(sp, n, sharing(s, S, T), (double)r->ev_step_ns, cols, scale, row);
			fprintf(f, "s%-2u |%s|\n", s, row);
		}
		if (!npred[i])
			continue;
		fmt_ms(span, sizeof(span), makespan[i]);
		fprintf(f, "  predicted: %s\n", span);
		for (unsigned s = 0; s < S; s++) {
			size_t n = 0;
			for (size_t e = 0; e < npred[i]; e++)
				if (pst[i][e] == s)
					sp[n++] = pred[i][e];
			render_spans(sp, n, sharing(s, S, T), makespan[i], cols, scale, row);
			fprintf(f, "p%-2u |%s|\n", s, row);
		}
	}
	fprintf(f, "%s\n", ax);
	fprintf(f,
		"0-9: forward (F) of micro-batch 0-9, a-z: its backward (B; under zbh1 the input gradient "
		"B_in),\nA-Z: its weight gradient (W, zbh1), each the micro-batch's index modulo 10 or 26; "
		"'.' idle\n");
out:
	free(row);
	free(sp);
	for (unsigned i = 0; i < PB_TRAIN_SCHEDS; i++) {
		free(pred[i]);
		free(pst[i]);
	}
}

/*
 * pipebench Gantt chart: which stage computes which micro-batch when, during one batch, in the terminal.
 *
 * The batch shown is the fastest one measured at that size: the one the machine's other load disturbed least.
 * Two panels share one time scale: the chosen micro-batch size, and the whole batch sent as one unit. In the
 * second, each stage works only while the others wait (the bubble is (S-1)/S); in the first, the stages
 * overlap on different micro-batches and the batch ends sooner. The panels stand side by side when the width
 * allows, else one above the other, in the width pb_terminal_width() gives.
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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipebench.h"
#include "util/plural.h"

unsigned pb_terminal_width(void)
{
	struct winsize ws;
	if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
		return ws.ws_col;
	const char *cols = getenv("COLUMNS");
	long v = cols ? strtol(cols, NULL, 10) : 0;
	return v >= 40 && v <= 400 ? (unsigned)v : 100;
}

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
	double sum[MBP_MAX_STAGES][4] = {{0}}, cnt[MBP_MAX_STAGES][4] = {{0}}; /* per mbp_op_kind */
	for (size_t e = 0; e < r->nev; e++) {
		const mbp_train_event *ev = &r->ev[e];
		if (ev->stage < S && ev->kind <= MBP_OP_W) {
			sum[ev->stage][ev->kind] += (double)(ev->t1_ns - ev->t0_ns);
			cnt[ev->stage][ev->kind]++;
		}
	}
	mbp_op_costs c[MBP_MAX_STAGES];
	for (unsigned s = 0; s < S; s++) {
		double m[4];
		for (int k = 0; k < 4; k++)
			m[k] = cnt[s][k] ? sum[s][k] / cnt[s][k] : 0;
		/* a B costs b_in + b_w: where the stage splits none, its W is 0 here */
		c[s] = cnt[s][MBP_OP_BIN] && cnt[s][MBP_OP_W] ? (mbp_op_costs){m[0], m[2], m[3]}
							      : (mbp_op_costs){m[0], m[1], 0};
	}
	(void)M;
	if (!r->sched || mbp_schedule_copy(&sc, r->sched) < 0)
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

/* Stages (chunks) that share stage s's thread under result r's schedule on T threads. */
static unsigned sharing(const pb_train_result *r, unsigned s, unsigned M, unsigned T)
{
	(void)M;
	unsigned k = 0, mine = mbp_schedule_thread_of(r->sched, s, T);
	for (unsigned q = 0; q < r->stages; q++)
		k += mbp_schedule_thread_of(r->sched, q, T) == mine;
	return k ? k : 1;
}

/* The thread of chunk s under result r's schedule. */
static unsigned sharing_thread(const pb_train_result *r, unsigned s, unsigned M)
{
	(void)M;
	return mbp_schedule_thread_of(r->sched, s, r->threads);
}

/* What the training charts draw, text or SVG: each schedule's measured step and its prediction, on one
 * time scale (the longest of them). */
struct train_chart {
	unsigned S;
	size_t nmax;				 /* 3 x S x M: the most spans a step has */
	struct span *pred[PB_TRAIN_SCHEDS];	 /* the prediction's spans, */
	unsigned *pst[PB_TRAIN_SCHEDS];		 /* their stages, */
	size_t npred[PB_TRAIN_SCHEDS];		 /* how many (0: none) */
	double makespan[PB_TRAIN_SCHEDS], scale; /* ns */
};

static void train_chart_init(struct train_chart *c, const pb_train_report *rep)
{
	memset(c, 0, sizeof(*c));
	for (unsigned i = 0; i < rep->n; i++) /* the most stages (chunks) of any schedule */
		c->S = rep->r[i].stages > c->S ? rep->r[i].stages : c->S;
	c->nmax = (size_t)3 * c->S * rep->cfg->mbs;
	for (unsigned i = 0; i < rep->n; i++) {
		const pb_train_result *r = &rep->r[i];
		if (!r->nev)
			continue;
		if ((double)r->ev_step_ns > c->scale)
			c->scale = (double)r->ev_step_ns;
		c->pred[i] = malloc(c->nmax * sizeof(struct span));
		c->pst[i] = malloc(c->nmax * sizeof(unsigned));
		if (c->pred[i] && c->pst[i])
			c->npred[i] =
			    predicted_spans(r, r->stages, rep->cfg->mbs, r->threads ? r->threads : r->stages,
					    c->pred[i], c->pst[i], &c->makespan[i]);
		if (c->makespan[i] > c->scale)
			c->scale = c->makespan[i];
	}
}

static void train_chart_fini(struct train_chart *c)
{
	for (unsigned i = 0; i < PB_TRAIN_SCHEDS; i++) {
		free(c->pred[i]);
		free(c->pst[i]);
	}
}

/* Stage s's spans of result r's measured step (measured) or of its prediction, into sp. */
static size_t train_spans(const struct train_chart *c, const pb_train_result *r, unsigned i, unsigned s,
			  bool measured, struct span *sp)
{
	size_t n = 0;
	if (measured) {
		for (size_t e = 0; e < r->nev; e++)
			if (r->ev[e].stage == s)
				sp[n++] = (struct span){r->ev[e].t0_ns, r->ev[e].t1_ns, op_char(&r->ev[e])};
	} else {
		for (size_t e = 0; e < c->npred[i]; e++)
			if (c->pst[i][e] == s)
				sp[n++] = c->pred[i][e];
	}
	return n;
}

void pb_train_gantt_print(FILE *f, const pb_train_report *rep, unsigned width)
{
	struct train_chart ch;
	train_chart_init(&ch, rep);
	const size_t nmax = ch.nmax;
	const double scale = ch.scale;
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
	for (unsigned i = 0; i < rep->n; i++) {
		const pb_train_result *r = &rep->r[i];
		if (!r->nev)
			continue;
		double busy = 0;
		for (size_t e = 0; e < r->nev; e++)
			busy += (double)(r->ev[e].t1_ns - r->ev[e].t0_ns);
		const unsigned S = r->stages, M = rep->cfg->mbs;
		unsigned T = r->threads ? r->threads : S;
		char span[32];
		fmt_ms(span, sizeof(span), (double)r->ev_step_ns);
		fprintf(f, "%s: %s, bubble %.3f (median of the steps %.3f, predicted %.3f)\n",
			mbp_sched_name(r->kind), span, 1 - busy / (T * (double)r->ev_step_ns),
			r->bubble.median, r->bubble_predicted);
		if (r->chunks > 1) { /* which chunks each thread runs */
			fprintf(f, "  chunks on threads:");
			for (unsigned t = 0; t < T; t++) {
				fprintf(f, "%s t%u", t ? ";" : "", t);
				for (unsigned s = 0, k = 0; s < S; s++)
					if (sharing_thread(r, s, M) == t)
						fprintf(f, "%cs%u", k++ ? ',' : ' ', s);
			}
			fputc('\n', f);
		}
		for (unsigned s = 0; s < S; s++) {
			size_t n = train_spans(&ch, r, i, s, true, sp);
			render_spans(sp, n, sharing(r, s, M, T), (double)r->ev_step_ns, cols, scale, row);
			fprintf(f, "s%-2u |%s|\n", s, row);
		}
		if (!ch.npred[i])
			continue;
		fmt_ms(span, sizeof(span), ch.makespan[i]);
		fprintf(f, "  predicted: %s\n", span);
		for (unsigned s = 0; s < S; s++) {
			size_t n = train_spans(&ch, r, i, s, false, sp);
			render_spans(sp, n, sharing(r, s, M, T), ch.makespan[i], cols, scale, row);
			fprintf(f, "p%-2u |%s|\n", s, row);
		}
	}
	fprintf(f, "%s\n", ax);
	fprintf(
	    f,
	    "0-9: forward (F) of micro-batch 0-9, a-z: its backward (B; the input gradient B_in where the "
	    "schedule splits it off),\nA-Z: its weight gradient (W, split off by zbh1, zbh2, zbv, "
	    "dualpipev, auto), each the micro-batch's index modulo 10 or 26; '.' idle; a chunked "
	    "schedule's\nrows are its chunks, placed on the threads as its 'chunks on threads' line says\n");
out:
	free(row);
	free(sp);
	train_chart_fini(&ch);
}

/* ---- the same charts as SVG (--svg) ---- */

#define SVG_W	   1000.0 /* px */
#define SVG_LEFT   64.0	  /* the row labels */
#define SVG_RIGHT  24.0
#define SVG_ROW	   16.0
#define SVG_PAD	   3.0
#define SVG_TITLE  22.0
#define SVG_BOTTOM 70.0 /* the axis and the legend */

/* A span's colour: training by operation (F, backward, W: its character's class), a forward batch by
 * micro-batch (a palette of 8, the character's index). */
static const char *span_fill(char c, bool training)
{
	static const char *const palette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
					      "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};
	if (training)
		return c >= '0' && c <= '9' ? "#4e79a7" : c >= 'a' && c <= 'z' ? "#f28e2b" : "#59a14f";
	const char *d = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
	const char *p = strchr(d, c);
	return palette[(p ? (size_t)(p - d) : 0) % 8];
}

/* One row: a label, then a rectangle per span on [0, scale) across the plot's width, the span's character
 * in it when it fits; `opacity` below 1 for a prediction. */
static void svg_row(FILE *f, double y, const char *label, const struct span *sp, size_t n, double scale,
		    bool training, double opacity)
{
	const double pw = SVG_W - SVG_LEFT - SVG_RIGHT;
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"l\">%s</text>\n", SVG_LEFT - 6, y + SVG_ROW - 4,
		label);
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4f4f4\"/>\n",
		SVG_LEFT, y, pw, SVG_ROW);
	for (size_t k = 0; k < n; k++) {
		double x = SVG_LEFT + pw * (double)sp[k].t0 / scale,
		       w = pw * (double)(sp[k].t1 - sp[k].t0) / scale;
		fprintf(f,
			"<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
			"fill-opacity=\"%.2f\"><title>%c %.3f-%.3f ms</title></rect>\n",
			x, y, w > 0.5 ? w : 0.5, SVG_ROW, span_fill(sp[k].c, training), opacity, sp[k].c,
			(double)sp[k].t0 / 1e6, (double)sp[k].t1 / 1e6);
		if (w >= 9)
			fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" class=\"c\">%c</text>\n", x + w / 2,
				y + SVG_ROW - 4, sp[k].c);
	}
}

/* The picture is written by rename (mbp_file): whole or not at all, and a node at the path is refused. */
static mbp_file *svg_open(const char *path, double height, char *err, size_t errlen)
{
	mbp_file *file;
	int rc = mbp_file_new(&file, path);
	if (rc) {
		snprintf(err, errlen, "--svg %s: cannot write it: %s", path,
			 rc == -EEXIST ? "not a regular file" : strerror(-rc));
		return NULL;
	}
	fprintf(mbp_file_stream(file),
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
		"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
		"<style>.l{text-anchor:end}.c{text-anchor:middle;fill:#fff;font-size:10px}"
		".t{font-weight:bold}</style>\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
		SVG_W, height, SVG_W, height);
	return file;
}

/* The time axis at y (ticks at fifths of the scale), a legend under it, the end of the document. */
static int svg_close(mbp_file *file, const char *path, double y, double scale, bool training, char *err,
		     size_t errlen)
{
	FILE *f = mbp_file_stream(file);
	const double pw = SVG_W - SVG_LEFT - SVG_RIGHT;
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/>\n", SVG_LEFT,
		y + 4, SVG_LEFT + pw, y + 4);
	for (int k = 0; k <= 5; k++) {
		char t[32];
		fmt_ms(t, sizeof(t), scale * k / 5);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
			SVG_LEFT + pw * k / 5, y + 18, t);
	}
	static const char *const legend[2][2] = {
	    {"each box: a micro-batch's time in a stage, its character the micro-batch (0-9, a-z, A-Z);",
	     "grey: the stage idle"},
	    {"blue: forward (F), orange: backward (B, or B_in where split), green: weight gradient (W);",
	     "rows s: the measured step (s2/t0: chunk 2 on thread 0); pale rows p: played with its costs"}};
	for (int k = 0; k < 2; k++)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", SVG_LEFT, y + 38 + 14 * k,
			legend[training][k]);
	fprintf(f, "</svg>\n");
	int rc = mbp_file_commit(file);
	if (rc) {
		snprintf(err, errlen, "--svg %s: cannot write it: %s", path,
			 rc == -EEXIST ? "not a regular file" : strerror(-rc));
		return -1;
	}
	return 0;
}

int pb_gantt_svg(const char *path, const pb_timeline *a, const pb_timeline *b, char *err, size_t errlen)
{
	const pb_timeline *tl[2] = {a, b};
	double scale = 0, height = SVG_BOTTOM;
	for (unsigned p = 0; p < 2; p++)
		if (tl[p] && tl[p]->t && tl[p]->mbs) {
			scale = (double)tl[p]->span_ns > scale ? (double)tl[p]->span_ns : scale;
			height += SVG_TITLE + tl[p]->stages * (SVG_ROW + SVG_PAD) + 8;
		}
	if (scale <= 0) {
		snprintf(err, errlen, "--svg %s: no batch was recorded to draw", path);
		return -1;
	}
	mbp_file *file = svg_open(path, height, err, errlen);
	if (!file)
		return -1;
	FILE *f = mbp_file_stream(file);
	double y = 0;
	for (unsigned p = 0; p < 2; p++) {
		if (!tl[p] || !tl[p]->t || !tl[p]->mbs)
			continue;
		char t[128], label[16];
		title(t, sizeof(t), tl[p], p == 1);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"t\">%s</text>\n", SVG_LEFT, y + 16, t);
		y += SVG_TITLE;
		struct span *sp = calloc(tl[p]->mbs, sizeof(*sp));
		if (!sp) {
			mbp_file_destroy(file);
			snprintf(err, errlen, "--svg %s: out of memory", path);
			return -1;
		}
		for (unsigned s = 0; s < tl[p]->stages; s++) {
			size_t n = 0;
			for (uint32_t j = 0; j < tl[p]->mbs; j++) {
				const uint64_t *tt = tl[p]->t + ((size_t)s * tl[p]->mbs + j) * 2;
				if (tt[0] != UINT64_MAX && tt[1] != UINT64_MAX)
					sp[n++] = (struct span){tt[0], tt[1], mb_char(j)};
			}
			snprintf(label, sizeof(label), "s%u", s);
			svg_row(f, y, label, sp, n, scale, false, 1);
			y += SVG_ROW + SVG_PAD;
		}
		free(sp);
		y += 8;
	}
	return svg_close(file, path, y, scale, false, err, errlen);
}

int pb_train_gantt_svg(const char *path, const pb_train_report *rep, char *err, size_t errlen)
{
	struct train_chart ch;
	train_chart_init(&ch, rep);
	double height = SVG_BOTTOM;
	for (unsigned i = 0; i < rep->n; i++)
		if (rep->r[i].nev)
			height +=
			    SVG_TITLE + (ch.npred[i] ? 2 : 1) * rep->r[i].stages * (SVG_ROW + SVG_PAD) + 8;
	struct span *sp = malloc(ch.nmax * sizeof(*sp));
	mbp_file *file = NULL;
	int rc = -1;
	if (ch.scale <= 0 || !sp)
		snprintf(err, errlen, "--svg %s: %s", path,
			 sp ? "no step was recorded to draw" : "out of memory");
	else
		file = svg_open(path, height, err, errlen);
	if (file) {
		FILE *f = mbp_file_stream(file);
		double y = 0;
		for (unsigned i = 0; i < rep->n; i++) {
			const pb_train_result *r = &rep->r[i];
			if (!r->nev)
				continue;
			char a[32], b[32], label[16];
			fmt_ms(a, sizeof(a), (double)r->ev_step_ns);
			fmt_ms(b, sizeof(b), ch.makespan[i]);
			fprintf(
			    f,
			    "<text x=\"%.1f\" y=\"%.1f\" class=\"t\">%s: the fastest measured step, %s (s)",
			    SVG_LEFT, y + 16, mbp_sched_name(r->kind), a);
			if (ch.npred[i])
				fprintf(f, "; predicted, %s (p)", b);
			fprintf(f, "</text>\n");
			y += SVG_TITLE;
			for (int measured = 1; measured >= 0; measured--) {
				if (!measured && !ch.npred[i])
					continue;
				for (unsigned s = 0; s < r->stages; s++) {
					size_t n = train_spans(&ch, r, i, s, measured, sp);
					/* a chunk's row says its thread: s3/t0 */
					if (r->chunks > 1)
						snprintf(label, sizeof(label), "%c%u/t%u",
							 measured ? 's' : 'p', s,
							 sharing_thread(r, s, rep->cfg->mbs));
					else
						snprintf(label, sizeof(label), "%c%u", measured ? 's' : 'p',
							 s);
					svg_row(f, y, label, sp, n, ch.scale, true, measured ? 1 : 0.45);
					y += SVG_ROW + SVG_PAD;
				}
			}
			y += 8;
		}
		rc = svg_close(file, path, y, ch.scale, true, err, errlen);
	}
	free(sp);
	train_chart_fini(&ch);
	return rc;
}

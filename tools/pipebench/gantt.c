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

/* One stage's row of `cols` cells, over [0, scale_ns). */
static void render_row(const pb_timeline *tl, unsigned stage, unsigned cols, double scale_ns, char *row)
{
	double dt = scale_ns / cols;
	double *busy = calloc(cols, sizeof(double)), *best = calloc(cols, sizeof(double));
	uint32_t *who = calloc(cols, sizeof(uint32_t));
	if (!busy || !best || !who) {
		memset(row, '?', cols);
		goto out;
	}
	for (uint32_t j = 0; j < tl->mbs; j++) {
		const uint64_t *t = tl->t + ((size_t)stage * tl->mbs + j) * 2;
		if (t[0] == UINT64_MAX || t[1] == UINT64_MAX || t[1] < t[0])
			continue;
		unsigned c0 = (unsigned)((double)t[0] / dt), c1 = (unsigned)((double)t[1] / dt);
		for (unsigned c = c0; c <= c1 && c < cols; c++) {
			double lo = c * dt, hi = lo + dt;
			double a = (double)t[0] > lo ? (double)t[0] : lo,
			       b = (double)t[1] < hi ? (double)t[1] : hi;
			if (b <= a)
				continue;
			busy[c] += b - a;
			if (b - a > best[c]) {
				best[c] = b - a;
				who[c] = j;
			}
		}
	}
	unsigned k = tl->share[stage] ? tl->share[stage] : 1;
	for (unsigned c = 0; c < cols; c++) {
		if (c * dt >= (double)tl->span_ns)
			row[c] = ' ';
		else if (busy[c] >= dt / 2 / k)
			row[c] = mb_char(who[c]);
		else
			row[c] = '.';
	}
out:
	row[cols] = 0;
	free(busy);
	free(best);
	free(who);
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

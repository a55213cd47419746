/*
 * pipetrain --plot: the run's curves as an SVG picture, drawn from the figures the run printed (no plotting
 * library, nothing outside the tool).
 *
 * Two panels over one step axis (the updates done, from the step the run started at to the last one):
 * the loss (each step's mini-batch loss, thin; the epochs' mean training loss and their test loss, with a
 * dot per epoch) and the accuracy (the epochs' training, validation and test accuracy). Each curve is one
 * <polyline> with a data-curve attribute naming it, so programs and tests can find it. However long the
 * run, the step curve has at most PT_CURVE_MAX points (pt_curve_add merges neighbours). Non-finite values
 * (a diverged step) are left out of the curves.
 *
 * The file is written by rename (mbp_file, as everything mbpipe writes): a reader sees the previous
 * picture or the whole new one, a failed write leaves no half picture, and anything at the path that is
 * not a regular file (a device, a FIFO, a link) is left alone and the write refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipetrain.h"
#include "util/plural.h"

void pt_curve_add(pt_curve *c, double x, double y)
{
	if (!isfinite(y))
		return;
	if (!c->per)
		c->per = 1;
	c->pend_x = x;
	c->pend_y += y;
	if (++c->pend_n < c->per)
		return;
	if (c->n == PT_CURVE_MAX) { /* full: pairs merged, each point now twice as many steps */
		for (unsigned i = 0; i < c->n / 2; i++) {
			c->x[i] = c->x[2 * i + 1];
			c->y[i] = (c->y[2 * i] + c->y[2 * i + 1]) / 2;
		}
		c->n /= 2;
		c->per *= 2;
		if (c->pend_n < c->per)
			return;
	}
	c->x[c->n] = c->pend_x;
	c->y[c->n++] = c->pend_y / (double)c->pend_n;
	c->pend_n = 0;
	c->pend_y = 0;
}

#define W      860.0
#define LEFT   70.0
#define PW     600.0 /* the plot's width; the legend is right of it */
#define PH     220.0
#define TOP0   52.0
#define TOP1   (TOP0 + PH + 62)
#define HEIGHT (TOP1 + PH + 48)

/* One panel's axes: the step range [x0, x1] and the value range [lo, hi], at `top`. */
struct axes {
	double x0, x1, lo, hi, top;
};

static double px(const struct axes *a, double x)
{
	double v = LEFT + PW * (x - a->x0) / (a->x1 - a->x0);
	return v < LEFT ? LEFT : v > LEFT + PW ? LEFT + PW : v;
}

static double py(const struct axes *a, double y)
{
	double v = a->top + PH * (1 - (y - a->lo) / (a->hi - a->lo));
	return v < a->top ? a->top : v > a->top + PH ? a->top + PH : v;
}

/* The panel's title, frame, grid and tick labels. */
static void panel(FILE *f, const struct axes *a, const char *title, const char *id)
{
	fprintf(f, "<g id=\"%s\">\n<text class=\"t\" x=\"%.1f\" y=\"%.1f\">%s</text>\n", id, LEFT,
		a->top - 10, title);
	fprintf(f,
		"<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
		"stroke=\"#888\"/>\n",
		LEFT, a->top, PW, PH);
	for (int k = 0; k <= 4; k++) {
		double v = a->lo + (a->hi - a->lo) * k / 4, y = py(a, v);
		if (k > 0 && k < 4)
			fprintf(f,
				"<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n",
				LEFT, y, LEFT + PW, y);
		fprintf(f, "<text class=\"y\" x=\"%.1f\" y=\"%.1f\">%.3g</text>\n", LEFT - 6, y + 4, v);
	}
	for (int k = 0; k <= 5; k++) {
		double s = a->x0 + (a->x1 - a->x0) * k / 5;
		fprintf(f, "<text class=\"x\" x=\"%.1f\" y=\"%.1f\">%.0f</text>\n", px(a, s),
			a->top + PH + 16, s);
	}
}

/* One curve: a polyline over the finite points, a dot at each when `dots`, its legend line `k`. Nothing
 * when it has no point. */
static void curve(FILE *f, const struct axes *a, const char *name, const char *label, const char *color,
		  double width, bool dots, const double *x, const double *y, unsigned n, unsigned k)
{
	unsigned finite = 0;
	for (unsigned i = 0; i < n; i++)
		finite += isfinite(y[i]) != 0;
	if (!finite)
		return;
	fprintf(f, "<polyline data-curve=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"",
		name, color, width);
	for (unsigned i = 0, first = 1; i < n; i++)
		if (isfinite(y[i])) {
			fprintf(f, "%s%.1f,%.1f", first ? "" : " ", px(a, x[i]), py(a, y[i]));
			first = 0;
		}
	fprintf(f, "\"/>\n");
	for (unsigned i = 0; dots && i < n; i++)
		if (isfinite(y[i]))
			fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", px(a, x[i]),
				py(a, y[i]), color);
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%s</text>\n", LEFT + PW + 12,
		a->top + 14 + 16 * k, color, label);
}

/* The lowest and highest finite value of v (lo stays, hi stays, when none is lower or higher). */
static void span(const double *v, unsigned n, double *lo, double *hi)
{
	for (unsigned i = 0; i < n; i++)
		if (isfinite(v[i])) {
			*lo = v[i] < *lo ? v[i] : *lo;
			*hi = v[i] > *hi ? v[i] : *hi;
		}
}

/* @return 0, or -ENOMEM. */
static int draw(FILE *f, const pt_report *r)
{
	const pt_config *c = r->c;
	const pt_curve *sc = r->step_loss;
	enum { NE = 5 }; /* train loss, test loss, train acc, val acc, test acc */
	unsigned n = r->n_ep;
	double *ex = malloc((NE + 1) * ((size_t)n + 1) * sizeof(double)), *ev[NE];
	if (!ex)
		return -ENOMEM;
	for (int j = 0; j < NE; j++)
		ev[j] = ex + (size_t)(j + 1) * (n + 1);
	for (unsigned i = 0; i < n; i++) {
		const pt_epoch *e = &r->ep[i];
		ex[i] = (double)e->step;
		ev[0][i] = e->train_loss;
		ev[1][i] = e->test_loss;
		ev[2][i] = e->train_acc;
		ev[3][i] = e->val_acc;
		ev[4][i] = e->test_acc;
	}
	/* the step curve's points, the one being filled included */
	unsigned ns = sc ? sc->n : 0;
	double sx[PT_CURVE_MAX + 1], sy[PT_CURVE_MAX + 1];
	if (sc) {
		memcpy(sx, sc->x, ns * sizeof(double));
		memcpy(sy, sc->y, ns * sizeof(double));
		if (sc->pend_n) {
			sx[ns] = sc->pend_x;
			sy[ns++] = sc->pend_y / (double)sc->pend_n;
		}
	}
	double last = (double)r->start_step;
	if (ns)
		last = sx[ns - 1] > last ? sx[ns - 1] : last;
	if (n)
		last = ex[n - 1] > last ? ex[n - 1] : last;
	struct axes loss = {.x0 = (double)r->start_step, .lo = 0, .hi = 0, .top = TOP0};
	loss.x1 = last > loss.x0 ? last : loss.x0 + 1;
	double dummy = 0;
	span(sy, ns, &dummy, &loss.hi);
	span(ev[0], n, &dummy, &loss.hi);
	span(ev[1], n, &dummy, &loss.hi);
	loss.hi = loss.hi > 0 ? loss.hi * 1.05 : 1;
	struct axes acc = loss;
	acc.top = TOP1;
	acc.lo = 1;
	acc.hi = 1;
	for (int k = 2; k < NE; k++)
		span(ev[k], n, &acc.lo, &dummy);
	acc.lo = floor(acc.lo * 10) / 10;
	acc.lo = acc.lo < 0 ? 0 : acc.lo > 0.9 ? 0.9 : acc.lo;

	char w[256];
	size_t k = 0;
	for (unsigned i = 0; i <= r->layers && k < sizeof w; i++)
		k += (size_t)snprintf(w + k, sizeof w - k, "%s%u", i ? "-" : "", r->widths[i]);
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
		"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
		"<style>.t{font-weight:bold}.y{text-anchor:end}.x{text-anchor:middle}</style>\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
		W, HEIGHT, W, HEIGHT);
	fprintf(f,
		"<text class=\"t\" x=\"%.1f\" y=\"20\">pipetrain: MLP %s, %s on %u %s, %s lr %g, batch %u; "
		"epochs %u-%u of %u</text>\n",
		LEFT, w, mbp_sched_name(c->schedule), r->stages, PLURAL(r->stages, "stage", "stages"),
		c->optim == MBP_OPTIM_SGD ? "SGD" : "AdamW", c->lr, c->batch, r->start_epoch + 1,
		pt_epochs_reached(r), r->epochs_total);

	panel(f, &loss, "loss (mean per row)", "loss");
	char step_label[64];
	if (sc && sc->per > 1)
		snprintf(step_label, sizeof step_label, "per step (means of %llu)",
			 (unsigned long long)sc->per);
	else
		snprintf(step_label, sizeof step_label, "per step");
	curve(f, &loss, "step loss", step_label, "#9bb7d4", 1, false, sx, sy, ns, 0);
	curve(f, &loss, "train loss", "training, per epoch", "#1f5fa8", 2, true, ex, ev[0], n, 1);
	curve(f, &loss, "test loss", "test", "#c0392b", 2, true, ex, ev[1], n, 2);
	fprintf(f, "</g>\n");

	panel(f, &acc, "accuracy", "accuracy");
	curve(f, &acc, "train accuracy", "training (during the epoch)", "#1f5fa8", 2, true, ex, ev[2], n, 0);
	curve(f, &acc, "validation accuracy", "validation", "#27ae60", 2, true, ex, ev[3], n, 1);
	curve(f, &acc, "test accuracy", "test", "#c0392b", 2, true, ex, ev[4], n, 2);
	fprintf(f, "</g>\n<text class=\"x\" x=\"%.1f\" y=\"%.1f\">step (updates done)</text>\n</svg>\n",
		LEFT + PW / 2, HEIGHT - 8);
	free(ex);
	return 0;
}

int pt_plot_write(const pt_report *r, char *err, size_t errlen)
{
	const char *path = r->c->plot;
	mbp_file *f;
	int rc = mbp_file_new(&f, path);
	if (rc == 0) {
		if (draw(mbp_file_stream(f), r) < 0) {
			mbp_file_destroy(f);
			rc = -ENOMEM;
		} else {
			rc = mbp_file_commit(f);
		}
	}
	if (rc < 0) {
		snprintf(err, errlen, "--plot %s: %s", path,
			 rc == -EEXIST ? "not a regular file, left as it is" : strerror(-rc));
		return -1;
	}
	return 0;
}

/*
 * pipebench predictions: the bubble a perfect pipeline would have, and the choice of the best size.
 *
 * A batch of M micro-batches through S stages whose micro-batch takes t_i in stage i, with no hand-off cost
 * and unbounded queues, takes T = sum(t_i) + (M - 1) max(t_i): the first micro-batch crosses every stage,
 * then the slowest stage emits one more every max(t_i). The stages work M sum(t_i) of the N T available
 * (N threads), so the predicted bubble is 1 - M sum(t_i) / (N T). With equal stages this is GPipe's
 * (S - 1) / (M + S - 1). Where stages share worker threads (more stages than CPUs), a thread is one stage of
 * the schedule whose t is the sum of its stages' t_i. A stage of r_i replicas emits one micro-batch every
 * t_i / r_i once its replicas are busy (its period), but each micro-batch still takes t_i through it: the
 * time is then the finish of the last micro-batch by the recurrence F_i(k) = max(F_{i-1}(k), F_i(k - r_i))
 * + t_i (micro-batch k starts in stage i when stage i - 1 has finished it and the replica that took
 * micro-batch k - r_i, the first to be free, is free again; F_{-1} = 0, every micro-batch submitted at
 * once), which with one replica everywhere is the closed form above; N counts the replicas. The t_i are
 * the service times measured in the same run (time inside each stage function per micro-batch), so the
 * difference between measured and predicted is the engine's overhead: hand-offs, wake-ups, and the time a
 * stage spent off its CPU.
 *
 * The choice: the size with the highest median throughput is the best; every size whose throughput, paired
 * round by round with the best's, has its median within PB_TIE_MARGIN of it and cannot be shown more than
 * that below it ties with it; the smallest tied size is chosen (smaller micro-batches need less memory and
 * give lower latency), with the margin by which it beats the next smaller size. A size whose median is
 * further below but whose interval still reaches the margin is unsettled (pb_versus_best): it may tie or
 * be slower, so it is not chosen as if it tied, and when one lies below the chosen size the verdict says
 * that the choice is open and how many repeats would settle it. With a latency target only the sizes
 * meeting it run.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pipebench.h"

void pb_predict(pb_result *r)
{
	/* the schedule's steps: a thread's stages one after the other, a replicated stage on its replicas
	 * (which share no thread) */
	double t[MBP_MAX_STAGES];
	unsigned rep[MBP_MAX_STAGES], off[MBP_MAX_STAGES], G = 0, N = 0;
	for (unsigned i = 0; i < r->stages && i < MBP_MAX_STAGES; i++) {
		if (i == 0 || !r->threads || r->st[i].thread != r->st[i - 1].thread) {
			unsigned n = r->st[i].replicas ? r->st[i].replicas : 1;
			t[G] = 0;
			rep[G] = n < MBP_MAX_REPLICAS ? n : MBP_MAX_REPLICAS;
			off[G] = N;
			N += rep[G];
			G++;
		}
		t[G - 1] += r->st[i].service_us;
	}
	double sum = 0, max = 0, min = INFINITY;
	for (unsigned g = 0; g < G; g++) {
		double period = t[g] / rep[g];
		sum += t[g];
		max = period > max ? period : max;
		min = period < min ? period : min;
	}
	/* the finish of each micro-batch at each step, in order: free_at[off[g] + j] is when replica j of step
	 * g finished its last micro-batch (micro-batch k goes to replica k mod r, the first to be free) */
	double free_at[MBP_MAX_STAGES * MBP_MAX_REPLICAS] = {0}, T = 0;
	for (uint32_t k = 0; k < r->mbs; k++) {
		double f = 0; /* submitted at once */
		for (unsigned g = 0; g < G; g++) {
			double *slot = &free_at[off[g] + k % rep[g]];
			f = (f > *slot ? f : *slot) + t[g];
			*slot = f;
		}
		T = f;
	}
	const unsigned S = r->threads ? r->threads : r->stages;
	const double M = r->mbs;
	r->bubble_gpipe = S + M > 1 ? (S - 1.0) / (M + S - 1.0) : 0;
	r->balanced = G > 0 && max <= 1.10 * min;
	r->predicted_ms = T / 1e3;
	r->predicted_period_us = max;
	r->predicted_rows_per_s = T > 0 ? r->rows / (T / 1e6) : 0;
	r->bubble_predicted = T > 0 && N ? 1.0 - M * sum / (N * T) : 0;
}

static void fmt_rate(char *buf, size_t n, double rows_per_s)
{
	if (rows_per_s >= 1e6)
		snprintf(buf, n, "%.2fM rows/s", rows_per_s / 1e6);
	else if (rows_per_s >= 1e4)
		snprintf(buf, n, "%.1fk rows/s", rows_per_s / 1e3);
	else
		snprintf(buf, n, "%.0f rows/s", rows_per_s);
}

/* "m=32 is 4.1% faster than m=16 (95% interval 2.0 to 6.3%)" into buf. */
static void fmt_margin(char *buf, size_t n, const pb_result *a, const pb_result *b, const pb_interval *iv)
{
	double d = (iv->median - 1) * 100, lo = (iv->lo - 1) * 100, hi = (iv->hi - 1) * 100;
	snprintf(buf, n, "m=%u is %.1f%% %s than m=%u (%s %.1f to %.1f%%%s)", a->mb_rows, fabs(d),
		 d >= 0 ? "faster" : "slower", b->mb_rows,
		 iv->ci ? "95% interval" : "range of too few repeats:", lo, hi,
		 lo <= 0 && hi >= 0 ? ", not distinguishable" : "");
}

static bool usable(const pb_result *r)
{
	return r->status == 0 && r->batches > 0;
}

/* The choice's reason, cut at its buffer's end if it must be (vsnprintf: a bounded text by design, which
 * gcc's truncation warning cannot tell from a mistake in snprintf at -O0). */
__attribute__((format(printf, 2, 3))) static void set_why(pb_choice *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	va_end(ap);
}

void pb_choose(pb_result *r, unsigned n, double latency_target_ms, double margin, pb_choice *c)
{
	char a[32], t[64] = "";
	memset(c, 0, sizeof(*c));
	c->chosen = c->best = c->next = n;
	for (unsigned i = 0; i < n; i++)
		r[i].tied = r[i].unsettled = false;

	bool any = false;
	for (unsigned i = 0; i < n; i++)
		any |= usable(&r[i]);
	if (!any) {
		set_why(c, "no size completed its measurement");
		return;
	}
	/* the sizes in the running: all, or those meeting the latency target */
	bool in[PB_MAX_SIZES];
	bool some = false;
	for (unsigned i = 0; i < n && i < PB_MAX_SIZES; i++) {
		in[i] = usable(&r[i]) && (latency_target_ms <= 0 || r[i].p99_ms <= latency_target_ms);
		some |= in[i];
	}
	if (latency_target_ms > 0) {
		c->latency_met = some;
		if (!some) {
			unsigned low = n;
			for (unsigned i = 0; i < n; i++)
				if (usable(&r[i]) && (low == n || r[i].p99_ms < r[low].p99_ms))
					low = i;
			c->chosen = c->best = low;
			set_why(c,
				"no size meets the latency target of %g ms; m=%u has the lowest p99 batch "
				"latency "
				"(%.3g ms)",
				latency_target_ms, r[low].mb_rows, r[low].p99_ms);
			return;
		}
		snprintf(t, sizeof(t), " among the sizes whose p99 batch latency meets %g ms",
			 latency_target_ms);
	}
	for (unsigned i = 0; i < n; i++)
		if (in[i] && (c->best == n || r[i].thr.median > r[c->best].thr.median))
			c->best = i;
	const pb_result *best = &r[c->best];
	/* ties: paired by round with the best; sizes are ascending, so the first tied one is the smallest */
	pb_interval open[PB_MAX_SIZES]; /* the unsettled sizes' ratios */
	for (unsigned i = 0; i < n; i++) {
		if (!in[i])
			continue;
		pb_interval iv;
		unsigned k = r[i].repeats < best->repeats ? r[i].repeats : best->repeats;
		if (i == c->best) {
			r[i].tied = true;
		} else if (r[i].rate && best->rate && k &&
			   pb_ratio_interval(r[i].rate, best->rate, k, &iv) == 0) {
			pb_versus v = pb_versus_best(&iv, margin);
			r[i].tied = v == PB_VS_TIED;
			r[i].unsettled = v == PB_VS_UNSETTLED;
			open[i] = iv;
		} else { /* no paired samples: the ratio of the medians */
			r[i].tied = r[i].thr.median >= (1 - margin) * best->thr.median;
		}
		if (r[i].tied) {
			c->ntied++;
			if (c->chosen == n) {
				c->chosen = i;
				if (k && r[i].rate && best->rate)
					pb_ratio_interval(r[i].rate, best->rate, k, &c->vs_best);
			}
		}
	}
	const pb_result *ch = &r[c->chosen];
	for (unsigned i = 0; i < c->chosen; i++)
		if (in[i])
			c->next = i;
	/* the sizes below the chosen one that this measurement cannot place: "; unsettled: m=8 (10.9% below
	 * m=64, 95% interval -25.0 to +2.0%) ..., and how much longer to measure */
	char open_s[400] = "";
	size_t olen = 0;
	for (unsigned i = 0; i < c->chosen; i++) {
		if (!r[i].unsettled)
			continue;
		const pb_interval *iv = &open[i];
		double f = pb_settle_factor(iv, margin);
		unsigned want = (unsigned)ceil(f * iv->n);
		if (f > c->settle_factor)
			c->settle_factor = f;
		if (want > c->settle_repeats)
			c->settle_repeats = want;
		if (c->unsettled++ < 4 && olen < sizeof(open_s) - 100)
			olen += (size_t)snprintf(
			    open_s + olen, sizeof(open_s) - olen,
			    "%sm=%u (%.1f%% below m=%u, %s %+.1f to %+.1f%%)", olen ? ", " : "", r[i].mb_rows,
			    (1 - iv->median) * 100, best->mb_rows,
			    iv->ci ? "95% interval" : "range of too few repeats:", (iv->lo - 1) * 100,
			    (iv->hi - 1) * 100);
	}
	char unsettled[700] = "";
	if (c->unsettled)
		snprintf(
		    unsettled, sizeof(unsettled),
		    "; UNSETTLED: %s%s %s more than %.0f%% below the best by %s median, but %s interval "
		    "reaches within %.0f%% of it: tied or slower, this measurement cannot tell, so the "
		    "choice is open; %s about %s%.0fx the repeats to settle it: a --duration about %.0fx "
		    "as long, or --batches %u",
		    open_s, c->unsettled > 4 ? ", ..." : "", c->unsettled == 1 ? "is" : "are", margin * 100,
		    c->unsettled == 1 ? "its" : "their", c->unsettled == 1 ? "its" : "each one's",
		    margin * 100, c->unsettled == 1 ? "measure" : "measure them",
		    c->settle_factor >= PB_SETTLE_MAX ? "at least " : "", c->settle_factor, c->settle_factor,
		    c->settle_repeats);
	char next[200] = "";
	if (c->next < n) {
		const pb_result *nx = &r[c->next];
		unsigned k = ch->repeats < nx->repeats ? ch->repeats : nx->repeats;
		if (k && ch->rate && nx->rate && pb_ratio_interval(ch->rate, nx->rate, k, &c->vs_next) == 0) {
			char m[140];
			fmt_margin(m, sizeof(m), ch, nx, &c->vs_next);
			snprintf(next, sizeof(next), "; against the next smaller size, %s", m);
		}
	}
	fmt_rate(a, sizeof(a), best->thr.median);
	const char *tail =
	    ch->bubble_predicted < ch->bubble - 0.05
		? "the rest is what the schedule does not model: hand-offs, wake-ups, time off the CPU"
		: "the measured bubble follows the schedule";
	char sizes[200] = "";
	size_t len = 0;
	for (unsigned i = 0; i < n && len < sizeof(sizes) - 16; i++)
		if (r[i].tied && i != c->chosen)
			len += (size_t)snprintf(sizes + len, sizeof(sizes) - len, "%sm=%u", len ? ", " : "",
						r[i].mb_rows);
	unsigned running = 0, open_any = 0;
	for (unsigned i = 0; i < n; i++) {
		running += in[i];
		open_any += r[i].unsettled;
	}
	if (running == 1)
		set_why(c,
			"m=%u is the only size measured%s (%s); bubble %.2f measured, %.2f "
			"predicted: %s",
			ch->mb_rows, t, a, ch->bubble, ch->bubble_predicted, tail);
	else if (c->chosen == c->best && c->ntied == 1 && !open_any)
		set_why(
		    c,
		    "m=%u has the best throughput%s (%s) and every other size is distinguishably more than "
		    "%.0f%% slower%s; bubble %.2f measured, %.2f predicted: %s",
		    ch->mb_rows, t, a, margin * 100, next, ch->bubble, ch->bubble_predicted, tail);
	else if (c->chosen == c->best && c->ntied == 1)
		set_why(
		    c,
		    "m=%u has the best throughput%s (%s) and no other size ties with it (within %.0f%%)%s%s; "
		    "bubble %.2f measured, %.2f predicted: %s",
		    ch->mb_rows, t, a, margin * 100, next, unsettled, ch->bubble, ch->bubble_predicted, tail);
	else if (c->chosen == c->best)
		set_why(c,
			"m=%u has the best throughput%s (%s); tied with it (its median within %.0f%% and not "
			"shown further below): %s; m=%u is the smallest, so it needs the least memory per "
			"micro-batch%s%s; bubble %.2f measured, %.2f predicted: %s",
			ch->mb_rows, t, a, margin * 100, sizes, ch->mb_rows, next, unsettled, ch->bubble,
			ch->bubble_predicted, tail);
	else {
		char m[140];
		fmt_margin(m, sizeof(m), ch, best, &c->vs_best);
		set_why(c,
			"m=%u is the smallest size tied with the best%s (m=%u, %s: %s, its median within "
			"%.0f%% and "
			"not shown further below; tied: %s), so it needs the least memory per "
			"micro-batch%s%s; bubble "
			"%.2f measured, %.2f predicted: %s",
			ch->mb_rows, t, best->mb_rows, a, m, margin * 100, sizes, next, unsettled, ch->bubble,
			ch->bubble_predicted, tail);
	}
}

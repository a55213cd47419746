/*
 * pipebench statistics: the interval of a median, paired comparisons, ties and the consistency checks.
 *
 * Everything here is a pure function of the samples it is given, so the unit tests feed it synthetic
 * samples (tests/test_pipebench.c) and the tool feeds it what it measured.
 *
 * - The interval of a median is distribution-free: for n sorted samples x(1) <= ... <= x(n) the pair
 *   (x(k), x(n-k+1)) covers the median with probability 1 - 2 P(B < k), B ~ Binomial(n, 1/2); k is the
 *   largest rank for which that reaches 95%. It needs no assumption about the shape of the noise, which on
 *   a shared machine is skewed (a preempted run is slow, never fast). Below 6 samples no pair reaches 95%:
 *   the interval is then the whole range and says so (ci = false).
 * - Two sizes are compared on paired samples: repeat i of both was taken in the same round of the
 *   interleaved schedule, so the ratio a(i) / b(i) cancels the drift of the machine's load between rounds;
 *   the interval of the median ratio says whether one is faster.
 * - Against the best, a size is tied when the median of its ratio is within the margin and the interval
 *   cannot show it below (1 - margin), slower when the interval's upper end is under 1 - margin, and
 *   unsettled when the median is more than the margin below but the interval still reaches 1 - margin:
 *   the measurement cannot tell which, and only more repeats can (the interval narrows about as
 *   1 / sqrt(repeats)).
 * - The checks test a result's figures against each other (see pb_check()).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipebench.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The largest k (1-based) with 2 P(B <= k - 1) <= 1 - conf, B ~ Bin(n, 1/2); 0 when none. */
static unsigned median_rank(unsigned n, double conf)
{
	double tail = 0, alpha = (1 - conf) / 2;
	unsigned k = 0;
	for (unsigned j = 0; j < n; j++) {
		double lp = lgamma(n + 1.0) - lgamma(j + 1.0) - lgamma(n - j + 1.0) - n * log(2.0);
		tail += exp(lp);
		if (tail > alpha)
			break;
		k = j + 1;
	}
	return k;
}

void pb_interval_of(const double *v, unsigned n, pb_interval *iv)
{
	memset(iv, 0, sizeof(*iv));
	iv->n = n;
	if (n == 0)
		return;
	double *s = malloc(n * sizeof(double));
	if (!s) { /* no interval rather than a wrong one */
		iv->median = iv->lo = iv->hi = iv->min = iv->max = v[0];
		return;
	}
	memcpy(s, v, n * sizeof(double));
	qsort(s, n, sizeof(double), cmp_double);
	iv->median = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	iv->min = s[0];
	iv->max = s[n - 1];
	unsigned k = median_rank(n, PB_CONFIDENCE);
	iv->ci = k > 0;
	iv->lo = k ? s[k - 1] : s[0];
	iv->hi = k ? s[n - k] : s[n - 1];
	free(s);
}

double pb_percentile(const double *v, unsigned n, double p)
{
	double *s = n ? malloc(n * sizeof(double)) : NULL;
	if (!s)
		return n ? v[0] : 0;
	memcpy(s, v, n * sizeof(double));
	qsort(s, n, sizeof(double), cmp_double);
	size_t k = (size_t)ceil(p * (double)n);
	double x = s[k ? k - 1 : 0];
	free(s);
	return x;
}

double pb_interval_rel(const pb_interval *iv)
{
	if (!iv->ci || !(iv->median > 0))
		return INFINITY;
	double a = iv->median - iv->lo, b = iv->hi - iv->median;
	return (a > b ? a : b) / iv->median;
}

int pb_ratio_interval(const double *a, const double *b, unsigned n, pb_interval *iv)
{
	memset(iv, 0, sizeof(*iv));
	if (n == 0)
		return -1;
	double *r = malloc(n * sizeof(double));
	if (!r)
		return -1;
	for (unsigned i = 0; i < n; i++)
		r[i] = b[i] > 0 ? a[i] / b[i] : 0;
	pb_interval_of(r, n, iv);
	free(r);
	return 0;
}

pb_versus pb_versus_best(const pb_interval *ratio, double margin)
{
	if (ratio->hi < 1.0 - margin)
		return PB_VS_SLOWER;
	return ratio->median >= 1.0 - margin ? PB_VS_TIED : PB_VS_UNSETTLED;
}

double pb_settle_factor(const pb_interval *ratio, double margin)
{
	double gap = (1.0 - margin) - ratio->median, half = ratio->hi - ratio->median;
	if (!(gap > 0) || !(half > 0))
		return 2;
	double f = ceil((half / gap) * (half / gap));
	return f < 2 ? 2 : f > PB_SETTLE_MAX ? PB_SETTLE_MAX : f;
}

/* ---- consistency checks ---- */

static void flag(pb_result *r, unsigned f, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void flag(pb_result *r, unsigned f, const char *fmt, ...)
{
	if (!r->flags) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->check, sizeof(r->check), fmt, ap);
		va_end(ap);
	}
	r->flags |= f;
}

void pb_check(pb_result *r, const pb_check_input *in)
{
	r->flags = 0;
	r->check[0] = 0;
	if (r->status || r->batches == 0)
		return;
	const unsigned T = r->threads ? r->threads : r->stages;
	const unsigned par = T < in->cpus ? T : in->cpus; /* threads that can compute at once */

	/* 1. Speed-up at most par x (1 - bubble): the stages are busy par x latency x (1 - bubble) per batch,
	 * which is at least the baseline's time for the same work unless the stages compute it faster. The
	 * most favourable reading of both (the interval ends) must still break it, plus PB_CHECK_SLACK. */
	double bound = par * (1.0 - r->bubble_iv.lo);
	if (r->speedup_lo > bound * (1.0 + PB_CHECK_SLACK)) {
		double stage_ms = r->stage_busy_ms; /* all stages' time in one batch */
		if (in->base_loud)
			flag(r, PB_CHECK_SPEEDUP,
			     "speed-up %.2f above %u x (1 - bubble %.2f) = %.2f: the sequential baseline ran "
			     "while other processes used the CPUs, so it looks slower than it is",
			     r->speedup, par, r->bubble_iv.lo, bound);
		else if (stage_ms > 0 && stage_ms < 0.9 * in->base_ms)
			flag(r, PB_CHECK_SPEEDUP,
			     "speed-up %.2f above %u x (1 - bubble %.2f) = %.2f: the stages computed a batch "
			     "in "
			     "%.3g ms together, the baseline in %.3g ms: the baseline was slowed (other "
			     "load, a "
			     "cold cache) or the stages gain from smaller working sets",
			     r->speedup, par, r->bubble_iv.lo, bound, stage_ms, in->base_ms);
		else
			flag(r, PB_CHECK_SPEEDUP,
			     "speed-up %.2f above %u x (1 - bubble %.2f) = %.2f: the bubble (a median over "
			     "batches) and the throughput (over all batches) disagree: batches vary widely",
			     r->speedup, par, r->bubble_iv.lo, bound);
	}

	/* 2. Each thread's busy, starved and blocked time cover the window it was measured in. */
	for (unsigned i = 0; i < r->stages;) {
		unsigned t = r->st[i].thread, j = i;
		double sum = 0;
		for (; j < r->stages && (r->threads ? r->st[j].thread == t : j == i); j++)
			sum += r->st[j].busy + r->st[j].starved + r->st[j].blocked;
		if (fabs(sum - 1.0) > PB_ACCOUNT_SLACK)
			flag(r, PB_CHECK_ACCOUNT,
			     "stage %u's thread: busy + starved + blocked = %.0f%% of the window, not 100%%: "
			     "time the engine did not account (waits straddling short windows, or a thread "
			     "stopped outside its waits)",
			     i, sum * 100);
		i = j;
	}

	/* 3. The bubble and the busy shares: while a batch is in flight (a share f of the window) the threads
	 * are busy 1 - bubble of the time, and idle between batches, so their mean busy share of the window
	 * is f x (1 - bubble). The bubble here is anything from its interval to its value over all batches at
	 * once (a few stalled batches move the latter, not the median), and PB_ACCOUNT_SLACK / 2 either way. */
	if (r->inflight_share > 0) {
		double busy = 0;
		for (unsigned i = 0; i < r->stages;
		     i++) /* a replicated stage's share is its replicas' mean */
			busy += r->st[i].busy * (r->st[i].replicas ? r->st[i].replicas : 1);
		busy /= T;
		double blo = r->bubble_iv.lo < r->bubble_all ? r->bubble_iv.lo : r->bubble_all;
		double bhi = r->bubble_iv.hi > r->bubble_all ? r->bubble_iv.hi : r->bubble_all;
		double lo = r->inflight_share * (1.0 - bhi) - PB_ACCOUNT_SLACK / 2;
		double hi = r->inflight_share * (1.0 - blo) + PB_ACCOUNT_SLACK / 2;
		if (busy < lo || busy > hi)
			flag(
			    r, PB_CHECK_BUBBLE,
			    "the threads were busy %.0f%% of the window, but a bubble of %.2f (%.2f over all "
			    "batches) with batches in flight %.0f%% of it gives %.0f-%.0f%%: the engine's "
			    "accounting and the stamps of the stages disagree",
			    busy * 100, r->bubble, r->bubble_all, r->inflight_share * 100, lo * 100,
			    hi * 100);
	}
}

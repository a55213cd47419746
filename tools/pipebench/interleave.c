/*
 * pipebench interleave: the measurement schedule, independent of what is measured.
 *
 * A machine's speed drifts: other processes come and go, the host steals time, caches and frequencies
 * change. Measuring candidate A for a while and then B puts that drift into the difference between them.
 * Here every arm (a micro-batch size, the sequential baseline) is visited once per round, in the order
 * A B C in even rounds and C B A in odd ones, so that drift within a round falls on all of them alike and
 * no arm always follows the same neighbour. Repeat i of every arm comes from round i: comparisons pair
 * them (stats.c).
 *
 * A visit runs `warmup` unmeasured units (the threads wake, the caches fill with this arm's data), then
 * enough measured units to fill about visit_s; the rate over those is one sample. Before the first
 * round, a warm-up round visits every arm once and discards it; it also times a unit.
 *
 * Rounds go on until every arm has min_repeats samples and its median's interval is within the tolerance,
 * or until the time budget has passed (every arm still gets min_repeats). The noise sampler marks each
 * round loud or quiet; after a loud one the schedule pauses for a quiet moment (pause_s in all, not
 * counted in the budget).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipebench.h"

#define MAX_UNITS 64

static int grow(pb_arm *a)
{
	if (a->n < a->cap)
		return 0;
	unsigned cap = a->cap ? a->cap * 2 : 32;
	double *r = realloc(a->rate, cap * sizeof(double));
	if (!r)
		return -1;
	a->rate = r;
	uint8_t *l = realloc(a->loud, cap);
	if (!l)
		return -1;
	a->loud = l;
	a->cap = cap;
	return 0;
}

static bool settled(const pb_arm *arms, unsigned n, const pb_schedule *s)
{
	for (unsigned i = 0; i < n; i++) {
		if (arms[i].n < s->min_repeats)
			return false;
		if (s->tolerance > 0) {
			pb_interval iv;
			pb_interval_of(arms[i].rate, arms[i].n, &iv);
			if (!(pb_interval_rel(&iv) <= s->tolerance))
				return false;
		}
	}
	return true;
}

static int visit(pb_arm *a, unsigned warm, unsigned units, double *rate, char *err, size_t errlen)
{
	char why[PB_ERR_MAX];
	if (a->visit(a->ctx, warm, units, rate, why, sizeof(why))) {
		snprintf(err, errlen, "%s: %s", a->label, why);
		return -1;
	}
	return 0;
}

int pb_interleave(pb_arm *arms, unsigned n, const pb_schedule *s, pb_noise *nz, char *err, size_t errlen)
{
	double rate;
	/* the warm-up round: discarded; it times one unit of each arm */
	for (unsigned i = 0; i < n; i++) {
		pb_arm *a = &arms[i];
		uint64_t t0 = mbt_now_ns();
		if (visit(a, s->warmup, 1, &rate, err, errlen))
			return -1;
		a->unit_s = (double)(mbt_now_ns() - t0) / 1e9 / (s->warmup + 1);
		double u = a->unit_s > 0 ? ceil(s->visit_s / a->unit_s) : MAX_UNITS;
		a->units = u < 1 ? 1 : u > MAX_UNITS ? MAX_UNITS : (unsigned)u;
		pb_progress(0, 1, a->label);
	}

	uint64_t t0 = mbt_now_ns(); /* moved on by the pauses: they do not count against the budget */
	const uint64_t budget_ns = (uint64_t)(s->budget_s * 1e9);
	pb_noise_window win = {.pause_left = s->pause_s};
	pb_noise_mark(nz);
	for (unsigned round = 0;; round++) {
		for (unsigned k = 0; k < n; k++) {
			pb_arm *a = &arms[round % 2 ? n - 1 - k : k];
			if (grow(a)) {
				snprintf(err, errlen, "out of memory");
				return -1;
			}
			if (visit(a, s->warmup, a->units, &rate, err, errlen))
				return -1;
			a->loud[a->n] = 0;
			a->rate[a->n++] = rate;
			uint64_t el = mbt_now_ns() - t0;
			pb_progress(el < budget_ns ? el / 1000000 : budget_ns / 1000000, budget_ns / 1000000,
				    a->label);
		}
		bool done =
		    settled(arms, n, s) || (mbt_now_ns() - t0 >= budget_ns && arms[0].n >= s->min_repeats);
		int loud = pb_noise_step(nz, &win, round + 1, done);
		for (unsigned i = 0; loud >= 0 && i < n; i++)
			for (unsigned r = win.first; r < win.end; r++)
				arms[i].loud[r] = (uint8_t)loud;
		if (done)
			break;
		t0 += (uint64_t)(win.paused_s * 1e9);
	}
	for (unsigned i = 0; i < n; i++)
		pb_interval_of(arms[i].rate, arms[i].n, &arms[i].iv);
	return 0;
}

void pb_arm_fini(pb_arm *a)
{
	free(a->rate);
	free(a->loud);
	a->rate = NULL;
	a->loud = NULL;
	a->n = a->cap = 0;
}

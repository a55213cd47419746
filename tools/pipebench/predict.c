/*
 * pipebench predictions: the bubble a perfect pipeline would have, and the choice of the best size.
 *
 * A batch of M micro-batches through S stages whose micro-batch takes t_i in stage i, with no hand-off cost
 * and unbounded queues, takes T = sum(t_i) + (M - 1) max(t_i): the first micro-batch crosses every stage,
 * then the slowest stage emits one more every max(t_i). The stages work M sum(t_i) of the S T available, so
 * the predicted bubble is 1 - M sum(t_i) / (S T). With equal stages this is GPipe's (S - 1) / (M + S - 1).
 * Where stages share worker threads (more stages than CPUs), a thread is one stage of the schedule whose t is
 * the sum of its stages' t_i, and S counts threads. The t_i are the service times measured in the same run
 * (time inside each stage function per micro-batch), so the difference between measured and predicted is the
 * engine's overhead: hand-offs, wake-ups, and the time a stage spent off its CPU.
 */
#include <math.h>
#include <stdio.h>

#include "pipebench.h"

void pb_predict(pb_result *r)
{
	const unsigned S = r->threads ? r->threads : r->stages;
	const double M = r->mbs;
	double sum = 0, max = 0, min = INFINITY;
	for (unsigned i = 0, g = 0; g < S; g++) {
		double t = 0; /* the thread's stages, one after the other */
		for (; i < r->stages && (r->threads ? r->st[i].thread : i) == g; i++)
			t += r->st[i].service_us;
		sum += t;
		max = t > max ? t : max;
		min = t < min ? t : min;
	}
	r->bubble_gpipe = S + M > 1 ? (S - 1.0) / (M + S - 1.0) : 0;
	r->balanced = S > 0 && max <= 1.10 * min;
	double T = sum + (M - 1) * max;
	r->predicted_ms = T / 1e3;
	r->bubble_predicted = T > 0 ? 1.0 - M * sum / (S * T) : 0;
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

unsigned pb_choose(const pb_result *r, unsigned n, double latency_target_ms, char *why, size_t whylen)
{
	unsigned best = n, fastest = n;
	char a[32], c[32];

	for (unsigned i = 0; i < n; i++)
		if (r[i].status == 0 && (fastest == n || r[i].throughput > r[fastest].throughput))
			fastest = i;
	if (fastest == n) {
		snprintf(why, whylen, "no size completed its measurement");
		return n;
	}
	if (latency_target_ms > 0) {
		for (unsigned i = 0; i < n; i++)
			if (r[i].status == 0 && r[i].p99_ms <= latency_target_ms &&
			    (best == n || r[i].throughput > r[best].throughput))
				best = i;
		if (best == n) {
			unsigned low = fastest;
			for (unsigned i = 0; i < n; i++)
				if (r[i].status == 0 && r[i].p99_ms < r[low].p99_ms)
					low = i;
			snprintf(why, whylen,
				 "no size meets the latency target of %g ms; m=%u has the lowest p99 batch "
				 "latency "
				 "(%.3g ms)",
				 latency_target_ms, r[low].mb_rows, r[low].p99_ms);
			return low;
		}
		fmt_rate(a, sizeof(a), r[best].throughput);
		snprintf(why, whylen,
			 "m=%u has the highest throughput (%s) among the sizes whose p99 batch latency meets "
			 "%g ms "
			 "(its p99: %.3g ms)",
			 r[best].mb_rows, a, latency_target_ms, r[best].p99_ms);
		return best;
	}
	if (n == 1) {
		snprintf(why, whylen, "m=%u is the only size measured", r[0].mb_rows);
		return 0;
	}
	/* the knee: the smallest size within 3% of the best throughput (sizes are ascending) */
	for (unsigned i = 0; i < n && best == n; i++)
		if (r[i].status == 0 && r[i].throughput >= 0.97 * r[fastest].throughput)
			best = i;
	fmt_rate(a, sizeof(a), r[best].throughput);
	fmt_rate(c, sizeof(c), r[fastest].throughput);
	const char *tail =
	    r[best].bubble_predicted < r[best].bubble - 0.05
		? "the rest is what the schedule does not model: hand-offs, wake-ups, time off the CPU"
		: "the measured bubble follows the schedule";
	if (best == fastest)
		snprintf(why, whylen,
			 "m=%u has the best throughput (%s) and every smaller size is more than 3%% slower; "
			 "bubble %.2f measured, %.2f predicted: %s",
			 r[best].mb_rows, a, r[best].bubble, r[best].bubble_predicted, tail);
	else
		snprintf(
		    why, whylen,
		    "m=%u is the smallest size within 3%% of the best throughput (%s, against %s at m=%u), "
		    "so it needs the least memory per micro-batch; bubble %.2f measured, %.2f predicted: %s",
		    r[best].mb_rows, a, c, r[fastest].mb_rows, r[best].bubble, r[best].bubble_predicted,
		    tail);
	return best;
}

/*
 * bench_train: the trainer's schedules on a synthetic workload with calibrated costs of F, B_in and B_w.
 *
 * Every operation is a calibrated busy loop (util/burn.h: dependent multiply-adds, as pipebench's),
 * so its cost is work, not a sleep: time taken from the loop by other processes shows up as a longer
 * operation, which the measured costs (and so the prediction) include. For each stage count, micro-batch
 * count, cost profile and schedule: the median step time over the repeats, the measured bubble
 * (1 - busy / (threads x step)) against the schedule's prediction from the measured mean costs
 * (mbp_schedule_simulate), the stash high-water mark of stage 0, and the efficiency against the ideal of
 * the cores used (the step's work divided by min(threads, CPUs)). Targets (issue 13): |measured -
 * predicted| <= 0.03 at costs of 100 us or more; ZB-H1's bubble at most half of 1F1B's at the same M;
 * S = 2, M = 8, costs of 1 ms: efficiency >= 0.95 x (1 - predicted bubble).
 *
 *   bench_train [-u UNIT_US] [-r REPEATS] [-q]   (-q: only the 1 ms check)
 * Prints a table and one summary line `bench_train: ...`; exits 1 if a step fails.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbpipe.h>

#include "bench_syn.h"
#include "bench_util.h"

struct result {
	double step_ms, work_ms, bubble, pred, eff, ideal_eff;
	unsigned stash0, threads;
};

static int run(unsigned S, unsigned M, mbp_sched_kind kind, double f, double bin, double bw, unsigned reps,
	       struct result *res)
{
	static float dummy[4096];
	mbp_train_opts o = {.in_row_bytes = 4,
			    .target_row_bytes = 4,
			    .max_mb_rows = 1,
			    .max_mbs = M,
			    .schedule = kind,
			    .pinning = MBP_PIN_PLAN,
			    .loss = syn_loss};
	mbp_trainer *t;
	int rc = mbp_trainer_new(&t, &o);
	if (rc < 0)
		return rc;
	struct syn syn[MBP_MAX_STAGES];
	for (unsigned s = 0; s < S; s++) {
		syn[s] = (struct syn){f, bin, bw, s};
		mbp_train_stage_desc d = syn_desc(&syn[s]);
		if ((rc = mbp_trainer_add_stage(t, &d)) < 0)
			goto out;
	}
	if ((rc = mbp_trainer_start(t)) < 0)
		goto out;
	double step[64], bub[64], pred[64], busy[64];
	unsigned n = 0;
	for (unsigned r = 0; r < reps + 1 && n < 64; r++) {
		if ((rc = mbp_trainer_step(t, dummy, dummy, M, 1, NULL)) < 0)
			goto out;
		if (r == 0)
			continue; /* warm-up: the pool grows, the schedule is built */
		mbp_train_stats st;
		mbp_train_stage_stats ss[MBP_MAX_STAGES];
		mbp_trainer_stats_get(t, &st, ss, S);
		double b = 0;
		for (unsigned s = 0; s < S; s++)
			b += (double)(ss[s].f_ns + ss[s].b_ns + ss[s].bin_ns + ss[s].w_ns);
		step[n] = (double)st.step_ns / 1e6;
		bub[n] = st.bubble;
		pred[n] = st.bubble_predicted;
		busy[n] = b / 1e6;
		res->stash0 = ss[0].stash_peak;
		res->threads = st.threads;
		n++;
	}
	res->step_ms = bench_median(step, n);
	res->bubble = bench_median(bub, n);
	res->pred = bench_median(pred, n);
	res->work_ms = bench_median(busy, n);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	double cores = res->threads < (unsigned)ncpu ? res->threads : (double)ncpu;
	res->eff = res->work_ms / cores / res->step_ms;
	res->ideal_eff = 1.0 - res->pred;
out:
	mbp_trainer_destroy(t);
	return rc;
}

int main(int argc, char **argv)
{
	double unit = 200;
	unsigned reps = 7;
	bool quick = false;
	for (int c; (c = getopt(argc, argv, "u:r:q")) != -1;) {
		if (c == 'u')
			unit = bench_opt_double("-u", optarg, 1e-3, 1e6);
		else if (c == 'r')
			reps = (unsigned)bench_opt_u64("-r", optarg, 1, 63);
		else if (c == 'q')
			quick = true;
		else {
			fprintf(stderr, "usage: bench_train [-u UNIT_US] [-r REPEATS] [-q]\n");
			return 2;
		}
	}
	if (!(unit > 0) || reps < 1 || reps > 63) {
		fprintf(stderr, "bench_train: -u must be > 0 and -r in 1..63\n");
		return 2;
	}
	calibrate();
	char host[128] = "?";
	FILE *ci = fopen("/proc/cpuinfo", "r");
	for (char line[256]; ci && fgets(line, sizeof(line), ci);)
		if (strncmp(line, "model name", 10) == 0) {
			snprintf(host, sizeof(host), "%s", strchr(line, ':') + 2);
			host[strcspn(host, "\n")] = 0;
			break;
		}
	if (ci)
		fclose(ci);
	printf("# bench_train: %ld CPUs (%s), %.0f iterations/us, unit %.0f us, %u repeats (median)\n",
	       sysconf(_SC_NPROCESSORS_ONLN), host, iters_per_us, unit, reps);
	printf("%-2s %-3s %-6s %-6s %2s %9s %9s %7s %7s %6s %6s %6s %7s\n", "S", "M", "costs", "sched", "T",
	       "step_ms", "work_ms", "bubble", "pred", "|diff|", "stash0", "eff", "eff/id");
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	static const double prof[2][3] = {{1, 1, 1}, {1, 2, 0}};
	double worst_diff = 0;
	unsigned zb_ok = 0, zb_n = 0;
	int rc = 0;
	for (unsigned S = 2; S <= 4 && !quick; S *= 2)
		for (int p = 0; p < 2; p++)
			for (unsigned M = S; M <= 8 * S; M *= 2) {
				double b1f1b = -1;
				for (size_t k = 0; k < 3; k++) {
					struct result r;
					rc = run(S, M, kinds[k], prof[p][0] * unit, prof[p][1] * unit,
						 prof[p][2] * unit, reps, &r);
					if (rc < 0)
						goto fail;
					double diff = fabs(r.bubble - r.pred);
					worst_diff = diff > worst_diff ? diff : worst_diff;
					if (kinds[k] == MBP_SCHED_1F1B)
						b1f1b = r.bubble;
					if (kinds[k] == MBP_SCHED_ZBH1 && p == 0) {
						zb_n++;
						zb_ok += r.bubble <= b1f1b / 2;
					}
					printf("%-2u %-3u %-6s %-6s %2u %9.2f %9.2f %7.3f %7.3f %6.3f %6u "
					       "%6.3f %7.3f\n",
					       S, M, p ? "1:2:0" : "1:1:1", mbp_sched_name(kinds[k]),
					       r.threads, r.step_ms, r.work_ms, r.bubble, r.pred, diff,
					       r.stash0, r.eff, r.eff / r.ideal_eff);
				}
			}
	/* the throughput target: S = 2, M = 8, costs of 1 ms */
	double eff_ratio[3];
	for (size_t k = 0; k < 3; k++) {
		struct result r;
		rc = run(2, 8, kinds[k], 1000, 1000, 1000, reps, &r);
		if (rc < 0)
			goto fail;
		eff_ratio[k] = r.eff / r.ideal_eff;
		printf("%-2u %-3u %-6s %-6s %2u %9.2f %9.2f %7.3f %7.3f %6.3f %6u %6.3f %7.3f\n", 2u, 8u,
		       "1ms", mbp_sched_name(kinds[k]), r.threads, r.step_ms, r.work_ms, r.bubble, r.pred,
		       fabs(r.bubble - r.pred), r.stash0, r.eff, r.eff / r.ideal_eff);
	}
	printf("bench_train: unit_us=%.0f worst_bubble_diff=%.3f zbh1_half_of_1f1b=%u/%u "
	       "s2m8_1ms_eff_over_ideal gpipe=%.3f 1f1b=%.3f zbh1=%.3f\n",
	       unit, worst_diff, zb_ok, zb_n, eff_ratio[0], eff_ratio[1], eff_ratio[2]);
	return 0;
fail:
	fprintf(stderr, "bench_train: a step failed: %s\n", mbp_strerror(rc));
	return 1;
}

/*
 * bench_train_overhead: what a training step costs beyond its operations. Every operation costs
 * nothing (bench_syn.h's stages at 0 us) and no update does anything, so a step's wall time (mbp_trainer_step, as the controlling thread sees it) is the
 * trainer's own: handing the step to the threads (go), the rings between stages, the ordered merge of a
 * replicated stage, the two barriers and the controller's wake. Shapes: 2 stages (2 threads), 1 stage on 2
 * replicas (2), 2 stages with the second on 2 (3 threads: on 2 CPUs more threads than CPUs). 8
 * micro-batches a step, 1F1B; the median and the 90th percentile over the steps, after a warm-up.
 * (issue 25: the 0.6-1.5 ms between a replicated trainer's steps.)
 *
 *   bench_train_overhead [-n STEPS]     (default 2000)
 * Prints one line per shape: `bench_train_overhead: shape=S2 threads=2 median_us=... p90_us=...
 * others=...`; exits 1 when a step fails.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <mbpipe.h>

#include "bench_syn.h"
#include "bench_util.h"

/* Steps of a trainer of S stages, the last on `reps` replicas: per step wall times into us[0 .. n). */
static int run(unsigned S, unsigned reps, unsigned n, double *us, unsigned *threads)
{
	mbp_train_opts o = {.in_row_bytes = 4,
			    .target_row_bytes = 4,
			    .max_mb_rows = 1,
			    .max_mbs = 8,
			    .schedule = MBP_SCHED_1F1B,
			    .loss = syn_loss};
	mbp_trainer *t;
	int rc = mbp_trainer_new(&t, &o);
	static struct syn none[MBP_MAX_STAGES]; /* 0 us each */
	for (unsigned s = 0; rc == 0 && s < S; s++) {
		mbp_train_stage_desc d = syn_desc(&none[s]);
		d.replicas = s + 1 == S ? reps : 1;
		rc = mbp_trainer_add_stage(t, &d);
	}
	rc = rc ? rc : mbp_trainer_start(t);
	static float in[8], tg[8];
	for (unsigned i = 0; rc == 0 && i < 100; i++) /* the warm-up: the pools reserved, the caches full */
		rc = mbp_trainer_step(t, in, tg, 8, 1, NULL);
	for (unsigned i = 0; rc == 0 && i < n; i++) {
		uint64_t t0 = mbt_now_ns();
		rc = mbp_trainer_step(t, in, tg, 8, 1, NULL);
		us[i] = (double)(mbt_now_ns() - t0) * 1e-3;
	}
	mbp_train_stats ts = {0};
	if (rc == 0)
		mbp_trainer_stats_get(t, &ts, NULL, 0);
	*threads = ts.threads;
	mbp_trainer_destroy(t);
	return rc;
}

int main(int argc, char **argv)
{
	unsigned n = 2000;
	for (int c; (c = getopt(argc, argv, "n:")) != -1;) {
		if (c == 'n' && atoi(optarg) > 0) {
			n = (unsigned)atoi(optarg);
		} else {
			fprintf(stderr, "usage: bench_train_overhead [-n STEPS]\n");
			return 2;
		}
	}
	calibrate(); /* (the stages' 0 us need none; bench_syn.h's rule) */
	double *us = malloc(n * sizeof(*us));
	if (!us)
		return 1;
	static const struct {
		const char *name;
		unsigned S, reps;
	} shapes[] = {{"S2", 2, 1}, {"S1x2", 1, 2}, {"S2_1,2", 2, 2}};
	printf(
	    "# bench_train_overhead: %ld CPUs, %u steps a shape, 8 micro-batches, 1F1B, empty operations\n",
	    sysconf(_SC_NPROCESSORS_ONLN), n);
	int status = 0;
	for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
		unsigned threads = 0;
		bench_others oth = bench_others_start();
		int rc = run(shapes[k].S, shapes[k].reps, n, us, &threads);
		double others = bench_others_cpus(oth);
		if (rc < 0) {
			fprintf(stderr, "bench_train_overhead: %s: %s\n", shapes[k].name, mbp_strerror(rc));
			status = 1;
			continue;
		}
		qsort(us, n, sizeof(*us), bench_cmp_double);
		printf("bench_train_overhead: shape=%s threads=%u median_us=%.1f p90_us=%.1f others=%.2f\n",
		       shapes[k].name, threads, us[n / 2], us[(size_t)n * 9 / 10], others);
	}
	free(us);
	return status;
}

/*
 * bench_mpi_train: training across 2 MPI ranks (one stage each, mbp_mpi_trainer) against one process of 2
 * stages (mbp_trainer, 2 threads), on the synthetic workload of bench_train (calibrated busy loops for F,
 * B_in and B_w, equal costs), S = 2, M micro-batches, each schedule; the chunked ones (interleaved, looped
 * BFS, ZB-V, DualPipeV) with two chunks a rank (S = 4, a chunk of UNIT each, one thread a rank, the chunks
 * its placement gives it) against one process of the same 4 chunks on 2 threads. Rank 0 alternates the two
 * arms step
 * by step (while it runs the single process, rank 1 waits for the next step, parked); the figure is the
 * median step time of each arm and their ratio (single / ranks: the ranks' share of the single process's
 * throughput), with the step time the schedule predicts without a link (mbp_schedule_simulate).
 *
 *   mpirun --oversubscribe --bind-to none -np 2 bench_mpi_train [-u UNIT_US] [-m M] [-r ROUNDS] [-i IDLE_US]
 * (-i: the communication thread's park between polls, mbp_mpi_opts.idle_ns; default 200 us)
 * Rank 0 prints a table and a summary line `bench_mpi_train: ...`.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

#include "bench_syn.h"
#include "bench_util.h"

static void die(const char *what, int rc)
{
	fprintf(stderr, "bench_mpi_train: %s: %s\n", what, mbp_strerror(rc));
	mbp_mpi_abort(1);
}

int main(int argc, char **argv)
{
	if (mbp_mpi_init(&argc, &argv) != 0)
		return 1;
	double unit = 1000;
	unsigned M = 8, rounds = 7;
	mbp_mpi_opts mo;
	mbp_mpi_opts_init(&mo);
	for (int c; (c = getopt(argc, argv, "u:m:r:i:")) != -1;) {
		if (c == 'i')
			mo.idle_ns = (uint64_t)(bench_opt_double("-i", optarg, 0, 1e6) * 1000);
		else if (c == 'u')
			unit = bench_opt_double("-u", optarg, 1e-3, 1e6);
		else if (c == 'm')
			M = (unsigned)bench_opt_u64("-m", optarg, 1, 1024);
		else if (c == 'r')
			rounds = (unsigned)bench_opt_u64("-r", optarg, 1, 63);
		else
			die("usage: bench_mpi_train [-u UNIT_US] [-m M] [-r ROUNDS] [-i IDLE_US]", -EINVAL);
	}
	int rank = mbp_mpi_rank(), size = mbp_mpi_size();
	if (size != 2 || !(unit > 0) || M < 1 || M > 1024 || rounds < 1 || rounds > 63)
		die("run with -np 2; -u > 0, -m in 1..1024, -r in 1..63", -EINVAL);
	calibrate();
	static float dummy[1024];
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B,	       MBP_SCHED_ZBH1,
					       MBP_SCHED_ZBH2,	MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS,
					       MBP_SCHED_ZBV,	MBP_SCHED_DUALPIPEV};
	enum { NK = sizeof(kinds) / sizeof(kinds[0]) };
	if (rank == 0) {
		printf("# bench_mpi_train: 2 ranks x 1 stage (chunked: 2 chunks) vs 1 process x 2 threads, "
		       "%ld CPUs, unit %.0f us "
		       "(F = B_in = B_w), M = %u, %u rounds (median), link idle_ns %.0f us\n",
		       sysconf(_SC_NPROCESSORS_ONLN), unit, M, rounds, (double)mo.idle_ns / 1000);
		printf("%-11s %10s %10s %10s %8s\n", "sched", "pred_ms", "single_ms", "ranks_ms", "ratio");
	}
	double ratio[NK];
	for (size_t k = 0; k < NK; k++) {
		mbp_train_opts o = {.in_row_bytes = 4,
				    .target_row_bytes = 4,
				    .max_mb_rows = 1,
				    .max_mbs = M,
				    .schedule = kinds[k],
				    .loss = syn_loss};
		/* a chunked schedule: 4 chunks, each rank the two its placement gives its thread */
		mbp_schedule *pl = NULL;
		unsigned S =
		    mbp_schedule_new_placed(&pl, kinds[k], 4, 4, 2) == 0 && mbp_schedule_threads(pl) ? 4 : 2;
		mbp_schedule *fit = NULL; /* a schedule that cannot run M micro-batches (DualPipeV: M >= S) */
		if (mbp_schedule_new_placed(&fit, kinds[k], S, M, S == 4 ? 2 : 0) != 0) {
			if (rank == 0)
				printf("%-11s skipped: M = %u is too few for it on %u chunks\n",
				       mbp_sched_name(kinds[k]), M, S);
			ratio[k] = 0;
			mbp_schedule_destroy(pl);
			continue;
		}
		mbp_schedule_destroy(fit);
		struct syn syn[4] = {{unit, unit, unit, 1},
				     {unit, unit, unit, 2},
				     {unit, unit, unit, 5},
				     {unit, unit, unit, 6}};
		mbp_mpi_trainer *mt;
		int rc = mbp_mpi_trainer_new(&mt, &o, &mo);
		for (unsigned g = 0; g < S && rc == 0; g++) {
			if (S == 4 ? mbp_schedule_thread_of(pl, g, 0) != (unsigned)rank : g != (unsigned)rank)
				continue;
			mbp_train_stage_desc d = syn_desc(&syn[g]);
			rc = mbp_mpi_trainer_add_stage(mt, &d);
		}
		mbp_schedule_destroy(pl);
		if (rc == 0)
			rc = mbp_mpi_trainer_start(mt);
		if (rc)
			die("the trainer across ranks", rc);
		if (rank != 0) {
			for (unsigned r = 0; r <= rounds; r++)
				if ((rc = mbp_mpi_trainer_step(mt, NULL, NULL, 0, 0, NULL)) != 0)
					die("a step", rc);
			mbp_mpi_trainer_destroy(mt);
			continue;
		}
		mbp_trainer *t;
		struct syn one[4] = {{unit, unit, unit, 3},
				     {unit, unit, unit, 4},
				     {unit, unit, unit, 7},
				     {unit, unit, unit, 8}};
		o.threads = 2;
		rc = mbp_trainer_new(&t, &o);
		for (unsigned s = 0; s < S && rc == 0; s++) {
			mbp_train_stage_desc ds = syn_desc(&one[s]);
			rc = mbp_trainer_add_stage(t, &ds);
		}
		if (rc == 0)
			rc = mbp_trainer_start(t);
		if (rc)
			die("the single-process trainer", rc);
		double single[64], ranks[64];
		for (unsigned r = 0; r <= rounds; r++) {
			uint64_t t0 = mbt_now_ns();
			if ((rc = mbp_trainer_step(t, dummy, dummy, M, 1, NULL)) != 0)
				die("a single-process step", rc);
			uint64_t t1 = mbt_now_ns();
			if ((rc = mbp_mpi_trainer_step(mt, dummy, dummy, M, 1, NULL)) != 0)
				die("a step across ranks", rc);
			uint64_t t2 = mbt_now_ns();
			if (r > 0) { /* the first: warm-up */
				single[r - 1] = (double)(t1 - t0) / 1e6;
				ranks[r - 1] = (double)(t2 - t1) / 1e6;
			}
		}
		mbp_op_costs costs[4] = {
		    {unit, unit, unit}, {unit, unit, unit}, {unit, unit, unit}, {unit, unit, unit}};
		mbp_sched_sim sim = {0};
		mbp_schedule_simulate(mbp_trainer_schedule(t), costs, 2, &sim, NULL);
		double s_ms = bench_median(single, rounds), r_ms = bench_median(ranks, rounds);
		ratio[k] = s_ms / r_ms;
		printf("%-11s %10.2f %10.2f %10.2f %8.3f\n", mbp_sched_name(kinds[k]), sim.makespan / 1000.0,
		       s_ms, r_ms, ratio[k]);
		mbp_trainer_destroy(t);
		mbp_mpi_trainer_destroy(mt);
	}
	if (rank == 0) {
		printf("bench_mpi_train: unit_us=%.0f M=%u ranks_over_single", unit, M);
		for (size_t k = 0; k < NK; k++)
			if (ratio[k] > 0) /* 0: skipped */
				printf(" %s=%.3f", mbp_sched_name(kinds[k]), ratio[k]);
		printf("\n");
	}
	mbp_mpi_finalize();
	return 0;
}

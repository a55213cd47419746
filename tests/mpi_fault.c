/*
 * A rank that dies or stops answering ends the run with a clear error within the timeout, never a hang.
 * Run by tests/mpi.sh under mpirun: `mpi_fault stop|kill TIMEOUT_MS`. Rank 0 submits jobs through R ranks;
 * after a few micro-batches the last rank raises SIGSTOP (stop) or SIGKILL (kill) on itself.
 *   stop: rank 0's drain returns -ETIMEDOUT with a message naming the rank; every accepted micro-batch
 *         ended completed or failed; rank 0 prints "mpi_fault: ok ..." and mbp_mpi_finalize() aborts the
 *         job (the stopped rank included).
 *   kill: mpirun sees the dead rank and ends the job with its own message.
 *   train-stop: the same for training across ranks (mbp_mpi_trainer, one stage per rank): the last rank
 *         stops in a forward of its third step; rank 0's step returns -ETIMEDOUT naming the rank, it
 *         prints "mpi_fault: ok step=ETIMEDOUT ..." and mbp_mpi_finalize() aborts the job.
 * The script checks the messages, the exit status and the time taken.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

static const char *mode;
static _Atomic unsigned long calls;

static int stage(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	(void)ctx;
	if (atomic_fetch_add(&calls, 1) == 20)
		raise(strcmp(mode, "stop") == 0 ? SIGSTOP : SIGKILL);
	memcpy(out->data, in->data, (size_t)in->rows * in->row_bytes);
	usleep(500);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Training: a stage that copies its input forward and its gradient back (no parameters). */
static int t_copy_fwd(void *ctx, const mbp_train_io *io)
{
	(void)ctx;
	if (atomic_fetch_add(&calls, 1) == 10)
		raise(SIGSTOP);
	memcpy(io->out, io->in, (size_t)io->rows * 64);
	return 0;
}

static int t_copy_bwd(void *ctx, const mbp_train_io *io)
{
	(void)ctx;
	if (io->din)
		memcpy(io->din, io->dout, (size_t)io->rows * 64);
	return 0;
}

static double t_grad_sq(void *ctx)
{
	(void)ctx;
	return 0;
}

static int t_update(void *ctx, const mbp_train_update *u)
{
	(void)ctx;
	(void)u;
	return 0;
}

static void t_discard(void *ctx)
{
	(void)ctx;
}

static int t_loss(void *arg, const mbp_train_io *io, double *loss)
{
	(void)arg;
	memset(io->dout, 0, (size_t)io->rows * 64);
	*loss = 0;
	return 0;
}

static int train_fault(int rank, int size, int64_t timeout_ns)
{
	mbp_train_opts o = {.in_row_bytes = 64, .target_row_bytes = 8, .max_mb_rows = 4, .loss = t_loss};
	mbp_mpi_opts mo;
	mbp_mpi_opts_init(&mo);
	mo.peer_timeout_ns = timeout_ns;
	mbp_train_stage_desc d = {.out_row_bytes = 64,
				  .forward = t_copy_fwd,
				  .backward = t_copy_bwd,
				  .grad_sq = t_grad_sq,
				  .update = t_update,
				  .discard = t_discard};
	mbp_mpi_trainer *t;
	if (mbp_mpi_trainer_new(&t, &o, &mo) || mbp_mpi_trainer_add_stage(t, &d) ||
	    mbp_mpi_trainer_start(t)) {
		fprintf(stderr, "mpi_fault: rank %d: set-up failed\n", rank);
		mbp_mpi_abort(3);
	}
	if (rank != size - 1)
		atomic_store(&calls, 1000); /* only the last rank stops */
	if (rank != 0) {
		int rc = mbp_mpi_trainer_serve(t);
		fprintf(stderr, "mpi_fault: rank %d: serve: %s %s\n", rank, mbp_strerror(rc),
			mbp_mpi_trainer_run_error(t));
		mbp_mpi_trainer_destroy(t);
		mbp_mpi_finalize();
		return rc ? 1 : 0;
	}
	static char in[16 * 64], tg[16 * 8];
	double t0 = now_s();
	int rc = 0, steps = 0;
	for (; steps < 10 && rc == 0; steps++)
		rc = mbp_mpi_trainer_step(t, in, tg, 16, 4, NULL);
	double secs = now_s() - t0;
	bool ok = rc == -ETIMEDOUT && steps == 3 && strstr(mbp_mpi_trainer_run_error(t), "stopped answering");
	printf("mpi_fault: %s step=%s at step %d after %.1f s: %s\n", ok ? "ok" : "FAILED", mbp_err_name(rc),
	       steps, secs, mbp_mpi_trainer_run_error(t));
	fflush(stdout);
	mbp_mpi_trainer_destroy(t);
	mbp_mpi_finalize(); /* aborts: a rank went silent */
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (mbp_mpi_init(&argc, &argv) != 0 || argc != 3) {
		fprintf(stderr, "usage: mpirun -np R mpi_fault stop|kill|train-stop TIMEOUT_MS\n");
		return 2;
	}
	mode = argv[1];
	int64_t timeout_ns = strtoll(argv[2], NULL, 10) * 1000000;
	int rank = mbp_mpi_rank(), size = mbp_mpi_size();
	if (strcmp(mode, "train-stop") == 0)
		return train_fault(rank, size, timeout_ns);
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = 64;
	o.max_mb_rows = 4;
	o.pinning = MBP_PIN_NONE;
	mbp_mpi_opts mo;
	mbp_mpi_opts_init(&mo);
	mo.peer_timeout_ns = timeout_ns;
	mbp_mpi *mp;
	mbp_stage_desc d = {.fn = stage};
	if (mbp_mpi_new(&mp, &o, &mo) || mbp_mpi_add_stage(mp, &d) || mbp_mpi_start(mp)) {
		fprintf(stderr, "mpi_fault: rank %d: set-up failed\n", rank);
		mbp_mpi_abort(3);
	}
	if (rank != size - 1)
		atomic_store(&calls, 1000); /* only the last rank stops or dies */
	if (rank != 0) {
		int rc = mbp_mpi_wait(mp, -1);
		fprintf(stderr, "mpi_fault: rank %d: wait: %s %s\n", rank, mbp_strerror(rc),
			mbp_mpi_error(mp));
		mbp_mpi_destroy(mp);
		mbp_mpi_finalize();
		return rc ? 1 : 0;
	}
	enum { JOBS = 50, ROWS = 16 };
	static char in[JOBS][ROWS * 64], out[JOBS][ROWS * 64];
	static mbp_job jobs[JOBS];
	double t0 = now_s();
	unsigned accepted = 0;
	for (unsigned j = 0; j < JOBS; j++) {
		mbp_job_init(&jobs[j], in[j], out[j], ROWS, 4);
		if (mbp_mpi_job_submit(mp, &jobs[j], -1) == 0)
			accepted++;
	}
	int rc = mbp_mpi_drain(mp, -1);
	double t = now_s() - t0;
	mbp_mpi_stats s;
	mbp_mpi_stats_get(mp, &s);
	unsigned done = 0;
	for (unsigned j = 0; j < accepted; j++)
		done += mbp_mpi_job_wait(mp, &jobs[j], 0) == 0;
	bool ok = rc == -ETIMEDOUT && done == accepted && s.mbs_accepted == s.mbs_completed + s.mbs_failed &&
		  s.mbs_failed > 0 && strstr(mbp_mpi_error(mp), "stopped answering") != NULL;
	printf(
	    "mpi_fault: %s drain=%s after %.1f s: %s; jobs %u/%u done; mbs accepted %llu = completed %llu + "
	    "failed %llu\n",
	    ok ? "ok" : "FAILED", mbp_err_name(rc), t, mbp_mpi_error(mp), done, accepted,
	    (unsigned long long)s.mbs_accepted, (unsigned long long)s.mbs_completed,
	    (unsigned long long)s.mbs_failed);
	fflush(stdout);
	mbp_mpi_destroy(mp);
	mbp_mpi_finalize(); /* aborts: a rank went silent */
	return ok ? 0 : 1;
}

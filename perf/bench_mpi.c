/*
 * bench_mpi: the pipeline across MPI ranks against raw MPI and against one process. Run with 2 ranks:
 *
 *     mpirun --oversubscribe -np 2 perf/bench_mpi [-r ROUNDS] [-s BYTES] [link|link1|latency|bubble|mlp]
 *
 * Four measurements, each alternating the peers round by round (A B A B), medians of the rounds:
 *   link:    bytes per second through the remote link from rank 0 to rank 1, micro-batches of 4 KiB to
 *            4 MiB, against an osu_bw-style loop written here (a window of MPI_Isend / MPI_Irecv of the same
 *            size, then a 4-byte acknowledgement) with the same window, on one buffer (osu_bw: always
 *            cache-hot), on one buffer per message of the window (16, as many as the link keeps posted)
 *            and cycling through 64 distinct buffers (as many as the link's pool). The
 *            pipeline's stages touch nothing (two per rank, so that no stage copies), and the last rank
 *            returns 8 bytes per 4 KiB row to rank 0, so the figure is the forward link's. Also the CPU
 *            time of both ranks per micro-batch (getrusage; the link's includes its set-up and warm-up).
 *   latency: the round trip of one 64-byte micro-batch through 2 ranks of one no-op stage each, against
 *            one process of 2 no-op stages (the in-process ring) and a raw MPI ping-pong; the caller waits
 *            for each result on a semaphore (as a thread blocked in mbp_job_wait would). Once with the
 *            default spin_ns (20 us) and once with 5 ms (the communication threads poll longer). Then
 *            the CPU share of a rank whose run is up and idle for 1 s (the busier rank's).
 *   bubble:  4 stages over 2 ranks (2 each) of calibrated costs (300, 600, 400, 500 us; they sleep, so
 *            the 2 CPUs do not slow them), batches of 8 micro-batches of 64 KiB one at a time: the
 *            measured bubble (1 - sum of the stages' busy time / (stages x sum of batch latencies), as
 *            pipebench's) against pipebench's model with the stages' measured service times and the two
 *            hops as stages of cost "hop" = half the round trip of one micro-batch through the same ranks
 *            with stages of no cost (measured in the same round), and without the link.
 *   mlp:     rows per second of an MLP (8 layers of 1024, GELU) split over 2 ranks of one stage each
 *            (each loading only its 4 layers), against one process of 2 stages, jobs of 256 rows in
 *            micro-batches of 64, a stream of 16 jobs in flight.
 * -s BYTES runs link and link1 at that size only: one of link's sizes (link1 alone: one of link1's);
 * another is refused with the usage message, which names them (exit 2).
 * Output: one grep-able line per measurement ("mpi_link size=... ratio=..."). Exits non-zero when an
 * invariant breaks (results lost or wrong).
 */
#include "config.h"

#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <mpi.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

#include "bench_util.h"

#define ROW	     4096
#define WINDOW	     16
#define LINK_BUFFERS 64 /* the link runs' pool buffers per rank; the raw loop's rotating variant */
#define MAX_ROUNDS   16

static int rank, size, rounds = 5;
static size_t only_size;      /* -s: link and link1 at this size only (one of theirs); 0: every size */
static uint64_t link_spin_ns; /* mbp_mpi_opts.spin_ns of the runs made next; 0: the default */

static void die(const char *what, int rc)
{
	fprintf(stderr, "bench_mpi: rank %d: %s: %s\n", rank, what, mbp_strerror(rc));
	mbp_mpi_abort(1);
}

/* ---- raw MPI, on the communication thread (mbp_mpi_exec) ---- */

struct raw {
	size_t bytes;
	unsigned iters, window;
	unsigned nbufs; /* the loop cycles through this many distinct buffers (1: osu_bw's one buffer) */
	void *buf;
	double seconds;
};

/* A barrier that sleeps while it waits: MPI_Barrier would spin a core that the other rank's measurement
 * needs (2 CPUs). */
static int barrier_task(void *arg)
{
	(void)arg;
	MPI_Request rq;
	int flag = 0;
	MPI_Ibarrier(MPI_COMM_WORLD, &rq);
	while (!MPI_Test(&rq, &flag, MPI_STATUS_IGNORE) && !flag)
		usleep(200);
	return 0;
}

static void barrier(void)
{
	int rc = mbp_mpi_exec(barrier_task, NULL);
	if (rc)
		die("barrier", rc);
}

/* osu_bw: rank 0 posts a window of sends, rank 1 a window of receives, then a 4-byte ack back. */
static int raw_bw_task(void *arg)
{
	struct raw *r = arg;
	MPI_Request req[64];
	int ack = 0;
	MPI_Barrier(MPI_COMM_WORLD);
	uint64_t t0 = mbt_now_ns();
	for (unsigned i = 0; i < r->iters; i++) {
		for (unsigned w = 0; w < r->window; w++) {
			char *b = (char *)r->buf + (size_t)((i * r->window + w) % r->nbufs) * r->bytes;
			if (rank == 0)
				MPI_Isend(b, (int)r->bytes, MPI_BYTE, 1, 100, MPI_COMM_WORLD, &req[w]);
			else
				MPI_Irecv(b, (int)r->bytes, MPI_BYTE, 0, 100, MPI_COMM_WORLD, &req[w]);
		}
		MPI_Waitall((int)r->window, req, MPI_STATUSES_IGNORE);
		if (rank == 0)
			MPI_Recv(&ack, 1, MPI_INT, 1, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		else
			MPI_Send(&ack, 1, MPI_INT, 0, 101, MPI_COMM_WORLD);
	}
	r->seconds = (double)(mbt_now_ns() - t0) / 1e9;
	return 0;
}

static int raw_pingpong_task(void *arg)
{
	struct raw *r = arg;
	MPI_Barrier(MPI_COMM_WORLD);
	uint64_t t0 = mbt_now_ns();
	for (unsigned i = 0; i < r->iters; i++) {
		if (rank == 0) {
			MPI_Send(r->buf, (int)r->bytes, MPI_BYTE, 1, 102, MPI_COMM_WORLD);
			MPI_Recv(r->buf, (int)r->bytes, MPI_BYTE, 1, 102, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(r->buf, (int)r->bytes, MPI_BYTE, 0, 102, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(r->buf, (int)r->bytes, MPI_BYTE, 0, 102, MPI_COMM_WORLD);
		}
	}
	r->seconds = (double)(mbt_now_ns() - t0) / 1e9;
	return 0;
}

static double raw_run(int (*task)(void *), size_t bytes, unsigned iters, unsigned window, unsigned nbufs)
{
	struct raw r = {.bytes = bytes, .iters = iters, .window = window, .nbufs = nbufs};
	r.buf = aligned_alloc(4096, bytes * nbufs);
	if (!r.buf)
		die("raw buffers", -ENOMEM);
	memset(r.buf, 1, bytes * nbufs); /* touched once, as the pipeline's warm-up touches its buffers */
	int rc = mbp_mpi_exec(task, &r);
	free(r.buf);
	if (rc)
		die("raw MPI", rc);
	return r.seconds;
}

/* ---- the pipeline across ranks ---- */

static int noop(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	(void)ctx;
	(void)in;
	(void)out;
	return 0;
}

/* The last rank's last stage: 8 bytes per row back to rank 0. */
static int shrink(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	(void)ctx;
	for (uint32_t r = 0; r < in->rows; r++)
		memcpy((char *)out->data + (size_t)r * 8, (const char *)in->data + (size_t)r * in->row_bytes,
		       8);
	return 0;
}

struct counter {
	_Atomic uint64_t done, failed;
	mbp_mpi *mp;
	sem_t *sem; /* posted per result when set (ping-pong) */
};

static void count_result(void *arg, mbp_mb *mb)
{
	struct counter *c = arg;
	if (mb->status)
		atomic_fetch_add(&c->failed, 1);
	atomic_fetch_add(&c->done, 1);
	mbp_mpi_mb_release(c->mp, mb);
	if (c->sem)
		sem_post(c->sem);
}

/* A stage of calibrated cost: it sleeps until *ctx ns after it began (it costs no CPU, so 2 ranks of
 * several such stages share 2 CPUs without slowing each other: the bubble is the schedule's and the link's). */
static int sleep_stage(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	(void)in;
	(void)out;
	static __thread bool slack_set;
	if (!slack_set) { /* parks of the default 50 us slack would distort costs of a few hundred us */
		prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
		slack_set = true;
	}
	struct timespec ts = mbt_timespec(mbt_now_ns() + *(const uint64_t *)ctx);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
	return 0;
}

/* Build this rank's part: `stages` stages of rows of `row` bytes, the last rank's last one shrinking
 * the rows to 8 bytes when `shrink_last`; with `cost` (the stages of every rank in order), sleep_stage
 * stages of those costs instead of no-ops. */
static mbp_mpi *link_make(size_t row, uint32_t max_rows, unsigned stages, bool shrink_last, uint32_t window,
			  const uint64_t *cost, struct counter *c)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = row;
	o.max_mb_rows = max_rows;
	o.mb_buffers = LINK_BUFFERS;
	o.pinning = MBP_PIN_NONE;
	o.pool_bytes = (size_t)4 << 30;
	if (rank == 0) {
		o.on_result = count_result;
		o.on_result_arg = c;
	}
	mbp_mpi_opts mo;
	mbp_mpi_opts_init(&mo);
	mo.window = window;
	mo.spin_ns = link_spin_ns;
	mbp_mpi *mp;
	int rc = mbp_mpi_new(&mp, &o, &mo);
	if (rc)
		die("mbp_mpi_new", rc);
	c->mp = mp;
	for (unsigned i = 0; i < stages; i++) {
		bool last = shrink_last && rank == size - 1 && i == stages - 1;
		mbp_stage_desc d = {.fn = last ? shrink : noop, .out_row_bytes = last ? 8 : 0};
		if (cost) {
			d.fn = sleep_stage;
			d.ctx = (void *)(uintptr_t)&cost[(unsigned)rank * stages + i];
		}
		if ((rc = mbp_mpi_add_stage(mp, &d)))
			die("add_stage", rc);
	}
	if ((rc = mbp_mpi_start(mp)))
		die("mbp_mpi_start", rc);
	return mp;
}

static void link_end(mbp_mpi *mp)
{
	int rc = rank == 0 ? mbp_mpi_drain(mp, -1) : mbp_mpi_wait(mp, -1);
	if (rc)
		die("end of run", rc);
	mbp_mpi_destroy(mp);
}

/* Rank 0: submit n micro-batches of `rows` rows, keeping the pool busy; @return seconds until the last
 * result is back. */
static double link_stream(mbp_mpi *mp, struct counter *c, uint32_t rows, unsigned n)
{
	uint64_t t0 = mbt_now_ns();
	for (unsigned k = 0; k < n; k++) {
		mbp_mb *mb;
		int rc = mbp_mpi_mb_acquire(mp, &mb, -1);
		if (rc)
			die("acquire", rc);
		mb->rows = rows;
		mb->seq = k;
		if ((rc = mbp_mpi_mb_submit(mp, mb, -1)))
			die("submit", rc);
	}
	while (atomic_load(&c->done) < n)
		usleep(50);
	double s = (double)(mbt_now_ns() - t0) / 1e9;
	if (atomic_load(&c->failed))
		die("a micro-batch failed", -EIO);
	return s;
}

/* CPU seconds this process (all its threads) has used. */
static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
	       ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

struct reduce {
	double in, out;
	MPI_Op op;
};

static int reduce_task(void *arg)
{
	struct reduce *r = arg;
	MPI_Allreduce(&r->in, &r->out, 1, MPI_DOUBLE, r->op, MPI_COMM_WORLD);
	return 0;
}

/* Every rank's v reduced by op (MPI_MAX, MPI_SUM). */
static double over_ranks(double v, MPI_Op op)
{
	struct reduce r = {.in = v, .op = op};
	int rc = mbp_mpi_exec(reduce_task, &r);
	if (rc)
		die("reduce", rc);
	return r.out;
}

/* One run of the link carrying n micro-batches of `bytes` (after a warm-up of 256 that touches every pool
 * buffer once: first-touch page faults are not the link's), `stages` no-op stages per rank; GB/s on rank 0,
 * and in *cpu the CPU of both ranks (all threads) per micro-batch, warm-up included (us). */
static double link_run(unsigned stages, size_t bytes, unsigned n, double *cpu)
{
	uint32_t rows = (uint32_t)(bytes / ROW);
	double c0 = cpu_seconds();
	struct counter c = {0};
	mbp_mpi *mp = link_make(ROW, rows, stages, true, WINDOW, NULL, &c);
	if (rank == 0)
		link_stream(mp, &c, rows, 256);
	atomic_store(&c.done, 0);
	double s = rank == 0 ? link_stream(mp, &c, rows, n) : 0;
	link_end(mp);
	*cpu = over_ranks(cpu_seconds() - c0, MPI_SUM) / (n + 256) * 1e6;
	barrier();
	return (double)n * (double)bytes / s / 1e9;
}

/* The raw loop, one buffer per message of a window of `nbufs` (see the top); GB/s; *cpu as above. */
static double raw_gbs(size_t bytes, unsigned n, unsigned nbufs, double *cpu)
{
	double c0 = cpu_seconds();
	double s = raw_run(raw_bw_task, bytes, n / WINDOW, WINDOW, nbufs);
	*cpu = over_ranks(cpu_seconds() - c0, MPI_SUM) / n * 1e6;
	barrier();
	return (double)n * (double)bytes / s / 1e9;
}

static double min_of(const double *v, unsigned n)
{
	double m = v[0];
	for (unsigned i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

/* Micro-batches per round of a size: 512 MiB, at most 20000, a multiple of the window. */
static unsigned link_count(size_t bytes)
{
	unsigned n = (unsigned)(((size_t)512 << 20) / bytes);
	if (n > 20000)
		n = 20000;
	return n - n % WINDOW;
}

/* The sizes of link and of link1 (-s picks one of them). */
static const size_t link_sizes[] = {4096, 16384, 65536, 262144, 1048576, 4194304};
static const size_t link1_sizes[] = {65536, 262144, 1048576, 4194304};
#define NSIZES(t) (sizeof(t) / sizeof((t)[0]))

static bool has_size(const size_t *t, unsigned n, size_t bytes)
{
	for (unsigned z = 0; z < n; z++)
		if (t[z] == bytes)
			return true;
	return false;
}

static void bench_link(void)
{
	for (unsigned z = 0; z < NSIZES(link_sizes); z++) {
		size_t bytes = link_sizes[z];
		if (only_size && bytes != only_size)
			continue;
		unsigned n = link_count(bytes);
		double mbp[MAX_ROUNDS], raw[MAX_ROUNDS], win[MAX_ROUNDS], rot[MAX_ROUNDS], mcpu[MAX_ROUNDS],
		    rcpu[MAX_ROUNDS], x;
		for (int r = 0; r < rounds; r++) {
			mbp[r] = link_run(2, bytes, n, &mcpu[r]);
			raw[r] = raw_gbs(bytes, n, 1, &rcpu[r]);
			win[r] = raw_gbs(bytes, n, WINDOW, &x);
			rot[r] = raw_gbs(bytes, n, LINK_BUFFERS, &x);
		}
		if (rank == 0) {
			double a = bench_median(mbp, (unsigned)rounds),
			       b = bench_median(raw, (unsigned)rounds),
			       w = bench_median(win, (unsigned)rounds),
			       d = bench_median(rot, (unsigned)rounds);
			printf("mpi_link size=%zu window=%d mbp_gbs=%.2f raw_gbs=%.2f ratio=%.3f "
			       "raw_%dbufs_gbs=%.2f ratio_%dbufs=%.3f raw_%dbufs_gbs=%.2f ratio_%dbufs=%.3f "
			       "mbp_cpu_us_per_mb=%.1f raw_cpu_us_per_mb=%.1f\n",
			       bytes, WINDOW, a, b, a / b, WINDOW, w, WINDOW, a / w, LINK_BUFFERS, d,
			       LINK_BUFFERS, a / d, bench_median(mcpu, (unsigned)rounds),
			       bench_median(rcpu, (unsigned)rounds));
			fflush(stdout);
		}
	}
}

/* The hop with one stage per rank (rank 0's stage is the first and the last of its pipeline, so are rank
 * 1's), against the raw loop on one buffer per message of the window, alternated round by round; the
 * ratio's median over the rounds too (each round's pair ran back to back). */
static void bench_link1(void)
{
	for (unsigned z = 0; z < NSIZES(link1_sizes); z++) {
		size_t bytes = link1_sizes[z];
		if (only_size && bytes != only_size)
			continue;
		unsigned n = link_count(bytes);
		double mbp[MAX_ROUNDS], win[MAX_ROUNDS], ratio[MAX_ROUNDS], mcpu[MAX_ROUNDS],
		    rcpu[MAX_ROUNDS];
		for (int r = 0; r < rounds; r++) {
			mbp[r] = link_run(1, bytes, n, &mcpu[r]);
			win[r] = raw_gbs(bytes, n, WINDOW, &rcpu[r]);
			ratio[r] = mbp[r] / win[r];
		}
		if (rank == 0) {
			printf("mpi_link_1stage size=%zu window=%d mbp_gbs=%.2f raw_%dbufs_gbs=%.2f "
			       "ratio_%dbufs=%.3f ratio_min=%.3f mbp_cpu_us_per_mb=%.1f "
			       "raw_cpu_us_per_mb=%.1f\n",
			       bytes, WINDOW, bench_median(mbp, (unsigned)rounds), WINDOW,
			       bench_median(win, (unsigned)rounds), WINDOW,
			       bench_median(ratio, (unsigned)rounds), min_of(ratio, (unsigned)rounds),
			       bench_median(mcpu, (unsigned)rounds), bench_median(rcpu, (unsigned)rounds));
			fflush(stdout);
		}
	}
}

/* ---- latency ---- */

static double pingpong_mbp(mbp_mpi *mp, struct counter *c, unsigned n, uint32_t rows)
{
	sem_t sem;
	sem_init(&sem, 0, 0);
	c->sem = &sem;
	uint64_t t0 = mbt_now_ns();
	for (unsigned k = 0; k < n; k++) {
		mbp_mb *mb;
		if (mbp_mpi_mb_acquire(mp, &mb, -1) != 0)
			die("acquire", -EIO);
		mb->rows = rows;
		if (mbp_mpi_mb_submit(mp, mb, -1) != 0)
			die("submit", -EIO);
		sem_wait(&sem);
	}
	double us = (double)(mbt_now_ns() - t0) / n / 1e3;
	c->sem = NULL;
	sem_destroy(&sem);
	return us;
}

struct local_counter {
	sem_t sem;
	mbp_pipeline *p;
};

static void local_result(void *arg, mbp_mb *mb)
{
	struct local_counter *c = arg;
	mbp_mb_release(c->p, mb);
	sem_post(&c->sem);
}

static double pingpong_ring(unsigned n)
{
	struct local_counter c;
	sem_init(&c.sem, 0, 0);
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = 64;
	o.max_mb_rows = 1;
	o.pinning = MBP_PIN_NONE;
	o.on_result = local_result;
	o.on_result_arg = &c;
	mbp_pipeline *p;
	if (mbp_pipeline_new(&p, &o))
		die("pipeline", -EIO);
	c.p = p;
	mbp_stage_desc d = {.fn = noop};
	mbp_pipeline_add_stage(p, &d);
	mbp_pipeline_add_stage(p, &d);
	if (mbp_pipeline_start(p))
		die("start", -EIO);
	uint64_t t0 = mbt_now_ns();
	for (unsigned k = 0; k < n; k++) {
		mbp_mb *mb;
		mbp_mb_acquire(p, &mb, -1);
		mb->rows = 1;
		mbp_mb_submit(p, mb, -1);
		sem_wait(&c.sem);
	}
	double us = (double)(mbt_now_ns() - t0) / n / 1e3;
	mbp_pipeline_drain(p, -1);
	mbp_pipeline_destroy(p);
	sem_destroy(&c.sem);
	return us;
}

/* CPU share (of one core) of a rank whose run is up and idle for `s` seconds: the busiest rank's. */
static double idle_cpu(double s)
{
	struct counter c = {0};
	mbp_mpi *mp = link_make(64, 1, 1, false, 8, NULL, &c);
	if (rank == 0) /* one micro-batch first: the loops have seen traffic, then go quiet */
		pingpong_mbp(mp, &c, 1, 1);
	usleep(100000);
	double c0 = cpu_seconds();
	uint64_t t0 = mbt_now_ns();
	usleep((useconds_t)(s * 1e6));
	double share = (cpu_seconds() - c0) / ((double)(mbt_now_ns() - t0) / 1e9);
	link_end(mp);
	return over_ranks(share, MPI_MAX);
}

static void bench_latency(void)
{
	enum { N = 2000 };
	double mbp[MAX_ROUNDS], spin[MAX_ROUNDS], ring[MAX_ROUNDS], raw[MAX_ROUNDS];
	for (int r = 0; r < rounds; r++) {
		struct counter c = {0};
		mbp_mpi *mp = link_make(64, 1, 1, false, 8, NULL, &c);
		mbp[r] = rank == 0 ? pingpong_mbp(mp, &c, N, 1) : 0;
		link_end(mp);
		/* the communication threads polling 5 ms after each event instead of 20 us */
		struct counter c2 = {0};
		link_spin_ns = 5000000;
		mp = link_make(64, 1, 1, false, 8, NULL, &c2);
		link_spin_ns = 0;
		spin[r] = rank == 0 ? pingpong_mbp(mp, &c2, N, 1) : 0;
		link_end(mp);
		ring[r] = rank == 0 ? pingpong_ring(N) : 0;
		barrier();
		raw[r] = raw_run(raw_pingpong_task, 64, N, 1, 1) / N * 1e6;
	}
	double idle = idle_cpu(1.0);
	if (rank == 0)
		printf("mpi_latency bytes=64 mbp_2ranks_us=%.1f mbp_2ranks_spin5ms_us=%.1f "
		       "ring_1process_us=%.1f "
		       "raw_mpi_pingpong_us=%.1f idle_rank_cpu=%.4f\n",
		       bench_median(mbp, (unsigned)rounds), bench_median(spin, (unsigned)rounds),
		       bench_median(ring, (unsigned)rounds), bench_median(raw, (unsigned)rounds), idle);
	fflush(stdout);
}

/* ---- the bubble with the link ---- */

#define BUB_STAGES 2  /* per rank */
#define BUB_ROWS   16 /* rows of 4 KiB: 64 KiB micro-batches */
#define BUB_MBS	   8  /* micro-batches per batch (one job) */
#define BUB_JOBS   20 /* batches per round, one at a time */

/*
 * pipebench's bubble model (tools/pipebench/predict.c) with the link counted: a batch of M micro-batches
 * through the chain of stages t[0..n) takes T = sum(t) + (M - 1) max(t); the chain here is the compute
 * stages plus the two hops (rank 0 -> 1, rank 1 -> 0) as stages of cost `hop` each; the compute stages
 * alone work, so the bubble is 1 - M sum(compute) / (S T). hop 0: the model without the link.
 */
static double bubble_predicted(const double *t, unsigned S, unsigned M, double hop)
{
	double sum = 0, max = hop;
	for (unsigned i = 0; i < S; i++) {
		sum += t[i];
		max = t[i] > max ? t[i] : max;
	}
	double T = sum + 2 * hop + (M - 1) * max;
	return 1.0 - M * sum / (S * T);
}

/* Each stage's time inside fn (ns), of every rank: t[rank * BUB_STAGES + i]. */
static void busy_ns(mbp_mpi *mp, double *t)
{
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[BUB_STAGES];
	if (mbp_pipeline_stats_get(mbp_mpi_pipeline(mp), &ps, ss, BUB_STAGES) != BUB_STAGES)
		die("stats", -EIO);
	for (int k = 0; k < size; k++)
		for (unsigned i = 0; i < BUB_STAGES; i++)
			t[k * BUB_STAGES + i] = over_ranks(k == rank ? (double)ss[i].busy_ns : 0, MPI_SUM);
}

static void bench_bubble(void)
{
	/* 4 stages over 2 ranks, uneven; the slowest (600 us) sets the pace */
	static const uint64_t cost[2 * BUB_STAGES] = {300000, 600000, 400000, 500000};
	const unsigned S = 2 * BUB_STAGES;
	enum { N = 200 };
	double meas[MAX_ROUNDS], pred[MAX_ROUNDS], plain[MAX_ROUNDS], hop[MAX_ROUNDS];
	char *in = NULL, *out = NULL;
	if (rank == 0) {
		in = calloc((size_t)BUB_MBS * BUB_ROWS, ROW);
		out = calloc((size_t)BUB_MBS * BUB_ROWS, ROW);
		if (!in || !out)
			die("batch", -ENOMEM);
	}
	for (int r = 0; r < rounds; r++) {
		/* the link's time per micro-batch: the round trip of one through the same 2 ranks whose stages
		 * cost nothing (hand-offs included), half per hop */
		struct counter c = {0};
		mbp_mpi *mp = link_make(ROW, BUB_ROWS, BUB_STAGES, false, 8, NULL, &c);
		double rt = rank == 0 ? pingpong_mbp(mp, &c, N, BUB_ROWS) : 0;
		link_end(mp);
		hop[r] = over_ranks(rt, MPI_MAX) / 2;
		/* the batches, one at a time */
		struct counter c2 = {0};
		mp = link_make(ROW, BUB_ROWS, BUB_STAGES, false, 8, cost, &c2);
		double lat_ns = 0;
		for (unsigned j = 0; rank == 0 && j < BUB_JOBS; j++) {
			mbp_job job;
			mbp_job_init(&job, in, out, (size_t)BUB_MBS * BUB_ROWS, BUB_ROWS);
			int rc = mbp_mpi_job_submit(mp, &job, -1);
			if (rc || (rc = mbp_mpi_job_wait(mp, &job, -1)) || (rc = job.status))
				die("bubble batch", rc);
			lat_ns += (double)(job.done_ns - job.submit_ns);
		}
		int rc = rank == 0 ? mbp_mpi_drain(mp, -1) : mbp_mpi_wait(mp, -1);
		if (rc)
			die("end of run", rc);
		double t[2 * BUB_STAGES], busy = 0;
		busy_ns(mp, t);
		mbp_mpi_destroy(mp);
		lat_ns = over_ranks(lat_ns, MPI_MAX);
		/* the stages' measured service times (us per micro-batch), as pipebench uses them */
		for (unsigned i = 0; i < S; i++) {
			busy += t[i];
			t[i] /= 1e3 * BUB_JOBS * BUB_MBS;
		}
		meas[r] = 1.0 - busy / (S * lat_ns);
		pred[r] = bubble_predicted(t, S, BUB_MBS, hop[r]);
		plain[r] = bubble_predicted(t, S, BUB_MBS, 0);
	}
	if (rank == 0) {
		double m = bench_median(meas, (unsigned)rounds), p = bench_median(pred, (unsigned)rounds);
		printf("mpi_bubble stages=%u ranks=2 mbs=%d mb_bytes=%d hop_us=%.1f measured=%.3f "
		       "predicted_with_link=%.3f predicted_without_link=%.3f diff=%.3f\n",
		       S, BUB_MBS, BUB_ROWS * ROW, bench_median(hop, (unsigned)rounds), m, p,
		       bench_median(plain, (unsigned)rounds), m - p);
		fflush(stdout);
	}
	free(in);
	free(out);
}

/* ---- the MLP ---- */

#define MLP_LAYERS 8
#define MLP_WIDTH  1024
#define MLP_MB	   64
#define MLP_ROWS   256
#define MLP_JOBS   16

static double mlp_stream(mbp_mpi *mp, mbp_pipeline *p, const float *in, float *out, unsigned reps)
{
	mbp_job jobs[MLP_JOBS];
	uint64_t t0 = mbt_now_ns();
	for (unsigned rep = 0; rep < reps; rep++) {
		for (unsigned j = 0; j < MLP_JOBS; j++) {
			mbp_job_init(&jobs[j], in + (size_t)j * MLP_ROWS * MLP_WIDTH,
				     out + (size_t)j * MLP_ROWS * MLP_WIDTH, MLP_ROWS, MLP_MB);
			int rc = mp ? mbp_mpi_job_submit(mp, &jobs[j], -1) : mbp_job_submit(p, &jobs[j], -1);
			if (rc)
				die("job submit", rc);
		}
		for (unsigned j = 0; j < MLP_JOBS; j++) {
			if (mp)
				mbp_mpi_job_wait(mp, &jobs[j], -1);
			else
				mbp_job_wait(&jobs[j], -1);
			if (jobs[j].status)
				die("job", jobs[j].status);
		}
	}
	return (double)reps * MLP_JOBS * MLP_ROWS / ((double)(mbt_now_ns() - t0) / 1e9);
}

static void add_model_stages(mbp_model_stages *st, mbp_mpi *mp)
{
	for (unsigned i = 0; i < mbp_model_stages_count(st); i++) {
		mbp_stage_desc d;
		mbp_model_stage_desc(st, i, &d);
		int rc = mbp_mpi_add_stage(mp, &d);
		if (rc)
			die("add model stage", rc);
	}
}

static void bench_mlp(void)
{
	char path[96];
	snprintf(path, sizeof(path), "/tmp/bench-mpi-mlp-%d-%d.safetensors", (int)getppid(), rank);
	mbp_model_spec sp = {.layers = MLP_LAYERS,
			     .in = MLP_WIDTH,
			     .hidden = MLP_WIDTH,
			     .out = MLP_WIDTH,
			     .act = MBP_ACT_GELU,
			     .seed = 5};
	if (mbp_model_write_random(path, &sp))
		die("model file", -EIO);
	float *in = NULL, *out = NULL, *ref = NULL;
	if (rank == 0) {
		in = malloc((size_t)MLP_JOBS * MLP_ROWS * MLP_WIDTH * sizeof(float));
		out = malloc((size_t)MLP_JOBS * MLP_ROWS * MLP_WIDTH * sizeof(float));
		ref = malloc((size_t)MLP_JOBS * MLP_ROWS * MLP_WIDTH * sizeof(float));
		for (size_t i = 0; i < (size_t)MLP_JOBS * MLP_ROWS * MLP_WIDTH; i++)
			in[i] = (float)(i % 1999) / 1000.0f - 1.0f;
	}
	double split[MAX_ROUNDS], one[MAX_ROUNDS];
	mbp_model_error e;
	for (int r = 0; r < rounds; r++) {
		/* A: 2 ranks of one stage each, each rank loading only its half of the layers */
		mbp_model *part;
		if (mbp_model_load_layers(&part, path, (unsigned)rank * (MLP_LAYERS / 2), MLP_LAYERS / 2, &e))
			die(e.msg, -EIO);
		mbp_model_plan plan;
		const double cost[MLP_LAYERS / 2] = {1, 1, 1, 1};
		mbp_model_partition(cost, NULL, MLP_LAYERS / 2, 1, &plan);
		mbp_model_stages *st;
		mbp_model_stages_new(&st, part, &plan, MLP_MB);
		mbp_opts o;
		mbp_opts_init(&o);
		o.in_row_bytes = MLP_WIDTH * sizeof(float);
		o.max_mb_rows = MLP_MB;
		o.pinning = MBP_PIN_NONE;
		mbp_mpi *mp;
		int rc = mbp_mpi_new(&mp, &o, NULL);
		if (rc)
			die("mbp_mpi_new", rc);
		add_model_stages(st, mp);
		if ((rc = mbp_mpi_start(mp)))
			die("start", rc);
		if (rank == 0) {
			mlp_stream(mp, NULL, in, out, 1); /* warm-up */
			split[r] = mlp_stream(mp, NULL, in, out, 3);
		}
		link_end(mp);
		mbp_model_stages_destroy(st);
		mbp_model_destroy(part);
		barrier();
		/* B: one process of 2 stages (rank 1 idles) */
		if (rank == 0) {
			mbp_model *m;
			if (mbp_model_load(&m, path, &e))
				die(e.msg, -EIO);
			const double c8[MLP_LAYERS] = {1, 1, 1, 1, 1, 1, 1, 1};
			mbp_model_partition(c8, NULL, MLP_LAYERS, 2, &plan);
			mbp_model_stages_new(&st, m, &plan, MLP_MB);
			mbp_opts_init(&o);
			o.in_row_bytes = MLP_WIDTH * sizeof(float);
			o.max_mb_rows = MLP_MB;
			mbp_pipeline *p;
			mbp_pipeline_new(&p, &o);
			mbp_model_stages_add(st, p);
			if (mbp_pipeline_start(p))
				die("start", -EIO);
			mlp_stream(NULL, p, in, ref, 1);
			one[r] = mlp_stream(NULL, p, in, ref, 3);
			mbp_pipeline_drain(p, -1);
			mbp_pipeline_destroy(p);
			mbp_model_stages_destroy(st);
			mbp_model_destroy(m);
			if (memcmp(out, ref, (size_t)MLP_JOBS * MLP_ROWS * MLP_WIDTH * sizeof(float)) != 0)
				die("2 ranks and one process disagree", -EIO);
		}
		barrier();
	}
	if (rank == 0) {
		double a = bench_median(split, (unsigned)rounds), b = bench_median(one, (unsigned)rounds);
		printf("mpi_mlp layers=%d width=%d mb=%d rows_per_s_2ranks=%.0f rows_per_s_1process=%.0f "
		       "ratio=%.3f "
		       "bit_for_bit=yes\n",
		       MLP_LAYERS, MLP_WIDTH, MLP_MB, a, b, a / b);
	}
	unlink(path);
	free(in);
	free(out);
	free(ref);
}

int main(int argc, char **argv)
{
	int rc = mbp_mpi_init(&argc, &argv);
	if (rc) {
		fprintf(stderr, "bench_mpi: MPI: %s\n", mbp_strerror(rc));
		return 1;
	}
	rank = mbp_mpi_rank();
	size = mbp_mpi_size();
	const char *only = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-r") && i + 1 < argc)
			rounds = (int)bench_opt_u64("-r", argv[++i], 1, MAX_ROUNDS);
		else if (!strcmp(argv[i], "-s") && i + 1 < argc)
			only_size = (size_t)bench_opt_u64("-s", argv[++i], 4096, (uint64_t)4 << 20);
		else
			only = argv[i];
	}
	/* -s: a size that link (or link1, where only it runs) has; another would run nothing */
	bool link1_only = only && !strcmp(only, "link1");
	bool bad_size = only_size && !(link1_only ? has_size(link1_sizes, NSIZES(link1_sizes), only_size)
						  : has_size(link_sizes, NSIZES(link_sizes), only_size));
	if (size != 2 || rounds < 1 || rounds > MAX_ROUNDS || bad_size) {
		if (rank == 0) {
			fprintf(stderr,
				"usage: mpirun -np 2 bench_mpi [-r ROUNDS (1-%d)] [-s BYTES] "
				"[link|link1|latency|bubble|mlp]\n  -s: link's sizes",
				MAX_ROUNDS);
			for (unsigned z = 0; z < NSIZES(link_sizes); z++)
				fprintf(stderr, " %zu", link_sizes[z]);
			fprintf(stderr, "; link1's");
			for (unsigned z = 0; z < NSIZES(link1_sizes); z++)
				fprintf(stderr, " %zu", link1_sizes[z]);
			fprintf(stderr, "\n");
			if (bad_size)
				fprintf(stderr, "bench_mpi: -s %zu: no such size%s\n", only_size,
					link1_only ? " of link1" : "");
		}
		mbp_mpi_finalize();
		return 2;
	}
	if (!only || !strcmp(only, "link"))
		bench_link();
	if (!only || !strcmp(only, "link1"))
		bench_link1();
	if (!only || !strcmp(only, "latency"))
		bench_latency();
	if (!only || !strcmp(only, "bubble"))
		bench_bubble();
	if (!only || !strcmp(only, "mlp"))
		bench_mlp();
	mbp_mpi_finalize();
	return 0;
}

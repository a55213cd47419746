/*
 * The communication thread: the one thread of the process that calls MPI.
 *
 * mbp_mpi_init() starts it; it calls MPI_Init_thread(MPI_THREAD_FUNNELED), so it is MPI's "main thread"
 * and every later MPI call of the library runs on it. Other threads hand it a task (a function and its
 * argument) and, for set-up calls, wait for the result. A run's link loop (loop.c) is such a task: it
 * occupies the thread until the run ends. mbp_mpi_finalize() makes it call MPI_Finalize, or MPI_Abort
 * when a run ended on a silent rank (MPI_Finalize would wait for that rank forever).
 *
 * It also finds which part of its node's CPUs a rank's pipeline or trainer takes (mbp__mpi_node_share): it
 * gathers the CPUs of the node's ranks, and affinity.c's mbp__node_part says which of those given the same
 * CPUs this rank is; they split them.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "affinity.h"
#include "common.h"
#include "mpi_internal.h"

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	bool started;
	bool ready; /* MPI_Init_thread returned (init_rc says how) */
	int init_rc;
	bool quit;
	int (*fn)(void *);
	void *arg;
	bool has_task;	 /* fn/arg wait to be run */
	uint64_t posted; /* tasks posted; done counts those finished (a task waits or runs: posted != done) */
	uint64_t done;
	int rc; /* result of the last task */
	int rank, size;
	atomic_bool abort_at_end;
	atomic_int abort_now; /* mbp_mpi_abort()'s code + 1, 0: none */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .rank = -1, .size = -1};

struct init_args {
	int *argc;
	char ***argv;
};

static void *comm_main(void *arg)
{
	struct init_args *ia = arg;
	int provided = MPI_THREAD_SINGLE, rc = 0;
	pthread_setname_np(pthread_self(), "mbp-comm");
#ifdef PR_SET_TIMERSLACK
	/* The link loop parks for as little as 1 us (loop.c): the default slack (50 us) would make every such
	 * park 50 us. Only this thread's timers are affected. */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
	if (MPI_Init_thread(ia->argc, ia->argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
		rc = -EIO;
	else if (provided < MPI_THREAD_FUNNELED)
		rc = -ENOTSUP;
	pthread_mutex_lock(&g.lock);
	if (rc == 0) {
		MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
		MPI_Comm_size(MPI_COMM_WORLD, &g.size);
	}
	g.init_rc = rc;
	g.ready = true;
	pthread_cond_broadcast(&g.cond);
	while (rc == 0) {
		while (!g.has_task && !g.quit)
			pthread_cond_wait(&g.cond, &g.lock);
		if (g.has_task) {
			int (*fn)(void *) = g.fn;
			void *a = g.arg;
			g.has_task = false;
			pthread_mutex_unlock(&g.lock);
			int r = fn(a);
			pthread_mutex_lock(&g.lock);
			g.rc = r;
			g.done++;
			pthread_cond_broadcast(&g.cond);
			continue;
		}
		break; /* quit, no task left */
	}
	pthread_mutex_unlock(&g.lock);
	if (rc == 0) {
		/* seq_cst: a flag, set once; no data is published with it */
		if (atomic_load_explicit(&g.abort_at_end, memory_order_seq_cst)) {
			fprintf(stderr, "mbpipe-mpi: rank %d: a rank went silent; aborting every rank\n",
				g.rank);
			MPI_Abort(MPI_COMM_WORLD, 1);
		}
		MPI_Finalize();
	}
	return NULL;
}

int mbp_mpi_init(int *argc, char ***argv)
{
	static struct init_args ia;
	int flag = 0;
	pthread_mutex_lock(&g.lock);
	if (g.started) {
		pthread_mutex_unlock(&g.lock);
		return -EALREADY;
	}
	/* MPI_Initialized may be called before MPI_Init, from any thread. */
	MPI_Initialized(&flag);
	if (flag) {
		pthread_mutex_unlock(&g.lock);
		return -ENOTSUP; /* someone else's main thread owns MPI: FUNNELED would forbid our calls */
	}
	ia.argc = argc;
	ia.argv = argv;
	g.ready = false;
	if (pthread_create(&g.thread, NULL, comm_main, &ia) != 0) {
		pthread_mutex_unlock(&g.lock);
		return -ENOMEM;
	}
	g.started = true;
	while (!g.ready)
		pthread_cond_wait(&g.cond, &g.lock);
	int rc = g.init_rc;
	pthread_mutex_unlock(&g.lock);
	if (rc) {
		pthread_join(g.thread, NULL);
		g.started = false;
	}
	return rc;
}

void mbp_mpi_finalize(void)
{
	pthread_mutex_lock(&g.lock);
	if (!g.started) {
		pthread_mutex_unlock(&g.lock);
		return;
	}
	g.quit = true;
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
	pthread_join(g.thread, NULL);
	g.started = false;
	g.rank = g.size = -1;
}

int mbp_mpi_rank(void)
{
	return g.started ? g.rank : -ENOTCONN;
}

int mbp_mpi_size(void)
{
	return g.started ? g.size : -ENOTCONN;
}

/* Lock held: fn(arg) is the thread's next task (none is waiting or running: posted == done); its ticket. */
static uint64_t post_locked(int (*fn)(void *), void *arg)
{
	g.fn = fn;
	g.arg = arg;
	g.has_task = true;
	pthread_cond_broadcast(&g.cond);
	return ++g.posted;
}

static int abort_task(void *arg)
{
	(void)arg;
	mbp__mpi_check_abort();
	return 0;
}

void mbp__mpi_check_abort(void)
{
	/* seq_cst: a flag, set once; no data is published with it */
	int c = atomic_load_explicit(&g.abort_now, memory_order_seq_cst);
	if (c)
		MPI_Abort(MPI_COMM_WORLD, c - 1);
}

void mbp_mpi_abort(int code)
{
	if (!g.started)
		exit(code ? code : 1);
	atomic_store_explicit(&g.abort_now, code + 1, memory_order_seq_cst); /* seq_cst: a flag, as above */
	/* An idle thread runs the abort as a task; a busy one (a run's link loop) checks abort_now. */
	pthread_mutex_lock(&g.lock);
	if (g.posted == g.done)
		post_locked(abort_task, NULL);
	pthread_mutex_unlock(&g.lock);
	for (;;)
		pause();
}

void mbp__mpi_abort_at_end(void)
{
	atomic_store_explicit(&g.abort_at_end, true, memory_order_seq_cst); /* seq_cst: a flag, as above */
}

uint64_t mbp__mpi_post(int (*fn)(void *), void *arg)
{
	pthread_mutex_lock(&g.lock);
	while (g.posted != g.done)
		pthread_cond_wait(&g.cond, &g.lock); /* one task at a time */
	uint64_t ticket = post_locked(fn, arg);
	pthread_mutex_unlock(&g.lock);
	return ticket;
}

int mbp__mpi_await(uint64_t ticket)
{
	pthread_mutex_lock(&g.lock);
	while (g.done < ticket)
		pthread_cond_wait(&g.cond, &g.lock);
	int rc = g.rc;
	pthread_mutex_unlock(&g.lock);
	return rc;
}

int mbp__mpi_call(int (*fn)(void *), void *arg)
{
	return mbp__mpi_await(mbp__mpi_post(fn, arg));
}

int mbp_mpi_exec(int (*fn)(void *), void *arg)
{
	if (!fn)
		return -EINVAL;
	if (!g.started)
		return -ENOTCONN;
	pthread_mutex_lock(&g.lock);
	bool busy = g.posted != g.done;
	pthread_mutex_unlock(&g.lock);
	if (busy)
		return -EBUSY; /* a run's link loop holds the thread (or another exec) */
	return mbp__mpi_call(fn, arg);
}

/* ---- the node's CPUs ---- */

struct node_share {
	cpu_set_t mine; /* the calling thread's CPUs: the ones its pipeline's plan will choose from */
	cpu_set_t all[MBP_MAX_STAGES]; /* every rank's of the node (mbp_mpi_new: at most this many ranks) */
	unsigned k, m;
};

static int node_share_task(void *arg)
{
	struct node_share *ns = arg;
	MPI_Comm node;
	if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
		return -EIO;
	int lr = 0, L = 1, rc = 0;
	MPI_Comm_rank(node, &lr);
	MPI_Comm_size(node, &L);
	ns->k = 0;
	ns->m = 1;
	/* L is the same on every rank of the node, so they all take part or none does */
	if (L <= MBP_MAX_STAGES && MPI_Allgather(&ns->mine, (int)sizeof(cpu_set_t), MPI_BYTE, ns->all,
						 (int)sizeof(cpu_set_t), MPI_BYTE, node) != MPI_SUCCESS)
		rc = -EIO;
	else if (L <= MBP_MAX_STAGES)
		mbp__node_part(ns->all, (unsigned)L, (unsigned)lr, &ns->k, &ns->m);
	MPI_Comm_free(&node);
	return rc;
}

int mbp__mpi_node_share(unsigned *k, unsigned *m)
{
	/* static: nothing here may fail before the collective, which the other ranks are waiting in */
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static struct node_share ns;
	pthread_mutex_lock(&lock);
	CPU_ZERO(&ns.mine);
	int rc = sched_getaffinity(0, sizeof(ns.mine), &ns.mine) == 0 ? 0 : -errno;
	int trc = mbp__mpi_call(node_share_task, &ns);
	if (rc == 0)
		rc = trc;
	*k = rc == 0 ? ns.k : 0;
	*m = rc == 0 ? ns.m : 0;
	pthread_mutex_unlock(&lock);
	return rc;
}

void mbp__mpi_finish(MPI_Request *rq, bool cancel, uint64_t deadline)
{
	if (*rq == MPI_REQUEST_NULL)
		return;
	if (cancel)
		MPI_Cancel(rq);
	int flag = 0;
	while (!flag && mbp__now_ns() < deadline)
		MPI_Test(rq, &flag, MPI_STATUS_IGNORE);
}

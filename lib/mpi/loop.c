/*
 * A run: the base object of the pipeline across ranks (mpi.c) and of the trainer across ranks
 * (trainer.c), as libuv's stream is under its tcp and pipe: options, the communicator and its hand-shake,
 * the control channel and the links, the one link loop that drives them (a task on the communication
 * thread from mbp__run_start() to the end of the run) and the tear-down. A flow fills in a table of
 * operations (mpi_internal.h) and keeps only its own protocol.
 *
 * A pass of the loop: every link, the flow's own work, the channel, the watchdog, on rank 0 the quiet
 * stop. After spin_ns without an event it parks in wait.h's seq_cst mode (no membarrier per park): flag
 * up, the kick word re-checked (mbp__run_kick stores it, then wakes), sleep. An arriving MPI message
 * cannot wake it (shared memory has no descriptor to wait on), so a park's deadline is a quarter of the
 * quiet time, from 1 us up to idle_ns: an arrival after a gap g is seen within about g / 4. Not a smaller
 * share: each park is a wake-up (about 10 us of CPU on a busy 2-CPU machine).
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "mpi_internal.h"

void mbp_mpi_opts_init(mbp_mpi_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->window = 8;
	o->inflight = 512;
	o->peer_timeout_ns = 10 * (int64_t)1000000000;
	o->spin_ns = 20000;
	o->idle_ns = 200000;
}

int mbp__run_new(struct mbp__run **rp, size_t size, const struct mbp__run_ops *ops, const mbp_mpi_opts *mo,
		 size_t in_row_bytes)
{
	*rp = NULL;
	int ranks = mbp_mpi_size(); /* -ENOTCONN before mbp_mpi_init */
	if (ranks < 0 || ranks > MBP_MAX_STAGES)
		return ranks < 0 ? ranks : -ERANGE;
	struct mbp__run *r = calloc(1, size);
	if (!r)
		return -ENOMEM;
	mbp_mpi_opts d;
	mbp_mpi_opts_init(&d);
	r->ops = ops;
	if (mo)
		r->mo = *mo;
	MBP__DEFAULT(&r->mo, &d, window);
	MBP__DEFAULT(&r->mo, &d, inflight);
	MBP__DEFAULT(&r->mo, &d, peer_timeout_ns);
	/* as the waits take it (MBP_SPIN_NONE: parks right after its last event) */
	r->mo.spin_ns = mbp__wait_budget(r->mo.spin_ns, d.spin_ns);
	MBP__DEFAULT(&r->mo, &d, idle_ns);
	r->rank = mbp_mpi_rank();
	r->size = ranks;
	r->in_rb = r->out_rb = r->wide = in_row_bytes;
	r->comm = MPI_COMM_NULL;
	mbp__wait_global_init();
	pthread_mutex_init(&r->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cond, &ca);
	pthread_condattr_destroy(&ca);
	*rp = r;
	if (r->mo.window <= 1024 && (!ops->inflight || r->mo.inflight >= r->mo.window))
		return 0;
	mbp__run_destroy(r);
	return -EINVAL;
}

void mbp__run_destroy(struct mbp__run *r)
{
	mbp__run_join(r);
	for (unsigned i = 0; i < r->nlinks; i++)
		mbp__link_free(&r->link[i]);
	mbp__ctl_free(&r->ctl);
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	free(r);
}

int mbp__run_stage(struct mbp__run *r, int rc, size_t out_row_bytes)
{
	if (rc)
		return rc;
	r->nstages++;
	r->out_rb = out_row_bytes ? out_row_bytes : r->out_rb;
	r->wide = r->out_rb > r->wide ? r->out_rb : r->wide;
	return 0;
}

int mbp__run_fail(struct mbp__run *r, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
	va_end(ap);
	return err;
}

const struct timespec *mbp__run_deadline(int64_t timeout_ns, struct timespec *ts)
{
	if (timeout_ns < 0)
		return NULL;
	*ts = mbp__timespec(mbp__now_ns() + (uint64_t)timeout_ns); /* 0: now, a wait times out at once */
	return ts;
}

void mbp__run_counts(struct mbp__run *r, uint64_t *sent, uint64_t *received, uint64_t *credit_waits)
{
	for (unsigned i = 0; i < r->nlinks; i++) {
		*sent += mbp__counter_get(&r->link[i].sent);
		*received += mbp__counter_get(&r->link[i].received);
		*credit_waits += mbp__counter_get(&r->link[i].credit_waits);
	}
}

bool mbp__run_wait(struct mbp__run *r, const struct timespec *deadline)
{
	if (!deadline)
		return pthread_cond_wait(&r->cond, &r->lock) == 0;
	return pthread_cond_timedwait(&r->cond, &r->lock, deadline) != ETIMEDOUT;
}

/* ---- set-up, on the owner's thread ---- */

struct hs {
	struct mbp__run *r;
	const uint64_t *mine;
	unsigned n;
	uint64_t *all;
};

static int hs_task(void *arg)
{
	struct hs *h = arg;
	if (h->r->comm == MPI_COMM_NULL && MPI_Comm_dup(MPI_COMM_WORLD, &h->r->comm) != MPI_SUCCESS)
		return -EIO;
	if (MPI_Allgather(h->mine, (int)h->n, MPI_UINT64_T, h->all, (int)h->n, MPI_UINT64_T, h->r->comm) !=
	    MPI_SUCCESS)
		return -EIO;
	return 0;
}

int mbp__run_link(struct mbp__run *r, bool send, int peer, mbp_pool *pool, mbp_pool_cache *cache)
{
	MBP_VERIFY(r->nlinks < MBP__RUN_LINKS);
	struct mbp__link *l = &r->link[r->nlinks++];
	*l = (struct mbp__link){.send = send, .peer = peer, .pool = pool, .cache = cache};
	return mbp__link_alloc(l, r->mo.window);
}

/* ---- the loop, on the communication thread ---- */

static uint64_t park_ns(uint64_t quiet, uint64_t idle_ns)
{
	uint64_t ns = quiet / 4;
	return ns < 1000 ? 1000 : ns > idle_ns ? idle_ns : ns;
}

/* Rank 0: STOP to every peer once the flow may end the run; leave once every peer's STOPPED is in and
 * nothing of ours is still going out. */
static bool stop_step(struct mbp__run *r, bool *leave)
{
	struct mbp__ctl *c = &r->ctl;
	if (!c->stop_sent) {
		/* relaxed: a hint; may_stop reads the flow's state under the lock */
		if (!atomic_load_explicit(&r->ending, memory_order_relaxed))
			return false;
		pthread_mutex_lock(&r->lock);
		c->stop_sent = c->quiet = r->ops->may_stop(r);
		pthread_mutex_unlock(&r->lock);
		if (c->stop_sent)
			mbp__ctl_post(r, -1, MBP__CTL_STOP);
		return c->stop_sent;
	}
	if (c->stopped < c->n)
		return false;
	for (unsigned i = 0; i < c->n; i++)
		/* relaxed: a bit carries no data; one set after this pass kicks the loop into another */
		if (c->peer[i].busy || atomic_load_explicit(&c->peer[i].pending, memory_order_relaxed))
			return false;
	*leave = true;
	return true;
}

static _Atomic uint64_t late_seen;

/* Tests: rank 0, its links and channel closed: for 200 ms, any message a peer sent after its last word. */
static void count_late(struct mbp__run *r)
{
	uint64_t end = mbp__now_ns() + 200 * (uint64_t)1000000;
	while (mbp__now_ns() < end) {
		int flag = 0;
		MPI_Status st;
		MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, r->comm, &flag, &st);
		if (!flag) {
			sched_yield();
			continue;
		}
		int bytes = 0;
		MPI_Get_count(&st, MPI_BYTE, &bytes);
		void *buf = malloc(bytes > 0 ? (size_t)bytes : 1);
		MPI_Recv(buf, bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, r->comm, MPI_STATUS_IGNORE);
		free(buf);
		fprintf(stderr, "mbpipe-mpi: rank %d sent a message (tag %d) after its last word\n",
			st.MPI_SOURCE, st.MPI_TAG);
		/* relaxed: a count read after the run's end (the loop's task awaited) */
		atomic_fetch_add_explicit(&late_seen, 1, memory_order_relaxed);
	}
}

void mbp__run_test_late(struct mbp__run *r)
{
	/* relaxed: a switch, read by the loop; nothing is published with it */
	atomic_store_explicit(&r->test_late, true, memory_order_relaxed);
}

uint64_t mbp__run_late_seen(void)
{
	/* relaxed: see count_late() */
	return atomic_load_explicit(&late_seen, memory_order_relaxed);
}

static int loop_task(void *arg)
{
	struct mbp__run *r = arg;
	uint64_t now = mbp__now_ns(), last = now;
	mbp__ctl_open(r, now);
	for (unsigned i = 0; i < r->nlinks; i++)
		mbp__link_open(r, &r->link[i]);
	bool leave = false, dead = false;
	while (!leave) {
		mbp__mpi_check_abort();
		/* acquire; partner: the release store in mbp__run_kick(): this pass sees what was published */
		bool act = atomic_exchange_explicit(&r->kick, 0, memory_order_acquire) != 0;
		for (unsigned i = 0; i < r->nlinks; i++)
			act |= mbp__link_pass(r, &r->link[i], now);
		act |= r->ops->pass(r);
		act |= mbp__ctl_pass(r, now, &leave);
		if (mbp__ctl_watchdog(r, now)) {
			dead = true;
			break;
		}
		if (r->rank == 0 && !leave)
			act |= stop_step(r, &leave);
		now = mbp__now_ns();
		if (act) {
			last = now;
		} else if (now - last <= r->mo.spin_ns) {
			sched_yield();
		} else {
			mbp__parker_prepare_sc(&r->pk);
			/* seq_cst, the re-check after the flag: a kick that came before the flag was up */
			if (atomic_load_explicit(&r->kick, memory_order_seq_cst))
				mbp__parker_cancel(&r->pk);
			else
				mbp__parker_sleep(&r->pk, now + park_ns(now - last, r->mo.idle_ns));
			now = mbp__now_ns();
		}
	}
	uint64_t dl = mbp__now_ns() + mbp__run_close_ns(dead);
	for (unsigned i = 0; i < r->nlinks; i++)
		mbp__link_close(r, &r->link[i], dl);
	mbp__ctl_close(r, dl);
	r->ops->closed(r);
	/* relaxed: a test's switch, set once; nothing is published with it */
	if (r->rank == 0 && !dead && atomic_load_explicit(&r->test_late, memory_order_relaxed))
		count_late(r);
	if (!dead && r->comm != MPI_COMM_NULL)
		MPI_Comm_free(&r->comm);
	pthread_mutex_lock(&r->lock);
	r->state = MBP__RUN_ENDED;
	pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
	return 0;
}

/* ---- start, on the owner's thread ---- */

static int free_comm_task(void *arg)
{
	struct mbp__run *r = arg;
	if (r->comm != MPI_COMM_NULL)
		MPI_Comm_free(&r->comm);
	return 0;
}

/* Rank k's values in all[] that break the rules of mbp__run_start, in words; 0 or the error. */
static int check(struct mbp__run *r, const uint64_t *all, unsigned n, unsigned own, const char *const *names,
		 const char *what)
{
	for (int k = 0; k < r->size; k++) {
		const uint64_t *v = &all[(size_t)k * n], *next = v + n;
		int e = (int)(int64_t)v[MBP__HS_RC];
		if (e < 0)
			return mbp__run_fail(r, e, "rank %d failed to start: %s", k, mbp_strerror(e));
		if (v[MBP__HS_STAGES] == 0)
			return mbp__run_fail(r, -EINVAL, "rank %d has no stages", k);
		if (k + 1 < r->size && v[MBP__HS_OUT] != next[MBP__HS_IN])
			return mbp__run_fail(
			    r, -EINVAL, "rank %d's output rows are %llu bytes, rank %d's input rows %llu", k,
			    (unsigned long long)v[MBP__HS_OUT], k + 1, (unsigned long long)next[MBP__HS_IN]);
		if (v[MBP__HS_BYTES] > INT_MAX)
			return mbp__run_fail(r, -E2BIG, "rank %d's %s exceed 2 GiB", k, what);
		for (unsigned i = MBP__HS_ROWS; i < n - own; i++)
			if (v[i] != all[i])
				return mbp__run_fail(r, -EINVAL, "rank %d has %s %llu, rank 0 %llu", k,
						     i == MBP__HS_ROWS	   ? "max_mb_rows"
						     : i == MBP__HS_WINDOW ? "window"
									   : names[i - MBP__HS_SAME],
						     (unsigned long long)v[i], (unsigned long long)all[i]);
	}
	return 0;
}

int mbp__run_start(struct mbp__run *r, uint64_t *mine, unsigned n, unsigned own, const char *const *names,
		   const char *what)
{
	if (mbp__run_check(r, MBP__RUN_ANY, true) != -ENOTCONN)
		return -EALREADY; /* not new: the state read under the lock, as the loop may be ending it */
	mine[MBP__HS_STAGES] = r->nstages;
	mine[MBP__HS_WINDOW] = r->mo.window;
	uint64_t *all = calloc((size_t)r->size, n * sizeof(*all));
	struct hs h = {.r = r, .mine = mine, .n = n, .all = all};
	int rc = all ? mbp__mpi_call(hs_task, &h) : -ENOMEM;
	if (rc == 0 && (rc = check(r, all, n, own, names, what)) == 0) {
		/* every rank passed alike: the node's CPUs (collective), the flow's own start (collectives
		 * included), the channel; then the result shared */
		int lrc = mbp__mpi_node_share(&r->node_k, &r->node_m);
		if (lrc == 0 && (lrc = r->ops->start(r, all)) == 0)
			lrc = mbp__ctl_alloc(r, r->ops->mesh);
		mine[MBP__HS_RC] = (uint64_t)(int64_t)lrc;
		rc = mbp__mpi_call(hs_task, &h);
		/* the first rank that failed says why; one that failed alike (a check of all[]) has said it */
		for (int k = 0; rc == 0 && k < r->size; k++)
			if ((rc = (int)(int64_t)all[(size_t)k * n + MBP__HS_RC]) < 0 &&
			    !(rc == lrc && r->msg[0]))
				mbp__run_fail(r, rc, "rank %d failed to start: %s", k, mbp_strerror(rc));
	}
	free(all);
	if (rc) {
		mbp__mpi_call(free_comm_task, r);
		r->state = MBP__RUN_ENDED;
		r->err = rc;
		return rc;
	}
	pthread_mutex_lock(&r->lock);
	r->state = MBP__RUN_RUNNING;
	if (r->cancelled) /* rank 0 cancelled before the start, when the channel had no rank to tell */
		mbp__ctl_post(r, -1, MBP__CTL_CANCEL);
	pthread_mutex_unlock(&r->lock);
	r->ticket = mbp__mpi_post(loop_task, r);
	return 0;
}

int mbp__run_check(struct mbp__run *r, int who, bool started)
{
	if (!r)
		return -EINVAL;
	if ((who == MBP__RUN_RANK0 && r->rank != 0) || (who == MBP__RUN_OTHERS && r->rank == 0))
		return -EPERM;
	if (!started)
		return 0;
	pthread_mutex_lock(&r->lock);
	bool fresh = r->state == MBP__RUN_NEW;
	pthread_mutex_unlock(&r->lock);
	return fresh ? -ENOTCONN : 0;
}

int mbp__run_ended_rc(const struct mbp__run *r)
{
	return r->err ? r->err : r->cancelled ? -ECANCELED : 0;
}

bool mbp__run_cancel(struct mbp__run *r)
{
	bool first = !r->cancelled;
	r->cancelled = true;
	mbp__ctl_post(r, -1, MBP__CTL_CANCEL); /* on every call, as a repeat is harmless */
	return first;
}

void mbp__run_stop(struct mbp__run *r)
{
	mbp__run_end(r);
	while (r->state == MBP__RUN_RUNNING)
		mbp__run_wait(r, NULL);
}

void mbp__run_join(struct mbp__run *r)
{
	if (r->ticket)
		mbp__mpi_await(r->ticket);
	r->ticket = 0;
}

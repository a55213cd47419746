/*
 * A pipeline across MPI ranks: each rank's local mbp_pipeline, linked rank to rank by remote links.
 *
 * Built on the core's public API only: each rank's stages run in an ordinary mbp_pipeline whose
 * micro-batches enter with mbp_mb_submit() and leave through opts.on_result; this file moves them between
 * ranks. See <mbpipe/mpi.h> for the protocol. Three parties touch an mbp_mpi:
 *   - the controlling thread and, on rank 0, any submitting threads: submit, wait, drain, cancel;
 *   - the local pipeline's last worker (or its cancelling thread): on_result() queues a result to send;
 *   - the communication thread: the link loop (link_loop), the only code here that calls MPI.
 * They share `lock` (the send queue, rank 0's table of micro-batches in flight, the run's state); the
 * loop keeps its requests and slots to itself. Nothing is allocated per micro-batch.
 *
 * Rank 0's table holds every accepted micro-batch until it retires, indexed by its global sequence number
 * modulo opts.inflight: reserved by a submitter, in flight once submitted locally, done when its result
 * (or its failure) arrives, then retired strictly in sequence order by whichever thread holds the
 * `retiring` token, so that jobs complete and single results are delivered in submission order.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "affinity.h"
#include "common.h"
#include "mpi_internal.h"
#include "wait.h"

enum { TAG_HDR = 1, TAG_DATA = 2, TAG_CREDIT = 3, TAG_CTRL = 4 };
enum { CMD_NONE = 0, CMD_HB = 1, CMD_CANCEL = 2, CMD_STOP = 3, CMD_STOPPED = 4 };
enum { S_NEW = 0, S_RUNNING = 1, S_ENDED = 2 };
enum { T_FREE = 0, T_RESERVED, T_INFLIGHT, T_DONE, T_VOID };
enum { R_FREE = 0, R_POSTED, R_PAYLOAD, R_HELD };

#define MAX_RANKS    MBP_MAX_STAGES
#define RESULT_STAGE (UINT32_MAX - 1) /* marks rank 0's result buffers (mbp_mpi_mb_release) */
#define RETIRE_BATCH 64
#define CTRL_PEERS   MAX_RANKS

/* The header of a micro-batch on the wire; its payload follows as a second message (TAG_DATA). */
struct hdr {
	uint64_t seq;	    /* global sequence number, assigned by rank 0 */
	uint64_t stamp;	    /* rank 0's clock at acceptance (ns) */
	uint32_t rows;	    /* rows in the payload */
	uint32_t row_bytes; /* bytes per row */
	int32_t status;	    /* 0, or the error that failed it (then the payload is empty) */
	uint32_t flags;
};
_Static_assert(sizeof(struct hdr) == 32, "the header is 32 bytes on the wire");

struct ctrl {
	uint32_t cmd;
	int32_t arg;
	mbp_mpi_rank_stats st; /* CMD_STOPPED: the sender's counters */
};

/* A micro-batch to send on: a local result (mb set), or a header alone for one that failed before this
 * rank, whose receive slot `rslot` is re-posted once the header is out. */
struct qent {
	mbp_mb *mb;
	int rslot;
	struct hdr h;
};

struct sslot {
	struct hdr h;
	MPI_Request *req; /* its two in mp->sreq (header, payload): tested together in one call */
	mbp_mb *mb;
	int rslot;
	bool busy;
};

struct rslot {
	struct hdr h;
	MPI_Request hreq; /* persistent */
	MPI_Request dreq;
	bool hactive, dactive;
	mbp_mb *mb; /* ranks > 0: the pool buffer the payload lands in; rank 0: a result buffer (single) */
	int state;
};

/* Rank 0: one accepted micro-batch. */
struct tent {
	int state;
	int32_t status;
	uint64_t seq;
	mbp_job *job; /* NULL: a single micro-batch */
	uint32_t k;   /* index in its job */
	uint32_t rows;
	uint64_t user_seq; /* single: the caller's seq and tag, given back with the result */
	void *user;
	mbp_mb *res; /* single: its result buffer */
};

/* Per-peer control channel. */
struct ctl {
	int peer;
	struct ctrl in, out;
	MPI_Request rreq, sreq; /* rreq persistent */
	bool ractive, sactive;
	uint32_t pending; /* a command waiting for sreq */
	uint64_t last_heard, last_sent;
};

struct mbp_mpi {
	mbp_pipeline *p;
	mbp_opts lo;
	mbp_mpi_opts mo;
	mbp_result_fn user_on_result; /* rank 0 */
	void *user_arg;
	int rank, size;
	MPI_Comm comm;
	size_t in_rb, out_rb, final_rb; /* this rank's input and output row widths, the last rank's output */
	unsigned nstages;
	uint32_t max_rows;
	mbp_pool *res_pool; /* rank 0: result buffers of single micro-batches */
	uint64_t loop_ticket;

	pthread_mutex_t lock;
	pthread_cond_t cond; /* table, job completion, state */
	pthread_cond_t wake; /* the loop's park */
	bool sleeping;

	/* under lock: */
	int state;
	int run_err;
	char err[192];
	bool stop_accepting, cancel_req, end_req, dead, cancelled, stopped;
	struct qent *q;
	uint32_t qcap, qhead, qn;
	struct tent *tab;
	uint32_t tcap;
	uint64_t next_seq, next_retire;
	bool retiring, retire_again;
	uint64_t jobs_accepted, jobs_completed, jobs_failed, next_job_id;
	uint64_t mbs_accepted, mbs_completed, mbs_failed, rows_completed;
	mbp_mpi_rank_stats rs[MAX_RANKS];
	uint32_t reported;

	/* the loop's own (communication thread) */
	int up, down;
	struct sslot *ss;
	MPI_Request *sreq; /* 2 x window: the send slots' requests */
	int *sdone;	   /* MPI_Testsome's indices */
	struct rslot *rs_slots;
	int *fifo; /* receive slots in posting order */
	uint32_t fhead, fn;
	uint32_t credits;
	uint32_t credit_in;
	MPI_Request credit_rreq;
	bool credit_ractive;
	uint32_t credit_owed, credit_out;
	MPI_Request credit_sreq;
	bool credit_sactive;
	bool credit_stalled;
	struct ctl ctl[CTRL_PEERS];
	unsigned nctl;
	atomic_uint_least64_t passed, sent, received, credit_waits;
};

void mbp_mpi_opts_init(mbp_mpi_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->window = 8;
	o->inflight = 512;
	o->peer_timeout_ns = 10 * (int64_t)1000000000;
	o->spin_ns = 20000;
	o->idle_ns = 200000;
}

void mbp__mpi_opts_fill(mbp_mpi_opts *o)
{
	mbp_mpi_opts d;
	mbp_mpi_opts_init(&d);
	MBP__DEFAULT(o, &d, window);
	MBP__DEFAULT(o, &d, inflight);
	MBP__DEFAULT(o, &d, peer_timeout_ns);
	/* as the waits take it (MBP_SPIN_NONE: parks right after its last event); so once per struct */
	o->spin_ns = mbp__wait_budget(o->spin_ns, d.spin_ns);
	MBP__DEFAULT(o, &d, idle_ns);
}

static void wake_loop_locked(mbp_mpi *mp)
{
	if (mp->sleeping)
		pthread_cond_signal(&mp->wake);
}

/* Wait on mp->cond until `deadline` (NULL: without limit). @return false on timeout. */
static bool cond_wait_until(mbp_mpi *mp, const struct timespec *deadline)
{
	if (!deadline) {
		pthread_cond_wait(&mp->cond, &mp->lock);
		return true;
	}
	return pthread_cond_timedwait(&mp->cond, &mp->lock, deadline) != ETIMEDOUT;
}

/* ---- the local pipeline's results ---- */

/* opts.on_result of every rank's local pipeline: queue the result for the link (the loop sends it). */
static void on_result(void *arg, mbp_mb *mb)
{
	mbp_mpi *mp = arg;
	pthread_mutex_lock(&mp->lock);
	if (mp->state != S_RUNNING || mp->dead) {
		/* the run is over (a rank went silent): rank 0 failed this one already */
		pthread_mutex_unlock(&mp->lock);
		mbp_mb_release(mp->p, mb);
		return;
	}
	MBP_VERIFY(mp->qn < mp->qcap); /* each entry holds one of the pipeline's buffers or a slot */
	struct qent *e = &mp->q[(mp->qhead + mp->qn++) % mp->qcap];
	e->mb = mb;
	e->rslot = -1;
	e->h = (struct hdr){.seq = mb->seq,
			    .stamp = (uint64_t)(uintptr_t)mb->user,
			    .rows = mb->rows,
			    .row_bytes = mb->row_bytes,
			    .status = mb->status};
	wake_loop_locked(mp);
	pthread_mutex_unlock(&mp->lock);
}

/* ---- construction ---- */

int mbp_mpi_new(mbp_mpi **out, const mbp_opts *local, const mbp_mpi_opts *mo)
{
	if (!out || !local)
		return -EINVAL;
	*out = NULL;
	if (!mbp__mpi_started())
		return -ENOTCONN;
	int rank = mbp_mpi_rank(), size = mbp_mpi_size();
	if (size > MAX_RANKS)
		return -ERANGE;
	if (rank != 0 && local->on_result)
		return -EINVAL;
	mbp_mpi *mp = calloc(1, sizeof(*mp));
	if (!mp)
		return -ENOMEM;
	if (mo)
		mp->mo = *mo;
	mbp__mpi_opts_fill(&mp->mo);
	if (mp->mo.window > 1024 || mp->mo.inflight < mp->mo.window) {
		free(mp);
		return -EINVAL;
	}
	mp->rank = rank;
	mp->size = size;
	mp->lo = *local;
	mbp__opts_fill(&mp->lo); /* a field's 0 is its default: mb_buffers and pool_bytes are read here */
	mp->user_on_result = local->on_result;
	mp->user_arg = local->on_result_arg;
	mp->lo.on_result = on_result;
	mp->lo.on_result_arg = mp;
	mp->comm = MPI_COMM_NULL;
	mp->in_rb = mp->out_rb = local->in_row_bytes;
	mbp__mpi_sync_init(&mp->lock, &mp->cond, &mp->wake);
	int rc = mbp_pipeline_new(&mp->p, &mp->lo);
	if (rc) {
		mbp_mpi_destroy(mp);
		return rc;
	}
	*out = mp;
	return 0;
}

int mbp_mpi_add_stage(mbp_mpi *mp, const mbp_stage_desc *d)
{
	if (!mp || !d || mp->state != S_NEW)
		return -EINVAL;
	int rc = mbp_pipeline_add_stage(mp->p, d);
	if (rc == 0) {
		if (d->out_row_bytes)
			mp->out_rb = d->out_row_bytes;
		mp->nstages++;
	}
	return rc;
}

mbp_pipeline *mbp_mpi_pipeline(mbp_mpi *mp)
{
	return mp ? mp->p : NULL;
}

const char *mbp_mpi_error(const mbp_mpi *mp)
{
	return mp ? mp->err : "";
}

/* ---- start: the handshake on the communication thread ---- */

struct hs {
	mbp_mpi *mp;
	int local_rc;
	uint64_t mine[6];
	uint64_t all[MAX_RANKS * 6];
};

static int handshake_task(void *arg)
{
	struct hs *h = arg;
	mbp_mpi *mp = h->mp;
	if (MPI_Comm_dup(MPI_COMM_WORLD, &mp->comm) != MPI_SUCCESS)
		return -EIO;
	if (MPI_Allgather(h->mine, 6, MPI_UINT64_T, h->all, 6, MPI_UINT64_T, mp->comm) != MPI_SUCCESS)
		return -EIO;
	return 0;
}

static int free_comm_task(void *arg)
{
	mbp_mpi *mp = arg;
	if (mp->comm != MPI_COMM_NULL)
		MPI_Comm_free(&mp->comm);
	return 0;
}

static int link_loop(void *arg);

static int check_handshake(mbp_mpi *mp, const struct hs *h)
{
	for (int r = 0; r < mp->size; r++) {
		const uint64_t *v = &h->all[r * 6];
		if ((int64_t)v[4] < 0) {
			snprintf(mp->err, sizeof(mp->err), "rank %d failed to start its pipeline: %s", r,
				 mbp_strerror((int)(int64_t)v[4]));
			return (int)(int64_t)v[4];
		}
	}
	for (int r = 0; r < mp->size; r++) {
		const uint64_t *v = &h->all[r * 6], *n = &h->all[((r + 1) % mp->size) * 6];
		if (v[2] != h->all[2] || v[3] != h->all[3]) {
			snprintf(mp->err, sizeof(mp->err),
				 "rank %d has max_mb_rows %llu and window %llu, rank 0 %llu and %llu", r,
				 (unsigned long long)v[2], (unsigned long long)v[3],
				 (unsigned long long)h->all[2], (unsigned long long)h->all[3]);
			return -EINVAL;
		}
		if (r + 1 < mp->size && v[1] != n[0]) {
			snprintf(mp->err, sizeof(mp->err),
				 "rank %d's output rows are %llu bytes, rank %d's input rows %llu", r,
				 (unsigned long long)v[1], r + 1, (unsigned long long)n[0]);
			return -EINVAL;
		}
		if (v[5] > INT_MAX) {
			snprintf(mp->err, sizeof(mp->err), "rank %d's micro-batches exceed 2 GiB", r);
			return -E2BIG;
		}
	}
	mp->final_rb = h->all[(mp->size - 1) * 6 + 1];
	return 0;
}

static int alloc_run(mbp_mpi *mp)
{
	uint32_t W = mp->mo.window;
	mp->qcap = mp->lo.mb_buffers + W + 1;
	mp->q = calloc(mp->qcap, sizeof(*mp->q));
	mp->ss = calloc(W, sizeof(*mp->ss));
	mp->sreq = calloc(2 * (size_t)W, sizeof(*mp->sreq));
	mp->sdone = calloc(2 * (size_t)W, sizeof(*mp->sdone));
	mp->rs_slots = calloc(W, sizeof(*mp->rs_slots));
	mp->fifo = calloc(W, sizeof(*mp->fifo));
	if (!mp->q || !mp->ss || !mp->sreq || !mp->sdone || !mp->rs_slots || !mp->fifo)
		return -ENOMEM;
	if (mp->rank == 0) {
		mp->tcap = mp->mo.inflight;
		mp->tab = calloc(mp->tcap, sizeof(*mp->tab));
		if (!mp->tab)
			return -ENOMEM;
		mbp_pool_opts po;
		mbp_pool_opts_init(&po);
		po.buf_bytes = mp->final_rb * mp->max_rows;
		po.max_buffers = mp->tcap + W;
		po.max_bytes = mp->lo.pool_bytes;
		int rc = mbp_pool_new(&mp->res_pool, &po);
		if (rc)
			return rc;
	}
	return 0;
}

int mbp_mpi_start(mbp_mpi *mp)
{
	if (!mp)
		return -EINVAL;
	if (mp->state != S_NEW)
		return -EALREADY;
	mp->max_rows = mp->lo.max_mb_rows; /* filled in at new */
	/* collective: this rank's part of its node's CPUs first (pipeline.h, "Placement") */
	unsigned node_k, node_m;
	int local_rc = mbp__mpi_node_share(&node_k, &node_m);
	if (local_rc == 0)
		local_rc = mbp__pipeline_node_share(mp->p, node_k, node_m);
	if (local_rc == 0)
		local_rc = mp->nstages ? mbp_pipeline_start(mp->p) : -EINVAL;
	struct hs *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->mp = mp;
	/* in width, out width, max rows, window, local start status, largest message */
	h->mine[0] = mp->in_rb;
	h->mine[1] = mp->out_rb;
	h->mine[2] = mp->max_rows;
	h->mine[3] = mp->mo.window;
	h->mine[4] = (uint64_t)(int64_t)local_rc;
	h->mine[5] = (uint64_t)mp->out_rb * mp->max_rows;
	int rc = mbp__mpi_call(handshake_task, h);
	if (rc == 0)
		rc = check_handshake(mp, h);
	free(h);
	if (rc == 0)
		rc = alloc_run(mp);
	if (rc) {
		if (local_rc == 0)
			mbp_pipeline_cancel(mp->p);
		mbp__mpi_call(free_comm_task, mp);
		mp->state = S_ENDED;
		mp->run_err = rc;
		return rc;
	}
	mp->state = S_RUNNING;
	mp->loop_ticket = mbp__mpi_post(link_loop, mp);
	return 0;
}

/* ---- rank 0: the table and retiring ---- */

struct retired {
	struct tent t;
};

/* Mark a table entry done with `status` unless it is done already (a result raced a failure). */
static void entry_done_locked(mbp_mpi *mp, struct tent *t, int32_t status)
{
	if (t->state == T_RESERVED || t->state == T_INFLIGHT) {
		t->state = T_DONE;
		t->status = status;
	}
}

/* Account one micro-batch of a job (under lock); true when the job is now complete. */
static bool job_account_locked(mbp_mpi *mp, const struct tent *t)
{
	mbp_job *job = t->job;
	if (t->status) {
		if (job->status == 0)
			job->status = t->status;
		job->mbs_failed++;
	}
	if (--job->priv.opaque[0] != 0)
		return false;
	job->done_ns = mbp__now_ns();
	if (job->status)
		mp->jobs_failed++;
	else
		mp->jobs_completed++;
	return true;
}

/* Retire done entries in sequence order: jobs complete, single results reach on_result. Any thread;
 * one at a time (the `retiring` token), so order holds also while the callbacks run unlocked. */
static void retire(mbp_mpi *mp)
{
	struct tent batch[RETIRE_BATCH];
	bool job_done[RETIRE_BATCH];
	mbp_job_fn cb[RETIRE_BATCH];
	void *cb_arg[RETIRE_BATCH];
	pthread_mutex_lock(&mp->lock);
	if (mp->retiring) {
		mp->retire_again = true;
		pthread_mutex_unlock(&mp->lock);
		return;
	}
	mp->retiring = true;
	for (;;) {
		unsigned n = 0;
		mp->retire_again = false;
		while (n < RETIRE_BATCH && mp->next_retire < mp->next_seq) {
			struct tent *t = &mp->tab[mp->next_retire % mp->tcap];
			if (t->state != T_DONE && t->state != T_VOID)
				break;
			if (t->state == T_DONE) {
				if (t->status)
					mp->mbs_failed++;
				else {
					mp->mbs_completed++;
					mp->rows_completed += t->rows;
				}
				job_done[n] = t->job ? job_account_locked(mp, t) : false;
				batch[n++] = *t;
			}
			memset(t, 0, sizeof(*t));
			mp->next_retire++;
		}
		if (n == 0 && !mp->retire_again)
			break;
		/* Mark jobs done before the callbacks: a waiter may now look (broadcast below), and reuse or
		 * free its job at once, so the callback is read here, under the lock. */
		for (unsigned i = 0; i < n; i++) {
			cb[i] = NULL;
			if (job_done[i]) {
				cb[i] = batch[i].job->cb;
				cb_arg[i] = batch[i].job->cb_arg;
				batch[i].job->priv.opaque[1] = 1;
			}
		}
		pthread_cond_broadcast(&mp->cond);
		pthread_mutex_unlock(&mp->lock);
		for (unsigned i = 0; i < n; i++) {
			struct tent *t = &batch[i];
			if (t->job) {
				if (cb[i])
					cb[i](t->job, cb_arg[i]);
				continue;
			}
			mbp_mb *r = t->res;
			if (!r && mbp_pool_get(mp->res_pool, NULL, &r, -1) != 0)
				MBP_VERIFY(!"a result buffer for a failed micro-batch");
			r->rows = t->rows;
			r->row_bytes = (uint32_t)mp->final_rb;
			r->status = t->status;
			r->stage = RESULT_STAGE;
			r->seq = t->user_seq;
			r->user = t->user;
			r->job = NULL;
			r->carry = NULL;
			mp->user_on_result(mp->user_arg, r);
		}
		pthread_mutex_lock(&mp->lock);
	}
	mp->retiring = false;
	pthread_mutex_unlock(&mp->lock);
}

/* Reserve the next sequence number (under lock): waits for its table entry to be free. */
static int reserve_locked(mbp_mpi *mp, bool continuing, const struct timespec *deadline, int64_t timeout_ns,
			  uint64_t *seq)
{
	for (;;) {
		if (mp->state != S_RUNNING)
			return mp->state == S_NEW ? -ENOTCONN : -ESHUTDOWN;
		if (mp->dead || (!continuing && mp->stop_accepting))
			return -ESHUTDOWN;
		struct tent *t = &mp->tab[mp->next_seq % mp->tcap];
		if (t->state == T_FREE) {
			*seq = mp->next_seq++;
			t->state = T_RESERVED;
			t->seq = *seq;
			return 0;
		}
		if (timeout_ns == 0)
			return -EAGAIN;
		if (!cond_wait_until(mp, deadline))
			return -ETIMEDOUT;
	}
}

/* Reserve the sequence number of new work (a job's first micro-batch, a single one): on success the
 * lock is held. */
static int reserve_first(mbp_mpi *mp, int64_t timeout_ns, uint64_t *seq)
{
	struct timespec dl;
	if (timeout_ns > 0)
		mbp__mpi_deadline(timeout_ns, &dl);
	pthread_mutex_lock(&mp->lock);
	int rc = reserve_locked(mp, false, timeout_ns > 0 ? &dl : NULL, timeout_ns, seq);
	if (rc)
		pthread_mutex_unlock(&mp->lock);
	return rc;
}

/* A reserved entry's micro-batch went into the local pipeline (rc 0) or could not (rc: its error). Once
 * in, it may cross every rank and come back before this runs (the submitter was preempted), and a run that
 * dies fails every entry: either way its entry may be done or already retired, its slot reused. */
static void entry_submitted(mbp_mpi *mp, uint64_t seq, int rc)
{
	pthread_mutex_lock(&mp->lock);
	if (seq < mp->next_retire) { /* or the run died and failed it (then rc may be its error too) */
		pthread_mutex_unlock(&mp->lock);
		return;
	}
	struct tent *t = &mp->tab[seq % mp->tcap];
	MBP_VERIFY(t->seq == seq);
	if (rc)
		entry_done_locked(mp, t, rc == -ESHUTDOWN ? -ECANCELED : rc);
	else if (mp->dead)
		entry_done_locked(mp, t, mp->run_err);
	else if (t->state == T_RESERVED)
		t->state = T_INFLIGHT;
	bool done = t->state == T_DONE;
	pthread_mutex_unlock(&mp->lock);
	if (done)
		retire(mp);
}

/* An input buffer of the local pipeline, waiting in slices so that a run that ends is noticed. */
static int acquire_input(mbp_mpi *mp, mbp_mb **mb)
{
	for (;;) {
		int rc = mbp_mb_acquire(mp->p, mb, 10 * 1000000);
		if (rc != -ETIMEDOUT)
			return rc;
		pthread_mutex_lock(&mp->lock);
		bool dead = mp->dead;
		pthread_mutex_unlock(&mp->lock);
		if (dead)
			return -ESHUTDOWN;
	}
}

static int check_rank0(const mbp_mpi *mp)
{
	if (!mp)
		return -EINVAL;
	if (mp->rank != 0)
		return -EPERM;
	if (mp->state == S_NEW)
		return -ENOTCONN;
	return 0;
}

int mbp_mpi_job_submit(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns)
{
	int rc = check_rank0(mp);
	if (rc)
		return rc;
	if (!job || !job->in || !job->out || job->rows == 0 || job->mb_rows == 0)
		return -EINVAL;
	if (job->mb_rows > mp->max_rows)
		return -E2BIG;
	size_t nmb = (job->rows + job->mb_rows - 1) / job->mb_rows;
	if (nmb > UINT32_MAX)
		return -EINVAL;
	uint64_t seq;
	rc = reserve_first(mp, timeout_ns, &seq);
	if (rc)
		return rc;
	job->status = 0;
	job->mbs = (uint32_t)nmb;
	job->mbs_failed = 0;
	job->id = mp->next_job_id++;
	job->submit_ns = mbp__now_ns();
	job->done_ns = 0;
	job->priv.opaque[0] = nmb; /* micro-batches not yet retired */
	job->priv.opaque[1] = 0;   /* done */
	mp->jobs_accepted++;
	mp->mbs_accepted += nmb;
	pthread_mutex_unlock(&mp->lock);

	const char *in = job->in;
	for (uint32_t k = 0; k < nmb; k++) {
		if (k > 0) {
			pthread_mutex_lock(&mp->lock);
			rc = reserve_locked(mp, true, NULL, -1, &seq);
			pthread_mutex_unlock(&mp->lock);
			if (rc) {
				/* the run ended under this job: its rest fails without entries */
				pthread_mutex_lock(&mp->lock);
				int err = mp->dead ? mp->run_err : -ECANCELED;
				mp->mbs_failed += nmb - k;
				job->mbs_failed += (uint32_t)(nmb - k);
				if (job->status == 0)
					job->status = err;
				job->priv.opaque[0] -= nmb - k;
				bool done = job->priv.opaque[0] == 0;
				mbp_job_fn cb = done ? job->cb : NULL; /* read before a waiter may see done */
				void *cb_arg = job->cb_arg;
				if (done) {
					job->done_ns = mbp__now_ns();
					mp->jobs_failed++;
					job->priv.opaque[1] = 1;
					pthread_cond_broadcast(&mp->cond);
				}
				pthread_mutex_unlock(&mp->lock);
				if (cb)
					cb(job, cb_arg);
				return 0;
			}
		}
		size_t row0 = (size_t)k * job->mb_rows;
		size_t rows = job->rows - row0 < job->mb_rows ? job->rows - row0 : job->mb_rows;
		pthread_mutex_lock(&mp->lock);
		struct tent *t = &mp->tab[seq % mp->tcap];
		t->job = job;
		t->k = k;
		t->rows = (uint32_t)rows;
		pthread_mutex_unlock(&mp->lock);
		mbp_mb *mb;
		rc = acquire_input(mp, &mb);
		if (rc == 0) {
			memcpy(mb->data, in + row0 * mp->in_rb, rows * mp->in_rb);
			mb->rows = (uint32_t)rows;
			mb->seq = seq;
			mb->user = (void *)(uintptr_t)job->submit_ns;
			rc = mbp_mb_submit(mp->p, mb, -1);
			if (rc)
				mbp_mb_release(mp->p, mb);
		}
		entry_submitted(mp, seq, rc);
	}
	return 0;
}

int mbp_mpi_job_wait(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns)
{
	if (!mp || !job)
		return -EINVAL;
	struct timespec dl;
	if (timeout_ns > 0)
		mbp__mpi_deadline(timeout_ns, &dl);
	int rc = 0;
	pthread_mutex_lock(&mp->lock);
	while (!job->priv.opaque[1]) {
		if (timeout_ns == 0 || !cond_wait_until(mp, timeout_ns > 0 ? &dl : NULL)) {
			rc = job->priv.opaque[1] ? 0 : -ETIMEDOUT;
			break;
		}
	}
	pthread_mutex_unlock(&mp->lock);
	return rc;
}

int mbp_mpi_run(mbp_mpi *mp, const void *in, void *out, size_t rows, uint32_t mb_rows)
{
	mbp_job job;
	mbp_job_init(&job, in, out, rows, mb_rows);
	int rc = mbp_mpi_job_submit(mp, &job, -1);
	if (rc)
		return rc;
	mbp_mpi_job_wait(mp, &job, -1);
	return job.status;
}

int mbp_mpi_mb_acquire(mbp_mpi *mp, mbp_mb **mb, int64_t timeout_ns)
{
	int rc = check_rank0(mp);
	return rc ? rc : mbp_mb_acquire(mp->p, mb, timeout_ns);
}

int mbp_mpi_mb_submit(mbp_mpi *mp, mbp_mb *mb, int64_t timeout_ns)
{
	int rc = check_rank0(mp);
	if (rc)
		return rc;
	if (!mb || !mp->user_on_result || mb->rows == 0 || mb->rows > mp->max_rows)
		return -EINVAL;
	uint64_t seq;
	rc = reserve_first(mp, timeout_ns, &seq);
	if (rc)
		return rc;
	struct tent *t = &mp->tab[seq % mp->tcap];
	t->rows = mb->rows;
	t->user = mb->user;
	t->user_seq = mb->seq;
	mp->mbs_accepted++; /* taken back below if the local submit refuses it */
	pthread_mutex_unlock(&mp->lock);
	mb->seq = seq;
	mb->user = (void *)(uintptr_t)mbp__now_ns();
	rc = mbp_mb_submit(mp->p, mb, timeout_ns);
	if (rc) {
		pthread_mutex_lock(&mp->lock);
		/* A run that died (a silent rank) fails every entry; this one may be retired already, its
		 * failure delivered through on_result: then it counts as accepted and the buffer is ours. */
		bool retired = seq < mp->next_retire;
		if (!retired) {
			mb->seq = t->user_seq;
			mb->user = t->user;
			t->state = T_VOID; /* never accepted: retired without a trace */
			mp->mbs_accepted--;
		}
		pthread_mutex_unlock(&mp->lock);
		if (retired) {
			mbp_mb_release(mp->p, mb);
			return 0;
		}
		retire(mp);
		return rc;
	}
	entry_submitted(mp, seq, 0);
	return 0;
}

void mbp_mpi_mb_release(mbp_mpi *mp, mbp_mb *mb)
{
	if (!mp || !mb)
		return;
	if (mb->stage == RESULT_STAGE)
		mbp_pool_put(mp->res_pool, NULL, mb);
	else
		mbp_mb_release(mp->p, mb);
}

/* ---- the link loop (communication thread only) ---- */

static void fifo_push(mbp_mpi *mp, int i)
{
	mp->fifo[(mp->fhead + mp->fn++) % mp->mo.window] = i;
}

static void fifo_pop(mbp_mpi *mp)
{
	mp->fhead = (mp->fhead + 1) % mp->mo.window;
	mp->fn--;
}

static int fifo_at(const mbp_mpi *mp, uint32_t j)
{
	return mp->fifo[(mp->fhead + j) % mp->mo.window];
}

/* Ranks > 0: post slot i's header and payload receives, the payload straight into its pool buffer. */
static void post_forward(mbp_mpi *mp, int i)
{
	struct rslot *r = &mp->rs_slots[i];
	size_t cap = r->mb->capacity < INT_MAX ? r->mb->capacity : INT_MAX;
	MPI_Start(&r->hreq);
	MPI_Irecv(r->mb->data, (int)cap, MPI_BYTE, mp->up, TAG_DATA, mp->comm, &r->dreq);
	r->hactive = r->dactive = true;
	r->state = R_POSTED;
	fifo_push(mp, i);
}

/* Rank 0: post slot i's header receive (the payload's place is known once the header is in). */
static void post_result(mbp_mpi *mp, int i)
{
	struct rslot *r = &mp->rs_slots[i];
	MPI_Start(&r->hreq);
	r->hactive = true;
	r->state = R_POSTED;
	fifo_push(mp, i);
}

/* A local buffer whose send is done: straight into a free receive slot (no trip through the pool, and
 * the way slots get buffers back once a cancelled pipeline refuses mbp_mb_acquire), else released. */
static void recycle(mbp_mpi *mp, mbp_mb *mb)
{
	if (mp->rank != 0)
		for (uint32_t i = 0; i < mp->mo.window; i++)
			if (mp->rs_slots[i].state == R_FREE) {
				mp->rs_slots[i].mb = mb;
				post_forward(mp, (int)i);
				return;
			}
	mbp_mb_release(mp->p, mb);
}

static bool fill_free_slots(mbp_mpi *mp)
{
	bool act = false;
	for (uint32_t i = 0; i < mp->mo.window; i++) {
		struct rslot *r = &mp->rs_slots[i];
		if (r->state != R_FREE)
			continue;
		if (mbp_mb_acquire(mp->p, &r->mb, 0) != 0)
			break;
		post_forward(mp, (int)i);
		act = true;
	}
	return act;
}

/* One rank alone: a result is final here; copy it where rank 0 keeps results. */
static void retire_local(mbp_mpi *mp, const struct qent *e)
{
	pthread_mutex_lock(&mp->lock);
	struct tent *t = &mp->tab[e->h.seq % mp->tcap];
	MBP_VERIFY(t->seq == e->h.seq);
	size_t bytes = e->h.status ? 0 : (size_t)e->h.rows * e->h.row_bytes;
	void *dst = NULL;
	if (t->job) {
		dst = (char *)t->job->out + (size_t)t->k * t->job->mb_rows * mp->final_rb;
	} else {
		pthread_mutex_unlock(&mp->lock);
		mbp_mb *res;
		if (mbp_pool_get(mp->res_pool, NULL, &res, -1) != 0)
			MBP_VERIFY(!"a result buffer");
		pthread_mutex_lock(&mp->lock);
		t->res = res;
		dst = res->data;
	}
	if (bytes)
		memcpy(dst, e->mb->data, bytes);
	entry_done_locked(mp, t, e->h.status);
	pthread_mutex_unlock(&mp->lock);
	mbp_mb_release(mp->p, e->mb);
}

/* Start sends from the queue while credits and send slots last. */
static bool pump_sends(mbp_mpi *mp)
{
	bool act = false;
	for (;;) {
		struct qent e;
		pthread_mutex_lock(&mp->lock);
		if (mp->qn == 0) {
			pthread_mutex_unlock(&mp->lock);
			break;
		}
		if (mp->size > 1 && mp->credits == 0) {
			if (!mp->credit_stalled)
				/* relaxed: a statistic */
				atomic_fetch_add_explicit(&mp->credit_waits, 1, memory_order_relaxed);
			mp->credit_stalled = true;
			pthread_mutex_unlock(&mp->lock);
			break;
		}
		int s = -1;
		for (uint32_t i = 0; mp->size > 1 && i < mp->mo.window; i++)
			if (!mp->ss[i].busy) {
				s = (int)i;
				break;
			}
		if (mp->size > 1 && s < 0) {
			pthread_mutex_unlock(&mp->lock);
			break;
		}
		e = mp->q[mp->qhead];
		mp->qhead = (mp->qhead + 1) % mp->qcap;
		mp->qn--;
		pthread_mutex_unlock(&mp->lock);
		act = true;
		mp->credit_stalled = false;
		if (mp->size == 1) {
			retire_local(mp, &e);
			continue;
		}
		struct sslot *ss = &mp->ss[s];
		ss->h = e.h;
		ss->mb = e.mb;
		ss->rslot = e.rslot;
		ss->busy = true;
		size_t bytes = e.h.status ? 0 : (size_t)e.h.rows * e.h.row_bytes;
		MPI_Isend(&ss->h, sizeof(ss->h), MPI_BYTE, mp->down, TAG_HDR, mp->comm, &ss->req[0]);
		MPI_Isend(bytes ? e.mb->data : (void *)&ss->h, (int)bytes, MPI_BYTE, mp->down, TAG_DATA,
			  mp->comm, &ss->req[1]);
		mp->credits--;
		atomic_fetch_add_explicit(&mp->sent, 1, memory_order_relaxed); /* relaxed: a statistic */
	}
	return act;
}

/* Every send slot's requests in one MPI_Testsome: one pass of MPI's progress engine, not one per slot. */
static bool test_sends(mbp_mpi *mp)
{
	bool act = false;
	int n = 0;
	MPI_Testsome(2 * (int)mp->mo.window, mp->sreq, &n, mp->sdone, MPI_STATUSES_IGNORE);
	if (n == MPI_UNDEFINED || n == 0)
		return false;
	for (int k = 0; k < n; k++) {
		struct sslot *ss = &mp->ss[mp->sdone[k] / 2];
		if (!ss->busy || ss->req[0] != MPI_REQUEST_NULL || ss->req[1] != MPI_REQUEST_NULL)
			continue; /* the slot's other request is still going (or it was seen already) */
		ss->busy = false;
		act = true;
		if (ss->mb)
			recycle(mp, ss->mb);
		if (ss->rslot >= 0) {
			post_forward(mp, ss->rslot); /* the slot passed a failed header on: its turn again */
			mp->credit_owed++;
		}
	}
	return act;
}

/* A header that failed before this rank, or one this rank cannot take: on past the stages. */
static void pass_on(mbp_mpi *mp, int i)
{
	struct rslot *r = &mp->rs_slots[i];
	r->state = R_HELD;
	pthread_mutex_lock(&mp->lock);
	MBP_VERIFY(mp->qn < mp->qcap);
	struct qent *e = &mp->q[(mp->qhead + mp->qn++) % mp->qcap];
	e->mb = NULL;
	e->rslot = i;
	e->h = r->h;
	pthread_mutex_unlock(&mp->lock);
	atomic_fetch_add_explicit(&mp->passed, 1, memory_order_relaxed); /* relaxed: a statistic */
}

/* Ranks > 0: arrivals in posting order, each submitted to the local pipeline (or passed on). */
static bool test_forward(mbp_mpi *mp)
{
	bool act = false;
	while (mp->fn) {
		int i = fifo_at(mp, 0), flag = 0;
		struct rslot *r = &mp->rs_slots[i];
		MPI_Request rq[2] = {r->hactive ? r->hreq : MPI_REQUEST_NULL,
				     r->dactive ? r->dreq : MPI_REQUEST_NULL};
		MPI_Testall(2, rq, &flag, MPI_STATUSES_IGNORE);
		if (!flag)
			break;
		if (r->hactive || r->dactive)
			/* relaxed: a statistic */
			atomic_fetch_add_explicit(&mp->received, 1, memory_order_relaxed);
		r->hactive = r->dactive = false;
		r->dreq = MPI_REQUEST_NULL;
		act = true;
		if (r->h.status == 0) {
			mbp_mb *mb = r->mb;
			mb->rows = r->h.rows;
			mb->seq = r->h.seq;
			mb->user = (void *)(uintptr_t)r->h.stamp;
			int rc = mbp_mb_submit(mp->p, mb, 0);
			if (rc == -EAGAIN)
				break; /* the local pipeline is full: stays at the head, no credit back */
			if (rc == 0) {
				fifo_pop(mp);
				r->mb = NULL;
				r->state = R_FREE;
				mp->credit_owed++;
				continue;
			}
			r->h.status = rc == -ESHUTDOWN ? -ECANCELED : rc;
		}
		fifo_pop(mp);
		pass_on(mp, i);
	}
	return act;
}

/* Rank 0: result headers, then each payload straight into the job's rows or a result buffer. */
static bool test_results(mbp_mpi *mp)
{
	bool act = false, retired = false;
	for (uint32_t j = 0; j < mp->fn; j++) {
		struct rslot *r = &mp->rs_slots[fifo_at(mp, j)];
		if (r->state == R_POSTED) {
			int flag = 0;
			MPI_Test(&r->hreq, &flag, MPI_STATUS_IGNORE);
			if (!flag)
				break;
			r->hactive = false;
			r->state = R_HELD; /* header in, payload not posted */
			act = true;
		}
		if (r->state != R_HELD)
			continue;
		pthread_mutex_lock(&mp->lock);
		struct tent *t = &mp->tab[r->h.seq % mp->tcap];
		MBP_VERIFY(t->seq == r->h.seq && (t->state == T_RESERVED || t->state == T_INFLIGHT));
		MBP_VERIFY(r->h.status || (r->h.rows == t->rows && r->h.row_bytes == mp->final_rb));
		size_t bytes = r->h.status ? 0 : (size_t)r->h.rows * r->h.row_bytes;
		void *dst = &r->h;
		mbp_job *job = t->job;
		size_t off = job ? (size_t)t->k * job->mb_rows * mp->final_rb : 0;
		pthread_mutex_unlock(&mp->lock);
		if (job) {
			if (bytes)
				dst = (char *)job->out + off;
		} else {
			if (mbp_pool_get(mp->res_pool, NULL, &r->mb, 0) != 0)
				break; /* the caller holds every result buffer: try again later */
			if (bytes)
				dst = r->mb->data;
		}
		MPI_Irecv(dst, (int)bytes, MPI_BYTE, mp->up, TAG_DATA, mp->comm, &r->dreq);
		r->dactive = true;
		r->state = R_PAYLOAD;
	}
	while (mp->fn) {
		int i = fifo_at(mp, 0), flag = 0;
		struct rslot *r = &mp->rs_slots[i];
		if (r->state != R_PAYLOAD)
			break;
		MPI_Test(&r->dreq, &flag, MPI_STATUS_IGNORE);
		if (!flag)
			break;
		r->dactive = false;
		fifo_pop(mp);
		atomic_fetch_add_explicit(&mp->received, 1, memory_order_relaxed); /* relaxed: a statistic */
		pthread_mutex_lock(&mp->lock);
		struct tent *t = &mp->tab[r->h.seq % mp->tcap];
		if (!t->job)
			t->res = r->mb;
		entry_done_locked(mp, t, r->h.status);
		pthread_mutex_unlock(&mp->lock);
		r->mb = NULL;
		post_result(mp, i);
		mp->credit_owed++;
		act = retired = true;
	}
	if (retired)
		retire(mp);
	return act;
}

static bool credits_io(mbp_mpi *mp)
{
	bool act = false;
	int flag = 0;
	if (mp->credit_ractive) {
		MPI_Test(&mp->credit_rreq, &flag, MPI_STATUS_IGNORE);
		if (flag) {
			mp->credits += mp->credit_in;
			MPI_Start(&mp->credit_rreq);
			act = true;
			for (unsigned c = 0; c < mp->nctl; c++)
				if (mp->ctl[c].peer == mp->down)
					mp->ctl[c].last_heard = mbp__now_ns();
		}
	}
	if (mp->credit_sactive) {
		MPI_Test(&mp->credit_sreq, &flag, MPI_STATUS_IGNORE);
		if (flag)
			mp->credit_sactive = false;
	}
	if (!mp->credit_sactive && mp->credit_owed) {
		mp->credit_out = mp->credit_owed;
		mp->credit_owed = 0;
		MPI_Isend(&mp->credit_out, 1, MPI_UINT32_T, mp->up, TAG_CREDIT, mp->comm, &mp->credit_sreq);
		mp->credit_sactive = true;
		act = true;
	}
	return act;
}

static void local_rank_stats(mbp_mpi *mp, mbp_mpi_rank_stats *st)
{
	mbp_pipeline_stats ps;
	memset(st, 0, sizeof(*st));
	if (mbp_pipeline_stats_get(mp->p, &ps, NULL, 0) >= 0) {
		st->mbs_accepted = ps.mbs_accepted;
		st->mbs_completed = ps.mbs_completed;
		st->mbs_failed = ps.mbs_failed;
	}
	/* relaxed, each: statistics, written by the communication thread alone */
	st->passed = atomic_load_explicit(&mp->passed, memory_order_relaxed);
	st->sent = atomic_load_explicit(&mp->sent, memory_order_relaxed);
	st->received = atomic_load_explicit(&mp->received, memory_order_relaxed);
	st->credit_waits = atomic_load_explicit(&mp->credit_waits, memory_order_relaxed);
}

static const uint32_t cmd_order[] = {CMD_STOPPED, CMD_CANCEL, CMD_STOP, CMD_HB};

/* Control messages: receive, and send what is pending (one at a time per peer). */
static bool ctrl_io(mbp_mpi *mp, bool *leave)
{
	bool act = false;
	uint64_t now = mbp__now_ns();
	uint64_t hb = mp->mo.peer_timeout_ns > 0 ? (uint64_t)mp->mo.peer_timeout_ns / 4 : 0;
	for (unsigned c = 0; c < mp->nctl; c++) {
		struct ctl *k = &mp->ctl[c];
		int flag = 0;
		MPI_Test(&k->rreq, &flag, MPI_STATUS_IGNORE);
		if (flag) {
			act = true;
			k->last_heard = now;
			uint32_t cmd = k->in.cmd;
			mbp_mpi_rank_stats st = k->in.st;
			MPI_Start(&k->rreq);
			pthread_mutex_lock(&mp->lock);
			if (cmd == CMD_CANCEL) {
				mp->cancelled = true;
				pthread_cond_broadcast(&mp->cond);
			} else if (cmd == CMD_STOP) {
				k->pending |= 1u << CMD_STOPPED;
			} else if (cmd == CMD_STOPPED && k->peer < MAX_RANKS) {
				mp->rs[k->peer] = st;
				mp->reported++;
			}
			pthread_mutex_unlock(&mp->lock);
		}
		if (k->sactive) {
			MPI_Test(&k->sreq, &flag, MPI_STATUS_IGNORE);
			if (flag) {
				k->sactive = false;
				if (k->out.cmd == CMD_STOPPED)
					*leave = true; /* this rank's last word */
			}
		}
		if (hb && now - k->last_sent >= hb)
			k->pending |= 1u << CMD_HB;
		if (!k->sactive && k->pending) {
			for (unsigned o = 0; o < MBP_ARRAY_SIZE(cmd_order); o++) {
				uint32_t bit = 1u << cmd_order[o];
				if (!(k->pending & bit))
					continue;
				k->pending &= ~bit;
				memset(&k->out, 0, sizeof(k->out));
				k->out.cmd = cmd_order[o];
				if (k->out.cmd == CMD_STOPPED)
					local_rank_stats(mp, &k->out.st);
				MPI_Isend(&k->out, sizeof(k->out), MPI_BYTE, k->peer, TAG_CTRL, mp->comm,
					  &k->sreq);
				k->sactive = true;
				k->last_sent = now;
				act = true;
				break;
			}
		}
	}
	return act;
}

/* A peer silent past the timeout ends the run. @return true when one did. */
static bool watchdog(mbp_mpi *mp)
{
	if (mp->mo.peer_timeout_ns < 0)
		return false;
	uint64_t now = mbp__now_ns();
	for (unsigned c = 0; c < mp->nctl; c++) {
		struct ctl *k = &mp->ctl[c];
		if (now - k->last_heard <= (uint64_t)mp->mo.peer_timeout_ns)
			continue;
		pthread_mutex_lock(&mp->lock);
		mp->dead = true;
		mp->run_err = -ETIMEDOUT;
		snprintf(mp->err, sizeof(mp->err),
			 "rank %d stopped answering: nothing heard from it for %.1f s", k->peer,
			 (double)(now - k->last_heard) / 1e9);
		if (mp->rank == 0)
			for (uint64_t s = mp->next_retire; s < mp->next_seq; s++)
				entry_done_locked(mp, &mp->tab[s % mp->tcap], -ETIMEDOUT);
		pthread_cond_broadcast(&mp->cond);
		pthread_mutex_unlock(&mp->lock);
		fprintf(stderr, "mbpipe-mpi: rank %d: %s\n", mp->rank, mp->err);
		mbp__mpi_abort_at_end();
		return true;
	}
	return false;
}

static void setup_loop(mbp_mpi *mp)
{
	uint32_t W = mp->mo.window;
	uint64_t now = mbp__now_ns();
	mp->up = (mp->rank + mp->size - 1) % mp->size;
	mp->down = (mp->rank + 1) % mp->size;
	mp->credits = W;
	for (uint32_t i = 0; i < W; i++) {
		mp->ss[i].req = &mp->sreq[2 * i];
		mp->ss[i].req[0] = mp->ss[i].req[1] = MPI_REQUEST_NULL;
		mp->rs_slots[i].dreq = MPI_REQUEST_NULL;
	}
	if (mp->size == 1)
		return;
	for (uint32_t i = 0; i < W; i++) {
		struct rslot *r = &mp->rs_slots[i];
		MPI_Recv_init(&r->h, sizeof(r->h), MPI_BYTE, mp->up, TAG_HDR, mp->comm, &r->hreq);
		if (mp->rank == 0)
			post_result(mp, (int)i);
	}
	if (mp->rank != 0)
		fill_free_slots(mp);
	MPI_Recv_init(&mp->credit_in, 1, MPI_UINT32_T, mp->down, TAG_CREDIT, mp->comm, &mp->credit_rreq);
	MPI_Start(&mp->credit_rreq);
	mp->credit_ractive = true;
	mp->nctl = mp->rank == 0 ? (unsigned)mp->size - 1 : 1;
	for (unsigned c = 0; c < mp->nctl; c++) {
		struct ctl *k = &mp->ctl[c];
		k->peer = mp->rank == 0 ? (int)c + 1 : 0;
		k->last_heard = k->last_sent = now;
		MPI_Recv_init(&k->in, sizeof(k->in), MPI_BYTE, k->peer, TAG_CTRL, mp->comm, &k->rreq);
		MPI_Start(&k->rreq);
		k->ractive = true;
		k->sreq = MPI_REQUEST_NULL;
	}
}

static void teardown_loop(mbp_mpi *mp, bool dead)
{
	uint64_t dl = mbp__now_ns() + (dead ? 100 : 2000) * (uint64_t)1000000;
	if (mp->size > 1) {
		for (uint32_t i = 0; i < mp->mo.window; i++) {
			struct rslot *r = &mp->rs_slots[i];
			if (r->hactive)
				mbp__mpi_finish(&r->hreq, true, dl);
			if (r->dactive)
				mbp__mpi_finish(&r->dreq, true, dl);
			MPI_Request_free(&r->hreq);
			if (r->mb && mp->rank != 0)
				mbp_mb_release(mp->p, r->mb);
			else if (r->mb)
				mbp_pool_put(mp->res_pool, NULL, r->mb);
			r->mb = NULL;
			struct sslot *ss = &mp->ss[i];
			if (ss->busy) {
				mbp__mpi_finish(&ss->req[0], false, dl);
				mbp__mpi_finish(&ss->req[1], false, dl);
				if (ss->mb)
					mbp_mb_release(mp->p, ss->mb);
				ss->busy = false;
			}
		}
		if (mp->credit_ractive)
			mbp__mpi_finish(&mp->credit_rreq, true, dl);
		MPI_Request_free(&mp->credit_rreq);
		if (mp->credit_sactive)
			mbp__mpi_finish(&mp->credit_sreq, false, dl);
		for (unsigned c = 0; c < mp->nctl; c++) {
			struct ctl *k = &mp->ctl[c];
			mbp__mpi_finish(&k->rreq, true, dl);
			MPI_Request_free(&k->rreq);
			if (k->sactive)
				mbp__mpi_finish(&k->sreq, false, dl);
		}
	}
	pthread_mutex_lock(&mp->lock);
	while (mp->qn) {
		struct qent *e = &mp->q[mp->qhead];
		mp->qhead = (mp->qhead + 1) % mp->qcap;
		mp->qn--;
		if (e->mb)
			mbp_mb_release(mp->p, e->mb);
	}
	pthread_mutex_unlock(&mp->lock);
	if (!dead && mp->comm != MPI_COMM_NULL)
		MPI_Comm_free(&mp->comm);
}

/*
 * How long the loop parks, `quiet` ns after its last event. An arriving MPI message cannot wake it (shared
 * memory has no descriptor to wait on), so a park delays whatever arrives during it: parks grow with the
 * quiet time, a quarter of it from 1 us up to idle_ns, so an arrival after a gap g is seen within about
 * g / 4 (g / 8 on average), and a rank quiet for long polls every idle_ns, as before. Not a smaller share:
 * each park is a wake-up (about 10 us of CPU on a busy 2-CPU machine), and the parks of the ramp come on
 * top of the idle_ns ones in every quiet period.
 */
uint64_t mbp__mpi_park_ns(uint64_t quiet, uint64_t idle_ns)
{
	uint64_t ns = quiet / 4;
	return ns < 1000 ? 1000 : ns > idle_ns ? idle_ns : ns;
}

static int link_loop(void *arg)
{
	mbp_mpi *mp = arg;
	setup_loop(mp);
	uint64_t last_act = mbp__now_ns();
	bool stop_sent = false, cancel_sent = false, leave = false, dead = false;
	while (!leave) {
		mbp__mpi_check_abort();
		bool act = false;
		if (mp->size > 1) {
			act |= test_sends(mp);
			act |= mp->rank == 0 ? test_results(mp) : test_forward(mp);
			if (mp->rank != 0)
				act |= fill_free_slots(mp);
			act |= credits_io(mp);
		}
		act |= pump_sends(mp);
		if (mp->size > 1)
			act |= ctrl_io(mp, &leave);
		if (mp->rank == 0 && mp->size == 1)
			retire(mp);
		if (mp->size > 1 && watchdog(mp)) {
			dead = true;
			break;
		}
		pthread_mutex_lock(&mp->lock);
		if (mp->rank == 0) {
			if (mp->cancel_req && !cancel_sent) {
				for (unsigned c = 0; c < mp->nctl; c++)
					mp->ctl[c].pending |= 1u << CMD_CANCEL;
				cancel_sent = act = true;
			}
			if (mp->end_req && !stop_sent && mp->next_retire == mp->next_seq) {
				for (unsigned c = 0; c < mp->nctl; c++)
					mp->ctl[c].pending |= 1u << CMD_STOP;
				stop_sent = act = true;
			}
			if (stop_sent && mp->reported == (uint32_t)mp->size - 1) {
				bool quiet = true;
				for (unsigned c = 0; c < mp->nctl; c++)
					quiet &= !mp->ctl[c].sactive && !mp->ctl[c].pending;
				leave = quiet;
			}
		}
		uint64_t now = mbp__now_ns();
		if (act) {
			last_act = now;
		} else if (!leave && now - last_act > mp->mo.spin_ns && mp->qn == 0) {
			struct timespec dl;
			mbp__mpi_deadline((int64_t)mbp__mpi_park_ns(now - last_act, mp->mo.idle_ns), &dl);
			mp->sleeping = true;
			pthread_cond_timedwait(&mp->wake, &mp->lock, &dl);
			mp->sleeping = false;
		}
		pthread_mutex_unlock(&mp->lock);
		if (!act && !leave && mbp__now_ns() - last_act <= mp->mo.spin_ns)
			sched_yield();
	}
	teardown_loop(mp, dead);
	pthread_mutex_lock(&mp->lock);
	mp->state = S_ENDED;
	pthread_cond_broadcast(&mp->cond);
	pthread_mutex_unlock(&mp->lock);
	if (mp->rank == 0)
		retire(mp);
	return 0;
}

/* ---- ending a run ---- */

/* Rank 0, lock held: ask the loop to end the run once everything retired, and wait for it to end. */
static void end_run_locked(mbp_mpi *mp)
{
	mp->end_req = true;
	wake_loop_locked(mp);
	while (mp->state == S_RUNNING)
		pthread_cond_wait(&mp->cond, &mp->lock);
}

/* After the loop ended: the communication thread is free again; stop the local pipeline. */
static void after_loop(mbp_mpi *mp, bool cancel)
{
	if (mp->loop_ticket) {
		mbp__mpi_await(mp->loop_ticket);
		mp->loop_ticket = 0;
	}
	if (cancel)
		mbp_pipeline_cancel(mp->p);
	else if (mbp_pipeline_drain(mp->p, 5 * (int64_t)1000000000) != 0)
		mbp_pipeline_cancel(mp->p);
}

int mbp_mpi_drain(mbp_mpi *mp, int64_t timeout_ns)
{
	int rc = check_rank0(mp);
	if (rc)
		return rc;
	struct timespec dl;
	if (timeout_ns > 0)
		mbp__mpi_deadline(timeout_ns, &dl);
	pthread_mutex_lock(&mp->lock);
	if (mp->state == S_ENDED) {
		rc = mp->run_err;
		pthread_mutex_unlock(&mp->lock);
		after_loop(mp, mp->dead || mp->cancelled);
		return rc;
	}
	mp->stop_accepting = true;
	while (mp->next_retire != mp->next_seq && !mp->dead) {
		if (timeout_ns == 0 || !cond_wait_until(mp, timeout_ns > 0 ? &dl : NULL)) {
			if (mp->next_retire != mp->next_seq && !mp->dead) {
				pthread_mutex_unlock(&mp->lock);
				return -ETIMEDOUT;
			}
		}
	}
	end_run_locked(mp);
	rc = mp->run_err;
	bool dead = mp->dead;
	pthread_mutex_unlock(&mp->lock);
	after_loop(mp, dead);
	return rc;
}

int mbp_mpi_cancel(mbp_mpi *mp)
{
	int rc = check_rank0(mp);
	if (rc)
		return rc;
	pthread_mutex_lock(&mp->lock);
	if (mp->state == S_RUNNING) {
		mp->stop_accepting = true;
		mp->cancel_req = true;
		mp->cancelled = true;
		wake_loop_locked(mp);
		pthread_mutex_unlock(&mp->lock);
		/* fails what waits in the local pipeline; results travel on as failed headers */
		mbp_pipeline_cancel(mp->p);
		pthread_mutex_lock(&mp->lock);
		while (mp->next_retire != mp->next_seq && !mp->dead)
			pthread_cond_wait(&mp->cond, &mp->lock);
		end_run_locked(mp);
	}
	rc = mp->run_err;
	pthread_mutex_unlock(&mp->lock);
	after_loop(mp, true);
	return rc;
}

int mbp_mpi_wait(mbp_mpi *mp, int64_t timeout_ns)
{
	if (!mp)
		return -EINVAL;
	if (mp->rank == 0)
		return -EPERM;
	if (mp->state == S_NEW)
		return -ENOTCONN;
	struct timespec dl;
	if (timeout_ns > 0)
		mbp__mpi_deadline(timeout_ns, &dl);
	bool cancel_done = false;
	pthread_mutex_lock(&mp->lock);
	for (;;) {
		if (mp->cancelled && !cancel_done) {
			pthread_mutex_unlock(&mp->lock);
			mbp_pipeline_cancel(mp->p); /* rank 0 said so: fail what has not started here */
			cancel_done = true;
			pthread_mutex_lock(&mp->lock);
			continue;
		}
		if (mp->state == S_ENDED)
			break;
		if (timeout_ns == 0 || !cond_wait_until(mp, timeout_ns > 0 ? &dl : NULL)) {
			if (mp->state != S_ENDED && !(mp->cancelled && !cancel_done)) {
				pthread_mutex_unlock(&mp->lock);
				return -ETIMEDOUT;
			}
		}
	}
	int rc = mp->run_err ? mp->run_err : mp->cancelled ? -ECANCELED : 0;
	bool cancel = mp->dead || mp->cancelled;
	pthread_mutex_unlock(&mp->lock);
	after_loop(mp, cancel);
	return rc;
}

void mbp_mpi_destroy(mbp_mpi *mp)
{
	if (!mp)
		return;
	if (mp->state == S_RUNNING) {
		if (mp->rank == 0)
			mbp_mpi_cancel(mp);
		else
			mbp_mpi_wait(mp, -1);
	}
	if (mp->loop_ticket)
		after_loop(mp, true);
	mbp_pipeline_destroy(mp->p);
	if (mp->res_pool && mbp_pool_destroy(mp->res_pool) != 0)
		fprintf(stderr, "mbp_mpi_destroy: result buffers not released; leaked\n");
	pthread_cond_destroy(&mp->cond);
	pthread_cond_destroy(&mp->wake);
	pthread_mutex_destroy(&mp->lock);
	free(mp->q);
	free(mp->ss);
	free(mp->sreq);
	free(mp->sdone);
	free(mp->rs_slots);
	free(mp->fifo);
	free(mp->tab);
	free(mp);
}

int mbp_mpi_stats_get(mbp_mpi *mp, mbp_mpi_stats *st)
{
	if (!mp || !st)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&mp->lock);
	st->jobs_accepted = mp->jobs_accepted;
	st->jobs_completed = mp->jobs_completed;
	st->jobs_failed = mp->jobs_failed;
	st->mbs_accepted = mp->mbs_accepted;
	st->mbs_completed = mp->mbs_completed;
	st->mbs_failed = mp->mbs_failed;
	st->rows_completed = mp->rows_completed;
	st->ranks = (uint32_t)mp->size;
	st->reported = mp->reported + 1;
	for (int r = 0; r < mp->size; r++)
		st->rank[r] = mp->rs[r];
	pthread_mutex_unlock(&mp->lock);
	local_rank_stats(mp, &st->rank[mp->rank]);
	return 0;
}

/*
 * A pipeline across MPI ranks: each rank's local mbp_pipeline, linked rank to rank by a run (loop.c): a
 * link from each rank to the next, the last rank's back to rank 0. See <mbpipe/mpi.h> for the protocol.
 * Three parties touch an mbp_mpi: the controlling thread and, on rank 0, any submitting threads (submit,
 * wait, drain, cancel); the local pipeline's last worker (or its cancelling thread), which completes a
 * local micro-batch; the run's loop on the communication thread. They share the run's lock: the carriers,
 * the send queue, rank 0's table, the run's state. Nothing is allocated per micro-batch.
 *
 * Carriers. A micro-batch in this rank's local pipeline is a local job of one micro-batch, its input read
 * in place (where it arrived, the caller's buffer, a job's rows) and its output written straight into the
 * buffer that the link then sends (local_job). No copy, with one local stage too (a single micro-batch of
 * mbp_mb_submit() comes back in its caller's buffer, so one stage computes elsewhere and copies back: a
 * second pass over every byte, which halved the one-stage hop). A caller's micro-batch that carries
 * something for the stages (mb->carry, as mbp_model_mb_pin sets) goes in with mbp_mb_submit() instead and
 * is sent from its own buffer. A carrier holds a micro-batch's header and buffers from its submission
 * until its send is done; their number (opts.mb_buffers, at most two windows and one a local thread,
 * replicas included) bounds what a rank holds. On ranks > 0 the loop gets and gives back every buffer of the link's pool,
 * through a cache of its own (an arrival's buffer is the next receive's, as the pool's LIFO keeps it
 * hot).
 *
 * Rank 0's table holds every accepted micro-batch until it retires, indexed by its global sequence number
 * modulo opts.inflight: reserved by a submitter, in flight once submitted locally, done when its result
 * (or its failure) arrives, then retired strictly in sequence order by whichever thread holds the
 * `retiring` token, so that jobs complete and single results are delivered in submission order. A job's
 * own bookkeeping (its count of micro-batches to go, its first error, its completion and wait) is job.c's,
 * as for a local job.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "affinity.h"
#include "common.h"
#include "job.h"
#include "mpi_internal.h"
#include "pool_internal.h"

enum { T_FREE = 0, T_RESERVED, T_INFLIGHT, T_DONE, T_VOID };

#define RESULT_STAGE (UINT32_MAX - 1)
#define RETIRE_BATCH 64

struct carrier {
	mbp_job job;	      /* the local job of one micro-batch */
	struct mbp__hdr h;    /* seq and stamp from submission; status, rows and width of the result */
	mbp_mb *in;	      /* its input buffer until the local job is done (NULL: a job's rows) */
	mbp_mb *out;	      /* what is sent (NULL: a header alone) */
	struct carrier *next; /* in the free list or the send queue */
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

struct mbp_mpi {
	struct mbp__run r; /* first: the base */
	mbp_pipeline *p;
	mbp_opts lo;
	mbp_result_fn user_on_result; /* rank 0 */
	void *user_arg;
	size_t final_rb; /* the last rank's output rows */
	uint32_t max_rows;
	mbp_pool *pool;	       /* the link's buffers: arrivals and the local pipeline's results */
	mbp_pool *res_pool;    /* rank 0: results */
	mbp_pool *mb_pool;     /* the local pipeline's (mbp_mpi_mb_acquire) */
	mbp_pool_cache *cache; /* ranks > 0: the loop's cache of `pool` (it gets and puts them all there) */
	struct carrier *carriers;
	unsigned nthreads; /* the local stages' threads: the sum of their replicas (a stage without: one) */

	/* under r.lock: */
	bool stop_accepting, closing;
	bool test_quiet_free; /* tests: a freed carrier wakes no submitter (mbp__mpi_test_quiet_free) */
	struct carrier *free_c, *qhead, **qtail;
	uint32_t nfree_c, wake_c; /* carriers free; how many make a submitter waiting for one worth a wake */
	_Atomic uint32_t qn;	  /* the queue's length (written under the lock, read by the loop) */
	struct tent *tab;
	uint32_t tcap;
	uint64_t next_seq, next_retire;
	bool retiring, retire_again;
	/* submitters waiting in reserve(): for a carrier (without a deadline, with one), for an entry */
	unsigned reserving, reserving_timed, wait_entry;
	uint64_t next_job_id;
	mbp_mpi_stats st; /* rank 0's counters; rank[] and reported: the ranks' reports as they came in */

	bool arrived;		 /* the loop's: results came in this pass */
	_Atomic uint64_t passed; /* the loop writes, stats read */
};

static mbp_mpi *of(struct mbp__run *r)
{
	return mbp__container_of(r, mbp_mpi, r);
}

/* ---- carriers ---- */

/* A buffer of a carrier back where it came from: the link's pool (into `cache`: the loop's, or NULL on
 * another thread), or the caller's, lent to the run while a carrier holds it. */
static void give_back(mbp_mpi *mp, mbp_mb *mb, mbp_pool_cache *cache)
{
	if (mb && mbp__pool_owns(mp->pool, mb)) {
		mbp_pool_put(mp->pool, cache, mb);
	} else if (mb) {
		mbp__pool_unlend(mb);
		mbp_mb_release(mp->p, mb);
	}
}

/* A carrier done with: back to the free list, a submitter waiting for one told once a quarter of them
 * are free (the condition serves every wait of the run, and a wake-up per send is a context switch on
 * each side: a submitter that waits for carriers has a quarter of them in flight to wait for, and then
 * submits a quarter in a row), one with a deadline at once (batched, it could wait until its deadline
 * while carriers were free); then, unlocked, its buffers (`cache` as above). In that order: a
 * submitter that waits for a buffer, woken by its return, then finds a carrier, and the lock free. */
static void carrier_free(mbp_mpi *mp, struct carrier *c, mbp_pool_cache *cache)
{
	mbp_mb *out = c->out, *in = c->in;
	c->out = c->in = NULL;
	pthread_mutex_lock(&mp->r.lock);
	c->next = mp->free_c;
	mp->free_c = c;
	bool enough = ++mp->nfree_c >= mp->wake_c;
	if ((mp->reserving_timed || (enough && mp->reserving)) && !mp->test_quiet_free)
		pthread_cond_broadcast(&mp->r.cond);
	pthread_mutex_unlock(&mp->r.lock);
	give_back(mp, out, cache);
	give_back(mp, in, cache);
}

/* Queue a carrier for the link; a run that is over or ending (a rank went silent: rank 0 failed it
 * already) drops it. */
static void queue(mbp_mpi *mp, struct carrier *c)
{
	pthread_mutex_lock(&mp->r.lock);
	bool drop = mp->closing || mp->r.dead;
	if (!drop) {
		c->next = NULL;
		*mp->qtail = c;
		mp->qtail = &c->next;
		/* relaxed: written under the run's lock, which orders the queue itself; op_waiting's read
		 * without the lock is a hint, and the loop takes the lock before it dequeues */
		atomic_store_explicit(&mp->qn, atomic_load_explicit(&mp->qn, memory_order_relaxed) + 1,
				      memory_order_relaxed);
	}
	pthread_mutex_unlock(&mp->r.lock);
	if (drop)
		carrier_free(mp, c, NULL);
	else
		mbp__run_kick(&mp->r);
}

static struct carrier *dequeue(mbp_mpi *mp)
{
	pthread_mutex_lock(&mp->r.lock);
	struct carrier *c = mp->qhead;
	if (c && !(mp->qhead = c->next))
		mp->qtail = &mp->qhead;
	if (c) /* relaxed: under the run's lock, as in queue() above */
		atomic_store_explicit(&mp->qn, atomic_load_explicit(&mp->qn, memory_order_relaxed) - 1,
				      memory_order_relaxed);
	pthread_mutex_unlock(&mp->r.lock);
	return c;
}

/* A carrier's local job is done (its last worker, or its cancelling thread): its result goes on. */
static void job_done(mbp_job *job, void *arg)
{
	mbp_mpi *mp = arg;
	struct carrier *c = mbp__container_of(job, struct carrier, job);
	c->h.status = job->status;
	c->h.row_bytes = (uint32_t)mp->r.out_rb;
	if (c->in && !mbp__pool_owns(mp->pool, c->in)) { /* a caller's input: back to it now */
		give_back(mp, c->in, NULL);
		c->in = NULL;
	} /* an arrival's goes back to the loop's cache as the loop takes the carrier (op_next) */
	queue(mp, c);
}

/* The copying way in (a caller's micro-batch with a carry): opts.on_result of the local pipeline. */
static void on_result(void *arg, mbp_mb *mb)
{
	mbp_mpi *mp = arg;
	struct carrier *c = mb->user;
	c->h.status = mb->status;
	c->h.rows = mb->rows;
	c->h.row_bytes = mb->row_bytes;
	c->out = mb;
	mbp__pool_lend(mp->mb_pool, mb); /* the caller's again since deliver: the run's until it is sent */
	queue(mp, c);
}

/* Carrier c's micro-batch into the local pipeline: `in` (in buffer c->in, or a job's rows: c->in NULL),
 * its rows into c->out. The last of two or more local stages writes after the first has read, so into
 * c->in itself (as mbp_mb_submit's results come back in their own buffer); one stage, which reads as it
 * writes, into a buffer of the link's pool (from `cache` as give_back). On failure c is as it was. */
static int local_job(mbp_mpi *mp, struct carrier *c, const void *in, mbp_pool_cache *cache,
		     int64_t timeout_ns)
{
	bool same = mp->r.nstages > 1 && c->in;
	int rc = 0;
	if (same)
		c->out = c->in;
	else if ((rc = mbp_pool_get(mp->pool, cache, &c->out, timeout_ns)) != 0)
		c->out = NULL;
	if (rc)
		return rc;
	c->in = same ? NULL : c->in;
	mbp_job_init(&c->job, in, c->out->data, c->h.rows, c->h.rows);
	c->job.cb = job_done;
	c->job.cb_arg = mp;
	rc = mbp_job_submit(mp->p, &c->job, timeout_ns);
	if (rc) {
		if (same)
			c->in = c->out;
		else
			give_back(mp, c->out, cache);
		c->out = NULL;
	}
	return rc;
}

/* ---- construction ---- */

static const struct mbp__run_ops ops;

int mbp_mpi_new(mbp_mpi **out, const mbp_opts *local, const mbp_mpi_opts *mo)
{
	if (!out || !local)
		return -EINVAL;
	*out = NULL;
	if (mbp_mpi_rank() > 0 && local->on_result)
		return -EINVAL;
	struct mbp__run *r;
	int rc = mbp__run_new(&r, sizeof(mbp_mpi), &ops, mo, local->in_row_bytes);
	if (rc)
		return rc;
	mbp_mpi *mp = of(r);
	mp->lo = *local;
	mbp__opts_fill(&mp->lo); /* a field's 0 is its default: mb_buffers and pool_bytes are read here */
	mp->user_on_result = local->on_result;
	mp->user_arg = local->on_result_arg;
	mp->lo.on_result = on_result;
	mp->lo.on_result_arg = mp;
	mp->qtail = &mp->qhead;
	rc = mbp_pipeline_new(&mp->p, &mp->lo);
	if (rc) {
		mbp_mpi_destroy(mp);
		return rc;
	}
	*out = mp;
	return 0;
}

int mbp_mpi_add_stage(mbp_mpi *mp, const mbp_stage_desc *d)
{
	if (!mp || !d || mp->r.state != MBP__RUN_NEW)
		return -EINVAL;
	int rc = mbp__run_stage(&mp->r, mbp_pipeline_add_stage(mp->p, d), d->out_row_bytes);
	if (rc == 0)
		mp->nthreads += d->replicas ? d->replicas : 1;
	return rc;
}

mbp_pipeline *mbp_mpi_pipeline(mbp_mpi *mp)
{
	return mp ? mp->p : NULL;
}

const char *mbp_mpi_error(const mbp_mpi *mp)
{
	return mp ? mp->r.msg : "";
}

/* ---- start ---- */

static int alloc_run(mbp_mpi *mp)
{
	struct mbp__run *r = &mp->r;
	/* Carriers: mb_buffers at most, and no more than two windows and one a local thread (a stage's
	 * replicas each work on one; counting stages, 1 stage x 8 replicas at window 2 got 5 and 3 of its
	 * replicas starved): those beyond would only wait for the link, each holding a buffer, and cycle
	 * more buffers through the caches (the one-stage hop at 256 KiB: 64 carriers, 65 buffers of rank 0
	 * and 144 of rank 1 in turn) */
	uint32_t W = r->mo.window, nc = mp->lo.mb_buffers;
	if (nc > 2 * W + mp->nthreads)
		nc = 2 * W + mp->nthreads;
	size_t rb = mp->r.in_rb > mp->r.out_rb ? mp->r.in_rb : mp->r.out_rb;
	mp->mb_pool = mbp__pipeline_mb_pool(mp->p);
	if (!(mp->carriers = calloc(nc, sizeof(*mp->carriers))))
		return -ENOMEM;
	for (uint32_t i = 0; i < nc; i++) {
		mp->carriers[i].next = mp->free_c;
		mp->free_c = &mp->carriers[i];
	}
	mp->nfree_c = nc;
	mp->wake_c = nc / 4 ? nc / 4 : 1;
	int rc = mbp_pool_new(&mp->pool, &(mbp_pool_opts){.buf_bytes = rb * mp->max_rows,
							  .max_buffers = 2 * nc + W,
							  .max_bytes = mp->lo.pool_bytes});
	if (rc == 0 && r->rank == 0) {
		mp->tcap = r->mo.inflight;
		if (!(mp->tab = calloc(mp->tcap, sizeof(*mp->tab))))
			return -ENOMEM;
		rc = mbp_pool_new(&mp->res_pool, &(mbp_pool_opts){.buf_bytes = mp->final_rb * mp->max_rows,
								  .max_buffers = mp->tcap + W,
								  .max_bytes = mp->lo.pool_bytes});
		if (rc == 0) /* a result may come back without the handle (mbp_mpi_mb_release(NULL, mb)) */
			mbp__pool_publish(mp->res_pool, true);
	}
	if (rc == 0 && r->rank != 0)
		rc = mbp_pool_cache_new(mp->pool, &mp->cache);
	if (rc == 0) /* to the next rank, from the one before (one rank alone: to and from itself) */
		rc = mbp__run_link(r, true, (r->rank + 1) % r->size, NULL, NULL);
	if (rc == 0)
		rc = mbp__run_link(r, false, (r->rank + r->size - 1) % r->size,
				   r->rank == 0 ? mp->res_pool : mp->pool, mp->cache);
	return rc;
}

/* Every rank passed the checks of the start: its pipeline on its part of the node, the run's buffers. */
static int op_start(struct mbp__run *r, const uint64_t *all)
{
	mbp_mpi *mp = of(r);
	/* set here, past the start's -EALREADY, so that a second start writes nothing a submit reads */
	mp->max_rows = mp->lo.max_mb_rows;
	mp->final_rb = all[(size_t)(r->size - 1) * MBP__HS_SAME + MBP__HS_OUT];
	int rc = mbp__pipeline_node_share(mp->p, r->node_k, r->node_m);
	if (rc == 0)
		rc = mbp_pipeline_start(mp->p);
	return rc ? rc : alloc_run(mp);
}

int mbp_mpi_start(mbp_mpi *mp)
{
	if (!mp)
		return -EINVAL;
	uint32_t rows = mp->lo.max_mb_rows; /* filled in at new (mp->max_rows: at op_start) */
	uint64_t mine[MBP__HS_SAME] = {
	    [MBP__HS_IN] = mp->r.in_rb,
	    [MBP__HS_OUT] = mp->r.out_rb,
	    [MBP__HS_BYTES] = mbp__mul_sat(mp->r.in_rb > mp->r.out_rb ? mp->r.in_rb : mp->r.out_rb, rows),
	    [MBP__HS_ROWS] = rows};
	return mbp__run_start(&mp->r, mine, MBP__HS_SAME, 0, NULL, "micro-batches");
}

/* ---- rank 0: the table and retiring ---- */

/* Mark a table entry done with `status` unless it is done already (a result raced a failure). */
static void entry_done_locked(struct tent *t, int32_t status)
{
	if (t->state == T_RESERVED || t->state == T_INFLIGHT) {
		t->state = T_DONE;
		t->status = status;
	}
}

/* Retire done entries in sequence order: jobs complete, single results reach on_result. Any thread;
 * one at a time (the `retiring` token), so order holds also while the callbacks run unlocked. */
static void retire(mbp_mpi *mp)
{
	struct tent batch[RETIRE_BATCH];
	bool job_done[RETIRE_BATCH];
	pthread_mutex_lock(&mp->r.lock);
	if (mp->retiring) {
		mp->retire_again = true;
		pthread_mutex_unlock(&mp->r.lock);
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
					mp->st.mbs_failed++;
				else {
					mp->st.mbs_completed++;
					mp->st.rows_completed += t->rows;
				}
				/* a job's last micro-batch: its status set here, in order; completed below */
				job_done[n] =
				    t->job && mbp__job_left(t->job, 1, t->status != 0, t->status, t->k);
				if (job_done[n])
					++*(t->job->status ? &mp->st.jobs_failed : &mp->st.jobs_completed);
				batch[n++] = *t;
			}
			memset(t, 0, sizeof(*t));
			mp->next_retire++;
		}
		if (n == 0 && !mp->retire_again)
			break;
		/* those that wait for retired entries: a submitter for its entry, a drain for the last one */
		if (mp->wait_entry || mp->next_retire == mp->next_seq)
			pthread_cond_broadcast(&mp->r.cond);
		pthread_mutex_unlock(&mp->r.lock);
		for (unsigned i = 0; i < n; i++) {
			struct tent *t = &batch[i];
			if (t->job) {
				if (job_done[i])
					mbp__job_complete(t->job);
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
		pthread_mutex_lock(&mp->r.lock);
	}
	mp->retiring = false;
	pthread_mutex_unlock(&mp->r.lock);
}

/* Reserve the next sequence number and a carrier: waits for its table entry to be free and for a
 * carrier. `first`: new work (a job's first micro-batch, a single one), refused once draining; it takes the
 * lock, held on success. Otherwise a job's later micro-batch, the lock held, no timeout. */
static int reserve(mbp_mpi *mp, bool first, int64_t timeout_ns, uint64_t *seq, struct carrier **c)
{
	struct timespec ts;
	const struct timespec *dl = mbp__run_deadline(timeout_ns, &ts);
	int rc = 0;
	if (first)
		pthread_mutex_lock(&mp->r.lock);
	/* `late`: the wait timed out; one more look (a carrier may have come free as it did) */
	for (bool late = false; rc == 0;) {
		struct tent *t = mp->tab ? &mp->tab[mp->next_seq % mp->tcap] : NULL;
		if (mp->r.state != MBP__RUN_RUNNING)
			rc = mp->r.state == MBP__RUN_NEW ? -ENOTCONN : -ESHUTDOWN;
		else if (mp->r.dead || (first && mp->stop_accepting))
			rc = -ESHUTDOWN;
		else if (t->state == T_FREE && mp->free_c) {
			*seq = mp->next_seq++;
			t->state = T_RESERVED;
			t->seq = *seq;
			*c = mp->free_c;
			mp->free_c = (*c)->next;
			mp->nfree_c--;
			(*c)->h = (struct mbp__hdr){.seq = *seq, .tag = mbp__now_ns()};
			return 0;
		} else if (timeout_ns == 0 || late) {
			rc = timeout_ns == 0 ? -EAGAIN : -ETIMEDOUT;
		} else {
			unsigned *waiting = &mp->wait_entry;
			if (t->state == T_FREE)
				waiting = dl ? &mp->reserving_timed : &mp->reserving;
			++*waiting;
			late = !mbp__run_wait(&mp->r, dl);
			--*waiting;
		}
	}
	if (first)
		pthread_mutex_unlock(&mp->r.lock);
	return rc;
}

void mbp__mpi_test_quiet_free(mbp_mpi *mp, bool quiet)
{
	pthread_mutex_lock(&mp->r.lock);
	mp->test_quiet_free = quiet;
	pthread_mutex_unlock(&mp->r.lock);
}

unsigned mbp__mpi_test_reserving(mbp_mpi *mp)
{
	pthread_mutex_lock(&mp->r.lock);
	unsigned n = mp->reserving + mp->reserving_timed + mp->wait_entry;
	pthread_mutex_unlock(&mp->r.lock);
	return n;
}

/* A reserved entry's micro-batch went into the local pipeline (rc 0) or could not (rc: its error; then
 * its carrier comes back). Once in, it may cross every rank and come back before this runs (the
 * submitter was preempted), and a run that dies fails every entry: either way its entry may be done or
 * already retired, its slot reused. */
static void entry_submitted(mbp_mpi *mp, uint64_t seq, int rc, struct carrier *c)
{
	if (rc)
		carrier_free(mp, c, NULL);
	pthread_mutex_lock(&mp->r.lock);
	if (seq < mp->next_retire) { /* or the run died and failed it (then rc may be its error too) */
		pthread_mutex_unlock(&mp->r.lock);
		return;
	}
	struct tent *t = &mp->tab[seq % mp->tcap];
	MBP_VERIFY(t->seq == seq);
	if (rc)
		entry_done_locked(t, rc == -ESHUTDOWN ? -ECANCELED : rc);
	else if (mp->r.dead)
		entry_done_locked(t, mp->r.err);
	else if (t->state == T_RESERVED)
		t->state = T_INFLIGHT;
	bool done = t->state == T_DONE;
	pthread_mutex_unlock(&mp->r.lock);
	if (done)
		retire(mp);
}

static int check_rank0(mbp_mpi *mp)
{
	return mbp__run_check(mp ? &mp->r : NULL, MBP__RUN_RANK0, true);
}

int mbp_mpi_job_submit(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns)
{
	int rc = check_rank0(mp);
	if (rc)
		return rc;
	uint32_t nmb;
	uint64_t seq;
	struct carrier *c;
	if ((rc = mbp__job_check(mp->p, job, &nmb)) || (rc = reserve(mp, true, timeout_ns, &seq, &c)))
		return rc;
	mbp__job_begin(job, nmb, ++mp->next_job_id);
	mp->st.jobs_accepted++;
	mp->st.mbs_accepted += nmb;
	for (uint32_t k = 0; k < nmb; k++) {
		if (k > 0 && reserve(mp, false, -1, &seq, &c) != 0) {
			/* the run ended under it: micro-batches k.. never got an entry, and fail */
			mp->st.mbs_failed += nmb - k;
			bool last =
			    mbp__job_left(job, nmb - k, nmb - k, mp->r.dead ? mp->r.err : -ECANCELED, k);
			mp->st.jobs_failed += last;
			pthread_mutex_unlock(&mp->r.lock);
			if (last)
				mbp__job_complete(job);
			return 0;
		}
		size_t row0, rows = mbp__job_mb_rows(job->rows, job->mb_rows, k, &row0);
		struct tent *t = &mp->tab[seq % mp->tcap];
		t->job = job;
		t->k = k;
		t->rows = (uint32_t)rows;
		c->h.rows = (uint32_t)rows;
		c->in = NULL;
		pthread_mutex_unlock(&mp->r.lock);
		rc = local_job(mp, c, (const char *)job->in + row0 * mp->r.in_rb, NULL, -1);
		entry_submitted(mp, seq, rc, c);
		pthread_mutex_lock(&mp->r.lock);
	}
	pthread_mutex_unlock(&mp->r.lock);
	return 0;
}

int mbp_mpi_job_wait(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns)
{
	return mp ? mbp_job_wait(job, timeout_ns) : -EINVAL;
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
	/* a buffer of mbp_mpi_mb_acquire() that the caller holds: lent to the run until its local job is
	 * done (a second submit meanwhile fails here) */
	if (!mp->mb_pool)
		return -ESHUTDOWN; /* the run failed to start */
	if (mbp__pool_lend(mp->mb_pool, mb) != 0)
		return -EINVAL;
	uint64_t seq;
	struct carrier *c;
	if ((rc = reserve(mp, true, timeout_ns, &seq, &c))) {
		mbp__pool_unlend(mb);
		return rc;
	}
	struct tent *t = &mp->tab[seq % mp->tcap];
	t->rows = mb->rows;
	t->user = mb->user;
	t->user_seq = mb->seq;
	mp->st.mbs_accepted++; /* taken back below if the local submit refuses it */
	pthread_mutex_unlock(&mp->r.lock);
	c->h.rows = mb->rows;
	c->in = NULL;
	if (mb->carry) {
		mbp__pool_unlend(mb); /* the pipeline lends it itself */
		mb->seq = seq;
		mb->user = c;
		rc = mbp_mb_submit(mp->p, mb, timeout_ns);
	} else {
		c->in = mb;
		rc = local_job(mp, c, mb->data, NULL, timeout_ns);
		if (rc)
			mbp__pool_unlend(mb);
	}
	if (rc) {
		c->in = NULL;
		carrier_free(mp, c, NULL);
		pthread_mutex_lock(&mp->r.lock);
		/* A run that died (a silent rank) fails every entry; this one may be retired already, its
		 * failure delivered through on_result: then it counts as accepted and the buffer is ours. */
		bool retired = seq < mp->next_retire;
		if (!retired) {
			mb->seq = t->user_seq;
			mb->user = t->user;
			t->state = T_VOID; /* never accepted: retired without a trace */
			mp->st.mbs_accepted--;
		}
		pthread_mutex_unlock(&mp->r.lock);
		if (retired) {
			mbp_mb_release(mp->p, mb);
			return 0;
		}
		retire(mp);
		return rc;
	}
	entry_submitted(mp, seq, 0, c);
	return 0;
}

void mbp_mpi_mb_release(mbp_mpi *mp, mbp_mb *mb)
{
	if (mb && mp && mbp__pool_owns(mp->res_pool, mb))
		mbp_pool_put(mp->res_pool, NULL, mb);
	else if (mb) /* a result without the handle (its pool is published), or an acquired buffer */
		mbp_mb_release(mp ? mp->p : NULL, mb);
}

uint64_t mbp_mpi_mb_seq(const mbp_mb *in)
{
	return in->job ? mbp__container_of(in->job, struct carrier, job)->h.seq : in->seq;
}

/* ---- the run's operations (the loop's thread) ---- */

static bool op_waiting(struct mbp__run *r, struct mbp__link *l)
{
	(void)l;
	/* relaxed: a hint; the queue is read under the run's lock (op_next) */
	return atomic_load_explicit(&of(r)->qn, memory_order_relaxed) != 0;
}

static bool op_next(struct mbp__run *r, struct mbp__link *l, struct mbp__hdr *h, mbp_mb **mb, void **item)
{
	mbp_mpi *mp = of(r);
	if (!op_waiting(r, l))
		return false; /* the common case, no lock taken */
	struct carrier *c = dequeue(mp);
	if (!c)
		return false;
	give_back(mp, c->in, mp->cache); /* an arrival's buffer, read: the next receive's (LIFO: hot) */
	c->in = NULL;
	*h = c->h;
	*mb = c->out;
	*item = c;
	return true;
}

static void op_sent(struct mbp__run *r, struct mbp__link *l, void *item)
{
	(void)l;
	carrier_free(of(r), item, of(r)->cache);
}

/* Rank 0: a result, straight into a result buffer: a job's rows are copied into its output, a single
 * micro-batch keeps the buffer. */
static int result_in(mbp_mpi *mp, const struct mbp__hdr *h, mbp_mb *mb)
{
	pthread_mutex_lock(&mp->r.lock);
	struct tent *t = &mp->tab[h->seq % mp->tcap];
	MBP_VERIFY(t->seq == h->seq && (t->state == T_RESERVED || t->state == T_INFLIGHT));
	MBP_VERIFY(h->status || (h->rows == t->rows && h->row_bytes == mp->final_rb));
	mbp_job *job = t->job;
	pthread_mutex_unlock(&mp->r.lock);
	if (job && !h->status)
		memcpy((char *)job->out + (size_t)t->k * job->mb_rows * mp->final_rb, mb->data,
		       (size_t)h->rows * h->row_bytes);
	pthread_mutex_lock(&mp->r.lock);
	if (!job)
		t->res = mb;
	entry_done_locked(t, h->status);
	pthread_mutex_unlock(&mp->r.lock);
	mp->arrived = true;
	return job ? MBP__AGAIN : MBP__TAKEN;
}

/* Ranks > 0: an arrival into the local pipeline, or passed on past it (failed before this rank, or
 * refused here) as a header alone. */
static int op_arrived(struct mbp__run *r, struct mbp__link *l, const struct mbp__hdr *h, mbp_mb *mb)
{
	(void)l;
	mbp_mpi *mp = of(r);
	if (r->rank == 0)
		return result_in(mp, h, mb);
	pthread_mutex_lock(&r->lock);
	struct carrier *c = mp->free_c;
	if (c) {
		mp->free_c = c->next;
		mp->nfree_c--;
	}
	pthread_mutex_unlock(&r->lock);
	if (!c)
		return MBP__KEEP; /* this rank holds all it may: no credit back until one leaves */
	c->h = *h;
	c->in = mb;
	c->out = NULL;
	int rc = h->status ? h->status : local_job(mp, c, mb->data, mp->cache, 0);
	if (rc == 0)
		return MBP__TAKEN;
	c->in = NULL;
	if (rc == -EAGAIN) { /* the local pipeline is full: stays at the head */
		carrier_free(mp, c, mp->cache);
		return MBP__KEEP;
	}
	c->h.status = rc == -ESHUTDOWN ? -ECANCELED : rc;
	mbp__counter_add(&mp->passed, 1); /* the loop is its only writer */
	queue(mp, c);
	return MBP__AGAIN;
}

static bool op_pass(struct mbp__run *r)
{
	mbp_mpi *mp = of(r);
	if (mp->arrived) {
		mp->arrived = false;
		retire(mp);
	}
	return false;
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
	st->passed = mbp__counter_get(&mp->passed);
	mbp__run_counts(&mp->r, &st->sent, &st->received, &st->credit_waits);
}

static void op_on_ctl(struct mbp__run *r, int peer, const struct mbp__ctl_msg *m)
{
	mbp_mpi *mp = of(r);
	if (m->cmd == MBP__CTL_STOPPED && peer < MBP_MAX_STAGES) {
		mp->st.rank[peer] = m->st;
		mp->st.reported++;
	}
}

static bool op_fill(struct mbp__run *r, int peer, struct mbp__ctl_msg *m)
{
	(void)peer;
	if (m->cmd == MBP__CTL_STOPPED)
		local_rank_stats(of(r), &m->st);
	return true;
}

static bool op_may_stop(struct mbp__run *r)
{
	mbp_mpi *mp = of(r);
	return mp->next_retire == mp->next_seq;
}

static void op_dead(struct mbp__run *r)
{
	mbp_mpi *mp = of(r);
	for (uint64_t s = mp->next_retire; r->rank == 0 && s < mp->next_seq; s++)
		entry_done_locked(&mp->tab[s % mp->tcap], -ETIMEDOUT);
}

static void op_closed(struct mbp__run *r)
{
	mbp_mpi *mp = of(r);
	pthread_mutex_lock(&r->lock);
	mp->closing = true; /* from now on a local result is dropped, not queued */
	pthread_mutex_unlock(&r->lock);
	for (struct carrier *c; (c = dequeue(mp));)
		carrier_free(mp, c, mp->cache);
	if (r->rank == 0)
		retire(mp);
}

static const struct mbp__run_ops ops = {.next = op_next,
					.waiting = op_waiting,
					.sent = op_sent,
					.arrived = op_arrived,
					.pass = op_pass,
					.on_ctl = op_on_ctl,
					.fill = op_fill,
					.may_stop = op_may_stop,
					.dead = op_dead,
					.closed = op_closed,
					.start = op_start,
					.inflight = true};

/* ---- ending a run ---- */

/* After the loop ended: the communication thread is free again; stop the local pipeline. */
static void after_loop(mbp_mpi *mp, bool cancel)
{
	if (!mp->r.ticket)
		return;
	mbp__run_join(&mp->r);
	if (cancel || mbp_pipeline_drain(mp->p, 5 * (int64_t)1000000000) != 0)
		mbp_pipeline_cancel(mp->p);
}

/* Rank 0: stop accepting (cancel: and fail what has not started, on every rank, also on the wire), wait
 * until every accepted micro-batch retired, then end the run on every rank. */
static int end_run(mbp_mpi *mp, bool cancel, int64_t timeout_ns)
{
	int rc = check_rank0(mp);
	if (rc)
		return rc;
	struct timespec ts;
	const struct timespec *dl = mbp__run_deadline(timeout_ns, &ts);
	pthread_mutex_lock(&mp->r.lock);
	if (mp->r.state == MBP__RUN_RUNNING) {
		mp->stop_accepting = true;
		if (cancel && mbp__run_cancel(&mp->r)) {
			pthread_mutex_unlock(&mp->r.lock);
			mbp_pipeline_cancel(
			    mp->p); /* what waits here fails; results travel on as failed headers */
			pthread_mutex_lock(&mp->r.lock);
		}
		while (mp->next_retire != mp->next_seq && !mp->r.dead)
			if (!mbp__run_wait(&mp->r, dl) && mp->next_retire != mp->next_seq && !mp->r.dead) {
				pthread_mutex_unlock(&mp->r.lock);
				return -ETIMEDOUT;
			}
		mbp__run_stop(&mp->r); /* the loop sends STOP once all is retired */
	}
	rc = mp->r.err;
	cancel |= mp->r.dead || mp->r.cancelled;
	pthread_mutex_unlock(&mp->r.lock);
	after_loop(mp, cancel);
	return rc;
}

int mbp_mpi_drain(mbp_mpi *mp, int64_t timeout_ns)
{
	return end_run(mp, false, timeout_ns);
}

int mbp_mpi_cancel(mbp_mpi *mp)
{
	return end_run(mp, true, -1);
}

int mbp_mpi_wait(mbp_mpi *mp, int64_t timeout_ns)
{
	int rc = mbp__run_check(mp ? &mp->r : NULL, MBP__RUN_OTHERS, true);
	if (rc)
		return rc;
	struct timespec ts;
	const struct timespec *dl = mbp__run_deadline(timeout_ns, &ts);
	bool cancel_done = false;
	pthread_mutex_lock(&mp->r.lock);
	for (;;) {
		if (mp->r.cancelled && !cancel_done) {
			pthread_mutex_unlock(&mp->r.lock);
			mbp_pipeline_cancel(mp->p); /* rank 0 said so: fail what has not started here */
			cancel_done = true;
			pthread_mutex_lock(&mp->r.lock);
			continue;
		}
		if (mp->r.state == MBP__RUN_ENDED)
			break;
		if (!mbp__run_wait(&mp->r, dl) && mp->r.state != MBP__RUN_ENDED &&
		    !(mp->r.cancelled && !cancel_done)) {
			pthread_mutex_unlock(&mp->r.lock);
			return -ETIMEDOUT;
		}
	}
	rc = mbp__run_ended_rc(&mp->r);
	bool cancel = mp->r.dead || mp->r.cancelled;
	pthread_mutex_unlock(&mp->r.lock);
	after_loop(mp, cancel);
	return rc;
}

void mbp_mpi_destroy(mbp_mpi *mp)
{
	if (!mp)
		return;
	if (mp->r.state == MBP__RUN_RUNNING) {
		if (mp->r.rank == 0)
			mbp_mpi_cancel(mp);
		else
			mbp_mpi_wait(mp, -1);
	}
	after_loop(mp, true);
	mbp_pipeline_destroy(mp->p);
	if (mp->res_pool && mbp_pool_destroy(mp->res_pool) != 0)
		fprintf(stderr, "mbp_mpi_destroy: result buffers not released; leaked\n");
	if (mp->pool)
		mbp_pool_destroy(mp->pool);
	free(mp->carriers);
	free(mp->tab);
	mbp__run_destroy(&mp->r);
}

int mbp_mpi_stats_get(mbp_mpi *mp, mbp_mpi_stats *st)
{
	if (!mp || !st)
		return -EINVAL;
	pthread_mutex_lock(&mp->r.lock);
	*st = mp->st;
	pthread_mutex_unlock(&mp->r.lock);
	st->ranks = (uint32_t)mp->r.size;
	st->reported++; /* this rank: its own counters, current (below) */
	local_rank_stats(mp, &st->rank[mp->r.rank]);
	return 0;
}

/*
 * Jobs: describing one (mbp_job_init), submitting it whole into the ingress, accounting its micro-batches
 * as they leave the pipeline (mbp__job_account, on the completing worker), completing it, and waiting for
 * it. Rank 0 of a pipeline across MPI ranks (lib/mpi/mpi.c) keeps its jobs with the same pieces: the check,
 * the bookkeeping, the accounting and the completion; its table stands in for the ingress. Splitting a job into micro-batches happens on stage 0's thread (worker.c), reading the caller's input
 * in place.
 *
 * Completion: the worker that brings `left` to zero fills the results, then either calls the job's
 * callback (its last touch: the callback may free the job) or publishes done with a release exchange of
 * the futex word and wakes a sleeping waiter. A job with a callback is never waited for (pipeline.h,
 * "Completion").
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "job.h"
#include "pipeline_internal.h"

void mbp_job_init(mbp_job *job, const void *in, void *out, size_t rows, uint32_t mb_rows)
{
	memset(job, 0, sizeof(*job));
	job->in = in;
	job->out = out;
	job->rows = rows;
	job->mb_rows = mb_rows;
}

int mbp__job_check(mbp_pipeline *p, const mbp_job *job, uint32_t *nmb)
{
	if (!job || !job->in || !job->out || job->rows == 0 || job->mb_rows == 0)
		return -EINVAL;
	if (job->mb_rows > p->o.max_mb_rows)
		return mbp__pipeline_refuse(
		    p, -E2BIG, "micro-batches of %" PRIu32 " rows: above max_mb_rows (%" PRIu32 ")",
		    job->mb_rows, p->o.max_mb_rows);
	uint64_t n = (job->rows + job->mb_rows - 1) / job->mb_rows;
	if (n > UINT32_MAX)
		return mbp__pipeline_refuse(p, -EINVAL,
					    "%zu rows in micro-batches of %" PRIu32 " rows: %" PRIu64
					    " micro-batches, above 4294967295",
					    job->rows, job->mb_rows, n);
	*nmb = (uint32_t)n;
	return 0;
}

void mbp__job_begin(mbp_job *job, uint32_t nmb, uint64_t id)
{
	struct mbp__job_priv *jp = mbp__jp(job);
	memset(jp, 0, sizeof(*jp));
	job->status = 0;
	job->mbs = nmb;
	job->mbs_failed = 0;
	job->done_ns = 0;
	job->submit_ns = mbp__now_ns();
	job->id = id;
	atomic_init(&jp->left, nmb);
	atomic_init(&jp->first_err, UINT64_MAX);
}

int mbp_job_submit(mbp_pipeline *p, mbp_job *job, int64_t timeout_ns)
{
	uint32_t nmb;
	int rc = p ? mbp__job_check(p, job, &nmb) : -EINVAL;
	if (rc || (rc = mbp__submit_enter(p)))
		return rc;
	/* relaxed: a unique number is all it gives; nothing is published through it */
	mbp__job_begin(job, nmb, atomic_fetch_add_explicit(&p->next_job_id, 1, memory_order_relaxed) + 1);
	rc = mbp__ingress_put(&p->ingress, &mbp__jp(job)->item, MBP__ITEM_JOB, timeout_ns);
	if (rc == 0) {
		/* relaxed: statistics; drain reads them after stop_accepting()'s acquire of `submitting` */
		atomic_fetch_add_explicit(&p->jobs_accepted, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->mbs_accepted, nmb, memory_order_relaxed);
	}
	mbp__submit_leave(p);
	return rc;
}

bool mbp__job_left(mbp_job *job, uint32_t k, uint32_t failed, int err, uint32_t seq)
{
	struct mbp__job_priv *jp = mbp__jp(job);
	if (failed) {
		uint64_t mine = ((uint64_t)seq << 32) | (uint32_t)err;
		/* relaxed: published to the finisher by the acq_rel decrement of `left` below */
		uint64_t cur = atomic_load_explicit(&jp->first_err, memory_order_relaxed);
		while (mine < cur &&
		       !atomic_compare_exchange_weak_explicit(&jp->first_err, &cur, mine,
							      memory_order_relaxed, memory_order_relaxed))
			;
		atomic_fetch_add_explicit(&jp->failed, failed, memory_order_relaxed);
	}
	/* acq_rel; partners: the other completers' decrements: the thread that brings `left` to zero sees
	 * every other completer's writes (first_err, failed, the output rows it wrote) */
	uint32_t left = atomic_fetch_sub_explicit(&jp->left, k, memory_order_acq_rel) - k;
	if (left)
		return false;
	/* relaxed, both: ordered by the acq_rel decrement above */
	uint64_t fe = atomic_load_explicit(&jp->first_err, memory_order_relaxed);
	job->status = fe == UINT64_MAX ? 0 : (int)(uint32_t)fe;
	job->mbs_failed = atomic_load_explicit(&jp->failed, memory_order_relaxed);
	job->done_ns = mbp__now_ns();
	return true;
}

void mbp__job_complete(mbp_job *job)
{
	if (job->cb) {
		job->cb(job, job->cb_arg); /* may free the job: touch nothing after */
		return;
	}
	struct mbp__job_priv *jp = mbp__jp(job);
	/* release; partner: the acquire load in mbp_job_done()/mbp_job_wait(): the results are visible */
	if (atomic_exchange_explicit(&jp->state, 1, memory_order_release) == 2)
		mbp__futex_wake(&jp->state, INT32_MAX);
}

void mbp__job_account(struct mbp__stage_counters *c, mbp_job *job, uint32_t k, uint32_t failed, int err,
		      uint32_t seq)
{
	mbp__counter_add(&c->done_mbs, k - failed);
	mbp__counter_add(&c->done_failed_mbs, failed);
	if (!mbp__job_left(job, k, failed, err, seq))
		return;
	mbp__counter_add(job->status ? &c->done_failed_jobs : &c->done_jobs, 1);
	mbp__job_complete(job);
}

bool mbp_job_done(const mbp_job *job)
{
	if (!job || job->cb)
		return false; /* the callback is its completion (pipeline.h, "Completion") */
	struct mbp__job_priv *jp = mbp__jp((mbp_job *)job);
	/* acquire; partner: the release exchange in mbp__job_account(): the job's results are visible */
	return atomic_load_explicit(&jp->state, memory_order_acquire) == 1;
}

int mbp_job_wait(mbp_job *job, int64_t timeout_ns)
{
	if (!job || job->cb)
		return -EINVAL; /* a callback job may be freed by its callback: nothing could wake us safely */
	struct mbp__job_priv *jp = mbp__jp(job);
	uint64_t deadline = mbp__deadline(timeout_ns);
	for (;;) {
		/* acquire; partner: the release exchange in mbp__job_account() */
		uint32_t st = atomic_load_explicit(&jp->state, memory_order_acquire);
		if (st == 1)
			return 0;
		if (timeout_ns == 0)
			return -ETIMEDOUT;
		if (st == 0) {
			/* announce a sleeper; acquire (partner: the release exchange in mbp__job_account()): on
			 * failure it may be the completion (1) */
			if (!atomic_compare_exchange_strong_explicit(&jp->state, &st, 2, memory_order_acquire,
								     memory_order_acquire))
				continue;
		}
		/* acquire; partner: the release exchange in mbp__job_account(), as above */
		if (mbp__futex_wait(&jp->state, 2, deadline) == -ETIMEDOUT &&
		    atomic_load_explicit(&jp->state, memory_order_acquire) != 1)
			return -ETIMEDOUT;
	}
}

int mbp_run(mbp_pipeline *p, const void *in, void *out, size_t rows, uint32_t mb_rows)
{
	mbp_job job;
	mbp_job_init(&job, in, out, rows, mb_rows);
	int rc = mbp_job_submit(p, &job, -1);
	if (rc)
		return rc;
	mbp_job_wait(&job, -1);
	return job.status;
}

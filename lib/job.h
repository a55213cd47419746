/*
 * Jobs: the engine's bookkeeping in a caller's mbp_job (its priv), and their completion. Not installed.
 *
 * A job enters the ingress whole (its priv starts with an ingress entry); stage 0 splits it into
 * micro-batches that read the caller's input in place; whichever worker completes micro-batches accounts
 * them here, and the one that completes the last completes the job: wakes its waiter, or calls its
 * callback (pipeline.h, "Completion").
 */
#ifndef MBP__JOB_H
#define MBP__JOB_H

#include <mbpipe.h>

#include "common.h"
#include "ingress.h"

/* The engine's view of mbp_job.priv. */
struct mbp__job_priv {
	struct mbp__item item;
	_Atomic uint32_t left; /* micro-batches not yet completed or failed */
	_Atomic uint32_t failed;
	/* (seq << 32) | (uint32_t)err of the lowest failed seq; UINT64_MAX: none */
	_Atomic uint64_t first_err;
	_Atomic uint32_t state; /* futex word: 0 pending, 1 done, 2 pending with a sleeper */
};
_Static_assert(sizeof(struct mbp__job_priv) <= sizeof(((mbp_job *)0)->priv), "mbp_job.priv too small");

static inline struct mbp__job_priv *mbp__jp(mbp_job *job)
{
	return (struct mbp__job_priv *)(void *)job->priv.opaque;
}

struct mbp__stage_counters;

/* Micro-batch k of a job of `rows` rows cut into micro-batches of m: its first row into *row0 and its rows
 * (the last one may be short), for every flow that cuts a job (stage 0, rank 0 across ranks). From values,
 * not the job: stage 0 reads them into locals first (worker.c). */
static inline size_t mbp__job_mb_rows(size_t rows, size_t m, uint32_t k, size_t *row0)
{
	*row0 = (size_t)k * m;
	return rows - *row0 < m ? rows - *row0 : m;
}

/* A job's checks (mbp_job_submit's; a refusal for a limit recorded on p): 0 and its micro-batch count in
 * *nmb, -EINVAL or -E2BIG. */
int mbp__job_check(mbp_pipeline *p, const mbp_job *job, uint32_t *nmb);
/* A job accepted: its bookkeeping starts (status, counts, times, `id`; nmb micro-batches to go). */
void mbp__job_begin(mbp_job *job, uint32_t nmb, uint64_t id);
/* k micro-batches of `job` leave, `failed` of them failed, the first failure being `err` at `seq`: true
 * when they were its last; then its status, mbs_failed and done_ns are set, mbp__job_complete() next. */
bool mbp__job_left(mbp_job *job, uint32_t k, uint32_t failed, int err, uint32_t seq);
/* The job's completion: its callback (its last touch: it may free the job), or done published and its
 * waiter woken. */
void mbp__job_complete(mbp_job *job);

/* Completion of job micro-batches: k micro-batches of `job` leave the pipeline, `failed` of them failed,
 * the first failure being `err` at `seq`. Completes the job when it was the last. Counts into `c`. */
void mbp__job_account(struct mbp__stage_counters *c, mbp_job *job, uint32_t k, uint32_t failed, int err,
		      uint32_t seq);

#endif

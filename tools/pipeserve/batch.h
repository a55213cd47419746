/*
 * The batcher: dynamic batching of concurrent requests onto an mbpipe pipeline, through the public
 * micro-batch API (mbp_mb_acquire / mbp_mb_submit / opts.on_result / mbp_mb_release).
 *
 * Requests wait in one bounded FIFO (admission control counts rows). One batcher thread forms
 * micro-batches of at most max_batch_rows rows from the head of the FIFO: it sends one as soon as that
 * many rows wait, or when the oldest request has waited max_delay_ns. A micro-batch may hold rows of many
 * requests and a request may span many micro-batches; each micro-batch carries (mb->user) a small list of
 * segments (request, its first row, the micro-batch's first row, rows). On the last stage's thread the
 * result callback copies each segment's output rows back into its request; the micro-batch that brings a
 * request's last rows completes it (its `done` callback). Requests that waited in the FIFO past the timeout
 * without a single row sent fail with -ETIMEDOUT.
 *
 * One weights version per request. The batcher pins every micro-batch to a weights version it holds
 * (mbp_model_mb_pin), and moves to the model's newest version only at a micro-batch that starts with a
 * request's first row: a request whose rows span micro-batches is computed with one version, which its
 * answer names. When a newer version waits and the FIFO's head request is already under way, the next
 * micro-batch takes only that request's remaining rows (it may leave rows unused), so that the one after
 * it can move on: a stream of requests straddling micro-batch boundaries cannot keep an old version
 * forever. An idle batcher drops its version, so an old one is freed once its last micro-batch is back.
 *
 * At most max_inflight micro-batches are in the pipeline at once. Without that bound every request would
 * go straight into the engine's deep ingress as a micro-batch of its own and wait there, unbatched; with
 * it, rows that arrive while the pipeline is full wait in the FIFO and leave together: batches grow with
 * the load by themselves, even with no delay at all.
 *
 * Thread safety:
 *   operation                             | concurrency
 *   ps_batcher_reserve, _enqueue, _queue   | any threads, concurrently
 *   ps_batcher_new, _stop, _destroy        | one controlling thread
 * done() runs on the batcher thread (timeouts, submit errors) or on the last stage's thread (results).
 */
#ifndef PIPESERVE_BATCH_H
#define PIPESERVE_BATCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <mbpipe.h>

#include "metrics.h"

typedef struct ps_batcher ps_batcher;
typedef struct ps_req ps_req;

struct ps_req {
	/* set before ps_batcher_enqueue() */
	const void *in; /* rows x in_row_bytes, any alignment */
	void *out;	/* rows x out_row_bytes */
	size_t rows;
	void (*done)(ps_req *r); /* once, when every row is back or the request failed */
	void *arg;
	/* results, valid in done() */
	int status;	  /* 0; -ETIMEDOUT (waited too long in the queue); a stage's or the engine's error */
	uint64_t version; /* the weights version every row was computed with (0 without a model) */
	uint64_t t_enqueue, t_dispatch, t_done; /* CLOCK_MONOTONIC ns */
	/* private to the batcher */
	ps_req *next;
	size_t next_row;     /* rows already put into micro-batches (batcher thread only) */
	_Atomic size_t left; /* rows not yet back */
	_Atomic int err;     /* first error */
};

/*
 * What the batcher feeds: by default a local mbp_pipeline that ps_batcher_new() makes; or another engine
 * with the same micro-batch calls (under mpirun, rank 0's end of a pipeline across ranks: mpi.c).
 */
typedef struct ps_engine {
	void *ctx;
	/* Make and start it from `o` (its on_result and max_mb_rows set by the batcher) and the stages. */
	int (*start)(void *ctx, const mbp_opts *o, const mbp_stage_desc *stages, unsigned n);
	int (*acquire)(void *ctx, mbp_mb **mb, int64_t timeout_ns);
	int (*submit)(void *ctx, mbp_mb *mb, int64_t timeout_ns);
	void (*release)(void *ctx, mbp_mb *mb);
	int (*drain)(void *ctx, int64_t timeout_ns); /* 0, -ETIMEDOUT (call again), or an error */
	void (*destroy)(void *ctx);		     /* after drain (or a failed start) */
	mbp_pipeline *(*pipeline)(void *ctx);	     /* this process's stages (statistics) */
} ps_engine;

typedef struct ps_batcher_cfg {
	uint32_t max_batch_rows;  /* rows per micro-batch (also the pipeline's max_mb_rows) */
	uint64_t max_delay_ns;	  /* longest wait for a micro-batch to fill */
	size_t max_queue_rows;	  /* admission bound: rows admitted and not yet in a micro-batch */
	uint64_t timeout_ns;	  /* a request still fully queued after this long fails; 0: never */
	size_t out_row_bytes;	  /* the last stage's output row width */
	uint32_t max_inflight;	  /* micro-batches in the pipeline at most; more rows wait in the FIFO */
	mbp_model *model;	  /* the model the stages run: every request runs on one weights version */
	const ps_engine *engine;  /* NULL: a local pipeline */
	mbp_model_stages *stages; /* the local pipeline's stages, attached to it before it starts
				     (rebalancing's active replicas: mbp_model_stages_attach); NULL: none */
} ps_batcher_cfg;

/**
 * Create the pipeline (cfg->engine's, or a local one) from `o` (its on_result is set here) and `stages`,
 * start it and the batcher thread.
 * Pair with ps_batcher_destroy().
 * @return 0, or a negative error from the pipeline (-EINVAL, -ENOMEM, a stage's init error).
 */
int ps_batcher_new(ps_batcher **b, const ps_batcher_cfg *cfg, const mbp_opts *o, const mbp_stage_desc *stages,
		   unsigned nstages, ps_metrics *metrics);

/**
 * Reserve room for `rows` rows in the queue. A successful reserve must be followed by ps_batcher_enqueue().
 * @return 0, -E2BIG (more rows than the queue holds), -EAGAIN (full now), -ESHUTDOWN (stopping).
 */
int ps_batcher_reserve(ps_batcher *b, size_t rows);

/* Queue a request whose rows were reserved. From here on done() will be called exactly once. */
void ps_batcher_enqueue(ps_batcher *b, ps_req *r);

/* Requests and rows waiting for a micro-batch now. */
void ps_batcher_queue(ps_batcher *b, uint64_t *requests, uint64_t *rows);

mbp_pipeline *ps_batcher_pipeline(ps_batcher *b);

/* Refuse new reservations, send what is queued, stop the thread, drain the pipeline. Idempotent. */
void ps_batcher_stop(ps_batcher *b);

/* Stop if needed, destroy the pipeline, free everything. Accepts NULL. */
void ps_batcher_destroy(ps_batcher *b);

#endif

/*
 * pipeserve's own metrics and their Prometheus text rendering (GET /metrics), together with the engine's
 * per-stage statistics and pool statistics read through the public API.
 *
 * Counters and histograms are written by many threads (HTTP workers, the batcher, the last stage's thread):
 * relaxed atomic adds, which is fine here (a server request costs microseconds; the engine's single-writer
 * rule is about its own hot path). A scrape reads each counter once, relaxed: a histogram's buckets and
 * count may differ by the few observations that land during the scrape, which Prometheus tolerates.
 */
#ifndef PIPESERVE_METRICS_H
#define PIPESERVE_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include <mbpipe.h>

#include "oip.h"

#define PS_HIST_MAX 24

typedef struct ps_hist {
	unsigned n;		  /* finite buckets */
	double scale;		  /* value unit in the exposition (1e-9: ns shown as seconds) */
	uint64_t le[PS_HIST_MAX]; /* upper bounds, in observation units */
	_Atomic uint64_t bucket[PS_HIST_MAX + 1];
	_Atomic uint64_t sum, count;
} ps_hist;

/* HTTP statuses counted as failed infer requests. */
enum { PS_FAIL_400, PS_FAIL_404, PS_FAIL_413, PS_FAIL_429, PS_FAIL_500, PS_FAIL_503, PS_FAIL_N };

typedef struct ps_metrics {
	/* Every infer request received (its head read) ends in exactly one of ok, fail[status], cancelled (its
	 * client went away before an answer was queued): received = ok + sum(fail) + cancelled, once answered. */
	_Atomic uint64_t infer_received, infer_cancelled;
	_Atomic uint64_t infer_ok, infer_fail[PS_FAIL_N];
	_Atomic uint64_t rows_ok;
	_Atomic uint64_t reload_ok, reload_fail;
	ps_hist request_ns; /* arrival of the full body to the response queued */
	ps_hist queue_ns;   /* admission to the first micro-batch holding the request's rows */
	ps_hist compute_ns; /* a micro-batch's submit to its result */
	ps_hist batch_rows; /* rows of every formed micro-batch */
} ps_metrics;

void ps_metrics_init(ps_metrics *m);
void ps_hist_observe(ps_hist *h, uint64_t v);
/* Count a failed infer request by its HTTP status. */
void ps_metrics_fail(ps_metrics *m, int http_status);

/* What the scrape needs besides the counters. */
typedef struct ps_metrics_view {
	const char *model;
	uint64_t queue_requests, queue_rows; /* waiting for a micro-batch now */
	uint64_t inflight_requests;	     /* admitted and not yet answered */
	int ready;
	mbp_pipeline *pipeline;
	mbp_model_stages *stages; /* their rebalancing, when on */
} ps_metrics_view;

/* Render everything in the Prometheus text exposition format 0.0.4. @return 0 or -ENOMEM. */
int ps_metrics_render(const ps_metrics *m, const ps_metrics_view *v, ps_buf *b);

#endif

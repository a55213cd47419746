/*
 * Metrics: see metrics.h. Durations are kept in nanoseconds and exposed in seconds (Prometheus' base
 * unit); bucket bounds are fixed at start-up, roughly 1-2.5-5 per decade from 25 us to 10 s.
 */
#include "config.h"

#include "metrics.h"

#include <errno.h>
#include <string.h>

static const uint64_t duration_le_ns[] = {
    25000,    50000,	100000,	   250000,    500000,	 1000000,    2500000,	 5000000,    10000000,
    25000000, 50000000, 100000000, 250000000, 500000000, 1000000000, 2500000000, 5000000000, 10000000000,
};

static void hist_init(ps_hist *h, const uint64_t *le, unsigned n, double scale)
{
	memset(h, 0, sizeof *h);
	h->n = n;
	h->scale = scale;
	memcpy(h->le, le, n * sizeof *le);
}

void ps_metrics_init(ps_metrics *m)
{
	memset(m, 0, sizeof *m);
	const unsigned nd = sizeof duration_le_ns / sizeof duration_le_ns[0];
	hist_init(&m->request_ns, duration_le_ns, nd, 1e-9);
	hist_init(&m->queue_ns, duration_le_ns, nd, 1e-9);
	hist_init(&m->compute_ns, duration_le_ns, nd, 1e-9);
	uint64_t rows_le[PS_HIST_MAX];
	unsigned nr = 0;
	for (uint64_t r = 1; r <= 4096 && nr < PS_HIST_MAX; r *= 2)
		rows_le[nr++] = r;
	hist_init(&m->batch_rows, rows_le, nr, 1);
}

void ps_hist_observe(ps_hist *h, uint64_t v)
{
	unsigned i = 0;
	while (i < h->n && v > h->le[i])
		i++;
	atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum, v, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

static const int fail_status[PS_FAIL_N] = {400, 404, 413, 429, 500, 503};

void ps_metrics_fail(ps_metrics *m, int http_status)
{
	int slot = PS_FAIL_500;
	for (int i = 0; i < PS_FAIL_N; i++)
		if (fail_status[i] == http_status)
			slot = i;
	atomic_fetch_add_explicit(&m->infer_fail[slot], 1, memory_order_relaxed);
}

static uint64_t rd(const _Atomic uint64_t *a)
{
	return atomic_load_explicit(a, memory_order_relaxed);
}

static void head(ps_buf *b, const char *name, const char *type, const char *help)
{
	ps_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The model name is a label value: escape backslash, quote and newline as the format requires. */
static void add_label_value(ps_buf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			ps_buf_printf(b, "\\%c", *s);
		else if (*s == '\n')
			ps_buf_adds(b, "\\n");
		else
			ps_buf_add(b, s, 1);
	}
}

static void model_label(ps_buf *b, const char *model)
{
	ps_buf_adds(b, "model=\"");
	add_label_value(b, model);
	ps_buf_adds(b, "\"");
}

static void render_hist(ps_buf *b, const ps_hist *h, const char *name, const char *help, const char *model)
{
	head(b, name, "histogram", help);
	uint64_t cum = 0;
	for (unsigned i = 0; i <= h->n; i++) {
		cum += rd(&h->bucket[i]);
		ps_buf_printf(b, "%s_bucket{", name);
		model_label(b, model);
		if (i < h->n)
			ps_buf_printf(b, ",le=\"%.9g\"} %llu\n", (double)h->le[i] * h->scale,
				      (unsigned long long)cum);
		else
			ps_buf_printf(b, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
	}
	ps_buf_printf(b, "%s_sum{", name);
	model_label(b, model);
	ps_buf_printf(b, "} %.9g\n%s_count{", (double)rd(&h->sum) * h->scale, name);
	model_label(b, model);
	ps_buf_printf(b, "} %llu\n", (unsigned long long)cum);
}

static void gauge(ps_buf *b, const char *name, const char *type, const char *help, const char *model,
		  double v)
{
	head(b, name, type, help);
	ps_buf_printf(b, "%s{", name);
	model_label(b, model);
	ps_buf_printf(b, "} %.17g\n", v);
}

static void render_stages(ps_buf *b, mbp_pipeline *p, const char *model)
{
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[MBP_MAX_STAGES];
	int n = mbp_pipeline_stats_get(p, &ps, ss, MBP_MAX_STAGES);
	if (n < 0)
		return;
	if (n > MBP_MAX_STAGES)
		n = MBP_MAX_STAGES;
	static const struct {
		const char *name, *help;
		size_t off;
	} per_stage[] = {
	    {"mbpipe_stage_busy_seconds_total", "Time each stage spent computing.",
	     offsetof(mbp_stage_stats, busy_ns)},
	    {"mbpipe_stage_starved_seconds_total", "Time each stage waited for input.",
	     offsetof(mbp_stage_stats, starved_ns)},
	    {"mbpipe_stage_blocked_seconds_total", "Time each stage waited for room downstream or a buffer.",
	     offsetof(mbp_stage_stats, blocked_ns)},
	    {"mbpipe_stage_parked_seconds_total",
	     "Time each stage's inactive replicas spent parked (--rebalance-replicas), summed.",
	     offsetof(mbp_stage_stats, parked_ns)},
	};
	for (size_t k = 0; k < sizeof per_stage / sizeof per_stage[0]; k++) {
		head(b, per_stage[k].name, "counter", per_stage[k].help);
		for (int i = 0; i < n; i++) {
			uint64_t ns;
			memcpy(&ns, (const char *)&ss[i] + per_stage[k].off, sizeof ns);
			ps_buf_printf(b, "%s{", per_stage[k].name);
			model_label(b, model);
			ps_buf_printf(b, ",stage=\"%d\",name=\"", i);
			add_label_value(b, ss[i].name);
			ps_buf_printf(b, "\",cpu=\"%d\"} %.9f\n", ss[i].cpu, (double)ns * 1e-9);
		}
	}
	head(b, "mbpipe_stage_microbatches_total", "counter", "Micro-batches each stage computed.");
	for (int i = 0; i < n; i++) {
		ps_buf_adds(b, "mbpipe_stage_microbatches_total{");
		model_label(b, model);
		ps_buf_printf(b, ",stage=\"%d\"} %llu\n", i, (unsigned long long)ss[i].mbs);
	}
	head(b, "mbpipe_stage_replicas", "gauge", "The threads each stage was made with.");
	for (int i = 0; i < n; i++) {
		ps_buf_adds(b, "mbpipe_stage_replicas{");
		model_label(b, model);
		ps_buf_printf(b, ",stage=\"%d\"} %u\n", i, ss[i].replicas);
	}
	head(b, "mbpipe_stage_active_replicas", "gauge",
	     "The replicas of each stage set to take micro-batches, as the engine holds it.");
	for (int i = 0; i < n; i++) {
		ps_buf_adds(b, "mbpipe_stage_active_replicas{");
		model_label(b, model);
		ps_buf_printf(b, ",stage=\"%d\"} %u\n", i, ss[i].active);
	}
	gauge(b, "mbpipe_bubble_fraction", "gauge", "Idle share of the stages' time since start.", model,
	      ps.bubble);
	gauge(b, "mbpipe_microbatches_completed_total", "counter", "Micro-batches that left the pipeline.",
	      model, (double)ps.mbs_completed);
	gauge(b, "mbpipe_microbatches_failed_total", "counter", "Micro-batches that failed.", model,
	      (double)ps.mbs_failed);
	gauge(b, "mbpipe_ingress_queued", "gauge", "Micro-batches waiting for stage 0.", model,
	      (double)ps.ingress_queued);
	const mbp_pool_stats *pl = &ps.pool;
	gauge(b, "mbpipe_pool_buffers_in_use", "gauge", "Pool buffers held now.", model, (double)pl->in_use);
	gauge(b, "mbpipe_pool_buffers_allocated", "gauge", "Pool buffers allocated now.", model,
	      (double)pl->allocated);
	gauge(b, "mbpipe_pool_buffers_high_water", "gauge",
	      "Most pool buffers ever held by the engine at once (sampled).", model, (double)pl->high_water);
	gauge(b, "mbpipe_pool_buffers_max", "gauge", "Bound of the pool in buffers.", model,
	      (double)pl->max_buffers);
	gauge(b, "mbpipe_pool_bytes", "gauge", "Bytes the pool holds, headers included.", model,
	      (double)pl->bytes);
	gauge(b, "mbpipe_pool_gets_total", "counter", "Buffers handed out by the pool.", model,
	      (double)pl->gets);
	gauge(b, "mbpipe_pool_waits_total", "counter", "Pool gets that had to wait for a release.", model,
	      (double)pl->waits);
}

/* --rebalance: the moves (those that changed active replicas too), the plan in use, each stage's first
 * layer and active replicas in it. */
static void render_rebalance(ps_buf *b, mbp_model_stages *st, const char *model)
{
	mbp_model_rebalance_stats rs;
	if (mbp_model_stages_rebalance_stats(st, &rs) < 0 || !rs.on)
		return;
	gauge(b, "mbpipe_rebalance_moves_total", "counter",
	      "Moves of layers between the stages (--rebalance), each logged with its reason.", model,
	      (double)rs.moves);
	gauge(b, "mbpipe_rebalance_replica_moves_total", "counter",
	      "Moves that also changed how many replicas of a stage are active.", model,
	      (double)rs.replica_moves);
	gauge(b, "mbpipe_rebalance_plan", "gauge", "The plan in use: 1 at start, +1 per move.", model,
	      (double)rs.plan);
	head(b, "mbpipe_rebalance_stage_first_layer", "gauge", "The first layer each stage computes now.");
	for (unsigned i = 0; i < rs.current.stages; i++) {
		ps_buf_adds(b, "mbpipe_rebalance_stage_first_layer{");
		model_label(b, model);
		ps_buf_printf(b, ",stage=\"%u\"} %u\n", i, rs.current.first[i]);
	}
	head(b, "mbpipe_rebalance_stage_active_replicas", "gauge",
	     "The replicas of each stage that take micro-batches now.");
	for (unsigned i = 0; i < rs.current.stages; i++) {
		ps_buf_adds(b, "mbpipe_rebalance_stage_active_replicas{");
		model_label(b, model);
		ps_buf_printf(b, ",stage=\"%u\"} %u\n", i,
			      rs.current.replicas[i] ? rs.current.replicas[i] : 1);
	}
}

int ps_metrics_render(const ps_metrics *m, const ps_metrics_view *v, ps_buf *b)
{
	const char *model = v->model;
	gauge(b, "pipeserve_request_received_total", "counter",
	      "Infer requests received; each ends as a success, a failure or cancelled.", model,
	      (double)rd(&m->infer_received));
	gauge(b, "pipeserve_request_cancelled_total", "counter",
	      "Infer requests whose client went away before their answer.", model,
	      (double)rd(&m->infer_cancelled));
	head(b, "pipeserve_request_success_total", "counter", "Infer requests answered with 200.");
	ps_buf_adds(b, "pipeserve_request_success_total{");
	model_label(b, model);
	ps_buf_printf(b, "} %llu\n", (unsigned long long)rd(&m->infer_ok));
	head(b, "pipeserve_request_failure_total", "counter",
	     "Infer requests answered with an error, by status.");
	for (int i = 0; i < PS_FAIL_N; i++) {
		ps_buf_adds(b, "pipeserve_request_failure_total{");
		model_label(b, model);
		ps_buf_printf(b, ",code=\"%d\"} %llu\n", fail_status[i],
			      (unsigned long long)rd(&m->infer_fail[i]));
	}
	gauge(b, "pipeserve_rows_total", "counter", "Rows inferred in successful requests.", model,
	      (double)rd(&m->rows_ok));
	gauge(b, "pipeserve_reload_success_total", "counter", "Model reloads that succeeded.", model,
	      (double)rd(&m->reload_ok));
	gauge(b, "pipeserve_reload_failure_total", "counter", "Model reloads that failed.", model,
	      (double)rd(&m->reload_fail));
	render_hist(b, &m->request_ns, "pipeserve_request_duration_seconds",
		    "Infer request time from its full body to its response.", model);
	render_hist(b, &m->queue_ns, "pipeserve_queue_duration_seconds",
		    "Time an infer request waited for its first micro-batch.", model);
	render_hist(b, &m->compute_ns, "pipeserve_compute_duration_seconds",
		    "Time a micro-batch spent in the pipeline.", model);
	render_hist(b, &m->batch_rows, "pipeserve_batch_rows", "Rows of every micro-batch the server formed.",
		    model);
	gauge(b, "pipeserve_queue_requests", "gauge", "Infer requests waiting for a micro-batch.", model,
	      (double)v->queue_requests);
	gauge(b, "pipeserve_queue_rows", "gauge", "Rows waiting for a micro-batch.", model,
	      (double)v->queue_rows);
	gauge(b, "pipeserve_inflight_requests", "gauge", "Infer requests admitted and not yet answered.",
	      model, (double)v->inflight_requests);
	gauge(b, "pipeserve_ready", "gauge", "1 when the server accepts infer requests.", model, v->ready);
	if (v->pipeline)
		render_stages(b, v->pipeline, model);
	if (v->stages)
		render_rebalance(b, v->stages, model);
	return b->oom ? -ENOMEM : 0;
}

/*
 * pipebench measurement: the sequential baseline and one pipeline run per micro-batch size.
 *
 * A pipeline run submits one batch (a job of `batch` rows split into micro-batches of m rows), waits for
 * it, checks its output and submits the next: each batch fills and drains the pipeline, which is the
 * schedule GPipe's bubble formula describes. Statistics come from the engine (mbp_pipeline_stats_get
 * before and after the measured batches, mbp_stats_window between them); each stage is wrapped so that
 * the begin and end of every micro-batch it computes are stamped, which gives the Gantt chart of the last
 * batch without depending on the trace format.
 *
 * The Gantt chart shows the fastest measured batch: the one the machine's other load disturbed least,
 * which shows the schedule itself.
 *
 * The measured bubble is the median over the batches of 1 - busy / (T x latency), where busy is the time
 * the stages spent computing that batch (from the stamps), latency its submission to completion and T the
 * worker threads (S, unless stages outnumber CPUs and share threads): the idle share of the workers while
 * a batch is in flight. The caller's own gaps between batches (checking
 * the output) do not count, and the median keeps a batch that the machine's other load stalled from
 * dominating. The engine's bubble over the whole window is reported next to it.
 *
 * The baseline runs the same stage functions in order, on one thread of its own (pinned where stage 0
 * would be), over the whole batch at once: the best a single thread does with this code.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipebench.h"
#include "../plural.h"

#define JOB_TIMEOUT_NS	 (120 * INT64_C(1000000000)) /* at least; 50 slowest baselines if longer */
#define DRAIN_TIMEOUT_NS (30 * INT64_C(1000000000))
#define TRACE_EVENTS	 65536

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double percentile(const double *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	size_t k = (size_t)ceil(p * (double)n);
	return v[k ? k - 1 : 0];
}

/* Row width entering each stage, and leaving the last: w[0] is the input row. */
static void stage_widths(const pb_workload *w, size_t *width)
{
	width[0] = w->in_row_bytes;
	for (unsigned i = 0; i < w->stages; i++)
		width[i + 1] = w->desc_of[i].out_row_bytes ? w->desc_of[i].out_row_bytes : width[i];
}

static void *alloc_rows(size_t rows, size_t width)
{
	size_t bytes = (rows * width + 63) / 64 * 64;
	return aligned_alloc(64, bytes ? bytes : 64);
}

int pb_bench_init(pb_bench *b, const pb_config *cfg, pb_workload *w, unsigned ncpus, unsigned allowed,
		  char *err, size_t errlen)
{
	memset(b, 0, sizeof(*b));
	b->cfg = cfg;
	b->w = w;
	b->ncpus = ncpus;
	b->allowed = allowed;
	b->in = alloc_rows(cfg->batch, w->in_row_bytes);
	b->out = alloc_rows(cfg->batch, w->out_row_bytes);
	b->ref = alloc_rows(cfg->batch, w->out_row_bytes);
	b->seq = alloc_rows(cfg->batch, w->out_row_bytes);
	if (!b->in || !b->out || !b->ref || !b->seq) {
		snprintf(err, errlen, "out of memory for a batch of %u %s", cfg->batch,
			 PLURAL(cfg->batch, "row", "rows"));
		return -1;
	}
	w->fill(w, b->in, cfg->batch);
	/* the baseline pins its thread only when the engine pins its stages (pin=0 in the engine options) */
	mbp_opts o;
	const char *env = getenv("MBPIPE_OPTS");
	mbp_opts_init(&o);
	if (env)
		(void)mbp_opts_parse(&o, env, NULL); /* validated by main */
	if (cfg->engine_opts)
		(void)mbp_opts_parse(&o, cfg->engine_opts, NULL);
	b->pin = o.pin;
	b->load_start = pb_loadavg();
	b->load_end = -1;
	return 0;
}

double pb_loadavg(void)
{
	double load = -1;
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf", &load) != 1)
			load = -1;
		fclose(f);
	}
	return load;
}

void pb_bench_fini(pb_bench *b)
{
	free(b->in);
	free(b->out);
	free(b->ref);
	free(b->seq);
	free(b->base.ms);
}

/* ---- the sequential baseline ---- */

struct seq_run {
	pb_bench *b;
	unsigned runs;
	double *ms;
	int cpu;
	char err[PB_ERR_MAX];
	int rc;
};

static void *seq_thread(void *arg)
{
	struct seq_run *sr = arg;
	pb_bench *b = sr->b;
	pb_workload *w = b->w;
	const uint32_t rows = b->cfg->batch;
	size_t width[MBP_MAX_STAGES + 1], maxw = 0;
	unsigned inited = 0;
	void *scratch[2] = {NULL, NULL};

	if (sr->cpu >= 0) { /* where stage 0 would run; a refusal only costs fairness, not correctness */
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(sr->cpu, &set);
		(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	}
	stage_widths(w, width);
	for (unsigned i = 0; i <= w->stages; i++)
		maxw = width[i] > maxw ? width[i] : maxw;
	scratch[0] = alloc_rows(rows, maxw);
	scratch[1] = alloc_rows(rows, maxw);
	if (!scratch[0] || !scratch[1]) {
		snprintf(sr->err, sizeof(sr->err), "baseline: out of memory");
		goto out;
	}
	for (; inited < w->stages; inited++) {
		const mbp_stage_desc *d = &w->desc_of[inited];
		int rc = d->init ? d->init(d->ctx, inited) : 0;
		if (rc < 0) {
			snprintf(sr->err, sizeof(sr->err), "baseline: stage %u init failed: %s", inited,
				 mbp_strerror(rc));
			goto out;
		}
	}
	for (unsigned run = 0; run < sr->runs; run++) {
		mbp_mb cur = {.data = b->in,
			      .capacity = rows * width[0],
			      .rows = rows,
			      .row_bytes = (uint32_t)width[0],
			      .stage = UINT32_MAX};
		uint64_t t0 = pb_now_ns();
		for (unsigned i = 0; i < w->stages; i++) {
			const mbp_stage_desc *d = &w->desc_of[i];
			mbp_mb next = cur;
			next.data = i + 1 == w->stages ? b->seq : scratch[i % 2];
			next.capacity = rows * maxw;
			next.row_bytes = (uint32_t)width[i + 1];
			next.stage = i;
			int rc = d->fn(d->ctx, &cur, &next);
			if (rc < 0) {
				snprintf(sr->err, sizeof(sr->err), "baseline: stage %u failed: %s", i,
					 mbp_strerror(rc));
				goto out;
			}
			cur = next;
		}
		sr->ms[run] = (double)(pb_now_ns() - t0) / 1e6;
		for (unsigned i = 0; i < w->stages; i++) /* as the engine does when a micro-batch leaves */
			if (w->desc_of[i].done)
				w->desc_of[i].done(w->desc_of[i].ctx, &cur);
	}
	sr->rc = 0;
out:
	while (inited > 0) {
		inited--;
		if (w->desc_of[inited].fini)
			w->desc_of[inited].fini(w->desc_of[inited].ctx);
	}
	free(scratch[0]);
	free(scratch[1]);
	return NULL;
}

int pb_baseline_run(pb_bench *b, unsigned runs, char *err, size_t errlen)
{
	pb_baseline *base = &b->base;
	if (base->runs + runs > base->cap) {
		unsigned cap = (base->runs + runs) * 2;
		double *ms = realloc(base->ms, cap * sizeof(double));
		if (!ms) {
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		base->ms = ms;
		base->cap = cap;
	}
	struct seq_run sr = {.b = b, .runs = runs, .ms = base->ms + base->runs, .rc = -1};
	sr.cpu = b->pin && b->cfg->ncpus ? b->cfg->cpus[0] : -1;
	pthread_t th;
	int rc = pthread_create(&th, NULL, seq_thread, &sr);
	if (rc) {
		snprintf(err, errlen, "baseline: cannot start a thread: %s", strerror(rc));
		return -1;
	}
	pthread_join(th, NULL);
	if (sr.rc) {
		snprintf(err, errlen, "%s", sr.err);
		return -1;
	}
	base->runs += runs;
	double *sorted = malloc(base->runs * sizeof(double));
	if (!sorted) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	memcpy(sorted, base->ms, base->runs * sizeof(double));
	qsort(sorted, base->runs, sizeof(double), cmp_double);
	base->median_ms = base->runs % 2 ? sorted[base->runs / 2]
					 : (sorted[base->runs / 2 - 1] + sorted[base->runs / 2]) / 2;
	base->min_ms = sorted[0];
	base->max_ms = sorted[base->runs - 1];
	free(sorted);
	base->throughput = base->median_ms > 0 ? b->cfg->batch / (base->median_ms / 1e3) : 0;
	b->done_units += runs;
	pb_progress(b->done_units, b->total_units, "baseline");
	return 0;
}

/* ---- one pipeline run ---- */

/* A stage as the engine sees it: the workload's stage, stamped. Only this stage's thread writes rec. */
struct wrap {
	mbp_stage_desc inner;
	uint64_t *rec; /* [cap][2]: begin, end of micro-batch seq of the latest job */
	uint32_t cap;
};

static int wrap_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	struct wrap *w = ctx;
	uint64_t t0 = pb_now_ns();
	int rc = w->inner.fn(w->inner.ctx, in, out);
	if (in->job && in->seq < w->cap) {
		w->rec[2 * in->seq] = t0;
		w->rec[2 * in->seq + 1] = pb_now_ns();
	}
	return rc;
}

static int wrap_init(void *ctx, unsigned stage)
{
	struct wrap *w = ctx;
	return w->inner.init ? w->inner.init(w->inner.ctx, stage) : 0;
}

static void wrap_fini(void *ctx)
{
	struct wrap *w = ctx;
	if (w->inner.fini)
		w->inner.fini(w->inner.ctx);
}

static void wrap_done(void *ctx, mbp_mb *mb)
{
	struct wrap *w = ctx;
	if (w->inner.done)
		w->inner.done(w->inner.ctx, mb);
}

/* One batch's bubble from its stamps: 1 - (time the stages spent computing it) / (T x its latency), T
 * worker threads. */
static double batch_bubble(const uint64_t *stamps, size_t words, unsigned T, uint64_t latency_ns)
{
	double busy = 0;
	for (size_t k = 0; k + 1 < words; k += 2) {
		const uint64_t *t = stamps + k;
		if (t[0] != UINT64_MAX && t[1] >= t[0])
			busy += (double)(t[1] - t[0]);
	}
	double b = 1.0 - busy / ((double)T * (double)latency_ns);
	return b < 0 ? 0 : b;
}

static int failf(pb_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int failf(pb_result *r, const char *fmt, ...)
{
	if (r->status == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->error, sizeof(r->error), fmt, ap);
		va_end(ap);
		r->status = -1;
	}
	return -1;
}

static int make_opts(const pb_bench *b, uint32_t mb_rows, bool trace, mbp_opts *o, pb_result *r)
{
	const pb_config *cfg = b->cfg;
	size_t pos = 0;
	mbp_opts_init(o);
	const char *env = getenv("MBPIPE_OPTS");
	if (env && mbp_opts_parse(o, env, &pos))
		return failf(r, "MBPIPE_OPTS: bad engine option at '%s'", env + pos);
	if (cfg->engine_opts && mbp_opts_parse(o, cfg->engine_opts, &pos))
		return failf(r, "--opts: bad engine option at '%s'", cfg->engine_opts + pos);
	o->in_row_bytes = b->w->in_row_bytes;
	o->max_mb_rows = mb_rows;
	if (cfg->spin_us >= 0)
		o->spin_ns = (uint64_t)cfg->spin_us * 1000;
	o->ncpus = cfg->ncpus;
	memcpy(o->cpus, cfg->cpus, cfg->ncpus * sizeof(int));
	o->trace_events = trace ? TRACE_EVENTS : 0;
	return 0;
}

/* One batch: clear the output, submit, wait, check. 0 with *ns the batch latency, or -1 (r->error set). */
static int run_batch(pb_bench *b, mbp_pipeline *p, uint32_t mb_rows, uint32_t mbs, pb_result *r, mbp_job *job,
		     uint64_t *start, uint64_t *ns)
{
	const pb_config *cfg = b->cfg;
	pb_workload *w = b->w;
	char err[PB_ERR_MAX];

	memset(b->out, 0xff, (size_t)cfg->batch * w->out_row_bytes); /* NaN and impossible stamps */
	mbp_job_init(job, b->in, b->out, cfg->batch, mb_rows);
	uint64_t t0 = pb_now_ns();
	int rc = mbp_job_submit(p, job, -1);
	if (rc < 0)
		return failf(r, "submit failed: %s", mbp_strerror(rc));
	/* a batch this late has lost micro-batches, unless the work itself is that long */
	int64_t timeout = (int64_t)(b->base.max_ms * 50 * 1e6);
	timeout = timeout > JOB_TIMEOUT_NS ? timeout : JOB_TIMEOUT_NS;
	rc = mbp_job_wait(job, timeout);
	uint64_t t1 = pb_now_ns();
	if (rc < 0)
		return failf(r, "a batch did not complete in %.0f s (micro-batches lost?): %s",
			     (double)timeout / 1e9, mbp_strerror(rc));
	if (job->status < 0) {
		const char *why = w->stage_error ? w->stage_error(w) : NULL;
		return failf(r, "a batch failed (%u of %u %s): %s%s%s", job->mbs_failed, job->mbs,
			     PLURAL(job->mbs, "micro-batch", "micro-batches"), mbp_strerror(job->status),
			     why ? ": " : "", why ? why : "");
	}
	if (job->mbs != mbs)
		return failf(r, "the engine split %u %s into %u micro-batches, expected %u", cfg->batch,
			     PLURAL(cfg->batch, "row", "rows"), job->mbs, mbs);
	if (w->check(w, b->out, b->ref, cfg->batch, err, sizeof(err)))
		return failf(r, "%s", err);
	/* the engine's stamps, when sane; else ours (which include the wake-up of this thread) */
	if (job->done_ns > job->submit_ns && job->submit_ns >= t0 && job->done_ns <= t1) {
		*start = job->submit_ns;
		*ns = job->done_ns - job->submit_ns;
	} else {
		*start = t0;
		*ns = t1 > t0 ? t1 - t0 : 1;
	}
	return 0;
}

/* The engine's own books must balance: everything accepted completed, nothing failed or lost. */
static void check_books(mbp_pipeline *p, uint64_t jobs, uint32_t mbs, uint32_t rows, pb_result *r)
{
	mbp_pipeline_stats fin;
	int rc = mbp_pipeline_stats_get(p, &fin, NULL, 0);
	if (rc < 0) {
		failf(r, "statistics unavailable: %s", mbp_strerror(rc));
		return;
	}
	if (fin.jobs_accepted != jobs || fin.jobs_completed + fin.jobs_failed != fin.jobs_accepted ||
	    fin.jobs_failed)
		failf(r,
		      "jobs: %" PRIu64 " submitted, %" PRIu64 " accepted, %" PRIu64 " completed, %" PRIu64
		      " failed",
		      jobs, fin.jobs_accepted, fin.jobs_completed, fin.jobs_failed);
	if (fin.mbs_accepted != jobs * mbs || fin.mbs_completed + fin.mbs_failed != fin.mbs_accepted ||
	    fin.mbs_failed)
		failf(r,
		      "micro-batches: %" PRIu64 " expected, %" PRIu64 " accepted, %" PRIu64
		      " completed, %" PRIu64 " failed",
		      jobs * mbs, fin.mbs_accepted, fin.mbs_completed, fin.mbs_failed);
	if (fin.rows_completed != jobs * rows)
		failf(r, "rows: %" PRIu64 " expected, %" PRIu64 " completed", jobs * rows,
		      fin.rows_completed);
}

static void fill_stages(pb_result *r, const mbp_pipeline_stats *ps, const mbp_stage_stats *ss,
			const mbp_placement *pl, unsigned S, uint64_t batches, uint32_t mbs)
{
	double window = (double)(ps->now_ns - ps->start_ns);
	for (unsigned i = 0; i < S; i++) {
		pb_stage_result *st = &r->st[i];
		/* A wait is charged when it ends, so one that straddles the window's start counts whole: a stage
		 * can show more waiting than the window holds. Shares are then of the time it accounted. */
		double acc = (double)(ss[i].busy_ns + ss[i].starved_ns + ss[i].blocked_ns);
		double denom = acc > window ? acc : window;
		snprintf(st->name, sizeof(st->name), "%s", ss[i].name);
		st->cpu = pl[i].cpu;
		st->pin_error = pl[i].pin_error;
		st->thread = pl[i].thread;
		st->mbs = ss[i].mbs;
		st->busy = denom > 0 ? (double)ss[i].busy_ns / denom : 0;
		st->starved = denom > 0 ? (double)ss[i].starved_ns / denom : 0;
		st->blocked = denom > 0 ? (double)ss[i].blocked_ns / denom : 0;
		st->service_us = ss[i].mbs ? (double)ss[i].busy_ns / (double)ss[i].mbs / 1e3 : 0;
		if (ss[i].mbs != batches * mbs)
			failf(r,
			      "stage %u computed %" PRIu64 " micro-batches in the window, expected %" PRIu64,
			      i, ss[i].mbs, batches * mbs);
		if (ss[i].failed)
			failf(r, "stage %u failed %" PRIu64 " micro-batches", i, ss[i].failed);
	}
}

/* Keep a batch's stamps as the timeline, in ns from its start. */
static void keep_timeline(pb_timeline *tl, const uint64_t *stamps, uint64_t start_ns, uint64_t span_ns)
{
	tl->span_ns = span_ns;
	for (size_t k = 0; k < (size_t)tl->stages * tl->mbs * 2; k++)
		tl->t[k] =
		    stamps[k] == UINT64_MAX || stamps[k] < start_ns ? UINT64_MAX : stamps[k] - start_ns;
}

/* Make the pipeline of the workload's stages, each wrapped to stamp into its rows of `stamps`, and start
 * it. 0, or -1 with r->error set (*p may then hold a pipeline to destroy). */
static int start_pipeline(pb_bench *b, const mbp_opts *o, struct wrap *wraps, uint64_t *stamps, uint32_t mbs,
			  mbp_pipeline **p, pb_result *r)
{
	pb_workload *w = b->w;
	int rc = mbp_pipeline_new(p, o);
	const char *why = NULL;
	if (rc < 0)
		return failf(r, "pipeline: %s", mbp_opts_check(o, &why) ? why : mbp_strerror(rc));
	for (unsigned i = 0; i < w->stages; i++) {
		wraps[i].inner = w->desc_of[i];
		wraps[i].rec = stamps + (size_t)i * mbs * 2;
		wraps[i].cap = mbs;
		mbp_stage_desc d = w->desc_of[i];
		d.fn = wrap_fn;
		d.init = wrap_init;
		d.fini = wrap_fini;
		d.done = wrap_done;
		d.ctx = &wraps[i];
		rc = mbp_pipeline_add_stage(*p, &d);
		if (rc < 0)
			return failf(r, "stage %u: %s", i, mbp_strerror(rc));
	}
	rc = mbp_pipeline_start(*p);
	if (rc < 0)
		return failf(r, "pipeline start: %s", mbp_strerror(rc));
	rc = mbp_pipeline_placement(*p, b->placement, MBP_MAX_STAGES);
	b->have_placement = rc > 0;
	for (unsigned i = 0; b->have_placement && i < w->stages; i++)
		for (unsigned j = 0; j < w->stages; j++)
			r->tl.share[i] += b->placement[j].thread == b->placement[i].thread;
	return 0;
}

int pb_measure(pb_bench *b, uint32_t mb_rows, unsigned warmup, unsigned batches, double duration_s,
	       const char *trace_path, pb_result *r)
{
	const pb_config *cfg = b->cfg;
	pb_workload *w = b->w;
	const unsigned S = w->stages;
	const uint32_t mbs = (uint32_t)((cfg->batch + mb_rows - 1) / mb_rows);
	struct wrap *wraps = NULL;
	mbp_stage_stats *ss_a = NULL, *ss_b = NULL;
	double *lat = NULL, *bub = NULL;
	size_t nlat = 0, latcap = 0;
	const size_t tl_words = (size_t)S * mbs * 2;
	uint64_t *cur = NULL, fastest = UINT64_MAX;
	mbp_pipeline *p = NULL;
	mbp_opts o;
	mbp_pipeline_stats ps_a, ps_b;
	mbp_job job;
	uint64_t jobs = 0;
	double lat_sum_ns = 0;
	char label[64];
	int rc;

	memset(r, 0, sizeof(*r));
	r->mb_rows = mb_rows;
	r->mbs = mbs;
	r->stages = S;
	snprintf(label, sizeof(label), "m=%u", mb_rows);
	if (w->reset)
		w->reset(w);
	if (make_opts(b, mb_rows, trace_path != NULL, &o, r))
		return r->status;

	wraps = calloc(S, sizeof(*wraps));
	ss_a = calloc(S, sizeof(*ss_a));
	ss_b = calloc(S, sizeof(*ss_b));
	cur = malloc(tl_words * sizeof(uint64_t));
	r->tl.t = malloc(tl_words * sizeof(uint64_t));
	if (!wraps || !ss_a || !ss_b || !cur || !r->tl.t) {
		failf(r, "out of memory");
		goto out;
	}
	r->tl = (pb_timeline){.mbs = mbs, .stages = S, .mb_rows = mb_rows, .t = r->tl.t};
	memset(cur, 0xff, tl_words * sizeof(uint64_t));
	if (start_pipeline(b, &o, wraps, cur, mbs, &p, r))
		goto out;

	for (unsigned i = 0; i < warmup; i++) {
		uint64_t t0, ns;
		jobs++;
		if (run_batch(b, p, mb_rows, mbs, r, &job, &t0, &ns))
			goto stop;
		b->done_units++;
		pb_progress(b->done_units, b->total_units, label);
	}
	if (mbp_pipeline_stats_get(p, &ps_a, ss_a, S) < 0) {
		failf(r, "statistics unavailable");
		goto stop;
	}
	r->threads = ps_a.threads;
	uint64_t t_start = pb_now_ns();
	for (;;) {
		if (duration_s > 0 ? (nlat > 0 && (double)(pb_now_ns() - t_start) / 1e9 >= duration_s)
				   : nlat == batches)
			break;
		uint64_t t0, ns;
		jobs++;
		if (run_batch(b, p, mb_rows, mbs, r, &job, &t0, &ns))
			goto stop;
		if (nlat == latcap) {
			latcap = latcap ? latcap * 2 : 64;
			double *nl = realloc(lat, latcap * sizeof(double));
			double *nb = realloc(bub, latcap * sizeof(double));
			if (nl)
				lat = nl;
			if (nb)
				bub = nb;
			if (!nl || !nb) {
				failf(r, "out of memory");
				goto stop;
			}
		}
		bub[nlat] = batch_bubble(cur, tl_words, r->threads, ns);
		if (ns < fastest) {
			fastest = ns;
			keep_timeline(&r->tl, cur, t0, ns);
		}
		lat[nlat++] = (double)ns;
		lat_sum_ns += (double)ns;
		if (duration_s <= 0) /* with a duration the bar counts sizes only */
			b->done_units++;
		pb_progress(b->done_units, b->total_units, label);
	}
	if (mbp_pipeline_stats_get(p, &ps_b, ss_b, S) < 0) {
		failf(r, "statistics unavailable");
		goto stop;
	}
	mbp_stats_window(&ps_b, ss_b, &ps_a, ss_a, S);

	r->batches = (unsigned)nlat;
	qsort(lat, nlat, sizeof(double), cmp_double);
	r->p50_ms = percentile(lat, nlat, 0.50) / 1e6;
	r->p99_ms = percentile(lat, nlat, 0.99) / 1e6;
	r->mean_ms = lat_sum_ns / (double)nlat / 1e6;
	r->throughput = (double)cfg->batch * (double)nlat / (lat_sum_ns / 1e9);
	r->throughput_window = ps_b.throughput;
	r->bubble_window = ps_b.bubble;
	qsort(bub, nlat, sizeof(double), cmp_double);
	r->bubble = percentile(bub, nlat, 0.50);
	r->speedup = b->base.throughput > 0 ? r->throughput / b->base.throughput : 0; /* main: all runs */
	fill_stages(r, &ps_b, ss_b, b->placement, S, nlat, mbs);
	pb_predict(r);

stop:
	rc = mbp_pipeline_drain(p, DRAIN_TIMEOUT_NS);
	if (rc < 0)
		failf(r, "drain: %s", mbp_strerror(rc));
	else
		check_books(p, jobs, mbs, cfg->batch, r);
	if (trace_path && r->status == 0) {
		rc = mbp_pipeline_trace_write(p, trace_path);
		if (rc < 0)
			failf(r, "--trace %s: %s", trace_path, mbp_strerror(rc));
	}
out:
	mbp_pipeline_destroy(p);
	if (r->status == 0 && w->stage_error && w->stage_error(w))
		failf(r, "%s", w->stage_error(w));
	free(wraps);
	free(ss_a);
	free(ss_b);
	free(lat);
	free(bub);
	free(cur);
	return r->status;
}

void pb_result_fini(pb_result *r)
{
	free(r->tl.t);
	r->tl.t = NULL;
}

/*
 * pipebench measurement: the sequential baseline and one pipeline per micro-batch size, as arms of the
 * interleaved schedule (interleave.c).
 *
 * Every size keeps its own stages, reference output and started pipeline for the whole run, so that the
 * schedule can visit the sizes in turn; an idle pipeline's threads park and cost nothing. A visit submits
 * one batch at a time (a job of `batch` rows split into micro-batches of m rows), waits for it, checks its
 * output and submits the next: each batch fills and drains the pipeline, which is the schedule GPipe's
 * bubble formula describes. The first `warm` batches of a visit are not measured (the threads wake up from
 * their park, the caches fill with this size's data); the engine's statistics are snapshotted around the
 * measured ones and added up over the visits. Each stage is wrapped so that the begin and end of every
 * micro-batch it computes are stamped, which gives the bubble of every batch and the Gantt chart without
 * depending on the trace format.
 *
 * The Gantt chart shows the fastest measured batch: the one the machine's other load disturbed least,
 * which shows the schedule itself.
 *
 * The measured bubble of a batch is 1 - busy / (T x latency), where busy is the time the stages spent
 * computing that batch (from the stamps), latency its submission to completion and T the worker threads
 * (S, unless stages outnumber CPUs and share threads): the idle share of the workers while a batch is in
 * flight. The caller's own gaps between batches (checking the output) do not count. A row reports the
 * median over its batches and the interval of that median.
 *
 * The baseline runs the same stage functions in order, on one thread made for each visit (pinned where
 * stage 0 would be), over the whole batch at once: the best a single thread does with this code.
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
#include "util/plural.h"

#define JOB_TIMEOUT_NS	 (120 * INT64_C(1000000000)) /* at least; 50 slowest baselines if longer */
#define DRAIN_TIMEOUT_NS (30 * INT64_C(1000000000))
#define TRACE_EVENTS	 65536

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
	b->base.ref = alloc_rows(cfg->batch, w->out_row_bytes);
	b->seq = alloc_rows(cfg->batch, w->out_row_bytes);
	if (!b->in || !b->out || !b->base.ref || !b->seq) {
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
	b->pin = o.pinning == MBP_PIN_PLAN;
	b->load_start = pb_loadavg();
	b->load_end = -1;
	pb_noise_init(&b->noise, cfg->cpus, ncpus);
	return 0;
}

void pb_bench_fini(pb_bench *b)
{
	if (b->base_inst && b->w->release)
		b->w->release(b->w, b->base_inst);
	free(b->in);
	free(b->out);
	free(b->base.ref);
	free(b->seq);
}

/* ---- the sequential baseline ---- */

struct seq_run {
	pb_bench *b;
	unsigned warm, units;
	uint64_t ns; /* the measured batches' time */
	int cpu;
	char err[PB_ERR_MAX];
	int rc;
};

/* Run the baseline's stages over the whole batch once, into b->seq. 0, or -1 with sr->err set. */
static int seq_batch(struct seq_run *sr, const size_t *width, size_t maxw, void *const *scratch)
{
	pb_bench *b = sr->b;
	const mbp_stage_desc *desc = b->base.desc;
	const unsigned S = b->w->stages;
	const uint32_t rows = b->cfg->batch;
	mbp_mb cur = {.data = b->in,
		      .capacity = rows * width[0],
		      .rows = rows,
		      .row_bytes = (uint32_t)width[0],
		      .stage = UINT32_MAX};
	for (unsigned i = 0; i < S; i++) {
		mbp_mb next = cur;
		next.data = i + 1 == S ? b->seq : scratch[i % 2];
		next.capacity = rows * maxw;
		next.row_bytes = (uint32_t)width[i + 1];
		next.stage = i;
		int rc = desc[i].fn(desc[i].ctx, &cur, &next);
		if (rc < 0) {
			snprintf(sr->err, sizeof(sr->err), "baseline: stage %u failed: %s", i,
				 mbp_strerror(rc));
			return -1;
		}
		cur = next;
	}
	for (unsigned i = 0; i < S; i++) /* as the engine does when a micro-batch leaves */
		if (desc[i].done)
			desc[i].done(desc[i].ctx, &cur);
	return 0;
}

static void *seq_thread(void *arg)
{
	struct seq_run *sr = arg;
	pb_bench *b = sr->b;
	pb_workload *w = b->w;
	const mbp_stage_desc *desc = b->base.desc;
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
	width[0] = w->in_row_bytes;
	for (unsigned i = 0; i < w->stages; i++)
		width[i + 1] = desc[i].out_row_bytes ? desc[i].out_row_bytes : width[i];
	for (unsigned i = 0; i <= w->stages; i++)
		maxw = width[i] > maxw ? width[i] : maxw;
	scratch[0] = alloc_rows(rows, maxw);
	scratch[1] = alloc_rows(rows, maxw);
	if (!scratch[0] || !scratch[1]) {
		snprintf(sr->err, sizeof(sr->err), "baseline: out of memory");
		goto out;
	}
	for (; inited < w->stages; inited++) {
		int rc = desc[inited].init ? desc[inited].init(desc[inited].ctx, inited) : 0;
		if (rc < 0) {
			snprintf(sr->err, sizeof(sr->err), "baseline: stage %u init failed: %s", inited,
				 mbp_strerror(rc));
			goto out;
		}
	}
	for (unsigned run = 0; run < sr->warm + sr->units; run++) {
		uint64_t t0 = mbt_now_ns();
		if (seq_batch(sr, width, maxw, scratch))
			goto out;
		if (run >= sr->warm)
			sr->ns += mbt_now_ns() - t0;
	}
	sr->rc = 0;
out:
	while (inited > 0) {
		inited--;
		if (desc[inited].fini)
			desc[inited].fini(desc[inited].ctx);
	}
	free(scratch[0]);
	free(scratch[1]);
	return NULL;
}

int pb_baseline_visit(void *ctx, unsigned warm, unsigned units, double *rate, char *err, size_t errlen)
{
	pb_bench *b = ctx;
	pb_workload *w = b->w;
	const uint32_t rows = b->cfg->batch;
	struct seq_run sr = {.b = b, .warm = warm, .units = units, .rc = -1};
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
	if (!b->base_ref_ok) { /* no reference of its own: the first output is it (the check is the workload's) */
		memcpy(b->base.ref, b->seq, (size_t)rows * w->out_row_bytes);
		b->base_ref_ok = true;
	}
	/* the baseline is checked like the pipeline: a broken stage shows here too */
	char why[PB_ERR_MAX];
	if (w->check(w, b->seq, b->base.ref, rows, why, sizeof(why))) {
		snprintf(err, errlen, "the sequential baseline is wrong: %.200s", why);
		return -1;
	}
	double ms = (double)sr.ns / 1e6 / units;
	b->base.runs += units;
	if (ms > b->base.max_ms)
		b->base.max_ms = ms; /* for the jobs' time-outs */
	*rate = sr.ns ? (double)rows * units / ((double)sr.ns / 1e9) : 0;
	return 0;
}

void pb_baseline_sum(pb_bench *b, const pb_arm *arm)
{
	pb_baseline *base = &b->base;
	const double rows = b->cfg->batch;
	base->thr = arm->iv;
	base->throughput = arm->iv.median;
	base->median_ms = base->throughput > 0 ? rows / base->throughput * 1e3 : 0;
	base->min_ms = arm->iv.max > 0 ? rows / arm->iv.max * 1e3 : 0;
	base->max_ms = arm->iv.min > 0 ? rows / arm->iv.min * 1e3 : 0;
	unsigned loud = 0;
	for (unsigned i = 0; i < arm->n; i++)
		loud += arm->loud[i];
	base->loud_share = arm->n ? (double)loud / arm->n : 0;
	base->loud = base->loud_share > PB_LOUD_SHARE;
}

/* ---- one pipeline per size ---- */

static int stamp_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	pb_stamp *s = ctx;
	uint64_t t0 = mbt_now_ns();
	int rc = s->inner.fn(s->inner.ctx, in, out);
	uint64_t k = s->seq_of ? s->seq_of(in) : in->seq;
	if (k < s->cap) {
		s->rec[2 * k] = t0;
		s->rec[2 * k + 1] = mbt_now_ns();
	}
	return rc;
}

static int stamp_init(void *ctx, unsigned stage)
{
	pb_stamp *s = ctx;
	return s->inner.init ? s->inner.init(s->inner.ctx, stage) : 0;
}

static void stamp_fini(void *ctx)
{
	pb_stamp *s = ctx;
	if (s->inner.fini)
		s->inner.fini(s->inner.ctx);
}

static void stamp_done(void *ctx, mbp_mb *mb)
{
	pb_stamp *s = ctx;
	if (s->inner.done)
		s->inner.done(s->inner.ctx, mb);
}

mbp_stage_desc pb_stamp_desc(pb_stamp *s)
{
	mbp_stage_desc d = s->inner;
	d.fn = stamp_fn;
	d.init = stamp_init;
	d.fini = stamp_fini;
	d.done = stamp_done;
	d.ctx = s;
	return d;
}

struct pb_cand {
	pb_bench *b;
	pb_result *r;
	uint32_t mb_rows, mbs;
	mbp_stage_desc desc[MBP_MAX_STAGES];
	void *inst; /* the workload's, for release() */
	void *ref;  /* the reference output for this size (or the baseline's) */
	bool own_ref;
	mbp_pipeline *p;
	pb_stamp *wraps;
	uint64_t *cur; /* the stamps of the batch in flight */
	size_t tl_words;
	uint64_t jobs;
	double *lat, *bub; /* per measured batch: latency (ns), bubble */
	size_t nlat, cap;
	double lat_sum_ns;
	double stamp_busy_ns; /* the stages' time inside their functions, from the stamps */
	uint64_t fastest;
	/* the engine's counters over the measured part of every visit */
	mbp_stage_stats sum[MBP_MAX_STAGES]; /* replicas: those made; active: those taking micro-batches at
						the end of the last visit; parked_ns: the engine's count of
						its replicas' time parked (--rebalance-replicas) */
	uint64_t window_ns;
	uint32_t threads; /* the threads taking micro-batches at the start of the last visit */
};

/* The replicas of a stage set inactive (parked, or about to park) in a statistics snapshot. */
static unsigned inactive(const mbp_stage_stats *ss)
{
	return ss->active && ss->active < ss->replicas ? ss->replicas - ss->active : 0;
}

/* One batch's bubble from its stamps: 1 - (time the stages spent computing it) / (T x its latency), T
 * worker threads. *busy receives that time. */
static double batch_bubble(const uint64_t *stamps, size_t words, unsigned T, uint64_t latency_ns,
			   double *busy)
{
	*busy = 0;
	for (size_t k = 0; k + 1 < words; k += 2) {
		const uint64_t *t = stamps + k;
		if (t[0] != UINT64_MAX && t[1] >= t[0])
			*busy += (double)(t[1] - t[0]);
	}
	double b = 1.0 - *busy / ((double)T * (double)latency_ns);
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

/* The engine's options for a pipeline of `threads` threads: MBPIPE_OPTS, then --opts, then what the run
 * fixes. Unpinned, unless pin= says otherwise, where --rebalance-replicas makes more threads than CPUs:
 * the plan would pin two of them to one CPU, and those two may be active while another CPU holds only
 * parked ones (as pipeserve does). */
static int make_opts(const pb_bench *b, uint32_t mb_rows, bool trace, unsigned threads, mbp_opts *o,
		     pb_result *r)
{
	const pb_config *cfg = b->cfg;
	size_t pos = 0;
	mbp_opts_init(o);
	if (cfg->rebalance_replicas && threads > b->ncpus)
		o->pinning = MBP_PIN_NONE;
	const char *env = getenv("MBPIPE_OPTS");
	if (env && mbp_opts_parse(o, env, &pos))
		return failf(r, "MBPIPE_OPTS: bad engine option at '%s'", env + pos);
	if (cfg->engine_opts && mbp_opts_parse(o, cfg->engine_opts, &pos))
		return failf(r, "--opts: bad engine option at '%s'", cfg->engine_opts + pos);
	o->in_row_bytes = b->w->in_row_bytes;
	o->max_mb_rows = mb_rows;
	o->spin_ns = pb_spin_ns(cfg, o->spin_ns);
	o->ncpus = cfg->ncpus;
	memcpy(o->cpus, cfg->cpus, cfg->ncpus * sizeof(int));
	o->trace_events = trace ? TRACE_EVENTS : 0;
	return 0;
}

/* One batch: clear the output, submit, wait, check. 0 with *ns the batch latency, or -1 (r->error set). */
static int run_batch(pb_cand *c, mbp_job *job, uint64_t *start, uint64_t *ns)
{
	pb_bench *b = c->b;
	pb_result *r = c->r;
	const pb_config *cfg = b->cfg;
	pb_workload *w = b->w;
	char err[PB_ERR_MAX];

	memset(b->out, 0xff, (size_t)cfg->batch * w->out_row_bytes); /* NaN and impossible stamps */
	mbp_job_init(job, b->in, b->out, cfg->batch, c->mb_rows);
	c->jobs++;
	uint64_t t0 = mbt_now_ns();
	int rc = mbp_job_submit(c->p, job, -1);
	if (rc < 0) {
		mbp_pipeline_refusal rf = {0}; /* the limit, when it was one */
		mbp_pipeline_error(c->p, &rf);
		return failf(r, "submit failed: %s%s%s", mbp_strerror(rc), rf.err == rc ? ": " : "",
			     rf.err == rc ? rf.what : "");
	}
	/* a batch this late has lost micro-batches, unless the work itself is that long */
	int64_t timeout = (int64_t)(b->base.max_ms * 50 * 1e6);
	timeout = timeout > JOB_TIMEOUT_NS ? timeout : JOB_TIMEOUT_NS;
	rc = mbp_job_wait(job, timeout);
	uint64_t t1 = mbt_now_ns();
	if (rc < 0)
		return failf(r, "a batch did not complete in %.0f s (micro-batches lost?): %s",
			     (double)timeout / 1e9, mbp_strerror(rc));
	if (job->status < 0) {
		const char *why = w->stage_error ? w->stage_error(w) : NULL;
		return failf(r, "a batch failed (%u of %u %s): %s%s%s", job->mbs_failed, job->mbs,
			     PLURAL(job->mbs, "micro-batch", "micro-batches"), mbp_strerror(job->status),
			     why ? ": " : "", why ? why : "");
	}
	if (job->mbs != c->mbs)
		return failf(r, "the engine split %u %s into %u micro-batches, expected %u", cfg->batch,
			     PLURAL(cfg->batch, "row", "rows"), job->mbs, c->mbs);
	if (w->check(w, b->out, c->ref, cfg->batch, err, sizeof(err)))
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

/* The stage rows of the result from the counters added up over the visits. */
static void fill_stages(pb_cand *c)
{
	pb_result *r = c->r;
	const mbp_placement *pl = c->b->placement;
	const double window = (double)c->window_ns;
	uint64_t batches = c->nlat;
	double busy = 0;
	for (unsigned i = 0; i < r->stages; i++) {
		const mbp_stage_stats *ss = &c->sum[i];
		pb_stage_result *st = &r->st[i];
		snprintf(st->name, sizeof(st->name), "%s", ss->name);
		st->cpu = pl[i].cpu;
		st->pin_error = pl[i].pin_error;
		st->thread = pl[i].thread;
		st->mbs = ss->mbs;
		st->replicas_made = ss->replicas ? ss->replicas : 1;
		st->replicas = st->replicas_made - inactive(ss);
		/* the stage's replicas' windows, less their time parked (the engine counts it where a
		 * replica parks and wakes): busy, starved and blocked are shares of the rest */
		double made = window * st->replicas_made;
		double threads = made - (double)ss->parked_ns;
		st->parked = made > 0 ? (double)ss->parked_ns / made : 0;
		st->busy = threads > 0 ? (double)ss->busy_ns / threads : 0;
		st->starved = threads > 0 ? (double)ss->starved_ns / threads : 0;
		st->blocked = threads > 0 ? (double)ss->blocked_ns / threads : 0;
		st->service_us = ss->mbs ? (double)ss->busy_ns / (double)ss->mbs / 1e3 : 0;
		busy += (double)ss->busy_ns;
		if (ss->mbs != batches * c->mbs)
			failf(r,
			      "stage %u computed %" PRIu64 " micro-batches in the window, expected %" PRIu64,
			      i, ss->mbs, batches * c->mbs);
		if (ss->failed)
			failf(r, "stage %u failed %" PRIu64 " micro-batches", i, ss->failed);
	}
	r->stage_busy_ms = batches ? busy / (double)batches / 1e6 : 0;
	r->inflight_share = window > 0 ? c->lat_sum_ns / window : 0;
}

/* Keep a batch's stamps as the timeline, in ns from its start. */
static void keep_timeline(pb_timeline *tl, const uint64_t *stamps, uint64_t start_ns, uint64_t span_ns)
{
	tl->span_ns = span_ns;
	for (size_t k = 0; k < (size_t)tl->stages * tl->mbs * 2; k++)
		tl->t[k] =
		    stamps[k] == UINT64_MAX || stamps[k] < start_ns ? UINT64_MAX : stamps[k] - start_ns;
}

/* Make the pipeline of the size's stages, each wrapped to stamp into its rows of c->cur, and start it. 0,
 * or -1 with r->error set (c->p may then hold a pipeline to destroy). */
static int start_pipeline(pb_cand *c, const mbp_opts *o)
{
	pb_bench *b = c->b;
	pb_result *r = c->r;
	const unsigned S = b->w->stages;
	int rc = mbp_pipeline_new(&c->p, o);
	const char *why = NULL;
	if (rc < 0)
		return failf(r, "pipeline: %s", mbp_opts_check(o, &why) ? why : mbp_strerror(rc));
	for (unsigned i = 0; i < S; i++) {
		c->wraps[i] =
		    (pb_stamp){.inner = c->desc[i], .rec = c->cur + (size_t)i * c->mbs * 2, .cap = c->mbs};
		/* --replicas N,..; the mlp's plan has them (and auto), in its descriptors */
		if (b->cfg->nreplicas && !b->w->prepare)
			c->wraps[i].inner.replicas = b->cfg->replicas[b->cfg->nreplicas > 1 ? i : 0];
		mbp_stage_desc d = pb_stamp_desc(&c->wraps[i]);
		rc = mbp_pipeline_add_stage(c->p, &d);
		if (rc < 0)
			return failf(r, "stage %u: %s", i, mbp_strerror(rc));
	}
	char err[PB_ERR_MAX];
	if (c->inst && b->w->attach && b->w->attach(b->w, c->inst, c->p, err, sizeof err))
		return failf(r, "%s", err);
	rc = mbp_pipeline_start(c->p);
	if (rc < 0) {
		mbp_pipeline_refusal rf = {0}; /* the limit, when it was one */
		mbp_pipeline_error(c->p, &rf);
		return failf(r, "pipeline start: %s%s%s", mbp_strerror(rc), rf.err == rc ? ": " : "",
			     rf.err == rc ? rf.what : "");
	}
	rc = mbp_pipeline_placement(c->p, b->placement, MBP_MAX_STAGES);
	b->have_placement = rc > 0;
	for (unsigned i = 0; b->have_placement && i < S; i++) {
		mbp_stage_stats rs[MBP_MAX_REPLICAS];
		int n = mbp_pipeline_replica_stats(c->p, i, rs, MBP_MAX_REPLICAS);
		b->replicas[i] = n > 0 ? (unsigned)n : 1;
		for (int j = 0; j < n; j++)
			b->replica_cpu[i][j] = rs[j].cpu;
	}
	for (unsigned i = 0; b->have_placement && i < S; i++)
		for (unsigned j = 0; j < S; j++)
			r->tl.share[i] += b->placement[j].thread == b->placement[i].thread;
	return 0;
}

int pb_cand_open(pb_bench *b, uint32_t mb_rows, bool trace, pb_cand **out, pb_result *r)
{
	const pb_config *cfg = b->cfg;
	pb_workload *w = b->w;
	const unsigned S = w->stages;
	char err[PB_ERR_MAX];
	mbp_opts o;

	memset(r, 0, sizeof(*r));
	r->rows = cfg->batch;
	r->mb_rows = mb_rows;
	r->mbs = (uint32_t)((cfg->batch + mb_rows - 1) / mb_rows);
	r->stages = S;
	pb_cand *c = calloc(1, sizeof(*c));
	*out = c;
	if (!c)
		return failf(r, "out of memory");
	c->b = b;
	c->r = r;
	c->mb_rows = mb_rows;
	c->mbs = r->mbs;
	c->fastest = UINT64_MAX;
	c->tl_words = (size_t)S * c->mbs * 2;
	if (w->prepare) {
		if (w->prepare(w, mb_rows, c->desc, &c->inst, err, sizeof(err)))
			return failf(r, "%s", err);
	} else {
		memcpy(c->desc, w->desc_of, sizeof(c->desc));
	}
	if (w->reference) {
		c->ref = alloc_rows(cfg->batch, w->out_row_bytes);
		c->own_ref = true;
		if (!c->ref)
			return failf(r, "out of memory");
		if (w->reference(w, b->in, c->ref, cfg->batch, mb_rows, err, sizeof(err)))
			return failf(r, "%s", err);
	} else {
		c->ref = b->base.ref; /* the baseline's output: the baseline is visited first */
	}
	unsigned threads = 0;
	for (unsigned i = 0; i < S; i++)
		threads += c->desc[i].replicas ? c->desc[i].replicas : 1;
	if (make_opts(b, mb_rows, trace, threads, &o, r))
		return -1;
	c->wraps = calloc(S, sizeof(*c->wraps));
	c->cur = malloc(c->tl_words * sizeof(uint64_t));
	r->tl.t = malloc(c->tl_words * sizeof(uint64_t));
	if (!c->wraps || !c->cur || !r->tl.t)
		return failf(r, "out of memory");
	r->tl = (pb_timeline){.mbs = c->mbs, .stages = S, .mb_rows = mb_rows, .t = r->tl.t};
	memset(c->cur, 0xff, c->tl_words * sizeof(uint64_t));
	return start_pipeline(c, &o);
}

static int record(pb_cand *c, uint64_t start, uint64_t ns)
{
	if (c->nlat == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 64;
		double *nl = realloc(c->lat, cap * sizeof(double));
		if (nl)
			c->lat = nl;
		double *nb = realloc(c->bub, cap * sizeof(double));
		if (nb)
			c->bub = nb;
		if (!nl || !nb)
			return failf(c->r, "out of memory");
		c->cap = cap;
	}
	double busy;
	c->bub[c->nlat] =
	    batch_bubble(c->cur, c->tl_words, c->threads ? c->threads : c->r->stages, ns, &busy);
	if (ns < c->fastest) {
		c->fastest = ns;
		keep_timeline(&c->r->tl, c->cur, start, ns);
	}
	c->lat[c->nlat++] = (double)ns;
	c->lat_sum_ns += (double)ns;
	c->stamp_busy_ns += busy;
	return 0;
}

int pb_cand_visit(void *ctx, unsigned warm, unsigned units, double *rate, char *err, size_t errlen)
{
	pb_cand *c = ctx;
	pb_result *r = c->r;
	const unsigned S = r->stages;
	mbp_pipeline_stats pa, pz;
	mbp_stage_stats sa[MBP_MAX_STAGES], sz[MBP_MAX_STAGES];
	mbp_job job;
	uint64_t start, ns, visit_ns = 0;

	if (r->status)
		goto fail;
	for (unsigned i = 0; i < warm; i++)
		if (run_batch(c, &job, &start, &ns))
			goto fail;
	if (mbp_pipeline_stats_get(c->p, &pa, sa, S) < 0) {
		failf(r, "statistics unavailable");
		goto fail;
	}
	c->threads = pa.threads;
	for (unsigned i = 0; i < S; i++)
		c->threads -= inactive(&sa[i]);
	r->threads = c->threads;
	for (unsigned i = 0; i < units; i++) {
		if (run_batch(c, &job, &start, &ns) || record(c, start, ns))
			goto fail;
		visit_ns += ns;
	}
	if (mbp_pipeline_stats_get(c->p, &pz, sz, S) < 0) {
		failf(r, "statistics unavailable");
		goto fail;
	}
	c->window_ns += pz.now_ns - pa.now_ns;
	for (unsigned i = 0; i < S; i++) {
		mbp_stage_stats *t = &c->sum[i];
		memcpy(t->name, sz[i].name, sizeof(t->name));
		t->replicas = sz[i].replicas;
		t->active = sz[i].active;
		t->parked_ns += sz[i].parked_ns - sa[i].parked_ns;
		t->mbs += sz[i].mbs - sa[i].mbs;
		t->failed += sz[i].failed - sa[i].failed;
		t->busy_ns += sz[i].busy_ns - sa[i].busy_ns;
		t->starved_ns += sz[i].starved_ns - sa[i].starved_ns;
		t->blocked_ns += sz[i].blocked_ns - sa[i].blocked_ns;
	}
	*rate = visit_ns ? (double)c->b->cfg->batch * units / ((double)visit_ns / 1e9) : 0;
	return 0;
fail:
	snprintf(err, errlen, "%s", r->error);
	return -1;
}

int pb_cand_close(pb_cand *c, const pb_arm *arm, const char *trace_path)
{
	if (!c)
		return -1;
	pb_bench *b = c->b;
	pb_workload *w = b->w;
	pb_result *r = c->r;
	int rc;

	if (c->p) {
		rc = mbp_pipeline_drain(c->p, DRAIN_TIMEOUT_NS);
		if (rc < 0)
			failf(r, "drain: %s", mbp_strerror(rc));
		else
			check_books(c->p, c->jobs, c->mbs, b->cfg->batch, r);
		if (trace_path && r->status == 0) {
			rc = mbp_pipeline_trace_write(c->p, trace_path);
			if (rc < 0)
				failf(r, "--trace %s: %s", trace_path, mbp_strerror(rc));
		}
		mbp_pipeline_destroy(c->p);
	}
	if (r->status == 0 && w->stage_error && w->stage_error(w))
		failf(r, "%s", w->stage_error(w));

	const size_t n = c->nlat;
	r->batches = (unsigned)n;
	if (n > 0) {
		r->p50_ms = pb_percentile(c->lat, (unsigned)n, 0.50) / 1e6;
		r->p99_ms = pb_percentile(c->lat, (unsigned)n, 0.99) / 1e6;
		r->mean_ms = c->lat_sum_ns / (double)n / 1e6;
		pb_interval_of(c->bub, (unsigned)n, &r->bubble_iv);
		r->bubble = r->bubble_iv.median;
		unsigned T0 = c->threads ? c->threads : r->stages;
		r->bubble_all = 1.0 - c->stamp_busy_ns / ((double)T0 * c->lat_sum_ns);
		r->throughput_window =
		    c->window_ns ? (double)b->cfg->batch * n / ((double)c->window_ns / 1e9) : 0;
		double busy = 0;
		for (unsigned i = 0; i < r->stages; i++)
			busy += (double)c->sum[i].busy_ns;
		unsigned T = c->threads ? c->threads : r->stages;
		r->bubble_window = c->window_ns ? 1.0 - busy / ((double)T * (double)c->window_ns) : 0;
		if (arm && arm->n) {
			r->thr = arm->iv;
			r->rate = arm->rate;
			r->repeats = arm->n;
			unsigned loud = 0;
			for (unsigned i = 0; i < arm->n; i++)
				loud += arm->loud[i];
			r->loud_share = (double)loud / arm->n;
			r->loud = r->loud_share > PB_LOUD_SHARE;
		} else { /* a run outside the schedule (the Gantt chart's whole batch, the trace) */
			double rt = (double)b->cfg->batch * n / (c->lat_sum_ns / 1e9);
			r->thr =
			    (pb_interval){.median = rt, .lo = rt, .hi = rt, .min = rt, .max = rt, .n = 1};
			r->repeats = 1;
		}
		r->throughput = r->thr.median;
		fill_stages(c);
		pb_predict(r);
	}
	if (c->inst && w->rebalance_stats)
		w->rebalance_stats(w, c->inst, &r->rb);
	if (c->inst && w->release)
		w->release(w, c->inst);
	if (c->own_ref)
		free(c->ref);
	free(c->wraps);
	free(c->cur);
	free(c->lat);
	free(c->bub);
	free(c);
	return r->status;
}

void pb_result_fini(pb_result *r)
{
	free(r->tl.t);
	r->tl.t = NULL;
}

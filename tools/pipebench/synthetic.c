/*
 * pipebench synthetic workload: stages that burn a calibrated amount of CPU per row and per micro-batch.
 *
 * The busy work is a dependent chain of multiply-adds whose iteration count was calibrated at start-up
 * (the fastest of several timed runs), so a stage does a fixed amount of computation, not a fixed amount
 * of wall time: a stage that shares its CPU with another takes longer, as real work would, and the
 * sequential baseline does exactly the same work on one thread.
 *
 * Every stage also reads each word of its input rows and writes each word of its output rows, so a row of
 * B bytes is traffic between the stages' cores. What it writes lets the tool prove the run was right:
 *   word 0  the row's stamp, copied unchanged: a row in the wrong place or missing shows at once;
 *   word 1  a chain x -> 31 x + (stage + 1): the stages ran on it exactly once each and in order;
 *   others  x -> x + K(stage): every word went through every stage.
 * Each stage also checks, per job, that micro-batches arrive in sequence with the expected row count and
 * fails the micro-batch (EPROTO) when they do not, naming what it saw in the workload's error line.
 *
 * PIPEBENCH_FAULT=lose|reorder|wrong makes the last stage break its output in the pipeline (never in the
 * baseline), so the tests can prove that each kind of broken invariant ends the run with exit status 1.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipebench.h"
#include "util/burn.h"
#include "util/plural.h"

#define STAMP(r) (UINT64_C(0x5eed000000000000) ^ (uint64_t)(r))
#define K(i)	 (((uint64_t)(i) + 1) * UINT64_C(0x9e3779b97f4a7c15))

enum fault { FAULT_NONE, FAULT_LOSE, FAULT_REORDER, FAULT_WRONG };

struct syn_stage {
	struct syn *owner;
	enum fault fault; /* only the last stage's is set */
	unsigned index;
	uint64_t iters_row, iters_mb;
	/* order check: only this stage's thread (or the baseline thread, never at the same time); a
	 * replicated stage's replicas each see part of the stream, so it checks nothing here (the next
	 * stage's check and the output's chain do) */
	bool replicated;
	const void *job;
	uint64_t next_seq;
	uint64_t job_mbs;
	uint64_t sink[MBP_MAX_REPLICAS]; /* each replica's own */
};

struct syn {
	pb_workload w;
	struct syn_stage st[MBP_MAX_STAGES];
	double iters_per_us;
	atomic_flag failed; /* the first failing stage writes w.error */
	char error[PB_ERR_MAX];
};

static void stage_fail(struct syn *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void stage_fail(struct syn *s, const char *fmt, ...)
{
	if (atomic_flag_test_and_set(&s->failed))
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->error, sizeof(s->error), fmt, ap);
	va_end(ap);
}

/* Micro-batches of one job must reach each stage in sequence, each with its share of the rows. */
static int check_order(struct syn_stage *st, const mbp_mb *in)
{
	const mbp_job *job = in->job;
	uint64_t mbs = (job->rows + job->mb_rows - 1) / job->mb_rows;
	if (in->seq == 0) {
		if (st->job && st->next_seq != st->job_mbs) {
			stage_fail(st->owner,
				   "stage %u: a new job began after %" PRIu64 " of %" PRIu64
				   " micro-batches of the previous one (lost)",
				   st->index, st->next_seq, st->job_mbs);
			return -1;
		}
		st->job = job;
		st->next_seq = 0;
		st->job_mbs = mbs;
	}
	if (job != st->job || in->seq != st->next_seq) {
		stage_fail(st->owner,
			   "stage %u: micro-batch %" PRIu64 " arrived when %" PRIu64
			   " was due (out of order)",
			   st->index, in->seq, st->next_seq);
		return -1;
	}
	uint64_t want = in->seq + 1 < mbs ? job->mb_rows : job->rows - in->seq * job->mb_rows;
	if (in->rows != want) {
		stage_fail(st->owner, "stage %u: micro-batch %" PRIu64 " has %u %s, expected %" PRIu64,
			   st->index, in->seq, in->rows, PLURAL(in->rows, "row", "rows"), want);
		return -1;
	}
	st->next_seq++;
	return 0;
}

static int syn_stage_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	struct syn_stage *st = ctx;
	if (in->job && !st->replicated && check_order(st, in))
		return MBP_EPROTO;
	unsigned rep = mbp_stage_replica();
	st->sink[rep] = burn(st->iters_mb + st->iters_row * in->rows, st->sink[rep]);
	if (st->fault == FAULT_LOSE && in->job && in->seq == 0)
		return 0; /* the rows of this micro-batch are never written */

	size_t words = in->row_bytes / 8;
	uint64_t k = K(st->index), inc = st->index + 1;
	for (uint32_t r = 0; r < in->rows; r++) {
		const uint64_t *src = (const uint64_t *)((const char *)in->data + (size_t)r * in->row_bytes);
		uint64_t *dst = (uint64_t *)((char *)out->data + (size_t)r * out->row_bytes);
		dst[0] = src[0];
		dst[1] = src[1] * 31 + inc;
		for (size_t i = 2; i < words; i++)
			dst[i] = src[i] + k;
	}
	if (st->fault != FAULT_NONE && in->job && in->seq == 0) {
		uint64_t *dst = out->data;
		if (st->fault == FAULT_REORDER)
			dst[0] = STAMP((dst[0] ^ STAMP(0)) ^ 1); /* claims to be its neighbour row */
		else
			dst[1]++;
	}
	return 0;
}

static void syn_fill(pb_workload *w, void *in, size_t rows)
{
	size_t words = w->in_row_bytes / 8;
	for (size_t r = 0; r < rows; r++) {
		uint64_t *row = (uint64_t *)((char *)in + r * w->in_row_bytes);
		row[0] = STAMP(r);
		row[1] = r;
		for (size_t i = 2; i < words; i++)
			row[i] = r * i;
	}
}

static int syn_check(pb_workload *w, const void *out, const void *ref, size_t rows, char *err, size_t errlen)
{
	(void)ref; /* the stamps are recomputed here, so the check is independent of the baseline too */
	size_t words = w->out_row_bytes / 8;
	uint64_t ksum = 0;
	for (unsigned i = 0; i < w->stages; i++)
		ksum += K(i);
	for (size_t r = 0; r < rows; r++) {
		const uint64_t *row = (const uint64_t *)((const char *)out + r * w->out_row_bytes);
		if (row[0] != STAMP(r)) {
			uint64_t other = row[0] ^ STAMP(0);
			if (other < rows)
				snprintf(err, errlen, "row %zu holds row %" PRIu64 " (out of order)", r,
					 other);
			else
				snprintf(err, errlen, "row %zu was never written (a micro-batch lost)", r);
			return -1;
		}
		uint64_t chain = r;
		for (unsigned i = 0; i < w->stages; i++)
			chain = chain * 31 + i + 1;
		if (row[1] != chain) {
			snprintf(err, errlen, "row %zu: the stages did not each run once, in order", r);
			return -1;
		}
		for (size_t i = 2; i < words; i++)
			if (row[i] != r * i + ksum) {
				snprintf(err, errlen, "row %zu word %zu: wrong value", r, i);
				return -1;
			}
	}
	return 0;
}

static const char *syn_error(pb_workload *w)
{
	struct syn *s = (struct syn *)w;
	return s->error[0] ? s->error : NULL;
}

static void syn_reset(pb_workload *w)
{
	struct syn *s = (struct syn *)w;
	for (unsigned i = 0; i < w->stages; i++)
		s->st[i].job = NULL;
	atomic_flag_clear(&s->failed);
	s->error[0] = 0;
}

static void syn_destroy(pb_workload *w)
{
	free(w);
}

int pb_synthetic_new(pb_workload **out, const pb_config *cfg, char *err, size_t errlen)
{
	struct syn *s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return PB_EXIT_FAIL;
	}
	atomic_flag_clear(&s->failed);
	pb_workload *w = &s->w;
	w->kind = "synthetic";
	w->stages = cfg->stages;
	w->in_row_bytes = w->out_row_bytes = cfg->row_bytes;
	w->fill = syn_fill;
	w->check = syn_check;
	w->stage_error = syn_error;
	w->reset = syn_reset;
	w->destroy = syn_destroy;
	s->iters_per_us = burn_calibrate();
	const char *fault = getenv("PIPEBENCH_FAULT");
	enum fault f = FAULT_NONE;
	if (fault && *fault) {
		if (!strcmp(fault, "lose"))
			f = FAULT_LOSE;
		else if (!strcmp(fault, "reorder"))
			f = FAULT_REORDER;
		else if (!strcmp(fault, "wrong"))
			f = FAULT_WRONG;
		else {
			snprintf(err, errlen, "PIPEBENCH_FAULT: '%s' is not lose, reorder or wrong", fault);
			free(s);
			return PB_EXIT_USAGE;
		}
	}

	int n = snprintf(w->desc, sizeof(w->desc), "synthetic, %u %s, busy work per row ", w->stages,
			 PLURAL(w->stages, "stage", "stages"));
	for (unsigned i = 0; i < w->stages; i++) {
		struct syn_stage *st = &s->st[i];
		double row_us = cfg->work_us[cfg->nwork > 1 ? i : 0];
		double mb_us = cfg->mb_us[cfg->nmb_us > 1 ? i : 0];
		st->owner = s;
		st->index = i;
		st->iters_row = (uint64_t)(row_us * s->iters_per_us + 0.5);
		st->iters_mb = (uint64_t)(mb_us * s->iters_per_us + 0.5);
		st->sink[0] = i + 1;
		st->replicated = cfg->nreplicas && cfg->replicas[cfg->nreplicas > 1 ? i : 0] > 1;
		st->fault = i + 1 == w->stages ? f : FAULT_NONE;
		if (n < (int)sizeof(w->desc) && (i == 0 || cfg->nwork > 1))
			n += snprintf(w->desc + n, sizeof(w->desc) - (size_t)n, "%s%g", i ? "," : "", row_us);
		mbp_stage_desc *d = &w->desc_of[i];
		memset(d, 0, sizeof(*d));
		d->fn = syn_stage_fn;
		d->ctx = st;
	}
	if (n < (int)sizeof(w->desc))
		n += snprintf(w->desc + n, sizeof(w->desc) - (size_t)n, " us");
	if (n < (int)sizeof(w->desc) && (cfg->nmb_us > 1 || cfg->mb_us[0] > 0)) {
		n += snprintf(w->desc + n, sizeof(w->desc) - (size_t)n, ", per micro-batch ");
		for (unsigned i = 0; i < (cfg->nmb_us > 1 ? w->stages : 1) && n < (int)sizeof(w->desc); i++)
			n += snprintf(w->desc + n, sizeof(w->desc) - (size_t)n, "%s%g", i ? "," : "",
				      cfg->mb_us[i]);
		if (n < (int)sizeof(w->desc))
			n += snprintf(w->desc + n, sizeof(w->desc) - (size_t)n, " us");
	}
	if (n < (int)sizeof(w->desc))
		snprintf(w->desc + n, sizeof(w->desc) - (size_t)n, ", rows of %u bytes", cfg->row_bytes);
	*out = w;
	return 0;
}

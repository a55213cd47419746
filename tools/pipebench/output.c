/*
 * pipebench output: the same report as a table (for people), CSV (one line per micro-batch size, for
 * spreadsheets) or one JSON document (for programs; its fields are listed in pipebench.1), for each of
 * the workloads in one process, the training workload and the run under mpirun; and the tool's lines on
 * standard error.
 *
 * The table ends with one grep-able summary line with fixed keys:
 *   pipebench: workload=W stages=S cpus=C batch=N best_mb=M rows_per_s=X speedup=Y bubble=B
 *   bubble_predicted=P p99_ms=L tied=M1,M2 noise=quiet|loud checks=ok|flagged status=ok|fail
 *
 * Every row carries its median, the 95% interval of that median and its number of repeats; a row whose
 * figures contradict each other (pb_check()) or that was measured on a loud machine says so in all three
 * formats.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pipebench.h"
#include "tools/shared/mlptrain.h" /* mt_json_print */
#include "util/blas.h"
#include "util/mpirank.h"
#include "util/plural.h"

int pb_output_check(const char *opt, const char *path, char *err, size_t errlen)
{
	char why[512];
	if (mbp_file_check(path, why, sizeof(why)) == 0)
		return 0;
	snprintf(err, errlen, "%s %s: %s", opt, path, why);
	return -1;
}

/* The failed checks as short names joined by '+', "" when none. */
static const char *check_names(unsigned flags)
{
	static char buf[48];
	buf[0] = 0;
	if (flags & PB_CHECK_SPEEDUP)
		strcat(buf, "speedup");
	if (flags & PB_CHECK_ACCOUNT)
		strcat(buf, buf[0] ? "+accounting" : "accounting");
	if (flags & PB_CHECK_BUBBLE)
		strcat(buf, buf[0] ? "+bubble" : "bubble");
	return buf;
}

static bool any_loud(const pb_report *rep)
{
	for (unsigned i = 0; i < rep->nres; i++)
		if (rep->res[i].loud)
			return true;
	return rep->b->base.loud;
}

static bool any_flagged(const pb_report *rep)
{
	for (unsigned i = 0; i < rep->nres; i++)
		if (rep->res[i].flags)
			return true;
	return false;
}

/* A stage's name at the chosen size (the mlp repartitions its layers for every size), else at any size. */
static const char *stage_name(const pb_report *rep, unsigned s)
{
	if (pb_best(rep) && pb_best(rep)->st[s].name[0])
		return pb_best(rep)->st[s].name;
	for (unsigned i = 0; i < rep->nres; i++)
		if (rep->res[i].st[s].name[0])
			return rep->res[i].st[s].name;
	return "";
}

/* Worker threads: one per stage unless stages outnumber CPUs and share threads (the placement says). */
static unsigned threads(const pb_report *rep)
{
	const pb_bench *b = rep->b;
	if (!b->have_placement || rep->w->stages == 0)
		return rep->w->stages;
	/* with replicas a thread each (numbered replica-major: every stage's replica 0, then every replica
	 * 1, ..., so the last stage's replica 0 is not the last thread); else the last stage's and those
	 * before it */
	unsigned t = 0;
	bool replicated = false;
	for (unsigned s = 0; s < rep->w->stages; s++) {
		t += b->replicas[s] ? b->replicas[s] : 1;
		replicated |= b->replicas[s] > 1;
	}
	return replicated ? t : b->placement[rep->w->stages - 1].thread + 1;
}

/* More threads than CPUs: they time-slice. */
static bool oversubscribed(const pb_report *rep)
{
	return threads(rep) > rep->b->ncpus;
}

/* When the repeats stop, the end of the header's second line. */
static void print_until(FILE *f, const pb_config *cfg)
{
	if (cfg->tolerance > 0)
		fprintf(f, "until every median's 95%% interval is within %g%% or %g s have passed\n",
			cfg->tolerance * 100, cfg->duration_s);
	else
		fprintf(f, "no more\n");
}

/* pb_print_noise's note for the tables' runs */
static const char rows_note[] =
    "rows marked 'loud' had more than a tenth of their repeats there, their figures are less certain";

void pb_print_noise(FILE *f, const pb_noise *nz, double load_start, const char *loud_note)
{
	if (!nz->available)
		fprintf(f, "machine: /proc/stat unreadable, load average %.2f: noise not measured\n",
			load_start);
	else {
		fprintf(f,
			"machine: before measuring, other processes used %.2f of %u %s (steal %.2f), load "
			"average %.2f: %s",
			nz->before.others, nz->ncpus, PLURAL(nz->ncpus, "CPU", "CPUs"), nz->before.steal,
			nz->before.load1, nz->quiet_before ? "quiet" : "LOUD");
		if (!nz->quiet_before)
			fprintf(f, " after waiting %.1f s (--wait-quiet): measuring anyway\n", nz->waited_s);
		else if (nz->waited_s > 0)
			fprintf(f, " after waiting %.1f s for it to settle\n", nz->waited_s);
		else
			fputc('\n', f);
		if (nz->seconds > 0)
			fprintf(f,
				"machine: while measuring, other processes used %.2f CPUs on average (steal "
				"%.2f, "
				"at most %.2f in a window), %u of %u window%s loud (above %.2f CPUs)%s%s\n",
				nz->others_s / nz->seconds, nz->steal_s / nz->seconds, nz->others_max,
				nz->loud_rounds, nz->rounds, nz->rounds == 1 ? "" : "s", nz->threshold,
				loud_note ? ": " : "", loud_note ? loud_note : "");
		if (nz->pauses)
			fprintf(
			    f,
			    "machine: paused %.1f s in all after %u loud windows, waiting for a quiet one\n",
			    nz->paused_s, nz->pauses);
	}
}

void pb_print_header(FILE *f, const pb_report *rep)
{
	const pb_config *cfg = rep->cfg;
	const pb_bench *b = rep->b;
	const pb_workload *w = rep->w;

	fprintf(f, "pipebench %s: %s\n", mbp_version(), w->desc);
	fprintf(f,
		"batch %u %s, one at a time; the sizes and the baseline measured in turn, %u warm-up + "
		"measured batches per visit, at least %u repeats each, ",
		cfg->batch, PLURAL(cfg->batch, "row", "rows"), cfg->warmup, cfg->batches);
	print_until(f, cfg);
	fprintf(f, "CPUs: %u allowed, using", b->allowed);
	for (unsigned i = 0; i < b->ncpus; i++)
		fprintf(f, "%s%d", i ? "," : " ", cfg->cpus[i]);
	if (pb_best(rep) && rep->w->prepare) /* the stages' layers depend on the size */
		fprintf(f, "\nplacement at m=%u:", pb_best(rep)->mb_rows);
	else
		fprintf(f, "\nplacement:");
	if (b->have_placement)
		for (unsigned s = 0; s < w->stages; s++) {
			const char *name = stage_name(rep, s);
			fprintf(f, "%s stage %u%s%s%s", s ? "," : "", s, *name ? " (" : "", name,
				*name ? ")" : "");
			if (b->replicas[s] > 1) { /* stage 1 (layer 3) x2 -> CPUs 1,2 */
				fprintf(f, " x%u -> CPUs ", b->replicas[s]);
				for (unsigned j = 0; j < b->replicas[s]; j++)
					if (b->replica_cpu[s][j] >= 0)
						fprintf(f, "%s%d", j ? "," : "", b->replica_cpu[s][j]);
					else
						fprintf(f, "%sunpinned", j ? "," : "");
				continue;
			}
			fprintf(f, " -> ");
			if (threads(rep) < w->stages)
				fprintf(f, "thread %u on ", b->placement[s].thread);
			if (b->placement[s].cpu >= 0)
				fprintf(f, "CPU %d", b->placement[s].cpu);
			else
				fprintf(f, "unpinned");
			if (b->placement[s].pin_error)
				fprintf(f, " (pin failed: %s)", mbp_strerror(b->placement[s].pin_error));
			if (b->placement[s].sharing)
				fprintf(f, " (shared with %u other %s)", b->placement[s].sharing,
					PLURAL(b->placement[s].sharing, "thread", "threads"));
		}
	else
		fprintf(f, " unknown (no pipeline started)");
	fputc('\n', f);
	if (w->blas[0])
		fprintf(f, "BLAS: %s\n", w->blas);
	char warn[512];
	if (w->kernel[0]) { /* a workload with dense layers */
		dense_kernel_line(w->kernel, warn, sizeof warn);
		fprintf(f, "%s\n", warn);
		if (kernel_warning_line(warn, sizeof warn))
			fprintf(f, "%s\n", warn);
	}
	if (w->blas_warning[0] && blas_warning_line(warn, sizeof warn)) /* a workload that uses BLAS */
		fprintf(f, "%s\n", warn);
	pb_print_noise(f, &b->noise, b->load_start, any_loud(rep) ? rows_note : NULL);
	if (oversubscribed(rep))
		fprintf(f,
			"note: %u threads on %u %s: threads share CPUs and time-slice, waits skip their "
			"spin, and the bubble model (one CPU per thread) does not hold\n",
			threads(rep), b->ncpus, PLURAL(b->ncpus, "CPU", "CPUs"));
	else if (threads(rep) < w->stages)
		fprintf(
		    f,
		    "note: %u stages on %u %s: consecutive stages share a thread (%u %s), so the "
		    "bubble and its prediction count threads; --opts threads=%u gives each stage its own\n",
		    w->stages, b->ncpus, PLURAL(b->ncpus, "CPU", "CPUs"), threads(rep),
		    PLURAL(threads(rep), "thread", "threads"), w->stages);
	if (b->base.runs)
		fprintf(f,
			"sequential baseline (the same stages in order on one thread, whole batch at once): "
			"%.0f rows/s (95%% interval %.0f-%.0f), %.3g ms per batch (%.3g-%.3g), %u repeats of "
			"%u batches%s\n",
			b->base.throughput, b->base.thr.lo, b->base.thr.hi, b->base.median_ms, b->base.min_ms,
			b->base.max_ms, b->base.thr.n, b->base.runs, b->base.loud ? "; loud" : "");
}

/* Milliseconds with three significant digits and no exponent. */
static void fmt_ms(char *buf, size_t n, double ms)
{
	snprintf(buf, n, ms >= 100 ? "%.0f" : ms >= 10 ? "%.1f" : ms >= 1 ? "%.2f" : "%.3f", ms);
}

/* The interval's half-width in percent of the median, or "-" without one. */
static void fmt_pm(char *buf, size_t n, const pb_interval *iv)
{
	double rel = pb_interval_rel(iv);
	if (rel == INFINITY)
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "%.1f", rel * 100);
}

/* The sizes tied with the best (unsettled: the unsettled ones), "32,64", or "-" when none. */
static void size_list(const pb_report *rep, bool unsettled, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = 0;
	for (unsigned i = 0; i < rep->nres && len + 12 < n; i++)
		if (unsettled ? rep->res[i].unsettled : rep->res[i].tied)
			len +=
			    (size_t)snprintf(buf + len, n - len, "%s%u", len ? "," : "", rep->res[i].mb_rows);
	if (!len)
		snprintf(buf, n, "-");
}

/* --rebalance: a size's moves and the plan in use at its end, as pipeserve's /metrics gives them: "m=4:
 * 1 move (1 of them of the active replicas), plan 2: stage 0 layers 0-4 x1 of 2 threads, stage 1 layer 5
 * x2 of 2 threads; last: <reason>". */
static void print_rebalance(FILE *f, const pb_result *r)
{
	const mbp_model_rebalance_stats *rb = &r->rb;
	const mbp_model_plan *cur = &rb->current;
	fprintf(f, "rebalance m=%u: %llu %s (%llu of them of the active replicas), plan %llu:", r->mb_rows,
		(unsigned long long)rb->moves, PLURAL(rb->moves, "move", "moves"),
		(unsigned long long)rb->replica_moves, (unsigned long long)rb->plan);
	for (unsigned s = 0; s < cur->stages; s++) {
		unsigned a = cur->first[s], z = cur->first[s + 1] - 1;
		fprintf(f, "%s stage %u %s %u", s ? "," : "", s, a == z ? "layer" : "layers", a);
		if (z != a)
			fprintf(f, "-%u", z);
		fprintf(f, " x%u of %u %s", cur->replicas[s] ? cur->replicas[s] : 1, rb->threads[s],
			PLURAL(rb->threads[s], "thread", "threads"));
	}
	if (rb->last_reason[0])
		fprintf(f, "; last: %s", rb->last_reason);
	fputc('\n', f);
}

void pb_print_table(FILE *f, const pb_report *rep)
{
	const unsigned S = rep->w->stages;
	pb_print_header(f, rep);
	/* --rebalance-replicas: a stage's threads may park, and the engine counts that time too */
	const bool parks = rep->cfg->rebalance_replicas != 0;
	fprintf(f, "\n%7s %6s %10s %5s %4s %7s %8s %8s %6s %9s %6s  %s\n", "m", "M", "rows/s", "+-%", "n",
		"speedup", "p50 ms", "p99 ms", "bubble", "predicted", "gpipe",
		parks ? "busy/starved/blocked/parked % per stage" : "busy/starved/blocked % per stage");
	for (unsigned i = 0; i < rep->nres; i++) {
		const pb_result *r = &rep->res[i];
		if (r->status && r->batches == 0) {
			fprintf(f, "%7u %6u  FAILED: %s\n", r->mb_rows, r->mbs, r->error);
			continue;
		}
		char p50[16], p99[16], pm[16];
		fmt_ms(p50, sizeof(p50), r->p50_ms);
		fmt_ms(p99, sizeof(p99), r->p99_ms);
		fmt_pm(pm, sizeof(pm), &r->thr);
		fprintf(f, "%7u %6u %10.0f %5s %4u %7.2f %8s %8s %6.3f %9.3f %6.3f ", r->mb_rows, r->mbs,
			r->throughput, pm, r->repeats, r->speedup, p50, p99, r->bubble, r->bubble_predicted,
			r->bubble_gpipe);
		for (unsigned s = 0; s < S; s++) {
			fprintf(f, " s%u %.0f/%.0f/%.0f", s, r->st[s].busy * 100, r->st[s].starved * 100,
				r->st[s].blocked * 100);
			if (parks)
				fprintf(f, "/%.0f", r->st[s].parked * 100);
		}
		fprintf(f, "%s%s%s%s%s%s\n",
			r == pb_best(rep) ? "  <- chosen"
			: r->tied	  ? "  tied"
			: r->unsettled	  ? "  unsettled"
					  : "",
			r->loud ? "  loud" : "", r->flags ? "  CHECK: " : "", check_names(r->flags),
			r->status ? "  FAILED: " : "", r->status ? r->error : "");
	}
	for (unsigned i = 0; i < rep->nres; i++)
		if (rep->res[i].flags)
			fprintf(f, "check m=%u: %s\n", rep->res[i].mb_rows, rep->res[i].check);
	for (unsigned i = 0; i < rep->nres; i++)
		if (rep->res[i].rb.on)
			print_rebalance(f, &rep->res[i]);
	fprintf(f, "(rows/s: median over the repeats, +-%%: half-width of its 95%% interval, n: repeats; "
		   "speedup against the baseline's median)\n");
	const pb_result *r = pb_best(rep);
	static const pb_result none; /* the summary line is printed even when no size completed */
	if (r)
		fprintf(f, "\nchosen micro-batch size: %u %s%s. %s.\n", r->mb_rows,
			PLURAL(r->mb_rows, "row", "rows"),
			rep->choice.unsettled ? " for now: the choice is UNSETTLED" : "", rep->choice.why);
	else
		r = &none;
	char tied[PB_MAX_SIZES * 9], open[PB_MAX_SIZES * 9];
	size_list(rep, false, tied, sizeof tied);
	size_list(rep, true, open, sizeof open);
	fprintf(f,
		"pipebench: workload=%s stages=%u cpus=%u batch=%u best_mb=%u rows_per_s=%.0f speedup=%.2f "
		"bubble=%.3f bubble_predicted=%.3f p99_ms=%.3f tied=%s unsettled=%s verdict=%s noise=%s "
		"checks=%s status=%s\n",
		rep->w->kind, S, rep->b->ncpus, rep->cfg->batch, r->mb_rows, r->throughput, r->speedup,
		r->bubble, r->bubble_predicted, r->p99_ms, tied, open,
		!pb_best(rep)		? "-"
		: rep->choice.unsettled ? "unsettled"
					: "settled",
		any_loud(rep) || !rep->b->noise.quiet_before ? "loud" : "quiet",
		any_flagged(rep) ? "flagged" : "ok", rep->status ? "fail" : "ok");
	if (rep->status && rep->error[0])
		fprintf(f, "FAILED: %s\n", rep->error);
}

/* A CSV field in quotes, its quotes doubled (RFC 4180): a reason holds commas ("with replicas 1,2"). */
static void csv_quoted(FILE *f, const char *v)
{
	fputc('"', f);
	for (; *v; v++) {
		if (*v == '"')
			fputc('"', f);
		fputc(*v, f);
	}
	fputc('"', f);
}

/* --rebalance's columns, those of the JSON result's rebalance object (the table's "rebalance m=" line):
 * empty without it, as the object is null. */
static void csv_rebalance(FILE *f, const mbp_model_rebalance_stats *rb, unsigned S)
{
	if (!rb->on) {
		for (unsigned k = 0; k < 5 + 2 * S; k++)
			fputc(',', f);
		return;
	}
	fprintf(f, ",%llu,%llu,%llu,%llu,", (unsigned long long)rb->moves,
		(unsigned long long)rb->replica_moves, (unsigned long long)rb->plan,
		(unsigned long long)rb->windows);
	if (rb->last_reason[0])
		csv_quoted(f, rb->last_reason);
	for (unsigned s = 0; s < S; s++) {
		if (s < rb->current.stages)
			fprintf(f, ",%u,%u", rb->current.first[s],
				rb->current.replicas[s] ? rb->current.replicas[s] : 1);
		else
			fprintf(f, ",,");
	}
}

void pb_print_csv(FILE *f, const pb_report *rep)
{
	const unsigned S = rep->w->stages;
	fprintf(
	    f,
	    "workload,stages,cpus,batch,mb_rows,mbs,batches,rows_per_s,speedup,p50_ms,p99_ms,mean_ms,bubble,"
	    "bubble_predicted,bubble_gpipe,bubble_window,predicted_ms,baseline_ms,best,status,repeats,"
	    "rows_per_s_lo,rows_per_s_hi,speedup_lo,speedup_hi,bubble_lo,bubble_hi,tied,unsettled,loud,loud_"
	    "share,"
	    "checks");
	for (unsigned s = 0; s < S; s++)
		fprintf(f, ",s%u_cpu,s%u_busy,s%u_starved,s%u_blocked,s%u_service_us", s, s, s, s, s);
	for (unsigned s = 0; s < S; s++)
		fprintf(f, ",s%u_parked,s%u_replicas,s%u_threads", s, s, s);
	fprintf(f, ",rebalance_moves,rebalance_replica_moves,rebalance_plan,rebalance_windows,"
		   "rebalance_last_reason");
	for (unsigned s = 0; s < S; s++)
		fprintf(f, ",rebalance_s%u_first_layer,rebalance_s%u_active_replicas", s, s);
	fputc('\n', f);
	for (unsigned i = 0; i < rep->nres; i++) {
		const pb_result *r = &rep->res[i];
		fprintf(f,
			"%s,%u,%u,%u,%u,%u,%u,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%d,%s",
			rep->w->kind, S, rep->b->ncpus, rep->cfg->batch, r->mb_rows, r->mbs, r->batches,
			r->throughput, r->speedup, r->p50_ms, r->p99_ms, r->mean_ms, r->bubble,
			r->bubble_predicted, r->bubble_gpipe, r->bubble_window, r->predicted_ms,
			rep->b->base.median_ms, r == pb_best(rep), r->status ? "fail" : "ok");
		fprintf(f, ",%u,%.1f,%.1f,%.4f,%.4f,%.4f,%.4f,%d,%d,%d,%.3f,%s", r->repeats, r->thr.lo,
			r->thr.hi, r->speedup_lo, r->speedup_hi, r->bubble_iv.lo, r->bubble_iv.hi, r->tied,
			r->unsettled, r->loud, r->loud_share, check_names(r->flags));
		for (unsigned s = 0; s < S; s++)
			fprintf(f, ",%d,%.4f,%.4f,%.4f,%.2f", r->st[s].cpu, r->st[s].busy, r->st[s].starved,
				r->st[s].blocked, r->st[s].service_us);
		for (unsigned s = 0; s < S; s++)
			fprintf(f, ",%.4f,%u,%u", r->st[s].parked, r->st[s].replicas ? r->st[s].replicas : 1,
				r->st[s].replicas_made ? r->st[s].replicas_made : 1);
		csv_rebalance(f, &r->rb, S);
		fputc('\n', f);
	}
}

/* ---- JSON ---- */

static cJSON *json_str_or_null(const char *s)
{
	return s && *s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

static cJSON *json_timeline(const pb_timeline *tl, bool whole)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "mb_rows", tl->mb_rows);
	cJSON_AddNumberToObject(o, "mbs", tl->mbs);
	cJSON_AddBoolToObject(o, "whole_batch", whole);
	cJSON_AddNumberToObject(o, "span_us", (double)tl->span_ns / 1e3);
	cJSON *stages = cJSON_AddArrayToObject(o, "stages");
	for (unsigned s = 0; s < tl->stages; s++) {
		cJSON *mbs = cJSON_CreateArray();
		for (uint32_t j = 0; j < tl->mbs; j++) {
			const uint64_t *t = tl->t + ((size_t)s * tl->mbs + j) * 2;
			double v[2] = {(double)t[0] / 1e3, (double)t[1] / 1e3};
			cJSON_AddItemToArray(mbs, t[0] == UINT64_MAX ? cJSON_CreateNull()
								     : cJSON_CreateDoubleArray(v, 2));
		}
		cJSON_AddItemToArray(stages, mbs);
	}
	return o;
}

/* --rebalance: the moves and the plan in use at the size's end (null without it). */
static cJSON *json_rebalance(const mbp_model_rebalance_stats *rb)
{
	if (!rb->on)
		return cJSON_CreateNull();
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "moves", (double)rb->moves);
	cJSON_AddNumberToObject(o, "replica_moves", (double)rb->replica_moves);
	cJSON_AddNumberToObject(o, "plan", (double)rb->plan);
	cJSON_AddNumberToObject(o, "windows", (double)rb->windows);
	cJSON_AddItemToObject(o, "last_reason", json_str_or_null(rb->last_reason));
	cJSON *st = cJSON_AddArrayToObject(o, "stages");
	for (unsigned s = 0; s < rb->current.stages; s++) {
		cJSON *e = cJSON_CreateObject();
		cJSON_AddNumberToObject(e, "stage", s);
		cJSON_AddNumberToObject(e, "first_layer", rb->current.first[s]);
		cJSON_AddNumberToObject(e, "active_replicas",
					rb->current.replicas[s] ? rb->current.replicas[s] : 1);
		cJSON_AddNumberToObject(e, "threads", rb->threads[s]);
		cJSON_AddItemToArray(st, e);
	}
	return o;
}

static cJSON *json_result(const pb_result *r)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "mb_rows", r->mb_rows);
	cJSON_AddNumberToObject(o, "mbs", r->mbs);
	cJSON_AddNumberToObject(o, "batches", r->batches);
	cJSON_AddNumberToObject(o, "repeats", r->repeats);
	cJSON_AddNumberToObject(o, "rows_per_s", r->throughput);
	double thr_iv[2] = {r->thr.lo, r->thr.hi}, thr_range[2] = {r->thr.min, r->thr.max};
	cJSON_AddItemToObject(o, "rows_per_s_interval", cJSON_CreateDoubleArray(thr_iv, 2));
	cJSON_AddItemToObject(o, "rows_per_s_range", cJSON_CreateDoubleArray(thr_range, 2));
	cJSON_AddNumberToObject(o, "rows_per_s_window", r->throughput_window);
	cJSON_AddNumberToObject(o, "speedup", r->speedup);
	double sp_iv[2] = {r->speedup_lo, r->speedup_hi};
	cJSON_AddItemToObject(o, "speedup_interval", cJSON_CreateDoubleArray(sp_iv, 2));
	cJSON *lat = cJSON_AddObjectToObject(o, "latency_ms");
	cJSON_AddNumberToObject(lat, "p50", r->p50_ms);
	cJSON_AddNumberToObject(lat, "p99", r->p99_ms);
	cJSON_AddNumberToObject(lat, "mean", r->mean_ms);
	cJSON *bub = cJSON_AddObjectToObject(o, "bubble");
	cJSON_AddNumberToObject(bub, "measured", r->bubble);
	cJSON_AddNumberToObject(bub, "predicted", r->bubble_predicted);
	cJSON_AddNumberToObject(bub, "gpipe", r->bubble_gpipe);
	cJSON_AddNumberToObject(bub, "window", r->bubble_window);
	double b_iv[2] = {r->bubble_iv.lo, r->bubble_iv.hi};
	cJSON_AddItemToObject(bub, "interval", cJSON_CreateDoubleArray(b_iv, 2));
	cJSON_AddNumberToObject(o, "predicted_batch_ms", r->predicted_ms);
	cJSON_AddNumberToObject(o, "predicted_rows_per_s", r->predicted_rows_per_s);
	cJSON_AddNumberToObject(o, "predicted_period_us", r->predicted_period_us);
	cJSON_AddBoolToObject(o, "balanced", r->balanced);
	cJSON *st = cJSON_AddArrayToObject(o, "stages");
	for (unsigned s = 0; s < r->stages; s++) {
		const pb_stage_result *x = &r->st[s];
		cJSON *e = cJSON_CreateObject();
		cJSON_AddNumberToObject(e, "stage", s);
		cJSON_AddStringToObject(e, "name", x->name);
		cJSON_AddNumberToObject(e, "cpu", x->cpu);
		cJSON_AddNumberToObject(e, "mbs", (double)x->mbs);
		cJSON_AddNumberToObject(e, "busy", x->busy);
		cJSON_AddNumberToObject(e, "starved", x->starved);
		cJSON_AddNumberToObject(e, "blocked", x->blocked);
		cJSON_AddNumberToObject(e, "parked", x->parked);
		cJSON_AddNumberToObject(e, "service_us", x->service_us);
		cJSON_AddNumberToObject(e, "replicas", x->replicas ? x->replicas : 1);
		cJSON_AddNumberToObject(e, "threads", x->replicas_made ? x->replicas_made : 1);
		cJSON_AddItemToArray(st, e);
	}
	cJSON_AddItemToObject(o, "rebalance", json_rebalance(&r->rb));
	cJSON_AddBoolToObject(o, "tied", r->tied);
	cJSON_AddBoolToObject(o, "unsettled", r->unsettled);
	cJSON_AddBoolToObject(o, "loud", r->loud);
	cJSON_AddNumberToObject(o, "loud_share", r->loud_share);
	cJSON *chk = cJSON_AddObjectToObject(o, "checks");
	cJSON_AddBoolToObject(chk, "ok", r->flags == 0);
	cJSON_AddItemToObject(chk, "failed", json_str_or_null(check_names(r->flags)));
	cJSON_AddItemToObject(chk, "message", json_str_or_null(r->flags ? r->check : NULL));
	cJSON_AddBoolToObject(o, "ok", r->status == 0);
	cJSON_AddItemToObject(o, "error", json_str_or_null(r->status ? r->error : NULL));
	return o;
}

/* The document's end: "ok" and "error" from the exit status, then print it and free it. 0, or -1 (out of
 * memory). */
static int json_finish(FILE *f, cJSON *root, int status, const char *error)
{
	cJSON_AddBoolToObject(root, "ok", status == 0);
	cJSON_AddItemToObject(root, "error", json_str_or_null(status ? error : NULL));
	return mt_json_print(f, root);
}

void *pb_json_noise(const pb_noise *nz, bool loud_rows)
{
	cJSON *nj = cJSON_CreateObject();
	cJSON_AddBoolToObject(nj, "measured", nz->available);
	cJSON_AddNumberToObject(nj, "threshold_cpus", nz->threshold);
	cJSON *bef = cJSON_AddObjectToObject(nj, "before");
	cJSON_AddNumberToObject(bef, "others_cpus", nz->before.others);
	cJSON_AddNumberToObject(bef, "steal_cpus", nz->before.steal);
	cJSON_AddNumberToObject(bef, "loadavg", nz->before.load1);
	cJSON_AddBoolToObject(bef, "quiet", nz->quiet_before);
	cJSON_AddNumberToObject(bef, "waited_s", nz->waited_s);
	cJSON *dur = cJSON_AddObjectToObject(nj, "during");
	cJSON_AddNumberToObject(dur, "others_cpus", nz->seconds > 0 ? nz->others_s / nz->seconds : 0);
	cJSON_AddNumberToObject(dur, "steal_cpus", nz->seconds > 0 ? nz->steal_s / nz->seconds : 0);
	cJSON_AddNumberToObject(dur, "max_cpus", nz->others_max);
	cJSON_AddNumberToObject(dur, "windows", nz->rounds);
	cJSON_AddNumberToObject(dur, "loud_windows", nz->loud_rounds);
	cJSON_AddNumberToObject(dur, "paused_s", nz->paused_s);
	cJSON_AddBoolToObject(nj, "loud", loud_rows || !nz->quiet_before);
	return nj;
}

int pb_print_json(FILE *f, const pb_report *rep)
{
	const pb_config *cfg = rep->cfg;
	const pb_bench *b = rep->b;
	const pb_workload *w = rep->w;
	cJSON *root = cJSON_CreateObject();

	cJSON_AddStringToObject(root, "tool", "pipebench");
	cJSON_AddStringToObject(root, "version", mbp_version());
	cJSON *wl = cJSON_AddObjectToObject(root, "workload");
	cJSON_AddStringToObject(wl, "kind", w->kind);
	cJSON_AddStringToObject(wl, "description", w->desc);
	cJSON_AddItemToObject(wl, "blas", json_str_or_null(w->blas));
	cJSON_AddItemToObject(wl, "blas_warning", json_str_or_null(w->blas_warning));
	cJSON_AddItemToObject(wl, "dense_kernel", json_str_or_null(w->kernel));

	cJSON *c = cJSON_AddObjectToObject(root, "config");
	cJSON_AddNumberToObject(c, "stages", w->stages);
	cJSON_AddNumberToObject(c, "batch", cfg->batch);
	cJSON_AddNumberToObject(c, "batches", cfg->batches);
	cJSON_AddNumberToObject(c, "duration_s", cfg->duration_s);
	cJSON_AddNumberToObject(c, "warmup", cfg->warmup);
	cJSON_AddNumberToObject(c, "tolerance_pct", cfg->tolerance * 100);
	cJSON_AddNumberToObject(c, "wait_quiet_s", cfg->wait_quiet_s);
	cJSON_AddStringToObject(c, "mb", cfg->mb_spec);
	int sizes[PB_MAX_SIZES];
	for (unsigned i = 0; i < cfg->nsizes; i++)
		sizes[i] = (int)cfg->sizes[i];
	cJSON_AddItemToObject(c, "sizes", cJSON_CreateIntArray(sizes, (int)cfg->nsizes));
	if (cfg->latency_target_ms > 0)
		cJSON_AddNumberToObject(c, "latency_target_ms", cfg->latency_target_ms);
	else
		cJSON_AddNullToObject(c, "latency_target_ms");
	if (cfg->spin_us >= 0)
		cJSON_AddNumberToObject(c, "spin_us", (double)cfg->spin_us);
	else
		cJSON_AddNullToObject(c, "spin_us");

	cJSON *cp = cJSON_AddObjectToObject(root, "cpus");
	cJSON_AddNumberToObject(cp, "allowed", b->allowed);
	cJSON_AddItemToObject(cp, "used", cJSON_CreateIntArray(cfg->cpus, (int)b->ncpus));
	cJSON_AddBoolToObject(cp, "oversubscribed", oversubscribed(rep));
	cJSON_AddNumberToObject(cp, "threads", threads(rep));
	double loads[2] = {b->load_start, b->load_end};
	cJSON_AddItemToObject(cp, "loadavg", cJSON_CreateDoubleArray(loads, 2));

	cJSON_AddItemToObject(root, "noise", pb_json_noise(&b->noise, any_loud(rep)));

	cJSON *pl = cJSON_AddArrayToObject(root, "placement");
	for (unsigned s = 0; b->have_placement && s < w->stages; s++) {
		cJSON *e = cJSON_CreateObject();
		cJSON_AddNumberToObject(e, "stage", s);
		cJSON_AddStringToObject(e, "name", stage_name(rep, s));
		cJSON_AddNumberToObject(e, "cpu", b->placement[s].cpu);
		cJSON_AddNumberToObject(e, "thread", b->placement[s].thread);
		cJSON_AddNumberToObject(e, "sharing", b->placement[s].sharing);
		cJSON_AddNumberToObject(e, "replicas", b->replicas[s]);
		cJSON *rc = cJSON_AddArrayToObject(e, "replica_cpus");
		for (unsigned j = 0; j < b->replicas[s]; j++)
			cJSON_AddItemToArray(rc, cJSON_CreateNumber(b->replica_cpu[s][j]));
		cJSON_AddItemToObject(e, "pin_error",
				      b->placement[s].pin_error
					  ? cJSON_CreateString(mbp_strerror(b->placement[s].pin_error))
					  : cJSON_CreateNull());
		cJSON_AddItemToArray(pl, e);
	}

	cJSON *base = cJSON_AddObjectToObject(root, "baseline");
	cJSON_AddNumberToObject(base, "runs", b->base.runs);
	cJSON_AddNumberToObject(base, "repeats", b->base.thr.n);
	double base_iv[2] = {b->base.thr.lo, b->base.thr.hi};
	cJSON_AddItemToObject(base, "rows_per_s_interval", cJSON_CreateDoubleArray(base_iv, 2));
	cJSON_AddBoolToObject(base, "loud", b->base.loud);
	cJSON_AddNumberToObject(base, "median_ms", b->base.median_ms);
	cJSON_AddNumberToObject(base, "min_ms", b->base.min_ms);
	cJSON_AddNumberToObject(base, "max_ms", b->base.max_ms);
	cJSON_AddNumberToObject(base, "rows_per_s", b->base.throughput);

	cJSON *res = cJSON_AddArrayToObject(root, "results");
	for (unsigned i = 0; i < rep->nres; i++)
		cJSON_AddItemToArray(res, json_result(&rep->res[i]));

	if (pb_best(rep)) {
		cJSON *best = cJSON_AddObjectToObject(root, "best");
		const pb_choice *ch = &rep->choice;
		cJSON_AddNumberToObject(best, "mb_rows", pb_best(rep)->mb_rows);
		cJSON_AddStringToObject(best, "reason", ch->why);
		cJSON_AddNumberToObject(best, "fastest_mb_rows", rep->res[ch->best].mb_rows);
		int tied[PB_MAX_SIZES], nt = 0;
		for (unsigned i = 0; i < rep->nres; i++)
			if (rep->res[i].tied)
				tied[nt++] = (int)rep->res[i].mb_rows;
		cJSON_AddItemToObject(best, "tied", cJSON_CreateIntArray(tied, nt));
		/* the sizes below the chosen one that the measurement cannot place, and what would */
		int open[PB_MAX_SIZES], no = 0;
		for (unsigned i = 0; i < ch->chosen; i++)
			if (rep->res[i].unsettled)
				open[no++] = (int)rep->res[i].mb_rows;
		cJSON_AddBoolToObject(best, "settled", ch->unsettled == 0);
		cJSON_AddItemToObject(best, "unsettled", cJSON_CreateIntArray(open, no));
		if (ch->unsettled) {
			cJSON *st = cJSON_AddObjectToObject(best, "to_settle");
			cJSON_AddNumberToObject(st, "repeats_factor", ch->settle_factor);
			cJSON_AddNumberToObject(st, "repeats", ch->settle_repeats);
		} else {
			cJSON_AddNullToObject(best, "to_settle");
		}
		if (ch->vs_best.n) {
			cJSON *vb = cJSON_AddObjectToObject(best, "vs_fastest");
			cJSON_AddNumberToObject(vb, "ratio", ch->vs_best.median);
			double iv[2] = {ch->vs_best.lo, ch->vs_best.hi};
			cJSON_AddItemToObject(vb, "interval", cJSON_CreateDoubleArray(iv, 2));
		} else {
			cJSON_AddNullToObject(best, "vs_fastest");
		}
		if (ch->next < rep->nres && ch->vs_next.n) {
			cJSON *vn = cJSON_AddObjectToObject(best, "vs_next_smaller");
			cJSON_AddNumberToObject(vn, "mb_rows", rep->res[ch->next].mb_rows);
			cJSON_AddNumberToObject(vn, "ratio", ch->vs_next.median);
			double iv[2] = {ch->vs_next.lo, ch->vs_next.hi};
			cJSON_AddItemToObject(vn, "interval", cJSON_CreateDoubleArray(iv, 2));
		} else {
			cJSON_AddNullToObject(best, "vs_next_smaller");
		}
	} else {
		cJSON_AddNullToObject(root, "best");
	}
	if (cfg->gantt) {
		cJSON *g = cJSON_AddArrayToObject(root, "gantt");
		if (pb_best(rep) && pb_best(rep)->tl.t)
			cJSON_AddItemToArray(g, json_timeline(&pb_best(rep)->tl, false));
		if (rep->single && rep->single->tl.t)
			cJSON_AddItemToArray(g, json_timeline(&rep->single->tl, true));
	}
	return json_finish(f, root, rep->status, rep->error);
}

/* ---- the training workload ---- */

static bool train_loud(const pb_train_report *rep)
{
	for (unsigned i = 0; i < rep->n; i++)
		if (rep->r[i].loud)
			return true;
	return !rep->noise.quiet_before;
}

/* A stage list of figures, "8,8,4". */
static const char *stage_list(const uint32_t *v, unsigned n)
{
	static char buf[2][MBP_MAX_STAGES * 11]; /* two in one line */
	static unsigned which;
	char *b = buf[which++ % 2];
	size_t len = 0;
	b[0] = 0;
	for (unsigned s = 0; s < n; s++)
		len += (size_t)snprintf(b + len, sizeof(buf[0]) - len, "%s%u", s ? "," : "", v[s]);
	return b;
}

void pb_train_print_table(FILE *f, const pb_train_report *rep, unsigned width)
{
	const pb_config *cfg = rep->cfg;
	const unsigned S = cfg->stages;
	fprintf(f, "pipebench %s: %s\n", mbp_version(), rep->desc);
	fprintf(f,
		"the %u schedules measured in turn, %u warm-up + measured steps per visit, at least %u %s "
		"each, ",
		rep->n, cfg->warmup, cfg->batches, PLURAL(cfg->batches, "repeat", "repeats"));
	print_until(f, cfg);
	fprintf(f, "CPUs: %u allowed, using", rep->allowed);
	for (unsigned i = 0; i < rep->ncpus; i++)
		fprintf(f, "%s%d", i ? "," : " ", cfg->cpus[i]);
	unsigned T = rep->r[0].threads;
	if (T)
		fprintf(
		    f,
		    "; %u %s, pinned, stage s on thread s x %u / %u (a chunked schedule: each stage as %s)\n",
		    T, PLURAL(T, "thread", "threads"), T, S, "chunks placed by its rule");
	else
		fputc('\n', f);
	pb_print_noise(f, &rep->noise, rep->load_start, train_loud(rep) ? rows_note : NULL);
	fprintf(f, "\n%-11s %8s %5s %4s %8s %9s %6s %9s %8s %8s %5s %7s  %s\n", "schedule", "steps/s", "+-%",
		"n", "step ms", "mb/s", "bubble", "predicted", "work ms", "ideal ms", "eff", "eff/id",
		"stash peak / held peak per stage or chunk (t: held per thread, a chunk 1/v; h: per thread, "
		"hops to another thread + passes between its own chunks)");
	for (unsigned i = 0; i < rep->n; i++) {
		const pb_train_result *r = &rep->r[i];
		const char *name = mbp_sched_name(r->kind);
		if (r->steps == 0) {
			if (r->status)
				fprintf(f, "%-11s  FAILED: %s\n", name, r->error);
			else
				fprintf(f, "%-11s  not measured: the run stopped\n", name);
			continue;
		}
		char pm[16], step[16], work[16], ideal[16], thr[MBP_MAX_STAGES * 36];
		fmt_pm(pm, sizeof(pm), &r->rate);
		fmt_ms(step, sizeof(step), r->step_ms.median);
		fmt_ms(work, sizeof(work), r->work_ms);
		fmt_ms(ideal, sizeof(ideal), r->ideal_ms);
		mt_thread_figs_str(&r->thr, thr, sizeof thr);
		fprintf(f,
			"%-11s %8.1f %5s %4u %8s %9.0f %6.3f %9.3f %8s %8s %5.3f %7.3f  %s / %s (%s)%s%s%s\n",
			name, r->rate.median, pm, r->repeats, step, r->mbs_per_s, r->bubble.median,
			r->bubble_predicted, work, ideal, r->efficiency, r->eff_of_predicted,
			stage_list(r->stash_peak, r->stages), stage_list(r->held_peak, r->stages), thr,
			r->loud ? "  loud" : "", r->status ? "  FAILED: " : "", r->status ? r->error : "");
	}
	fprintf(f,
		"(steps/s: median over the repeats, +-%%: half-width of its 95%% interval, n: repeats; "
		"step ms, bubble, predicted: medians over the measured steps; bubble = 1 - work / (threads "
		"x step);\n predicted: the schedule played with the step's measured costs; ideal: the work "
		"over min(threads, CPUs); eff = ideal / step, eff/id = eff / (1 - predicted))\n");
	const pb_interval *zb = &rep->zb_vs_1f1b;
	if (zb->n)
		fprintf(f, "zbh1 / 1f1b steps per second, paired by round: %.3f (95%% interval %.3f-%.3f)\n",
			zb->median, zb->lo, zb->hi);
	if (cfg->gantt)
		pb_train_gantt_print(f, rep, width);
	fprintf(f, "\npipebench: workload=train stages=%u mbs=%u costs=%g:%g:%g unit_us=%g cpus=%u", S,
		cfg->mbs, cfg->costs[0], cfg->costs[1], cfg->costs[2], cfg->unit_us, rep->ncpus);
	for (unsigned i = 0; i < rep->n; i++)
		fprintf(f, " %s_step_ms=%.3f", mbp_sched_name(rep->r[i].kind), rep->r[i].step_ms.median);
	for (unsigned i = 0; i < rep->n; i++)
		fprintf(f, " %s_bubble=%.3f", mbp_sched_name(rep->r[i].kind), rep->r[i].bubble.median);
	fprintf(f, " noise=%s status=%s\n", train_loud(rep) ? "loud" : "quiet", rep->status ? "fail" : "ok");
	if (rep->status && rep->error[0])
		fprintf(f, "FAILED: %s\n", rep->error);
}

void pb_train_print_csv(FILE *f, const pb_train_report *rep)
{
	const pb_config *cfg = rep->cfg;
	const unsigned S = cfg->stages;
	fprintf(f, "workload,schedule,stages,mbs,cost_f,cost_bin,cost_bw,unit_us,cpus,threads,repeats,steps,"
		   "steps_per_s,steps_per_s_lo,steps_per_s_hi,step_ms,mbs_per_s,bubble,bubble_lo,bubble_hi,"
		   "bubble_predicted,work_ms,ideal_ms,efficiency,eff_of_predicted,loud,loud_share,status");
	unsigned most = S; /* the most stages (chunks) of any schedule: the columns */
	for (unsigned i = 0; i < rep->n; i++)
		most = rep->r[i].stages > most ? rep->r[i].stages : most;
	for (unsigned s = 0; s < most; s++)
		fprintf(f, ",s%u_stash_peak,s%u_held_peak,s%u_f_us,s%u_b_us,s%u_w_us", s, s, s, s, s);
	fputc('\n', f);
	for (unsigned i = 0; i < rep->n; i++) {
		const pb_train_result *r = &rep->r[i];
		fprintf(f,
			"train,%s,%u,%u,%g,%g,%g,%g,%u,%u,%u,%u,%.2f,%.2f,%.2f,%.4f,%.1f,%.4f,%.4f,%.4f,%.4f,"
			"%.4f,"
			"%.4f,%.4f,%.4f,%d,%.3f,%s",
			mbp_sched_name(r->kind), r->stages, cfg->mbs, cfg->costs[0], cfg->costs[1],
			cfg->costs[2], cfg->unit_us, rep->ncpus, r->threads, r->repeats, r->steps,
			r->rate.median, r->rate.lo, r->rate.hi, r->step_ms.median, r->mbs_per_s,
			r->bubble.median, r->bubble.lo, r->bubble.hi, r->bubble_predicted, r->work_ms,
			r->ideal_ms, r->efficiency, r->eff_of_predicted, r->loud, r->loud_share,
			r->status || r->steps == 0 ? "fail" : "ok");
		for (unsigned s = 0; s < most; s++)
			if (s < r->stages)
				fprintf(f, ",%u,%u,%.2f,%.2f,%.2f", r->stash_peak[s], r->held_peak[s],
					r->op_us[s][0], r->op_us[s][1], r->op_us[s][2]);
			else
				fputs(",,,,,", f);
		fputc('\n', f);
	}
}

static cJSON *json_interval(const pb_interval *iv)
{
	double v[2] = {iv->lo, iv->hi};
	return cJSON_CreateDoubleArray(v, 2);
}

static cJSON *json_stage_figures(const uint32_t *v, unsigned n)
{
	int x[MBP_MAX_STAGES];
	for (unsigned s = 0; s < n; s++)
		x[s] = (int)v[s];
	return cJSON_CreateIntArray(x, (int)n);
}

static cJSON *json_train_result(const pb_train_result *r, unsigned S, bool gantt)
{
	static const char *const kname[] = {"F", "B", "B_in", "W"};
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "schedule", mbp_sched_name(r->kind));
	cJSON_AddNumberToObject(o, "threads", r->threads);
	cJSON_AddNumberToObject(o, "repeats", r->repeats);
	cJSON_AddNumberToObject(o, "steps", r->steps);
	cJSON_AddNumberToObject(o, "steps_per_s", r->rate.median);
	cJSON_AddItemToObject(o, "steps_per_s_interval", json_interval(&r->rate));
	cJSON_AddNumberToObject(o, "step_ms", r->step_ms.median);
	cJSON_AddItemToObject(o, "step_ms_interval", json_interval(&r->step_ms));
	cJSON_AddNumberToObject(o, "mbs_per_s", r->mbs_per_s);
	cJSON *bub = cJSON_AddObjectToObject(o, "bubble");
	cJSON_AddNumberToObject(bub, "measured", r->bubble.median);
	cJSON_AddItemToObject(bub, "interval", json_interval(&r->bubble));
	cJSON_AddNumberToObject(bub, "predicted", r->bubble_predicted);
	cJSON_AddNumberToObject(o, "work_ms", r->work_ms);
	cJSON_AddNumberToObject(o, "ideal_ms", r->ideal_ms);
	cJSON_AddNumberToObject(o, "efficiency", r->efficiency);
	cJSON_AddNumberToObject(o, "efficiency_of_predicted", r->eff_of_predicted);
	cJSON_AddItemToObject(o, "stash_peak", json_stage_figures(r->stash_peak, S));
	cJSON_AddItemToObject(o, "stash_peak_schedule", json_stage_figures(r->stash_expected, S));
	cJSON_AddItemToObject(o, "held_peak", json_stage_figures(r->held_peak, S));
	cJSON_AddItemToObject(o, "held_peak_schedule", json_stage_figures(r->held_expected, S));
	cJSON_AddNumberToObject(o, "chunks", r->chunks);
	mt_thread_figs_json(o, &r->thr);
	cJSON *st = cJSON_AddArrayToObject(o, "stages");
	for (unsigned s = 0; s < S; s++) {
		cJSON *e = cJSON_CreateObject();
		cJSON_AddNumberToObject(e, "stage", s);
		cJSON_AddNumberToObject(e, "f_us", r->op_us[s][0]);
		cJSON_AddNumberToObject(e, "b_us", r->op_us[s][1]);
		cJSON_AddNumberToObject(e, "w_us", r->op_us[s][2]);
		cJSON_AddItemToArray(st, e);
	}
	if (r->kind == MBP_SCHED_AUTO) { /* the profile it was built from: [F, B_in, B_w] a chunk */
		cJSON *pr = cJSON_AddArrayToObject(o, "profile_us");
		for (unsigned s = 0; s < S; s++)
			cJSON_AddItemToArray(pr, cJSON_CreateDoubleArray(r->profile_us[s], 3));
	} else {
		cJSON_AddNullToObject(o, "profile_us");
	}
	cJSON_AddBoolToObject(o, "loud", r->loud);
	cJSON_AddNumberToObject(o, "loud_share", r->loud_share);
	if (gantt) {
		cJSON *g = cJSON_AddObjectToObject(o, "gantt");
		cJSON_AddNumberToObject(g, "step_us", (double)r->ev_step_ns / 1e3);
		cJSON *ev = cJSON_AddArrayToObject(g, "events");
		for (size_t i = 0; i < r->nev; i++) {
			const mbp_train_event *e = &r->ev[i];
			cJSON *x = cJSON_CreateObject();
			cJSON_AddNumberToObject(x, "stage", e->stage);
			cJSON_AddStringToObject(x, "op", e->kind < 4 ? kname[e->kind] : "?");
			cJSON_AddNumberToObject(x, "mb", e->mb);
			cJSON_AddNumberToObject(x, "t0_us", (double)e->t0_ns / 1e3);
			cJSON_AddNumberToObject(x, "t1_us", (double)e->t1_ns / 1e3);
			cJSON_AddItemToArray(ev, x);
		}
	}
	cJSON_AddBoolToObject(o, "ok", r->status == 0 && r->steps > 0);
	cJSON_AddItemToObject(o, "error", json_str_or_null(r->status ? r->error : NULL));
	return o;
}

int pb_train_print_json(FILE *f, const pb_train_report *rep)
{
	const pb_config *cfg = rep->cfg;
	cJSON *root = cJSON_CreateObject();
	cJSON_AddStringToObject(root, "tool", "pipebench");
	cJSON_AddStringToObject(root, "version", mbp_version());
	cJSON *wl = cJSON_AddObjectToObject(root, "workload");
	cJSON_AddStringToObject(wl, "kind", "train");
	cJSON_AddStringToObject(wl, "description", rep->desc);
	cJSON_AddNumberToObject(wl, "iterations_per_us", rep->iters_per_us);

	cJSON *c = cJSON_AddObjectToObject(root, "config");
	cJSON_AddNumberToObject(c, "stages", cfg->stages);
	cJSON_AddNumberToObject(c, "mbs", cfg->mbs);
	cJSON_AddItemToObject(c, "costs", cJSON_CreateDoubleArray(cfg->costs, 3));
	cJSON_AddNumberToObject(c, "unit_us", cfg->unit_us);
	cJSON_AddNumberToObject(c, "batches", cfg->batches);
	cJSON_AddNumberToObject(c, "duration_s", cfg->duration_s);
	cJSON_AddNumberToObject(c, "warmup", cfg->warmup);
	cJSON_AddNumberToObject(c, "tolerance_pct", cfg->tolerance * 100);
	cJSON_AddNumberToObject(c, "wait_quiet_s", cfg->wait_quiet_s);
	if (cfg->spin_us >= 0)
		cJSON_AddNumberToObject(c, "spin_us", (double)cfg->spin_us);
	else
		cJSON_AddNullToObject(c, "spin_us");

	cJSON *cp = cJSON_AddObjectToObject(root, "cpus");
	cJSON_AddNumberToObject(cp, "allowed", rep->allowed);
	cJSON_AddItemToObject(cp, "used", cJSON_CreateIntArray(cfg->cpus, (int)rep->ncpus));
	cJSON_AddNumberToObject(cp, "threads", rep->r[0].threads);
	double loads[2] = {rep->load_start, rep->load_end};
	cJSON_AddItemToObject(cp, "loadavg", cJSON_CreateDoubleArray(loads, 2));
	cJSON_AddItemToObject(root, "noise", pb_json_noise(&rep->noise, train_loud(rep)));

	cJSON *sc = cJSON_AddArrayToObject(root, "schedules");
	for (unsigned i = 0; i < rep->n; i++)
		cJSON_AddItemToArray(sc, json_train_result(&rep->r[i], rep->r[i].stages, cfg->gantt));
	if (rep->zb_vs_1f1b.n) {
		cJSON *zb = cJSON_AddObjectToObject(root, "zbh1_vs_1f1b");
		cJSON_AddNumberToObject(zb, "ratio", rep->zb_vs_1f1b.median);
		cJSON_AddItemToObject(zb, "interval", json_interval(&rep->zb_vs_1f1b));
	} else {
		cJSON_AddNullToObject(root, "zbh1_vs_1f1b");
	}
	return json_finish(f, root, rep->status, rep->error);
}

/* ---- the run under mpirun ---- */

void pb_print_mpi_table(FILE *f, const pb_mpi_report *rep)
{
	const pb_config *cfg = rep->cfg;
	fprintf(f, "pipebench: %s over %u MPI ranks\n", rep->desc, rep->ranks);
	fprintf(f, "ranks:");
	for (unsigned r = 0; r < rep->ranks; r++) {
		if (rep->count[r] == 1)
			fprintf(f, "%s rank %u: stage %u", r ? ";" : "", r, rep->first[r]);
		else
			fprintf(f, "%s rank %u: stages %u-%u", r ? ";" : "", r, rep->first[r],
				rep->first[r] + rep->count[r] - 1);
	}
	fprintf(f, "\nbatch %u %s, load %.2f\n\n", cfg->batch, PLURAL(cfg->batch, "row", "rows"), rep->load);
	fprintf(f, "%6s %5s %12s %25s %8s %8s %6s %9s %11s %6s\n", "mb", "mbs", "rows/s", "95% interval",
		"p50 ms", "p99 ms", "hop", "link us", "compute us", "link");
	for (unsigned i = 0; i < cfg->nsizes; i++) {
		const pb_mpi_row *z = &rep->rows[i];
		char iv[64];
		snprintf(iv, sizeof(iv), "%.0f-%.0f", z->thr.lo, z->thr.hi);
		fprintf(f, "%6u %5u %12.0f %25s %8.3f %8.3f", z->mb_rows, z->mbs, z->thr.median, iv,
			z->p50_ms, z->p99_ms);
		const double cu = z->compute_us;
		for (unsigned r = 0; r + 1 < rep->ranks; r++) {
			const double lu = z->link_us[r];
			char hop[24];
			snprintf(hop, sizeof(hop), "%u>%u", r, r + 1);
			if (r)
				fprintf(f, "%6s %5s %12s %25s %8s %8s", "", "", "", "", "", "");
			fprintf(f, " %6s %9.1f %11.1f %5.1f%%%s\n", hop, lu, cu,
				lu + cu > 0 ? 100 * lu / (lu + cu) : 0,
				r == 0 && i == rep->best ? "  <- best" : "");
		}
		if (rep->ranks == 1) /* no hop */
			fprintf(f, " %6s %9s %11.1f %6s%s\n", "-", "-", cu, "-",
				i == rep->best ? "  <- best" : "");
	}
	fprintf(
	    f,
	    "\nlink: per micro-batch, the time the next rank's first stage waited for it beyond its leaving "
	    "the rank before and that stage being free;\ncompute: the slowest stage's time per micro-batch; "
	    "link share = link / (link + compute).\n");
}

int pb_print_mpi_json(FILE *f, const pb_mpi_report *rep)
{
	const pb_config *cfg = rep->cfg;
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "tool", "pipebench");
	cJSON_AddStringToObject(o, "mode", "mpi");
	cJSON_AddStringToObject(o, "version", mbp_version());
	cJSON_AddStringToObject(o, "workload", cfg->workload == PB_WL_MLP ? "mlp" : "synthetic");
	cJSON_AddStringToObject(o, "description", rep->desc);
	cJSON_AddNumberToObject(o, "ranks", rep->ranks);
	cJSON_AddNumberToObject(o, "stages", rep->stages);
	cJSON_AddNumberToObject(o, "batch", cfg->batch);
	cJSON_AddNumberToObject(o, "load", rep->load);
	cJSON *rs = cJSON_AddArrayToObject(o, "rank_stages");
	for (unsigned r = 0; r < rep->ranks; r++) {
		cJSON *a = cJSON_CreateObject();
		cJSON_AddNumberToObject(a, "rank", r);
		cJSON_AddNumberToObject(a, "first", rep->first[r]);
		cJSON_AddNumberToObject(a, "count", rep->count[r]);
		cJSON_AddNumberToObject(a, "clock_offset_ns", (double)rep->clock_offset_ns[r]);
		cJSON_AddItemToArray(rs, a);
	}
	cJSON *res = cJSON_AddArrayToObject(o, "results");
	for (unsigned i = 0; i < cfg->nsizes; i++) {
		const pb_mpi_row *z = &rep->rows[i];
		cJSON *e = cJSON_CreateObject();
		cJSON_AddNumberToObject(e, "mb_rows", z->mb_rows);
		cJSON_AddNumberToObject(e, "mbs", z->mbs);
		cJSON_AddNumberToObject(e, "batches", z->batches);
		/* the names of the single-process output */
		cJSON_AddNumberToObject(e, "rows_per_s", z->thr.median);
		const double iv[2] = {z->thr.lo, z->thr.hi};
		cJSON_AddItemToObject(e, "rows_per_s_interval", cJSON_CreateDoubleArray(iv, 2));
		cJSON *lat = cJSON_AddObjectToObject(e, "latency_ms");
		cJSON_AddNumberToObject(lat, "p50", z->p50_ms);
		cJSON_AddNumberToObject(lat, "p99", z->p99_ms);
		cJSON_AddBoolToObject(e, "best", i == rep->best);
		cJSON_AddItemToObject(e, "stage_us", cJSON_CreateDoubleArray(z->stage_us, (int)rep->stages));
		cJSON *hops = cJSON_AddArrayToObject(e, "hops");
		for (unsigned r = 0; r + 1 < rep->ranks; r++) {
			const double lu = z->link_us[r], cu = z->compute_us;
			cJSON *h = cJSON_CreateObject();
			cJSON_AddNumberToObject(h, "from_rank", r);
			cJSON_AddNumberToObject(h, "to_rank", r + 1);
			cJSON_AddNumberToObject(h, "link_us", lu);
			cJSON_AddNumberToObject(h, "compute_us", cu);
			cJSON_AddNumberToObject(h, "link_share", lu + cu > 0 ? lu / (lu + cu) : 0);
			cJSON_AddItemToArray(hops, h);
		}
		cJSON *rk = cJSON_AddArrayToObject(e, "rank_links");
		for (unsigned r = 0; r < z->links; r++) {
			cJSON *h = cJSON_CreateObject();
			cJSON_AddNumberToObject(h, "sent", (double)z->link[r].sent);
			cJSON_AddNumberToObject(h, "received", (double)z->link[r].received);
			cJSON_AddNumberToObject(h, "credit_waits", (double)z->link[r].credit_waits);
			cJSON_AddItemToArray(rk, h);
		}
		cJSON_AddItemToArray(res, e);
	}
	return mt_json_print(f, o);
}

/* ---- the lines on standard error ---- */

static int say(int status, const char *fmt, va_list ap)
{
	fprintf(stderr, "pipebench: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "%s\n", status == PB_EXIT_USAGE ? " (try --help)" : "");
	return status;
}

int pb_usage(const char *fmt, ...)
{
	if (mbt_launcher_rank() != 0)
		return PB_EXIT_USAGE;
	va_list ap;
	va_start(ap, fmt);
	say(PB_EXIT_USAGE, fmt, ap);
	va_end(ap);
	return PB_EXIT_USAGE;
}

int pb_failure(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	say(PB_EXIT_FAIL, fmt, ap);
	va_end(ap);
	return PB_EXIT_FAIL;
}

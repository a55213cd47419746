/*
 * The planner run of pipetrain --plan auto and pipebench --workload=train --plan=auto: the profile the
 * planner needs (each layer's F, B_in and B_w at the powers of two from 16 rows up to the batch, its
 * activation bytes per row), mbp_mlp_plan with the --memory budget, and the plan's lines, its JSON and
 * the refusal of a budget no plan fits.
 *
 * The profile takes at most about PROFILE_BUDGET_S: the sizes are timed from the smallest up, each as
 * the best of several runs while the time allows (one after a warm-up at the largest), and a size whose
 * estimate (twice the previous size's) would pass the budget is not timed: its costs are the largest
 * timed size's scaled by the rows (a product's speed per row is about flat from a few hundred rows on).
 * The lines say how many sizes were timed. Before the first size, one untimed pass over every layer at
 * that size (its estimate, too): the smallest size is the one a tight budget plans for, and the first
 * products after the model is built ran up to 1.4x slower than the later ones. Runs of a size: up to
 * PROFILE_MAX_REPS while its pass is shorter than PROFILE_LONG_S, 5 from there: a pass of a few hundred
 * microseconds (16 rows) is the noisiest, and with its best of 5 the same model's plan at an eighth
 * budget changed between runs (perf/RESULTS.md, issue 24's miss at 16 rows). Each F and B of a stage is
 * counted MT_OP_NS more than its layers' sum: the trainer's own work per operation.
 *
 * Memory, as the plan counts it: the activations (each stage's stashes and recomputation buffers, which
 * the trainer counts as act_peak_bytes) plus the parameters, their gradients and the optimizer's moments
 * (4 bytes each). After training, the measured peak is the trainer's act_peak_bytes plus the same state.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/shared/mlptrain.h"
#include "util/clock.h"
#include "util/number.h"

#define PROFILE_BUDGET_S 4.0
#define PROFILE_MAX_REPS 15   /* runs of a size whose pass is short */
#define PROFILE_LONG_S	 0.01 /* a pass this long or longer: at most 5 runs */
/* What the trainer adds to a stage's F and B of a micro-batch (the hand-on to the next stage, a wake-up):
 * perf/results/train.md's measured steps exceed the simulated ones by 1 to 6 us per operation (its bubble
 * against the prediction); the upper end, so that tiny operations are not taken for free. */
#define MT_OP_NS 5000.0

static double mib(uint64_t b)
{
	return (double)b / (1 << 20);
}

/* The profile a planned from (its arrays a's). */
static mbp_plan_profile profile_of(const mt_auto *a)
{
	return (mbp_plan_profile){.layers = a->layers,
				  .sizes = a->sizes,
				  .mb = a->mb,
				  .cost = a->cost,
				  .keep_bytes = a->keep,
				  .out_bytes = a->out,
				  .state_bytes = a->state_bytes,
				  .batch = a->batch,
				  .op_ns = MT_OP_NS};
}

int mt_auto_plan(mbp_mlp *n, uint32_t batch, uint64_t memory, unsigned threads, unsigned cpus, mt_auto *a)
{
	unsigned L = mbp_mlp_layers(n);
	memset(a, 0, sizeof *a);
	a->budget = memory ? memory : UINT64_MAX;
	mbp_op_costs *cost = a->cost;
	uint64_t *keep = a->keep, *out = a->out, params = 0, copies = 0;
	a->layers = L;
	a->batch = batch;
	for (unsigned i = 0; i < L; i++) {
		mbp_mlp_stage *st;
		int rc = mbp_mlp_stage_new(&st, n, i, i + 1, 1);
		if (rc < 0)
			return rc;
		keep[i] = mbp_mlp_stage_stash_floats(st) * sizeof(float);
		out[i] = mbp_mlp_stage_out_width(st) * sizeof(float);
		mbp_mlp_stage_destroy(st);
		mbp_layer_info li;
		mbp_mlp_layer_info(n, i, &li);
		params += li.param_bytes;
		copies += li.packed_bytes + li.pad_bytes;
	}
	mbp_optim_opts oo;
	mbp_mlp_optim(n, &oo);
	unsigned moments = oo.kind == MBP_OPTIM_ADAMW ? 2 : oo.momentum > 0 ? 1 : 0;
	/* parameters, gradients, moments, and the stages' copy of the weights that the model allocates
	 * beside them (packed for the packed kernel, padded under OpenBLAS): a plan that fits on paper
	 * must fit in practice */
	a->state_bytes = params * (2 + moments) + copies;

	for (uint32_t mb = batch < 16 ? batch : 16; mb <= batch && a->sizes < MBP_PLAN_MAX_SIZES; mb *= 2) {
		if ((batch + mb - 1) / mb > MBP_TRAIN_MAX_MBS)
			continue;
		a->mb[a->sizes++] = mb;
	}
	double t0 = mbt_now_s(), last = 0; /* the last timed size's one pass over every layer, s */
	mt_costs *pc = malloc(sizeof *pc);
	if (!pc)
		return -ENOMEM;
	/* the untimed pass before the first size; `last` its estimate */
	int rc = a->sizes ? mt_profile(n, a->mb[0], 1, pc) : 0;
	for (unsigned i = 0; rc == 0 && a->sizes && i < L; i++)
		last += (pc->f[i] + pc->b_in[i] + pc->b_w[i]) * 1e-9;
	for (unsigned k = 0; rc == 0 && k < a->sizes; k++) {
		double left = PROFILE_BUDGET_S - (mbt_now_s() - t0);
		mbp_op_costs *row = cost + (size_t)k * L;
		if (k && 4 * last > left) { /* warm-up and one run at twice the rows would pass the budget */
			double scale = (double)a->mb[k] / a->mb[a->measured - 1];
			const mbp_op_costs *from = cost + (size_t)(a->measured - 1) * L;
			for (unsigned i = 0; i < L; i++)
				row[i] = (mbp_op_costs){from[i].f * scale, from[i].b_in * scale,
							from[i].b_w * scale};
			continue;
		}
		/* reps: as many as fit a share of what is left, from 1 to the most a pass of its length takes */
		double est = k ? 2 * last : last, most = est < PROFILE_LONG_S ? PROFILE_MAX_REPS : 5;
		unsigned reps = est > 0 ? (unsigned)fmin(most, fmax(1, left / (a->sizes - k) / est - 1)) : 5;
		rc = mt_profile(n, a->mb[k], reps, pc);
		if (rc < 0)
			break;
		last = 0;
		for (unsigned i = 0; i < L; i++) {
			row[i] = (mbp_op_costs){pc->f[i], pc->b_in[i], pc->b_w[i]};
			last += (pc->f[i] + pc->b_in[i] + pc->b_w[i]) * 1e-9;
		}
		a->measured = k + 1;
	}
	free(pc);
	if (rc < 0)
		return rc;
	a->profile_s = mbt_now_s() - t0;
	mbp_plan_profile p = profile_of(a);
	unsigned T = threads && threads < cpus ? threads : cpus;
	return mbp_mlp_plan(&p, a->budget, T, &a->plan, &a->need);
}

int mt_auto_predict(const mt_auto *a, mbp_train_plan *pl)
{
	mbp_plan_profile p = profile_of(a);
	return mbp_mlp_plan_predict(&p, pl);
}

/* "0-2 3* 4-5": each stage's layers, '*' where it recomputes. */
static void stages_str(const mbp_train_plan *p, char *buf, size_t n)
{
	size_t at = 0;
	buf[0] = 0;
	for (unsigned s = 0; s < p->stages && at < n; s++) {
		unsigned a = p->first[s], b = p->first[s + 1] - 1;
		int w = a == b ? snprintf(buf + at, n - at, "%s%u", s ? " " : "", a)
			       : snprintf(buf + at, n - at, "%s%u-%u", s ? " " : "", a, b);
		at += w > 0 ? (size_t)w : 0;
		if (at < n && (p->recompute >> s & 1))
			at += (size_t)snprintf(buf + at, n - at, "*");
	}
}

void mt_auto_print(FILE *f, const mt_auto *a)
{
	const mbp_train_plan *p = &a->plan;
	char st[512], budget[64];
	stages_str(p, st, sizeof st);
	if (a->budget == UINT64_MAX)
		snprintf(budget, sizeof budget, "no --memory limit");
	else
		snprintf(budget, sizeof budget, "--memory %.2f MiB", mib(a->budget));
	fprintf(f,
		"plan: %u %s, %s on %u %s, micro-batch %u rows (%u a step); stages (layers, * recomputes): "
		"%s\n",
		p->threads, p->threads == 1 ? "thread" : "threads", mbp_sched_name(p->schedule), p->stages,
		p->stages == 1 ? "stage" : "stages", p->mb, p->mbs, st);
	fprintf(f,
		"plan: predicted step %.3f ms, bubble %.3f, peak memory %.2f MiB (activations %.2f MiB + "
		"parameters, gradients, optimizer state and weight copy %.2f MiB) within %s; smallest that "
		"fits %.2f MiB\n",
		p->step_ns * 1e-6, p->bubble, mib(p->peak_bytes), mib(p->act_bytes), mib(p->state_bytes),
		budget, mib(a->need));
	fprintf(f,
		"plan: %u plans played, %u within the budget; profile %.2f s at %u-%u rows (%u %s timed%s)\n",
		p->considered, p->fitted, a->profile_s, a->mb[0], a->mb[a->sizes - 1], a->measured,
		a->measured == 1 ? "size" : "sizes",
		a->measured < a->sizes ? ", the larger ones scaled by rows" : "");
	fflush(f);
}

int mt_json_print(FILE *f, void *root)
{
	char *text = cJSON_Print(root);
	cJSON_Delete(root);
	if (!text)
		return -1;
	fprintf(f, "%s\n", text);
	cJSON_free(text);
	return 0;
}

void *mt_auto_json(const mt_auto *a)
{
	const mbp_train_plan *p = &a->plan;
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "threads", p->threads);
	cJSON_AddNumberToObject(o, "stages", p->stages);
	cJSON_AddStringToObject(o, "schedule", mbp_sched_name(p->schedule));
	cJSON_AddNumberToObject(o, "mb", p->mb);
	cJSON_AddNumberToObject(o, "mbs", p->mbs);
	cJSON *sts = cJSON_AddArrayToObject(o, "stage_layers");
	cJSON *rc = cJSON_AddArrayToObject(o, "recompute");
	cJSON *act = cJSON_AddArrayToObject(o, "stage_activation_bytes");
	for (unsigned s = 0; s < p->stages; s++) {
		cJSON *r = cJSON_CreateArray();
		cJSON_AddItemToArray(r, cJSON_CreateNumber(p->first[s]));
		cJSON_AddItemToArray(r, cJSON_CreateNumber(p->first[s + 1] - 1));
		cJSON_AddItemToArray(sts, r);
		cJSON_AddItemToArray(rc, cJSON_CreateBool(p->recompute >> s & 1));
		cJSON_AddItemToArray(act, cJSON_CreateNumber((double)p->stage_act_bytes[s]));
	}
	cJSON_AddNumberToObject(o, "predicted_step_ms", p->step_ns * 1e-6);
	cJSON_AddNumberToObject(o, "predicted_bubble", p->bubble);
	cJSON_AddNumberToObject(o, "predicted_peak_bytes", (double)p->peak_bytes);
	cJSON_AddNumberToObject(o, "predicted_activation_bytes", (double)p->act_bytes);
	cJSON_AddNumberToObject(o, "state_bytes", (double)p->state_bytes);
	if (a->budget == UINT64_MAX)
		cJSON_AddNullToObject(o, "budget_bytes");
	else
		cJSON_AddNumberToObject(o, "budget_bytes", (double)a->budget);
	cJSON_AddNumberToObject(o, "smallest_budget_bytes", (double)a->need);
	cJSON_AddNumberToObject(o, "plans_played", p->considered);
	cJSON_AddNumberToObject(o, "plans_fitted", p->fitted);
	cJSON_AddNumberToObject(o, "profile_s", a->profile_s);
	cJSON *sz = cJSON_AddArrayToObject(o, "sizes");
	for (unsigned k = 0; k < a->sizes; k++)
		cJSON_AddItemToArray(sz, cJSON_CreateNumber(a->mb[k]));
	cJSON_AddNumberToObject(o, "sizes_timed", a->measured);
	return o;
}

void mt_auto_refusal(const mt_auto *a, char *buf, size_t n)
{
	snprintf(
	    buf, n,
	    "--memory %.2f MiB: no plan fits (activations and parameter state); the smallest budget that "
	    "fits is %llu MiB",
	    mib(a->budget), (unsigned long long)((a->need + (1u << 20) - 1) >> 20));
}

uint64_t mt_auto_peak(const mt_auto *a, uint64_t act_peak_bytes)
{
	return act_peak_bytes + a->state_bytes;
}

/* "0,2" into the bits of a set of numbers below lim (each once at most). @return 0 or -1. */
static int parse_set(const char *s, unsigned lim, uint64_t *bits)
{
	*bits = 0;
	for (const char *p = s;; p++) {
		size_t len = strcspn(p, ",");
		uint64_t v;
		if (parse_u64_span(p, len, lim ? lim - 1 : 0, &v) || !lim || (*bits >> v & 1))
			return -1;
		*bits |= 1ull << v;
		p += len;
		if (!*p)
			return 0;
	}
}

void *mt_auto_points_json(const mt_auto *a, FILE *f, char *err, size_t n)
{
	cJSON *arr = cJSON_CreateArray();
	char line[1024];
	unsigned no = 0;
	while (arr && fgets(line, sizeof line, f)) {
		no++;
		char kind[32], rcs[512], split[512];
		unsigned T, mb;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		if (strspn(line, " \t\r\n") == strlen(line))
			continue;
		mbp_train_plan pl = {0};
		uint64_t set = 0, cuts = 0;
		int got = sscanf(line, "%31s %u %u %511s %511s", kind, &T, &mb, rcs, split);
		bool ok = got == 5 && mbp_sched_parse(kind, &pl.schedule) == 0 && T >= 1 &&
			  T <= MBP_MAX_STAGES && mb >= 1;
		if (ok) {
			pl.threads = T;
			pl.mb = mb;
			bool ch = pl.schedule == MBP_SCHED_INTERLEAVED ||
				  pl.schedule == MBP_SCHED_LOOPED_BFS || pl.schedule == MBP_SCHED_ZBV ||
				  pl.schedule == MBP_SCHED_DUALPIPEV;
			pl.stages = ch ? 2 * T : T;
			ok = pl.stages <= MBP_MAX_STAGES;
			ok = ok && (!strcmp(rcs, "none") || !strcmp(rcs, "all") ||
				    !parse_set(rcs, pl.stages, &set));
			pl.recompute =
			    !strcmp(rcs, "all") ? (pl.stages < 64 ? (1ull << pl.stages) - 1 : ~0ull) : set;
			/* the split: the first layer of stages 1 .. S-1, increasing ("-": one stage) */
			ok =
			    ok && (strcmp(split, "-") ? !parse_set(split, a->layers, &cuts) : pl.stages == 1);
			ok = ok && (unsigned)__builtin_popcountll(cuts) == pl.stages - 1 && !(cuts & 1);
		}
		if (!ok) {
			snprintf(err, n,
				 "line %u: not SCHEDULE THREADS MB RECOMPUTE SPLIT (RECOMPUTE: none, all or "
				 "stages 0,2; SPLIT: the first layers of stages 1 .. S-1, 2,4, or - for one "
				 "stage)",
				 no);
			cJSON_Delete(arr);
			return NULL;
		}
		unsigned s = 1;
		for (unsigned l = 1; l < a->layers; l++)
			if (cuts >> l & 1)
				pl.first[s++] = l;
		pl.first[pl.stages] = a->layers;
		cJSON *o = cJSON_CreateObject();
		cJSON_AddNumberToObject(o, "line", no);
		cJSON_AddStringToObject(o, "schedule", mbp_sched_name(pl.schedule));
		cJSON_AddNumberToObject(o, "threads", pl.threads);
		cJSON_AddNumberToObject(o, "stages", pl.stages);
		cJSON_AddNumberToObject(o, "mb", pl.mb);
		cJSON *rc = cJSON_AddArrayToObject(o, "recompute");
		cJSON *sp = cJSON_AddArrayToObject(o, "split");
		for (unsigned k = 0; k < pl.stages; k++) {
			cJSON_AddItemToArray(rc, cJSON_CreateBool(pl.recompute >> k & 1));
			if (k)
				cJSON_AddItemToArray(sp, cJSON_CreateNumber(pl.first[k]));
		}
		if (mt_auto_predict(a, &pl) == 0) {
			cJSON_AddNumberToObject(o, "predicted_step_ms", pl.step_ns * 1e-6);
			cJSON_AddNumberToObject(o, "predicted_bubble", pl.bubble);
			cJSON_AddNumberToObject(o, "predicted_peak_bytes", (double)pl.peak_bytes);
			cJSON_AddNumberToObject(o, "predicted_activation_bytes", (double)pl.act_bytes);
			cJSON_AddBoolToObject(o, "fits", pl.peak_bytes <= a->budget);
		} else { /* a point the planner cannot weigh: an unprofiled size, a placement its kind refuses */
			cJSON_AddNullToObject(o, "predicted_step_ms");
		}
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

/*
 * pipebench --workload=train --plan=auto: the planner against the run it plans. An MLP of --widths with
 * random weights (--seed) is profiled and planned for --memory by the code pipetrain --plan auto runs
 * (tools/shared: mt_auto_plan), the plan printed (its three lines; --json: the document's "plan"), then
 * trained with it on synthetic rows (random inputs, labels cycling through the classes): --warmup
 * unmeasured steps, then --batches measured ones. The report sets the measured step (the median of the
 * trainer's step times), bubble and peak memory (the trainer's activation peak over every step, the
 * unmeasured ones included, plus the plan's state) beside the plan's predictions.
 *
 * The machine is watched as in every other run (noise.c): before the profile (a measurement too) the run
 * waits at most --wait-quiet seconds for other processes to leave the CPUs; the measured steps are
 * sampled in windows, a loud window is followed by a pause for a quiet one out of what is left of
 * --wait-quiet, and the measured lines are marked loud when more than a tenth of the steps ran in loud
 * windows; the machine's lines and the JSON's "noise" are the other runs'.
 *
 * Exit statuses: 2 when no plan fits --memory (one line naming the smallest budget that fits, as
 * pipetrain's), 1 when a step fails or the measured peak exceeds the budget (an invariant of the
 * planner: every plan it gives fits), 0 otherwise.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipebench.h"
#include "tools/shared/mlptrain.h"
#include "util/plural.h"

#define PB_PLAN_DEF_BATCH 256

static const uint32_t default_widths[] = {784, 512, 512, 10};

/* What one planned run measured. */
struct measured {
	unsigned steps; /* measured steps */
	double step_ms, min_ms, max_ms, bubble, bubble_predicted;
	uint64_t act_peak_bytes; /* the trainer's, over every step */
	uint64_t pool_bytes;	 /* the activation pool at its high-water mark */
	unsigned loud_steps;	 /* measured steps that ran in loud windows */
	bool loud;		 /* more than PB_LOUD_SHARE of them */
};

static double mib(uint64_t b)
{
	return (double)b / (1 << 20);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The model's widths as "784-512-10". */
static void widths_str(const uint32_t *w, unsigned L, char *buf, size_t n)
{
	size_t at = 0;
	buf[0] = 0;
	for (unsigned i = 0; i <= L && at < n; i++) {
		int k = snprintf(buf + at, n - at, "%s%u", i ? "-" : "", w[i]);
		at += k > 0 ? (size_t)k : 0;
	}
}

/* Train with the plan: its stages (layers, recomputation), schedule, threads and micro-batch size, on
 * synthetic rows, the measured steps watched by nz (settled before the profile). 0, or -1 with err set. */
static int run_plan(const pb_config *cfg, mbp_mlp *n, const uint32_t *w, unsigned L, const mt_auto *a,
		    pb_noise *nz, struct measured *m, char *err, size_t errlen)
{
	const mbp_train_plan *p = &a->plan;
	uint32_t batch = cfg->batch, width = w[0], classes = w[L];
	unsigned total = cfg->warmup + cfg->batches;
	mt_shared sh = {
	    .n = n, .layers = L, .classes = classes, .clip = 1, .fault_step = -1, .slow_step = -1};
	mt_stage stage[MBP_MAX_STAGES];
	memset(stage, 0, sizeof stage);
	mbp_trainer *t = NULL;
	float *x = malloc((size_t)batch * width * sizeof(float));
	int32_t *y = malloc((size_t)batch * sizeof(int32_t));
	double *ms = malloc((cfg->batches + 1) * sizeof(double));
	int rc = x && y && ms && mt_shared_pieces(&sh) == 0 ? 0 : -ENOMEM;
	const char *what = "out of memory";
	uint64_t r = cfg->seed * 0x9E3779B97F4A7C15ull + 1; /* the rows: an LCG from --seed */
	for (size_t i = 0; rc == 0 && i < (size_t)batch * width; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		x[i] = (float)(r >> 40) / (float)(1u << 24);
	}
	for (uint32_t i = 0; rc == 0 && i < batch; i++)
		y[i] = (int32_t)(i % classes);
	mbp_train_opts to = {.in_row_bytes = width * sizeof(float),
			     .target_row_bytes = sizeof(int32_t),
			     .max_mb_rows = p->mb,
			     .max_mbs = p->mbs,
			     .schedule = p->schedule,
			     .threads = p->threads,
			     .pinning = MBP_PIN_PLAN,
			     .spin_ns = pb_spin_ns(cfg, 0), /* 0: the trainer's default */
			     .loss = mt_loss,
			     .loss_arg = &sh};
	if (rc == 0 && (rc = mbp_trainer_new(&t, &to)) < 0)
		what = "cannot create the trainer";
	for (unsigned s = 0; rc == 0 && s < p->stages; s++) {
		uint64_t rec = 0;
		for (unsigned l = p->first[s]; l < p->first[s + 1] && (p->recompute >> s & 1); l++)
			rec |= 1ull << l;
		rc = mt_stage_make(&stage[s], &sh, s, p->first[s], p->first[s + 1], p->mb, NULL, rec);
		mbp_train_stage_desc d;
		if (rc == 0) {
			mt_stage_desc(&stage[s], &d);
			rc = mbp_trainer_add_stage(t, &d);
		}
		if (rc < 0)
			what = "cannot build a stage";
	}
	if (rc == 0 && (rc = mbp_trainer_start(t)) < 0)
		what = "cannot start the trainer";
	memset(m, 0, sizeof *m);
	pb_noise_window win = {.pause_left = cfg->wait_quiet_s - nz->waited_s};
	for (unsigned i = 0; rc == 0 && i < total; i++) {
		pb_progress(i, total, "training");
		if (i == cfg->warmup)
			pb_noise_mark(nz);
		double loss;
		if ((rc = mbp_trainer_step(t, x, y, batch, p->mb, &loss)) < 0) {
			what = "a step failed";
			break;
		}
		mbp_train_stats ts;
		mbp_trainer_stats_get(t, &ts, NULL, 0);
		if (ts.act_peak_bytes > m->act_peak_bytes)
			m->act_peak_bytes = ts.act_peak_bytes;
		m->pool_bytes = ts.act_pool.high_water * ts.act_buf_bytes;
		if (i >= cfg->warmup) {
			ms[m->steps++] = (double)ts.step_ns * 1e-6;
			m->bubble += ts.bubble;
			m->bubble_predicted += ts.bubble_predicted;
			/* the window closes at 0.5 s or at the last step: its steps are loud or quiet; a pause
			 * falls between steps, which the step times leave out */
			if (pb_noise_step(nz, &win, m->steps, i + 1 == total) == 1)
				m->loud_steps += win.end - win.first;
		}
	}
	m->loud = m->steps && (double)m->loud_steps / m->steps > PB_LOUD_SHARE;
	pb_progress_end();
	if (rc == 0 && m->steps) {
		qsort(ms, m->steps, sizeof(double), cmp_double);
		m->step_ms = pb_percentile(ms, m->steps, 0.5);
		m->min_ms = ms[0];
		m->max_ms = ms[m->steps - 1];
		m->bubble /= m->steps;
		m->bubble_predicted /= m->steps;
	}
	if (rc < 0)
		snprintf(err, errlen, "%s: %s", what, mbp_strerror(rc));
	mbp_trainer_destroy(t);
	for (unsigned s = 0; s < MBP_MAX_STAGES; s++)
		mbp_mlp_stage_destroy(stage[s].st);
	free(x);
	free(y);
	free(ms);
	free(sh.piece_sq);
	return rc < 0 ? -1 : 0;
}

static void print_measured(FILE *f, const mt_auto *a, const struct measured *m)
{
	const mbp_train_plan *p = &a->plan;
	uint64_t peak = mt_auto_peak(a, m->act_peak_bytes);
	char budget[64];
	if (a->budget == UINT64_MAX)
		snprintf(budget, sizeof budget, "no --memory limit");
	else
		snprintf(budget, sizeof budget, "%s --memory %.2f MiB",
			 peak <= a->budget ? "within" : "ABOVE", mib(a->budget));
	fprintf(f,
		"measured: step %.3f ms (median of %u %s, %.3f to %.3f; predicted %.3f ms, %.2fx), bubble "
		"%.3f (predicted %.3f)%s\n",
		m->step_ms, m->steps, PLURAL(m->steps, "step", "steps"), m->min_ms, m->max_ms,
		p->step_ns * 1e-6, p->step_ns > 0 ? m->step_ms / (p->step_ns * 1e-6) : 0, m->bubble,
		p->bubble, m->loud ? "  loud" : "");
	fprintf(f,
		"measured: peak memory %.2f MiB (predicted %.2f MiB): the trainer's activation peak %.2f MiB "
		"(predicted %.2f MiB) + the state %.2f MiB, %s\n",
		mib(peak), mib(p->peak_bytes), mib(m->act_peak_bytes), mib(p->act_bytes), mib(a->state_bytes),
		budget);
}

/* The document: the run's shape, the plan, and what the run measured (NULL: --plan-only). 0, or -1. */
static int print_json(const pb_config *cfg, const uint32_t *w, unsigned L, unsigned ncpus, const mt_auto *a,
		      const pb_noise *nz, const struct measured *m)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "tool", "pipebench");
	cJSON_AddStringToObject(o, "version", mbp_version());
	cJSON *wl = cJSON_AddObjectToObject(o, "workload");
	cJSON_AddStringToObject(wl, "kind", "train");
	cJSON_AddStringToObject(wl, "plan", "auto");
	cJSON *wd = cJSON_AddArrayToObject(wl, "widths");
	for (unsigned i = 0; i <= L; i++)
		cJSON_AddItemToArray(wd, cJSON_CreateNumber(w[i]));
	cJSON_AddNumberToObject(wl, "batch", cfg->batch);
	cJSON_AddNumberToObject(wl, "seed", (double)cfg->seed);
	cJSON *cp = cJSON_AddObjectToObject(o, "cpus");
	cJSON_AddItemToObject(cp, "used", cJSON_CreateIntArray(cfg->cpus, (int)ncpus));
	cJSON *c = cJSON_AddObjectToObject(o, "config"); /* as the other runs' */
	cJSON_AddNumberToObject(c, "batches", cfg->batches);
	cJSON_AddNumberToObject(c, "warmup", cfg->warmup);
	cJSON_AddNumberToObject(c, "wait_quiet_s", cfg->wait_quiet_s);
	cJSON_AddItemToObject(o, "noise", pb_json_noise(nz, m && m->loud));
	cJSON_AddItemToObject(o, "plan", mt_auto_json(a));
	if (m) {
		uint64_t peak = mt_auto_peak(a, m->act_peak_bytes);
		cJSON *x = cJSON_AddObjectToObject(o, "measured");
		cJSON_AddNumberToObject(x, "steps", m->steps);
		cJSON_AddNumberToObject(x, "warmup_steps", cfg->warmup);
		cJSON_AddNumberToObject(x, "step_ms", m->step_ms);
		cJSON_AddNumberToObject(x, "step_ms_min", m->min_ms);
		cJSON_AddNumberToObject(x, "step_ms_max", m->max_ms);
		cJSON_AddNumberToObject(x, "step_over_predicted",
					a->plan.step_ns > 0 ? m->step_ms / (a->plan.step_ns * 1e-6) : 0);
		cJSON_AddNumberToObject(x, "bubble", m->bubble);
		cJSON_AddNumberToObject(x, "bubble_predicted_from_measured", m->bubble_predicted);
		cJSON_AddNumberToObject(x, "peak_bytes", (double)peak);
		cJSON_AddNumberToObject(x, "activation_peak_bytes", (double)m->act_peak_bytes);
		cJSON_AddNumberToObject(x, "activation_pool_bytes", (double)m->pool_bytes);
		cJSON_AddNumberToObject(x, "state_bytes", (double)a->state_bytes);
		cJSON_AddBoolToObject(x, "within_budget", a->budget == UINT64_MAX || peak <= a->budget);
		cJSON_AddNumberToObject(x, "loud_steps", m->loud_steps);
		cJSON_AddBoolToObject(x, "loud", m->loud);
	} else {
		cJSON_AddNullToObject(o, "measured");
	}
	return mt_json_print(stdout, o);
}

int pb_train_plan_main(pb_config *cfg, unsigned ncpus)
{
	char err[PB_ERR_MAX];
	if (pb_narrow_cpus(cfg, ncpus, err, sizeof err))
		return pb_failure("%s", err);
	const uint32_t *w = cfg->nwidths ? cfg->widths : default_widths;
	unsigned L = cfg->nwidths ? cfg->nwidths - 1 : sizeof default_widths / sizeof default_widths[0] - 1;
	if (cfg->batch == 0)
		cfg->batch = PB_PLAN_DEF_BATCH;
	if (w[L] < 2)
		return pb_usage("--widths: the last width is the classes, at least 2, not %u", w[L]);
	mbp_optim_opts oo = {.kind = MBP_OPTIM_ADAMW,
			     .lr = 1e-3f,
			     .total_steps = cfg->warmup + cfg->batches}; /* pipetrain's default optimizer */
	mbp_model_spec sp = {.layers = L, .widths = w, .act = MBP_ACT_RELU, .seed = cfg->seed};
	mbp_mlp *n = NULL;
	int rc = mbp_mlp_new_random(&n, &sp, &oo);
	if (rc < 0)
		return rc == -EINVAL ? pb_usage("--widths: cannot build the model: %s", mbp_strerror(rc))
				     : pb_failure("cannot build the model: %s", mbp_strerror(rc));
	static mt_auto a; /* large; one per run */
	FILE *human = cfg->format == PB_FMT_JSON ? stderr : stdout;
	char ws[PB_PLAN_MAX_LAYERS * 8];
	widths_str(w, L, ws, sizeof ws);
	fprintf(human,
		"pipebench: training with the planner: an MLP %s (random weights, seed %llu), %u %s a "
		"step, on %u %s\n",
		ws, (unsigned long long)cfg->seed, cfg->batch, PLURAL(cfg->batch, "row", "rows"), ncpus,
		PLURAL(ncpus, "CPU", "CPUs"));
	fflush(human);
	/* the profile is a measurement: wait for quiet before it, as every run does before its first */
	pb_noise nz;
	pb_noise_init(&nz, cfg->cpus, ncpus);
	pb_noise_settle(&nz, cfg->wait_quiet_s);
	double load_start = pb_loadavg();
	rc = mt_auto_plan(n, cfg->batch, cfg->memory, 0, ncpus, &a);
	if (rc == -ENOSPC) {
		mt_auto_refusal(&a, err, sizeof err);
		fprintf(stderr, "pipebench: %s\n", err); /* one line, exit 2: no " (try --help)" */
		mbp_mlp_destroy(n);
		return PB_EXIT_USAGE;
	}
	if (rc < 0) {
		mbp_mlp_destroy(n);
		return pb_failure("cannot plan the run: %s", mbp_strerror(rc));
	}
	mt_auto_print(human, &a);
	int status = PB_EXIT_OK;
	struct measured m;
	if (!cfg->plan_only) {
		pb_progress_init(cfg->progress);
		if (run_plan(cfg, n, w, L, &a, &nz, &m, err, sizeof err)) {
			mbp_mlp_destroy(n);
			return pb_failure("FAILED: %s", err);
		}
		print_measured(human, &a, &m);
		if (a.budget != UINT64_MAX && mt_auto_peak(&a, m.act_peak_bytes) > a.budget)
			status = PB_EXIT_FAIL;
	}
	pb_print_noise(human, &nz, load_start,
		       !cfg->plan_only && m.loud ? "the measured step is marked 'loud': more than a tenth of "
						   "its steps ran there, its figures are less certain"
						 : NULL);
	if (cfg->format == PB_FMT_JSON && print_json(cfg, w, L, ncpus, &a, &nz, cfg->plan_only ? NULL : &m)) {
		mbp_mlp_destroy(n);
		return pb_failure("out of memory for the JSON document");
	}
	fflush(stdout);
	mbp_mlp_destroy(n);
	if (status)
		pb_failure("FAILED: the measured peak memory %.2f MiB is above the --memory budget %.2f MiB",
			   mib(mt_auto_peak(&a, m.act_peak_bytes)), mib(a.budget));
	return status;
}

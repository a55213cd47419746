/*
 * pipebench training workload (--workload=train): one synthetic training step under each schedule of
 * --schedule (GPipe, 1F1B and ZB-H1 unless it says), the schedules as arms of one interleaved measurement.
 * A chunked schedule (interleaved, looped BFS, ZB-V, DualPipeV) splits each of the S stages into v chunks
 * of 1/v its costs on S threads, so every arm does the same work on the same threads.
 *
 * Every stage's forward (F), input-gradient backward (B_in) and weight-gradient backward (B_w) burns a
 * calibrated number of multiply-adds (burn(), the synthetic workload's busy work): --costs F:BIN:BW in
 * units of --unit-us. The stages give B_in and B_w separately, so ZB-H1 can move B_w into the gaps; GPipe
 * and 1F1B run them back to back as one backward (the trainer's rule), so every schedule does the same
 * work. A step is M micro-batches of one row; a micro-batch j enters as the value j, every forward adds 1,
 * and the loss is the last output minus S (j again): the step's summed loss must be M (M - 1) / 2.
 *
 * An arm is one started trainer (its threads pinned as the trainer pins them, to the first allowed CPUs:
 * --cpus narrows the process's CPUs first); a visit runs `warm` unmeasured steps and `units` measured
 * ones. After every measured step the arm checks what the engine promises: each stage ran M forwards, M
 * backwards (and M weight gradients under ZB-H1), its stash and held high-water marks are the schedule's
 * figures, the loss is right. A broken one stops the run with exit status 1. It keeps each measured step's
 * time, measured and predicted bubble and time inside the operations, and the operations of the fastest
 * step (mbp_trainer_events_get) for the Gantt chart, as the forward chart shows the fastest batch.
 *
 * PIPEBENCH_FAULT=wrong|fail breaks the last stage's forward of the last micro-batch (a wrong value, or an
 * error), so the tests can prove that a broken step ends the run with exit status 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipebench.h"
#include "util/burn.h"
#include "util/plural.h"

#define PB_TRAIN_VISIT_S  0.05 /* measured time per visit to a schedule */
#define PB_PROFILE_RUNS	  5    /* auto's profile: the fastest of this many runs of each operation */
#define PB_DEF_MAX_STAGES 4

static const mbp_sched_kind default_kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};

/* Chunks per thread of a schedule: 1 for the block ones (whole stages), 2 for the V ones, --chunks for
 * interleaved and looped BFS. */
static unsigned chunks_of(const pb_config *cfg, mbp_sched_kind k)
{
	if (k == MBP_SCHED_ZBV || k == MBP_SCHED_DUALPIPEV || k == MBP_SCHED_AUTO)
		return 2;
	if (k == MBP_SCHED_INTERLEAVED || k == MBP_SCHED_LOOPED_BFS)
		return cfg->chunks ? cfg->chunks : 2;
	return 1;
}

/* PIPEBENCH_FAULT (tests only): the last stage's forward of the last micro-batch adds 2 (wrong) or fails
 * (fail). */
enum tr_fault { TR_FAULT_NONE, TR_FAULT_WRONG, TR_FAULT_FAIL };

struct tr_stage {
	uint64_t iters[3]; /* F, B_in, B_w */
	uint64_t sink;
	enum tr_fault fault; /* only the last stage's is set */
	uint32_t last_mb;
};

struct tr_arm {
	const pb_config *cfg;
	unsigned S, M, ncpus;
	mbp_trainer *t;
	struct tr_stage st[MBP_MAX_STAGES];
	double *in, *targets; /* M rows of one double */
	unsigned visits;      /* the first (the interleave's warm-up round) is not kept */
	double *step_ms, *bubble, *pred, *work_ms;
	unsigned n, cap;
	double op_ns[MBP_MAX_STAGES][3];
	uint64_t op_count[MBP_MAX_STAGES][3];
	mbp_train_event *ev, *scratch;
	size_t ev_cap;
	pb_train_result *r;
};

static int tr_f(void *ctx, const mbp_train_io *io)
{
	struct tr_stage *st = ctx;
	st->sink = burn(st->iters[0], st->sink);
	bool broken = st->fault && io->mb == st->last_mb;
	if (broken && st->fault == TR_FAULT_FAIL)
		return -EIO;
	*(double *)io->out = *(const double *)io->in + (broken ? 2 : 1);
	return 0;
}

static int tr_bin(void *ctx, const mbp_train_io *io)
{
	struct tr_stage *st = ctx;
	st->sink = burn(st->iters[1], st->sink);
	if (io->din)
		*(double *)io->din = *(const double *)io->dout;
	return 0;
}

static int tr_bw(void *ctx, const mbp_train_io *io)
{
	struct tr_stage *st = ctx;
	(void)io;
	st->sink = burn(st->iters[2], st->sink);
	return 0;
}

static int tr_update(void *ctx, const mbp_train_update *u)
{
	(void)ctx;
	(void)u;
	return 0;
}

static void tr_discard(void *ctx)
{
	(void)ctx;
}

static int tr_loss(void *arg, const mbp_train_io *io, double *loss)
{
	const unsigned *S = arg;
	*loss = *(const double *)io->out - *S;
	*(double *)io->dout = 1;
	return 0;
}

static int arm_fail(struct tr_arm *a, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int arm_fail(struct tr_arm *a, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	if (a->r->status == 0) {
		a->r->status = -1;
		snprintf(a->r->error, sizeof(a->r->error), "%s", err);
	}
	return -1;
}

/* auto's short profile, as pipetrain's of its layers: each chunk's F, B_in and B_w (its stage
 * functions, called on this thread outside any trainer) timed alone, the fastest of PB_PROFILE_RUNS after
 * a warm-up, into c (ns) and r->profile_us. Before the trainer starts (its threads would share the CPU)
 * and before the fault is armed. */
static void profile_chunks(struct tr_arm *a, mbp_op_costs *c)
{
	static const mbp_train_op_fn op[3] = {tr_f, tr_bin, tr_bw};
	for (unsigned s = 0; s < a->S; s++) {
		double in = 0, out = 0, dout = 1, din = 0, ns[3];
		mbp_train_io io = {
		    .rows = 1, .step_rows = a->M, .in = &in, .out = &out, .dout = &dout, .din = &din};
		for (int k = 0; k < 3; k++) {
			uint64_t best = UINT64_MAX;
			for (int i = 0; i <= PB_PROFILE_RUNS; i++) {
				uint64_t t0 = mbt_now_ns();
				op[k](&a->st[s], &io);
				uint64_t dt = mbt_now_ns() - t0;
				best = i && dt < best ? dt : best; /* run 0: the warm-up */
			}
			ns[k] = (double)best;
			a->r->profile_us[s][k] = ns[k] / 1e3;
		}
		c[s] = (mbp_op_costs){ns[0], ns[1], ns[2]};
	}
}

/* The schedule arm a follows, into r->sched: a fixed one, the one built from a short profile of its
 * chunks' operations (auto: at most what 1f1b holds per thread, 2 x stages chunks), or the file's
 * (custom). 0, or -1 with err. */
static int arm_schedule(struct tr_arm *a, const pb_config *cfg, char *err, size_t errlen)
{
	pb_train_result *r = a->r;
	int rc;
	if (r->kind == MBP_SCHED_CUSTOM) {
		rc = mbp_schedule_copy(&r->sched, cfg->custom);
	} else if (r->kind == MBP_SCHED_AUTO) {
		mbp_op_costs c[MBP_MAX_STAGES];
		profile_chunks(a, c);
		mbp_sched_build b = {.stages = a->S,
				     .mbs = a->M,
				     .threads = cfg->stages,
				     .costs = c,
				     .held_limit = 2 * cfg->stages,
				     .split = true};
		rc = mbp_schedule_build(&r->sched, &b);
	} else {
		rc = mbp_schedule_new_placed(&r->sched, r->kind, a->S, a->M, r->chunks > 1 ? cfg->stages : 0);
	}
	if (rc < 0)
		return arm_fail(a, err, errlen, "%s: no schedule: %s",
				r->kind == MBP_SCHED_CUSTOM ? cfg->schedule_file : mbp_sched_name(r->kind),
				mbp_strerror(rc));
	if (mbp_schedule_mbs(r->sched) != a->M)
		return arm_fail(a, err, errlen, "--schedule-file %s: %u micro-batches, --micro-batches %u",
				cfg->schedule_file, mbp_schedule_mbs(r->sched), a->M);
	return 0;
}

static int arm_open(struct tr_arm *a, const pb_config *cfg, unsigned ncpus, double iters_per_us,
		    mbp_sched_kind kind, pb_train_result *r)
{
	char err[PB_ERR_MAX];
	memset(a, 0, sizeof(*a));
	a->cfg = cfg;
	unsigned v = chunks_of(cfg, kind);
	a->S = cfg->stages * v; /* each stage split into v chunks, on as many threads as stages */
	double share = v;	/* each chunk's share of a stage's costs: 1 / share */
	if (kind == MBP_SCHED_CUSTOM) {
		a->S = cfg->custom_stages;
		share = (double)a->S / cfg->stages;
		v = a->S / cfg->stages ? a->S / cfg->stages : 1;
	}
	a->M = cfg->mbs;
	a->ncpus = ncpus;
	a->r = r;
	r->kind = kind;
	r->stages = a->S;
	r->chunks = v;
	if (a->S > MBP_MAX_STAGES)
		return arm_fail(a, err, sizeof(err), "%s: %u chunks: more than %u", mbp_sched_name(kind),
				a->S, MBP_MAX_STAGES);
	for (unsigned s = 0; s < a->S; s++)
		for (int k = 0; k < 3; k++)
			a->st[s].iters[k] = (uint64_t)(cfg->costs[k] * cfg->unit_us * iters_per_us / share);
	if (arm_schedule(a, cfg, err, sizeof(err)))
		return -1;
	bool custom = kind == MBP_SCHED_CUSTOM || kind == MBP_SCHED_AUTO;
	a->ev_cap = (size_t)a->S * a->M * 3;
	a->in = calloc(a->M, sizeof(double));
	a->targets = calloc(a->M, sizeof(double));
	a->ev = calloc(a->ev_cap, sizeof(*a->ev));
	a->scratch = calloc(a->ev_cap, sizeof(*a->scratch));
	if (!a->in || !a->targets || !a->ev || !a->scratch)
		return arm_fail(a, err, sizeof(err), "out of memory");
	for (unsigned j = 0; j < a->M; j++)
		a->in[j] = j;
	mbp_train_opts o = {.in_row_bytes = sizeof(double),
			    .target_row_bytes = sizeof(double),
			    .max_mb_rows = 1,
			    .max_mbs = a->M,
			    .schedule = kind,
			    .custom = custom ? r->sched : NULL,
			    .threads = v > 1 || custom ? cfg->stages : 0,
			    .pinning = MBP_PIN_PLAN,
			    .spin_ns = pb_spin_ns(cfg, 0), /* 0: the trainer's default */
			    .trace_events = a->M * 3,
			    .loss = tr_loss,
			    .loss_arg = &a->S};
	const char *fault = getenv("PIPEBENCH_FAULT");
	int rc = mbp_trainer_new(&a->t, &o);
	for (unsigned s = 0; rc == 0 && s < a->S; s++) {
		a->st[s].sink = s + 1;
		a->st[s].last_mb = a->M - 1;
		if (s == a->S - 1 && fault)
			a->st[s].fault = !strcmp(fault, "wrong")  ? TR_FAULT_WRONG
					 : !strcmp(fault, "fail") ? TR_FAULT_FAIL
								  : TR_FAULT_NONE;
		mbp_train_stage_desc d = {.ctx = &a->st[s],
					  .out_row_bytes = sizeof(double),
					  .forward = tr_f,
					  .backward_in = tr_bin,
					  .backward_w = tr_bw,
					  .update = tr_update,
					  .discard = tr_discard};
		rc = mbp_trainer_add_stage(a->t, &d);
	}
	if (rc == 0)
		rc = mbp_trainer_start(a->t);
	if (rc)
		return arm_fail(a, err, sizeof(err), "%s: cannot start the trainer: %s", mbp_sched_name(kind),
				mbp_strerror(rc));
	return 0;
}

static void arm_close(struct tr_arm *a)
{
	mbp_trainer_destroy(a->t);
	free(a->in);
	free(a->targets);
	free(a->scratch);
	free(a->step_ms);
	free(a->bubble);
	free(a->pred);
	free(a->work_ms);
	a->r->ev = a->ev; /* the report owns it now */
}

static int grow(struct tr_arm *a)
{
	if (a->n < a->cap)
		return 0;
	unsigned cap = a->cap ? a->cap * 2 : 64;
	double **v[] = {&a->step_ms, &a->bubble, &a->pred, &a->work_ms};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		double *p = realloc(*v[i], cap * sizeof(double));
		if (!p)
			return -1;
		*v[i] = p;
	}
	a->cap = cap;
	return 0;
}

/* One step; `keep`: a measured one, whose figures are checked and kept. */
static int one_step(struct tr_arm *a, bool keep, char *err, size_t errlen)
{
	double loss = 0;
	int rc = mbp_trainer_step(a->t, a->in, a->targets, a->M, 1, &loss);
	if (rc) {
		mbp_train_error e;
		mbp_trainer_error(a->t, &e);
		return arm_fail(a, err, errlen, "step failed at stage %d, micro-batch %d: %s", e.stage, e.mb,
				mbp_strerror(rc));
	}
	double want = (double)a->M * (a->M - 1) / 2;
	if (loss != want)
		return arm_fail(a, err, errlen, "the step's loss is %g, not %g: a micro-batch went wrong",
				loss, want);
	if (!keep)
		return 0;
	mbp_train_stats st;
	mbp_train_stage_stats ss[MBP_MAX_STAGES];
	mbp_trainer_stats_get(a->t, &st, ss, a->S);
	const mbp_schedule *sc = mbp_trainer_schedule(a->t);
	double busy = 0;
	for (unsigned s = 0; s < a->S; s++) {
		const mbp_train_stage_stats *x = &ss[s];
		uint32_t back = x->b_count + x->bin_count;
		/* a zero-bubble schedule's B_in has its W apart (DualPipeV gives some micro-batches a B) */
		if (x->f_count != a->M || back != a->M || x->w_count != x->bin_count)
			return arm_fail(a, err, errlen,
					"stage %u ran %u forwards, %u backwards and %u weight gradients in a "
					"step of %u micro-batches",
					s, x->f_count, back, x->w_count, a->M);
		uint32_t se = mbp_schedule_stash_peak(sc, s), he = mbp_schedule_held_peak(sc, s);
		if (x->stash_peak != se || x->held_peak != he)
			return arm_fail(a, err, errlen,
					"stage %u held a stash of %u and %u micro-batches, the schedule says "
					"%u and %u",
					s, x->stash_peak, x->held_peak, se, he);
		a->r->stash_peak[s] = x->stash_peak;
		a->r->stash_expected[s] = se;
		a->r->held_peak[s] = x->held_peak;
		a->r->held_expected[s] = he;
		double ns[3] = {(double)x->f_ns, (double)(x->b_ns + x->bin_ns), (double)x->w_ns};
		uint32_t cnt[3] = {x->f_count, back, x->w_count};
		for (int k = 0; k < 3; k++) {
			a->op_ns[s][k] += ns[k];
			a->op_count[s][k] += cnt[k];
			busy += ns[k];
		}
	}
	if (grow(a))
		return arm_fail(a, err, errlen, "out of memory");
	a->step_ms[a->n] = (double)st.step_ns / 1e6;
	a->bubble[a->n] = st.bubble;
	a->pred[a->n] = st.bubble_predicted;
	a->work_ms[a->n] = busy / 1e6;
	a->n++;
	a->r->threads = st.threads;
	char why[PB_ERR_MAX] = "";
	if (mt_thread_figs_get(&a->r->thr, sc, st.threads, ss, a->S, why, sizeof why) < 0)
		return arm_fail(a, err, errlen, "%s", why[0] ? why : "the schedule has no such threads");
	if (a->r->nev == 0 || st.step_ns < a->r->ev_step_ns) {
		int n = mbp_trainer_events_get(a->t, a->scratch, a->ev_cap);
		if (n < 0 || (size_t)n > a->ev_cap)
			return arm_fail(a, err, errlen, "the step's operations: %s",
					n < 0 ? mbp_strerror(n) : "more than the step has");
		mbp_train_event *tmp = a->ev;
		a->ev = a->scratch;
		a->scratch = tmp;
		a->r->ev = a->ev;
		a->r->nev = (size_t)n;
		a->r->ev_step_ns = st.step_ns;
	}
	return 0;
}

static int tr_visit(void *ctx, unsigned warm, unsigned units, double *rate, char *err, size_t errlen)
{
	struct tr_arm *a = ctx;
	bool keep = a->visits++ > 0;
	for (unsigned i = 0; i < warm; i++)
		if (one_step(a, false, err, errlen))
			return -1;
	uint64_t t0 = mbt_now_ns();
	for (unsigned i = 0; i < units; i++)
		if (one_step(a, keep, err, errlen))
			return -1;
	double s = (double)(mbt_now_ns() - t0) / 1e9;
	*rate = s > 0 ? units / s : 0;
	return 0;
}

static double median(double *v, unsigned n)
{
	return pb_percentile(v, n, 0.5);
}

/* Fill a's result from its kept steps and its arm's samples. */
static void summarise(struct tr_arm *a, const pb_arm *arm)
{
	pb_train_result *r = a->r;
	r->steps = a->n;
	r->repeats = arm->n;
	r->rate = arm->iv;
	r->rate_v = arm->rate;
	r->mbs_per_s = arm->iv.median * a->M;
	unsigned loud = 0;
	for (unsigned i = 0; i < arm->n; i++)
		loud += arm->loud[i];
	r->loud_share = arm->n ? (double)loud / arm->n : 0;
	r->loud = r->loud_share > PB_LOUD_SHARE;
	if (a->n == 0)
		return;
	pb_interval_of(a->step_ms, a->n, &r->step_ms);
	pb_interval_of(a->bubble, a->n, &r->bubble);
	r->bubble_predicted = median(a->pred, a->n);
	r->work_ms = median(a->work_ms, a->n);
	double cores = r->threads < a->ncpus ? r->threads : a->ncpus;
	r->ideal_ms = cores > 0 ? r->work_ms / cores : 0;
	r->efficiency = r->step_ms.median > 0 ? r->ideal_ms / r->step_ms.median : 0;
	r->eff_of_predicted = r->bubble_predicted < 1 ? r->efficiency / (1 - r->bubble_predicted) : 0;
	for (unsigned s = 0; s < a->S; s++)
		for (int k = 0; k < 3; k++)
			r->op_us[s][k] = a->op_count[s][k] ? a->op_ns[s][k] / a->op_count[s][k] / 1e3 : 0;
}

int pb_narrow_cpus(const pb_config *cfg, unsigned ncpus, char *err, size_t errlen)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	for (unsigned i = 0; i < ncpus; i++)
		CPU_SET(cfg->cpus[i], &set);
	if (sched_setaffinity(0, sizeof(set), &set)) {
		snprintf(err, errlen, "--cpus: cannot run on them: %s", strerror(errno));
		return -1;
	}
	return 0;
}

int pb_train_main(pb_config *cfg, unsigned ncpus, unsigned allowed)
{
	static pb_train_report rep; /* large; one per run */
	static struct tr_arm arms[PB_TRAIN_SCHEDS];
	pb_arm parm[PB_TRAIN_SCHEDS];
	char err[PB_ERR_MAX];

	if (cfg->schedule_file) { /* its lines are the threads, its micro-batches the step's */
		mbp_schedule *f;
		mbp_sched_text_error te;
		int rc = mbp_schedule_load_csv(&f, cfg->schedule_file, 0, &te);
		if (rc == -EINVAL || rc == -E2BIG)
			return pb_usage("--schedule-file %s: line %u%s%s: %s", cfg->schedule_file, te.line,
					te.action[0] ? ", action " : "", te.action, te.what);
		if (rc < 0)
			return pb_usage("--schedule-file %s: %s", cfg->schedule_file, mbp_strerror(rc));
		unsigned fT = mbp_schedule_threads(f), fM = mbp_schedule_mbs(f);
		cfg->custom_stages = mbp_schedule_stages(f);
		if ((cfg->stages && cfg->stages != fT) || (cfg->mbs && cfg->mbs != fM)) {
			mbp_schedule_destroy(f);
			return cfg->stages && cfg->stages != fT
				   ? pb_usage("--schedule-file %s: %u lines (threads), --stages %u",
					      cfg->schedule_file, fT, cfg->stages)
				   : pb_usage("--schedule-file %s: %u micro-batches, --micro-batches %u",
					      cfg->schedule_file, fM, cfg->mbs);
		}
		cfg->custom = f; /* the run's, until it ends */
		cfg->stages = fT;
		cfg->mbs = fM;
	}
	if (cfg->stages == 0)
		cfg->stages = ncpus < PB_DEF_MAX_STAGES ? ncpus : PB_DEF_MAX_STAGES;
	if (cfg->mbs == 0)
		cfg->mbs = 4 * cfg->stages;
	if (cfg->nscheds == 0) {
		memcpy(cfg->scheds, default_kinds, sizeof(default_kinds));
		cfg->nscheds = sizeof(default_kinds) / sizeof(default_kinds[0]);
	}
	if (cfg->schedule_file && cfg->nscheds < PB_TRAIN_SCHEDS)
		cfg->scheds[cfg->nscheds++] = MBP_SCHED_CUSTOM;
	const unsigned n = cfg->nscheds;
	memset(&rep, 0, sizeof(rep));
	memset(parm, 0, sizeof(parm));
	rep.cfg = cfg;
	rep.allowed = allowed;
	rep.ncpus = ncpus;
	rep.load_end = -1;
	rep.n = n;
	if (pb_narrow_cpus(cfg, ncpus, err, sizeof(err)))
		return pb_failure("%s", err);
	pb_progress_init(cfg->progress);
	rep.iters_per_us = burn_calibrate();
	snprintf(rep.desc, sizeof(rep.desc),
		 "training, %u %s x %u %s of 1 row, costs F:B_in:B_w = %g:%g:%g x %g us of busy work",
		 cfg->stages, PLURAL(cfg->stages, "stage", "stages"), cfg->mbs,
		 PLURAL(cfg->mbs, "micro-batch", "micro-batches"), cfg->costs[0], cfg->costs[1],
		 cfg->costs[2], cfg->unit_us);
	pb_noise_init(&rep.noise, cfg->cpus, ncpus);
	/* before the arms open: auto's profile (arm_schedule) is a measurement too */
	pb_noise_settle(&rep.noise, cfg->wait_quiet_s);

	unsigned opened = 0;
	for (; opened < n; opened++) {
		struct tr_arm *a = &arms[opened];
		pb_progress(opened, n, "preparing");
		if (arm_open(a, cfg, ncpus, rep.iters_per_us, cfg->scheds[opened], &rep.r[opened])) {
			opened++;
			rep.status = PB_EXIT_FAIL;
			snprintf(rep.error, sizeof(rep.error), "%s", rep.r[opened - 1].error);
			goto close;
		}
		parm[opened] =
		    (pb_arm){.label = mbp_sched_name(cfg->scheds[opened]), .ctx = a, .visit = tr_visit};
	}
	rep.load_start = pb_loadavg();
	pb_schedule sch = {.min_repeats = cfg->batches,
			   .tolerance = cfg->tolerance,
			   .budget_s = cfg->duration_s,
			   .warmup = cfg->warmup,
			   .visit_s = PB_TRAIN_VISIT_S,
			   .pause_s = cfg->wait_quiet_s - rep.noise.waited_s};
	if (pb_interleave(parm, n, &sch, &rep.noise, err, sizeof(err))) {
		rep.status = PB_EXIT_FAIL;
		snprintf(rep.error, sizeof(rep.error), "%s", err);
	}
	for (unsigned i = 0; i < n; i++)
		summarise(&arms[i], &parm[i]);
	int one = -1, zb = -1; /* 1f1b's and zbh1's arms, where measured */
	for (unsigned i = 0; i < n; i++) {
		one = cfg->scheds[i] == MBP_SCHED_1F1B ? (int)i : one;
		zb = cfg->scheds[i] == MBP_SCHED_ZBH1 ? (int)i : zb;
	}
	if (one >= 0 && zb >= 0 && parm[one].n && parm[one].n == parm[zb].n &&
	    pb_ratio_interval(parm[zb].rate, parm[one].rate, parm[one].n, &rep.zb_vs_1f1b))
		memset(&rep.zb_vs_1f1b, 0, sizeof(rep.zb_vs_1f1b));
close:
	for (unsigned i = 0; i < opened; i++)
		arm_close(&arms[i]);
	pb_progress_end();
	rep.load_end = pb_loadavg();
	/* the picture first: its failure is the run's, in the report too */
	if (cfg->svg_path && rep.status == 0 && pb_train_gantt_svg(cfg->svg_path, &rep, err, sizeof(err))) {
		rep.status = PB_EXIT_FAIL;
		snprintf(rep.error, sizeof(rep.error), "%s", err);
	}
	switch (cfg->format) {
	case PB_FMT_JSON:
		if (pb_train_print_json(stdout, &rep) && rep.status == 0) {
			rep.status = PB_EXIT_FAIL;
			snprintf(rep.error, sizeof(rep.error), "out of memory for the JSON document");
		}
		break;
	case PB_FMT_CSV:
		pb_train_print_csv(stdout, &rep);
		break;
	case PB_FMT_TABLE:
		pb_train_print_table(stdout, &rep, pb_terminal_width());
		break;
	}
	fflush(stdout);
	if (rep.status)
		pb_failure("FAILED: %s", rep.error);
	mbp_schedule_destroy(cfg->custom);
	cfg->custom = NULL;
	for (unsigned i = 0; i < n; i++) {
		free(rep.r[i].ev);
		mbp_schedule_destroy(rep.r[i].sched);
		pb_arm_fini(&parm[i]);
	}
	return rep.status ? PB_EXIT_FAIL : PB_EXIT_OK;
}

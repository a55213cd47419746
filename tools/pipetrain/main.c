/*
 * pipetrain: train an MLP classifier on Fashion-MNIST through the engine's pipeline-parallel trainer.
 *
 * The run: load the data (training set split into training and held-out validation rows from the seed,
 * the test set), build or load the model, partition its layers into stages by their measured costs
 * (pt_plan_make: one profile, the split refined by the schedule the run follows; --schedule auto: the
 * schedule built from it), give each stage to the trainer, then per epoch: a seeded order of the training
 * rows (mbp_data_epoch_order, a function of seed and epoch only), one trainer step per mini-batch (the
 * last partial batch of an epoch is dropped; --log gets a row per step), then the validation and test
 * accuracy, one line, one CSV row, a checkpoint. At the end, --plot draws the run's curves.
 *
 * Resume: a checkpoint is the weights file plus the optimizer state beside it, which holds the number of
 * updates done. Started with --model on such a pair and the same data, seed, batch and epochs, the run
 * continues at the step where it stopped, in the same order, with the same learning rate: the weights at
 * the end are bit for bit those of an uninterrupted run. A state saved with other weights (a crash between
 * the two files) is refused by mbp_mlp_load_optim: exit 2. Another schedule (other epochs, lr, warm-up)
 * is allowed, announced in one line: training continues from the checkpoint's step under the new one.
 * Weights without an optimizer state beside them start a new run from those weights, announced in one
 * line too: the optimizer starts fresh.
 *
 * Failures: a non-finite loss or gradient fails its step (the trainer updates nothing); the run stops,
 * naming the step, the stage and the micro-batch, and the last checkpoint on disk (written atomically by
 * mbp_mlp_save, a temporary file renamed into place) stays as it was: exit 1. SIGINT or SIGTERM: the
 * handler only sets a flag; the step under way finishes, a checkpoint is written, exit 130 (143 for
 * SIGTERM). A second SIGINT kills at once (SA_RESETHAND). The trainer's threads start with both signals
 * blocked, so only the main thread takes them.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pipetrain.h"
#include "util/blas.h"
#include "util/clock.h"
#include "util/digest.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
	stop_signal = sig;
}

static int say(int status, const char *fmt, va_list ap)
{
	fprintf(stderr, "pipetrain: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	return status;
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One line on stderr, exit status 2: bad input (arguments, files that cannot be read or are invalid). */
static int bad(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int status = say(2, fmt, ap);
	va_end(ap);
	return status;
}

/* One line on stderr, exit status 1: a failure at run time (memory, threads), not the input's fault. */
static int fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int status = say(1, fmt, ap);
	va_end(ap);
	return status;
}

/* A chunked schedule that cannot place S stages on the threads asked for (exit 2). */
static int bad_placement(const pt_config *c, unsigned S)
{
	return bad("--schedule %s: cannot place %u stages on %s%u threads (interleaved and looped-bfs: "
		   "the stages a multiple of the threads; zbv and dualpipev: twice them; dualpipev: at "
		   "least as many micro-batches as stages)",
		   mbp_sched_name(c->schedule), S, c->threads ? "" : "the default ",
		   c->threads ? c->threads : S / 2);
}

/* Accuracy and mean loss of the model over rows of x (rows x width) with labels y; preds optional. */
static int evaluate(mbp_mlp *n, const float *x, const int32_t *y, uint32_t rows, uint32_t classes,
		    float *logits, int32_t *preds, double *acc, double *loss)
{
	int rc = mbp_mlp_forward(n, x, logits, rows, 256);
	if (rc < 0)
		return rc;
	for (uint32_t r = 0; preds && r < rows; r++) {
		const float *l = logits + (size_t)r * classes;
		uint32_t best = 0;
		for (uint32_t k = 1; k < classes; k++)
			if (l[k] > l[best])
				best = k;
		preds[r] = (int32_t)best;
	}
	double sum;
	uint32_t correct;
	rc = mbp_loss_xent(logits, y, rows, classes, rows, logits, &sum, &correct);
	if (rc == -EDOM) { /* a non-finite logit: report it as such, accuracy from the argmax */
		*loss = NAN;
		*acc = NAN;
		return 0;
	}
	*acc = (double)correct / rows;
	*loss = sum / rows;
	return rc;
}

static int save_checkpoint(mbp_mlp *n, const char *save)
{
	char opath[4096];
	pt_optim_path(save, opath, sizeof opath);
	/* Each file is replaced atomically, the pair is not: a crash between the two leaves a new state next to
	 * older weights. The state records a hash of the weights it was saved with, so mbp_mlp_load_optim
	 * refuses such a pair (exit 2) rather than resume the later step with the earlier weights. */
	int rc = mbp_mlp_save_optim(n, opath);
	if (rc < 0) {
		fprintf(stderr, "pipetrain: cannot write %s: %s\n", opath, mbp_strerror(rc));
		return rc;
	}
	rc = mbp_mlp_save(n, save);
	if (rc < 0)
		fprintf(stderr, "pipetrain: cannot write %s: %s\n", save, mbp_strerror(rc));
	return rc;
}

static int write_predictions(const char *path, const int32_t *p, uint32_t rows)
{
	mbp_file *f;
	int rc = mbp_file_new(&f, path);
	for (uint32_t r = 0; rc == 0 && r < rows; r++)
		fprintf(mbp_file_stream(f), "%d\n", p[r]);
	if (rc == 0)
		rc = mbp_file_commit(f);
	if (rc < 0)
		fprintf(stderr, "pipetrain: --predictions %s: cannot write it: %s\n", path,
			rc == -EEXIST ? "not a regular file" : strerror(-rc));
	return rc;
}

struct run {
	pt_config *c;
	mbp_dataset train, test;
	uint32_t *tr, *va, *order;
	uint32_t ntr, nva;
	float *xb, *xval, *xtest, *logits;
	int32_t *yb, *yval, *ytest, *preds;
	mbp_mlp *n;
	pt_shared sh;
	pt_stage stage[MBP_MAX_STAGES];
	pt_stage *replica[MBP_MAX_STAGES]; /* --replicas: stage s's replicas 1 .. r - 1 */
	mbp_trainer *t;
	pt_report rep;
	pt_auto ap; /* --plan auto */
	FILE *csv, *log;
};

#define PT_PLAN_ONLY (-1) /* setup's status: --plan-only printed the plan, exit 0 */

/* --plan auto: profile, plan, print; then the run's options are the plan's. @return 0, PT_PLAN_ONLY, or
 * the exit status. */
static int auto_plan(struct run *r, unsigned ncpu)
{
	pt_config *c = r->c;
	int rc = pt_auto_plan(r->n, c, ncpu, &r->ap);
	if (rc == -ENOSPC)
		return bad("--memory %.2f MiB: no plan fits (activations and parameter state); the smallest "
			   "budget that fits is %llu MiB",
			   (double)r->ap.budget / (1 << 20),
			   (unsigned long long)((r->ap.need + (1u << 20) - 1) >> 20));
	if (rc < 0)
		return fail("cannot plan the run: %s", mbp_strerror(rc));
	const mbp_train_plan *p = &r->ap.plan;
	if (!c->quiet || c->plan_only)
		pt_auto_print(pt_human(c), &r->ap);
	if (c->plan_only) {
		if (c->json) {
			cJSON *root = cJSON_CreateObject();
			cJSON_AddItemToObject(root, "plan", pt_auto_json(&r->ap));
			char *text = cJSON_Print(root);
			cJSON_Delete(root);
			if (!text)
				return fail("out of memory");
			printf("%s\n", text);
			cJSON_free(text);
		}
		return fflush(stdout) ? 1 : PT_PLAN_ONLY;
	}
	c->stages = p->stages;
	c->threads = p->threads;
	c->schedule = p->schedule;
	c->mb = p->mb;
	c->hand_over = PT_HAND_OVER_OFF;
	c->nsplit = p->stages - 1;
	c->recompute = 0;
	for (unsigned s = 0; s < p->stages; s++) {
		if (s)
			c->split[s - 1] = p->first[s];
		for (unsigned l = p->first[s]; l < p->first[s + 1] && (p->recompute >> s & 1); l++)
			c->recompute |= 1ull << l;
	}
	return 0;
}

static void run_free(struct run *r)
{
	mbp_trainer_destroy(r->t);
	for (unsigned s = 0; s < MBP_MAX_STAGES; s++) {
		mbp_mlp_stage_destroy(r->stage[s].st);
		for (unsigned k = 1; r->replica[s] && k < r->c->replicas[s]; k++)
			mbp_mlp_stage_destroy(r->replica[s][k - 1].st);
		free(r->replica[s]);
	}
	mbp_mlp_destroy(r->n);
	mbp_dataset_free(&r->train);
	mbp_dataset_free(&r->test);
	free(r->tr);
	free(r->va);
	free(r->order);
	free(r->xb);
	free(r->xval);
	free(r->xtest);
	free(r->logits);
	free(r->yb);
	free(r->yval);
	free(r->ytest);
	free(r->preds);
	free(r->rep.ep);
	free(r->rep.step_loss);
	if (r->csv && r->csv != stdout)
		fclose(r->csv);
	if (r->log && r->log != stdout)
		fclose(r->log);
}

/* Data, model, stages, trainer. @return 0, or the exit status. */
static int setup(struct run *r)
{
	pt_config *c = r->c;
	mbp_data_error de;
	if (c->model && access(c->model, R_OK) != 0)
		return bad("--model %s: %s", c->model, strerror(errno));
	/* Every file the run writes, before the run: each absent or a regular file, in a folder that takes a
	 * new one (they are written by rename, mbp_file). */
	char save_optim[4096];
	if (c->save)
		pt_optim_path(c->save, save_optim, sizeof save_optim);
	const struct {
		const char *opt, *path;
	} outs[] = {{"--save", c->save},
		    {"--save", c->save ? save_optim : NULL},
		    {"--trace", c->trace},
		    {"--predictions", c->predictions},
		    {"--csv", c->csv && strcmp(c->csv, "-") ? c->csv : NULL},
		    {"--log", c->log && strcmp(c->log, "-") ? c->log : NULL},
		    {"--plot", c->plot}};
	for (unsigned i = 0; i < sizeof outs / sizeof outs[0]; i++) {
		char why[512];
		if (outs[i].path && mbp_file_check(outs[i].path, why, sizeof why) < 0)
			return bad("%s %s: %s", outs[i].opt, outs[i].path, why);
	}
	if (mbp_fashion_mnist_load(&r->train, c->data, true, &de) < 0 ||
	    mbp_fashion_mnist_load(&r->test, c->data, false, &de) < 0)
		return bad("--data: %s", de.msg);
	uint32_t width = r->train.width, classes = r->train.classes;
	if (c->val >= r->train.n)
		return bad("--val %u: the training set has only %u rows", c->val, r->train.n);
	r->nva = c->val;
	r->ntr = r->train.n - r->nva;
	r->tr = malloc(r->ntr * sizeof(uint32_t));
	r->va = malloc((r->nva + 1) * sizeof(uint32_t));
	r->order = malloc(r->ntr * sizeof(uint32_t));
	if (!r->tr || !r->va || !r->order || mbp_data_split(r->train.n, r->nva, c->seed, r->tr, r->va) < 0)
		return fail("out of memory");
	if (c->limit) {
		if (c->limit > r->ntr)
			return bad("--limit %u: only %u training rows (after --val %u)", c->limit, r->ntr,
				   r->nva);
		/* A seeded subset: the first `limit` of a permutation that no epoch uses (epoch UINT64_MAX). */
		mbp_data_epoch_order(r->tr, r->ntr, c->seed, UINT64_MAX, r->order);
		memcpy(r->tr, r->order, (size_t)c->limit * sizeof(uint32_t));
		r->ntr = c->limit;
	}
	uint64_t spe = r->ntr / c->batch;
	if (spe == 0)
		return bad("--batch %u: more than the %u training rows", c->batch, r->ntr);
	uint64_t total = spe * c->epochs;

	mbp_optim_opts oo = {
	    .kind = c->optim,
	    .lr = (float)c->lr,
	    .min_lr = (float)c->min_lr,
	    .warmup_steps = c->warmup >= 0 ? (uint64_t)c->warmup : (total / 20 < 100 ? total / 20 : 100),
	    .total_steps = total,
	    .weight_decay = (float)c->weight_decay,
	    .momentum = c->optim == MBP_OPTIM_SGD ? (float)c->momentum : 0,
	};
	if (c->model) {
		/* --layers, when given, is checked against the file's header before its weights are read. */
		mbp_model_error me;
		mbp_model_load_opts lo = {.layers = c->layers, .widths = c->layers ? c->widths : NULL};
		mbp_model *m = NULL;
		int fd = open(c->model, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
		int rc = fd < 0 ? -errno : mbp_model_load_fd(&m, fd, c->model, &lo, &me);
		if (fd < 0)
			return bad("--model %s: %s", c->model, strerror(-rc));
		close(fd);
		char name[PATH_MAX + 16], note[PATH_MAX + 128];
		snprintf(name, sizeof name, "--model %s", c->model);
		if (rc == 0 && digest_note_line(m, name, note, sizeof note))
			fprintf(stderr, "pipetrain: note: %s\n", note);
		if (rc == 0)
			rc = mbp_mlp_new_from_model(&r->n, m, &oo);
		mbp_model_destroy(m);
		if (rc < 0)
			return (rc == -ENOMEM ? fail : bad)("--model: %s",
							    me.msg[0] ? me.msg : mbp_strerror(rc));
		unsigned L = mbp_mlp_layers(r->n);
		uint32_t w[PT_MAX_LAYERS + 1];
		for (unsigned i = 0; i < L && i < PT_MAX_LAYERS; i++) {
			mbp_layer_info li;
			mbp_mlp_layer_info(r->n, i, &li);
			w[i] = li.in;
			w[i + 1] = li.out;
		}
		if (L > PT_MAX_LAYERS)
			return bad("--model %s: %u layers, more than %d", c->model, L, PT_MAX_LAYERS);
		c->layers = L;
		memcpy(c->widths, w, (L + 1) * sizeof(uint32_t));
	} else if (!c->layers) {
		static const uint32_t def[] = {784, 512, 512, 10};
		memcpy(c->widths, def, sizeof def);
		c->layers = 3;
	}
	unsigned L = c->layers;
	if (c->widths[0] != width)
		return bad("--layers: the input width must be %u for this data (%ux%u images), not %u", width,
			   r->train.rows, r->train.cols, c->widths[0]);
	if (c->widths[L] != classes)
		return bad("--layers: the output width must be %u (the classes of this data), not %u",
			   classes, c->widths[L]);
	if (!r->n) {
		mbp_model_spec sp = {.layers = L, .widths = c->widths, .act = MBP_ACT_RELU, .seed = c->seed};
		int rc = mbp_mlp_new_random(&r->n, &sp, &oo);
		if (rc < 0)
			return (rc == -EINVAL ? bad : fail)("cannot build the model: %s", mbp_strerror(rc));
	}
	uint64_t start = 0;
	if (c->model) {
		char opath[4096];
		pt_optim_path(c->model, opath, sizeof opath);
		if (access(opath, F_OK) == 0) {
			mbp_model_error me;
			int rc = mbp_mlp_load_optim(r->n, opath, &me);
			if (rc < 0)
				return (rc == -ENOMEM ? fail : bad)("--model: %s",
								    me.msg[0] ? me.msg : mbp_strerror(rc));
			start = mbp_mlp_steps(r->n, 0);
			mbp_optim_opts was, now;
			rc = mbp_mlp_optim_read(opath, &was, &me);
			if (rc < 0)
				return (rc == -ENOMEM ? fail : bad)("--model: %s",
								    me.msg[0] ? me.msg : mbp_strerror(rc));
			mbp_mlp_optim(r->n, &now);
			if (was.total_steps != now.total_steps || was.warmup_steps != now.warmup_steps ||
			    was.lr != now.lr || was.min_lr != now.min_lr)
				fprintf(
				    stderr,
				    "pipetrain: note: a new learning-rate schedule from step %llu on (the "
				    "checkpoint's: %llu steps, warm-up %llu, lr %g to %g; this run's: %llu, "
				    "%llu, %g to %g), not the rates of an uninterrupted run\n",
				    (unsigned long long)start, (unsigned long long)was.total_steps,
				    (unsigned long long)was.warmup_steps, (double)was.lr, (double)was.min_lr,
				    (unsigned long long)now.total_steps, (unsigned long long)now.warmup_steps,
				    (double)now.lr, (double)now.min_lr);
		} else {
			fprintf(
			    stderr,
			    "pipetrain: note: no optimizer state beside --model %s (no %s): a new run from "
			    "its weights, the optimizer starts fresh (step 0, no moments, the learning-rate "
			    "schedule from its start)\n",
			    c->model, opath);
		}
	}

	/* Stages: balanced by each layer's measured costs (F, B_in, B_w at the micro-batch size), the split
	 * then improved by the schedule's predicted step; with --mb auto, at the size whose step is shortest. */
	cpu_set_t set;
	unsigned ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? (unsigned)CPU_COUNT(&set) : 1;
	if (c->nsplit && (c->nsplit + 1 > (c->stages ? c->stages : c->nsplit + 1) ||
			  c->nsplit + 1 < c->stages || c->split[c->nsplit - 1] >= L))
		return c->split[c->nsplit - 1] >= L
			   ? bad("--split: layer %u: the model has only %u layers (0 to %u)",
				 c->split[c->nsplit - 1], L, L - 1)
			   : bad("--split: %u stages, --stages says %u", c->nsplit + 1, c->stages);
	if (c->nsplit)
		c->stages = c->nsplit + 1;
	if (c->plan_auto) {
		int st = auto_plan(r, ncpu);
		if (st)
			return st;
	}
	mbp_schedule *probe = NULL; /* --schedule-file's schedule, here to check that it fits the run */
	if (c->schedule_file) {
		if (!c->mb)
			return bad("--mb auto: --schedule-file %s fixes the micro-batches", c->schedule_file);
		uint32_t fm = (c->batch + c->mb - 1) / c->mb;
		mbp_sched_text_error te;
		int lrc = mbp_schedule_load_csv(&probe, c->schedule_file, 0, &te);
		if (lrc == -EINVAL || lrc == -E2BIG)
			return bad("--schedule-file %s: line %u%s%s: %s", c->schedule_file, te.line,
				   te.action[0] ? ", action " : "", te.action, te.what);
		if (lrc < 0)
			return bad("--schedule-file %s: %s", c->schedule_file, mbp_strerror(lrc));
		if (!c->stages)
			c->stages = mbp_schedule_stages(probe);
		if (mbp_schedule_stages(probe) != c->stages || mbp_schedule_mbs(probe) != fm) {
			unsigned fs = mbp_schedule_stages(probe), pm = mbp_schedule_mbs(probe);
			mbp_schedule_destroy(probe);
			return bad(
			    "--schedule-file %s: %u stages and %u micro-batches, the run has %u and %u "
			    "(--stages, --batch / --mb)",
			    c->schedule_file, fs, pm, c->stages, fm);
		}
		if (c->threads && c->threads != mbp_schedule_threads(probe)) {
			unsigned lines = mbp_schedule_threads(probe);
			mbp_schedule_destroy(probe);
			return bad("--threads %u: --schedule-file %s has %u lines (threads)", c->threads,
				   c->schedule_file, lines);
		}
	}
	unsigned S = c->stages ? c->stages : (ncpu < L ? ncpu : L);
	if (S > L || c->threads > S)
		mbp_schedule_destroy(probe);
	if (S > L)
		return bad("--stages %u: the model has only %u layers", S, L);
	if (c->recompute != UINT64_MAX && L < 64 && c->recompute >> L) {
		mbp_schedule_destroy(probe);
		return bad("--recompute: layer %u: the model has only %u layers (0 to %u)",
			   (unsigned)__builtin_ctzll(c->recompute >> L) + L, L, L - 1);
	}
	if (c->threads > S)
		return bad("--threads %u: more threads than the %u stages", c->threads, S);
	/* a chunked schedule: the stages are its chunks, placed on the threads by its rule; a count it
	 * cannot place is refused before the profile (with --mb auto: no size it can place) */
	mbp_schedule *check = NULL;
	int prc =
	    probe || c->schedule == MBP_SCHED_AUTO || !c->mb
		? 0
		: mbp_schedule_new_placed(&check, c->schedule, S, (c->batch + c->mb - 1) / c->mb, c->threads);
	mbp_schedule_destroy(check);
	if (prc == -EINVAL)
		return bad_placement(c, S);
	if (prc < 0)
		return fail("cannot build the schedule: %s", mbp_strerror(prc));
	bool can_give[PT_MAX_LAYERS];
	for (unsigned i = 0; i < L; i++)
		can_give[i] = mbp_mlp_layer_hand_over_check(r->n, i) == 0;
	unsigned T = c->threads ? c->threads : (S < ncpu ? S : ncpu);
	pt_plan pln, *pl = &pln;
	int rc = 0;
	if (c->plan_auto) { /* the planner's split and prediction: nothing more to profile */
		const mbp_train_plan *ap = &r->ap.plan;
		pln = (pt_plan){.mb = ap->mb, .step_ns = ap->step_ns, .threads = ap->threads};
		pln.split = (mbp_model_plan){.stages = S, .layers = L, .mb_rows = ap->mb};
		memcpy(pln.split.first, ap->first, (S + 1) * sizeof(unsigned));
	} else {
		rc = pt_plan_make(r->n, c, S, T, can_give, probe, pl);
	}
	if (rc == -EINVAL && !c->mb && !probe && c->schedule != MBP_SCHED_AUTO)
		return bad_placement(c, S);
	if (rc < 0) {
		mbp_schedule_destroy(probe);
		return fail("cannot profile, partition or schedule %u layers on %u stages: %s", L, S,
			    mbp_strerror(rc));
	}
	const mbp_model_plan plan = pl->split;
	const bool *gives = pl->gives;
	c->mb = pl->mb;
	uint32_t mbs = (c->batch + c->mb - 1) / c->mb;
	if (!probe) /* --schedule auto: the one the plan built */
		probe = pl->sched;
	pl->sched = NULL;
	r->sh =
	    (pt_shared){.n = r->n, .layers = L, .classes = classes, .clip = (float)c->clip, .fault_step = -1};
	const char *fault = getenv("PIPETRAIN_FAULT");
	if (fault && *fault)
		r->sh.fault_step = strtoll(fault, NULL, 10);
	mbp_train_opts to = {
	    .in_row_bytes = width * sizeof(float),
	    .target_row_bytes = sizeof(int32_t),
	    .max_mb_rows = c->mb,
	    .max_mbs = mbs,
	    .schedule = c->schedule,
	    .custom = probe,
	    .threads = c->threads,
	    .pinning = c->pin ? MBP_PIN_PLAN : MBP_PIN_NONE,
	    .trace_events = c->trace ? 3 * mbs + 8 : 0,
	    .loss = pt_loss,
	    .loss_arg = &r->sh,
	};
	rc = mbp_trainer_new(&r->t, &to);
	mbp_schedule_destroy(probe); /* the trainer has its copy */
	if (rc < 0)
		return fail("cannot create the trainer: %s", mbp_strerror(rc));
	for (unsigned s = 0; s < S; s++) {
		pt_stage *p = &r->stage[s];
		*p = (pt_stage){.sh = &r->sh, .index = s, .first = plan.first[s], .last = plan.first[s + 1]};
		rc = mbp_mlp_stage_new(&p->st, r->n, p->first, p->last, c->mb);
		if (rc == 0 && s > 0 && gives[s - 1])
			rc = mbp_mlp_stages_hand_over(r->stage[s - 1].st, p->st);
		for (unsigned l = p->first; rc == 0 && l < p->last; l++)
			if (c->recompute >> l & 1)
				rc = mbp_mlp_stage_set_recompute(p->st, l, true);
		if (rc < 0)
			return fail("cannot build stage %u: %s", s, mbp_strerror(rc));
	}
	if (c->nreplicas && c->nreplicas != S)
		return bad("--replicas: %u counts for %u stages", c->nreplicas, S);
	for (unsigned s = 0; s < S; s++) {
		mbp_train_stage_desc d;
		pt_stage_desc(&r->stage[s], &d);
		/* --replicas: a model stage per replica (scratch of its own), the weights and gradients
		 * shared; a normalised layer's B_in adds to the gradient, so such a stage merges whole
		 * backwards (train.h, "Replicas") */
		void *ctx[MBP_TRAIN_MAX_REPLICAS] = {&r->stage[s]};
		unsigned nr = c->nreplicas ? c->replicas[s] : 1;
		if (nr > 1 && !(r->replica[s] = calloc(nr - 1, sizeof(pt_stage))))
			return fail("out of memory");
		for (unsigned k = 1; k < nr; k++) {
			pt_stage *q = &r->replica[s][k - 1];
			*q = r->stage[s];
			rc = mbp_mlp_stage_new_replica(&q->st, r->stage[s].st);
			if (rc < 0) {
				q->st = NULL;
				return fail("cannot build replica %u of stage %u: %s", k, s,
					    mbp_strerror(rc));
			}
			ctx[k] = q;
		}
		d.replicas = nr;
		d.replica_ctx = ctx;
		if (nr > 1 && mbp_mlp_stage_bin_accumulates(r->stage[s].st))
			d.backward_in = d.backward_w = NULL;
		rc = mbp_trainer_add_stage(r->t, &d);
		if (rc < 0)
			return fail("cannot add stage %u to the trainer: %s", s, mbp_strerror(rc));
	}
	/* After every stage_new (each sets OpenBLAS to one thread): what the user asked for. */
	if (c->blas_threads)
		openblas_set_num_threads((int)c->blas_threads);

	/* Buffers: one mini-batch, the validation and test sets gathered once. */
	r->xb = malloc((size_t)c->batch * width * sizeof(float));
	r->yb = malloc((size_t)c->batch * sizeof(int32_t));
	r->xval = malloc(((size_t)r->nva + 1) * width * sizeof(float));
	r->yval = malloc(((size_t)r->nva + 1) * sizeof(int32_t));
	r->xtest = malloc((size_t)r->test.n * width * sizeof(float));
	r->ytest = malloc((size_t)r->test.n * sizeof(int32_t));
	r->preds = malloc((size_t)r->test.n * sizeof(int32_t));
	uint32_t most = r->test.n > r->nva ? r->test.n : r->nva;
	r->logits = malloc((size_t)most * classes * sizeof(float));
	uint32_t *all = malloc((size_t)r->test.n * sizeof(uint32_t));
	if (!r->xb || !r->yb || !r->xval || !r->yval || !r->xtest || !r->ytest || !r->preds || !r->logits ||
	    !all) {
		free(all);
		return fail("out of memory");
	}
	for (uint32_t i = 0; i < r->test.n; i++)
		all[i] = i;
	mbp_dataset_gather(&r->test, all, r->test.n, r->xtest, r->ytest);
	free(all);
	if (r->nva)
		mbp_dataset_gather(&r->train, r->va, r->nva, r->xval, r->yval);

	pt_report *rep = &r->rep;
	*rep = (pt_report){.c = c,
			   .plan = *pl,
			   .layers = L,
			   .stages = S,
			   .threads = pl->threads,
			   .mbs = mbs,
			   .last_mb = c->batch - (mbs - 1) * c->mb,
			   .blas_threads = c->blas_threads,
			   .train_rows = r->ntr,
			   .val_rows = r->nva,
			   .test_rows = r->test.n,
			   .steps_per_epoch = spe,
			   .epochs_total = c->epochs,
			   .start_step = start,
			   .start_epoch = (unsigned)(start / spe),
			   .blas = mbp_blas_info(),
			   .blas_warning = mbp_blas_warning(),
			   .autoplan = c->plan_auto ? &r->ap : NULL};
	memcpy(rep->widths, c->widths, (L + 1) * sizeof(uint32_t));
	for (unsigned i = 0; i < L; i++) {
		mbp_layer_info li;
		mbp_mlp_layer_info(r->n, i, &li);
		rep->params += li.param_bytes / sizeof(float);
	}
	for (unsigned s = 0; s < S; s++)
		rep->st[s] = (pt_stage_total){
		    .first = plan.first[s],
		    .last = plan.first[s + 1],
		    .takes = s > 0 && gives[s - 1],
		    .stash_row_bytes = mbp_mlp_stage_stash_floats(r->stage[s].st) * sizeof(float),
		    .work_row_bytes = mbp_mlp_stage_work_floats(r->stage[s].st) * sizeof(float),
		    .replicas = c->nreplicas ? c->replicas[s] : 1,

		    .profiled_us = pl->step_ns > 0 ? plan.stage_ns[s] * 1e-3 : 0};
	for (unsigned l = 0; l < L; l++)
		for (unsigned s = 0; s < S; s++)
			rep->st[s].recompute |= (uint64_t)mbp_mlp_stage_recomputes(r->stage[s].st, l) << l;
	rep->split_bound = pl->step_ns > 0 && plan.slowest_ns > 0 ? plan.sequential_ns / plan.slowest_ns : 0;
	rep->ep = calloc(c->epochs + 1, sizeof(pt_epoch));
	if (!rep->ep)
		return fail("out of memory");
	if (c->plot && !(rep->step_loss = calloc(1, sizeof *rep->step_loss)))
		return fail("out of memory");
	if (pt_csv_open(c, &r->csv) < 0 || pt_log_open(c, &r->log) < 0)
		return 2;

	/* Start the threads with SIGINT and SIGTERM blocked: they inherit the mask, the main thread alone
	 * takes the signals. */
	sigset_t sigs, old;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, &old);
	rc = mbp_trainer_start(r->t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc < 0) {
		mbp_train_error e;
		mbp_trainer_error(r->t, &e);
		fprintf(stderr, "pipetrain: cannot start the trainer: %s (stage %d)%s%s\n", mbp_strerror(rc),
			e.stage, e.what ? ": " : "", e.what ? e.what : "");
		return rc == -ENOTSUP ? 2
				      : 1; /* what was asked cannot run (replicas under a chunked schedule) */
	}
	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESETHAND | SA_RESTART};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	return 0;
}

/* The per-stage figures of the step just done, added to the run's totals; its own in ts. */
static void account(struct run *r, double *busy_ns, double *pred_ns, double *step_ns, mbp_train_stats *out)
{
	mbp_train_stats ts;
	mbp_train_stage_stats ss[MBP_MAX_STAGES];
	int k = mbp_trainer_stats_get(r->t, &ts, ss, MBP_MAX_STAGES);
	for (int s = 0; s < k && s < (int)r->rep.stages; s++) {
		pt_stage_total *t = &r->rep.st[s];
		t->thread = ss[s].thread;
		t->cpu = ss[s].cpu;
		t->pin_error = ss[s].pin_error;
		t->sharing = ss[s].sharing;
		t->compute_s +=
		    (double)(ss[s].f_ns + ss[s].b_ns + ss[s].bin_ns + ss[s].w_ns + ss[s].r_ns) * 1e-9;
		t->recompute_s += (double)ss[s].r_ns * 1e-9;
		if (ss[s].act_peak_bytes > t->act_peak_bytes)
			t->act_peak_bytes = ss[s].act_peak_bytes;
		t->wait_s += (double)ss[s].wait_ns * 1e-9;
		if (ss[s].stash_peak > t->stash_peak)
			t->stash_peak = ss[s].stash_peak;
		if (ss[s].held_peak > t->held_peak)
			t->held_peak = ss[s].held_peak;
	}
	r->rep.threads = ts.threads;
	if (ts.act_peak_bytes > r->rep.act_peak_bytes)
		r->rep.act_peak_bytes = ts.act_peak_bytes;
	r->rep.act_pool_bytes = ts.act_pool.high_water * ts.act_buf_bytes;
	*step_ns += (double)ts.step_ns;
	*busy_ns += (double)ts.step_ns * ts.bubble;
	*pred_ns += (double)ts.step_ns * ts.bubble_predicted;
	r->rep.wall_s += (double)ts.step_ns * 1e-9;
	*out = ts;
}

/* The gradient's global norm before clipping, from each layer's squared norm (stages.c), in layer order. */
static double grad_norm(const pt_shared *sh)
{
	double sq = 0;
	for (unsigned l = 0; l < sh->layers; l++)
		sq += sh->layer_sq[l];
	return sqrt(sq);
}

/* The epoch loop. @return the exit status. */
static int train(struct run *r)
{
	pt_config *c = r->c;
	pt_report *rep = &r->rep;
	uint64_t spe = rep->steps_per_epoch, step = rep->start_step, total = spe * c->epochs;
	int status = 0;
	const double t_run = mbt_now_s();
	mbp_optim_opts oo;
	mbp_mlp_optim(r->n, &oo);
	pt_progress_init(c->quiet ? 0 : c->progress);
	mbp_train_stats ts0; /* the trainer's thread count: with --replicas more than the plan's */
	if (mbp_trainer_stats_get(r->t, &ts0, NULL, 0) >= 0)
		rep->threads = ts0.threads;
	pt_print_header(rep);
	char warn[512];
	if (!c->quiet && blas_warning_line(warn, sizeof warn))
		fprintf(stderr, "pipetrain: %s\n", warn);
	if (step >= spe * c->epochs && !c->quiet)
		fprintf(pt_human(c),
			"pipetrain: the checkpoint has done its %u epochs already; nothing to train\n",
			c->epochs);
	for (unsigned ep = rep->start_epoch; ep < c->epochs && !status; ep++) {
		mbp_data_epoch_order(r->tr, r->ntr, c->seed, ep, r->order);
		double t0 = mbt_now_s(), loss_sum = 0, bubble_ns = 0, pred_ns = 0, step_ns = 0;
		uint64_t rows = 0, correct = 0;
		for (uint64_t k = step - (uint64_t)ep * spe; k < spe; k++) {
			mbp_dataset_gather(&r->train, r->order + k * c->batch, c->batch, r->xb, r->yb);
			double loss;
			r->sh.correct = 0;
			int rc = mbp_trainer_step(r->t, r->xb, r->yb, c->batch, c->mb, &loss);
			if (rc < 0) {
				pt_progress_end();
				mbp_train_error e;
				mbp_trainer_error(r->t, &e);
				fprintf(stderr,
					"pipetrain: step %llu (epoch %u, batch %llu) failed at stage %d (%s, "
					"micro-batch %d): %s%s; training stopped, %s\n",
					(unsigned long long)step, ep + 1, (unsigned long long)k, e.stage,
					pt_op_name(e.op), e.mb,
					rc == -EDOM || e.err == -EDOM ? "non-finite loss or gradient, " : "",
					mbp_strerror(rc < 0 ? rc : e.err),
					c->save ? "the last checkpoint is kept as it was"
						: "nothing saved (no --save)");
				rep->stopped = rc == -EDOM || e.err == -EDOM ? "non-finite loss or gradient"
									     : "step failed";
				status = 1;
				break;
			}
			step++;
			rep->steps_run++;
			rows += c->batch;
			loss_sum += loss;
			correct += r->sh.correct;
			mbp_train_stats ts;
			account(r, &bubble_ns, &pred_ns, &step_ns, &ts);
			double now = mbt_now_s(), dt = now - t0, ran = now - t_run;
			pt_step row = {.step = step,
				       .epoch = ep + 1,
				       .loss = loss / c->batch,
				       .acc = (double)r->sh.correct / c->batch,
				       .lr = mbp_optim_lr(&oo, step - 1),
				       .grad_norm = grad_norm(&r->sh),
				       .samples_per_s = ts.step_ns ? c->batch / (ts.step_ns * 1e-9) : 0,
				       .step_ms = (double)ts.step_ns * 1e-6,
				       .bubble = ts.bubble,
				       .elapsed_s = ran};
			pt_log_row(r->log, &row);
			if (rep->step_loss)
				pt_curve_add(rep->step_loss, (double)step, row.loss);
			/* the time left: this run's pace so far (steps and evaluations) over the steps left */
			double eta = ran / (double)(step - rep->start_step) * (double)(total - step);
			pt_progress(ep + 1, c->epochs, k + 1, spe, dt > 0 ? rows / dt : 0, loss_sum / rows,
				    eta);
			if (stop_signal)
				break;
		}
		double train_s = mbt_now_s() - t0;
		pt_progress_end();
		if (status)
			break;
		if (stop_signal) {
			rep->stopped =
			    stop_signal == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)";
			if (c->save && save_checkpoint(r->n, c->save) == 0)
				fprintf(stderr, "pipetrain: %s at step %llu; checkpoint written to %s\n",
					rep->stopped, (unsigned long long)step, c->save);
			else
				fprintf(stderr, "pipetrain: %s at step %llu; %s\n", rep->stopped,
					(unsigned long long)step,
					c->save ? "the checkpoint could not be written"
						: "nothing saved (no --save)");
			status = stop_signal == SIGINT ? 130 : 143;
			break;
		}
		pt_epoch *e = &rep->ep[rep->n_ep++];
		*e = (pt_epoch){.epoch = ep + 1,
				.step = step,
				.train_loss = rows ? loss_sum / rows : NAN,
				.train_acc = rows ? (double)correct / rows : NAN,
				.samples_per_s = train_s > 0 ? rows / train_s : 0,
				.bubble = step_ns > 0 ? bubble_ns / step_ns : 0,
				.bubble_predicted = step_ns > 0 ? pred_ns / step_ns : 0,
				.seconds = train_s};
		e->lr = mbp_optim_lr(&oo, step ? step - 1 : 0);
		int rc = evaluate(r->n, r->xtest, r->ytest, r->test.n, r->train.classes, r->logits, r->preds,
				  &e->test_acc, &e->test_loss);
		double vl;
		if (rc == 0 && r->nva)
			rc = evaluate(r->n, r->xval, r->yval, r->nva, r->train.classes, r->logits, NULL,
				      &e->val_acc, &vl);
		if (rc < 0) {
			fprintf(stderr, "pipetrain: evaluation failed: %s\n", mbp_strerror(rc));
			status = 1;
			break;
		}
		if (!r->nva)
			e->val_acc = NAN;
		rep->final_test_acc = e->test_acc;
		pt_print_epoch(rep, e);
		pt_csv_row(r->csv, e);
		if (pt_csv_save(rep) < 0) {
			status = 1;
			break;
		}
		if (c->save && save_checkpoint(r->n, c->save) < 0) {
			status = 1;
			break;
		}
	}
	if (rep->n_ep == 0 && status == 0) { /* nothing trained (a finished checkpoint): still evaluate */
		double l;
		evaluate(r->n, r->xtest, r->ytest, r->test.n, r->train.classes, r->logits, r->preds,
			 &rep->final_test_acc, &l);
		if (pt_csv_save(rep) < 0)
			status = 1;
	}
	if (c->predictions && (status == 0 || status >= 128) &&
	    write_predictions(c->predictions, r->preds, r->test.n) < 0 && status == 0)
		status = 1;
	if (c->trace && rep->wall_s > 0) {
		int rc = mbp_trainer_trace_write(r->t, c->trace);
		if (rc < 0) {
			fprintf(stderr, "pipetrain: --trace %s: %s\n", c->trace, mbp_strerror(rc));
			if (status == 0)
				status = 1;
		}
	}
	if (c->plot) {
		char err[512];
		if (pt_plot_write(rep, err, sizeof err) < 0) {
			fprintf(stderr, "pipetrain: %s\n", err);
			if (status == 0)
				status = 1;
		}
	}
	pt_print_summary(rep);
	if (c->json && pt_json_write(rep) < 0 && status == 0)
		status = 1;
	return status;
}

int main(int argc, char **argv)
{
	pt_config c;
	char err[512];
	int rc = pt_options_parse(argc, argv, &c, err, sizeof err);
	if (rc > 0)
		return 0;
	if (rc < 0)
		return bad("%s", err);
	struct run r = {.c = &c};
	int status = setup(&r);
	if (status == 0)
		status = train(&r);
	else if (status == PT_PLAN_ONLY)
		status = 0;
	run_free(&r);
	return status;
}

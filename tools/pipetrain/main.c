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
	mt_shared sh;
	mt_stage stage[MBP_MAX_STAGES];
	mt_stage *replica[MBP_MAX_STAGES]; /* --replicas: stage s's replicas 1 .. r - 1 */
	mbp_trainer *t;
	pt_report rep;
	mt_auto ap; /* --plan auto */
	FILE *csv, *log;
	mbp_train_opts to; /* the trainer's options: a move makes the trainer again with them */
	unsigned T;	   /* the threads the plans are played on */
	bool can_give[PT_MAX_LAYERS];
	/* --rebalance */
	pt_plan cur;	    /* the split in use (first, gives; stage_ns as predicted when it was made) */
	mt_costs profile;   /* the layers' profiled costs at the micro-batch size */
	mbp_schedule *file; /* --schedule-file's schedule: fresh plans are refined against it */
	double busy_ns[MBP_MAX_STAGES]; /* each stage's operations in the window so far */
	unsigned window_steps;
	unsigned nphases; /* PIPETRAIN_REBALANCE_COSTS: modelled layer costs from a step on */
	uint64_t phase_step[8];
	double phase_us[8][PT_MAX_LAYERS];
};

#define PT_PLAN_ONLY (-1) /* setup's status: --plan-only printed the plan, exit 0 */

/* --plan auto: profile, plan, print; then the run's options are the plan's. @return 0, PT_PLAN_ONLY, or
 * the exit status. */
static int auto_plan(struct run *r, unsigned ncpu)
{
	pt_config *c = r->c;
	FILE *pf = NULL; /* --plan-points: opened first, read after the plan, before its lines */
	if (c->plan_points && !(pf = fopen(c->plan_points, "r")))
		return bad("--plan-points %s: %s", c->plan_points, strerror(errno));
	int rc = mt_auto_plan(r->n, c->batch, c->memory, c->threads, ncpu, &r->ap);
	if (rc == -ENOSPC || rc < 0) {
		if (pf)
			fclose(pf);
		char why[256];
		mt_auto_refusal(&r->ap, why, sizeof why);
		return rc == -ENOSPC ? bad("%s", why) : fail("cannot plan the run: %s", mbp_strerror(rc));
	}
	cJSON *pts = NULL;
	if (pf) {
		char why[256] = "out of memory";
		pts = mt_auto_points_json(&r->ap, pf, why, sizeof why);
		fclose(pf);
		if (!pts)
			return bad("--plan-points %s: %s", c->plan_points, why);
	}
	const mbp_train_plan *p = &r->ap.plan;
	if (!c->quiet || c->plan_only)
		mt_auto_print(pt_human(c), &r->ap);
	if (c->plan_only) {
		if (c->json) {
			cJSON *root = cJSON_CreateObject();
			cJSON_AddItemToObject(root, "plan", mt_auto_json(&r->ap));
			if (pts)
				cJSON_AddItemToObject(root, "points", pts);
			if (mt_json_print(stdout, root))
				return fail("out of memory");
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
	mbp_schedule_destroy(r->file);
	for (unsigned s = 0; s < MBP_MAX_STAGES; s++) {
		mbp_mlp_stage_destroy(r->stage[s].st);
		for (unsigned k = 1; r->replica[s] && k < r->c->replicas[s]; k++)
			mbp_mlp_stage_destroy(r->replica[s][k - 1].st);
		free(r->replica[s]);
	}
	mbp_mlp_destroy(r->n);
	free(r->sh.piece_sq);
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

/* The trainer over the split first[] (stage s: layers [first[s], first[s + 1]), gives[s]: it hands its
 * last layer's input gradient over), not started: its stages are made from the model, whose parameters,
 * moments and step counts they use (a move makes them again: the same bits, tests/test_mlp.c). @return 0,
 * or the exit status. */
static int make_trainer(struct run *r, unsigned S, const unsigned *first, const bool *gives,
			const mbp_schedule *custom)
{
	const pt_config *c = r->c;
	mbp_train_opts to = r->to;
	to.custom = custom;
	int rc = mbp_trainer_new(&r->t, &to);
	if (rc < 0)
		return fail("cannot create the trainer: %s", mbp_strerror(rc));
	for (unsigned s = 0; s < S; s++) {
		rc = mt_stage_make(&r->stage[s], &r->sh, s, first[s], first[s + 1], c->mb,
				   s > 0 && gives[s - 1] ? &r->stage[s - 1] : NULL, c->recompute);
		if (rc < 0)
			return fail("cannot build stage %u: %s", s, mbp_strerror(rc));
	}
	for (unsigned s = 0; s < S; s++) {
		mbp_train_stage_desc d;
		mt_stage_desc(&r->stage[s], &d);
		/* --replicas: a model stage per replica (scratch of its own), the weights and gradients
		 * shared; a normalised layer's B_in adds to the gradient, so such a stage merges whole
		 * backwards (train.h, "Replicas") */
		void *ctx[MBP_TRAIN_MAX_REPLICAS] = {&r->stage[s]};
		unsigned nr = c->nreplicas ? c->replicas[s] : 1;
		if (nr > 1 && !(r->replica[s] = calloc(nr - 1, sizeof(mt_stage))))
			return fail("out of memory");
		for (unsigned k = 1; k < nr; k++) {
			mt_stage *q = &r->replica[s][k - 1];
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

	return 0;
}

/* Start the trainer's threads with SIGINT and SIGTERM blocked: they inherit the mask, the main thread
 * alone takes the signals. @return 0, or the exit status. */
static int start_trainer(struct run *r)
{
	sigset_t sigs, old;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, &old);
	int rc = mbp_trainer_start(r->t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc < 0) {
		mbp_train_error e;
		mbp_trainer_error(r->t, &e);
		fprintf(stderr, "pipetrain: cannot start the trainer: %s (stage %d)%s%s\n", mbp_strerror(rc),
			e.stage, e.what ? ": " : "", e.what ? e.what : "");
		return rc == -ENOTSUP ? 2 : 1; /* what was asked cannot run */
	}
	return 0;
}

/* The report's description of each stage under the split (first, gives; stage_ns[s]: its predicted
 * operations per micro-batch, 0: not profiled), its accumulated figures left as they are. */
static void describe_stages(struct run *r, const unsigned *first, const bool *gives, const double *stage_ns)
{
	pt_report *rep = &r->rep;
	for (unsigned s = 0; s < rep->stages; s++) {
		pt_stage_total *t = &rep->st[s];
		t->first = first[s];
		t->last = first[s + 1];
		t->takes = s > 0 && gives[s - 1];
		t->stash_row_bytes = mbp_mlp_stage_stash_floats(r->stage[s].st) * sizeof(float);
		t->work_row_bytes = mbp_mlp_stage_work_floats(r->stage[s].st) * sizeof(float);
		t->replicas = r->c->nreplicas ? r->c->replicas[s] : 1;
		t->profiled_us = stage_ns[s] * 1e-3;
		t->recompute = 0;
		for (unsigned l = 0; l < rep->layers; l++)
			t->recompute |= (uint64_t)mbp_mlp_stage_recomputes(r->stage[s].st, l) << l;
	}
}

/* The hidden hooks of tests and benchmarks. PIPETRAIN_REBALANCE_COSTS=STEP:US,US,...;STEP:...: from
 * step STEP on, --rebalance's looks take these per-layer costs (microseconds a micro-batch) instead of
 * the measured ones, so that moves are the same whatever the machine's load (tests/test_pipetrain.c).
 * PIPETRAIN_SLOW=STEP:LAYER:US: from step STEP on, the stage that holds LAYER spins US microseconds more
 * in each forward: a cost that changes mid-run, for real (perf/train_rebalance.sh). @return 0, or -1
 * with the reason printed. */
static int hooks(struct run *r, unsigned L)
{
	const char *v = getenv("PIPETRAIN_REBALANCE_COSTS");
	for (const char *p = v; p && *p && r->nphases < 8;) {
		char *end;
		r->phase_step[r->nphases] = strtoull(p, &end, 10);
		if (end == p || *end != ':')
			return bad("PIPETRAIN_REBALANCE_COSTS: '%s' is not STEP:US,US,...;...", v), -1;
		p = end;
		for (unsigned l = 0; l < L; l++) {
			double us = strtod(p + 1, &end);
			if (end == p + 1 || !(us > 0) || *end != (l + 1 < L ? ',' : *end ? ';' : 0))
				return bad("PIPETRAIN_REBALANCE_COSTS: '%s': a positive cost for each of the "
					   "%u "
					   "layers, comma-separated, phases separated by ';'",
					   v, L),
				       -1;
			r->phase_us[r->nphases][l] = us;
			p = end;
		}
		r->nphases++;
		p += *p == ';';
	}
	const char *slow = getenv("PIPETRAIN_SLOW");
	r->sh.slow_step = -1;
	if (slow && *slow) {
		unsigned long long step;
		unsigned layer;
		double us;
		if (sscanf(slow, "%llu:%u:%lf", &step, &layer, &us) != 3 || layer >= L || !(us > 0))
			return bad("PIPETRAIN_SLOW: '%s' is not STEP:LAYER:US", slow), -1;
		r->sh.slow_step = (int64_t)step;
		r->sh.slow_layer = layer;
		r->sh.slow_ns = us * 1e3;
	}
	return 0;
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
	if (c->rebalance && S < 2) {
		mbp_schedule_destroy(probe);
		return bad("--rebalance: one stage, nothing to move (--stages 2 or more)");
	}
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
		/* each stage's profiled cost (the summary's profile_us) and the split's figures: its
		 * layers' from the planner's profile at the plan's size (none: 0, not profiled) */
		pln.costs.rows = ap->mb;
		for (unsigned k = 0; k < r->ap.sizes; k++)
			for (unsigned l = 0; r->ap.mb[k] == ap->mb && l < L; l++) {
				const mbp_op_costs *oc = &r->ap.cost[k * r->ap.layers + l];
				pln.costs.f[l] = oc->f;
				pln.costs.b_in[l] = oc->b_in;
				pln.costs.b_w[l] = oc->b_w;
			}
		pt_split_figures(&pln.costs, S, &pln.split, pln.gives);
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
	    (mt_shared){.n = r->n, .layers = L, .classes = classes, .clip = (float)c->clip, .fault_step = -1};
	if (mt_shared_pieces(&r->sh) < 0) {
		mbp_schedule_destroy(probe);
		return fail("out of memory");
	}
	const char *fault = getenv("PIPETRAIN_FAULT");
	if (fault && *fault)
		r->sh.fault_step = strtoll(fault, NULL, 10);
	if (hooks(r, L) < 0) {
		mbp_schedule_destroy(probe);
		return 2;
	}
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
	    .loss = mt_loss,
	    .loss_arg = &r->sh,
	};
	r->to = to;
	if (c->nreplicas && c->nreplicas != S) {
		mbp_schedule_destroy(probe);
		return bad("--replicas: %u counts for %u stages", c->nreplicas, S);
	}
	if (c->rebalance) {
		if (c->schedule_file)
			r->file = probe; /* kept for the fresh plans */
		r->cur = *pl;
		r->profile = pl->costs;
		r->T = T;
		memcpy(r->can_give, can_give, sizeof r->can_give);
	}
	int st = make_trainer(r, S, plan.first, gives, probe);
	if (probe != r->file)
		mbp_schedule_destroy(probe); /* the trainer has its copy */
	if (st)
		return st;

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
			   .kernel = dense_kernel_name(),
			   .autoplan = c->plan_auto ? &r->ap : NULL};
	memcpy(rep->widths, c->widths, (L + 1) * sizeof(uint32_t));
	for (unsigned i = 0; i < L; i++) {
		mbp_layer_info li;
		mbp_mlp_layer_info(r->n, i, &li);
		rep->params += li.param_bytes / sizeof(float);
	}
	double none[MBP_MAX_STAGES] = {0};
	describe_stages(r, plan.first, gives, pl->step_ns > 0 ? plan.stage_ns : none);
	rep->split_bound = pl->step_ns > 0 && plan.slowest_ns > 0 ? plan.sequential_ns / plan.slowest_ns : 0;
	rep->ep = calloc(c->epochs + 1, sizeof(pt_epoch));
	if (!rep->ep)
		return fail("out of memory");
	if (c->plot && !(rep->step_loss = calloc(1, sizeof *rep->step_loss)))
		return fail("out of memory");
	if (pt_csv_open(c, &r->csv) < 0 || pt_log_open(c, &r->log) < 0)
		return 2;

	if ((st = start_trainer(r)))
		return st;
	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESETHAND | SA_RESTART};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	return 0;
}

/* The per-thread figures are wrong from this step on (`why`): one warning line, even with --quiet, and
 * the summary and the JSON leave them out rather than show them as if counted. */
static void thread_figs_left_out(pt_report *rep, const char *why)
{
	rep->thr.threads = 0;
	if (rep->thr_left_out[0])
		return;
	snprintf(rep->thr_left_out, sizeof rep->thr_left_out, "%s", why);
	fprintf(stderr, "pipetrain: warning: the per-thread figures are left out: %s\n", why);
}

/* The per-stage figures of the step just done, added to the run's totals; its own in ts. */
static void account(struct run *r, double *busy_ns, double *pred_ns, double *step_ns, mbp_train_stats *out)
{
	mbp_train_stats ts = {0};
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
		t->hops = ss[s].hops;
		t->local_hops = ss[s].local_hops;
	}
	r->rep.threads = ts.threads;
	bool replicated = false;
	for (unsigned s = 0; s < r->rep.stages; s++)
		replicated |= r->rep.st[s].replicas > 1;
	/* replicas are copies of the schedule's threads, which the per-stage figures show (their sums) */
	unsigned got = k < 0 ? 0 : (unsigned)k < r->rep.stages ? (unsigned)k : r->rep.stages;
	char why[160];
	int frc = k < 0 || replicated ? 0
				      : mt_thread_figs_get(&r->rep.thr, mbp_trainer_schedule(r->t),
							   ts.threads, ss, got, why, sizeof why);
	if (k < 0)
		snprintf(why, sizeof why, "cannot read the trainer's figures: %s", mbp_strerror(k));
	if (k < 0 || frc == -EPROTO)
		thread_figs_left_out(&r->rep, why);
	if (replicated || frc == -EINVAL || r->rep.thr_left_out[0])
		r->rep.thr.threads = 0;
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
static double grad_norm(const mt_shared *sh)
{
	double sq = 0;
	for (unsigned l = 0; l < sh->layers; l++)
		sq += sh->layer_sq[l];
	return sqrt(sq);
}

/* A split in a few words: "layers 0-1 | 2". */
static void split_text(const unsigned *first, unsigned S, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = 0;
	for (unsigned s = 0; s < S && len < n; s++) {
		int k = first[s + 1] - first[s] == 1
			    ? snprintf(buf + len, n - len, "%s%u", s ? " | " : "layers ", first[s])
			    : snprintf(buf + len, n - len, "%s%u-%u", s ? " | " : "layers ", first[s],
				       first[s + 1] - 1);
		len += k > 0 ? (size_t)k : 0;
	}
}

/* --rebalance, after each step but the run's last: the stages' operations of the step added to the window; at its end a look
 * and, when the rule (mbp_model_rebalance_look, the rebalancing stages' own) says so, a move before the
 * next step: nothing is in flight between steps, the trainer and its stages are made again at the fresh
 * split from the model, whose parameters, moments and step counts stay as they are. Each layer's cost is
 * its profiled cost scaled by measured / predicted of the stage that ran it: the trainer measures stages,
 * not layers, and timing each layer inside the stages' operations would put a clock in every layer of
 * every micro-batch for what a few looks a run need (so a stage slowed by a neighbour on its core makes
 * all its layers look dearer, and the split follows). @return 0, or the exit status. */
static int rebalance_step(struct run *r, uint64_t step)
{
	pt_config *c = r->c;
	const unsigned S = r->rep.stages, L = r->rep.layers;
	mbp_train_stats ts;
	mbp_train_stage_stats ss[MBP_MAX_STAGES];
	int k = mbp_trainer_stats_get(r->t, &ts, ss, MBP_MAX_STAGES);
	for (int s = 0; s < k && s < (int)S; s++)
		r->busy_ns[s] += (double)(ss[s].f_ns + ss[s].b_ns + ss[s].bin_ns + ss[s].w_ns + ss[s].r_ns);
	if (++r->window_steps < c->rb_window)
		return 0;
	mbp_model_plan prof = r->cur.split; /* the split in use, its stages as the profile costs them */
	pt_split_figures(&r->profile, S, &prof, r->cur.gives);
	const double *model = NULL;
	for (unsigned i = 0; i < r->nphases; i++)
		if (step >= r->phase_step[i])
			model = r->phase_us[i];
	mt_costs scaled = r->profile;
	for (unsigned s = 0; s < S; s++) {
		double per_mb = r->busy_ns[s] / r->window_steps / r->rep.mbs;
		double ratio = prof.stage_ns[s] > 0 && per_mb > 0 ? per_mb / prof.stage_ns[s] : 1;
		for (unsigned l = prof.first[s]; l < prof.first[s + 1]; l++) {
			double all = r->profile.f[l] + r->profile.b_in[l] + r->profile.b_w[l];
			double x = !model ? ratio : all > 0 ? model[l] * 1e3 / all : 1;
			scaled.f[l] *= x;
			scaled.b_in[l] *= x;
			scaled.b_w[l] *= x;
		}
		r->busy_ns[s] = 0;
	}
	r->window_steps = 0;
	mbp_model_plan measured = r->cur.split;
	pt_split_figures(&scaled, S, &measured, r->cur.gives);
	pt_plan fresh;
	if (pt_plan_costs(&scaled, L, c, S, r->T, r->can_give, r->file, &fresh) < 0)
		return 0; /* no plan for these costs: no move this time */
	if (mbp_model_rebalance_look(&c->rb_rule, &measured, &fresh.split) != 1) {
		pt_plan_clear(&fresh);
		return 0;
	}
	char why[200], now[160];
	mbp_model_rebalance_reason(&c->rb_rule, &measured, &fresh.split, r->cur.split.slowest_ns, why,
				   sizeof why);
	mbp_trainer_destroy(r->t);
	r->t = NULL;
	for (unsigned s = 0; s < S; s++) {
		mbp_mlp_stage_destroy(r->stage[s].st);
		r->stage[s].st = NULL;
	}
	int st = make_trainer(r, S, fresh.split.first, fresh.gives, fresh.sched ? fresh.sched : r->file);
	if (!st)
		st = start_trainer(r);
	pt_plan_clear(&fresh); /* the trainer has its copy */
	if (st)
		return st;
	r->rep.moves++;
	split_text(fresh.split.first, S, now, sizeof now);
	pt_progress_end();
	fprintf(stderr, "pipetrain: rebalance: move %llu after step %llu: %s; now %s\n",
		(unsigned long long)r->rep.moves, (unsigned long long)step, why, now);
	describe_stages(r, fresh.split.first, fresh.gives, fresh.split.stage_ns);
	r->cur = fresh;
	return 0;
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
	if (!c->quiet && kernel_warning_line(warn, sizeof warn))
		fprintf(stderr, "pipetrain: %s\n", warn);
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
			r->sh.step = step;
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
			if (c->rebalance && step < total && (status = rebalance_step(r, step)) != 0) {
				rep->stopped = "a move failed";
				break;
			}
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

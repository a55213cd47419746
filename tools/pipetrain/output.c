/*
 * pipetrain output: what a person reads (a header, one line per epoch, the final summary with the
 * placement and each stage's time split), the progress bar with the time left (standard error, only on a
 * terminal, redrawn in place), and what a program reads (--json: one document on standard output at the
 * end; --csv: one row per epoch, written as each epoch ends: to standard output a row at a time, to a file
 * the whole table again by rename, so that the file is always a complete table; --log: one row per step,
 * written as each step ends).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pipetrain.h"
#include "util/blas.h"
#include "util/plural.h"
#include "util/progress.h"

FILE *pt_human(const pt_config *c)
{
	return c->json || (c->csv && !strcmp(c->csv, "-")) || (c->log && !strcmp(c->log, "-")) ? stderr
											       : stdout;
}

static struct progress bar;

void pt_progress_init(int mode)
{
	progress_init(&bar, mode);
}

/* "ETA 4:05", "ETA 1:02:03", or "ETA ?" before the first step has been timed. */
static void fmt_eta(char *buf, size_t n, double s)
{
	if (!(s >= 0) || s > 360000) {
		snprintf(buf, n, "ETA ?");
		return;
	}
	unsigned long t = (unsigned long)(s + 0.5);
	if (t >= 3600)
		snprintf(buf, n, "ETA %lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(buf, n, "ETA %lu:%02lu", t / 60, t % 60);
}

void pt_progress(unsigned epoch, unsigned epochs, uint64_t done, uint64_t total, double samples_per_s,
		 double loss, double eta_s)
{
	if (!total)
		return;
	char before[48], after[128], eta[32];
	fmt_eta(eta, sizeof eta, eta_s);
	snprintf(before, sizeof before, "epoch %u/%u ", epoch, epochs);
	snprintf(after, sizeof after, "%7.0f samples/s loss %.4f %s ", samples_per_s, loss, eta);
	progress_draw(&bar, done, total, before, after);
}

void pt_progress_end(void)
{
	progress_end(&bar);
}

static void widths_str(const pt_report *r, char *buf, size_t n)
{
	size_t k = 0;
	for (unsigned i = 0; i <= r->layers && k < n; i++)
		k += (size_t)snprintf(buf + k, n - k, "%s%u", i ? "," : "", r->widths[i]);
}

void pt_print_header(const pt_report *r)
{
	const pt_config *c = r->c;
	if (c->quiet)
		return;
	FILE *f = pt_human(c);
	char w[512], split[64];
	widths_str(r, w, sizeof w);
	/* the trainer cuts a step into full micro-batches and, when the batch is not a multiple, a last
	 * smaller one */
	if (r->last_mb == c->mb)
		snprintf(split, sizeof split, "%u x %u rows", r->mbs, c->mb);
	else
		snprintf(split, sizeof split, "%u x %u + %u rows", r->mbs - 1, c->mb, r->last_mb);
	if (c->demo)
		fprintf(f,
			"pipetrain: no arguments, so a short demonstration (see --help for the options)\n");
	fprintf(f,
		"pipetrain: MLP %s (%llu parameters), %u %s, %s, %u %s on %u %s; batch %u = %s; "
		"%s lr %g; %llu training, %llu validation, %llu test rows; %llu steps per epoch\n",
		w, (unsigned long long)r->params, r->stages, PLURAL(r->stages, "stage", "stages"),
		mbp_sched_name(c->schedule), r->epochs_total, PLURAL(r->epochs_total, "epoch", "epochs"),
		r->threads, PLURAL(r->threads, "thread", "threads"), c->batch, split,
		c->optim == MBP_OPTIM_SGD ? "SGD" : "AdamW", c->lr, (unsigned long long)r->train_rows,
		(unsigned long long)r->val_rows, (unsigned long long)r->test_rows,
		(unsigned long long)r->steps_per_epoch);
	if (r->start_epoch || r->start_step)
		fprintf(f, "pipetrain: resuming at epoch %u, step %llu\n", r->start_epoch + 1,
			(unsigned long long)r->start_step);
	fflush(f);
}

void pt_print_epoch(const pt_report *r, const pt_epoch *e)
{
	if (r->c->quiet)
		return;
	FILE *f = pt_human(r->c);
	fprintf(f,
		"epoch %u/%u  loss %.4f  train acc %.4f  val acc %.4f  test acc %.4f  %.0f samples/s  "
		"bubble %.3f (predicted %.3f)  %.1f s\n",
		e->epoch, r->epochs_total, e->train_loss, e->train_acc, e->val_acc, e->test_acc,
		e->samples_per_s, e->bubble, e->bubble_predicted, e->seconds);
	fflush(f);
}

void pt_print_summary(const pt_report *r)
{
	if (r->c->quiet)
		return;
	FILE *f = pt_human(r->c);
	unsigned reached = pt_epochs_reached(r);
	char resumed[96] = "";
	if (r->start_step)
		snprintf(resumed, sizeof resumed, " (%u in this run, resumed at step %llu)", r->n_ep,
			 (unsigned long long)r->start_step);
	fprintf(f, "summary: test accuracy %.4f after %u %s%s, %.1f s in training steps%s%s\n",
		r->final_test_acc, reached, PLURAL(reached, "epoch", "epochs"), resumed, r->wall_s,
		r->stopped ? "; stopped: " : "", r->stopped ? r->stopped : "");
	if (r->blas_threads)
		fprintf(f, "OpenBLAS: %s; set to %u %s by --blas-threads\n", r->blas, r->blas_threads,
			PLURAL(r->blas_threads, "thread", "threads"));
	else
		fprintf(f, "OpenBLAS: %s\n", r->blas);
	char kline[96];
	dense_kernel_line(r->kernel, kline, sizeof kline);
	fprintf(f, "%s\n", kline);
	bool handed = false;
	for (unsigned s = 1; s < r->stages; s++)
		handed |= r->st[s].takes;
	const pt_plan *pl = &r->plan;
	if (pl->tried) {
		fprintf(f,
			"micro-batch: %u rows (--mb auto), the shortest step the schedule predicts:", pl->mb);
		for (unsigned k = 0; k < pl->tried; k++)
			fprintf(f, "%s %u rows %.1f ms", k ? "," : "", pl->tried_mb[k],
				pl->tried_ns[k] * 1e-6);
		fputc('\n', f);
	}
	if (r->split_bound > 0)
		fprintf(f,
			"split: each layer's F + B_in + B_w timed at %u rows; the slowest stage bounds the "
			"speed-up over one thread at %.2fx; the schedule played with these costs: %.1f ms a "
			"step's operations, %.2fx one thread%s\n",
			r->c->mb, r->split_bound, pl->step_ns * 1e-6, pl->seq_ns / pl->step_ns,
			handed ? "; a layer marked '<' has its input gradient computed by the next stage"
			       : "");
	fprintf(f, "%-6s %-12s %6s %5s %9s %9s %9s %10s %7s %7s %9s %11s %11s\n", "stage", "layers", "thread",
		"cpu", "compute%", "wait%", "bubble%", "recompute%", "stash", "held", "hops", "peak_MiB",
		"profile_us");
	bool recomputes = false;
	for (unsigned s = 0; s < r->stages; s++) {
		const pt_stage_total *t = &r->st[s];
		/* a replicated stage's shares: of its threads' time together */
		double wall = (r->wall_s > 0 ? r->wall_s : 1) * (t->replicas ? t->replicas : 1);
		double peak = (double)t->act_peak_bytes / (1 << 20);
		char layers[32], cpu[16], hops[24];
		bool gives = s + 1 < r->stages && r->st[s + 1].takes;
		recomputes |= t->recompute != 0;
		/* '*': every layer of the stage recomputes, '+': some of them */
		bool all = t->recompute ==
			   (((t->last - t->first == 64 ? 0 : 1ull << (t->last - t->first)) - 1) << t->first);
		char reps[16] = "";
		if (t->replicas > 1) /* "x2": on 2 replicas */
			snprintf(reps, sizeof reps, " x%u", t->replicas);
		snprintf(layers, sizeof layers, "%u-%u%s%s%s", t->first, t->last - 1, gives ? "<" : "",
			 !t->recompute ? ""
			 : all	       ? "*"
				       : "+",
			 reps);
		snprintf(cpu, sizeof cpu, t->cpu < 0 ? "-" : "%d", t->cpu);
		snprintf(hops, sizeof hops, "%u + %u", t->hops, t->local_hops);
		fprintf(f, "%-6u %-12s %6u %5s %9.1f %9.1f %9.1f %10.1f %7u %7u %9s %11.2f %11.1f", s, layers,
			t->thread, cpu, 100 * t->compute_s / wall, 100 * t->wait_s / wall,
			100 * (1 - t->compute_s / wall), 100 * t->recompute_s / wall, t->stash_peak,
			t->held_peak, hops, peak, t->profiled_us);
		if (t->pin_error) /* the words of pipebench's placement line */
			fprintf(f, "  (pin failed: %s)", mbp_strerror(t->pin_error));
		if (t->sharing)
			fprintf(f, "  (shared with %u other %s)", t->sharing,
				PLURAL(t->sharing, "thread", "threads"));
		fputc('\n', f);
	}
	fprintf(
	    f,
	    "(compute, wait and bubble: shares of the training time; bubble = 1 - compute; recompute: the "
	    "part of compute spent recomputing activations%s; stash and held: peak micro-batches; hops: the "
	    "last step's outputs and input gradients handed to another thread + passed to a stage of its own "
	    "thread; peak_MiB: the most activation memory the stage held at once)\n",
	    recomputes ? ", in the stages marked * (every layer) or + (some)" : "");
	if (r->thr.threads) {
		char thr[MBP_MAX_STAGES * 36];
		mt_thread_figs_str(&r->thr, thr, sizeof thr);
		fprintf(
		    f,
		    "per thread: %s (t: the most micro-batches it held over its stages, the schedule's; h: "
		    "the last step's hops to another thread + passes between its own stages)\n",
		    thr);
	}
	fprintf(f,
		"activation memory: peak %.2f MiB held at once over all stages (the activation pool at its "
		"high-water mark: %.2f MiB)\n",
		(double)r->act_peak_bytes / (1 << 20), (double)r->act_pool_bytes / (1 << 20));
	/* what one micro-batch keeps in each stage, kept from F to its last backward (stashed) or rebuilt
	 * for the backward (recomputed): the JSON's stash_bytes_per_mb and recomputed_bytes_per_mb */
	fprintf(f, "activation memory a micro-batch of %u rows holds, stage by stage: stashed", r->c->mb);
	for (int k = 0; k < 2; k++) {
		for (unsigned s = 0; s < r->stages; s++) {
			size_t row = k ? r->st[s].work_row_bytes : r->st[s].stash_row_bytes;
			fprintf(f, "%s%.1f", s ? "," : " ", (double)row * r->c->mb / 1024);
		}
		fprintf(f, k ? " KiB\n" : " KiB, recomputed");
	}
	if (r->c->rebalance) {
		const mbp_model_rebalance_rule *rr = &r->c->rb_rule;
		fprintf(f,
			"rebalance: %llu %s (a look every %u %s: a move when the slowest stage stays above "
			"%.2f x a fresh plan's for %u looks; the stages above: the split at the end)\n",
			(unsigned long long)r->moves, PLURAL(r->moves, "move", "moves"), r->c->rb_window,
			PLURAL(r->c->rb_window, "step", "steps"),
			1 + (rr->threshold > 0 ? rr->threshold : 0.10), rr->patience ? rr->patience : 2);
	}
	if (r->autoplan && r->steps_run) {
		const mbp_train_plan *p = &r->autoplan->plan;
		fprintf(f,
			"plan against the run: step %.3f ms predicted, %.3f ms measured (mean of %llu %s); "
			"peak memory %.2f MiB predicted, %.2f MiB measured (the trainer's activation peak "
			"%.2f MiB + the state %.2f MiB)\n",
			p->step_ns * 1e-6, r->wall_s * 1e3 / (double)r->steps_run,
			(unsigned long long)r->steps_run, PLURAL(r->steps_run, "step", "steps"),
			(double)p->peak_bytes / (1 << 20), (double)pt_measured_peak(r) / (1 << 20),
			(double)r->act_peak_bytes / (1 << 20), (double)p->state_bytes / (1 << 20));
	}
	fflush(f);
}

uint64_t pt_measured_peak(const pt_report *r)
{
	return r->autoplan ? mt_auto_peak(r->autoplan, r->act_peak_bytes) : r->act_peak_bytes;
}

const char *pt_op_name(mbp_op_kind k)
{
	switch (k) {
	case MBP_OP_F:
		return "forward";
	case MBP_OP_B:
		return "backward";
	case MBP_OP_BIN:
		return "B_in";
	case MBP_OP_W:
		return "B_w";
	case MBP_OP_UPDATE:
		return "update";
	case MBP_OP_R:
		return "recompute";
	}
	return "?";
}

unsigned pt_epochs_reached(const pt_report *r)
{
	if (r->n_ep)
		return r->ep[r->n_ep - 1].epoch;
	return r->steps_per_epoch ? (unsigned)(r->start_step / r->steps_per_epoch) : 0;
}

static void csv_header(FILE *f)
{
	fprintf(f, "epoch,step,train_loss,train_acc,val_acc,test_acc,test_loss,samples_per_s,bubble,"
		   "bubble_predicted,seconds,lr\n");
}

static void csv_line(FILE *f, const pt_epoch *e)
{
	fprintf(f, "%u,%llu,%.6f,%.6f,%.6f,%.6f,%.6f,%.1f,%.4f,%.4f,%.3f,%.6g\n", e->epoch,
		(unsigned long long)e->step, e->train_loss, e->train_acc, e->val_acc, e->test_acc,
		e->test_loss, e->samples_per_s, e->bubble, e->bubble_predicted, e->seconds, e->lr);
}

int pt_csv_open(const pt_config *c, FILE **f)
{
	*f = NULL;
	if (!c->csv || strcmp(c->csv, "-")) /* a file is written whole at each epoch: pt_csv_save */
		return 0;
	*f = stdout;
	csv_header(*f);
	fflush(*f);
	return 0;
}

void pt_csv_row(FILE *f, const pt_epoch *e)
{
	if (!f)
		return;
	csv_line(f, e);
	fflush(f);
}

/* --log is written as the run goes (a row per step; `tail -f` follows it), so it is opened, not renamed:
 * its path was checked at start (mbp_file_check). */
int pt_log_open(const pt_config *c, FILE **f)
{
	*f = NULL;
	if (!c->log)
		return 0;
	*f = strcmp(c->log, "-") ? fopen(c->log, "w") : stdout;
	if (!*f) {
		fprintf(stderr, "pipetrain: --log %s: %s\n", c->log, strerror(errno));
		return -1;
	}
	fprintf(*f, "step,epoch,loss,accuracy,lr,grad_norm,samples_per_s,step_ms,bubble,elapsed_s\n");
	fflush(*f);
	return 0;
}

void pt_log_row(FILE *f, const pt_step *s)
{
	if (!f)
		return;
	fprintf(f, "%llu,%u,%.6f,%.6f,%.6g,%.6g,%.1f,%.4f,%.4f,%.3f\n", (unsigned long long)s->step, s->epoch,
		s->loss, s->acc, s->lr, s->grad_norm, s->samples_per_s, s->step_ms, s->bubble, s->elapsed_s);
	fflush(f); /* the row is there while the run goes on (tail -f, a plot of its own) */
}

int pt_csv_save(const pt_report *r)
{
	const char *path = r->c->csv;
	if (!path || !strcmp(path, "-"))
		return 0;
	mbp_file *f;
	int rc = mbp_file_new(&f, path);
	if (rc == 0) {
		csv_header(mbp_file_stream(f));
		for (unsigned i = 0; i < r->n_ep; i++)
			csv_line(mbp_file_stream(f), &r->ep[i]);
		rc = mbp_file_commit(f);
	}
	if (rc < 0)
		fprintf(stderr, "pipetrain: --csv %s: cannot write it: %s\n", path,
			rc == -EEXIST ? "not a regular file" : strerror(-rc));
	return rc;
}

int pt_json_write(const pt_report *r)
{
	const pt_config *c = r->c;
	cJSON *root = cJSON_CreateObject(), *cfg = cJSON_AddObjectToObject(root, "config");
	cJSON *w = cJSON_AddArrayToObject(cfg, "layers");
	for (unsigned i = 0; i <= r->layers; i++)
		cJSON_AddItemToArray(w, cJSON_CreateNumber(r->widths[i]));
	cJSON_AddNumberToObject(cfg, "parameters", (double)r->params);
	cJSON_AddNumberToObject(cfg, "stages", r->stages);
	cJSON_AddNumberToObject(cfg, "threads", r->threads);
	cJSON_AddNumberToObject(cfg, "blas_threads", r->blas_threads ? r->blas_threads : 1);
	cJSON_AddStringToObject(cfg, "schedule", mbp_sched_name(c->schedule));
	cJSON *rc = cJSON_AddArrayToObject(cfg, "recompute"); /* the layers that recompute */
	for (unsigned l = 0; l < r->layers; l++)
		if (c->recompute >> l & 1)
			cJSON_AddItemToArray(rc, cJSON_CreateNumber(l));
	cJSON_AddNumberToObject(cfg, "batch", c->batch);
	cJSON_AddNumberToObject(cfg, "mb", c->mb);
	cJSON_AddBoolToObject(cfg, "mb_auto", r->plan.tried > 0);
	cJSON_AddNumberToObject(cfg, "mbs", r->mbs);
	cJSON_AddNumberToObject(cfg, "last_mb_rows", r->last_mb);
	cJSON_AddNumberToObject(cfg, "epochs", r->epochs_total);
	cJSON_AddStringToObject(cfg, "optimizer", c->optim == MBP_OPTIM_SGD ? "sgd" : "adamw");
	cJSON_AddNumberToObject(cfg, "lr", c->lr);
	cJSON_AddNumberToObject(cfg, "clip", c->clip);
	cJSON_AddNumberToObject(cfg, "seed", (double)c->seed);
	cJSON_AddNumberToObject(cfg, "train_rows", (double)r->train_rows);
	cJSON_AddNumberToObject(cfg, "val_rows", (double)r->val_rows);
	cJSON_AddNumberToObject(cfg, "test_rows", (double)r->test_rows);
	cJSON_AddNumberToObject(cfg, "steps_per_epoch", (double)r->steps_per_epoch);
	cJSON_AddStringToObject(cfg, "blas", r->blas);
	if (r->blas_warning)
		cJSON_AddStringToObject(cfg, "blas_warning", r->blas_warning);
	else
		cJSON_AddNullToObject(cfg, "blas_warning");
	cJSON_AddStringToObject(cfg, "dense_kernel", r->kernel);
	cJSON *eps = cJSON_AddArrayToObject(root, "epochs");
	for (unsigned i = 0; i < r->n_ep; i++) {
		const pt_epoch *e = &r->ep[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddNumberToObject(o, "epoch", e->epoch);
		cJSON_AddNumberToObject(o, "step", (double)e->step);
		cJSON_AddNumberToObject(o, "train_loss", e->train_loss);
		cJSON_AddNumberToObject(o, "train_accuracy", e->train_acc);
		cJSON_AddNumberToObject(o, "val_accuracy", e->val_acc);
		cJSON_AddNumberToObject(o, "test_accuracy", e->test_acc);
		cJSON_AddNumberToObject(o, "test_loss", e->test_loss);
		cJSON_AddNumberToObject(o, "samples_per_s", e->samples_per_s);
		cJSON_AddNumberToObject(o, "bubble", e->bubble);
		cJSON_AddNumberToObject(o, "bubble_predicted", e->bubble_predicted);
		cJSON_AddNumberToObject(o, "seconds", e->seconds);
		cJSON_AddNumberToObject(o, "lr", e->lr);
		cJSON_AddItemToArray(eps, o);
	}
	cJSON *sts = cJSON_AddArrayToObject(root, "stages");
	for (unsigned s = 0; s < r->stages; s++) {
		const pt_stage_total *t = &r->st[s];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddNumberToObject(o, "first_layer", t->first);
		cJSON_AddNumberToObject(o, "last_layer", t->last - 1);
		/* the input gradient of its last layer is computed by the next stage */
		cJSON_AddBoolToObject(o, "hands_over", s + 1 < r->stages && r->st[s + 1].takes);
		cJSON_AddNumberToObject(o, "thread", t->thread);
		cJSON_AddNumberToObject(o, "replicas", t->replicas ? t->replicas : 1);
		cJSON_AddNumberToObject(o, "cpu", t->cpu);
		cJSON_AddNumberToObject(o, "sharing", t->sharing);
		cJSON_AddItemToObject(o, "pin_error",
				      t->pin_error ? cJSON_CreateString(mbp_strerror(t->pin_error))
						   : cJSON_CreateNull());
		cJSON_AddNumberToObject(o, "compute_s", t->compute_s);
		cJSON_AddNumberToObject(o, "wait_s", t->wait_s);
		cJSON_AddNumberToObject(o, "bubble", r->wall_s > 0 ? 1 - t->compute_s / r->wall_s : 0);
		cJSON_AddNumberToObject(o, "stash_peak", t->stash_peak);
		cJSON_AddNumberToObject(o, "held_peak", t->held_peak);
		cJSON_AddNumberToObject(o, "hops", t->hops);
		cJSON_AddNumberToObject(o, "local_hops", t->local_hops);
		cJSON_AddNumberToObject(o, "profiled_us", t->profiled_us);
		cJSON_AddNumberToObject(o, "peak_activation_bytes", (double)t->act_peak_bytes);
		cJSON_AddNumberToObject(o, "stash_bytes_per_mb", (double)t->stash_row_bytes * c->mb);
		cJSON_AddNumberToObject(o, "recomputed_bytes_per_mb", (double)t->work_row_bytes * c->mb);
		cJSON_AddNumberToObject(o, "recompute_s", t->recompute_s);
		cJSON *rl = cJSON_AddArrayToObject(o, "recomputed_layers");
		for (unsigned l = t->first; l < t->last; l++)
			if (t->recompute >> l & 1)
				cJSON_AddItemToArray(rl, cJSON_CreateNumber(l));
		cJSON_AddItemToArray(sts, o);
	}
	if (r->autoplan) {
		cJSON *pl = mt_auto_json(r->autoplan), *m = cJSON_AddObjectToObject(root, "measured");
		cJSON_AddItemToObject(root, "plan", pl);
		cJSON_AddNumberToObject(m, "step_ms",
					r->steps_run ? r->wall_s * 1e3 / (double)r->steps_run : 0);
		cJSON_AddNumberToObject(m, "peak_bytes", (double)pt_measured_peak(r));
		cJSON_AddNumberToObject(m, "activation_peak_bytes", (double)r->act_peak_bytes);
		cJSON_AddNumberToObject(m, "state_bytes", (double)r->autoplan->state_bytes);
	}
	if (r->thr_left_out[0]) { /* the counts went wrong: null, not shown as if counted */
		cJSON_AddNullToObject(root, "thread_held_peak");
		cJSON_AddNullToObject(root, "thread_hops");
		cJSON_AddNullToObject(root, "thread_local_hops");
		cJSON_AddStringToObject(root, "thread_figures_left_out", r->thr_left_out);
	} else {
		mt_thread_figs_json(root, &r->thr); /* empty arrays with replicas */
		cJSON_AddNullToObject(root, "thread_figures_left_out");
	}
	cJSON_AddBoolToObject(root, "rebalance", r->c->rebalance);
	cJSON_AddNumberToObject(root, "moves", (double)r->moves);
	cJSON_AddNumberToObject(root, "split_bound", r->split_bound);
	cJSON_AddNumberToObject(root, "peak_activation_bytes", (double)r->act_peak_bytes);
	cJSON_AddNumberToObject(root, "activation_pool_bytes", (double)r->act_pool_bytes);
	cJSON_AddNumberToObject(root, "predicted_step_ms", r->plan.step_ns * 1e-6);
	cJSON_AddNumberToObject(root, "train_seconds", r->wall_s);
	cJSON_AddNumberToObject(root, "start_step", (double)r->start_step);
	cJSON_AddNumberToObject(root, "epochs_completed", pt_epochs_reached(r));
	cJSON_AddNumberToObject(root, "test_accuracy", r->final_test_acc);
	if (r->stopped)
		cJSON_AddStringToObject(root, "stopped", r->stopped);
	else
		cJSON_AddNullToObject(root, "stopped");
	return mt_json_print(stdout, root) || fflush(stdout) ? -1 : 0;
}

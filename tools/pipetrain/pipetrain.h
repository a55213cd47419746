/*
 * pipetrain: trains a classifier (an MLP of include/mbpipe/model_train.h) on Fashion-MNIST with the
 * engine's pipeline-parallel trainer (include/mbpipe/train.h) and writes checkpoints that pipeserve
 * serves. Built on the public API only.
 *
 *   options.c  the command line into a pt_config (every bad value: one line, exit 2)
 *   stages.c   the glue between the trainer's stage callbacks and the model's stage functions
 *   output.c   the per-epoch lines, the progress bar, the final summary, --json, --csv and --log
 *   plot.c     --plot: the loss and accuracy curves as an SVG picture
 *   main.c     data, model, trainer, the epoch loop, checkpoints, signals
 */
#ifndef PIPETRAIN_H
#define PIPETRAIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <mbpipe.h>

#include "tools/shared/mlptrain.h" /* the stages, the loss, the profile, --plan auto */

#define PT_MAX_LAYERS MT_MAX_LAYERS

/* --hand-over: where a stage computes the input gradient of the previous stage's last layer */
typedef enum { PT_HAND_OVER_AUTO, PT_HAND_OVER_ALL, PT_HAND_OVER_OFF } pt_hand_over;

typedef struct pt_config {
	const char *data;	 /* folder of the IDX files */
	const char *save;	 /* checkpoint (weights); the optimizer state goes beside it */
	const char *model;	 /* start from this file */
	const char *csv;	 /* "-": standard output */
	const char *trace;	 /* Chrome trace of the last step */
	const char *predictions; /* the test set's predicted classes, one a line */
	const char *log;	 /* one CSV row per step; "-": standard output */
	const char *plot;	 /* the SVG picture of the curves */
	uint32_t widths[PT_MAX_LAYERS + 1];
	unsigned layers; /* 0: not given (from --model, or the default) */
	unsigned stages; /* 0: one per allowed CPU, at most one per layer */
	unsigned threads;
	unsigned blas_threads; /* 0: leave OpenBLAS at one thread (the stages' setting) */
	bool pin;
	pt_hand_over hand_over;		   /* --hand-over */
	uint64_t recompute;		   /* --recompute: bit i, layer i recomputes (all: every bit) */
	unsigned replicas[MBP_MAX_STAGES]; /* --replicas: each stage's; nreplicas 0: one each */
	unsigned nreplicas;
	mbp_sched_kind schedule;
	const char *schedule_file; /* --schedule-file: a schedule as text (MBP_SCHED_CUSTOM) */
	uint32_t batch, mb;	   /* mb 0: --mb auto (chosen by pt_plan_make) */
	unsigned epochs;
	mbp_optim_kind optim;
	double lr, min_lr, weight_decay, momentum, clip;
	int64_t warmup; /* -1: automatic */
	uint64_t seed;
	uint32_t limit; /* 0: every training sample */
	uint32_t val;	/* held-out validation rows */
	bool json, quiet, demo;
	int progress;		   /* -1: when standard error is a terminal */
	bool plan_auto, plan_only; /* --plan auto, --plan-only */
	const char *plan_points;   /* --plan-points: plans to predict from the plan's profile */
	uint64_t memory;	   /* --memory: the budget in bytes; 0: none (no limit) */
	unsigned nsplit;	   /* --split: the first layer of stages 1 .. nsplit (0: not given) */
	unsigned split[MBP_MAX_STAGES];
	unsigned given; /* PT_GIVEN_* bits: the options the command line set (--plan auto refuses them) */
	/* --rebalance[=window=N,threshold=X,patience=N]: re-split between steps as the measurements say */
	bool rebalance;
	unsigned rb_window; /* steps between looks */
	mbp_model_rebalance_rule rb_rule;
} pt_config;

enum {
	PT_GIVEN_STAGES = 1,
	PT_GIVEN_SCHEDULE = 2,
	PT_GIVEN_MB = 4,
	PT_GIVEN_RECOMPUTE = 8,
	PT_GIVEN_HAND_OVER = 16,
	PT_GIVEN_SPLIT = 32,
	PT_GIVEN_REPLICAS = 64,
};

/* Parse the command line. @return 0; 1 when --help or --version printed and the run is over; -1 with a
 * one-line reason in err. */
int pt_options_parse(int argc, char **argv, pt_config *c, char *err, size_t errlen);
/* The optimizer file beside a checkpoint: "x.safetensors" -> "x.optim.safetensors", else "x.optim". */
void pt_optim_path(const char *save, char *out, size_t n);

/* ---- the stages (stages.c) ---- */

/* --schedule auto: the schedule mbp_schedule_build makes for the split (stage s: layers [first[s],
 * first[s + 1]), gives[s]: it hands its last layer's input gradient over) from the profiled F, B_in and
 * B_w summed per stage as pt_predict sums them, on T threads, holding at most what 1F1B holds there.
 * Pair with mbp_schedule_destroy. @return 0 or a negative errno. */
int pt_auto_schedule(const mt_costs *pc, const unsigned *first, const bool *gives, unsigned S, uint32_t mbs,
		     unsigned T, mbp_schedule **sc);
/* Split the L layers into S stages minimising the slowest. OFF: mbp_model_partition over the layer
 * costs. AUTO: the same, unless a split in which stage s may hand its last layer's input gradient over
 * to stage s + 1 (gives[s]; only where can_give[layer]: mbp_mlp_stages_hand_over) is faster by more than
 * 2%. ALL: the best split with a hand-over at every boundary that allows one. @return 0, -ENOMEM or
 * mbp_model_partition's error. */
int pt_partition(const double *cost, const double *cost_in, const bool *can_give, unsigned L, unsigned S,
		 pt_hand_over mode, mbp_model_plan *plan, bool *gives);

/* The step the schedule sc predicts for a split (stage s: layers [first[s], first[s + 1]), gives[s]: it
 * hands its last layer's input gradient over): sc played by mbp_schedule_simulate on T threads with the
 * stages' costs from pc. @return its makespan, INFINITY when it cannot be played. */
double pt_predict(const mt_costs *pc, const unsigned *first, const bool *gives, unsigned S, unsigned T,
		  const mbp_schedule *sc);
/* plan->stage_ns (each stage's operations for one micro-batch, from pc), slowest_ns, mean_ns and balance
 * of the split plan->first, gives. */
void pt_split_figures(const mt_costs *pc, unsigned S, mbp_model_plan *plan, const bool *gives);
/* Improve a split (plan->first, gives) by the schedule's step: among the splits with one boundary moved
 * by a layer or one hand-over changed (ALL keeps one wherever allowed, OFF none, AUTO chooses), take the
 * one with the shortest predicted step while it is shorter by more than 0.5%. Then plan->stage_ns (each
 * stage's operations for one micro-batch), slowest_ns, mean_ns and balance describe the result.
 * @return its predicted step (pt_predict). */
double pt_refine(const mt_costs *pc, const bool *can_give, unsigned L, unsigned S, unsigned T,
		 pt_hand_over mode, const mbp_schedule *sc, mbp_model_plan *plan, bool *gives);

/* How the run is cut: the micro-batch size, the stages' layers and hand-overs, and what the schedule
 * predicts for them. */
#define PT_MB_CANDIDATES 12
typedef struct pt_plan {
	uint32_t mb;
	mbp_model_plan split; /* first[]; stage_ns: each stage's operations for one micro-batch */
	bool gives[MBP_MAX_STAGES];
	double
	    step_ns; /* the schedule played with the profiled costs: a step's operations (0: not profiled) */
	double seq_ns;	     /* the same step's operations one after the other on one thread */
	unsigned threads;    /* the threads the schedule was played on (a chunked one: its own) */
	mbp_schedule *sched; /* --schedule auto: the schedule built for the split (pt_plan_clear) */
	mt_costs costs; /* the profile the split was made from (--rebalance: scaled by the measurements) */
	unsigned tried; /* --mb auto: the sizes profiled and the step each predicts */
	uint32_t tried_mb[PT_MB_CANDIDATES];
	double tried_ns[PT_MB_CANDIDATES];
} pt_plan;
/* Profile the layers (at c->mb, or with --mb auto at each power of two from 16 up to the batch), split
 * them (pt_partition), then move a boundary by a layer or change a hand-over while that shortens the step
 * the schedule the run follows predicts (mbp_schedule_simulate with the profiled costs): `file` when not
 * NULL (--schedule-file; --mb auto is then refused, -EINVAL, as the file fixes the micro-batches), else
 * c->schedule placed on c->threads (a chunked one on its own threads) or, for MBP_SCHED_AUTO, the one
 * pt_auto_schedule builds for the split, rebuilt for the refined split (p->sched, the shorter of the two).
 * With --mb auto, the size whose step is the shortest; a size the schedule cannot place is skipped. One
 * stage with a given --mb and a fixed schedule: nothing to profile. Pair with pt_plan_clear.
 * @return 0 or a negative errno (-EINVAL: no size the schedule can place). */
int pt_plan_make(mbp_mlp *n, const pt_config *c, unsigned S, unsigned T, const bool *can_give,
		 const mbp_schedule *file, pt_plan *p);
/* The split and schedule for given layer costs (pt_plan_make after its profile; --rebalance's fresh plan
 * from the measured costs): split (pt_partition, or --split), refined against the schedule the run follows
 * (the file's; the kind placed on c->threads; auto: built for the balanced split, refined against, rebuilt
 * for the result, the shorter kept). Pair with pt_plan_clear. @return 0 or a negative errno (-EINVAL: the
 * schedule cannot place the stages). */
int pt_plan_costs(const mt_costs *pc, unsigned L, const pt_config *c, unsigned S, unsigned T,
		  const bool *can_give, const mbp_schedule *file, pt_plan *p);
/* Destroy p->sched (NULL after). */
void pt_plan_clear(pt_plan *p);
/* ---- output (output.c) ---- */

typedef struct pt_epoch {
	unsigned epoch;
	uint64_t step; /* updates done at its end */
	double train_loss, train_acc, val_acc, test_acc, test_loss;
	double samples_per_s, bubble, bubble_predicted, seconds, lr;
} pt_epoch;

/* One step, as --log writes it and --plot draws it. */
typedef struct pt_step {
	uint64_t step; /* updates done at its end */
	unsigned epoch;
	double loss, acc;     /* the mini-batch's mean loss and accuracy */
	double lr, grad_norm; /* the rate of this update; the gradient's global norm before clipping */
	double samples_per_s, step_ms, bubble, elapsed_s;
} pt_step;

/* A series of (step, value) points for --plot, kept to at most PT_CURVE_MAX points however long the run:
 * when full, neighbours are merged in pairs (their mean at the later step) and each point then stands for
 * twice as many steps. */
#define PT_CURVE_MAX 2048
typedef struct pt_curve {
	double x[PT_CURVE_MAX], y[PT_CURVE_MAX];
	unsigned n;
	uint64_t per;	       /* steps per point */
	uint64_t pend_n;       /* steps in the point being filled */
	double pend_x, pend_y; /* its last step and its sum */
} pt_curve;

/* Add one finite value at step x (a non-finite one is left out). */
void pt_curve_add(pt_curve *c, double x, double y);

typedef struct pt_stage_total {
	unsigned first, last, thread;
	bool takes; /* computes the input gradient of layer first - 1 (handed over) */
	int cpu;
	int pin_error;	  /* 0, or why its thread's pin failed (it then runs unpinned) */
	unsigned sharing; /* other threads pinned to its CPU */
	double compute_s, wait_s;
	unsigned stash_peak, held_peak;
	size_t stash_row_bytes, work_row_bytes; /* per row of a micro-batch: stashed, recomputed */
	uint64_t recompute;			/* its layers that recompute (bit i: layer i) */
	double recompute_s;			/* time in its recomputations (also in compute_s) */
	uint64_t act_peak_bytes;		/* most activation bytes it held at once in a step */
	double profiled_us; /* the layers' profiled cost per micro-batch (0: not profiled, one stage) */
	unsigned replicas;  /* --replicas: its threads (their figures summed above) */
	unsigned hops, local_hops; /* the last step's: handed to another thread, passed on its own */
} pt_stage_total;

typedef struct pt_report {
	const pt_config *c;
	unsigned layers, stages, threads, mbs, blas_threads;
	uint32_t last_mb; /* rows of the step's last micro-batch (mb, unless batch is not a multiple) */
	uint32_t widths[PT_MAX_LAYERS + 1];
	uint64_t params, train_rows, val_rows, test_rows, steps_per_epoch;
	unsigned start_epoch, epochs_total;
	uint64_t start_step; /* updates already done when the run started (a resume) */
	pt_epoch *ep;
	unsigned n_ep;
	pt_stage_total st[MBP_MAX_STAGES];
	pt_plan plan;		 /* the micro-batch size and split, and what the schedule predicts for them */
	double wall_s;		 /* total training time (steps only) */
	uint64_t act_peak_bytes; /* most activation bytes held at once over every stage in a step */
	uint64_t act_pool_bytes; /* the activation pool at its high-water mark (buffers x their size) */
	double split_bound;	 /* profiled: sum of the layers over the slowest stage (0: not profiled) */
	double final_test_acc;
	const char *stopped; /* NULL: completed; else why it stopped */
	const char *blas;
	const char *blas_warning; /* mbp_blas_warning(): NULL when the kernel fits the CPU */
	const char *kernel;	  /* the dense kernel's name (dense_kernel_name) */
	pt_curve *step_loss;	  /* each step's loss, for --plot (NULL without it) */
	const mt_auto *autoplan;  /* --plan auto: the plan (NULL otherwise) */
	uint64_t steps_run;	  /* steps this run took (for the measured mean step) */
	mt_thread_figs thr;	  /* each thread's of the last step (threads 0: replicated, not shown) */
	char thr_left_out[192];	  /* not empty: thr is left out from then on, and why (warned once) */
	uint64_t moves;		  /* --rebalance: the moves to a fresh split */
} pt_report;

/* The epochs completed when the run ended, those of the checkpoint it resumed included. */
unsigned pt_epochs_reached(const pt_report *r);

/* The name of an operation in messages: "forward", "backward", "B_in", "B_w", "update". */
const char *pt_op_name(mbp_op_kind k);
/* Human output goes here: standard output, or standard error when --json or --csv - take standard output. */
FILE *pt_human(const pt_config *c);
void pt_progress_init(int mode);
/* eta_s: the seconds left in the whole run (< 0: not known yet). */
void pt_progress(unsigned epoch, unsigned epochs, uint64_t done, uint64_t total, double samples_per_s,
		 double loss, double eta_s);
void pt_progress_end(void);
void pt_print_header(const pt_report *r);
void pt_print_epoch(const pt_report *r, const pt_epoch *e);
void pt_print_summary(const pt_report *r);
/* @return 0 or -1 (the reason printed). */
int pt_csv_open(const pt_config *c, FILE **f);
void pt_csv_row(FILE *f, const pt_epoch *e);
/* --log: the header line at open, a row per step (written as it ends). @return 0 or -1 (the reason printed). */
int pt_log_open(const pt_config *c, FILE **f);
void pt_log_row(FILE *f, const pt_step *s);
/* --plot: the picture from the report's epochs and step_loss, written to a temporary file in the same
 * folder and renamed over c->plot (never over anything but a regular file). @return 0, or -1 with the
 * reason in err. (plot.c) */
int pt_plot_write(const pt_report *r, char *err, size_t errlen);
/* --csv FILE: the header and every epoch so far, written by rename (a line on stderr on failure). */
int pt_csv_save(const pt_report *r);
int pt_json_write(const pt_report *r);
/* The measured peak memory as the plan counts it: the trainer's activation peak + the plan's state. */
uint64_t pt_measured_peak(const pt_report *r);

#endif

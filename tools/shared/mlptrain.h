/*
 * What the tools that train an MLP share (pipetrain, and pipebench's planned training workload): the
 * trainer's stage callbacks onto the model's stage functions and the loss (stages.c), each layer's
 * profile, and the planner run from that profile: the plan, its lines, its JSON and the refusal of a
 * budget no plan fits (autoplan.c); and each thread's held peak and hops of a step, as both tools show
 * them (threads.c). Built on the public API only, into a convenience library both tools
 * link (tools/shared.mk); the tools' own glue stays in their folders.
 */
#ifndef MBP_TOOLS_MLPTRAIN_H
#define MBP_TOOLS_MLPTRAIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <mbpipe.h>

#define MT_MAX_LAYERS 64

/* ---- the stages (stages.c) ---- */

/* What every stage of one model reads and writes. */
typedef struct mt_shared {
	mbp_mlp *n;
	unsigned layers;
	uint32_t classes;
	float clip;
	double layer_sq[MT_MAX_LAYERS]; /* each layer's squared gradient norm, after each update */
	/* each piece's squared norm (mbp_mlp_stage_pieces), written by the check of the stage (or
	 * replica) that holds it; layer l's pieces at [piece0[l], piece0[l + 1]) (mt_shared_pieces; the
	 * caller frees piece_sq) */
	double *piece_sq;
	size_t piece0[MT_MAX_LAYERS + 1];
	/* rows classified right in the last step (the last stage's replicas add; the caller clears it) */
	_Atomic uint64_t correct;
	int64_t fault_step; /* PIPETRAIN_FAULT: a NaN logit at this step; -1: none */
	/* PIPETRAIN_SLOW=STEP:LAYER:US (perf/train_rebalance.sh): from step STEP on, every forward of the
	 * stage that holds LAYER spins US more microseconds: costs that change mid-run, in real time */
	uint64_t step; /* the step under way (the caller writes it between steps) */
	int64_t slow_step;
	unsigned slow_layer;
	double slow_ns;
} mt_shared;

typedef struct mt_stage {
	mbp_mlp_stage *st;
	mt_shared *sh;
	unsigned index, first, last; /* layers [first, last) */
	char name[32];
} mt_stage;

/* Make stage `index` of layers [first, last) at micro-batches of mb rows into p (p->st: pair with
 * mbp_mlp_stage_destroy): it takes the input gradient of layer first - 1 from `giver` when that is not
 * NULL (mbp_mlp_stages_hand_over), and its layers whose bit is set in `recompute` recompute. @return 0
 * or a negative errno (p->st may then be set: destroy it). */
int mt_stage_make(mt_stage *p, mt_shared *sh, unsigned index, unsigned first, unsigned last, uint32_t mb,
		  mt_stage *giver, uint64_t recompute);
/* Fill a trainer stage descriptor for p. */
void mt_stage_desc(mt_stage *p, mbp_train_stage_desc *d);
/* The table of pieces' norms of sh->n (sh->piece_sq, sh->piece0), before any stage's step; free
 * sh->piece_sq after the last. @return 0, -ENOMEM. */
int mt_shared_pieces(mt_shared *sh);
/* The trainer's loss: softmax cross-entropy on int32 labels (arg: the mt_shared). */
int mt_loss(void *arg, const mbp_train_io *io, double *loss);

/* Each layer's operation costs in ns at a micro-batch of `rows` (the fastest of several runs on this
 * thread, each operation timed alone). b_in is the input-gradient operation (for layer 0 only its
 * activation's gradient: nothing before it needs an input gradient), all of which a hand-over moves to
 * the next stage. */
typedef struct mt_costs {
	uint32_t rows;
	double f[MT_MAX_LAYERS], b_in[MT_MAX_LAYERS], b_w[MT_MAX_LAYERS];
} mt_costs;
/* Profile every layer at `rows` rows, the fastest of `reps` runs after one warm-up. Leaves the gradients
 * zero. @return 0 or a negative errno. */
int mt_profile(mbp_mlp *n, uint32_t rows, unsigned reps, mt_costs *pc);

/* ---- the planner run (autoplan.c) ---- */

/* What the planner chose and from what. */
typedef struct mt_auto {
	mbp_train_plan plan;
	uint64_t budget;	  /* --memory (UINT64_MAX: none) */
	uint64_t need;		  /* the smallest budget a plan fits */
	uint64_t state_bytes;	  /* parameters, gradients, moments, the packed or padded copy */
	double profile_s;	  /* the profile's wall time */
	unsigned sizes, measured; /* micro-batch sizes planned, of them measured (the rest scaled) */
	uint32_t mb[MBP_PLAN_MAX_SIZES];
	/* the profile: each size's layer costs (cost[k * layers + i]), each layer's bytes a row */
	unsigned layers;
	uint32_t batch;
	mbp_op_costs cost[MBP_PLAN_MAX_SIZES * MT_MAX_LAYERS];
	uint64_t keep[MT_MAX_LAYERS], out[MT_MAX_LAYERS];
} mt_auto;

/* Profile the layers at the powers of two from 16 rows up to the batch (at most about 4 s: sizes the
 * time leaves out are scaled from the largest measured, per row), then mbp_mlp_plan with the budget
 * (`memory` bytes, 0: none) on 1 .. threads (0: cpus) threads, at most cpus. @return 0, -ENOSPC (a->need
 * says what would fit), or a negative errno. */
int mt_auto_plan(mbp_mlp *n, uint32_t batch, uint64_t memory, unsigned threads, unsigned cpus, mt_auto *a);
/* Predict another plan from a's profile as the planner would (mbp_mlp_plan_predict): pl's threads,
 * stages, schedule, mb, first[] and recompute in, its figures out. @return 0 or -EINVAL. */
int mt_auto_predict(const mt_auto *a, mbp_train_plan *pl);
/* --plan-points: each line of f a plan to predict from a's profile, "SCHEDULE THREADS MB RECOMPUTE SPLIT"
 * (RECOMPUTE: none, all or the recomputing stages 0,2; SPLIT: the first layers of stages 1 .. S-1, or -
 * for one stage; S is THREADS, twice that for a chunked kind; '#' starts a comment), as a JSON array (cJSON
 * *) of the points with their predicted step, bubble and peak, and whether it fits a's budget
 * (predicted_step_ms null: a point the planner cannot weigh). NULL with err set: a line that is not a
 * point, or no memory. */
void *mt_auto_points_json(const mt_auto *a, FILE *f, char *err, size_t n);
/* The plan's three lines (human output), each starting "plan: ". */
void mt_auto_print(FILE *f, const mt_auto *a);
/* The plan as a JSON object (cJSON *, untyped here to keep cJSON out of this header). */
void *mt_auto_json(const mt_auto *a);
/* The one line that refuses a budget no plan fits (after -ENOSPC), naming the smallest that fits in MiB
 * rounded up: "--memory 0.06 MiB: no plan fits (...); the smallest budget that fits is 2 MiB". */
void mt_auto_refusal(const mt_auto *a, char *buf, size_t n);
/* Print a JSON document (cJSON *) to f, a line, and free it. @return 0, or -1 (out of memory). */
int mt_json_print(FILE *f, void *root);
/* A run's peak memory as the plan counts it: the trainer's activation peak (act_peak_bytes) + the state. */
uint64_t mt_auto_peak(const mt_auto *a, uint64_t act_peak_bytes);

/* ---- each thread's figures of a step (threads.c) ---- */

/* What each thread of a trainer held and handed on in a step: the schedule's held peak over the thread's
 * chunks (mbp_schedule_thread_figures: a chunk's micro-batch counts one), and the trainer's counts of the
 * outputs and input gradients its stages handed to another thread (a ring) and passed between its own
 * chunks (no ring), summed over its stages (mbp_train_stage_stats.hops, local_hops). */
typedef struct mt_thread_figs {
	unsigned threads; /* 0: none (no step yet, or a replicated trainer: its copies are not threads of
			     the schedule) */
	uint32_t held[MBP_MAX_STAGES], hops[MBP_MAX_STAGES], local_hops[MBP_MAX_STAGES];
} mt_thread_figs;
/* Fill f from a step that followed sc on `threads` threads, with the stage figures ss[0 .. stages).
 * @return 0; -EINVAL (sc has no such threads: f->threads is 0); -EPROTO: a thread's counts are not the
 * schedule's (f has the counts; why, when not NULL, says which thread and what each says). */
int mt_thread_figs_get(mt_thread_figs *f, const mbp_schedule *sc, unsigned threads,
		       const mbp_train_stage_stats *ss, unsigned stages, char *why, size_t n);
/* The figures as every text table shows them, "t 2,1; h 8,8 + 0,0": the held peaks, then the hops to
 * another thread + the passes between its own chunks, thread by thread; "-" when f has no threads. */
void mt_thread_figs_str(const mt_thread_figs *f, char *buf, size_t n);
/* Add thread_held_peak, thread_hops and thread_local_hops (arrays, a number a thread) to o (cJSON *). */
void mt_thread_figs_json(void *o, const mt_thread_figs *f);

#endif

/*
 * pipebench: shared types of the throughput tool.
 *
 * The tool is split by job, one file each: options.c (command line), synthetic.c and mlp.c (the two
 * pipeline workloads, each a list of stage descriptors plus an input filler and an output check), measure.c (the
 * sequential baseline and one pipeline per micro-batch size, visited a few batches at a time, collecting
 * statistics and the timeline of one batch), interleave.c (the measurement schedule: every candidate and
 * the baseline visited in turn, A B C .. C B A, until the intervals are tight or the time is up),
 * noise.c (what other processes take of the CPUs), stats.c (intervals of medians, paired comparisons,
 * the consistency checks), predict.c (the bubble model and the choice of the size), output.c (table,
 * JSON, CSV, and the lines on standard error), gantt.c (the terminal timeline) and progress.c (the bar on
 * standard error). main.c ties them together. train.c is the training workload (--workload=train): the
 * trainer's three schedules as arms, with its own table, CSV and JSON in output.c and its chart in
 * gantt.c; with --plan=auto it is plan.c instead: the planner pipetrain runs (tools/shared), its plan
 * trained with. mpi.c is the run under mpirun (the ranks' protocol), with measure.c's stamped stages and
 * its table and JSON in output.c.
 *
 * The measurement layer does not know what it measures: an arm (pb_arm) is anything with a visit function
 * that runs some unmeasured and some measured units and returns the measured rate. A new workload (training
 * steps under a schedule, say) plugs in as more arms: interleave.c repeats them, noise.c marks loud
 * rounds, stats.c compares them and pb_choose() picks among them.
 *
 * Only the public API is used: <mbpipe.h> and its headers, never lib/ (the helpers shared by the tools are
 * util/'s).
 */
#ifndef PIPEBENCH_H
#define PIPEBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <mbpipe.h>

#include "tools/shared/mlptrain.h"
#include "util/clock.h" /* mbt_now_ns: CLOCK_MONOTONIC, the clock of the engine's job stamps */

#define PB_MAX_SIZES	   64  /* micro-batch sizes in one sweep */
#define PB_ERR_MAX	   256 /* one error line */
#define PB_PLAN_MAX_LAYERS 64  /* --widths: layers of a planned MLP (tools/shared's MT_MAX_LAYERS) */

#define PB_CONFIDENCE	 0.95 /* of every interval */
#define PB_TIE_MARGIN	 0.03 /* a size within this share of the best's throughput ties with it */
#define PB_CHECK_SLACK	 0.05 /* a speed-up may exceed its bound by this share before it is flagged */
#define PB_ACCOUNT_SLACK 0.10 /* busy + starved + blocked may miss the window by this share */
#define PB_LOUD_SHARE	 0.10 /* a row is loud when more of its repeats than this ran on a loud machine */

/* Exit statuses (documented in pipebench.1). */
enum { PB_EXIT_OK = 0, PB_EXIT_FAIL = 1, PB_EXIT_USAGE = 2 };

enum pb_workload_kind { PB_WL_MLP, PB_WL_SYNTHETIC, PB_WL_TRAIN };
enum pb_format { PB_FMT_TABLE, PB_FMT_JSON, PB_FMT_CSV };

/* Everything the command line decides. Zero in a field marked "0: default" means the default is resolved
 * later, when the workload and the allowed CPUs are known (see pb_config_resolve()). */
typedef struct pb_config {
	enum pb_workload_kind workload;
	enum pb_format format;
	unsigned stages;	/* 0: default */
	unsigned ncpus;		/* 0: every allowed CPU */
	int cpus[MBP_MAX_CPUS]; /* --cpus, validated against the allowed set */
	uint32_t batch;		/* rows per batch; 0: default */
	const char *mb_spec;	/* --mb as given: "16", "1,4,16", "1-64", "8-64:8", "auto" */
	unsigned nsizes;	/* resolved sizes, ascending, unique */
	uint32_t sizes[PB_MAX_SIZES];
	unsigned batches;	  /* repeats per size at least */
	double duration_s;	  /* time budget of the repeats beyond that */
	double tolerance;	  /* stop when every interval is within this share of its median; 0: never */
	double wait_quiet_s;	  /* wait this long at most for other processes to leave the CPUs */
	unsigned warmup;	  /* unmeasured batches at the start of every visit */
	long spin_us;		  /* < 0: the engine's default */
	const char *engine_opts;  /* --opts key=value,... for mbp_opts_parse() */
	double latency_target_ms; /* 0: none */
	const char *trace_path;	  /* --trace */
	const char *svg_path;	  /* --svg: the Gantt chart as a picture */
	bool gantt;		  /* --gantt; on by default for the table output */
	bool gantt_set;
	int progress; /* -1: when stderr is a terminal, 0: never, 1: always */
	uint64_t seed;
	/* --replicas: auto (mlp: mbp_model_balance_replicas over the CPUs), or one value for every stage or
	 * one per stage; 0 values: none */
	bool replicas_auto;
	unsigned nreplicas;
	unsigned replicas[MBP_MAX_STAGES];
	/* synthetic */
	unsigned nwork;			/* entries in work_us (1: the same for every stage) */
	double work_us[MBP_MAX_STAGES]; /* busy work per row, per stage */
	unsigned nmb_us;
	double mb_us[MBP_MAX_STAGES]; /* fixed busy work per micro-batch, per stage */
	uint32_t row_bytes;	      /* bytes per row, touched by every stage */
	/* mlp */
	const char *model_path;
	unsigned layers;
	unsigned hidden;
	bool rebalance;		     /* --rebalance: the stages move layers while they run */
	unsigned rebalance_replicas; /* --rebalance-replicas: threads a stage for moves of the active
					replicas (0: moves keep the counts) */
	/* train */
	unsigned mbs;		   /* micro-batches per step; 0: default (4 x stages) */
	double costs[3];	   /* F : B_in : B_w, in units of unit_us */
	double unit_us;		   /* the base time of the costs */
	mbp_sched_kind scheds[16]; /* the schedules measured (--schedule), nscheds of them */
	unsigned nscheds;	   /* 0: gpipe, 1f1b, zbh1 */
	unsigned chunks;	   /* chunks per thread of interleaved and looped BFS (--chunks); 0: 2 */
	const char *schedule_file; /* --schedule-file: one more arm, "custom", following it */
	unsigned custom_stages;	   /* its stage count (the file's) */
	mbp_schedule *custom;	   /* the file's schedule, read once (train.c) */
	/* train --plan=auto (plan.c) */
	bool plan_auto, plan_only;
	uint64_t memory;  /* --memory: the budget in bytes; 0: none */
	unsigned nwidths; /* --widths; 0: the default */
	uint32_t widths[PB_PLAN_MAX_LAYERS + 1];
} pb_config;

/* ---- options.c ---- */

/* Parse argv into cfg. Returns 0 to go on, 1 when the run should stop successfully (--help, --version), -1
 * on a bad argument with one line (no program name, no newline) in err. */
int pb_options_parse(pb_config *cfg, int argc, char **argv, char *err, size_t errlen);
void pb_options_help(FILE *f);

/* --spin-us as the engines' spin budget, for the pipelines and the trainer alike: its microseconds in ns,
 * MBP_SPIN_NONE for 0 (no spin, as spin_us=0 in the options string); `unset` when it was not given. */
uint64_t pb_spin_ns(const pb_config *cfg, uint64_t unset);

/* The CPUs to use (cfg->cpus, or every allowed CPU when none were named). Returns their count, or -1 with
 * err set. `allowed` receives how many the process may use. */
int pb_cpus_resolve(pb_config *cfg, unsigned *allowed, char *err, size_t errlen);

/* Turn cfg->mb_spec into cfg->sizes for a batch of cfg->batch rows. 0, or -1 with err set. */
int pb_sizes_resolve(pb_config *cfg, char *err, size_t errlen);

/* ---- workloads (synthetic.c, mlp.c) ---- */

typedef struct pb_workload pb_workload;

struct pb_workload {
	const char *kind;	/* "synthetic" or "mlp" */
	char desc[200];		/* one line describing it */
	char blas[240];		/* the OpenBLAS kernel line (mlp), "" otherwise */
	char blas_warning[240]; /* mbp_blas_warning() (mlp), "" when none */
	char kernel[16];	/* the dense kernel's name (mlp: dense_kernel_name), "" otherwise */
	unsigned stages;
	size_t in_row_bytes;			/* width of an input row */
	size_t out_row_bytes;			/* width of a row leaving the last stage */
	mbp_stage_desc desc_of[MBP_MAX_STAGES]; /* the stages, when prepare is NULL */
	/* Make a set of stages for micro-batches of mb_rows into desc (the mlp rebalances its layers for that
	 * size), which also accept the whole batch at once, for the sequential baseline; several sets may be
	 * alive at once, one per size. *inst is what release() frees. NULL: desc_of serves every size. */
	int (*prepare)(pb_workload *w, uint32_t mb_rows, mbp_stage_desc *desc, void **inst, char *err,
		       size_t errlen);
	void (*release)(pb_workload *w, void *inst);
	/* The stages of inst run on p, added from prepare's descriptors (stamped), p not started yet: tell
	 * them (the mlp's rebalancing sets the active replicas there). 0, or -1 with err set. NULL: none. */
	int (*attach)(pb_workload *w, void *inst, mbp_pipeline *p, char *err, size_t errlen);
	/* inst's rebalancing statistics, zeroed when it is off. NULL: the workload never rebalances. */
	void (*rebalance_stats)(pb_workload *w, void *inst, mbp_model_rebalance_stats *out);
	/* Fill `rows` input rows. Every batch gets the same input: the check compares against one reference. */
	void (*fill)(pb_workload *w, void *in, size_t rows);
	/* The sequential reference output for micro-batches of mb_rows; NULL: the baseline's output is it. */
	int (*reference)(pb_workload *w, const void *in, void *ref, size_t rows, uint32_t mb_rows, char *err,
			 size_t errlen);
	/* Check an output against the reference (the synthetic workload recomputes its stamps instead, so it
	 * is independent of the baseline too). 0, or -1 with err set. */
	int (*check)(pb_workload *w, const void *out, const void *ref, size_t rows, char *err, size_t errlen);
	/* What a failing stage saw (its first failure), or NULL. Read after the pipeline stopped. */
	const char *(*stage_error)(pb_workload *w);
	/* Forget per-pipeline state (the stages' order tracking) before a new pipeline starts. */
	void (*reset)(pb_workload *w);
	void (*destroy)(pb_workload *w);
};

/* 0, or an exit status with err set: PB_EXIT_USAGE when the arguments are at fault (an unreadable model
 * file, more stages than layers), PB_EXIT_FAIL otherwise. */
int pb_synthetic_new(pb_workload **w, const pb_config *cfg, char *err, size_t errlen);
int pb_mlp_new(pb_workload **w, const pb_config *cfg, char *err, size_t errlen);

/* ---- stats.c ---- */

/* A median and its PB_CONFIDENCE interval (distribution-free: two order statistics). */
typedef struct pb_interval {
	double median, lo, hi;
	double min, max;
	unsigned n;
	bool ci; /* lo-hi reaches PB_CONFIDENCE (n >= 6); else it is the whole range */
} pb_interval;

void pb_interval_of(const double *v, unsigned n, pb_interval *iv);

/* The nearest-rank percentile p (0 to 1) of n values in any order; 0 when n is 0. */
double pb_percentile(const double *v, unsigned n, double p);

/* The interval's half-width over its median (the larger side); INFINITY without an interval. */
double pb_interval_rel(const pb_interval *iv);

/* The interval of the median of a[i] / b[i] (samples paired by round). 0, or -1 (n is 0, no memory). */
int pb_ratio_interval(const double *a, const double *b, unsigned n, pb_interval *iv);

/* How a size whose throughput over the best's has this interval (ratio) compares with the best. */
typedef enum {
	PB_VS_SLOWER,	 /* shown more than margin below: the interval's upper end is under 1 - margin */
	PB_VS_TIED,	 /* its median within the margin, and not shown below it */
	PB_VS_UNSETTLED, /* its median more than margin below, but the interval reaches the margin: this
			    measurement cannot tell it tied from slower */
} pb_versus;
pb_versus pb_versus_best(const pb_interval *ratio, double margin);

/* For an unsettled ratio: about how many times the repeats would bring the interval's upper end under
 * 1 - margin, were its width to shrink as 1 / sqrt(repeats) and its median to stay (at least 2, at most
 * PB_SETTLE_MAX). */
#define PB_SETTLE_MAX 100
double pb_settle_factor(const pb_interval *ratio, double margin);

/* ---- noise.c ---- */

/* The 1-minute load average, or -1 when /proc/loadavg cannot be read. */
double pb_loadavg(void);

/* What other processes took of the watched CPUs over some interval. */
typedef struct pb_noise_sample {
	double others;	/* CPUs' worth of time used by other processes (busy minus ours) */
	double steal;	/* CPUs' worth of time the hypervisor gave to other guests */
	double load1;	/* the 1-minute load average at the end (-1: unknown) */
	double seconds; /* length of the interval */
} pb_noise_sample;

typedef struct pb_noise_snap {
	uint64_t busy, steal; /* clock ticks of the watched CPUs in /proc/stat */
	uint64_t self_ns;     /* this process's CPU time */
	uint64_t wall_ns;
	bool ok;
} pb_noise_snap;

typedef struct pb_noise {
	int cpus[MBP_MAX_CPUS];
	unsigned ncpus;
	double threshold;	/* others + steal above this many CPUs: the machine is loud */
	pb_noise_sample before; /* the last sample before measuring */
	bool quiet_before;
	double waited_s;
	bool available; /* /proc/stat could be read */
	/* during the measurement, round by round */
	unsigned rounds, loud_rounds; /* windows of one or more rounds */
	double others_s, steal_s, seconds, others_max;
	bool last_loud;
	double paused_s; /* waited after loud windows */
	unsigned pauses;
	pb_noise_snap mark;
} pb_noise;

/* Watch the CPUs the stages use; loud above 10% of their time used by others (at least 0.1 CPU). */
void pb_noise_init(pb_noise *nz, const int *cpus, unsigned ncpus);
/* Sample 0.25 s windows until three in a row are quiet or max_wait_s has passed (0: one window). */
void pb_noise_settle(pb_noise *nz, double max_wait_s);
bool pb_noise_loud(const pb_noise *nz, const pb_noise_sample *s);
/* Measurement begins: pb_noise_mark(). After each round pb_noise_round() says whether the window that
 * ended was loud (1) or quiet (0), or -1 when it is shorter than 0.5 s yet (the ticks of /proc/stat are
 * 10 ms) and goes on into the next round; `last` closes it whatever its length. */
void pb_noise_mark(pb_noise *nz);
int pb_noise_round(pb_noise *nz, bool last);
/* After a loud window: sample 0.25 s windows until one is quiet, at most max_s; a new round begins after
 * it. Returns the seconds waited. */
double pb_noise_pause(pb_noise *nz, double max_s);
/* The noise windows of a run measured in units (steps, rounds), kept by pb_noise_step(). Zeroed, then
 * pause_left set: the seconds the pauses after loud windows may take in all. */
typedef struct pb_noise_window {
	unsigned first, end; /* after a verdict: the units [first, end) the closed window covered */
	double pause_left;   /* what the pauses may still take */
	double paused_s;     /* the last pb_noise_step()'s pause (0: none): the run's clock leaves it out */
} pb_noise_window;
/* After the unit that brings the run to `units` done (pb_noise_mark() before the first): the window's
 * verdict from pb_noise_round() (1 loud, 0 quiet, -1 still open), with w->first/end set to the units it
 * covered; after a loud window that is not the `last`, pauses while w->pause_left lasts (nothing follows
 * the last window to be spared the noise). */
int pb_noise_step(pb_noise *nz, pb_noise_window *w, unsigned units, bool last);

/* ---- interleave.c ---- */

/* One thing to measure: a micro-batch size, the sequential baseline, a training schedule. */
typedef struct pb_arm {
	const char *label; /* for the progress bar */
	void *ctx;
	/* Run `warm` unmeasured units, then `units` measured ones; *rate: measured work per second. 0, or -1
	 * with err set (an invariant broke: the measurement stops). */
	int (*visit)(void *ctx, unsigned warm, unsigned units, double *rate, char *err, size_t errlen);
	/* filled by pb_interleave(): one sample per round, the same rounds for every arm */
	double *rate;
	uint8_t *loud; /* the round was loud */
	unsigned n, cap;
	double unit_s;	/* one unit's time, from the warm-up round */
	unsigned units; /* measured units per visit */
	pb_interval iv; /* of rate */
} pb_arm;

typedef struct pb_schedule {
	unsigned min_repeats; /* every arm gets at least this many */
	double tolerance;     /* then stop once every arm's interval is within this share; 0: at once */
	double budget_s;      /* or once this much time has passed since the first round */
	unsigned warmup;      /* unmeasured units at the start of every visit */
	double visit_s;	      /* measured units per visit: as many as fill this long (1 to 64) */
	double pause_s;	      /* after a loud round, wait for a quiet one; this long at most in all */
} pb_schedule;

/* The warm-up round (one visit each, discarded, which also times a unit), then rounds that visit every
 * arm once, in alternating order, until the schedule says stop. Returns 0, or -1 with err set. */
int pb_interleave(pb_arm *arms, unsigned n, const pb_schedule *s, pb_noise *nz, char *err, size_t errlen);
void pb_arm_fini(pb_arm *a);

/* ---- measure.c ---- */

/* One batch's timeline: when each stage computed each micro-batch, in ns from the batch's submission. */
typedef struct pb_timeline {
	uint32_t mbs; /* micro-batches */
	uint32_t stages;
	uint32_t mb_rows;
	uint64_t span_ns;	       /* submission to completion */
	uint64_t *t;		       /* [stage][mb][2]: begin, end; UINT64_MAX when not recorded */
	uint8_t share[MBP_MAX_STAGES]; /* stages on each stage's thread (0: 1) */
} pb_timeline;

typedef struct pb_stage_result {
	char name[MBP_STAGE_NAME_MAX];
	int cpu;
	int pin_error;
	unsigned thread; /* the worker thread running the stage (consecutive stages may share one) */
	uint64_t mbs;
	double busy, starved, blocked; /* shares of the measured window (a replicated stage: of its
					  replicas' windows, their mean), less the time parked */
	double parked;		       /* share of its threads' windows parked (--rebalance-replicas:
					  inactive replicas asleep), the engine's count */
	double service_us;	       /* mean time inside the stage function per micro-batch */
	unsigned replicas;	       /* those taking micro-batches at the window's end: all of them,
					  unless --rebalance-replicas keeps some parked */
	unsigned replicas_made;	       /* the stage's threads */
} pb_stage_result;

typedef struct pb_result {
	uint32_t rows; /* per batch */
	uint32_t mb_rows;
	uint32_t mbs;		  /* micro-batches per batch: ceil(batch / mb_rows) */
	unsigned batches;	  /* measured */
	double throughput;	  /* rows per second while a batch is in flight */
	double throughput_window; /* the engine's window throughput (includes the caller's gaps) */
	double p50_ms, p99_ms, mean_ms;
	double bubble;	      /* measured: 1 - sum(busy) / (stages x sum of batch latencies) */
	double bubble_window; /* the engine's idle share over the whole window */
	double bubble_predicted;
	double bubble_gpipe; /* (S-1)/(M+S-1) */
	double predicted_ms; /* sum(t_i) + (M-1) max(t_i), with replicas their recurrence (predict.c) */
	double predicted_period_us;    /* the slowest stage's period: max(t_i / r_i) */
	double predicted_rows_per_s;   /* rows / predicted_ms */
	bool balanced;		       /* the periods t_i / r_i: the largest within 10% of the smallest */
	double speedup;		       /* throughput / the sequential baseline's */
	double speedup_lo, speedup_hi; /* from the ends of both intervals */
	unsigned repeats;	       /* visits measured */
	pb_interval thr;	       /* rows/s, one sample per visit */
	const double *rate;	       /* those samples in round order (the arm's) */
	pb_interval bubble_iv;	       /* of the per-batch bubble */
	double bubble_all;	       /* over all batches at once: 1 - sum(busy) / (T x sum(latency)) */
	double inflight_share;	       /* share of the stages' window with a batch in flight */
	double stage_busy_ms;	       /* all stages' time inside their functions per batch */
	double loud_share;	       /* share of the repeats taken in loud rounds */
	bool loud;
	bool tied;	/* ties with the best size */
	bool unsettled; /* the measurement cannot tell it tied with the best from slower (pb_versus_best) */
	unsigned flags; /* PB_CHECK_* that failed */
	char check[PB_ERR_MAX + 160];
	unsigned stages;
	unsigned threads; /* worker threads: stages, unless stages outnumber CPUs (they then share);
			     those parked by --rebalance-replicas not counted */
	pb_stage_result st[MBP_MAX_STAGES];
	mbp_model_rebalance_stats rb; /* --rebalance: the moves and the plan in use at the end (on: false
					 without it) */
	pb_timeline tl;		      /* the last measured batch */
	int status;		      /* 0, or the first failure (an invariant broke) */
	char error[PB_ERR_MAX];
} pb_result;

typedef struct pb_baseline {
	unsigned runs;	/* batches measured */
	pb_interval ms; /* per visit: its mean batch time */
	pb_interval thr;
	double median_ms, min_ms, max_ms;
	double throughput; /* rows per second at the median */
	double loud_share;
	bool loud;
	mbp_stage_desc desc[MBP_MAX_STAGES]; /* the stages it runs, its own */
	void *ref;			     /* the reference output of the whole batch in one piece */
} pb_baseline;

/* State shared by the measurements of one invocation. */
typedef struct pb_bench {
	const pb_config *cfg;
	pb_workload *w;
	unsigned ncpus;
	unsigned allowed;
	void *in;  /* one batch of input */
	void *out; /* one batch of pipeline output */
	void *seq; /* the baseline's output */
	pb_baseline base;
	void *base_inst;  /* the workload's stages of the baseline, for release() */
	bool base_ref_ok; /* base.ref holds the reference (else the baseline's first output becomes it) */
	mbp_placement placement[MBP_MAX_STAGES];
	bool have_placement;
	unsigned replicas[MBP_MAX_STAGES];		   /* per stage, with the placement */
	int replica_cpu[MBP_MAX_STAGES][MBP_MAX_REPLICAS]; /* each replica's CPU, -1: unpinned */
	bool pin;		     /* the engine pins stages: the baseline pins its thread too */
	double load_start, load_end; /* 1-minute load average before and after (-1: unknown) */
	pb_noise noise;
} pb_bench;

int pb_bench_init(pb_bench *b, const pb_config *cfg, pb_workload *w, unsigned ncpus, unsigned allowed,
		  char *err, size_t errlen);
void pb_bench_fini(pb_bench *b);

/* The baseline as an arm (ctx: the pb_bench): the stages in order on one thread over the whole batch, on
 * a thread made for the visit (pinned where stage 0 runs), its output checked. Set base.desc first. */
int pb_baseline_visit(void *ctx, unsigned warm, unsigned units, double *rate, char *err, size_t errlen);
/* Fill b->base from the baseline's arm. */
void pb_baseline_sum(pb_bench *b, const pb_arm *arm);

/* A stage as the engine sees it: the workload's stage `inner`, stamped: the begin and end of the micro-batch
 * of sequence number k (within its job, or within a run across the ranks) go to rec[2k] and rec[2k + 1]
 * for k below cap. Only the stage's thread writes rec. The one wrapper of the pipelines in one process
 * and across the ranks. */
typedef struct pb_stamp {
	mbp_stage_desc inner;
	uint64_t *rec;
	size_t cap;
	/* the micro-batch's sequence number k; NULL: in->seq (within its job). Across the ranks each
	 * micro-batch enters a rank's pipeline as a job of its own, so the run's number is mbp_mpi_mb_seq. */
	uint64_t (*seq_of)(const mbp_mb *in);
} pb_stamp;
/* The descriptor to add: inner's, its functions wrapped, with s as their context (s outlives the run). */
mbp_stage_desc pb_stamp_desc(pb_stamp *s);

/* One micro-batch size as an arm: its stages, reference output and a started pipeline. `trace`: keep an
 * activity log. Returns 0, or r->status (-1) with r->error set; close it either way. */
typedef struct pb_cand pb_cand;
int pb_cand_open(pb_bench *b, uint32_t mb_rows, bool trace, pb_cand **c, pb_result *r);
int pb_cand_visit(void *ctx, unsigned warm, unsigned units, double *rate, char *err, size_t errlen);
/* Drain, check the engine's books, fill the result from what the visits collected and `arm`'s samples
 * (may be NULL), write the trace if asked, destroy. Returns r->status. */
int pb_cand_close(pb_cand *c, const pb_arm *arm, const char *trace_path);
void pb_result_fini(pb_result *r);

/* ---- predict.c ---- */

/* The bubble model for r's measured per-stage service times, threads and replicas (st[].service_us,
 * .thread, .replicas; threads, mbs, rows): fills predicted_ms, predicted_period_us, predicted_rows_per_s,
 * bubble_predicted, bubble_gpipe, balanced. */
void pb_predict(pb_result *r);

typedef struct pb_choice {
	unsigned chosen;      /* the size to use; n when none completed */
	unsigned best;	      /* the highest median throughput (among those meeting the latency target) */
	unsigned next;	      /* the largest size below the chosen one that is not tied; n: none */
	unsigned ntied;	      /* sizes tied with the best, the best included */
	unsigned unsettled;   /* sizes below the chosen one that the measurement cannot place (0: settled) */
	double settle_factor; /* then: about this many times the repeats would settle them */
	unsigned settle_repeats; /* that many repeats */
	pb_interval vs_best;	 /* chosen / best throughput, paired by round */
	pb_interval vs_next;	 /* chosen / next */
	bool latency_met;	 /* with a latency target: some size met it */
	char why[1400];
} pb_choice;

/* The size to use among `n` results (ascending sizes whose `rate` samples are paired by round): the
 * smallest whose throughput ties with the best (pb_versus_best() with `margin`), among the sizes whose p99
 * batch latency meets the target if one is set (none: the one with the lowest p99). Marks the tied and the
 * unsettled results. A smaller size that is unsettled is not chosen as if it were tied: the verdict says
 * that it is open and how many repeats would settle it. */
void pb_choose(pb_result *r, unsigned n, double latency_target_ms, double margin, pb_choice *c);

/* What pb_check() needs to know beyond the result. */
typedef struct pb_check_input {
	unsigned cpus;	/* the CPUs the stages may use */
	bool base_loud; /* the baseline's repeats ran on a loud machine */
	double base_ms; /* the baseline's median batch time */
} pb_check_input;

enum { PB_CHECK_SPEEDUP = 1, PB_CHECK_ACCOUNT = 2, PB_CHECK_BUBBLE = 4 };

/* Test r's figures against each other; failures go into r->flags and r->check (the first one, with its
 * likely cause): (1) speed-up <= min(threads, CPUs) x (1 - bubble), both at the favourable end of their
 * intervals, plus PB_CHECK_SLACK; (2) each thread's busy + starved + blocked = its window within
 * PB_ACCOUNT_SLACK; (3) the threads' mean busy share = in-flight share x (1 - bubble). (stats.c) */
void pb_check(pb_result *r, const pb_check_input *in);

/* ---- output.c ---- */

typedef struct pb_report {
	const pb_config *cfg;
	const pb_workload *w;
	const pb_bench *b;
	const pb_result *res;
	unsigned nres;
	pb_choice choice;
	const pb_result *single; /* the whole batch as one micro-batch, for the Gantt chart (may be NULL) */
	int status;		 /* exit status */
	char error[PB_ERR_MAX];
} pb_report;

/* The chosen size's result, or NULL when no size completed. */
static inline const pb_result *pb_best(const pb_report *rep)
{
	unsigned i = rep->choice.chosen;
	return i < rep->nres && rep->res[i].status == 0 ? &rep->res[i] : NULL;
}

/* An output file (--svg, --trace) can be written by rename (mbp_file_check): checked before measuring.
 * 0, or -1 with err set. */
int pb_output_check(const char *opt, const char *path, char *err, size_t errlen);
void pb_print_header(FILE *f, const pb_report *rep);
void pb_print_table(FILE *f, const pb_report *rep);
void pb_print_csv(FILE *f, const pb_report *rep);
int pb_print_json(FILE *f, const pb_report *rep);
/* The machine's lines, as every run prints them: what other processes took of the watched CPUs before
 * measuring (and how long --wait-quiet waited), and while measuring (its loud windows); `loud_note`,
 * when not NULL, ends that line: what the run marked loud and what it means ("rows marked 'loud' ..."). */
void pb_print_noise(FILE *f, const pb_noise *nz, double load_start, const char *loud_note);
/* The same as the JSON document's "noise" object (a cJSON *). */
void *pb_json_noise(const pb_noise *nz, bool loud_rows);

/* The tool's lines on standard error, "pipebench: <text>": pb_usage for a bad argument (" (try --help)"
 * after it; exit status 2), pb_failure for a failure while running (exit status 1). Under mpirun every
 * rank finds the same bad argument: rank 0 alone says it. Each returns its exit status. */
int pb_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int pb_failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The run under mpirun (mpi.c measures, these print): one row per micro-batch size. */
typedef struct pb_mpi_row {
	uint32_t mb_rows, mbs;
	unsigned batches;		 /* measured */
	pb_interval thr;		 /* rows/s, one sample per visit */
	double p50_ms, p99_ms;		 /* batch latency */
	double stage_us[MBP_MAX_STAGES]; /* each stage's mean time inside its function per micro-batch */
	double compute_us;		 /* the slowest stage's */
	double link_us[MBP_MAX_STAGES];	 /* the hop from rank r to r+1: the link's exposed time per mb */
	unsigned links;			 /* ranks whose link counters arrived */
	struct {
		uint64_t sent, received, credit_waits;
	} link[MBP_MAX_STAGES];
} pb_mpi_row;

typedef struct pb_mpi_report {
	const pb_config *cfg; /* cfg->nsizes rows */
	const char *desc;
	unsigned ranks, stages;
	unsigned first[MBP_MAX_STAGES], count[MBP_MAX_STAGES]; /* each rank's stages */
	int64_t clock_offset_ns[MBP_MAX_STAGES];	       /* each rank's clock minus rank 0's */
	double load;
	const pb_mpi_row *rows;
	unsigned best;
} pb_mpi_report;

void pb_print_mpi_table(FILE *f, const pb_mpi_report *rep);
int pb_print_mpi_json(FILE *f, const pb_mpi_report *rep);

/* ---- mpi.c (built when configure found MPI) ---- */

/* The run under mpirun: stages spread over the ranks, rank 0 measures and prints. `stages_default`: no
 * --stages was given (one stage per rank). Returns the exit status. */
int pb_mpi_main(pb_config *cfg, bool stages_default, int *argc, char ***argv);

/* ---- gantt.c ---- */

/* The width of the terminal on standard output, else $COLUMNS, else 100. */
unsigned pb_terminal_width(void);

/* Draw `a` (the chosen size) and `b` (the whole batch as one unit) side by side on one time scale, in at
 * most `width` columns. Either may be NULL. */
void pb_gantt_print(FILE *f, const pb_timeline *a, const pb_timeline *b, unsigned width);

/* ---- train.c ---- */

#define PB_TRAIN_SCHEDS 16 /* the most schedules of one run (--schedule), one arm each */

/* One schedule's measured training steps. Figures are medians over the measured steps (or visits). */
typedef struct pb_train_result {
	mbp_sched_kind kind;
	unsigned stages;     /* the trainer's: the chunks of a chunked schedule (each 1/chunks of a stage) */
	unsigned chunks;     /* chunks per thread (1: a block schedule, whole stages) */
	mbp_schedule *sched; /* the schedule the arm follows (its placement, for the charts); the report's */
	unsigned threads;
	unsigned repeats;	 /* visits measured */
	unsigned steps;		 /* steps measured */
	pb_interval rate;	 /* steps per second, one sample per visit */
	const double *rate_v;	 /* those samples in round order (the arm's) */
	pb_interval step_ms;	 /* over the measured steps */
	double mbs_per_s;	 /* micro-batches per second at the median rate */
	pb_interval bubble;	 /* measured: 1 - busy / (threads x step) */
	double bubble_predicted; /* median of the trainer's prediction from each step's measured costs */
	double work_ms;		 /* median time inside the operations per step, every stage */
	double ideal_ms;	 /* work_ms over min(threads, CPUs): the step with no bubble */
	double efficiency;	 /* ideal_ms / the median step */
	double eff_of_predicted; /* efficiency / (1 - bubble_predicted) */
	double op_us[MBP_MAX_STAGES][3];      /* per stage: mean F, backward (B or B_in), W in microseconds */
	double profile_us[MBP_MAX_STAGES][3]; /* auto: the profile it was built from (F, B_in, B_w) */
	uint32_t stash_peak[MBP_MAX_STAGES], stash_expected[MBP_MAX_STAGES]; /* highest seen; schedule's */
	uint32_t held_peak[MBP_MAX_STAGES], held_expected[MBP_MAX_STAGES];
	/* per thread: the schedule's held peak over its chunks (a chunk's micro-batch counts 1 / chunks of
	 * a stage's), and a step's outputs and input gradients handed to another thread (a ring) and passed
	 * between two chunks of its own (no ring): the trainer's counts, checked against the schedule's */
	mt_thread_figs thr;
	mbp_train_event *ev; /* the fastest measured step's operations, for the Gantt chart */
	size_t nev;
	uint64_t ev_step_ns; /* that step's time */
	double loud_share;
	bool loud;
	int status; /* 0, or -1 with error set (a step failed, an invariant broke) */
	char error[PB_ERR_MAX];
} pb_train_result;

typedef struct pb_train_report {
	const pb_config *cfg;
	unsigned allowed, ncpus;
	double iters_per_us;
	char desc[200];
	pb_noise noise;
	double load_start, load_end;
	pb_train_result r[PB_TRAIN_SCHEDS];
	unsigned n;		/* schedules measured: r[0 .. n) */
	pb_interval zb_vs_1f1b; /* zbh1 / 1f1b steps per second, paired by round (n 0: not measured) */
	int status;
	char error[PB_ERR_MAX];
} pb_train_report;

/* The training workload (--workload=train) from start to end: the three schedules as interleaved arms,
 * the report in cfg->format. Returns the exit status; `ncpus` and `allowed` as pb_cpus_resolve() gave. */
int pb_train_main(pb_config *cfg, unsigned ncpus, unsigned allowed);
/* The process's CPUs become those of --cpus (the trainer pins its threads to the first allowed ones).
 * 0, or -1 with err set. */
int pb_narrow_cpus(const pb_config *cfg, unsigned ncpus, char *err, size_t errlen);
/* --workload=train --plan=auto (plan.c): an MLP of --widths profiled, planned within --memory (the
 * planner pipetrain runs, tools/shared), the plan printed, then trained with it, the measured step and
 * peak memory beside the predicted. @return the exit status (2: no plan fits the budget). */
int pb_train_plan_main(pb_config *cfg, unsigned ncpus);

void pb_train_print_table(FILE *f, const pb_train_report *rep, unsigned width);
void pb_train_print_csv(FILE *f, const pb_train_report *rep);
int pb_train_print_json(FILE *f, const pb_train_report *rep);

/* The three schedules' fastest measured steps, one above the other on one time scale, in at most `width`
 * columns, with a legend. (gantt.c) */
void pb_train_gantt_print(FILE *f, const pb_train_report *rep, unsigned width);

/* The same charts as SVG pictures written to `path` (--svg): the batch at the chosen size and as one
 * unit (b may be NULL), or the three schedules' steps with their predictions. 0, or -1 with err set. */
int pb_gantt_svg(const char *path, const pb_timeline *a, const pb_timeline *b, char *err, size_t errlen);
int pb_train_gantt_svg(const char *path, const pb_train_report *rep, char *err, size_t errlen);

/* ---- progress.c ---- */

void pb_progress_init(int mode);
void pb_progress(uint64_t done, uint64_t total, const char *what);
void pb_progress_end(void);

#endif

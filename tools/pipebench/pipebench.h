/*
 * pipebench: shared types of the throughput tool.
 *
 * The tool is split by job, one file each: options.c (command line), synthetic.c and mlp.c (the two
 * workloads, each a list of stage descriptors plus an input filler and an output check), measure.c (runs
 * the sequential baseline and the pipeline for one micro-batch size, collects statistics and the timeline
 * of one batch), predict.c (the bubble model and the choice of the best size), output.c (table, JSON, CSV),
 * gantt.c (the terminal timeline) and progress.c (the bar on standard error). main.c ties them together.
 *
 * Only the public API is used: <mbpipe.h> and its headers, never lib/.
 */
#ifndef PIPEBENCH_H
#define PIPEBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <mbpipe.h>

#define PB_MAX_SIZES 64	 /* micro-batch sizes in one sweep */
#define PB_ERR_MAX   256 /* one error line */

/* Exit statuses (documented in pipebench.1). */
enum { PB_EXIT_OK = 0, PB_EXIT_FAIL = 1, PB_EXIT_USAGE = 2 };

enum pb_workload_kind { PB_WL_MLP, PB_WL_SYNTHETIC };
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
	unsigned batches;	  /* measured batches per size (when duration_s is 0) */
	double duration_s;	  /* > 0: measure each size for this long instead */
	unsigned warmup;	  /* unmeasured batches per size */
	long spin_us;		  /* < 0: the engine's default */
	const char *engine_opts;  /* --opts key=value,... for mbp_opts_parse() */
	double latency_target_ms; /* 0: none */
	const char *trace_path;	  /* --trace */
	bool gantt;		  /* --gantt; on by default for the table output */
	bool gantt_set;
	int progress;		/* -1: when stderr is a terminal, 0: never, 1: always */
	unsigned baseline_runs; /* sequential batches per size (alternated with the pipeline) */
	uint64_t seed;
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
} pb_config;

/* CLOCK_MONOTONIC in nanoseconds: the clock of the engine's job stamps. */
static inline uint64_t pb_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- options.c ---- */

/* Parse argv into cfg. Returns 0 to go on, 1 when the run should stop successfully (--help, --version), -1
 * on a bad argument with one line (no program name, no newline) in err. */
int pb_options_parse(pb_config *cfg, int argc, char **argv, char *err, size_t errlen);
void pb_options_help(FILE *f);

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
	unsigned stages;
	size_t in_row_bytes;			/* width of an input row */
	size_t out_row_bytes;			/* width of a row leaving the last stage */
	mbp_stage_desc desc_of[MBP_MAX_STAGES]; /* valid after prepare() */
	/* Set up the stages for micro-batches of mb_rows (the mlp rebalances its layers for that size); the
	 * stages also accept the whole batch at once, for the sequential baseline. NULL: nothing to do. */
	int (*prepare)(pb_workload *w, uint32_t mb_rows, char *err, size_t errlen);
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
	double busy, starved, blocked; /* shares of the measured window */
	double service_us;	       /* mean time inside the stage function per micro-batch */
} pb_stage_result;

typedef struct pb_result {
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
	double predicted_ms; /* sum(t_i) + (M-1) max(t_i) */
	bool balanced;	     /* max(t_i) within 10% of min(t_i) */
	double speedup;	     /* throughput / the sequential baseline's */
	unsigned stages;
	unsigned threads; /* worker threads: stages, unless stages outnumber CPUs (they then share) */
	pb_stage_result st[MBP_MAX_STAGES];
	pb_timeline tl; /* the last measured batch */
	int status;	/* 0, or the first failure (an invariant broke) */
	char error[PB_ERR_MAX];
} pb_result;

typedef struct pb_baseline {
	unsigned runs;
	double *ms; /* every run's batch time */
	unsigned cap;
	double median_ms, min_ms, max_ms;
	double throughput; /* rows per second at the median */
} pb_baseline;

/* State shared by the measurements of one invocation. */
typedef struct pb_bench {
	const pb_config *cfg;
	pb_workload *w;
	unsigned ncpus;
	unsigned allowed;
	void *in;  /* one batch of input */
	void *out; /* one batch of pipeline output */
	void *ref; /* the reference output for the size being measured */
	void *seq; /* the baseline's output */
	pb_baseline base;
	mbp_placement placement[MBP_MAX_STAGES];
	bool have_placement;
	bool pin;			  /* the engine pins stages: the baseline pins its thread too */
	double load_start, load_end;	  /* 1-minute load average before and after (-1: unknown) */
	uint64_t total_units, done_units; /* for the progress bar: batches run, or sizes done */
} pb_bench;

int pb_bench_init(pb_bench *b, const pb_config *cfg, pb_workload *w, unsigned ncpus, unsigned allowed,
		  char *err, size_t errlen);
void pb_bench_fini(pb_bench *b);

/* The 1-minute load average, or -1 when /proc/loadavg cannot be read. */
double pb_loadavg(void);

/* Run the stages in order on one thread over the whole batch, `runs` times; adds to b->base, leaves the
 * output in b->seq. 0, or -1 with err set. */
int pb_baseline_run(pb_bench *b, unsigned runs, char *err, size_t errlen);

/* Measure one micro-batch size. `trace_path` non-NULL: keep an activity log and write it there. Returns
 * r->status (0 or -1). */
int pb_measure(pb_bench *b, uint32_t mb_rows, unsigned warmup, unsigned batches, double duration_s,
	       const char *trace_path, pb_result *r);
void pb_result_fini(pb_result *r);

/* ---- predict.c ---- */

/* The bubble model for r's measured per-stage service times: fills predicted_ms, bubble_predicted,
 * bubble_gpipe, balanced. */
void pb_predict(pb_result *r);

/* The best size among `n` results: the smallest within 3% of the best throughput, or with a latency target
 * the fastest whose p99 meets it. Writes the reason (one sentence) and returns the index; n when no size
 * completed. */
unsigned pb_choose(const pb_result *r, unsigned n, double latency_target_ms, char *why, size_t whylen);

/* ---- output.c ---- */

typedef struct pb_report {
	const pb_config *cfg;
	const pb_workload *w;
	const pb_bench *b;
	const pb_result *res;
	unsigned nres;
	unsigned best;
	char why[400];
	const pb_result *single; /* the whole batch as one micro-batch, for the Gantt chart (may be NULL) */
	int status;		 /* exit status */
	char error[PB_ERR_MAX];
} pb_report;

/* The chosen size's result, or NULL when no size completed. */
static inline const pb_result *pb_best(const pb_report *rep)
{
	return rep->best < rep->nres && rep->res[rep->best].status == 0 ? &rep->res[rep->best] : NULL;
}

void pb_print_header(FILE *f, const pb_report *rep);
void pb_print_table(FILE *f, const pb_report *rep);
void pb_print_csv(FILE *f, const pb_report *rep);
int pb_print_json(FILE *f, const pb_report *rep);

/* ---- gantt.c ---- */

/* Draw `a` (the chosen size) and `b` (the whole batch as one unit) side by side on one time scale, in at
 * most `width` columns. Either may be NULL. */
void pb_gantt_print(FILE *f, const pb_timeline *a, const pb_timeline *b, unsigned width);

/* ---- progress.c ---- */

void pb_progress_init(int mode);
void pb_progress(uint64_t done, uint64_t total, const char *what);
void pb_progress_end(void);

#endif

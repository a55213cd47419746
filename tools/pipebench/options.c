/*
 * pipebench options: the command line into a pb_config.
 *
 * Every bad argument ends the run with one line on standard error and exit status 2: the parser never
 * prints, it writes the line into the caller's buffer. Numbers are parsed strictly (digits only, the whole
 * argument, in range), so "0", "-3", "12x" and "" are all refused where a positive count is expected.
 * Defaults that depend on the machine or the workload (stages, batch) stay 0 here and are resolved by
 * main.c once the allowed CPUs and the model are known; --help prints them in words.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipebench.h"
#include "util/plural.h"
#include "util/parse.h"

#define PB_DEF_BATCHES	 10
#define PB_DEF_WARMUP	 1
#define PB_DEF_DURATION	 30.0
#define PB_DEF_TOLERANCE 2.0 /* percent */
#define PB_DEF_WAIT	 30.0
#define PB_DEF_WORK_US	 20.0
#define PB_DEF_ROW_BYTES 64
#define PB_DEF_LAYERS	 8
#define PB_DEF_HIDDEN	 512
#define PB_MAX_BATCH	 (1u << 24)
#define PB_MAX_ROW_BYTES (1u << 20)
#define PB_MAX_HIDDEN	 16384
#define PB_MAX_LAYERS	 256
#define PB_DEF_UNIT_US	 200.0
#define PB_MAX_TRAIN_MBS 1024

/* --widths: "784,512,10", 2 to PB_PLAN_MAX_LAYERS + 1 widths from 1 to PB_MAX_HIDDEN. */
static int parse_widths(const char *s, pb_config *cfg, char *err, size_t errlen)
{
	unsigned n = 0;
	for (const char *p = s;; p++) {
		size_t len = strcspn(p, ",");
		uint64_t v = 0;
		if (n > PB_PLAN_MAX_LAYERS || parse_u64_span(p, len, PB_MAX_HIDDEN, &v) || v == 0)
			return fail(err, errlen,
				    "--widths: '%s' is not 2 to %u widths from 1 to %u, comma-separated", s,
				    PB_PLAN_MAX_LAYERS + 1, PB_MAX_HIDDEN);
		cfg->widths[n++] = (uint32_t)v;
		p += len;
		if (!*p)
			break;
	}
	if (n < 2)
		return fail(err, errlen, "--widths: '%s' is not 2 to %u widths from 1 to %u, comma-separated",
			    s, PB_PLAN_MAX_LAYERS + 1, PB_MAX_HIDDEN);
	cfg->nwidths = n;
	return 0;
}

/* "20" or "10,20,10,10": one value, or one per stage. */
static int parse_us_list(const char *opt, const char *s, double lo, double *out, unsigned *n, char *err,
			 size_t errlen)
{
	char buf[1024];
	if (!s || strlen(s) >= sizeof(buf) || strstr(s, ",,"))
		return fail(err, errlen, "%s: expected microseconds, one value or one per stage", opt);
	strcpy(buf, s);
	unsigned k = 0;
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (k == MBP_MAX_STAGES)
			return fail(err, errlen, "%s: more than %d values", opt, MBP_MAX_STAGES);
		if (parse_double(tok, lo, 1e7, &out[k]))
			return fail(err, errlen, "%s: '%s' is not a number of microseconds%s", opt, tok,
				    lo > 0 ? " above 0" : "");
		k++;
	}
	if (k == 0 || s[strlen(s) - 1] == ',' || s[0] == ',')
		return fail(err, errlen, "%s: expected microseconds, one value or one per stage", opt);
	*n = k;
	return 0;
}

/* "0-3", "0,2,5" or "0+2+5" (the engine's own spelling). */
static int parse_cpu_list(const char *s, int *cpus, unsigned *n, char *err, size_t errlen)
{
	char buf[1024];
	if (!s || !*s || strlen(s) >= sizeof(buf) || strstr(s, ",,") || strstr(s, "++"))
		return fail(err, errlen, "--cpus: expected a list such as 0-3 or 0,2");
	strcpy(buf, s);
	unsigned k = 0;
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",+", &save); tok; tok = strtok_r(NULL, ",+", &save)) {
		uint64_t a, b;
		char *dash = strchr(tok, '-');
		if (dash) {
			*dash = 0;
			if (parse_u64(tok, 0, MBP_MAX_CPUS - 1, &a) ||
			    parse_u64(dash + 1, 0, MBP_MAX_CPUS - 1, &b) || b < a)
				return fail(err, errlen, "--cpus: bad range in '%s'", s);
		} else {
			if (parse_u64(tok, 0, MBP_MAX_CPUS - 1, &a))
				return fail(err, errlen, "--cpus: '%s' is not a CPU number", tok);
			b = a;
		}
		for (uint64_t c = a; c <= b; c++) {
			for (unsigned i = 0; i < k; i++)
				if (cpus[i] == (int)c)
					return fail(err, errlen, "--cpus: CPU %llu named twice",
						    (unsigned long long)c);
			if (k == MBP_MAX_CPUS)
				return fail(err, errlen, "--cpus: too many CPUs");
			cpus[k++] = (int)c;
		}
	}
	if (k == 0)
		return fail(err, errlen, "--cpus: expected a list such as 0-3 or 0,2");
	*n = k;
	return 0;
}

enum {
	OPT_CPUS = 256,
	OPT_WARMUP,
	OPT_SPIN,
	OPT_OPTS,
	OPT_LATENCY,
	OPT_TOLERANCE,
	OPT_WAIT,
	OPT_WORK,
	OPT_MBUS,
	OPT_ROWBYTES,
	OPT_MODEL,
	OPT_LAYERS,
	OPT_HIDDEN,
	OPT_SEED,
	OPT_JSON,
	OPT_CSV,
	OPT_TABLE,
	OPT_GANTT,
	OPT_NOGANTT,
	OPT_TRACE,
	OPT_SVG,
	OPT_PROGRESS,
	OPT_NOPROGRESS,
	OPT_MBS,
	OPT_COSTS,
	OPT_UNIT,
	OPT_SCHEDULE,
	OPT_SCHEDULE_FILE,
	OPT_CHUNKS,
	OPT_REBALANCE,
	OPT_REBALANCE_REPLICAS,
	OPT_REPLICAS,
	OPT_PLAN,
	OPT_PLAN_ONLY,
	OPT_MEMORY,
	OPT_WIDTHS,
};

static const struct option long_opts[] = {
    {"workload", required_argument, NULL, 'w'},
    {"stages", required_argument, NULL, 's'},
    {"cpus", required_argument, NULL, OPT_CPUS},
    {"batch", required_argument, NULL, 'b'},
    {"mb", required_argument, NULL, 'm'},
    {"batches", required_argument, NULL, 'n'},
    {"duration", required_argument, NULL, 'd'},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"spin-us", required_argument, NULL, OPT_SPIN},
    {"opts", required_argument, NULL, OPT_OPTS},
    {"latency-target", required_argument, NULL, OPT_LATENCY},
    {"tolerance", required_argument, NULL, OPT_TOLERANCE},
    {"wait-quiet", required_argument, NULL, OPT_WAIT},
    {"work-us", required_argument, NULL, OPT_WORK},
    {"mb-us", required_argument, NULL, OPT_MBUS},
    {"row-bytes", required_argument, NULL, OPT_ROWBYTES},
    {"model", required_argument, NULL, OPT_MODEL},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"hidden", required_argument, NULL, OPT_HIDDEN},
    {"seed", required_argument, NULL, OPT_SEED},
    {"rebalance", no_argument, NULL, OPT_REBALANCE},
    {"rebalance-replicas", required_argument, NULL, OPT_REBALANCE_REPLICAS},
    {"micro-batches", required_argument, NULL, OPT_MBS},
    {"costs", required_argument, NULL, OPT_COSTS},
    {"unit-us", required_argument, NULL, OPT_UNIT},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"chunks", required_argument, NULL, OPT_CHUNKS},
    {"replicas", required_argument, NULL, OPT_REPLICAS},
    {"schedule-file", required_argument, NULL, OPT_SCHEDULE_FILE},
    {"plan", required_argument, NULL, OPT_PLAN},
    {"plan-only", no_argument, NULL, OPT_PLAN_ONLY},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"widths", required_argument, NULL, OPT_WIDTHS},
    {"json", no_argument, NULL, OPT_JSON},
    {"csv", no_argument, NULL, OPT_CSV},
    {"table", no_argument, NULL, OPT_TABLE},
    {"gantt", no_argument, NULL, OPT_GANTT},
    {"no-gantt", no_argument, NULL, OPT_NOGANTT},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"svg", required_argument, NULL, OPT_SVG},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NOPROGRESS},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

void pb_options_help(FILE *f)
{
	mbp_opts o;
	mbp_opts_init(&o);
	fprintf(
	    f,
	    "Usage: pipebench [OPTION]...\n"
	    "Measure a pipeline of stages on pinned threads over a sweep of micro-batch sizes: throughput,\n"
	    "latency, the bubble (measured and predicted), per-stage utilisation and the speed-up over the "
	    "same\n"
	    "stages run sequentially on one thread; then the best micro-batch size and why.\n"
	    "With no option: an MLP with random weights, split into as many stages as allowed CPUs (at most "
	    "4),\n"
	    "swept over micro-batch sizes, with the Gantt chart of one batch.\n"
	    "\n"
	    "Workload:\n"
	    "  -w, --workload=KIND      mlp, synthetic, or train: training steps under the schedules\n"
	    "                           gpipe, 1f1b and zbh1, measured in turn (default: mlp)\n"
	    "  -s, --stages=N           pipeline stages (default: the allowed CPUs, at most 4; for the mlp\n"
	    "                           at most one per layer; synthetic: one per --work-us value)\n"
	    "  -b, --batch=ROWS         rows per batch (default: mlp 256, synthetic 64; train --plan=auto:\n"
	    "                           rows a step, 256)\n"
	    "  -m, --mb=SPEC            micro-batch sizes: N, a list A,B,C, a doubling range A-B, a range\n"
	    "                           A-B:STEP, or auto: 1,2,4,.. up to the batch (default: auto)\n"
	    "      --work-us=LIST       synthetic: busy work per row, in microseconds, one value for every\n"
	    "                           stage or one per stage such as 10,20,10,10 (default: %g)\n"
	    "      --mb-us=LIST         synthetic: fixed busy work per micro-batch and stage (default: 0)\n"
	    "      --replicas=SPEC      threads per stage, each on the next micro-batch, the results merged\n"
	    "                           in order: N for every stage, N,N,.. one per stage, or auto (mlp):\n"
	    "                           boundaries and replicas chosen together over the CPUs, exactly,\n"
	    "                           for --stages stages (default: 1)\n"
	    "      --row-bytes=B        synthetic: bytes per row, read and written by every stage; a\n"
	    "                           micro-batch of m rows touches m x B bytes (default: %u)\n"
	    "      --model=FILE         mlp: a safetensors model file (default: generate one)\n"
	    "      --layers=L           mlp: layers of the generated model (default: %u)\n"
	    "      --hidden=H           mlp: width of the generated model (default: %u)\n"
	    "      --seed=N             seed of the generated weights and inputs (default: 1)\n"
	    "      --rebalance          mlp: the stages move layers while they run when the measured\n"
	    "                           costs call for another split, each move logged on stderr; with\n"
	    "                           --replicas each stage keeps its replicas and the cuts move\n"
	    "                           (default: off; the synthetic stages are functions, not layers)\n"
	    "      --rebalance-replicas=N\n"
	    "                           with --rebalance: make each stage N threads (or its --replicas,\n"
	    "                           if more), the plan's active at start, and let a move choose the\n"
	    "                           cuts and how many of each stage's threads take micro-batches\n"
	    "      --micro-batches=M    train: micro-batches per step (default: 4 x stages)\n"
	    "      --costs=F:BIN:BW     train: cost of a stage's forward, input-gradient backward and\n"
	    "                           weight-gradient backward, in units of --unit-us (default: 1:1:1)\n"
	    "      --unit-us=US         train: the unit of --costs, in microseconds of busy work\n"
	    "                           (default: %g)\n"
	    "      --schedule=LIST      train: the schedules measured side by side, comma-separated, of\n"
	    "                           gpipe, 1f1b, zbh1, zbh2, interleaved, looped-bfs, zbv, dualpipev,\n"
	    "                           auto, or all (default: gpipe,1f1b,zbh1). interleaved, looped-bfs,\n"
	    "                           zbv and dualpipev split each of the --stages stages into chunks\n"
	    "                           (zbv, dualpipev: 2), each 1/chunks of its costs, on as many threads\n"
	    "                           as there are stages; auto: built (mbp_schedule_build) from a\n"
	    "                           short profile of its chunks' operations, on 2 chunks a thread,\n"
	    "                           holding at most what 1f1b holds (2 x stages chunks)\n"
	    "      --chunks=V           train: chunks per thread of interleaved and looped-bfs (default: 2)\n"
	    "      --schedule-file=FILE train: one more schedule, 'custom', read from FILE (PyTorch's CSV,\n"
	    "                           a line per thread); its lines are the threads, its micro-batches\n"
	    "                           --micro-batches' (by default), each stage 1/(stages/threads) of\n"
	    "                           the costs\n"
	    "      --plan=auto          train: an MLP's layers profiled, then the planner's plan (threads,\n"
	    "                           stages, schedule, micro-batch size, recomputing stages) with the\n"
	    "                           shortest predicted step within --memory, printed, then trained\n"
	    "                           --batches steps: the measured step and peak memory beside the\n"
	    "                           predicted (instead of the schedules above)\n"
	    "      --widths=LIST        --plan=auto: the MLP's widths, input first, such as 784,512,10\n"
	    "                           (default: 784,512,512,10), random weights from --seed\n"
	    "      --memory=SIZE        --plan=auto: the budget (64M, 1G: bytes, K/M/G/T binary) for\n"
	    "                           activations, parameters, gradients, optimizer state and the\n"
	    "                           stages' weight copy; a budget no plan fits is refused (exit 2)\n"
	    "                           naming the smallest that fits\n"
	    "                           (default: no limit)\n"
	    "      --plan-only          --plan=auto: print the plan (--json: as JSON) and exit\n"
	    "\n"
	    "Measurement (every size and the sequential baseline are visited in turn, a few batches per\n"
	    "visit, round after round; each visit gives one repeat):\n"
	    "  -n, --batches=N          repeats per size (train: per schedule) at least (default: %u)\n"
	    "      --tolerance=PCT      then stop once the 95%% interval of every median is within PCT%% of\n"
	    "                           it; 0: stop at --batches (default: %g)\n"
	    "  -d, --duration=SECONDS   or once this much time has passed (default: %g)\n"
	    "      --warmup=N           unmeasured batches (train: steps) at the start of every visit\n"
	    "                           (default: %u)\n"
	    "      --wait-quiet=SECONDS before measuring, wait at most this long for other processes to\n"
	    "                           leave the CPUs (default: %g; 0: do not wait)\n"
	    "      --latency-target=MS  choose among the sizes whose p99 batch latency meets this\n"
	    "                           (default: none, every size)\n"
	    "      --cpus=LIST          CPUs for the stages: 0-3, 0,2,5 or 0+2+5 (default: all allowed)\n"
	    "      --spin-us=US         spin budget of a waiting stage, 0: none (default: %llu)\n"
	    "      --opts=KEY=VAL,...   engine options for mbp_opts_parse (ring, cache, spin_us, yield_us,\n"
	    "                           pin, threads, ...), applied after $MBPIPE_OPTS (default: none)\n"
	    "\n"
	    "Output:\n"
	    "      --table              a table on standard output (the default)\n"
	    "      --json               one JSON document on standard output\n"
	    "      --csv                one CSV line per micro-batch size on standard output\n"
	    "      --gantt, --no-gantt  the timeline of one batch at the chosen size and as one unit "
	    "(train:\n"
	    "                           of one step per schedule) (default: on with --table, off otherwise)\n"
	    "      --trace=FILE         Chrome trace (Perfetto) of the chosen size (default: none)\n"
	    "      --svg=FILE           the Gantt chart as an SVG picture, whatever the output format\n"
	    "                           (default: none)\n"
	    "      --progress, --no-progress\n"
	    "                           progress bar on standard error (default: when it is a terminal)\n"
	    "  -h, --help               this help\n"
	    "  -V, --version            the version\n"
	    "\n"
	    "Exit status: 0 success, 1 an invariant broke (a micro-batch lost, out of order, a wrong\n"
	    "result) or the engine failed, 2 a bad argument.\n",
	    PB_DEF_WORK_US, PB_DEF_ROW_BYTES, PB_DEF_LAYERS, PB_DEF_HIDDEN, PB_DEF_UNIT_US, PB_DEF_BATCHES,
	    PB_DEF_TOLERANCE, PB_DEF_DURATION, PB_DEF_WARMUP, PB_DEF_WAIT,
	    (unsigned long long)(o.spin_ns / 1000));
}

static void defaults(pb_config *c)
{
	memset(c, 0, sizeof(*c));
	c->workload = PB_WL_MLP;
	c->format = PB_FMT_TABLE;
	c->mb_spec = "auto";
	c->batches = PB_DEF_BATCHES;
	c->warmup = PB_DEF_WARMUP;
	c->duration_s = PB_DEF_DURATION;
	c->tolerance = PB_DEF_TOLERANCE / 100;
	c->wait_quiet_s = PB_DEF_WAIT;
	c->spin_us = -1;
	c->progress = -1;
	c->seed = 1;
	c->nwork = 1;
	c->work_us[0] = PB_DEF_WORK_US;
	c->nmb_us = 1;
	c->mb_us[0] = 0;
	c->row_bytes = PB_DEF_ROW_BYTES;
	c->layers = PB_DEF_LAYERS;
	c->hidden = PB_DEF_HIDDEN;
	c->costs[0] = c->costs[1] = c->costs[2] = 1;
	c->unit_us = PB_DEF_UNIT_US;
}

/* --schedule: names of mbp_sched_parse (auto among them; none twice), comma-separated, or "all". */
static int parse_scheds(const char *s, pb_config *cfg, char *err, size_t errlen)
{
	static const mbp_sched_kind all[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B,	     MBP_SCHED_ZBH1,
					     MBP_SCHED_ZBH2,  MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS,
					     MBP_SCHED_ZBV,   MBP_SCHED_DUALPIPEV,   MBP_SCHED_AUTO};
	cfg->nscheds = 0;
	if (!strcmp(s, "all")) {
		memcpy(cfg->scheds, all, sizeof(all));
		cfg->nscheds = sizeof(all) / sizeof(all[0]);
		return 0;
	}
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", s);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		mbp_sched_kind k;
		if (mbp_sched_parse(tok, &k))
			return fail(
			    err, errlen,
			    "--schedule: '%s' is not gpipe, 1f1b, zbh1, zbh2, interleaved, looped-bfs, "
			    "zbv, dualpipev, auto or all",
			    tok);
		for (unsigned i = 0; i < cfg->nscheds; i++)
			if (cfg->scheds[i] == k)
				return fail(err, errlen, "--schedule: '%s' twice", tok);
		if (cfg->nscheds == sizeof(cfg->scheds) / sizeof(cfg->scheds[0]))
			return fail(err, errlen, "--schedule: too many");
		cfg->scheds[cfg->nscheds++] = k;
	}
	if (cfg->nscheds == 0)
		return fail(err, errlen, "--schedule: '%s' names no schedule", s);
	return 0;
}

/* "1:1:1", "1:2:0": three costs, each from 0 to 1000, their sum above 0. */
static int parse_costs(const char *s, double *costs, char *err, size_t errlen)
{
	char buf[128];
	if (strlen(s) >= sizeof(buf))
		goto bad;
	strcpy(buf, s);
	char *p = buf;
	for (int i = 0; i < 3; i++) {
		char *colon = strchr(p, ':');
		if ((i < 2) != (colon != NULL))
			goto bad;
		if (colon)
			*colon = 0;
		if (parse_double(p, 0, 1000, &costs[i]))
			goto bad;
		p = colon + 1;
	}
	if (costs[0] + costs[1] + costs[2] <= 0)
		return fail(err, errlen, "--costs: '%s' costs nothing: at least one cost above 0", s);
	return 0;
bad:
	return fail(err, errlen, "--costs: '%s' is not F:BIN:BW, three numbers from 0 to 1000 such as 1:1:1",
		    s);
}

/* Option name as the user spelled it, for messages. */
static const char *opt_name(int c, int idx)
{
	static char buf[64];
	for (const struct option *o = long_opts; o->name; o++)
		if (o->val == c) {
			snprintf(buf, sizeof(buf), "--%s", o->name);
			return buf;
		}
	(void)idx;
	snprintf(buf, sizeof(buf), "-%c", c);
	return buf;
}

int pb_options_parse(pb_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	defaults(cfg);
	bool have_work = false, have_mbus = false, have_model = false, have_layers = false;
	bool have_hidden = false, have_rowbytes = false, have_batch = false, have_mb = false;
	bool have_train = false;
	const char *format = NULL;		   /* the output format given, for a second one */
	int gantt_given = -1, progress_given = -1; /* the last --gantt/--no-gantt, --progress/--no-progress */
	uint64_t v = 0;				   /* set by every parse that succeeds; 0 for the compiler */
	double d = 0;

	opterr = 0; /* every message is ours, one line */
	optind = 1;
	for (;;) {
		int idx = -1;
		int c = getopt_long(argc, argv, ":w:s:b:m:n:d:hV", long_opts, &idx);
		if (c == -1)
			break;
		const char *name = opt_name(c, idx);
		switch (c) {
		case 'w':
			if (!strcmp(optarg, "mlp"))
				cfg->workload = PB_WL_MLP;
			else if (!strcmp(optarg, "synthetic"))
				cfg->workload = PB_WL_SYNTHETIC;
			else if (!strcmp(optarg, "train"))
				cfg->workload = PB_WL_TRAIN;
			else
				return fail(err, errlen, "--workload: '%s' is not mlp, synthetic or train",
					    optarg);
			break;
		case 's':
			if (parse_u64_opt(name, optarg, "a stage count", 1, MBP_MAX_STAGES, &v, err, errlen))
				return -1;
			cfg->stages = (unsigned)v;
			break;
		case OPT_CPUS:
			if (parse_cpu_list(optarg, cfg->cpus, &cfg->ncpus, err, errlen))
				return -1;
			break;
		case 'b':
			if (parse_u64_opt(name, optarg, "a row count", 1, PB_MAX_BATCH, &v, err, errlen))
				return -1;
			cfg->batch = (uint32_t)v;
			have_batch = true;
			break;
		case 'm':
			if (!*optarg)
				return fail(err, errlen, "%s: empty micro-batch size", name);
			cfg->mb_spec = optarg; /* checked against the batch in pb_sizes_resolve() */
			have_mb = true;
			break;
		case 'n':
			if (parse_u64(optarg, 1, 1000000, &v))
				return fail(err, errlen, "%s: '%s' is not a positive batch count", name,
					    optarg);
			cfg->batches = (unsigned)v;
			break;
		case 'd':
			if (parse_double(optarg, 1e-3, 86400, &d))
				return fail(err, errlen, "%s: '%s' is not a positive number of seconds", name,
					    optarg);
			cfg->duration_s = d;
			break;
		case OPT_WARMUP:
			if (parse_u64(optarg, 0, 1000000, &v))
				return fail(err, errlen, "%s: '%s' is not a batch count", name, optarg);
			cfg->warmup = (unsigned)v;
			break;
		case OPT_TOLERANCE:
			if (parse_double_opt(name, optarg, "a percentage", 0, 100, &d, err, errlen))
				return -1;
			cfg->tolerance = d / 100;
			break;
		case OPT_WAIT:
			if (parse_double_opt(name, optarg, "a number of seconds", 0, 3600, &d, err, errlen))
				return -1;
			cfg->wait_quiet_s = d;
			break;
		case OPT_SPIN:
			if (parse_u64(optarg, 0, 10000000, &v))
				return fail(err, errlen, "%s: '%s' is not a number of microseconds", name,
					    optarg);
			cfg->spin_us = (long)v;
			break;
		case OPT_OPTS: {
			mbp_opts o;
			size_t pos = 0;
			mbp_opts_init(&o);
			if (mbp_opts_parse(&o, optarg, &pos))
				return fail(err, errlen, "%s: %s (at '%.*s')", name,
					    mbp_opts_rule(optarg + pos), (int)strcspn(optarg + pos, ","),
					    optarg + pos);
			cfg->engine_opts = optarg;
			break;
		}
		case OPT_LATENCY:
			if (parse_double(optarg, 1e-6, 1e9, &d))
				return fail(err, errlen, "%s: '%s' is not a positive number of milliseconds",
					    name, optarg);
			cfg->latency_target_ms = d;
			break;
		case OPT_WORK:
			if (parse_us_list(name, optarg, 1e-9, cfg->work_us, &cfg->nwork, err, errlen))
				return -1;
			have_work = true;
			break;
		case OPT_MBUS:
			if (parse_us_list(name, optarg, 0, cfg->mb_us, &cfg->nmb_us, err, errlen))
				return -1;
			have_mbus = true;
			break;
		case OPT_ROWBYTES:
			if (parse_u64(optarg, 16, PB_MAX_ROW_BYTES, &v) || v % 8)
				return fail(err, errlen, "%s: '%s' is not a multiple of 8 from 16 to %u",
					    name, optarg, PB_MAX_ROW_BYTES);
			cfg->row_bytes = (uint32_t)v;
			have_rowbytes = true;
			break;
		case OPT_MODEL:
			if (!*optarg)
				return fail(err, errlen, "%s: empty file name", name);
			cfg->model_path = optarg;
			have_model = true;
			break;
		case OPT_LAYERS:
			if (parse_u64_opt(name, optarg, "a layer count", 1, PB_MAX_LAYERS, &v, err, errlen))
				return -1;
			cfg->layers = (unsigned)v;
			have_layers = true;
			break;
		case OPT_HIDDEN:
			if (parse_u64_opt(name, optarg, "a hidden size", 1, PB_MAX_HIDDEN, &v, err, errlen))
				return -1;
			cfg->hidden = (unsigned)v;
			have_hidden = true;
			break;
		case OPT_REBALANCE:
			cfg->rebalance = true;
			break;
		case OPT_REBALANCE_REPLICAS:
			if (parse_u64_opt(name, optarg, "a thread count", 1, MBP_MAX_REPLICAS, &v, err,
					  errlen))
				return -1;
			cfg->rebalance_replicas = (unsigned)v;
			break;
		case OPT_PLAN:
			if (strcmp(optarg, "auto"))
				return fail(err, errlen, "%s: '%s' is not auto", name, optarg);
			cfg->plan_auto = true;
			break;
		case OPT_PLAN_ONLY:
			cfg->plan_only = true;
			break;
		case OPT_MEMORY:
			if (parse_size_opt(name, optarg, UINT64_MAX, &cfg->memory, err, errlen))
				return -1;
			break;
		case OPT_WIDTHS:
			if (parse_widths(optarg, cfg, err, errlen))
				return -1;
			break;
		case OPT_SEED:
			if (parse_u64(optarg, 0, UINT64_MAX, &v))
				return fail(err, errlen, "%s: '%s' is not a number", name, optarg);
			cfg->seed = v;
			break;
		case OPT_MBS:
			if (parse_u64_opt(name, optarg, "a micro-batch count", 1, PB_MAX_TRAIN_MBS, &v, err,
					  errlen))
				return -1;
			cfg->mbs = (unsigned)v;
			have_train = true;
			break;
		case OPT_COSTS:
			if (parse_costs(optarg, cfg->costs, err, errlen))
				return -1;
			have_train = true;
			break;
		case OPT_SCHEDULE:
			if (parse_scheds(optarg, cfg, err, errlen))
				return -1;
			have_train = true;
			break;
		case OPT_SCHEDULE_FILE:
			cfg->schedule_file = optarg;
			have_train = true;
			break;
		case OPT_REPLICAS: {
			cfg->replicas_auto = !strcmp(optarg, "auto");
			double r[MBP_MAX_STAGES];
			if (!cfg->replicas_auto &&
			    parse_us_list(name, optarg, 1, r, &cfg->nreplicas, err, errlen) == 0)
				for (unsigned i = 0; i < cfg->nreplicas; i++) {
					if (r[i] != floor(r[i]) || r[i] > MBP_MAX_REPLICAS)
						return fail(err, errlen,
							    "%s: '%s': auto, or whole numbers from 1 to %d, "
							    "one or one per stage",
							    name, optarg, MBP_MAX_REPLICAS);
					cfg->replicas[i] = (unsigned)r[i];
				}
			else if (!cfg->replicas_auto)
				return fail(
				    err, errlen,
				    "%s: '%s': auto, or whole numbers from 1 to %d, one or one per stage",
				    name, optarg, MBP_MAX_REPLICAS);
			break;
		}
		case OPT_CHUNKS:
			if (parse_u64(optarg, 1, 8, &v))
				return fail(err, errlen, "%s: '%s' is not a whole number from 1 to 8", name,
					    optarg);
			cfg->chunks = (unsigned)v;
			have_train = true;
			break;
		case OPT_UNIT:
			if (parse_double(optarg, 1, 1e6, &d))
				return fail(err, errlen,
					    "%s: '%s' is not a number of microseconds from 1 to 1e6", name,
					    optarg);
			cfg->unit_us = d;
			have_train = true;
			break;
		case OPT_JSON:
		case OPT_CSV:
		case OPT_TABLE: {
			/* one output format: a second, different one contradicts the first */
			enum pb_format fmt = c == OPT_JSON  ? PB_FMT_JSON
					     : c == OPT_CSV ? PB_FMT_CSV
							    : PB_FMT_TABLE;
			if (format && fmt != cfg->format)
				return fail(err, errlen, "%s and %s: one output format at a time", format,
					    name);
			format = c == OPT_JSON ? "--json" : c == OPT_CSV ? "--csv" : "--table";
			cfg->format = fmt;
			break;
		}
		case OPT_GANTT:
		case OPT_NOGANTT:
			if (gantt_given >= 0 && gantt_given != (c == OPT_GANTT))
				return fail(err, errlen, "--gantt and --no-gantt contradict each other");
			gantt_given = c == OPT_GANTT;
			cfg->gantt = c == OPT_GANTT;
			cfg->gantt_set = true;
			break;
		case OPT_TRACE:
		case OPT_SVG:
			if (!*optarg)
				return fail(err, errlen, "%s: empty file name", name);
			*(c == OPT_TRACE ? &cfg->trace_path : &cfg->svg_path) = optarg;
			break;
		case OPT_PROGRESS:
		case OPT_NOPROGRESS:
			if (progress_given >= 0 && progress_given != (c == OPT_PROGRESS))
				return fail(err, errlen,
					    "--progress and --no-progress contradict each other");
			progress_given = c == OPT_PROGRESS;
			cfg->progress = progress_given;
			break;
		case 'h':
			pb_options_help(stdout);
			return 1;
		case 'V':
			printf("pipebench (mbpipe) %s\n", mbp_version());
			return 1;
		case ':':
			return fail(err, errlen, "option '%s' needs a value", argv[optind - 1]);
		default:
			if (optopt && optopt < 256)
				return fail(err, errlen, "unknown option '-%c'", optopt);
			return fail(err, errlen, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return fail(err, errlen, "unexpected argument '%s'", argv[optind]);

	/* Options that belong to the other workload are mistakes, not silently ignored. */
	if (cfg->workload != PB_WL_SYNTHETIC && (have_work || have_mbus || have_rowbytes))
		return fail(err, errlen, "--work-us, --mb-us and --row-bytes apply to --workload=synthetic");
	if (cfg->workload != PB_WL_MLP && (have_model || have_layers || have_hidden))
		return fail(err, errlen, "--model, --layers and --hidden apply to --workload=mlp");
	if (cfg->rebalance_replicas && !cfg->rebalance)
		return fail(err, errlen, "--rebalance-replicas=%u: only with --rebalance",
			    cfg->rebalance_replicas);
	if (cfg->workload != PB_WL_MLP && cfg->rebalance)
		return fail(err, errlen,
			    "--rebalance applies to --workload=mlp: it moves layers between stages, and the "
			    "%s stages are functions, not layers",
			    cfg->workload == PB_WL_SYNTHETIC ? "synthetic" : "trainer's");
	if (cfg->workload != PB_WL_TRAIN && have_train)
		return fail(
		    err, errlen,
		    "--micro-batches, --costs, --unit-us, --schedule and --chunks apply to --workload=train");
	if ((cfg->memory || cfg->plan_only || cfg->nwidths) && !cfg->plan_auto)
		return fail(err, errlen, "%s needs --plan=auto",
			    cfg->memory	     ? "--memory"
			    : cfg->plan_only ? "--plan-only"
					     : "--widths");
	if (cfg->plan_auto && cfg->workload != PB_WL_TRAIN)
		return fail(err, errlen, "--plan=auto applies to --workload=train");
	if (cfg->plan_auto) {
		/* the plan chooses what these set, and its report is lines and JSON, not the schedules' */
		if (have_train || cfg->stages)
			return fail(
			    err, errlen,
			    "--plan=auto chooses the stages and the schedule: not with --stages, "
			    "--micro-batches, --costs, --unit-us, --schedule, --schedule-file or --chunks");
		if (have_mb || cfg->latency_target_ms > 0)
			return fail(err, errlen,
				    "--plan=auto chooses the micro-batch size: not with --mb or "
				    "--latency-target");
		if (cfg->format == PB_FMT_CSV || cfg->svg_path || cfg->gantt)
			return fail(
			    err, errlen,
			    "--csv, --svg and --gantt do not apply to --plan=auto (its report is lines, "
			    "or --json)");
		if (cfg->engine_opts || cfg->trace_path)
			return fail(err, errlen,
				    "--opts and --trace apply to the pipeline, not to --workload=train");
	} else if (cfg->workload == PB_WL_TRAIN) {
		if (have_batch || have_mb || cfg->latency_target_ms > 0)
			return fail(err, errlen,
				    "--batch, --mb and --latency-target do not apply to --workload=train "
				    "(it takes --micro-batches)");
		if (cfg->engine_opts || cfg->trace_path)
			return fail(err, errlen,
				    "--opts and --trace apply to the pipeline, not to --workload=train");
	}
	if ((cfg->replicas_auto || cfg->nreplicas) && cfg->workload == PB_WL_TRAIN)
		return fail(err, errlen, "--replicas applies to the pipeline, not to --workload=train");
	if (cfg->replicas_auto && cfg->workload != PB_WL_MLP)
		return fail(err, errlen, "--replicas=auto needs the layers' costs: --workload=mlp");
	if (cfg->nreplicas > 1) {
		if (cfg->stages && cfg->stages != cfg->nreplicas)
			return fail(err, errlen, "--stages=%u but --replicas has %u values", cfg->stages,
				    cfg->nreplicas);
		cfg->stages = cfg->nreplicas;
	}
	if (have_model && (have_layers || have_hidden))
		return fail(err, errlen, "--layers and --hidden describe a generated model, not --model");
	if (cfg->workload == PB_WL_SYNTHETIC) {
		unsigned want = cfg->nwork > 1 ? cfg->nwork : cfg->nmb_us > 1 ? cfg->nmb_us : 0;
		if (cfg->nwork > 1 && cfg->nmb_us > 1 && cfg->nwork != cfg->nmb_us)
			return fail(err, errlen, "--work-us has %u values but --mb-us has %u", cfg->nwork,
				    cfg->nmb_us);
		if (want && cfg->stages && cfg->stages != want)
			return fail(err, errlen, "--stages=%u but %u per-stage values were given",
				    cfg->stages, want);
		if (want)
			cfg->stages = want;
	}
	if (cfg->gantt && cfg->format == PB_FMT_CSV)
		return fail(err, errlen, "--gantt does not fit in --csv output");
	if (!cfg->gantt_set)
		cfg->gantt = cfg->format == PB_FMT_TABLE;
	return 0;
}

uint64_t pb_spin_ns(const pb_config *cfg, uint64_t unset)
{
	if (cfg->spin_us < 0)
		return unset;
	return cfg->spin_us ? (uint64_t)cfg->spin_us * 1000 : MBP_SPIN_NONE;
}

int pb_cpus_resolve(pb_config *cfg, unsigned *allowed, char *err, size_t errlen)
{
	int cpus[MBP_MAX_CPUS];
	unsigned quota = 0;
	int n = mbp_cpus_allowed(cpus, MBP_MAX_CPUS, &quota);
	if (n < 0)
		return fail(err, errlen, "cannot read the allowed CPUs: %s", mbp_strerror(n));
	if (n > MBP_MAX_CPUS)
		n = MBP_MAX_CPUS;
	*allowed = (unsigned)n;
	if (cfg->ncpus == 0) {
		memcpy(cfg->cpus, cpus, (size_t)n * sizeof(int));
		cfg->ncpus = (unsigned)n;
		return n;
	}
	for (unsigned i = 0; i < cfg->ncpus; i++) {
		bool ok = false;
		for (int j = 0; j < n; j++)
			ok |= cpus[j] == cfg->cpus[i];
		if (!ok)
			return fail(err, errlen, "--cpus: CPU %d is not allowed to this process",
				    cfg->cpus[i]);
	}
	return (int)cfg->ncpus;
}

static int add_size(pb_config *cfg, uint64_t m, char *err, size_t errlen)
{
	if (m == 0)
		return fail(err, errlen, "--mb: micro-batch size 0: sizes are positive row counts");
	if (m > cfg->batch)
		return fail(err, errlen, "--mb: micro-batch size %llu is larger than the batch (%u %s)",
			    (unsigned long long)m, cfg->batch, PLURAL(cfg->batch, "row", "rows"));
	for (unsigned i = 0; i < cfg->nsizes; i++)
		if (cfg->sizes[i] == m)
			return 0;
	if (cfg->nsizes == PB_MAX_SIZES)
		return fail(err, errlen, "--mb: more than %d sizes", PB_MAX_SIZES);
	cfg->sizes[cfg->nsizes++] = (uint32_t)m;
	return 0;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* A signed-looking or otherwise malformed size gets one message whatever its shape. */
static int bad_size(const char *tok, char *err, size_t errlen)
{
	return fail(err, errlen,
		    "--mb: '%s' is not a positive micro-batch size (N, A,B,C, A-B, A-B:STEP or auto)", tok);
}

/* "A-B" (doubling from A) or "A-B:STEP" (linear) into its parts; step 0 means doubling. 0, or -1. */
static int parse_range(const char *tok, uint64_t *a, uint64_t *b, uint64_t *step)
{
	char buf[64];
	if (strlen(tok) >= sizeof(buf))
		return -1;
	strcpy(buf, tok);
	char *dash = strchr(buf, '-'), *colon = strchr(buf, ':');
	if (!dash || dash == buf)
		return -1;
	*dash = 0;
	if (colon)
		*colon = 0;
	*step = 0;
	if (parse_u64(buf, 0, UINT32_MAX, a) || parse_u64(dash + 1, 0, UINT32_MAX, b) ||
	    (colon && parse_u64(colon + 1, 1, UINT32_MAX, step)))
		return -1;
	return 0;
}

int pb_sizes_resolve(pb_config *cfg, char *err, size_t errlen)
{
	const char *s = cfg->mb_spec;
	char buf[1024];
	uint64_t a, b, step;

	cfg->nsizes = 0;
	if (!strcmp(s, "auto")) {
		for (uint64_t m = 1; m < cfg->batch; m *= 2)
			if (add_size(cfg, m, err, errlen))
				return -1;
		return add_size(cfg, cfg->batch, err, errlen);
	}
	if (strlen(s) >= sizeof(buf) || s[0] == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,"))
		return bad_size(s, err, errlen);
	strcpy(buf, s);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strchr(tok, '-')) {
			if (parse_u64(tok, 0, UINT32_MAX, &a))
				return bad_size(tok, err, errlen);
			if (add_size(cfg, a, err, errlen))
				return -1;
			continue;
		}
		if (parse_range(tok, &a, &b, &step)) /* also "-4": a negative size */
			return bad_size(tok, err, errlen);
		if (a == 0 || b == 0)
			return add_size(cfg, 0, err, errlen);
		if (b < a)
			return fail(err, errlen, "--mb: range %llu-%llu runs backwards",
				    (unsigned long long)a, (unsigned long long)b);
		if (b > cfg->batch)
			return add_size(cfg, b, err, errlen);
		for (uint64_t m = a; m <= b; m = step ? m + step : m * 2)
			if (add_size(cfg, m, err, errlen))
				return -1;
		if (add_size(cfg, b, err, errlen))
			return -1;
	}
	if (cfg->nsizes == 0)
		return bad_size(s, err, errlen);
	qsort(cfg->sizes, cfg->nsizes, sizeof(cfg->sizes[0]), cmp_u32);
	return 0;
}

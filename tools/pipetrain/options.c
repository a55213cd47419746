/*
 * pipetrain options: the command line into a pt_config.
 *
 * Every bad argument ends the run with one line on standard error and exit status 2: the parser never
 * prints the error, it writes the line into the caller's buffer. Numbers are parsed strictly (the whole
 * argument, in range). What depends on the data or the machine (the layer list's ends against the data
 * set, the stage count against the layers and CPUs, files that must exist) is checked by main.c, with the
 * same one-line rule.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipetrain.h"
#include "util/parse.h"

/* "784,256,10": at least two widths, each 1 .. MBP_MODEL_MAX_WIDTH. */
static int parse_layers(const char *s, pt_config *c, char *err, size_t errlen)
{
	unsigned n = 0;
	const char *p = s;
	while (*p) {
		if (n > PT_MAX_LAYERS)
			return fail(err, errlen, "--layers: more than %d layers", PT_MAX_LAYERS);
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		char tok[24];
		uint64_t w;
		if (len == 0 || len >= sizeof tok)
			return fail(err, errlen, "--layers: '%s' is not a list of widths like 784,256,10", s);
		memcpy(tok, p, len);
		tok[len] = 0;
		if (parse_u64(tok, 1, MBP_MODEL_MAX_WIDTH, &w))
			return fail(err, errlen, "--layers: width '%s' is not a whole number from 1 to %u",
				    tok, MBP_MODEL_MAX_WIDTH);
		c->widths[n++] = (uint32_t)w;
		if (comma && !comma[1])
			return fail(err, errlen, "--layers: '%s' ends with a comma", s);
		p = comma ? comma + 1 : p + len;
	}
	if (n < 2)
		return fail(err, errlen, "--layers: '%s' needs an input and an output width at least", s);
	c->layers = n - 1;
	return 0;
}

/* The next comma-separated token of a list at *p into tok, *p moved past it and its comma. @return 1 with
 * more to come, 0 for the last one, -1 for an empty or too long one. */
static int list_next(const char **p, char tok[24])
{
	size_t len = strcspn(*p, ",");
	if (len == 0 || len >= 24)
		return -1;
	memcpy(tok, *p, len);
	tok[len] = 0;
	*p += (*p)[len] ? len + 1 : len;
	return **p || (*p)[-1] == ',' ? 1 : 0;
}

/* --split: strictly increasing layer numbers from 1, comma-separated (checked against the model later). */
static int parse_split(const char *s, pt_config *c, char *err, size_t errlen)
{
	c->nsplit = 0;
	for (const char *p = s;;) {
		char tok[24];
		uint64_t v;
		int more = list_next(&p, tok);
		if (more < 0)
			return fail(err, errlen, "--split: '%s' is not a list of layers like 2,4", s);
		if (parse_u64(tok, 1, PT_MAX_LAYERS - 1, &v))
			return fail(err, errlen, "--split: '%s' is not a layer number from 1 to %d", tok,
				    PT_MAX_LAYERS - 1);
		if (c->nsplit && v <= c->split[c->nsplit - 1])
			return fail(err, errlen, "--split: '%s' is not strictly increasing", s);
		if (c->nsplit + 1 >= MBP_MAX_STAGES)
			return fail(err, errlen, "--split: more than %d stages", MBP_MAX_STAGES);
		c->split[c->nsplit++] = (unsigned)v;
		if (!more)
			return 0;
	}
}

/* --rebalance's argument: key=value pairs, comma-separated: window (steps between looks, 1 to 10^6),
 * threshold (0 to 10), patience (1 to 1000). */
static int parse_rebalance(const char *s, pt_config *c, char *err, size_t errlen)
{
	for (const char *p = s; p && *p;) {
		size_t len = strcspn(p, ","), key = strcspn(p, "=");
		char val[32];
		uint64_t v;
		double d;
		if (key >= len || len - key - 1 >= sizeof val)
			return fail(err, errlen,
				    "--rebalance: '%s' is not a list like window=4,threshold=0.1,patience=2",
				    s);
		memcpy(val, p + key + 1, len - key - 1);
		val[len - key - 1] = 0;
		if (key == 6 && !strncmp(p, "window", 6) && !parse_u64(val, 1, 1000000, &v))
			c->rb_window = (unsigned)v;
		else if (key == 8 && !strncmp(p, "patience", 8) && !parse_u64(val, 1, 1000, &v))
			c->rb_rule.patience = (uint32_t)v;
		else if (key == 9 && !strncmp(p, "threshold", 9) && !parse_double(val, 0, 10, &d))
			c->rb_rule.threshold = d;
		else
			return fail(err, errlen,
				    "--rebalance: '%.*s' is not window=1..1000000, threshold=0..10 or "
				    "patience=1..1000",
				    (int)len, p);
		p += p[len] ? len + 1 : len;
	}
	return 0;
}

/* --recompute: "all", "none", or layer numbers from 0 and ranges A-B, comma-separated ("1,3-5"). */
/* --replicas N,N,...: each stage's thread count, 1 to MBP_TRAIN_MAX_REPLICAS (the stage count is checked
 * once it is known). */
static int parse_replicas(const char *s, pt_config *c, char *err, size_t errlen)
{
	c->nreplicas = 0;
	for (const char *p = s;;) {
		size_t len = strcspn(p, ",");
		char tok[24];
		uint64_t v;
		if (len == 0 || len >= sizeof tok || c->nreplicas == MBP_MAX_STAGES)
			return fail(err, errlen, "--replicas: '%s' is not a list of replica counts like 1,2",
				    s);
		memcpy(tok, p, len);
		tok[len] = 0;
		if (parse_u64(tok, 1, MBP_TRAIN_MAX_REPLICAS, &v))
			return fail(err, errlen, "--replicas: '%s' is not a replica count from 1 to %u", tok,
				    MBP_TRAIN_MAX_REPLICAS);
		c->replicas[c->nreplicas++] = (unsigned)v;
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

static int parse_recompute(const char *s, pt_config *c, char *err, size_t errlen)
{
	c->recompute = 0;
	if (!strcmp(s, "all") || !strcmp(s, "none")) {
		c->recompute = !strcmp(s, "all") ? UINT64_MAX : 0;
		return 0;
	}
	for (const char *p = s;;) {
		char tok[24], whole[24];
		int more = list_next(&p, tok);
		if (more < 0)
			return fail(err, errlen,
				    "--recompute: '%s' is not all, none or a list of layers like 0,2-3", s);
		memcpy(whole, tok, sizeof whole);
		char *dash = strchr(tok, '-');
		if (dash)
			*dash++ = 0;
		uint64_t a, b;
		if (parse_u64(tok, 0, PT_MAX_LAYERS - 1, &a) ||
		    parse_u64(dash ? dash : tok, 0, PT_MAX_LAYERS - 1, &b) || b < a)
			return fail(
			    err, errlen,
			    "--recompute: '%s' is not a layer number from 0 to %d or a range A-B of them",
			    whole, PT_MAX_LAYERS - 1);
		for (uint64_t i = a; i <= b; i++)
			c->recompute |= 1ull << i;
		if (!more)
			return 0;
	}
}

void pt_optim_path(const char *save, char *out, size_t n)
{
	size_t len = strlen(save), ext = strlen(".safetensors");
	if (len > ext && !strcmp(save + len - ext, ".safetensors"))
		snprintf(out, n, "%.*s.optim.safetensors", (int)(len - ext), save);
	else
		snprintf(out, n, "%s.optim", save);
}

enum {
	OPT_DATA = 256,
	OPT_LAYERS,
	OPT_SCHEDULE,
	OPT_SCHEDULE_FILE,
	OPT_MB,
	OPT_OPTIM,
	OPT_LR,
	OPT_MIN_LR,
	OPT_WD,
	OPT_MOMENTUM,
	OPT_WARMUP,
	OPT_CLIP,
	OPT_SEED,
	OPT_SAVE,
	OPT_MODEL,
	OPT_LIMIT,
	OPT_VAL,
	OPT_THREADS,
	OPT_BLAS,
	OPT_PIN,
	OPT_NO_PIN,
	OPT_JSON,
	OPT_CSV,
	OPT_TRACE,
	OPT_PRED,
	OPT_LOG,
	OPT_PLOT,
	OPT_PROGRESS,
	OPT_NO_PROGRESS,
	OPT_HAND_OVER,
	OPT_RECOMPUTE,
	OPT_PLAN,
	OPT_PLAN_ONLY,
	OPT_PLAN_POINTS,
	OPT_MEMORY,
	OPT_SPLIT,
	OPT_REPLICAS,
	OPT_REBALANCE,
};

static const struct option long_opts[] = {
    {"data", required_argument, NULL, OPT_DATA},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"stages", required_argument, NULL, 's'},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"schedule-file", required_argument, NULL, OPT_SCHEDULE_FILE},
    {"batch", required_argument, NULL, 'b'},
    {"mb", required_argument, NULL, OPT_MB},
    {"epochs", required_argument, NULL, 'e'},
    {"optimizer", required_argument, NULL, OPT_OPTIM},
    {"lr", required_argument, NULL, OPT_LR},
    {"min-lr", required_argument, NULL, OPT_MIN_LR},
    {"weight-decay", required_argument, NULL, OPT_WD},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"clip", required_argument, NULL, OPT_CLIP},
    {"seed", required_argument, NULL, OPT_SEED},
    {"save", required_argument, NULL, OPT_SAVE},
    {"model", required_argument, NULL, OPT_MODEL},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"val", required_argument, NULL, OPT_VAL},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"blas-threads", required_argument, NULL, OPT_BLAS},
    {"pin", no_argument, NULL, OPT_PIN},
    {"no-pin", no_argument, NULL, OPT_NO_PIN},
    {"hand-over", required_argument, NULL, OPT_HAND_OVER},
    {"recompute", required_argument, NULL, OPT_RECOMPUTE},
    {"plan", required_argument, NULL, OPT_PLAN},
    {"plan-only", no_argument, NULL, OPT_PLAN_ONLY},
    {"plan-points", required_argument, NULL, OPT_PLAN_POINTS},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"split", required_argument, NULL, OPT_SPLIT},
    {"replicas", required_argument, NULL, OPT_REPLICAS},
    {"rebalance", optional_argument, NULL, OPT_REBALANCE},
    {"json", no_argument, NULL, OPT_JSON},
    {"csv", required_argument, NULL, OPT_CSV},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"predictions", required_argument, NULL, OPT_PRED},
    {"log", required_argument, NULL, OPT_LOG},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

static const char *opt_name(int c, int idx)
{
	static char buf[64];
	if (idx >= 0 && long_opts[idx].name && long_opts[idx].val == c) {
		snprintf(buf, sizeof buf, "--%s", long_opts[idx].name);
		return buf;
	}
	for (const struct option *o = long_opts; o->name; o++)
		if (o->val == c) {
			snprintf(buf, sizeof buf, "--%s", o->name);
			return buf;
		}
	snprintf(buf, sizeof buf, "-%c", c);
	return buf;
}

static void usage(void)
{
	printf(
	    "usage: pipetrain [options]   (no options: a short demonstration)\n"
	    "  --data DIR            Fashion-MNIST IDX files (default %s)\n"
	    "  --layers W0,...,WL    MLP widths, 784 in and 10 out for Fashion-MNIST (default "
	    "784,512,512,10)\n"
	    "  -s, --stages S        pipeline stages (default: one per allowed CPU, at most one per layer)\n"
	    "  --schedule NAME       gpipe, 1f1b, zbh1, zbh2, interleaved, looped-bfs, zbv, dualpipev or\n"
	    "                        auto (default 1f1b); interleaved to dualpipev run the stages as\n"
	    "                        chunks, two a thread unless --threads says (zbv, dualpipev: S = 2\n"
	    "                        threads); auto: built from a profile of the layers' F, B_in, B_w,\n"
	    "                        at 1f1b's memory\n"
	    "  --schedule-file FILE  follow FILE's schedule (torch.distributed.pipelining's CSV: a row\n"
	    "                        per thread of actions such as 0F1,1I1,1W1,0B1); its stages and\n"
	    "                        micro-batches must be the run's\n"
	    "  -b, --batch N         rows per step (default 256)\n"
	    "  --mb M|auto           rows per micro-batch (default 32; a last smaller one takes the rest);\n"
	    "                        auto: the power of two whose step the schedule predicts shortest\n"
	    "  -e, --epochs E        epochs (default 10)\n"
	    "  --optimizer adamw|sgd --lr X --min-lr X --weight-decay X --momentum X --warmup STEPS\n"
	    "  --clip X              clip gradients to global norm X (default 1; 0: off)\n"
	    "  --seed N              weights, split and order (default 1)\n"
	    "  --save FILE           checkpoint after each epoch (optimizer state beside it)\n"
	    "  --model FILE          start from FILE; resume when its optimizer state is beside it\n"
	    "  --limit N             use N training samples only;  --val N  held-out rows (default 5000)\n"
	    "  --threads N           trainer threads (default: one per stage, up to the CPUs)\n"
	    "  --pin, --no-pin       pin the threads to CPUs of the placement plan (default) or not\n"
	    "  --blas-threads N      OpenBLAS threads inside each stage (default 1)\n"
	    "  --hand-over MODE      auto: a stage computes the input gradient of the previous stage's last\n"
	    "                        layer where that balances the stages better; all: wherever the layer\n"
	    "                        allows (ReLU or none, no norm); off (default auto)\n"
	    "  --recompute LIST|all|none   layers (numbered from 0, ranges A-B, e.g. 0,2-3) that keep only\n"
	    "                        their input and recompute their forward for the backward: less\n"
	    "                        activation memory for more compute, the same weights (default none)\n"
	    "  --split L1,...        the stages' first layers after stage 0 (e.g. 2,4: layers 0-1, 2-3,\n"
	    "                        4-): the split as given, no hand-over (default: balanced by a profile)\n"
	    "  --plan auto           choose threads, stages, split, schedule, micro-batch and recomputation\n"
	    "                        from a profile of the layers (at most about 4 s): the shortest\n"
	    "                        predicted step within --memory; print the plan, train with it, then\n"
	    "                        print the measured step and peak memory beside the predictions\n"
	    "  --memory SIZE         --plan auto's budget (64M, 1G: bytes, K/M/G/T binary): activations\n"
	    "                        (stashes, recomputation buffers) + parameters, gradients, optimizer "
	    "state\n"
	    "  --plan-only           with --plan auto: print the plan (--json: as JSON) and exit\n"
	    "  --plan-points FILE    with --plan-only --json: predict, from the plan's profile, the plans\n"
	    "                        of FILE, one a line: SCHEDULE THREADS MB RECOMPUTE SPLIT (none, all\n"
	    "                        or stages 0,2; the first layers of stages 1.., or -): \"points\"\n"
	    "  --replicas N,N,...    threads of each stage (one count per stage, 1 to 16): a stage's\n"
	    "                        replicas run different micro-batches and merge their weight\n"
	    "                        gradients in micro-batch order: the same weights under every\n"
	    "                        schedule (a chunked, built or read one copies each of its threads\n"
	    "                        as often as its chunks' most replicas; default one each)\n"
	    "  --rebalance[=window=N,threshold=X,patience=P]   watch each stage's measured time per\n"
	    "                        step and re-split between steps when the slowest stage stays above\n"
	    "                        (1 + X) x a fresh plan's for P looks, one look every N steps:\n"
	    "                        the same weights (default window=4,threshold=0.1,patience=2; not\n"
	    "                        with --split, --plan auto or --replicas)\n"
	    "  --json                one JSON document on stdout;  --csv FILE|-  one row per epoch\n"
	    "  --log FILE|-          one CSV row per step: step, epoch, loss, accuracy, lr, grad_norm,\n"
	    "                        samples_per_s, step_ms, bubble, elapsed_s\n"
	    "  --plot FILE           the loss and accuracy curves as an SVG picture, written at the end\n"
	    "  --trace FILE          Chrome trace of the last step;  --predictions FILE  test set classes\n"
	    "  --progress, --no-progress   the progress bar and ETA on stderr (default: on a terminal)\n"
	    "  -q, --quiet           no lines but errors and notes\n"
	    "  -h, --help            this text;  -V, --version  the version\n"
	    "Exit status: 0 done, 1 training or the system failed, 2 bad arguments or input,\n"
	    "  130 SIGINT, 143 SIGTERM (the step finished, a checkpoint written with --save).\n"
	    "See pipetrain(1).\n",
	    MBP_FASHION_MNIST_DIR);
}

static void defaults(pt_config *c)
{
	*c = (pt_config){.data = MBP_FASHION_MNIST_DIR,
			 .schedule = MBP_SCHED_1F1B,
			 .batch = 256,
			 .mb = 32,
			 .epochs = 10,
			 .optim = MBP_OPTIM_ADAMW,
			 .lr = 1e-3,
			 .momentum = 0.9,
			 .clip = 1.0,
			 .warmup = -1,
			 .seed = 1,
			 .val = 5000,
			 .pin = true,
			 .rb_window = 4,
			 .rb_rule = {.threshold = 0.10, .patience = 2},
			 .progress = -1};
}

int pt_options_parse(int argc, char **argv, pt_config *c, char *err, size_t errlen)
{
	defaults(c);
	if (argc == 1) {
		/* The demonstration: a small model, a few epochs, two stages. */
		static const uint32_t demo[] = {784, 256, 256, 10};
		memcpy(c->widths, demo, sizeof demo);
		c->layers = 3;
		c->stages = 2;
		c->epochs = 3;
		c->batch = 128;
		c->demo = true;
		return 0;
	}
	bool lr_given = false, progress_given[2] = {false, false}, pin_given[2] = {false, false};
	opterr = 0;
	optind = 1;
	for (;;) {
		int idx = -1;
		int o = getopt_long(argc, argv, ":s:b:e:qhV", long_opts, &idx);
		if (o == -1)
			break;
		const char *name = opt_name(o, idx);
		uint64_t u = 0;
		double d = 0;
		switch (o) {
		case '?':
			return fail(err, errlen, "unknown option '%s' (see --help)", argv[optind - 1]);
		case ':':
			return fail(err, errlen, "option '%s' needs a value", argv[optind - 1]);
		case 'h':
			usage();
			return 1;
		case 'V':
			printf("pipetrain (mbpipe) %s\n", mbp_version());
			return 1;
		case OPT_DATA:
		case OPT_SAVE:
		case OPT_MODEL:
		case OPT_CSV:
		case OPT_TRACE:
		case OPT_PRED:
		case OPT_LOG:
		case OPT_PLOT:
			if (!*optarg)
				return fail(err, errlen, "%s: empty file name", name);
			if (o == OPT_DATA)
				c->data = optarg;
			else if (o == OPT_SAVE)
				c->save = optarg;
			else if (o == OPT_MODEL)
				c->model = optarg;
			else if (o == OPT_CSV)
				c->csv = optarg;
			else if (o == OPT_TRACE)
				c->trace = optarg;
			else if (o == OPT_LOG)
				c->log = optarg;
			else if (o == OPT_PLOT)
				c->plot = optarg;
			else
				c->predictions = optarg;
			break;
		case OPT_LAYERS:
			if (parse_layers(optarg, c, err, errlen))
				return -1;
			break;
		case OPT_RECOMPUTE:
			if (parse_recompute(optarg, c, err, errlen))
				return -1;
			c->given |= PT_GIVEN_RECOMPUTE;
			break;
		case OPT_SPLIT:
			if (parse_split(optarg, c, err, errlen))
				return -1;
			c->given |= PT_GIVEN_SPLIT;
			break;
		case OPT_PLAN:
			if (strcmp(optarg, "auto"))
				return fail(err, errlen, "--plan: '%s' is not auto", optarg);
			c->plan_auto = true;
			break;
		case OPT_PLAN_ONLY:
			c->plan_only = true;
			break;
		case OPT_PLAN_POINTS:
			if (!*optarg)
				return fail(err, errlen, "--plan-points: empty file name");
			c->plan_points = optarg;
			break;
		case OPT_MEMORY:
			if (parse_size_opt("--memory", optarg, UINT64_MAX, &c->memory, err, errlen))
				return -1;
			break;
		case OPT_REPLICAS:
			if (parse_replicas(optarg, c, err, errlen))
				return -1;
			c->given |= PT_GIVEN_REPLICAS;
			break;
		case OPT_REBALANCE:
			c->rebalance = true;
			if (optarg && parse_rebalance(optarg, c, err, errlen))
				return -1;
			break;
		case OPT_SCHEDULE:
			c->given |= PT_GIVEN_SCHEDULE;
			if (mbp_sched_parse(optarg, &c->schedule))
				return fail(err, errlen,
					    "--schedule: '%s' is not gpipe, 1f1b, zbh1, zbh2, interleaved, "
					    "looped-bfs, zbv, dualpipev or auto",
					    optarg);
			break;
		case OPT_SCHEDULE_FILE:
			c->schedule_file = optarg;
			c->schedule = MBP_SCHED_CUSTOM;
			c->given |= PT_GIVEN_SCHEDULE;
			break;
		case OPT_HAND_OVER:
			c->given |= PT_GIVEN_HAND_OVER;
			if (!strcmp(optarg, "auto"))
				c->hand_over = PT_HAND_OVER_AUTO;
			else if (!strcmp(optarg, "all"))
				c->hand_over = PT_HAND_OVER_ALL;
			else if (!strcmp(optarg, "off"))
				c->hand_over = PT_HAND_OVER_OFF;
			else
				return fail(err, errlen, "--hand-over: '%s' is not auto, all or off", optarg);
			break;
		case OPT_OPTIM:
			if (!strcmp(optarg, "adamw"))
				c->optim = MBP_OPTIM_ADAMW;
			else if (!strcmp(optarg, "sgd"))
				c->optim = MBP_OPTIM_SGD;
			else
				return fail(err, errlen, "--optimizer: '%s' is not adamw or sgd", optarg);
			break;
		case OPT_MB:
			c->given |= PT_GIVEN_MB;
			if (!strcmp(optarg, "auto")) {
				c->mb = 0;
				break;
			}
			__attribute__((fallthrough)); /* a number */
		case 's':
		case 'b':
		case 'e':
		case OPT_THREADS:
		case OPT_BLAS:
		case OPT_LIMIT: {
			uint64_t hi = o == 's'				  ? MBP_MAX_STAGES
				      : o == 'e'			  ? 100000
				      : o == OPT_THREADS || o == OPT_BLAS ? 256
									  : 1u << 24;
			if (parse_u64_opt(name, optarg,
					  o == OPT_MB ? "a whole number or auto" : "a whole number", 1, hi,
					  &u, err, errlen))
				return -1;
			if (o == 's')
				c->stages = (unsigned)u, c->given |= PT_GIVEN_STAGES;
			else if (o == 'b')
				c->batch = (uint32_t)u;
			else if (o == OPT_MB)
				c->mb = (uint32_t)u;
			else if (o == 'e')
				c->epochs = (unsigned)u;
			else if (o == OPT_THREADS)
				c->threads = (unsigned)u;
			else if (o == OPT_BLAS)
				c->blas_threads = (unsigned)u;
			else
				c->limit = (uint32_t)u;
			break;
		}
		case OPT_VAL:
		case OPT_WARMUP:
		case OPT_SEED: {
			uint64_t hi = o == OPT_VAL ? 59000 : o == OPT_WARMUP ? 1u << 30 : UINT64_MAX;
			if (parse_u64_opt(name, optarg, "a whole number", 0, hi, &u, err, errlen))
				return -1;
			if (o == OPT_VAL)
				c->val = (uint32_t)u;
			else if (o == OPT_WARMUP)
				c->warmup = (int64_t)u;
			else
				c->seed = u;
			break;
		}
		case OPT_LR:
		case OPT_MIN_LR:
		case OPT_WD:
		case OPT_MOMENTUM:
		case OPT_CLIP: {
			double lo = o == OPT_LR ? 1e-12 : 0, hi = o == OPT_MOMENTUM ? 0.999 : 1e3;
			if (parse_double_opt(name, optarg, "a number", lo, hi, &d, err, errlen))
				return -1;
			if (o == OPT_LR)
				c->lr = d, lr_given = true;
			else if (o == OPT_MIN_LR)
				c->min_lr = d;
			else if (o == OPT_WD)
				c->weight_decay = d;
			else if (o == OPT_MOMENTUM)
				c->momentum = d;
			else
				c->clip = d;
			break;
		}
		case OPT_PIN:
		case OPT_NO_PIN:
			c->pin = o == OPT_PIN;
			pin_given[c->pin] = true;
			break;
		case OPT_JSON:
			c->json = true;
			break;
		case OPT_PROGRESS:
		case OPT_NO_PROGRESS:
			c->progress = o == OPT_PROGRESS;
			progress_given[c->progress] = true;
			break;
		case 'q':
			c->quiet = true;
			break;
		default:
			return fail(err, errlen, "unknown option '%s' (see --help)", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return fail(err, errlen, "unexpected argument '%s' (options only, see --help)", argv[optind]);
	if (!lr_given && c->optim == MBP_OPTIM_SGD)
		c->lr = 0.05; /* SGD with momentum wants a larger rate than Adam's 1e-3 */
	if (c->plan_auto && c->given) {
		static const char *const names[] = {"--stages",	   "--schedule or --schedule-file",
						    "--mb",	   "--recompute",
						    "--hand-over", "--split",
						    "--replicas"};
		return fail(err, errlen, "--plan auto chooses what %s sets: give one or the other",
			    names[__builtin_ctz(c->given)]);
	}
	/* --rebalance moves the split: not with options that fix it (--split; --plan auto's split, schedule
	 * and recomputation are chosen together for --memory, which a move would leave unchecked), nor with
	 * --replicas (a fresh split runs one thread a stage) */
	const unsigned fixed = c->nsplit ? 1 : c->plan_auto ? 2 : c->nreplicas ? 3 : 0;
	if (c->rebalance && fixed)
		return fail(err, errlen, "--rebalance moves the split, which %s fixes",
			    fixed == 1	 ? "--split"
			    : fixed == 2 ? "--plan auto"
					 : "--replicas");
	if (c->plan_auto)
		c->mb = 0; /* chosen by the plan; the default is not checked against --batch */
	if ((c->memory || c->plan_only) && !c->plan_auto)
		return fail(err, errlen, "%s needs --plan auto", c->memory ? "--memory" : "--plan-only");
	if (c->plan_points && !(c->plan_only && c->json))
		return fail(err, errlen, "--plan-points needs --plan auto --plan-only --json");
	if (c->mb > c->batch)
		return fail(err, errlen, "--mb %u is larger than --batch %u", c->mb, c->batch);
	if (c->mb && (c->batch + c->mb - 1) / c->mb > MBP_TRAIN_MAX_MBS)
		return fail(err, errlen, "--batch %u / --mb %u: more than %u micro-batches", c->batch, c->mb,
			    MBP_TRAIN_MAX_MBS);
	if (c->min_lr > c->lr)
		return fail(err, errlen, "--min-lr %g is above --lr %g", c->min_lr, c->lr);
	/* Options that contradict each other are refused, not settled by their order. */
	if (progress_given[0] && progress_given[1])
		return fail(err, errlen, "--progress and --no-progress contradict each other");
	if (c->quiet && progress_given[1])
		return fail(err, errlen, "--quiet and --progress contradict each other");
	if (pin_given[0] && pin_given[1])
		return fail(err, errlen, "--pin and --no-pin contradict each other");
	const bool csv_out = c->csv && !strcmp(c->csv, "-"), log_out = c->log && !strcmp(c->log, "-");
	if (c->json + csv_out + log_out > 1)
		return fail(err, errlen, "%s both want standard output",
			    !c->json  ? "--csv - and --log -"
			    : csv_out ? "--json and --csv -"
				      : "--json and --log -");
	return 0;
}

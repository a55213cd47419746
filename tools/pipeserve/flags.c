/*
 * pipeserve's flags: see flags.h. One table (flags[]) holds every flag with a value, its ps_config field,
 * its type and range; getopt_long is built from it, and every number goes through util/parse.h, the one
 * parser of the tools (digits only: no sign, no space, no suffix). The usage text is the one --help prints
 * and the manual page lists (tests/tool_convention.sh holds them to each other).
 */
#include "config.h"

#include "flags.h"

#include <getopt.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oip.h"
#include "server.h"
#include "util/mpirank.h"
#include "util/parse.h"
#include "util/plural.h"

static const char usage[] =
    "usage: pipeserve [options]\n"
    "Serve an mbpipe model over the Open Inference Protocol (KServe v2 REST) on HTTP/1.1.\n"
    "\n"
    "  --host ADDR              address to listen on (default 127.0.0.1)\n"
    "  --port N                 port (default 8000); 0 picks a free one. The address listened on is\n"
    "                           printed as the first line of standard output\n"
    "  --model FILE             safetensors model (default: the built-in demo model)\n"
    "  --name NAME              model name in URLs (default: the file's stem, or \"demo\")\n"
    "  --demo SPEC              demo model shape: layers=N,in=N,hidden=N,out=N,seed=N,act=relu|gelu|none\n"
    "                           (default layers=6,in=128,hidden=512,out=16,seed=1,act=relu)\n"
    "  --stages N               pipeline stages (default: one per allowed CPU, at most one per layer)\n"
    "  --replicas N|auto        threads per stage, each on the next micro-batch, results in order: N for\n"
    "                           every stage, or auto: stage boundaries and replicas chosen together over\n"
    "                           the allowed CPUs (--stages of them, or any number) (default 1)\n"
    "  --max-batch-rows N       rows per micro-batch (default 32)\n"
    "  --max-queue-delay-us N   longest wait for a micro-batch to fill (default 0)\n"
    "  --max-queue-rows N       admission bound in rows; beyond it requests get 429 (default 4096)\n"
    "  --max-inflight N         micro-batches in the pipeline at once (default 2 x threads:\n"
    "                           stages, their replicas summed, or --rebalance-replicas' threads)\n"
    "  --timeout-ms N           a request still queued after N ms gets 503 (default 10000; 0: none)\n"
    "  --max-body-bytes N       largest request body; beyond it 413 (default 16777216)\n"
    "  --max-inflight-body-bytes N  request body bytes held at once, all requests together; beyond it\n"
    "                           503 (default 268435456)\n"
    "  --threads N              HTTP worker threads (default 2)\n"
    "  --drain-timeout-ms N     on SIGTERM, longest wait for accepted requests (default 30000)\n"
    "  --engine KEY=VAL,...     engine options (mbp_opts_parse keys: ring, ingress, spin_us, pin, cpus...)\n"
    "  --rebalance              move layers between the stages while serving when the measured costs\n"
    "                           call for another split; each move is logged on standard error (with\n"
    "                           --replicas each stage keeps its replicas and the cuts move)\n"
    "  --rebalance-replicas N   with --rebalance: make each stage N threads (or its --replicas, if more),\n"
    "                           the plan's active at start, and let a move choose the cuts and how many\n"
    "                           of each stage's threads take micro-batches together\n"
    "  --model-repository DIR   allow loading new weights over HTTP, from files named inside DIR only\n"
    "                           (default: loading over HTTP is off)\n"
    "  --max-model-bytes N      largest model file loaded (default 4294967296)\n"
    "  --max-connections N      open connections at most (default 512)\n"
    "  --max-connections-per-ip N  connections from one client address at most (default 128)\n"
    "  --request-timeout-ms N   a connection sends each complete request (head and body) within N ms of\n"
    "                           connecting or of its previous answer, or is closed (default 10000)\n"
    "  --header-timeout-ms N    while 3/4 of --max-connections are open, a connection sends its request\n"
    "                           head within N ms, or is closed (default 500)\n"
    "  --load-timeout-ms N      longest time a load may spend reading its file (default 30000)\n"
    "  --write-demo-model FILE  write the --demo model (random weights) to FILE and exit\n"
    "  --describe FILE          describe the model in FILE (layers, widths, sizes) and exit\n"
    "  -h, --help               this text\n"
    "  -V, --version            the version\n"
    "\n"
    "Endpoints: GET /v2, /v2/health/live, /v2/health/ready, /v2/models/NAME[/versions/V][/ready],\n"
    "POST /v2/models/NAME[/versions/V]/infer, POST /v2/repository/models/NAME/load with\n"
    "{\"parameters\": {\"file\": \"FILE\"}} (live weight swap from --model-repository), POST\n"
    "/v2/repository/index, GET /metrics.\n";

/* A bad flag: one line on standard error. Under mpirun every rank finds the same error: rank 0 alone says it. */
static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void usage_error(const char *fmt, ...)
{
	if (mbt_launcher_rank() != 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	ps_vsay(fmt, ap);
	va_end(ap);
}

/* A whole number in [min, max] (util/parse.h), or one line naming the flag. */
static int flag_u64(const char *flag, const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
	char err[256];
	if (parse_u64_opt(flag, v, "a whole number", min, max, out, err, sizeof err) == 0)
		return 0;
	usage_error("%s", err);
	return -1;
}

/* The flags with a value: name, type of the ps_config field, where it is, and the range of a number. */
typedef struct flag {
	const char *name;
	enum { F_STR, F_UNSIGNED, F_U32, F_U64, F_SIZE } kind;
	size_t off;
	uint64_t min, max;
} flag;

#define FLAG(name, kind, field, min, max)                                                                    \
	{                                                                                                    \
		name, kind, offsetof(ps_config, field), min, max                                             \
	}
static const flag flags[] = {
    FLAG("host", F_STR, host, 0, 0),
    FLAG("port", F_UNSIGNED, port, 0, 65535),
    FLAG("model", F_STR, model_path, 0, 0),
    FLAG("name", F_STR, name, 0, 0),
    FLAG("demo", F_STR, demo, 0, 0),
    FLAG("stages", F_UNSIGNED, stages, 0, MBP_MAX_STAGES),
    FLAG("replicas", F_STR, replicas, 0, 0),
    FLAG("max-batch-rows", F_U32, max_batch_rows, 1, 65536),
    FLAG("max-queue-delay-us", F_U64, max_queue_delay_us, 0, 60000000),
    FLAG("max-queue-rows", F_SIZE, max_queue_rows, 1, 1u << 30),
    FLAG("max-inflight", F_U32, max_inflight, 0, 65536),
    FLAG("timeout-ms", F_U64, timeout_ms, 0, 86400000),
    FLAG("max-body-bytes", F_SIZE, max_body_bytes, 1, (uint64_t)1 << 34),
    FLAG("max-inflight-body-bytes", F_U64, max_inflight_body_bytes, 1, (uint64_t)1 << 40),
    FLAG("threads", F_UNSIGNED, threads, 1, 256),
    FLAG("drain-timeout-ms", F_U64, drain_timeout_ms, 0, 86400000),
    FLAG("engine", F_STR, mbp_conf, 0, 0),
    FLAG("model-repository", F_STR, repository, 0, 0),
    FLAG("write-demo-model", F_STR, write_demo, 0, 0),
    FLAG("describe", F_STR, describe, 0, 0),
    FLAG("max-connections", F_UNSIGNED, max_connections, 1, 65536),
    FLAG("max-connections-per-ip", F_UNSIGNED, max_conns_per_ip, 1, 65536),
    FLAG("request-timeout-ms", F_U64, request_timeout_ms, 1, 3600000),
    FLAG("header-timeout-ms", F_U64, header_timeout_ms, 1, 3600000),
    FLAG("max-model-bytes", F_U64, max_model_bytes, 1, (uint64_t)1 << 40),
    FLAG("load-timeout-ms", F_U64, load_timeout_ms, 1, 86400000),
    FLAG("rebalance-replicas", F_UNSIGNED, rebalance_replicas, 1, MBP_MAX_REPLICAS),
};
#define NFLAGS (sizeof flags / sizeof flags[0])

static int set_flag(ps_config *c, const flag *f, const char *arg)
{
	void *field = (char *)c + f->off;
	if (f->kind == F_STR) {
		*(const char **)field = arg;
		return 0;
	}
	char name[64];
	snprintf(name, sizeof name, "--%s", f->name);
	uint64_t v;
	if (flag_u64(name, arg, f->min, f->max, &v))
		return -1;
	switch (f->kind) {
	case F_UNSIGNED:
		*(unsigned *)field = (unsigned)v;
		break;
	case F_U32:
		*(uint32_t *)field = (uint32_t)v;
		break;
	case F_U64:
		*(uint64_t *)field = v;
		break;
	case F_SIZE:
		*(size_t *)field = (size_t)v;
		break;
	case F_STR:
		break;
	}
	return 0;
}

/* Parse the --demo spec over the defaults and check that the model fits --max-model-bytes. @return 0 or -1
 * (one line printed, naming the key and its rule). */
static int parse_demo(const char *spec, uint64_t max_bytes, mbp_model_spec *ms)
{
	*ms = (mbp_model_spec){.layers = 6,
			       .in = 128,
			       .hidden = 512,
			       .out = 16,
			       .act = MBP_ACT_RELU,
			       .dtype = MBP_DTYPE_F32,
			       .seed = 1};
	static const struct {
		const char *key;
		uint64_t min, max;
	} keys[] = {{"layers", 1, MBP_MODEL_MAX_LAYERS},
		    {"in", 1, MBP_MODEL_MAX_WIDTH},
		    {"hidden", 1, MBP_MODEL_MAX_WIDTH},
		    {"out", 1, MBP_MODEL_MAX_WIDTH},
		    {"seed", 0, UINT64_MAX},
		    {"norm", 0, 1}};
	char buf[256];
	if (strlen(spec) >= sizeof buf) {
		usage_error("--demo: the spec is longer than %zu characters", sizeof buf - 1);
		return -1;
	}
	strcpy(buf, spec);
	char *save = NULL;
	for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '=');
		if (!eq) {
			usage_error("--demo: \"%s\" is not KEY=VALUE", kv);
			return -1;
		}
		*eq = '\0';
		const char *k = kv, *val = eq + 1;
		if (strcmp(k, "act") == 0) {
			if (strcmp(val, "relu") == 0)
				ms->act = MBP_ACT_RELU;
			else if (strcmp(val, "gelu") == 0)
				ms->act = MBP_ACT_GELU;
			else if (strcmp(val, "none") == 0)
				ms->act = MBP_ACT_NONE;
			else {
				usage_error("--demo: act is relu, gelu or none, got \"%s\"", val);
				return -1;
			}
			continue;
		}
		size_t i = 0;
		while (i < sizeof keys / sizeof keys[0] && strcmp(keys[i].key, k) != 0)
			i++;
		if (i == sizeof keys / sizeof keys[0]) {
			usage_error(
			    "--demo: unknown key \"%s\" (keys: layers, in, hidden, out, seed, act, norm)", k);
			return -1;
		}
		char name[32];
		snprintf(name, sizeof name, "--demo %s", k);
		uint64_t v;
		if (flag_u64(name, val, keys[i].min, keys[i].max, &v))
			return -1;
		switch (i) {
		case 0:
			ms->layers = (unsigned)v;
			break;
		case 1:
			ms->in = (uint32_t)v;
			break;
		case 2:
			ms->hidden = (uint32_t)v;
			break;
		case 3:
			ms->out = (uint32_t)v;
			break;
		case 4:
			ms->seed = v;
			break;
		default:
			ms->norm = v != 0;
			break;
		}
	}
	/* Its weights, as the file will hold them (float32): within the bound every load has. */
	double bytes = 0;
	for (unsigned l = 0; l < ms->layers; l++) {
		double in = l == 0 ? ms->in : ms->hidden, out = l + 1 == ms->layers ? ms->out : ms->hidden;
		bytes += 4.0 * (in * out + out * (ms->norm && l + 1 < ms->layers ? 3 : 1));
	}
	if (bytes > (double)max_bytes) {
		usage_error(
		    "--demo: the model would hold %.0f bytes of weights, above --max-model-bytes (%llu)",
		    bytes, (unsigned long long)max_bytes);
		return -1;
	}
	return 0;
}

int ps_flags_engine_opts(mbp_opts *o, const char *what, const char *conf, char *err, size_t n)
{
	size_t pos = 0;
	int rc = mbp_opts_parse(o, conf, &pos);
	if (rc)
		snprintf(err, n, "%s: %s (at '%.*s')", what, mbp_opts_rule(conf + pos),
			 (int)strcspn(conf + pos, ","), conf + pos);
	return rc;
}

/* Engine options are checked where they are given (each on the defaults), with one line naming the flag
 * and the key's rule. @return 0 or -1 (said). */
static int check_engine_opts(const char *what, const char *conf)
{
	mbp_opts o;
	mbp_opts_init(&o);
	char err[512];
	if (ps_flags_engine_opts(&o, what, conf, err, sizeof err) == 0)
		return 0;
	usage_error("%s", err);
	return -1;
}

const char *ps_flags_model_name(const ps_config *c, char *out, size_t n)
{
	char tmp[4096];
	const char *name = "demo";
	size_t len = 4;
	if (c->name) {
		name = c->name;
		len = strlen(name);
	} else if (c->model_path) {
		snprintf(tmp, sizeof tmp, "%s", c->model_path);
		name = basename(tmp);
		const char *dot = strrchr(name, '.');
		len = dot && dot != name ? (size_t)(dot - name) : strlen(name);
	}
	if (len == 0)
		return "is empty";
	if (len >= n)
		return "is too long";
	snprintf(out, n, "%.*s", (int)len, name);
	if (strchr(out, '/'))
		return "holds a '/'";
	if (strchr(out, ' ') || ps_has_control(out))
		return "holds a space or a control character";
	return NULL;
}

int ps_flags_parse(int argc, char **argv, ps_config *c)
{
	struct option opts[NFLAGS + 4];
	for (size_t i = 0; i < NFLAGS; i++)
		opts[i] = (struct option){flags[i].name, required_argument, NULL, 256 + (int)i};
	opts[NFLAGS] = (struct option){"help", no_argument, NULL, 'h'};
	opts[NFLAGS + 1] = (struct option){"version", no_argument, NULL, 'V'};
	opts[NFLAGS + 2] = (struct option){"rebalance", no_argument, NULL, 'R'};
	opts[NFLAGS + 3] = (struct option){NULL, 0, NULL, 0};
	*c = (ps_config){.host = "127.0.0.1",
			 .port = 8000,
			 .demo = "",
			 .max_batch_rows = 32,
			 .max_queue_rows = 4096,
			 .timeout_ms = 10000,
			 .max_body_bytes = 16u << 20,
			 .threads = 2,
			 .drain_timeout_ms = 30000,
			 .max_model_bytes = (uint64_t)4 << 30,
			 .max_inflight_body_bytes = (uint64_t)256 << 20,
			 .max_connections = 512,
			 .max_conns_per_ip = 128,
			 .request_timeout_ms = 10000,
			 .header_timeout_ms = 500,
			 .load_timeout_ms = 30000};
	int o;
	opterr = 0; /* one line of our own instead of getopt's */
	while ((o = getopt_long(argc, argv, ":hV", opts, NULL)) != -1) {
		if (o == 'h') {
			fputs(usage, stdout);
			return 1;
		}
		if (o == 'V') {
			printf("pipeserve (mbpipe) %s\n", mbp_version());
			return 1;
		}
		if (o == 'R') {
			c->rebalance = true;
			continue;
		}
		if (o < 256 || o >= 256 + (int)NFLAGS) { /* ':' a value missing, '?' not an option */
			usage_error("%s \"%s\" (pipeserve --help lists the options)",
				    o == ':' ? "option needs a value:" : "unknown option", argv[optind - 1]);
			return -1;
		}
		if (set_flag(c, &flags[o - 256], optarg))
			return -1;
	}
	if (optind < argc) {
		usage_error("unexpected argument \"%s\" (options only; pipeserve --help)", argv[optind]);
		return -1;
	}
	if (c->rebalance_replicas && !c->rebalance) {
		usage_error("--rebalance-replicas %u: only with --rebalance", c->rebalance_replicas);
		return -1;
	}
	if (check_engine_opts("MBPIPE_OPTS", getenv("MBPIPE_OPTS")) ||
	    check_engine_opts("--engine", c->mbp_conf))
		return -1;
	if ((!c->model_path || c->write_demo) && parse_demo(c->demo, c->max_model_bytes, &c->demo_spec))
		return -1;
	if (c->write_demo && c->describe) {
		usage_error("--write-demo-model and --describe: one at a time");
		return -1;
	}
	char name[PS_NAME_MAX];
	const char *why = c->write_demo || c->describe ? NULL : ps_flags_model_name(c, name, sizeof name);
	if (why && c->name) {
		usage_error("--name \"%s\": the model's name in URLs %s", c->name, why);
		return -1;
	}
	if (why) {
		usage_error(
		    "--model %s: the file's name, the model's name in URLs by default, %s (give --name)",
		    c->model_path, why);
		return -1;
	}
	char fwhy[512]; /* written by rename: absent or a regular file, in a folder that takes one */
	if (c->write_demo && mbp_file_check(c->write_demo, fwhy, sizeof fwhy)) {
		usage_error("--write-demo-model %s: %s", c->write_demo, fwhy);
		return -1;
	}
	return 0;
}

long ps_flags_replicas(const ps_config *c, bool mpi)
{
	if (!c->replicas)
		return 0;
	if (mpi) {
		usage_error("--replicas: not under mpirun (each rank runs its stages on one thread each)");
		return -1;
	}
	if (!strcmp(c->replicas, "auto"))
		return UINT32_MAX;
	uint64_t v = 0;
	char err[256];
	if (parse_u64_opt("--replicas", c->replicas, "auto or a whole number", 1, MBP_MAX_REPLICAS, &v, err,
			  sizeof err)) {
		usage_error("%s", err);
		return -1;
	}
	return (long)v;
}

unsigned ps_flags_stages(const ps_config *c, unsigned layers, unsigned deflt)
{
	if (c->stages > layers) {
		usage_error("--stages %u: the model has only %u %s", c->stages, layers,
			    PLURAL(layers, "layer", "layers"));
		return 0;
	}
	unsigned n = c->stages ? c->stages : deflt;
	if (n > layers)
		n = layers; /* the default, one stage per CPU or per rank, is at most one per layer */
	return n > MBP_MAX_STAGES ? MBP_MAX_STAGES : n;
}

/*
 * pipeserve: serve one mbpipe model over the Open Inference Protocol (KServe v2 REST).
 *
 * Start-up: parse the flags, load the model (--model FILE, or write and load the built-in random demo
 * model), split it into stages by measured layer cost (mbp_model_balance), start the pipeline and the
 * batcher, listen, print the address as the first line on stdout, then log (stderr) the model, the
 * OpenBLAS kernel and the placement. SIGINT and SIGTERM are blocked in every thread, from before the
 * libraries start theirs (block_stop_signals), and taken by the main thread with sigwait: on the first one,
 * readiness turns false, new requests get 503, accepted ones finish, and the process exits 0; a second
 * signal during that wait exits at once with status 1.
 */
#include "config.h"

#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <getopt.h>
#include <stddef.h>
#include <libgen.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/blas.h"
#include "util/clock.h"
#include "util/digest.h"
#include "util/mpirank.h"
#include "util/parse.h"
#include "util/plural.h"

/* ---- flags ---- */

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
    "  --max-batch-rows N       rows per micro-batch (default 32)\n"
    "  --max-queue-delay-us N   longest wait for a micro-batch to fill (default 0)\n"
    "  --max-queue-rows N       admission bound in rows; beyond it requests get 429 (default 4096)\n"
    "  --max-inflight N         micro-batches in the pipeline at once (default 2 x stages)\n"
    "  --timeout-ms N           a request still queued after N ms gets 503 (default 10000; 0: none)\n"
    "  --max-body-bytes N       largest request body; beyond it 413 (default 16777216)\n"
    "  --max-inflight-body-bytes N  request body bytes held at once, all requests together; beyond it\n"
    "                           503 (default 268435456)\n"
    "  --threads N              HTTP worker threads (default 2)\n"
    "  --drain-timeout-ms N     on SIGTERM, longest wait for accepted requests (default 30000)\n"
    "  --engine KEY=VAL,...     engine options (mbp_opts_parse keys: ring, ingress, spin_us, pin, cpus...)\n"
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

/* A whole number in [min, max] (tools/parse.h, the one parser of the tools), or one line naming the flag. */
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
			usage_error("--demo: unknown key \"%s\" (keys: layers, in, hidden, out, seed, "
				    "act, "
				    "norm)",
				    k);
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
		usage_error("--demo: the model would hold %.0f bytes of weights, above --max-model-bytes "
			    "(%llu)",
			    bytes, (unsigned long long)max_bytes);
		return -1;
	}
	return 0;
}

/* Engine options are checked where they are given, with one line naming the flag and the key's rule.
 * @return 0 or -1 (message printed). */
static int check_engine_opts(const char *what, const char *conf)
{
	mbp_opts o;
	mbp_opts_init(&o);
	size_t pos = 0;
	if (mbp_opts_parse(&o, conf, &pos) == 0)
		return 0;
	usage_error("%s: %s (at '%.*s')", what, mbp_opts_rule(conf + pos), (int)strcspn(conf + pos, ","),
		    conf + pos);
	return -1;
}

/*
 * The model's name in URLs: --name, or the --model file's name without its extension, or "demo", into out
 * (n bytes). @return NULL, or what is wrong with it: a URL has to carry it as it is.
 */
static const char *model_name(const ps_config *c, char *out, size_t n)
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

/* @return 0, 1 (--help shown), -1 (bad flags). */
static int parse_flags(int argc, char **argv, ps_config *c)
{
	struct option opts[NFLAGS + 3];
	for (size_t i = 0; i < NFLAGS; i++)
		opts[i] = (struct option){flags[i].name, required_argument, NULL, 256 + (int)i};
	opts[NFLAGS] = (struct option){"help", no_argument, NULL, 'h'};
	opts[NFLAGS + 1] = (struct option){"version", no_argument, NULL, 'V'};
	opts[NFLAGS + 2] = (struct option){NULL, 0, NULL, 0};
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
	if (check_engine_opts("MBPIPE_OPTS", getenv("MBPIPE_OPTS")) ||
	    check_engine_opts("--engine", c->mbp_conf))
		return -1;
	if ((!c->model_path || c->write_demo) && parse_demo(c->demo, c->max_model_bytes, &c->demo_spec))
		return -1;
	if (c->write_demo && c->describe) {
		usage_error("--write-demo-model and --describe: one at a time");
		return -1;
	}
	char name[sizeof((ps_server *)0)->name];
	const char *why = c->write_demo || c->describe ? NULL : model_name(c, name, sizeof name);
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

/* ---- model ---- */

/* Whether a failed load of --model is the file's fault (exit 2) rather than the machine's (exit 1). */
static bool arg_problem(int rc)
{
	return rc != -ENOMEM && rc != -EIO && rc != -ETIMEDOUT && rc != -EINTR;
}

/* Load the model file that the option `opt` names (with the --max-model-bytes and --load-timeout-ms
 * bounds). @return 0, PS_EUSAGE (the file's fault) or another -errno, with one line said naming both. */
static int load_model_file(const ps_config *c, const char *opt, const char *path, mbp_model **m)
{
	mbp_model_error e;
	mbp_model_load_opts lo = {.max_bytes = c->max_model_bytes,
				  .timeout_ns = c->load_timeout_ms * 1000000};
	char note[PATH_MAX + 128];
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	int rc = fd < 0 ? -errno : mbp_model_load_fd(m, fd, path, &lo, &e);
	if (fd >= 0)
		close(fd);
	if (rc && fd < 0)
		ps_say("%s: %s: %s", opt, path, strerror(-rc));
	else if (rc)
		ps_say("%s: %s", opt, e.msg); /* e.msg begins with the file's name */
	else if (digest_note_line(*m, path, note, sizeof note))
		ps_say("note: %s", note);
	return rc && arg_problem(rc) ? PS_EUSAGE : rc;
}

/* Write the demo model into a fresh temporary directory, load it, remove the file (the mapping stays). */
static int load_demo(ps_server *s)
{
	const mbp_model_spec ms = s->cfg.demo_spec;
	const char *tmp = getenv("TMPDIR");
	char dir[512], path[600];
	snprintf(dir, sizeof dir, "%s/pipeserve-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		int rc = -errno;
		ps_say("cannot create a temporary directory for the demo model in %s: %s",
		       tmp && *tmp ? tmp : "/tmp", strerror(-rc));
		return rc;
	}
	snprintf(path, sizeof path, "%s/demo.safetensors", dir);
	int rc = mbp_model_write_random(path, &ms);
	mbp_model_error e = {0};
	if (rc) {
		ps_say("cannot make the demo model: %s", mbp_strerror(rc));
	} else if (s->mpi) { /* every rank writes the same demo model (one seed) and loads its layers */
#ifdef PS_WITH_MPI
		rc = ps_mpi_load(s, path);
#endif
	} else if ((rc = mbp_model_load(&s->model, path, &e))) {
		ps_say("cannot make the demo model: %s", rc == e.code ? e.msg : mbp_strerror(rc));
	}
	unlink(path);
	rmdir(dir);
	return rc;
}

static int setup_model(ps_server *s)
{
	if (s->cfg.model_path && s->mpi) {
#ifdef PS_WITH_MPI
		int rc = ps_mpi_load(s, s->cfg.model_path);
		if (rc)
			return rc;
#endif
		s->model_path = strdup(s->cfg.model_path);
		if (!s->model_path)
			return -ENOMEM;
	} else if (s->cfg.model_path) {
		int rc = load_model_file(&s->cfg, "--model", s->cfg.model_path, &s->model);
		if (rc)
			return rc;
		s->model_path = strdup(s->cfg.model_path);
		if (!s->model_path)
			return -ENOMEM;
	} else {
		int rc = load_demo(s);
		if (rc)
			return rc;
	}
	model_name(&s->cfg, s->name, sizeof s->name); /* checked with the flags */

	unsigned layers = mbp_model_layers(s->model);
	unsigned stages = s->mpi ? s->plan.stages : s->cfg.stages; /* under mpirun: this rank's, planned */
	if (!stages) {
		int ncpu = mbp_cpus_allowed(NULL, 0, NULL);
		stages = ncpu > 0 ? (unsigned)ncpu : 1;
	}
	if (!s->mpi && s->cfg.stages > layers) { /* under mpirun: checked by ps_mpi_load */
		ps_say("--stages %u: the model has only %u %s", s->cfg.stages, layers,
		       PLURAL(layers, "layer", "layers"));
		return PS_EUSAGE;
	}
	if (stages > layers)
		stages = layers; /* the default, one stage per CPU, is at most one per layer */
	if (stages > MBP_MAX_STAGES)
		stages = MBP_MAX_STAGES;
	int rc = s->mpi ? 0 : mbp_model_balance(s->model, stages, s->cfg.max_batch_rows, -1, &s->plan);
	if (!rc)
		rc = mbp_model_stages_new(&s->stages, s->model, &s->plan, s->cfg.max_batch_rows);
	if (rc) {
		ps_say("cannot split the model into %u stages: %s", stages, mbp_strerror(rc));
		return rc;
	}
	s->info = (ps_model_info){.name = s->name,
				  .version = "1",
				  .platform = "mbpipe",
				  .input_name = "input",
				  .output_name = "output",
				  .in_width = mbp_model_in_width(s->model),
				  .out_width = s->mpi ? s->out_width : mbp_model_out_width(s->model),
				  .max_rows = s->cfg.max_queue_rows};
	return 0;
}

/* The engine options (MBPIPE_OPTS, then --engine) and this process's stage descriptors. */
static int engine_setup(ps_server *s, mbp_opts *op, mbp_stage_desc *d, unsigned *n)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.pinning = s->mpi ? MBP_PIN_NONE : MBP_PIN_PLAN; /* ranks on one machine would pin their stages
							    onto the same CPUs */
	size_t errpos = 0;
	const char *env = getenv("MBPIPE_OPTS"); /* the same variable pipebench reads; --engine wins */
	if (mbp_opts_parse(&o, env, &errpos)) {
		ps_log("bad MBPIPE_OPTS at offset %zu: \"%s\"", errpos, env);
		return -EINVAL;
	}
	if (mbp_opts_parse(&o, s->cfg.mbp_conf, &errpos)) {
		ps_log("bad --engine option at offset %zu: \"%s\"", errpos, s->cfg.mbp_conf);
		return -EINVAL;
	}
	o.in_row_bytes = (size_t)mbp_model_in_width(s->model) * sizeof(float);
	o.max_mb_rows = s->cfg.max_batch_rows;
	*n = mbp_model_stages_count(s->stages);
	for (unsigned i = 0; i < *n; i++) {
		int rc = mbp_model_stage_desc(s->stages, i, &d[i]);
		if (rc)
			return rc;
	}
	*op = o;
	return 0;
}

static int setup_engine(ps_server *s)
{
	mbp_opts o;
	mbp_stage_desc d[MBP_MAX_STAGES];
	unsigned nst;
	int rc = engine_setup(s, &o, d, &nst);
	if (rc)
		return rc;
	nst = s->mpi ? s->all_stages : nst; /* micro-batches in flight: 2 per stage, all ranks' stages */
	ps_batcher_cfg bc = {.max_batch_rows = s->cfg.max_batch_rows,
			     .max_delay_ns = s->cfg.max_queue_delay_us * 1000,
			     .max_queue_rows = s->cfg.max_queue_rows,
			     .timeout_ns = s->cfg.timeout_ms * 1000000,
			     .out_row_bytes = s->info.out_width * sizeof(float),
			     .max_inflight = s->cfg.max_inflight ? s->cfg.max_inflight : 2 * nst,
			     .model = s->model};
#ifdef PS_WITH_MPI
	if (s->mpi)
		bc.engine = ps_mpi_engine();
#endif
	rc = ps_batcher_new(&s->batcher, &bc, &o, d, mbp_model_stages_count(s->stages), &s->metrics);
	if (rc)
		ps_say("cannot start the pipeline: %s", mbp_strerror(rc));
	return rc;
}

static void log_startup(ps_server *s)
{
	const ps_config *c = &s->cfg;
	unsigned nst = s->mpi ? s->all_stages : mbp_model_stages_count(s->stages);
	/* A load by a client that already has the address may replace model_path meanwhile. */
	pthread_mutex_lock(&s->reload_mu);
	ps_log("start: mbpipe %s, model \"%s\" (%s), %u layers, %zu -> %zu floats per row, %u stages",
	       mbp_version(), s->name, s->model_path ? s->model_path : "built-in demo",
	       s->mpi ? s->all_layers : mbp_model_layers(s->model), s->info.in_width, s->info.out_width, nst);
	pthread_mutex_unlock(&s->reload_mu);
	if (s->mpi)
		ps_log("mpi: %u ranks; rank 0 (this one, pid %d) runs stages %u-%u (layers %u-%u), the "
		       "others the rest",
		       s->ranks, (int)getpid(), s->stage_lo, s->stage_hi - 1, s->first_layer,
		       s->first_layer + mbp_model_layers(s->model) - 1);
	ps_log("batching: max %u rows per micro-batch, delay %llu us, queue %zu rows, %u micro-batches in "
	       "flight, "
	       "timeout %llu ms, %u HTTP threads",
	       c->max_batch_rows, (unsigned long long)c->max_queue_delay_us, c->max_queue_rows,
	       c->max_inflight ? c->max_inflight : 2 * nst, (unsigned long long)c->timeout_ms, c->threads);
	if (c->repository)
		ps_log("loads: over HTTP from the model repository %s (files at most %llu bytes, %llu ms)",
		       c->repository, (unsigned long long)c->max_model_bytes,
		       (unsigned long long)c->load_timeout_ms);
	else
		ps_log("loads: off over HTTP (no --model-repository)");
	ps_log("limits: %u connections, %u per address, %llu ms per request (%llu ms per head near the "
	       "connection limit), %llu body bytes in flight",
	       c->max_connections, c->max_conns_per_ip, (unsigned long long)c->request_timeout_ms,
	       (unsigned long long)c->header_timeout_ms, (unsigned long long)c->max_inflight_body_bytes);
	ps_log("blas: %s", mbp_blas_info());
	char warn[512];
	if (blas_warning_line(warn, sizeof warn))
		ps_log("%s", warn);
	char text[4096];
	mbp_model_plan_describe(&s->plan, text, sizeof text);
	for (char *save = NULL, *line = s->mpi ? NULL : strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save))
		ps_log("plan: %s", line); /* under mpirun the split is by layer count: no costs to show */
	mbp_pipeline *p = ps_batcher_pipeline(s->batcher);
	mbp_placement pl[MBP_MAX_STAGES];
	mbp_stage_stats ss[MBP_MAX_STAGES];
	int n = mbp_pipeline_placement(p, pl, MBP_MAX_STAGES);
	mbp_pipeline_stats ps;
	int ns = mbp_pipeline_stats_get(p, &ps, ss, MBP_MAX_STAGES);
	for (int i = 0; i < n && i < MBP_MAX_STAGES; i++) {
		const char *name = i < ns ? ss[i].name : "?";
		if (pl[i].pin_error)
			ps_log("placement: stage %d (%s) -> thread %u, unpinned (pinning failed: %s)", i,
			       name, pl[i].thread, mbp_strerror(pl[i].pin_error));
		else if (pl[i].cpu < 0)
			ps_log("placement: stage %d (%s) -> thread %u, not pinned", i, name, pl[i].thread);
		else if (pl[i].sharing)
			ps_log("placement: stage %d (%s) -> thread %u, cpu %d, shared with %u other threads "
			       "or ranks",
			       i, name, pl[i].thread, pl[i].cpu, pl[i].sharing);
		else
			ps_log("placement: stage %d (%s) -> thread %u, cpu %d", i, name, pl[i].thread,
			       pl[i].cpu);
	}
}

/* ---- model files from the command line ---- */

/* --write-demo-model FILE: the --demo model with its random weights, then its description. */
static int write_demo_model(const ps_config *c)
{
	int rc = mbp_model_write_random(c->write_demo, &c->demo_spec);
	if (rc) {
		fprintf(stderr, "pipeserve: cannot write %s: %s\n", c->write_demo, mbp_strerror(rc));
		return 1;
	}
	printf("wrote %s\n", c->write_demo);
	return 0;
}

/* --describe FILE: load it (with the --max-model-bytes bound) and print its layers. @return the exit
 * status. */
static int describe_model(const ps_config *c)
{
	mbp_model *m = NULL;
	int rc = load_model_file(c, "--describe", c->describe, &m);
	if (rc)
		return rc == PS_EUSAGE ? 2 : 1;
	int n = mbp_model_describe(m, NULL, 0);
	char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (text) {
		mbp_model_describe(m, text, (size_t)n + 1);
		printf("%s: %u -> %u floats per row\n%s", c->describe, mbp_model_in_width(m),
		       mbp_model_out_width(m), text);
	}
	free(text);
	mbp_model_destroy(m);
	return text ? 0 : 1;
}

/* ---- shutdown ---- */

/* Wait until no admitted request is left, at most `ms` milliseconds. A second signal exits at once. */
static bool wait_inflight(ps_server *s, const sigset_t *sigs, uint64_t ms)
{
	uint64_t end = mbt_now_ns() + ms * 1000000;
	while (atomic_load(&s->inflight) || atomic_load(&s->loads)) {
		if (mbt_now_ns() >= end)
			return false;
		struct timespec ts = mbt_timespec(1000000);
		int sig = sigtimedwait(sigs, NULL, &ts);
		if (sig > 0) {
			ps_log("second signal (%s) while draining: exiting now", strsignal(sig));
			_exit(1);
		}
	}
	return true;
}

/* ---- signals ---- */

static pthread_t main_thread;

/* A stop signal taken by a thread that does not block it (one that unblocked it itself): pending for the
 * main thread's sigwait instead. pthread_kill is async-signal-safe (POSIX.1-2008 TC1). */
static void forward_stop(int sig)
{
	int saved = errno;
	pthread_kill(main_thread, sig);
	errno = saved;
}

/*
 * Block SIGINT and SIGTERM before any thread starts, so that every thread inherits the mask and the main
 * thread's sigwait alone takes them. This runs from .preinit_array, before the constructors of the shared
 * libraries: OpenBLAS starts its thread pool in its constructor, before main, and a stop signal the kernel
 * handed one of those threads took its default action (exit 143) when main blocked the signals only later.
 * A signal that comes while the server starts stays pending until it listens, then stops it cleanly (exit
 * 0); one that comes before this runs, while the dynamic loader maps the libraries, still takes its default
 * action. The handler also undoes a SIG_IGN inherited from the parent (a shell's background job ignores
 * SIGINT), which would make sigwait miss the signal.
 */
static void block_stop_signals(void)
{
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	main_thread = pthread_self();
	struct sigaction sa = {.sa_handler = forward_stop};
	sigfillset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

__attribute__((used,
	       section(".preinit_array"))) static void (*const preinit_block)(void) = block_stop_signals;

/* ---- under mpirun ---- */

/* The exit status, after finalising MPI when it was started. */
static int finish(ps_server *s, int status)
{
#ifdef PS_WITH_MPI
	if (s->mpi)
		ps_mpi_finalize();
#endif
	return status;
}

/* Start MPI and load this rank's layers; the ranks agree that every one of them could. Ranks other than 0
 * then run their stages until rank 0 ends the run. @return the exit status for a rank that is done, or
 * -1 for rank 0 to go on serving HTTP. */
static int mpi_start(ps_server *s, int *argc, char ***argv)
{
#ifdef PS_WITH_MPI
	int rc = ps_mpi_init(argc, argv, s);
	if (rc) {
		fprintf(stderr, "pipeserve: MPI: %s\n", mbp_strerror(rc));
		return 1;
	}
	int st = 0;
	if (s->cfg.repository) {
		if (s->rank == 0)
			fprintf(stderr,
				"pipeserve: --model-repository: loading models over HTTP is not supported "
				"when the stages run on several MPI ranks\n");
		st = 2;
	}
	if (!st) {
		rc = setup_model(s);
		st = rc == PS_EUSAGE ? 2 : rc ? 1 : 0;
	}
	st = ps_mpi_agree(st);
	if (!st && s->rank == 0)
		return -1;
	if (!st) {
		mbp_opts o;
		mbp_stage_desc d[MBP_MAX_STAGES];
		unsigned n;
		rc = engine_setup(s, &o, d, &n);
		if (!rc)
			rc = ps_mpi_serve(s, &o, d, n);
		st = rc ? 1 : 0;
	}
	mbp_model_stages_destroy(s->stages);
	mbp_model_destroy(s->model);
	free(s->model_path);
	return finish(s, st);
#else
	(void)argc;
	(void)argv;
	(void)s;
	fprintf(stderr, "pipeserve: started by mpirun, but this pipeserve was built without MPI (configure "
			"--with-mpi)\n");
	return 2;
#endif
}

int main(int argc, char **argv)
{
	static ps_server srv;
	ps_server *s = &srv;
	int pf = parse_flags(argc, argv, &s->cfg);
	if (pf)
		return pf > 0 ? 0 : 2;
	if (s->cfg.write_demo)
		return write_demo_model(&s->cfg);
	if (s->cfg.describe)
		return describe_model(&s->cfg);

	sigset_t sigs; /* blocked since block_stop_signals, taken by sigwait below */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	signal(SIGPIPE, SIG_IGN);

	if (mbt_mpi_launched()) {
		int st = mpi_start(s, &argc, &argv);
		if (st >= 0)
			return st;
	}
	pthread_mutex_init(&s->reload_mu, NULL);
	s->repo_fd = -1;
	if (s->cfg.repository) {
		s->repo_fd = open(s->cfg.repository, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (s->repo_fd < 0) {
			ps_say("--model-repository %s: %s", s->cfg.repository, strerror(errno));
			return 2;
		}
	}
	ps_metrics_init(&s->metrics);
	int rc = s->mpi ? 0 : setup_model(s); /* under mpirun: loaded by mpi_start */
	if (!rc)
		rc = setup_engine(s);
	if (!rc)
		rc = ps_http_start(s);
	if (rc) {
		ps_batcher_destroy(s->batcher);
		mbp_model_stages_destroy(s->stages);
		mbp_model_destroy(s->model);
		return finish(s, rc == PS_EUSAGE ? 2 : 1);
	}
	atomic_store(&s->ready, true); /* before the address: a client may start the moment it reads it */
	if (strchr(s->cfg.host, ':'))
		printf("http://[%s]:%u\n", s->cfg.host, s->port);
	else
		printf("http://%s:%u\n", s->cfg.host, s->port);
	fflush(stdout);
	log_startup(s);
	ps_log("start: listening on %s port %u", s->cfg.host, s->port);

	int sig = 0;
	while (sigwait(&sigs, &sig) != 0)
		;
	ps_log("stop: %s received; not ready, finishing %llu accepted requests", strsignal(sig),
	       (unsigned long long)atomic_load(&s->inflight));
	atomic_store(&s->ready, false);
	atomic_store(&s->draining, true); /* pairs with the handlers' inflight increment (http.c) */
	bool clean = wait_inflight(s, &sigs, s->cfg.drain_timeout_ms);
	if (!clean)
		ps_log("stop: %llu requests still running after %llu ms; draining the pipeline",
		       (unsigned long long)atomic_load(&s->inflight),
		       (unsigned long long)s->cfg.drain_timeout_ms);
	ps_batcher_stop(s->batcher);
	if (!clean && !wait_inflight(s, &sigs, 1000)) {
		/* Suspended connections remain: stopping the HTTP daemon now would be undefined behaviour. */
		ps_log("stop: requests left unanswered; exiting without a clean shutdown");
		return 1;
	}
	ps_http_stop(s);
	uint64_t ok = atomic_load(&s->metrics.infer_ok), failed = 0;
	for (int i = 0; i < PS_FAIL_N; i++)
		failed += atomic_load(&s->metrics.infer_fail[i]);
	ps_batcher_destroy(s->batcher);
	mbp_model_stages_destroy(s->stages);
	mbp_model_destroy(s->model);
	free(s->model_path);
	if (s->repo_fd >= 0)
		close(s->repo_fd);
	ps_log("stopped: %llu infer requests answered, %llu failed", (unsigned long long)ok,
	       (unsigned long long)failed);
	return finish(s, 0);
}

/*
 * Tests of the pipetrain tool, run as the user runs it (the built binary, its standard output and error
 * captured in files), and the end-to-end path: train, save, serve with pipeserve, reload live.
 *
 * - every bad argument or input gives exactly one line on standard error, nothing on standard output,
 *   exit 2;
 * - a small run on a subset lowers the training loss from epoch to epoch and beats chance on the test
 *   set, and its --json is one document with the documented fields; the summary shows each stage's and
 *   each thread's hops as the JSON has them;
 * - the weights do not depend on the schedule or the stage count: GPipe on 1 stage, 1F1B on 2, ZB-H1 on
 *   3 with a layer's input gradient handed over to the next stage, 1F1B on 3 without, write the same
 *   checkpoint bytes;
 * - a run resumed from a checkpoint (weights and optimizer state) ends with the bytes of an
 *   uninterrupted run, also after SIGINT (exit 130, checkpoint written); a weights file and an optimizer
 *   state from different steps (a crash between the two) are refused with exit 2, either way round; more
 *   epochs on resume are announced as a new learning-rate schedule;
 * - the progress bar goes to standard error only, at most ten redraws a second, the last step drawn, with
 *   the time left in the run;
 * - what the run says is what it does: a batch that is not a multiple of the micro-batch is announced as
 *   the trainer cuts it; the summary after a resume counts the checkpoint's epochs and this run's; weights
 *   without an optimizer state start a fresh optimizer, in one note; OpenBLAS's generic kernel is warned
 *   about;
 * - --log writes a header and one row per step, the steps rising by one; --plot writes a well-formed SVG
 *   document with one polyline per curve, every point inside its panel;
 * - a NaN in the loss (PIPETRAIN_FAULT) stops the run with exit 1, names the step and the stage, and
 *   leaves the last checkpoint as it was;
 * - every file a run writes (--save and the optimizer state beside it, --trace, --predictions, --csv) is
 *   checked at the start: a FIFO, a link, a folder or a device given as one, or a folder that takes no
 *   file (/proc), is refused in one line naming it, exit 2, and left as it was;
 * - a checkpoint with 8 bytes overwritten in its tensors (weights or optimizer state) is refused naming the
 *   file, exit 2; a model without digests trains, with a note;
 * - end to end: pipeserve --model on the checkpoint classifies test images as pipetrain's own
 *   evaluation does (--predictions), and a second checkpoint loaded live (POST .../load) while clients
 *   send requests fails none of them, each answer being one model's or the other's, and the second's
 *   after the load.
 * The runs use Debian's dataset-fashion-mnist; every test but the bad-argument one is skipped (with a
 * line saying so) when it is not installed. Small models and --limit keep each run well under a second.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mbpipe.h>

#include "pipetrain.h" /* pt_partition, linked from tools/pipetrain/stages.c */
#include "model_file.h"
#include "test_pipeserve_client.h"
#include "test_tmpdir.h"
#include "tool_run.h"

#ifndef PIPETRAIN_BIN
#error "PIPETRAIN_BIN must name the built pipetrain"
#endif

static const char *const no_fault[] = {"PIPETRAIN_FAULT=", NULL};

/* Start pipetrain with args (NULL-terminated) and an optional extra environment entry. */
static struct tool_proc spawn_env(const char *env_extra, const char *const *args)
{
	return tool_spawn(PIPETRAIN_BIN, no_fault, (const char *const[]){env_extra, NULL}, args);
}

static struct run run_env(const char *env_extra, const char *const *args)
{
	return tool_finish(spawn_env(env_extra, args));
}

static struct run run(const char *const *args)
{
	return run_env(NULL, args);
}

static bool have_data(void)
{
	if (access(MBP_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) == 0)
		return true;
	fprintf(stderr, "skipped: %s absent (apt-get install dataset-fashion-mnist)\n",
		MBP_FASHION_MNIST_DIR);
	return false;
}

/* Whole file into memory; *len its size. */
static char *read_all(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY);
	ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
	char *b = slurp(fd);
	struct stat st;
	fstat(fd, &st);
	*len = (size_t)st.st_size;
	close(fd);
	return b;
}

/* A file in the test's folder, copied out of tmpdir_path's rotating buffers. */
static void tmp_file(char out[128], const char *name)
{
	snprintf(out, 128, "%s", tmpdir_path(name));
}

static void assert_same_file(const char *a, const char *b)
{
	size_t la, lb;
	char *x = read_all(a, &la), *y = read_all(b, &lb);
	ck_assert_msg(la == lb && memcmp(x, y, la) == 0, "%s and %s differ", a, b);
	free(x);
	free(y);
}

static void copy_file(const char *from, const char *to)
{
	size_t len;
	char *b = read_all(from, &len);
	FILE *f = fopen(to, "wb");
	ck_assert_msg(f, "%s: %s", to, strerror(errno));
	ck_assert_uint_eq(fwrite(b, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
	free(b);
}

/* ---- bad arguments ---- */

static const char *const bad_args[][8] = {
    {"--stages", "0"},
    {"--stages", "two"},
    {"--layers", "784,,10"},
    {"--layers", "784"},
    {"--layers", "784,64,"},
    {"--layers", "100,64,10"}, /* the input is 784 for this data */
    {"--layers", "784,64,5"},  /* the output is 10 classes */
    {"--layers", "784,64,10", "--stages", "3"},
    {"--schedule", "pipedream"},
    {"--hand-over", "sometimes"},
    {"--recompute", "some"},
    {"--recompute", "1,"},
    {"--recompute", "3-1"},
    {"--recompute", "64"},
    {"--layers", "784,64,10", "--recompute", "0,2"}, /* layers 0 and 1 only */
    {"--optimizer", "adam"},
    {"--lr", "-1"},
    {"--lr", "nan"},
    {"--lr", "0"},
    {"--min-lr", "0.1", "--lr", "0.01"},
    {"--batch", "0"},
    {"--batch", "32", "--mb", "64"},
    {"--mb", "sometimes"},
    {"--epochs", "0"},
    {"--clip", "-1"},
    {"--momentum", "1"},
    {"--val", "60000"},
    {"--limit", "100000"},
    {"--limit", "100", "--batch", "256"},
    {"--threads", "3", "--stages", "2"},
    {"--replicas", "0"},
    {"--replicas", "1,x"},
    {"--replicas", "17"},
    {"--replicas", "1,"},
    {"--layers", "784,64,10", "--stages", "2", "--replicas", "1,2,1"}, /* a count per stage */
    {"--json", "--csv", "-"},
    {"--json", "--log", "-"},
    {"--csv", "-", "--log", "-"},
    {"--progress", "--no-progress"},
    {"--no-progress", "--progress"},
    {"--quiet", "--progress"},
    {"--pin", "--no-pin"},
    {"--no-pin", "--pin"},
    {"--log", ""},
    {"--plot", ""},
    {"--log", "/nonexistent/steps.csv"},
    {"--plot", "/nonexistent/curves.svg"},
    {"--data", "/nonexistent"},
    {"--model", "/nonexistent.safetensors"},
    {"--save", ""},
    {"--save", "/nonexistent/m.safetensors"},
    {"--predictions", "/nonexistent/p.txt"},
    {"--plan", "manual"},
    {"--memory", "64M"}, /* without --plan auto */
    {"--plan-only"},
    {"--plan", "auto", "--memory", "lots"},
    {"--plan", "auto", "--memory", "0"},
    {"--plan", "auto", "--memory", "12X"},
    {"--plan", "auto", "--stages", "2"},
    {"--plan", "auto", "--mb", "32"},
    {"--plan", "auto", "--recompute", "all"},
    {"--plan", "auto", "--schedule", "zbv"},
    {"--plan", "auto", "--split", "1"},
    {"--plan", "auto", "--replicas", "1,2"},
    {"--plan", "auto", "--memory", "1K"}, /* no plan fits: the smallest budget that does, in MiB */
    {"--plan", "auto", "--plan-points", "/dev/null"},		     /* without --plan-only --json */
    {"--plan", "auto", "--plan-only", "--plan-points", "/dev/null"}, /* without --json */
    {"--plan", "auto", "--plan-only", "--json", "--plan-points", ""},
    {"--plan", "auto", "--plan-only", "--json", "--plan-points", "/nonexistent/points.txt"},
    {"--split", "2,2"},
    {"--split", "0"},
    {"--split", "1,"},
    {"--layers", "784,64,10", "--split", "2"}, /* layers 0 and 1 only */
    {"--layers", "784,64,64,10", "--split", "1", "--stages", "3"},
    {"--rebalance", "--split", "1"}, /* options that fix the split */
    {"--rebalance", "--plan", "auto"},
    {"--rebalance", "--replicas", "1,2"},
    {"--rebalance", "--stages", "1"}, /* nothing to move */
    {"--rebalance=window=0"},
    {"--rebalance=threshold=-1"},
    {"--rebalance=speed=2"},
    {"--rebalance=window"},
    {"--epochs"},
    {"--frobnicate"},
    {"extra"},
};

START_TEST(every_bad_argument_gets_one_line_and_exit_2)
{
	const char *const *a = bad_args[_i];
	struct run r = run(a);
	ck_assert_msg(r.status == 2, "%s %s: exit %d (%s)", a[0], a[1] ? a[1] : "", r.status, r.err);
	ck_assert_msg(lines(r.err) == 1, "%s %s: %u lines on stderr: %s", a[0], a[1] ? a[1] : "",
		      lines(r.err), r.err);
	ck_assert_msg(strncmp(r.err, "pipetrain: ", 11) == 0, "no 'pipetrain: ' prefix: %s", r.err);
	ck_assert_msg(r.out[0] == 0, "%s: stdout not empty: %s", a[0], r.out);
	run_free(&r);
}
END_TEST

START_TEST(a_model_file_that_is_not_one_is_refused_with_exit_2)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	const char *p = tmpdir_path("junk.safetensors");
	FILE *f = fopen(p, "w");
	fputs("not a model\n", f);
	fclose(f);
	struct run r = run((const char *const[]){"--model", p, NULL});
	ck_assert_int_eq(r.status, 2);
	ck_assert_uint_eq(lines(r.err), 1);
	ck_assert_ptr_nonnull(strstr(r.err, "junk.safetensors"));
	run_free(&r);
	tmpdir_remove();
}
END_TEST

/* ---- files ---- */

#define SMALL_1                                                                                              \
	"--layers", "784,48,24,10", "--limit", "256", "--batch", "128", "--mb", "32", "--val", "100",        \
	    "--epochs", "1", "--quiet"

/* One line on stderr naming `path`, exit 2, nothing on stdout. */
static void assert_refused(const struct run *r, const char *opt, const char *path)
{
	ck_assert_msg(r->status == 2, "%s %s: exit %d (%s)", opt, path, r->status, r->err);
	ck_assert_msg(lines(r->err) == 1 && strstr(r->err, path) && strstr(r->err, opt), "%s %s: %s", opt,
		      path, r->err);
	ck_assert_msg(r->out[0] == 0, "%s %s: stdout: %s", opt, path, r->out);
}

START_TEST(every_output_that_is_not_a_regular_file_is_refused_at_start_and_left_as_it_was)
{
	tmpdir_make("pipetrain");
	struct nodes n;
	nodes_make(&n, tmpdir);
	const char *t[4];
	unsigned k = nodes_list(&n, t);
	static const char *const opts[] = {"--save", "--trace", "--predictions", "--csv"};
	for (unsigned o = 0; o < 4; o++)
		for (unsigned i = 0; i < k; i++) {
			struct run r = run((const char *const[]){SMALL_1, opts[o], t[i], NULL});
			assert_refused(&r, opts[o], t[i]);
			ck_assert_msg(strstr(r.err, "not a regular file"), "%s", r.err);
			run_free(&r);
		}
	nodes_assert_intact(&n);
	/* the optimizer state beside --save is one of the run's files too */
	char save[128], optim[128];
	tmp_file(save, "m.safetensors");
	tmp_file(optim, "m.optim.safetensors");
	ck_assert_int_eq(mkfifo(optim, 0600), 0);
	struct run r = run((const char *const[]){SMALL_1, "--save", save, NULL});
	assert_refused(&r, "--save", optim);
	run_free(&r);
	struct stat sb;
	ck_assert(lstat(optim, &sb) == 0 && S_ISFIFO(sb.st_mode) && access(save, F_OK) != 0);
	unlink(optim);
	/* a folder that takes no new file: refused at the start, not after the training */
	r = run((const char *const[]){SMALL_1, "--save", "/proc/x.safetensors", NULL});
	assert_refused(&r, "--save", "/proc/x.safetensors");
	run_free(&r);
	nodes_remove(&n);
	tmpdir_remove();
}
END_TEST

START_TEST(a_checkpoint_with_eight_bytes_overwritten_is_refused_naming_the_file)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char m[128], lone[128], bare[128];
	tmp_file(m, "m.safetensors");
	tmp_file(lone, "lone.safetensors");
	tmp_file(bare, "bare.safetensors");
	struct run r = run((const char *const[]){SMALL_1, "--save", m, NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	/* the weights alone, no optimizer state beside them: 8 bytes inside layer 0's weight */
	copy_file(m, lone);
	st_overwrite8(lone, 4000);
	r = run((const char *const[]){SMALL_1, "--model", lone, NULL});
	assert_refused(&r, "--model", lone);
	ck_assert_msg(strstr(r.err, "digest") && strstr(r.err, "layers.0.weight"), "%s", r.err);
	run_free(&r);
	/* the optimizer state of an intact pair */
	st_overwrite8(tmpdir_path("m.optim.safetensors"), 4000);
	r = run((const char *const[]){SMALL_1, "--model", m, NULL});
	ck_assert_msg(r.status == 2 && lines(r.err) == 1 && strstr(r.err, "m.optim.safetensors") &&
			  strstr(r.err, "digest"),
		      "exit %d: %s", r.status, r.err);
	run_free(&r);
	/* --layers that the file does not have: refused from its header */
	r = run((const char *const[]){"--layers", "784,64,10", "--limit", "256", "--batch", "128", "--model",
				      m, NULL});
	assert_refused(&r, "--model", m);
	ck_assert_msg(strstr(r.err, "784-48-24-10") && strstr(r.err, "784-64-10"), "%s", r.err);
	run_free(&r);
	/* a model without digests (another tool's) trains, with a note */
	st_copy_without_digests(m, bare);
	r = run((const char *const[]){SMALL_1, "--model", bare, NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	const char *note = strstr(r.err, "no digest");
	ck_assert_msg(note && !strstr(note + 1, "no digest") && strstr(r.err, bare), "%s", r.err);
	run_free(&r);
	tmpdir_remove();
}
END_TEST

/* ---- training ---- */

#define SMALL "--layers", "784,48,24,10", "--limit", "1024", "--batch", "128", "--mb", "32", "--val", "500"

/* The events of category `cat` (F, B, B_in, W, R) in the Chrome trace at `path`. */
static unsigned trace_events(const char *path, const char *cat)
{
	size_t len;
	char *t = read_all(path, &len);
	cJSON *tr = cJSON_Parse(t);
	ck_assert_msg(tr != NULL, "the trace is not JSON");
	unsigned n = 0;
	const cJSON *ev;
	cJSON_ArrayForEach(ev, cJSON_GetObjectItem(tr, "traceEvents"))
	{
		const cJSON *c = cJSON_GetObjectItem(ev, "cat");
		n += cJSON_IsString(c) && !strcmp(c->valuestring, cat);
	}
	cJSON_Delete(tr);
	free(t);
	return n;
}

START_TEST(a_small_run_lowers_the_loss_and_its_json_parses)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char trace[128];
	tmp_file(trace, "trace.json");
	struct run r =
	    run((const char *const[]){SMALL, "--epochs", "3", "--json", "--stages", "3", "--schedule", "zbh1",
				      "--hand-over", "all", "--trace", trace, NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
	const cJSON *eps = cJSON_GetObjectItem(root, "epochs");
	ck_assert_int_eq(cJSON_GetArraySize(eps), 3);
	double l0 = cJSON_GetObjectItem(cJSON_GetArrayItem(eps, 0), "train_loss")->valuedouble;
	double l2 = cJSON_GetObjectItem(cJSON_GetArrayItem(eps, 2), "train_loss")->valuedouble;
	ck_assert_msg(l2 < 0.8 * l0, "loss %g -> %g did not fall", l0, l2);
	double acc = cJSON_GetObjectItem(root, "test_accuracy")->valuedouble;
	ck_assert_msg(acc > 0.5, "test accuracy %g: no better than guessing", acc);
	const cJSON *cfg = cJSON_GetObjectItem(root, "config");
	ck_assert_int_eq(cJSON_GetObjectItem(cfg, "train_rows")->valueint, 1024);
	ck_assert_int_eq(cJSON_GetObjectItem(cfg, "steps_per_epoch")->valueint, 8);
	ck_assert_int_eq(cJSON_GetObjectItem(cfg, "mbs")->valueint, 4);
	const cJSON *st = cJSON_GetObjectItem(root, "stages");
	ck_assert_int_ge(cJSON_GetArraySize(st), 1);
	const cJSON *s0 = cJSON_GetArrayItem(st, 0);
	ck_assert_int_eq(cJSON_GetObjectItem(s0, "first_layer")->valueint, 0);
	ck_assert(cJSON_GetObjectItem(s0, "compute_s")->valuedouble > 0);
	/* --hand-over all: layer 1's input gradient is computed by stage 2; layer 0 has none to give */
	ck_assert_int_eq(cJSON_GetArraySize(st), 3);
	ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(s0, "hands_over")));
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(st, 1), "hands_over")));
	ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetArrayItem(st, 2), "hands_over")));
	/* the last step's hops: each stage's 4 outputs on (not the last's) and 4 input gradients back (not
	 * stage 0's), passed directly where the neighbour runs on the same thread, else through a ring */
	int th[3];
	for (int s = 0; s < 3; s++)
		th[s] = cJSON_GetObjectItem(cJSON_GetArrayItem(st, s), "thread")->valueint;
	for (int s = 0; s < 3; s++) {
		const cJSON *o = cJSON_GetArrayItem(st, s);
		int fwd = s < 2 ? 4 : 0, bwd = s > 0 ? 4 : 0;
		int local = (s < 2 && th[s + 1] == th[s] ? fwd : 0) + (s > 0 && th[s - 1] == th[s] ? bwd : 0);
		ck_assert_int_eq(cJSON_GetObjectItem(o, "local_hops")->valueint, local);
		ck_assert_int_eq(cJSON_GetObjectItem(o, "hops")->valueint, fwd + bwd - local);
	}
	ck_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "stopped")));
	/* the human lines went to stderr: one per epoch */
	unsigned ep_lines = 0;
	for (const char *p = r.err; (p = strstr(p, "\nepoch ")); p++)
		ep_lines++;
	ck_assert_uint_eq(ep_lines, 3);
	cJSON_Delete(root);
	run_free(&r);
	/* The trace: the last step's 4 micro-batches, F, B_in and W on each of the 3 stages. */
	unsigned count[3];
	for (unsigned k = 0; k < 3; k++)
		count[k] = trace_events(trace, (const char *[]){"F", "B_in", "W"}[k]);
	ck_assert_msg(count[0] == 12 && count[1] == 12 && count[2] == 12, "F %u, B_in %u, W %u events",
		      count[0], count[1], count[2]);
	tmpdir_remove();
}
END_TEST

/* --recompute all: every stage keeps no stash, only a work buffer while it runs a backward, so the peak
 * activation memory (the summary's JSON) falls below that of keeping every activation; each backward
 * is preceded by its recomputation in the trace (R events, as many as the B events) and the JSON says
 * which layers recompute. */
START_TEST(recomputation_lowers_the_peak_activation_memory_and_shows_in_the_trace)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char trace[128];
	tmp_file(trace, "trace.json");
	double peak[2];
	for (int all = 0; all < 2; all++) {
		struct run r =
		    run((const char *const[]){SMALL, "--epochs", "1", "--json", "--stages", "3",
					      "--recompute", all ? "all" : "none", "--trace", trace, NULL});
		ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
		ck_assert_msg(strstr(r.err, "activation memory: peak "), "no activation line: %s", r.err);
		/* and what a micro-batch keeps per stage: nothing stashed where every layer recomputes */
		const char *mb = strstr(r.err,
					"activation memory a micro-batch of 32 rows holds, stage by stage: "),
			   *none = strstr(r.err, all ? ": stashed 0.0,0.0,0.0 KiB, recomputed "
						     : " KiB, recomputed 0.0,0.0,0.0 KiB\n");
		ck_assert_msg(mb && none && none > mb, "the per-micro-batch line: %s", r.err);
		cJSON *root = cJSON_Parse(r.out);
		ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
		peak[all] = cJSON_GetObjectItem(root, "peak_activation_bytes")->valuedouble;
		ck_assert(peak[all] > 0);
		ck_assert(cJSON_GetObjectItem(root, "activation_pool_bytes")->valuedouble >= peak[all]);
		const cJSON *rc = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "config"), "recompute");
		ck_assert_int_eq(cJSON_GetArraySize(rc), all ? 3 : 0);
		const cJSON *st;
		cJSON_ArrayForEach(st, cJSON_GetObjectItem(root, "stages"))
		{
			double stash = cJSON_GetObjectItem(st, "stash_bytes_per_mb")->valuedouble,
			       work = cJSON_GetObjectItem(st, "recomputed_bytes_per_mb")->valuedouble;
			ck_assert(all ? stash == 0 && work > 0 : stash > 0 && work == 0);
			ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "recomputed_layers")),
					 all ? cJSON_GetObjectItem(st, "last_layer")->valueint -
						   cJSON_GetObjectItem(st, "first_layer")->valueint + 1
					     : 0);
		}
		cJSON_Delete(root);
		run_free(&r);
		ck_assert_uint_eq(trace_events(trace, "B"), 12); /* 4 micro-batches on 3 stages */
		ck_assert_uint_eq(trace_events(trace, "R"), all ? 12 : 0);
		unlink(trace);
	}
	ck_assert_msg(peak[1] < peak[0], "peak %.0f bytes recomputing, %.0f keeping", peak[1], peak[0]);
	tmpdir_remove();
}
END_TEST

/* ---- --plan auto ---- */

#define PLANNED                                                                                              \
	"--layers", "784,48,24,10", "--limit", "1024", "--batch", "128", "--val", "500", "--plan", "auto"

/* The plan object of a --json document; asserts its fields. */
static const cJSON *plan_of(const cJSON *root)
{
	const cJSON *p = cJSON_GetObjectItem(root, "plan");
	ck_assert_msg(cJSON_IsObject(p), "no plan object");
	static const char *const nums[] = {"threads",
					   "stages",
					   "mb",
					   "mbs",
					   "predicted_step_ms",
					   "predicted_bubble",
					   "predicted_peak_bytes",
					   "predicted_activation_bytes",
					   "state_bytes",
					   "smallest_budget_bytes",
					   "plans_played",
					   "profile_s"};
	for (unsigned i = 0; i < sizeof nums / sizeof nums[0]; i++)
		ck_assert_msg(cJSON_IsNumber(cJSON_GetObjectItem(p, nums[i])), "plan.%s", nums[i]);
	ck_assert(cJSON_IsString(cJSON_GetObjectItem(p, "schedule")));
	int S = cJSON_GetObjectItem(p, "stages")->valueint;
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(p, "stage_layers")), S);
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(p, "recompute")), S);
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(p, "stage_activation_bytes")), S);
	ck_assert(cJSON_GetObjectItem(p, "predicted_peak_bytes")->valuedouble ==
		  cJSON_GetObjectItem(p, "predicted_activation_bytes")->valuedouble +
		      cJSON_GetObjectItem(p, "state_bytes")->valuedouble);
	ck_assert(cJSON_GetObjectItem(p, "profile_s")->valuedouble <= 5);
	return p;
}

static double num(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItem(o, k);
	ck_assert_msg(cJSON_IsNumber(v), "no number %s", k);
	return v->valuedouble;
}

/* --plan-only prints the plan's three lines and trains nothing; with --json the plan is the document. */
START_TEST(plan_only_prints_the_plan_and_its_json_parses_and_trains_nothing)
{
	if (!have_data())
		return;
	struct run r = run((const char *const[]){PLANNED, "--plan-only", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.out, "plan: ") && strstr(r.out, "predicted step ") &&
			  strstr(r.out, "bubble ") && strstr(r.out, "peak memory ") &&
			  strstr(r.out, "micro-batch ") && strstr(r.out, "stages (layers, * recomputes)"),
		      "%s", r.out);
	ck_assert_msg(!strstr(r.out, "epoch ") && !strstr(r.out, "summary:"), "it trained: %s", r.out);
	run_free(&r);
	r = run((const char *const[]){PLANNED, "--plan-only", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
	const cJSON *p = plan_of(root);
	ck_assert(cJSON_IsNull(cJSON_GetObjectItem(p, "budget_bytes")));
	ck_assert(num(p, "smallest_budget_bytes") <= num(p, "predicted_peak_bytes"));
	/* no limit: nothing recomputes */
	const cJSON *rc;
	cJSON_ArrayForEach(rc, cJSON_GetObjectItem(p, "recompute")) ck_assert(cJSON_IsFalse(rc));
	ck_assert_msg(strstr(r.err, "plan: "), "the lines go to stderr beside --json: %s", r.err);
	cJSON_Delete(root);
	run_free(&r);
}
END_TEST

/* A budget no plan fits: one line with the smallest budget that fits, in MiB rounded up, exit 2; that
 * budget is then accepted. The least memory does not depend on the timings, so it is the same each run. */
START_TEST(a_budget_no_plan_fits_is_refused_with_exit_2_and_the_smallest_budget_that_fits)
{
	if (!have_data())
		return;
	struct run r = run((const char *const[]){PLANNED, "--plan-only", "--memory", "64K", NULL});
	ck_assert_msg(r.status == 2, "exit %d: %s", r.status, r.err);
	ck_assert_uint_eq(lines(r.err), 1);
	const char *at = strstr(r.err, "smallest budget that fits is ");
	ck_assert_msg(at && strncmp(r.err, "pipetrain: ", 11) == 0, "%s", r.err);
	unsigned need = 0;
	ck_assert_int_eq(sscanf(at, "smallest budget that fits is %u MiB", &need), 1);
	ck_assert_uint_gt(need, 0);
	run_free(&r);
	r = run((const char *const[]){PLANNED, "--plan-only", "--json", NULL});
	ck_assert_int_eq(r.status, 0);
	cJSON *root = cJSON_Parse(r.out);
	double least = num(plan_of(root), "smallest_budget_bytes");
	ck_assert_msg((unsigned)((least + (1 << 20) - 1) / (1 << 20)) == need, "%u MiB, least %.0f bytes",
		      need, least);
	cJSON_Delete(root);
	run_free(&r);
	char mem[32];
	snprintf(mem, sizeof mem, "%uM", need);
	r = run((const char *const[]){PLANNED, "--plan-only", "--memory", mem, NULL});
	ck_assert_msg(r.status == 0, "--memory %s: exit %d: %s", mem, r.status, r.err);
	run_free(&r);
	snprintf(mem, sizeof mem, "%.0f", least - 1); /* a byte less: refused */
	r = run((const char *const[]){PLANNED, "--plan-only", "--memory", mem, NULL});
	ck_assert_msg(r.status == 2, "--memory %s: exit %d: %s", mem, r.status, r.err);
	run_free(&r);
}
END_TEST

/* The plan's state counts what the model allocates beside its parameters, gradients and moments: under
 * the packed kernel the packed copy of every layer's weights and bias (784-48-24-10: 48 x 785 + 32 x 49 +
 * 16 x 25 floats), under OpenBLAS nothing more (no layer has a multiple of 1024 inputs to pad). */
START_TEST(the_plans_state_counts_the_packed_weight_copy_the_model_allocates)
{
	if (!have_data())
		return;
	const bool packed = cpu_runs_packed_kernel();
	static const char *const drop[] = {"PIPETRAIN_FAULT=", "MBP_KERNEL=", NULL};
	static const char *const kernels[2][2] = {{"MBP_KERNEL=blas", NULL}, {"MBP_KERNEL=packed", NULL}};
	double state[2];
	for (int k = 0; k < 2; k++) {
		struct run r = tool_run(PIPETRAIN_BIN, drop, kernels[k],
					(const char *const[]){PLANNED, "--plan-only", "--json", NULL});
		ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
		cJSON *root = cJSON_Parse(r.out);
		ck_assert_msg(root, "not JSON: %s", r.out);
		state[k] = num(plan_of(root), "state_bytes");
		cJSON_Delete(root);
		run_free(&r);
	}
	const double params = (784 * 48 + 48 + 48 * 24 + 24 + 24 * 10 + 10) * 4.0;
	const double copy = (48 * 785 + 32 * 49 + 16 * 25) * 4.0;
	ck_assert_msg(state[0] == 2 * params || state[0] == 3 * params || state[0] == 4 * params,
		      "blas: %.0f bytes for %.0f of parameters", state[0], params);
	ck_assert_msg(state[1] == state[0] + (packed ? copy : 0), "packed: %.0f, blas %.0f", state[1],
		      state[0]);
}
END_TEST

/* A file of one line: the plan's own point, "SCHEDULE THREADS MB RECOMPUTE SPLIT". */
static void write_plan_point(const char *path, const cJSON *p)
{
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "# the plan\n%s %d %d ", cJSON_GetObjectItem(p, "schedule")->valuestring,
		cJSON_GetObjectItem(p, "threads")->valueint, cJSON_GetObjectItem(p, "mb")->valueint);
	const cJSON *x, *st = cJSON_GetObjectItem(p, "stage_layers");
	int s = 0, any = 0;
	cJSON_ArrayForEach(x, cJSON_GetObjectItem(p, "recompute"))
	{
		if (cJSON_IsTrue(x))
			fprintf(f, "%s%d", any++ ? "," : "", s);
		s++;
	}
	fprintf(f, "%s ", any ? "" : "none");
	for (int k = 1; k < cJSON_GetArraySize(st); k++)
		fprintf(f, "%s%d", k > 1 ? "," : "",
			cJSON_GetArrayItem(cJSON_GetArrayItem(st, k), 0)->valueint);
	fprintf(f, "%s\n", cJSON_GetArraySize(st) > 1 ? "" : "-");
	/* stage 0 of two recomputing, then keeping; an unprofiled size */
	fprintf(f, "1f1b 2 32 0 1\n1f1b 2 32 none 1\ngpipe 1 24 none -\n");
	fclose(f);
}

/* --plan-points predicts each line's plan from the run's profile, as the planner counts it: the plan's
 * own point has the plan's memory (bytes do not depend on the timings, so a second run agrees), a
 * recomputing stage holds less and runs no faster, a size not profiled cannot be weighed (null), each
 * point says whether it fits --memory; a line that is not a point is refused naming it, exit 2. */
START_TEST(plan_points_are_predicted_from_the_plans_profile_as_the_planner_counts_them)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char pts[128];
	tmp_file(pts, "points.txt");
	struct run r = run((const char *const[]){PLANNED, "--plan-only", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	const cJSON *p = plan_of(root);
	double peak = num(p, "predicted_peak_bytes");
	char mem[32];
	snprintf(mem, sizeof mem, "%.0f", peak);
	write_plan_point(pts, p);
	cJSON_Delete(root);
	run_free(&r);

	r = run((const char *const[]){PLANNED, "--plan-only", "--json", "--memory", mem, "--plan-points", pts,
				      NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	root = cJSON_Parse(r.out);
	ck_assert_ptr_nonnull(root);
	const cJSON *a = cJSON_GetObjectItem(root, "points");
	ck_assert_int_eq(cJSON_GetArraySize(a), 4);
	const cJSON *own = cJSON_GetArrayItem(a, 0), *rc = cJSON_GetArrayItem(a, 1),
		    *keep = cJSON_GetArrayItem(a, 2), *odd = cJSON_GetArrayItem(a, 3);
	ck_assert(num(own, "line") == 2);
	ck_assert_msg(num(own, "predicted_peak_bytes") == peak, "the plan's point holds %.0f, the plan %.0f",
		      num(own, "predicted_peak_bytes"), peak);
	ck_assert(num(own, "predicted_step_ms") > 0 && cJSON_IsTrue(cJSON_GetObjectItem(own, "fits")));
	ck_assert(num(rc, "predicted_activation_bytes") < num(keep, "predicted_activation_bytes"));
	ck_assert(num(rc, "predicted_step_ms") >= num(keep, "predicted_step_ms"));
	ck_assert(cJSON_IsTrue(cJSON_GetArrayItem(cJSON_GetObjectItem(rc, "recompute"), 0)) &&
		  cJSON_IsFalse(cJSON_GetArrayItem(cJSON_GetObjectItem(rc, "recompute"), 1)));
	for (int i = 1; i < 3; i++) {
		const cJSON *x = cJSON_GetArrayItem(a, i);
		ck_assert(cJSON_IsBool(cJSON_GetObjectItem(x, "fits")) &&
			  cJSON_IsTrue(cJSON_GetObjectItem(x, "fits")) ==
			      (num(x, "predicted_peak_bytes") <= peak));
	}
	ck_assert(cJSON_IsNull(cJSON_GetObjectItem(odd, "predicted_step_ms")));
	cJSON_Delete(root);
	run_free(&r);

	FILE *f = fopen(pts, "w");
	fprintf(f, "1f1b 2 32 none 1\n1f1b 2 32 none 1,2\n"); /* two stages, two cuts */
	fclose(f);
	r = run((const char *const[]){PLANNED, "--plan-only", "--json", "--plan-points", pts, NULL});
	ck_assert_msg(r.status == 2, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.err, "pipetrain: --plan-points ") && strstr(r.err, ": line 2: "), "%s", r.err);
	run_free(&r);
	tmpdir_remove();
}
END_TEST

/* A run at the tightest budget (the least memory plan's): it trains with the plan (its stages, schedule,
 * micro-batch and recomputation in the run's JSON) and its measured peak (the trainer's activation peak +
 * the state) is within the budget and the prediction, printed beside it. */
START_TEST(a_planned_run_trains_within_its_budget_and_prints_the_measured_beside_the_predicted)
{
	if (!have_data())
		return;
	struct run r = run((const char *const[]){PLANNED, "--plan-only", "--json", NULL});
	ck_assert_int_eq(r.status, 0);
	cJSON *root = cJSON_Parse(r.out);
	double least = num(plan_of(root), "smallest_budget_bytes");
	cJSON_Delete(root);
	run_free(&r);
	char mem[32];
	snprintf(mem, sizeof mem, "%.0f", least);
	r = run((const char *const[]){PLANNED, "--memory", mem, "--epochs", "1", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.err, "plan against the run: step ") && strstr(r.err, " measured"), "%s",
		      r.err);
	root = cJSON_Parse(r.out);
	ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
	const cJSON *p = plan_of(root), *m = cJSON_GetObjectItem(root, "measured"),
		    *cfg = cJSON_GetObjectItem(root, "config");
	ck_assert(num(p, "budget_bytes") == least && num(p, "predicted_peak_bytes") == least);
	double peak = num(m, "peak_bytes");
	ck_assert_msg(peak > num(m, "state_bytes") && peak <= least, "measured %.0f, budget %.0f", peak,
		      least);
	ck_assert(num(m, "activation_peak_bytes") == num(root, "peak_activation_bytes"));
	ck_assert(num(m, "step_ms") > 0);
	ck_assert(num(cfg, "stages") == num(p, "stages") && num(cfg, "mb") == num(p, "mb") &&
		  num(cfg, "threads") == num(p, "threads"));
	ck_assert_str_eq(cJSON_GetObjectItem(cfg, "schedule")->valuestring,
			 cJSON_GetObjectItem(p, "schedule")->valuestring);
	/* each stage's layers and recomputation are the plan's */
	const cJSON *st = cJSON_GetObjectItem(root, "stages");
	for (int s = 0; s < cJSON_GetArraySize(st); s++) {
		const cJSON *o = cJSON_GetArrayItem(st, s),
			    *ly = cJSON_GetArrayItem(cJSON_GetObjectItem(p, "stage_layers"), s);
		ck_assert(num(o, "first_layer") == cJSON_GetArrayItem(ly, 0)->valuedouble);
		ck_assert(num(o, "last_layer") == cJSON_GetArrayItem(ly, 1)->valuedouble);
		bool rc = cJSON_IsTrue(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "recompute"), s));
		ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "recomputed_layers")),
				 rc ? (int)(num(o, "last_layer") - num(o, "first_layer") + 1) : 0);
		/* its layers' cost at the plan's size, from the planner's profile */
		ck_assert_msg(num(o, "profiled_us") > 0, "stage %d: profiled_us %g", s,
			      num(o, "profiled_us"));
	}
	cJSON_Delete(root);
	run_free(&r);
}
END_TEST

/* --split runs the split as given: its stages, whole layers (no hand-over), whatever the profile says. */
START_TEST(split_runs_the_stages_as_given)
{
	if (!have_data())
		return;
	static const char *const splits[] = {"1", "2", "1,2"};
	for (unsigned k = 0; k < 3; k++) {
		struct run r =
		    run((const char *const[]){SMALL, "--epochs", "1", "--json", "--split", splits[k], NULL});
		ck_assert_msg(r.status == 0, "--split %s: exit %d: %s", splits[k], r.status, r.err);
		cJSON *root = cJSON_Parse(r.out);
		ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
		const cJSON *st = cJSON_GetObjectItem(root, "stages");
		unsigned first[3] = {0, k == 1 ? 2u : 1u, 2};
		ck_assert_int_eq(cJSON_GetArraySize(st), k == 2 ? 3 : 2);
		for (int s = 0; s < cJSON_GetArraySize(st); s++) {
			const cJSON *o = cJSON_GetArrayItem(st, s);
			ck_assert_int_eq(cJSON_GetObjectItem(o, "first_layer")->valueint, (int)first[s]);
			ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(o, "hands_over")));
		}
		cJSON_Delete(root);
		run_free(&r);
	}
}
END_TEST

/* The stage row of the summary table (in `text`) that starts with stage s, up to its end. */
static char *summary_row(const char *text, unsigned s, char *row, size_t n)
{
	const char *t = strstr(text, "\nstage  layers");
	ck_assert_msg(t, "no summary table: %s", text);
	for (unsigned k = 0; k <= s; k++) {
		t = strchr(t + 1, '\n');
		ck_assert_msg(t, "no row for stage %u: %s", s, text);
	}
	const char *end = strchr(t + 1, '\n');
	snprintf(row, n, "%.*s", (int)(end ? end - t - 1 : (long)strlen(t + 1)), t + 1);
	return row;
}

/* As in the other tools, the trainer's threads are pinned by the placement plan unless --no-pin says
 * not to (they were unpinned unless --pin was given); each stage's row of the summary says when its pin
 * failed or its CPU is shared with other threads (3 threads on 2 CPUs here: two share one), as the JSON
 * does. */
START_TEST(the_threads_are_pinned_by_default_and_the_summary_says_how)
{
	if (!have_data())
		return;
	struct run r = run(
	    (const char *const[]){SMALL, "--epochs", "1", "--stages", "3", "--threads", "3", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
	const cJSON *st = cJSON_GetObjectItem(root, "stages");
	ck_assert_int_eq(cJSON_GetArraySize(st), 3);
	for (unsigned s = 0; s < 3; s++) {
		const cJSON *o = cJSON_GetArrayItem(st, (int)s);
		const cJSON *pe = cJSON_GetObjectItem(o, "pin_error");
		int cpu = cJSON_GetObjectItem(o, "cpu")->valueint;
		unsigned sharing = (unsigned)cJSON_GetObjectItem(o, "sharing")->valueint;
		ck_assert_msg(cJSON_IsString(pe) ? cpu == -1 : cJSON_IsNull(pe) && cpu >= 0,
			      "stage %u: cpu %d, not pinned and no pin error", s, cpu);
		char row[256], want[64];
		summary_row(r.err, s, row, sizeof row);
		ck_assert_msg(!strstr(row, "(pin failed: ") == !cJSON_IsString(pe), "stage %u: %s", s, row);
		snprintf(want, sizeof want, "(shared with %u other thread%s)", sharing,
			 sharing == 1 ? "" : "s");
		ck_assert_msg(sharing ? strstr(row, want) != NULL : strstr(row, "(shared") == NULL,
			      "stage %u, sharing %u: %s", s, sharing, row);
	}
	cJSON_Delete(root);
	run_free(&r);

	r = run((const char *const[]){SMALL, "--epochs", "1", "--stages", "3", "--no-pin", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	root = cJSON_Parse(r.out);
	ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
	st = cJSON_GetObjectItem(root, "stages");
	for (unsigned s = 0; s < 3; s++) {
		const cJSON *o = cJSON_GetArrayItem(st, (int)s);
		ck_assert_int_eq(cJSON_GetObjectItem(o, "cpu")->valueint, -1);
		ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "pin_error")));
		ck_assert_int_eq(cJSON_GetObjectItem(o, "sharing")->valueint, 0);
	}
	cJSON_Delete(root);
	run_free(&r);
}
END_TEST

/* A failed step names its operation in words; the update of a step (a refused gradient) is "update", not
 * a weight gradient's "B_w". */
START_TEST(every_operation_has_its_own_name_in_messages)
{
	ck_assert_str_eq(pt_op_name(MBP_OP_F), "forward");
	ck_assert_str_eq(pt_op_name(MBP_OP_B), "backward");
	ck_assert_str_eq(pt_op_name(MBP_OP_BIN), "B_in");
	ck_assert_str_eq(pt_op_name(MBP_OP_W), "B_w");
	ck_assert_str_eq(pt_op_name(MBP_OP_UPDATE), "update");
}
END_TEST

START_TEST(the_progress_bar_goes_to_stderr_at_most_ten_times_a_second)
{
	if (!have_data())
		return;
	/* 128 steps of a small model: well under the 12.8 s in which ten redraws a second would draw each. */
	struct run r =
	    run((const char *const[]){"--layers", "784,48,24,10", "--limit", "4096", "--batch", "32", "--mb",
				      "32", "--val", "500", "--epochs", "1", "--progress", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	unsigned draws = 0;
	for (const char *p = r.err; (p = strstr(p, "\repoch 1/1 [")); p++)
		draws++;
	ck_assert_msg(draws >= 1 && draws < 128, "%u redraws for 128 steps", draws);
	ck_assert_msg(strstr(r.err, "] 100% "), "the last step is not drawn: %s", r.err);
	ck_assert_msg(!strchr(r.out, '\r'), "a bar on stdout: %s", r.out);
	cJSON *doc = cJSON_Parse(r.out);
	ck_assert_msg(doc, "stdout is not JSON with the bar on: %s", r.out);
	cJSON_Delete(doc);
	run_free(&r);
}
END_TEST

/* Train `n` arms (schedule, stages, file name, hand-over, threads or NULL, recompute or NULL) on `layers`
 * for 2 epochs into path[i] and csv[i]: each must exit 0 printing nothing, and all write the same weights. */
static void train_arms(const char *const (*arms)[6], unsigned n, const char *layers, char (*path)[128],
		       char (*csv)[128])
{
	for (unsigned i = 0; i < n; i++) {
		snprintf(path[i], sizeof path[i], "%s", tmpdir_path(arms[i][2]));
		snprintf(csv[i], sizeof csv[i], "%s.csv", path[i]);
		struct run r = run((const char *const[]){SMALL,
							 "--layers",
							 layers,
							 "--epochs",
							 "2",
							 "--schedule",
							 arms[i][0],
							 "--stages",
							 arms[i][1],
							 "--hand-over",
							 arms[i][3],
							 "--save",
							 path[i],
							 "--csv",
							 csv[i],
							 "--quiet",
							 "--recompute",
							 arms[i][5] ? arms[i][5] : "none",
							 arms[i][4] ? "--threads" : NULL,
							 arms[i][4],
							 NULL});
		ck_assert_msg(r.status == 0, "%s: exit %d: %s", arms[i][0], r.status, r.err);
		ck_assert_msg(r.out[0] == 0 && r.err[0] == 0, "--quiet printed: %s%s", r.out, r.err);
		run_free(&r);
	}
	for (unsigned i = 1; i < n; i++)
		assert_same_file(path[0], path[i]);
}

START_TEST(every_chunked_schedule_writes_the_weights_of_one_stage)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	/* four layers as four chunks on two threads (the V ones: chunks 0 and 3 on thread 0); and with
	 * recomputation, a thread running several chunks that recompute (every layer, or some) */
	static const char *const arms[][6] = {
	    {"1f1b", "1", "a", "auto", NULL, NULL},	  {"zbv", "4", "b", "auto", "2", NULL},
	    {"interleaved", "4", "c", "auto", "2", NULL}, {"looped-bfs", "4", "d", "off", "2", NULL},
	    {"dualpipev", "4", "e", "auto", "2", NULL},	  {"zbh2", "4", "f", "auto", "2", NULL},
	    {"interleaved", "2", "g", "auto", "1", NULL}, {"auto", "4", "h", "auto", "2", NULL},
	    {"zbv", "4", "i", "auto", "2", "all"},	  {"interleaved", "4", "j", "off", "2", "1-2"},
	    {"dualpipev", "4", "k", "auto", "2", "0,3"},  {"looped-bfs", "4", "l", "off", "2", "all"},
	    {"auto", "4", "m", "auto", "2", "all"},	  {"zbh2", "4", "n", "auto", "2", "1,3"}};
	enum { ARMS = sizeof arms / sizeof arms[0] };
	char path[ARMS][128], csv[ARMS][128];
	train_arms(arms, ARMS, "784,48,32,24,10", path, csv);
	/* and a schedule from a file: DualPipeV's, written as PyTorch's CSV (4 micro-batches of 32 rows) */
	mbp_schedule *sc;
	ck_assert_int_eq(mbp_schedule_new_placed(&sc, MBP_SCHED_DUALPIPEV, 4, 4, 2), 0);
	char text[4096], file[128], out[128];
	ck_assert_uint_lt(mbp_schedule_write_csv(sc, 2, text, sizeof(text)), sizeof(text));
	mbp_schedule_destroy(sc);
	snprintf(file, sizeof(file), "%s", tmpdir_path("dpv.csv"));
	snprintf(out, sizeof(out), "%s", tmpdir_path("h"));
	FILE *f = fopen(file, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	struct run r = run((const char *const[]){SMALL, "--layers", "784,48,32,24,10", "--epochs", "2",
						 "--schedule-file", file, "--save", out, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "--schedule-file: exit %d: %s", r.status, r.err);
	run_free(&r);
	assert_same_file(path[0], out);
	/* a bad one: refused naming the line and the action; one of other micro-batches: refused */
	f = fopen(file, "w");
	fputs("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B2\n", f);
	fclose(f);
	r = run((const char *const[]){SMALL, "--layers", "784,48,32,10", "--schedule-file", file, NULL});
	assert_refused(&r, "--schedule-file", file);
	ck_assert_msg(strstr(r.err, "line 2, action 1B2: micro-batch repeated"), "%s", r.err);
	run_free(&r);
	f = fopen(file, "w");
	fputs("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", f);
	fclose(f);
	r = run((const char *const[]){SMALL, "--layers", "784,48,32,10", "--schedule-file", file, NULL});
	assert_refused(&r, "--schedule-file", file);
	ck_assert_msg(strstr(r.err, "micro-batches"), "%s", r.err);
	run_free(&r);
	tmpdir_remove();
}
END_TEST

/* The summary shows each stage's hops of the last step (to another thread + to a stage of its own thread)
 * and each thread's held peak and hops in pipebench's form, as --json has them: ZB-V's four chunks on two
 * threads (chunks 1 and 2 on thread 1 pass 4 outputs and 4 input gradients between them). */
START_TEST(the_summary_shows_each_stages_and_each_threads_hops_as_the_json_has_them)
{
	if (!have_data())
		return;
	static const char *const stage_hops[] = {"4 + 0", "4 + 4", "4 + 4", "4 + 0"};
	struct run r =
	    run((const char *const[]){SMALL, "--layers", "784,48,32,24,10", "--epochs", "1", "--stages", "4",
				      "--schedule", "zbv", "--threads", "2", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	const char *head = strstr(r.out, "\nstage  ");
	ck_assert_msg(head && strstr(head, " hops "), "no hops column: %s", r.out);
	const char *row = strchr(head + 1, '\n');
	for (unsigned s = 0; s < 4; s++) {
		ck_assert_msg(row && strtoul(row + 1, NULL, 10) == s, "stage %u's row: %s", s, r.out);
		const char *end = strchr(row + 1, '\n');
		ck_assert_ptr_nonnull(end);
		char line[512];
		snprintf(line, sizeof line, "%.*s", (int)(end - row - 1), row + 1);
		ck_assert_msg(strstr(line, stage_hops[s]), "stage %u: want hops %s: %s", s, stage_hops[s],
			      line);
		row = end;
	}
	ck_assert_msg(strstr(r.out, "\nper thread: t 4,4; h 8,8 + 0,8 ("), "the per-thread line: %s", r.out);
	run_free(&r);

	r = run((const char *const[]){SMALL, "--layers", "784,48,32,24,10", "--epochs", "1", "--stages", "4",
				      "--schedule", "zbv", "--threads", "2", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root != NULL, "stdout is not JSON: %s", r.out);
	static const char *const key[] = {"thread_held_peak", "thread_hops", "thread_local_hops"};
	static const int want[3][2] = {{4, 4}, {8, 8}, {0, 8}};
	for (unsigned k = 0; k < 3; k++) {
		const cJSON *a = cJSON_GetObjectItem(root, key[k]);
		ck_assert_msg(cJSON_GetArraySize(a) == 2, "%s: %s", key[k], r.out);
		for (int t = 0; t < 2; t++)
			ck_assert_int_eq(cJSON_GetArrayItem(a, t)->valueint, want[k][t]);
	}
	/* the counts agreed with the schedule: nothing left out, no warning */
	ck_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "thread_figures_left_out")));
	ck_assert_msg(!strstr(r.err, "warning"), "stderr: %s", r.err);
	const cJSON *st = cJSON_GetObjectItem(root, "stages");
	for (int s = 0; s < 4; s++) {
		const cJSON *o = cJSON_GetArrayItem(st, s);
		ck_assert_int_eq(cJSON_GetObjectItem(o, "hops")->valueint, 4);
		ck_assert_int_eq(cJSON_GetObjectItem(o, "local_hops")->valueint, s == 1 || s == 2 ? 4 : 0);
	}
	cJSON_Delete(root);
	run_free(&r);
}
END_TEST

START_TEST(a_chunked_schedule_that_cannot_place_the_stages_is_refused_as_usage)
{
	if (!have_data())
		return;
	/* zbv wants twice as many stages as threads; dualpipev as many micro-batches as stages (4 here) */
	static const char *const bad[][3] = {
	    {"zbv", "3", "1"}, {"interleaved", "3", "2"}, {"dualpipev", "2", "1"}};
	for (unsigned i = 0; i < 3; i++) {
		struct run r = run((const char *const[]){SMALL_1, "--schedule", bad[i][0], "--stages",
							 bad[i][1], "--threads", bad[i][2], "--batch",
							 i == 2 ? "16" : "128", "--mb", "16", NULL});
		assert_refused(&r, "--schedule", bad[i][0]);
		run_free(&r);
	}
	struct run r = run((const char *const[]){SMALL_1, "--schedule", "2f2b", NULL});
	assert_refused(&r, "--schedule", "zbv");
	run_free(&r);
}
END_TEST

START_TEST(every_schedule_and_stage_count_writes_the_same_weights)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	/* the last two with layer 1's input gradient computed by stage 2 (--hand-over all), or never */
	/* and with recomputation (--recompute): every layer, or some, under each schedule */
	static const char *const arms[][6] = {
	    {"gpipe", "1", "a", "auto", NULL, "none"}, {"1f1b", "2", "b", "auto", NULL, "none"},
	    {"zbh1", "3", "c", "all", NULL, "none"},   {"1f1b", "3", "d", "off", NULL, "none"},
	    {"zbh1", "3", "e", "all", NULL, "all"},    {"gpipe", "2", "f", "off", NULL, "0,2"},
	    {"1f1b", "3", "g", "auto", NULL, "1-2"}};
	enum { ARMS = sizeof arms / sizeof arms[0] };
	char path[ARMS][128], csv[ARMS][128];
	train_arms(arms, ARMS, "784,48,24,10", path, csv);
	/* And the same accuracy, as the CSV says (its timing columns differ). */
	size_t len;
	char *a = read_all(csv[0], &len), *b = read_all(csv[2], &len);
	ck_assert_uint_eq(lines(a), 3);
	for (char *pa = strchr(a, '\n'), *pb = strchr(b, '\n'); pa && pb;
	     pa = strchr(pa + 1, '\n'), pb = strchr(pb + 1, '\n')) {
		/* epoch,step,train_loss,train_acc,val_acc,test_acc,test_loss: the first 7 fields */
		unsigned commas = 0;
		size_t k = 1;
		while (pa[k] && commas < 7)
			commas += pa[k++] == ',';
		ck_assert_msg(strncmp(pa, pb, k) == 0, "CSV rows differ: %.*s vs %.*s", (int)k, pa, (int)k,
			      pb);
	}
	free(a);
	free(b);
	tmpdir_remove();
}
END_TEST

START_TEST(replicated_stages_write_the_weights_of_unreplicated_ones_byte_for_byte)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	/* schedule, stages, replicas (NULL: none), hand-over; 3 replicas on 2 CPUs; a stage that takes
	 * the previous one's input gradient over, replicated; the whole model on 2 replicas; the chunked
	 * and built schedules, whose threads are copied (both chunks of one thread, or one of them) */
	static const char *const arms[][4] = {
	    {"1f1b", "2", NULL, "off"},		{"1f1b", "2", "1,2", "off"},
	    {"gpipe", "3", "2,1,3", "off"},	{"zbh1", "2", "2,2", "off"},
	    {"zbh2", "3", "1,3,1", "off"},	{"1f1b", "2", "1,2", "all"},
	    {"zbh1", "3", "1,2,2", "all"},	{"1f1b", "1", "2", "off"},
	    {"interleaved", "2", "1,2", "off"}, {"looped-bfs", "2", "2,2", "off"},
	    {"zbv", "2", "2,1", "off"},		{"dualpipev", "2", "2,2", "off"},
	    {"auto", "3", "1,2,1", "off"}};
	enum { ARMS = sizeof arms / sizeof arms[0] };
	char path[ARMS][128];
	for (unsigned i = 0; i < ARMS; i++) {
		snprintf(path[i], sizeof path[i], "%s", tmpdir_path((char[]){(char)('a' + i), 0}));
		struct run r = run((const char *const[]){
		    SMALL, "--layers", "784,48,24,10", "--epochs", "2", "--schedule", arms[i][0], "--stages",
		    arms[i][1], "--hand-over", arms[i][3], "--save", path[i], "--quiet",
		    arms[i][2] ? "--replicas" : NULL, arms[i][2], NULL});
		ck_assert_msg(r.status == 0, "%s --replicas %s: exit %d: %s", arms[i][0],
			      arms[i][2] ? arms[i][2] : "-", r.status, r.err);
		run_free(&r);
	}
	for (unsigned i = 1; i < ARMS; i++)
		assert_same_file(path[0], path[i]);
	/* a schedule read from a file: each of its lines (threads) copied */
	char file[128], out[128];
	snprintf(file, sizeof(file), "%s", tmpdir_path("rep.csv"));
	snprintf(out, sizeof(out), "%s", tmpdir_path("rep"));
	FILE *f = fopen(file, "w");
	ck_assert_ptr_nonnull(f);
	fputs("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n", f);
	ck_assert_int_eq(fclose(f), 0);
	struct run r =
	    run((const char *const[]){SMALL, "--layers", "784,48,24,10", "--epochs", "2", "--schedule-file",
				      file, "--replicas", "2,3", "--save", out, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "--schedule-file --replicas 2,3: exit %d: %s", r.status, r.err);
	run_free(&r);
	assert_same_file(path[0], out);
	tmpdir_remove();
}
END_TEST

/* Modelled layer costs for --rebalance's looks (PIPETRAIN_REBALANCE_COSTS, 3 layers): from step 0 the
 * best split cuts before layer 1 (1000 | 1000 + 10 us), from step 8 before layer 2 (10 + 1000 | 1000): so
 * whatever split the profile chose, at least one move, the last to layers 0-1 | 2. */
#define SKEW "PIPETRAIN_REBALANCE_COSTS=0:1000,1000,10;8:10,1000,1000"

START_TEST(a_rebalancing_run_moves_between_steps_and_writes_the_weights_of_one_without_it)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char base[128], path[128];
	tmp_file(base, "base");
	tmp_file(path, "moved");
	struct run r = run((const char *const[]){SMALL, "--layers", "784,48,24,10", "--epochs", "2",
						 "--stages", "2", "--save", base, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	/* schedule, threads (NULL: the default), hand-over */
	static const char *const arms[][3] = {{"gpipe", NULL, "auto"},	    {"1f1b", NULL, "auto"},
					      {"zbh1", NULL, "auto"},	    {"1f1b", NULL, "all"},
					      {"interleaved", "1", "auto"}, {"auto", NULL, "auto"}};
	for (unsigned i = 0; i < sizeof arms / sizeof arms[0]; i++) {
		r = run_env(SKEW, (const char *const[]){SMALL, "--layers", "784,48,24,10", "--epochs", "2",
							"--stages", "2", "--schedule", arms[i][0],
							"--hand-over", arms[i][2], "--save", path, "--json",
							"--quiet", "--rebalance=window=1",
							arms[i][1] ? "--threads" : NULL, arms[i][1], NULL});
		ck_assert_msg(r.status == 0, "%s: exit %d: %s", arms[i][0], r.status, r.err);
		/* each move one line with its reason, the last to the split the costs ask for */
		ck_assert_msg(strstr(r.err, "pipetrain: rebalance: move 1 after step "), "%s: %s", arms[i][0],
			      r.err);
		ck_assert_msg(strstr(r.err, "of a plan cutting before layer 2"), "%s: %s", arms[i][0], r.err);
		const char *last = strstr(r.err, "now layers ");
		for (const char *n; last && (n = strstr(last + 1, "now layers "));)
			last = n;
		ck_assert_msg(last && !strncmp(last, "now layers 0-1 | 2\n", 19), "%s: %s", arms[i][0],
			      r.err);
		cJSON *j = cJSON_Parse(r.out);
		ck_assert_msg(j, "%s: no JSON: %s", arms[i][0], r.out);
		double moves = cJSON_GetObjectItem(j, "moves")->valuedouble;
		ck_assert_msg(moves >= 1 && moves <= 2, "%s: %g moves", arms[i][0], moves);
		ck_assert_uint_eq(lines(r.err), (unsigned)moves);
		ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "rebalance")));
		cJSON_Delete(j);
		run_free(&r);
		assert_same_file(base, path);
	}
	tmpdir_remove();
}
END_TEST

START_TEST(steady_costs_never_move_and_costs_that_change_once_move_once)
{
	if (!have_data())
		return;
	/* any split of three equal layers has a 2000 us stage: no fresh plan is better */
	struct run r =
	    run_env("PIPETRAIN_REBALANCE_COSTS=0:1000,1000,1000",
		    (const char *const[]){SMALL, "--layers", "784,48,24,10", "--epochs", "2", "--stages", "2",
					  "--hand-over", "off", "--json", "--rebalance=window=1", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(!strstr(r.err, "rebalance: move"), "%s", r.err);
	cJSON *j = cJSON_Parse(r.out);
	ck_assert(j);
	ck_assert_double_eq(cJSON_GetObjectItem(j, "moves")->valuedouble, 0);
	cJSON_Delete(j);
	run_free(&r);
	/* costs that ask for layers 0 | 1-2 from the start: one move at most (when the profile cut
	 * elsewhere), never one back */
	r = run_env("PIPETRAIN_REBALANCE_COSTS=0:1000,1000,10",
		    (const char *const[]){SMALL, "--layers", "784,48,24,10", "--epochs", "2", "--stages", "2",
					  "--hand-over", "off", "--json", "--rebalance=window=1", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	j = cJSON_Parse(r.out);
	ck_assert(j);
	ck_assert_double_le(cJSON_GetObjectItem(j, "moves")->valuedouble, 1);
	cJSON *st0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "stages"), 0);
	ck_assert_msg(st0, "%s", r.out);
	ck_assert_double_eq(cJSON_GetObjectItem(st0, "last_layer")->valuedouble,
			    0); /* the split at the end */
	cJSON_Delete(j);
	ck_assert_msg(!strstr(r.err, "move 2"), "%s", r.err);
	run_free(&r);
}
END_TEST

START_TEST(a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char whole[128], half[128], resumed[128];
	tmp_file(whole, "whole.safetensors");
	tmp_file(half, "half.safetensors");
	tmp_file(resumed, "resumed.safetensors");
	struct run r = run((const char *const[]){SMALL, "--epochs", "3", "--save", whole, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	/* A run told it has 3 epochs, stopped after 1 (its checkpoint), then resumed to the end. */
	r = run_env("PIPETRAIN_FAULT=9",
		    (const char *const[]){SMALL, "--epochs", "3", "--save", half, "--quiet", NULL});
	ck_assert_msg(r.status == 1, "exit %d: %s", r.status, r.err);
	run_free(&r);
	r = run((const char *const[]){SMALL, "--epochs", "3", "--model", half, "--save", resumed, NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.out, "resuming at epoch 2, step 8"), "no resume line: %s", r.out);
	ck_assert_msg(!strstr(r.err, "schedule"), "the same command changed the schedule: %s", r.err);
	run_free(&r);
	assert_same_file(whole, resumed);
	assert_same_file(tmpdir_path("whole.optim.safetensors"), tmpdir_path("resumed.optim.safetensors"));
	tmpdir_remove();
}
END_TEST

START_TEST(more_epochs_on_resume_are_announced_as_a_new_schedule)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char one[128], two[128];
	tmp_file(one, "one.safetensors");
	tmp_file(two, "two.safetensors");
	struct run r = run((const char *const[]){SMALL, "--epochs", "1", "--save", one, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	r = run(
	    (const char *const[]){SMALL, "--epochs", "2", "--model", one, "--save", two, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	/* 1024 rows / 128: 8 steps an epoch; 8 then 16 steps, the warm-up a twentieth of each (0). */
	ck_assert_msg(strstr(r.err, "new learning-rate schedule from step 8 on (the checkpoint's: 8 steps, "
				    "warm-up 0, lr 0.001 to 0; this run's: 16, 0, 0.001 to 0)"),
		      "no note of the new schedule: %s", r.err);
	ck_assert_uint_eq(lines(r.err), 1);
	run_free(&r);
	tmpdir_remove();
}
END_TEST

START_TEST(a_checkpoint_pair_from_different_steps_is_refused_with_exit_2)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char one[128], two[128], pair[128];
	tmp_file(one, "one.safetensors");
	tmp_file(two, "two.safetensors");
	tmp_file(pair, "pair.safetensors");
	struct run r = run((const char *const[]){SMALL, "--epochs", "1", "--save", one, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	r = run((const char *const[]){SMALL, "--epochs", "2", "--save", two, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	/* What a crash between the two files of a checkpoint leaves, either way round: the state of step
	 * 16 beside the weights of step 8, then the weights of step 16 beside the state of step 8. */
	for (int k = 0; k < 2; k++) {
		copy_file(k ? two : one, pair);
		copy_file(tmpdir_path(k ? "one.optim.safetensors" : "two.optim.safetensors"),
			  tmpdir_path("pair.optim.safetensors"));
		r = run((const char *const[]){SMALL, "--epochs", "2", "--model", pair, NULL});
		ck_assert_msg(r.status == 2, "case %d: exit %d: %s", k, r.status, r.err);
		ck_assert_msg(lines(r.err) == 1 && strstr(r.err, "other weights"), "case %d: %s", k, r.err);
		ck_assert_msg(strstr(r.err, k ? "saved at step 8 " : "saved at step 16 "), "case %d: %s", k,
			      r.err);
		ck_assert_msg(r.out[0] == 0, "case %d: stdout: %s", k, r.out);
		run_free(&r);
	}
	/* The matching pair still resumes. */
	copy_file(two, pair);
	copy_file(tmpdir_path("two.optim.safetensors"), tmpdir_path("pair.optim.safetensors"));
	r = run((const char *const[]){SMALL, "--epochs", "2", "--model", pair, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	tmpdir_remove();
}
END_TEST

START_TEST(a_nan_loss_stops_naming_step_and_stage_and_keeps_the_last_checkpoint)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char bad[128];
	tmp_file(bad, "bad.safetensors");
	/* 8 steps per epoch: step 11 is in the second epoch, after the first checkpoint. */
	struct run r = run_env("PIPETRAIN_FAULT=11", (const char *const[]){SMALL, "--epochs", "3", "--stages",
									   "3", "--save", bad, NULL});
	ck_assert_msg(r.status == 1, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.err, "step 11 ") && strstr(r.err, "stage 2") && strstr(r.err, "non-finite"),
		      "the error does not name step 11 and stage 2: %s", r.err);
	ck_assert_msg(strstr(r.err, "checkpoint is kept"), "%s", r.err);
	ck_assert_msg(strstr(r.out, "epoch 1/3") && !strstr(r.out, "epoch 2/3"), "%s", r.out);
	run_free(&r);
	/* The kept checkpoint is epoch 1's: resuming it with the same settings and no fault gives the
	 * uninterrupted run's bytes, and the file loads as a model. */
	mbp_model *m;
	ck_assert_int_eq(mbp_model_load(&m, bad, NULL), 0);
	mbp_model_destroy(m);
	char cont[128];
	tmp_file(cont, "cont.safetensors");
	r = run(
	    (const char *const[]){SMALL, "--epochs", "3", "--model", bad, "--save", cont, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	char whole[128];
	tmp_file(whole, "whole.safetensors");
	r = run((const char *const[]){SMALL, "--epochs", "3", "--save", whole, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	assert_same_file(whole, cont);
	tmpdir_remove();
}
END_TEST

START_TEST(sigint_finishes_the_step_writes_a_checkpoint_and_exits_130)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char ck[128], csv[128], whole[128], cont[128];
	tmp_file(ck, "ck.safetensors");
	tmp_file(csv, "ck.csv");
	tmp_file(whole, "whole.safetensors");
	tmp_file(cont, "cont.safetensors");
	struct tool_proc p = spawn_env(NULL, (const char *const[]){SMALL, "--epochs", "40", "--save", ck,
								   "--csv", csv, "--quiet", NULL});
	/* Wait for two epochs to be written (the CSV's header and two rows), then interrupt. */
	for (unsigned i = 0; i < 600; i++) {
		size_t len = 0;
		char *b = access(csv, R_OK) == 0 ? read_all(csv, &len) : NULL;
		unsigned n = b ? lines(b) : 0;
		free(b);
		if (n >= 3)
			break;
		sleep_ms(20);
	}
	kill(p.pid, SIGINT);
	struct run r = tool_finish(p);
	ck_assert_msg(r.status == 130, "exit %d (not interrupted mid-run?): %s", r.status, r.err);
	ck_assert_msg(strstr(r.err, "interrupted (SIGINT)") && strstr(r.err, "checkpoint written"), "%s",
		      r.err);
	run_free(&r);
	/* Resumed, it ends where an uninterrupted run ends. */
	r = run(
	    (const char *const[]){SMALL, "--epochs", "40", "--model", ck, "--save", cont, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	r = run((const char *const[]){SMALL, "--epochs", "40", "--save", whole, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	assert_same_file(whole, cont);
	tmpdir_remove();
}
END_TEST

/* ---- what the run says ---- */

START_TEST(a_batch_that_is_not_a_multiple_is_announced_as_the_trainer_cuts_it)
{
	if (!have_data())
		return;
	/* 100 rows in micro-batches of 32: three full ones and a last one of 4 rows (train.c's cut) */
	struct run r = run((const char *const[]){"--layers", "784,48,24,10", "--limit", "1000", "--batch",
						 "100", "--mb", "32", "--val", "500", "--epochs", "1", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.out, "; batch 100 = 3 x 32 + 4 rows; "), "%s", r.out);
	run_free(&r);
	r = run((const char *const[]){"--layers", "784,48,24,10", "--limit", "1000", "--batch", "100", "--mb",
				      "32", "--val", "500", "--epochs", "1", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root, "not JSON: %s", r.out);
	const cJSON *cfg = cJSON_GetObjectItem(root, "config");
	ck_assert_int_eq(cJSON_GetObjectItem(cfg, "mbs")->valueint, 4);
	ck_assert_int_eq(cJSON_GetObjectItem(cfg, "last_mb_rows")->valueint, 4);
	cJSON_Delete(root);
	run_free(&r);
	/* a multiple: whole micro-batches only */
	r = run((const char *const[]){SMALL, "--epochs", "1", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.out, "; batch 128 = 4 x 32 rows; "), "%s", r.out);
	run_free(&r);
}
END_TEST

START_TEST(the_summary_after_a_resume_counts_the_checkpoints_epochs_and_this_runs)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char half[128], log[128];
	tmp_file(half, "half.safetensors");
	tmp_file(log, "steps.csv");
	/* stopped at step 9 of 24, after epoch 1's checkpoint (step 8), then resumed to the end */
	struct run r = run_env("PIPETRAIN_FAULT=9", (const char *const[]){SMALL, "--epochs", "3", "--save",
									  half, "--quiet", NULL});
	ck_assert_msg(r.status == 1, "exit %d: %s", r.status, r.err);
	run_free(&r);
	r = run((const char *const[]){SMALL, "--epochs", "3", "--model", half, "--log", log, NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.out, "summary: test accuracy ") &&
			  strstr(r.out, " after 3 epochs (2 in this run, resumed at step 8), "),
		      "%s", r.out);
	run_free(&r);
	/* the step log of the resumed run starts after the checkpoint's step */
	size_t len;
	char *b = read_all(log, &len);
	ck_assert_uint_eq(lines(b), 1 + 16);
	ck_assert_msg(strncmp(strchr(b, '\n') + 1, "9,2,", 4) == 0, "%s", b);
	free(b);
	/* and --json says the same */
	r = run((const char *const[]){SMALL, "--epochs", "3", "--model", half, "--json", "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root, "not JSON: %s", r.out);
	ck_assert_int_eq(cJSON_GetObjectItem(root, "start_step")->valueint, 8);
	ck_assert_int_eq(cJSON_GetObjectItem(root, "epochs_completed")->valueint, 3);
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(root, "epochs")), 2);
	cJSON_Delete(root);
	run_free(&r);
	tmpdir_remove();
}
END_TEST

START_TEST(weights_without_an_optimizer_state_start_a_fresh_optimizer_in_one_note)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char one[128];
	tmp_file(one, "one.safetensors");
	struct run r = run((const char *const[]){SMALL, "--epochs", "1", "--save", one, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	ck_assert_int_eq(unlink(tmpdir_path("one.optim.safetensors")), 0);
	r = run((const char *const[]){SMALL, "--epochs", "1", "--model", one, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(
	    lines(r.err) == 1 && strstr(r.err, "pipetrain: note: no optimizer state beside --model ") &&
		strstr(r.err, "one.optim.safetensors") && strstr(r.err, "the optimizer starts fresh"),
	    "%s", r.err);
	run_free(&r);
	/* with its state beside it, the same weights resume, without that note */
	tmpdir_remove();
}
END_TEST

START_TEST(a_generic_openblas_kernel_is_warned_about_as_by_the_other_tools)
{
	if (!have_data())
		return;
	__builtin_cpu_init();
	bool capable = __builtin_cpu_supports("avx2") || __builtin_cpu_supports("avx512f");
	static const char *const drop[] = {"PIPETRAIN_FAULT=", "OPENBLAS_CORETYPE=", NULL};
	static const char *const prescott[] = {"OPENBLAS_CORETYPE=Prescott", NULL};
	struct run r =
	    tool_run(PIPETRAIN_BIN, drop, prescott, (const char *const[]){SMALL, "--epochs", "1", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	if (capable)
		ck_assert_msg(
		    strstr(r.err, "pipetrain: warning: OpenBLAS picked the generic 'Prescott' kernel") &&
			strstr(r.err, "OPENBLAS_CORETYPE="),
		    "no warning: %s", r.err);
	else
		ck_assert_msg(!strstr(r.err, "warning"), "a warning on a CPU without AVX2: %s", r.err);
	run_free(&r);
	/* --json carries it; --quiet keeps it off standard error */
	r = tool_run(PIPETRAIN_BIN, drop, prescott,
		     (const char *const[]){SMALL, "--epochs", "1", "--json", "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(r.err[0] == 0, "--quiet printed: %s", r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root, "not JSON: %s", r.out);
	const cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "config"), "blas_warning");
	ck_assert(capable ? cJSON_IsString(w) && strstr(w->valuestring, "Prescott") : cJSON_IsNull(w));
	cJSON_Delete(root);
	run_free(&r);
}
END_TEST

/* The summary names the dense kernel beside OpenBLAS's line (JSON config.dense_kernel), the one MBP_KERNEL
 * chose; an MBP_KERNEL that is not a kernel runs the default and is warned about on standard error. */
START_TEST(the_summary_names_the_dense_kernel_and_an_unknown_mbp_kernel_is_warned_about)
{
	if (!have_data())
		return;
	const char *best = cpu_runs_packed_kernel() ? "packed" : "blas";
	static const char *const drop[] = {"PIPETRAIN_FAULT=", "MBP_KERNEL=", NULL};
	struct run r = tool_run(PIPETRAIN_BIN, drop, (const char *const[]){"MBP_KERNEL=openblas", NULL},
				(const char *const[]){SMALL, "--epochs", "1", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	char want[64];
	snprintf(want, sizeof want, "\ndense kernel: %s (", best);
	ck_assert_msg(strstr(r.out, want), "no '%s' line: %s", want + 1, r.out);
	ck_assert_msg(strstr(r.err, "pipetrain: warning: MBP_KERNEL='openblas' is not a dense kernel"),
		      "no warning: %s", r.err);
	run_free(&r);
	r = tool_run(PIPETRAIN_BIN, drop, (const char *const[]){"MBP_KERNEL=blas", NULL},
		     (const char *const[]){SMALL, "--epochs", "1", "--json", "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(r.err[0] == 0, "a warning for MBP_KERNEL=blas: %s", r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_msg(root, "not JSON: %s", r.out);
	const cJSON *k = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "config"), "dense_kernel");
	ck_assert(cJSON_IsString(k));
	ck_assert_str_eq(k->valuestring, "blas");
	cJSON_Delete(root);
	run_free(&r);
}
END_TEST

START_TEST(the_progress_line_shows_the_time_left)
{
	if (!have_data())
		return;
	struct run r = run((const char *const[]){SMALL, "--epochs", "2", "--progress", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	/* every drawn line ends with the run's time left, m:ss (under an hour here) */
	unsigned draws = 0, etas = 0;
	for (const char *p = r.err; (p = strstr(p, "\repoch ")); p++) {
		const char *end = strpbrk(p + 1, "\r\n");
		size_t n = end ? (size_t)(end - p) : strlen(p);
		char line[256];
		snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p + 1);
		if (!strchr(line, '['))
			continue; /* the blank that erases the bar */
		draws++;
		const char *e = strstr(line, " ETA ");
		unsigned m, sec;
		char tail;
		if (e && sscanf(e, " ETA %u:%2u%c", &m, &sec, &tail) == 3 && sec < 60 && tail == ' ')
			etas++;
	}
	ck_assert_msg(draws > 0 && etas == draws, "%u of %u lines with an ETA: %s", etas, draws, r.err);
	ck_assert_msg(strstr(r.err, "] 100% ") && strstr(r.err, " ETA 0:00 "), "the end is not 0:00 left: %s",
		      r.err);
	run_free(&r);
}
END_TEST

/* ---- --log and --plot ---- */

START_TEST(the_step_log_has_a_header_and_a_row_per_step_rising_by_one)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char log[128];
	tmp_file(log, "steps.csv");
	struct run r = run((const char *const[]){SMALL, "--epochs", "2", "--log", log, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	size_t len;
	char *b = read_all(log, &len);
	static const char head[] =
	    "step,epoch,loss,accuracy,lr,grad_norm,samples_per_s,step_ms,bubble,elapsed_s\n";
	ck_assert_msg(strncmp(b, head, sizeof head - 1) == 0, "header: %.120s", b);
	ck_assert_uint_eq(lines(b), 1 + 2 * 8); /* 1024 rows / 128: 8 steps an epoch */
	unsigned k = 0;
	double last_elapsed = -1;
	for (char *p = b + sizeof head - 1; *p; p = strchr(p, '\n') + 1, k++) {
		unsigned long long step;
		unsigned epoch;
		double loss, acc, lr, gn, sps, ms, bubble, el;
		ck_assert_msg(sscanf(p, "%llu,%u,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &step, &epoch, &loss, &acc,
				     &lr, &gn, &sps, &ms, &bubble, &el) == 10,
			      "row %u: %.120s", k, p);
		ck_assert_uint_eq(step, k + 1);
		ck_assert_uint_eq(epoch, 1 + k / 8);
		ck_assert_msg(loss > 0 && acc >= 0 && acc <= 1 && lr > 0 && gn > 0 && sps > 0 && ms > 0,
			      "row %u: %.120s", k, p);
		ck_assert_msg(el >= last_elapsed, "elapsed_s went back: %.120s", p);
		last_elapsed = el;
	}
	ck_assert_uint_eq(k, 16);
	free(b);
	tmpdir_remove();
}
END_TEST

/* Whether s is one well-formed XML element (with declarations, comments and whitespace around it):
 * every tag closed in order, attributes quoted, no raw '<' or stray '&' in text or values. */
static bool xml_well_formed(const char *s, char *why, size_t whylen)
{
	char stack[32][32];
	int depth = 0, roots = 0;
	for (const char *p = s; *p;) {
		if (*p == '&') {
			const char *semi = strchr(p, ';');
			if (!semi || semi - p > 8 ||
			    strspn(p + 1, "#abcdefghijklmnopqrstuvwxyz0123456789") !=
				(size_t)(semi - p - 1)) {
				snprintf(why, whylen, "a stray '&' at %.40s", p);
				return false;
			}
			p = semi + 1;
			continue;
		}
		if (*p != '<') {
			if (depth == 0 && !strchr(" \t\r\n", *p)) {
				snprintf(why, whylen, "text outside the root: %.40s", p);
				return false;
			}
			p++;
			continue;
		}
		if (!strncmp(p, "<?", 2) || !strncmp(p, "<!--", 4)) {
			const char *end = strstr(p, p[1] == '?' ? "?>" : "-->");
			if (!end) {
				snprintf(why, whylen, "unclosed %.10s", p);
				return false;
			}
			p = end + (p[1] == '?' ? 2 : 3);
			continue;
		}
		bool closing = p[1] == '/';
		const char *n = p + 1 + closing;
		size_t nl = strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_");
		if (nl == 0 || nl >= 32) {
			snprintf(why, whylen, "a bad tag at %.40s", p);
			return false;
		}
		const char *q = n + nl;
		if (closing) {
			if (depth == 0 || strlen(stack[depth - 1]) != nl ||
			    strncmp(stack[depth - 1], n, nl) || *q != '>') {
				snprintf(why, whylen, "a closing tag that closes nothing open: %.40s", p);
				return false;
			}
			depth--;
			p = q + 1;
			continue;
		}
		for (;;) { /* attributes: name="value" */
			q += strspn(q, " \t\r\n");
			if (*q == '>' || !strncmp(q, "/>", 2))
				break;
			size_t an =
			    strspn(q, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_");
			if (an == 0 || q[an] != '=' || q[an + 1] != '"') {
				snprintf(why, whylen, "a bad attribute at %.40s", q);
				return false;
			}
			const char *v = q + an + 2, *end = strchr(v, '"');
			if (!end || memchr(v, '<', (size_t)(end - v))) {
				snprintf(why, whylen, "a bad attribute value at %.40s", q);
				return false;
			}
			q = end + 1;
		}
		if (depth == 0 && roots++) {
			snprintf(why, whylen, "a second root element at %.40s", p);
			return false;
		}
		if (*q == '>') {
			if (depth == 32)
				return false;
			snprintf(stack[depth++], 32, "%.*s", (int)nl, n);
			p = q + 1;
		} else {
			p = q + 2;
		}
	}
	if (depth || roots != 1) {
		snprintf(why, whylen, "%d elements left open, %d roots", depth, roots);
		return false;
	}
	return true;
}

START_TEST(the_plot_is_an_svg_document_with_a_polyline_per_curve_inside_its_panel)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char plot[128];
	tmp_file(plot, "curves.svg");
	struct run r = run((const char *const[]){SMALL, "--epochs", "3", "--plot", plot, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	size_t len;
	char *svg = read_all(plot, &len);
	char why[160];
	ck_assert_msg(xml_well_formed(svg, why, sizeof why), "not well-formed: %s", why);
	ck_assert_msg(strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39) == 0, "%.80s", svg);
	/* each curve once, with its points: 24 steps, 3 epochs */
	static const struct {
		const char *name;
		unsigned points;
	} want[] = {{"step loss", 24},	   {"train loss", 3},	       {"test loss", 3},
		    {"train accuracy", 3}, {"validation accuracy", 3}, {"test accuracy", 3}};
	unsigned found[6] = {0}, polylines = 0;
	double fx = 0, fy = 0, fw = 0, fh = 0;
	unsigned frames = 0;
	for (const char *p = svg; (p = strchr(p, '<')); p++) {
		if (!strncmp(p, "<rect class=\"frame\"", 19)) {
			ck_assert_int_eq(
			    sscanf(p,
				   "<rect class=\"frame\" x=\"%lf\" y=\"%lf\" width=\"%lf\" height=\"%lf\"",
				   &fx, &fy, &fw, &fh),
			    4);
			frames++;
			continue;
		}
		if (strncmp(p, "<polyline ", 10))
			continue;
		polylines++;
		ck_assert_msg(frames > 0, "a polyline before any panel");
		const char *nm = strstr(p, "data-curve=\""), *pts = strstr(p, "points=\"");
		ck_assert(nm && pts);
		nm += 12;
		pts += 8;
		unsigned i = 0;
		while (i < 6 &&
		       (strncmp(nm, want[i].name, strlen(want[i].name)) || nm[strlen(want[i].name)] != '"'))
			i++;
		ck_assert_msg(i < 6, "an unknown curve: %.40s", nm);
		found[i]++;
		unsigned n = 0;
		for (const char *q = pts; *q != '"';) {
			double x, y;
			int used;
			ck_assert_msg(sscanf(q, "%lf,%lf%n", &x, &y, &used) == 2, "%s: points %.60s",
				      want[i].name, q);
			ck_assert_msg(x >= fx && x <= fx + fw && y >= fy && y <= fy + fh,
				      "%s: point %g,%g outside its panel %g,%g %gx%g", want[i].name, x, y, fx,
				      fy, fw, fh);
			q += used;
			q += *q == ' ';
			n++;
		}
		ck_assert_msg(n == want[i].points, "%s: %u points, not %u", want[i].name, n, want[i].points);
	}
	ck_assert_uint_eq(frames, 2);
	ck_assert_uint_eq(polylines, 6);
	for (unsigned i = 0; i < 6; i++)
		ck_assert_msg(found[i] == 1, "%s: %u polylines", want[i].name, found[i]);
	free(svg);
	/* no temporary file left beside it */
	char cmd[256];
	snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) -eq 1", tmpdir);
	ck_assert_int_eq(system(cmd), 0);
	tmpdir_remove();
}
END_TEST

START_TEST(a_long_run_keeps_the_step_curve_to_its_bound)
{
	pt_curve *c = calloc(1, sizeof *c);
	ck_assert_ptr_nonnull(c);
	const unsigned steps = 3 * PT_CURVE_MAX + 5;
	for (unsigned s = 1; s <= steps; s++)
		pt_curve_add(c, s, s % 2 ? 1.0 : 3.0);
	pt_curve_add(c, steps + 1, NAN); /* left out */
	/* full at 2048 steps, then at 4096: each point stands for 4 steps */
	ck_assert_uint_le(c->n, PT_CURVE_MAX);
	ck_assert_uint_eq(c->per, 4);
	/* every point the mean of its steps (1 and 3 alternate: 2), at its last step, in order */
	for (unsigned i = 0; i < c->n; i++) {
		ck_assert_double_eq_tol(c->y[i], 2.0, 1e-12);
		ck_assert_double_eq(c->x[i], (double)(4 * (i + 1)));
	}
	ck_assert_uint_eq(c->n * c->per + c->pend_n, steps);
	free(c);
}
END_TEST

/* ---- end to end: train, serve, reload ---- */

#define ROWS_PER_REQ 50
#define CHECK_ROWS   500

static float *test_x; /* CHECK_ROWS test images */

static int32_t *read_predictions(const char *path)
{
	size_t len;
	char *b = read_all(path, &len);
	ck_assert_uint_eq(lines(b), 10000);
	int32_t *p = malloc(10000 * sizeof(int32_t));
	char *s = b;
	for (unsigned i = 0; i < 10000; i++)
		p[i] = (int32_t)strtol(s, &s, 10);
	free(b);
	return p;
}

/* Classify rows [first, first + ROWS_PER_REQ) over HTTP; @return 0 and the classes in cls, or -1. */
static int classify(int port, unsigned first, int32_t *cls, char *why, size_t whylen)
{
	size_t cap = 256 + (size_t)ROWS_PER_REQ * 784 * 12;
	char *b = malloc(cap);
	size_t n =
	    (size_t)snprintf(b, cap,
			     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[%d,784],"
			     "\"data\":[",
			     ROWS_PER_REQ);
	for (unsigned i = 0; i < ROWS_PER_REQ * 784; i++)
		n +=
		    (size_t)snprintf(b + n, cap - n, "%s%.9g", i ? "," : "", (double)test_x[first * 784 + i]);
	n += (size_t)snprintf(b + n, cap - n, "]}]}");
	char path[64];
	snprintf(path, sizeof path, "/v2/models/m/infer");
	http_resp r;
	int rc = http_do(port, "POST", path, NULL, b, n, &r);
	free(b);
	if (rc || r.status != 200) {
		snprintf(why, whylen, "status %d: %s", r.status, r.body ? r.body : "(connection)");
		http_resp_free(&r);
		return -1;
	}
	cJSON *root = cJSON_Parse(r.body);
	const cJSON *data =
	    cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "outputs"), 0), "data");
	rc = cJSON_GetArraySize(data) == ROWS_PER_REQ * 10 ? 0 : -1;
	for (unsigned row = 0; rc == 0 && row < ROWS_PER_REQ; row++) {
		double best = -INFINITY;
		for (unsigned k = 0; k < 10; k++) {
			double v = cJSON_GetArrayItem(data, (int)(row * 10 + k))->valuedouble;
			if (v > best)
				best = v, cls[row] = (int32_t)k;
		}
	}
	if (rc)
		snprintf(why, whylen, "bad answer: %.200s", r.body);
	cJSON_Delete(root);
	http_resp_free(&r);
	return rc;
}

typedef struct client {
	int port;
	const int32_t *pa, *pb; /* the two models' predictions */
	_Atomic bool *stop;
	unsigned done, failed, neither;
	char why[256];
} client;

static void *client_main(void *arg)
{
	client *c = arg;
	for (unsigned k = 0; !atomic_load(c->stop); k++) {
		unsigned first = (k * ROWS_PER_REQ) % CHECK_ROWS;
		int32_t cls[ROWS_PER_REQ];
		if (classify(c->port, first, cls, c->why, sizeof c->why)) {
			c->failed++;
			continue;
		}
		c->done++;
		/* One request is computed with one version: all a's classes, or all b's. */
		bool is_a = true, is_b = true;
		for (unsigned i = 0; i < ROWS_PER_REQ; i++) {
			is_a &= cls[i] == c->pa[first + i];
			is_b &= cls[i] == c->pb[first + i];
		}
		c->neither += !is_a && !is_b;
	}
	return NULL;
}

START_TEST(a_trained_model_serves_its_own_predictions_and_reloads_live)
{
	if (!have_data())
		return;
	tmpdir_make("pipetrain");
	char ma[128], mb[128], pa_path[128], pb_path[128];
	tmp_file(ma, "m.safetensors");
	tmp_file(mb, "m2.safetensors");
	tmp_file(pa_path, "a.pred");
	tmp_file(pb_path, "b.pred");
	/* One epoch of a small model, then a second model (another seed, two epochs). */
	struct run r = run((const char *const[]){"--layers", "784,64,10", "--limit", "4096", "--epochs", "1",
						 "--save", ma, "--predictions", pa_path, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	r = run((const char *const[]){"--layers", "784,64,10", "--limit", "4096", "--epochs", "2", "--seed",
				      "7", "--save", mb, "--predictions", pb_path, "--quiet", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	int32_t *pa = read_predictions(pa_path), *pb = read_predictions(pb_path);
	unsigned differ = 0;
	for (unsigned i = 0; i < CHECK_ROWS; i++)
		differ += pa[i] != pb[i];
	ck_assert_msg(differ > 0, "the two models agree on every image: the reload would not show");

	mbp_dataset ds;
	mbp_data_error de;
	ck_assert_msg(mbp_fashion_mnist_load(&ds, NULL, false, &de) == 0, "%s", de.msg);
	uint32_t idx[CHECK_ROWS];
	for (unsigned i = 0; i < CHECK_ROWS; i++)
		idx[i] = i;
	test_x = malloc((size_t)CHECK_ROWS * 784 * sizeof(float));
	ck_assert_int_eq(mbp_dataset_gather(&ds, idx, CHECK_ROWS, test_x, NULL), 0);
	mbp_dataset_free(&ds);

	srv s;
	ck_assert_msg(srv_start(&s, (const char *const[]){"--model", ma, "--model-repository", tmpdir,
							  "--stages", "2", NULL}) == 0,
		      "pipeserve did not start");
	/* Served: the classes pipetrain's evaluation gave. */
	for (unsigned first = 0; first < CHECK_ROWS; first += ROWS_PER_REQ) {
		int32_t cls[ROWS_PER_REQ];
		char why[256];
		ck_assert_msg(classify(s.port, first, cls, why, sizeof why) == 0, "%s", why);
		for (unsigned i = 0; i < ROWS_PER_REQ; i++)
			ck_assert_msg(cls[i] == pa[first + i],
				      "test image %u: served class %d, pipetrain's %d", first + i, cls[i],
				      pa[first + i]);
	}
	/* Reload the second checkpoint while two clients send requests. */
	enum { CLIENTS = 2 };
	_Atomic bool stop = false;
	client c[CLIENTS];
	pthread_t t[CLIENTS];
	for (unsigned i = 0; i < CLIENTS; i++) {
		c[i] = (client){.port = s.port, .pa = pa, .pb = pb, .stop = &stop};
		ck_assert_int_eq(pthread_create(&t[i], NULL, client_main, &c[i]), 0);
	}
	sleep_ms(200);
	const char *body = "{\"parameters\":{\"file\":\"m2.safetensors\"}}";
	http_resp lr;
	ck_assert_int_eq(
	    http_do(s.port, "POST", "/v2/repository/models/m/load", NULL, body, strlen(body), &lr), 0);
	ck_assert_msg(lr.status == 200, "load: status %d: %s", lr.status, lr.body);
	http_resp_free(&lr);
	sleep_ms(200);
	atomic_store(&stop, true);
	unsigned done = 0;
	for (unsigned i = 0; i < CLIENTS; i++) {
		pthread_join(t[i], NULL);
		ck_assert_msg(c[i].failed == 0, "client %u: %u failed: %s", i, c[i].failed, c[i].why);
		ck_assert_msg(c[i].neither == 0, "client %u: %u answers from neither model", i, c[i].neither);
		done += c[i].done;
	}
	ck_assert_uint_gt(done, CLIENTS);
	/* After the load: the second model's classes. */
	for (unsigned first = 0; first < CHECK_ROWS; first += ROWS_PER_REQ) {
		int32_t cls[ROWS_PER_REQ];
		char why[256];
		ck_assert_msg(classify(s.port, first, cls, why, sizeof why) == 0, "%s", why);
		for (unsigned i = 0; i < ROWS_PER_REQ; i++)
			ck_assert_msg(cls[i] == pb[first + i],
				      "after the load, image %u: class %d, model 2's %d", first + i, cls[i],
				      pb[first + i]);
	}
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	free(test_x);
	free(pa);
	free(pb);
	tmpdir_remove();
}
END_TEST

/* ---- the split (pt_partition), against every split and every choice of hand-overs ---- */

/* The slowest stage of the best split of L layers into S stages, over every boundary set and every choice
 * of hand-overs where can_give allows one; all: a hand-over wherever allowed; none: no hand-over. */
static double best_split(const double *cost, const double *cost_in, const bool *can_give, unsigned L,
			 unsigned S, int how)
{
	double best = INFINITY;
	for (unsigned mask = 0; mask < 1u << (L - 1); mask++) { /* bit i: a boundary after layer i */
		if ((unsigned)__builtin_popcount(mask) != S - 1)
			continue;
		unsigned bounds[16], nb = 0;
		for (unsigned i = 0; i + 1 < L; i++)
			if (mask >> i & 1)
				bounds[nb++] = i + 1;
		for (unsigned h = 0; h < 1u << nb; h++) { /* bit j: boundary j hands over */
			bool ok = true;
			for (unsigned j = 0; j < nb && ok; j++) {
				bool on = h >> j & 1, can = can_give[bounds[j] - 1];
				ok = how == 0 ? !on : how == 1 ? on == can : !on || can;
			}
			if (!ok)
				continue;
			double worst = 0;
			for (unsigned s = 0, a = 0; s < S; s++) {
				unsigned b = s + 1 < S ? bounds[s] : L;
				double c = 0;
				for (unsigned i = a; i < b; i++)
					c += cost[i];
				if (s > 0 && (h >> (s - 1) & 1))
					c += cost_in[a - 1];
				if (s + 1 < S && (h >> s & 1))
					c -= cost_in[b - 1];
				worst = c > worst ? c : worst;
				a = b;
			}
			best = worst < best ? worst : best;
		}
	}
	return best;
}

START_TEST(the_split_is_the_best_of_every_split_and_hand_over)
{
	uint64_t seed = 7;
	for (unsigned trial = 0; trial < 2000; trial++) {
		unsigned L = 2 + trial % 7, S = 2 + (trial / 7) % (L - 1);
		double cost[8], cost_in[8];
		bool can_give[8];
		for (unsigned i = 0; i < L; i++) {
			seed = seed * 6364136223846793005u + 1442695040888963407u;
			cost[i] = 1 + (double)(seed >> 40 & 1023);
			cost_in[i] = i ? cost[i] * (double)(seed >> 20 & 255) / 512 : 0;
			can_give[i] = i > 0 && (seed >> 8 & 3) != 0;
		}
		for (int mode = 0; mode < 3; mode++) {
			static const pt_hand_over modes[] = {PT_HAND_OVER_OFF, PT_HAND_OVER_ALL,
							     PT_HAND_OVER_AUTO};
			mbp_model_plan plan;
			bool gives[8];
			ck_assert_int_eq(
			    pt_partition(cost, cost_in, can_give, L, S, modes[mode], &plan, gives), 0);
			double none = best_split(cost, cost_in, can_give, L, S, 0);
			double want = mode == 0	  ? none
				      : mode == 1 ? best_split(cost, cost_in, can_give, L, S, 1)
						  : best_split(cost, cost_in, can_give, L, S, 2);
			if (mode == 2 && !(want < 0.98 * none))
				want = none;
			ck_assert_msg(fabs(plan.slowest_ns - want) <= 1e-9 * want,
				      "L %u S %u mode %d: %g, best %g", L, S, mode, plan.slowest_ns, want);
			/* the plan itself: contiguous stages, hand-overs only where allowed, its figures */
			ck_assert_uint_eq(plan.first[0], 0);
			ck_assert_uint_eq(plan.first[S], L);
			double worst = 0;
			for (unsigned s = 0; s < S; s++) {
				ck_assert_uint_lt(plan.first[s], plan.first[s + 1]);
				if (s + 1 < S && gives[s])
					ck_assert(mode != 0 && can_give[plan.first[s + 1] - 1]);
				if (mode == 1 && s + 1 < S)
					ck_assert(gives[s] == can_give[plan.first[s + 1] - 1]);
				worst = plan.stage_ns[s] > worst ? plan.stage_ns[s] : worst;
			}
			ck_assert(!gives[S - 1]);
			ck_assert(fabs(worst - plan.slowest_ns) <= 1e-9 * worst);
		}
	}
}
END_TEST

/* The split refined by the schedule's predicted step: never longer than the balanced split it starts
 * from, hand-overs only where allowed (ALL: at every boundary that allows one; OFF: none), the stages'
 * figures those of the result, and no split one move away (a boundary moved by a layer, a hand-over
 * changed) shorter by more than 0.5%. */
START_TEST(the_refined_split_is_never_slower_than_the_balanced_one_and_no_move_improves_it)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	static const pt_hand_over modes[] = {PT_HAND_OVER_OFF, PT_HAND_OVER_ALL, PT_HAND_OVER_AUTO};
	uint64_t seed = 11;
	unsigned moved = 0;
	for (unsigned trial = 0; trial < 600; trial++) {
		unsigned L = 2 + trial % 7, S = 2 + (trial / 7) % (L - 1 < 3 ? L - 1 : 3),
			 M = S * (1 + trial % 3);
		mt_costs pc = {.rows = 1};
		double cost[8], cost_in[8];
		bool can_give[8];
		for (unsigned i = 0; i < L; i++) {
			seed = seed * 6364136223846793005u + 1442695040888963407u;
			pc.f[i] = 1 + (double)(seed >> 40 & 255);
			pc.b_in[i] = i ? 1 + (double)(seed >> 30 & 511) : 0;
			pc.b_w[i] = 1 + (double)(seed >> 20 & 255);
			cost[i] = pc.f[i] + pc.b_in[i] + pc.b_w[i];
			cost_in[i] = pc.b_in[i];
			can_give[i] = i > 0 && (seed >> 8 & 3) != 0;
		}
		mbp_sched_kind kind = kinds[trial % 3];
		pt_hand_over mode = modes[(trial / 3) % 3];
		mbp_schedule *sc;
		ck_assert_int_eq(mbp_schedule_new(&sc, kind, S, M), 0);
		mbp_model_plan plan;
		bool gives[8];
		ck_assert_int_eq(pt_partition(cost, cost_in, can_give, L, S, mode, &plan, gives), 0);
		unsigned before_first[9];
		memcpy(before_first, plan.first, sizeof before_first);
		double before = pt_predict(&pc, plan.first, gives, S, S, sc);
		double after = pt_refine(&pc, can_give, L, S, S, mode, sc, &plan, gives);
		moved += memcmp(before_first, plan.first, (S + 1) * sizeof(unsigned)) != 0;
		ck_assert_msg(after <= before, "trial %u: %g after, %g before", trial, after, before);
		ck_assert(after == pt_predict(&pc, plan.first, gives, S, S, sc));
		ck_assert_uint_eq(plan.first[0], 0);
		ck_assert_uint_eq(plan.first[S], L);
		double worst = 0;
		for (unsigned st = 0; st < S; st++) {
			ck_assert_uint_lt(plan.first[st], plan.first[st + 1]);
			bool can = st + 1 < S && can_give[plan.first[st + 1] - 1];
			ck_assert(!gives[st] || (mode != PT_HAND_OVER_OFF && can));
			if (mode == PT_HAND_OVER_ALL)
				ck_assert(gives[st] == can);
			worst = plan.stage_ns[st] > worst ? plan.stage_ns[st] : worst;
		}
		ck_assert(worst == plan.slowest_ns);
		/* one move away: each boundary one layer either way, each hand-over either way, as allowed */
		for (unsigned b = 1; b < S; b++)
			for (int d = -1; d <= 1; d++)
				for (int g = 0; g < 2; g++) {
					unsigned f[9];
					bool gv[8];
					memcpy(f, plan.first, sizeof f);
					memcpy(gv, gives, sizeof gv);
					f[b] = (unsigned)((int)f[b] + d);
					gv[b - 1] = g;
					bool can = f[b] >= 2 && can_give[f[b] - 1];
					if (f[b] <= f[b - 1] || f[b] >= f[b + 1] ||
					    (g && (!can || mode == PT_HAND_OVER_OFF)) ||
					    (mode == PT_HAND_OVER_ALL && g != can))
						continue;
					double t = pt_predict(&pc, f, gv, S, S, sc);
					ck_assert_msg(!(t < 0.995 * after),
						      "trial %u: a move gives %g, the refined %g", trial, t,
						      after);
				}
		mbp_schedule_destroy(sc);
	}
	ck_assert_msg(moved > 0, "no split was ever moved from the balanced one");
}
END_TEST

/* --mb auto: the run profiles every power of two from 16 to the batch, says which it took and what each
 * predicts, and trains at that size (the JSON's config says so). */
START_TEST(mb_auto_takes_the_size_whose_predicted_step_is_shortest_and_says_so)
{
	if (!have_data())
		return;
	struct run r = run((const char *const[]){"--layers", "784,48,24,10", "--limit", "512", "--batch",
						 "64", "--val", "100", "--epochs", "1", "--stages", "2",
						 "--mb", "auto", "--json", NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_ptr_nonnull(root);
	const cJSON *cfg = cJSON_GetObjectItem(root, "config");
	int mb = cJSON_GetObjectItem(cfg, "mb")->valueint;
	ck_assert_msg(mb == 16 || mb == 32 || mb == 64, "mb %d", mb);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "mb_auto")));
	ck_assert_int_eq(cJSON_GetObjectItem(cfg, "mbs")->valueint, 64 / mb);
	ck_assert(cJSON_GetObjectItem(root, "predicted_step_ms")->valuedouble > 0);
	char want[64];
	snprintf(want, sizeof want, "micro-batch: %d rows (--mb auto)", mb);
	ck_assert_msg(strstr(r.err, want) && strstr(r.err, " 16 rows ") && strstr(r.err, " 64 rows "), "%s",
		      r.err);
	cJSON_Delete(root);
	run_free(&r);
}
END_TEST

/* --mb auto under a chunked schedule predicts each size with that schedule as placed: DualPipeV on 4
 * chunks needs 4 micro-batches, so of 16, 32 and 64 rows in a batch of 64 only 16 is tried and taken; a
 * batch with no size it can place is refused as usage, and so is --mb auto with a schedule file (the
 * file fixes the micro-batches). */
START_TEST(mb_auto_under_a_chunked_schedule_tries_only_the_sizes_it_can_place)
{
	if (!have_data())
		return;
	struct run r = run((const char *const[]){
	    "--layers",	  "784,48,32,24,10", "--limit", "512",	    "--batch",	   "64",	"--val",
	    "100",	  "--epochs",	     "1",	"--stages", "4",	   "--threads", "2",
	    "--schedule", "dualpipev",	     "--mb",	"auto",	    "--recompute", "all",	"--json",
	    NULL});
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	cJSON *root = cJSON_Parse(r.out);
	ck_assert_ptr_nonnull(root);
	const cJSON *cfg = cJSON_GetObjectItem(root, "config");
	ck_assert_int_eq(cJSON_GetObjectItem(cfg, "mb")->valueint, 16);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "mb_auto")));
	ck_assert(cJSON_GetObjectItem(root, "predicted_step_ms")->valuedouble > 0);
	ck_assert_msg(strstr(r.err, "micro-batch: 16 rows (--mb auto)") && !strstr(r.err, " 32 rows "), "%s",
		      r.err);
	cJSON_Delete(root);
	run_free(&r);
	r = run((const char *const[]){"--layers", "784,48,32,24,10", "--limit", "512", "--batch", "32",
				      "--stages", "4", "--threads", "2", "--schedule", "dualpipev", "--mb",
				      "auto", NULL});
	assert_refused(&r, "--schedule dualpipev", "cannot place");
	run_free(&r);
	r = run((const char *const[]){"--layers", "784,48,10", "--schedule-file", "/nonexistent.csv", "--mb",
				      "auto", NULL});
	assert_refused(&r, "--mb auto", "fixes the micro-batches");
	run_free(&r);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("pipetrain");
	TCase *tc = tcase_create("cli");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, every_bad_argument_gets_one_line_and_exit_2, 0,
			    (int)(sizeof bad_args / sizeof bad_args[0]));
	tcase_add_test(tc, a_model_file_that_is_not_one_is_refused_with_exit_2);
	tcase_add_test(tc, every_output_that_is_not_a_regular_file_is_refused_at_start_and_left_as_it_was);
	tcase_add_test(tc, a_checkpoint_with_eight_bytes_overwritten_is_refused_naming_the_file);
	tcase_add_test(tc, the_split_is_the_best_of_every_split_and_hand_over);
	tcase_add_test(tc, the_refined_split_is_never_slower_than_the_balanced_one_and_no_move_improves_it);
	tcase_add_test(tc, mb_auto_takes_the_size_whose_predicted_step_is_shortest_and_says_so);
	tcase_add_test(tc, mb_auto_under_a_chunked_schedule_tries_only_the_sizes_it_can_place);
	tcase_add_test(tc, a_small_run_lowers_the_loss_and_its_json_parses);
	tcase_add_test(tc, recomputation_lowers_the_peak_activation_memory_and_shows_in_the_trace);
	tcase_add_test(tc, split_runs_the_stages_as_given);
	tcase_add_test(tc, plan_only_prints_the_plan_and_its_json_parses_and_trains_nothing);
	tcase_add_test(tc, a_budget_no_plan_fits_is_refused_with_exit_2_and_the_smallest_budget_that_fits);
	tcase_add_test(tc, the_plans_state_counts_the_packed_weight_copy_the_model_allocates);
	tcase_add_test(tc,
		       a_planned_run_trains_within_its_budget_and_prints_the_measured_beside_the_predicted);
	tcase_add_test(tc, plan_points_are_predicted_from_the_plans_profile_as_the_planner_counts_them);
	tcase_add_test(tc, the_threads_are_pinned_by_default_and_the_summary_says_how);
	tcase_add_test(tc, every_operation_has_its_own_name_in_messages);
	tcase_add_test(tc, the_progress_bar_goes_to_stderr_at_most_ten_times_a_second);
	tcase_add_test(tc, every_schedule_and_stage_count_writes_the_same_weights);
	tcase_add_test(tc, every_chunked_schedule_writes_the_weights_of_one_stage);
	tcase_add_test(tc, the_summary_shows_each_stages_and_each_threads_hops_as_the_json_has_them);
	tcase_add_test(tc, a_chunked_schedule_that_cannot_place_the_stages_is_refused_as_usage);
	tcase_add_test(tc, a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one);
	tcase_add_test(tc, replicated_stages_write_the_weights_of_unreplicated_ones_byte_for_byte);
	tcase_add_test(tc, a_rebalancing_run_moves_between_steps_and_writes_the_weights_of_one_without_it);
	tcase_add_test(tc, steady_costs_never_move_and_costs_that_change_once_move_once);
	tcase_add_test(tc, more_epochs_on_resume_are_announced_as_a_new_schedule);
	tcase_add_test(tc, a_checkpoint_pair_from_different_steps_is_refused_with_exit_2);
	tcase_add_test(tc, a_nan_loss_stops_naming_step_and_stage_and_keeps_the_last_checkpoint);
	tcase_add_test(tc, sigint_finishes_the_step_writes_a_checkpoint_and_exits_130);
	tcase_add_test(tc, a_batch_that_is_not_a_multiple_is_announced_as_the_trainer_cuts_it);
	tcase_add_test(tc, the_summary_after_a_resume_counts_the_checkpoints_epochs_and_this_runs);
	tcase_add_test(tc, weights_without_an_optimizer_state_start_a_fresh_optimizer_in_one_note);
	tcase_add_test(tc, a_generic_openblas_kernel_is_warned_about_as_by_the_other_tools);
	tcase_add_test(tc, the_summary_names_the_dense_kernel_and_an_unknown_mbp_kernel_is_warned_about);
	tcase_add_test(tc, the_progress_line_shows_the_time_left);
	tcase_add_test(tc, the_step_log_has_a_header_and_a_row_per_step_rising_by_one);
	tcase_add_test(tc, the_plot_is_an_svg_document_with_a_polyline_per_curve_inside_its_panel);
	tcase_add_test(tc, a_long_run_keeps_the_step_curve_to_its_bound);
	suite_add_tcase(s, tc);
	TCase *e2e = tcase_create("end to end");
	tcase_set_timeout(e2e, 120);
	tcase_add_test(e2e, a_trained_model_serves_its_own_predictions_and_reloads_live);
	suite_add_tcase(s, e2e);
	return s;
}

#include "check_main.h"

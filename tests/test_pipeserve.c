/*
 * pipeserve end to end: each test starts the built server on a loopback port it picks (--port 0) and
 * talks to it over real sockets. Expected outputs come from the library itself: the test loads the same
 * model file and runs mbp_model_forward(), which with equal micro-batches is bit for bit the pipeline's
 * output. Where concurrent requests share micro-batches, rows are compared with a tolerance (a row's
 * floating-point sum order may depend on the micro-batch's size).
 */
#include "config.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include <mbpipe.h>

#include "check_main.h" /* early: the stress counts use its mbp_iters() */
#include "model_file.h"
#include "test_pipeserve_client.h"
#include "tool_run.h"

#define IN_W  32
#define OUT_W 8

static char model_a[512], model_b[512], model_other[512], tmp_dir[256];

/* Small model files: a (seed 1), b (seed 2, same structure), other (a different structure). */
static void make_models(void)
{
	const char *t = getenv("TMPDIR");
	snprintf(tmp_dir, sizeof tmp_dir, "%s/test_pipeserve-XXXXXX", t && *t ? t : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
	mbp_model_spec ms = {
	    .layers = 4, .in = IN_W, .hidden = 64, .out = OUT_W, .act = MBP_ACT_RELU, .seed = 1};
	snprintf(model_a, sizeof model_a, "%s/a.safetensors", tmp_dir);
	snprintf(model_b, sizeof model_b, "%s/b.safetensors", tmp_dir);
	snprintf(model_other, sizeof model_other, "%s/other.safetensors", tmp_dir);
	ck_assert_int_eq(mbp_model_write_random(model_a, &ms), 0);
	ms.seed = 2;
	ck_assert_int_eq(mbp_model_write_random(model_b, &ms), 0);
	ms.hidden = 48;
	ck_assert_int_eq(mbp_model_write_random(model_other, &ms), 0);
}

static void remove_models(void)
{
	unlink(model_a);
	unlink(model_b);
	unlink(model_other);
	rmdir(tmp_dir);
}

static mbp_model *load(const char *path)
{
	mbp_model *m = NULL;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load(&m, path, &e) == 0, "%s", e.msg);
	return m;
}

/* Start the server on model a (name "a") with extra flags. */
static void start(srv *s, const char *const *extra)
{
	const char *args[48] = {"--model", model_a, "--stages", "2", "--threads", "2"};
	int n = 6;
	for (int i = 0; extra && extra[i]; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	ck_assert_msg(srv_start(s, args) == 0, "server did not start");
}

/* Input rows whose values depend on (tag, row, column), all distinct-ish, in [-1, 1]. */
static void fill_rows(float *x, size_t rows, unsigned tag)
{
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < IN_W; c++)
			x[r * IN_W + c] = (float)sin((double)tag * 0.37 + (double)r * 1.3 + (double)c * 0.11);
}

/* An infer request body: JSON data flat or nested, or the binary extension (then *json_len is set). */
static char *infer_body(const char *id, const float *x, size_t rows, bool nested, bool binary_in,
			bool binary_out, size_t *len, size_t *json_len)
{
	size_t cap = 512 + rows * IN_W * 20;
	char *b = malloc(cap + rows * IN_W * sizeof(float));
	ck_assert_ptr_nonnull(b);
	size_t n = 0;
	n += (size_t)snprintf(b + n, cap - n, "{");
	if (id)
		n += (size_t)snprintf(b + n, cap - n, "\"id\":\"%s\",", id);
	n += (size_t)snprintf(b + n, cap - n,
			      "\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[%zu,%d]",
			      rows, IN_W);
	if (binary_in) {
		n += (size_t)snprintf(b + n, cap - n, ",\"parameters\":{\"binary_data_size\":%zu}}]",
				      rows * IN_W * sizeof(float));
	} else {
		n += (size_t)snprintf(b + n, cap - n, ",\"data\":[");
		for (size_t r = 0; r < rows; r++) {
			if (nested)
				n += (size_t)snprintf(b + n, cap - n, "%s[", r ? "," : "");
			for (size_t c = 0; c < IN_W; c++)
				n +=
				    (size_t)snprintf(b + n, cap - n, "%s%.9g", (r && !nested) || c ? "," : "",
						     (double)x[r * IN_W + c]);
			if (nested)
				n += (size_t)snprintf(b + n, cap - n, "]");
		}
		n += (size_t)snprintf(b + n, cap - n, "]}]");
	}
	if (binary_out)
		n += (size_t)snprintf(
		    b + n, cap - n,
		    ",\"outputs\":[{\"name\":\"output\",\"parameters\":{\"binary_data\":true}}]");
	n += (size_t)snprintf(b + n, cap - n, "}");
	if (json_len)
		*json_len = n;
	if (binary_in) {
		memcpy(b + n, x, rows * IN_W * sizeof(float));
		n += rows * IN_W * sizeof(float);
	}
	*len = n;
	return b;
}

/* POST an infer request of `rows` rows on connection fd (or a fresh one when fd < 0). */
static int post_infer(int port, int fd, const char *model, const char *body, size_t len, long long json_len,
		      http_resp *r)
{
	char path[256], extra[128] = "";
	snprintf(path, sizeof path, "/v2/models/%s/infer", model);
	if (json_len >= 0)
		snprintf(extra, sizeof extra, "Inference-Header-Content-Length: %lld\r\n", json_len);
	return fd < 0 ? http_do(port, "POST", path, extra, body, len, r)
		      : http_send(fd, "POST", path, extra, body, len, r);
}

/* Decode a 200 infer response into out (rows x OUT_W); checks shape, datatype and the echoed id. */
static void decode_output(const http_resp *r, const char *id, size_t rows, float *out)
{
	ck_assert_msg(r->status == 200, "status %d: %s", r->status, r->body ? r->body : "");
	char hl[32];
	size_t json_len = http_header(r, "Inference-Header-Content-Length", hl, sizeof hl)
			      ? strtoull(hl, NULL, 10)
			      : r->len;
	cJSON *root = cJSON_ParseWithLength(r->body, json_len);
	ck_assert_ptr_nonnull(root);
	ck_assert_str_eq(cJSON_GetObjectItem(root, "model_name")->valuestring, "a");
	const cJSON *rid = cJSON_GetObjectItem(root, "id");
	if (id)
		ck_assert_msg(cJSON_IsString(rid) && strcmp(rid->valuestring, id) == 0, "id not echoed");
	else
		ck_assert_ptr_null(rid);
	const cJSON *o = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "outputs"), 0);
	ck_assert_ptr_nonnull(o);
	ck_assert_str_eq(cJSON_GetObjectItem(o, "name")->valuestring, "output");
	ck_assert_str_eq(cJSON_GetObjectItem(o, "datatype")->valuestring, "FP32");
	const cJSON *sh = cJSON_GetObjectItem(o, "shape");
	ck_assert_int_eq(cJSON_GetArrayItem(sh, 0)->valueint, (int)rows);
	ck_assert_int_eq(cJSON_GetArrayItem(sh, 1)->valueint, OUT_W);
	const cJSON *data = cJSON_GetObjectItem(o, "data");
	if (data) {
		ck_assert_int_eq(cJSON_GetArraySize(data), (int)(rows * OUT_W));
		size_t i = 0;
		const cJSON *e;
		cJSON_ArrayForEach(e, data)
		{
			ck_assert(cJSON_IsNumber(e));
			out[i++] = (float)e->valuedouble;
		}
	} else {
		const cJSON *bs =
		    cJSON_GetObjectItem(cJSON_GetObjectItem(o, "parameters"), "binary_data_size");
		ck_assert_ptr_nonnull(bs);
		ck_assert_int_eq(bs->valueint, (int)(rows * OUT_W * sizeof(float)));
		ck_assert_uint_eq(r->len, json_len + rows * OUT_W * sizeof(float));
		memcpy(out, r->body + json_len, rows * OUT_W * sizeof(float));
	}
	cJSON_Delete(root);
}

static bool close_enough(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!(fabsf(a[i] - b[i]) <= 1e-4f * (1.0f + fabsf(b[i]))))
			return false;
	return true;
}

/* ---- endpoints ---- */

static void expect_status(int port, const char *method, const char *path, int status, const char *body_has)
{
	http_resp r;
	ck_assert_int_eq(http_do(port, method, path, NULL, NULL, 0, &r), 0);
	ck_assert_msg(r.status == status, "%s %s: status %d, expected %d (%s)", method, path, r.status,
		      status, r.body);
	if (body_has)
		ck_assert_msg(strstr(r.body, body_has), "%s %s: body lacks %s: %s", method, path, body_has,
			      r.body);
	http_resp_free(&r);
}

/* GET /metrics holds every one of names[0..n) and, unless NULL, not `absent`. */
static void expect_metrics(int port, const char *const *names, size_t n, const char *absent)
{
	http_resp r;
	ck_assert_int_eq(http_do(port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
	ck_assert_int_eq(r.status, 200);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(strstr(r.body, names[i]), "metrics lack %s", names[i]);
	if (absent)
		ck_assert_msg(!strstr(r.body, absent), "metrics hold %s", absent);
	http_resp_free(&r);
}

START_TEST(every_endpoint_answers_per_the_protocol)
{
	make_models();
	srv s;
	start(&s, NULL);
	expect_status(s.port, "GET", "/v2", 200, "\"extensions\":[\"binary_tensor_data\"");
	expect_status(s.port, "GET", "/v2/health/live", 200, NULL);
	expect_status(s.port, "GET", "/v2/health/ready", 200, NULL);
	expect_status(s.port, "GET", "/v2/models/a", 200,
		      "\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\","
		      "\"shape\":[-1,32]}]");
	expect_status(s.port, "GET", "/v2/models/a", 200,
		      "\"outputs\":[{\"name\":\"output\",\"datatype\":\"FP32\","
		      "\"shape\":[-1,8]}]");
	expect_status(s.port, "GET", "/v2/models/a/versions/1", 200, "\"versions\":[\"1\"]");
	expect_status(s.port, "GET", "/v2/models/a/ready", 200, NULL);
	expect_status(s.port, "GET", "/v2/models/a/versions/1/ready", 200, NULL);
	expect_status(s.port, "GET", "/v2/models/b", 404, "{\"error\":");
	expect_status(s.port, "GET", "/v2/models/b/ready", 404, "{\"error\":");
	expect_status(s.port, "GET", "/v2/models/a/versions/2", 404, "{\"error\":");
	expect_status(s.port, "GET", "/v2/nothing", 404, "{\"error\":");
	expect_status(s.port, "GET", "/", 404, "{\"error\":");
	expect_status(s.port, "POST", "/v2/health/live", 405, "{\"error\":");
	expect_status(s.port, "GET", "/v2/models/a/infer", 405, "{\"error\":");
	expect_status(s.port, "POST", "/v2/repository/index", 200, "\"state\":\"READY\"");

	/* The health answers have empty bodies, as the protocol asks. */
	http_resp r;
	ck_assert_int_eq(http_do(s.port, "GET", "/v2/health/ready", NULL, NULL, 0, &r), 0);
	ck_assert_uint_eq(r.len, 0);
	http_resp_free(&r);

	/* One infer, then the metrics count it and show the engine's side. */
	float x[3 * IN_W], y[3 * OUT_W];
	fill_rows(x, 3, 1);
	size_t len;
	char *body = infer_body("first", x, 3, false, false, false, &len, NULL);
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	decode_output(&r, "first", 3, y);
	http_resp_free(&r);
	free(body);
	static const char *const names[] = {
	    "pipeserve_request_success_total{model=\"a\"} 1\n",
	    "pipeserve_request_failure_total{model=\"a\",code=\"429\"} 0\n",
	    "pipeserve_request_duration_seconds_bucket{model=\"a\",le=\"+Inf\"} 1\n",
	    "pipeserve_queue_duration_seconds_count{model=\"a\"} 1\n",
	    "pipeserve_compute_duration_seconds_count{model=\"a\"} 1\n",
	    "pipeserve_batch_rows_sum{model=\"a\"} 3\n",
	    "pipeserve_queue_rows{model=\"a\"} 0\n",
	    "mbpipe_stage_busy_seconds_total{model=\"a\",stage=\"1\"",
	    "mbpipe_stage_starved_seconds_total{model=\"a\",stage=\"0\"",
	    "mbpipe_stage_blocked_seconds_total{model=\"a\",stage=\"0\"",
	    "mbpipe_stage_parked_seconds_total{model=\"a\",stage=\"1\"",
	    "mbpipe_stage_replicas{model=\"a\",stage=\"1\"} 1\n",
	    "mbpipe_stage_active_replicas{model=\"a\",stage=\"1\"} 1\n",
	    "mbpipe_bubble_fraction{model=\"a\"} ",
	    "mbpipe_pool_buffers_in_use{model=\"a\"} ",
	};
	expect_metrics(s.port, names, sizeof names / sizeof names[0], "mbpipe_rebalance"); /* off */
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* The value of the /metrics line that starts with `line` (its name and labels, then a space). */
static double metric_value(int port, const char *line)
{
	http_resp r;
	ck_assert_int_eq(http_do(port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
	ck_assert_int_eq(r.status, 200);
	const char *at = strstr(r.body, line);
	ck_assert_msg(at && (at == r.body || at[-1] == '\n'), "metrics lack %s", line);
	char *end;
	double v = strtod(at + strlen(line), &end);
	ck_assert_msg(end != at + strlen(line) && *end == '\n', "%s: no number", line);
	http_resp_free(&r);
	return v;
}

/* Each stage's active replicas in /metrics, the plan's (mbpipe_rebalance_) and the engine's
 * (mbpipe_stage_), which agree; and its threads. want 0: any count the moves may have set (1 while
 * none changed the replicas). */
static void expect_active_replicas(int port, unsigned want, unsigned threads)
{
	char line[128];
	double replica_moves = metric_value(port, "mbpipe_rebalance_replica_moves_total{model=\"a\"} ");
	for (unsigned s = 0; s < 2; s++) {
		snprintf(line, sizeof line,
			 "mbpipe_rebalance_stage_active_replicas{model=\"a\",stage=\"%u\"} ", s);
		double plan = metric_value(port, line);
		snprintf(line, sizeof line, "mbpipe_stage_active_replicas{model=\"a\",stage=\"%u\"} ", s);
		double engine = metric_value(port, line);
		snprintf(line, sizeof line, "mbpipe_stage_replicas{model=\"a\",stage=\"%u\"} ", s);
		ck_assert_msg(metric_value(port, line) == threads, "stage %u: not %u threads", s, threads);
		ck_assert_msg(plan == engine, "stage %u: the plan's %g active replicas, the engine's %g", s,
			      plan, engine);
		if (want || replica_moves == 0)
			ck_assert_msg(plan == (want ? want : 1), "stage %u: %g active replicas, not %u", s,
				      plan, want ? want : 1);
		else
			ck_assert(plan >= 1 && plan <= threads);
	}
}

/* --rebalance: the same bits as mbp_model_forward (a move never changes them), and /metrics counts the
 * moves and shows the plan in use; _i 1: with --replicas 2 too (a move keeps the replicas); _i 2: with
 * --rebalance-replicas 3, each stage on 3 threads, one active at start. */
START_TEST(rebalance_serves_the_same_bits_and_shows_its_plan_in_metrics)
{
	make_models();
	srv s;
	if (_i == 2)
		start(&s, (const char *const[]){"--rebalance", "--rebalance-replicas", "3",
						"--max-batch-rows", "8", NULL});
	else if (_i)
		start(&s,
		      (const char *const[]){"--rebalance", "--replicas", "2", "--max-batch-rows", "8", NULL});
	else
		start(&s, (const char *const[]){"--rebalance", "--max-batch-rows", "8", NULL});
	if (_i == 2) { /* before any request (no look, no move): the plan's one active of 3 threads each,
			* the others parked (the stages attached to the batcher's pipeline) */
		const char *const start_names[] = {
		    "mbpipe_rebalance_stage_active_replicas{model=\"a\",stage=\"0\"} 1\n",
		    "mbpipe_rebalance_stage_active_replicas{model=\"a\",stage=\"1\"} 1\n",
		    "mbpipe_rebalance_replica_moves_total{model=\"a\"} 0\n",
		};
		expect_metrics(s.port, start_names, sizeof start_names / sizeof start_names[0], NULL);
		expect_active_replicas(s.port, 1, 3);
	}
	mbp_model *m = load(model_a);
	enum { ROWS = 21 };
	float x[ROWS * IN_W], want[ROWS * OUT_W], got[ROWS * OUT_W];
	fill_rows(x, ROWS, 7);
	ck_assert_int_eq(mbp_model_forward(m, x, want, ROWS, 8), 0);
	for (int k = 0; k < 40; k++) { /* enough micro-batches for a look or two */
		size_t len;
		char *body = infer_body("r", x, ROWS, false, false, false, &len, NULL);
		http_resp r;
		ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
		decode_output(&r, "r", ROWS, got);
		ck_assert_msg(memcmp(got, want, sizeof want) == 0,
			      "request %d differs from mbp_model_forward", k);
		http_resp_free(&r);
		free(body);
	}
	const char *const names[] = {
	    "# TYPE mbpipe_rebalance_moves_total counter\n",
	    "mbpipe_rebalance_moves_total{model=\"a\"} ",
	    "mbpipe_rebalance_plan{model=\"a\"} ",
	    "mbpipe_rebalance_stage_first_layer{model=\"a\",stage=\"0\"} 0\n",
	    "mbpipe_rebalance_stage_first_layer{model=\"a\",stage=\"1\"} ",
	    "mbpipe_rebalance_replica_moves_total{model=\"a\"} ",
	    /* 1, --replicas 2, or --rebalance-replicas: 1 at start and after moves that the equal costs
	     * of the small model do not make (a third thread a stage would only share the CPUs) */
	    _i == 1 ? "mbpipe_rebalance_stage_active_replicas{model=\"a\",stage=\"0\"} 2\n"
		    : "mbpipe_rebalance_stage_active_replicas{model=\"a\",stage=\"0\"} ",
	};
	expect_metrics(s.port, names, sizeof names / sizeof names[0], NULL);
	/* after the moves: what the plan says is what the engine was set to, on the threads made */
	expect_active_replicas(s.port, _i == 2 ? 0 : _i ? 2 : 1, _i == 2 ? 3 : _i ? 2 : 1);
	mbp_model_destroy(m);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* ---- results ---- */

START_TEST(infer_equals_the_library_output_in_every_encoding)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--max-batch-rows", "8", "--max-queue-delay-us", "0", NULL});
	mbp_model *m = load(model_a);
	enum { ROWS = 21 };
	float x[ROWS * IN_W], want[ROWS * OUT_W], got[ROWS * OUT_W];
	fill_rows(x, ROWS, 7);
	/* One request alone is cut into micro-batches of 8, 8, 5: the same as forward with mb_rows 8. */
	ck_assert_int_eq(mbp_model_forward(m, x, want, ROWS, 8), 0);
	int fd = http_connect(s.port);
	ck_assert_int_ge(fd, 0);
	for (int mode = 0; mode < 5; mode++) {
		bool nested = mode == 1, bin_in = mode >= 2, bin_out = mode >= 3;
		const char *id = mode == 4 ? NULL : "req-\"quoted\"-id";
		size_t len, json_len;
		char *body = infer_body(id ? "req-\\\"quoted\\\"-id" : NULL, x, ROWS, nested, bin_in, bin_out,
					&len, &json_len);
		http_resp r;
		ck_assert_int_eq(
		    post_infer(s.port, fd, "a", body, len, bin_in ? (long long)json_len : -1, &r), 0);
		memset(got, 0, sizeof got);
		decode_output(&r, id, ROWS, got);
		ck_assert_msg(memcmp(got, want, sizeof want) == 0,
			      "mode %d: output differs from mbp_model_forward", mode);
		http_resp_free(&r);
		free(body);
	}
	close(fd);
	/* The versioned path serves the same model. */
	size_t len;
	char *body = infer_body("v", x, 1, false, false, false, &len, NULL);
	http_resp r;
	ck_assert_int_eq(http_do(s.port, "POST", "/v2/models/a/versions/1/infer", NULL, body, len, &r), 0);
	decode_output(&r, "v", 1, got);
	ck_assert(close_enough(got, want, OUT_W));
	http_resp_free(&r);
	free(body);
	mbp_model_destroy(m);
	ck_assert_int_eq(srv_stop(&s, SIGINT), 0);
	remove_models();
}
END_TEST

/* Replicated stages serve the library's bits, in order: two replicas of each stage, and auto. */
START_TEST(replicated_stages_answer_with_the_library_output)
{
	make_models();
	mbp_model *m = load(model_a);
	enum { ROWS = 21 };
	float x[ROWS * IN_W], want[ROWS * OUT_W], got[ROWS * OUT_W];
	fill_rows(x, ROWS, 9);
	ck_assert_int_eq(mbp_model_forward(m, x, want, ROWS, 8), 0);
	static const char *const reps[] = {"2", "auto"};
	for (int k = 0; k < 2; k++) {
		srv s;
		start(&s, (const char *const[]){"--replicas", reps[k], "--max-batch-rows", "8",
						"--max-queue-delay-us", "0", NULL});
		for (int i = 0; i < 3; i++) {
			size_t len;
			char *body = infer_body("r", x, ROWS, false, false, false, &len, NULL);
			http_resp r;
			ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
			memset(got, 0, sizeof got);
			decode_output(&r, "r", ROWS, got);
			ck_assert_msg(memcmp(got, want, sizeof want) == 0, "--replicas %s: output differs",
				      reps[k]);
			http_resp_free(&r);
			free(body);
		}
		ck_assert_int_eq(srv_stop(&s, SIGINT), 0);
	}
	mbp_model_destroy(m);
	remove_models();
}
END_TEST

/* ---- bad input ---- */

typedef struct bad_case {
	const char *what;
	const char *path;
	const char *header; /* extra header lines */
	const char *body;
	int status;
	const char *tail; /* binary bytes after a JSON body: Inference-Header-Content-Length is added */
} bad_case;

#define INPUT_OK "{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"data\":[" ZEROS32 "]}"
#define ZEROS8	 "0,0,0,0,0,0,0,0"
#define ZEROS32	 ZEROS8 "," ZEROS8 "," ZEROS8 "," ZEROS8

static const bad_case bad_cases[] = {
    {"malformed JSON", "/v2/models/a/infer", NULL, "{\"inputs\": [", 400, NULL},
    {"not JSON at all", "/v2/models/a/infer", NULL, "\x01\x02garbage", 400, NULL},
    {"empty body", "/v2/models/a/infer", NULL, "", 400, NULL},
    {"top level not an object", "/v2/models/a/infer", NULL, "[1,2,3]", 400, NULL},
    {"no inputs", "/v2/models/a/infer", NULL, "{\"id\":\"x\"}", 400, NULL},
    {"inputs not an array", "/v2/models/a/infer", NULL, "{\"inputs\":{}}", 400, NULL},
    {"empty inputs", "/v2/models/a/infer", NULL, "{\"inputs\":[]}", 400, NULL},
    {"unknown input", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1,32],\"data\":[" ZEROS32 "]}]}", 400,
     NULL},
    {"input twice", "/v2/models/a/infer", NULL, "{\"inputs\":[" INPUT_OK "," INPUT_OK "]}", 400, NULL},
    {"wrong datatype", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"INT32\",\"shape\":[1,32],\"data\":[" ZEROS32 "]}]}",
     400, NULL},
    {"datatype not a string", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":5,\"shape\":[1,32],\"data\":[" ZEROS32 "]}]}", 400, NULL},
    {"wrong width", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[4,8],\"data\":[" ZEROS32 "]}]}", 400,
     NULL},
    {"wrong rank", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[32],\"data\":[" ZEROS32 "]}]}", 400,
     NULL},
    {"negative dimension", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[-1,32],\"data\":[" ZEROS32 "]}]}",
     400, NULL},
    {"fractional dimension", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1.5,32],\"data\":[" ZEROS32 "]}]}",
     400, NULL},
    {"zero rows", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[0,32],\"data\":[]}]}", 400, NULL},
    {"too few elements", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[2,32],\"data\":[" ZEROS32 "]}]}", 400,
     NULL},
    {"too many elements", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"data\":[" ZEROS32 ",1]}]}",
     400, NULL},
    {"non-numeric element", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"data\":[\"a\"," ZEROS8
     "," ZEROS8 "," ZEROS8 ",0,0,0,0,0,0,0]}]}",
     400, NULL},
    {"boolean element", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"data\":[true," ZEROS8
     "," ZEROS8 "," ZEROS8 ",0,0,0,0,0,0,0]}]}",
     400, NULL},
    {"element beyond FP32", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"data\":[1e39," ZEROS8
     "," ZEROS8 "," ZEROS8 ",0,0,0,0,0,0,0]}]}",
     400, NULL},
    {"nesting does not match the shape", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[2,16],\"data\":[[" ZEROS8 "," ZEROS8
     "],[" ZEROS8 "," ZEROS8 "]]}]}",
     400, NULL},
    {"data not an array", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"data\":3}]}", 400, NULL},
    {"no data", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32]}]}", 400, NULL},
    {"id not a string", "/v2/models/a/infer", NULL, "{\"id\":5,\"inputs\":[" INPUT_OK "]}", 400, NULL},
    {"unknown output", "/v2/models/a/infer", NULL,
     "{\"inputs\":[" INPUT_OK "],\"outputs\":[{\"name\":\"y\"}]}", 400, NULL},
    {"binary size without the header", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"parameters\":{\"binary_data_"
     "size\":"
     "128}}]}",
     400, NULL},
    {"binary size not matching the shape", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"parameters\":{\"binary_data_"
     "size\":"
     "4}}]}",
     400, "abcd"},
    {"binary data shorter than its size", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,32],\"parameters\":{\"binary_data_"
     "size\":"
     "128}}]}",
     400, "abcd"},
    {"binary data longer than its size", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,1],\"parameters\":{\"binary_data_"
     "size\":"
     "4}}]}",
     400, "abcdefgh"},
    {"binary size and data both", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,1],\"data\":[1],"
     "\"parameters\":{\"binary_data_size\":4}}]}",
     400, "abcd"},
    {"header length beyond the body", "/v2/models/a/infer", "Inference-Header-Content-Length: 99999\r\n",
     "{\"inputs\":[" INPUT_OK "]}", 400, NULL},
    {"header length not a number", "/v2/models/a/infer", "Inference-Header-Content-Length: 12x\r\n",
     "{\"inputs\":[" INPUT_OK "]}", 400, NULL},
    {"unknown model", "/v2/models/zzz/infer", NULL, "{\"inputs\":[" INPUT_OK "]}", 404, NULL},
    {"unknown version", "/v2/models/a/versions/7/infer", NULL, "{\"inputs\":[" INPUT_OK "]}", 404, NULL},
    {"more rows than the queue holds", "/v2/models/a/infer", NULL,
     "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[100000,32],\"data\":[]}]}", 413,
     NULL},
    {"load of an unknown model", "/v2/repository/models/zzz/load", NULL, "{}", 404, NULL},
    {"load with a malformed body", "/v2/repository/models/a/load", NULL, "{\"parameters\":", 400, NULL},
    {"load given a path", "/v2/repository/models/a/load", NULL,
     "{\"parameters\":{\"path\":\"/nonexistent/x.safetensors\"}}", 400, NULL},
    {"load of a name outside the repository", "/v2/repository/models/a/load", NULL,
     "{\"parameters\":{\"file\":\"../a.safetensors\"}}", 400, NULL},
    {"load of a missing file", "/v2/repository/models/a/load", NULL,
     "{\"parameters\":{\"file\":\"nope.safetensors\"}}", 404, NULL},
    {"unload", "/v2/repository/models/a/unload", NULL, "{}", 400, NULL},
};

START_TEST(every_bad_input_gets_its_status_and_the_server_keeps_serving)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--max-body-bytes", "65536", "--max-queue-rows", "1000",
					"--model-repository", tmp_dir, NULL});
	int fd = http_connect(s.port); /* one keep-alive connection through every case */
	ck_assert_int_ge(fd, 0);
	unsigned infer_400 = 0;
	for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
		const bad_case *c = &bad_cases[i];
		char buf[1024], hdr[128];
		size_t n = strlen(c->body);
		const char *header = c->header;
		memcpy(buf, c->body, n);
		if (c->tail) {
			snprintf(hdr, sizeof hdr, "Inference-Header-Content-Length: %zu\r\n", n);
			header = hdr;
			memcpy(buf + n, c->tail, strlen(c->tail));
			n += strlen(c->tail);
		}
		http_resp r;
		int rc = http_send(fd, "POST", c->path, header, buf, n, &r);
		if (rc) { /* the server may close after an error: reconnect and retry once */
			close(fd);
			fd = http_connect(s.port);
			rc = http_send(fd, "POST", c->path, header, buf, n, &r);
		}
		ck_assert_msg(rc == 0, "%s: no answer", c->what);
		ck_assert_msg(r.status == c->status, "%s: status %d, expected %d (%s)", c->what, r.status,
			      c->status, r.body);
		cJSON *e = cJSON_ParseWithLength(r.body, r.len);
		ck_assert_msg(e && cJSON_IsString(cJSON_GetObjectItem(e, "error")),
			      "%s: body is not {\"error\": ...}: %s", c->what, r.body);
		cJSON_Delete(e);
		infer_400 += c->status == 400 && strstr(c->path, "/infer") != NULL;
		http_resp_free(&r);
	}
	close(fd);

	/* A body above --max-body-bytes: 413 without the server reading it. */
	size_t big = 70000;
	char *huge = malloc(big);
	memset(huge, ' ', big);
	http_resp r;
	ck_assert_int_eq(http_do(s.port, "POST", "/v2/models/a/infer", NULL, huge, big, &r), 0);
	ck_assert_int_eq(r.status, 413);
	http_resp_free(&r);
	free(huge);

	/* A connection that sends half a request and goes away. */
	fd = http_connect(s.port);
	const char *half =
	    "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"inputs\"";
	ck_assert_int_eq(write_all(fd, half, strlen(half)), 0);
	close(fd);
	/* A request line that is not HTTP. */
	fd = http_connect(s.port);
	static const char not_http[] = "\x16\x03\x01 garbage\r\n\r\n";
	ck_assert_int_eq(write_all(fd, not_http, sizeof not_http - 1), 0);
	char sink[512];
	(void)!recv(fd, sink, sizeof sink, 0);
	close(fd);

	/* Still serving, with correct results. */
	mbp_model *m = load(model_a);
	float x[2 * IN_W], want[2 * OUT_W], got[2 * OUT_W];
	fill_rows(x, 2, 3);
	ck_assert_int_eq(mbp_model_forward(m, x, want, 2, 0), 0);
	size_t len;
	char *body = infer_body("after", x, 2, false, false, false, &len, NULL);
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	decode_output(&r, "after", 2, got);
	ck_assert(close_enough(got, want, 2 * OUT_W));
	http_resp_free(&r);
	free(body);
	expect_status(s.port, "GET", "/v2/health/ready", 200, NULL);
	char line[128];
	snprintf(line, sizeof line, "pipeserve_request_failure_total{model=\"a\",code=\"400\"} %u\n",
		 infer_400);
	expect_status(s.port, "GET", "/metrics", 200, line);
	mbp_model_destroy(m);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* ---- admission control ---- */

typedef struct bg_req {
	int port;
	const char *body;
	size_t len;
	http_resp r;
	int rc;
} bg_req;

static void *bg_post(void *arg)
{
	bg_req *b = arg;
	b->rc = post_infer(b->port, -1, "a", b->body, b->len, -1, &b->r);
	return NULL;
}

START_TEST(a_full_queue_answers_429_at_once_and_a_queued_request_times_out_with_503)
{
	make_models();
	srv s;
	/* Rows wait up to 10 s for a micro-batch of 64 to fill; the queue holds 6 rows; timeout 800 ms. */
	start(&s, (const char *const[]){"--max-batch-rows", "64", "--max-queue-delay-us", "10000000",
					"--max-queue-rows", "6", "--timeout-ms", "800", NULL});
	float x[4 * IN_W];
	fill_rows(x, 4, 9);
	size_t len;
	char *body = infer_body("held", x, 4, false, false, false, &len, NULL);
	bg_req held = {.port = s.port, .body = body, .len = len};
	pthread_t t;
	uint64_t t0 = (uint64_t)time(NULL);
	ck_assert_int_eq(pthread_create(&t, NULL, bg_post, &held), 0);
	/* Wait until the 4 rows are queued. */
	for (int i = 0; i < 200; i++) {
		http_resp m;
		ck_assert_int_eq(http_do(s.port, "GET", "/metrics", NULL, NULL, 0, &m), 0);
		bool queued = strstr(m.body, "pipeserve_queue_rows{model=\"a\"} 4\n") != NULL;
		http_resp_free(&m);
		if (queued)
			break;
		sleep_ms(5);
	}
	/* 4 more rows do not fit: 429 at once. */
	http_resp r;
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	ck_assert_msg(r.status == 429, "status %d: %s", r.status, r.body);
	ck_assert_ptr_nonnull(strstr(r.body, "{\"error\":"));
	http_resp_free(&r);
	/* The held request times out in the queue (its delay is longer than the timeout): 503. */
	pthread_join(t, NULL);
	ck_assert_int_eq(held.rc, 0);
	ck_assert_msg(held.r.status == 503, "status %d: %s", held.r.status, held.r.body);
	ck_assert_ptr_nonnull(strstr(held.r.body, "queue"));
	ck_assert_uint_lt((uint64_t)time(NULL) - t0, 8); /* the timeout, not the delay, ended it */
	http_resp_free(&held.r);
	/* The queue is empty again: a request is admitted (not 429) and times out in turn. */
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	ck_assert_int_eq(r.status, 503); /* again the timeout, before the delay */
	http_resp_free(&r);
	free(body);
	expect_status(s.port, "GET", "/metrics", 200,
		      "pipeserve_request_failure_total{model=\"a\",code=\"429\"} 1\n");
	expect_status(s.port, "GET", "/metrics", 200,
		      "pipeserve_request_failure_total{model=\"a\",code=\"503\"} 2\n");
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* ---- concurrency ---- */

typedef struct client {
	int port;
	unsigned id;
	unsigned requests;
	mbp_model *m;	    /* reference model (forward is thread-safe) */
	mbp_model *alt;	    /* optional second acceptable model (reload test) */
	_Atomic bool *stop; /* optional: run until set */
	unsigned done, failed, mismatched;
	char why[256];
} client;

static void *client_main(void *arg)
{
	client *c = arg;
	int fd = http_connect(c->port);
	if (fd < 0) {
		snprintf(c->why, sizeof c->why, "connect failed");
		c->failed++;
		return NULL;
	}
	for (unsigned i = 0; c->stop ? !atomic_load(c->stop) : i < c->requests; i++) {
		size_t rows = 1 + (c->id + i) % 5;
		float x[5 * IN_W], want[5 * OUT_W], alt[5 * OUT_W], got[5 * OUT_W];
		fill_rows(x, rows, c->id * 1000 + i);
		char id[32];
		snprintf(id, sizeof id, "c%u-%u", c->id, i);
		size_t len, json_len;
		bool bin = i % 3 == 2;
		char *body = infer_body(id, x, rows, i % 2, bin, bin, &len, &json_len);
		http_resp r;
		int rc = post_infer(c->port, fd, "a", body, len, bin ? (long long)json_len : -1, &r);
		free(body);
		if (rc || r.status != 200) {
			snprintf(c->why, sizeof c->why, "request %s: rc %d status %d %s", id, rc, r.status,
				 r.body ? r.body : "");
			c->failed++;
			http_resp_free(&r);
			if (rc) {
				close(fd);
				fd = http_connect(c->port);
			}
			continue;
		}
		decode_output(&r, id, rows, got);
		http_resp_free(&r);
		mbp_model_forward(c->m, x, want, rows, 0);
		bool ok = true, have_alt = false;
		for (size_t row = 0; row < rows && ok; row++) {
			const float *g = got + row * OUT_W;
			ok = close_enough(g, want + row * OUT_W, OUT_W);
			if (!ok && c->alt) { /* a row runs with one version or the other, never a mix */
				if (!have_alt)
					mbp_model_forward(c->alt, x, alt, rows, 0);
				have_alt = true;
				ok = close_enough(g, alt + row * OUT_W, OUT_W);
			}
		}
		if (!ok) {
			snprintf(c->why, sizeof c->why, "request %s: wrong output", id);
			c->mismatched++;
		}
		c->done++;
	}
	close(fd);
	return NULL;
}

START_TEST(thirty_two_concurrent_clients_each_get_their_own_results)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--max-batch-rows", "16", "--max-queue-delay-us", "200", NULL});
	mbp_model *m = load(model_a);
	enum { CLIENTS = 32 };
	client c[CLIENTS];
	pthread_t t[CLIENTS];
	unsigned per = (unsigned)mbp_iters(25, 4);
	for (unsigned i = 0; i < CLIENTS; i++) {
		c[i] = (client){.port = s.port, .id = i, .requests = per, .m = m};
		ck_assert_int_eq(pthread_create(&t[i], NULL, client_main, &c[i]), 0);
	}
	unsigned done = 0;
	for (unsigned i = 0; i < CLIENTS; i++) {
		pthread_join(t[i], NULL);
		ck_assert_msg(c[i].failed == 0 && c[i].mismatched == 0, "client %u: %s", i, c[i].why);
		done += c[i].done;
	}
	ck_assert_uint_eq(done, CLIENTS * per);
	char line[128];
	snprintf(line, sizeof line, "pipeserve_request_success_total{model=\"a\"} %u\n", done);
	expect_status(s.port, "GET", "/metrics", 200, line);
	mbp_model_destroy(m);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* ---- reload ---- */

/* Load the model file `file` (a path: its last component names it in the repository). */
static void post_load(int port, const char *file, int want)
{
	char body[700];
	const char *slash = strrchr(file, '/');
	snprintf(body, sizeof body, "{\"parameters\":{\"file\":\"%s\"}}", slash ? slash + 1 : file);
	http_resp r;
	ck_assert_int_eq(http_do(port, "POST", "/v2/repository/models/a/load", NULL, body, strlen(body), &r),
			 0);
	ck_assert_msg(r.status == want, "load %s: status %d (%s)", file, r.status, r.body);
	http_resp_free(&r);
}

START_TEST(reload_under_load_fails_no_request)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--max-batch-rows", "8", "--model-repository", tmp_dir, NULL});
	mbp_model *a = load(model_a), *b = load(model_b);
	enum { CLIENTS = 8 };
	_Atomic bool stop = false;
	client c[CLIENTS];
	pthread_t t[CLIENTS];
	for (unsigned i = 0; i < CLIENTS; i++) {
		c[i] = (client){.port = s.port, .id = i, .m = a, .alt = b, .stop = &stop};
		ck_assert_int_eq(pthread_create(&t[i], NULL, client_main, &c[i]), 0);
	}
	unsigned reloads = (unsigned)mbp_iters(6, 2);
	for (unsigned i = 0; i < reloads; i++) {
		sleep_ms(100);
		post_load(s.port, i % 2 ? model_a : model_b, 200);
	}
	post_load(s.port, model_other, 400); /* another structure: refused, serving goes on */
	post_load(s.port, model_b, 200);
	sleep_ms(100);
	atomic_store(&stop, true);
	unsigned done = 0;
	for (unsigned i = 0; i < CLIENTS; i++) {
		pthread_join(t[i], NULL);
		ck_assert_msg(c[i].failed == 0 && c[i].mismatched == 0, "client %u: %s", i, c[i].why);
		done += c[i].done;
	}
	ck_assert_uint_gt(done, CLIENTS);
	/* After the last reload, b answers, exactly. */
	float x[3 * IN_W], want[3 * OUT_W], got[3 * OUT_W];
	fill_rows(x, 3, 77);
	ck_assert_int_eq(mbp_model_forward(b, x, want, 3, 32), 0);
	size_t len;
	char *body = infer_body("b", x, 3, false, false, false, &len, NULL);
	http_resp r;
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	decode_output(&r, "b", 3, got);
	ck_assert_msg(memcmp(got, want, sizeof want) == 0, "after the reload the output is not model b's");
	http_resp_free(&r);
	free(body);
	char line[128];
	snprintf(line, sizeof line, "pipeserve_reload_success_total{model=\"a\"} %u\n", reloads + 1);
	expect_status(s.port, "GET", "/metrics", 200, line);
	expect_status(s.port, "GET", "/metrics", 200, "pipeserve_reload_failure_total{model=\"a\"} 1\n");
	mbp_model_destroy(a);
	mbp_model_destroy(b);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* POST a load with `body`; @return the status, the response body in `out` (truncated). */
static int load_status(int port, const char *body, char *out, size_t n)
{
	http_resp r;
	ck_assert_int_eq(
	    http_do(port, "POST", "/v2/repository/models/a/load", NULL, body, body ? strlen(body) : 0, &r),
	    0);
	snprintf(out, n, "%s", r.body ? r.body : "");
	cJSON *e = cJSON_ParseWithLength(r.body, r.len);
	ck_assert_msg(r.status == 200 || (e && cJSON_IsString(cJSON_GetObjectItem(e, "error"))),
		      "status %d with a body that is not {\"error\": ...}: %s", r.status, r.body);
	cJSON_Delete(e);
	int st = r.status;
	http_resp_free(&r);
	return st;
}

START_TEST(loading_over_http_is_off_by_default_and_takes_names_inside_the_repository_only)
{
	make_models();
	srv s;
	char msg[1024];
	start(&s, NULL);
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"b.safetensors\"}}", msg, sizeof msg), 403);
	ck_assert_int_eq(load_status(s.port, "{\"parameters\":{\"path\":\"/etc/passwd\"}}", msg, sizeof msg),
			 403);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);

	/* In the repository: a symbolic link to a file outside, a folder. */
	char link[600], sub[600];
	snprintf(link, sizeof link, "%s/passwd.safetensors", tmp_dir);
	snprintf(sub, sizeof sub, "%s/sub.safetensors", tmp_dir);
	ck_assert_int_eq(symlink("/etc/passwd", link), 0);
	ck_assert_int_eq(mkdir(sub, 0700), 0);
	start(&s, (const char *const[]){"--model-repository", tmp_dir, NULL});
	const struct {
		const char *body;
		int status;
	} cases[] = {
	    {"{\"parameters\":{\"path\":\"/etc/passwd\"}}", 400},
	    {"{\"parameters\":{\"file\":\"/etc/passwd\"}}", 400},
	    {"{\"parameters\":{\"file\":\"../../../../etc/passwd\"}}", 400},
	    {"{\"parameters\":{\"file\":\"..\"}}", 400},
	    {"{\"parameters\":{\"file\":\".hidden\"}}", 400},
	    {"{\"parameters\":{\"file\":\"passwd.safetensors\"}}", 400}, /* the link is not followed */
	    {"{\"parameters\":{\"file\":\"sub.safetensors\"}}", 400},	 /* not a regular file */
	    {"{\"parameters\":{\"file\":\"shadow\"}}", 404},
	    /* a NUL would cut the name to b.safetensors; it and every control character are refused */
	    {"{\"parameters\":{\"file\":\"b.safetensors\\u0000/../../etc/passwd\"}}", 400},
	    {"{\"parameters\":{\"file\":\"b.safetensors\\u0000\"}}", 400},
	    {"{\"parameters\":{\"file\":\"b\\u0007.safetensors\"}}", 400},
	    {"{\"parameters\":{\"file\":\"b.safetensors\"}}", 200},
	    {NULL, 200}, /* no body: the repository's a.safetensors, for model "a" */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int st = load_status(s.port, cases[i].body, msg, sizeof msg);
		ck_assert_msg(st == cases[i].status, "%s: status %d, expected %d (%s)", cases[i].body, st,
			      cases[i].status, msg);
		/* nothing of a file outside the repository, nor whether one exists */
		ck_assert_msg(!strstr(msg, "root") && !strstr(msg, "/etc") && !strstr(msg, "No such"),
			      "%s: %s", cases[i].body, msg);
	}
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	unlink(link);
	rmdir(sub);
	remove_models();
}
END_TEST

/* A number from a process's /proc status ("Threads", "VmRSS" or "VmHWM" in KiB), -1 when absent. */
static long proc_status(pid_t pid, const char *key)
{
	char p[64], line[256];
	snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
	FILE *f = fopen(p, "r");
	long v = -1;
	size_t kl = strlen(key);
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			v = strtol(line + kl + 1, NULL, 10);
			break;
		}
	if (f)
		fclose(f);
	return v;
}

static int thread_count(pid_t pid)
{
	return (int)proc_status(pid, "Threads");
}

static void *load_b(void *arg)
{
	char msg[512];
	int st = load_status(*(int *)arg, "{\"parameters\":{\"file\":\"b.safetensors\"}}", msg, sizeof msg);
	return (void *)(intptr_t)st;
}

START_TEST(a_fifo_in_the_repository_answers_at_once_and_a_changed_file_changes_nothing)
{
	make_models();
	char fifo[600];
	snprintf(fifo, sizeof fifo, "%s/fifo.safetensors", tmp_dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	srv s;
	start(&s, (const char *const[]){"--model-repository", tmp_dir, NULL});
	char msg[1024];
	int threads = thread_count(s.pid);
	for (int i = 0; i < 41; i++) {
		ck_assert_int_eq(
		    load_status(s.port, "{\"parameters\":{\"file\":\"fifo.safetensors\"}}", msg, sizeof msg),
		    400);
		ck_assert_msg(strstr(msg, "not a regular file"), "%s", msg);
	}
	sleep_ms(100); /* the loads' detached threads have ended */
	ck_assert_int_le(thread_count(s.pid), threads);
	/* Loads at once: each answers 200 or 409 (one in progress), never waits on another. */
	enum { N = 6 };
	pthread_t t[N];
	int st[N];
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, load_b, &s.port), 0);
	for (int i = 0; i < N; i++) {
		void *r;
		pthread_join(t[i], &r);
		st[i] = (int)(intptr_t)r;
		ck_assert_msg(st[i] == 200 || st[i] == 409, "status %d", st[i]);
	}
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"b.safetensors\"}}", msg, sizeof msg), 200);
	/* The served file truncated, then another written in its place: the server answers with what it
	 * loaded (the weights were read into its own memory; a mapping would have died of SIGBUS). */
	mbp_model *b = load(model_b);
	float x[2 * IN_W], want[2 * OUT_W], got[2 * OUT_W];
	fill_rows(x, 2, 5);
	ck_assert_int_eq(mbp_model_forward(b, x, want, 2, 0), 0);
	ck_assert_int_eq(truncate(model_b, 0), 0);
	size_t len;
	char *body = infer_body("t", x, 2, false, false, false, &len, NULL);
	http_resp r;
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	decode_output(&r, "t", 2, got);
	ck_assert(close_enough(got, want, 2 * OUT_W));
	http_resp_free(&r);
	mbp_model_spec ms = {
	    .layers = 4, .in = IN_W, .hidden = 64, .out = OUT_W, .act = MBP_ACT_RELU, .seed = 9};
	ck_assert_int_eq(mbp_model_write_random(model_b, &ms), 0);
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	decode_output(&r, "t", 2, got);
	ck_assert(close_enough(got, want, 2 * OUT_W));
	http_resp_free(&r);
	free(body);
	mbp_model_destroy(b);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0); /* a clean exit */
	unlink(fifo);
	remove_models();
}
END_TEST

/* Requests of 40 rows over micro-batches of 32 while the weights change every 25 ms. */
typedef struct mix_client {
	int port;
	unsigned id;
	mbp_model *a, *b; /* odd versions are a's weights, even ones b's (a, then b, a, b ... loaded) */
	_Atomic bool *stop;
	unsigned done, mixed, newer;
	char why[256];
} mix_client;

static void *mix_main(void *arg)
{
	mix_client *c = arg;
	enum { ROWS = 40 };
	int fd = http_connect(c->port);
	for (unsigned i = 0; fd >= 0 && !atomic_load(c->stop); i++) {
		static _Thread_local float x[ROWS * IN_W], want[ROWS * OUT_W], got[ROWS * OUT_W];
		fill_rows(x, ROWS, c->id * 10000 + i);
		size_t len;
		char *body = infer_body(NULL, x, ROWS, false, false, false, &len, NULL);
		http_resp r;
		int rc = post_infer(c->port, fd, "a", body, len, -1, &r);
		free(body);
		if (rc || r.status != 200) {
			snprintf(c->why, sizeof c->why, "rc %d status %d", rc, r.status);
			http_resp_free(&r);
			break;
		}
		decode_output(&r, NULL, ROWS, got);
		cJSON *root = cJSON_ParseWithLength(r.body, r.len);
		const cJSON *v = cJSON_GetObjectItem(root, "model_version");
		unsigned long ver = cJSON_IsString(v) ? strtoul(v->valuestring, NULL, 10) : 0;
		cJSON_Delete(root);
		http_resp_free(&r);
		if (!ver) {
			snprintf(c->why, sizeof c->why, "no model_version");
			break;
		}
		c->newer += ver > 1;
		mbp_model_forward(ver % 2 ? c->a : c->b, x, want, ROWS, 0);
		if (!close_enough(got, want, ROWS * OUT_W)) {
			c->mixed++;
			snprintf(c->why, sizeof c->why, "request %u: rows not all from version %lu", i, ver);
		}
		c->done++;
	}
	if (fd >= 0)
		close(fd);
	return NULL;
}

START_TEST(every_response_comes_from_one_weights_version_and_names_it)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--max-batch-rows", "32", "--model-repository", tmp_dir, NULL});
	mbp_model *a = load(model_a), *b = load(model_b);
	enum { CLIENTS = 4 };
	_Atomic bool stop = false;
	mix_client c[CLIENTS];
	pthread_t t[CLIENTS];
	for (unsigned i = 0; i < CLIENTS; i++) {
		c[i] = (mix_client){.port = s.port, .id = i, .a = a, .b = b, .stop = &stop};
		ck_assert_int_eq(pthread_create(&t[i], NULL, mix_main, &c[i]), 0);
	}
	unsigned loads = (unsigned)mbp_iters(60, 20);
	for (unsigned i = 0; i < loads; i++) {
		sleep_ms(25);
		post_load(s.port, i % 2 ? model_a : model_b, 200);
	}
	atomic_store(&stop, true);
	unsigned done = 0, newer = 0;
	for (unsigned i = 0; i < CLIENTS; i++) {
		pthread_join(t[i], NULL);
		ck_assert_msg(c[i].mixed == 0 && !c[i].why[0], "client %u: %s (%u of %u mixed)", i, c[i].why,
			      c[i].mixed, c[i].done);
		done += c[i].done;
		newer += c[i].newer;
	}
	ck_assert_uint_gt(done, CLIENTS);
	ck_assert_uint_gt(newer, 0); /* the loads were seen */
	char v[64];
	snprintf(v, sizeof v, "\"versions\":[\"%u\"]", loads + 1);
	expect_status(s.port, "GET", "/v2/models/a", 200, v);
	mbp_model_destroy(a);
	mbp_model_destroy(b);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

START_TEST(a_huge_sparse_model_file_is_refused_on_its_size_or_header_without_being_read)
{
	make_models();
	char sparse[600];
	snprintf(sparse, sizeof sparse, "%s/sparse.safetensors", tmp_dir);
	int fd = open(sparse, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	if (ftruncate(fd, (off_t)4 << 30) != 0) { /* a file system without sparse files: nothing to show */
		close(fd);
		unlink(sparse);
		remove_models();
		return;
	}
	close(fd);
	srv s;
	char msg[1024];
	start(&s, (const char *const[]){"--model-repository", tmp_dir, "--max-model-bytes", "1000000", NULL});
	long before = proc_status(s.pid, "VmRSS");
	uint64_t t0 = (uint64_t)time(NULL);
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"sparse.safetensors\"}}", msg, sizeof msg), 400);
	ck_assert_msg(strstr(msg, "larger than the bound"), "%s", msg);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	/* Without the bound (default 4 GiB, the file is just that): its 8-byte header is refused first. */
	start(&s,
	      (const char *const[]){"--model-repository", tmp_dir, "--max-model-bytes", "4294967296", NULL});
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"sparse.safetensors\"}}", msg, sizeof msg), 400);
	ck_assert_msg(strstr(msg, "header"), "%s", msg);
	ck_assert_uint_le((uint64_t)time(NULL) - t0, 3);
	ck_assert_msg(proc_status(s.pid, "VmRSS") - before < 64 * 1024, "RSS grew by %ld KiB",
		      proc_status(s.pid, "VmRSS") - before);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	unlink(sparse);
	remove_models();
}
END_TEST

START_TEST(a_file_of_another_structure_is_refused_from_its_header_and_the_next_load_runs)
{
	make_models();
	char big[600];
	snprintf(big, sizeof big, "%s/big.safetensors", tmp_dir);
	const uint32_t w[] = {16, 16384, 16384, 4}; /* 1 GiB of weights in its header, a hole on disk */
	if (!st_write_sparse(big, w, 3)) {
		remove_models();
		return;
	}
	srv s;
	char msg[1024];
	start(&s, (const char *const[]){"--model-repository", tmp_dir, NULL});
	long before = proc_status(s.pid, "VmHWM");
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"big.safetensors\"}}", msg, sizeof msg), 400);
	ck_assert_msg(strstr(msg, "16-16384-16384-4") && strstr(msg, "expected 4 layers of 32-64-64-64-8"),
		      "%s", msg);
	ck_assert_msg(proc_status(s.pid, "VmHWM") - before < 128 * 1024, "peak RSS grew by %ld KiB",
		      proc_status(s.pid, "VmHWM") - before);
	/* the load lock is free at once: the next load runs */
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"b.safetensors\"}}", msg, sizeof msg), 200);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	unlink(big);
	remove_models();
}
END_TEST

static struct run ps_run(const char *const *args);

/* The server as a command: its exit status, and what it wrote on both streams (stdout first) in out. */
static int run_argv(const char *const *args, char *out, size_t n)
{
	struct run r = ps_run(args);
	snprintf(out, n, "%s%s", r.out, r.err);
	int st = r.status;
	run_free(&r);
	return st;
}

START_TEST(a_model_file_with_bytes_changed_is_refused_by_every_reader)
{
	make_models();
	char corrupt[600], bare[600], out[4096], msg[1024];
	snprintf(corrupt, sizeof corrupt, "%s/corrupt.safetensors", tmp_dir);
	snprintf(bare, sizeof bare, "%s/bare.safetensors", tmp_dir);
	mbp_model_spec ms = {
	    .layers = 4, .in = IN_W, .hidden = 64, .out = OUT_W, .act = MBP_ACT_RELU, .seed = 2};
	ck_assert_int_eq(mbp_model_write_random(corrupt, &ms), 0);
	st_overwrite8(corrupt, 1000); /* inside layer 0's weight */
	st_copy_without_digests(model_b, bare);
	int st = run_argv((const char *const[]){"--describe", corrupt, NULL}, out, sizeof out);
	ck_assert_msg(st == 2 && strchr(out, '\n') == out + strlen(out) - 1 && strstr(out, corrupt) &&
			  strstr(out, "digest") && strstr(out, "layers.0.weight"),
		      "exit %d: %s", st, out);
	st = run_argv((const char *const[]){"--describe", bare, NULL}, out, sizeof out);
	ck_assert_msg(st == 0 && strstr(out, "no digest") && strstr(out, "4 layers"), "exit %d: %s", st, out);
	srv s;
	ck_assert_int_eq(srv_start(&s, (const char *const[]){"--model", corrupt, NULL}), -1); /* not served */
	start(&s, (const char *const[]){"--model-repository", tmp_dir, NULL});
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"corrupt.safetensors\"}}", msg, sizeof msg), 400);
	ck_assert_msg(strstr(msg, "corrupt.safetensors") && strstr(msg, "digest"), "%s", msg);
	expect_status(s.port, "GET", "/v2/models/a", 200, "\"versions\":[\"1\"]"); /* still a's weights */
	ck_assert_int_eq(
	    load_status(s.port, "{\"parameters\":{\"file\":\"bare.safetensors\"}}", msg, sizeof msg), 200);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	unlink(corrupt);
	unlink(bare);
	remove_models();
}
END_TEST

START_TEST(a_file_that_is_not_a_model_is_refused_with_none_of_its_bytes_in_the_answer)
{
	make_models();
	static const char secret[] = "SECRET_TOKEN=Zq8vX2kLp9Wm\npassword: hunter2xyz\n";
	char text[600], framed[600], outside_dir[300], outside[600], linked[600], msg[1024];
	snprintf(text, sizeof text, "%s/text.safetensors", tmp_dir);
	snprintf(framed, sizeof framed, "%s/framed.safetensors", tmp_dir);
	snprintf(linked, sizeof linked, "%s/linked.safetensors", tmp_dir);
	snprintf(outside_dir, sizeof outside_dir, "%s-outside", tmp_dir);
	snprintf(outside, sizeof outside, "%s/secret.txt", outside_dir);
	ck_assert_int_eq(mkdir(outside_dir, 0700), 0);
	uint8_t fr[128];
	uint64_t le = htole64(sizeof secret - 1);
	memcpy(fr, &le, 8);
	memcpy(fr + 8, secret, sizeof secret - 1);
	const struct {
		const char *path;
		const void *bytes;
		size_t len;
	} files[] = {{text, secret, sizeof secret - 1},
		     {framed, fr, 8 + sizeof secret - 1},
		     {outside, secret, sizeof secret - 1}};
	for (size_t i = 0; i < 3; i++) {
		FILE *f = fopen(files[i].path, "wb");
		ck_assert_ptr_nonnull(f);
		ck_assert_uint_eq(fwrite(files[i].bytes, 1, files[i].len, f), files[i].len);
		ck_assert_int_eq(fclose(f), 0);
	}
	ck_assert_int_eq(link(outside, linked), 0); /* a hard link in the repository to a secret elsewhere */
	srv s;
	start(&s, (const char *const[]){"--model-repository", tmp_dir, NULL});
	const char *const names[] = {"text.safetensors", "framed.safetensors", "linked.safetensors"};
	for (size_t i = 0; i < 3; i++) {
		char body[128];
		snprintf(body, sizeof body, "{\"parameters\":{\"file\":\"%s\"}}", names[i]);
		ck_assert_int_eq(load_status(s.port, body, msg, sizeof msg), 400);
		ck_assert_msg(strstr(msg, "not a safetensors file"), "%s: %s", names[i], msg);
		ck_assert_msg(
		    !shows_file_bytes(msg, files[i == 2 ? 2 : i].bytes, files[i == 2 ? 2 : i].len, NULL),
		    "%s: the answer shows the file: %s", names[i], msg);
	}
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	unlink(linked);
	unlink(outside);
	rmdir(outside_dir);
	unlink(text);
	unlink(framed);
	remove_models();
}
END_TEST

/* Sum of the samples of a metric in a /metrics text (every label set). */
static unsigned long long metric_sum(const char *text, const char *name)
{
	unsigned long long sum = 0;
	size_t nl = strlen(name);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, name, nl) == 0 && p[nl] == '{') {
			const char *sp = strchr(p, ' ');
			const char *eol = strchr(p, '\n');
			if (sp && (!eol || sp < eol))
				sum += strtoull(sp + 1, NULL, 10);
		}
	return sum;
}

START_TEST(every_infer_request_received_ends_in_exactly_one_counter)
{
	make_models();
	srv s;
	start(&s, NULL);
	float x[2 * IN_W];
	fill_rows(x, 2, 1);
	size_t len;
	char *body = infer_body("m", x, 2, false, false, false, &len, NULL);
	http_resp r;
	for (int i = 0; i < 3; i++) { /* answered */
		ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
		ck_assert_int_eq(r.status, 200);
		http_resp_free(&r);
	}
	ck_assert_int_eq(post_infer(s.port, -1, "a", "{", 1, -1, &r), 0); /* failed */
	ck_assert_int_eq(r.status, 400);
	http_resp_free(&r);
	for (int i = 0; i < 4; i++) { /* their clients go away half-way through the body */
		int fd = http_connect(s.port);
		char head[128];
		snprintf(head, sizeof head,
			 "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", len);
		ck_assert_int_eq(write_all(fd, head, strlen(head)), 0);
		ck_assert_int_eq(write_all(fd, body, len / 2), 0);
		sleep_ms(50);
		close(fd);
	}
	free(body);
	sleep_ms(200);
	ck_assert_int_eq(http_do(s.port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
	unsigned long long rec = metric_sum(r.body, "pipeserve_request_received_total"),
			   ok = metric_sum(r.body, "pipeserve_request_success_total"),
			   fail = metric_sum(r.body, "pipeserve_request_failure_total"),
			   gone = metric_sum(r.body, "pipeserve_request_cancelled_total"),
			   inflight = metric_sum(r.body, "pipeserve_inflight_requests");
	http_resp_free(&r);
	ck_assert_uint_eq(rec, 8);
	ck_assert_uint_eq(ok, 3);
	ck_assert_uint_eq(fail, 1);
	ck_assert_uint_eq(gone, 4);
	ck_assert_uint_eq(inflight, 0);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* ---- HTTP framing ---- */

/* Send raw bytes, read what comes back until the server closes or 3 s pass. */
static void raw_exchange(int port, const char *req, char *out, size_t n)
{
	int fd = http_connect(port);
	ck_assert_int_ge(fd, 0);
	struct timeval tv = {.tv_sec = 3};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	ck_assert_int_eq(write_all(fd, req, strlen(req)), 0);
	size_t got = 0;
	ssize_t k;
	while (got + 1 < n && (k = recv(fd, out + got, n - 1 - got, 0)) > 0)
		got += (size_t)k;
	out[got] = '\0';
	close(fd);
}

/*
 * `out` (what came back on a connection) holds `n` responses one after the other, each one status line,
 * its headers and exactly Content-Length bytes of body, the last one with status `status`; with `json`,
 * its body is {"error": "..."}. Its head goes to `head` when given.
 */
static void expect_responses(const char *what, const char *out, int n, int status, bool json, char *head,
			     size_t headn)
{
	const char *p = out;
	for (int i = 0; i < n; i++) {
		int st = 0;
		ck_assert_msg(sscanf(p, "HTTP/1.1 %d ", &st) == 1, "%s: response %d is not a status line: %s",
			      what, i, p);
		const char *end = strstr(p, "\r\n\r\n");
		ck_assert_msg(end, "%s: response %d has no end of head: %s", what, i, p);
		const char *cl = strcasestr(p, "\r\nContent-Length: ");
		ck_assert_msg(cl && cl < end, "%s: response %d has no Content-Length: %s", what, i, p);
		size_t len = strtoull(cl + 18, NULL, 10);
		const char *body = end + 4;
		ck_assert_msg(strlen(body) >= len, "%s: response %d's body is short: %s", what, i, p);
		if (i + 1 < n) {
			p = body + len;
			continue;
		}
		ck_assert_msg(st == status, "%s: status %d, expected %d: %s", what, st, status, out);
		ck_assert_msg(strlen(body) == len, "%s: %zu bytes after the last response: %s", what,
			      strlen(body) - len, out);
		if (head)
			snprintf(head, headn, "%.*s", (int)(end - p), p);
		if (json) {
			cJSON *e = cJSON_ParseWithLength(body, len);
			ck_assert_msg(e && cJSON_IsString(cJSON_GetObjectItem(e, "error")),
				      "%s: the body is not {\"error\": ...}: %s", what, body);
			cJSON_Delete(e);
			ck_assert_msg(strcasestr(p, "\r\nContent-Type: application/json\r\n") < end,
				      "%s: not application/json: %s", what, p);
		}
	}
}

START_TEST(ambiguous_framing_is_refused_with_an_answer)
{
	make_models();
	srv s;
	start(&s, NULL);
	static const struct {
		const char *what, *req;
		int status;
		bool json; /* false: answered by libmicrohttpd itself, in HTML (pipeserve.1 lists these) */
	} cases[] = {
	    {"two Content-Length",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: "
	     "3\r\n\r\n{}",
	     400, true},
	    {"Transfer-Encoding gzip",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}", 501, true},
	    {"chunked and Content-Length",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: "
	     "2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
	     400, true},
	    /* libmicrohttpd 0.9.75 wrote its status line and headers twice for these */
	    {"HTTP/1.1 without Host", "GET /v2/health/live HTTP/1.1\r\n\r\n", 400, true},
	    {"Content-Length 12abc",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n{}", 400, true},
	    {"Content-Length abc",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", 400, true},
	    {"Content-Length -1",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}", 400, true},
	    {"Content-Length +2",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}", 400, true},
	    {"Content-Length above 2^64",
	     "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551616\r\n\r\n{}",
	     413, true},
	    {"whitespace before a header's colon", "GET /v2/health/live HTTP/1.1\r\nHost : x\r\n\r\n", 400,
	     true},
	    /* answered by libmicrohttpd alone, once */
	    {"HTTP/2.0", "GET /v2 HTTP/2.0\r\nHost: x\r\n\r\n", 505, false},
	    {"a header line without a colon", "GET /v2 HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400, false},
	};
	char out[8192];
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		uint64_t t0 = (uint64_t)time(NULL);
		raw_exchange(s.port, cases[i].req, out, sizeof out);
		expect_responses(cases[i].what, out, 1, cases[i].status, cases[i].json, NULL, 0);
		ck_assert_msg((uint64_t)time(NULL) - t0 <= 2, "%s: the answer took %llus", cases[i].what,
			      (unsigned long long)((uint64_t)time(NULL) - t0));
	}
	/* The same after an answered request on one connection, sent at once or after its answer. */
	raw_exchange(
	    s.port,
	    "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\nPOST /v2/models/a/infer HTTP/1.1\r\nHost: "
	    "x\r\nContent-Length: abc\r\n\r\n",
	    out, sizeof out);
	expect_responses("a bad Content-Length after a request", out, 2, 400, true, NULL, 0);
	int fd = http_connect(s.port);
	http_resp r;
	ck_assert_int_eq(http_send(fd, "GET", "/v2/health/live", NULL, NULL, 0, &r), 0);
	ck_assert_int_eq(r.status, 200);
	http_resp_free(&r);
	const char bad[] = "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n";
	ck_assert_int_eq(write_all(fd, bad, strlen(bad)), 0);
	size_t got = 0;
	for (ssize_t k; got + 1 < sizeof out && (k = recv(fd, out + got, sizeof out - 1 - got, 0)) > 0;)
		got += (size_t)k;
	out[got] = '\0';
	close(fd);
	expect_responses("a bad Content-Length on a kept-alive connection", out, 1, 400, true, NULL, 0);
	/* chunked alone is fine */
	raw_exchange(
	    s.port,
	    "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: "
	    "close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
	    out, sizeof out);
	ck_assert_msg(strncmp(out, "HTTP/1.1 400 ", 13) == 0 && strstr(out, "inputs"), "%s", out);
	expect_status(s.port, "GET", "/v2/health/live", 200, NULL); /* and the server serves on */
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* A URL is the text the client sent: a control character in it, raw or %-encoded, a NUL above all (the
 * handler's URL is a C string, decoded: "/v2/models/a%00/x" read as "/v2/models/a"), or a space is 400. A
 * 405 names the route's methods in Allow. */
START_TEST(urls_with_control_characters_get_400_and_a_wrong_method_405_with_allow)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--model-repository", tmp_dir, NULL});
#define LINE(text)                                                                                           \
	{                                                                                                    \
		text, sizeof text - 1                                                                        \
	}
	static const struct {
		const char *text;
		size_t len;
	} bad[] = {
	    LINE("GET /v2/models/a%00/x HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a%00 HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a\0/x HTTP/1.1\r\n"), /* a raw NUL */
	    LINE("GET /v2/models/a%01 HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a%1f HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a%7F HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a\x01 HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a\x7f HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a b HTTP/1.1\r\n"),
	    LINE("POST /v2/repository/models/a%00/load HTTP/1.1\r\n"),
	    LINE("GET /v2/models/a?x=%00 HTTP/1.1\r\n"),
	};
#undef LINE
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char req[256], out[4096];
		size_t line = bad[i].len;
		memcpy(req, bad[i].text, line);
		int n = snprintf(req + line, sizeof req - line, "Host: x\r\nContent-Length: 0\r\n\r\n");
		int fd = http_connect(s.port);
		struct timeval tv = {.tv_sec = 3};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		ck_assert_int_eq(write_all(fd, req, line + (size_t)n), 0);
		size_t got = 0;
		for (ssize_t k;
		     got + 1 < sizeof out && (k = recv(fd, out + got, sizeof out - 1 - got, 0)) > 0;)
			got += (size_t)k;
		out[got] = '\0';
		close(fd);
		char what[64];
		snprintf(what, sizeof what, "request line %zu", i);
		expect_responses(what, out, 1, 400, true, NULL, 0);
		ck_assert_msg(strstr(out, "URL"), "%s: %s", what, out);
	}
	expect_status(s.port, "GET", "/v2/models/a%61", 404, "unknown model"); /* "aa": decoded, routed */
	static const struct {
		const char *method, *path, *allow;
	} wrong[] = {
	    {"PUT", "/v2", "GET, HEAD"},
	    {"POST", "/v2/models/a", "GET, HEAD"},
	    {"DELETE", "/metrics", "GET, HEAD"},
	    {"GET", "/v2/models/a/infer", "POST"},
	    {"HEAD", "/v2/models/a/infer", "POST"},
	    {"GET", "/v2/repository/models/a/load", "POST"},
	};
	for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
		char req[256], out[4096], head[2048], allow[64] = "";
		snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			 wrong[i].method, wrong[i].path);
		raw_exchange(s.port, req, out, sizeof out);
		char what[96];
		snprintf(what, sizeof what, "%s %s", wrong[i].method, wrong[i].path);
		bool head_only = strcmp(wrong[i].method, "HEAD") == 0;
		if (head_only) { /* no body: the head alone */
			ck_assert_msg(strncmp(out, "HTTP/1.1 405 ", 13) == 0, "%s: %s", what, out);
			snprintf(head, sizeof head, "%.2000s", out);
		} else {
			expect_responses(what, out, 1, 405, true, head, sizeof head);
		}
		http_resp hr = {0};
		snprintf(hr.head, sizeof hr.head, "%s", head);
		ck_assert_msg(http_header(&hr, "Allow", allow, sizeof allow) &&
				  strcmp(allow, wrong[i].allow) == 0,
			      "%s: Allow \"%s\", expected \"%s\": %s", what, allow, wrong[i].allow, head);
	}
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

START_TEST(head_answers_as_get_without_a_body)
{
	make_models();
	srv s;
	start(&s, NULL);
	const char *paths[] = {"/v2",	       "/v2/health/live",    "/v2/health/ready",
			       "/v2/models/a", "/v2/models/a/ready", "/v2/models/a/versions/1",
			       "/metrics"};
	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		int fd = http_connect(s.port);
		char req[256], out[2048];
		snprintf(req, sizeof req, "HEAD %s HTTP/1.1\r\nHost: x\r\n\r\n", paths[i]);
		ck_assert_int_eq(write_all(fd, req, strlen(req)), 0);
		ssize_t n = recv(fd, out, sizeof out - 1, 0);
		ck_assert_int_gt(n, 0);
		out[n] = '\0';
		ck_assert_msg(strncmp(out, "HTTP/1.1 200 ", 13) == 0, "HEAD %s: %s", paths[i], out);
		char *end = strstr(out, "\r\n\r\n");
		ck_assert_msg(end && end[4] == '\0', "HEAD %s: a body came: %s", paths[i], out);
		/* the connection stays usable: a GET after it gets its whole answer */
		http_resp r;
		ck_assert_int_eq(http_send(fd, "GET", paths[i], NULL, NULL, 0, &r), 0);
		ck_assert_int_eq(r.status, 200);
		http_resp_free(&r);
		close(fd);
	}
	char out[1024];
	raw_exchange(s.port, "HEAD /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", out,
		     sizeof out);
	ck_assert_msg(strncmp(out, "HTTP/1.1 405 ", 13) == 0, "%s", out);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* ---- connection floods ---- */

/* A connection from a source address of the loopback network (127.0.0.0/8), so that floods and the normal
 * client count against different per-address limits; non-blocking connect when `nb`. */
static int connect_from(int port, const char *src, bool nb)
{
	int fd = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET};
	inet_pton(AF_INET, src, &a.sin_addr);
	struct timeval tv = {.tv_sec = 20};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
		close(fd);
		return -1;
	}
	a.sin_port = htons((uint16_t)port);
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) && !(nb && errno == EINPROGRESS)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The normal client: a live-probe from 127.0.0.2 answers 200 within 2 s. */
static void normal_client_served(int port, const char *during)
{
	uint64_t t0 = (uint64_t)time(NULL);
	int fd = connect_from(port, "127.0.0.2", false);
	ck_assert_msg(fd >= 0, "%s: cannot connect", during);
	struct timeval tv = {.tv_sec = 3};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	http_resp r;
	ck_assert_msg(http_send(fd, "GET", "/v2/health/live", NULL, NULL, 0, &r) == 0, "%s: no answer",
		      during);
	ck_assert_msg(r.status == 200, "%s: status %d", during, r.status);
	http_resp_free(&r);
	close(fd);
	ck_assert_uint_le((uint64_t)time(NULL) - t0, 2);
}

/* Whether the server closed fd (end of stream or reset) within `ms`. */
static bool closed_by_server(int fd, unsigned ms)
{
	for (unsigned t = 0; t < ms; t += 50) {
		char c;
		ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
			return true;
		sleep_ms(50);
	}
	return false;
}

START_TEST(floods_of_idle_slow_and_half_closed_connections_leave_normal_clients_served)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--max-connections", "200", "--max-connections-per-ip", "16",
					"--request-timeout-ms", "1000", NULL});
	enum { FLOOD = 300, SLOW = 12, HALF = 12 };
	static int idle[FLOOD], slow[SLOW], half[HALF];
	/* 300 idle sockets from one address: 16 held at most, the others closed at once. */
	for (int i = 0; i < FLOOD; i++)
		idle[i] = connect_from(s.port, "127.0.0.3", true);
	sleep_ms(200);
	normal_client_served(s.port, "idle flood");
	/* Slow heads, one byte every 300 ms, and half-closed connections (FIN sent, nothing else). */
	for (int i = 0; i < SLOW; i++) {
		slow[i] = connect_from(s.port, "127.0.0.4", false);
		ck_assert_int_ge(slow[i], 0);
	}
	for (int i = 0; i < HALF; i++) {
		half[i] = connect_from(s.port, "127.0.0.5", false);
		ck_assert_int_ge(half[i], 0);
		ck_assert_int_eq(shutdown(half[i], SHUT_WR), 0);
	}
	static const char head[] =
	    "GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaa";
	for (int k = 0; k < 8; k++) { /* 2.4 s, more than the 1 s deadline, each byte within the idle time */
		for (int i = 0; i < SLOW; i++)
			(void)!send(slow[i], &head[k], 1, MSG_NOSIGNAL);
		if (k == 2)
			normal_client_served(s.port, "slow and half-closed clients");
		sleep_ms(300);
	}
	for (int i = 0; i < SLOW; i++)
		ck_assert_msg(closed_by_server(slow[i], 500), "slow client %d still open past its deadline",
			      i);
	for (int i = 0; i < HALF; i++)
		ck_assert_msg(closed_by_server(half[i], 500), "half-closed client %d still open", i);
	for (int i = 0; i < FLOOD; i++)
		if (idle[i] >= 0) {
			struct timeval tv = {0};
			setsockopt(idle[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
			ck_assert_msg(closed_by_server(idle[i], 200), "idle connection %d still open", i);
		}
	normal_client_served(s.port, "after the floods");
	for (int i = 0; i < FLOOD; i++)
		if (idle[i] >= 0)
			close(idle[i]);
	for (int i = 0; i < SLOW; i++)
		close(slow[i]);
	for (int i = 0; i < HALF; i++)
		close(half[i]);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* Open `n` idle sockets from 8 addresses (127.0.0.2-9), then a client from 127.0.0.10: whether its request is
 * answered within 6 s while they are all held. */
static void answered_behind_idle_sockets(srv *s, int n, int *idle)
{
	for (int i = 0; i < n; i++) {
		char src[16];
		snprintf(src, sizeof src, "127.0.0.%d", 2 + i % 8);
		idle[i] = connect_from(s->port, src, true);
		ck_assert_msg(idle[i] >= 0, "idle socket %d: %s", i, strerror(errno));
	}
	sleep_ms(300); /* the server takes what it holds */
	int fd = connect_from(s->port, "127.0.0.10", false);
	ck_assert_int_ge(fd, 0);
	struct timeval tv = {.tv_sec = 6};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	http_resp r;
	ck_assert_msg(http_send(fd, "GET", "/v2/health/live", NULL, NULL, 0, &r) == 0,
		      "no answer within %d s while %d idle sockets are held", (int)tv.tv_sec, n);
	ck_assert_int_eq(r.status, 200);
	http_resp_free(&r);
	close(fd);
	for (int i = 0; i < n; i++)
		close(idle[i]);
}

/*
 * Slowloris at the connection limit: 1,000 idle sockets from 8 addresses (125 each, under the per-address
 * limit of 128) take the 512 connections the server holds and wait in its listen backlog for more. A client
 * that arrives after them is answered while every one of them is still held: near the limit, connections
 * that have sent no complete request head are closed after --header-timeout-ms instead of the 10 s
 * request deadline. (The bound is the client's patience, below the 10 s of the request deadline; it is not
 * a measure of speed.) Then the case that libmicrohttpd 0.9.75 slept on: one HTTP thread holding 128
 * connections, all closed at once by the reaper, on one CPU with it, so that the thread reads their 128
 * events together; it waited for its 10 s connection timeout before handling them.
 */
START_TEST(a_client_is_answered_while_a_thousand_idle_sockets_hold_the_connection_limit)
{
	enum { IDLE = 1000 };
	struct rlimit rl;
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < IDLE + 200 && rl.rlim_max >= IDLE + 200) {
		rl.rlim_cur = IDLE + 200;
		ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	ck_assert_msg(rl.rlim_cur >= IDLE + 200, "the test needs %d descriptors, the limit is %llu",
		      IDLE + 200, (unsigned long long)rl.rlim_cur);
	make_models();
	static int idle[IDLE];
	srv s;
	start(&s, NULL); /* the defaults: 512 connections, 128 per address, a 10 s request deadline */
	answered_behind_idle_sockets(&s, IDLE, idle);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	cpu_set_t all, one;
	ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &all)) {
			CPU_SET(c, &one);
			break;
		}
	for (int k = 0; k < 4; k++) {
		ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one),
				 0); /* for the server, which inherits it */
		start(&s, (const char *const[]){"--threads", "1", "--max-connections", "128", NULL});
		ck_assert_int_eq(sched_setaffinity(0, sizeof all, &all), 0);
		answered_behind_idle_sockets(&s, 300, idle);
		ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	}
	remove_models();
}
END_TEST

/* ---- memory bounds ---- */

START_TEST(many_small_numbers_and_unfinished_bodies_stay_within_the_memory_bounds)
{
	make_models();
	srv s;
	start(&s, (const char *const[]){"--max-body-bytes", "5000000", "--max-inflight-body-bytes", "6000000",
					"--max-queue-rows", "1000", NULL});
	/* 2M numbers in 4 MB: refused before a JSON node is made for each (that was some 130 MB). */
	enum { N = 2000000 };
	const char pre[] =
	    "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1000,32],\"data\":[";
	size_t len = sizeof pre - 1 + 2 * N + 3;
	char *body = malloc(len + 1);
	memcpy(body, pre, sizeof pre - 1);
	char *p = body + sizeof pre - 1;
	for (int i = 0; i < N; i++) {
		*p++ = '0';
		*p++ = i + 1 < N ? ',' : ']';
	}
	memcpy(p, "}]}", 3);
	long before = proc_status(s.pid, "VmRSS");
	http_resp r;
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	ck_assert_msg(r.status == 413, "status %d: %s", r.status, r.body);
	http_resp_free(&r);
	free(body);
	long grew = proc_status(s.pid, "VmRSS") - before;
	ck_assert_msg(grew < 48 * 1024, "RSS grew by %ld KiB", grew);

	sleep_ms(200); /* the refused body's bytes are given back once its request completes */
	/* Two unfinished bodies hold 5 of the 6 MB in flight: a third that does not fit gets 503 at once. */
	int held[2];
	char head[256];
	snprintf(head, sizeof head,
		 "POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2500000\r\n\r\n{\"inputs\"");
	for (int i = 0; i < 2; i++) {
		held[i] = http_connect(s.port);
		ck_assert_int_eq(write_all(held[i], head, strlen(head)), 0);
	}
	sleep_ms(200);
	int fd = http_connect(s.port); /* the head alone: the answer comes before the body */
	ck_assert_int_eq(write_all(fd, head, strlen(head) - strlen("{\"inputs\"")), 0);
	char ans[1024] = "";
	size_t got = 0;
	for (ssize_t n; got + 1 < sizeof ans && !strstr(ans, "\"}") &&
			(n = recv(fd, ans + got, sizeof ans - 1 - got, 0)) > 0;) {
		got += (size_t)n;
		ans[got] = '\0';
	}
	close(fd);
	ck_assert_msg(strncmp(ans, "HTTP/1.1 503", 12) == 0 && strstr(ans, "{\"error\":"), "answer \"%s\"",
		      ans);
	for (int i = 0; i < 2; i++)
		close(held[i]);
	sleep_ms(200); /* their bytes are given back: normal requests pass again */
	float x[IN_W];
	fill_rows(x, 1, 4);
	body = infer_body("ok", x, 1, false, false, false, &len, NULL);
	ck_assert_int_eq(post_infer(s.port, -1, "a", body, len, -1, &r), 0);
	ck_assert_int_eq(r.status, 200);
	http_resp_free(&r);
	free(body);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	remove_models();
}
END_TEST

/* ---- shutdown ---- */

START_TEST(sigterm_with_requests_in_flight_loses_none)
{
	make_models();
	srv s;
	/* Requests wait 1.5 s for their micro-batch: the signal arrives while all of them are in flight. */
	start(&s, (const char *const[]){"--max-batch-rows", "64", "--max-queue-delay-us", "1500000", NULL});
	mbp_model *m = load(model_a);
	enum { N = 8 };
	float x[N][2 * IN_W], want[N][2 * OUT_W], got[2 * OUT_W];
	char *body[N];
	bg_req q[N];
	pthread_t t[N];
	for (int i = 0; i < N; i++) {
		fill_rows(x[i], 2, 100 + (unsigned)i);
		ck_assert_int_eq(mbp_model_forward(m, x[i], want[i], 2, 0), 0);
		char id[16];
		snprintf(id, sizeof id, "s%d", i);
		size_t len;
		body[i] = infer_body(id, x[i], 2, false, false, false, &len, NULL);
		q[i] = (bg_req){.port = s.port, .body = body[i], .len = len};
		ck_assert_int_eq(pthread_create(&t[i], NULL, bg_post, &q[i]), 0);
	}
	for (int i = 0; i < 400; i++) { /* until all 16 rows wait */
		http_resp mr;
		ck_assert_int_eq(http_do(s.port, "GET", "/metrics", NULL, NULL, 0, &mr), 0);
		bool all = strstr(mr.body, "pipeserve_queue_rows{model=\"a\"} 16\n") != NULL;
		http_resp_free(&mr);
		if (all)
			break;
		sleep_ms(2);
	}
	kill(s.pid, SIGTERM);
	sleep_ms(50);
	/* Draining: not ready, new infer requests refused with 503. */
	expect_status(s.port, "GET", "/v2/health/ready", 400, NULL);
	http_resp r;
	ck_assert_int_eq(post_infer(s.port, -1, "a", body[0], q[0].len, -1, &r), 0);
	ck_assert_int_eq(r.status, 503);
	http_resp_free(&r);
	for (int i = 0; i < N; i++) {
		pthread_join(t[i], NULL);
		ck_assert_msg(q[i].rc == 0, "request %d lost", i);
		char id[16];
		snprintf(id, sizeof id, "s%d", i);
		decode_output(&q[i].r, id, 2, got);
		ck_assert(close_enough(got, want[i], 2 * OUT_W));
		http_resp_free(&q[i].r);
		free(body[i]);
	}
	ck_assert_int_eq(srv_stop(&s, 0), 0); /* exits by itself, status 0 */
	mbp_model_destroy(m);
	remove_models();
}
END_TEST

/* SIGTERM once the server is up: a clean stop, again and again right after start. */
START_TEST(sigterm_right_after_start_exits_0_every_time)
{
	make_models();
	for (int i = 0; i < 8; i++) {
		srv s;
		start(&s, NULL);
		ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	}
	remove_models();
}
END_TEST

/* The signals thread `tid` of `pid` blocks, from /proc (SigBlk); 0 when it is gone. */
static unsigned long long blocked_signals(pid_t pid, const char *tid, char *comm, size_t n)
{
	char path[128], line[256];
	unsigned long long mask = 0;
	snprintf(path, sizeof path, "/proc/%d/task/%s/status", (int)pid, tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "Name:", 5) == 0)
			snprintf(comm, n, "%.*s", (int)strcspn(line + 6, "\n"), line + 6);
		sscanf(line, "SigBlk: %llx", &mask);
	}
	fclose(f);
	return mask;
}

#define STOP_SIGNALS ((1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1)))

/* Run pipeserve with args and send it SIGTERM as soon as its first code has blocked the stop signals
 * (it then starts, listens and stops cleanly); its exit status and output. */
static struct run start_and_term(const char *const *args)
{
	struct tool_proc p = tool_spawn(PIPESERVE_BIN, NULL, NULL, args);
	char tid[16], comm[64];
	snprintf(tid, sizeof tid, "%d", (int)p.pid);
	for (int k = 0;
	     k < 20000 && (blocked_signals(p.pid, tid, comm, sizeof comm) & STOP_SIGNALS) != STOP_SIGNALS;
	     k++)
		usleep(50);
	kill(p.pid, SIGTERM);
	return tool_finish(p);
}

/*
 * Every thread blocks SIGINT and SIGTERM, those that OpenBLAS starts in its library constructor before main
 * included (they did not: a stop signal the kernel handed one of them before main installed its handler
 * ended the server with 143). The main thread is left out: while it waits in sigwait the kernel unblocks
 * the signals it waits for.
 */
START_TEST(every_thread_blocks_the_stop_signals_from_the_start)
{
	make_models();
	srv s;
	start(&s, NULL);
	char dir[64];
	snprintf(dir, sizeof dir, "/proc/%d/task", (int)s.pid);
	DIR *d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	unsigned threads = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.' || atoi(e->d_name) == s.pid)
			continue;
		char comm[64] = "?";
		unsigned long long mask = blocked_signals(s.pid, e->d_name, comm, sizeof comm);
		ck_assert_msg((mask & STOP_SIGNALS) == STOP_SIGNALS, "thread %s (%s) blocks %llx", e->d_name,
			      comm, mask);
		threads++;
	}
	closedir(d);
	ck_assert_uint_ge(threads, 2);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	/* A signal that comes while the server starts, as soon as its first code has run, waits for it to
	 * listen and then stops it cleanly. */
	for (int i = 0; i < 4; i++) {
		struct run r = start_and_term((const char *const[]){"--port", "0", "--model", model_a, NULL});
		ck_assert_msg(r.status == 0 && strncmp(r.out, "http://127.0.0.1:", 17) == 0, "exit %d: %s%s",
			      r.status, r.out, r.err);
		run_free(&r);
	}
	remove_models();
}
END_TEST

/* --max-inflight's default is 2 per thread made: with --rebalance-replicas 3 on 2 stages, 6 threads (a
 * move may turn every one on), so 12, not the 4 of the plan's one active thread a stage; without it the
 * plan's threads, 4 (--replicas 2: 8). Read from the start-up log of a server stopped once it started. */
START_TEST(max_inflight_defaults_to_two_per_thread_made)
{
	make_models();
	static const char *const extra[3][4] = {{"--rebalance", "--rebalance-replicas", "3", NULL},
						{"--rebalance", NULL},
						{"--replicas", "2", NULL}};
	static const char *const want[3] = {", 12 micro-batches in flight,", ", 4 micro-batches in flight,",
					    ", 8 micro-batches in flight,"};
	for (int i = 0; i < 3; i++) {
		const char *args[16] = {"--port", "0", "--model", model_a, "--stages", "2"};
		int n = 6;
		for (int k = 0; extra[i][k]; k++)
			args[n++] = extra[i][k];
		args[n] = NULL;
		struct run r = start_and_term(args); /* it starts, then stops cleanly */
		ck_assert_msg(r.status == 0 && strstr(r.err, want[i]), "%s: exit %d, want '%s': %s",
			      extra[i][0], r.status, want[i], r.err);
		run_free(&r);
	}
	remove_models();
}
END_TEST

/* ---- command line ---- */

static struct run ps_run(const char *const *args)
{
	return tool_run(PIPESERVE_BIN, NULL, NULL, args);
}

/* -h and --help print the usage, -V and --version the version, on standard output, and exit 0. */
START_TEST(help_and_version_print_on_stdout_and_exit_0)
{
	static const char *const help[] = {"-h", "--help"}, *const version[] = {"-V", "--version"};
	for (int i = 0; i < 2; i++) {
		struct run r = ps_run((const char *const[]){help[i], NULL});
		ck_assert_msg(r.status == 0 && strncmp(r.out, "usage: pipeserve ", 17) == 0 && !r.err[0],
			      "%s: exit %d: %s%s", help[i], r.status, r.out, r.err);
		ck_assert(strstr(r.out, "-h, --help") && strstr(r.out, "-V, --version"));
		run_free(&r);
		r = ps_run((const char *const[]){version[i], NULL});
		char want[64];
		snprintf(want, sizeof want, "pipeserve (mbpipe) %s\n", mbp_version());
		ck_assert_msg(r.status == 0 && strcmp(r.out, want) == 0 && !r.err[0], "%s: exit %d: %s%s",
			      version[i], r.status, r.out, r.err);
		run_free(&r);
	}
	/* The demo model by default, named "demo". */
	srv s;
	ck_assert_int_eq(
	    srv_start(&s, (const char *const[]){"--demo", "layers=2,in=8,hidden=16,out=4", NULL}), 0);
	expect_status(s.port, "GET", "/v2/models/demo", 200, "\"shape\":[-1,8]");
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
}
END_TEST

/* Every bad flag or value, and a --model or --stages that does not fit: one line "pipeserve: ..." naming
 * the flag and its rule (the value as given), nothing on standard output, exit 2. Numbers are read by the
 * tools' one strict parser: no sign, no spaces. */
START_TEST(bad_arguments_get_one_line_naming_the_flag_and_rule_and_exit_2)
{
	make_models();
	const struct {
		const char *args[4], *names, *rule;
	} cases[] = {
	    {{"--demo", "layers=abc"}, "--demo layers", "from 1 to 4096"},
	    {{"--demo", "layers=100000,hidden=100000"}, "--demo layers", "from 1 to 4096"},
	    {{"--demo", "layers=100,hidden=100000"}, "--demo", "--max-model-bytes"},
	    {{"--demo", "act=sigmoid"}, "--demo", "relu, gelu or none"},
	    {{"--demo", "size=3"}, "--demo", "keys:"},
	    {{"--demo", "layers=+3"}, "--demo layers", "'+3'"},
	    {{"--max-batch-rows", "0"}, "--max-batch-rows", "from 1 to 65536"},
	    {{"--threads", "many"}, "--threads", "from 1 to 256"},
	    {{"--port", "+5"}, "--port", "'+5' is not a whole number"},
	    {{"--port", " 5"}, "--port", "' 5' is not a whole number"},
	    {{"--port", "5 "}, "--port", "'5 ' is not a whole number"},
	    {{"--header-timeout-ms", "0"}, "--header-timeout-ms", "from 1 to"},
	    {{"--no-such-flag"}, "--no-such-flag", "unknown option"},
	    {{"-x"}, "-x", "unknown option"},
	    {{"--port"}, "--port", "needs a value"},
	    {{"--stages", "9"}, "--stages 9", "only 6 layers"}, /* the demo model has 6 */
	    {{"--replicas", "0"}, "--replicas", "auto or a whole number"},
	    {{"--replicas", "many"}, "--replicas", "auto or a whole number"},
	    {{"--rebalance-replicas", "2"}, "--rebalance-replicas 2", "only with --rebalance"},
	    {{"--rebalance", "--rebalance-replicas", "0"}, "--rebalance-replicas", "from 1 to 64"},
	    {{"--model", "/nonexistent/x.safetensors"},
	     "--model: /nonexistent/x.safetensors",
	     "No such file"},
	    {{"--model", tmp_dir}, tmp_dir, "not a regular file"},
	    {{"--model", model_a, "--stages", "5"}, "--stages 5", "only 4 layers"},
	    {{"--name", "a/b"}, "--name \"a/b\"", "'/'"},
	    {{"--name", ""}, "--name \"\"", "empty"},
	    {{"--name", "a b"}, "--name \"a b\"", "a space"},
	    {{"--model-repository", "/nonexistent"}, "--model-repository /nonexistent", "No such file"},
	    {{"--describe", tmp_dir}, "--describe", "not a regular file"},
	    {{"--describe", "/nonexistent/x.safetensors"},
	     "--describe: /nonexistent/x.safetensors",
	     "No such file"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *args[8] = {"--port", "0"}; /* in case one starts after all */
		for (int k = 0; k < 4 && cases[i].args[k]; k++)
			args[2 + k] = cases[i].args[k];
		struct run r = ps_run(args);
		const char *what = cases[i].args[0];
		ck_assert_msg(r.status == 2, "%s %s: exit %d: %s%s", what, cases[i].args[1], r.status, r.out,
			      r.err);
		ck_assert_msg(lines(r.err) == 1 && strncmp(r.err, "pipeserve: ", 11) == 0 && !r.out[0],
			      "%s: not one line: %s%s", what, r.out, r.err);
		ck_assert_msg(strstr(r.err, cases[i].names) && strstr(r.err, cases[i].rule), "%s: %s", what,
			      r.err);
		run_free(&r);
	}
	remove_models();
}
END_TEST

/* A port already in use: one line of ours with the reason, not libmicrohttpd's, and exit 1. */
START_TEST(a_port_in_use_is_one_line_of_ours_and_exit_1)
{
	srv s;
	ck_assert_int_eq(
	    srv_start(&s, (const char *const[]){"--demo", "layers=2,in=8,hidden=16,out=4", NULL}), 0);
	char port[16], want[128];
	snprintf(port, sizeof port, "%d", s.port);
	struct run r =
	    ps_run((const char *const[]){"--demo", "layers=2,in=8,hidden=16,out=4", "--port", port, NULL});
	snprintf(want, sizeof want, "pipeserve: cannot listen on port %d (127.0.0.1): %s\n", s.port,
		 strerror(EADDRINUSE));
	ck_assert_msg(r.status == 1 && strcmp(r.err, want) == 0 && !r.out[0], "exit %d: %s%s", r.status,
		      r.out, r.err);
	run_free(&r);
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
}
END_TEST

START_TEST(write_demo_model_refuses_a_path_that_is_not_a_regular_file_and_leaves_it)
{
	make_models();
	struct nodes n;
	nodes_make(&n, tmp_dir);
	const char *t[4];
	unsigned k = nodes_list(&n, t);
	char out[4096];
	for (unsigned i = 0; i < k; i++) {
		int st = run_argv((const char *const[]){"--write-demo-model", t[i], NULL}, out, sizeof out);
		ck_assert_msg(st == 2 && strchr(out, '\n') == out + strlen(out) - 1 && strstr(out, t[i]) &&
				  strstr(out, "not a regular file"),
			      "%s: exit %d: %s", t[i], st, out);
	}
	int st = run_argv((const char *const[]){"--write-demo-model", "/proc/demo.safetensors", NULL}, out,
			  sizeof out);
	ck_assert_msg(st == 2 && strstr(out, "/proc/demo.safetensors"), "exit %d: %s", st, out);
	nodes_assert_intact(&n);
	nodes_remove(&n);
	remove_models();
}
END_TEST

START_TEST(the_command_line_writes_and_describes_a_model_file)
{
	make_models();
	char file[600];
	snprintf(file, sizeof file, "%s/demo.safetensors", tmp_dir);
	mode_t old = umask(022);
	struct run r = ps_run((const char *const[]){"--write-demo-model", file, "--demo",
						    "layers=3,in=8,hidden=16,out=4,seed=7", NULL});
	umask(old);
	ck_assert_msg(r.status == 0, "exit %d: %s%s", r.status, r.out, r.err);
	run_free(&r);
	struct stat sb;
	ck_assert_int_eq(stat(file, &sb), 0);
	ck_assert_uint_eq(sb.st_mode & 0777, 0644); /* readable by the server's other users */
	mbp_model *m = load(file);
	ck_assert_uint_eq(mbp_model_layers(m), 3);
	ck_assert_uint_eq(mbp_model_in_width(m), 8);
	ck_assert_uint_eq(mbp_model_out_width(m), 4);
	mbp_model_destroy(m);
	r = ps_run((const char *const[]){"--describe", file, NULL});
	ck_assert_msg(r.status == 0 && strstr(r.out, "8 -> 4 floats per row") &&
			  strstr(r.out, "layer 2: 16 -> 4") && strstr(r.out, "3 layers"),
		      "exit %d: %s%s", r.status, r.out, r.err);
	run_free(&r);
	/* the server serves what was written */
	srv s;
	ck_assert_int_eq(srv_start(&s, (const char *const[]){"--model", file, NULL}), 0);
	expect_status(s.port, "GET", "/v2/models/demo", 200, "\"shape\":[-1,8]");
	ck_assert_int_eq(srv_stop(&s, SIGTERM), 0);
	unlink(file);
	remove_models();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("pipeserve");
	TCase *tc = tcase_create("server");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, every_endpoint_answers_per_the_protocol);
	tcase_add_test(tc, infer_equals_the_library_output_in_every_encoding);
	tcase_add_loop_test(tc, rebalance_serves_the_same_bits_and_shows_its_plan_in_metrics, 0, 3);
	tcase_add_test(tc, replicated_stages_answer_with_the_library_output);
	tcase_add_test(tc, every_bad_input_gets_its_status_and_the_server_keeps_serving);
	tcase_add_test(tc, a_full_queue_answers_429_at_once_and_a_queued_request_times_out_with_503);
	tcase_add_test(tc, thirty_two_concurrent_clients_each_get_their_own_results);
	tcase_add_test(tc, reload_under_load_fails_no_request);
	tcase_add_test(tc, every_response_comes_from_one_weights_version_and_names_it);
	tcase_add_test(tc, a_huge_sparse_model_file_is_refused_on_its_size_or_header_without_being_read);
	tcase_add_test(tc, floods_of_idle_slow_and_half_closed_connections_leave_normal_clients_served);
	tcase_add_test(tc, a_client_is_answered_while_a_thousand_idle_sockets_hold_the_connection_limit);
	tcase_add_test(tc, every_infer_request_received_ends_in_exactly_one_counter);
	tcase_add_test(tc, ambiguous_framing_is_refused_with_an_answer);
	tcase_add_test(tc, urls_with_control_characters_get_400_and_a_wrong_method_405_with_allow);
	tcase_add_test(tc, head_answers_as_get_without_a_body);
	tcase_add_test(tc, many_small_numbers_and_unfinished_bodies_stay_within_the_memory_bounds);
	tcase_add_test(tc, sigterm_with_requests_in_flight_loses_none);
	tcase_add_test(tc, sigterm_right_after_start_exits_0_every_time);
	tcase_add_test(tc, every_thread_blocks_the_stop_signals_from_the_start);
	tcase_add_test(tc, max_inflight_defaults_to_two_per_thread_made);
	tcase_add_test(tc, loading_over_http_is_off_by_default_and_takes_names_inside_the_repository_only);
	tcase_add_test(tc, a_fifo_in_the_repository_answers_at_once_and_a_changed_file_changes_nothing);
	tcase_add_test(tc, help_and_version_print_on_stdout_and_exit_0);
	tcase_add_test(tc, a_port_in_use_is_one_line_of_ours_and_exit_1);
	tcase_add_test(tc, bad_arguments_get_one_line_naming_the_flag_and_rule_and_exit_2);
	tcase_add_test(tc, the_command_line_writes_and_describes_a_model_file);
	tcase_add_test(tc, write_demo_model_refuses_a_path_that_is_not_a_regular_file_and_leaves_it);
	tcase_add_test(tc, a_file_of_another_structure_is_refused_from_its_header_and_the_next_load_runs);
	tcase_add_test(tc, a_model_file_with_bytes_changed_is_refused_by_every_reader);
	tcase_add_test(tc, a_file_that_is_not_a_model_is_refused_with_none_of_its_bytes_in_the_answer);
	suite_add_tcase(s, tc);
	return s;
}

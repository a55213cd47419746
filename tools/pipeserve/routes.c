/*
 * pipeserve's routes: what each endpoint of the Open Inference Protocol answers (see routes.h for how the
 * transport hands a request over). GET routes answer at once; HEAD is GET without the body. An infer
 * request is parsed (oip.c), admitted into the batcher's bounded queue (429 when full) and its connection
 * suspended; the batcher's completion callback resumes it from the pipeline's last stage thread, and the
 * handler, called again, encodes the result. A load runs on a thread of its own (reading a file takes a
 * while, server.c's ps_reload) and resumes its connection the same way. Every infer request received ends
 * in exactly one of the metrics' ok, failed (by status) or cancelled counters.
 *
 * Shutdown (main.c): `draining` turns on, then main waits for `inflight` and `loads` to reach zero. An infer
 * request increments `inflight` (a load `loads`) before it reads `draining` and main stores `draining`
 * before it reads them (all seq_cst): either the request sees draining and answers 503, or main waits.
 */
#include "config.h"

#include "routes.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"

static const char json_type[] = "application/json";

/* ---- responses ---- */

/* Queue `b` (or an empty body) with its Content-Type and one more header (hname NULL: none). */
static enum MHD_Result send_buf_hdr(struct MHD_Connection *c, unsigned status, ps_buf *b, const char *ctype,
				    const char *hname, const char *hval)
{
	struct MHD_Response *r;
	if (b && b->len) {
		r = MHD_create_response_from_buffer(b->len, b->p, MHD_RESPMEM_MUST_FREE);
		if (r)
			*b = (ps_buf){0}; /* the response owns it now */
	} else {
		r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	}
	if (!r)
		return MHD_NO;
	if (ctype)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	if (hname)
		MHD_add_response_header(r, hname, hval);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned status, ps_buf *b, const char *ctype)
{
	return send_buf_hdr(c, status, b, ctype, NULL, NULL);
}

/* {"error": msg}, with one more header (hname NULL: none). */
static enum MHD_Result send_error_hdr(struct MHD_Connection *c, unsigned status, const char *msg,
				      const char *hname, const char *hval)
{
	ps_buf b = {0};
	if (ps_oip_encode_error(&b, msg)) {
		ps_buf_free(&b);
		return MHD_NO;
	}
	enum MHD_Result ret = send_buf_hdr(c, status, &b, json_type, hname, hval);
	ps_buf_free(&b);
	return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg)
{
	return send_error_hdr(c, status, msg, NULL, NULL);
}

static enum MHD_Result send_empty(struct MHD_Connection *c, unsigned status)
{
	return send_buf(c, status, NULL, NULL);
}

/* ---- routing ---- */

/* Split "/a/b/c" into at most `max` segments (pointers into the copy `tmp`). @return the count, or -1. */
static int split_path(const char *url, char *tmp, size_t tmpn, char **seg, int max)
{
	size_t n = strlen(url);
	if (n + 1 > tmpn || url[0] != '/')
		return -1;
	memcpy(tmp, url, n + 1);
	if (n > 1 && tmp[n - 1] == '/')
		tmp[n - 1] = '\0'; /* tolerate one trailing slash */
	int k = 0;
	for (char *p = tmp + 1; *p;) {
		if (k == max)
			return -1;
		seg[k++] = p;
		char *slash = strchr(p, '/');
		if (!slash)
			break;
		*slash = '\0';
		p = slash + 1;
		if (!*p)
			return -1; /* empty segment */
	}
	return k;
}

/* The current weights version as the protocol's version string (it is the model's version). */
static const char *weights_version(ps_server *s, char *buf, size_t n)
{
	snprintf(buf, n, "%llu", (unsigned long long)mbp_model_version(s->model));
	return buf;
}

/* The route of a URL, whatever the method; x->model_err is set for an unknown model or version. */
static enum ps_route find_route(ps_request *x, const char *url)
{
	ps_server *s = x->s;
	char tmp[1024];
	char *seg[8];
	int n = split_path(url, tmp, sizeof tmp, seg, 8);
	if (n == 1 && strcmp(seg[0], "metrics") == 0)
		return PS_ROUTE_METRICS;
	if (n < 1 || strcmp(seg[0], "v2") != 0)
		return PS_ROUTE_NOT_FOUND;
	if (n == 1)
		return PS_ROUTE_SERVER_META;
	if (n == 3 && strcmp(seg[1], "health") == 0)
		return strcmp(seg[2], "live") == 0    ? PS_ROUTE_LIVE
		       : strcmp(seg[2], "ready") == 0 ? PS_ROUTE_READY
						      : PS_ROUTE_NOT_FOUND;
	if (strcmp(seg[1], "models") == 0 && n >= 3) {
		/* models/{name}[/versions/{v}][/ready|/infer] */
		int i = 3;
		x->model_err = strcmp(seg[2], s->info.name) == 0 ? 0 : 404;
		if (i < n && strcmp(seg[i], "versions") == 0) {
			if (i + 1 >= n)
				return PS_ROUTE_NOT_FOUND;
			char v[24];
			if (!x->model_err && strcmp(seg[i + 1], weights_version(s, v, sizeof v)) != 0)
				x->model_err = 404;
			i += 2;
		}
		if (i == n)
			return PS_ROUTE_MODEL_META;
		if (i + 1 == n && strcmp(seg[i], "ready") == 0)
			return PS_ROUTE_MODEL_READY;
		if (i + 1 == n && strcmp(seg[i], "infer") == 0)
			return PS_ROUTE_INFER;
		return PS_ROUTE_NOT_FOUND;
	}
	if (strcmp(seg[1], "repository") == 0) {
		if (n == 3 && strcmp(seg[2], "index") == 0)
			return PS_ROUTE_INDEX;
		if (n == 5 && strcmp(seg[2], "models") == 0) {
			x->model_err = strcmp(seg[3], s->info.name) == 0 ? 0 : 404;
			return strcmp(seg[4], "load") == 0     ? PS_ROUTE_LOAD
			       : strcmp(seg[4], "unload") == 0 ? PS_ROUTE_UNLOAD
							       : PS_ROUTE_NOT_FOUND;
		}
	}
	return PS_ROUTE_NOT_FOUND;
}

void ps_route_head(ps_request *x, const char *url, const char *method)
{
	x->t_start = mbt_now_ns();
	x->route = find_route(x, url);
	/* HEAD is GET without the body (RFC 9110 9.3.2): every GET route takes it; MHD leaves the body out. */
	bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
	bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
	bool takes_post = x->route == PS_ROUTE_INFER || x->route == PS_ROUTE_LOAD ||
			  x->route == PS_ROUTE_UNLOAD || x->route == PS_ROUTE_INDEX;
	x->method_ok = x->route == PS_ROUTE_NOT_FOUND || (takes_post ? post : get);
	x->allow = takes_post ? "POST" : "GET, HEAD";
	x->post = x->route != PS_ROUTE_NOT_FOUND && takes_post && post;
	if (x->route == PS_ROUTE_INFER && x->method_ok) {
		x->received = true;
		atomic_fetch_add_explicit(&x->s->metrics.infer_received, 1, memory_order_relaxed);
	}
}

/* ---- suspend and resume ---- */

/* Suspend the connection while the request's work runs elsewhere; called before that work is queued or
 * started, so that its resume can never come first. */
static void suspend(ps_request *x)
{
	atomic_store_explicit(&x->phase, PS_WAITING, memory_order_relaxed);
	MHD_suspend_connection(x->conn);
}

/* The request's work is done: resume its connection, whose handler then answers (ps_route_resumed). The
 * release publishes the work's results (an infer job's rows, a load's status and message) to that
 * handler; MHD's own lock orders them too, this makes the hand-over explicit. */
static void resume_done(ps_request *x)
{
	atomic_store_explicit(&x->phase, PS_DONE, memory_order_release);
	MHD_resume_connection(x->conn);
}

/* ---- infer ---- */

static void infer_done(ps_req *r)
{
	resume_done(r->arg);
}

static void count_fail(ps_request *x, int status)
{
	if (x->received && !x->outcome)
		ps_metrics_fail(&x->s->metrics, status);
	x->outcome = true;
}

/* An error answer, counted as a failed infer request if the request was one. */
static enum MHD_Result fail_answer(ps_request *x, unsigned status, const char *msg)
{
	count_fail(x, (int)status);
	return send_error(x->conn, status, msg);
}

static enum MHD_Result infer_start(ps_request *x)
{
	ps_server *s = x->s;
	if (!atomic_load(&s->ready))
		return fail_answer(x, MHD_HTTP_SERVICE_UNAVAILABLE, "server not ready");
	const char *hl =
	    MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
	long long header_len = -1;
	if (hl) {
		header_len = ps_oip_parse_header_len(hl, x->body.len);
		if (header_len < 0)
			return fail_answer(x, MHD_HTTP_BAD_REQUEST,
					   "malformed Inference-Header-Content-Length");
	}
	int st = ps_oip_parse_infer(&s->info, x->body.p ? x->body.p : "", x->body.len, header_len, &x->rq,
				    x->err, sizeof x->err);
	if (st)
		return fail_answer(x, (unsigned)st, x->err);

	/* Dekker with main's shutdown: count first, then look (see the file comment). */
	atomic_fetch_add(&s->inflight, 1);
	x->admitted = true;
	if (atomic_load(&s->draining))
		return fail_answer(x, MHD_HTTP_SERVICE_UNAVAILABLE, "server shutting down");

	x->out = malloc(x->rq.rows * s->info.out_width * sizeof(float));
	if (!x->out)
		return fail_answer(x, MHD_HTTP_CONTENT_TOO_LARGE, "request too large for memory");
	int rc = ps_batcher_reserve(s->batcher, x->rq.rows);
	if (rc == -EAGAIN)
		return fail_answer(x, MHD_HTTP_TOO_MANY_REQUESTS, "queue full, retry later");
	if (rc == -E2BIG)
		return fail_answer(x, MHD_HTTP_CONTENT_TOO_LARGE,
				   "request has more rows than the queue holds");
	if (rc)
		return fail_answer(x, MHD_HTTP_SERVICE_UNAVAILABLE, "server shutting down");
	x->job = (ps_req){.in = x->rq.in, .out = x->out, .rows = x->rq.rows, .done = infer_done, .arg = x};
	suspend(x); /* before the enqueue: the completion may resume at once */
	ps_batcher_enqueue(s->batcher, &x->job);
	return MHD_YES;
}

static enum MHD_Result infer_finish(ps_request *x)
{
	ps_server *s = x->s;
	const ps_req *r = &x->job;
	if (r->status == -ETIMEDOUT) {
		snprintf(x->err, sizeof x->err, "request waited more than %llu ms in the queue",
			 (unsigned long long)s->cfg.timeout_ms);
		return fail_answer(x, MHD_HTTP_SERVICE_UNAVAILABLE, x->err);
	}
	if (r->status) {
		snprintf(x->err, sizeof x->err, "inference failed: %s", mbp_strerror(r->status));
		return fail_answer(x, MHD_HTTP_INTERNAL_SERVER_ERROR, x->err);
	}
	ps_buf b = {0};
	size_t json_len;
	char v[24];
	snprintf(v, sizeof v, "%llu", (unsigned long long)r->version);
	ps_model_info mi = s->info;
	mi.version = v; /* the version that computed every row of this request */
	if (ps_oip_encode_infer(&mi, &x->rq, x->out, &b, &json_len)) {
		ps_buf_free(&b);
		return fail_answer(x, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory encoding the response");
	}
	bool binary = json_len != b.len;
	struct MHD_Response *resp = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		ps_buf_free(&b);
		return MHD_NO;
	}
	if (binary) {
		char hl[32];
		snprintf(hl, sizeof hl, "%zu", json_len);
		MHD_add_response_header(resp, "Inference-Header-Content-Length", hl);
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
	} else {
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, json_type);
	}
	enum MHD_Result ret = MHD_queue_response(x->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	atomic_fetch_add_explicit(&s->metrics.infer_ok, 1, memory_order_relaxed);
	x->outcome = true;
	atomic_fetch_add_explicit(&s->metrics.rows_ok, x->rq.rows, memory_order_relaxed);
	ps_hist_observe(&s->metrics.request_ns, mbt_now_ns() - x->t_start);
	return ret;
}

/* ---- reload ---- */

static void *reload_main(void *arg)
{
	ps_request *x = arg;
	x->reload_status = ps_reload(x->s, x->reload_path, x->err, sizeof x->err);
	/* The next load may start now, before this answer is sent (a client that loads again as soon as it
	 * has the answer must not get 409). */
	x->loading = false;
	atomic_store(&x->s->loading, false);
	resume_done(x);
	return NULL;
}

static enum MHD_Result reload_start(ps_request *x)
{
	ps_server *s = x->s;
	if (s->mpi) /* the ranks would have to swap their layers together: not done */
		return send_error(
		    x->conn, MHD_HTTP_FORBIDDEN,
		    "model loading over HTTP is not supported when the stages run on several MPI "
		    "ranks");
	if (s->repo_fd < 0)
		return send_error(x->conn, MHD_HTTP_FORBIDDEN,
				  "model loading over HTTP is off (the server was started without "
				  "--model-repository)");
	int st = ps_oip_parse_load(x->body.p ? x->body.p : "", x->body.len, &x->reload_path, x->err,
				   sizeof x->err);
	if (st)
		return send_error(x->conn, (unsigned)st, x->err);
	bool idle = false;
	if (!atomic_compare_exchange_strong(&s->loading, &idle, true))
		return send_error(x->conn, MHD_HTTP_CONFLICT, "a model load is already in progress");
	x->loading = true; /* cleared by the load's thread when done, or in ps_route_end if it never ran */
	atomic_fetch_add(&s->loads, 1);
	x->admitted = true;
	if (atomic_load(&s->draining))
		return send_error(x->conn, MHD_HTTP_SERVICE_UNAVAILABLE, "server shutting down");
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	suspend(x);
	int rc = pthread_create(&t, &attr, reload_main, x);
	pthread_attr_destroy(&attr);
	if (rc) {
		x->reload_status = MHD_HTTP_SERVICE_UNAVAILABLE;
		snprintf(x->err, sizeof x->err, "cannot start a reload thread");
		resume_done(x);
	}
	return MHD_YES;
}

/* ---- GET endpoints ---- */

/* 200 with what `enc` writes (-ENOMEM: 500), as `ctype`. */
static enum MHD_Result send_encoded(ps_request *x, int (*enc)(ps_request *, ps_buf *), const char *ctype)
{
	ps_buf b = {0};
	enum MHD_Result ret = enc(x, &b)
				  ? send_error(x->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory")
				  : send_buf(x->conn, MHD_HTTP_OK, &b, ctype);
	ps_buf_free(&b);
	return ret;
}

static int enc_metrics(ps_request *x, ps_buf *b)
{
	ps_server *s = x->s;
	ps_metrics_view v = {.model = s->info.name,
			     .ready = atomic_load(&s->ready),
			     .inflight_requests = atomic_load(&s->inflight),
			     .pipeline = ps_batcher_pipeline(s->batcher),
			     .stages = s->stages};
	ps_batcher_queue(s->batcher, &v.queue_requests, &v.queue_rows);
	return ps_metrics_render(&s->metrics, &v, b);
}

static int enc_server(ps_request *x, ps_buf *b)
{
	return ps_oip_encode_server_metadata(mbp_version(), b);
}

static int enc_model(ps_request *x, ps_buf *b)
{
	char v[24];
	ps_model_info mi = x->s->info;
	mi.version = weights_version(x->s, v, sizeof v);
	return ps_oip_encode_model_metadata(&mi, b);
}

static int enc_index(ps_request *x, ps_buf *b)
{
	ps_buf_adds(b, "[{\"name\":");
	ps_buf_add_json_string(b, x->s->info.name);
	ps_buf_adds(b, ",\"version\":");
	char v[24];
	ps_buf_add_json_string(b, weights_version(x->s, v, sizeof v));
	ps_buf_printf(b, ",\"state\":\"%s\"}]", atomic_load(&x->s->ready) ? "READY" : "UNAVAILABLE");
	return b->oom ? -ENOMEM : 0;
}

/* ---- the transport's calls ---- */

enum MHD_Result ps_route_answer(ps_request *x)
{
	ps_server *s = x->s;
	struct MHD_Connection *c = x->conn;
	if (x->route == PS_ROUTE_NOT_FOUND)
		return send_error(c, MHD_HTTP_NOT_FOUND, "not found");
	if (!x->method_ok)
		return send_error_hdr(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed",
				      MHD_HTTP_HEADER_ALLOW, x->allow);
	if (x->model_err)
		return fail_answer(x, MHD_HTTP_NOT_FOUND, "unknown model or version");
	if (x->too_large)
		return fail_answer(x, MHD_HTTP_CONTENT_TOO_LARGE, "request body too large");
	if (x->too_busy)
		return fail_answer(x, MHD_HTTP_SERVICE_UNAVAILABLE,
				   "too many request bytes in flight, retry later");
	switch (x->route) {
	case PS_ROUTE_SERVER_META:
		return send_encoded(x, enc_server, json_type);
	case PS_ROUTE_LIVE:
		return send_empty(c, MHD_HTTP_OK);
	case PS_ROUTE_READY:
	case PS_ROUTE_MODEL_READY: /* the protocol: 200 means ready, 4xx not ready, empty body */
		return send_empty(c, atomic_load(&s->ready) ? MHD_HTTP_OK : MHD_HTTP_BAD_REQUEST);
	case PS_ROUTE_MODEL_META:
		return send_encoded(x, enc_model, json_type);
	case PS_ROUTE_INDEX:
		return send_encoded(x, enc_index, json_type);
	case PS_ROUTE_METRICS:
		return send_encoded(x, enc_metrics, "text/plain; version=0.0.4; charset=utf-8");
	case PS_ROUTE_INFER:
		return infer_start(x);
	case PS_ROUTE_LOAD:
		return reload_start(x);
	case PS_ROUTE_UNLOAD:
		return send_error(c, MHD_HTTP_BAD_REQUEST, "unloading the only model is not supported");
	case PS_ROUTE_NOT_FOUND:
		break;
	}
	return send_error(c, MHD_HTTP_NOT_FOUND, "not found");
}

enum MHD_Result ps_route_refuse(ps_request *x, unsigned status, const char *why)
{
	return fail_answer(x, status, why);
}

enum MHD_Result ps_route_resumed(ps_request *x)
{
	if (x->route == PS_ROUTE_INFER)
		return infer_finish(x);
	if (x->reload_status)
		return send_error(x->conn, (unsigned)x->reload_status, x->err);
	return send_empty(x->conn, MHD_HTTP_OK);
}

void ps_route_end(ps_request *x)
{
	ps_server *s = x->s;
	if (x->admitted)
		atomic_fetch_sub(x->route == PS_ROUTE_LOAD ? &s->loads : &s->inflight, 1);
	if (x->received && !x->outcome) /* its client went away first */
		atomic_fetch_add_explicit(&s->metrics.infer_cancelled, 1, memory_order_relaxed);
	ps_infer_req_clear(&x->rq);
	free(x->out);
	free(x->reload_path);
	if (x->loading)
		atomic_store(&s->loading, false);
}

/*
 * pipeserve's HTTP layer: libmicrohttpd with an epoll thread pool (MHD_USE_EPOLL_INTERNAL_THREAD +
 * MHD_OPTION_THREAD_POOL_SIZE) and suspend/resume, which thread-per-connection mode does not support.
 *
 * A request's life: the URI callback (on_uri) makes the request's context and checks its raw target; the
 * first call of the access handler resolves the route and checks the head; later calls collect the body
 * (bounded by max_body_bytes: 413); the call with no more data answers it. An infer request is parsed,
 * admitted into the batcher's bounded queue (429 when full), and its connection suspended; the batcher's
 * completion callback resumes it from the pipeline's last stage thread, and the handler, called again,
 * encodes the result. The connection is suspended before the request is queued, so a resume can never
 * come first. A reload runs on a thread of its own (loading a file takes a while) and resumes its
 * connection the same way. libmicrohttpd's log comes through on_mhd_log, which also answers in its place
 * the one refusal it gets wrong (own_error_answer).
 *
 * Shutdown (main.c): `draining` turns on, then main waits for `inflight` and `loads` to reach zero. An infer
 * request increments `inflight` (a load `loads`) before it reads `draining` and main stores `draining`
 * before it reads them (all seq_cst): either the request sees draining and answers 503, or main waits.
 */
#include "config.h"

#include "server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"

enum route {
	R_NOT_FOUND,
	R_SERVER_META, /* GET /v2 */
	R_LIVE,	       /* GET /v2/health/live */
	R_READY,       /* GET /v2/health/ready */
	R_MODEL_META,  /* GET /v2/models/{name}[/versions/{v}] */
	R_MODEL_READY, /* GET .../ready */
	R_INFER,       /* POST .../infer */
	R_LOAD,	       /* POST /v2/repository/models/{name}/load */
	R_UNLOAD,      /* POST /v2/repository/models/{name}/unload */
	R_INDEX,       /* POST /v2/repository/index */
	R_METRICS,     /* GET /metrics */
};

enum phase { P_READING, P_WAITING, P_DONE };

/*
 * One open connection, for the request deadline: `since` is when it began waiting for a complete request
 * (it connected, or its previous answer was queued), 0 while a complete request is being answered; `head`
 * says whether the handler has seen the head of the request it waits for (the header deadline). The
 * reaper shuts down the socket of a connection past its deadline (MHD then sees the end of the stream and
 * closes it itself); the list and `since` are under s->conns_mu. MHD's CLOSED notification, which takes
 * the entry out, comes before it closes the socket, so the reaper never touches a descriptor it no longer
 * owns.
 */
struct ps_conn {
	struct ps_conn *prev, *next;
	struct MHD_Connection *c;
	pthread_t owner; /* the MHD thread that accepted it, and processes it */
	int fd;
	uint64_t since;
	bool head;	 /* the handler has seen the current request's head */
	uint64_t reaped; /* when the reaper shut it down; 0: not yet */
	bool answered;	 /* answered by own_error_answer: MHD's own answer cannot be sent */
};

typedef struct ps_ctx {
	ps_server *s;
	struct MHD_Connection *conn;
	bool started;	     /* the handler's first call for this request has run */
	const char *url_err; /* what is wrong with the request target, or NULL */
	const char *uri_end; /* where the raw target's C string ends in MHD's buffer (compared, never read) */
	enum route route;
	bool post;	   /* the route takes a body */
	bool method_ok;	   /* the method matches the route */
	const char *allow; /* the route's methods, for a 405's Allow header */
	int model_err;	   /* 0, or 404 for an unknown model or version */
	bool too_large;	   /* the body passed max_body_bytes: discarded, answer 413 */
	bool too_busy;	   /* bodies in flight would pass max_inflight_body_bytes: discarded, answer 503 */
	size_t reserved;   /* bytes of s->body_bytes this request holds */
	bool admitted;	   /* counted in s->inflight (infer) or s->loads (load) */
	bool received;	   /* an infer request counted in metrics.infer_received */
	bool outcome;	   /* ... and counted in its success or failure counter */
	_Atomic int phase;
	uint64_t t_start;
	struct ps_conn *pc; /* the connection's deadline entry, or NULL */
	ps_buf body;
	/* infer */
	ps_infer_req rq;
	ps_req job;
	float *out;
	/* reload */
	int reload_status;
	char *reload_path;
	bool loading; /* holds s->loading */
	char err[256];
} ps_ctx;

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
	enum MHD_Result ret = send_buf_hdr(c, status, &b, "application/json", hname, hval);
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

/* ---- the request target ---- */

/*
 * What is wrong with a request target as the client sent it, or NULL. MHD decodes %XX in place after the
 * URI callback, and the handler gets the decoded URL as a C string: "/v2/models/a%00/x" would route as
 * "/v2/models/a". Refused: a control character, raw or %-encoded (a NUL included), and a space (which
 * MHD_OPTION_STRICT_FOR_CLIENT would refuse with no answer at all).
 */
static const char *target_rule(const char *uri)
{
	for (const char *p = uri; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == ' ')
			return "the URL holds a space";
		if (c < 0x20 || c == 0x7f)
			return "the URL holds a control character";
		if (c == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
			char hex[3] = {p[1], p[2], '\0'};
			unsigned long v = strtoul(hex, NULL, 16);
			if (v < 0x20 || v == 0x7f)
				return "the URL holds an encoded control character (%00 to %1F, %7F)";
		}
	}
	return NULL;
}

/* MHD_OPTION_URI_LOG_CALLBACK: called with the raw target of every request, before its headers are read.
 * The request's context starts here (MHD hands it to the handler and to on_completed). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
	ps_ctx *x = calloc(1, sizeof *x);
	if (!x)
		return NULL; /* the handler closes the connection */
	x->s = cls;
	x->conn = c;
	x->url_err = target_rule(uri);
	x->uri_end = uri + strlen(uri);
	atomic_init(&x->phase, P_READING);
	return x;
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
static enum route find_route(ps_ctx *x, const char *url)
{
	ps_server *s = x->s;
	char tmp[1024];
	char *seg[8];
	int n = split_path(url, tmp, sizeof tmp, seg, 8);
	if (n == 1 && strcmp(seg[0], "metrics") == 0)
		return R_METRICS;
	if (n < 1 || strcmp(seg[0], "v2") != 0)
		return R_NOT_FOUND;
	if (n == 1)
		return R_SERVER_META;
	if (n == 3 && strcmp(seg[1], "health") == 0)
		return strcmp(seg[2], "live") == 0    ? R_LIVE
		       : strcmp(seg[2], "ready") == 0 ? R_READY
						      : R_NOT_FOUND;
	if (strcmp(seg[1], "models") == 0 && n >= 3) {
		/* models/{name}[/versions/{v}][/ready|/infer] */
		int i = 3;
		x->model_err = strcmp(seg[2], s->info.name) == 0 ? 0 : 404;
		if (i < n && strcmp(seg[i], "versions") == 0) {
			if (i + 1 >= n)
				return R_NOT_FOUND;
			char v[24];
			if (!x->model_err && strcmp(seg[i + 1], weights_version(s, v, sizeof v)) != 0)
				x->model_err = 404;
			i += 2;
		}
		if (i == n)
			return R_MODEL_META;
		if (i + 1 == n && strcmp(seg[i], "ready") == 0)
			return R_MODEL_READY;
		if (i + 1 == n && strcmp(seg[i], "infer") == 0)
			return R_INFER;
		return R_NOT_FOUND;
	}
	if (strcmp(seg[1], "repository") == 0) {
		if (n == 3 && strcmp(seg[2], "index") == 0)
			return R_INDEX;
		if (n == 5 && strcmp(seg[2], "models") == 0) {
			x->model_err = strcmp(seg[3], s->info.name) == 0 ? 0 : 404;
			return strcmp(seg[4], "load") == 0     ? R_LOAD
			       : strcmp(seg[4], "unload") == 0 ? R_UNLOAD
							       : R_NOT_FOUND;
		}
	}
	return R_NOT_FOUND;
}

static void route_request(ps_ctx *x, const char *url, const char *method)
{
	x->route = find_route(x, url);
	/* HEAD is GET without the body (RFC 9110 9.3.2): every GET route takes it; MHD leaves the body out. */
	bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
	bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
	bool takes_post =
	    x->route == R_INFER || x->route == R_LOAD || x->route == R_UNLOAD || x->route == R_INDEX;
	x->method_ok = x->route == R_NOT_FOUND || (takes_post ? post : get);
	x->allow = takes_post ? "POST" : "GET, HEAD";
	x->post = x->route != R_NOT_FOUND && takes_post && post;
}

/* ---- infer ---- */

static void infer_done(ps_req *r)
{
	ps_ctx *x = r->arg;
	/* release: publishes the job's results to the handler that runs after the resume (MHD's own lock
	 * orders them too; this makes the hand-over explicit). */
	atomic_store_explicit(&x->phase, P_DONE, memory_order_release);
	MHD_resume_connection(x->conn);
}

static void count_fail(ps_ctx *x, int status)
{
	if (x->received && !x->outcome)
		ps_metrics_fail(&x->s->metrics, status);
	x->outcome = true;
}

static enum MHD_Result infer_fail(ps_ctx *x, unsigned status, const char *msg)
{
	count_fail(x, (int)status);
	return send_error(x->conn, status, msg);
}

static enum MHD_Result infer_start(ps_ctx *x)
{
	ps_server *s = x->s;
	if (!atomic_load(&s->ready))
		return infer_fail(x, MHD_HTTP_SERVICE_UNAVAILABLE, "server not ready");
	const char *hl =
	    MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
	long long header_len = -1;
	if (hl) {
		header_len = ps_oip_parse_header_len(hl, x->body.len);
		if (header_len < 0)
			return infer_fail(x, MHD_HTTP_BAD_REQUEST,
					  "malformed Inference-Header-Content-Length");
	}
	int st = ps_oip_parse_infer(&s->info, x->body.p ? x->body.p : "", x->body.len, header_len, &x->rq,
				    x->err, sizeof x->err);
	if (st)
		return infer_fail(x, (unsigned)st, x->err);

	/* Dekker with main's shutdown: count first, then look (see the file comment). */
	atomic_fetch_add(&s->inflight, 1);
	x->admitted = true;
	if (atomic_load(&s->draining))
		return infer_fail(x, MHD_HTTP_SERVICE_UNAVAILABLE, "server shutting down");

	x->out = malloc(x->rq.rows * s->info.out_width * sizeof(float));
	if (!x->out)
		return infer_fail(x, MHD_HTTP_CONTENT_TOO_LARGE, "request too large for memory");
	int rc = ps_batcher_reserve(s->batcher, x->rq.rows);
	if (rc == -EAGAIN)
		return infer_fail(x, MHD_HTTP_TOO_MANY_REQUESTS, "queue full, retry later");
	if (rc == -E2BIG)
		return infer_fail(x, MHD_HTTP_CONTENT_TOO_LARGE,
				  "request has more rows than the queue holds");
	if (rc)
		return infer_fail(x, MHD_HTTP_SERVICE_UNAVAILABLE, "server shutting down");
	x->job = (ps_req){.in = x->rq.in, .out = x->out, .rows = x->rq.rows, .done = infer_done, .arg = x};
	atomic_store_explicit(&x->phase, P_WAITING, memory_order_relaxed);
	MHD_suspend_connection(x->conn); /* before the enqueue: the completion may resume at once */
	ps_batcher_enqueue(s->batcher, &x->job);
	return MHD_YES;
}

static enum MHD_Result infer_finish(ps_ctx *x)
{
	ps_server *s = x->s;
	const ps_req *r = &x->job;
	if (r->status == -ETIMEDOUT) {
		snprintf(x->err, sizeof x->err, "request waited more than %llu ms in the queue",
			 (unsigned long long)s->cfg.timeout_ms);
		return infer_fail(x, MHD_HTTP_SERVICE_UNAVAILABLE, x->err);
	}
	if (r->status) {
		snprintf(x->err, sizeof x->err, "inference failed: %s", mbp_strerror(r->status));
		return infer_fail(x, MHD_HTTP_INTERNAL_SERVER_ERROR, x->err);
	}
	ps_buf b = {0};
	size_t json_len;
	char v[24];
	snprintf(v, sizeof v, "%llu", (unsigned long long)r->version);
	ps_model_info mi = s->info;
	mi.version = v; /* the version that computed every row of this request */
	if (ps_oip_encode_infer(&mi, &x->rq, x->out, &b, &json_len)) {
		ps_buf_free(&b);
		return infer_fail(x, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory encoding the response");
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
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
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
	ps_ctx *x = arg;
	x->reload_status = ps_reload(x->s, x->reload_path, x->err, sizeof x->err);
	/* The next load may start now, before this answer is sent (a client that loads again as soon as it
	 * has the answer must not get 409). */
	x->loading = false;
	atomic_store(&x->s->loading, false);
	atomic_store_explicit(&x->phase, P_DONE, memory_order_release);
	MHD_resume_connection(x->conn);
	return NULL;
}

static enum MHD_Result reload_start(ps_ctx *x)
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
	x->loading = true; /* cleared by the load's thread when done, or in on_completed if it never ran */
	atomic_fetch_add(&s->loads, 1);
	x->admitted = true;
	if (atomic_load(&s->draining))
		return send_error(x->conn, MHD_HTTP_SERVICE_UNAVAILABLE, "server shutting down");
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	atomic_store_explicit(&x->phase, P_WAITING, memory_order_relaxed);
	MHD_suspend_connection(x->conn);
	int rc = pthread_create(&t, &attr, reload_main, x);
	pthread_attr_destroy(&attr);
	if (rc) {
		x->reload_status = MHD_HTTP_SERVICE_UNAVAILABLE;
		snprintf(x->err, sizeof x->err, "cannot start a reload thread");
		atomic_store_explicit(&x->phase, P_DONE, memory_order_release);
		MHD_resume_connection(x->conn);
	}
	return MHD_YES;
}

/* ---- GET endpoints ---- */

static enum MHD_Result send_metrics(ps_ctx *x)
{
	ps_server *s = x->s;
	ps_metrics_view v = {.model = s->info.name,
			     .ready = atomic_load(&s->ready),
			     .inflight_requests = atomic_load(&s->inflight),
			     .pipeline = ps_batcher_pipeline(s->batcher)};
	ps_batcher_queue(s->batcher, &v.queue_requests, &v.queue_rows);
	ps_buf b = {0};
	if (ps_metrics_render(&s->metrics, &v, &b)) {
		ps_buf_free(&b);
		return send_error(x->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
	}
	enum MHD_Result ret = send_buf(x->conn, MHD_HTTP_OK, &b, "text/plain; version=0.0.4; charset=utf-8");
	ps_buf_free(&b);
	return ret;
}

static enum MHD_Result send_json(ps_ctx *x, int (*enc)(ps_ctx *, ps_buf *))
{
	ps_buf b = {0};
	enum MHD_Result ret = enc(x, &b)
				  ? send_error(x->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory")
				  : send_buf(x->conn, MHD_HTTP_OK, &b, "application/json");
	ps_buf_free(&b);
	return ret;
}

static int enc_server(ps_ctx *x, ps_buf *b)
{
	return ps_oip_encode_server_metadata(mbp_version(), b);
}

static int enc_model(ps_ctx *x, ps_buf *b)
{
	char v[24];
	ps_model_info mi = x->s->info;
	mi.version = weights_version(x->s, v, sizeof v);
	return ps_oip_encode_model_metadata(&mi, b);
}

static int enc_index(ps_ctx *x, ps_buf *b)
{
	ps_buf_adds(b, "[{\"name\":");
	ps_buf_add_json_string(b, x->s->info.name);
	ps_buf_adds(b, ",\"version\":");
	char v[24];
	ps_buf_add_json_string(b, weights_version(x->s, v, sizeof v));
	ps_buf_printf(b, ",\"state\":\"%s\"}]", atomic_load(&x->s->ready) ? "READY" : "UNAVAILABLE");
	return b->oom ? -ENOMEM : 0;
}

/* Count `n` more body bytes against the bound of all bodies in flight. @return false when over it. */
static bool body_reserve(ps_ctx *x, size_t n)
{
	ps_server *s = x->s;
	uint64_t cur = atomic_load_explicit(&s->body_bytes, memory_order_relaxed);
	do {
		if (n > s->cfg.max_inflight_body_bytes || cur > s->cfg.max_inflight_body_bytes - n)
			return false;
		/* relaxed: a counter; nothing is published through it */
	} while (!atomic_compare_exchange_weak_explicit(&s->body_bytes, &cur, cur + n, memory_order_relaxed,
							memory_order_relaxed));
	x->reserved += n;
	return true;
}

/* The connection's deadline starts at `since` (0: none), and whether the handler has seen its request's
 * head. */
static void conn_since(ps_server *s, struct ps_conn *pc, uint64_t since, bool head)
{
	if (!pc)
		return;
	pthread_mutex_lock(&s->conns_mu);
	pc->since = since;
	pc->head = head;
	pthread_mutex_unlock(&s->conns_mu);
}

/* Answer a request whose body (if any) is complete. */
static enum MHD_Result dispatch(ps_ctx *x)
{
	ps_server *s = x->s;
	struct MHD_Connection *c = x->conn;
	if (x->route == R_NOT_FOUND)
		return send_error(c, MHD_HTTP_NOT_FOUND, "not found");
	if (!x->method_ok)
		return send_error_hdr(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed",
				      MHD_HTTP_HEADER_ALLOW, x->allow);
	if (x->model_err) {
		count_fail(x, 404);
		return send_error(c, MHD_HTTP_NOT_FOUND, "unknown model or version");
	}
	if (x->too_large) {
		count_fail(x, 413);
		return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "request body too large");
	}
	if (x->too_busy) {
		count_fail(x, 503);
		return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE,
				  "too many request bytes in flight, retry later");
	}
	switch (x->route) {
	case R_SERVER_META:
		return send_json(x, enc_server);
	case R_LIVE:
		return send_empty(c, MHD_HTTP_OK);
	case R_READY:
	case R_MODEL_READY: /* the protocol: 200 means ready, 4xx not ready, empty body */
		return send_empty(c, atomic_load(&s->ready) ? MHD_HTTP_OK : MHD_HTTP_BAD_REQUEST);
	case R_MODEL_META:
		return send_json(x, enc_model);
	case R_INDEX:
		return send_json(x, enc_index);
	case R_METRICS:
		return send_metrics(x);
	case R_INFER:
		return infer_start(x);
	case R_LOAD:
		return reload_start(x);
	case R_UNLOAD:
		return send_error(c, MHD_HTTP_BAD_REQUEST, "unloading the only model is not supported");
	case R_NOT_FOUND:
		break;
	}
	return send_error(c, MHD_HTTP_NOT_FOUND, "not found");
}

struct head_scan {
	unsigned content_lengths;
	bool bad_name; /* a header name that is empty or holds whitespace or a control character */
};

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	(void)kind;
	(void)value;
	struct head_scan *h = cls;
	if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0)
		h->content_lengths++;
	h->bad_name |= !*key || strpbrk(key, " \t") || ps_has_control(key);
	return MHD_YES;
}

/*
 * Framing that libmicrohttpd 0.9.75 lets through to the handler and that we refuse, each with a JSON error
 * on the request's first call (MHD then closes the connection: its framing cannot be trusted): two
 * Content-Length headers, a Transfer-Encoding other than chunked (MHD would read the body until the client
 * closes), chunked together with a Content-Length, HTTP/1.1 without Host (checked here, not with
 * MHD_OPTION_STRICT_FOR_CLIENT, whose answer is HTML with its status line written twice), whitespace in a
 * header name (RFC 9112 5.1). @return 0 when the head is acceptable, else the status, with `msg`.
 */
static unsigned check_framing(struct MHD_Connection *c, const char *version, const char **msg)
{
	struct head_scan h = {0};
	MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &h);
	unsigned ncl = h.content_lengths;
	const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
	if (h.bad_name) {
		*msg = "a header name holds whitespace or a control character";
		return MHD_HTTP_BAD_REQUEST;
	}
	if (ncl > 1) {
		*msg = "more than one Content-Length header";
		return MHD_HTTP_BAD_REQUEST;
	}
	if (te && strcasecmp(te, "chunked") != 0) {
		*msg = "Transfer-Encoding not supported (only chunked)";
		return MHD_HTTP_NOT_IMPLEMENTED;
	}
	if (te && ncl) {
		*msg = "both Transfer-Encoding and Content-Length";
		return MHD_HTTP_BAD_REQUEST;
	}
	if (strcmp(version, MHD_HTTP_VERSION_1_1) == 0 &&
	    !MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)) {
		*msg = "HTTP/1.1 request without Host";
		return MHD_HTTP_BAD_REQUEST;
	}
	return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
				  const char *version, const char *upload_data, size_t *upload_data_size,
				  void **con_cls)
{
	ps_server *s = cls;
	ps_ctx *x = *con_cls;
	if (!x)
		return MHD_NO; /* on_uri could not make its context: close */
	if (!x->started) {
		x->started = true;
		x->t_start = mbt_now_ns();
		const union MHD_ConnectionInfo *ci =
		    MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
		x->pc = ci ? ci->socket_context : NULL;
		if (x->pc) {
			pthread_mutex_lock(&s->conns_mu);
			x->pc->head = true;
			pthread_mutex_unlock(&s->conns_mu);
		}
		route_request(x, url, method);
		if (x->route == R_INFER && x->method_ok) {
			x->received = true;
			atomic_fetch_add_explicit(&s->metrics.infer_received, 1, memory_order_relaxed);
		}
		/* MHD ends the target's C string at the space before the version (or at a '?' only later): a
		 * target that ends earlier held a raw NUL byte. */
		if (!x->url_err && x->uri_end + 1 != version)
			x->url_err = "the URL holds a control character (NUL)";
		const char *why = NULL;
		unsigned bad = check_framing(c, version, &why);
		if (!bad && x->url_err) {
			bad = MHD_HTTP_BAD_REQUEST;
			why = x->url_err;
		}
		if (bad) {
			count_fail(x, (int)bad);
			return send_error(c, bad, why);
		}
		/* Answer on a later call, even without a body: a response queued on the first call counts as
		 * "early" (before the body) and costs the keep-alive. */
		if (!x->post)
			return MHD_YES;
		const char *cl =
		    MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		unsigned long long cln = cl ? strtoull(cl, NULL, 10) : 0;
		if (cln > s->cfg.max_body_bytes) {
			x->too_large = true;
			return dispatch(x); /* before reading it (MHD then closes the connection) */
		}
		if (cln && !body_reserve(x, (size_t)cln)) {
			x->too_busy = true;
			return dispatch(x);
		}
		return MHD_YES;
	}
	if (*upload_data_size) {
		size_t n = *upload_data_size;
		*upload_data_size = 0;
		if (!x->post)
			return MHD_YES; /* a body nobody asked for: ignore it */
		if (x->too_large || x->too_busy || x->body.len + n > s->cfg.max_body_bytes) {
			x->too_large |= !x->too_busy; /* keep reading, keep nothing */
			ps_buf_free(&x->body);
			return MHD_YES;
		}
		if (x->body.len + n > x->reserved && /* a body without Content-Length: 64 KiB steps */
		    !body_reserve(x, x->body.len + n - x->reserved + (64u << 10))) {
			x->too_busy = true;
			ps_buf_free(&x->body);
			return MHD_YES;
		}
		ps_buf_add(&x->body, upload_data, n);
		if (x->body.oom) {
			x->too_large = true;
			ps_buf_free(&x->body);
		}
		return MHD_YES;
	}
	switch (
	    atomic_load_explicit(&x->phase, memory_order_acquire)) { /* pairs with infer_done/reload_main */
	case P_READING:
		conn_since(s, x->pc, 0, true); /* the request is complete: no deadline while it is answered */
		return dispatch(x);
	case P_WAITING: /* not expected: we were resumed only once done */
		return MHD_YES;
	case P_DONE:
		break;
	}
	if (x->route == R_INFER)
		return infer_finish(x);
	if (x->reload_status)
		return send_error(c, (unsigned)x->reload_status, x->err);
	return send_empty(c, MHD_HTTP_OK);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	ps_server *s = cls;
	ps_ctx *x = *con_cls;
	if (!x)
		return;
	*con_cls = NULL;
	conn_since(s, x->pc, mbt_now_ns(), false); /* the next request's deadline starts now */
	if (x->admitted)
		atomic_fetch_sub(x->route == R_LOAD ? &s->loads : &s->inflight, 1);
	if (x->received && !x->outcome) /* its client went away first */
		atomic_fetch_add_explicit(&s->metrics.infer_cancelled, 1, memory_order_relaxed);
	if (x->reserved)
		atomic_fetch_sub_explicit(&s->body_bytes, x->reserved, memory_order_relaxed);
	ps_infer_req_clear(&x->rq);
	ps_buf_free(&x->body);
	free(x->out);
	free(x->reload_path);
	if (x->loading)
		atomic_store(&s->loading, false);
	free(x);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	ps_server *s = cls;
	struct ps_conn *pc = *socket_context;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
		    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
		pc = ci ? calloc(1, sizeof *pc) : NULL;
		if (!pc)
			return; /* no deadline for this one; MHD's idle timeout still applies */
		pc->c = c;
		pc->owner = pthread_self();
		pc->fd = ci->connect_fd;
		pc->since = mbt_now_ns();
		pthread_mutex_lock(&s->conns_mu);
		pc->next = s->conns;
		if (s->conns)
			s->conns->prev = pc;
		s->conns = pc;
		s->nconns++;
		pthread_mutex_unlock(&s->conns_mu);
		*socket_context = pc;
		return;
	}
	if (!pc)
		return;
	pthread_mutex_lock(&s->conns_mu);
	if (pc->prev)
		pc->prev->next = pc->next;
	else
		s->conns = pc->next;
	if (pc->next)
		pc->next->prev = pc->prev;
	s->nconns--;
	pthread_mutex_unlock(&s->conns_mu);
	*socket_context = NULL;
	free(pc);
}

/* ---- libmicrohttpd's own answers ---- */

/*
 * Answer, with one JSON response, the connection of this thread whose request libmicrohttpd is refusing
 * by itself while the head is parsed. libmicrohttpd 0.9.75 does that for a Content-Length it cannot read
 * ("abc", "-1", "+5", above 2^64 - 1) and gets it wrong: parse_connection_headers() queues its error
 * response and builds its header, then the state machine goes on (MHD_CONNECTION_HEADERS_RECEIVED checks
 * for CLOSED only), skips the handler since a response is queued, and builds the status line and headers a
 * second time. Nothing of ours runs in between except its log line "Error processing request (HTTP
 * response code is N ...)", which comes first, on the thread that processes the connection.
 *
 * At that moment the connection is the only one of this thread that has a complete head
 * (MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE answers from MHD_CONNECTION_HEADERS_RECEIVED on), no response
 * queued (MHD_CONNECTION_INFO_HTTP_STATUS does not answer) and a head the handler has not seen: any other
 * connection of the thread past its head has been through the handler (the same pass of MHD's loop takes
 * a parsed head to the handler), or has MHD's response queued. Errors MHD finds earlier in the head (a
 * head too large, a bad request line or version) or in a chunked body match no connection here: they are
 * answered by MHD once, in HTML. The answer goes straight onto the socket, whose sending side is then shut
 * down: MHD's doubled HTML fails to send (EPIPE) and MHD closes the connection.
 */
static void own_error_answer(ps_server *s, unsigned status)
{
	pthread_t self = pthread_self();
	struct ps_conn *hit = NULL;
	unsigned matches = 0;
	pthread_mutex_lock(&s->conns_mu);
	for (struct ps_conn *pc = s->conns; pc; pc = pc->next)
		if (pthread_equal(pc->owner, self) && !pc->head && !pc->answered &&
		    MHD_get_connection_info(pc->c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE) &&
		    !MHD_get_connection_info(pc->c, MHD_CONNECTION_INFO_HTTP_STATUS)) {
			hit = pc;
			matches++;
		}
	int fd = -1;
	if (matches == 1) { /* more would break the reasoning above: leave MHD's answer alone */
		hit->answered = true;
		fd = hit->fd;
	}
	pthread_mutex_unlock(&s->conns_mu);
	if (fd < 0)
		return;
	const char *msg = status == MHD_HTTP_CONTENT_TOO_LARGE ? "Content-Length too large"
			  : status == MHD_HTTP_BAD_REQUEST
			      ? "malformed Content-Length (a decimal number of bytes)"
			      : MHD_get_reason_phrase_for(status);
	ps_buf body = {0}, r = {0};
	ps_oip_encode_error(&body, msg);
	char date[64];
	time_t now = time(NULL);
	struct tm tm;
	strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&now, &tm));
	ps_buf_printf(&r,
		      "HTTP/1.1 %u %s\r\nDate: %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
		      "Content-Length: %zu\r\n\r\n",
		      status, MHD_get_reason_phrase_for(status), date, body.len);
	ps_buf_add(&r, body.p, body.len);
	/* A new request's answer goes into an empty send buffer unless the client left earlier answers unread:
	 * then it may not fit, and the connection ends without it. */
	bool sent = !r.oom && send(fd, r.p, r.len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)r.len;
	shutdown(fd, sent ? SHUT_WR : SHUT_RDWR);
	ps_buf_free(&body);
	ps_buf_free(&r);
}

/* MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's messages into our log, one line each. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	static const char own[] = "Error processing request (HTTP response code is %u";
	va_list aq;
	va_copy(aq, ap);
	char line[512];
	vsnprintf(line, sizeof line, fmt, ap);
	line[strcspn(line, "\n")] = '\0';
	if (strncmp(fmt, own, sizeof own - 1) == 0)
		own_error_answer(cls, va_arg(aq, unsigned));
	va_end(aq);
	ps_log("http: %s", line);
}

/*
 * Close the connections that did not send a complete request in time: slow heads and bodies, idle
 * keep-alive connections, half-closed ones (--request-timeout-ms). Near the connection limit (3/4 of
 * --max-connections open) a connection that has not sent a complete head is closed after the much shorter
 * --header-timeout-ms: once libmicrohttpd holds its limit, new clients wait in the listen backlog until a
 * connection closes, and sockets that connect and send nothing (slowloris) would keep every one of them
 * waiting for the request deadline. nginx does the same when it runs out of connections (it closes those
 * waiting for a request first); a head that is sent at once arrives long before the shorter deadline.
 * Checks four times per deadline, at most every 250 ms.
 *
 * A connection shut down a check ago that libmicrohttpd has not closed yet is shut down again, one per MHD
 * thread and check: each shutdown wakes the thread that waits on the socket. libmicrohttpd 0.9.75
 * (MHD_epoll) reads epoll events 128 at a time and calls epoll_wait again as long as a call returned 128,
 * with its full timeout: when exactly 128 or 256 connections close at once (256 is a thread's share of the
 * 512 default connections), it sleeps on events it has read and not yet handled, for up to the connection
 * timeout, and every other client waits in the backlog meanwhile. One more event ends that wait.
 */
static void *reaper_main(void *arg)
{
	ps_server *s = arg;
	uint64_t limit = s->cfg.request_timeout_ms * 1000000, head_limit = s->cfg.header_timeout_ms * 1000000;
	uint64_t least = head_limit < limit ? head_limit : limit;
	uint64_t step = least / 4 < 1000000 ? 1000000 : least / 4;
	if (step > 250000000)
		step = 250000000;
	pthread_t *woken = calloc(s->cfg.threads, sizeof *woken); /* this check's MHD threads woken */
	bool pressed = false;
	while (!atomic_load(&s->reaper_stop)) {
		struct timespec ts = mbt_timespec(step);
		nanosleep(&ts, NULL);
		uint64_t now = mbt_now_ns();
		unsigned nwoken = 0;
		pthread_mutex_lock(&s->conns_mu);
		unsigned open = s->nconns;
		bool was = pressed;
		pressed = (uint64_t)open * 4 >= (uint64_t)s->cfg.max_connections * 3;
		for (struct ps_conn *pc = s->conns; pc; pc = pc->next) {
			uint64_t waited = pc->since ? now - pc->since : 0;
			if (pc->since && !pc->reaped &&
			    (waited > limit || (pressed && !pc->head && waited > head_limit))) {
				shutdown(pc->fd, SHUT_RDWR);
				pc->reaped = now;
			} else if (pc->reaped && now - pc->reaped >= step && woken) {
				unsigned k = 0;
				while (k < nwoken && !pthread_equal(woken[k], pc->owner))
					k++;
				if (k == nwoken && nwoken < s->cfg.threads) {
					shutdown(pc->fd, SHUT_RDWR); /* no-op on the socket, but a wake-up */
					woken[nwoken++] = pc->owner;
				}
			}
		}
		pthread_mutex_unlock(&s->conns_mu);
		if (pressed && !was)
			ps_log("connections: %u open of %u: those without a request head close after %llu ms",
			       open, s->cfg.max_connections, (unsigned long long)s->cfg.header_timeout_ms);
	}
	free(woken);
	return NULL;
}

/* The listening socket, made here rather than by libmicrohttpd so that a failure is said in one line of
 * ours with its reason (SO_REUSEADDR and IPV6_V6ONLY as libmicrohttpd sets them). @return the descriptor,
 * or -errno (said). */
static int listen_on(const ps_server *s, const struct addrinfo *ai)
{
	int one = 1;
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
	    (ai->ai_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one)) ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1024)) {
		int rc = -errno;
		ps_say("cannot listen on port %u (%s): %s", s->cfg.port, s->cfg.host, strerror(-rc));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	return fd;
}

int ps_http_start(ps_server *s)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *ai = NULL;
	char port[16];
	snprintf(port, sizeof port, "%u", s->cfg.port);
	int rc = getaddrinfo(s->cfg.host, port, &hints, &ai);
	if (rc) {
		ps_say("--host %s: %s", s->cfg.host, gai_strerror(rc));
		return PS_EUSAGE;
	}
	int fd = listen_on(s, ai);
	bool v6 = ai->ai_family == AF_INET6;
	freeaddrinfo(ai);
	if (fd < 0)
		return fd;
	pthread_mutex_init(&s->conns_mu, NULL);
	/* MHD's own idle timeout, in whole seconds: a backstop behind the reaper's deadline. */
	unsigned idle_s = (unsigned)((s->cfg.request_timeout_ms + 999) / 1000);
	unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	/* MHD_OPTION_STRICT_FOR_CLIENT 0: HTTP/1.1 without Host and spaces in the URL reach the handler, which
	 * refuses them with JSON (check_framing, target_rule); MHD's own refusals are HTML, and without Host it
	 * writes its status line twice. */
	s->mhd = MHD_start_daemon(/* the logger first: it takes the messages about the options too */
				  flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
				  s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE,
				  (unsigned)s->cfg.threads, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				  MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
				  MHD_OPTION_CONNECTION_TIMEOUT, idle_s, MHD_OPTION_CONNECTION_LIMIT,
				  s->cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
				  s->cfg.max_conns_per_ip, MHD_OPTION_STRICT_FOR_CLIENT, (int)0,
				  MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_END);
	if (!s->mhd) { /* its reason, if it gave one, is in the log above */
		ps_say("cannot start the HTTP server on port %u (%s)", s->cfg.port, s->cfg.host);
		return -EIO;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di ? di->port : s->cfg.port;
	s->reaper_on = pthread_create(&s->reaper, NULL, reaper_main, s) == 0;
	if (!s->reaper_on)
		ps_log("cannot start the request deadline thread: idle connections close after %u s", idle_s);
	return 0;
}

void ps_http_stop(ps_server *s)
{
	if (s->reaper_on) {
		atomic_store(&s->reaper_stop, true);
		pthread_join(s->reaper, NULL);
		s->reaper_on = false;
	}
	if (s->mhd)
		MHD_stop_daemon(s->mhd);
	s->mhd = NULL;
}

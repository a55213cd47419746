/*
 * The HTTP layer's request (ps_request) and its routes (routes.c), between the transport (transport.c)
 * and the server. The transport makes a ps_request for every request libmicrohttpd reads, checks its head
 * and collects its body, and hands it to the routes at four points: its head (ps_route_head), its answer
 * once the body is complete (ps_route_answer, or ps_route_refuse for a head refused), its answer after the
 * work it waited for (ps_route_resumed) and its end (ps_route_end). Calls go one way, transport.c ->
 * routes.c: the routes answer through libmicrohttpd's response calls, suspend a connection while its
 * request waits for the batcher or a load, and resume it when that is done.
 */
#ifndef PIPESERVE_ROUTES_H
#define PIPESERVE_ROUTES_H

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"

enum ps_route {
	PS_ROUTE_NOT_FOUND,
	PS_ROUTE_SERVER_META, /* GET /v2 */
	PS_ROUTE_LIVE,	      /* GET /v2/health/live */
	PS_ROUTE_READY,	      /* GET /v2/health/ready */
	PS_ROUTE_MODEL_META,  /* GET /v2/models/{name}[/versions/{v}] */
	PS_ROUTE_MODEL_READY, /* GET .../ready */
	PS_ROUTE_INFER,	      /* POST .../infer */
	PS_ROUTE_LOAD,	      /* POST /v2/repository/models/{name}/load */
	PS_ROUTE_UNLOAD,      /* POST /v2/repository/models/{name}/unload */
	PS_ROUTE_INDEX,	      /* POST /v2/repository/index */
	PS_ROUTE_METRICS,     /* GET /metrics */
};

/* Where a request stands: its body being read, waiting (suspended) for its work, its work done. */
enum ps_phase { PS_READING, PS_WAITING, PS_DONE };

typedef struct ps_request {
	ps_server *s;
	struct MHD_Connection *conn;
	/* the transport's */
	bool started;	     /* the handler's first call for this request has run */
	const char *url_err; /* what is wrong with the request target, or NULL */
	const char *uri_end; /* where the raw target's C string ends in MHD's buffer (compared, never read) */
	struct ps_conn *pc;  /* the connection's deadline entry, or NULL */
	bool too_large;	     /* the body passed max_body_bytes: discarded, answer 413 */
	bool too_busy;	     /* bodies in flight would pass max_inflight_body_bytes: discarded, answer 503 */
	size_t reserved;     /* bytes of the transport's bound on bodies in flight this request holds */
	ps_buf body;
	/* release by the routes when the work is done, acquire by the transport's call after the resume */
	_Atomic int phase;
	/* the routes' */
	enum ps_route route;
	bool post;	   /* the route takes a body (read by the transport) */
	bool method_ok;	   /* the method matches the route */
	const char *allow; /* the route's methods, for a 405's Allow header */
	int model_err;	   /* 0, or 404 for an unknown model or version */
	bool admitted;	   /* counted in s->inflight (infer) or s->loads (load) */
	bool received;	   /* an infer request counted in metrics.infer_received */
	bool outcome;	   /* ... and counted in its success or failure counter */
	uint64_t t_start;
	/* infer */
	ps_infer_req rq;
	ps_req job;
	float *out;
	/* reload */
	int reload_status;
	char *reload_path;
	bool loading; /* holds s->loading */
	char err[256];
} ps_request;

/* The head has been read: find the route of `url` and whether `method` fits it (x->post), count an infer
 * request as received. */
void ps_route_head(ps_request *x, const char *url, const char *method);

/* A head the transport refuses (framing, the target): `status` with {"error": why}, counted as a failed
 * infer request if it was one. */
enum MHD_Result ps_route_refuse(ps_request *x, unsigned status, const char *why);

/* Answer a request whose body, if it takes one, is complete (or was refused as too large or too busy),
 * or suspend its connection until its work is done. */
enum MHD_Result ps_route_answer(ps_request *x);

/* Answer a request whose work is done (x->phase is PS_DONE): an infer result, or a load's outcome. */
enum MHD_Result ps_route_resumed(ps_request *x);

/* The request is over (answered, or its client went away): its counters, and what the routes hold. */
void ps_route_end(ps_request *x);

#endif

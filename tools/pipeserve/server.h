/*
 * pipeserve: an Open Inference Protocol (KServe v2) HTTP server that runs one mbpipe model.
 *
 * Parts: main.c (flags, model and pipeline set-up, signals, shutdown), server.c (the server state's
 * operations: log, reload), http.c (libmicrohttpd handlers and routing), batch.c (dynamic batching onto the
 * pipeline), oip.c (protocol messages), metrics.c (/metrics). Calls go one way: main.c -> http.c ->
 * server.c, main.c -> server.c. Only the public mbpipe API is used.
 */
#ifndef PIPESERVE_SERVER_H
#define PIPESERVE_SERVER_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <mbpipe.h>

#include "batch.h"
#include "flags.h"
#include "metrics.h"
#include "oip.h"

typedef struct ps_server {
	ps_config cfg;
	ps_model_info info;
	char name[PS_NAME_MAX];
	mbp_model *model;
	mbp_model_stages *stages;
	mbp_model_plan plan;
	char *model_path; /* the file the current weights came from; NULL for the demo */
	int repo_fd;	  /* the model repository, open; -1: loading over HTTP is off */
	ps_batcher *batcher;
	ps_metrics metrics;
	struct MHD_Daemon *mhd;
	/* Open connections and the deadline of each (http.c): a reaper closes those past it. */
	pthread_mutex_t conns_mu;
	struct ps_conn *conns;
	unsigned nconns; /* in the list */
	pthread_t reaper;
	bool reaper_on;
	_Atomic bool reaper_stop;
	unsigned port; /* the port actually bound */

	_Atomic bool ready;	   /* serving; false before start and once stopping */
	_Atomic bool draining;	   /* a stop signal arrived: new requests get 503 */
	_Atomic uint64_t inflight; /* admitted infer requests not yet answered */
	_Atomic uint64_t loads;	   /* admitted loads not yet answered */
	_Atomic uint64_t
	    body_bytes;		   /* request body bytes held (http.c), bounded by max_inflight_body_bytes */
	pthread_mutex_t reload_mu; /* one reload at a time */
	_Atomic bool loading;	   /* a load is in progress: another one gets 409 at once */

	/* Under mpirun (mpi.c): the stages run on several ranks, this one runs stages [stage_lo, stage_hi) of
	 * `all_stages` (layers from first_layer on) and s->model holds only their layers. */
	bool mpi;
	unsigned rank, ranks;
	unsigned all_stages, stage_lo, stage_hi, first_layer, all_layers;
	uint32_t out_width; /* the last rank's output width, in floats */
} ps_server;

/* http.c */

/* Start listening (cfg.host, cfg.port); s->port receives the bound port. @return 0 or -errno. */
int ps_http_start(ps_server *s);
/* Stop listening and close every connection (call once nothing is suspended). */
void ps_http_stop(ps_server *s);

/* server.c */

/* Log one line to stderr with a timestamp. */
void ps_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The reason the server does not start: one line "pipeserve: <reason>" on stderr, as every tool writes it. */
void ps_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ps_vsay(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

/* What a start-up step returns for a problem with the arguments given (exit status 2), said already. */
#define PS_EUSAGE (-ERANGE)

/*
 * Load the model file named `file` (NULL: "<model name>.safetensors") from the model repository (s->repo_fd
 * must be open) and swap it in; the HTTP layer runs this off its threads. @return 0, or an HTTP status
 * with a message in `err` (400, 404 when the repository has no such file).
 */
int ps_reload(ps_server *s, const char *file, char *err, size_t errlen);

#endif

/*
 * pipeserve: an Open Inference Protocol (KServe v2) HTTP server that runs one mbpipe model. This header
 * holds the server's state (ps_server), which every part works on, and the operations on it that more than
 * one part uses (server.c: the log, the reason for not starting, a live reload).
 *
 * Parts, one job each (each header names its file's): main.c (the process's life: the start-up order and
 * log, the drain), flags.c (the command line into ps_config), model.c (the model at start-up and its
 * split into stages), engine.c (the engine options, the pipeline and the batcher's start), signals.c (the
 * stop signals), transport.c (libmicrohttpd, connections and their deadlines, a request's head and body),
 * routes.c (what each endpoint answers), batch.c (dynamic batching onto the pipeline), oip.c (protocol
 * messages), metrics.c (/metrics), mpi.c (the stages across MPI ranks).
 *
 * Calls go one way: main.c -> model.c, engine.c, transport.c, signals.c; model.c, engine.c -> mpi.c;
 * transport.c -> routes.c -> batch.c, server.c's reload; and down to flags.c, oip.c, metrics.c and
 * server.c's log. Headers include downward only: oip.h <- metrics.h <- batch.h, flags.h <- server.h <- the
 * parts' own headers (routes.h, transport.h, model.h, engine.h, mpi.h); signals.h includes none of ours.
 * Only the public mbpipe API is used.
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
	struct ps_transport *http; /* the HTTP transport's own state (transport.c) */
	unsigned port;		   /* the port actually bound */

	_Atomic bool ready;	   /* serving; false before start and once stopping */
	_Atomic bool draining;	   /* a stop signal arrived: new requests get 503 */
	_Atomic uint64_t inflight; /* admitted infer requests not yet answered */
	_Atomic uint64_t loads;	   /* admitted loads not yet answered */
	pthread_mutex_t reload_mu; /* one reload at a time */
	_Atomic bool loading;	   /* a load is in progress: another one gets 409 at once */

	/* Under mpirun (mpi.c): the stages run on several ranks, this one runs stages [stage_lo, stage_hi) of
	 * `all_stages` (layers from first_layer on) and s->model holds only their layers. */
	bool mpi;
	unsigned rank, ranks;
	unsigned all_stages, stage_lo, stage_hi, first_layer, all_layers;
	uint32_t out_width; /* the last rank's output width, in floats */
} ps_server;

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

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
#include "metrics.h"
#include "oip.h"

typedef struct ps_config {
	const char *host;		  /* 127.0.0.1 */
	unsigned port;			  /* 8000; 0 picks a free port */
	const char *model_path;		  /* NULL: the built-in demo model */
	const char *name;		  /* NULL: the file's stem, or "demo" */
	const char *demo;		  /* demo model spec "layers=4,in=64,hidden=256,out=16,seed=1" */
	mbp_model_spec demo_spec;	  /* the demo spec parsed (without --model) */
	unsigned stages;		  /* 0: one per allowed CPU (at most one per layer) */
	uint32_t max_batch_rows;	  /* 32 */
	uint64_t max_queue_delay_us;	  /* 0 */
	size_t max_queue_rows;		  /* 4096 */
	uint32_t max_inflight;		  /* micro-batches in the pipeline; 0: 2 x stages */
	uint64_t timeout_ms;		  /* per-request queue timeout; 0: none. 10000 */
	size_t max_body_bytes;		  /* 16 MiB */
	uint64_t max_inflight_body_bytes; /* all request bodies being received or answered. 256 MiB */
	unsigned threads;		  /* HTTP worker threads. 2 */
	uint64_t drain_timeout_ms;	  /* SIGTERM: longest wait for accepted requests. 30000 */
	const char *mbp_conf;		  /* extra engine options, key=value,... (mbp_opts_parse) */
	const char *write_demo;		  /* --write-demo-model FILE: write the demo model there and exit */
	const char *describe;		  /* --describe FILE: describe that model and exit */
	const char *repository;		  /* model repository folder: loads over HTTP off without it */
	unsigned max_connections;	  /* open connections at most. 512 */
	unsigned max_conns_per_ip;	  /* from one client address at most. 128 */
	uint64_t
	    request_timeout_ms; /* a complete request within this of connecting or the last answer. 10000 */
	uint64_t header_timeout_ms; /* near max_connections, a complete request head within this. 500 */
	uint64_t max_model_bytes;   /* largest model file loaded. 4 GiB */
	uint64_t load_timeout_ms;   /* longest time a load may spend reading. 30000 */
} ps_config;

typedef struct ps_server {
	ps_config cfg;
	ps_model_info info;
	char name[128];
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

/* mpi.c (built when configure found MPI; main.c calls it only under mpirun) */

/* Initialise MPI (libmbpipe-mpi's communication thread) and fill s->rank, s->ranks. @return 0 or -errno. */
int ps_mpi_init(int *argc, char ***argv, ps_server *s);
/* Load this rank's part of the model file `path` into s->model, s->plan (s->cfg.stages stages in all, one
 * per rank by default). @return 0, PS_EUSAGE (a file that is no model, more stages than layers, fewer
 * layers or stages than ranks: said by rank 0), or the load's error, logged. */
int ps_mpi_load(ps_server *s, const char *path);
/* Every rank's `status` becomes the largest (collective). */
int ps_mpi_agree(int status);
/* Rank 0: the engine the batcher feeds (rank 0's end of the pipeline across the ranks). */
const ps_engine *ps_mpi_engine(void);
/* Ranks other than 0: run this rank's stages until rank 0 ends the run. @return 0, or an error (logged). */
int ps_mpi_serve(ps_server *s, const mbp_opts *o, const mbp_stage_desc *stages, unsigned n);
void ps_mpi_finalize(void);

#endif

/*
 * pipeserve's command line: the configuration it fills (ps_config, with every default), the flags that set
 * it (one table: name, field, type and range), and what can be checked before anything starts: the --demo
 * spec, the engine options, the model's name in URLs, the file --write-demo-model writes. A bad flag is one
 * line "pipeserve: reason" on standard error; under mpirun every rank finds it and rank 0 alone says it.
 */
#ifndef PIPESERVE_FLAGS_H
#define PIPESERVE_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mbpipe.h>

/* The model's name in URLs, its terminator included, at most. */
#define PS_NAME_MAX 128

typedef struct ps_config {
	const char *host;		  /* 127.0.0.1 */
	unsigned port;			  /* 8000; 0 picks a free port */
	const char *model_path;		  /* NULL: the built-in demo model */
	const char *name;		  /* NULL: the file's stem, or "demo" */
	const char *demo;		  /* demo model spec "layers=4,in=64,hidden=256,out=16,seed=1" */
	mbp_model_spec demo_spec;	  /* the demo spec parsed (without --model) */
	unsigned stages;		  /* 0: one per allowed CPU (at most one per layer) */
	const char *replicas;		  /* --replicas: NULL (one each), "auto" or a count for every stage */
	uint32_t max_batch_rows;	  /* 32 */
	uint64_t max_queue_delay_us;	  /* 0 */
	size_t max_queue_rows;		  /* 4096 */
	uint32_t max_inflight;		  /* micro-batches in the pipeline; 0: 2 x threads made */
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
	uint64_t header_timeout_ms;  /* near max_connections, a complete request head within this. 500 */
	uint64_t max_model_bytes;    /* largest model file loaded. 4 GiB */
	uint64_t load_timeout_ms;    /* longest time a load may spend reading. 30000 */
	bool rebalance;		     /* --rebalance: the stages follow the measured layer costs */
	unsigned rebalance_replicas; /* --rebalance-replicas: threads a stage for moves of the active
					replicas (0: moves keep the counts) */
} ps_config;

/*
 * Fill `c` from the command line, over the defaults. Nothing is started and, but for --help and --version,
 * nothing is printed on standard output.
 * @return 0; 1 when --help or --version was shown (exit 0); -1 for a bad flag, said (exit 2).
 */
int ps_flags_parse(int argc, char **argv, ps_config *c);

/*
 * The model's name in URLs: --name, or the --model file's name without its extension, or "demo", into `out`
 * (n bytes). @return NULL, or what is wrong with it ("is empty", ...): a URL has to carry it as it is.
 */
const char *ps_flags_model_name(const ps_config *c, char *out, size_t n);

/*
 * The stages for a model of `layers` layers (under mpirun, of the whole model): --stages, or `deflt`
 * without it (one per allowed CPU, or one per rank), at most one per layer and MBP_MAX_STAGES.
 * @return the count, or 0 when --stages asks for more stages than the model has layers (said).
 */
unsigned ps_flags_stages(const ps_config *c, unsigned layers, unsigned deflt);

/*
 * --replicas: 0 when not given, 1 .. MBP_MAX_REPLICAS for a count every stage runs on, UINT32_MAX for
 * auto (the stages' boundaries and replicas chosen together over the allowed CPUs), or -1 after saying why
 * not (usage: not a count, or under mpirun).
 */
long ps_flags_replicas(const ps_config *c, bool mpi);

/*
 * Apply the engine options `conf` (mbp_opts_parse's key=value,...; NULL or "" change nothing) over `o`; `what`
 * names where they come from (MBPIPE_OPTS, --engine). @return 0, or -EINVAL with one line in `err` naming
 * `what` and the key's rule.
 */
int ps_flags_engine_opts(mbp_opts *o, const char *what, const char *conf, char *err, size_t n);

#endif

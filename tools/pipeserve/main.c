/*
 * pipeserve: serve one mbpipe model over the Open Inference Protocol (KServe v2 REST).
 *
 * The process's life, in order: the flags (flags.c); --write-demo-model and --describe, which only write or
 * read a model file (model.c); under mpirun, MPI and this rank's part, after which ranks other than 0
 * only run their stages (mpi.c); the model and its split into stages (model.c); the pipeline and the
 * batcher (engine.c); the HTTP server (transport.c); then the address, as the first line on stdout, and
 * the start-up log on stderr (the model, the batching, the limits, the OpenBLAS kernel, the plan, the
 * placement). The stop: on the first SIGINT or SIGTERM (signals.c) readiness turns false, new requests
 * get 503, accepted ones finish within --drain-timeout-ms, the pipeline drains and the process exits 0; a
 * second signal during that wait exits at once with status 1.
 */
#include "config.h"

#include "server.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "flags.h"
#include "model.h"
#include "signals.h"
#include "transport.h"
#include "util/blas.h"
#include "util/clock.h"
#include "util/mpirank.h"
#ifdef PS_WITH_MPI
#include "mpi.h"
#endif

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
	       "flight, timeout %llu ms, %u HTTP threads",
	       c->max_batch_rows, (unsigned long long)c->max_queue_delay_us, c->max_queue_rows,
	       c->max_inflight ? c->max_inflight : 2 * ps_engine_threads(s, nst),
	       (unsigned long long)c->timeout_ms, c->threads);
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
	dense_kernel_line(dense_kernel_name(), warn, sizeof warn);
	ps_log("%s", warn);
	if (kernel_warning_line(warn, sizeof warn))
		ps_log("%s", warn);
	if (blas_warning_line(warn, sizeof warn))
		ps_log("%s", warn);
	char text[4096];
	mbp_model_plan_describe(&s->plan, text, sizeof text);
	for (char *save = NULL, *line = s->mpi ? NULL : strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save))
		ps_log("plan: %s", line); /* under mpirun the split is by layer count: no costs to show */
	ps_engine_log_placement(s);
}

/* Wait until no admitted request is left, at most `ms` milliseconds. A second signal exits at once. */
static bool wait_inflight(ps_server *s, uint64_t ms)
{
	uint64_t end = mbt_now_ns() + ms * 1000000;
	while (atomic_load(&s->inflight) || atomic_load(&s->loads)) {
		if (mbt_now_ns() >= end)
			return false;
		ps_signals_nap(1000000);
	}
	return true;
}

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
		rc = ps_model_setup(s);
		st = rc == PS_EUSAGE ? 2 : rc ? 1 : 0;
	}
	st = ps_mpi_agree(st);
	if (!st && s->rank == 0)
		return -1;
	if (!st) {
		mbp_opts o;
		mbp_stage_desc d[MBP_MAX_STAGES];
		unsigned n;
		rc = ps_engine_opts(s, &o, d, &n);
		if (!rc)
			rc = ps_mpi_serve(s, &o, d, n);
		st = rc ? 1 : 0;
	}
	ps_model_teardown(s);
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
	int pf = ps_flags_parse(argc, argv, &s->cfg);
	if (pf)
		return pf > 0 ? 0 : 2;
	if (s->cfg.write_demo)
		return ps_model_write_demo(&s->cfg);
	if (s->cfg.describe)
		return ps_model_describe(&s->cfg);
	ps_signals_init();

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
	int rc = s->mpi ? 0 : ps_model_setup(s); /* under mpirun: loaded by mpi_start */
	if (!rc)
		rc = ps_engine_start(s);
	if (!rc)
		rc = ps_transport_start(s);
	if (rc) {
		ps_batcher_destroy(s->batcher);
		ps_model_teardown(s);
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

	int sig = ps_signals_wait();
	ps_log("stop: %s received; not ready, finishing %llu accepted requests", strsignal(sig),
	       (unsigned long long)atomic_load(&s->inflight));
	atomic_store(&s->ready, false);
	atomic_store(&s->draining, true); /* pairs with the handlers' inflight increment (routes.c) */
	bool clean = wait_inflight(s, s->cfg.drain_timeout_ms);
	if (!clean)
		ps_log("stop: %llu requests still running after %llu ms; draining the pipeline",
		       (unsigned long long)atomic_load(&s->inflight),
		       (unsigned long long)s->cfg.drain_timeout_ms);
	ps_batcher_stop(s->batcher);
	if (!clean && !wait_inflight(s, 1000)) {
		/* Suspended connections remain: stopping the HTTP daemon now would be undefined behaviour. */
		ps_log("stop: requests left unanswered; exiting without a clean shutdown");
		return 1;
	}
	ps_transport_stop(s);
	uint64_t ok = atomic_load(&s->metrics.infer_ok), failed = 0;
	for (int i = 0; i < PS_FAIL_N; i++)
		failed += atomic_load(&s->metrics.infer_fail[i]);
	ps_batcher_destroy(s->batcher);
	ps_model_teardown(s);
	if (s->repo_fd >= 0)
		close(s->repo_fd);
	ps_log("stopped: %llu infer requests answered, %llu failed", (unsigned long long)ok,
	       (unsigned long long)failed);
	return finish(s, 0);
}

/*
 * pipeserve's server state and the operations on it that both the start-up code (main.c) and the HTTP
 * layer (http.c) use: the log, and loading new weights into the running model (reload). main.c builds the
 * state and starts the HTTP layer; http.c answers requests with it; neither calls the other's code.
 */
#include "config.h"

#include "server.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void ps_log(const char *fmt, ...)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char line[1024];
	int n =
	    snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ pipeserve: ", tm.tm_year + 1900,
		     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", line); /* one call per line: lines from several threads do not interleave */
}

int ps_reload(ps_server *s, const char *path, char *err, size_t errlen)
{
	pthread_mutex_lock(&s->reload_mu);
	int status = 0;
	const char *file = path ? path : s->model_path;
	mbp_model *next = NULL;
	mbp_model_error e;
	uint64_t t0 = ps_now_ns();
	if (!file) {
		snprintf(err, errlen,
			 "the built-in demo model has no file: give {\"parameters\": {\"path\": FILE}}");
		status = 400;
	} else if (mbp_model_load(&next, file, &e)) {
		snprintf(err, errlen, "cannot load the new weights: %s", e.msg);
		status = 400;
	} else {
		int rc = mbp_model_swap(s->model, next);
		if (rc) {
			mbp_model_destroy(next);
			snprintf(err, errlen, "cannot swap in %s: %s (the layer structure must be the same)",
				 file, mbp_strerror(rc));
			status = 400;
		} else if (file != s->model_path) {
			char *copy = strdup(file);
			if (copy) {
				free(s->model_path);
				s->model_path = copy;
			}
		}
	}
	if (status) {
		atomic_fetch_add_explicit(&s->metrics.reload_fail, 1, memory_order_relaxed);
		ps_log("reload failed: %s", err);
	} else {
		atomic_fetch_add_explicit(&s->metrics.reload_ok, 1, memory_order_relaxed);
		ps_log("reload: model \"%s\" now runs weights version %llu from %s (%.1f ms)", s->name,
		       (unsigned long long)mbp_model_version(s->model), file,
		       (double)(ps_now_ns() - t0) / 1e6);
	}
	pthread_mutex_unlock(&s->reload_mu);
	return status;
}

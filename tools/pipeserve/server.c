/*
 * The operations on pipeserve's server state that more than one part uses: the log (timestamped lines on
 * stderr, one write each), the one-line reason for not starting, and a live reload: new weights from a
 * file of the model repository, checked against the served model's structure from the file's header,
 * swapped in while requests run (mbp_model_swap; a request already under way keeps its version). The
 * parts build the state (main.c, model.c, engine.c) and answer requests with it (routes.c); this file
 * calls none of them.
 */
#include "config.h"

#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/digest.h"

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

void ps_vsay(const char *fmt, va_list ap)
{
	char line[1024];
	vsnprintf(line, sizeof line, fmt, ap);
	fprintf(stderr, "pipeserve: %s\n", line);
}

void ps_say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ps_vsay(fmt, ap);
	va_end(ap);
}

/* A model file's name in the repository: 1-255 of [A-Za-z0-9._-], not starting with '.' (no "..", no
 * hidden files, no directories). */
static bool repo_name_ok(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > 255 || name[0] == '.')
		return false;
	for (const char *c = name; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
		      *c == '.' || *c == '_' || *c == '-'))
			return false;
	return true;
}

/*
 * Open `name` inside the model repository without following a symbolic link (O_NOFOLLOW: the name has
 * no '/', so its last component is the only one) and without blocking (O_NONBLOCK: a FIFO answers at
 * once, and the load refuses it as not a regular file). @return the descriptor, or -(HTTP status) with a
 * message in err that names nothing outside the repository.
 */
static int repo_open(ps_server *s, const char *name, char *err, size_t errlen)
{
	if (!repo_name_ok(name)) {
		snprintf(err, errlen,
			 "a model file is named by 1 to 255 of A-Z a-z 0-9 . _ - (not starting with '.'), "
			 "inside the model repository");
		return -400;
	}
	int fd = openat(s->repo_fd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
	if (fd >= 0)
		return fd;
	if (errno == ENOENT) {
		snprintf(err, errlen, "no model file \"%s\" in the model repository", name);
		return -404;
	}
	if (errno == ELOOP)
		snprintf(err, errlen, "\"%s\" is a symbolic link: the repository's files are used directly",
			 name);
	else
		snprintf(err, errlen, "cannot open \"%s\" in the model repository: %s", name,
			 strerror(errno));
	return -400;
}

int ps_reload(ps_server *s, const char *file, char *err, size_t errlen)
{
	pthread_mutex_lock(&s->reload_mu);
	int status = 0;
	char deflt[160];
	snprintf(deflt, sizeof deflt, "%s.safetensors", s->name);
	const char *name = file ? file : deflt;
	mbp_model *next = NULL;
	mbp_model_error e;
	uint64_t t0 = mbt_now_ns();
	int fd = repo_open(s, name, err, errlen);
	/* The served model's layers and widths: a file of another structure is refused from its header,
	 * before its weights are read or their memory allocated. */
	unsigned L = mbp_model_layers(s->model);
	uint32_t *widths = calloc(L + 1, sizeof(*widths));
	for (unsigned i = 0; widths && i < L; i++) {
		mbp_layer_info li;
		mbp_model_layer_info(s->model, i, &li);
		widths[i] = li.in;
		widths[i + 1] = li.out;
	}
	mbp_model_load_opts lo = {.max_bytes = s->cfg.max_model_bytes,
				  .timeout_ns = s->cfg.load_timeout_ms * 1000000,
				  .layers = L,
				  .widths = widths};
	if (fd >= 0 && !widths) {
		snprintf(err, errlen, "out of memory");
		status = 500;
	} else if (fd < 0) {
		status = -fd;
	} else if (mbp_model_load_fd(&next, fd, name, &lo, &e)) {
		snprintf(err, errlen, "cannot load the new weights: %s", e.msg);
		status = 400;
	} else {
		char note[512];
		if (digest_note_line(next, name, note, sizeof note))
			ps_log("note: %s", note);
		int rc = mbp_model_swap(s->model, next);
		if (rc) {
			mbp_model_destroy(next);
			snprintf(err, errlen, "cannot swap in %s: %s (the layer structure must be the same)",
				 name, mbp_strerror(rc));
			status = 400;
		} else {
			char *copy = strdup(name);
			if (copy) {
				free(s->model_path);
				s->model_path = copy;
			}
		}
	}
	free(widths);
	if (fd >= 0)
		close(fd);
	if (status) {
		atomic_fetch_add_explicit(&s->metrics.reload_fail, 1, memory_order_relaxed);
		ps_log("reload failed: %s", err);
	} else {
		atomic_fetch_add_explicit(&s->metrics.reload_ok, 1, memory_order_relaxed);
		ps_log("reload: model \"%s\" now runs weights version %llu from %s (%.1f ms)", s->name,
		       (unsigned long long)mbp_model_version(s->model), name,
		       (double)(mbt_now_ns() - t0) / 1e6);
	}
	pthread_mutex_unlock(&s->reload_mu);
	return status;
}

/*
 * A small HTTP/1.1 client over plain sockets and a pipeserve process launcher, for tests/test_pipeserve.c.
 *
 * The launcher runs the built server with --port 0 and reads the address from the first line of its
 * standard output; standard error stays the test's, so the server's log lands in the test log. The client
 * sends one request at a time on a connection (keep-alive) and reads a response framed by
 * Content-Length, which is how pipeserve always answers. Only loopback addresses are used.
 */
#ifndef TEST_PIPESERVE_CLIENT_H
#define TEST_PIPESERVE_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct srv {
	pid_t pid;
	int port;
} srv;

/* Start the server with extra arguments (NULL-terminated). @return 0, or -1 when it did not come up. */
static int srv_start(srv *s, const char *const *args)
{
	int pfd[2];
	if (pipe(pfd))
		return -1;
	const char *argv[64];
	int n = 0;
	argv[n++] = PIPESERVE_BIN;
	argv[n++] = "--port";
	argv[n++] = "0";
	for (int i = 0; args && args[i] && n < 62; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that fails half-way leaves no server behind */
		dup2(pfd[1], 1);
		close(pfd[0]);
		close(pfd[1]);
		execv(PIPESERVE_BIN, (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	char line[256];
	size_t len = 0;
	while (len + 1 < sizeof line) { /* the first line, byte by byte: nothing after it is consumed */
		ssize_t r = read(pfd[0], line + len, 1);
		if (r <= 0 || line[len] == '\n')
			break;
		len++;
	}
	line[len] = '\0';
	close(pfd[0]); /* only the address comes on stdout */
	s->pid = pid;
	s->port = 0;
	const char *colon = strrchr(line, ':');
	if (strncmp(line, "http://127.0.0.1:", 17) != 0 || !colon || (s->port = atoi(colon + 1)) <= 0) {
		fprintf(stderr, "pipeserve did not print its address (got \"%s\")\n", line);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return -1;
	}
	return 0;
}

/* Send `sig` and wait for the exit. @return the exit status, or 128 + signal when killed. */
static int srv_stop(srv *s, int sig)
{
	int st = 0;
	if (sig)
		kill(s->pid, sig);
	if (waitpid(s->pid, &st, 0) != s->pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int http_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct timeval tv = {.tv_sec = 20}; /* a hung server fails the test instead of hanging it */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
		close(fd);
		return -1;
	}
	return fd;
}

typedef struct http_resp {
	int status;
	char head[4096]; /* status line and headers */
	char *body;	 /* malloc'd, NUL-terminated */
	size_t len;
} http_resp;

static void http_resp_free(http_resp *r)
{
	free(r->body);
	r->body = NULL;
}

/* The value of a response header (case-insensitive name), copied into out; false when absent. */
static bool http_header(const http_resp *r, const char *name, char *out, size_t n)
{
	size_t nl = strlen(name);
	for (const char *p = strstr(r->head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
		const char *h = p + 2;
		if (strncasecmp(h, name, nl) == 0 && h[nl] == ':') {
			h += nl + 1;
			while (*h == ' ')
				h++;
			size_t k = 0;
			while (h[k] && h[k] != '\r' && k + 1 < n) {
				out[k] = h[k];
				k++;
			}
			out[k] = '\0';
			return true;
		}
	}
	return false;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

/*
 * One request on an open connection. `extra` holds additional header lines, each ending in "\r\n" (or
 * NULL). With raw set, `body` is sent as is after the headers and no Content-Length is added (for
 * hand-made framing). @return 0, or -1 on a connection error (r->status 0).
 */
static int http_send(int fd, const char *method, const char *path, const char *extra, const void *body,
		     size_t len, http_resp *r)
{
	memset(r, 0, sizeof *r);
	char head[2048];
	int hn =
	    snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %zu\r\n\r\n",
		     method, path, extra ? extra : "", len);
	if (write_all(fd, head, (size_t)hn) || (len && write_all(fd, body, len)))
		return -1;
	/* Read the head. */
	size_t got = 0;
	char *end = NULL;
	while (!end) {
		if (got + 1 >= sizeof r->head)
			return -1;
		ssize_t n = recv(fd, r->head + got, sizeof r->head - 1 - got, MSG_PEEK);
		if (n <= 0)
			return -1;
		r->head[got + (size_t)n] = '\0';
		end = strstr(r->head, "\r\n\r\n");
		size_t take = end ? (size_t)(end + 4 - r->head) - got : (size_t)n;
		if (recv(fd, r->head + got, take, 0) != (ssize_t)take)
			return -1;
		got += take;
		r->head[got] = '\0';
	}
	if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1)
		return -1;
	char cl[32];
	r->len = http_header(r, "Content-Length", cl, sizeof cl) ? strtoull(cl, NULL, 10) : 0;
	r->body = malloc(r->len + 1);
	if (!r->body)
		return -1;
	for (size_t off = 0; off < r->len;) {
		ssize_t n = recv(fd, r->body + off, r->len - off, 0);
		if (n <= 0)
			return -1;
		off += (size_t)n;
	}
	r->body[r->len] = '\0';
	return 0;
}

/* One request on a fresh connection. */
static int http_do(int port, const char *method, const char *path, const char *extra, const void *body,
		   size_t len, http_resp *r)
{
	int fd = http_connect(port);
	if (fd < 0) {
		memset(r, 0, sizeof *r);
		return -1;
	}
	int rc = http_send(fd, method, path, extra, body, len, r);
	close(fd);
	return rc;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

#endif

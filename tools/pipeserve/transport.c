/*
 * pipeserve's HTTP transport: libmicrohttpd with an epoll thread pool (MHD_USE_EPOLL_INTERNAL_THREAD +
 * MHD_OPTION_THREAD_POOL_SIZE) and suspend/resume, which thread-per-connection mode does not support, on a
 * listening socket of our own; and everything between the socket and the routes (routes.c).
 *
 * A request's life here: the URI callback (on_uri) makes its ps_request and checks its raw target; the
 * first call of the access handler checks the head (framing, the target) and hands it to the routes
 * (ps_route_head); later calls collect the body, bounded by --max-body-bytes per request (413) and
 * --max-inflight-body-bytes over all requests (503); the call with no more data has the routes answer it
 * (ps_route_answer), and a call after a resume has them answer with the work's result (ps_route_resumed).
 *
 * Connections: libmicrohttpd bounds their number (in all and per address); each has a deadline entry, and
 * the reaper thread closes those that do not send a complete request in time (--request-timeout-ms, and
 * --header-timeout-ms for a head near the connection limit). libmicrohttpd's log comes through on_mhd_log,
 * which also answers in its place the one refusal it gets wrong (own_error_answer), straight on the socket.
 */
#include "config.h"

#include "transport.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "routes.h"
#include "util/clock.h"

/* Open connections and the deadline of each: the reaper closes those past it. */
typedef struct ps_transport {
	struct MHD_Daemon *mhd;
	pthread_mutex_t conns_mu; /* guards the list and every entry's since, head, reaped, answered */
	struct ps_conn *conns;
	unsigned nconns; /* in the list */
	pthread_t reaper;
	bool reaper_on;
	_Atomic bool reaper_stop;
	_Atomic uint64_t body_bytes; /* request body bytes held, bounded by max_inflight_body_bytes */
} ps_transport;

/*
 * One open connection, for the request deadline: `since` is when it began waiting for a complete request
 * (it connected, or its previous answer was queued), 0 while a complete request is being answered; `head`
 * says whether the handler has seen the head of the request it waits for (the header deadline). The
 * reaper shuts down the socket of a connection past its deadline (MHD then sees the end of the stream and
 * closes it itself); the list and `since` are under t->conns_mu. MHD's CLOSED notification, which takes
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

/* ---- connections and their deadlines ---- */

/* The connection's deadline starts at `since` (0: none), and whether the handler has seen its request's
 * head. */
static void conn_since(ps_transport *t, struct ps_conn *pc, uint64_t since, bool head)
{
	if (!pc)
		return;
	pthread_mutex_lock(&t->conns_mu);
	pc->since = since;
	pc->head = head;
	pthread_mutex_unlock(&t->conns_mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	ps_transport *t = ((ps_server *)cls)->http;
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
		pthread_mutex_lock(&t->conns_mu);
		pc->next = t->conns;
		if (t->conns)
			t->conns->prev = pc;
		t->conns = pc;
		t->nconns++;
		pthread_mutex_unlock(&t->conns_mu);
		*socket_context = pc;
		return;
	}
	if (!pc)
		return;
	pthread_mutex_lock(&t->conns_mu);
	if (pc->prev)
		pc->prev->next = pc->next;
	else
		t->conns = pc->next;
	if (pc->next)
		pc->next->prev = pc->prev;
	t->nconns--;
	pthread_mutex_unlock(&t->conns_mu);
	*socket_context = NULL;
	free(pc);
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
	ps_transport *t = s->http;
	uint64_t limit = s->cfg.request_timeout_ms * 1000000, head_limit = s->cfg.header_timeout_ms * 1000000;
	uint64_t least = head_limit < limit ? head_limit : limit;
	uint64_t step = least / 4 < 1000000 ? 1000000 : least / 4;
	if (step > 250000000)
		step = 250000000;
	pthread_t *woken = calloc(s->cfg.threads, sizeof *woken); /* this check's MHD threads woken */
	bool pressed = false;
	while (!atomic_load(&t->reaper_stop)) {
		struct timespec ts = mbt_timespec(step);
		nanosleep(&ts, NULL);
		uint64_t now = mbt_now_ns();
		unsigned nwoken = 0;
		pthread_mutex_lock(&t->conns_mu);
		unsigned open = t->nconns;
		bool was = pressed;
		pressed = (uint64_t)open * 4 >= (uint64_t)s->cfg.max_connections * 3;
		for (struct ps_conn *pc = t->conns; pc; pc = pc->next) {
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
		pthread_mutex_unlock(&t->conns_mu);
		if (pressed && !was)
			ps_log("connections: %u open of %u: those without a request head close after %llu ms",
			       open, s->cfg.max_connections, (unsigned long long)s->cfg.header_timeout_ms);
	}
	free(woken);
	return NULL;
}

/* ---- a request: its target, head and body ---- */

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
	ps_request *x = calloc(1, sizeof *x);
	if (!x)
		return NULL; /* the handler closes the connection */
	x->s = cls;
	x->conn = c;
	x->url_err = target_rule(uri);
	x->uri_end = uri + strlen(uri);
	atomic_init(&x->phase, PS_READING);
	return x;
}

/* Count `n` more body bytes against the bound of all bodies in flight. @return false when over it. */
static bool body_reserve(ps_request *x, size_t n)
{
	ps_transport *t = x->s->http;
	uint64_t max = x->s->cfg.max_inflight_body_bytes;
	uint64_t cur = atomic_load_explicit(&t->body_bytes, memory_order_relaxed);
	do {
		if (n > max || cur > max - n)
			return false;
		/* relaxed: a counter; nothing is published through it */
	} while (!atomic_compare_exchange_weak_explicit(&t->body_bytes, &cur, cur + n, memory_order_relaxed,
							memory_order_relaxed));
	x->reserved += n;
	return true;
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
	ps_transport *t = s->http;
	ps_request *x = *con_cls;
	if (!x)
		return MHD_NO; /* on_uri could not make its context: close */
	if (!x->started) {
		x->started = true;
		const union MHD_ConnectionInfo *ci =
		    MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
		x->pc = ci ? ci->socket_context : NULL;
		if (x->pc) {
			pthread_mutex_lock(&t->conns_mu);
			x->pc->head = true;
			pthread_mutex_unlock(&t->conns_mu);
		}
		ps_route_head(x, url, method);
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
		if (bad)
			return ps_route_refuse(x, bad, why);
		/* Answer on a later call, even without a body: a response queued on the first call counts as
		 * "early" (before the body) and costs the keep-alive. */
		if (!x->post)
			return MHD_YES;
		const char *cl =
		    MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		unsigned long long cln = cl ? strtoull(cl, NULL, 10) : 0;
		if (cln > s->cfg.max_body_bytes) {
			x->too_large = true;
			return ps_route_answer(x); /* before reading it (MHD then closes the connection) */
		}
		if (cln && !body_reserve(x, (size_t)cln)) {
			x->too_busy = true;
			return ps_route_answer(x);
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
	/* acquire: pairs with the routes' release when the work is done (resume_done) */
	switch (atomic_load_explicit(&x->phase, memory_order_acquire)) {
	case PS_READING:
		conn_since(t, x->pc, 0, true); /* the request is complete: no deadline while it is answered */
		return ps_route_answer(x);
	case PS_WAITING: /* not expected: we were resumed only once done */
		return MHD_YES;
	case PS_DONE:
		break;
	}
	return ps_route_resumed(x);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	ps_transport *t = ((ps_server *)cls)->http;
	ps_request *x = *con_cls;
	if (!x)
		return;
	*con_cls = NULL;
	conn_since(t, x->pc, mbt_now_ns(), false); /* the next request's deadline starts now */
	ps_route_end(x);
	if (x->reserved)
		atomic_fetch_sub_explicit(&t->body_bytes, x->reserved, memory_order_relaxed);
	ps_buf_free(&x->body);
	free(x);
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
static void own_error_answer(ps_transport *t, unsigned status)
{
	pthread_t self = pthread_self();
	struct ps_conn *hit = NULL;
	unsigned matches = 0;
	pthread_mutex_lock(&t->conns_mu);
	for (struct ps_conn *pc = t->conns; pc; pc = pc->next)
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
	pthread_mutex_unlock(&t->conns_mu);
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
		own_error_answer(((ps_server *)cls)->http, va_arg(aq, unsigned));
	va_end(aq);
	ps_log("http: %s", line);
}

/* ---- start and stop ---- */

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

int ps_transport_start(ps_server *s)
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
	ps_transport *t = calloc(1, sizeof *t);
	if (!t) {
		close(fd);
		ps_say("cannot start the HTTP server: %s", strerror(ENOMEM));
		return -ENOMEM;
	}
	pthread_mutex_init(&t->conns_mu, NULL);
	s->http = t; /* before the daemon starts: its callbacks find it there */
	/* MHD's own idle timeout, in whole seconds: a backstop behind the reaper's deadline. */
	unsigned idle_s = (unsigned)((s->cfg.request_timeout_ms + 999) / 1000);
	unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	/* MHD_OPTION_STRICT_FOR_CLIENT 0: HTTP/1.1 without Host and spaces in the URL reach the handler, which
	 * refuses them with JSON (check_framing, target_rule); MHD's own refusals are HTML, and without Host it
	 * writes its status line twice. */
	t->mhd = MHD_start_daemon(/* the logger first: it takes the messages about the options too */
				  flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
				  s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE,
				  (unsigned)s->cfg.threads, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				  MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
				  MHD_OPTION_CONNECTION_TIMEOUT, idle_s, MHD_OPTION_CONNECTION_LIMIT,
				  s->cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
				  s->cfg.max_conns_per_ip, MHD_OPTION_STRICT_FOR_CLIENT, (int)0,
				  MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_END);
	if (!t->mhd) { /* its reason, if it gave one, is in the log above */
		ps_say("cannot start the HTTP server on port %u (%s)", s->cfg.port, s->cfg.host);
		ps_transport_stop(s);
		return -EIO;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(t->mhd, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di ? di->port : s->cfg.port;
	t->reaper_on = pthread_create(&t->reaper, NULL, reaper_main, s) == 0;
	if (!t->reaper_on)
		ps_log("cannot start the request deadline thread: idle connections close after %u s", idle_s);
	return 0;
}

void ps_transport_stop(ps_server *s)
{
	ps_transport *t = s->http;
	if (!t)
		return;
	if (t->reaper_on) {
		atomic_store(&t->reaper_stop, true);
		pthread_join(t->reaper, NULL);
	}
	if (t->mhd)
		MHD_stop_daemon(t->mhd);
	pthread_mutex_destroy(&t->conns_mu);
	free(t);
	s->http = NULL;
}

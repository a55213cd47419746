/*
 * pipeserve's HTTP transport (transport.c): the listening socket, libmicrohttpd's daemon and its threads,
 * the connection limits and deadlines (the reaper), the checks on a request's head and the collection of
 * its body, before the routes (routes.h) answer it. Its state is its own (struct ps_transport, s->http).
 */
#ifndef PIPESERVE_TRANSPORT_H
#define PIPESERVE_TRANSPORT_H

#include "server.h"

/* Start listening (cfg.host, cfg.port) and serving; s->port receives the bound port. Pair with
 * ps_transport_stop() (a failed start has undone itself). @return 0, PS_EUSAGE (--host, said) or -errno
 * (said). */
int ps_transport_start(ps_server *s);

/* Stop serving and close every connection: call once no request is suspended. Accepts a server whose
 * transport never started. */
void ps_transport_stop(ps_server *s);

#endif

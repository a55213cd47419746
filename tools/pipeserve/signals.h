/*
 * The stop signals (signals.c): SIGINT and SIGTERM are blocked in every thread from before the libraries
 * start theirs, and taken by the main thread alone: the first one starts the drain, a second one during it
 * exits at once with status 1. SIGPIPE is ignored while serving (a client that closes early makes a send
 * fail with EPIPE, not end the process).
 */
#ifndef PIPESERVE_SIGNALS_H
#define PIPESERVE_SIGNALS_H

#include <stdint.h>

/* Before serving: ignore SIGPIPE. */
void ps_signals_init(void);

/* Wait for the first stop signal (one that came during the start-up is taken at once). @return it. */
int ps_signals_wait(void);

/* Sleep `ns` nanoseconds, or less: a stop signal meanwhile, the second one, is logged and exits the
 * process at once with status 1. */
void ps_signals_nap(uint64_t ns);

#endif

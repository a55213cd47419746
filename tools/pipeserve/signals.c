/*
 * The stop signals: see signals.h.
 *
 * The mask is set from .preinit_array, before the constructors of the shared libraries, so that every
 * thread inherits it and sigwait in the main thread alone takes the signals; a thread that unblocks them
 * itself has them forwarded to the main thread by the handler. The signals never run code of ours but that
 * forwarding: the drain and the exit happen on the main thread, between its sigwait calls.
 */
#include "config.h"

#include "signals.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server.h"
#include "util/clock.h"

static pthread_t main_thread;

/* The stop signals: SIGINT and SIGTERM. */
static void stop_set(sigset_t *sigs)
{
	sigemptyset(sigs);
	sigaddset(sigs, SIGINT);
	sigaddset(sigs, SIGTERM);
}

/* A stop signal taken by a thread that does not block it (one that unblocked it itself): pending for the
 * main thread's sigwait instead. pthread_kill is async-signal-safe (POSIX.1-2008 TC1). */
static void forward_stop(int sig)
{
	int saved = errno;
	pthread_kill(main_thread, sig);
	errno = saved;
}

/*
 * Block SIGINT and SIGTERM before any thread starts, so that every thread inherits the mask and the main
 * thread's sigwait alone takes them. This runs from .preinit_array, before the constructors of the shared
 * libraries: OpenBLAS starts its thread pool in its constructor, before main, and a stop signal the kernel
 * handed one of those threads took its default action (exit 143) when main blocked the signals only later.
 * A signal that comes while the server starts stays pending until it listens, then stops it cleanly (exit
 * 0); one that comes before this runs, while the dynamic loader maps the libraries, still takes its default
 * action. The handler also undoes a SIG_IGN inherited from the parent (a shell's background job ignores
 * SIGINT), which would make sigwait miss the signal.
 */
static void block_stop_signals(void)
{
	sigset_t sigs;
	stop_set(&sigs);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	main_thread = pthread_self();
	struct sigaction sa = {.sa_handler = forward_stop};
	sigfillset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

__attribute__((used,
	       section(".preinit_array"))) static void (*const preinit_block)(void) = block_stop_signals;

void ps_signals_init(void)
{
	signal(SIGPIPE, SIG_IGN);
}

int ps_signals_wait(void)
{
	sigset_t sigs;
	stop_set(&sigs);
	int sig = 0;
	while (sigwait(&sigs, &sig) != 0)
		;
	return sig;
}

void ps_signals_nap(uint64_t ns)
{
	sigset_t sigs;
	stop_set(&sigs);
	struct timespec ts = mbt_timespec(ns);
	int sig = sigtimedwait(&sigs, NULL, &ts);
	if (sig > 0) {
		ps_log("second signal (%s) while draining: exiting now", strsignal(sig));
		_exit(1);
	}
}

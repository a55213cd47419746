/*
 * Futex, membarrier and the backoff's slow steps. See wait.h for the handshake.
 */
#include "config.h"

#include <errno.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "wait.h"

bool mbp__membarrier_ok;
static pthread_once_t membarrier_once = PTHREAD_ONCE_INIT;

/* The fallback heavy fence's page, locked in memory so that its entry is always present and a change of
 * its protection always has to be shot down; the lock keeps two fences from interleaving their changes. */
static volatile unsigned char *shootdown_page;
static size_t shootdown_bytes;
static pthread_mutex_t shootdown_lock = PTHREAD_MUTEX_INITIALIZER;

static void membarrier_probe(void)
{
	shootdown_bytes = (size_t)sysconf(_SC_PAGESIZE);
	void *page = mmap(NULL, shootdown_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MBP_VERIFY(page != MAP_FAILED);
	(void)mlock(page,
		    shootdown_bytes); /* best effort: the write before each change faults it in anyway */
	shootdown_page = page;
#ifdef MBP_TSAN
	mbp__membarrier_ok = false; /* TSan does not model membarrier: the publishers fence instead */
#else
	long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
	mbp__membarrier_ok = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
			     syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
}

void mbp__wait_global_init(void)
{
	pthread_once(&membarrier_once, membarrier_probe);
}

/* Interrupt every CPU that runs a thread of this process: make the page writable, dirty it, take every
 * access away again; the kernel must flush the stale entry from every CPU that may hold it. */
static void shootdown(void)
{
	MBP_VERIFY(pthread_mutex_lock(&shootdown_lock) == 0);
	MBP_VERIFY(mprotect((void *)shootdown_page, shootdown_bytes, PROT_READ | PROT_WRITE) == 0);
	shootdown_page[0]++;
	MBP_VERIFY(mprotect((void *)shootdown_page, shootdown_bytes, PROT_NONE) == 0);
	MBP_VERIFY(pthread_mutex_unlock(&shootdown_lock) == 0);
}

void mbp__heavy_fence(void)
{
	mbp__full_fence(); /* this thread's flag store before what the other CPUs see next */
	if (mbp__membarrier_ok) {
		/* Executes a full barrier on every CPU running a thread of this process. It cannot fail once
		 * registered: verify instead of guessing. */
		long rc = syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
		MBP_VERIFY(rc == 0);
	} else {
		shootdown();
	}
	mbp__full_fence();
}

int mbp__futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t deadline)
{
	struct timespec ts, *tsp = NULL;
	if (deadline != UINT64_MAX) {
		uint64_t now = mbp__now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		ts = mbp__timespec(deadline - now);
		tsp = &ts;
	}
	long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, tsp, NULL, 0);
	if (rc == -1 && errno == ETIMEDOUT)
		return -ETIMEDOUT;
	return 0; /* woken, value changed (EAGAIN) or interrupted (EINTR): the caller re-checks */
}

void mbp__futex_wake(_Atomic uint32_t *word, int n)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

enum mbp__backoff_next mbp__backoff_step(struct mbp__backoff *b, const struct mbp__wait_opts *o)
{
	b->iter++;
	/* Spinning: one pause per step, so the caller re-checks its condition after each pause (a step of
	 * 32 pauses made a waiter see an item up to 2 us late), and the clock only once every
	 * MBP__SPIN_STEPS_PER_CLOCK steps. Every yield is a syscall anyway, so read it every time there. */
	if (b->spin_left) {
		b->spin_left--;
		mbp__cpu_relax();
		return MBP__BACKOFF_AGAIN;
	}
	uint64_t now = mbp__now_ns();
	if (b->start == 0)
		b->start = now;
	uint64_t elapsed = now - b->start;
	if (!o->no_spin && elapsed < o->spin_ns) {
		b->spin_left = MBP__SPIN_STEPS_PER_CLOCK - 1;
		mbp__cpu_relax();
		return MBP__BACKOFF_AGAIN;
	}
	uint64_t spin = o->no_spin ? 0 : o->spin_ns;
	if (elapsed < spin + o->yield_ns) {
		sched_yield();
		return MBP__BACKOFF_AGAIN;
	}
	return MBP__BACKOFF_PARK;
}

int mbp__parker_sleep(struct mbp__parker *pk, uint64_t deadline)
{
	int rc = 0;
	/* relaxed: the flag carries no data; the waker published its data with its own release store and
	 * the caller re-checks its condition with an acquire load after this returns */
	while (atomic_load_explicit(&pk->parked, memory_order_relaxed)) {
		rc = mbp__futex_wait(&pk->parked, 1, deadline);
		if (rc == -ETIMEDOUT)
			break;
	}
	atomic_store_explicit(&pk->parked, 0, memory_order_relaxed); /* relaxed: as above */
	return rc;
}

int mbp__wait_until(struct mbp__parker *pk, const struct mbp__wait_opts *o, bool (*ready)(void *), void *arg,
		    void (*idle)(void *), uint64_t deadline)
{
	return mbp__wait_for(pk, o, ready, arg, idle, arg, deadline);
}

/* The wait's abort word is raised. */
static inline bool aborted(const struct mbp__wait_opts *o)
{
	/* acquire; partner: the release store that raised it (the trainer's fail()): what the raiser wrote
	 * before it (the step's error) is visible to the waiter that stops */
	return o->abort && atomic_load_explicit(o->abort, memory_order_acquire) != 0;
}

int mbp__wait_for(struct mbp__parker *pk, const struct mbp__wait_opts *o, bool (*ready)(void *),
		  void *ready_arg, void (*idle)(void *), void *idle_arg, uint64_t deadline)
{
	struct mbp__backoff b;
	mbp__backoff_init(&b);
	for (;;) {
		if (ready(ready_arg))
			return 0;
		if (aborted(o))
			return -ECANCELED;
		if (deadline != UINT64_MAX && mbp__now_ns() >= deadline)
			return -ETIMEDOUT;
		if (mbp__backoff_step(&b, o) == MBP__BACKOFF_AGAIN)
			continue;
		if (idle)
			idle(idle_arg);
		mbp__parker_prepare(pk);
		/* the re-check after the heavy fence: a publisher (or an abort) that missed the flag */
		if (ready(ready_arg) || aborted(o)) {
			mbp__parker_cancel(pk);
			continue; /* the loop's first checks say which */
		}
		mbp__parker_sleep(pk, deadline);
	}
}

uint32_t mbp__gen_wait(_Atomic uint32_t *w, uint32_t seen)
{
	uint32_t g;
	while ((g = mbp__gen_get(w)) == seen)
		mbp__futex_wait(w, seen, UINT64_MAX); /* returns at once when *w moved meanwhile */
	return g;
}

uint32_t mbp__gen_wait_spin(_Atomic uint32_t *w, uint32_t seen, const struct mbp__wait_opts *o)
{
	uint32_t g = mbp__gen_get(w);
	/* the clock once every MBP__SPIN_STEPS_PER_CLOCK pauses, as the backoff reads it */
	for (uint64_t t0 = mbp__now_ns(), k = 0; g == seen && !o->no_spin && o->spin_ns;
	     g = mbp__gen_get(w)) {
		if (++k % MBP__SPIN_STEPS_PER_CLOCK == 0 && mbp__now_ns() - t0 >= o->spin_ns)
			break;
		mbp__cpu_relax();
	}
	return g == seen ? mbp__gen_wait(w, seen) : g;
}

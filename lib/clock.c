/*
 * The engine's clock for accounting (busy, starved and blocked time, the trace, the statistics window):
 * its calibration. The clocks themselves are inline in lib/clock.h.
 *
 * A pipeline reads the clock twice per micro-batch and stage. clock_gettime(CLOCK_MONOTONIC) costs about
 * 34 ns on the KVM guests here and rdtsc about 13 ns, which is a fifth of a hop's whole overhead. So where
 * the kernel itself keeps time with the TSC (its clocksource is "tsc": the TSC is invariant and in step
 * across CPUs), the engine reads the TSC and scales it to nanoseconds with a factor calibrated against
 * CLOCK_MONOTONIC over 2 ms at the first pipeline's creation; elsewhere it reads CLOCK_MONOTONIC. Only
 * differences of this clock are meaningful; deadlines and a job's submit/done times use CLOCK_MONOTONIC.
 */
#include "config.h"

#include <pthread.h>
#include <string.h>

#include "common.h"

struct mbp__tsc mbp__tsc;
static pthread_once_t clock_once = PTHREAD_ONCE_INIT;

static bool kernel_uses_tsc(void)
{
	FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
	if (!f)
		return false;
	char name[32] = "";
	bool tsc =
	    fgets(name, sizeof(name), f) && strncmp(name, "tsc", 3) == 0 && (name[3] == '\n' || !name[3]);
	fclose(f);
	return tsc;
}

static void calibrate(void)
{
#if defined(__x86_64__)
	if (!kernel_uses_tsc())
		return;
	uint64_t t0 = mbp__now_ns(), c0 = __builtin_ia32_rdtsc(), t1, c1;
	do {
		t1 = mbp__now_ns();
		c1 = __builtin_ia32_rdtsc();
	} while (t1 - t0 < 2000000);
	if (c1 <= c0)
		return;
	mbp__tsc.mult = (uint64_t)(((unsigned __int128)(t1 - t0) << 32) / (c1 - c0));
	mbp__tsc.base_tsc = c1;
	mbp__tsc.base_ns = t1;
	/* Plain stores: every reader comes after this through pthread_once (mbp_pipeline_new) or through a
	 * thread created afterwards (the pipeline's workers), both of which order them. */
	mbp__tsc.ok = mbp__tsc.mult != 0;
#endif
}

void mbp__clock_init(void)
{
	pthread_once(&clock_once, calibrate);
}

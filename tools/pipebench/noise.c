/*
 * pipebench noise: how much of the CPUs the stages use other processes take, before and during a run,
 * and the load average (pb_loadavg, which the other files print beside it).
 *
 * /proc/stat counts, per CPU, the clock ticks spent busy (user, nice, system, irq, softirq) and stolen by
 * the hypervisor (steal). Over an interval, the busy time of the watched CPUs minus this process's own CPU
 * time is what everything else took; steal is time the guest did not get at all. The load average is
 * slow (a minute's decay: it stays high long after a build ends), so it is reported but not used to
 * decide. Ticks are 10 ms, so a window of 0.25 s on 2 CPUs resolves 2% of the machine; the threshold is
 * 10% of the watched CPUs' time.
 *
 * Before measuring, the tool waits for three quiet windows in a row, at most --wait-quiet seconds; during
 * the measurement the rounds of the schedule are sampled, joined into windows of at least 0.5 s, and the
 * rows whose repeats ran in loud windows are flagged. After a loud window the schedule pauses until a
 * quiet one, out of what is left of --wait-quiet, so that fewer repeats are taken while it is loud.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pipebench.h"

#define WINDOW_NS   250000000ull /* before measuring, and pausing */
#define ROUND_NS    500000000ull /* while measuring: rounds joined until this long */
#define QUIET_AFTER 3		 /* windows in a row */

double pb_loadavg(void)
{
	double load = -1;
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf", &load) != 1)
			load = -1;
		fclose(f);
	}
	return load;
}

static bool watched(const pb_noise *nz, int cpu)
{
	for (unsigned i = 0; i < nz->ncpus; i++)
		if (nz->cpus[i] == cpu)
			return true;
	return false;
}

static void snap(const pb_noise *nz, pb_noise_snap *s)
{
	memset(s, 0, sizeof(*s));
	s->wall_ns = mbt_now_ns();
	s->self_ns = mbt_clock_ns(CLOCK_PROCESS_CPUTIME_ID);
	FILE *f = fopen("/proc/stat", "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		int cpu;
		unsigned long long v[8] = {0};
		if (strncmp(line, "cpu", 3) || line[3] < '0' || line[3] > '9')
			continue;
		if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1], &v[2],
			   &v[3], &v[4], &v[5], &v[6], &v[7]) < 9)
			continue;
		if (!watched(nz, cpu))
			continue;
		/* user nice system idle iowait irq softirq steal */
		s->busy += v[0] + v[1] + v[2] + v[5] + v[6];
		s->steal += v[7];
		s->ok = true;
	}
	fclose(f);
}

static void between(const pb_noise_snap *a, const pb_noise_snap *b, pb_noise_sample *out)
{
	static long hz;
	if (!hz)
		hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
	double secs = (double)(b->wall_ns - a->wall_ns) / 1e9;
	out->seconds = secs;
	out->load1 = pb_loadavg();
	if (!a->ok || !b->ok || secs <= 0) {
		out->others = out->steal = 0;
		return;
	}
	double busy_s = (double)(b->busy - a->busy) / (double)hz;
	double self_s = (double)(b->self_ns - a->self_ns) / 1e9;
	double others = (busy_s - self_s) / secs;
	out->others = others > 0 ? others : 0;
	out->steal = (double)(b->steal - a->steal) / (double)hz / secs;
}

void pb_noise_init(pb_noise *nz, const int *cpus, unsigned ncpus)
{
	memset(nz, 0, sizeof(*nz));
	memcpy(nz->cpus, cpus, ncpus * sizeof(int));
	nz->ncpus = ncpus;
	nz->threshold = 0.1 * ncpus;
	nz->before.load1 = -1;
	pb_noise_snap s;
	snap(nz, &s);
	nz->available = s.ok;
}

bool pb_noise_loud(const pb_noise *nz, const pb_noise_sample *s)
{
	return s->others + s->steal > nz->threshold;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = mbt_timespec(ns);
	while (nanosleep(&ts, &ts))
		;
}

void pb_noise_settle(pb_noise *nz, double max_wait_s)
{
	const uint64_t t0 = mbt_now_ns();
	unsigned quiet = 0;
	pb_noise_snap a, b;
	if (!nz->available) {
		nz->before.load1 = pb_loadavg();
		nz->quiet_before = true;
		return;
	}
	snap(nz, &a);
	for (;;) {
		sleep_ns(WINDOW_NS);
		snap(nz, &b);
		between(&a, &b, &nz->before);
		a = b;
		quiet = pb_noise_loud(nz, &nz->before) ? 0 : quiet + 1;
		double waited = (double)(b.wall_ns - t0) / 1e9;
		if (quiet >= QUIET_AFTER || waited >= max_wait_s) {
			nz->quiet_before = quiet > 0;
			/* the quiet windows at the end had to pass anyway: they are not waiting */
			nz->waited_s = waited - quiet * (WINDOW_NS / 1e9);
			if (nz->waited_s < 0.01)
				nz->waited_s = 0;
			return;
		}
		if (quiet == 0) {
			char what[48];
			snprintf(what, sizeof(what), "settling: others %.1f CPU",
				 nz->before.others + nz->before.steal);
			pb_progress((uint64_t)(waited * 1000), (uint64_t)(max_wait_s * 1000), what);
		}
	}
}

double pb_noise_pause(pb_noise *nz, double max_s)
{
	const uint64_t t0 = mbt_now_ns();
	pb_noise_snap a, b;
	pb_noise_sample s;
	double waited = 0;
	snap(nz, &a);
	while (waited + WINDOW_NS / 1e9 <= max_s) {
		sleep_ns(WINDOW_NS);
		snap(nz, &b);
		between(&a, &b, &s);
		a = b;
		waited = (double)(b.wall_ns - t0) / 1e9;
		if (!pb_noise_loud(nz, &s))
			break;
		char what[48];
		snprintf(what, sizeof(what), "paused: others %.1f CPU", s.others + s.steal);
		pb_progress((uint64_t)(waited * 1000), (uint64_t)(max_s * 1000), what);
	}
	nz->paused_s += waited;
	nz->pauses += waited > 0;
	nz->mark = a; /* the pause is no round's */
	return waited;
}

void pb_noise_mark(pb_noise *nz)
{
	snap(nz, &nz->mark);
}

int pb_noise_round(pb_noise *nz, bool last)
{
	pb_noise_snap now;
	pb_noise_sample s;
	snap(nz, &now);
	if (now.wall_ns - nz->mark.wall_ns < ROUND_NS && !last)
		return -1; /* too short for 10 ms ticks: the next rounds join this window */
	if (now.wall_ns - nz->mark.wall_ns < ROUND_NS / 4 && nz->rounds)
		return nz->last_loud; /* a short tail: as the window before it */
	between(&nz->mark, &now, &s);
	nz->mark = now;
	bool loud = pb_noise_loud(nz, &s);
	nz->rounds++;
	nz->loud_rounds += loud;
	nz->others_s += s.others * s.seconds;
	nz->steal_s += s.steal * s.seconds;
	nz->seconds += s.seconds;
	if (s.others + s.steal > nz->others_max)
		nz->others_max = s.others + s.steal;
	nz->last_loud = loud;
	return loud;
}

int pb_noise_step(pb_noise *nz, pb_noise_window *w, unsigned units, bool last)
{
	w->paused_s = 0;
	int loud = pb_noise_round(nz, last);
	if (loud < 0)
		return loud;
	w->first = w->end;
	w->end = units;
	if (loud == 1 && !last && w->pause_left > 0) {
		w->paused_s = pb_noise_pause(nz, w->pause_left);
		w->pause_left -= w->paused_s;
	}
	return loud;
}

/*
 * bench_limits: the machine's own floors under three of perf/RESULTS.md's figures, with no mbpipe code in
 * the loop, so that a row can say what fraction of the limit it reaches (issue 22):
 *
 *   pingpong  two threads pinned to CPUs 0 and 1 bounce a counter through two cache lines (the lead
 *             writes line A, the echo waits for it and writes line B, the lead waits for that): ns per
 *             round trip, the least any pair of queues can cost for one item there and back (bench_ring's
 *             rtt: two rings, at least one line each way).
 *   freelist  one thread pops a buffer from a thread-local LIFO array, writes one byte of it and pushes
 *             it back: ns per pair, the least a buffer cache can cost (bench_pool part 1's get+put).
 *   handoff   one buffer written all over (memset) and then read all over (bench_byte_sum, the loop that
 *             bench_pool's stage 2 reads with) on CPU 0, at 16, 64 and 256 KiB: ns of the write plus the
 *             read with every line in this core's cache, the least any recycling order can make bench_pool
 *             part 2's wr+rd cost (no line comes from the other core, no allocator, no ring).
 *
 * Each round is one measurement (freelist: the mean over its repetitions; pingpong: the median of its
 * chunks of 64 round trips, and the least chunk; handoff: the median over its items); rounds alternate the
 * modes; the table gives the median and the least over the rounds. On a shared machine the least is the
 * floor; the median says how much the load took.
 *
 * Usage: bench_limits [-r rounds] [-n round_trips] [-k pingpong,freelist,handoff]
 * (-n: round trips per pingpong round, default 200000; freelist runs 50 times as many pairs.)
 * Output: a table, then one line `bench_limits: key=value ...`. Needs CPU 0, and CPU 1 for pingpong;
 * exit 1 when a payload does not add up, 2 on a bad option or a CPU it cannot pin to.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define MAX_ROUNDS 64
#define LINE	   64
#define N_SIZES	   3
static const size_t sizes[N_SIZES] = {16u << 10, 64u << 10, 256u << 10};
#define HANDOFF_ITEMS 400u

static void pin_or_die(int cpu)
{
	if (!bench_pin(cpu)) {
		fprintf(stderr, "bench_limits: cannot pin to CPU %d (needs CPUs 0 and 1)\n", cpu);
		exit(2);
	}
}

/* One pause per failed check, as bench_ring's loops wait (a spin without it slows the writer's store). */
static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/* ---- pingpong ------------------------------------------------------------------------------------- */

/* a and b 128 bytes apart, so that a prefetch of a line's pair never moves the other side's line too */
struct pp {
	_Alignas(2 * LINE) _Atomic uint64_t a; /* written by the lead only */
	_Alignas(2 * LINE) _Atomic uint64_t b; /* written by the echo only */
	uint64_t n;
	pthread_barrier_t go;
};

static void *pp_echo(void *arg)
{
	struct pp *p = arg;
	pin_or_die(1);
	pthread_barrier_wait(&p->go);
	for (uint64_t i = 1; i <= p->n; i++) {
		/* acquire/release: a queue's item hand-over; the lead's store of a is the partner */
		while (atomic_load_explicit(&p->a, memory_order_acquire) != i)
			relax();
		atomic_store_explicit(&p->b, i, memory_order_release);
	}
	return NULL;
}

/* n round trips in chunks of PP_CHUNK; *med and *min: the median and the least chunk, ns per round trip
 * (a chunk is some 6 us here: one the scheduler interrupts stands out, and the least is the floor). */
#define PP_CHUNK      64u
#define PP_MAX_CHUNKS 4096u
static void pingpong(uint64_t n, double *med, double *min)
{
	static struct pp p;
	static double chunk[PP_MAX_CHUNKS];
	uint64_t chunks = n / PP_CHUNK < PP_MAX_CHUNKS ? n / PP_CHUNK : PP_MAX_CHUNKS;
	if (chunks == 0)
		chunks = 1;
	atomic_store(&p.a, 0);
	atomic_store(&p.b, 0);
	p.n = chunks * PP_CHUNK;
	pthread_barrier_init(&p.go, NULL, 2);
	pthread_t t;
	if (pthread_create(&t, NULL, pp_echo, &p) != 0)
		exit(2);
	pthread_barrier_wait(&p.go);
	uint64_t i = 0;
	for (uint64_t c = 0; c < chunks; c++) {
		uint64_t t0 = mbt_now_ns();
		for (uint64_t end = i + PP_CHUNK; i < end;) {
			i++;
			/* release: pairs with the echo's acquire of a */
			atomic_store_explicit(&p.a, i, memory_order_release);
			while (atomic_load_explicit(&p.b, memory_order_acquire) != i)
				relax();
		}
		chunk[c] = (double)(mbt_now_ns() - t0) / PP_CHUNK;
	}
	pthread_join(t, NULL);
	pthread_barrier_destroy(&p.go);
	*med = bench_median(chunk, (unsigned)chunks); /* (of the first BENCH_MEDIAN_MAX chunks) */
	*min = chunk[0];
	for (uint64_t c = 1; c < chunks; c++)
		*min = chunk[c] < *min ? chunk[c] : *min;
}

/* ---- freelist ------------------------------------------------------------------------------------- */

#define FL_BUFS 8
struct freelist {
	void *slot[FL_BUFS];
	unsigned top;
};

static __attribute__((noinline)) void *fl_get(struct freelist *f)
{
	return f->top ? f->slot[--f->top] : NULL;
}

static __attribute__((noinline)) void fl_put(struct freelist *f, void *p)
{
	f->slot[f->top++] = p;
}

static double freelist(uint64_t n, size_t size)
{
	struct freelist f = {.top = 0};
	for (int i = 0; i < FL_BUFS; i++) {
		void *b = aligned_alloc(LINE, size);
		if (!b)
			exit(2);
		memset(b, 0, size);
		fl_put(&f, b);
	}
	uint64_t t0 = mbt_now_ns();
	for (uint64_t i = 0; i < n; i++) {
		unsigned char *b = fl_get(&f);
		b[0] = (unsigned char)i; /* the one byte bench_pool's get+put writes */
		__asm__ volatile("" ::"r"(b) : "memory");
		fl_put(&f, b);
	}
	uint64_t t1 = mbt_now_ns();
	while (f.top)
		free(fl_get(&f));
	return (double)(t1 - t0) / (double)n;
}

/* ---- handoff -------------------------------------------------------------------------------------- */

/* The median write and read (ns) of one buffer written and then read on the calling CPU, over
 * HANDOFF_ITEMS items: the phases with every line already in this core's cache. */
static void handoff(size_t size, double *wr, double *rd, uint64_t *bad)
{
	static double t_write[HANDOFF_ITEMS], t_read[HANDOFF_ITEMS];
	unsigned char *buf = aligned_alloc(4096, size);
	if (!buf)
		exit(2);
	memset(buf, 0, size);
	for (uint64_t i = 1; i <= HANDOFF_ITEMS; i++) {
		uint64_t t0 = mbt_now_ns();
		memset(buf, (int)(i & 0xff), size);
		uint64_t t1 = mbt_now_ns();
		if (bench_byte_sum(buf, size) != (uint64_t)(i & 0xff) * size)
			(*bad)++;
		t_read[i - 1] = (double)(mbt_now_ns() - t1);
		t_write[i - 1] = (double)(t1 - t0);
	}
	*wr = bench_median(t_write, HANDOFF_ITEMS);
	*rd = bench_median(t_read, HANDOFF_ITEMS);
	free(buf);
}

/* ---- main ----------------------------------------------------------------------------------------- */

struct st {
	double med, min;
};

static struct st stat_of(const double *v, unsigned n)
{
	struct st s = {bench_median(v, n), v[0]};
	for (unsigned i = 1; i < n; i++)
		s.min = v[i] < s.min ? v[i] : s.min;
	return s;
}

int main(int argc, char **argv)
{
	unsigned rounds = 15;
	uint64_t trips = 200000;
	const char *kinds = "pingpong,freelist,handoff";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-r") && i + 1 < argc)
			rounds = (unsigned)bench_opt_u64("-r", argv[++i], 1, MAX_ROUNDS);
		else if (!strcmp(argv[i], "-n") && i + 1 < argc)
			trips = bench_opt_u64("-n", argv[++i], 1, 100000000);
		else if (!strcmp(argv[i], "-k") && i + 1 < argc)
			kinds = argv[++i];
		else {
			fprintf(stderr,
				"usage: bench_limits [-r rounds 1..%d] [-n round_trips] "
				"[-k pingpong,freelist,handoff]\n",
				MAX_ROUNDS);
			return 2;
		}
	}
	bool do_pp = false, do_fl = false, do_ho = false;
	char list[256];
	snprintf(list, sizeof list, "%s", kinds);
	for (char *save = NULL, *k = strtok_r(list, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
		if (!strcmp(k, "pingpong"))
			do_pp = true;
		else if (!strcmp(k, "freelist"))
			do_fl = true;
		else if (!strcmp(k, "handoff"))
			do_ho = true;
		else {
			fprintf(stderr, "bench_limits: -k: '%s' is none of pingpong, freelist, handoff\n", k);
			return 2;
		}
	}
	if (!do_pp && !do_fl && !do_ho) {
		fprintf(stderr, "bench_limits: -k: no mode in '%s' (pingpong, freelist, handoff)\n", kinds);
		return 2;
	}
	static double pp[MAX_ROUNDS], ppmin[MAX_ROUNDS], fl[MAX_ROUNDS], wr[N_SIZES][MAX_ROUNDS],
	    rd[N_SIZES][MAX_ROUNDS];
	uint64_t bad = 0;
	double load0[3], load1[3];
	bench_loadavg(load0);
	bench_others oth = bench_others_start();
	pin_or_die(0);
	for (unsigned r = 0; r < rounds; r++) {
		if (do_pp)
			pingpong(trips, &pp[r], &ppmin[r]);
		if (do_fl)
			fl[r] = freelist(trips * 50, 64u << 10);
		for (int s = 0; do_ho && s < N_SIZES; s++)
			handoff(sizes[s], &wr[s][r], &rd[s][r], &bad);
	}
	double others = bench_others_cpus(oth);
	bench_loadavg(load1);
	printf("%-34s %10s %10s\n", "floor", "median", "min");
	struct st spp = {0}, sfl = {0}, sho[N_SIZES] = {{0}};
	if (do_pp) {
		spp = stat_of(pp, rounds);
		spp.min = stat_of(ppmin, rounds).min;
		printf("%-34s %10.1f %10.1f\n", "pingpong ns per round trip", spp.med, spp.min);
	}
	if (do_fl) {
		sfl = stat_of(fl, rounds);
		printf("%-34s %10.2f %10.2f\n", "freelist ns per get+put", sfl.med, sfl.min);
	}
	for (int s = 0; do_ho && s < N_SIZES; s++) {
		double sum[MAX_ROUNDS];
		for (unsigned r = 0; r < rounds; r++)
			sum[r] = wr[s][r] + rd[s][r];
		sho[s] = stat_of(sum, rounds);
		struct st w = stat_of(wr[s], rounds), d = stat_of(rd[s], rounds);
		char name[64];
		snprintf(name, sizeof name, "handoff %zu KiB, 1 CPU, wr+rd ns", sizes[s] >> 10);
		printf("%-34s %10.0f %10.0f   (wr %.0f / %.0f, rd %.0f / %.0f)\n", name, sho[s].med,
		       sho[s].min, w.med, w.min, d.med, d.min);
	}
	printf("load %.2f -> %.2f, others %.2f CPUs, %u rounds\n", load0[0], load1[0], others, rounds);
	printf("bench_limits: rounds=%u pingpong_ns=%.1f pingpong_min_ns=%.1f freelist_ns=%.2f "
	       "freelist_min_ns=%.2f",
	       rounds, spp.med, spp.min, sfl.med, sfl.min);
	for (int s = 0; s < N_SIZES; s++)
		printf(" handoff%zuk_ns=%.0f handoff%zuk_min_ns=%.0f", sizes[s] >> 10, sho[s].med,
		       sizes[s] >> 10, sho[s].min);
	printf(" others=%.2f load=%.2f failures=%llu\n", others, load1[0], (unsigned long long)bad);
	return bad ? 1 : 0;
}

/*
 * bench_roofline: what OpenBLAS's matrix product reaches (GFLOP/s) on one core and on two at the shapes
 * the inference stream's stages compute, so that every MLP figure has a fraction of the 2-core limit.
 *
 * A shape is a layer's product (perf/bench_blas.h): fwd (y = x W^T onto the bias), dx (dz W) or dw
 * (dW += dz^T x) at rows x in -> out, 2 rows in out flops. By default: fwd at 1, 8, 16, 32, 64, 128 and
 * 256 rows x 1024 -> 1024, bench_mlp's MLP and the micro-batches its stream is cut into; -s names others,
 * e.g. pipetrain's: -s fwd:32x784x1024,dx:32x1024x1024,dw:32x1024x1024 (the limit of a whole training
 * step, every product at its micro-batch, is bench_mlp_train --roofline's).
 *
 * Each shape is measured three ways (five for fwd) (rounds alternate them; medians of the rounds):
 *
 *   blas1    OpenBLAS on one thread, pinned to the first allowed CPU
 *   blas2    one OpenBLAS call on as many threads as allowed CPUs (what a user calls for both cores)
 *   blas1x2  one pinned thread per allowed CPU, each running its own single-threaded calls on its own
 *            operands (pipeline stages that compute nothing else: OpenBLAS's 2-core limit; the sum)
 *   packed1, packed1x2  (fwd, on CPUs with AVX2 and FMA) blas1 and blas1x2 with the library's packed
 *            kernel (lib/model/dense.c) over weights packed once per copy, as a version's are
 *
 * The big operand (W, or dW for dw) cycles through -w copies (default 8, 32 MiB at 1024 x 1024: the
 * MLP's 8 layers, which do not fit the 1-2 MiB L2 of a core), each thread of blas1x2 through its share of
 * them (a stage's layers); -w 1 measures it hot in cache. The peak line is one core's fused multiply-add
 * loop with the widest vectors the CPU has (the machine's limit); the 2-core limit is twice it.
 *
 *   bench_roofline [-r rounds] [-t seconds] [-w copies] [-s op:ROWSxINxOUT,...]
 *
 * Prints a table, then one grep-able summary line with fixed keys: <op>_<rows>x<in>x<out>_<mode>=GFLOP/s.
 */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include <mbpipe.h>

#include "bench_blas.h"
#include "bench_util.h"
#include "util/plural.h"

#define MAX_SHAPES   64
#define MAX_ROUNDS   64
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *const op_name[] = {"fwd", "dx", "dw"};
enum mode { BLAS1, BLAS2, BLAS1X2, PACK1, PACK1X2, NMODES };
static const char *const mode_name[] = {"blas1", "blas2", "blas1x2", "packed1", "packed1x2"};

struct shape {
	enum bench_op op;
	uint32_t rows, in, out;
	double g[NMODES][MAX_ROUNDS]; /* GFLOP/s per round */
	double med[NMODES];
};

static struct {
	unsigned rounds, copies, nshapes;
	double seconds;
	int ncpus, cpus[MBP_MAX_CPUS];
	cpu_set_t all;
	struct shape s[MAX_SHAPES];
} g = {.rounds = 5, .copies = 8, .seconds = 0.1};

static void die(const char *what)
{
	fprintf(stderr, "bench_roofline: %s\n", what);
	exit(1);
}

/* One call on every allowed CPU's OpenBLAS thread, from an unpinned thread: GFLOP/s. */
static double measure_blas2(const struct shape *s)
{
	struct bench_rate_thread t = {
	    .op = s->op, .l = {.rows = s->rows, .in = s->in, .out = s->out}, .copies = g.copies};
	if (!bench_rate_thread_alloc(&t, 77))
		die("out of memory");
	pthread_setaffinity_np(pthread_self(), sizeof(g.all), &g.all);
	openblas_set_num_threads(g.ncpus);
	for (unsigned k = 0; k < t.copies; k++)
		bench_rate_step(&t, k);
	unsigned iters = (unsigned)fmax(4, g.seconds / bench_rate_one_s(&t));
	uint64_t t0 = mbt_now_ns();
	for (unsigned i = 0; i < iters; i++)
		bench_rate_step(&t, i);
	double dt = (double)(mbt_now_ns() - t0) * 1e-9;
	bench_rate_thread_free(&t);
	openblas_set_num_threads(1);
	return 2.0 * s->rows * s->in * s->out * iters / dt * 1e-9;
}

/* The packed kernel's modes: products forward only, on a CPU that runs the kernel. */
static bool has_mode(const struct shape *s, enum mode m)
{
	return m < PACK1 || (s->op == BENCH_FWD && mbp__dense_cpu_ok());
}

static double measure(const struct shape *s, enum mode m)
{
	double r;
	if (m == BLAS2)
		r = measure_blas2(s);
	else if (m == BLAS1 || m == PACK1)
		r = bench_pinned_rate_k(s->op, m == PACK1, s->rows, s->in, s->out, g.cpus, 1, g.copies,
					g.seconds);
	else
		r = bench_pinned_rate_k(
		    s->op, m == PACK1X2, s->rows, s->in, s->out, g.cpus, (unsigned)g.ncpus,
		    g.copies / (unsigned)g.ncpus ? g.copies / (unsigned)g.ncpus : 1, g.seconds);
	if (!(r > 0))
		die("out of memory");
	return r;
}

/* ---- one core's peak: independent fused multiply-adds, the widest vectors the CPU has ---- */

#define PEAK_ACC   12
#define PEAK_ITERS 2000000L /* about 10 ms: short enough that some try finds the core to itself */

#if defined(__x86_64__)
#include <immintrin.h>
/* PEAK_ACC independent chains (more than the FMA latency times its ports), lanes floats each */
#define PEAK_FN(name, isa, vec, set1, fma, lanes)                                                            \
	__attribute__((target(isa))) static double name(void)                                                \
	{                                                                                                    \
		vec a[PEAK_ACC], b = set1(0.999999f), c = set1(1e-7f);                                       \
		for (int j = 0; j < PEAK_ACC; j++)                                                           \
			a[j] = set1(1.0f + (float)j * 1e-7f);                                                \
		double t0 = mbt_now_s();                                                                     \
		for (long i = 0; i < PEAK_ITERS; i++) {                                                      \
			_Pragma("GCC unroll 12") for (int j = 0; j < PEAK_ACC; j++) a[j] = fma(a[j], b, c);  \
		}                                                                                            \
		double dt = mbt_now_s() - t0;                                                                \
		float s = 0, v[lanes];                                                                       \
		for (int j = 0; j < PEAK_ACC; j++) {                                                         \
			memcpy(v, &a[j], sizeof(v));                                                         \
			s += v[0];                                                                           \
		}                                                                                            \
		__asm__ __volatile__("" ::"x"(s));                                                           \
		return 2.0 * (lanes)*PEAK_ACC * PEAK_ITERS / dt * 1e-9;                                      \
	}
PEAK_FN(peak_avx512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, 16)
PEAK_FN(peak_avx2, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, 8)
#endif

/* Best of 30 tries, pinned to the first allowed CPU; 0 without FMA vectors. */
static double peak_one_core(const char **what)
{
	double best = 0;
	*what = "none";
	bench_pin(g.cpus[0]);
	for (int k = 0; k < 30; k++) {
#if defined(__x86_64__)
		if (__builtin_cpu_supports("avx512f"))
			best = fmax(best, peak_avx512()), *what = "AVX-512 FMA";
		else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
			best = fmax(best, peak_avx2()), *what = "AVX2 FMA";
#endif
	}
	return best;
}

/* ---- shapes ---- */

static void add_shape(enum bench_op op, uint32_t rows, uint32_t in, uint32_t out)
{
	for (unsigned i = 0; i < g.nshapes; i++)
		if (g.s[i].op == op && g.s[i].rows == rows && g.s[i].in == in && g.s[i].out == out)
			return;
	if (g.nshapes == MAX_SHAPES)
		die("too many shapes");
	g.s[g.nshapes++] = (struct shape){.op = op, .rows = rows, .in = in, .out = out};
}

/* op:ROWSxINxOUT,... */
static int parse_shapes(const char *s)
{
	g.nshapes = 0;
	while (*s) {
		char op[8];
		unsigned rows, in, out;
		int n = 0;
		if (sscanf(s, "%7[a-z]:%ux%ux%u%n", op, &rows, &in, &out, &n) != 4 || !rows || !in || !out ||
		    rows > 65536 || in > MBP_MODEL_MAX_WIDTH || out > MBP_MODEL_MAX_WIDTH)
			return -1;
		enum bench_op o = BENCH_OPS;
		for (enum bench_op k = BENCH_FWD; k < BENCH_OPS; k++)
			if (!strcmp(op, op_name[k]))
				o = k;
		if (o == BENCH_OPS)
			return -1;
		add_shape(o, rows, in, out);
		s += n;
		if (*s == ',')
			s++;
		else if (*s)
			return -1;
	}
	return g.nshapes ? 0 : -1;
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_roofline [-r rounds] [-t seconds] [-w copies] [-s op:ROWSxINxOUT,...]\n"
			"  op: fwd (y = x W^T), dx (dx = dz W), dw (dW += dz^T x)\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int opt;
	static const uint32_t mlp_rows[] = {1, 8, 16, 32, 64, 128, 256};
	for (unsigned i = 0; i < ARRAY_LEN(mlp_rows); i++)
		add_shape(BENCH_FWD, mlp_rows[i], 1024, 1024);
	while ((opt = getopt(argc, argv, "r:t:w:s:h")) != -1) {
		switch (opt) {
		case 'r':
			g.rounds = (unsigned)bench_opt_u64("-r", optarg, 1, MAX_ROUNDS);
			break;
		case 't':
			g.seconds = bench_opt_double("-t", optarg, 1e-3, 3600);
			break;
		case 'w':
			g.copies = (unsigned)bench_opt_u64("-w", optarg, 1, BENCH_MAX_COPIES);
			break;
		case 's':
			if (parse_shapes(optarg))
				usage();
			break;
		default:
			usage();
		}
	}
	if (optind < argc || g.rounds < 1 || g.rounds > MAX_ROUNDS || !(g.seconds > 0) || g.copies < 1 ||
	    g.copies > BENCH_MAX_COPIES)
		usage();
	g.ncpus = mbp_cpus_allowed(g.cpus, MBP_MAX_CPUS, NULL);
	if (g.ncpus < 1)
		die("no allowed CPUs");
	if (g.ncpus > MBP_MAX_CPUS)
		g.ncpus = MBP_MAX_CPUS;
	if (sched_getaffinity(0, sizeof(g.all), &g.all))
		die("sched_getaffinity failed");
	__builtin_cpu_init();

	double load[3];
	bench_loadavg(load);
	const char *coretype = getenv("OPENBLAS_CORETYPE"), *peak_what;
	printf("bench_roofline: %d CPUs allowed; OpenBLAS kernel %s (%s), OPENBLAS_CORETYPE=%s; load %.2f "
	       "%.2f %.2f\n",
	       g.ncpus, openblas_get_corename(), openblas_get_config(), coretype ? coretype : "(unset)",
	       load[0], load[1], load[2]);
	double peak = peak_one_core(&peak_what);
	double lim = peak * g.ncpus;
	printf("peak of one core (%s loop): %.1f GFLOP/s; %d-core limit %.1f GFLOP/s\n", peak_what, peak,
	       g.ncpus, lim);
	unsigned share = g.copies / (unsigned)g.ncpus ? g.copies / (unsigned)g.ncpus : 1;
	printf("big operand: %u %s cycled (%u per thread in blas1x2); %u rounds of ~%.2f s per mode, "
	       "medians\n",
	       g.copies, PLURAL(g.copies, "copy", "copies"), share, g.rounds, g.seconds);

	bench_others o = bench_others_start();
	for (unsigned r = 0; r < g.rounds; r++)
		for (unsigned i = 0; i < g.nshapes; i++)
			for (enum mode m = BLAS1; m < NMODES; m++)
				g.s[i].g[m][r] = has_mode(&g.s[i], m) ? measure(&g.s[i], m) : 0;
	double others = bench_others_cpus(o);

	printf("%-4s %5s %5s %5s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "op", "rows", "in",
	       "out", "blas1", "blas2", "blas1x2", "b2/b1", "x2/b1", "b1/peak", "b2/lim", "x2/lim", "packed1",
	       "pk1x2", "p1/b1", "px2/lim");
	for (unsigned i = 0; i < g.nshapes; i++) {
		struct shape *s = &g.s[i];
		for (enum mode m = BLAS1; m < NMODES; m++)
			s->med[m] = bench_median(s->g[m], g.rounds);
		const double *d = s->med;
		printf("%-4s %5u %5u %5u %8.1f %8.1f %8.1f %8.2f %8.2f %8.2f %8.2f %8.2f", op_name[s->op],
		       s->rows, s->in, s->out, d[BLAS1], d[BLAS2], d[BLAS1X2], d[BLAS2] / d[BLAS1],
		       d[BLAS1X2] / d[BLAS1], peak > 0 ? d[BLAS1] / peak : 0, lim > 0 ? d[BLAS2] / lim : 0,
		       lim > 0 ? d[BLAS1X2] / lim : 0);
		if (has_mode(s, PACK1))
			printf(" %8.1f %8.1f %8.2f %8.2f\n", d[PACK1], d[PACK1X2], d[PACK1] / d[BLAS1],
			       lim > 0 ? d[PACK1X2] / lim : 0);
		else
			printf(" %8s %8s %8s %8s\n", "-", "-", "-", "-");
	}
	printf("others: %.2f CPUs busy outside this process on average while measuring\n", others);
	printf("bench_roofline: cpus=%d kernel=%s coretype=%s peak1=%.1f rounds=%u copies=%u", g.ncpus,
	       openblas_get_corename(), coretype ? coretype : "unset", peak, g.rounds, g.copies);
	for (unsigned i = 0; i < g.nshapes; i++) {
		const struct shape *s = &g.s[i];
		for (enum mode m = BLAS1; m < NMODES; m++)
			if (has_mode(s, m))
				printf(" %s_%ux%ux%u_%s=%.1f", op_name[s->op], s->rows, s->in, s->out,
				       mode_name[m], s->med[m]);
	}
	printf(" others_cpus=%.2f\n", others);
	return 0;
}

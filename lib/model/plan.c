/*
 * Balanced stages: per-layer profile and the exact min-max partition of the layers into stages.
 *
 * Partition. Stage [a, b) costs sum(layer[a..b)) + handoff[a - 1] (a > 0): the slowest stage sets the
 * pipeline's period. best[k][j], the smallest possible slowest stage when the first j layers form k
 * stages, is min over i of max(best[k-1][i], cost(i, j)); the answer is best[S][L]. O(S L^2) with prefix
 * sums: 64 stages of 4096 layers is about a billion steps, far beyond any real model, while 100 layers
 * take a millisecond. Binary search over the answer with a greedy check would be faster but is only exact
 * when a stage's cost grows with its length alone, which a per-boundary hand-off cost breaks.
 *
 * Replicas. A stage of r replicas takes cost / r per micro-batch. best[k][c][j], the least period of the
 * first j layers in k stages on at most c threads, is min over i and r of max(best[k-1][c-r][i],
 * cost(i, j) / r); with any number of stages the k dimension folds into one (best[c][j] from best[c-r][i]).
 * Least period first, then the fewest threads (the least c whose best equals it), then the last stage
 * starting first with the fewest replicas, and so on back.
 *
 * Fixed replicas (a rebalancing move that keeps each stage's count). With r_k given for each stage
 * position the thread dimension goes: best[k][j] is min over i of max(best[k-1][i], cost(i, j) / r_k),
 * O(S L^2) again; with every r_k one it is the partition above, bit for bit (cost / 1 is cost).
 *
 * Capped replicas (a rebalancing move that re-plans the active replicas within the threads each stage
 * was made with): the replicas chosen as above, S stages, stage k's r at most cap_k, over the sum of the
 * caps. Threads beyond the CPUs share them: such a plan is predicted at max(its period, the layers' sum
 * over the CPUs), the least of those (then the fewest threads) against the best plan within the CPUs,
 * and taken only when it beats that one by MBP__OVERSUB_GAIN (the cost model counts no time-slicing, no
 * park and no wake; without the margin a hand-off of 1 us would buy a thread); such a plan's slowest_ns
 * is then that prediction, not its stages' (what a move's rule compares the plan in use with). One programme,
 * partition_dp, serves all four.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common.h"
#include "model_internal.h"
#include "strbuf.h"

static double fastest(const double *v, unsigned n)
{
	double m = v[0];
	for (unsigned i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

int mbp_model_profile(mbp_model *m, uint32_t mb_rows, unsigned reps, int cpu, double *layer_ns,
		      double *handoff_ns)
{
	if (!m || !mb_rows || !reps || !layer_ns)
		return -EINVAL;
	cpu_set_t old;
	bool pinned = false;
	if (cpu >= 0) {
		if (cpu >= CPU_SETSIZE)
			return -EINVAL;
		int rc = pthread_getaffinity_np(pthread_self(), sizeof(old), &old);
		if (rc)
			return -rc;
		cpu_set_t one;
		CPU_ZERO(&one);
		CPU_SET(cpu, &one);
		rc = pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
		if (rc)
			return -rc;
		pinned = true;
	}
	size_t n = (size_t)mb_rows * m->max_width;
	float *x = mbp__scratch_alloc(n), *y = mbp__scratch_alloc(n);
	double *t = malloc(reps * sizeof(*t));
	int rc = 0;
	if (!x || !y || !t) {
		rc = -ENOMEM;
		goto out;
	}
	uint64_t seed = 0x9e3779b97f4a7c15u;
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		x[i] = (float)((double)(seed >> 40) / (double)(1u << 24) * 2.0 - 1.0);
	}
	/* Time the layers as the stages run them: with one OpenBLAS thread. Restored below. */
	int threads = openblas_get_num_threads();
	openblas_set_num_threads(MBP__BLAS_THREADS_PER_STAGE);
	struct mbp__version *v = mbp__version_get_locked(m);
	for (unsigned l = 0; l < m->layers; l++) {
		mbp__layer_run(&m->l[l], &v->lw[l], x, y, mb_rows); /* warm-up: weights into cache, packing */
		for (unsigned r = 0; r < reps; r++) {
			uint64_t t0 = mbp__now_ns();
			mbp__layer_run(&m->l[l], &v->lw[l], x, y, mb_rows);
			t[r] = (double)(mbp__now_ns() - t0);
		}
		layer_ns[l] = fastest(t, reps);
		if (!handoff_ns)
			continue;
		handoff_ns[l] = 0;
		if (l + 1 == m->layers)
			continue;
		size_t bytes = (size_t)mb_rows * m->l[l].out * sizeof(float);
		for (unsigned r = 0; r < reps; r++) {
			uint64_t t0 = mbp__now_ns();
			memcpy(y, x, bytes);
			__asm__ __volatile__("" ::"r"(y) : "memory"); /* keep the copy */
			t[r] = (double)(mbp__now_ns() - t0);
		}
		handoff_ns[l] = MBP__HANDOFF_FIXED_NS + fastest(t, reps);
	}
	mbp__version_put(v);
	openblas_set_num_threads(threads);
out:
	free(x);
	free(y);
	free(t);
	if (pinned)
		pthread_setaffinity_np(pthread_self(), sizeof(old), &old);
	return rc;
}

/* The cost of stage [a, b), summed in layer order. */
static double stage_cost(const double *layer_ns, const double *handoff_ns, unsigned a, unsigned b)
{
	double c = a > 0 && handoff_ns ? handoff_ns[a - 1] : 0.0;
	for (unsigned i = a; i < b; i++)
		c += layer_ns[i];
	return c;
}

/* A plan's predicted figures from its boundaries and replicas: each stage's cost, the period, the mean
 * over the threads, the balance, the sequential time. */
void mbp__plan_cost(mbp_model_plan *plan, const double *layer_ns, const double *handoff_ns)
{
	double sum = 0;
	plan->threads = 0;
	plan->slowest_ns = 0;
	for (unsigned s = 0; s < plan->stages; s++) {
		unsigned r = plan->replicas[s] ? plan->replicas[s] : 1;
		plan->stage_ns[s] = stage_cost(layer_ns, handoff_ns, plan->first[s], plan->first[s + 1]);
		sum += plan->stage_ns[s];
		plan->threads += r;
		if (plan->stage_ns[s] / r > plan->slowest_ns)
			plan->slowest_ns = plan->stage_ns[s] / r;
	}
	plan->mean_ns = sum / plan->threads;
	plan->balance = plan->mean_ns > 0 ? plan->slowest_ns / plan->mean_ns : 1.0;
	plan->sequential_ns = stage_cost(layer_ns, NULL, 0, plan->layers);
}

/* The costs' checks of both partitions. */
static int costs_check(const double *layer_ns, const double *handoff_ns, unsigned L)
{
	for (unsigned i = 0; i < L; i++)
		if (!isfinite(layer_ns[i]) || layer_ns[i] < 0 ||
		    (handoff_ns && (!isfinite(handoff_ns[i]) || handoff_ns[i] < 0)))
			return -EINVAL;
	return 0;
}

/* The replicas of stage k (from 0) in a plan of fixed counts (0: one). */
static unsigned fixed_rep(const unsigned *reps, unsigned k)
{
	return reps && reps[k] ? reps[k] : 1;
}

/* The share a plan of more threads than CPUs must win to be taken (capped replicas, above). */
#define MBP__OVERSUB_GAIN 0.05

/* The fewest threads, from c down, whose least period equals that of c threads (whole[x * W]: the least
 * period on at most x threads). */
static unsigned fewest_threads(const double *whole, size_t W, unsigned c)
{
	const double want = whole[c * W];
	while (c > 1 && whole[(c - 1) * W] == want)
		c--;
	return c;
}

/*
 * The dynamic programme of every partition (see the top of the file). `reps` NULL: the replicas are
 * chosen, over at most C threads, for S stages (0: any number), stage k's at most caps[k] (caps NULL: no
 * cap; with caps, S > 0), and with `cpus` (0: no limit) below C the choice between the threads within
 * the CPUs and those beyond them above. Else stage k has reps[k] replicas (0: one; NULL would mean one
 * each, so mbp_model_partition passes `ones`) and the thread dimension folds into one: best[k][j] is min
 * over i of max(best[k-1][i], cost(i, j) / reps[k-1]). Checked by the callers.
 */
static int partition_dp(const double *layer_ns, const double *handoff_ns, unsigned L, unsigned S, unsigned C,
			const unsigned *reps, const unsigned *caps, unsigned cpus, mbp_model_plan *plan)
{
	const bool choose = !reps, any = S == 0;
	const unsigned K = any ? 1 : S, CD = choose ? C + 1 : 1; /* CD: the thread dimension's size */
	const size_t W = (size_t)L + 1, CW = (size_t)CD * W, n = (size_t)(K + 1) * CW;
	double *pre = malloc(W * sizeof(*pre)), *best = malloc(n * sizeof(*best));
	uint32_t *argi = malloc(n * sizeof(*argi));
	uint16_t *argr = malloc(n * sizeof(*argr));
	if (!pre || !best || !argi || !argr) {
		free(pre);
		free(best);
		free(argi);
		free(argr);
		return -ENOMEM;
	}
	pre[0] = 0;
	for (unsigned i = 0; i < L; i++)
		pre[i + 1] = pre[i] + layer_ns[i];
#define AT(k, c, j) ((size_t)(k)*CW + (size_t)(c)*W + (j))
	for (size_t x = 0; x < n; x++)
		best[x] = INFINITY;
	for (unsigned c = 0; c < CD; c++)
		best[AT(0, c, 0)] = 0; /* no layers yet: no stage, no thread needed */
	/* any: one table, read and written (j only grows); else stage k reads stage k - 1's. k stages over
	 * the first j layers need j >= k, and the stages after them need L - j >= S - k. */
	for (unsigned k = any ? 0 : 1; k <= (any ? 0 : K); k++) {
		const unsigned from = any ? 0 : k - 1;
		for (unsigned c = choose ? 1 : 0; c < CD; c++)
			for (unsigned j = any ? 1 : k; j <= L - (any ? 0 : S - k); j++) {
				double b = INFINITY;
				unsigned at = 0, rr = choose ? 1 : fixed_rep(reps, k - 1);
				for (unsigned i = any ? 0 : k - 1; i < j; i++) {
					double cost =
					    pre[j] - pre[i] + (i > 0 && handoff_ns ? handoff_ns[i - 1] : 0);
					unsigned r0 = choose ? 1 : rr, r1 = choose ? c : rr;
					if (caps && r1 > fixed_rep(caps, k - 1))
						r1 = fixed_rep(caps, k - 1);
					for (unsigned r = r0; r <= r1; r++) {
						double v =
						    fmax(best[AT(from, choose ? c - r : 0, i)], cost / r);
						if (v < b)
							b = v, at = i, rr = r;
					}
				}
				best[AT(k, c, j)] = b;
				argi[AT(k, c, j)] = at;
				argr[AT(k, c, j)] = (uint16_t)rr;
			}
	}
	/* least period; then, choosing, the fewest threads reaching it */
	const double *whole = best + AT(any ? 0 : K, 0, L); /* whole[x * W]: all L layers on at most x */
	unsigned c = choose ? fewest_threads(whole, W, C) : 0;
	if (choose && cpus && cpus < C) {
		/* within the CPUs, against the least prediction beyond them (the top of the file) */
		const unsigned in = fewest_threads(whole, W, cpus);
		const double floor = pre[L] / cpus;
		double beyond = INFINITY;
		for (unsigned x = cpus + 1; x <= C; x++)
			if (fmax(whole[x * W], floor) < beyond)
				beyond = fmax(whole[x * W], floor), c = x;
		if (!(beyond < (1.0 - MBP__OVERSUB_GAIN) * whole[in * W]))
			c = in;
	}
	/* walk back: the stages come out last first */
	unsigned first[MBP_MAX_STAGES + 1], got[MBP_MAX_STAGES], ns = 0;
	for (unsigned k = any ? 0 : K, j = L; j > 0;) {
		size_t x = AT(k, c, j);
		first[ns] = argi[x];
		got[ns++] = argr[x];
		if (choose)
			c -= argr[x];
		j = argi[x];
		if (!any)
			k--;
	}
#undef AT
	free(pre);
	free(best);
	free(argi);
	free(argr);
	memset(plan, 0, sizeof(*plan));
	plan->stages = ns;
	plan->layers = L;
	for (unsigned s = 0; s < ns; s++) {
		plan->first[s] = first[ns - 1 - s];
		plan->replicas[s] = got[ns - 1 - s];
	}
	plan->first[ns] = L;
	mbp__plan_cost(plan, layer_ns, handoff_ns);
	return 0;
}

int mbp__partition_fixed(const double *layer_ns, const double *handoff_ns, unsigned L, unsigned S,
			 const unsigned *replicas, mbp_model_plan *plan)
{
	static const unsigned ones[MBP_MAX_STAGES] = {0}; /* 0: one replica */
	if (!layer_ns || !plan || !L || !S || costs_check(layer_ns, handoff_ns, L))
		return -EINVAL;
	if (S > L || S > MBP_MAX_STAGES)
		return -ERANGE;
	return partition_dp(layer_ns, handoff_ns, L, S, 0, replicas ? replicas : ones, NULL, 0, plan);
}

int mbp__partition_capped(const double *layer_ns, const double *handoff_ns, unsigned L, unsigned S,
			  const unsigned *caps, unsigned cpus, mbp_model_plan *plan)
{
	if (!layer_ns || !plan || !caps || !L || !S || costs_check(layer_ns, handoff_ns, L))
		return -EINVAL;
	if (S > L || S > MBP_MAX_STAGES || L > UINT16_MAX)
		return -ERANGE;
	unsigned C = 0;
	for (unsigned k = 0; k < S; k++)
		C += fixed_rep(caps, k);
	if (C > MBP_MAX_STAGES)
		return -ERANGE;
	int rc = partition_dp(layer_ns, handoff_ns, L, S, C, NULL, caps, cpus, plan);
	/* beyond the CPUs the prediction is what they allow: the rule compares with it */
	if (rc == 0 && cpus && plan->threads > cpus && plan->sequential_ns / cpus > plan->slowest_ns) {
		plan->slowest_ns = plan->sequential_ns / cpus;
		plan->balance = plan->mean_ns > 0 ? plan->slowest_ns / plan->mean_ns : 1.0;
	}
	return rc;
}

int mbp_model_partition(const double *layer_ns, const double *handoff_ns, unsigned L, unsigned S,
			mbp_model_plan *plan)
{
	return mbp__partition_fixed(layer_ns, handoff_ns, L, S, NULL, plan);
}

int mbp_model_partition_replicas(const double *layer_ns, const double *handoff_ns, unsigned L, unsigned S,
				 unsigned C, mbp_model_plan *plan)
{
	if (!layer_ns || !plan || !L || !C || costs_check(layer_ns, handoff_ns, L))
		return -EINVAL;
	if (S > L || S > C || C > MBP_MAX_STAGES || L > UINT16_MAX)
		return -ERANGE;
	return partition_dp(layer_ns, handoff_ns, L, S, C, NULL, NULL, 0, plan);
}

/* Profile the model (5 reps) and plan with `partition` applied to its costs. */
static int profile_and_plan(mbp_model *m, uint32_t mb_rows, int cpu, mbp_model_plan *plan, unsigned stages,
			    unsigned cpus)
{
	double *c = malloc(2 * (size_t)m->layers * sizeof(*c));
	if (!c)
		return -ENOMEM;
	int rc = mbp_model_profile(m, mb_rows, 5, cpu, c, c + m->layers);
	if (!rc)
		rc = cpus ? mbp_model_partition_replicas(c, c + m->layers, m->layers, stages, cpus, plan)
			  : mbp_model_partition(c, c + m->layers, m->layers, stages, plan);
	if (!rc)
		plan->mb_rows = mb_rows;
	free(c);
	return rc;
}

int mbp_model_balance_replicas(mbp_model *m, unsigned stages, unsigned cpus, uint32_t mb_rows, int cpu,
			       mbp_model_plan *plan)
{
	if (!m || !plan || !cpus || !mb_rows)
		return -EINVAL;
	if (stages > m->layers || stages > cpus || cpus > MBP_MAX_STAGES)
		return -ERANGE;
	return profile_and_plan(m, mb_rows, cpu, plan, stages, cpus);
}

int mbp_model_balance(mbp_model *m, unsigned stages, uint32_t mb_rows, int cpu, mbp_model_plan *plan)
{
	if (!m || !plan || !stages || !mb_rows)
		return -EINVAL;
	if (stages > m->layers || stages > MBP_MAX_STAGES)
		return -ERANGE;
	return profile_and_plan(m, mb_rows, cpu, plan, stages, 0);
}

int mbp_model_plan_describe(const mbp_model_plan *plan, char *buf, size_t n)
{
	if (!plan || (!buf && n) || plan->stages > MBP_MAX_STAGES)
		return -EINVAL;
	struct mbp__strbuf b = mbp__strbuf_fixed(buf, n);
	for (unsigned s = 0; s < plan->stages; s++) {
		unsigned r = plan->replicas[s] ? plan->replicas[s] : 1;
		mbp__strbuf_printf(&b, "stage %u: layers %u-%u  %.1f us", s, plan->first[s],
				   plan->first[s + 1] - 1, plan->stage_ns[s] / 1e3);
		if (r > 1)
			mbp__strbuf_printf(&b, " x%u (%.1f us per micro-batch)", r,
					   plan->stage_ns[s] / r / 1e3);
		mbp__strbuf_printf(&b, "\n");
	}
	mbp__strbuf_printf(
	    &b, "%u %s at %u %s: slowest %.1f us, mean %.1f us, balance %.3f, sequential %.1f us\n",
	    plan->stages, PLURAL(plan->stages, "stage", "stages"), plan->mb_rows,
	    PLURAL(plan->mb_rows, "row", "rows"), plan->slowest_ns / 1e3, plan->mean_ns / 1e3, plan->balance,
	    plan->sequential_ns / 1e3);
	if (b.oom)
		return -EINVAL;
	return b.len > INT32_MAX ? INT32_MAX : (int)b.len;
}

int mbp_model_plan_placement(const mbp_model_plan *plan, mbp_pipeline *p, char *buf, size_t n)
{
	mbp_pipeline_stats ps;
	if (!plan || !p || (!buf && n) || plan->stages > MBP_MAX_STAGES ||
	    mbp_pipeline_stats_get(p, &ps, NULL, 0) != (int)plan->stages)
		return -EINVAL;
	struct mbp__strbuf b = mbp__strbuf_fixed(buf, n);
	for (unsigned s = 0; s < plan->stages; s++) {
		mbp_stage_stats rs[MBP_MAX_REPLICAS];
		int r = mbp_pipeline_replica_stats(p, s, rs, MBP_MAX_REPLICAS);
		if (r < 1)
			return -EINVAL;
		unsigned a = plan->first[s], z = plan->first[s + 1] - 1;
		if (a == z)
			mbp__strbuf_printf(&b, "stage %u (layer %u)", s, a);
		else
			mbp__strbuf_printf(&b, "stage %u (layers %u-%u)", s, a, z);
		if (r > 1)
			mbp__strbuf_printf(&b, " x%d", r);
		mbp__strbuf_printf(&b, " -> %s ", r > 1 ? "CPUs" : "CPU");
		for (int j = 0; j < r; j++) {
			if (rs[j].cpu >= 0)
				mbp__strbuf_printf(&b, "%s%d", j ? "," : "", rs[j].cpu);
			else
				mbp__strbuf_printf(&b, "%sunpinned", j ? "," : "");
		}
		mbp__strbuf_printf(&b, "\n");
	}
	if (b.oom)
		return -EINVAL;
	return b.len > INT32_MAX ? INT32_MAX : (int)b.len;
}

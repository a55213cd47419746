/*
 * bench_rebalance: the model's stages rebalancing while they run (issue 25's target), three runs in one
 * process, each a stream of stamped micro-batches through 2 stages of an L-layer model:
 *
 *   fresh      the plan a fresh partition makes for the new costs (1 unit a layer in the first half of
 *              the layers, 3 in the second: cut at 5 of 8), costs 1:3 from the start, no rebalancing: the
 *              throughput to come back to
 *   stuck      the plan for equal costs (cut at L/2), the costs changing from 1:1 to 1:3 after --before
 *              micro-batches, no rebalancing: what a plan fixed at start gives
 *   rebalance  the same change with rebalancing on (its defaults, --window): each move is logged on
 *              stderr; the recovery is the time from the change (stage 0 starting the first micro-batch
 *              with the new costs) until the end of the first window of --span micro-batches whose
 *              throughput is within 5 % of fresh's, and "after" is the throughput from there to the end
 *
 * The layers are small (widths 16: their arithmetic is negligible) and each costs --unit-us of calibrated
 * busy work per micro-batch (util/burn.h: work, not wall time, so a stage that shares its CPU takes
 * longer), spent in the stages' cost hook (mbp_model_layer_cost_fn), which times it as the layer's. Every
 * result is checked: each micro-batch comes back once, in the order submitted, with mbp_model_forward's
 * output bit for bit; exit 1 otherwise. One summary line: "bench_rebalance: ...". The target (issue 25):
 * ratio >= 0.95 and recover_s <= 2.
 *
 * --case=replica: the costs go from 1:1 (a unit a layer) to one layer, the last, at 75 % of the work
 * (3 (L - 1) units), which no cut helps; the runs are
 *
 *   fresh      the plan a move reaches, from the start with the new costs: stages 0 .. L-2 | L-1, the
 *              last on 2 replicas (3 threads)
 *   fresh1     the partitioner's replicated plan for 2 CPUs (mbp_model_partition_replicas): one stage
 *              of every layer on 2 replicas
 *   stuck      the plan for equal costs (cut at L/2), no rebalancing
 *   bounds     rebalancing that moves the boundaries only (rebalance.replicas 0): the best it can do
 *              is the heavy layer alone, a stage at 75 % of the work
 *   rebalance  rebalancing with rebalance.replicas 2: each stage made with 2 threads, 1 active each,
 *              and a move that cuts before the heavy layer and turns its stage's second replica on
 *
 * A run whose threads outnumber the CPUs runs unpinned (MBP_PIN_NONE: the plan would pin two active
 * threads to one CPU); the others pinned. Its summary line: "bench_rebalance_replica: ...", with ratio =
 * after / fresh and ratio1 = after / fresh1.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbpipe.h>

#include "bench_util.h"
#include "util/burn.h"

#define WIDTH  16
#define INPUTS 4

enum cost_case { CASE_SWAP, CASE_REPLICA };

struct run {
	const char *name;
	enum cost_case cc;
	unsigned layers;
	uint64_t change; /* the first micro-batch with the new costs */
	double unit_steps;
	/* results */
	uint64_t *done_ns; /* [seq] */
	_Atomic uint64_t change_ns;
	uint64_t next, bad_order, bad_data, failed;
	const float (*ref)[WIDTH];
	unsigned moves;
};

/* A layer's cost in units after the change (1 before): swap, the second half 3 units a layer; replica,
 * the last layer 3 (L - 1), 75 % of the work. */
static double new_units(enum cost_case cc, unsigned L, unsigned layer)
{
	if (cc == CASE_SWAP)
		return layer >= L / 2 ? 3 : 1;
	return layer + 1 == L ? 3.0 * (L - 1) : 1;
}

static double layer_cost(void *arg, unsigned stage, unsigned layer, const mbp_mb *mb, double measured_ns)
{
	struct run *r = arg;
	double units = mb->seq >= r->change ? new_units(r->cc, r->layers, layer) : 1;
	if (stage == 0 && layer == 0 && mb->seq == r->change)
		atomic_store_explicit(&r->change_ns, mbt_now_ns(), memory_order_relaxed);
	uint64_t t0 = mbt_now_ns();
	burn((uint64_t)(r->unit_steps * units), mb->seq);
	return measured_ns + (double)(mbt_now_ns() - t0);
}

static void on_move(void *arg, const mbp_model_move *mv)
{
	struct run *r = arg;
	r->moves++;
	fprintf(stderr, "bench_rebalance: %s: plan %" PRIu64 " after %" PRIu64 " micro-batches: %s\n",
		r->name, mv->plan, mv->admitted, mv->reason);
}

static void on_result(void *arg, mbp_mb *mb)
{
	struct run *r = arg;
	r->done_ns[mb->seq] = mbt_now_ns();
	r->bad_order += mb->seq != r->next;
	r->failed += mb->status != 0;
	r->bad_data += memcmp(mb->data, r->ref[mb->seq % INPUTS], WIDTH * sizeof(float)) != 0;
	r->next++;
	mbp_mb_release(NULL, mb);
}

/* Micro-batches per second over completions (a, b]. */
static double rate(const struct run *r, uint64_t a, uint64_t b)
{
	return b > a && r->done_ns[b] > r->done_ns[a]
		   ? (double)(b - a) * 1e9 / (double)(r->done_ns[b] - r->done_ns[a])
		   : 0;
}

/* What one run streams through: its plan (stages, cuts, replicas), rebalancing or not, and the threads
 * each stage is made with for moves of the replicas (0: the plan's). */
struct arm {
	unsigned stages;
	unsigned first[3];
	unsigned replicas[2];
	bool rebalance;
	unsigned spare;
};

static unsigned cpus_here(void)
{
	int n = mbp_cpus_allowed(NULL, 0, NULL);
	return n > 0 ? (unsigned)n : 1;
}

static int stream(struct run *r, mbp_model *m, const struct arm *a, uint32_t window, uint64_t n,
		  const float *x)
{
	mbp_model_plan plan;
	double ones[MBP_MODEL_MAX_LAYERS];
	for (unsigned l = 0; l < r->layers; l++)
		ones[l] = 1;
	if (mbp_model_partition(ones, NULL, r->layers, a->stages, &plan) < 0)
		return -1;
	memcpy(plan.first, a->first, (a->stages + 1) * sizeof(a->first[0]));
	unsigned threads = 0;
	for (unsigned s = 0; s < a->stages; s++) {
		plan.replicas[s] = a->replicas[s];
		unsigned t = a->replicas[s] ? a->replicas[s] : 1;
		threads += a->rebalance && a->spare > t ? a->spare : t;
	}
	mbp_model_stages_opts so = {.rebalance = {.on = a->rebalance,
						  .window = window,
						  .on_move = on_move,
						  .on_move_arg = r,
						  .cost = layer_cost,
						  .cost_arg = r,
						  .replicas = a->spare}};
	mbp_model_stages *st;
	mbp_pipeline *p = NULL;
	int rc = mbp_model_stages_new_opts(&st, m, &plan, 1, &so);
	if (rc < 0)
		return rc;
	/* without rebalancing the hook must still spend the costs: the cost hook runs only when it is on,
	 * so the plain runs rebalance with a window no run reaches */
	if (!a->rebalance) {
		mbp_model_stages_destroy(st);
		so.rebalance.on = true;
		so.rebalance.window = UINT32_MAX;
		if ((rc = mbp_model_stages_new_opts(&st, m, &plan, 1, &so)) < 0)
			return rc;
	}
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WIDTH * sizeof(float);
	o.max_mb_rows = 1;
	o.mb_buffers = 64;
	o.on_result = on_result;
	o.on_result_arg = r;
	if (threads > cpus_here()) /* the plan would pin two active threads to one CPU */
		o.pinning = MBP_PIN_NONE;
	if ((rc = mbp_pipeline_new(&p, &o)) < 0 || (rc = mbp_model_stages_add(st, p)) < 0 ||
	    (rc = mbp_pipeline_start(p)) < 0)
		goto out;
	for (uint64_t k = 0; k < n; k++) {
		mbp_mb *mb;
		if ((rc = mbp_mb_acquire(p, &mb, -1)) < 0)
			goto out;
		memcpy(mb->data, x + (k % INPUTS) * WIDTH, WIDTH * sizeof(float));
		mb->rows = 1;
		mb->seq = k;
		if ((rc = mbp_mb_submit(p, mb, -1)) < 0)
			goto out;
	}
	rc = mbp_pipeline_drain(p, -1);
out:
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	return rc;
}

/* The sizes every run of a case shares. */
struct opts {
	unsigned layers;
	double unit_steps, unit_us;
	uint64_t before, after, span;
	uint32_t window;
};

/* Stream the run's micro-batches through arm `a` (n of them) and check them; 0, 1 when any was lost,
 * reordered, wrong or failed, -1 when the run could not be made. */
static int run_arm(struct run *r, mbp_model *m, const struct arm *a, const struct opts *op, uint64_t n,
		   const float *x, const float (*ref)[WIDTH])
{
	r->layers = op->layers;
	r->unit_steps = op->unit_steps;
	r->ref = ref;
	r->done_ns = calloc(n, sizeof(uint64_t));
	int rc = r->done_ns ? stream(r, m, a, op->window, n, x) : -ENOMEM;
	if (rc < 0) {
		fprintf(stderr, "bench_rebalance: %s: %s\n", r->name, mbp_strerror(rc));
		return -1;
	}
	if (r->next != n || r->bad_order || r->bad_data || r->failed) {
		fprintf(stderr,
			"bench_rebalance: %s: %" PRIu64 " of %" PRIu64 " back, %" PRIu64
			" out of order, %" PRIu64 " wrong, %" PRIu64 " failed\n",
			r->name, r->next, n, r->bad_order, r->bad_data, r->failed);
		return 1;
	}
	return 0;
}

/* Runs 0 .. n - 1 on their arms, the first `fresh` of them (from the start with the new costs) over
 * --after micro-batches, the others over --before + --after; as run_arm, 1 if any failed its checks. */
static int run_arms(struct run *runs, const struct arm *arms, int n, int fresh, mbp_model *m,
		    const struct opts *op, const float *x, const float (*ref)[WIDTH])
{
	int bad = 0;
	for (int i = 0; i < n; i++) {
		int rc = run_arm(&runs[i], m, &arms[i], op, i < fresh ? op->after : op->before + op->after, x,
				 ref);
		if (rc < 0)
			return -1;
		bad |= rc;
	}
	return bad;
}

/* A rebalancing run's figures against a fresh rate: the rate before the change, the recovery (the time
 * from the change to the end of the first window of `span` micro-batches within 5 % of `fresh`; -1:
 * never) and the rate from there to the end. */
struct recovery {
	double before, after, recover_s;
};

static struct recovery recovered(const struct run *rb, const struct opts *op, double fresh)
{
	const uint64_t before = op->before, total = op->before + op->after, span = op->span;
	struct recovery v = {.before = rate(rb, before / 2, before - 1)};
	uint64_t j = before;
	while (j + span < total && rate(rb, j, j + span) < 0.95 * fresh)
		j++;
	uint64_t t_change = atomic_load(&((struct run *)rb)->change_ns);
	v.recover_s = j + span < total ? (double)(rb->done_ns[j + span] - t_change) / 1e9 : -1;
	v.after = j + span + 1 < total ? rate(rb, j + span, total - 1) : 0;
	return v;
}

/* --case=swap: the stages' costs 1:1, then 1:3. */
static int swap_case(mbp_model *m, const struct opts *op, const float *x, const float (*ref)[WIDTH])
{
	const unsigned L = op->layers;
	const uint64_t before = op->before, after = op->after, total = before + after;
	/* the fresh plan for the new costs, as the partitioner makes it */
	double c[64];
	for (unsigned l = 0; l < L; l++)
		c[l] = new_units(CASE_SWAP, L, l);
	mbp_model_plan fresh_plan;
	mbp_model_partition(c, NULL, L, 2, &fresh_plan);
	bench_others others = bench_others_start();
	const struct arm arms[3] = {
	    {.stages = 2, .first = {0, fresh_plan.first[1], L}},
	    {.stages = 2, .first = {0, L / 2, L}},
	    {.stages = 2, .first = {0, L / 2, L}, .rebalance = true},
	};
	struct run runs[3] = {
	    {.name = "fresh", .change = 0},
	    {.name = "stuck", .change = before},
	    {.name = "rebalance", .change = before},
	};
	int bad = run_arms(runs, arms, 3, 1, m, op, x, ref);
	if (bad < 0)
		return 1;
	/* fresh: its second half, once any start-up is over */
	double fresh = rate(&runs[0], after / 2, after - 1);
	double stuck = rate(&runs[1], before + after / 2, total - 1);
	struct run *rb = &runs[2];
	struct recovery v = recovered(rb, op, fresh);
	printf(
	    "bench_rebalance: layers=%u unit_us=%g cut_fresh=%u fresh=%.1f stuck=%.1f before=%.1f after=%.1f "
	    "ratio=%.3f stuck_ratio=%.3f recover_s=%.3f moves=%u lost=%" PRIu64 " reordered=%" PRIu64
	    " others=%.2f\n",
	    L, op->unit_us, fresh_plan.first[1], fresh, stuck, v.before, v.after,
	    fresh > 0 ? v.after / fresh : 0, fresh > 0 ? stuck / fresh : 0, v.recover_s, rb->moves,
	    total - rb->next, rb->bad_order, bench_others_cpus(others));
	for (int i = 0; i < 3; i++)
		free(runs[i].done_ns);
	return bad;
}

/* --case=replica: 1:1, then the last layer 75 % of the work (the top of the file). */
static int replica_case(mbp_model *m, const struct opts *op, const float *x, const float (*ref)[WIDTH])
{
	const unsigned L = op->layers;
	const uint64_t before = op->before, after = op->after, total = before + after;
	/* the partitioner's replicated plan for the new costs on 2 CPUs, any number of stages */
	double c[64];
	for (unsigned l = 0; l < L; l++)
		c[l] = new_units(CASE_REPLICA, L, l);
	mbp_model_plan one;
	if (mbp_model_partition_replicas(c, NULL, L, 0, 2, &one) < 0 || one.stages > 2)
		return 1;
	bench_others others = bench_others_start();
	const struct arm arms[5] = {
	    {.stages = 2, .first = {0, L - 1, L}, .replicas = {1, 2}},
	    {.stages = one.stages,
	     .first = {0, one.first[1], one.stages > 1 ? one.first[2] : 0},
	     .replicas = {one.replicas[0], one.replicas[1]}},
	    {.stages = 2, .first = {0, L / 2, L}},
	    {.stages = 2, .first = {0, L / 2, L}, .rebalance = true},
	    {.stages = 2, .first = {0, L / 2, L}, .rebalance = true, .spare = 2},
	};
	struct run runs[5] = {
	    {.name = "fresh", .cc = CASE_REPLICA, .change = 0},
	    {.name = "fresh1", .cc = CASE_REPLICA, .change = 0},
	    {.name = "stuck", .cc = CASE_REPLICA, .change = before},
	    {.name = "bounds", .cc = CASE_REPLICA, .change = before},
	    {.name = "rebalance", .cc = CASE_REPLICA, .change = before},
	};
	int bad = run_arms(runs, arms, 5, 2, m, op, x, ref);
	if (bad < 0)
		return 1;
	double fresh = rate(&runs[0], after / 2, after - 1), fresh1 = rate(&runs[1], after / 2, after - 1);
	double stuck = rate(&runs[2], before + after / 2, total - 1);
	double bounds = rate(&runs[3], before + after / 2, total - 1);
	struct run *rb = &runs[4];
	struct recovery v = recovered(rb, op, fresh);
	printf("bench_rebalance_replica: layers=%u unit_us=%g heavy_share=0.75 fresh=%.1f fresh1=%.1f "
	       "stuck=%.1f bounds=%.1f before=%.1f after=%.1f ratio=%.3f ratio1=%.3f bounds_ratio=%.3f "
	       "recover_s=%.3f moves=%u bounds_moves=%u lost=%" PRIu64 " reordered=%" PRIu64 " others=%.2f\n",
	       L, op->unit_us, fresh, fresh1, stuck, bounds, v.before, v.after,
	       fresh > 0 ? v.after / fresh : 0, fresh1 > 0 ? v.after / fresh1 : 0,
	       fresh > 0 ? bounds / fresh : 0, v.recover_s, rb->moves, runs[3].moves, total - rb->next,
	       rb->bad_order, bench_others_cpus(others));
	for (int i = 0; i < 5; i++)
		free(runs[i].done_ns);
	return bad;
}

int main(int argc, char **argv)
{
	double unit_us = 100;
	uint64_t before = 5000, after = 4400, span = 100;
	unsigned layers = 8;
	uint32_t window = 0;
	enum cost_case cc = CASE_SWAP;
	static const struct option lo[] = {
	    {"unit-us", 1, 0, 'u'}, {"before", 1, 0, 'b'}, {"after", 1, 0, 'a'}, {"span", 1, 0, 's'},
	    {"layers", 1, 0, 'l'},  {"window", 1, 0, 'w'}, {"case", 1, 0, 'c'},	 {0, 0, 0, 0}};
	for (int c; (c = getopt_long(argc, argv, "u:b:a:s:l:w:c:", lo, NULL)) != -1;) {
		switch (c) {
		case 'c':
			if (!strcmp(optarg, "swap") || !strcmp(optarg, "replica")) {
				cc = optarg[0] == 's' ? CASE_SWAP : CASE_REPLICA;
				break;
			}
			fprintf(stderr, "bench_rebalance: --case=swap or --case=replica, not %s\n", optarg);
			return 2;
		case 'u':
			unit_us = bench_opt_double("--unit-us", optarg, 1e-3, 1e6);
			break;
		case 'b':
			before = bench_opt_u64("--before", optarg, 1, UINT32_MAX);
			break;
		case 'a':
			after = bench_opt_u64("--after", optarg, 1, UINT32_MAX);
			break;
		case 's':
			span = bench_opt_u64("--span", optarg, 2, UINT32_MAX);
			break;
		case 'l':
			layers = (unsigned)bench_opt_u64("--layers", optarg, 2, 64);
			break;
		case 'w':
			window = (uint32_t)bench_opt_u64("--window", optarg, 0, UINT32_MAX);
			break;
		default:
			fprintf(stderr,
				"usage: bench_rebalance [--case=swap|replica] [--unit-us=US] [--before=N] "
				"[--after=N] [--span=N] [--layers=EVEN] [--window=N]\n");
			return 2;
		}
	}
	if (unit_us <= 0 || layers < 2 || layers % 2 || layers > 64 || !after || span < 2 || span >= after) {
		fprintf(stderr,
			"bench_rebalance: --unit-us > 0, --layers even from 2 to 64, --span from 2 to "
			"below --after\n");
		return 2;
	}
	char dir[] = "/tmp/bench_rebalance-XXXXXX", path[64];
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/m.safetensors", dir);
	mbp_model_spec sp = {
	    .layers = layers, .in = WIDTH, .hidden = WIDTH, .out = WIDTH, .act = MBP_ACT_RELU, .seed = 3};
	mbp_model *m;
	if (mbp_model_write_random(path, &sp) < 0 || mbp_model_load(&m, path, NULL) < 0)
		return 1;
	unlink(path);
	rmdir(dir);
	float x[INPUTS * WIDTH], ref[INPUTS][WIDTH];
	for (unsigned i = 0; i < INPUTS * WIDTH; i++)
		x[i] = (float)((i * 37 % 101) / 50.0 - 1.0);
	mbp_model_forward(m, x, &ref[0][0], INPUTS, 1);

	double per_us = burn_calibrate();
	struct opts op = {.layers = layers,
			  .unit_steps = unit_us * per_us,
			  .unit_us = unit_us,
			  .before = before,
			  .after = after,
			  .span = span,
			  .window = window};
	int bad = cc == CASE_SWAP ? swap_case(m, &op, x, ref) : replica_case(m, &op, x, ref);
	mbp_model_destroy(m);
	return bad;
}

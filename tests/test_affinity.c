/*
 * Placement (lib/affinity.c): the placement plan as a function of its request, and the process-wide
 * record of pinned CPUs as pipelines of one process see it (disjoint CPUs while there are enough, sharing
 * the least taken ones after, a failed pin holding none, a cgroup quota's thread count).
 */
#include "config.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <mbpipe.h>

#include "affinity.h"

#include "check_main.h"
#include "pipeline_rig.h"

static mbp_placement placement_of(mbp_pipeline *p, unsigned stage)
{
	mbp_placement pl[MBP_MAX_STAGES];
	ck_assert_int_gt(mbp_pipeline_placement(p, pl, MBP_MAX_STAGES), (int)stage);
	ck_assert_int_eq(pl[stage].pin_error, 0);
	return pl[stage];
}

/* Two pipelines of one process: the second takes the CPU the first left free, not the first one again
 * (placement 0,0,1 was seen); a CPU given back at stop is the next one taken. */
START_TEST(two_pipelines_of_one_process_take_disjoint_cpus_while_there_are_enough)
{
	int allowed[MBP_MAX_CPUS];
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL);
	ck_assert_int_ge(n, 1);
	if (n < 2)
		return; /* one CPU: nothing to keep apart (the next test covers sharing) */
	mbp_pipeline *a = started(1, 0), *b = started(1, 0);
	ck_assert_int_eq(placement_of(a, 0).cpu, allowed[0]);
	ck_assert_int_eq(placement_of(b, 0).cpu, allowed[1]);
	ck_assert_uint_eq(placement_of(a, 0).sharing, 0);
	ck_assert_uint_eq(placement_of(b, 0).sharing, 0);
	ck_assert_int_eq(mbp_pipeline_drain(a, -1), 0); /* gives allowed[0] back */
	mbp_pipeline *c = started(1, 0);
	ck_assert_int_eq(placement_of(c, 0).cpu, allowed[0]);
	mbp_pipeline_destroy(c);
	mbp_pipeline_destroy(b);
	mbp_pipeline_destroy(a);
	/* two stages beside a pipeline that holds allowed[0]: its threads take the next CPUs, in order */
	if (n >= 3) {
		a = started(1, 0);
		b = started(2, 2);
		ck_assert_int_eq(placement_of(b, 0).cpu, allowed[1]);
		ck_assert_int_eq(placement_of(b, 1).cpu, allowed[2]);
		mbp_pipeline_destroy(b);
		mbp_pipeline_destroy(a);
	}
}
END_TEST

/* pipeline.h, "Placement": once every CPU is taken, the next threads share the least taken CPUs, still
 * pinned, and the placement counts who shares; a CPU given back stops counting. */
START_TEST(once_every_cpu_is_taken_threads_share_the_least_taken_and_say_so)
{
	int allowed[MBP_MAX_CPUS];
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL);
	ck_assert_int_ge(n, 1);
	if (n > MBP_MAX_STAGES)
		return; /* a pipeline cannot take every CPU here */
	const unsigned S = (unsigned)n;
	mbp_pipeline *full = started(S, S); /* one thread on each CPU */
	for (unsigned k = 0; k < S; k++) {
		ck_assert_int_eq(placement_of(full, k).cpu, allowed[k]);
		ck_assert_uint_eq(placement_of(full, k).sharing, 0);
	}
	mbp_pipeline *b = started(1, 0);
	mbp_placement pb = placement_of(b, 0);
	ck_assert_int_eq(pb.cpu, allowed[0]); /* every CPU held once: the first */
	ck_assert_uint_eq(pb.sharing, 1);
	ck_assert_uint_eq(placement_of(full, 0).sharing, 1); /* the first pipeline sees it too */
	mbp_pipeline *c = started(1, 0);
	ck_assert_int_eq(placement_of(c, 0).cpu, allowed[S > 1 ? 1 : 0]); /* the least taken */
	ck_assert_uint_eq(placement_of(c, 0).sharing, S > 1 ? 1 : 2);
	/* it runs, pinned there */
	uint32_t in[WORDS] = {1, 2, 3, 4}, out[WORDS] = {0};
	ck_assert_int_eq(mbp_run(b, in, out, 1, 1), 0);
	ck_assert_mem_eq(in, out, sizeof(in));
	ck_assert_int_eq(mbp_pipeline_drain(b, -1), 0);
	ck_assert_uint_eq(placement_of(b, 0).sharing, 0); /* stopped */
	ck_assert_uint_eq(placement_of(full, 0).sharing, 0);
	mbp_pipeline_destroy(c);
	mbp_pipeline_destroy(b);
	mbp_pipeline_destroy(full);
}
END_TEST

/* A pin that fails is reported (placement: cpu -1, pin_error) and holds no CPU: the next pipeline takes
 * the CPU it would have had. */
START_TEST(a_failed_pin_is_reported_and_holds_no_cpu)
{
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL), 1);
	mbp__pin_fail_set(-EPERM);
	mbp_pipeline *a = started(1, 0);
	mbp__pin_fail_set(0);
	mbp_placement pl;
	ck_assert_int_eq(mbp_pipeline_placement(a, &pl, 1), 1);
	ck_assert_int_eq(pl.pin_error, -EPERM);
	ck_assert_int_eq(pl.cpu, -1);
	ck_assert_uint_eq(pl.sharing, 0);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0);
	mbp_pipeline *b = started(1, 0);
	ck_assert_int_eq(placement_of(b, 0).cpu, allowed[0]);
	mbp_pipeline_destroy(b);
	mbp_pipeline_destroy(a);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0); /* nothing given back twice, nothing kept */
}
END_TEST

/* Threads placed under a cgroup CPU quota (faked: cpu.max of one CPU): the default thread count is the
 * quota's, whatever the cpuset allows. */
START_TEST(a_cgroup_quota_sets_the_default_thread_count)
{
	char file[] = "/tmp/mbp-cpu-max-XXXXXX";
	int fd = mkstemp(file);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "100000 100000\n", 14), 14);
	close(fd);
	mbp__cgroup_cpu_max_set(file);
	unsigned quota = 0;
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, &quota), 1);
	ck_assert_uint_eq(quota, 1);
	mbp_pipeline *p = started(3, 0);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.threads, 1);
	mbp_pipeline_destroy(p);
	mbp__cgroup_cpu_max_set(NULL);
	unlink(file);
}
END_TEST

/* The placement plan is a function of its request: threads take consecutive stages, a thread's CPU comes
 * from the list (blocks of threads per CPU when they outnumber it), stages of one thread must agree on a
 * named CPU, and unpinned means no CPU at all. */
/* Give back what a plan claimed (the pipeline does it when its threads stop). */
static void unplan(const struct mbp__placement_plan *pl)
{
	for (unsigned t = 0; t < pl->nthreads; t++)
		mbp__cpu_release(pl->thread_cpu[t]);
}

START_TEST(placement_plan_follows_threads_names_and_cpu_list)
{
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL), 1);
	const int a = allowed[0];
	int none[4] = {-1, -1, -1, -1}, cpus[2] = {a, a};
	struct mbp__placement_plan pl;
	struct mbp__placement_req rq = {
	    .nstages = 4, .threads = 2, .pin = true, .named = none, .ncpus = 2, .cpus = cpus};
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, 2);
	static const unsigned thread_of[4] = {0, 0, 1, 1};
	for (unsigned i = 0; i < 4; i++) {
		ck_assert_uint_eq(pl.thread_of[i], thread_of[i]);
		ck_assert_int_eq(pl.cpu[i], a);
		ck_assert(pl.pin_required[i]); /* a CPU list is asked for */
	}
	/* four threads on a list of one CPU: all on it, oversubscribed, so waits must not spin */
	rq.threads = 4;
	rq.ncpus = 1;
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, 4);
	ck_assert(pl.oversubscribed);
	for (unsigned i = 0; i < 4; i++) {
		ck_assert_uint_eq(pl.thread_of[i], i);
		ck_assert_int_eq(pl.cpu[i], a);
	}
	/* stages of one thread naming different CPUs */
	int named[2] = {a, a + 1};
	struct mbp__placement_req two = {.nstages = 2, .threads = 1, .pin = true, .named = named};
	ck_assert_int_eq(mbp__placement_plan(&two, &pl), -EINVAL);
	ck_assert_uint_eq(mbp__cpu_claims(a + 1), 0); /* refused: nothing claimed */
	/* one of them naming a CPU: the whole thread goes there, and must */
	named[0] = -1;
	ck_assert_int_eq(mbp__placement_plan(&two, &pl), 0);
	unplan(&pl);
	ck_assert_int_eq(pl.cpu[0], a + 1);
	ck_assert(pl.pin_required[0] && pl.pin_required[1]);
	/* unpinned: no CPU, names ignored, one thread per stage while they fit */
	two.pin = false;
	two.threads = 0;
	ck_assert_int_eq(mbp__placement_plan(&two, &pl), 0);
	unplan(&pl);
	ck_assert_int_eq(pl.cpu[0], -1);
	ck_assert_int_eq(pl.cpu[1], -1);
	ck_assert(!pl.pin_required[0]);
	/* more threads asked than stages: one per stage */
	rq.threads = 9;
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, 4);
	ck_assert_uint_eq(mbp__cpu_claims(a), 0); /* every plan's claims given back */
}
END_TEST

/* One stage on its CPU: its waits spin (it has the CPU alone), but not where the plan is a rank's part of
 * its node (a run across ranks): there the communication thread, which makes the MPI copies, is the
 * other busy thread on that CPU, and a stage thread spinning between micro-batches takes its slice. */
START_TEST(a_rank_of_a_run_across_ranks_counts_its_communication_thread_and_does_not_spin_on_one_cpu)
{
	int allowed[MBP_MAX_CPUS], n;
	unsigned navail = usable_cpus(allowed, &n);
	int none[1] = {-1};
	struct mbp__placement_plan pl;
	struct mbp__placement_req rq = {.nstages = 1, .named = none, .ncpus = 1, .cpus = allowed};
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, 1);
	ck_assert(!pl.oversubscribed);
	/* the same stage as rank 0's part of a node whose ranks split the CPUs one each */
	rq = (struct mbp__placement_req){.nstages = 1, .named = none, .node_k = 0, .node_m = (unsigned)n};
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, 1);
	ck_assert(pl.oversubscribed);
	/* a rank alone on its node with more CPUs than its stage and the communication thread: it spins */
	if (navail >= 2) {
		rq.node_m = 1;
		ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
		unplan(&pl);
		ck_assert(!pl.oversubscribed);
	}
}
END_TEST

/* The communication thread is not pinned: where opts.cpus lists fewer CPUs than the rank may use, it runs
 * on one of the others, so a stage on each listed CPU still spins; where the list takes all of them, it
 * shares one with a stage, and the stages do not spin. */
START_TEST(the_communication_thread_counts_only_where_the_plan_takes_all_of_the_ranks_cpus)
{
	int allowed[MBP_MAX_CPUS], n;
	ck_assert_uint_ge(usable_cpus(allowed, &n), 1);
	/* on two of them, so that a plan's stages can take them all on any machine (CI's have more CPUs
	 * than a plan has stages); the test runs in a process of its own (restored anyway, for CK_FORK=no) */
	cpu_set_t was, two;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(was), &was), 0);
	CPU_ZERO(&two);
	for (int i = 0; i < n && i < 2; i++)
		CPU_SET(allowed[i], &two);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(two), &two), 0);
	unsigned navail = usable_cpus(allowed, &n);
	if (navail < 2) {
		ck_assert_int_eq(sched_setaffinity(0, sizeof(was), &was), 0);
		return; /* one CPU (or a quota of one): a list of fewer than the rank's CPUs cannot be */
	}
	int none[MBP_MAX_STAGES];
	for (unsigned i = 0; i < MBP_MAX_STAGES; i++)
		none[i] = -1;
	struct mbp__placement_plan pl;
	/* a rank alone on its node, one stage pinned to the first of its CPUs */
	struct mbp__placement_req rq = {
	    .nstages = 1, .pin = true, .named = none, .ncpus = 1, .cpus = allowed, .node_m = 1};
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, 1);
	ck_assert(!pl.oversubscribed);
	/* navail - 1 stages on navail - 1 listed CPUs: one is left for the communication thread */
	rq.nstages = rq.ncpus = navail - 1;
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, navail - 1);
	ck_assert(!pl.oversubscribed);
	/* a stage on each of the rank's CPUs: the communication thread shares one */
	rq.nstages = rq.ncpus = navail;
	ck_assert_int_eq(mbp__placement_plan(&rq, &pl), 0);
	unplan(&pl);
	ck_assert_uint_eq(pl.nthreads, navail);
	ck_assert(pl.oversubscribed);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(was), &was), 0);
}
END_TEST

/* A rank of a run across ranks finds its part of its node's CPUs (affinity.c, no MPI): it is the k-th, in
 * rank order, of the m ranks given the same CPUs as its own; a rank given other CPUs counts in neither. */
START_TEST(a_rank_is_the_kth_of_the_ranks_of_its_node_given_the_same_cpus)
{
	cpu_set_t all[4];
	for (int r = 0; r < 4; r++)
		CPU_ZERO(&all[r]);
	CPU_SET(0, &all[0]);
	CPU_SET(1, &all[0]);
	all[1] = all[3] = all[0];
	CPU_SET(1, &all[2]); /* a subset of the others' is other CPUs */
	const unsigned want_k[] = {0, 1, 0, 2}, want_m[] = {3, 3, 1, 3};
	for (unsigned me = 0; me < 4; me++) {
		unsigned k = 99, m = 99;
		mbp__node_part(all, 4, me, &k, &m);
		ck_assert_uint_eq(k, want_k[me]);
		ck_assert_uint_eq(m, want_m[me]);
	}
	unsigned k = 99, m = 99;
	mbp__node_part(all, 1, 0, &k, &m); /* alone on its node */
	ck_assert_uint_eq(k, 0);
	ck_assert_uint_eq(m, 1);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("affinity");
	TCase *tc = tcase_create("affinity");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, two_pipelines_of_one_process_take_disjoint_cpus_while_there_are_enough);
	tcase_add_test(tc, once_every_cpu_is_taken_threads_share_the_least_taken_and_say_so);
	tcase_add_test(tc, a_failed_pin_is_reported_and_holds_no_cpu);
	tcase_add_test(tc, a_cgroup_quota_sets_the_default_thread_count);
	tcase_add_test(tc, placement_plan_follows_threads_names_and_cpu_list);
	tcase_add_test(
	    tc, a_rank_of_a_run_across_ranks_counts_its_communication_thread_and_does_not_spin_on_one_cpu);
	tcase_add_test(tc, the_communication_thread_counts_only_where_the_plan_takes_all_of_the_ranks_cpus);
	tcase_add_test(tc, a_rank_is_the_kth_of_the_ranks_of_its_node_given_the_same_cpus);
	suite_add_tcase(s, tc);
	return s;
}

/*
 * The crew (crew.h): plan, start with its handshake, the threads' set-up and tear-down, stop, the report
 * of where each stage runs, and the barrier of a crew that works in rounds.
 *
 * The rule at start, the same for every engine: a thread pins itself first (a failed pin gives its claim
 * back; it fails the start only where the CPU was asked for), makes its pool cache, then runs the init of
 * each of its stages in stage order, also after one failed, so that every init's outcome is known; the
 * controller waits until every thread has got that far, then tells them all to go, or, after any error,
 * to abort. Either way a thread runs the fini of each of its stages whose init succeeded, in reverse stage
 * order, on the thread that ran the init, before it exits.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "crew.h"

void mbp__crew_init(struct mbp__crew *c, const char *engine, mbp__crew_run_fn run, void *arg)
{
	memset(c, 0, sizeof(*c));
	c->engine = engine;
	c->run = run;
	c->arg = arg;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
}

void mbp__crew_destroy(struct mbp__crew *c)
{
	mbp__crew_stop(c);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
}

int mbp__crew_plan(struct mbp__crew *c, const struct mbp__placement_req *rq, uint64_t spin_ns,
		   uint64_t yield_ns)
{
	MBP_VERIFY(!c->planned && rq->nstages >= 1 && rq->nstages <= MBP_MAX_STAGES);
	struct mbp__placement_plan pl;
	int rc = mbp__placement_plan(rq, &pl);
	c->nstages = rq->nstages;
	memcpy(c->thread_of, pl.thread_of, sizeof(c->thread_of)); /* also on -EINVAL: say which stages */
	if (rc)
		return rc;
	c->planned = c->claimed = true;
	c->nthreads = pl.nthreads;
	c->node_sharers = pl.node_sharers;
	for (unsigned t = 0; t < pl.nthreads; t++)
		c->th[t] = (struct mbp__crew_thread){
		    .crew = c, .idx = t, .first = UINT32_MAX, .cpu = pl.thread_cpu[t]};
	for (unsigned s = 0; s < rq->nstages; s++) {
		struct mbp__crew_thread *th = &c->th[pl.thread_of[s]];
		if (th->first == UINT32_MAX)
			th->first = s;
		th->last = s;
		th->pin_required |=
		    pl.pin_required[s]; /* the plan asks it of every stage of a thread alike */
	}
	/* Threads that want to run outnumber the CPUs: spinning only burns the slice the peer needs. */
	c->wopts = (struct mbp__wait_opts){.spin_ns = mbp__wait_budget(spin_ns, MBP__SPIN_NS_DEFAULT),
					   .yield_ns = mbp__wait_budget(yield_ns, MBP__YIELD_NS_DEFAULT),
					   .no_spin = pl.oversubscribed};
	return 0;
}

/* ---- a thread of the crew ---- */

/* The replica the calling thread runs (mbp_stage_replica): set by each crew thread before its inits. */
static _Thread_local unsigned replica_self;

unsigned mbp_stage_replica(void)
{
	return replica_self;
}

/* Its name, as ps and gdb show it: the engine and its stages, within the kernel's 15 characters. */
static void name_thread(const struct mbp__crew *c, const struct mbp__crew_thread *th)
{
	char name[16];
	if (c->unit_stage) /* a pipeline with replicas: stage.replica */
		snprintf(name, sizeof(name), "mbp-%s-%u.%u", c->engine, c->unit_stage[th->first],
			 c->unit_replica[th->first]);
	else if (th->first == th->last)
		snprintf(name, sizeof(name), "mbp-%s-%u", c->engine, th->first);
	else
		snprintf(name, sizeof(name), "mbp-%s-%u-%u", c->engine, th->first, th->last);
	pthread_setname_np(pthread_self(), name);
}

/* Pin, make the cache, run every stage's init in order. Returns the first error. */
static int thread_init(struct mbp__crew *c, struct mbp__crew_thread *th)
{
	int rc = 0;
	if (th->cpu >= 0) {
		th->pin_error = mbp__pin_claimed(th->cpu); /* a failure gives the claim back */
		if (th->pin_error && th->pin_required)
			rc = th->pin_error;
	}
	if (rc == 0 && c->pool)
		rc = mbp_pool_cache_new(c->pool, &th->cache);
	if (rc)
		return rc;
	for (unsigned s = th->first; s <= th->last; s++) {
		if (c->thread_of[s] != th->idx)
			continue; /* a chunk of another thread (a chunked training schedule) */
		const struct mbp__crew_stage *st = &c->stage[s];
		int r = st->init ? st->init(st->ctx, c->unit_stage ? c->unit_stage[s] : s) : 0;
		if (r > 0)
			r = -EPROTO; /* an init returns 0 or a negative errno */
		c->init_ok[s] = r == 0;
		if (r && !rc)
			rc = r;
	}
	return rc;
}

/* Report this thread's outcome and wait for the decision: 1 go, -1 abort. The start's error is that of
 * the lowest thread that failed (so of the first stage in order), whichever arrives first. */
static int handshake(struct mbp__crew *c, const struct mbp__crew_thread *th, int rc)
{
	pthread_mutex_lock(&c->lock);
	c->arrived++;
	if (rc && (!c->start_err || th->idx < c->err_thread)) {
		c->start_err = rc;
		c->err_thread = th->idx;
	}
	pthread_cond_broadcast(&c->cond);
	while (c->go == 0)
		pthread_cond_wait(&c->cond, &c->lock);
	int go = c->go;
	pthread_mutex_unlock(&c->lock);
	return go;
}

static void *crew_thread(void *arg)
{
	struct mbp__crew_thread *th = arg;
	struct mbp__crew *c = th->crew;
	replica_self = c->unit_replica ? c->unit_replica[th->first] : 0;
	name_thread(c, th);
	if (handshake(c, th, thread_init(c, th)) > 0)
		c->run(c->arg, th);
	for (unsigned s = th->last + 1; s-- > th->first;)
		if (c->thread_of[s] == th->idx && c->init_ok[s] && c->stage[s].fini)
			c->stage[s].fini(c->stage[s].ctx);
	mbp_pool_cache_destroy(th->cache);
	th->cache = NULL;
	return NULL;
}

/* ---- start, stop ---- */

int mbp__crew_start(struct mbp__crew *c)
{
	MBP_VERIFY(c->planned && c->arrived == 0);
	int rc = 0;
	unsigned launched = 0;
	for (unsigned t = 0; t < c->nthreads; t++) {
		rc = -pthread_create(&c->th[t].tid, NULL, crew_thread, &c->th[t]);
		if (rc)
			break;
		c->th[t].started = true;
		launched++;
	}
	pthread_mutex_lock(&c->lock);
	while (c->arrived < launched)
		pthread_cond_wait(&c->cond, &c->lock);
	if (rc == 0)
		rc = c->start_err;
	c->go = rc == 0 ? 1 : -1;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (rc)
		mbp__crew_stop(c); /* each thread ran the fini of its stages whose init succeeded */
	return rc;
}

void mbp__crew_stop(struct mbp__crew *c)
{
	for (unsigned t = 0; t < c->nthreads; t++)
		if (c->th[t].started) {
			pthread_join(c->th[t].tid, NULL);
			c->th[t].started = false;
		}
	if (!c->claimed)
		return;
	for (unsigned t = 0; t < c->nthreads; t++)
		if (c->th[t].cpu >= 0 && !c->th[t].pin_error) /* a failed pin gave its claim back */
			mbp__cpu_release(c->th[t].cpu);
	c->claimed = false;
}

mbp_placement mbp__crew_place(const struct mbp__crew *c, unsigned stage, bool holding)
{
	mbp_placement pl = {.cpu = -1};
	if (!c->planned || stage >= c->nstages)
		return pl;
	const struct mbp__crew_thread *th = mbp__crew_thread_of(c, stage);
	pl.thread = th->idx;
	pl.pin_error = th->pin_error;
	pl.cpu = th->pin_error ? -1 : th->cpu;
	if (pl.cpu >= 0 && holding)
		pl.sharing = mbp__cpu_sharing(pl.cpu, c->node_sharers);
	return pl;
}

/* ---- the barrier ---- */

void mbp__crew_barrier_wait(const struct mbp__crew *c, struct mbp__crew_barrier *b, void (*last)(void *),
			    void *arg)
{
	uint32_t g = mbp__gen_get(&b->gen);
	/* acq_rel; partner: the other arrivals' increments: orders this thread's writes before its arrival,
	 * and the last to arrive sees all of them */
	if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) + 1 == c->nthreads) {
		/* relaxed: nobody arrives again until gen moves, and the bump below publishes it */
		atomic_store_explicit(&b->count, 0, memory_order_relaxed);
		if (last)
			last(arg);
		mbp__gen_bump(&b->gen); /* every waiter leaves, seeing what the arrivals wrote */
		return;
	}
	mbp__gen_wait_spin(&b->gen, g, &c->wopts);
}

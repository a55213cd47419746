/*
 * Statistics: snapshots of single-writer counters (relaxed loads) and the window between two snapshots;
 * the activity log of the stages as a trace file (trace.c writes it).
 *
 * The bubble is the share of the worker threads' time that was not spent computing:
 * 1 - sum(busy) / (T x wall), T threads (= S stages unless stages share threads). For S balanced stages
 * on their own threads and M micro-batches per batch, fill and drain alone give GPipe's (S-1)/(M+S-1);
 * imbalance, hand-off overhead and waiting for input add to it.
 */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "pipeline_internal.h"

/* A time total including the state under way; partner of state_end() in worker.c. Read the total first
 * (acquire), then `since`: a total that already includes the interval comes with `since` cleared. */
static uint64_t timed(_Atomic uint64_t *total, _Atomic uint64_t *since, uint64_t now)
{
	uint64_t t = atomic_load_explicit(total, memory_order_acquire);
	uint64_t t0 = atomic_load_explicit(since, memory_order_relaxed); /* relaxed: ordered by the acquire */
	return t0 && now > t0 ? t + (now - t0) : t;
}

/* Throughput and bubble over the snapshot's window, from the stages' summed busy time. */
static void derive(mbp_pipeline_stats *ps, uint64_t busy_sum)
{
	double wall = (double)(ps->now_ns - ps->start_ns) / 1e9;
	ps->throughput = wall > 0 ? (double)ps->rows_completed / wall : 0;
	ps->bubble = wall > 0 && ps->threads ? 1.0 - (double)busy_sum / 1e9 / (wall * ps->threads) : 0;
	if (ps->bubble < 0)
		ps->bubble = 0;
}

/* Add the counters of one copy of a stage (a replica, or the stage itself) into `o`. */
static void add_copy(struct mbp__stage *s, uint64_t now, mbp_stage_stats *o)
{
	struct mbp__stage_counters *c = &s->c;
	o->mbs += mbp__counter_get(&c->mbs);
	o->rows += mbp__counter_get(&c->rows);
	o->failed += mbp__counter_get(&c->failed);
	o->busy_ns += timed(&c->busy_ns, &c->busy_since, now);
	o->starved_ns += timed(&c->starved_ns, &c->starved_since, now);
	o->blocked_ns += timed(&c->blocked_ns, &c->blocked_since, now);
	o->parked_ns += timed(&c->parked_ns, &c->parked_since, now);
	for (unsigned b = 0; b < MBP_HIST_BUCKETS; b++)
		o->hist[b] += mbp__counter_get(&c->hist[b]);
}

/* The header of a stage's entry: its name, CPU (replica 0's: its own for a replica's entry), input (its
 * ring, window or the ingress; the replicas of a stage share one window). */
static void stage_head(struct mbp_pipeline *p, struct mbp__stage *s, mbp_stage_stats *o, unsigned replicas)
{
	memset(o, 0, sizeof(*o));
	memcpy(o->name, s->name, sizeof(o->name));
	o->cpu = mbp__stage_cpu(s);
	o->replicas = replicas;
	/* relaxed: a statistic, the count last set (mbp_pipeline_replicas_set) */
	uint32_t active = atomic_load_explicit(&p->park.active[s->idx], memory_order_relaxed);
	o->active = replicas > 1 ? active : s->replica < active; /* a replica's own entry: 1 or 0 */
	if (s->in) {
		o->ring_occupancy = mbp__ring_count(s->in);
		o->ring_capacity = s->in->capacity;
	} else if (s->win_in) { /* a replicated stage, or the one after it: a sequenced window */
		o->ring_occupancy = mbp__seqwin_count(s->win_in);
		o->ring_capacity = s->win_in->capacity;
	} else if (s->idx == 0) {
		o->ring_occupancy = mbp__ingress_queued(&p->ingress);
		o->ring_capacity = mbp__ingress_depth(&p->ingress);
	}
}

int mbp_pipeline_stats_get(mbp_pipeline *p, mbp_pipeline_stats *ps, mbp_stage_stats *ss, unsigned n)
{
	if (!p || !ps || (!ss && n))
		return -EINVAL;
	memset(ps, 0, sizeof(*ps));
	ps->stages = p->nstages;
	ps->threads = p->crew.nthreads ? p->crew.nthreads : p->nstages; /* known once started */
	ps->start_ns = p->start_ns;
	ps->now_ns = mbp__clock_ns();
	/* relaxed, both: statistics (multi-writer counters of the submitters) */
	ps->jobs_accepted = atomic_load_explicit(&p->jobs_accepted, memory_order_relaxed);
	ps->mbs_accepted = atomic_load_explicit(&p->mbs_accepted, memory_order_relaxed);
	uint64_t busy = 0;
	for (unsigned i = 0; i < p->nstages; i++) {
		struct mbp__stage *s = &p->stages[i];
		mbp_stage_stats o;
		stage_head(p, s, &o, s->replicas);
		for (unsigned j = 0; j < s->replicas; j++) {
			struct mbp__stage_counters *c = &mbp__stage_replica(s, j)->c;
			ps->jobs_completed += mbp__counter_get(&c->done_jobs);
			ps->jobs_failed += mbp__counter_get(&c->done_failed_jobs);
			ps->mbs_completed += mbp__counter_get(&c->done_mbs);
			ps->mbs_failed += mbp__counter_get(&c->done_failed_mbs);
			ps->rows_completed += mbp__counter_get(&c->done_rows);
			add_copy(mbp__stage_replica(s, j), ps->now_ns, &o);
		}
		busy += o.busy_ns;
		if (i < n)
			ss[i] = o;
	}
	ps->ingress_queued = mbp__ingress_queued(&p->ingress);
	if (p->pool)
		mbp_pool_stats_get(p->pool, &ps->pool);
	if (p->mb_pool)
		mbp_pool_stats_get(p->mb_pool, &ps->mb_pool);
	if (p->start_ns == 0) /* not started */
		ps->start_ns = ps->now_ns;
	derive(ps, busy);
	return (int)p->nstages;
}

int mbp_pipeline_replica_stats(mbp_pipeline *p, unsigned stage, mbp_stage_stats *out, unsigned n)
{
	if (!p || stage >= p->nstages || (!out && n))
		return -EINVAL;
	struct mbp__stage *s = &p->stages[stage];
	uint64_t now = mbp__clock_ns();
	for (unsigned j = 0; j < s->replicas && j < n; j++) {
		struct mbp__stage *c = mbp__stage_replica(s, j);
		stage_head(p, c, &out[j], 1);
		add_copy(c, now, &out[j]);
	}
	return (int)s->replicas;
}

void mbp_stats_window(mbp_pipeline_stats *b, mbp_stage_stats *bs, const mbp_pipeline_stats *a,
		      const mbp_stage_stats *as, unsigned n)
{
	b->start_ns = a->now_ns;
	b->jobs_accepted -= a->jobs_accepted;
	b->jobs_completed -= a->jobs_completed;
	b->jobs_failed -= a->jobs_failed;
	b->mbs_accepted -= a->mbs_accepted;
	b->mbs_completed -= a->mbs_completed;
	b->mbs_failed -= a->mbs_failed;
	b->rows_completed -= a->rows_completed;
	uint64_t busy = 0;
	for (unsigned i = 0; i < n; i++) {
		bs[i].mbs -= as[i].mbs;
		bs[i].rows -= as[i].rows;
		bs[i].failed -= as[i].failed;
		bs[i].busy_ns -= as[i].busy_ns;
		bs[i].starved_ns -= as[i].starved_ns;
		bs[i].blocked_ns -= as[i].blocked_ns;
		bs[i].parked_ns -= as[i].parked_ns;
		for (unsigned k = 0; k < MBP_HIST_BUCKETS; k++)
			bs[i].hist[k] -= as[i].hist[k];
		busy += bs[i].busy_ns;
	}
	derive(b, busy);
}

int mbp_pipeline_trace_write(mbp_pipeline *p, const char *path)
{
	if (!p || !path || !p->o.trace_events)
		return -EINVAL;
	/* a track per thread: a replicated stage's replicas each have their own, "<name> replica <j>" */
	struct mbp__trace_track tk[MBP_MAX_STAGES];
	char names[MBP_MAX_STAGES][MBP_STAGE_NAME_MAX + 24];
	unsigned n = 0;
	for (unsigned i = 0; i < p->nstages; i++)
		for (unsigned j = 0; j < p->stages[i].replicas; j++, n++) {
			struct mbp__stage *c = mbp__stage_replica(&p->stages[i], j);
			const char *name = c->name;
			if (p->stages[i].replicas > 1) {
				snprintf(names[n], sizeof(names[n]), "%s replica %u", c->name, j);
				name = names[n];
			}
			tk[n] = (struct mbp__trace_track){
			    .name = name, .cpu = mbp__stage_cpu(c), .tr = &c->trace};
		}
	return mbp__trace_write(path, tk, n, p->start_ns);
}

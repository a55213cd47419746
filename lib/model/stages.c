/*
 * mbp_model_stages: one pipeline stage per contiguous range of layers.
 *
 * A stage owns two scratch buffers for the activations between its layers, allocated in its init on its
 * own thread (first touch there puts the pages on its node) and sized for the largest micro-batch, so the
 * hot path allocates nothing. Its first layer reads the micro-batch in place (a job's input rows, or the
 * previous stage's hop buffer) and its last layer writes the output buffer directly.
 *
 * Weights: stage 0 takes a reference to the current version for each micro-batch and stores it in
 * mb->carry (see mbp__version_get_rcu), unless its submitter pinned one there (mbp_model_mb_pin) or it
 * continues a job (job_version: one version per job); later stages compute with mb->carry; stage 0's done callback drops
 * the reference when the micro-batch leaves the pipeline, completed or failed. The model's stages own
 * mb->carry.
 *
 * Rebalancing (rebalance.c): stage 0 gives each micro-batch the window it is admitted in, with the
 * window's plan, in mb->carry_plan, and each stage computes its range of that plan, timed layer by layer
 * in the window's counters (each replica in counters of its own); stage 0's done callback counts the
 * micro-batch done in its window as it leaves. Without it a stage's range is fixed. With
 * rebalance.replicas a stage is made with that many threads (or its plan's replicas, if more):
 * mbp_model_stages_add makes the plan's replicas the active ones and a move sets the counts
 * (mbp_pipeline_replicas_set); each thread has its struct replica all the same.
 * Replicas (plan->replicas): the replicas of a stage share its weights read-only (the same versions, one
 * per micro-batch as above) and each has its own scratch and its own version bookkeeping (struct replica,
 * indexed by mbp_stage_replica()). A replicated stage 0 sees a job's micro-batches spread over its
 * replicas, so the version of each job under way is kept in a table shared by the replicas, under a lock
 * (jobs_v): still one version per job, and a job's entry goes when its last micro-batch has passed
 * stage 0, computed or failed by the stage's checks.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <urcu.h>

#include "common.h"
#include "model_internal.h"
#include "rebalance.h"

/* What each replica of a stage has of its own, on a line of its own. */
struct replica {
	MBP_CACHELINE_ALIGNED float *s0, *s1;
	/* stage 0: the version of the job under way, held (one reference) until its last micro-batch */
	struct mbp__version *job_v;
	const mbp_job *job;
	uint64_t job_seq;
};

/* A replicated stage 0's versions of the jobs under way: at most one per replica plus the one being
 * split is partly computed at any time. */
struct job_version_entry {
	const mbp_job *job;
	struct mbp__version *v; /* one reference, the table's; NULL until one of them is computed */
	uint32_t seen;		/* micro-batches of the job that passed stage 0, computed or failed */
};

struct stage {
	mbp_model *m;
	struct mbp__rb *rb; /* rebalancing: the range comes with each micro-batch's plan; NULL: off */
	unsigned idx, a, b; /* layers [a, b): without rebalancing, and its name */
	unsigned replicas;
	uint32_t max_rows;
	size_t scratch_floats; /* per buffer; 0 for a single-layer stage */
	char name[MBP_STAGE_NAME_MAX];
	struct replica *rep;		  /* replicas entries */
	pthread_mutex_t jobs_lock;	  /* replicated stage 0: the table below */
	struct job_version_entry *jobs_v; /* replicas + 1 entries; NULL unless replicated stage 0 */
};

/* Stage 0: the version for a job's micro-batch. A job's micro-batches pass stage 0 one after the other
 * (seq 0, 1, ...): the first takes the current version and the stage keeps a reference to it for the rest,
 * so a whole job is computed with one version; the reference goes with the job's last micro-batch. */
static struct mbp__version *job_version(struct replica *s, mbp_model *m, const mbp_mb *in)
{
	struct mbp__version *v;
	if (s->job_v && in->job == s->job && in->seq == s->job_seq + 1) {
		v = s->job_v;
		/* relaxed: the stage's own reference keeps v alive */
		atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
	} else {
		mbp__version_put(s->job_v);
		s->job_v = NULL;
		v = mbp__version_get_rcu(m);
		if (in->seq + 1 < in->job->mbs) {
			atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed); /* as above */
			s->job_v = v;
			s->job = in->job;
		}
	}
	s->job_seq = in->seq;
	if (s->job_v && in->seq + 1 >= in->job->mbs) { /* the job's last micro-batch */
		mbp__version_put(s->job_v);
		s->job_v = NULL;
	}
	return v;
}

/* A replicated stage 0: a job's micro-batch passes, computed (`take`: the job's version from the shared
 * table, the first of its micro-batches to be computed taking the current one) or failed by its checks
 * (no version: NULL). Every micro-batch counts, failed or not, so the entry and its version go with the
 * last of the job's micro-batches to pass, whatever order the replicas take them in. */
static struct mbp__version *shared_job_version(struct stage *s, const mbp_mb *in, bool take)
{
	const mbp_job *job = in->job;
	pthread_mutex_lock(&s->jobs_lock);
	struct job_version_entry *e = NULL, *empty = NULL;
	for (unsigned i = 0; i <= s->replicas; i++) {
		if (s->jobs_v[i].job == job)
			e = &s->jobs_v[i];
		else if (!s->jobs_v[i].job && !empty)
			empty = &s->jobs_v[i];
	}
	/* an empty entry is there: see struct job_version_entry (a table full of jobs cut short by a cancel
	 * would only cost this job its one version) */
	if (!e && job->mbs > 1 && empty) {
		e = empty;
		*e = (struct job_version_entry){.job = job};
	}
	struct mbp__version *v = NULL;
	if (take && e && e->v) {
		v = e->v;
		/* relaxed: the table's reference keeps v alive */
		atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
	} else if (take) {
		v = mbp__version_get_rcu(s->m);
		if (e) {
			/* relaxed: as above */
			atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
			e->v = v;
		}
	}
	if (e && ++e->seen == job->mbs) { /* its last micro-batch */
		mbp__version_put(e->v);
		*e = (struct job_version_entry){0};
	}
	pthread_mutex_unlock(&s->jobs_lock);
	return v;
}

/* Stage 0 fails a micro-batch by its checks: a replicated one counts a job's as passed all the same
 * (shared_job_version), or the job's entry would keep its version until fini. Returns err. */
static int stage0_refuse(struct stage *s, const mbp_mb *in, int err)
{
	if (s->jobs_v && in->job)
		shared_job_version(s, in, false);
	return err;
}

struct mbp_model_stages {
	mbp_model *m;
	struct mbp__rb *rb;
	uint32_t widest_hop; /* the widest activation any layer but the last hands on */
	unsigned n;
	struct stage s[];
};

static int stage_init(void *ctx, unsigned idx)
{
	struct stage *st = ctx;
	struct replica *s = &st->rep[mbp_stage_replica()];
	(void)idx;
	mbp__blas_one_thread();
	mbp__dense_thread_init(mbp_kernel_get() == MBP_KERNEL_PACKED); /* what versions loaded now run */
	if (st->scratch_floats) {
		s->s0 = mbp__scratch_alloc(st->scratch_floats);
		s->s1 = mbp__scratch_alloc(st->scratch_floats);
		if (!s->s0 || !s->s1) {
			free(s->s0);
			free(s->s1);
			s->s0 = s->s1 = NULL;
			return -ENOMEM;
		}
	}
	/* Stage 0 reads the RCU-protected weights pointer: its thread must be a registered reader. */
	if (st->idx == 0)
		rcu_register_thread();
	return 0;
}

static void stage_fini(void *ctx)
{
	struct stage *st = ctx;
	struct replica *s = &st->rep[mbp_stage_replica()];
	mbp__version_put(s->job_v); /* a job cut short (cancelled) left it */
	s->job_v = NULL;
	if (st->jobs_v) {
		pthread_mutex_lock(&st->jobs_lock);
		for (unsigned i = 0; i <= st->replicas; i++) { /* jobs cut short: whichever replica is last */
			mbp__version_put(st->jobs_v[i].v);
			st->jobs_v[i] = (struct job_version_entry){0};
		}
		pthread_mutex_unlock(&st->jobs_lock);
	}
	if (st->idx == 0)
		rcu_unregister_thread();
	free(s->s0);
	free(s->s1);
	s->s0 = s->s1 = NULL;
}

static int stage_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	struct stage *s = ctx;
	const unsigned ri = mbp_stage_replica();
	struct replica *r = &s->rep[ri];
	const mbp_model *m = s->m;
	struct mbp__version *v;
	const struct mbp__rb_win *win = NULL;
	unsigned a = s->a, b = s->b;
	if (s->idx == 0) /* ours to set: done() drops whatever is here; a pinned version is already ours */
		out->carry = in->job ? NULL : in->carry;
	if (s->rb) /* ours too, before any refusal: done() counts the window here (none: not admitted) */
		out->carry_plan = s->idx == 0 ? NULL : in->carry_plan;
	if (MBP_UNLIKELY(in->rows > s->max_rows))
		return stage0_refuse(s, in, -E2BIG);
	if (s->rb) {
		win = s->idx == 0 ? mbp__rb_admit(s->rb) : in->carry_plan;
		MBP_VERIFY(win != NULL); /* stage 0 always sets it */
		out->carry_plan = (void *)win;
		mbp__rb_range(win->plan, s->idx, &a, &b);
		out->row_bytes = m->l[b - 1].out * sizeof(float); /* the hop buffers fit the widest */
	}
	if (MBP_UNLIKELY(in->row_bytes != m->l[a].in * sizeof(float) ||
			 out->row_bytes != m->l[b - 1].out * sizeof(float) ||
			 out->capacity < (size_t)in->rows * out->row_bytes))
		return stage0_refuse(s, in, -EINVAL);
	if (s->idx == 0) {
		v = out->carry	? out->carry
		    : !in->job	? mbp__version_get_rcu(s->m)
		    : s->jobs_v ? shared_job_version(s, in, true)
				: job_version(r, s->m, in);
		out->carry = v;
	} else {
		v = in->carry;
		MBP_VERIFY(v != NULL); /* stage 0 always sets it on success */
		out->carry = v;
	}
	if (win)
		mbp__rb_run(s->rb, win, s->idx, ri, v, a, b, in, out->data, r->s0, r->s1);
	else
		mbp__layers_run(m, v, a, b, in->data, out->data, in->rows, r->s0, r->s1);
	return 0;
}

static void stage_done(void *ctx, mbp_mb *mb)
{
	const struct stage *s = ctx;
	mbp__version_put(mb->carry);
	mb->carry = NULL;
	if (s->rb && mb->carry_plan) { /* admitted: its window counts it done */
		mbp__rb_done(s->rb, mb->carry_plan);
		mb->carry_plan = NULL;
	}
}

static bool plan_fits(const mbp_model_plan *plan, unsigned layers)
{
	if (plan->stages < 1 || plan->stages > MBP_MAX_STAGES || plan->layers != layers ||
	    plan->first[0] != 0 || plan->first[plan->stages] != layers)
		return false;
	for (unsigned s = 0; s < plan->stages; s++)
		if (plan->first[s] >= plan->first[s + 1] || plan->replicas[s] > MBP_MAX_REPLICAS)
			return false;
	return true;
}

static void stages_free(mbp_model_stages *st)
{
	for (unsigned i = 0; i < st->n; i++) {
		free(st->s[i].rep);
		free(st->s[i].jobs_v);
		pthread_mutex_destroy(&st->s[i].jobs_lock);
	}
	mbp__rb_destroy(st->rb);
	free(st);
}

int mbp_model_stages_new(mbp_model_stages **out, mbp_model *m, const mbp_model_plan *plan,
			 uint32_t max_mb_rows)
{
	return mbp_model_stages_new_opts(out, m, plan, max_mb_rows, NULL);
}

int mbp_model_stages_new_opts(mbp_model_stages **out, mbp_model *m, const mbp_model_plan *plan,
			      uint32_t max_mb_rows, const mbp_model_stages_opts *o)
{
	if (!out || !m || !plan || !max_mb_rows || !plan_fits(plan, m->layers))
		return -EINVAL;
	const mbp_model_rebalance *ro = o && o->rebalance.on ? &o->rebalance : NULL;
	if (ro && (!isfinite(ro->threshold) || ro->threshold < 0))
		return -EINVAL;
	/* summed in 64 bits: rebalance.replicas is any unsigned, and 2 x 2^31 threads are not 0 */
	unsigned threads[MBP_MAX_STAGES];
	uint64_t all = 0;
	for (unsigned i = 0; i < plan->stages; i++)
		all += threads[i] = mbp__rb_threads(plan, ro, i);
	if (all > MBP_MAX_STAGES)
		return -E2BIG;
	mbp_model_stages *st = calloc(1, sizeof(*st) + plan->stages * sizeof(st->s[0]));
	if (!st)
		return -ENOMEM;
	if (ro && !(st->rb = mbp__rb_new(m, plan, ro, threads))) {
		free(st);
		return -ENOMEM;
	}
	st->m = m;
	st->n = plan->stages;
	for (unsigned k = 0; k + 1 < m->layers; k++)
		st->widest_hop = m->l[k].out > st->widest_hop ? m->l[k].out : st->widest_hop;
	for (unsigned i = 0; i < st->n; i++) {
		struct stage *s = &st->s[i];
		s->m = m;
		s->rb = st->rb;
		s->idx = i;
		s->a = plan->first[i];
		s->b = plan->first[i + 1];
		s->max_rows = max_mb_rows;
		s->replicas = threads[i]; /* the plan's, or more to spare for rebalancing */
		pthread_mutex_init(&s->jobs_lock, NULL);
		s->rep = aligned_alloc(MBP_CACHELINE, s->replicas * sizeof(*s->rep));
		if (s->rep)
			memset(s->rep, 0, s->replicas * sizeof(*s->rep));
		if (i == 0 && s->replicas > 1)
			s->jobs_v = calloc(s->replicas + 1, sizeof(*s->jobs_v));
		if (!s->rep || (i == 0 && s->replicas > 1 && !s->jobs_v)) {
			st->n = i + 1;
			stages_free(st);
			return -ENOMEM;
		}
		uint32_t w = 0; /* widest activation between this stage's layers; rebalancing: any layers' */
		for (unsigned k = s->a; k + 1 < s->b; k++)
			if (m->l[k].out > w)
				w = m->l[k].out;
		if (st->rb)
			w = st->widest_hop;
		if (w && !mbp__mul_size(w, max_mb_rows, &s->scratch_floats)) {
			st->n = i + 1;
			stages_free(st);
			return -ENOMEM;
		}
		if (s->b - s->a == 1)
			snprintf(s->name, sizeof(s->name), "layer %u", s->a);
		else
			snprintf(s->name, sizeof(s->name), "layers %u-%u", s->a, s->b - 1);
	}
	*out = st;
	return 0;
}

unsigned mbp_model_stages_count(const mbp_model_stages *st)
{
	return st ? st->n : 0;
}

int mbp_model_stage_desc(const mbp_model_stages *st, unsigned i, mbp_stage_desc *d)
{
	if (!st || !d)
		return -EINVAL;
	if (i >= st->n)
		return -ERANGE;
	const struct stage *s = &st->s[i];
	memset(d, 0, sizeof(*d));
	d->name = s->name;
	d->fn = stage_fn;
	d->init = stage_init;
	d->fini = stage_fini;
	d->done = i == 0 ? stage_done : NULL;
	d->ctx = (void *)s;
	d->out_row_bytes = (size_t)st->m->l[s->b - 1].out * sizeof(float);
	if (st->rb && i + 1 < st->n) /* the widest activation any plan hands over */
		d->out_row_bytes = (size_t)st->widest_hop * sizeof(float);
	d->replicas = s->replicas;
	return 0;
}

int mbp_model_stages_add(mbp_model_stages *st, mbp_pipeline *p)
{
	if (!st || !p)
		return -EINVAL;
	for (unsigned i = 0; i < st->n; i++) {
		mbp_stage_desc d;
		mbp_model_stage_desc(st, i, &d);
		int rc = mbp_pipeline_add_stage(p, &d);
		if (rc)
			return rc;
	}
	return mbp_model_stages_attach(st, p);
}

int mbp_model_stages_attach(mbp_model_stages *st, mbp_pipeline *p)
{
	if (!st || !p)
		return -EINVAL;
	if (mbp_pipeline_placement(p, NULL, 0) != -ENOTCONN) /* a placement exists once started */
		return -EBUSY;
	if (!st->rb)
		return 0; /* nothing to tell: the stages need their pipeline only to set active replicas */
	/* p's stages must be these, thread for thread: a move sets counts up to each stage's threads, and
	 * each thread indexes its struct replica */
	if (mbp_pipeline_replica_stats(p, st->n, NULL, 0) != -EINVAL)
		return -ERANGE; /* more stages */
	for (unsigned i = 0; i < st->n; i++)
		if (mbp_pipeline_replica_stats(p, i, NULL, 0) != (int)st->s[i].replicas)
			return -ERANGE; /* fewer stages, or other replicas */
	/* the plan's replicas active, the threads to spare parked until a move wants them */
	return mbp__rb_attach(st->rb, p);
}

void mbp_model_stages_destroy(mbp_model_stages *st)
{
	if (st)
		stages_free(st);
}

int mbp_model_stages_rebalance_stats(mbp_model_stages *st, mbp_model_rebalance_stats *out)
{
	if (!st || !out)
		return -EINVAL;
	if (!st->rb) {
		memset(out, 0, sizeof(*out));
		return 0;
	}
	return mbp__rb_stats(st->rb, out);
}

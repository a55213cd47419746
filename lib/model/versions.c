/*
 * Weights versions: the reference-counted struct mbp__version, the model's RCU-published current version,
 * the live swap (mbp_model_swap) and the public weights references (mbp_model_weights_*, mbp_model_mb_pin).
 *
 * The model's `current` pointer holds one reference and is RCU-protected: stage 0 loads it inside an RCU
 * read-side section and takes its own reference before leaving the section, so the version cannot be
 * freed between the load and the increment (a swap waits for a grace period before dropping the reference
 * "current" held). Threads not registered with RCU (forward, profile) read `current` under swap_lock,
 * which the swap holds while it exchanges the pointer. The last reference dropped frees the version, on
 * whichever thread drops it. See include/mbpipe/model.h for the whole design.
 *
 * ThreadSanitizer cannot see liburcu's pointer accesses (volatile loads and inline-asm exchanges), so TSan
 * builds publish and load `current` with the same orderings as compiler atomics; the grace period itself
 * is still liburcu's.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>

#include <urcu.h>

#include "common.h"
#include "model_internal.h"

#ifdef MBP_TSAN
/* acquire; partner: the acq_rel exchange in VERSION_XCHG: the version's contents are visible */
#define VERSION_LOAD(pp) __atomic_load_n(pp, __ATOMIC_ACQUIRE)
/* acq_rel; partner: VERSION_LOAD: publishes the new version's contents */
#define VERSION_XCHG(pp, v) __atomic_exchange_n(pp, v, __ATOMIC_ACQ_REL)
#else
/* rcu_dereference: dependency-ordered load; partner: rcu_xchg_pointer's release (contents visible) */
#define VERSION_LOAD(pp)    rcu_dereference(*(pp))
/* rcu_xchg_pointer: full barrier before the store; partner: rcu_dereference in VERSION_LOAD */
#define VERSION_XCHG(pp, v) rcu_xchg_pointer(pp, v)
#endif

void mbp__version_free(struct mbp__version *v)
{
	_Atomic unsigned *alive = v->alive;
	free(v->data);
	free(v->owned);
	free(v->packed);
	free(v->lw);
	free(v);
	if (alive)
		atomic_fetch_sub_explicit(alive, 1,
					  memory_order_relaxed); /* a statistic: nothing published */
}

struct mbp__version *mbp__version_get_rcu(mbp_model *m)
{
	rcu_read_lock();
	struct mbp__version *v = VERSION_LOAD(&m->current);
	/* relaxed: inside the read-side section v cannot be freed (the swap drops "current"'s reference
	 * only after a grace period), and the grace period orders this increment before that drop. */
	atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
	rcu_read_unlock();
	return v;
}

struct mbp__version *mbp__version_get_locked(mbp_model *m)
{
	pthread_mutex_lock(&m->swap_lock);
	struct mbp__version *v = m->current;
	/* relaxed: swap_lock keeps "current"'s reference in place while we add ours */
	atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
	pthread_mutex_unlock(&m->swap_lock);
	return v;
}

void mbp__version_put(struct mbp__version *v)
{
	if (!v)
		return;
	/* acq_rel: release our reads of the weights to the thread that frees; the one that drops the
	 * last reference acquires everyone's (an RMW chain, which TSan also understands, unlike a fence). */
	uint32_t before = atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel);
	MBP_VERIFY(before > 0);
	if (before == 1)
		mbp__version_free(v);
}

void mbp__versions_init(mbp_model *m, struct mbp__version *v)
{
	pthread_mutex_init(&m->swap_lock, NULL);
	atomic_init(&v->refs, 1); /* the reference "current" holds */
	v->id = m->last_id = 1;
	v->alive = &m->alive;
	atomic_init(&m->alive, 1);
	m->current = v;
}

void mbp__versions_fini(mbp_model *m)
{
	if (m->current) {
		/* Every micro-batch has left the pipeline (the pipeline is destroyed first): only "current"
		 * still holds a version. Anything else would be freed under a running stage. */
		MBP_VERIFY(atomic_load(&m->alive) == 1 && atomic_load(&m->current->refs) == 1);
		mbp__version_put(m->current);
	}
	pthread_mutex_destroy(&m->swap_lock);
}

/* ---- swap ---- */

static bool same_structure(const mbp_model *a, const mbp_model *b)
{
	if (a->layers != b->layers)
		return false;
	for (unsigned i = 0; i < a->layers; i++) {
		const struct mbp__layer *x = &a->l[i], *y = &b->l[i];
		if (x->in != y->in || x->out != y->out || x->act != y->act || x->norm != y->norm ||
		    (x->norm && x->eps != y->eps))
			return false;
	}
	return true;
}

int mbp_model_swap(mbp_model *m, mbp_model *next)
{
	if (!m || !next || m == next || !next->current || !same_structure(m, next))
		return -EINVAL;
	if (atomic_load(&next->alive) != 1 || atomic_load(&next->current->refs) != 1)
		return -EBUSY;
	struct mbp__version *nv = next->current;
	next->current = NULL;
	atomic_store(&next->alive, 0);
	atomic_fetch_add(&m->alive, 1);
	nv->alive = &m->alive;
	pthread_mutex_lock(&m->swap_lock);
	nv->id = ++m->last_id;
	struct mbp__version *old = VERSION_XCHG(&m->current, nv);
	pthread_mutex_unlock(&m->swap_lock);
	/* After the grace period no stage 0 can still be between loading `old` and taking its reference:
	 * every micro-batch that took it holds its own, and old is freed when the last one is done. */
	synchronize_rcu();
	mbp__version_put(old);
	mbp_model_destroy(next);
	return 0;
}

/* ---- weights references ---- */

/* The public handle is the version itself. */
static struct mbp__version *as_version(const mbp_model_weights *w)
{
	return (struct mbp__version *)(uintptr_t)w;
}

mbp_model_weights *mbp_model_weights_get(mbp_model *m)
{
	return m ? (mbp_model_weights *)(void *)mbp__version_get_locked(m) : NULL;
}

uint64_t mbp_model_weights_version(const mbp_model_weights *w)
{
	return w ? as_version(w)->id : 0;
}

void mbp_model_weights_put(mbp_model_weights *w)
{
	mbp__version_put(as_version(w));
}

int mbp_model_mb_pin(mbp_mb *mb, mbp_model_weights *w)
{
	if (!mb || !w || mb->carry)
		return -EINVAL;
	/* relaxed: the caller's reference keeps the version alive; submitting publishes mb to stage 0 */
	atomic_fetch_add_explicit(&as_version(w)->refs, 1, memory_order_relaxed);
	mb->carry = w;
	return 0;
}

void mbp_model_mb_unpin(mbp_mb *mb)
{
	if (!mb || !mb->carry)
		return;
	mbp__version_put(mb->carry);
	mb->carry = NULL;
}

uint64_t mbp_model_version(const mbp_model *m)
{
	if (!m)
		return 0;
	mbp_model *mm = (mbp_model *)m; /* the lock is not part of the model's value */
	pthread_mutex_lock(&mm->swap_lock);
	uint64_t id = mm->current ? mm->current->id : 0;
	pthread_mutex_unlock(&mm->swap_lock);
	return id;
}

unsigned mbp_model_versions_alive(const mbp_model *m)
{
	return m ? atomic_load_explicit(&m->alive, memory_order_relaxed) : 0;
}

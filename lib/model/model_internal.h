/*
 * Internal: the model's structure, its reference-counted weight versions and the layer kernels shared by
 * the sequential reference (mbp_model_forward) and the pipeline stages, so that both compute bit for bit
 * the same thing. Not installed.
 */
#ifndef MBP__MODEL_INTERNAL_H
#define MBP__MODEL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <mbpipe.h>

/* OpenBLAS threads each stage runs with (stages.c sets it at every stage's init; the profile times layers
 * with it; mbp_blas_info() says it). One: the pipeline, not OpenBLAS, owns the cores. */
#define MBP__BLAS_THREADS_PER_STAGE 1

/* The fixed structure of one layer (the same in every version). */
struct mbp__layer {
	uint32_t in, out;
	mbp_act act;
	bool norm;
	float eps;
	mbp_dtype dtype;
};

/* One layer's parameters in one version: float32, 4-byte aligned, in `data` or in `owned`. */
struct mbp__weights {
	const float *w;	       /* [out][in] */
	const float *b;	       /* [out] */
	const float *g, *beta; /* [out], NULL without norm */
};

/*
 * A weights version. refs counts: the model's "current" pointer (one reference while published) and
 * every micro-batch or forward call using it. The last put frees it, on whichever thread drops it.
 */
struct mbp__version {
	_Atomic uint32_t refs;
	uint64_t id;
	_Atomic unsigned *alive; /* the owning model's count of live versions */
	unsigned layers;
	struct mbp__weights *lw;
	void *data;   /* the file's data section as read (F32 tensors used in place), or NULL */
	float *owned; /* converted (F16/BF16) or realigned tensors */
};

struct mbp_model {
	unsigned layers;
	struct mbp__layer *l;
	uint32_t max_width;
	/* RCU-protected: read by stage 0 under rcu_read_lock (rcu_dereference), replaced by mbp_model_swap
	 * (rcu_xchg_pointer) under swap_lock; readers that are not RCU threads read it under swap_lock. */
	struct mbp__version *current;
	pthread_mutex_t swap_lock;
	uint64_t last_id; /* under swap_lock */
	_Atomic unsigned alive;
};

/* References to versions. get_rcu: the caller's thread is registered with RCU (stage 0). */
struct mbp__version *mbp__version_get_rcu(mbp_model *m);
struct mbp__version *mbp__version_get_locked(mbp_model *m);
void mbp__version_put(struct mbp__version *v);

/*
 * Run layers [a, b) on `rows` rows: x (rows x l[a].in) -> y (rows x l[b-1].out). s0 and s1 are scratch of
 * rows x max_width floats each, used for the activations between layers (unused when b == a + 1). Same
 * calls, same order, same result, wherever it runs.
 */
void mbp__layers_run(const mbp_model *m, const struct mbp__version *v, unsigned a, unsigned b, const float *x,
		     float *y, uint32_t rows, float *s0, float *s1);
/* One layer. */
void mbp__layer_run(const struct mbp__layer *l, const struct mbp__weights *w, const float *x, float *y,
		    uint32_t rows);

/* Aligned scratch of n floats (64-byte aligned, zeroed); NULL on failure. Free with free(). */
float *mbp__scratch_alloc(size_t n);

#endif

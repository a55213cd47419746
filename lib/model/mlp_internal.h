/*
 * Internal: the trainable model's layout, shared by its files (mlp.c: the model, stages, forward and
 * backward; optim.c: updates and losses; checkpoint.c: the optimizer state file). Not installed.
 */
#ifndef MBP__MLP_INTERNAL_H
#define MBP__MLP_INTERNAL_H

#include "model_internal.h"

#define MBP__PARTS 4 /* weight, bias, norm weight, norm bias (mbp_mlp_part) */

/*
 * Every array (parameters, gradients, moments) has the same layout: layer i's tensors at off[i][part]
 * (count[i][part] floats, 0 for an absent norm pair), each tensor starting on a cache line, layer i's
 * block being [start[i], start[i + 1]). A stage's slice of each array is [start[a], start[b]): no cache
 * line is shared between stages, and the padding stays zero in every array.
 */
struct mbp_mlp {
	unsigned layers;
	struct mbp__layer *l;
	struct mbp__weights *lw; /* views into param, for the forward kernels */
	uint32_t max_width;
	size_t (*off)[MBP__PARTS];
	size_t (*count)[MBP__PARTS];
	size_t *start; /* layers + 1 */
	size_t total;
	float *param, *grad, *m1, *m2; /* m1: AdamW's m or SGD's momentum (NULL without); m2: AdamW's v */
	uint64_t *step;		       /* per layer: updates applied */
	mbp_optim_opts opt;	       /* defaults applied */
	/* What the stages' products read: lw, but for the dense weights of a layer whose rows are a multiple
	 * of 4 KiB long, which lwp reads from a copy in wpad with its rows MBP__PAD_FLOATS further apart
	 * (OpenBLAS packs a matrix of such rows at 0.6-0.7 of its speed: every row falls in the same cache
	 * sets). The constructors and the updates keep the copy current; once mbp_mlp_tensor hands out a
	 * layer's weight parameters, that layer's lwp is its lw (a write through the pointer must be seen).
	 * The products give the same bits either way: a row's stride changes where OpenBLAS reads, not what
	 * it computes. */
	struct mbp__weights *lwp;
	float *wpad;
	/* Under the packed kernel (the kernel in use when the model was made), instead of the padded copy:
	 * each layer's dense weights and bias packed for that kernel (lwp[i].wp, dense.c's layout), kept
	 * current the same way: by the constructors and, element by element as each piece is updated, by
	 * the update (once per step, not once per micro-batch); dropped like the padded copy when
	 * mbp_mlp_tensor hands out the layer's weight or bias. */
	float *wpack;
};

#define MBP__PAD_FLOATS 16

/* A stage's model and layer range [a, b) (for optim.c). */
void mbp__mlp_stage_range(const mbp_mlp_stage *st, mbp_mlp **n, unsigned *a, unsigned *b);

/* Layer i's padded copy of its dense weights (rows lwp[i].ld floats apart), or NULL when its stages read
 * the parameters themselves. */
static inline float *mbp__mlp_pad(const mbp_mlp *n, unsigned i)
{
	return n->lwp[i].w != n->lw[i].w ? (float *)(uintptr_t)n->lwp[i].w : NULL;
}

/* Layer i's packed copy of its dense weights and bias, or NULL when its stages have none. */
static inline float *mbp__mlp_pack(const mbp_mlp *n, unsigned i)
{
	return (float *)(uintptr_t)n->lwp[i].wp;
}

#endif

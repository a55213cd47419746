/*
 * mbp_mlp: a trainable copy of a model (the layers of include/mbpipe/model.h), with the layer functions a
 * pipeline-parallel trainer calls per stage: forward, backward split into input and weight gradients
 * (B_in and B_w, for zero-bubble schedules), losses, optimizers with a learning-rate schedule, gradient
 * clipping by global norm, and checkpoints.
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * Usage, one training step over M micro-batches of `mb` rows on S stages (error handling shortened):
 *
 *     mbp_optim_opts oo = {.kind = MBP_OPTIM_ADAMW, .lr = 1e-3f, .warmup_steps = 100, .total_steps = 2000};
 *     mbp_mlp *n;
 *     mbp_mlp_new_random(&n, &spec, &oo);                   // or mbp_mlp_load(&n, "m.safetensors", &oo, &e)
 *     mbp_mlp_stage *st[S];                                 // stage s: layers [plan.first[s], plan.first[s+1])
 *     for (s = 0; s < S; s++)
 *             mbp_mlp_stage_new(&st[s], n, plan.first[s], plan.first[s + 1], mb);
 *     // per micro-batch j: a stash of mbp_mlp_stage_stash_floats(st[s]) x rows floats on each stage
 *     mbp_mlp_stage_forward(st[s], in_s, out_s, rows, stash[s][j]);          // F
 *     mbp_loss_xent(logits, labels, rows, classes, N, dlogits, &loss, &correct);  // last stage
 *     mbp_mlp_stage_backward_in(st[s], stash[s][j], in_s, dout_s, din_s, rows);   // B_in (din NULL: s = 0)
 *     mbp_mlp_stage_backward_w(st[s], stash[s][j], in_s, rows);                   // B_w, after B_in
 *     // after the flush: clip by the global norm, then every stage updates its own parameters
 *     double sq = 0, q;
 *     for (s = 0; s < S; s++)
 *             mbp_mlp_stage_grad_sqnorm(st[s], &q), sq += q;
 *     float scale = mbp_clip_scale(sq, 1.0f);
 *     for (s = 0; s < S; s++)
 *             mbp_mlp_stage_update(st[s], scale), mbp_mlp_stage_zero_grad(st[s]);
 *     mbp_mlp_save(n, "m.safetensors");                     // mbp_model_load (and pipeserve) read it
 *     mbp_mlp_save_optim(n, "m.optim.safetensors");         // with mbp_mlp_load_optim: exact resume
 *
 * The model. The layers are those of mbp_model (dense y = x W^T + b, then ReLU, GELU or none, then an
 * optional layer normalisation with gain g and bias beta); the forward pass calls the same kernel as
 * mbp_model_forward, so a trained model saved and loaded computes bit for bit what training computed.
 * Parameters, their gradient accumulators and the optimizer's moments live in flat float arrays allocated
 * once by the constructor, each layer on its own cache lines. Under the packed kernel (mbp_kernel_set, the
 * default with AVX2 and FMA, chosen when the model is made) the stages' forward products read each layer's
 * dense weights and bias from a copy packed for that kernel (mbp_layer_info.packed_bytes), which each
 * update writes as it updates the parameters: packed once a step, not once a micro-batch. Under OpenBLAS
 * they read the dense weights of a layer with a multiple of 1024 inputs from a copy with padded rows
 * (OpenBLAS packs rows a multiple of 4 KiB apart at 0.6-0.7 of its speed), which the updates keep current
 * too (mbp_layer_info.pad_bytes). Either copy gives the same bits as the parameters, faster. Once
 * mbp_mlp_tensor hands out a layer's weights (or, under the packed kernel, its bias), that layer's
 * products read the parameters: under the packed kernel they pack them as they go (the same kernel, the
 * same bits, slower); the layer's copy stays allocated (and counted in packed_bytes or pad_bytes) until
 * mbp_mlp_destroy. The model keeps the kernel it was made with for its life (mbp_kernel_set).
 *
 * Stages. An mbp_mlp_stage is a contiguous range of layers (a pipeline stage, as mbp_model_partition
 * splits them) with its scratch (sized for max_rows) and views of its layers' parameters. It reads and
 * writes only its own layers' parameters, gradients and moments, so stages over disjoint ranges can run on
 * different threads at once; all of one stage's calls must come from one thread at a time.
 *
 * The stash. Forward writes into a caller-provided buffer what the backward pass needs for that
 * micro-batch: per layer, the dense output before the activation (overwritten by B_in with the gradient
 * of the dense output, which B_w then reads), the normalised values and the inverse deviations of a
 * normalisation, and the layer's output when a later layer of the stage reads it. Its size is
 * rows x mbp_mlp_stage_stash_floats(st) floats; its layout depends on `rows`, which must be the same in
 * the forward and backward calls of one micro-batch. The stage's input `in` is not copied: the caller keeps
 * it unchanged until the micro-batch's B_w (or combined backward) is done. A micro-batch's `dout` is
 * needed only by its B_in. A stage may recompute some layers instead of stashing them
 * (mbp_mlp_stage_set_recompute): its stash is then smaller and its backward needs a work buffer.
 *
 * Gradients and determinism. Backward calls add to the gradient accumulators (in float, with beta = 1
 * sgemm for the dense weights) until mbp_mlp_stage_zero_grad. The result depends on the order of the
 * micro-batches only: running each stage's backward calls in micro-batch order gives the same bits
 * whatever the interleaving with other stages or micro-batches' forwards (GPipe, 1F1B, ZB-H1), and the same
 * bits as one stage over all the layers. B_in accumulates the layer normalisation's gain and bias gradients
 * (cheap, and they need the output gradient that B_in consumes); B_w the dense weights and biases (the
 * sgemm work). mbp_mlp_stage_backward == backward_in then backward_w, bit for bit.
 *
 * The planner. mbp_mlp_plan takes a profile of the layers (each one's F, B_in and B_w at a few
 * micro-batch sizes, its activation bytes per row), a memory budget and the threads, and gives the
 * training plan (threads, stages, split, schedule, micro-batch size, recomputing stages) with the
 * shortest predicted step whose predicted peak memory fits the budget (pipetrain --plan auto).
 *
 * OpenBLAS runs single-threaded: mbp_mlp_stage_new sets it to one thread, process-wide, as the model's
 * pipeline stages do (the pipeline owns the cores).
 *
 * Thread safety:
 *   operation                                          | concurrency
 *   mbp_mlp_stage_* on stages over disjoint ranges     | any threads, concurrently (one thread per stage)
 *   mbp_loss_*, mbp_optim_lr, mbp_clip_scale           | any thread (they touch only their arguments)
 *   mbp_mlp_forward, _save, _save_optim                | with each other; not during stage updates
 *   new, load, load_optim, destroy, stage_new/_destroy | one thread, no stage call running
 */
#ifndef MBPIPE_MODEL_TRAIN_H
#define MBPIPE_MODEL_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mbp_mlp mbp_mlp;
typedef struct mbp_mlp_stage mbp_mlp_stage;

/* ---- optimizers ---- */

/** Optimizer kind. */
typedef enum mbp_optim_kind {
	MBP_OPTIM_ADAMW =
	    0, /**< Adam with decoupled weight decay (Loshchilov and Hutter), as PyTorch's AdamW */
	MBP_OPTIM_SGD = 1, /**< SGD with (heavy-ball) momentum, as PyTorch's SGD */
} mbp_optim_kind;

/**
 * Optimizer and learning-rate schedule. A zeroed struct means defaults: AdamW, lr 1e-3, betas 0.9 and
 * 0.999, eps 1e-8, no weight decay, no warm-up, constant rate.
 *
 * Learning rate at update t (t = 0 for the first update of a layer): during warm-up (t < warmup_steps)
 * lr x (t + 1) / warmup_steps; after it, with total_steps > warmup_steps, cosine decay from lr to min_lr:
 * min_lr + (lr - min_lr) (1 + cos(pi p)) / 2, p = (t - warmup_steps) / (total_steps - warmup_steps)
 * (held at min_lr from total_steps on); with total_steps 0, lr.
 *
 * Updates, per parameter p with gradient g (after the clip scale):
 *   AdamW: p -= lr wd p (dense weights only); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 *          p -= lr (m / (1 - b1^(t+1))) / (sqrt(v / (1 - b2^(t+1))) + eps)
 *   SGD:   g += wd p (dense weights only); buf = momentum buf + g (buf = g at t = 0); p -= lr buf
 *          (momentum 0: p -= lr g, no buffer)
 * Biases and normalisation parameters are not decayed (the usual practice).
 */
typedef struct mbp_optim_opts {
	mbp_optim_kind kind;
	float lr;	       /**< peak learning rate; 0: 1e-3 */
	float min_lr;	       /**< end of the cosine decay; 0 is 0 */
	uint64_t warmup_steps; /**< linear warm-up updates; 0: none */
	uint64_t total_steps;  /**< end of the cosine decay; 0: no decay */
	float weight_decay;    /**< 0: none */
	float momentum;	       /**< SGD; 0: none */
	float beta1, beta2;    /**< AdamW; 0: 0.9 and 0.999 */
	float eps;	       /**< AdamW; 0: 1e-8 */
} mbp_optim_opts;

/**
 * Learning rate of update t under a schedule (defaults applied as in mbp_optim_opts).
 * @return the rate; NaN for NULL.
 */
double mbp_optim_lr(const mbp_optim_opts *o, uint64_t t);

/**
 * Clip factor for gradient clipping by global norm: min(1, max_norm / (sqrt(sqnorm) + 1e-6)).
 * @param sqnorm   sum of the squared gradients of every stage (mbp_mlp_stage_grad_sqnorm)
 * @param max_norm the largest allowed norm; 0 or less: no clipping (returns 1)
 * @return the factor to pass to mbp_mlp_stage_update; NaN when sqnorm is not finite (the update then
 *         refuses it with -EDOM).
 */
float mbp_clip_scale(double sqnorm, float max_norm);

/* ---- the model ---- */

/**
 * A trainable model with random weights. Pair with mbp_mlp_destroy().
 *
 * Layer structure from spec as mbp_model_write_random (widths, act and norm on every layer but the last,
 * which has none; spec->dtype is ignored: compute and checkpoints are float32). Initialisation from
 * spec->seed (same seed, same weights): dense weights uniform in +-sqrt(6 / fan-in) before an activation
 * (He) and +-sqrt(6 / (fan-in + fan-out)) without (Glorot); biases 0; normalisation gains 1 and biases 0.
 *
 * @param opt optimizer and schedule; NULL: defaults. Its state is allocated here, zeroed.
 * @return 0, -EINVAL (NULL, bad spec or optimizer values: negative or non-finite rates, momentum or a
 *         beta outside [0, 1), negative eps or weight decay, an unknown kind), -ENOMEM.
 */
int mbp_mlp_new_random(mbp_mlp **n, const mbp_model_spec *spec, const mbp_optim_opts *opt);

/**
 * A trainable copy of a model's current weights (and its structure, activations, norms and epsilon).
 * Pair with mbp_mlp_destroy(). The model is not kept.
 * @return 0, -EINVAL, -ENOMEM.
 */
int mbp_mlp_new_from_model(mbp_mlp **n, mbp_model *m, const mbp_optim_opts *opt);

/**
 * mbp_model_load then mbp_mlp_new_from_model: start training from a model file (its digests checked).
 * Pair with mbp_mlp_destroy().
 * @param err optional, as for mbp_model_load
 * @return 0, mbp_model_load's errors, -EINVAL, -ENOMEM.
 */
int mbp_mlp_load(mbp_mlp **n, const char *path, const mbp_optim_opts *opt, mbp_model_error *err);

/** Destroy a trainable model (after its stages). Accepts NULL. */
void mbp_mlp_destroy(mbp_mlp *n);

/** Number of layers, or 0 for NULL. */
unsigned mbp_mlp_layers(const mbp_mlp *n);
/** Width of an input row in floats, or 0 for NULL. */
uint32_t mbp_mlp_in_width(const mbp_mlp *n);
/** Width of an output row in floats, or 0 for NULL. */
uint32_t mbp_mlp_out_width(const mbp_mlp *n);
/** Describe layer i (dtype is F32). @return 0, -ERANGE (i out of range), -EINVAL (NULL). */
int mbp_mlp_layer_info(const mbp_mlp *n, unsigned i, mbp_layer_info *info);
/** The optimizer settings in use, defaults applied. @return 0, -EINVAL. */
int mbp_mlp_optim(const mbp_mlp *n, mbp_optim_opts *o);
/** Updates applied to layer i so far (the optimizer's step count t). 0 for a bad argument. */
uint64_t mbp_mlp_steps(const mbp_mlp *n, unsigned i);

/** A layer's tensors. */
typedef enum mbp_mlp_part {
	MBP_PART_WEIGHT = 0,  /**< [out][in] */
	MBP_PART_BIAS,	      /**< [out] */
	MBP_PART_NORM_WEIGHT, /**< [out], layers with normalisation only */
	MBP_PART_NORM_BIAS,   /**< [out], layers with normalisation only */
} mbp_mlp_part;

/** Which array of a tensor. */
typedef enum mbp_mlp_array {
	MBP_ARRAY_PARAM = 0, /**< the parameters */
	MBP_ARRAY_GRAD,	     /**< their gradient accumulators */
	MBP_ARRAY_MOMENT1,   /**< AdamW's m, or SGD's momentum buffer */
	MBP_ARRAY_MOMENT2,   /**< AdamW's v */
} mbp_mlp_array;

/**
 * Direct access to one tensor (for tests, inspection and custom updates). The pointer stays valid until
 * mbp_mlp_destroy; writing through it is allowed under the same rules as a stage call on that layer.
 * Once a layer's weight parameters are handed out, its stages read them there (not from the padded copy
 * of the model's description above), so that a write through the pointer is seen: the same bits.
 * @param count optional: receives the number of floats
 * @return the array, or NULL (bad argument, a norm tensor of a layer without one, a moment the optimizer
 *         does not keep).
 */
float *mbp_mlp_tensor(mbp_mlp *n, unsigned layer, mbp_mlp_part part, mbp_mlp_array which, size_t *count);

/**
 * Inference over all layers: exactly mbp_model_forward on the saved model (same kernel, same
 * micro-batching). Allocates scratch for the call.
 * @param mb_rows rows per micro-batch; 0: all rows at once
 * @return 0, -EINVAL, -ENOMEM.
 */
int mbp_mlp_forward(mbp_mlp *n, const float *in, float *out, size_t rows, uint32_t mb_rows);

/* ---- stages ---- */

/**
 * A stage over layers [first, last). Pair with mbp_mlp_stage_destroy(). Allocates its scratch (for
 * max_rows rows) and sets OpenBLAS to one thread (process-wide).
 * @return 0, -EINVAL (NULL, empty or out-of-range layer range, max_rows 0), -ENOMEM.
 */
int mbp_mlp_stage_new(mbp_mlp_stage **st, mbp_mlp *n, unsigned first, unsigned last, uint32_t max_rows);

/** Destroy a stage (before its model). Accepts NULL. */
void mbp_mlp_stage_destroy(mbp_mlp_stage *st);

/**
 * Ready the calling thread to run the stage's calls (a trainer stage's init, on its thread): under the
 * packed kernel, the kernel's row buffer of this thread, so that no product allocates (without this call,
 * a thread allocates it at its first product). OpenBLAS's thread count is left as it is (stage_new set
 * it). Out of memory is not an error: the thread's products then run without the buffer, slower, with
 * the same bits.
 * @return 0, -EINVAL (NULL).
 */
int mbp_mlp_stage_thread_init(const mbp_mlp_stage *st);

/**
 * A replica of stage `like` for a replicated trainer stage (train.h, "Replicas"): the same layers, rows,
 * hand-over and recomputation, scratch of its own, the model's parameters and gradients shared. Its
 * forward, B_in and recomputation write only its scratch and the buffers they are given; its B_w adds to
 * the shared gradient as `like`'s does, so the trainer's ordered merge keeps the sums of one stage, unless
 * mbp_mlp_stage_bin_accumulates() says otherwise. Pair with mbp_mlp_stage_destroy() (before `like`'s model).
 * @return 0, -EINVAL (NULL), -ENOMEM.
 */
int mbp_mlp_stage_new_replica(mbp_mlp_stage **st, const mbp_mlp_stage *like);
/** Whether the stage's B_in adds to the shared gradient too (a normalised layer: its gain's and shift's
 * gradients come from the output's gradient, which only B_in has): replicas of it must merge whole
 * backwards in turn (give the trainer no backward_in/backward_w). false for NULL. */
bool mbp_mlp_stage_bin_accumulates(const mbp_mlp_stage *st);

/** Floats of stash per row of a micro-batch (a stash holds rows times this). 0 for NULL. */
size_t mbp_mlp_stage_stash_floats(const mbp_mlp_stage *st);
/** The stage's input width in floats (its first layer's). 0 for NULL. */
uint32_t mbp_mlp_stage_in_width(const mbp_mlp_stage *st);
/** The stage's output width in floats (its last layer's). 0 for NULL. */
uint32_t mbp_mlp_stage_out_width(const mbp_mlp_stage *st);

/**
 * Activation recomputation: layer `layer` of the stage (a model index in its range) keeps nothing in the
 * stash; its backward recomputes its forward from the input of the run of recomputed layers it belongs to
 * (the stage's input, or the kept output of the layer before the run). Call before any pass (it changes
 * the stash's layout and mbp_mlp_stage_stash_floats). The gradients, din and parameters stay bit for bit
 * the same: the recomputation calls the forward's kernel on the same values.
 *
 * What a recomputed layer would have kept goes in a work buffer of rows x mbp_mlp_stage_work_floats
 * floats: mbp_mlp_stage_recompute fills it (from the stash and the stage's input), then the _r backward
 * calls read it; B_in_r writes its dense output's gradient there (as in the stash), which B_w_r reads, so
 * between a split B_in and B_w (ZB-H1) the micro-batch's work buffer is held as its stash is. Under a
 * whole backward it is needed only from the recomputation to the end of B: one per stage at a time.
 * A stage with every layer recomputed has no stash (mbp_mlp_stage_stash_floats 0: pass NULL).
 * @return 0, -EINVAL (NULL, layer outside the stage).
 */
int mbp_mlp_stage_set_recompute(mbp_mlp_stage *st, unsigned layer, bool on);
/** Whether layer `layer` of the stage recomputes. false for a bad argument. */
bool mbp_mlp_stage_recomputes(const mbp_mlp_stage *st, unsigned layer);
/** Floats of work buffer per row of a micro-batch (0: the stage recomputes nothing). 0 for NULL. */
size_t mbp_mlp_stage_work_floats(const mbp_mlp_stage *st);

/**
 * Recompute the forward intermediates of the stage's recomputed layers for one micro-batch into `work`
 * (rows x mbp_mlp_stage_work_floats), from its stash and its input `in` (the one given to forward; read
 * only when the stage's first layer recomputes). Call after the micro-batch's forward, before its B_in_r
 * (or B_r); it reads no gradient, so it may run while the output gradient is still on its way.
 * @return 0, -EINVAL (NULL st, NULL stash or work where the stage has them, NULL in where it is read,
 *         rows 0 or above max_rows).
 */
int mbp_mlp_stage_recompute(mbp_mlp_stage *st, const float *stash, const float *in, float *work,
			    uint32_t rows);

/** mbp_mlp_stage_backward_in with the work buffer that mbp_mlp_stage_recompute filled (NULL when the stage
 * recomputes nothing: then the same call). */
int mbp_mlp_stage_backward_in_r(mbp_mlp_stage *st, float *stash, float *work, const float *in,
				const float *dout, float *din, uint32_t rows);
/** mbp_mlp_stage_backward_w with the work buffer, after the micro-batch's B_in_r. */
int mbp_mlp_stage_backward_w_r(mbp_mlp_stage *st, const float *stash, const float *work, const float *in,
			       uint32_t rows);
/** mbp_mlp_stage_backward with the work buffer. */
int mbp_mlp_stage_backward_r(mbp_mlp_stage *st, float *stash, float *work, const float *in, const float *dout,
			     float *din, uint32_t rows);

/**
 * Hand the input gradient of prev's last layer k over to next, the stage that follows it (prev's range
 * ends where next's begins): next's backward computes it, so the layer's backward work is shared between
 * the two stages and they can be balanced better than whole layers allow (the layer's input gradient is
 * a third of its work). next reads layer k's weights (during its backward: no update may run then, as in
 * a synchronous step). The gradients stay the same, bit for bit.
 *
 * The gradient between them then carries both of layer k's gradients: prev's dout and next's din are
 * rows x (out + in) floats of layer k, first the gradient of its dense output (rows x out), then the
 * gradient of its input (rows x in); see mbp_mlp_stage_dout_floats and mbp_mlp_stage_din_floats. next's
 * backward then needs its input (in) to find where layer k's ReLU was active.
 * Only in one process (next needs layer k's weights). Call it right after creating the two stages, before
 * reading their widths for a trainer's descriptors (grad_row_bytes) or running any pass.
 * @return 0, -EINVAL (NULL, not neighbours of one model, k is layer 0 (it has no input gradient), prev
 *         already gives or next already takes), -ENOTSUP (layer k has GELU or a normalisation: its
 *         gradient needs what only prev's stash holds).
 */
int mbp_mlp_stages_hand_over(mbp_mlp_stage *prev, mbp_mlp_stage *next);
/** Whether layer `layer` can hand its input gradient over (the rule mbp_mlp_stages_hand_over applies to
 * a stage boundary after it), for planning a split. @return 0, -EINVAL (NULL, layer 0 or out of range),
 * -ENOTSUP (GELU or a normalisation). */
int mbp_mlp_layer_hand_over_check(const mbp_mlp *n, unsigned layer);
/** Floats per row of the gradient of the stage's output (dout): its out_width, or out + in of its last
 * layer when it hands that layer's input gradient over. 0 for NULL. */
size_t mbp_mlp_stage_dout_floats(const mbp_mlp_stage *st);
/** Floats per row of the gradient of the stage's input (din): its in_width, or out + in of the previous
 * layer when it computes that layer's input gradient. 0 for NULL. */
size_t mbp_mlp_stage_din_floats(const mbp_mlp_stage *st);

/**
 * Forward pass F of one micro-batch: in (rows x in_width) -> out (rows x out_width).
 * @param stash rows x stash_floats floats, filled for the backward pass; NULL: inference only (uses the
 *              stage's scratch; the same output bits)
 * @return 0, -EINVAL (NULL in or out, rows 0 or above max_rows).
 */
int mbp_mlp_stage_forward(mbp_mlp_stage *st, const float *in, float *out, uint32_t rows, float *stash);

/**
 * Backward pass, input part B_in: from the gradient of the output, the gradient of the input.
 * Turns the stash's saved pre-activations into the gradients of each dense output (what B_w reads) and
 * accumulates the normalisation parameters' gradients.
 * @param stash the micro-batch's stash, filled by its forward; consumed (call once per forward)
 * @param in    the micro-batch's input given to forward (read only by a stage that takes an input gradient
 *              over, mbp_mlp_stages_hand_over; otherwise may be NULL)
 * @param dout  rows x mbp_mlp_stage_dout_floats: gradient of the loss with respect to out; only read
 * @param din   rows x mbp_mlp_stage_din_floats: receives the gradient with respect to in; NULL: not
 *              computed (stage 0). May not overlap dout or the stash.
 * @return 0, -EINVAL (NULL stash or dout, rows 0 or above max_rows, NULL in at a stage that takes an
 *         input gradient over when din is asked for).
 */
int mbp_mlp_stage_backward_in(mbp_mlp_stage *st, float *stash, const float *in, const float *dout, float *din,
			      uint32_t rows);

/**
 * Backward pass, weight part B_w: accumulates the dense weights' and biases' gradients (sgemm) from the
 * stash left by the micro-batch's B_in and its input.
 * @return 0, -EINVAL.
 */
int mbp_mlp_stage_backward_w(mbp_mlp_stage *st, const float *stash, const float *in, uint32_t rows);

/**
 * Backward pass B = B_in then B_w in one sweep (each layer's weight gradient right after its output
 * gradient, while it is in cache). Bit for bit the same gradients and din as the two calls.
 * @return 0, -EINVAL.
 */
int mbp_mlp_stage_backward(mbp_mlp_stage *st, float *stash, const float *in, const float *dout, float *din,
			   uint32_t rows);

/** Set the stage's gradient accumulators to zero. @return 0, -EINVAL. */
int mbp_mlp_stage_zero_grad(mbp_mlp_stage *st);

/**
 * Sum of the squares of the stage's gradients, in double (for clipping by the global norm: add the
 * stages' sums, then mbp_clip_scale): its layers' mbp_mlp_layer_grad_sqnorm added in layer order.
 * @return 0, -EINVAL.
 */
int mbp_mlp_stage_grad_sqnorm(const mbp_mlp_stage *st, double *sq);

/**
 * Sum of the squares of one layer's gradients (its tensors in mbp_mlp_part order), in double, in an order
 * fixed by the tensors' sizes alone: the same bits whichever stage holds the layer. It is the sum of the
 * layer's pieces' squared norms (mbp_mlp_stage_grad_sqnorm_pieces) added in order to 0, so a split of the
 * pieces over threads gives these bits. Finite exactly when
 * every gradient of the layer is (a float's square is far inside double's range), so one pass serves a
 * trainer's check and its clipping norm. Call it under the rules of a stage call on that layer.
 * @return 0, -EINVAL (NULL, layer out of range).
 */
int mbp_mlp_layer_grad_sqnorm(const mbp_mlp *n, unsigned layer, double *sq);

/**
 * Apply one optimizer update to the stage's parameters with the gradients multiplied by grad_scale
 * (1: none; mbp_clip_scale's factor), at the learning rate of each layer's step count, which then
 * advances. Does not zero the gradients.
 * @return 0, -EINVAL (NULL), -EDOM (grad_scale not finite or negative, or a non-finite gradient: nothing
 *         is updated).
 */
int mbp_mlp_stage_update(mbp_mlp_stage *st, float grad_scale);

/**
 * Would mbp_mlp_stage_update(st, grad_scale) refuse? Its refusals exactly, without applying anything (the
 * trainer's check, mbp_train_stage_desc.check: a step updates every stage or none). A clip factor of
 * mbp_clip_scale is finite and not negative whenever the squared norms it sums are finite (a trainer's
 * grad_sq fails the step otherwise), so a check before the norm is known may pass 1.
 * @return 0 (the update would apply), -EINVAL (NULL), -EDOM (grad_scale not finite or negative, or a
 *         non-finite gradient).
 */
int mbp_mlp_stage_update_check(const mbp_mlp_stage *st, float grad_scale);

/**
 * Pieces: the end-of-step work of a stage (squared norms, update, zeroing) cut so that several threads can
 * share it, each over its own range of pieces (a trainer's replicas: mbp_train_stage_desc.pieces). Each
 * tensor of each layer is cut into pieces of MBP_MLP_PIECE_FLOATS elements (its last shorter); a stage's
 * pieces are its layers', in layer and mbp_mlp_part order, numbered from 0. Calls on disjoint ranges of
 * one stage may run at once (with each other only); the results are those of the whole-stage calls, bit
 * for bit: an element's update reads and writes that element only, and a layer's squared norm is its
 * pieces' added in order.
 */
#define MBP_MLP_PIECE_FLOATS 16384u

/** The stage's pieces (0 for NULL). */
size_t mbp_mlp_stage_pieces(const mbp_mlp_stage *st);

/** The layer's pieces (0 for a bad argument): the stage's are its layers' in order. */
size_t mbp_mlp_layer_pieces(const mbp_mlp *n, unsigned layer);

/**
 * The squared norm of each of the stage's pieces [begin, end), in double, into sq[0 .. end - begin):
 * finite exactly when every gradient of the piece is. @return 0, -EINVAL (NULL, a bad range).
 */
int mbp_mlp_stage_grad_sqnorm_pieces(const mbp_mlp_stage *st, size_t begin, size_t end, double *sq);

/**
 * mbp_mlp_stage_update's update of pieces [begin, end) (at each layer's step count, which does not
 * advance: mbp_mlp_stage_update_end, once every piece is done). No check of the gradients: the caller's
 * (every piece's squared norm finite) comes first, so that a step updates all or nothing.
 * @return 0, -EINVAL (NULL, a bad range), -EDOM (grad_scale not finite or negative: nothing updated).
 */
int mbp_mlp_stage_update_pieces(mbp_mlp_stage *st, float grad_scale, size_t begin, size_t end);

/** Advance the step count of each of the stage's layers by one: the end of an update by pieces.
 * @return 0, -EINVAL. */
int mbp_mlp_stage_update_end(mbp_mlp_stage *st);

/** Zero the gradients of pieces [begin, end). @return 0, -EINVAL (NULL, a bad range). */
int mbp_mlp_stage_zero_grad_pieces(mbp_mlp_stage *st, size_t begin, size_t end);

/* ---- losses (last stage) ---- */

/**
 * Softmax cross-entropy with integer class targets, per row -log softmax(logits)[label], computed in
 * double. Writes dlogits = (softmax - onehot) / batch_rows: summed over the micro-batches of a mini-batch
 * of batch_rows rows, the gradient of the mini-batch's mean loss.
 * @param logits    rows x classes
 * @param labels    rows class indices in [0, classes)
 * @param batch_rows rows in the whole mini-batch (>= rows)
 * @param dlogits   rows x classes; may be logits itself (computed row by row in place)
 * @param loss_sum  receives the sum of the rows' losses
 * @param correct   optional: receives how many rows have their label as the first largest logit
 * @return 0, -EINVAL (NULL, rows or classes 0, batch_rows < rows), -ERANGE (a label out of range;
 *         nothing written), -EDOM (a non-finite loss: a non-finite logit; dlogits then undefined).
 */
int mbp_loss_xent(const float *logits, const int32_t *labels, uint32_t rows, uint32_t classes,
		  size_t batch_rows, float *dlogits, double *loss_sum, uint32_t *correct);

/**
 * Mean squared error, per row mean over its `width` values of (out - target)^2 (so that sum / batch_rows
 * is PyTorch's MSELoss). Writes dout = 2 (out - target) / (batch_rows x width).
 * @param dout may be out itself
 * @return 0, -EINVAL, -EDOM (a non-finite loss).
 */
int mbp_loss_mse(const float *out, const float *target, uint32_t rows, uint32_t width, size_t batch_rows,
		 float *dout, double *loss_sum);

/* ---- checkpoints ---- */

/**
 * Write the weights as a safetensors file that mbp_model_load reads (F32, every layer's activation and
 * every tensor's digest in the metadata), by rename (<mbpipe/file.h>): to a temporary name, flushed, then
 * renamed into place; a path that is not a regular file is refused before anything is written.
 * @return 0, -EINVAL, -EEXIST (path is not a regular file), -ENOMEM, -EIO or the file system's -errno.
 */
int mbp_mlp_save(mbp_mlp *n, const char *path);

/**
 * Write the optimizer state (each layer's step count and moments, F32) as a second safetensors file:
 * with the weights file, mbp_mlp_load + mbp_mlp_load_optim resume training bit for bit.
 * Tensors "layers.<i>.<part>.m" (and ".v" for AdamW), metadata "optimizer" (adamw|sgd) and
 * "layers.<i>.step", "weights_fnv1a64" (a hash of the parameters as they are now: what ties the state
 * to the weights file saved beside it) and each tensor's digest, as a model file has; the settings are
 * recorded for information. Each of the pair is written by rename on its own.
 * @return as mbp_mlp_save.
 */
int mbp_mlp_save_optim(mbp_mlp *n, const char *path);

/**
 * Read an optimizer state written by mbp_mlp_save_optim for a model of this structure and optimizer kind,
 * validated as strictly as a model file (mbp_load_rule): another optimizer (MBP_MODEL_ACTIVATION, -EINVAL),
 * a missing moment or step count (MBP_MODEL_MISSING, -ENOENT), a moment of another shape (MBP_MODEL_SHAPE,
 * -EINVAL) or not F32 (MBP_MODEL_DTYPE, -ENOTSUP), a tensor this model does not have
 * (MBP_MODEL_UNKNOWN_TENSOR, -EINVAL), a state saved with other weights than the model's current ones
 * (its "weights_fnv1a64": MBP_MODEL_ACTIVATION, -EINVAL; a file without it is not checked), moments
 * whose bytes do not match their digests (MBP_LOAD_DIGEST, -EBADMSG; a file without digests is not
 * checked), and the safetensors rules themselves. So a weights file and an optimizer state from different steps or runs (a
 * crash between writing the two) are refused, never resumed as if they were a pair.
 * @param err optional: the rule broken, the tensor and a message naming the file
 * @return 0, or the rule's negative errno (the file system's for MBP_LOAD_IO); -EINVAL for NULL. On error
 *         the model's state is unchanged.
 */
int mbp_mlp_load_optim(mbp_mlp *n, const char *path, mbp_model_error *err);

/**
 * The optimizer settings and schedule recorded in an optimizer state file (mbp_mlp_save_optim writes them
 * with defaults applied): to tell a resume that continues the same schedule from one that changes it.
 * @param o filled on success only
 * @param err optional, as for mbp_mlp_load_optim
 * @return 0, -EINVAL (NULL, an unknown optimizer: MBP_MODEL_ACTIVATION), -ENOENT (a setting absent or not
 *         a number: MBP_MODEL_MISSING), the safetensors rules' errors, the file system's -errno.
 */
int mbp_mlp_optim_read(const char *path, mbp_optim_opts *o, mbp_model_error *err);

/* ---- the planner ---- */

/** Most micro-batch sizes of one profile. */
#define MBP_PLAN_MAX_SIZES 12

/**
 * What the planner plans from: each layer's measured costs at a few micro-batch sizes and its activation
 * bytes per row. The arrays are the caller's, read during mbp_mlp_plan only.
 */
typedef struct mbp_plan_profile {
	unsigned layers;	    /**< L, > 0 */
	unsigned sizes;		    /**< micro-batch sizes profiled, 1 .. MBP_PLAN_MAX_SIZES */
	const uint32_t *mb;	    /**< the sizes, rows, strictly increasing */
	const mbp_op_costs *cost;   /**< sizes x layers: cost[k * layers + i], layer i at mb[k] rows, in ns
				        (any unit, the same for all), each of F, B_in and B_w at least 0 */
	const uint64_t *keep_bytes; /**< per layer: bytes per row its backward needs kept (the dense output,
				         a normalisation's values: mbp_mlp_stage_stash_floats of the layer alone) */
	const uint64_t *out_bytes;  /**< per layer: bytes per row of its output, kept too when a later layer
				         of its stage reads it */
	uint64_t state_bytes;	    /**< memory every plan has: counted once in each plan's peak (pipetrain:
				         the parameters, their gradients, the optimizer's moments and the
				         stages' packed or padded weight copy) */
	uint32_t batch;		    /**< rows of a step (> 0); sizes above it are not planned */
	double op_ns; /**< a fixed cost added to each stage's F and B (or B_in) of a micro-batch: what the
		           trainer spends handing it on and waking the next thread (0: none; >= 0) */
} mbp_plan_profile;

/** A training plan (mbp_mlp_plan's result). */
typedef struct mbp_train_plan {
	unsigned stages;	 /**< S: T, or 2T for a chunked schedule (two chunks a thread) */
	unsigned threads;	 /**< T, 1 .. the threads given */
	mbp_sched_kind schedule; /**< one of the fixed kinds (gpipe .. dualpipev) */
	uint32_t mb, mbs;	 /**< rows per micro-batch (a profiled size) and micro-batches of a step */
	unsigned first[MBP_MAX_STAGES + 1];	  /**< stage s: layers [first[s], first[s + 1]) */
	uint64_t recompute;			  /**< bit s: every layer of stage s recomputes */
	double step_ns;				  /**< predicted step: mbp_schedule_simulate's makespan */
	double bubble;				  /**< its bubble */
	uint64_t stage_act_bytes[MBP_MAX_STAGES]; /**< predicted: most activation bytes stage s holds */
	uint64_t act_bytes;   /**< their sum: at least the trainer's act_peak_bytes for this plan */
	uint64_t state_bytes; /**< the profile's */
	uint64_t peak_bytes;  /**< act_bytes + state_bytes: what is compared with the budget */
	unsigned considered;  /**< plans played */
	unsigned fitted;      /**< of them, those within the budget */
} mbp_train_plan;

/**
 * Plan a training run: the plan with the shortest predicted step whose predicted peak memory fits the
 * budget. Searched: threads 1 .. `threads`; every fixed schedule (gpipe, 1f1b, zbh1, zbh2 on S = T
 * stages; interleaved, looped-bfs, zbv, dualpipev on S = 2T chunks); each profiled micro-batch size; the
 * split of mbp_model_partition on the layers' F + B_in + B_w at that size, and the one with each forward
 * counted twice (as recomputing stages run it) where it differs; and which stages recompute every layer
 * (tried only where keeping every activation does not fit). A stage's predicted costs are its layers'
 * sums plus op_ns on F and B (a recomputing stage's B_in carries its forward again), its memory the most bytes of stashes and
 * work buffers it holds at once under the schedule (rows x bytes per row, as the trainer counts them);
 * the plan's peak is the stages' sum plus state_bytes. Not counted: the stages' inputs and gradients in
 * flight (the trainer's other pool), scratch, the model's padded weight copies. No hand-overs.
 * Deterministic: the same profile, budget and threads give the same plan. Takes no measurement.
 * @param budget bytes (> 0; UINT64_MAX: no limit)
 * @param threads the most threads (1 .. MBP_MAX_STAGES; the CPUs the run may use)
 * @param out the plan; on -ENOSPC the plan of least memory
 * @param need optional: receives the smallest budget that a plan fits (the least memory plan's peak),
 *             on 0 and -ENOSPC
 * @return 0, -EINVAL (NULL, budget or threads 0, a bad profile: sizes not increasing, a negative or
 *         non-finite cost; no schedule placeable at any size), -ENOSPC (no plan fits the budget), -ENOMEM.
 */
int mbp_mlp_plan(const mbp_plan_profile *p, uint64_t budget, unsigned threads, mbp_train_plan *out,
		 uint64_t *need);

/**
 * Predict one plan, as the planner plays it: the step, bubble and memory of the threads, stages, schedule,
 * micro-batch size, split and recomputing stages that `pl` names, from the profile (for benchmarks that
 * measure the plans the planner weighs: perf/planner_grid.sh). The same costs and memory as mbp_mlp_plan
 * counts, so mbp_mlp_plan's result predicted again gives its own figures. Takes no measurement.
 * @param p the profile
 * @param pl in: threads (T), stages (T, or 2T for a chunked kind), schedule (a fixed kind), mb (one of
 *           the profiled sizes, at most the batch), first[0 .. stages] (0, strictly increasing, the
 *           layers), recompute (bit s: stage s recomputes every layer); out: besides those, mbs,
 *           step_ns, bubble, stage_act_bytes, act_bytes, state_bytes, peak_bytes (considered and fitted
 *           1)
 * @return 0, -EINVAL (NULL, a bad profile, a field out of range, a schedule that cannot place the
 *         stages), -ENOMEM.
 */
int mbp_mlp_plan_predict(const mbp_plan_profile *p, mbp_train_plan *pl);

#ifdef __cplusplus
}
#endif
#endif

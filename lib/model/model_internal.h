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

/* The fixed part of handing a micro-batch to the next stage (the ring and an occasional wake-up): the
 * profile adds the copy of the activations to it; rebalancing counts it alone per boundary. */
#define MBP__HANDOFF_FIXED_NS 1000.0

/* Fill a plan's costs (stage_ns, slowest, mean, balance, sequential) from its stages, layers and first[]
 * and the layers' and hand-offs' costs (handoff_ns optional), as mbp_model_partition does (plan.c). */
void mbp__plan_cost(mbp_model_plan *plan, const double *layer_ns, const double *handoff_ns);

/* mbp_model_partition for stages of fixed replicas (replicas[s], 0 meaning one; NULL: one each): the
 * split of least max over s of stage_ns[s] / replicas[s], exactly, ties as mbp_model_partition (plan.c).
 * A rebalancing move: a running stage keeps its threads. Returns as mbp_model_partition. */
int mbp__partition_fixed(const double *layer_ns, const double *handoff_ns, unsigned layers, unsigned stages,
			 const unsigned *replicas, mbp_model_plan *plan);

/* The split and the replica counts together for S stages, stage s on 1 .. caps[s] replicas (0: one),
 * exactly (plan.c, "Capped replicas"): a rebalancing move that re-plans the active replicas within the
 * threads each stage was made with. `cpus` (0: no limit): the CPUs they share; a plan of more threads
 * must win MBP__OVERSUB_GAIN to be taken, and its slowest_ns is no less than the layers' sum over cpus. Returns as mbp_model_partition_replicas (-ERANGE: S above L or
 * MBP_MAX_STAGES, the caps' sum above MBP_MAX_STAGES). */
int mbp__partition_capped(const double *layer_ns, const double *handoff_ns, unsigned layers, unsigned stages,
			  const unsigned *caps, unsigned cpus, mbp_model_plan *plan);

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
	const float *w;	       /* [out][in], rows ld floats apart (ld 0: in) */
	const float *b;	       /* [out] */
	const float *g, *beta; /* [out], NULL without norm */
	uint32_t ld;
	/* w and b packed for the packed kernel (dense.c's layout), or NULL. Owned by the version
	 * (mbp__version.packed) or the trainable model (mbp_mlp.wpack), never by a view's table. */
	const float *wp;
	/* The kernel is the object's, fixed when it is made, never the switch's of the moment (which a
	 * mbp_kernel_set during a run would flip between the layers of one micro-batch, or between a forward
	 * and its recompute): the packed kernel when wp is set or pack_as_it_goes (a trainable model made
	 * under it whose layer's tensors were handed out: the same panels, packed per product), OpenBLAS
	 * otherwise. */
	bool pack_as_it_goes;
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
	void *data;    /* the file's data section as read (F32 tensors used in place), or NULL */
	float *owned;  /* converted (F16/BF16) or realigned tensors */
	float *packed; /* every layer's wp, one allocation (NULL: none packed) */
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
	bool verified; /* the load checked every tensor it read against the file's digests */
};

/* References to versions (versions.c). get_rcu: the caller's thread is registered with RCU (stage 0). */
struct mbp__version *mbp__version_get_rcu(mbp_model *m);
struct mbp__version *mbp__version_get_locked(mbp_model *m);
void mbp__version_put(struct mbp__version *v);
/* Free a version no reference holds any more (the last put does; a load that failed calls it itself). */
void mbp__version_free(struct mbp__version *v);
/* Publish v, just loaded, as m's first version (its one reference is "current"'s); fini drops it when the
 * model is destroyed, after every micro-batch has left (verified). */
void mbp__versions_init(mbp_model *m, struct mbp__version *v);
void mbp__versions_fini(mbp_model *m);

/*
 * Run layers [a, b) on `rows` rows: x (rows x l[a].in) -> y (rows x l[b-1].out). s0 and s1 are scratch of
 * rows x max_width floats each, used for the activations between layers (unused when b == a + 1). Same
 * calls, same order, same result, wherever it runs.
 */
void mbp__layers_run(const mbp_model *m, const struct mbp__version *v, unsigned a, unsigned b, const float *x,
		     float *y, uint32_t rows, float *s0, float *s1);
/* The same over a layer table and weights table (the trainable model's). */
void mbp__layers_run_lw(const struct mbp__layer *l, const struct mbp__weights *lw, unsigned a, unsigned b,
			const float *x, float *y, uint32_t rows, float *s0, float *s1);
/* All L layers over `rows` rows in micro-batches of mb_rows (0: all at once), with scratch allocated for the
 * call: the sequential reference (mbp_model_forward, mbp_mlp_forward). @return 0, -ENOMEM. */
int mbp__forward_batched(const struct mbp__layer *l, const struct mbp__weights *lw, unsigned L,
			 uint32_t max_width, const float *in, float *out, size_t rows, uint32_t mb_rows);
/* One layer. */
void mbp__layer_run(const struct mbp__layer *l, const struct mbp__weights *w, const float *x, float *y,
		    uint32_t rows);
/* One layer, keeping what its backward pass needs (each optional, rows x out unless said): z the dense
 * output before the activation, xhat the normalised values, inv (rows) each row's 1 / sqrt(var + eps).
 * Computes exactly what mbp__layer_run does. */
void mbp__layer_fwd(const struct mbp__layer *l, const struct mbp__weights *w, const float *x, float *y,
		    uint32_t rows, float *z, float *xhat, float *inv);

/* Describe a layer (mbp_model_layer_info's body; describe.c). */
void mbp__layer_info(const struct mbp__layer *l, mbp_layer_info *info);
/* The names of an activation ("none", "relu", "gelu") and of a type ("F32", "F16", "BF16"), as the files
 * and the descriptions write them (describe.c). */
const char *mbp__act_name(mbp_act a);
const char *mbp__dtype_name(mbp_dtype d);
/* Prefix an error's message with the file's path ("<path>: <msg>"). */
void mbp__load_error_path(mbp_model_error *err, const char *path);

/* OpenBLAS to one thread (process-wide, under a lock: the call is not thread-safe). */
void mbp__blas_one_thread(void);

/* splitmix64: a tiny, well-mixed generator; same seed, same values on every machine. */
static inline uint64_t mbp__splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1), 24 bits. */
static inline float mbp__uniform(uint64_t *s)
{
	return (float)((double)(mbp__splitmix64(s) >> 40) / (double)(1u << 23) - 1.0);
}

/* One tensor for mbp__st_write: F32 data, or (data NULL) values offset + scale * uniform drawn in order
 * from the writer's generator. */
struct mbp__st_out {
	char name[64];
	uint32_t rows, cols; /* cols 0: 1-D [rows] */
	const float *data;
	float scale, offset;
};

/* Write a safetensors file (temporary name, fsync, rename): nmeta key/value string pairs in meta, then the
 * tensors in order, converted to dt. @return 0, -ENOMEM, -EIO or the file system's -errno. */
int mbp__st_write(const char *path, const struct mbp__st_out *t, size_t nt, const char *const *meta,
		  size_t nmeta, mbp_dtype dt, uint64_t seed);
/* Write L layers' weights in the layout mbp_model_load reads (F32, every layer's activation named). */
int mbp__model_write(const char *path, unsigned L, const struct mbp__layer *l, const struct mbp__weights *lw);

/* The packed kernel (dense.c). cpu_ok: this CPU runs it (AVX2 and FMA). packed_floats: the floats of a
 * layer's packed copy (weights and bias). pack: write that copy of w (rows ld apart, 0: in) and b into dst,
 * 64-byte aligned, of packed_floats floats. dense_packed: y = x W^T + b on `rows` rows, then max(y, +0)
 * when relu: for every output element the one chain b + x[0] w[0] + x[1] w[1] + ... in fused
 * multiply-adds, whatever the row count, so a row's bits depend on the row and the weights alone. */
bool mbp__dense_cpu_ok(void);
size_t mbp__dense_packed_floats(uint32_t in, uint32_t out);
void mbp__dense_pack(uint32_t in, uint32_t out, const float *w, uint32_t ld, const float *b, float *dst);
/* Elements [e0, e1) of W (row-major, rows in floats long; within one row) or of b (bias) changed to
 * src[0, e1 - e0): write them into the packed copy dst. */
void mbp__dense_pack_update(uint32_t in, uint32_t out, float *dst, bool bias, size_t e0, size_t e1,
			    const float *src);
/* Whole rows [r0, r1) of W (row-major, rows in floats long) into the packed copy dst: mbp__dense_pack_update
 * row by row, faster (8 rows at a time, transposed in registers). */
void mbp__dense_pack_rows(uint32_t in, uint32_t out, const float *w, size_t r0, size_t r1, float *dst);
void mbp__dense_packed(const struct mbp__layer *l, const struct mbp__weights *w, const float *x, float *y,
		       uint32_t rows, bool relu);
/* On a thread about to compute (a stage's init): allocate its buffer for the packed kernel's rows now
 * rather than in its first product, when the objects it will compute for run that kernel (`packed`).
 * Best effort: a thread without one computes without it. */
void mbp__dense_thread_init(bool packed);
/* Tests: whether the calling thread holds its buffer for the packed kernel's rows. */
bool mbp__dense_thread_has_rows(void);
/* Pack every layer of v when the kernel in use is the packed one (v->packed, each lw[i].wp): the version
 * then runs on it for its life, and on OpenBLAS otherwise.
 * @return 0, -ENOMEM (v unchanged). */
int mbp__version_pack(struct mbp__version *v, const struct mbp__layer *l);

/* Aligned scratch of n floats (64-byte aligned, zeroed); NULL on failure. Free with free(). */
float *mbp__scratch_alloc(size_t n);

/* ReLU of y[0, n) in place, y > 0 ? y : +0 element by element (a NaN and -0 become +0), in vectors where
 * the CPU has them, with the same bits as the scalar form. */
void mbp__relu(float *y, size_t n);
void mbp__relu_grad(const float *y, const float *dy, float *out, size_t n); /* out may be y */

#endif

/*
 * mbp_model: a float32 feed-forward model whose layers run as pipeline stages.
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * Usage (error handling shortened):
 *
 *     mbp_model *m;
 *     mbp_model_error e;
 *     if (mbp_model_load(&m, "mlp.safetensors", &e) < 0)
 *             fprintf(stderr, "%s\n", e.msg);               // names the rule broken and the tensor
 *     if (mbp_blas_warning())
 *             fprintf(stderr, "%s\n", mbp_blas_warning());  // generic OpenBLAS kernel on a modern CPU
 *     mbp_model_plan plan;
 *     mbp_model_balance(m, 2, 64, -1, &plan);               // profile at 64 rows, split into 2 stages
 *     mbp_model_stages *st;
 *     mbp_model_stages_new(&st, m, &plan, 64);
 *     mbp_opts o;
 *     mbp_opts_init(&o);
 *     o.in_row_bytes = mbp_model_in_width(m) * sizeof(float);
 *     o.max_mb_rows = 64;
 *     mbp_pipeline *p;
 *     mbp_pipeline_new(&p, &o);
 *     mbp_model_stages_add(st, p);
 *     mbp_pipeline_start(p);
 *     mbp_run(p, in, out, rows, 64);                        // rows x in_width floats -> rows x out_width
 *     mbp_model *next;                                      // new weights while requests run:
 *     mbp_model_load(&next, "mlp-v2.safetensors", &e);
 *     mbp_model_swap(m, next);                              // consumes next
 *     mbp_pipeline_destroy(p);                              // then the stages, then the model
 *     mbp_model_stages_destroy(st);
 *     mbp_model_destroy(m);
 *
 * The model. A sequence of L layers; layer i maps rows of width w[i] to rows of width w[i+1]:
 *     y = act(x W^T + b), then, if the layer has one, y = (y - mean(y)) / sqrt(var(y) + eps) * g + beta
 * with W of shape [w[i+1], w[i]] (PyTorch's nn.Linear layout), act none, ReLU or GELU (erf form), and the
 * layer normalisation over the row's w[i+1] values. Compute is float32. Dense layers run on one of two
 * kernels, the one chosen (mbp_kernel_set, or MBP_KERNEL=blas|packed in the environment) when the version
 * was loaded:
 *   - packed (the default where the CPU has AVX2 and FMA): mbpipe's own 6 x 16 register-tile product over
 *     a copy of each layer's weights packed once per version, when the version is loaded (so a swap
 *     brings its own copy, freed with it; mbp_layer_info.packed_bytes), with the bias as the start of the
 *     sum and a ReLU applied at the store. Each output element is one chain of fused multiply-adds in the
 *     order of the inputs, so a row's result depends only on that row and the weights: the same bits in a
 *     micro-batch of 1 row or 256, at any position.
 *   - blas: one cblas_sgemm over the micro-batch (cblas_sgemv for a single row), OpenBLAS packing the
 *     weights on every call; the only kernel on CPUs without AVX2 and FMA.
 * Every path (mbp_model_forward, the stages, the trainable model's forward and its training) calls the
 * same kernel, so they agree bit for bit under either.
 *
 * The file. A safetensors file (https://github.com/huggingface/safetensors): 8 bytes little-endian header
 * length N, N bytes of JSON, then the data section. Tensors:
 *     layers.<i>.weight       [w[i+1], w[i]]      required for i = 0 .. L-1, no gaps in i
 *     layers.<i>.bias         [w[i+1]]            required
 *     layers.<i>.norm.weight  [w[i+1]]            optional, together with layers.<i>.norm.bias
 *     layers.<i>.norm.bias    [w[i+1]]
 * in F32 (used in place from the loaded data when 4-byte aligned), F16 or BF16 (converted to F32 at load).
 * __metadata__ (string values): "activation" (none|relu|gelu, default for every layer; absent: none),
 * "layers.<i>.activation" (overrides it for layer i), "layer_norm_eps" (default 1e-5). Any other tensor
 * name is an error; other metadata keys are ignored. The file is read into memory the model owns (header
 * first, checked before the data is read) and validated as the format's reference implementation does,
 * each broken rule reported with its own mbp_load_rule and a message naming the tensor.
 *
 * Digests. Every file mbpipe writes carries, for each tensor, the CRC-32 of its bytes as stored, under the
 * metadata key "<tensor>.crc32" (8 lowercase hexadecimal digits), and every load checks the bytes it reads
 * against them: a file changed after it was written (bytes overwritten, a hole) is refused, naming the
 * tensor (MBP_LOAD_DIGEST, -EBADMSG). It detects corruption, not an adversary (who can write a matching
 * CRC as easily). A file without digests (another tool's) loads; mbp_model_verified() tells which.
 *
 * Stages. mbp_model_balance() times every layer at the micro-batch size in use (mbp_model_profile) and splits
 * the layers into S contiguous ranges minimising the slowest stage exactly (mbp_model_partition, a dynamic
 * programme that counts the cost of handing a micro-batch to the next stage). mbp_model_stages turns a plan
 * into one pipeline stage per range; each stage allocates its scratch buffers in its init on the thread that
 * runs it, so nothing is allocated per micro-batch. OpenBLAS runs single-threaded in the stages: the pipeline
 * owns the cores (see mbp_model_stages_add).
 *
 * Live weight swap (liburcu, memb flavour). The model's current weights are a reference-counted version
 * published through an RCU-protected pointer.
 *   - Stage 0, for each micro-batch: rcu_read_lock, rcu_dereference(current), take a reference,
 *     rcu_read_unlock; the version goes into mb->carry. A micro-batch pinned by its submitter
 *     (mbp_model_mb_pin) arrives with its reference in mb->carry already, and stage 0 uses that one. A
 *     job's micro-batches (mbp_job_submit, mbp_run) reach stage 0 one after the other: the first takes the
 *     current version and stage 0 holds a reference to it until the job's last one, so every row of a job
 *     is computed with one version. The read-side section only covers the pointer
 *     load and the reference increment, so a swap never waits for a computation.
 *   - Later stages use the version in mb->carry: a micro-batch computes with one version from its first
 *     layer to its last.
 *   - Stage 0's done callback, run for every micro-batch leaving the pipeline (completed or failed), drops
 *     that reference.
 *   - mbp_model_swap publishes the new version with rcu_xchg_pointer, waits synchronize_rcu() (after
 *     which no reader can still be between loading the old pointer and taking its reference), then drops
 *     the reference that "current" held. The old version is freed when its count reaches zero: after the
 *     last micro-batch that uses it has left the pipeline, by whichever thread drops the last reference.
 *   - mbp_model_forward and mbp_model_profile (any thread, not registered with RCU) take their reference
 *     under the model's swap mutex instead.
 * Stage 0's thread registers with RCU in its init and unregisters in its fini. The model's stages own
 * mb->carry: a pipeline must not mix them with other stages that use it.
 *
 * OpenBLAS kernel. Debian's OpenBLAS 0.3.21 does not know recent CPUs and may fall back to generic SSE3
 * kernels ("Prescott"), about 3 times slower. mbp_blas_info() names the kernel in use and
 * mbp_blas_warning() says when this happened on a CPU with AVX2 or AVX-512. Choosing a kernel is the user's
 * call: export OPENBLAS_CORETYPE=SkylakeX (AVX-512 only: elsewhere the first sgemm dies with SIGILL) or
 * Haswell (AVX2) before the process starts. mbpipe never sets it.
 *
 * Thread safety:
 *   operation                                          | concurrency
 *   mbp_model_swap                                     | any thread, concurrently with running stages,
 *                                                      | forward and profile; swaps are serialised
 *   mbp_model_forward                                  | any threads, concurrently (own scratch each)
 *   mbp_model_profile, _balance                        | one at a time: they set OpenBLAS's process-wide
 *                                                      | thread count to 1 for their duration
 *   describe/info getters, mbp_model_partition         | any thread
 *   mbp_model_stages_rebalance_stats                   | any thread, any time
 *   mbp_blas_info, mbp_blas_warning                    | any thread
 *   mbp_kernel_get, _name, _warning                    | any thread
 *   mbp_kernel_set                                     | any thread; objects made before it keep
 *                                                      | their kernel
 *   load, destroy, stages_new/_add/_destroy            | one thread; destroy only after the pipeline
 */
#ifndef MBPIPE_MODEL_H
#define MBPIPE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MBP_MODEL_MAX_LAYERS 4096
#define MBP_MODEL_MAX_WIDTH  (1u << 20)

typedef struct mbp_model mbp_model;
typedef struct mbp_model_stages mbp_model_stages;

/** Activation after a dense layer. */
typedef enum mbp_act {
	MBP_ACT_NONE = 0,
	MBP_ACT_RELU = 1,
	MBP_ACT_GELU = 2, /**< 0.5 x (1 + erf(x / sqrt 2)) */
} mbp_act;

/** Storage type of weights in a file (compute is always F32). */
typedef enum mbp_dtype {
	MBP_DTYPE_F32 = 0,
	MBP_DTYPE_F16 = 1,
	MBP_DTYPE_BF16 = 2,
} mbp_dtype;

/**
 * Which rule a load broke. Every rule has its own value; the negative errno returned with it is coarser
 * (several rules share one) and is given after each.
 */
typedef enum mbp_load_rule {
	MBP_LOAD_OK = 0,
	MBP_LOAD_IO, /**< open, stat or read failed, or the file changed while read: the system's -errno */
	MBP_ST_HEADER_TOO_SMALL, /**< file shorter than the 8-byte length prefix: -EBADMSG */
	MBP_ST_HEADER_TOO_LARGE, /**< header length above 100,000,000 bytes: -E2BIG */
	MBP_ST_HEADER_LENGTH,	 /**< 8 + header length beyond the end of the file: -ERANGE */
	MBP_ST_HEADER_UTF8,	 /**< header is not valid UTF-8: -EBADMSG */
	MBP_ST_HEADER_START,	 /**< header does not start with '{': -EBADMSG */
	MBP_ST_HEADER_JSON,	 /**< JSON syntax error, or the top level is not an object: -EBADMSG */
	MBP_ST_DUPLICATE,	 /**< two entries with the same name: -EEXIST */
	MBP_ST_METADATA,	 /**< __metadata__ is not an object of strings: -EPROTO */
	MBP_ST_TENSOR_INFO,   /**< entry is not {dtype: string, shape: array, data_offsets: array}: -EPROTO */
	MBP_ST_DTYPE,	      /**< dtype is not one of the format's names: -ENOTSUP */
	MBP_ST_SHAPE,	      /**< a dimension is not an integer in [0, 2^53], or more than 8 dims: -EDOM */
	MBP_ST_OVERFLOW,      /**< product(shape) x dtype size overflows 64 bits: -EOVERFLOW */
	MBP_ST_OFFSETS,	      /**< data_offsets not two integers [begin, end] with begin <= end: -EINVAL */
	MBP_ST_SIZE,	      /**< end - begin != product(shape) x dtype size: -EPROTO */
	MBP_ST_OUT_OF_BOUNDS, /**< the range ends beyond the data section: -EFAULT */
	MBP_ST_GAP,	      /**< a gap before this tensor's range (ranges must tile the data): -ERANGE */
	MBP_ST_OVERLAP,	      /**< this tensor's range overlaps the previous one: -ERANGE */
	MBP_ST_FILE_SIZE,     /**< bytes after the last tensor's range: -EBADMSG */
	MBP_MODEL_NO_LAYERS,  /**< no layers.0.weight: -ENOENT */
	MBP_MODEL_MISSING,    /**< a required tensor is missing (bias, or half of a norm pair): -ENOENT */
	MBP_MODEL_UNKNOWN_TENSOR, /**< a tensor name outside the layout above: -EINVAL */
	MBP_MODEL_DTYPE,	  /**< a tensor is not F32, F16 or BF16: -ENOTSUP */
	MBP_MODEL_SHAPE,      /**< wrong rank, widths that do not chain, zero or above MAX_WIDTH: -EINVAL */
	MBP_MODEL_ACTIVATION, /**< unknown activation name or bad layer_norm_eps in metadata: -EINVAL */
	MBP_MODEL_TOO_MANY,   /**< more than MBP_MODEL_MAX_LAYERS layers: -E2BIG */
	MBP_LOAD_NOMEM,	      /**< out of memory: -ENOMEM */
	MBP_LOAD_NOT_REGULAR, /**< not a regular file (a directory, FIFO, device, socket): -EINVAL */
	MBP_LOAD_TOO_LARGE,   /**< the file is larger than mbp_model_load_opts.max_bytes: -EFBIG */
	MBP_LOAD_TIMEOUT,     /**< reading took longer than mbp_model_load_opts.timeout_ns: -ETIMEDOUT */
	MBP_LOAD_DIGEST, /**< a tensor's bytes do not match its digest, or the digests are broken: -EBADMSG */
	MBP_MODEL_STRUCTURE, /**< not the layers and widths mbp_model_load_opts expects: -EINVAL */
} mbp_load_rule;

/**
 * What went wrong in a load: filled by mbp_model_load() on error (and zeroed on success).
 *
 * For a file that is not a safetensors file at all (the rules up to MBP_ST_HEADER_JSON) the message is the
 * rule's words only ("not a safetensors file: header length above 100000000 bytes"), never a number, name
 * or byte read from the file: a path may name any file, a secret included, and the message may reach
 * whoever asked for the load. Once the header is a JSON object, messages name its entries. Control
 * characters in a name are shown as '?'.
 */
typedef struct mbp_model_error {
	int code;	    /**< the negative errno the call returned */
	mbp_load_rule rule; /**< the rule broken */
	char tensor[128];   /**< the tensor concerned (truncated), "" when none */
	char msg[320];	    /**< one line: "<file>: <rule text> (tensor '<name>'): <detail>" */
} mbp_model_error;

/** Short text of a rule ("tensor range overlaps the previous one"). Never NULL. */
const char *mbp_load_rule_str(mbp_load_rule rule);

/* ---- loading and describing ---- */

/**
 * Load a model from a safetensors file: mbp_model_load_fd() on the file opened read-only and without
 * blocking (O_NONBLOCK: a FIFO does not wait for a writer, it is refused as not a regular file), with no
 * size or time bound.
 *
 * @param m    receives the model
 * @param path the file
 * @param err  optional: on error, which rule was broken, the tensor and a message
 * @return 0, or the negative errno of the rule broken (see mbp_load_rule); -EINVAL for NULL arguments.
 */
int mbp_model_load(mbp_model **m, const char *path, mbp_model_error *err);

/** Bounds on a load; a zeroed struct (or NULL) means none but the format's own. */
typedef struct mbp_model_load_opts {
	uint64_t max_bytes;  /**< largest file accepted, checked before anything is read; 0: no bound */
	uint64_t timeout_ns; /**< longest time spent reading; 0: no bound */
	/**
	 * The structure expected, 0 / NULL: any. With layers > 0 and widths set, the file must have exactly
	 * that many layers with widths[0] its input width and widths[i + 1] layer i's output width, which is
	 * checked from the header, before any tensor byte is read or the weights' memory allocated:
	 * otherwise MBP_MODEL_STRUCTURE (-EINVAL), the message naming both structures. A server that swaps
	 * weights in gives its model's, so that a file of another size costs nothing to refuse.
	 */
	unsigned layers;
	const uint32_t *widths; /**< layers + 1 widths, read during the call only */
} mbp_model_load_opts;

/**
 * Load a model from an open file.
 *
 * Accepts regular files only. Reads and checks in this order: the file's size against o->max_bytes, the
 * 8-byte header length against the size, the header (every rule of mbp_load_rule but the data bytes) and
 * the structure o expects, then the data section, with read() into memory the model owns, and its bytes
 * against the file's digests: the weights never refer to the file, so a file changed, truncated or removed
 * after the load cannot change or fault a running stage. F16/BF16 tensors are converted. The weights become
 * version 1 of the new model. Pair with mbp_model_destroy().
 *
 * @param m    receives the model
 * @param fd   the file, open for reading (not closed; its offset is not used)
 * @param name how messages name the file (NULL: "model")
 * @param o    bounds, or NULL
 * @param err  optional: on error, which rule was broken, the tensor and a message
 * @return 0, or the negative errno of the rule broken (see mbp_load_rule); -EINVAL for NULL arguments.
 */
int mbp_model_load_fd(mbp_model **m, int fd, const char *name, const mbp_model_load_opts *o,
		      mbp_model_error *err);

/**
 * Load layers [first, first + count) of a model file as a model of their own, whose layer 0 is the file's
 * layer `first`: what one rank of a pipeline across MPI ranks needs (<mbpipe/mpi.h>).
 *
 * The header and every layer's shape are validated as by mbp_model_load(); only the selected layers'
 * tensors are read, one pread per contiguous run of their byte ranges (F32 ones are then used in place,
 * the others converted), and checked against their own digests: the other layers' bytes are never read.
 * These layers compute bit for bit what the same layers of the whole model do.
 * Pair with mbp_model_destroy().
 *
 * @return as mbp_model_load(); -ENOENT (MBP_MODEL_MISSING) when count is 0 or the file has fewer than
 *         first + count layers.
 */
int mbp_model_load_layers(mbp_model **m, const char *path, unsigned first, unsigned count,
			  mbp_model_error *err);

/**
 * Destroy a model. Accepts NULL.
 *
 * Call it after every pipeline running the model's stages has been destroyed and its stages object too.
 * Frees the current weights. A weights version still referenced by a micro-batch is a use error that
 * would free memory under a running stage: it aborts (MBP_VERIFY) instead.
 */
void mbp_model_destroy(mbp_model *m);

/** Description of one layer. */
typedef struct mbp_layer_info {
	uint32_t in;	     /**< input width */
	uint32_t out;	     /**< output width */
	mbp_act act;	     /**< activation after the dense layer */
	bool norm;	     /**< layer normalisation after the activation */
	float eps;	     /**< its epsilon */
	mbp_dtype dtype;     /**< storage type of the weight in the file */
	uint64_t flops;	     /**< floating-point operations per row (2 x in x out for the dense part) */
	size_t param_bytes;  /**< bytes of float32 parameters */
	size_t packed_bytes; /**< bytes of the packed kernel's copy of the weights and bias that each live
				  version (a trainable model: the model) holds besides them; 0 without one */
	size_t pad_bytes;    /**< a trainable model under OpenBLAS: bytes of its padded copy of the
				  weights (inputs a multiple of 1024); 0 otherwise */
} mbp_layer_info;

/**
 * Whether the load that made the model checked every tensor it read against a digest in the file: true
 * for the files mbpipe writes, false for a file without digests (written by another tool), which programs
 * should say in a note. False for NULL.
 */
bool mbp_model_verified(const mbp_model *m);

/** Number of layers (at least 1). */
unsigned mbp_model_layers(const mbp_model *m);
/** Width of an input row, in floats. */
uint32_t mbp_model_in_width(const mbp_model *m);
/** Width of an output row, in floats. */
uint32_t mbp_model_out_width(const mbp_model *m);
/** Describe layer i. @return 0, -ERANGE (i out of range), -EINVAL (NULL). */
int mbp_model_layer_info(const mbp_model *m, unsigned i, mbp_layer_info *info);
/** Version number of the current weights: 1 after load, +1 per swap. */
uint64_t mbp_model_version(const mbp_model *m);
/** Weight versions of this model still allocated: 1, plus old versions some micro-batch still uses. */
unsigned mbp_model_versions_alive(const mbp_model *m);

/**
 * Describe the model in text: one line per layer ("layer 3: 1024 -> 1024 relu norm F16 8.0 MiB").
 * @return the length of the full text, like snprintf (the output is truncated to n - 1 bytes).
 */
int mbp_model_describe(const mbp_model *m, char *buf, size_t n);

/* ---- computing ---- */

/**
 * Compute the model sequentially on the calling thread: the reference the pipeline must match.
 *
 * Splits the rows into micro-batches of mb_rows (the last may be short) and runs every layer on each,
 * with the same code and calls the stages use: for equal micro-batches the output is bit for bit that of
 * the pipeline. OpenBLAS runs with whatever thread count the process has set (the pipeline's stages set
 * 1). Allocates scratch for the call. Uses the current weights for the whole call.
 *
 * @param in      rows x in_width floats
 * @param out     rows x out_width floats (may not overlap in)
 * @param mb_rows rows per micro-batch; 0: all rows at once
 * @return 0, -EINVAL (NULL with rows > 0), -ENOMEM.
 */
int mbp_model_forward(mbp_model *m, const float *in, float *out, size_t rows, uint32_t mb_rows);

/* ---- balancing ---- */

/**
 * Time every layer at a micro-batch size, on the calling thread or on one CPU.
 *
 * Runs each layer `reps` times (after one warm-up) on random input with single-threaded OpenBLAS (the
 * thread count is restored after) and keeps the fastest run: the layer's cost on an uncontended core,
 * which other processes' noise on a shared machine can only lengthen (a median of noisy runs splits a
 * uniform model unevenly). Also estimates each layer boundary's hand-off
 * cost: a fixed 1 us for the ring and wake-up plus the time to copy the boundary's activations once
 * (what moving them to another core's cache costs, roughly).
 *
 * @param mb_rows    micro-batch size in rows (> 0)
 * @param reps       timed repetitions per layer (> 0; 5 is plenty for layers above 100 us)
 * @param cpu        CPU to run on (the calling thread is pinned there for the call, then restored); -1:
 *                   where the thread is
 * @param layer_ns   receives mbp_model_layers(m) times in nanoseconds
 * @param handoff_ns optional; receives mbp_model_layers(m) costs: [i] is the cost of handing layer i's
 *                   output to another stage (the last entry is 0)
 * @return 0, -EINVAL, -ENOMEM, or the pinning error.
 */
int mbp_model_profile(mbp_model *m, uint32_t mb_rows, unsigned reps, int cpu, double *layer_ns,
		      double *handoff_ns);

/** A split of the layers into contiguous stages, with its predicted cost. */
typedef struct mbp_model_plan {
	unsigned stages;		    /**< S */
	unsigned layers;		    /**< L */
	uint32_t mb_rows;		    /**< micro-batch size profiled; 0 when costs were given */
	unsigned first[MBP_MAX_STAGES + 1]; /**< stage s runs layers [first[s], first[s+1]); first[S] = L */
	double stage_ns[MBP_MAX_STAGES];    /**< predicted time per micro-batch, incoming hand-off included
					       (of one replica: the stage takes stage_ns / replicas per
					       micro-batch) */
	double slowest_ns;		    /**< the largest stage_ns / replicas: the pipeline's period */
	double mean_ns;			    /**< sum of stage_ns / the threads (the sum of the replicas) */
	double balance;			    /**< slowest / mean, 1.0 is perfect */
	double sequential_ns;		    /**< sum of the layer times (one thread, no hand-off) */
	unsigned replicas[MBP_MAX_STAGES];  /**< threads of stage s (0: one); mbp_model_partition sets 1 */
	unsigned threads; /**< the sum of the replicas; 0 in a plan filled by hand: stages */
} mbp_model_plan;

/**
 * Split L layers into S contiguous non-empty stages minimising the slowest stage, exactly.
 *
 * The cost of stage [a, b) is sum(layer_ns[a..b)) plus handoff_ns[a - 1] when a > 0 (its input arrives
 * from another stage). Dynamic programme over the split points, O(S L^2). Ties go to the split whose
 * stage boundaries come first.
 *
 * @param layer_ns   L costs (finite, >= 0)
 * @param handoff_ns optional, L costs (entry i: after layer i); NULL: no hand-off cost
 * @return 0, -EINVAL (NULL, L or S zero, a negative or non-finite cost), -ERANGE (S > L or
 *         S > MBP_MAX_STAGES).
 */
int mbp_model_partition(const double *layer_ns, const double *handoff_ns, unsigned layers, unsigned stages,
			mbp_model_plan *plan);

/**
 * Choose the stage boundaries and each stage's replicas together, exactly: the plan of least period
 * (max over stages of cost / replicas, the cost as in mbp_model_partition) whose replicas sum to at most
 * `cpus`; among those, the fewest threads, then the plan whose last stage starts first (and has the
 * fewest replicas), and so on back to the first. `stages` 0: any
 * number of stages, else exactly that many. Dynamic programme over (stages, threads, layers), O(K C^2
 * L^2) for K stages (1 when any) and C CPUs.
 *
 * Note: with no cost for a replica beyond its share of the work (this model), one stage of every layer
 * on every CPU meets the bound sum / cpus, so `stages` 0 returns it; give `stages` for a pipeline of
 * replicated stages (the costs of a replica's own cache and memory traffic are not modelled).
 *
 * @param cpus threads in all, 1 .. MBP_MAX_STAGES (the pipeline's limit)
 * @return 0, -EINVAL (NULL, L or cpus zero, a negative or non-finite cost), -ERANGE (stages > L,
 *         stages > cpus, cpus > MBP_MAX_STAGES), -ENOMEM.
 */
int mbp_model_partition_replicas(const double *layer_ns, const double *handoff_ns, unsigned layers,
				 unsigned stages, unsigned cpus, mbp_model_plan *plan);

/**
 * Profile (mbp_model_profile, 5 reps) then choose stages and replicas (mbp_model_partition_replicas) for
 * `cpus` threads at micro-batch size mb_rows.
 * @return as those two.
 */
int mbp_model_balance_replicas(mbp_model *m, unsigned stages, unsigned cpus, uint32_t mb_rows, int cpu,
			       mbp_model_plan *plan);

/**
 * Where each stage of a started pipeline of the plan's stages runs, one line per stage:
 * "stage 1 (layer 3) x2 -> CPUs 1,2" ("-> CPU 0" for one replica, "unpinned" where a replica is not).
 * @return the length of the full text, like snprintf; -EINVAL (NULL, the pipeline's stages are not the
 *         plan's).
 */
int mbp_model_plan_placement(const mbp_model_plan *plan, mbp_pipeline *p, char *buf, size_t n);

/**
 * Profile (mbp_model_profile, 5 reps) then partition: the plan for S stages at micro-batch size mb_rows.
 * @return as those two; -ERANGE when S exceeds the layer count.
 */
int mbp_model_balance(mbp_model *m, unsigned stages, uint32_t mb_rows, int cpu, mbp_model_plan *plan);

/**
 * Describe a plan: one line per stage ("stage 0: layers 0-3  412.5 us", with " x2 (206.2 us per
 * micro-batch)" for a replicated one) and the balance.
 * @return the length of the full text, like snprintf.
 */
int mbp_model_plan_describe(const mbp_model_plan *plan, char *buf, size_t n);

/* ---- stages ---- */

/**
 * Make one pipeline stage per range of the plan. Pair with mbp_model_stages_destroy().
 *
 * @param m           the model; must outlive the stages object
 * @param plan        a plan over the model's layers (mbp_model_partition or mbp_model_balance)
 * @param max_mb_rows largest micro-batch the stages will see (the pipeline's max_mb_rows); sizes the
 *                    scratch each stage allocates in its init
 * @return 0, -EINVAL (NULL, the plan does not cover the model's layers, max_mb_rows 0), -ENOMEM.
 */
int mbp_model_stages_new(mbp_model_stages **st, mbp_model *m, const mbp_model_plan *plan,
			 uint32_t max_mb_rows);

/** Number of stages. */
unsigned mbp_model_stages_count(const mbp_model_stages *st);

/**
 * The descriptor of stage s, for mbp_pipeline_add_stage(): name "layers a-b", fn, init (stage 0
 * registers its thread with RCU; every stage allocates its scratch and sets OpenBLAS to one thread),
 * fini, done (stage 0: drops the micro-batch's weights reference), out_row_bytes, cpu -1, and the
 * plan's replicas: the replicas of a stage share the weights read-only (the same RCU versions, one per
 * micro-batch, one per job) and each allocates its own scratch in its init.
 * The pipeline's in_row_bytes must be mbp_model_in_width() x 4 and its max_mb_rows at most the stages'.
 * @return 0, -ERANGE (s out of range), -EINVAL.
 */
int mbp_model_stage_desc(const mbp_model_stages *st, unsigned s, mbp_stage_desc *d);

/**
 * Add every stage to a pipeline (not started), in order.
 *
 * When the stages start, OpenBLAS is set to one thread (openblas_set_num_threads(1), process-wide): the
 * pipeline owns the cores, one stage per core, and OpenBLAS's own threads would compete with the other
 * stages. A program that also wants multi-threaded OpenBLAS elsewhere must set it back around that use.
 * Rebalancing with active replicas (rebalance.replicas): the stages remember p, and only the plan's
 * replicas of each stage are active at start (mbp_pipeline_replicas_set); a move changes the counts.
 *
 * @return 0, or mbp_pipeline_add_stage's error.
 */
int mbp_model_stages_add(mbp_model_stages *st, mbp_pipeline *p);

/**
 * Tell the stages the pipeline they run on, for a caller that added them itself: every stage, in order,
 * from mbp_model_stage_desc (its functions may be wrapped, called with the stage's ctx; its replicas
 * kept), before mbp_pipeline_start. What mbp_model_stages_add does after adding them: with
 * rebalance.replicas the plan's replicas become the active ones and a move may change the counts;
 * without rebalancing nothing changes and p is not checked. A stages object used again on a new pipeline
 * (the old one destroyed) is attached to the new one.
 *
 * @return 0, -EINVAL (NULL), -EBUSY (p started), -ERANGE (rebalancing, and p's stages are not these:
 *         another count, or a stage with other replicas than mbp_model_stage_desc's).
 */
int mbp_model_stages_attach(mbp_model_stages *st, mbp_pipeline *p);

/** Destroy a stages object (after the pipeline using it is destroyed). Accepts NULL. */
void mbp_model_stages_destroy(mbp_model_stages *st);

/* ---- rebalancing while running ---- */

/*
 * Rebalancing (opt-in: mbp_model_stages_opts.rebalance.on). Stage 0 admits micro-batches in windows of
 * `window`, all of a window under one plan, and the stages time every layer they run, counted in the
 * micro-batch's window. Once every micro-batch of a window has left the pipeline (completed or failed),
 * the next look of stage 0 (it looks as it opens a window) turns the times of that window's micro-batches,
 * and of no other, into a cost per layer (nanoseconds per micro-batch), the cost of each stage under the
 * plan in use (its layers plus a fixed 1 us hand-off per boundary, over its replicas) and a fresh plan from
 * the same costs for the same replica counts stage by stage (as mbp_model_partition, exact, with each
 * stage's cost over its replicas). So a look sees each layer at the cost of one window's micro-batches
 * however far the stages downstream lag stage 0 (the micro-batches in flight): only the window that holds
 * a change of cost sees a cost in between. A window admitted before a move and done after it measured the
 * old plan and is not looked at; the last windows of a stream, not done by its last look, are never
 * looked at. When the slowest stage measured stays above (1 + threshold) times the fresh plan's slowest
 * for `patience` windows in a row, with the same fresh plan cutting elsewhere each time, the stages move
 * to it from the next window on. (The plan's own prediction, from the costs it was made with, is kept and
 * reported; comparing with a fresh plan instead is what makes the rule right both when one stage got
 * slower and when every stage did, which no new cut helps.) A steady cost never moves: the plan in use
 * is then the fresh one.
 *
 * A move happens between micro-batches and needs no drain. Plans are numbered (1: the one given to
 * mbp_model_stages_new_opts, +1 per move) and every micro-batch carries the window it was admitted in,
 * with the window's plan (mb->carry_plan): stage s computes layers [first[s], first[s+1]) of that plan
 * for it. So a micro-batch
 * is computed with one plan from its first layer to its last, and with one weights version, as always;
 * none is reordered, failed or lost by a move. Every stage can compute any range (the weights are shared
 * read-only), its scratch and the hop buffers are sized for the widest activation any plan can hand over.
 * Each move is counted (mbp_model_stages_rebalance_stats) and reported to on_move with its reason.
 *
 * Rebalancing needs stages defined as layers: a pipeline of user stages (fn callbacks) has nothing that
 * could move from one stage to another. The stages keep the names of the first plan ("layers 0-3");
 * mbp_model_rebalance_stats.current says which layers each computes now. Costs are counted per layer
 * wherever it ran, so a core that another process slows makes its layers look dearer and the split
 * follows it; costs that keep changing faster than `patience` windows can make the split follow them
 * back and forth.
 *
 * Replicated stages (plan->replicas): a stage's threads are made when the pipeline starts and none is
 * made or ended while it runs. Unless active replicas are asked for (below), a move keeps every stage's
 * replica count and re-plans the boundaries for them: the least max over the stages of cost / replicas. A layer that got dear can so move onto a
 * replicated stage (and off it), but a replica does not move from one stage to another. Each replica
 * times its layers in counters of its own, summed at a look. The replicas of a replicated stage 0 admit
 * in turn (under a lock): a micro-batch's plan is the one in use when it was admitted, and they may admit
 * micro-batches a little out of the order submitted (each still one plan, the output still in order).
 *
 * Active replicas (rebalance.replicas = r > 0): each stage is made with max(r, its plan's replicas)
 * threads, of which the plan's replicas take micro-batches at start (mbp_model_stages_add makes the
 * others inactive: mbp_pipeline_replicas_set). A look then plans the boundaries and every stage's active
 * replicas together from the measured costs, exactly, each stage at most its threads: the least period,
 * then the fewest threads; a plan whose threads outnumber rebalance.cpus is counted (and predicted, its
 * slowest_ns in mbp_model_move.to) at no less than the layers' sum over those CPUs and is taken only
 * where it beats the best plan within them by 5 % (the costs count no time-slicing, park or wake). A move sets the new counts as it moves. An inactive
 * replica parks before it claims a micro-batch, so it never holds one: nothing is lost or reordered, and
 * a micro-batch's plan (its cuts) is what it carries, whichever replica computes it; a move that changes
 * counts is counted in replica_moves as well. This needs mbp_model_stages_add, or stages added one by one
 * (mbp_model_stage_desc, wrapped or not) and then mbp_model_stages_attach: the stages then know their
 * pipeline; without either they run all their threads and move boundaries only.
 *
 * Pinning with threads to spare (a known limitation). The threads beyond the CPUs share them, and the
 * placement, made at start, knows nothing of which replicas are active: the threads are numbered
 * replica-major (every stage's replica 0, then every replica 1, ...) and, where they outnumber the CPUs,
 * pinned in blocks of consecutive threads per CPU (mbp_opts.cpus: thread t on the (t x CPUs / threads)-th;
 * by default the least claimed CPUs, in blocks too). So 2 stages made with 2 threads each on CPUs 0,1 pin
 * both stages' replica 0, the active ones of a plan of 1,1, to CPU 0, and both parked threads to CPU 1:
 * the two active threads time-slice one core while the other idles. No placement fixed at start suits
 * every count a move may choose (placed so that the replicas 0 are apart, 4 threads on 3 CPUs put two
 * active threads on one CPU again after a move to 1,2, beside a CPU of parked ones); that would take
 * re-pinning threads at a move, which mbpipe does not do. Such a pipeline is best left unpinned
 * (mbp_opts.pinning MBP_PIN_NONE, what pipebench and pipeserve --rebalance-replicas choose), so that the
 * OS moves an active replica onto an idle CPU; a replica's measured layer times then include the
 * time-slicing, which makes the costs noisier.
 *
 * Forward stages only: a trainer (<mbpipe/model_train.h>) keeps its split while it runs; its stages made
 * again at another split between two steps give the same parameters bit for bit, which is what pipetrain
 * --rebalance rests on (it decides with mbp_model_rebalance_look below).
 */

/** One move, as reported to mbp_model_rebalance.on_move. */
typedef struct mbp_model_move {
	uint64_t plan;		    /**< the new plan's number (the first plan is 1) */
	uint64_t admitted;	    /**< micro-batches stage 0 admitted under earlier plans (a whole number
				       of windows) */
	mbp_model_plan from, to;    /**< stage_ns: the old plan measured, the new plan predicted */
	double measured_slowest_ns; /**< = from.slowest_ns: the old plan's slowest stage, measured */
	double predicted_ns;	    /**< the old plan's slowest as predicted when it was made */
	char reason[200];	    /**< one line: "stage 1 (layers 4-7) 1203.4 us > 1.10 x 900.2 us ..." */
} mbp_model_move;

/** Called on stage 0's thread after each move (one of its replicas' when it has several; the calls never
 * overlap, and stage 0 admits nothing while one runs): keep it short (log a line). */
typedef void (*mbp_model_move_fn)(void *arg, const mbp_model_move *mv);

/**
 * The cost to record for one layer of one micro-batch, for tests and benchmarks: called on stage `stage`'s
 * thread right after layer `layer` ran on `mb` (the stage's input), with the time it took; returns the time
 * to count (measured_ns to keep it). A replicated stage calls it from its replicas' threads at once. A test returns modelled costs, so that moves are deterministic
 * whatever the machine's load; a benchmark may spend time in it to make a layer slower (then it returns
 * measured_ns plus what it spent).
 */
typedef double (*mbp_model_layer_cost_fn)(void *arg, unsigned stage, unsigned layer, const mbp_mb *mb,
					  double measured_ns);

/** Rebalancing's options; a zeroed struct is off, and 0 in a field means the default after it. */
typedef struct mbp_model_rebalance {
	bool on;		   /**< rebalance while running */
	uint32_t window;	   /**< micro-batches a window admits, a look's measurement; 0: 64 */
	double threshold;	   /**< relative excess of the slowest stage that moves; 0: 0.10 */
	uint32_t patience;	   /**< windows in a row the excess must last; 0: 2 */
	mbp_model_move_fn on_move; /**< optional */
	void *on_move_arg;
	mbp_model_layer_cost_fn cost; /**< optional, called only with `on`: see mbp_model_layer_cost_fn */
	void *cost_arg;
	unsigned replicas; /**< the most replicas a move may give a stage: each is made with this many
			        threads (or its plan's replicas, if more), the plan's active at start; 0: the
			        plan's, and no move changes a count. See "Active replicas" */
	unsigned cpus;	   /**< the CPUs the active replicas share, for a move's plan; 0: those this
			        process may use (mbp_cpus_allowed, under its quota) */
} mbp_model_rebalance;

/** Options of mbp_model_stages_new_opts(); a zeroed struct means mbp_model_stages_new()'s behaviour. */
typedef struct mbp_model_stages_opts {
	mbp_model_rebalance rebalance;
} mbp_model_stages_opts;

/**
 * mbp_model_stages_new() with options. With rebalancing on, every stage but the last declares the
 * widest activation of the model (any layer's output but the last) as its out_row_bytes, so that the
 * pipeline's hop buffers fit any plan, and every stage allocates scratch of that width.
 * A plan with replicated stages rebalances too: its moves keep each stage's replicas, or re-plan the
 * active ones within rebalance.replicas threads a stage (see Rebalancing).
 * @return as mbp_model_stages_new(); -EINVAL also for a negative or non-finite threshold, -E2BIG where
 *         the stages' threads with rebalance.replicas exceed MBP_MAX_STAGES.
 */
int mbp_model_stages_new_opts(mbp_model_stages **st, mbp_model *m, const mbp_model_plan *plan,
			      uint32_t max_mb_rows, const mbp_model_stages_opts *o);

/** Rebalancing's statistics. */
typedef struct mbp_model_rebalance_stats {
	bool on;			    /**< rebalancing is on */
	uint64_t plan;			    /**< the plan in use's number (1: the first) */
	uint64_t moves;			    /**< moves so far (plan - 1) */
	uint64_t windows;		    /**< windows looked at (done, of the plan in use, with a
					       measurement of every layer) */
	mbp_model_plan current;		    /**< the plan in use, stage_ns as predicted when it was made */
	double measured_ns[MBP_MAX_STAGES]; /**< its stages as the last window measured them, as stage_ns:
					       of one replica (0: none yet) */
	double fresh_slowest_ns;	    /**< the last window's fresh plan's slowest stage */
	char last_reason[200];		    /**< the last move's reason, "" before the first */
	uint64_t replica_moves;		    /**< of the moves, those that changed a stage's active
					       replicas (current.replicas: the active ones now) */
	unsigned threads[MBP_MAX_STAGES];   /**< the threads each stage was made with (the most
					       replicas a move may give it) */
} mbp_model_rebalance_stats;

/**
 * Rebalancing's statistics (a copy taken under a lock). Any thread, any time.
 * @return 0, -EINVAL (NULL).
 */
int mbp_model_stages_rebalance_stats(mbp_model_stages *st, mbp_model_rebalance_stats *out);

/*
 * The rule of a look, on its own: what the rebalancing stages above decide at each window, for a caller
 * that measures by other means and moves by itself (pipetrain --rebalance measures each trainer stage per
 * step and remakes the stages and the trainer between steps). The caller gives, at each look, the plan in
 * use costed with the measurements (`measured`) and a fresh plan made from the same measurements
 * (`fresh`); the rule says move when the measured slowest stage is above (1 + threshold) times the fresh
 * plan's slowest, the fresh plan cuts elsewhere, and both held for `patience` looks in a row with the
 * same fresh cuts each time.
 */

/** The rule's options and state. Zero it, set the options (0 means the default after each), then look. */
typedef struct mbp_model_rebalance_rule {
	double threshold;			/**< relative excess that moves; 0: 0.10 */
	uint32_t patience;			/**< looks in a row the excess must last; 0: 2 */
	uint32_t strikes;			/**< state: looks in a row that found `candidate` better */
	unsigned candidate[MBP_MAX_STAGES + 1]; /**< state: the fresh plan's cuts at those looks */
	unsigned candidate_replicas[MBP_MAX_STAGES]; /**< state: and its replicas (0 read as 1) */
} mbp_model_rebalance_rule;

/**
 * One look. Counts a strike when `fresh` cuts elsewhere than `measured` or gives a stage other replicas,
 * and measured->slowest_ns exceeds
 * (1 + threshold) x fresh->slowest_ns, with the same cuts and replicas as the last strike (else the count starts
 * again at 1, or 0 when there is no excess); at `patience` strikes it answers move and starts again at 0.
 * Both plans must have the same stages and layers.
 * @return 1: move to `fresh`; 0: stay; -EINVAL (NULL, plans that do not match, a negative or non-finite
 *         threshold).
 */
int mbp_model_rebalance_look(mbp_model_rebalance_rule *r, const mbp_model_plan *measured,
			     const mbp_model_plan *fresh);

/**
 * A move's reason in one line: "stage 1 (layers 4-7) 1203.4 us > 1.10 x 900.2 us of a plan cutting before
 * layer 5 (planned 950.0 us)", from the plan in use as measured, the fresh plan, and the slowest stage the
 * plan in use predicted when it was made (planned_ns 0, a plan made without costs: no "(planned ...)").
 * @return the length of the full text, like snprintf.
 */
int mbp_model_rebalance_reason(const mbp_model_rebalance_rule *r, const mbp_model_plan *measured,
			       const mbp_model_plan *fresh, double planned_ns, char *buf, size_t n);

/* ---- live weight swap ---- */

/**
 * Replace the model's weights by those of `next`, while its stages run.
 *
 * Micro-batches that already took the old weights finish with them; those that start stage 0 after the
 * swap use the new ones (but a job under way finishes on its version, and a pinned micro-batch runs on its
 * pin); none mixes the two. Returns after a grace period (synchronize_rcu); the old
 * weights are freed when the last micro-batch using them leaves the pipeline. Must not be called from a
 * stage function.
 *
 * @param next a model with the same layer structure (widths, activations, norms and their epsilons);
 *             consumed on success (do not use or destroy it afterwards), left alone on error
 * @return 0, -EINVAL (NULL, m == next, a different structure), -EBUSY (next's weights are in use by
 *         a pipeline or an older version of next is still alive).
 */
int mbp_model_swap(mbp_model *m, mbp_model *next);

/* ---- weights versions ---- */

/** A reference to one version of a model's weights (it stays allocated while referenced). */
typedef struct mbp_model_weights mbp_model_weights;

/**
 * Take a reference to the model's current weights. Pair with mbp_model_weights_put(). Any thread.
 * @return the reference; NULL when m is NULL.
 */
mbp_model_weights *mbp_model_weights_get(mbp_model *m);

/** The version number of the weights (as mbp_model_version() numbered them). 0 for NULL. */
uint64_t mbp_model_weights_version(const mbp_model_weights *w);

/** Drop a reference; the last one frees an old version. Accepts NULL. Any thread. */
void mbp_model_weights_put(mbp_model_weights *w);

/**
 * Pin a micro-batch submitted one by one (mbp_mb_submit) to the weights `w`: the model's stages compute it
 * with those weights, whatever swaps happen meanwhile, instead of with the weights current when it reaches
 * stage 0. A caller that spreads a request over several micro-batches pins them all to one version, and
 * knows which (mbp_model_weights_version). Takes a reference of its own, stored in mb->carry after
 * mbp_mb_acquire() and before mbp_mb_submit(); the stages drop it when the micro-batch leaves the pipeline.
 * Call mbp_model_mb_unpin() on every result (and on a buffer whose submit failed): it drops the reference
 * of a micro-batch that no stage saw (cancelled before stage 0) and does nothing otherwise.
 * Micro-batches of jobs (mbp_job_submit, mbp_run) cannot be pinned: a job runs on one version by itself.
 * @return 0, -EINVAL (NULL, or mb->carry already set).
 */
int mbp_model_mb_pin(mbp_mb *mb, mbp_model_weights *w);

/** See mbp_model_mb_pin(). Accepts a micro-batch that was never pinned. */
void mbp_model_mb_unpin(mbp_mb *mb);

/* ---- files ---- */

/** Shape of a random model for mbp_model_write_random(). */
typedef struct mbp_model_spec {
	unsigned layers; /**< L (1 .. MBP_MODEL_MAX_LAYERS) */
	const uint32_t
	    *widths; /**< L + 1 widths: input, then each layer's output; NULL: use the next three */
	uint32_t in, hidden, out; /**< when widths is NULL: in -> hidden -> ... -> hidden -> out */
	mbp_act act;		  /**< activation of every layer but the last (which has none) */
	bool norm;		  /**< layer normalisation on every layer but the last */
	mbp_dtype dtype;	  /**< storage type */
	uint64_t seed;		  /**< same seed, same file */
} mbp_model_spec;

/**
 * Write a model file with random weights, deterministic for a seed; nothing comes from the network.
 * Weights are uniform in +-sqrt(6 / fan-in) before an activation (He) and +-sqrt(3 / fan-in) without, so
 * activations keep their scale through the layers; biases +-0.1, norm gains 1 +- 0.1, norm biases +-0.1. The
 * file carries its tensors' digests and is written by rename (<mbpipe/file.h>): a path that names anything
 * but a regular file is refused before any work; its mode is 0666 under the umask (0644 with the usual
 * umask 022).
 * @return 0, -EINVAL (bad spec), -EEXIST (the path is not a regular file), -errno from the file system,
 *         -ENOMEM.
 */
int mbp_model_write_random(const char *path, const mbp_model_spec *spec);

/* ---- kernels ---- */

/** The dense layers' kernel (see the model section above). */
typedef enum mbp_kernel {
	MBP_KERNEL_DEFAULT = 0, /**< the best for this CPU: packed with AVX2 and FMA, else blas */
	MBP_KERNEL_BLAS,	/**< OpenBLAS's cblas_sgemm (cblas_sgemv for one row) */
	MBP_KERNEL_PACKED	/**< mbpipe's AVX2/FMA kernel over weights packed once per version */
} mbp_kernel;

/**
 * Choose the dense layers' kernel, process-wide, for the objects made after the call. Each model version
 * (loaded, or brought by a swap) and each trainable model keeps the kernel it was made with for its life:
 * a version loaded under the packed kernel holds its packed copy and runs on it, one loaded under blas
 * runs on OpenBLAS; a trainable model made under packed stays on packed (packing as it goes once its
 * tensors are handed out). So a call while a pipeline runs changes no micro-batch's bits, nor those of a
 * forward and its recompute. Results differ between the kernels in the last bits, so a comparison bit for
 * bit needs one kernel on both sides. The environment's MBP_KERNEL (blas or packed), read once at the
 * first product or query, chooses the same way; a call overrides it.
 * @param k MBP_KERNEL_DEFAULT, MBP_KERNEL_BLAS or MBP_KERNEL_PACKED.
 * @return 0, -EINVAL (not a kernel), -ENOTSUP (packed on a CPU without AVX2 and FMA).
 */
int mbp_kernel_set(mbp_kernel k);

/** The kernel that objects made now get: MBP_KERNEL_BLAS or MBP_KERNEL_PACKED (never the default, which is
 * resolved). */
mbp_kernel mbp_kernel_get(void);

/** "blas", "packed", "default", or "unknown" for a value that is not an mbp_kernel. Static string. */
const char *mbp_kernel_name(mbp_kernel k);

/**
 * A warning when the environment's MBP_KERNEL was not used as written: a value that is not a kernel
 * ("BLAS", "openblas": the default runs) or "packed" on a CPU without AVX2 and FMA (blas runs); NULL
 * otherwise, or when MBP_KERNEL is unset. Print it where mbp_blas_warning is printed. Static string.
 */
const char *mbp_kernel_warning(void);

/* ---- OpenBLAS ---- */

/**
 * The OpenBLAS in use and how the stages use it: "<openblas_get_config()>, kernel <corename>; stages use 1
 * BLAS thread each", e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64, kernel Zen; stages
 * use 1 BLAS thread each" (each stage sets OpenBLAS to one thread at its init: the pipeline owns the
 * cores). Static string.
 */
const char *mbp_blas_info(void);

/**
 * A warning when OpenBLAS picked a generic kernel (without AVX2) on a CPU that has AVX2 or AVX-512, with
 * the OPENBLAS_CORETYPE value to export; NULL otherwise. Static string.
 */
const char *mbp_blas_warning(void);

#ifdef __cplusplus
}
#endif
#endif

/*
 * mbp_schedule and mbp_trainer: training through a pipeline of stages (a forward and a backward flow).
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * A training step takes a mini-batch of N rows, splits it into M micro-batches of m rows (the last may be
 * short) and runs them through S stages: each stage s computes a forward F (input -> output, keeping in its
 * stash what its backward needs), and a backward that takes the gradient of its output and gives the
 * gradient of its input while it accumulates the gradient of its own parameters. The backward is one
 * function B, or two: B_in (input gradient only) and B_w (weight gradient only), which lets a schedule put
 * the weight gradients where a stage would otherwise wait. The last stage turns its output and the
 * micro-batch's targets into a loss and the gradient that starts the backward. When every backward of the
 * step is done on every stage (the flush), each stage applies its update to its own parameters.
 *
 * A step is all or nothing: one that returns 0 has updated every stage, one that fails has updated none.
 * The stages update at once, each on its own thread (or by pieces, shared: "Replicas"), so one stage's
 * refusal could not be undone in the others: every refusal comes before the decision instead. After its
 * last operation of the step each stage's thread runs its check (may the update apply?) and its grad_sq;
 * the trainer (across ranks: every rank, in the same vote that a failed operation takes part in)
 * updates only if every operation, every check and every grad_sq (finite) agreed, and discards every
 * stage's gradient otherwise. A stage whose update can refuse (a non-finite gradient, say) gives a check
 * with the same refusals (the MLP stages: mbp_mlp_stage_update_check). `update` returns an int so that a
 * stage that breaks this contract is reported, never silent: its refusal fails the step with
 * -ENOTRECOVERABLE (the other stages have updated), and every later step too.
 *
 * Schedules: the order of each stage's operations, computed once per (schedule, S, M):
 *   GPipe  all M forwards, then all M backwards. Stash peak of a stage: M micro-batches.
 *   1F1B   (PipeDream-Flush) S - s - 1 forwards to warm up, then one forward one backward, then the
 *          remaining backwards. Same bubble as GPipe, stash peak S - s whatever M is.
 *   ZB-H1  (zero bubble, Qi et al. 2023) 1F1B's forwards and input-gradient backwards (B_in), stash peak
 *          S - s; stage s defers its first s weight gradients (B_w) and runs each later one right after
 *          a B_in, the deferred ones at the end, where it would otherwise wait for gradients. With F, B_in
 *          and B_w of equal cost the bubble is about a third of 1F1B's. A deferred B_w keeps its
 *          micro-batch's stash, input and output gradient until it runs: up to min(S, M) micro-batches
 *          are held by a stage at once, which is 1F1B's peak at stage 0 (the "held" figure below).
 *   Chunked (train.h, "Chunks": S chunks on p threads), F = B_in = B_w, 2 threads, M = 8, bubbles as
 *   mbp_schedule_simulate predicts them against 1F1B's 0.111 (one stage per thread):
 *   interleaved  (interleaved 1F1B, Megatron-LM) v chunks a thread, chunk c on thread c mod p; rounds of
 *          about p micro-batches through each chunk in turn, 1F1B's warm-up plus (v - 1) rounds. Bubble
 *          about 1/v of 1F1B's (0.059 with v = 2); stash peak of thread t (v - 1) * round + 2(p - 1 - t)
 *          + 1 micro-batch chunks.
 *   looped-bfs  (breadth-first, Lamy-Poirier 2022) the same placement, all M micro-batches through one
 *          chunk before the next, then the backwards the same way up. Interleaved's bubble at v * M
 *          micro-batch chunks held.
 *   zbh2   (Qi et al. 2023) one stage per thread, built by the greedy list scheduler (mbp_schedule_build's
 *          rule) with unit costs and 2S - 1 micro-batches held at most per stage, about twice 1F1B's. With
 *          F = B_in = B_w its bubble is ZB-H1's, already the least that one stage per thread allows
 *          ((S-1)/(3M+S-1): the last stage starts after S - 1 forwards); it gains where costs differ.
 *   zbv    (ZB-V, Qi et al. 2024; PyTorch's ScheduleZBVZeroBubble) two chunks per thread in a V (thread t:
 *          chunks t and 2p - 1 - t). Bubble 0.020; held peak per thread 2p micro-batch chunks, the same
 *          memory as 1F1B's p micro-batches of a whole stage.
 *   dualpipev  (DeepSeek-V3's DualPipe folded into a V; PyTorch's ScheduleDualPipeV) the V placement, the
 *          forward of one micro-batch and the backward of another back to back in the steady state (run
 *          one after the other here), zero-bubble B_in/W at the ends. M >= S. Bubble 0.020, held 2p + 1.
 * Every stage's list is a projection of one global order (a valid order of all operations of the step in
 * which each operation comes after what it depends on), so no two stages can wait on each other; a thread
 * that runs several stages follows the merged order of its stages. Under GPipe and 1F1B a stage that gives
 * B_in and B_w runs them back to back as its B, sending the input gradient when both are done (as a
 * framework that sees one backward does); only ZB-H1 separates them. Every schedule runs each stage's
 * weight-gradient operations in micro-batch order, so the parameters after a step are bit for bit the same
 * under every schedule and any thread count (given deterministic stage functions).
 *
 * Activation memory. Each micro-batch's stash (from F to its last backward) and work buffer (a stage that
 * recomputes: from its recomputation to its last backward) come from an activation pool of their own,
 * taken without a thread cache, so that its high-water mark (mbp_train_stats.act_pool) is exactly the
 * most of them held at once; the trainer counts the same buffers and their bytes (rows x width) per stage
 * and over all stages (mbp_train_stage_stats.act_*, mbp_train_stats.act_peak_*). Under a chunked schedule
 * each chunk is a stage here: a thread that runs several chunks holds the sum of theirs. Not counted there:
 * each micro-batch's input to a stage (the previous stage's output, kept from F to the last backward)
 * and its gradients, which are buffers of the trainer's other pool (mbp_train_stats.pool).
 *
 * Replicas. A stage whose work is more than a thread's share (one layer costs more than the others
 * together, and no cut between layers helps) may run on several threads: `replicas` r in its descriptor.
 * Its micro-batches go to the replicas by a fixed rule, micro-batch j to replica j mod r: the schedules
 * are static (each stage's list fixed before the step), so a fixed assignment is what keeps every
 * replica's list a projection of the one global order, and no replica can wait on one that waits on it
 * (a rule of "whichever is free" would make the lists depend on the timing). Each replica runs on a thread
 * other than its stage's other replicas' and follows its projection of its stage's list (its
 * micro-batches' operations, in global order);
 * between two stages micro-batch j goes from replica j mod r of one to replica j mod r' of the other,
 * each pair of replicas with a ring each way. A replica is a copy of a thread of the schedule: under
 * GPipe, 1F1B, ZB-H1 and ZB-H2 a replicated trainer runs one stage a thread (`threads` 0 or the replicas'
 * sum), so a copy of a thread is a copy of its stage; the chunked, built and custom schedules place
 * several chunks on one thread (train.h, "Chunks"), and there thread t of the schedule (`threads` its
 * own, as without replicas) runs on as many threads as the most replicas of its chunks, copy k running
 * replica k of each of its chunks (micro-batches j with j mod r = k of a chunk of r replicas; a chunk of
 * fewer replicas than the copies stays off the higher ones). Where a thread's chunks have the same count
 * r, copy k follows the thread's list projected onto its micro-batches. Every copy's list is thus a
 * projection of the one global order, as every thread's is: no copy can wait on one that waits on it,
 * and the merge below waits for an earlier operation of that order too. Across ranks (libmbpipe-mpi)
 * every rank learns every stage's replicas at start and plays the same order; a replica at a rank's
 * edge has links of its own, micro-batch j goes to replica j mod r there too, and a replicated stage's
 * items leave in micro-batch order (so not under a custom or built schedule, MBP_SCHED_CUSTOM or
 * MBP_SCHED_AUTO, whose stages may run theirs out of order: -ENOTSUP from mbp_trainer_start). The lists are mbp_schedule_new_replicated()'s under the
 * block kinds (1F1B and ZB-H1 run as many forwards ahead as there are replicas downstream, so that each
 * replica has a micro-batch) and the schedule's own under the others, no forward more ahead (in the
 * play, 4 chunks on 2 threads, M = 8, thread 1's chunks 3x the others' (F = B_in = 3 B_w) on 2 copies:
 * 1.85x under interleaved, 1.9x looped BFS, 1.6x ZB-V and DualPipeV, against the 2x of twice the
 * threads), mbp_schedule_simulate_replicas() plays them (bubble_predicted), and the pool is reserved
 * to a bound over every timing counted per micro-batch (an output and an input gradient per link, the
 * loss's gradient) and per thread, rather than the exact peak of a pipeline of one thread per stage.
 * The parameters are the stage's own, shared by its replicas (read-only while the step runs); the
 * replicas' scratch is theirs (replica_ctx). The weight gradient is the stage's one accumulator too, and
 * the ordered merge keeps its sums: the weight part of each backward (B_w, or the B_w of a B, which a
 * replica runs as B_in then B_w, sending the input gradient between them) adds into it in micro-batch
 * order: micro-batch j's after j - 1's, on whichever replica ran that, while the replicas' forwards and
 * input gradients run in parallel. So a stage adds the same products in the same order as it does
 * without replicas, and as a stage of one replica (whose weight gradients are in micro-batch order
 * already: no wait at all) does: the
 * parameters after a step are bit for bit the same for every replica count, under every schedule,
 * with no extra pass over the gradient (the reference is the stage's own accumulation, such as
 * OpenBLAS's sgemm with beta = 1 into G, called in micro-batch order). What a replicated stage must
 * give: a forward, backward_in and recompute that write nothing shared (the gradient is written only by
 * backward_w, or by a whole backward: a stage with no backward_in/backward_w merges its whole B in turn,
 * which runs its backwards one at a time), and a backward that is backward_in then backward_w, the same
 * arithmetic (a replica splits it). The cost: a stage's weight-gradient parts run one at a time, so r
 * replicas reach r times one thread only while the weight part is at most 1/r of the stage's work (a
 * third with F = B_in = B_w: r = 3). A replicated last stage runs the loss on its replicas' threads at
 * once: the loss function must then be safe to call from several threads (each call on its own
 * micro-batch's buffers). Every guarantee holds per replica: errors name the stage and micro-batch, the
 * stage's check (once the replicas' last weight gradient is in) and update run once, on replica 0's
 * thread, and figures come per stage
 * (mbp_trainer_stats_get: the replicas' sums) and per replica (mbp_trainer_replica_stats_get).
 * A stage's check, squared norm and update are element-wise passes over its parameters, which would
 * leave the other replicas idle while replica 0 runs them; a stage that cuts them into pieces
 * (mbp_train_stage_desc.pieces) has them shared instead: replica k of r runs check_pieces and then
 * update_pieces (or discard_pieces) over pieces [k P / r, (k + 1) P / r) of its P, at once with the
 * others, and update_end runs once when all are done. The stage's squared norm is then its pieces'
 * added in piece order (to 0), whichever replica computed each: the same bits for every replica count,
 * 1 included, as long as the pieces are a property of the stage (not of the split) and an element's
 * update depends on nothing else (the MLP stages: mbp_mlp_stage_pieces). Where every stage has pieces
 * and none is replicated (and the trainer is not a part of a pipeline across ranks), the pieces of all
 * stages, in stage order, are cut into one contiguous range per thread instead, once every thread's
 * last operation is done: a thread whose stages hold fewer pieces checks and updates some of another
 * stage's, so that the end of the step waits for no thread's larger share (the same bits).
 *
 * Thread safety: an mbp_schedule is immutable once built (any threads may read it). A trainer is driven by
 * one controlling thread (start, step, destroy); mbp_trainer_cancel and mbp_trainer_stats_get may be
 * called from any thread while a step runs.
 */
#ifndef MBPIPE_TRAIN_H
#define MBPIPE_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- schedules ---- */

typedef enum mbp_sched_kind {
	MBP_SCHED_DEFAULT = 0, /**< 1F1B */
	MBP_SCHED_GPIPE = 1,
	MBP_SCHED_1F1B = 2,
	MBP_SCHED_ZBH1 = 3,
	MBP_SCHED_INTERLEAVED = 4, /**< interleaved 1F1B: v chunks per thread, chunk c on thread c mod p */
	MBP_SCHED_LOOPED_BFS =
	    5,		    /**< looped BFS: the same placement, every micro-batch through a chunk first */
	MBP_SCHED_ZBH2 = 6, /**< ZB-H2: zero bubble at about twice 1F1B's memory (one stage per thread) */
	MBP_SCHED_ZBV = 7,  /**< ZB-V: two chunks per thread in a V (thread t: chunks t and 2p-1-t) */
	MBP_SCHED_DUALPIPEV = 8, /**< DualPipeV: the V placement, forward and backward of two micro-batches
				        back to back */
	MBP_SCHED_AUTO = 9,	 /**< built from costs (mbp_schedule_build) */
	MBP_SCHED_CUSTOM = 10,	 /**< read from text (mbp_schedule_read_csv) */
} mbp_sched_kind;

typedef enum mbp_op_kind {
	MBP_OP_F = 0,	   /**< forward */
	MBP_OP_B = 1,	   /**< whole backward (input and weight gradients), or B_in + B_w back to back */
	MBP_OP_BIN = 2,	   /**< input gradient only (ZB-H1) */
	MBP_OP_W = 3,	   /**< weight gradient only (ZB-H1) */
	MBP_OP_UPDATE = 4, /**< not in a schedule: the step's update (a stage's check, grad_sq or update), as
			        mbp_train_error.op */
	MBP_OP_R = 5,	   /**< not in a schedule: a stage's recomputation (its `recompute`), which the
			        trainer runs before the B or B_in it serves: its own event and figures */
} mbp_op_kind;

typedef struct mbp_sched_op {
	uint32_t mb;	/**< micro-batch, 0 .. M-1 */
	uint16_t stage; /**< 0 .. S-1 */
	uint8_t kind;	/**< mbp_op_kind */
	uint8_t reserved;
} mbp_sched_op;

typedef struct mbp_schedule mbp_schedule;

/** Largest micro-batch count of one step (keeps the schedules' tables small). */
#define MBP_TRAIN_MAX_MBS 65536u

/** Most replicas of one trainer stage (mbp_train_stage_desc.replicas). */
#define MBP_TRAIN_MAX_REPLICAS 16u

/**
 * Build a schedule for `stages` stages and `mbs` micro-batches. Pair with mbp_schedule_destroy(). A chunked
 * kind gets its default threads (mbp_schedule_new_placed with 0: two chunks a thread).
 * @return 0, -EINVAL (NULL, stages 0 or above MBP_MAX_STAGES, mbs 0 or above MBP_TRAIN_MAX_MBS, an unknown
 *         kind), -ENOMEM.
 */
int mbp_schedule_new(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs);
void mbp_schedule_destroy(mbp_schedule *sc);

mbp_sched_kind mbp_schedule_kind(const mbp_schedule *sc);
unsigned mbp_schedule_stages(const mbp_schedule *sc);
unsigned mbp_schedule_mbs(const mbp_schedule *sc);

/** The global order: every operation of the step once. Writes a pointer to the array, returns its length. */
size_t mbp_schedule_order(const mbp_schedule *sc, const mbp_sched_op **ops);

/** Stage `stage`'s list, in the order it runs (a projection of the global order). 0 for a bad stage. */
size_t mbp_schedule_stage_ops(const mbp_schedule *sc, unsigned stage, const mbp_sched_op **ops);

/** Peak stash of a stage: micro-batches whose forward ran and whose B (or B_in) has not. 0: bad stage. */
unsigned mbp_schedule_stash_peak(const mbp_schedule *sc, unsigned stage);

/** Peak held by a stage: micro-batches whose forward ran and whose last backward operation (B or B_w) has
 * not. Equals the stash peak except under ZB-H1. 0: bad stage. */
unsigned mbp_schedule_held_peak(const mbp_schedule *sc, unsigned stage);

/** "gpipe", "1f1b", "zbh1", "interleaved", "looped-bfs", "zbh2", "zbv", "dualpipev", "auto", "custom" (for
 * MBP_SCHED_DEFAULT: "1f1b"); "?" for anything else. */
const char *mbp_sched_name(mbp_sched_kind kind);
/** Parse a name of mbp_sched_name (also "zb-h1", "zb", "zb-h2", "zb-v", "interleaved-1f1b", "i1f1b",
 * "loopedbfs", "bfs", "dualpipe-v", case-insensitive; not "custom"). @return 0 or -EINVAL. */
int mbp_sched_parse(const char *name, mbp_sched_kind *kind);

/**
 * Chunks. A schedule's stages may be chunks of a model placed on fewer threads than there are chunks, by
 * a placement rule that the schedule fixes (mbp_schedule_new_placed):
 *   block        stage s on thread s * T / S, consecutive stages sharing one (GPipe, 1F1B, ZB-H1, ZB-H2:
 *                any thread count T at most S, chosen when the schedule is played or run);
 *   interleaved  chunk c on thread c mod p (interleaved 1F1B, looped BFS: S = v * p, v chunks a thread);
 *   V            chunk c on thread c for c < p, 2p - 1 - c after (ZB-V, DualPipeV: S = 2p);
 *   custom       what a schedule read from text says (each stage on the one thread that runs it).
 * The hop between two chunks of one thread is no hand-off to another thread: the trainer passes the
 * buffer directly, in a FIFO of that thread's own (no ring, no atomics; the thread's list runs the
 * producer's operation before the consumer's, so the FIFO holds the micro-batches in the order they are
 * taken). The same holds for consecutive stages of a block that share a thread, and for replicas on the
 * same copy of a thread. A hop to another thread goes through a ring as between stages. A step's counts
 * of both per stage (mbp_train_stage_stats.hops and local_hops) add up, over the stages of a thread, to
 * mbp_schedule_thread_figures' hops and local_hops for that thread.
 */
typedef enum mbp_sched_place {
	MBP_PLACE_BLOCK = 0,
	MBP_PLACE_INTERLEAVED = 1,
	MBP_PLACE_V = 2,
	MBP_PLACE_CUSTOM = 3,
} mbp_sched_place;

/**
 * Build a schedule of `stages` chunks on `threads` threads. For the block kinds `threads` may be 0 (any
 * thread count, as mbp_schedule_new); interleaved 1F1B and looped BFS need stages a multiple of threads
 * (0: stages / 2, two chunks a thread); ZB-V and DualPipeV need stages == 2 * threads (0: stages / 2).
 * DualPipeV needs mbs >= stages. Pair with mbp_schedule_destroy().
 * @return 0, -EINVAL (what mbp_schedule_new refuses; a thread count the kind cannot place), -ENOMEM.
 */
int mbp_schedule_new_placed(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs,
			    unsigned threads);

/**
 * The schedule a trainer with replicated stages runs (train.h, "Replicas"): `replicas[s]` threads for
 * stage s (0 means 1). GPipe and ZB-H2 as mbp_schedule_new builds them; 1F1B and ZB-H1 with a warm-up
 * counted in threads: stage s runs as many forwards ahead as there are replicas from it to the last stage,
 * less one (S - s - 1 with one replica each: the published lists), so that a replicated stage has a
 * micro-batch for each replica. Pair with mbp_schedule_destroy().
 * @return 0, -EINVAL (what mbp_schedule_new refuses, another kind, more than MBP_TRAIN_MAX_REPLICAS
 *         replicas of a stage), -ENOMEM.
 */
int mbp_schedule_new_replicated(mbp_schedule **sp, mbp_sched_kind kind, unsigned stages, unsigned mbs,
				const unsigned *replicas);

/** The schedule's placement and thread count (0 for the block placement: any). */
mbp_sched_place mbp_schedule_placement(const mbp_schedule *sc);
unsigned mbp_schedule_threads(const mbp_schedule *sc);

/** The thread that runs stage `stage` when the schedule runs on `threads` threads (the block placement's
 * s * T / S; the others' own, where `threads` must be 0 or theirs). UINT32_MAX for a bad argument. */
unsigned mbp_schedule_thread_of(const mbp_schedule *sc, unsigned stage, unsigned threads);

/** What a thread holds and hands on in a step, over its chunks (each chunk's micro-batch counts one: a
 * chunk of a V schedule on p threads is half a stage of 1F1B on the same p threads). */
typedef struct mbp_sched_thread_figures {
	unsigned stash_peak; /**< most micro-batch chunks whose F ran and whose B (or B_in) has not */
	unsigned held_peak;  /**< most whose F ran and whose last backward operation (B or W) has not */
	unsigned hops;	     /**< hand-offs to another thread: outputs and input gradients pushed on a ring */
	unsigned local_hops; /**< hops to a chunk of the same thread (no hand-off) */
} mbp_sched_thread_figures;

/** Thread `thread`'s figures when the schedule runs on `threads` threads (0: the schedule's own, or one
 * per stage). @return 0, -EINVAL. */
int mbp_schedule_thread_figures(const mbp_schedule *sc, unsigned threads, unsigned thread,
				mbp_sched_thread_figures *out);

/**
 * Schedules as text: torch.distributed.pipelining's per-rank action lists in its compute-only CSV layout
 * (PipelineScheduleMulti._dump_csv and _load_csv): one row per thread (a rank there), its actions in the
 * order it runs them, comma-separated; an action is "<stage><kind><micro-batch>", kind F (forward), B
 * (whole backward), I (input gradient, B_in) or W (weight gradient), such as 0F1, 1I1, 1W1, 0B1; an empty
 * cell is a bubble (skipped). PyTorch's overlapped pair "(0F1;3B0)OVERLAP_F_B" reads as its actions in
 * turn. Stages and micro-batches count from 0: the stage count is the highest stage plus one, the
 * micro-batch count the highest micro-batch plus one.
 */

/** Where a schedule's text breaks a rule: the line (1-based, a thread's row) and column (1-based action
 * index in it; 0 for the whole line), the action as written (or the missing one), and what is wrong. */
typedef struct mbp_sched_text_error {
	unsigned line, column;
	char action[32];
	char what[160];
} mbp_sched_text_error;

/**
 * Read a schedule from `len` bytes of CSV text. Refused, naming the line and the action in `err` (if not
 * NULL): a cell that is no compute action; a stage on two lines; a micro-batch missing or repeated, or
 * out of micro-batch order within its stage and kind (mbpipe's rule: each stage runs its forwards, its
 * backwards and its weight gradients in micro-batch order, which keeps the parameters bit for bit the
 * same under every schedule; PyTorch's looped BFS runs its backwards in reverse and is refused here); a
 * W without its I before it; a dependency broken (an action before what it needs in its own line) or a
 * deadlock (lines waiting on each other); a thread holding more than `held_limit` micro-batch chunks at
 * once (0: no limit). The schedule's kind is MBP_SCHED_CUSTOM, its placement custom, one thread per line.
 * @return 0, -EINVAL (NULL, a refused schedule: err says why), -E2BIG (more than MBP_MAX_STAGES stages or
 *         MBP_TRAIN_MAX_MBS micro-batches), -ENOMEM.
 */
int mbp_schedule_read_csv(mbp_schedule **sp, const char *text, size_t len, unsigned held_limit,
			  mbp_sched_text_error *err);

/** mbp_schedule_read_csv() of the file at `path`. @return as it, or -errno of opening or reading it
 * (-EIO), -ENOMEM. */
int mbp_schedule_load_csv(mbp_schedule **sp, const char *path, unsigned held_limit,
			  mbp_sched_text_error *err);

/**
 * Write the schedule as that CSV, one line per thread of `threads` (as mbp_schedule_thread_of: 0 for a
 * chunked schedule's own or one per stage), into buf (cap bytes, NUL-terminated when cap > 0). Returns
 * the length of the whole text (without its NUL) as snprintf does, or 0 for a bad argument.
 */
size_t mbp_schedule_write_csv(const mbp_schedule *sc, unsigned threads, char *buf, size_t cap);

/** A copy of `sc` (its own; pair with mbp_schedule_destroy). @return 0, -EINVAL, -ENOMEM. */
int mbp_schedule_copy(mbp_schedule **sp, const mbp_schedule *sc);

/** Cost of each operation of one stage, in any unit (nanoseconds from measurements, or 1 each). */
typedef struct mbp_op_costs {
	double f, b_in, b_w; /**< a whole backward B costs b_in + b_w */
} mbp_op_costs;

/** Result of mbp_schedule_simulate(). */
typedef struct mbp_sched_sim {
	double makespan; /**< time from the first operation's start to the last one's end */
	double busy;	 /**< sum of every operation's cost */
	double bubble;	 /**< 1 - busy / (threads x makespan) */
} mbp_sched_sim;

/**
 * Play the schedule with the given per-stage costs (`costs[s]`, S entries) on `threads` threads (stage s on
 * thread s * threads / S, as the trainer places them; 0 means one per stage; a chunked schedule on its own
 * threads, mbp_schedule_thread_of, 0 or its count): each operation starts when
 * its thread is free and what it depends on is done. `start`, if not NULL, receives the start time of each
 * operation of the global order (mbp_schedule_order's indices), for drawing. This is the bubble the
 * schedule predicts.
 * @return 0, -EINVAL (NULL, threads above the stage count or not a chunked schedule's own, a negative
 *         cost).
 */
int mbp_schedule_simulate(const mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
			  mbp_sched_sim *out, double *start);

/**
 * mbp_schedule_simulate() with replicated stages (mbp_train_stage_desc.replicas): stage s runs on
 * `replicas[s]` threads (0 means 1), micro-batch j on its replica j mod replicas[s], each replica
 * following its projection of the stage's list, and the weight part of a replicated stage's backward (its
 * W, or the b_w that ends its B) waiting for the previous micro-batch's: the trainer's ordered merge. A
 * block schedule (threads 0) one thread per replica; a schedule with threads of its own (chunked, built,
 * custom) as the trainer runs it: each thread copied as often as the most replicas of its stages, replica
 * k of a stage on copy k of its thread. The bubble is 1 - busy / (copies x makespan), the copies' count
 * being the trainer's thread count (mbp_train_stats.threads).
 * @return 0, -EINVAL (NULL, more than MBP_TRAIN_MAX_REPLICAS replicas of a stage or MBP_MAX_STAGES
 *         threads in all, a negative cost), -ENOMEM.
 */
int mbp_schedule_simulate_replicas(const mbp_schedule *sc, const mbp_op_costs *costs,
				   const unsigned *replicas, mbp_sched_sim *out, double *start);

/** What mbp_schedule_build() builds a schedule for. A zeroed field is its default where it has one. */
typedef struct mbp_sched_build {
	unsigned stages, mbs;	   /**< required: as mbp_schedule_new's */
	unsigned threads;	   /**< 0: one per stage */
	const mbp_op_costs *costs; /**< required: per stage (chunk), as measured (mbp_schedule_simulate's) */
	unsigned held_limit;	   /**< most micro-batch chunks a thread may hold (mbp_sched_thread_figures
				        .held_peak); 0: no limit */
	bool split;		   /**< the stages give B_in and B_w apart (else whole backwards only) */
} mbp_sched_build;

/**
 * Build a schedule from costs (MBP_SCHED_AUTO, for --schedule auto): the greedy list scheduler (the rule
 * of ZB-H2, train.h above: of the threads the one that can start an operation earliest takes one; of its
 * ready operations a backward first, then a forward while the thread holds fewer than its limit, then the
 * oldest weight gradient; the chunk nearest the loss first) played with these costs, on the block
 * placement and, where they fit the thread count, the interleaved and V ones, at limits up to
 * held_limit; and every fixed schedule that fits the thread count and the limit (the zero-bubble ones
 * only where split). The one whose simulated makespan (mbp_schedule_simulate on `threads`) is the least
 * wins (ties: the earlier tried, the fixed ones first), so its bubble is at most every fixed schedule's
 * at the same held limit. Its threads are fixed: it runs on `threads` threads.
 * @return 0, -EINVAL (NULL, a bad count, a negative or non-finite cost), -ENOSPC (nothing fits the
 *         limit), -ENOMEM.
 */
int mbp_schedule_build(mbp_schedule **sp, const mbp_sched_build *b);

/* ---- the trainer ---- */

/**
 * What an operation of a stage reads and writes, for one micro-batch. Row widths are the stage's: `in`
 * rows of its input width, `out` rows of its output width, `dout` rows of its grad_row_bytes (its output
 * width unless it says otherwise), `din` rows of the previous stage's grad_row_bytes, `stash` rows of its
 * stash width. Every pointer is aligned to 64 bytes except `in` and `targets` at stage 0, which point into the
 * caller's arrays (aligned as the caller's are).
 */
typedef struct mbp_train_io {
	uint32_t mb;	     /**< micro-batch index in the step */
	uint32_t rows;	     /**< rows in this micro-batch */
	uint64_t step_rows;  /**< N: rows of the whole step (for losses that average over it) */
	uint64_t step;	     /**< step number, counting from 0 */
	const void *in;	     /**< F, B, B_in, B_w: the stage's input rows */
	void *out;	     /**< F: written; loss: read */
	void *stash;	     /**< F: written; B, B_in, B_w: read (NULL when the stage has no stash) */
	void *dout;	     /**< B, B_in, B_w: gradient of the output, read; loss: written */
	void *din;	     /**< B, B_in: gradient of the input, written; NULL at stage 0 */
	const void *targets; /**< loss: this micro-batch's rows of target_row_bytes */
	void *work; /**< recompute: written; B, B_in, B_w: read (NULL when the stage recomputes nothing) */
} mbp_train_io;

/** A stage's operation: 0 or a negative errno (which fails the step). */
typedef int (*mbp_train_op_fn)(void *ctx, const mbp_train_io *io);

/** What every stage's update is told at the flush of a successful step. */
typedef struct mbp_train_update {
	uint64_t step; /**< step number, counting from 0 */
	uint64_t rows; /**< N */
	double loss;   /**< summed loss of the step (the loss function's values added in order) */
	/** sqrt of the sum over the stages (of every rank) of grad_sq, added in stage order; NaN when a
	 * stage gives no grad_sq: the norm is then unknown. Never NaN for a non-finite gradient (a grad_sq
	 * that is not finite fails the step), so a stage that clips by it must not leave grad_sq out. */
	double grad_norm;
} mbp_train_update;

typedef struct mbp_train_stage_desc {
	const char *name;	/**< copied (at most MBP_STAGE_NAME_MAX - 1 bytes); NULL: "stage<i>" */
	void *ctx;		/**< passed to every callback */
	size_t out_row_bytes;	/**< width of an output row (required, > 0) */
	size_t stash_row_bytes; /**< width of a stash row; 0: no stash */
	/** Width of a row of this stage's output gradient (dout here, the next stage's din); 0: out_row_bytes.
	 * Wider lets the next stage send back more than the gradient of the output: for example also the
	 * input gradient of this stage's last layer, computed there (mbp_mlp_stages_hand_over). The last
	 * stage's must be out_row_bytes (the loss writes it): mbp_trainer_start() refuses it otherwise. */
	size_t grad_row_bytes;
	mbp_train_op_fn forward;  /**< required */
	mbp_train_op_fn backward; /**< whole backward; or give backward_in and backward_w (or all three) */
	mbp_train_op_fn backward_in;
	mbp_train_op_fn backward_w;
	/** Squared norm of the gradient accumulated so far (for clipping by global norm). Optional (see
	 * mbp_train_update.grad_norm); a value that is not finite fails the step (-EDOM, op MBP_OP_UPDATE)
	 * before any stage updates. Runs on the stage's thread after its check. */
	double (*grad_sq)(void *ctx);
	/** Would update refuse this step's gradient? 0 (it will apply it), or a negative errno, such as
	 * -EDOM for a non-finite gradient, that fails the step before any stage updates: mbp_trainer_error
	 * names this stage, op MBP_OP_UPDATE, mb -1. Runs on the stage's thread after its last operation of
	 * the step. Optional: required in effect of a stage whose update can refuse (see above). */
	int (*check)(void *ctx);
	/** Apply the accumulated gradient to the parameters and clear it. Required (but with pieces).
	 * Returns 0; a negative errno breaks the contract above (check said it would apply): the step
	 * fails with -ENOTRECOVERABLE naming this stage, and so does every later step. */
	int (*update)(void *ctx, const mbp_train_update *u);
	/** Clear the accumulated gradient without applying it (a failed step). Required (but with pieces). */
	void (*discard)(void *ctx);
	/** Optional, on the stage's thread at start: 0 or a negative errno (a positive value is -EPROTO). */
	int (*init)(void *ctx, unsigned stage);
	/** Optional, on the stage's thread at destroy, or at a start that failed after its init succeeded. */
	void (*fini)(void *ctx);
	/** Activation recomputation: width of a row of the work buffer into which `recompute` refills what
	 * the stash leaves out; 0: none (and `recompute` is not called). The trainer takes it before the
	 * micro-batch's B (or B_in), runs `recompute` (it reads in and stash, no gradient, so it runs before
	 * the wait for dout), and keeps it until the micro-batch's last backward operation: to the end of B
	 * under GPipe and 1F1B, from B_in to B_w under ZB-H1 (held as the stash is). */
	size_t work_row_bytes;
	mbp_train_op_fn recompute; /**< required when work_row_bytes is not 0: fills io->work */
	/** Replicas (see "Replicas" above): the stage runs on this many threads, micro-batch j on replica
	 * j mod replicas (under a chunked, built or custom schedule, replica k on copy k of the chunk's
	 * thread). 0 or 1: one (the stage as without the field). At most MBP_TRAIN_MAX_REPLICAS. */
	unsigned replicas;
	/** Per replica, the context its forward, backward, backward_in, backward_w, recompute, init and
	 * fini get: replica_ctx[r] for replica r (the array is read by mbp_trainer_add_stage only). NULL:
	 * `ctx` for every replica (callbacks that keep no scratch in it). check, grad_sq, update and
	 * discard get `ctx`, once per stage, on replica 0's thread. */
	void *const *replica_ctx;
	/** Pieces (see "Replicas"): the stage's end-of-step work cut into this many pieces, shared out
	 * among its replicas; 0: none (check, grad_sq, update and discard, whole, on replica 0). With
	 * pieces, check_pieces, update_pieces and discard_pieces are required and replace check, grad_sq,
	 * update and discard (which may then be NULL and are not called); at most UINT32_MAX. */
	size_t pieces;
	/** check and grad_sq over pieces [begin, end): 0 (the update will apply) or a negative errno that
	 * fails the step, as check; sq[i] receives piece begin + i's squared norm (grad_sq: the pieces'
	 * added in order). Runs on each replica's thread over its own range, at once with the others',
	 * after the stage's last weight gradient, with `ctx` (unreplicated stages of pieces: on any of the
	 * trainer's threads, see "Replicas"). */
	int (*check_pieces)(void *ctx, size_t begin, size_t end, double *sq);
	/** update over pieces [begin, end), on each replica's thread at once (its own range, `ctx`; where
	 * check_pieces runs); a negative errno breaks the contract as update's does. What is not per
	 * element (an optimizer's step count) belongs in update_end. */
	int (*update_pieces)(void *ctx, const mbp_train_update *u, size_t begin, size_t end);
	/** discard over pieces [begin, end) (a failed step), as update_pieces runs. */
	void (*discard_pieces)(void *ctx, size_t begin, size_t end);
	/** Optional: once per successful step after every replica's update_pieces returned, on one of the
	 * trainer's threads (not necessarily the stage's), while no operation runs. */
	void (*update_end)(void *ctx, const mbp_train_update *u);
} mbp_train_stage_desc;

/**
 * The loss at the last stage: read io->out (the last stage's output) and io->targets, write io->dout (the
 * gradient that starts the backward) and store the micro-batch's loss in *loss. Runs on the last stage's
 * thread right after its forward. A non-finite loss fails the step (-EDOM).
 */
typedef int (*mbp_loss_fn)(void *arg, const mbp_train_io *io, double *loss);

typedef struct mbp_trainer mbp_trainer;

/** A zeroed struct with the required fields set is complete: every other field's 0 is its default. */
typedef struct mbp_train_opts {
	size_t in_row_bytes;	 /**< width of an input row of stage 0 (required, > 0) */
	size_t target_row_bytes; /**< width of a target row (required, > 0, at most UINT32_MAX) */
	uint32_t max_mb_rows;	 /**< largest micro-batch; sizes the buffers. 0: 64 */
	uint32_t max_mbs;	 /**< largest micro-batch count of a step. 0: 64 */
	mbp_sched_kind schedule; /**< 0: 1F1B; MBP_SCHED_CUSTOM or MBP_SCHED_AUTO: `custom` */
	/** MBP_SCHED_CUSTOM or MBP_SCHED_AUTO (and only then): the schedule to follow (read from text, or
	 * built from costs by mbp_schedule_build), copied by mbp_trainer_new. Its stage count must be the trainer's, its
	 * threads and placement are the trainer's, and every step must have its micro-batch count (a step of
	 * another count fails with -EINVAL). */
	const mbp_schedule *custom;
	uint32_t threads;      /**< worker threads, at most the stages (mbp_trainer_start refuses more);
				      0: min(stages, allowed CPUs under the cgroup quota) */
	mbp_pin_mode pinning;  /**< 0: MBP_PIN_PLAN, each thread pinned to a CPU as a pipeline's are
				      (pipeline.h, "Placement"); MBP_PIN_NONE: the OS places them */
	uint64_t spin_ns;      /**< spin budget of a waiting thread. 0: 20 us, as the pipeline's;
				      MBP_SPIN_NONE: none (and none when threads outnumber the CPUs) */
	uint32_t trace_events; /**< operations kept per stage for the Chrome trace; 0: tracing off */
	mbp_loss_fn loss;      /**< required */
	void *loss_arg;
} mbp_train_opts;

/**
 * Create a trainer with no stages. The options are copied. Pair with mbp_trainer_destroy().
 * @return 0, -EINVAL (NULL, zero widths, no loss, an unknown schedule or pinning, max_mbs above
 *         MBP_TRAIN_MAX_MBS), -ENOMEM.
 */
int mbp_trainer_new(mbp_trainer **tp, const mbp_train_opts *o);

/**
 * Append a stage (before start). The descriptor is copied.
 * @return 0, -EINVAL (NULL, no forward, update or discard (without pieces), no check_pieces,
 *         update_pieces or discard_pieces (with), no backward of either form, out_row_bytes 0,
 *         a width above UINT32_MAX, work_row_bytes without recompute, more than MBP_TRAIN_MAX_REPLICAS
 *         replicas, already started), -E2BIG (more than MBP_MAX_STAGES stages, or replicas: threads),
 *         -ENOMEM.
 */
int mbp_trainer_add_stage(mbp_trainer *t, const mbp_train_stage_desc *d);

/**
 * Start the threads and run each stage's init on its thread. How many threads and where they run: as a
 * pipeline's placement plan gives them (pipeline.h, "Threads and stages" and "Placement"), so a trainer
 * and a pipeline of one process take different CPUs while there are enough; mbp_trainer_stats_get() says
 * where each stage runs, whether its pin failed and whether it shares its CPU. As a pipeline's, stages of
 * one thread run their init in stage order (every init runs, also after one failed; then no step runs and
 * the fini of each stage whose init succeeded runs on its thread) and their fini in reverse order; each
 * thread is named mbp-train-<first>[-<last>] for its stages.
 * Under a chunked schedule (interleaved, looped BFS, ZB-V, DualPipeV) the stages are its chunks, placed
 * by its rule on `threads` threads (0: two chunks a thread), and a thread runs the chunks its placement
 * gives it, their init and fini in stage order as above.
 * @return 0, -EINVAL (no stages; more threads than stages, as mbp_schedule_simulate() refuses them; a
 *         thread count a chunked schedule cannot place; ZB-H1, ZB-H2,
 *         ZB-V or DualPipeV with a stage that gives no backward_in/backward_w, or a last stage whose
 *         grad_row_bytes is not
 *         its out_row_bytes: mbp_trainer_error() names the stage, or -1 for the thread count, and says
 *         what is wrong in `what`; with replicas under GPipe, 1F1B, ZB-H1 or ZB-H2, `threads`
 *         neither 0 nor the replicas' sum; under the other kinds `threads` is the schedule's own, its
 *         copies for the replicas on top), -ENOTSUP (replicas across ranks under a custom or
 *         built schedule, MBP_SCHED_CUSTOM or MBP_SCHED_AUTO: `what` says so),
 *         -EALREADY, -ENOMEM, -EAGAIN (no thread could be created), the error of the first stage
 *         whose init failed.
 * With replicas the trainer runs a thread per copy (see "Replicas"): mbp_train_stats.threads counts them.
 */
int mbp_trainer_start(mbp_trainer *t);

/**
 * Run one synchronous step on `rows` rows of `in` (rows x in_row_bytes) and `targets` (rows x
 * target_row_bytes), in micro-batches of `mb_rows`. Returns when every stage has applied its update, or
 * when the step failed (then no stage updated, every buffer is back in the pool and the next step runs
 * normally). The step number advances only on success.
 * @param loss if not NULL, receives the summed loss of the step
 * @return 0; -EINVAL (NULL, rows 0, mb_rows 0, under DualPipeV fewer micro-batches than stages); -E2BIG
 *         (mb_rows above max_mb_rows, or more micro-batches than max_mbs); -ENOTCONN (not started);
 *         -ESHUTDOWN (cancelled or drained); -ECANCELED (cancelled during the step); -EDOM (non-finite
 *         loss, or a stage's grad_sq not finite); -ENOBUFS (buffer bound); the error a stage's operation
 *         or check returned (then no stage updated); -ENOTRECOVERABLE (a stage's update refused after
 *         its check accepted, or this happened at an earlier step: the stages' parameters are no longer
 *         those of one step, and the trainer runs no more steps).
 *         mbp_trainer_error() says which stage, operation and micro-batch failed.
 */
int mbp_trainer_step(mbp_trainer *t, const void *in, const void *targets, size_t rows, uint32_t mb_rows,
		     double *loss);

/** Where the last failed step (or a refused mbp_trainer_start) failed. */
typedef struct mbp_train_error {
	int err;   /**< 0 when the last step succeeded */
	int stage; /**< -1 when no stage failed (cancel, an option of the trainer) */
	int mb;	   /**< -1 when not tied to a micro-batch */
	mbp_op_kind op;
	const char *what; /**< NULL (the stage's own error), or a static line saying what is wrong, such as
			       "threads: more than the stages (each thread runs one stage or more)" */
} mbp_train_error;

/** The error of the last step (or of a refused start), or zeros. @return 0 or -EINVAL. */
int mbp_trainer_error(const mbp_trainer *t, mbp_train_error *e);

/**
 * Cancel: a step under way fails with -ECANCELED at its threads' next operation (no stage updates), and
 * every later step fails with -ESHUTDOWN. Any thread. Idempotent.
 */
void mbp_trainer_cancel(mbp_trainer *t);

/**
 * Drain: a step under way finishes normally; every later step fails with -ESHUTDOWN. Any thread.
 */
void mbp_trainer_drain(mbp_trainer *t);

/** Stop the threads (each stage's fini runs) and free everything. Accepts NULL. The controlling thread,
 * between steps. */
void mbp_trainer_destroy(mbp_trainer *t);

/** Per-stage figures of the last step (or since start for the totals); a replicated stage's are the sums
 * over its replicas (the peaks too: a bound of what it held at once), where it runs its replica 0's. */
typedef struct mbp_train_stage_stats {
	char name[MBP_STAGE_NAME_MAX];
	unsigned thread;
	int cpu;	  /**< the CPU it was pinned to, -1 when not pinned (or its pin failed) */
	int pin_error;	  /**< 0, or the error pinning its thread returned (it then runs unpinned) */
	unsigned sharing; /**< other threads pinned to its CPU now, as mbp_placement.sharing counts them
			       (pipeline.h, "Placement": a trainer takes its CPUs as a pipeline does) */
	uint64_t f_ns, b_ns, bin_ns, w_ns; /**< last step: time inside each kind of operation */
	uint64_t wait_ns;		   /**< last step: time waiting for an input or a gradient */
	uint32_t f_count, b_count, bin_count, w_count; /**< last step: operations run */
	uint32_t stash_peak; /**< last step: high-water mark of the stash (see mbp_schedule_stash_peak) */
	uint32_t held_peak;  /**< last step: high-water mark of micro-batches held (mbp_schedule_held_peak) */
	uint64_t total_busy_ns; /**< every step since start */
	uint64_t r_ns;		/**< last step: time inside recomputations (not in b_ns or bin_ns) */
	uint32_t r_count;	/**< last step: recomputations run */
	/** Activation bytes of one micro-batch of the last step's size: stashed (stash_row_bytes x rows,
	 * held from F to its last backward) and recomputed (work_row_bytes x rows, held from its
	 * recomputation to its last backward). */
	uint64_t act_stash_bytes, act_work_bytes;
	uint64_t
	    act_peak_bytes; /**< last step: most activation bytes (stashes and work buffers) held at once */
	/** Last step: outputs and input gradients handed to another thread (a ring's push, a remote
	 * part's link included), and those passed to a stage of its own thread (train.h, "Chunks"). */
	uint32_t hops, local_hops;
} mbp_train_stage_stats;

typedef struct mbp_train_stats {
	uint64_t steps, steps_failed;
	uint32_t stages, threads, mbs; /**< mbs: of the last step */
	uint64_t step_ns;	       /**< last step: wall time from its start to its flush */
	double bubble;		       /**< last step: 1 - busy / (threads x step_ns) */
	double bubble_predicted;       /**< last step: mbp_schedule_simulate's bubble with the measured
					    mean cost of each stage's operations */
	double loss;		       /**< last successful step */
	mbp_pool_stats pool;	       /**< the trainer's buffers (in_use is 0 between steps). The first
					    step of a micro-batch count grows the pool to the most that the
					    schedule can hold at once (plus the threads' caches): after it, no
					    step of a count seen before allocates (grows and allocated stay) */
	/** Last step: most activation bytes (every stage's stashes and work buffers, rows x width) held at
	 * once, and most activation buffers held at once. */
	uint64_t act_peak_bytes, act_peak_bufs;
	/** The activation pool (stashes and work buffers; no caches, so its high_water is exact: the most
	 * buffers held at once since start, act_peak_bufs' highest). Zeros when no stage has either. */
	mbp_pool_stats act_pool;
	uint64_t act_buf_bytes; /**< bytes of one activation buffer (the widest row x max_mb_rows) */
} mbp_train_stats;

/**
 * Snapshot. `ss` may be NULL, else receives up to n stages. Stage figures of the last step are complete
 * once mbp_trainer_step() has returned. @return the stage count, or -EINVAL.
 */
int mbp_trainer_stats_get(mbp_trainer *t, mbp_train_stats *st, mbp_train_stage_stats *ss, unsigned n);

/**
 * A replicated stage's figures replica by replica (mbp_trainer_stats_get gives their sums): up to n
 * replicas of `stage` into ss (NULL when n is 0). @return the stage's replica count, or -EINVAL.
 */
int mbp_trainer_replica_stats_get(mbp_trainer *t, unsigned stage, mbp_train_stage_stats *ss, unsigned n);

/** The schedule the last step followed (NULL before the first step); valid until the next step. */
const mbp_schedule *mbp_trainer_schedule(const mbp_trainer *t);

/**
 * Write the operations of the last step (F, B, B_in, W and R (recomputation) as distinct events, one row per stage) as a
 * Chrome trace JSON file, by rename as every file mbpipe writes (<mbpipe/file.h>).
 * @return 0, -EINVAL (tracing off), -EEXIST (path is not a regular file), -errno from the file system.
 */
int mbp_trainer_trace_write(mbp_trainer *t, const char *path);

/** One operation of a step, as recorded when tracing is on (mbp_train_opts.trace_events). */
typedef struct mbp_train_event {
	uint64_t t0_ns; /**< start, after any wait for its input, in ns from the step's start */
	uint64_t t1_ns; /**< end, in ns from the step's start */
	uint32_t mb;	/**< micro-batch */
	uint16_t stage; /**< its index in the whole pipeline (across ranks: the global one) */
	uint8_t
	    kind; /**< mbp_op_kind: the kind in the stage's list (mbp_schedule_stage_ops), or MBP_OP_R: the
		           recomputation of the B or B_in that follows it */
	uint8_t reserved;
} mbp_train_event;

/**
 * The operations of the last step, for drawing it: stage by stage, each stage's in the order they ran
 * (the order of mbp_schedule_stage_ops, each recomputation just before its B or B_in), at most
 * trace_events per stage. Of a failed step, the operations
 * that ran. The controlling thread, between steps.
 * @param ev receives up to n events; may be NULL when n is 0 (to ask for the count)
 * @return the number of events recorded (more than n when ev was too small: only n were written),
 *         -EINVAL (NULL t, NULL ev with n > 0, tracing off).
 */
int mbp_trainer_events_get(const mbp_trainer *t, mbp_train_event *ev, size_t n);

#ifdef __cplusplus
}
#endif
#endif

/*
 * mbp_mb: one micro-batch, the unit that travels through the pipeline.
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * A micro-batch is a header in front of a pool buffer: `rows` rows of `row_bytes` bytes at `data`. Rings
 * carry pointers to these headers; payloads never move between stages except by a stage's own compute.
 */
#ifndef MBPIPE_MB_H
#define MBPIPE_MB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mbp_job;

typedef struct mbp_mb {
	void *data;	    /**< payload, aligned to the pool's alignment (at least 64 bytes) */
	size_t capacity;    /**< payload bytes available at data */
	uint32_t rows;	    /**< rows in this micro-batch (the last one of a job may be short) */
	uint32_t row_bytes; /**< bytes per row */
	int32_t status;	    /**< 0, or the negative error that failed this micro-batch */
	uint32_t stage;	    /**< index of the stage that produced it, or UINT32_MAX for a caller's input */
	uint64_t seq;	    /**< micro-batch index within its job; the caller's value for submitted buffers */
	struct mbp_job *job; /**< owning job, NULL for micro-batches submitted one by one */
	void *user;	     /**< the caller's tag, carried unchanged from input to result */
	void *
	    carry; /**< set by a stage (or, for stage 0, by the submitter: see mbp_mb_submit), carried to later
			stages (e.g. a weights version) */
	void *carry_plan; /**< a second word that stages set and carry, never the engine (the model's stages
			       with rebalancing: the window a micro-batch was admitted in, with its plan) */
} mbp_mb;

#ifdef __cplusplus
}
#endif
#endif

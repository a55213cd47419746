/*
 * Internal view of a pool buffer's header, shared by pool.c and the pipeline. Not installed.
 */
#ifndef MBP__POOL_INTERNAL_H
#define MBP__POOL_INTERNAL_H

#include <mbpipe/mb.h>

#include "common.h"

struct mbp__buf {
	uint32_t magic;
	uint32_t state;
	struct mbp_pool *pool;
	void *link[2]; /* scratch for the current owner: the pipeline's ingress link */
	uint32_t kind; /* the current owner's tag for what is in link */
	mbp_mb mb;
};

static inline struct mbp__buf *mbp__buf_of(mbp_mb *mb)
{
	return mbp__container_of(mb, struct mbp__buf, mb);
}

#endif

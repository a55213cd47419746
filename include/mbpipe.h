/*
 * mbpipe: a pipeline-parallel engine.
 *
 * A batch of work is split into micro-batches; each stage of the computation runs on its own worker
 * thread, pinned to its own core, and hands each finished micro-batch to the next stage through a
 * lock-free single-producer/single-consumer ring, so all stages compute at once.
 *
 * Conventions, stated once:
 *  - Errors: functions that can fail return 0 (or a count) on success and a negative errno value on
 *    failure (MBP_EINVAL == -EINVAL, ...). mbp_strerror() turns any of them into text. Fast-path calls
 *    return a count or a bool; functions that cannot fail return void.
 *  - Objects: opaque handles made by mbp_<object>_new(&handle, ...) and freed by the matching
 *    mbp_<object>_destroy(), which accepts NULL.
 *  - Thread safety: nothing is thread-safe unless its header says so; the multi-party objects (pipeline
 *    submission, pool depot) carry a table of what may run concurrently.
 *  - Time: timeouts are int64_t nanoseconds; 0 means "do not wait", negative means "wait without limit".
 *  - Options: every options struct (mbp_opts, mbp_train_opts, mbp_pool_opts, ...) is complete when zeroed
 *    apart from the fields its header marks required: a field's 0 is its documented default, and "none"
 *    where 0 is not none has its own name (MBP_SPIN_NONE).
 */
#ifndef MBPIPE_H
#define MBPIPE_H

#include <mbpipe/version.h>
#include <mbpipe/error.h>
#include <mbpipe/file.h>
#include <mbpipe/mb.h>
#include <mbpipe/pool.h>
#include <mbpipe/pipeline.h>
#include <mbpipe/train.h>
#include <mbpipe/model.h>
#include <mbpipe/model_train.h>
#include <mbpipe/data.h>

#endif

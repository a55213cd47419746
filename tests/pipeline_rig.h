/*
 * What the pipeline's suites share (test_pipeline.c, test_affinity.c, test_trace.c): rows of WORDS 32-bit
 * words, a stage that copies its input, a started pipeline of such stages, and a pipeline's Chrome trace
 * read back. Include after check_main.h.
 */
#ifndef MBP_PIPELINE_RIG_H
#define MBP_PIPELINE_RIG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbpipe.h>

#define WORDS 4 /* words per input row */

static inline int copy_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	memcpy(out->data, in->data, (size_t)in->rows * in->row_bytes);
	return 0;
}

/* How many CPUs the placement may use: mbp_cpus_allowed's count capped by a cgroup quota. The allowed CPUs
 * into allowed[] (MBP_MAX_CPUS entries) and their count into *n, each where not NULL. */
static inline unsigned usable_cpus(int *allowed, int *n)
{
	unsigned quota = 0;
	int k = mbp_cpus_allowed(allowed, allowed ? MBP_MAX_CPUS : 0, &quota);
	ck_assert_int_ge(k, 1);
	if (n)
		*n = k;
	return quota && quota < (unsigned)k ? quota : (unsigned)k;
}

/* A started pipeline of S copying stages on `threads` threads (0: the default), pinned by the plan. */
static inline mbp_pipeline *started(unsigned S, unsigned threads)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.threads = threads;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	mbp_stage_desc d = {.fn = copy_fn};
	for (unsigned k = 0; k < S; k++)
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	return p;
}

/* The pipeline's Chrome trace, written to a temporary file and read back (malloc'd, NUL-terminated). */
static inline char *trace_text(mbp_pipeline *p)
{
	char path[] = "/tmp/mbp-trace-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(mbp_pipeline_trace_write(p, path), 0);
	FILE *f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	char *buf = calloc(1, 1 << 20);
	size_t len = fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	unlink(path);
	ck_assert_uint_gt(len, 0);
	return buf;
}

#endif

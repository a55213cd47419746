/*
 * OpenBLAS's generic-kernel warning in the words of every tool. Debian's OpenBLAS falls back to a generic
 * kernel on CPUs it does not recognise, and matrix products then run about 3 times slower
 * (mbp_blas_warning() says when, and what to export). Each tool gives the same line where its other run-time
 * lines go: pipebench in its report (the mlp workload), pipeserve in its start-up log, pipetrain on standard
 * error before it trains. Header-only; shared by the three tools.
 */
#ifndef MBP_UTIL_BLAS_H
#define MBP_UTIL_BLAS_H

#include <stdbool.h>
#include <stdio.h>

#include <mbpipe.h>

/* "warning: OpenBLAS picked the generic ... kernel ..." into buf; false (buf untouched) when OpenBLAS runs a
 * kernel fit for this CPU. */
static inline bool blas_warning_line(char *buf, size_t n)
{
	const char *w = mbp_blas_warning();
	if (!w)
		return false;
	snprintf(buf, n, "warning: %s", w);
	return true;
}

#endif

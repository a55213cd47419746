/*
 * OpenBLAS's generic-kernel warning, the dense kernel and MBP_KERNEL's warning in the words of every tool.
 * Debian's OpenBLAS falls back to a generic kernel on CPUs it does not recognise, and matrix products then
 * run about 3 times slower (mbp_blas_warning() says when, and what to export). Each tool gives the same
 * line where its other run-time lines go: pipebench in its report (the mlp workload), pipeserve in its
 * start-up log, pipetrain on standard error before it trains. Header-only; shared by the three tools.
 */
#ifndef MBP_UTIL_BLAS_H
#define MBP_UTIL_BLAS_H

#include <stdbool.h>
#include <stdio.h>

#include <mbpipe.h>

static inline bool warning_line(const char *w, char *buf, size_t n)
{
	if (!w)
		return false;
	snprintf(buf, n, "warning: %s", w);
	return true;
}

/* "warning: OpenBLAS picked the generic ... kernel ..." into buf; false (buf untouched) when OpenBLAS runs a
 * kernel fit for this CPU. */
static inline bool blas_warning_line(char *buf, size_t n)
{
	return warning_line(mbp_blas_warning(), buf, n);
}

/* "warning: MBP_KERNEL='...' is not a dense kernel ..." into buf; false (buf untouched) when MBP_KERNEL is
 * unset or was used as written. Printed beside blas_warning_line's. */
static inline bool kernel_warning_line(char *buf, size_t n)
{
	return warning_line(mbp_kernel_warning(), buf, n);
}

/* The dense layers' kernel the tool's models are made with ("packed" or "blas"): JSON's "dense_kernel". The
 * tools never call mbp_kernel_set, so it is the kernel of every model they load or train. */
static inline const char *dense_kernel_name(void)
{
	return mbp_kernel_name(mbp_kernel_get());
}

/* The text line beside the OpenBLAS one: "dense kernel: packed (MBP_KERNEL: blas or packed)". */
static inline void dense_kernel_line(const char *name, char *buf, size_t n)
{
	snprintf(buf, n, "dense kernel: %s (MBP_KERNEL: blas or packed)", name);
}

#endif

/*
 * The tools' option errors: the one-line error they write into the caller's buffer (fail; the tools
 * print it with their name), and an option's number parsed and its error worded at once. The numbers are
 * util/number.h's strict parsers, the same as the library's options string. Header-only, libc only;
 * shared by every tool.
 */
#ifndef MBP_UTIL_PARSE_H
#define MBP_UTIL_PARSE_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "number.h"

static inline int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The line into err (truncated to errlen). @return -1, for `return fail(...)`. */
static inline int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

/*
 * An option's whole number in [lo, hi], or the one-line error "<name>: '<s>' is not <what> from <lo> to
 * <hi>" in err (what: "a whole number", "a stage count"...). @return 0, or -1 with err written.
 */
static inline int parse_u64_opt(const char *name, const char *s, const char *what, uint64_t lo, uint64_t hi,
				uint64_t *v, char *err, size_t errlen)
{
	if (parse_u64(s, lo, hi, v) == 0)
		return 0;
	return fail(err, errlen, "%s: '%s' is not %s from %llu to %llu", name, s, what,
		    (unsigned long long)lo, (unsigned long long)hi);
}

/* The same for a size ("64M", "1G": bytes, K/M/G/T binary; not 0) of at most max bytes. */
static inline int parse_size_opt(const char *name, const char *s, uint64_t max, uint64_t *v, char *err,
				 size_t errlen)
{
	if (parse_size(s, max, v) == 0)
		return 0;
	return fail(err, errlen, "%s: '%s' is not a size like 64M or 1G (bytes, K/M/G/T binary)", name, s);
}

/* The same for a finite number in [lo, hi] (the bounds written with %g). */
static inline int parse_double_opt(const char *name, const char *s, const char *what, double lo, double hi,
				   double *v, char *err, size_t errlen)
{
	if (parse_double(s, lo, hi, v) == 0)
		return 0;
	return fail(err, errlen, "%s: '%s' is not %s from %g to %g", name, s, what, lo, hi);
}

#endif

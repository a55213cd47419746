/*
 * Strict number parsing for the tools' options, and the one-line error they write into the caller's
 * buffer (the parser never prints), also both at once for an option's value. Header-only; shared by
 * pipebench, pipetrain and pipeserve.
 */
#ifndef MBP_TOOLS_PARSE_H
#define MBP_TOOLS_PARSE_H

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

/* A whole unsigned decimal in [lo, hi]: no sign, no spaces, no suffix. */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *v)
{
	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	char *end;
	unsigned long long x = strtoull(s, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return -1;
	*v = x;
	return 0;
}

/* A finite decimal number in [lo, hi]. */
static int parse_double(const char *s, double lo, double hi, double *v)
{
	if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
		return -1;
	errno = 0;
	char *end;
	double x = strtod(s, &end);
	if (errno || *end || !isfinite(x) || x < lo || x > hi)
		return -1;
	*v = x;
	return 0;
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

/* The same for a finite number in [lo, hi] (the bounds written with %g). */
static inline int parse_double_opt(const char *name, const char *s, const char *what, double lo, double hi,
				   double *v, char *err, size_t errlen)
{
	if (parse_double(s, lo, hi, v) == 0)
		return 0;
	return fail(err, errlen, "%s: '%s' is not %s from %g to %g", name, s, what, lo, hi);
}

#endif

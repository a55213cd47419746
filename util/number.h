/*
 * Strict number parsing, the one parser of the library's `key=value` options (lib/opts.c) and of the
 * tools' command lines (util/parse.h): a whole number is decimal digits only (no sign, no spaces, no
 * suffix, at least one digit), a real number is what strtod reads with nothing left over, finite, and
 * neither signed nor spaced. The parsers never print. Header-only, libc only.
 */
#ifndef MBP_UTIL_NUMBER_H
#define MBP_UTIL_NUMBER_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The whole number spelt by s[0, len) (no terminator needed), at most max. @return 0 with *v set,
 * -EINVAL (empty, or not digits only), -ERANGE (larger than max). */
static inline int parse_u64_span(const char *s, size_t len, uint64_t max, uint64_t *v)
{
	if (len == 0)
		return -EINVAL;
	uint64_t x = 0;
	bool over = false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		unsigned d = (unsigned)(s[i] - '0');
		if (x > (UINT64_MAX - d) / 10)
			over = true; /* keep reading: a later non-digit makes it not a number at all */
		else
			x = x * 10 + d;
	}
	if (over || x > max)
		return -ERANGE;
	*v = x;
	return 0;
}

/* A whole decimal in [lo, hi] (the string whole). 0 with *v set, or -1. */
static inline int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *v)
{
	uint64_t x;
	if (!s || parse_u64_span(s, strlen(s), hi, &x) || x < lo)
		return -1;
	*v = x;
	return 0;
}

/* A size in bytes: a whole number with an optional binary suffix K, M, G or T (either case, 1024 based),
 * which may be followed by "iB" or "B" ("64M", "1G", "512KiB"); at least 1, at most max. 0 with *v set,
 * or -1. */
static inline int parse_size(const char *s, uint64_t max, uint64_t *v)
{
	if (!s)
		return -1;
	size_t len = strspn(s, "0123456789");
	const char *u = s + len;
	unsigned shift = 0;
	if (*u) {
		const char *units = "KMGT", *at = strchr(units, *u & ~0x20);
		if (!at || !(*u & ~0x20))
			return -1;
		shift = 10 * (unsigned)(at - units + 1);
		u++;
		if (strcmp(u, "") && strcmp(u, "B") && strcmp(u, "iB"))
			return -1;
	}
	uint64_t x;
	if (parse_u64_span(s, len, UINT64_MAX >> shift, &x) || !x || (x << shift) > max)
		return -1;
	*v = x << shift;
	return 0;
}

/* A finite decimal number in [lo, hi]. 0 with *v set, or -1. */
static inline int parse_double(const char *s, double lo, double hi, double *v)
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

#endif

/*
 * For the tools' tests: whether a text says "1 rows" (a count of one with a plural noun), which messages
 * must not. Header-only.
 */
#ifndef MBP_TESTS_PLURAL_CHECK_H
#define MBP_TESTS_PLURAL_CHECK_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>

/* The first "1 <plural noun>" in `text` (as a pointer into it), or NULL when there is none. */
static inline const char *find_one_with_plural(const char *text)
{
	regex_t re;
	if (regcomp(
		&re,
		"(^|[^0-9.])1 (rows|stages|threads|layers|micro-batches|batches|CPUs|requests|BLAS threads)"
		"([^a-z_-]|$)",
		REG_EXTENDED | REG_NEWLINE))
		return text; /* cannot check: say so */
	regmatch_t m;
	bool found = regexec(&re, text, 1, &m, 0) == 0;
	regfree(&re);
	return found ? text + m.rm_so : NULL;
}

#endif

/*
 * Internal: the library's one string builder. printf-style appends either into a caller's buffer of fixed
 * size, which keeps counting past its end as snprintf does (so a describe call returns the length it
 * needs and the caller can retry with more room), or into a heap buffer that grows as needed (a file's
 * header). Not installed.
 *
 *   struct mbp__strbuf b = mbp__strbuf_fixed(buf, n);     or   struct mbp__strbuf b = MBP__STRBUF_GROW;
 *   mbp__strbuf_printf(&b, "%u %s", n, PLURAL(n, "row", "rows"));
 *   b.len: the whole text's length; b.oom: something was left out (growing: free(b.p) either way)
 */
#ifndef MBP__STRBUF_H
#define MBP__STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

struct mbp__strbuf {
	char *p;
	size_t len; /* the text's length, also past the end of a fixed buffer */
	size_t cap;
	bool grow; /* p is the builder's own, grown by realloc */
	bool oom;  /* a growth or a format failed: the text is incomplete */
};

/* A builder over buf[0, n): the text is always terminated within it (n 0: buf may be NULL, only count). */
static inline struct mbp__strbuf mbp__strbuf_fixed(char *buf, size_t n)
{
	if (n)
		buf[0] = '\0';
	return (struct mbp__strbuf){.p = buf, .cap = n};
}

/* A builder that grows its own buffer from nothing (free p when done). */
#define MBP__STRBUF_GROW ((struct mbp__strbuf){.grow = true})

void mbp__strbuf_printf(struct mbp__strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mbp__strbuf_vprintf(struct mbp__strbuf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

#endif

/*
 * The string builder of lib/strbuf.h: one append function for both kinds of buffer. A fixed buffer takes
 * what fits (vsnprintf truncates and terminates) and counts the rest; a growing one doubles (at least to
 * the text's new length) and formats again, so no text is ever cut.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "strbuf.h"

void mbp__strbuf_vprintf(struct mbp__strbuf *b, const char *fmt, va_list ap)
{
	for (;;) {
		bool room = b->p && b->len < b->cap;
		va_list aq;
		va_copy(aq, ap);
		int k = vsnprintf(room ? b->p + b->len : NULL, room ? b->cap - b->len : 0, fmt, aq);
		va_end(aq);
		if (k < 0) {
			b->oom = true;
			return;
		}
		if (!b->grow || b->len + (size_t)k < b->cap) {
			b->len += (size_t)k;
			return;
		}
		size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

void mbp__strbuf_printf(struct mbp__strbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	mbp__strbuf_vprintf(b, fmt, ap);
	va_end(ap);
}

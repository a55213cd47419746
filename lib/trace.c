/*
 * Activity log: per stage, the begin and end of each micro-batch it computed, in bounded memory (the first
 * trace_events per stage; later ones are counted as dropped, not kept), written as a Chrome trace JSON
 * file ("X" complete events, one track per stage) that Perfetto and chrome://tracing open.
 *
 * Every string the file holds goes through mbp__json_string(): a stage name is the caller's bytes, and one
 * quote, backslash, control character or byte that is not UTF-8 would make the whole file unreadable.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>

#include "pipeline_internal.h"

void mbp__trace_add(struct mbp__stage *s, uint64_t t0, uint64_t t1, const mbp_mb *mb)
{
	if (!s->trace)
		return;
	/* relaxed: only this thread writes trace_n */
	uint32_t n = atomic_load_explicit(&s->trace_n, memory_order_relaxed);
	if (n >= s->p->o.trace_events)
		return;
	s->trace[n] = (struct mbp__trace_ev){.t0 = t0,
					     .t1 = t1,
					     .job = mb->job ? mb->job->id : 0,
					     .seq = (uint32_t)mb->seq,
					     .status = mb->status};
	/* release; partner: the acquire load in mbp_pipeline_trace_write(): the event above is complete */
	atomic_store_explicit(&s->trace_n, n + 1, memory_order_release);
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF), or 0 when the bytes there are not one. */
static size_t utf8_len(const unsigned char *s)
{
	unsigned char c = s[0];
	if (c < 0x80)
		return 1;
	size_t n;
	uint32_t cp, min;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2, cp = c & 0x1f, min = 0x80;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, cp = c & 0x0f, min = 0x800;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, cp = c & 0x07, min = 0x10000;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80) /* also stops at the terminating NUL */
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* Write `s` as a JSON string: quote and backslash escaped, control characters as \u00XX, each byte that
 * does not start a well-formed UTF-8 sequence as U+FFFD. */
void mbp__json_string(FILE *f, const char *str)
{
	const unsigned char *s = (const unsigned char *)str;
	fputc('"', f);
	while (*s) {
		size_t n = utf8_len(s);
		if (n == 0) {
			fputs("\\ufffd", f);
			s++;
		} else if (*s == '"' || *s == '\\') {
			fputc('\\', f);
			fputc(*s++, f);
		} else if (*s < 0x20) {
			fprintf(f, "\\u%04x", *s++);
		} else {
			fwrite(s, 1, n, f);
			s += n;
		}
	}
	fputc('"', f);
}

int mbp_pipeline_trace_write(mbp_pipeline *p, const char *path)
{
	if (!p || !path || !p->o.trace_events)
		return -EINVAL;
	mbp_file *file; /* by rename, as every file mbpipe writes: a node at path is refused, not replaced */
	int rc = mbp_file_new(&file, path);
	if (rc)
		return rc;
	FILE *f = mbp_file_stream(file);
	uint64_t base = p->start_ns;
	fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
	fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"mbpipe\"}}");
	for (unsigned i = 0; i < p->nstages; i++) {
		struct mbp__stage *s = &p->stages[i];
		char label[MBP_STAGE_NAME_MAX + 32];
		snprintf(label, sizeof(label), "%u %s (cpu %d)", i, s->name, mbp__stage_cpu(s));
		fprintf(
		    f,
		    ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":", i);
		mbp__json_string(f, label);
		fputs("}}", f);
		/* acquire; partner: the release store in mbp__trace_add(): events below n are complete */
		uint32_t n = s->trace ? atomic_load_explicit(&s->trace_n, memory_order_acquire) : 0;
		for (uint32_t k = 0; k < n; k++) {
			const struct mbp__trace_ev *e = &s->trace[k];
			double ts = (double)(e->t0 - base) / 1e3, dur = (double)(e->t1 - e->t0) / 1e3;
			fprintf(f,
				",\n{\"name\":\"job %" PRIu64
				" mb %u\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,"
				"\"dur\":%.3f,\"args\":{\"job\":%" PRIu64
				",\"seq\":%u,\"stage\":%u,\"status\":%d}}",
				e->job, e->seq, i, ts, dur, e->job, e->seq, i, e->status);
		}
	}
	fprintf(f, "\n]}\n");
	return mbp_file_commit(file);
}

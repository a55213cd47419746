/*
 * Activity logs (trace.h) and the one writer of their Chrome trace JSON file, for the pipeline's stages and
 * the trainer's alike: "X" complete events, one track per stage, named by the event's operation kind.
 *
 * Every string the file holds goes through json_string(): a stage name is the caller's bytes, and one
 * quote, backslash, control character or byte that is not UTF-8 would make the whole file unreadable.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "trace.h"

int mbp__trace_init(struct mbp__trace *tr, uint32_t cap)
{
	tr->ev = NULL;
	tr->cap = cap;
	atomic_init(&tr->n, 0);
	if (cap && !(tr->ev = calloc(cap, sizeof(*tr->ev))))
		return -ENOMEM;
	return 0;
}

void mbp__trace_free(struct mbp__trace *tr)
{
	free(tr->ev);
	tr->ev = NULL;
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
static void json_string(FILE *f, const char *str)
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

/* One event, named by its kind. */
static void write_event(FILE *f, unsigned tid, const struct mbp__trace_ev *e, uint64_t base)
{
	static const char *const op[] = {"F", "B", "B_in", "W", "?", "R"}; /* mbp_op_kind */
	double ts = (double)(e->t0 - base) / 1e3, dur = (double)(e->t1 - e->t0) / 1e3;
	if (e->kind == MBP__TRACE_MB) {
		fprintf(f,
			",\n{\"name\":\"job %" PRIu64 " mb %" PRIu32 "\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,"
			"\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"job\":%" PRIu64 ",\"seq\":%" PRIu32
			",\"stage\":%u,\"status\":%d}}",
			e->job, e->mb, tid, ts, dur, e->job, e->mb, tid, e->status);
		return;
	}
	const char *k = e->kind < MBP_ARRAY_SIZE(op) ? op[e->kind] : "?";
	fprintf(f,
		",\n{\"name\":\"%s%" PRIu32 "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,"
		"\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"mb\":%" PRIu32 ",\"stage\":%u}}",
		k, e->mb, k, tid, ts, dur, e->mb, tid);
}

int mbp__trace_write(const char *path, const struct mbp__trace_track *tracks, unsigned n, uint64_t base_ns)
{
	mbp_file *file; /* by rename, as every file mbpipe writes: a node at path is refused, not replaced */
	int rc = mbp_file_new(&file, path);
	if (rc)
		return rc;
	FILE *f = mbp_file_stream(file);
	fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
	fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"mbpipe\"}}");
	for (unsigned i = 0; i < n; i++) {
		char label[MBP_STAGE_NAME_MAX + 32];
		snprintf(label, sizeof(label), "%u %s (cpu %d)", i, tracks[i].name, tracks[i].cpu);
		fprintf(
		    f,
		    ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":", i);
		json_string(f, label);
		fputs("}}", f);
		uint32_t k = mbp__trace_count(tracks[i].tr);
		for (uint32_t j = 0; j < k; j++)
			write_event(f, i, &tracks[i].tr->ev[j], base_ns);
	}
	fprintf(f, "\n]}\n");
	return mbp_file_commit(file);
}

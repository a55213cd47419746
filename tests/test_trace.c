/*
 * The activity log and its one writer (lib/trace.c), for the pipeline's stages and the trainer's alike:
 * valid JSON whatever the stage names, each event named by its operation kind, a log that keeps its first
 * events only.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <mbpipe.h>

#include "pipeline_internal.h"
#include "trace.h"

#include "check_main.h"
#include "pipeline_rig.h"

/* Stage names are the caller's bytes: the trace escapes quotes, backslashes and control characters and
 * replaces bytes that are not UTF-8, so that a JSON parser reads the file and gets each name back; a
 * stage whose pin failed shows cpu -1, as in the statistics. */
START_TEST(trace_is_valid_json_whatever_the_stage_names)
{
	static const char *const names[] = {"q\"uo\\te\"", "ctl\n\t\x01\x1f\x7f", "bad\xff\xc3(\xed\xa0\x80",
					    "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"};
	/* what a parser must read back: U+FFFD for every byte that starts no well-formed sequence */
	static const char *const back[] = {"q\"uo\\te\"", "ctl\n\t\x01\x1f\x7f",
					   "bad\xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd",
					   "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"};
	enum { NS = 4 };
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.trace_events = 16;
	o.threads = NS;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	for (unsigned k = 0; k < NS; k++) {
		mbp_stage_desc d = {.name = names[k], .fn = copy_fn};
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	}
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	uint32_t in[4 * WORDS] = {0}, out[4 * WORDS];
	ck_assert_int_eq(mbp_run(p, in, out, 4, 2), 0);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	/* A failed pin cannot be provoked on an allowed CPU: record one as its thread would (crew.c). */
	p->crew.th[p->crew.thread_of[1]].pin_error = -EINVAL;
	mbp_placement pl[NS];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, NS), NS);

	char *buf = trace_text(p);
	cJSON *root = cJSON_Parse(buf);
	ck_assert_msg(root != NULL, "trace is not JSON near: %.40s", cJSON_GetErrorPtr());
	cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
	ck_assert(cJSON_IsArray(evs));
	unsigned seen = 0, spans = 0;
	cJSON *e;
	cJSON_ArrayForEach(e, evs)
	{
		const char *nm = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
		ck_assert_ptr_nonnull(nm);
		if (strcmp(nm, "thread_name") == 0) {
			int tid = cJSON_GetObjectItemCaseSensitive(e, "tid")->valueint;
			ck_assert(tid >= 0 && tid < NS);
			const char *label = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
			    cJSON_GetObjectItemCaseSensitive(e, "args"), "name"));
			char want[128];
			snprintf(want, sizeof(want), "%d %s (cpu %d)", tid, back[tid],
				 tid == 1 ? -1 : pl[tid].cpu);
			ck_assert_str_eq(label, want);
			seen++;
		} else if (strncmp(nm, "job ", 4) == 0) {
			spans++;
		}
	}
	ck_assert_uint_eq(seen, NS);
	ck_assert_uint_eq(spans, 2 * NS);
	ck_assert_int_eq(pl[1].cpu, -1);
	cJSON_Delete(root);
	free(buf);
	mbp_pipeline_destroy(p);
}
END_TEST

/* The one writer serves both engines: a pipeline's event is "job <job> mb <seq>" with its job, seq, stage and
 * status as args, a training operation "<kind><mb>" (F2, B_in2, W2) with its kind as category; each row is
 * labelled with its stage, name and CPU; times are microseconds from the base; a log keeps its first `cap`
 * events only, and a cleared one starts again. */
START_TEST(one_writer_names_each_event_by_its_operation_kind)
{
	struct mbp__trace a, b;
	ck_assert_int_eq(mbp__trace_init(&a, 1), 0);
	ck_assert_int_eq(mbp__trace_init(&b, 3), 0);
	const uint64_t base = 1000000;
	mbp__trace_add(&a, &(struct mbp__trace_ev){.t0 = base + 2000,
						   .t1 = base + 5000,
						   .job = 7,
						   .mb = 3,
						   .status = -5,
						   .kind = MBP__TRACE_MB});
	mbp__trace_add(&a, &(struct mbp__trace_ev){.t0 = base, .t1 = base, .kind = MBP__TRACE_MB}); /* full */
	ck_assert_uint_eq(mbp__trace_count(&a), 1);
	mbp__trace_add(&b, &(struct mbp__trace_ev){.t0 = base, .t1 = base + 1000, .mb = 9, .kind = MBP_OP_F});
	mbp__trace_clear(&b);
	ck_assert_uint_eq(mbp__trace_count(&b), 0);
	static const uint8_t kinds[] = {MBP_OP_F, MBP_OP_BIN, MBP_OP_W};
	for (unsigned k = 0; k < 3; k++)
		mbp__trace_add(
		    &b, &(struct mbp__trace_ev){
			    .t0 = base + 1000 * k, .t1 = base + 1000 * k + 500, .mb = 2, .kind = kinds[k]});
	struct mbp__trace off;
	ck_assert_int_eq(mbp__trace_init(&off, 0), 0); /* tracing off: nothing kept, nothing allocated */
	mbp__trace_add(&off, &(struct mbp__trace_ev){.kind = MBP_OP_F});
	ck_assert_uint_eq(mbp__trace_count(&off), 0);
	const struct mbp__trace_track tk[] = {{"fwd", 3, &a}, {"train", -1, &b}, {"none", 0, &off}};
	char path[] = "/tmp/mbp-trace-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(mbp__trace_write(path, tk, 3, base), 0);
	FILE *f = fopen(path, "r");
	static char buf[8192];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	unlink(path);
	cJSON *root = cJSON_Parse(buf);
	ck_assert_msg(root != NULL, "not JSON: %s", buf);
	static const char *const want[] = {"job 7 mb 3", "F2", "B_in2", "W2"};
	static const char *const cats[] = {"F", "B_in", "W"};
	static const char *const labels[] = {"0 fwd (cpu 3)", "1 train (cpu -1)", "2 none (cpu 0)"};
	unsigned x = 0, rows = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "traceEvents"))
	{
		const char *nm = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
		const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
		if (strcmp(nm, "thread_name") == 0) {
			ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "name")),
					 labels[rows++]);
			continue;
		}
		if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "ph")), "X") != 0)
			continue;
		ck_assert_uint_lt(x, 4);
		ck_assert_str_eq(nm, want[x]);
		double ts = cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble;
		double dur = cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble;
		if (x == 0) {
			ck_assert(ts == 2.0 && dur == 3.0);
			ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(args, "job")->valueint, 7);
			ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(args, "seq")->valueint, 3);
			ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(args, "status")->valueint, -5);
			ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(e, "cat"));
		} else {
			ck_assert(ts == x - 1.0 && dur == 0.5);
			ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "cat")),
					 cats[x - 1]);
			ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(args, "mb")->valueint, 2);
			ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(args, "stage")->valueint, 1);
		}
		x++;
	}
	ck_assert_uint_eq(x, 4);
	ck_assert_uint_eq(rows, 3);
	cJSON_Delete(root);
	mbp__trace_free(&a);
	mbp__trace_free(&b);
	mbp__trace_free(&off);
}
END_TEST
static Suite *suite(void)
{
	Suite *s = suite_create("trace");
	TCase *tc = tcase_create("trace");
	tcase_add_test(tc, trace_is_valid_json_whatever_the_stage_names);
	tcase_add_test(tc, one_writer_names_each_event_by_its_operation_kind);
	suite_add_tcase(s, tc);
	return s;
}

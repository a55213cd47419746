/*
 * Options (lib/opts.c): the key=value string sets the fields and refuses bad keys and values where they
 * are given, by the same rules as mbp_opts_check() applies in code, each rule printable by its key.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <mbpipe.h>

#include "check_main.h"

START_TEST(opts_string_sets_fields_and_rejects_bad_keys)
{
	mbp_opts o;
	mbp_opts_init(&o);
	ck_assert_int_eq(
	    mbp_opts_parse(&o, "ring=64,ingress=8,spin_us=5,yield_us=50,cpus=0-1,pin=0,trace=100,threads=3",
			   NULL),
	    0);
	ck_assert_uint_eq(o.threads, 3);
	ck_assert_uint_eq(o.ring_capacity, 64);
	ck_assert_uint_eq(o.ingress_depth, 8);
	ck_assert_uint_eq(o.spin_ns, 5000);
	ck_assert_uint_eq(o.yield_ns, 50000);
	ck_assert_uint_eq(o.ncpus, 2);
	ck_assert_int_eq(o.cpus[1], 1);
	ck_assert_int_eq(o.pinning, MBP_PIN_NONE);
	ck_assert_uint_eq(o.trace_events, 100);
	ck_assert_int_eq(mbp_opts_parse(&o, "cpus=3+1+2", NULL), 0);
	ck_assert_uint_eq(o.ncpus, 3);
	ck_assert_int_eq(o.cpus[0], 3);
	size_t pos = 99;
	ck_assert_int_eq(mbp_opts_parse(&o, "ring=4,bogus=1", &pos), -EINVAL);
	ck_assert_uint_eq(pos, 7);
	ck_assert_int_eq(mbp_opts_parse(&o, "ring=-4", &pos), -EINVAL);
	ck_assert_int_eq(mbp_opts_parse(&o, "ring=99999999999", &pos), -ERANGE);
	ck_assert_int_eq(mbp_opts_parse(&o, "cpus=3-1", &pos), -EINVAL);
	ck_assert_int_eq(mbp_opts_parse(&o, "pin=2", &pos), -EINVAL);
	ck_assert_int_eq(mbp_opts_parse(&o, "ring", &pos), -EINVAL);
	ck_assert_int_eq(mbp_opts_parse(&o, NULL, NULL), 0);
	ck_assert_int_eq(mbp_opts_parse(&o, "", NULL), 0);
}
END_TEST

/* Every option is checked where it is given, by the same rule as the pipeline applies, and the rule can be
 * printed: ring=3 fails in mbp_opts_parse (not later at mbp_pipeline_new), naming the key and the rule. */
START_TEST(opts_are_checked_where_given_with_a_rule_that_names_the_key)
{
	static const char *const bad[] = {"ring=3",	 "ring=1",	 "ring=2147483648", "max_mb_rows=0",
					  "ingress=0",	 "mb_buffers=0", "pool_mb=0",	    "cache=0",
					  "row_bytes=0", "pin=2",	 "cpus=0+2000",	    "bogus=1"};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		mbp_opts o;
		mbp_opts_init(&o);
		char conf[64];
		snprintf(conf, sizeof(conf), "spin_us=1,%s,yield_us=2", bad[i]);
		size_t pos = 99;
		int rc = mbp_opts_parse(&o, conf, &pos);
		ck_assert_msg(rc == -EINVAL || rc == -ERANGE, "%s: %d", bad[i], rc);
		ck_assert_uint_eq(pos, 10);
		const char *rule = mbp_opts_rule(conf + pos);
		size_t klen = strcspn(bad[i], "=");
		ck_assert_msg(strcmp(bad[i], "bogus=1") == 0
				  ? strstr(rule, "unknown key") != NULL
				  : strncmp(rule, bad[i], klen) == 0 && rule[klen] == ':',
			      "%s: %s", bad[i], rule);
	}
	ck_assert_ptr_nonnull(strstr(mbp_opts_rule("ring=3"), "power of two"));
	ck_assert_ptr_nonnull(strstr(mbp_opts_rule("cpus"), "1024"));

	/* set in code: the same rules, the first broken one named */
	mbp_opts o;
	mbp_opts_init(&o);
	const char *why = "";
	ck_assert_int_eq(mbp_opts_check(&o, &why), -EINVAL); /* row width is required */
	ck_assert_str_eq(why, mbp_opts_rule("row_bytes"));
	o.in_row_bytes = 16;
	ck_assert_int_eq(mbp_opts_check(&o, &why), 0);
	ck_assert_ptr_null(why);
	o.ring_capacity = 24;
	ck_assert_int_eq(mbp_opts_check(&o, &why), -EINVAL);
	ck_assert_str_eq(why, mbp_opts_rule("ring"));
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), -EINVAL);
	ck_assert_int_eq(mbp_opts_check(NULL, NULL), -EINVAL);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("opts");
	TCase *tc = tcase_create("opts");
	tcase_add_test(tc, opts_string_sets_fields_and_rejects_bad_keys);
	tcase_add_test(tc, opts_are_checked_where_given_with_a_rule_that_names_the_key);
	suite_add_tcase(s, tc);
	return s;
}

/*
 * Tests of util/, the helpers shared by the library, the tools and the benchmarks:
 * - the strict number parser (util/number.h) takes digits only and every value up to UINT64_MAX, and
 *   tells a number too large (-ERANGE) from something that is no number (-EINVAL) whatever its length;
 * - the library's options string reads numbers with it, as the tools' command lines do: the same strings
 *   are numbers, or are not, for both;
 * - an option's error line (util/parse.h) names the option, the value and the range;
 * - PLURAL, and the tools' clock (util/clock.h) on CLOCK_MONOTONIC's scale.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <mbpipe.h>

/* before <check.h>, whose deprecated fail() macro would otherwise rename util/parse.h's fail */
#include "util/clock.h"
#include "util/number.h"
#include "util/parse.h"
#include "util/plural.h"

#include <check.h>

START_TEST(whole_numbers_are_digits_only_up_to_uint64_max)
{
	uint64_t v = 7;
	ck_assert_int_eq(parse_u64_span("18446744073709551615", 20, UINT64_MAX, &v), 0);
	ck_assert_uint_eq(v, UINT64_MAX);
	ck_assert_int_eq(parse_u64_span("18446744073709551616", 20, UINT64_MAX, &v), -ERANGE);
	ck_assert_int_eq(parse_u64_span("99999999999999999999999", 23, UINT64_MAX, &v), -ERANGE);
	ck_assert_int_eq(parse_u64_span("000000000000000000000042", 24, UINT64_MAX, &v), 0);
	ck_assert_uint_eq(v, 42);
	ck_assert_int_eq(parse_u64_span("17", 2, 16, &v), -ERANGE);
	ck_assert_int_eq(parse_u64_span("16", 2, 16, &v), 0);
	ck_assert_uint_eq(v, 16);
	v = 7;
	static const char *const bad[] = {"",	  "+5",	 " 5", "5 ",  "-1",
					  "0x10", "1e3", "5k", "1.0", "99999999999999999999999x"};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(parse_u64_span(bad[i], strlen(bad[i]), UINT64_MAX, &v) == -EINVAL, "'%s'",
			      bad[i]);
		ck_assert_msg(parse_u64(bad[i], 0, UINT64_MAX, &v) == -1, "'%s'", bad[i]);
	}
	ck_assert_uint_eq(v, 7);					     /* never written on failure */
	ck_assert_int_eq(parse_u64_span("12,ring=4", 2, UINT64_MAX, &v), 0); /* a span needs no terminator */
	ck_assert_uint_eq(v, 12);
	ck_assert_int_eq(parse_u64("3", 4, 9, &v), -1);
	ck_assert_int_eq(parse_u64("9", 4, 9, &v), 0);
	ck_assert_int_eq(parse_u64(NULL, 0, 9, &v), -1);
}
END_TEST

START_TEST(real_numbers_are_finite_unsigned_and_whole)
{
	double d = 7;
	ck_assert_int_eq(parse_double("2.5", 0, 10, &d), 0);
	ck_assert_double_eq(d, 2.5);
	ck_assert_int_eq(parse_double("1e-3", 0, 10, &d), 0);
	static const char *const bad[] = {"", "+1", "-1", " 1", "1 ", "nan", "inf", "1e999", "11", "2x"};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(parse_double(bad[i], 0, 10, &d) == -1, "'%s'", bad[i]);
}
END_TEST

/* One parser: what the tools refuse as no number, the library's options string refuses (-EINVAL); a number
 * too large for its field is -ERANGE there, whatever its length (21 digits and more were -EINVAL before,
 * and a value padded with zeros past 20 characters was refused). */
START_TEST(the_options_string_reads_numbers_as_the_tools_do)
{
	static const struct {
		const char *value;
		int rc;
	} cases[] = {{"4", 0},
		     {"0004", 0},
		     {"00000000000000000000004", 0},
		     {"+4", -EINVAL},
		     {" 4", -EINVAL},
		     {"4 ", -EINVAL},
		     {"0x4", -EINVAL},
		     {"4k", -EINVAL},
		     {"-4", -EINVAL},
		     {"", -EINVAL},
		     {"99999999999", -ERANGE},
		     {"999999999999999999999999", -ERANGE}};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char conf[64];
		snprintf(conf, sizeof(conf), "ring=%s", cases[i].value);
		mbp_opts o;
		mbp_opts_init(&o);
		int rc = mbp_opts_parse(&o, conf, NULL);
		ck_assert_msg(rc == cases[i].rc, "%s: %d, expected %d", conf, rc, cases[i].rc);
		uint64_t v = 0; /* the tools' reading of the same value for a field of 32 bits */
		ck_assert_msg((parse_u64(cases[i].value, 0, UINT32_MAX, &v) == 0) == (rc == 0),
			      "%s: the tools and the library disagree", conf);
		if (rc == 0)
			ck_assert_uint_eq(o.ring_capacity, 4);
	}
}
END_TEST

START_TEST(an_option_error_names_the_option_the_value_and_the_range)
{
	char err[128] = "";
	uint64_t v;
	double d;
	ck_assert_int_eq(parse_u64_opt("--stages", "0", "a stage count", 1, 64, &v, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "--stages: '0' is not a stage count from 1 to 64");
	ck_assert_int_eq(parse_double_opt("--tolerance", "x", "a share", 0, 1, &d, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "--tolerance: 'x' is not a share from 0 to 1");
	ck_assert_int_eq(parse_u64_opt("--stages", "3", "a stage count", 1, 64, &v, err, sizeof(err)), 0);
	ck_assert_uint_eq(v, 3);
	char small[8];
	ck_assert_int_eq((fail)(small, sizeof(small), "%s", "a long line"),
			 -1); /* (fail): not Check's macro */
	ck_assert_str_eq(small, "a long ");
}
END_TEST

START_TEST(plural_and_the_clock)
{
	ck_assert_str_eq(PLURAL(1, "row", "rows"), "row");
	ck_assert_str_eq(PLURAL(0, "row", "rows"), "rows");
	ck_assert_str_eq(PLURAL(2u, "row", "rows"), "rows");
	uint64_t a = mbt_now_ns();
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t b = mbt_now_ns();
	uint64_t mid = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	ck_assert(a <= mid && mid <= b);
	ck_assert(mbt_now_s() * 1e9 >= (double)b - 1e3);
	struct timespec t = mbt_timespec(3 * 1000000000ull + 42);
	ck_assert_int_eq(t.tv_sec, 3);
	ck_assert_int_eq(t.tv_nsec, 42);
	ck_assert_uint_gt(mbt_clock_ns(CLOCK_PROCESS_CPUTIME_ID), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("util");
	TCase *tc = tcase_create("util");
	tcase_add_test(tc, whole_numbers_are_digits_only_up_to_uint64_max);
	tcase_add_test(tc, real_numbers_are_finite_unsigned_and_whole);
	tcase_add_test(tc, the_options_string_reads_numbers_as_the_tools_do);
	tcase_add_test(tc, an_option_error_names_the_option_the_value_and_the_range);
	tcase_add_test(tc, plural_and_the_clock);
	suite_add_tcase(s, tc);
	return s;
}

#include "check_main.h"

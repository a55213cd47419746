/*
 * Errors (lib/error.c): mbp_strerror() and mbp_err_name() name every code, whichever its sign; the version.
 */
#include "config.h"

#include <errno.h>

#include <mbpipe.h>

#include "check_main.h"

START_TEST(strerror_names_every_code)
{
	ck_assert_str_eq(mbp_strerror(0), "success");
	ck_assert_str_eq(mbp_strerror(MBP_EINVAL), "invalid argument");
	ck_assert_str_eq(mbp_strerror(-ESHUTDOWN), "pipeline is shut down");
	ck_assert_str_eq(mbp_strerror(EAGAIN), mbp_strerror(-EAGAIN));
	ck_assert_str_eq(mbp_strerror(-123456), "unknown error");
	ck_assert_str_eq(mbp_err_name(-ETIMEDOUT), "ETIMEDOUT");
	ck_assert_str_eq(mbp_version(), MBP_VERSION_STRING);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("error");
	TCase *tc = tcase_create("error");
	tcase_add_test(tc, strerror_names_every_code);
	suite_add_tcase(s, tc);
	return s;
}

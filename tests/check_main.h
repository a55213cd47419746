/*
 * Shared main() for the Check test programs: each file defines `static Suite *suite(void)` and includes
 * this header last.
 *
 * Fork mode is on (Check's default): each test runs in its own process, so a crash or a hang fails one
 * test, not the program. For gdb or valgrind run with CK_FORK=no (timeouts are then off). Sanitizer and
 * slow runs scale timeouts with CK_TIMEOUT_MULTIPLIER. MBP_TEST_SCALE (a positive integer divisor, default
 * 1) shrinks the iteration counts of stress tests: CI's TSan pass sets it.
 */
#ifndef MBP_CHECK_MAIN_H
#define MBP_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

static inline unsigned long mbp_test_scale(void)
{
	const char *s = getenv("MBP_TEST_SCALE");
	unsigned long v = s ? strtoul(s, NULL, 10) : 1;
	return v ? v : 1;
}

/* n iterations, shrunk by MBP_TEST_SCALE but never below `floor`. */
static inline unsigned long mbp_iters(unsigned long n, unsigned long floor)
{
	unsigned long v = n / mbp_test_scale();
	return v < floor ? floor : v;
}

static Suite *suite(void);

int main(void)
{
	SRunner *sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif

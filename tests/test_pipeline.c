#include "config.h"
#include "check_main.h"
START_TEST(placeholder)
{
	ck_assert(1);
}
END_TEST
static Suite *suite(void)
{
	Suite *s = suite_create("pipeline");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, placeholder);
	suite_add_tcase(s, tc);
	return s;
}

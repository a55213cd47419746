/*
 * The ingress on its own (lib/ingress.c): the bounded multi-producer queue in front of stage 0.
 */
#include "config.h"

#include <errno.h>

#include "ingress.h"

#include "check_main.h"

/* The ingress alone: entries come out in order, the bound refuses a put beyond its depth until a pop gives
 * room back, refuse() fails later puts with -ESHUTDOWN, and after close() the consumer drains what was put
 * before it and then sees the end of the stream. */
START_TEST(ingress_is_bounded_ordered_and_closes_in_two_steps)
{
	static struct mbp__ingress_mpsc q;
	mbp__ingress_init(&q, 2);
	struct mbp__item it[3];
	struct mbp__wait_opts wo = {.spin_ns = 0, .yield_ns = 0};
	ck_assert_int_eq(mbp__ingress_put(&q, &it[0], MBP__ITEM_JOB, 0), 0);
	ck_assert_int_eq(mbp__ingress_put(&q, &it[1], MBP__ITEM_MB, 0), 0);
	ck_assert_uint_eq(mbp__ingress_queued(&q), 2);
	ck_assert_uint_eq(mbp__ingress_depth(&q), 2);
	ck_assert_int_eq(mbp__ingress_put(&q, &it[2], MBP__ITEM_MB, 0), -EAGAIN);
	ck_assert_int_eq(mbp__ingress_put(&q, &it[2], MBP__ITEM_MB, 1000000), -ETIMEDOUT);
	ck_assert_int_eq(mbp__ingress_wait(&q, &wo, NULL, NULL), 0);
	ck_assert_ptr_eq(mbp__ingress_pop(&q), &it[0]);
	ck_assert_uint_eq(it[0].kind, MBP__ITEM_JOB);
	ck_assert_int_eq(mbp__ingress_put(&q, &it[2], MBP__ITEM_MB, 0), 0); /* the pop gave room back */
	mbp__ingress_refuse(&q);
	ck_assert_int_eq(mbp__ingress_put(&q, &it[0], MBP__ITEM_JOB, -1), -ESHUTDOWN);
	mbp__ingress_close(&q);
	ck_assert_int_eq(mbp__ingress_wait(&q, &wo, NULL, NULL), 0); /* closed, not drained */
	ck_assert_ptr_eq(mbp__ingress_pop(&q), &it[1]);
	ck_assert_ptr_eq(mbp__ingress_pop(&q), &it[2]);
	ck_assert_ptr_null(mbp__ingress_pop(&q));
	ck_assert_int_eq(mbp__ingress_wait(&q, &wo, NULL, NULL), -EPIPE);
	ck_assert_uint_eq(mbp__ingress_queued(&q), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("ingress");
	TCase *tc = tcase_create("ingress");
	tcase_add_test(tc, ingress_is_bounded_ordered_and_closes_in_two_steps);
	suite_add_tcase(s, tc);
	return s;
}

/*
 * pipeserve's protocol messages in process (tools/pipeserve/oip.c): the three encodings of an input decode
 * to the same floats, responses round-trip every float exactly, and malformed requests are refused with
 * the right status. The fuzz target (fuzz/pipeserve_fuzz.c) explores the same parser blindly.
 */
#include "config.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oip.h"

static const ps_model_info mi = {.name = "m",
				 .version = "1",
				 .platform = "mbpipe",
				 .input_name = "input",
				 .output_name = "output",
				 .in_width = 3,
				 .out_width = 2,
				 .max_rows = 100};

static int parse(const char *body, size_t len, long long hl, ps_infer_req *rq)
{
	char err[256] = "";
	int st = ps_oip_parse_infer(&mi, body, len, hl, rq, err, sizeof err);
	if (st)
		ck_assert_msg(err[0], "status %d without a message", st);
	return st;
}

START_TEST(flat_nested_and_binary_inputs_decode_to_the_same_floats)
{
	const float want[6] = {1.5f, -2.25f, 3e-7f, 0.1f, 1e30f, -0.0f};
	const char *flat = "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[2,3],"
			   "\"data\":[1.5,-2.25,3e-7,0.1,1e30,-0.0]}]}";
	const char *nested = "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[2,3],"
			     "\"data\":[[1.5,-2.25,3e-7],[0.1,1e30,-0.0]]}]}";
	ps_infer_req a, b, c;
	ck_assert_int_eq(parse(flat, strlen(flat), -1, &a), 0);
	ck_assert_int_eq(parse(nested, strlen(nested), -1, &b), 0);
	char bin[512];
	int n =
	    snprintf(bin, sizeof bin,
		     "{\"id\":\"x\",\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[2,3],"
		     "\"parameters\":{\"binary_data_size\":24}}]}");
	memcpy(bin + n, want, sizeof want);
	ck_assert_int_eq(parse(bin, (size_t)n + sizeof want, n, &c), 0);
	ck_assert_uint_eq(a.rows, 2);
	ck_assert_uint_eq(b.rows, 2);
	ck_assert_uint_eq(c.rows, 2);
	ck_assert_mem_eq(a.in, want, sizeof want);
	ck_assert_mem_eq(b.in, want, sizeof want);
	ck_assert_mem_eq(c.in, want, sizeof want);
	ck_assert_ptr_eq(c.in, bin + n); /* binary data is used in place */
	ck_assert_str_eq(c.id, "x");
	ck_assert_ptr_null(a.id);
	ck_assert(a.want_output && !a.binary_output);
	ps_infer_req_clear(&a);
	ps_infer_req_clear(&b);
	ps_infer_req_clear(&c);
}
END_TEST

START_TEST(output_selection_follows_the_request)
{
	const char *in = "{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,2,3]}";
	char body[512];
	ps_infer_req rq;
	snprintf(body, sizeof body, "{\"inputs\":[%s],\"parameters\":{\"binary_data_output\":true}}", in);
	ck_assert_int_eq(parse(body, strlen(body), -1, &rq), 0);
	ck_assert(rq.want_output && rq.binary_output);
	ps_infer_req_clear(&rq);
	snprintf(body, sizeof body,
		 "{\"inputs\":[%s],\"parameters\":{\"binary_data_output\":true},"
		 "\"outputs\":[{\"name\":\"output\",\"parameters\":{\"binary_data\":false}}]}",
		 in);
	ck_assert_int_eq(parse(body, strlen(body), -1, &rq), 0);
	ck_assert(rq.want_output && !rq.binary_output);
	ps_infer_req_clear(&rq);
	snprintf(body, sizeof body, "{\"inputs\":[%s],\"outputs\":[]}", in);
	ck_assert_int_eq(parse(body, strlen(body), -1, &rq), 0);
	ck_assert(!rq.want_output);
	ps_infer_req_clear(&rq);
}
END_TEST

START_TEST(responses_round_trip_every_float_exactly)
{
	ps_infer_req rq = {.id = "a\"b\\c\n", .rows = 3, .want_output = true};
	float out[6] = {FLT_MIN, -FLT_MAX, 0.1f, 1.0f / 3.0f, 1e-45f, 123456789.0f};
	ps_buf b = {0};
	size_t json_len;
	ck_assert_int_eq(ps_oip_encode_infer(&mi, &rq, out, &b, &json_len), 0);
	ck_assert_uint_eq(json_len, b.len);
	cJSON *root = cJSON_ParseWithLength(b.p, b.len);
	ck_assert_ptr_nonnull(root);
	ck_assert_str_eq(cJSON_GetObjectItem(root, "id")->valuestring, "a\"b\\c\n");
	ck_assert_str_eq(cJSON_GetObjectItem(root, "model_name")->valuestring, "m");
	const cJSON *o = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "outputs"), 0);
	const cJSON *data = cJSON_GetObjectItem(o, "data");
	ck_assert_int_eq(cJSON_GetArraySize(data), 6);
	for (int i = 0; i < 6; i++)
		ck_assert_msg((float)cJSON_GetArrayItem(data, i)->valuedouble == out[i], "element %d changed",
			      i);
	cJSON_Delete(root);
	ps_buf_free(&b);

	rq.binary_output = true;
	ck_assert_int_eq(ps_oip_encode_infer(&mi, &rq, out, &b, &json_len), 0);
	ck_assert_uint_eq(b.len, json_len + sizeof out);
	ck_assert_mem_eq(b.p + json_len, out, sizeof out);
	ck_assert_ptr_nonnull(strstr(b.p, "\"binary_data_size\":24"));
	ps_buf_free(&b);
}
END_TEST

START_TEST(malformed_requests_get_400_and_oversized_ones_413)
{
	static const struct {
		const char *body;
		long long hl; /* Inference-Header-Content-Length; -1: none; -2: the body's length */
		int status;
	} cases[] = {
	    {"", -1, 400},
	    {"{", -1, 400},
	    {"null", -1, 400},
	    {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[101,3],\"data\":[]}]}", -1,
	     413},
	    {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[[1,2,3],[4,5,"
	     "6]]}]}",
	     -1, 400},
	    {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,[2],3]}]}",
	     -1, 400},
	    {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,2,null]}]}",
	     -1, 400},
	    {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,2,3]}],"
	     "\"parameters\":[]}",
	     -1, 400},
	    {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,2,3]}],"
	     "\"outputs\":[{\"name\":\"output\"},{\"name\":\"output\"}]}",
	     -1, 400},
	    {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],"
	     "\"parameters\":{\"binary_data_size\":-12}}]}",
	     -2, 400},	    /* -2: the whole body is the JSON header */
	    {"{}", 5, 400}, /* header length beyond the body */
	    {"{}", 0, 400}, /* an empty JSON header */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		ps_infer_req rq;
		size_t len = strlen(cases[i].body);
		int st = parse(cases[i].body, len, cases[i].hl == -2 ? (long long)len : cases[i].hl, &rq);
		ck_assert_msg(st == cases[i].status, "case %zu: status %d, expected %d", i, st,
			      cases[i].status);
		ck_assert_ptr_null(rq.owned);
		ck_assert_ptr_null(rq.id);
	}
	ck_assert_int_eq(ps_oip_parse_header_len("12", 20), 12);
	ck_assert_int_eq(ps_oip_parse_header_len("21", 20), -1);
	ck_assert_int_eq(ps_oip_parse_header_len("-1", 20), -1);
	ck_assert_int_eq(ps_oip_parse_header_len("99999999999999999999999", 20), -1);
	ck_assert_int_eq(ps_oip_parse_header_len("", 20), -1);
}
END_TEST

/* A text with more values than the largest request (100 x 3 + room) is refused before cJSON parses it;
 * commas inside strings do not count. */
START_TEST(a_text_of_more_values_than_the_largest_request_is_refused_before_parsing)
{
	enum { N = 5000 };
	static char body[16 * N];
	size_t n = (size_t)snprintf(body, sizeof body,
				    "{\"id\":\"%s\",\"inputs\":[{\"name\":\"input\","
				    "\"datatype\":\"FP32\",\"shape\":[100,3],\"data\":[",
				    ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,");
	for (int i = 0; i < 300; i++)
		n += (size_t)snprintf(body + n, sizeof body - n, "%s1", i ? "," : "");
	n += (size_t)snprintf(body + n, sizeof body - n, "]}]}");
	ps_infer_req rq;
	ck_assert_int_eq(parse(body, n, -1, &rq), 0); /* the largest request passes */
	ps_infer_req_clear(&rq);
	n -= 4;
	for (int i = 300; i < N; i++)
		n += (size_t)snprintf(body + n, sizeof body - n, ",1");
	n += (size_t)snprintf(body + n, sizeof body - n, "]}]}");
	char err[256];
	ck_assert_int_eq(ps_oip_parse_infer(&mi, body, n, -1, &rq, err, sizeof err), 413);
	ck_assert_ptr_nonnull(strstr(err, "more JSON values"));
}
END_TEST

/* Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). */
static bool valid_utf8(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned c = s[i];
		size_t k = c < 0x80		    ? 1
			   : c >= 0xc2 && c <= 0xdf ? 2
			   : c >= 0xe0 && c <= 0xef ? 3
			   : c >= 0xf0 && c <= 0xf4 ? 4
						    : 0;
		if (!k || i + k > n)
			return false;
		for (size_t j = 1; j < k; j++)
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
		if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f) ||
		    (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] > 0x8f))
			return false;
		i += k;
	}
	return true;
}

START_TEST(error_messages_are_valid_json_whatever_bytes_they_quote)
{
	const char *hostile[] = {
	    "\xff\xfe",	    "a\"b\\c\n\x01\x7f", "\xc3",     "\xe2\x82",
	    "\xed\xa0\x80", "\xf4\x90\x80\x80",	 "\xc0\xaf", "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"};
	for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
		ps_buf b = {0};
		ck_assert_int_eq(ps_oip_encode_error(&b, hostile[i]), 0);
		ck_assert_msg(valid_utf8((const unsigned char *)b.p, b.len), "case %zu: %s", i, b.p);
		cJSON *j = cJSON_ParseWithLength(b.p, b.len);
		ck_assert_msg(j && cJSON_IsString(cJSON_GetObjectItem(j, "error")), "case %zu: %s", i, b.p);
		cJSON_Delete(j);
		ps_buf_free(&b);
	}
	/* valid UTF-8 passes unchanged; one bad byte becomes U+FFFD */
	ps_buf b = {0};
	ps_buf_add_json_string(&b, hostile[7]);
	ck_assert_str_eq(b.p, "\"ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
	ps_buf_free(&b);
	ps_buf_add_json_string(&b, "x\xffy");
	ck_assert_str_eq(b.p, "\"x\\ufffdy\"");
	ps_buf_free(&b);
	/* a request naming an input with such bytes gets an error that quotes them as valid JSON */
	const char req[] = "{\"inputs\":[{\"name\":\"\xff\xfe\xc3\",\"datatype\":\"FP32\",\"shape\":[1,3],"
			   "\"data\":[1,2,3]}]}";
	ps_infer_req rq;
	char err[256];
	ck_assert_int_eq(ps_oip_parse_infer(&mi, req, sizeof req - 1, -1, &rq, err, sizeof err), 400);
	ck_assert_int_eq(ps_oip_encode_error(&b, err), 0);
	ck_assert(valid_utf8((const unsigned char *)b.p, b.len));
	ps_buf_free(&b);
}
END_TEST

/* One rule for JSON and binary data: finite FP32 numbers only. */
START_TEST(nan_and_infinity_are_refused_in_json_and_in_binary_alike)
{
	const char json[] = "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],"
			    "\"parameters\":{\"binary_data_size\":12}}]}";
	const float bad[] = {NAN, INFINITY, -INFINITY};
	for (int k = 0; k < 4; k++) {
		char body[sizeof json + 12];
		float v[3] = {1, 2, 3};
		if (k < 3)
			v[1] = bad[k];
		memcpy(body, json, sizeof json - 1);
		memcpy(body + sizeof json - 1, v, sizeof v);
		ps_infer_req rq;
		int st = parse(body, sizeof body - 1, (long long)(sizeof json - 1), &rq);
		ck_assert_int_eq(st, k < 3 ? 400 : 0);
		ps_infer_req_clear(&rq);
	}
	const char *js[] = {"1e39", "-1e39", "NaN", "Infinity"};
	for (size_t i = 0; i < 4; i++) {
		char body[256];
		int n = snprintf(body, sizeof body,
				 "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],"
				 "\"data\":[1,%s,3]}]}",
				 js[i]);
		ps_infer_req rq;
		ck_assert_int_eq(parse(body, (size_t)n, -1, &rq), 400);
	}
}
END_TEST

START_TEST(load_requests_name_a_file_or_nothing)
{
	char *path, err[128];
	ck_assert_int_eq(ps_oip_parse_load("", 0, &path, err, sizeof err), 0);
	ck_assert_ptr_null(path);
	const char *ok = "{\"parameters\":{\"file\":\"y.safetensors\"}}";
	ck_assert_int_eq(ps_oip_parse_load(ok, strlen(ok), &path, err, sizeof err), 0);
	ck_assert_str_eq(path, "y.safetensors");
	free(path);
	/* a path is never taken, whatever it names */
	const char *bad[] = {"{\"parameters\":{\"path\":\"/x/y.safetensors\"}}",
			     "{\"parameters\":{\"file\":7}}",
			     "{\"parameters\":{\"file\":\"\"}}",
			     "[1]",
			     "{\"parameters\":1}",
			     "{"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ck_assert_int_eq(ps_oip_parse_load(bad[i], strlen(bad[i]), &path, err, sizeof err), 400);
		ck_assert_ptr_null(path);
	}
}
END_TEST

/* cJSON decodes \u0000 into a C string that ends there: "B.safetensors\u0000/../../etc/passwd" would
 * read as "B.safetensors". Such a name, and one with any other control character, is refused; an escaped
 * backslash before "u0000" is only text. */
START_TEST(a_nul_or_control_character_in_a_name_is_refused_before_it_can_cut_the_name)
{
	char *path, err[256];
	const char *bad[] = {
	    "{\"parameters\":{\"file\":\"B.safetensors\\u0000/../../etc/passwd\"}}",
	    "{\"parameters\":{\"file\":\"B.safetensors\\U0000\"}}", /* not an escape: cJSON refuses it */
	    "{\"parameters\":{\"file\":\"\\u0000\"}}",
	    "{\"parameters\":{\"file\":\"B\\u0001.safetensors\"}}",
	    "{\"parameters\":{\"file\":\"B\\u001f.safetensors\"}}",
	    "{\"parameters\":{\"file\":\"B\\u007f.safetensors\"}}",
	    "{\"parameters\":{\"file\":\"B\\n.safetensors\"}}",
	    "{\"parameters\":{\"other\":\"\\u0000\",\"file\":\"B.safetensors\"}}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		err[0] = '\0';
		int st = ps_oip_parse_load(bad[i], strlen(bad[i]), &path, err, sizeof err);
		ck_assert_msg(st == 400, "%s: status %d (%s)", bad[i], st, path ? path : "");
		ck_assert_ptr_null(path);
		ck_assert(err[0]);
	}
	const char *text = "{\"parameters\":{\"file\":\"B\\\\u0000\"}}"; /* the six characters \u0000 */
	ck_assert_int_eq(ps_oip_parse_load(text, strlen(text), &path, err, sizeof err), 0);
	ck_assert_str_eq(path, "B\\u0000");
	free(path);
	/* A load request of many values is refused before it is parsed. */
	char many[4096];
	int n = snprintf(many, sizeof many, "{\"parameters\":{\"file\":\"B.safetensors\"},\"x\":[");
	for (int i = 0; i < 100; i++)
		n += snprintf(many + n, sizeof many - (size_t)n, "%s0", i ? "," : "");
	snprintf(many + n, sizeof many - (size_t)n, "]}");
	ck_assert_int_eq(ps_oip_parse_load(many, strlen(many), &path, err, sizeof err), 400);
	ck_assert_ptr_null(path);
	/* An infer request's names and id are C strings too. */
	ps_infer_req rq;
	const char *infer[] = {
	    "{\"id\":\"a\\u0000b\",\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3],"
	    "\"data\":[1,2,3]}]}",
	    "{\"inputs\":[{\"name\":\"input\\u0000x\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,2,3]}"
	    "]}",
	};
	for (size_t i = 0; i < sizeof infer / sizeof infer[0]; i++) {
		ck_assert_int_eq(parse(infer[i], strlen(infer[i]), -1, &rq), 400);
		ck_assert_ptr_null(rq.id);
	}
	ck_assert(ps_has_control("a\x7f"));
	ck_assert(!ps_has_control("a.safetensors"));
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("pipeserve_oip");
	TCase *tc = tcase_create("oip");
	tcase_add_test(tc, flat_nested_and_binary_inputs_decode_to_the_same_floats);
	tcase_add_test(tc, output_selection_follows_the_request);
	tcase_add_test(tc, responses_round_trip_every_float_exactly);
	tcase_add_test(tc, malformed_requests_get_400_and_oversized_ones_413);
	tcase_add_test(tc, a_text_of_more_values_than_the_largest_request_is_refused_before_parsing);
	tcase_add_test(tc, error_messages_are_valid_json_whatever_bytes_they_quote);
	tcase_add_test(tc, nan_and_infinity_are_refused_in_json_and_in_binary_alike);
	tcase_add_test(tc, load_requests_name_a_file_or_nothing);
	tcase_add_test(tc, a_nul_or_control_character_in_a_name_is_refused_before_it_can_cut_the_name);
	suite_add_tcase(s, tc);
	return s;
}

#include "check_main.h"

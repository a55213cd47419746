/*
 * The safetensors reader and the model file layout: a valid file loads; one generated file per broken rule
 * fails with that rule, its errno and a message naming the tensor; F16 and BF16 convert exactly; the
 * digests catch bytes changed after writing; a file that is not a model is refused in words that show
 * none of its bytes.
 */
#include "config.h"

#include <endian.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbpipe.h>

#include "model/model_internal.h"
#include "model/safetensors.h"

#include "check_main.h"
#include "model_file.h"

static char dir[64];
static char path[128];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/mbp-st-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/m.safetensors", dir);
}

static void teardown(void)
{
	unlink(path);
	rmdir(dir);
}

/* A file: the 8-byte length (hlen, or the header's own length when hlen is UINT64_MAX), the header, then
 * `data` bytes (or data_len zero bytes when data is NULL). */
static void write_raw(uint64_t hlen, const char *header, size_t hdr_bytes, const void *data, size_t data_len)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	uint64_t le = htole64(hlen == UINT64_MAX ? hdr_bytes : hlen);
	ck_assert_uint_eq(fwrite(&le, 8, 1, f), 1);
	ck_assert_uint_eq(fwrite(header, 1, hdr_bytes, f), hdr_bytes);
	for (size_t i = 0; i < data_len; i++)
		fputc(data ? ((const unsigned char *)data)[i] : 0, f);
	ck_assert_int_eq(fclose(f), 0);
}

/* A valid 1-layer model 2 -> 2, F32: weight [0, 16), bias [16, 24). */
#define W2 "\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}"
#define B2 "\"layers.0.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}"

START_TEST(valid_generated_file_loads_and_describes_its_layers)
{
	uint32_t widths[] = {16, 32, 8, 4};
	mbp_model_spec sp = {.layers = 3, .widths = widths, .act = MBP_ACT_GELU, .norm = true, .seed = 7};
	ck_assert_int_eq(mbp_model_write_random(path, &sp), 0);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_int_eq(mbp_model_load(&m, path, &e), 0);
	ck_assert_int_eq(e.rule, MBP_LOAD_OK);
	ck_assert_uint_eq(mbp_model_layers(m), 3);
	ck_assert_uint_eq(mbp_model_in_width(m), 16);
	ck_assert_uint_eq(mbp_model_out_width(m), 4);
	for (unsigned i = 0; i < 3; i++) {
		mbp_layer_info li;
		ck_assert_int_eq(mbp_model_layer_info(m, i, &li), 0);
		ck_assert_uint_eq(li.in, widths[i]);
		ck_assert_uint_eq(li.out, widths[i + 1]);
		ck_assert_int_eq(li.act, i < 2 ? MBP_ACT_GELU : MBP_ACT_NONE);
		ck_assert(li.norm == (i < 2));
		ck_assert_int_eq(li.dtype, MBP_DTYPE_F32);
		ck_assert_float_eq(li.eps, 1e-5f);
	}
	mbp_layer_info li;
	ck_assert_int_eq(mbp_model_layer_info(m, 3, &li), -ERANGE);
	char buf[512];
	int n = mbp_model_describe(m, buf, sizeof(buf));
	ck_assert_int_gt(n, 0);
	ck_assert_ptr_nonnull(strstr(buf, "layer 1: 32 -> 8 gelu norm F32"));
	ck_assert_ptr_nonnull(strstr(buf, "layer 2: 8 -> 4 none F32"));
	ck_assert_int_eq(mbp_model_describe(m, buf, 8), n); /* truncation reports the full length */
	ck_assert_uint_eq(strlen(buf), 7);
	ck_assert_uint_eq(mbp_model_version(m), 1);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	mbp_model_destroy(m);
}
END_TEST

START_TEST(hand_written_minimal_file_loads)
{
	float d[6] = {1, 2, 3, 4, 0.5f, -0.5f};
	const char *h = "{" W2 "," B2 "}";
	write_raw(UINT64_MAX, h, strlen(h), d, sizeof(d));
	mbp_model *m;
	ck_assert_int_eq(mbp_model_load(&m, path, NULL), 0);
	ck_assert(!mbp_model_verified(m)); /* no digests in it: loaded all the same */
	float x[2] = {1, -1}, y[2];
	ck_assert_int_eq(mbp_model_forward(m, x, y, 1, 1), 0);
	ck_assert_float_eq(y[0], 1 - 2 + 0.5f);
	ck_assert_float_eq(y[1], 3 - 4 - 0.5f);
	mbp_model_destroy(m);
}
END_TEST

/* One case per rule: the file, the rule, its errno and the tensor the message must name. */
struct bad_case {
	const char *what;
	uint64_t hlen; /* UINT64_MAX: the header's length */
	const char *header;
	size_t data_len;
	mbp_load_rule rule;
	int code;
	const char *tensor; /* NULL: none named */
};

#define T(name, dtype, shape, b, e)                                                                          \
	"\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static const struct bad_case bad[] = {
    {"header longer than the limit", 100000001, "{}", 0, MBP_ST_HEADER_TOO_LARGE, -E2BIG, NULL},
    {"header length beyond the file", 1000, "{}", 10, MBP_ST_HEADER_LENGTH, -ERANGE, NULL},
    {"header not UTF-8", UINT64_MAX, "{\"a\xff\":1}", 0, MBP_ST_HEADER_UTF8, -EBADMSG, NULL},
    {"overlong UTF-8", UINT64_MAX, "{\"a\xc0\xaf\":1}", 0, MBP_ST_HEADER_UTF8, -EBADMSG, NULL},
    {"header not an object", UINT64_MAX, "[]", 0, MBP_ST_HEADER_START, -EBADMSG, NULL},
    {"JSON syntax", UINT64_MAX, "{\"a\":}", 0, MBP_ST_HEADER_JSON, -EBADMSG, NULL},
    {"JSON trailing garbage", UINT64_MAX, "{} x", 0, MBP_ST_HEADER_JSON, -EBADMSG, NULL},
    {"JSON leading zero", UINT64_MAX, "{\"a\":01}", 0, MBP_ST_HEADER_JSON, -EBADMSG, NULL},
    {"JSON raw control character", UINT64_MAX, "{\"a\tb\":1}", 0, MBP_ST_HEADER_JSON, -EBADMSG, NULL},
    {"duplicate tensor", UINT64_MAX, "{" B2 "," B2 "}", 24, MBP_ST_DUPLICATE, -EEXIST, "layers.0.bias"},
    {"metadata value not a string", UINT64_MAX, "{\"__metadata__\":{\"x\":1}}", 0, MBP_ST_METADATA, -EPROTO,
     "__metadata__"},
    {"tensor without data_offsets", UINT64_MAX, "{\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[1,1]}}",
     0, MBP_ST_TENSOR_INFO, -EPROTO, "layers.0.weight"},
    {"unknown dtype", UINT64_MAX, "{" T("layers.0.weight", "F33", "[1,1]", 0, 4) "}", 4, MBP_ST_DTYPE,
     -ENOTSUP, "layers.0.weight"},
    {"negative dimension", UINT64_MAX, "{" T("layers.0.weight", "F32", "[1,-1]", 0, 4) "}", 4, MBP_ST_SHAPE,
     -EDOM, "layers.0.weight"},
    {"size overflow", UINT64_MAX, "{" T("layers.0.weight", "F32", "[4294967296,4294967296,2]", 0, 4) "}", 4,
     MBP_ST_OVERFLOW, -EOVERFLOW, "layers.0.weight"},
    {"bytes overflow", UINT64_MAX, "{" T("layers.0.weight", "F32", "[4503599627370496,2048]", 0, 4) "}", 4,
     MBP_ST_OVERFLOW, -EOVERFLOW, "layers.0.weight"},
    {"offsets reversed", UINT64_MAX, "{" T("layers.0.bias", "F32", "[1]", 8, 4) "}", 8, MBP_ST_OFFSETS,
     -EINVAL, "layers.0.bias"},
    {"offsets not a pair", UINT64_MAX,
     "{\"layers.0.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, MBP_ST_OFFSETS,
     -EINVAL, "layers.0.bias"},
    {"range size against shape", UINT64_MAX, "{" T("layers.0.bias", "F32", "[2]", 0, 4) "}", 4, MBP_ST_SIZE,
     -EPROTO, "layers.0.bias"},
    {"range beyond the data", UINT64_MAX, "{" T("layers.0.bias", "F32", "[2]", 0, 8) "}", 4,
     MBP_ST_OUT_OF_BOUNDS, -EFAULT, "layers.0.bias"},
    {"gap between ranges", UINT64_MAX,
     "{" T("layers.0.weight", "F32", "[1,1]", 0, 4) "," T("layers.0.bias", "F32", "[1]", 8, 12) "}", 12,
     MBP_ST_GAP, -ERANGE, "layers.0.bias"},
    {"gap at the start", UINT64_MAX, "{" T("layers.0.bias", "F32", "[1]", 4, 8) "}", 8, MBP_ST_GAP, -ERANGE,
     "layers.0.bias"},
    {"overlapping ranges", UINT64_MAX,
     "{" T("layers.0.weight", "F32", "[2,1]", 0, 8) "," T("layers.0.bias", "F32", "[2]", 4, 12) "}", 12,
     MBP_ST_OVERLAP, -ERANGE, "layers.0.bias"},
    {"bytes after the last tensor", UINT64_MAX, "{" T("layers.0.bias", "F32", "[1]", 0, 4) "}", 8,
     MBP_ST_FILE_SIZE, -EBADMSG, "layers.0.bias"},
    /* the model layout */
    {"no tensors", UINT64_MAX, "{}", 0, MBP_MODEL_NO_LAYERS, -ENOENT, "layers.0.weight"},
    {"layer 0 missing", UINT64_MAX,
     "{" T("layers.1.weight", "F32", "[1,1]", 0, 4) "," T("layers.1.bias", "F32", "[1]", 4, 8) "}", 8,
     MBP_MODEL_NO_LAYERS, -ENOENT, "layers.0.weight"},
    {"bias missing", UINT64_MAX, "{" T("layers.0.weight", "F32", "[1,1]", 0, 4) "}", 4, MBP_MODEL_MISSING,
     -ENOENT, "layers.0.bias"},
    {"half a norm pair", UINT64_MAX,
     "{" T("layers.0.weight", "F32", "[1,1]", 0, 4) "," T("layers.0.bias", "F32", "[1]", 4, 8) "," T(
	 "layers.0.norm.weight", "F32", "[1]", 8, 12) "}",
     12, MBP_MODEL_MISSING, -ENOENT, "layers.0.norm.bias"},
    {"unexpected tensor", UINT64_MAX, "{" W2 "," B2 "," T("embed", "F32", "[0]", 24, 24) "}", 24,
     MBP_MODEL_UNKNOWN_TENSOR, -EINVAL, "embed"},
    {"non-canonical layer index", UINT64_MAX, "{" T("layers.00.weight", "F32", "[1,1]", 0, 4) "}", 4,
     MBP_MODEL_UNKNOWN_TENSOR, -EINVAL, "layers.00.weight"},
    {"integer weights", UINT64_MAX, "{" T("layers.0.weight", "I32", "[1,1]", 0, 4) "}", 4, MBP_MODEL_DTYPE,
     -ENOTSUP, "layers.0.weight"},
    {"weight of rank 1", UINT64_MAX,
     "{" T("layers.0.weight", "F32", "[1]", 0, 4) "," T("layers.0.bias", "F32", "[1]", 4, 8) "}", 8,
     MBP_MODEL_SHAPE, -EINVAL, "layers.0.weight"},
    {"widths do not chain", UINT64_MAX,
     "{" W2 "," B2
     "," T("layers.1.weight", "F32", "[1,3]", 24, 36) "," T("layers.1.bias", "F32", "[1]", 36, 40) "}",
     40, MBP_MODEL_SHAPE, -EINVAL, "layers.1.weight"},
    {"bias width", UINT64_MAX,
     "{" T("layers.0.weight", "F32", "[1,1]", 0, 4) "," T("layers.0.bias", "F32", "[2]", 4, 12) "}", 12,
     MBP_MODEL_SHAPE, -EINVAL, "layers.0.bias"},
    {"unknown activation", UINT64_MAX, "{\"__metadata__\":{\"activation\":\"tanh\"}," W2 "," B2 "}", 24,
     MBP_MODEL_ACTIVATION, -EINVAL, "__metadata__"},
    {"too many layers", UINT64_MAX, "{" T("layers.5000.weight", "F32", "[1,1]", 0, 4) "}", 4,
     MBP_MODEL_TOO_MANY, -E2BIG, "layers.5000.weight"},
};

START_TEST(each_broken_rule_fails_with_its_own_error_naming_the_tensor)
{
	const struct bad_case *c = &bad[_i];
	write_raw(c->hlen, c->header, strlen(c->header), NULL, c->data_len);
	mbp_model *m = (mbp_model *)(uintptr_t)1;
	mbp_model_error e;
	int rc = mbp_model_load(&m, path, &e);
	ck_assert_msg(rc == c->code, "%s: rc %d (%s), want %d; %s", c->what, rc, mbp_err_name(rc), c->code,
		      e.msg);
	ck_assert_msg(e.rule == c->rule, "%s: rule %d (%s), want %d (%s)", c->what, e.rule,
		      mbp_load_rule_str(e.rule), c->rule, mbp_load_rule_str(c->rule));
	ck_assert_int_eq(e.code, rc);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(e.msg, path) != NULL, "%s: message does not name the file: %s", c->what, e.msg);
	ck_assert_msg(strstr(e.msg, mbp_load_rule_str(c->rule)) != NULL, "%s: %s", c->what, e.msg);
	if (c->tensor) {
		char quoted[160];
		snprintf(quoted, sizeof(quoted), "'%s'", c->tensor);
		ck_assert_str_eq(e.tensor, c->tensor);
		ck_assert_msg(strstr(e.msg, quoted) != NULL, "%s: message does not name %s: %s", c->what,
			      quoted, e.msg);
	} else {
		ck_assert_str_eq(e.tensor, "");
	}
}
END_TEST

START_TEST(every_rule_has_distinct_text)
{
	for (int a = MBP_LOAD_IO; a <= MBP_MODEL_STRUCTURE; a++)
		for (int b = a + 1; b <= MBP_MODEL_STRUCTURE; b++)
			ck_assert_str_ne(mbp_load_rule_str(a), mbp_load_rule_str(b));
	ck_assert_str_eq(mbp_load_rule_str((mbp_load_rule)999), "unknown rule");
}
END_TEST

START_TEST(short_file_and_missing_file_fail)
{
	write_raw(0, "", 0, NULL, 0);
	truncate(path, 5);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_int_eq(mbp_model_load(&m, path, &e), -EBADMSG);
	ck_assert_int_eq(e.rule, MBP_ST_HEADER_TOO_SMALL);
	truncate(path, 0);
	ck_assert_int_eq(mbp_model_load(&m, path, &e), -EBADMSG);
	ck_assert_int_eq(e.rule, MBP_ST_HEADER_TOO_SMALL);
	unlink(path);
	ck_assert_int_eq(mbp_model_load(&m, path, &e), -ENOENT);
	ck_assert_int_eq(e.rule, MBP_LOAD_IO);
	ck_assert_int_eq(e.code, -ENOENT);
	ck_assert_int_eq(mbp_model_load(NULL, path, &e), -EINVAL);
}
END_TEST

START_TEST(reader_accepts_what_the_reference_accepts)
{
	/* Zero-size tensors sharing an offset, padding spaces, metadata null, every dtype, unknown keys in
	 * an entry: valid safetensors (the model layout is not checked by the reader). */
	const char *h =
	    "{\"__metadata__\":null," T("a", "BOOL", "[0]", 0, 0) "," T("b", "U8", "[0,5]", 0, 0) "," T(
		"c", "F8_E4M3", "[2]", 0, 2) "," T("d", "BF16", "[1]", 2,
						   4) "," T("e", "F64", "[1]", 4,
							    12) ",\"f\":{\"dtype\":\"U64\",\"shape\":[],"
								"\"data_offsets\":[12,20],\"x\":[]}}    ";
	size_t len = 8 + strlen(h) + 20;
	uint8_t *buf = calloc(1, len);
	uint64_t hl = htole64(strlen(h));
	memcpy(buf, &hl, 8);
	memcpy(buf + 8, h, strlen(h));
	mbp__st st;
	mbp_model_error e;
	ck_assert_msg(mbp__st_parse(buf, len, &st, &e) == 0, "%s", e.msg);
	ck_assert_uint_eq(st.n, 6);
	ck_assert_uint_eq(st.data_len, 20);
	const mbp__st_tensor *f = mbp__st_find(&st, "f");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(f->ndim, 0);
	ck_assert_uint_eq(f->nelem, 1);
	ck_assert_ptr_null(mbp__st_find(&st, "g"));
	mbp__st_free(&st);
	free(buf);
}
END_TEST

START_TEST(f16_converts_exactly)
{
	ck_assert_float_eq(mbp__f16_to_f32(0x3c00), 1.0f);
	ck_assert_float_eq(mbp__f16_to_f32(0xc000), -2.0f);
	ck_assert_float_eq(mbp__f16_to_f32(0x7bff), 65504.0f);
	ck_assert_float_eq(mbp__f16_to_f32(0x0400), 0x1p-14f);
	ck_assert_float_eq(mbp__f16_to_f32(0x0001), 0x1p-24f);
	ck_assert_float_eq(mbp__f16_to_f32(0x83ff), -1023 * 0x1p-24f);
	ck_assert(isinf(mbp__f16_to_f32(0x7c00)) && mbp__f16_to_f32(0x7c00) > 0);
	ck_assert(isinf(mbp__f16_to_f32(0xfc00)) && mbp__f16_to_f32(0xfc00) < 0);
	ck_assert(isnan(mbp__f16_to_f32(0x7e00)));
	ck_assert(signbit(mbp__f16_to_f32(0x8000)) && mbp__f16_to_f32(0x8000) == 0);
	/* Every half (but NaNs) survives the round trip; rounding is to nearest, ties to even. */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = mbp__f16_to_f32((uint16_t)h);
		if (!isnan(f))
			ck_assert_uint_eq(mbp__f32_to_f16(f), h);
	}
	ck_assert_uint_eq(mbp__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);		/* tie: to even (down) */
	ck_assert_uint_eq(mbp__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);	/* tie: to even (up) */
	ck_assert_uint_eq(mbp__f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01); /* above the tie */
	ck_assert_uint_eq(mbp__f32_to_f16(65520.0f), 0x7c00);			/* rounds to infinity */
	ck_assert_uint_eq(mbp__f32_to_f16(0x1p-25f), 0x0000);			/* tie to even: zero */
	ck_assert_uint_eq(mbp__f32_to_f16(3 * 0x1p-25f), 0x0002);
}
END_TEST

START_TEST(bf16_converts_exactly)
{
	ck_assert_float_eq(mbp__bf16_to_f32(0x3f80), 1.0f);
	ck_assert_float_eq(mbp__bf16_to_f32(0xc2f7), -123.5f);
	ck_assert_float_eq(mbp__bf16_to_f32(0x0001), 0x1p-133f);
	ck_assert(isinf(mbp__bf16_to_f32(0x7f80)));
	ck_assert(isnan(mbp__bf16_to_f32(0x7fc0)));
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = mbp__bf16_to_f32((uint16_t)h);
		if (!isnan(f))
			ck_assert_uint_eq(mbp__f32_to_bf16(f), h);
	}
	ck_assert_uint_eq(mbp__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);	 /* tie: to even */
	ck_assert_uint_eq(mbp__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie: to even (up) */
	ck_assert(isnan(mbp__bf16_to_f32(mbp__f32_to_bf16(NAN))));
}
END_TEST

/* A 1-layer 2 -> 2 model in F16, BF16 or F32 at an odd data offset: all must give the same exact result. */
static void check_small_model(const char *dtype, size_t esize, const void *wdata, const char *pad)
{
	char h[512];
	snprintf(h, sizeof(h),
		 "{\"layers.0.weight\":{\"dtype\":\"%s\",\"shape\":[2,2],\"data_offsets\":[0,%zu]},"
		 "\"layers.0.bias\":{\"dtype\":\"%s\",\"shape\":[2],\"data_offsets\":[%zu,%zu]}}%s",
		 dtype, 4 * esize, dtype, 4 * esize, 6 * esize, pad);
	write_raw(UINT64_MAX, h, strlen(h), wdata, 6 * esize);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load(&m, path, &e) == 0, "%s", e.msg);
	/* W = [[1, 0.5], [-2, 0.25]], b = [0.125, -1]; x = [1, 2] -> [2.125, -2.5] */
	float x[2] = {1, 2}, y[2];
	ck_assert_int_eq(mbp_model_forward(m, x, y, 1, 0), 0);
	ck_assert_float_eq(y[0], 2.125f);
	ck_assert_float_eq(y[1], -2.5f);
	mbp_layer_info li;
	mbp_model_layer_info(m, 0, &li);
	ck_assert_int_eq(li.dtype, !strcmp(dtype, "F16")    ? MBP_DTYPE_F16
				   : !strcmp(dtype, "BF16") ? MBP_DTYPE_BF16
							    : MBP_DTYPE_F32);
	mbp_model_destroy(m);
}

START_TEST(f16_bf16_and_unaligned_f32_files_load_to_the_same_weights)
{
	const float v[6] = {1, 0.5f, -2, 0.25f, 0.125f, -1};
	uint16_t h16[6], b16[6];
	for (int i = 0; i < 6; i++) {
		h16[i] = htole16(mbp__f32_to_f16(v[i]));
		b16[i] = htole16(mbp__f32_to_bf16(v[i]));
	}
	check_small_model("F16", 2, h16, "");
	check_small_model("BF16", 2, b16, "");
	check_small_model("F32", 4, v, "");
	check_small_model("F32", 4, v, " ");   /* data at an odd offset: copied to aligned memory */
	check_small_model("F32", 4, v, "   "); /* and one more */
}
END_TEST

START_TEST(generated_f16_and_bf16_files_hold_the_rounded_f32_weights)
{
	/* The same seed in F32, F16 and BF16: every converted weight is the F32 one rounded to nearest. */
	mbp_model_spec sp = {.layers = 2, .in = 8, .hidden = 6, .out = 5, .norm = true, .seed = 3};
	mbp_model *m[3];
	for (int d = 0; d < 3; d++) {
		sp.dtype = (mbp_dtype)d;
		ck_assert_int_eq(mbp_model_write_random(path, &sp), 0);
		ck_assert_int_eq(mbp_model_load(&m[d], path, NULL), 0);
	}
	for (unsigned l = 0; l < 2; l++) {
		const struct mbp__weights *w32 = &m[0]->current->lw[l], *w16 = &m[1]->current->lw[l],
					  *wb = &m[2]->current->lw[l];
		const struct mbp__layer *ly = &m[0]->l[l];
		for (uint32_t i = 0; i < ly->in * ly->out; i++) {
			ck_assert_float_eq(w16->w[i], mbp__f16_to_f32(mbp__f32_to_f16(w32->w[i])));
			ck_assert_float_eq(wb->w[i], mbp__bf16_to_f32(mbp__f32_to_bf16(w32->w[i])));
		}
		for (uint32_t i = 0; i < ly->out; i++) {
			ck_assert_float_eq(w16->b[i], mbp__f16_to_f32(mbp__f32_to_f16(w32->b[i])));
			ck_assert_float_eq(wb->b[i], mbp__bf16_to_f32(mbp__f32_to_bf16(w32->b[i])));
		}
		ck_assert(ly->norm == (l == 0));
		if (ly->norm)
			for (uint32_t i = 0; i < ly->out; i++) {
				ck_assert_float_eq(w16->g[i], mbp__f16_to_f32(mbp__f32_to_f16(w32->g[i])));
				ck_assert_float_eq(wb->beta[i],
						   mbp__bf16_to_f32(mbp__f32_to_bf16(w32->beta[i])));
			}
	}
	for (int d = 0; d < 3; d++)
		mbp_model_destroy(m[d]);
}
END_TEST

/* ---- digests ---- */

START_TEST(eight_bytes_overwritten_in_a_tensor_are_refused_naming_the_file_and_the_tensor)
{
	uint32_t widths[] = {16, 32, 8, 4};
	mbp_model_spec sp = {.layers = 3, .widths = widths, .act = MBP_ACT_RELU, .seed = 7};
	ck_assert_int_eq(mbp_model_write_random(path, &sp), 0);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load(&m, path, &e) == 0, "%s", e.msg);
	ck_assert(mbp_model_verified(m));
	mbp_model_destroy(m);
	/* layer 1's weight starts after layer 0's weight and bias: 16 x 32 x 4 + 32 x 4 bytes */
	st_overwrite8(path, 16 * 32 * 4 + 32 * 4 + 100);
	m = (mbp_model *)(uintptr_t)1;
	ck_assert_int_eq(mbp_model_load(&m, path, &e), -EBADMSG);
	ck_assert_ptr_null(m);
	ck_assert_int_eq(e.rule, MBP_LOAD_DIGEST);
	ck_assert_str_eq(e.tensor, "layers.1.weight");
	ck_assert_msg(strstr(e.msg, path) && strstr(e.msg, "do not match the file's digest"), "%s", e.msg);
	int fd = open(path, O_RDONLY);
	ck_assert_int_eq(mbp_model_load_fd(&m, fd, "named", NULL, &e), -EBADMSG);
	ck_assert_msg(strncmp(e.msg, "named: ", 7) == 0, "%s", e.msg);
	close(fd);
	/* a part reads and checks its own tensors only: layer 0 is intact, layer 1 is not */
	ck_assert_msg(mbp_model_load_layers(&m, path, 0, 1, &e) == 0, "%s", e.msg);
	ck_assert(mbp_model_verified(m));
	mbp_model_destroy(m);
	ck_assert_int_eq(mbp_model_load_layers(&m, path, 1, 2, &e), -EBADMSG);
	ck_assert_str_eq(e.tensor, "layers.1.weight");
	/* the same for a trainable model's checkpoint: its weights and its optimizer state */
	mbp_mlp *n;
	ck_assert_int_eq(mbp_mlp_load(&n, path, NULL, &e), -EBADMSG);
	mbp_model_spec ts = {.layers = 2, .in = 8, .hidden = 16, .out = 4, .act = MBP_ACT_RELU, .seed = 2};
	ck_assert_int_eq(mbp_mlp_new_random(&n, &ts, NULL), 0);
	char opt[160];
	snprintf(opt, sizeof opt, "%s/m.optim.safetensors", dir);
	ck_assert_int_eq(mbp_mlp_save(n, path), 0);
	ck_assert_int_eq(mbp_mlp_save_optim(n, opt), 0);
	ck_assert_msg(mbp_mlp_load_optim(n, opt, &e) == 0, "%s", e.msg);
	st_overwrite8(opt, 8);
	ck_assert_int_eq(mbp_mlp_load_optim(n, opt, &e), -EBADMSG);
	ck_assert_int_eq(e.rule, MBP_LOAD_DIGEST);
	ck_assert_msg(strstr(e.msg, opt) && strstr(e.msg, "layers.0.weight.m"), "%s", e.msg);
	mbp_mlp_destroy(n);
	unlink(opt);
}
END_TEST

/* A file without digests (another tool's): it loads, and says it was not verified. */
START_TEST(a_file_without_digests_loads_the_same_weights_unverified)
{
	mbp_model_error e;
	ck_assert(!mbp_model_verified(NULL));
	mbp_model_spec sp = {.layers = 2, .in = 8, .hidden = 6, .out = 5, .norm = true, .seed = 3};
	ck_assert_int_eq(mbp_model_write_random(path, &sp), 0);
	char bare[160];
	snprintf(bare, sizeof bare, "%s/bare.safetensors", dir);
	st_copy_without_digests(path, bare);
	mbp_model *a, *b;
	ck_assert_int_eq(mbp_model_load(&a, path, NULL), 0);
	ck_assert_msg(mbp_model_load(&b, bare, &e) == 0, "%s", e.msg);
	ck_assert(mbp_model_verified(a) && !mbp_model_verified(b));
	float x[8] = {1, -2, 3, -4, 5, -6, 7, -8}, ya[5], yb[5];
	ck_assert_int_eq(mbp_model_forward(a, x, ya, 1, 0), 0);
	ck_assert_int_eq(mbp_model_forward(b, x, yb, 1, 0), 0);
	ck_assert_mem_eq(ya, yb, sizeof ya);
	mbp_model_destroy(a);
	mbp_model_destroy(b);
	unlink(bare);
}
END_TEST

START_TEST(digests_on_some_tensors_only_or_not_hexadecimal_are_refused)
{
	const char *some = "{\"__metadata__\":{\"layers.0.weight.crc32\":\"00000000\"}," W2 "," B2 "}";
	write_raw(UINT64_MAX, some, strlen(some), NULL, 24);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_int_eq(mbp_model_load(&m, path, &e), -EBADMSG);
	ck_assert_int_eq(e.rule, MBP_LOAD_DIGEST);
	ck_assert_str_eq(e.tensor, "layers.0.bias");
	const char *hex = "{\"__metadata__\":{\"layers.0.weight.crc32\":\"0000000g\",\"layers.0.bias.crc32\":"
			  "\"00000000\"}," W2 "," B2 "}";
	write_raw(UINT64_MAX, hex, strlen(hex), NULL, 24);
	ck_assert_int_eq(mbp_model_load(&m, path, &e), -EBADMSG);
	ck_assert_int_eq(e.rule, MBP_LOAD_DIGEST);
	ck_assert_str_eq(e.tensor, "layers.0.weight");
	/* right digests load; a key of that shape for no tensor is other metadata, ignored */
	char hdr[512];
	snprintf(hdr, sizeof hdr,
		 "{\"__metadata__\":{\"layers.0.weight.crc32\":\"%08x\",\"layers.0.bias.crc32\":\"%08x\","
		 "\"other.crc32\":\"xyz\"}," W2 "," B2 "}",
		 mbp__crc32(0, (const uint8_t[16]){0}, 16), mbp__crc32(0, (const uint8_t[8]){0}, 8));
	write_raw(UINT64_MAX, hdr, strlen(hdr), NULL, 24);
	ck_assert_msg(mbp_model_load(&m, path, &e) == 0, "%s", e.msg);
	ck_assert(mbp_model_verified(m));
	mbp_model_destroy(m);
}
END_TEST

/* ---- what a refusal shows ---- */

START_TEST(a_file_that_is_not_a_model_is_refused_in_words_that_show_none_of_its_bytes)
{
	static const char secret[] = "SECRET_TOKEN=Zq8vX2kLp9Wm\npassword: hunter2xyz\n";
	struct {
		uint64_t hlen; /* UINT64_MAX: none, the file is the text alone */
		const char *header;
		size_t extra; /* zero bytes after it */
		mbp_load_rule rule;
	} cases[] = {
	    {UINT64_MAX, secret, 0, MBP_ST_HEADER_TOO_LARGE}, /* its first 8 bytes as a length */
	    {1000, "{} SECRET_TOKEN=Zq8vX2kLp9Wm", 0, MBP_ST_HEADER_LENGTH}, /* the length past the end */
	    {0, secret, 0, MBP_ST_HEADER_START},
	    {0, "{\"SECRET_TOKEN\": Zq8vX2kLp9Wm}", 0, MBP_ST_HEADER_JSON},
	    {0, "{\"SECRET_TOKEN\": \"Zq8vX2kLp9Wm\"} hunter2xyz", 0, MBP_ST_HEADER_JSON},
	    {0, "{\"SECRET\xff_TOKEN\": 1}", 0, MBP_ST_HEADER_UTF8},
	    /* past the JSON syntax the tensor is named, the values of its entry are not */
	    {0, "{\"x\":{\"dtype\":\"Zq8vX2kLp9Wm\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, MBP_ST_DTYPE},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *hd = cases[i].header;
		size_t hn = strlen(hd);
		uint8_t file[256];
		size_t len = 0;
		if (cases[i].hlen == UINT64_MAX) {
			memcpy(file, hd, hn);
			len = hn;
		} else {
			uint64_t le = htole64(cases[i].hlen ? cases[i].hlen : hn);
			memcpy(file, &le, 8);
			memcpy(file + 8, hd, hn);
			len = 8 + hn;
		}
		memset(file + len, 0, cases[i].extra);
		len += cases[i].extra;
		FILE *f = fopen(path, "wb");
		ck_assert_uint_eq(fwrite(file, 1, len, f), len);
		ck_assert_int_eq(fclose(f), 0);
		mbp_model *m;
		mbp_model_error e;
		int rc = mbp_model_load(&m, path, &e);
		ck_assert_msg(rc < 0 && e.rule == cases[i].rule, "case %zu: rule %s: %s", i,
			      mbp_load_rule_str(e.rule), e.msg);
		if (cases[i].rule == MBP_ST_DTYPE) { /* a safetensors header: its words are the format's */
			ck_assert_msg(!strstr(e.msg, "Zq8vX2kLp9Wm"), "case %zu: %s", i, e.msg);
			continue;
		}
		ck_assert_msg(!shows_file_bytes(e.msg, file, len, path), "case %zu shows the file: %s", i,
			      e.msg);
		ck_assert_str_eq(e.tensor, "");
		ck_assert_msg(strstr(e.msg, "not a safetensors file"), "case %zu: %s", i, e.msg);
		/* the parser alone, as a fuzzer feeds it, says the same */
		mbp__st st;
		ck_assert_int_lt(mbp__st_parse(file, len, &st, &e), 0);
		ck_assert_msg(!shows_file_bytes(e.msg, file, len, NULL), "case %zu: %s", i, e.msg);
	}
}
END_TEST

START_TEST(a_name_with_control_characters_is_shown_without_them)
{
	const char *h =
	    "{\"layers.0.weight\\u001b[31m\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
	write_raw(UINT64_MAX, h, strlen(h), NULL, 4);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_int_eq(mbp_model_load(&m, path, &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_MODEL_UNKNOWN_TENSOR);
	for (const char *c = e.msg; *c; c++)
		ck_assert_msg((unsigned char)*c >= 0x20, "control character in %s", e.msg);
	ck_assert_msg(strstr(e.msg, "'layers.0.weight?[31m'"), "%s", e.msg);
	ck_assert_str_eq(e.tensor, "layers.0.weight?[31m");
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc = tcase_create("load");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, valid_generated_file_loads_and_describes_its_layers);
	tcase_add_test(tc, hand_written_minimal_file_loads);
	tcase_add_loop_test(tc, each_broken_rule_fails_with_its_own_error_naming_the_tensor, 0,
			    (int)(sizeof(bad) / sizeof(bad[0])));
	tcase_add_test(tc, every_rule_has_distinct_text);
	tcase_add_test(tc, short_file_and_missing_file_fail);
	tcase_add_test(tc, reader_accepts_what_the_reference_accepts);
	tcase_add_test(tc, f16_bf16_and_unaligned_f32_files_load_to_the_same_weights);
	tcase_add_test(tc, generated_f16_and_bf16_files_hold_the_rounded_f32_weights);
	suite_add_tcase(s, tc);
	TCase *dg = tcase_create("digests");
	tcase_add_checked_fixture(dg, setup, teardown);
	tcase_add_test(dg, eight_bytes_overwritten_in_a_tensor_are_refused_naming_the_file_and_the_tensor);
	tcase_add_test(dg, a_file_without_digests_loads_the_same_weights_unverified);
	tcase_add_test(dg, digests_on_some_tensors_only_or_not_hexadecimal_are_refused);
	tcase_add_test(dg, a_file_that_is_not_a_model_is_refused_in_words_that_show_none_of_its_bytes);
	tcase_add_test(dg, a_name_with_control_characters_is_shown_without_them);
	suite_add_tcase(s, dg);
	TCase *cv = tcase_create("convert");
	tcase_add_test(cv, f16_converts_exactly);
	tcase_add_test(cv, bf16_converts_exactly);
	suite_add_tcase(s, cv);
	return s;
}

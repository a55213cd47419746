/*
 * Open Inference Protocol messages: see oip.h.
 *
 * The infer parser checks, in this order: the binary header length, the JSON, the request's "id" and
 * "parameters", the one input (name, datatype, shape, then data either as JSON or as binary), the requested
 * outputs, and that the binary section was consumed exactly. Every failure is a 400 with a message naming
 * what was wrong, except a request with more rows than the server takes (413). Nothing here trusts a size
 * from the request before checking it against the bytes actually received, and the JSON text's values are
 * counted (json_values_bound) before cJSON makes a node of each; the same pass refuses a string that holds
 * \u0000, which cJSON would hand back as a C string cut at the NUL.
 */
#include "config.h"

#include "oip.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/number.h"

/* ---- buffer ---- */

void ps_buf_free(ps_buf *b)
{
	free(b->p);
	*b = (ps_buf){0};
}

static bool buf_reserve(ps_buf *b, size_t n)
{
	if (b->oom)
		return false;
	if (b->len + n + 1 <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->len + n + 1) {
		if (cap > SIZE_MAX / 2) {
			b->oom = true;
			return false;
		}
		cap *= 2;
	}
	char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

void ps_buf_add(ps_buf *b, const void *data, size_t n)
{
	if (!buf_reserve(b, n))
		return;
	if (n)
		memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void ps_buf_adds(ps_buf *b, const char *s)
{
	ps_buf_add(b, s, strlen(s));
}

void ps_buf_printf(ps_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char small[256];
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->oom = true;
		return;
	}
	if ((size_t)n < sizeof small) {
		ps_buf_add(b, small, (size_t)n);
		return;
	}
	if (!buf_reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when the bytes there are not one (overlong forms,
 * surrogates and code points above U+10FFFF included). */
static size_t utf8_seq(const unsigned char *s)
{
	unsigned c = s[0];
	if (c < 0x80)
		return 1;
	size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
	if (!n || c > 0xf4)
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
	    (c == 0xf4 && s[1] > 0x8f))
		return 0;
	return n;
}

void ps_buf_add_json_string(ps_buf *b, const char *s)
{
	/* Whatever the bytes (a name from a request, a file name): quotes, backslashes and control characters
	 * are escaped, and bytes that are not UTF-8 become U+FFFD, so the result is always valid JSON. */
	ps_buf_add(b, "\"", 1);
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		size_t n = utf8_seq(p);
		if (n == 0) {
			ps_buf_adds(b, "\\ufffd");
			p++;
		} else if (*p == '"' || *p == '\\') {
			ps_buf_add(b, "\\", 1);
			ps_buf_add(b, p++, 1);
		} else if (*p < 0x20 || *p == 0x7f) {
			ps_buf_printf(b, "\\u%04x", *p++);
		} else {
			ps_buf_add(b, p, n);
			p += n;
		}
	}
	ps_buf_add(b, "\"", 1);
}

/* ---- parsing ---- */

#define FAIL(status, ...)                                                                                    \
	do {                                                                                                 \
		snprintf(err, errlen, __VA_ARGS__);                                                          \
		return (status);                                                                             \
	} while (0)

long long ps_oip_parse_header_len(const char *s, size_t body_len)
{
	uint64_t v;
	return parse_u64(s, 0, body_len, &v) ? -1 : (long long)v; /* digits only: no sign, no space */
}

/* A JSON number that is a whole number in [0, max]. */
static bool json_uint(const cJSON *n, double max, uint64_t *out)
{
	if (!cJSON_IsNumber(n))
		return false;
	double v = n->valuedouble;
	if (!(v >= 0 && v <= max) || v != floor(v))
		return false;
	*out = (uint64_t)v;
	return true;
}

/* Store one JSON value as a float: numbers only, finite and within float range. */
static int put_number(const cJSON *v, float *dst, size_t *pos, size_t total, char *err, size_t errlen)
{
	if (!cJSON_IsNumber(v))
		FAIL(400, "input data must be numbers (found a non-numeric element)");
	double d = v->valuedouble;
	if (!isfinite(d) || fabs(d) > FLT_MAX)
		FAIL(400, "input data element out of FP32 range (finite FP32 numbers only)");
	if (*pos >= total)
		FAIL(400, "input data has more elements than its shape");
	dst[(*pos)++] = (float)d;
	return 0;
}

/*
 * Data nested to the shape's rank: at depth d every array has shape[d] elements, numbers at the last
 * depth. cJSON already bounds the nesting of what it parsed (CJSON_NESTING_LIMIT), and depth here never
 * exceeds the rank (2).
 */
static int put_nested(const cJSON *arr, const uint64_t *shape, int rank, int depth, float *dst, size_t *pos,
		      size_t total, char *err, size_t errlen)
{
	if (!cJSON_IsArray(arr))
		FAIL(400, "input data does not match its shape (expected an array at depth %d)", depth);
	if ((uint64_t)cJSON_GetArraySize(arr) != shape[depth])
		FAIL(400, "input data does not match its shape (dimension %d)", depth);
	const cJSON *e;
	cJSON_ArrayForEach(e, arr)
	{
		int rc = depth + 1 < rank
			     ? put_nested(e, shape, rank, depth + 1, dst, pos, total, err, errlen)
			     : put_number(e, dst, pos, total, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

static int parse_data(const cJSON *data, const uint64_t *shape, int rank, float *dst, size_t total, char *err,
		      size_t errlen)
{
	if (!cJSON_IsArray(data))
		FAIL(400, "input \"data\" must be an array");
	size_t pos = 0;
	const cJSON *first = data->child;
	if (first && cJSON_IsArray(first)) {
		int rc = put_nested(data, shape, rank, 0, dst, &pos, total, err, errlen);
		if (rc)
			return rc;
	} else {
		const cJSON *e;
		cJSON_ArrayForEach(e, data)
		{
			int rc = put_number(e, dst, &pos, total, err, errlen);
			if (rc)
				return rc;
		}
	}
	if (pos != total)
		FAIL(400, "input data has %zu elements, its shape needs %zu", pos, total);
	return 0;
}

/* The "binary_data_size" parameter of a tensor, or -1 when absent; -2 when present but malformed. */
static long long binary_size_param(const cJSON *tensor)
{
	const cJSON *params = cJSON_GetObjectItemCaseSensitive(tensor, "parameters");
	if (!params)
		return -1;
	if (!cJSON_IsObject(params))
		return -2;
	const cJSON *bs = cJSON_GetObjectItemCaseSensitive(params, "binary_data_size");
	if (!bs)
		return -1;
	uint64_t v;
	if (!json_uint(bs, 9e15, &v))
		return -2;
	return (long long)v;
}

static int parse_input(const ps_model_info *mi, const cJSON *in, size_t json_len, const char *bin,
		       size_t bin_len, size_t *bin_pos, ps_infer_req *rq, char *err, size_t errlen)
{
	if (!cJSON_IsObject(in))
		FAIL(400, "each input must be an object");
	const cJSON *name = cJSON_GetObjectItemCaseSensitive(in, "name");
	if (!cJSON_IsString(name))
		FAIL(400, "input \"name\" missing or not a string");
	if (strcmp(name->valuestring, mi->input_name) != 0)
		FAIL(400, "unknown input \"%.64s\" (the model's input is \"%s\")", name->valuestring,
		     mi->input_name);
	if (rq->in)
		FAIL(400, "input \"%s\" given twice", mi->input_name);

	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(in, "datatype");
	if (!cJSON_IsString(dt))
		FAIL(400, "input \"datatype\" missing or not a string");
	if (strcmp(dt->valuestring, "FP32") != 0)
		FAIL(400, "input datatype \"%.32s\" not supported (expected FP32)", dt->valuestring);

	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(in, "shape");
	if (!cJSON_IsArray(sh))
		FAIL(400, "input \"shape\" missing or not an array");
	if (cJSON_GetArraySize(sh) != 2)
		FAIL(400, "input shape must be [N, %zu]", mi->in_width);
	uint64_t shape[2];
	for (int i = 0; i < 2; i++)
		if (!json_uint(cJSON_GetArrayItem(sh, i), 4294967295.0, &shape[i]))
			FAIL(400, "input shape must hold non-negative integers");
	if (shape[1] != mi->in_width)
		FAIL(400, "input shape [%llu, %llu] does not match the model's [-1, %zu]",
		     (unsigned long long)shape[0], (unsigned long long)shape[1], mi->in_width);
	if (shape[0] == 0)
		FAIL(400, "input has no rows");
	if (shape[0] > mi->max_rows)
		FAIL(413, "request has %llu rows, the limit is %zu", (unsigned long long)shape[0],
		     mi->max_rows);
	rq->rows = (size_t)shape[0];
	size_t total = rq->rows * mi->in_width; /* rows <= max_rows, a small bound: no overflow */

	long long bsize = binary_size_param(in);
	const cJSON *data = cJSON_GetObjectItemCaseSensitive(in, "data");
	if (bsize == -2)
		FAIL(400, "input \"parameters\" malformed (binary_data_size must be a non-negative integer)");
	if (bsize >= 0) {
		if (!bin)
			FAIL(400, "binary_data_size given without an Inference-Header-Content-Length header");
		if (data)
			FAIL(400, "input has both \"data\" and binary_data_size");
		if ((unsigned long long)bsize != total * sizeof(float))
			FAIL(400, "binary_data_size %lld does not match shape (%zu bytes of FP32)", bsize,
			     total * sizeof(float));
		if ((size_t)bsize > bin_len - *bin_pos)
			FAIL(400, "binary data shorter than binary_data_size");
		/* The same rule as for JSON data (put_number): finite FP32 only. */
		for (size_t i = 0; i < total; i++) {
			float f;
			memcpy(&f, bin + *bin_pos + i * sizeof f, sizeof f);
			if (!isfinite(f))
				FAIL(400,
				     "input data element %zu is not a finite FP32 number (NaN or infinity)",
				     i);
		}
		rq->in = bin + *bin_pos;
		*bin_pos += (size_t)bsize;
		return 0;
	}
	if (!data)
		FAIL(400, "input has no \"data\"");
	/* Every number takes at least one byte of the JSON text: a shape that promises more elements than
	 * that is refused before its buffer is allocated. */
	if (total > json_len)
		FAIL(400, "input data has fewer elements than its shape");
	rq->owned = malloc(total * sizeof(float));
	if (!rq->owned)
		FAIL(413, "request too large for memory");
	int rc = parse_data(data, shape, 2, rq->owned, total, err, errlen);
	if (rc)
		return rc;
	rq->in = rq->owned;
	return 0;
}

static int parse_outputs(const ps_model_info *mi, const cJSON *outs, bool all_binary, ps_infer_req *rq,
			 char *err, size_t errlen)
{
	rq->want_output = true;
	rq->binary_output = all_binary;
	if (!outs)
		return 0;
	if (!cJSON_IsArray(outs))
		FAIL(400, "\"outputs\" must be an array");
	rq->want_output = false;
	const cJSON *o;
	cJSON_ArrayForEach(o, outs)
	{
		if (!cJSON_IsObject(o))
			FAIL(400, "each requested output must be an object");
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
		if (!cJSON_IsString(name))
			FAIL(400, "requested output \"name\" missing or not a string");
		if (strcmp(name->valuestring, mi->output_name) != 0)
			FAIL(400, "unknown output \"%.64s\" (the model's output is \"%s\")",
			     name->valuestring, mi->output_name);
		if (rq->want_output)
			FAIL(400, "output \"%s\" requested twice", mi->output_name);
		rq->want_output = true;
		const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
		if (params && !cJSON_IsObject(params))
			FAIL(400, "output \"parameters\" must be an object");
		const cJSON *bd = params ? cJSON_GetObjectItemCaseSensitive(params, "binary_data") : NULL;
		if (bd && !cJSON_IsBool(bd))
			FAIL(400, "output parameter binary_data must be a boolean");
		if (bd)
			rq->binary_output = cJSON_IsTrue(bd);
	}
	return 0;
}

static int parse_root(const ps_model_info *mi, const cJSON *root, size_t json_len, const char *bin,
		      size_t bin_len, ps_infer_req *rq, char *err, size_t errlen)
{
	if (!cJSON_IsObject(root))
		FAIL(400, "request must be a JSON object");
	const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
	if (id) {
		if (!cJSON_IsString(id))
			FAIL(400, "\"id\" must be a string");
		rq->id = strdup(id->valuestring);
		if (!rq->id)
			FAIL(413, "request too large for memory");
	}
	bool all_binary = false;
	const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "parameters");
	if (params) {
		if (!cJSON_IsObject(params))
			FAIL(400, "\"parameters\" must be an object");
		const cJSON *bo = cJSON_GetObjectItemCaseSensitive(params, "binary_data_output");
		if (bo && !cJSON_IsBool(bo))
			FAIL(400, "parameter binary_data_output must be a boolean");
		all_binary = cJSON_IsTrue(bo);
	}
	const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(root, "inputs");
	if (!cJSON_IsArray(inputs))
		FAIL(400, "\"inputs\" missing or not an array");
	size_t bin_pos = 0;
	const cJSON *in;
	cJSON_ArrayForEach(in, inputs)
	{
		int rc = parse_input(mi, in, json_len, bin, bin_len, &bin_pos, rq, err, errlen);
		if (rc)
			return rc;
	}
	if (!rq->in)
		FAIL(400, "input \"%s\" missing", mi->input_name);
	if (bin && bin_pos != bin_len)
		FAIL(400, "binary data has %zu bytes beyond the inputs' binary_data_size", bin_len - bin_pos);
	return parse_outputs(mi, cJSON_GetObjectItemCaseSensitive(root, "outputs"), all_binary, rq, err,
			     errlen);
}

/*
 * An upper bound on the JSON values of a text, without parsing it: commas, '[' and '{' outside strings
 * (each value but the first of a container follows a comma). Stops at limit + 1. cJSON makes a node of
 * about 64 bytes per value, so a text of small numbers costs some 30 times its size: this bounds that
 * before cJSON builds anything. The same pass sets *nul when a string holds the escape \u0000: cJSON
 * decodes it into a C string that ends there, so "B.safetensors\u0000/x" would read as "B.safetensors".
 */
static size_t json_values_bound(const char *p, size_t n, size_t limit, bool *nul)
{
	size_t k = 1;
	bool in_str = false;
	*nul = false;
	for (size_t i = 0; i < n && k <= limit; i++) {
		char c = p[i];
		if (in_str) {
			if (c == '\\') {
				if (i + 5 < n && p[i + 1] == 'u' && memcmp(p + i + 2, "000", 3) == 0 &&
				    p[i + 5] == '0')
					*nul = true;
				i++;
			} else if (c == '"') {
				in_str = false;
			}
		} else if (c == '"') {
			in_str = true;
		} else if (c == ',' || c == '[' || c == '{') {
			k++;
		}
	}
	return k;
}

#define NUL_MSG "a JSON string holds \\u0000 (NUL), which no name or id may hold"

int ps_oip_parse_infer(const ps_model_info *mi, const char *body, size_t len, long long header_len,
		       ps_infer_req *rq, char *err, size_t errlen)
{
	*rq = (ps_infer_req){0};
	size_t json_len = len;
	const char *bin = NULL;
	size_t bin_len = 0;
	if (header_len >= 0) {
		if ((unsigned long long)header_len > len) {
			snprintf(err, errlen, "Inference-Header-Content-Length exceeds the body");
			return 400;
		}
		json_len = (size_t)header_len;
		bin = body + json_len;
		bin_len = len - json_len;
	}
	if (json_len == 0) {
		snprintf(err, errlen, "empty request body");
		return 400;
	}
	/* The largest request the server takes, plus room for everything around its data. */
	size_t limit = mi->max_rows * mi->in_width + 4096;
	bool nul;
	if (json_values_bound(body, json_len, limit, &nul) > limit) {
		snprintf(err, errlen,
			 "request holds more JSON values than the largest request taken (%zu rows)",
			 mi->max_rows);
		return 413;
	}
	if (nul) {
		snprintf(err, errlen, NUL_MSG);
		return 400;
	}
	cJSON *root = cJSON_ParseWithLength(body, json_len);
	if (!root) {
		snprintf(err, errlen, "malformed JSON");
		return 400;
	}
	int rc = parse_root(mi, root, json_len, bin, bin_len, rq, err, errlen);
	cJSON_Delete(root);
	if (rc)
		ps_infer_req_clear(rq);
	return rc;
}

void ps_infer_req_clear(ps_infer_req *rq)
{
	free(rq->id);
	free(rq->owned);
	*rq = (ps_infer_req){0};
}

bool ps_has_control(const char *s)
{
	for (const unsigned char *c = (const unsigned char *)s; *c; c++)
		if (*c < 0x20 || *c == 0x7f)
			return true;
	return false;
}

int ps_oip_parse_load(const char *body, size_t len, char **file, char *err, size_t errlen)
{
	*file = NULL;
	if (len == 0)
		return 0;
	/* A load request is a handful of values: a text of more is refused before cJSON makes a node of each. */
	bool nul;
	if (json_values_bound(body, len, 64, &nul) > 64)
		FAIL(400, "load request must be {\"parameters\": {\"file\": \"NAME\"}}");
	if (nul)
		FAIL(400, NUL_MSG);
	cJSON *root = cJSON_ParseWithLength(body, len);
	if (!root)
		FAIL(400, "malformed JSON");
	int rc = 0;
	const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "parameters");
	const cJSON *f = params ? cJSON_GetObjectItemCaseSensitive(params, "file") : NULL;
	if (!cJSON_IsObject(root) || (params && !cJSON_IsObject(params))) {
		snprintf(err, errlen, "load request must be {\"parameters\": {\"file\": \"NAME\"}}");
		rc = 400;
	} else if (cJSON_GetObjectItemCaseSensitive(params, "path")) {
		snprintf(
		    err, errlen,
		    "parameter \"path\" is not accepted: name a file of the model repository with \"file\"");
		rc = 400;
	} else if (f && (!cJSON_IsString(f) || !*f->valuestring)) {
		snprintf(err, errlen, "parameter \"file\" must be a non-empty string");
		rc = 400;
	} else if (f && ps_has_control(f->valuestring)) {
		snprintf(err, errlen, "parameter \"file\" holds a control character");
		rc = 400;
	} else if (f && !(*file = strdup(f->valuestring))) {
		snprintf(err, errlen, "out of memory");
		rc = 400;
	}
	cJSON_Delete(root);
	return rc;
}

/* ---- encoding ---- */

static void add_floats(ps_buf *b, const float *v, size_t n)
{
	/* "%.9g" round-trips every finite float; JSON has no NaN or infinity, so those become null. A float
	 * prints in at most 15 characters plus a comma: reserve once per call, write in place. */
	if (!buf_reserve(b, n * 16 + 2))
		return;
	char *p = b->p + b->len;
	*p++ = '[';
	for (size_t i = 0; i < n; i++) {
		if (i)
			*p++ = ',';
		if (isfinite(v[i]))
			p += snprintf(p, 16, "%.9g", (double)v[i]);
		else {
			memcpy(p, "null", 4);
			p += 4;
		}
	}
	*p++ = ']';
	*p = '\0';
	b->len = (size_t)(p - b->p);
}

int ps_oip_encode_infer(const ps_model_info *mi, const ps_infer_req *rq, const float *out, ps_buf *b,
			size_t *json_len)
{
	ps_buf_adds(b, "{\"model_name\":");
	ps_buf_add_json_string(b, mi->name);
	ps_buf_adds(b, ",\"model_version\":");
	ps_buf_add_json_string(b, mi->version);
	if (rq->id) {
		ps_buf_adds(b, ",\"id\":");
		ps_buf_add_json_string(b, rq->id);
	}
	ps_buf_adds(b, ",\"outputs\":[");
	size_t n = rq->rows * mi->out_width;
	if (rq->want_output) {
		ps_buf_adds(b, "{\"name\":");
		ps_buf_add_json_string(b, mi->output_name);
		ps_buf_printf(b, ",\"datatype\":\"FP32\",\"shape\":[%zu,%zu],", rq->rows, mi->out_width);
		if (rq->binary_output) {
			ps_buf_printf(b, "\"parameters\":{\"binary_data_size\":%zu}}", n * sizeof(float));
		} else {
			ps_buf_adds(b, "\"data\":");
			add_floats(b, out, n);
			ps_buf_adds(b, "}");
		}
	}
	ps_buf_adds(b, "]}");
	*json_len = b->len;
	if (rq->want_output && rq->binary_output)
		ps_buf_add(b, out, n * sizeof(float));
	return b->oom ? -ENOMEM : 0;
}

int ps_oip_encode_error(ps_buf *b, const char *msg)
{
	ps_buf_adds(b, "{\"error\":");
	ps_buf_add_json_string(b, msg);
	ps_buf_adds(b, "}");
	return b->oom ? -ENOMEM : 0;
}

static void add_tensor_meta(ps_buf *b, const char *name, size_t width)
{
	ps_buf_adds(b, "{\"name\":");
	ps_buf_add_json_string(b, name);
	ps_buf_printf(b, ",\"datatype\":\"FP32\",\"shape\":[-1,%zu]}", width);
}

int ps_oip_encode_model_metadata(const ps_model_info *mi, ps_buf *b)
{
	ps_buf_adds(b, "{\"name\":");
	ps_buf_add_json_string(b, mi->name);
	ps_buf_adds(b, ",\"versions\":[");
	ps_buf_add_json_string(b, mi->version);
	ps_buf_adds(b, "],\"platform\":");
	ps_buf_add_json_string(b, mi->platform);
	ps_buf_adds(b, ",\"inputs\":[");
	add_tensor_meta(b, mi->input_name, mi->in_width);
	ps_buf_adds(b, "],\"outputs\":[");
	add_tensor_meta(b, mi->output_name, mi->out_width);
	ps_buf_adds(b, "]}");
	return b->oom ? -ENOMEM : 0;
}

int ps_oip_encode_server_metadata(const char *version, ps_buf *b)
{
	ps_buf_adds(b, "{\"name\":\"pipeserve\",\"version\":");
	ps_buf_add_json_string(b, version);
	ps_buf_adds(b, ",\"extensions\":[\"binary_tensor_data\",\"model_repository\"]}");
	return b->oom ? -ENOMEM : 0;
}

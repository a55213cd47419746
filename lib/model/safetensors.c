/*
 * The safetensors reader: parse and validate a whole file image, as the format's reference implementation
 * (huggingface/safetensors, `read_metadata` and `Metadata::validate`) does, with one error per rule.
 *
 * Order of the checks: the 8-byte length prefix and its bounds; the header as UTF-8 starting with '{';
 * a lexical pass over the JSON (strict tokens: strings without raw control characters or \u0000, numbers
 * in JSON's grammar, literals) and then cJSON for the structure, with only whitespace after the object;
 * every entry (metadata an object of strings; a tensor an object with dtype, shape and data_offsets of
 * the right types and values, sizes overflow-checked, range inside the data section); duplicate names
 * (cJSON keeps both entries, so they are found after sorting by name); finally the ranges sorted by
 * offset must tile the data section exactly: no gap, no overlap, nothing after the last one.
 *
 * Numbers come from cJSON as doubles: a dimension or offset must be an integer in [0, 2^53], which covers
 * every file this machine can map. Unlike the reference, "1.0" is accepted where an integer is expected.
 *
 * Messages. A file refused before its header is known to be a JSON object (the length prefix, UTF-8, the
 * '{', the JSON syntax) is "not a safetensors file", said in words only: no length, offset, name or byte
 * read from it, because the file may be anything a path or a link names, a secret included, and the message
 * may reach whoever asked for the load. Past that point messages name the header's entries (tensor names,
 * metadata keys, offsets), with control characters shown as '?'.
 */
#include "config.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "safetensors.h"

/* ---- errors ---- */

static const struct {
	const char *text;
	int err;
} rules[] = {
    [MBP_LOAD_OK] = {"success", 0},
    [MBP_LOAD_IO] = {"cannot read the file", -EIO},
    [MBP_ST_HEADER_TOO_SMALL] = {"not a safetensors file: shorter than the 8-byte header length", -EBADMSG},
    [MBP_ST_HEADER_TOO_LARGE] = {"not a safetensors file: header length above 100000000 bytes", -E2BIG},
    [MBP_ST_HEADER_LENGTH] = {"not a safetensors file: header length beyond the end of the file", -ERANGE},
    [MBP_ST_HEADER_UTF8] = {"not a safetensors file: header is not valid UTF-8", -EBADMSG},
    [MBP_ST_HEADER_START] = {"not a safetensors file: header does not start with '{'", -EBADMSG},
    [MBP_ST_HEADER_JSON] = {"not a safetensors file: header is not a valid JSON object", -EBADMSG},
    [MBP_ST_DUPLICATE] = {"duplicate name", -EEXIST},
    [MBP_ST_METADATA] = {"__metadata__ is not an object of strings", -EPROTO},
    [MBP_ST_TENSOR_INFO] = {"tensor entry is not {dtype, shape, data_offsets}", -EPROTO},
    [MBP_ST_DTYPE] = {"unknown dtype", -ENOTSUP},
    [MBP_ST_SHAPE] = {"invalid shape", -EDOM},
    [MBP_ST_OVERFLOW] = {"tensor size overflows", -EOVERFLOW},
    [MBP_ST_OFFSETS] = {"invalid data_offsets", -EINVAL},
    [MBP_ST_SIZE] = {"byte range does not match shape x dtype size", -EPROTO},
    [MBP_ST_OUT_OF_BOUNDS] = {"byte range beyond the data section", -EFAULT},
    [MBP_ST_GAP] = {"gap before the tensor's byte range", -ERANGE},
    [MBP_ST_OVERLAP] = {"byte range overlaps the previous tensor's", -ERANGE},
    [MBP_ST_FILE_SIZE] = {"file size does not match the tensors (bytes after the last one)", -EBADMSG},
    [MBP_MODEL_NO_LAYERS] = {"no layers.0.weight", -ENOENT},
    [MBP_MODEL_MISSING] = {"required tensor missing", -ENOENT},
    [MBP_MODEL_UNKNOWN_TENSOR] = {"unexpected tensor name", -EINVAL},
    [MBP_MODEL_DTYPE] = {"dtype not F32, F16 or BF16", -ENOTSUP},
    [MBP_MODEL_SHAPE] = {"tensor shape does not fit the layer chain", -EINVAL},
    [MBP_MODEL_ACTIVATION] = {"invalid model metadata", -EINVAL},
    [MBP_MODEL_TOO_MANY] = {"too many layers", -E2BIG},
    [MBP_LOAD_NOMEM] = {"out of memory", -ENOMEM},
    [MBP_LOAD_NOT_REGULAR] = {"not a regular file", -EINVAL},
    [MBP_LOAD_TOO_LARGE] = {"file larger than the bound", -EFBIG},
    [MBP_LOAD_TIMEOUT] = {"reading the file took longer than the bound", -ETIMEDOUT},
    [MBP_LOAD_DIGEST] = {"tensor bytes do not match the file's digest", -EBADMSG},
    [MBP_MODEL_STRUCTURE] = {"layer structure is not the one expected", -EINVAL},
};

const char *mbp_load_rule_str(mbp_load_rule rule)
{
	if ((unsigned)rule >= sizeof(rules) / sizeof(rules[0]) || !rules[rule].text)
		return "unknown rule";
	return rules[rule].text;
}

int mbp__load_rule_errno(mbp_load_rule rule)
{
	if ((unsigned)rule >= sizeof(rules) / sizeof(rules[0]))
		return -EINVAL;
	return rules[rule].err;
}

/* Bytes of a message that would not print as themselves (control characters: a name in a header may hold
 * any, through JSON's \u escapes) become '?', so that a message is one line that a terminal or a log shows
 * as it is. */
static void printable(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

int mbp__load_fail(mbp_model_error *err, mbp_load_rule rule, const char *tensor, const char *fmt, ...)
{
	int code = mbp__load_rule_errno(rule);
	if (!err)
		return code;
	err->code = code;
	err->rule = rule;
	snprintf(err->tensor, sizeof(err->tensor), "%s", tensor ? tensor : "");
	printable(err->tensor);
	char detail[192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	const char *sep = detail[0] ? ": " : "";
	if (tensor)
		snprintf(err->msg, sizeof(err->msg), "%s (tensor '%s')%s%s", mbp_load_rule_str(rule), tensor,
			 sep, detail);
	else
		snprintf(err->msg, sizeof(err->msg), "%s%s%s", mbp_load_rule_str(rule), sep, detail);
	printable(err->msg);
	return code;
}

/* A file that is not a safetensors file: the rule's words and nothing read from the file (no length, no
 * offset, no byte of it), so that an answer about any file (a secret a link points to) shows none of it. */
static int not_st(mbp_model_error *err, mbp_load_rule rule, const char *words)
{
	return mbp__load_fail(err, rule, NULL, "%s", words);
}

/* ---- dtypes ---- */

static const struct {
	const char *name;
	unsigned size;
} dtypes[MBP__ST_NDTYPES] = {
    [MBP__ST_BOOL] = {"BOOL", 1},	[MBP__ST_U8] = {"U8", 1},	    [MBP__ST_I8] = {"I8", 1},
    [MBP__ST_F8_E5M2] = {"F8_E5M2", 1}, [MBP__ST_F8_E4M3] = {"F8_E4M3", 1}, [MBP__ST_I16] = {"I16", 2},
    [MBP__ST_U16] = {"U16", 2},		[MBP__ST_F16] = {"F16", 2},	    [MBP__ST_BF16] = {"BF16", 2},
    [MBP__ST_I32] = {"I32", 4},		[MBP__ST_U32] = {"U32", 4},	    [MBP__ST_F32] = {"F32", 4},
    [MBP__ST_F64] = {"F64", 8},		[MBP__ST_I64] = {"I64", 8},	    [MBP__ST_U64] = {"U64", 8},
};

const char *mbp__st_dtype_name(int dtype)
{
	return dtype >= 0 && dtype < MBP__ST_NDTYPES ? dtypes[dtype].name : "?";
}

unsigned mbp__st_dtype_size(int dtype)
{
	return dtype >= 0 && dtype < MBP__ST_NDTYPES ? dtypes[dtype].size : 0;
}

/* ---- UTF-8 and the lexical pass ---- */

/* Length of the valid UTF-8 prefix of s (== n when all of it is valid): no overlong forms, no surrogates,
 * nothing above U+10FFFF. */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = s[i];
		size_t k;
		uint32_t cp, min;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			k = 1, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			k = 2, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			k = 3, cp = c & 0x07, min = 0x10000;
		} else {
			return i;
		}
		if (n - i <= k)
			return i;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return i;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return i;
		i += k + 1;
	}
	return n;
}

static bool is_digit(uint8_t c)
{
	return c >= '0' && c <= '9';
}

static int hexval(uint8_t c)
{
	if (is_digit(c))
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Check every token of the header against JSON's grammar (cJSON is lenient about numbers and control
 * characters) and refuse \u0000, which a C string cannot carry. Structure is left to cJSON. Returns the
 * offset of the first bad byte, or n; *why says what is wrong. */
static size_t json_lex(const uint8_t *h, size_t n, const char **why)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = h[i];
		if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '{' || c == '}' || c == '[' ||
		    c == ']' || c == ':' || c == ',') {
			i++;
		} else if (c == '"') {
			for (i++;; i++) {
				if (i >= n) {
					*why = "unterminated string";
					return i;
				}
				c = h[i];
				if (c == '"') {
					i++;
					break;
				}
				if (c < 0x20) {
					*why = "control character in a string";
					return i;
				}
				if (c != '\\')
					continue;
				if (++i >= n) {
					*why = "unterminated escape";
					return i;
				}
				if (strchr("\"\\/bfnrt", h[i]) && h[i])
					continue;
				if (h[i] != 'u' || n - i < 5) {
					*why = "invalid escape";
					return i;
				}
				int v = 0;
				for (int j = 1; j <= 4; j++) {
					int d = hexval(h[i + j]);
					if (d < 0) {
						*why = "invalid \\u escape";
						return i;
					}
					v = v << 4 | d;
				}
				if (v == 0) {
					*why = "\\u0000 in a string is not supported";
					return i;
				}
				i += 4;
			}
		} else if (c == '-' || is_digit(c)) {
			/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
			size_t s = i;
			if (c == '-')
				i++;
			if (i < n && h[i] == '0') {
				i++;
			} else if (i < n && is_digit(h[i])) {
				while (i < n && is_digit(h[i]))
					i++;
			} else {
				*why = "invalid number";
				return s;
			}
			if (i < n && h[i] == '.') {
				if (++i >= n || !is_digit(h[i])) {
					*why = "invalid number";
					return s;
				}
				while (i < n && is_digit(h[i]))
					i++;
			}
			if (i < n && (h[i] == 'e' || h[i] == 'E')) {
				i++;
				if (i < n && (h[i] == '+' || h[i] == '-'))
					i++;
				if (i >= n || !is_digit(h[i])) {
					*why = "invalid number";
					return s;
				}
				while (i < n && is_digit(h[i]))
					i++;
			}
			if (i < n && (is_digit(h[i]) || h[i] == '.' || h[i] == '+' || h[i] == '-' ||
				      h[i] == 'e' || h[i] == 'E')) {
				*why = "invalid number";
				return s;
			}
		} else {
			static const char *const lits[] = {"true", "false", "null"};
			size_t k;
			for (k = 0; k < 3; k++) {
				size_t l = strlen(lits[k]);
				if (n - i >= l && !memcmp(h + i, lits[k], l)) {
					i += l;
					break;
				}
			}
			if (k == 3) {
				*why = "unexpected character";
				return i;
			}
		}
	}
	return n;
}

/* ---- entries ---- */

/* An integer in [0, 2^53] held in a cJSON number. */
static bool json_uint(const cJSON *j, uint64_t *v)
{
	if (!cJSON_IsNumber(j))
		return false;
	double d = j->valuedouble;
	if (!(d >= 0 && d <= 9007199254740992.0) || d != floor(d))
		return false;
	*v = (uint64_t)d;
	return true;
}

static int cmp_meta(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The metadata as key, value pairs sorted by key (mbp__st_meta searches them; a model's file has a few
 * keys per layer), each key once. */
static int parse_metadata(const cJSON *j, mbp__st *st, mbp_model_error *err)
{
	if (cJSON_IsNull(j))
		return 0;
	if (!cJSON_IsObject(j))
		return mbp__load_fail(err, MBP_ST_METADATA, "__metadata__", "not an object");
	size_t n = 0;
	for (const cJSON *c = j->child; c; c = c->next)
		n++;
	st->meta = calloc(2 * n + 1, sizeof(char *));
	if (!st->meta)
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "metadata");
	for (const cJSON *c = j->child; c; c = c->next) {
		if (!cJSON_IsString(c))
			return mbp__load_fail(err, MBP_ST_METADATA, "__metadata__",
					      "value of '%.64s' is not a string", c->string);
		st->meta[2 * st->nmeta] = strdup(c->string);
		st->meta[2 * st->nmeta + 1] = strdup(c->valuestring);
		st->nmeta++;
		if (!st->meta[2 * st->nmeta - 2] || !st->meta[2 * st->nmeta - 1])
			return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "metadata");
	}
	qsort(st->meta, st->nmeta, 2 * sizeof(char *), cmp_meta);
	for (size_t k = 1; k < st->nmeta; k++)
		if (!strcmp(st->meta[2 * k - 2], st->meta[2 * k]))
			return mbp__load_fail(err, MBP_ST_DUPLICATE, "__metadata__",
					      "key '%.64s' appears twice", st->meta[2 * k]);
	return 0;
}

static int parse_tensor(const cJSON *j, mbp__st_tensor *t, uint64_t data_len, mbp_model_error *err)
{
	const char *name = t->name;
	if (!cJSON_IsObject(j))
		return mbp__load_fail(err, MBP_ST_TENSOR_INFO, name, "not an object");
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
	const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
	if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
		return mbp__load_fail(err, MBP_ST_TENSOR_INFO, name, "%s",
				      !cJSON_IsString(dt)  ? "dtype missing or not a string"
				      : !cJSON_IsArray(sh) ? "shape missing or not an array"
							   : "data_offsets missing or not an array");
	t->dtype = -1;
	for (int d = 0; d < MBP__ST_NDTYPES; d++)
		if (!strcmp(dt->valuestring, dtypes[d].name))
			t->dtype = d;
	if (t->dtype < 0)
		return mbp__load_fail(err, MBP_ST_DTYPE, name, "not one of the format's names");

	t->ndim = 0;
	t->nelem = 1;
	bool overflow = false;
	for (const cJSON *d = sh->child; d; d = d->next) {
		uint64_t v;
		if (t->ndim == MBP__ST_MAX_DIMS)
			return mbp__load_fail(err, MBP_ST_SHAPE, name, "more than %d dimensions",
					      MBP__ST_MAX_DIMS);
		if (!json_uint(d, &v))
			return mbp__load_fail(err, MBP_ST_SHAPE, name,
					      "dimension %u is not an integer in [0, 2^53]", t->ndim);
		t->shape[t->ndim++] = v;
		/* Keep multiplying after an overflow: a later zero dimension does not rescue it in the
		 * reference either (checked_mul fails at the first overflow). */
		overflow |= __builtin_mul_overflow(t->nelem, v, &t->nelem);
	}
	uint64_t nbytes;
	if (overflow || __builtin_mul_overflow(t->nelem, (uint64_t)dtypes[t->dtype].size, &nbytes))
		return mbp__load_fail(err, MBP_ST_OVERFLOW, name, "product of the shape x %u bytes",
				      dtypes[t->dtype].size);

	if (cJSON_GetArraySize(off) != 2 || !json_uint(off->child, &t->begin) ||
	    !json_uint(off->child->next, &t->end))
		return mbp__load_fail(err, MBP_ST_OFFSETS, name, "not two integers [begin, end]");
	if (t->begin > t->end)
		return mbp__load_fail(err, MBP_ST_OFFSETS, name, "begin %llu > end %llu",
				      (unsigned long long)t->begin, (unsigned long long)t->end);
	if (t->end - t->begin != nbytes)
		return mbp__load_fail(err, MBP_ST_SIZE, name,
				      "range has %llu bytes, shape x dtype needs %llu",
				      (unsigned long long)(t->end - t->begin), (unsigned long long)nbytes);
	if (t->end > data_len)
		return mbp__load_fail(err, MBP_ST_OUT_OF_BOUNDS, name,
				      "ends at %llu, data section has %llu bytes", (unsigned long long)t->end,
				      (unsigned long long)data_len);
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const mbp__st_tensor *)a)->name, ((const mbp__st_tensor *)b)->name);
}

static int cmp_range(const void *a, const void *b)
{
	const mbp__st_tensor *x = *(const mbp__st_tensor *const *)a, *y = *(const mbp__st_tensor *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The ranges, sorted by offset, must tile [0, data_len). */
static int check_layout(mbp__st *st, mbp_model_error *err)
{
	if (st->n == 0) {
		if (st->data_len)
			return mbp__load_fail(err, MBP_ST_FILE_SIZE, NULL, "no tensors but %llu data bytes",
					      (unsigned long long)st->data_len);
		return 0;
	}
	mbp__st_tensor **by = malloc(st->n * sizeof(*by));
	if (!by)
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "layout check");
	for (size_t i = 0; i < st->n; i++)
		by[i] = &st->t[i];
	qsort(by, st->n, sizeof(*by), cmp_range);
	uint64_t at = 0;
	int rc = 0;
	for (size_t i = 0; i < st->n && !rc; i++) {
		if (by[i]->begin > at)
			rc = mbp__load_fail(err, MBP_ST_GAP, by[i]->name,
					    "begins at %llu, previous data ends at %llu",
					    (unsigned long long)by[i]->begin, (unsigned long long)at);
		else if (by[i]->begin < at)
			rc = mbp__load_fail(err, MBP_ST_OVERLAP, by[i]->name,
					    "begins at %llu, previous tensor ends at %llu",
					    (unsigned long long)by[i]->begin, (unsigned long long)at);
		at = by[i]->end;
	}
	if (!rc && at != st->data_len)
		rc = mbp__load_fail(err, MBP_ST_FILE_SIZE, by[st->n - 1]->name,
				    "last tensor ends at %llu, data section has %llu bytes",
				    (unsigned long long)at, (unsigned long long)st->data_len);
	free(by);
	return rc;
}

/* ---- the file ---- */

/* buf holds the file's first len bytes (at least 8 + the header length), file_len the file's size. */
static int parse_header(const uint8_t *buf, size_t len, uint64_t file_len, mbp__st *st, mbp_model_error *err)
{
	if (file_len < 8 || len < 8)
		return not_st(err, MBP_ST_HEADER_TOO_SMALL, "");
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | buf[i];
	if (n > MBP__ST_MAX_HEADER)
		return not_st(err, MBP_ST_HEADER_TOO_LARGE, "");
	if (n > file_len - 8)
		return not_st(err, MBP_ST_HEADER_LENGTH, "");
	if (n > len - 8)
		return mbp__load_fail(err, MBP_LOAD_IO, NULL, "header not read in full");
	const uint8_t *h = buf + 8;
	if (utf8_valid_prefix(h, n) != n)
		return not_st(err, MBP_ST_HEADER_UTF8, "");
	if (n == 0 || h[0] != '{')
		return not_st(err, MBP_ST_HEADER_START, n ? "" : "the header is empty");
	const char *why = "";
	if (json_lex(h, n, &why) != n)
		return not_st(err, MBP_ST_HEADER_JSON, why);

	st->data = len == file_len ? h + n : NULL;
	st->data_len = file_len - 8 - n;

	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts((const char *)h, n, &end, 0);
	if (!root)
		return not_st(err, MBP_ST_HEADER_JSON, "syntax error");
	int rc = 0;
	for (const uint8_t *p = (const uint8_t *)end; p < h + n && !rc; p++)
		if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
			rc = not_st(err, MBP_ST_HEADER_JSON, "characters after the object");
	if (!rc && !cJSON_IsObject(root))
		rc = not_st(err, MBP_ST_HEADER_JSON, "the top level is not an object");
	/* From here on the header is a JSON object, as a safetensors header is: messages may name its
	 * entries (the names of a file someone made as a model, not bytes of an unrelated file). */

	size_t ntensors = 0;
	bool have_meta = false;
	for (const cJSON *c = rc ? NULL : root->child; c && !rc; c = c->next) {
		if (strcmp(c->string, "__metadata__")) {
			ntensors++;
		} else if (have_meta) {
			rc = mbp__load_fail(err, MBP_ST_DUPLICATE, "__metadata__", "appears twice");
		} else {
			have_meta = true;
			rc = parse_metadata(c, st, err);
		}
	}
	if (!rc && ntensors) {
		st->t = calloc(ntensors, sizeof(*st->t));
		if (!st->t)
			rc = mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "tensor table");
	}
	for (const cJSON *c = rc ? NULL : root->child; c && !rc; c = c->next) {
		if (!strcmp(c->string, "__metadata__"))
			continue;
		mbp__st_tensor *t = &st->t[st->n];
		t->name = strdup(c->string);
		if (!t->name) {
			rc = mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "tensor name");
			break;
		}
		st->n++;
		rc = parse_tensor(c, t, st->data_len, err);
	}
	cJSON_Delete(root);
	if (rc)
		return rc;

	if (st->n)
		qsort(st->t, st->n, sizeof(*st->t), cmp_name);
	for (size_t i = 1; i < st->n; i++)
		if (!strcmp(st->t[i - 1].name, st->t[i].name))
			return mbp__load_fail(err, MBP_ST_DUPLICATE, st->t[i].name,
					      "tensor name appears twice");
	return check_layout(st, err);
}

int mbp__st_parse(const uint8_t *buf, size_t len, mbp__st *st, mbp_model_error *err)
{
	return mbp__st_parse_head(buf, len, len, st, err);
}

int mbp__st_parse_head(const uint8_t *buf, size_t len, uint64_t file_len, mbp__st *st, mbp_model_error *err)
{
	memset(st, 0, sizeof(*st));
	if (err)
		memset(err, 0, sizeof(*err));
	if (!buf && len)
		return mbp__load_fail(err, MBP_LOAD_IO, NULL, "no buffer");
	int rc = parse_header(buf, len, file_len, st, err);
	if (rc)
		mbp__st_free(st);
	return rc;
}

void mbp__st_free(mbp__st *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->n; i++)
		free(st->t[i].name);
	free(st->t);
	for (size_t i = 0; i < 2 * st->nmeta; i++)
		free(st->meta[i]);
	free(st->meta);
	memset(st, 0, sizeof(*st));
}

const mbp__st_tensor *mbp__st_find_n(const mbp__st *st, const char *name, size_t len)
{
	size_t lo = 0, hi = st->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const char *t = st->t[mid].name;
		int c = strncmp(name, t, len);
		if (!c && t[len])
			c = -1; /* t is longer: name sorts first */
		if (!c)
			return &st->t[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

const mbp__st_tensor *mbp__st_find(const mbp__st *st, const char *name)
{
	return mbp__st_find_n(st, name, strlen(name));
}

const char *mbp__st_meta(const mbp__st *st, const char *key)
{
	size_t lo = 0, hi = st->nmeta;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(key, st->meta[2 * mid]);
		if (!c)
			return st->meta[2 * mid + 1];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

/* ---- half precision ---- */

static float f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

float mbp__f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (exp == 0x1f) /* infinity or NaN (payload kept) */
		return f32_from_bits(sign | 0x7f800000u | man << 13);
	if (exp == 0) {
		if (man == 0)
			return f32_from_bits(sign);
		/* Subnormal: man x 2^-24, exact in float. */
		float v = (float)man * 0x1p-24f;
		return sign ? -v : v;
	}
	return f32_from_bits(sign | (exp + 112) << 23 | man << 13);
}

float mbp__bf16_to_f32(uint16_t h)
{
	return f32_from_bits((uint32_t)h << 16);
}

uint16_t mbp__f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet */
		return (uint16_t)(u >> 16 | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

uint16_t mbp__f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return sign | 0x7e00;
	if (a >= 0x477ff000u) /* rounds to 65536 or more: infinity */
		return sign | 0x7c00;
	if (a < 0x38800000u) { /* below 2^-14: subnormal or zero; round man x 2^24 to nearest even */
		float v = f32_from_bits(a) * 0x1p24f;
		return sign | (uint16_t)lrintf(v);
	}
	uint32_t r = a + 0x0fffu + ((a >> 13) & 1) - (112u << 23);
	return sign | (uint16_t)(r >> 13);
}

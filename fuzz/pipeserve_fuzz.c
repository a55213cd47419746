/*
 * libFuzzer target for pipeserve's request parsing (tools/pipeserve/oip.c): the infer body, with or
 * without the binary extension, the Inference-Header-Content-Length value, and the load body.
 *
 * Input layout: byte 0 holds flags (bit 0: an Inference-Header-Content-Length is present), bytes 1-2 the
 * header length (little-endian, reduced modulo the body length + 1), the rest is the body. The body is
 * copied into a buffer of exactly its size so that AddressSanitizer catches any read past it. Invariants
 * checked on every input: the parser answers 0, 400 or 413; an error comes with a message and leaves
 * nothing allocated; an accepted request's rows are within the model's bound and its input bytes are all
 * readable; the response to it encodes; an accepted load names a file without a control character.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oip.h"

static const ps_model_info mi = {.name = "fuzz",
				 .version = "1",
				 .platform = "mbpipe",
				 .input_name = "input",
				 .output_name = "output",
				 .in_width = 4,
				 .out_width = 3,
				 .max_rows = 64};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 3)
		return 0;
	bool has_hl = data[0] & 1;
	size_t len = size - 3;
	long long hl = has_hl ? (long long)((data[1] | (size_t)data[2] << 8) % (len + 1)) : -1;
	char *body = malloc(len ? len : 1);
	if (!body)
		return 0;
	memcpy(body, data + 3, len);

	ps_infer_req rq;
	char err[256] = "";
	int st = ps_oip_parse_infer(&mi, body, len, hl, &rq, err, sizeof err);
	if (st == 0) {
		if (rq.rows == 0 || rq.rows > mi.max_rows || !rq.in)
			abort();
		float acc = 0, row[4];
		for (size_t r = 0; r < rq.rows; r++) { /* every input byte is readable */
			memcpy(row, (const char *)rq.in + r * sizeof row, sizeof row);
			acc += row[0] + row[3];
		}
		float *out = calloc(rq.rows * mi.out_width, sizeof(float));
		if (out) {
			out[0] = acc;
			ps_buf b = {0};
			size_t json_len;
			if (ps_oip_encode_infer(&mi, &rq, out, &b, &json_len) || json_len > b.len)
				abort();
			ps_buf_free(&b);
			free(out);
		}
		ps_infer_req_clear(&rq);
	} else {
		if ((st != 400 && st != 413) || !err[0] || rq.owned || rq.id)
			abort();
	}

	char *path = NULL;
	st = ps_oip_parse_load(body, len, &path, err, sizeof err);
	if ((st != 0 && st != 400) || (st && path) || (path && ps_has_control(path)))
		abort();
	free(path);

	char *s = malloc(len + 1);
	if (s) {
		memcpy(s, body, len);
		s[len] = '\0';
		long long v = ps_oip_parse_header_len(s, len);
		if (v < -1 || v > (long long)len)
			abort();
		free(s);
	}
	free(body);
	return 0;
}

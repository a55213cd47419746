/*
 * Open Inference Protocol (KServe v2 REST) messages for pipeserve: parsing an infer request (JSON, flat or
 * nested data, and the binary tensor extension) and encoding responses, model and server metadata and
 * errors.
 *
 * Pure functions over byte buffers: nothing here knows about HTTP connections or the engine, so the fuzz
 * target (fuzz/pipeserve_fuzz.c) drives the parser exactly as the server does. JSON is read with cJSON;
 * float arrays are written by hand ("%.9g", which round-trips every float) because they dominate the size
 * of a response, and every string is escaped here (bytes that are not UTF-8 become U+FFFD).
 *
 * Thread safety: every function is reentrant (cJSON is, as long as nobody calls cJSON_GetErrorPtr).
 */
#ifndef PIPESERVE_OIP_H
#define PIPESERVE_OIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer; ps_buf_free() releases it. */
typedef struct ps_buf {
	char *p;
	size_t len, cap;
	bool oom; /* an append failed: the content is truncated */
} ps_buf;

void ps_buf_free(ps_buf *b);
/* Append; on allocation failure set b->oom and drop the data (checked once, at the end). */
void ps_buf_add(ps_buf *b, const void *data, size_t n);
void ps_buf_adds(ps_buf *b, const char *s);
void ps_buf_printf(ps_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append `s` as a JSON string literal: quoted, '"', '\\' and control characters escaped, and every byte that
 * does not belong to a valid UTF-8 sequence replaced by U+FFFD, so the output is valid JSON whatever `s`. */
void ps_buf_add_json_string(ps_buf *b, const char *s);

/* Whether `s` holds a control character (below 0x20, or 0x7f): no name in a URL or a request may. */
bool ps_has_control(const char *s);

/* What the protocol exposes of the served model: one FP32 input [-1, in_width], one output [-1, out_width]. */
typedef struct ps_model_info {
	const char *name;
	const char *version; /* the version: the weights version number, "1" until the first load */
	const char *platform;
	const char *input_name, *output_name;
	size_t in_width, out_width; /* features per row */
	size_t max_rows;	    /* largest request in rows (413 above) */
} ps_model_info;

/* A parsed infer request. */
typedef struct ps_infer_req {
	char *id;	    /* the request's "id", NULL when absent */
	size_t rows;	    /* N: the input's shape is [N, in_width] */
	const void *in;	    /* N x in_width floats, maybe unaligned: into `owned` or into the body */
	float *owned;	    /* the floats decoded from JSON data */
	bool want_output;   /* false when "outputs" lists nothing */
	bool binary_output; /* return the output as binary data */
} ps_infer_req;

/**
 * Parse the body of POST .../infer. `header_len` is the value of Inference-Header-Content-Length, or -1
 * when absent (then the whole body is JSON). With binary inputs, rq->in points into `body`, which must
 * outlive `rq`.
 * @return 0, or the HTTP status to answer (400, 413) with a message in `err`. rq is cleared on error.
 */
int ps_oip_parse_infer(const ps_model_info *mi, const char *body, size_t len, long long header_len,
		       ps_infer_req *rq, char *err, size_t errlen);

/* Free what ps_oip_parse_infer() allocated (accepts a zeroed request). */
void ps_infer_req_clear(ps_infer_req *rq);

/**
 * Parse the value of an Inference-Header-Content-Length header: a decimal in [0, body_len].
 * @return the value, or -1 when malformed or out of range.
 */
long long ps_oip_parse_header_len(const char *s, size_t body_len);

/**
 * Encode the response to `rq`: `out` holds rq->rows x out_width floats. *json_len receives the length of the
 * JSON part (the whole body unless binary output was asked for, which then follows it).
 * @return 0, or -ENOMEM.
 */
int ps_oip_encode_infer(const ps_model_info *mi, const ps_infer_req *rq, const float *out, ps_buf *b,
			size_t *json_len);

/* {"error": msg}. @return 0, or -ENOMEM. */
int ps_oip_encode_error(ps_buf *b, const char *msg);
/* GET /v2/models/{name}. */
int ps_oip_encode_model_metadata(const ps_model_info *mi, ps_buf *b);
/* GET /v2. */
int ps_oip_encode_server_metadata(const char *version, ps_buf *b);

/**
 * Parse the body of POST /v2/repository/models/{name}/load: {"parameters": {"file": "<name in the model
 * repository>"}} (an empty body or no file means the repository's "<model name>.safetensors"). A "path"
 * parameter is refused: models are named, never given as paths, and a name with a control character (U+0000,
 * which would end the C string early, included) is refused. *file receives a malloc'd string or NULL.
 * @return 0, or 400 with a message in `err`.
 */
int ps_oip_parse_load(const char *body, size_t len, char **file, char *err, size_t errlen);

#endif

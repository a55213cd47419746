/*
 * Internal: the safetensors reader (parse and validate a mapped file) and the float conversions.
 *
 * Self-contained (libc and cJSON only) so that the libFuzzer target in fuzz/ builds it alone.
 */
#ifndef MBP__SAFETENSORS_H
#define MBP__SAFETENSORS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mbpipe/error.h>
#include <mbpipe/model.h>

#define MBP__ST_MAX_HEADER 100000000u /* the reference's MAX_HEADER_SIZE */
#define MBP__ST_MAX_DIMS   8

/* The format's dtypes, in the reference's order. */
enum mbp__st_dtype {
	MBP__ST_BOOL,
	MBP__ST_U8,
	MBP__ST_I8,
	MBP__ST_F8_E5M2,
	MBP__ST_F8_E4M3,
	MBP__ST_I16,
	MBP__ST_U16,
	MBP__ST_F16,
	MBP__ST_BF16,
	MBP__ST_I32,
	MBP__ST_U32,
	MBP__ST_F32,
	MBP__ST_F64,
	MBP__ST_I64,
	MBP__ST_U64,
	MBP__ST_NDTYPES
};

typedef struct mbp__st_tensor {
	char *name;
	int dtype; /* enum mbp__st_dtype */
	unsigned ndim;
	uint64_t shape[MBP__ST_MAX_DIMS];
	uint64_t nelem;
	uint64_t begin, end; /* relative to the data section */
	bool has_digest;     /* set by mbp__st_digests() */
	uint32_t digest;     /* CRC-32 of the bytes [begin, end) as stored */
} mbp__st_tensor;

typedef struct mbp__st {
	mbp__st_tensor *t; /* sorted by name */
	size_t n;
	char **meta; /* key, value, key, value ... */
	size_t nmeta;
	const uint8_t *data; /* the data section inside the caller's buffer */
	uint64_t data_len;
} mbp__st;

/* Parse and validate a whole file image. On error returns the rule's -errno, fills err (rule, tensor and
 * a message without a file name) and leaves *st empty. mbp__st_free() accepts an empty or failed st. */
int mbp__st_parse(const uint8_t *buf, size_t len, mbp__st *st, mbp_model_error *err);
/* The same from the file's first len bytes (at least 8 + its header length) and its size: everything is
 * validated but the data bytes, which need not be there (st->data is NULL unless buf holds them all). */
int mbp__st_parse_head(const uint8_t *buf, size_t len, uint64_t file_len, mbp__st *st, mbp_model_error *err);
void mbp__st_free(mbp__st *st);

/* Lookup by exact name (binary search); NULL when absent. _n: the name is the first len bytes given. */
const mbp__st_tensor *mbp__st_find(const mbp__st *st, const char *name);
const mbp__st_tensor *mbp__st_find_n(const mbp__st *st, const char *name, size_t len);
/* Metadata value, or NULL. */
const char *mbp__st_meta(const mbp__st *st, const char *key);

const char *mbp__st_dtype_name(int dtype);
unsigned mbp__st_dtype_size(int dtype);

/* Record an error: the rule's errno is returned. `tensor` may be NULL. */
int mbp__load_fail(mbp_model_error *err, mbp_load_rule rule, const char *tensor, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The errno a rule returns (MBP_LOAD_IO: -EIO; callers pass the system's own). */
int mbp__load_rule_errno(mbp_load_rule rule);

/* ---- digests: lib/model/digest.c (zlib), outside the fuzz target's build ---- */

/* The metadata key of a tensor's digest: "<tensor name>" MBP__ST_DIGEST_KEY. */
#define MBP__ST_DIGEST_KEY ".crc32"

/* CRC-32 (zlib's) of n bytes, continuing from crc (0 to start). */
uint32_t mbp__crc32(uint32_t crc, const void *p, size_t n);
/* Read the digests in a parsed file's metadata into its tensors (has_digest, digest). @return the number of
 * tensors that have one: 0 (a file from another writer) or st->n; or, with err filled, MBP_LOAD_DIGEST's
 * -EBADMSG when some tensors have one and others not, or one is not 8 hexadecimal digits. */
int mbp__st_digests(mbp__st *st, mbp_model_error *err);
/* Check a tensor's bytes (its end - begin bytes at p) against its digest; 0 when it has none, else
 * MBP_LOAD_DIGEST's -EBADMSG with err filled. */
int mbp__st_verify(const mbp__st_tensor *t, const uint8_t *p, mbp_model_error *err);

/* IEEE half and bfloat16 to float, exact (subnormals, infinities and NaNs included). */
float mbp__f16_to_f32(uint16_t h);
float mbp__bf16_to_f32(uint16_t h);
/* Float to half / bfloat16, round to nearest even (the writer uses them). */
uint16_t mbp__f32_to_f16(float f);
uint16_t mbp__f32_to_bf16(float f);

#endif

/*
 * The IDX reader (MNIST's format) through zlib, and the data helpers of include/mbpipe/data.h.
 *
 * A file is read with gzread, which inflates a gzip stream (checking its CRC and length at the end) and
 * passes a plain file through. The header is read and checked first, then exactly the number of bytes it
 * announces, then one more read must find the end: a short read is a truncated file, a byte more is
 * trailing data, and any zlib error (a corrupt stream, a missing trailer) is reported as zlib words it.
 * Buffers grow with the data actually read, so a header's sizes alone never allocate much.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include <mbpipe.h>

#include "common.h"
#include "model_internal.h"

#define MAX_COUNT (1u << 28)
#define MAX_SIDE  (1u << 16)
#define MAX_BYTES (1ull << 32)

static int fail(mbp_data_error *err, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(mbp_data_error *err, int code, const char *path, const char *fmt, ...)
{
	if (err) {
		char what[320];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
		err->code = code;
		snprintf(err->msg, sizeof(err->msg), "%.150s: %s", path, what);
	}
	return code;
}

/* Word why gzread returned k <= 0 while reading `what` (n bytes wanted, got so far). */
static int gz_fail(gzFile f, const char *path, int k, const char *what, size_t n, size_t got,
		   mbp_data_error *err)
{
	int zerr;
	const char *msg = gzerror(f, &zerr);
	if (zerr == Z_ERRNO) {
		int e = errno ? errno : EIO;
		return fail(err, -e, path, "reading %s: %s", what, strerror(e));
	}
	if (k < 0 || (zerr != Z_OK && zerr != Z_STREAM_END))
		return fail(err, -EBADMSG, path, "corrupt gzip data while reading %s: %s", what, msg);
	return fail(err, -EBADMSG, path, "truncated: %s: %zu bytes expected, the file ends after %zu", what,
		    n, got);
}

/*
 * Read exactly n bytes into *buf, or (*buf NULL) into a buffer allocated as the data arrives: 16 MiB, then
 * doubling up to n, so that a header announcing gigabytes in a small or broken file costs no more than the
 * file. gzread takes an unsigned int: at most 16 MiB per call.
 */
static int read_exact(gzFile f, const char *path, uint8_t **buf, size_t n, const char *what,
		      mbp_data_error *err)
{
	bool grow = !*buf;
	size_t cap = grow ? (n < (1u << 24) ? n : (1u << 24)) : n, got = 0;
	uint8_t *p = grow ? malloc(cap ? cap : 1) : *buf;
	int rc = p ? 0 : fail(err, -ENOMEM, path, "out of memory for %s", what);
	while (!rc && got < n) {
		if (got == cap) {
			size_t next = cap > n / 2 ? n : 2 * cap;
			uint8_t *q = realloc(p, next);
			if (!q) {
				rc =
				    fail(err, -ENOMEM, path, "out of memory for %zu bytes of %s", next, what);
				break;
			}
			p = q;
			cap = next;
		}
		size_t want = cap - got < (1u << 24) ? cap - got : (1u << 24);
		int k = gzread(f, p + got, (unsigned)want);
		if (k <= 0)
			rc = gz_fail(f, path, k, what, n, got, err);
		else
			got += (size_t)k;
	}
	if (grow) {
		if (rc)
			free(p);
		else
			*buf = p;
	}
	return rc;
}

/* The end of the file must follow the data. */
static int expect_end(gzFile f, const char *path, mbp_data_error *err)
{
	char c;
	int k = gzread(f, &c, 1);
	int zerr;
	const char *msg = gzerror(f, &zerr);
	if (k < 0 || (zerr != Z_OK && zerr != Z_STREAM_END))
		return fail(err, -EBADMSG, path, "corrupt gzip data at the end of the file: %s", msg);
	if (k > 0)
		return fail(err, -EBADMSG, path, "trailing bytes after the data the header announces");
	return 0;
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/*
 * Open an IDX file of unsigned bytes with `dims` dimensions and read its header into size[]. The file is
 * left positioned at the data.
 */
static int open_idx(const char *path, unsigned dims, uint32_t *size, gzFile *out, mbp_data_error *err)
{
	errno = 0;
	gzFile f = gzopen(path, "rb");
	if (!f) {
		int e = errno ? errno : ENOMEM;
		return fail(err, -e, path, "cannot open: %s", strerror(e));
	}
	uint8_t h[4 + 4 * 3], *hp = h, *hd = h + 4;
	int rc = read_exact(f, path, &hp, 4, "the IDX magic", err);
	if (!rc && (h[0] || h[1] || h[2] != 0x08 || h[3] != dims))
		rc = fail(err, -EBADMSG, path,
			  "bad magic 0x%02x%02x%02x%02x: expected 0x000008%02x (IDX, unsigned bytes, %u "
			  "dimension%s)",
			  h[0], h[1], h[2], h[3], dims, dims, dims > 1 ? "s" : "");
	if (!rc)
		rc = read_exact(f, path, &hd, 4 * (size_t)dims, "the IDX header", err);
	for (unsigned d = 0; !rc && d < dims; d++) {
		size[d] = be32(h + 4 + 4 * d);
		if (!size[d])
			rc = fail(err, -EPROTO, path, "dimension %u is 0", d);
		else if (size[d] > (d ? MAX_SIDE : MAX_COUNT))
			rc = fail(err, -E2BIG, path, "dimension %u is %u, above the limit of %u", d, size[d],
				  d ? MAX_SIDE : MAX_COUNT);
	}
	if (rc) {
		gzclose(f);
		return rc;
	}
	*out = f;
	return 0;
}

void mbp_dataset_free(mbp_dataset *ds)
{
	if (!ds)
		return;
	free(ds->pixels);
	free(ds->labels);
	memset(ds, 0, sizeof(*ds));
}

int mbp_idx_load(mbp_dataset *ds, const char *images, const char *labels, uint32_t classes,
		 mbp_data_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	if (ds)
		memset(ds, 0, sizeof(*ds));
	if (!ds || !images || !labels || classes < 1 || classes > 65536)
		return fail(err, -EINVAL, images ? images : "(null)",
			    "invalid arguments (classes must be 1 .. 65536)");
	gzFile fi = NULL, fl = NULL;
	uint32_t si[3], sl[1];
	uint8_t *lab = NULL;
	int rc = open_idx(images, 3, si, &fi, err);
	if (!rc)
		rc = open_idx(labels, 1, sl, &fl, err);
	if (!rc && sl[0] != si[0])
		rc = fail(err, -EPROTO, labels, "%u labels for the %u images of %s", sl[0], si[0], images);
	uint64_t bytes = (uint64_t)si[0] * si[1] * si[2];
	if (!rc && bytes > MAX_BYTES)
		rc = fail(err, -E2BIG, images, "%llu bytes of pixels, above the limit of %llu",
			  (unsigned long long)bytes, (unsigned long long)MAX_BYTES);
	if (!rc)
		rc = read_exact(fi, images, &ds->pixels, bytes, "the pixels", err);
	if (!rc)
		rc = expect_end(fi, images, err);
	if (!rc)
		rc = read_exact(fl, labels, &lab, si[0], "the labels", err);
	if (!rc)
		rc = expect_end(fl, labels, err);
	if (!rc && !(ds->labels = malloc((size_t)si[0] * sizeof(int32_t))))
		rc = fail(err, -ENOMEM, labels, "out of memory for %u labels", si[0]);
	for (uint32_t i = 0; !rc && i < si[0]; i++) {
		if (lab[i] >= classes)
			rc = fail(err, -ERANGE, labels, "label %u of image %u is out of range (%u classes)",
				  lab[i], i, classes);
		ds->labels[i] = lab[i];
	}
	if (fi)
		gzclose(fi);
	if (fl)
		gzclose(fl);
	free(lab);
	if (rc) {
		mbp_dataset_free(ds);
		return rc;
	}
	ds->n = si[0];
	ds->rows = si[1];
	ds->cols = si[2];
	ds->width = si[1] * si[2];
	ds->classes = classes;
	return 0;
}

int mbp_fashion_mnist_load(mbp_dataset *ds, const char *dir, bool train, mbp_data_error *err)
{
	char im[512], lb[512];
	const char *d = dir ? dir : MBP_FASHION_MNIST_DIR, *part = train ? "train" : "t10k";
	if ((size_t)snprintf(im, sizeof(im), "%s/%s-images-idx3-ubyte.gz", d, part) >= sizeof(im) ||
	    (size_t)snprintf(lb, sizeof(lb), "%s/%s-labels-idx1-ubyte.gz", d, part) >= sizeof(lb)) {
		if (ds)
			memset(ds, 0, sizeof(*ds));
		if (err)
			memset(err, 0, sizeof(*err));
		return fail(err, -EINVAL, d, "folder name too long");
	}
	return mbp_idx_load(ds, im, lb, 10, err);
}

int mbp_dataset_gather(const mbp_dataset *ds, const uint32_t *idx, uint32_t count, float *x, int32_t *y)
{
	if (!ds || (count && (!idx || !x)))
		return -EINVAL;
	const float k = 1.0f / 255.0f;
	for (uint32_t r = 0; r < count; r++) {
		if (idx[r] >= ds->n)
			return -ERANGE;
		const uint8_t *p = ds->pixels + (size_t)idx[r] * ds->width;
		float *o = x + (size_t)r * ds->width;
		for (uint32_t j = 0; j < ds->width; j++)
			o[j] = (float)p[j] * k;
		if (y)
			y[r] = ds->labels[idx[r]];
	}
	return 0;
}

/* Fisher-Yates over a[0 .. n-1] from a generator state. */
static void shuffle(uint32_t *a, uint32_t n, uint64_t s)
{
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(((mbp__splitmix64(&s) >> 32) * (uint64_t)i) >> 32);
		uint32_t t = a[i - 1];
		a[i - 1] = a[j];
		a[j] = t;
	}
}

int mbp_data_split(uint32_t n, uint32_t n_val, uint64_t seed, uint32_t *train, uint32_t *val)
{
	if (n_val > n || (n - n_val && !train) || (n_val && !val))
		return -EINVAL;
	uint32_t *perm = malloc(((size_t)n + 1) * sizeof(*perm));
	uint8_t *held = calloc((size_t)n + 1, 1);
	if (!perm || !held) {
		free(perm);
		free(held);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		perm[i] = i;
	shuffle(perm, n, seed ^ 0x5eed5eed5eed5eedull);
	for (uint32_t i = n - n_val; i < n; i++)
		held[perm[i]] = 1;
	for (uint32_t i = 0, t = 0, v = 0; i < n; i++) {
		if (held[i])
			val[v++] = i;
		else
			train[t++] = i;
	}
	free(perm);
	free(held);
	return 0;
}

int mbp_data_epoch_order(const uint32_t *base, uint32_t n, uint64_t seed, uint64_t epoch, uint32_t *out)
{
	if (n && (!base || !out))
		return -EINVAL;
	if (!n)
		return 0;
	memcpy(out, base, (size_t)n * sizeof(*out));
	uint64_t s = seed;
	s ^= mbp__splitmix64(&s) + epoch * 0xd1b54a32d192ed03ull;
	shuffle(out, n, s);
	return 0;
}

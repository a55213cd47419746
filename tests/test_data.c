/*
 * The IDX reader and data helpers (include/mbpipe/data.h): small generated files, gzip and plain, good
 * and broken in every way the reader checks, each error naming the file; the split and the epoch orders;
 * and, when Debian's dataset-fashion-mnist is installed, its real test set.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include <mbpipe.h>

#include "check_main.h"
#include "test_tmpdir.h"

static void setup(void)
{
	tmpdir_make("data");
}

static void teardown(void)
{
	tmpdir_remove();
}

/* Write bytes to a file, gzip-compressed or plain. */
static void put(const char *path, const void *data, size_t n, bool gz)
{
	if (gz) {
		gzFile f = gzopen(path, "wb");
		ck_assert_ptr_nonnull(f);
		ck_assert_int_eq(gzwrite(f, data, (unsigned)n), (int)n);
		ck_assert_int_eq(gzclose(f), Z_OK);
	} else {
		FILE *f = fopen(path, "wb");
		ck_assert_ptr_nonnull(f);
		ck_assert_uint_eq(fwrite(data, 1, n, f), n);
		fclose(f);
	}
}

static size_t be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
	return 4;
}

/* An image file of n images of r x c (pixel value: (image * 7 + j) mod 256) into buf; returns its length. */
static size_t images(uint8_t *buf, uint32_t n, uint32_t r, uint32_t c)
{
	size_t k = 0;
	buf[k++] = 0, buf[k++] = 0, buf[k++] = 0x08, buf[k++] = 3;
	k += be32(buf + k, n);
	k += be32(buf + k, r);
	k += be32(buf + k, c);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = 0; j < r * c; j++)
			buf[k++] = (uint8_t)((i * 7 + j) % 256);
	return k;
}

static size_t labels(uint8_t *buf, uint32_t n, uint32_t classes)
{
	size_t k = 0;
	buf[k++] = 0, buf[k++] = 0, buf[k++] = 0x08, buf[k++] = 1;
	k += be32(buf + k, n);
	for (uint32_t i = 0; i < n; i++)
		buf[k++] = (uint8_t)(i % classes);
	return k;
}

static uint8_t ibuf[4096], lbuf[256];

START_TEST(good_files_load_gzip_or_plain_with_pixels_scaled_to_unit_floats)
{
	for (int gz = 0; gz < 2; gz++) {
		size_t ni = images(ibuf, 6, 3, 4), nl = labels(lbuf, 6, 5);
		put(tmpdir_path("i"), ibuf, ni, gz);
		put(tmpdir_path("l"), lbuf, nl, gz);
		mbp_dataset ds;
		mbp_data_error e;
		ck_assert_msg(mbp_idx_load(&ds, tmpdir_path("i"), tmpdir_path("l"), 5, &e) == 0, "%s", e.msg);
		ck_assert_uint_eq(ds.n, 6);
		ck_assert_uint_eq(ds.rows, 3);
		ck_assert_uint_eq(ds.cols, 4);
		ck_assert_uint_eq(ds.width, 12);
		ck_assert_uint_eq(ds.classes, 5);
		uint32_t idx[] = {5, 0};
		float x[24];
		int32_t y[2];
		ck_assert_int_eq(mbp_dataset_gather(&ds, idx, 2, x, y), 0);
		ck_assert_int_eq(y[0], 0); /* 5 % 5 */
		ck_assert_int_eq(y[1], 0);
		for (int j = 0; j < 12; j++) {
			ck_assert(x[j] == (float)((5 * 7 + j) % 256) * (1.0f / 255.0f));
			ck_assert(x[12 + j] >= 0.0f && x[12 + j] <= 1.0f);
		}
		uint32_t bad[] = {6};
		ck_assert_int_eq(mbp_dataset_gather(&ds, bad, 1, x, y), -ERANGE);
		mbp_dataset_free(&ds);
		ck_assert_ptr_null(ds.pixels);
		mbp_dataset_free(&ds);
	}
}
END_TEST

/* Load and expect an error code with a message naming `who` and containing `what`. */
static void expect_fail(const char *im, const char *lb, uint32_t classes, int code, const char *who,
			const char *what)
{
	mbp_dataset ds;
	mbp_data_error e;
	int rc = mbp_idx_load(&ds, im, lb, classes, &e);
	ck_assert_msg(rc == code, "got %d (%s), want %d", rc, e.msg, code);
	ck_assert_int_eq(e.code, code);
	ck_assert_msg(strstr(e.msg, who) != NULL, "'%s' does not name %s", e.msg, who);
	ck_assert_msg(strstr(e.msg, what) != NULL, "'%s' does not say '%s'", e.msg, what);
	ck_assert_ptr_null(ds.pixels);
	ck_assert_uint_eq(ds.n, 0);
}

START_TEST(broken_files_are_refused_each_with_its_reason_and_the_file_name)
{
	size_t ni = images(ibuf, 6, 3, 4), nl = labels(lbuf, 6, 5);
	char gi[128], gl[128]; /* tmpdir_path's buffers rotate: keep these two */
	snprintf(gi, sizeof(gi), "%s", tmpdir_path("good-i.gz"));
	snprintf(gl, sizeof(gl), "%s", tmpdir_path("good-l.gz"));
	put(gi, ibuf, ni, true);
	put(gl, lbuf, nl, true);
	/* Missing file. */
	expect_fail(tmpdir_path("nothing"), gl, 5, -ENOENT, "nothing", "cannot open");
	/* Bad magic: a label file given as images, and a wrong type byte. */
	expect_fail(gl, gl, 5, -EBADMSG, "good-l.gz", "bad magic");
	uint8_t t[4096];
	memcpy(t, ibuf, ni);
	t[2] = 0x0d; /* float data */
	put(tmpdir_path("type"), t, ni, true);
	expect_fail(tmpdir_path("type"), gl, 5, -EBADMSG, "type", "bad magic");
	/* Truncated: the header alone, and pixels cut short, plain and gzip. */
	put(tmpdir_path("short-hdr"), ibuf, 6, true);
	expect_fail(tmpdir_path("short-hdr"), gl, 5, -EBADMSG, "short-hdr", "truncated");
	put(tmpdir_path("short"), ibuf, ni - 5, false);
	expect_fail(tmpdir_path("short"), gl, 5, -EBADMSG, "short", "truncated");
	put(tmpdir_path("short.gz"), ibuf, ni - 5, true);
	expect_fail(tmpdir_path("short.gz"), gl, 5, -EBADMSG, "short.gz", "truncated");
	/* Trailing bytes. */
	memcpy(t, ibuf, ni);
	t[ni] = 1;
	put(tmpdir_path("long"), t, ni + 1, true);
	expect_fail(tmpdir_path("long"), gl, 5, -EBADMSG, "long", "trailing");
	/* Wrong counts: 5 labels for 6 images; a zero dimension. */
	size_t n5 = labels(lbuf, 5, 5);
	put(tmpdir_path("l5"), lbuf, n5, true);
	expect_fail(gi, tmpdir_path("l5"), 5, -EPROTO, "l5", "5 labels for the 6 images");
	size_t n0 = images(t, 6, 0, 4);
	put(tmpdir_path("zero"), t, n0, true);
	expect_fail(tmpdir_path("zero"), gl, 5, -EPROTO, "zero", "dimension 1 is 0");
	size_t nbig = images(t, 1, 1, 1);
	be32(t + 8, 1u << 20);
	put(tmpdir_path("big"), t, nbig, true);
	expect_fail(tmpdir_path("big"), gl, 5, -E2BIG, "big", "above the limit");
	/* A header announcing 4 GiB of pixels in a tiny file: truncated, without allocating 4 GiB first
	 * (ASan would refuse such an allocation). */
	size_t nhuge = images(t, 1, 1, 1);
	be32(t + 4, 1u << 16);
	be32(t + 8, 256);
	be32(t + 12, 256);
	put(tmpdir_path("huge"), t, nhuge, true);
	size_t nlh = labels(lbuf, 1, 5);
	be32(lbuf + 4, 1u << 16);
	put(tmpdir_path("huge-l"), lbuf, nlh, true);
	char hl[128];
	snprintf(hl, sizeof(hl), "%s", tmpdir_path("huge-l"));
	expect_fail(tmpdir_path("huge"), hl, 5, -EBADMSG, "huge",
		    "truncated: the pixels: 4294967296 bytes expected");
	/* Label out of range: labels 0 .. 4 with 4 classes. */
	expect_fail(gi, gl, 4, -ERANGE, "good-l.gz", "label 4 of image 4 is out of range");
	/* A corrupt gzip stream: flip bytes in the middle of the compressed data, and cut its trailer. */
	FILE *f = fopen(gi, "rb");
	uint8_t z[4096];
	size_t nz = fread(z, 1, sizeof(z), f);
	fclose(f);
	uint8_t c[4096];
	memcpy(c, z, nz);
	for (size_t k = 12; k < nz - 12; k += 3)
		c[k] ^= 0x5a;
	put(tmpdir_path("corrupt"), c, nz, false);
	expect_fail(tmpdir_path("corrupt"), gl, 5, -EBADMSG, "corrupt", "");
	put(tmpdir_path("notrailer"), z, nz - 4, false);
	expect_fail(tmpdir_path("notrailer"), gl, 5, -EBADMSG, "notrailer", "corrupt gzip");
	/* Arguments. */
	mbp_dataset ds;
	ck_assert_int_eq(mbp_idx_load(&ds, gi, gl, 0, NULL), -EINVAL);
	ck_assert_int_eq(mbp_idx_load(NULL, gi, gl, 5, NULL), -EINVAL);
	ck_assert_int_eq(mbp_idx_load(&ds, gi, gl, 5, NULL), 0);
	mbp_dataset_free(&ds);
}
END_TEST

START_TEST(split_and_epoch_orders_are_seeded_permutations)
{
	enum { N = 1000, V = 100 };
	uint32_t tr[N], va[V], tr2[N], va2[V];
	ck_assert_int_eq(mbp_data_split(N, V, 7, tr, va), 0);
	ck_assert_int_eq(mbp_data_split(N, V, 7, tr2, va2), 0);
	ck_assert(!memcmp(tr, tr2, sizeof(uint32_t) * (N - V)) && !memcmp(va, va2, sizeof(va)));
	/* Every row once, in one part or the other, each part sorted. */
	uint8_t seen[N] = {0};
	for (int i = 0; i < N - V; i++) {
		seen[tr[i]]++;
		ck_assert(i == 0 || tr[i] > tr[i - 1]);
	}
	for (int i = 0; i < V; i++) {
		seen[va[i]]++;
		ck_assert(i == 0 || va[i] > va[i - 1]);
	}
	for (int i = 0; i < N; i++)
		ck_assert_uint_eq(seen[i], 1);
	/* Another seed, another split (not the first or last 100 rows). */
	ck_assert_int_eq(mbp_data_split(N, V, 8, tr2, va2), 0);
	ck_assert(memcmp(va, va2, sizeof(va)) != 0);
	ck_assert_uint_lt(va[0], 50);
	ck_assert_uint_gt(va[V - 1], N - 50);
	ck_assert_int_eq(mbp_data_split(N, N + 1, 7, tr, va), -EINVAL);

	uint32_t e0[N - V], e0b[N - V], e1[N - V];
	ck_assert_int_eq(mbp_data_epoch_order(tr, N - V, 3, 0, e0), 0);
	ck_assert_int_eq(mbp_data_epoch_order(tr, N - V, 3, 0, e0b), 0);
	ck_assert_int_eq(mbp_data_epoch_order(tr, N - V, 3, 1, e1), 0);
	ck_assert(!memcmp(e0, e0b, sizeof(e0)));
	ck_assert(memcmp(e0, e1, sizeof(e0)) != 0);
	memset(seen, 0, sizeof(seen));
	unsigned moved = 0;
	for (int i = 0; i < N - V; i++) {
		seen[e1[i]]++;
		moved += e1[i] != tr[i];
	}
	for (int i = 0; i < N - V; i++)
		ck_assert_uint_eq(seen[tr[i]], 1);
	ck_assert_uint_gt(moved, (N - V) * 9 / 10);
	ck_assert_int_eq(mbp_data_epoch_order(NULL, 3, 0, 0, e0), -EINVAL);
}
END_TEST

START_TEST(fashion_mnist_test_set_loads_when_the_package_is_installed)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/t10k-images-idx3-ubyte.gz", MBP_FASHION_MNIST_DIR);
	if (access(p, R_OK) != 0) {
		fprintf(stderr, "skipped: %s absent (apt-get install dataset-fashion-mnist)\n", p);
		return;
	}
	mbp_dataset ds;
	mbp_data_error e;
	ck_assert_msg(mbp_fashion_mnist_load(&ds, NULL, false, &e) == 0, "%s", e.msg);
	ck_assert_uint_eq(ds.n, 10000);
	ck_assert_uint_eq(ds.width, 784);
	unsigned count[10] = {0};
	for (uint32_t i = 0; i < ds.n; i++)
		count[ds.labels[i]]++;
	for (int c = 0; c < 10; c++)
		ck_assert_uint_eq(count[c], 1000); /* the test set is balanced */
	uint32_t idx = 0;
	float x[784];
	ck_assert_int_eq(mbp_dataset_gather(&ds, &idx, 1, x, NULL), 0);
	double sum = 0;
	for (int j = 0; j < 784; j++)
		sum += x[j];
	ck_assert(sum > 10 && sum < 700);
	mbp_dataset_free(&ds);
	ck_assert_int_eq(mbp_fashion_mnist_load(&ds, "/nonexistent", true, &e), -ENOENT);
	ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent/train-images-idx3-ubyte.gz"));
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("data");
	TCase *tc = tcase_create("idx");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, good_files_load_gzip_or_plain_with_pixels_scaled_to_unit_floats);
	tcase_add_test(tc, broken_files_are_refused_each_with_its_reason_and_the_file_name);
	tcase_add_test(tc, split_and_epoch_orders_are_seeded_permutations);
	tcase_add_test(tc, fashion_mnist_test_set_loads_when_the_package_is_installed);
	suite_add_tcase(s, tc);
	return s;
}

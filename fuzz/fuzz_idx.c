/*
 * libFuzzer target for the IDX reader (lib/model/idx.c). An input is two files: its first two bytes give
 * the length of the image file (little-endian, clamped to what follows), the rest is the label file. Each
 * goes to a memfd and is read through its /proc/self/fd path, gzip or plain as zlib finds it. Built with
 * clang -fsanitize=fuzzer,address,undefined by `make fuzz-idx`, which runs a fixed number of executions from
 * a seed of one good pair.
 *
 * Beyond "no crash, no sanitizer report", it checks the reader's contract: an accepted pair has matching
 * sizes and every label below the class count; a rejected one returns a negative errno equal to err.code,
 * a message naming one of the two files, and a zeroed data set (ASan's leak check sees the rest).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mbpipe.h>

#define CHECK(x)                                                                                             \
	do {                                                                                                 \
		if (!(x))                                                                                    \
			abort();                                                                             \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfile(const uint8_t *p, size_t n, char *path, size_t len)
{
	int fd = memfd_create("idx", MFD_CLOEXEC);
	CHECK(fd >= 0);
	CHECK(write(fd, p, n) == (ssize_t)n);
	snprintf(path, len, "/proc/self/fd/%d", fd);
	return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	size_t split = (size_t)data[0] | (size_t)data[1] << 8;
	if (split > size - 2)
		split = size - 2;
	char pi[64], pl[64];
	int fi = memfile(data + 2, split, pi, sizeof(pi));
	int fl = memfile(data + 2 + split, size - 2 - split, pl, sizeof(pl));
	mbp_dataset ds;
	mbp_data_error err;
	int rc = mbp_idx_load(&ds, pi, pl, 10, &err);
	if (rc) {
		CHECK(rc < 0 && err.code == rc && memchr(err.msg, 0, sizeof(err.msg)));
		CHECK(strstr(err.msg, pi) || strstr(err.msg, pl));
		CHECK(!ds.pixels && !ds.labels && ds.n == 0);
	} else {
		CHECK(ds.n > 0 && ds.width == ds.rows * ds.cols && ds.classes == 10);
		for (uint32_t i = 0; i < ds.n; i++)
			CHECK(ds.labels[i] >= 0 && ds.labels[i] < 10);
		volatile uint8_t last = ds.pixels[(size_t)ds.n * ds.width - 1];
		(void)last;
		mbp_dataset_free(&ds);
	}
	close(fi);
	close(fl);
	return 0;
}

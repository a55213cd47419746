/*
 * For the suites that check what mbpipe does with files (test_model, test_safetensors, test_pipetrain,
 * test_pipeserve, test_pipebench): the nodes a save must never replace, made in a test's folder and checked
 * afterwards; bytes overwritten inside a safetensors file's data section; a copy of a model file without
 * its digests, as another tool would write it; a model file that is mostly a hole; the bytes of a file an
 * error message must not show.
 */
#ifndef MBP_TEST_MODEL_FILE_H
#define MBP_TEST_MODEL_FILE_H

#include <check.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* A FIFO, a symbolic link to a regular file, a directory and, where mknod is allowed, a character device
 * (1, 3: what /dev/null is), all in one folder; or, for a user who cannot make one, /dev/null itself,
 * which such a user cannot replace either. */
struct nodes {
	char fifo[512], link[512], target[512], dir[512], dev[512];
	bool have_dev;
};

#define NODE_TARGET_TEXT "the file the link points to\n"

static inline void nodes_make(struct nodes *n, const char *folder)
{
	snprintf(n->fifo, sizeof n->fifo, "%s/fifo.safetensors", folder);
	snprintf(n->link, sizeof n->link, "%s/link.safetensors", folder);
	snprintf(n->target, sizeof n->target, "%s/target.txt", folder);
	snprintf(n->dir, sizeof n->dir, "%s/dir.safetensors", folder);
	snprintf(n->dev, sizeof n->dev, "%s/null.safetensors", folder);
	ck_assert_int_eq(mkfifo(n->fifo, 0600), 0);
	FILE *f = fopen(n->target, "w");
	ck_assert_ptr_nonnull(f);
	fputs(NODE_TARGET_TEXT, f);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(symlink(n->target, n->link), 0);
	ck_assert_int_eq(mkdir(n->dir, 0700), 0);
	n->have_dev = mknod(n->dev, S_IFCHR | 0600, makedev(1, 3)) == 0;
	if (!n->have_dev && geteuid() != 0) {
		snprintf(n->dev, sizeof n->dev, "/dev/null");
		struct stat sb;
		n->have_dev = stat(n->dev, &sb) == 0 && S_ISCHR(sb.st_mode);
	}
}

/* The nodes in a list, for loops: the device last, and only when there is one. */
static inline unsigned nodes_list(const struct nodes *n, const char *out[4])
{
	unsigned k = 0;
	out[k++] = n->fifo;
	out[k++] = n->link;
	out[k++] = n->dir;
	if (n->have_dev)
		out[k++] = n->dev;
	return k;
}

/* Each node is still what it was, and the link's target still holds its text. */
static inline void nodes_assert_intact(const struct nodes *n)
{
	struct stat sb;
	ck_assert_msg(lstat(n->fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "%s is no longer a FIFO", n->fifo);
	ck_assert_msg(lstat(n->link, &sb) == 0 && S_ISLNK(sb.st_mode), "%s is no longer a link", n->link);
	ck_assert_msg(lstat(n->dir, &sb) == 0 && S_ISDIR(sb.st_mode), "%s is no longer a folder", n->dir);
	if (n->have_dev)
		ck_assert_msg(lstat(n->dev, &sb) == 0 && S_ISCHR(sb.st_mode) && sb.st_rdev == makedev(1, 3),
			      "%s is no longer the device", n->dev);
	char buf[64] = {0};
	FILE *f = fopen(n->target, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_gt(fread(buf, 1, sizeof buf - 1, f), 0);
	fclose(f);
	ck_assert_str_eq(buf, NODE_TARGET_TEXT);
}

static inline void nodes_remove(const struct nodes *n)
{
	unlink(n->fifo);
	unlink(n->link);
	unlink(n->target);
	rmdir(n->dir);
	if (strncmp(n->dev, "/dev/", 5))
		unlink(n->dev);
}

/* Entries of a folder (without . and ..): a refused save leaves no temporary file behind. */
static inline unsigned folder_entries(const char *folder)
{
	DIR *d = opendir(folder);
	ck_assert_ptr_nonnull(d);
	unsigned k = 0;
	for (struct dirent *e; (e = readdir(d));)
		k += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return k;
}

/* The offset of a safetensors file's data section: 8 + its header length. */
static inline uint64_t st_data_offset(const char *path)
{
	int fd = open(path, O_RDONLY);
	ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
	uint64_t n;
	ck_assert_int_eq(pread(fd, &n, 8, 0), 8);
	close(fd);
	return 8 + le64toh(n);
}

/* Overwrite 8 bytes `at` bytes into the data section (the file keeps its size). */
static inline void st_overwrite8(const char *path, uint64_t at)
{
	int fd = open(path, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	const char junk[8] = {'\x7f', '\x7f', '\x7f', '\x7f', 'J', 'U', 'N', 'K'};
	ck_assert_int_eq(pwrite(fd, junk, 8, (off_t)(st_data_offset(path) + at)), 8);
	ck_assert_int_eq(close(fd), 0);
}

/* Copy a safetensors file with the digests left out of its metadata: a file as another tool writes it. */
static inline void st_copy_without_digests(const char *from, const char *to)
{
	int fd = open(from, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	struct stat sb;
	ck_assert_int_eq(fstat(fd, &sb), 0);
	char *b = malloc((size_t)sb.st_size);
	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(pread(fd, b, (size_t)sb.st_size, 0), sb.st_size);
	close(fd);
	uint64_t n;
	memcpy(&n, b, 8);
	n = le64toh(n);
	cJSON *h = cJSON_ParseWithLength(b + 8, n);
	ck_assert_ptr_nonnull(h);
	cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
	for (cJSON *c = meta ? meta->child : NULL, *next; c; c = next) {
		next = c->next;
		size_t kl = strlen(c->string);
		if (kl > 6 && !strcmp(c->string + kl - 6, ".crc32"))
			cJSON_Delete(cJSON_DetachItemViaPointer(meta, c));
	}
	char *text = cJSON_PrintUnformatted(h);
	ck_assert_ptr_nonnull(text);
	size_t tl = strlen(text), padded = (tl + 7) & ~(size_t)7;
	FILE *f = fopen(to, "wb");
	ck_assert_ptr_nonnull(f);
	uint64_t le = htole64(padded);
	fwrite(&le, 8, 1, f);
	fwrite(text, 1, tl, f);
	for (size_t i = tl; i < padded; i++)
		fputc(' ', f);
	fwrite(b + 8 + n, 1, (size_t)sb.st_size - 8 - n, f);
	ck_assert_int_eq(fclose(f), 0);
	cJSON_free(text);
	cJSON_Delete(h);
	free(b);
}

/* A model file of L layers of the widths w (F32, weight and bias each) whose data section is a hole: the
 * header says gigabytes, the disk holds a few KiB. false when the file system has no sparse files. */
static inline bool st_write_sparse(const char *path, const uint32_t *w, unsigned L)
{
	char h[4096];
	size_t len = (size_t)snprintf(h, sizeof h, "{");
	uint64_t off = 0;
	for (unsigned i = 0; i < L; i++) {
		uint64_t wb = (uint64_t)w[i] * w[i + 1] * 4, bb = (uint64_t)w[i + 1] * 4;
		len += (size_t)snprintf(
		    h + len, sizeof h - len,
		    "%s\"layers.%u.weight\":{\"dtype\":\"F32\",\"shape\":[%u,%u],"
		    "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]},\"layers.%u.bias\":{\"dtype\":"
		    "\"F32\",\"shape\":[%u],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
		    i ? "," : "", i, w[i + 1], w[i], off, off + wb, i, w[i + 1], off + wb, off + wb + bb);
		off += wb + bb;
	}
	len += (size_t)snprintf(h + len, sizeof h - len, "}");
	ck_assert_uint_lt(len, sizeof h);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	uint64_t le = htole64(len);
	ck_assert_int_eq(pwrite(fd, &le, 8, 0), 8);
	ck_assert_int_eq(pwrite(fd, h, len, 8), (ssize_t)len);
	bool ok = ftruncate(fd, (off_t)(8 + len + off)) == 0;
	close(fd);
	if (!ok)
		unlink(path);
	return ok;
}

/*
 * Whether text shows any of a file's bytes: a run of 5 of them (printable ones) copied into it, or its
 * first 8 bytes read as a number (little-endian, as a header length is; in decimal or hexadecimal).
 * `skip` (may be NULL) is left out of text first: the file's own name, which the message names.
 */
static inline bool shows_file_bytes(const char *text, const unsigned char *file, size_t len, const char *skip)
{
	char *t = strdup(text);
	ck_assert_ptr_nonnull(t);
	for (char *p; skip && *skip && (p = strstr(t, skip));)
		memset(p, '#', strlen(skip));
	bool shown = false;
	for (size_t i = 0; i + 5 <= len && !shown; i++) {
		bool printable = true;
		for (size_t k = 0; k < 5; k++)
			printable &= file[i + k] >= 0x20 && file[i + k] < 0x7f;
		if (printable && memmem(t, strlen(t), file + i, 5))
			shown = true;
	}
	if (len >= 8 && !shown) {
		uint64_t v;
		memcpy(&v, file, 8);
		v = le64toh(v);
		char num[3][32];
		snprintf(num[0], sizeof num[0], "%" PRIu64, v);
		snprintf(num[1], sizeof num[1], "%" PRIx64, v);
		snprintf(num[2], sizeof num[2], "%" PRIu64, v & 0xffffffffu);
		for (int k = 0; k < 3 && !shown; k++)
			shown = strlen(num[k]) >= 4 && strstr(t, num[k]);
	}
	free(t);
	return shown;
}

#endif

/*
 * For the tests that run a tool as the user does (test_pipebench, test_pipetrain): what a run gave (its
 * exit status, standard output and error, read back from the temporary files they were sent to), and
 * counting lines.
 */
#ifndef MBP_TEST_TOOL_RUN_H
#define MBP_TEST_TOOL_RUN_H

#include <check.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct run {
	int status; /* exit status; see each test for what a signal gives */
	char *out, *err;
};

/* The whole of an open file, NUL-terminated (malloc'd). */
static char *slurp(int fd)
{
	struct stat st;
	ck_assert_int_eq(fstat(fd, &st), 0);
	char *buf = malloc((size_t)st.st_size + 1);
	ck_assert_ptr_nonnull(buf);
	ssize_t n = pread(fd, buf, (size_t)st.st_size, 0);
	ck_assert_int_eq(n, st.st_size);
	buf[n] = 0;
	return buf;
}

static void run_free(struct run *r)
{
	free(r->out);
	free(r->err);
}

static unsigned lines(const char *s)
{
	unsigned n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

#endif

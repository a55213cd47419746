/*
 * A temporary folder per test for the suites that write files (test_mlp, test_data): tmpdir_make() in the
 * fixture's setup, tmpdir_remove() in its teardown, tmpdir_path() for a file in it.
 */
#ifndef MBP_TEST_TMPDIR_H
#define MBP_TEST_TMPDIR_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

static char tmpdir[64];

static inline void tmpdir_make(const char *tag)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/mbp-%s-XXXXXX", tag);
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static inline void tmpdir_remove(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	ck_assert_int_eq(system(cmd), 0);
}

/* "<tmpdir>/<name>" in one of 8 rotating buffers: keep a copy to use it after 8 more calls. */
static inline const char *tmpdir_path(const char *name)
{
	static char p[8][128];
	static int k;
	k = (k + 1) % 8;
	snprintf(p[k], sizeof(p[k]), "%s/%s", tmpdir, name);
	return p[k];
}

#endif

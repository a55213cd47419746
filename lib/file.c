/*
 * mbp_file: one implementation of "write a file by rename" for everything mbpipe writes (model files,
 * optimizer states, traces, the tools' outputs), and the check a program runs on its output paths at start.
 *
 * The order of a write: the path looked at with lstat (absent or a regular file, or it is refused before
 * any work); a fresh temporary name beside it (O_EXCL, so two writers never share one); the contents; fflush
 * and fsync; the path looked at again; rename; fsync of the folder, so that the rename itself survives a
 * crash (without it the old file may come back, whole, which is still not half a file). The check creates
 * and removes a file under the same kind of name, so that what makes a write fail at the end (a folder that
 * does not exist or cannot be written, a name too long with the suffix, a read-only or full file system)
 * fails the check at the start.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbpipe.h>

#include "common.h"

struct mbp_file {
	FILE *f;
	char *path, *tmp;
};

const char *mbp__file_kind(unsigned mode)
{
	return S_ISREG(mode)	? "a regular file"
	       : S_ISDIR(mode)	? "a directory"
	       : S_ISLNK(mode)	? "a symbolic link"
	       : S_ISFIFO(mode) ? "a FIFO"
	       : S_ISCHR(mode)	? "a character device"
	       : S_ISBLK(mode)	? "a block device"
	       : S_ISSOCK(mode) ? "a socket"
				: "not a regular file";
}

static void say(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t n, const char *fmt, ...)
{
	if (!why || !n)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
}

/* The path is absent or a regular file, not followed. */
static int target_ok(const char *path, char *why, size_t n)
{
	struct stat sb;
	if (lstat(path, &sb) == 0) {
		if (S_ISREG(sb.st_mode))
			return 0;
		say(why, n, "is %s, not a regular file: only a regular file is replaced",
		    mbp__file_kind(sb.st_mode));
		return -EEXIST;
	}
	if (errno == ENOENT)
		return 0;
	int e = errno;
	say(why, n, "cannot look at it: %s", strerror(e));
	return -e;
}

/* The folder part of path, for messages. */
static void folder_of(const char *path, char *dir, size_t n)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(dir, n, ".");
	else
		snprintf(dir, n, "%.*s", slash == path ? 1 : (int)(slash - path), path);
}

/* Create a fresh file beside path, "<path>.tmp.<pid>.<n>", mode 0666 under the umask (mkstemp's 0600 would
 * leave a model unreadable to a server's other users). @return its descriptor and *tmp (malloc'd), or
 * -errno with why filled. */
static int tmp_create(const char *path, char **tmp, char *why, size_t n)
{
	static _Atomic unsigned serial;
	size_t len = strlen(path) + 48;
	char *name = malloc(len);
	if (!name) {
		say(why, n, "out of memory");
		return -ENOMEM;
	}
	int fd = -1;
	for (int tries = 0; fd < 0 && tries < 100; tries++) {
		/* relaxed: a number for a name, nothing published with it */
		unsigned k = atomic_fetch_add_explicit(&serial, 1, memory_order_relaxed);
		snprintf(name, len, "%s.tmp.%ld.%u", path, (long)getpid(), k);
		fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0) {
		int e = errno;
		char dir[512];
		folder_of(path, dir, sizeof dir);
		say(why, n, "cannot create a file in %s: %s", dir, strerror(e));
		free(name);
		return -e;
	}
	*tmp = name;
	return fd;
}

int mbp_file_check(const char *path, char *why, size_t n)
{
	say(why, n, "%s", "");
	if (!path || !*path) {
		say(why, n, "no file name");
		return -EINVAL;
	}
	int rc = target_ok(path, why, n);
	if (rc)
		return rc;
	char *tmp;
	int fd = tmp_create(path, &tmp, why, n);
	if (fd < 0)
		return fd;
	close(fd);
	unlink(tmp);
	free(tmp);
	return 0;
}

int mbp_file_new(mbp_file **out, const char *path)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!path || !*path)
		return -EINVAL;
	int rc = target_ok(path, NULL, 0);
	if (rc)
		return rc;
	mbp_file *f = calloc(1, sizeof(*f));
	if (!f || !(f->path = strdup(path))) {
		free(f);
		return -ENOMEM;
	}
	int fd = tmp_create(path, &f->tmp, NULL, 0);
	if (fd < 0) {
		free(f->path);
		free(f);
		return fd;
	}
	if (!(f->f = fdopen(fd, "wb"))) {
		rc = -errno;
		close(fd);
		mbp_file_destroy(f);
		return rc;
	}
	*out = f;
	return 0;
}

FILE *mbp_file_stream(mbp_file *f)
{
	return f ? f->f : NULL;
}

static void file_free(mbp_file *f)
{
	free(f->tmp);
	free(f->path);
	free(f);
}

void mbp_file_destroy(mbp_file *f)
{
	if (!f)
		return;
	if (f->f)
		fclose(f->f);
	unlink(f->tmp);
	file_free(f);
}

int mbp_file_commit(mbp_file *f)
{
	if (!f)
		return -EINVAL;
	int rc = 0;
	errno = 0;
	if (ferror(f->f))
		rc = -EIO;
	else if (fflush(f->f) != 0)
		rc = errno ? -errno : -EIO;
	else if (fsync(fileno(f->f)) != 0)
		rc = -errno;
	if (fclose(f->f) != 0 && !rc)
		rc = errno ? -errno : -EIO;
	f->f = NULL;
	if (!rc)
		rc = target_ok(f->path, NULL, 0);
	if (!rc && rename(f->tmp, f->path) != 0)
		rc = -errno;
	if (rc) {
		unlink(f->tmp);
		file_free(f);
		return rc;
	}
	/* The rename is in the folder: flush it too. A folder that cannot be flushed (some file systems
	 * refuse fsync on a directory) leaves the new file in place all the same. */
	char dir[4096];
	folder_of(f->path, dir, sizeof dir);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		(void)fsync(dfd);
		close(dfd);
	}
	file_free(f);
	return 0;
}

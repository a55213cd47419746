/*
 * mbp_file: one implementation of "write a file by rename" for everything mbpipe writes (model files,
 * optimizer states, traces, the tools' outputs), and the check a program runs on its output paths at start.
 *
 * The order of a write: the path looked at with lstat (absent or a regular file, or it is refused before
 * any work); a fresh temporary name beside it (O_EXCL, so two writers never share one); the contents; fflush
 * and fsync; the path looked at again; rename; fsync of the folder, so that the rename itself survives a
 * crash (without it the old file may come back, whole, which is still not half a file). The stream is a
 * stdio stream over our own write (fopencookie), so that the first write's errno (ENOSPC, EFBIG, EDQUOT)
 * is what the commit returns, not the bare error indicator a FILE keeps. The check creates
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
	int fd;
	int err; /* the first write's errno: what the stream's error indicator alone would lose */
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

/* The stream's functions (fopencookie): plain write and lseek on the descriptor, keeping the first error. */
static ssize_t cookie_write(void *c, const char *buf, size_t n)
{
	mbp_file *f = c;
	size_t done = 0;
	while (done < n) {
		ssize_t w = write(f->fd, buf + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			if (!f->err)
				f->err = errno;
			return done ? (ssize_t)done : -1;
		}
		done += (size_t)w;
	}
	return (ssize_t)done;
}

static int cookie_seek(void *c, off64_t *off, int whence)
{
	mbp_file *f = c;
	off64_t r = lseek64(f->fd, *off, whence);
	if (r < 0)
		return -1;
	*off = r;
	return 0;
}

static int cookie_close(void *c)
{
	mbp_file *f = c;
	int rc = close(f->fd);
	f->fd = -1;
	return rc;
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
	f->fd = tmp_create(path, &f->tmp, NULL, 0);
	if (f->fd < 0) {
		rc = f->fd;
		free(f->path);
		free(f);
		return rc;
	}
	cookie_io_functions_t io = {.write = cookie_write, .seek = cookie_seek, .close = cookie_close};
	if (!(f->f = fopencookie(f, "wb", io))) {
		rc = -ENOMEM;
		close(f->fd);
		mbp_file_destroy(f);
		return rc;
	}
	setvbuf(f->f, NULL, _IOFBF, (size_t)1 << 16); /* fewer, larger writes than BUFSIZ's */
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
	if (fflush(f->f) != 0 || ferror(f->f))
		rc = f->err ? -f->err : -EIO;
	else if (fsync(f->fd) != 0)
		rc = -errno;
	if (fclose(f->f) != 0 && !rc)
		rc = -errno;
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

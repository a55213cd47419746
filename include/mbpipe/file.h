/*
 * mbp_file: how mbpipe writes every file it writes, by rename.
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * A file is written under a fresh name in its own folder ("<path>.tmp.<pid>.<n>", created with mode 0666
 * under the umask, as files usually are), flushed to disk (fsync), then renamed over the path, and the
 * folder is flushed: a reader, or the file after a crash, sees the old whole file or the new whole file,
 * never a part of one. The rename replaces nothing but a regular file. A path that names anything else (a
 * directory, a device such as /dev/full, a FIFO, a socket, a symbolic link whatever it points to) is
 * refused naming what it is, before any work starts, and again just before the rename, so that a node the
 * user named by mistake is never destroyed (rename(2) has no "only if it is a regular file": a node made
 * at the path between that last check and the rename is not seen).
 *
 * Everything mbpipe writes goes this way: model files (mbp_model_write_random, mbp_mlp_save), optimizer
 * states (mbp_mlp_save_optim), traces (mbp_pipeline_trace_write, mbp_trainer_trace_write) and the
 * tools' output files. A program checks each of its output paths with mbp_file_check() when it starts, so
 * that a path that cannot be written fails before a long run rather than after it:
 *
 *     char why[256];
 *     if (mbp_file_check(path, why, sizeof why) < 0)
 *             errx(2, "%s: %s", path, why);            // "/dev/full: is a character device, ..."
 *     ...                                             // the long run
 *     mbp_file *f;
 *     int rc = mbp_file_new(&f, path);
 *     if (rc == 0) {
 *             fprintf(mbp_file_stream(f), "...");
 *             rc = mbp_file_commit(f);                 // in place; or mbp_file_destroy(f) to give up
 *     }
 *
 * Thread safety: different mbp_file objects may be used on different threads at once; one object by one
 * thread at a time. mbp_file_check is thread-safe.
 */
#ifndef MBPIPE_FILE_H
#define MBPIPE_FILE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mbp_file mbp_file;

/**
 * Check that a file can be written at path by rename, without writing it.
 *
 * The path must be absent or a regular file (a symbolic link is not followed: it is refused), and its
 * folder must take a new file: one is created there under the name a write would use, and removed at once.
 * Nothing at the path is touched.
 *
 * @param path the file to write
 * @param why  optional: receives one line saying what is wrong, without the path ("is a FIFO, not a
 *             regular file: only a regular file is replaced", "cannot create a file in /proc: No such file
 *             or directory"); "" on success
 * @param n    size of why
 * @return 0; -EEXIST (the path exists and is not a regular file), -EINVAL (path NULL or empty), or the
 *         system's -errno for a path that cannot be looked at or a folder that cannot take a file
 *         (-ENOENT, -EACCES, -ENOTDIR, -EROFS, -ENOSPC, -ENAMETOOLONG ...).
 */
int mbp_file_check(const char *path, char *why, size_t n);

/**
 * Start writing a file by rename: the path checked as by mbp_file_check(), then the temporary file made.
 * Pair with mbp_file_commit() (the file takes the path) or mbp_file_destroy() (it is removed).
 *
 * @param f    receives the file
 * @param path where it will be; the string is copied
 * @return 0, or as mbp_file_check(); -ENOMEM.
 */
int mbp_file_new(mbp_file **f, const char *path);

/**
 * The stream to write the file's contents to (binary, fully buffered; it has no descriptor of its own for
 * fileno()). Do not close it. It may seek (fseek), to fill in at the end what is known only then. A write
 * that fails is reported, with its errno, by mbp_file_commit().
 * @return the stream; NULL for NULL.
 */
FILE *mbp_file_stream(mbp_file *f);

/**
 * Put the file in place: flush the stream, fsync it, check the path again (absent or a regular file),
 * rename over it, fsync the folder. Consumes f whatever the outcome; on failure the temporary file is
 * removed and the path is as it was.
 *
 * @return 0; the first failed write's -errno (-ENOSPC, -EDQUOT, -EFBIG ...), -EEXIST (the path became
 *         something other than a regular file), -EINVAL (NULL), or the system's -errno for the fsync or
 *         the rename.
 */
int mbp_file_commit(mbp_file *f);

/** Give up a file: its temporary file is removed, the path is left as it was. Accepts NULL. */
void mbp_file_destroy(mbp_file *f);

#ifdef __cplusplus
}
#endif
#endif

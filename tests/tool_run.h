/*
 * For the tests that run a tool as the user does (test_pipebench, test_pipetrain): starting it with its
 * standard output and error sent to temporary files, what a run gave (its exit status, standard output
 * and error, read back from those files), and counting lines.
 */
#ifndef MBP_TEST_TOOL_RUN_H
#define MBP_TEST_TOOL_RUN_H

#include <check.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether the dense layers run on the packed kernel by default on this CPU (AVX2 and FMA; else OpenBLAS):
 * what the tools should name as the dense kernel when MBP_KERNEL does not choose one. */
static inline bool cpu_runs_packed_kernel(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

struct run {
	int status; /* exit status, or 128 + the signal that ended the tool (as a shell reports it) */
	char *out, *err;
};

/* A tool started and not yet waited for; its standard output and error go to out_fd and err_fd. */
struct tool_proc {
	pid_t pid;
	int out_fd, err_fd;
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

/*
 * Start bin with args (NULL-terminated, without argv[0]) in our environment less the entries that begin
 * with one of drop (NULL-terminated prefixes such as "PIPETRAIN_FAULT="; NULL: none), plus extra
 * (NULL-terminated entries, or NULL).
 */
static inline struct tool_proc tool_spawn(const char *bin, const char *const *drop, const char *const *extra,
					  const char *const *args)
{
	extern char **environ;
	char out_path[] = "/tmp/mbp-tool-out-XXXXXX", err_path[] = "/tmp/mbp-tool-err-XXXXXX";
	struct tool_proc p = {.out_fd = mkstemp(out_path), .err_fd = mkstemp(err_path)};
	ck_assert(p.out_fd >= 0 && p.err_fd >= 0);
	unlink(out_path);
	unlink(err_path);
	char *argv[64];
	unsigned n = 0;
	argv[n++] = (char *)bin;
	for (unsigned i = 0; args[i]; i++) {
		ck_assert_uint_lt(n, 63);
		argv[n++] = (char *)args[i];
	}
	argv[n] = NULL;
	char *envp[256];
	unsigned e = 0;
	for (char **q = environ; *q; q++) {
		bool keep = true;
		for (unsigned d = 0; drop && drop[d] && keep; d++)
			keep = strncmp(*q, drop[d], strlen(drop[d])) != 0;
		if (keep) {
			ck_assert_uint_lt(e, 240);
			envp[e++] = *q;
		}
	}
	for (unsigned i = 0; extra && extra[i]; i++) {
		ck_assert_uint_lt(e, 255);
		envp[e++] = (char *)extra[i];
	}
	envp[e] = NULL;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p.out_fd, STDOUT_FILENO);
	posix_spawn_file_actions_adddup2(&fa, p.err_fd, STDERR_FILENO);
	int rc = posix_spawn(&p.pid, bin, &fa, NULL, argv, envp);
	ck_assert_msg(rc == 0, "cannot start %s: %s", bin, strerror(rc));
	posix_spawn_file_actions_destroy(&fa);
	return p;
}

/* Wait for the tool and read back what it wrote. */
static inline struct run tool_finish(struct tool_proc p)
{
	int ws;
	ck_assert_int_eq(waitpid(p.pid, &ws, 0), p.pid);
	struct run r = {.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws)};
	r.out = slurp(p.out_fd);
	r.err = slurp(p.err_fd);
	close(p.out_fd);
	close(p.err_fd);
	return r;
}

/* tool_spawn, then tool_finish. */
static inline struct run tool_run(const char *bin, const char *const *drop, const char *const *extra,
				  const char *const *args)
{
	return tool_finish(tool_spawn(bin, drop, extra, args));
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

/*
 * The served model at start-up: see model.h.
 *
 * A model file is opened here (O_NONBLOCK: a FIFO is refused as not a regular file instead of blocking)
 * and loaded within --max-model-bytes and --load-timeout-ms, the bounds a reload has too; a failure is the
 * file's fault (exit 2) unless the machine's (memory, I/O, time: exit 1). The demo model is written with
 * its random weights into a fresh temporary directory and loaded from there like any file, then the file
 * is removed (the mapping stays). One process splits the model by measured layer cost
 * (mbp_model_balance); under mpirun the split is by layer count, planned by ps_mpi_load.
 */
#include "config.h"

#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/digest.h"
#ifdef PS_WITH_MPI
#include "mpi.h"
#endif

/* Whether a failed load of --model is the file's fault (exit 2) rather than the machine's (exit 1). */
static bool arg_problem(int rc)
{
	return rc != -ENOMEM && rc != -EIO && rc != -ETIMEDOUT && rc != -EINTR;
}

/* Load the model file that the option `opt` names (with the --max-model-bytes and --load-timeout-ms
 * bounds). @return 0, PS_EUSAGE (the file's fault) or another -errno, with one line said naming both. */
static int load_model_file(const ps_config *c, const char *opt, const char *path, mbp_model **m)
{
	mbp_model_error e;
	mbp_model_load_opts lo = {.max_bytes = c->max_model_bytes,
				  .timeout_ns = c->load_timeout_ms * 1000000};
	char note[PATH_MAX + 128];
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	int rc = fd < 0 ? -errno : mbp_model_load_fd(m, fd, path, &lo, &e);
	if (fd >= 0)
		close(fd);
	if (rc && fd < 0)
		ps_say("%s: %s: %s", opt, path, strerror(-rc));
	else if (rc)
		ps_say("%s: %s", opt, e.msg); /* e.msg begins with the file's name */
	else if (digest_note_line(*m, path, note, sizeof note))
		ps_say("note: %s", note);
	return rc && arg_problem(rc) ? PS_EUSAGE : rc;
}

/* Write the demo model into a fresh temporary directory, load it, remove the file (the mapping stays). */
static int load_demo(ps_server *s)
{
	const mbp_model_spec ms = s->cfg.demo_spec;
	const char *tmp = getenv("TMPDIR");
	char dir[512], path[600];
	snprintf(dir, sizeof dir, "%s/pipeserve-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		int rc = -errno;
		ps_say("cannot create a temporary directory for the demo model in %s: %s",
		       tmp && *tmp ? tmp : "/tmp", strerror(-rc));
		return rc;
	}
	snprintf(path, sizeof path, "%s/demo.safetensors", dir);
	int rc = mbp_model_write_random(path, &ms);
	mbp_model_error e = {0};
	if (rc) {
		ps_say("cannot make the demo model: %s", mbp_strerror(rc));
	} else if (s->mpi) { /* every rank writes the same demo model (one seed) and loads its layers */
#ifdef PS_WITH_MPI
		rc = ps_mpi_load(s, path);
#endif
	} else if ((rc = mbp_model_load(&s->model, path, &e))) {
		ps_say("cannot make the demo model: %s", rc == e.code ? e.msg : mbp_strerror(rc));
	}
	unlink(path);
	rmdir(dir);
	return rc;
}

/* The weights: --model (under mpirun this rank's layers of it) or the demo model. */
static int load_weights(ps_server *s)
{
	if (!s->cfg.model_path)
		return load_demo(s);
	int rc = 0;
	if (s->mpi) {
#ifdef PS_WITH_MPI
		rc = ps_mpi_load(s, s->cfg.model_path);
#endif
	} else {
		rc = load_model_file(&s->cfg, "--model", s->cfg.model_path, &s->model);
	}
	if (rc)
		return rc;
	s->model_path = strdup(s->cfg.model_path);
	return s->model_path ? 0 : -ENOMEM;
}

/* --rebalance: each move on standard error, with its reason, which names the new cuts (stage 0's thread). */
static void log_move(void *arg, const mbp_model_move *mv)
{
	(void)arg;
	ps_say("rebalance: plan %llu: %s", (unsigned long long)mv->plan, mv->reason);
}

int ps_model_setup(ps_server *s)
{
	int rc = load_weights(s);
	if (rc)
		return rc;
	ps_flags_model_name(&s->cfg, s->name, sizeof s->name); /* checked with the flags */

	unsigned stages = s->plan.stages; /* under mpirun: this rank's, planned by ps_mpi_load */
	long reps = ps_flags_replicas(&s->cfg, s->mpi); /* 0: none asked, UINT32_MAX: auto */
	if (reps < 0)
		return PS_EUSAGE;
	if (s->mpi && s->cfg.rebalance_replicas) {
		ps_say(
		    "--rebalance-replicas: not under mpirun (each rank runs its stages on one thread each)");
		return PS_EUSAGE;
	}
	int ncpu = s->mpi ? 0 : mbp_cpus_allowed(NULL, 0, NULL);
	unsigned cpus = ncpu > 0 ? (unsigned)ncpu : 1;
	if (!s->mpi) {
		/* the default: one stage per CPU; with N replicas each, one per N CPUs */
		unsigned deflt = reps > 0 && reps != UINT32_MAX ? cpus / (unsigned)reps : cpus;
		stages = ps_flags_stages(&s->cfg, mbp_model_layers(s->model), deflt ? deflt : 1);
		if (!stages)
			return PS_EUSAGE;
	}
	if (s->mpi)
		rc = 0;
	else if (reps == UINT32_MAX) /* auto: --stages of them, or any number, over the CPUs */
		rc = mbp_model_balance_replicas(s->model, s->cfg.stages ? stages : 0,
						cpus > MBP_MAX_STAGES ? MBP_MAX_STAGES : cpus,
						s->cfg.max_batch_rows, -1, &s->plan);
	else
		rc = mbp_model_balance(s->model, stages, s->cfg.max_batch_rows, -1, &s->plan);
	for (unsigned i = 0; !rc && reps > 0 && reps != UINT32_MAX && i < s->plan.stages; i++)
		s->plan.replicas[i] = (unsigned)reps;
	mbp_model_stages_opts so = {.rebalance = {.on = s->cfg.rebalance,
						  .on_move = log_move,
						  .replicas = s->cfg.rebalance_replicas}};
	if (!rc)
		rc = mbp_model_stages_new_opts(&s->stages, s->model, &s->plan, s->cfg.max_batch_rows, &so);
	if (rc) {
		ps_say("cannot split the model into %u stages: %s", stages, mbp_strerror(rc));
		return rc;
	}
	s->info = (ps_model_info){.name = s->name,
				  .version = "1",
				  .platform = "mbpipe",
				  .input_name = "input",
				  .output_name = "output",
				  .in_width = mbp_model_in_width(s->model),
				  .out_width = s->mpi ? s->out_width : mbp_model_out_width(s->model),
				  .max_rows = s->cfg.max_queue_rows};
	return 0;
}

void ps_model_teardown(ps_server *s)
{
	mbp_model_stages_destroy(s->stages);
	s->stages = NULL;
	mbp_model_destroy(s->model);
	s->model = NULL;
	free(s->model_path);
	s->model_path = NULL;
}

int ps_model_write_demo(const ps_config *c)
{
	int rc = mbp_model_write_random(c->write_demo, &c->demo_spec);
	if (rc) {
		fprintf(stderr, "pipeserve: cannot write %s: %s\n", c->write_demo, mbp_strerror(rc));
		return 1;
	}
	printf("wrote %s\n", c->write_demo);
	return 0;
}

int ps_model_describe(const ps_config *c)
{
	mbp_model *m = NULL;
	int rc = load_model_file(c, "--describe", c->describe, &m);
	if (rc)
		return rc == PS_EUSAGE ? 2 : 1;
	int n = mbp_model_describe(m, NULL, 0);
	char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (text) {
		mbp_model_describe(m, text, (size_t)n + 1);
		printf("%s: %u -> %u floats per row\n%s", c->describe, mbp_model_in_width(m),
		       mbp_model_out_width(m), text);
	}
	free(text);
	mbp_model_destroy(m);
	return text ? 0 : 1;
}

/*
 * Internal to libmbpipe-mpi: the communication thread's task interface (comm.c), used by the pipeline
 * across ranks (mpi.c). Not installed.
 */
#ifndef MBP__MPI_INTERNAL_H
#define MBP__MPI_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <mpi.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

/* Whether mbp_mpi_init() succeeded. */
bool mbp__mpi_started(void);
/* Run fn(arg) on the communication thread (after the task before it): returns a ticket for await. */
uint64_t mbp__mpi_post(int (*fn)(void *), void *arg);
/* Wait for a posted task; its return value. */
int mbp__mpi_await(uint64_t ticket);
/* Post and await. */
int mbp__mpi_call(int (*fn)(void *), void *arg);
/* Collective over every rank, before a rank's local pipeline or trainer starts: this rank is the k-th of
 * the m ranks of its node (MPI_COMM_TYPE_SHARED) whose threads may use the same CPUs as the calling
 * thread's (compared by affinity mask); they split them (pipeline.h, "Placement"). 0 or -errno (then
 * k = m = 0: no split). */
int mbp__mpi_node_share(unsigned *k, unsigned *m);
/* mbp_mpi_finalize() is to abort, not finalize (a rank went silent). */
void mbp__mpi_abort_at_end(void);
/* On the communication thread: MPI_Abort now if mbp_mpi_abort() asked for it. */
void mbp__mpi_check_abort(void);
/* A mutex and two condition variables on CLOCK_MONOTONIC (for timed waits on mbp__mpi_deadline). */
void mbp__mpi_sync_init(pthread_mutex_t *m, pthread_cond_t *a, pthread_cond_t *b);
/* CLOCK_MONOTONIC's now plus timeout_ns. */
void mbp__mpi_deadline(int64_t timeout_ns, struct timespec *ts);
/* Zero fields of `o` get mbp_mpi_opts_init's defaults; spin_ns MBP_SPIN_NONE becomes 0 (once per struct). */
void mbp__mpi_opts_fill(mbp_mpi_opts *o);
/* How long a link loop parks, `quiet` ns after its last event (mpi.c explains the ramp): 1 us up to
 * idle_ns. */
uint64_t mbp__mpi_park_ns(uint64_t quiet, uint64_t idle_ns);
/* On the communication thread: wait for a request (cancelled first if `cancel`), at most until `deadline`
 * (mbp__now_ns); then leave it (the run failed and MPI_Abort follows). */
void mbp__mpi_finish(MPI_Request *rq, bool cancel, uint64_t deadline);

#endif

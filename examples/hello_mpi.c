/*
 * The smallest program across MPI ranks: every rank runs one stage that doubles a float; rank 0 submits
 * one job of 1000 rows in micro-batches of 50 and gets the results back from the last rank. Build it
 * against an installed mbpipe and run it with 2 ranks:
 *     cc hello_mpi.c $(pkg-config --static --cflags --libs mbpipe-mpi)
 *     mpirun -np 2 ./a.out
 */
#include <math.h>
#include <stdio.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

static int twice(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	const float *x = in->data;
	float *y = out->data;
	for (size_t i = 0; i < (size_t)in->rows * in->row_bytes / sizeof(float); i++)
		y[i] = 2 * x[i];
	return 0;
}

int main(int argc, char **argv)
{
	enum { ROWS = 1000, COLS = 8 };
	static float in[ROWS][COLS], out[ROWS][COLS];
	int rc = mbp_mpi_init(&argc, &argv); /* MPI runs on the library's communication thread */
	if (rc) {
		fprintf(stderr, "hello_mpi: %s\n", mbp_strerror(rc));
		return 1;
	}
	int rank = mbp_mpi_rank(), ranks = mbp_mpi_size();
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = sizeof(in[0]);
	mbp_mpi *mp;
	rc = mbp_mpi_new(&mp, &o, NULL);
	mbp_stage_desc d = {.name = "twice", .fn = twice};
	if (rc == 0)
		rc = mbp_mpi_add_stage(mp, &d); /* this rank's stages: here one */
	if (rc == 0)
		rc = mbp_mpi_start(mp); /* every rank: checks the widths, opens the links */
	if (rc == 0 && rank == 0) {
		for (int r = 0; r < ROWS; r++)
			for (int c = 0; c < COLS; c++)
				in[r][c] = (float)(r + c);
		rc = mbp_mpi_run(mp, in, out, ROWS, 50);
		if (rc == 0)
			rc = mbp_mpi_drain(mp, -1); /* ends the run on every rank */
	} else if (rc == 0) {
		rc = mbp_mpi_wait(mp, -1); /* serve until rank 0 ends the run */
	}
	if (rc)
		fprintf(stderr, "hello_mpi: rank %d: %s %s\n", rank, mbp_strerror(rc), mbp_mpi_error(mp));
	mbp_mpi_destroy(mp);
	mbp_mpi_finalize();
	if (rc)
		return 1;
	if (rank != 0)
		return 0;
	float want = ldexpf((float)(999 + 7), ranks);
	printf("hello_mpi: %d ranks, out[999][7] = %g (want %g)\n", ranks, out[999][7], want);
	return out[999][7] == want ? 0 : 1;
}

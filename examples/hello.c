/*
 * The smallest mbpipe program: two stages that each double a float, one job of 1000 rows in micro-batches
 * of 50. Build it against an installed mbpipe:
 *     cc hello.c $(pkg-config --static --cflags --libs mbpipe)
 */
#include <stdio.h>

#include <mbpipe.h>

static int twice(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	const float *x = in->data;
	float *y = out->data;
	for (size_t i = 0; i < (size_t)in->rows * in->row_bytes / sizeof(float); i++)
		y[i] = 2 * x[i];
	return 0;
}

int main(void)
{
	enum { ROWS = 1000, COLS = 8 };
	static float in[ROWS][COLS], out[ROWS][COLS];
	for (int r = 0; r < ROWS; r++)
		for (int c = 0; c < COLS; c++)
			in[r][c] = (float)(r + c);

	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = sizeof(in[0]);
	mbp_pipeline *p;
	int rc = mbp_pipeline_new(&p, &o);
	mbp_stage_desc d = {.name = "twice", .fn = twice};
	for (int i = 0; rc == 0 && i < 2; i++)
		rc = mbp_pipeline_add_stage(p, &d);
	if (rc == 0)
		rc = mbp_pipeline_start(p);
	if (rc == 0)
		rc = mbp_run(p, in, out, ROWS, 50); /* submit, wait, return the job's status */
	if (rc == 0)
		rc = mbp_pipeline_drain(p, -1);
	mbp_pipeline_destroy(p);
	if (rc) {
		fprintf(stderr, "hello: %s\n", mbp_strerror(rc));
		return 1;
	}
	printf("hello: mbpipe %s, out[999][7] = %g (want %g)\n", mbp_version(), out[999][7], 4.0 * (999 + 7));
	return out[999][7] == 4.0f * (999 + 7) ? 0 : 1;
}

/*
 * The toy training pipeline of the trainer's tests (test_train.c, and test_mpi_train.c across ranks): small
 * tanh layers with hand-written backward, an MSE loss, a sequential reference step, and failure injection.
 * Include after <check.h> and <mbpipe.h>.
 */
#ifndef MBP_TRAIN_TOY_H
#define MBP_TRAIN_TOY_H

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define N  4 /* features per row, every stage */
#define LR 0.05f

struct toy {
	float w[N * N], b[N], gw[N * N], gb[N];
	/* failure injection: fail `fail_kind` at micro-batch `fail_mb` with -EIO (fail_kind < 0: never) */
	int fail_kind, fail_mb;
	unsigned sleep_us; /* per operation */
	_Atomic unsigned ops;
	double last_norm, last_loss;
	unsigned updates, discards;
};

static void toy_init(struct toy *t, unsigned seed)
{
	memset(t, 0, sizeof(*t));
	for (int i = 0; i < N * N; i++)
		t->w[i] = (float)(((seed * 7919u + (unsigned)i * 104729u) % 1000) / 1000.0 - 0.5);
	for (int i = 0; i < N; i++)
		t->b[i] = (float)(((seed * 31u + (unsigned)i * 17u) % 100) / 1000.0);
	t->fail_kind = -1;
}

static int maybe_fail(struct toy *t, int kind, const mbp_train_io *io)
{
	atomic_fetch_add(&t->ops, 1);
	if (t->sleep_us)
		usleep(t->sleep_us);
	return t->fail_kind == kind && (int)io->mb == t->fail_mb ? -EIO : 0;
}

/* y = tanh(W x + b); the stash keeps 1 - y^2 */
static int toy_forward(void *ctx, const mbp_train_io *io)
{
	struct toy *t = ctx;
	const float *x = io->in;
	float *y = io->out, *d = io->stash;
	for (uint32_t r = 0; r < io->rows; r++)
		for (int i = 0; i < N; i++) {
			float a = t->b[i];
			for (int k = 0; k < N; k++)
				a += t->w[i * N + k] * x[r * N + k];
			y[r * N + i] = tanhf(a);
			d[r * N + i] = 1.0f - y[r * N + i] * y[r * N + i];
		}
	return maybe_fail(t, MBP_OP_F, io);
}

static int toy_bin(void *ctx, const mbp_train_io *io)
{
	struct toy *t = ctx;
	const float *g = io->dout, *d = io->stash;
	float *dx = io->din;
	if (dx)
		for (uint32_t r = 0; r < io->rows; r++)
			for (int k = 0; k < N; k++) {
				float a = 0;
				for (int i = 0; i < N; i++)
					a += t->w[i * N + k] * g[r * N + i] * d[r * N + i];
				dx[r * N + k] = a;
			}
	return maybe_fail(t, MBP_OP_BIN, io);
}

static int toy_bw(void *ctx, const mbp_train_io *io)
{
	struct toy *t = ctx;
	const float *g = io->dout, *d = io->stash, *x = io->in;
	for (uint32_t r = 0; r < io->rows; r++)
		for (int i = 0; i < N; i++) {
			float gi = g[r * N + i] * d[r * N + i];
			t->gb[i] += gi;
			for (int k = 0; k < N; k++)
				t->gw[i * N + k] += gi * x[r * N + k];
		}
	return maybe_fail(t, MBP_OP_W, io);
}

/* the whole backward: the same arithmetic as B_in then B_w */
static int toy_backward(void *ctx, const mbp_train_io *io)
{
	struct toy *t = ctx;
	int saved = t->fail_kind;
	if (saved == MBP_OP_B)
		t->fail_kind = -1;
	int rc = toy_bin(ctx, io);
	if (rc == 0)
		rc = toy_bw(ctx, io);
	t->fail_kind = saved;
	if (rc == 0 && saved == MBP_OP_B && (int)io->mb == t->fail_mb)
		rc = -EIO;
	return rc;
}

static double toy_grad_sq(void *ctx)
{
	struct toy *t = ctx;
	double s = 0;
	for (int i = 0; i < N * N; i++)
		s += (double)t->gw[i] * t->gw[i];
	for (int i = 0; i < N; i++)
		s += (double)t->gb[i] * t->gb[i];
	return s;
}

/* fail_kind TOY_FAIL_CHECK: the check refuses the step's update (-EIO); TOY_FAIL_UPDATE: the update
 * applies and then says it refused, breaking the check's contract */
#define TOY_FAIL_CHECK	MBP_OP_UPDATE
#define TOY_FAIL_UPDATE (MBP_OP_UPDATE + 1)

static int toy_check(void *ctx)
{
	struct toy *t = ctx;
	return t->fail_kind == TOY_FAIL_CHECK ? -EIO : 0;
}

static void toy_discard(void *ctx)
{
	struct toy *t = ctx;
	memset(t->gw, 0, sizeof(t->gw));
	memset(t->gb, 0, sizeof(t->gb));
	t->discards++;
}

static int toy_update(void *ctx, const mbp_train_update *u)
{
	struct toy *t = ctx;
	for (int i = 0; i < N * N; i++)
		t->w[i] -= LR * t->gw[i];
	for (int i = 0; i < N; i++)
		t->b[i] -= LR * t->gb[i];
	t->last_norm = u->grad_norm;
	t->last_loss = u->loss;
	t->discards--; /* toy_discard counts; an update is not a discard */
	toy_discard(ctx);
	t->updates++;
	return t->fail_kind == TOY_FAIL_UPDATE ? -EIO : 0;
}

/* 0.5 * squared error averaged over the step's rows */
static int mse(void *arg, const mbp_train_io *io, double *loss)
{
	(void)arg;
	const float *y = io->out, *tg = io->targets;
	float *g = io->dout;
	double l = 0;
	for (uint32_t i = 0; i < io->rows * N; i++) {
		float e = y[i] - tg[i];
		l += 0.5 * (double)e * e / (double)io->step_rows;
		g[i] = e / (float)io->step_rows;
	}
	*loss = l;
	return 0;
}

static mbp_train_stage_desc toy_desc(struct toy *t, bool whole)
{
	return (mbp_train_stage_desc){.ctx = t,
				      .out_row_bytes = N * sizeof(float),
				      .stash_row_bytes = N * sizeof(float),
				      .forward = toy_forward,
				      .backward = whole ? toy_backward : NULL,
				      .backward_in = toy_bin,
				      .backward_w = toy_bw,
				      .grad_sq = toy_grad_sq,
				      .check = toy_check,
				      .update = toy_update,
				      .discard = toy_discard};
}

/* The reference: one step, sequentially, micro-batch after micro-batch. Returns the summed loss. */
static inline double reference_step(struct toy *st, unsigned S, const float *in, const float *tg, size_t rows,
				    uint32_t m)
{
	float act[MBP_MAX_STAGES + 1][64 * N], stash[MBP_MAX_STAGES][64 * N], gbuf[2][64 * N];
	double loss = 0;
	for (size_t first = 0; first < rows; first += m) {
		uint32_t r = (uint32_t)(rows - first < m ? rows - first : m);
		mbp_train_io io = {.mb = (uint32_t)(first / m), .rows = r, .step_rows = rows};
		memcpy(act[0], in + first * N, r * N * sizeof(float));
		for (unsigned s = 0; s < S; s++) {
			io.in = act[s];
			io.out = act[s + 1];
			io.stash = stash[s];
			ck_assert_int_eq(toy_forward(&st[s], &io), 0);
		}
		double l;
		io.out = act[S];
		io.targets = tg + first * N;
		io.dout = gbuf[0];
		mse(NULL, &io, &l);
		loss += l;
		for (unsigned s = S; s-- > 0;) {
			io.in = act[s];
			io.stash = stash[s];
			io.dout = gbuf[(S - 1 - s) & 1];
			io.din = s ? gbuf[(S - s) & 1] : NULL;
			ck_assert_int_eq(toy_bin(&st[s], &io), 0);
			ck_assert_int_eq(toy_bw(&st[s], &io), 0);
		}
	}
	mbp_train_update u = {.loss = loss};
	for (unsigned s = 0; s < S; s++)
		toy_update(&st[s], &u);
	return loss;
}

static void make_data(float *in, float *tg, size_t rows, unsigned seed)
{
	for (size_t i = 0; i < rows * N; i++) {
		in[i] = (float)(((seed + i * 2654435761u) % 2000) / 1000.0 - 1.0);
		tg[i] = (float)(((seed * 3 + i * 40503u) % 1000) / 1000.0 - 0.5);
	}
}

#endif

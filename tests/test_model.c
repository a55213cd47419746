/*
 * The model: layer semantics against a naive double-precision reference; the exact partitioner against
 * brute force; the stages (driven by hand and inside a pipeline) against the sequential reference, bit
 * for bit; the weight swap (by hand, step by step, and under load in a pipeline); the files: a save never
 * replaces what is not a regular file, a path that cannot be written fails its check first, and a file of
 * another structure is refused from its header.
 */
#include "config.h"

#include <endian.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <urcu.h>

#include <mbpipe.h>

#include "model/model_internal.h"

#include "check_main.h"
#include "model_file.h"
#include "model_rig.h"

static mbp_model *reload(int k)
{
	char p[128];
	snprintf(p, sizeof(p), "%s/m%d.safetensors", dir, k);
	mbp_model *m;
	ck_assert_int_eq(mbp_model_load(&m, p, NULL), 0);
	return m;
}

/* max |a - b| over a row, relative to the row's largest |b|. */
static double row_rel_err(const float *a, const float *b, size_t n)
{
	double d = 0, s = 1e-30;
	for (size_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		s = fmax(s, fabs((double)b[i]));
	}
	return d / s;
}

/* ---- semantics ---- */

static void naive_forward(const mbp_model *m, const float *x, double *y)
{
	double cur[256], nxt[256];
	for (uint32_t i = 0; i < m->l[0].in; i++)
		cur[i] = x[i];
	for (unsigned l = 0; l < m->layers; l++) {
		const struct mbp__layer *ly = &m->l[l];
		const struct mbp__weights *w = &m->current->lw[l];
		for (uint32_t o = 0; o < ly->out; o++) {
			double s = w->b[o];
			for (uint32_t i = 0; i < ly->in; i++)
				s += (double)w->w[(size_t)o * ly->in + i] * cur[i];
			if (ly->act == MBP_ACT_RELU)
				s = s > 0 ? s : 0;
			else if (ly->act == MBP_ACT_GELU)
				s = 0.5 * s * (1 + erf(s / sqrt(2.0)));
			nxt[o] = s;
		}
		if (ly->norm) {
			double mean = 0, var = 0;
			for (uint32_t o = 0; o < ly->out; o++)
				mean += nxt[o];
			mean /= ly->out;
			for (uint32_t o = 0; o < ly->out; o++)
				var += (nxt[o] - mean) * (nxt[o] - mean);
			var /= ly->out;
			for (uint32_t o = 0; o < ly->out; o++)
				nxt[o] = (nxt[o] - mean) / sqrt(var + ly->eps) * w->g[o] + w->beta[o];
		}
		memcpy(cur, nxt, ly->out * sizeof(double));
	}
	memcpy(y, cur, m->l[m->layers - 1].out * sizeof(double));
}

START_TEST(forward_matches_a_naive_double_reference)
{
	static const mbp_act acts[] = {MBP_ACT_NONE, MBP_ACT_RELU, MBP_ACT_GELU};
	for (int a = 0; a < 3; a++)
		for (int norm = 0; norm < 2; norm++) {
			uint32_t widths[] = {24, 40, 17, 33, 9};
			mbp_model_spec sp = {
			    .layers = 4, .widths = widths, .act = acts[a], .norm = norm, .seed = 11};
			mbp_model *m = make_model(0, &sp);
			const size_t rows = 7;
			float *x = random_rows(rows * 24, 5), y[7 * 9];
			ck_assert_int_eq(mbp_model_forward(m, x, y, rows, 3), 0);
			for (size_t r = 0; r < rows; r++) {
				double ref[9];
				float reff[9];
				naive_forward(m, x + r * 24, ref);
				for (int i = 0; i < 9; i++)
					reff[i] = (float)ref[i];
				ck_assert_msg(row_rel_err(y + r * 9, reff, 9) < 1e-5,
					      "act %d norm %d row %zu: %g", a, norm, r,
					      row_rel_err(y + r * 9, reff, 9));
			}
			free(x);
			mbp_model_destroy(m);
		}
}
END_TEST

/* ---- the packed kernel (lib/model/dense.c) ---- */

/* Skip a test of the packed kernel on a CPU without AVX2 and FMA (the kernel refuses to be chosen). */
#define NEED_PACKED()                                                                                        \
	do {                                                                                                 \
		if (mbp_kernel_set(MBP_KERNEL_PACKED) == -ENOTSUP) {                                         \
			ck_assert(!mbp__dense_cpu_ok());                                                     \
			return;                                                                              \
		}                                                                                            \
	} while (0)

/* y = x W^T + b against a double-precision sum, at shapes that are not multiples of the 6 x 16 tile, the
 * 256-input block or the 96-row block, with W's rows ld != in floats apart; and the same bits from the
 * weights packed ahead (a version's) and packed as the kernel goes (a trainable model's). A float chain of
 * `in` fused multiply-adds is within in x 2^-24 of the sum of |terms|: the bound allows 2 in x 2^-24; a
 * term dropped or counted twice is far outside it. */
START_TEST(packed_kernel_matches_a_double_reference_at_odd_shapes_packed_ahead_or_not)
{
	const mbp_kernel was = mbp_kernel_get();
	NEED_PACKED();
	static const uint32_t ins[] = {1, 5, 17, 255, 256, 257, 600}, outs[] = {1, 7, 16, 17, 33, 100};
	static const uint32_t rowss[] = {1, 2, 3, 4, 5, 6, 7, 13, 97, 200};
	uint64_t seed = 5;
	for (size_t a = 0; a < sizeof(ins) / sizeof(ins[0]); a++)
		for (size_t o = 0; o < sizeof(outs) / sizeof(outs[0]); o++) {
			const uint32_t in = ins[a], out = outs[o], ld = in + 3;
			float *w = random_rows((size_t)out * ld, seed++), *b = random_rows(out, seed++);
			float *wp = mbp__scratch_alloc(mbp__dense_packed_floats(in, out));
			mbp__dense_pack(in, out, w, ld, b, wp);
			const struct mbp__layer ly = {.in = in, .out = out};
			const struct mbp__weights ahead = {.w = w, .b = b, .ld = ld, .wp = wp},
						  asgo = {.w = w, .b = b, .ld = ld};
			for (size_t k = 0; k < sizeof(rowss) / sizeof(rowss[0]); k++) {
				const uint32_t rows = rowss[k];
				float *x = random_rows((size_t)rows * in, seed++);
				float *y = malloc((size_t)rows * out * sizeof(float));
				float *y2 = malloc((size_t)rows * out * sizeof(float));
				mbp__dense_packed(&ly, &ahead, x, y, rows, false);
				mbp__dense_packed(&ly, &asgo, x, y2, rows, false);
				ck_assert_msg(!memcmp(y, y2, (size_t)rows * out * sizeof(float)),
					      "%u x %u -> %u: packed ahead and as it goes differ", rows, in,
					      out);
				for (uint32_t r = 0; r < rows; r++)
					for (uint32_t j = 0; j < out; j++) {
						double sum = b[j], mag = fabs(b[j]);
						for (uint32_t i = 0; i < in; i++) {
							double t = (double)x[(size_t)r * in + i] *
								   w[(size_t)j * ld + i];
							sum += t;
							mag += fabs(t);
						}
						double err = fabs(y[(size_t)r * out + j] - sum);
						ck_assert_msg(err <= 2.0 * (in + 1) * 0x1p-24 * mag,
							      "%u x %u -> %u, row %u out %u: %.9g vs %.9g",
							      rows, in, out, r, j, y[(size_t)r * out + j],
							      sum);
					}
				/* the ReLU at the store writes mbp__relu's bits */
				mbp__dense_packed(&ly, &ahead, x, y2, rows, true);
				mbp__relu(y, (size_t)rows * out);
				ck_assert(!memcmp(y, y2, (size_t)rows * out * sizeof(float)));
				free(x);
				free(y);
				free(y2);
			}
			free(w);
			free(b);
			free(wp);
		}
	mbp_kernel_set(was);
}
END_TEST

/* Under the packed kernel a row's output depends only on that row and the weights: the same rows in
 * micro-batches of 1, 3, 8, 64 and 100 rows (each row at other positions in its micro-batch, in tiles of
 * other heights) give the same bytes, through every layer (ReLU, GELU, norm) of a model with an input of
 * 1024 (rows 4 KiB apart) and one wider than a 256-input block. */
START_TEST(packed_rows_give_the_same_bytes_in_micro_batches_of_1_3_8_64_rows)
{
	const mbp_kernel was = mbp_kernel_get();
	NEED_PACKED();
	static const mbp_act acts[] = {MBP_ACT_RELU, MBP_ACT_GELU};
	for (int a = 0; a < 2; a++) {
		uint32_t widths[] = {1024, 300, 37, 17};
		mbp_model_spec sp = {
		    .layers = 3, .widths = widths, .act = acts[a], .norm = a == 1, .seed = 3};
		mbp_model *m = make_model(0, &sp);
		const size_t rows = 100;
		float *x = random_rows(rows * 1024, 9), *y0 = malloc(rows * 17 * sizeof(float)),
		      *y = malloc(rows * 17 * sizeof(float));
		ck_assert_int_eq(mbp_model_forward(m, x, y0, rows, 0), 0);
		static const uint32_t mbs[] = {1, 3, 8, 64};
		for (size_t k = 0; k < 4; k++) {
			memset(y, 0xff, rows * 17 * sizeof(float));
			ck_assert_int_eq(mbp_model_forward(m, x, y, rows, mbs[k]), 0);
			ck_assert_msg(!memcmp(y, y0, rows * 17 * sizeof(float)),
				      "act %d: micro-batches of %u rows differ from one of 100", a, mbs[k]);
		}
		/* a row alone, from the middle of the batch */
		ck_assert_int_eq(mbp_model_forward(m, x + 57 * 1024, y, 1, 1), 0);
		ck_assert_mem_eq(y, y0 + 57 * 17, 17 * sizeof(float));
		free(x);
		free(y0);
		free(y);
		mbp_model_destroy(m);
	}
	mbp_kernel_set(was);
}
END_TEST

/* Each version holds its own packed copy: after a swap the products read the new version's weights (B's
 * bits, not A's), the old copy goes with its version, and the copy is counted in the layer's description;
 * a version keeps its kernel when the switch moves: one loaded under the packed kernel gives its bits
 * under blas, and one loaded under OpenBLAS holds no copy and gives OpenBLAS's bits under packed. */
START_TEST(a_swap_brings_its_own_packed_copy_and_the_old_one_goes_with_its_version)
{
	const mbp_kernel was = mbp_kernel_get();
	NEED_PACKED();
	mbp_model_spec sp = {.layers = 3, .in = 40, .hidden = 70, .out = 9, .act = MBP_ACT_RELU, .seed = 1};
	mbp_model *m = make_model(0, &sp);
	sp.seed = 2;
	mbp_model *b = make_model(1, &sp);
	mbp_layer_info li;
	ck_assert_int_eq(mbp_model_layer_info(m, 1, &li), 0);
	ck_assert_uint_eq(li.packed_bytes, 5 * 16 * (70 + 1) * sizeof(float)); /* 5 panels of 16, bias */
	ck_assert_ptr_nonnull(m->current->lw[1].wp);
	const uint32_t rows = 5;
	float *x = random_rows(rows * 40, 4), ra[5 * 9], rb[5 * 9], y[5 * 9];
	ck_assert_int_eq(mbp_model_forward(m, x, ra, rows, 0), 0);
	ck_assert_int_eq(mbp_model_forward(b, x, rb, rows, 0), 0);
	ck_assert(memcmp(ra, rb, sizeof(ra)) != 0);
	const float *bp = b->current->lw[0].wp;
	ck_assert_int_eq(mbp_model_swap(m, b), 0);
	ck_assert_ptr_eq(m->current->lw[0].wp, bp);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	ck_assert_int_eq(mbp_model_forward(m, x, y, rows, 2), 0);
	ck_assert_mem_eq(y, rb, sizeof(rb));

	/* loaded under OpenBLAS: no copy, and OpenBLAS's bits for the version's life; the version loaded
	 * under the packed kernel keeps its own bits after the switch too */
	ck_assert_int_eq(mbp_kernel_set(MBP_KERNEL_BLAS), 0);
	ck_assert_int_eq(mbp_kernel_get(), MBP_KERNEL_BLAS);
	ck_assert_int_eq(mbp_model_forward(m, x, y, rows, 0), 0);
	ck_assert_mem_eq(y, rb, sizeof(rb));
	mbp_model *u = reload(1);
	ck_assert_int_eq(mbp_model_layer_info(u, 1, &li), 0);
	ck_assert_uint_eq(li.packed_bytes, 0);
	ck_assert_ptr_null(u->current->lw[0].wp);
	float yb[5 * 9];
	ck_assert_int_eq(mbp_model_forward(u, x, yb, rows, 0), 0);
	for (uint32_t r = 0; r < rows; r++) /* OpenBLAS: other roundings, the same values */
		ck_assert_double_lt(row_rel_err(yb + r * 9, rb + r * 9, 9), 1e-5);
	ck_assert_int_eq(mbp_kernel_set(MBP_KERNEL_PACKED), 0);
	ck_assert_int_eq(mbp_model_forward(u, x, y, rows, 0), 0);
	ck_assert_mem_eq(y, yb, sizeof(yb));
	free(x);
	mbp_model_destroy(u);
	mbp_model_destroy(m);
	mbp_kernel_set(was);
}
END_TEST

START_TEST(kernel_set_refuses_what_is_not_a_kernel_and_default_is_the_best_for_the_cpu)
{
	mbp_kernel before = mbp_kernel_get();
	ck_assert(before == MBP_KERNEL_BLAS || before == MBP_KERNEL_PACKED);
	ck_assert_int_eq(mbp_kernel_set((mbp_kernel)7), -EINVAL);
	ck_assert_int_eq(mbp_kernel_set((mbp_kernel)-1), -EINVAL);
	ck_assert_int_eq(mbp_kernel_get(), before);
	ck_assert_int_eq(mbp_kernel_set(MBP_KERNEL_BLAS), 0);
	ck_assert_int_eq(mbp_kernel_get(), MBP_KERNEL_BLAS);
	ck_assert_int_eq(mbp_kernel_set(MBP_KERNEL_PACKED), mbp__dense_cpu_ok() ? 0 : -ENOTSUP);
	ck_assert_int_eq(mbp_kernel_set(MBP_KERNEL_DEFAULT), 0);
	ck_assert_int_eq(mbp_kernel_get(), mbp__dense_cpu_ok() ? MBP_KERNEL_PACKED : MBP_KERNEL_BLAS);
	ck_assert_str_eq(mbp_kernel_name(MBP_KERNEL_PACKED), "packed");
	ck_assert_str_eq(mbp_kernel_name(MBP_KERNEL_BLAS), "blas");
	ck_assert_str_eq(mbp_kernel_name(MBP_KERNEL_DEFAULT), "default");
	ck_assert_str_eq(mbp_kernel_name((mbp_kernel)7), "unknown");
	ck_assert_int_eq(mbp_kernel_set(before), 0);
}
END_TEST

/* MBP_KERNEL is read once per process, so each value is tried in a child of its own: a value that is not
 * a kernel runs the default and says so; blas and packed are taken without a word (packed only where the
 * CPU runs it, and a warning where it does not); unset, nothing. */
static void kernel_env_child(const char *value, mbp_kernel want, const char *warning_has)
{
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (value)
			setenv("MBP_KERNEL", value, 1);
		else
			unsetenv("MBP_KERNEL");
		const char *w = mbp_kernel_warning();
		bool ok = mbp_kernel_get() == want && (warning_has ? w && strstr(w, warning_has) : w == NULL);
		_exit(ok ? 0 : 1);
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "MBP_KERNEL=%s: kernel or warning wrong",
		      value ? value : "(unset)");
}

START_TEST(an_unknown_mbp_kernel_value_warns_and_runs_the_default)
{
	const mbp_kernel best = mbp__dense_cpu_ok() ? MBP_KERNEL_PACKED : MBP_KERNEL_BLAS;
	kernel_env_child("BLAS", best, "MBP_KERNEL='BLAS' is not a dense kernel");
	kernel_env_child("openblas", best, "'openblas'");
	kernel_env_child("", best, "is not a dense kernel");
	kernel_env_child("blas", MBP_KERNEL_BLAS, NULL);
	kernel_env_child("packed", best, mbp__dense_cpu_ok() ? NULL : "needs AVX2 and FMA");
	kernel_env_child(NULL, best, NULL);
}
END_TEST

/* The vector ReLU writes the scalar definition's bits (y > 0 ? y : +0) at every length and offset, for
 * the values where a shortcut would differ: NaNs of both signs, -0, infinities, subnormals; and it
 * touches nothing past n. */
START_TEST(relu_writes_the_scalar_bits_at_every_length_and_offset)
{
	static const uint32_t special[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x80000000u, 0x00000000u,
					   0x7f800000u, 0xff800000u, 0x00000001u, 0x80000001u, 0x7f7fffffu,
					   0xff7fffffu, 0x3f800000u, 0xbf800000u};
	const size_t nsp = sizeof(special) / sizeof(special[0]);
	float buf[80], want[80];
	uint64_t seed = 7;
	for (size_t off = 0; off < 4; off++)
		for (size_t n = 0; n + off + 4 <= 80; n++) {
			for (size_t i = 0; i < 80; i++) {
				seed = seed * 6364136223846793005u + 1442695040888963407u;
				uint32_t bits =
				    (seed >> 33) % 3 ? (uint32_t)(seed >> 32) : special[(seed >> 40) % nsp];
				memcpy(&buf[i], &bits, sizeof(bits));
			}
			memcpy(want, buf, sizeof(buf));
			for (size_t i = off; i < off + n; i++)
				want[i] = want[i] > 0.0f ? want[i] : 0.0f;
			mbp__relu(buf + off, n);
			ck_assert_msg(memcmp(buf, want, sizeof(buf)) == 0, "offset %zu, length %zu", off, n);
		}
}
END_TEST

START_TEST(relu_grad_writes_the_scalar_bits_at_every_length_and_offset_in_place_or_not)
{
	static const uint32_t special[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x80000000u, 0x00000000u,
					   0x7f800000u, 0xff800000u, 0x00000001u, 0x80000001u, 0x3f800000u};
	const size_t nsp = sizeof(special) / sizeof(special[0]);
	float y[80], dy[80], out[80], want[80];
	uint64_t seed = 11;
	for (int in_place = 0; in_place < 2; in_place++)
		for (size_t off = 0; off < 4; off++)
			for (size_t n = 0; n + off + 4 <= 80; n++) {
				for (size_t i = 0; i < 80; i++) {
					float *dst[2] = {&y[i], &dy[i]};
					for (int k = 0; k < 2; k++) {
						seed = seed * 6364136223846793005u + 1442695040888963407u;
						uint32_t bits = (seed >> 33) % 3
								    ? (uint32_t)(seed >> 32)
								    : special[(seed >> 40) % nsp];
						memcpy(dst[k], &bits, sizeof(bits));
					}
					out[i] = (float)i;
				}
				float *o = in_place ? y : out;
				memcpy(want, o, sizeof(want));
				for (size_t i = off; i < off + n; i++)
					want[i] = y[i] > 0.0f ? dy[i] : 0.0f;
				mbp__relu_grad(y + off, dy + off, o + off, n);
				ck_assert_msg(memcmp(o, want, sizeof(want)) == 0,
					      "%s, offset %zu, length %zu", in_place ? "in place" : "apart",
					      off, n);
			}
}
END_TEST

START_TEST(forward_whole_batch_and_micro_batches_agree_within_1e_5)
{
	mbp_model_spec sp = {
	    .layers = 5, .in = 64, .hidden = 96, .out = 32, .act = MBP_ACT_RELU, .norm = true, .seed = 2};
	mbp_model *m = make_model(0, &sp);
	const size_t rows = 37;
	float *x = random_rows(rows * 64, 9), *a = malloc(rows * 32 * 4), *b = malloc(rows * 32 * 4);
	ck_assert_int_eq(mbp_model_forward(m, x, a, rows, 0), 0);
	for (uint32_t mb = 1; mb <= 16; mb *= 2) {
		ck_assert_int_eq(mbp_model_forward(m, x, b, rows, mb), 0);
		for (size_t r = 0; r < rows; r++)
			ck_assert_double_lt(row_rel_err(b + r * 32, a + r * 32, 32), 1e-5);
	}
	/* the same micro-batch size twice: bit for bit */
	ck_assert_int_eq(mbp_model_forward(m, x, a, rows, 4), 0);
	ck_assert_int_eq(mbp_model_forward(m, x, b, rows, 4), 0);
	ck_assert_mem_eq(a, b, rows * 32 * 4);
	ck_assert_int_eq(mbp_model_forward(m, NULL, b, 1, 1), -EINVAL);
	ck_assert_int_eq(mbp_model_forward(m, NULL, NULL, 0, 1), 0);
	free(x);
	free(a);
	free(b);
	mbp_model_destroy(m);
}
END_TEST

START_TEST(random_model_files_are_deterministic_per_seed)
{
	mbp_model_spec sp = {.layers = 2, .in = 8, .hidden = 8, .out = 8, .act = MBP_ACT_GELU, .seed = 42};
	char p[3][160];
	for (int i = 0; i < 3; i++) {
		snprintf(p[i], sizeof(p[i]), "%s/m%d.safetensors", dir, i);
		sp.seed = i < 2 ? 42 : 43;
		ck_assert_int_eq(mbp_model_write_random(p[i], &sp), 0);
	}
	char buf[3][4096];
	size_t len[3];
	for (int i = 0; i < 3; i++) {
		FILE *f = fopen(p[i], "rb");
		len[i] = fread(buf[i], 1, sizeof(buf[i]), f);
		fclose(f);
	}
	ck_assert_uint_eq(len[0], len[1]);
	ck_assert_mem_eq(buf[0], buf[1], len[0]);
	ck_assert(len[0] != len[2] || memcmp(buf[0], buf[2], len[0]) != 0);
	mbp_model_spec bad = sp;
	bad.layers = 0;
	ck_assert_int_eq(mbp_model_write_random(p[0], &bad), -EINVAL);
	bad = sp;
	bad.hidden = 0;
	ck_assert_int_eq(mbp_model_write_random(p[0], &bad), -EINVAL);
	ck_assert_int_eq(mbp_model_write_random("/nonexistent-dir/x.safetensors", &sp), -ENOENT);
	/* The usual mode under the umask: 0644 with 022, 0600 with 077. */
	mode_t old = umask(022);
	struct stat sb;
	ck_assert_int_eq(mbp_model_write_random(p[0], &sp), 0);
	ck_assert_int_eq(stat(p[0], &sb), 0);
	ck_assert_uint_eq(sb.st_mode & 0777, 0644);
	umask(077);
	ck_assert_int_eq(mbp_model_write_random(p[0], &sp), 0);
	ck_assert_int_eq(stat(p[0], &sb), 0);
	ck_assert_uint_eq(sb.st_mode & 0777, 0600);
	umask(old);
}
END_TEST

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The weights are the process's own: truncating or rewriting the file after the load changes nothing. */
START_TEST(a_loaded_model_does_not_see_its_file_change)
{
	mbp_model_spec sp = {.layers = 3, .in = 16, .hidden = 32, .out = 4, .act = MBP_ACT_RELU, .seed = 5};
	mbp_model *m = make_model(0, &sp);
	float *x = random_rows(4 * 16, 9);
	float before[4 * 4], after[4 * 4];
	ck_assert_int_eq(mbp_model_forward(m, x, before, 4, 0), 0);
	char p[128], q[128];
	snprintf(p, sizeof(p), "%s/m0.safetensors", dir);
	snprintf(q, sizeof(q), "%s/m1.safetensors", dir);
	sp.seed = 6; /* same size, other weights, written over the first file in place */
	ck_assert_int_eq(mbp_model_write_random(q, &sp), 0);
	FILE *src = fopen(q, "rb"), *dst = fopen(p, "r+b");
	ck_assert(src && dst);
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), src)) > 0)
		ck_assert_uint_eq(fwrite(buf, 1, n, dst), n);
	fclose(src);
	fclose(dst);
	ck_assert_int_eq(mbp_model_forward(m, x, after, 4, 0), 0);
	ck_assert_mem_eq(before, after, sizeof(before));
	ck_assert_int_eq(truncate(p, 0), 0); /* with a mapping this was SIGBUS */
	ck_assert_int_eq(mbp_model_forward(m, x, after, 4, 0), 0);
	ck_assert_mem_eq(before, after, sizeof(before));
	mbp_model_destroy(m);
	free(x);
}
END_TEST

/* What is not a regular file is refused without blocking; a bound on the size is checked before reading;
 * a huge sparse file with a bad header fails on its first 8 bytes. */
START_TEST(load_refuses_what_is_not_a_regular_file_and_checks_sizes_first)
{
	mbp_model *m = NULL;
	mbp_model_error e;
	char p[128];
	snprintf(p, sizeof(p), "%s/m2.safetensors", dir);
	ck_assert_int_eq(mkfifo(p, 0600), 0); /* no writer: a blocking open would wait forever */
	ck_assert_int_eq(mbp_model_load(&m, p, &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_LOAD_NOT_REGULAR);
	ck_assert_ptr_nonnull(strstr(e.msg, "FIFO"));
	unlink(p);
	ck_assert_int_eq(mbp_model_load(&m, dir, &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_LOAD_NOT_REGULAR);
	ck_assert_int_eq(mbp_model_load(&m, "/dev/zero", &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_LOAD_NOT_REGULAR);
	ck_assert_ptr_null(m);

	mbp_model_spec sp = {.layers = 2, .in = 16, .hidden = 16, .out = 4, .seed = 1};
	ck_assert_int_eq(mbp_model_write_random(p, &sp), 0);
	int fd = open(p, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	mbp_model_load_opts o = {.max_bytes = 100};
	ck_assert_int_eq(mbp_model_load_fd(&m, fd, "small", &o, &e), -EFBIG);
	ck_assert_int_eq(e.rule, MBP_LOAD_TOO_LARGE);
	ck_assert_ptr_nonnull(strstr(e.msg, "small: "));
	o.max_bytes = 1u << 20;
	ck_assert_int_eq(mbp_model_load_fd(&m, fd, "small", &o, &e), 0);
	mbp_model_destroy(m);
	close(fd);

	/* 4 GiB of holes: the header length (0) is read and refused before anything else is. */
	fd = open(p, O_RDWR | O_TRUNC);
	ck_assert_int_ge(fd, 0);
	if (ftruncate(fd, (off_t)4 << 30) == 0) { /* a file system without sparse files skips this part */
		uint64_t t0 = mono_ns();
		ck_assert_int_eq(mbp_model_load_fd(&m, fd, "sparse", NULL, &e), -EBADMSG);
		ck_assert_int_eq(e.rule, MBP_ST_HEADER_START);
		ck_assert_uint_lt(mono_ns() - t0, 1000000000u);
		/* a header length that claims the whole file is read as a header no further than the bound */
		uint64_t big = htole64(((uint64_t)4 << 30) - 8);
		ck_assert_int_eq(pwrite(fd, &big, 8, 0), 8);
		ck_assert_int_eq(mbp_model_load_fd(&m, fd, "sparse", NULL, &e), -E2BIG);
		ck_assert_int_eq(e.rule, MBP_ST_HEADER_TOO_LARGE);
	}
	close(fd);
	unlink(p);
}
END_TEST

/* ---- partitioner ---- */

/* Brute force: every placement of S - 1 cuts among L - 1 positions; the stage starting at `start` has
 * reps[0] replicas (its cost divided by them), the next reps[1], ...; reps NULL: one each. */
static double brute_fixed(const double *c, const double *h, unsigned L, unsigned S, unsigned start,
			  double worst, const unsigned *reps)
{
	double r = reps ? reps[0] : 1;
	if (S == 1) {
		double s = start > 0 && h ? h[start - 1] : 0;
		for (unsigned i = start; i < L; i++)
			s += c[i];
		return fmax(worst, s / r);
	}
	double best = INFINITY, s = start > 0 && h ? h[start - 1] : 0;
	for (unsigned end = start + 1; end + (S - 1) <= L; end++) {
		s += c[end - 1];
		best =
		    fmin(best, brute_fixed(c, h, L, S - 1, end, fmax(worst, s / r), reps ? reps + 1 : NULL));
	}
	return best;
}

static double brute(const double *c, const double *h, unsigned L, unsigned S, unsigned start, double worst)
{
	return brute_fixed(c, h, L, S, start, worst, NULL);
}

START_TEST(partition_equals_brute_force_on_random_costs)
{
	uint64_t seed = 12345;
	unsigned trials = (unsigned)mbp_iters(3000, 200);
	for (unsigned t = 0; t < trials; t++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		unsigned L = 1 + (unsigned)(seed >> 33) % 10;
		unsigned S = 1 + (unsigned)(seed >> 45) % L;
		bool with_h = (seed >> 20) & 1;
		double c[10], h[10];
		for (unsigned i = 0; i < L; i++) {
			seed = seed * 6364136223846793005u + 1442695040888963407u;
			/* integers: sums are exact in any order, so "equal" means equal */
			c[i] = (double)((seed >> 33) % 1000);
			h[i] = (double)((seed >> 50) % 200);
		}
		mbp_model_plan p;
		ck_assert_int_eq(mbp_model_partition(c, with_h ? h : NULL, L, S, &p), 0);
		double want = brute(c, with_h ? h : NULL, L, S, 0, 0);
		ck_assert_msg(p.slowest_ns == want, "L %u S %u: %g, brute force %g", L, S, p.slowest_ns,
			      want);
		ck_assert_uint_eq(p.stages, S);
		ck_assert_uint_eq(p.first[0], 0);
		ck_assert_uint_eq(p.first[S], L);
		double sum = 0, mx = 0;
		for (unsigned s = 0; s < S; s++) {
			ck_assert_uint_lt(p.first[s], p.first[s + 1]);
			double cost = s > 0 && with_h ? h[p.first[s] - 1] : 0;
			for (unsigned i = p.first[s]; i < p.first[s + 1]; i++)
				cost += c[i];
			ck_assert_double_eq(p.stage_ns[s], cost);
			sum += cost;
			mx = fmax(mx, cost);
		}
		ck_assert_double_eq(mx, p.slowest_ns);
		ck_assert_double_eq_tol(p.mean_ns, sum / S, 1e-9);
		if (sum > 0)
			ck_assert_double_eq_tol(p.balance, mx / (sum / S), 1e-9);
	}
}
END_TEST

/* The split for fixed replicas (what a rebalancing move of replicated stages plans): the least max over
 * the stages of cost / replicas, against brute force; the replicas come out as given; with one replica
 * each it is mbp_model_partition's plan, cut for cut. */
START_TEST(partition_for_fixed_replicas_equals_brute_force_and_is_the_partition_with_ones)
{
	uint64_t seed = 777;
	unsigned trials = (unsigned)mbp_iters(3000, 200);
	for (unsigned t = 0; t < trials; t++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		unsigned L = 1 + (unsigned)(seed >> 33) % 10;
		unsigned S = 1 + (unsigned)(seed >> 45) % L;
		bool with_h = (seed >> 20) & 1, ones = (seed >> 21) % 4 == 0;
		double c[10], h[10];
		unsigned reps[10];
		for (unsigned i = 0; i < L; i++) {
			seed = seed * 6364136223846793005u + 1442695040888963407u;
			c[i] = (double)((seed >> 33) % 1000); /* integers: sums exact in any order */
			h[i] = (double)((seed >> 50) % 200);
			reps[i] = ones ? 1 : 1 + (unsigned)(seed >> 60) % 3;
		}
		mbp_model_plan p, q;
		ck_assert_int_eq(mbp__partition_fixed(c, with_h ? h : NULL, L, S, reps, &p), 0);
		double want = brute_fixed(c, with_h ? h : NULL, L, S, 0, 0, reps);
		ck_assert_msg(p.slowest_ns == want, "L %u S %u: %g, brute force %g", L, S, p.slowest_ns,
			      want);
		ck_assert_uint_eq(p.stages, S);
		ck_assert_uint_eq(p.first[S], L);
		unsigned threads = 0;
		for (unsigned s = 0; s < S; s++) {
			ck_assert_uint_lt(p.first[s], p.first[s + 1]);
			ck_assert_uint_eq(p.replicas[s], reps[s]);
			threads += reps[s];
		}
		ck_assert_uint_eq(p.threads, threads);
		if (ones) {
			ck_assert_int_eq(mbp_model_partition(c, with_h ? h : NULL, L, S, &q), 0);
			ck_assert_mem_eq(p.first, q.first, sizeof(p.first));
			ck_assert_double_eq(p.slowest_ns, q.slowest_ns);
		}
	}
	/* NULL: one each; 0 in an entry: one */
	double c4[4] = {1, 1, 1, 5};
	unsigned r0[2] = {0, 0}, r2[2] = {1, 2};
	mbp_model_plan p;
	ck_assert_int_eq(mbp__partition_fixed(c4, NULL, 4, 2, NULL, &p), 0);
	ck_assert_uint_eq(p.first[1], 3);
	ck_assert_int_eq(mbp__partition_fixed(c4, NULL, 4, 2, r0, &p), 0);
	ck_assert_uint_eq(p.first[1], 3);
	ck_assert_uint_eq(p.replicas[1], 1);
	/* the dear layer goes onto the replicated stage with the one before it: max(2, 6 / 2) */
	ck_assert_int_eq(mbp__partition_fixed(c4, NULL, 4, 2, r2, &p), 0);
	ck_assert_uint_eq(p.first[1], 2);
	ck_assert_double_eq(p.slowest_ns, 3);
	ck_assert_int_eq(mbp__partition_fixed(c4, NULL, 4, 5, r2, &p), -ERANGE);
	ck_assert_int_eq(mbp__partition_fixed(NULL, NULL, 4, 2, r2, &p), -EINVAL);
}
END_TEST

/* Brute force for capped replicas: every vector of replicas r_k in 1 .. caps[k] and every split for it;
 * at_most[c]: the least period on at most c threads, for c up to the caps' sum. */
static void brute_capped(const double *c, const double *h, unsigned L, unsigned S, const unsigned *caps,
			 unsigned k, unsigned *reps, unsigned used, double *at_most)
{
	if (k == S) {
		double v = brute_fixed(c, h, L, S, 0, 0, reps);
		for (unsigned x = used; x <= MBP_MAX_STAGES; x++)
			at_most[x] = fmin(at_most[x], v);
		return;
	}
	for (reps[k] = 1; reps[k] <= caps[k]; reps[k]++)
		brute_capped(c, h, L, S, caps, k + 1, reps, used + reps[k], at_most);
}

/* The split and the active replicas of a rebalancing move together, capped per stage (the threads it was
 * made with): against brute force, the least period on the fewest threads; with a CPU count below the
 * threads, a plan beyond the CPUs only when, counted at no less than the layers' sum over the CPUs, it
 * beats the best plan within them by 5 %; caps of 1 are mbp__partition_fixed's plan, cut for cut. */
START_TEST(partition_for_capped_replicas_equals_brute_force_and_takes_threads_beyond_the_cpus_only_to_win)
{
	uint64_t seed = 4242;
	unsigned trials = (unsigned)mbp_iters(3000, 200);
	for (unsigned t = 0; t < trials; t++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		unsigned L = 1 + (unsigned)(seed >> 33) % 8;
		unsigned S = 1 + (unsigned)(seed >> 45) % (L < 4 ? L : 4);
		bool with_h = (seed >> 20) & 1, ones = (seed >> 21) % 5 == 0;
		double c[8], h[8];
		unsigned caps[8], C = 0, reps[8];
		for (unsigned i = 0; i < L; i++) {
			seed = seed * 6364136223846793005u + 1442695040888963407u;
			c[i] = (double)((seed >> 33) % 1000); /* integers: sums exact in any order */
			h[i] = (double)((seed >> 50) % 200);
			caps[i] = ones ? 1 : 1 + (unsigned)(seed >> 60) % 3;
		}
		for (unsigned k = 0; k < S; k++)
			C += caps[k];
		unsigned cpus = (unsigned)(seed >> 10) % (C + 1); /* 0: no limit */
		mbp_model_plan p;
		ck_assert_int_eq(mbp__partition_capped(c, with_h ? h : NULL, L, S, caps, cpus, &p), 0);
		double at_most[MBP_MAX_STAGES + 1];
		for (unsigned x = 0; x <= MBP_MAX_STAGES; x++)
			at_most[x] = INFINITY;
		brute_capped(c, with_h ? h : NULL, L, S, caps, 0, reps, 0, at_most);
		unsigned want = C;
		while (want > 1 && at_most[want - 1] == at_most[C])
			want--;
		double sum = 0;
		for (unsigned i = 0; i < L; i++)
			sum += c[i];
		if (cpus && cpus < C) {
			unsigned in = cpus;
			while (in > 1 && at_most[in - 1] == at_most[cpus])
				in--;
			double beyond = INFINITY;
			for (unsigned x = cpus + 1; x <= C; x++)
				if (fmax(at_most[x], sum / cpus) < beyond)
					beyond = fmax(at_most[x], sum / cpus), want = x;
			if (!(beyond < 0.95 * at_most[in]))
				want = in;
		}
		double period = at_most[want];
		if (cpus && want > cpus) /* predicted at what the CPUs allow */
			period = fmax(period, sum / cpus);
		ck_assert_msg(p.slowest_ns == period && p.threads == want,
			      "L %u S %u C %u cpus %u: %g on %u threads, brute force %g on %u", L, S, C, cpus,
			      p.slowest_ns, p.threads, period, want);
		ck_assert_uint_eq(p.stages, S);
		ck_assert_uint_eq(p.first[S], L);
		for (unsigned s = 0; s < S; s++) {
			ck_assert_uint_lt(p.first[s], p.first[s + 1]);
			ck_assert_uint_ge(p.replicas[s], 1);
			ck_assert_uint_le(p.replicas[s], caps[s]);
		}
		if (ones) {
			mbp_model_plan q;
			ck_assert_int_eq(mbp__partition_fixed(c, with_h ? h : NULL, L, S, NULL, &q), 0);
			ck_assert_mem_eq(p.first, q.first, sizeof(p.first));
			/* the same cuts; fewer CPUs than stages: predicted at what they allow */
			ck_assert_double_eq(p.slowest_ns,
					    cpus && S > cpus ? fmax(q.slowest_ns, sum / cpus) : q.slowest_ns);
		}
	}
	/* 8 layers on 2 CPUs, stage 1 made with 2 threads: equal costs keep one replica each (cutting at 4:
	 * a third thread would only share the CPUs); layer 7 at 75 % of the work gets both */
	double even[8] = {1, 1, 1, 1, 1, 1, 1, 1}, heavy[8] = {1, 1, 1, 1, 1, 1, 1, 21};
	const unsigned caps[2] = {1, 2};
	mbp_model_plan p;
	ck_assert_int_eq(mbp__partition_capped(even, NULL, 8, 2, caps, 2, &p), 0);
	ck_assert_uint_eq(p.first[1], 4);
	ck_assert_uint_eq(p.replicas[0], 1);
	ck_assert_uint_eq(p.replicas[1], 1);
	ck_assert_int_eq(mbp__partition_capped(heavy, NULL, 8, 2, caps, 2, &p), 0);
	ck_assert_uint_eq(p.first[1], 7);
	ck_assert_uint_eq(p.replicas[1], 2);
	ck_assert_double_eq(p.slowest_ns, 14); /* max(7, 21 / 2) on 3 threads, but 28 / 2 CPUs */
	/* no CPU limit: even equal costs take the thread (max(3, 5 / 2) < 4) */
	ck_assert_int_eq(mbp__partition_capped(even, NULL, 8, 2, caps, 0, &p), 0);
	ck_assert_uint_eq(p.replicas[1], 2);
	ck_assert_double_eq(p.slowest_ns, 3);
	/* limits */
	const unsigned big[2] = {MBP_MAX_STAGES, 1};
	ck_assert_int_eq(mbp__partition_capped(even, NULL, 8, 2, big, 2, &p), -ERANGE);
	ck_assert_int_eq(mbp__partition_capped(even, NULL, 8, 9, caps, 2, &p), -ERANGE);
	ck_assert_int_eq(mbp__partition_capped(even, NULL, 8, 2, NULL, 2, &p), -EINVAL);
	ck_assert_int_eq(mbp__partition_capped(even, NULL, 8, 0, caps, 2, &p), -EINVAL);
}
END_TEST

START_TEST(partition_rejects_bad_input_and_balances_the_obvious_case)
{
	double c[4] = {1, 1, 1, 1}, bad[2] = {1, NAN};
	mbp_model_plan p;
	ck_assert_int_eq(mbp_model_partition(c, NULL, 4, 5, &p), -ERANGE);
	ck_assert_int_eq(mbp_model_partition(c, NULL, 0, 1, &p), -EINVAL);
	ck_assert_int_eq(mbp_model_partition(c, NULL, 4, 0, &p), -EINVAL);
	ck_assert_int_eq(mbp_model_partition(bad, NULL, 2, 1, &p), -EINVAL);
	ck_assert_int_eq(mbp_model_partition(c, NULL, 4, 2, &p), 0);
	ck_assert_uint_eq(p.first[1], 2);
	ck_assert_double_eq(p.balance, 1.0);
	/* a costly hand-off after layer 0 moves the cut */
	double h[4] = {10, 0, 0, 0};
	ck_assert_int_eq(mbp_model_partition(c, h, 4, 2, &p), 0);
	ck_assert_uint_eq(p.first[1], 2);
	double h2[4] = {0, 10, 0, 0};
	ck_assert_int_eq(mbp_model_partition(c, h2, 4, 2, &p), 0);
	ck_assert_uint_ne(p.first[1], 2);
	char buf[256];
	ck_assert_int_gt(mbp_model_plan_describe(&p, buf, sizeof(buf)), 0);
	ck_assert_ptr_nonnull(strstr(buf, "stage 1: layers"));
	ck_assert_ptr_nonnull(strstr(buf, "balance"));
}
END_TEST

/* The description is built whole whatever a line's length: a stage of 1e300 ns (a plan filled by hand) gives
 * a line of over 300 characters, and the text written is exactly as long as the length returned, its
 * last line included (each line used to be cut at 159 characters while the count went on). */
START_TEST(plan_describe_writes_every_line_whole_and_returns_its_length)
{
	double c[2] = {1, 1};
	mbp_model_plan p;
	ck_assert_int_eq(mbp_model_partition(c, NULL, 2, 2, &p), 0);
	p.stage_ns[0] = 1e300;
	char buf[2048];
	int n = mbp_model_plan_describe(&p, buf, sizeof(buf));
	ck_assert_int_gt(n, 300);
	ck_assert_uint_eq(strlen(buf), (size_t)n);
	ck_assert_ptr_nonnull(strstr(buf, " us\nstage 1: layers 1-1"));
	ck_assert_ptr_nonnull(strstr(buf, "2 stages at"));
	char small[16];
	ck_assert_int_eq(mbp_model_plan_describe(&p, small, sizeof(small)),
			 n); /* truncated: the full length */
	ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
}
END_TEST

START_TEST(profile_and_balance_cover_the_layers)
{
	uint32_t widths[] = {32, 256, 16, 256, 32, 8};
	mbp_model_spec sp = {.layers = 5, .widths = widths, .act = MBP_ACT_RELU, .seed = 1};
	mbp_model *m = make_model(0, &sp);
	double t[5], h[5];
	ck_assert_int_eq(mbp_model_profile(m, 8, 3, -1, t, h), 0);
	for (int i = 0; i < 5; i++)
		ck_assert(t[i] > 0 && isfinite(t[i]));
	for (int i = 0; i < 4; i++)
		ck_assert(h[i] >= 1000);
	ck_assert_double_eq(h[4], 0);
	int cpus[8];
	ck_assert_int_gt(mbp_cpus_allowed(cpus, 8, NULL), 0);
	ck_assert_int_eq(mbp_model_profile(m, 8, 3, cpus[0], t, NULL), 0);
	ck_assert_int_eq(mbp_model_profile(m, 0, 3, -1, t, NULL), -EINVAL);
	mbp_model_plan p;
	ck_assert_int_eq(mbp_model_balance(m, 3, 8, -1, &p), 0);
	ck_assert_uint_eq(p.stages, 3);
	ck_assert_uint_eq(p.mb_rows, 8);
	ck_assert_uint_eq(p.first[3], 5);
	ck_assert(p.balance >= 1.0);
	ck_assert_int_eq(mbp_model_balance(m, 6, 8, -1, &p), -ERANGE);
	mbp_model_destroy(m);
}
END_TEST

/* ---- stages driven by hand ---- */

struct hand {
	mbp_model_stages *st;
	unsigned n;
	mbp_stage_desc d[8];
	float *buf[2][9]; /* two sets: two micro-batches in flight at once */
	uint32_t max_rows;
};

static void hand_start(struct hand *hd, mbp_model *m, const unsigned *first, unsigned n, uint32_t max_rows)
{
	mbp_model_plan p = {.stages = n, .layers = m->layers};
	for (unsigned i = 0; i <= n; i++)
		p.first[i] = first[i];
	ck_assert_int_eq(mbp_model_stages_new(&hd->st, m, &p, max_rows), 0);
	ck_assert_uint_eq(mbp_model_stages_count(hd->st), n);
	hd->n = n;
	hd->max_rows = max_rows;
	for (unsigned i = 0; i < n; i++) {
		ck_assert_int_eq(mbp_model_stage_desc(hd->st, i, &hd->d[i]), 0);
		ck_assert_int_eq(hd->d[i].init(hd->d[i].ctx, i), 0); /* stage 0 registers this thread */
		for (int k = 0; k < 2; k++)
			hd->buf[k][i + 1] = malloc((size_t)max_rows * hd->d[i].out_row_bytes);
	}
	ck_assert_int_eq(mbp_model_stage_desc(hd->st, n, &hd->d[n]), -ERANGE);
	ck_assert_ptr_nonnull(hd->d[0].done);
	for (unsigned i = 1; i < n; i++)
		ck_assert_ptr_null(hd->d[i].done);
}

static void hand_stop(struct hand *hd)
{
	for (unsigned i = 0; i < hd->n; i++) {
		hd->d[i].fini(hd->d[i].ctx);
		free(hd->buf[0][i + 1]);
		free(hd->buf[1][i + 1]);
	}
	mbp_model_stages_destroy(hd->st);
}

/* Run stages [from, to) on mb[from] -> mb[to] with buffer set k; mb[i] is the input of stage i. */
static void hand_run(struct hand *hd, mbp_mb *mb, unsigned from, unsigned to, int k)
{
	for (unsigned i = from; i < to; i++) {
		mbp_mb *out = &mb[i + 1];
		out->data = hd->buf[k][i + 1];
		out->capacity = (size_t)hd->max_rows * hd->d[i].out_row_bytes;
		out->rows = mb[i].rows;
		out->row_bytes = (uint32_t)hd->d[i].out_row_bytes;
		out->carry = mb[i].carry; /* as the engine does */
		ck_assert_int_eq(hd->d[i].fn(hd->d[i].ctx, &mb[i], out), 0);
	}
}

START_TEST(stages_by_hand_equal_the_reference_bit_for_bit)
{
	uint32_t widths[] = {48, 64, 80, 24, 64, 16};
	mbp_model_spec sp = {.layers = 5, .widths = widths, .act = MBP_ACT_GELU, .norm = true, .seed = 4};
	mbp_model *m = make_model(0, &sp);
	static const unsigned splits[][4] = {{0, 5}, {0, 2, 5}, {0, 1, 4, 5}};
	static const unsigned ns[] = {1, 2, 3};
	for (int k = 0; k < 3; k++) {
		struct hand hd;
		hand_start(&hd, m, splits[k], ns[k], 8);
		for (uint32_t rows = 1; rows <= 8; rows += 3) {
			float *x = random_rows(rows * 48, rows), ref[8 * 16];
			ck_assert_int_eq(mbp_model_forward(m, x, ref, rows, rows), 0);
			mbp_mb mb[4] = {
			    {.data = x, .rows = rows, .row_bytes = 48 * 4, .capacity = rows * 48 * 4}};
			hand_run(&hd, mb, 0, ns[k], 0);
			ck_assert_ptr_eq(mb[ns[k]].carry, m->current);
			ck_assert_mem_eq(mb[ns[k]].data, ref, rows * 16 * 4);
			ck_assert_uint_eq(atomic_load(&m->current->refs), 2);
			hd.d[0].done(hd.d[0].ctx, &mb[ns[k]]);
			ck_assert_ptr_null(mb[ns[k]].carry);
			ck_assert_uint_eq(atomic_load(&m->current->refs), 1);
			free(x);
		}
		/* a wrong row width or too many rows fail the micro-batch without taking a reference */
		float x[9 * 48];
		mbp_mb bad[4] = {{.data = x, .rows = 9, .row_bytes = 48 * 4, .capacity = sizeof(x)}};
		mbp_mb out = {.data = hd.buf[0][1],
			      .rows = 9,
			      .row_bytes = (uint32_t)hd.d[0].out_row_bytes,
			      .capacity = 8 * hd.d[0].out_row_bytes};
		ck_assert_int_eq(hd.d[0].fn(hd.d[0].ctx, &bad[0], &out), -E2BIG);
		bad[0].rows = out.rows = 1;
		bad[0].row_bytes = 47 * 4;
		ck_assert_int_eq(hd.d[0].fn(hd.d[0].ctx, &bad[0], &out), -EINVAL);
		ck_assert_ptr_null(out.carry);
		ck_assert_uint_eq(atomic_load(&m->current->refs), 1);
		hand_stop(&hd);
	}
	mbp_model_plan bad = {.stages = 2, .layers = 5, .first = {0, 0, 5}};
	mbp_model_stages *st;
	ck_assert_int_eq(mbp_model_stages_new(&st, m, &bad, 8), -EINVAL);
	bad.first[1] = 3;
	ck_assert_int_eq(mbp_model_stages_new(&st, m, &bad, 0), -EINVAL);
	bad.layers = 4;
	ck_assert_int_eq(mbp_model_stages_new(&st, m, &bad, 8), -EINVAL);
	mbp_model_destroy(m);
}
END_TEST

START_TEST(layers_loaded_in_parts_compute_the_whole_model_bit_for_bit)
{
	uint32_t widths[] = {48, 64, 80, 24, 64, 16};
	mbp_model_spec sp = {.layers = 5, .widths = widths, .act = MBP_ACT_GELU, .norm = true, .seed = 9};
	mbp_model *m = make_model(0, &sp);
	char p[128];
	snprintf(p, sizeof(p), "%s/m0.safetensors", dir);
	mbp_model *a, *b;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load_layers(&a, p, 0, 2, &e) == 0, "%s", e.msg);
	ck_assert_msg(mbp_model_load_layers(&b, p, 2, 3, &e) == 0, "%s", e.msg);
	ck_assert_uint_eq(mbp_model_layers(a), 2);
	ck_assert_uint_eq(mbp_model_layers(b), 3);
	ck_assert_uint_eq(mbp_model_in_width(b), 80);
	ck_assert_uint_eq(mbp_model_out_width(b), 16);
	enum { ROWS = 7 };
	float *x = random_rows(ROWS * 48, 3), mid[ROWS * 80], out[ROWS * 16], ref[ROWS * 16];
	ck_assert_int_eq(mbp_model_forward(m, x, ref, ROWS, 4), 0);
	ck_assert_int_eq(mbp_model_forward(a, x, mid, ROWS, 4), 0);
	ck_assert_int_eq(mbp_model_forward(b, mid, out, ROWS, 4), 0);
	ck_assert_mem_eq(out, ref, sizeof(ref));
	mbp_model_destroy(a);
	/* ranges past the file's layers, or empty, are refused with the rule that names them */
	ck_assert_int_eq(mbp_model_load_layers(&a, p, 3, 3, &e), -ENOENT);
	ck_assert_int_eq(e.rule, MBP_MODEL_MISSING);
	ck_assert_int_eq(mbp_model_load_layers(&a, p, 0, 0, &e), -ENOENT);
	ck_assert_int_eq(mbp_model_load_layers(&a, p, 5, 1, &e), -ENOENT);
	free(x);
	mbp_model_destroy(m);
	mbp_model_destroy(b);
}
END_TEST

/* Bytes this process has passed to read()/pread() so far (/proc/self/io's rchar); -1 if unknown. */
static long long bytes_read(void)
{
	FILE *f = fopen("/proc/self/io", "r");
	long long v = -1;
	char line[128];
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "rchar: %lld", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

START_TEST(a_part_reads_only_its_own_layers_bytes_from_the_file)
{
	/* Layer 2 (1024 x 1024 F32, 4 MiB) dwarfs the others (under 70 KiB together). */
	uint32_t widths[] = {8, 16, 1024, 1024, 8};
	mbp_model_spec sp = {.layers = 4, .widths = widths, .act = MBP_ACT_RELU, .seed = 4};
	mbp_model *m = make_model(0, &sp);
	char p[128];
	snprintf(p, sizeof(p), "%s/m0.safetensors", dir);
	long long r0 = bytes_read();
	if (r0 < 0) {
		fprintf(stderr, "no /proc/self/io: the byte count is not checked\n");
		mbp_model_destroy(m);
		return;
	}
	const long long big = 1024LL * 1024 * 4;
	mbp_model *a, *b, *c;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load_layers(&a, p, 0, 2, &e) == 0, "%s", e.msg);
	long long r1 = bytes_read();
	ck_assert_msg(r1 - r0 < 128 * 1024, "layers 0-1 read %lld bytes", r1 - r0);
	ck_assert_msg(mbp_model_load_layers(&b, p, 2, 1, &e) == 0, "%s", e.msg);
	long long r2 = bytes_read();
	ck_assert_msg(r2 - r1 >= big && r2 - r1 < big + 64 * 1024, "layer 2 read %lld bytes", r2 - r1);
	ck_assert_msg(mbp_model_load_layers(&c, p, 3, 1, &e) == 0, "%s", e.msg);
	ck_assert_msg(bytes_read() - r2 < 128 * 1024, "layer 3 read %lld bytes", bytes_read() - r2);
	enum { ROWS = 5 };
	float *x = random_rows(ROWS * 8, 5), *mid = malloc(ROWS * 1024 * 4 * 2), out[ROWS * 8], ref[ROWS * 8];
	ck_assert_ptr_nonnull(mid);
	ck_assert_int_eq(mbp_model_forward(m, x, ref, ROWS, ROWS), 0);
	ck_assert_int_eq(mbp_model_forward(a, x, mid, ROWS, ROWS), 0);
	ck_assert_int_eq(mbp_model_forward(b, mid, mid + ROWS * 1024, ROWS, ROWS), 0);
	ck_assert_int_eq(mbp_model_forward(c, mid + ROWS * 1024, out, ROWS, ROWS), 0);
	ck_assert_mem_eq(out, ref, sizeof(ref));
	mbp_model_destroy(a);
	mbp_model_destroy(b);
	mbp_model_destroy(c);
	mbp_model_destroy(m);
	/* F16 tensors of odd sizes sit at offsets that are not multiples of 4: parts still convert exactly */
	uint32_t odd[] = {7, 13, 5, 3};
	mbp_model_spec sh = {.layers = 3, .widths = odd, .norm = true, .dtype = MBP_DTYPE_F16, .seed = 6};
	m = make_model(1, &sh);
	snprintf(p, sizeof(p), "%s/m1.safetensors", dir);
	ck_assert_msg(mbp_model_load_layers(&a, p, 0, 1, &e) == 0, "%s", e.msg);
	ck_assert_msg(mbp_model_load_layers(&b, p, 1, 2, &e) == 0, "%s", e.msg);
	ck_assert_int_eq(mbp_model_forward(m, x, ref, ROWS, ROWS), 0);
	ck_assert_int_eq(mbp_model_forward(a, x, mid, ROWS, ROWS), 0);
	ck_assert_int_eq(mbp_model_forward(b, mid, out, ROWS, ROWS), 0);
	ck_assert_mem_eq(out, ref, ROWS * 3 * sizeof(float));
	free(x);
	free(mid);
	mbp_model_destroy(a);
	mbp_model_destroy(b);
	mbp_model_destroy(m);
}
END_TEST

START_TEST(swap_keeps_a_micro_batch_on_its_version_and_frees_the_old_after_it)
{
	mbp_model_spec sp = {
	    .layers = 4, .in = 32, .hidden = 48, .out = 16, .act = MBP_ACT_RELU, .seed = 100};
	mbp_model *m = make_model(0, &sp);
	sp.seed = 200;
	mbp_model *b = make_model(1, &sp);
	const uint32_t rows = 3;
	float *x = random_rows(rows * 32, 77), ra[3 * 16], rb[3 * 16];
	ck_assert_int_eq(mbp_model_forward(m, x, ra, rows, rows), 0);
	ck_assert_int_eq(mbp_model_forward(b, x, rb, rows, rows), 0);
	ck_assert(memcmp(ra, rb, sizeof(ra)) != 0);

	struct hand hd;
	static const unsigned split[] = {0, 2, 4};
	hand_start(&hd, m, split, 2, 4);
	/* micro-batch 1 passes stage 0 with version 1 ... */
	mbp_mb mb1[3] = {{.data = x, .rows = rows, .row_bytes = 32 * 4}};
	hand_run(&hd, mb1, 0, 1, 0);
	struct mbp__version *v1 = mb1[1].carry;
	ck_assert_ptr_eq(v1, m->current);
	ck_assert_uint_eq(mbp_model_version(m), 1);
	/* ... the weights are swapped (this thread is an RCU reader outside a read-side section) ... */
	ck_assert_int_eq(mbp_model_swap(m, b), 0);
	ck_assert_uint_eq(mbp_model_version(m), 2);
	ck_assert_ptr_ne(m->current, v1);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 2); /* v1 lives on for micro-batch 1 */
	ck_assert_uint_eq(atomic_load(&v1->refs), 1);
	/* ... micro-batch 2 starts with version 2 ... */
	mbp_mb mb2[3] = {{.data = x, .rows = rows, .row_bytes = 32 * 4}};
	float out2[3 * 16];
	hand_run(&hd, mb2, 0, 2, 1);
	memcpy(out2, mb2[2].data, sizeof(out2));
	ck_assert_ptr_eq(mb2[2].carry, m->current);
	/* ... and micro-batch 1 finishes on version 1. */
	hand_run(&hd, mb1, 1, 2, 0);
	ck_assert_mem_eq(mb1[2].data, ra, sizeof(ra));
	ck_assert_mem_eq(out2, rb, sizeof(rb));
	hd.d[0].done(hd.d[0].ctx, &mb1[2]);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1); /* the last user freed v1 */
	hd.d[0].done(hd.d[0].ctx, &mb2[2]);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	ck_assert_uint_eq(atomic_load(&m->current->refs), 1);
	float y[3 * 16];
	ck_assert_int_eq(mbp_model_forward(m, x, y, rows, rows), 0);
	ck_assert_mem_eq(y, rb, sizeof(rb));
	hand_stop(&hd);
	free(x);
	mbp_model_destroy(m);
}
END_TEST

START_TEST(swap_rejects_another_structure_and_leaves_both_models_usable)
{
	mbp_model_spec sp = {.layers = 3, .in = 16, .hidden = 16, .out = 4, .act = MBP_ACT_RELU, .seed = 1};
	mbp_model *m = make_model(0, &sp);
	sp.act = MBP_ACT_GELU;
	mbp_model *g = make_model(1, &sp);
	sp.act = MBP_ACT_RELU;
	sp.hidden = 17;
	mbp_model *w = make_model(2, &sp);
	ck_assert_int_eq(mbp_model_swap(m, g), -EINVAL);
	ck_assert_int_eq(mbp_model_swap(m, w), -EINVAL);
	ck_assert_int_eq(mbp_model_swap(m, m), -EINVAL);
	ck_assert_int_eq(mbp_model_swap(NULL, w), -EINVAL);
	ck_assert_uint_eq(mbp_model_version(m), 1);
	float x[16] = {1}, y[4];
	ck_assert_int_eq(mbp_model_forward(g, x, y, 1, 1), 0);
	ck_assert_int_eq(mbp_model_forward(w, x, y, 1, 1), 0);
	/* a chain of swaps counts versions */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(mbp_model_swap(m, reload(0)), 0);
	ck_assert_uint_eq(mbp_model_version(m), 4);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	mbp_model_destroy(m);
	mbp_model_destroy(g);
	mbp_model_destroy(w);
}
END_TEST

START_TEST(blas_info_names_the_kernel_and_warns_only_for_a_generic_one)
{
	const char *info = mbp_blas_info();
	ck_assert_ptr_nonnull(info);
	ck_assert_ptr_nonnull(strstr(info, openblas_get_corename()));
	const char *w = mbp_blas_warning();
	const char *core = openblas_get_corename();
	bool modern = !strcasecmp(core, "Haswell") || !strcasecmp(core, "Zen") ||
		      !strcasecmp(core, "SkylakeX") || !strcasecmp(core, "CooperLake") ||
		      !strcasecmp(core, "SapphireRapids") || !strcasecmp(core, "Excavator");
	__builtin_cpu_init();
	bool capable = __builtin_cpu_supports("avx2") || __builtin_cpu_supports("avx512f");
	ck_assert(!!w == (!modern && capable));
	if (w) {
		ck_assert_ptr_nonnull(strstr(w, core));
		ck_assert_ptr_nonnull(strstr(w, "OPENBLAS_CORETYPE="));
	}
	ck_assert_ptr_eq(mbp_blas_info(), info); /* static */
}
END_TEST

/* ---- inside a pipeline ---- */

static mbp_pipeline *model_pipeline(mbp_model *m, mbp_model_stages **st, unsigned stages, uint32_t max_mb,
				    mbp_result_fn on_result, void *arg)
{
	double c[MBP_MODEL_MAX_LAYERS];
	for (unsigned i = 0; i < mbp_model_layers(m); i++)
		c[i] = 1;
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(c, NULL, mbp_model_layers(m), stages, &plan), 0);
	return model_pipeline_plan(m, st, &plan, max_mb, on_result, arg);
}

struct results {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned got;
	mbp_mb *mb[8];
};

static void on_result(void *arg, mbp_mb *mb)
{
	struct results *r = arg;
	pthread_mutex_lock(&r->lock);
	r->mb[mb->seq] = mb;
	r->got++;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

/* Micro-batches pinned to a version run with it after a swap; unpinned ones take the new version. */
START_TEST(a_pinned_micro_batch_runs_with_its_version_after_a_swap)
{
	mbp_model_spec sp = {.layers = 3, .in = 8, .hidden = 16, .out = 4, .act = MBP_ACT_RELU, .seed = 1};
	mbp_model *m = make_model(0, &sp), *ref_a = reload(0);
	sp.seed = 2;
	mbp_model *next = make_model(1, &sp), *ref_b = reload(1);
	struct results r = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
	mbp_model_stages *st;
	mbp_pipeline *p = model_pipeline(m, &st, 2, 4, on_result, &r);
	mbp_model_weights *w1 = mbp_model_weights_get(m);
	ck_assert_uint_eq(mbp_model_weights_version(w1), 1);
	ck_assert_int_eq(mbp_model_swap(m, next), 0);
	ck_assert_uint_eq(mbp_model_version(m), 2);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 2); /* w1 keeps version 1 */
	float *x = random_rows(4 * 8, 3);
	mbp_mb *mb[2];
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(mbp_mb_acquire(p, &mb[i], -1), 0);
		ck_assert_ptr_null(mb[i]->carry);
		memcpy(mb[i]->data, x, 4 * 8 * sizeof(float));
		mb[i]->rows = 4;
		mb[i]->seq = (uint64_t)i;
	}
	ck_assert_int_eq(mbp_model_mb_pin(mb[0], w1), 0);
	ck_assert_int_eq(mbp_model_mb_pin(mb[0], w1), -EINVAL); /* once */
	mbp_model_weights_put(w1);				/* the micro-batch holds its own */
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(mbp_mb_submit(p, mb[i], -1), 0);
	pthread_mutex_lock(&r.lock);
	while (r.got < 2)
		pthread_cond_wait(&r.cond, &r.lock);
	pthread_mutex_unlock(&r.lock);
	float want_a[16], want_b[16];
	ck_assert_int_eq(mbp_model_forward(ref_a, x, want_a, 4, 0), 0);
	ck_assert_int_eq(mbp_model_forward(ref_b, x, want_b, 4, 0), 0);
	ck_assert_int_eq(r.mb[0]->status, 0);
	ck_assert_mem_eq(r.mb[0]->data, want_a, sizeof(want_a));
	ck_assert_mem_eq(r.mb[1]->data, want_b, sizeof(want_b));
	for (int i = 0; i < 2; i++) {
		mbp_model_mb_unpin(r.mb[i]); /* nothing left to drop: the stages did */
		mbp_mb_release(p, r.mb[i]);
	}
	mbp_pipeline_destroy(p);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1); /* version 1 went with its micro-batch */
	mbp_model_stages_destroy(st);
	mbp_model_destroy(m);
	mbp_model_destroy(ref_a);
	mbp_model_destroy(ref_b);
	free(x);
}
END_TEST

START_TEST(pipeline_output_equals_the_reference_bit_for_bit)
{
	uint32_t widths[] = {40, 96, 64, 128, 32, 72, 24};
	mbp_model_spec sp = {.layers = 6, .widths = widths, .act = MBP_ACT_GELU, .norm = true, .seed = 21};
	mbp_model *m = make_model(0, &sp);
	const size_t rows = 45;
	float *x = random_rows(rows * 40, 3), *ref = malloc(rows * 24 * 4), *whole = malloc(rows * 24 * 4),
	      *y = malloc(rows * 24 * 4);
	ck_assert_int_eq(mbp_model_forward(m, x, whole, rows, 0), 0);
	static const uint32_t mbs[] = {1, 6, 16};
	for (unsigned stages = 1; stages <= 3; stages++) {
		struct results res = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
		mbp_model_stages *st;
		mbp_pipeline *p = model_pipeline(m, &st, stages, 16, on_result, &res);
		for (unsigned k = 0; k < 3; k++) {
			memset(y, 0xff, rows * 24 * 4);
			ck_assert_int_eq(mbp_run(p, x, y, rows, mbs[k]), 0);
			ck_assert_int_eq(mbp_model_forward(m, x, ref, rows, mbs[k]), 0);
			ck_assert_msg(!memcmp(y, ref, rows * 24 * 4),
				      "%u stages, micro-batch %u: not bit for bit", stages, mbs[k]);
			for (size_t r = 0; r < rows; r++)
				ck_assert_double_lt(row_rel_err(y + r * 24, whole + r * 24, 24), 1e-5);
		}
		/* single micro-batches of 1..8 rows through mbp_mb_submit: same as the reference */
		for (uint32_t k = 0; k < 8; k++) {
			mbp_mb *mb;
			ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
			mb->rows = k + 1;
			mb->seq = k;
			memcpy(mb->data, x + k * 40, (k + 1) * 40 * 4);
			ck_assert_int_eq(mbp_mb_submit(p, mb, -1), 0);
		}
		pthread_mutex_lock(&res.lock);
		while (res.got < 8)
			pthread_cond_wait(&res.cond, &res.lock);
		pthread_mutex_unlock(&res.lock);
		for (uint32_t k = 0; k < 8; k++) {
			ck_assert_int_eq(res.mb[k]->status, 0);
			ck_assert_uint_eq(res.mb[k]->rows, k + 1);
			ck_assert_int_eq(mbp_model_forward(m, x + k * 40, ref, k + 1, k + 1), 0);
			ck_assert_mem_eq(res.mb[k]->data, ref, (k + 1) * 24 * 4);
			mbp_mb_release(p, res.mb[k]);
		}
		ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
		mbp_pipeline_destroy(p);
		mbp_model_stages_destroy(st);
		ck_assert_uint_eq(atomic_load(&m->current->refs),
				  1); /* every micro-batch dropped its reference */
	}
	free(x);
	free(ref);
	free(whole);
	free(y);
	mbp_model_destroy(m);
}
END_TEST

#define SW_INPUTS 4
#define SW_ROWS	  12
#define SW_MB	  4

struct swapper {
	mbp_model *m;
	_Atomic bool stop;
	_Atomic unsigned swaps;
};

static void *swap_loop(void *arg)
{
	struct swapper *s = arg;
	while (!atomic_load(&s->stop)) {
		/* alternate files 1 and 0: version 2k is B, 2k + 1 is A */
		mbp_model *next = reload(atomic_load(&s->swaps) % 2 == 0 ? 1 : 0);
		ck_assert_int_eq(mbp_model_swap(s->m, next), 0);
		atomic_fetch_add(&s->swaps, 1);
		usleep(500);
	}
	return NULL;
}

/* The swap under load, through 3 stages of one thread each (_i 0), and through a replicated stage 0
 * that spreads each job's micro-batches over its 3 replicas (_i 1: still one version per job). */
static const mbp_model_plan replicated_plan = {
    .stages = 2, .layers = 6, .first = {0, 3, 6}, .replicas = {3, 2}};

START_TEST(swap_under_load_gives_each_job_one_version_never_a_mix)
{
	mbp_model_spec sp = {.layers = 6, .in = 48, .hidden = 64, .out = 16, .act = MBP_ACT_RELU, .seed = 1};
	mbp_model *m = make_model(0, &sp);
	sp.seed = 2;
	mbp_model *b = make_model(1, &sp);
	float *x[SW_INPUTS], ra[SW_INPUTS][SW_ROWS * 16], rb[SW_INPUTS][SW_ROWS * 16];
	for (int i = 0; i < SW_INPUTS; i++) {
		x[i] = random_rows(SW_ROWS * 48, 50 + i);
		ck_assert_int_eq(mbp_model_forward(m, x[i], ra[i], SW_ROWS, SW_MB), 0);
		ck_assert_int_eq(mbp_model_forward(b, x[i], rb[i], SW_ROWS, SW_MB), 0);
	}
	mbp_model_destroy(b);
	mbp_model_stages *st;
	mbp_pipeline *p = _i ? model_pipeline_plan(m, &st, &replicated_plan, SW_MB, NULL, NULL)
			     : model_pipeline(m, &st, 3, SW_MB, NULL, NULL);
	struct swapper sw = {.m = m};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, swap_loop, &sw), 0);

	enum { DEPTH = 16 };
	mbp_job job[DEPTH];
	float out[DEPTH][SW_ROWS * 16];
	unsigned long jobs = mbp_iters(3000, 300), na = 0, nb = 0, mixed = 0, jobs_mixed = 0;
	for (unsigned long j = 0; j < jobs + DEPTH; j++) {
		unsigned slot = j % DEPTH;
		if (j >= DEPTH) { /* check the job submitted DEPTH ago */
			ck_assert_int_eq(mbp_job_wait(&job[slot], -1), 0);
			ck_assert_int_eq(job[slot].status, 0);
			unsigned in = (j - DEPTH) % SW_INPUTS;
			unsigned ja = 0, jb = 0;
			for (unsigned k = 0; k < SW_ROWS / SW_MB; k++) {
				size_t off = (size_t)k * SW_MB * 16, n = SW_MB * 16 * sizeof(float);
				if (!memcmp(out[slot] + off, ra[in] + off, n))
					ja++;
				else if (!memcmp(out[slot] + off, rb[in] + off, n))
					jb++;
				else
					mixed++;
			}
			na += ja;
			nb += jb;
			jobs_mixed += ja && jb; /* a job runs on one version */
		}
		if (j < jobs) {
			/* keep going until both versions have been current for a while */
			if (j + 1 == jobs && atomic_load(&sw.swaps) < 4) {
				jobs++;
				usleep(100);
			}
			mbp_job_init(&job[slot], x[j % SW_INPUTS], out[slot], SW_ROWS, SW_MB);
			ck_assert_int_eq(mbp_job_submit(p, &job[slot], -1), 0);
		}
	}
	atomic_store(&sw.stop, true);
	pthread_join(t, NULL);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	if (getenv("MBP_TEST_VERBOSE"))
		fprintf(stderr, "swap under load: %lu micro-batches on A, %lu on B, %u swaps\n", na, nb,
			atomic_load(&sw.swaps));
	ck_assert_msg(mixed == 0, "%lu micro-batches match neither version (%lu A, %lu B)", mixed, na, nb);
	ck_assert_msg(jobs_mixed == 0, "%lu jobs ran partly on each version", jobs_mixed);
	ck_assert_msg(na > 0 && nb > 0, "both versions should have served: %lu A, %lu B, %u swaps", na, nb,
		      atomic_load(&sw.swaps));
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1); /* every old version was freed */
	ck_assert_uint_eq(mbp_model_version(m), 1 + atomic_load(&sw.swaps));
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	for (int i = 0; i < SW_INPUTS; i++)
		free(x[i]);
	mbp_model_destroy(m);
}
END_TEST

/* ---- rebalancing while running ---- */

/* Costs injected through the cost hook (never the clock): 1 ms a layer, and 3 ms for layers `heavy` and
 * up once a micro-batch's seq reaches `change`; `noise` adds a deterministic +-3 % per layer and
 * micro-batch. Each layer's stage is recorded per micro-batch, to check that one plan computed it. */
#define RB_LAYERS 8
struct rb_costs {
	uint64_t change;
	unsigned heavy;
	double heavy_ns; /* 0: 3 ms */
	bool noise;
	bool
	    alternate; /* the heavy half swaps every 16 micro-batches (each window): layers 0-3, then 4-7, ... */
	uint8_t *stage_of; /* [seq][layer]: 1 + the stage that ran it */
	size_t mbs;
	_Atomic unsigned moves_seen;
	mbp_model_move last;
};

static double rb_cost(void *arg, unsigned stage, unsigned layer, const mbp_mb *mb, double measured_ns)
{
	struct rb_costs *c = arg;
	(void)measured_ns;
	ck_assert_uint_lt(mb->seq, c->mbs);
	c->stage_of[mb->seq * RB_LAYERS + layer] = (uint8_t)(stage + 1);
	double ns = mb->seq >= c->change && layer >= c->heavy ? (c->heavy_ns ? c->heavy_ns : 3e6) : 1e6;
	if (c->alternate) /* blocks [16 k, 16 k + 16): the windows of stage 0's looks, one by one */
		ns = (mb->seq / 16 % 2 == 0) == (layer < RB_LAYERS / 2) ? 3e6 : 1e6;
	if (c->noise) {
		uint64_t h = mb->seq * 0x9e3779b97f4a7c15u ^ layer * 0xbf58476d1ce4e5b9u;
		h ^= h >> 31;
		ns *= 1.0 + 0.03 * ((double)(h % 2001) / 1000.0 - 1.0);
	}
	return ns;
}

static void rb_on_move(void *arg, const mbp_model_move *mv)
{
	struct rb_costs *c = arg;
	c->last = *mv; /* stage 0's thread; read after the drain */
	atomic_fetch_add(&c->moves_seen, 1);
}

/* The stages of 2 from the plan 4 | 4 (or `first`, with `replicas` when given), rebalancing with window
 * 16 and the hook above. */
static mbp_pipeline *rb_pipeline_replicas(mbp_model *m, mbp_model_stages **st, struct rb_costs *c,
					  uint32_t max_mb, const unsigned *first, const unsigned *replicas,
					  mbp_result_fn on_res, void *arg)
{
	double ones[RB_LAYERS] = {1, 1, 1, 1, 1, 1, 1, 1};
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(ones, NULL, RB_LAYERS, 2, &plan), 0);
	if (first)
		memcpy(plan.first, first, 3 * sizeof(first[0]));
	if (replicas)
		memcpy(plan.replicas, replicas, 2 * sizeof(replicas[0]));
	mbp_model_stages_opts so = {.rebalance = {.on = true,
						  .window = 16,
						  .on_move = rb_on_move,
						  .on_move_arg = c,
						  .cost = rb_cost,
						  .cost_arg = c}};
	ck_assert_int_eq(mbp_model_stages_new_opts(st, m, &plan, max_mb, &so), 0);
	return stages_pipeline(m, *st, max_mb, on_res, arg);
}

static mbp_pipeline *rb_pipeline(mbp_model *m, mbp_model_stages **st, struct rb_costs *c, uint32_t max_mb,
				 const unsigned *first, mbp_result_fn on_res, void *arg)
{
	return rb_pipeline_replicas(m, st, c, max_mb, first, NULL, on_res, arg);
}

/* Each micro-batch ran under one plan of 2 stages: stage 1 for its first `cut` layers, 2 for the rest.
 * Returns the cut; fails the test otherwise. */
static unsigned rb_cut_of(const uint8_t *stage_of, uint64_t seq)
{
	const uint8_t *s = &stage_of[seq * RB_LAYERS];
	unsigned cut = 0;
	while (cut < RB_LAYERS && s[cut] == 1)
		cut++;
	ck_assert_msg(cut > 0 && cut < RB_LAYERS, "micro-batch %" PRIu64 ": no layer on one stage", seq);
	for (unsigned l = cut; l < RB_LAYERS; l++)
		ck_assert_msg(s[l] == 2, "micro-batch %" PRIu64 ": layer %u on stage %u after the cut %u",
			      seq, l, s[l] - 1, cut);
	return cut;
}

static unsigned rb_cut(const struct rb_costs *c, uint64_t seq)
{
	return rb_cut_of(c->stage_of, seq);
}

static mbp_model *rb_model(void)
{
	uint32_t widths[RB_LAYERS + 1] = {12, 40, 24, 56, 16, 64, 32, 48, 8}; /* hops of every width */
	mbp_model_spec sp = {
	    .layers = RB_LAYERS, .widths = widths, .act = MBP_ACT_RELU, .norm = true, .seed = 7};
	return make_model(0, &sp);
}

/* Layers 4-7 get 3 times dearer at micro-batch 100 of a job: the stages move once, from cutting at 4 to
 * cutting at 5 (the exact plan for 1,1,1,1,3,3,3,3), only after the change and no sooner than the
 * patience allows, each micro-batch computed by one plan, in admission order, and the output is
 * mbp_model_forward's bit for bit. */
START_TEST(rebalance_moves_once_costs_change_and_the_output_stays_bit_for_bit)
{
	mbp_model *m = rb_model();
	const size_t mbs = 300, rows = 2 * mbs - 1; /* the last micro-batch is short */
	struct rb_costs c = {.change = 100, .heavy = 4, .mbs = mbs, .stage_of = calloc(mbs * RB_LAYERS, 1)};
	mbp_model_stages *st;
	mbp_pipeline *p = rb_pipeline(m, &st, &c, 2, NULL, NULL, NULL);
	mbp_model_rebalance_stats rs;
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	ck_assert(rs.on);
	ck_assert_uint_eq(rs.plan, 1);
	ck_assert_uint_eq(rs.current.first[1], 4);
	float *x = random_rows(rows * 12, 5), *y = malloc(rows * 8 * 4), *ref = malloc(rows * 8 * 4);
	memset(y, 0xff, rows * 8 * 4);
	ck_assert_int_eq(mbp_run(p, x, y, rows, 2), 0);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_int_eq(mbp_model_forward(m, x, ref, rows, 2), 0);
	ck_assert_msg(!memcmp(y, ref, rows * 8 * 4), "not bit for bit across a move");
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	ck_assert_uint_eq(rs.moves, 1);
	ck_assert_uint_eq(rs.plan, 2);
	ck_assert_uint_eq(atomic_load(&c.moves_seen), 1);
	ck_assert_uint_eq(rs.current.first[1], 5);
	ck_assert_uint_eq(c.last.plan, 2);
	ck_assert_uint_eq(c.last.from.first[1], 4);
	ck_assert_uint_eq(c.last.to.first[1], 5);
	ck_assert_double_eq_tol(c.last.to.slowest_ns, 9e6 + 1e3, 1); /* 3 heavy layers and a hop */
	ck_assert_double_gt(c.last.measured_slowest_ns, 1.1 * 9e6);  /* why it moved */
	ck_assert_double_eq_tol(c.last.predicted_ns, 4.0, 1e-9);     /* the first plan's unit costs */
	ck_assert_ptr_nonnull(strstr(rs.last_reason, "stage 1 (layers 4-7)"));
	ck_assert_str_eq(rs.last_reason, c.last.reason);
	/* at a look (stage 0 looks as it opens a window, at micro-batch 16 k), once the window holding the
	 * change and the next one have both left: patience 2 */
	ck_assert_uint_eq(c.last.admitted % 16, 0);
	ck_assert_uint_ge(c.last.admitted, (c.change / 16 + 2) * 16);
	unsigned prev = 4;
	for (uint64_t k = 0; k < mbs; k++) {
		unsigned cut = rb_cut(&c, k);
		ck_assert_msg(cut == (k < c.last.admitted ? 4u : 5u),
			      "micro-batch %" PRIu64 " cut at %u (move at %" PRIu64 ")", k, cut,
			      c.last.admitted);
		ck_assert_uint_ge(cut, prev);
		prev = cut;
	}
	mbp_pipeline_stats ps;
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, NULL, 0), 2);
	ck_assert_uint_eq(ps.mbs_accepted, mbs);
	ck_assert_uint_eq(ps.mbs_completed, mbs);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	mbp_model_destroy(m);
	free(c.stage_of);
	free(x);
	free(y);
	free(ref);
}
END_TEST

/* Steady costs never move: equal ones with +-3 % noise per micro-batch and layer; and a plan 5 % slower
 * than the best (cut at 5 under 1,1,1,1,1.25,1.25,1.25,1.25: 5.25 against 5.0 cutting at 4) stays, under
 * the default threshold of 10 %. */
START_TEST(rebalance_never_moves_while_costs_are_steady_or_within_the_threshold)
{
	mbp_model *m = rb_model();
	const size_t mbs = 1200;
	static const unsigned cut5[3] = {0, 5, RB_LAYERS};
	for (int round = 0; round < 2; round++) {
		struct rb_costs c = {.change = round ? 0 : UINT64_MAX,
				     .heavy = 4,
				     .heavy_ns = 1.25e6,
				     .noise = round == 0,
				     .mbs = mbs,
				     .stage_of = calloc(mbs * RB_LAYERS, 1)};
		mbp_model_stages *st;
		mbp_pipeline *p = rb_pipeline(m, &st, &c, 2, round ? cut5 : NULL, NULL, NULL);
		float *x = random_rows(mbs * 12, 9), *y = malloc(mbs * 8 * 4);
		ck_assert_int_eq(mbp_run(p, x, y, mbs, 1), 0);
		ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
		mbp_model_rebalance_stats rs;
		ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
		ck_assert_uint_gt(rs.windows, 10);
		ck_assert_uint_eq(rs.moves, 0);
		ck_assert_uint_eq(atomic_load(&c.moves_seen), 0);
		ck_assert_str_eq(rs.last_reason, "");
		if (round) /* what the last window saw: the plan 5 % above the fresh one */
			ck_assert_double_eq_tol(rs.measured_ns[0] / rs.fresh_slowest_ns, 5.25 / 5.0, 1e-3);
		for (uint64_t k = 0; k < mbs; k++)
			ck_assert_uint_eq(rb_cut(&c, k), round ? 5 : 4);
		mbp_pipeline_destroy(p);
		mbp_model_stages_destroy(st);
		free(c.stage_of);
		free(x);
		free(y);
	}
	mbp_model_destroy(m);
}
END_TEST

#define RB_IN 4
struct rb_results {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t next, out_of_order, failed, na, nb, mixed;
	const float (*ra)[2 * 8], (*rb)[2 * 8];
};

static void rb_on_result(void *arg, mbp_mb *mb)
{
	struct rb_results *r = arg;
	pthread_mutex_lock(&r->lock);
	unsigned in = (unsigned)(mb->seq % RB_IN);
	r->out_of_order += mb->seq != r->next;
	r->failed += mb->status != 0;
	if (!memcmp(mb->data, r->ra[in], sizeof(r->ra[in])))
		r->na++;
	else if (!memcmp(mb->data, r->rb[in], sizeof(r->rb[in])))
		r->nb++;
	else
		r->mixed++;
	r->next++;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
	mbp_mb_release(NULL, mb);
}

/* Micro-batch k: 2 rows of the input x (2 x 12 floats), stamped k. */
static void rb_submit(mbp_pipeline *p, const float *x, uint64_t k)
{
	mbp_mb *mb;
	ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
	memcpy(mb->data, x, 2 * 12 * sizeof(float));
	mb->rows = 2;
	mb->seq = k;
	ck_assert_int_eq(mbp_mb_submit(p, mb, -1), 0);
}

/* RB_IN inputs of 2 rows (seeds seed, seed + 1, ...) and mbp_model_forward's outputs for them. */
static void rb_inputs(mbp_model *m, float **x, float (*ref)[2 * 8], unsigned seed)
{
	for (int i = 0; i < RB_IN; i++) {
		x[i] = random_rows(2 * 12, seed + i);
		ck_assert_int_eq(mbp_model_forward(m, x[i], ref[i], 2, 2), 0);
	}
}

/* The end of a test of the rig: the pipeline, its stages, the model, its RB_IN inputs and the record. */
static void rb_free(mbp_pipeline *p, mbp_model_stages *st, mbp_model *m, float **x, uint8_t *stage_of)
{
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	for (int i = 0; i < RB_IN; i++)
		free(x[i]);
	free(stage_of);
	mbp_model_destroy(m);
}

/* Micro-batches 0 .. n - 1 of the inputs x in turn, then the drain: every one back in order, computed,
 * mbp_model_forward's bits (r's reference). */
static void rb_stream(mbp_pipeline *p, float *const *x, uint64_t n, struct rb_results *r)
{
	for (uint64_t k = 0; k < n; k++)
		rb_submit(p, x[k % RB_IN], k);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_uint_eq(r->next, n);
	ck_assert_uint_eq(r->out_of_order, 0);
	ck_assert_uint_eq(r->failed, 0);
	ck_assert_msg(r->mixed == 0, "%" PRIu64 " micro-batches are not mbp_model_forward's bits", r->mixed);
}

/* Micro-batches one at a time, so that each window is done by the look that follows it, and costs whose
 * dear half swaps at each window: every look finds a better plan than the one in use (cut at 3, then at
 * 5, ...), never the same one twice in a row, so nothing moves (noise looks like this). */
START_TEST(costs_that_draw_another_plan_at_each_look_never_move)
{
	mbp_model *m = rb_model();
	float x[RB_IN][2 * 12], ref[RB_IN][2 * 8];
	for (int i = 0; i < RB_IN; i++) {
		float *v = random_rows(2 * 12, 70 + i);
		memcpy(x[i], v, sizeof(x[i]));
		free(v);
		ck_assert_int_eq(mbp_model_forward(m, x[i], ref[i], 2, 2), 0);
	}
	const uint64_t n = 16 * 30;
	struct rb_costs c = {
	    .change = UINT64_MAX, .alternate = true, .mbs = n, .stage_of = calloc(n * RB_LAYERS, 1)};
	struct rb_results r = {
	    .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .ra = ref, .rb = ref};
	mbp_model_stages *st;
	mbp_pipeline *p = rb_pipeline(m, &st, &c, 2, NULL, rb_on_result, &r);
	for (uint64_t k = 0; k < n; k++) {
		rb_submit(p, x[k % RB_IN], k);
		pthread_mutex_lock(&r.lock);
		while (r.next <= k)
			pthread_cond_wait(&r.cond, &r.lock);
		pthread_mutex_unlock(&r.lock);
	}
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_uint_eq(r.next, n);
	ck_assert_uint_eq(r.mixed + r.out_of_order + r.failed, 0);
	mbp_model_rebalance_stats rs;
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	/* every window but the last, done after the last look (no window opens after it) */
	ck_assert_uint_eq(rs.windows, n / 16 - 1);
	ck_assert_uint_eq(rs.moves, 0);
	/* and each of them found the plan in use 12 / 9 = 1.33 above a fresh one */
	ck_assert_double_eq_tol(rs.fresh_slowest_ns, 9e6 + ((n / 16 - 2) % 2 ? 1e3 : 0),
				1); /* the last block looked at */
	for (uint64_t k = 0; k < n; k++)
		ck_assert_uint_eq(rb_cut(&c, k), 4);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	free(c.stage_of);
	mbp_model_destroy(m);
}
END_TEST

/* Stamped micro-batches one by one, weights swapped all the while and a move in the middle: every one
 * comes back, in the order submitted, computed with one weights version (A's or B's output bit for bit)
 * and one plan. */
START_TEST(a_move_during_weight_swaps_keeps_order_loses_nothing_and_mixes_no_version_or_plan)
{
	mbp_model *m = rb_model();
	uint32_t widths[RB_LAYERS + 1] = {12, 40, 24, 56, 16, 64, 32, 48, 8};
	mbp_model_spec sp = {
	    .layers = RB_LAYERS, .widths = widths, .act = MBP_ACT_RELU, .norm = true, .seed = 8};
	mbp_model *b = make_model(1, &sp);
	float *x[RB_IN], ra[RB_IN][2 * 8], rbv[RB_IN][2 * 8];
	for (int i = 0; i < RB_IN; i++) {
		x[i] = random_rows(2 * 12, 60 + i);
		ck_assert_int_eq(mbp_model_forward(m, x[i], ra[i], 2, 2), 0);
		ck_assert_int_eq(mbp_model_forward(b, x[i], rbv[i], 2, 2), 0);
	}
	mbp_model_destroy(b);
	const uint64_t want = mbp_iters(3000, 600), cap = 20 * want;
	struct rb_costs c = {
	    .change = want / 3, .heavy = 4, .mbs = cap, .stage_of = calloc(cap * RB_LAYERS, 1)};
	struct rb_results r = {
	    .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .ra = ra, .rb = rbv};
	mbp_model_stages *st;
	mbp_pipeline *p = rb_pipeline(m, &st, &c, 2, NULL, rb_on_result, &r);
	struct swapper sw = {.m = m};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, swap_loop, &sw), 0);
	uint64_t k = 0;
	for (; k < cap && (k < want || atomic_load(&sw.swaps) < 4); k++) {
		rb_submit(p, x[k % RB_IN], k);
		if (k >= want)
			usleep(50); /* waiting for the swaps */
	}
	atomic_store(&sw.stop, true);
	pthread_join(t, NULL);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_uint_eq(r.next, k);
	ck_assert_uint_eq(r.out_of_order, 0);
	ck_assert_uint_eq(r.failed, 0);
	ck_assert_msg(r.mixed == 0, "%" PRIu64 " micro-batches match neither version", r.mixed);
	ck_assert_uint_eq(r.na + r.nb, k);
	ck_assert_msg(r.na > 0 && r.nb > 0, "both versions should have served: %" PRIu64 " A, %" PRIu64 " B",
		      r.na, r.nb);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.mbs_accepted, k);
	ck_assert_uint_eq(ps.mbs_completed + ps.mbs_failed, k);
	mbp_model_rebalance_stats rs;
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	ck_assert_uint_ge(rs.moves, 1);
	ck_assert_uint_eq(rs.current.first[1], 5);
	unsigned prev = 4;
	for (uint64_t i = 0; i < k; i++) {
		unsigned cut = rb_cut(&c, i);
		ck_assert_uint_ge(cut, prev); /* admitted in order, plans in order */
		ck_assert(i >= c.change || cut == 4);
		prev = cut;
	}
	ck_assert_uint_eq(prev, 5);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	rb_free(p, st, m, x, c.stage_of);
}
END_TEST

/* A plan of 2 stages over 4 layers cutting before layer `cut`, its stages costing a and b. */
static mbp_model_plan two_stages(unsigned cut, double a, double b)
{
	mbp_model_plan p = {.stages = 2, .layers = 4, .first = {0, cut, 4}, .stage_ns = {a, b}};
	p.slowest_ns = a > b ? a : b;
	return p;
}

/* Other replicas at the same cuts are another plan: the rule counts strikes for them (the same counts
 * look after look), moves at patience, and the reason names the counts; replicas 0 and 1 are one. */
START_TEST(the_look_rule_moves_for_other_replicas_at_the_same_cuts)
{
	mbp_model_rebalance_rule r = {.patience = 2};
	mbp_model_plan now = two_stages(3, 3, 9), two = two_stages(3, 3, 9), three = two_stages(3, 3, 9);
	two.replicas[1] = 2;
	two.slowest_ns = 4.5;
	three.replicas[1] = 3;
	three.slowest_ns = 3;
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &two), 0);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &three), 0); /* another plan: 1 strike again */
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &three), 1);
	char why[200];
	ck_assert_int_gt(mbp_model_rebalance_reason(&r, &now, &three, 0, why, sizeof why), 0);
	ck_assert_ptr_nonnull(strstr(why, "cutting before layer 3 with replicas 1,3"));
	mbp_model_plan one = two_stages(3, 3, 9);
	one.replicas[0] = 1; /* the same as 0 */
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &one), 0);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &one), 0);
	ck_assert_int_gt(mbp_model_rebalance_reason(&r, &now, &one, 0, why, sizeof why), 0);
	ck_assert_ptr_null(strstr(why, "with replicas"));
}
END_TEST

START_TEST(the_look_rule_moves_after_patience_looks_of_the_same_better_plan_and_only_then)
{
	mbp_model_rebalance_rule r = {.threshold = 0.10, .patience = 3};
	mbp_model_plan now = two_stages(2, 1000, 3000), better = two_stages(3, 2000, 2000);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &better), 0);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &better), 0);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &better), 1);
	ck_assert_uint_eq(r.strikes, 0); /* a move starts the count again */
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &better), 0);
	/* another better plan in between starts the count again at 1 */
	mbp_model_plan other = two_stages(1, 1500, 1500);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &other), 0);
	ck_assert_uint_eq(r.strikes, 1);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &better), 0);
	ck_assert_uint_eq(r.strikes, 1);
	/* within the threshold (3000 <= 1.1 x 2800), or no other cut: no strike */
	mbp_model_plan close = two_stages(3, 2800, 2800);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &close), 0);
	ck_assert_uint_eq(r.strikes, 0);
	mbp_model_plan same_cut = two_stages(2, 500, 500);
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(mbp_model_rebalance_look(&r, &now, &same_cut), 0);
	/* zero options are the defaults: threshold 0.10, patience 2 */
	mbp_model_rebalance_rule d = {0};
	ck_assert_int_eq(mbp_model_rebalance_look(&d, &now, &better), 0);
	ck_assert_int_eq(mbp_model_rebalance_look(&d, &now, &better), 1);
	ck_assert_int_eq(mbp_model_rebalance_look(&d, &now, &close), 0);
	ck_assert_int_eq(mbp_model_rebalance_look(&d, &now, &close), 0);
	char why[200];
	ck_assert_int_gt(mbp_model_rebalance_reason(&d, &now, &better, 2000, why, sizeof why), 0);
	ck_assert_str_eq(why, "stage 1 (layers 2-3) 3.0 us > 1.10 x 2.0 us of a plan cutting before layer 3 "
			      "(planned 2.0 us)");
	/* a plan made without costs predicted nothing: no "(planned ...)" */
	ck_assert_int_gt(mbp_model_rebalance_reason(&d, &now, &better, 0, why, sizeof why), 0);
	ck_assert_str_eq(why, "stage 1 (layers 2-3) 3.0 us > 1.10 x 2.0 us of a plan cutting before layer 3");
}
END_TEST

START_TEST(the_look_rule_refuses_bad_arguments)
{
	mbp_model_rebalance_rule r = {0};
	mbp_model_plan a = two_stages(2, 1, 1), b = two_stages(1, 1, 1);
	ck_assert_int_eq(mbp_model_rebalance_look(NULL, &a, &b), -EINVAL);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, NULL, &b), -EINVAL);
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &a, NULL), -EINVAL);
	b.layers = 5;
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &a, &b), -EINVAL);
	ck_assert_int_eq(mbp_model_rebalance_reason(&r, &a, &b, 0, NULL, 0), -EINVAL);
	b.layers = 4;
	r.threshold = -1;
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &a, &b), -EINVAL);
	r.threshold = NAN;
	ck_assert_int_eq(mbp_model_rebalance_look(&r, &a, &b), -EINVAL);
}
END_TEST

/* Rebalancing a replicated plan: layers 6 and 7 get 3 times dearer at micro-batch 100, and the stages
 * move once to the exact split for the replicas they have, stage by stage. _i 0: stage 1 on 2 replicas,
 * from cutting at 3 (max(3, 5 / 2)) to cutting at 4 (max(4, 8 / 2) against 9 / 2 measured); _i 1: stage 0
 * on 2 replicas (admitting in turn), from 6 (max(6 / 2, 2)) to 7, the dear layer 6 moving onto the
 * replicated stage (max(9 / 2, 3) against 6). Stamped micro-batches come back in the order submitted,
 * each computed by one plan, mbp_model_forward's bits, accepted = completed; the replicas stay. */
START_TEST(rebalance_moves_a_replicated_plan_in_order_bit_for_bit)
{
	static const unsigned reps[2][2] = {{1, 2}, {2, 1}}, cut[2][2] = {{3, 4}, {6, 7}};
	const unsigned from = cut[_i][0], to = cut[_i][1];
	mbp_model *m = rb_model();
	float *x[RB_IN], ref[RB_IN][2 * 8];
	rb_inputs(m, x, ref, 80);
	const uint64_t n = 400;
	struct rb_costs c = {.change = 100, .heavy = 6, .mbs = n, .stage_of = calloc(n * RB_LAYERS, 1)};
	struct rb_results r = {
	    .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .ra = ref, .rb = ref};
	const unsigned first[3] = {0, from, RB_LAYERS};
	mbp_model_stages *st;
	mbp_pipeline *p = rb_pipeline_replicas(m, &st, &c, 2, first, reps[_i], rb_on_result, &r);
	mbp_stage_desc d;
	for (unsigned s = 0; s < 2; s++) {
		ck_assert_int_eq(mbp_model_stage_desc(st, s, &d), 0);
		ck_assert_uint_eq(d.replicas, reps[_i][s]);
	}
	rb_stream(p, x, n, &r);
	mbp_pipeline_stats ps;
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, NULL, 0), 2);
	ck_assert_uint_eq(ps.mbs_accepted, n);
	ck_assert_uint_eq(ps.mbs_completed, n);
	ck_assert_uint_eq(ps.threads, 3);
	mbp_model_rebalance_stats rs;
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	ck_assert_uint_eq(rs.moves, 1);
	ck_assert_uint_eq(atomic_load(&c.moves_seen), 1);
	ck_assert_uint_eq(rs.current.first[1], to);
	ck_assert_uint_eq(rs.current.replicas[0], reps[_i][0]);
	ck_assert_uint_eq(rs.current.replicas[1], reps[_i][1]);
	ck_assert_uint_eq(rs.current.threads, 3);
	ck_assert_uint_eq(rs.replica_moves, 0); /* rebalance.replicas 0: the counts stay */
	ck_assert_uint_eq(rs.threads[0], reps[_i][0]);
	ck_assert_uint_eq(rs.threads[1], reps[_i][1]);
	for (unsigned s = 0; s < 2; s++)
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, s), (int)reps[_i][s]);
	ck_assert_uint_eq(c.last.from.first[1], from);
	ck_assert_uint_eq(c.last.to.first[1], to);
	ck_assert_uint_eq(c.last.to.replicas[reps[_i][0] > 1 ? 0 : 1], 2);
	/* the slowest stage per micro-batch: its cost over its replicas (a hop is 1 us) */
	ck_assert_double_eq_tol(c.last.measured_slowest_ns, _i ? 6e6 + 1e3 : (9e6 + 1e3) / 2, 1);
	ck_assert_double_eq_tol(c.last.to.slowest_ns, _i ? 4.5e6 : (8e6 + 1e3) / 2, 1);
	ck_assert_ptr_nonnull(strstr(c.last.reason, _i ? "stage 1 (layers 6-7) 6001.0 us"
						       : "stage 1 (layers 3-7) x2 4500.5 us"));
	ck_assert_uint_ge(c.last.admitted, c.change);
	/* one plan per micro-batch, the old one for exactly those admitted before the move (a replicated
	 * stage 0 may admit them a little out of order), the new one in order after it with one replica */
	uint64_t old = 0;
	unsigned prev = from;
	for (uint64_t k = 0; k < n; k++) {
		unsigned got = rb_cut(&c, k);
		ck_assert_msg(got == from || got == to, "micro-batch %" PRIu64 " cut at %u", k, got);
		old += got == from;
		if (reps[_i][0] == 1)
			ck_assert_uint_ge(got, prev);
		prev = got;
	}
	ck_assert_uint_eq(old, c.last.admitted);
	rb_free(p, st, m, x, c.stage_of);
}
END_TEST

/* The moves reported to on_move, the first 8 of them. */
struct rb_moves {
	_Atomic unsigned n;
	mbp_model_move mv[8];
};

static void rb_moves_record(void *arg, const mbp_model_move *mv)
{
	struct rb_moves *c = arg;
	unsigned k = atomic_load(&c->n);
	if (k < 8)
		c->mv[k] = *mv; /* stage 0's thread; read after the drain */
	atomic_store(&c->n, k + 1);
}

/* Costs for a move of the active replicas: 1 ms a layer, and layer 7 at 21 ms (75 % of the work) for
 * the micro-batches [on, off). A hot layer 7 also sleeps 100 us, so that one replica is still busy when
 * the next micro-batch comes and the other takes it. Each layer's stage is recorded per micro-batch, and
 * the replica that ran layer 7. */
struct rb_hot {
	uint64_t on, off;
	size_t mbs;
	uint8_t *stage_of;   /* [seq][layer]: 1 + the stage that ran it */
	uint8_t *replica_of; /* [seq]: 1 + the replica that ran layer 7 */
	struct rb_moves moves;
};

static double rb_hot_cost(void *arg, unsigned stage, unsigned layer, const mbp_mb *mb, double measured_ns)
{
	struct rb_hot *c = arg;
	(void)measured_ns;
	ck_assert_uint_lt(mb->seq, c->mbs);
	c->stage_of[mb->seq * RB_LAYERS + layer] = (uint8_t)(stage + 1);
	bool hot = layer == RB_LAYERS - 1 && mb->seq >= c->on && mb->seq < c->off;
	if (layer == RB_LAYERS - 1)
		c->replica_of[mb->seq] = (uint8_t)(mbp_stage_replica() + 1);
	if (hot)
		usleep(100);
	return hot ? 21e6 : 1e6;
}

/* Two stages made with 2 threads each (rebalance.replicas 2), 1 active each at start, on 2 CPUs
 * (rebalance.cpus): when layer 7 becomes 75 % of the work, a move cuts before it and turns on stage 1's
 * second replica (max(7, 21 / 2) against 21 on one; 4 threads could not beat the 14 ms that 2 CPUs
 * allow, so stage 0 keeps one); when it is cheap again, a move cuts at 4 and turns the replica off (a
 * third thread would only share the CPUs). Stamped micro-batches come back in the order submitted, each
 * computed by one plan, mbp_model_forward's bits, accepted = completed; stage 0's second replica, never
 * active, computed nothing; stage 1's computed some, and after the replica went off at most the one it
 * had claimed; the statistics count both moves as replica moves and say which replicas are active. */
START_TEST(rebalance_turns_a_replica_on_and_off_in_order_bit_for_bit)
{
	mbp_model *m = rb_model();
	float *x[RB_IN], ref[RB_IN][2 * 8];
	rb_inputs(m, x, ref, 90);
	const uint64_t n = 640;
	struct rb_hot c = {.on = 150,
			   .off = 400,
			   .mbs = n,
			   .stage_of = calloc(n * RB_LAYERS, 1),
			   .replica_of = calloc(n, 1)};
	struct rb_results r = {
	    .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .ra = ref, .rb = ref};
	double ones[RB_LAYERS] = {1, 1, 1, 1, 1, 1, 1, 1};
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(ones, NULL, RB_LAYERS, 2, &plan), 0);
	mbp_model_stages_opts so = {.rebalance = {.on = true,
						  .window = 16,
						  .on_move = rb_moves_record,
						  .on_move_arg = &c.moves,
						  .cost = rb_hot_cost,
						  .cost_arg = &c,
						  .replicas = 2,
						  .cpus = 2}};
	mbp_model_stages *st;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 2, &so), 0);
	mbp_stage_desc d;
	for (unsigned s = 0; s < 2; s++) {
		ck_assert_int_eq(mbp_model_stage_desc(st, s, &d), 0);
		ck_assert_uint_eq(d.replicas, 2); /* the threads made */
	}
	mbp_pipeline *p = stages_pipeline(m, st, 2, rb_on_result, &r);
	mbp_model_rebalance_stats rs;
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	ck_assert_uint_eq(rs.current.replicas[0], 1);
	ck_assert_uint_eq(rs.current.replicas[1], 1);
	ck_assert_uint_eq(rs.threads[0], 2);
	ck_assert_uint_eq(rs.threads[1], 2);
	for (unsigned s = 0; s < 2; s++)
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, s), 1);
	rb_stream(p, x, n, &r);
	mbp_pipeline_stats ps;
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, NULL, 0), 2);
	ck_assert_uint_eq(ps.mbs_accepted, n);
	ck_assert_uint_eq(ps.mbs_completed + ps.mbs_failed, n);
	ck_assert_uint_eq(ps.mbs_completed, n);
	ck_assert_uint_eq(ps.threads, 4);
	/* the moves: on at the heavy layer, off again */
	ck_assert_uint_eq(atomic_load(&c.moves.n), 2);
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	ck_assert_uint_eq(rs.moves, 2);
	ck_assert_uint_eq(rs.replica_moves, 2);
	const mbp_model_move *on = &c.moves.mv[0], *off = &c.moves.mv[1];
	ck_assert_uint_eq(on->from.first[1], 4);
	ck_assert_uint_eq(on->to.first[1], 7);
	ck_assert_uint_eq(on->to.replicas[0], 1);
	ck_assert_uint_eq(on->to.replicas[1], 2);
	ck_assert_double_eq_tol(on->to.slowest_ns, 28e6 / 2, 1); /* 3 threads: what 2 CPUs allow */
	ck_assert_ptr_nonnull(strstr(on->reason, "cutting before layer 7 with replicas 1,2"));
	ck_assert_uint_ge(on->admitted, c.on);
	ck_assert_uint_lt(on->admitted, c.off);
	ck_assert_uint_eq(off->to.first[1], 4);
	ck_assert_uint_eq(off->to.replicas[0], 1);
	ck_assert_uint_eq(off->to.replicas[1], 1);
	ck_assert_ptr_nonnull(strstr(off->reason, "with replicas 1,1"));
	ck_assert_uint_ge(off->admitted, c.off);
	ck_assert_uint_eq(rs.current.first[1], 4);
	ck_assert_uint_eq(rs.current.replicas[1], 1);
	for (unsigned s = 0; s < 2; s++)
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, s), 1);
	/* one plan per micro-batch: cut at 4 before the first move and after the second, 7 between */
	for (uint64_t k = 0; k < n; k++) {
		unsigned want = k < on->admitted || k >= off->admitted ? 4 : 7;
		ck_assert_msg(rb_cut_of(c.stage_of, k) == want, "micro-batch %" PRIu64 " cut at %u, not %u",
			      k, rb_cut_of(c.stage_of, k), want);
	}
	/* who computed: stage 1's second replica some, and after it went off at most its one claim */
	uint64_t second = 0, late = 0;
	for (uint64_t k = 0; k < n; k++) {
		ck_assert_uint_ge(c.replica_of[k], 1);
		second += c.replica_of[k] == 2;
		late += c.replica_of[k] == 2 && k >= off->admitted;
	}
	ck_assert_uint_gt(second, 0);
	ck_assert_uint_le(late, 1);
	mbp_stage_stats rep[2];
	ck_assert_int_eq(mbp_pipeline_replica_stats(p, 0, rep, 2), 2);
	ck_assert_uint_eq(rep[0].mbs, n);
	ck_assert_uint_eq(rep[1].mbs, 0); /* never active: parked from start, claimed nothing */
	ck_assert_uint_eq(rep[1].active, 0);
	ck_assert_int_eq(mbp_pipeline_replica_stats(p, 1, rep, 2), 2);
	ck_assert_uint_eq(rep[1].mbs, second);
	ck_assert_uint_eq(rep[0].mbs + rep[1].mbs, n);
	ck_assert_uint_eq(rep[1].active, 0);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	for (int i = 0; i < RB_IN; i++)
		free(x[i]);
	free(c.stage_of);
	free(c.replica_of);
	mbp_model_destroy(m);
}
END_TEST

/* Costs for looks while stage 1 lags: 1 ms a layer, and layer 7 at 9 ms for the micro-batches in
 * [off + 128 (2 j + 1), off + 128 (2 j + 2)), j = 0, 1, 2. Layer 7 is on stage 1 under every plan of the
 * test, and it also sleeps 30 us there, so that stage 1 falls behind and stage 0 runs ahead of it by
 * the micro-batches in flight (the ring between them full): several windows of 8. Each layer's stage is
 * recorded per micro-batch, and the moves. */
#define RB_LAG_BLOCK 128
struct rb_lag {
	uint64_t off;
	size_t mbs;
	uint8_t *stage_of; /* [seq][layer]: 1 + the stage that ran it */
	struct rb_moves moves;
};

static bool rb_lag_heavy(const struct rb_lag *c, uint64_t seq)
{
	return seq >= c->off && (seq - c->off) / RB_LAG_BLOCK % 2 == 1;
}

static double rb_lag_cost(void *arg, unsigned stage, unsigned layer, const mbp_mb *mb, double measured_ns)
{
	struct rb_lag *c = arg;
	(void)measured_ns;
	ck_assert_uint_lt(mb->seq, c->mbs);
	c->stage_of[mb->seq * RB_LAYERS + layer] = (uint8_t)(stage + 1);
	if (layer != RB_LAYERS - 1)
		return 1e6;
	if (stage == 1)
		usleep(30);
	return rb_lag_heavy(c, mb->seq) ? 9e6 : 1e6;
}

/* A look sees its own window's micro-batches only, however far stage 1 lags: layer 7 goes from 1 to 9 ms
 * and back, three times, and every look whose window straddles no change sees one side of it. A window
 * of layer 7 at a cost in between (at 5 ms, half and half) would draw a plan cutting at 6 (6 | 1 + 5
 * against 4 | 3 + 5, or 7 | 5), never the plan for either side: 4 | 3 + 9 moves to 7 | 9, and 7 | 1 back
 * to 4 | 4. _i 0: patience 1, each change at the start of a window (no window straddles one), so a
 * look of mixed costs would move at once to a cut at 6; _i 1: patience 2, each change in the middle of
 * a window, which may draw that plan once but not twice in a row. Either way: exactly six moves, 4 -> 7
 * and 7 -> 4 in turn, each after its change (and its patience) and before the next, each from the plan
 * in use as measured by one side of the change only (exact costs: 4 | 12 ms, or 7 | 1 ms, and a hop),
 * and every micro-batch computed by the plan of its window, in order, mbp_model_forward's bits. */
START_TEST(a_look_counts_only_its_windows_micro_batches_while_stage_1_lags)
{
	const unsigned patience = _i ? 2 : 1, window = 8;
	mbp_model *m = rb_model();
	float *x[RB_IN], ref[RB_IN][2 * 8];
	rb_inputs(m, x, ref, 110);
	const uint64_t n = 7 * RB_LAG_BLOCK;
	struct rb_lag c = {.off = _i ? window / 2 : 0, .mbs = n, .stage_of = calloc(n * RB_LAYERS, 1)};
	struct rb_results r = {
	    .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .ra = ref, .rb = ref};
	double ones[RB_LAYERS] = {1, 1, 1, 1, 1, 1, 1, 1};
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(ones, NULL, RB_LAYERS, 2, &plan), 0);
	ck_assert_uint_eq(plan.first[1], 4);
	mbp_model_stages_opts so = {.rebalance = {.on = true,
						  .window = window,
						  .patience = patience,
						  .on_move = rb_moves_record,
						  .on_move_arg = &c.moves,
						  .cost = rb_lag_cost,
						  .cost_arg = &c}};
	mbp_model_stages *st;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 2, &so), 0);
	mbp_pipeline *p = stages_pipeline(m, st, 2, rb_on_result, &r);
	rb_stream(p, x, n, &r);
	mbp_pipeline_stats ps;
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, NULL, 0), 2);
	ck_assert_uint_eq(ps.mbs_accepted, n);
	ck_assert_uint_eq(ps.mbs_completed, n);
	mbp_model_rebalance_stats rs;
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	const unsigned moves = atomic_load(&c.moves.n);
	ck_assert_uint_eq(moves, 6); /* no move to a plan of costs in between */
	ck_assert_uint_eq(rs.moves, 6);
	ck_assert_uint_eq(rs.current.first[1], 4);
	for (unsigned k = 0; k < 6; k++) {
		const mbp_model_move *mv = &c.moves.mv[k];
		const bool on = k % 2 == 0; /* layer 7 got dear */
		const uint64_t change = c.off + RB_LAG_BLOCK * (k + 1);
		ck_assert_msg(mv->from.first[1] == (on ? 4u : 7u) && mv->to.first[1] == (on ? 7u : 4u),
			      "move %u: from a cut at %u to %u, after the change at %" PRIu64 " (%s)", k,
			      mv->from.first[1], mv->to.first[1], change, mv->reason);
		/* the window holding the change, if it straddles it, then `patience` windows after it,
		 * all done before the look that moves; and done before the next change */
		ck_assert_uint_eq(mv->admitted % window, 0);
		ck_assert_uint_ge(mv->admitted, ((change + window - 1) / window + patience) * window);
		ck_assert_uint_lt(mv->admitted, change + RB_LAG_BLOCK);
		/* measured from one side of the change only: every cost exact */
		ck_assert_double_eq_tol(mv->from.stage_ns[0], on ? 4e6 : 7e6, 1e-3);
		ck_assert_double_eq_tol(mv->from.stage_ns[1], (on ? 12e6 : 1e6) + 1e3, 1e-3);
		ck_assert_double_eq_tol(mv->to.stage_ns[0], on ? 7e6 : 4e6, 1e-3);
		ck_assert_double_eq_tol(mv->to.stage_ns[1], (on ? 9e6 : 4e6) + 1e3, 1e-3);
	}
	/* each micro-batch under the plan of its window: admitted before the first move at 4, ... */
	unsigned k = 0;
	for (uint64_t i = 0; i < n; i++) {
		while (k < 6 && i >= c.moves.mv[k].admitted)
			k++;
		unsigned want = k % 2 ? 7 : 4;
		ck_assert_msg(rb_cut_of(c.stage_of, i) == want, "micro-batch %" PRIu64 " cut at %u, not %u",
			      i, rb_cut_of(c.stage_of, i), want);
	}
	rb_free(p, st, m, x, c.stage_of);
}
END_TEST

static double rb_unit_cost(void *arg, unsigned stage, unsigned layer, const mbp_mb *mb, double measured_ns)
{
	(void)arg, (void)stage, (void)layer, (void)mb, (void)measured_ns;
	return 1e6;
}

/* Stage functions called on this thread, outside a pipeline (as pipebench's baseline calls them), with
 * windows of 1 and the done hook held back: no window is done, so none is looked at, and past 64 full
 * windows the open one takes every micro-batch that follows (the windows stop there); once the done
 * hook has run for each, the next admission looks at all 65 (the last of 36 micro-batches as one), and
 * every micro-batch was computed by its plan, mbp_model_forward's bits, each weights version dropped. */
START_TEST(windows_not_done_stop_at_64_and_are_looked_at_once_done)
{
	mbp_model *m = rb_model();
	double ones[RB_LAYERS] = {1, 1, 1, 1, 1, 1, 1, 1};
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(ones, NULL, RB_LAYERS, 2, &plan), 0);
	mbp_model_stages_opts so = {.rebalance = {.on = true, .window = 1, .cost = rb_unit_cost}};
	mbp_model_stages *st;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 2, &so), 0);
	mbp_stage_desc d[2];
	for (unsigned s = 0; s < 2; s++) {
		ck_assert_int_eq(mbp_model_stage_desc(st, s, &d[s]), 0);
		ck_assert_int_eq(d[s].init(d[s].ctx, s), 0);
	}
	enum { N = 100 };
	float *x = random_rows(2 * 12, 120), ref[2 * 8], hop[2 * 64], y[2 * 8];
	ck_assert_int_eq(mbp_model_forward(m, x, ref, 2, 2), 0);
	mbp_mb *out = calloc(N + 1, sizeof(*out));
	mbp_model_rebalance_stats rs;
	for (unsigned k = 0; k <= N; k++) {
		if (k == N) /* now every one leaves */
			for (unsigned i = 0; i < N; i++)
				d[0].done(d[0].ctx, &out[i]);
		mbp_mb in = {.data = x, .capacity = sizeof(float) * 2 * 12, .rows = 2, .row_bytes = 12 * 4};
		mbp_mb mid = {.data = hop, .capacity = sizeof(hop), .rows = 2, .row_bytes = 64 * 4};
		ck_assert_int_eq(d[0].fn(d[0].ctx, &in, &mid), 0);
		out[k] = mid;
		out[k].data = y;
		out[k].capacity = sizeof(y);
		out[k].row_bytes = 8 * 4;
		ck_assert_int_eq(d[1].fn(d[1].ctx, &mid, &out[k]), 0);
		ck_assert(!memcmp(y, ref, sizeof(y)));
		ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
		ck_assert_uint_eq(rs.windows, k < N ? 0 : 65);
	}
	ck_assert_uint_eq(rs.moves, 0);
	d[0].done(d[0].ctx, &out[N]);
	ck_assert_uint_eq(mbp_model_versions_alive(m), 1);
	for (unsigned s = 0; s < 2; s++)
		d[s].fini(d[s].ctx);
	mbp_model_stages_destroy(st);
	mbp_model_destroy(m);
	free(out);
	free(x);
}
END_TEST

/* A pipeline of rebalancing stages, each with threads to spare, added one by one from their descriptors:
 * mbp_model_stages_attach makes the plan's replicas the active ones, as mbp_model_stages_add does, and
 * refuses a pipeline whose stages are not these (fewer, more, other replicas), a started one and NULL;
 * stages without rebalancing accept any pipeline and change nothing. */
START_TEST(attach_activates_the_plans_replicas_and_refuses_a_pipeline_of_other_stages)
{
	mbp_model *m = rb_model();
	double ones[RB_LAYERS] = {1, 1, 1, 1, 1, 1, 1, 1};
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(ones, NULL, RB_LAYERS, 2, &plan), 0);
	mbp_model_stages *st = NULL;
	mbp_model_stages_opts so = {.rebalance = {.on = true, .replicas = 2}};
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), 0);
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = mbp_model_in_width(m) * sizeof(float);
	o.max_mb_rows = 4;
	o.pinning = MBP_PIN_NONE;
	/* kind 0: both stages as described; 1: the first only; 2: three stages; 3: stage 1 on 1 replica */
	for (int kind = 0; kind < 4; kind++) {
		mbp_pipeline *p;
		ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
		for (unsigned s = 0; s < (kind == 1 ? 1u : kind == 2 ? 3u : 2u); s++) {
			mbp_stage_desc d;
			ck_assert_int_eq(mbp_model_stage_desc(st, s < 2 ? s : 1, &d), 0);
			ck_assert_uint_eq(d.replicas, 2);
			if (kind == 3 && s == 1)
				d.replicas = 1;
			ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
		}
		if (kind) {
			ck_assert_int_eq(mbp_model_stages_attach(st, p), -ERANGE);
			ck_assert_int_eq(mbp_pipeline_replicas_active(p, 0), 2); /* untouched */
			mbp_pipeline_destroy(p);
			continue;
		}
		ck_assert_int_eq(mbp_model_stages_attach(NULL, p), -EINVAL);
		ck_assert_int_eq(mbp_model_stages_attach(st, NULL), -EINVAL);
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, 0), 2); /* every thread, until attached */
		ck_assert_int_eq(mbp_model_stages_attach(st, p), 0);
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, 0), 1);
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, 1), 1);
		mbp_model_rebalance_stats rs;
		ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
		ck_assert_uint_eq(rs.current.replicas[0], 1);
		ck_assert_uint_eq(rs.current.replicas[1], 1);
		ck_assert_int_eq(mbp_pipeline_start(p), 0);
		ck_assert_int_eq(mbp_model_stages_attach(st, p), -EBUSY);
		float *x = random_rows(8 * mbp_model_in_width(m), 7);
		float *y = malloc(8 * mbp_model_out_width(m) * sizeof(float));
		float *want = malloc(8 * mbp_model_out_width(m) * sizeof(float));
		mbp_job job;
		mbp_job_init(&job, x, y, 8, 4);
		ck_assert_int_eq(mbp_job_submit(p, &job, -1), 0);
		ck_assert_int_eq(mbp_job_wait(&job, -1), 0);
		ck_assert_int_eq(job.status, 0);
		ck_assert_int_eq(mbp_model_forward(m, x, want, 8, 4), 0);
		ck_assert_mem_eq(y, want, 8 * mbp_model_out_width(m) * sizeof(float));
		mbp_pipeline_destroy(p);
		free(x);
		free(y);
		free(want);
	}
	mbp_model_stages_destroy(st);
	/* no rebalancing: nothing to tell, any pipeline taken */
	ck_assert_int_eq(mbp_model_stages_new(&st, m, &plan, 4), 0);
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	ck_assert_int_eq(mbp_model_stages_attach(st, p), 0);
	mbp_pipeline_destroy(p);
	mbp_model_stages_destroy(st);
	mbp_model_destroy(m);
}
END_TEST

START_TEST(rebalance_options_are_checked_a_replicated_plan_taken_and_stats_say_off_without_it)
{
	mbp_model *m = rb_model();
	double ones[RB_LAYERS] = {1, 1, 1, 1, 1, 1, 1, 1};
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(ones, NULL, RB_LAYERS, 2, &plan), 0);
	mbp_model_stages *st = NULL;
	mbp_stage_desc d;
	mbp_model_stages_opts so = {.rebalance = {.on = true, .threshold = -0.1}};
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), -EINVAL);
	so.rebalance.threshold = NAN;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), -EINVAL);
	ck_assert_ptr_null(st);
	so.rebalance.threshold = 0.1; /* replicated: taken, the replicas as planned (a move keeps them) */
	plan.replicas[1] = 2;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), 0);
	ck_assert_int_eq(mbp_model_stage_desc(st, 1, &d), 0);
	ck_assert_uint_eq(d.replicas, 2);
	mbp_model_stages_destroy(st);
	st = NULL;
	/* threads to spare: each stage made with rebalance.replicas, or its plan's where more; their sum
	 * is bounded */
	so.rebalance.replicas = 3;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), 0);
	for (unsigned s = 0; s < 2; s++) {
		ck_assert_int_eq(mbp_model_stage_desc(st, s, &d), 0);
		ck_assert_uint_eq(d.replicas, 3);
	}
	mbp_model_stages_destroy(st);
	st = NULL;
	so.rebalance.replicas = MBP_MAX_STAGES / 2 + 1;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), -E2BIG);
	ck_assert_ptr_null(st);
	/* a count whose threads' sum wraps around (2 x 2^31 is 0 in 32 bits) is as much too many */
	so.rebalance.replicas = 1u << 31;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), -E2BIG);
	ck_assert_ptr_null(st);
	so.rebalance.replicas = 5;
	so.rebalance.on = false; /* off: replicas is not looked at */
	so.rebalance.cpus = 3;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), 0);
	ck_assert_int_eq(mbp_model_stage_desc(st, 1, &d), 0);
	ck_assert_uint_eq(d.replicas, 2);
	mbp_model_stages_destroy(st);
	st = NULL;
	so.rebalance.on = true;
	so.rebalance.cpus = 0;
	so.rebalance.replicas = 0;
	plan.replicas[1] = 1;
	mbp_model_stages_opts zero = {0}; /* off: the stages of mbp_model_stages_new */
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &zero), 0);
	mbp_model_rebalance_stats rs;
	memset(&rs, 0xff, sizeof(rs));
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, &rs), 0);
	ck_assert(!rs.on);
	ck_assert_uint_eq(rs.moves, 0);
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(st, NULL), -EINVAL);
	ck_assert_int_eq(mbp_model_stages_rebalance_stats(NULL, &rs), -EINVAL);
	ck_assert_int_eq(mbp_model_stage_desc(st, 0, &d), 0);
	ck_assert_uint_eq(d.out_row_bytes, 16 * 4); /* layer 3's output */
	mbp_model_stages_destroy(st);
	so.rebalance.threshold = 0;
	ck_assert_int_eq(mbp_model_stages_new_opts(&st, m, &plan, 4, &so), 0);
	ck_assert_int_eq(mbp_model_stage_desc(st, 0, &d), 0);
	ck_assert_uint_eq(d.out_row_bytes, 64 * 4); /* the widest any plan can hand over */
	ck_assert_int_eq(mbp_model_stage_desc(st, 1, &d), 0);
	ck_assert_uint_eq(d.out_row_bytes, 8 * 4); /* the model's output */
	mbp_model_stages_destroy(st);
	mbp_model_destroy(m);
}
END_TEST

/* ---- files ---- */

START_TEST(every_save_refuses_a_target_that_is_not_a_regular_file_and_leaves_it_as_it_was)
{
	struct nodes n;
	nodes_make(&n, dir);
	unsigned entries = folder_entries(dir);
	const char *t[4];
	unsigned k = nodes_list(&n, t);
	static const char *const kinds[] = {"a FIFO", "a symbolic link", "a directory", "a character device"};
	mbp_model_spec sp = {.layers = 2, .in = 4, .hidden = 8, .out = 2, .seed = 1};
	mbp_mlp *net;
	ck_assert_int_eq(mbp_mlp_new_random(&net, &sp, NULL), 0);
	for (unsigned i = 0; i < k; i++) {
		char why[256];
		ck_assert_int_eq(mbp_file_check(t[i], why, sizeof why), -EEXIST);
		ck_assert_msg(strstr(why, kinds[i]) && strstr(why, "not a regular file"), "%s: %s", t[i],
			      why);
		ck_assert_int_eq(mbp_model_write_random(t[i], &sp), -EEXIST);
		ck_assert_int_eq(mbp_mlp_save(net, t[i]), -EEXIST);
		ck_assert_int_eq(mbp_mlp_save_optim(net, t[i]), -EEXIST);
		mbp_file *f = (mbp_file *)(uintptr_t)1;
		ck_assert_int_eq(mbp_file_new(&f, t[i]), -EEXIST);
		ck_assert_ptr_null(f);
	}
	nodes_assert_intact(&n);
	ck_assert_uint_eq(folder_entries(dir), entries); /* no temporary file left */
	mbp_mlp_destroy(net);
	nodes_remove(&n);
}
END_TEST

START_TEST(a_path_whose_folder_cannot_take_a_file_fails_its_check_and_its_write_first)
{
	char why[256], p[160], under[200], absent[200];
	mbp_model_spec sp = {.layers = 2, .in = 4, .hidden = 8, .out = 2, .seed = 1};
	/* /proc takes no new file, whoever asks (root too) */
	int rc = mbp_file_check("/proc/x.safetensors", why, sizeof why);
	ck_assert_msg(rc < 0 && strstr(why, "cannot create a file in /proc"), "%d %s", rc, why);
	ck_assert_int_lt(mbp_model_write_random("/proc/x.safetensors", &sp), 0);
	snprintf(p, sizeof p, "%s/m0.safetensors", dir);
	ck_assert_int_eq(mbp_model_write_random(p, &sp), 0);
	snprintf(under, sizeof under, "%s/x.safetensors", p); /* under a regular file */
	ck_assert_int_eq(mbp_file_check(under, why, sizeof why), -ENOTDIR);
	snprintf(absent, sizeof absent, "%s/none/x.safetensors", dir);
	ck_assert_int_eq(mbp_file_check(absent, why, sizeof why), -ENOENT);
	ck_assert_msg(strstr(why, "none"), "%s", why);
	ck_assert_int_eq(mbp_model_write_random(absent, &sp), -ENOENT);
	ck_assert_int_eq(mbp_file_check(NULL, why, sizeof why), -EINVAL);
	ck_assert_int_eq(mbp_file_check("", NULL, 0), -EINVAL);
	/* a path that can be written: the check leaves nothing behind, the file there is untouched */
	unsigned entries = folder_entries(dir);
	struct stat before, after;
	ck_assert_int_eq(stat(p, &before), 0);
	ck_assert_int_eq(mbp_file_check(p, why, sizeof why), 0);
	ck_assert_str_eq(why, "");
	snprintf(absent, sizeof absent, "%s/new.safetensors", dir);
	ck_assert_int_eq(mbp_file_check(absent, NULL, 0), 0);
	ck_assert_int_eq(access(absent, F_OK), -1);
	ck_assert_uint_eq(folder_entries(dir), entries);
	ck_assert_int_eq(stat(p, &after), 0);
	ck_assert(before.st_ino == after.st_ino && before.st_mtim.tv_nsec == after.st_mtim.tv_nsec);
}
END_TEST

START_TEST(a_file_takes_its_path_whole_at_commit_and_not_over_a_node_made_meanwhile)
{
	char p[160];
	snprintf(p, sizeof p, "%s/m1.safetensors", dir);
	FILE *old = fopen(p, "w");
	ck_assert_ptr_nonnull(old);
	fputs("old\n", old);
	fclose(old);
	old = fopen(p, "r"); /* a reader of the old file keeps it whole */
	mbp_file *f;
	ck_assert_int_eq(mbp_file_new(&f, p), 0);
	fputs("new contents\n", mbp_file_stream(f));
	char buf[32] = {0};
	FILE *r = fopen(p, "r");
	ck_assert_ptr_nonnull(fgets(buf, sizeof buf, r)); /* before the commit the path is the old file */
	fclose(r);
	ck_assert_str_eq(buf, "old\n");
	ck_assert_uint_eq(folder_entries(dir), 2); /* the file and its temporary name */
	ck_assert_int_eq(mbp_file_commit(f), 0);
	r = fopen(p, "r");
	ck_assert_ptr_nonnull(fgets(buf, sizeof buf, r));
	fclose(r);
	ck_assert_str_eq(buf, "new contents\n");
	ck_assert_ptr_nonnull(fgets(buf, sizeof buf, old));
	ck_assert_str_eq(buf, "old\n");
	fclose(old);
	ck_assert_uint_eq(folder_entries(dir), 1);
	/* given up: nothing changes */
	ck_assert_int_eq(mbp_file_new(&f, p), 0);
	fputs("never\n", mbp_file_stream(f));
	mbp_file_destroy(f);
	mbp_file_destroy(NULL);
	r = fopen(p, "r");
	ck_assert_ptr_nonnull(fgets(buf, sizeof buf, r));
	fclose(r);
	ck_assert_str_eq(buf, "new contents\n");
	ck_assert_uint_eq(folder_entries(dir), 1);
	/* a FIFO made at the path after the start: the commit refuses it and leaves it */
	ck_assert_int_eq(unlink(p), 0);
	ck_assert_int_eq(mbp_file_new(&f, p), 0);
	fputs("late\n", mbp_file_stream(f));
	ck_assert_int_eq(mkfifo(p, 0600), 0);
	ck_assert_int_eq(mbp_file_commit(f), -EEXIST);
	struct stat sb;
	ck_assert(lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode));
	ck_assert_uint_eq(folder_entries(dir), 1);
	ck_assert_int_eq(mbp_file_commit(NULL), -EINVAL);
	ck_assert_ptr_null(mbp_file_stream(NULL));
	ck_assert_int_eq(unlink(p), 0);
	/* a write that fails is the commit's error with its own errno (here no file may grow past 4 KiB:
	 * EFBIG), and nothing is left; the limit is put back before any assertion (Check writes files) */
	struct rlimit was, small;
	ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
	small = (struct rlimit){.rlim_cur = 4096, .rlim_max = was.rlim_max};
	signal(SIGXFSZ, SIG_IGN);
	ck_assert_int_eq(mbp_file_new(&f, p), 0);
	mbp_model_spec sp = {.layers = 2, .in = 64, .hidden = 64, .out = 8, .seed = 1};
	char q[160];
	snprintf(q, sizeof q, "%s/m2.safetensors", dir);
	setrlimit(RLIMIT_FSIZE, &small);
	for (int i = 0; i < 65536; i++)
		fputc('x', mbp_file_stream(f));
	int rc = mbp_file_commit(f), rw = mbp_model_write_random(q, &sp);
	setrlimit(RLIMIT_FSIZE, &was);
	ck_assert_int_eq(rc, -EFBIG);
	ck_assert_int_eq(rw, -EFBIG);
	ck_assert_uint_eq(folder_entries(dir), 0);
}
END_TEST

static long max_rss_kib(void)
{
	struct rusage ru;
	ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
	return ru.ru_maxrss;
}

START_TEST(a_file_of_another_structure_is_refused_from_its_header_before_its_weights_are_read)
{
	/* 16 -> 16384 -> 16384 -> 4: a 1 GiB middle layer, all holes on disk */
	const uint32_t big[] = {16, 16384, 16384, 4};
	char p[160];
	snprintf(p, sizeof p, "%s/m2.safetensors", dir);
	if (!st_write_sparse(p, big, 3)) /* a file system without sparse files: skipped */
		return;
	int fd = open(p, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	const uint32_t want[] = {16, 64, 64, 4};
	mbp_model_load_opts o = {.layers = 3, .widths = want};
	mbp_model *m = NULL;
	mbp_model_error e;
	long rss0 = max_rss_kib();
	long long read0 = bytes_read();
	ck_assert_int_eq(mbp_model_load_fd(&m, fd, "big", &o, &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_MODEL_STRUCTURE);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(e.msg, "big: ") && strstr(e.msg, "3 layers of widths 16-16384-16384-4") &&
			  strstr(e.msg, "expected 3 layers of 16-64-64-4"),
		      "%s", e.msg);
	ck_assert_msg(max_rss_kib() - rss0 < 32 * 1024, "the peak RSS grew by %ld KiB", max_rss_kib() - rss0);
	if (read0 >= 0)
		ck_assert_msg(bytes_read() - read0 < 64 * 1024, "%lld bytes read", bytes_read() - read0);
	/* another layer count, too */
	const uint32_t two[] = {16, 16384, 4};
	o = (mbp_model_load_opts){.layers = 2, .widths = two};
	ck_assert_int_eq(mbp_model_load_fd(&m, fd, "big", &o, &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_MODEL_STRUCTURE);
	close(fd);
	unlink(p);
	/* the structure expected loads as before */
	mbp_model_spec sp = {.layers = 3, .widths = want, .act = MBP_ACT_RELU, .seed = 3};
	ck_assert_int_eq(mbp_model_write_random(p, &sp), 0);
	fd = open(p, O_RDONLY);
	o = (mbp_model_load_opts){.layers = 3, .widths = want};
	ck_assert_msg(mbp_model_load_fd(&m, fd, "small", &o, &e) == 0, "%s", e.msg);
	ck_assert(mbp_model_verified(m));
	mbp_model_destroy(m);
	close(fd);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("model");
	TCase *tc = tcase_create("compute");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, forward_matches_a_naive_double_reference);
	tcase_add_test(tc, forward_whole_batch_and_micro_batches_agree_within_1e_5);
	tcase_add_test(tc, packed_kernel_matches_a_double_reference_at_odd_shapes_packed_ahead_or_not);
	tcase_add_test(tc, packed_rows_give_the_same_bytes_in_micro_batches_of_1_3_8_64_rows);
	tcase_add_test(tc, a_swap_brings_its_own_packed_copy_and_the_old_one_goes_with_its_version);
	tcase_add_test(tc, kernel_set_refuses_what_is_not_a_kernel_and_default_is_the_best_for_the_cpu);
	tcase_add_test(tc, an_unknown_mbp_kernel_value_warns_and_runs_the_default);
	tcase_add_test(tc, relu_writes_the_scalar_bits_at_every_length_and_offset);
	tcase_add_test(tc, relu_grad_writes_the_scalar_bits_at_every_length_and_offset_in_place_or_not);
	tcase_add_test(tc, random_model_files_are_deterministic_per_seed);
	tcase_add_test(tc, a_loaded_model_does_not_see_its_file_change);
	tcase_add_test(tc, load_refuses_what_is_not_a_regular_file_and_checks_sizes_first);
	tcase_add_test(tc, partition_equals_brute_force_on_random_costs);
	tcase_add_test(tc, partition_for_fixed_replicas_equals_brute_force_and_is_the_partition_with_ones);
	tcase_add_test(
	    tc,
	    partition_for_capped_replicas_equals_brute_force_and_takes_threads_beyond_the_cpus_only_to_win);
	tcase_add_test(tc, partition_rejects_bad_input_and_balances_the_obvious_case);
	tcase_add_test(tc, plan_describe_writes_every_line_whole_and_returns_its_length);
	tcase_add_test(tc, profile_and_balance_cover_the_layers);
	tcase_add_test(tc, stages_by_hand_equal_the_reference_bit_for_bit);
	tcase_add_test(tc, layers_loaded_in_parts_compute_the_whole_model_bit_for_bit);
	tcase_add_test(tc, a_part_reads_only_its_own_layers_bytes_from_the_file);
	tcase_add_test(tc, swap_keeps_a_micro_batch_on_its_version_and_frees_the_old_after_it);
	tcase_add_test(tc, swap_rejects_another_structure_and_leaves_both_models_usable);
	tcase_add_test(tc, blas_info_names_the_kernel_and_warns_only_for_a_generic_one);
	suite_add_tcase(s, tc);
	TCase *tf = tcase_create("files");
	tcase_add_checked_fixture(tf, setup, teardown);
	tcase_add_test(tf, every_save_refuses_a_target_that_is_not_a_regular_file_and_leaves_it_as_it_was);
	tcase_add_test(tf, a_path_whose_folder_cannot_take_a_file_fails_its_check_and_its_write_first);
	tcase_add_test(tf, a_file_takes_its_path_whole_at_commit_and_not_over_a_node_made_meanwhile);
	tcase_add_test(tf,
		       a_file_of_another_structure_is_refused_from_its_header_before_its_weights_are_read);
	suite_add_tcase(s, tf);
	TCase *tp = tcase_create("pipeline");
	tcase_add_checked_fixture(tp, setup, teardown);
	tcase_set_timeout(tp, 60);
	tcase_add_test(tp, pipeline_output_equals_the_reference_bit_for_bit);
	tcase_add_test(tp, a_pinned_micro_batch_runs_with_its_version_after_a_swap);
	tcase_add_loop_test(tp, swap_under_load_gives_each_job_one_version_never_a_mix, 0, 2);
	suite_add_tcase(s, tp);
	TCase *tr = tcase_create("rebalance");
	tcase_add_checked_fixture(tr, setup, teardown);
	tcase_set_timeout(tr, 60);
	tcase_add_test(tr,
		       rebalance_options_are_checked_a_replicated_plan_taken_and_stats_say_off_without_it);
	tcase_add_loop_test(tr, rebalance_moves_a_replicated_plan_in_order_bit_for_bit, 0, 2);
	tcase_add_test(tr, attach_activates_the_plans_replicas_and_refuses_a_pipeline_of_other_stages);
	tcase_add_test(tr, rebalance_turns_a_replica_on_and_off_in_order_bit_for_bit);
	tcase_add_loop_test(tr, a_look_counts_only_its_windows_micro_batches_while_stage_1_lags, 0, 2);
	tcase_add_test(tr, windows_not_done_stop_at_64_and_are_looked_at_once_done);
	tcase_add_test(tr, the_look_rule_moves_for_other_replicas_at_the_same_cuts);
	tcase_add_test(tr, rebalance_moves_once_costs_change_and_the_output_stays_bit_for_bit);
	tcase_add_test(tr, rebalance_never_moves_while_costs_are_steady_or_within_the_threshold);
	tcase_add_test(tr, costs_that_draw_another_plan_at_each_look_never_move);
	tcase_add_test(tr, a_move_during_weight_swaps_keeps_order_loses_nothing_and_mixes_no_version_or_plan);
	tcase_add_test(tr, the_look_rule_moves_after_patience_looks_of_the_same_better_plan_and_only_then);
	tcase_add_test(tr, the_look_rule_refuses_bad_arguments);
	suite_add_tcase(s, tr);
	return s;
}

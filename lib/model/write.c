/*
 * mbp_model_write_random: a safetensors model file with seeded random weights, for demos, tests and
 * benchmarks (nothing comes from the network).
 *
 * The file is written as the reference writer does: the JSON header padded with spaces to a multiple of 8
 * bytes (so F32 data is aligned in a mapping), then each tensor's bytes in header order, little-endian,
 * with no gaps. It goes to a temporary name in the same directory and is renamed into place, so a reader
 * never sees half a file; it is created with mode 0666 under the umask, as files usually are.
 */
#include "config.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "model_internal.h"
#include "safetensors.h"

/* splitmix64: a tiny, well-mixed generator; same seed, same weights on every machine. */
static uint64_t next_u64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float uniform(uint64_t *s)
{
	return (float)((double)(next_u64(s) >> 40) / (double)(1u << 23) - 1.0);
}

enum { T_W, T_B, T_G, T_BETA };
static const char *const tnames[] = {"weight", "bias", "norm.weight", "norm.bias"};

struct wtensor {
	unsigned layer, kind;
	uint64_t nelem;
	uint32_t rows, cols; /* cols 0: 1-D */
};

static const char *dt_name(mbp_dtype d)
{
	return d == MBP_DTYPE_F16 ? "F16" : d == MBP_DTYPE_BF16 ? "BF16" : "F32";
}

static size_t dt_size(mbp_dtype d)
{
	return d == MBP_DTYPE_F32 ? 4 : 2;
}

/* Grow-as-needed string. */
struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (k < 0) {
			b->oom = true;
			return;
		}
		if (b->p && b->len + (size_t)k < b->cap) {
			b->len += (size_t)k;
			return;
		}
		size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

static const char *act_str(mbp_act a)
{
	return a == MBP_ACT_RELU ? "relu" : a == MBP_ACT_GELU ? "gelu" : "none";
}

/* Write n values of one tensor, drawn from the generator, converted to the file's dtype. */
static int write_values(FILE *f, uint64_t *seed, const struct wtensor *t, float scale, float offset,
			mbp_dtype dt)
{
	uint8_t buf[4096];
	size_t per = dt_size(dt), fill = 0;
	for (uint64_t e = 0; e < t->nelem; e++) {
		float v = offset + scale * uniform(seed);
		if (dt == MBP_DTYPE_F32) {
			uint32_t u;
			memcpy(&u, &v, 4);
			u = htole32(u);
			memcpy(buf + fill, &u, 4);
		} else {
			uint16_t h = htole16(dt == MBP_DTYPE_F16 ? mbp__f32_to_f16(v) : mbp__f32_to_bf16(v));
			memcpy(buf + fill, &h, 2);
		}
		fill += per;
		if (fill == sizeof(buf) || e + 1 == t->nelem) {
			if (fwrite(buf, 1, fill, f) != fill)
				return -EIO;
			fill = 0;
		}
	}
	return 0;
}

int mbp_model_write_random(const char *path, const mbp_model_spec *sp)
{
	if (!path || !sp || sp->layers < 1 || sp->layers > MBP_MODEL_MAX_LAYERS || sp->act > MBP_ACT_GELU ||
	    sp->dtype > MBP_DTYPE_BF16)
		return -EINVAL;
	unsigned L = sp->layers;
	uint32_t *w = malloc((L + 1) * sizeof(*w));
	struct wtensor *t = malloc(4 * (size_t)L * sizeof(*t));
	struct sbuf h = {0};
	char *tmp = NULL;
	FILE *f = NULL;
	int rc = 0;
	if (!w || !t) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i <= L; i++) {
		w[i] = sp->widths ? sp->widths[i] : i == 0 ? sp->in : i == L ? sp->out : sp->hidden;
		if (w[i] < 1 || w[i] > MBP_MODEL_MAX_WIDTH) {
			rc = -EINVAL;
			goto out;
		}
	}

	/* The tensor list, in data order: each layer's weight, bias, then its norm pair. */
	size_t nt = 0;
	for (unsigned i = 0; i < L; i++) {
		bool norm = sp->norm && i + 1 < L;
		for (unsigned k = 0; k < (norm ? 4u : 2u); k++) {
			struct wtensor *x = &t[nt++];
			x->layer = i;
			x->kind = k;
			x->rows = w[i + 1];
			x->cols = k == T_W ? w[i] : 0;
			x->nelem = (uint64_t)x->rows * (x->cols ? x->cols : 1);
		}
	}

	sb_printf(&h, "{\"__metadata__\":{\"format\":\"mbpipe-mlp\",\"activation\":\"%s\",",
		  act_str(sp->act));
	sb_printf(&h, "\"layers.%u.activation\":\"none\",\"layer_norm_eps\":\"1e-05\",\"seed\":\"%llu\"}",
		  L - 1, (unsigned long long)sp->seed);
	uint64_t off = 0;
	for (size_t k = 0; k < nt; k++) {
		uint64_t bytes = t[k].nelem * dt_size(sp->dtype);
		sb_printf(&h, ",\"layers.%u.%s\":{\"dtype\":\"%s\",\"shape\":[%u", t[k].layer,
			  tnames[t[k].kind], dt_name(sp->dtype), t[k].rows);
		if (t[k].cols)
			sb_printf(&h, ",%u", t[k].cols);
		sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
			  (unsigned long long)(off + bytes));
		off += bytes;
	}
	sb_printf(&h, "}");
	while (!h.oom && h.len % 8)
		sb_printf(&h, " ");
	if (h.oom) {
		rc = -ENOMEM;
		goto out;
	}

	size_t pl = strlen(path);
	tmp = malloc(pl + 48);
	if (!tmp) {
		rc = -ENOMEM;
		goto out;
	}
	/* A fresh name created with mode 0666 under the umask (0644 with the usual 022), as any file a
	 * program writes: mkstemp's 0600 would leave the model unreadable to the server's other users. */
	static _Atomic unsigned serial;
	int fd = -1;
	for (int tries = 0; fd < 0 && tries < 100; tries++) {
		snprintf(
		    tmp, pl + 48, "%s.tmp.%ld.%u", path, (long)getpid(),
		    atomic_fetch_add_explicit(&serial, 1, memory_order_relaxed)); /* a name, nothing else */
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	f = fdopen(fd, "wb");
	if (!f) {
		rc = -errno;
		close(fd);
		unlink(tmp);
		goto out;
	}
	uint64_t hlen = htole64((uint64_t)h.len);
	if (fwrite(&hlen, 8, 1, f) != 1 || fwrite(h.p, 1, h.len, f) != h.len)
		rc = -EIO;
	uint64_t seed = sp->seed;
	for (size_t k = 0; k < nt && !rc; k++) {
		const struct wtensor *x = &t[k];
		bool act = x->layer + 1 < L && sp->act != MBP_ACT_NONE;
		float scale = 0.1f, offset = 0.0f;
		if (x->kind == T_W)
			scale = sqrtf((act ? 6.0f : 3.0f) / (float)x->cols);
		else if (x->kind == T_G)
			offset = 1.0f;
		rc = write_values(f, &seed, x, scale, offset, sp->dtype);
	}
	if (fclose(f) != 0 && !rc)
		rc = errno ? -errno : -EIO;
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc)
		unlink(tmp);
out:
	free(tmp);
	free(h.p);
	free(t);
	free(w);
	return rc;
}

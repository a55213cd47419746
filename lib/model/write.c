/*
 * The safetensors writer: mbp_model_write_random (a model file with seeded random weights, for demos, tests
 * and benchmarks; nothing comes from the network), and for training the trained weights in the same layout
 * (mbp__model_write) and the optimizer state (lib/model/checkpoint.c), all through mbp__st_write.
 *
 * The file is written as the reference writer does: the JSON header padded with spaces to a multiple of 8
 * bytes (so F32 data is aligned in a mapping), then each tensor's bytes in header order, little-endian,
 * with no gaps. The metadata carries each tensor's digest (lib/model/digest.c says what it covers): the
 * header goes out first with "00000000" in their place, the CRC of each tensor is computed while its bytes
 * are written, and the header is written again over itself at the end, its length unchanged, so that the
 * values are generated or converted only once. The file is written by rename (mbp_file, lib/file.c): a
 * reader, or a checkpoint after a crash, never sees half a file, and a path that is not a regular file is
 * refused before any work.
 */
#include "config.h"

#include <endian.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "model_internal.h"
#include "safetensors.h"
#include "strbuf.h"

enum { T_W, T_B, T_G, T_BETA };
static const char *const tnames[] = {"weight", "bias", "norm.weight", "norm.bias"};

static size_t dt_size(mbp_dtype d)
{
	return d == MBP_DTYPE_F32 ? 4 : 2;
}

/* Append a JSON string; our keys and values are plain ASCII, but anything written into JSON is escaped. */
static void json_str(struct mbp__strbuf *b, const char *s)
{
	mbp__strbuf_printf(b, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			mbp__strbuf_printf(b, "\\%c", c);
		else if (c < 0x20)
			mbp__strbuf_printf(b, "\\u%04x", c);
		else
			mbp__strbuf_printf(b, "%c", c);
	}
	mbp__strbuf_printf(b, "\"");
}

/* Write one tensor's values, converted to the file's dtype: its data, or values drawn from the generator;
 * *crc receives the CRC-32 of the bytes written. */
static int write_values(FILE *f, uint64_t *seed, const struct mbp__st_out *t, mbp_dtype dt, uint32_t *crc)
{
	uint8_t buf[4096];
	size_t per = dt_size(dt), fill = 0;
	uint64_t nelem = (uint64_t)t->rows * (t->cols ? t->cols : 1);
	*crc = 0;
	for (uint64_t e = 0; e < nelem; e++) {
		float v = t->data ? t->data[e] : t->offset + t->scale * mbp__uniform(seed);
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
		if (fill == sizeof(buf) || e + 1 == nelem) {
			*crc = mbp__crc32(*crc, buf, fill);
			if (fwrite(buf, 1, fill, f) != fill)
				return -EIO;
			fill = 0;
		}
	}
	return 0;
}

int mbp__st_write(const char *path, const struct mbp__st_out *t, size_t nt, const char *const *meta,
		  size_t nmeta, mbp_dtype dt, uint64_t seed)
{
	struct mbp__strbuf h = MBP__STRBUF_GROW;
	size_t *at = calloc(nt ? nt : 1, sizeof(*at)); /* where each tensor's digest goes in the header */
	mbp_file *file = NULL;
	int rc = 0;
	if (!at) {
		rc = -ENOMEM;
		goto out;
	}

	mbp__strbuf_printf(&h, "{\"__metadata__\":{");
	for (size_t k = 0; k < nmeta; k++) {
		if (k)
			mbp__strbuf_printf(&h, ",");
		json_str(&h, meta[2 * k]);
		mbp__strbuf_printf(&h, ":");
		json_str(&h, meta[2 * k + 1]);
	}
	for (size_t k = 0; k < nt; k++) {
		char key[sizeof(t[k].name) + sizeof(MBP__ST_DIGEST_KEY)];
		snprintf(key, sizeof(key), "%s%s", t[k].name, MBP__ST_DIGEST_KEY);
		mbp__strbuf_printf(&h, "%s", nmeta || k ? "," : "");
		json_str(&h, key);
		mbp__strbuf_printf(&h, ":\"");
		at[k] = h.len;
		mbp__strbuf_printf(&h, "00000000\"");
	}
	mbp__strbuf_printf(&h, "}");
	uint64_t off = 0;
	for (size_t k = 0; k < nt; k++) {
		uint64_t bytes = (uint64_t)t[k].rows * (t[k].cols ? t[k].cols : 1) * dt_size(dt);
		mbp__strbuf_printf(&h, ",");
		json_str(&h, t[k].name);
		mbp__strbuf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[%u", mbp__dtype_name(dt), t[k].rows);
		if (t[k].cols)
			mbp__strbuf_printf(&h, ",%u", t[k].cols);
		mbp__strbuf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
				   (unsigned long long)(off + bytes));
		off += bytes;
	}
	mbp__strbuf_printf(&h, "}");
	while (!h.oom && h.len % 8)
		mbp__strbuf_printf(&h, " ");
	if (h.oom) {
		rc = -ENOMEM;
		goto out;
	}

	rc = mbp_file_new(&file, path);
	if (rc)
		goto out;
	FILE *f = mbp_file_stream(file);
	uint64_t hlen = htole64((uint64_t)h.len);
	if (fwrite(&hlen, 8, 1, f) != 1 || fwrite(h.p, 1, h.len, f) != h.len)
		rc = -EIO;
	for (size_t k = 0; k < nt && !rc; k++) {
		uint32_t crc = 0;
		rc = write_values(f, &seed, &t[k], dt, &crc);
		char hex[9];
		snprintf(hex, sizeof(hex), "%08x", crc);
		memcpy(h.p + at[k], hex, 8);
	}
	if (!rc && (fseek(f, 8, SEEK_SET) != 0 || fwrite(h.p, 1, h.len, f) != h.len))
		rc = -EIO;
	if (rc == -EIO && ferror(f))
		rc = mbp_file_commit(file); /* refuses a stream that failed, giving the write's own errno */
	else if (rc)
		mbp_file_destroy(file);
	else
		rc = mbp_file_commit(file);
out:
	free(at);
	free(h.p);
	return rc;
}

/* The tensor list of a model, in data order: each layer's weight, bias, then its norm pair; their values
 * from lw, or (lw NULL) left to the generator. */
static size_t model_tensors(unsigned L, const uint32_t *w, const bool *norm, const struct mbp__weights *lw,
			    struct mbp__st_out *t)
{
	size_t nt = 0;
	for (unsigned i = 0; i < L; i++)
		for (unsigned k = 0; k < (norm[i] ? 4u : 2u); k++) {
			struct mbp__st_out *x = &t[nt++];
			snprintf(x->name, sizeof(x->name), "layers.%u.%s", i, tnames[k]);
			x->rows = w[i + 1];
			x->cols = k == T_W ? w[i] : 0;
			if (lw) {
				const float *parts[] = {lw[i].w, lw[i].b, lw[i].g, lw[i].beta};
				x->data = parts[k];
			}
		}
	return nt;
}

int mbp_model_write_random(const char *path, const mbp_model_spec *sp)
{
	if (!path || !sp || sp->layers < 1 || sp->layers > MBP_MODEL_MAX_LAYERS || sp->act > MBP_ACT_GELU ||
	    sp->dtype > MBP_DTYPE_BF16)
		return -EINVAL;
	unsigned L = sp->layers;
	uint32_t *w = calloc(L + 1, sizeof(*w));
	bool *norm = calloc(L, sizeof(*norm));
	struct mbp__st_out *t = calloc(4 * (size_t)L, sizeof(*t));
	int rc = 0;
	if (!w || !t || !norm) {
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
	for (unsigned i = 0; i < L; i++)
		norm[i] = sp->norm && i + 1 < L;
	size_t nt = model_tensors(L, w, norm, NULL, t);
	for (size_t k = 0; k < nt; k++) {
		struct mbp__st_out *x = &t[k];
		unsigned layer = (unsigned)strtoul(x->name + 7, NULL, 10);
		bool act = layer + 1 < L && sp->act != MBP_ACT_NONE;
		x->scale = 0.1f;
		if (x->cols)
			x->scale = sqrtf((act ? 6.0f : 3.0f) / (float)x->cols);
		else if (strstr(x->name, "norm.weight"))
			x->offset = 1.0f;
	}
	char last[40], seed[24];
	snprintf(last, sizeof(last), "layers.%u.activation", L - 1);
	snprintf(seed, sizeof(seed), "%llu", (unsigned long long)sp->seed);
	const char *meta[] = {"format", "mbpipe-mlp", "activation",	mbp__act_name(sp->act),
			      last,	"none",	      "layer_norm_eps", "1e-05",
			      "seed",	seed};
	rc = mbp__st_write(path, t, nt, meta, MBP_ARRAY_SIZE(meta) / 2, sp->dtype, sp->seed);
out:
	free(t);
	free(norm);
	free(w);
	return rc;
}

int mbp__model_write(const char *path, unsigned L, const struct mbp__layer *l, const struct mbp__weights *lw)
{
	uint32_t *w = calloc(L + 1, sizeof(*w));
	bool *norm = calloc(L, sizeof(*norm));
	struct mbp__st_out *t = calloc(4 * (size_t)L, sizeof(*t));
	const char **meta = calloc(2 * ((size_t)L + 3), sizeof(*meta));
	char(*keys)[32] = calloc(L, sizeof(*keys));
	int rc = 0;
	if (!w || !norm || !t || !meta || !keys) {
		rc = -ENOMEM;
		goto out;
	}
	float eps = 1e-5f;
	w[0] = l[0].in;
	for (unsigned i = 0; i < L; i++) {
		w[i + 1] = l[i].out;
		norm[i] = l[i].norm;
		if (l[i].norm)
			eps = l[i].eps; /* one epsilon per file: the loader gives every layer the same */
	}
	size_t nt = model_tensors(L, w, norm, lw, t);
	char eps_s[32];
	snprintf(eps_s, sizeof(eps_s), "%.9g", (double)eps);
	size_t nm = 0;
	meta[2 * nm] = "format", meta[2 * nm++ + 1] = "mbpipe-mlp";
	meta[2 * nm] = "layer_norm_eps", meta[2 * nm++ + 1] = eps_s;
	for (unsigned i = 0; i < L; i++) {
		snprintf(keys[i], sizeof(keys[i]), "layers.%u.activation", i);
		meta[2 * nm] = keys[i], meta[2 * nm++ + 1] = mbp__act_name(l[i].act);
	}
	rc = mbp__st_write(path, t, nt, meta, nm, MBP_DTYPE_F32, 0);
out:
	free(keys);
	free(meta);
	free(t);
	free(norm);
	free(w);
	return rc;
}

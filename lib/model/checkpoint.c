/*
 * Checkpoints of a trainable model: its weights in the model layout (mbp_model_load reads them, so
 * pipeserve serves them), and its optimizer state in a second safetensors file, read back validated as
 * strictly as a model: every tensor present with its exact shape, nothing unknown, the same optimizer,
 * its bytes those its digests were computed from. Both files are F32, so a resumed run continues bit for
 * bit. Each file is written by rename (mbp_file): a crash leaves each whole, and the weights hash in the
 * state refuses a pair from two different steps.
 */
#include "config.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "mlp_internal.h"
#include "safetensors.h"

static const char *const part_names[MBP__PARTS] = {"weight", "bias", "norm.weight", "norm.bias"};

static const char *optim_name(mbp_optim_kind k)
{
	return k == MBP_OPTIM_SGD ? "sgd" : "adamw";
}

int mbp_mlp_save(mbp_mlp *n, const char *path)
{
	if (!n || !path)
		return -EINVAL;
	return mbp__model_write(path, n->layers, n->l, n->lw);
}

/* FNV-1a 64 over the parameters' values (little-endian F32, layer by layer, part by part, padding left
 * out): what ties an optimizer state to the weights it was saved with. */
static uint64_t weights_hash(const mbp_mlp *n)
{
	uint64_t h = 14695981039346656037ull;
	for (unsigned i = 0; i < n->layers; i++)
		for (unsigned p = 0; p < MBP__PARTS; p++)
			for (size_t e = 0; e < n->count[i][p]; e++) {
				uint32_t u;
				memcpy(&u, &n->param[n->off[i][p] + e], 4);
				for (unsigned b = 0; b < 4; b++, u >>= 8)
					h = (h ^ (u & 0xff)) * 1099511628211ull;
			}
	return h;
}

/* The moments kept: 0 (SGD without momentum), 1 (m) or 2 (m and v). */
static unsigned moments(const mbp_mlp *n)
{
	return n->m2 ? 2u : n->m1 ? 1u : 0u;
}

int mbp_mlp_save_optim(mbp_mlp *n, const char *path)
{
	if (!n || !path)
		return -EINVAL;
	unsigned L = n->layers, nm = moments(n);
	struct mbp__st_out *t = calloc((size_t)L * MBP__PARTS * 2 + 1, sizeof(*t));
	const char **meta = calloc(2 * ((size_t)L + 16), sizeof(*meta));
	char(*kv)[2][32] = calloc((size_t)L + 16, sizeof(*kv));
	int rc = 0;
	if (!t || !meta || !kv) {
		rc = -ENOMEM;
		goto out;
	}
	size_t nt = 0, k = 0;
	for (unsigned i = 0; i < L; i++)
		for (unsigned p = 0; p < MBP__PARTS; p++)
			for (unsigned j = 0; j < nm && n->count[i][p]; j++) {
				struct mbp__st_out *x = &t[nt++];
				snprintf(x->name, sizeof(x->name), "layers.%u.%s.%c", i, part_names[p],
					 "mv"[j]);
				x->rows = n->l[i].out;
				x->cols = p == MBP_PART_WEIGHT ? n->l[i].in : 0;
				x->data = (j ? n->m2 : n->m1) + n->off[i][p];
			}
	const mbp_optim_opts *o = &n->opt;
	meta[2 * k] = "format", meta[2 * k++ + 1] = "mbpipe-optim";
	meta[2 * k] = "optimizer", meta[2 * k++ + 1] = optim_name(o->kind);
	const char *fk[] = {"lr", "min_lr", "weight_decay", "momentum", "beta1", "beta2", "eps"};
	const float fv[] = {o->lr, o->min_lr, o->weight_decay, o->momentum, o->beta1, o->beta2, o->eps};
	size_t u = 0;
	for (size_t f = 0; f < MBP_ARRAY_SIZE(fk); f++, u++) {
		snprintf(kv[u][1], sizeof(kv[u][1]), "%.9g", (double)fv[f]);
		meta[2 * k] = fk[f], meta[2 * k++ + 1] = kv[u][1];
	}
	snprintf(kv[u][1], sizeof(kv[u][1]), "%" PRIu64, o->warmup_steps);
	meta[2 * k] = "warmup_steps", meta[2 * k++ + 1] = kv[u++][1];
	snprintf(kv[u][1], sizeof(kv[u][1]), "%" PRIu64, o->total_steps);
	meta[2 * k] = "total_steps", meta[2 * k++ + 1] = kv[u++][1];
	snprintf(kv[u][1], sizeof(kv[u][1]), "%016" PRIx64, weights_hash(n));
	meta[2 * k] = "weights_fnv1a64", meta[2 * k++ + 1] = kv[u++][1];
	for (unsigned i = 0; i < L; i++, u++) {
		snprintf(kv[u][0], sizeof(kv[u][0]), "layers.%u.step", i);
		snprintf(kv[u][1], sizeof(kv[u][1]), "%" PRIu64, n->step[i]);
		meta[2 * k] = kv[u][0], meta[2 * k++ + 1] = kv[u][1];
	}
	rc = mbp__st_write(path, t, nt, meta, k, MBP_DTYPE_F32, 0);
out:
	free(kv);
	free(meta);
	free(t);
	return rc;
}

/* Parse a whole file; on success *map holds it (munmap with len). */
static int map_file(const char *path, void **map, size_t *len, mbp_model_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
	struct stat sb;
	*map = NULL;
	*len = 0;
	if (fd < 0 || fstat(fd, &sb) < 0) {
		rc = -errno;
	} else if (sb.st_size > 0) {
		*len = (size_t)sb.st_size;
		*map = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
		if (*map == MAP_FAILED) {
			*map = NULL;
			rc = -errno;
		}
	}
	if (fd >= 0)
		close(fd);
	if (rc) {
		mbp__load_fail(err, MBP_LOAD_IO, NULL, "%s", strerror(-rc));
		if (err)
			err->code = rc;
	}
	return rc;
}

static int check_optim(const mbp_mlp *n, const mbp__st *st, uint64_t *steps, mbp_model_error *err)
{
	const char *s = mbp__st_meta(st, "optimizer");
	if (!s || strcmp(s, optim_name(n->opt.kind)))
		return mbp__load_fail(err, MBP_MODEL_ACTIVATION, "__metadata__",
				      "optimizer '%.16s', this model trains with %s", s ? s : "(none)",
				      optim_name(n->opt.kind));
	char name[64];
	for (unsigned i = 0; i < n->layers; i++) {
		snprintf(name, sizeof(name), "layers.%u.step", i);
		s = mbp__st_meta(st, name);
		char *end = NULL;
		errno = 0;
		if (s && *s >= '0' && *s <= '9')
			steps[i] = strtoull(s, &end, 10);
		if (!end || errno || *end)
			return mbp__load_fail(err, MBP_MODEL_MISSING, name,
					      "a step count (a decimal integer) is required");
	}
	unsigned nm = moments(n);
	size_t expected = 0;
	for (unsigned i = 0; i < n->layers; i++)
		for (unsigned p = 0; p < MBP__PARTS; p++)
			for (unsigned j = 0; j < nm && n->count[i][p]; j++) {
				snprintf(name, sizeof(name), "layers.%u.%s.%c", i, part_names[p], "mv"[j]);
				const mbp__st_tensor *x = mbp__st_find(st, name);
				if (!x)
					return mbp__load_fail(err, MBP_MODEL_MISSING, name,
							      "the model's %s state needs it",
							      optim_name(n->opt.kind));
				uint64_t rows = n->l[i].out, cols = p == MBP_PART_WEIGHT ? n->l[i].in : 0;
				if (x->dtype != MBP__ST_F32)
					return mbp__load_fail(err, MBP_MODEL_DTYPE, name, "%s, expected F32",
							      mbp__st_dtype_name(x->dtype));
				if (x->ndim != (cols ? 2u : 1u) || x->shape[0] != rows ||
				    (cols && x->shape[1] != cols))
					return mbp__load_fail(err, MBP_MODEL_SHAPE, name,
							      "expected the shape of the model's tensor");
				expected++;
			}
	if (st->n != expected) {
		for (size_t k = 0; k < st->n; k++) {
			unsigned i, p, j;
			bool known = false;
			for (i = 0; i < n->layers && !known; i++)
				for (p = 0; p < MBP__PARTS && !known; p++)
					for (j = 0; j < nm && n->count[i][p] && !known; j++) {
						snprintf(name, sizeof(name), "layers.%u.%s.%c", i,
							 part_names[p], "mv"[j]);
						known = !strcmp(name, st->t[k].name);
					}
			if (!known)
				return mbp__load_fail(err, MBP_MODEL_UNKNOWN_TENSOR, st->t[k].name,
						      "not part of this model's %s state",
						      optim_name(n->opt.kind));
		}
	}
	/* Absent in files written before it was recorded: accepted as they were. */
	s = mbp__st_meta(st, "weights_fnv1a64");
	char mine[17];
	snprintf(mine, sizeof(mine), "%016" PRIx64, weights_hash(n));
	if (s && strcmp(s, mine))
		return mbp__load_fail(err, MBP_MODEL_ACTIVATION, "__metadata__",
				      "saved at step %" PRIu64 " with other weights (another step or run): "
				      "not the pair of these weights",
				      n->layers ? steps[0] : 0);
	return 0;
}

int mbp_mlp_load_optim(mbp_mlp *n, const char *path, mbp_model_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	if (!n || !path)
		return -EINVAL;
	void *map;
	size_t len;
	int rc = map_file(path, &map, &len, err);
	mbp__st st = {0};
	uint64_t *steps = calloc(n->layers, sizeof(*steps));
	if (!rc && !steps)
		rc = mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "step counts");
	if (!rc)
		rc = mbp__st_parse(map, len, &st, err);
	int digests = rc ? 0 : mbp__st_digests(&st, err);
	if (digests < 0)
		rc = digests;
	for (size_t k = 0; !rc && k < st.n; k++)
		rc = mbp__st_verify(&st.t[k], st.data + st.t[k].begin, err);
	if (!rc)
		rc = check_optim(n, &st, steps, err);
	if (!rc) {
		/* Everything checked: now change the model. */
		unsigned nm = moments(n);
		char name[64];
		for (unsigned i = 0; i < n->layers; i++) {
			n->step[i] = steps[i];
			for (unsigned p = 0; p < MBP__PARTS; p++)
				for (unsigned j = 0; j < nm && n->count[i][p]; j++) {
					snprintf(name, sizeof(name), "layers.%u.%s.%c", i, part_names[p],
						 "mv"[j]);
					const mbp__st_tensor *x = mbp__st_find(&st, name);
					float *dst = (j ? n->m2 : n->m1) + n->off[i][p];
					const uint8_t *src = st.data + x->begin;
					for (size_t e = 0; e < n->count[i][p]; e++) {
						uint32_t u;
						memcpy(&u, src + 4 * e, 4);
						u = le32toh(u);
						memcpy(&dst[e], &u, 4);
					}
				}
		}
	}
	if (rc)
		mbp__load_error_path(err, path);
	mbp__st_free(&st);
	free(steps);
	if (map)
		munmap(map, len);
	return rc;
}

int mbp_mlp_optim_read(const char *path, mbp_optim_opts *o, mbp_model_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	if (!path || !o)
		return -EINVAL;
	void *map;
	size_t len;
	int rc = map_file(path, &map, &len, err);
	mbp__st st = {0};
	if (!rc)
		rc = mbp__st_parse(map, len, &st, err);
	mbp_optim_opts r = {0};
	const char *s = rc ? NULL : mbp__st_meta(&st, "optimizer");
	if (!rc && (!s || (strcmp(s, "adamw") && strcmp(s, "sgd"))))
		rc = mbp__load_fail(err, MBP_MODEL_ACTIVATION, "__metadata__", "optimizer '%.16s' unknown",
				    s ? s : "(none)");
	if (!rc)
		r.kind = strcmp(s, "sgd") ? MBP_OPTIM_ADAMW : MBP_OPTIM_SGD;
	const char *fk[] = {"lr", "min_lr", "weight_decay", "momentum", "beta1", "beta2", "eps"};
	float *fv[] = {&r.lr, &r.min_lr, &r.weight_decay, &r.momentum, &r.beta1, &r.beta2, &r.eps};
	const char *ik[] = {"warmup_steps", "total_steps"};
	uint64_t *iv[] = {&r.warmup_steps, &r.total_steps};
	for (size_t f = 0; !rc && f < MBP_ARRAY_SIZE(fk) + MBP_ARRAY_SIZE(ik); f++) {
		bool isf = f < MBP_ARRAY_SIZE(fk);
		const char *key = isf ? fk[f] : ik[f - MBP_ARRAY_SIZE(fk)];
		s = mbp__st_meta(&st, key);
		char *end = NULL;
		errno = 0;
		if (s && *s && isf)
			*fv[f] = strtof(s, &end);
		else if (s && *s >= '0' && *s <= '9')
			*iv[f - MBP_ARRAY_SIZE(fk)] = strtoull(s, &end, 10);
		if (!end || errno || *end)
			rc = mbp__load_fail(err, MBP_MODEL_MISSING, key, "a %s is required",
					    isf ? "number" : "decimal integer");
	}
	if (!rc)
		*o = r;
	else
		mbp__load_error_path(err, path);
	mbp__st_free(&st);
	if (map)
		munmap(map, len);
	return rc;
}

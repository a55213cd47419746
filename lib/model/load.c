/*
 * Loading: a safetensors file (mbp_model_load, _load_fd, _load_layers) into a layer chain and its first
 * weights version, and mbp_model_destroy.
 *
 * The file is checked in the order that costs least on a bad one (load_from says it), and only the byte
 * ranges of the kept layers' tensors are read. F32 tensors that are aligned in the data read are used in
 * place; F16, BF16 and misaligned ones are converted into the version's own buffer.
 */
#include "config.h"

#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "model_internal.h"
#include "safetensors.h"
#include "strbuf.h"

enum part { P_WEIGHT, P_BIAS, P_NORM_W, P_NORM_B, P_COUNT };
static const char *const part_names[P_COUNT] = {"weight", "bias", "norm.weight", "norm.bias"};

/* "layers.<i>.<part>" with <i> in canonical decimal: the layer and part, or -1. */
static int parse_name(const char *name, unsigned *layer)
{
	if (strncmp(name, "layers.", 7))
		return -1;
	const char *p = name + 7;
	if (!(*p >= '0' && *p <= '9') || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
		return -1;
	unsigned long v = 0;
	while (*p >= '0' && *p <= '9') {
		v = v * 10 + (unsigned long)(*p++ - '0');
		if (v > MBP_MODEL_MAX_LAYERS)
			v = MBP_MODEL_MAX_LAYERS; /* saturate: reported as too many layers */
	}
	if (*p++ != '.')
		return -1;
	for (int k = 0; k < P_COUNT; k++)
		if (!strcmp(p, part_names[k])) {
			*layer = (unsigned)v;
			return k;
		}
	return -1;
}

static int parse_act(const char *s, mbp_act *act)
{
	static const mbp_act acts[] = {MBP_ACT_NONE, MBP_ACT_RELU, MBP_ACT_GELU};
	for (unsigned i = 0; i < MBP_ARRAY_SIZE(acts); i++)
		if (!strcmp(s, mbp__act_name(acts[i]))) {
			*act = acts[i];
			return 0;
		}
	return -1;
}

/* Build the layer chain from the tensor table: t[i][part] receives the tensors. */
static int build_layers(mbp_model *m, const mbp__st *st, const mbp__st_tensor **t, mbp_model_error *err)
{
	unsigned nl = 0;
	for (size_t k = 0; k < st->n; k++) {
		const mbp__st_tensor *x = &st->t[k];
		unsigned li;
		int part = parse_name(x->name, &li);
		if (part < 0)
			return mbp__load_fail(err, MBP_MODEL_UNKNOWN_TENSOR, x->name,
					      "expected layers.<i>.{weight,bias,norm.weight,norm.bias}");
		if (li >= MBP_MODEL_MAX_LAYERS)
			return mbp__load_fail(err, MBP_MODEL_TOO_MANY, x->name, "at most %d layers",
					      MBP_MODEL_MAX_LAYERS);
		if (x->dtype != MBP__ST_F32 && x->dtype != MBP__ST_F16 && x->dtype != MBP__ST_BF16)
			return mbp__load_fail(err, MBP_MODEL_DTYPE, x->name, "%s",
					      mbp__st_dtype_name(x->dtype));
		t[li * P_COUNT + part] = x;
		if (li + 1 > nl)
			nl = li + 1;
	}
	if (nl == 0 || !t[P_WEIGHT])
		return mbp__load_fail(err, MBP_MODEL_NO_LAYERS, "layers.0.weight",
				      "the model has no first layer");
	m->layers = nl;
	m->l = calloc(nl, sizeof(*m->l));
	if (!m->l)
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "layer table");

	float eps = 1e-5f;
	const char *s = mbp__st_meta(st, "layer_norm_eps");
	if (s) {
		char *end;
		errno = 0;
		eps = strtof(s, &end);
		if (errno || end == s || *end || !isfinite(eps) || eps <= 0)
			return mbp__load_fail(err, MBP_MODEL_ACTIVATION, "__metadata__",
					      "layer_norm_eps '%.32s' is not a positive number", s);
	}
	mbp_act def = MBP_ACT_NONE;
	s = mbp__st_meta(st, "activation");
	if (s && parse_act(s, &def))
		return mbp__load_fail(err, MBP_MODEL_ACTIVATION, "__metadata__",
				      "activation '%.32s' (expected none, relu or gelu)", s);

	char name[64];
	for (unsigned i = 0; i < nl; i++) {
		const mbp__st_tensor **ti = &t[i * P_COUNT];
		struct mbp__layer *l = &m->l[i];
		for (int part = 0; part < P_COUNT; part++) {
			bool need = part <= P_BIAS || ti[P_NORM_W] || ti[P_NORM_B];
			if (need && !ti[part]) {
				snprintf(name, sizeof(name), "layers.%u.%s", i, part_names[part]);
				return mbp__load_fail(err, MBP_MODEL_MISSING, name, "layer %u needs it", i);
			}
		}
		const mbp__st_tensor *w = ti[P_WEIGHT];
		if (w->ndim != 2 || w->shape[0] < 1 || w->shape[1] < 1 || w->shape[0] > MBP_MODEL_MAX_WIDTH ||
		    w->shape[1] > MBP_MODEL_MAX_WIDTH)
			return mbp__load_fail(err, MBP_MODEL_SHAPE, w->name,
					      "expected [out, in] with widths in 1..%u", MBP_MODEL_MAX_WIDTH);
		l->out = (uint32_t)w->shape[0];
		l->in = (uint32_t)w->shape[1];
		if (i > 0 && l->in != m->l[i - 1].out)
			return mbp__load_fail(err, MBP_MODEL_SHAPE, w->name,
					      "input width %u, previous layer's output is %u", l->in,
					      m->l[i - 1].out);
		for (int part = P_BIAS; part < P_COUNT; part++) {
			const mbp__st_tensor *x = ti[part];
			if (x && (x->ndim != 1 || x->shape[0] != l->out))
				return mbp__load_fail(err, MBP_MODEL_SHAPE, x->name, "expected [%u]", l->out);
		}
		l->norm = ti[P_NORM_W] != NULL;
		l->eps = eps;
		l->dtype = w->dtype == MBP__ST_F16    ? MBP_DTYPE_F16
			   : w->dtype == MBP__ST_BF16 ? MBP_DTYPE_BF16
						      : MBP_DTYPE_F32;
		l->act = def;
		snprintf(name, sizeof(name), "layers.%u.activation", i);
		s = mbp__st_meta(st, name);
		if (s && parse_act(s, &l->act))
			return mbp__load_fail(err, MBP_MODEL_ACTIVATION, "__metadata__",
					      "%s '%.32s' (expected none, relu or gelu)", name, s);
		if (l->out > m->max_width)
			m->max_width = l->out;
		if (l->in > m->max_width)
			m->max_width = l->in;
	}
	return 0;
}

/* Whether a tensor can be used in place: F32 and 4-byte aligned in the data read. */
static bool in_place(const mbp__st *st, const mbp__st_tensor *x)
{
	return x->dtype == MBP__ST_F32 && ((uintptr_t)(st->data + x->begin) % sizeof(float)) == 0;
}

/* Make the version: point at F32 tensors in the data read, convert or realign the others into `owned`. */
static int build_version(mbp_model *m, const mbp__st *st, const mbp__st_tensor **t, struct mbp__version *v,
			 mbp_model_error *err)
{
	v->layers = m->layers;
	v->lw = calloc(m->layers, sizeof(*v->lw));
	if (!v->lw)
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "weights table");
	size_t owned = 0; /* floats; each tensor rounded up to a cache line */
	for (unsigned k = 0; k < m->layers * P_COUNT; k++)
		if (t[k] && !in_place(st, t[k]))
			owned += (t[k]->nelem + 15) & ~(size_t)15;
	if (owned && !(v->owned = mbp__scratch_alloc(owned)))
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "%zu bytes of converted weights",
				      owned * sizeof(float));
	float *at = v->owned;
	bool used = false; /* some tensor is used in place in v->data */
	for (unsigned k = 0; k < m->layers * P_COUNT; k++) {
		const mbp__st_tensor *x = t[k];
		if (!x)
			continue;
		const uint8_t *src = st->data + x->begin;
		const float *p;
		if (in_place(st, x)) {
			p = (const float *)(const void *)src;
			used = true;
		} else {
			for (size_t e = 0; e < x->nelem; e++) {
				uint16_t h;
				switch (x->dtype) {
				case MBP__ST_F16:
					memcpy(&h, src + 2 * e, 2);
					at[e] = mbp__f16_to_f32(le16toh(h));
					break;
				case MBP__ST_BF16:
					memcpy(&h, src + 2 * e, 2);
					at[e] = mbp__bf16_to_f32(le16toh(h));
					break;
				default:
					memcpy(&at[e], src + 4 * e, 4);
					break;
				}
			}
			p = at;
			at += (x->nelem + 15) & ~(size_t)15;
		}
		struct mbp__weights *w = &v->lw[k / P_COUNT];
		switch (k % P_COUNT) {
		case P_WEIGHT:
			w->w = p;
			break;
		case P_BIAS:
			w->b = p;
			break;
		case P_NORM_W:
			w->g = p;
			break;
		default:
			w->beta = p;
			break;
		}
	}
	if (!used) { /* everything was converted or copied: the data read is not needed any more */
		free(v->data);
		v->data = NULL;
	}
	/* The packed kernel's copy, once per version: a swap brings the new version's own, freed with it. */
	if (mbp__version_pack(v, m->l))
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "packed copy of the weights");
	return 0;
}

/* Keep layers [first, first + count) of the validated chain (their tensors move to the front of t). */
static int keep_layers(mbp_model *m, const mbp__st_tensor **t, unsigned first, unsigned count,
		       mbp_model_error *err)
{
	if (count == 0 || first >= m->layers || count > m->layers - first)
		return mbp__load_fail(err, MBP_MODEL_MISSING, NULL, "layers %u-%u asked for, the file has %u",
				      first, first + count - 1, m->layers);
	memmove(m->l, m->l + first, count * sizeof(*m->l));
	memmove(t, t + (size_t)first * P_COUNT, (size_t)count * P_COUNT * sizeof(*t));
	m->layers = count;
	m->max_width = 0;
	for (unsigned i = 0; i < count; i++) {
		if (m->l[i].out > m->max_width)
			m->max_width = m->l[i].out;
		if (m->l[i].in > m->max_width)
			m->max_width = m->l[i].in;
	}
	return 0;
}

/* A failed system call as MBP_LOAD_IO with the system's own errno. */
static int io_fail(mbp_model_error *err, int code, const char *what)
{
	mbp__load_fail(err, MBP_LOAD_IO, NULL, "%s: %s", what, strerror(-code));
	if (err)
		err->code = code;
	return code;
}

/* Read exactly n bytes at off, in chunks, checking the deadline (0: none) before each. */
static int read_at(int fd, void *buf, size_t n, uint64_t off, uint64_t deadline, mbp_model_error *err)
{
	char *p = buf;
	while (n) {
		if (deadline && mbp__now_ns() > deadline)
			return mbp__load_fail(err, MBP_LOAD_TIMEOUT, NULL, "%zu bytes left to read", n);
		size_t chunk = n < ((size_t)4 << 20) ? n : ((size_t)4 << 20);
		ssize_t r = pread(fd, p, chunk, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return io_fail(err, -errno, "read");
		if (r == 0)
			return io_fail(err, -EIO, "the file became shorter while it was read");
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

static int by_begin(const void *a, const void *b)
{
	const mbp__st_tensor *x = *(const mbp__st_tensor *const *)a, *y = *(const mbp__st_tensor *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Contiguous runs of kept tensors separated by less than this are read as one (fewer system calls). */
#define RUN_GAP 4096u

/*
 * Read only the byte ranges of the tensors in t[0, nt) (NULL entries skipped), one pread per contiguous
 * run, into v->data; each run lands at the same offset modulo 64 as in the file's data section (which
 * starts at `base`), so a tensor is as aligned as when the whole section is read. The kept tensors'
 * begin/end are rewritten to their place in v->data and st->data points at it. When every layer is kept
 * the runs tile the whole section: one read, as before.
 */
static int read_kept(int fd, uint64_t base, uint64_t deadline, mbp__st *st, const mbp__st_tensor **t,
		     unsigned nt, struct mbp__version *v, mbp_model_error *err)
{
	const mbp__st_tensor **o = malloc((size_t)nt * sizeof(*o));
	if (!o)
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "tensor order");
	unsigned n = 0;
	for (unsigned k = 0; k < nt; k++)
		if (t[k])
			o[n++] = t[k];
	qsort(o, n, sizeof(*o), by_begin);
	/* Two passes over the runs: size the buffer, then read and relocate. */
	uint64_t total = 0;
	int rc = 0;
	for (int pass = 0; pass < 2 && !rc; pass++) {
		uint64_t at = 0;
		for (unsigned i = 0; i < n && !rc;) {
			uint64_t begin = o[i]->begin, end = o[i]->end;
			unsigned j = i + 1;
			for (; j < n && o[j]->begin <= end + RUN_GAP; j++)
				if (o[j]->end > end)
					end = o[j]->end;
			at += (begin - at) & 63; /* at == begin (mod 64) */
			if (pass == 1) {
				rc = read_at(fd, (uint8_t *)v->data + at, (size_t)(end - begin), base + begin,
					     deadline, err);
				for (; i < j; i++) {
					mbp__st_tensor *x = &st->t[o[i] - st->t];
					x->end = at + (x->end - begin);
					x->begin = at + (x->begin - begin);
				}
			}
			at += end - begin;
			i = j;
		}
		if (pass == 0) {
			total = at;
			size_t alloc = total > SIZE_MAX - 64 ? 0 : (size_t)(total + 63) & ~(size_t)63;
			if (total && !(v->data = alloc ? aligned_alloc(64, alloc) : NULL))
				rc = mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "%llu bytes of weights",
						    (unsigned long long)total);
		}
	}
	free(o);
	st->data = v->data;
	st->data_len = total;
	return rc;
}

/* A chain of widths for a message: "784-512-512-10", its middle left out past 8 widths. w(i) is width i. */
static void chain_text(char *buf, size_t n, unsigned L, const struct mbp__layer *l, const uint32_t *w)
{
	struct mbp__strbuf b = mbp__strbuf_fixed(buf, n);
	for (unsigned i = 0; i <= L; i++) {
		if (L > 8 && i == 6) {
			mbp__strbuf_printf(&b, "-...");
			i = L;
		}
		uint32_t x = w ? w[i] : i == 0 ? l[0].in : l[i - 1].out;
		mbp__strbuf_printf(&b, "%s%u", i ? "-" : "", x);
	}
}

/* The chain against the structure the caller expects, from the header alone. */
static int check_structure(const mbp_model *m, const mbp_model_load_opts *o, mbp_model_error *err)
{
	if (!o->layers || !o->widths)
		return 0;
	bool same = m->layers == o->layers && m->l[0].in == o->widths[0];
	for (unsigned i = 0; same && i < m->layers; i++)
		same = m->l[i].out == o->widths[i + 1];
	if (same)
		return 0;
	char has[96], want[96];
	chain_text(has, sizeof(has), m->layers, m->l, NULL);
	chain_text(want, sizeof(want), o->layers, NULL, o->widths);
	return mbp__load_fail(err, MBP_MODEL_STRUCTURE, NULL,
			      "the file has %u %s of widths %s, expected %u %s of %s", m->layers,
			      PLURAL(m->layers, "layer", "layers"), has, o->layers,
			      PLURAL(o->layers, "layer", "layers"), want);
}

/*
 * Read and check the file in the order that costs least on a bad one: its type and size, the 8-byte
 * header length against the size, the header (every rule but the data bytes), its digests, the layer
 * chain and the structure expected, and only then the data of the kept layers' tensors, into v->data,
 * each tensor checked against its digest.
 */
static int load_from(mbp_model *m, struct mbp__version *v, int fd, const mbp_model_load_opts *o,
		     unsigned first, unsigned count, mbp_model_error *err)
{
	struct stat sb;
	if (fstat(fd, &sb) < 0)
		return io_fail(err, -errno, "fstat");
	if (!S_ISREG(sb.st_mode))
		return mbp__load_fail(err, MBP_LOAD_NOT_REGULAR, NULL, "%s", mbp__file_kind(sb.st_mode));
	uint64_t size = (uint64_t)sb.st_size;
	if (o->max_bytes && size > o->max_bytes)
		return mbp__load_fail(err, MBP_LOAD_TOO_LARGE, NULL, "%llu bytes, the bound is %llu",
				      (unsigned long long)size, (unsigned long long)o->max_bytes);
	uint64_t deadline = o->timeout_ns ? mbp__now_ns() + o->timeout_ns : 0;
	uint8_t len8[8] = {0};
	mbp__st st;
	if (size < 8) /* reported by the parser */
		return mbp__st_parse_head(len8, 0, size, &st, err);
	int rc = read_at(fd, len8, 8, 0, deadline, err);
	if (rc)
		return rc;
	uint64_t n = le64toh(*(const uint64_t *)(const void *)len8);
	if (n > MBP__ST_MAX_HEADER || n > size - 8) /* reported by the parser, before any allocation */
		return mbp__st_parse_head(len8, 8, size, &st, err);
	uint8_t *head = malloc(8 + (size_t)n);
	if (!head)
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "%llu bytes of header",
				      (unsigned long long)n);
	memcpy(head, len8, 8);
	rc = read_at(fd, head + 8, (size_t)n, 8, deadline, err);
	if (!rc)
		rc = mbp__st_parse_head(head, 8 + (size_t)n, size, &st, err);
	free(head);
	if (rc)
		return rc;
	const mbp__st_tensor **t = calloc((size_t)MBP_MODEL_MAX_LAYERS * P_COUNT, sizeof(*t));
	if (!t)
		rc = mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "tensor index");
	int digests = rc ? 0 : mbp__st_digests(&st, err);
	if (digests < 0)
		rc = digests;
	m->verified = digests > 0;
	if (!rc)
		rc = build_layers(m, &st, t, err);
	if (!rc && count != UINT_MAX)
		rc = keep_layers(m, t, first, count, err);
	if (!rc)
		rc = check_structure(m, o, err);
	if (!rc)
		rc = read_kept(fd, 8 + n, deadline, &st, t, m->layers * P_COUNT, v, err);
	for (unsigned k = 0; !rc && k < m->layers * P_COUNT; k++)
		if (t[k])
			rc = mbp__st_verify(t[k], st.data + t[k]->begin, err);
	if (!rc)
		rc = build_version(m, &st, t, v, err);
	free(t);
	mbp__st_free(&st);
	return rc;
}

void mbp__load_error_path(mbp_model_error *err, const char *path)
{
	if (!err)
		return;
	char msg[sizeof(err->msg) + 512];
	int k = snprintf(msg, sizeof(msg), "%.500s: %s", path, err->msg);
	if (k > 0)
		snprintf(err->msg, sizeof(err->msg), "%.*s", (int)(sizeof(err->msg) - 1), msg);
}

/* Load layers [first, first + count) (count UINT_MAX: all of them) from an open file. */
static int load_fd(mbp_model **out, int fd, const char *name, const mbp_model_load_opts *o, unsigned first,
		   unsigned count, mbp_model_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	if (!out || fd < 0)
		return -EINVAL;
	*out = NULL;
	const mbp_model_load_opts none = {0};
	mbp_model *m = calloc(1, sizeof(*m));
	struct mbp__version *v = calloc(1, sizeof(*v));
	if (!m || !v) {
		free(m);
		free(v);
		return mbp__load_fail(err, MBP_LOAD_NOMEM, NULL, "model");
	}
	int rc = load_from(m, v, fd, o ? o : &none, first, count, err);
	if (rc) {
		mbp__load_error_path(err, name ? name : "model");
		mbp__version_free(v);
		free(m->l);
		free(m);
		return rc;
	}
	mbp__versions_init(m, v);
	*out = m;
	return 0;
}

int mbp_model_load_fd(mbp_model **out, int fd, const char *name, const mbp_model_load_opts *o,
		      mbp_model_error *err)
{
	return load_fd(out, fd, name, o, 0, UINT_MAX, err);
}

static int load_path(mbp_model **out, const char *path, unsigned first, unsigned count, mbp_model_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	if (!out || !path)
		return -EINVAL;
	*out = NULL;
	/* O_NONBLOCK: opening a FIFO would otherwise wait for a writer; load_fd then refuses it. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		int rc = io_fail(err, -errno, "open");
		mbp__load_error_path(err, path);
		return rc;
	}
	int rc = load_fd(out, fd, path, NULL, first, count, err);
	close(fd);
	return rc;
}

int mbp_model_load(mbp_model **out, const char *path, mbp_model_error *err)
{
	return load_path(out, path, 0, UINT_MAX, err);
}

int mbp_model_load_layers(mbp_model **out, const char *path, unsigned first, unsigned count,
			  mbp_model_error *err)
{
	return load_path(out, path, first, count, err);
}
void mbp_model_destroy(mbp_model *m)
{
	if (!m)
		return;
	mbp__versions_fini(m);
	free(m->l);
	free(m);
}

/*
 * What a loaded model is: its layers (mbp_model_layer_info, and mbp__layer_info for the trainable model
 * too), widths, whether its file's digests were checked, the names of its activations and types, and its
 * text description (mbp_model_describe). Reads only the fixed structure; the weights versions are
 * versions.c's.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "model_internal.h"
#include "strbuf.h"

const char *mbp__act_name(mbp_act a)
{
	return a == MBP_ACT_RELU ? "relu" : a == MBP_ACT_GELU ? "gelu" : "none";
}

const char *mbp__dtype_name(mbp_dtype d)
{
	return d == MBP_DTYPE_F16 ? "F16" : d == MBP_DTYPE_BF16 ? "BF16" : "F32";
}

bool mbp_model_verified(const mbp_model *m)
{
	return m && m->verified;
}

unsigned mbp_model_layers(const mbp_model *m)
{
	return m ? m->layers : 0;
}

uint32_t mbp_model_in_width(const mbp_model *m)
{
	return m ? m->l[0].in : 0;
}

uint32_t mbp_model_out_width(const mbp_model *m)
{
	return m ? m->l[m->layers - 1].out : 0;
}

int mbp_model_layer_info(const mbp_model *m, unsigned i, mbp_layer_info *info)
{
	if (!m || !info)
		return -EINVAL;
	if (i >= m->layers)
		return -ERANGE;
	mbp__layer_info(&m->l[i], info);
	mbp_model *mm = (mbp_model *)m; /* the lock is not part of the model's value */
	pthread_mutex_lock(&mm->swap_lock);
	if (mm->current && mm->current->lw[i].wp)
		info->packed_bytes = mbp__dense_packed_floats(info->in, info->out) * sizeof(float);
	pthread_mutex_unlock(&mm->swap_lock);
	return 0;
}

void mbp__layer_info(const struct mbp__layer *l, mbp_layer_info *info)
{
	memset(info, 0, sizeof(*info));
	info->in = l->in;
	info->out = l->out;
	info->act = l->act;
	info->norm = l->norm;
	info->eps = l->eps;
	info->dtype = l->dtype;
	info->flops = 2ull * l->in * l->out;
	info->param_bytes = ((size_t)l->in * l->out + l->out * (l->norm ? 3u : 1u)) * sizeof(float);
}

int mbp_model_describe(const mbp_model *m, char *buf, size_t n)
{
	if (!m || (!buf && n))
		return -EINVAL;
	struct mbp__strbuf b = mbp__strbuf_fixed(buf, n);
	double total = 0, packed = 0;
	for (unsigned i = 0; i < m->layers; i++) {
		mbp_layer_info li;
		mbp_model_layer_info(m, i, &li);
		total += (double)li.param_bytes;
		packed += (double)li.packed_bytes;
		mbp__strbuf_printf(&b, "layer %u: %u -> %u %s%s %s %.2f MiB\n", i, li.in, li.out,
				   mbp__act_name(li.act), li.norm ? " norm" : "", mbp__dtype_name(li.dtype),
				   li.param_bytes / 1048576.0);
	}
	mbp__strbuf_printf(&b, "%u %s, %u -> %u, %.2f MiB of float32 parameters, weights version %llu\n",
			   m->layers, PLURAL(m->layers, "layer", "layers"), mbp_model_in_width(m),
			   mbp_model_out_width(m), total / 1048576.0,
			   (unsigned long long)mbp_model_version(m));
	if (packed > 0)
		mbp__strbuf_printf(&b, "%.2f MiB of packed weights per version (kernel packed)\n",
				   packed / 1048576.0);
	if (n && b.len >= n)
		buf[n - 1] = '\0';
	return b.len > INT32_MAX ? INT32_MAX : (int)b.len;
}

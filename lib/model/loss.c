/*
 * Losses at the last stage: softmax cross-entropy with integer class targets, and mean squared error.
 *
 * Each returns the sum of its rows' losses and writes the gradient scaled by 1 / batch_rows, so that the
 * micro-batches of a mini-batch, each given the mini-batch's row count, add up to the gradient of the
 * mini-batch's mean loss. A row's loss is computed in double (log-sum-exp with the row's maximum taken
 * out), which keeps it finite for any finite logits; a non-finite result means non-finite input.
 */
#include "config.h"

#include <errno.h>
#include <math.h>

#include "common.h"
#include "mlp_internal.h"

int mbp_loss_xent(const float *logits, const int32_t *labels, uint32_t rows, uint32_t classes,
		  size_t batch_rows, float *dlogits, double *loss_sum, uint32_t *correct)
{
	if (!logits || !labels || !dlogits || !loss_sum || !rows || !classes || batch_rows < rows)
		return -EINVAL;
	for (uint32_t r = 0; r < rows; r++)
		if (labels[r] < 0 || (uint32_t)labels[r] >= classes)
			return -ERANGE;
	double sum = 0, inv_n = 1.0 / (double)batch_rows;
	uint32_t ok = 0;
	for (uint32_t r = 0; r < rows; r++) {
		const float *x = logits + (size_t)r * classes;
		float *d = dlogits + (size_t)r * classes;
		uint32_t best = 0;
		for (uint32_t c = 1; c < classes; c++)
			if (x[c] > x[best])
				best = c;
		double mx = x[best], se = 0;
		for (uint32_t c = 0; c < classes; c++)
			se += exp((double)x[c] - mx);
		double lse = mx + log(se), xl = x[labels[r]];
		sum += lse - xl;
		ok += best == (uint32_t)labels[r];
		for (uint32_t c = 0; c < classes; c++) {
			double p = exp((double)x[c] - lse);
			d[c] = (float)((p - (c == (uint32_t)labels[r] ? 1.0 : 0.0)) * inv_n);
		}
	}
	*loss_sum = sum;
	if (correct)
		*correct = ok;
	return isfinite(sum) ? 0 : -EDOM;
}

int mbp_loss_mse(const float *out, const float *target, uint32_t rows, uint32_t width, size_t batch_rows,
		 float *dout, double *loss_sum)
{
	if (!out || !target || !dout || !loss_sum || !rows || !width || batch_rows < rows)
		return -EINVAL;
	double sum = 0, k = 2.0 / ((double)batch_rows * width);
	for (size_t e = 0; e < (size_t)rows * width; e++) {
		double d = (double)out[e] - target[e];
		sum += d * d / width;
		dout[e] = (float)(k * d);
	}
	*loss_sum = sum;
	return isfinite(sum) ? 0 : -EDOM;
}

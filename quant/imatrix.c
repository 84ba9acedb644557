/* Importance-weighted quantization (the imatrix method), bit-exact with
 * ggml's quantize_<t>(src, dst, 1, n, imatrix) for one row.
 *
 * The importance of element i is imatrix[i] (the mean squared activation that
 * meets that weight) times sqrt(sigma2 + x[i]^2), where sigma2 is the row's or
 * super-block's mean square: a large weight that meets large activations
 * must be rounded most carefully.  Unlike the reference quantizers the
 * sub-block scales and mins are themselves fitted with these weights
 * (mcv_fit_positive / mcv_fit_symmetric over the sub-block sums of weights)
 * instead of being rounded against their maximum. */
#include "ref_fit.h"
#include "blocks.h"
#include "ref_rows.h"

#include <math.h>

/* qw[i] * sqrt(sigma2 + x[i]^2) for n elements; returns their sum. */
static float importance(int n, const float *x, const float *qw, float sigma2, float *w)
{
	float sum = 0;
	for (int l = 0; l < n; l++)
		w[l] = qw[l] * sqrtf(sigma2 + x[l] * x[l]);
	for (int l = 0; l < n; l++)
		sum += w[l];
	return sum;
}

static float sum_squares(int64_t n, const float *x)
{
	float s = 0;
	for (int64_t i = 0; i < n; i++)
		s += x[i] * x[i];
	return s;
}

/* Q4_0: sigma2 is over the whole row here (not per block), as in ggml. */
static void q4_0_row(const float *x, block_q4_0 *y, int64_t n, const float *qw)
{
	float w[MCV_QK];
	int8_t L[MCV_QK];
	const float sigma2 = sum_squares(n, x) / n;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		const float *xb = x + b * MCV_QK;
		importance(MCV_QK, xb, qw + b * MCV_QK, sigma2, w);
		y[b].d = mcv_fp32_to_fp16(mcv_fit_symmetric(MCV_QK, 8, xb, L, w));
		for (int j = 0; j < MCV_QK / 2; j++)
			y[b].qs[j] = (uint8_t)(L[j] | (L[j + MCV_QK / 2] << 4));
	}
}

static void q2_K_block(const float *x, block_q2_K *y, const float *qw)
{
	uint8_t L[MCV_QK_K], Laux[16], Ls[16], Lm[16];
	float w[16], sw[16], scales[16], mins[16];
	const float sigma2 = sum_squares(MCV_QK_K, x) / MCV_QK_K;
	for (int j = 0; j < 16; j++) {
		sw[j] = importance(16, x + 16 * j, qw + 16 * j, sigma2, w);
		scales[j] = mcv_fit_affine_guarded(16, 3, x + 16 * j, w, L + 16 * j, &mins[j],
						   Laux, -0.9f, 0.05f, 36, 0);
	}
	y->d = mcv_fp32_to_fp16(mcv_fit_positive(16, 15, scales, Ls, sw));
	y->dmin = mcv_fp32_to_fp16(mcv_fit_positive(16, 15, mins, Lm, sw));
	for (int j = 0; j < 16; j++)
		y->scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
	mcv_q2_K_requantize(x, y, L);
	mcv_pack_q2_levels(y->qs, L);
}

static void q3_K_block(const float *x, block_q3_K *y, const float *qw)
{
	int8_t L[MCV_QK_K], Ls[16];
	float w[16], sw[16], scales[16];
	const float sigma2 = 2 * sum_squares(MCV_QK_K, x) / MCV_QK_K;
	for (int j = 0; j < 16; j++) {
		sw[j] = importance(16, x + 16 * j, qw + 16 * j, sigma2, w);
		scales[j] = mcv_fit_symmetric(16, 4, x + 16 * j, L + 16 * j, w);
	}
	/* The 16 scales get a signed 6-bit fit of their own, weighted by the
	 * total importance of each sub-block; Ls comes back biased by 32. */
	const float d = mcv_fit_symmetric(16, 32, scales, Ls, sw);
	memset(y->scales, 0, 12);
	for (int j = 0; j < 16; j++)
		mcv_q3_pack_scale(y->scales, j, Ls[j]);
	y->d = mcv_fp32_to_fp16(d);
	mcv_q3_K_requantize(x, y, L);
	mcv_pack_q3_levels(y->hmask, y->qs, L);
}

/* Q4_K and Q5_K share everything but nmax; ggml caps the packed 6-bit values
 * at 63 for Q5_K only (a no-op unless a fit went negative and wrapped). */
static void k4_block(const float *x, int nmax, int cap, mcv_half *dd, mcv_half *dmin,
		     uint8_t scales_out[12], uint8_t *L, const float *qw)
{
	uint8_t Laux[32], Ls[8], Lm[8];
	float w[32], sw[8], scales[8], mins[8];
	const float sigma2 = 2 * sum_squares(MCV_QK_K, x) / MCV_QK_K;
	for (int j = 0; j < 8; j++) {
		sw[j] = importance(32, x + 32 * j, qw + 32 * j, sigma2, w);
		scales[j] = mcv_fit_affine_guarded(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j],
						   Laux, -0.9f, 0.05f, 36, 0);
	}
	const float d = mcv_fit_positive(8, 63, scales, Ls, sw);
	const float m = mcv_fit_positive(8, 63, mins, Lm, sw);
	for (int j = 0; j < 8; j++) {
		uint8_t ls = Ls[j], lm = Lm[j];
		if (cap) {
			ls = ls < 63 ? ls : 63;
			lm = lm < 63 ? lm : 63;
		}
		mcv_k4_pack_scale_min(scales_out, j, ls, lm);
	}
	*dd = mcv_fp32_to_fp16(d);
	*dmin = mcv_fp32_to_fp16(m);
	mcv_k4_requantize(x, nmax, *dd, *dmin, scales_out, L);
}

void mcv_quantize_row_imatrix(int type, const float *x, void *y, int64_t n,
			      const float *weights)
{
	uint8_t L[MCV_QK_K];
	if (!weights) {
		mcv_quantize_row_ref(type, x, y, n);
		return;
	}
	switch (type) {
	case MCV_Q4_0:
		q4_0_row(x, y, n, weights);
		return;
	case MCV_Q5_0:
		mcv_imatrix_quantize_q5_0(x, y, n, weights);
		return;
	case MCV_Q5_1:
		mcv_imatrix_quantize_q5_1(x, y, n, weights);
		return;
	case MCV_Q2_K:
		for (int64_t b = 0; b < n / MCV_QK_K; b++)
			q2_K_block(x + b * MCV_QK_K, (block_q2_K *)y + b, weights + b * MCV_QK_K);
		return;
	case MCV_Q3_K:
		for (int64_t b = 0; b < n / MCV_QK_K; b++)
			q3_K_block(x + b * MCV_QK_K, (block_q3_K *)y + b, weights + b * MCV_QK_K);
		return;
	case MCV_Q4_K:
		for (int64_t b = 0; b < n / MCV_QK_K; b++) {
			block_q4_K *blk = (block_q4_K *)y + b;
			k4_block(x + b * MCV_QK_K, 15, 0, &blk->d, &blk->dmin, blk->scales, L,
				 weights + b * MCV_QK_K);
			mcv_pack_q4_levels(blk->qs, L);
		}
		return;
	case MCV_Q5_K:
		for (int64_t b = 0; b < n / MCV_QK_K; b++) {
			block_q5_K *blk = (block_q5_K *)y + b;
			k4_block(x + b * MCV_QK_K, 31, 1, &blk->d, &blk->dmin, blk->scales, L,
				 weights + b * MCV_QK_K);
			mcv_pack_q5_levels(blk->qh, blk->qs, L);
		}
		return;
	case MCV_Q6_K:
		/* ggml fits Q6_K's sub-blocks with the raw importances (no
		 * sigma term), then finishes exactly like the reference. */
		for (int64_t b = 0; b < n / MCV_QK_K; b++)
			mcv_ref_quantize_q6_K_block(x + b * MCV_QK_K, (block_q6_K *)y + b,
						    weights + b * MCV_QK_K);
		return;
	default:
		/* Q8_0 and the float types have no weighted variant in ggml. */
		mcv_quantize_row_ref(type, x, y, n);
		return;
	}
}

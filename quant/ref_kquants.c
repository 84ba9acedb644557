/* Reference K-quants (Q2_K..Q6_K), bit-exact with ggml's quantize_row_*_ref
 * and dequantize_row_*.
 *
 * Every quantizer works in three steps: fit a scale (and min) per sub-block,
 * quantize those sub-block scales to 4/6/8 bits against one fp16 super-block
 * scale, then recompute every level against the *stored* (rounded) scales so
 * that dequantization reproduces the best levels for what is really in the
 * file.  A sub-block whose stored scale is zero keeps the levels from the
 * first step, which is why the fits must match ggml level for level too. */
#include "ref_fit.h"
#include "blocks.h"
#include "ref_rows.h"

#include <math.h>

/* ---- Q2_K: 16 x 16, x = d*s*q - dmin*m, q 0..3, s and m 4-bit ---- */

void mcv_q2_K_requantize(const float *x, const block_q2_K *y, uint8_t *L)
{
	for (int j = 0; j < 16; j++) {
		const float d = mcv_fp16_to_fp32(y->d) * (y->scales[j] & 0xF);
		if (!d)
			continue;
		const float dm = mcv_fp16_to_fp32(y->dmin) * (y->scales[j] >> 4);
		for (int l = 0; l < 16; l++) {
			int q = mcv_nearest_int((x[16 * j + l] + dm) / d);
			L[16 * j + l] = (uint8_t)(q < 0 ? 0 : q > 3 ? 3 : q);
		}
	}
}

void mcv_ref_quantize_q2_K(const float *x, block_q2_K *y, int64_t n)
{
	uint8_t L[MCV_QK_K], Laux[16];
	float w[16], mins[16], scales[16];

	for (int64_t b = 0; b < n / MCV_QK_K; b++, x += MCV_QK_K) {
		float max_scale = 0, max_min = 0;
		for (int j = 0; j < 16; j++) {
			for (int l = 0; l < 16; l++)
				w[l] = fabsf(x[16 * j + l]);
			scales[j] = mcv_fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j],
						   Laux, -0.5f, 0.1f, 15, 1);
			if (scales[j] > max_scale)
				max_scale = scales[j];
			if (mins[j] > max_min)
				max_min = mins[j];
		}
		if (max_scale > 0) {
			float is = 15.f / max_scale;
			for (int j = 0; j < 16; j++)
				y[b].scales[j] = (uint8_t)mcv_nearest_int(is * scales[j]);
			y[b].d = mcv_fp32_to_fp16(max_scale / 15.f);
		} else {
			memset(y[b].scales, 0, sizeof y[b].scales);
			y[b].d = mcv_fp32_to_fp16(0.f);
		}
		if (max_min > 0) {
			float is = 15.f / max_min;
			for (int j = 0; j < 16; j++)
				y[b].scales[j] |= (uint8_t)((unsigned)mcv_nearest_int(is * mins[j]) << 4);
			y[b].dmin = mcv_fp32_to_fp16(max_min / 15.f);
		} else {
			y[b].dmin = mcv_fp32_to_fp16(0.f);
		}
		mcv_q2_K_requantize(x, &y[b], L);
		mcv_pack_q2_levels(y[b].qs, L);
	}
}

void mcv_ref_dequantize_q2_K(const block_q2_K *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		const float dmin = mcv_fp16_to_fp32(x[b].dmin);
		/* Sub-block j (16 elements) sits in bytes 32*(j/8) + 16*(j%2) ..
		 * at bits 2*((j%8)/2). */
		for (int j = 0; j < 16; j++, y += 16) {
			const uint8_t *q = x[b].qs + 32 * (j / 8) + 16 * (j % 2);
			const int shift = 2 * ((j % 8) / 2);
			const uint8_t sc = x[b].scales[j];
			const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
			for (int l = 0; l < 16; l++)
				y[l] = dl * ((q[l] >> shift) & 3) - ml;
		}
	}
}

/* ---- Q3_K: 16 x 16, x = d*(s-32)*(q-4), q 0..7, s 6-bit ---- */

void mcv_q3_K_requantize(const float *x, const block_q3_K *y, int8_t *L)
{
	for (int j = 0; j < 16; j++) {
		const float d = mcv_fp16_to_fp32(y->d) * (int8_t)mcv_q3_scale(y->scales, j);
		if (!d)
			continue;
		for (int l = 0; l < 16; l++) {
			int q = mcv_nearest_int(x[16 * j + l] / d);
			L[16 * j + l] = (int8_t)((q < -4 ? -4 : q > 3 ? 3 : q) + 4);
		}
	}
}

void mcv_ref_quantize_q3_K(const float *x, block_q3_K *y, int64_t n)
{
	int8_t L[MCV_QK_K];
	float scales[16];

	for (int64_t b = 0; b < n / MCV_QK_K; b++, x += MCV_QK_K) {
		float max_scale = 0, amax = 0;
		for (int j = 0; j < 16; j++) {
			scales[j] = mcv_fit_q3(16, 4, x + 16 * j, L + 16 * j);
			if (fabsf(scales[j]) > amax) {
				amax = fabsf(scales[j]);
				max_scale = scales[j];
			}
		}
		memset(y[b].scales, 0, 12);
		if (max_scale) {
			/* Signed, like the levels: the largest maps to -32. */
			const float is = -32.f / max_scale;
			for (int j = 0; j < 16; j++) {
				int8_t l = (int8_t)mcv_nearest_int(is * scales[j]);
				l = (int8_t)(l < -32 ? -32 : l > 31 ? 31 : l);
				mcv_q3_pack_scale(y[b].scales, j, l + 32);
			}
			y[b].d = mcv_fp32_to_fp16(1 / is);
		} else {
			y[b].d = mcv_fp32_to_fp16(0.f);
		}
		mcv_q3_K_requantize(x, &y[b], L);
		mcv_pack_q3_levels(y[b].hmask, y[b].qs, L);
	}
}

void mcv_ref_dequantize_q3_K(const block_q3_K *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		for (int j = 0; j < 16; j++, y += 16) {
			/* Low bits as Q2_K; the high bit of element e is bit e/32 of
			 * hmask[e%32], and a clear bit means "minus 4". */
			const int off = 16 * (j % 2);
			const uint8_t *q = x[b].qs + 32 * (j / 8) + off;
			const uint8_t *hm = x[b].hmask + off;
			const int shift = 2 * ((j % 8) / 2), hbit = j / 2;
			const float dl = d * mcv_q3_scale(x[b].scales, j);
			for (int l = 0; l < 16; l++)
				y[l] = dl * (((q[l] >> shift) & 3) - ((hm[l] >> hbit) & 1 ? 0 : 4));
		}
	}
}

/* ---- Q4_K / Q5_K: 8 x 32, x = d*s*q - dmin*m, s and m 6-bit ---- */

void mcv_k4_requantize(const float *x, int nmax, mcv_half dd, mcv_half dmin,
		       const uint8_t scales[12], uint8_t *L)
{
	for (int j = 0; j < 8; j++) {
		uint8_t sc, m;
		mcv_k4_scale_min(scales, j, &sc, &m);
		const float d = mcv_fp16_to_fp32(dd) * sc;
		if (!d)
			continue;
		const float dm = mcv_fp16_to_fp32(dmin) * m;
		for (int l = 0; l < 32; l++) {
			int q = mcv_nearest_int((x[32 * j + l] + dm) / d);
			L[32 * j + l] = (uint8_t)(q < 0 ? 0 : q > nmax ? nmax : q);
		}
	}
}

/* The shared part of the Q4_K and Q5_K reference quantizers: fit each
 * sub-block with weights |x| + rms(x), quantize scales and mins to 6 bits,
 * and requantize the levels to 0..nmax. */
static void k4_quantize_block(const float *x, int nmax, float rmin, float rdelta,
			      int nstep, mcv_half *dd, mcv_half *dmin,
			      uint8_t scales_out[12], uint8_t *L)
{
	uint8_t Laux[32];
	float w[32], mins[8], scales[8];
	float max_scale = 0, max_min = 0;

	for (int j = 0; j < 8; j++) {
		const float *xs = x + 32 * j;
		float sum_x2 = 0;
		for (int l = 0; l < 32; l++)
			sum_x2 += xs[l] * xs[l];
		const float av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; l++)
			w[l] = av_x + fabsf(xs[l]);
		scales[j] = mcv_fit_affine(32, nmax, xs, w, L + 32 * j, &mins[j], Laux,
					   rmin, rdelta, nstep, 0);
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}
	const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
	const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	for (int j = 0; j < 8; j++) {
		/* Truncated to a byte before the cap, as in ggml. */
		uint8_t ls = (uint8_t)mcv_nearest_int(inv_scale * scales[j]);
		uint8_t lm = (uint8_t)mcv_nearest_int(inv_min * mins[j]);
		mcv_k4_pack_scale_min(scales_out, j, ls < 63 ? ls : 63, lm < 63 ? lm : 63);
	}
	*dd = mcv_fp32_to_fp16(max_scale / 63.f);
	*dmin = mcv_fp32_to_fp16(max_min / 63.f);
	mcv_k4_requantize(x, nmax, *dd, *dmin, scales_out, L);
}

void mcv_ref_quantize_q4_K(const float *x, block_q4_K *y, int64_t n)
{
	uint8_t L[MCV_QK_K];
	for (int64_t b = 0; b < n / MCV_QK_K; b++, x += MCV_QK_K) {
		k4_quantize_block(x, 15, -1.f, 0.1f, 20, &y[b].d, &y[b].dmin, y[b].scales, L);
		mcv_pack_q4_levels(y[b].qs, L);
	}
}

void mcv_ref_quantize_q5_K(const float *x, block_q5_K *y, int64_t n)
{
	uint8_t L[MCV_QK_K];
	for (int64_t b = 0; b < n / MCV_QK_K; b++, x += MCV_QK_K) {
		k4_quantize_block(x, 31, -0.5f, 0.1f, 15, &y[b].d, &y[b].dmin, y[b].scales, L);
		mcv_pack_q5_levels(y[b].qh, y[b].qs, L);
	}
}

void mcv_ref_dequantize_q4_K(const block_q4_K *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		const float dmin = mcv_fp16_to_fp32(x[b].dmin);
		/* Sub-block j: bytes 32*(j/2).., low nibbles for even j. */
		for (int j = 0; j < 8; j++, y += 32) {
			uint8_t sc, m;
			mcv_k4_scale_min(x[b].scales, j, &sc, &m);
			const float d1 = d * sc, m1 = dmin * m;
			const uint8_t *q = x[b].qs + 32 * (j / 2);
			const int shift = 4 * (j % 2);
			for (int l = 0; l < 32; l++)
				y[l] = d1 * ((q[l] >> shift) & 0xF) - m1;
		}
	}
}

void mcv_ref_dequantize_q5_K(const block_q5_K *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		const float dmin = mcv_fp16_to_fp32(x[b].dmin);
		for (int j = 0; j < 8; j++, y += 32) {
			uint8_t sc, m;
			mcv_k4_scale_min(x[b].scales, j, &sc, &m);
			const float d1 = d * sc, m1 = dmin * m;
			const uint8_t *q = x[b].qs + 32 * (j / 2);
			const int shift = 4 * (j % 2);
			for (int l = 0; l < 32; l++)
				y[l] = d1 * (((q[l] >> shift) & 0xF) + ((x[b].qh[l] >> j) & 1 ? 16 : 0)) - m1;
		}
	}
}

/* ---- Q6_K: 16 x 16, x = d*s*(q-32), q 0..63, s int8 ---- */

/* The part of Q6_K shared with the imatrix quantizer: given the per-sub-block
 * fits (scales[] and their levels in L), store the int8 scales and fp16 d and
 * requantize.  Returns 0 if the block is all zero (caller writes zeros). */
static int q6_finish_block(const float *x, const float *scales, int8_t *L, block_q6_K *y)
{
	float max_scale = 0, max_abs = 0;
	for (int j = 0; j < 16; j++) {
		if (fabsf(scales[j]) > max_abs) {
			max_abs = fabsf(scales[j]);
			max_scale = scales[j];
		}
	}
	if (max_abs < MCV_GROUP_EPS) {
		memset(y, 0, sizeof *y);
		return 0;
	}
	const float is = -128.f / max_scale;
	y->d = mcv_fp32_to_fp16(1 / is);
	for (int j = 0; j < 16; j++) {
		int l = mcv_nearest_int(is * scales[j]);
		y->scales[j] = (int8_t)(l < 127 ? l : 127);
	}
	for (int j = 0; j < 16; j++) {
		const float d = mcv_fp16_to_fp32(y->d) * y->scales[j];
		if (!d)
			continue;
		for (int l = 0; l < 16; l++) {
			int q = mcv_nearest_int(x[16 * j + l] / d);
			L[16 * j + l] = (int8_t)((q < -32 ? -32 : q > 31 ? 31 : q) + 32);
		}
	}
	mcv_pack_q6_levels(y->ql, y->qh, L);
	return 1;
}

void mcv_ref_quantize_q6_K_block(const float *x, block_q6_K *y, const float *qw)
{
	int8_t L[MCV_QK_K];
	float scales[16];
	for (int j = 0; j < 16; j++)
		scales[j] = mcv_fit_symmetric(16, 32, x + 16 * j, L + 16 * j, qw ? qw + 16 * j : NULL);
	q6_finish_block(x, scales, L, y);
}

void mcv_ref_quantize_q6_K(const float *x, block_q6_K *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++)
		mcv_ref_quantize_q6_K_block(x + b * MCV_QK_K, &y[b], NULL);
}

void mcv_ref_dequantize_q6_K(const block_q6_K *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		/* Quarter k of half h: low (k < 2) or high nibble of
		 * ql[64h + 32*(k&1) + l], bits 2k..2k+1 of qh[32h + l]. */
		for (int h = 0; h < 2; h++) {
			for (int k = 0; k < 4; k++, y += 32) {
				const uint8_t *ql = x[b].ql + 64 * h + 32 * (k & 1);
				const uint8_t *qh = x[b].qh + 32 * h;
				const int lshift = k >= 2 ? 4 : 0;
				const int8_t *sc = x[b].scales + 8 * h + 2 * k;
				for (int l = 0; l < 32; l++) {
					int q = ((ql[l] >> lshift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
					y[l] = d * sc[l / 16] * (q - 32);
				}
			}
		}
	}
}

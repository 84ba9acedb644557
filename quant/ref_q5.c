/* Reference Q5_0, Q5_1 and Q8_1, bit-exact with ggml's quantize_row_*_ref,
 * dequantize_row_* and (for Q5_0/Q5_1) its importance-weighted quantize_*.
 * llama.cpp falls back to Q5_0 / Q5_1 where a Q4_K / Q5_K tensor's rows are
 * not a multiple of 256 (e.g. expert down projections of a small model), so
 * these must match byte for byte for recipe output to be identical. */
#include "ref_fit.h"
#include "blocks.h"
#include "ref_rows.h"

#include <float.h>
#include <math.h>

/* Levels 0..31 in element order -> low nibbles (elements j and j+16 share a
 * byte) and the fifth bits, element j at bit j of qh. */
static void pack5(const uint8_t *L, uint8_t qs[16], uint8_t qh[4])
{
	uint32_t h = 0;
	for (int j = 0; j < 16; j++) {
		qs[j] = (uint8_t)((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
		h |= (uint32_t)((L[j] >> 4) & 1) << j;
		h |= (uint32_t)((L[j + 16] >> 4) & 1) << (j + 16);
	}
	memcpy(qh, &h, 4);
}

static void unpack5(const uint8_t qs[16], const uint8_t qh[4], int *q)
{
	uint32_t h;
	memcpy(&h, qh, 4);
	for (int j = 0; j < 16; j++) {
		q[j] = (qs[j] & 0xF) | (int)(((h >> j) & 1) << 4);
		q[j + 16] = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
	}
}

void mcv_ref_quantize_q5_0(const float *x, block_q5_0 *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, x += MCV_QK) {
		/* As Q4_0: the signed extreme lands on level 0 (-16). */
		float amax = 0, max = 0;
		for (int j = 0; j < MCV_QK; j++)
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		const float d = max / -16;
		const float id = d ? 1.0f / d : 0.0f;
		y[b].d = mcv_fp32_to_fp16(d);
		uint8_t L[MCV_QK];
		for (int j = 0; j < MCV_QK; j++) {
			int8_t v = (int8_t)(x[j] * id + 16.5f); /* truncation via int8 as ggml */
			L[j] = (uint8_t)(v < 31 ? v : 31);
		}
		pack5(L, y[b].qs, y[b].qh);
	}
}

void mcv_ref_quantize_q5_1(const float *x, block_q5_1 *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, x += MCV_QK) {
		float lo = FLT_MAX, hi = -FLT_MAX;
		for (int j = 0; j < MCV_QK; j++) {
			if (x[j] < lo)
				lo = x[j];
			if (x[j] > hi)
				hi = x[j];
		}
		const float d = (hi - lo) / 31;
		const float id = d ? 1.0f / d : 0.0f;
		y[b].d = mcv_fp32_to_fp16(d);
		y[b].m = mcv_fp32_to_fp16(lo);
		uint8_t L[MCV_QK];
		for (int j = 0; j < MCV_QK; j++)
			L[j] = (uint8_t)((x[j] - lo) * id + 0.5f); /* no cap, as ggml */
		pack5(L, y[b].qs, y[b].qh);
	}
}

void mcv_ref_quantize_q8_1(const float *x, block_q8_1 *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, x += MCV_QK) {
		float amax = 0;
		for (int j = 0; j < MCV_QK; j++)
			amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
		const float d = amax / 127;
		const float id = d ? 1.0f / d : 0.0f;
		y[b].d = mcv_fp32_to_fp16(d);
		int sum = 0;
		for (int j = 0; j < MCV_QK; j++) {
			y[b].qs[j] = (int8_t)roundf(x[j] * id);
			sum += y[b].qs[j];
		}
		y[b].s = mcv_fp32_to_fp16(sum * d);
	}
}

void mcv_ref_dequantize_q5_0(const block_q5_0 *x, float *y, int64_t n)
{
	int q[MCV_QK];
	for (int64_t b = 0; b < n / MCV_QK; b++, y += MCV_QK) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		unpack5(x[b].qs, x[b].qh, q);
		for (int j = 0; j < MCV_QK; j++)
			y[j] = (q[j] - 16) * d;
	}
}

void mcv_ref_dequantize_q5_1(const block_q5_1 *x, float *y, int64_t n)
{
	int q[MCV_QK];
	for (int64_t b = 0; b < n / MCV_QK; b++, y += MCV_QK) {
		const float d = mcv_fp16_to_fp32(x[b].d), m = mcv_fp16_to_fp32(x[b].m);
		unpack5(x[b].qs, x[b].qh, q);
		for (int j = 0; j < MCV_QK; j++)
			y[j] = q[j] * d + m;
	}
}

void mcv_ref_dequantize_q8_1(const block_q8_1 *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, y += MCV_QK) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		for (int j = 0; j < MCV_QK; j++)
			y[j] = x[b].qs[j] * d;
	}
}

/* Importance-weighted rows: importance qw * sqrt(sigma2 + x^2) with sigma2
 * the row's mean square (not the block's), as in ggml's Q4_0/Q4_1 family. */
static float row_sigma2(const float *x, int64_t n)
{
	float s = 0;
	for (int64_t i = 0; i < n; i++)
		s += x[i] * x[i];
	return s / n;
}

void mcv_imatrix_quantize_q5_0(const float *x, block_q5_0 *y, int64_t n, const float *qw)
{
	const float sigma2 = row_sigma2(x, n);
	float w[MCV_QK];
	int8_t L[MCV_QK];
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		const float *xb = x + b * MCV_QK, *qb = qw + b * MCV_QK;
		for (int j = 0; j < MCV_QK; j++)
			w[j] = qb[j] * sqrtf(sigma2 + xb[j] * xb[j]);
		y[b].d = mcv_fp32_to_fp16(mcv_fit_symmetric(MCV_QK, 16, xb, L, w));
		pack5((const uint8_t *)L, y[b].qs, y[b].qh);
	}
}

void mcv_imatrix_quantize_q5_1(const float *x, block_q5_1 *y, int64_t n, const float *qw)
{
	const float sigma2 = row_sigma2(x, n);
	float w[MCV_QK], neg_min;
	uint8_t L[MCV_QK], Laux[MCV_QK];
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		const float *xb = x + b * MCV_QK, *qb = qw + b * MCV_QK;
		for (int j = 0; j < MCV_QK; j++)
			w[j] = qb[j] * sqrtf(sigma2 + xb[j] * xb[j]);
		const float d = mcv_fit_affine_guarded(MCV_QK, 31, xb, w, L, &neg_min, Laux,
						       -0.9f, 0.05f, 36, 0);
		y[b].d = mcv_fp32_to_fp16(d);
		y[b].m = mcv_fp32_to_fp16(-neg_min);
		pack5(L, y[b].qs, y[b].qh);
	}
}

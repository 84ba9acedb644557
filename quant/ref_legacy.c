/* Reference Q4_0, Q8_0 and Q8_K, bit-exact with ggml's quantize_row_*_ref and
 * dequantize_row_*.  The scale d is computed and used as a float (only its
 * stored copy is rounded to fp16), exactly as ggml does: re-reading the fp16
 * here would change which level a value rounds to. */
#include "ref_fit.h"
#include "blocks.h"
#include "ref_rows.h"

#include <math.h>

void mcv_ref_quantize_q4_0(const float *x, block_q4_0 *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, x += MCV_QK) {
		/* The extreme keeps its sign: d = max/-8 maps it to level 0 (-8),
		 * the one end of the asymmetric range -8..7 that is used fully. */
		float amax = 0, max = 0;
		for (int j = 0; j < MCV_QK; j++) {
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		const float d = max / -8;
		const float id = d ? 1.0f / d : 0.0f;
		y[b].d = mcv_fp32_to_fp16(d);
		for (int j = 0; j < MCV_QK / 2; j++) {
			/* Truncation after +8.5 is round-half-up; via int8_t as
			 * ggml converts, then capped at 15 (the +8 end). */
			int8_t lo = (int8_t)(x[j] * id + 8.5f);
			int8_t hi = (int8_t)(x[j + MCV_QK / 2] * id + 8.5f);
			uint8_t q0 = (uint8_t)(lo < 15 ? lo : 15), q1 = (uint8_t)(hi < 15 ? hi : 15);
			y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
		}
	}
}

void mcv_ref_dequantize_q4_0(const block_q4_0 *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, y += MCV_QK) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		for (int j = 0; j < MCV_QK / 2; j++) {
			y[j] = ((x[b].qs[j] & 0xF) - 8) * d;
			y[j + MCV_QK / 2] = ((x[b].qs[j] >> 4) - 8) * d;
		}
	}
}

void mcv_ref_quantize_q8_0(const float *x, block_q8_0 *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, x += MCV_QK) {
		float amax = 0;
		for (int j = 0; j < MCV_QK; j++)
			amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
		const float d = amax / 127;
		const float id = d ? 1.0f / d : 0.0f;
		y[b].d = mcv_fp32_to_fp16(d);
		for (int j = 0; j < MCV_QK; j++)
			y[b].qs[j] = (int8_t)roundf(x[j] * id); /* half away from zero */
	}
}

/* Q8_0 as ggml's x86 CPU backend converts activations (its quantize_row_q8_0
 * with AVX/AVX2, which its AVX-512 builds use too): the inverse scale is
 * 127 / amax rather than 1 / d, and halves round to even.  A few elements
 * in a million land on the other side of a rounding edge than with the
 * reference (weights) rule above. */
void mcv_ref_quantize_q8_0_x86(const float *x, block_q8_0 *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, x += MCV_QK) {
		float amax = 0;
		for (int j = 0; j < MCV_QK; j++)
			amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
		const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
		y[b].d = mcv_fp32_to_fp16(amax / 127);
		for (int j = 0; j < MCV_QK; j++)
			y[b].qs[j] = (int8_t)nearbyintf(x[j] * id); /* default mode: halves to even */
	}
}

void mcv_ref_dequantize_q8_0(const block_q8_0 *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK; b++, y += MCV_QK) {
		const float d = mcv_fp16_to_fp32(x[b].d);
		for (int j = 0; j < MCV_QK; j++)
			y[j] = x[b].qs[j] * d;
	}
}

void mcv_ref_quantize_q8_K(const float *x, block_q8_K *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++, x += MCV_QK_K) {
		float amax = 0, max = 0;
		for (int j = 0; j < MCV_QK_K; j++) {
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		if (!amax) {
			/* ggml leaves bsums untouched here; we write their true
			 * value, zero, so the output never depends on old memory. */
			memset(&y[b], 0, sizeof y[b]);
			continue;
		}
		/* -127 rather than -128 keeps levels symmetric (ggml changed
		 * this for its IQ kernels; the bytes must follow). */
		const float iscale = -127.f / max;
		for (int j = 0; j < MCV_QK_K; j++) {
			int v = mcv_nearest_int(iscale * x[j]);
			y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
		}
		for (int g = 0; g < MCV_QK_K / 16; g++) {
			int sum = 0;
			for (int j = 0; j < 16; j++)
				sum += y[b].qs[16 * g + j];
			y[b].bsums[g] = (int16_t)sum;
		}
		y[b].d = 1 / iscale;
	}
}

void mcv_ref_dequantize_q8_K(const block_q8_K *x, float *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++, y += MCV_QK_K)
		for (int j = 0; j < MCV_QK_K; j++)
			y[j] = x[b].d * x[b].qs[j];
}

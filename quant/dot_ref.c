/* Scalar dot products: the oracles the fast kernels are tested against.
 *
 * They follow ggml's arithmetic: the quantized types sum integer products
 * exactly per block (scaled by the integer sub-block scales), then apply the
 * float block scales once per block, and the K-quant min terms come from the
 * activation's Q8_K bsums.  Only float rounding separates them from ggml.
 * The float types accumulate in double, like ggml's portable path. */
#include "dot_kernels.h"

float mcv_dot_f32_ref(int64_t n, const void *w, const void *xq)
{
	const float *a = w, *b = xq;
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return (float)s;
}

/* Products of two halves (or two bf16) are exact in float. */
float mcv_dot_f16_ref(int64_t n, const void *w, const void *xq)
{
	const mcv_half *a = w, *b = xq;
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += mcv_fp16_to_fp32(a[i]) * mcv_fp16_to_fp32(b[i]);
	return (float)s;
}

float mcv_dot_bf16_ref(int64_t n, const void *w, const void *xq)
{
	const uint16_t *a = w, *b = xq;
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += mcv_bf16_to_fp32(a[i]) * mcv_bf16_to_fp32(b[i]);
	return (float)s;
}

float mcv_dot_q4_0_ref(int64_t n, const void *w, const void *xq)
{
	const block_q4_0 *x = w;
	const block_q8_0 *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		int isum = 0;
		for (int j = 0; j < MCV_QK / 2; j++) {
			isum += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j];
			isum += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + MCV_QK / 2];
		}
		sum += isum * mcv_fp16_to_fp32(x[b].d) * mcv_fp16_to_fp32(y[b].d);
	}
	return sum;
}

float mcv_dot_q8_0_ref(int64_t n, const void *w, const void *xq)
{
	const block_q8_0 *x = w;
	const block_q8_0 *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		int isum = 0;
		for (int j = 0; j < MCV_QK; j++)
			isum += x[b].qs[j] * y[b].qs[j];
		sum += isum * (mcv_fp16_to_fp32(x[b].d) * mcv_fp16_to_fp32(y[b].d));
	}
	return sum;
}

float mcv_dot_q2_K_ref(int64_t n, const void *w, const void *xq)
{
	const block_q2_K *x = w;
	const block_q8_K *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const int8_t *q8 = y[b].qs;
		int isum = 0, msum = 0;
		for (int s = 0; s < 16; s++)
			msum += y[b].bsums[s] * (x[b].scales[s] >> 4);
		/* Each 128-element half: 32 bytes of qs, four 2-bit planes of 32
		 * elements, each plane two sub-blocks of 16. */
		for (int h = 0; h < 2; h++) {
			const uint8_t *q2 = x[b].qs + 32 * h;
			for (int p = 0; p < 4; p++) {
				for (int g = 0; g < 2; g++) {
					int s = 8 * h + 2 * p + g, acc = 0;
					for (int l = 16 * g; l < 16 * g + 16; l++)
						acc += ((q2[l] >> (2 * p)) & 3) * q8[l];
					isum += (x[b].scales[s] & 0xF) * acc;
				}
				q8 += 32;
			}
		}
		float d = y[b].d * mcv_fp16_to_fp32(x[b].d);
		float dmin = y[b].d * mcv_fp16_to_fp32(x[b].dmin);
		sum += d * isum - dmin * msum;
	}
	return sum;
}

float mcv_dot_q3_K_ref(int64_t n, const void *w, const void *xq)
{
	const block_q3_K *x = w;
	const block_q8_K *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		int8_t sc[16];
		mcv_q3k_scales(x[b].scales, sc);
		const int8_t *q8 = y[b].qs;
		int isum = 0;
		for (int h = 0; h < 2; h++) {
			const uint8_t *q3 = x[b].qs + 32 * h;
			for (int p = 0; p < 4; p++) {
				uint8_t hbit = (uint8_t)(1u << (4 * h + p));
				for (int g = 0; g < 2; g++) {
					int acc = 0;
					for (int l = 16 * g; l < 16 * g + 16; l++) {
						int q = ((q3[l] >> (2 * p)) & 3) - ((x[b].hmask[l] & hbit) ? 0 : 4);
						acc += q * q8[l];
					}
					isum += sc[8 * h + 2 * p + g] * acc;
				}
				q8 += 32;
			}
		}
		sum += mcv_fp16_to_fp32(x[b].d) * y[b].d * isum;
	}
	return sum;
}

float mcv_dot_q4_K_ref(int64_t n, const void *w, const void *xq)
{
	const block_q4_K *x = w;
	const block_q8_K *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		int isum = 0, msum = 0;
		for (int j = 0; j < 8; j++) {
			int sc, mn, acc = 0;
			mcv_k4_scale_min(j, x[b].scales, &sc, &mn);
			const uint8_t *q4 = x[b].qs + 32 * (j / 2);
			const int8_t *q8 = y[b].qs + 32 * j;
			for (int l = 0; l < 32; l++)
				acc += ((j & 1) ? (q4[l] >> 4) : (q4[l] & 0xF)) * q8[l];
			isum += sc * acc;
			msum += mn * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
		}
		float d = y[b].d * mcv_fp16_to_fp32(x[b].d);
		float dmin = y[b].d * mcv_fp16_to_fp32(x[b].dmin);
		sum += d * isum - dmin * msum;
	}
	return sum;
}

float mcv_dot_q5_K_ref(int64_t n, const void *w, const void *xq)
{
	const block_q5_K *x = w;
	const block_q8_K *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		int isum = 0, msum = 0;
		for (int j = 0; j < 8; j++) {
			int sc, mn, acc = 0;
			mcv_k4_scale_min(j, x[b].scales, &sc, &mn);
			const uint8_t *q4 = x[b].qs + 32 * (j / 2);
			const int8_t *q8 = y[b].qs + 32 * j;
			for (int l = 0; l < 32; l++) {
				int q = (j & 1) ? (q4[l] >> 4) : (q4[l] & 0xF);
				q |= ((x[b].qh[l] >> j) & 1) << 4;
				acc += q * q8[l];
			}
			isum += sc * acc;
			msum += mn * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
		}
		float d = y[b].d * mcv_fp16_to_fp32(x[b].d);
		float dmin = y[b].d * mcv_fp16_to_fp32(x[b].dmin);
		sum += d * isum - dmin * msum;
	}
	return sum;
}

float mcv_dot_q6_K_ref(int64_t n, const void *w, const void *xq)
{
	const block_q6_K *x = w;
	const block_q8_K *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		int isum = 0;
		/* Each 128-element half: 64 bytes of ql (low nibbles: elements
		 * 0..63, high nibbles: 64..127), 32 bytes of qh (2 bits each for
		 * elements l, l+32, l+64, l+96). */
		for (int h = 0; h < 2; h++) {
			const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
			const int8_t *sc = x[b].scales + 8 * h;
			const int8_t *q8 = y[b].qs + 128 * h;
			for (int g = 0; g < 8; g++) { /* sub-block of 16 */
				int quarter = g / 2, acc = 0;
				for (int l = 16 * (g & 1); l < 16 * (g & 1) + 16; l++) {
					int lo = (quarter & 1) ? ql[l + 32] : ql[l];
					lo = (quarter & 2) ? (lo >> 4) : (lo & 0xF);
					int q = (lo | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
					acc += q * q8[32 * quarter + l];
				}
				isum += sc[2 * quarter + (g & 1)] * acc;
			}
		}
		sum += mcv_fp16_to_fp32(x[b].d) * y[b].d * isum;
	}
	return sum;
}

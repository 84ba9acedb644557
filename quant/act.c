/* Activation conversion to the vec_dot types (Q8_0, Q8_K, F16, BF16), with
 * SIMD, producing the same bytes as the reference quantizer: the same float
 * operations in the same order per element, only several elements at once. */
#include "dot_kernels.h"
#include "dot_simd.h"

#include <math.h>

#ifdef MCV_DOT_AVX2

static inline float hmax8(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

/* Four int32 vectors of values in int8 range -> 32 bytes in element order. */
static inline void pack_i8x32(__m256i a, __m256i b, __m256i c, __m256i d, int8_t *out)
{
	__m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
	__m256i v = _mm256_packs_epi16(ab, cd);
	/* The in-lane packs leave the 4-byte groups as a0 b0 c0 d0 a1 b1 c1 d1
	 * (a0 = first half of a): gather them back in element order. */
	v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm256_storeu_si256((__m256i *)out, v);
}

/* roundf: to nearest, halves away from zero.  |v| - trunc|v| is exact. */
static inline __m256i round_away(__m256 v)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	__m256 a = _mm256_andnot_ps(sign, v);
	__m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
	__m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
				  _mm256_set1_ps(1.0f));
	t = _mm256_or_ps(_mm256_add_ps(t, up), _mm256_and_ps(v, sign));
	return _mm256_cvttps_epi32(t);
}

static void quantize_q8_0(const float *x, block_q8_0 *y, int64_t n)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	for (int64_t b = 0; b < n / MCV_QK; b++, x += MCV_QK) {
		__m256 v[4];
		__m256 m = _mm256_setzero_ps();
		for (int k = 0; k < 4; k++) {
			v[k] = _mm256_loadu_ps(x + 8 * k);
			m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
		}
		const float amax = hmax8(m);
		const float d = amax / 127;
		const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
		y[b].d = mcv_fp32_to_fp16(d);
		const __m256 idv = _mm256_set1_ps(id);
		__m256i q[4];
		for (int k = 0; k < 4; k++)
			q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], idv),
								  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
		pack_i8x32(q[0], q[1], q[2], q[3], y[b].qs);
	}
}

static void quantize_q8_K(const float *x, block_q8_K *y, int64_t n)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	for (int64_t b = 0; b < n / MCV_QK_K; b++, x += MCV_QK_K) {
		__m256 m = _mm256_setzero_ps();
		for (int k = 0; k < MCV_QK_K; k += 8)
			m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
		const float amax = hmax8(m);
		if (!amax) {
			memset(&y[b], 0, sizeof y[b]);
			continue;
		}
		/* The reference keeps the signed value of the first element of
		 * largest magnitude. */
		float max = 0;
		const __m256 mv = _mm256_set1_ps(amax);
		for (int k = 0; k < MCV_QK_K; k += 8) {
			int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)),
								   mv, _CMP_EQ_OQ));
			if (hit) {
				max = x[k + __builtin_ctz((unsigned)hit)];
				break;
			}
		}
		const float iscale = -127.f / max;
		const __m256 is = _mm256_set1_ps(iscale);
		const __m256i lim = _mm256_set1_epi32(127);
		for (int k = 0; k < MCV_QK_K; k += 32) {
			__m256i q[4];
			for (int j = 0; j < 4; j++)
				q[j] = _mm256_min_epi32(lim, _mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(x + k + 8 * j))));
			pack_i8x32(q[0], q[1], q[2], q[3], y[b].qs + k);
		}
		for (int g = 0; g < MCV_QK_K / 16; g++) {
			__m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y[b].qs + 16 * g)));
			y[b].bsums[g] = (int16_t)mcv_hsum8i(_mm256_madd_epi16(w, _mm256_set1_epi16(1)));
		}
		y[b].d = 1 / iscale;
	}
}

static void convert_f16(const float *x, mcv_half *y, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
		_mm_storeu_si128((__m128i *)(y + i), h);
		if (nan) /* NaNs: the reference's canonical quiet NaN */
			for (int k = 0; k < 8; k++)
				if (nan >> k & 1)
					y[i + k] = mcv_fp32_to_fp16(x[i + k]);
	}
	for (; i < n; i++)
		y[i] = mcv_fp32_to_fp16(x[i]);
}

static void convert_bf16(const float *x, uint16_t *y, int64_t n)
{
	int64_t i = 0;
	const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
	const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	for (; i + 16 <= n; i += 16) {
		__m256i r[2];
		for (int k = 0; k < 2; k++) {
			__m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * k));
			__m256i rn = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias),
									 _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
			__m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
			__m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
			r[k] = _mm256_blendv_epi8(rn, qn, isnan);
		}
		__m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
		_mm256_storeu_si256((__m256i *)(y + i), p);
	}
	for (; i < n; i++)
		y[i] = mcv_fp32_to_bf16(x[i]);
}

void mcv_quantize_row(int type, const float *x, void *y, int64_t n)
{
	switch (type) {
	case MCV_Q8_0: quantize_q8_0(x, y, n); return;
	case MCV_Q8_K: quantize_q8_K(x, y, n); return;
	case MCV_F16: convert_f16(x, y, n); return;
	case MCV_BF16: convert_bf16(x, y, n); return;
	case MCV_F32: memcpy(y, x, (size_t)n * sizeof(float)); return;
	default: mcv_quantize_row_ref(type, x, y, n); return;
	}
}

#else

void mcv_quantize_row(int type, const float *x, void *y, int64_t n)
{
	if (type == MCV_F32)
		memcpy(y, x, (size_t)n * sizeof(float));
	else
		mcv_quantize_row_ref(type, x, y, n);
}

#endif

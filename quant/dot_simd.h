/* Private SIMD helpers of the quantized dot kernels (AVX2, with AVX-512 VNNI
 * on 256-bit vectors when the build has it). */
#ifndef MCV_DOT_SIMD_H
#define MCV_DOT_SIMD_H

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MCV_DOT_AVX2 1
#include <immintrin.h>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define MCV_DOT_VNNI 1
#endif

/* acc + sum of u8*s8 over each group of 4 bytes, per int32 lane.  Without
 * VNNI the int16 pair sums cannot overflow as long as u <= 128 and |s| <= 127
 * or u <= 63 (every use here). */
static inline __m256i mcv_dpbusd(__m256i acc, __m256i u, __m256i s)
{
#ifdef MCV_DOT_VNNI
	return _mm256_dpbusd_epi32(acc, u, s);
#else
	__m256i p = _mm256_maddubs_epi16(u, s);
	return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/* acc + sum of int16 pairs a*b per int32 lane. */
static inline __m256i mcv_dpwssd(__m256i acc, __m256i a, __m256i b)
{
#ifdef MCV_DOT_VNNI
	return _mm256_dpwssd_epi32(acc, a, b);
#else
	return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

static inline float mcv_hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline int mcv_hsum8i(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
	return _mm_cvtsi128_si32(s);
}

#endif
#endif

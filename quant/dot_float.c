/* Fast dots of the float weight types: F32.F32, F16.F16, BF16.BF16.
 * Products are exact for the half types; sums run in float over 32 lanes
 * (as ggml's SIMD path), then one horizontal sum. */
#include "dot_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* Four independent accumulators hide the FMA latency. */
#define FLOAT_DOT(NAME, T, LOAD)                                                   \
	float NAME(int64_t n, const void *w, const void *xq)                       \
	{                                                                          \
		const T *a = w, *b = xq;                                           \
		__m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;        \
		int64_t i = 0;                                                     \
		for (; i + 32 <= n; i += 32) {                                     \
			s0 = _mm256_fmadd_ps(LOAD(a + i), LOAD(b + i), s0);        \
			s1 = _mm256_fmadd_ps(LOAD(a + i + 8), LOAD(b + i + 8), s1); \
			s2 = _mm256_fmadd_ps(LOAD(a + i + 16), LOAD(b + i + 16), s2); \
			s3 = _mm256_fmadd_ps(LOAD(a + i + 24), LOAD(b + i + 24), s3); \
		}                                                                  \
		for (; i + 8 <= n; i += 8)                                         \
			s0 = _mm256_fmadd_ps(LOAD(a + i), LOAD(b + i), s0);        \
		float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))); \
		for (; i < n; i++)                                                 \
			s += TAIL(a[i]) * TAIL(b[i]);                              \
		return s;                                                          \
	}

static inline __m256 load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load_f16(const mcv_half *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 load_bf16(const uint16_t *p)
{
	__m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define TAIL(v) (v)
FLOAT_DOT(mcv_dot_f32_fast, float, load_f32)
#undef TAIL
#define TAIL(v) mcv_h2f(v)
FLOAT_DOT(mcv_dot_f16_fast, mcv_half, load_f16)
#undef TAIL
#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* vdpbf16ps: pairs of bf16 products summed into float lanes (subnormal
 * inputs count as zero, as in ggml's AVX512-BF16 path). */
float mcv_dot_bf16_fast(int64_t n, const void *w, const void *xq)
{
	const uint16_t *a = w, *b = xq;
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	int64_t i = 0;
	for (; i + 64 <= n; i += 64) {
		s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_loadu_si512(a + i), (__m512bh)_mm512_loadu_si512(b + i));
		s1 = _mm512_dpbf16_ps(s1, (__m512bh)_mm512_loadu_si512(a + i + 32),
				      (__m512bh)_mm512_loadu_si512(b + i + 32));
	}
	for (; i + 32 <= n; i += 32)
		s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_loadu_si512(a + i), (__m512bh)_mm512_loadu_si512(b + i));
	float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
	for (; i < n; i++)
		s += mcv_bf16_to_fp32(a[i]) * mcv_bf16_to_fp32(b[i]);
	return s;
}
#else
#define TAIL(v) mcv_bf16_to_fp32(v)
FLOAT_DOT(mcv_dot_bf16_fast, uint16_t, load_bf16)
#undef TAIL
#endif

#else

float mcv_dot_f32_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_f32_ref(n, w, xq); }
float mcv_dot_f16_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_f16_ref(n, w, xq); }
float mcv_dot_bf16_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_bf16_ref(n, w, xq); }

#endif

/* Fast dots of the float weight types: F32.F32, F16.F16, BF16.BF16.
 * Products are exact for the half types; sums run in float vector lanes
 * (as ggml's SIMD path), then one horizontal sum. */
#include "dot_kernels.h"

/* quant.h: mcv_f32_single_order (tests) */
static int single_order;
void mcv_f32_single_order(int on) { single_order = on; }
int mcv_f32_single(void) { return single_order; }

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* F32 and F16: one vector accumulator per (row, activation) pair, so the
 * same per-pair operations serve a single dot, four rows at once (decode)
 * and 4x4 tiles (prefill): results agree bit for bit across them.  A single
 * dot is then bound by the FMA latency, which is why decode always goes
 * through four rows. */
#if defined(__AVX512F__)
typedef __m512 fvec;
#define FL 16
static inline fvec fv_zero(void) { return _mm512_setzero_ps(); }
static inline fvec fv_fma(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
static inline float fv_sum(fvec v) { return _mm512_reduce_add_ps(v); }
static inline fvec fv_load(int type, const void *p, int64_t i)
{
	if (type == MCV_F32)
		return _mm512_loadu_ps((const float *)p + i);
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const mcv_half *)p + i)));
}
#else
typedef __m256 fvec;
#define FL 8
static inline fvec fv_zero(void) { return _mm256_setzero_ps(); }
static inline fvec fv_fma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
static inline float fv_sum(fvec v) { return hsum8(v); }
static inline fvec fv_load(int type, const void *p, int64_t i)
{
	if (type == MCV_F32)
		return _mm256_loadu_ps((const float *)p + i);
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const mcv_half *)p + i)));
}
#endif

static inline float fv_scalar(int type, const void *p, int64_t i)
{
	return type == MCV_F32 ? ((const float *)p)[i] : mcv_h2f(((const mcv_half *)p)[i]);
}

static inline __attribute__((always_inline)) void
float_tile(const int type, const int R, const int C, int64_t n, const void *w, size_t stride,
	   const void *const *x, float *out, size_t ldo)
{
	fvec acc[4][4]; /* R, C <= 4 */
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
#pragma GCC unroll 4
		for (int c = 0; c < C; c++)
			acc[r][c] = fv_zero();
	int64_t i = 0;
	for (; i + FL <= n; i += FL) {
		fvec xv[4];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++)
			xv[c] = fv_load(type, x[c], i);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const fvec wv = fv_load(type, (const char *)w + r * stride, i);
#pragma GCC unroll 4
			for (int c = 0; c < C; c++)
				acc[r][c] = fv_fma(wv, xv[c], acc[r][c]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			const void *wr = (const char *)w + r * stride;
			float s = fv_sum(acc[r][c]);
			for (int64_t k = i; k < n; k++)
				s += fv_scalar(type, wr, k) * fv_scalar(type, x[c], k);
			out[r + c * ldo] = s;
		}
}

#define FTILE_FNS(T, NAME)                                                                         \
	static void NAME##_t11(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l) \
	{ float_tile(T, 1, 1, n, w, s, x, o, l); }                                                 \
	static void NAME##_t41(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l) \
	{ float_tile(T, 4, 1, n, w, s, x, o, l); }                                                 \
	static void NAME##_t14(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l) \
	{ float_tile(T, 1, 4, n, w, s, x, o, l); }                                                 \
	static void NAME##_t44(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l) \
	{ float_tile(T, 4, 4, n, w, s, x, o, l); }                                                 \
	static const mcv_tiles NAME##_tiles = { NAME##_t11, NAME##_t41, NAME##_t14, NAME##_t44 };     \
	float mcv_dot_##NAME##_fast(int64_t n, const void *w, const void *xq)                      \
	{                                                                                          \
		float o;                                                                           \
		NAME##_t11(n, w, 0, &xq, &o, 1);                                                   \
		return o;                                                                          \
	}                                                                                          \
	void mcv_dot_##NAME##_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out) \
	{ NAME##_t41(n, w, stride, &xq, out, 1); }

FTILE_FNS(MCV_F32, f32_tile)
FTILE_FNS(MCV_F16, f16)

#if defined(__AVX512F__)
/* F32 in ggml's vec_dot order (the one llama.cpp's CPU backend takes for a
 * single token, and for any matrix its tiled GEMM declines): four 16-lane
 * accumulators over 64-element steps, folded as (a0 + a2) + (a1 + a3), one
 * horizontal sum, then the tail one float at a time.  The tiles above (one
 * accumulator per element) are the order of its tiled GEMM, which serves
 * two or more tokens on matrices of a multiple of 4 rows and 16 columns
 * (mcv_f32_tiled). */
static inline float f32_dot4acc(int64_t n, const float *a, const float *b)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
	int64_t i = 0;
	for (; i + 64 <= n; i += 64) {
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
		s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
		s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
		s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
	}
	float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3)));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

float mcv_dot_f32_fast(int64_t n, const void *w, const void *xq) { return f32_dot4acc(n, w, xq); }

void mcv_dot_f32_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = f32_dot4acc(n, (const float *)((const char *)w + r * stride), xq);
}

int mcv_f32_tiled(int64_t nrows, int64_t n) { return !single_order && nrows > 0 && nrows % 4 == 0 && n % 16 == 0; }
#else
/* Without AVX-512 the single-row and tiled orders are the same kernel
 * (ggml's AVX2 orders are not reproduced here). */
float mcv_dot_f32_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_f32_tile_fast(n, w, xq); }
void mcv_dot_f32_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	mcv_dot_f32_tile_rows4(n, w, stride, xq, out);
}
int mcv_f32_tiled(int64_t nrows, int64_t n)
{
	(void)nrows;
	(void)n;
	return 1;
}
#endif

const mcv_tiles *mcv_tiles_float(int type)
{
	return type == MCV_F32 ? &f32_tile_tiles : type == MCV_F16 ? &f16_tiles : NULL;
}

/* BF16 */
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
/* bf16 -> f32 is a 16-bit shift; four accumulators hide the FMA latency. */
static inline __m256 load_bf16(const uint16_t *p)
{
	__m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

float mcv_dot_bf16_fast(int64_t n, const void *w, const void *xq)
{
	const uint16_t *a = w, *b = xq;
	__m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
	int64_t i = 0;
	for (; i + 32 <= n; i += 32) {
		s0 = _mm256_fmadd_ps(load_bf16(a + i), load_bf16(b + i), s0);
		s1 = _mm256_fmadd_ps(load_bf16(a + i + 8), load_bf16(b + i + 8), s1);
		s2 = _mm256_fmadd_ps(load_bf16(a + i + 16), load_bf16(b + i + 16), s2);
		s3 = _mm256_fmadd_ps(load_bf16(a + i + 24), load_bf16(b + i + 24), s3);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(load_bf16(a + i), load_bf16(b + i), s0);
	float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
	for (; i < n; i++)
		s += mcv_bf16_to_fp32(a[i]) * mcv_bf16_to_fp32(b[i]);
	return s;
}
#endif

#else

float mcv_dot_f32_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_f32_ref(n, w, xq); }
float mcv_dot_f16_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_f16_ref(n, w, xq); }
void mcv_dot_f32_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_f32_ref(n, (const char *)w + r * stride, xq);
}
void mcv_dot_f16_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_f16_ref(n, (const char *)w + r * stride, xq);
}
const mcv_tiles *mcv_tiles_float(int type)
{
	(void)type;
	return NULL;
}
int mcv_f32_tiled(int64_t nrows, int64_t n)
{
	(void)nrows;
	(void)n;
	return 1;
}
float mcv_dot_bf16_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_bf16_ref(n, w, xq); }

#endif

/* Float kernels of the vision tower shared by the exact path (vision_vit.c)
 * and the fast path (vision_fast.c): row sums, the 8-lane exp / GELU /
 * softmax, the register-blocked f32 product.  Each computes an element the
 * same way wherever a thread split falls. */
#ifndef MCV_VISION_KERN_H
#define MCV_VISION_KERN_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* y[0..n) += x[0..n), vectorized (gcc -O2 leaves the plain loop scalar). */
static inline void add_to(float *y, const float *x, int64_t n)
{
	int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
	for (; j + 8 <= n; j += 8)
		_mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_loadu_ps(x + j)));
#endif
	for (; j < n; j++)
		y[j] += x[j];
}

/* Sum of x[0..n) and of (x - mean)^2: eight float lanes, then the lanes
 * and the tail in double.  A fixed order for a given n. */
static inline double row_sum(const float *x, int64_t n, float mean, int sq)
{
	int64_t j = 0;
	double s = 0;
#if defined(__AVX2__) && defined(__FMA__)
	__m256 acc = _mm256_setzero_ps();
	const __m256 mv = _mm256_set1_ps(mean);
	for (; j + 8 <= n; j += 8) {
		__m256 d = _mm256_loadu_ps(x + j);
		if (sq) {
			d = _mm256_sub_ps(d, mv);
			acc = _mm256_fmadd_ps(d, d, acc);
		} else {
			acc = _mm256_add_ps(acc, d);
		}
	}
	float a[8];
	_mm256_storeu_ps(a, acc);
	for (int l = 0; l < 8; l++)
		s += a[l];
#endif
	for (; j < n; j++) {
		const double d = sq ? (double)x[j] - mean : x[j];
		s += sq ? d * d : d;
	}
	return s;
}

/* expf for eight lanes: 2^n e^r with |r| <= ln2/2 and a degree-6 Taylor
 * polynomial (error ~2 ulp), so softmax and GELU need no libm call per
 * element.  Every element of a row goes through this same code (tails are
 * padded), so a value does not depend on where a thread split fell. */
#if defined(__AVX2__) && defined(__FMA__)
typedef __m256 v8;
static inline v8 v8_exp(v8 x)
{
	x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
	const v8 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
				     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	v8 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
	v8 p = _mm256_set1_ps(1.0f / 720);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 0.5 u (1 + tanh(z)) written as u / (1 + exp(-2z)): the same function. */
static inline v8 v8_gelu_tanh(v8 u)
{
	const v8 c2 = _mm256_set1_ps(2.0f * 0.7978845608028654f); /* 2 sqrt(2/pi) */
	const v8 u3 = _mm256_mul_ps(_mm256_mul_ps(u, u), u);
	const v8 z = _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), u3, u);
	const v8 t = v8_exp(_mm256_mul_ps(_mm256_set1_ps(-1.0f), _mm256_mul_ps(c2, z)));
	return _mm256_div_ps(u, _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}

static inline void gelu_span(float *x, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(x + i, v8_gelu_tanh(_mm256_loadu_ps(x + i)));
	if (i < n) {
		float t[8] = {0};
		memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
		_mm256_storeu_ps(t, v8_gelu_tanh(_mm256_loadu_ps(t)));
		memcpy(x + i, t, sizeof(float) * (size_t)(n - i));
	}
}

static inline void softmax_row(float *s, int n, float scale)
{
	if (n < 8) {
		float t[8];
		for (int j = 0; j < 8; j++)
			t[j] = j < n ? s[j] : -INFINITY;
		v8 x = _mm256_mul_ps(_mm256_loadu_ps(t), _mm256_set1_ps(scale));
		float a[8];
		_mm256_storeu_ps(a, x);
		float mx = -INFINITY;
		for (int j = 0; j < n; j++)
			mx = a[j] > mx ? a[j] : mx;
		_mm256_storeu_ps(a, v8_exp(_mm256_sub_ps(x, _mm256_set1_ps(mx))));
		double sum = 0;
		for (int j = 0; j < n; j++)
			sum += a[j];
		const float inv = (float)(1.0 / sum);
		for (int j = 0; j < n; j++)
			s[j] = a[j] * inv;
		return;
	}
	const v8 sc = _mm256_set1_ps(scale);
	const int n8 = n & ~7;
	/* the tail is handled as the last (overlapping) full vector, masked in the sum */
	v8 m = _mm256_set1_ps(-INFINITY);
	for (int j = 0; j < n8; j += 8)
		m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
	m = _mm256_max_ps(m, _mm256_loadu_ps(s + n - 8));
	float a[8];
	_mm256_storeu_ps(a, m);
	float mx = a[0];
	for (int j = 1; j < 8; j++)
		mx = a[j] > mx ? a[j] : mx;
	/* scale > 0, so max(scale * s) = scale * max(s) */
	const v8 off = _mm256_set1_ps(mx * scale);
	v8 acc = _mm256_setzero_ps();
	float tail[8];
	if (n8 < n)
		_mm256_storeu_ps(tail, v8_exp(_mm256_fmsub_ps(_mm256_loadu_ps(s + n - 8), sc, off)));
	for (int j = 0; j < n8; j += 8) {
		const v8 e = v8_exp(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), sc, off));
		acc = _mm256_add_ps(acc, e);
		_mm256_storeu_ps(s + j, e);
	}
	_mm256_storeu_ps(a, acc);
	double sum = 0;
	for (int j = 0; j < 8; j++)
		sum += a[j];
	for (int j = n8; j < n; j++) {
		s[j] = tail[j - (n - 8)];
		sum += s[j];
	}
	const v8 inv = _mm256_set1_ps((float)(1.0 / sum));
	for (int j = 0; j < n8; j += 8)
		_mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
	for (int j = n8; j < n; j++)
		s[j] *= (float)(1.0 / sum);
}
#else
static inline void gelu_span(float *x, int64_t n)
{
	const float c2 = 2.0f * 0.7978845608028654f;
	for (int64_t i = 0; i < n; i++) {
		const float u = x[i];
		x[i] = u / (1.0f + expf(-c2 * (u + 0.044715f * u * u * u)));
	}
}

static inline void softmax_row(float *s, int n, float scale)
{
	float mx = -INFINITY;
	for (int j = 0; j < n; j++) {
		s[j] *= scale;
		if (s[j] > mx)
			mx = s[j];
	}
	double sum = 0;
	for (int j = 0; j < n; j++) {
		s[j] = expf(s[j] - mx);
		sum += s[j];
	}
	const float inv = (float)(1.0 / sum);
	for (int j = 0; j < n; j++)
		s[j] *= inv;
}
#endif

/* C[i][j] = sum over k in order of A[i][k] B[k][j] (one fma per step), for
 * i < m, j < n: B row-major with its columns contiguous, so a vector of C
 * needs no horizontal sum.  Every element is the same fma chain whichever
 * path (vector or tail) computes it. */
static inline __attribute__((always_inline)) void gemm_rows(int R, int n, int K, const float *A, int lda,
							    const float *B, int ldb, float *C, int ldc)
{
	int j = 0;
#if defined(__AVX512F__)
	/* 32 columns a step, the last < 32 under masks: no scalar tail (a
	 * scalar fma chain is latency-bound, and the key count n is rarely a
	 * multiple of 16). */
	for (; j < n; j += 32) {
		const int left = n - j;
		const __mmask16 k0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
		const __mmask16 k1 = left >= 32 ? (__mmask16)0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
		__m512 c[6][2];
#pragma GCC unroll 6
		for (int r = 0; r < R; r++)
			c[r][0] = c[r][1] = _mm512_setzero_ps();
		for (int k = 0; k < K; k++) {
			const __m512 b0 = _mm512_maskz_loadu_ps(k0, B + (size_t)k * ldb + j);
			const __m512 b1 = _mm512_maskz_loadu_ps(k1, B + (size_t)k * ldb + j + 16);
#pragma GCC unroll 6
			for (int r = 0; r < R; r++) {
				const __m512 av = _mm512_set1_ps(A[(size_t)r * lda + k]);
				c[r][0] = _mm512_fmadd_ps(av, b0, c[r][0]);
				c[r][1] = _mm512_fmadd_ps(av, b1, c[r][1]);
			}
		}
#pragma GCC unroll 6
		for (int r = 0; r < R; r++) {
			_mm512_mask_storeu_ps(C + (size_t)r * ldc + j, k0, c[r][0]);
			_mm512_mask_storeu_ps(C + (size_t)r * ldc + j + 16, k1, c[r][1]);
		}
	}
#elif defined(__AVX2__) && defined(__FMA__)
	for (; j + 16 <= n; j += 16) {
		__m256 c[6][2];
#pragma GCC unroll 6
		for (int r = 0; r < R; r++)
			c[r][0] = c[r][1] = _mm256_setzero_ps();
		for (int k = 0; k < K; k++) {
			const __m256 b0 = _mm256_loadu_ps(B + (size_t)k * ldb + j);
			const __m256 b1 = _mm256_loadu_ps(B + (size_t)k * ldb + j + 8);
#pragma GCC unroll 6
			for (int r = 0; r < R; r++) {
				const __m256 av = _mm256_broadcast_ss(A + (size_t)r * lda + k);
				c[r][0] = _mm256_fmadd_ps(av, b0, c[r][0]);
				c[r][1] = _mm256_fmadd_ps(av, b1, c[r][1]);
			}
		}
#pragma GCC unroll 6
		for (int r = 0; r < R; r++) {
			_mm256_storeu_ps(C + (size_t)r * ldc + j, c[r][0]);
			_mm256_storeu_ps(C + (size_t)r * ldc + j + 8, c[r][1]);
		}
	}
#endif
	for (; j < n; j++)
		for (int r = 0; r < R; r++) {
			float acc = 0;
			for (int k = 0; k < K; k++)
				acc = fmaf(A[(size_t)r * lda + k], B[(size_t)k * ldb + j], acc);
			C[(size_t)r * ldc + j] = acc;
		}
}

static inline void gemm_nn(int m, int n, int K, const float *A, int lda, const float *B, int ldb, float *C,
		    int ldc)
{
	int i = 0;
	for (; i + 6 <= m; i += 6)
		gemm_rows(6, n, K, A + (size_t)i * lda, lda, B, ldb, C + (size_t)i * ldc, ldc);
	for (; i < m; i++)
		gemm_rows(1, n, K, A + (size_t)i * lda, lda, B, ldb, C + (size_t)i * ldc, ldc);
}

/* LayerNorm of one row: y = (x - mean) / sqrt(var + eps) * g + b. */
static inline void ln_row(const float *g, const float *b, float eps, const float *x, int64_t n, float *y)
{
	const float mean = (float)(row_sum(x, n, 0, 0) / n);
	const float inv = (float)(1.0 / sqrt(row_sum(x, n, mean, 1) / n + eps));
	int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
	const __m256 vm = _mm256_set1_ps(mean), vi = _mm256_set1_ps(inv);
	for (; j + 8 <= n; j += 8) {
		const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), vi),
					       _mm256_loadu_ps(g + j));
		_mm256_storeu_ps(y + j, _mm256_add_ps(t, _mm256_loadu_ps(b + j)));
	}
#endif
	for (; j < n; j++)
		y[j] = (x[j] - mean) * inv * g[j] + b[j];
}

/* GELU with erf, 0.5 u (1 + erf(u / sqrt 2)): erf by Abramowitz and Stegun
 * 7.1.26 (absolute error < 1.5e-7) on eight lanes; tails padded. */
#if defined(__AVX2__) && defined(__FMA__)
static inline v8 v8_gelu_erf(v8 u)
{
	const v8 z = _mm256_mul_ps(u, _mm256_set1_ps(0.70710678118654752f));
	const v8 az = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);
	const v8 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), az, _mm256_set1_ps(1.0f)));
	v8 p = _mm256_set1_ps(1.061405429f);
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
	p = _mm256_mul_ps(p, t);
	const v8 e = v8_exp(_mm256_mul_ps(_mm256_mul_ps(az, az), _mm256_set1_ps(-1.0f)));
	v8 erf = _mm256_fnmadd_ps(p, e, _mm256_set1_ps(1.0f)); /* erf(|z|) */
	erf = _mm256_or_ps(erf, _mm256_and_ps(z, _mm256_set1_ps(-0.0f))); /* sign of z */
	return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), u), _mm256_add_ps(_mm256_set1_ps(1.0f), erf));
}

static inline void gelu_erf_span(float *x, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(x + i, v8_gelu_erf(_mm256_loadu_ps(x + i)));
	if (i < n) {
		float t[8] = {0};
		memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
		_mm256_storeu_ps(t, v8_gelu_erf(_mm256_loadu_ps(t)));
		memcpy(x + i, t, sizeof(float) * (size_t)(n - i));
	}
}
#else
static inline void gelu_erf_span(float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}
#endif

#endif

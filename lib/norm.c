/* Row normalisations and scalar activations, written to round like ggml's
 * CPU ops (double-precision sum of squares, float scale) so that our
 * logits track llama.cpp's closely. */
#include "model_impl.h"

#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#endif

void mcv_rms_norm(float *y, const float *x, const float *w, int n, float eps)
{
	double sum = 0.0;
	for (int i = 0; i < n; i++)
		sum += (double)(x[i] * x[i]);
	const float mean = (float)(sum / n);
	const float scale = 1.0f / sqrtf(mean + eps);
	if (w)
		for (int i = 0; i < n; i++)
			y[i] = x[i] * scale * w[i];
	else
		for (int i = 0; i < n; i++)
			y[i] = x[i] * scale;
}

/* llama.cpp builds the DeltaNet L2 norm as rms_norm(x, eps/n) / sqrt(n);
 * doing the same keeps eps where it puts it. */
void mcv_l2_norm(float *y, const float *x, int n, float eps)
{
	mcv_rms_norm(y, x, NULL, n, eps / (float)n);
	const float s = 1.0f / sqrtf((float)n);
	for (int i = 0; i < n; i++)
		y[i] *= s;
}

/* The scalar SiLU: libm's expf, as ggml's scalar ggml_silu_f32 (the tail
 * of a row that is not a whole vector, and machines without AVX-512). */
float mcv_silu(float x) { return x / (1.0f + expf(-x)); }

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* ggml's CPU backend on an AVX-512F/DQ machine (the variant llama.cpp
 * loads here) evaluates SiLU 16 lanes at a time with its own exp, not
 * libm's, so its results differ from x / (1 + expf(-x)) in about a quarter
 * of the values by an ulp; a quantized matmul can turn one such ulp into a
 * whole quantum, and a trained model carried that to 3e-3 of the logits
 * (session 17).  Matching it bit for bit needs the same arithmetic:
 * n = round(x log2 e) by the 1.5*2^23 shift, the remainder b = x - n ln2 in
 * two fused steps (ln2 split into a high and a low part), a degree-5
 * polynomial in b evaluated as ggml does (Estrin-like, with b^2), scaled
 * by 2^n with scalef.  The constants are the Arm optimized-routines
 * coefficients ggml uses; |error| <= 1.5 ulp.  |n| > 192 (|x| > ~133) only
 * happens where the exact result is 0 or inf: those lanes are set so. */
static inline __m512 expf16(__m512 x)
{
	const __m512 shift = _mm512_set1_ps(0x1.8p23f);
	const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
	const __m512 n = _mm512_sub_ps(z, shift);
	const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
					  _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
	const __m512 b2 = _mm512_mul_ps(b, b);
	const __m512 hi = _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f));
	const __m512 mid = _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f));
	const __m512 lo = _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f));
	const __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, b2, mid), b2, lo);
	__m512 r = _mm512_scalef_ps(p, n);
	const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
	if (big) {
		const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
		r = _mm512_mask_blend_ps(big, r, _mm512_mask_blend_ps(pos, _mm512_setzero_ps(),
								      _mm512_set1_ps(INFINITY)));
	}
	return r;
}
#endif

/* y = silu(x) with ggml_vec_silu_f32's rounding when x is one ggml row (or
 * starts at a multiple of 16 in it and the row's length is a multiple of
 * 16): whole 16-lane vectors with expf16, the rest scalar. */
void mcv_silu_vec(float *y, const float *x, size_t n)
{
	size_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
	const __m512 one = _mm512_set1_ps(1.0f);
	for (; i + 16 <= n; i += 16) {
		const __m512 v = _mm512_loadu_ps(x + i);
		const __m512 e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), v));
		_mm512_storeu_ps(y + i, _mm512_div_ps(v, _mm512_add_ps(one, e)));
	}
#endif
	for (; i < n; i++)
		y[i] = mcv_silu(x[i]);
}
/* y[i] = exp(x[i] - mx), returning the sum in double: ggml_vec_soft_max_f32's
 * rounding (16-lane vectors with expf16, each vector's sum reduced in
 * float and added in double, the tail with libm's expf). */
double mcv_exp_shifted(float *y, const float *x, int n, float mx)
{
	int i = 0;
	double sum = 0.0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
	for (; i + 16 <= n; i += 16) {
		const __m512 v = expf16(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(mx)));
		_mm512_storeu_ps(y + i, v);
		sum += (double)_mm512_reduce_add_ps(v);
	}
#endif
	for (; i < n; i++) {
		y[i] = expf(x[i] - mx);
		sum += (double)y[i];
	}
	return sum;
}

float mcv_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
float mcv_softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

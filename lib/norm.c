/* Row normalisations and scalar activations, written to round like ggml's
 * CPU ops (double-precision sum of squares, float scale) so that our
 * logits track llama.cpp's closely. */
#include "model_impl.h"

#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
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

/* libm's expf: the rounding llama.cpp's greedy tokens were matched with
 * (test/parity-llama.bats); a cheaper polynomial exp moved a near-tie. */
float mcv_silu(float x) { return x / (1.0f + expf(-x)); }

#ifdef __AVX512F__
/* glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, the FMA build this CPU
 * runs) redone 8 lanes at a time, for |x| < 87.9: x/ln2 in 1/32 steps,
 * 2^(k/32) from a table, a cubic in the remainder, all in double, rounded
 * once to float.  Compared with expf on every float of that range (2.2e9
 * values): the same bits for all of them. */
static const uint64_t exp2_tab[32] = {
	0x3ff0000000000000ULL, 0x3fefd9b0d3158574ULL, 0x3fefb5586cf9890fULL, 0x3fef9301d0125b51ULL,
	0x3fef72b83c7d517bULL, 0x3fef54873168b9aaULL, 0x3fef387a6e756238ULL, 0x3fef1e9df51fdee1ULL,
	0x3fef06fe0a31b715ULL, 0x3feef1a7373aa9cbULL, 0x3feedea64c123422ULL, 0x3feece086061892dULL,
	0x3feebfdad5362a27ULL, 0x3feeb42b569d4f82ULL, 0x3feeab07dd485429ULL, 0x3feea47eb03a5585ULL,
	0x3feea09e667f3bcdULL, 0x3fee9f75e8ec5f74ULL, 0x3feea11473eb0187ULL, 0x3feea589994cce13ULL,
	0x3feeace5422aa0dbULL, 0x3feeb737b0cdc5e5ULL, 0x3feec49182a3f090ULL, 0x3feed503b23e255dULL,
	0x3feee89f995ad3adULL, 0x3feeff76f2fb5e47ULL, 0x3fef199bdd85529cULL, 0x3fef3720dcef9069ULL,
	0x3fef5818dcfba487ULL, 0x3fef7c97337b9b5fULL, 0x3fefa4afa2a490daULL, 0x3fefd0765b6e4540ULL,
};

static inline __m256 expf8(__m256 xf)
{
	const __m512d x = _mm512_cvtps_pd(xf);
	const __m512d inv = _mm512_set1_pd(0x1.71547652b82fep+0 * 32), sh = _mm512_set1_pd(0x1.8p+52);
	__m512d kd = _mm512_add_pd(_mm512_mul_pd(inv, x), sh);
	const __m512i ki = _mm512_castpd_si512(kd);
	kd = _mm512_sub_pd(kd, sh);
	const __m512d r = _mm512_fmsub_pd(inv, x, kd);
	__m512i t = _mm512_i64gather_epi64(_mm512_and_si512(ki, _mm512_set1_epi64(31)), (const long long *)exp2_tab, 8);
	t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
	const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
					  _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
	__m512d y = _mm512_fmadd_pd(_mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm512_set1_pd(1.0));
	y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y);
	return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}
#endif

void mcv_silu_vec(float *y, const float *x, size_t n)
{
	size_t i = 0;
#ifdef __AVX512F__
	const __m256 lim = _mm256_set1_ps(87.9f), one = _mm256_set1_ps(1.0f);
	const __m256 sign = _mm256_set1_ps(-0.0f);
	for (; i + 8 <= n; i += 8) {
		const __m256 v = _mm256_loadu_ps(x + i);
		const __m256 nv = _mm256_xor_ps(v, sign);
		/* every lane inside the range (a NaN fails the compare too) */
		if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), lim, _CMP_LT_OQ)) != 0xff) {
			for (size_t j = i; j < i + 8; j++)
				y[j] = mcv_silu(x[j]);
			continue;
		}
		_mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, expf8(nv))));
	}
#endif
	for (; i < n; i++)
		y[i] = mcv_silu(x[i]);
}
float mcv_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
float mcv_softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

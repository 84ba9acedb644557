/* The vision tower's forward pass over one crop: patch embedding, learned
 * position table sampled per grid cell, ViT layers, the window-attention
 * merger (16x), and the 2x2 projector into the language model's width.
 * Mirrors scripts/ref/model.py VisionModel.forward step for step. */
#include "vision_impl.h"
#include "gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many elements a parallel region costs more than it saves
 * (and much more on a loaded machine). */
#define PAR_MIN (1 << 16)
#define MAX_PATCHES (1 << 16)
#define ATT_QB 32 /* query rows of one attention task */

/* transposed keys, then one score block per thread */
static size_t attn_scratch(int n, int W)
{
#ifdef _OPENMP
	const size_t nt = (size_t)omp_get_max_threads();
#else
	const size_t nt = 1;
#endif
	return (size_t)n * W + nt * ATT_QB * (size_t)n;
}

typedef struct enc {
	const mcv_vision *v;
	int exact;
	/* scratch */
	float *x, *h, *q, *k, *vv, *a, *ff, *sc;
} enc;

/* y[0..n) += x[0..n), vectorized (gcc -O2 leaves the plain loop scalar). */
static void add_to(float *y, const float *x, int64_t n)
{
	int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
	for (; j + 8 <= n; j += 8)
		_mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_loadu_ps(x + j)));
#endif
	for (; j < n; j++)
		y[j] += x[j];
}

/* y = W x + b for m rows of X.  In exact mode the weights are dequantized
 * to f32 first so the product sees the same numbers as the reference. */
static int linear(const enc *e, const mcv_lin *l, const float *X, int64_t m, float *Y,
		  mcv_error *err)
{
	const mcv_vw *w = &l->w;
	if (e->exact && w->type != MCV_F32) {
		float *wf = malloc(sizeof(float) * (size_t)w->ne0 * (size_t)w->ne1);
		if (!wf)
			return mcv_error_set(err, MCV_ENOMEM, "out of memory for an f32 weight copy");
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < w->ne1; r++)
			mcv_dequantize_row(w->type, (const char *)w->data + (size_t)r * w->rb,
					   wf + (size_t)r * w->ne0, w->ne0);
		mcv_matmul(MCV_F32, wf, sizeof(float) * (size_t)w->ne0, w->ne1, w->ne0, X, m, Y);
		free(wf);
	} else {
		/* no decode path here to agree with bit for bit: the looser,
		 * faster product (one float step per block) */
		mcv_matmul_loose(w->type, w->data, w->rb, w->ne1, w->ne0, X, m, Y);
	}
	if (l->b.data) {
		const float *b = l->b.data;
		const int64_t n = w->ne1;
#pragma omp parallel for schedule(static) if (m * n > PAR_MIN)
		for (int64_t i = 0; i < m; i++)
			add_to(Y + i * n, b, n);
	}
	return 0;
}

/* Sum of x[0..n) and of (x - mean)^2: eight float lanes, then the lanes
 * and the tail in double.  A fixed order for a given n. */
static double row_sum(const float *x, int64_t n, float mean, int sq)
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

static void layer_norm(const mcv_ln *l, float eps, const float *X, int64_t m, int64_t n, float *Y)
{
	const float *g = l->w.data, *b = l->b.data;
#pragma omp parallel for schedule(static) if (m * n > PAR_MIN)
	for (int64_t i = 0; i < m; i++) {
		const float *x = X + i * n;
		float *y = Y + i * n;
		const float mean = (float)(row_sum(x, n, 0, 0) / n);
		const float inv = (float)(1.0 / sqrt(row_sum(x, n, mean, 1) / n + eps));
		for (int64_t j = 0; j < n; j++)
			y[j] = (x[j] - mean) * inv * g[j] + b[j];
	}
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

static void gelu_span(float *x, int64_t n)
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

static void softmax_row(float *s, int n, float scale)
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
static void gelu_span(float *x, int64_t n)
{
	const float c2 = 2.0f * 0.7978845608028654f;
	for (int64_t i = 0; i < n; i++) {
		const float u = x[i];
		x[i] = u / (1.0f + expf(-c2 * (u + 0.044715f * u * u * u)));
	}
}

static void softmax_row(float *s, int n, float scale)
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

/* Rows are split into fixed chunks, so the thread count only decides who
 * computes a chunk. */
#define GELU_CHUNK 4096
static void gelu_tanh(float *x, int64_t n)
{
	const int64_t nc = (n + GELU_CHUNK - 1) / GELU_CHUNK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
	for (int64_t c = 0; c < nc; c++) {
		const int64_t i0 = c * GELU_CHUNK;
		gelu_span(x + i0, n - i0 < GELU_CHUNK ? n - i0 : GELU_CHUNK);
	}
}

static void gelu_erf(float *x, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
	for (int64_t i = 0; i < n; i++)
		x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

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

static void gemm_nn(int m, int n, int K, const float *A, int lda, const float *B, int ldb, float *C,
		    int ldc)
{
	int i = 0;
	for (; i + 6 <= m; i += 6)
		gemm_rows(6, n, K, A + (size_t)i * lda, lda, B, ldb, C + (size_t)i * ldc, ldc);
	for (; i < m; i++)
		gemm_rows(1, n, K, A + (size_t)i * lda, lda, B, ldb, C + (size_t)i * ldc, ldc);
}

/* Multi-head self-attention of all n rows (q, k, v are [n][W]) into a.
 * The keys are transposed once per head (kt[h][d][j]); then each task, a
 * head and a block of ATT_QB query rows, computes its scores, softmax and
 * output with gemm_nn in a private score block.  Tasks are fixed by n and
 * the head count, and each element is one thread's fixed computation, so
 * the thread count does not matter.  One parallel region per layer. */
static void attention_full(const enc *e, int n, const float *q, const float *k, const float *v,
			   float *a)
{
	const int W = e->v->width, nh = e->v->n_head, hd = W / nh;
	const float scale = 1.0f / sqrtf((float)hd);
	const int nqb = (n + ATT_QB - 1) / ATT_QB, ntask = nh * nqb;
	float *kt = e->sc;
#pragma omp parallel if ((int64_t)n * n * nh > PAR_MIN)
	{
#ifdef _OPENMP
		float *sc = kt + (size_t)n * W + (size_t)omp_get_thread_num() * ATT_QB * n;
#else
		float *sc = kt + (size_t)n * W;
#endif
#pragma omp for schedule(static)
		for (int j = 0; j < n; j++)
			for (int c = 0; c < W; c++)
				kt[(size_t)(c / hd) * hd * n + (size_t)(c % hd) * n + j] = k[(size_t)j * W + c];
#pragma omp for schedule(static)
		for (int t = 0; t < ntask; t++) {
			const int h = t / nqb, i0 = (t % nqb) * ATT_QB;
			const int m = n - i0 < ATT_QB ? n - i0 : ATT_QB;
			gemm_nn(m, n, hd, q + (size_t)i0 * W + h * hd, W, kt + (size_t)h * hd * n, n, sc, n);
			for (int i = 0; i < m; i++)
				softmax_row(sc + (size_t)i * n, n, scale);
			gemm_nn(m, hd, n, sc, n, v + h * hd, W, a + (size_t)i0 * W + h * hd, W);
		}
	}
}

static int vit_layer(const enc *e, const mcv_vit_layer *L, int n, mcv_error *err)
{
	const mcv_vision *v = e->v;
	const int W = v->width;
	int rc;
	layer_norm(&L->ln1, v->eps, e->x, n, W, e->h);
	if ((rc = linear(e, &L->q, e->h, n, e->q, err)) < 0 ||
	    (rc = linear(e, &L->k, e->h, n, e->k, err)) < 0 ||
	    (rc = linear(e, &L->v, e->h, n, e->vv, err)) < 0)
		return rc;
	attention_full(e, n, e->q, e->k, e->vv, e->a);
	if ((rc = linear(e, &L->o, e->a, n, e->h, err)) < 0)
		return rc;
	add_to(e->x, e->h, (int64_t)n * W);
	layer_norm(&L->ln2, v->eps, e->x, n, W, e->h);
	if ((rc = linear(e, &L->up, e->h, n, e->ff, err)) < 0)
		return rc;
	gelu_tanh(e->ff, (int64_t)n * v->ff);
	if ((rc = linear(e, &L->down, e->ff, n, e->h, err)) < 0)
		return rc;
	add_to(e->x, e->h, (int64_t)n * W);
	return 0;
}

/* Grid index of token t (0..3, row-major inside the window) of window (wy, wx). */
static inline int win_cell(int gw, int wy, int wx, int t)
{
	return (2 * wy + (t >> 1)) * gw + 2 * wx + (t & 1);
}

/* Rows of the 2x2 windows concatenated: out[wy * gw/2 + wx] = [x(0,0) x(0,1) x(1,0) x(1,1)]. */
static void gather_windows(const float *x, int gh, int gw, int W, float *out)
{
	const int nwx = gw / 2, nwin = (gh / 2) * nwx;
#pragma omp parallel for schedule(static)
	for (int wi = 0; wi < nwin; wi++)
		for (int t = 0; t < 4; t++)
			memcpy(out + ((size_t)wi * 4 + t) * W,
			       x + (size_t)win_cell(gw, wi / nwx, wi % nwx, t) * W, sizeof(float) * W);
}

/* Window attention over 2x2 windows, then the 2x2 downsample MLP plus the
 * windows' mean: gh x gw rows of e->x become gh/2 x gw/2. */
static int merger(const enc *e, int gh, int gw, mcv_error *err)
{
	const mcv_vision *v = e->v;
	const mcv_merger *M = &v->merger;
	const int W = v->width, nh = v->n_head, hd = W / nh, n = gh * gw;
	const int nwx = gw / 2, nwin = n / 4;
	const float scale = 1.0f / sqrtf((float)hd);
	int rc;
	layer_norm(&M->ln1, v->eps, e->x, n, W, e->h);
	if ((rc = linear(e, &M->q, e->h, n, e->q, err)) < 0 ||
	    (rc = linear(e, &M->k, e->h, n, e->k, err)) < 0 ||
	    (rc = linear(e, &M->v, e->h, n, e->vv, err)) < 0)
		return rc;
#pragma omp parallel for schedule(static)
	for (int wi = 0; wi < nwin; wi++) {
		int cell[4];
		for (int t = 0; t < 4; t++)
			cell[t] = win_cell(gw, wi / nwx, wi % nwx, t);
		for (int h = 0; h < nh; h++) {
			for (int i = 0; i < 4; i++) {
				const float *qi = e->q + (size_t)cell[i] * W + h * hd;
				float s[4];
				for (int j = 0; j < 4; j++) {
					const float *kj = e->k + (size_t)cell[j] * W + h * hd;
					float d = 0;
					for (int c = 0; c < hd; c++)
						d += qi[c] * kj[c];
					s[j] = d;
				}
				softmax_row(s, 4, scale);
				float *ai = e->a + (size_t)cell[i] * W + h * hd;
				for (int c = 0; c < hd; c++) {
					float acc = 0;
					for (int j = 0; j < 4; j++)
						acc += s[j] * e->vv[(size_t)cell[j] * W + h * hd + c];
					ai[c] = acc;
				}
			}
		}
	}
	if ((rc = linear(e, &M->o, e->a, n, e->h, err)) < 0)
		return rc;
	add_to(e->x, e->h, (int64_t)n * W);
	/* downsample: cat (4W) -> ds_ln -> up -> gelu -> down, plus the mean */
	float *cat = e->q; /* n * W floats = nwin * 4W */
	gather_windows(e->x, gh, gw, W, cat);
	layer_norm(&M->ds_ln, v->eps, cat, nwin, 4 * W, e->a);
	if ((rc = linear(e, &M->ds_up, e->a, nwin, e->ff, err)) < 0)
		return rc;
	gelu_tanh(e->ff, (int64_t)nwin * v->merger_ff);
	if ((rc = linear(e, &M->ds_down, e->ff, nwin, e->h, err)) < 0)
		return rc;
#pragma omp parallel for schedule(static)
	for (int wi = 0; wi < nwin; wi++) {
		const float *p = cat + (size_t)wi * 4 * W;
		for (int c = 0; c < W; c++) {
			const float mean = (p[c] + p[W + c] + p[2 * W + c] + p[3 * W + c]) * 0.25f;
			e->x[(size_t)wi * W + c] = mean + e->h[(size_t)wi * W + c];
		}
	}
	return 0;
}

static void patch_embed(const enc *e, const float *chw, int w, int h, float *cols)
{
	const mcv_vision *v = e->v;
	const int P = v->patch, gw = w / P, gh = h / P, K = 3 * P * P;
#pragma omp parallel for schedule(static)
	for (int i = 0; i < gh * gw; i++) {
		const int py = i / gw, px = i % gw;
		float *row = cols + (size_t)i * K;
		for (int c = 0; c < 3; c++)
			for (int ky = 0; ky < P; ky++)
				memcpy(row + (c * P + ky) * P,
				       chw + (size_t)c * w * h + (size_t)(py * P + ky) * w + px * P,
				       sizeof(float) * P);
	}
}

int mcv_vision_encode_crop(const mcv_vision *v, const float *chw, int w, int h,
			   const mcv_vision_params *p, float *out, mcv_error *err)
{
	int merge, ms, rc;
	if ((rc = mcv_vision_resolve(v, p, &merge, &ms, err)) < 0)
		return rc;
	const int P = v->patch, W = v->width, m = P * merge;
	if (w < m || h < m || w % m || h % m || w > 16384 || h > 16384)
		return mcv_error_set(err, MCV_EINVAL, "crop %dx%d: sides must be positive multiples of %d",
				     w, h, m);
	/* crops are about image_size^2 (slicing keeps them so); a bound keeps a
	 * hostile image_size from asking for absurd scratch */
	if ((int64_t)(w / P) * (h / P) > MAX_PATCHES)
		return mcv_error_set(err, MCV_ENOMEM, "crop %dx%d has more than %d patches", w, h, MAX_PATCHES);
	int gh = h / P, gw = w / P;
	const int n0 = gh * gw;
	const int K = 3 * P * P;
	enc e = {.v = v, .exact = p ? p->exact : 0};
	const int ffmax = v->ff > v->merger_ff ? v->ff : v->merger_ff;
	const size_t nW = (size_t)n0 * W;
	size_t big = (size_t)n0 * (ffmax > K ? ffmax : K);
	if ((size_t)(n0 / 4) * v->proj_ff > big)
		big = (size_t)(n0 / 4) * v->proj_ff;
	e.x = malloc(sizeof(float) * nW);
	e.h = malloc(sizeof(float) * nW);
	e.q = malloc(sizeof(float) * nW);
	e.k = malloc(sizeof(float) * nW);
	e.vv = malloc(sizeof(float) * nW);
	e.a = malloc(sizeof(float) * nW);
	e.ff = malloc(sizeof(float) * big);
	e.sc = malloc(sizeof(float) * attn_scratch(n0, W));
	if (!e.x || !e.h || !e.q || !e.k || !e.vv || !e.a || !e.ff || !e.sc) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory encoding a %dx%d crop", w, h);
		goto done;
	}
	/* patch embedding: a P x P stride-P convolution as a product over patches */
	patch_embed(&e, chw, w, h, e.ff);
	{
		mcv_lin pl = {v->patch_w, v->patch_b};
		if ((rc = linear(&e, &pl, e.ff, n0, e.x, err)) < 0)
			goto done;
	}
	/* the learned nb x nb position table sampled at floor(nb * i / g) */
	{
		const int nb = v->pos_buckets;
#pragma omp parallel for schedule(static)
		for (int i = 0; i < n0; i++) {
			const int by = nb * (i / gw) / gh, bx = nb * (i % gw) / gw;
			float *row = e.a + (size_t)i * W;
			mcv_dequantize_row(v->pos.type, (const char *)v->pos.data + (size_t)(by * nb + bx) * v->pos.rb,
					   row, W);
			for (int c = 0; c < W; c++)
				e.x[(size_t)i * W + c] += row[c];
		}
	}
	int n = n0;
	if (merge == 4) {
		for (int il = 0; il <= v->insert_layer; il++)
			if ((rc = vit_layer(&e, &v->layers[il], n, err)) < 0)
				goto done;
		if ((rc = merger(&e, gh, gw, err)) < 0)
			goto done;
		gh /= 2;
		gw /= 2;
		n = gh * gw;
		for (int il = v->insert_layer + 1; il < v->n_layer; il++)
			if ((rc = vit_layer(&e, &v->layers[il], n, err)) < 0)
				goto done;
	} else {
		for (int il = 0; il < v->n_layer; il++)
			if ((rc = vit_layer(&e, &v->layers[il], n, err)) < 0)
				goto done;
	}
	layer_norm(&v->post_ln, v->eps, e.x, n, W, e.h);
	/* projector: 2x2 windows concatenated -> LayerNorm -> up -> GELU (erf) -> down */
	{
		const int nwin = n / 4;
		gather_windows(e.h, gh, gw, W, e.q);
		layer_norm(&v->mm_norm, v->eps, e.q, nwin, 4 * W, e.a);
		if ((rc = linear(&e, &v->mm_up, e.a, nwin, e.ff, err)) < 0)
			goto done;
		gelu_erf(e.ff, (int64_t)nwin * v->proj_ff);
		if ((rc = linear(&e, &v->mm_down, e.ff, nwin, out, err)) < 0)
			goto done;
	}
	rc = 0;
done:
	free(e.x);
	free(e.h);
	free(e.q);
	free(e.k);
	free(e.vv);
	free(e.a);
	free(e.ff);
	free(e.sc);
	return rc;
}

/* The vision tower's fast path: the same forward pass as vision_vit.c
 * (patch embedding, ViT layers, window-attention merger, projector) for
 * the default (non-exact) mode, organised for few synchronisations.
 *
 * Why it is shaped this way (profile of the generic path on the proving
 * model, 2 threads, OMP_WAIT_POLICY=passive): a crop there runs ~100
 * OpenMP regions, each waking the sleeping threads, and the int8 products
 * repacked their weights and quantized their inputs on every call; with
 * 2 threads an encode was no faster than with 1.  Here:
 *
 * - one parallel region per crop; work is split into blocks of token rows
 *   and every step that only needs its own rows (LayerNorm, the products,
 *   GELU, residuals, the next layer's q/k/v) runs inside the block, so a
 *   ViT layer needs one barrier (after q/k/v, which attention reads whole;
 *   two sets of q/k/v alternate so the next layer's can be written while
 *   this layer's are still read);
 * - tokens are kept in window order, not raster order: the four tokens of
 *   every 2x2 window (of the merger, then of the projector) are adjacent
 *   rows, so the merger and projector are block-local too and need no
 *   gather (full attention does not care about the order of its rows);
 * - the matrices are packed once at load (mcv_vgemm_pack), each
 *   activation row is quantized once for all the matrices that read it;
 *   the patch embedding (f32/f16 in the file) is an int8 product too;
 * - attention's two products are bf16 with f32 sums (AVX-512 BF16), the
 *   softmax sixteen lanes wide;
 * - buffers are kept across encodes.
 *
 * Against the reference this stays well inside the parity tolerance
 * (test/vision-parity.bats: 5% of max|ref|; the shipped model is at
 * 0.2-0.4%).  Every output value is computed by one thread with a fixed
 * order that depends on neither the block size nor the thread count. */
#include "vision_impl.h"
#include "gemm.h"
#include "vision_kern.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* MCV_VISION_PROF (see vision_vit.c): thread 0's CPU time per stage; the
 * stage numbers are vision_vit.c's. */
static _Thread_local double fp_t;
static double fp_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#ifdef _OPENMP
#define FP_TID omp_get_thread_num()
#else
#define FP_TID 0
#endif
#define FP(k)                                                          \
	do {                                                           \
		if (mcv_vprof_on > 0 && FP_TID == 0) {                 \
			const double t_ = fp_now();                    \
			mcv_vprof_ms[k] += t_ - fp_t;                  \
			fp_t = t_;                                     \
		}                                                      \
	} while (0)
enum { FP_PATCH = 1, FP_LN = 3, FP_QKV = 4, FP_ATTN = 5, FP_O = 6, FP_UP = 7, FP_GELU = 8, FP_DOWN = 9,
       FP_MATT = 11, FP_MDS = 12, FP_PROJ = 13 };

#define RB_MAX 32 /* token rows per block */
#define WB_MAX 8  /* 2x2 windows per block (4 * WB_MAX <= RB_MAX) */

/* Items per block: about two blocks per thread (no value depends on the
 * blocking, so it may follow the thread count), at most cap, a multiple of
 * `even` (2 where value pairs are made inside a block). */
static int block_size(int n, int nt, int cap, int even)
{
	int b = (n + 2 * nt - 1) / (2 * nt);
	b = b < 1 ? 1 : b > cap ? cap : b;
	return (b + even - 1) / even * even;
}

/* Attention products in bf16 (f32 sums) where the CPU has them: twice the
 * f32 rate, and the scores and outputs stay well inside the parity
 * tolerance (the int8 products already round more). */
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define ATT_BF16 1

/* bf16 of x, rounded to nearest even (as vcvtneps2bf16). */
static inline uint32_t bf16(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

static inline uint32_t bf16_pair(float lo, float hi)
{
	return bf16(lo) | bf16(hi) << 16;
}

/* C[i][j] = sum over k of the bf16 pair products A[i][k] . B[k][j] (each
 * uint32 a pair, summed by vdpbf16ps in f32), i < R, j < n. */
static inline __attribute__((always_inline)) void gbf_rows(int R, int n, int K2, const uint32_t *A, int lda,
							   const uint32_t *B, int ldb, float *C, int ldc)
{
	for (int j = 0; j < n; j += 32) {
		const int left = n - j;
		const __mmask16 k0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
		const __mmask16 k1 = left >= 32 ? (__mmask16)0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
		__m512 c[6][2];
#pragma GCC unroll 6
		for (int r = 0; r < R; r++)
			c[r][0] = c[r][1] = _mm512_setzero_ps();
		for (int k = 0; k < K2; k++) {
			const __m512i b0 = _mm512_maskz_loadu_epi32(k0, B + (size_t)k * ldb + j);
			const __m512i b1 = _mm512_maskz_loadu_epi32(k1, B + (size_t)k * ldb + j + 16);
#pragma GCC unroll 6
			for (int r = 0; r < R; r++) {
				const __m512i a = _mm512_set1_epi32((int)A[(size_t)r * lda + k]);
				c[r][0] = _mm512_dpbf16_ps(c[r][0], (__m512bh)a, (__m512bh)b0);
				c[r][1] = _mm512_dpbf16_ps(c[r][1], (__m512bh)a, (__m512bh)b1);
			}
		}
#pragma GCC unroll 6
		for (int r = 0; r < R; r++) {
			_mm512_mask_storeu_ps(C + (size_t)r * ldc + j, k0, c[r][0]);
			_mm512_mask_storeu_ps(C + (size_t)r * ldc + j + 16, k1, c[r][1]);
		}
	}
}

/* expf on sixteen lanes, the same reduction and polynomial as v8_exp. */
static inline __m512 v16_exp(__m512 x)
{
	x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
	const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
					      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
	__m512 p = _mm512_set1_ps(1.0f / 720);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(p, n);
}

/* softmax(scale * s[0..n)) as bf16 into out[0..n) (n odd: out[n] = 0);
 * s is overwritten.  Lanes past n are masked, so every row element is
 * computed the same way. */
static void softmax_bf16(float *s, int n, float scale, uint16_t *out)
{
	__m512 mx = _mm512_set1_ps(-INFINITY);
	for (int j = 0; j < n; j += 16) {
		const __mmask16 k = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
		mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + j));
	}
	/* scale > 0: max(scale s) = scale max(s) */
	const __m512 off = _mm512_set1_ps(_mm512_reduce_max_ps(mx) * scale), sc = _mm512_set1_ps(scale);
	__m512 acc = _mm512_setzero_ps();
	for (int j = 0; j < n; j += 16) {
		const __mmask16 k = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
		const __m512 e = _mm512_maskz_mov_ps(k, v16_exp(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + j), sc, off)));
		acc = _mm512_add_ps(acc, e);
		_mm512_mask_storeu_ps(s + j, k, e);
	}
	const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(acc));
	const int ne = (n + 1) & ~1;
	for (int j = 0; j < ne; j += 16) {
		const __mmask16 k = ne - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ne - j)) - 1);
		const __mmask16 kv = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
		const __m256bh b = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_loadu_ps(kv, s + j), inv));
		_mm256_mask_storeu_epi16(out + j, k, (__m256i)b);
	}
}

/* x[0..n) as bf16 (n even). */
static void to_bf16(const float *x, int n, uint16_t *out)
{
	for (int j = 0; j < n; j += 16) {
		const __mmask16 k = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
		_mm256_mask_storeu_epi16(out + j, k, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x + j)));
	}
}

/* tanh GELU on sixteen lanes: u / (1 + exp(-2z)), as v8_gelu_tanh. */
static void gelu16_span(float *x, int64_t n)
{
	const __m512 c2 = _mm512_set1_ps(-2.0f * 0.7978845608028654f), one = _mm512_set1_ps(1.0f);
	for (int64_t i = 0; i < n; i += 16) {
		const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
		const __m512 u = _mm512_maskz_loadu_ps(k, x + i);
		const __m512 z = _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), _mm512_mul_ps(_mm512_mul_ps(u, u), u), u);
		const __m512 t = v16_exp(_mm512_mul_ps(c2, z));
		_mm512_mask_storeu_ps(x + i, k, _mm512_div_ps(u, _mm512_add_ps(one, t)));
	}
}

static void gemm_bf(int m, int n, int K2, const uint32_t *A, int lda, const uint32_t *B, int ldb, float *C,
		    int ldc)
{
	int i = 0;
	for (; i + 6 <= m; i += 6)
		gbf_rows(6, n, K2, A + (size_t)i * lda, lda, B, ldb, C + (size_t)i * ldc, ldc);
	for (; i < m; i++)
		gbf_rows(1, n, K2, A + (size_t)i * lda, lda, B, ldb, C + (size_t)i * ldc, ldc);
}
#endif

typedef struct flin {
	mcv_vgemm_w w;
	const float *b;
} flin;

typedef struct flayer {
	flin q, k, v, o, up, down;
} flayer;

struct mcv_vfast {
	/* the patch weights as int8 products too, rows padded with zeros to
	 * a multiple of 32: [W] rows of kp */
	flin patch;
	int kp;
	flayer *L;
	flin mq, mk, mv, mo, ds_up, ds_down; /* merger */
	flin mm_up, mm_down;                 /* projector */
};

static void flin_free(flin *f)
{
	mcv_vgemm_free(&f->w);
}

void mcv_vision_fast_free(mcv_vision *v)
{
	mcv_vfast *f = v->fast;
	if (f) {
		for (int i = 0; f->L && i < v->n_layer; i++) {
			flayer *L = &f->L[i];
			flin_free(&L->q), flin_free(&L->k), flin_free(&L->v);
			flin_free(&L->o), flin_free(&L->up), flin_free(&L->down);
		}
		flin_free(&f->mq), flin_free(&f->mk), flin_free(&f->mv), flin_free(&f->mo);
		flin_free(&f->ds_up), flin_free(&f->ds_down), flin_free(&f->mm_up), flin_free(&f->mm_down);
		flin_free(&f->patch);
		free(f->L);
		free(f);
	}
	v->fast = NULL;
	free(v->scratch);
	v->scratch = NULL;
	v->scratch_size = 0;
}

/* *ok = 0 when the matrix is not handled; -1 for lack of memory. */
static int pack(flin *f, const mcv_lin *l, int *ok)
{
	const int r = mcv_vgemm_pack(&f->w, l->w.type, l->w.data, l->w.rb, l->w.ne1, l->w.ne0);
	f->b = l->b.data;
	if (r == 0)
		*ok = 0;
	return r < 0 ? -1 : 0;
}

int mcv_vision_fast_init(mcv_vision *v, mcv_error *err)
{
	v->fast = NULL;
	const char *env = getenv("MCV_VISION_FAST");
	if (env && !strcmp(env, "0"))
		return 0; /* A/B comparisons against the generic path */
	mcv_vfast *f = calloc(1, sizeof *f);
	if (!f)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	v->fast = f;
	int ok = 1, bad = 0;
	f->L = calloc((size_t)v->n_layer, sizeof *f->L);
	bad |= !f->L;
	for (int i = 0; !bad && i < v->n_layer; i++) {
		const mcv_vit_layer *L = &v->layers[i];
		flayer *F = &f->L[i];
		bad |= pack(&F->q, &L->q, &ok) | pack(&F->k, &L->k, &ok) | pack(&F->v, &L->v, &ok) |
		       pack(&F->o, &L->o, &ok) | pack(&F->up, &L->up, &ok) | pack(&F->down, &L->down, &ok);
	}
	if (!bad && v->has_merger) {
		const mcv_merger *M = &v->merger;
		bad |= pack(&f->mq, &M->q, &ok) | pack(&f->mk, &M->k, &ok) | pack(&f->mv, &M->v, &ok) |
		       pack(&f->mo, &M->o, &ok) | pack(&f->ds_up, &M->ds_up, &ok) |
		       pack(&f->ds_down, &M->ds_down, &ok);
	}
	if (!bad)
		bad |= pack(&f->mm_up, &v->mm_up, &ok) | pack(&f->mm_down, &v->mm_down, &ok);
	const int W = v->width, K = 3 * v->patch * v->patch;
#ifdef ATT_BF16
	if ((W / v->n_head) % 2)
		ok = 0; /* bf16 pairs of channels */
#endif
	if (!bad && ok) {
		/* f32 or f16 in the file: quantized here like the other matrices */
		f->kp = (K + MCV_QK - 1) / MCV_QK * MCV_QK;
		const size_t rb = mcv_row_bytes(MCV_Q8_0, f->kp);
		float *row = calloc((size_t)f->kp, sizeof(float));
		char *q = malloc(rb * (size_t)W);
		bad |= !row || !q;
		for (int r = 0; !bad && r < W; r++) {
			mcv_dequantize_row(v->patch_w.type, (const char *)v->patch_w.data + (size_t)r * v->patch_w.rb,
					   row, K);
			mcv_quantize_row(MCV_Q8_0, row, q + (size_t)r * rb, f->kp);
		}
		if (!bad) {
			const int pr = mcv_vgemm_pack(&f->patch.w, MCV_Q8_0, q, rb, W, f->kp);
			bad |= pr < 0;
			ok &= pr > 0;
			f->patch.b = v->patch_b.data;
		}
		free(row);
		free(q);
	}
	if (bad || !ok) {
		mcv_vision_fast_free(v);
		if (bad)
			return mcv_error_set(err, MCV_ENOMEM, "out of memory packing the vision weights");
	}
	return 0;
}

/* ---- one crop ---- */

typedef struct fctx {
	const mcv_vision *v;
	const mcv_vfast *f;
	int W, hd, K, n0, gw, gh;
	float scale;
	size_t asz; /* bytes of one quantized activation row */
	const int *py, *px;
	const float *chw;
	int cw, ch;
	/* two sets of q [n][W], keys and values; with ATT_BF16 the keys as
	 * bf16 pairs of channels [W/2][n] and the values as bf16 pairs of
	 * tokens [(n+1)/2][W], else f32 k transposed [W][n] and v [n][W] */
	float *q[2], *kt[2], *vv[2];
} fctx;

/* One thread's block buffers. */
typedef struct tscr {
	float *lnb; /* RB x max(4W, kp) */
	float *ffb; /* RB x the widest MLP */
	float *ab, *tq, *tk, *tv; /* RB x W */
	float *sc;  /* RB x n0 */
	uint32_t *pa; /* RB x (n0/2 + 1): bf16 pairs of q or of probabilities */
	char *act;  /* RB x asz */
} tscr;

/* The MLPs' tanh GELU: sixteen lanes where there are. */
static void ffn_gelu(float *x, int64_t n)
{
#ifdef ATT_BF16
	gelu16_span(x, n);
#else
	gelu_span(x, n);
#endif
}

static void quant_rows(const fctx *c, const tscr *t, const float *x, int m, int n)
{
	for (int i = 0; i < m; i++)
		mcv_vgemm_quantize(x + (size_t)i * n, n, t->act + (size_t)i * c->asz);
}

/* LayerNorm 1 of layer il and its q, k, v for rows r0 .. r0+m of x (n rows
 * in all), into set s. */
static void qkv_rows(const fctx *c, const tscr *t, int il, int s, const float *x, int r0, int m, int n)
{
	const mcv_vit_layer *L = &c->v->layers[il];
	const flayer *F = &c->f->L[il];
	const int W = c->W;
	for (int i = 0; i < m; i++)
		ln_row(L->ln1.w.data, L->ln1.b.data, c->v->eps, x + (size_t)(r0 + i) * W, W, t->lnb + (size_t)i * W);
	FP(FP_LN);
	quant_rows(c, t, t->lnb, m, W);
	mcv_vgemm_rows(&F->q.w, t->act, c->asz, m, F->q.b, MCV_VGEMM_SET, c->q[s] + (size_t)r0 * W, W);
#ifdef ATT_BF16
	/* blocks start at even rows, so a pair of tokens is in one block */
	mcv_vgemm_rows(&F->k.w, t->act, c->asz, m, F->k.b, MCV_VGEMM_SET, t->ab, W);
	uint32_t *kt = (uint32_t *)c->kt[s], *v2 = (uint32_t *)c->vv[s];
	for (int i = 0; i < m; i++)
		for (int j = 0; j < W; j += 2)
			kt[(size_t)(j / 2) * n + r0 + i] = bf16_pair(t->ab[(size_t)i * W + j], t->ab[(size_t)i * W + j + 1]);
	mcv_vgemm_rows(&F->v.w, t->act, c->asz, m, F->v.b, MCV_VGEMM_SET, t->ab, W);
	for (int i = 0; i < m; i += 2)
		for (int j = 0; j < W; j++)
			v2[(size_t)((r0 + i) / 2) * W + j] =
				bf16_pair(t->ab[(size_t)i * W + j], i + 1 < m ? t->ab[(size_t)(i + 1) * W + j] : 0.0f);
#else
	mcv_vgemm_rows(&F->v.w, t->act, c->asz, m, F->v.b, MCV_VGEMM_SET, c->vv[s] + (size_t)r0 * W, W);
	mcv_vgemm_rows(&F->k.w, t->act, c->asz, m, F->k.b, MCV_VGEMM_SET, t->ab, W);
	float *kt = c->kt[s];
	for (int i = 0; i < m; i++)
		for (int j = 0; j < W; j++)
			kt[(size_t)j * n + r0 + i] = t->ab[(size_t)i * W + j];
#endif
	FP(FP_QKV);
}

/* Attention of rows r0 .. r0+m over all n rows (set s), the output
 * projection and the MLP, both residuals into x. */
static void attn_mlp_rows(const fctx *c, const tscr *t, int il, int s, float *x, int r0, int m, int n)
{
	const mcv_vision *v = c->v;
	const mcv_vit_layer *L = &v->layers[il];
	const flayer *F = &c->f->L[il];
	const int W = c->W, hd = c->hd, ff = v->ff;
	for (int h = 0; h < W / hd; h++) {
#ifdef ATT_BF16
		const int n2 = (n + 1) / 2;
		const float *q = c->q[s] + (size_t)r0 * W + h * hd;
		for (int i = 0; i < m; i++)
			to_bf16(q + (size_t)i * W, hd, (uint16_t *)(t->pa + (size_t)i * (hd / 2)));
		gemm_bf(m, n, hd / 2, t->pa, hd / 2, (const uint32_t *)c->kt[s] + (size_t)h * (hd / 2) * n, n, t->sc, n);
		for (int i = 0; i < m; i++)
			softmax_bf16(t->sc + (size_t)i * n, n, c->scale, (uint16_t *)(t->pa + (size_t)i * n2));
		gemm_bf(m, hd, n2, t->pa, n2, (const uint32_t *)c->vv[s] + h * hd, W, t->ab + h * hd, W);
#else
		gemm_nn(m, n, hd, c->q[s] + (size_t)r0 * W + h * hd, W, c->kt[s] + (size_t)h * hd * n, n, t->sc, n);
		for (int i = 0; i < m; i++)
			softmax_row(t->sc + (size_t)i * n, n, c->scale);
		gemm_nn(m, hd, n, t->sc, n, c->vv[s] + h * hd, W, t->ab + h * hd, W);
#endif
	}
	FP(FP_ATTN);
	float *xr = x + (size_t)r0 * W;
	quant_rows(c, t, t->ab, m, W);
	mcv_vgemm_rows(&F->o.w, t->act, c->asz, m, F->o.b, MCV_VGEMM_ADD, xr, W);
	FP(FP_O);
	for (int i = 0; i < m; i++)
		ln_row(L->ln2.w.data, L->ln2.b.data, v->eps, xr + (size_t)i * W, W, t->lnb + (size_t)i * W);
	quant_rows(c, t, t->lnb, m, W);
	FP(FP_LN);
	mcv_vgemm_rows(&F->up.w, t->act, c->asz, m, F->up.b, MCV_VGEMM_SET, t->ffb, ff);
	FP(FP_UP);
	ffn_gelu(t->ffb, (int64_t)m * ff);
	FP(FP_GELU);
	quant_rows(c, t, t->ffb, m, ff);
	mcv_vgemm_rows(&F->down.w, t->act, c->asz, m, F->down.b, MCV_VGEMM_ADD, xr, W);
	FP(FP_DOWN);
}

/* Patch embedding and position of rows r0 .. r0+m (window order). */
static void patch_rows(const fctx *c, const tscr *t, float *x, int r0, int m)
{
	const mcv_vision *v = c->v;
	const int W = c->W, P = v->patch, K = c->K, kp = c->f->kp, nb = v->pos_buckets;
	const size_t plane = (size_t)c->cw * c->ch;
	for (int i = 0; i < m; i++) {
		const int py = c->py[r0 + i], px = c->px[r0 + i];
		float *row = t->lnb + (size_t)i * kp;
		for (int ch = 0; ch < 3; ch++)
			for (int ky = 0; ky < P; ky++)
				memcpy(row + (ch * P + ky) * P, c->chw + ch * plane + (size_t)(py * P + ky) * c->cw + px * P,
				       sizeof(float) * P);
		memset(row + K, 0, sizeof(float) * (size_t)(kp - K));
	}
	quant_rows(c, t, t->lnb, m, kp);
	float *xr = x + (size_t)r0 * W;
	mcv_vgemm_rows(&c->f->patch.w, t->act, c->asz, m, c->f->patch.b, MCV_VGEMM_SET, xr, W);
	for (int i = 0; i < m; i++) {
		const int by = nb * c->py[r0 + i] / c->gh, bx = nb * c->px[r0 + i] / c->gw;
		mcv_dequantize_row(v->pos.type, (const char *)v->pos.data + (size_t)(by * nb + bx) * v->pos.rb, t->ab, W);
		add_to(xr + (size_t)i * W, t->ab, W);
	}
	FP(FP_PATCH);
}

/* The merger on windows w0 .. w0+nw of x (rows 4 w0 ..): window attention
 * with its residual into x, then the downsample into rows w0 .. of xo. */
static void merger_windows(const fctx *c, const tscr *t, float *x, float *xo, int w0, int nw)
{
	const mcv_vision *v = c->v;
	const mcv_merger *M = &v->merger;
	const mcv_vfast *f = c->f;
	const int W = c->W, hd = c->hd, m = 4 * nw, mff = v->merger_ff;
	float *xr = x + (size_t)4 * w0 * W;
	for (int i = 0; i < m; i++)
		ln_row(M->ln1.w.data, M->ln1.b.data, v->eps, xr + (size_t)i * W, W, t->lnb + (size_t)i * W);
	quant_rows(c, t, t->lnb, m, W);
	mcv_vgemm_rows(&f->mq.w, t->act, c->asz, m, f->mq.b, MCV_VGEMM_SET, t->tq, W);
	mcv_vgemm_rows(&f->mk.w, t->act, c->asz, m, f->mk.b, MCV_VGEMM_SET, t->tk, W);
	mcv_vgemm_rows(&f->mv.w, t->act, c->asz, m, f->mv.b, MCV_VGEMM_SET, t->tv, W);
	for (int wi = 0; wi < nw; wi++)
		for (int h = 0; h < W / hd; h++)
			for (int i = 0; i < 4; i++) {
				const float *qi = t->tq + (size_t)(4 * wi + i) * W + h * hd;
				float sc[4];
				for (int j = 0; j < 4; j++) {
					const float *kj = t->tk + (size_t)(4 * wi + j) * W + h * hd;
					float d = 0;
					for (int e = 0; e < hd; e++)
						d += qi[e] * kj[e];
					sc[j] = d;
				}
				softmax_row(sc, 4, c->scale);
				float *ai = t->ab + (size_t)(4 * wi + i) * W + h * hd;
				for (int e = 0; e < hd; e++) {
					float acc = 0;
					for (int j = 0; j < 4; j++)
						acc += sc[j] * t->tv[(size_t)(4 * wi + j) * W + h * hd + e];
					ai[e] = acc;
				}
			}
	quant_rows(c, t, t->ab, m, W);
	mcv_vgemm_rows(&f->mo.w, t->act, c->asz, m, f->mo.b, MCV_VGEMM_ADD, xr, W);
	FP(FP_MATT);
	/* downsample: the window's 4 rows are one 4W row already */
	for (int wi = 0; wi < nw; wi++)
		ln_row(M->ds_ln.w.data, M->ds_ln.b.data, v->eps, xr + (size_t)wi * 4 * W, 4 * W,
		       t->lnb + (size_t)wi * 4 * W);
	quant_rows(c, t, t->lnb, nw, 4 * W);
	mcv_vgemm_rows(&f->ds_up.w, t->act, c->asz, nw, f->ds_up.b, MCV_VGEMM_SET, t->ffb, mff);
	ffn_gelu(t->ffb, (int64_t)nw * mff);
	quant_rows(c, t, t->ffb, nw, mff);
	float *o = xo + (size_t)w0 * W;
	mcv_vgemm_rows(&f->ds_down.w, t->act, c->asz, nw, f->ds_down.b, MCV_VGEMM_SET, o, W);
	for (int wi = 0; wi < nw; wi++) {
		const float *p = xr + (size_t)wi * 4 * W;
		float *y = o + (size_t)wi * W;
		for (int j = 0; j < W; j++)
			y[j] = (p[j] + p[W + j] + p[2 * W + j] + p[3 * W + j]) * 0.25f + y[j];
	}
	FP(FP_MDS);
}

/* post_ln, then the projector on windows w0 .. w0+nw of x into out. */
static void projector_windows(const fctx *c, const tscr *t, const float *x, float *out, int w0, int nw)
{
	const mcv_vision *v = c->v;
	const mcv_vfast *f = c->f;
	const int W = c->W, pff = v->proj_ff;
	for (int wi = 0; wi < nw; wi++) {
		float *r = t->lnb + (size_t)wi * 4 * W;
		for (int k = 0; k < 4; k++)
			ln_row(v->post_ln.w.data, v->post_ln.b.data, v->eps, x + (size_t)(4 * (w0 + wi) + k) * W, W,
			       r + (size_t)k * W);
		ln_row(v->mm_norm.w.data, v->mm_norm.b.data, v->eps, r, 4 * W, r);
	}
	quant_rows(c, t, t->lnb, nw, 4 * W);
	mcv_vgemm_rows(&f->mm_up.w, t->act, c->asz, nw, f->mm_up.b, MCV_VGEMM_SET, t->ffb, pff);
	gelu_erf_span(t->ffb, (int64_t)nw * pff);
	quant_rows(c, t, t->ffb, nw, pff);
	mcv_vgemm_rows(&f->mm_down.w, t->act, c->asz, nw, f->mm_down.b, MCV_VGEMM_SET,
		       out + (size_t)w0 * v->n_proj, v->n_proj);
	FP(FP_PROJ);
}

/* ---- buffers ---- */

static size_t up64(size_t b)
{
	return (b + 63) & ~(size_t)63;
}

static void *carve(char **p, size_t bytes)
{
	void *r = *p;
	*p += up64(bytes);
	return r;
}

/* The vision's buffers when free (one encode at a time uses them), else a
 * fresh allocation; *own says which. */
static char *scratch_get(const mcv_vision *cv, size_t need, int *own)
{
	mcv_vision *v = (mcv_vision *)cv; /* the cache is not part of the value */
	*own = 1;
	if (!__atomic_exchange_n(&v->scratch_busy, 1, __ATOMIC_ACQUIRE)) {
		if (v->scratch_size < need) {
			free(v->scratch);
			v->scratch = aligned_alloc(64, up64(need));
			v->scratch_size = v->scratch ? need : 0;
		}
		if (v->scratch) {
			*own = 0;
			return v->scratch;
		}
		__atomic_store_n(&v->scratch_busy, 0, __ATOMIC_RELEASE);
	}
	return aligned_alloc(64, up64(need));
}

static void scratch_put(const mcv_vision *cv, char *p, int own)
{
	mcv_vision *v = (mcv_vision *)cv;
	if (own)
		free(p);
	else
		__atomic_store_n(&v->scratch_busy, 0, __ATOMIC_RELEASE);
}

int mcv_vision_fast_encode(const mcv_vision *v, const float *chw, int w, int h, int merge, float *out,
			   mcv_error *err)
{
	const mcv_vfast *f = v->fast;
	const int P = v->patch, W = v->width, K = 3 * P * P;
	const int gw = w / P, gh = h / P, n0 = gw * gh;
	const int nx = gw / merge, ny = gh / merge;
	int maxin = 4 * W, maxff = v->ff;
	if (v->has_merger && v->merger_ff > maxff)
		maxff = v->merger_ff;
	if (v->proj_ff > maxff)
		maxff = v->proj_ff;
	if (maxff > maxin)
		maxin = maxff;
	if (f->kp > maxin)
		maxin = f->kp;
	const int lnw = 4 * W > f->kp ? 4 * W : f->kp; /* widest staged row */
	const size_t asz = mcv_vgemm_act_size(maxin);
	int nt = 1;
#ifdef _OPENMP
	nt = omp_get_max_threads();
#endif
	const size_t fW = sizeof(float) * (size_t)W;
	const int hd = W / v->n_head, pan = n0 / 2 + 1 > hd / 2 ? n0 / 2 + 1 : hd / 2;
	const size_t per_thread = up64(RB_MAX * sizeof(float) * (size_t)lnw) +
				  up64(RB_MAX * sizeof(float) * (size_t)maxff) + 4 * up64(RB_MAX * fW) +
				  up64(RB_MAX * sizeof(float) * (size_t)n0) + up64(RB_MAX * sizeof(uint32_t) * (size_t)pan) +
				  up64(RB_MAX * asz);
	const size_t need = 2 * up64(sizeof(int) * (size_t)n0) + 2 * up64(fW * n0) + 6 * up64(fW * n0) +
			    (size_t)nt * per_thread;
	int own;
	char *base = scratch_get(v, need, &own);
	if (!base)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory encoding a %dx%d crop", w, h);
	char *p = base;
	int *py = carve(&p, sizeof(int) * (size_t)n0), *px = carve(&p, sizeof(int) * (size_t)n0);
	float *x = carve(&p, fW * n0), *x2 = carve(&p, fW * n0);
	fctx c = {.v = v, .f = f, .W = W, .hd = hd, .K = K, .n0 = n0, .gw = gw, .gh = gh,
		  .asz = asz, .py = py, .px = px, .chw = chw, .cw = w, .ch = h};
	c.scale = 1.0f / sqrtf((float)c.hd);
	for (int s = 0; s < 2; s++) {
		c.q[s] = carve(&p, fW * n0);
		c.kt[s] = carve(&p, fW * n0);
		c.vv[s] = carve(&p, fW * n0);
	}
	char *tbase = p;
	/* window order: output cell (oy, ox), then (16x) the merged token inside
	 * it, then the patch inside that */
	for (int oy = 0, i = 0; oy < ny; oy++)
		for (int ox = 0; ox < nx; ox++)
			for (int t2 = 0; t2 < (merge == 4 ? 4 : 1); t2++)
				for (int t1 = 0; t1 < 4; t1++, i++) {
					const int my = merge == 4 ? 2 * oy + (t2 >> 1) : oy;
					const int mx = merge == 4 ? 2 * ox + (t2 & 1) : ox;
					py[i] = 2 * my + (t1 >> 1);
					px[i] = 2 * mx + (t1 & 1);
				}
	const int nl = v->n_layer, ins = merge == 4 ? v->insert_layer : -1;
#pragma omp parallel
	{
		int tid = 0;
#ifdef _OPENMP
		tid = omp_get_thread_num();
#endif
		char *tp = tbase + (size_t)tid * per_thread;
		if (mcv_vprof_on > 0 && tid == 0) {
			fp_t = fp_now();
			mcv_vprof_ms[14] += 1;
		}
		tscr t;
		t.lnb = carve(&tp, RB_MAX * sizeof(float) * (size_t)lnw);
		t.ffb = carve(&tp, RB_MAX * sizeof(float) * (size_t)maxff);
		t.ab = carve(&tp, RB_MAX * fW);
		t.tq = carve(&tp, RB_MAX * fW);
		t.tk = carve(&tp, RB_MAX * fW);
		t.tv = carve(&tp, RB_MAX * fW);
		t.sc = carve(&tp, RB_MAX * sizeof(float) * (size_t)n0);
		t.pa = carve(&tp, RB_MAX * sizeof(uint32_t) * (size_t)pan);
		t.act = carve(&tp, RB_MAX * asz);
		int n = n0, rb = block_size(n, nt, RB_MAX, 2);
		int nblk = (n + rb - 1) / rb;
#pragma omp for schedule(static)
		for (int b = 0; b < nblk; b++) {
			const int r0 = b * rb, m = n - r0 < rb ? n - r0 : rb;
			patch_rows(&c, &t, x, r0, m);
			qkv_rows(&c, &t, 0, 0, x, r0, m, n);
		}
		float *xc = x, *xn = x2;
		for (int il = 0; il < nl; il++) {
			const int s = il & 1, here = il == ins, next = il + 1 < nl && !here;
			rb = block_size(n, nt, RB_MAX, 2);
			nblk = (n + rb - 1) / rb;
#pragma omp for schedule(static)
			for (int b = 0; b < nblk; b++) {
				const int r0 = b * rb, m = n - r0 < rb ? n - r0 : rb;
				attn_mlp_rows(&c, &t, il, s, xc, r0, m, n);
				if (next)
					qkv_rows(&c, &t, il + 1, s ^ 1, xc, r0, m, n);
			}
			if (here) {
				/* even: the next layer's value pairs are made inside a block */
				const int nwin = n / 4, wb = block_size(nwin, nt, WB_MAX, 2);
				const int nwb = (nwin + wb - 1) / wb;
#pragma omp for schedule(static)
				for (int b = 0; b < nwb; b++) {
					const int w0 = b * wb, nw = nwin - w0 < wb ? nwin - w0 : wb;
					merger_windows(&c, &t, xc, xn, w0, nw);
					if (il + 1 < nl)
						qkv_rows(&c, &t, il + 1, s ^ 1, xn, w0, nw, nwin);
				}
				float *sw = xc;
				xc = xn;
				xn = sw;
				n = nwin;
			}
		}
		const int nwin = n / 4, wb = block_size(nwin, nt, WB_MAX, 1);
		const int nwb = (nwin + wb - 1) / wb;
#pragma omp for schedule(static)
		for (int b = 0; b < nwb; b++) {
			const int w0 = b * wb, nw = nwin - w0 < wb ? nwin - w0 : wb;
			projector_windows(&c, &t, xc, out, w0, nw);
		}
	}
	scratch_put(v, base, own);
	return 0;
}

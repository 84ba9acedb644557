/* Prefill GEMM for Q4_0 / Q8_0 weights against Q8_0 activations, AVX-512
 * VNNI.
 *
 * Bit-identity with the dot kernels (dot_q0.c) fixes the float work: for
 * each (weight row, activation row) pair and each block, the eight int32 sums
 * over 4-byte groups l = 0..7 are converted, multiplied by the product of the
 * two block scales and added into eight per-pair float lanes, which a fixed
 * tree adds at the end.  What is free is the layout: here a 512-bit register
 * holds ONE group l for 16 weight rows (lane r) and one activation row, so
 * the activation's 4 bytes are a plain dword broadcast from its Q8_0 block,
 * the scale product is one multiply per block for 16 pairs instead of one per
 * pair, the activation offsets (the weights are biased to unsigned bytes) are
 * computed once per call, and the 16 results of a pair set land contiguously
 * in Y.  The integer sums are exact whichever bytes are biased, so every pair
 * gets the same bits as mcv_vec_dot.
 *
 * The weights are repacked per thread, a few 16-row panels at a time (each
 * group's 4 bytes of 16 rows in one 64-byte line: 4x the Q4_0 size, 1.9x the
 * Q8_0 size), so a chunk stays in L2 while all activation rows stream past
 * it, three at a time (24 accumulators).
 *
 * mcv_matmul_loose (the vision tower, which has no decode path to agree
 * with) uses the same packing but sums each block's 8 groups into one int32
 * per pair before the single convert/scale/add: about 1.6x faster again.
 *
 * mcv_vgemm_* (the vision tower's fast path) are the loose kernel with the
 * weights packed once at load, activations quantized by the caller once
 * for several matrices (f32 block scales), and the bias / residual added
 * in the kernel's store; the caller splits rows between threads. */
#include "gemm.h"
#include "dot_kernels.h"
#include "dot_simd.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(MCV_DOT_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__)

/* One block of 16 weight rows.  u[l] lane r: row r's bytes 4l..4l+3,
 * unsigned (Q8_0: x + 128, Q4_0: the nibble); d lane r: row r's scale. */
typedef struct {
	uint8_t u[8][64];
	float d[16];
} wblk;

/* Per activation row and block: what the weight bias adds to the sum of
 * group l, negated, and the block's scale as a float. */
typedef struct {
	int32_t off[8];
	float d;
	int32_t offsum; /* the sum of off[0..8) (loose mode) */
} ablk;

#define PANEL 16 /* weight rows per register */
#define MAXC 3   /* activation rows per kernel call */
#define MAXC_LOOSE 6

/* Weight bytes times activation rows that make a parallel region
 * worthwhile (as in matvec.c). */
#define PAR_MIN_BYTES (48 * 1024)
/* Repacked weight panels per thread chunk: about this many bytes. */
#define CHUNK_BYTES (160 * 1024)

static inline __m256i q4_nibbles(const uint8_t *qs)
{
	__m128i q = _mm_loadu_si128((const __m128i *)qs);
	__m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
	return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* Index vectors of the three permute stages of a 16 x 8 dword transpose
 * (see pack_w). */
typedef struct {
	__m512i s1[2], s2[2][2], s3[2];
} tr_idx;

static void tr_idx_init(tr_idx *t)
{
	int32_t v[16];
	for (int h = 0; h < 2; h++) {
		for (int c = 0; c < 4; c++)
			for (int r = 0; r < 4; r++)
				v[4 * c + r] = (r / 2) * 16 + (r % 2) * 8 + 4 * h + c;
		t->s1[h] = _mm512_loadu_si512(v);
		for (int q = 0; q < 2; q++) {
			for (int c = 0; c < 2; c++)
				for (int r = 0; r < 8; r++)
					v[8 * c + r] = (r < 4 ? 0 : 16) + 4 * (2 * q + c) + r % 4;
			t->s2[h][q] = _mm512_loadu_si512(v);
		}
		for (int r = 0; r < 16; r++)
			v[r] = (r < 8 ? 0 : 16) + 8 * h + r % 8;
		t->s3[h] = _mm512_loadu_si512(v);
	}
}

/* Rows w[0..nr) (the rest zero) as a 16-row panel.  Per block, the 16 rows
 * of 8 dwords are transposed in three stages of permutes over register
 * pairs: rows 2j,2j+1 -> (4 rows x 4 columns) -> (8 rows x 2 columns) ->
 * (16 rows x 1 column). */
static void pack_w(int type, const char *w, size_t stride, int nr, int64_t nb, wblk *out)
{
	const size_t bsz = type == MCV_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q8_0);
	tr_idx ti;
	tr_idx_init(&ti);
	for (int64_t b = 0; b < nb; b++) {
		__m256i q[PANEL];
		for (int r = 0; r < PANEL; r++) {
			__m256i v = _mm256_setzero_si256();
			float d = 0.0f;
			if (r < nr) {
				const char *blk = w + (size_t)r * stride + (size_t)b * bsz;
				d = mcv_h2f(*(const mcv_half *)blk);
				if (type == MCV_Q4_0)
					v = q4_nibbles(((const block_q4_0 *)blk)->qs);
				else
					v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((const block_q8_0 *)blk)->qs),
							     _mm256_set1_epi8(-128));
			}
			q[r] = v;
			out[b].d[r] = d;
		}
		__m512i z[8], s1[4][2], s2[2][2][2];
		for (int j = 0; j < 8; j++)
			z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(q[2 * j]), q[2 * j + 1], 1);
		/* s1[i][h] lane 4c + r: row 4i + r, column 4h + c */
		for (int i = 0; i < 4; i++)
			for (int h = 0; h < 2; h++)
				s1[i][h] = _mm512_permutex2var_epi32(z[2 * i], ti.s1[h], z[2 * i + 1]);
		/* s2[i][h][q] lane 8c + r: row 8i + r, column 4h + 2q + c */
		for (int i = 0; i < 2; i++)
			for (int h = 0; h < 2; h++)
				for (int k = 0; k < 2; k++)
					s2[i][h][k] = _mm512_permutex2var_epi32(s1[2 * i][h], ti.s2[h][k], s1[2 * i + 1][h]);
		/* column 4h + 2q + c, all 16 rows */
		for (int h = 0; h < 2; h++)
			for (int k = 0; k < 2; k++)
				for (int c = 0; c < 2; c++)
					_mm512_store_si512((__m512i *)out[b].u[4 * h + 2 * k + c],
							   _mm512_permutex2var_epi32(s2[0][h][k], ti.s3[c], s2[1][h][k]));
	}
}

/* Offsets and float scales of one activation row (Q8_0).  bias: the
 * unsigned offset of the weight bytes (Q8_0: 128, Q4_0: 8). */
static void pack_a(const block_q8_0 *x, int bias, int64_t nb, ablk *out)
{
	const __m256i vb = _mm256_set1_epi8((char)bias), z = _mm256_setzero_si256();
	for (int64_t b = 0; b < nb; b++) {
		const __m256i q = _mm256_loadu_si256((const __m256i *)x[b].qs);
		const __m256i o = _mm256_sub_epi32(z, mcv_dpbusd(z, vb, q));
		_mm256_storeu_si256((__m256i *)out[b].off, o);
		out[b].d = mcv_h2f(x[b].d);
		out[b].offsum = mcv_hsum8i(o);
	}
}

/* 16 weight rows x C activation rows: o[c][r]. */
static inline __attribute__((always_inline)) void
kern(const int C, int64_t nb, const wblk *w, const block_q8_0 *const *x, const ablk *const *a, float *o,
     size_t ldo, __mmask16 mask)
{
	__m512 acc[MAXC][8];
#pragma GCC unroll 4
	for (int c = 0; c < C; c++)
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++)
			acc[c][l] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const __m512 wd = _mm512_load_ps(w[b].d);
		__m512 d[MAXC];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++)
			d[c] = _mm512_mul_ps(wd, _mm512_set1_ps(a[c][b].d));
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++) {
			const __m512i u = _mm512_load_si512((const __m512i *)w[b].u[l]);
#pragma GCC unroll 4
			for (int c = 0; c < C; c++) {
				int32_t xs;
				memcpy(&xs, x[c][b].qs + 4 * l, 4);
				const __m512i p = _mm512_dpbusd_epi32(_mm512_set1_epi32(a[c][b].off[l]), u, _mm512_set1_epi32(xs));
				acc[c][l] = _mm512_fmadd_ps(d[c], _mm512_cvtepi32_ps(p), acc[c][l]);
			}
		}
	}
	/* the association of mcv_hsum8: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) */
#pragma GCC unroll 4
	for (int c = 0; c < C; c++) {
		const __m512 s04 = _mm512_add_ps(acc[c][0], acc[c][4]), s26 = _mm512_add_ps(acc[c][2], acc[c][6]);
		const __m512 s15 = _mm512_add_ps(acc[c][1], acc[c][5]), s37 = _mm512_add_ps(acc[c][3], acc[c][7]);
		_mm512_mask_storeu_ps(o + c * ldo, mask, _mm512_add_ps(_mm512_add_ps(s04, s26), _mm512_add_ps(s15, s37)));
	}
}

/* Loose mode: the 8 groups of a block go into ONE int32 sum per pair (its
 * exact integer dot), then one convert and one fma per block: 8x less float
 * work, and a different (no less accurate) rounding than mcv_vec_dot. */
static inline __attribute__((always_inline)) void
kern_loose(const int C, int64_t nb, const wblk *w, const block_q8_0 *const *x, const ablk *const *a,
	   float *o, size_t ldo, __mmask16 mask)
{
	__m512 acc[MAXC_LOOSE];
#pragma GCC unroll 8
	for (int c = 0; c < C; c++)
		acc[c] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m512i p[MAXC_LOOSE];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			p[c] = _mm512_set1_epi32(a[c][b].offsum);
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++) {
			const __m512i u = _mm512_load_si512((const __m512i *)w[b].u[l]);
#pragma GCC unroll 8
			for (int c = 0; c < C; c++) {
				int32_t xs;
				memcpy(&xs, x[c][b].qs + 4 * l, 4);
				p[c] = _mm512_dpbusd_epi32(p[c], u, _mm512_set1_epi32(xs));
			}
		}
		const __m512 wd = _mm512_load_ps(w[b].d);
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(wd, _mm512_set1_ps(a[c][b].d)), _mm512_cvtepi32_ps(p[c]),
						 acc[c]);
	}
#pragma GCC unroll 8
	for (int c = 0; c < C; c++)
		_mm512_mask_storeu_ps(o + c * ldo, mask, acc[c]);
}

static void *alloc64(size_t n)
{
	return aligned_alloc(64, (n + 63) & ~(size_t)63);
}

static int gemm_q0(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		   const float *X, int64_t m, float *Y, const int loose)
{
	if ((type != MCV_Q4_0 && type != MCV_Q8_0) || m < MCV_GEMM_Q0_MIN_M || n <= 0 || n % MCV_QK ||
	    nrows <= 0)
		return 0;
	const mcv_type_traits *tt = mcv_type_get(type);
	if (!tt || tt->vec_dot_type != MCV_Q8_0)
		return 0;
	const int64_t nb = n / MCV_QK, np = (nrows + PANEL - 1) / PANEL;
	const size_t qb = (size_t)nb * sizeof(block_q8_0);
	int nt = 1;
#ifdef _OPENMP
	nt = omp_get_max_threads();
#endif
	const int par = (double)nrows * (double)mcv_row_bytes(type, n) * (double)m >= PAR_MIN_BYTES;
	if (!par)
		nt = 1;
	/* Panels per chunk: enough to reuse activation rows across them, few
	 * enough that every thread gets a couple of chunks. */
	int64_t ch = (int64_t)(CHUNK_BYTES / ((size_t)nb * sizeof(wblk)));
	ch = ch < 1 ? 1 : ch > 8 ? 8 : ch;
	while (ch > 1 && (np + ch - 1) / ch < 2 * nt)
		ch--;
	const int64_t nch = (np + ch - 1) / ch;

	unsigned char *xq = malloc(qb * (size_t)m);
	ablk *ap = malloc((size_t)m * (size_t)nb * sizeof(ablk));
	wblk *wp = alloc64((size_t)nt * (size_t)ch * (size_t)nb * sizeof(wblk));
	if (!xq || !ap || !wp) {
		free(xq);
		free(ap);
		free(wp);
		return 0;
	}
	const int bias = type == MCV_Q8_0 ? 128 : 8;
	const char *w = W;
#pragma omp parallel num_threads(nt) if (par)
	{
		int t = 0;
#ifdef _OPENMP
		t = omp_get_thread_num();
#endif
#pragma omp for schedule(static)
		for (int64_t i = 0; i < m; i++) {
			mcv_quantize_row(MCV_Q8_0, X + i * n, xq + (size_t)i * qb, n);
			pack_a((const block_q8_0 *)(xq + (size_t)i * qb), bias, nb, ap + (size_t)i * (size_t)nb);
		}
		wblk *mine = wp + (size_t)t * (size_t)ch * (size_t)nb;
#pragma omp for schedule(static)
		for (int64_t k = 0; k < nch; k++) {
			const int64_t p0 = k * ch, p1 = p0 + ch < np ? p0 + ch : np;
			for (int64_t p = p0; p < p1; p++) {
				const int64_t nr = nrows - PANEL * p < PANEL ? nrows - PANEL * p : PANEL;
				pack_w(type, w + (size_t)(PANEL * p) * row_stride, row_stride, (int)nr, nb,
				       mine + (size_t)(p - p0) * (size_t)nb);
			}
			const int step = loose ? MAXC_LOOSE : MAXC;
			for (int64_t i = 0; i < m; i += step) {
				const int c = m - i < step ? (int)(m - i) : step;
				const block_q8_0 *xs[MAXC_LOOSE];
				const ablk *as[MAXC_LOOSE];
				for (int j = 0; j < c; j++) {
					xs[j] = (const block_q8_0 *)(xq + (size_t)(i + j) * qb);
					as[j] = ap + (size_t)(i + j) * (size_t)nb;
				}
				for (int64_t p = p0; p < p1; p++) {
					const int64_t nr = nrows - PANEL * p < PANEL ? nrows - PANEL * p : PANEL;
					const __mmask16 mask = (__mmask16)((1u << nr) - 1);
					const wblk *wb = mine + (size_t)(p - p0) * (size_t)nb;
					float *o = Y + i * nrows + PANEL * p;
					if (loose)
						switch (c) {
						case 6: kern_loose(6, nb, wb, xs, as, o, (size_t)nrows, mask); break;
						case 5: kern_loose(5, nb, wb, xs, as, o, (size_t)nrows, mask); break;
						case 4: kern_loose(4, nb, wb, xs, as, o, (size_t)nrows, mask); break;
						case 3: kern_loose(3, nb, wb, xs, as, o, (size_t)nrows, mask); break;
						case 2: kern_loose(2, nb, wb, xs, as, o, (size_t)nrows, mask); break;
						default: kern_loose(1, nb, wb, xs, as, o, (size_t)nrows, mask); break;
						}
					else if (c == 3)
						kern(3, nb, wb, xs, as, o, (size_t)nrows, mask);
					else if (c == 2)
						kern(2, nb, wb, xs, as, o, (size_t)nrows, mask);
					else
						kern(1, nb, wb, xs, as, o, (size_t)nrows, mask);
				}
			}
		}
	}
	free(xq);
	free(ap);
	free(wp);
	return 1;
}

int mcv_gemm_q0(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		const float *X, int64_t m, float *Y)
{
	return gemm_q0(type, W, row_stride, nrows, n, X, m, Y, 0);
}

/* Weight rows [r0, r1) only, activations already in Q8_0, Y rows ldy
 * apart, on the calling thread: the piece of a product that one thread of
 * the text prefill's region owns (gemm.h, mcv_matmul_part). */
int mcv_gemm_q0_part(int type, const void *W, size_t row_stride, int64_t r0, int64_t r1, int64_t n,
		     const void *xq, size_t qb, int64_t m, float *Y, size_t ldy)
{
	if ((type != MCV_Q4_0 && type != MCV_Q8_0) || m < MCV_GEMM_Q0_MIN_M || n <= 0 || n % MCV_QK ||
	    r1 <= r0)
		return 0;
	const int64_t nb = n / MCV_QK, nrows = r1 - r0, np = (nrows + PANEL - 1) / PANEL;
	int64_t ch = (int64_t)(CHUNK_BYTES / ((size_t)nb * sizeof(wblk)));
	ch = ch < 1 ? 1 : ch > 8 ? 8 : ch;
	ablk *ap = malloc((size_t)m * (size_t)nb * sizeof(ablk));
	wblk *wp = alloc64((size_t)ch * (size_t)nb * sizeof(wblk));
	if (!ap || !wp) {
		free(ap);
		free(wp);
		return 0;
	}
	const int bias = type == MCV_Q8_0 ? 128 : 8;
	const char *w = (const char *)W + (size_t)r0 * row_stride;
	const unsigned char *xb = xq;
	for (int64_t i = 0; i < m; i++)
		pack_a((const block_q8_0 *)(xb + (size_t)i * qb), bias, nb, ap + (size_t)i * (size_t)nb);
	for (int64_t p0 = 0; p0 < np; p0 += ch) {
		const int64_t p1 = p0 + ch < np ? p0 + ch : np;
		for (int64_t p = p0; p < p1; p++) {
			const int64_t nr = nrows - PANEL * p < PANEL ? nrows - PANEL * p : PANEL;
			pack_w(type, w + (size_t)(PANEL * p) * row_stride, row_stride, (int)nr, nb,
			       wp + (size_t)(p - p0) * (size_t)nb);
		}
		for (int64_t i = 0; i < m; i += MAXC) {
			const int c = m - i < MAXC ? (int)(m - i) : MAXC;
			const block_q8_0 *xs[MAXC];
			const ablk *as[MAXC];
			for (int j = 0; j < c; j++) {
				xs[j] = (const block_q8_0 *)(xb + (size_t)(i + j) * qb);
				as[j] = ap + (size_t)(i + j) * (size_t)nb;
			}
			for (int64_t p = p0; p < p1; p++) {
				const int64_t nr = nrows - PANEL * p < PANEL ? nrows - PANEL * p : PANEL;
				const __mmask16 mask = (__mmask16)((1u << nr) - 1);
				const wblk *wb = wp + (size_t)(p - p0) * (size_t)nb;
				float *o = Y + (size_t)i * ldy + r0 + PANEL * p;
				if (c == 3)
					kern(3, nb, wb, xs, as, o, ldy, mask);
				else if (c == 2)
					kern(2, nb, wb, xs, as, o, ldy, mask);
				else
					kern(1, nb, wb, xs, as, o, ldy, mask);
			}
		}
	}
	free(ap);
	free(wp);
	return 1;
}

void mcv_matmul_loose(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		      const float *X, int64_t m, float *Y)
{
	if (m < 2 || !gemm_q0(type, W, row_stride, nrows, n, X, m, Y, 1))
		mcv_matmul(type, W, row_stride, nrows, n, X, m, Y);
}

/* ---- packed once: the vision tower's row-block products ---- */

/* One quantized activation block: the 32 bytes, the f32 scale and the sum
 * of the bytes (what the weight bias adds, once multiplied by it). */
typedef struct {
	int8_t qs[MCV_QK];
	float d;
	int32_t s;
} vblk;

size_t mcv_vgemm_act_size(int64_t n)
{
	return ((size_t)(n / MCV_QK) * sizeof(vblk) + 63) & ~(size_t)63;
}

void mcv_vgemm_quantize(const float *x, int64_t n, void *act)
{
	vblk *o = act;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		const __m512 v0 = _mm512_loadu_ps(x + b * MCV_QK), v1 = _mm512_loadu_ps(x + b * MCV_QK + 16);
		const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
		const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
		const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
		const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
		_mm_storeu_si128((__m128i *)o[b].qs, _mm512_cvtsepi32_epi8(i0));
		_mm_storeu_si128((__m128i *)(o[b].qs + 16), _mm512_cvtsepi32_epi8(i1));
		o[b].d = d;
		o[b].s = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
	}
}

int mcv_vgemm_pack(mcv_vgemm_w *w, int type, const void *W, size_t row_stride, int64_t nrows, int64_t n)
{
	memset(w, 0, sizeof *w);
	if ((type != MCV_Q4_0 && type != MCV_Q8_0) || n <= 0 || n % MCV_QK || nrows <= 0)
		return 0;
	const int64_t nb = n / MCV_QK, np = (nrows + PANEL - 1) / PANEL;
	wblk *pk = alloc64((size_t)np * (size_t)nb * sizeof(wblk));
	if (!pk)
		return -1;
	for (int64_t p = 0; p < np; p++) {
		const int64_t nr = nrows - PANEL * p < PANEL ? nrows - PANEL * p : PANEL;
		pack_w(type, (const char *)W + (size_t)(PANEL * p) * row_stride, row_stride, (int)nr, nb,
		       pk + (size_t)p * (size_t)nb);
	}
	w->type = type;
	w->nrows = nrows;
	w->n = n;
	w->pk = pk;
	return 1;
}

void mcv_vgemm_free(mcv_vgemm_w *w)
{
	free(w->pk);
	memset(w, 0, sizeof *w);
}

size_t mcv_vgemm_packed_size(int type, int64_t nrows, int64_t n)
{
	if ((type != MCV_Q4_0 && type != MCV_Q8_0) || n <= 0 || n % MCV_QK || nrows <= 0)
		return 0;
	return (size_t)((nrows + PANEL - 1) / PANEL) * (size_t)(n / MCV_QK) * sizeof(wblk);
}

void mcv_gemm_q0_packed(const mcv_vgemm_w *w, int64_t r0, int64_t r1, const void *xq, size_t qb, int64_t m,
			float *Y, size_t ldy)
{
	const int64_t nb = w->n / MCV_QK;
	const int bias = w->type == MCV_Q8_0 ? 128 : 8;
	const unsigned char *xb = xq;
	/* activation offsets for a few rows at a time (on the stack: a row of
	 * 8192 values takes 10 KiB) */
	ablk *ab = __builtin_alloca((size_t)MAXC * (size_t)nb * sizeof(ablk));
	for (int64_t i = 0; i < m; i += MAXC) {
		const int c = m - i < MAXC ? (int)(m - i) : MAXC;
		const block_q8_0 *xs[MAXC];
		const ablk *as[MAXC];
		for (int j = 0; j < c; j++) {
			xs[j] = (const block_q8_0 *)(xb + (size_t)(i + j) * qb);
			pack_a(xs[j], bias, nb, ab + (size_t)j * (size_t)nb);
			as[j] = ab + (size_t)j * (size_t)nb;
		}
		for (int64_t r = r0; r < r1; r += PANEL) {
			const int64_t nr = r1 - r < PANEL ? r1 - r : PANEL;
			const __mmask16 mask = (__mmask16)((1u << nr) - 1);
			const wblk *wb = (const wblk *)w->pk + (size_t)(r / PANEL) * (size_t)nb;
			float *o = Y + (size_t)i * ldy + (r - r0);
			if (c == 3)
				kern(3, nb, wb, xs, as, o, ldy, mask);
			else if (c == 2)
				kern(2, nb, wb, xs, as, o, ldy, mask);
			else
				kern(1, nb, wb, xs, as, o, ldy, mask);
		}
	}
}

/* 16 weight rows x C activation rows, the epilogue (bias, accumulate)
 * included.  The same per-element arithmetic as kern_loose. */
static inline __attribute__((always_inline)) void
kern_v(const int C, int64_t nb, const wblk *w, const vblk *const *x, int32_t wbias, float *o, size_t ldo,
       __mmask16 mask, const float *bias, int mode)
{
	__m512 acc[MAXC_LOOSE];
#pragma GCC unroll 8
	for (int c = 0; c < C; c++)
		acc[c] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m512i p[MAXC_LOOSE];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			p[c] = _mm512_set1_epi32(-wbias * x[c][b].s);
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++) {
			const __m512i u = _mm512_load_si512((const __m512i *)w[b].u[l]);
#pragma GCC unroll 8
			for (int c = 0; c < C; c++) {
				int32_t xs;
				memcpy(&xs, x[c][b].qs + 4 * l, 4);
				p[c] = _mm512_dpbusd_epi32(p[c], u, _mm512_set1_epi32(xs));
			}
		}
		const __m512 wd = _mm512_load_ps(w[b].d);
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(wd, _mm512_set1_ps(x[c][b].d)), _mm512_cvtepi32_ps(p[c]),
						 acc[c]);
	}
	const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
#pragma GCC unroll 8
	for (int c = 0; c < C; c++) {
		__m512 r = _mm512_add_ps(acc[c], bv);
		if (mode == MCV_VGEMM_ADD)
			r = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o + c * ldo), r);
		_mm512_mask_storeu_ps(o + c * ldo, mask, r);
	}
}

void mcv_vgemm_rows(const mcv_vgemm_w *w, const void *act, size_t act_stride, int64_t m,
		    const float *bias, int mode, float *Y, size_t ldy)
{
	const int64_t nb = w->n / MCV_QK, np = (w->nrows + PANEL - 1) / PANEL;
	const int32_t wbias = w->type == MCV_Q8_0 ? 128 : 8;
	const wblk *pk = w->pk;
	for (int64_t p = 0; p < np; p++) {
		const int64_t nr = w->nrows - PANEL * p < PANEL ? w->nrows - PANEL * p : PANEL;
		const __mmask16 mask = (__mmask16)((1u << nr) - 1);
		const wblk *wb = pk + (size_t)p * (size_t)nb;
		const float *bp = bias ? bias + PANEL * p : NULL;
		for (int64_t i = 0; i < m; i += MAXC_LOOSE) {
			const int c = m - i < MAXC_LOOSE ? (int)(m - i) : MAXC_LOOSE;
			const vblk *xs[MAXC_LOOSE];
			for (int j = 0; j < c; j++)
				xs[j] = (const vblk *)((const char *)act + (size_t)(i + j) * act_stride);
			float *o = Y + (size_t)i * ldy + PANEL * p;
			switch (c) {
			case 6: kern_v(6, nb, wb, xs, wbias, o, ldy, mask, bp, mode); break;
			case 5: kern_v(5, nb, wb, xs, wbias, o, ldy, mask, bp, mode); break;
			case 4: kern_v(4, nb, wb, xs, wbias, o, ldy, mask, bp, mode); break;
			case 3: kern_v(3, nb, wb, xs, wbias, o, ldy, mask, bp, mode); break;
			case 2: kern_v(2, nb, wb, xs, wbias, o, ldy, mask, bp, mode); break;
			default: kern_v(1, nb, wb, xs, wbias, o, ldy, mask, bp, mode); break;
			}
		}
	}
}

#else

void mcv_matmul_loose(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		      const float *X, int64_t m, float *Y)
{
	mcv_matmul(type, W, row_stride, nrows, n, X, m, Y);
}

int mcv_gemm_q0(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		const float *X, int64_t m, float *Y)
{
	(void)type, (void)W, (void)row_stride, (void)nrows, (void)n, (void)X, (void)m, (void)Y;
	return 0;
}

int mcv_gemm_q0_part(int type, const void *W, size_t row_stride, int64_t r0, int64_t r1, int64_t n,
		     const void *xq, size_t qb, int64_t m, float *Y, size_t ldy)
{
	(void)type, (void)W, (void)row_stride, (void)r0, (void)r1, (void)n, (void)xq, (void)qb, (void)m,
		(void)Y, (void)ldy;
	return 0;
}

int mcv_vgemm_pack(mcv_vgemm_w *w, int type, const void *W, size_t row_stride, int64_t nrows, int64_t n)
{
	(void)type, (void)W, (void)row_stride, (void)nrows, (void)n;
	memset(w, 0, sizeof *w);
	return 0;
}

void mcv_vgemm_free(mcv_vgemm_w *w)
{
	memset(w, 0, sizeof *w);
}

size_t mcv_vgemm_packed_size(int type, int64_t nrows, int64_t n)
{
	(void)type, (void)nrows, (void)n;
	return 0;
}

/* never called: nothing is packed in this build */
void mcv_gemm_q0_packed(const mcv_vgemm_w *w, int64_t r0, int64_t r1, const void *xq, size_t qb, int64_t m,
			float *Y, size_t ldy)
{
	(void)w, (void)r0, (void)r1, (void)xq, (void)qb, (void)m, (void)Y, (void)ldy;
}

size_t mcv_vgemm_act_size(int64_t n)
{
	(void)n;
	return 0;
}

/* never called: mcv_vgemm_pack packs nothing in this build */
void mcv_vgemm_quantize(const float *x, int64_t n, void *act)
{
	(void)x, (void)n, (void)act;
}

void mcv_vgemm_rows(const mcv_vgemm_w *w, const void *act, size_t act_stride, int64_t m,
		    const float *bias, int mode, float *Y, size_t ldy)
{
	(void)w, (void)act, (void)act_stride, (void)m, (void)bias, (void)mode, (void)Y, (void)ldy;
}

#endif

/* Fast dots of the 32-element block types: Q4_0.Q8_0 and Q8_0.Q8_0.
 *
 * One kernel shape serves decode and prefill: a tile of R weight rows by C
 * activation rows.  Per block, the integer dot of each (row, activation)
 * pair runs in 8 int32 lanes, is converted to float, scaled by the product of
 * the two block scales and added into that pair's float accumulator; one
 * horizontal sum at the end.  A pair goes through exactly the same
 * operations whatever R and C are, so a result does not depend on the tile it
 * was computed in (matmul == matvec == vec_dot, bit for bit).  Against the
 * scalar oracle only the float summation order differs. */
#include "dot_kernels.h"
#include "dot_simd.h"

#ifdef MCV_DOT_AVX2

/* Q4_0 block as 32 unsigned nibbles in element order (low nibbles are
 * elements 0..15, high nibbles 16..31). */
static inline __m256i q4_0_nibbles(const uint8_t *qs)
{
	__m128i q = _mm_loadu_si128((const __m128i *)qs);
	__m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
	return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

static inline __m256 half_bcast(mcv_half h)
{
	return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
}

/* Weight types differ in how a block becomes unsigned bytes u and in the
 * per-activation integer offset that corrects for it:
 *   Q4_0: u = q (0..15), x = u - 8:            offset -8 * sum(y)
 *   Q8_0 (VNNI): u = x + 128 (x xor 0x80):      offset -128 * sum(y)
 *   Q8_0 (AVX2): u = |x|, y takes x's sign:     no offset; the sign step
 *        is per pair, since maddubs would overflow int16 with u up to 255. */
#if defined(MCV_DOT_VNNI)
#define Q8_0_BIASED 1
#endif

static inline __attribute__((always_inline)) void
q0_tile(const int type, const int R, const int C, int64_t n, const char *w, size_t stride,
	const block_q8_0 *const *y, float *out, size_t ldo)
{
	const int64_t nb = n / MCV_QK;
	const size_t bsz = type == MCV_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q8_0);
	__m256 acc[4][4]; /* R, C <= 4; fixed sizes keep them in registers */
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++)
			acc[r][c] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m256i yv[4], yo[4];
		__m256 yd[4];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++) {
			yv[c] = _mm256_loadu_si256((const __m256i *)y[c][b].qs);
			yd[c] = half_bcast(y[c][b].d);
			if (type == MCV_Q4_0)
				yo[c] = _mm256_sub_epi32(_mm256_setzero_si256(),
							 mcv_dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(8), yv[c]));
#ifdef Q8_0_BIASED
			else
				yo[c] = _mm256_sub_epi32(_mm256_setzero_si256(),
							 mcv_dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(-128), yv[c]));
#else
			else
				yo[c] = _mm256_setzero_si256();
#endif
		}
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			const char *blk = w + r * stride + b * bsz;
			const __m256 xd = half_bcast(*(const mcv_half *)blk);
			__m256i u;
			if (type == MCV_Q4_0)
				u = q4_0_nibbles(((const block_q4_0 *)blk)->qs);
			else
				u = _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)blk)->qs);
#ifdef Q8_0_BIASED
			if (type == MCV_Q8_0)
				u = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
#else
			const __m256i sx = u;
			if (type == MCV_Q8_0)
				u = _mm256_abs_epi8(u);
#endif
#pragma GCC unroll 8
			for (int c = 0; c < C; c++) {
				__m256i yc = yv[c];
#ifndef Q8_0_BIASED
				if (type == MCV_Q8_0)
					yc = _mm256_sign_epi8(yc, sx);
#endif
				__m256i p = mcv_dpbusd(yo[c], u, yc);
				acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(xd, yd[c]), _mm256_cvtepi32_ps(p), acc[r][c]);
			}
		}
	}
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++)
			out[r + c * ldo] = mcv_hsum8(acc[r][c]);
}

/* Tiles of weight rows x activation rows for the prefill path. */
#define TILE_FNS(T, NAME)                                                                          \
	static void NAME##_t11(int64_t n, const void *w, size_t s, const void *const *y, float *o, size_t l) \
	{ q0_tile(T, 1, 1, n, w, s, (const block_q8_0 *const *)y, o, l); }                     \
	static void NAME##_t41(int64_t n, const void *w, size_t s, const void *const *y, float *o, size_t l) \
	{ q0_tile(T, 4, 1, n, w, s, (const block_q8_0 *const *)y, o, l); }                     \
	static void NAME##_t14(int64_t n, const void *w, size_t s, const void *const *y, float *o, size_t l) \
	{ q0_tile(T, 1, 4, n, w, s, (const block_q8_0 *const *)y, o, l); }                     \
	static void NAME##_t44(int64_t n, const void *w, size_t s, const void *const *y, float *o, size_t l) \
	{ q0_tile(T, 4, 4, n, w, s, (const block_q8_0 *const *)y, o, l); }                     \
	static const mcv_tiles NAME##_tiles = { NAME##_t11, NAME##_t41, NAME##_t14, NAME##_t44 };

TILE_FNS(MCV_Q4_0, q4_0)
TILE_FNS(MCV_Q8_0, q8_0)

float mcv_dot_q4_0_fast(int64_t n, const void *w, const void *xq)
{
	float out;
	q4_0_t11(n, w, 0, &xq, &out, 1);
	return out;
}

float mcv_dot_q8_0_fast(int64_t n, const void *w, const void *xq)
{
	float out;
	q8_0_t11(n, w, 0, &xq, &out, 1);
	return out;
}

void mcv_dot_q4_0_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	q4_0_t41(n, w, stride, &xq, out, 1);
}

void mcv_dot_q8_0_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	q8_0_t41(n, w, stride, &xq, out, 1);
}

const mcv_tiles *mcv_tiles_q0(int type)
{
	return type == MCV_Q4_0 ? &q4_0_tiles : type == MCV_Q8_0 ? &q8_0_tiles : NULL;
}

#else

void mcv_dot_q4_0_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_q4_0_ref(n, (const char *)w + r * stride, xq);
}
void mcv_dot_q8_0_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_q8_0_ref(n, (const char *)w + r * stride, xq);
}
float mcv_dot_q4_0_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q4_0_ref(n, w, xq); }
float mcv_dot_q8_0_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q8_0_ref(n, w, xq); }
const mcv_tiles *mcv_tiles_q0(int type)
{
	(void)type;
	return NULL;
}

#endif

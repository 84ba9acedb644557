/* Fast dots of the K-quants against Q8_K.
 *
 * Per super-block: unsigned quants times int8 activations give int16 pair
 * sums (maddubs), which are multiplied by the integer sub-block scales and
 * summed into int32 lanes (madd, or vpdpwssd with AVX-512 VNNI).  Offsets
 * (the -32 of Q6_K, the -4 of Q3_K) and the mins of Q2_K/Q4_K/Q5_K come from
 * the activation's bsums.  The block's float scales are applied once per
 * block into float lanes; one horizontal sum at the end. */
#include "dot_kernels.h"
#include "dot_simd.h"

#ifdef MCV_DOT_AVX2

/* Shuffle controls that broadcast int16 word 2k of a 128-bit lane into the
 * low lane and word 2k+1 into the high lane (16-element sub-blocks), or word
 * k into both lanes (32-element sub-blocks). */
static inline __m256i bcast_pair(__m256i w, int k)
{
	const __m256i ctl = _mm256_setr_epi8(
		4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1,
		4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1,
		4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3,
		4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3);
	return _mm256_shuffle_epi8(w, ctl);
}

static inline __m256i bcast_word(__m256i w, int k)
{
	return _mm256_shuffle_epi8(w, _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k))));
}

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Q4_K / Q5_K: 8 scales and 8 mins as bytes (see mcv_k4_scale_min). */
static inline void k4_unpack(const uint8_t *s, uint32_t sc[2], uint32_t mn[2])
{
	uint32_t u[3];
	memcpy(u, s, 12);
	sc[0] = u[0] & 0x3f3f3f3f;
	mn[0] = u[1] & 0x3f3f3f3f;
	sc[1] = (u[2] & 0x0f0f0f0f) | ((u[0] >> 6) & 0x03030303) << 4;
	mn[1] = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 6) & 0x03030303) << 4;
}

static inline __m256i k4_scales16(const uint32_t sc[2])
{
	return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc[1], (int)sc[0])));
}

/* Row-independent part of the min term: the 8 sums of bsums pairs (one per
 * 32-element sub-block) as int16 (|sum| <= 32*127). */
static inline __m128i k4_pairsums(const int16_t *bsums)
{
	__m256i p = _mm256_madd_epi16(load256(bsums), _mm256_set1_epi16(1));
	return _mm_packs_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}

/* d*yd and dmin*yd in lanes 0 and 1 (d and dmin are adjacent halves). */
static inline __m128 k_d_dmin(const mcv_half *dd, float yd)
{
	uint32_t two;
	memcpy(&two, dd, 4);
	return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)two)), _mm_set1_ps(yd));
}

static inline float mcv_hsum4(__m128 s)
{
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* R rows against one activation row; each row's operations are the same
 * whatever R is, so four-row and one-row results agree bit for bit. */
static inline __attribute__((always_inline)) void
q4_K_rows(const int R, int64_t n, const char *w, size_t stride, const block_q8_K *y, float *out)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	__m256 acc[4]; /* R <= 4 */
	__m128 accm[4];
	for (int r = 0; r < R; r++) {
		acc[r] = _mm256_setzero_ps();
		accm[r] = _mm_setzero_ps();
	}
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const __m128i ps = k4_pairsums(y[b].bsums);
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			const block_q4_K *x = (const block_q4_K *)(w + r * stride) + b;
			uint32_t sc[2], mn[2];
			k4_unpack(x->scales, sc, mn);
			const __m256i s16 = k4_scales16(sc);
			/* two chains: low and high nibbles */
			__m256i ia = _mm256_setzero_si256(), ib = _mm256_setzero_si256();
#pragma GCC unroll 4
			for (int c = 0; c < 4; c++) {
				__m256i q = load256(x->qs + 32 * c);
				__m256i lo = _mm256_and_si256(q, m4);
				__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
				ia = mcv_dpwssd(ia, _mm256_maddubs_epi16(lo, load256(y[b].qs + 64 * c)), bcast_word(s16, 2 * c));
				ib = mcv_dpwssd(ib, _mm256_maddubs_epi16(hi, load256(y[b].qs + 64 * c + 32)),
						bcast_word(s16, 2 * c + 1));
			}
			const __m128 dd = k_d_dmin(&x->d, y[b].d);
			const __m128i m16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]));
			acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(_mm256_add_epi32(ia, ib)), acc[r]);
			accm[r] = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, 0x55), _mm_cvtepi32_ps(_mm_madd_epi16(m16, ps)), accm[r]);
		}
	}
	for (int r = 0; r < R; r++)
		out[r] = mcv_hsum8(acc[r]) - mcv_hsum4(accm[r]);
}

/* One weight row against C activation rows (prefill): the row's unpacking
 * (scales, nibbles) is shared; each pair's float operations are those of
 * q4_K_rows, so results are the same bits. */
static inline __attribute__((always_inline)) void
q4_K_cols(const int C, int64_t n, const block_q4_K *x, const void *const *xs, float *out, size_t ldo)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	__m256 acc[4]; /* C <= 4 */
	__m128 accm[4];
#pragma GCC unroll 4
	for (int c = 0; c < C; c++) {
		acc[c] = _mm256_setzero_ps();
		accm[c] = _mm_setzero_ps();
	}
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		uint32_t sc[2], mn[2];
		k4_unpack(x[b].scales, sc, mn);
		const __m256i s16 = k4_scales16(sc);
		const __m128i m16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]));
		__m256i is[4];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++)
			is[c] = _mm256_setzero_si256();
#pragma GCC unroll 4
		for (int k = 0; k < 4; k++) {
			const __m256i q = load256(x[b].qs + 32 * k);
			const __m256i lo = _mm256_and_si256(q, m4);
			const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
			const __m256i slo = bcast_word(s16, 2 * k), shi = bcast_word(s16, 2 * k + 1);
#pragma GCC unroll 4
			for (int c = 0; c < C; c++) {
				const block_q8_K *y = (const block_q8_K *)xs[c] + b;
				is[c] = mcv_dpwssd(is[c], _mm256_maddubs_epi16(lo, load256(y->qs + 64 * k)), slo);
				is[c] = mcv_dpwssd(is[c], _mm256_maddubs_epi16(hi, load256(y->qs + 64 * k + 32)), shi);
			}
		}
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			const block_q8_K *y = (const block_q8_K *)xs[c] + b;
			const __m128 dd = k_d_dmin(&x[b].d, y->d);
			const __m128i ps = k4_pairsums(y->bsums);
			acc[c] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(is[c]), acc[c]);
			accm[c] = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, 0x55), _mm_cvtepi32_ps(_mm_madd_epi16(m16, ps)), accm[c]);
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < C; c++)
		out[c * ldo] = mcv_hsum8(acc[c]) - mcv_hsum4(accm[c]);
}

static void q4_K_t11(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	(void)s, (void)l;
	q4_K_rows(1, n, w, 0, x[0], o);
}
static void q4_K_t41(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	(void)l;
	q4_K_rows(4, n, w, s, x[0], o);
}
static void q4_K_t14(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	(void)s;
	q4_K_cols(4, n, w, x, o, l);
}
static void q4_K_t44(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	for (int r = 0; r < 4; r++)
		q4_K_cols(4, n, (const block_q4_K *)((const char *)w + r * s), x, o + r, l);
}
static const mcv_tiles q4_K_tiles = { q4_K_t11, q4_K_t41, q4_K_t14, q4_K_t44 };


float mcv_dot_q4_K_fast(int64_t n, const void *w, const void *xq)
{
	float out;
	q4_K_rows(1, n, w, 0, xq, &out);
	return out;
}

void mcv_dot_q4_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	q4_K_rows(4, n, w, stride, xq, out);
}

static inline __attribute__((always_inline)) void
q5_K_rows(const int R, int64_t n, const char *w, size_t stride, const block_q8_K *y, float *out)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
	__m256 acc[4]; /* R <= 4 */
	__m128 accm[4];
	for (int r = 0; r < R; r++) {
		acc[r] = _mm256_setzero_ps();
		accm[r] = _mm_setzero_ps();
	}
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const __m128i ps = k4_pairsums(y[b].bsums);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const block_q5_K *x = (const block_q5_K *)(w + r * stride) + b;
			uint32_t sc[2], mn[2];
			k4_unpack(x->scales, sc, mn);
			const __m256i s16 = k4_scales16(sc);
			/* Bit j of qh[l] is the fifth bit of element l of sub-block
			 * j; shifting right by 2 per chunk brings bits 2c, 2c+1 to
			 * 0, 1.  (16-bit shifts: bits crossing into the other byte
			 * are never the ones kept.) */
			__m256i hv = load256(x->qh);
			__m256i ia = _mm256_setzero_si256(), ib = _mm256_setzero_si256();
#pragma GCC unroll 4
			for (int c = 0; c < 4; c++) {
				__m256i q = load256(x->qs + 32 * c);
				__m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4),
							     _mm256_and_si256(_mm256_slli_epi16(hv, 4), b4));
				__m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
							     _mm256_and_si256(_mm256_slli_epi16(hv, 3), b4));
				hv = _mm256_srli_epi16(hv, 2);
				ia = mcv_dpwssd(ia, _mm256_maddubs_epi16(lo, load256(y[b].qs + 64 * c)), bcast_word(s16, 2 * c));
				ib = mcv_dpwssd(ib, _mm256_maddubs_epi16(hi, load256(y[b].qs + 64 * c + 32)),
						bcast_word(s16, 2 * c + 1));
			}
			const __m128 dd = k_d_dmin(&x->d, y[b].d);
			const __m128i m16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]));
			acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(_mm256_add_epi32(ia, ib)), acc[r]);
			accm[r] = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, 0x55), _mm_cvtepi32_ps(_mm_madd_epi16(m16, ps)), accm[r]);
		}
	}
	for (int r = 0; r < R; r++)
		out[r] = mcv_hsum8(acc[r]) - mcv_hsum4(accm[r]);
}

float mcv_dot_q5_K_fast(int64_t n, const void *w, const void *xq)
{
	float out;
	q5_K_rows(1, n, w, 0, xq, &out);
	return out;
}

void mcv_dot_q5_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	q5_K_rows(4, n, w, stride, xq, out);
}

static inline __attribute__((always_inline)) void
q6_K_rows(const int R, int64_t n, const char *w, size_t stride, const block_q8_K *y, float *out)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x30);
	__m256 acc[4]; /* R <= 4 */
	for (int r = 0; r < R; r++)
		acc[r] = _mm256_setzero_ps();
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const __m256i bs = load256(y[b].bsums);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const block_q6_K *x = (const block_q6_K *)(w + r * stride) + b;
			const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
			/* Quants are stored +32: subtract 32 * sum_g scale_g * bsum_g. */
			__m256i off = _mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(sc8));
			__m256i ia = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
			__m256i ib = _mm256_setzero_si256();
#pragma GCC unroll 2
			for (int h = 0; h < 2; h++) {
				const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_unpackhi_epi64(sc8, sc8) : sc8));
				const __m256i qa = load256(x->ql + 64 * h), qb = load256(x->ql + 64 * h + 32);
				const __m256i qh = load256(x->qh + 32 * h);
				const int8_t *q8 = y[b].qs + 128 * h;
				__m256i v0 = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m3));
				__m256i v1 = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m3));
				__m256i v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(qh, m3));
				__m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
							     _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3));
				ia = mcv_dpwssd(ia, _mm256_maddubs_epi16(v0, load256(q8)), bcast_pair(s16, 0));
				ib = mcv_dpwssd(ib, _mm256_maddubs_epi16(v1, load256(q8 + 32)), bcast_pair(s16, 1));
				ia = mcv_dpwssd(ia, _mm256_maddubs_epi16(v2, load256(q8 + 64)), bcast_pair(s16, 2));
				ib = mcv_dpwssd(ib, _mm256_maddubs_epi16(v3, load256(q8 + 96)), bcast_pair(s16, 3));
			}
			const __m256 d = _mm256_mul_ps(_mm256_set1_ps(y[b].d), _mm256_cvtph_ps(_mm_set1_epi16((short)x->d)));
			acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(ia, ib)), acc[r]);
		}
	}
	for (int r = 0; r < R; r++)
		out[r] = mcv_hsum8(acc[r]);
}

/* One Q6_K row against C activation rows (prefill), sharing the row's
 * unpacking; per pair the same operations as q6_K_rows. */
static inline __attribute__((always_inline)) void
q6_K_cols(const int C, int64_t n, const block_q6_K *x, const void *const *xs, float *out, size_t ldo)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x30);
	__m256 acc[4]; /* C <= 4 */
#pragma GCC unroll 4
	for (int c = 0; c < C; c++)
		acc[c] = _mm256_setzero_ps();
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[b].scales);
		const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
		__m256i is[4];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			const block_q8_K *y = (const block_q8_K *)xs[c] + b;
			is[c] = _mm256_sub_epi32(_mm256_setzero_si256(),
						 _mm256_slli_epi32(_mm256_madd_epi16(load256(y->bsums), sc16), 5));
		}
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_unpackhi_epi64(sc8, sc8) : sc8));
			const __m256i qa = load256(x[b].ql + 64 * h), qb = load256(x[b].ql + 64 * h + 32);
			const __m256i qh = load256(x[b].qh + 32 * h);
			const __m256i v[4] = {
				_mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m3)),
				_mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m3)),
				_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(qh, m3)),
				_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
						_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3)),
			};
#pragma GCC unroll 4
			for (int k = 0; k < 4; k++) {
				const __m256i sk = bcast_pair(s16, k);
#pragma GCC unroll 4
				for (int c = 0; c < C; c++) {
					const block_q8_K *y = (const block_q8_K *)xs[c] + b;
					is[c] = mcv_dpwssd(is[c], _mm256_maddubs_epi16(v[k], load256(y->qs + 128 * h + 32 * k)), sk);
				}
			}
		}
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			const block_q8_K *y = (const block_q8_K *)xs[c] + b;
			const __m256 d = _mm256_mul_ps(_mm256_set1_ps(y->d), _mm256_cvtph_ps(_mm_set1_epi16((short)x[b].d)));
			acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(is[c]), acc[c]);
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < C; c++)
		out[c * ldo] = mcv_hsum8(acc[c]);
}

static void q6_K_t11(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	(void)s, (void)l;
	q6_K_rows(1, n, w, 0, x[0], o);
}
static void q6_K_t41(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	(void)l;
	q6_K_rows(4, n, w, s, x[0], o);
}
static void q6_K_t14(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	(void)s;
	q6_K_cols(4, n, w, x, o, l);
}
static void q6_K_t44(int64_t n, const void *w, size_t s, const void *const *x, float *o, size_t l)
{
	for (int r = 0; r < 4; r++)
		q6_K_cols(4, n, (const block_q6_K *)((const char *)w + r * s), x, o + r, l);
}
static const mcv_tiles q6_K_tiles = { q6_K_t11, q6_K_t41, q6_K_t14, q6_K_t44 };

const mcv_tiles *mcv_tiles_k(int type)
{
	return type == MCV_Q4_K ? &q4_K_tiles : type == MCV_Q6_K ? &q6_K_tiles : NULL;
}

float mcv_dot_q6_K_fast(int64_t n, const void *w, const void *xq)
{
	float out;
	q6_K_rows(1, n, w, 0, xq, &out);
	return out;
}

void mcv_dot_q6_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	q6_K_rows(4, n, w, stride, xq, out);
}

static inline __attribute__((always_inline)) void
q2_K_rows(const int R, int64_t n, const char *w, size_t stride, const block_q8_K *y, float *out)
{
	const __m256i m2 = _mm256_set1_epi8(3);
	__m256 acc[4], accm[4]; /* R <= 4 */
	for (int r = 0; r < R; r++)
		acc[r] = accm[r] = _mm256_setzero_ps();
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const __m256i bs = load256(y[b].bsums);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const block_q2_K *x = (const block_q2_K *)(w + r * stride) + b;
			const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
			const __m128i scl = _mm_and_si128(sc8, _mm_set1_epi8(0x0F));
			const __m128i mnv = _mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F));
			const __m256i msum = _mm256_madd_epi16(bs, _mm256_cvtepu8_epi16(mnv));
			__m256i ia = _mm256_setzero_si256(), ib = _mm256_setzero_si256();
#pragma GCC unroll 2
			for (int h = 0; h < 2; h++) {
				const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(h ? _mm_unpackhi_epi64(scl, scl) : scl));
				const __m256i q = load256(x->qs + 32 * h);
				const int8_t *q8 = y[b].qs + 128 * h;
				ia = mcv_dpwssd(ia, _mm256_maddubs_epi16(_mm256_and_si256(q, m2), load256(q8)), bcast_pair(s16, 0));
				ib = mcv_dpwssd(ib, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 2), m2), load256(q8 + 32)),
						bcast_pair(s16, 1));
				ia = mcv_dpwssd(ia, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m2), load256(q8 + 64)),
						bcast_pair(s16, 2));
				ib = mcv_dpwssd(ib, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 6), m2), load256(q8 + 96)),
						bcast_pair(s16, 3));
			}
			const __m128 dd = k_d_dmin(&x->d, y[b].d);
			acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(_mm256_add_epi32(ia, ib)), acc[r]);
			accm[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_shuffle_ps(dd, dd, 0x55)), _mm256_cvtepi32_ps(msum), accm[r]);
		}
	}
	for (int r = 0; r < R; r++)
		out[r] = mcv_hsum8(_mm256_sub_ps(acc[r], accm[r]));
}

float mcv_dot_q2_K_fast(int64_t n, const void *w, const void *xq)
{
	float out;
	q2_K_rows(1, n, w, 0, xq, &out);
	return out;
}

void mcv_dot_q2_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	q2_K_rows(4, n, w, stride, xq, out);
}

/* The 16 Q3_K scales, unbiased, as bytes (layout: see mcv_q3k_scales). */
static inline __m128i q3k_scales(const uint8_t *s)
{
	uint32_t u[3];
	memcpy(u, s, 12);
	const uint32_t lo = 0x0f0f0f0f, hi = 0x03030303;
	__m128i v = _mm_setr_epi32((int)((u[0] & lo) | ((u[2] & hi) << 4)),
				   (int)((u[1] & lo) | (((u[2] >> 2) & hi) << 4)),
				   (int)(((u[0] >> 4) & lo) | (((u[2] >> 4) & hi) << 4)),
				   (int)(((u[1] >> 4) & lo) | (((u[2] >> 6) & hi) << 4)));
	return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

static inline __attribute__((always_inline)) void
q3_K_rows(const int R, int64_t n, const char *w, size_t stride, const block_q8_K *y, float *out)
{
	const __m256i m2 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
	__m256 acc[4]; /* R <= 4 */
	for (int r = 0; r < R; r++)
		acc[r] = _mm256_setzero_ps();
	for (int64_t b = 0; b < n / MCV_QK_K; b++) {
		const __m256i bs = load256(y[b].bsums);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const block_q3_K *x = (const block_q3_K *)(w + r * stride) + b;
			const __m128i sc8 = q3k_scales(x->scales);
			/* u = q + 4 in 0..7 (low two bits, high bit set means no
			 * -4): subtract 4 * sum_g scale_g * bsum_g. */
			__m256i off = _mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(sc8));
			__m256i ia = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 2));
			__m256i ib = _mm256_setzero_si256();
			__m256i hv = load256(x->hmask);
#pragma GCC unroll 2
			for (int h = 0; h < 2; h++) {
				const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_unpackhi_epi64(sc8, sc8) : sc8));
				const __m256i q = load256(x->qs + 32 * h);
				const int8_t *q8 = y[b].qs + 128 * h;
#pragma GCC unroll 4
				for (int p = 0; p < 4; p++) {
					__m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * p), m2);
					u = _mm256_or_si256(u, _mm256_and_si256(_mm256_slli_epi16(hv, 2), b2));
					hv = _mm256_srli_epi16(hv, 1);
					__m256i t = mcv_dpwssd(p & 1 ? ib : ia, _mm256_maddubs_epi16(u, load256(q8 + 32 * p)),
							       bcast_pair(s16, p));
					if (p & 1)
						ib = t;
					else
						ia = t;
				}
			}
			const __m256 d = _mm256_mul_ps(_mm256_set1_ps(y[b].d), _mm256_cvtph_ps(_mm_set1_epi16((short)x->d)));
			acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(ia, ib)), acc[r]);
		}
	}
	for (int r = 0; r < R; r++)
		out[r] = mcv_hsum8(acc[r]);
}

float mcv_dot_q3_K_fast(int64_t n, const void *w, const void *xq)
{
	float out;
	q3_K_rows(1, n, w, 0, xq, &out);
	return out;
}

void mcv_dot_q3_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	q3_K_rows(4, n, w, stride, xq, out);
}

#else

const mcv_tiles *mcv_tiles_k(int type)
{
	(void)type;
	return NULL;
}

void mcv_dot_q4_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_q4_K_ref(n, (const char *)w + r * stride, xq);
}
float mcv_dot_q2_K_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q2_K_ref(n, w, xq); }
void mcv_dot_q2_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_q2_K_ref(n, (const char *)w + r * stride, xq);
}
void mcv_dot_q3_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_q3_K_ref(n, (const char *)w + r * stride, xq);
}
float mcv_dot_q3_K_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q3_K_ref(n, w, xq); }
float mcv_dot_q4_K_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q4_K_ref(n, w, xq); }
float mcv_dot_q5_K_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q5_K_ref(n, w, xq); }
float mcv_dot_q6_K_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q6_K_ref(n, w, xq); }
void mcv_dot_q5_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_q5_K_ref(n, (const char *)w + r * stride, xq);
}
void mcv_dot_q6_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out)
{
	for (int r = 0; r < 4; r++)
		out[r] = mcv_dot_q6_K_ref(n, (const char *)w + r * stride, xq);
}

#endif

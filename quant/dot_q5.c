/* Dots of the 5-bit 32-element types: Q5_0.Q8_0 and Q5_1.Q8_1 (ggml's
 * pairing).  Each block's integer dot is exact; the float work per block
 * (scale product times integer sum, plus Q5_1's offset m * s) is done in
 * the same order in the scalar oracle and the SIMD kernel, so both give the
 * same bits.  These types only appear where llama.cpp's recipes fall back
 * from Q4_K / Q5_K (rows not a multiple of 256), so one row at a time is
 * enough. */
#include "dot_kernels.h"
#include "dot_simd.h"

static inline int q5_level(const uint8_t *qs, uint32_t qh, int j)
{
	int lo = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
	return lo | (int)(((qh >> j) & 1) << 4);
}

float mcv_dot_q5_0_ref(int64_t n, const void *w, const void *xq)
{
	const block_q5_0 *x = w;
	const block_q8_0 *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		uint32_t qh;
		memcpy(&qh, x[b].qh, 4);
		int isum = 0;
		for (int j = 0; j < MCV_QK; j++)
			isum += (q5_level(x[b].qs, qh, j) - 16) * y[b].qs[j];
		sum += (mcv_fp16_to_fp32(x[b].d) * mcv_fp16_to_fp32(y[b].d)) * isum;
	}
	return sum;
}

float mcv_dot_q5_1_ref(int64_t n, const void *w, const void *xq)
{
	const block_q5_1 *x = w;
	const block_q8_1 *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		uint32_t qh;
		memcpy(&qh, x[b].qh, 4);
		int isum = 0;
		for (int j = 0; j < MCV_QK; j++)
			isum += q5_level(x[b].qs, qh, j) * y[b].qs[j];
		sum += (mcv_fp16_to_fp32(x[b].d) * mcv_fp16_to_fp32(y[b].d)) * isum +
		       mcv_fp16_to_fp32(x[b].m) * mcv_fp16_to_fp32(y[b].s);
	}
	return sum;
}

#ifdef MCV_DOT_AVX2

/* The 32 levels 0..31 of a block as unsigned bytes in element order. */
static inline __m256i q5_bytes(const uint8_t *qs, const uint8_t *qhp)
{
	__m128i q = _mm_loadu_si128((const __m128i *)qs);
	__m256i lo = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
				      _mm256_set1_epi8(0x0F));
	uint32_t qh;
	memcpy(&qh, qhp, 4);
	/* Byte i takes byte i/8 of qh, then tests its bit i%8. */
	__m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
					_mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll,
							   0x0303030303030303ll));
	const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
	h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
	return _mm256_or_si256(lo, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
}

float mcv_dot_q5_0_fast(int64_t n, const void *w, const void *xq)
{
	const block_q5_0 *x = w;
	const block_q8_0 *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		__m256i u = q5_bytes(x[b].qs, x[b].qh);
		__m256i yv = _mm256_loadu_si256((const __m256i *)y[b].qs);
		__m256i off = mcv_dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(16), yv);
		__m256i p = _mm256_sub_epi32(mcv_dpbusd(_mm256_setzero_si256(), u, yv), off);
		sum += (mcv_h2f(x[b].d) * mcv_h2f(y[b].d)) * mcv_hsum8i(p);
	}
	return sum;
}

float mcv_dot_q5_1_fast(int64_t n, const void *w, const void *xq)
{
	const block_q5_1 *x = w;
	const block_q8_1 *y = xq;
	float sum = 0;
	for (int64_t b = 0; b < n / MCV_QK; b++) {
		__m256i u = q5_bytes(x[b].qs, x[b].qh);
		__m256i yv = _mm256_loadu_si256((const __m256i *)y[b].qs);
		int isum = mcv_hsum8i(mcv_dpbusd(_mm256_setzero_si256(), u, yv));
		sum += (mcv_h2f(x[b].d) * mcv_h2f(y[b].d)) * isum + mcv_h2f(x[b].m) * mcv_h2f(y[b].s);
	}
	return sum;
}

#else

float mcv_dot_q5_0_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q5_0_ref(n, w, xq); }
float mcv_dot_q5_1_fast(int64_t n, const void *w, const void *xq) { return mcv_dot_q5_1_ref(n, w, xq); }

#endif

/* Private to quant/dot_*.c, act.c and matvec.c: the per-type dot kernels
 * behind mcv_vec_dot / mcv_vec_dot_ref, and the scale unpacking they share.
 * Every kernel has the shape  float f(int64_t n, const void *w, const void *xq)
 * with n a multiple of the type's block size and xq in its vec_dot_type. */
#ifndef MCV_DOT_KERNELS_H
#define MCV_DOT_KERNELS_H

#include "blocks.h"
#include "quant.h"

#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

typedef float (*mcv_dot_fn)(int64_t n, const void *w, const void *xq);

/* Scalar oracles (dot_ref.c). */
float mcv_dot_f32_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_f16_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_bf16_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_q4_0_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_q8_0_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_q5_0_ref(int64_t n, const void *w, const void *xq); /* .Q8_0 */
float mcv_dot_q5_1_ref(int64_t n, const void *w, const void *xq); /* .Q8_1 */
float mcv_dot_q2_K_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_q3_K_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_q4_K_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_q5_K_ref(int64_t n, const void *w, const void *xq);
float mcv_dot_q6_K_ref(int64_t n, const void *w, const void *xq);

/* Fast kernels; on a build without the SIMD they need, they are the scalar
 * ones (dot_float.c, dot_q0.c, dot_k.c). */
float mcv_dot_f32_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_f16_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_bf16_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q4_0_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q8_0_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q5_0_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q5_1_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q2_K_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q3_K_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q4_K_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q5_K_fast(int64_t n, const void *w, const void *xq);
float mcv_dot_q6_K_fast(int64_t n, const void *w, const void *xq);

/* Four rows at once (row r at w + r*stride), sharing the activation work.
 * Each row's result is bit-identical to the single-row fast kernel's. */
typedef void (*mcv_dot4_fn)(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_q4_0_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_q8_0_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_f32_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_f16_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_q2_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_q3_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_q4_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_q5_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);
void mcv_dot_q6_K_rows4(int64_t n, const void *w, size_t stride, const void *xq, float *out);

/* Register tiles for prefill: R weight rows (stride bytes apart) by C
 * activation rows (x[c], in the vec_dot_type); out[r + c*ldo].  Each
 * element is bit-identical to the single-row fast kernel's result. */
typedef void (*mcv_tile_fn)(int64_t n, const void *w, size_t stride, const void *const *x, float *out,
			    size_t ldo);
typedef struct {
	mcv_tile_fn t11, t41, t14, t44; /* R x C = 1x1, 4x1, 1x4, 4x4 */
} mcv_tiles;
/* NULL for a type (or a build) without tiles. */
const mcv_tiles *mcv_tiles_q0(int type);    /* Q4_0, Q8_0 */
const mcv_tiles *mcv_tiles_float(int type); /* F32, F16 */
/* Whether F32 products of two or more activation rows take the tiles'
 * order (llama.cpp's tiled GEMM takes such a matrix) rather than the
 * single-row dot's (nrows: the whole matrix's rows, 0 for a routed expert;
 * n: its columns). */
int mcv_f32_tiled(int64_t nrows, int64_t n);
const mcv_tiles *mcv_tiles_k(int type);     /* Q4_K, Q6_K */

/* Kernel for a weight type; NULL if the type has no dot (e.g. Q8_K). */
mcv_dot_fn mcv_dot_kernel(int type, int fast);
/* Four-row kernel of a type, NULL if it has none. */
mcv_dot4_fn mcv_dot4_kernel(int type);

/* Widening of a stored half.  F16C gives the same bits as the portable
 * conversion for every input that is not a NaN. */
static inline float mcv_h2f(mcv_half h)
{
#if defined(__F16C__)
	return _cvtsh_ss(h);
#else
	return mcv_fp16_to_fp32(h);
#endif
}

/* The 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K: the first
 * four sit in the low 6 bits of bytes 0..3 / 4..7, the last four are split
 * into a low nibble in bytes 8..11 and the top two bits of bytes 0..7. */
static inline void mcv_k4_scale_min(int j, const uint8_t *q, int *sc, int *mn)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*mn = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
		*mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

/* The 16 signed scales of Q3_K (stored as 6-bit values biased by 32): the
 * low nibble of scale i is in byte i (i < 8) or the high nibble of byte i-8,
 * its two high bits are in byte 8 + i%4 at bit 2*(i/4). */
static inline void mcv_q3k_scales(const uint8_t *s, int8_t out[16])
{
	for (int i = 0; i < 16; i++) {
		int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
		int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
		out[i] = (int8_t)((lo | (hi << 4)) - 32);
	}
}

#endif

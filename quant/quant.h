/* Block formats bit-compatible with ggml, and the kernels that compute on them.
 *
 * Every type has: a block struct with a static_assert on its size
 * (quant/blocks.h), a scalar reference quantizer and dequantizer bit-exact with
 * ggml's quantize_row_*_ref / dequantize_row_*, and dot/matmul kernels
 * (AVX2/FMA or AVX-512 when compiled for it, portable scalar otherwise).
 *
 * Dot products follow ggml's scheme so results match llama.cpp closely: the
 * activation row is first converted to the weight type's vec_dot_type
 * (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q5_1, Q8_K for the K-quants, F16 for F16, BF16 for BF16,
 * F32 for F32), then an integer (or half) dot product runs per block.
 *
 * Results never depend on the thread count: each output element is computed
 * by exactly one thread in a fixed order. */
#ifndef MCV_QUANT_H
#define MCV_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* ggml / GGUF tensor type ids. */
enum {
	MCV_F32 = 0,
	MCV_F16 = 1,
	MCV_Q4_0 = 2,
	MCV_Q5_0 = 6,
	MCV_Q5_1 = 7,
	MCV_Q8_0 = 8,
	MCV_Q8_1 = 9, /* activation-only type of Q5_1's dot, as in ggml */
	MCV_Q2_K = 10,
	MCV_Q3_K = 11,
	MCV_Q4_K = 12,
	MCV_Q5_K = 13,
	MCV_Q6_K = 14,
	MCV_Q8_K = 15, /* activation-only type, as in ggml */
	MCV_BF16 = 30,
};

#define MCV_QK 32    /* block size of Q4_0 / Q8_0 */
#define MCV_QK_K 256 /* super-block size of the K-quants */

typedef struct mcv_type_traits {
	const char *name;  /* ggml's name: "f32", "q4_K", ... */
	int blck;          /* elements per block */
	size_t bytes;      /* bytes per block */
	int vec_dot_type;  /* activations are converted to this for dots */
	int is_quant;      /* 1 for block-quantized types */
} mcv_type_traits;

/* NULL when the id is unknown or not supported by mcv. */
const mcv_type_traits *mcv_type_get(int type);
/* ggml name -> id, case-insensitive ("q4_k" works); -1 if unknown. */
int mcv_type_from_name(const char *name);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size. */
size_t mcv_row_bytes(int type, int64_t n);

/* Half-precision conversions, bit-exact with ggml (round to nearest even). */
uint16_t mcv_fp32_to_fp16(float f);
float mcv_fp16_to_fp32(uint16_t h);
uint16_t mcv_fp32_to_bf16(float f);
float mcv_bf16_to_fp32(uint16_t h);

/* Reference row conversion.  n must be a multiple of the block size.
 * Bit-exact with ggml's quantize_row_<t>_ref and dequantize_row_<t>. */
void mcv_quantize_row_ref(int type, const float *x, void *y, int64_t n);
void mcv_dequantize_row(int type, const void *x, float *y, int64_t n);

/* Importance-weighted quantization (the imatrix method): weights[n] >= 0 per
 * element; NULL falls back to the reference quantizer.  Bit-exact with ggml's
 * quantize_<t>(..., imatrix) for one row. */
void mcv_quantize_row_imatrix(int type, const float *x, void *y, int64_t n,
			      const float *weights);

/* Activation conversion to a vec_dot_type (fast path), with the bytes of
 * llama.cpp's CPU backend on this build's machine: mcv_quantize_act_ref
 * states them one element at a time.  That is the reference quantizer,
 * except Q8_0 on x86 (AVX2 builds), which ggml converts with its own rule
 * (mcv_ref_quantize_q8_0_x86 in ref_legacy.c). */
void mcv_quantize_row(int type, const float *x, void *y, int64_t n);
void mcv_quantize_act_ref(int type, const float *x, void *y, int64_t n);

/* Dot of one weight row of `type` with an activation row already converted to
 * that type's vec_dot_type.  _ref is the scalar oracle the fast one is tested
 * against. */
float mcv_vec_dot(int type, int64_t n, const void *w, const void *xq);
float mcv_vec_dot_ref(int type, int64_t n, const void *w, const void *xq);

/* y[r] = dot(W row r, x) for r in [0, nrows).  W rows hold n elements each,
 * row_stride bytes apart.  x is float[n]; it is converted once internally.
 * Rows are split across OpenMP threads. */
void mcv_matvec(int type, const void *W, size_t row_stride, int64_t nrows,
		int64_t n, const float *x, float *y);
/* Same, with x already converted to the vec_dot_type (so one conversion can
 * serve several matrices, e.g. gate and up of many experts). */
void mcv_matvec_q(int type, const void *W, size_t row_stride, int64_t nrows,
		  int64_t n, const void *xq, float *y);
/* Y[i][r] = dot(W row r, X[i]) for i in [0, m): the prefill path.  X is
 * float[m][n], Y is float[m][nrows].  Each Y element equals what mcv_matvec
 * would give for that row of X (so prefill and decode agree bit for bit),
 * except for F32 weights on AVX-512, which round as llama.cpp's CPU backend
 * does: its tiled GEMM's order for matrices of a multiple of 4 rows and 16
 * columns, its vec_dot's for a single row and for other matrices. */
void mcv_matmul(int type, const void *W, size_t row_stride, int64_t nrows,
		int64_t n, const float *X, int64_t m, float *Y);
/* Process-wide, for tests: 1 makes F32 products take the single-row order
 * whatever the row count (prefill then equals decode bit for bit, as for
 * the other types); 0 (the default) follows llama.cpp. */
void mcv_f32_single_order(int on);
int mcv_f32_single(void); /* the setting; lib/attention.c's F16 products follow it too */

#endif

/* Private to quant/: matrix-matrix kernels behind mcv_matmul for the cases
 * where repacking the operands pays (many activation rows).  Each returns 1
 * when it computed Y (bit-identical, element by element, to mcv_matvec on
 * that activation row), 0 when it does not handle the case (type, build,
 * size or memory) and Y is untouched. */
#ifndef MCV_GEMM_H
#define MCV_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* Activation rows from which the repacked Q4_0/Q8_0 path is used. */
#define MCV_GEMM_Q0_MIN_M 8

/* Q4_0 and Q8_0 weights, AVX-512 VNNI builds only. */
int mcv_gemm_q0(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		const float *X, int64_t m, float *Y);

/* For a caller that splits one product between the threads of its own
 * parallel region (the text prefill, lib/prefill.c): on the calling thread,
 * Y[i * ldy + r] for weight rows r in [r0, r1) and activation rows i < m,
 * from xq = the m rows already converted to the type's vec_dot_type, qb
 * bytes apart (for F32 weights: the float rows); nrows is the whole
 * matrix's row count.  Every element has the bits mcv_matmul gives it, so
 * the split cannot change a result.  A type without a dot yields NaN. */
void mcv_matmul_part(int type, const void *W, size_t row_stride, int64_t nrows, int64_t r0, int64_t r1,
		     int64_t n, const void *xq, size_t qb, int64_t m, float *Y, size_t ldy);
/* Its Q4_0/Q8_0 VNNI case (weights repacked per call, as mcv_gemm_q0):
 * 1 done, 0 not handled (type, build, m below MCV_GEMM_Q0_MIN_M, memory). */
int mcv_gemm_q0_part(int type, const void *W, size_t row_stride, int64_t r0, int64_t r1, int64_t n,
		     const void *xq, size_t qb, int64_t m, float *Y, size_t ldy);

/* Y = X W^T like mcv_matmul, for callers with no decode path to agree with
 * (the vision tower): on Q4_0/Q8_0 with AVX-512 VNNI each block's integer
 * dot is summed whole and scaled once (no fewer correct bits than
 * mcv_matmul, but not the same bits as mcv_matvec); still independent of
 * the thread count.  Anything else is mcv_matmul. */
void mcv_matmul_loose(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		      const float *X, int64_t m, float *Y);

/* ---- the vision tower's products on weights packed once ----
 *
 * For a caller that splits the work into blocks of activation rows itself
 * (one OpenMP task per block, every output row computed by one call): the
 * weights are repacked at load time, activation rows are quantized once
 * and reused by every matrix that reads them.  Numbers as mcv_matmul_loose
 * (one int32 dot per 32-value block, one float step per block), except that
 * an activation block's scale stays f32 (not rounded to f16).  Each output
 * element depends only on its weight row and activation row, never on the
 * block or the thread. */
typedef struct mcv_vgemm_w {
	int type;         /* MCV_Q8_0 or MCV_Q4_0 */
	int64_t nrows, n; /* output rows (columns of Y), input width */
	void *pk;         /* packed panels (16 rows each) */
} mcv_vgemm_w;

/* 1: packed; 0: not handled here (type, width, build: use another path);
 * -1: out of memory. */
int mcv_vgemm_pack(mcv_vgemm_w *w, int type, const void *W, size_t row_stride, int64_t nrows, int64_t n);
void mcv_vgemm_free(mcv_vgemm_w *w);
/* Bytes of one quantized activation row of width n (a multiple of 32). */
size_t mcv_vgemm_act_size(int64_t n);
/* Quantize one row x[0..n) into act (mcv_vgemm_act_size(n) bytes, 64-byte
 * aligned). */
void mcv_vgemm_quantize(const float *x, int64_t n, void *act);
enum { MCV_VGEMM_SET = 0, MCV_VGEMM_ADD = 1 };
/* Y[i][j] (=, or += with MCV_VGEMM_ADD) dot(W row j, act row i) + bias[j]
 * (bias may be NULL) for i < m, j < nrows; act rows are act_stride bytes
 * apart, Y rows ldy floats.  Single-threaded. */
void mcv_vgemm_rows(const mcv_vgemm_w *w, const void *act, size_t act_stride, int64_t m,
		    const float *bias, int mode, float *Y, size_t ldy);
/* Bytes mcv_vgemm_pack takes for such a matrix; 0: not packable here. */
size_t mcv_vgemm_packed_size(int type, int64_t nrows, int64_t n);
/* The exact product (mcv_matvec's bits, as mcv_matmul_part) on weights
 * packed by mcv_vgemm_pack: Y[i * ldy + (r - r0)] for rows r in [r0, r1)
 * (r0 a multiple of 16), activation rows i < m in Q8_0, qb bytes apart.
 * Single-threaded. */
void mcv_gemm_q0_packed(const mcv_vgemm_w *w, int64_t r0, int64_t r1, const void *xq, size_t qb, int64_t m,
			float *Y, size_t ldy);

#endif

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

/* Y = X W^T like mcv_matmul, for callers with no decode path to agree with
 * (the vision tower): on Q4_0/Q8_0 with AVX-512 VNNI each block's integer
 * dot is summed whole and scaled once (no fewer correct bits than
 * mcv_matmul, but not the same bits as mcv_matvec); still independent of
 * the thread count.  Anything else is mcv_matmul. */
void mcv_matmul_loose(int type, const void *W, size_t row_stride, int64_t nrows, int64_t n,
		      const float *X, int64_t m, float *Y);

#endif

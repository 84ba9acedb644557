/* Internal to quant/: the per-type reference row converters behind
 * mcv_quantize_row_ref / mcv_dequantize_row (ref_row.c dispatches by type).
 * n is a multiple of the type's block size. */
#ifndef MCV_REF_ROWS_H
#define MCV_REF_ROWS_H

#include "blocks.h"

void mcv_ref_quantize_q4_0(const float *x, block_q4_0 *y, int64_t n);
void mcv_ref_quantize_q8_0(const float *x, block_q8_0 *y, int64_t n);
void mcv_ref_quantize_q8_0_x86(const float *x, block_q8_0 *y, int64_t n);
void mcv_ref_quantize_q8_K(const float *x, block_q8_K *y, int64_t n);
void mcv_ref_quantize_q5_0(const float *x, block_q5_0 *y, int64_t n);
void mcv_ref_quantize_q5_1(const float *x, block_q5_1 *y, int64_t n);
void mcv_ref_quantize_q8_1(const float *x, block_q8_1 *y, int64_t n);
void mcv_ref_dequantize_q5_0(const block_q5_0 *x, float *y, int64_t n);
void mcv_ref_dequantize_q5_1(const block_q5_1 *x, float *y, int64_t n);
void mcv_ref_dequantize_q8_1(const block_q8_1 *x, float *y, int64_t n);
/* Importance-weighted Q5_0 / Q5_1 rows (qw: n weights, not NULL). */
void mcv_imatrix_quantize_q5_0(const float *x, block_q5_0 *y, int64_t n, const float *qw);
void mcv_imatrix_quantize_q5_1(const float *x, block_q5_1 *y, int64_t n, const float *qw);
void mcv_ref_quantize_q2_K(const float *x, block_q2_K *y, int64_t n);
void mcv_ref_quantize_q3_K(const float *x, block_q3_K *y, int64_t n);
void mcv_ref_quantize_q4_K(const float *x, block_q4_K *y, int64_t n);
void mcv_ref_quantize_q5_K(const float *x, block_q5_K *y, int64_t n);
void mcv_ref_quantize_q6_K(const float *x, block_q6_K *y, int64_t n);

/* The last step of every K-quant: levels recomputed against the scales as
 * stored (fp16 super-scale times the quantized sub-block scale), so that
 * dequantization sees the best levels for what is in the file.  Sub-blocks
 * whose stored scale is zero keep the levels already in L. */
void mcv_q2_K_requantize(const float *x, const block_q2_K *y, uint8_t *L);
void mcv_q3_K_requantize(const float *x, const block_q3_K *y, int8_t *L);
void mcv_k4_requantize(const float *x, int nmax, mcv_half d, mcv_half dmin,
		       const uint8_t scales[12], uint8_t *L); /* Q4_K, Q5_K */

/* One Q6_K block; qw (256 importance weights) or NULL for the reference. */
void mcv_ref_quantize_q6_K_block(const float *x, block_q6_K *y, const float *qw);

void mcv_ref_dequantize_q4_0(const block_q4_0 *x, float *y, int64_t n);
void mcv_ref_dequantize_q8_0(const block_q8_0 *x, float *y, int64_t n);
void mcv_ref_dequantize_q8_K(const block_q8_K *x, float *y, int64_t n);
void mcv_ref_dequantize_q2_K(const block_q2_K *x, float *y, int64_t n);
void mcv_ref_dequantize_q3_K(const block_q3_K *x, float *y, int64_t n);
void mcv_ref_dequantize_q4_K(const block_q4_K *x, float *y, int64_t n);
void mcv_ref_dequantize_q5_K(const block_q5_K *x, float *y, int64_t n);
void mcv_ref_dequantize_q6_K(const block_q6_K *x, float *y, int64_t n);

/* F32 / F16 / BF16 element conversion (ref_float.c). */
void mcv_ref_convert_from_f32(int type, const float *x, void *y, int64_t n);
void mcv_ref_convert_to_f32(int type, const void *x, float *y, int64_t n);

#endif

/* ggml block layouts, byte for byte.  Halves are stored as raw uint16_t
 * (IEEE fp16 bits); convert with mcv_fp16_to_fp32 / mcv_fp32_to_fp16. */
#ifndef MCV_BLOCKS_H
#define MCV_BLOCKS_H

#include "quant.h"
#include <assert.h>
#include <stdint.h>

typedef uint16_t mcv_half;

/* Q4_0: 32 weights, x = (q - 8) * d; low nibbles hold elements 0..15,
 * high nibbles 16..31. */
typedef struct { mcv_half d; uint8_t qs[MCV_QK / 2]; } block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

/* Q5_0: 32 weights, x = (q - 16) * d; q's low 4 bits as in Q4_0, the fifth
 * bit of element j in bit j of qh (little-endian u32). */
typedef struct { mcv_half d; uint8_t qh[4]; uint8_t qs[MCV_QK / 2]; } block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

/* Q5_1: as Q5_0 but affine: x = q * d + m, q in 0..31. */
typedef struct { mcv_half d, m; uint8_t qh[4]; uint8_t qs[MCV_QK / 2]; } block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

/* Q8_1: activation type of Q5_1's dot: Q8_0 plus s = d * sum(q), which
 * carries the weight's offset term. */
typedef struct { mcv_half d, s; int8_t qs[MCV_QK]; } block_q8_1;
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");

/* Q8_0: 32 weights, x = q * d. */
typedef struct { mcv_half d; int8_t qs[MCV_QK]; } block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* Q2_K: 16 sub-blocks of 16; 4-bit scale and 4-bit min per sub-block;
 * x = d*scale*q - dmin*min, q in 0..3. */
typedef struct {
	uint8_t scales[MCV_QK_K / 16];
	uint8_t qs[MCV_QK_K / 4];
	mcv_half d, dmin;
} block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

/* Q3_K: 16 sub-blocks of 16; 6-bit scales packed in 12 bytes; low 2 bits in
 * qs, high bit in hmask; x = d*(scale-32)*(q-4 if high bit clear else q). */
typedef struct {
	uint8_t hmask[MCV_QK_K / 8];
	uint8_t qs[MCV_QK_K / 4];
	uint8_t scales[12];
	mcv_half d;
} block_q3_K;
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");

/* Q4_K: 8 sub-blocks of 32; 6-bit scale and 6-bit min packed in 12 bytes;
 * x = d*scale*q - dmin*min, q in 0..15. */
typedef struct {
	mcv_half d, dmin;
	uint8_t scales[12];
	uint8_t qs[MCV_QK_K / 2];
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

/* Q5_K: as Q4_K with a fifth bit per weight in qh. */
typedef struct {
	mcv_half d, dmin;
	uint8_t scales[12];
	uint8_t qh[MCV_QK_K / 8];
	uint8_t qs[MCV_QK_K / 2];
} block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

/* Q6_K: 16 sub-blocks of 16, int8 scales; x = d*scale*(q-32), q in 0..63
 * (low 4 bits in ql, high 2 bits in qh). */
typedef struct {
	uint8_t ql[MCV_QK_K / 2];
	uint8_t qh[MCV_QK_K / 4];
	int8_t scales[MCV_QK_K / 16];
	mcv_half d;
} block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

/* Q8_K: activation type of the K-quant dots; float scale, and the sums of
 * each group of 16 quants (used for the min terms). */
typedef struct {
	float d;
	int8_t qs[MCV_QK_K];
	int16_t bsums[MCV_QK_K / 16];
} block_q8_K;
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

#endif

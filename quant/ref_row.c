/* Dispatch of the reference row converters by ggml type id. */
#include "quant.h"
#include "ref_rows.h"

#include <assert.h>

void mcv_quantize_row_ref(int type, const float *x, void *y, int64_t n)
{
	assert(mcv_row_bytes(type, n) || n == 0);
	switch (type) {
	case MCV_F32:
	case MCV_F16:
	case MCV_BF16: mcv_ref_convert_from_f32(type, x, y, n); break;
	case MCV_Q4_0: mcv_ref_quantize_q4_0(x, y, n); break;
	case MCV_Q8_0: mcv_ref_quantize_q8_0(x, y, n); break;
	case MCV_Q8_K: mcv_ref_quantize_q8_K(x, y, n); break;
	case MCV_Q5_0: mcv_ref_quantize_q5_0(x, y, n); break;
	case MCV_Q5_1: mcv_ref_quantize_q5_1(x, y, n); break;
	case MCV_Q8_1: mcv_ref_quantize_q8_1(x, y, n); break;
	case MCV_Q2_K: mcv_ref_quantize_q2_K(x, y, n); break;
	case MCV_Q3_K: mcv_ref_quantize_q3_K(x, y, n); break;
	case MCV_Q4_K: mcv_ref_quantize_q4_K(x, y, n); break;
	case MCV_Q5_K: mcv_ref_quantize_q5_K(x, y, n); break;
	case MCV_Q6_K: mcv_ref_quantize_q6_K(x, y, n); break;
	default: assert(!"mcv_quantize_row_ref: unsupported type");
	}
}

void mcv_quantize_act_ref(int type, const float *x, void *y, int64_t n)
{
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) /* as quant/act.c's fast path */
	if (type == MCV_Q8_0) {
		mcv_ref_quantize_q8_0_x86(x, y, n);
		return;
	}
#endif
	mcv_quantize_row_ref(type, x, y, n);
}

void mcv_dequantize_row(int type, const void *x, float *y, int64_t n)
{
	assert(mcv_row_bytes(type, n) || n == 0);
	switch (type) {
	case MCV_F32:
	case MCV_F16:
	case MCV_BF16: mcv_ref_convert_to_f32(type, x, y, n); break;
	case MCV_Q4_0: mcv_ref_dequantize_q4_0(x, y, n); break;
	case MCV_Q8_0: mcv_ref_dequantize_q8_0(x, y, n); break;
	case MCV_Q8_K: mcv_ref_dequantize_q8_K(x, y, n); break;
	case MCV_Q5_0: mcv_ref_dequantize_q5_0(x, y, n); break;
	case MCV_Q5_1: mcv_ref_dequantize_q5_1(x, y, n); break;
	case MCV_Q8_1: mcv_ref_dequantize_q8_1(x, y, n); break;
	case MCV_Q2_K: mcv_ref_dequantize_q2_K(x, y, n); break;
	case MCV_Q3_K: mcv_ref_dequantize_q3_K(x, y, n); break;
	case MCV_Q4_K: mcv_ref_dequantize_q4_K(x, y, n); break;
	case MCV_Q5_K: mcv_ref_dequantize_q5_K(x, y, n); break;
	case MCV_Q6_K: mcv_ref_dequantize_q6_K(x, y, n); break;
	default: assert(!"mcv_dequantize_row: unsupported type");
	}
}

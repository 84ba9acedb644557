/* F32 / F16 / BF16 rows: "quantizing" to these types is element-wise
 * conversion with ggml's rounding (quant/types.c). */
#include "quant.h"

#include <string.h>

void mcv_ref_convert_from_f32(int type, const float *x, void *y, int64_t n)
{
	if (type == MCV_F32) {
		memmove(y, x, (size_t)n * sizeof *x);
	} else if (type == MCV_F16) {
		uint16_t *h = y;
		for (int64_t i = 0; i < n; i++)
			h[i] = mcv_fp32_to_fp16(x[i]);
	} else {
		uint16_t *h = y;
		for (int64_t i = 0; i < n; i++)
			h[i] = mcv_fp32_to_bf16(x[i]);
	}
}

void mcv_ref_convert_to_f32(int type, const void *x, float *y, int64_t n)
{
	if (type == MCV_F32) {
		memmove(y, x, (size_t)n * sizeof *y);
	} else if (type == MCV_F16) {
		const uint16_t *h = x;
		for (int64_t i = 0; i < n; i++)
			y[i] = mcv_fp16_to_fp32(h[i]);
	} else {
		const uint16_t *h = x;
		for (int64_t i = 0; i < n; i++)
			y[i] = mcv_bf16_to_fp32(h[i]);
	}
}

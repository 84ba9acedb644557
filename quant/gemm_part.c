/* One thread's share of a weight product, for callers that run their own
 * parallel region (gemm.h, mcv_matmul_part).  The same kernels as
 * mcv_matmul, so each element gets the bits mcv_matmul gives it: the
 * repacked VNNI GEMM for Q4_0/Q8_0 with enough rows, else the register
 * tiles of the type, else its four-row and single-row dots. */
#include "dot_kernels.h"
#include "gemm.h"

#include <math.h>

static void tiles_part(const mcv_tiles *t, int64_t n, const char *w, size_t stride, int64_t r0, int64_t r1,
		       const unsigned char *xq, size_t qb, int64_t m, float *Y, size_t ldy)
{
	for (int64_t i = 0; i < m; i += 4) {
		const int full = i + 4 <= m;
		const void *xs[4];
		for (int c = 0; c < 4 && i + c < m; c++)
			xs[c] = xq + (size_t)(i + c) * qb;
		int64_t r = r0;
		for (; r + 4 <= r1; r += 4) {
			if (full)
				t->t44(n, w + (size_t)r * stride, stride, xs, Y + (size_t)i * ldy + r, ldy);
			else
				for (int c = 0; i + c < m; c++)
					t->t41(n, w + (size_t)r * stride, stride, xs + c, Y + (size_t)(i + c) * ldy + r, ldy);
		}
		for (; r < r1; r++) {
			if (full)
				t->t14(n, w + (size_t)r * stride, stride, xs, Y + (size_t)i * ldy + r, ldy);
			else
				for (int c = 0; i + c < m; c++)
					t->t11(n, w + (size_t)r * stride, stride, xs + c, Y + (size_t)(i + c) * ldy + r, ldy);
		}
	}
}

void mcv_matmul_part(int type, const void *W, size_t row_stride, int64_t nrows, int64_t r0, int64_t r1,
		     int64_t n, const void *xq, size_t qb, int64_t m, float *Y, size_t ldy)
{
	if (r1 <= r0 || m <= 0)
		return;
	const mcv_dot_fn f = mcv_dot_kernel(type, 1);
	if (!f) {
		for (int64_t i = 0; i < m; i++)
			for (int64_t r = r0; r < r1; r++)
				Y[(size_t)i * ldy + r] = NAN;
		return;
	}
	if (mcv_gemm_q0_part(type, W, row_stride, r0, r1, n, xq, qb, m, Y, ldy))
		return;
	const char *w = W;
	const unsigned char *x = xq;
	const mcv_tiles *t = mcv_tiles_q0(type) ? mcv_tiles_q0(type)
			     : mcv_tiles_float(type) ? mcv_tiles_float(type) : mcv_tiles_k(type);
	if (type == MCV_F32 && (m < 2 || !mcv_f32_tiled(nrows, n)))
		t = NULL;
	if (t) {
		tiles_part(t, n, w, row_stride, r0, r1, x, qb, m, Y, ldy);
		return;
	}
	const mcv_dot4_fn f4 = mcv_dot4_kernel(type);
	for (int64_t i = 0; i < m; i++) {
		const void *xi = x + (size_t)i * qb;
		float *y = Y + (size_t)i * ldy;
		int64_t r = r0;
		if (f4)
			for (; r + 4 <= r1; r += 4)
				f4(n, w + (size_t)r * row_stride, row_stride, xi, y + r);
		for (; r < r1; r++)
			y[r] = f(n, w + (size_t)r * row_stride, xi);
	}
}

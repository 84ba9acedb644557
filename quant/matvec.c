/* Dot dispatch, matrix-vector (decode) and matrix-matrix (prefill).
 *
 * Thread-count independence: every output element is computed by exactly
 * one thread, by a kernel whose operations on that element do not depend on
 * how rows (and, in prefill, activation rows) are grouped into one call:
 * the single-row, four-row and 4x4-tile kernels of a type give the same bits
 * for the same pair.  So OpenMP only decides which thread, and mcv_matmul ==
 * mcv_matvec == mcv_vec_dot bit for bit (prefill and decode agree), except
 * for F32 weights with AVX-512: there, as in llama.cpp's CPU backend, a
 * single row and matrices the tiled GEMM declines (mcv_f32_tiled) take
 * ggml's vec_dot order, two or more rows on the others the tiles' order. */
#include "dot_kernels.h"
#include "gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many weight bytes a parallel region costs more than it saves. */
#define PAR_MIN_BYTES (48 * 1024)
/* Activation rows up to this size are converted on the stack. */
#define STACK_ACT_BYTES (64 * 1024)

mcv_dot_fn mcv_dot_kernel(int type, int fast)
{
	switch (type) {
	case MCV_F32: return fast ? mcv_dot_f32_fast : mcv_dot_f32_ref;
	case MCV_F16: return fast ? mcv_dot_f16_fast : mcv_dot_f16_ref;
	case MCV_BF16: return fast ? mcv_dot_bf16_fast : mcv_dot_bf16_ref;
	case MCV_Q4_0: return fast ? mcv_dot_q4_0_fast : mcv_dot_q4_0_ref;
	case MCV_Q8_0: return fast ? mcv_dot_q8_0_fast : mcv_dot_q8_0_ref;
	case MCV_Q5_0: return fast ? mcv_dot_q5_0_fast : mcv_dot_q5_0_ref;
	case MCV_Q5_1: return fast ? mcv_dot_q5_1_fast : mcv_dot_q5_1_ref;
	case MCV_Q2_K: return fast ? mcv_dot_q2_K_fast : mcv_dot_q2_K_ref;
	case MCV_Q3_K: return fast ? mcv_dot_q3_K_fast : mcv_dot_q3_K_ref;
	case MCV_Q4_K: return fast ? mcv_dot_q4_K_fast : mcv_dot_q4_K_ref;
	case MCV_Q5_K: return fast ? mcv_dot_q5_K_fast : mcv_dot_q5_K_ref;
	case MCV_Q6_K: return fast ? mcv_dot_q6_K_fast : mcv_dot_q6_K_ref;
	default: return NULL;
	}
}

mcv_dot4_fn mcv_dot4_kernel(int type)
{
	switch (type) {
	case MCV_F32: return mcv_dot_f32_rows4;
	case MCV_F16: return mcv_dot_f16_rows4;
	case MCV_Q4_0: return mcv_dot_q4_0_rows4;
	case MCV_Q8_0: return mcv_dot_q8_0_rows4;
	case MCV_Q2_K: return mcv_dot_q2_K_rows4;
	case MCV_Q3_K: return mcv_dot_q3_K_rows4;
	case MCV_Q4_K: return mcv_dot_q4_K_rows4;
	case MCV_Q5_K: return mcv_dot_q5_K_rows4;
	case MCV_Q6_K: return mcv_dot_q6_K_rows4;
	default: return NULL;
	}
}

/* Rows [r0, r1) of W against one converted activation row, four at a time
 * where the type has a four-row kernel (same bits as one at a time).  The
 * four rows of a group are a quarter of the range apart: four adjacent rows
 * walked together defeat the hardware prefetcher (half speed from DRAM),
 * four distant ones are four clean sequential streams. */
static void rows_dot(mcv_dot_fn f, mcv_dot4_fn f4, const char *w, size_t stride, int64_t r0, int64_t r1,
		     int64_t n, const void *xq, float *y)
{
	int64_t r = r0;
	if (f4 && r1 - r0 >= 8) {
		const int64_t q = (r1 - r0) / 4;
		for (int64_t k = 0; k < q; k++) {
			float o[4];
			f4(n, w + (size_t)(r0 + k) * stride, (size_t)q * stride, xq, o);
			for (int j = 0; j < 4; j++)
				y[r0 + j * q + k] = o[j];
		}
		r = r0 + 4 * q;
	}
	for (; r < r1; r++)
		y[r] = f(n, w + (size_t)r * stride, xq);
}

/* A type without a dot (unknown, or Q8_K) is a programmer error; the
 * library does not abort on it, it yields NaN so the mistake shows. */
float mcv_vec_dot(int type, int64_t n, const void *w, const void *xq)
{
	mcv_dot_fn f = mcv_dot_kernel(type, 1);
	return f ? f(n, w, xq) : NAN;
}

float mcv_vec_dot_ref(int type, int64_t n, const void *w, const void *xq)
{
	mcv_dot_fn f = mcv_dot_kernel(type, 0);
	return f ? f(n, w, xq) : NAN;
}

static void fill_nan(float *y, int64_t k)
{
	for (int64_t i = 0; i < k; i++)
		y[i] = NAN;
}

void mcv_matvec_q(int type, const void *W, size_t row_stride, int64_t nrows,
		  int64_t n, const void *xq, float *y)
{
	mcv_dot_fn f = mcv_dot_kernel(type, 1);
	if (!f) {
		fill_nan(y, nrows);
		return;
	}
	const mcv_dot4_fn f4 = mcv_dot4_kernel(type);
	const char *w = W;
	const int par = (double)nrows * (double)mcv_row_bytes(type, n) >= PAR_MIN_BYTES;
	if (!par) {
		rows_dot(f, f4, w, row_stride, 0, nrows, n, xq, y);
		return;
	}
	/* One contiguous range of rows per thread. */
#pragma omp parallel
	{
		int nt = 1, t = 0;
#ifdef _OPENMP
		nt = omp_get_num_threads();
		t = omp_get_thread_num();
#endif
		rows_dot(f, f4, w, row_stride, nrows * t / nt, nrows * (t + 1) / nt, n, xq, y);
	}
}

void mcv_matvec(int type, const void *W, size_t row_stride, int64_t nrows,
		int64_t n, const float *x, float *y)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	if (!tt || !mcv_dot_kernel(type, 1)) {
		fill_nan(y, nrows);
		return;
	}
	size_t qb = mcv_row_bytes(tt->vec_dot_type, n);
	_Alignas(64) unsigned char stack[STACK_ACT_BYTES];
	void *xq = qb <= sizeof stack ? (void *)stack : malloc(qb);
	if (!xq) {
		fill_nan(y, nrows);
		return;
	}
	mcv_quantize_row(tt->vec_dot_type, x, xq, n);
	mcv_matvec_q(type, W, row_stride, nrows, n, xq, y);
	if (xq != stack)
		free(xq);
}

/* Weight rows per tile: about 16 KiB of weights, so a tile stays in L1/L2
 * while a group of activation rows streams past it. */
static int64_t tile_rows(size_t row_bytes)
{
	int64_t t = (int64_t)((16 * 1024) / (row_bytes ? row_bytes : 1));
	t = t < 4 ? 4 : t > 64 ? 64 : t;
	return t & ~(int64_t)3; /* whole groups of four rows */
}

#define ACT_GROUP 16 /* activation rows that share one pass over a tile */

/* Weight rows [r0, r1) x activation rows [i0, i1) in 4x4 register tiles,
 * the edges in 4x1, 1x4 and 1x1 (the same bits per element). */
static void tiled(const mcv_tiles *t, int64_t n, const char *w, size_t stride, int64_t r0, int64_t r1,
		  const unsigned char *xq, size_t qb, int64_t i0, int64_t i1, float *Y, int64_t ldy)
{
	for (int64_t i = i0; i < i1; i += 4) {
		const int full = i + 4 <= i1;
		const void *xs[4];
		for (int c = 0; c < 4 && i + c < i1; c++)
			xs[c] = xq + (size_t)(i + c) * qb;
		int64_t r = r0;
		for (; r + 4 <= r1; r += 4) {
			if (full)
				t->t44(n, w + (size_t)r * stride, stride, xs, Y + i * ldy + r, (size_t)ldy);
			else
				for (int c = 0; i + c < i1; c++)
					t->t41(n, w + (size_t)r * stride, stride, xs + c, Y + (i + c) * ldy + r, (size_t)ldy);
		}
		for (; r < r1; r++) {
			if (full)
				t->t14(n, w + (size_t)r * stride, stride, xs, Y + i * ldy + r, (size_t)ldy);
			else
				for (int c = 0; i + c < i1; c++)
					t->t11(n, w + (size_t)r * stride, stride, xs + c, Y + (i + c) * ldy + r, (size_t)ldy);
		}
	}
}

void mcv_matmul(int type, const void *W, size_t row_stride, int64_t nrows,
		int64_t n, const float *X, int64_t m, float *Y)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	mcv_dot_fn f = tt ? mcv_dot_kernel(type, 1) : NULL;
	if (!f) {
		fill_nan(Y, nrows * m);
		return;
	}
	if (m == 1) {
		mcv_matvec(type, W, row_stride, nrows, n, X, Y);
		return;
	}
	if (mcv_gemm_q0(type, W, row_stride, nrows, n, X, m, Y))
		return;
	const size_t qb = mcv_row_bytes(tt->vec_dot_type, n);
	unsigned char *xq = malloc(qb * (size_t)m);
	if (!xq) {
		fill_nan(Y, nrows * m);
		return;
	}
	const size_t wb = mcv_row_bytes(type, n);
	const int par = (double)nrows * (double)wb * (double)m >= PAR_MIN_BYTES;
	(void)par;
#pragma omp parallel for schedule(static) if (par)
	for (int64_t i = 0; i < m; i++)
		mcv_quantize_row(tt->vec_dot_type, X + i * n, xq + (size_t)i * qb, n);

	const char *w = W;
	const mcv_dot4_fn f4 = mcv_dot4_kernel(type);
	const mcv_tiles *tiles = mcv_tiles_q0(type) ? mcv_tiles_q0(type)
				 : mcv_tiles_float(type) ? mcv_tiles_float(type) : mcv_tiles_k(type);
	if (type == MCV_F32 && !mcv_f32_tiled(nrows, n))
		tiles = NULL;
	const int64_t tr = tile_rows(wb);
	const int64_t ntiles = (nrows + tr - 1) / tr;
#pragma omp parallel for schedule(static) if (par)
	for (int64_t t = 0; t < ntiles; t++) {
		const int64_t r0 = t * tr, r1 = r0 + tr < nrows ? r0 + tr : nrows;
		for (int64_t i0 = 0; i0 < m; i0 += ACT_GROUP) {
			const int64_t i1 = i0 + ACT_GROUP < m ? i0 + ACT_GROUP : m;
			if (tiles) {
				tiled(tiles, n, w, row_stride, r0, r1, xq, qb, i0, i1, Y, nrows);
				continue;
			}
			int64_t r = r0;
			if (f4)
				for (; r + 4 <= r1; r += 4) {
					const char *wr = w + (size_t)r * row_stride;
					for (int64_t i = i0; i < i1; i++) {
						float o[4];
						f4(n, wr, row_stride, xq + (size_t)i * qb, o);
						memcpy(Y + i * nrows + r, o, sizeof o);
					}
				}
			for (; r < r1; r++) {
				const char *wr = w + (size_t)r * row_stride;
				for (int64_t i = i0; i < i1; i++)
					Y[i * nrows + r] = f(n, wr, xq + (size_t)i * qb);
			}
		}
	}
	free(xq);
}

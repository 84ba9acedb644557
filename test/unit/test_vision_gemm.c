/* The vision tower's packed int8 products (quant/gemm_q0.c mcv_vgemm_*)
 * against a float reference: Q8_0 and Q4_0 weights, a partial last panel,
 * row counts that are not multiples of the kernel's; each output must not
 * depend on how the rows are split into calls; accumulate mode and the
 * bias. */
#include "blocks.h"
#include "gemm.h"
#include "quant.h"
#include "unit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void run(int type, int nrows, int n, int m)
{
	const size_t rb = mcv_row_bytes(type, n);
	float *wf = malloc(sizeof(float) * (size_t)nrows * n), *x = malloc(sizeof(float) * (size_t)m * n);
	char *wq = malloc(rb * (size_t)nrows);
	float *bias = malloc(sizeof(float) * (size_t)nrows);
	for (int i = 0; i < nrows * n; i++)
		wf[i] = frand() * 0.1f;
	for (int i = 0; i < m * n; i++)
		x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f); /* some larger values per block */
	for (int r = 0; r < nrows; r++) {
		mcv_quantize_row(type, wf + (size_t)r * n, wq + (size_t)r * rb, n);
		mcv_dequantize_row(type, wq + (size_t)r * rb, wf + (size_t)r * n, n); /* the weights as stored */
		bias[r] = frand();
	}
	mcv_vgemm_w w;
	const int pr = mcv_vgemm_pack(&w, type, wq, rb, nrows, n);
	CHECK(pr == 1, "pack type %d: %d", type, pr);
	if (pr != 1)
		goto out;
	const size_t asz = mcv_vgemm_act_size(n);
	char *act = aligned_alloc(64, asz * (size_t)m);
	for (int i = 0; i < m; i++)
		mcv_vgemm_quantize(x + (size_t)i * n, n, act + (size_t)i * asz);
	float *y = malloc(sizeof(float) * (size_t)m * nrows), *y2 = malloc(sizeof(float) * (size_t)m * nrows);
	mcv_vgemm_rows(&w, act, asz, m, bias, MCV_VGEMM_SET, y, nrows);

	/* against float: the activations' rounding is at most half a step of
	 * each block's scale */
	double worst = 0;
	for (int i = 0; i < m; i++)
		for (int r = 0; r < nrows; r++) {
			double ref = bias[r], bound = 1e-5;
			for (int b = 0; b < n / 32; b++) {
				float amax = 0;
				for (int k = 0; k < 32; k++)
					amax = fmaxf(amax, fabsf(x[(size_t)i * n + b * 32 + k]));
				for (int k = 0; k < 32; k++) {
					const double wv = wf[(size_t)r * n + b * 32 + k];
					ref += wv * x[(size_t)i * n + b * 32 + k];
					bound += fabs(wv) * amax / 127.0 * 0.5;
				}
			}
			const double e = fabs(y[(size_t)i * nrows + r] - ref) / bound;
			worst = e > worst ? e : worst;
		}
	CHECK(worst <= 1.0, "type %d %dx%d m %d: error %.3g of the rounding bound", type, nrows, n, m, worst);

	/* the same values whatever the rows per call */
	for (int step = 1; step <= 7; step += 3) {
		for (int i = 0; i < m; i += step)
			mcv_vgemm_rows(&w, act + (size_t)i * asz, asz, m - i < step ? m - i : step, bias, MCV_VGEMM_SET,
				       y2 + (size_t)i * nrows, nrows);
		CHECK(memcmp(y, y2, sizeof(float) * (size_t)m * nrows) == 0, "type %d: %d rows per call differ", type, step);
	}

	/* accumulate: Y + (product + bias), one rounding more */
	for (int i = 0; i < m * nrows; i++)
		y2[i] = frand();
	float *pre = malloc(sizeof(float) * (size_t)m * nrows);
	memcpy(pre, y2, sizeof(float) * (size_t)m * nrows);
	mcv_vgemm_rows(&w, act, asz, m, bias, MCV_VGEMM_ADD, y2, nrows);
	int bad = 0;
	for (int i = 0; i < m * nrows; i++)
		bad += y2[i] != pre[i] + y[i];
	CHECK(bad == 0, "type %d: accumulate differs in %d values", type, bad);

	/* no bias = the bias subtracted back (within a rounding) */
	mcv_vgemm_rows(&w, act, asz, m, NULL, MCV_VGEMM_SET, y2, nrows);
	bad = 0;
	for (int i = 0; i < m; i++)
		for (int r = 0; r < nrows; r++)
			bad += fabsf(y2[(size_t)i * nrows + r] + bias[r] - y[(size_t)i * nrows + r]) >
			       1e-5f * (1 + fabsf(y[(size_t)i * nrows + r]));
	CHECK(bad == 0, "type %d: without bias %d values off", type, bad);

	/* a row of zeros gives the bias exactly */
	memset(x, 0, sizeof(float) * (size_t)n);
	mcv_vgemm_quantize(x, n, act);
	mcv_vgemm_rows(&w, act, asz, 1, bias, MCV_VGEMM_SET, y2, nrows);
	CHECK(memcmp(y2, bias, sizeof(float) * (size_t)nrows) == 0, "type %d: zero row is not the bias", type);

	free(pre);
	free(y);
	free(y2);
	free(act);
	mcv_vgemm_free(&w);
out:
	free(wf);
	free(x);
	free(wq);
	free(bias);
}

/* Integers that every step represents exactly (activation blocks reaching
 * 127, so their scale is 1; weights q / 128): the products must be exact. */
static void run_exact(int type)
{
	enum { NR = 20, N = 96, M = 7 };
	const size_t rb = mcv_row_bytes(type, N);
	float wf[NR * N], x[M * N];
	char wq[NR * sizeof(block_q8_0) * (N / 32)];
	const int qmax = type == MCV_Q8_0 ? 127 : 8; /* Q4_0: d = -max / 8 */
	for (int r = 0; r < NR; r++)
		for (int k = 0; k < N; k++)
			wf[r * N + k] = (k % 32 == 0 ? -qmax : (int)(frand() * (qmax - 1))) / 128.0f;
	for (int i = 0; i < M; i++)
		for (int k = 0; k < N; k++)
			x[i * N + k] = k % 32 == 5 ? 127.0f : (float)(int)(frand() * 126);
	for (int r = 0; r < NR; r++) {
		mcv_quantize_row(type, wf + r * N, wq + r * rb, N);
		mcv_dequantize_row(type, wq + r * rb, wf + r * N, N);
	}
	mcv_vgemm_w w;
	CHECK(mcv_vgemm_pack(&w, type, wq, rb, NR, N) == 1, "pack");
	const size_t asz = mcv_vgemm_act_size(N);
	char *act = aligned_alloc(64, asz * M);
	for (int i = 0; i < M; i++)
		mcv_vgemm_quantize(x + i * N, N, act + i * asz);
	float y[M * NR];
	mcv_vgemm_rows(&w, act, asz, M, NULL, MCV_VGEMM_SET, y, NR);
	int bad = 0;
	for (int i = 0; i < M; i++)
		for (int r = 0; r < NR; r++) {
			double ref = 0;
			for (int k = 0; k < N; k++)
				ref += (double)wf[r * N + k] * x[i * N + k];
			bad += y[i * NR + r] != (float)ref;
		}
	CHECK(bad == 0, "type %d: %d of %d products not exact", type, bad, M * NR);
	free(act);
	mcv_vgemm_free(&w);
}

int main(void)
{
	mcv_vgemm_w w;
	block_q8_0 one[1] = {{0}};
	if (mcv_vgemm_pack(&w, MCV_Q8_0, one, sizeof one, 1, 32) != 1)
		UNIT_SKIP("the packed vision products need an AVX-512 VNNI build");
	mcv_vgemm_free(&w);
	CHECK(mcv_vgemm_pack(&w, MCV_F32, one, 128, 1, 32) == 0, "f32 is not packed");
	CHECK(mcv_vgemm_pack(&w, MCV_Q8_0, one, sizeof one, 1, 48) == 0, "width not a multiple of 32");
	run(MCV_Q8_0, 40, 96, 13);
	run(MCV_Q4_0, 40, 96, 13);
	run(MCV_Q8_0, 16, 768, 6);
	run(MCV_Q8_0, 3, 32, 1);
	run_exact(MCV_Q8_0);
	run_exact(MCV_Q4_0);
	return unit_done("test_vision_gemm");
}

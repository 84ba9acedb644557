/* mcv_matmul on Q4_0 / Q8_0 weights (the repacked GEMM path on VNNI builds,
 * the tile path elsewhere) must give, for every activation row, the very
 * bytes mcv_matvec gives on that row alone, whatever the thread count; and
 * be close to the exact dot (so a shared mistake cannot pass).
 * mcv_matmul_loose must be close to the exact dot and independent of the
 * thread count. */
#include "quant.h"
#include "blocks.h"
#include "gemm.h"
#include "unit.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}
static float unif(void) { return (float)(next() & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f; }

/* A finite half scale: mostly ordinary, sometimes the largest, a
 * subnormal, zero or negative. */
static mcv_half rand_scale(void)
{
	switch (next() % 16) {
	case 0: return mcv_fp32_to_fp16(65504.0f);
	case 1: return mcv_fp32_to_fp16(6.0e-8f);
	case 2: return 0;
	case 3: return mcv_fp32_to_fp16(-0.01f * (1 + next() % 100));
	default: return mcv_fp32_to_fp16(1e-3f * (1 + next() % 1000));
	}
}

static void rand_weights(int type, unsigned char *w, int64_t rows, int64_t n)
{
	const int64_t nb = n / MCV_QK;
	for (int64_t r = 0; r < rows * nb; r++) {
		if (type == MCV_Q8_0) {
			block_q8_0 *b = (block_q8_0 *)w + r;
			b->d = rand_scale();
			for (int j = 0; j < MCV_QK; j++)
				b->qs[j] = (int8_t)(next() & 0xFF); /* -128 too */
		} else {
			block_q4_0 *b = (block_q4_0 *)w + r;
			b->d = rand_scale();
			for (int j = 0; j < MCV_QK / 2; j++)
				b->qs[j] = (uint8_t)next();
		}
	}
}

/* Activations: each row has its own magnitude, from 1e-6 to 1e6 (its Q8_0
 * scale stays a finite half), with a few all-zero and one-spike rows. */
static void rand_acts(float *x, int64_t m, int64_t n)
{
	for (int64_t i = 0; i < m; i++) {
		const int kind = (int)(next() % 8);
		const float mag = powf(10.0f, (float)(int)(next() % 13) - 6.0f);
		for (int64_t j = 0; j < n; j++)
			x[i * n + j] = kind == 0 ? 0.0f : kind == 1 ? (j == n / 3 ? mag : 0.0f) : mag * unif();
	}
}

static int check_case(int type, int64_t rows, int64_t n, int64_t m)
{
	const size_t rb = mcv_row_bytes(type, n);
	unsigned char *w = malloc(rb * (size_t)rows);
	float *x = malloc(sizeof(float) * (size_t)(m * n));
	float *y = malloc(sizeof(float) * (size_t)(m * rows));
	float *y1 = malloc(sizeof(float) * (size_t)(m * rows));
	float *z = malloc(sizeof(float) * (size_t)(m * rows)), *z1 = malloc(sizeof(float) * (size_t)(m * rows));
	float *v = malloc(sizeof(float) * (size_t)rows);
	void *xq = malloc(mcv_row_bytes(MCV_Q8_0, n));
	float *xd = malloc(sizeof(float) * (size_t)n), *wd = malloc(sizeof(float) * (size_t)n);
	if (!w || !x || !y || !y1 || !z || !z1 || !v || !xq || !xd || !wd) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	rand_weights(type, w, rows, n);
	rand_acts(x, m, n);
	int bad = 0;
#ifdef _OPENMP
	const int nt = omp_get_max_threads();
	omp_set_num_threads(1);
	mcv_matmul(type, w, rb, rows, n, x, m, y1);
	mcv_matmul_loose(type, w, rb, rows, n, x, m, z1);
	omp_set_num_threads(nt < 2 ? 2 : nt);
#endif
	mcv_matmul(type, w, rb, rows, n, x, m, y);
	mcv_matmul_loose(type, w, rb, rows, n, x, m, z);
#ifdef _OPENMP
	omp_set_num_threads(nt);
	if (memcmp(y, y1, sizeof(float) * (size_t)(m * rows)) != 0) {
		CHECK(0, "%s rows %lld n %lld m %lld: 1 thread != several", mcv_type_get(type)->name,
		      (long long)rows, (long long)n, (long long)m);
		bad = 1;
	}
	if (memcmp(z, z1, sizeof(float) * (size_t)(m * rows)) != 0) {
		CHECK(0, "%s rows %lld n %lld m %lld: loose: 1 thread != several", mcv_type_get(type)->name,
		      (long long)rows, (long long)n, (long long)m);
		bad = 1;
	}
#endif
	for (int64_t i = 0; i < m && !bad; i++) {
		mcv_matvec(type, w, rb, rows, n, x + i * n, v);
		if (memcmp(v, y + i * rows, sizeof(float) * (size_t)rows) != 0) {
			int64_t r = 0;
			while (memcmp(v + r, y + i * rows + r, sizeof(float)) == 0)
				r++;
			CHECK(0, "%s rows %lld n %lld m %lld: act row %lld weight row %lld: matmul %.9g matvec %.9g",
			      mcv_type_get(type)->name, (long long)rows, (long long)n, (long long)m, (long long)i,
			      (long long)r, y[i * rows + r], v[r]);
			bad = 1;
		}
		/* against the exact dot of the dequantized operands, within float
		 * rounding of the sum of absolute terms */
		mcv_quantize_row(MCV_Q8_0, x + i * n, xq, n);
		mcv_dequantize_row(MCV_Q8_0, xq, xd, n);
		for (int64_t r = 0; r < rows && !bad; r++) {
			mcv_dequantize_row(type, w + (size_t)r * rb, wd, n);
			double exact = 0, mag = 0;
			for (int64_t j = 0; j < n; j++) {
				exact += (double)wd[j] * xd[j];
				mag += fabs((double)wd[j] * xd[j]);
			}
			for (int k = 0; k < 2; k++) {
				const float got = (k ? z : y)[i * rows + r];
				if (!isfinite(got) || fabs(got - exact) > 1e-4 * mag + 1e-30) {
					CHECK(0, "%s%s rows %lld n %lld m %lld: (%lld,%lld) = %.9g, exact %.9g",
					      mcv_type_get(type)->name, k ? " loose" : "", (long long)rows,
					      (long long)n, (long long)m, (long long)i, (long long)r, got, exact);
					bad = 1;
				}
			}
		}
	}
	unit_checks++;
	free(w), free(x), free(y), free(y1), free(z), free(z1), free(v), free(xq), free(xd), free(wd);
	return bad;
}

int main(void)
{
	static const int types[] = { MCV_Q8_0, MCV_Q4_0 };
	static const int64_t shapes[][2] = { /* rows, n */
		{ 1, 32 }, { 3, 64 }, { 5, 96 }, { 17, 192 }, { 30, 768 }, { 67, 256 }, { 9, 4096 },
	};
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
			for (int64_t m = 1; m <= 37; m++) {
				if (shapes[s][1] >= 4096 && m % 6 != 1)
					continue; /* keep the big K cheap */
				check_case(types[t], shapes[s][0], shapes[s][1], m);
			}
	/* one larger case that splits over several panel chunks and threads */
	check_case(MCV_Q8_0, 301, 512, 70);
	check_case(MCV_Q4_0, 301, 512, 70);
	return unit_done("test_gemm_q0");
}

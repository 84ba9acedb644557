/* Fast kernels against the scalar oracles, the oracles against exact math on
 * the dequantized values, and against ggml's own vec_dot from the peer
 * library when it is installed.
 *
 * Tolerances: a dot is compared with an error bound relative to
 * S = sum |w_i * x_i| over the dequantized values (the natural scale of the
 * rounding error of any summation order):
 *   fast vs ref, ref vs double, ref vs ggml:  |a - b| <= 2e-5 * S
 * (float accumulation over at most 128 blocks: worst case ~128 * 2^-24 * S =
 * 7.6e-6 * S; an unpacking or scaling bug is off by far more).  Activation
 * conversion must give identical bytes, matmul must equal matvec bit for bit,
 * and 1 and 2 threads must give identical bits. */
#include "blocks.h"
#include "quant.h"
#include "unit.h"
#include "ggml_peer.h"

#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <omp.h>

#define TOL 2e-5

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}
static float frand(void) { return (rnd() >> 8) * (1.0f / 16777216.0f) * 2 - 1; }

/* A few shapes of data: plain uniform, with outliers, with a constant
 * offset (K-quant mins matter), and a block of zeros. */
static void fill_floats(float *x, int64_t n, int kind)
{
	for (int64_t i = 0; i < n; i++) {
		float v = frand();
		switch (kind) {
		case 1: v = (rnd() % 97 == 0) ? 40 * v : v; break;
		case 2: v = 0.3f + 0.2f * v; break;
		case 3: v = (i < 256) ? 0 : v * 3; break;
		default: break;
		}
		x[i] = v;
	}
}

static const int weight_types[] = { MCV_F32, MCV_F16, MCV_BF16, MCV_Q4_0, MCV_Q8_0, MCV_Q5_0, MCV_Q5_1,
				     MCV_Q2_K, MCV_Q3_K, MCV_Q4_K, MCV_Q5_K, MCV_Q6_K };
#define N_WT ((int)(sizeof weight_types / sizeof weight_types[0]))

/* Random bytes everywhere (every bit pattern of quants and sub-block scales)
 * except the half scales, which get sane magnitudes. */
static void random_block_bytes(int type, uint8_t *p, int64_t n)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	int64_t nb = n / tt->blck;
	for (size_t i = 0; i < (size_t)nb * tt->bytes; i++)
		p[i] = (uint8_t)rnd();
	size_t off[2] = { (size_t)-1, (size_t)-1 };
	switch (type) {
	case MCV_Q4_0: off[0] = offsetof(block_q4_0, d); break;
	case MCV_Q8_0: off[0] = offsetof(block_q8_0, d); break;
	case MCV_Q5_0: off[0] = offsetof(block_q5_0, d); break;
	case MCV_Q5_1: off[0] = offsetof(block_q5_1, d); off[1] = offsetof(block_q5_1, m); break;
	case MCV_Q2_K: off[0] = offsetof(block_q2_K, d); off[1] = offsetof(block_q2_K, dmin); break;
	case MCV_Q3_K: off[0] = offsetof(block_q3_K, d); break;
	case MCV_Q4_K: off[0] = offsetof(block_q4_K, d); off[1] = offsetof(block_q4_K, dmin); break;
	case MCV_Q5_K: off[0] = offsetof(block_q5_K, d); off[1] = offsetof(block_q5_K, dmin); break;
	case MCV_Q6_K: off[0] = offsetof(block_q6_K, d); break;
	default: return;
	}
	for (int64_t b = 0; b < nb; b++)
		for (int k = 0; k < 2; k++)
			if (off[k] != (size_t)-1) {
				uint16_t h = mcv_fp32_to_fp16(0.001f + 0.01f * (frand() + 1));
				memcpy(p + b * tt->bytes + off[k], &h, 2);
			}
}

/* ggml's CPU type traits, when the peer library is present. */
typedef void (*ggml_vec_dot_t)(int n, float *s, size_t bs, const void *x, size_t bx,
			       const void *y, size_t by, int nrc);
struct ggml_type_traits_cpu {
	void (*from_float)(const float *x, void *y, int64_t k);
	ggml_vec_dot_t vec_dot;
	int vec_dot_type;
	int64_t nrows;
};
static const struct ggml_type_traits_cpu *(*ggml_traits)(int type);
static int ggml_compared;

static void load_ggml(void)
{
	const char *variant = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16") ? "zen4"
			      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "haswell"
			      : "x64";
	void *h = ggml_peer_open(variant);
	if (h)
		ggml_traits = (const struct ggml_type_traits_cpu *(*)(int))dlsym(h, "ggml_get_type_traits_cpu");
}

/* S = sum |w x| and the exact dot over the dequantized rows. */
static void exact_dot(int type, int vdt, int64_t n, const void *w, const void *xq,
		      double *dot, double *scale)
{
	float *wf = malloc(n * sizeof *wf), *xf = malloc(n * sizeof *xf);
	mcv_dequantize_row(type, w, wf, n);
	mcv_dequantize_row(vdt, xq, xf, n);
	double s = 0, a = 0;
	for (int64_t i = 0; i < n; i++) {
		s += (double)wf[i] * xf[i];
		a += fabs((double)wf[i] * xf[i]);
	}
	/* Q8_1 carries d*sum(q) as a half (ggml's design): the dot uses that
	 * stored sum for Q5_1's offset term, so "exact" does too. */
	if (vdt == MCV_Q8_1)
		for (int64_t b = 0; b < n / MCV_QK; b++) {
			const block_q8_1 *y = (const block_q8_1 *)xq + b;
			const double m = mcv_fp16_to_fp32(((const block_q5_1 *)w)[b].m);
			double sq = 0;
			for (int j = 0; j < MCV_QK; j++)
				sq += xf[b * MCV_QK + j];
			s += m * (mcv_fp16_to_fp32(y->s) - sq);
			a += fabs(m * mcv_fp16_to_fp32(y->s));
		}
	*dot = s;
	*scale = a;
	free(wf);
	free(xf);
}

static void test_dots(int type, int64_t n, int random_bytes, int kind)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	const int vdt = tt->vec_dot_type;
	float *wf = malloc(n * sizeof *wf), *x = malloc(n * sizeof *x);
	void *w = malloc(mcv_row_bytes(type, n));
	void *xq = malloc(mcv_row_bytes(vdt, n) + 1), *xr = malloc(mcv_row_bytes(vdt, n) + 1);
	fill_floats(wf, n, kind);
	fill_floats(x, n, (kind + 1) % 4);
	if (random_bytes)
		random_block_bytes(type, w, n);
	else
		mcv_quantize_row_ref(type, wf, w, n);
	mcv_quantize_row(vdt, x, xq, n);
	mcv_quantize_act_ref(vdt, x, xr, n);
	CHECK(!memcmp(xq, xr, mcv_row_bytes(vdt, n)), "%s n=%lld: fast activation conversion differs from ref",
	      mcv_type_get(vdt)->name, (long long)n);

	double exact, s;
	exact_dot(type, vdt, n, w, xq, &exact, &s);
	float ref = mcv_vec_dot_ref(type, n, w, xq);
	float fast = mcv_vec_dot(type, n, w, xq);
	const double tol = TOL * s + 1e-30;
	CHECK(fabs(fast - ref) <= tol, "%s n=%lld bytes=%d kind=%d: fast %.9g ref %.9g (S %.4g)",
	      tt->name, (long long)n, random_bytes, kind, fast, ref, s);
	CHECK(fabs(ref - exact) <= tol, "%s n=%lld bytes=%d kind=%d: ref %.9g exact %.9g (S %.4g)",
	      tt->name, (long long)n, random_bytes, kind, ref, exact, s);
	if (ggml_traits && ggml_traits(type) && ggml_traits(type)->vec_dot &&
	    ggml_traits(type)->vec_dot_type == vdt) {
		float g = 0;
		ggml_traits(type)->vec_dot((int)n, &g, 0, w, 0, xq, 0, 1);
		ggml_compared++;
		CHECK(fabs(g - ref) <= tol, "%s n=%lld bytes=%d kind=%d: ggml %.9g ref %.9g (S %.4g)",
		      tt->name, (long long)n, random_bytes, kind, g, ref, s);
	}
	free(wf);
	free(x);
	free(w);
	free(xq);
	free(xr);
}

/* Activation conversion on awkward values: ties, subnormals, infinities,
 * NaN (halves), a negative extreme, all-zero blocks. */
static void test_activation_bytes(void)
{
	const int vdts[] = { MCV_Q8_0, MCV_Q8_K, MCV_F16, MCV_BF16, MCV_F32, MCV_Q8_1 };
	const int64_t n = 1024;
	float *x = malloc(n * sizeof *x);
	unsigned char *a = malloc(n * 4 + 64), *b = malloc(n * 4 + 64);
	for (int v = 0; v < 6; v++) {
		const int t = vdts[v];
		const int halfs = t == MCV_F16 || t == MCV_BF16;
		for (int round = 0; round < 7; round++) {
			for (int64_t i = 0; i < n; i++) {
				float f = frand();
				switch (round) {
				case 0: break;
				case 1: f = (float)(int)(f * 20) * 0.5f; break; /* many exact halves */
				case 2: f = (i % 32 == 5) ? -7.0f : f; break;   /* negative max */
				case 3: f = (i < 300) ? 0.0f : f * 1e-3f; break;
				case 4: f = ldexpf(f, (int)(rnd() % 60) - 30); break;
				case 5:
					if (!halfs)
						break; /* non-finite only where the ref defines it */
					f = i % 7 == 0 ? ldexpf(f, -130) : i % 11 == 0 ? INFINITY
					    : i % 13 == 0 ? NAN : i % 17 == 0 ? 70000.0f * f : f;
					break;
				case 6: /* a block max of 127: inverse scale 1, exact halves */
					f = i % 32 == 0 ? 127.0f : (float)((int)(rnd() % 200) - 100) + 0.5f;
					break;
				}
				x[i] = f;
			}
			const mcv_type_traits *tt = mcv_type_get(t);
			int64_t m = n - (tt->blck == 1 ? 3 : 0); /* tail for the half types */
			size_t nb = mcv_row_bytes(t, m);
			memset(a, 0xAA, nb);
			memset(b, 0x55, nb);
			mcv_quantize_row(t, x, a, m);
			mcv_quantize_act_ref(t, x, b, m);
			CHECK(!memcmp(a, b, nb), "%s round %d: fast conversion bytes differ from ref", tt->name, round);
			/* and from what llama.cpp's CPU backend makes of the same row */
			if (ggml_traits && t != MCV_F32 && t != MCV_Q8_1 && ggml_traits(t) && ggml_traits(t)->from_float &&
			    (round != 5 || !halfs)) {
				memset(b, 0x55, nb);
				ggml_traits(t)->from_float(x, b, m);
				if (t == MCV_Q8_K) /* ggml leaves an all-zero block's bsums unwritten (d = 0 voids them) */
					for (int64_t k = 0; k < m / MCV_QK_K; k++) {
						block_q8_K *ga = (block_q8_K *)a + k, *gb = (block_q8_K *)b + k;
						if (ga->d == 0 && gb->d == 0)
							memcpy(gb->bsums, ga->bsums, sizeof ga->bsums);
					}
				CHECK(!memcmp(a, b, nb), "%s round %d: conversion bytes differ from ggml's", tt->name, round);
			}
		}
	}
	free(x);
	free(a);
	free(b);
}

/* matmul == matvec bitwise; 1 and 2 threads identical; odd row counts. */
static void test_matrix(int type, int64_t n, int64_t nrows, int64_t m)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	size_t rb = mcv_row_bytes(type, n), stride = rb + 16; /* padded rows */
	unsigned char *W = malloc(stride * nrows);
	float *wf = malloc(n * sizeof *wf), *X = malloc(m * n * sizeof *X);
	float *Y = malloc(m * nrows * sizeof *Y), *y1 = malloc(nrows * sizeof *y1), *y2 = malloc(nrows * sizeof *y2);
	for (int64_t r = 0; r < nrows; r++) {
		fill_floats(wf, n, (int)(r % 3));
		mcv_quantize_row_ref(type, wf, W + r * stride, n);
	}
	fill_floats(X, m * n, 1);
	mcv_matmul(type, W, stride, nrows, n, X, m, Y);
	int bad_mm = 0, bad_thr = 0, bad_ref = 0;
	void *xq = malloc(mcv_row_bytes(tt->vec_dot_type, n));
	for (int64_t i = 0; i < m; i++) {
		omp_set_num_threads(1);
		mcv_matvec(type, W, stride, nrows, n, X + i * n, y1);
		omp_set_num_threads(2);
		mcv_matvec(type, W, stride, nrows, n, X + i * n, y2);
		bad_mm += memcmp(Y + i * nrows, y2, nrows * sizeof *y2) != 0;
		bad_thr += memcmp(y1, y2, nrows * sizeof *y2) != 0;
		/* and matvec is the plain dot of the converted row */
		mcv_quantize_act_ref(tt->vec_dot_type, X + i * n, xq, n);
		for (int64_t r = 0; r < nrows; r++)
			bad_ref += memcmp(&y2[r], &(float){ mcv_vec_dot(type, n, W + r * stride, xq) }, 4) != 0;
	}
	/* the matmul itself on one thread */
	float *Y1 = malloc(m * nrows * sizeof *Y1);
	omp_set_num_threads(1);
	mcv_matmul(type, W, stride, nrows, n, X, m, Y1);
	omp_set_num_threads(2);
	CHECK(!memcmp(Y, Y1, m * nrows * sizeof *Y), "%s: matmul differs between 1 and 2 threads", tt->name);
	CHECK(bad_mm == 0, "%s n=%lld rows=%lld m=%lld: %d matmul rows differ from matvec", tt->name,
	      (long long)n, (long long)nrows, (long long)m, bad_mm);
	CHECK(bad_thr == 0, "%s: %d matvec results differ between 1 and 2 threads", tt->name, bad_thr);
	CHECK(bad_ref == 0, "%s: %d matvec elements differ from mcv_vec_dot", tt->name, bad_ref);
	free(W);
	free(wf);
	free(X);
	free(Y);
	free(Y1);
	free(y1);
	free(y2);
	free(xq);
}

int main(void)
{
	load_ggml();
	test_activation_bytes();
	for (int k = 0; k < N_WT; k++) {
		const int t = weight_types[k];
		const mcv_type_traits *tt = mcv_type_get(t);
		const int64_t sizes[] = { tt->blck == 1 ? 37 : tt->blck, tt->blck == 1 ? 4099 : 4096, 2048 + 256 };
		for (int s = 0; s < 3; s++)
			for (int kind = 0; kind < 4; kind++) {
				if (sizes[s] % (tt->blck) != 0 || (kind == 3 && sizes[s] <= 256))
					continue;
				test_dots(t, sizes[s], 0, kind);
				if (tt->is_quant)
					test_dots(t, sizes[s], 1, kind);
			}
		test_matrix(t, tt->blck == 1 ? 1000 : 2048, 101, 19);
		test_matrix(t, tt->blck == 1 ? 64 : tt->blck, 7, 3);
	}
	if (ggml_traits)
		fprintf(stderr, "ggml parity: %d dots compared with ggml's vec_dot\n", ggml_compared);
	return unit_done("test_quant_kernels");
}

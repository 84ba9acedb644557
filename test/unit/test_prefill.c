/* The prefill in one parallel region (lib/prefill.c) and its pieces:
 *   - mcv_matmul_part (any split of the weight rows) and mcv_gemm_q0_packed
 *     (weights packed once) give every element the bits mcv_matvec gives;
 *   - a prefill through lib/prefill.c gives the logits, bit for bit, of the
 *     per-block forms (forced by a matmul observer, which that path does not
 *     take) and of token-by-token decode within 1e-4, at 1, 2 and 3 threads
 *     (MCV_SPLIT=always, so small models really split), with Q8_0 weights
 *     (packed at load), Q4_0 experts, and K-quant / F16 weights (per-call
 *     kernels);
 *   - eval_embd rows (an image block) go the same way as tokens. */
#include "blocks.h"
#include "gemm.h"
#include "model.h"
#include "model_impl.h"
#include "quant.h"
#include "unit.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t rng = 0x243F6A8885A308D3ull;
static float unif(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

/* ---- the product pieces ---- */

static void check_parts(int type, int64_t rows, int64_t n, int64_t m)
{
	const size_t rb = mcv_row_bytes(type, n);
	const int vdt = mcv_type_get(type)->vec_dot_type;
	const size_t qb = mcv_row_bytes(vdt, n);
	float *wf = malloc(sizeof(float) * (size_t)(rows * n)), *X = malloc(sizeof(float) * (size_t)(m * n));
	unsigned char *W = malloc(rb * (size_t)rows), *xq = malloc(qb * (size_t)m);
	float *ref = malloc(sizeof(float) * (size_t)(m * rows)), *Y = malloc(sizeof(float) * (size_t)(m * rows));
	for (int64_t i = 0; i < rows * n; i++)
		wf[i] = unif();
	for (int64_t i = 0; i < m * n; i++)
		X[i] = unif() * (1 + (i / n) % 5);
	for (int64_t r = 0; r < rows; r++)
		mcv_quantize_row(type, wf + r * n, W + (size_t)r * rb, n);
	for (int64_t i = 0; i < m; i++) {
		mcv_matvec(type, W, rb, rows, n, X + i * n, ref + i * rows);
		mcv_quantize_row(vdt, X + i * n, xq + (size_t)i * qb, n);
	}
	/* uneven cuts, including ones inside a 16-row panel */
	const int64_t cuts[] = { 0, 5, 16, 37, 48, rows };
	for (int k = 0; k + 1 < (int)(sizeof cuts / sizeof *cuts); k++) {
		const int64_t r0 = cuts[k] < rows ? cuts[k] : rows, r1 = cuts[k + 1] < rows ? cuts[k + 1] : rows;
		mcv_matmul_part(type, W, rb, rows, r0, r1, n, xq, qb, m, Y, (size_t)rows);
	}
	CHECK(memcmp(Y, ref, sizeof(float) * (size_t)(m * rows)) == 0,
	      "mcv_matmul_part type %d rows %lld n %lld m %lld differs from mcv_matvec", type, (long long)rows,
	      (long long)n, (long long)m);
	mcv_vgemm_w pk;
	if (mcv_vgemm_pack(&pk, type, W, rb, rows, n) == 1 && vdt == MCV_Q8_0) {
		memset(Y, 0, sizeof(float) * (size_t)(m * rows));
		for (int64_t r0 = 0; r0 < rows; r0 += 32) {
			const int64_t r1 = r0 + 32 < rows ? r0 + 32 : rows;
			mcv_gemm_q0_packed(&pk, r0, r1, xq, qb, m, Y + r0, (size_t)rows);
		}
		CHECK(memcmp(Y, ref, sizeof(float) * (size_t)(m * rows)) == 0,
		      "mcv_gemm_q0_packed type %d rows %lld m %lld differs from mcv_matvec", type, (long long)rows,
		      (long long)m);
		mcv_vgemm_free(&pk);
	}
	free(wf);
	free(X);
	free(W);
	free(xq);
	free(ref);
	free(Y);
}

/* mcv_silu and its array form mcv_silu_vec (the DeltaNet conv, SwiGLU)
 * stay close to x / (1 + exp(-x)); the array form rounds as ggml's does
 * (test_ggml_ops), which on AVX-512 is not libm's, so the two need not
 * agree bit for bit there. */
static void check_silu(void)
{
	enum { M = 200003 };
	static float x[M], y[M];
	for (int i = 0; i < M; i++)
		x[i] = i < 8 ? (float[]){ 0.0f, -0.0f, 100.0f, -100.0f, 88.5f, -88.5f, 1e-30f, -1e-30f }[i]
			     : unif() * (i % 3 ? 12.0f : 120.0f);
	mcv_silu_vec(y, x, M);
	double err = 0, err1 = 0;
	for (int i = 0; i < M; i++) {
		const double ref = (double)x[i] / (1.0 + exp(-(double)x[i]));
		if (fabs(ref) <= 1e-30)
			continue;
		err = fmax(err, fabs(ref - y[i]) / fabs(ref));
		err1 = fmax(err1, fabs(ref - mcv_silu(x[i])) / fabs(ref));
	}
	CHECK(err < 1e-6, "silu (array form) relative error %g", err);
	CHECK(err1 < 1e-6, "silu relative error %g", err1);
}

/* ---- whole prefills ---- */

static void noop_hook(void *u, const void *w, int64_t r0, int64_t nr, const float *X, int64_t m, int64_t n)
{
	(void)u, (void)w, (void)r0, (void)nr, (void)X, (void)m, (void)n;
}

enum { N = 37 };

/* Logits after a prefill of toks (split by n_batch) on T threads; hook: the
 * per-block forms. */
static void run(mcv_model *m, const int32_t *toks, int n_batch, int T, int hook, int embd, float *out)
{
	mcv_error e;
	mcv_ctx_params cp = mcv_ctx_default_params();
	cp.n_ctx = 64;
	cp.n_batch = n_batch;
	mcv_ctx *c;
	CHECK(mcv_ctx_init(&c, m, &cp, &e) == 0, "ctx: %s", e.msg);
	if (!c)
		return;
	omp_set_num_threads(T);
	mcv_set_matmul_hook(hook ? noop_hook : NULL, NULL);
	const int V = mcv_model_n_vocab(m), H = mcv_model_n_embd(m);
	if (!embd) {
		CHECK(mcv_ctx_eval(c, toks, N, &e) == 0, "eval: %s", e.msg);
	} else {
		/* rows as an image block: embeddings with canvas positions */
		float *x = malloc(sizeof(float) * (size_t)N * H);
		int32_t *pos = malloc(sizeof(int32_t) * 4 * N);
		for (int i = 0; i < N * H; i++)
			x[i] = unif() * 0.05f;
		for (int i = 0; i < N; i++) {
			pos[4 * i] = 1;
			pos[4 * i + 1] = 1 + i / 6;
			pos[4 * i + 2] = 1 + i % 6;
			pos[4 * i + 3] = 0;
		}
		CHECK(mcv_ctx_eval_embd(c, x, pos, N, &e) == 0, "eval_embd: %s", e.msg);
		free(x);
		free(pos);
	}
	mcv_set_matmul_hook(NULL, NULL);
	memcpy(out, mcv_ctx_logits(c), sizeof(float) * V);
	mcv_ctx_free(c);
}

static void check_model(const char *path)
{
	mcv_error e;
	mcv_model *m;
	mcv_model_params mp = mcv_model_default_params();
	if (mcv_model_load(&m, path, &mp, &e) < 0) {
		CHECK(0, "load %s: %s", path, e.msg);
		return;
	}
	const int V = mcv_model_n_vocab(m);
	int32_t toks[N];
	for (int i = 0; i < N; i++)
		toks[i] = (i * 53 + 7) % V;
	float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
	for (int embd = 0; embd < 2; embd++) {
		const uint64_t seed = rng;
		run(m, toks, 256, 1, 1, embd, ref); /* per-block forms, one thread */
		const int threads[] = { 1, 2, 3 };
		const int batches[] = { 256, 16 };
		for (int b = 0; b < 2; b++)
			for (int k = 0; k < 3; k++) {
				rng = seed;
				run(m, toks, batches[b], threads[k], 0, embd, got);
				CHECK(memcmp(ref, got, sizeof(float) * V) == 0,
				      "%s: %s prefill (batch %d, %d threads) differs from the per-block forms", path,
				      embd ? "embedding" : "token", batches[b], threads[k]);
			}
		/* token by token, against a prefill whose F32 products take the
		 * single-row order too (by default they round as llama.cpp's
		 * tiled GEMM, which its decode does not: an ulp that a quantized
		 * product can grow to 5e-2 on these random weights) */
		mcv_f32_single_order(1);
		rng = seed;
		run(m, toks, 256, 2, 0, embd, ref);
		rng = seed;
		run(m, toks, 1, 2, 0, embd, got);
		mcv_f32_single_order(0);
		float d = 0;
		for (int i = 0; i < V; i++)
			d = fmaxf(d, fabsf(ref[i] - got[i]));
		CHECK(d <= 1e-4f, "%s: prefill vs decode: max diff %g", path, d);
	}
	free(ref);
	free(got);
	mcv_model_free(m);
}

int main(void)
{
	setenv("MCV_SPLIT", "always", 1);
	check_silu();
	check_parts(MCV_Q8_0, 80, 256, 11);
	check_parts(MCV_Q8_0, 70, 64, 3);
	check_parts(MCV_Q4_0, 64, 128, 9);
	check_parts(MCV_Q4_K, 40, 256, 6);
	check_parts(MCV_F32, 33, 64, 5);
	check_parts(MCV_F16, 20, 64, 4);

	const char *b = getenv("B") ? getenv("B") : "build";
	char gen[512], dir[256], cmd[2048];
	snprintf(gen, sizeof gen, "%s/mcv-genmodel", b);
	if (access(gen, X_OK) != 0) {
		fprintf(stderr, "note: %s missing, prefill checks on models not run\n", gen);
		return unit_done("test_prefill");
	}
	snprintf(dir, sizeof dir, "/tmp/mcv-test-prefill.%d", (int)getpid());
	if (mkdir(dir, 0700) < 0)
		UNIT_SKIP("cannot create %s", dir);
	const char *types[][2] = { { "q8_0", "q8_0" }, { "q8_0", "q4_0" }, { "q4_k", "q4_k" }, { "f16", "f16" } };
	for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
		char path[512];
		snprintf(path, sizeof path, "%s/m-%s-%s.gguf", dir, types[i][0], types[i][1]);
		snprintf(cmd, sizeof cmd, "'%s' -q --arch qwen35moe --experts 16 --experts-used 4 --type %s --expert-type %s '%s'",
			 gen, types[i][0], types[i][1], path);
		CHECK(system(cmd) == 0, "%s", cmd);
		check_model(path);
		unlink(path);
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return unit_done("test_prefill");
}

/* Model loading errors and forward-pass invariants of the qwen35/qwen35moe
 * graph (parity with llama.cpp is test/parity-llama.bats).
 *
 * Load errors use small hand-written GGUF files.  The invariants need the
 * random model generator ($B/mcv-genmodel, B from the environment as in
 * `make check`); without it that half is skipped:
 *   - a batched prefill gives the logits that token-by-token decode gives,
 *     whatever the prefill chunk (n_batch);
 *   - results do not depend on the thread count;
 *   - mcv_ctx_eval_embd with the token's embedding row and (p, p, p, 0)
 *     positions equals mcv_ctx_eval;
 *   - a full context and an out-of-vocabulary token are clean errors. */
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "unit.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

/* A qwen35moe header with tiny shapes; only the tensors given are written. */
typedef struct tdesc { const char *name; int nd; int64_t ne[3]; } tdesc;

static int write_gguf(const char *path, const char *arch, const tdesc *t, int nt, int with_layers)
{
	mcv_gguf_writer *w;
	if (mcv_gguf_writer_open(&w, path, NULL) < 0)
		return -1;
	char k[128];
	mcv_gguf_w_str(w, "general.architecture", arch);
#define U(key, v) do { snprintf(k, sizeof k, "%s." key, arch); mcv_gguf_w_u32(w, k, v); } while (0)
	U("context_length", 128);
	U("embedding_length", 32);
	if (with_layers)
		U("block_count", 1);
	snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
	mcv_gguf_w_f32(w, k, 1e-6f);
	U("attention.head_count", 2);
	U("attention.head_count_kv", 1);
	U("attention.key_length", 32);
	U("attention.value_length", 32);
	U("rope.dimension_count", 16);
	int32_t sec[4] = { 3, 3, 2, 0 };
	snprintf(k, sizeof k, "%s.rope.dimension_sections", arch);
	mcv_gguf_w_arr(w, k, GGUF_I32, sec, 4);
	U("ssm.conv_kernel", 4);
	U("ssm.inner_size", 64);
	U("ssm.state_size", 32);
	U("ssm.time_step_rank", 2);
	U("ssm.group_count", 1);
	U("expert_count", 4);
	U("expert_used_count", 2);
	U("expert_feed_forward_length", 32);
	U("expert_shared_feed_forward_length", 32);
#undef U
	for (int i = 0; i < nt; i++)
		mcv_gguf_w_add_tensor(w, t[i].name, MCV_F32, t[i].nd, t[i].ne);
	mcv_gguf_w_begin_data(w);
	for (int i = 0; i < nt; i++) {
		size_t n = 1;
		for (int d = 0; d < t[i].nd; d++)
			n *= (size_t)t[i].ne[d];
		float *z = calloc(n, sizeof *z);
		mcv_gguf_w_write(w, z, n * sizeof *z);
		free(z);
		mcv_gguf_w_end_tensor(w);
	}
	return mcv_gguf_writer_finish(w, NULL);
}

static void expect_error(const char *path, const char *needle)
{
	mcv_model *m = NULL;
	mcv_error e = { 0 };
	int rc = mcv_model_load(&m, path, NULL, &e);
	CHECK(rc < 0 && m == NULL, "load of %s should fail", path);
	CHECK(strstr(e.msg, needle) != NULL, "message '%s' lacks '%s'", e.msg, needle);
	CHECK(strchr(e.msg, '\n') == NULL, "message is not one line: '%s'", e.msg);
	if (m)
		mcv_model_free(m);
}

static void test_load_errors(void)
{
	char p[512];
	const tdesc embd_ok[] = { { "token_embd.weight", 2, { 32, 16, 1 } } };
	const tdesc embd_bad[] = { { "token_embd.weight", 2, { 33, 16, 1 } } };
	const tdesc no_blk[] = { { "token_embd.weight", 2, { 32, 16, 1 } },
				 { "output_norm.weight", 1, { 32, 1, 1 } } };

	snprintf(p, sizeof p, "%s/arch.gguf", dir);
	CHECK(write_gguf(p, "llama", embd_ok, 1, 1) == 0, "write %s", p);
	expect_error(p, "unknown architecture 'llama'");

	snprintf(p, sizeof p, "%s/nokey.gguf", dir);
	CHECK(write_gguf(p, "qwen35moe", embd_ok, 1, 0) == 0, "write %s", p);
	expect_error(p, "missing key 'qwen35moe.block_count'");

	snprintf(p, sizeof p, "%s/shape.gguf", dir);
	CHECK(write_gguf(p, "qwen35moe", embd_bad, 1, 1) == 0, "write %s", p);
	expect_error(p, "tensor 'token_embd.weight' has shape [33, 16], expected [32, 16]");

	snprintf(p, sizeof p, "%s/missing.gguf", dir);
	CHECK(write_gguf(p, "qwen35moe", no_blk, 2, 1) == 0, "write %s", p);
	expect_error(p, "missing tensor 'blk.0.attn_norm.weight'");

	expect_error("/nonexistent/model.gguf", "model.gguf");
}

static float max_diff(const float *a, const float *b, int n)
{
	float d = 0;
	for (int i = 0; i < n; i++)
		d = fmaxf(d, fabsf(a[i] - b[i]));
	return d;
}

/* Logits after each prompt position: prefill of all n tokens in chunks of
 * n_batch, compared with one token at a time. */
static void check_model(const char *path)
{
	mcv_error e;
	mcv_model *m;
	if (mcv_model_load(&m, path, NULL, &e) < 0) {
		CHECK(0, "load %s: %s", path, e.msg);
		return;
	}
	const int V = mcv_model_n_vocab(m), H = mcv_model_n_embd(m);
	CHECK(V > 0 && H > 0 && mcv_model_n_layer(m) > 0, "dimensions");
	enum { N = 19 };
	int32_t toks[N];
	for (int i = 0; i < N; i++)
		toks[i] = (i * 37 + 11) % V;

	mcv_ctx_params cp = mcv_ctx_default_params();
	cp.n_ctx = 64;
	mcv_ctx *c;
	CHECK(mcv_ctx_init(&c, m, &cp, &e) == 0, "ctx: %s", e.msg);
	float *step = malloc(sizeof(float) * V), *pre = malloc(sizeof(float) * V);
	/* F32 products in the single-row order in prefill too, so that it can
	 * equal decode (by default they round as llama.cpp's, whose prefill
	 * and decode sum F32 rows in different orders) */
	mcv_f32_single_order(1);
	for (int i = 0; i < N; i++)
		CHECK(mcv_ctx_eval(c, &toks[i], 1, &e) == 0, "decode: %s", e.msg);
	memcpy(step, mcv_ctx_logits(c), sizeof(float) * V);
	CHECK(mcv_ctx_pos(c) == N, "pos %d", mcv_ctx_pos(c));

	const int batches[] = { 256, 5, 1 };
	for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
		mcv_ctx *c2;
		cp.n_batch = batches[b];
		CHECK(mcv_ctx_init(&c2, m, &cp, &e) == 0, "ctx: %s", e.msg);
		CHECK(mcv_ctx_eval(c2, toks, N, &e) == 0, "prefill: %s", e.msg);
		float d = max_diff(step, mcv_ctx_logits(c2), V);
		CHECK(d <= 1e-4f, "%s: prefill (n_batch %d) vs decode: max diff %g", path, batches[b], d);
		mcv_ctx_free(c2);
	}
	mcv_f32_single_order(0);

	/* thread count: the same prefill on one thread */
	int nthr = omp_get_max_threads();
	omp_set_num_threads(1);
	mcv_ctx_reset(c);
	CHECK(mcv_ctx_eval(c, toks, N, &e) == 0, "prefill: %s", e.msg);
	memcpy(pre, mcv_ctx_logits(c), sizeof(float) * V);
	omp_set_num_threads(nthr > 1 ? nthr : 2);
	mcv_ctx_reset(c);
	CHECK(mcv_ctx_eval(c, toks, N, &e) == 0, "prefill: %s", e.msg);
	CHECK(memcmp(pre, mcv_ctx_logits(c), sizeof(float) * V) == 0,
	      "%s: 1 thread and %d threads differ", path, nthr > 1 ? nthr : 2);
	omp_set_num_threads(nthr);

	/* embeddings + explicit positions: the token rows, dequantized */
	const mcv_gguf_tensor *te = mcv_gguf_find_tensor(mcv_model_gguf(m), "token_embd.weight");
	float *emb = malloc(sizeof(float) * (size_t)H * N);
	int32_t *pos = malloc(sizeof(int32_t) * 4 * N);
	size_t rb = mcv_row_bytes(te->type, H);
	for (int i = 0; i < N; i++) {
		mcv_dequantize_row(te->type, (const char *)te->data + (size_t)toks[i] * rb, emb + (size_t)i * H, H);
		pos[4 * i] = pos[4 * i + 1] = pos[4 * i + 2] = i;
		pos[4 * i + 3] = 0;
	}
	mcv_ctx_reset(c);
	CHECK(mcv_ctx_eval_embd(c, emb, pos, N, &e) == 0, "eval_embd: %s", e.msg);
	float d = max_diff(pre, mcv_ctx_logits(c), V);
	CHECK(d <= 1e-4f, "%s: eval_embd vs eval: max diff %g", path, d);

	/* errors */
	int32_t bad = V;
	CHECK(mcv_ctx_eval(c, &bad, 1, &e) == MCV_EINVAL && strstr(e.msg, "vocabulary"),
	      "bad token: %s", e.msg);
	int32_t *many = calloc(64, sizeof *many);
	CHECK(mcv_ctx_eval(c, many, 64, &e) == MCV_EBUDGET && strstr(e.msg, "context full"),
	      "overflow: %s", e.msg);
	CHECK(mcv_ctx_pos(c) == N, "a failed eval moved the position");
	free(many);
	free(emb);
	free(pos);
	free(step);
	free(pre);
	mcv_ctx_free(c);
	mcv_model_free(m);
}

int main(void)
{
	/* tiny models would otherwise run on one thread (lib/forward.c,
	 * set_threads), and the thread-count checks would compare nothing */
	setenv("MCV_SPLIT", "always", 1);
	snprintf(dir, sizeof dir, "/tmp/mcv-test-model.%d", (int)getpid());
	if (mkdir(dir, 0700) < 0)
		UNIT_SKIP("cannot create %s", dir);
	test_load_errors();

	const char *b = getenv("B") ? getenv("B") : "build";
	char gen[512], cmd[2048];
	snprintf(gen, sizeof gen, "%s/mcv-genmodel", b);
	int ran = 0;
	if (access(gen, X_OK) == 0) {
		const char *archs[][2] = { { "qwen35moe", "q8_0" }, { "qwen35", "q4_k" }, { "qwen35moe", "f16" } };
		for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) {
			char path[512];
			snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, archs[i][0], archs[i][1]);
			snprintf(cmd, sizeof cmd, "'%s' -q --arch %s --type %s '%s'", gen, archs[i][0], archs[i][1], path);
			CHECK(system(cmd) == 0, "%s", cmd);
			check_model(path);
			unlink(path);
			ran++;
		}
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	if (!ran)
		fprintf(stderr, "note: %s missing, forward checks not run\n", gen);
	return unit_done("test_model");
}

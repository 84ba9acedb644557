/* lib/trace: routing trace round trip (records put out of order, hidden
 * states none/f16/f32), a trace refused by another model, truncated and
 * incomplete traces as clear errors. */
#include "gguf.h"
#include "quant.h"
#include "trace.h"
#include "unit.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NL 3
#define NE 8
#define NK 3

static char dir[] = "/tmp/mcv-test-trace.XXXXXX";

/* A minimal MoE file: keys and expert tensors (F32), enough for a layout. */
static void make_model(const char *path, int H, int extra)
{
	mcv_gguf_writer *w;
	mcv_error err = { 0 };
	CHECK(mcv_gguf_writer_open(&w, path, &err) == 0, "%s", err.msg);
	mcv_gguf_w_str(w, "general.architecture", "qwen35moe");
	mcv_gguf_w_u32(w, "qwen35moe.block_count", NL);
	mcv_gguf_w_u32(w, "qwen35moe.expert_count", NE);
	mcv_gguf_w_u32(w, "qwen35moe.expert_used_count", NK);
	mcv_gguf_w_u32(w, "qwen35moe.embedding_length", (uint32_t)H);
	const int F = 32;
	char n[96];
	for (int il = 0; il < NL; il++) {
		int64_t g[3] = { H, F, NE }, d[3] = { F, H, NE };
		snprintf(n, sizeof n, "blk.%d.ffn_gate_exps.weight", il);
		mcv_gguf_w_add_tensor(w, n, MCV_F32, 3, g);
		snprintf(n, sizeof n, "blk.%d.ffn_up_exps.weight", il);
		mcv_gguf_w_add_tensor(w, n, MCV_F32, 3, g);
		snprintf(n, sizeof n, "blk.%d.ffn_down_exps.weight", il);
		mcv_gguf_w_add_tensor(w, n, MCV_F32, 3, d);
	}
	int64_t one[1] = { H };
	if (extra)
		mcv_gguf_w_add_tensor(w, "output_norm.weight", MCV_F32, 1, one);
	mcv_gguf_w_begin_data(w);
	float *z = calloc((size_t)H * F * NE, sizeof *z);
	for (int il = 0; il < NL; il++)
		for (int s = 0; s < 3; s++) {
			mcv_gguf_w_write(w, z, (size_t)H * F * NE * sizeof *z);
			mcv_gguf_w_end_tensor(w);
		}
	if (extra) {
		mcv_gguf_w_write(w, z, (size_t)H * sizeof *z);
		mcv_gguf_w_end_tensor(w);
	}
	free(z);
	CHECK(mcv_gguf_writer_finish(w, &err) == 0, "%s", err.msg);
}

static void record(int64_t t, int il, int32_t *ids, float *wt, float *hid, int H)
{
	/* distinct ids from a token/layer-dependent stride coprime with NE */
	for (int a = 0; a < NK; a++) {
		ids[a] = (int32_t)((t * 3 + il * 5 + a * 3) % NE);
		wt[a] = (float)(1 + a + t % 7) / 16.0f;
	}
	for (int h = 0; h < H; h++)
		hid[h] = (float)((t * 131 + il * 17 + h * 7) % 101) / 37.0f - 1.3f;
}

static void test_roundtrip(const char *model, int htype, const char *out)
{
	const int H = 64, N = 37;
	mcv_gguf *g;
	mcv_error err = { 0 };
	mcv_trace_model m;
	CHECK(mcv_gguf_open(&g, model, &err) == 0, "%s", err.msg);
	CHECK(mcv_trace_model_from_gguf(&m, g, &err) == 0, "%s", err.msg);
	CHECK(m.n_layer == NL && m.n_expert == NE && m.n_expert_used == NK && m.n_embd == H,
	      "model description");
	mcv_trace_writer *w;
	CHECK(mcv_trace_writer_open(&w, out, &m, htype, &err) == 0, "%s", err.msg);
	int32_t ids[NK];
	float wt[NK], hid[64], got[64], gw[NK];
	/* layer-major over tokens, as a batched prefill produces them */
	for (int il = NL - 1; il >= 0; il--)
		for (int64_t t = N - 1; t >= 0; t--) {
			record(t, il, ids, wt, hid, H);
			CHECK(mcv_trace_writer_put(w, t, il, ids, wt, hid) == 0, "put");
		}
	CHECK(mcv_trace_writer_finish(w, &err) == 0, "finish: %s", err.msg);
	mcv_trace *tr;
	CHECK(mcv_trace_open(&tr, out, &err) == 0, "open: %s", err.msg);
	if (unit_failures)
		exit(unit_done("test_pack_trace"));
	CHECK(mcv_trace_n_tokens(tr) == N, "tokens %lld", (long long)mcv_trace_n_tokens(tr));
	CHECK(mcv_trace_hidden_type(tr) == htype, "hidden type");
	CHECK(mcv_trace_check_model(tr, g, &err) == 0, "own model accepted: %s", err.msg);
	int bad = 0;
	for (int64_t t = 0; t < N; t++)
		for (int il = 0; il < NL; il++) {
			record(t, il, ids, wt, hid, H);
			const int32_t *x = mcv_trace_experts(tr, t, il);
			bad += !x || memcmp(x, ids, sizeof ids) != 0;
			bad += mcv_trace_weights(tr, t, il, gw) != 0 || memcmp(gw, wt, sizeof wt) != 0;
			int rc = mcv_trace_hidden(tr, t, il, got);
			if (htype < 0) {
				bad += rc != MCV_ENOTFOUND;
				continue;
			}
			bad += rc != 0;
			for (int h = 0; h < H; h++) {
				float want = htype == MCV_F16 ? mcv_fp16_to_fp32(mcv_fp32_to_fp16(hid[h])) : hid[h];
				bad += got[h] != want;
			}
		}
	CHECK(bad == 0, "%d values differ after the round trip", bad);
	CHECK(mcv_trace_experts(tr, N, 0) == NULL && mcv_trace_experts(tr, 0, NL) == NULL, "bounds");
	mcv_trace_close(tr);
	mcv_gguf_close(g);
}

static void cut_copy(const char *from, const char *to, long drop)
{
	FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
	CHECK(in && out, "copy %s", from);
	if (!in || !out)
		return;
	struct stat st;
	stat(from, &st);
	long left = (long)st.st_size - drop;
	int c;
	while (left-- > 0 && (c = fgetc(in)) != EOF)
		fputc(c, out);
	fclose(in);
	fclose(out);
}

/* Flip bytes of a trace (header and ids): refused or read, never a crash;
 * every id handed out is in range. */
static void test_hostile(const char *path)
{
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0, "open %s", path);
	struct stat st;
	fstat(fd, &st);
	uint64_t x = 99;
	for (int it = 0; it < 300; it++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		off_t at = (off_t)((x >> 33) % (uint64_t)st.st_size);
		uint8_t old, nb = (uint8_t)(x >> 13) | 1;
		if (pread(fd, &old, 1, at) != 1)
			break;
		uint8_t neu = old ^ nb;
		if (pwrite(fd, &neu, 1, at) != 1)
			break;
		mcv_trace *t;
		mcv_error err = { 0 };
		if (mcv_trace_open(&t, path, &err) == 0) {
			const mcv_trace_model *m = mcv_trace_model_of(t);
			for (int64_t tok = 0; tok < mcv_trace_n_tokens(t); tok++)
				for (int il = 0; il < m->n_layer; il++) {
					const int32_t *ids = mcv_trace_experts(t, tok, il);
					for (int a = 0; a < m->n_expert_used; a++)
						CHECK(ids[a] >= 0 && ids[a] < m->n_expert, "id in range");
				}
			mcv_trace_close(t);
		} else {
			CHECK(err.msg[0] != 0, "a refusal has a message");
		}
		if (pwrite(fd, &old, 1, at) != 1)
			break;
	}
	close(fd);
}

int main(void)
{
	if (!mkdtemp(dir))
		UNIT_SKIP("cannot create a temporary directory");
	char a[256], b[256], c[256], t16[256], t32[256], t0[256], cut[256], inc[256];
	snprintf(a, sizeof a, "%s/a.gguf", dir);
	snprintf(b, sizeof b, "%s/b.gguf", dir);
	snprintf(c, sizeof c, "%s/c.gguf", dir);
	snprintf(t16, sizeof t16, "%s/t16.gguf", dir);
	snprintf(t32, sizeof t32, "%s/t32.gguf", dir);
	snprintf(t0, sizeof t0, "%s/t0.gguf", dir);
	snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
	snprintf(inc, sizeof inc, "%s/inc.gguf", dir);
	make_model(a, 64, 0);
	make_model(b, 32, 0); /* another hidden size */
	make_model(c, 64, 1); /* same keys, one more tensor */
	test_roundtrip(a, MCV_F16, t16);
	test_roundtrip(a, MCV_F32, t32);
	test_roundtrip(a, -1, t0);

	/* another model is refused, with a message saying so */
	mcv_trace *tr;
	mcv_gguf *g;
	mcv_error err = { 0 };
	CHECK(mcv_trace_open(&tr, t16, &err) == 0, "%s", err.msg);
	const char *others[2] = { b, c };
	for (int i = 0; i < 2; i++) {
		CHECK(mcv_gguf_open(&g, others[i], &err) == 0, "%s", err.msg);
		err.msg[0] = 0;
		CHECK(mcv_trace_check_model(tr, g, &err) == MCV_EINVAL && strstr(err.msg, "another model"),
		      "%s: %s", others[i], err.msg);
		mcv_gguf_close(g);
	}
	mcv_trace_close(tr);

	/* truncated */
	for (long drop = 1; drop < 20000; drop *= 7) {
		cut_copy(t16, cut, drop);
		err.msg[0] = 0;
		int rc = mcv_trace_open(&tr, cut, &err);
		CHECK(rc == MCV_EFORMAT && err.msg[0], "truncated by %ld: rc %d '%s'", drop, rc, err.msg);
		if (!rc)
			mcv_trace_close(tr);
	}
	test_hostile(t32);
	/* a model file is not a trace */
	CHECK(mcv_trace_open(&tr, a, &err) == MCV_EFORMAT && strstr(err.msg, "not a routing trace"),
	      "model as trace: %s", err.msg);

	/* incomplete: token 1 layer 2 never put; nothing is written */
	mcv_trace_model m;
	CHECK(mcv_gguf_open(&g, a, &err) == 0 && mcv_trace_model_from_gguf(&m, g, &err) == 0, "%s", err.msg);
	mcv_gguf_close(g);
	mcv_trace_writer *w;
	int32_t ids[NK] = { 0, 1, 2 };
	float wt[NK] = { 0.5f, 0.3f, 0.2f };
	CHECK(mcv_trace_writer_open(&w, inc, &m, -1, &err) == 0, "%s", err.msg);
	for (int t = 0; t < 3; t++)
		for (int il = 0; il < NL; il++)
			if (!(t == 1 && il == 2))
				mcv_trace_writer_put(w, t, il, ids, wt, NULL);
	CHECK(mcv_trace_writer_finish(w, &err) == MCV_EINVAL && strstr(err.msg, "token 1 layer 2"),
	      "incomplete: %s", err.msg);
	struct stat st;
	CHECK(stat(inc, &st) != 0, "no file from an incomplete trace");

	/* a bad id sticks */
	CHECK(mcv_trace_writer_open(&w, inc, &m, -1, &err) == 0, "%s", err.msg);
	int32_t dup[NK] = { 4, 4, 1 }, big[NK] = { 0, 1, NE };
	CHECK(mcv_trace_writer_put(w, 0, 0, dup, wt, NULL) == MCV_EINVAL, "duplicate id");
	CHECK(mcv_trace_writer_put(w, 0, 0, ids, wt, NULL) == MCV_EINVAL, "error sticks");
	CHECK(mcv_trace_writer_finish(w, &err) == MCV_EINVAL && strstr(err.msg, "twice"), "%s", err.msg);
	CHECK(mcv_trace_writer_open(&w, inc, &m, -1, &err) == 0, "%s", err.msg);
	CHECK(mcv_trace_writer_put(w, 0, 0, big, wt, NULL) == MCV_EINVAL, "id out of range");
	mcv_trace_writer_abort(w);

	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return unit_done("test_pack_trace");
}

/* GGUF against llama.cpp's own gguf code (the peer's libggml-base.so, dlopened):
 *   1. a file from mcv's writer is read by ggml: every key, type, value,
 *      tensor info and tensor byte must agree with what was written;
 *   2. a file from ggml's writer is read by mcv: the same.
 * MCV_GGML_LIB overrides the library path; without it the test is skipped. */
#include "gguf.h"
#include "quant.h"
#include "unit.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#define PEER_DIR "scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/"

struct gguf_init_params { bool no_alloc; void **ctx; };
struct ggml_init_params { size_t mem_size; void *mem_buffer; bool no_alloc; };

static struct {
	void *(*init_from_file)(const char *, struct gguf_init_params);
	void *(*init_empty)(void);
	void (*free)(void *);
	uint32_t (*version)(const void *);
	size_t (*alignment)(const void *);
	size_t (*data_offset)(const void *);
	int64_t (*n_kv)(const void *);
	const char *(*key)(const void *, int64_t);
	int (*kv_type)(const void *, int64_t);
	int (*arr_type)(const void *, int64_t);
	const void *(*val_data)(const void *, int64_t);
	const char *(*val_str)(const void *, int64_t);
	size_t (*arr_n)(const void *, int64_t);
	const void *(*arr_data)(const void *, int64_t);
	const char *(*arr_str)(const void *, int64_t, size_t);
	int64_t (*n_tensors)(const void *);
	size_t (*t_offset)(const void *, int64_t);
	const char *(*t_name)(const void *, int64_t);
	const int64_t *(*t_ne)(const void *, int64_t);
	int (*t_type)(const void *, int64_t);
	size_t (*t_size)(const void *, int64_t);
	void (*set_u32)(void *, const char *, uint32_t);
	void (*set_i8)(void *, const char *, int8_t);
	void (*set_u16)(void *, const char *, uint16_t);
	void (*set_i64)(void *, const char *, int64_t);
	void (*set_f64)(void *, const char *, double);
	void (*set_f32)(void *, const char *, float);
	void (*set_bool)(void *, const char *, bool);
	void (*set_str)(void *, const char *, const char *);
	void (*set_arr_data)(void *, const char *, int, const void *, size_t);
	void (*set_arr_str)(void *, const char *, const char **, size_t);
	void (*add_tensor)(void *, const void *);
	bool (*write_to_file)(const void *, const char *, bool);
	void *(*ggml_init)(struct ggml_init_params);
	void (*ggml_free)(void *);
	void *(*new_tensor)(void *, int, int, const int64_t *);
	void *(*set_name)(void *, const char *);
	void *(*get_data)(const void *);
	void *(*get_tensor)(void *, const char *);
} G;

static void *sym(void *lib, const char *name)
{
	void *p = dlsym(lib, name);
	if (!p)
		UNIT_SKIP("ggml library lacks %s", name);
	return p;
}

static void load(void)
{
	const char *path = getenv("MCV_GGML_LIB");
	if (!path)
		path = PEER_DIR "libggml-base.so";
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		UNIT_SKIP("ggml library not loadable (%s); install the peer with scripts/setup.sh", dlerror());
#define S(f, n) *(void **)&G.f = sym(lib, n)
	S(init_from_file, "gguf_init_from_file"); S(init_empty, "gguf_init_empty"); S(free, "gguf_free");
	S(version, "gguf_get_version"); S(alignment, "gguf_get_alignment"); S(data_offset, "gguf_get_data_offset");
	S(n_kv, "gguf_get_n_kv"); S(key, "gguf_get_key"); S(kv_type, "gguf_get_kv_type");
	S(arr_type, "gguf_get_arr_type"); S(val_data, "gguf_get_val_data"); S(val_str, "gguf_get_val_str");
	S(arr_n, "gguf_get_arr_n"); S(arr_data, "gguf_get_arr_data"); S(arr_str, "gguf_get_arr_str");
	S(n_tensors, "gguf_get_n_tensors"); S(t_offset, "gguf_get_tensor_offset");
	S(t_name, "gguf_get_tensor_name"); S(t_ne, "gguf_get_tensor_ne"); S(t_type, "gguf_get_tensor_type");
	S(t_size, "gguf_get_tensor_size");
	S(set_u32, "gguf_set_val_u32"); S(set_i8, "gguf_set_val_i8"); S(set_u16, "gguf_set_val_u16");
	S(set_i64, "gguf_set_val_i64"); S(set_f64, "gguf_set_val_f64"); S(set_f32, "gguf_set_val_f32");
	S(set_bool, "gguf_set_val_bool"); S(set_str, "gguf_set_val_str");
	S(set_arr_data, "gguf_set_arr_data"); S(set_arr_str, "gguf_set_arr_str");
	S(add_tensor, "gguf_add_tensor"); S(write_to_file, "gguf_write_to_file");
	S(ggml_init, "ggml_init"); S(ggml_free, "ggml_free"); S(new_tensor, "ggml_new_tensor");
	S(set_name, "ggml_set_name"); S(get_data, "ggml_get_data"); S(get_tensor, "ggml_get_tensor");
#undef S
}

static const size_t esz[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

/* Every key, tensor info and tensor byte of the file, as mcv and ggml see it. */
static void compare(const char *path, const char *dir_of)
{
	mcv_gguf *g;
	mcv_error e = { 0 };
	CHECK(mcv_gguf_open(&g, path, &e) == 0, "%s: mcv cannot read: %s", dir_of, e.msg);
	void *ctx_data = NULL;
	void *x = G.init_from_file(path, (struct gguf_init_params){ false, &ctx_data });
	CHECK(x != NULL, "%s: ggml cannot read %s", dir_of, path);
	if (!g || !x)
		goto out;
	CHECK(mcv_gguf_version(g) == G.version(x), "%s: version", dir_of);
	CHECK(mcv_gguf_alignment(g) == G.alignment(x), "%s: alignment %u vs %zu", dir_of,
	      mcv_gguf_alignment(g), G.alignment(x));
	CHECK(mcv_gguf_n_kv(g) == G.n_kv(x), "%s: n_kv %" PRId64 " vs %" PRId64, dir_of, mcv_gguf_n_kv(g), G.n_kv(x));
	CHECK(mcv_gguf_n_tensors(g) == G.n_tensors(x), "%s: n_tensors", dir_of);
	if (mcv_gguf_n_tensors(g))
		CHECK(mcv_gguf_data_offset(g) == G.data_offset(x), "%s: data offset %" PRIu64 " vs %zu", dir_of,
		      mcv_gguf_data_offset(g), G.data_offset(x));
	for (int64_t i = 0; i < mcv_gguf_n_kv(g) && i < G.n_kv(x); i++) {
		const char *k = mcv_gguf_key(g, i);
		int t = mcv_gguf_kv_type(g, i);
		CHECK(strcmp(k, G.key(x, i)) == 0, "%s: key %" PRId64 ": %s vs %s", dir_of, i, k, G.key(x, i));
		CHECK(t == G.kv_type(x, i), "%s: %s type %d vs %d", dir_of, k, t, G.kv_type(x, i));
		if (t != G.kv_type(x, i))
			continue;
		if (t == GGUF_STRING) {
			const char *s = NULL;
			mcv_gguf_get_str(g, k, &s, &e);
			CHECK(s && strcmp(s, G.val_str(x, i)) == 0, "%s: %s value", dir_of, k);
		} else if (t == GGUF_ARRAY) {
			int et;
			uint64_t n;
			const void *d;
			mcv_gguf_get_arr(g, k, &et, &n, &d, &e);
			CHECK(et == G.arr_type(x, i) && n == G.arr_n(x, i), "%s: %s array type/count", dir_of, k);
			if (et != G.arr_type(x, i) || n != G.arr_n(x, i))
				continue;
			if (et == GGUF_STRING) {
				int bad = 0;
				for (uint64_t j = 0; j < n; j++) {
					size_t len;
					const char *s = mcv_gguf_arr_str(g, k, j, &len);
					const char *r = G.arr_str(x, i, j);
					bad += !s || len != strlen(r) || memcmp(s, r, len) != 0;
				}
				CHECK(bad == 0, "%s: %s: %d strings differ", dir_of, k, bad);
			} else if (n) {
				CHECK(memcmp(d, G.arr_data(x, i), n * esz[et]) == 0, "%s: %s array data", dir_of, k);
			}
		} else {
			/* Scalars: compare the raw value bytes (the last esz bytes of the entry). */
			const void *raw;
			size_t rn;
			mcv_gguf_kv_raw(g, i, &raw, &rn);
			CHECK(memcmp((const uint8_t *)raw + rn - esz[t], G.val_data(x, i), esz[t]) == 0,
			      "%s: %s value", dir_of, k);
		}
	}
	for (int64_t i = 0; i < mcv_gguf_n_tensors(g) && i < G.n_tensors(x); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		CHECK(strcmp(t->name, G.t_name(x, i)) == 0, "%s: tensor %" PRId64 " name", dir_of, i);
		CHECK(t->type == G.t_type(x, i), "%s: %s type", dir_of, t->name);
		CHECK(t->offset == G.t_offset(x, i), "%s: %s offset %" PRIu64 " vs %zu", dir_of, t->name, t->offset,
		      G.t_offset(x, i));
		CHECK(t->nbytes == G.t_size(x, i), "%s: %s size", dir_of, t->name);
		const int64_t *ne = G.t_ne(x, i);
		for (int j = 0; j < 4; j++)
			CHECK(t->ne[j] == ne[j], "%s: %s ne[%d]", dir_of, t->name, j);
		void *gt = ctx_data ? G.get_tensor(ctx_data, t->name) : NULL;
		CHECK(gt && memcmp(G.get_data(gt), t->data, t->nbytes) == 0, "%s: %s data", dir_of, t->name);
	}
out:
	if (ctx_data)
		G.ggml_free(ctx_data);
	if (x)
		G.free(x);
	mcv_gguf_close(g);
}

static const struct { const char *name; int type, n_dims; int64_t ne[4]; } T[] = {
	{ "token_embd.weight", MCV_Q8_0, 2, { 64, 5 } },
	{ "output_norm.weight", MCV_F32, 1, { 7 } },
	{ "blk.0.ffn_gate_exps.weight", MCV_Q4_0, 3, { 32, 3, 4 } },
	{ "blk.0.ssm_a", MCV_F16, 1, { 3 } },
	{ "blk.3.attn_q.weight", MCV_Q6_K, 2, { 256, 2 } },
	{ "blk.3.attn_k.weight", MCV_Q4_K, 2, { 512, 1 } },
	{ "blk.3.attn_v.weight", MCV_BF16, 4, { 2, 3, 1, 2 } },
	{ "x.q2", MCV_Q2_K, 1, { 256 } }, { "x.q3", MCV_Q3_K, 1, { 256 } }, { "x.q5", MCV_Q5_K, 1, { 256 } },
};
#define NT ((int)(sizeof T / sizeof T[0]))

static const char *toks[] = { "!", "\"", "\xc4\xa0t", "", "<|im_end|>" };
static const int32_t secs[] = { 11, 11, 10, 0 };
static const float fl[] = { 0.5f, -2.0f };
static const uint8_t bools[] = { 1, 0, 0 };

static void ours_to_ggml(const char *path, uint32_t align)
{
	mcv_gguf_writer *w;
	mcv_error e = { 0 };
	CHECK(mcv_gguf_writer_open(&w, path, &e) == 0, "%s", e.msg);
	if (!w)
		return;
	int8_t i8 = -3;
	uint16_t u16 = 65000;
	int64_t i64 = -5;
	double f64 = 0.125;
	mcv_gguf_w_str(w, "general.architecture", "qwen35moe");
	if (align)
		mcv_gguf_writer_set_alignment(w, align);
	mcv_gguf_w_u32(w, "qwen35moe.block_count", 40);
	mcv_gguf_w_scalar(w, "t.i8", GGUF_I8, &i8);
	mcv_gguf_w_scalar(w, "t.u16", GGUF_U16, &u16);
	mcv_gguf_w_scalar(w, "t.i64", GGUF_I64, &i64);
	mcv_gguf_w_scalar(w, "t.f64", GGUF_F64, &f64);
	mcv_gguf_w_i32(w, "t.i32", -7);
	mcv_gguf_w_u64(w, "t.u64", UINT64_MAX);
	mcv_gguf_w_f32(w, "qwen35moe.attention.layer_norm_rms_epsilon", 1e-6f);
	mcv_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
	mcv_gguf_w_arr(w, "qwen35moe.rope.dimension_sections", GGUF_I32, secs, 4);
	mcv_gguf_w_arr(w, "t.f32s", GGUF_F32, fl, 2);
	mcv_gguf_w_arr(w, "t.bools", GGUF_BOOL, bools, 3);
	mcv_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 5);
	for (int i = 0; i < NT; i++)
		mcv_gguf_w_add_tensor(w, T[i].name, T[i].type, T[i].n_dims, T[i].ne);
	mcv_gguf_w_begin_data(w);
	for (int i = 0; i < NT; i++) {
		uint64_t n;
		mcv_gguf_tensor_size(T[i].type, T[i].n_dims, T[i].ne, &n, &e);
		for (uint64_t j = 0; j < n; j++) {
			uint8_t b = (uint8_t)(j * 29 + (uint64_t)i);
			mcv_gguf_w_write(w, &b, 1);
		}
		mcv_gguf_w_end_tensor(w);
	}
	CHECK(mcv_gguf_writer_finish(w, &e) == 0, "%s", e.msg);
	compare(path, align ? "mcv writer (aligned) -> ggml" : "mcv writer -> ggml");
}

static void ggml_to_ours(const char *path)
{
	void *x = G.init_empty();
	void *ctx = G.ggml_init((struct ggml_init_params){ 1 << 20, NULL, false });
	G.set_str(x, "general.architecture", "qwen35moe");
	/* No general.alignment here: ggml's writer lays out offsets with the
	 * alignment it had when each tensor was added, so setting the key does
	 * not give a file ggml itself can read back. */
	G.set_u32(x, "qwen35moe.block_count", 40);
	G.set_i8(x, "t.i8", -3);
	G.set_u16(x, "t.u16", 65000);
	G.set_i64(x, "t.i64", INT64_MIN);
	G.set_f64(x, "t.f64", 1e300);
	G.set_f32(x, "t.f32", 3.5f);
	G.set_bool(x, "t.bool", true);
	G.set_arr_data(x, "qwen35moe.rope.dimension_sections", GGUF_I32, secs, 4);
	G.set_arr_data(x, "t.bools", GGUF_BOOL, bools, 3);
	G.set_arr_str(x, "tokenizer.ggml.tokens", toks, 5);
	for (int i = 0; i < NT; i++) {
		void *t = G.new_tensor(ctx, T[i].type, T[i].n_dims, T[i].ne);
		G.set_name(t, T[i].name);
		uint64_t n;
		mcv_error e;
		mcv_gguf_tensor_size(T[i].type, T[i].n_dims, T[i].ne, &n, &e);
		uint8_t *d = G.get_data(t);
		for (uint64_t j = 0; j < n; j++)
			d[j] = (uint8_t)(j * 13 + (uint64_t)i);
		G.add_tensor(x, t);
	}
	CHECK(G.write_to_file(x, path, false), "ggml write");
	G.free(x);
	G.ggml_free(ctx);
	compare(path, "ggml writer -> mcv");
	mcv_gguf *g;
	mcv_error e;
	if (mcv_gguf_open(&g, path, &e) == 0) {
		int64_t v;
		CHECK(mcv_gguf_alignment(g) == 32, "alignment from ggml file");
		CHECK(mcv_gguf_get_i64(g, "t.i64", &v, &e) == 0 && v == INT64_MIN, "i64 from ggml file");
		mcv_gguf_close(g);
	}
}

int main(void)
{
	load();
	char dir[] = "/tmp/test_gguf_peer.XXXXXX", a[64], b[64], c[64];
	if (!mkdtemp(dir))
		return 1;
	snprintf(a, sizeof a, "%s/mcv.gguf", dir);
	snprintf(b, sizeof b, "%s/mcv4k.gguf", dir);
	snprintf(c, sizeof c, "%s/ggml.gguf", dir);
	ours_to_ggml(a, 0);
	ours_to_ggml(b, 4096);
	ggml_to_ours(c);
	unlink(a);
	unlink(b);
	unlink(c);
	rmdir(dir);
	return unit_done("test_gguf_peer");
}

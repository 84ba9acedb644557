/* GGUF reader and writer: round trip of every value type, verbatim copy,
 * writer atomicity and misuse, and hostile input (every truncation, random
 * corruption, hand-crafted malformed files).  -v prints each rejection. */
#include "gguf.h"
#include "quant.h"
#include "unit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int verbose;
static char dir[64];
static long n_hostile;

static void path_in(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", dir, name);
}

static void put_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
		fprintf(stderr, "cannot write %s\n", path);
		exit(1);
	}
}

static uint8_t *get_file(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *p = malloc(sz ? (size_t)sz : 1);
	if (fread(p, 1, (size_t)sz, f) != (size_t)sz) {
		free(p);
		p = NULL;
	}
	fclose(f);
	*n = (size_t)sz;
	return p;
}

/* Files in dir whose name contains s. */
static int count_files(const char *s)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (strstr(e->d_name, s))
			n++;
	if (d)
		closedir(d);
	return n;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* ---- round trip ---- */

#define N_VOCAB 1000

typedef struct tspec {
	const char *name;
	int type, n_dims;
	int64_t ne[4];
} tspec;

static const tspec tensors[] = {
	{ "a.f32", MCV_F32, 1, { 3 } },
	{ "b.f16", MCV_F16, 2, { 5, 2 } },
	{ "blk.0.attn_q.weight", MCV_Q8_0, 2, { 64, 3 } },
	{ "blk.0.ffn_down_exps.weight", MCV_Q4_K, 3, { 256, 2, 3 } },
	{ "empty.q4_0", MCV_Q4_0, 2, { 32, 0 } },
	{ "e.bf16", MCV_BF16, 4, { 4, 1, 3, 2 } },
	{ "q2", MCV_Q2_K, 1, { 256 } },
	{ "q3", MCV_Q3_K, 1, { 512 } },
	{ "q5", MCV_Q5_K, 1, { 256 } },
	{ "q6", MCV_Q6_K, 1, { 256 } },
};
#define N_T ((int)(sizeof tensors / sizeof tensors[0]))

static uint64_t spec_bytes(const tspec *t)
{
	uint64_t n = 0;
	mcv_error e;
	CHECK(mcv_gguf_tensor_size(t->type, t->n_dims, t->ne, &n, &e) == 0, "%s", t->name);
	return n;
}

static uint8_t tbyte(int t, uint64_t i) { return (uint8_t)(i * 131 + (uint64_t)t * 17 + (i >> 8)); }

static const uint8_t a_u8[] = { 0, 1, 255 };
static const int8_t a_i8[] = { -128, 0, 127 };
static const uint16_t a_u16[] = { 0, 65535 };
static const int16_t a_i16[] = { -32768, 5, 32767 };
static const uint32_t a_u32[] = { 7, 4000000000u };
static const int32_t a_i32[] = { 11, 11, 10, 0 };
static const float a_f32[] = { 1.5f, -0.0f, 1e-30f };
static const uint8_t a_bool[] = { 1, 0, 1, 1 };
static const uint64_t a_u64[] = { UINT64_MAX, 0, 42 };
static const int64_t a_i64[] = { INT64_MIN, -1 };
static const double a_f64[] = { 3.25, -1e300 };

static char *vocab[N_VOCAB];

static void make_vocab(void)
{
	/* Unique strings of varied length, one of them empty. */
	for (int i = 0; i < N_VOCAB; i++) {
		vocab[i] = calloc(48, 1);
		if (i == 0)
			continue;
		int k = snprintf(vocab[i], 48, "%d", i);
		for (int j = 0; j < i % 23; j++)
			vocab[i][k + j] = (char)('a' + (i + j) % 26);
	}
}

/* Writes the round-trip file; data written in chunks of odd sizes. */
static int write_full(const char *path, uint32_t align, mcv_error *err)
{
	mcv_gguf_writer *w;
	int rc = mcv_gguf_writer_open(&w, path, err);
	if (rc)
		return rc;
	uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
	int64_t i64 = -(INT64_C(1) << 62); double f64 = 3.25;
	mcv_gguf_w_str(w, "general.architecture", "qwen35moe");
	mcv_gguf_w_scalar(w, "t.u8", GGUF_U8, &u8);
	mcv_gguf_w_scalar(w, "t.i8", GGUF_I8, &i8);
	mcv_gguf_w_scalar(w, "t.u16", GGUF_U16, &u16);
	mcv_gguf_w_scalar(w, "t.i16", GGUF_I16, &i16);
	mcv_gguf_w_u32(w, "t.u32", 4000000000u);
	mcv_gguf_w_i32(w, "t.i32", -2000000000);
	if (align)
		mcv_gguf_writer_set_alignment(w, align);
	mcv_gguf_w_f32(w, "t.f32", 1.5f);
	mcv_gguf_w_bool(w, "t.bool", true);
	mcv_gguf_w_u64(w, "t.u64", (UINT64_C(1) << 63) + 5);
	mcv_gguf_w_scalar(w, "t.i64", GGUF_I64, &i64);
	mcv_gguf_w_scalar(w, "t.f64", GGUF_F64, &f64);
	mcv_gguf_w_str(w, "t.utf8", "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c");
	mcv_gguf_w_str(w, "t.empty", "");
	mcv_gguf_w_arr(w, "a.u8", GGUF_U8, a_u8, 3);
	mcv_gguf_w_arr(w, "a.i8", GGUF_I8, a_i8, 3);
	mcv_gguf_w_arr(w, "a.u16", GGUF_U16, a_u16, 2);
	mcv_gguf_w_arr(w, "a.i16", GGUF_I16, a_i16, 3);
	mcv_gguf_w_arr(w, "a.u32", GGUF_U32, a_u32, 2);
	mcv_gguf_w_arr(w, "qwen35moe.rope.dimension_sections", GGUF_I32, a_i32, 4);
	mcv_gguf_w_arr(w, "a.f32", GGUF_F32, a_f32, 3);
	mcv_gguf_w_arr(w, "a.bool", GGUF_BOOL, a_bool, 4);
	mcv_gguf_w_arr(w, "a.u64", GGUF_U64, a_u64, 3);
	mcv_gguf_w_arr(w, "a.i64", GGUF_I64, a_i64, 2);
	mcv_gguf_w_arr(w, "a.f64", GGUF_F64, a_f64, 2);
	mcv_gguf_w_arr(w, "a.empty", GGUF_U32, NULL, 0);
	mcv_gguf_w_arr_str(w, "a.strempty", NULL, 0);
	mcv_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)vocab, N_VOCAB);
	for (int i = 0; i < N_T; i++)
		mcv_gguf_w_add_tensor(w, tensors[i].name, tensors[i].type, tensors[i].n_dims, tensors[i].ne);
	mcv_gguf_w_begin_data(w);
	uint8_t chunk[4096];
	for (int i = 0; i < N_T; i++) {
		uint64_t n = spec_bytes(&tensors[i]), done = 0;
		size_t step = 1;
		while (done < n) {
			size_t k = n - done < step ? (size_t)(n - done) : step;
			for (size_t j = 0; j < k; j++)
				chunk[j] = tbyte(i, done + j);
			mcv_gguf_w_write(w, chunk, k);
			done += k;
			step = step * 3 + 4 > sizeof chunk ? sizeof chunk : step * 3 + 4;
		}
		mcv_gguf_w_end_tensor(w);
	}
	return mcv_gguf_writer_finish(w, err);
}

static void check_full(const char *path, uint32_t align)
{
	mcv_gguf *g;
	mcv_error e = { 0 };
	int rc = mcv_gguf_open(&g, path, &e);
	CHECK(rc == 0, "open: %s", e.msg);
	if (rc)
		return;
	uint32_t al = align ? align : 32;
	CHECK(mcv_gguf_version(g) == 3, "version %u", mcv_gguf_version(g));
	CHECK(mcv_gguf_alignment(g) == al, "alignment %u", mcv_gguf_alignment(g));
	CHECK(strcmp(mcv_gguf_path(g), path) == 0, "path");
	CHECK(mcv_gguf_fd(g) >= 0, "fd");
	static const char *const order[] = {
		"general.architecture", "t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32",
		"general.alignment", "t.f32", "t.bool", "t.u64", "t.i64", "t.f64", "t.utf8",
		"t.empty", "a.u8", "a.i8", "a.u16", "a.i16", "a.u32",
		"qwen35moe.rope.dimension_sections", "a.f32", "a.bool", "a.u64", "a.i64",
		"a.f64", "a.empty", "a.strempty", "tokenizer.ggml.tokens",
	};
	int64_t nk = 0;
	for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
		if (!align && strcmp(order[i], "general.alignment") == 0)
			continue;
		const char *k = mcv_gguf_key(g, nk);
		CHECK(k && strcmp(k, order[i]) == 0, "key %" PRId64 " is %s, want %s", nk, k ? k : "NULL", order[i]);
		CHECK(mcv_gguf_find_key(g, order[i]) == nk, "find_key %s", order[i]);
		nk++;
	}
	CHECK(mcv_gguf_n_kv(g) == nk, "n_kv %" PRId64 " want %" PRId64, mcv_gguf_n_kv(g), nk);
	CHECK(mcv_gguf_find_key(g, "nope") == -1, "absent key");
	CHECK(mcv_gguf_key(g, nk) == NULL && mcv_gguf_key(g, -1) == NULL, "key out of range");
	CHECK(mcv_gguf_kv_type(g, mcv_gguf_find_key(g, "t.i16")) == GGUF_I16, "kv type");
	CHECK(mcv_gguf_kv_type(g, mcv_gguf_find_key(g, "t.f64")) == GGUF_F64, "kv type");

	const char *s;
	uint32_t u;
	int64_t i64;
	float f;
	bool b;
	CHECK(mcv_gguf_get_str(g, "general.architecture", &s, &e) == 0 && strcmp(s, "qwen35moe") == 0, "arch");
	CHECK(mcv_gguf_get_str(g, "t.utf8", &s, &e) == 0 && strcmp(s, "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c") == 0, "utf8");
	CHECK(mcv_gguf_get_str(g, "t.empty", &s, &e) == 0 && *s == 0, "empty string");
	CHECK(mcv_gguf_get_u32(g, "t.u8", &u, &e) == 0 && u == 200, "u8 as u32");
	CHECK(mcv_gguf_get_u32(g, "t.u16", &u, &e) == 0 && u == 60000, "u16 as u32");
	CHECK(mcv_gguf_get_u32(g, "t.u32", &u, &e) == 0 && u == 4000000000u, "u32");
	CHECK(mcv_gguf_get_u32(g, "t.i8", &u, &e) == MCV_EFORMAT && strstr(e.msg, "fit"), "negative as u32: %s", e.msg);
	CHECK(mcv_gguf_get_u32(g, "t.u64", &u, &e) == MCV_EFORMAT, "big u64 as u32");
	CHECK(mcv_gguf_get_u32(g, "t.f32", &u, &e) == MCV_EFORMAT && strstr(e.msg, "f32"), "f32 as u32: %s", e.msg);
	CHECK(mcv_gguf_get_u32(g, "missing", &u, &e) == MCV_ENOTFOUND && strstr(e.msg, "missing"), "missing: %s", e.msg);
	CHECK(mcv_gguf_get_i64(g, "t.i8", &i64, &e) == 0 && i64 == -100, "i8");
	CHECK(mcv_gguf_get_i64(g, "t.i16", &i64, &e) == 0 && i64 == -30000, "i16");
	CHECK(mcv_gguf_get_i64(g, "t.i32", &i64, &e) == 0 && i64 == -2000000000, "i32");
	CHECK(mcv_gguf_get_i64(g, "t.i64", &i64, &e) == 0 && i64 == -(INT64_C(1) << 62), "i64");
	CHECK(mcv_gguf_get_i64(g, "t.u32", &i64, &e) == 0 && i64 == 4000000000, "u32 as i64");
	CHECK(mcv_gguf_get_i64(g, "t.u64", &i64, &e) == MCV_EFORMAT, "u64 > INT64_MAX as i64");
	CHECK(mcv_gguf_get_f32(g, "t.f32", &f, &e) == 0 && f == 1.5f, "f32");
	CHECK(mcv_gguf_get_f32(g, "t.f64", &f, &e) == 0 && f == 3.25f, "f64 as f32");
	CHECK(mcv_gguf_get_f32(g, "t.u8", &f, &e) == MCV_EFORMAT, "u8 as f32");
	CHECK(mcv_gguf_get_bool(g, "t.bool", &b, &e) == 0 && b, "bool");
	CHECK(mcv_gguf_get_bool(g, "t.u8", &b, &e) == MCV_EFORMAT, "u8 as bool");
	CHECK(mcv_gguf_get_str(g, "t.u32", &s, &e) == MCV_EFORMAT && strstr(e.msg, "string"), "u32 as str: %s", e.msg);
	if (align)
		CHECK(mcv_gguf_get_u32(g, "general.alignment", &u, &e) == 0 && u == align, "alignment key");

	struct { const char *k; int t; const void *p; uint64_t n; size_t sz; } arrs[] = {
		{ "a.u8", GGUF_U8, a_u8, 3, 1 }, { "a.i8", GGUF_I8, a_i8, 3, 1 },
		{ "a.u16", GGUF_U16, a_u16, 2, 2 }, { "a.i16", GGUF_I16, a_i16, 3, 2 },
		{ "a.u32", GGUF_U32, a_u32, 2, 4 },
		{ "qwen35moe.rope.dimension_sections", GGUF_I32, a_i32, 4, 4 },
		{ "a.f32", GGUF_F32, a_f32, 3, 4 }, { "a.bool", GGUF_BOOL, a_bool, 4, 1 },
		{ "a.u64", GGUF_U64, a_u64, 3, 8 }, { "a.i64", GGUF_I64, a_i64, 2, 8 },
		{ "a.f64", GGUF_F64, a_f64, 2, 8 }, { "a.empty", GGUF_U32, NULL, 0, 4 },
	};
	for (size_t i = 0; i < sizeof arrs / sizeof *arrs; i++) {
		int et = -1;
		uint64_t n = 99;
		const void *d = NULL;
		rc = mcv_gguf_get_arr(g, arrs[i].k, &et, &n, &d, &e);
		CHECK(rc == 0 && et == arrs[i].t && n == arrs[i].n, "array %s: rc %d type %d n %" PRIu64,
		      arrs[i].k, rc, et, n);
		if (rc == 0 && n) {
			CHECK(((uintptr_t)d % arrs[i].sz) == 0, "array %s not aligned", arrs[i].k);
			CHECK(memcmp(d, arrs[i].p, n * arrs[i].sz) == 0, "array %s content", arrs[i].k);
		}
		int et2;
		uint64_t n2;
		CHECK(mcv_gguf_kv_arr_info(g, mcv_gguf_find_key(g, arrs[i].k), &et2, &n2) == 0 &&
		      et2 == arrs[i].t && n2 == arrs[i].n, "arr_info %s", arrs[i].k);
	}
	CHECK(mcv_gguf_get_arr(g, "t.u8", &(int){ 0 }, &(uint64_t){ 0 }, &(const void *){ 0 }, &e) == MCV_EFORMAT,
	      "scalar as array");
	int et;
	uint64_t n;
	const void *d;
	CHECK(mcv_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &d, &e) == 0 && et == GGUF_STRING &&
	      n == N_VOCAB, "tokens array");
	int bad = 0;
	for (uint64_t i = 0; i < N_VOCAB; i++) {
		size_t len = 0;
		const char *v = mcv_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &len);
		if (!v || len != strlen(vocab[i]) || strcmp(v, vocab[i]) != 0)
			bad++;
	}
	CHECK(bad == 0, "%d vocab strings differ", bad);
	CHECK(mcv_gguf_arr_str(g, "tokenizer.ggml.tokens", N_VOCAB, NULL) == NULL, "vocab past end");
	CHECK(mcv_gguf_arr_str(g, "a.u8", 0, NULL) == NULL, "arr_str on numeric array");
	CHECK(mcv_gguf_get_arr(g, "a.strempty", &et, &n, &d, &e) == 0 && et == GGUF_STRING && n == 0, "empty str arr");
	CHECK(mcv_gguf_arr_str(g, "a.strempty", 0, NULL) == NULL, "empty str arr element");

	CHECK(mcv_gguf_n_tensors(g) == N_T, "n_tensors %" PRId64, mcv_gguf_n_tensors(g));
	CHECK(mcv_gguf_data_offset(g) % al == 0, "data offset %" PRIu64 " not aligned", mcv_gguf_data_offset(g));
	uint64_t off = 0;
	const uint8_t *base = NULL;
	for (int i = 0; i < N_T && i < mcv_gguf_n_tensors(g); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		const tspec *sp = &tensors[i];
		CHECK(strcmp(t->name, sp->name) == 0, "tensor %d name %s", i, t->name);
		CHECK(mcv_gguf_find_tensor(g, sp->name) == t, "find %s", sp->name);
		CHECK(t->type == sp->type && t->n_dims == sp->n_dims, "%s type/dims", sp->name);
		for (int j = 0; j < 4; j++)
			CHECK(t->ne[j] == (j < sp->n_dims ? sp->ne[j] : 1), "%s ne[%d] = %" PRId64, sp->name, j, t->ne[j]);
		uint64_t nb = spec_bytes(sp);
		CHECK(t->nbytes == nb, "%s nbytes %" PRIu64 " want %" PRIu64, sp->name, t->nbytes, nb);
		CHECK(t->offset == off, "%s offset %" PRIu64 " want %" PRIu64, sp->name, t->offset, off);
		CHECK(t->file_offset == mcv_gguf_data_offset(g) + off, "%s file offset", sp->name);
		if (i == 0)
			base = (const uint8_t *)t->data - t->file_offset;
		CHECK((const uint8_t *)t->data == base + t->file_offset, "%s data pointer", sp->name);
		int diff = 0;
		for (uint64_t j = 0; j < nb; j++)
			diff += ((const uint8_t *)t->data)[j] != tbyte(i, j);
		CHECK(diff == 0, "%s: %d data bytes differ", sp->name, diff);
		off += (nb + al - 1) / al * al;
	}
	CHECK(mcv_gguf_file_size(g) == mcv_gguf_data_offset(g) + off, "file size %" PRIu64 " want %" PRIu64,
	      mcv_gguf_file_size(g), mcv_gguf_data_offset(g) + off);
	CHECK(mcv_gguf_find_tensor(g, "missing") == NULL && mcv_gguf_tensor_at(g, N_T) == NULL, "missing tensor");
	mcv_gguf_close(g);
}

static void test_roundtrip(void)
{
	char p[128];
	mcv_error e = { 0 };
	path_in(p, sizeof p, "full.gguf");
	CHECK(write_full(p, 0, &e) == 0, "write: %s", e.msg);
	check_full(p, 0);
	path_in(p, sizeof p, "full64.gguf");
	CHECK(write_full(p, 64, &e) == 0, "write: %s", e.msg);
	check_full(p, 64);
	path_in(p, sizeof p, "full4k.gguf");
	CHECK(write_full(p, 4096, &e) == 0, "write: %s", e.msg);
	check_full(p, 4096);

	/* Verbatim copy through the writer gives the same bytes. */
	char q[128];
	path_in(p, sizeof p, "full64.gguf");
	path_in(q, sizeof q, "copy.gguf");
	mcv_gguf *g;
	mcv_gguf_writer *w;
	int rc = mcv_gguf_open(&g, p, &e);
	CHECK(rc == 0, "%s", e.msg);
	if (rc)
		return;
	CHECK(mcv_gguf_writer_open(&w, q, &e) == 0, "%s", e.msg);
	for (int64_t i = 0; i < mcv_gguf_n_kv(g); i++)
		mcv_gguf_w_copy_kv(w, g, i);
	for (int64_t i = 0; i < mcv_gguf_n_tensors(g); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		mcv_gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
	}
	mcv_gguf_w_begin_data(w);
	for (int64_t i = 0; i < mcv_gguf_n_tensors(g); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		mcv_gguf_w_write(w, t->data, t->nbytes);
		mcv_gguf_w_end_tensor(w);
	}
	CHECK(mcv_gguf_writer_error(w) == NULL, "copy writer error");
	CHECK(mcv_gguf_writer_finish(w, &e) == 0, "copy: %s", e.msg);
	mcv_gguf_close(g);
	size_t na, nb;
	uint8_t *a = get_file(p, &na), *b = get_file(q, &nb);
	CHECK(a && b && na == nb && memcmp(a, b, na) == 0, "copy differs (%zu vs %zu bytes)", na, nb);
	free(a);
	free(b);

	/* "-" streams to stdout. */
	path_in(p, sizeof p, "stdout.gguf");
	fflush(stdout);
	int saved = dup(1), fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	dup2(fd, 1);
	close(fd);
	rc = write_full("-", 64, &e);
	dup2(saved, 1);
	close(saved);
	CHECK(rc == 0, "stdout: %s", e.msg);
	check_full(p, 64);
	CHECK(count_files(".tmp.") == 0, "temporaries left");
}

/* ---- writer atomicity and misuse ---- */

static void test_writer(void)
{
	char p[128];
	mcv_error e = { 0 };
	size_t n;
	path_in(p, sizeof p, "atomic.gguf");
	put_file(p, "old content", 11);

	mcv_gguf_writer *w;
	CHECK(mcv_gguf_writer_open(&w, p, &e) == 0, "%s", e.msg);
	CHECK(count_files("atomic.gguf.tmp.") == 1, "no temporary while writing");
	mcv_gguf_w_u32(w, "k", 1);
	int64_t ne[1] = { 32 };
	mcv_gguf_w_add_tensor(w, "t", MCV_F32, 1, ne);
	mcv_gguf_w_begin_data(w);
	float x[32] = { 0 };
	mcv_gguf_w_write(w, x, sizeof x);
	mcv_gguf_w_end_tensor(w);
	uint8_t *c = get_file(p, &n);
	CHECK(c && n == 11 && memcmp(c, "old content", 11) == 0, "target touched before finish");
	free(c);
	mcv_gguf_writer_abort(w);
	c = get_file(p, &n);
	CHECK(c && n == 11 && memcmp(c, "old content", 11) == 0, "abort changed the target");
	free(c);
	CHECK(count_files(".tmp.") == 0, "abort left a temporary");

	/* A short tensor: finish fails, target intact, no temporary. */
	CHECK(mcv_gguf_writer_open(&w, p, &e) == 0, "%s", e.msg);
	mcv_gguf_w_add_tensor(w, "t", MCV_F32, 1, ne);
	mcv_gguf_w_begin_data(w);
	mcv_gguf_w_write(w, x, 100);
	CHECK(mcv_gguf_w_end_tensor(w) == MCV_EINVAL, "short tensor accepted");
	CHECK(mcv_gguf_writer_error(w) && strstr(mcv_gguf_writer_error(w)->msg, "100 bytes"), "sticky message: %s",
	      mcv_gguf_writer_error(w) ? mcv_gguf_writer_error(w)->msg : "none");
	CHECK(mcv_gguf_w_u32(w, "later", 1) == MCV_EINVAL, "error not sticky");
	CHECK(mcv_gguf_writer_finish(w, &e) == MCV_EINVAL && strstr(e.msg, "100 bytes"), "finish: %s", e.msg);
	if (verbose)
		fprintf(stderr, "  writer: %s\n", e.msg);
	c = get_file(p, &n);
	CHECK(c && n == 11, "failed finish changed the target");
	free(c);
	CHECK(count_files(".tmp.") == 0, "failed finish left a temporary");

	/* Success replaces the target. */
	CHECK(mcv_gguf_writer_open(&w, p, &e) == 0, "%s", e.msg);
	mcv_gguf_w_u32(w, "k", 1);
	CHECK(mcv_gguf_writer_finish(w, &e) == 0, "finish: %s", e.msg);
	CHECK(count_files(".tmp.") == 0, "finish left a temporary");
	mcv_gguf *g;
	CHECK(mcv_gguf_open(&g, p, &e) == 0, "reopen: %s", e.msg);
	if (g) {
		CHECK(mcv_gguf_n_kv(g) == 1 && mcv_gguf_n_tensors(g) == 0, "replaced content");
		mcv_gguf_close(g);
	}
	struct stat st;
	CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == (0666 & ~(unsigned)umask(022)), "mode %o", st.st_mode & 0777);

	CHECK(mcv_gguf_writer_open(&w, "/nonexistent-dir/x.gguf", &e) == MCV_EIO && strstr(e.msg, "No such file"),
	      "bad dir: %s", e.msg);
	CHECK(mcv_gguf_writer_open(&w, dir, &e) == MCV_EIO && strstr(e.msg, "directory"), "onto a dir: %s", e.msg);

	/* Misuse: each gives an error, finish reports it and cleans up. */
	struct { const char *what, *word; int code; } cases[] = {
		{ "dup key", "duplicate", MCV_EINVAL }, { "alignment 3", "alignment", MCV_EINVAL },
		{ "alignment 0", "alignment", MCV_EINVAL }, { "alignment 2^31", "alignment", MCV_EINVAL },
		{ "long name", "longer", MCV_EINVAL }, { "dup tensor", "duplicate", MCV_EINVAL },
		{ "bad type", "type", MCV_EINVAL }, { "iq type", "supported", MCV_EUNSUPPORTED },
		{ "block", "block", MCV_EINVAL }, { "5 dims", "dimensions", MCV_EINVAL },
		{ "overrun", "more than", MCV_EINVAL }, { "unwritten", "of 2 tensors", MCV_EINVAL },
		{ "kv after data", "after", MCV_EINVAL }, { "write before begin", "before", MCV_EINVAL },
		{ "empty key", "empty", MCV_EINVAL }, { "negative", "negative", MCV_EINVAL },
	};
	char longname[80];
	memset(longname, 'x', 64);
	longname[64] = 0;
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		CHECK(mcv_gguf_writer_open(&w, p, &e) == 0, "%s", e.msg);
		const char *k = cases[i].what;
		int64_t sh[4] = { 32, 2, 1, 1 };
		mcv_gguf_w_u32(w, "k", 1);
		if (!strcmp(k, "dup key")) mcv_gguf_w_str(w, "k", "again");
		if (!strcmp(k, "alignment 3")) mcv_gguf_writer_set_alignment(w, 3);
		if (!strcmp(k, "alignment 0")) mcv_gguf_writer_set_alignment(w, 0);
		if (!strcmp(k, "alignment 2^31")) mcv_gguf_writer_set_alignment(w, 1u << 31);
		if (!strcmp(k, "long name")) mcv_gguf_w_add_tensor(w, longname, MCV_F32, 1, sh);
		if (!strcmp(k, "dup tensor")) { mcv_gguf_w_add_tensor(w, "t", MCV_F32, 1, sh); mcv_gguf_w_add_tensor(w, "t", MCV_F32, 1, sh); }
		if (!strcmp(k, "bad type")) mcv_gguf_w_add_tensor(w, "t", 99, 1, sh);
		if (!strcmp(k, "iq type")) mcv_gguf_w_add_tensor(w, "t", 23, 1, sh);
		if (!strcmp(k, "block")) { sh[0] = 33; mcv_gguf_w_add_tensor(w, "t", MCV_Q8_0, 2, sh); }
		if (!strcmp(k, "5 dims")) mcv_gguf_w_add_tensor(w, "t", MCV_F32, 5, sh);
		if (!strcmp(k, "negative")) { sh[1] = -2; mcv_gguf_w_add_tensor(w, "t", MCV_F32, 2, sh); }
		if (!strcmp(k, "overrun")) {
			mcv_gguf_w_add_tensor(w, "t", MCV_F32, 1, sh);
			mcv_gguf_w_begin_data(w);
			mcv_gguf_w_write(w, x, 100);
			mcv_gguf_w_write(w, x, 100);
		}
		if (!strcmp(k, "unwritten")) {
			mcv_gguf_w_add_tensor(w, "t", MCV_F32, 1, sh);
			mcv_gguf_w_add_tensor(w, "u", MCV_F32, 1, sh);
			mcv_gguf_w_begin_data(w);
			mcv_gguf_w_write(w, x, 128);
			mcv_gguf_w_end_tensor(w);
		}
		if (!strcmp(k, "kv after data")) { mcv_gguf_w_begin_data(w); mcv_gguf_w_u32(w, "z", 1); }
		if (!strcmp(k, "write before begin")) mcv_gguf_w_write(w, x, 4);
		if (!strcmp(k, "empty key")) mcv_gguf_w_u32(w, "", 1);
		int rc = mcv_gguf_writer_finish(w, &e);
		CHECK(rc == cases[i].code && strstr(e.msg, cases[i].word), "writer %s: rc %d: %s", k, rc, e.msg);
		CHECK(count_files(".tmp.") == 0, "writer %s left a temporary", k);
		if (verbose)
			fprintf(stderr, "  writer %-18s %s\n", k, e.msg);
	}
	c = get_file(p, &n);
	CHECK(c && mcv_gguf_open(&g, p, &e) == 0, "target damaged by failed writers");
	if (c && g)
		mcv_gguf_close(g);
	free(c);
}

/* ---- hostile input ---- */

/* A small valid file whose last tensor ends exactly at the end of the file,
 * so that every proper prefix is invalid. */
static uint8_t *small_file(size_t *n)
{
	char p[128];
	mcv_error e;
	path_in(p, sizeof p, "small.gguf");
	mcv_gguf_writer *w;
	if (mcv_gguf_writer_open(&w, p, &e))
		return NULL;
	const char *toks[] = { "a", "", "<|im_start|>", "\xc4\xa0the" };
	int32_t secs[4] = { 11, 11, 10, 0 };
	mcv_gguf_w_str(w, "general.architecture", "qwen35moe");
	mcv_gguf_w_u32(w, "qwen35moe.block_count", 4);
	mcv_gguf_w_f32(w, "qwen35moe.attention.layer_norm_rms_epsilon", 1e-6f);
	mcv_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
	mcv_gguf_w_arr(w, "qwen35moe.rope.dimension_sections", GGUF_I32, secs, 4);
	mcv_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	int64_t a[2] = { 32, 2 }, b[1] = { 5 }, c[1] = { 8 };
	mcv_gguf_w_add_tensor(w, "token_embd.weight", MCV_Q8_0, 2, a);
	mcv_gguf_w_add_tensor(w, "blk.0.ssm_a", MCV_F16, 1, b);
	mcv_gguf_w_add_tensor(w, "output_norm.weight", MCV_F32, 1, c);
	mcv_gguf_w_begin_data(w);
	uint8_t d[68];
	for (int i = 0; i < 68; i++)
		d[i] = (uint8_t)(i * 7);
	mcv_gguf_w_write(w, d, 68); mcv_gguf_w_end_tensor(w);
	mcv_gguf_w_write(w, d, 10); mcv_gguf_w_end_tensor(w);
	mcv_gguf_w_write(w, d, 32); mcv_gguf_w_end_tensor(w);
	if (mcv_gguf_writer_finish(w, &e))
		return NULL;
	return get_file(p, n);
}

/* Touch everything an accepted file offers; ASan and the checks catch lies. */
static void walk(mcv_gguf *g)
{
	mcv_error e;
	volatile unsigned sink = 0;
	for (int64_t i = 0; i < mcv_gguf_n_kv(g); i++) {
		const char *k = mcv_gguf_key(g, i);
		sink += (unsigned)strlen(k);
		CHECK(mcv_gguf_find_key(g, k) == i, "find_key of a parsed key");
		uint32_t u; int64_t v; float f; bool b; const char *s;
		mcv_gguf_get_u32(g, k, &u, &e);
		mcv_gguf_get_i64(g, k, &v, &e);
		mcv_gguf_get_f32(g, k, &f, &e);
		mcv_gguf_get_bool(g, k, &b, &e);
		if (mcv_gguf_get_str(g, k, &s, &e) == 0)
			sink += (unsigned)strlen(s);
		int et;
		uint64_t n;
		const void *d;
		if (mcv_gguf_get_arr(g, k, &et, &n, &d, &e) == 0) {
			if (et == GGUF_STRING) {
				for (uint64_t j = 0; j < n; j++) {
					size_t len;
					const char *x = mcv_gguf_arr_str(g, k, j, &len);
					CHECK(x && strnlen(x, len + 1) <= len, "string element");
					if (x && len)
						sink += (unsigned char)x[len - 1];
				}
			} else if (n) {
				const uint8_t *x = d;
				sink += x[0] + x[n - 1];
			}
		}
		const void *raw;
		size_t rn;
		if (mcv_gguf_kv_raw(g, i, &raw, &rn) == 0 && rn)
			sink += ((const uint8_t *)raw)[rn - 1];
	}
	uint64_t size = mcv_gguf_file_size(g), al = mcv_gguf_alignment(g);
	for (int64_t i = 0; i < mcv_gguf_n_tensors(g); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		CHECK(mcv_gguf_find_tensor(g, t->name) == t, "find_tensor of a parsed tensor");
		CHECK(strlen(t->name) < MCV_GGUF_MAX_NAME, "name length");
		CHECK(t->file_offset <= size && t->nbytes <= size - t->file_offset, "tensor past the end accepted");
		CHECK(t->file_offset % al == 0, "misaligned tensor accepted");
		CHECK(mcv_row_bytes(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]) == t->nbytes ||
		      t->ne[0] == 0, "nbytes");
		if (t->nbytes)
			sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
	}
	(void)sink;
}

static void test_truncation(const uint8_t *f, size_t n)
{
	char p[128];
	path_in(p, sizeof p, "trunc.gguf");
	put_file(p, f, n);
	int fd = open(p, O_WRONLY);
	int failed = 0, worst = 0;
	mcv_error e;
	for (size_t len = n; len-- > 0;) {
		if (ftruncate(fd, (off_t)len) != 0)
			break;
		mcv_gguf *g = NULL;
		int rc = mcv_gguf_open(&g, p, &e);
		n_hostile++;
		if (rc == 0) {
			failed++;
			mcv_gguf_close(g);
			continue;
		}
		if (rc != MCV_EFORMAT || !strchr(e.msg, ':') || strchr(e.msg, '\n'))
			worst++;
		if (verbose && (len % 97 == 0 || len < 30))
			fprintf(stderr, "  truncated to %zu: %s\n", len, e.msg);
	}
	close(fd);
	CHECK(failed == 0, "%d truncated files were accepted", failed);
	CHECK(worst == 0, "%d truncations gave a wrong code or message", worst);
}

static void test_fuzz(const uint8_t *f, size_t n, int iters)
{
	char p[128];
	path_in(p, sizeof p, "fuzz.gguf");
	put_file(p, f, n);
	int fd = open(p, O_WRONLY);
	uint8_t *m = malloc(n);
	int ok = 0, bad = 0;
	mcv_error e;
	static const uint8_t special[] = { 0, 0xff, 0x7f, 0x80, 1, 0x40 };
	for (int it = 0; it < iters; it++) {
		memcpy(m, f, n);
		int kind = (int)(rnd() % 4), cnt = 1 + (int)(rnd() % 4);
		for (int j = 0; j < cnt; j++) {
			size_t at = (size_t)(rnd() % n);
			if (kind == 0)
				m[at] ^= (uint8_t)(1u << (rnd() % 8));
			else if (kind == 1)
				m[at] = (uint8_t)rnd();
			else if (kind == 2)
				m[at] = special[rnd() % sizeof special];
			else {
				uint64_t v = rnd();
				v >>= rnd() % 64; /* one call per statement: a fixed sequence */
				size_t k = n - at < 8 ? n - at : 8;
				memcpy(m + at, &v, k);
			}
		}
		if (pwrite(fd, m, n, 0) != (ssize_t)n)
			break;
		mcv_gguf *g = NULL;
		int rc = mcv_gguf_open(&g, p, &e);
		n_hostile++;
		if (rc == 0) {
			ok++;
			walk(g);
			mcv_gguf_close(g);
		} else if (rc >= 0 || strchr(e.msg, '\n') || !strchr(e.msg, ':')) {
			bad++;
			fprintf(stderr, "  fuzz %d: code %d: %s\n", it, rc, e.msg);
		}
	}
	close(fd);
	free(m);
	CHECK(bad == 0, "%d corrupt files gave a bad error", bad);
	if (verbose)
		fprintf(stderr, "  fuzz: %d iterations, %d accepted, %d rejected\n", iters, ok, iters - ok);
}

/* Byte builder for hand-crafted files. */
typedef struct bb { uint8_t p[4096]; size_t n; } bb;
static void bput(bb *b, const void *p, size_t n) { memcpy(b->p + b->n, p, n); b->n += n; }
static void b32(bb *b, uint32_t v) { bput(b, &v, 4); }
static void b64(bb *b, uint64_t v) { bput(b, &v, 8); }
static void bstr(bb *b, const char *s) { b64(b, strlen(s)); bput(b, s, strlen(s)); }
static void bhdr(bb *b, uint32_t ver, uint64_t nt, uint64_t nkv) { b->n = 0; bput(b, "GGUF", 4); b32(b, ver); b64(b, nt); b64(b, nkv); }
static void bkv_u32(bb *b, const char *k, uint32_t v) { bstr(b, k); b32(b, GGUF_U32); b32(b, v); }
static void bkv_str(bb *b, const char *k, const char *v) { bstr(b, k); b32(b, GGUF_STRING); bstr(b, v); }
static void bti(bb *b, const char *name, uint32_t nd, const int64_t *ne, uint32_t type, uint64_t off)
{
	bstr(b, name);
	b32(b, nd);
	for (uint32_t j = 0; j < nd; j++)
		b64(b, (uint64_t)ne[j]);
	b32(b, type);
	b64(b, off);
}
static void bpad(bb *b, size_t al) { while (b->n % al) b->p[b->n++] = 0; }
static void bdata(bb *b, size_t n) { for (size_t i = 0; i < n; i++) b->p[b->n++] = (uint8_t)i; }

/* The file is b, extended with zeros (a hole) to size when size > 0. */
static void expect_sized(const char *name, const bb *b, size_t size, int code, const char *word)
{
	char p[128];
	path_in(p, sizeof p, "crafted.gguf");
	put_file(p, b->p, b->n);
	if (size && truncate(p, (off_t)size) != 0)
		CHECK(0, "%s: cannot extend the file", name);
	mcv_gguf *g = NULL;
	mcv_error e = { 0 };
	int rc = mcv_gguf_open(&g, p, &e);
	n_hostile += code != 0;
	if (rc == 0) {
		walk(g);
		mcv_gguf_close(g);
	}
	CHECK(rc == code, "%s: code %d (%s), want %d: %s", name, rc, mcv_strerror(rc), code, rc ? e.msg : "");
	if (code) {
		CHECK(strstr(e.msg, word) != NULL, "%s: message lacks '%s': %s", name, word, e.msg);
		CHECK(strncmp(e.msg, p, strlen(p)) == 0 && !strchr(e.msg, '\n'), "%s: message form: %s", name, e.msg);
		if (verbose)
			fprintf(stderr, "  %-24s %s\n", name, e.msg + strlen(p) + 2);
	}
}

static void expect(const char *name, const bb *b, int code, const char *word)
{
	expect_sized(name, b, 0, code, word);
}

static void test_crafted(void)
{
	bb *b = calloc(1, sizeof *b);
	int64_t ne1[1] = { 32 }, ne2[2] = { 32, 2 };

	/* The builder itself produces valid files. */
	bhdr(b, 3, 2, 2); bkv_u32(b, "general.alignment", 64); bkv_str(b, "general.name", "x");
	bti(b, "a", 1, ne1, MCV_F32, 0); bti(b, "b", 2, ne2, MCV_Q8_0, 128);
	bpad(b, 64); bdata(b, 128 + 68);
	expect("valid", b, 0, NULL);
	b->p[4] = 2;
	expect("version 2", b, 0, NULL);
	bhdr(b, 3, 0, 0);
	expect("no tensors, no keys", b, 0, NULL);

	b->n = 0; expect("empty file", b, MCV_EFORMAT, "empty");
	bhdr(b, 3, 0, 0); b->n = 10; expect("short header", b, MCV_EFORMAT, "short");
	bhdr(b, 3, 0, 0); memcpy(b->p, "GGUX", 4); expect("bad magic", b, MCV_EFORMAT, "magic");
	bhdr(b, 1, 0, 0); expect("version 1", b, MCV_EUNSUPPORTED, "version 1");
	bhdr(b, 4, 0, 0); expect("version 4", b, MCV_EUNSUPPORTED, "version 4");
	bhdr(b, 0x03000000, 0, 0); expect("big-endian", b, MCV_EUNSUPPORTED, "big-endian");
	bhdr(b, 3, UINT64_C(1) << 62, 0); expect("n_tensors 2^62", b, MCV_EFORMAT, "n_tensors");
	bhdr(b, 3, UINT64_MAX, 0); expect("n_tensors 2^64-1", b, MCV_EFORMAT, "n_tensors");
	bhdr(b, 3, 0, UINT64_C(1) << 60); expect("n_kv 2^60", b, MCV_EFORMAT, "n_kv");
	bhdr(b, 3, 0, 3); bkv_u32(b, "a", 1); expect("n_kv 3 of 1", b, MCV_EFORMAT, "n_kv");
	/* Counts that would fit in a large (sparse) file still have a bound. */
	bhdr(b, 3, 1u << 21, 0);
	expect_sized("n_tensors 2^21", b, 100u << 20, MCV_EFORMAT, "limit");
	bhdr(b, 3, 0, 1u << 21);
	expect_sized("n_kv 2^21", b, 100u << 20, MCV_EFORMAT, "limit");

	bhdr(b, 3, 0, 1); b64(b, UINT64_C(1) << 63); bput(b, "key", 3); b32(b, GGUF_U32); b32(b, 0);
	expect("key length 2^63", b, MCV_EFORMAT, "length");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_STRING); b64(b, UINT64_C(1) << 63); bput(b, "abcd", 4);
	expect("string length 2^63", b, MCV_EFORMAT, "length");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_STRING); b64(b, 100); bput(b, "abcd", 4);
	expect("string past EOF", b, MCV_EFORMAT, "end of file");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_ARRAY); b32(b, GGUF_U32); b64(b, UINT64_C(1) << 61); b32(b, 0);
	expect("array count 2^61", b, MCV_EFORMAT, "array count");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_ARRAY); b32(b, GGUF_STRING); b64(b, UINT64_MAX); b32(b, 0);
	expect("string array count", b, MCV_EFORMAT, "array count");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_ARRAY); b32(b, GGUF_STRING); b64(b, 2); bstr(b, "x"); b64(b, 1u << 20);
	expect("string array element", b, MCV_EFORMAT, "element 1");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_ARRAY); b32(b, GGUF_ARRAY); b64(b, 1); b32(b, GGUF_U8); b64(b, 0);
	expect("nested array", b, MCV_EFORMAT, "nested");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, 13); b32(b, 0);
	expect("value type 13", b, MCV_EFORMAT, "value type");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_ARRAY); b32(b, 99); b64(b, 0);
	expect("element type 99", b, MCV_EFORMAT, "element type");
	bhdr(b, 3, 0, 1); bstr(b, "k"); b32(b, GGUF_BOOL); b->p[b->n++] = 2;
	expect("bool 2", b, MCV_EFORMAT, "bool");
	bhdr(b, 3, 0, 1); bstr(b, ""); b32(b, GGUF_U32); b32(b, 0);
	expect("empty key", b, MCV_EFORMAT, "empty");
	bhdr(b, 3, 0, 1); b64(b, 3); bput(b, "a\0b", 3); b32(b, GGUF_U32); b32(b, 0);
	expect("NUL in key", b, MCV_EFORMAT, "NUL");
	bhdr(b, 3, 0, 2); bkv_u32(b, "general.x", 1); bkv_str(b, "general.x", "y");
	expect("duplicate key", b, MCV_EFORMAT, "duplicate key");
	static const uint32_t bad_al[] = { 0, 3, 1u << 31, 48 };
	for (size_t i = 0; i < sizeof bad_al / sizeof *bad_al; i++) {
		char nm[40];
		snprintf(nm, sizeof nm, "alignment %u", bad_al[i]);
		bhdr(b, 3, 1, 1); bkv_u32(b, "general.alignment", bad_al[i]); bti(b, "a", 1, ne1, MCV_F32, 0);
		bpad(b, 32); bdata(b, 128);
		expect(nm, b, MCV_EFORMAT, "alignment");
	}
	bhdr(b, 3, 0, 1); bstr(b, "general.alignment"); b32(b, GGUF_U64); b64(b, 32);
	expect("alignment as u64", b, MCV_EFORMAT, "must be u32");

	/* Tensor infos. */
	struct { const char *name; uint32_t nd; int64_t ne[5]; uint32_t type; uint64_t off; int code; const char *word; } ts[] = {
		{ "n_dims 0", 0, { 0 }, MCV_F32, 0, MCV_EFORMAT, "dimensions" },
		{ "n_dims 5", 5, { 32, 1, 1, 1, 1 }, MCV_F32, 0, MCV_EFORMAT, "dimensions" },
		{ "ne negative", 2, { 32, -1 }, MCV_F32, 0, MCV_EFORMAT, "negative" },
		{ "ne overflow", 3, { INT64_C(1) << 40, INT64_C(1) << 40, 1 }, MCV_F32, 0, MCV_EFORMAT, "overflow" },
		{ "bytes overflow", 1, { INT64_C(1) << 62 }, MCV_F32, 0, MCV_EFORMAT, "overflow" },
		{ "unknown type 99", 1, { 32 }, 99, 0, MCV_EFORMAT, "type 99" },
		{ "type 2^32-1", 1, { 32 }, UINT32_MAX, 0, MCV_EFORMAT, "type" },
		{ "unsupported iq4_xs", 1, { 256 }, 23, 0, MCV_EUNSUPPORTED, "not supported" },
		{ "ne0 % block", 2, { 33, 2 }, MCV_Q8_0, 0, MCV_EFORMAT, "block size" },
		{ "k-quant ne0 % 256", 1, { 128 }, MCV_Q4_K, 0, MCV_EFORMAT, "block size" },
		{ "offset misaligned", 1, { 32 }, MCV_F32, 4, MCV_EFORMAT, "aligned" },
		{ "offset beyond EOF", 1, { 32 }, MCV_F32, 4096, MCV_EFORMAT, "end of file" },
		{ "offset 2^63", 1, { 32 }, MCV_F32, UINT64_C(1) << 63, MCV_EFORMAT, "end of file" },
		{ "offset 2^64-32", 1, { 32 }, MCV_F32, UINT64_MAX - 31, MCV_EFORMAT, "end of file" },
		{ "size beyond EOF", 2, { 32, 100 }, MCV_F32, 0, MCV_EFORMAT, "end of file" },
	};
	for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
		bhdr(b, 3, 1, 0);
		bti(b, "blk.0.attn_q.weight", ts[i].nd, ts[i].ne, ts[i].type, ts[i].off);
		bpad(b, 32); bdata(b, 256);
		expect(ts[i].name, b, ts[i].code, ts[i].word);
	}
	bhdr(b, 3, 2, 0); bti(b, "a", 1, ne1, MCV_F32, 0); bti(b, "b", 1, ne1, MCV_F32, 96);
	bpad(b, 32); bdata(b, 256);
	expect("overlap", b, MCV_EFORMAT, "overlap");
	bhdr(b, 3, 2, 0); bti(b, "a", 1, ne1, MCV_F32, 128); bti(b, "b", 1, ne1, MCV_F32, 128);
	bpad(b, 32); bdata(b, 256);
	expect("same offset", b, MCV_EFORMAT, "overlap");
	bhdr(b, 3, 2, 0); bti(b, "a", 1, ne1, MCV_F32, 0); bti(b, "a", 1, ne1, MCV_F32, 128);
	bpad(b, 32); bdata(b, 256);
	expect("duplicate tensor", b, MCV_EFORMAT, "duplicate tensor name");
	char name64[65];
	memset(name64, 'n', 64);
	name64[64] = 0;
	bhdr(b, 3, 1, 0); bti(b, name64, 1, ne1, MCV_F32, 0); bpad(b, 32); bdata(b, 128);
	expect("name of 64 bytes", b, MCV_EFORMAT, "name");
	name64[63] = 0;
	bhdr(b, 3, 1, 0); bti(b, name64, 1, ne1, MCV_F32, 0); bpad(b, 32); bdata(b, 128);
	expect("name of 63 bytes", b, 0, NULL);
	bhdr(b, 3, 1, 0); bti(b, "", 1, ne1, MCV_F32, 0); bpad(b, 32); bdata(b, 128);
	expect("empty tensor name", b, MCV_EFORMAT, "empty name");
	bhdr(b, 3, 1, 0); b64(b, 3); bput(b, "x\0y", 3); b32(b, 1); b64(b, 32); b32(b, 0); b64(b, 0);
	bpad(b, 32); bdata(b, 128);
	expect("NUL in tensor name", b, MCV_EFORMAT, "NUL");
	int64_t ne0[1] = { 0 };
	bhdr(b, 3, 1, 0); bti(b, "a-name-long-enough-to-pass-the-count-check", 2, ne2, MCV_F32, 0); b->n -= 10;
	expect("tensor info cut", b, MCV_EFORMAT, "truncated");
	bhdr(b, 3, 1, 0); bti(b, "z", 1, ne0, MCV_F32, 0);
	if (b->n % 32 == 0)
		b->n -= 1;
	b->n += 1; /* one byte of padding only: the data section would start past the end */
	expect("data section past EOF", b, MCV_EFORMAT, "beyond end of file");

	/* Not files. */
	mcv_gguf *g;
	mcv_error e;
	int rc = mcv_gguf_open(&g, dir, &e);
	n_hostile++;
	CHECK(rc == MCV_EIO && strstr(e.msg, "directory"), "directory: %d %s", rc, e.msg);
	if (verbose)
		fprintf(stderr, "  %-24s %s\n", "directory", e.msg);
	char p[128];
	path_in(p, sizeof p, "does-not-exist.gguf");
	rc = mcv_gguf_open(&g, p, &e);
	n_hostile++;
	CHECK(rc == MCV_EIO && strstr(e.msg, "No such file") && strstr(e.msg, "does-not-exist"), "missing: %d %s", rc, e.msg);
	if (verbose)
		fprintf(stderr, "  %-24s %s\n", "missing file", e.msg);
	free(b);
}

static void cleanup(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[512];
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		unlink(p);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

int main(int argc, char **argv)
{
	verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/test_gguf.XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	make_vocab();
	test_roundtrip();
	test_writer();
	size_t n = 0;
	uint8_t *f = small_file(&n);
	CHECK(f != NULL, "small file");
	if (f) {
		long before = n_hostile;
		test_truncation(f, n);
		fprintf(stderr, "truncations: %ld (file of %zu bytes)\n", n_hostile - before, n);
		before = n_hostile;
		test_fuzz(f, n, 5000);
		/* The round-trip file has every value type and a 1000-string array. */
		char p[128];
		size_t n2 = 0;
		path_in(p, sizeof p, "full64.gguf");
		uint8_t *f2 = get_file(p, &n2);
		CHECK(f2 != NULL, "full64.gguf");
		if (f2)
			test_fuzz(f2, n2, 2000);
		free(f2);
		fprintf(stderr, "corruptions: %ld\n", n_hostile - before);
	}
	long before = n_hostile;
	test_crafted();
	fprintf(stderr, "crafted: %ld\nhostile cases: %ld\n", n_hostile - before, n_hostile);
	free(f);
	for (int i = 0; i < N_VOCAB; i++)
		free(vocab[i]);
	cleanup();
	return unit_done("test_gguf");
}

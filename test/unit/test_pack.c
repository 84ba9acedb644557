/* pack/: the expert layout of plain and packed files, and the packed writer.
 * Expected bytes are computed here from the plain tensors with the row
 * arithmetic of llama.cpp's layout (expert e = rows [e*F, (e+1)*F)), and the
 * layout's absolute offsets are checked with pread(), not through the
 * mapping. */
#include "gguf.h"
#include "pack.h"
#include "quant.h"
#include "unit.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define L 3
#define E 6
#define K 2
#define H 256
#define F 256

static char dir[] = "/tmp/mcv-test-pack.XXXXXX";

static uint8_t byte_at(const char *name, uint64_t i)
{
	uint64_t h = 1469598103934665603ull;
	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	h ^= i * 0x9e3779b97f4a7c15ull;
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(h >> 32);
}

static void add(mcv_gguf_writer *w, const char *name, int type, int nd, int64_t a, int64_t b, int64_t c)
{
	int64_t ne[3] = { a, b, c };
	CHECK(mcv_gguf_w_add_tensor(w, name, type, nd, ne) == 0, "add %s", name);
}

typedef struct { char name[96]; int type, nd; int64_t ne[3]; } tdesc;
static void push(tdesc *t, int *nt, const char *name, int type, int nd, int64_t a, int64_t b, int64_t c)
{
	tdesc *x = &t[(*nt)++];
	snprintf(x->name, sizeof x->name, "%s", name);
	x->type = type, x->nd = nd, x->ne[0] = a, x->ne[1] = b, x->ne[2] = c;
}

/* A qwen35moe-like file: enough tensors and keys for the layout (not a
 * runnable model).  Types differ per matrix to catch a row-size mix-up. */
static void make_model(const char *path, int fused, int dense)
{
	mcv_gguf_writer *w;
	mcv_error err = { 0 };
	const char *arch = dense ? "qwen35" : "qwen35moe";
	char k[128], n[96];
	/* The tensor list first: the data pass needs names and sizes again. */
	tdesc t[64];
	int nt = 0;
#define T(NAME, TY, ND, A, B, C) push(t, &nt, NAME, TY, ND, A, B, C)
	T("token_embd.weight", MCV_Q8_0, 2, H, 40, 1);
	for (int il = 0; il < L; il++) {
		snprintf(n, sizeof n, "blk.%d.attn_norm.weight", il), T(n, MCV_F32, 1, H, 1, 1);
		if (dense) {
			snprintf(n, sizeof n, "blk.%d.ffn_up.weight", il), T(n, MCV_Q8_0, 2, H, F, 1);
			continue;
		}
		snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", il), T(n, MCV_F32, 2, H, E, 1);
		int tg = il == 0 ? MCV_Q4_K : MCV_Q8_0, tu = il == 1 ? MCV_Q4_0 : MCV_Q8_0;
		if (fused) {
			snprintf(n, sizeof n, "blk.%d.ffn_gate_up_exps.weight", il), T(n, tg, 3, H, 2 * F, E);
		} else {
			snprintf(n, sizeof n, "blk.%d.ffn_gate_exps.weight", il), T(n, tg, 3, H, F, E);
			snprintf(n, sizeof n, "blk.%d.ffn_up_exps.weight", il), T(n, tu, 3, H, F, E);
		}
		snprintf(n, sizeof n, "blk.%d.ffn_down_exps.weight", il), T(n, MCV_Q6_K, 3, F, H, E);
		snprintf(n, sizeof n, "blk.%d.ffn_down_shexp.weight", il), T(n, MCV_F16, 2, F, H, 1);
	}
	T("output_norm.weight", MCV_F32, 1, H, 1, 1);
#undef T
	CHECK(mcv_gguf_writer_open(&w, path, &err) == 0, "%s", err.msg);
	mcv_gguf_w_str(w, "general.architecture", arch);
	mcv_gguf_w_str(w, "general.name", "pack test");
	snprintf(k, sizeof k, "%s.block_count", arch), mcv_gguf_w_u32(w, k, L);
	snprintf(k, sizeof k, "%s.embedding_length", arch), mcv_gguf_w_u32(w, k, H);
	if (!dense) {
		snprintf(k, sizeof k, "%s.expert_count", arch), mcv_gguf_w_u32(w, k, E);
		snprintf(k, sizeof k, "%s.expert_used_count", arch), mcv_gguf_w_u32(w, k, K);
	}
	for (int i = 0; i < nt; i++)
		add(w, t[i].name, t[i].type, t[i].nd, t[i].ne[0], t[i].ne[1], t[i].ne[2]);
	mcv_gguf_w_begin_data(w);
	static uint8_t buf[1 << 16];
	for (int i = 0; i < nt; i++) {
		uint64_t nb = mcv_row_bytes(t[i].type, t[i].ne[0]) * (uint64_t)(t[i].ne[1] * t[i].ne[2]);
		for (uint64_t o = 0; o < nb; o += sizeof buf) {
			uint64_t c = nb - o < sizeof buf ? nb - o : sizeof buf;
			for (uint64_t j = 0; j < c; j++)
				buf[j] = byte_at(t[i].name, o + j);
			mcv_gguf_w_write(w, buf, c);
		}
		mcv_gguf_w_end_tensor(w);
	}
	CHECK(mcv_gguf_writer_finish(w, &err) == 0, "%s", err.msg);
}

/* pread() len bytes at off of path and compare with p. */
static int same_at(int fd, uint64_t off, const void *p, uint64_t len)
{
	uint8_t *b = malloc(len);
	if (!b)
		return 0;
	int ok = pread(fd, b, len, (off_t)off) == (ssize_t)len && memcmp(b, p, len) == 0;
	free(b);
	return ok;
}

/* Expert e's slice s of the plain file, by llama.cpp's row arithmetic. */
static const uint8_t *plain_slice(const mcv_gguf *g, int il, int e, int s, int fused, uint64_t *len)
{
	char n[96];
	const char *kind = s == 2 ? "ffn_down_exps" : fused ? "ffn_gate_up_exps" : s ? "ffn_up_exps" : "ffn_gate_exps";
	snprintf(n, sizeof n, "blk.%d.%s.weight", il, kind);
	const mcv_gguf_tensor *t = mcv_gguf_find_tensor(g, n);
	if (!t)
		return NULL;
	uint64_t rb = mcv_row_bytes(t->type, t->ne[0]);
	int64_t rows_per = t->ne[1];
	uint64_t row0 = (uint64_t)e * rows_per;
	int64_t rows = rows_per;
	if (fused && s < 2) {
		rows = rows_per / 2;
		row0 += s == 1 ? (uint64_t)rows : 0;
	}
	*len = rb * (uint64_t)rows;
	return (const uint8_t *)t->data + rb * row0;
}

static void check_pair(const char *plain, const char *packed, int fused, const int *order)
{
	mcv_gguf *gp, *gk;
	mcv_layout *lp, *lk;
	mcv_error err = { 0 };
	CHECK(mcv_gguf_open(&gp, plain, &err) == 0, "%s", err.msg);
	CHECK(mcv_gguf_open(&gk, packed, &err) == 0, "packed file is a valid GGUF: %s", err.msg);
	CHECK(mcv_layout_open(&lp, gp, &err) == 0, "%s", err.msg);
	CHECK(mcv_layout_open(&lk, gk, &err) == 0, "%s", err.msg);
	if (unit_failures)
		exit(unit_done("test_pack"));
	CHECK(!mcv_layout_packed(lp) && mcv_layout_packed(lk), "packed flags");
	CHECK(mcv_layout_fused(lk) == fused, "fused flag");
	CHECK(mcv_gguf_alignment(gk) == 4096, "alignment %u", mcv_gguf_alignment(gk));
	CHECK(mcv_layout_n_layer(lk) == L && mcv_layout_n_expert(lk) == E &&
	      mcv_layout_n_expert_used(lk) == K && mcv_layout_n_embd(lk) == H && mcv_layout_n_ff(lk) == F,
	      "shape");
	CHECK(mcv_layout_fingerprint(lp) == mcv_layout_fingerprint(lk), "fingerprint survives packing");
	uint32_t ver = 0;
	CHECK(mcv_gguf_get_u32(gk, "mcv.pack.version", &ver, &err) == 0 && ver == 1, "mcv.pack.version");
	const char *name = NULL;
	CHECK(mcv_gguf_get_str(gk, "general.name", &name, &err) == 0 && !strcmp(name, "pack test"),
	      "keys copied");
	int fd = open(packed, O_RDONLY);
	int fdp = open(plain, O_RDONLY);
	int bad = 0;
	for (int il = 0; il < L; il++) {
		const int *o = mcv_layout_order(lk, il);
		uint64_t prev_end = 0, sum = 0;
		for (int q = 0; q < E; q++) {
			int e = o[q];
			if (order)
				CHECK(e == order[il * E + q], "layer %d position %d holds %d, wanted %d", il, q, e,
				      order[il * E + q]);
			const mcv_expert_extent *x = mcv_layout_expert(lk, il, e);
			const mcv_expert_extent *xp = mcv_layout_expert(lp, il, e);
			CHECK(x->contiguous && x->aligned && x->offset % 4096 == 0, "layer %d expert %d extent", il, e);
			CHECK(!xp->contiguous && !xp->aligned, "plain expert is scattered");
			CHECK(x->position == q, "position");
			CHECK(x->offset >= prev_end, "experts in storage order");
			CHECK(x->read_offset == x->offset && x->read_bytes % 4096 == 0 &&
			      x->read_bytes >= x->bytes && x->read_bytes - x->bytes < 4096, "read window");
			prev_end = x->offset + x->bytes;
			for (int s = 0; s < 3; s++) {
				uint64_t len = 0;
				const uint8_t *want = plain_slice(gp, il, e, s, fused, &len);
				sum += len;
				bad += !want || x->s[s].bytes != len || !same_at(fd, x->s[s].offset, want, len) ||
				       !same_at(fdp, xp->s[s].offset, want, len) ||
				       memcmp(mcv_layout_slice_data(lk, il, e, s), want, len) != 0;
				/* slices inside the extent */
				bad += x->s[s].offset < x->offset || x->s[s].offset + x->s[s].bytes > x->offset + x->bytes;
			}
			/* the packed tensor of this expert, found by its documented name */
			char n[96];
			snprintf(n, sizeof n, "blk.%d.%s.%d.weight", il, fused ? "ffn_gate_up_exps" : "ffn_gate_exps", e);
			const mcv_gguf_tensor *t = mcv_gguf_find_tensor(gk, n);
			CHECK(t && t->file_offset == x->offset && t->n_dims == 2 && t->ne[0] == H &&
			      t->ne[1] == (fused ? 2 * F : F), "tensor %s", n);
		}
		CHECK(sum == mcv_layout_layer_bytes(lk, il) && sum == mcv_layout_layer_bytes(lp, il),
		      "layer %d bytes %" PRIu64, il, sum);
	}
	CHECK(bad == 0, "%d expert slices differ from the plain file's", bad);
	/* non-expert tensors: same bytes, one region before every expert */
	uint64_t ro, rb;
	CHECK(!mcv_layout_nonexpert_region(lp, &ro, &rb), "plain: non-expert tensors interleaved");
	CHECK(mcv_layout_nonexpert_region(lk, &ro, &rb) && ro % 4096 == 0 && rb % 4096 == 0,
	      "packed: one non-expert region");
	CHECK(mcv_layout_n_nonexpert(lk) == mcv_layout_n_nonexpert(lp) && mcv_layout_n_nonexpert(lk) > 0,
	      "non-expert count");
	for (int64_t i = 0; i < mcv_gguf_n_tensors(gp); i++) {
		if (mcv_layout_is_expert_tensor(lp, i))
			continue;
		const mcv_gguf_tensor *a = mcv_gguf_tensor_at(gp, i);
		const mcv_gguf_tensor *b = mcv_gguf_find_tensor(gk, a->name);
		CHECK(b && b->nbytes == a->nbytes && !memcmp(a->data, b->data, a->nbytes) &&
		      b->file_offset >= ro && b->file_offset + b->nbytes <= ro + rb, "tensor %s", a->name);
	}
	CHECK(mcv_layout_compare(lp, lk, &err) == 0, "compare: %s", err.msg);
	close(fd);
	close(fdp);
	mcv_layout_free(lp);
	mcv_layout_free(lk);
	mcv_gguf_close(gp);
	mcv_gguf_close(gk);
}

static void test_roundtrip(int fused)
{
	char plain[256], packed[256], again[256];
	snprintf(plain, sizeof plain, "%s/plain%d.gguf", dir, fused);
	snprintf(packed, sizeof packed, "%s/packed%d.gguf", dir, fused);
	snprintf(again, sizeof again, "%s/again%d.gguf", dir, fused);
	make_model(plain, fused, 0);
	mcv_gguf *g;
	mcv_layout *l;
	mcv_error err = { 0 };
	CHECK(mcv_gguf_open(&g, plain, &err) == 0, "%s", err.msg);
	CHECK(mcv_layout_open(&l, g, &err) == 0, "%s", err.msg);
	if (unit_failures)
		return;
	CHECK(mcv_pack_write(l, packed, NULL, &err) == 0, "%s", err.msg);
	check_pair(plain, packed, fused, NULL);

	/* a given order, written from the packed file (repacking) */
	int order[L * E];
	for (int il = 0; il < L; il++)
		for (int q = 0; q < E; q++)
			order[il * E + q] = (q * 5 + il) % E; /* 5 is coprime with 6 */
	mcv_gguf *gk;
	mcv_layout *lk;
	CHECK(mcv_gguf_open(&gk, packed, &err) == 0, "%s", err.msg);
	CHECK(mcv_layout_open(&lk, gk, &err) == 0, "%s", err.msg);
	mcv_pack_params p = mcv_pack_default_params();
	p.order = order;
	CHECK(mcv_pack_write(lk, again, &p, &err) == 0, "%s", err.msg);
	check_pair(plain, again, fused, order);

	/* not a permutation */
	order[3] = order[4];
	char bad[256];
	snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
	CHECK(mcv_pack_write(l, bad, &p, &err) == MCV_EINVAL && strstr(err.msg, "permutation"),
	      "bad order: %s", err.msg);
	struct stat st;
	CHECK(stat(bad, &st) != 0, "no output after a refused order");
	mcv_layout_free(lk);
	mcv_gguf_close(gk);
	mcv_layout_free(l);
	mcv_gguf_close(g);
}

static void test_errors(void)
{
	char dense[256], packed[256], cut[256];
	snprintf(dense, sizeof dense, "%s/dense.gguf", dir);
	snprintf(packed, sizeof packed, "%s/packed0.gguf", dir);
	snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
	make_model(dense, 0, 1);
	mcv_gguf *g;
	mcv_layout *l;
	mcv_error err = { 0 };
	CHECK(mcv_gguf_open(&g, dense, &err) == 0, "%s", err.msg);
	CHECK(mcv_layout_open(&l, g, &err) == MCV_EUNSUPPORTED && strstr(err.msg, "no expert"),
	      "dense: %s", err.msg);
	mcv_gguf_close(g);

	/* truncated packed file: the reader refuses it with a message */
	FILE *in = fopen(packed, "rb"), *out = fopen(cut, "wb");
	CHECK(in && out, "copy");
	struct stat st;
	stat(packed, &st);
	static char buf[1 << 16];
	off_t left = st.st_size - 5000;
	while (left > 0) {
		size_t n = fread(buf, 1, left < (off_t)sizeof buf ? (size_t)left : sizeof buf, in);
		if (!n)
			break;
		fwrite(buf, 1, n, out);
		left -= (off_t)n;
	}
	fclose(in);
	fclose(out);
	err.msg[0] = 0;
	int rc = mcv_gguf_open(&g, cut, &err);
	CHECK(rc == MCV_EFORMAT && err.msg[0], "truncated: rc %d %s", rc, err.msg);
	if (!rc)
		mcv_gguf_close(g);

	/* a packed file whose expert_order disagrees with its offsets */
	char lie[256];
	snprintf(lie, sizeof lie, "%s/lie.gguf", dir);
	mcv_gguf *gk;
	CHECK(mcv_gguf_open(&gk, packed, &err) == 0, "%s", err.msg);
	mcv_gguf_writer *w;
	CHECK(mcv_gguf_writer_open(&w, lie, &err) == 0, "%s", err.msg);
	for (int64_t i = 0; i < mcv_gguf_n_kv(gk); i++) {
		if (!strcmp(mcv_gguf_key(gk, i), "mcv.pack.expert_order")) {
			int32_t o[L * E];
			for (int j = 0; j < L * E; j++)
				o[j] = E - 1 - j % E;
			mcv_gguf_w_arr(w, "mcv.pack.expert_order", GGUF_I32, o, L * E);
		} else {
			mcv_gguf_w_copy_kv(w, gk, i);
		}
	}
	for (int64_t i = 0; i < mcv_gguf_n_tensors(gk); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(gk, i);
		mcv_gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
	}
	mcv_gguf_w_begin_data(w);
	for (int64_t i = 0; i < mcv_gguf_n_tensors(gk); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(gk, i);
		mcv_gguf_w_write(w, t->data, t->nbytes);
		mcv_gguf_w_end_tensor(w);
	}
	CHECK(mcv_gguf_writer_finish(w, &err) == 0, "%s", err.msg);
	mcv_gguf_close(gk);
	CHECK(mcv_gguf_open(&g, lie, &err) == 0, "%s", err.msg);
	CHECK(mcv_layout_open(&l, g, &err) == MCV_EFORMAT && strstr(err.msg, "expert_order"),
	      "lying order: %s", err.msg);
	mcv_gguf_close(g);
}

/* Flip bytes of a packed file's header (keys, tensor infos) one at a time:
 * the reader or the layout may refuse the file, but must not crash or
 * read out of bounds (this test also runs under ASan/UBSan). */
static void test_hostile(void)
{
	char packed[256];
	snprintf(packed, sizeof packed, "%s/packed1.gguf", dir);
	mcv_gguf *g;
	mcv_error err = { 0 };
	CHECK(mcv_gguf_open(&g, packed, &err) == 0, "%s", err.msg);
	if (unit_failures)
		return;
	uint64_t hdr = mcv_gguf_data_offset(g);
	mcv_gguf_close(g);
	int fd = open(packed, O_RDWR);
	CHECK(fd >= 0, "open %s", packed);
	uint64_t x = 12345;
	int opened = 0, refused = 0;
	for (int it = 0; it < 400; it++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		off_t at = (off_t)((x >> 33) % hdr);
		uint8_t old, nb = (uint8_t)(x >> 13) | 1;
		if (pread(fd, &old, 1, at) != 1)
			break;
		uint8_t neu = old ^ nb;
		if (pwrite(fd, &neu, 1, at) != 1)
			break;
		if (mcv_gguf_open(&g, packed, &err) == 0) {
			mcv_layout *l;
			if (mcv_layout_open(&l, g, &err) == 0) {
				opened++;
				for (int il = 0; il < mcv_layout_n_layer(l); il++)
					for (int e = 0; e < mcv_layout_n_expert(l); e++)
						for (int s = 0; s < 3; s++) {
							const mcv_expert_extent *xt = mcv_layout_expert(l, il, e);
							CHECK(xt->s[s].offset + xt->s[s].bytes <= mcv_gguf_file_size(g),
							      "slice inside the file");
						}
				mcv_layout_free(l);
			} else {
				refused++;
				CHECK(err.msg[0] != 0, "a refusal has a message");
			}
			mcv_gguf_close(g);
		} else {
			refused++;
		}
		if (pwrite(fd, &old, 1, at) != 1)
			break;
	}
	close(fd);
	CHECK(opened + refused == 400, "%d opened, %d refused", opened, refused);
}

static void test_order(void)
{
	/* Planted pairs {0,5}, {1,4}, {2,3}: the chain must put partners next
	 * to each other, and the distance must drop to 1. */
	mcv_cosel c;
	CHECK(mcv_cosel_init(&c, 6) == 0, "init");
	int32_t pairs[3][2] = { { 0, 5 }, { 1, 4 }, { 2, 3 } };
	for (int t = 0; t < 60; t++)
		mcv_cosel_add(&c, pairs[t % 3], 2);
	int id[6] = { 0, 1, 2, 3, 4, 5 }, o[6];
	mcv_order_chain(&c, 2, o);
	double before = mcv_order_mean_distance(&c, id), after = mcv_order_mean_distance(&c, o);
	CHECK(before > 2.9 && before < 3.1, "identity distance %g", before); /* (5+3+1)/3 */
	CHECK(after == 1.0, "chain distance %g", after);
	int seen = 0;
	for (int p = 0; p < 6; p++)
		seen |= 1 << o[p];
	CHECK(seen == 63, "permutation");
	mcv_cosel_free(&c);
}

int main(void)
{
	if (!mkdtemp(dir))
		UNIT_SKIP("cannot create a temporary directory");
	test_roundtrip(0);
	test_roundtrip(1);
	test_errors();
	test_hostile();
	test_order();
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return unit_done("test_pack");
}

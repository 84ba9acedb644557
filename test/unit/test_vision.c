/* Vision tower: loading errors, slicing plan invariants, thread-count
 * independence, exact vs quantized products, and the image block layout
 * (markers, canvas positions).  Numerical parity with the PyTorch reference
 * is test/vision-parity.bats. */
#include "gguf.h"
#include "multimodal.h"
#include "quant.h"
#include "unit.h"
#include "vision.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

enum { W = 64, NH = 2, FF = 128, NL = 3, P = 14, S = 112, NP = 64, MFF = 128, PFF = 128, NB = 8 };

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

typedef struct spec { char name[64]; int type, nd; int64_t ne[4]; float scale, bias; } spec;
static spec specs[128];
static int nspec;

static void add(const char *name, int type, int nd, int64_t a, int64_t b, int64_t c, int64_t d,
		float scale, float bias)
{
	spec *s = &specs[nspec++];
	snprintf(s->name, sizeof s->name, "%s", name);
	s->type = type;
	s->nd = nd;
	s->ne[0] = a, s->ne[1] = b, s->ne[2] = c, s->ne[3] = d;
	s->scale = scale;
	s->bias = bias;
}

static void lin(const char *pre, int in, int out)
{
	char nm[64];
	snprintf(nm, sizeof nm, "%s.weight", pre);
	add(nm, MCV_Q8_0, 2, in, out, 1, 1, 1.0f / sqrtf((float)in), 0);
	snprintf(nm, sizeof nm, "%s.bias", pre);
	add(nm, MCV_F32, 1, out, 1, 1, 1, 0.02f, 0);
}

static void ln(const char *pre, int n)
{
	char nm[64];
	snprintf(nm, sizeof nm, "%s.weight", pre);
	add(nm, MCV_F32, 1, n, 1, 1, 1, 0.1f, 1.0f);
	snprintf(nm, sizeof nm, "%s.bias", pre);
	add(nm, MCV_F32, 1, n, 1, 1, 1, 0.02f, 0);
}

/* The tensor list of a tiny mmproj; `skip` leaves one out, `bad_proj`
 * makes mm.down the wrong width. */
static void build_specs(const char *skip, int bad_proj)
{
	nspec = 0;
	add("v.patch_embd.weight", MCV_F32, 4, P, P, 3, W, 0.05f, 0);
	add("v.patch_embd.bias", MCV_F32, 1, W, 1, 1, 1, 0.02f, 0);
	add("v.position_embd.weight", MCV_F16, 2, W, NB * NB, 1, 1, 0.1f, 0);
	char pre[64];
	for (int il = 0; il < NL; il++) {
#define B_(s) (snprintf(pre, sizeof pre, "v.blk.%d.%s", il, s), pre)
		ln(B_("ln1"), W);
		lin(B_("attn_q"), W, W);
		lin(B_("attn_k"), W, W);
		lin(B_("attn_v"), W, W);
		lin(B_("attn_out"), W, W);
		ln(B_("ln2"), W);
		lin(B_("ffn_up"), W, FF);
		lin(B_("ffn_down"), FF, W);
#undef B_
	}
	ln("v.post_ln", W);
	ln("v.vit_merger.ln1", W);
	lin("v.vit_merger.attn_q", W, W);
	lin("v.vit_merger.attn_k", W, W);
	lin("v.vit_merger.attn_v", W, W);
	lin("v.vit_merger.attn_out", W, W);
	ln("v.vit_merger.ds_ln", 4 * W);
	lin("v.vit_merger.ds_ffn_up", 4 * W, MFF);
	lin("v.vit_merger.ds_ffn_down", MFF, W);
	ln("mm.input_norm", 4 * W);
	lin("mm.up", 4 * W, PFF);
	lin("mm.down", PFF, bad_proj ? NP / 2 : NP);
	if (skip)
		for (int i = 0; i < nspec; i++)
			if (!strcmp(specs[i].name, skip)) {
				memmove(&specs[i], &specs[i + 1], sizeof(spec) * (size_t)(nspec - i - 1));
				nspec--;
				break;
			}
}

static int write_mmproj(const char *path, const char *proj_type, const char *skip, int bad_proj)
{
	build_specs(skip, bad_proj);
	mcv_gguf_writer *w;
	mcv_error err = {0};
	if (mcv_gguf_writer_open(&w, path, &err))
		return -1;
	mcv_gguf_w_str(w, "general.architecture", "clip");
	mcv_gguf_w_str(w, "clip.projector_type", proj_type);
	mcv_gguf_w_u32(w, "clip.vision.image_size", S);
	mcv_gguf_w_u32(w, "clip.vision.patch_size", P);
	mcv_gguf_w_u32(w, "clip.vision.embedding_length", W);
	mcv_gguf_w_u32(w, "clip.vision.feed_forward_length", FF);
	mcv_gguf_w_u32(w, "clip.vision.block_count", NL);
	mcv_gguf_w_u32(w, "clip.vision.attention.head_count", NH);
	mcv_gguf_w_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-6f);
	mcv_gguf_w_u32(w, "clip.vision.projection_dim", NP);
	mcv_gguf_w_u32(w, "clip.vision.projector.scale_factor", 4);
	int32_t wa = 0;
	mcv_gguf_w_arr(w, "clip.vision.wa_layer_indexes", GGUF_I32, &wa, 1);
	for (int i = 0; i < nspec; i++)
		mcv_gguf_w_add_tensor(w, specs[i].name, specs[i].type, specs[i].nd, specs[i].ne);
	mcv_gguf_w_begin_data(w);
	for (int i = 0; i < nspec; i++) {
		const spec *s = &specs[i];
		const int64_t n0 = s->ne[0], rows = s->ne[1] * s->ne[2] * s->ne[3];
		float *x = malloc(sizeof(float) * (size_t)n0);
		const size_t rb = mcv_row_bytes(s->type, n0);
		void *y = malloc(rb);
		for (int64_t r = 0; r < rows; r++) {
			for (int64_t j = 0; j < n0; j++)
				x[j] = s->bias + s->scale * frand();
			if (s->type == MCV_F32)
				memcpy(y, x, rb);
			else
				mcv_quantize_row_ref(s->type, x, y, n0);
			mcv_gguf_w_write(w, y, rb);
		}
		mcv_gguf_w_end_tensor(w);
		free(x);
		free(y);
	}
	return mcv_gguf_writer_finish(w, &err);
}

static void test_errors(const char *dir)
{
	char path[512];
	mcv_error err = {0};
	mcv_vision *v = NULL;
	snprintf(path, sizeof path, "%s/missing.gguf", dir);
	CHECK(write_mmproj(path, "minicpmv4_6", "v.post_ln.bias", 0) == 0, "write");
	int rc = mcv_vision_load(&v, path, &err);
	CHECK(rc == MCV_ENOTFOUND && strstr(err.msg, "v.post_ln.bias"), "rc %d: %s", rc, err.msg);
	CHECK(v == NULL, "no object on failure");

	snprintf(path, sizeof path, "%s/type.gguf", dir);
	CHECK(write_mmproj(path, "mlp", NULL, 0) == 0, "write");
	rc = mcv_vision_load(&v, path, &err);
	CHECK(rc == MCV_EUNSUPPORTED && strstr(err.msg, "mlp"), "rc %d: %s", rc, err.msg);

	snprintf(path, sizeof path, "%s/shape.gguf", dir);
	CHECK(write_mmproj(path, "minicpmv4_7", NULL, 1) == 0, "write");
	rc = mcv_vision_load(&v, path, &err);
	CHECK(rc == MCV_EFORMAT && strstr(err.msg, "mm.down.weight"), "rc %d: %s", rc, err.msg);

	rc = mcv_vision_load(&v, "/nonexistent/x.gguf", &err);
	CHECK(rc < 0 && v == NULL, "rc %d", rc);
}

static void test_plan(const mcv_vision *v)
{
	mcv_error err = {0};
	mcv_vision_plan pl;
	mcv_vision_params p = mcv_vision_default_params();
	static const int sizes[][2] = {{S, S}, {50, 300}, {600, 90}, {S + 1, S}, {1000, 1000}, {1, 1}, {3000, 40}};
	for (int c = 0; c < 2; c++) {
		p.compress = c ? 4 : 16;
		const int m = P * (c ? 2 : 4);
		for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
			int rc = mcv_vision_plan_image(v, sizes[k][0], sizes[k][1], &p, &pl, &err);
			CHECK(rc == 0, "%dx%d: %s", sizes[k][0], sizes[k][1], err.msg);
			if (rc)
				continue;
			int tot = 0;
			CHECK(pl.n_crops == 1 + pl.cols * pl.rows && pl.cols * pl.rows <= 9, "%d crops", pl.n_crops);
			for (int i = 0; i < pl.n_crops; i++) {
				CHECK(pl.crop_w[i] % m == 0 && pl.crop_h[i] % m == 0, "crop %d: %dx%d", i, pl.crop_w[i],
				      pl.crop_h[i]);
				CHECK(pl.crop_nx[i] * m == pl.crop_w[i] && pl.crop_ny[i] * m == pl.crop_h[i], "grid");
				tot += pl.crop_nx[i] * pl.crop_ny[i];
			}
			CHECK(tot == pl.n_tokens, "%d vs %d", tot, pl.n_tokens);
			/* an image that fits is never sliced; one that does not always is */
			const int big = sizes[k][0] > S || sizes[k][1] > S;
			CHECK(big == (pl.cols > 0), "%dx%d: grid %dx%d", sizes[k][0], sizes[k][1], pl.cols, pl.rows);
		}
	}
	/* 16x on an image that fits: the overview is S x S, (S/56)^2 tokens */
	p.compress = 16;
	mcv_vision_plan_image(v, 80, 60, &p, &pl, &err);
	CHECK(pl.ov_w == S && pl.ov_h == S && pl.n_tokens == (S / 56) * (S / 56), "%dx%d %d", pl.ov_w, pl.ov_h,
	      pl.n_tokens);
	/* the slice limit holds */
	p.max_slices = 2;
	mcv_vision_plan_image(v, 1000, 1000, &p, &pl, &err);
	CHECK(pl.cols * pl.rows <= 2, "%dx%d", pl.cols, pl.rows);
	p.max_slices = 0;
	p.no_slices = 1;
	mcv_vision_plan_image(v, 1000, 300, &p, &pl, &err);
	CHECK(pl.n_crops == 1 && pl.cols == 0 && pl.ov_w > pl.ov_h, "no_slices: %d crops, overview %dx%d",
	      pl.n_crops, pl.ov_w, pl.ov_h);
	p.no_slices = 0;
	p.compress = 8;
	CHECK(mcv_vision_plan_image(v, 100, 100, &p, &pl, &err) == MCV_EINVAL, "compress 8");
	p.compress = 0;
	p.max_slices = -1;
	CHECK(mcv_vision_plan_image(v, 100, 100, &p, &pl, &err) == MCV_EINVAL, "max_slices -1");
}

static void test_encode(const mcv_vision *v)
{
	mcv_error err = {0};
	const int w = 168, h = 112; /* 12 x 8 patches */
	float *chw = malloc(sizeof(float) * 3 * w * h);
	for (int i = 0; i < 3 * w * h; i++)
		chw[i] = frand();
	for (int c = 0; c < 2; c++) {
		mcv_vision_params p = mcv_vision_default_params();
		p.compress = c ? 4 : 16;
		const int m = c ? 28 : 56, nt = (w / m) * (h / m);
		float *a = malloc(sizeof(float) * nt * NP), *b = malloc(sizeof(float) * nt * NP);
		float *e = malloc(sizeof(float) * nt * NP);
		omp_set_num_threads(1);
		CHECK(mcv_vision_encode_crop(v, chw, w, h, &p, a, &err) == 0, "%s", err.msg);
		omp_set_num_threads(2);
		CHECK(mcv_vision_encode_crop(v, chw, w, h, &p, b, &err) == 0, "%s", err.msg);
		CHECK(memcmp(a, b, sizeof(float) * nt * NP) == 0, "compress %d: 1 and 2 threads differ", p.compress);
		p.exact = 1;
		CHECK(mcv_vision_encode_crop(v, chw, w, h, &p, e, &err) == 0, "%s", err.msg);
		double d = 0, mx = 0;
		for (int i = 0; i < nt * NP; i++) {
			d = fmax(d, fabs(a[i] - e[i]));
			mx = fmax(mx, fabs(e[i]));
		}
		CHECK(mx > 0 && d < 0.05 * mx && isfinite(d), "exact vs quantized: %g of %g", d, mx);
		CHECK(mcv_vision_encode_crop(v, chw, 100, 112, &p, e, &err) == MCV_EINVAL, "bad crop size");
		free(a);
		free(b);
		free(e);
	}
	free(chw);
}

/* The image block: markers and (t, h, w) positions as chatfmt.py lays them out. */
static void test_block(const mcv_vision *v)
{
	static const char *const toks[] = {"a", "b", "\n", "<image>", "</image>", "<slice>", "</slice>",
					   "<image_id>", "</image_id>", "0", "1"};
	const int32_t types[] = {1, 1, 1, 3, 3, 3, 3, 3, 3, 1, 1};
	mcv_tokenizer *tok;
	mcv_error err = {0};
	/* "\n" in byte-level form */
	const char *bl[sizeof toks / sizeof toks[0]];
	memcpy(bl, toks, sizeof bl);
	bl[2] = "\xc4\x8a";
	if (mcv_tokenizer_init(&tok, bl, types, 11, NULL, 0, MCV_PRE_QWEN2, &err)) {
		CHECK(0, "tokenizer: %s", err.msg);
		return;
	}
	mcv_image img = {0};
	mcv_image_alloc(&img, 300, 150, &err);
	for (int i = 0; i < 300 * 150 * 3; i++)
		img.rgb[i] = (uint8_t)(i * 7);
	mcv_vision_params p = mcv_vision_default_params();
	mcv_mm_block b;
	const int pos0 = 5;
	int rc = mcv_mm_build_image(&b, tok, v, &img, &p, -1, pos0, &err);
	CHECK(rc == 0, "%s", err.msg);
	if (rc == 0) {
		const mcv_vision_plan *pl = &b.plan;
		CHECK(pl->cols * pl->rows >= 2, "sliced: %dx%d", pl->cols, pl->rows);
		/* expected: markers around each crop, "\n" between rows and at the end */
		int n_markers = 2 + 2 * pl->cols * pl->rows + (pl->rows - 1) + 1;
		CHECK(b.n == n_markers + pl->n_tokens, "%d rows, %d markers + %d visual", b.n, n_markers,
		      pl->n_tokens);
		CHECK(b.tok[0] == 3 && b.tok[b.n - 1] == 2, "starts with <image>, ends with newline");
		int p = pos0, i = 0, crop = 0, ok = 1;
		while (i < b.n && ok) {
			if (b.tok[i] >= 0) {
				ok = b.pos4[4 * i] == p && b.pos4[4 * i + 1] == p && b.pos4[4 * i + 2] == p;
				p++, i++;
				continue;
			}
			const int nx = pl->crop_nx[crop], ny = pl->crop_ny[crop];
			for (int r = 0; r < ny && ok; r++)
				for (int c = 0; c < nx && ok; c++, i++)
					ok = b.tok[i] == -1 && b.pos4[4 * i] == p && b.pos4[4 * i + 1] == p + r &&
					     b.pos4[4 * i + 2] == p + c && b.pos4[4 * i + 3] == 0;
			p += nx > ny ? nx : ny;
			crop++;
		}
		CHECK(ok && crop == pl->n_crops && p == b.next_pos, "positions (at row %d, crop %d)", i, crop);
		mcv_mm_block_free(&b);
	}
	rc = mcv_mm_build_image(&b, tok, v, &img, &p, 1, 0, &err);
	CHECK(rc == 0 && b.tok[0] == 7 && b.tok[1] == 10 && b.tok[2] == 8 && b.tok[3] == 3, "image id prefix");
	if (rc == 0)
		mcv_mm_block_free(&b);
	mcv_image_free(&img);
	mcv_tokenizer_free(tok);
}

int main(void)
{
	char dir[] = "/tmp/mcv-test-vision.XXXXXX";
	if (!mkdtemp(dir))
		UNIT_SKIP("no temporary directory");
	char path[512];
	snprintf(path, sizeof path, "%s/ok.gguf", dir);
	CHECK(write_mmproj(path, "minicpmv4_7", NULL, 0) == 0, "write mmproj");
	mcv_error err = {0};
	mcv_vision *v = NULL;
	int rc = mcv_vision_load(&v, path, &err);
	CHECK(rc == 0, "load: %s", err.msg);
	if (rc == 0) {
		CHECK(mcv_vision_n_embd(v) == NP && mcv_vision_default_compress(v) == 16, "hparams");
		CHECK(mcv_vision_check_text(v, NP, &err) == 0, "width ok");
		CHECK(mcv_vision_check_text(v, 2 * NP, &err) == MCV_EINVAL && strstr(err.msg, "hidden size"),
		      "%s", err.msg);
		test_plan(v);
		test_encode(v);
		test_block(v);
		mcv_vision_free(v);
	}
	test_errors(dir);
	static const char *const files[] = {"ok", "missing", "type", "shape"};
	for (int i = 0; i < 4; i++) {
		snprintf(path, sizeof path, "%s/%s.gguf", dir, files[i]);
		unlink(path);
	}
	rmdir(dir);
	return unit_done("test_vision");
}

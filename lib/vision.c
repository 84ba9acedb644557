/* Vision tower: loading the mmproj GGUF and the slicing plan.  The forward
 * pass is in vision_vit.c. */
#include "vision_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mcv_vision_params mcv_vision_default_params(void)
{
	mcv_vision_params p = {0};
	return p;
}

int mcv_vision_n_embd(const mcv_vision *v) { return v->n_proj; }
int mcv_vision_default_compress(const mcv_vision *v) { return v->merge == 4 ? 16 : 4; }
int mcv_vision_default_max_slices(const mcv_vision *v) { return v->max_slices; }

int mcv_vision_check_text(const mcv_vision *v, int n_embd, mcv_error *err)
{
	if (v->n_proj != n_embd)
		return mcv_error_set(err, MCV_EINVAL,
				     "vision projector outputs %d values per token but the language model's hidden size is %d (mmproj of another model?)",
				     v->n_proj, n_embd);
	return 0;
}

/* ---- loading ---- */

static int get_u32(const mcv_gguf *g, const char *key, int *out, mcv_error *err)
{
	uint32_t u;
	int rc = mcv_gguf_get_u32(g, key, &u, err);
	if (rc < 0)
		return rc;
	if (u == 0 || u > (1u << 20))
		return mcv_error_set(err, MCV_EFORMAT, "%s = %u is out of range", key, u);
	*out = (int)u;
	return 0;
}

/* Binds tensor `name` with ggml shape (ne0, ne1) (ne1 == 0: a vector). */
static int bind(const mcv_gguf *g, mcv_vw *w, const char *name, int64_t ne0, int64_t ne1,
		mcv_error *err)
{
	const mcv_gguf_tensor *t = mcv_gguf_find_tensor(g, name);
	if (!t)
		return mcv_error_set(err, MCV_ENOTFOUND, "tensor '%s' is missing", name);
	const int64_t want1 = ne1 ? ne1 : 1;
	if (t->ne[0] != ne0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1)
		return mcv_error_set(err, MCV_EFORMAT,
				     "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
				     name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
				     (long long)t->ne[3], (long long)ne0, (long long)want1);
	if (!mcv_type_get(t->type) || t->type == MCV_Q8_K)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "tensor '%s' has unsupported type %d",
				     name, t->type);
	/* small vectors are read as floats directly */
	if (!ne1 && t->type != MCV_F32)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "tensor '%s' must be f32", name);
	w->data = t->data;
	w->type = t->type;
	w->ne0 = ne0;
	w->ne1 = want1;
	w->rb = mcv_row_bytes(t->type, ne0);
	return 0;
}

static int bind_lin(const mcv_gguf *g, mcv_lin *l, const char *pre, int64_t in, int64_t out,
		    mcv_error *err)
{
	char nm[96];
	snprintf(nm, sizeof nm, "%s.weight", pre);
	int rc = bind(g, &l->w, nm, in, out, err);
	if (rc < 0)
		return rc;
	snprintf(nm, sizeof nm, "%s.bias", pre);
	return bind(g, &l->b, nm, out, 0, err);
}

static int bind_ln(const mcv_gguf *g, mcv_ln *l, const char *pre, int64_t n, mcv_error *err)
{
	char nm[96];
	snprintf(nm, sizeof nm, "%s.weight", pre);
	int rc = bind(g, &l->w, nm, n, 0, err);
	if (rc < 0)
		return rc;
	snprintf(nm, sizeof nm, "%s.bias", pre);
	return bind(g, &l->b, nm, n, 0, err);
}

static int load_hparams(mcv_vision *v, mcv_error *err)
{
	const mcv_gguf *g = v->g;
	const char *s;
	int rc;
	if ((rc = mcv_gguf_get_str(g, "general.architecture", &s, err)) < 0)
		return rc;
	if (strcmp(s, "clip") != 0)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "architecture '%s' is not a vision projector (clip)", s);
	if ((rc = mcv_gguf_get_str(g, "clip.projector_type", &s, err)) < 0)
		return rc;
	if (strcmp(s, "minicpmv4_6") != 0 && strcmp(s, "minicpmv4_7") != 0)
		return mcv_error_set(err, MCV_EUNSUPPORTED,
				     "projector type '%s' is not supported (minicpmv4_6 or minicpmv4_7)", s);
	if ((rc = get_u32(g, "clip.vision.image_size", &v->image_size, err)) < 0 ||
	    (rc = get_u32(g, "clip.vision.patch_size", &v->patch, err)) < 0 ||
	    (rc = get_u32(g, "clip.vision.embedding_length", &v->width, err)) < 0 ||
	    (rc = get_u32(g, "clip.vision.feed_forward_length", &v->ff, err)) < 0 ||
	    (rc = get_u32(g, "clip.vision.block_count", &v->n_layer, err)) < 0 ||
	    (rc = get_u32(g, "clip.vision.attention.head_count", &v->n_head, err)) < 0 ||
	    (rc = get_u32(g, "clip.vision.projection_dim", &v->n_proj, err)) < 0)
		return rc;
	if ((rc = mcv_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &v->eps, err)) < 0)
		return rc;
	if (v->width % v->n_head)
		return mcv_error_set(err, MCV_EFORMAT, "embedding_length %d is not a multiple of head_count %d",
				     v->width, v->n_head);
	if (v->n_layer > 1024 || v->patch > 64 || v->image_size > 8192)
		return mcv_error_set(err, MCV_EFORMAT, "vision hyper-parameters out of range");
	v->merge = 4;
	if (mcv_gguf_find_key(g, "clip.vision.projector.scale_factor") >= 0) {
		if ((rc = get_u32(g, "clip.vision.projector.scale_factor", &v->merge, err)) < 0)
			return rc;
		if (v->merge != 2 && v->merge != 4)
			return mcv_error_set(err, MCV_EUNSUPPORTED,
					     "clip.vision.projector.scale_factor %d (2 = 4x or 4 = 16x)", v->merge);
	}
	v->insert_layer = -1;
	if (mcv_gguf_find_key(g, "clip.vision.wa_layer_indexes") >= 0) {
		int et;
		uint64_t n;
		const void *d;
		if ((rc = mcv_gguf_get_arr(g, "clip.vision.wa_layer_indexes", &et, &n, &d, err)) < 0)
			return rc;
		if (n < 1 || (et != GGUF_I32 && et != GGUF_U32))
			return mcv_error_set(err, MCV_EFORMAT, "clip.vision.wa_layer_indexes: want one i32");
		v->insert_layer = ((const int32_t *)d)[0];
	}
	v->max_slices = 9;
	static const char *const slice_keys[] = {"clip.vision.max_slice_nums", "clip.minicpmv_max_slice_nums"};
	for (int i = 0; i < 2; i++)
		if (mcv_gguf_find_key(g, slice_keys[i]) >= 0 &&
		    (rc = get_u32(g, slice_keys[i], &v->max_slices, err)) < 0)
			return rc;
	for (int c = 0; c < 3; c++)
		v->mean[c] = v->std[c] = 0.5f;
	static const char *const nk[2] = {"clip.vision.image_mean", "clip.vision.image_std"};
	for (int k = 0; k < 2; k++) {
		if (mcv_gguf_find_key(g, nk[k]) < 0)
			continue;
		int et;
		uint64_t n;
		const void *d;
		if ((rc = mcv_gguf_get_arr(g, nk[k], &et, &n, &d, err)) < 0)
			return rc;
		if (et != GGUF_F32 || n != 3)
			return mcv_error_set(err, MCV_EFORMAT, "%s: want 3 f32", nk[k]);
		memcpy(k ? v->std : v->mean, d, sizeof(float) * 3);
	}
	return 0;
}

static int load_tensors(mcv_vision *v, mcv_error *err)
{
	const mcv_gguf *g = v->g;
	const int W = v->width, P = v->patch;
	int rc;
	/* patch embedding: conv weight [W][3][P][P] seen as W rows of 3*P*P */
	const mcv_gguf_tensor *t = mcv_gguf_find_tensor(g, "v.patch_embd.weight");
	if (!t)
		return mcv_error_set(err, MCV_ENOTFOUND, "tensor 'v.patch_embd.weight' is missing");
	if (t->ne[0] != P || t->ne[1] != P || t->ne[2] != 3 || t->ne[3] != W)
		return mcv_error_set(err, MCV_EFORMAT, "tensor 'v.patch_embd.weight' is not [%d, %d, 3, %d]", P, P, W);
	if (t->type != MCV_F32 && t->type != MCV_F16)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "tensor 'v.patch_embd.weight' must be f32 or f16");
	v->patch_w.data = t->data;
	v->patch_w.type = t->type;
	v->patch_w.ne0 = 3 * P * P;
	v->patch_w.ne1 = W;
	v->patch_w.rb = mcv_row_bytes(t->type, 3 * P * P);
	if ((rc = bind(g, &v->patch_b, "v.patch_embd.bias", W, 0, err)) < 0)
		return rc;
	t = mcv_gguf_find_tensor(g, "v.position_embd.weight");
	if (!t)
		return mcv_error_set(err, MCV_ENOTFOUND, "tensor 'v.position_embd.weight' is missing");
	int nb = (int)lround(sqrt((double)t->ne[1]));
	if (nb < 1 || (int64_t)nb * nb != t->ne[1])
		return mcv_error_set(err, MCV_EFORMAT, "v.position_embd.weight: %lld positions is not a square",
				     (long long)t->ne[1]);
	v->pos_buckets = nb;
	if ((rc = bind(g, &v->pos, "v.position_embd.weight", W, t->ne[1], err)) < 0)
		return rc;

	v->layers = calloc((size_t)v->n_layer, sizeof *v->layers);
	if (!v->layers)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	char pre[64];
	for (int il = 0; il < v->n_layer; il++) {
		mcv_vit_layer *L = &v->layers[il];
#define P_(s) (snprintf(pre, sizeof pre, "v.blk.%d.%s", il, s), pre)
		if ((rc = bind_ln(g, &L->ln1, P_("ln1"), W, err)) < 0 ||
		    (rc = bind_lin(g, &L->q, P_("attn_q"), W, W, err)) < 0 ||
		    (rc = bind_lin(g, &L->k, P_("attn_k"), W, W, err)) < 0 ||
		    (rc = bind_lin(g, &L->v, P_("attn_v"), W, W, err)) < 0 ||
		    (rc = bind_lin(g, &L->o, P_("attn_out"), W, W, err)) < 0 ||
		    (rc = bind_ln(g, &L->ln2, P_("ln2"), W, err)) < 0 ||
		    (rc = bind_lin(g, &L->up, P_("ffn_up"), W, v->ff, err)) < 0 ||
		    (rc = bind_lin(g, &L->down, P_("ffn_down"), v->ff, W, err)) < 0)
			return rc;
#undef P_
	}
	if ((rc = bind_ln(g, &v->post_ln, "v.post_ln", W, err)) < 0)
		return rc;
	/* the window-attention merger is optional (4x-only files) */
	v->has_merger = mcv_gguf_find_tensor(g, "v.vit_merger.attn_q.weight") != NULL;
	if (v->has_merger) {
		const mcv_gguf_tensor *u = mcv_gguf_find_tensor(g, "v.vit_merger.ds_ffn_up.weight");
		if (!u)
			return mcv_error_set(err, MCV_ENOTFOUND, "tensor 'v.vit_merger.ds_ffn_up.weight' is missing");
		v->merger_ff = (int)u->ne[1];
		mcv_merger *M = &v->merger;
		if ((rc = bind_ln(g, &M->ln1, "v.vit_merger.ln1", W, err)) < 0 ||
		    (rc = bind_lin(g, &M->q, "v.vit_merger.attn_q", W, W, err)) < 0 ||
		    (rc = bind_lin(g, &M->k, "v.vit_merger.attn_k", W, W, err)) < 0 ||
		    (rc = bind_lin(g, &M->v, "v.vit_merger.attn_v", W, W, err)) < 0 ||
		    (rc = bind_lin(g, &M->o, "v.vit_merger.attn_out", W, W, err)) < 0 ||
		    (rc = bind_ln(g, &M->ds_ln, "v.vit_merger.ds_ln", 4 * W, err)) < 0 ||
		    (rc = bind_lin(g, &M->ds_up, "v.vit_merger.ds_ffn_up", 4 * W, v->merger_ff, err)) < 0 ||
		    (rc = bind_lin(g, &M->ds_down, "v.vit_merger.ds_ffn_down", v->merger_ff, W, err)) < 0)
			return rc;
		if (v->insert_layer < 0 || v->insert_layer >= v->n_layer)
			return mcv_error_set(err, MCV_EFORMAT,
					     "clip.vision.wa_layer_indexes (%d) missing or outside the %d layers",
					     v->insert_layer, v->n_layer);
	} else if (v->merge == 4) {
		return mcv_error_set(err, MCV_ENOTFOUND,
				     "tensor 'v.vit_merger.attn_q.weight' is missing (needed for 16x compression)");
	}
	const mcv_gguf_tensor *u = mcv_gguf_find_tensor(g, "mm.up.weight");
	if (!u)
		return mcv_error_set(err, MCV_ENOTFOUND, "tensor 'mm.up.weight' is missing");
	v->proj_ff = (int)u->ne[1];
	if ((rc = bind_ln(g, &v->mm_norm, "mm.input_norm", 4 * W, err)) < 0 ||
	    (rc = bind_lin(g, &v->mm_up, "mm.up", 4 * W, v->proj_ff, err)) < 0 ||
	    (rc = bind_lin(g, &v->mm_down, "mm.down", v->proj_ff, v->n_proj, err)) < 0)
		return rc;
	return 0;
}

int mcv_vision_load(mcv_vision **out, const char *path, mcv_error *err)
{
	*out = NULL;
	mcv_vision *v = calloc(1, sizeof *v);
	if (!v)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	int rc = mcv_gguf_open(&v->g, path, err);
	if (rc == 0)
		rc = load_hparams(v, err);
	if (rc == 0)
		rc = load_tensors(v, err);
	if (rc == 0)
		rc = mcv_vision_fast_init(v, err);
	if (rc < 0) {
		if (v->g)
			mcv_error_prefix(err, "%s", path);
		mcv_vision_free(v);
		return rc;
	}
	*out = v;
	return 0;
}

void mcv_vision_free(mcv_vision *v)
{
	if (!v)
		return;
	mcv_vprof_report();
	mcv_vision_fast_free(v);
	free(v->layers);
	mcv_gguf_close(v->g);
	free(v);
}

/* ---- slicing (LLaVA-UHD, as the reference's slice_plan) ---- */

static int ensure_divide(int len, int m)
{
	/* std::round semantics: halves away from zero */
	int r = (int)floor((double)len / m + 0.5) * m;
	return r > m ? r : m;
}

/* float32 arithmetic as the reference (and mtmd) use, so boundary cases agree */
static void best_resize(int w, int h, int scale, int m, int allow_upscale, int *ow, int *oh)
{
	if ((int64_t)w * h > (int64_t)scale * scale || allow_upscale) {
		float r = (float)w / (float)h;
		h = (int)((float)scale / sqrtf(r));
		w = (int)((float)h * r);
	}
	*ow = ensure_divide(w, m);
	*oh = ensure_divide(h, m);
}

static void best_grid(int max_slices, int multiple, double log_ratio, int *gw, int *gh)
{
	int bw = 1, bh = 1;
	double best = INFINITY;
	for (int i = multiple - 1; i <= multiple + 1; i++) {
		if (i == 1 || i > max_slices)
			continue;
		for (int m = 1; m <= i; m++) {
			if (i % m)
				continue;
			double e = fabs(log_ratio - log((double)m / (double)(i / m)));
			if (e < best) {
				best = e;
				bw = m;
				bh = i / m;
			}
		}
	}
	*gw = bw;
	*gh = bh;
}

int mcv_vision_resolve(const mcv_vision *v, const mcv_vision_params *p, int *merge,
		       int *max_slices, mcv_error *err)
{
	int c = p ? p->compress : 0;
	if (c == 0)
		*merge = v->merge;
	else if (c == 16)
		*merge = 4;
	else if (c == 4)
		*merge = 2;
	else
		return mcv_error_set(err, MCV_EINVAL, "compression %d: use 4 or 16", c);
	if (*merge == 4 && !v->has_merger)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "16x compression needs the vit_merger tensors, which this mmproj lacks");
	int ms = p ? p->max_slices : 0;
	if (ms < 0 || ms > MCV_VISION_MAX_CROPS - 2)
		return mcv_error_set(err, MCV_EINVAL, "max slices %d: use 1..%d", ms, MCV_VISION_MAX_CROPS - 2);
	*max_slices = ms ? ms : v->max_slices;
	if (*max_slices > MCV_VISION_MAX_CROPS - 2)
		*max_slices = MCV_VISION_MAX_CROPS - 2;
	return 0;
}

int mcv_vision_plan_image(const mcv_vision *v, int w, int h, const mcv_vision_params *p,
			  mcv_vision_plan *plan, mcv_error *err)
{
	memset(plan, 0, sizeof *plan);
	int merge, ms, rc;
	if ((rc = mcv_vision_resolve(v, p, &merge, &ms, err)) < 0)
		return rc;
	if (w < 1 || h < 1 || w > 65535 || h > 65535)
		return mcv_error_set(err, MCV_EINVAL, "image size %dx%d out of range", w, h);
	if (p && p->upscale != 0 && p->upscale != 1) {
		if (!(p->upscale > 0 && p->upscale <= 4))
			return mcv_error_set(err, MCV_EINVAL, "upscale %g: use a factor in (0, 4]", p->upscale);
		/* rounded as the reference's model.scaled_size */
		w = (int)(w * p->upscale + 0.5);
		h = (int)(h * p->upscale + 0.5);
		w = w < 1 ? 1 : w;
		h = h < 1 ? 1 : h;
	}
	plan->compress = merge == 4 ? 16 : 4;
	const int m = v->patch * merge, S = v->image_size;
	if (merge == 2 && (int64_t)w * h <= (int64_t)S * S) {
		best_resize(w, h, S, m, 1, &plan->ov_w, &plan->ov_h);
	} else if (!(w > S || h > S)) {
		plan->ov_w = plan->ov_h = S;
	} else if (p && p->no_slices) {
		best_resize(w, h, S, m, 0, &plan->ov_w, &plan->ov_h);
	} else {
		best_resize(w, h, S, m, 0, &plan->ov_w, &plan->ov_h);
		const double log_ratio = (double)logf((float)w / (float)h);
		const float ratio = (float)w * (float)h / (float)(S * S);
		int multiple = (int)ceilf(ratio);
		if (multiple > ms)
			multiple = ms;
		best_grid(ms, multiple, log_ratio, &plan->cols, &plan->rows);
		const int rw = ensure_divide(w, plan->cols), rh = ensure_divide(h, plan->rows);
		int bw, bh;
		best_resize(rw / plan->cols, rh / plan->rows, S, m, 1, &bw, &bh);
		plan->ref_w = bw * plan->cols;
		plan->ref_h = bh * plan->rows;
	}
	plan->n_crops = 1 + plan->cols * plan->rows;
	for (int i = 0; i < plan->n_crops; i++) {
		const int cw = i ? plan->ref_w / plan->cols : plan->ov_w;
		const int ch = i ? plan->ref_h / plan->rows : plan->ov_h;
		if (cw % m || ch % m || cw / m < 1 || ch / m < 1)
			return mcv_error_set(err, MCV_EINVAL, "crop %dx%d is not a multiple of %d", cw, ch, m);
		plan->crop_w[i] = cw;
		plan->crop_h[i] = ch;
		plan->crop_nx[i] = cw / m;
		plan->crop_ny[i] = ch / m;
		plan->n_tokens += plan->crop_nx[i] * plan->crop_ny[i];
	}
	return 0;
}

int mcv_vision_crop_f32(const mcv_vision *v, const mcv_image *img, const mcv_vision_plan *plan,
			int i, float **chw, mcv_error *err)
{
	*chw = NULL;
	if (i < 0 || i >= plan->n_crops)
		return mcv_error_set(err, MCV_EINVAL, "crop %d of %d", i, plan->n_crops);
	const int cw = plan->crop_w[i], ch = plan->crop_h[i];
	float *out = malloc(sizeof(float) * 3 * (size_t)cw * ch);
	if (!out)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for a %dx%d crop", cw, ch);
	int rc;
	if (i == 0) {
		rc = mcv_image_resize_f32(img, cw, ch, MCV_RESIZE_BICUBIC, v->mean, v->std, out, err);
	} else {
		/* slices are cut from the whole image resized once, as the reference does */
		mcv_image big = {0}, piece = {0};
		rc = mcv_image_resize(img, plan->ref_w, plan->ref_h, MCV_RESIZE_BICUBIC, &big, err);
		if (rc == 0) {
			const int r = (i - 1) / plan->cols, c = (i - 1) % plan->cols;
			rc = mcv_image_crop(&big, c * cw, r * ch, cw, ch, &piece, err);
		}
		if (rc == 0)
			mcv_image_to_f32(&piece, v->mean, v->std, out);
		mcv_image_free(&piece);
		mcv_image_free(&big);
	}
	if (rc < 0) {
		free(out);
		return rc;
	}
	*chw = out;
	return 0;
}

int mcv_vision_crops_f32(const mcv_vision *v, const mcv_image *img, const mcv_vision_plan *plan,
			 float **chw, mcv_error *err)
{
	int rc = 0;
	for (int i = 0; i < plan->n_crops; i++)
		chw[i] = NULL;
	for (int i = 0; i < plan->n_crops && rc == 0; i++)
		chw[i] = malloc(sizeof(float) * 3 * (size_t)plan->crop_w[i] * plan->crop_h[i]);
	for (int i = 0; i < plan->n_crops && rc == 0; i++)
		if (!chw[i])
			rc = mcv_error_set(err, MCV_ENOMEM, "out of memory for the image crops");
	if (rc == 0)
		rc = mcv_image_resize_f32(img, plan->crop_w[0], plan->crop_h[0], MCV_RESIZE_BICUBIC,
					  v->mean, v->std, chw[0], err);
	if (rc == 0 && plan->n_crops > 1) {
		mcv_image big = {0}, piece = {0};
		rc = mcv_image_resize(img, plan->ref_w, plan->ref_h, MCV_RESIZE_BICUBIC, &big, err);
		for (int i = 1; i < plan->n_crops && rc == 0; i++) {
			const int cw = plan->crop_w[i], ch = plan->crop_h[i];
			const int r = (i - 1) / plan->cols, c = (i - 1) % plan->cols;
			rc = mcv_image_crop(&big, c * cw, r * ch, cw, ch, &piece, err);
			if (rc == 0)
				mcv_image_to_f32(&piece, v->mean, v->std, chw[i]);
			mcv_image_free(&piece);
		}
		mcv_image_free(&big);
	}
	if (rc < 0)
		for (int i = 0; i < plan->n_crops; i++) {
			free(chw[i]);
			chw[i] = NULL;
		}
	return rc;
}

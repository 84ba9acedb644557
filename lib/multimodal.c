/* Image blocks in a language-model context: markers, visual rows and their
 * canvas M-RoPE positions, as scripts/ref/chatfmt.py lays them out. */
#include "multimodal.h"
#include "model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Token embedding rows of the model, dequantized. */
static void embed_tokens(const mcv_ctx *ctx, const int32_t *tok, int n, float *out)
{
	const mcv_wt *te = &ctx->m->tok_embd;
	const int H = ctx->m->hp.n_embd;
	for (int i = 0; i < n; i++)
		mcv_dequantize_row(te->type, (const char *)te->data + (size_t)tok[i] * te->row_bytes,
				   out + (size_t)i * H, H);
}

int mcv_mm_eval_text(mcv_ctx *ctx, const int32_t *tokens, int n, int *pos, mcv_error *err)
{
	if (n <= 0)
		return mcv_error_set(err, MCV_EINVAL, "nothing to evaluate (n = %d)", n);
	/* no image so far: positions are the slots, the plain path is the same */
	if (*pos == mcv_ctx_pos(ctx)) {
		int rc = mcv_ctx_eval(ctx, tokens, n, err);
		if (rc == 0)
			*pos += n;
		return rc;
	}
	const int H = mcv_model_n_embd(ctx->m), V = mcv_model_n_vocab(ctx->m);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= V)
			return mcv_error_set(err, MCV_EINVAL, "token %d at %d is outside the vocabulary (%d)",
					     tokens[i], i, V);
	const int chunk = 256;
	float *e = malloc(sizeof(float) * (size_t)chunk * H);
	int32_t *p4 = malloc(sizeof(int32_t) * 4 * (size_t)chunk);
	int rc = 0;
	if (!e || !p4)
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
	for (int i0 = 0; i0 < n && rc == 0; i0 += chunk) {
		const int nt = n - i0 < chunk ? n - i0 : chunk;
		embed_tokens(ctx, tokens + i0, nt, e);
		for (int t = 0; t < nt; t++) {
			const int32_t p = *pos + i0 + t;
			p4[4 * t] = p4[4 * t + 1] = p4[4 * t + 2] = p;
			p4[4 * t + 3] = 0;
		}
		rc = mcv_ctx_eval_embd(ctx, e, p4, nt, err);
	}
	if (rc == 0)
		*pos += n;
	free(e);
	free(p4);
	return rc;
}

void mcv_mm_block_free(mcv_mm_block *b)
{
	free(b->tok);
	free(b->vis_index);
	free(b->pos4);
	free(b->embd);
	memset(b, 0, sizeof *b);
}

typedef struct builder {
	mcv_mm_block *b;
	int cap, pos;
	const mcv_tokenizer *tok;
	mcv_error *err;
} builder;

static int grow(builder *s, int more)
{
	mcv_mm_block *b = s->b;
	if (b->n + more <= s->cap)
		return 0;
	int cap = s->cap ? s->cap : 64;
	while (cap < b->n + more)
		cap *= 2;
	int32_t *t = realloc(b->tok, sizeof(int32_t) * cap);
	if (t)
		b->tok = t;
	int32_t *vi = realloc(b->vis_index, sizeof(int32_t) * cap);
	if (vi)
		b->vis_index = vi;
	int32_t *p = realloc(b->pos4, sizeof(int32_t) * 4 * cap);
	if (p)
		b->pos4 = p;
	if (!t || !vi || !p)
		return mcv_error_set(s->err, MCV_ENOMEM, "out of memory");
	s->cap = cap;
	return 0;
}

/* Text is tokenized piece by piece, as the reference's add_text does. */
static int add_text(builder *s, const char *text)
{
	int32_t *ids = NULL;
	int n = 0, cap = 0;
	int rc = mcv_tokenizer_encode(s->tok, text, strlen(text), true, &ids, &n, &cap, s->err);
	if (rc == 0)
		rc = grow(s, n);
	if (rc == 0) {
		mcv_mm_block *b = s->b;
		for (int i = 0; i < n; i++, b->n++) {
			b->tok[b->n] = ids[i];
			b->vis_index[b->n] = -1;
			int32_t *p4 = b->pos4 + 4 * b->n;
			p4[0] = p4[1] = p4[2] = s->pos++;
			p4[3] = 0;
		}
	}
	free(ids);
	return rc;
}

/* nx x ny visual rows at (t, h, w) = (p0, p0 + row, p0 + col); the crop
 * advances the position by max(nx, ny). */
static int add_crop(builder *s, int nx, int ny)
{
	int rc = grow(s, nx * ny);
	if (rc < 0)
		return rc;
	mcv_mm_block *b = s->b;
	const int p0 = s->pos;
	for (int r = 0; r < ny; r++)
		for (int c = 0; c < nx; c++, b->n++) {
			b->tok[b->n] = -1;
			b->vis_index[b->n] = b->n_visual++;
			int32_t *p4 = b->pos4 + 4 * b->n;
			p4[0] = p0;
			p4[1] = p0 + r;
			p4[2] = p0 + c;
			p4[3] = 0;
		}
	s->pos += nx > ny ? nx : ny;
	return 0;
}

int mcv_mm_build_image(mcv_mm_block *b, const mcv_tokenizer *tok, const mcv_vision *v,
		       const mcv_image *img, const mcv_vision_params *p, int image_id,
		       int pos, mcv_error *err)
{
	memset(b, 0, sizeof *b);
	int rc = mcv_vision_plan_image(v, img->w, img->h, p, &b->plan, err);
	if (rc < 0)
		return rc;
	const mcv_vision_plan *pl = &b->plan;
	b->n_embd = mcv_vision_n_embd(v);
	b->embd = malloc(sizeof(float) * (size_t)pl->n_tokens * b->n_embd);
	if (!b->embd)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for %d visual tokens", pl->n_tokens);
	float *chw[MCV_VISION_MAX_CROPS];
	if ((rc = mcv_vision_crops_f32(v, img, pl, chw, err)) < 0) {
		mcv_mm_block_free(b);
		return rc;
	}
	size_t off = 0;
	for (int i = 0; i < pl->n_crops && rc == 0; i++) {
		rc = mcv_vision_encode_crop(v, chw[i], pl->crop_w[i], pl->crop_h[i], p, b->embd + off, err);
		off += (size_t)pl->crop_nx[i] * pl->crop_ny[i] * b->n_embd;
	}
	for (int i = 0; i < pl->n_crops; i++)
		free(chw[i]);

	builder s = {b, 0, pos, tok, err};
	if (rc == 0 && image_id >= 0) {
		char idt[64];
		snprintf(idt, sizeof idt, "<image_id>%d</image_id>", image_id);
		rc = add_text(&s, idt);
	}
	if (rc == 0)
		rc = add_text(&s, "<image>");
	if (rc == 0)
		rc = add_crop(&s, pl->crop_nx[0], pl->crop_ny[0]);
	if (rc == 0)
		rc = add_text(&s, "</image>");
	for (int r = 0; r < pl->rows && rc == 0; r++) {
		for (int c = 0; c < pl->cols && rc == 0; c++) {
			const int i = 1 + r * pl->cols + c;
			rc = add_text(&s, "<slice>");
			if (rc == 0)
				rc = add_crop(&s, pl->crop_nx[i], pl->crop_ny[i]);
			if (rc == 0)
				rc = add_text(&s, "</slice>");
		}
		if (rc == 0 && r != pl->rows - 1)
			rc = add_text(&s, "\n");
	}
	if (rc == 0)
		rc = add_text(&s, "\n");
	if (rc < 0) {
		mcv_mm_block_free(b);
		return rc;
	}
	b->next_pos = s.pos;
	return 0;
}

/* A block fits the language model: its rows are H wide and its marker
 * tokens are in the vocabulary. */
static int check_block(const mcv_ctx *ctx, const mcv_mm_block *b, int H, mcv_error *err)
{
	if (b->n_embd != H)
		return mcv_error_set(err, MCV_EINVAL,
				     "vision projector outputs %d values per token but the language model's hidden size is %d",
				     b->n_embd, H);
	const int V = mcv_model_n_vocab(ctx->m);
	for (int i = 0; i < b->n; i++)
		if (b->tok[i] >= V)
			return mcv_error_set(err, MCV_EINVAL, "marker token %d outside the vocabulary", b->tok[i]);
	return 0;
}

int mcv_mm_eval_block(mcv_ctx *ctx, const mcv_mm_block *b, int *pos, mcv_error *err)
{
	const int H = mcv_model_n_embd(ctx->m);
	int rc = check_block(ctx, b, H, err);
	if (rc < 0)
		return rc;
	float *e = malloc(sizeof(float) * (size_t)b->n * H);
	if (!e)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for an image block of %d rows", b->n);
	for (int i = 0; i < b->n; i++) {
		if (b->tok[i] >= 0)
			embed_tokens(ctx, b->tok + i, 1, e + (size_t)i * H);
		else
			memcpy(e + (size_t)i * H, b->embd + (size_t)b->vis_index[i] * H, sizeof(float) * H);
	}
	rc = mcv_ctx_eval_embd(ctx, e, b->pos4, b->n, err);
	free(e);
	if (rc == 0)
		*pos = b->next_pos;
	return rc;
}

int mcv_mm_eval_image(mcv_ctx *ctx, const mcv_tokenizer *tok, const mcv_vision *v,
		      const mcv_image *img, const mcv_vision_params *p, int image_id,
		      int *pos, int *n_tokens, mcv_error *err)
{
	int rc = mcv_vision_check_text(v, mcv_model_n_embd(ctx->m), err);
	if (rc < 0)
		return rc;
	mcv_mm_block b;
	if ((rc = mcv_mm_build_image(&b, tok, v, img, p, image_id, *pos, err)) < 0)
		return rc;
	rc = mcv_mm_eval_block(ctx, &b, pos, err);
	if (rc == 0 && n_tokens)
		*n_tokens = b.n;
	mcv_mm_block_free(&b);
	return rc;
}

/* ---- a prefix evaluated in one call ---- */

void mcv_mm_rows_init(mcv_mm_rows *r, const mcv_ctx *ctx, int pos)
{
	memset(r, 0, sizeof *r);
	r->n_embd = mcv_model_n_embd(ctx->m);
	r->pos = pos;
}

void mcv_mm_rows_free(mcv_mm_rows *r)
{
	free(r->embd);
	free(r->pos4);
	memset(r, 0, sizeof *r);
}

static int rows_grow(mcv_mm_rows *r, int more, mcv_error *err)
{
	if (r->n + more <= r->cap)
		return 0;
	int cap = r->cap ? r->cap : 128;
	while (cap < r->n + more)
		cap *= 2;
	float *e = realloc(r->embd, sizeof(float) * (size_t)cap * r->n_embd);
	if (e)
		r->embd = e;
	int32_t *p = realloc(r->pos4, sizeof(int32_t) * 4 * (size_t)cap);
	if (p)
		r->pos4 = p;
	if (!e || !p)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for a prompt of %d rows", r->n + more);
	r->cap = cap;
	return 0;
}

int mcv_mm_rows_text(mcv_mm_rows *r, const mcv_ctx *ctx, const int32_t *tokens, int n, mcv_error *err)
{
	const int V = mcv_model_n_vocab(ctx->m);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= V)
			return mcv_error_set(err, MCV_EINVAL, "token %d at %d is outside the vocabulary (%d)",
					     tokens[i], i, V);
	int rc = rows_grow(r, n, err);
	if (rc < 0)
		return rc;
	embed_tokens(ctx, tokens, n, r->embd + (size_t)r->n * r->n_embd);
	for (int i = 0; i < n; i++, r->n++) {
		int32_t *p4 = r->pos4 + 4 * (size_t)r->n;
		p4[0] = p4[1] = p4[2] = r->pos++;
		p4[3] = 0;
	}
	return 0;
}

int mcv_mm_rows_block(mcv_mm_rows *r, const mcv_ctx *ctx, const mcv_mm_block *b, mcv_error *err)
{
	const int H = r->n_embd;
	int rc = check_block(ctx, b, H, err);
	if (rc < 0)
		return rc;
	rc = rows_grow(r, b->n, err);
	if (rc < 0)
		return rc;
	for (int i = 0; i < b->n; i++, r->n++) {
		float *e = r->embd + (size_t)r->n * H;
		if (b->tok[i] >= 0)
			embed_tokens(ctx, b->tok + i, 1, e);
		else
			memcpy(e, b->embd + (size_t)b->vis_index[i] * H, sizeof(float) * H);
		memcpy(r->pos4 + 4 * (size_t)r->n, b->pos4 + 4 * (size_t)i, sizeof(int32_t) * 4);
	}
	r->pos = b->next_pos;
	return 0;
}

int mcv_mm_rows_eval(mcv_ctx *ctx, mcv_mm_rows *r, int *pos, mcv_error *err)
{
	int rc = 0;
	if (r->n > 0)
		rc = mcv_ctx_eval_embd(ctx, r->embd, r->pos4, r->n, err);
	if (rc == 0)
		*pos = r->pos;
	r->n = 0;
	return rc;
}

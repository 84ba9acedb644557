#include "trace_rec.h"

#include "gguf.h"
#include "quant.h"
#include "trace.h"
#include "vision.h"

#include <stdlib.h>
#include <string.h>

struct trace_rec {
	mcv_ctx *c;
	mcv_trace_writer *w;
	const mcv_gguf_tensor *te; /* token_embd.weight */
	int H, n_layer;
	int64_t base;      /* trace index of position 0 of the current sequence */
	int64_t seq_end;   /* positions handed over in the current sequence */
	float *cur;        /* [rows][H]: state entering the next layer, per position */
	int64_t rows;
	int failed;        /* out of memory: stop recording, report at finish */
};

static float *row_at(trace_rec *r, int64_t pos)
{
	if (pos >= r->rows) {
		int64_t n = r->rows ? r->rows : 256;
		while (n <= pos)
			n *= 2;
		float *p = realloc(r->cur, sizeof(float) * (size_t)n * (size_t)r->H);
		if (!p) {
			r->failed = 1;
			return NULL;
		}
		r->cur = p;
		r->rows = n;
	}
	return r->cur + (size_t)pos * (size_t)r->H;
}

static void on_layer(void *user, int layer, int pos, const float *h, int n_embd)
{
	trace_rec *r = user;
	if (layer + 1 >= r->n_layer || r->failed || n_embd != r->H)
		return;
	float *dst = row_at(r, pos);
	if (dst)
		memcpy(dst, h, sizeof(float) * (size_t)r->H);
}

static void on_route(void *user, int layer, int pos, const int32_t *ids, const float *w, int k)
{
	trace_rec *r = user;
	(void)k;
	if (r->failed || pos >= r->rows)
		return;
	mcv_trace_writer_put(r->w, r->base + pos, layer, ids, w, r->cur + (size_t)pos * (size_t)r->H);
}

/* A new sequence starts when the context went back to position 0. */
static int64_t start_rows(trace_rec *r, int n)
{
	int64_t p = mcv_ctx_pos(r->c);
	if (p == 0 && r->seq_end > 0) {
		r->base += r->seq_end;
		r->seq_end = 0;
	}
	if (p + n > r->seq_end)
		r->seq_end = p + n;
	return p;
}

static void put_token(trace_rec *r, int64_t pos, int32_t id)
{
	float *dst = row_at(r, pos);
	if (!dst)
		return;
	if (id < 0 || id >= r->te->ne[1]) {
		memset(dst, 0, sizeof(float) * (size_t)r->H);
		return;
	}
	const size_t rb = (size_t)(r->te->nbytes / (uint64_t)r->te->ne[1]);
	mcv_dequantize_row(r->te->type, (const char *)r->te->data + (size_t)id * rb, dst, r->H);
}

void trace_rec_tokens(trace_rec *r, const int32_t *ids, int n)
{
	if (!r)
		return;
	int64_t p = start_rows(r, n);
	for (int i = 0; i < n; i++)
		put_token(r, p + i, ids[i]);
}

void trace_rec_block(trace_rec *r, const mcv_mm_block *b)
{
	if (!r)
		return;
	int64_t p = start_rows(r, b->n);
	for (int i = 0; i < b->n; i++) {
		if (b->tok[i] >= 0 || b->n_embd != r->H) {
			put_token(r, p + i, b->tok[i]);
			continue;
		}
		float *dst = row_at(r, p + i);
		if (dst)
			memcpy(dst, b->embd + (size_t)b->vis_index[i] * r->H, sizeof(float) * (size_t)r->H);
	}
}

int trace_rec_eval_image(trace_rec *r, mcv_ctx *ctx, const mcv_tokenizer *tok,
			 const mcv_vision *v, const mcv_image *img, const mcv_vision_params *p,
			 int image_id, int *pos, int *n_tokens, mcv_error *err)
{
	if (!r)
		return mcv_mm_eval_image(ctx, tok, v, img, p, image_id, pos, n_tokens, err);
	int rc = mcv_vision_check_text(v, r->H, err);
	if (rc < 0)
		return rc;
	mcv_mm_block b;
	if ((rc = mcv_mm_build_image(&b, tok, v, img, p, image_id, *pos, err)) < 0)
		return rc;
	trace_rec_block(r, &b);
	rc = mcv_mm_eval_block(ctx, &b, pos, err);
	if (rc == 0 && n_tokens)
		*n_tokens = b.n;
	mcv_mm_block_free(&b);
	return rc;
}

int trace_rec_open(trace_rec **out, const char *path, mcv_model *m, mcv_ctx *c, mcv_error *err)
{
	*out = NULL;
	const mcv_gguf *g = mcv_model_gguf(m);
	mcv_trace_model tm;
	int rc = mcv_trace_model_from_gguf(&tm, g, err);
	if (rc)
		return mcv_error_prefix(err, "--trace-routing");
	const mcv_gguf_tensor *te = mcv_gguf_find_tensor(g, "token_embd.weight");
	if (!te || te->ne[0] != tm.n_embd)
		return mcv_error_set(err, MCV_EFORMAT, "--trace-routing: the model has no usable token_embd.weight");
	trace_rec *r = calloc(1, sizeof *r);
	if (!r)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	r->c = c;
	r->te = te;
	r->H = (int)tm.n_embd;
	r->n_layer = tm.n_layer;
	if ((rc = mcv_trace_writer_open(&r->w, path, &tm, MCV_F16, err))) {
		free(r);
		return rc;
	}
	mcv_ctx_set_layer_hook(c, on_layer, r);
	mcv_ctx_set_route_hook(c, on_route, r);
	*out = r;
	return 0;
}

int trace_rec_finish(trace_rec *r, mcv_error *err)
{
	if (!r)
		return 0;
	mcv_ctx_set_layer_hook(r->c, NULL, NULL);
	mcv_ctx_set_route_hook(r->c, NULL, NULL);
	int rc;
	if (r->failed) {
		mcv_trace_writer_abort(r->w);
		rc = mcv_error_set(err, MCV_ENOMEM, "--trace-routing: out of memory");
	} else {
		rc = mcv_trace_writer_finish(r->w, err);
	}
	free(r->cur);
	free(r);
	return rc;
}

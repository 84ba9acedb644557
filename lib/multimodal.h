/* Feeding images into a language-model context, laid out as the reference's
 * chat formatting does (scripts/ref/chatfmt.py; the markers are llama.cpp
 * mtmd's for minicpmv, the differences are below):
 *
 *   <image>[overview]</image><slice>[s]</slice><slice>[s]</slice>\n<slice>...</slice>\n
 *
 * (rows of slices joined by "\n"; the block ends with "\n"; the caller then
 * evaluates the prompt text).  Marker tokens are text tokens; every visual
 * token row gets an M-RoPE position (t, h, w) = (p0, p0 + row, p0 + col)
 * where p0 is the position when its crop starts, and a crop advances the
 * position by max(nx, ny), a text token by one.
 *
 * So after an image the M-RoPE position no longer equals the number of
 * evaluated tokens (mcv_ctx_pos).  The caller therefore carries the next
 * position in an int (start it at mcv_ctx_pos(ctx), i.e. 0 on a fresh
 * context) and evaluates ALL text after an image, including generated
 * tokens, with mcv_mm_eval_text, which passes explicit positions.  Before
 * the first image mcv_mm_eval_text is exactly mcv_ctx_eval.  After
 * mcv_ctx_reset the position starts again at 0.
 *
 * Several images (mcv-run -i a.png -i b.png): each block as above, one
 * after the other on the canvas, each still prefixed "<image_id>k</image_id>"
 * (k counting stills from 0) when there are two or more; video frames have
 * no id and no slices.  This is the layout of the PyTorch reference
 * (scripts/ref/dump_vision.py chat, encode_multi) and of MiniCPM-V's own
 * processor for several images; test/vision-multi.bats checks mcv-run's
 * prompt against the reference's.  llama.cpp's mtmd (minicpmv4_6 and the
 * minicpmv 2.6-style versions, MTMD_SLICE_TMPL_MINICPMV_2_6) emits the same
 * <image>/<slice> markers and "\n" between slice rows, but (1) no
 * <image_id> for any number of images, (2) no "\n" after a block, and (3)
 * mtmd-cli puts the images after the prompt text unless the prompt holds
 * <__media__> markers.  We keep the reference's layout: the proving model
 * was trained on it, and numbered images are the form MiniCPM-V's Python
 * processors use for several images (use_image_id, in the 2.6 sources). */
#ifndef MCV_MULTIMODAL_H
#define MCV_MULTIMODAL_H

#include "image.h"
#include "mcv.h"
#include "model.h"
#include "tokenizer.h"
#include "vision.h"
#include <stdint.h>

/* Evaluate n text tokens at positions *pos .. *pos + n - 1; *pos += n.
 * Afterwards mcv_ctx_logits() holds the last token's logits. */
int mcv_mm_eval_text(mcv_ctx *ctx, const int32_t *tokens, int n, int *pos, mcv_error *err);

/* One image block built but not evaluated: n rows, each either a text token
 * (tok[i] >= 0) or a visual embedding (tok[i] == -1, row embd[i] of width
 * n_embd, only allocated for visual rows: embd + vis_index[i] * n_embd),
 * with its M-RoPE position pos4[i][4].  next_pos is the text position after
 * the block. */
typedef struct mcv_mm_block {
	int n, n_embd;
	int32_t *tok;       /* [n] */
	int32_t *vis_index; /* [n], -1 for text rows */
	int32_t *pos4;      /* [n][4] */
	float *embd;        /* [n_visual][n_embd] */
	int n_visual;
	int next_pos;
	mcv_vision_plan plan;
} mcv_mm_block;

/* Build the image block starting at position pos.  image_id >= 0 prefixes
 * "<image_id>N</image_id>" (for one of several stills, see above); pass -1
 * for a single image or a video frame (no id).  Markers are tokenized with
 * the tokenizer (special tokens parsed). */
int mcv_mm_build_image(mcv_mm_block *b, const mcv_tokenizer *tok, const mcv_vision *v,
		       const mcv_image *img, const mcv_vision_params *p, int image_id,
		       int pos, mcv_error *err);
void mcv_mm_block_free(mcv_mm_block *b);
/* Evaluate a built block (text runs with mcv_ctx_eval_embd rows of the
 * token embeddings, visual runs with their embeddings); *pos = next_pos. */
int mcv_mm_eval_block(mcv_ctx *ctx, const mcv_mm_block *b, int *pos, mcv_error *err);

/* Build + evaluate.  *pos: in, the next position (see above); out, the
 * position after the block.  *n_tokens (may be NULL): context slots used.
 * Fails (MCV_EINVAL) if the projector's width is not the model's n_embd,
 * MCV_EBUDGET if the context is too small. */
int mcv_mm_eval_image(mcv_ctx *ctx, const mcv_tokenizer *tok, const mcv_vision *v,
		      const mcv_image *img, const mcv_vision_params *p, int image_id,
		      int *pos, int *n_tokens, mcv_error *err);

/* A prompt prefix gathered as rows, text runs and built image blocks in
 * order, then evaluated in ONE call (one prefill instead of one per
 * segment: the same numbers, fewer synchronisations).  Start with
 * mcv_mm_rows_init at the next position (as for mcv_mm_eval_text), append,
 * evaluate; *pos then is the position after the last row. */
typedef struct mcv_mm_rows {
	int n, cap, n_embd;
	float *embd;     /* [n][n_embd] */
	int32_t *pos4;   /* [n][4] */
	int pos;         /* position of the next row */
} mcv_mm_rows;

void mcv_mm_rows_init(mcv_mm_rows *r, const mcv_ctx *ctx, int pos);
int mcv_mm_rows_text(mcv_mm_rows *r, const mcv_ctx *ctx, const int32_t *tokens, int n, mcv_error *err);
/* The block must have been built at r->pos (mcv_mm_build_image's pos). */
int mcv_mm_rows_block(mcv_mm_rows *r, const mcv_ctx *ctx, const mcv_mm_block *b, mcv_error *err);
/* Evaluates the rows (none: nothing happens), empties r; *pos = r->pos. */
int mcv_mm_rows_eval(mcv_ctx *ctx, mcv_mm_rows *r, int *pos, mcv_error *err);
void mcv_mm_rows_free(mcv_mm_rows *r);

#endif

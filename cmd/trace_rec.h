/* mcv-run --trace-routing: records, per evaluated row and MoE layer, the
 * router's choice and the residual stream entering the layer into a
 * lib/trace.h routing trace.
 *
 * The layer hook sees h after each layer, so the row's state after layer
 * l-1 is kept until the router of l fires; the state entering layer 0 is
 * the input embedding, which the caller hands over before each evaluation
 * (trace_rec_tokens / trace_rec_block).  Rows of successive sequences (a
 * batch, with a context reset in between) get consecutive trace indices.
 * Every function accepts r == NULL and then does nothing. */
#ifndef MCV_TRACE_REC_H
#define MCV_TRACE_REC_H

#include "mcv.h"
#include "model.h"
#include "multimodal.h"

typedef struct trace_rec trace_rec;

/* Opens PATH (hidden states in F16) and installs the hooks on c. */
int trace_rec_open(trace_rec **out, const char *path, mcv_model *m, mcv_ctx *c, mcv_error *err);
/* Before mcv_ctx_eval / mcv_mm_eval_text of n token ids. */
void trace_rec_tokens(trace_rec *r, const int32_t *ids, int n);
/* Before mcv_mm_eval_block of b. */
void trace_rec_block(trace_rec *r, const mcv_mm_block *b);
/* mcv_mm_eval_image, recording the block's rows first (r may be NULL). */
int trace_rec_eval_image(trace_rec *r, mcv_ctx *ctx, const mcv_tokenizer *tok,
			 const mcv_vision *v, const mcv_image *img, const mcv_vision_params *p,
			 int image_id, int *pos, int *n_tokens, mcv_error *err);
/* Removes the hooks, writes the trace, frees r (in every case). */
int trace_rec_finish(trace_rec *r, mcv_error *err);

#endif

/* Hugging Face MiniCPM-V 4.7 / Qwen3.5(-MoE) tensor names -> llama.cpp GGUF
 * names, with the transformations llama.cpp's convert_hf_to_gguf.py applies
 * for qwen35 / qwen35moe (Qwen3NextModel, _LinearAttentionVReorderBase):
 *   - RMSNorm weights are stored as 1 + w (not the DeltaNet output norm);
 *   - A_log becomes ssm_a = -exp(A_log); dt_bias becomes ssm_dt.bias;
 *   - conv1d [C, 1, K] is squeezed to [C, K] (GGUF ne [K, C]);
 *   - per-expert matrices are stacked into one 3-D tensor per layer, and a
 *     fused gate_up_proj [E, 2F, H] is split into gate and up;
 *   - DeltaNet value heads are reordered from grouped-by-key-head to tiled
 *     order (rows of the v part of in_proj_qkv, of in_proj_z, a, b, A_log,
 *     dt_bias, conv1d's v channels; columns of out_proj).
 * The mapping is pure: callers apply it row by row while streaming. */
#ifndef MCV_HFMAP_H
#define MCV_HFMAP_H

#include "mcv.h"
#include <stdint.h>

enum { MCV_HF_TEXT = 0, MCV_HF_VISION = 1, MCV_HF_SKIP = 2 };
enum { MCV_HF_OP_COPY = 0, MCV_HF_OP_ADD_ONE = 1, MCV_HF_OP_NEG_EXP = 2 };
/* Which axis holds DeltaNet value heads that must be reordered. */
enum {
	MCV_HF_RE_NONE = 0,
	MCV_HF_RE_ROWS_AFTER_QK = 1, /* in_proj_qkv: rows after 2*Dk, head dim dv */
	MCV_HF_RE_ROWS = 2,          /* in_proj_z: all rows, head dim dv */
	MCV_HF_RE_ROWS_1 = 3,        /* in_proj_a/b, A_log, dt_bias: head dim 1 */
	MCV_HF_RE_COLS = 4,          /* out_proj: columns, head dim dv */
	MCV_HF_RE_CONV = 5,          /* conv1d channels after 2*Dk, head dim dv */
};

typedef struct mcv_hf_target {
	char name[64]; /* GGUF tensor name (TEXT only) */
	int kind;      /* MCV_HF_TEXT / VISION / SKIP */
	int layer;     /* -1 for global tensors */
	int expert;    /* slice of a stacked expert tensor, or -1 */
	int split;     /* 0 whole; 1 / 2: first / second half of the rows of a fused gate_up */
	int fused;     /* 1: the source already holds all experts ([E, rows, cols]) */
	int op;        /* MCV_HF_OP_* applied to every element */
	int reorder;   /* MCV_HF_RE_* */
} mcv_hf_target;

typedef struct mcv_hf_dims {
	int n_k_heads, n_v_heads; /* linear_num_key_heads / linear_num_value_heads */
	int head_k_dim, head_v_dim;
} mcv_hf_dims;

/* Map one HF tensor name.  Returns 0 (t filled; kind VISION or SKIP means
 * the text model does not take it) or MCV_ENOTFOUND with a message naming
 * the tensor when the name is not one the converter knows. */
int mcv_hfmap_name(const char *hf, mcv_hf_target *t, mcv_error *err);

/* V-head reordering: the source index along the reordered axis for output
 * index i (n = length of that axis).  Identity when reorder is NONE or the
 * key and value head counts are equal. */
int64_t mcv_hfmap_src_index(int reorder, const mcv_hf_dims *d, int64_t i, int64_t n);

/* Apply op to n floats in place. */
void mcv_hfmap_apply_op(int op, float *x, int64_t n);

#endif

/* Internals of the language model shared by model.c (load), forward.c (the
 * layer loop) and the per-block files (attention.c, deltanet.c, moe.c,
 * rope.c, norm.c).  Not part of the public API. */
#ifndef MCV_MODEL_IMPL_H
#define MCV_MODEL_IMPL_H

#include "les.h"
#include "model.h"
#include "quant.h"
#include <stddef.h>
#include <stdint.h>

/* One tensor bound from the mapping: weights are never copied. */
typedef struct mcv_wt {
	const void *data;   /* NULL: absent (optional tensor) */
	int type;
	int64_t ne[4];
	size_t row_bytes;   /* bytes of one ne[0] row */
	/* the rows repacked for the prefill GEMM (prefill.c), or NULL */
	const struct mcv_vgemm_w *pk;
} mcv_wt;

typedef struct mcv_layer {
	int recurrent;      /* 1: Gated DeltaNet, 0: full attention */
	mcv_wt attn_norm, post_norm;
	/* full attention: wqkv (fused, optional) or wq/wk/wv */
	mcv_wt wq, wk, wv, wqkv, wo, q_norm, k_norm;
	/* Gated DeltaNet */
	mcv_wt ssm_qkv, ssm_gate, ssm_conv, ssm_dt, ssm_a, ssm_beta, ssm_alpha,
	       ssm_norm, ssm_out;
	/* MoE */
	mcv_wt gate_inp, gate_exps, up_exps, gate_up_exps, down_exps;
	mcv_wt gate_inp_shexp, gate_shexp, up_shexp, down_shexp;
	/* dense FFN (qwen35) */
	mcv_wt ffn_gate, ffn_up, ffn_down;
	int kv_index;       /* slot in the KV cache (attention layers), else -1 */
	int rs_index;       /* slot in the recurrent state (DeltaNet), else -1 */
} mcv_layer;

typedef struct mcv_hparams {
	int moe;            /* qwen35moe */
	int n_embd, n_layer, n_vocab, n_ctx_train;
	float eps;
	int n_head, n_head_kv, head_dim, n_rot;
	float rope_base;
	int rope_sections[4];
	/* DeltaNet */
	int ssm_k;          /* conv kernel */
	int ssm_nk, ssm_nv, ssm_dk, ssm_dv; /* key heads, value heads, head dims */
	int ssm_dkey, ssm_dval, ssm_conv_ch; /* nk*dk, nv*dv, 2*Dk + Dv */
	/* FFN */
	int n_ff;           /* dense */
	int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
	int n_attn_layers, n_rec_layers;
} mcv_hparams;

struct mcv_model {
	mcv_gguf *gguf;
	char arch[16];
	mcv_hparams hp;
	mcv_wt tok_embd, output_norm, output;
	mcv_layer *layers;
	int n_threads;
	/* Experts are addressed by (layer, expert) through the layout, which
	 * covers stacked, fused gate_up and packed (per-expert) files. */
	struct mcv_layout *layout;  /* qwen35moe only */
	mcv_les_params les;         /* les.mem > 0: budget mode (les.c) */
	uint64_t tok_embd_off;      /* file offset of token_embd (budget mode reads rows) */
	struct mcv_vgemm_w *packs;  /* prefill.c: repacked matrices (mcv_wt.pk), n_packs */
	int n_packs;
};

/* Activation row converted once for every matrix that reads it (decode):
 * one buffer per vec_dot_type, filled on first use. */
typedef struct mcv_act {
	const float *x;
	int64_t n;
	unsigned valid;     /* bit per slot below */
	void *buf[4];       /* Q8_0, Q8_K, F16, BF16 */
} mcv_act;

struct mcv_ctx {
	mcv_model *m;
	int n_ctx, n_batch, pos;
	int n_threads;
	/* caches */
	uint16_t *kcache, *vcache;  /* [n_attn][n_ctx][n_head_kv*head_dim] fp16 */
	float *conv_state;          /* [n_rec][ssm_k-1][conv_ch] */
	float *ssm_state;           /* [n_rec][nv][dv][dk]: row j (value) over i (key) */
	/* scratch, sized for n_batch tokens */
	float *x, *xn, *y;          /* [nb][H] */
	float *big[4];              /* [nb][max projection width] */
	float *small0, *small1;     /* [nb][max(E, nv, 1)] */
	float *scores;              /* [threads][score_stride]: attention scratch */
	size_t score_stride;        /* n_ctx + 16 + 64 * head_dim floats */
	int n_thr_scores;           /* threads that scores has rows for */
	float *eo;                  /* [nb][K][H] routed expert outputs */
	float *xg;                  /* [nb][H] rows gathered for one expert */
	int32_t *sel;               /* [nb][K] */
	float *selw;                /* [nb][K] */
	int32_t *tok_list;          /* [nb*K] token ids per expert group */
	int32_t *slot_list;
	int32_t *pos4;              /* [nb][4] */
	mcv_act act;                /* the block input xn (decode) */
	mcv_act act2;               /* an inner activation, e.g. an expert's hidden */
	float *logits;              /* [V] */
	mcv_layer_hook_fn layer_hook; /* mcv_ctx_set_layer_hook */
	void *layer_hook_user;
	mcv_route_hook_fn route_hook; /* mcv_ctx_set_route_hook */
	void *route_hook_user;
	mcv_route_override_fn route_override; /* mcv_ctx_set_route_override */
	void *route_override_user;
	struct mcv_les *les;        /* budget mode: the expert cache and its I/O */
	int les_rc;                 /* first failure inside a layer (a read), 0 */
	mcv_error les_err;
	unsigned char *embd_row;    /* budget mode: one token_embd row read from the file */
	struct mcv_prefill *pf;     /* prefill.c's scratch, made on first use */
	double row_bytes;           /* weight bytes one evaluated row reads (forward.c) */
};

/* les.c: the graph's side of the expert cache.  layer_start before each
 * layer (x = the rows entering it) queues predicted reads; moe.c then
 * declares the experts the router chose (need), takes them as they become
 * ready (next: count written to ids, 0 when all were handed out, < 0 on a
 * read failure), reads their weights and releases them once computed. */
int mcv_les_init(mcv_les **out, mcv_model *m, uint64_t ctx_bytes, mcv_error *err);
void mcv_les_free(mcv_les *s);
void mcv_les_layer_start(mcv_les *s, int il, const float *x, int nt, int pos);
void mcv_les_need(mcv_les *s, int il, const int *ids, int n);
int mcv_les_next(mcv_les *s, int *ids, mcv_error *err);
void mcv_les_weights(mcv_les *s, int il, int e, const void *p[3]);
void mcv_les_release(mcv_les *s, const int *ids, int n);
void mcv_les_layer_end(mcv_les *s, int il);
int mcv_les_read_row(mcv_les *s, uint64_t off, size_t n, void *dst, mcv_error *err);

/* norm.c */
void mcv_rms_norm(float *y, const float *x, const float *w, int n, float eps);
void mcv_l2_norm(float *y, const float *x, int n, float eps);
float mcv_silu(float x);
/* y[i] = mcv_silu(x[i]) over an array (y may be x) */
void mcv_silu_vec(float *y, const float *x, size_t n);
/* y[i] = exp(x[i] - mx) (y may be x); returns their sum */
double mcv_exp_shifted(float *y, const float *x, int n, float mx);
float mcv_sigmoid(float x);
float mcv_softplus(float x);

/* rope.c: interleaved M-RoPE.  mcv_rope_cache fills cs[n_rot] with
 * (cos, sin) per rotated pair for one token's (t, h, w, e) position;
 * mcv_rope_apply rotates the first n_rot dims of one head in place with
 * NEOX pairing (i, i + n_rot/2); the rest of the head is left as is. */
void mcv_rope_cache(float *cs, int n_rot, const int32_t pos[4],
		    const int sections[4], float base);
void mcv_rope_apply(float *x, int n_rot, const float *cs);

/* Matrix products over a bound tensor.  mcv_wt_mm: Y[m][rows] = X[m][n] W^T
 * using rows [row0, row0 + nrows) of W.  With m == 1 and act non-NULL the
 * converted activation is reused. */
void mcv_wt_mm(const mcv_wt *w, int64_t row0, int64_t nrows, const float *X,
	       int64_t m, float *Y, mcv_act *act);
/* the same for a routed expert (F32: row by row, as llama.cpp) */
void mcv_wt_mm_expert(const mcv_wt *w, int64_t row0, int64_t nrows, const float *X, int64_t m, float *Y,
		      mcv_act *act);
void mcv_act_set(mcv_act *a, const float *x, int64_t n);

/* blocks: each takes xn[nt][H] (normed input) and writes out[nt][H]. */
/* Their steps over a range (lib/prefill.c shares them out among the
 * threads of one parallel region; the old forms run them in OpenMP loops),
 * so that every element is computed by the same operations either way. */
void mcv_deltanet_conv(mcv_ctx *c, const mcv_layer *L, int nt, const float *qkv, float *cv, int ch0, int ch1);
void mcv_deltanet_gates(mcv_ctx *c, const mcv_layer *L, float *cv, float *beta, float *alpha, int t0, int t1);
void mcv_deltanet_scan(mcv_ctx *c, const mcv_layer *L, int nt, const float *cv, const float *beta,
		       const float *alpha, const float *z, float *o, int h0, int h1);
float mcv_delta_row(float *S, const float *k, const float *q, float decay, float v, float b, int dk);
void mcv_attn_prep(mcv_ctx *c, const mcv_layer *L, int slot0, float *Q, float *K, const float *V,
		   int t0, int t1);
void mcv_attn_head(mcv_ctx *c, const mcv_layer *L, int slot0, const float *Q, float *O, int t, int h, int nt,
		   float *sc);
void mcv_swiglu(float *g, const float *u, size_t n);
void mcv_moe_route(const mcv_hparams *hp, float *p, int32_t *sel, float *w);
/* Expert e's gate, up and down matrices and each one's first row. */
void mcv_moe_expert_weights(const mcv_model *m, const mcv_layer *L, int e, mcv_wt w[3], int64_t r0[3]);

/* prefill.c: the layers of an nt-row evaluation in one parallel region
 * (c->x and c->pos4 filled, as run_layers).  Returns 0, or -1 when this
 * evaluation is not one it handles (the caller runs the per-block forms). */
int mcv_prefill_layers(mcv_ctx *c, int nt);
/* At context creation: its scratch for nthr threads, touched. */
void mcv_prefill_prepare(mcv_ctx *c, int nthr);
/* At load: repack the Q8_0/Q4_0 matrices of a small resident MoE model for
 * the prefill GEMM (sets mcv_wt.pk; a no-op for big models, a budget, or
 * a build without VNNI); mcv_prefill_unpack frees them. */
void mcv_prefill_pack(mcv_model *m);
void mcv_prefill_unpack(mcv_model *m);
/* The price in microseconds of one barrier of prefill.c's region. */
double mcv_prefill_barrier_us(int n);
void mcv_prefill_free(struct mcv_prefill *p);
void mcv_attn_forward(mcv_ctx *c, const mcv_layer *L, int nt, int slot0);
void mcv_deltanet_forward(mcv_ctx *c, const mcv_layer *L, int nt);
void mcv_moe_forward(mcv_ctx *c, const mcv_layer *L, int nt);
/* Counting sort of the (token, slot) pairs of c->sel by expert (moe.c). */
int mcv_moe_group_by_expert(mcv_ctx *c, int nt, int *start, int *fill, int *ids);
void mcv_ffn_forward(mcv_ctx *c, const mcv_layer *L, int nt);

#endif

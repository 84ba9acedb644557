/* HF -> GGUF tensor names and transforms (see hfmap.h). */
#include "hfmap.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const text_prefixes[] = {
	"model.language_model.", "language_model.model.", "llm.model.", "model.", NULL,
};
static const char *const vision_prefixes[] = {
	"model.visual.", "visual.", "vpm.", "resampler.", "model.vision_tower.", "vision_tower.",
	"model.vpm.", "model.resampler.", "model.merger.", NULL,
};

static const char *strip(const char *s, const char *p)
{
	size_t n = strlen(p);
	return strncmp(s, p, n) ? NULL : s + n;
}

typedef struct rule {
	const char *hf;   /* suffix after "layers.N." */
	const char *gguf; /* after "blk.N." */
	int op, reorder;
} rule;

static const rule layer_rules[] = {
	{ "input_layernorm.weight", "attn_norm.weight", MCV_HF_OP_ADD_ONE, 0 },
	{ "post_attention_layernorm.weight", "post_attention_norm.weight", MCV_HF_OP_ADD_ONE, 0 },
	{ "self_attn.q_proj.weight", "attn_q.weight", 0, 0 },
	{ "self_attn.k_proj.weight", "attn_k.weight", 0, 0 },
	{ "self_attn.v_proj.weight", "attn_v.weight", 0, 0 },
	{ "self_attn.o_proj.weight", "attn_output.weight", 0, 0 },
	{ "self_attn.q_norm.weight", "attn_q_norm.weight", MCV_HF_OP_ADD_ONE, 0 },
	{ "self_attn.k_norm.weight", "attn_k_norm.weight", MCV_HF_OP_ADD_ONE, 0 },
	{ "linear_attn.in_proj_qkv.weight", "attn_qkv.weight", 0, MCV_HF_RE_ROWS_AFTER_QK },
	{ "linear_attn.in_proj_z.weight", "attn_gate.weight", 0, MCV_HF_RE_ROWS },
	{ "linear_attn.in_proj_b.weight", "ssm_beta.weight", 0, MCV_HF_RE_ROWS_1 },
	{ "linear_attn.in_proj_a.weight", "ssm_alpha.weight", 0, MCV_HF_RE_ROWS_1 },
	{ "linear_attn.conv1d.weight", "ssm_conv1d.weight", 0, MCV_HF_RE_CONV },
	{ "linear_attn.A_log", "ssm_a", MCV_HF_OP_NEG_EXP, MCV_HF_RE_ROWS_1 },
	{ "linear_attn.dt_bias", "ssm_dt.bias", 0, MCV_HF_RE_ROWS_1 },
	{ "linear_attn.norm.weight", "ssm_norm.weight", 0, 0 }, /* no 1 + w */
	{ "linear_attn.out_proj.weight", "ssm_out.weight", 0, MCV_HF_RE_COLS },
	{ "mlp.gate.weight", "ffn_gate_inp.weight", 0, 0 },
	{ "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", 0, 0 },
	{ "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", 0, 0 },
	{ "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", 0, 0 },
	{ "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", 0, 0 },
	{ "mlp.gate_proj.weight", "ffn_gate.weight", 0, 0 },
	{ "mlp.up_proj.weight", "ffn_up.weight", 0, 0 },
	{ "mlp.down_proj.weight", "ffn_down.weight", 0, 0 },
	{ NULL, NULL, 0, 0 },
};

static int unknown(const char *hf, mcv_error *err)
{
	return mcv_error_set(err, MCV_ENOTFOUND, "tensor '%s' has no llama.cpp name (not a Qwen3.5 / MiniCPM-V 4.7 tensor?)", hf);
}

int mcv_hfmap_name(const char *hf, mcv_hf_target *t, mcv_error *err)
{
	memset(t, 0, sizeof *t);
	t->layer = -1;
	t->expert = -1;
	for (int i = 0; vision_prefixes[i]; i++)
		if (strip(hf, vision_prefixes[i])) {
			t->kind = MCV_HF_VISION;
			return 0;
		}
	if (strstr(hf, "mtp.") == hf || strstr(hf, ".mtp.")) {
		t->kind = MCV_HF_SKIP; /* the multi-token-prediction block is not converted */
		return 0;
	}
	if (!strcmp(hf, "lm_head.weight") || !strcmp(hf, "llm.lm_head.weight") ||
	    !strcmp(hf, "model.language_model.lm_head.weight") || !strcmp(hf, "language_model.lm_head.weight")) {
		strcpy(t->name, "output.weight");
		return 0;
	}
	const char *s = NULL;
	for (int i = 0; text_prefixes[i] && !s; i++)
		s = strip(hf, text_prefixes[i]);
	if (!s)
		return unknown(hf, err);
	if (!strcmp(s, "embed_tokens.weight")) {
		strcpy(t->name, "token_embd.weight");
		return 0;
	}
	if (!strcmp(s, "norm.weight")) {
		strcpy(t->name, "output_norm.weight");
		t->op = MCV_HF_OP_ADD_ONE;
		return 0;
	}
	int layer, used = 0;
	if (sscanf(s, "layers.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer > 9999)
		return unknown(hf, err);
	const char *r = s + used;
	t->layer = layer;
	for (int i = 0; layer_rules[i].hf; i++)
		if (!strcmp(r, layer_rules[i].hf)) {
			snprintf(t->name, sizeof t->name, "blk.%d.%s", layer, layer_rules[i].gguf);
			t->op = layer_rules[i].op;
			t->reorder = layer_rules[i].reorder;
			return 0;
		}
	/* experts: per-expert "mlp.experts.E.{gate,up,down}_proj.weight" or fused
	 * "mlp.experts.{gate_up,down}_proj[.weight]" */
	const char *e = strip(r, "mlp.experts.");
	if (!e)
		return unknown(hf, err);
	static const char *const w[] = { "gate_proj", "up_proj", "down_proj" };
	static const char *const g[] = { "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps" };
	int ex, n2 = 0;
	if (sscanf(e, "%d.%n", &ex, &n2) == 1 && n2 > 0) {
		if (ex < 0 || ex > 65535)
			return unknown(hf, err);
		for (int k = 0; k < 3; k++) {
			char want[32];
			snprintf(want, sizeof want, "%s.weight", w[k]);
			if (!strcmp(e + n2, want)) {
				snprintf(t->name, sizeof t->name, "blk.%d.%s.weight", layer, g[k]);
				t->expert = ex;
				return 0;
			}
		}
		return unknown(hf, err);
	}
	if (!strcmp(e, "down_proj") || !strcmp(e, "down_proj.weight")) {
		snprintf(t->name, sizeof t->name, "blk.%d.ffn_down_exps.weight", layer);
		t->fused = 1;
		return 0;
	}
	/* the caller maps gate_up twice: split 1 (gate) and split 2 (up) */
	if (!strcmp(e, "gate_up_proj") || !strcmp(e, "gate_up_proj.weight")) {
		snprintf(t->name, sizeof t->name, "blk.%d.ffn_gate_exps.weight", layer);
		t->fused = 1;
		t->split = 1;
		return 0;
	}
	return unknown(hf, err);
}

int64_t mcv_hfmap_src_index(int reorder, const mcv_hf_dims *d, int64_t i, int64_t n)
{
	if (reorder == MCV_HF_RE_NONE || d->n_k_heads <= 0 || d->n_v_heads <= d->n_k_heads ||
	    d->n_v_heads % d->n_k_heads)
		return i;
	int64_t nk = d->n_k_heads, per = d->n_v_heads / d->n_k_heads;
	int64_t hd = reorder == MCV_HF_RE_ROWS_1 ? 1 : d->head_v_dim;
	int64_t base = 0;
	if (reorder == MCV_HF_RE_ROWS_AFTER_QK || reorder == MCV_HF_RE_CONV)
		base = 2 * (int64_t)d->n_k_heads * d->head_k_dim;
	if (i < base || n - base != d->n_v_heads * hd)
		return i;
	/* tiled output (j, g, c) comes from grouped input (g, j, c) */
	int64_t o = i - base, c = o % hd, jg = o / hd, j = jg / nk, gk = jg % nk;
	return base + (gk * per + j) * hd + c;
}

void mcv_hfmap_apply_op(int op, float *x, int64_t n)
{
	if (op == MCV_HF_OP_ADD_ONE)
		for (int64_t i = 0; i < n; i++)
			x[i] += 1.0f;
	else if (op == MCV_HF_OP_NEG_EXP)
		for (int64_t i = 0; i < n; i++)
			x[i] = -expf(x[i]);
}

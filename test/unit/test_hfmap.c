/* HF -> GGUF names and transforms, checked against what llama.cpp's
 * convert_hf_to_gguf.py does for Qwen3.5-MoE (the reorder is recomputed
 * here independently, as the Python reshape/permute it restates). */
#include "hfmap.h"
#include "unit.h"

#include <math.h>
#include <string.h>

static void name_is(const char *hf, const char *want, int op, int reorder)
{
	mcv_hf_target t;
	mcv_error e = { 0 };
	int rc = mcv_hfmap_name(hf, &t, &e);
	CHECK(rc == 0 && t.kind == MCV_HF_TEXT && !strcmp(t.name, want) && t.op == op && t.reorder == reorder,
	      "%s -> '%s' op %d re %d (rc %d %s), want %s", hf, t.name, t.op, t.reorder, rc, e.msg, want);
}

/* grouped (nk, per, hd) -> tiled (per, nk, hd), as torch reshape + swap */
static int64_t python_perm(int64_t o, int nk, int per, int hd)
{
	int64_t c = o % hd, j = (o / hd) / nk, g = (o / hd) % nk;
	return (g * per + j) * hd + c;
}

int main(void)
{
	name_is("model.language_model.embed_tokens.weight", "token_embd.weight", 0, 0);
	name_is("model.embed_tokens.weight", "token_embd.weight", 0, 0);
	name_is("lm_head.weight", "output.weight", 0, 0);
	name_is("model.norm.weight", "output_norm.weight", MCV_HF_OP_ADD_ONE, 0);
	name_is("model.layers.3.input_layernorm.weight", "blk.3.attn_norm.weight", MCV_HF_OP_ADD_ONE, 0);
	name_is("model.language_model.layers.12.post_attention_layernorm.weight", "blk.12.post_attention_norm.weight", MCV_HF_OP_ADD_ONE, 0);
	name_is("model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight", MCV_HF_OP_ADD_ONE, 0);
	name_is("model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight", 0, 0);
	name_is("model.layers.0.linear_attn.norm.weight", "blk.0.ssm_norm.weight", 0, 0);
	name_is("model.layers.0.linear_attn.A_log", "blk.0.ssm_a", MCV_HF_OP_NEG_EXP, MCV_HF_RE_ROWS_1);
	name_is("model.layers.0.linear_attn.dt_bias", "blk.0.ssm_dt.bias", 0, MCV_HF_RE_ROWS_1);
	name_is("model.layers.0.linear_attn.in_proj_qkv.weight", "blk.0.attn_qkv.weight", 0, MCV_HF_RE_ROWS_AFTER_QK);
	name_is("model.layers.0.linear_attn.in_proj_z.weight", "blk.0.attn_gate.weight", 0, MCV_HF_RE_ROWS);
	name_is("model.layers.0.linear_attn.out_proj.weight", "blk.0.ssm_out.weight", 0, MCV_HF_RE_COLS);
	name_is("model.layers.0.linear_attn.conv1d.weight", "blk.0.ssm_conv1d.weight", 0, MCV_HF_RE_CONV);
	name_is("model.layers.1.mlp.gate.weight", "blk.1.ffn_gate_inp.weight", 0, 0);
	name_is("model.layers.1.mlp.shared_expert_gate.weight", "blk.1.ffn_gate_inp_shexp.weight", 0, 0);
	name_is("model.layers.1.mlp.shared_expert.down_proj.weight", "blk.1.ffn_down_shexp.weight", 0, 0);
	name_is("model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight", 0, 0);

	mcv_hf_target t;
	mcv_error e = { 0 };
	CHECK(!mcv_hfmap_name("model.layers.7.mlp.experts.5.up_proj.weight", &t, &e) &&
	      !strcmp(t.name, "blk.7.ffn_up_exps.weight") && t.expert == 5 && !t.fused, "per-expert up");
	CHECK(!mcv_hfmap_name("model.layers.7.mlp.experts.gate_up_proj", &t, &e) &&
	      !strcmp(t.name, "blk.7.ffn_gate_exps.weight") && t.fused && t.split == 1, "fused gate_up");
	CHECK(!mcv_hfmap_name("model.layers.7.mlp.experts.down_proj", &t, &e) &&
	      !strcmp(t.name, "blk.7.ffn_down_exps.weight") && t.fused, "fused down");
	CHECK(!mcv_hfmap_name("model.visual.blocks.0.attn.qkv.weight", &t, &e) && t.kind == MCV_HF_VISION, "vision");
	CHECK(!mcv_hfmap_name("mtp.layers.0.mlp.gate.weight", &t, &e) && t.kind == MCV_HF_SKIP, "mtp");
	CHECK(mcv_hfmap_name("model.layers.1.mlp.bogus.weight", &t, &e) == MCV_ENOTFOUND &&
	      strstr(e.msg, "model.layers.1.mlp.bogus.weight"), "unmappable: %s", e.msg);
	CHECK(mcv_hfmap_name("foo.bar", &t, &e) == MCV_ENOTFOUND, "unmappable prefix");
	CHECK(mcv_hfmap_name("model.layers.x.input_layernorm.weight", &t, &e) == MCV_ENOTFOUND, "bad layer");
	CHECK(mcv_hfmap_name("model.layers.1.mlp.experts.3.bogus.weight", &t, &e) == MCV_ENOTFOUND, "bad expert part");

	/* reorder: nk 2, nv 6 (3 per key head), dk 4, dv 5 */
	mcv_hf_dims d = { .n_k_heads = 2, .n_v_heads = 6, .head_k_dim = 4, .head_v_dim = 5 };
	int64_t base = 2 * 2 * 4, nvd = 6 * 5;
	int ok = 1, seen[64] = { 0 };
	for (int64_t i = 0; i < base + nvd; i++) {
		int64_t s = mcv_hfmap_src_index(MCV_HF_RE_ROWS_AFTER_QK, &d, i, base + nvd);
		int64_t want = i < base ? i : base + python_perm(i - base, 2, 3, 5);
		ok &= s == want;
		if (s >= 0 && s < 64) seen[s]++;
	}
	for (int64_t i = 0; i < base + nvd; i++)
		ok &= seen[i] == 1;
	CHECK(ok, "qkv rows are a permutation matching the Python reorder");
	ok = 1;
	for (int64_t i = 0; i < 6; i++)
		ok &= mcv_hfmap_src_index(MCV_HF_RE_ROWS_1, &d, i, 6) == python_perm(i, 2, 3, 1);
	CHECK(ok, "head-dim-1 reorder");
	CHECK(mcv_hfmap_src_index(MCV_HF_RE_ROWS_1, &d, 1, 6) == 3, "tiled index 1 is group 1's first head");
	ok = 1;
	for (int64_t i = 0; i < nvd; i++)
		ok &= mcv_hfmap_src_index(MCV_HF_RE_COLS, &d, i, nvd) == python_perm(i, 2, 3, 5);
	CHECK(ok, "out_proj columns");
	mcv_hf_dims same = { 2, 2, 4, 5 };
	CHECK(mcv_hfmap_src_index(MCV_HF_RE_ROWS, &same, 7, 10) == 7, "no reorder when nk == nv");

	float x[3] = { 0, 1, -2 };
	mcv_hfmap_apply_op(MCV_HF_OP_NEG_EXP, x, 3);
	CHECK(x[0] == -1.0f && fabsf(x[1] + expf(1)) < 1e-6f && fabsf(x[2] + expf(-2)) < 1e-7f, "neg exp");
	mcv_hfmap_apply_op(MCV_HF_OP_ADD_ONE, x, 3);
	CHECK(x[0] == 0.0f, "add one");
	return unit_done("test_hfmap");
}

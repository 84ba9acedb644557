/* llama.cpp's fixed recipes (src/llama-quant.cpp, llama_tensor_get_type),
 * restated for the ftypes mcv offers.  Rules that only concern other
 * architectures (Falcon, the 70B llama) or IQ types are left out; the
 * n_expert == 8 rules stay, since a qwen35moe may have eight experts. */
#include "recipe.h"
#include "quant.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct { const char *name; int ftype; int type; } recipes[] = {
	{ "q4_k_m", MCV_FTYPE_Q4_K_M, MCV_Q4_K },
	{ "q4_k_s", MCV_FTYPE_Q4_K_S, MCV_Q4_K },
	{ "q5_k_m", MCV_FTYPE_Q5_K_M, MCV_Q5_K },
	{ "q6_k", MCV_FTYPE_Q6_K, MCV_Q6_K },
	{ "q3_k_m", MCV_FTYPE_Q3_K_M, MCV_Q3_K },
	{ "q2_k", MCV_FTYPE_Q2_K, MCV_Q2_K },
	{ "q8_0", MCV_FTYPE_Q8_0, MCV_Q8_0 },
	{ "q4_0", MCV_FTYPE_Q4_0, MCV_Q4_0 },
	{ "f16", MCV_FTYPE_F16, MCV_F16 },
	{ "bf16", MCV_FTYPE_BF16, MCV_BF16 },
	{ "f32", MCV_FTYPE_ALL_F32, MCV_F32 },
};
#define N_RECIPES (int)(sizeof recipes / sizeof recipes[0])

int mcv_recipe_from_name(const char *name)
{
	for (int i = 0; i < N_RECIPES; i++)
		if (!strcasecmp(name, recipes[i].name))
			return recipes[i].ftype;
	return -1;
}

const char *mcv_recipe_name(int ftype)
{
	for (int i = 0; i < N_RECIPES; i++)
		if (recipes[i].ftype == ftype)
			return recipes[i].name;
	return NULL;
}

int mcv_recipe_default_type(int ftype)
{
	for (int i = 0; i < N_RECIPES; i++)
		if (recipes[i].ftype == ftype)
			return recipes[i].type;
	return -1;
}

enum cat { C_TOKEN_EMBD, C_ATTN_Q, C_ATTN_V, C_ATTN_K, C_ATTN_QKV, C_ATTN_KV_B,
	   C_ATTN_OUTPUT, C_FFN_UP, C_FFN_GATE, C_FFN_DOWN, C_OUTPUT, C_OTHER };

static int has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* Same precedence as llama.cpp: the first substring that matches decides. */
static enum cat category(const char *n)
{
	if (!strcmp(n, "output.weight")) return C_OUTPUT;
	if (!strcmp(n, "token_embd.weight") || !strcmp(n, "per_layer_token_embd.weight"))
		return C_TOKEN_EMBD;
	if (has(n, "attn_qkv.weight")) return C_ATTN_QKV;
	if (has(n, "attn_kv_b.weight")) return C_ATTN_KV_B;
	if (has(n, "attn_v.weight")) return C_ATTN_V;
	if (has(n, "attn_k.weight")) return C_ATTN_K;
	if (has(n, "attn_q.weight")) return C_ATTN_Q;
	if (has(n, "attn_output.weight")) return C_ATTN_OUTPUT;
	if (has(n, "ffn_up")) return C_FFN_UP;
	if (has(n, "ffn_gate")) return C_FFN_GATE;
	if (has(n, "ffn_down")) return C_FFN_DOWN;
	return C_OTHER;
}

/* In the DeltaNet layers attn_qkv is the input projection; llama.cpp counts
 * it with attn_v, which is why its attn_v rule reaches it. */
static int is_attn_v(enum cat c) { return c == C_ATTN_V || c == C_ATTN_QKV || c == C_ATTN_KV_B; }

int mcv_recipe_quantizable(const mcv_recipe_tensor *t)
{
	int nd = t->n_dims;
	while (nd > 1 && t->ne[nd - 1] == 1)
		nd--; /* ggml_n_dims ignores trailing 1s */
	if (nd < 2)
		return 0;
	const char *n = t->name;
	size_t len = strlen(n);
	if (len < 6 || strcmp(n + len - 6, "weight"))
		return 0;
	static const char *const never[] = {
		"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup",
		"laurel", "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight",
		"indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_",
		"attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
		"sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
		"a.rvq.codebook", "mm.a.code_embd",
	};
	for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
		if (has(n, never[i]))
			return 0;
	if (!strcmp(n, "position_embd.weight") || !strcmp(n, "token_types.weight"))
		return 0;
	return 1;
}

typedef struct state {
	const mcv_recipe_model *m;
	int ftype, n_wv, i_wv, n_ffn, i_down, i_gate, i_up, tied;
} state;

static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int block_of(int type)
{
	const mcv_type_traits *tr = mcv_type_get(type);
	return tr ? tr->blck : 1;
}

/* The layer a ffn tensor belongs to: llama.cpp parses the name for MoE
 * models (experts are not visited in layer order) and counts otherwise. */
static int ffn_layer(const state *s, int counter, const char *name, int *layer, mcv_error *err)
{
	*layer = counter;
	if ((s->m->n_expert > 1 ? s->m->n_expert : 1) > 1) {
		if (sscanf(name, "blk.%d.", layer) != 1)
			return mcv_error_set(err, MCV_EFORMAT, "%s: cannot tell the layer of an expert-model ffn tensor", name);
		if (*layer < 0 || *layer >= s->n_ffn)
			return mcv_error_set(err, MCV_EFORMAT, "%s: layer %d outside [0, %d)", name, *layer, s->n_ffn);
	}
	return 0;
}

static int rule_type(state *s, const mcv_recipe_tensor *t, enum cat c, int ty, mcv_error *err)
{
	const int f = s->ftype, ne8 = s->m->n_expert == 8;
	const int gqa = s->m->n_head_kv > 0 ? s->m->n_head / s->m->n_head_kv : 0;
	int il, rc;

	if (c == C_OUTPUT || (s->tied && c == C_TOKEN_EMBD)) {
		if (t->ne[0] % block_of(ty))
			ty = MCV_Q8_0;
		else if (ty != MCV_Q8_0)
			ty = MCV_Q6_K;
	} else if (c == C_TOKEN_EMBD) {
		/* only IQ/TQ ftypes change it */
	} else if (is_attn_v(c)) {
		if (f == MCV_FTYPE_Q2_K)
			ty = gqa >= 4 ? MCV_Q4_K : MCV_Q3_K;
		else if (f == MCV_FTYPE_Q3_K_M)
			ty = s->i_wv < 2 ? MCV_Q5_K : MCV_Q4_K;
		else if ((f == MCV_FTYPE_Q4_K_M || f == MCV_FTYPE_Q5_K_M) && more_bits(s->i_wv, s->n_wv))
			ty = MCV_Q6_K;
		else if (f == MCV_FTYPE_Q4_K_S && s->i_wv < 4)
			ty = MCV_Q5_K;
		if (ne8)
			ty = MCV_Q8_0;
		s->i_wv++;
	} else if (c == C_ATTN_K) {
		if (ne8)
			ty = MCV_Q8_0;
	} else if (c == C_FFN_DOWN) {
		if ((rc = ffn_layer(s, s->i_down, t->name, &il, err)))
			return rc;
		int n = s->n_ffn;
		if (f == MCV_FTYPE_Q2_K)
			ty = MCV_Q3_K;
		else if (f == MCV_FTYPE_Q3_K_M)
			ty = il < n / 16 ? MCV_Q5_K : MCV_Q4_K;
		else if (f == MCV_FTYPE_Q4_K_M) {
			if (more_bits(il, n))
				ty = MCV_Q6_K;
		} else if (f == MCV_FTYPE_Q5_K_M && more_bits(il, n))
			ty = MCV_Q6_K;
		else if (f == MCV_FTYPE_Q4_K_S && il < n / 8)
			ty = MCV_Q5_K;
		s->i_down++;
	} else if (c == C_ATTN_OUTPUT) {
		if (ne8) {
			if (f == MCV_FTYPE_Q2_K || f == MCV_FTYPE_Q3_K_M || f == MCV_FTYPE_Q4_K_S ||
			    f == MCV_FTYPE_Q4_K_M)
				ty = MCV_Q5_K;
		} else if (f == MCV_FTYPE_Q2_K)
			ty = MCV_Q3_K;
		else if (f == MCV_FTYPE_Q3_K_M)
			ty = MCV_Q4_K;
	} else if (c == C_FFN_GATE) {
		if ((rc = ffn_layer(s, s->i_gate, t->name, &il, err)))
			return rc;
		s->i_gate++;
	} else if (c == C_FFN_UP) {
		if ((rc = ffn_layer(s, s->i_up, t->name, &il, err)))
			return rc;
		s->i_up++;
	}
	return ty;
}

static int fallback(const mcv_recipe_tensor *t, int ty, mcv_error *err)
{
	int64_t nc = t->ne[0];
	if (nc % block_of(ty) == 0)
		return ty;
	int r;
	switch (ty) {
	case MCV_Q2_K: case MCV_Q3_K: r = MCV_Q4_0; break;
	case MCV_Q6_K: r = MCV_Q8_0; break;
	case MCV_Q4_K: r = MCV_Q5_0; break;
	case MCV_Q5_K: r = MCV_Q5_1; break;
	default:
		return mcv_error_set(err, MCV_EUNSUPPORTED, "%s: rows of %lld do not fit type %s",
				     t->name, (long long)nc, mcv_type_get(ty) ? mcv_type_get(ty)->name : "?");
	}
	if (nc % block_of(r))
		r = MCV_F16;
	return r;
}

static int layer_of(const char *name)
{
	int l = -1;
	if (sscanf(name, "blk.%d.", &l) != 1)
		l = -1;
	return l;
}

static const mcv_recipe_tensor *sort_base;
static int by_llama_order(const void *a, const void *b)
{
	const mcv_recipe_tensor *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
	int lx = layer_of(x->name), ly = layer_of(y->name);
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return strcmp(x->name, y->name);
}

int mcv_recipe_assign(int ftype, const mcv_recipe_model *m,
		      const mcv_recipe_tensor *t, int n,
		      const mcv_recipe_override *ov, int n_ov, int has_imatrix,
		      int *out_types, mcv_error *err)
{
	(void)has_imatrix; /* only IQ/Q4_0 rules read it */
	int deft = mcv_recipe_default_type(ftype);
	if (deft < 0)
		return mcv_error_set(err, MCV_EINVAL, "unknown recipe %d", ftype);
	regex_t *re = calloc(n_ov > 0 ? n_ov : 1, sizeof *re);
	int *order = malloc((n > 0 ? n : 1) * sizeof *order);
	int rc = 0, n_re = 0;
	if (!re || !order) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
		goto out;
	}
	for (; n_re < n_ov; n_re++) {
		if (regcomp(&re[n_re], ov[n_re].pattern, REG_EXTENDED | REG_NOSUB)) {
			rc = mcv_error_set(err, MCV_EINVAL, "bad regular expression '%s'", ov[n_re].pattern);
			goto out;
		}
	}
	state s = { .m = m, .ftype = ftype, .n_ffn = m->n_layer, .tied = 1 };
	for (int i = 0; i < n; i++) {
		enum cat c = category(t[i].name);
		s.n_wv += is_attn_v(c);
		if (c == C_OUTPUT)
			s.tied = 0;
		order[i] = i;
	}
	sort_base = t;
	qsort(order, n, sizeof *order, by_llama_order);
	for (int k = 0; k < n; k++) {
		const mcv_recipe_tensor *x = &t[order[k]];
		int ty = x->type;
		if (mcv_recipe_quantizable(x)) {
			ty = deft;
			const mcv_type_traits *tr = mcv_type_get(deft);
			if (tr && tr->is_quant) {
				int manual = 0;
				for (int j = 0; j < n_ov && !manual; j++)
					if (!regexec(&re[j], x->name, 0, NULL, 0)) {
						ty = ov[j].type;
						manual = 1;
					}
				if (!manual && (ty = rule_type(&s, x, category(x->name), ty, err)) < 0) {
					rc = ty;
					goto out;
				}
				if ((ty = fallback(x, ty, err)) < 0) {
					rc = ty;
					goto out;
				}
			}
		}
		out_types[order[k]] = ty;
	}
out:
	for (int j = 0; j < n_re; j++)
		regfree(&re[j]);
	free(re);
	free(order);
	return rc;
}

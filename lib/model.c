/* Loading qwen35 / qwen35moe: hyperparameters from the GGUF metadata and
 * every tensor bound by llama.cpp's name, with its shape and type checked.
 * Weights are not copied: each mcv_wt points into the mapping. */
#include "model_impl.h"
#include "gguf.h"
#include "pack.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mcv_model_params mcv_model_default_params(void)
{
	return (mcv_model_params){ .n_threads = 0 };
}

/* ---- metadata ---- */

typedef struct loader {
	mcv_model *m;
	const mcv_gguf *g;
	mcv_error *err;
	char key[160];
} loader;

static const char *kname(loader *ld, const char *suffix)
{
	snprintf(ld->key, sizeof ld->key, "%s.%s", ld->m->arch, suffix);
	return ld->key;
}

/* A u32 key that may also be stored as a per-layer array (llama.cpp's
 * get_key_or_arr); arrays must be uniform, as the graph assumes. */
static int get_u32(loader *ld, const char *suffix, uint32_t *v, bool required)
{
	const char *k = kname(ld, suffix);
	if (mcv_gguf_find_key(ld->g, k) < 0) {
		if (!required)
			return 1;
		return mcv_error_set(ld->err, MCV_ENOTFOUND, "missing key '%s'", k);
	}
	mcv_error e;
	if (mcv_gguf_get_u32(ld->g, k, v, &e) == 0)
		return 0;
	int et;
	uint64_t n;
	const void *d;
	if (mcv_gguf_get_arr(ld->g, k, &et, &n, &d, &e) == 0 && n > 0 &&
	    (et == GGUF_U32 || et == GGUF_I32)) {
		const uint32_t *a = d;
		for (uint64_t i = 1; i < n; i++)
			if (a[i] != a[0])
				return mcv_error_set(ld->err, MCV_EUNSUPPORTED,
						     "key '%s' varies per layer", k);
		if (et == GGUF_I32 && (int32_t)a[0] < 0)
			return mcv_error_set(ld->err, MCV_EFORMAT, "key '%s' is negative", k);
		*v = a[0];
		return 0;
	}
	return mcv_error_set(ld->err, MCV_EFORMAT, "key '%s' has the wrong type", k);
}

static int get_f32(loader *ld, const char *suffix, float *v, bool required)
{
	const char *k = kname(ld, suffix);
	if (mcv_gguf_find_key(ld->g, k) < 0) {
		if (!required)
			return 1;
		return mcv_error_set(ld->err, MCV_ENOTFOUND, "missing key '%s'", k);
	}
	mcv_error e;
	if (mcv_gguf_get_f32(ld->g, k, v, &e) != 0)
		return mcv_error_set(ld->err, MCV_EFORMAT, "key '%s' has the wrong type", k);
	return 0;
}

/* Small positive integers the graph indexes with. */
#define LIM(x, lo, hi, what) do { if ((int64_t)(x) < (lo) || (int64_t)(x) > (hi)) \
	return mcv_error_set(ld->err, MCV_EFORMAT, "%s = %lld is out of range", what, \
			     (long long)(x)); } while (0)

static int load_hparams(loader *ld)
{
	mcv_hparams *hp = &ld->m->hp;
	int rc;
	uint32_t u;
	hp->moe = strcmp(ld->m->arch, "qwen35moe") == 0;

#define REQ(suf, dst) do { if ((rc = get_u32(ld, suf, &u, true)) < 0) return rc; (dst) = (int)u; } while (0)
#define OPT(suf, dst, def) do { (dst) = (def); if ((rc = get_u32(ld, suf, &u, false)) < 0) return rc; \
	if (rc == 0) (dst) = (int)u; } while (0)

	REQ("context_length", hp->n_ctx_train);
	REQ("embedding_length", hp->n_embd);
	REQ("block_count", hp->n_layer);
	LIM(hp->n_embd, 1, 1 << 16, "embedding_length");
	LIM(hp->n_layer, 1, 1024, "block_count");
	if (hp->n_ctx_train < 1)
		hp->n_ctx_train = 1;
	int nextn;
	OPT("nextn_predict_layers", nextn, 0);
	LIM(nextn, 0, hp->n_layer - 1, "nextn_predict_layers");
	const int n_layer_all = hp->n_layer;
	hp->n_layer -= nextn; /* MTP blocks are loaded by nobody here */

	if ((rc = get_f32(ld, "attention.layer_norm_rms_epsilon", &hp->eps, true)) < 0)
		return rc;
	REQ("attention.head_count", hp->n_head);
	LIM(hp->n_head, 1, 4096, "attention.head_count");
	OPT("attention.head_count_kv", hp->n_head_kv, hp->n_head);
	LIM(hp->n_head_kv, 1, hp->n_head, "attention.head_count_kv");
	if (hp->n_head % hp->n_head_kv)
		return mcv_error_set(ld->err, MCV_EFORMAT, "head_count %d is not a multiple of head_count_kv %d",
				     hp->n_head, hp->n_head_kv);
	int vlen;
	OPT("attention.key_length", hp->head_dim, hp->n_embd / hp->n_head);
	OPT("attention.value_length", vlen, hp->n_embd / hp->n_head);
	LIM(hp->head_dim, 2, 1 << 14, "attention.key_length");
	if (vlen != hp->head_dim)
		return mcv_error_set(ld->err, MCV_EUNSUPPORTED, "key_length %d != value_length %d",
				     hp->head_dim, vlen);
	OPT("rope.dimension_count", hp->n_rot, hp->head_dim);
	LIM(hp->n_rot, 2, hp->head_dim, "rope.dimension_count");
	if (hp->n_rot % 2)
		return mcv_error_set(ld->err, MCV_EFORMAT, "rope.dimension_count %d is odd", hp->n_rot);
	hp->rope_base = 10000.0f;
	if ((rc = get_f32(ld, "rope.freq_base", &hp->rope_base, false)) < 0)
		return rc;

	{	/* required, an array of up to 4 */
		const char *k = kname(ld, "rope.dimension_sections");
		int et;
		uint64_t n;
		const void *d;
		mcv_error e;
		if (mcv_gguf_find_key(ld->g, k) < 0)
			return mcv_error_set(ld->err, MCV_ENOTFOUND, "missing key '%s'", k);
		if (mcv_gguf_get_arr(ld->g, k, &et, &n, &d, &e) != 0 ||
		    (et != GGUF_I32 && et != GGUF_U32) || n < 1 || n > 4)
			return mcv_error_set(ld->err, MCV_EFORMAT, "key '%s' is not an array of 4 integers", k);
		for (uint64_t i = 0; i < n; i++) {
			int32_t s = ((const int32_t *)d)[i];
			LIM(s, 0, hp->n_rot, "rope.dimension_sections[]");
			hp->rope_sections[i] = s;
		}
	}

	REQ("ssm.conv_kernel", hp->ssm_k);
	REQ("ssm.inner_size", hp->ssm_dval);
	REQ("ssm.state_size", hp->ssm_dk);
	REQ("ssm.time_step_rank", hp->ssm_nv);
	REQ("ssm.group_count", hp->ssm_nk);
	LIM(hp->ssm_k, 1, 64, "ssm.conv_kernel");
	LIM(hp->ssm_dk, 1, 4096, "ssm.state_size");
	LIM(hp->ssm_nv, 1, 4096, "ssm.time_step_rank");
	LIM(hp->ssm_nk, 1, hp->ssm_nv, "ssm.group_count");
	if (hp->ssm_nv % hp->ssm_nk)
		return mcv_error_set(ld->err, MCV_EFORMAT, "ssm.time_step_rank %d is not a multiple of ssm.group_count %d",
				     hp->ssm_nv, hp->ssm_nk);
	hp->ssm_dv = hp->ssm_dk;
	if (hp->ssm_dval != hp->ssm_dv * hp->ssm_nv)
		return mcv_error_set(ld->err, MCV_EUNSUPPORTED,
				     "ssm.inner_size %d != ssm.state_size %d * ssm.time_step_rank %d",
				     hp->ssm_dval, hp->ssm_dk, hp->ssm_nv);
	hp->ssm_dkey = hp->ssm_dk * hp->ssm_nk;
	hp->ssm_conv_ch = 2 * hp->ssm_dkey + hp->ssm_dval;

	if (hp->moe) {
		REQ("expert_count", hp->n_expert);
		REQ("expert_used_count", hp->n_expert_used);
		LIM(hp->n_expert, 1, 4096, "expert_count");
		LIM(hp->n_expert_used, 1, hp->n_expert, "expert_used_count");
		OPT("feed_forward_length", hp->n_ff, 0);
		OPT("expert_feed_forward_length", hp->n_ff_exp, hp->n_ff / hp->n_expert_used);
		OPT("expert_shared_feed_forward_length", hp->n_ff_shexp, hp->n_ff);
		LIM(hp->n_ff_exp, 1, 1 << 20, "expert_feed_forward_length");
		LIM(hp->n_ff_shexp, 1, 1 << 20, "expert_shared_feed_forward_length");
	} else {
		REQ("feed_forward_length", hp->n_ff);
		LIM(hp->n_ff, 1, 1 << 20, "feed_forward_length");
	}

	/* Which layers are recurrent: an explicit bool array, else every
	 * full_attention_interval-th layer is full attention. */
	int interval;
	OPT("full_attention_interval", interval, 4);
	LIM(interval, 1, 1 << 20, "full_attention_interval");
	const char *rk = kname(ld, "attention.recurrent_layers");
	int et;
	uint64_t n = 0;
	const void *d = NULL;
	mcv_error e;
	bool have_arr = mcv_gguf_find_key(ld->g, rk) >= 0;
	if (have_arr && (mcv_gguf_get_arr(ld->g, rk, &et, &n, &d, &e) != 0 ||
			 (et != GGUF_BOOL && et != GGUF_U8 && et != GGUF_I8) ||
			 n < (uint64_t)hp->n_layer))
		return mcv_error_set(ld->err, MCV_EFORMAT, "key '%s' is not a bool array of %d",
				     rk, n_layer_all);
	hp->n_attn_layers = hp->n_rec_layers = 0;
	for (int il = 0; il < hp->n_layer; il++) {
		mcv_layer *L = &ld->m->layers[il];
		L->recurrent = have_arr ? ((const uint8_t *)d)[il] != 0 : (il + 1) % interval != 0;
		L->kv_index = L->recurrent ? -1 : hp->n_attn_layers++;
		L->rs_index = L->recurrent ? hp->n_rec_layers++ : -1;
	}
	return 0;
#undef REQ
#undef OPT
}

/* ---- tensors ---- */

static void fmt_shape(char *buf, size_t cap, const int64_t *ne, int nd)
{
	size_t o = 0;
	o += snprintf(buf + o, cap - o, "[");
	for (int i = 0; i < nd && o < cap; i++)
		o += snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)ne[i]);
	if (o < cap)
		snprintf(buf + o, cap - o, "]");
}

enum { T_REQ = 0, T_OPT = 1, T_F32 = 2 };

/* Bind tensor `name` expecting nd dims ne0..; flags T_OPT (may be absent)
 * and T_F32 (used in place as float: must be F32). */
static int bind(loader *ld, mcv_wt *w, const char *name, int flags, int nd,
		int64_t e0, int64_t e1, int64_t e2)
{
	memset(w, 0, sizeof *w);
	const mcv_gguf_tensor *t = mcv_gguf_find_tensor(ld->g, name);
	if (!t) {
		if (flags & T_OPT)
			return 0;
		return mcv_error_set(ld->err, MCV_ENOTFOUND, "missing tensor '%s'", name);
	}
	int64_t want[4] = { e0, e1, e2, 1 };
	for (int i = nd; i < 4; i++)
		want[i] = 1;
	bool same = true;
	for (int i = 0; i < 4; i++)
		if (t->ne[i] != want[i])
			same = false;
	if (!same) {
		char a[96], b[96];
		fmt_shape(a, sizeof a, t->ne, t->n_dims);
		fmt_shape(b, sizeof b, want, nd);
		return mcv_error_set(ld->err, MCV_EFORMAT, "tensor '%s' has shape %s, expected %s",
				     name, a, b);
	}
	const mcv_type_traits *tr = mcv_type_get(t->type);
	if (!tr || tr->blck <= 0 || t->ne[0] % tr->blck)
		return mcv_error_set(ld->err, MCV_EUNSUPPORTED, "tensor '%s' has unsupported type %d%s%s",
				     name, t->type, tr ? " " : "", tr ? tr->name : "");
	if ((flags & T_F32) && t->type != MCV_F32)
		return mcv_error_set(ld->err, MCV_EUNSUPPORTED, "tensor '%s' has type %s, expected f32",
				     name, tr->name);
	size_t rb = mcv_row_bytes(t->type, t->ne[0]);
	uint64_t rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
	if (rb == 0 || t->nbytes < rb * rows)
		return mcv_error_set(ld->err, MCV_EFORMAT, "tensor '%s' is truncated", name);
	if ((t->type == MCV_F32 && ((uintptr_t)t->data & 3)))
		return mcv_error_set(ld->err, MCV_EFORMAT, "tensor '%s' is misaligned", name);
	w->data = t->data;
	w->type = t->type;
	memcpy(w->ne, t->ne, sizeof w->ne);
	w->row_bytes = rb;
	return 0;
}

static int bind_layer(loader *ld, int il)
{
	const mcv_hparams *hp = &ld->m->hp;
	mcv_layer *L = &ld->m->layers[il];
	const int64_t H = hp->n_embd, hd = hp->head_dim;
	char nm[128];
	int rc;
#define B(field, suffix, flags, nd, a, b, c) do { \
	snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix); \
	if ((rc = bind(ld, &L->field, nm, flags, nd, a, b, c)) < 0) return rc; } while (0)

	B(attn_norm, "attn_norm.weight", T_F32, 1, H, 1, 1);
	B(post_norm, "post_attention_norm.weight", T_F32, 1, H, 1, 1);
	if (!L->recurrent) {
		const int64_t nq = 2 * hd * hp->n_head, nkv = hd * hp->n_head_kv;
		B(wqkv, "attn_qkv.weight", T_OPT, 2, H, nq + 2 * nkv, 1);
		if (!L->wqkv.data) {
			B(wq, "attn_q.weight", T_REQ, 2, H, nq, 1);
			B(wk, "attn_k.weight", T_REQ, 2, H, nkv, 1);
			B(wv, "attn_v.weight", T_REQ, 2, H, nkv, 1);
		}
		B(wo, "attn_output.weight", T_REQ, 2, hd * hp->n_head, H, 1);
		B(q_norm, "attn_q_norm.weight", T_F32, 1, hd, 1, 1);
		B(k_norm, "attn_k_norm.weight", T_F32, 1, hd, 1, 1);
	} else {
		B(ssm_qkv, "attn_qkv.weight", T_REQ, 2, H, hp->ssm_conv_ch, 1);
		B(ssm_gate, "attn_gate.weight", T_REQ, 2, H, hp->ssm_dval, 1);
		B(ssm_conv, "ssm_conv1d.weight", T_F32, 2, hp->ssm_k, hp->ssm_conv_ch, 1);
		B(ssm_dt, "ssm_dt.bias", T_F32, 1, hp->ssm_nv, 1, 1);
		B(ssm_a, "ssm_a", T_F32, 1, hp->ssm_nv, 1, 1);
		B(ssm_beta, "ssm_beta.weight", T_REQ, 2, H, hp->ssm_nv, 1);
		B(ssm_alpha, "ssm_alpha.weight", T_REQ, 2, H, hp->ssm_nv, 1);
		B(ssm_norm, "ssm_norm.weight", T_F32, 1, hp->ssm_dv, 1, 1);
		B(ssm_out, "ssm_out.weight", T_REQ, 2, hp->ssm_dval, H, 1);
	}
	if (hp->moe) {
		const int64_t E = hp->n_expert, F = hp->n_ff_exp, SF = hp->n_ff_shexp;
		B(gate_inp, "ffn_gate_inp.weight", T_REQ, 2, H, E, 1);
		/* a packed file has per-expert tensors only (the layout checks
		 * them once every layer is bound) */
		snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.weight", il);
		if (!mcv_gguf_find_tensor(ld->g, nm)) {
			snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.0.weight", il);
			if (mcv_gguf_find_tensor(ld->g, nm))
				goto shared;
		}
		B(gate_up_exps, "ffn_gate_up_exps.weight", T_OPT, 3, H, 2 * F, E);
		if (!L->gate_up_exps.data) {
			B(gate_exps, "ffn_gate_exps.weight", T_REQ, 3, H, F, E);
			B(up_exps, "ffn_up_exps.weight", T_REQ, 3, H, F, E);
		}
		B(down_exps, "ffn_down_exps.weight", T_REQ, 3, F, H, E);
	shared:
		B(gate_inp_shexp, "ffn_gate_inp_shexp.weight", T_REQ, 1, H, 1, 1);
		B(gate_shexp, "ffn_gate_shexp.weight", T_REQ, 2, H, SF, 1);
		B(up_shexp, "ffn_up_shexp.weight", T_REQ, 2, H, SF, 1);
		B(down_shexp, "ffn_down_shexp.weight", T_REQ, 2, SF, H, 1);
	} else {
		B(ffn_gate, "ffn_gate.weight", T_REQ, 2, H, hp->n_ff, 1);
		B(ffn_up, "ffn_up.weight", T_REQ, 2, H, hp->n_ff, 1);
		B(ffn_down, "ffn_down.weight", T_REQ, 2, hp->n_ff, H, 1);
	}
	return 0;
#undef B
}

/* The expert layout must agree with the hyperparameters the graph uses. */
static int open_layout(mcv_model *m, mcv_error *err)
{
	int rc = mcv_layout_open(&m->layout, m->gguf, err);
	if (rc < 0)
		return rc;
	const mcv_layout *l = m->layout;
	const mcv_hparams *hp = &m->hp;
	if (mcv_layout_n_layer(l) < hp->n_layer || mcv_layout_n_expert(l) != hp->n_expert ||
	    mcv_layout_n_embd(l) != hp->n_embd || mcv_layout_n_ff(l) != hp->n_ff_exp)
		return mcv_error_set(err, MCV_EFORMAT,
				     "expert tensors (%d layers, %d experts, %lld x %lld) do not match the "
				     "metadata (%d, %d, %d x %d)", mcv_layout_n_layer(l), mcv_layout_n_expert(l),
				     (long long)mcv_layout_n_embd(l), (long long)mcv_layout_n_ff(l),
				     hp->n_layer, hp->n_expert, hp->n_embd, hp->n_ff_exp);
	for (int il = 0; il < hp->n_layer; il++)
		for (int e = 0; e < hp->n_expert; e++) {
			const mcv_expert_extent *x = mcv_layout_expert(l, il, e);
			for (int k = 0; k < 3; k++) {
				const mcv_expert_slice *s = &x->s[k];
				const mcv_type_traits *tr = mcv_type_get(s->type);
				const int64_t cols = k == 2 ? hp->n_ff_exp : hp->n_embd;
				if (!tr || s->cols != cols || s->row_bytes != mcv_row_bytes(s->type, cols) ||
				    !s->row_bytes ||
				    s->offset + s->bytes > mcv_gguf_file_size(m->gguf))
					return mcv_error_set(err, MCV_EFORMAT,
							     "expert %d of layer %d: slice %d is malformed or truncated",
							     e, il, k);
			}
		}
	return 0;
}

int mcv_model_load(mcv_model **out, const char *path, const mcv_model_params *p,
		   mcv_error *err)
{
	*out = NULL;
	mcv_model_params def = mcv_model_default_params();
	if (!p)
		p = &def;
	mcv_gguf *g = NULL;
	int rc = mcv_gguf_open(&g, path, err);
	if (rc < 0)
		return rc;
	mcv_model *m = calloc(1, sizeof *m);
	if (!m) {
		mcv_gguf_close(g);
		return mcv_error_set(err, MCV_ENOMEM, "%s: out of memory", path);
	}
	m->gguf = g;
	m->n_threads = p->n_threads;
	loader ld = { .m = m, .g = g, .err = err };

	const char *arch = NULL;
	mcv_error e;
	if (mcv_gguf_get_str(g, "general.architecture", &arch, &e) != 0) {
		rc = mcv_error_set(err, MCV_ENOTFOUND, "missing key 'general.architecture'");
		goto fail;
	}
	if (strcmp(arch, "qwen35") != 0 && strcmp(arch, "qwen35moe") != 0) {
		rc = mcv_error_set(err, MCV_EUNSUPPORTED, "unknown architecture '%.64s'", arch);
		goto fail;
	}
	snprintf(m->arch, sizeof m->arch, "%s", arch);

	{	/* block_count first: the layer array is sized by it */
		uint32_t nl;
		if ((rc = get_u32(&ld, "block_count", &nl, true)) < 0)
			goto fail;
		if (nl < 1 || nl > 1024) {
			rc = mcv_error_set(err, MCV_EFORMAT, "block_count = %u is out of range", nl);
			goto fail;
		}
		m->layers = calloc(nl, sizeof *m->layers);
		if (!m->layers) {
			rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
			goto fail;
		}
	}
	if ((rc = load_hparams(&ld)) < 0)
		goto fail;

	const mcv_gguf_tensor *te = mcv_gguf_find_tensor(g, "token_embd.weight");
	if (!te) {
		rc = mcv_error_set(err, MCV_ENOTFOUND, "missing tensor 'token_embd.weight'");
		goto fail;
	}
	if (te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
		rc = mcv_error_set(err, MCV_EFORMAT, "tensor 'token_embd.weight' has %lld rows",
				   (long long)te->ne[1]);
		goto fail;
	}
	m->hp.n_vocab = (int)te->ne[1];
	const int64_t H = m->hp.n_embd, V = m->hp.n_vocab;
	if ((rc = bind(&ld, &m->tok_embd, "token_embd.weight", T_REQ, 2, H, V, 1)) < 0 ||
	    (rc = bind(&ld, &m->output_norm, "output_norm.weight", T_F32, 1, H, 1, 1)) < 0 ||
	    (rc = bind(&ld, &m->output, "output.weight", T_OPT, 2, H, V, 1)) < 0)
		goto fail;
	if (!m->output.data)
		m->output = m->tok_embd; /* tied embeddings */
	m->tok_embd_off = te->file_offset;
	if (p->les && p->les->mem > 0) {
		if (!m->hp.moe) {
			rc = mcv_error_set(err, MCV_EUNSUPPORTED,
					   "a memory budget needs a mixture-of-experts model (this is %s)", m->arch);
			goto fail;
		}
		m->les = *p->les;
	}
	for (int il = 0; il < m->hp.n_layer; il++)
		if ((rc = bind_layer(&ld, il)) < 0)
			goto fail;
	if (m->hp.moe && (rc = open_layout(m, err)) < 0)
		goto fail;
	mcv_prefill_pack(m);
	*out = m;
	return 0;
fail:
	mcv_error_prefix(err, "%s", path);
	mcv_model_free(m);
	return rc;
}

void mcv_model_free(mcv_model *m)
{
	if (!m)
		return;
	mcv_prefill_unpack(m);
	mcv_layout_free(m->layout);
	mcv_gguf_close(m->gguf);
	free(m->layers);
	free(m);
}

const mcv_gguf *mcv_model_gguf(const mcv_model *m) { return m->gguf; }
const char *mcv_model_arch(const mcv_model *m) { return m->arch; }
int mcv_model_n_vocab(const mcv_model *m) { return m->hp.n_vocab; }
int mcv_model_n_embd(const mcv_model *m) { return m->hp.n_embd; }
int mcv_model_n_layer(const mcv_model *m) { return m->hp.n_layer; }
int mcv_model_n_ctx_train(const mcv_model *m) { return m->hp.n_ctx_train; }

/* HF checkpoint -> GGUF view (see hfmodel.h). */
#include "hfmodel.h"
#include "hfmap.h"
#include "json.h"
#include "quant.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 4096
#define MAX_JSON (1u << 30)

typedef struct vt {
	mcv_hf_tensor t;
	const mcv_st_tensor **src; /* n_src sources (one per expert when stacked) */
	int n_src;
	int split, fused, op, reorder, conv;
} vt;

struct mcv_hfmodel {
	mcv_st **files;
	int n_files;
	vt *t;
	int n, cap;
	int n_vision, n_skipped;
	mcv_json *cfg, *tok, *tokcfg;
	const mcv_json *text; /* text_config or the whole config */
	char arch[16];
	char name[256];
	mcv_hf_dims dims;
	int64_t n_expert;
};

static int read_json(const char *dir, const char *file, mcv_json **out, int required, mcv_error *err)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	*out = NULL;
	FILE *f = fopen(path, "rb");
	if (!f) {
		if (!required && errno == ENOENT)
			return 0;
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", path, strerror(errno));
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	if (n < 0 || (unsigned long)n > MAX_JSON) {
		fclose(f);
		return mcv_error_set(err, MCV_EFORMAT, "'%s': too large", path);
	}
	char *buf = malloc(n + 1);
	if (!buf || fread(buf, 1, n, f) != (size_t)n) {
		free(buf);
		fclose(f);
		return mcv_error_set(err, MCV_EIO, "cannot read '%s'", path);
	}
	fclose(f);
	int rc = mcv_json_parse(out, buf, n, err);
	free(buf);
	if (rc)
		mcv_error_prefix(err, "%s: ", path);
	return rc;
}

static int64_t cfg_int(const mcv_hfmodel *m, const char *key, int64_t def)
{
	int64_t v;
	if (!mcv_json_int(m->text, key, &v))
		return v;
	if (!mcv_json_int(m->cfg, key, &v))
		return v;
	return def;
}

static double cfg_num(const mcv_hfmodel *m, const char *key, double def)
{
	double v;
	if (!mcv_json_num(m->text, key, &v) || !mcv_json_num(m->cfg, key, &v))
		return v;
	const mcv_json *rp = mcv_json_get(m->text, "rope_parameters");
	if (rp && !mcv_json_num(rp, key, &v))
		return v;
	return def;
}

static vt *find_vt(mcv_hfmodel *m, const char *name)
{
	for (int i = 0; i < m->n; i++)
		if (!strcmp(m->t[i].t.name, name))
			return &m->t[i];
	return NULL;
}

static int add_source(mcv_hfmodel *m, const mcv_st_tensor *s, const mcv_hf_target *tg, mcv_error *err)
{
	if (s->type < 0)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "tensor '%s' is %s: only F32, F16 and BF16 are read",
				     s->name, s->dtype);
	vt *v = find_vt(m, tg->name);
	if (!v) {
		if (m->n == m->cap) {
			int cap = m->cap ? 2 * m->cap : 256;
			vt *t = realloc(m->t, cap * sizeof *t);
			if (!t)
				return mcv_error_set(err, MCV_ENOMEM, "out of memory");
			m->t = t;
			m->cap = cap;
		}
		v = &m->t[m->n++];
		memset(v, 0, sizeof *v);
		snprintf(v->t.name, sizeof v->t.name, "%s", tg->name);
		v->t.src_type = s->type;
		v->split = tg->split;
		v->fused = tg->fused;
		v->op = tg->op;
		v->reorder = tg->reorder;
		v->conv = tg->reorder == MCV_HF_RE_CONV;
		int n_src = tg->expert >= 0 ? (int)m->n_expert : 1;
		if (tg->expert >= 0 && n_src <= 0)
			return mcv_error_set(err, MCV_EFORMAT, "'%s': per-expert tensor but config.json has no num_experts", s->name);
		v->src = calloc(n_src, sizeof *v->src);
		if (!v->src)
			return mcv_error_set(err, MCV_ENOMEM, "out of memory");
		v->n_src = n_src;
		/* GGUF ne is the PyTorch shape reversed */
		int nd = s->n_dims;
		if (v->conv) {
			if (nd != 3 || s->shape[1] != 1)
				return mcv_error_set(err, MCV_EFORMAT, "'%s': conv1d weight is not [C, 1, K]", s->name);
			v->t.n_dims = 2;
			v->t.ne[0] = s->shape[2];
			v->t.ne[1] = s->shape[0];
		} else {
			if (nd < 1 || nd > 3)
				return mcv_error_set(err, MCV_EFORMAT, "'%s': %d dimensions", s->name, nd);
			v->t.n_dims = nd;
			for (int d = 0; d < nd; d++)
				v->t.ne[d] = s->shape[nd - 1 - d];
			if (tg->expert >= 0) {
				if (nd != 2)
					return mcv_error_set(err, MCV_EFORMAT, "'%s': an expert matrix must be 2-D", s->name);
				v->t.n_dims = 3;
				v->t.ne[2] = n_src;
			}
			if (tg->split) {
				if (nd != 3 || v->t.ne[1] % 2)
					return mcv_error_set(err, MCV_EFORMAT, "'%s': gate_up_proj is not [E, 2F, H]", s->name);
				v->t.ne[1] /= 2;
			}
		}
		for (int d = v->t.n_dims; d < 4; d++)
			v->t.ne[d] = 1;
		/* the shared-expert gate is one output row: llama.cpp declares it [H] */
		if (v->t.n_dims == 2 && v->t.ne[1] == 1 && strstr(v->t.name, "ffn_gate_inp_shexp"))
			v->t.n_dims = 1;
	}
	int slot = tg->expert >= 0 ? tg->expert : 0;
	if (slot >= v->n_src)
		return mcv_error_set(err, MCV_EFORMAT, "'%s': expert %d but config.json has %d experts", s->name, slot, v->n_src);
	if (v->src[slot])
		return mcv_error_set(err, MCV_EFORMAT, "'%s' maps to %s, which another tensor already fills", s->name, tg->name);
	if (tg->expert >= 0 && v->src[0] && (s->shape[0] != v->src[0]->shape[0] || s->shape[1] != v->src[0]->shape[1]))
		return mcv_error_set(err, MCV_EFORMAT, "'%s': expert shapes differ", s->name);
	if (tg->expert >= 0 && !v->src[0] && slot != 0 &&
	    (s->shape[0] != v->t.ne[1] || s->shape[1] != v->t.ne[0]))
		return mcv_error_set(err, MCV_EFORMAT, "'%s': expert shapes differ", s->name);
	v->src[slot] = s;
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int mcv_hfmodel_open(mcv_hfmodel **out, const char *dir, mcv_error *err)
{
	*out = NULL;
	mcv_hfmodel *m = calloc(1, sizeof *m);
	if (!m)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	int rc = read_json(dir, "config.json", &m->cfg, 1, err);
	if (!rc)
		rc = read_json(dir, "tokenizer.json", &m->tok, 1, err);
	if (!rc)
		rc = read_json(dir, "tokenizer_config.json", &m->tokcfg, 0, err);
	if (rc)
		goto fail;
	m->text = mcv_json_get(m->cfg, "text_config");
	if (!m->text)
		m->text = m->cfg;
	m->n_expert = cfg_int(m, "num_experts", 0);
	snprintf(m->arch, sizeof m->arch, "%s", m->n_expert > 0 ? "qwen35moe" : "qwen35");
	m->dims.n_k_heads = (int)cfg_int(m, "linear_num_key_heads", 0);
	m->dims.n_v_heads = (int)cfg_int(m, "linear_num_value_heads", 0);
	m->dims.head_k_dim = (int)cfg_int(m, "linear_key_head_dim", 0);
	m->dims.head_v_dim = (int)cfg_int(m, "linear_value_head_dim", 0);
	const char *base = strrchr(dir, '/');
	snprintf(m->name, sizeof m->name, "%s", base && base[1] ? base + 1 : dir);

	/* the safetensors files, in name order */
	DIR *d = opendir(dir);
	if (!d) {
		rc = mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", dir, strerror(errno));
		goto fail;
	}
	char *names[MAX_FILES];
	int nn = 0;
	struct dirent *de;
	while ((de = readdir(d)) && nn < MAX_FILES) {
		size_t l = strlen(de->d_name);
		if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors"))
			names[nn++] = strdup(de->d_name);
	}
	closedir(d);
	qsort(names, nn, sizeof *names, by_name);
	if (!nn) {
		rc = mcv_error_set(err, MCV_ENOTFOUND, "'%s': no *.safetensors files", dir);
		goto fail;
	}
	m->files = calloc(nn, sizeof *m->files);
	for (int i = 0; i < nn; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		if (!rc && m->files) {
			rc = mcv_st_open(&m->files[i], path, err);
			if (!rc)
				m->n_files = i + 1;
		}
		free(names[i]);
	}
	if (!m->files && !rc)
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
	if (rc)
		goto fail;

	for (int f = 0; f < m->n_files && !rc; f++) {
		for (int64_t i = 0; i < mcv_st_n_tensors(m->files[f]) && !rc; i++) {
			const mcv_st_tensor *s = mcv_st_tensor_at(m->files[f], i);
			mcv_hf_target tg;
			if ((rc = mcv_hfmap_name(s->name, &tg, err)))
				break;
			if (tg.kind == MCV_HF_VISION) {
				m->n_vision++;
				continue;
			}
			if (tg.kind == MCV_HF_SKIP) {
				m->n_skipped++;
				continue;
			}
			rc = add_source(m, s, &tg, err);
			if (!rc && tg.split == 1) {
				/* the up half of a fused gate_up */
				snprintf(tg.name, sizeof tg.name, "blk.%d.ffn_up_exps.weight", tg.layer);
				tg.split = 2;
				rc = add_source(m, s, &tg, err);
			}
		}
	}
	for (int i = 0; i < m->n && !rc; i++)
		for (int k = 0; k < m->t[i].n_src; k++)
			if (!m->t[i].src[k]) {
				rc = mcv_error_set(err, MCV_EFORMAT, "%s: expert %d is missing", m->t[i].t.name, k);
				break;
			}
	if (!rc && !m->n)
		rc = mcv_error_set(err, MCV_ENOTFOUND, "'%s': no language-model tensors", dir);
	if (rc)
		goto fail;
	*out = m;
	return 0;
fail:
	mcv_hfmodel_close(m);
	return rc;
}

void mcv_hfmodel_close(mcv_hfmodel *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_files; i++)
		mcv_st_close(m->files[i]);
	free(m->files);
	for (int i = 0; i < m->n; i++)
		free(m->t[i].src);
	free(m->t);
	mcv_json_free(m->cfg);
	mcv_json_free(m->tok);
	mcv_json_free(m->tokcfg);
	free(m);
}

const char *mcv_hfmodel_arch(const mcv_hfmodel *m) { return m->arch; }
int mcv_hfmodel_n_tensors(const mcv_hfmodel *m) { return m->n; }
const mcv_hf_tensor *mcv_hfmodel_tensor(const mcv_hfmodel *m, int i) { return &m->t[i].t; }
int mcv_hfmodel_n_vision(const mcv_hfmodel *m) { return m->n_vision; }
int mcv_hfmodel_n_skipped(const mcv_hfmodel *m) { return m->n_skipped; }

void mcv_hfmodel_recipe_model(const mcv_hfmodel *m, mcv_recipe_model *rm)
{
	rm->n_layer = (int)cfg_int(m, "num_hidden_layers", 0);
	rm->n_expert = (int)m->n_expert;
	rm->n_head = (int)cfg_int(m, "num_attention_heads", 0);
	rm->n_head_kv = (int)cfg_int(m, "num_key_value_heads", 0);
}

static float elem(int type, const void *p, int64_t i)
{
	if (type == MCV_F32)
		return ((const float *)p)[i];
	if (type == MCV_F16)
		return mcv_fp16_to_fp32(((const uint16_t *)p)[i]);
	return mcv_bf16_to_fp32(((const uint16_t *)p)[i]);
}

/* The converter computes 1 + w and -exp(w) in the checkpoint's own dtype. */
static float round_to(int type, float x)
{
	if (type == MCV_F16)
		return mcv_fp16_to_fp32(mcv_fp32_to_fp16(x));
	if (type == MCV_BF16)
		return mcv_bf16_to_fp32(mcv_fp32_to_bf16(x));
	return x;
}

void mcv_hfmodel_row(const mcv_hfmodel *m, int i, int64_t r, float *out)
{
	const vt *v = &m->t[i];
	const int64_t ne0 = v->t.ne[0], ne1 = v->t.ne[1];
	const int64_t mat = r / ne1, rr = r % ne1;
	const mcv_st_tensor *s = v->src[v->n_src > 1 ? mat : 0];
	int64_t src_row;
	if (v->n_src > 1)
		src_row = rr;
	else if (v->fused)
		src_row = mat * (v->split ? 2 * ne1 : ne1) + (v->split == 2 ? ne1 : 0) + rr;
	else if (v->t.n_dims == 1 || v->reorder == MCV_HF_RE_COLS)
		src_row = rr;
	else
		src_row = mcv_hfmap_src_index(v->reorder, &m->dims, rr, ne1);
	const int64_t src_cols = ne0;
	if (v->t.n_dims == 1 || (v->t.n_dims == 2 && ne1 == 1 && v->reorder == MCV_HF_RE_ROWS_1)) {
		for (int64_t k = 0; k < ne0; k++)
			out[k] = elem(s->type, s->data, mcv_hfmap_src_index(v->reorder, &m->dims, k, ne0));
	} else if (v->reorder == MCV_HF_RE_COLS) {
		for (int64_t k = 0; k < ne0; k++)
			out[k] = elem(s->type, s->data, src_row * src_cols + mcv_hfmap_src_index(v->reorder, &m->dims, k, ne0));
	} else {
		for (int64_t k = 0; k < ne0; k++)
			out[k] = elem(s->type, s->data, src_row * src_cols + k);
	}
	if (v->op) {
		mcv_hfmap_apply_op(v->op, out, ne0);
		for (int64_t k = 0; k < ne0; k++)
			out[k] = round_to(s->type, out[k]);
	}
}

/* ---- metadata ---- */

static void kv_u32(mcv_gguf_writer *w, const char *arch, const char *k, int64_t v)
{
	char key[128];
	snprintf(key, sizeof key, "%s.%s", arch, k);
	mcv_gguf_w_u32(w, key, (uint32_t)v);
}

static void kv_f32(mcv_gguf_writer *w, const char *arch, const char *k, double v)
{
	char key[128];
	snprintf(key, sizeof key, "%s.%s", arch, k);
	mcv_gguf_w_f32(w, key, (float)v);
}

static int tokenizer_kv(const mcv_hfmodel *m, mcv_gguf_writer *w, mcv_error *err)
{
	const mcv_json *model = mcv_json_get(m->tok, "model");
	const mcv_json *vocab = mcv_json_get(model, "vocab");
	const mcv_json *merges = mcv_json_get(model, "merges");
	const mcv_json *added = mcv_json_get(m->tok, "added_tokens");
	if (!vocab || vocab->type != MCV_JSON_OBJ || !merges || merges->type != MCV_JSON_ARR)
		return mcv_error_set(err, MCV_EFORMAT, "tokenizer.json: no BPE model.vocab / model.merges");
	int64_t n = cfg_int(m, "vocab_size", 0);
	int64_t maxid = -1;
	for (size_t i = 0; i < vocab->n; i++)
		if (vocab->kids[i].num > maxid) maxid = (int64_t)vocab->kids[i].num;
	for (size_t i = 0; added && added->type == MCV_JSON_ARR && i < added->n; i++) {
		int64_t id;
		if (!mcv_json_int(&added->kids[i], "id", &id) && id > maxid)
			maxid = id;
	}
	if (n <= maxid)
		n = maxid + 1;
	if (n <= 0 || n > (1 << 24))
		return mcv_error_set(err, MCV_EFORMAT, "tokenizer.json: bad vocabulary size %lld", (long long)n);
	const char **tok = calloc(n, sizeof *tok);
	int32_t *type = calloc(n, sizeof *type);
	char **pads = calloc(n, sizeof *pads);
	const char **mg = calloc(merges->n ? merges->n : 1, sizeof *mg);
	char **mg_own = calloc(merges->n ? merges->n : 1, sizeof *mg_own);
	int rc = 0;
	if (!tok || !type || !pads || !mg || !mg_own) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < vocab->n; i++) {
		const mcv_json *idj = &vocab->kids[i];
		if (idj->type != MCV_JSON_NUM || idj->num < 0 || idj->num >= n) {
			rc = mcv_error_set(err, MCV_EFORMAT, "tokenizer.json: bad id for '%s'", vocab->keys[i]);
			goto out;
		}
		tok[(int64_t)idj->num] = vocab->keys[i];
		type[(int64_t)idj->num] = 1;
	}
	for (size_t i = 0; added && added->type == MCV_JSON_ARR && i < added->n; i++) {
		int64_t id;
		const mcv_json *c = mcv_json_get(&added->kids[i], "content");
		const mcv_json *sp = mcv_json_get(&added->kids[i], "special");
		if (mcv_json_int(&added->kids[i], "id", &id) || id < 0 || id >= n || !c || c->type != MCV_JSON_STR) {
			rc = mcv_error_set(err, MCV_EFORMAT, "tokenizer.json: bad added_tokens entry %zu", i);
			goto out;
		}
		tok[id] = c->str;
		type[id] = sp && sp->type == MCV_JSON_BOOL && sp->num ? 3 : 4;
	}
	for (int64_t i = 0; i < n; i++)
		if (!tok[i]) {
			char b[32];
			snprintf(b, sizeof b, "[PAD%lld]", (long long)i);
			pads[i] = strdup(b);
			tok[i] = pads[i];
			type[i] = 5;
		}
	for (size_t i = 0; i < merges->n; i++) {
		const mcv_json *e = &merges->kids[i];
		if (e->type == MCV_JSON_STR)
			mg[i] = e->str;
		else if (e->type == MCV_JSON_ARR && e->n == 2 && e->kids[0].type == MCV_JSON_STR && e->kids[1].type == MCV_JSON_STR) {
			size_t l = e->kids[0].len + e->kids[1].len + 2;
			mg_own[i] = malloc(l);
			if (!mg_own[i]) {
				rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
				goto out;
			}
			snprintf(mg_own[i], l, "%s %s", e->kids[0].str, e->kids[1].str);
			mg[i] = mg_own[i];
		} else {
			rc = mcv_error_set(err, MCV_EFORMAT, "tokenizer.json: bad merge %zu", i);
			goto out;
		}
	}
	mcv_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
	mcv_gguf_w_str(w, "tokenizer.ggml.pre", "qwen35");
	mcv_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, n);
	mcv_gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_I32, type, n);
	mcv_gguf_w_arr_str(w, "tokenizer.ggml.merges", mg, merges->n);
	int64_t eos = -1, pad = -1;
	for (int64_t i = 0; i < n; i++)
		if (!strcmp(tok[i], "<|endoftext|>"))
			pad = i;
	if (mcv_json_int(m->text, "eos_token_id", &eos) && mcv_json_int(m->cfg, "eos_token_id", &eos))
		eos = pad;
	if (eos >= 0)
		mcv_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
	if (pad >= 0) {
		mcv_gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
		mcv_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)pad);
	}
	mcv_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
	const mcv_json *tmpl = mcv_json_get(m->tokcfg, "chat_template");
	if (tmpl && tmpl->type == MCV_JSON_STR)
		mcv_gguf_w_str(w, "tokenizer.chat_template", tmpl->str);
out:
	for (int64_t i = 0; pads && i < n; i++)
		free(pads[i]);
	for (size_t i = 0; mg_own && i < merges->n; i++)
		free(mg_own[i]);
	free(tok);
	free(type);
	free(pads);
	free(mg);
	free(mg_own);
	return rc;
}

int mcv_hfmodel_write_kv(const mcv_hfmodel *m, mcv_gguf_writer *w)
{
	const char *a = m->arch;
	mcv_gguf_w_str(w, "general.architecture", a);
	mcv_gguf_w_str(w, "general.name", m->name);
	int64_t hidden = cfg_int(m, "hidden_size", 0), nh = cfg_int(m, "num_attention_heads", 0);
	int64_t hd = cfg_int(m, "head_dim", nh ? hidden / nh : 0);
	kv_u32(w, a, "block_count", cfg_int(m, "num_hidden_layers", 0));
	kv_u32(w, a, "context_length", cfg_int(m, "max_position_embeddings", 4096));
	kv_u32(w, a, "embedding_length", hidden);
	if (m->n_expert <= 0)
		kv_u32(w, a, "feed_forward_length", cfg_int(m, "intermediate_size", 0));
	kv_u32(w, a, "attention.head_count", nh);
	kv_u32(w, a, "attention.head_count_kv", cfg_int(m, "num_key_value_heads", nh));
	kv_u32(w, a, "attention.key_length", hd);
	kv_u32(w, a, "attention.value_length", hd);
	kv_f32(w, a, "attention.layer_norm_rms_epsilon", cfg_num(m, "rms_norm_eps", 1e-6));
	kv_f32(w, a, "rope.freq_base", cfg_num(m, "rope_theta", 1e7));
	kv_u32(w, a, "rope.dimension_count", (int64_t)(hd * cfg_num(m, "partial_rotary_factor", 0.25)));
	int32_t sec[4] = { 11, 11, 10, 0 };
	const mcv_json *rp = mcv_json_get(m->text, "rope_parameters");
	if (!rp)
		rp = mcv_json_get(m->text, "rope_scaling");
	const mcv_json *ms = mcv_json_get(rp, "mrope_section");
	if (ms && ms->type == MCV_JSON_ARR && ms->n >= 1 && ms->n <= 4) {
		memset(sec, 0, sizeof sec);
		for (size_t i = 0; i < ms->n; i++)
			sec[i] = (int32_t)ms->kids[i].num;
	}
	char key[128];
	snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
	mcv_gguf_w_arr(w, key, GGUF_I32, sec, 4);
	kv_u32(w, a, "ssm.conv_kernel", cfg_int(m, "linear_conv_kernel_dim", 4));
	kv_u32(w, a, "ssm.state_size", m->dims.head_k_dim);
	kv_u32(w, a, "ssm.group_count", m->dims.n_k_heads);
	kv_u32(w, a, "ssm.time_step_rank", m->dims.n_v_heads);
	kv_u32(w, a, "ssm.inner_size", (int64_t)m->dims.head_v_dim * m->dims.n_v_heads);
	kv_u32(w, a, "full_attention_interval", cfg_int(m, "full_attention_interval", 4));
	if (m->n_expert > 0) {
		kv_u32(w, a, "expert_count", m->n_expert);
		kv_u32(w, a, "expert_used_count", cfg_int(m, "num_experts_per_tok", 0));
		kv_u32(w, a, "expert_feed_forward_length", cfg_int(m, "moe_intermediate_size", 0));
		kv_u32(w, a, "expert_shared_feed_forward_length", cfg_int(m, "shared_expert_intermediate_size", 0));
	}
	mcv_error err;
	int rc = tokenizer_kv(m, w, &err);
	return rc;
}

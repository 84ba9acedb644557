/* Packed-file writer; see pack.h and mcv(7) "Packed model". */
#include "pack.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mcv_pack_params mcv_pack_default_params(void)
{
	return (mcv_pack_params){ 0 };
}

static int check_order(const int *order, int L, int E, mcv_error *err)
{
	char *seen = malloc((size_t)E);
	if (!seen)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	for (int il = 0; il < L; il++) {
		memset(seen, 0, (size_t)E);
		for (int p = 0; p < E; p++) {
			int e = order[(size_t)il * E + p];
			if (e < 0 || e >= E || seen[e]) {
				free(seen);
				return mcv_error_set(err, MCV_EINVAL,
						     "expert order of layer %d is not a permutation of 0..%d",
						     il, E - 1);
			}
			seen[e] = 1;
		}
	}
	free(seen);
	return 0;
}

static void expert_name(char *buf, size_t n, int il, const char *kind, int e)
{
	snprintf(buf, n, "blk.%d.%s.%d.weight", il, kind, e);
}

int mcv_pack_write(const mcv_layout *l, const char *path, const mcv_pack_params *pp,
		   mcv_error *err)
{
	mcv_pack_params p = pp ? *pp : mcv_pack_default_params();
	const mcv_gguf *g = mcv_layout_gguf(l);
	int L = mcv_layout_n_layer(l), E = mcv_layout_n_expert(l);
	bool fused = mcv_layout_fused(l);
	int rc;
	int32_t *order = malloc((size_t)L * E * sizeof *order);
	if (!order)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	for (int il = 0; il < L; il++)
		for (int q = 0; q < E; q++)
			order[(size_t)il * E + q] = p.order ? p.order[(size_t)il * E + q]
							    : mcv_layout_order(l, il)[q];
	if ((rc = check_order(order, L, E, err))) {
		free(order);
		return rc;
	}
	mcv_gguf_writer *w;
	if ((rc = mcv_gguf_writer_open(&w, path, err))) {
		free(order);
		return rc;
	}

	/* Keys: every source key verbatim, in place, except the layout ones. */
	bool have_align = false;
	for (int64_t i = 0; i < mcv_gguf_n_kv(g); i++) {
		const char *k = mcv_gguf_key(g, i);
		if (strncmp(k, "mcv.pack.", 9) == 0)
			continue;
		if (strcmp(k, "general.alignment") == 0) {
			mcv_gguf_writer_set_alignment(w, MCV_PACK_ALIGN);
			have_align = true;
			continue;
		}
		mcv_gguf_w_copy_kv(w, g, i);
	}
	if (!have_align)
		mcv_gguf_writer_set_alignment(w, MCV_PACK_ALIGN);
	mcv_gguf_w_u32(w, "mcv.pack.version", MCV_PACK_VERSION);
	mcv_gguf_w_u32(w, "mcv.pack.alignment", MCV_PACK_ALIGN);
	mcv_gguf_w_arr(w, "mcv.pack.expert_order", GGUF_I32, order, (uint64_t)L * E);

	/* Tensor infos: non-expert tensors first, in source order (one region
	 * a loader maps at once), then each layer's experts in order. */
	int64_t nt = mcv_gguf_n_tensors(g);
	uint64_t total = 0, done = 0;
	for (int64_t i = 0; i < nt; i++) {
		if (mcv_layout_is_expert_tensor(l, i))
			continue;
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		mcv_gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
		total += t->nbytes;
	}
	char name[MCV_GGUF_MAX_NAME + 32];
	for (int il = 0; il < L; il++) {
		for (int q = 0; q < E; q++) {
			int e = order[(size_t)il * E + q];
			const mcv_expert_extent *x = mcv_layout_expert(l, il, e);
			if (fused) {
				int64_t ne[2] = { x->s[0].cols, x->s[0].rows + x->s[1].rows };
				expert_name(name, sizeof name, il, "ffn_gate_up_exps", e);
				mcv_gguf_w_add_tensor(w, name, x->s[0].type, 2, ne);
			} else {
				int64_t ng[2] = { x->s[0].cols, x->s[0].rows };
				int64_t nu[2] = { x->s[1].cols, x->s[1].rows };
				expert_name(name, sizeof name, il, "ffn_gate_exps", e);
				mcv_gguf_w_add_tensor(w, name, x->s[0].type, 2, ng);
				expert_name(name, sizeof name, il, "ffn_up_exps", e);
				mcv_gguf_w_add_tensor(w, name, x->s[1].type, 2, nu);
			}
			int64_t nd[2] = { x->s[2].cols, x->s[2].rows };
			expert_name(name, sizeof name, il, "ffn_down_exps", e);
			mcv_gguf_w_add_tensor(w, name, x->s[2].type, 2, nd);
			total += x->s[0].bytes + x->s[1].bytes + x->s[2].bytes;
		}
	}
	mcv_gguf_w_begin_data(w);

	for (int64_t i = 0; i < nt && !mcv_gguf_writer_error(w); i++) {
		if (mcv_layout_is_expert_tensor(l, i))
			continue;
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		mcv_gguf_w_write(w, t->data, t->nbytes);
		mcv_gguf_w_end_tensor(w);
		done += t->nbytes;
	}
	if (p.progress)
		p.progress(p.user, done, total);
	for (int il = 0; il < L && !mcv_gguf_writer_error(w); il++) {
		for (int q = 0; q < E; q++) {
			if (p.cancel && *p.cancel) {
				free(order);
				mcv_gguf_writer_abort(w);
				return mcv_error_set(err, MCV_EIO, "interrupted");
			}
			int e = order[(size_t)il * E + q];
			const mcv_expert_extent *x = mcv_layout_expert(l, il, e);
			for (int s = 0; s < 3; s++) {
				mcv_gguf_w_write(w, mcv_layout_slice_data(l, il, e, s), x->s[s].bytes);
				/* a fused gate_up tensor holds gate then up */
				if (!(fused && s == 0))
					mcv_gguf_w_end_tensor(w);
				done += x->s[s].bytes;
			}
		}
		if (p.progress)
			p.progress(p.user, done, total);
	}
	free(order);
	return mcv_gguf_writer_finish(w, err);
}

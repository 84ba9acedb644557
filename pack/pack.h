/* Expert layout of a qwen35moe GGUF, plain or packed, and the packed-file
 * writer.  This is the one place that knows both layouts: the LES runtime
 * reads experts through mcv_layout_expert() and never looks at tensor names.
 *
 * Plain file (llama.cpp's layout): per layer three 3-D tensors,
 *   blk.N.ffn_gate_exps.weight [H, F, E], blk.N.ffn_up_exps.weight [H, F, E],
 *   blk.N.ffn_down_exps.weight [F, H, E]
 * (or blk.N.ffn_gate_up_exps.weight [H, 2F, E] instead of gate and up, gate
 * rows first).  Expert e's gate slice is bytes [e*F*rb, (e+1)*F*rb) of the
 * gate tensor, rb = bytes of one row; its three slices lie in three distant
 * places and start wherever the row arithmetic puts them (not page-aligned).
 *
 * Packed file (mcv-pack output, see mcv(7) "Packed model"): a GGUF v3 with
 * general.alignment 4096; non-expert tensors first, in one region; then per
 * layer, per expert in mcv.pack.expert_order, the 2-D tensors
 *   blk.N.ffn_gate_exps.E.weight [H, F], blk.N.ffn_up_exps.E.weight [H, F],
 *   blk.N.ffn_down_exps.E.weight [F, H]
 * (or blk.N.ffn_gate_up_exps.E.weight [H, 2F] and down) back to back, each
 * starting on a 4 KiB boundary: one expert is one contiguous extent, and a
 * read of [read_offset, read_offset + read_bytes) fetches it with O_DIRECT.
 *
 * All offsets here are absolute file offsets (pread()-ready). */
#ifndef MCV_PACK_H
#define MCV_PACK_H

#include "gguf.h"
#include "mcv.h"
#include <stdbool.h>
#include <stdint.h>

#define MCV_PACK_VERSION 1
#define MCV_PACK_ALIGN 4096u /* data alignment of a packed file, and O_DIRECT granule */

enum { MCV_SLICE_GATE = 0, MCV_SLICE_UP = 1, MCV_SLICE_DOWN = 2 };

/* One expert's matrix: rows of cols elements of type, row_bytes apart. */
typedef struct mcv_expert_slice {
	uint64_t offset;   /* absolute file offset of the first row */
	uint64_t bytes;    /* rows * row_bytes */
	int type;          /* ggml type id */
	int64_t rows;      /* output features (F for gate/up, H for down) */
	int64_t cols;      /* input features = elements per row (ne0) */
	uint64_t row_bytes;
} mcv_expert_slice;

typedef struct mcv_expert_extent {
	mcv_expert_slice s[3]; /* MCV_SLICE_GATE, _UP, _DOWN */
	/* contiguous: gate, up and down follow each other in that order with
	 * less than MCV_PACK_ALIGN bytes of padding between them; then
	 * [offset, offset + bytes) holds all three.  Otherwise offset/bytes
	 * are 0. */
	bool contiguous;
	bool aligned;      /* contiguous and offset % MCV_PACK_ALIGN == 0 */
	uint64_t offset, bytes;
	/* The extent rounded out to MCV_PACK_ALIGN and clipped to the file
	 * (only when contiguous; 0 otherwise): what one direct read fetches. */
	uint64_t read_offset, read_bytes;
	int position;      /* storage rank of this expert in its layer, 0..E-1 */
} mcv_expert_extent;

typedef struct mcv_layout mcv_layout;

/* Builds the layout of an open GGUF (g must outlive the layout).  Errors:
 * MCV_EUNSUPPORTED "no expert tensors ..." for a model without experts (a
 * dense qwen35), MCV_EFORMAT for a malformed or inconsistent file (wrong
 * shapes, a packed file with a missing expert, an expert_order that does not
 * match the offsets), MCV_ENOTFOUND for a missing metadata key. */
int mcv_layout_open(mcv_layout **out, const mcv_gguf *g, mcv_error *err);
void mcv_layout_free(mcv_layout *l);

const mcv_gguf *mcv_layout_gguf(const mcv_layout *l);
bool mcv_layout_packed(const mcv_layout *l);
bool mcv_layout_fused(const mcv_layout *l);      /* gate_up in one tensor */
const char *mcv_layout_arch(const mcv_layout *l);
int mcv_layout_n_layer(const mcv_layout *l);
int mcv_layout_n_expert(const mcv_layout *l);
int mcv_layout_n_expert_used(const mcv_layout *l);
int64_t mcv_layout_n_embd(const mcv_layout *l); /* H */
int64_t mcv_layout_n_ff(const mcv_layout *l);   /* F */

/* Expert e of layer il (NULL when out of range). */
const mcv_expert_extent *mcv_layout_expert(const mcv_layout *l, int il, int e);
/* Slice s (MCV_SLICE_*) of expert e in layer il, in the reader's mapping
 * (the mmap path: no copy, pages fault in on touch); NULL out of range. */
const void *mcv_layout_slice_data(const mcv_layout *l, int il, int e, int s);
/* Expert ids of layer il in storage order (n_expert entries). */
const int *mcv_layout_order(const mcv_layout *l, int il);
/* Sum of the three slices' bytes over the layer's experts (no padding). */
uint64_t mcv_layout_layer_bytes(const mcv_layout *l, int il);
/* Whether tensor i of the GGUF holds expert weights. */
bool mcv_layout_is_expert_tensor(const mcv_layout *l, int64_t i);
int64_t mcv_layout_n_nonexpert(const mcv_layout *l);    /* tensor count */
uint64_t mcv_layout_nonexpert_bytes(const mcv_layout *l); /* their data bytes */
/* When every non-expert tensor lies before every expert tensor (a packed
 * file), their data is the one region [*off, *off + *bytes), rounded out to
 * MCV_PACK_ALIGN, and this returns true; otherwise false and 0, 0. */
bool mcv_layout_nonexpert_region(const mcv_layout *l, uint64_t *off, uint64_t *bytes);

/* Identity of the model independent of storage: a 64-bit FNV-1a hash of the
 * architecture and of every tensor's logical name and shape (a packed
 * file's per-expert tensors counted as the plain 3-D ones), sorted by name.
 * Block types are left out, so quantizing or packing a model keeps it;
 * another shape or tensor set changes it. */
uint64_t mcv_layout_fingerprint(const mcv_layout *l);

/* ---- ordering (pack/order.c) ---- */

/* Co-selection counts of one layer: cnt[i*E + j] = tokens that chose both
 * i and j (i != j); freq[i] = tokens that chose i. */
typedef struct mcv_cosel {
	int n_expert;
	uint64_t *cnt;  /* E*E */
	uint64_t *freq; /* E */
	uint64_t n_tokens;
} mcv_cosel;

/* 0, MCV_EINVAL (E out of 1..65536) or MCV_ENOMEM. */
int mcv_cosel_init(mcv_cosel *c, int n_expert);
/* One token's k chosen ids (out-of-range and repeated ids are ignored). */
void mcv_cosel_add(mcv_cosel *c, const int32_t *ids, int k);
void mcv_cosel_free(mcv_cosel *c);
/* Greedy chain: start at the most chosen expert; then repeatedly append the
 * unplaced expert with the highest score, score(j) = sum over the last
 * w = max(1, k-1) placed experts p_d (d = 1 nearest) of cnt[p_d][j] / d;
 * ties go to the more frequent, then the lower id.  order[E] receives
 * expert ids in storage order. */
void mcv_order_chain(const mcv_cosel *c, int k, int *order);
/* Mean |pos(i) - pos(j)| over every token's pairs of chosen experts, where
 * pos is the storage rank given by order (expert ids in storage order). */
double mcv_order_mean_distance(const mcv_cosel *c, const int *order);

/* ---- writer (pack/pack_write.c) ---- */

typedef struct mcv_pack_params {
	/* n_layer * n_expert expert ids, layer-major; each layer a permutation;
	 * NULL keeps the source's order (identity for a plain file). */
	const int *order;
	/* called after each layer with bytes done / total (may be NULL) */
	void (*progress)(void *user, uint64_t done, uint64_t total);
	void *user;
	/* when non-NULL and set (e.g. by a signal handler), the writer stops
	 * at the next expert, removes its temporary file and returns MCV_EIO */
	volatile const int *cancel;
} mcv_pack_params;

mcv_pack_params mcv_pack_default_params(void);
/* Writes the packed form of l's file to path ("-" = stdout) through the
 * atomic GGUF writer: every source key copied verbatim except
 * general.alignment (4096) and mcv.pack.*, which are rewritten. */
int mcv_pack_write(const mcv_layout *l, const char *path, const mcv_pack_params *p,
		   mcv_error *err);

/* Compares two layouts of the same model (e.g. plain and packed): every
 * expert slice and every non-expert tensor byte for byte.  0 when equal,
 * MCV_EFORMAT naming the first difference. */
int mcv_layout_compare(const mcv_layout *a, const mcv_layout *b, mcv_error *err);

#endif

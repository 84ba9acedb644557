/* llama.cpp's fixed quantization recipes (llama_model_quantize's per-tensor
 * type choice for an ftype such as Q4_K_M), reproduced for the qwen35 and
 * qwen35moe architectures, plus --type REGEX=TYPE overrides.
 *
 * The choice depends on the order in which llama.cpp visits tensors (its
 * attn_v counter), so mcv_recipe_assign() takes the whole tensor list and
 * visits it in llama.cpp's order: non-layer tensors first, then by layer,
 * by name within each. */
#ifndef MCV_RECIPE_H
#define MCV_RECIPE_H

#include "mcv.h"
#include <stdint.h>

/* llama_ftype values (llama.h), written to general.file_type. */
enum {
	MCV_FTYPE_ALL_F32 = 0,
	MCV_FTYPE_F16 = 1,
	MCV_FTYPE_Q4_0 = 2,
	MCV_FTYPE_Q8_0 = 7,
	MCV_FTYPE_Q2_K = 10,
	MCV_FTYPE_Q3_K_M = 12,
	MCV_FTYPE_Q4_K_S = 14,
	MCV_FTYPE_Q4_K_M = 15,
	MCV_FTYPE_Q5_K_M = 17,
	MCV_FTYPE_Q6_K = 18,
	MCV_FTYPE_BF16 = 32,
};

/* "q4_k_m" (case-insensitive) -> MCV_FTYPE_*, or -1. */
int mcv_recipe_from_name(const char *name);
const char *mcv_recipe_name(int ftype);
/* The ggml type most tensors get under ftype (Q4_K for Q4_K_M ...), or -1. */
int mcv_recipe_default_type(int ftype);

/* The hyper-parameters the rules look at. */
typedef struct mcv_recipe_model {
	int n_layer;   /* block_count */
	int n_expert;  /* expert_count (0 for dense) */
	int n_head;    /* attention.head_count (layer 0) */
	int n_head_kv; /* attention.head_count_kv (layer 0) */
} mcv_recipe_model;

typedef struct mcv_recipe_tensor {
	const char *name;
	int n_dims;
	int64_t ne[4];
	int type;      /* the input's type */
} mcv_recipe_tensor;

typedef struct mcv_recipe_override {
	const char *pattern; /* POSIX extended regex, searched in the name */
	int type;
} mcv_recipe_override;

/* Fill out_types[n] with the type of every tensor.  Overrides are tried in
 * order, the first match wins (as llama.cpp's --tensor-type).  Tensors
 * llama.cpp never quantizes (1-D, norms, router, conv1d ...) keep their
 * input type.  A row length that is not a multiple of the chosen block gets
 * llama.cpp's fallback type (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0, then F16 if even 32 does not divide it). */
int mcv_recipe_assign(int ftype, const mcv_recipe_model *m,
		      const mcv_recipe_tensor *t, int n,
		      const mcv_recipe_override *ov, int n_ov, int has_imatrix,
		      int *out_types, mcv_error *err);

/* Whether llama.cpp would quantize this tensor at all. */
int mcv_recipe_quantizable(const mcv_recipe_tensor *t);

#endif

/* A Hugging Face checkpoint directory (config.json, tokenizer.json, one or
 * more *.safetensors) seen as the GGUF llama.cpp's converter would make of
 * it: llama.cpp tensor names and shapes (hfmap.h), qwen35 / qwen35moe
 * metadata from config.json and a gpt2-style vocabulary from tokenizer.json.
 * Tensor data stays in the mappings; rows are produced on demand, already
 * transformed, so a model larger than RAM converts in a stream.
 * Vision-tower and MTP tensors are counted and left out. */
#ifndef MCV_HFMODEL_H
#define MCV_HFMODEL_H

#include "gguf.h"
#include "mcv.h"
#include "recipe.h"
#include <stdint.h>

typedef struct mcv_hfmodel mcv_hfmodel;

typedef struct mcv_hf_tensor {
	char name[64];
	int n_dims;
	int64_t ne[4];
	int src_type; /* MCV_F32 / F16 / BF16 of the (first) source */
} mcv_hf_tensor;

int mcv_hfmodel_open(mcv_hfmodel **out, const char *dir, mcv_error *err);
void mcv_hfmodel_close(mcv_hfmodel *m);

const char *mcv_hfmodel_arch(const mcv_hfmodel *m);
int mcv_hfmodel_n_tensors(const mcv_hfmodel *m);
const mcv_hf_tensor *mcv_hfmodel_tensor(const mcv_hfmodel *m, int i);
int mcv_hfmodel_n_vision(const mcv_hfmodel *m); /* tensors left out */
int mcv_hfmodel_n_skipped(const mcv_hfmodel *m);
void mcv_hfmodel_recipe_model(const mcv_hfmodel *m, mcv_recipe_model *rm);
/* All metadata keys (architecture, hyper-parameters, tokenizer). */
int mcv_hfmodel_write_kv(const mcv_hfmodel *m, mcv_gguf_writer *w);
/* Row r (over ne1*ne2*ne3) of tensor i as ne[0] floats.  Thread-safe. */
void mcv_hfmodel_row(const mcv_hfmodel *m, int i, int64_t r, float *out);

#endif

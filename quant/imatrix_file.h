/* Importance matrices as llama.cpp's tools write them: the GGUF format
 * (tensors NAME.in_sum2 [n, n_mat] and NAME.counts [1, n_mat], F32) and the
 * legacy .dat format (i32 n_entries; per entry i32 name length, name, i32
 * ncall, i32 nval, f32 values[nval]).  Values are normalised as
 * llama-quantize does: in_sum2 / count per matrix (1 where the count is 0),
 * legacy values / ncall.  Bounds-checked: a short or lying file is an
 * MCV_EFORMAT error. */
#ifndef MCV_IMATRIX_FILE_H
#define MCV_IMATRIX_FILE_H

#include "mcv.h"
#include <stdint.h>

typedef struct mcv_imatrix mcv_imatrix;

int mcv_imatrix_load(mcv_imatrix **out, const char *path, mcv_error *err);
void mcv_imatrix_free(mcv_imatrix *im);
int mcv_imatrix_count(const mcv_imatrix *im);
const char *mcv_imatrix_name(const mcv_imatrix *im, int i);
/* The weights for a tensor (llama.cpp's name), n values; NULL if absent. */
const float *mcv_imatrix_find(const mcv_imatrix *im, const char *name, int64_t *n);

#endif

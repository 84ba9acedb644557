/* safetensors: a bounds-checked mmap reader.
 *
 * Layout: u64 LE header length N, N bytes of JSON (an object mapping tensor
 * names to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" object of strings), then the data; offsets are relative to
 * the end of the header.  The header is parsed by a small JSON parser of our
 * own with length and depth limits; every dtype, shape and offset is checked
 * against the file size, byte counts must equal the shape's, and tensors may
 * not overlap.  A truncated, lying or hostile file is an MCV_EFORMAT error. */
#ifndef MCV_SAFETENSORS_H
#define MCV_SAFETENSORS_H

#include "mcv.h"
#include <stdint.h>

#define MCV_ST_MAX_DIMS 8
#define MCV_ST_MAX_HEADER (100u << 20) /* as the reference implementation */

typedef struct mcv_st mcv_st;

typedef struct mcv_st_tensor {
	const char *name;      /* NUL-terminated, unescaped */
	const char *dtype;     /* "F32", "BF16", ... */
	int type;              /* MCV_F32 / MCV_F16 / MCV_BF16, or -1 for other dtypes */
	int elem_size;         /* bytes per element */
	int n_dims;
	int64_t shape[MCV_ST_MAX_DIMS]; /* PyTorch order: shape[n_dims-1] is contiguous */
	uint64_t offset;       /* from the start of the data section */
	uint64_t nbytes;
	const void *data;      /* into the mapping */
} mcv_st_tensor;

int mcv_st_open(mcv_st **out, const char *path, mcv_error *err);
/* The same on a caller-owned buffer (for tests and fuzzing); buf must stay
 * valid while the handle is open. */
int mcv_st_open_buffer(mcv_st **out, const void *buf, uint64_t size, mcv_error *err);
void mcv_st_close(mcv_st *st);

int64_t mcv_st_n_tensors(const mcv_st *st);
const mcv_st_tensor *mcv_st_tensor_at(const mcv_st *st, int64_t i);
const mcv_st_tensor *mcv_st_find(const mcv_st *st, const char *name);
/* A "__metadata__" string value, or NULL. */
const char *mcv_st_meta(const mcv_st *st, const char *key);

#endif

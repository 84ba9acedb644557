/* GGUF v3: a bounds-checked mmap reader and a streaming, atomic writer.
 *
 * Reader: every count, length, offset, dimension, type and the alignment are
 * checked against the file size and sane limits before use, so a truncated,
 * bit-flipped or hostile file is an MCV_EFORMAT error, never a crash or an
 * over-read.  Tensor data is mmapped and faulted in only where touched.
 *
 * Writer: header and tensor infos first, then tensor data streamed in order
 * (each tensor padded to the alignment), into PATH.tmp.XXXXXX which is
 * renamed onto PATH only by mcv_gguf_writer_finish(); abort or a crash never
 * leaves a partial PATH.  PATH "-" streams to stdout. */
#ifndef MCV_GGUF_H
#define MCV_GGUF_H

#include "mcv.h"
#include <stdbool.h>
#include <stdint.h>

/* Metadata value types. */
enum {
	GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4,
	GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8,
	GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
};

#define MCV_GGUF_MAX_DIMS 4
#define MCV_GGUF_MAX_NAME 64          /* tensor names are shorter, as in ggml */
#define MCV_GGUF_DEFAULT_ALIGNMENT 32
#define MCV_GGUF_MAX_ALIGNMENT (1u << 24) /* larger general.alignment is rejected */

typedef struct mcv_gguf mcv_gguf;

typedef struct mcv_gguf_tensor {
	const char *name;      /* NUL-terminated copy */
	int type;              /* ggml type id (quant/quant.h) */
	int n_dims;
	int64_t ne[MCV_GGUF_MAX_DIMS]; /* ggml order: ne[0] is contiguous; unused = 1 */
	uint64_t offset;       /* from the start of the data section */
	uint64_t file_offset;  /* from the start of the file */
	uint64_t nbytes;
	const void *data;      /* into the mapping */
} mcv_gguf_tensor;

int mcv_gguf_open(mcv_gguf **out, const char *path, mcv_error *err);
void mcv_gguf_close(mcv_gguf *g);

uint32_t mcv_gguf_version(const mcv_gguf *g);
uint32_t mcv_gguf_alignment(const mcv_gguf *g);
uint64_t mcv_gguf_data_offset(const mcv_gguf *g); /* file offset of data section */
uint64_t mcv_gguf_file_size(const mcv_gguf *g);
int mcv_gguf_fd(const mcv_gguf *g);                 /* for explicit pread() */
const char *mcv_gguf_path(const mcv_gguf *g);

/* Metadata.  Index-based access plus typed getters by key.  Typed getters
 * accept any integer type whose value fits (u32 from u8/i32/u64..., f32 from
 * f32/f64) and return MCV_ENOTFOUND or MCV_EFORMAT (wrong type) otherwise. */
int64_t mcv_gguf_n_kv(const mcv_gguf *g);
int64_t mcv_gguf_find_key(const mcv_gguf *g, const char *key); /* -1 if absent */
const char *mcv_gguf_key(const mcv_gguf *g, int64_t i);
int mcv_gguf_kv_type(const mcv_gguf *g, int64_t i);
int mcv_gguf_get_u32(const mcv_gguf *g, const char *key, uint32_t *v, mcv_error *err);
int mcv_gguf_get_i64(const mcv_gguf *g, const char *key, int64_t *v, mcv_error *err);
int mcv_gguf_get_f32(const mcv_gguf *g, const char *key, float *v, mcv_error *err);
int mcv_gguf_get_bool(const mcv_gguf *g, const char *key, bool *v, mcv_error *err);
/* NUL-terminated string (embedded NULs are a format error). */
int mcv_gguf_get_str(const mcv_gguf *g, const char *key, const char **v, mcv_error *err);
/* Arrays: element type and count; numeric elements are copied to aligned
 * storage at open time, so *data may be cast to the element's C type. */
int mcv_gguf_get_arr(const mcv_gguf *g, const char *key, int *elem_type,
		     uint64_t *n, const void **data, mcv_error *err);
/* i-th string of a string array (NUL-terminated), with its byte length. */
const char *mcv_gguf_arr_str(const mcv_gguf *g, const char *key, uint64_t i, size_t *len);

/* Tensors. */
int64_t mcv_gguf_n_tensors(const mcv_gguf *g);
const mcv_gguf_tensor *mcv_gguf_tensor_at(const mcv_gguf *g, int64_t i);
const mcv_gguf_tensor *mcv_gguf_find_tensor(const mcv_gguf *g, const char *name);

/* Additions. */
/* "u32", "string", "array", ... ("?" for an unknown id). */
const char *mcv_gguf_type_name(int kv_type);
/* Element type and count of array key i (0 and 0 for a non-array). */
int mcv_gguf_kv_arr_info(const mcv_gguf *g, int64_t i, int *elem_type, uint64_t *n);
/* The serialized bytes of key i in the mapping (key, type, value). */
int mcv_gguf_kv_raw(const mcv_gguf *g, int64_t i, const void **p, size_t *n);
/* Checks a tensor shape (n_dims 1..4, ne >= 0, ne[0] a multiple of the block
 * size, no overflow, type known to mcv) and gives its size in bytes.  Errors
 * name the problem but not the tensor (callers prefix the name). */
int mcv_gguf_tensor_size(int type, int n_dims, const int64_t *ne,
			 uint64_t *nbytes, mcv_error *err);

/* ---- writer ----
 * Keys are written in call order.  A duplicate key or tensor name, a bad
 * shape or type, a key or tensor after begin_data, or a byte count that does
 * not match the declared size is an error that sticks: every later call
 * returns it and finish reports it and removes the temporary file.  Writing
 * general.alignment (w_u32 or w_copy_kv) is the same as set_alignment. */
typedef struct mcv_gguf_writer mcv_gguf_writer;

int mcv_gguf_writer_open(mcv_gguf_writer **out, const char *path, mcv_error *err);
void mcv_gguf_writer_set_alignment(mcv_gguf_writer *w, uint32_t align); /* before begin_data; also writes general.alignment */
int mcv_gguf_w_u32(mcv_gguf_writer *w, const char *key, uint32_t v);
int mcv_gguf_w_i32(mcv_gguf_writer *w, const char *key, int32_t v);
int mcv_gguf_w_u64(mcv_gguf_writer *w, const char *key, uint64_t v);
int mcv_gguf_w_f32(mcv_gguf_writer *w, const char *key, float v);
int mcv_gguf_w_bool(mcv_gguf_writer *w, const char *key, bool v);
int mcv_gguf_w_str(mcv_gguf_writer *w, const char *key, const char *v);
int mcv_gguf_w_arr(mcv_gguf_writer *w, const char *key, int elem_type,
		   const void *data, uint64_t n); /* numeric element types */
int mcv_gguf_w_arr_str(mcv_gguf_writer *w, const char *key,
		       const char *const *v, uint64_t n);
/* Any scalar type (GGUF_U8 .. GGUF_F64 except string/array); *v holds the
 * C value of that type. */
int mcv_gguf_w_scalar(mcv_gguf_writer *w, const char *key, int type, const void *v);
/* Copy key i of an open file verbatim (for tools that rewrite a GGUF). */
int mcv_gguf_w_copy_kv(mcv_gguf_writer *w, const mcv_gguf *src, int64_t i);
/* Declare tensors in file order, then write their data in the same order. */
int mcv_gguf_w_add_tensor(mcv_gguf_writer *w, const char *name, int type,
			  int n_dims, const int64_t *ne);
int mcv_gguf_w_begin_data(mcv_gguf_writer *w); /* header + infos + padding */
int mcv_gguf_w_write(mcv_gguf_writer *w, const void *data, size_t n); /* may be called many times per tensor */
int mcv_gguf_w_end_tensor(mcv_gguf_writer *w); /* checks the byte count, pads */
/* Flush, fsync, rename into place.  Frees w in every case.  With PATH "-"
 * the stream goes to stdout as it is produced: there is nothing to rename,
 * and a failure midway leaves a truncated stream behind. */
int mcv_gguf_writer_finish(mcv_gguf_writer *w, mcv_error *err);
/* Remove the temporary file and free w. */
void mcv_gguf_writer_abort(mcv_gguf_writer *w);
/* The first error the writer met (sticky), or NULL. */
const mcv_error *mcv_gguf_writer_error(const mcv_gguf_writer *w);

#endif

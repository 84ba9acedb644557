/* Internals of the vision tower shared by vision.c (load, slicing) and
 * vision_vit.c (the forward pass).  Not part of the public API. */
#ifndef MCV_VISION_IMPL_H
#define MCV_VISION_IMPL_H

#include "gguf.h"
#include "quant.h"
#include "vision.h"
#include <stddef.h>
#include <stdint.h>

/* A tensor bound from the mapping: ne1 rows of ne0 values, rb bytes each. */
typedef struct mcv_vw {
	const void *data;
	int type;
	int64_t ne0, ne1;
	size_t rb;
} mcv_vw;

typedef struct mcv_lin { mcv_vw w, b; } mcv_lin; /* y = W x + b */
typedef struct mcv_ln { mcv_vw w, b; } mcv_ln;   /* LayerNorm */

typedef struct mcv_vit_layer {
	mcv_ln ln1, ln2;
	mcv_lin q, k, v, o, up, down;
} mcv_vit_layer;

typedef struct mcv_merger {
	mcv_ln ln1, ds_ln;
	mcv_lin q, k, v, o, ds_up, ds_down;
} mcv_merger;

/* The fast path (vision_fast.c): the matrices packed once for the int8
 * products, the patch weights transposed to f32.  NULL when a matrix's
 * type or the build is not handled there (the generic path runs). */
typedef struct mcv_vfast mcv_vfast;

struct mcv_vision {
	mcv_gguf *g;
	int image_size, patch, width, ff, n_layer, n_head, n_proj;
	float eps;
	int merge;         /* file default: 4 (16x) or 2 (4x) */
	int insert_layer;  /* vit_merger after this layer */
	int max_slices;
	int merger_ff, proj_ff, pos_buckets;
	int has_merger;
	float mean[3], std[3];
	mcv_vw patch_w, patch_b, pos;
	mcv_vit_layer *layers;
	mcv_merger merger;
	mcv_ln post_ln, mm_norm;
	mcv_lin mm_up, mm_down;
	mcv_vfast *fast;
	void *scratch;        /* fast-path buffers kept across encodes */
	size_t scratch_size;
	int scratch_busy;     /* taken with an atomic exchange */
};

/* params -> merge (4 or 2) and the slice limit. */
int mcv_vision_resolve(const mcv_vision *v, const mcv_vision_params *p, int *merge,
		       int *max_slices, mcv_error *err);

/* Packs the matrices for the fast path (v->fast stays NULL when it does
 * not apply); fails only for lack of memory. */
int mcv_vision_fast_init(mcv_vision *v, mcv_error *err);
void mcv_vision_fast_free(mcv_vision *v);
/* One crop on the fast path (v->fast set, not exact): as
 * mcv_vision_encode_crop, checks done by the caller. */
int mcv_vision_fast_encode(const mcv_vision *v, const float *chw, int w, int h, int merge, float *out,
			   mcv_error *err);

/* MCV_VISION_PROF=1: per-stage milliseconds on stderr (vision_vit.c):
 * the sums (the last slot counts encodes) and the switch (-1: not read
 * yet). */
void mcv_vprof_report(void);
extern double mcv_vprof_ms[];
extern int mcv_vprof_on;

#endif

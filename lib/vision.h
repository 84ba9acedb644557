/* The vision tower: a SigLIP-style ViT with the MiniCPM-V window-attention
 * merger (intra-ViT compression) and the projector into the language model's
 * hidden size, read from an mmproj GGUF in llama.cpp's clip layout
 * (projector types minicpmv4_6 / minicpmv4_7: v.patch_embd, v.position_embd,
 * v.blk.N.*, v.post_ln, v.vit_merger.*, mm.input_norm, mm.up, mm.down).
 *
 * Computes exactly what scripts/ref/model.py VisionModel computes; the image
 * slicing (overview + grid of slices) is slice_plan / image_to_crops. */
#ifndef MCV_VISION_H
#define MCV_VISION_H

#include "image.h"
#include "mcv.h"
#include <stdint.h>

typedef struct mcv_vision mcv_vision;

typedef struct mcv_vision_params {
	int compress;   /* token compression 4 or 16; 0: the file's default */
	int max_slices; /* slices besides the overview, >= 1; 0: the file's default.
			 * As in the reference and llama.cpp, 1 still cuts an image
			 * larger than image_size into one (1 x 1) slice. */
	int no_slices;  /* 1: the overview only, whatever the size (video frames) */
	double upscale; /* plan the slices as for the image scaled by this (each side
			 * rounded to nearest): small print gets more slices and fewer
			 * glyphs a token. The crops are still one resize of the
			 * original. 0 or 1: as the file's preprocessor plans. */
	int exact;      /* 1: products on weights dequantized to f32 with f32
			 * activations (matches the PyTorch reference to float
			 * rounding; slower); 0: the quantized kernels, activations
			 * converted as llama.cpp does */
} mcv_vision_params;

mcv_vision_params mcv_vision_default_params(void);

/* Fails with a one-line message for an unreadable/hostile file, a wrong
 * projector type, a missing key or tensor, or a mis-shaped tensor. */
int mcv_vision_load(mcv_vision **out, const char *path, mcv_error *err);
void mcv_vision_free(mcv_vision *v);

int mcv_vision_n_embd(const mcv_vision *v);      /* output rows' width (projection dim) */
int mcv_vision_default_compress(const mcv_vision *v); /* 4 or 16 */
int mcv_vision_default_max_slices(const mcv_vision *v);
/* MCV_EINVAL with a clear message unless the projector's output width is
 * n_embd (the language model's hidden size). */
int mcv_vision_check_text(const mcv_vision *v, int n_embd, mcv_error *err);

#define MCV_VISION_MAX_CROPS 64

/* How one image is cut: the overview, then (when cols > 0) a cols x rows
 * grid of slices cut row-major from the image resized to ref_w x ref_h. */
typedef struct mcv_vision_plan {
	int compress;            /* resolved: 4 or 16 */
	int ov_w, ov_h;          /* overview size */
	int cols, rows;          /* slice grid; 0 x 0 without slices */
	int ref_w, ref_h;        /* refined size (0 without slices) */
	int n_crops;             /* 1 + cols * rows */
	int crop_w[MCV_VISION_MAX_CROPS], crop_h[MCV_VISION_MAX_CROPS]; /* pixels */
	int crop_nx[MCV_VISION_MAX_CROPS], crop_ny[MCV_VISION_MAX_CROPS]; /* output token grid */
	int n_tokens;            /* sum of crop_nx * crop_ny */
} mcv_vision_plan;

int mcv_vision_plan_image(const mcv_vision *v, int w, int h, const mcv_vision_params *p,
			  mcv_vision_plan *plan, mcv_error *err);

/* Crop i of the plan as normalised planar float CHW (3 * crop_w * crop_h
 * floats, malloc'ed into *chw), resized with PIL's bicubic filter. */
int mcv_vision_crop_f32(const mcv_vision *v, const mcv_image *img, const mcv_vision_plan *plan,
			int i, float **chw, mcv_error *err);

/* All crops at once (one resize for the slices): chw[plan->n_crops] are
 * malloc'ed (free each); on failure none are left allocated. */
int mcv_vision_crops_f32(const mcv_vision *v, const mcv_image *img, const mcv_vision_plan *plan,
			 float **chw, mcv_error *err);

/* Encode one crop (CHW floats, w and h multiples of patch * merge, where
 * merge is 4 at 16x and 2 at 4x) into out[ny][nx][n_embd] row-major
 * (nx = w / (patch*merge), ny likewise).  OpenMP inside; results do not
 * depend on the thread count. */
int mcv_vision_encode_crop(const mcv_vision *v, const float *chw, int w, int h,
			   const mcv_vision_params *p, float *out, mcv_error *err);

#endif

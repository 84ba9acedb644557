/* RGB images in memory and the resampling the vision tower needs.
 *
 * An mcv_image is 8-bit RGB, row-major, no padding: pixel (x, y) channel c is
 * rgb[(y * w + x) * 3 + c].  Decoders (media.h) produce them; the vision
 * tower consumes them through mcv_image_resize / mcv_image_crop /
 * mcv_image_to_f32.
 *
 * Resampling reproduces PIL's Image.resize (the PyTorch reference calls
 * img.resize(size, Image.BICUBIC)) bit for bit: separable filters whose
 * support widens with the downscale factor (antialiasing), horizontal pass
 * first, 8-bit rounding after each pass. */
#ifndef MCV_IMAGE_H
#define MCV_IMAGE_H

#include "mcv.h"
#include <stdint.h>

typedef struct mcv_image {
	int w, h;
	uint8_t *rgb; /* w * h * 3 bytes, malloc'ed; NULL when empty */
} mcv_image;

typedef enum mcv_resize_filter {
	MCV_RESIZE_BICUBIC = 0, /* PIL BICUBIC (a = -0.5): the model's choice */
	MCV_RESIZE_BILINEAR = 1, /* PIL BILINEAR (triangle) */
} mcv_resize_filter;

/* Allocate a w x h image (contents undefined).  Sides must be 1..65535 and
 * w*h*3 must fit; MCV_EINVAL / MCV_ENOMEM otherwise. */
int mcv_image_alloc(mcv_image *im, int w, int h, mcv_error *err);
/* Free the pixels and zero the struct.  Safe on a zeroed or freed image. */
void mcv_image_free(mcv_image *im);

/* dst = src resized to w x h with PIL's algorithm (see above).  dst must not
 * alias src; it is allocated here (any old contents of *dst are NOT freed). */
int mcv_image_resize(const mcv_image *src, int w, int h, mcv_resize_filter f,
		     mcv_image *dst, mcv_error *err);

/* dst = the w x h rectangle of src whose top-left is (x, y); the rectangle
 * must lie inside src (MCV_EINVAL otherwise).  Like PIL's img.crop. */
int mcv_image_crop(const mcv_image *src, int x, int y, int w, int h,
		   mcv_image *dst, mcv_error *err);

/* Normalise into planar float CHW: out[c * h * w + y * w + x] =
 * (rgb / 255 - mean[c]) / std[c].  mean/std NULL = SigLIP (0.5, 0.5, 0.5),
 * i.e. values in [-1, 1].  out holds 3 * w * h floats. */
void mcv_image_to_f32(const mcv_image *im, const float mean[3], const float std[3],
		      float *out);

/* mcv_image_resize to w x h, then mcv_image_to_f32 into out (3 * w * h
 * floats, CHW).  What the vision tower feeds its patch embedding. */
int mcv_image_resize_f32(const mcv_image *src, int w, int h, mcv_resize_filter f,
			 const float mean[3], const float std[3], float *out,
			 mcv_error *err);

/* Apply an EXIF orientation (1..8, TIFF tag 0x0112) so the image reads as
 * displayed: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90
 * clockwise, 7 transverse, 8 rotate 90 counter-clockwise.  1 and values
 * out of range leave the image as it is.  Replaces im->rgb. */
int mcv_image_orient(mcv_image *im, int orientation, mcv_error *err);

#endif

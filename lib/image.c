/* RGB images: allocation, PIL-compatible resampling, crop, normalisation,
 * EXIF orientation. */
#include "image.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mcv_image_alloc(mcv_image *im, int w, int h, mcv_error *err)
{
	im->w = im->h = 0;
	im->rgb = NULL;
	if (w < 1 || h < 1 || w > 65535 || h > 65535)
		return mcv_error_set(err, MCV_EINVAL, "image size %dx%d out of range", w, h);
	size_t n = (size_t)w * (size_t)h * 3;
	im->rgb = malloc(n);
	if (!im->rgb)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for a %dx%d image", w, h);
	im->w = w;
	im->h = h;
	return 0;
}

void mcv_image_free(mcv_image *im)
{
	if (!im)
		return;
	free(im->rgb);
	im->rgb = NULL;
	im->w = im->h = 0;
}

/* ---------------------------------------------------------------- resampling
 * Same arithmetic as PIL's Resample.c so that our pixels equal the PyTorch
 * reference's (it resizes with PIL): the filter is stretched by the scale
 * when shrinking, taps are normalised to sum 1, then turned into 22-bit
 * fixed point; each pass rounds and clamps to 8 bits. */

#define FIX_BITS 22

static double filt_bicubic(double x)
{
	const double a = -0.5;
	x = fabs(x);
	if (x < 1.0)
		return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
	if (x < 2.0)
		return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
	return 0.0;
}

static double filt_bilinear(double x)
{
	x = fabs(x);
	return x < 1.0 ? 1.0 - x : 0.0;
}

/* Taps for one axis: for output i, source span [lo[i], lo[i]+cnt[i]) with
 * weights coef[i*ksize ...]. */
typedef struct taps {
	int ksize;
	int *lo, *cnt;
	int32_t *coef;
} taps;

static void taps_free(taps *t)
{
	free(t->lo);
	free(t->cnt);
	free(t->coef);
}

static int taps_make(taps *t, int in, int out, mcv_resize_filter f)
{
	double support = f == MCV_RESIZE_BILINEAR ? 1.0 : 2.0;
	double (*fn)(double) = f == MCV_RESIZE_BILINEAR ? filt_bilinear : filt_bicubic;
	double scale = (double)in / out;
	double fscale = scale < 1.0 ? 1.0 : scale;
	support *= fscale;
	t->ksize = (int)ceil(support) * 2 + 1;
	t->lo = malloc(sizeof(int) * out);
	t->cnt = malloc(sizeof(int) * out);
	t->coef = calloc((size_t)out * t->ksize, sizeof(int32_t));
	double *k = malloc(sizeof(double) * t->ksize);
	if (!t->lo || !t->cnt || !t->coef || !k) {
		free(k);
		taps_free(t);
		return -1;
	}
	double inv = 1.0 / fscale;
	for (int i = 0; i < out; i++) {
		double center = (i + 0.5) * scale;
		int lo = (int)(center - support + 0.5);
		if (lo < 0)
			lo = 0;
		int hi = (int)(center + support + 0.5);
		if (hi > in)
			hi = in;
		int n = hi - lo;
		if (n > t->ksize)
			n = t->ksize;
		double sum = 0;
		for (int j = 0; j < n; j++) {
			k[j] = fn((j + lo - center + 0.5) * inv);
			sum += k[j];
		}
		for (int j = 0; j < n; j++) {
			double v = sum != 0.0 ? k[j] / sum : k[j];
			t->coef[(size_t)i * t->ksize + j] =
				(int32_t)(v * (1 << FIX_BITS) + (v < 0 ? -0.5 : 0.5));
		}
		t->lo[i] = lo;
		t->cnt[i] = n;
	}
	free(k);
	return 0;
}

/* 32-bit sums cannot overflow: taps sum to 1 << 22 and the positive ones
 * to less than 1.1 << 22, times 255. */
static inline uint8_t clamp8(int32_t v)
{
	v >>= FIX_BITS;
	return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* src rows [y0, y0+rows) of width sw -> dst (rows x dw), horizontal taps. */
static void pass_h(const uint8_t *src, int sw, uint8_t *dst, int dw, int rows,
		   const taps *t)
{
#pragma omp parallel for if ((int64_t)rows * dw > 65536) schedule(static)
	for (int y = 0; y < rows; y++) {
		const uint8_t *s = src + (size_t)y * sw * 3;
		uint8_t *d = dst + (size_t)y * dw * 3;
		for (int x = 0; x < dw; x++) {
			const int32_t *k = t->coef + (size_t)x * t->ksize;
			const uint8_t *p = s + (size_t)t->lo[x] * 3;
			int32_t r = 1 << (FIX_BITS - 1), g = r, b = r;
			for (int j = 0; j < t->cnt[x]; j++) {
				r += p[j * 3] * k[j];
				g += p[j * 3 + 1] * k[j];
				b += p[j * 3 + 2] * k[j];
			}
			d[x * 3] = clamp8(r);
			d[x * 3 + 1] = clamp8(g);
			d[x * 3 + 2] = clamp8(b);
		}
	}
}

/* src (any rows, width w) -> dst (dh rows), vertical taps offset by y0.
 * Whole rows are accumulated at once: unit-stride loops that vectorise. */
static int pass_v(const uint8_t *src, int w, uint8_t *dst, int dh, int y0,
		  const taps *t)
{
	size_t n = (size_t)w * 3;
	int fail = 0;
#pragma omp parallel if ((int64_t)dh * w > 65536)
	{
		int32_t *acc = malloc(n * sizeof *acc);
		if (!acc) {
#pragma omp atomic write
			fail = 1;
		}
#pragma omp for schedule(static)
		for (int y = 0; y < dh; y++) {
			if (!acc)
				continue;
			const int32_t *k = t->coef + (size_t)y * t->ksize;
			const uint8_t *s = src + (size_t)(t->lo[y] - y0) * n;
			for (size_t x = 0; x < n; x++)
				acc[x] = 1 << (FIX_BITS - 1);
			for (int j = 0; j < t->cnt[y]; j++) {
				const uint8_t *row = s + (size_t)j * n;
				int32_t kj = k[j];
				for (size_t x = 0; x < n; x++)
					acc[x] += row[x] * kj;
			}
			uint8_t *d = dst + (size_t)y * n;
			for (size_t x = 0; x < n; x++)
				d[x] = clamp8(acc[x]);
		}
		free(acc);
	}
	return fail ? -1 : 0;
}

int mcv_image_resize(const mcv_image *src, int w, int h, mcv_resize_filter f,
		     mcv_image *dst, mcv_error *err)
{
	dst->w = dst->h = 0;
	dst->rgb = NULL;
	if (!src || !src->rgb || src->w < 1 || src->h < 1)
		return mcv_error_set(err, MCV_EINVAL, "resize of an empty image");
	if (f != MCV_RESIZE_BICUBIC && f != MCV_RESIZE_BILINEAR)
		return mcv_error_set(err, MCV_EINVAL, "unknown resize filter %d", (int)f);
	int rc = mcv_image_alloc(dst, w, h, err);
	if (rc)
		return rc;
	int need_h = w != src->w, need_v = h != src->h;
	if (!need_h && !need_v) {
		memcpy(dst->rgb, src->rgb, (size_t)w * h * 3);
		return 0;
	}
	taps th = {0}, tv = {0};
	uint8_t *tmp = NULL;
	if ((need_h && taps_make(&th, src->w, w, f)) || (need_v && taps_make(&tv, src->h, h, f))) {
		taps_free(&th);
		mcv_image_free(dst);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory resizing to %dx%d", w, h);
	}
	if (need_h && need_v) {
		/* Only the source rows the vertical pass reads go through the
		 * horizontal pass (PIL does the same; the result is identical). */
		int y0 = tv.lo[0], y1 = tv.lo[h - 1] + tv.cnt[h - 1];
		tmp = malloc((size_t)(y1 - y0) * w * 3);
		if (!tmp) {
			taps_free(&th);
			taps_free(&tv);
			mcv_image_free(dst);
			return mcv_error_set(err, MCV_ENOMEM, "out of memory resizing to %dx%d", w, h);
		}
		pass_h(src->rgb + (size_t)y0 * src->w * 3, src->w, tmp, w, y1 - y0, &th);
		rc = pass_v(tmp, w, dst->rgb, h, y0, &tv);
		free(tmp);
	} else if (need_h) {
		pass_h(src->rgb, src->w, dst->rgb, w, h, &th);
	} else {
		rc = pass_v(src->rgb, w, dst->rgb, h, 0, &tv);
	}
	taps_free(&th);
	taps_free(&tv);
	if (rc) {
		mcv_image_free(dst);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory resizing to %dx%d", w, h);
	}
	return 0;
}

int mcv_image_crop(const mcv_image *src, int x, int y, int w, int h, mcv_image *dst,
		   mcv_error *err)
{
	dst->w = dst->h = 0;
	dst->rgb = NULL;
	if (!src || !src->rgb || x < 0 || y < 0 || w < 1 || h < 1 || x > src->w - w ||
	    y > src->h - h)
		return mcv_error_set(err, MCV_EINVAL, "crop %dx%d+%d+%d outside a %dx%d image",
				     w, h, x, y, src ? src->w : 0, src ? src->h : 0);
	int rc = mcv_image_alloc(dst, w, h, err);
	if (rc)
		return rc;
	for (int r = 0; r < h; r++)
		memcpy(dst->rgb + (size_t)r * w * 3,
		       src->rgb + ((size_t)(y + r) * src->w + x) * 3, (size_t)w * 3);
	return 0;
}

void mcv_image_to_f32(const mcv_image *im, const float mean[3], const float std[3],
		      float *out)
{
	static const float half[3] = {0.5f, 0.5f, 0.5f};
	if (!mean)
		mean = half;
	if (!std)
		std = half;
	size_t n = (size_t)im->w * im->h;
	for (int c = 0; c < 3; c++) {
		/* Same operation order as the reference: x/255, then -mean, /std. */
		float *o = out + c * n;
		for (size_t i = 0; i < n; i++)
			o[i] = (im->rgb[i * 3 + c] / 255.0f - mean[c]) / std[c];
	}
}

int mcv_image_resize_f32(const mcv_image *src, int w, int h, mcv_resize_filter f,
			 const float mean[3], const float std[3], float *out, mcv_error *err)
{
	mcv_image tmp;
	int rc = mcv_image_resize(src, w, h, f, &tmp, err);
	if (rc)
		return rc;
	mcv_image_to_f32(&tmp, mean, std, out);
	mcv_image_free(&tmp);
	return 0;
}

int mcv_image_orient(mcv_image *im, int o, mcv_error *err)
{
	if (o < 2 || o > 8 || !im->rgb)
		return 0;
	int W = im->w, H = im->h;
	int swap = o >= 5; /* 5..8 exchange the sides */
	int ow = swap ? H : W, oh = swap ? W : H;
	uint8_t *d = malloc((size_t)W * H * 3);
	if (!d)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory rotating a %dx%d image", W, H);
	for (int y = 0; y < oh; y++) {
		for (int x = 0; x < ow; x++) {
			int sx, sy; /* source of displayed pixel (x, y) */
			switch (o) {
			case 2: sx = W - 1 - x; sy = y; break;
			case 3: sx = W - 1 - x; sy = H - 1 - y; break;
			case 4: sx = x; sy = H - 1 - y; break;
			case 5: sx = y; sy = x; break;
			case 6: sx = y; sy = H - 1 - x; break;
			case 7: sx = W - 1 - y; sy = H - 1 - x; break;
			default: sx = W - 1 - y; sy = x; break; /* 8 */
			}
			memcpy(d + ((size_t)y * ow + x) * 3, im->rgb + ((size_t)sy * W + sx) * 3, 3);
		}
	}
	free(im->rgb);
	im->rgb = d;
	im->w = ow;
	im->h = oh;
	return 0;
}

/* Resampling parity with the PyTorch reference's preprocessing: PIL's
 * Image.resize (BICUBIC, BILINEAR) must match mcv_image_resize byte for
 * byte, and the SigLIP normalisation must match the reference's float32
 * arithmetic exactly.  Needs /usr/bin/python3 with PIL, numpy and torch
 * (skips otherwise).  Also crop and orientation basics. */
#include "image.h"
#include "unit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const int sizes[][2] = {{48, 30}, {14, 14}, {224, 224}, {200, 61}, {97, 140},
			       {1, 1}, {5, 3}, {33, 97}, {97, 61}};
#define NSIZES (int)(sizeof sizes / sizeof sizes[0])

static const char *script =
	"import sys, numpy as np, torch\n"
	"from PIL import Image\n"
	"src, out = sys.argv[1], sys.argv[2]\n"
	"sizes = [tuple(map(int, s.split('x'))) for s in sys.argv[3:]]\n"
	"img = Image.open(src).convert('RGB')\n"
	"with open(out, 'wb') as f:\n"
	"    for flt in (Image.BICUBIC, Image.BILINEAR):\n"
	"        for s in sizes:\n"
	"            f.write(img.resize(s, flt).tobytes())\n"
	"    im = img.resize(sizes[0], Image.BICUBIC)\n"
	"    a = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)\n"
	"    mean = torch.tensor([0.5, 0.5, 0.5])[:, None, None]\n"
	"    std = torch.tensor([0.5, 0.5, 0.5])[:, None, None]\n"
	"    f.write(((a - mean) / std).contiguous().numpy().astype('<f4').tobytes())\n";

static void test_pil(void)
{
	if (access("/usr/bin/python3", X_OK))
		UNIT_SKIP("no /usr/bin/python3");
	if (system("/usr/bin/python3 -c 'import PIL, numpy, torch' 2>/dev/null"))
		UNIT_SKIP("/usr/bin/python3 lacks PIL/numpy/torch");
	char dir[] = "/tmp/mcv-resize-XXXXXX", src[64], out[64], py[64];
	if (!mkdtemp(dir)) {
		CHECK(0, "mkdtemp");
		return;
	}
	snprintf(src, sizeof src, "%s/src.ppm", dir);
	snprintf(out, sizeof out, "%s/out.bin", dir);
	snprintf(py, sizeof py, "%s/r.py", dir);
	mcv_image im;
	mcv_error err = {0};
	const int W = 97, H = 61;
	CHECK(mcv_image_alloc(&im, W, H, &err) == 0, "alloc");
	/* edges, gradients and noise: overshoot and clamping happen */
	uint32_t r = 12345;
	for (int y = 0; y < H; y++)
		for (int x = 0; x < W; x++)
			for (int c = 0; c < 3; c++) {
				r = r * 1664525u + 1013904223u;
				int v = c == 0 ? ((x / 8 + y / 8) & 1) * 255
				      : c == 1 ? x * 255 / (W - 1) : (int)(r >> 24);
				im.rgb[((size_t)y * W + x) * 3 + c] = (uint8_t)v;
			}
	FILE *f = fopen(src, "wb");
	fprintf(f, "P6\n%d %d\n255\n", W, H);
	fwrite(im.rgb, 1, (size_t)W * H * 3, f);
	fclose(f);
	f = fopen(py, "w");
	fputs(script, f);
	fclose(f);
	char cmd[1024];
	int n = snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s %s", py, src, out);
	for (int i = 0; i < NSIZES; i++)
		n += snprintf(cmd + n, sizeof cmd - n, " %dx%d", sizes[i][0], sizes[i][1]);
	CHECK(system(cmd) == 0, "%s", cmd);
	f = fopen(out, "rb");
	CHECK(f != NULL, "no PIL output");
	for (int flt = 0; f && flt < 2; flt++)
		for (int i = 0; i < NSIZES; i++) {
			int w = sizes[i][0], h = sizes[i][1];
			size_t nb = (size_t)w * h * 3;
			uint8_t *ref = malloc(nb);
			CHECK(fread(ref, 1, nb, f) == nb, "short PIL output");
			mcv_image dst;
			CHECK(mcv_image_resize(&im, w, h, flt ? MCV_RESIZE_BILINEAR : MCV_RESIZE_BICUBIC,
					       &dst, &err) == 0, "%s", err.msg);
			size_t diff = 0, first = 0;
			for (size_t j = 0; j < nb; j++)
				if (dst.rgb[j] != ref[j] && !diff++)
					first = j;
			CHECK(diff == 0, "%s %dx%d: %zu bytes differ from PIL, first at %zu (%d vs %d)",
			      flt ? "bilinear" : "bicubic", w, h, diff, first, dst.rgb[first], ref[first]);
			mcv_image_free(&dst);
			free(ref);
		}
	if (f) {
		int w = sizes[0][0], h = sizes[0][1];
		size_t nf = (size_t)3 * w * h;
		float *ref = malloc(nf * 4), *mine = malloc(nf * 4);
		CHECK(fread(ref, 4, nf, f) == nf, "short f32 output");
		CHECK(mcv_image_resize_f32(&im, w, h, MCV_RESIZE_BICUBIC, NULL, NULL, mine, &err) == 0, "f32");
		size_t diff = 0;
		for (size_t j = 0; j < nf; j++)
			diff += mine[j] != ref[j];
		CHECK(diff == 0, "normalised floats: %zu differ from the reference", diff);
		free(ref);
		free(mine);
		fclose(f);
	}
	mcv_image_free(&im);
	unlink(src);
	unlink(out);
	unlink(py);
	rmdir(dir);
}

static void test_basics(void)
{
	mcv_image a, b;
	mcv_error err = {0};
	CHECK(mcv_image_alloc(&a, 0, 5, &err) == MCV_EINVAL && !a.rgb, "zero side");
	CHECK(mcv_image_alloc(&a, 70000, 5, &err) == MCV_EINVAL, "side over 65535");
	CHECK(mcv_image_alloc(&a, 3, 2, &err) == 0, "alloc");
	for (int i = 0; i < 18; i++)
		a.rgb[i] = (uint8_t)i;
	CHECK(mcv_image_crop(&a, 1, 1, 2, 1, &b, &err) == 0 && b.w == 2 && b.h == 1 &&
	      b.rgb[0] == 12 && b.rgb[5] == 17, "crop");
	mcv_image_free(&b);
	CHECK(mcv_image_crop(&a, 2, 0, 2, 1, &b, &err) == MCV_EINVAL && !b.rgb, "crop outside");
	CHECK(mcv_image_crop(&a, -1, 0, 1, 1, &b, &err) == MCV_EINVAL, "crop negative");
	/* 3x2 image, pixel ids 0..5 in row-major order; after rotate 90 CW
	 * (orientation 6) the screen shows 2x3: top row = stored column 0 read
	 * bottom-up. */
	CHECK(mcv_image_orient(&a, 6, &err) == 0 && a.w == 2 && a.h == 3, "orient 6");
	CHECK(a.rgb[0] == 9 && a.rgb[3] == 0 && a.rgb[6] == 12 && a.rgb[15] == 6, "orient 6 pixels");
	CHECK(mcv_image_orient(&a, 8, &err) == 0 && a.w == 3 && a.h == 2, "orient 8 back");
	for (int i = 0; i < 18; i++)
		CHECK(a.rgb[i] == i, "6 then 8 is identity at %d", i);
	CHECK(mcv_image_orient(&a, 3, &err) == 0 && a.rgb[0] == 15, "orient 3");
	CHECK(mcv_image_orient(&a, 9, &err) == 0 && a.rgb[0] == 15, "orient out of range: no change");
	float f[18];
	mcv_image_to_f32(&a, NULL, NULL, f);
	CHECK(fabsf(f[0] - (15 / 255.0f - 0.5f) / 0.5f) < 1e-7f, "normalise");
	CHECK(mcv_image_resize(&a, 1, 1, (mcv_resize_filter)7, &b, &err) == MCV_EINVAL, "bad filter");
	mcv_image_free(&a);
	mcv_image_free(&a);
}

int main(void)
{
	test_basics();
	test_pil();
	return unit_done("test_media_resize");
}

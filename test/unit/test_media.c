/* Image decoding (lib/media*.c): every PNG and JPEG variant the brief names,
 * generated here with libpng/libjpeg from a known pixel truth; EXIF
 * orientations; decompression bombs; truncated, zero-byte, garbage and
 * bit-flipped inputs.  Also built with ASan+UBSan by `make check`. */
#include "media.h"
#include "test_media.h"
#include "unit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- PNG */

static void put_sample(uint8_t *row, int idx, int depth, unsigned v)
{
	if (depth == 8) {
		row[idx] = (uint8_t)v;
	} else if (depth == 16) {
		((uint16_t *)row)[idx] = (uint16_t)v;
	} else { /* packed, most significant bits first */
		int per = 8 / depth, byte = idx / per, sh = 8 - depth * (idx % per + 1);
		row[byte] = (uint8_t)((row[byte] & ~(((1u << depth) - 1) << sh)) | (v << sh));
	}
}

static unsigned to8(unsigned v, int depth)
{
	unsigned mx = (1u << depth) - 1;
	return (v * 255 + mx / 2) / mx;
}

static unsigned over_white(unsigned c, unsigned a)
{
	return (unsigned)lround((c * a + 255.0 * (255 - a)) / 255.0);
}

/* Compare decoded image to expected RGB within tol per sample. */
static int same_rgb(const mcv_image *im, const uint8_t *exp, int w, int h, int tol, double *mean_err)
{
	if (im->w != w || im->h != h || !im->rgb)
		return 0;
	int worst = 0;
	double sum = 0;
	for (size_t i = 0; i < (size_t)w * h * 3; i++) {
		int d = abs((int)im->rgb[i] - (int)exp[i]);
		sum += d;
		if (d > worst)
			worst = d;
	}
	if (mean_err)
		*mean_err = sum / ((double)w * h * 3);
	return worst <= tol;
}

enum { V_GRAY, V_GA, V_RGB, V_RGBA, V_PAL };

/* The truth: samples of pixel (x, y) at a bit depth. */
static void sample(int x, int y, int depth, unsigned s[4])
{
	unsigned mx = (1u << depth) - 1;
	s[0] = (x * 37u + y * 11u) & mx;
	s[1] = (x * 5u + y * 23u + 3) & mx;
	s[2] = ((x ^ y) * 9u + 1) & mx;
	s[3] = ((x + y * 3u) * 13u + 5) & mx;
	if (depth == 16) { /* spread over 16 bits, not only multiples of 257 */
		s[0] = (x * 1237u + y * 4111u) & mx;
		s[1] = (x * 977u + y * 23u * 257u) & mx;
		s[2] = ((x ^ y) * 2221u) & mx;
		s[3] = ((x + y * 3u) * 3331u + 77) & mx;
	}
}

/* Builds one PNG variant and the RGB it must decode to. */
static mbuf png_variant(int kind, int depth, int interlace, int key, int w, int h, uint8_t *exp)
{
	int ch = kind == V_GRAY ? 1 : kind == V_GA ? 2 : kind == V_RGB ? 3 : kind == V_RGBA ? 4 : 1;
	int ctype = kind == V_GRAY ? PNG_COLOR_TYPE_GRAY : kind == V_GA ? PNG_COLOR_TYPE_GRAY_ALPHA
		  : kind == V_RGB ? PNG_COLOR_TYPE_RGB : kind == V_RGBA ? PNG_COLOR_TYPE_RGB_ALPHA
		  : PNG_COLOR_TYPE_PALETTE;
	size_t rowbytes = ((size_t)w * ch * depth + 7) / 8 + 2;
	uint8_t **rows = calloc(h, sizeof *rows);
	png_color plte[256];
	uint8_t trns[256];
	int npal = 1 << (depth < 8 ? depth : 8);
	for (int i = 0; i < npal; i++) {
		plte[i].red = (uint8_t)(i * 3 + 7);
		plte[i].green = (uint8_t)(255 - i);
		plte[i].blue = (uint8_t)(i * 7);
		trns[i] = (uint8_t)(i * 37 + 11);
	}
	png_color_16 kc = {0};
	/* a key colour that occurs: the value of pixel (1, 0) */
	unsigned keyv[3] = {0};
	for (int y = 0; y < h; y++) {
		rows[y] = calloc(rowbytes, 1);
		for (int x = 0; x < w; x++) {
			unsigned s[4];
			sample(x, y, depth, s);
			if (x == 1 && y == 0)
				memcpy(keyv, s, sizeof keyv);
			uint8_t *e = exp + ((size_t)y * w + x) * 3;
			if (kind == V_PAL) {
				unsigned i = (unsigned)(x + y * w) % (unsigned)npal;
				put_sample(rows[y], x, depth, i);
				unsigned a = key ? trns[i] : 255;
				e[0] = (uint8_t)over_white(plte[i].red, a);
				e[1] = (uint8_t)over_white(plte[i].green, a);
				e[2] = (uint8_t)over_white(plte[i].blue, a);
				continue;
			}
			for (int c = 0; c < ch; c++)
				put_sample(rows[y], x * ch + c, depth, s[c]);
			unsigned g = to8(s[0], depth);
			unsigned rgb[3] = {g, g, g}, a = 255;
			if (kind == V_RGB || kind == V_RGBA)
				for (int c = 0; c < 3; c++)
					rgb[c] = to8(s[c], depth);
			if (kind == V_GA)
				a = to8(s[1], depth);
			if (kind == V_RGBA)
				a = to8(s[3], depth);
			for (int c = 0; c < 3; c++)
				e[c] = (uint8_t)over_white(rgb[c], a);
		}
	}
	if (key && kind != V_PAL) { /* tRNS colour key: pixels equal to it turn white */
		kc.gray = (uint16_t)keyv[0];
		kc.red = (uint16_t)keyv[0];
		kc.green = (uint16_t)keyv[1];
		kc.blue = (uint16_t)keyv[2];
		for (int y = 0; y < h; y++)
			for (int x = 0; x < w; x++) {
				unsigned s[4];
				sample(x, y, depth, s);
				int hit = kind == V_GRAY ? s[0] == keyv[0]
					: s[0] == keyv[0] && s[1] == keyv[1] && s[2] == keyv[2];
				if (hit)
					memset(exp + ((size_t)y * w + x) * 3, 255, 3);
			}
	}
	mbuf b = png_make(w, h, ctype, depth, interlace, rows, kind == V_PAL ? plte : NULL, npal,
			  kind == V_PAL && key ? trns : NULL, kind == V_PAL && key ? npal : 0,
			  key && kind != V_PAL ? &kc : NULL);
	for (int y = 0; y < h; y++)
		free(rows[y]);
	free(rows);
	return b;
}

static void test_png_variants(void)
{
	static const struct { int kind, depth, interlace, key; const char *name; } v[] = {
		{V_RGB, 8, 0, 0, "rgb8"},          {V_RGB, 16, 0, 0, "rgb16"},
		{V_RGBA, 8, 0, 0, "rgba8"},        {V_RGBA, 16, 0, 0, "rgba16"},
		{V_GRAY, 1, 0, 0, "grey1"},        {V_GRAY, 2, 0, 0, "grey2"},
		{V_GRAY, 4, 0, 0, "grey4"},        {V_GRAY, 8, 0, 0, "grey8"},
		{V_GRAY, 16, 0, 0, "grey16"},      {V_GA, 8, 0, 0, "grey+alpha8"},
		{V_GA, 16, 0, 0, "grey+alpha16"},  {V_PAL, 1, 0, 0, "palette1"},
		{V_PAL, 2, 0, 0, "palette2"},      {V_PAL, 4, 0, 0, "palette4"},
		{V_PAL, 8, 0, 0, "palette8"},      {V_PAL, 8, 0, 1, "palette8+tRNS"},
		{V_PAL, 4, 0, 1, "palette4+tRNS"}, {V_GRAY, 8, 0, 1, "grey8+tRNS"},
		{V_RGB, 8, 0, 1, "rgb8+tRNS"},     {V_RGB, 16, 0, 1, "rgb16+tRNS"},
		{V_RGB, 8, 1, 0, "rgb8 Adam7"},    {V_RGBA, 16, 1, 0, "rgba16 Adam7"},
		{V_PAL, 4, 1, 1, "palette4+tRNS Adam7"}, {V_GRAY, 1, 1, 0, "grey1 Adam7"},
	};
	const int w = 37, h = 23; /* odd sides exercise bit packing and Adam7 passes */
	uint8_t *exp = malloc((size_t)w * h * 3);
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		mbuf b = png_variant(v[i].kind, v[i].depth, v[i].interlace, v[i].key, w, h, exp);
		mcv_image im;
		mcv_error err = {0};
		int rc = mcv_image_decode(b.p, b.n, NULL, &im, &err);
		CHECK(rc == 0, "%s: %s", v[i].name, err.msg);
		if (!rc)
			CHECK(same_rgb(&im, exp, w, h, 1, NULL), "%s: pixels differ", v[i].name);
		mcv_image_free(&im);
		free(b.p);
	}
	free(exp);
}

/* ---------------------------------------------------------------- JPEG */

/* A smooth truth image, so that JPEG loss stays small. */
static void smooth_rgb(uint8_t *p, int w, int h)
{
	for (int y = 0; y < h; y++)
		for (int x = 0; x < w; x++) {
			uint8_t *q = p + ((size_t)y * w + x) * 3;
			q[0] = (uint8_t)(40 + 180 * x / (w - 1));
			q[1] = (uint8_t)(30 + 200 * y / (h - 1));
			q[2] = (uint8_t)(128 + 60 * sin(x * 0.1) * cos(y * 0.13));
		}
}

static void test_jpeg_colour(void)
{
	const int w = 64, h = 40;
	uint8_t *rgb = malloc(w * h * 3), *grey = malloc(w * h), *cmyk = malloc(w * h * 4),
		*inv = malloc(w * h * 4), *exp = malloc(w * h * 3);
	smooth_rgb(rgb, w, h);
	double me = 0;
	for (int prog = 0; prog < 2; prog++) {
		mbuf b = jpeg_make(w, h, JCS_RGB, rgb, prog, 0, NULL, 0, 95);
		mcv_image im;
		mcv_error err = {0};
		int rc = mcv_image_decode(b.p, b.n, NULL, &im, &err);
		CHECK(rc == 0, "YCbCr prog=%d: %s", prog, err.msg);
		CHECK(same_rgb(&im, rgb, w, h, 40, &me) && me < 3, "YCbCr prog=%d: mean err %.2f", prog, me);
		mcv_image_free(&im);
		free(b.p);
	}
	for (int i = 0; i < w * h; i++)
		grey[i] = rgb[i * 3 + 1];
	for (int i = 0; i < w * h * 3; i++)
		exp[i] = grey[i / 3];
	for (int prog = 0; prog < 2; prog++) {
		mbuf b = jpeg_make(w, h, JCS_GRAYSCALE, grey, prog, 0, NULL, 0, 95);
		mcv_image im;
		mcv_error err = {0};
		int rc = mcv_image_decode(b.p, b.n, NULL, &im, &err);
		CHECK(rc == 0, "grey: %s", err.msg);
		CHECK(same_rgb(&im, exp, w, h, 20, &me) && me < 2, "grey prog=%d: mean err %.2f", prog, me);
		mcv_image_free(&im);
		free(b.p);
	}
	/* CMYK with some black: RGB = (1-C)(1-K).  Plain CMYK without an Adobe
	 * marker, and Adobe-inverted CMYK with it: both must give the same RGB. */
	for (int i = 0; i < w * h; i++) {
		unsigned k = (unsigned)(i % w) * 60 / w;
		for (int c = 0; c < 3; c++) {
			cmyk[i * 4 + c] = (uint8_t)(255 - rgb[i * 3 + c]);
			exp[i * 3 + c] = (uint8_t)lround(rgb[i * 3 + c] * (255.0 - k) / 255.0);
		}
		cmyk[i * 4 + 3] = (uint8_t)k;
		for (int c = 0; c < 4; c++)
			inv[i * 4 + c] = (uint8_t)(255 - cmyk[i * 4 + c]);
	}
	for (int adobe = 0; adobe < 2; adobe++)
		for (int prog = 0; prog < 2; prog++) {
			mbuf b = jpeg_make(w, h, JCS_CMYK, adobe ? inv : cmyk, prog, adobe, NULL, 0, 95);
			mcv_image im;
			mcv_error err = {0};
			int rc = mcv_image_decode(b.p, b.n, NULL, &im, &err);
			CHECK(rc == 0, "CMYK adobe=%d: %s", adobe, err.msg);
			CHECK(same_rgb(&im, exp, w, h, 40, &me) && me < 3, "CMYK adobe=%d prog=%d: mean err %.2f",
			      adobe, prog, me);
			mcv_image_free(&im);
			free(b.p);
		}
	free(rgb);
	free(grey);
	free(cmyk);
	free(inv);
	free(exp);
}

/* EXIF orientation: the spec says where the stored 0th row and 0th column
 * appear on screen.  Four coloured corner blocks must land accordingly. */
static void test_exif(void)
{
	const int W = 48, H = 32, B = 16; /* blocks of 16 survive JPEG intact */
	static const uint8_t col[4][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 255}};
	uint8_t *p = malloc(W * H * 3);
	for (int y = 0; y < H; y++)
		for (int x = 0; x < W; x++) {
			int q = (y >= H / 2) * 2 + (x >= W / 2); /* TL TR BL BR */
			memcpy(p + (y * W + x) * 3, col[q], 3);
		}
	(void)B;
	/* row0: side where stored row 0 shows (0 top, 1 right, 2 bottom, 3 left);
	 * col0: side where stored column 0 shows. */
	static const struct { int row0, col0; } spec[9] = {
		{0, 3}, {0, 3}, {0, 1}, {2, 1}, {2, 3}, {3, 0}, {1, 0}, {1, 2}, {3, 2}};
	for (int le = 0; le < 2; le++)
		for (int o = 1; o <= 8; o++) {
			uint8_t app1[64];
			size_t n = exif_make(app1, le, o);
			mbuf b = jpeg_make(W, H, JCS_RGB, p, o & 1, 0, app1, n, 95);
			mcv_image im;
			mcv_error err = {0};
			int rc = mcv_image_decode(b.p, b.n, NULL, &im, &err);
			CHECK(rc == 0, "orientation %d: %s", o, err.msg);
			free(b.p);
			if (rc)
				continue;
			int swap = spec[o].row0 == 1 || spec[o].row0 == 3;
			CHECK(im.w == (swap ? H : W) && im.h == (swap ? W : H), "orientation %d: %dx%d", o,
			      im.w, im.h);
			/* stored corner (row r, col c) shows at a screen corner: its
			 * vertical/horizontal side follows from row0/col0. */
			for (int q = 0; q < 4 && im.w == (swap ? H : W); q++) {
				int r_end = q >= 2, c_end = q & 1; /* stored at last row / last column */
				int side_r = r_end ? (spec[o].row0 + 2) % 4 : spec[o].row0;
				int side_c = c_end ? (spec[o].col0 + 2) % 4 : spec[o].col0;
				int right = side_r == 1 || side_c == 1, bottom = side_r == 2 || side_c == 2;
				int sx = right ? im.w - 4 : 3, sy = bottom ? im.h - 4 : 3;
				const uint8_t *px = im.rgb + ((size_t)sy * im.w + sx) * 3;
				int ok = 1;
				for (int c = 0; c < 3; c++)
					ok &= abs(px[c] - col[q][c]) < 40;
				CHECK(ok, "orientation %d (%s): stored corner %d not at %s-%s (%d,%d,%d)", o,
				      le ? "II" : "MM", q, bottom ? "bottom" : "top", right ? "right" : "left",
				      px[0], px[1], px[2]);
			}
			mcv_image_free(&im);
		}
	/* A damaged Exif block (IFD offset beyond the end) is ignored, not trusted. */
	uint8_t app1[64];
	size_t n = exif_make(app1, 1, 6);
	app1[6 + 4] = 0xF0;
	mbuf b = jpeg_make(W, H, JCS_RGB, p, 0, 0, app1, n, 95);
	mcv_image im;
	mcv_error err = {0};
	CHECK(mcv_image_decode(b.p, b.n, NULL, &im, &err) == 0 && im.w == W, "bad exif: %s", err.msg);
	mcv_image_free(&im);
	free(b.p);
	/* Orientation entry whose count field says 1 but the IFD claims 5000 entries. */
	n = exif_make(app1, 0, 3);
	app1[6 + 8] = 0x13;
	app1[6 + 9] = 0x88;
	b = jpeg_make(W, H, JCS_RGB, p, 0, 0, app1, n, 95);
	CHECK(mcv_image_decode(b.p, b.n, NULL, &im, &err) == 0, "long IFD: %s", err.msg);
	mcv_image_free(&im);
	free(b.p);
	free(p);
}

/* ---------------------------------------------------------------- hostile */

static uint32_t crc_of(const uint8_t *p, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
	}
	return ~c;
}

static void be32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = (uint8_t)v;
}

/* Outcome sanity for inputs that may or may not be decodable. */
static int sane(int rc, const mcv_image *im, const mcv_error *err)
{
	if (rc == 0)
		return im->rgb && im->w > 0 && im->h > 0;
	return rc < 0 && !im->rgb && err->msg[0] && !strchr(err->msg, '\n');
}

static void test_hostile(void)
{
	/* samples: PNG plain, PNG interlaced, JPEG baseline, JPEG progressive */
	const int w = 64, h = 48;
	uint8_t *rgb = malloc(w * h * 3), *exp = malloc(w * h * 3);
	smooth_rgb(rgb, w, h);
	mbuf s[4];
	s[0] = png_variant(V_RGBA, 8, 0, 0, w, h, exp);
	s[1] = png_variant(V_RGB, 16, 1, 0, w, h, exp);
	s[2] = jpeg_make(w, h, JCS_RGB, rgb, 0, 0, NULL, 0, 90);
	s[3] = jpeg_make(w, h, JCS_RGB, rgb, 1, 0, NULL, 0, 90);
	static const char *nm[4] = {"png", "png-adam7", "jpeg", "jpeg-progressive"};
	mcv_image im;
	mcv_error err;
	for (int i = 0; i < 4; i++) {
		memset(&err, 0, sizeof err);
		CHECK(mcv_image_decode(s[i].p, s[i].n, NULL, &im, &err) == 0, "%s: %s", nm[i], err.msg);
		mcv_image_free(&im);
		/* truncated at every 1/16th: always an error, never grey filler */
		for (int k = 0; k < 16; k++) {
			size_t n = s[i].n * k / 16;
			uint8_t *cut = malloc(n ? n : 1);
			memcpy(cut, s[i].p, n);
			memset(&err, 0, sizeof err);
			int rc = mcv_image_decode(cut, n, NULL, &im, &err);
			CHECK(rc < 0 && !im.rgb && err.msg[0], "%s cut at %zu/%zu: rc %d", nm[i], n, s[i].n, rc);
			mcv_image_free(&im);
			free(cut);
		}
		/* deterministic bit flips everywhere: any outcome but a crash */
		for (int k = 0; k < 96; k++) {
			uint8_t *f = malloc(s[i].n);
			memcpy(f, s[i].p, s[i].n);
			size_t at = (size_t)k * s[i].n / 96;
			f[at] ^= (uint8_t)(1u << (k % 8));
			memset(&err, 0, sizeof err);
			int rc = mcv_image_decode(f, s[i].n, NULL, &im, &err);
			CHECK(sane(rc, &im, &err), "%s flip at %zu: rc %d %s", nm[i], at, rc, err.msg);
			/* PNG chunks carry CRCs: any flip past the signature is an error */
			if (i < 2 && at >= 8)
				CHECK(rc < 0, "%s flip at %zu decoded", nm[i], at);
			mcv_image_free(&im);
			free(f);
		}
		/* a valid header followed by garbage */
		uint8_t *g = malloc(s[i].n);
		memcpy(g, s[i].p, s[i].n);
		for (size_t j = s[i].n / 3; j < s[i].n; j++)
			g[j] = (uint8_t)rng();
		memset(&err, 0, sizeof err);
		int rc = mcv_image_decode(g, s[i].n, NULL, &im, &err);
		CHECK(sane(rc, &im, &err), "%s garbage tail: %d", nm[i], rc);
		if (i < 2)
			CHECK(rc < 0, "%s garbage tail decoded", nm[i]);
		mcv_image_free(&im);
		free(g);
	}
	/* zero bytes, NULL-sized, random garbage, magic followed by garbage */
	memset(&err, 0, sizeof err);
	CHECK(mcv_image_decode("", 0, NULL, &im, &err) == MCV_EFORMAT && err.msg[0], "zero bytes");
	uint8_t junk[4096];
	for (int t = 0; t < 64; t++) {
		for (size_t j = 0; j < sizeof junk; j++)
			junk[j] = (uint8_t)rng();
		if (t % 3 == 1)
			memcpy(junk, "\x89PNG\r\n\x1a\n", 8);
		if (t % 3 == 2)
			memcpy(junk, "\xff\xd8\xff", 3);
		size_t n = 1 + rng() % sizeof junk;
		memset(&err, 0, sizeof err);
		int rc = mcv_image_decode(junk, n, NULL, &im, &err);
		CHECK(rc < 0 && !im.rgb && err.msg[0], "garbage %d decoded", t);
		mcv_image_free(&im);
	}
	memset(&err, 0, sizeof err);
	CHECK(mcv_image_decode("hello, world\n", 13, NULL, &im, &err) == MCV_EFORMAT &&
	      strstr(err.msg, "not a PNG or JPEG"), "text: %s", err.msg);

	/* Bombs: PNG IHDR claiming 100000x100000 (tiny IDAT, valid CRCs), a
	 * JPEG SOF claiming 65000x65000: refused from the header. */
	uint8_t *bomb = malloc(s[0].n);
	memcpy(bomb, s[0].p, s[0].n);
	be32(bomb + 16, 100000);
	be32(bomb + 20, 100000);
	be32(bomb + 29, crc_of(bomb + 12, 17));
	memset(&err, 0, sizeof err);
	int rc = mcv_image_decode(bomb, s[0].n, NULL, &im, &err);
	CHECK(rc == MCV_ENOMEM && strstr(err.msg, "100000x100000 (10000 Mpx), over --max-pixels 64M"),
	      "png bomb: %d %s", rc, err.msg);
	be32(bomb + 16, 50000);
	be32(bomb + 20, 50000);
	be32(bomb + 29, crc_of(bomb + 12, 17));
	rc = mcv_image_decode(bomb, s[0].n, NULL, &im, &err);
	CHECK(rc == MCV_ENOMEM && !strcmp(err.msg, "image is 50000x50000 (2500 Mpx), over --max-pixels 64M"),
	      "png bomb message: %s", err.msg);
	free(bomb);
	for (int i = 2; i < 4; i++) {
		bomb = malloc(s[i].n);
		memcpy(bomb, s[i].p, s[i].n);
		int found = 0;
		for (size_t j = 2; j + 9 < s[i].n && !found; j++)
			if (bomb[j] == 0xFF && (bomb[j + 1] == 0xC0 || bomb[j + 1] == 0xC2)) {
				bomb[j + 5] = 65000 >> 8; bomb[j + 6] = 65000 & 255; /* height */
				bomb[j + 7] = 65000 >> 8; bomb[j + 8] = 65000 & 255; /* width */
				found = 1;
			}
		CHECK(found, "no SOF in %s", nm[i]);
		memset(&err, 0, sizeof err);
		rc = mcv_image_decode(bomb, s[i].n, NULL, &im, &err);
		CHECK(rc == MCV_ENOMEM && strstr(err.msg, "65000x65000 (4225 Mpx), over --max-pixels 64M"),
		      "%s bomb: %d %s", nm[i], rc, err.msg);
		free(bomb);
	}
	/* An ancillary chunk (tEXt) after IHDR: fine with its CRC, an error
	 * with a bad CRC (libpng would silently drop it by default). */
	{
		static const char kw[] = "Comment\0hello";
		size_t tl = sizeof kw - 1, at = 8 + 25, n2 = s[0].n + 12 + tl;
		uint8_t *p2 = malloc(n2);
		memcpy(p2, s[0].p, at);
		be32(p2 + at, (uint32_t)tl);
		memcpy(p2 + at + 4, "tEXt", 4);
		memcpy(p2 + at + 8, kw, tl);
		be32(p2 + at + 8 + tl, crc_of(p2 + at + 4, 4 + tl));
		memcpy(p2 + at + 12 + tl, s[0].p + at, s[0].n - at);
		memset(&err, 0, sizeof err);
		CHECK(mcv_image_decode(p2, n2, NULL, &im, &err) == 0, "tEXt chunk: %s", err.msg);
		mcv_image_free(&im);
		p2[at + 8 + tl] ^= 1;
		CHECK(mcv_image_decode(p2, n2, NULL, &im, &err) == MCV_EFORMAT && strstr(err.msg, "CRC"),
		      "tEXt CRC error: %s", err.msg);
		free(p2);
		/* no IEND (the last 12 bytes cut): truncated, not accepted */
		memset(&err, 0, sizeof err);
		CHECK(mcv_image_decode(s[0].p, s[0].n - 12, NULL, &im, &err) == MCV_EFORMAT,
		      "PNG without IEND decoded");
	}
	/* user-set limits: pixels and bytes */
	mcv_media_limits lim = {.max_pixels = 1000};
	memset(&err, 0, sizeof err);
	rc = mcv_image_decode(s[2].p, s[2].n, &lim, &im, &err);
	CHECK(rc == MCV_ENOMEM && strstr(err.msg, "64x48 (3072 px), over --max-pixels 1K"), "limit: %s", err.msg);
	lim = (mcv_media_limits){.max_bytes = 100};
	rc = mcv_image_decode(s[0].p, s[0].n, &lim, &im, &err);
	CHECK(rc == MCV_ENOMEM && strstr(err.msg, "over --max-bytes 100"), "bytes limit: %s", err.msg);
	lim = (mcv_media_limits){.max_pixels = 64 * 48};
	rc = mcv_image_decode(s[0].p, s[0].n, &lim, &im, &err);
	CHECK(rc == 0, "exactly at the limit: %s", err.msg);
	mcv_image_free(&im);
	for (int i = 0; i < 4; i++)
		free(s[i].p);
	free(rgb);
	free(exp);
}

/* mcv_image_load: files, stdin, missing files, byte bound. */
static void test_load(void)
{
	char dir[] = "/tmp/mcv-media-XXXXXX", path[64];
	if (!mkdtemp(dir)) {
		CHECK(0, "mkdtemp");
		return;
	}
	const int w = 20, h = 10;
	uint8_t *exp = malloc(w * h * 3);
	mbuf b = png_variant(V_RGB, 8, 0, 0, w, h, exp);
	snprintf(path, sizeof path, "%s/x.jpg", dir); /* the name lies: magic decides */
	FILE *f = fopen(path, "wb");
	fwrite(b.p, 1, b.n, f);
	fclose(f);
	mcv_image im;
	mcv_error err = {0};
	CHECK(mcv_image_load(path, NULL, &im, &err) == 0 && same_rgb(&im, exp, w, h, 0, NULL), "load: %s", err.msg);
	mcv_image_free(&im);
	mcv_media_limits lim = {.max_bytes = 50};
	CHECK(mcv_image_load(path, &lim, &im, &err) == MCV_ENOMEM && strstr(err.msg, "--max-bytes 50"),
	      "load bound: %s", err.msg);
	/* stdin */
	int saved = dup(0);
	FILE *in = freopen(path, "rb", stdin);
	CHECK(in != NULL, "freopen");
	CHECK(mcv_image_load("-", NULL, &im, &err) == 0 && im.w == w, "stdin: %s", err.msg);
	mcv_image_free(&im);
	dup2(saved, 0);
	close(saved);
	snprintf(path, sizeof path, "%s/none.png", dir);
	CHECK(mcv_image_load(path, NULL, &im, &err) == MCV_EIO && strstr(err.msg, "No such file"), "%s", err.msg);
	CHECK(mcv_image_load(dir, NULL, &im, &err) == MCV_EIO, "dir: %s", err.msg);
	snprintf(path, sizeof path, "%s/empty.png", dir);
	fclose(fopen(path, "wb"));
	CHECK(mcv_image_load(path, NULL, &im, &err) == MCV_EFORMAT && strstr(err.msg, "0 bytes"), "%s", err.msg);
	unlink(path);
	snprintf(path, sizeof path, "%s/x.jpg", dir);
	unlink(path);
	rmdir(dir);
	free(exp);
	free(b.p);
}

static void test_misc(void)
{
	uint64_t v;
	mcv_error err;
	CHECK(mcv_media_parse_count("64M", &v, &err) == 0 && v == 64000000, "64M");
	CHECK(mcv_media_parse_count("2Ki", &v, &err) == 0 && v == 2048, "2Ki");
	CHECK(mcv_media_parse_count("1000", &v, &err) == 0 && v == 1000, "1000");
	CHECK(mcv_media_parse_count("0", &v, &err) == MCV_EINVAL, "0");
	CHECK(mcv_media_parse_count("-5", &v, &err) == MCV_EINVAL, "-5");
	CHECK(mcv_media_parse_count("12X", &v, &err) == MCV_EINVAL, "12X");
	CHECK(mcv_media_parse_count("99999999999999999999", &v, &err) == MCV_EINVAL, "overflow");
	CHECK(mcv_media_parse_count("20000000000G", &v, &err) == MCV_EINVAL, "overflow mul");
	mcv_media_limits l = mcv_media_limits_resolve(NULL);
	CHECK(l.max_pixels == MCV_MEDIA_DEFAULT_MAX_PIXELS && l.max_frames == MCV_MEDIA_DEFAULT_MAX_FRAMES, "defaults");
	CHECK(mcv_media_sniff("\x89PNG\r\n\x1a\n", 8) == MCV_MEDIA_PNG, "sniff png");
	CHECK(mcv_media_sniff("\x89PNG\r\n\x1a", 7) == MCV_MEDIA_UNKNOWN, "sniff short png");
	CHECK(mcv_media_sniff("\xff\xd8\xff\xe0", 4) == MCV_MEDIA_JPEG, "sniff jpeg");
	CHECK(mcv_media_sniff("\0\0\0\x20" "ftypisom", 12) == MCV_MEDIA_VIDEO, "sniff mp4");
	CHECK(mcv_media_sniff(NULL, 0) == MCV_MEDIA_UNKNOWN, "sniff NULL");
}

int main(void)
{
	test_misc();
	test_png_variants();
	test_jpeg_colour();
	test_exif();
	test_hostile();
	test_load();
	return unit_done("test_media");
}

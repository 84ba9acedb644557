/* Test helpers for the media tests: in-memory PNG and JPEG writers (libpng,
 * libjpeg) so every variant is generated here from a known pixel truth, and
 * a deterministic random generator for hostile inputs. */
#ifndef MCV_TEST_MEDIA_H
#define MCV_TEST_MEDIA_H

#include <stdio.h>
#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct mbuf {
	uint8_t *p;
	size_t n, cap;
} mbuf;

static __attribute__((unused)) void mbuf_put(mbuf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		size_t nc = b->cap ? b->cap : 4096;
		while (nc < b->n + n)
			nc *= 2;
		b->p = realloc(b->p, nc);
		if (!b->p)
			abort();
		b->cap = nc;
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static __attribute__((unused)) uint32_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

/* ---------------------------------------------------------------- PNG */

static __attribute__((unused)) void pw_write(png_structp png, png_bytep d, size_t n)
{
	mbuf_put(png_get_io_ptr(png), d, n);
}
static __attribute__((unused)) void pw_flush(png_structp png) { (void)png; }

/* rows: packed sample rows as PNG stores them (w * channels * depth/8,
 * or bit-packed for depth < 8).  plte/trns optional. */
static __attribute__((unused)) mbuf png_make(int w, int h, int ctype, int depth, int interlace, uint8_t **rows,
		     const png_color *plte, int nplte, const uint8_t *trns, int ntrns,
		     const png_color_16 *trns_col)
{
	mbuf b = {0};
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png_create_info_struct(png);
	if (setjmp(png_jmpbuf(png)))
		abort();
	png_set_write_fn(png, &b, pw_write, pw_flush);
	png_set_IHDR(png, info, w, h, depth, ctype,
		     interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	if (plte)
		png_set_PLTE(png, info, plte, nplte);
	if (trns || trns_col)
		png_set_tRNS(png, info, trns, ntrns, trns_col);
	png_write_info(png, info);
	if (depth == 16)
		png_set_swap(png); /* our rows hold native little-endian uint16 */
	png_write_image(png, rows);
	png_write_end(png, info);
	png_destroy_write_struct(&png, &info);
	return b;
}

/* ---------------------------------------------------------------- JPEG */

typedef struct jw_dest {
	struct jpeg_destination_mgr pub;
	mbuf *b;
	JOCTET tmp[4096];
} jw_dest;

static __attribute__((unused)) void jw_init(j_compress_ptr c)
{
	jw_dest *d = (jw_dest *)c->dest;
	d->pub.next_output_byte = d->tmp;
	d->pub.free_in_buffer = sizeof d->tmp;
}
static __attribute__((unused)) boolean jw_empty(j_compress_ptr c)
{
	jw_dest *d = (jw_dest *)c->dest;
	mbuf_put(d->b, d->tmp, sizeof d->tmp);
	d->pub.next_output_byte = d->tmp;
	d->pub.free_in_buffer = sizeof d->tmp;
	return TRUE;
}
static __attribute__((unused)) void jw_term(j_compress_ptr c)
{
	jw_dest *d = (jw_dest *)c->dest;
	mbuf_put(d->b, d->tmp, sizeof d->tmp - d->pub.free_in_buffer);
}

/* pix: w*h*nc samples in `space` (JCS_GRAYSCALE 1, JCS_RGB 3, JCS_CMYK 4). */
static __attribute__((unused)) mbuf jpeg_make(int w, int h, J_COLOR_SPACE space, const uint8_t *pix, int progressive,
		      int adobe, const uint8_t *app1, size_t app1_n, int quality)
{
	mbuf b = {0};
	struct jpeg_compress_struct c;
	struct jpeg_error_mgr je;
	jw_dest dest;
	c.err = jpeg_std_error(&je);
	jpeg_create_compress(&c);
	dest.pub.init_destination = jw_init;
	dest.pub.empty_output_buffer = jw_empty;
	dest.pub.term_destination = jw_term;
	dest.b = &b;
	c.dest = &dest.pub;
	c.image_width = w;
	c.image_height = h;
	c.input_components = space == JCS_GRAYSCALE ? 1 : space == JCS_CMYK ? 4 : 3;
	c.in_color_space = space;
	jpeg_set_defaults(&c);
	jpeg_set_quality(&c, quality, TRUE);
	if (space == JCS_CMYK) {
		jpeg_set_colorspace(&c, JCS_CMYK);
		c.write_Adobe_marker = adobe ? TRUE : FALSE;
	}
	if (progressive)
		jpeg_simple_progression(&c);
	jpeg_start_compress(&c, TRUE);
	if (app1)
		jpeg_write_marker(&c, JPEG_APP0 + 1, app1, (unsigned)app1_n);
	while (c.next_scanline < c.image_height) {
		JSAMPROW r = (JSAMPROW)(pix + (size_t)c.next_scanline * w * c.input_components);
		jpeg_write_scanlines(&c, &r, 1);
	}
	jpeg_finish_compress(&c);
	jpeg_destroy_compress(&c);
	return b;
}

/* An APP1 Exif payload whose IFD0 holds an Orientation entry (and one other
 * entry before it, so the parser has to walk). */
static __attribute__((unused)) size_t exif_make(uint8_t *d, int little, int orientation)
{
	memcpy(d, "Exif\0\0", 6);
	uint8_t *t = d + 6;
#define P16(o, v) do { if (little) { t[o] = (v) & 255; t[(o) + 1] = (v) >> 8; } \
		else { t[o] = (v) >> 8; t[(o) + 1] = (v) & 255; } } while (0)
#define P32(o, v) do { if (little) { t[o] = (v) & 255; t[(o) + 1] = ((v) >> 8) & 255; \
		t[(o) + 2] = ((v) >> 16) & 255; t[(o) + 3] = (v) >> 24; } else { \
		t[o] = (v) >> 24; t[(o) + 1] = ((v) >> 16) & 255; t[(o) + 2] = ((v) >> 8) & 255; \
		t[(o) + 3] = (v) & 255; } } while (0)
	memcpy(t, little ? "II" : "MM", 2);
	P16(2, 42);
	P32(4, 8);
	P16(8, 2);                 /* two entries */
	P16(10, 0x010F);           /* Make, ASCII, 4 bytes inline */
	P16(12, 2);
	P32(14, 4);
	memcpy(t + 18, "mcv", 4);
	P16(22, 0x0112);           /* Orientation, SHORT, 1 */
	P16(24, 3);
	P32(26, 1);
	P32(30, 0);
	P16(30, orientation);
	P32(34, 0);                /* no next IFD */
#undef P16
#undef P32
	return 6 + 38;
}

#endif

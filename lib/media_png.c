/* PNG via libpng: every colour type and depth to 8-bit RGB, alpha composited
 * on white.  libpng reports errors by longjmp; its messages are caught into
 * the mcv_error, its warnings dropped (never printed). */
#include "media_impl.h"

#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct png_src {
	const uint8_t *p;
	size_t n, off;
	char msg[200];
} png_src;

static void png_on_error(png_structp png, png_const_charp m)
{
	png_src *s = png_get_error_ptr(png);
	snprintf(s->msg, sizeof s->msg, "%s", m ? m : "error");
	png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp m)
{
	(void)png;
	(void)m; /* benign by libpng's judgement; real damage is an error */
}

static void png_on_read(png_structp png, png_bytep d, size_t len)
{
	png_src *s = png_get_io_ptr(png);
	if (len > s->n - s->off)
		png_error(png, "truncated data");
	memcpy(d, s->p + s->off, len);
	s->off += len;
}

int mcv__png_decode(const uint8_t *buf, size_t n, const mcv_media_limits *lim,
		    mcv_image *out, mcv_error *err)
{
	png_src src = {.p = buf, .n = n};
	png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error,
						 png_on_warning);
	if (!png)
		return mcv_error_set(err, MCV_ENOMEM, "PNG: out of memory");
	png_infop info = png_create_info_struct(png);
	if (!info) {
		png_destroy_read_struct(&png, NULL, NULL);
		return mcv_error_set(err, MCV_ENOMEM, "PNG: out of memory");
	}
	/* Touched after setjmp and read after longjmp: volatile. */
	uint8_t *volatile pix = NULL;
	png_bytep *volatile rows = NULL;
	volatile int rc = 0;
	if (setjmp(png_jmpbuf(png))) {
		free(pix);
		free(rows);
		png_destroy_read_struct(&png, &info, NULL);
		if (rc)
			return rc; /* our own error, already in err */
		int code = strstr(src.msg, "memory") ? MCV_ENOMEM : MCV_EFORMAT;
		return mcv_error_set(err, code, "PNG: %s", src.msg);
	}
	/* Damaged chunks are damage, also ancillary ones (default: drop them). */
	png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
	/* Our own pixel bound decides, with a message naming --max-pixels. */
	png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
	/* Bound what ancillary chunks (zTXt, iCCP, sPLT...) may make libpng
	 * allocate, and how many of them it keeps. */
	png_set_chunk_malloc_max(png, 8u << 20);
	png_set_chunk_cache_max(png, 1000);
	png_set_read_fn(png, &src, png_on_read);
	png_read_info(png, info);

	png_uint_32 w, h;
	int depth, ctype, ilace;
	png_get_IHDR(png, info, &w, &h, &depth, &ctype, &ilace, NULL, NULL);
	rc = mcv__check_pixels(w, h, lim, err);
	if (rc)
		png_longjmp(png, 1);

	/* Everything becomes 8-bit RGBA, so one compositing loop serves all. */
	if (ctype == PNG_COLOR_TYPE_PALETTE)
		png_set_palette_to_rgb(png);
	if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8)
		png_set_expand_gray_1_2_4_to_8(png);
	if (png_get_valid(png, info, PNG_INFO_tRNS))
		png_set_tRNS_to_alpha(png);
	if (depth == 16)
		png_set_scale_16(png);
	if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA)
		png_set_gray_to_rgb(png);
	png_set_filler(png, 0xFF, PNG_FILLER_AFTER);
	png_set_interlace_handling(png);
	png_read_update_info(png, info);
	if (png_get_rowbytes(png, info) != (size_t)w * 4) {
		snprintf(src.msg, sizeof src.msg, "unexpected row layout");
		png_longjmp(png, 1);
	}

	pix = malloc((size_t)w * h * 4);
	rows = malloc(sizeof(png_bytep) * h);
	if (!pix || !rows) {
		rc = mcv_error_set(err, MCV_ENOMEM, "PNG: out of memory for %ux%u pixels",
				   (unsigned)w, (unsigned)h);
		png_longjmp(png, 1);
	}
	for (png_uint_32 y = 0; y < h; y++)
		rows[y] = pix + (size_t)y * w * 4;
	png_read_image(png, rows);
	/* Reads up to IEND: a file cut after the pixels is still truncated. */
	png_read_end(png, NULL);
	free(rows);
	rows = NULL;
	png_destroy_read_struct(&png, &info, NULL);

	/* RGBA -> RGB over white, in place (the write index never passes the read index). */
	uint8_t *p = pix;
	size_t np = (size_t)w * h;
	for (size_t i = 0; i < np; i++) {
		unsigned a = p[i * 4 + 3];
		for (int c = 0; c < 3; c++) {
			unsigned v = p[i * 4 + c];
			p[i * 3 + c] = a == 255 ? v : (uint8_t)((v * a + 255u * (255u - a) + 127u) / 255u);
		}
	}
	uint8_t *shrunk = realloc(p, np * 3);
	out->rgb = shrunk ? shrunk : p;
	out->w = (int)w;
	out->h = (int)h;
	return 0;
}

/* JPEG via libjpeg-turbo's libjpeg API: grey, YCbCr/RGB, CMYK/YCCK to RGB,
 * progressive, EXIF orientation.  The default error manager exits the
 * process and prints; ours longjmps and keeps the text, and counts
 * "corrupt data" warnings as errors (libjpeg otherwise fills a truncated
 * image with grey and carries on); warnings about metadata are ignored. */
#include "media_impl.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <jpeglib.h>
#include <jerror.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

/* A progressive file may declare thousands of tiny scans, each a full pass
 * over the coefficients: refuse such CPU bombs. */
#define MAX_SCANS 1000

typedef struct jerr {
	struct jpeg_error_mgr pub;
	jmp_buf jb;
	int nwarn;
	char warn[JMSG_LENGTH_MAX];
	int too_many_scans;
} jerr;

static void j_error_exit(j_common_ptr c)
{
	longjmp(((jerr *)c->err)->jb, 1);
}

/* Warnings about metadata or harmless padding that other decoders (PIL,
 * browsers) accept too; every other warning means lost pixel data. */
static int benign(int code)
{
	return code == JWRN_ADOBE_XFORM || code == JWRN_JFIF_MAJOR || code == JWRN_BOGUS_ICC ||
	       code == JWRN_EXTRANEOUS_DATA || code == JWRN_BOGUS_PROGRESSION ||
	       code == JWRN_NOT_SEQUENTIAL;
}

static void j_emit(j_common_ptr c, int level)
{
	jerr *e = (jerr *)c->err;
	if (level < 0 && !benign(c->err->msg_code)) { /* levels >= 0 are traces */
		if (!e->nwarn++)
			c->err->format_message(c, e->warn);
	}
}

static void j_output(j_common_ptr c)
{
	(void)c; /* never print */
}

static void j_progress(j_common_ptr c)
{
	if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > MAX_SCANS) {
		((jerr *)c->err)->too_many_scans = 1;
		longjmp(((jerr *)c->err)->jb, 1);
	}
}

static unsigned rd16(const uint8_t *p, int le)
{
	return le ? p[0] | p[1] << 8 : p[0] << 8 | p[1];
}

static uint32_t rd32(const uint8_t *p, int le)
{
	return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
		  : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Orientation (1..8) from an APP1 Exif payload; 1 when absent or damaged.
 * Layout: "Exif\0\0", then a TIFF file: byte order, 42, offset of IFD0;
 * IFD0 = count, then 12-byte entries (tag, type, count, value/offset). */
static int exif_orientation(const uint8_t *d, size_t n)
{
	if (n < 6 + 8 || memcmp(d, "Exif\0\0", 6))
		return 1;
	const uint8_t *t = d + 6;
	size_t tn = n - 6;
	int le;
	if (!memcmp(t, "II", 2))
		le = 1;
	else if (!memcmp(t, "MM", 2))
		le = 0;
	else
		return 1;
	if (rd16(t + 2, le) != 42)
		return 1;
	uint32_t ifd = rd32(t + 4, le);
	if (ifd < 8 || ifd > tn - 2)
		return 1;
	unsigned cnt = rd16(t + ifd, le);
	for (unsigned i = 0; i < cnt; i++) {
		size_t e = (size_t)ifd + 2 + (size_t)i * 12;
		if (e + 12 > tn)
			break;
		if (rd16(t + e, le) != 0x0112)
			continue;
		unsigned type = rd16(t + e + 2, le);
		unsigned v = type == 3 ? rd16(t + e + 8, le) /* SHORT, left-justified */
			   : type == 4 ? rd32(t + e + 8, le) : 0;
		return v >= 1 && v <= 8 ? (int)v : 1;
	}
	return 1;
}

int mcv__jpeg_decode(const uint8_t *buf, size_t n, const mcv_media_limits *lim,
		     mcv_image *out, mcv_error *err)
{
	struct jpeg_decompress_struct ci;
	struct jpeg_progress_mgr prog;
	jerr je;
	memset(&je, 0, sizeof je);
	ci.err = jpeg_std_error(&je.pub);
	je.pub.error_exit = j_error_exit;
	je.pub.emit_message = j_emit;
	je.pub.output_message = j_output;
	uint8_t *volatile pix = NULL;
	uint8_t *volatile row = NULL;
	volatile int created = 0;
	if (setjmp(je.jb)) {
		char m[JMSG_LENGTH_MAX];
		if (je.too_many_scans)
			snprintf(m, sizeof m, "more than %d progressive scans", MAX_SCANS);
		else
			je.pub.format_message((j_common_ptr)&ci, m);
		if (created)
			jpeg_destroy_decompress(&ci);
		free(pix);
		free(row);
		return mcv_error_set(err, strstr(m, "memory") ? MCV_ENOMEM : MCV_EFORMAT, "JPEG: %s", m);
	}
	jpeg_create_decompress(&ci);
	created = 1;
	prog.progress_monitor = j_progress;
	ci.progress = &prog;
	jpeg_mem_src(&ci, buf, (unsigned long)n);
	jpeg_save_markers(&ci, JPEG_APP0 + 1, 0xFFFF);
	if (jpeg_read_header(&ci, TRUE) != JPEG_HEADER_OK) {
		jpeg_destroy_decompress(&ci);
		return mcv_error_set(err, MCV_EFORMAT, "JPEG: tables only, no image");
	}
	int rc = mcv__check_pixels(ci.image_width, ci.image_height, lim, err);
	if (rc) {
		jpeg_destroy_decompress(&ci);
		return rc;
	}
	int cmyk = 0;
	switch (ci.jpeg_color_space) {
	case JCS_GRAYSCALE:
	case JCS_YCbCr:
	case JCS_RGB:
		ci.out_color_space = JCS_RGB;
		break;
	case JCS_CMYK:
	case JCS_YCCK:
		ci.out_color_space = JCS_CMYK;
		cmyk = 1;
		break;
	default:
		jpeg_destroy_decompress(&ci);
		return mcv_error_set(err, MCV_EUNSUPPORTED, "JPEG: unsupported colour space (%d components)",
				     ci.num_components);
	}
	/* Photoshop (the Adobe APP14 marker) stores CMYK inverted. */
	int inverted = cmyk && ci.saw_Adobe_marker;
	int orient = 1;
	for (jpeg_saved_marker_ptr mk = ci.marker_list; mk; mk = mk->next) {
		if (mk->marker == JPEG_APP0 + 1) {
			orient = exif_orientation(mk->data, mk->data_length);
			if (orient != 1)
				break;
		}
	}
	jpeg_start_decompress(&ci);
	int w = (int)ci.output_width, h = (int)ci.output_height;
	int nc = ci.output_components;
	if (nc != (cmyk ? 4 : 3) || w < 1 || h < 1) {
		jpeg_destroy_decompress(&ci);
		return mcv_error_set(err, MCV_EFORMAT, "JPEG: unexpected output layout");
	}
	pix = malloc((size_t)w * h * 3);
	if (cmyk)
		row = malloc((size_t)w * 4);
	if (!pix || (cmyk && !row)) {
		jpeg_destroy_decompress(&ci);
		free(pix);
		free(row);
		return mcv_error_set(err, MCV_ENOMEM, "JPEG: out of memory for %dx%d pixels", w, h);
	}
	while (ci.output_scanline < ci.output_height) {
		int y = (int)ci.output_scanline;
		uint8_t *d = pix + (size_t)y * w * 3;
		JSAMPROW r = cmyk ? row : d;
		if (jpeg_read_scanlines(&ci, &r, 1) != 1)
			break;
		if (!cmyk)
			continue;
		for (int x = 0; x < w; x++) {
			unsigned c = row[x * 4], m = row[x * 4 + 1], yy = row[x * 4 + 2], k = row[x * 4 + 3];
			if (!inverted) {
				c = 255 - c; m = 255 - m; yy = 255 - yy; k = 255 - k;
			}
			/* Now all are "amount of white left": RGB = (1-C)(1-K). */
			d[x * 3] = (uint8_t)((c * k + 127) / 255);
			d[x * 3 + 1] = (uint8_t)((m * k + 127) / 255);
			d[x * 3 + 2] = (uint8_t)((yy * k + 127) / 255);
		}
	}
	int short_read = ci.output_scanline < ci.output_height;
	if (!short_read)
		jpeg_finish_decompress(&ci);
	jpeg_destroy_decompress(&ci);
	free(row);
	row = NULL;
	if (je.nwarn || short_read) {
		free(pix);
		return mcv_error_set(err, MCV_EFORMAT, "JPEG: %s",
				     je.nwarn ? je.warn : "truncated data");
	}
	out->rgb = pix;
	out->w = w;
	out->h = h;
	rc = mcv_image_orient(out, orient, err);
	if (rc)
		mcv_image_free(out);
	return rc;
}

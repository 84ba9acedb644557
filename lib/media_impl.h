/* Internal to the media files (media*.c): not part of the public API. */
#ifndef MCV_MEDIA_IMPL_H
#define MCV_MEDIA_IMPL_H

#include "media.h"

/* "64M", "256Mi", "1000" for limit messages. */
void mcv__fmt_count(char *buf, size_t n, uint64_t v);
/* Turn control characters (newlines from a library's message or a file
 * name inside it) into spaces, so an error stays one line; returns code. */
int mcv__one_line(mcv_error *err, int code);
/* 0, or the over-limit / empty / too-wide error for a declared w x h. */
int mcv__check_pixels(uint64_t w, uint64_t h, const mcv_media_limits *lim, mcv_error *err);
/* Decoders behind mcv_image_decode; lim is resolved (no zero fields). */
int mcv__png_decode(const uint8_t *buf, size_t n, const mcv_media_limits *lim,
		    mcv_image *out, mcv_error *err);
int mcv__jpeg_decode(const uint8_t *buf, size_t n, const mcv_media_limits *lim,
		     mcv_image *out, mcv_error *err);

#endif

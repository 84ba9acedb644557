/* Media input shared parts: limits, magic-byte sniffing, bounded file
 * reading, and the image decoder dispatch. */
#include "media.h"
#include "media_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mcv_media_limits mcv_media_limits_resolve(const mcv_media_limits *lim)
{
	mcv_media_limits l = {0};
	if (lim)
		l = *lim;
	if (!l.max_pixels)
		l.max_pixels = MCV_MEDIA_DEFAULT_MAX_PIXELS;
	if (!l.max_bytes)
		l.max_bytes = MCV_MEDIA_DEFAULT_MAX_BYTES;
	if (!l.max_frames)
		l.max_frames = MCV_MEDIA_DEFAULT_MAX_FRAMES;
	return l;
}

int mcv_media_parse_count(const char *s, uint64_t *out, mcv_error *err)
{
	if (!s || *s < '0' || *s > '9')
		return mcv_error_set(err, MCV_EINVAL, "'%s' is not a count", s ? s : "");
	errno = 0;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	uint64_t mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1000; end++; break;
	case 'm': case 'M': mul = 1000000; end++; break;
	case 'g': case 'G': mul = 1000000000; end++; break;
	}
	if (mul > 1 && *end == 'i') {
		mul = mul == 1000 ? 1ull << 10 : mul == 1000000 ? 1ull << 20 : 1ull << 30;
		end++;
	}
	if (errno || *end || v == 0 || v > UINT64_MAX / mul)
		return mcv_error_set(err, MCV_EINVAL, "'%s' is not a count (like 64M)", s);
	*out = v * mul;
	return 0;
}

void mcv__fmt_count(char *buf, size_t n, uint64_t v)
{
	if (v >= 1000000000 && v % 1000000000 == 0)
		snprintf(buf, n, "%lluG", (unsigned long long)(v / 1000000000));
	else if (v >= 1000000 && v % 1000000 == 0)
		snprintf(buf, n, "%lluM", (unsigned long long)(v / 1000000));
	else if (v >= (1u << 20) && v % (1u << 20) == 0)
		snprintf(buf, n, "%lluMi", (unsigned long long)(v >> 20));
	else if (v >= 1000 && v % 1000 == 0)
		snprintf(buf, n, "%lluK", (unsigned long long)(v / 1000));
	else
		snprintf(buf, n, "%llu", (unsigned long long)v);
}

int mcv__one_line(mcv_error *err, int code)
{
	if (err)
		for (char *p = err->msg; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = ' ';
	return code;
}

int mcv__check_pixels(uint64_t w, uint64_t h, const mcv_media_limits *lim, mcv_error *err)
{
	if (w == 0 || h == 0)
		return mcv_error_set(err, MCV_EFORMAT, "image is %llux%llu: empty",
				     (unsigned long long)w, (unsigned long long)h);
	if (w * h > lim->max_pixels) {
		char b[32];
		mcv__fmt_count(b, sizeof b, lim->max_pixels);
		uint64_t px = w * h;
		char a[40];
		if (px >= 1000000)
			snprintf(a, sizeof a, "%llu Mpx", (unsigned long long)((px + 500000) / 1000000));
		else
			snprintf(a, sizeof a, "%llu px", (unsigned long long)px);
		return mcv_error_set(err, MCV_ENOMEM, "image is %llux%llu (%s), over --max-pixels %s",
				     (unsigned long long)w, (unsigned long long)h, a, b);
	}
	if (w > 65535 || h > 65535)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "image is %llux%llu: a side over 65535",
				     (unsigned long long)w, (unsigned long long)h);
	return 0;
}

mcv_media_kind mcv_media_sniff(const void *buf, size_t n)
{
	const uint8_t *p = buf;
	if (!p)
		return MCV_MEDIA_UNKNOWN;
	if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
		return MCV_MEDIA_PNG;
	if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
		return MCV_MEDIA_JPEG;
	if (n >= 8 && !memcmp(p + 4, "ftyp", 4))
		return MCV_MEDIA_VIDEO; /* MP4, MOV, 3GP */
	if (n >= 4 && !memcmp(p, "\x1a\x45\xdf\xa3", 4))
		return MCV_MEDIA_VIDEO; /* Matroska, WebM */
	if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "AVI ", 4))
		return MCV_MEDIA_VIDEO;
	if (n >= 4 && !memcmp(p, "\x00\x00\x01\xba", 4))
		return MCV_MEDIA_VIDEO; /* MPEG-PS */
	if (n >= 4 && !memcmp(p, "OggS", 4))
		return MCV_MEDIA_VIDEO;
	if (n >= 6 && (!memcmp(p, "GIF87a", 6) || !memcmp(p, "GIF89a", 6)))
		return MCV_MEDIA_VIDEO; /* animated or not, FFmpeg decodes it */
	if (n >= 189 && p[0] == 0x47 && p[188] == 0x47)
		return MCV_MEDIA_VIDEO; /* MPEG-TS sync bytes */
	return MCV_MEDIA_UNKNOWN;
}

const char *mcv_media_kind_name(mcv_media_kind k)
{
	switch (k) {
	case MCV_MEDIA_PNG: return "png";
	case MCV_MEDIA_JPEG: return "jpeg";
	case MCV_MEDIA_VIDEO: return "video";
	default: return "unknown";
	}
}

int mcv_image_decode(const void *buf, size_t n, const mcv_media_limits *lim,
		     mcv_image *out, mcv_error *err)
{
	out->w = out->h = 0;
	out->rgb = NULL;
	mcv_media_limits l = mcv_media_limits_resolve(lim);
	if (n == 0)
		return mcv_error_set(err, MCV_EFORMAT, "empty file (0 bytes)");
	if (n > l.max_bytes) {
		char b[32];
		mcv__fmt_count(b, sizeof b, l.max_bytes);
		return mcv_error_set(err, MCV_ENOMEM, "file is %zu bytes, over --max-bytes %s", n, b);
	}
	switch (mcv_media_sniff(buf, n)) {
	case MCV_MEDIA_PNG:
		return mcv__png_decode(buf, n, &l, out, err);
	case MCV_MEDIA_JPEG:
		return mcv__jpeg_decode(buf, n, &l, out, err);
	case MCV_MEDIA_VIDEO:
		return mcv_error_set(err, MCV_EFORMAT, "a video, not a PNG or JPEG image");
	default:
		return mcv_error_set(err, MCV_EFORMAT, "not a PNG or JPEG image");
	}
}

int mcv_media_read_file(const char *path, uint64_t max_bytes, uint8_t **bufp, size_t *np,
			mcv_error *err)
{
	*bufp = NULL;
	*np = 0;
	if (!max_bytes)
		max_bytes = MCV_MEDIA_DEFAULT_MAX_BYTES;
	int use_stdin = !strcmp(path, "-");
	int fd = use_stdin ? 0 : open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", path, strerror(errno));
	struct stat st;
	char b[32];
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
		if (!use_stdin)
			close(fd);
		return mcv_error_set(err, MCV_EIO, "cannot read '%s': Is a directory", path);
	}
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > max_bytes) {
		if (!use_stdin)
			close(fd);
		mcv__fmt_count(b, sizeof b, max_bytes);
		return mcv_error_set(err, MCV_ENOMEM, "file is %lld bytes, over --max-bytes %s",
				     (long long)st.st_size, b);
	}
	size_t cap = 1 << 16, n = 0;
	if ((uint64_t)cap > max_bytes + 1)
		cap = (size_t)max_bytes + 1;
	uint8_t *buf = malloc(cap);
	if (!buf) {
		if (!use_stdin)
			close(fd);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory reading '%s'", path);
	}
	for (;;) {
		if (n == cap) {
			if ((uint64_t)cap > max_bytes)
				break; /* already one byte over: refused below */
			size_t nc = cap * 2;
			if ((uint64_t)nc > max_bytes + 1)
				nc = (size_t)max_bytes + 1;
			uint8_t *nb = realloc(buf, nc);
			if (!nb) {
				free(buf);
				if (!use_stdin)
					close(fd);
				return mcv_error_set(err, MCV_ENOMEM, "out of memory reading '%s'", path);
			}
			buf = nb;
			cap = nc;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			free(buf);
			if (!use_stdin)
				close(fd);
			return mcv_error_set(err, MCV_EIO, "cannot read '%s': %s", path, strerror(e));
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	if (!use_stdin)
		close(fd);
	if ((uint64_t)n > max_bytes) {
		free(buf);
		mcv__fmt_count(b, sizeof b, max_bytes);
		return mcv_error_set(err, MCV_ENOMEM, "file is over --max-bytes %s", b);
	}
	*bufp = buf;
	*np = n;
	return 0;
}

int mcv_image_load(const char *path, const mcv_media_limits *lim, mcv_image *out,
		   mcv_error *err)
{
	out->w = out->h = 0;
	out->rgb = NULL;
	mcv_media_limits l = mcv_media_limits_resolve(lim);
	uint8_t *buf;
	size_t n;
	int rc = mcv_media_read_file(path, l.max_bytes, &buf, &n, err);
	if (rc)
		return rc;
	rc = mcv_image_decode(buf, n, &l, out, err);
	free(buf);
	return rc;
}

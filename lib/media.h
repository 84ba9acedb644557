/* Media input: bytes (image files, archive members, video files) -> RGB
 * images (image.h).
 *
 *   image  PNG (libpng) and JPEG (libjpeg-turbo), told apart by magic bytes,
 *          never by file name.  mcv_image_decode / mcv_image_load.
 *   video  anything FFmpeg's libavformat/libavcodec open; N frames sampled
 *          uniformly, or F frames per second.  mcv_video_frames.
 *   archive  tar, tar.gz/.bz2/.xz/.zst, zip, 7z, cpio... (libarchive), from a
 *          path, a file descriptor or stdin; an iterator over the regular
 *          members that yields image bytes, or a "not an image" / error
 *          record per member.  mcv_archive_*.
 *
 * Every decoder is bounded by an mcv_media_limits: an image's declared size
 * is checked against max_pixels BEFORE any pixel memory is allocated (a
 * decompression bomb costs nothing), encoded inputs larger than max_bytes
 * are refused without being read in full.  Corrupt, truncated, zero-byte or
 * hostile input gives a negative MCV_E* and one line in the mcv_error
 * (MCV_EFORMAT for bad data, MCV_ENOMEM for "over a limit", MCV_EIO for
 * open/read failures); nothing in here prints, exits or aborts.  The
 * libraries' own diagnostics (libpng warnings, libjpeg messages, FFmpeg's
 * av_log) are captured into the error line or dropped, never printed.
 *
 * Messages do not name the input; the caller prefixes them, e.g.
 *   mcv_error_prefix(&err, "%s", path)  ->  "x.png: PNG: truncated data".
 * Limit messages name the mcv-run options --max-pixels / --max-bytes so a
 * user knows what to change:
 *   "image is 50000x50000 (2500 Mpx), over --max-pixels 64M".
 *
 * Typical use (scripts/media-probe.c is a complete example):
 *   mcv_media_limits lim = {.max_pixels = opt_max_pixels};  // 0 = default
 *   mcv_image im;
 *   if (mcv_image_load(path, &lim, &im, &err)) { print error line; continue; }
 *   mcv_image_resize_f32(&im, w, h, MCV_RESIZE_BICUBIC, NULL, NULL, chw, &err);
 *   mcv_image_free(&im);
 * and for archives:
 *   mcv_archive_open(&a, "-", &lim, &err);
 *   while ((rc = mcv_archive_next(a, &m, &err)) == 1)
 *       m.status == MCV_MEMBER_IMAGE ? mcv_archive_member_decode(a, &m, &im, &err)
 *                                    : error line with m.name and m.err.msg;
 *   rc < 0: error line for the archive itself;  mcv_archive_close(a);
 *
 * Thread safety: decoding distinct inputs from several threads at once is
 * fine (no shared state besides FFmpeg's log callback, which is installed
 * once and routes messages per thread). */
#ifndef MCV_MEDIA_H
#define MCV_MEDIA_H

#include "image.h"
#include "mcv.h"
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- limits */

/* Bounds on one input.  A zero field means "the default" below, so
 * `mcv_media_limits lim = {0}` (or passing NULL) gives the defaults and a
 * front end sets only what the user asked for (e.g. --max-pixels). */
typedef struct mcv_media_limits {
	uint64_t max_pixels; /* width * height of one image or video frame */
	uint64_t max_bytes;  /* encoded size of one image file or archive member */
	uint32_t max_frames; /* frames returned from one video */
} mcv_media_limits;

#define MCV_MEDIA_DEFAULT_MAX_PIXELS 64000000ull /* 64 Mpx, "--max-pixels 64M" */
#define MCV_MEDIA_DEFAULT_MAX_BYTES (256ull << 20) /* 256 MiB */
#define MCV_MEDIA_DEFAULT_MAX_FRAMES 64u

/* The limits with every zero field replaced by its default.  lim may be NULL. */
mcv_media_limits mcv_media_limits_resolve(const mcv_media_limits *lim);

/* Parse a count with an optional K/M/G suffix (powers of 1000: "64M" =
 * 64000000, as --max-pixels and --max-bytes take them; "256Mi" style binary
 * suffixes Ki/Mi/Gi are accepted too).  0 or garbage -> MCV_EINVAL. */
int mcv_media_parse_count(const char *s, uint64_t *out, mcv_error *err);

/* ---------------------------------------------------------------- sniffing */

typedef enum mcv_media_kind {
	MCV_MEDIA_UNKNOWN = 0,
	MCV_MEDIA_PNG,
	MCV_MEDIA_JPEG,
	MCV_MEDIA_VIDEO, /* a container FFmpeg handles: MP4/MOV, Matroska/WebM,
			    AVI, MPEG-TS/PS, Ogg, GIF (a guess from magic only) */
} mcv_media_kind;

/* What the first bytes say (16 are enough; fewer is fine).  Images are
 * recognised exactly; MCV_MEDIA_VIDEO is a best guess for choosing between
 * mcv_image_load and mcv_video_frames. */
mcv_media_kind mcv_media_sniff(const void *buf, size_t n);
const char *mcv_media_kind_name(mcv_media_kind k); /* "png", "jpeg", "video", "unknown" */

/* ---------------------------------------------------------------- images */

/* Decode a PNG or JPEG held in memory into *out (allocated here; free with
 * mcv_image_free).  On failure *out is left empty ({0, 0, NULL}).
 *   PNG: 1/2/4/8/16-bit, grey, grey+alpha, palette, RGB, RGBA, tRNS,
 *        Adam7 interlace.  Alpha is composited on white; 16-bit samples are
 *        scaled to 8 bits with rounding.  CRC and zlib check errors, missing
 *        IEND and truncation are errors.
 *   JPEG: grey, YCbCr, RGB, CMYK and YCCK (Adobe-inverted or plain; the
 *        Adobe APP14 marker decides), baseline and progressive, arithmetic.
 *        The EXIF orientation (APP1) is applied, so w/h are the displayed
 *        sides.  libjpeg's "corrupt data" warnings (premature end of data,
 *        bad Huffman code...) are errors, so truncated files never decode to
 *        grey filler; warnings about metadata or padding only (unknown JFIF
 *        version, bad ICC marker, extraneous bytes between markers) are not.
 *        Pixels equal PIL's Image.open(..).convert("RGB") with the same
 *        libjpeg-turbo (PIL then ImageOps.exif_transpose for orientation).
 * Errors: MCV_EFORMAT (not PNG/JPEG, corrupt, truncated, zero bytes),
 * MCV_ENOMEM (over lim->max_pixels or max_bytes, or malloc failed). */
int mcv_image_decode(const void *buf, size_t n, const mcv_media_limits *lim,
		     mcv_image *out, mcv_error *err);

/* Read a whole file ("-" = stdin) into a malloc'ed buffer, refusing more
 * than max_bytes (0 = default) without reading beyond the bound.  *buf may
 * be NULL when *n is 0.  Messages: "cannot open 'x': No such file or
 * directory", "file is over --max-bytes 256M". */
int mcv_media_read_file(const char *path, uint64_t max_bytes, uint8_t **buf,
			size_t *n, mcv_error *err);

/* mcv_media_read_file + mcv_image_decode.  Errors are NOT prefixed with the
 * path (the caller knows whether to say the path or an archive member). */
int mcv_image_load(const char *path, const mcv_media_limits *lim, mcv_image *out,
		   mcv_error *err);

/* ---------------------------------------------------------------- video */

typedef struct mcv_video_opts {
	int n_frames; /* > 0: this many frames, uniformly spread (the middle
			 frame of each of n equal parts, like MiniCPM-V's
			 uniform_sample); capped by lim->max_frames */
	double fps;   /* > 0 (and n_frames == 0): one frame every 1/fps seconds
			 (the first frame at or after t = k/fps); when that
			 gives more than lim->max_frames frames, falls back to
			 max_frames uniformly spread frames */
} mcv_video_opts;   /* both 0: n_frames = lim->max_frames */

/* Called once per chosen frame, in time order.  `frame` belongs to the
 * library and is freed after the call, unless the callback takes it: set
 * frame->rgb = NULL after keeping the pointer (then mcv_image_free is the
 * callback's job).  t is seconds from the start of the stream; index is the
 * frame's number in presentation order (0-based).  Return 0 to go on; a non-zero
 * return stops decoding and mcv_video_frames returns that value. */
typedef int (*mcv_video_frame_fn)(void *ctx, mcv_image *frame, double t, int64_t index);

/* Decode the chosen frames of the first video stream of the file at path
 * (FFmpeg reads it; it must be seekable: no "-").  A first pass only
 * demuxes, to learn the frame count and timestamps; the second seeks to the
 * key frame before each chosen frame, so a few frames of a long video cost
 * a few GOPs of decoding, not the whole file (files without timestamps on
 * every frame are decoded from the start and frames counted).  Frames larger than
 * lim->max_pixels are refused before decoding (the stream's declared size)
 * and again per decoded frame.  Errors: MCV_EIO (missing or unreadable file),
 * MCV_EFORMAT ("no video stream", corrupt, or no frame decoded), MCV_ENOMEM
 * (limits), MCV_EINVAL (bad opts); the message carries FFmpeg's reason
 * (av_strerror and its last logged error). */
int mcv_video_frames(const char *path, const mcv_video_opts *opt,
		     const mcv_media_limits *lim, mcv_video_frame_fn fn, void *ctx,
		     mcv_error *err);

/* The array form: all chosen frames and their times.  Free with
 * mcv_video_free.  On failure the struct is left empty. */
typedef struct mcv_video {
	int n;              /* frames */
	mcv_image *frames;  /* n images */
	double *t;          /* n times, seconds */
	int64_t *index;     /* n frame numbers */
	double duration;    /* time of the last returned frame, seconds */
} mcv_video;

int mcv_video_decode(const char *path, const mcv_video_opts *opt,
		     const mcv_media_limits *lim, mcv_video *out, mcv_error *err);
void mcv_video_free(mcv_video *v);

/* ---------------------------------------------------------------- archives */

typedef struct mcv_archive mcv_archive;

/* Open an archive (any format and compression libarchive knows) from a path
 * ("-" = stdin), a file descriptor (not closed by us) or memory (not copied:
 * keep it alive until mcv_archive_close).  Opening fails only for a path
 * that cannot be opened (MCV_EIO) or no memory; an input that is not an
 * archive is reported by the first mcv_archive_next.  Opening may already
 * read the first block (to recognise the format).  A zero-byte input is an
 * empty archive (no members). */
int mcv_archive_open(mcv_archive **out, const char *path, const mcv_media_limits *lim,
		     mcv_error *err);
int mcv_archive_open_fd(mcv_archive **out, int fd, const mcv_media_limits *lim,
			mcv_error *err);
int mcv_archive_open_memory(mcv_archive **out, const void *buf, size_t n,
			    const mcv_media_limits *lim, mcv_error *err);
void mcv_archive_close(mcv_archive *a); /* NULL is fine */

typedef enum mcv_member_status {
	MCV_MEMBER_IMAGE = 0,   /* data/size hold the member's bytes; kind says PNG/JPEG */
	MCV_MEMBER_SKIPPED = 1, /* not an image (first bytes); err.msg says so */
	MCV_MEMBER_ERROR = 2,   /* over max_bytes, or the archive is corrupt here;
				   err has the reason (code + one line) */
} mcv_member_status;

/* One record.  Everything points into the mcv_archive and stays valid until
 * the next mcv_archive_next or mcv_archive_close. */
typedef struct mcv_archive_member {
	const char *name;   /* path as stored in the archive, untouched: may be
			       "../x" or "/etc/x" (harmless: nothing is written
			       to disk) -- report it as it is; "" if unknown */
	mcv_member_status status;
	mcv_media_kind kind;  /* for IMAGE: MCV_MEDIA_PNG or MCV_MEDIA_JPEG */
	const uint8_t *data;  /* for IMAGE: the member's bytes ... */
	size_t size;          /* ... and their count (<= max_bytes) */
	int64_t declared_size; /* size in the header, -1 if not stated */
	mcv_error err;        /* for SKIPPED and ERROR */
} mcv_archive_member;

/* Step to the next regular-file member (directories, links and devices are
 * passed over silently).  Returns 1 with *m filled, 0 at the end, or a
 * negative MCV_E* (with err) when the input is not a readable archive at
 * all (nothing could be read from it).  Damage after the first member is
 * reported as one MCV_MEMBER_ERROR record, after which the iterator ends
 * (returns 0): so a batch prints an error line and goes on.  A member over
 * max_bytes (declared or actual) is an ERROR record and is not read beyond
 * the bound; the iterator goes on with the next member.  Non-image members
 * are SKIPPED records after reading only their first bytes. */
int mcv_archive_next(mcv_archive *a, mcv_archive_member *m, mcv_error *err);

/* Convenience: decode an IMAGE member (mcv_image_decode on its bytes with
 * the archive's limits). */
int mcv_archive_member_decode(const mcv_archive *a, const mcv_archive_member *m,
			      mcv_image *out, mcv_error *err);

#endif

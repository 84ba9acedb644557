/* Video (lib/media_video.c): a tiny MPEG-4 video (with B-frames, so decode
 * order differs from display order) is encoded here with FFmpeg's own
 * libraries, each frame a flat grey that encodes its number; sampling by
 * count and by fps must pick the right frames.  Hostile cases: garbage
 * named .mp4, zero bytes, truncated and bit-flipped files, missing file,
 * frame size over --max-pixels.  FFmpeg must print nothing on stderr.
 * Also built with ASan+UBSan by `make check`. */
#include "media.h"
#include "unit.h"

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NF 30   /* frames */
#define FPS 10
#define VW 64
#define VH 48

static char dir[] = "/tmp/mcv-video-XXXXXX";

/* Y level of frame i; U = V = 128 (grey). */
static int y_of(int i) { return 16 + i * 6; }
/* the RGB grey that limited-range Y decodes to */
static double grey_of(int i) { return (y_of(i) - 16) * 255.0 / 219.0; }

static int encode(const char *path, enum AVCodecID id, int bframes)
{
	AVFormatContext *oc = NULL;
	if (avformat_alloc_output_context2(&oc, NULL, NULL, path) < 0)
		return -1;
	const AVCodec *codec = avcodec_find_encoder(id);
	if (!codec) {
		avformat_free_context(oc);
		return -2;
	}
	AVStream *st = avformat_new_stream(oc, NULL);
	AVCodecContext *c = avcodec_alloc_context3(codec);
	c->width = VW;
	c->height = VH;
	c->time_base = (AVRational){1, FPS};
	c->framerate = (AVRational){FPS, 1};
	c->pix_fmt = AV_PIX_FMT_YUV420P;
	c->gop_size = 6;
	c->max_b_frames = bframes;
	c->flags |= AV_CODEC_FLAG_QSCALE;
	c->global_quality = FF_QP2LAMBDA * 2;
	if (oc->oformat->flags & AVFMT_GLOBALHEADER)
		c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
	int rc = -3;
	AVFrame *fr = av_frame_alloc();
	AVPacket *pkt = av_packet_alloc();
	if (avcodec_open2(c, codec, NULL) < 0 || avcodec_parameters_from_context(st->codecpar, c) < 0)
		goto out;
	st->time_base = c->time_base;
	if (avio_open(&oc->pb, path, AVIO_FLAG_WRITE) < 0 || avformat_write_header(oc, NULL) < 0)
		goto out;
	fr->format = c->pix_fmt;
	fr->width = VW;
	fr->height = VH;
	if (av_frame_get_buffer(fr, 0) < 0)
		goto out;
	for (int i = 0; i <= NF; i++) {
		if (i < NF) {
			av_frame_make_writable(fr);
			for (int p = 0; p < 3; p++) {
				int h = p ? VH / 2 : VH, w = p ? VW / 2 : VW;
				for (int y = 0; y < h; y++)
					memset(fr->data[p] + (size_t)y * fr->linesize[p], p ? 128 : y_of(i), w);
			}
			fr->pts = i;
		}
		if (avcodec_send_frame(c, i < NF ? fr : NULL) < 0)
			goto out;
		while (avcodec_receive_packet(c, pkt) == 0) {
			pkt->duration = 1; /* else the MP4 edit list drops the last frame */
			av_packet_rescale_ts(pkt, c->time_base, st->time_base);
			pkt->stream_index = st->index;
			if (av_interleaved_write_frame(oc, pkt) < 0)
				goto out;
		}
	}
	rc = av_write_trailer(oc) < 0 ? -4 : 0;
out:
	av_packet_free(&pkt);
	av_frame_free(&fr);
	avcodec_free_context(&c);
	if (oc->pb)
		avio_closep(&oc->pb);
	avformat_free_context(oc);
	return rc;
}

typedef struct got {
	int n;
	int64_t idx[NF + 8];
	double t[NF + 8];
	int grey_idx[NF + 8]; /* frame number read back from the pixels */
	int stop_at;
} got;

static int on_frame(void *ctx, mcv_image *f, double t, int64_t index)
{
	got *g = ctx;
	if (g->n >= NF + 8)
		return -99;
	const uint8_t *p = f->rgb + ((size_t)(f->h / 2) * f->w + f->w / 2) * 3;
	g->grey_idx[g->n] = (int)lround(p[1] / grey_of(1));
	CHECK(f->w == VW && f->h == VH, "frame size %dx%d", f->w, f->h);
	g->idx[g->n] = index;
	g->t[g->n] = t;
	g->n++;
	return g->stop_at && g->n == g->stop_at ? 7 : 0;
}

static void expect_frames(const char *path, mcv_video_opts o, mcv_media_limits lim,
			  const int *want, int nwant, const char *what)
{
	got g = {0};
	mcv_error err = {0};
	int rc = mcv_video_frames(path, &o, &lim, on_frame, &g, &err);
	CHECK(rc == 0, "%s: %s", what, err.msg);
	CHECK(g.n == nwant, "%s: %d frames, want %d", what, g.n, nwant);
	for (int i = 0; i < g.n && i < nwant; i++) {
		CHECK(g.idx[i] == want[i], "%s: frame %d is #%lld, want #%d", what, i, (long long)g.idx[i], want[i]);
		CHECK(g.grey_idx[i] == want[i], "%s: frame %d shows #%d, want #%d", what, i, g.grey_idx[i], want[i]);
		/* AVI keeps decode times only: its B-frame stream is off by a frame */
		CHECK(strstr(what, "avi") || fabs(g.t[i] - want[i] / (double)FPS) < 1e-6,
		      "%s: frame %d at %.3f s", what, i, g.t[i]);
	}
}

static void write_file(const char *path, const void *d, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (n)
		fwrite(d, 1, n, f);
	fclose(f);
}

static uint8_t *read_all(const char *path, size_t *n)
{
	struct stat st;
	if (stat(path, &st))
		return NULL;
	*n = (size_t)st.st_size;
	uint8_t *b = malloc(*n + 1);
	FILE *f = fopen(path, "rb");
	*n = fread(b, 1, *n, f);
	b[*n] = 0;
	fclose(f);
	return b;
}

int main(int argc, char **argv)
{
	/* scripts/mk-media-fixtures.sh makes test/fixtures/media/tiny.mp4 so */
	if (argc == 3 && !strcmp(argv[1], "--write"))
		return encode(argv[2], AV_CODEC_ID_MPEG4, 2) ? 1 : 0;
	if (!mkdtemp(dir))
		UNIT_SKIP("mkdtemp failed");
	char mp4[64], bad[64], tmp[64], errlog[64];
	snprintf(mp4, sizeof mp4, "%s/v.mp4", dir);
	snprintf(bad, sizeof bad, "%s/bad.mp4", dir);
	snprintf(tmp, sizeof tmp, "%s/t.mkv", dir);
	snprintf(errlog, sizeof errlog, "%s/stderr", dir);
	int erc = encode(mp4, AV_CODEC_ID_MPEG4, 2);
	if (erc == -2)
		UNIT_SKIP("this libavcodec has no MPEG-4 encoder");
	CHECK(erc == 0, "encoding the test video failed (%d)", erc);

	/* Everything FFmpeg might say goes to a file we check is empty. */
	fflush(stderr);
	int saved = dup(2);
	FILE *ef = freopen(errlog, "w", stderr);
	(void)ef;

	mcv_media_limits lim = {0};
	expect_frames(mp4, (mcv_video_opts){.n_frames = 5}, lim, (int[]){3, 9, 15, 21, 27}, 5, "5 frames");
	expect_frames(mp4, (mcv_video_opts){.n_frames = 1}, lim, (int[]){15}, 1, "1 frame");
	expect_frames(mp4, (mcv_video_opts){.fps = 2}, lim, (int[]){0, 5, 10, 15, 20, 25}, 6, "2 fps");
	expect_frames(mp4, (mcv_video_opts){.fps = 3}, lim, (int[]){0, 4, 7, 10, 14, 17, 20, 24, 27}, 9, "3 fps");
	lim.max_frames = 4;
	expect_frames(mp4, (mcv_video_opts){.fps = 2}, lim, (int[]){3, 11, 18, 26}, 4, "2 fps over max 4");
	expect_frames(mp4, (mcv_video_opts){.n_frames = 10}, lim, (int[]){3, 11, 18, 26}, 4, "10 capped at 4");
	lim.max_frames = 0;
	int all[NF];
	for (int i = 0; i < NF; i++)
		all[i] = i;
	expect_frames(mp4, (mcv_video_opts){.n_frames = 100}, lim, all, NF, "more than there are");
	expect_frames(mp4, (mcv_video_opts){.fps = 50}, lim, all, NF, "fps above the native rate");

	/* Other containers, with B-frames; a raw MPEG-4 stream (.m4v) has no
	 * container timestamps, so frames are found by counting, not seeking. */
	static const char *other[] = {"mkv", "avi", "m4v"};
	for (int i = 0; i < 3; i++) {
		char p[64], what[64];
		snprintf(p, sizeof p, "%s/v.%s", dir, other[i]);
		CHECK(encode(p, AV_CODEC_ID_MPEG4, 2) == 0, "encoding %s", p);
		snprintf(what, sizeof what, "%s: 5 frames", other[i]);
		expect_frames(p, (mcv_video_opts){.n_frames = 5}, lim, (int[]){3, 9, 15, 21, 27}, 5, what);
		snprintf(what, sizeof what, "%s: all", other[i]);
		expect_frames(p, (mcv_video_opts){.n_frames = 100}, lim, all, NF, what);
		unlink(p);
	}

	/* callback stops the decoding with its own value */
	got g = {.stop_at = 2};
	mcv_error err = {0};
	CHECK(mcv_video_frames(mp4, &(mcv_video_opts){.n_frames = 5}, NULL, on_frame, &g, &err) == 7 &&
	      g.n == 2, "stop: %d frames", g.n);

	/* the array form */
	mcv_video v;
	CHECK(mcv_video_decode(mp4, &(mcv_video_opts){.n_frames = 3}, NULL, &v, &err) == 0 && v.n == 3 &&
	      v.index[1] == 15 && v.frames[2].w == VW && fabs(v.duration - 2.5) < 1e-6,
	      "array form: %s", err.msg);
	mcv_video_free(&v);
	mcv_video_free(&v);

	/* bounds and bad options */
	int rc = mcv_video_frames(mp4, NULL, &(mcv_media_limits){.max_pixels = 100}, on_frame, &g, &err);
	CHECK(rc == MCV_ENOMEM && strstr(err.msg, "64x48 (3072 px), over --max-pixels 100"), "pixels: %s", err.msg);
	CHECK(mcv_video_frames(mp4, &(mcv_video_opts){.n_frames = -1}, NULL, on_frame, &g, &err) == MCV_EINVAL, "n<0");
	CHECK(mcv_video_frames(mp4, &(mcv_video_opts){.fps = NAN}, NULL, on_frame, &g, &err) == MCV_EINVAL, "nan");
	CHECK(mcv_video_frames("-", NULL, NULL, on_frame, &g, &err) == MCV_EINVAL, "stdin");

	/* hostile files: one-line errors, or (flips) any sane outcome */
	uint8_t junk[5000];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (uint8_t)(i * 2654435761u >> 13);
	write_file(bad, junk, sizeof junk);
	memset(&err, 0, sizeof err);
	rc = mcv_video_decode(bad, NULL, NULL, &v, &err);
	CHECK(rc == MCV_EFORMAT && err.msg[0] && !strchr(err.msg, '\n') && v.n == 0, "garbage: %d %s", rc, err.msg);
	write_file(bad, "", 0);
	rc = mcv_video_decode(bad, NULL, NULL, &v, &err);
	CHECK(rc < 0 && err.msg[0], "zero bytes: %d %s", rc, err.msg);
	write_file(bad, "\0\0\0\x18" "ftypisom\0\0\0\0isomiso2", 24);
	rc = mcv_video_decode(bad, NULL, NULL, &v, &err);
	CHECK(rc < 0 && err.msg[0], "header only: %d %s", rc, err.msg);
	snprintf(tmp, sizeof tmp, "%s/none.mp4", dir);
	rc = mcv_video_decode(tmp, NULL, NULL, &v, &err);
	CHECK(rc == MCV_EIO && strstr(err.msg, "No such file"), "missing: %d %s", rc, err.msg);
	size_t n;
	uint8_t *orig = read_all(mp4, &n);
	CHECK(orig != NULL, "read back");
	for (int k = 1; orig && k < 8; k++) {
		write_file(bad, orig, n * k / 8);
		memset(&err, 0, sizeof err);
		rc = mcv_video_decode(bad, &(mcv_video_opts){.n_frames = 4}, NULL, &v, &err);
		CHECK(rc == 0 ? v.n > 0 : (err.msg[0] && v.n == 0), "cut %d/8: %d %s", k, rc, err.msg);
		mcv_video_free(&v);
	}
	for (int k = 0; orig && k < 40; k++) {
		uint8_t *f = malloc(n);
		memcpy(f, orig, n);
		size_t at = (size_t)k * n / 40 + 3;
		f[at < n ? at : 0] ^= 0x5A;
		write_file(bad, f, n);
		memset(&err, 0, sizeof err);
		rc = mcv_video_decode(bad, &(mcv_video_opts){.n_frames = 4}, NULL, &v, &err);
		CHECK(rc == 0 ? v.n > 0 && v.frames[0].rgb : (err.msg[0] && v.n == 0), "flip %d: %d %s", k, rc, err.msg);
		mcv_video_free(&v);
		free(f);
	}
	free(orig);

	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	size_t en = 0;
	uint8_t *said = read_all(errlog, &en);
	CHECK(en == 0, "FFmpeg printed on stderr: %.200s", said ? (char *)said : "");
	free(said);

	unlink(mp4);
	unlink(bad);
	unlink(errlog);
	rmdir(dir);
	return unit_done("test_media_video");
}

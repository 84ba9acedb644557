/* Video via FFmpeg: two passes over the file.  The first only demuxes (cheap)
 * to learn how many frames there are and when; the chosen frame numbers
 * follow from that, exactly like sampling frame indices in the reference.
 * The second decodes up to the last chosen frame and converts the chosen
 * ones to RGB24 with swscale.  FFmpeg's logging is routed into our error
 * line instead of stderr. */
#include "media_impl.h"

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FFmpeg is loaded when a video is first opened, not at start-up: its four
 * libraries pull in ~125 shared objects, 20-30 ms of dynamic linking that
 * every image-only run would pay.  The build still compiles and links
 * against them (the ABI called is the headers'; the link checks they are
 * installed), the binaries just do not list them as needed.  Without them
 * at run time, video input fails with a one-line error; images work. */
#define AV_STR2(x) #x
#define AV_STR(x) AV_STR2(x)
enum { AVL_UTIL, AVL_CODEC, AVL_FORMAT, AVL_SWS, AVL_N };
static const char *const av_lib_name[AVL_N] = {
	"libavutil.so." AV_STR(LIBAVUTIL_VERSION_MAJOR),
	"libavcodec.so." AV_STR(LIBAVCODEC_VERSION_MAJOR),
	"libavformat.so." AV_STR(LIBAVFORMAT_VERSION_MAJOR),
	"libswscale.so." AV_STR(LIBSWSCALE_VERSION_MAJOR),
};

#define AV_FUNCS(X) \
	X(UTIL, av_frame_alloc) X(UTIL, av_frame_free) X(UTIL, av_frame_unref) \
	X(UTIL, av_log_format_line) X(UTIL, av_log_set_callback) X(UTIL, av_log_set_level) \
	X(UTIL, av_strerror) \
	X(CODEC, av_packet_alloc) X(CODEC, av_packet_free) X(CODEC, av_packet_unref) \
	X(CODEC, avcodec_alloc_context3) X(CODEC, avcodec_flush_buffers) X(CODEC, avcodec_free_context) \
	X(CODEC, avcodec_open2) X(CODEC, avcodec_parameters_to_context) X(CODEC, avcodec_receive_frame) \
	X(CODEC, avcodec_send_packet) \
	X(FORMAT, av_find_best_stream) X(FORMAT, av_read_frame) X(FORMAT, av_seek_frame) \
	X(FORMAT, avformat_close_input) X(FORMAT, avformat_find_stream_info) X(FORMAT, avformat_open_input) \
	X(SWS, sws_freeContext) X(SWS, sws_getCachedContext) X(SWS, sws_scale)

static struct {
#define AV_PTR(lib, f) __typeof__(f) *f;
	AV_FUNCS(AV_PTR)
#undef AV_PTR
} avf;
static char av_missing[384]; /* why FFmpeg could not be loaded, or "" */
static pthread_once_t av_once = PTHREAD_ONCE_INIT;

static void av_load(void)
{
	void *h[AVL_N];
	for (int i = 0; i < AVL_N; i++)
		if (!(h[i] = dlopen(av_lib_name[i], RTLD_NOW | RTLD_LOCAL))) {
			const char *e = dlerror();
			snprintf(av_missing, sizeof av_missing, "video input needs FFmpeg (%s): %s", av_lib_name[i],
				 e ? e : "cannot load it");
			return;
		}
#define AV_SYM(lib, f) \
	if (!(*(void **)&avf.f = dlsym(h[AVL_##lib], #f))) { \
		snprintf(av_missing, sizeof av_missing, "video input needs FFmpeg: %s has no %s", \
			 av_lib_name[AVL_##lib], #f); \
		return; \
	}
	AV_FUNCS(AV_SYM)
#undef AV_SYM
}

static int av_ready(mcv_error *err)
{
	pthread_once(&av_once, av_load);
	return av_missing[0] ? mcv_error_set(err, MCV_EUNSUPPORTED, "%s", av_missing) : 0;
}

/* Below, every FFmpeg call goes through the loaded pointers. */
#define av_frame_alloc avf.av_frame_alloc
#define av_frame_free avf.av_frame_free
#define av_frame_unref avf.av_frame_unref
#define av_log_format_line avf.av_log_format_line
#define av_log_set_callback avf.av_log_set_callback
#define av_log_set_level avf.av_log_set_level
#define av_strerror avf.av_strerror
#define av_packet_alloc avf.av_packet_alloc
#define av_packet_free avf.av_packet_free
#define av_packet_unref avf.av_packet_unref
#define avcodec_alloc_context3 avf.avcodec_alloc_context3
#define avcodec_flush_buffers avf.avcodec_flush_buffers
#define avcodec_free_context avf.avcodec_free_context
#define avcodec_open2 avf.avcodec_open2
#define avcodec_parameters_to_context avf.avcodec_parameters_to_context
#define avcodec_receive_frame avf.avcodec_receive_frame
#define avcodec_send_packet avf.avcodec_send_packet
#define av_find_best_stream avf.av_find_best_stream
#define av_read_frame avf.av_read_frame
#define av_seek_frame avf.av_seek_frame
#define avformat_close_input avf.avformat_close_input
#define avformat_find_stream_info avf.avformat_find_stream_info
#define avformat_open_input avf.avformat_open_input
#define sws_freeContext avf.sws_freeContext
#define sws_getCachedContext avf.sws_getCachedContext
#define sws_scale avf.sws_scale

/* Demuxing more packets than this is refused (about 40 h at 30 fps); it
 * bounds the first pass's timestamp table. */
#define MAX_PACKETS (1 << 22)

/* Per-thread sink for FFmpeg's messages during one of our calls. */
static _Thread_local char *log_sink;
static _Thread_local size_t log_sink_n;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_cb(void *avcl, int level, const char *fmt, va_list vl)
{
	if (level > AV_LOG_ERROR || !log_sink || log_sink[0])
		return; /* keep the first error only; drop everything else */
	int prefix = 0; /* no "[mov,mp4 @ 0x55d7...]": addresses make output differ per run */
	av_log_format_line(avcl, level, fmt, vl, log_sink, (int)log_sink_n, &prefix);
	size_t l = strlen(log_sink);
	while (l && (log_sink[l - 1] == '\n' || log_sink[l - 1] == '\r' || log_sink[l - 1] == ' '))
		log_sink[--l] = 0;
}

static void log_init(void)
{
	av_log_set_level(AV_LOG_ERROR);
	av_log_set_callback(log_cb);
}

typedef struct vid {
	AVFormatContext *fmt;
	AVCodecContext *dec;
	int si;          /* stream index */
	AVRational tb;
	int64_t start;   /* stream start time in tb, or 0 */
	double rate;     /* average frames per second, 0 if unknown */
	char log[256];
} vid;

static int av_fail(vid *v, mcv_error *err, int code, const char *what, int averr)
{
	char s[AV_ERROR_MAX_STRING_SIZE] = "";
	if (averr)
		av_strerror(averr, s, sizeof s);
	if (v->log[0])
		mcv_error_set(err, code, "%s: %s (%s)", what, s[0] ? s : "error", v->log);
	else
		mcv_error_set(err, code, "%s: %s", what, s[0] ? s : "error");
	return mcv__one_line(err, code);
}

static void vid_close(vid *v)
{
	avcodec_free_context(&v->dec);
	avformat_close_input(&v->fmt);
}

static int vid_open(vid *v, const char *path, const mcv_media_limits *lim, int decoder,
		    mcv_error *err)
{
	int r = avformat_open_input(&v->fmt, path, NULL, NULL);
	if (r < 0)
		return av_fail(v, err, r == AVERROR(ENOENT) || r == AVERROR(EACCES) ? MCV_EIO : MCV_EFORMAT,
			       "cannot open video", r);
	if ((r = avformat_find_stream_info(v->fmt, NULL)) < 0) {
		av_fail(v, err, MCV_EFORMAT, "cannot read video", r);
		vid_close(v);
		return err ? err->code : MCV_EFORMAT;
	}
	const AVCodec *codec = NULL;
	v->si = av_find_best_stream(v->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
	if (v->si < 0) {
		int rc = mcv_error_set(err, MCV_EFORMAT, v->si == AVERROR_DECODER_NOT_FOUND
				       ? "no decoder for the video stream" : "no video stream");
		vid_close(v);
		return rc;
	}
	AVStream *st = v->fmt->streams[v->si];
	v->tb = st->time_base;
	v->start = st->start_time == AV_NOPTS_VALUE ? 0 : st->start_time;
	v->rate = st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0 ? av_q2d(st->avg_frame_rate) : 0;
	int rc = mcv__check_pixels((uint64_t)(st->codecpar->width > 0 ? st->codecpar->width : 1),
				   (uint64_t)(st->codecpar->height > 0 ? st->codecpar->height : 1),
				   lim, err);
	if (rc) {
		vid_close(v);
		return rc;
	}
	if (!decoder)
		return 0;
	v->dec = avcodec_alloc_context3(codec);
	if (!v->dec) {
		vid_close(v);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for a video decoder");
	}
	if ((r = avcodec_parameters_to_context(v->dec, st->codecpar)) < 0 ||
	    (v->dec->thread_count = 1, (r = avcodec_open2(v->dec, codec, NULL)) < 0)) {
		av_fail(v, err, MCV_EFORMAT, "cannot open the video decoder", r);
		vid_close(v);
		return err ? err->code : MCV_EFORMAT;
	}
	return 0;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* Pass 1: the presentation times of all frames, sorted (= output order),
 * and those of the key frames (where decoding may start after a seek).
 * *exact is 1 when every frame has a real pts, so that frames can be told
 * apart by timestamp after a seek. */
typedef struct scan {
	int64_t *ts, n;   /* frame pts, sorted */
	int64_t *kf, nkf; /* key frame pts, sorted */
	int exact;
} scan;

static int push(int64_t **a, int64_t *n, int64_t v)
{
	if (*n && !(*n & (*n - 1)) && *n >= 1024) { /* grow at powers of two */
		int64_t *na = realloc(*a, sizeof **a * (size_t)*n * 2);
		if (!na)
			return -1;
		*a = na;
	} else if (!*a) {
		if (!(*a = malloc(sizeof **a * 1024)))
			return -1;
	}
	(*a)[(*n)++] = v;
	return 0;
}

static int scan_times(vid *v, scan *s, mcv_error *err)
{
	memset(s, 0, sizeof *s);
	s->exact = 1;
	AVPacket *pkt = av_packet_alloc();
	if (!pkt)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory scanning video");
	int r, rc = 0;
	while ((r = av_read_frame(v->fmt, pkt)) >= 0) {
		/* Packets the demuxer marks discardable (cut by an edit list)
		 * never become frames: counting them would shift every index. */
		if (pkt->stream_index == v->si && !(pkt->flags & AV_PKT_FLAG_DISCARD)) {
			if (s->n == MAX_PACKETS) {
				rc = mcv_error_set(err, MCV_ENOMEM, "video has over %d frames", MAX_PACKETS);
				break;
			}
			int64_t t = pkt->pts;
			if (t == AV_NOPTS_VALUE) {
				s->exact = 0;
				t = pkt->dts; /* NOPTS (INT64_MIN) sorts first; frame_sec copes */
			}
			if (push(&s->ts, &s->n, t) ||
			    ((pkt->flags & AV_PKT_FLAG_KEY) && t != AV_NOPTS_VALUE && push(&s->kf, &s->nkf, t))) {
				rc = mcv_error_set(err, MCV_ENOMEM, "out of memory scanning video");
				break;
			}
		}
		av_packet_unref(pkt);
	}
	av_packet_unref(pkt);
	av_packet_free(&pkt);
	if (!rc && r != AVERROR_EOF && s->n == 0)
		rc = av_fail(v, err, MCV_EFORMAT, "cannot read video", r);
	if (rc) {
		free(s->ts);
		free(s->kf);
		memset(s, 0, sizeof *s);
		return rc;
	}
	if (s->n)
		qsort(s->ts, (size_t)s->n, sizeof *s->ts, cmp_i64);
	if (s->nkf)
		qsort(s->kf, (size_t)s->nkf, sizeof *s->kf, cmp_i64);
	for (int64_t i = 1; i < s->n && s->exact; i++)
		if (s->ts[i] == s->ts[i - 1])
			s->exact = 0; /* duplicate times: only counting tells frames apart */
	return 0;
}

static double frame_sec(const vid *v, const int64_t *ts, int64_t i, double fps)
{
	if (ts[i] == AV_NOPTS_VALUE)
		return fps > 0 ? i / fps : 0;
	return (double)(ts[i] - v->start) * av_q2d(v->tb);
}

/* The chosen frame numbers (ascending, unique) into sel; returns count. */
static int choose(const vid *v, const int64_t *ts, int64_t total, const mcv_video_opts *o,
		  int max_frames, int64_t *sel)
{
	int want = o->n_frames > 0 ? o->n_frames : 0;
	if (o->n_frames <= 0 && o->fps > 0) {
		double nat = v->rate;
		int n = 0;
		int64_t i = 0;
		for (int64_t k = 0; i < total; k++) {
			double target = k / o->fps;
			while (i < total && frame_sec(v, ts, i, nat) < target - 1e-9)
				i++;
			if (i >= total)
				break;
			if (n == max_frames) {
				n = -1; /* too many: uniform fallback */
				break;
			}
			if (n == 0 || sel[n - 1] != i)
				sel[n++] = i;
			if (k > (int64_t)1 << 40)
				break;
		}
		if (n >= 0)
			return n;
		want = max_frames;
	}
	if (want <= 0 || want > max_frames)
		want = max_frames;
	if (want > total)
		want = (int)total;
	for (int i = 0; i < want; i++)
		sel[i] = (int64_t)((i + 0.5) * (double)total / want);
	return want;
}

/* Pass 2's decoder loop: the next frame in presentation order into fr.
 * 0, AVERROR_EOF at the end, or another AVERROR for a damaged frame (the
 * caller goes on). */
static int next_frame(vid *v, AVPacket *pkt, AVFrame *fr, int *eof)
{
	for (;;) {
		int r = avcodec_receive_frame(v->dec, fr);
		if (r != AVERROR(EAGAIN))
			return r;
		if (*eof)
			return AVERROR_EOF;
		r = av_read_frame(v->fmt, pkt);
		if (r < 0) {
			*eof = 1;
			avcodec_send_packet(v->dec, NULL); /* drain what is buffered */
			continue;
		}
		if (pkt->stream_index == v->si)
			r = avcodec_send_packet(v->dec, pkt);
		av_packet_unref(pkt);
		if (r < 0 && r != AVERROR(EAGAIN))
			return r; /* a damaged packet: its frame is lost */
	}
}

/* The last key frame at or before pts t (binary search), or INT64_MIN. */
static int64_t key_before(const scan *s, int64_t t)
{
	int64_t lo = 0, hi = s->nkf;
	while (lo < hi) {
		int64_t mid = lo + (hi - lo) / 2;
		if (s->kf[mid] <= t)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? s->kf[lo - 1] : INT64_MIN;
}

int mcv_video_frames(const char *path, const mcv_video_opts *opt, const mcv_media_limits *lim,
		     mcv_video_frame_fn fn, void *ctx, mcv_error *err)
{
	mcv_video_opts o = {0};
	if (opt)
		o = *opt;
	if (o.n_frames < 0 || o.fps < 0 || !isfinite(o.fps) || !fn || !path)
		return mcv_error_set(err, MCV_EINVAL, "bad video options");
	if (!strcmp(path, "-"))
		return mcv_error_set(err, MCV_EINVAL, "video cannot be read from stdin (it is read twice)");
	mcv_media_limits l = mcv_media_limits_resolve(lim);
	int lr = av_ready(err);
	if (lr)
		return lr;
	pthread_once(&log_once, log_init);

	vid v = {0};
	log_sink = v.log;
	log_sink_n = sizeof v.log;
	scan s = {0};
	int64_t *sel = NULL;
	AVPacket *pkt = NULL;
	AVFrame *fr = NULL;
	struct SwsContext *sws = NULL;
	int rc = vid_open(&v, path, &l, 0, err);
	if (rc)
		goto out;
	rc = scan_times(&v, &s, err);
	vid_close(&v);
	if (rc)
		goto out;
	if (s.n == 0) {
		rc = mcv_error_set(err, MCV_EFORMAT, "video has no frames");
		goto out;
	}
	sel = malloc(sizeof *sel * ((size_t)l.max_frames + 1));
	if (!sel) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
		goto out;
	}
	int nsel = choose(&v, s.ts, s.n, &o, (int)l.max_frames, sel);

	/* Pass 2.  With exact timestamps, jump (seek) to the key frame before
	 * each chosen frame when that skips decoding, and recognise the frame
	 * by its pts; otherwise decode everything and count. */
	memset(&v, 0, sizeof v);
	log_sink = v.log;
	if ((rc = vid_open(&v, path, &l, 1, err)))
		goto out;
	pkt = av_packet_alloc();
	fr = av_frame_alloc();
	if (!pkt || !fr) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
		goto out;
	}
	int64_t di = 0;          /* frames decoded so far (counting mode) */
	int64_t last = INT64_MIN; /* pts of the last frame received (seek mode) */
	int emitted = 0, eof = 0, bad = 0, r = 0;
	for (int k = 0; k < nsel; k++) { /* ends early when next_frame says AVERROR_EOF */
		int64_t want = s.ts[sel[k]];
		if (s.exact) {
			int64_t key = key_before(&s, want);
			if (key != INT64_MIN && key > last &&
			    av_seek_frame(v.fmt, v.si, key, AVSEEK_FLAG_BACKWARD) >= 0) {
				avcodec_flush_buffers(v.dec);
				eof = 0;
			}
		}
		for (;;) {
			r = next_frame(&v, pkt, fr, &eof);
			if (r == AVERROR_EOF)
				break;
			if (r < 0) {
				bad++;
				continue;
			}
			int hit;
			if (s.exact) {
				int64_t pts = fr->pts != AV_NOPTS_VALUE ? fr->pts : fr->best_effort_timestamp;
				last = pts;
				hit = pts != AV_NOPTS_VALUE && pts >= want;
			} else {
				hit = di++ == sel[k];
			}
			if (hit)
				break;
			av_frame_unref(fr);
		}
		if (r == AVERROR_EOF)
			break;
		/* A damaged stream may have skipped past later targets too. */
		while (s.exact && k + 1 < nsel && s.ts[sel[k + 1]] <= last)
			k++;
		rc = mcv__check_pixels((uint64_t)fr->width, (uint64_t)fr->height, &l, err);
		if (rc) {
			av_frame_unref(fr);
			goto out;
		}
		sws = sws_getCachedContext(sws, fr->width, fr->height, fr->format, fr->width,
					   fr->height, AV_PIX_FMT_RGB24, SWS_BICUBIC, NULL, NULL, NULL);
		mcv_image im;
		if (!sws) {
			av_frame_unref(fr);
			rc = mcv_error_set(err, MCV_EUNSUPPORTED, "cannot convert video pixel format %d",
					   fr->format);
			goto out;
		}
		if ((rc = mcv_image_alloc(&im, fr->width, fr->height, err))) {
			av_frame_unref(fr);
			goto out;
		}
		uint8_t *dst[4] = {im.rgb};
		int dls[4] = {im.w * 3};
		sws_scale(sws, (const uint8_t *const *)fr->data, fr->linesize, 0, fr->height, dst, dls);
		int64_t pts = fr->best_effort_timestamp;
		double t = pts == AV_NOPTS_VALUE ? frame_sec(&v, s.ts, sel[k], v.rate)
						 : (double)(pts - v.start) * av_q2d(v.tb);
		av_frame_unref(fr);
		emitted++;
		/* The callback runs our caller's code; its return value is final. */
		log_sink = NULL;
		int cr = fn(ctx, &im, t, sel[k]);
		log_sink = v.log;
		mcv_image_free(&im);
		if (cr) {
			rc = cr;
			goto out;
		}
	}
	if (!emitted)
		rc = bad ? av_fail(&v, err, MCV_EFORMAT, "cannot decode video", r < 0 && r != AVERROR_EOF ? r : AVERROR_INVALIDDATA)
			 : mcv_error_set(err, MCV_EFORMAT, "no video frame could be decoded");
out:
	sws_freeContext(sws);
	av_frame_free(&fr);
	av_packet_free(&pkt);
	vid_close(&v);
	free(s.ts);
	free(s.kf);
	free(sel);
	log_sink = NULL;
	return rc;
}

/* ---------------------------------------------------------------- array form */

typedef struct collect {
	mcv_video *v;
	int cap;
	mcv_error *err;
} collect;

static int collect_fn(void *ctx, mcv_image *frame, double t, int64_t index)
{
	collect *c = ctx;
	mcv_video *v = c->v;
	if (v->n == c->cap) {
		int nc = c->cap ? c->cap * 2 : 16;
		mcv_image *f = realloc(v->frames, sizeof *f * nc);
		if (f)
			v->frames = f;
		double *tt = realloc(v->t, sizeof *tt * nc);
		if (tt)
			v->t = tt;
		int64_t *ix = realloc(v->index, sizeof *ix * nc);
		if (ix)
			v->index = ix;
		if (!f || !tt || !ix)
			return mcv_error_set(c->err, MCV_ENOMEM, "out of memory collecting frames");
		c->cap = nc;
	}
	v->frames[v->n] = *frame;
	frame->rgb = NULL; /* taken */
	v->t[v->n] = t;
	v->index[v->n] = index;
	v->n++;
	return 0;
}

int mcv_video_decode(const char *path, const mcv_video_opts *opt, const mcv_media_limits *lim,
		     mcv_video *out, mcv_error *err)
{
	memset(out, 0, sizeof *out);
	collect c = {.v = out, .err = err};
	int rc = mcv_video_frames(path, opt, lim, collect_fn, &c, err);
	if (rc) {
		mcv_video_free(out);
		return rc;
	}
	if (out->n)
		out->duration = out->t[out->n - 1];
	return 0;
}

void mcv_video_free(mcv_video *v)
{
	if (!v)
		return;
	for (int i = 0; i < v->n; i++)
		mcv_image_free(&v->frames[i]);
	free(v->frames);
	free(v->t);
	free(v->index);
	memset(v, 0, sizeof *v);
}

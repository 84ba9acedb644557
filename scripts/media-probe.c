/* media-probe: decode images, archives and videos with libmcv's media layer
 * and print one JSON line per image, frame or archive member; the media
 * tests (test/media.bats) drive it, and it shows the batch front end how to
 * use lib/media.h.  Not installed.
 *
 *   media-probe [options] FILE...        images ("-" = stdin)
 *   media-probe [options] --archive A    members of archive A ("-" = stdin)
 *   media-probe [options] --video V      sampled frames of video V
 * options: --max-pixels N  --max-bytes N  --frames N  --fps F
 *
 * Lines: {"source":..., ["member":...,] ["frame":i, "t":s,] "w":..,"h":..,
 * "kind":.., "sum":"<fnv1a of the RGB bytes>", "center":[r,g,b]} or
 * {"source":..., ["member":...,] "error":"..."}.  Exit 0 when every input
 * (member, video) decoded, 1 when any gave an error line, 2 on usage. */
#include "media.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", stdout);
		else if (*p == '\t')
			fputs("\\t", stdout);
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static void head(const char *src, const char *member)
{
	fputs("{\"source\":", stdout);
	json_str(src);
	if (member) {
		fputs(",\"member\":", stdout);
		json_str(member);
	}
}

static void print_image(const mcv_image *im, const char *kind)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < (size_t)im->w * im->h * 3; i++)
		h = (h ^ im->rgb[i]) * 1099511628211ull;
	const uint8_t *c = im->rgb + ((size_t)(im->h / 2) * im->w + im->w / 2) * 3;
	printf(",\"w\":%d,\"h\":%d,\"kind\":\"%s\",\"sum\":\"%016llx\",\"center\":[%d,%d,%d]}\n", im->w,
	       im->h, kind, (unsigned long long)h, c[0], c[1], c[2]);
}

static void print_error(const char *msg)
{
	fputs(",\"error\":", stdout);
	json_str(msg);
	fputs("}\n", stdout);
}

typedef struct vctx { const char *src; } vctx;

static int on_frame(void *ctx, mcv_image *f, double t, int64_t index)
{
	vctx *v = ctx;
	head(v->src, NULL);
	printf(",\"frame\":%lld,\"t\":%.3f", (long long)index, t);
	print_image(f, "frame");
	return 0;
}

static int usage(void)
{
	fputs("usage: media-probe [--max-pixels N] [--max-bytes N] [--frames N] [--fps F]\n"
	      "                   (FILE... | --archive A | --video V)\n", stderr);
	return 2;
}

int main(int argc, char **argv)
{
	mcv_media_limits lim = {0};
	mcv_video_opts vo = {0};
	const char *archive = NULL, *video = NULL;
	mcv_error err = {0};
	int i = 1, failed = 0;
	for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
		const char *o = argv[i];
		if (!strcmp(o, "--")) {
			i++;
			break;
		}
		if (i + 1 >= argc)
			return usage();
		const char *v = argv[++i];
		uint64_t n;
		if (!strcmp(o, "--archive")) {
			archive = v;
		} else if (!strcmp(o, "--video")) {
			video = v;
		} else if (!strcmp(o, "--fps")) {
			char *end;
			vo.fps = strtod(v, &end);
			if (*end || !(vo.fps > 0))
				return usage();
		} else if (mcv_media_parse_count(v, &n, &err)) {
			fprintf(stderr, "media-probe: %s: %s\n", o, err.msg);
			return 2;
		} else if (!strcmp(o, "--max-pixels")) {
			lim.max_pixels = n;
		} else if (!strcmp(o, "--max-bytes")) {
			lim.max_bytes = n;
		} else if (!strcmp(o, "--frames")) {
			if (n > 100000)
				return usage();
			vo.n_frames = (int)n;
			lim.max_frames = (uint32_t)n > lim.max_frames ? (uint32_t)n : lim.max_frames;
		} else {
			return usage();
		}
	}
	if (!archive && !video && i >= argc)
		return usage();

	if (archive) {
		mcv_archive *a;
		if (mcv_archive_open(&a, archive, &lim, &err)) {
			head(archive, NULL);
			print_error(err.msg);
			return 1;
		}
		mcv_archive_member m;
		int rc;
		while ((rc = mcv_archive_next(a, &m, &err)) == 1) {
			head(archive, m.name);
			mcv_image im;
			if (m.status != MCV_MEMBER_IMAGE) {
				print_error(m.err.msg);
				failed = 1;
			} else if (mcv_archive_member_decode(a, &m, &im, &err)) {
				print_error(err.msg);
				failed = 1;
			} else {
				print_image(&im, mcv_media_kind_name(m.kind));
				mcv_image_free(&im);
			}
		}
		if (rc < 0) {
			head(archive, NULL);
			print_error(err.msg);
			failed = 1;
		}
		mcv_archive_close(a);
	}
	if (video) {
		vctx v = {video};
		if (mcv_video_frames(video, &vo, &lim, on_frame, &v, &err)) {
			head(video, NULL);
			print_error(err.msg);
			failed = 1;
		}
	}
	for (; i < argc; i++) {
		mcv_image im;
		head(argv[i], NULL);
		if (mcv_image_load(argv[i], &lim, &im, &err)) {
			print_error(err.msg);
			failed = 1;
			continue;
		}
		print_image(&im, "image");
		mcv_image_free(&im);
	}
	return failed;
}

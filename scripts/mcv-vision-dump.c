/* mcv-vision-dump: the vision tower's output for parity tests against the
 * PyTorch reference (scripts/ref/dump_vision.py) and for timing.
 *
 *   mcv-vision-dump MMPROJ IMAGE [--compress 4|16] [--max-slices N] [--upscale F] [--exact]
 *                   [-t THREADS] [--out FILE] [--time N]
 *     prints the slicing plan as one JSON line; --out writes the visual
 *     embeddings of every crop (overview first, then the slices row-major)
 *     as raw little-endian float32; --time encodes N times and adds the
 *     fastest milliseconds per image.
 *   mcv-vision-dump MMPROJ IMAGE --model TEXT.gguf -p PROMPT [-n N] [...]
 *     end to end: the chat prompt with the image block (mcv_mm_eval_image)
 *     evaluated, then N greedy tokens; prints {"ids":[...]}.
 *     Several media in one prompt, as mcv-run lays them out: IMAGE (a
 *     picture, or a video: its frames) then each --image FILE (a still) and
 *     --video FILE (--frames N frames, default 8, evenly spread) in
 *     command-line order.  Frames are overview only, without an id; with
 *     two or more stills each still gets "<image_id>k</image_id>".
 *     --frames-out PREFIX writes every frame as PREFIX-K.ppm (K from 0, in
 *     prompt order) so the reference sees the same decoded pixels.
 *     --logits FILE writes the logits after the prompt (float32), for a
 *     closer check than greedy agreement. */
#include "media.h"
#include "model.h"
#include "multimodal.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int die(const mcv_error *e)
{
	fprintf(stderr, "mcv-vision-dump: %s\n", e->msg);
	return 1;
}

static int eval_str(mcv_ctx *ctx, const mcv_tokenizer *tok, const char *s, int *pos, mcv_error *err)
{
	int32_t *ids = NULL;
	int n = 0, cap = 0;
	int rc = mcv_tokenizer_encode(tok, s, strlen(s), true, &ids, &n, &cap, err);
	if (rc == 0 && n > 0)
		rc = mcv_mm_eval_text(ctx, ids, n, pos, err);
	free(ids);
	return rc;
}

/* One still or video frame of the prompt, in order. */
typedef struct media_list {
	int n, cap;
	mcv_image *img;
	int *frame;
} media_list;

static int media_push(media_list *l, mcv_image *im, int frame)
{
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 8;
		mcv_image *a = realloc(l->img, sizeof *a * (size_t)cap);
		if (a)
			l->img = a;
		int *f = realloc(l->frame, sizeof *f * (size_t)cap);
		if (f)
			l->frame = f;
		if (!a || !f)
			return -1;
		l->cap = cap;
	}
	l->img[l->n] = *im;
	l->frame[l->n++] = frame;
	*im = (mcv_image){ 0 };
	return 0;
}

static int is_video(const char *path)
{
	unsigned char b[16];
	FILE *f = fopen(path, "rb");
	if (!f)
		return 0;
	size_t n = fread(b, 1, sizeof b, f);
	fclose(f);
	return mcv_media_sniff(b, n) == MCV_MEDIA_VIDEO;
}

/* A still (frame = 0) or every sampled frame of a video (frame = 1). */
static int media_add(media_list *l, const char *path, int frame, int n_frames, mcv_error *err)
{
	if (!frame) {
		mcv_image im = { 0 };
		int rc = mcv_image_load(path, NULL, &im, err);
		if (rc == 0 && media_push(l, &im, 0))
			rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
		mcv_image_free(&im);
		return rc;
	}
	mcv_video_opts vo = { .n_frames = n_frames };
	mcv_video v = { 0 };
	int rc = mcv_video_decode(path, &vo, NULL, &v, err);
	for (int k = 0; k < v.n && rc == 0; k++)
		if (media_push(l, &v.frames[k], 1))
			rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
	mcv_video_free(&v);
	return rc;
}

static int write_ppm(const char *path, const mcv_image *im)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	fprintf(f, "P6\n%d %d\n255\n", im->w, im->h);
	const size_t n = (size_t)im->w * im->h * 3;
	const int bad = fwrite(im->rgb, 1, n, f) != n;
	return fclose(f) || bad ? -1 : 0;
}

static int argmax(const float *x, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: mcv-vision-dump MMPROJ IMAGE [--compress 4|16] [--max-slices N] [--upscale F] [--exact] "
				"[-t N] [--out FILE] [--time N] [--model TEXT.gguf -p PROMPT [-n N] [--image F] [--video F] "
				"[--frames N] [--frames-out PREFIX] [--logits FILE]]\n");
		return 2;
	}
	mcv_vision_params vp = mcv_vision_default_params();
	const char *out = NULL, *model = NULL, *prompt = "", *frames_out = NULL, *logits_out = NULL;
	int threads = 0, reps = 0, n_gen = 8, n_frames = 8;
	/* --image / --video in order: argv indices, video flagged negative */
	int *more = calloc((size_t)argc, sizeof *more), n_more = 0;
	for (int i = 3; i < argc; i++) {
		const char *a = argv[i];
		const char *nx = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--exact"))
			vp.exact = 1;
		else if (nx && !strcmp(a, "--compress"))
			vp.compress = atoi(argv[++i]);
		else if (nx && !strcmp(a, "--max-slices"))
			vp.max_slices = atoi(argv[++i]);
		else if (nx && !strcmp(a, "--upscale"))
			vp.upscale = atof(argv[++i]);
		else if (nx && !strcmp(a, "-t"))
			threads = atoi(argv[++i]);
		else if (nx && !strcmp(a, "--out"))
			out = argv[++i];
		else if (nx && !strcmp(a, "--time"))
			reps = atoi(argv[++i]);
		else if (nx && !strcmp(a, "--model"))
			model = argv[++i];
		else if (nx && !strcmp(a, "-p"))
			prompt = argv[++i];
		else if (nx && !strcmp(a, "-n"))
			n_gen = atoi(argv[++i]);
		else if (nx && !strcmp(a, "--image"))
			more[n_more++] = ++i;
		else if (nx && !strcmp(a, "--video"))
			more[n_more++] = -++i;
		else if (nx && !strcmp(a, "--frames"))
			n_frames = atoi(argv[++i]);
		else if (nx && !strcmp(a, "--frames-out"))
			frames_out = argv[++i];
		else if (nx && !strcmp(a, "--logits"))
			logits_out = argv[++i];
		else {
			fprintf(stderr, "mcv-vision-dump: bad option '%s'\n", a);
			return 2;
		}
	}
	if (threads > 0)
		omp_set_num_threads(threads);
	mcv_error err = {0};
	mcv_vision *v;
	if (mcv_vision_load(&v, argv[1], &err))
		return die(&err);
	if (n_more && !model) {
		fprintf(stderr, "mcv-vision-dump: --image and --video need --model\n");
		return 2;
	}
	mcv_image img = {0};
	media_list media = { 0 };
	if (model) {
		if (media_add(&media, argv[2], is_video(argv[2]), n_frames, &err))
			return die(&err);
		for (int j = 0; j < n_more; j++)
			if (media_add(&media, argv[more[j] < 0 ? -more[j] : more[j]], more[j] < 0, n_frames, &err))
				return die(&err);
		int k = 0;
		for (int j = 0; j < media.n && frames_out; j++) {
			if (!media.frame[j])
				continue;
			char fn[4096];
			snprintf(fn, sizeof fn, "%s-%d.ppm", frames_out, k++);
			if (write_ppm(fn, &media.img[j])) {
				fprintf(stderr, "mcv-vision-dump: cannot write '%s'\n", fn);
				return 1;
			}
		}
	} else if (mcv_image_load(argv[2], NULL, &img, &err)) {
		return die(&err);
	}
	free(more);

	if (model) {
		mcv_model_params mp = mcv_model_default_params();
		mp.n_threads = threads;
		mcv_model *m;
		mcv_ctx *ctx;
		mcv_tokenizer *tok;
		if (mcv_model_load(&m, model, &mp, &err) || mcv_tokenizer_load(&tok, mcv_model_gguf(m), &err))
			return die(&err);
		mcv_ctx_params cp = mcv_ctx_default_params();
		cp.n_ctx = 4096;
		if (mcv_ctx_init(&ctx, m, &cp, &err))
			return die(&err);
		int pos = mcv_ctx_pos(ctx), used = 0;
		char *tail = malloc(strlen(prompt) + 128);
		sprintf(tail, "%s<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", prompt);
		int n_still = 0;
		for (int j = 0; j < media.n; j++)
			n_still += !media.frame[j];
		if (eval_str(ctx, tok, "<|im_start|>user\n", &pos, &err))
			return die(&err);
		for (int j = 0, id = 0; j < media.n; j++) {
			/* mcv-run's run_prompt: frames overview only and no id; ids
			 * only when several stills share the prompt */
			mcv_vision_params mp2 = vp;
			int image_id = -1, nt = 0;
			if (media.frame[j])
				mp2.no_slices = 1;
			else if (n_still > 1)
				image_id = id++;
			if (mcv_mm_eval_image(ctx, tok, v, &media.img[j], &mp2, image_id, &pos, &nt, &err))
				return die(&err);
			used += nt;
		}
		if (eval_str(ctx, tok, tail, &pos, &err))
			return die(&err);
		if (logits_out) {
			const size_t nv = (size_t)mcv_model_n_vocab(m);
			FILE *f = fopen(logits_out, "wb");
			if (!f || fwrite(mcv_ctx_logits(ctx), sizeof(float), nv, f) != nv || fclose(f)) {
				fprintf(stderr, "mcv-vision-dump: cannot write '%s'\n", logits_out);
				return 1;
			}
		}
		const int32_t end = mcv_tokenizer_find(tok, "<|im_end|>");
		printf("{\"ids\":[");
		for (int i = 0; i < n_gen; i++) {
			int32_t t = argmax(mcv_ctx_logits(ctx), mcv_model_n_vocab(m));
			if (t == end)
				break;
			printf("%s%d", i ? "," : "", t);
			if (mcv_mm_eval_text(ctx, &t, 1, &pos, &err))
				return die(&err);
		}
		printf("],\"block_tokens\":%d,\"next_pos\":%d}\n", used, pos);
		free(tail);
		mcv_ctx_free(ctx);
		mcv_tokenizer_free(tok);
		mcv_model_free(m);
		for (int j = 0; j < media.n; j++)
			mcv_image_free(&media.img[j]);
		free(media.img);
		free(media.frame);
		mcv_vision_free(v);
		return 0;
	}

	mcv_vision_plan pl;
	if (mcv_vision_plan_image(v, img.w, img.h, &vp, &pl, &err))
		return die(&err);
	const int E = mcv_vision_n_embd(v);
	float *emb = malloc(sizeof(float) * (size_t)pl.n_tokens * E);
	float *chw[MCV_VISION_MAX_CROPS];
	double best = 1e30;
	for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
		const double t0 = now_ms();
		if (mcv_vision_crops_f32(v, &img, &pl, chw, &err))
			return die(&err);
		size_t off = 0;
		for (int i = 0; i < pl.n_crops; i++) {
			if (mcv_vision_encode_crop(v, chw[i], pl.crop_w[i], pl.crop_h[i], &vp, emb + off, &err))
				return die(&err);
			off += (size_t)pl.crop_nx[i] * pl.crop_ny[i] * E;
			free(chw[i]);
		}
		const double dt = now_ms() - t0;
		if (dt < best)
			best = dt;
	}
	printf("{\"image\":[%d,%d],\"compress\":%d,\"overview\":[%d,%d],\"grid\":[%d,%d],\"refined\":[%d,%d],"
	       "\"n_tokens\":%d,\"n_embd\":%d,\"crops\":[",
	       img.w, img.h, pl.compress, pl.ov_w, pl.ov_h, pl.cols, pl.rows, pl.ref_w, pl.ref_h, pl.n_tokens, E);
	for (int i = 0; i < pl.n_crops; i++)
		printf("%s[%d,%d,%d,%d]", i ? "," : "", pl.crop_w[i], pl.crop_h[i], pl.crop_nx[i], pl.crop_ny[i]);
	printf("]");
	if (reps > 0)
		printf(",\"threads\":%d,\"encode_ms\":%.2f", omp_get_max_threads(), best);
	printf("}\n");
	if (out) {
		FILE *f = fopen(out, "wb");
		if (!f || fwrite(emb, sizeof(float), (size_t)pl.n_tokens * E, f) != (size_t)pl.n_tokens * E ||
		    fclose(f)) {
			fprintf(stderr, "mcv-vision-dump: cannot write '%s'\n", out);
			return 1;
		}
	}
	free(emb);
	mcv_image_free(&img);
	mcv_vision_free(v);
	return 0;
}

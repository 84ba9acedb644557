/* mcv-vision-dump: the vision tower's output for parity tests against the
 * PyTorch reference (scripts/ref/dump_vision.py) and for timing.
 *
 *   mcv-vision-dump MMPROJ IMAGE [--compress 4|16] [--max-slices N] [--exact]
 *                   [-t THREADS] [--out FILE] [--time N]
 *     prints the slicing plan as one JSON line; --out writes the visual
 *     embeddings of every crop (overview first, then the slices row-major)
 *     as raw little-endian float32; --time encodes N times and adds the
 *     fastest milliseconds per image.
 *   mcv-vision-dump MMPROJ IMAGE --model TEXT.gguf -p PROMPT [-n N] [...]
 *     end to end: the chat prompt with the image block (mcv_mm_eval_image)
 *     evaluated, then N greedy tokens; prints {"ids":[...]}. */
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
		fprintf(stderr, "usage: mcv-vision-dump MMPROJ IMAGE [--compress 4|16] [--max-slices N] [--exact] "
				"[-t N] [--out FILE] [--time N] [--model TEXT.gguf -p PROMPT [-n N]]\n");
		return 2;
	}
	mcv_vision_params vp = mcv_vision_default_params();
	const char *out = NULL, *model = NULL, *prompt = "";
	int threads = 0, reps = 0, n_gen = 8;
	for (int i = 3; i < argc; i++) {
		const char *a = argv[i];
		const char *nx = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--exact"))
			vp.exact = 1;
		else if (nx && !strcmp(a, "--compress"))
			vp.compress = atoi(argv[++i]);
		else if (nx && !strcmp(a, "--max-slices"))
			vp.max_slices = atoi(argv[++i]);
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
	mcv_image img = {0};
	if (mcv_image_load(argv[2], NULL, &img, &err))
		return die(&err);

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
		if (eval_str(ctx, tok, "<|im_start|>user\n", &pos, &err) ||
		    mcv_mm_eval_image(ctx, tok, v, &img, &vp, -1, &pos, &used, &err) ||
		    eval_str(ctx, tok, tail, &pos, &err))
			return die(&err);
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
		mcv_image_free(&img);
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

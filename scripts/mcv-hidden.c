/* mcv-hidden: the C runtime's per-layer residual stream, first-step logits
 * and greedy continuation, for parity tests against the PyTorch reference
 * (scripts/ref/parity_c.py compares them with scripts/ref/dump.py's).
 *
 *   mcv-hidden MODEL.gguf 1,2,3 N OUTDIR [N_BATCH]
 *
 * OUTDIR gets .npy files (float32/int32, little-endian, C order):
 *   hidden.npy        [n_layer][T][n_embd]  output of every layer, prompt rows
 *   out_norm.npy      [n_embd]              final-normed last prompt row
 *   first_logits.npy  [n_vocab]             logits after the prompt
 *   tokens.npy        [N]                   greedy tokens (ties: lowest id)
 *   margins.npy       [N]                   top-1 minus top-2 logit per step
 * and stdout gets {"tokens":[...],"margins":[...]}.
 * The prompt runs as batched prefill (chunks of N_BATCH), then N-1 single
 * token steps, as mcv-run does. */
#include "model.h"
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct capture {
	int n_layer, n_prompt, n_embd;
	float *hidden;   /* [n_layer][n_prompt][n_embd] */
	float *out_norm; /* [n_embd] */
	int got_norm;
} capture;

static void on_layer(void *user, int layer, int pos, const float *h, int n_embd)
{
	capture *cp = user;
	if (pos >= cp->n_prompt || n_embd != cp->n_embd)
		return; /* decode steps: only the prompt is compared per layer */
	if (layer < cp->n_layer) {
		memcpy(cp->hidden + ((size_t)layer * cp->n_prompt + pos) * n_embd, h, sizeof(float) * (size_t)n_embd);
	} else if (pos == cp->n_prompt - 1) {
		memcpy(cp->out_norm, h, sizeof(float) * (size_t)n_embd);
		cp->got_norm = 1;
	}
}

/* NPY v1.0: magic, header length, a Python dict literal padded with spaces
 * and a newline so the data starts on a 64-byte boundary. */
static int save_npy(const char *dir, const char *name, const char *descr, const void *data,
		    size_t elsize, int ndim, const long *shape)
{
	char path[4096], shp[128] = "", hdr[256];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	size_t count = 1;
	for (int i = 0; i < ndim; i++) {
		size_t l = strlen(shp);
		snprintf(shp + l, sizeof shp - l, "%ld%s", shape[i], ndim == 1 ? "," : i + 1 < ndim ? ", " : "");
		count *= (size_t)shape[i];
	}
	int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shp);
	int total = 10 + n + 1;
	int pad = (64 - total % 64) % 64;
	FILE *f = fopen(path, "wb");
	if (!f) {
		fprintf(stderr, "mcv-hidden: %s: %s\n", path, strerror(errno));
		return -1;
	}
	unsigned hl = (unsigned)(n + pad + 1);
	unsigned char pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff),
				  (unsigned char)(hl >> 8) };
	fwrite(pre, 1, 10, f);
	fwrite(hdr, 1, (size_t)n, f);
	for (int i = 0; i < pad; i++)
		fputc(' ', f);
	fputc('\n', f);
	fwrite(data, elsize, count, f);
	if (fclose(f) != 0) {
		fprintf(stderr, "mcv-hidden: %s: write failed\n", path);
		return -1;
	}
	return 0;
}

static int fail(const char *msg)
{
	fprintf(stderr, "mcv-hidden: %s\n", msg);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 5 || argc > 6) {
		fprintf(stderr, "usage: mcv-hidden MODEL.gguf TOKENS N OUTDIR [N_BATCH]\n");
		return 2;
	}
	const int n_gen = atoi(argv[3]);
	const char *dir = argv[4];
	int32_t *toks;
	int n = 0;
	mcv_error perr;
	if (mcv_token_ids_parse(argv[2], &toks, &n, &perr) != 0)
		return fail("TOKENS must look like 1,2,3");
	if (n_gen < 1 || n < 1)
		return fail("nothing to do");
	mcv_ctx_params cpar = mcv_ctx_default_params();
	cpar.n_ctx = n + n_gen + 1;
	if (argc > 5)
		cpar.n_batch = atoi(argv[5]);

	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		fprintf(stderr, "mcv-hidden: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	mcv_error e;
	mcv_model *m;
	mcv_ctx *c;
	if (mcv_model_load(&m, argv[1], NULL, &e) < 0 || mcv_ctx_init(&c, m, &cpar, &e) < 0)
		return fail(e.msg);
	const int V = mcv_model_n_vocab(m), H = mcv_model_n_embd(m), L = mcv_model_n_layer(m);
	capture cp = { .n_layer = L, .n_prompt = n, .n_embd = H };
	cp.hidden = calloc((size_t)L * n * H, sizeof(float));
	cp.out_norm = calloc((size_t)H, sizeof(float));
	float *first = malloc(sizeof(float) * (size_t)V);
	int32_t *out = calloc((size_t)n_gen, sizeof *out);
	float *margin = calloc((size_t)n_gen, sizeof *margin);
	if (!cp.hidden || !cp.out_norm || !first || !out || !margin)
		return fail("out of memory");
	mcv_ctx_set_layer_hook(c, on_layer, &cp);
	if (mcv_ctx_eval(c, toks, n, &e) < 0)
		return fail(e.msg);
	if (!cp.got_norm)
		return fail("the layer hook did not report the final norm");
	memcpy(first, mcv_ctx_logits(c), sizeof(float) * (size_t)V);
	for (int i = 0; i < n_gen; i++) {
		const float *l = mcv_ctx_logits(c);
		int32_t best = 0, second = -1;
		for (int j = 1; j < V; j++) {
			if (l[j] > l[best]) {
				second = best;
				best = j;
			} else if (second < 0 || l[j] > l[second]) {
				second = j;
			}
		}
		out[i] = best;
		margin[i] = second < 0 ? 0.0f : l[best] - l[second];
		if (i + 1 < n_gen && mcv_ctx_eval(c, &best, 1, &e) < 0)
			return fail(e.msg);
	}
	long sh3[3] = { L, n, H }, sh1[1];
	int rc = save_npy(dir, "hidden.npy", "<f4", cp.hidden, 4, 3, sh3);
	sh1[0] = H;
	rc |= save_npy(dir, "out_norm.npy", "<f4", cp.out_norm, 4, 1, sh1);
	sh1[0] = V;
	rc |= save_npy(dir, "first_logits.npy", "<f4", first, 4, 1, sh1);
	sh1[0] = n_gen;
	rc |= save_npy(dir, "tokens.npy", "<i4", out, 4, 1, sh1);
	rc |= save_npy(dir, "margins.npy", "<f4", margin, 4, 1, sh1);
	if (rc)
		return 1;
	printf("{\"tokens\":[");
	for (int i = 0; i < n_gen; i++)
		printf(i ? ",%d" : "%d", out[i]);
	printf("],\"margins\":[");
	for (int i = 0; i < n_gen; i++)
		printf(i ? ",%.6g" : "%.6g", margin[i]);
	printf("]}\n");
	free(margin);
	free(out);
	free(first);
	free(cp.hidden);
	free(cp.out_norm);
	free(toks);
	mcv_ctx_free(c);
	mcv_model_free(m);
	return 0;
}

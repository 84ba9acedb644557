/* mcv-logits: greedy tokens and first-step logits of a model, as one JSON
 * object, for parity tests against llama.cpp (scripts/peer/run.mjs prints
 * the same fields).
 *
 *   mcv-logits MODEL.gguf 1,2,3 [N [N_BATCH]]
 *     -> {"tokens":[..N greedy ids..],"first_logits":[..n_vocab..]}
 *
 * The prompt is evaluated as one batched prefill, then N-1 single-token
 * steps follow; argmax ties go to the lowest id. */
#include "model.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *msg)
{
	fprintf(stderr, "mcv-logits: %s\n", msg);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 3 || argc > 5) {
		fprintf(stderr, "usage: mcv-logits MODEL.gguf TOKENS [N [N_BATCH]]\n");
		return 2;
	}
	int n_gen = argc > 3 ? atoi(argv[3]) : 1;
	mcv_ctx_params cp = mcv_ctx_default_params();
	if (argc > 4)
		cp.n_batch = atoi(argv[4]);
	int32_t *toks;
	int n = 0;
	mcv_error perr;
	if (mcv_token_ids_parse(argv[2], &toks, &n, &perr) != 0)
		return fail("TOKENS must look like 1,2,3");
	if (n_gen < 1 || n < 1)
		return fail("nothing to do");
	cp.n_ctx = n + n_gen + 1;

	mcv_error e;
	mcv_model *m;
	mcv_ctx *c;
	if (mcv_model_load(&m, argv[1], NULL, &e) < 0 || mcv_ctx_init(&c, m, &cp, &e) < 0)
		return fail(e.msg);
	const int V = mcv_model_n_vocab(m);
	if (mcv_ctx_eval(c, toks, n, &e) < 0)
		return fail(e.msg);
	float *first = malloc(sizeof(float) * (size_t)V);
	memcpy(first, mcv_ctx_logits(c), sizeof(float) * (size_t)V);
	printf("{\"tokens\":[");
	for (int i = 0; i < n_gen; i++) {
		const float *l = mcv_ctx_logits(c);
		int32_t best = 0;
		for (int j = 1; j < V; j++)
			if (l[j] > l[best])
				best = j;
		printf(i ? ",%d" : "%d", best);
		if (i + 1 < n_gen && mcv_ctx_eval(c, &best, 1, &e) < 0)
			return fail(e.msg);
	}
	printf("],\"first_logits\":[");
	for (int j = 0; j < V; j++)
		printf(j ? ",%.9g" : "%.9g", first[j]);
	printf("]}\n");
	free(first);
	free(toks);
	mcv_ctx_free(c);
	mcv_model_free(m);
	return 0;
}

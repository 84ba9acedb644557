/* mcv-gentrace: write a synthetic routing trace for a qwen35moe model, for
 * tests of the trace reader and of `mcv-pack --order` before mcv-run records
 * real ones.
 *
 * Routing has planted co-selection structure: per layer the experts are
 * shuffled into groups of k; each token picks a group (a skewed choice, so
 * some groups are hot) and takes its k members, each swapped for a random
 * expert with probability 1/8.  Because the shuffle scatters a group across
 * the ids, the identity order keeps co-selected experts far apart and a good
 * ordering brings them together.
 *
 * usage: mcv-gentrace [--tokens N] [--seed S] [--hidden none|f16|f32]
 *                     [--skip-token T] MODEL OUTPUT
 * --skip-token leaves token T unrecorded (the writer must refuse that). */
#include "gguf.h"
#include "mcv.h"
#include "quant.h"
#include "trace.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;
static uint64_t rnd(void)
{
	/* splitmix64: small, seedable, good enough for synthetic data */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}
static double unif(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

int main(int argc, char **argv)
{
	long tokens = 200, skip = -1;
	uint64_t seed = 1;
	int htype = MCV_F16;
	int i = 1;
	for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
		if (i + 1 >= argc)
			goto usage;
		if (!strcmp(argv[i], "--tokens"))
			tokens = atol(argv[++i]);
		else if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--skip-token"))
			skip = atol(argv[++i]);
		else if (!strcmp(argv[i], "--hidden")) {
			const char *h = argv[++i];
			htype = !strcmp(h, "none") ? -1 : !strcmp(h, "f32") ? MCV_F32 : MCV_F16;
		} else
			goto usage;
	}
	if (argc - i != 2 || tokens < 0)
		goto usage;
	rng_state = seed;
	mcv_gguf *g;
	mcv_error err = { 0 };
	mcv_trace_model m;
	if (mcv_gguf_open(&g, argv[i], &err) || mcv_trace_model_from_gguf(&m, g, &err)) {
		fprintf(stderr, "mcv-gentrace: %s\n", err.msg);
		return 1;
	}
	mcv_gguf_close(g);
	mcv_trace_writer *w;
	if (mcv_trace_writer_open(&w, argv[i + 1], &m, htype, &err)) {
		fprintf(stderr, "mcv-gentrace: %s\n", err.msg);
		return 1;
	}
	int E = m.n_expert, k = m.n_expert_used, L = m.n_layer;
	int ng = E / k;
	int *perm = malloc((size_t)L * E * sizeof *perm);
	int32_t *ids = malloc((size_t)k * sizeof *ids);
	float *wt = malloc((size_t)k * sizeof *wt);
	float *hid = malloc((size_t)m.n_embd * sizeof *hid);
	if (!perm || !ids || !wt || !hid || ng < 1)
		return 1;
	for (int il = 0; il < L; il++) {
		int *p = perm + (size_t)il * E;
		for (int e = 0; e < E; e++)
			p[e] = e;
		for (int e = E - 1; e > 0; e--) {
			int j = (int)(rnd() % (uint64_t)(e + 1)), t = p[e];
			p[e] = p[j];
			p[j] = t;
		}
	}
	for (long t = 0; t < tokens; t++) {
		for (int il = 0; il < L; il++) {
			if (t == skip)
				continue;
			/* group g with probability ~ 1/(g+1) */
			double r = unif(), z = 0, acc = 0;
			for (int q = 0; q < ng; q++)
				z += 1.0 / (q + 1);
			int grp = ng - 1;
			for (int q = 0; q < ng; q++) {
				acc += 1.0 / (q + 1) / z;
				if (r < acc) { grp = q; break; }
			}
			const int *p = perm + (size_t)il * E + grp * k;
			float s = 0;
			for (int a = 0; a < k; a++) {
				int32_t id = p[a];
				if (rnd() % 8 == 0)
					id = (int32_t)(rnd() % (uint64_t)E);
				for (int b = 0; b < a; b++)
					if (ids[b] == id) { id = -1; break; }
				while (id < 0) {
					id = (int32_t)(rnd() % (uint64_t)E);
					for (int b = 0; b < a; b++)
						if (ids[b] == id) { id = -1; break; }
				}
				ids[a] = id;
				wt[a] = (float)(0.5 + unif());
				s += wt[a];
			}
			for (int a = 0; a < k; a++)
				wt[a] /= s;
			for (int64_t h = 0; h < m.n_embd; h++)
				hid[h] = (float)(unif() * 2 - 1);
			if (mcv_trace_writer_put(w, t, il, ids, wt, hid))
				break;
		}
	}
	int rc = mcv_trace_writer_finish(w, &err);
	if (rc)
		fprintf(stderr, "mcv-gentrace: %s\n", err.msg);
	free(perm), free(ids), free(wt), free(hid);
	return rc ? 1 : 0;
usage:
	fprintf(stderr, "usage: mcv-gentrace [--tokens N] [--seed S] [--hidden none|f16|f32] "
		"[--skip-token T] MODEL OUTPUT\n");
	return 2;
}

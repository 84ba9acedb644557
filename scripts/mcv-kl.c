/* mcv-kl: how far quantized models' next-token distributions are from a
 * reference model's, on a JSONL of prompts ({"prompt": text}, special
 * tokens parsed, or {"tokens": [ids]}), teacher-forced: every position of
 * every line is evaluated (one token at a time, so each position's logits
 * are available) and compared.
 *
 *   mcv-kl [-t N] [--max-lines N] REF.gguf DATA.jsonl MODEL.gguf...
 *     -> one TSV line per model: model, mean KL(ref || model) in nats,
 *        top-1 agreement, positions, file bytes
 *
 * Used by scripts/bench/bench-quant.sh. */
#include "json.h"
#include "model.h"
#include "tokenizer.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void die(const char *m, const char *e)
{
	fprintf(stderr, "mcv-kl: %s%s%s\n", m, e ? ": " : "", e ? e : "");
	exit(1);
}

typedef struct seq { int32_t *ids; int n; } seq;

static void log_softmax(const float *l, double *out, int n)
{
	double mx = -INFINITY, s = 0;
	for (int i = 0; i < n; i++)
		mx = l[i] > mx ? l[i] : mx;
	for (int i = 0; i < n; i++)
		s += exp(l[i] - mx);
	double ls = mx + log(s);
	for (int i = 0; i < n; i++)
		out[i] = l[i] - ls;
}

static int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* Run every sequence; cb gets each position's logits. */
typedef void (*pos_fn)(void *u, int64_t k, const float *logits, int V);
static int64_t run(const char *path, seq *s, int ns, pos_fn cb, void *u)
{
	mcv_error err;
	mcv_model *m;
	mcv_ctx *c;
	if (mcv_model_load(&m, path, NULL, &err) || mcv_ctx_init(&c, m, NULL, &err))
		die(path, err.msg);
	int V = mcv_model_n_vocab(m);
	int64_t k = 0;
	for (int i = 0; i < ns; i++) {
		mcv_ctx_reset(c);
		for (int j = 0; j + 1 < s[i].n; j++) {
			if (mcv_ctx_eval(c, &s[i].ids[j], 1, &err))
				die(path, err.msg);
			cb(u, k++, mcv_ctx_logits(c), V);
		}
	}
	mcv_ctx_free(c);
	mcv_model_free(m);
	return k;
}

typedef struct refstore { float *lp; int *top; int V; } refstore;
static void store_ref(void *u, int64_t k, const float *l, int V)
{
	refstore *r = u;
	double *tmp = malloc(V * sizeof *tmp);
	log_softmax(l, tmp, V);
	for (int i = 0; i < V; i++)
		r->lp[k * V + i] = (float)tmp[i];
	r->top[k] = argmax(l, V);
	free(tmp);
}

typedef struct cmp { const refstore *r; double kl; int64_t agree; } cmp;
static void compare(void *u, int64_t k, const float *l, int V)
{
	cmp *c = u;
	double *q = malloc(V * sizeof *q);
	log_softmax(l, q, V);
	const float *p = c->r->lp + k * V;
	double kl = 0;
	for (int i = 0; i < V; i++)
		kl += exp(p[i]) * (p[i] - q[i]);
	c->kl += kl;
	c->agree += argmax(l, V) == c->r->top[k];
	free(q);
}

int main(int argc, char **argv)
{
	int a = 1, max_lines = 1 << 30;
	while (a < argc && argv[a][0] == '-') {
		if (!strcmp(argv[a], "-t") && a + 1 < argc)
			omp_set_num_threads(atoi(argv[++a]));
		else if (!strcmp(argv[a], "--max-lines") && a + 1 < argc)
			max_lines = atoi(argv[++a]);
		else
			break;
		a++;
	}
	if (argc - a < 3) {
		fprintf(stderr, "usage: mcv-kl [-t N] [--max-lines N] REF.gguf DATA.jsonl MODEL.gguf...\n");
		return 2;
	}
	const char *ref = argv[a], *data = argv[a + 1];
	mcv_error err;
	mcv_gguf *g;
	mcv_tokenizer *tok;
	if (mcv_gguf_open(&g, ref, &err) || mcv_tokenizer_load(&tok, g, &err))
		die(ref, err.msg);
	FILE *f = fopen(data, "r");
	if (!f)
		die("cannot open", data);
	seq *s = NULL;
	int ns = 0;
	int64_t npos = 0;
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	while (ns < max_lines && (len = getline(&line, &cap, f)) > 0) {
		mcv_json *j;
		if (len < 2 || mcv_json_parse(&j, line, (size_t)len, &err))
			continue;
		seq q = { 0 };
		int qc = 0;
		const mcv_json *p = mcv_json_get(j, "prompt"), *t = mcv_json_get(j, "tokens");
		if (p && p->type == MCV_JSON_STR)
			mcv_tokenizer_encode(tok, p->str, p->len, true, &q.ids, &q.n, &qc, &err);
		else if (t && t->type == MCV_JSON_ARR) {
			q.ids = malloc((t->n + 1) * sizeof *q.ids);
			for (size_t i = 0; i < t->n; i++)
				q.ids[q.n++] = (int32_t)t->kids[i].num;
		}
		mcv_json_free(j);
		if (q.n < 2) {
			free(q.ids);
			continue;
		}
		s = realloc(s, (ns + 1) * sizeof *s);
		s[ns++] = q;
		npos += q.n - 1;
	}
	fclose(f);
	free(line);
	mcv_tokenizer_free(tok);
	mcv_gguf_close(g);
	if (!ns)
		die("no sequences in", data);
	refstore r = { 0 };
	mcv_model *m;
	if (mcv_model_load(&m, ref, NULL, &err))
		die(ref, err.msg);
	r.V = mcv_model_n_vocab(m);
	mcv_model_free(m);
	r.lp = malloc((size_t)npos * r.V * sizeof *r.lp);
	r.top = malloc((size_t)npos * sizeof *r.top);
	if (!r.lp || !r.top)
		die("out of memory", NULL);
	run(ref, s, ns, store_ref, &r);
	for (int i = a + 2; i < argc; i++) {
		cmp c = { &r, 0, 0 };
		run(argv[i], s, ns, compare, &c);
		struct stat sb;
		long long sz = stat(argv[i], &sb) ? -1 : (long long)sb.st_size;
		printf("%s\t%.6g\t%.4f\t%lld\t%lld\n", argv[i], c.kl / npos, (double)c.agree / npos,
		       (long long)npos, sz);
		fflush(stdout);
	}
	return 0;
}

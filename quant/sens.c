/* Measured sensitivity by single-tensor probes (see sens.h). */
#include "sens.h"
#include "gguf.h"
#include "json.h"
#include "quant.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct seq { int32_t *ids; int n; } seq;

struct mcv_sens {
	mcv_model *m;
	mcv_ctx *c;
	seq *s;
	int ns, V;
	int64_t npos;
	float *ref;    /* [npos][V] log-probabilities */
	double *lp;    /* [V] scratch */
};

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

/* Every position of every sequence, one token at a time: with store the
 * log-probabilities are kept, otherwise the mean KL from them is returned. */
static int pass(mcv_sens *s, int store, double *kl, mcv_error *err)
{
	int64_t k = 0;
	double sum = 0;
	for (int i = 0; i < s->ns; i++) {
		mcv_ctx_reset(s->c);
		for (int j = 0; j + 1 < s->s[i].n; j++, k++) {
			int rc = mcv_ctx_eval(s->c, &s->s[i].ids[j], 1, err);
			if (rc)
				return rc;
			log_softmax(mcv_ctx_logits(s->c), s->lp, s->V);
			float *r = s->ref + k * s->V;
			if (store) {
				for (int v = 0; v < s->V; v++)
					r[v] = (float)s->lp[v];
				continue;
			}
			double d = 0;
			/* both sides rounded to float alike: equal models give 0 */
			for (int v = 0; v < s->V; v++)
				d += exp(r[v]) * ((double)r[v] - (double)(float)s->lp[v]);
			sum += d;
		}
	}
	if (kl)
		*kl = k ? sum / k : 0;
	return 0;
}

int mcv_sens_init(mcv_sens **out, mcv_model *m, const char *jsonl, int max_lines, int max_tokens,
		  mcv_error *err)
{
	*out = NULL;
	mcv_sens *s = calloc(1, sizeof *s);
	if (!s)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	s->m = m;
	s->V = mcv_model_n_vocab(m);
	mcv_tokenizer *tok = NULL;
	FILE *f = fopen(jsonl, "r");
	int rc = 0, lineno = 0;
	if (!f) {
		mcv_sens_free(s);
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", jsonl, strerror(errno));
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	if ((rc = mcv_tokenizer_load(&tok, mcv_model_gguf(m), err)))
		goto out;
	while (s->ns < max_lines && (len = getline(&line, &cap, f)) > 0) {
		lineno++;
		mcv_json *j;
		if (strspn(line, " \t\r\n") == (size_t)len)
			continue;
		if ((rc = mcv_json_parse(&j, line, (size_t)len, err))) {
			mcv_error_prefix(err, "%s:%d", jsonl, lineno);
			goto out;
		}
		seq q = { 0 };
		int qc = 0;
		const mcv_json *p = mcv_json_get(j, "prompt"), *t = mcv_json_get(j, "tokens");
		if (p && p->type == MCV_JSON_STR) {
			rc = mcv_tokenizer_encode(tok, p->str, p->len, true, &q.ids, &q.n, &qc, err);
		} else if (t && t->type == MCV_JSON_ARR && (q.ids = malloc((t->n + 1) * sizeof *q.ids))) {
			for (size_t i = 0; i < t->n; i++) {
				double v = t->kids[i].num;
				if (t->kids[i].type != MCV_JSON_NUM || v < 0 || v >= s->V)
					rc = mcv_error_set(err, MCV_EFORMAT, "%s:%d: token %zu is not a valid id", jsonl, lineno, i);
				q.ids[q.n++] = (int32_t)v;
			}
		} else {
			rc = mcv_error_set(err, MCV_EFORMAT, "%s:%d: a line needs \"prompt\" or \"tokens\"", jsonl, lineno);
		}
		mcv_json_free(j);
		if (max_tokens > 0 && q.n > max_tokens)
			q.n = max_tokens;
		seq *ns = rc || q.n < 2 ? NULL : realloc(s->s, (s->ns + 1) * sizeof *s->s);
		if (!ns) {
			free(q.ids);
			if (rc)
				goto out;
			continue;
		}
		s->s = ns;
		s->s[s->ns++] = q;
		s->npos += q.n - 1;
	}
	if (!s->npos) {
		rc = mcv_error_set(err, MCV_EFORMAT, "%s: no sequences of two tokens or more", jsonl);
		goto out;
	}
	mcv_ctx_params cp = mcv_ctx_default_params();
	s->ref = malloc((size_t)s->npos * s->V * sizeof *s->ref);
	s->lp = malloc((size_t)s->V * sizeof *s->lp);
	if (!s->ref || !s->lp) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
		goto out;
	}
	if (!(rc = mcv_ctx_init(&s->c, m, &cp, err)))
		rc = pass(s, 1, NULL, err);
out:
	free(line);
	fclose(f);
	mcv_tokenizer_free(tok);
	if (rc)
		mcv_sens_free(s);
	else
		*out = s;
	return rc;
}

void mcv_sens_free(mcv_sens *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->ns; i++)
		free(s->s[i].ids);
	free(s->s);
	free(s->ref);
	free(s->lp);
	mcv_ctx_free(s->c);
	free(s);
}

int64_t mcv_sens_positions(const mcv_sens *s) { return s->npos; }

int mcv_sens_probe(mcv_sens *s, const char *name, int type, const float *imp, double *kl,
		   mcv_error *err)
{
	const mcv_gguf_tensor *t = mcv_gguf_find_tensor(mcv_model_gguf(s->m), name);
	if (!t)
		return mcv_error_set(err, MCV_ENOTFOUND, "%s: no such tensor", name);
	if (t->type != MCV_F32 && t->type != MCV_F16 && t->type != MCV_BF16)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "%s: probing needs F32, F16 or BF16 weights", name);
	const int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
	const size_t rb = mcv_row_bytes(t->type, ne0), qb = mcv_row_bytes(type, ne0);
	if (!qb)
		return mcv_error_set(err, MCV_EINVAL, "%s: rows of %lld do not fit the probe type", name, (long long)ne0);
	/* The mapping is private: writes stay in this process's copy. */
	const long pg = sysconf(_SC_PAGESIZE);
	char *p = (char *)t->data;
	char *a0 = (char *)((uintptr_t)p & ~(uintptr_t)(pg - 1));
	size_t alen = (size_t)(p + t->nbytes - a0);
	char *save = malloc(t->nbytes);
	if (!save)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	if (mprotect(a0, alen, PROT_READ | PROT_WRITE)) {
		free(save);
		return mcv_error_set(err, MCV_EIO, "%s: cannot make the mapping writable: %s", name, strerror(errno));
	}
	memcpy(save, p, t->nbytes);
	int oom = 0;
	#pragma omp parallel
	{
		float *x = malloc((size_t)ne0 * sizeof *x);
		void *q = malloc(qb);
		if (!x || !q)
			oom = 1;
		#pragma omp for schedule(static)
		for (int64_t r = 0; r < rows; r++) {
			if (!x || !q)
				continue;
			mcv_dequantize_row(t->type, save + r * rb, x, ne0);
			mcv_quantize_row_imatrix(type, x, q, ne0, imp ? imp + (r / t->ne[1]) * ne0 : NULL);
			mcv_dequantize_row(type, q, x, ne0);
			mcv_quantize_row_ref(t->type, x, p + r * rb, ne0);
		}
		free(x);
		free(q);
	}
	int rc = oom ? mcv_error_set(err, MCV_ENOMEM, "out of memory") : pass(s, 0, kl, err);
	memcpy(p, save, t->nbytes);
	mprotect(a0, alen, PROT_READ);
	free(save);
	return rc;
}

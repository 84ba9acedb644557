/* Importance matrices from the running model (see calib.h). */
#include "calib.h"
#include "json.h"
#include "quant.h"
#include "tokenizer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ctensor {
	const char *name;
	const char *data;     /* start of the tensor in the mapping */
	int64_t ne0, rows, n_mat; /* rows per matrix (ne[1]), matrices (ne[2]*ne[3]) */
	double *sums;         /* [n_mat][ne0], allocated on first use */
	double *counts;       /* [n_mat] */
	pthread_mutex_t mu;
} ctensor;

struct mcv_calib {
	ctensor *t;
	int n;
	int *by_ptr;          /* indices sorted by data pointer */
};

static const ctensor *sort_base;
static int cmp_ptr(const void *a, const void *b)
{
	const char *x = sort_base[*(const int *)a].data, *y = sort_base[*(const int *)b].data;
	return x < y ? -1 : x > y;
}

int mcv_calib_init(mcv_calib **out, const mcv_gguf *g, mcv_error *err)
{
	*out = NULL;
	mcv_calib *c = calloc(1, sizeof *c);
	int64_t nt = mcv_gguf_n_tensors(g);
	if (!c || !(c->t = calloc(nt ? nt : 1, sizeof *c->t)) || !(c->by_ptr = calloc(nt ? nt : 1, sizeof(int)))) {
		mcv_calib_free(c);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	for (int64_t i = 0; i < nt; i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		if (t->n_dims < 2 || t->ne[1] < 2)
			continue;
		ctensor *ct = &c->t[c->n];
		ct->name = t->name;
		ct->data = t->data;
		ct->ne0 = t->ne[0];
		ct->rows = t->ne[1];
		ct->n_mat = t->ne[2] * t->ne[3];
		pthread_mutex_init(&ct->mu, NULL);
		c->by_ptr[c->n] = c->n;
		c->n++;
	}
	sort_base = c->t;
	qsort(c->by_ptr, c->n, sizeof(int), cmp_ptr);
	*out = c;
	return 0;
}

void mcv_calib_free(mcv_calib *c)
{
	if (!c)
		return;
	for (int i = 0; c->t && i < c->n; i++) {
		free(c->t[i].sums);
		free(c->t[i].counts);
		pthread_mutex_destroy(&c->t[i].mu);
	}
	free(c->t);
	free(c->by_ptr);
	free(c);
}

static ctensor *find_ptr(mcv_calib *c, const void *p)
{
	int lo = 0, hi = c->n;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (c->t[c->by_ptr[mid]].data == (const char *)p)
			return &c->t[c->by_ptr[mid]];
		if (c->t[c->by_ptr[mid]].data < (const char *)p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

void mcv_calib_hook(void *user, const void *weights, int64_t row0, int64_t nrows,
		    const float *X, int64_t m, int64_t n)
{
	(void)nrows;
	mcv_calib *c = user;
	ctensor *t = find_ptr(c, weights);
	/* A fused projection (q|k|v, gate|up) is several products over the
	 * same input: count the input once, at the part that starts a matrix. */
	if (!t || n != t->ne0 || row0 % t->rows)
		return;
	int64_t e = row0 / t->rows;
	if (e >= t->n_mat)
		return;
	/* Squares summed outside the lock, in double: the order over rows is
	 * fixed, so results do not depend on the thread count except for the
	 * order in which experts' contributions meet, which is exact enough
	 * in double for sums of m <= batch terms. */
	double *sq = malloc((size_t)n * sizeof *sq);
	if (!sq)
		return;
	for (int64_t j = 0; j < n; j++)
		sq[j] = 0;
	for (int64_t i = 0; i < m; i++) {
		const float *x = X + i * n;
		for (int64_t j = 0; j < n; j++)
			sq[j] += (double)x[j] * x[j];
	}
	pthread_mutex_lock(&t->mu);
	if (!t->sums) {
		t->sums = calloc((size_t)(t->n_mat * t->ne0), sizeof *t->sums);
		t->counts = calloc((size_t)t->n_mat, sizeof *t->counts);
	}
	if (t->sums && t->counts) {
		double *s = t->sums + e * t->ne0;
		for (int64_t j = 0; j < n; j++)
			s[j] += sq[j];
		t->counts[e] += (double)m;
	}
	pthread_mutex_unlock(&t->mu);
	free(sq);
}

const double *mcv_calib_sums(const mcv_calib *c, const char *name, const double **counts,
			     int64_t *n, int64_t *n_mat)
{
	for (int i = 0; i < c->n; i++)
		if (!strcmp(c->t[i].name, name)) {
			if (!c->t[i].sums)
				return NULL;
			*counts = c->t[i].counts;
			*n = c->t[i].ne0;
			*n_mat = c->t[i].n_mat;
			return c->t[i].sums;
		}
	return NULL;
}

int mcv_calib_n_seen(const mcv_calib *c)
{
	int k = 0;
	for (int i = 0; i < c->n; i++)
		k += c->t[i].sums != NULL;
	return k;
}

static int read_line(FILE *f, char **buf, size_t *cap, size_t *len)
{
	ssize_t r = getline(buf, cap, f);
	if (r < 0)
		return 0;
	*len = (size_t)r;
	return 1;
}

int mcv_calib_run_jsonl(mcv_calib *c, mcv_model *m, const char *path, int max_tokens,
			int *n_prompts, int64_t *n_tokens, mcv_error *err)
{
	*n_prompts = 0;
	*n_tokens = 0;
	FILE *f = !strcmp(path, "-") ? stdin : fopen(path, "r");
	if (!f)
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", path, strerror(errno));
	mcv_tokenizer *tok = NULL;
	mcv_ctx *ctx = NULL;
	int rc = mcv_tokenizer_load(&tok, mcv_model_gguf(m), err);
	if (!rc)
		rc = mcv_ctx_init(&ctx, m, NULL, err);
	char *line = NULL;
	size_t cap = 0, len;
	int32_t *ids = NULL;
	int nid = 0, idcap = 0, lineno = 0;
	if (!rc)
		mcv_set_matmul_hook(mcv_calib_hook, c);
	while (!rc && read_line(f, &line, &cap, &len)) {
		lineno++;
		size_t k = 0;
		while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\n' || line[k] == '\r'))
			k++;
		if (k == len)
			continue;
		mcv_json *j = NULL;
		if ((rc = mcv_json_parse(&j, line, len, err))) {
			mcv_error_prefix(err, "%s:%d", path, lineno);
			break;
		}
		nid = 0;
		const mcv_json *p = mcv_json_get(j, "prompt"), *t = mcv_json_get(j, "tokens");
		if (t && t->type == MCV_JSON_ARR) {
			for (size_t i = 0; i < t->n && !rc; i++) {
				double v = t->kids[i].num;
				if (t->kids[i].type != MCV_JSON_NUM || v < 0 || v >= mcv_model_n_vocab(m) || v != (int32_t)v) {
					rc = mcv_error_set(err, MCV_EFORMAT, "%s:%d: token %zu is not a valid id", path, lineno, i);
					break;
				}
				if (nid == idcap) {
					idcap = idcap ? 2 * idcap : 256;
					int32_t *q = realloc(ids, (size_t)idcap * sizeof *ids);
					if (!q) {
						rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
						break;
					}
					ids = q;
				}
				ids[nid++] = (int32_t)v;
			}
		} else if (p && p->type == MCV_JSON_STR) {
			rc = mcv_tokenizer_encode(tok, p->str, p->len, true, &ids, &nid, &idcap, err);
		} else {
			rc = mcv_error_set(err, MCV_EFORMAT, "%s:%d: a line needs \"prompt\" (string) or \"tokens\" (array)",
					   path, lineno);
		}
		mcv_json_free(j);
		if (rc || !nid)
			continue;
		int lim = mcv_model_n_ctx_train(m);
		if (max_tokens > 0 && max_tokens < lim)
			lim = max_tokens;
		if (nid > lim)
			nid = lim;
		mcv_ctx_reset(ctx);
		if ((rc = mcv_ctx_eval(ctx, ids, nid, err)))
			break;
		(*n_prompts)++;
		*n_tokens += nid;
	}
	mcv_set_matmul_hook(NULL, NULL);
	free(line);
	free(ids);
	mcv_ctx_free(ctx);
	mcv_tokenizer_free(tok);
	if (f != stdin)
		fclose(f);
	if (!rc && !*n_prompts)
		rc = mcv_error_set(err, MCV_EFORMAT, "%s: no prompts", path);
	return rc;
}

int mcv_calib_save(const mcv_calib *c, const char *path, const char *dataset,
		   int chunk_count, mcv_error *err)
{
	mcv_gguf_writer *w;
	int rc = mcv_gguf_writer_open(&w, path, err);
	if (rc)
		return rc;
	mcv_gguf_w_str(w, "general.type", "imatrix");
	const char *ds[1] = { dataset ? dataset : "" };
	mcv_gguf_w_arr_str(w, "imatrix.datasets", ds, 1);
	mcv_gguf_w_u32(w, "imatrix.chunk_count", (uint32_t)chunk_count);
	mcv_gguf_w_u32(w, "imatrix.chunk_size", 512);
	char name[512];
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			mcv_gguf_w_begin_data(w);
		for (int i = 0; i < c->n; i++) {
			const ctensor *t = &c->t[i];
			if (!t->sums)
				continue;
			int64_t ne_s[2] = { t->ne0, t->n_mat }, ne_c[2] = { 1, t->n_mat };
			if (pass == 0) {
				snprintf(name, sizeof name, "%s.in_sum2", t->name);
				mcv_gguf_w_add_tensor(w, name, MCV_F32, 2, ne_s);
				snprintf(name, sizeof name, "%s.counts", t->name);
				mcv_gguf_w_add_tensor(w, name, MCV_F32, 2, ne_c);
				continue;
			}
			float v[1024];
			int64_t nv = t->ne0 * t->n_mat;
			for (int64_t k = 0; k < nv; k += 1024) {
				int64_t q = nv - k < 1024 ? nv - k : 1024;
				for (int64_t l = 0; l < q; l++)
					v[l] = (float)t->sums[k + l];
				mcv_gguf_w_write(w, v, (size_t)q * 4);
			}
			mcv_gguf_w_end_tensor(w);
			for (int64_t k = 0; k < t->n_mat; k += 1024) {
				int64_t q = t->n_mat - k < 1024 ? t->n_mat - k : 1024;
				for (int64_t l = 0; l < q; l++)
					v[l] = (float)t->counts[k + l];
				mcv_gguf_w_write(w, v, (size_t)q * 4);
			}
			mcv_gguf_w_end_tensor(w);
		}
	}
	return mcv_gguf_writer_finish(w, err);
}

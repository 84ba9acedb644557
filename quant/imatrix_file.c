/* Reading llama.cpp importance-matrix files (see imatrix_file.h). */
#include "imatrix_file.h"
#include "gguf.h"
#include "quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry { char *name; float *v; int64_t n; } entry;
struct mcv_imatrix { entry *e; int n, cap; };

static int add(mcv_imatrix *im, const char *name, size_t len, int64_t n, entry **out)
{
	if (im->n == im->cap) {
		int cap = im->cap ? 2 * im->cap : 64;
		entry *e = realloc(im->e, cap * sizeof *e);
		if (!e)
			return MCV_ENOMEM;
		im->e = e;
		im->cap = cap;
	}
	entry *e = &im->e[im->n];
	e->name = malloc(len + 1);
	e->v = malloc((n > 0 ? n : 1) * sizeof(float));
	if (!e->name || !e->v) {
		free(e->name);
		free(e->v);
		return MCV_ENOMEM;
	}
	memcpy(e->name, name, len);
	e->name[len] = 0;
	e->n = n;
	im->n++;
	*out = e;
	return 0;
}

void mcv_imatrix_free(mcv_imatrix *im)
{
	if (!im)
		return;
	for (int i = 0; i < im->n; i++) {
		free(im->e[i].name);
		free(im->e[i].v);
	}
	free(im->e);
	free(im);
}

int mcv_imatrix_count(const mcv_imatrix *im) { return im ? im->n : 0; }

const char *mcv_imatrix_name(const mcv_imatrix *im, int i)
{
	return im && i >= 0 && i < im->n ? im->e[i].name : NULL;
}

const float *mcv_imatrix_find(const mcv_imatrix *im, const char *name, int64_t *n)
{
	for (int i = 0; im && i < im->n; i++)
		if (!strcmp(im->e[i].name, name)) {
			*n = im->e[i].n;
			return im->e[i].v;
		}
	return NULL;
}

static int load_gguf(mcv_imatrix *im, const char *path, mcv_error *err)
{
	mcv_gguf *g;
	int rc = mcv_gguf_open(&g, path, err);
	if (rc)
		return rc;
	const char *suf = ".in_sum2";
	size_t sl = strlen(suf);
	for (int64_t i = 0; i < mcv_gguf_n_tensors(g); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		size_t len = strlen(t->name);
		if (len <= sl || strcmp(t->name + len - sl, suf))
			continue;
		char cname[MCV_GGUF_MAX_NAME + 16];
		snprintf(cname, sizeof cname, "%.*s.counts", (int)(len - sl), t->name);
		const mcv_gguf_tensor *c = mcv_gguf_find_tensor(g, cname);
		if (!c) {
			rc = mcv_error_set(err, MCV_EFORMAT, "%s: %s has no %s", path, t->name, cname);
			break;
		}
		int64_t ne0 = t->ne[0], nm = t->ne[1] * t->ne[2] * t->ne[3];
		int64_t nc = c->ne[0] * c->ne[1] * c->ne[2] * c->ne[3];
		if (t->type != MCV_F32 || c->type != MCV_F32 || nc != nm || ne0 <= 0) {
			rc = mcv_error_set(err, MCV_EFORMAT, "%s: %s: sums and counts do not agree", path, t->name);
			break;
		}
		entry *e;
		if ((rc = add(im, t->name, len - sl, ne0 * nm, &e))) {
			mcv_error_set(err, rc, "out of memory");
			break;
		}
		const float *s = t->data, *cnt = c->data;
		for (int64_t j = 0; j < nm; j++)
			for (int64_t k = 0; k < ne0; k++)
				e->v[j * ne0 + k] = cnt[j] > 0 ? s[j * ne0 + k] / cnt[j] : 1.0f;
	}
	if (!rc && im->n == 0)
		rc = mcv_error_set(err, MCV_EFORMAT, "%s: no importance data in the file", path);
	mcv_gguf_close(g);
	return rc;
}

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }

static int load_legacy(mcv_imatrix *im, const char *path, mcv_error *err)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	fseek(f, 0, SEEK_SET);
	int32_t n_ent;
	int rc = 0;
	if (rd(f, &n_ent, 4) || n_ent < 1 || n_ent > size / 16) {
		fclose(f);
		return mcv_error_set(err, MCV_EFORMAT, "%s: not an importance matrix (bad entry count)", path);
	}
	char name[1024];
	for (int i = 0; i < n_ent && !rc; i++) {
		int32_t len, ncall, nval;
		if (rd(f, &len, 4) || len < 1 || len >= (int32_t)sizeof name || rd(f, name, len) ||
		    rd(f, &ncall, 4) || rd(f, &nval, 4) || nval < 1 ||
		    (long)nval > (size - ftell(f)) / 4) {
			rc = mcv_error_set(err, MCV_EFORMAT, "%s: entry %d is truncated or malformed", path, i);
			break;
		}
		entry *e;
		if ((rc = add(im, name, len, nval, &e))) {
			mcv_error_set(err, rc, "out of memory");
			break;
		}
		if (rd(f, e->v, (size_t)nval * 4)) {
			rc = mcv_error_set(err, MCV_EFORMAT, "%s: entry %d is truncated", path, i);
			break;
		}
		if (ncall > 0)
			for (int32_t j = 0; j < nval; j++)
				e->v[j] /= ncall;
	}
	fclose(f);
	return rc;
}

int mcv_imatrix_load(mcv_imatrix **out, const char *path, mcv_error *err)
{
	*out = NULL;
	mcv_imatrix *im = calloc(1, sizeof *im);
	if (!im)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	char magic[4] = { 0 };
	FILE *f = fopen(path, "rb");
	if (!f) {
		free(im);
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", path, strerror(errno));
	}
	size_t got = fread(magic, 1, 4, f);
	fclose(f);
	int rc = got == 4 && !memcmp(magic, "GGUF", 4) ? load_gguf(im, path, err) : load_legacy(im, path, err);
	for (int i = 0; !rc && i < im->n; i++)
		for (int64_t j = 0; j < im->e[i].n; j++)
			if (!isfinite(im->e[i].v[j])) {
				rc = mcv_error_set(err, MCV_EFORMAT, "%s: %s holds a non-finite value", path, im->e[i].name);
				break;
			}
	if (rc) {
		mcv_imatrix_free(im);
		return rc;
	}
	*out = im;
	return 0;
}

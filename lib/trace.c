/* Routing trace writer and reader; see trace.h. */
#include "trace.h"
#include "pack.h"
#include "quant.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_EXPERTS "trace.experts"
#define T_WEIGHTS "trace.weights"
#define T_HIDDEN "trace.hidden"

int mcv_trace_model_from_gguf(mcv_trace_model *m, const mcv_gguf *g, mcv_error *err)
{
	mcv_layout *l;
	int rc = mcv_layout_open(&l, g, err);
	if (rc)
		return rc;
	memset(m, 0, sizeof *m);
	snprintf(m->arch, sizeof m->arch, "%s", mcv_layout_arch(l));
	m->n_layer = mcv_layout_n_layer(l);
	m->n_expert = mcv_layout_n_expert(l);
	m->n_expert_used = mcv_layout_n_expert_used(l);
	m->n_embd = mcv_layout_n_embd(l);
	m->fingerprint = mcv_layout_fingerprint(l);
	mcv_layout_free(l);
	if (m->n_expert_used < 1)
		return mcv_error_set(err, MCV_ENOTFOUND, "%s.expert_used_count is missing", m->arch);
	return 0;
}

int mcv_trace_model_match(const mcv_trace_model *t, const mcv_trace_model *m, mcv_error *err)
{
	if (strcmp(t->arch, m->arch) || t->n_layer != m->n_layer || t->n_expert != m->n_expert ||
	    t->n_expert_used != m->n_expert_used || t->n_embd != m->n_embd ||
	    t->fingerprint != m->fingerprint)
		return mcv_error_set(err, MCV_EINVAL,
				     "trace is from another model (trace: %s, %d layers, %d experts, top-%d, "
				     "hidden %" PRId64 ", fingerprint %016" PRIx64 "; model: %s, %d layers, "
				     "%d experts, top-%d, hidden %" PRId64 ", fingerprint %016" PRIx64 ")",
				     t->arch, t->n_layer, t->n_expert, t->n_expert_used, t->n_embd,
				     t->fingerprint, m->arch, m->n_layer, m->n_expert, m->n_expert_used,
				     m->n_embd, m->fingerprint);
	return 0;
}

/* ------------------------------------------------------------- writer -- */

struct mcv_trace_writer {
	char *path;
	mcv_trace_model m;
	int htype;
	int fd;                /* scratch records */
	size_t rec, hbytes;    /* record size, hidden bytes per record */
	uint8_t *seen;         /* per (token, layer) */
	int64_t cap_tok, n_tok;
	void *buf;
	mcv_error err;
};

/* The first error sticks, as in the GGUF writer. */
static int wfail(mcv_trace_writer *w, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int wfail(mcv_trace_writer *w, int code, const char *fmt, ...)
{
	if (!w->err.code) {
		char msg[400];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof msg, fmt, ap);
		va_end(ap);
		mcv_error_set(&w->err, code, "%s", msg);
	}
	return w->err.code;
}

int mcv_trace_writer_open(mcv_trace_writer **out, const char *path,
			  const mcv_trace_model *m, int hidden_type, mcv_error *err)
{
	*out = NULL;
	if (!path || !m || m->n_layer < 1 || m->n_expert < 1 || m->n_expert_used < 1 ||
	    m->n_expert_used > m->n_expert || m->n_embd < 1 || m->n_expert > (1 << 24))
		return mcv_error_set(err, MCV_EINVAL, "bad trace model description");
	if (hidden_type != -1 && hidden_type != MCV_F16 && hidden_type != MCV_F32)
		return mcv_error_set(err, MCV_EINVAL, "hidden states must be f16 or f32");
	mcv_trace_writer *w = calloc(1, sizeof *w);
	if (!w || !(w->path = strdup(path))) {
		free(w);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	w->m = *m;
	w->htype = hidden_type;
	w->hbytes = hidden_type < 0 ? 0 : (size_t)m->n_embd * (hidden_type == MCV_F16 ? 2 : 4);
	w->rec = (size_t)m->n_expert_used * 8 + w->hbytes;
	if (!(w->buf = malloc(w->rec))) {
		free(w->path);
		free(w);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	/* Scratch beside the output (same file system as the result); for
	 * stdout, in TMPDIR. */
	char *tmpl;
	const char *slash = strrchr(path, '/');
	int r;
	if (strcmp(path, "-") == 0) {
		const char *td = getenv("TMPDIR");
		r = asprintf(&tmpl, "%s/mcv-trace.XXXXXX", td && *td ? td : "/tmp");
	} else if (slash) {
		r = asprintf(&tmpl, "%.*s/.mcv-trace.XXXXXX", (int)(slash - path), path);
	} else {
		r = asprintf(&tmpl, ".mcv-trace.XXXXXX");
	}
	if (r < 0) {
		mcv_trace_writer_abort(w);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	w->fd = mkstemp(tmpl);
	if (w->fd < 0) {
		int e = errno;
		mcv_error_set(err, MCV_EIO, "cannot create scratch file %s: %s", tmpl, strerror(e));
		free(tmpl);
		free(w->buf);
		free(w->path);
		free(w);
		return MCV_EIO;
	}
	unlink(tmpl); /* anonymous from now on: nothing to clean up after a crash */
	free(tmpl);
	*out = w;
	return 0;
}

int mcv_trace_writer_put(mcv_trace_writer *w, int64_t token, int layer,
			 const int32_t *ids, const float *weights, const float *hidden)
{
	if (!w)
		return MCV_EINVAL;
	if (w->err.code)
		return w->err.code;
	const mcv_trace_model *m = &w->m;
	if (token < 0 || token > ((int64_t)1 << 40) || layer < 0 || layer >= m->n_layer || !ids || !weights)
		return wfail(w, MCV_EINVAL, "trace record token %" PRId64 " layer %d: bad arguments", token, layer);
	if (w->hbytes && !hidden)
		return wfail(w, MCV_EINVAL, "trace record token %" PRId64 " layer %d: no hidden state", token, layer);
	int k = m->n_expert_used;
	float *f = w->buf;
	for (int i = 0; i < k; i++) {
		if (ids[i] < 0 || ids[i] >= m->n_expert)
			return wfail(w, MCV_EINVAL, "trace record token %" PRId64 " layer %d: expert id %d out of range", token, layer, ids[i]);
		for (int j = 0; j < i; j++)
			if (ids[j] == ids[i])
				return wfail(w, MCV_EINVAL, "trace record token %" PRId64 " layer %d: expert %d chosen twice", token, layer, ids[i]);
		if (!isfinite(weights[i]))
			return wfail(w, MCV_EINVAL, "trace record token %" PRId64 " layer %d: weight is not finite", token, layer);
		f[i] = (float)ids[i];
		f[k + i] = weights[i];
	}
	if (w->htype == MCV_F32) {
		memcpy(f + 2 * k, hidden, w->hbytes);
	} else if (w->htype == MCV_F16) {
		uint16_t *h = (uint16_t *)(f + 2 * k);
		for (int64_t i = 0; i < m->n_embd; i++)
			h[i] = mcv_fp32_to_fp16(hidden[i]);
	}
	if (token >= w->cap_tok) {
		int64_t cap = w->cap_tok ? w->cap_tok : 256;
		while (cap <= token)
			cap *= 2;
		uint8_t *s = realloc(w->seen, (size_t)cap * m->n_layer);
		if (!s)
			return wfail(w, MCV_ENOMEM, "out of memory");
		memset(s + (size_t)w->cap_tok * m->n_layer, 0, (size_t)(cap - w->cap_tok) * m->n_layer);
		w->seen = s;
		w->cap_tok = cap;
	}
	uint64_t idx = (uint64_t)token * m->n_layer + layer;
	off_t off = (off_t)(idx * w->rec);
	size_t done = 0;
	while (done < w->rec) {
		ssize_t n = pwrite(w->fd, (char *)w->buf + done, w->rec - done, off + (off_t)done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return wfail(w, MCV_EIO, "trace scratch write: %s", strerror(errno));
		done += (size_t)n;
	}
	w->seen[idx] = 1;
	if (token + 1 > w->n_tok)
		w->n_tok = token + 1;
	return 0;
}

void mcv_trace_writer_abort(mcv_trace_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0)
		close(w->fd);
	free(w->seen);
	free(w->buf);
	free(w->path);
	free(w);
}

/* Stream one part (byte range [at, at+n) of every record) as a tensor. */
static int copy_part(mcv_trace_writer *w, mcv_gguf_writer *gw, size_t at, size_t n)
{
	uint64_t nrec = (uint64_t)w->n_tok * w->m.n_layer;
	enum { CHUNK = 1024 };
	char *in = malloc(CHUNK * w->rec), *outb = malloc(CHUNK * n);
	if (!in || !outb) {
		free(in);
		free(outb);
		return wfail(w, MCV_ENOMEM, "out of memory");
	}
	int rc = 0;
	for (uint64_t r = 0; r < nrec && !rc; r += CHUNK) {
		uint64_t c = nrec - r < CHUNK ? nrec - r : CHUNK;
		size_t want = (size_t)c * w->rec, got = 0;
		while (got < want) {
			ssize_t x = pread(w->fd, in + got, want - got, (off_t)(r * w->rec + got));
			if (x < 0 && errno == EINTR)
				continue;
			if (x <= 0) {
				rc = wfail(w, MCV_EIO, "trace scratch read: %s",
					   x < 0 ? strerror(errno) : "short file");
				break;
			}
			got += (size_t)x;
		}
		if (rc)
			break;
		for (uint64_t i = 0; i < c; i++)
			memcpy(outb + i * n, in + i * w->rec + at, n);
		if (mcv_gguf_w_write(gw, outb, (size_t)c * n))
			rc = MCV_EIO;
	}
	free(in);
	free(outb);
	if (!rc && mcv_gguf_w_end_tensor(gw))
		rc = MCV_EIO;
	return rc;
}

int mcv_trace_writer_finish(mcv_trace_writer *w, mcv_error *err)
{
	if (!w)
		return mcv_error_set(err, MCV_EINVAL, "no trace writer");
	const mcv_trace_model *m = &w->m;
	for (uint64_t i = 0; !w->err.code && i < (uint64_t)w->n_tok * m->n_layer; i++)
		if (!w->seen[i])
			wfail(w, MCV_EINVAL, "trace: token %" PRId64 " layer %d was never recorded",
			      (int64_t)(i / m->n_layer), (int)(i % m->n_layer));
	if (w->err.code) {
		int rc = mcv_error_set(err, w->err.code, "%s", w->err.msg);
		mcv_trace_writer_abort(w);
		return rc;
	}
	mcv_gguf_writer *gw;
	int rc = mcv_gguf_writer_open(&gw, w->path, err);
	if (rc) {
		mcv_trace_writer_abort(w);
		return rc;
	}
	char fp[32];
	snprintf(fp, sizeof fp, "%016" PRIx64, m->fingerprint);
	int k = m->n_expert_used;
	mcv_gguf_w_str(gw, "general.type", MCV_TRACE_TYPE);
	mcv_gguf_w_u32(gw, "mcv.trace.version", MCV_TRACE_VERSION);
	mcv_gguf_w_str(gw, "mcv.trace.model.architecture", m->arch);
	mcv_gguf_w_u32(gw, "mcv.trace.model.n_layer", (uint32_t)m->n_layer);
	mcv_gguf_w_u32(gw, "mcv.trace.model.n_expert", (uint32_t)m->n_expert);
	mcv_gguf_w_u32(gw, "mcv.trace.model.n_expert_used", (uint32_t)k);
	mcv_gguf_w_u64(gw, "mcv.trace.model.n_embd", (uint64_t)m->n_embd);
	mcv_gguf_w_str(gw, "mcv.trace.model.fingerprint", fp);
	mcv_gguf_w_u64(gw, "mcv.trace.n_tokens", (uint64_t)w->n_tok);
	int64_t ne[3] = { k, m->n_layer, w->n_tok };
	mcv_gguf_w_add_tensor(gw, T_EXPERTS, MCV_F32, 3, ne);
	mcv_gguf_w_add_tensor(gw, T_WEIGHTS, MCV_F32, 3, ne);
	if (w->htype >= 0) {
		int64_t nh[3] = { m->n_embd, m->n_layer, w->n_tok };
		mcv_gguf_w_add_tensor(gw, T_HIDDEN, w->htype, 3, nh);
	}
	if (mcv_gguf_w_begin_data(gw) == 0 &&
	    copy_part(w, gw, 0, (size_t)k * 4) == 0 &&
	    copy_part(w, gw, (size_t)k * 4, (size_t)k * 4) == 0 && w->htype >= 0)
		copy_part(w, gw, (size_t)k * 8, w->hbytes);
	if (w->err.code) {
		rc = mcv_error_set(err, w->err.code, "%s", w->err.msg);
		mcv_gguf_writer_abort(gw);
	} else {
		rc = mcv_gguf_writer_finish(gw, err);
	}
	mcv_trace_writer_abort(w);
	return rc;
}

/* ------------------------------------------------------------- reader -- */

struct mcv_trace {
	mcv_gguf *g;
	mcv_trace_model m;
	int64_t n_tok;
	int32_t *ids;
	const float *w;
	const mcv_gguf_tensor *hidden;
};

static int need_u32(const mcv_gguf *g, const char *key, uint32_t *v, mcv_error *err)
{
	return mcv_gguf_get_u32(g, key, v, err);
}

static int trace_load(mcv_trace *t, mcv_error *err)
{
	const mcv_gguf *g = t->g;
	const char *type = NULL, *arch = NULL, *fp = NULL;
	int rc;
	mcv_error e2 = { 0 };
	if (mcv_gguf_get_str(g, "general.type", &type, &e2) || strcmp(type, MCV_TRACE_TYPE) != 0)
		return mcv_error_set(err, MCV_EFORMAT, "not a routing trace (general.type is %s%s%s)",
				     type ? "'" : "", type ? type : "missing", type ? "'" : "");
	uint32_t ver, L, E, k;
	uint64_t H64, N64;
	int64_t tmp;
	if ((rc = need_u32(g, "mcv.trace.version", &ver, err)))
		return rc;
	if (ver != MCV_TRACE_VERSION)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "trace version %u (this build reads %d)",
				     ver, MCV_TRACE_VERSION);
	if ((rc = mcv_gguf_get_str(g, "mcv.trace.model.architecture", &arch, err)) ||
	    (rc = need_u32(g, "mcv.trace.model.n_layer", &L, err)) ||
	    (rc = need_u32(g, "mcv.trace.model.n_expert", &E, err)) ||
	    (rc = need_u32(g, "mcv.trace.model.n_expert_used", &k, err)) ||
	    (rc = mcv_gguf_get_i64(g, "mcv.trace.model.n_embd", &tmp, err)))
		return rc;
	H64 = (uint64_t)tmp;
	if ((rc = mcv_gguf_get_str(g, "mcv.trace.model.fingerprint", &fp, err)) ||
	    (rc = mcv_gguf_get_i64(g, "mcv.trace.n_tokens", &tmp, err)))
		return rc;
	N64 = (uint64_t)tmp;
	char *end;
	errno = 0;
	unsigned long long f = strtoull(fp, &end, 16);
	if (!*fp || *end || errno || strlen(fp) != 16)
		return mcv_error_set(err, MCV_EFORMAT, "mcv.trace.model.fingerprint '%.40s' is not 16 hex digits", fp);
	if (L < 1 || L > 4096 || E < 1 || E > (1u << 24) || k < 1 || k > E || tmp < 0 ||
	    H64 < 1 || H64 > (1u << 24))
		return mcv_error_set(err, MCV_EFORMAT, "implausible trace shape: %u layers, %u experts, "
				     "top-%u, hidden %" PRIu64, L, E, k, H64);
	snprintf(t->m.arch, sizeof t->m.arch, "%s", arch);
	t->m.n_layer = (int)L, t->m.n_expert = (int)E, t->m.n_expert_used = (int)k;
	t->m.n_embd = (int64_t)H64, t->m.fingerprint = f;
	t->n_tok = (int64_t)N64;

	const mcv_gguf_tensor *x = mcv_gguf_find_tensor(g, T_EXPERTS);
	const mcv_gguf_tensor *w = mcv_gguf_find_tensor(g, T_WEIGHTS);
	const mcv_gguf_tensor *h = mcv_gguf_find_tensor(g, T_HIDDEN);
	if (!x || !w)
		return mcv_error_set(err, MCV_EFORMAT, "tensor %s is missing", x ? T_WEIGHTS : T_EXPERTS);
	for (int i = 0; i < 2; i++) {
		const mcv_gguf_tensor *a = i ? w : x;
		if (a->type != MCV_F32 || a->n_dims != 3 || a->ne[0] != k || a->ne[1] != L ||
		    a->ne[2] != (int64_t)N64)
			return mcv_error_set(err, MCV_EFORMAT, "tensor %s is not f32 [%u, %u, %" PRIu64 "]",
					     a->name, k, L, N64);
	}
	if (h && ((h->type != MCV_F32 && h->type != MCV_F16) || h->n_dims != 3 ||
		  h->ne[0] != (int64_t)H64 || h->ne[1] != L || h->ne[2] != (int64_t)N64))
		return mcv_error_set(err, MCV_EFORMAT, "tensor %s is not f16/f32 [%" PRIu64 ", %u, %" PRIu64 "]",
				     T_HIDDEN, H64, L, N64);
	t->hidden = h;
	t->w = w->data;
	size_t n = (size_t)N64 * L * k;
	if (!(t->ids = malloc(n ? n * sizeof *t->ids : 1)))
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	const float *fx = x->data;
	for (size_t i = 0; i < n; i++) {
		float v = fx[i];
		if (!(v >= 0 && v < (float)E) || v != (float)(int32_t)v)
			return mcv_error_set(err, MCV_EFORMAT, "token %zu layer %zu: expert id %g is not in 0..%u",
					     i / k / L, i / k % L, (double)v, E - 1);
		t->ids[i] = (int32_t)v;
		for (size_t j = i - i % k; j < i; j++)
			if (t->ids[j] == t->ids[i])
				return mcv_error_set(err, MCV_EFORMAT, "token %zu layer %zu: expert %d chosen twice",
						     i / k / L, i / k % L, t->ids[i]);
	}
	return 0;
}

int mcv_trace_open(mcv_trace **out, const char *path, mcv_error *err)
{
	*out = NULL;
	mcv_trace *t = calloc(1, sizeof *t);
	if (!t)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	int rc = mcv_gguf_open(&t->g, path, err);
	if (!rc && (rc = trace_load(t, err)))
		mcv_error_prefix(err, "%s", path);
	if (rc) {
		mcv_trace_close(t);
		return rc;
	}
	*out = t;
	return 0;
}

void mcv_trace_close(mcv_trace *t)
{
	if (!t)
		return;
	mcv_gguf_close(t->g);
	free(t->ids);
	free(t);
}

const mcv_trace_model *mcv_trace_model_of(const mcv_trace *t) { return &t->m; }
int64_t mcv_trace_n_tokens(const mcv_trace *t) { return t->n_tok; }
int mcv_trace_hidden_type(const mcv_trace *t) { return t->hidden ? t->hidden->type : -1; }

static bool in_range(const mcv_trace *t, int64_t token, int layer)
{
	return token >= 0 && token < t->n_tok && layer >= 0 && layer < t->m.n_layer;
}

const int32_t *mcv_trace_experts(const mcv_trace *t, int64_t token, int layer)
{
	if (!in_range(t, token, layer))
		return NULL;
	return t->ids + ((size_t)token * t->m.n_layer + layer) * t->m.n_expert_used;
}

int mcv_trace_weights(const mcv_trace *t, int64_t token, int layer, float *out)
{
	if (!in_range(t, token, layer))
		return MCV_EINVAL;
	int k = t->m.n_expert_used;
	memcpy(out, t->w + ((size_t)token * t->m.n_layer + layer) * k, (size_t)k * sizeof *out);
	return 0;
}

int mcv_trace_hidden(const mcv_trace *t, int64_t token, int layer, float *out)
{
	if (!t->hidden)
		return MCV_ENOTFOUND;
	if (!in_range(t, token, layer))
		return MCV_EINVAL;
	size_t H = (size_t)t->m.n_embd, at = ((size_t)token * t->m.n_layer + layer) * H;
	if (t->hidden->type == MCV_F32) {
		memcpy(out, (const float *)t->hidden->data + at, H * sizeof *out);
	} else {
		const uint16_t *h = (const uint16_t *)t->hidden->data + at;
		for (size_t i = 0; i < H; i++)
			out[i] = mcv_fp16_to_fp32(h[i]);
	}
	return 0;
}

int mcv_trace_check_model(const mcv_trace *t, const mcv_gguf *model, mcv_error *err)
{
	mcv_trace_model m;
	int rc = mcv_trace_model_from_gguf(&m, model, err);
	if (rc)
		return rc;
	return mcv_trace_model_match(&t->m, &m, err);
}

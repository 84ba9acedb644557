/* Expert predictors (lib/predict.h, lib/predict_train.h) on tiny random
 * models from $B/mcv-genmodel (skipped when it is absent):
 *  - the router baseline equals layer l+d's ffn_gate_inp applied to h
 *    RMS-normalised with that layer's post_attention_norm, computed here
 *    from the GGUF tensors by name;
 *  - learning: on synthetic data whose routing of layer l+d is top-k of a
 *    hidden linear map of h (not the model's router), the trained predictor
 *    must beat the router baseline by a wide margin on held-out tokens;
 *  - training is bit-identical for 1 and 2 threads; save + load gives the
 *    same scores; wrong model, truncated file, bad (l, d) are errors;
 *  - routing context: on synthetic sequences whose routing at layer j is
 *    the previous token's at layer j shifted (the hidden states are noise),
 *    a context predictor learns it and one without cannot; a session fed
 *    the routing row by row predicts exactly what scores_ctx does with the
 *    context spelled out; files with context are version 2 and round-trip,
 *    files without stay version 1. */
#include "gguf.h"
#include "model.h"
#include "predict.h"
#include "predict_train.h"
#include "quant.h"
#include "trace.h"
#include "unit.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static uint64_t rs = 12345;
static double unif(void)
{
	uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (double)(z >> 11) / 9007199254740992.0;
}
static double gauss(void)
{
	double u = unif() + 1e-12, v = unif();
	return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static int gen_model(const char *gen, const char *path, const char *extra)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "'%s' -q --arch qwen35moe --shape tiny %s '%s'", gen, extra, path);
	return system(cmd);
}

static void tensor_row(const mcv_gguf *g, const char *name, int64_t row, float *out, int64_t n)
{
	const mcv_gguf_tensor *t = mcv_gguf_find_tensor(g, name);
	CHECK(t && t->ne[0] == n, "%s", name);
	if (!t)
		return;
	const size_t rb = (size_t)(t->nbytes / (uint64_t)(t->nbytes ? t->ne[1] * t->ne[2] * t->ne[3] : 1));
	mcv_dequantize_row(t->type, (const char *)t->data + rb * (size_t)row, out, n);
}

static void test_router(mcv_model *m)
{
	mcv_error err;
	mcv_predictor *p;
	CHECK(mcv_predictor_router(&p, m, &err) == 0, "%s", err.msg);
	if (!p)
		return;
	const mcv_trace_model *tm = mcv_predictor_model(p);
	const int H = (int)tm->n_embd, E = tm->n_expert, L = tm->n_layer;
	CHECK(mcv_predictor_max_lookahead(p) == L - 1, "max lookahead %d", mcv_predictor_max_lookahead(p));
	CHECK(!strcmp(mcv_predictor_kind(p), "router"), "kind");
	float *h = malloc(sizeof(float) * H), *xn = malloc(sizeof(float) * H), *w = malloc(sizeof(float) * H);
	float *row = malloc(sizeof(float) * H), *s = malloc(sizeof(float) * E);
	for (int i = 0; i < H; i++)
		h[i] = (float)gauss() * 3.0f;
	const mcv_gguf *g = mcv_model_gguf(m);
	double worst = 0;
	for (int l = 0; l < L; l++)
		for (int d = 1; l + d < L; d++) {
			CHECK(mcv_predictor_scores(p, l, d, h, s, &err) == 0, "%s", err.msg);
			char name[64];
			snprintf(name, sizeof name, "blk.%d.post_attention_norm.weight", l + d);
			tensor_row(g, name, 0, w, H);
			double ss = 0;
			for (int i = 0; i < H; i++)
				ss += (double)h[i] * h[i];
			const double inv = 1.0 / sqrt(ss / H + 1e-6);
			for (int i = 0; i < H; i++)
				xn[i] = (float)(h[i] * inv * w[i]);
			snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l + d);
			double scale = 0;
			for (int e = 0; e < E; e++) {
				tensor_row(g, name, e, row, H);
				double ref = 0, mag = 0;
				for (int i = 0; i < H; i++) {
					ref += (double)row[i] * xn[i];
					mag += fabs((double)row[i] * xn[i]);
				}
				scale = mag > scale ? mag : scale;
				const double diff = fabs(ref - s[e]) / (mag + 1e-9);
				worst = diff > worst ? diff : worst;
			}
		}
	/* the matvec quantizes the activation for q8_0 weights: ~1% of the
	 * absolute sum at most */
	CHECK(worst < 0.02, "router baseline differs from ffn_gate_inp(rmsnorm(h) * post_attention_norm): %g",
	      worst);
	CHECK(mcv_predictor_scores(p, L - 1, 1, h, s, &err) == MCV_EINVAL, "l + d = n_layer accepted");
	CHECK(mcv_predictor_scores(p, 0, 0, h, s, &err) == MCV_EINVAL, "d = 0 accepted");
	free(h), free(xn), free(w), free(row), free(s);
	mcv_predictor_free(p);
}

/* Synthetic traces: routing of layer j = top-k of W_j h_{j-1}, where the
 * hidden states are Gaussian and W_j a fixed random matrix unrelated to
 * the model's routers. */
typedef struct synth {
	int64_t n;
	float *hidden;
	int32_t *experts;
	uint8_t *val;
} synth;

static void make_synth(synth *sy, const mcv_trace_model *tm, int64_t n, const float *W)
{
	const int L = tm->n_layer, H = (int)tm->n_embd, E = tm->n_expert, k = tm->n_expert_used;
	sy->n = n;
	sy->hidden = malloc(sizeof(float) * (size_t)(n * L * H));
	sy->experts = malloc(sizeof(int32_t) * (size_t)(n * L * k));
	sy->val = calloc((size_t)n, 1);
	float *s = malloc(sizeof(float) * E);
	for (int64_t t = 0; t < n; t++) {
		sy->val[t] = t % 10 == 0;
		for (int l = 0; l < L; l++) {
			float *h = sy->hidden + ((size_t)t * L + l) * H;
			for (int i = 0; i < H; i++)
				h[i] = (float)gauss();
		}
		for (int l = 0; l < L; l++) {
			/* layer l's routing follows the state entering layer l - 1 */
			const float *h = sy->hidden + ((size_t)t * L + (l > 0 ? l - 1 : 0)) * H;
			for (int e = 0; e < E; e++) {
				double a = 0;
				for (int i = 0; i < H; i++)
					a += (double)W[((size_t)l * E + e) * H + i] * h[i];
				s[e] = (float)a;
			}
			int32_t *ids = sy->experts + ((size_t)t * L + l) * k;
			for (int q = 0; q < k; q++) {
				int best = -1;
				for (int e = 0; e < E; e++) {
					int used = 0;
					for (int z = 0; z < q; z++)
						used |= ids[z] == e;
					if (!used && (best < 0 || s[e] > s[best]))
						best = e;
				}
				ids[q] = best;
			}
		}
	}
	free(s);
}

static double mean_recall(const mcv_predictor *p, const mcv_trace_model *tm, const synth *sy, int l, int d)
{
	const int L = tm->n_layer, H = (int)tm->n_embd, E = tm->n_expert, k = tm->n_expert_used;
	float *s = malloc(sizeof(float) * E);
	mcv_error err;
	double sum = 0;
	for (int64_t t = 0; t < sy->n; t++) {
		CHECK(mcv_predictor_scores(p, l, d, sy->hidden + ((size_t)t * L + l) * H, s, &err) == 0, "%s", err.msg);
		sum += mcv_pred_recall(s, E, sy->experts + ((size_t)t * L + l + d) * k, k);
	}
	free(s);
	return sum / (double)sy->n;
}

static void test_learning(mcv_model *m, const char *other_path)
{
	mcv_error err;
	mcv_trace_model tm;
	CHECK(mcv_trace_model_from_gguf(&tm, mcv_model_gguf(m), &err) == 0, "%s", err.msg);
	const int L = tm.n_layer, H = (int)tm.n_embd, E = tm.n_expert;
	float *W = malloc(sizeof(float) * (size_t)L * E * H);
	for (size_t i = 0; i < (size_t)L * E * H; i++)
		W[i] = (float)gauss();
	synth tr, te;
	make_synth(&tr, &tm, 5000, W);
	make_synth(&te, &tm, 400, W);
	mcv_pred_data d = { tr.n, L, H, tm.n_expert_used, tr.hidden, tr.experts, tr.val, NULL };
	mcv_pred_train_params tp = mcv_pred_train_default_params();
	tp.lookahead = 1;
	tp.rank = E;
	tp.hidden = 0; /* the target is linear: the low-rank part must learn it */
	tp.context = 0; /* version-1 files; the context has its own test */
	tp.epochs = 15;
	tp.lr = 1e-2f;
	mcv_predictor *p1 = NULL, *p2 = NULL, *base = NULL, *back = NULL;
	omp_set_num_threads(1);
	CHECK(mcv_predictor_train(&p1, &tm, m, &d, &tp, &err) == 0, "%s", err.msg);
	omp_set_num_threads(2);
	CHECK(mcv_predictor_train(&p2, &tm, m, &d, &tp, &err) == 0, "%s", err.msg);
	/* the ReLU branch: starts at the baseline, is deterministic, saves and loads */
	{
		mcv_pred_train_params th = tp;
		th.hidden = 16;
		th.epochs = 2;
		mcv_pred_data ds = d;
		ds.n = 600;
		mcv_predictor *q1 = NULL, *q2 = NULL, *q3 = NULL;
		omp_set_num_threads(1);
		CHECK(mcv_predictor_train(&q1, &tm, m, &ds, &th, &err) == 0, "%s", err.msg);
		omp_set_num_threads(2);
		CHECK(mcv_predictor_train(&q2, &tm, m, &ds, &th, &err) == 0, "%s", err.msg);
		char hp[512];
		snprintf(hp, sizeof hp, "%s/hid.gguf", dir);
		if (q1 && q2) {
			CHECK(mcv_predictor_hidden(q1) == 16, "hidden %d", mcv_predictor_hidden(q1));
			CHECK(mcv_predictor_save(q1, hp, &err) == 0, "%s", err.msg);
			CHECK(mcv_predictor_load(&q3, hp, m, &err) == 0, "%s", err.msg);
		}
		if (q3) {
			float a1[64], a2[64], a3[64];
			int same = 1;
			for (int64_t t = 0; t < te.n && E <= 64; t += 11)
				for (int l = 0; l + 1 < L; l++) {
					const float *h = te.hidden + ((size_t)t * L + l) * H;
					mcv_predictor_scores(q1, l, 1, h, a1, &err);
					mcv_predictor_scores(q2, l, 1, h, a2, &err);
					mcv_predictor_scores(q3, l, 1, h, a3, &err);
					same &= !memcmp(a1, a2, sizeof(float) * E) && !memcmp(a1, a3, sizeof(float) * E);
				}
			CHECK(same, "ReLU branch: 1 and 2 threads or save + load changed the scores");
			CHECK(mcv_predictor_hidden(q3) == 16, "hidden after load %d", mcv_predictor_hidden(q3));
		}
		mcv_predictor_free(q1), mcv_predictor_free(q2), mcv_predictor_free(q3);
	}
	CHECK(mcv_predictor_router(&base, m, &err) == 0, "%s", err.msg);
	if (!p1 || !p2 || !base)
		goto out;
	CHECK(mcv_predictor_max_lookahead(p1) == 1 && !strcmp(mcv_predictor_kind(p1), "trained"), "shape");
	for (int l = 0; l + 1 < L; l++) {
		const double rt = mean_recall(p1, &tm, &te, l, 1), rb = mean_recall(base, &tm, &te, l, 1);
		fprintf(stderr, "layer %d +1: held-out recall trained %.3f, router %.3f\n", l, rt, rb);
		CHECK(rt >= 0.7 && rt >= rb + 0.35, "layer %d: trained %.3f does not beat the router %.3f", l, rt, rb);
	}
	/* thread count does not matter; save + load keeps every bit */
	char path[512];
	snprintf(path, sizeof path, "%s/pred.gguf", dir);
	CHECK(mcv_predictor_save(p1, path, &err) == 0, "%s", err.msg);
	CHECK(mcv_predictor_load(&back, path, m, &err) == 0, "%s", err.msg);
	if (back) {
		float s1[64], s2[64], s3[64];
		int same = 1;
		for (int64_t t = 0; t < te.n && E <= 64; t += 7)
			for (int l = 0; l + 1 < L; l++) {
				const float *h = te.hidden + ((size_t)t * L + l) * H;
				mcv_predictor_scores(p1, l, 1, h, s1, &err);
				mcv_predictor_scores(p2, l, 1, h, s2, &err);
				mcv_predictor_scores(back, l, 1, h, s3, &err);
				same &= !memcmp(s1, s2, sizeof(float) * E) && !memcmp(s1, s3, sizeof(float) * E);
			}
		CHECK(same, "1 and 2 threads or save + load changed the scores");
		CHECK(mcv_predictor_scores(back, 0, 2, te.hidden, s1, &err) == MCV_EINVAL, "d beyond the lookahead accepted");
		CHECK(!mcv_predictor_context(back), "a predictor without context reads as one with");
		mcv_gguf *g = NULL;
		uint32_t ver = 0;
		CHECK(mcv_gguf_open(&g, path, &err) == 0 && mcv_gguf_get_u32(g, "mcv.predictor.version", &ver, &err) == 0 &&
		      ver == 1, "a predictor without context is version %u, not 1", ver);
		mcv_gguf_close(g);
	}
	/* another model; a truncated file; not a predictor */
	mcv_model *other = NULL;
	mcv_model_params mp = mcv_model_default_params();
	if (mcv_model_load(&other, other_path, &mp, &err) == 0) {
		mcv_predictor *x = NULL;
		CHECK(mcv_predictor_load(&x, path, other, &err) == MCV_EINVAL && strstr(err.msg, "another model"),
		      "predictor for another model accepted: %s", err.msg);
		mcv_predictor_free(x);
		mcv_model_free(other);
	} else {
		CHECK(0, "%s", err.msg);
	}
	struct stat st;
	if (stat(path, &st) == 0) {
		CHECK(truncate(path, st.st_size - 100) == 0, "truncate");
		mcv_predictor *x = NULL;
		CHECK(mcv_predictor_load(&x, path, m, &err) < 0 && !x, "truncated predictor accepted");
		fprintf(stderr, "truncated: %s\n", err.msg);
	}
	mcv_predictor *x = NULL;
	CHECK(mcv_predictor_load(&x, other_path, m, &err) == MCV_EFORMAT, "a model file taken for a predictor");
out:
	mcv_predictor_free(p1), mcv_predictor_free(p2), mcv_predictor_free(base), mcv_predictor_free(back);
	free(W);
	free(tr.hidden), free(tr.experts), free(tr.val), free(te.hidden), free(te.experts), free(te.val);
}

/* Sequences of 40 tokens; at token t > 0 of a sequence, layer j routes to
 * the previous token's experts at layer j shifted by j + 1; the first
 * token's are random.  Hidden states are noise. */
static void make_seq(synth *sy, int64_t **prev, const mcv_trace_model *tm, int64_t n)
{
	const int L = tm->n_layer, H = (int)tm->n_embd, E = tm->n_expert, k = tm->n_expert_used;
	sy->n = n;
	sy->hidden = malloc(sizeof(float) * (size_t)(n * L * H));
	sy->experts = malloc(sizeof(int32_t) * (size_t)(n * L * k));
	sy->val = calloc((size_t)n, 1);
	*prev = malloc(sizeof(int64_t) * (size_t)n);
	for (int64_t t = 0; t < n; t++) {
		const int first = t % 40 == 0;
		(*prev)[t] = first ? -1 : t - 1;
		sy->val[t] = (t / 40) % 8 == 0;
		for (size_t i = 0; i < (size_t)L * H; i++)
			sy->hidden[(size_t)t * L * H + i] = (float)gauss();
		for (int l = 0; l < L; l++) {
			int32_t *ids = sy->experts + ((size_t)t * L + l) * k;
			if (first) {
				for (int q = 0; q < k; q++) {
					int e, dup;
					do {
						e = (int)(unif() * E) % E;
						dup = 0;
						for (int z = 0; z < q; z++)
							dup |= ids[z] == e;
					} while (dup);
					ids[q] = e;
				}
			} else {
				const int32_t *pv = sy->experts + ((size_t)(t - 1) * L + l) * k;
				for (int q = 0; q < k; q++)
					ids[q] = (pv[q] + l + 1) % E;
			}
		}
	}
}

static double ctx_recall(const mcv_predictor *p, const mcv_trace_model *tm, const synth *sy, const int64_t *prev,
			 int l, int d, int use_ctx)
{
	const int L = tm->n_layer, H = (int)tm->n_embd, E = tm->n_expert, k = tm->n_expert_used;
	float *s = malloc(sizeof(float) * E);
	mcv_error err;
	double sum = 0;
	int64_t n = 0;
	for (int64_t t = 0; t < sy->n; t++) {
		if (!sy->val[t])
			continue;
		const mcv_pred_context c = { prev[t] >= 0 ? sy->experts + (size_t)prev[t] * L * k : NULL,
					     sy->experts + (size_t)t * L * k };
		CHECK(mcv_predictor_scores_ctx(p, l, d, sy->hidden + ((size_t)t * L + l) * H, use_ctx ? &c : NULL, s,
					       &err) == 0, "%s", err.msg);
		sum += mcv_pred_recall(s, E, sy->experts + ((size_t)t * L + l + d) * k, k);
		n++;
	}
	free(s);
	return n ? sum / (double)n : 0.0;
}

static void test_context(mcv_model *m)
{
	mcv_error err;
	mcv_trace_model tm;
	CHECK(mcv_trace_model_from_gguf(&tm, mcv_model_gguf(m), &err) == 0, "%s", err.msg);
	const int L = tm.n_layer, H = (int)tm.n_embd, E = tm.n_expert, k = tm.n_expert_used;
	synth sy;
	int64_t *prev;
	make_seq(&sy, &prev, &tm, 2400);
	mcv_pred_data d = { sy.n, L, H, k, sy.hidden, sy.experts, sy.val, prev };
	mcv_pred_train_params tp = mcv_pred_train_default_params();
	tp.lookahead = 2;
	tp.rank = 4;
	tp.hidden = 8;
	tp.epochs = 4;
	tp.lr = 1e-2f;
	mcv_predictor *c1 = NULL, *c2 = NULL, *n1 = NULL, *back = NULL;
	omp_set_num_threads(1);
	CHECK(mcv_predictor_train(&c1, &tm, m, &d, &tp, &err) == 0, "%s", err.msg);
	omp_set_num_threads(2);
	CHECK(mcv_predictor_train(&c2, &tm, m, &d, &tp, &err) == 0, "%s", err.msg);
	tp.context = 0;
	CHECK(mcv_predictor_train(&n1, &tm, m, &d, &tp, &err) == 0, "%s", err.msg);
	if (!c1 || !c2 || !n1)
		goto out;
	CHECK(mcv_predictor_context(c1) && !mcv_predictor_context(n1), "context flags");
	for (int l = 0; l + 1 < L; l++)
		for (int dd = 1; dd <= 2 && l + dd < L; dd++) {
			const double rc = ctx_recall(c1, &tm, &sy, prev, l, dd, 1),
				     rn = ctx_recall(n1, &tm, &sy, prev, l, dd, 1),
				     r0 = ctx_recall(c1, &tm, &sy, prev, l, dd, 0);
			fprintf(stderr, "context: layer %d +%d: held-out recall with %.3f, trained without %.3f, "
				"context withheld %.3f\n", l, dd, rc, rn, r0);
			/* the first token of a sequence (1 in 40) has no previous token */
			CHECK(rc >= 0.9 && rc >= rn + 0.3, "layer %d +%d: context %.3f vs none %.3f", l, dd, rc, rn);
		}
	char path[512];
	snprintf(path, sizeof path, "%s/ctx.gguf", dir);
	CHECK(mcv_predictor_save(c1, path, &err) == 0, "%s", err.msg);
	CHECK(mcv_predictor_load(&back, path, m, &err) == 0, "%s", err.msg);
	mcv_gguf *g = NULL;
	uint32_t ver = 0;
	CHECK(mcv_gguf_open(&g, path, &err) == 0 && mcv_gguf_get_u32(g, "mcv.predictor.version", &ver, &err) == 0 &&
	      ver == 2, "a predictor with context is version %u, not 2", ver);
	mcv_gguf_close(g);
	if (!back)
		goto out;
	CHECK(mcv_predictor_context(back), "context lost by save + load");
	/* a session fed row by row, as mcv_ctx's route hook does, predicts
	 * what the explicit context gives; 1 and 2 threads and the file agree */
	mcv_pred_session *ss = NULL;
	CHECK(mcv_pred_session_init(&ss, back, &err) == 0, "%s", err.msg);
	float *a = malloc(sizeof(float) * E), *b = malloc(sizeof(float) * E), *c = malloc(sizeof(float) * E);
	int same = 1, agree = 1;
	for (int64_t t = 0; t < 200 && ss; t++) {
		for (int l = 0; l < L; l++) {
			const float *h = sy.hidden + ((size_t)t * L + l) * H;
			for (int dd = 1; dd <= 2 && l + dd < L; dd++) {
				const mcv_pred_context cx = { t > 0 ? sy.experts + (size_t)(t - 1) * L * k : NULL,
							      sy.experts + (size_t)t * L * k };
				CHECK(mcv_pred_session_predict(ss, l, dd, h, a) == 0, "session predict");
				mcv_predictor_scores_ctx(c1, l, dd, h, &cx, b, &err);
				mcv_predictor_scores_ctx(c2, l, dd, h, &cx, c, &err);
				agree &= !memcmp(a, b, sizeof(float) * E);
				same &= !memcmp(b, c, sizeof(float) * E);
			}
			mcv_pred_session_route(ss, l, (int)t, sy.experts + ((size_t)t * L + l) * k, NULL, k);
		}
	}
	CHECK(agree, "the session's context differs from the trace's");
	CHECK(same, "context predictor: 1 and 2 threads differ");
	free(a), free(b), free(c);
	mcv_pred_session_free(ss);
out:
	mcv_predictor_free(c1), mcv_predictor_free(c2), mcv_predictor_free(n1), mcv_predictor_free(back);
	free(sy.hidden), free(sy.experts), free(sy.val), free(prev);
}

int main(void)
{
	const char *b = getenv("B") ? getenv("B") : "build";
	char gen[512], path[512], other[512], cmd[1024];
	snprintf(gen, sizeof gen, "%s/mcv-genmodel", b);
	if (access(gen, X_OK) != 0)
		UNIT_SKIP("%s missing (build first)", gen);
	snprintf(dir, sizeof dir, "/tmp/mcv-test-predict.%d", (int)getpid());
	if (mkdir(dir, 0700) < 0)
		UNIT_SKIP("cannot create %s", dir);
	snprintf(path, sizeof path, "%s/moe.gguf", dir);
	snprintf(other, sizeof other, "%s/other.gguf", dir);
	CHECK(gen_model(gen, path, "") == 0, "mcv-genmodel failed");
	CHECK(gen_model(gen, other, "--experts 16") == 0, "mcv-genmodel failed");
	mcv_model *m = NULL;
	mcv_error err;
	mcv_model_params mp = mcv_model_default_params();
	CHECK(mcv_model_load(&m, path, &mp, &err) == 0, "%s", err.msg);
	if (m) {
		test_router(m);
		test_learning(m, other);
		test_context(m);
		mcv_model_free(m);
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return unit_done("test_predict");
}

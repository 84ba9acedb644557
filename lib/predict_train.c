/* Training of low-rank expert predictors (mcv-predict train).
 *
 * Each (layer l, distance d) map is trained on its own, on one thread, with
 * its own random stream derived from (seed, l, d): the result is the same
 * for any thread count.  Loss: listwise cross-entropy between softmax of
 * the scores and the routed set of layer l + d (1/k on each routed expert),
 * which keeps the router's logits a sensible starting point (a per-expert
 * BCE would first have to move every logit below zero). */
#include "predict_impl.h"
#include "predict_train.h"

#include "model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mcv_pred_train_params mcv_pred_train_default_params(void)
{
	return (mcv_pred_train_params){
		.lookahead = 2, .rank = 64, .hidden = 128, .context = 1, .epochs = 20, .batch = 32, .lr = 1e-3f,
		.seed = 1,
	};
}

typedef struct rng {
	uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float rng_unif(rng *r) /* [-1, 1) */
{
	return (float)((double)(rng_next(r) >> 11) / 4503599627370496.0 - 1.0);
}

/* Rows of a bound model tensor as floats. */
static void wt_row(const mcv_wt *w, int64_t row, float *out)
{
	mcv_dequantize_row(w->type, (const char *)w->data + (size_t)row * w->row_bytes, out, w->ne[0]);
}

/* up[E][r] down[r][H] = the best rank-r approximation of the router
 * G[E][H] (exact when r >= E): up = the top-r eigenvectors Q of G G^T by
 * subspace iteration, down = Q^T G. */
static int init_from_router(const mcv_layer *Lr, int H, int E, int r, float *norm, float *down,
			    float *up, rng *g)
{
	wt_row(&Lr->post_norm, 0, norm);
	float *G = malloc(sizeof(float) * (size_t)E * H);
	if (!G)
		return -1;
	for (int e = 0; e < E; e++)
		wt_row(&Lr->gate_inp, e, G + (size_t)e * H);
	if (r >= E) {
		memcpy(down, G, sizeof(float) * (size_t)E * H);
		for (int e = 0; e < E; e++)
			up[(size_t)e * r + e] = 1.0f;
		free(G);
		return 0;
	}
	double *M = malloc(sizeof(double) * (size_t)E * E);
	double *Q = malloc(sizeof(double) * (size_t)E * r), *T = malloc(sizeof(double) * (size_t)E * r);
	if (!M || !Q || !T) {
		free(G), free(M), free(Q), free(T);
		return -1;
	}
	for (int a = 0; a < E; a++)
		for (int b = 0; b < E; b++) {
			double s = 0;
			for (int i = 0; i < H; i++)
				s += (double)G[(size_t)a * H + i] * G[(size_t)b * H + i];
			M[(size_t)a * E + b] = s;
		}
	for (size_t i = 0; i < (size_t)E * r; i++)
		Q[i] = rng_unif(g);
	for (int it = 0; it < 60; it++) {
		/* T = M Q, then Gram-Schmidt on T's columns into Q */
		for (int a = 0; a < E; a++)
			for (int j = 0; j < r; j++) {
				double s = 0;
				for (int b = 0; b < E; b++)
					s += M[(size_t)a * E + b] * Q[(size_t)b * r + j];
				T[(size_t)a * r + j] = s;
			}
		for (int j = 0; j < r; j++) {
			for (int q = 0; q < j; q++) {
				double s = 0;
				for (int a = 0; a < E; a++)
					s += T[(size_t)a * r + j] * T[(size_t)a * r + q];
				for (int a = 0; a < E; a++)
					T[(size_t)a * r + j] -= s * T[(size_t)a * r + q];
			}
			double n = 0;
			for (int a = 0; a < E; a++)
				n += T[(size_t)a * r + j] * T[(size_t)a * r + j];
			n = n > 0 ? 1.0 / sqrt(n) : 0.0;
			for (int a = 0; a < E; a++)
				T[(size_t)a * r + j] *= n;
		}
		memcpy(Q, T, sizeof(double) * (size_t)E * r);
	}
	for (int a = 0; a < E; a++)
		for (int j = 0; j < r; j++)
			up[(size_t)a * r + j] = (float)Q[(size_t)a * r + j];
	for (int j = 0; j < r; j++)
		for (int i = 0; i < H; i++) {
			double s = 0;
			for (int a = 0; a < E; a++)
				s += Q[(size_t)a * r + j] * G[(size_t)a * H + i];
			down[(size_t)j * H + i] = (float)s;
		}
	free(G), free(M), free(Q), free(T);
	return 0;
}

int mcv_pred_data_rows(const mcv_predictor *p, const mcv_pred_data *d, int64_t t, int l, int *rows)
{
	const int64_t pv = d->prev ? d->prev[t] : -1;
	const size_t L = (size_t)d->L, k = (size_t)d->k;
	return mcv_pred_ctx_rows(p, l, pv >= 0 && pv < d->n ? d->experts + (size_t)pv * L * k : NULL,
				 d->experts + (size_t)t * L * k, d->k, rows);
}

typedef struct pair_job {
	const mcv_predictor *p;
	const mcv_pred_data *d;
	const mcv_pred_train_params *tp;
	const int64_t *tr, *va;
	int64_t ntr, nva;
	int H, E, r, k, L, m;
	float eps;
} pair_job;

static double val_recall(const pair_job *j, const mcv_pred_map *mp, int l, int dd, float *work, int *rows)
{
	if (j->nva == 0)
		return 0.0;
	float *xn = work, *z = xn + j->H, *s = z + j->r + j->m;
	double sum = 0;
	for (int64_t i = 0; i < j->nva; i++) {
		const int64_t t = j->va[i];
		const int n = mcv_pred_data_rows(j->p, j->d, t, l, rows);
		mcv_pred_map_apply(mp, j->H, j->r, j->m, j->E, j->eps, j->d->hidden + ((size_t)t * j->L + l) * j->H,
				   rows, n, xn, z, s);
		sum += mcv_pred_recall(s, j->E, j->d->experts + ((size_t)t * j->L + l + dd) * j->k, j->k);
	}
	return sum / (double)j->nva;
}

static void adam(float *theta, float *m1, float *m2, float *grad, size_t n, float scale, float lr, float c1,
		 float c2)
{
	const float b1 = 0.9f, b2 = 0.999f;
	for (size_t i = 0; i < n; i++) {
		const float gi = grad[i] * scale;
		m1[i] = b1 * m1[i] + (1 - b1) * gi;
		m2[i] = b2 * m2[i] + (1 - b2) * gi * gi;
		theta[i] -= lr * (m1[i] / c1) / (sqrtf(m2[i] / c2) + 1e-8f);
	}
}

/* Returns -1 when out of memory. */
static int train_pair(const pair_job *j, float *theta, int l, int dd, double *r0, double *r1, int *best_epoch)
{
	const int H = j->H, E = j->E, r = j->r, k = j->k, L = j->L, m = j->m;
	const int S = mcv_pred_slots(j->p, l), SE = S * E;
	const size_t P = mcv_pred_map_size(j->p), PT = mcv_pred_map_size_at(j->p, l);
	const int maxrows = S * k;
	float *buf = calloc(4 * PT + 5 * (size_t)(H + r + E + m), sizeof(float));
	int64_t *order = malloc(sizeof(int64_t) * (size_t)(j->ntr ? j->ntr : 1));
	int *rows = malloc(sizeof(int) * (size_t)(maxrows + 1));
	int *touched = malloc(sizeof(int) * (size_t)(SE + 1));
	unsigned char *mark = calloc((size_t)SE + 1, 1);
	if (!buf || !order || !rows || !touched || !mark) {
		free(buf), free(order), free(rows), free(touched), free(mark);
		return -1;
	}
	float *grad = buf, *m1 = grad + PT, *m2 = m1 + PT, *best = m2 + PT, *u = best + PT;
	float *xn = u + H, *z = xn + H, *s = z + r, *dz = s + E, *dxn = dz + r, *a = dxn + H, *da = a + m;
	float *work = da + m;
	float *gn = grad, *gdown = gn + H, *gup = gdown + (size_t)r * H, *gbias = gup + (size_t)E * r;
	float *ghdown = gbias + E, *ghbias = ghdown + (size_t)m * H, *ghup = ghbias + m;
	float *gcout = grad + P, *gchid = gcout + (size_t)SE * E;
	mcv_pred_map mp = { theta, theta + H, theta + H + (size_t)r * H, theta + H + (size_t)r * H + (size_t)E * r,
			    NULL, NULL, NULL, S, NULL, NULL };
	if (m > 0) {
		mp.hdown = mp.bias + E;
		mp.hbias = mp.hdown + (size_t)m * H;
		mp.hup = mp.hbias + m;
	}
	if (S > 0) {
		mp.cout = theta + P;
		if (m > 0)
			mp.chid = mp.cout + (size_t)SE * E;
	}
	rng g = { j->tp->seed * 0x2545f4914f6cdd1dull + (uint64_t)l * 1000003u + (uint64_t)dd };

	memcpy(best, theta, sizeof(float) * PT);
	double best_r = val_recall(j, &mp, l, dd, work, rows);
	*r0 = best_r;
	*best_epoch = 0;
	for (int64_t i = 0; i < j->ntr; i++)
		order[i] = j->tr[i];
	int64_t step = 0;
	const int bs = j->tp->batch > 0 ? j->tp->batch : 32;
	for (int ep = 1; ep <= j->tp->epochs && j->ntr > 0; ep++) {
		for (int64_t i = j->ntr - 1; i > 0; i--) {
			int64_t q = (int64_t)(rng_next(&g) % (uint64_t)(i + 1)), t = order[i];
			order[i] = order[q];
			order[q] = t;
		}
		for (int64_t b0 = 0; b0 < j->ntr; b0 += bs) {
			const int64_t b1n = b0 + bs < j->ntr ? b0 + bs : j->ntr;
			memset(grad, 0, sizeof(float) * P);
			int ntouched = 0;
			for (int64_t bi = b0; bi < b1n; bi++) {
				const int64_t t = order[bi];
				const float *h = j->d->hidden + ((size_t)t * L + l) * H;
				const int32_t *ids = j->d->experts + ((size_t)t * L + l + dd) * k;
				const int nr = S > 0 ? mcv_pred_data_rows(j->p, j->d, t, l, rows) : 0;
				double ss = 0;
				for (int i = 0; i < H; i++)
					ss += (double)h[i] * h[i];
				const float inv = (float)(1.0 / sqrt(ss / H + j->eps));
				for (int i = 0; i < H; i++) {
					u[i] = h[i] * inv;
					xn[i] = u[i] * mp.norm[i];
				}
				for (int q = 0; q < r; q++)
					z[q] = mcv_pred_dot(mp.down + (size_t)q * H, xn, H);
				for (int q = 0; q < m; q++)
					a[q] = mp.hbias[q] + mcv_pred_dot(mp.hdown + (size_t)q * H, xn, H);
				for (int i = 0; i < nr && m > 0; i++) {
					const float *c = mp.chid + (size_t)rows[i] * m;
					for (int q = 0; q < m; q++)
						a[q] += c[q];
				}
				for (int q = 0; q < m; q++)
					a[q] = a[q] > 0.0f ? a[q] : 0.0f;
				for (int e = 0; e < E; e++) {
					float v = mp.bias[e] + mcv_pred_dot(mp.up + (size_t)e * r, z, r);
					if (m > 0)
						v += mcv_pred_dot(mp.hup + (size_t)e * m, a, m);
					s[e] = v;
				}
				for (int i = 0; i < nr; i++) {
					const float *c = mp.cout + (size_t)rows[i] * E;
					for (int e = 0; e < E; e++)
						s[e] += c[e];
				}
				float mx = -INFINITY;
				for (int e = 0; e < E; e++)
					mx = s[e] > mx ? s[e] : mx;
				double sum = 0;
				for (int e = 0; e < E; e++) {
					s[e] = expf(s[e] - mx);
					sum += s[e];
				}
				for (int e = 0; e < E; e++)
					s[e] = (float)(s[e] / sum);
				for (int q = 0; q < k; q++)
					s[ids[q]] -= 1.0f / k; /* s is now dLoss/dscores */
				memset(dz, 0, sizeof(float) * r);
				for (int e = 0; e < E; e++) {
					const float ds = s[e];
					gbias[e] += ds;
					float *gr = gup + (size_t)e * r;
					const float *row = mp.up + (size_t)e * r;
					for (int q = 0; q < r; q++) {
						gr[q] += ds * z[q];
						dz[q] += ds * row[q];
					}
				}
				for (int i = 0; i < nr; i++) {
					const int rw = rows[i];
					if (!mark[rw]) {
						mark[rw] = 1;
						touched[ntouched++] = rw;
					}
					float *gr = gcout + (size_t)rw * E;
					for (int e = 0; e < E; e++)
						gr[e] += s[e];
				}
				memset(dxn, 0, sizeof(float) * H);
				if (m > 0) {
					memset(da, 0, sizeof(float) * m);
					for (int e = 0; e < E; e++) {
						const float ds = s[e];
						float *gr = ghup + (size_t)e * m;
						const float *row = mp.hup + (size_t)e * m;
						for (int q = 0; q < m; q++) {
							gr[q] += ds * a[q];
							da[q] += ds * row[q];
						}
					}
					for (int q = 0; q < m; q++)
						if (a[q] <= 0.0f)
							da[q] = 0.0f; /* ReLU closed */
					for (int i = 0; i < nr; i++) {
						float *gr = gchid + (size_t)rows[i] * m;
						for (int q = 0; q < m; q++)
							gr[q] += da[q];
					}
					for (int q = 0; q < m; q++) {
						if (a[q] <= 0.0f)
							continue;
						const float c = da[q];
						ghbias[q] += c;
						float *gr = ghdown + (size_t)q * H;
						const float *row = mp.hdown + (size_t)q * H;
						for (int i = 0; i < H; i++) {
							gr[i] += c * xn[i];
							dxn[i] += c * row[i];
						}
					}
				}
				for (int q = 0; q < r; q++) {
					float *gr = gdown + (size_t)q * H;
					const float *row = mp.down + (size_t)q * H;
					const float c = dz[q];
					for (int i = 0; i < H; i++) {
						gr[i] += c * xn[i];
						dxn[i] += c * row[i];
					}
				}
				for (int i = 0; i < H; i++)
					gn[i] += dxn[i] * u[i];
			}
			/* Adam on the mean gradient; the context rows that were
			 * touched, in the order first touched */
			step++;
			const float scale = 1.0f / (float)(b1n - b0);
			const float c1 = 1.0f - powf(0.9f, (float)step), c2 = 1.0f - powf(0.999f, (float)step);
			const float lr = j->tp->lr;
			adam(theta, m1, m2, grad, P, scale, lr, c1, c2);
			for (int i = 0; i < ntouched; i++) {
				const size_t o1 = P + (size_t)touched[i] * E;
				adam(theta + o1, m1 + o1, m2 + o1, grad + o1, (size_t)E, scale, lr, c1, c2);
				memset(grad + o1, 0, sizeof(float) * (size_t)E);
				if (m > 0) {
					const size_t o2 = P + (size_t)SE * E + (size_t)touched[i] * m;
					adam(theta + o2, m1 + o2, m2 + o2, grad + o2, (size_t)m, scale, lr, c1, c2);
					memset(grad + o2, 0, sizeof(float) * (size_t)m);
				}
				mark[touched[i]] = 0;
			}
		}
		const double rv = val_recall(j, &mp, l, dd, work, rows);
		if (rv > best_r) {
			best_r = rv;
			*best_epoch = ep;
			memcpy(best, theta, sizeof(float) * PT);
		}
	}
	memcpy(theta, best, sizeof(float) * PT);
	*r1 = best_r;
	free(buf), free(order), free(rows), free(touched), free(mark);
	return 0;
}

int mcv_predictor_train(mcv_predictor **out, const mcv_trace_model *tm, const mcv_model *init,
			const mcv_pred_data *d, const mcv_pred_train_params *tp, mcv_error *err)
{
	*out = NULL;
	if (d->L != tm->n_layer || d->H != tm->n_embd || d->k != tm->n_expert_used)
		return mcv_error_set(err, MCV_EINVAL, "training data shape does not match the model");
	if (tp->lookahead < 1 || tp->lookahead >= tm->n_layer)
		return mcv_error_set(err, MCV_EINVAL, "--lookahead %d: the model has %d layers (1..%d)",
				     tp->lookahead, tm->n_layer, tm->n_layer - 1);
	if (tp->rank < 1 || tp->epochs < 0 || tp->batch < 1 || !(tp->lr > 0))
		return mcv_error_set(err, MCV_EINVAL, "bad training parameters");
	float eps = 1e-6f;
	if (init) {
		mcv_trace_model im;
		int rc = mcv_trace_model_from_gguf(&im, init->gguf, err);
		if (rc || (rc = mcv_trace_model_match(tm, &im, err)))
			return rc;
		eps = init->hp.eps;
	}
	mcv_predictor *p;
	if (tp->hidden < 0)
		return mcv_error_set(err, MCV_EINVAL, "bad training parameters");
	int rc = mcv_pred_alloc(&p, tm, tp->lookahead, tp->rank, tp->hidden, tp->context, eps, err);
	if (rc)
		return rc;
	int64_t ntr = 0, nva = 0;
	for (int64_t t = 0; t < d->n; t++)
		d->val[t] ? nva++ : ntr++;
	int64_t *tr = malloc(sizeof(int64_t) * (size_t)(ntr + 1)), *va = malloc(sizeof(int64_t) * (size_t)(nva + 1));
	if (!tr || !va) {
		free(tr), free(va);
		mcv_predictor_free(p);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	ntr = nva = 0;
	for (int64_t t = 0; t < d->n; t++) {
		if (d->val[t])
			va[nva++] = t;
		else
			tr[ntr++] = t;
	}
	pair_job j = { p, d, tp, tr, va, ntr, nva, p->H, p->E, p->rank, d->k, p->L, p->hid, eps };
	const int L = p->L, D = p->D;
	const int npairs = L * D;
	int failed = 0, nmaps = 0;
	for (int l = 0; l < L; l++)
		for (int dd = 1; dd <= D && l + dd < L; dd++)
			nmaps++;
	if (tp->verbose)
		fprintf(stderr, "mcv-predict: %lld training tokens, %lld held out; %d maps of rank %d, "
			"ReLU width %d, %s, %d epochs\n", (long long)ntr, (long long)nva, nmaps, p->rank, p->hid,
			p->ctx ? "routing context" : "no context", tp->epochs);
#pragma omp parallel for schedule(dynamic, 1)
	for (int pi = 0; pi < npairs; pi++) {
		const int l = pi / D, dd = pi % D + 1;
		if (l + dd >= L)
			continue;
		float *theta = mcv_pred_map_params(p, l, dd);
		const size_t H = (size_t)p->H, r = (size_t)p->rank, E = (size_t)p->E;
		rng g = { tp->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(pi + 1)) };
		int bad = 0;
		/* the ReLU branch starts random in, zero out: the map starts as
		 * the low-rank part alone */
		float *hd = theta + H + r * H + E * r + E;
		const float ah = sqrtf(3.0f / (float)H);
		for (size_t i = 0; i < (size_t)p->hid * H; i++)
			hd[i] = ah * rng_unif(&g);
		if (init) {
			bad = init_from_router(&init->layers[l + dd], (int)H, (int)E, (int)r, theta,
					       theta + H, theta + H + r * H, &g);
		} else {
			for (size_t i = 0; i < H; i++)
				theta[i] = 1.0f;
			const float a = sqrtf(3.0f / (float)H), b = sqrtf(3.0f / (float)r);
			for (size_t i = 0; i < r * H; i++)
				theta[H + i] = a * rng_unif(&g);
			for (size_t i = 0; i < E * r; i++)
				theta[H + r * H + i] = b * rng_unif(&g);
		}
		double r0 = 0, r1 = 0;
		int be = 0;
		if (!bad)
			bad = train_pair(&j, theta, l, dd, &r0, &r1, &be);
		if (bad) {
#pragma omp atomic write
			failed = 1;
		} else if (tp->verbose) {
#pragma omp critical
			fprintf(stderr, "mcv-predict: layer %d +%d: held-out recall@%d %.4f -> %.4f (epoch %d)\n",
				l, dd, d->k, r0, r1, be);
		}
	}
	free(tr), free(va);
	if (failed) {
		mcv_predictor_free(p);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory while training");
	}
	*out = p;
	return 0;
}

/* Per-tensor type allocation (see alloc.h). */
#include "alloc.h"
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mcv_alloc_candidates(int64_t ne0, int *types)
{
	static const int base[] = { MCV_Q2_K, MCV_Q3_K, MCV_Q4_K, MCV_Q5_K, MCV_Q6_K, MCV_Q8_0 };
	static const int fb[] = { MCV_Q4_0, MCV_Q4_0, MCV_Q5_0, MCV_Q5_1, MCV_Q8_0, MCV_Q8_0 };
	int n = 0;
	for (int i = 0; i < 6; i++) {
		int t = ne0 % MCV_QK_K ? fb[i] : base[i];
		if (!mcv_row_bytes(t, ne0))
			continue;
		int dup = 0;
		for (int j = 0; j < n; j++)
			dup |= types[j] == t;
		if (!dup)
			types[n++] = t;
	}
	return n;
}

int mcv_alloc_measure(mcv_alloc_tensor *t, mcv_alloc_row_fn rows, void *user, const float *imp,
		      const float *mat_weight, int quant_imp, int64_t max_rows, mcv_error *err)
{
	const int64_t ne0 = t->ne[0], per_mat = t->ne[1];
	const int64_t R = t->ne[1] * t->ne[2] * t->ne[3];
	const int nc = t->n_cand;
	int64_t K = max_rows > 0 && R > max_rows ? max_rows : R;
	for (int c = 0; c < nc; c++)
		t->bytes[c] = (double)mcv_row_bytes(t->cand[c], ne0) * (double)R;
	double *e = calloc((size_t)K * (nc + 1), sizeof *e);
	if (!e)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	int oom = 0;
	#pragma omp parallel
	{
		float *x = malloc((size_t)ne0 * sizeof *x), *d = malloc((size_t)ne0 * sizeof *d);
		float *one = imp ? NULL : malloc((size_t)ne0 * sizeof *one);
		void *q = malloc((size_t)ne0 * sizeof(float));
		if (!x || !d || !q || (!imp && !one)) {
			#pragma omp atomic write
			oom = 1;
		} else {
			if (one)
				for (int64_t j = 0; j < ne0; j++)
					one[j] = 1;
			#pragma omp for schedule(dynamic, 4)
			for (int64_t k = 0; k < K; k++) {
				/* evenly spaced rows, the same ones whatever the threads */
				int64_t r = (int64_t)((double)k * (double)R / (double)K);
				int64_t mat = r / per_mat;
				const float *w = imp ? imp + mat * ne0 : one;
				double mw = mat_weight ? mat_weight[mat] : 1.0;
				rows(user, r, x);
				double s = 0;
				for (int64_t j = 0; j < ne0; j++)
					s += (double)w[j] * x[j] * x[j];
				e[k * (nc + 1) + nc] = mw * s;
				for (int c = 0; c < nc; c++) {
					if (quant_imp && imp)
						mcv_quantize_row_imatrix(t->cand[c], x, q, ne0, w);
					else
						mcv_quantize_row_ref(t->cand[c], x, q, ne0);
					mcv_dequantize_row(t->cand[c], q, d, ne0);
					double a = 0;
					for (int64_t j = 0; j < ne0; j++) {
						double df = (double)x[j] - d[j];
						a += (double)w[j] * df * df;
					}
					e[k * (nc + 1) + c] = mw * a;
				}
			}
		}
		free(x);
		free(d);
		free(one);
		free(q);
	}
	if (oom) {
		free(e);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	double sum[MCV_ALLOC_MAX_CAND + 1] = { 0 };
	for (int64_t k = 0; k < K; k++)
		for (int c = 0; c <= nc; c++)
			sum[c] += e[k * (nc + 1) + c];
	for (int c = 0; c < nc; c++)
		t->loss[c] = sum[nc] > 0 ? sum[c] / sum[nc] : 0;
	free(e);
	return 0;
}

double mcv_alloc_bytes(const mcv_alloc_tensor *t)
{
	if (t->fixed_type >= 0) {
		int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
		return (double)mcv_row_bytes(t->fixed_type, t->ne[0]) * (double)rows;
	}
	return t->choice >= 0 ? t->bytes[t->choice] : 0;
}

typedef struct totals { double bytes, ebytes, loss; } totals;

static totals pick(mcv_alloc_tensor *t, int n, double lam, double mu, double fixed)
{
	totals s = { fixed, 0, 0 };
	for (int i = 0; i < n; i++) {
		if (t[i].fixed_type >= 0)
			continue;
		int best = 0;
		double bv = INFINITY;
		for (int c = 0; c < t[i].n_cand; c++) {
			double v = t[i].loss[c] + lam * t[i].bytes[c] + mu * t[i].expert_share * t[i].bytes[c];
			/* ties go to the smaller type */
			if (v < bv || (v == bv && t[i].bytes[c] < t[i].bytes[best])) {
				bv = v;
				best = c;
			}
		}
		t[i].choice = best;
		s.bytes += t[i].bytes[best];
		s.ebytes += t[i].expert_share * t[i].bytes[best];
		s.loss += t[i].loss[best];
	}
	return s;
}

static int fits(const totals *s, const mcv_alloc_budget *b)
{
	return (b->max_bytes <= 0 || s->bytes <= b->max_bytes) &&
	       (b->max_expert_bytes_token <= 0 || s->ebytes <= b->max_expert_bytes_token);
}

/* Smallest lambda (log-bisection) whose choice meets the size budget. */
static double solve_lambda(mcv_alloc_tensor *t, int n, double mu, double fixed, double max_bytes)
{
	if (max_bytes <= 0)
		return 0;
	double lo = -60, hi = 10; /* log10 */
	totals s = pick(t, n, 0, mu, fixed);
	if (s.bytes <= max_bytes)
		return 0;
	for (int it = 0; it < 80; it++) {
		double mid = 0.5 * (lo + hi);
		s = pick(t, n, pow(10, mid), mu, fixed);
		if (s.bytes <= max_bytes)
			hi = mid;
		else
			lo = mid;
	}
	return pow(10, hi);
}

int mcv_alloc_solve(mcv_alloc_tensor *t, int n, const mcv_alloc_budget *b, mcv_error *err)
{
	double fixed = 0, minb = 0, mine = 0;
	for (int i = 0; i < n; i++) {
		t[i].choice = -1;
		if (t[i].fixed_type >= 0) {
			fixed += mcv_alloc_bytes(&t[i]);
			continue;
		}
		if (t[i].n_cand < 1)
			return mcv_error_set(err, MCV_EINVAL, "%s: no candidate type", t[i].name);
		double m = INFINITY;
		for (int c = 0; c < t[i].n_cand; c++)
			m = t[i].bytes[c] < m ? t[i].bytes[c] : m;
		minb += m;
		mine += t[i].expert_share * m;
	}
	if (b->max_bytes > 0 && fixed + minb > b->max_bytes)
		return mcv_error_set(err, MCV_EBUDGET,
				     "target of %.0f bytes cannot be met: the smallest types give %.0f bytes",
				     b->max_bytes, fixed + minb);
	if (b->max_expert_bytes_token > 0 && mine > b->max_expert_bytes_token)
		return mcv_error_set(err, MCV_EBUDGET,
				     "expert bytes per token of %.0f cannot be met: the smallest types give %.0f",
				     b->max_expert_bytes_token, mine);
	double mu = 0, lam = solve_lambda(t, n, 0, fixed, b->max_bytes);
	totals s = pick(t, n, lam, mu, fixed);
	if (!fits(&s, b)) {
		double lo = -60, hi = 10;
		for (int it = 0; it < 60; it++) {
			double mid = 0.5 * (lo + hi);
			double l = solve_lambda(t, n, pow(10, mid), fixed, b->max_bytes);
			s = pick(t, n, l, pow(10, mid), fixed);
			if (fits(&s, b))
				hi = mid;
			else
				lo = mid;
		}
		mu = pow(10, hi);
		lam = solve_lambda(t, n, mu, fixed, b->max_bytes);
		s = pick(t, n, lam, mu, fixed);
	}
	if (!fits(&s, b)) /* cannot happen: the smallest types fit */
		return mcv_error_set(err, MCV_EBUDGET, "no allocation meets the budgets");
	/* Greedy fill of the slack the relaxation leaves: the upgrade with the
	 * most loss saved per byte that still fits, until none does. */
	for (;;) {
		int bi = -1, bc = -1;
		double br = 0;
		for (int i = 0; i < n; i++) {
			if (t[i].fixed_type >= 0)
				continue;
			int c0 = t[i].choice;
			for (int c = 0; c < t[i].n_cand; c++) {
				double db = t[i].bytes[c] - t[i].bytes[c0], dl = t[i].loss[c0] - t[i].loss[c];
				if (db <= 0 || dl <= 0)
					continue;
				totals s2 = { s.bytes + db, s.ebytes + t[i].expert_share * db, 0 };
				if (!fits(&s2, b))
					continue;
				if (dl / db > br) {
					br = dl / db;
					bi = i;
					bc = c;
				}
			}
		}
		if (bi < 0)
			break;
		double db = t[bi].bytes[bc] - t[bi].bytes[t[bi].choice];
		s.bytes += db;
		s.ebytes += t[bi].expert_share * db;
		t[bi].choice = bc;
	}
	return 0;
}

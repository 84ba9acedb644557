/* Sampler chain; see sampler.h.
 *
 * Candidates are (id, logit) pairs.  Only the stages that are on touch them,
 * and top-k selects with a bounded heap, so the common settings never sort
 * the whole vocabulary; top-p without top-k sorts what min-p and top-k left. */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
	int32_t id;
	float logit;
} cand;

struct mcv_sampler {
	mcv_sampler_params p;
	int n_vocab;
	cand *c;
	int32_t *hist; /* ring of the last repeat_last_n tokens */
	int hist_cap, hist_n, hist_pos;
	uint8_t *seen; /* scratch: one flag per token */
	uint64_t rng[4];
};

mcv_sampler_params mcv_sampler_default_params(void)
{
	return (mcv_sampler_params){
		.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
		.repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0,
	};
}

/* xoshiro256** seeded through splitmix64. */
static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(mcv_sampler *s)
{
	uint64_t *r = s->rng, res = rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
	r[2] ^= r[0];
	r[3] ^= r[1];
	r[1] ^= r[2];
	r[0] ^= r[3];
	r[2] ^= t;
	r[3] = rotl(r[3], 45);
	return res;
}

double mcv_sampler_uniform(mcv_sampler *s)
{
	return (double)(next_u64(s) >> 11) * 0x1.0p-53;
}

void mcv_sampler_reset(mcv_sampler *s)
{
	uint64_t x = s->p.seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix(&x);
	s->hist_n = s->hist_pos = 0;
}

int mcv_sampler_init(mcv_sampler **out, const mcv_sampler_params *p, int n_vocab,
		     mcv_error *err)
{
	*out = NULL;
	if (n_vocab <= 0)
		return mcv_error_set(err, MCV_EINVAL, "vocabulary size %d", n_vocab);
	if (!(p->temp >= 0) || !isfinite(p->temp))
		return mcv_error_set(err, MCV_EINVAL, "temperature must be a number >= 0");
	if (!(p->top_p >= 0 && p->top_p <= 1))
		return mcv_error_set(err, MCV_EINVAL, "top-p must be in [0, 1]");
	if (!(p->min_p >= 0 && p->min_p <= 1))
		return mcv_error_set(err, MCV_EINVAL, "min-p must be in [0, 1]");
	if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty))
		return mcv_error_set(err, MCV_EINVAL, "repeat penalty must be a number > 0");
	if (p->repeat_last_n < -1)
		return mcv_error_set(err, MCV_EINVAL, "repeat-last-n must be >= -1");
	mcv_sampler *s = calloc(1, sizeof *s);
	if (!s)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	s->p = *p;
	s->n_vocab = n_vocab;
	s->hist_cap = p->repeat_last_n < 0 ? 1 << 20 : p->repeat_last_n;
	s->c = malloc((size_t)n_vocab * sizeof *s->c);
	s->seen = calloc((size_t)n_vocab, 1);
	s->hist = malloc((size_t)(s->hist_cap ? s->hist_cap : 1) * sizeof *s->hist);
	if (!s->c || !s->seen || !s->hist) {
		mcv_sampler_free(s);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for a sampler of %d tokens", n_vocab);
	}
	mcv_sampler_reset(s);
	*out = s;
	return 0;
}

void mcv_sampler_free(mcv_sampler *s)
{
	if (!s)
		return;
	free(s->c);
	free(s->seen);
	free(s->hist);
	free(s);
}

void mcv_sampler_accept(mcv_sampler *s, int32_t token)
{
	if (s->hist_cap == 0)
		return;
	s->hist[s->hist_pos] = token;
	s->hist_pos = (s->hist_pos + 1) % s->hist_cap;
	if (s->hist_n < s->hist_cap)
		s->hist_n++;
}

/* Higher logit first, then lower id: a total order, so ties are stable. */
static bool better(cand a, cand b)
{
	return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int cmp_cand(const void *x, const void *y)
{
	cand a = *(const cand *)x, b = *(const cand *)y;
	return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Keep the k best of c[0..n) in c[0..k), sorted best first. */
static int top_k(cand *c, int n, int k)
{
	if (k <= 0 || k >= n) {
		qsort(c, (size_t)n, sizeof *c, cmp_cand);
		return n;
	}
	/* min-heap of the k best so far, the worst at the root */
	for (int i = k / 2 - 1; i >= 0; i--) {
		for (int j = i;;) {
			int l = 2 * j + 1, m = j;
			if (l < k && better(c[m], c[l])) m = l;
			if (l + 1 < k && better(c[m], c[l + 1])) m = l + 1;
			if (m == j) break;
			cand t = c[j]; c[j] = c[m]; c[m] = t;
			j = m;
		}
	}
	for (int i = k; i < n; i++) {
		if (!better(c[i], c[0]))
			continue;
		c[0] = c[i];
		for (int j = 0;;) {
			int l = 2 * j + 1, m = j;
			if (l < k && better(c[m], c[l])) m = l;
			if (l + 1 < k && better(c[m], c[l + 1])) m = l + 1;
			if (m == j) break;
			cand t = c[j]; c[j] = c[m]; c[m] = t;
			j = m;
		}
	}
	qsort(c, (size_t)k, sizeof *c, cmp_cand);
	return k;
}

int32_t mcv_sampler_sample(mcv_sampler *s, const float *logits)
{
	const mcv_sampler_params *p = &s->p;
	int n = s->n_vocab;
	cand *c = s->c;
	for (int i = 0; i < n; i++)
		c[i] = (cand){ i, logits[i] };
	/* NaN logits would poison every comparison; treat them as impossible. */
	for (int i = 0; i < n; i++)
		if (isnan(c[i].logit))
			c[i].logit = -INFINITY;

	if (p->repeat_penalty != 1.0f && s->hist_n > 0) {
		for (int i = 0; i < s->hist_n; i++) {
			int32_t t = s->hist[i];
			if (t < 0 || t >= n || s->seen[t])
				continue;
			s->seen[t] = 1;
			float *l = &c[t].logit;
			*l = *l <= 0 ? *l * p->repeat_penalty : *l / p->repeat_penalty;
		}
		for (int i = 0; i < s->hist_n; i++)
			if (s->hist[i] >= 0 && s->hist[i] < n)
				s->seen[s->hist[i]] = 0;
	}

	if (p->temp <= 0) {
		int best = 0;
		for (int i = 1; i < n; i++)
			if (c[i].logit > c[best].logit)
				best = i;
		return c[best].id;
	}

	bool sorted = false;
	if (p->top_k > 0 && p->top_k < n) {
		n = top_k(c, n, p->top_k);
		sorted = true;
	}
	if (p->top_p < 1.0f) {
		if (!sorted)
			n = top_k(c, n, 0);
		sorted = true;
		double mx = c[0].logit, sum = 0;
		for (int i = 0; i < n; i++)
			sum += exp((double)c[i].logit - mx);
		double cum = 0;
		for (int i = 0; i < n; i++) {
			cum += exp((double)c[i].logit - mx) / sum;
			if (cum >= p->top_p) {
				n = i + 1;
				break;
			}
		}
	}
	if (p->min_p > 0.0f) {
		float mx = -INFINITY;
		for (int i = 0; i < n; i++)
			if (c[i].logit > mx)
				mx = c[i].logit;
		float cut = mx + logf(p->min_p);
		int m = 0;
		for (int i = 0; i < n; i++)
			if (c[i].logit >= cut)
				c[m++] = c[i];
		n = m > 0 ? m : 1;
	}
	/* temperature, then a draw from the softmax */
	double mx = -INFINITY;
	for (int i = 0; i < n; i++)
		if (c[i].logit > mx)
			mx = c[i].logit;
	if (mx == -INFINITY)
		return c[0].id; /* every token forbidden: nothing sensible to draw */
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += exp(((double)c[i].logit - mx) / p->temp);
	double u = mcv_sampler_uniform(s) * sum, cum = 0;
	for (int i = 0; i < n; i++) {
		cum += exp(((double)c[i].logit - mx) / p->temp);
		if (u < cum)
			return c[i].id;
	}
	/* rounding left u at the very top: the last candidate with mass */
	for (int i = n - 1; i > 0; i--)
		if (c[i].logit > -INFINITY)
			return c[i].id;
	return c[0].id;
}

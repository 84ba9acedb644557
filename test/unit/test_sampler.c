/* Sampler: greedy and its edge cases, each filter's effect on the drawn
 * distribution (fixed seeds, many draws, tolerance from the binomial
 * standard deviation), repetition penalty, determinism, bad parameters. */
#include "sampler.h"
#include "unit.h"

#include <math.h>
#include <string.h>

#define NDRAW 40000

static mcv_sampler *mk(mcv_sampler_params p, int n)
{
	mcv_sampler *s = NULL;
	mcv_error err;
	int rc = mcv_sampler_init(&s, &p, n, &err);
	CHECK(rc == 0, "init: %s", err.msg);
	if (rc)
		exit(unit_done("sampler"));
	return s;
}

static mcv_sampler_params plain(float temp)
{
	mcv_sampler_params p = mcv_sampler_default_params();
	p.temp = temp;
	p.top_k = 0;
	p.top_p = 1;
	p.min_p = 0;
	return p;
}

/* Draw NDRAW tokens and compare frequencies with want[] (probabilities). */
static void check_dist(mcv_sampler_params p, const float *logits, const double *want, int n, const char *what)
{
	mcv_sampler *s = mk(p, n);
	int cnt[16] = { 0 }, outside = 0;
	for (int i = 0; i < NDRAW; i++) {
		int32_t t = mcv_sampler_sample(s, logits);
		if (t >= 0 && t < n)
			cnt[t]++;
		else
			outside++;
	}
	CHECK(outside == 0, "%s: %d tokens out of range", what, outside);
	for (int i = 0; i < n; i++) {
		double f = (double)cnt[i] / NDRAW, sd = sqrt(want[i] * (1 - want[i]) / NDRAW);
		CHECK(fabs(f - want[i]) <= 5 * sd + 1e-9, "%s: token %d drawn %.4f, want %.4f", what, i, f, want[i]);
	}
	mcv_sampler_free(s);
}

int main(void)
{
	const double pr[4] = { 0.1, 0.2, 0.3, 0.4 };
	float lg[4];
	for (int i = 0; i < 4; i++)
		lg[i] = (float)log(pr[i]) + 3.0f; /* a shift must not matter */

	/* greedy */
	mcv_sampler *s = mk(plain(0), 4);
	CHECK(mcv_sampler_sample(s, lg) == 3, "greedy picks the highest logit");
	float tie[4] = { 1, 5, 5, 2 };
	CHECK(mcv_sampler_sample(s, tie) == 1, "greedy breaks ties by the lowest id");
	mcv_sampler_free(s);

	/* plain softmax at temperature 1 and 2 */
	check_dist(plain(1), lg, pr, 4, "temp 1");
	double t2[4], z = 0;
	for (int i = 0; i < 4; i++)
		z += t2[i] = sqrt(pr[i]);
	for (int i = 0; i < 4; i++)
		t2[i] /= z;
	check_dist(plain(2), lg, t2, 4, "temp 2");

	/* top-k 2 renormalises over the two best; top-k 1 is greedy */
	mcv_sampler_params p = plain(1);
	p.top_k = 2;
	const double k2[4] = { 0, 0, 3.0 / 7, 4.0 / 7 };
	check_dist(p, lg, k2, 4, "top-k 2");
	p.top_k = 1;
	const double k1[4] = { 0, 0, 0, 1 };
	check_dist(p, lg, k1, 4, "top-k 1");

	/* top-p: 0.4 + 0.3 >= 0.5 keeps two; a tiny top-p keeps one */
	p = plain(1);
	p.top_p = 0.5f;
	check_dist(p, lg, k2, 4, "top-p 0.5");
	p.top_p = 1e-6f;
	check_dist(p, lg, k1, 4, "top-p tiny");
	p.top_p = 0;
	check_dist(p, lg, k1, 4, "top-p 0");

	/* min-p 0.6: only tokens with p >= 0.6 * 0.4 = 0.24 survive */
	p = plain(1);
	p.min_p = 0.6f;
	check_dist(p, lg, k2, 4, "min-p 0.6");

	/* ties in top-k: equal logits, the lower ids are kept */
	float flat[4] = { 0, 0, 0, 0 };
	p = plain(1);
	p.top_k = 2;
	const double half[4] = { 0.5, 0.5, 0, 0 };
	check_dist(p, flat, half, 4, "top-k on ties");

	/* repetition penalty: positive logits are divided, negative multiplied */
	float rp[3] = { 2.0f, 1.5f, -1.0f };
	p = plain(0);
	p.repeat_penalty = 2.0f;
	p.repeat_last_n = 2;
	s = mk(p, 3);
	CHECK(mcv_sampler_sample(s, rp) == 0, "no history: no penalty");
	mcv_sampler_accept(s, 0);
	CHECK(mcv_sampler_sample(s, rp) == 1, "penalised token 0 (2.0 -> 1.0) loses to 1.5");
	mcv_sampler_accept(s, 2);
	mcv_sampler_accept(s, 2);
	CHECK(mcv_sampler_sample(s, rp) == 0, "token 0 left the 2-token window");
	mcv_sampler_accept(s, 1);
	float rn[3] = { -1.0f, -1.5f, -3.0f };
	CHECK(mcv_sampler_sample(s, rn) == 0, "token 1 (-1.5 -> -3.0) and 2 (-3 -> -6) stay below 0");
	mcv_sampler_free(s);
	/* a penalty applies once per distinct token, however often it repeats */
	p.repeat_last_n = 8;
	s = mk(p, 3);
	for (int i = 0; i < 5; i++)
		mcv_sampler_accept(s, 0);
	float rq[3] = { 4.0f, 1.9f, 0 };
	CHECK(mcv_sampler_sample(s, rq) == 0, "4 / 2 = 2 still beats 1.9");
	mcv_sampler_free(s);

	/* determinism: same seed same tokens, another seed other tokens */
	float wide[64];
	for (int i = 0; i < 64; i++)
		wide[i] = (float)((i * 37) % 64) / 16.0f;
	p = mcv_sampler_default_params();
	p.seed = 42;
	mcv_sampler *a = mk(p, 64), *b = mk(p, 64);
	p.seed = 43;
	mcv_sampler *c = mk(p, 64);
	int same_ab = 1, same_ac = 1;
	int32_t first[100];
	for (int i = 0; i < 100; i++) {
		int32_t x = mcv_sampler_sample(a, wide), y = mcv_sampler_sample(b, wide), w = mcv_sampler_sample(c, wide);
		first[i] = x;
		same_ab &= x == y;
		same_ac &= x == w;
	}
	CHECK(same_ab, "same seed gave different tokens");
	CHECK(!same_ac, "seeds 42 and 43 gave the same 100 tokens");
	mcv_sampler_reset(a);
	int again = 1;
	for (int i = 0; i < 100; i++)
		again &= mcv_sampler_sample(a, wide) == first[i];
	CHECK(again, "reset does not replay the seed");
	mcv_sampler_free(a);
	mcv_sampler_free(b);
	mcv_sampler_free(c);

	/* uniform draws stay in [0, 1) and have mean 1/2 */
	s = mk(plain(1), 4);
	double m = 0;
	int inside = 1;
	for (int i = 0; i < NDRAW; i++) {
		double u = mcv_sampler_uniform(s);
		inside &= u >= 0 && u < 1;
		m += u;
	}
	CHECK(inside, "uniform draw outside [0, 1)");
	CHECK(fabs(m / NDRAW - 0.5) < 5 * sqrt(1.0 / 12 / NDRAW), "uniform mean %.4f", m / NDRAW);
	/* NaN and -inf logits never get drawn and never crash */
	float bad[4] = { NAN, -INFINITY, 1.0f, NAN };
	int ok = 1;
	for (int i = 0; i < 100; i++)
		ok &= mcv_sampler_sample(s, bad) == 2;
	CHECK(ok, "NaN or -inf logit drawn");
	mcv_sampler_free(s);

	/* bad parameters */
	mcv_error err;
	mcv_sampler *x = NULL;
	p = mcv_sampler_default_params();
	p.temp = -1;
	CHECK(mcv_sampler_init(&x, &p, 4, &err) == MCV_EINVAL, "negative temperature accepted");
	p = mcv_sampler_default_params();
	p.top_p = 1.5f;
	CHECK(mcv_sampler_init(&x, &p, 4, &err) == MCV_EINVAL, "top-p 1.5 accepted");
	p = mcv_sampler_default_params();
	p.min_p = NAN;
	CHECK(mcv_sampler_init(&x, &p, 4, &err) == MCV_EINVAL, "NaN min-p accepted");
	p = mcv_sampler_default_params();
	CHECK(mcv_sampler_init(&x, &p, 0, &err) == MCV_EINVAL, "empty vocabulary accepted");
	return unit_done("sampler");
}

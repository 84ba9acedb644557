/* Scale searches for the K-quants, reproducing ggml's arithmetic exactly.
 *
 * Every expression below keeps ggml's association order ((w*x)*l, not
 * w*(x*l)) and its int->float conversion points, and the build must not
 * contract a*b+c into an FMA (gcc: -std=c11 implies -ffp-contract=off):
 * otherwise a tie between two candidate scales can go the other way and a
 * whole sub-block gets different levels. */
#include "ref_fit.h"

#include <math.h>

static inline int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* Index of the largest |x|, first one on ties; the signed value is what the
 * symmetric fits divide by, so the sign of the extreme picks the direction of
 * the asymmetric level range. */
static float signed_absmax(int n, const float *x, float *amax_out)
{
	float amax = 0, max = 0;
	for (int i = 0; i < n; i++) {
		float a = fabsf(x[i]);
		if (a > amax) {
			amax = a;
			max = x[i];
		}
	}
	*amax_out = amax;
	return max;
}

/* sum w*x*l and sum w*l*l for levels taken at inverse scale iscale. */
static void symmetric_sums(int n, int nmax, const float *x, const float *w,
			   float iscale, int8_t *L, float *sumlx, float *suml2)
{
	float slx = 0, sl2 = 0;
	for (int i = 0; i < n; i++) {
		int l = clampi(mcv_nearest_int(iscale * x[i]), -nmax, nmax - 1);
		if (L)
			L[i] = (int8_t)(l + nmax);
		float wi = w ? w[i] : x[i] * x[i];
		slx += wi * x[i] * l;
		sl2 += wi * l * l;
	}
	*sumlx = slx;
	*suml2 = sl2;
}

float mcv_fit_symmetric(int n, int nmax, const float *x, int8_t *L, const float *w)
{
	float amax, max = signed_absmax(n, x, &amax);
	if (amax < MCV_GROUP_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	float sumlx, suml2;
	symmetric_sums(n, nmax, x, w, -nmax / max, L, &sumlx, &suml2);
	float scale = suml2 ? sumlx / suml2 : 0.0f;
	float best = scale * sumlx;
	for (int is = -9; is <= 9; is++) {
		if (!is)
			continue;
		float iscale = -(nmax + 0.1f * is) / max;
		symmetric_sums(n, nmax, x, w, iscale, NULL, &sumlx, &suml2);
		/* Compare sumlx^2/suml2 without dividing, as ggml does. */
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			symmetric_sums(n, nmax, x, w, iscale, L, &sumlx, &suml2);
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

float mcv_fit_q3(int n, int nmax, const float *x, int8_t *L)
{
	float amax, max = signed_absmax(n, x, &amax);
	if (amax < MCV_GROUP_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	float iscale = -nmax / max;
	float sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; i++) {
		int l = clampi(mcv_nearest_int(iscale * x[i]), -nmax, nmax - 1);
		L[i] = (int8_t)l;
		float w = x[i] * x[i];
		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	/* Move one level at a time to its best value given all the others; keep
	 * the move only if sumlx^2/suml2 (the error reduction) grows. */
	for (int itry = 0; itry < 5; itry++) {
		int changed = 0;
		for (int i = 0; i < n; i++) {
			float w = x[i] * x[i];
			float slx = sumlx - w * x[i] * L[i];
			if (!(slx > 0))
				continue;
			float sl2 = suml2 - w * L[i] * L[i];
			int nl = clampi(mcv_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
			if (nl == L[i])
				continue;
			slx += w * x[i] * nl;
			sl2 += w * nl * nl;
			if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
				L[i] = (int8_t)nl;
				sumlx = slx;
				suml2 = sl2;
				changed++;
			}
		}
		if (!changed)
			break;
	}
	for (int i = 0; i < n; i++)
		L[i] = (int8_t)(L[i] + nmax);
	return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Weighted error of x ~ scale*l + min (min <= 0 here). */
static float affine_error(int n, const float *x, const float *w, const uint8_t *L,
			  float scale, float min, int use_mad, int wx2)
{
	float err = 0;
	for (int i = 0; i < n; i++) {
		float diff = scale * L[i] + min - x[i];
		diff = use_mad ? fabsf(diff) : diff * diff;
		float wi = wx2 ? x[i] * x[i] : w[i];
		err += wi * diff;
	}
	return err;
}

/* Shared body of the two affine fits; `guarded` selects make_qkx3_quants'
 * treatment of the level (clip before rounding) and of w == NULL. */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L,
			float *neg_min, uint8_t *Laux, float rmin, float rdelta,
			int nstep, int use_mad, int guarded)
{
	int wx2 = guarded && !w; /* weights default to x^2 */
	float min = x[0], max = x[0];
	float sum_w = wx2 ? x[0] * x[0] : w[0];
	float sum_x = sum_w * x[0];
	for (int i = 1; i < n; i++) {
		if (x[i] < min)
			min = x[i];
		if (x[i] > max)
			max = x[i];
		float wi = wx2 ? x[i] * x[i] : w[i];
		sum_w += wi;
		sum_x += wi * x[i];
	}
	if (min > 0)
		min = 0;
	if (guarded ? max <= min : max == min) {
		memset(L, 0, (size_t)n);
		*neg_min = -min;
		return 0.f;
	}
	float iscale = nmax / (max - min);
	float scale = 1 / iscale;
	for (int i = 0; i < n; i++)
		L[i] = (uint8_t)clampi(mcv_nearest_int(iscale * (x[i] - min)), 0, nmax);
	float best = affine_error(n, x, w, L, scale, min, use_mad, wx2);
	if (nstep < 1) {
		*neg_min = -min;
		return scale;
	}
	for (int is = 0; is <= nstep; is++) {
		iscale = (rmin + rdelta * is + nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		for (int i = 0; i < n; i++) {
			int l;
			if (guarded) {
				/* min may sit at max: v can be inf or NaN. */
				float v = iscale * (x[i] - min);
				l = v > 0 ? mcv_nearest_int(v < nmax ? v : (float)nmax) : 0;
			} else {
				l = clampi(mcv_nearest_int(iscale * (x[i] - min)), 0, nmax);
			}
			Laux[i] = (uint8_t)l;
			float wi = wx2 ? x[i] * x[i] : w[i];
			sum_l += wi * l;
			sum_l2 += wi * l * l;
			sum_xl += wi * l * x[i];
		}
		/* Weighted least squares for (scale, min) given the levels. */
		float D = sum_w * sum_l2 - sum_l * sum_l;
		if (!(D > 0))
			continue;
		float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
		float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
		if (this_min > 0) {
			this_min = 0;
			this_scale = sum_xl / sum_l2;
		}
		float err = affine_error(n, x, w, Laux, this_scale, this_min, use_mad, wx2);
		if (err < best) {
			memcpy(L, Laux, (size_t)n);
			best = err;
			scale = this_scale;
			min = this_min;
		}
	}
	*neg_min = -min;
	return scale;
}

float mcv_fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L,
		     float *neg_min, uint8_t *Laux, float rmin, float rdelta,
		     int nstep, int use_mad)
{
	return fit_affine(n, nmax, x, w, L, neg_min, Laux, rmin, rdelta, nstep, use_mad, 0);
}

float mcv_fit_affine_guarded(int n, int nmax, const float *x, const float *w,
			     uint8_t *L, float *neg_min, uint8_t *Laux, float rmin,
			     float rdelta, int nstep, int use_mad)
{
	return fit_affine(n, nmax, x, w, L, neg_min, Laux, rmin, rdelta, nstep, use_mad, 1);
}

float mcv_fit_positive(int n, int nmax, const float *x, uint8_t *L, const float *w)
{
	float max = 0;
	for (int i = 0; i < n; i++)
		max = max > x[i] ? max : x[i];
	if (max < MCV_GROUP_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	float iscale = nmax / max;
	float scale = 1 / iscale;
	float best = 0;
	for (int i = 0; i < n; i++) {
		/* No clamp here, as in ggml: levels only seed the error. */
		L[i] = (uint8_t)mcv_nearest_int(iscale * x[i]);
		float diff = x[i] - scale * L[i];
		best += w[i] * diff * diff;
	}
	for (int is = -4; is <= 4; is++) {
		if (!is)
			continue;
		float iscale_is = (0.1f * is + nmax) / max;
		float scale_is = 1 / iscale_is;
		float mse = 0;
		for (int i = 0; i < n; i++) {
			int l = mcv_nearest_int(iscale_is * x[i]);
			l = l < nmax ? l : nmax;
			float diff = x[i] - scale_is * l;
			mse += w[i] * diff * diff;
		}
		if (mse < best) {
			best = mse;
			iscale = iscale_is;
		}
	}
	float sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; i++) {
		int l = mcv_nearest_int(iscale * x[i]);
		l = l < nmax ? l : nmax;
		L[i] = (uint8_t)l;
		sumlx += w[i] * x[i] * l;
		suml2 += w[i] * l * l;
	}
	for (int itry = 0; itry < 5; itry++) {
		int changed = 0;
		for (int i = 0; i < n; i++) {
			float slx = sumlx - w[i] * x[i] * L[i];
			float sl2 = suml2 - w[i] * L[i] * L[i];
			if (!(slx > 0 && sl2 > 0))
				continue;
			int nl = mcv_nearest_int(x[i] * sl2 / slx);
			nl = nl < nmax ? nl : nmax;
			if (nl == L[i])
				continue;
			slx += w[i] * x[i] * nl;
			sl2 += w[i] * nl * nl;
			if (slx * slx * suml2 > sumlx * sumlx * sl2) {
				L[i] = (uint8_t)nl;
				sumlx = slx;
				suml2 = sl2;
				changed++;
			}
		}
		if (!changed)
			break;
	}
	return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

void mcv_k4_pack_scale_min(uint8_t *q, int j, uint8_t sc, uint8_t m)
{
	if (j < 4) {
		q[j] = sc;
		q[j + 4] = m;
	} else {
		q[j + 4] = (uint8_t)((sc & 0xF) | ((m & 0xF) << 4));
		q[j - 4] |= (uint8_t)((sc >> 4) << 6);
		q[j] |= (uint8_t)((m >> 4) << 6);
	}
}

void mcv_q3_pack_scale(uint8_t *q, int j, int biased)
{
	if (j < 8)
		q[j] = (uint8_t)(biased & 0xF);
	else
		q[j - 8] |= (uint8_t)((biased & 0xF) << 4);
	q[8 + j % 4] |= (uint8_t)((biased >> 4) << (2 * (j / 4)));
}

/* Four 2-bit levels per byte: byte l of each 32-byte group holds elements
 * l, l+32, l+64, l+96 of its 128-element half. */
void mcv_pack_q2_levels(uint8_t *qs, const uint8_t *L)
{
	for (int j = 0; j < 256; j += 128)
		for (int l = 0; l < 32; l++)
			qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) |
						  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

void mcv_pack_q3_levels(uint8_t *hmask, uint8_t *qs, int8_t *L)
{
	/* Bit b of hmask[m] is the high bit of element 32*b + m. */
	memset(hmask, 0, 32);
	for (int j = 0; j < 256; j++) {
		if (L[j] > 3) {
			hmask[j % 32] |= (uint8_t)(1u << (j / 32));
			L[j] = (int8_t)(L[j] - 4);
		}
	}
	mcv_pack_q2_levels(qs, (const uint8_t *)L);
}

void mcv_pack_q4_levels(uint8_t *qs, const uint8_t *L)
{
	for (int j = 0; j < 256; j += 64, qs += 32)
		for (int l = 0; l < 32; l++)
			qs[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

void mcv_pack_q5_levels(uint8_t *qh, uint8_t *qs, const uint8_t *L)
{
	/* Chunk c (64 elements) puts its two 32-halves' fifth bits at bits 2c
	 * and 2c+1 of qh[l]. */
	memset(qh, 0, 32);
	for (int c = 0; c < 4; c++, qs += 32) {
		for (int l = 0; l < 32; l++) {
			int a = L[64 * c + l], b = L[64 * c + l + 32];
			if (a > 15) {
				a -= 16;
				qh[l] |= (uint8_t)(1u << (2 * c));
			}
			if (b > 15) {
				b -= 16;
				qh[l] |= (uint8_t)(2u << (2 * c));
			}
			qs[l] = (uint8_t)(a | (b << 4));
		}
	}
}

void mcv_pack_q6_levels(uint8_t *ql, uint8_t *qh, const int8_t *L)
{
	for (int j = 0; j < 256; j += 128, ql += 64, qh += 32) {
		const int8_t *p = L + j;
		for (int l = 0; l < 32; l++) {
			ql[l] = (uint8_t)((p[l] & 0xF) | ((p[l + 64] & 0xF) << 4));
			ql[l + 32] = (uint8_t)((p[l + 32] & 0xF) | ((p[l + 96] & 0xF) << 4));
			qh[l] = (uint8_t)(((p[l] >> 4) & 3) | (((p[l + 32] >> 4) & 3) << 2) |
					  (((p[l + 64] >> 4) & 3) << 4) | (((p[l + 96] >> 4) & 3) << 6));
		}
	}
}

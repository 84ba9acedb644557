/* Internal to quant/: the scale-search routines shared by the reference
 * K-quant quantizers (ref_kquants.c) and the importance-weighted ones
 * (imatrix.c).  Each one reproduces a ggml routine's arithmetic step for step
 * (named in its comment), because bit-exact output needs the same float
 * operations in the same order, not just the same idea. */
#ifndef MCV_REF_FIT_H
#define MCV_REF_FIT_H

#include <stdint.h>
#include <string.h>

/* Bit-exactness needs plain IEEE single precision: no -ffast-math, and no
 * contraction of a*b+c into an FMA (which -march=native makes available and
 * gnu11 or clang would otherwise apply).  Include this header first so the
 * pragma covers every function of the file. */
#ifdef __FAST_MATH__
#error "quant/ref_*.c must not be built with -ffast-math (ggml bit-exactness)"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Below this a group counts as all zero (ggml's GROUP_MAX_EPS). */
#define MCV_GROUP_EPS 1e-15f

/* Round to nearest, ties to even, by adding 1.5*2^23 and reading the low
 * mantissa bits (ggml's nearest_int).  Kept as this trick rather than lrintf
 * because the callers sometimes feed it out-of-range values (a tiny divisor)
 * and then clamp: the trick's wrapped result is what ggml clamps, so we must
 * produce the same wrapped value. */
static inline int mcv_nearest_int(float v)
{
	float t = v + 12582912.f;
	int32_t i;
	memcpy(&i, &t, sizeof i);
	return (i & 0x007fffff) - 0x00400000;
}

/* Symmetric scale for signed levels -nmax..nmax-1 minimising
 * sum w*(x - scale*l)^2, trying 19 candidate inverse scales around nmax/max
 * (ggml's make_qx_quants with rmse_type 1).  w NULL means w = x^2.
 * L receives l + nmax.  Returns the scale. */
float mcv_fit_symmetric(int n, int nmax, const float *x, int8_t *L, const float *w);

/* Q3_K's symmetric fit with w = x^2 and a coordinate-descent refinement of
 * single levels (ggml's make_q3_quants, do_rmse true).  L receives l + nmax. */
float mcv_fit_q3(int n, int nmax, const float *x, int8_t *L);

/* Affine fit x ~ scale*l - min, l in 0..nmax, min >= 0, with weights w, trying
 * nstep+1 inverse scales (rmin + rdelta*k + nmax)/(max - min) and a weighted
 * least-squares solve for each (ggml's make_qkx2_quants).  use_mad selects
 * absolute instead of squared error.  Laux is n bytes of scratch.  *neg_min
 * receives the offset as a non-negative number. */
float mcv_fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L,
		     float *neg_min, uint8_t *Laux, float rmin, float rdelta,
		     int nstep, int use_mad);

/* As mcv_fit_affine, guarded against the non-finite level values a fitted
 * min near max produces; w NULL means w = x^2 (ggml's make_qkx3_quants). */
float mcv_fit_affine_guarded(int n, int nmax, const float *x, const float *w,
			     uint8_t *L, float *neg_min, uint8_t *Laux, float rmin,
			     float rdelta, int nstep, int use_mad);

/* Scale for non-negative values (the sub-block scales and mins) on levels
 * 0..nmax with weights w, tried at 9 inverse scales and refined level by level
 * (ggml's make_qp_quants). */
float mcv_fit_positive(int n, int nmax, const float *x, uint8_t *L, const float *w);

/* The 12-byte packing of eight 6-bit (scale, min) pairs of Q4_K/Q5_K: pairs
 * 0..3 in the low 6 bits of bytes 0..3 / 4..7; pairs 4..7 keep their low
 * nibbles in bytes 8..11 and their top 2 bits in the spare top bits of bytes
 * 0..7.  pack assumes q was zeroed for j < 4 first and is called in order. */
void mcv_k4_pack_scale_min(uint8_t *q, int j, uint8_t sc, uint8_t m);
static inline void mcv_k4_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

/* Q3_K's 12-byte packing of sixteen 6-bit scales (stored biased by 32):
 * low nibbles of 0..7 in bytes 0..7 low, of 8..15 in bytes 0..7 high, the top
 * 2 bits of scale j in byte 8 + j%4 at bit 2*(j/4).  pack ORs into a zeroed q. */
void mcv_q3_pack_scale(uint8_t *q, int j, int biased);
static inline int mcv_q3_scale(const uint8_t *q, int j)
{
	int lo = j < 8 ? q[j] & 0xF : q[j - 8] >> 4;
	int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
	return (lo | (hi << 4)) - 32;
}

/* Bit packing shared by the reference and imatrix quantizers. */
void mcv_pack_q2_levels(uint8_t *qs, const uint8_t *L);      /* 256 levels 0..3 */
void mcv_pack_q3_levels(uint8_t *hmask, uint8_t *qs, int8_t *L); /* 0..7, L clobbered */
void mcv_pack_q4_levels(uint8_t *qs, const uint8_t *L);      /* 0..15 */
void mcv_pack_q5_levels(uint8_t *qh, uint8_t *qs, const uint8_t *L); /* 0..31 */
void mcv_pack_q6_levels(uint8_t *ql, uint8_t *qh, const int8_t *L);  /* 0..63 */

#endif

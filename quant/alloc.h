/* Sensitivity-driven per-tensor type allocation.
 *
 * Each candidate tensor gets an estimated loss for each candidate type: the
 * importance-weighted squared quantization error  sum_c imp[c] (w - q(w))^2
 * over its rows, divided by  sum_c imp[c] w^2  (the relative error of the
 * matrix's output under the diagonal approximation E[x_c x_d] ~ 0), where
 * imp is the importance matrix (mean squared input activation per channel;
 * per expert for expert tensors, with each expert weighted by how often the
 * router chose it), or 1 without one.  The allocator then minimises the sum
 * of these losses under a total-size budget and, optionally, a budget on the
 * expert bytes one token must read (the routed experts' share k/E of each
 * routed expert tensor plus every shared-expert tensor): a Lagrangian
 * relaxation over the lower convex hull of each tensor's (bytes, loss)
 * points, then a greedy fill of what budget is left by loss saved per byte. */
#ifndef MCV_ALLOC_H
#define MCV_ALLOC_H

#include "mcv.h"
#include <stdint.h>

#define MCV_ALLOC_MAX_CAND 8

typedef struct mcv_alloc_tensor {
	const char *name;
	int64_t ne[4];
	int fixed_type;   /* >= 0: not allocated; keeps this type */
	double expert_share; /* fraction of its bytes one token reads per layer (k/E, 1 shexp, 0 other) */
	int n_cand;
	int cand[MCV_ALLOC_MAX_CAND];
	double loss[MCV_ALLOC_MAX_CAND];
	double bytes[MCV_ALLOC_MAX_CAND];
	int choice;       /* out: index into cand (fixed: -1) */
} mcv_alloc_tensor;

typedef struct mcv_alloc_budget {
	double max_bytes;              /* all tensor data; <= 0: none */
	double max_expert_bytes_token; /* <= 0: none */
} mcv_alloc_budget;

/* The candidate types for rows of ne0: Q2_K Q3_K Q4_K Q5_K Q6_K Q8_0, each
 * replaced by llama.cpp's fallback where ne0 is not a multiple of 256
 * (Q4_0, Q4_0, Q5_0, Q5_1, Q8_0), duplicates removed.  Returns the count. */
int mcv_alloc_candidates(int64_t ne0, int *types);

/* Row source: float row r (0 .. ne1*ne2*ne3-1) of the tensor. */
typedef void (*mcv_alloc_row_fn)(void *user, int64_t row, float *out);

/* Fill t->loss and t->bytes for every candidate.  imp: [n_mat][ne0] or
 * NULL; mat_weight: [n_mat] relative use of each matrix or NULL (all 1);
 * quant_imp: quantize with the importance-weighted quantizer (as the output
 * will be).  At most max_rows rows (evenly spaced) are measured; the sums
 * are scaled to the whole tensor.  Threads over rows; the result does not
 * depend on the thread count. */
int mcv_alloc_measure(mcv_alloc_tensor *t, mcv_alloc_row_fn rows, void *user, const float *imp,
		      const float *mat_weight, int quant_imp, int64_t max_rows, mcv_error *err);

/* Choose t[i].choice for every non-fixed tensor.  MCV_EBUDGET when even the
 * smallest types do not fit (the message gives the smallest possible). */
int mcv_alloc_solve(mcv_alloc_tensor *t, int n, const mcv_alloc_budget *b, mcv_error *err);

/* Bytes of the data of tensor i under its choice (or fixed type). */
double mcv_alloc_bytes(const mcv_alloc_tensor *t);

#endif

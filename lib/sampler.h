/* Token sampling from logits.  The chain runs in llama.cpp's default order:
 * repetition penalty, top-k, top-p, min-p, temperature, then a draw from the
 * softmax.  Temperature <= 0 is greedy (the highest logit after the
 * penalty; the lowest id on ties).  Draws use the sampler's own PRNG, so a
 * seed gives the same tokens on every machine and thread count. */
#ifndef MCV_SAMPLER_H
#define MCV_SAMPLER_H

#include "mcv.h"
#include <stdint.h>

typedef struct mcv_sampler_params {
	float temp;           /* <= 0: greedy (default 0.8) */
	int top_k;            /* <= 0: off (default 40) */
	float top_p;          /* >= 1: off (default 0.95) */
	float min_p;          /* <= 0: off (default 0.05) */
	float repeat_penalty; /* 1: off (default 1) */
	int repeat_last_n;    /* tokens the penalty looks back at; 0 off, -1 all kept (default 64) */
	uint64_t seed;        /* default 0 */
} mcv_sampler_params;

typedef struct mcv_sampler mcv_sampler;

mcv_sampler_params mcv_sampler_default_params(void);
/* Fails with MCV_EINVAL for parameters out of range (negative temp or
 * penalty, top_p or min_p outside [0, 1]) and MCV_ENOMEM. */
int mcv_sampler_init(mcv_sampler **out, const mcv_sampler_params *p, int n_vocab,
		     mcv_error *err);
void mcv_sampler_free(mcv_sampler *s);
/* Forget the history and reseed. */
void mcv_sampler_reset(mcv_sampler *s);
/* Pick the next token from logits[n_vocab] (not modified). */
int32_t mcv_sampler_sample(mcv_sampler *s, const float *logits);
/* Record a token (prompt or generated) for the repetition penalty. */
void mcv_sampler_accept(mcv_sampler *s, int32_t token);
/* The PRNG alone, for tests: uniform in [0, 1). */
double mcv_sampler_uniform(mcv_sampler *s);

#endif

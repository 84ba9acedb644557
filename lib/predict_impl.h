/* Internals of the expert predictors shared by predict.c (router baseline,
 * file load/save, scoring) and predict_train.c (training).  Not public. */
#ifndef MCV_PREDICT_IMPL_H
#define MCV_PREDICT_IMPL_H

#include "gguf.h"
#include "predict.h"
#include "trace.h"

#define MCV_PREDICTOR_TYPE "mcv.predictor"
#define MCV_PREDICTOR_VERSION 1

enum { MCV_PRED_ROUTER = 0, MCV_PRED_TRAINED = 1 };

/* One map: with x = rmsnorm(h) * norm,
 *   scores = up (down x) + bias [+ hup relu(hdown x + hbias)]
 * the bracket only when the file has a hidden width (mcv.predictor.hidden). */
typedef struct mcv_pred_map {
	const float *norm; /* [H] */
	const float *down; /* [rank][H] */
	const float *up;   /* [E][rank] */
	const float *bias; /* [E] */
	const float *hdown; /* [hid][H], NULL without the ReLU branch */
	const float *hbias; /* [hid] */
	const float *hup;   /* [E][hid] */
} mcv_pred_map;

struct mcv_predictor {
	int kind;
	mcv_trace_model tm;  /* the model it belongs to */
	int H, E, L, D, rank, hid;
	float eps;
	const mcv_model *m;  /* router baseline */
	mcv_gguf *g;         /* trained, from a file: the maps point into it */
	float *own;          /* trained, built in memory: the maps point into it */
	mcv_pred_map *maps;  /* trained: [L][D], slot (l, d) = l * D + d - 1; unused when l + d >= L */
};

/* A trained predictor with zeroed parameters owned in memory (the trainer
 * fills them).  Map (l, d) parameters are contiguous, norm first. */
int mcv_pred_alloc(mcv_predictor **out, const mcv_trace_model *tm, int D, int rank, int hid,
		   float eps, mcv_error *err);
/* Floats per map: H + rank*H + E*rank + E + hid*(H + 1 + E). */
size_t mcv_pred_map_size(const mcv_predictor *p);
/* The writable parameters of map (l, d) of an owned predictor. */
float *mcv_pred_map_params(mcv_predictor *p, int l, int d);

float mcv_pred_dot(const float *a, const float *b, int n);
/* scores[E] of one map for h[H]; xn[H], z[r + hid] are the caller's scratch. */
void mcv_pred_map_apply(const mcv_pred_map *mp, int H, int r, int hid, int E, float eps,
			const float *h, float *xn, float *z, float *scores);

#endif

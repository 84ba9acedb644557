/* Internals of the expert predictors shared by predict.c (router baseline,
 * file load/save, scoring) and predict_train.c (training).  Not public. */
#ifndef MCV_PREDICT_IMPL_H
#define MCV_PREDICT_IMPL_H

#include "gguf.h"
#include "predict.h"
#include "trace.h"

#define MCV_PREDICTOR_TYPE "mcv.predictor"
/* version 1: the hidden state alone; version 2: also the routing
 * context (mcv.predictor.context = "routing", tensors cout and chid) */
#define MCV_PREDICTOR_VERSION 1
#define MCV_PREDICTOR_VERSION_CTX 2

enum { MCV_PRED_ROUTER = 0, MCV_PRED_TRAINED = 1 };

/* One map: with x = rmsnorm(h) * norm and R the rows of the routing
 * context that are set (row s*E + e: expert e at context slot s),
 *   scores = up (down x) + bias + sum_R cout[R]
 *            [+ hup relu(hdown x + hbias + sum_R chid[R])]
 * the bracket only when the file has a hidden width (mcv.predictor.hidden),
 * the context terms only with context (S > 0).  Slots of map (l, d):
 * s < L the previous token's experts at layer s, s = L + j (j < l) this
 * token's at layer j; S = L + l. */
typedef struct mcv_pred_map {
	const float *norm; /* [H] */
	const float *down; /* [rank][H] */
	const float *up;   /* [E][rank] */
	const float *bias; /* [E] */
	const float *hdown; /* [hid][H], NULL without the ReLU branch */
	const float *hbias; /* [hid] */
	const float *hup;   /* [E][hid] */
	int S;              /* context slots, 0: none */
	const float *cout;  /* [S*E][E] */
	const float *chid;  /* [S*E][hid], NULL without the ReLU branch */
} mcv_pred_map;

struct mcv_predictor {
	int kind;
	mcv_trace_model tm;  /* the model it belongs to */
	int H, E, L, D, rank, hid;
	int ctx;             /* 1: maps read the routing context */
	float eps;
	const mcv_model *m;  /* router baseline */
	mcv_gguf *g;         /* trained, from a file: the maps point into it */
	float *own;          /* trained, built in memory: the maps point into it */
	size_t *off;         /* owned: offset of map (l, d)'s parameters in own */
	mcv_pred_map *maps;  /* trained: [L][D], slot (l, d) = l * D + d - 1; unused when l + d >= L */
};

/* A trained predictor with zeroed parameters owned in memory (the trainer
 * fills them).  Map (l, d) parameters are contiguous, norm first, in the
 * order of mcv_pred_map, the context tables last. */
int mcv_pred_alloc(mcv_predictor **out, const mcv_trace_model *tm, int D, int rank, int hid,
		   int ctx, float eps, mcv_error *err);
/* Context slots of the maps of layer l (0 without context). */
int mcv_pred_slots(const mcv_predictor *p, int l);
/* Floats of the part of a map without context:
 * H + rank*H + E*rank + E + hid*(H + 1 + E). */
size_t mcv_pred_map_size(const mcv_predictor *p);
/* Floats of map (l, .) in all: the above + S*E*(E + hid). */
size_t mcv_pred_map_size_at(const mcv_predictor *p, int l);
/* The writable parameters of map (l, d) of an owned predictor. */
float *mcv_pred_map_params(mcv_predictor *p, int l, int d);

float mcv_pred_dot(const float *a, const float *b, int n);
/* The context rows set for map (l, .): rows[] gets at most
 * (L + l) * k entries; returns their number.  prev / cur as in
 * mcv_pred_context, each NULL for none.  0 when p has no context. */
int mcv_pred_ctx_rows(const mcv_predictor *p, int l, const int32_t *prev, const int32_t *cur, int k,
		      int *rows);
/* scores[E] of one map for h[H] and context rows[n]; xn[H], z[r + hid]
 * are the caller's scratch. */
void mcv_pred_map_apply(const mcv_pred_map *mp, int H, int r, int hid, int E, float eps,
			const float *h, const int *rows, int n, float *xn, float *z, float *scores);

#endif

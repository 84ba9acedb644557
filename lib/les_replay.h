/* Replay of recorded routing at full size (mcv-run --replay, mcv-run(1)).
 *
 * A model with random weights does not route like a trained one, so the
 * expert cache and I/O of a full-size store are driven instead by a routing
 * trace (lib/trace.h) recorded on a smaller trained model, mapped onto the
 * full model's layers and experts:
 *
 *   layer:  full layer L replays trace layer L mod n_trace.  Consecutive full
 *           layers stay consecutive trace layers (except at each wrap), so a
 *           prediction d layers ahead is as hard as on the trained model;
 *           floor(L * n_trace / n_full) would repeat a layer's routing in
 *           its neighbours and make lookahead trivially right.
 *   expert: trace expert e becomes e * R + r, R = n_expert_full /
 *           n_expert_trace, r = a fixed hash of (L, e, segment) mod R, where
 *           the segment is token / segment_len (the trace format keeps no
 *           prompt boundaries; 0 = the whole trace is one prompt).
 *
 * Top-k size, per-layer load, reuse across tokens and co-occurrence within
 * a segment are the trained model's; the n_full / n_trace repeats of a layer
 * get independent expert sets, and later segments use other parts of the
 * larger pool.  Not kept: correlations the full model would have beyond
 * those of the trained one (finer specialisation in the larger pool, and
 * between layers more than n_trace apart); the weights are the trace's.
 *
 * Predictions: with the trained model (and optionally a trained predictor
 * file of it), layer L + d is predicted by that predictor on the trace's
 * hidden state of trace layer (L + d) mod n_trace - d, its scores put on the
 * mapped ids; no prediction where that layer is below 0 (the wrap).
 * Without it nothing is predicted. */
#ifndef MCV_LES_REPLAY_H
#define MCV_LES_REPLAY_H

#include "mcv.h"
#include "model.h"
#include <stdint.h>

typedef struct mcv_replay mcv_replay;

/* Opens the trace for model `full` (qwen35moe): the trace's expert count
 * must divide the model's and its k must equal the model's.  segment_len:
 * tokens per segment of the expert hash, 0 = one segment. */
int mcv_replay_open(mcv_replay **out, const char *trace_path, const mcv_model *full,
		    int segment_len, mcv_error *err);
void mcv_replay_free(mcv_replay *r);
int64_t mcv_replay_n_tokens(const mcv_replay *r);

/* The trained model the trace was recorded on and, optionally, a trained
 * predictor file of it (NULL: its router baseline); the trace must match the
 * model and hold hidden states. */
int mcv_replay_set_proving(mcv_replay *r, const char *model_path, const char *predictor_path,
			   mcv_error *err);
/* "router", "trained" or "none". */
const char *mcv_replay_predictor_kind(const mcv_replay *r);

/* Installs the route override on c and, when c has a memory budget, the
 * replay predictor (mcv_les_set_predictor). */
void mcv_replay_attach(mcv_replay *r, mcv_ctx *c);
/* Before each evaluation: the trace token the next row replays (rows take
 * their own position as trace token; this is what the predictor uses). */
void mcv_replay_set_token(mcv_replay *r, int64_t token);

/* The k mapped ids of (token, full layer) into ids[k]. */
int mcv_replay_map(const mcv_replay *r, int64_t token, int layer, int32_t *ids, float *weights,
		   mcv_error *err);
/* The first error of the override (a row past the trace's end), 0 if none. */
int mcv_replay_status(const mcv_replay *r, mcv_error *err);

#endif

/* Routing traces: what the router chose, per recorded token and MoE layer,
 * and optionally the hidden state entering that layer.  Written by
 * `mcv-run --trace-routing FILE`; read by mcv-predict and `mcv-pack --order`.
 *
 * File (see mcv(7) "Routing trace"): a GGUF v3 with general.type
 * "mcv.trace", keys mcv.trace.* naming the model it was recorded on, and the
 * tensors (N tokens, L layers, k experts used, H hidden size)
 *   trace.experts  F32 [k, L, N]  expert ids (exact small integers)
 *   trace.weights  F32 [k, L, N]  their routing weights
 *   trace.hidden   F16 or F32 [H, L, N]  (optional) the residual-stream
 *                  hidden state entering block l (the input of its
 *                  attn_norm, not normalised): what a lookahead predictor
 *                  sees one layer before the router of l+1 fires
 * weights are the router's final per-expert weights, after top-k and the
 * renormalisation (they sum to 1 for qwen35moe).
 * Ids are stored as F32 because mcv's block types have no integer type; any
 * id below 2^24 is exact.
 *
 * Writer: GGUF needs every size up front, so records go to an unlinked
 * scratch file beside the output (at offset (token*L + layer) * record size,
 * so tokens and layers may arrive in any order, as a batched prefill
 * produces them) and the GGUF is assembled by mcv_trace_writer_finish()
 * through the atomic GGUF writer.  Every (token, layer) below the highest
 * token recorded must have been put. */
#ifndef MCV_TRACE_H
#define MCV_TRACE_H

#include "gguf.h"
#include "mcv.h"
#include <stdint.h>

#define MCV_TRACE_VERSION 1
#define MCV_TRACE_TYPE "mcv.trace"

/* The model a trace belongs to. */
typedef struct mcv_trace_model {
	char arch[32];
	int n_layer;        /* MoE layers recorded (all blocks of qwen35moe) */
	int n_expert;
	int n_expert_used;  /* k: ids per (token, layer) */
	int64_t n_embd;
	uint64_t fingerprint; /* mcv_layout_fingerprint() of the model */
} mcv_trace_model;

/* Fills m from a model file (plain or packed).  A dense model is an error. */
int mcv_trace_model_from_gguf(mcv_trace_model *m, const mcv_gguf *g, mcv_error *err);
/* 0 when a trace of model `trace` may be used with model `model`; otherwise
 * MCV_EINVAL with a message saying what differs. */
int mcv_trace_model_match(const mcv_trace_model *trace, const mcv_trace_model *model,
			  mcv_error *err);

/* ---- writer ---- */
typedef struct mcv_trace_writer mcv_trace_writer;

/* hidden_type: -1 (no hidden states), MCV_F16 or MCV_F32. */
int mcv_trace_writer_open(mcv_trace_writer **out, const char *path,
			  const mcv_trace_model *m, int hidden_type, mcv_error *err);
/* One (token, layer) record: n_expert_used ids (distinct, in [0, n_expert)),
 * their weights, and n_embd floats of hidden state (ignored, may be NULL,
 * when the trace has none).  Errors stick, as in the GGUF writer. */
int mcv_trace_writer_put(mcv_trace_writer *w, int64_t token, int layer,
			 const int32_t *ids, const float *weights, const float *hidden);
/* Assemble the GGUF, rename into place, free w (in every case). */
int mcv_trace_writer_finish(mcv_trace_writer *w, mcv_error *err);
void mcv_trace_writer_abort(mcv_trace_writer *w);

/* ---- reader ---- */
typedef struct mcv_trace mcv_trace;

/* Checks the type, version, keys, tensor shapes and every id (an integer in
 * range, distinct within its record); a truncated or foreign file is an
 * error naming the problem. */
int mcv_trace_open(mcv_trace **out, const char *path, mcv_error *err);
void mcv_trace_close(mcv_trace *t);
const mcv_trace_model *mcv_trace_model_of(const mcv_trace *t);
int64_t mcv_trace_n_tokens(const mcv_trace *t);
int mcv_trace_hidden_type(const mcv_trace *t); /* -1, MCV_F16 or MCV_F32 */
/* n_expert_used ids / weights of (token, layer); NULL out of range. */
const int32_t *mcv_trace_experts(const mcv_trace *t, int64_t token, int layer);
int mcv_trace_weights(const mcv_trace *t, int64_t token, int layer, float *out);
/* n_embd floats; MCV_ENOTFOUND when the trace has no hidden states. */
int mcv_trace_hidden(const mcv_trace *t, int64_t token, int layer, float *out);
/* mcv_trace_model_match() against a model file. */
int mcv_trace_check_model(const mcv_trace *t, const mcv_gguf *model, mcv_error *err);

#endif

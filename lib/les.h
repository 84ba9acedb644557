/* Lookahead Expert Scheduling: a hard memory budget for a qwen35moe model.
 *
 * With a budget (mcv_model_params.les->mem > 0) routed-expert weights are
 * never touched through the mapping: each (layer, expert) is read (O_DIRECT
 * when the file allows; through kernel AIO from the model thread, or with
 * pread() on I/O threads) into one of a fixed number of cache slots sized
 * from the budget.  At the start of every layer the predictor scores the
 * experts of the next `lookahead` layers and reads of the best ones (those
 * confident enough, prefetch_min) are queued; when the router fires, the
 * layer's misses go out at once, ahead of every prefetch not yet started,
 * the experts already resident are computed first and the misses as their
 * reads complete.  Every expert writes its own (token, slot) output row and the
 * rows are summed in the fixed top-k order, so logits are bit-identical to
 * the fully resident run whatever the budget, lookahead, predictor, policy
 * or thread count.
 *
 * The token embedding is not resident in budget mode (the rows a prompt
 * uses are read); everything else the process holds is accounted against
 * the budget: non-expert weights (mapped and touched), the GGUF header,
 * KV cache and DeltaNet state, scratch, cache slots and a fixed margin.
 *
 * The library decides and counts; tools print (mcv_les_stats_get, the
 * trace callback). */
#ifndef MCV_LES_H
#define MCV_LES_H

#include "mcv.h"
#include "model.h"
#include <stdint.h>

typedef struct mcv_les mcv_les;

enum { MCV_LES_LFRU = 0, MCV_LES_LRU = 1 };

#define MCV_LES_MAX_LOOKAHEAD 8

/* scores[n_expert] for layer l + d from h[n_embd], the residual stream
 * entering layer l (the mcv_predictor_scores contract, predict.h).  Called
 * on the thread that runs the model. */
typedef int (*mcv_les_predict_fn)(void *user, int l, int d, const float *h, float *scores);

/* One layer of one evaluation (a decode step: one token; a prefill chunk:
 * the union of its tokens' experts), after the layer's experts ran. */
typedef struct mcv_les_event {
	int pos;            /* position of the chunk's first token */
	int n_tokens;
	int layer;
	int n_chosen;       /* distinct experts routed */
	const int *chosen;  /* their ids, ascending */
	/* per chosen expert: 'r' resident (loaded earlier, not by a prefetch
	 * for this use), 'p' prefetched (a prediction brought it or had its
	 * read in flight), 'm' missed (read on demand) */
	const char *how;
	uint64_t stall_us;  /* time the layer waited for reads */
} mcv_les_event;
typedef void (*mcv_les_trace_fn)(void *user, const mcv_les_event *ev);

typedef struct mcv_les_params {
	uint64_t mem;        /* budget in bytes; 0: off, every expert resident */
	int lookahead;       /* layers predicted ahead, 0 = no prefetch; -1: default */
	int prefetch_width;  /* experts queued per predicted layer; 0: n_expert_used */
	int policy;          /* MCV_LES_LFRU (default) or MCV_LES_LRU */
	int io_threads;      /* reads in flight at most (AIO) or reader threads, 1..16;
			      * 0: 4 (AIO) or 2 (threads) */
	int queue_depth;     /* prefetch reads outstanding at most; 0: automatic */
	int direct;          /* -1: O_DIRECT where possible, 0: buffered pread only */
	int fail_reads;      /* test hook: the first N read attempts fail with EIO */
	int aio;             /* direct reads through kernel AIO (where the kernel has it):
			      * 1 always, 0 never (I/O threads), -1 for experts up to
			      * 512 KiB */
	double prefetch_min; /* prefetch only guesses at least this likely (0..1) to be
			      * routed, and evict no expert at least as likely to be used
			      * again; 0: every guess, -1: default */
} mcv_les_params;

mcv_les_params mcv_les_default_params(void);

/* Parses a size "3G", "512M", "1024K", "123" (bytes); K/M/G are powers of
 * 1024, an optional trailing "B"/"iB" is accepted.  MCV_EINVAL otherwise. */
int mcv_les_parse_size(const char *s, uint64_t *out, mcv_error *err);

/* The scheduler of a context (NULL when the context runs without budget). */
mcv_les *mcv_ctx_les(mcv_ctx *c);

/* A predictor instead of the built-in router baseline (the next layer's
 * router on the RMS-normed current hidden state); NULL fn restores it.
 * name is copied ("router", "trained", a path...). */
void mcv_les_set_predictor(mcv_les *s, mcv_les_predict_fn fn, void *user, const char *name);
void mcv_les_set_trace(mcv_les *s, mcv_les_trace_fn fn, void *user);

typedef struct mcv_les_stats {
	/* the budget and how it is split */
	uint64_t budget, min_budget;
	uint64_t nonexpert_bytes;  /* mapped weights the graph touches */
	uint64_t header_bytes;     /* GGUF header and metadata (mapped) */
	uint64_t embd_bytes;       /* token embedding left on disk */
	uint64_t ctx_bytes;        /* KV cache, DeltaNet state, scratch */
	uint64_t cache_bytes;      /* n_slots * slot_bytes */
	uint64_t margin_bytes;
	uint64_t slot_bytes, expert_bytes; /* a slot; one expert's weights */
	int n_slots, n_experts_total;      /* slots; n_layer * n_expert */
	int direct;                /* 1: reads use O_DIRECT */
	int locked;                /* 1: non-expert weights locked in memory (mlock) */
	int packed;                /* the file is packed (one extent per expert) */
	int expert_type;           /* ggml type of the experts' gate matrices */
	int lookahead, prefetch_width, policy, io_threads;
	int aio;                   /* 1: kernel AIO from the model thread; 0: I/O threads */
	const char *predictor;
	/* counters */
	uint64_t lookups;          /* (layer, expert) uses by the router */
	uint64_t hits;             /* resident and ready */
	uint64_t hits_inflight;    /* a prefetch read was in flight */
	uint64_t misses;           /* read on demand */
	uint64_t reads, read_bytes, read_retries, read_errors;
	uint64_t decode_read_bytes; /* read while single-token steps ran */
	uint64_t prefetch_reads, prefetch_used, prefetch_wasted;
	uint64_t prefetch_dropped;   /* queued, dropped before the read started */
	uint64_t prefetch_low_conf;  /* guesses below prefetch_min */
	uint64_t prefetch_pressure;  /* guesses that would evict a likelier expert */
	double prefetch_min;
	uint64_t embd_reads;
	uint64_t tokens, decode_tokens; /* rows evaluated; of them single-token steps */
	double stall_s, decode_stall_s;
	/* prediction vs routing, decode steps, per distance d (index d-1):
	 * recall = pred_hit / routed, precision = pred_hit / predicted */
	uint64_t pred_hit[MCV_LES_MAX_LOOKAHEAD], pred_n[MCV_LES_MAX_LOOKAHEAD],
		 routed_n[MCV_LES_MAX_LOOKAHEAD];
} mcv_les_stats;

void mcv_les_stats_get(const mcv_les *s, mcv_les_stats *st);

#endif

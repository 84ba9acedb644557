/* Calibration: importance matrices measured by running the model.
 *
 * A collector is bound to a loaded model's GGUF; installed as the
 * process-wide matmul hook (mcv_set_matmul_hook) it adds, for every weight
 * product the runtime performs, the squares of each input channel over the
 * product's input rows, per matrix: for a 3-D expert tensor per expert,
 * counted only for the tokens the router really sent there.  Saved in
 * llama.cpp's GGUF imatrix format (NAME.in_sum2 [n, n_mat], NAME.counts
 * [1, n_mat], general.type = "imatrix"), which llama-quantize and
 * mcv_imatrix_load read. */
#ifndef MCV_CALIB_H
#define MCV_CALIB_H

#include "gguf.h"
#include "mcv.h"
#include "model.h"
#include <stdint.h>

typedef struct mcv_calib mcv_calib;

/* Every tensor of g with at least two dimensions is a candidate. */
int mcv_calib_init(mcv_calib **out, const mcv_gguf *g, mcv_error *err);
void mcv_calib_free(mcv_calib *c);
/* The hook; user is the mcv_calib. Thread-safe. */
void mcv_calib_hook(void *user, const void *weights, int64_t row0, int64_t nrows,
		    const float *X, int64_t m, int64_t n);

/* Run every line of a JSONL file through the model: {"prompt": "text"}
 * (tokenized with special tokens parsed) or {"tokens": [ids]}; each line
 * from an empty context, at most max_tokens (0: the context size).  The
 * hook is installed for the duration.  Blank lines are skipped; anything
 * else malformed is an error naming the line. */
int mcv_calib_run_jsonl(mcv_calib *c, mcv_model *m, const char *path, int max_tokens,
			int *n_prompts, int64_t *n_tokens, mcv_error *err);

/* Sums and counts of one tensor (NULL if unknown or never seen). */
const double *mcv_calib_sums(const mcv_calib *c, const char *name, const double **counts,
			     int64_t *n, int64_t *n_mat);
int mcv_calib_n_seen(const mcv_calib *c); /* tensors with any count */

/* Write the GGUF imatrix (atomically). */
int mcv_calib_save(const mcv_calib *c, const char *path, const char *dataset,
		   int chunk_count, mcv_error *err);

#endif

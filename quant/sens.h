/* Measured sensitivity: the KL divergence of the model's next-token
 * distributions when ONE tensor is quantized (all others as in the input),
 * on a few calibration sequences, teacher-forced, every position.  The
 * probe quantizes the tensor, writes the dequantized values over the
 * model's private (copy-on-write) mapping in the input's float type, runs
 * the sequences, and restores the original bytes.  The allocator scales
 * each tensor's relative-error proxy by KL / proxy measured at one type. */
#ifndef MCV_SENS_H
#define MCV_SENS_H

#include "mcv.h"
#include "model.h"
#include <stdint.h>

typedef struct mcv_sens mcv_sens;

/* Reads the first max_lines lines of a JSONL ({"prompt"} or {"tokens"}),
 * at most max_tokens each, and runs the reference pass. */
int mcv_sens_init(mcv_sens **out, mcv_model *m, const char *jsonl, int max_lines, int max_tokens,
		  mcv_error *err);
void mcv_sens_free(mcv_sens *s);
int64_t mcv_sens_positions(const mcv_sens *s);
/* Mean KL(reference || model with tensor `name` quantized to `type`), in
 * nats per position.  imp: importance [n_mat][ne0] or NULL.  The tensor
 * must be F32, F16 or BF16 in the model's file. */
int mcv_sens_probe(mcv_sens *s, const char *name, int type, const float *imp, double *kl,
		   mcv_error *err);

#endif

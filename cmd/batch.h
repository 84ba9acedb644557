/* Batch driver for mcv-run: turns the inputs named on the command line
 * (image files, directories, archives, path lists on stdin) into a stream of
 * decoded images, hands each to a callback that runs the model, and prints
 * one record per input (a JSON line, or a tab-separated line with --text).
 *
 * A bad input (unreadable, corrupt, not an image, archive damage) becomes a
 * record with an "error" field and the batch goes on; batch_run returns the
 * number of inputs that failed, so the caller can exit 1 when any did. */
#ifndef MCV_BATCH_H
#define MCV_BATCH_H

#include "media.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum batch_src_kind {
	BATCH_PATH = 0,   /* an image file, or a directory (its image files, sorted) */
	BATCH_ARCHIVE,    /* every member of an archive; "-" = stdin */
	BATCH_LIST,       /* paths on stdin, one per line (or NUL-separated) */
} batch_src_kind;

typedef struct batch_src {
	batch_src_kind kind;
	const char *arg;
} batch_src;

typedef enum batch_format { BATCH_JSONL = 0, BATCH_TEXT = 1 } batch_format;

/* What the model callback reports for one input; text is borrowed until the
 * next call. */
typedef struct batch_result {
	const char *text;
	size_t len;
	int prompt_tokens, tokens;
} batch_result;

/* Run the model on one image; 0, or a negative MCV_E* with err set (the
 * input gets an error record). */
typedef int (*batch_fn)(void *ud, const mcv_image *im, batch_result *res, mcv_error *err);

typedef struct batch_cfg {
	const batch_src *src;
	int n_src;
	bool nul_sep;         /* BATCH_LIST: NUL-separated instead of lines */
	batch_format format;
	const char *prompt;   /* echoed in JSON records */
	mcv_media_limits lim;
	FILE *out;
	bool progress;        /* "n done, x images/s" on stderr (a terminal) */
} batch_cfg;

typedef struct batch_stats {
	int n_done, n_failed;
	long prompt_tokens, tokens;
	double seconds;
} batch_stats;

/* Process every input in order.  Returns 0 (see stats->n_failed), or -1
 * when writing the output failed (then errno tells why). */
int batch_run(const batch_cfg *cfg, batch_fn fn, void *ud, batch_stats *stats);

/* True when the name ends in .png, .jpg or .jpeg (any case): how a
 * directory's image files are picked. */
bool batch_is_image_name(const char *name);

/* Write one record.  member may be NULL.  Exposed for the multi-image path
 * of mcv-run, which prints the same records. */
void batch_print_ok(const batch_cfg *cfg, const char *source, const char *member,
		    const batch_result *res, double ms);
void batch_print_error(const batch_cfg *cfg, const char *source, const char *member,
		       const char *msg);

#endif

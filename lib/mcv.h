/* mcv: run and prepare MiniCPM-V 4.7-class models on machines with less
 * memory than the model.  Public header of libmcv.
 *
 * Conventions: functions return 0 or a negative MCV_E* code; on failure they
 * fill a caller-provided mcv_error with a one-line message.  The library
 * never exits or aborts on bad input. */
#ifndef MCV_H
#define MCV_H

#include <stddef.h>
#include <stdint.h>

#define MCV_VERSION "0.1.0"

enum {
	MCV_OK = 0,
	MCV_EIO = -1,       /* read/write/open failed (errno kept in message) */
	MCV_EFORMAT = -2,   /* malformed or hostile file */
	MCV_ENOMEM = -3,    /* allocation failed or a size over a stated bound */
	MCV_EINVAL = -4,    /* bad argument from the caller */
	MCV_EUNSUPPORTED = -5, /* valid but not handled (type, architecture) */
	MCV_ENOTFOUND = -6, /* a key or tensor is missing */
	MCV_EBUDGET = -7,   /* a memory budget cannot be met */
};

/* A failure report: code plus one line of text, no trailing newline. */
typedef struct mcv_error {
	int code;
	char msg[512];
} mcv_error;

/* Fill *e (if non-NULL) and return code.  printf-style. */
int mcv_error_set(mcv_error *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prefix an existing message, e.g. with a file name: "x.gguf: <old msg>". */
int mcv_error_prefix(mcv_error *e, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
const char *mcv_strerror(int code);

#endif

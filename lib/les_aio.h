/* The kernel's native AIO for the expert cache's direct reads (les.c):
 * reads submitted from the model thread, completed by the device while the
 * model computes, reaped without a reader thread.  Internal to les.c. */
#ifndef MCV_LES_AIO_H
#define MCV_LES_AIO_H

#include <stddef.h>
#include <stdint.h>

/* One read of an expert: len bytes at file offset off into buf + at, of
 * which the first need must arrive (direct reads are rounded up to the
 * block and may run past the end of the file). */
typedef struct mcv_les_piece {
	uint64_t off, len, need;
	size_t at;
} mcv_les_piece;

typedef struct mcv_les_done {
	int id, k;      /* the tag given to submit: slot id and piece index */
	int64_t res;    /* bytes read or -errno */
} mcv_les_done;

typedef struct mcv_les_aio mcv_les_aio;

/* A context for up to max_flight pieces in flight on fd; 0 or -errno
 * (ENOSYS: no AIO in this kernel). */
int mcv_les_aio_open(mcv_les_aio **out, int fd, int max_flight);
void mcv_les_aio_close(mcv_les_aio *a);

/* Submits pc[0..n) into buf, tagged (id, k); returns how many were
 * accepted (a prefix of pc; the caller reads the rest another way) or
 * -errno when none was (EAGAIN: the ring is full). */
int mcv_les_aio_submit(mcv_les_aio *a, int id, unsigned char *buf, const mcv_les_piece *pc, int n);

/* Completed pieces into out[0..max); block: wait for at least one.
 * Returns how many, or -errno. */
int mcv_les_aio_reap(mcv_les_aio *a, mcv_les_done *out, int max, int block);

#endif

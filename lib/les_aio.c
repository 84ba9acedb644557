/* Native Linux AIO through the raw system calls (les_aio.h): no libaio
 * dependency.  For O_DIRECT reads the kernel queues the request and
 * returns at once, so one thread can keep several reads in flight. */
#include "les_aio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/aio_abi.h>
#include <sys/syscall.h>

struct mcv_les_aio {
	aio_context_t ctx;
	int fd;
};

int mcv_les_aio_open(mcv_les_aio **out, int fd, int max_flight)
{
	*out = NULL;
	mcv_les_aio *a = calloc(1, sizeof *a);
	if (!a)
		return -ENOMEM;
	a->fd = fd;
	if (syscall(SYS_io_setup, (unsigned)max_flight, &a->ctx) != 0) {
		int e = errno;
		free(a);
		return -e;
	}
	*out = a;
	return 0;
}

void mcv_les_aio_close(mcv_les_aio *a)
{
	if (!a)
		return;
	/* io_destroy waits for the reads still in flight: their buffers
	 * belong to the caller until then */
	syscall(SYS_io_destroy, a->ctx);
	free(a);
}

int mcv_les_aio_submit(mcv_les_aio *a, int id, unsigned char *buf, const mcv_les_piece *pc, int n)
{
	struct iocb cb[3], *cbp[3];
	if (n > 3)
		n = 3;
	for (int k = 0; k < n; k++) {
		memset(&cb[k], 0, sizeof cb[k]);
		cb[k].aio_fildes = (uint32_t)a->fd;
		cb[k].aio_lio_opcode = IOCB_CMD_PREAD;
		cb[k].aio_buf = (uint64_t)(uintptr_t)(buf + pc[k].at);
		cb[k].aio_nbytes = pc[k].len;
		cb[k].aio_offset = (int64_t)pc[k].off;
		cb[k].aio_data = (uint64_t)id << 2 | (uint64_t)k;
		cbp[k] = &cb[k];
	}
	int done = 0;
	while (done < n) {
		long r = syscall(SYS_io_submit, a->ctx, (long)(n - done), cbp + done);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return done ? done : -errno;
		}
		if (r == 0)
			break;
		done += (int)r;
	}
	return done ? done : -EAGAIN;
}

int mcv_les_aio_reap(mcv_les_aio *a, mcv_les_done *out, int max, int block)
{
	struct io_event ev[64];
	if (max > 64)
		max = 64;
	struct timespec zero = { 0, 0 };
	long r;
	do
		r = syscall(SYS_io_getevents, a->ctx, block ? 1L : 0L, (long)max, ev, block ? NULL : &zero);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	for (long i = 0; i < r; i++) {
		out[i].id = (int)(ev[i].data >> 2);
		out[i].k = (int)(ev[i].data & 3);
		out[i].res = (int64_t)ev[i].res;
	}
	return (int)r;
}

#else

int mcv_les_aio_open(mcv_les_aio **out, int fd, int max_flight)
{
	(void)fd;
	(void)max_flight;
	*out = NULL;
	return -ENOSYS;
}

void mcv_les_aio_close(mcv_les_aio *a) { (void)a; }

int mcv_les_aio_submit(mcv_les_aio *a, int id, unsigned char *buf, const mcv_les_piece *pc, int n)
{
	(void)a; (void)id; (void)buf; (void)pc; (void)n;
	return -ENOSYS;
}

int mcv_les_aio_reap(mcv_les_aio *a, mcv_les_done *out, int max, int block)
{
	(void)a; (void)out; (void)max; (void)block;
	return -ENOSYS;
}

#endif

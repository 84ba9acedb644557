/* Lookahead Expert Scheduling: the expert cache, its reads, the prefetch
 * driven by predictions and the accounting of the budget (les.h).
 *
 * Two read engines share the cache and its two queues (demand before
 * prefetch).  Direct reads go through the kernel's native AIO from the
 * model thread (les_aio.c): the device works while the model computes and
 * no reader thread competes with the compute threads for the cores (on a
 * 2-core box the hand-off to a reader thread cost more than the read).  A
 * layer's misses are submitted at once, in parallel, ahead of every
 * prefetch not yet started; prefetches fill the device only up to
 * io_threads reads in flight.  Buffered reads (or a kernel without AIO)
 * use I/O threads that take demand reads first.
 *
 * One mutex guards the cache, the queues and the counters; I/O threads
 * drop it while they read.  A slot whose read is queued or running, or that
 * the current layer uses (pinned), is never chosen as a victim, so a
 * pointer handed to the graph stays valid until the graph releases it. */
#include "les.h"
#include "les_aio.h"
#include "model_impl.h"
#include "pack.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ALIGN MCV_PACK_ALIGN
#define MARGIN (48ull << 20) /* libc, code, tokenizer tables, thread stacks, page tables */
#define READ_TRIES 3
#define MAX_IO 16
#define AIO_AUTO_MAX (512u << 10) /* largest slot read through AIO by default */
#define DEFAULT_PREFETCH_MIN 0.0
#define HOT_DECAY 0.9f /* per pass of a layer: about ten tokens of memory */

enum { S_EMPTY = 0, S_QUEUED, S_READING, S_READY, S_ERROR };
/* the current layer's use of an expert */
enum { N_WAIT = 0, N_PINNED, N_OUT, N_DONE };

typedef struct slot {
	int key;            /* layer * n_expert + expert, -1: empty */
	int state;
	int pin;            /* the current layer uses it */
	int prefetched;     /* brought by a prediction, not yet used */
	int err;            /* errno of a failed read */
	uint64_t last, freq;
	uint64_t prot;      /* predicted for the layer evaluated at tick prot */
	float conf;         /* a prefetch's predicted probability of use */
	int pf_read;        /* the read in flight is a prefetch */
	int tries;          /* attempts of the current fill (AIO engine) */
	int npend, perr;    /* pieces in flight, first error among them */
	uint64_t rbytes;
	mcv_les_piece pc[3];
	int npc;
	unsigned char *buf;
	const void *ptr[3];
} slot;

struct mcv_les {
	mcv_model *m;
	const mcv_layout *lay;
	mcv_les_params p;
	int L, E, K, H;
	int fd_direct, fd;  /* fd: buffered, no readahead (rows, fallback reads) */
	int direct;         /* reads use fd_direct */
	int packed;
	slot *slots;
	int n_slots;
	int *where;         /* [L*E]: slot or -1 */
	unsigned char *arena;
	size_t arena_bytes;
	char *map_base;     /* the reader's mapping of the whole file */
	int tied;
	uint64_t slot_bytes;

	pthread_mutex_t mu;
	pthread_cond_t work, done;
	pthread_t th[MAX_IO];
	int n_th, stop;
	mcv_les_aio *aio;   /* the AIO engine; NULL: I/O threads */
	int mu_init;
	int n_flight, n_flight_pf; /* AIO: slots being read; of them prefetches */
	int hold_pf;        /* AIO: a layer started, its router has not fired */
	int ring_full;      /* AIO: the kernel refused a submission (EAGAIN) */
	int *qd, nqd, *qp, nqp;
	int fail_left;

	uint64_t tick;      /* layers evaluated */
	float *hot;         /* [L*E] decayed rate of use per pass of the layer */
	/* the current layer's experts */
	int cur_layer, n_need;
	int *nid, *nstate, *nslot;
	char *nhow;
	uint64_t layer_stall_ns;
	int cur_pos, cur_nt;

	/* predictions for recall: [d-1][layer] -> width ids, stamp = token */
	int *pred;
	uint64_t *pred_stamp;
	int pred_w;
	uint64_t n_tok_steps;
	float *pscores, *ph;
	int *prank;

	mcv_les_predict_fn pfn;
	void *puser;
	char pname[256];
	mcv_les_trace_fn tfn;
	void *tuser;
	int *tr_ids;
	char *tr_how;

	mcv_les_stats st;
	char errmsg[200];
};

mcv_les_params mcv_les_default_params(void)
{
	return (mcv_les_params){ .mem = 0, .lookahead = -1, .prefetch_width = 0,
				 .policy = MCV_LES_LFRU, .io_threads = 0, .queue_depth = 0, .aio = -1,
				 .prefetch_min = -1,
				 .direct = -1, .fail_reads = 0 };
}

int mcv_les_parse_size(const char *s, uint64_t *out, mcv_error *err)
{
	if (!s || *s < '0' || *s > '9')
		return mcv_error_set(err, MCV_EINVAL, "'%.64s' is not a size (like 3G)", s ? s : "");
	errno = 0;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	uint64_t mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1ull << 10; end++; break;
	case 'm': case 'M': mul = 1ull << 20; end++; break;
	case 'g': case 'G': mul = 1ull << 30; end++; break;
	case 't': case 'T': mul = 1ull << 40; end++; break;
	}
	if (mul > 1 && *end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (errno || *end || v == 0 || v > UINT64_MAX / mul)
		return mcv_error_set(err, MCV_EINVAL, "'%.64s' is not a size (like 3G)", s);
	*out = v * mul;
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
static uint64_t down(uint64_t v, uint64_t a) { return v / a * a; }

/* ---- reads ---- */

/* Reads at least need bytes (up to len) at off; 0 or -errno. */
static int pread_full(int fd, void *buf, size_t len, uint64_t off, size_t need)
{
	size_t got = 0;
	while (got < len) {
		ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return got >= need ? 0 : -ENODATA;
}

/* The reads of one expert into sl->buf, its pointers set; the number of
 * pieces or -EINVAL.  Packed files take one read of the whole extent; plain
 * ones a read per slice (the 4 KiB-aligned window around it when direct). */
static int plan_read(const mcv_les *s, slot *sl, int key, int direct, mcv_les_piece pc[3])
{
	const mcv_expert_extent *x = mcv_layout_expert(s->lay, key / s->E, key % s->E);
	if (!x)
		return -EINVAL;
	if (x->contiguous) {
		uint64_t off = direct ? x->read_offset : x->offset;
		if (direct && (x->read_offset % ALIGN))
			off = down(x->offset, ALIGN);
		const uint64_t need = x->offset + x->bytes - off;
		pc[0] = (mcv_les_piece){ .off = off, .len = direct ? up(need, ALIGN) : need, .need = need, .at = 0 };
		for (int k = 0; k < 3; k++)
			sl->ptr[k] = sl->buf + (x->s[k].offset - off);
		return 1;
	}
	size_t cur = 0;
	for (int k = 0; k < 3; k++) {
		const mcv_expert_slice *sc = &x->s[k];
		const uint64_t off = direct ? down(sc->offset, ALIGN) : sc->offset;
		const uint64_t need = sc->offset + sc->bytes - off;
		pc[k] = (mcv_les_piece){ .off = off, .len = direct ? up(need, ALIGN) : need, .need = need, .at = cur };
		sl->ptr[k] = sl->buf + cur + (sc->offset - off);
		cur += up(pc[k].len, 64);
	}
	return 3;
}

/* Lock held: the test hook (les.h fail_reads) takes this attempt. */
static int hook_fails(mcv_les *s)
{
	if (s->fail_left <= 0)
		return 0;
	s->fail_left--;
	return 1;
}

/* The pieces from..n of sl's plan with pread; 0 or -errno. */
static int read_pieces(mcv_les *s, slot *sl, int fd, int from, uint64_t *bytes)
{
	for (int k = from; k < sl->npc; k++) {
		const mcv_les_piece *pc = &sl->pc[k];
		int rc = pread_full(fd, sl->buf + pc->at, pc->len, pc->off, pc->need);
		if (fd == s->fd)
			posix_fadvise(fd, (off_t)pc->off, (off_t)pc->len, POSIX_FADV_DONTNEED);
		if (rc < 0)
			return rc;
		*bytes += pc->len;
	}
	return 0;
}

/* One expert into sl->buf with pread, the pointers set; 0 or -errno. */
static int read_expert(mcv_les *s, slot *sl, int key, uint64_t *bytes)
{
	pthread_mutex_lock(&s->mu);
	const int fail = hook_fails(s);
	const int direct = s->direct;
	pthread_mutex_unlock(&s->mu);
	*bytes = 0;
	if (fail)
		return -EIO;
	int n = plan_read(s, sl, key, direct, sl->pc);
	if (n < 0)
		return n;
	sl->npc = n;
	return read_pieces(s, sl, direct ? s->fd_direct : s->fd, 0, bytes);
}

static void *io_main(void *arg)
{
	mcv_les *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		int id;
		if (s->stop)
			break;
		if (s->nqd) {
			id = s->qd[0];
			memmove(s->qd, s->qd + 1, sizeof *s->qd * (size_t)--s->nqd);
		} else if (s->nqp) {
			id = s->qp[0];
			memmove(s->qp, s->qp + 1, sizeof *s->qp * (size_t)--s->nqp);
			s->st.prefetch_reads++;
		} else {
			pthread_cond_wait(&s->work, &s->mu);
			continue;
		}
		slot *sl = &s->slots[id];
		sl->state = S_READING;
		const int key = sl->key;
		pthread_mutex_unlock(&s->mu);
		int rc = 0, tries = 0;
		uint64_t bytes = 0;
		while (tries < READ_TRIES) {
			rc = read_expert(s, sl, key, &bytes);
			tries++;
			if (rc == -EINVAL && s->direct) {
				/* the file system refused O_DIRECT for this range:
				 * buffered reads from now on (not a retry) */
				pthread_mutex_lock(&s->mu);
				s->direct = 0;
				pthread_mutex_unlock(&s->mu);
				tries--;
				continue;
			}
			if (rc == 0)
				break;
		}
		pthread_mutex_lock(&s->mu);
		s->st.read_retries += (uint64_t)(tries - 1);
		if (rc == 0) {
			sl->state = S_READY;
			s->st.reads++;
			s->st.read_bytes += bytes;
			if (s->cur_nt == 1)
				s->st.decode_read_bytes += bytes;
		} else {
			sl->state = S_ERROR;
			sl->err = -rc;
			s->st.read_errors++;
		}
		pthread_cond_broadcast(&s->done);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* ---- the AIO engine (model thread, lock held) ---- */

static void aio_start(mcv_les *s, int id);

/* An attempt of slot id ended with rc (0 or -errno): ready, retried or
 * failed for good. */
static void aio_finish(mcv_les *s, int id, int rc)
{
	slot *sl = &s->slots[id];
	if (rc == -EINVAL && s->direct) {
		/* the file system refused O_DIRECT for this range: buffered
		 * reads from now on (not a retry) */
		s->direct = 0;
		sl->tries--;
		aio_start(s, id);
		return;
	}
	if (rc < 0 && sl->tries < READ_TRIES) {
		s->st.read_retries++;
		aio_start(s, id);
		return;
	}
	if (rc < 0) {
		sl->state = S_ERROR;
		sl->err = -rc;
		s->st.read_errors++;
		return;
	}
	sl->state = S_READY;
	s->st.reads++;
	s->st.read_bytes += sl->rbytes;
	if (s->cur_nt == 1)
		s->st.decode_read_bytes += sl->rbytes;
}

/* Starts (or restarts) the read of slot id: submitted, or done at once
 * (the test hook, buffered fallback, a full ring). */
static void aio_start(mcv_les *s, int id)
{
	slot *sl = &s->slots[id];
	sl->state = S_READING;
	sl->tries++;
	sl->rbytes = 0;
	sl->perr = 0;
	if (hook_fails(s)) {
		aio_finish(s, id, -EIO);
		return;
	}
	const int direct = s->direct;
	int n = plan_read(s, sl, sl->key, direct, sl->pc);
	if (n < 0) {
		aio_finish(s, id, n);
		return;
	}
	sl->npc = n;
	int sub = direct ? mcv_les_aio_submit(s->aio, id, sl->buf, sl->pc, n) : 0;
	if (sub == -EAGAIN && s->n_flight > 0) {
		/* the ring is full: back to the head of its queue until a
		 * read completes */
		sl->state = S_QUEUED;
		sl->tries--;
		int *q = sl->pf_read ? s->qp : s->qd, *nq = sl->pf_read ? &s->nqp : &s->nqd;
		memmove(q + 1, q, sizeof *q * (size_t)*nq);
		q[0] = id;
		(*nq)++;
		s->st.prefetch_reads -= (uint64_t)sl->pf_read;
		s->ring_full = 1;
		return;
	}
	if (sub < 0)
		sub = 0;
	int rc = 0;
	if (sub < n)
		/* buffered, or the kernel took only part: the rest now */
		rc = read_pieces(s, sl, direct ? s->fd_direct : s->fd, sub, &sl->rbytes);
	if (rc < 0)
		sl->perr = rc;
	if (!sub) {
		aio_finish(s, id, rc);
		return;
	}
	sl->npend = sub;
	s->n_flight++;
	s->n_flight_pf += sl->pf_read;
}

/* Submits every queued demand read, then prefetches while fewer than
 * io_threads reads are in flight.  Called when the layer's router has
 * fired and whenever reads complete, never between a layer's start and its
 * misses: a prefetch submitted first would sit ahead of them in the
 * device's queue. */
static void aio_pump(mcv_les *s)
{
	while (s->nqd && !s->ring_full) {
		const int id = s->qd[0];
		memmove(s->qd, s->qd + 1, sizeof *s->qd * (size_t)--s->nqd);
		s->slots[id].pf_read = 0;
		s->slots[id].tries = 0;
		aio_start(s, id);
	}
	while (s->nqp && !s->hold_pf && !s->ring_full && s->n_flight < s->p.io_threads) {
		const int id = s->qp[0];
		memmove(s->qp, s->qp + 1, sizeof *s->qp * (size_t)--s->nqp);
		s->slots[id].pf_read = 1;
		s->slots[id].tries = 0;
		s->st.prefetch_reads++;
		aio_start(s, id);
	}
}

/* Collects completed reads; block: wait for one (the lock is dropped
 * meanwhile; only the model thread touches the engine).  The number of
 * completions, or -errno. */
static int aio_reap(mcv_les *s, int block)
{
	mcv_les_done d[64];
	if (block)
		pthread_mutex_unlock(&s->mu);
	int r = mcv_les_aio_reap(s->aio, d, 64, block);
	const int e = r < 0 ? -r : 0;
	if (block)
		pthread_mutex_lock(&s->mu);
	if (r < 0) {
		errno = e;
		return r;
	}
	for (int i = 0; i < r; i++) {
		slot *sl = &s->slots[d[i].id];
		const mcv_les_piece *pc = &sl->pc[d[i].k];
		if (d[i].res < 0) {
			if (!sl->perr)
				sl->perr = (int)d[i].res;
		} else if ((uint64_t)d[i].res < pc->need) {
			if (!sl->perr)
				sl->perr = -ENODATA;
		} else {
			sl->rbytes += pc->len;
		}
		if (--sl->npend == 0) {
			s->n_flight--;
			s->n_flight_pf -= sl->pf_read;
			aio_finish(s, d[i].id, sl->perr);
		}
	}
	if (r > 0) {
		s->ring_full = 0;
		aio_pump(s); /* the device has room again */
	}
	return r;
}

/* ---- cache ---- */

static double policy_score(const mcv_les *s, const slot *sl)
{
	if (s->p.policy == MCV_LES_LRU)
		return (double)sl->last;
	/* the decayed rate of use of the expert at its layer (an estimate of
	 * the chance the next token routes to it), recency breaking ties: on
	 * the proving model's routing this misses 11% less than recency plus
	 * log-frequency at a 15% budget */
	return (double)s->hot[sl->key] * 1e9 + (double)sl->last;
}

/* Lock held.  A slot to reuse: empty first, then the lowest policy score
 * among those not pinned, not being read and not predicted for a layer yet
 * to run; a demand read may also cancel a queued prefetch (no read is
 * wasted), then take a predicted one (the farthest).  -1 when none. */
static int pick_victim(mcv_les *s, int demand)
{
	int best = -1, best_cls = 3;
	double best_score = 0;
	for (int i = 0; i < s->n_slots; i++) {
		const slot *sl = &s->slots[i];
		if (sl->key < 0)
			return i;
		if (sl->pin || sl->state == S_READING)
			continue;
		int cls;
		if (sl->state == S_QUEUED) {
			if (!demand || !sl->prefetched)
				continue;
			cls = 1;
		} else {
			cls = sl->prot >= s->tick && sl->state == S_READY ? 2 : 0;
		}
		if (cls && !demand)
			continue;
		double sc = cls ? -(double)sl->prot : policy_score(s, sl);
		if (cls < best_cls || (cls == best_cls && sc < best_score)) {
			best = i;
			best_cls = cls;
			best_score = sc;
		}
	}
	return best;
}

static void evict(mcv_les *s, int i)
{
	slot *sl = &s->slots[i];
	if (sl->key >= 0) {
		s->where[sl->key] = -1;
		if (sl->prefetched && sl->state == S_QUEUED)
			s->st.prefetch_dropped++; /* never started: no read lost */
		else if (sl->prefetched)
			s->st.prefetch_wasted++;
	}
	sl->key = -1;
	sl->state = S_EMPTY;
	sl->prefetched = 0;
	sl->freq = 0;
	sl->prot = 0;
}

static void assign(mcv_les *s, int i, int key)
{
	evict(s, i);
	slot *sl = &s->slots[i];
	sl->key = key;
	sl->state = S_QUEUED;
	s->where[key] = i;
}

static void remove_q(int *q, int *n, int id)
{
	for (int j = 0; j < *n; j++)
		if (q[j] == id) {
			memmove(q + j, q + j + 1, sizeof *q * (size_t)(*n - j - 1));
			(*n)--;
			return;
		}
}

/* ---- predictions ---- */

static int router_predict(void *user, int l, int d, const float *h, float *scores)
{
	mcv_les *s = user;
	const mcv_layer *L2 = &s->m->layers[l + d];
	mcv_rms_norm(s->ph, h, L2->post_norm.data, s->H, s->m->hp.eps);
	mcv_wt_mm(&L2->gate_inp, 0, s->E, s->ph, 1, scores, NULL);
	return 0;
}

/* ids of the w best scores (ties: lower id), best first */
static void top_w(const float *sc, int E, int w, int *out)
{
	for (int r = 0; r < w; r++) {
		int best = -1;
		for (int e = 0; e < E; e++) {
			int used = 0;
			for (int q = 0; q < r; q++)
				used |= out[q] == e;
			if (!used && (best < 0 || sc[e] > sc[best]))
				best = e;
		}
		out[r] = best;
	}
}

void mcv_les_layer_start(mcv_les *s, int il, const float *x, int nt, int pos)
{
	pthread_mutex_lock(&s->mu);
	s->tick++;
	s->cur_layer = il;
	s->cur_pos = pos;
	s->cur_nt = nt;
	s->layer_stall_ns = 0;
	if (il == 0 && nt == 1)
		s->n_tok_steps++;
	/* reads queued for a layer that has run are of no use any more */
	for (int j = 0; j < s->nqp;) {
		slot *sl = &s->slots[s->qp[j]];
		if (sl->prot < s->tick && !sl->pin) {
			int id = s->qp[j];
			remove_q(s->qp, &s->nqp, id);
			evict(s, id); /* counted as dropped */
		} else {
			j++;
		}
	}
	if (s->aio) {
		s->hold_pf = 1;
		aio_reap(s, 0); /* finished reads free their slots for the guesses */
	}
	pthread_mutex_unlock(&s->mu);
	const int la = s->p.lookahead;
	if (nt != 1 || la <= 0)
		return;
	const int w = s->pred_w;
	for (int d = 1; d <= la && il + d < s->L; d++) {
		if (s->pfn(s->puser, il, d, x, s->pscores) != 0)
			continue;
		int *rank = s->prank;
		top_w(s->pscores, s->E, w, rank);
		/* confidence: k times the softmax of the scores, an estimate of
		 * the chance the expert is routed (the router's own
		 * probabilities; the trained predictor is fit to a softmax
		 * whose routed entries share the mass) */
		double z = 0;
		const float mx = s->pscores[rank[0]];
		for (int e = 0; e < s->E; e++)
			z += exp((double)(s->pscores[e] - mx));
		int *keep = s->pred + ((size_t)(d - 1) * s->L + (il + d)) * w;
		memcpy(keep, rank, sizeof *keep * (size_t)w);
		s->pred_stamp[(size_t)(d - 1) * s->L + il + d] = s->n_tok_steps;
		pthread_mutex_lock(&s->mu);
		const uint64_t when = s->tick + (uint64_t)d;
		int queued = 0;
		for (int r = 0; r < w; r++) {
			const int key = (il + d) * s->E + rank[r];
			int i = s->where[key];
			const double c = fmin(1.0, s->K * exp((double)(s->pscores[rank[r]] - mx)) / z);
			if (i >= 0) {
				if (s->slots[i].prot < when)
					s->slots[i].prot = when;
				continue;
			}
			if (c < s->p.prefetch_min) {
				s->st.prefetch_low_conf += (uint64_t)(w - r);
				break; /* the rest rank lower */
			}
			if (s->nqp >= s->p.queue_depth)
				continue;
			if ((i = pick_victim(s, 0)) < 0)
				break;
			/* cache pressure: the victim is as likely to be used by
			 * the next token as this guess is to be right */
			if (s->p.prefetch_min > 0 && s->slots[i].key >= 0 && s->hot[s->slots[i].key] >= c) {
				s->st.prefetch_pressure++;
				continue;
			}
			assign(s, i, key);
			s->slots[i].prefetched = 1;
			s->slots[i].prot = when;
			s->slots[i].conf = (float)c;
			s->qp[s->nqp++] = i;
			queued++;
		}
		/* with AIO, queued only: they are submitted when the router
		 * has fired (mcv_les_need), behind this layer's misses, so the
		 * device serves a miss before a guess */
		if (!s->aio && queued)
			pthread_cond_broadcast(&s->work);
		pthread_mutex_unlock(&s->mu);
	}
}

/* Lock held: try to give every waiting expert a slot. */
static void place_waiting(mcv_les *s)
{
	int queued = 0;
	for (int j = 0; j < s->n_need; j++) {
		if (s->nstate[j] != N_WAIT)
			continue;
		int i = pick_victim(s, 1);
		if (i < 0)
			break;
		if (s->slots[i].state == S_QUEUED)
			remove_q(s->qp, &s->nqp, i);
		assign(s, i, s->cur_layer * s->E + s->nid[j]);
		s->slots[i].pin = 1;
		s->slots[i].last = s->tick;
		s->slots[i].freq = 1;
		s->qd[s->nqd++] = i;
		s->nslot[j] = i;
		s->nstate[j] = N_PINNED;
		queued++;
	}
	if (s->aio)
		aio_pump(s);
	else if (queued)
		pthread_cond_broadcast(&s->work);
}

void mcv_les_need(mcv_les *s, int il, const int *ids, int n)
{
	pthread_mutex_lock(&s->mu);
	s->cur_layer = il;
	s->n_need = n;
	s->hold_pf = 0;
	for (int j = 0; j < n; j++) {
		const int key = il * s->E + ids[j];
		s->nid[j] = ids[j];
		s->st.lookups++;
		int i = s->where[key];
		if (i < 0) {
			s->nstate[j] = N_WAIT;
			s->nhow[j] = 'm';
			s->st.misses++;
			continue;
		}
		slot *sl = &s->slots[i];
		if (sl->state == S_READY && !sl->prefetched) {
			s->nhow[j] = 'r';
			s->st.hits++;
		} else {
			s->nhow[j] = 'p';
			if (sl->state == S_READY)
				s->st.hits++;
			else
				s->st.hits_inflight++;
			if (sl->state == S_QUEUED) { /* promote to a demand read */
				remove_q(s->qp, &s->nqp, i);
				s->qd[s->nqd++] = i;
			}
		}
		if (sl->prefetched) {
			s->st.prefetch_used += sl->state != S_QUEUED;
			sl->prefetched = 0;
		}
		sl->pin = 1;
		sl->last = s->tick;
		sl->freq++;
		s->nslot[j] = i;
		s->nstate[j] = N_PINNED;
	}
	place_waiting(s);
	/* the decayed rate of use of the layer's experts */
	float *hot = s->hot + (size_t)il * s->E;
	for (int e = 0; e < s->E; e++)
		hot[e] *= HOT_DECAY;
	for (int j = 0; j < n; j++)
		hot[ids[j]] += 1.0f - HOT_DECAY;
	/* prediction quality, decode steps only */
	if (s->cur_nt == 1)
		for (int d = 1; d <= s->p.lookahead && d <= il; d++) {
			const size_t pi = (size_t)(d - 1) * s->L + il;
			if (s->pred_stamp[pi] != s->n_tok_steps)
				continue;
			const int *pr = s->pred + pi * s->pred_w;
			int hit = 0;
			for (int j = 0; j < n; j++)
				for (int r = 0; r < s->pred_w; r++)
					hit += pr[r] == ids[j];
			s->st.pred_hit[d - 1] += (uint64_t)hit;
			s->st.pred_n[d - 1] += (uint64_t)s->pred_w;
			s->st.routed_n[d - 1] += (uint64_t)n;
		}
	if (s->cur_nt == 1)
		s->st.decode_tokens += il == 0;
	s->st.tokens += il == 0 ? (uint64_t)s->cur_nt : 0;
	pthread_mutex_unlock(&s->mu);
}

int mcv_les_next(mcv_les *s, int *ids, mcv_error *err)
{
	pthread_mutex_lock(&s->mu);
	for (;;) {
		place_waiting(s);
		if (s->aio)
			aio_reap(s, 0);
		int cnt = 0, left = 0, busy = 0;
		for (int j = 0; j < s->n_need; j++) {
			if (s->nstate[j] == N_DONE)
				continue;
			left++;
			if (s->nstate[j] != N_PINNED)
				continue;
			slot *sl = &s->slots[s->nslot[j]];
			if (sl->state == S_ERROR) {
				int e = sl->err;
				int key = sl->key;
				for (int q = 0; q < s->n_need; q++)
					if (s->nstate[q] == N_PINNED || s->nstate[q] == N_OUT) {
						s->slots[s->nslot[q]].pin = 0;
						s->nstate[q] = N_DONE;
					}
				for (int q = 0; q < s->n_slots; q++)
					if (s->slots[q].state == S_ERROR)
						evict(s, q);
				pthread_mutex_unlock(&s->mu);
				return mcv_error_set(err, MCV_EIO, "reading expert %d of layer %d failed after %d tries: %s",
						     key % s->E, key / s->E, READ_TRIES, strerror(e));
			}
			if (sl->state == S_READY) {
				s->nstate[j] = N_OUT;
				ids[cnt++] = s->nid[j];
			}
		}
		if (cnt || !left) {
			pthread_mutex_unlock(&s->mu);
			return cnt;
		}
		if (s->aio)
			busy = s->n_flight; /* place_waiting submitted every queued demand */
		else
			for (int q = 0; q < s->n_slots; q++)
				busy += s->slots[q].state == S_QUEUED || s->slots[q].state == S_READING;
		if (!busy) {
			pthread_mutex_unlock(&s->mu);
			return mcv_error_set(err, MCV_EBUDGET, "no expert cache slot is free (%d slots)",
					     s->n_slots);
		}
		const uint64_t t0 = now_ns();
		if (!s->aio) {
			pthread_cond_wait(&s->done, &s->mu);
		} else if (aio_reap(s, 1) < 0) {
			const int e = errno;
			pthread_mutex_unlock(&s->mu);
			return mcv_error_set(err, MCV_EIO, "waiting for expert reads: %s", strerror(e));
		}
		const uint64_t dt = now_ns() - t0;
		s->layer_stall_ns += dt;
		s->st.stall_s += (double)dt * 1e-9;
		if (s->cur_nt == 1)
			s->st.decode_stall_s += (double)dt * 1e-9;
	}
}

void mcv_les_weights(mcv_les *s, int il, int e, const void *p[3])
{
	pthread_mutex_lock(&s->mu);
	const slot *sl = &s->slots[s->where[il * s->E + e]];
	for (int k = 0; k < 3; k++)
		p[k] = sl->ptr[k];
	pthread_mutex_unlock(&s->mu);
}

void mcv_les_release(mcv_les *s, const int *ids, int n)
{
	pthread_mutex_lock(&s->mu);
	for (int q = 0; q < n; q++)
		for (int j = 0; j < s->n_need; j++)
			if (s->nid[j] == ids[q] && s->nstate[j] == N_OUT) {
				s->slots[s->nslot[j]].pin = 0;
				s->nstate[j] = N_DONE;
			}
	pthread_mutex_unlock(&s->mu);
}

void mcv_les_layer_end(mcv_les *s, int il)
{
	if (!s->tfn)
		return;
	/* ascending expert ids for the event */
	int n = 0;
	for (int e = 0; e < s->E; e++)
		for (int j = 0; j < s->n_need; j++)
			if (s->nid[j] == e) {
				s->tr_ids[n] = e;
				s->tr_how[n] = s->nhow[j];
				n++;
				break;
			}
	mcv_les_event ev = { .pos = s->cur_pos, .n_tokens = s->cur_nt, .layer = il,
			     .n_chosen = n, .chosen = s->tr_ids, .how = s->tr_how,
			     .stall_us = s->layer_stall_ns / 1000 };
	s->tfn(s->tuser, &ev);
}

int mcv_les_read_row(mcv_les *s, uint64_t off, size_t n, void *dst, mcv_error *err)
{
	int rc = pread_full(s->fd, dst, n, off, n);
	posix_fadvise(s->fd, (off_t)off, (off_t)n, POSIX_FADV_DONTNEED);
	if (rc < 0)
		return mcv_error_set(err, MCV_EIO, "reading an embedding row at %llu: %s",
				     (unsigned long long)off, strerror(-rc));
	pthread_mutex_lock(&s->mu);
	s->st.embd_reads++;
	pthread_mutex_unlock(&s->mu);
	return 0;
}

/* ---- setup ---- */

/* mlock (on) or munlock the mapped non-expert weights the graph touches;
 * where locking is not allowed they are only paged in ahead.  0 when every
 * range is locked. */
static int lock_nonexpert(mcv_les *s, int tied, int on)
{
	const mcv_gguf *g = s->m->gguf;
	const mcv_gguf_tensor *te = mcv_gguf_find_tensor(g, "token_embd.weight");
	const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	int rc = 0;
	/* pass 0 queues large reads of every range (faults under MADV_RANDOM
	 * would read 4 KiB at a time), pass 1 locks what arrived */
	for (int pass = on ? 0 : 1; pass < 2; pass++)
		for (int64_t i = 0; i < mcv_gguf_n_tensors(g); i++) {
			const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
			if (mcv_layout_is_expert_tensor(s->lay, i) || (t == te && !tied) || !t->nbytes)
				continue;
			const uint64_t a = down(t->file_offset, pg), n = up(t->file_offset + t->nbytes, pg) - a;
			if (pass == 0)
				madvise(s->map_base + a, n, MADV_WILLNEED);
			else if (!on)
				munlock(s->map_base + a, n);
			else if (rc == 0 && mlock(s->map_base + a, n) != 0)
				rc = -1;
		}
	return rc;
}

static void fmt_mib(char *b, size_t n, uint64_t v)
{
	snprintf(b, n, "%.1f MiB", (double)v / (1024.0 * 1024.0));
}

int mcv_les_init(mcv_les **out, mcv_model *m, uint64_t ctx_bytes, mcv_error *err)
{
	*out = NULL;
	const mcv_les_params *p = &m->les;
	const mcv_layout *lay = m->layout;
	const mcv_gguf *g = m->gguf;
	const mcv_hparams *hp = &m->hp;
	if (!hp->moe || !lay)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "--mem needs a mixture-of-experts model (qwen35moe)");
	mcv_les *s = calloc(1, sizeof *s);
	if (!s)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	s->m = m;
	s->lay = lay;
	s->p = *p;
	s->L = hp->n_layer;
	s->E = hp->n_expert;
	s->K = hp->n_expert_used;
	s->H = hp->n_embd;
	s->fd = -1;
	s->fd_direct = -1;
	s->packed = mcv_layout_packed(lay);
	if (s->p.lookahead < 0)
		s->p.lookahead = 1;
	if (s->p.lookahead > MCV_LES_MAX_LOOKAHEAD)
		s->p.lookahead = MCV_LES_MAX_LOOKAHEAD;
	if (s->p.prefetch_width <= 0)
		s->p.prefetch_width = s->K;
	if (s->p.prefetch_min < 0)
		s->p.prefetch_min = DEFAULT_PREFETCH_MIN;
	if (s->p.prefetch_min > 1)
		s->p.prefetch_min = 1;
	if (s->p.prefetch_width > s->E)
		s->p.prefetch_width = s->E;
	/* io_threads: reads in flight; threads of the buffered engine.  The
	 * AIO default is the queue depth where this kind of device stops
	 * gaining throughput (about 4 for 72 KiB reads on a virtio disk) */
	const int io_given = s->p.io_threads > 0;
	if (s->p.io_threads <= 0)
		s->p.io_threads = 4;
	if (s->p.io_threads > MAX_IO)
		s->p.io_threads = MAX_IO;
	if (s->p.queue_depth <= 0)
		s->p.queue_depth = s->p.prefetch_width * (s->p.lookahead > 0 ? s->p.lookahead : 1);
	s->pred_w = s->p.prefetch_width;
	s->fail_left = s->p.fail_reads;

	/* slot size: what any read mode may need for the largest expert */
	uint64_t slot_bytes = 0, expert_bytes = 0;
	for (int il = 0; il < s->L; il++)
		for (int e = 0; e < s->E; e++) {
			const mcv_expert_extent *x = mcv_layout_expert(lay, il, e);
			uint64_t win = 0, plain = 0, eb = 0;
			for (int k = 0; k < 3; k++) {
				const mcv_expert_slice *sc = &x->s[k];
				win += up(up(sc->offset + sc->bytes, ALIGN) - down(sc->offset, ALIGN), 64);
				plain += up(sc->bytes, 64);
				eb += sc->bytes;
			}
			uint64_t need = win > plain ? win : plain;
			if (x->contiguous) {
				uint64_t ext = up(x->offset + x->bytes - down(x->offset, ALIGN), ALIGN);
				if (ext > need)
					need = ext;
			}
			if (need > slot_bytes)
				slot_bytes = need;
			if (eb > expert_bytes)
				expert_bytes = eb;
		}
	slot_bytes = up(slot_bytes, ALIGN);
	s->slot_bytes = slot_bytes;

	/* what stays mapped and is touched */
	const mcv_gguf_tensor *te = mcv_gguf_find_tensor(g, "token_embd.weight");
	const int tied = m->output.data == m->tok_embd.data;
	s->tied = tied;
	uint64_t nonexp = 0, embd = 0;
	for (int64_t i = 0; i < mcv_gguf_n_tensors(g); i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		if (mcv_layout_is_expert_tensor(lay, i))
			continue;
		if (t == te && !tied) {
			embd = t->nbytes;
			continue;
		}
		nonexp += t->nbytes;
	}
	const uint64_t header = mcv_gguf_data_offset(g);
	const uint64_t margin = MARGIN;
	const uint64_t fixed = nonexp + header + ctx_bytes + margin;
	const uint64_t min = fixed + (uint64_t)s->K * slot_bytes;
	mcv_les_stats *st = &s->st;
	st->budget = p->mem;
	st->min_budget = min;
	st->nonexpert_bytes = nonexp;
	st->header_bytes = header;
	st->embd_bytes = embd;
	st->ctx_bytes = ctx_bytes;
	st->margin_bytes = margin;
	st->slot_bytes = slot_bytes;
	st->expert_bytes = expert_bytes;
	st->n_experts_total = s->L * s->E;
	st->packed = s->packed;
	st->expert_type = mcv_layout_expert(lay, 0, 0)->s[0].type;
	if (p->mem < min) {
		char a[32], b[32], c[32], d[32], f[32];
		fmt_mib(a, sizeof a, min);
		fmt_mib(b, sizeof b, nonexp + header);
		fmt_mib(c, sizeof c, ctx_bytes);
		fmt_mib(d, sizeof d, (uint64_t)s->K * slot_bytes);
		fmt_mib(f, sizeof f, margin);
		free(s);
		return mcv_error_set(err, MCV_EBUDGET,
				     "memory budget %llu bytes is below the minimum %llu (%s: non-expert weights %s, "
				     "KV/state/scratch %s, top-%d experts of one layer %s, margin %s)",
				     (unsigned long long)p->mem, (unsigned long long)min, a, b, c,
				     hp->n_expert_used, d, f);
	}
	uint64_t ns = (p->mem - fixed) / slot_bytes;
	if (ns > (uint64_t)s->L * s->E)
		ns = (uint64_t)s->L * s->E;
	s->n_slots = (int)ns;
	st->n_slots = s->n_slots;
	st->cache_bytes = ns * slot_bytes;

	int ok = 1;
	s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
	s->where = malloc(sizeof *s->where * (size_t)s->L * s->E);
	s->qd = malloc(sizeof *s->qd * (size_t)s->n_slots);
	s->qp = malloc(sizeof *s->qp * (size_t)s->n_slots);
	s->nid = malloc(sizeof *s->nid * (size_t)s->E);
	s->nstate = malloc(sizeof *s->nstate * (size_t)s->E);
	s->nslot = malloc(sizeof *s->nslot * (size_t)s->E);
	s->nhow = malloc((size_t)s->E);
	s->tr_ids = malloc(sizeof *s->tr_ids * (size_t)s->E);
	s->tr_how = malloc((size_t)s->E);
	s->pred = malloc(sizeof *s->pred * (size_t)MCV_LES_MAX_LOOKAHEAD * s->L * s->pred_w);
	s->pred_stamp = calloc((size_t)MCV_LES_MAX_LOOKAHEAD * s->L, sizeof *s->pred_stamp);
	s->pscores = malloc(sizeof *s->pscores * (size_t)s->E);
	s->ph = malloc(sizeof *s->ph * (size_t)s->H);
	s->prank = malloc(sizeof *s->prank * (size_t)s->E);
	s->hot = calloc((size_t)s->L * s->E, sizeof *s->hot);
	s->arena_bytes = (size_t)ns * slot_bytes;
	s->arena = mmap(NULL, s->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s->arena == MAP_FAILED)
		s->arena = NULL;
	if (!s->slots || !s->where || !s->qd || !s->qp || !s->nid || !s->nstate || !s->nslot ||
	    !s->nhow || !s->tr_ids || !s->tr_how || !s->pred || !s->pred_stamp || !s->pscores ||
	    !s->ph || !s->prank || !s->hot || !s->arena)
		ok = 0;
	if (!ok) {
		mcv_les_free(s);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for %d expert cache slots", (int)ns);
	}
	for (int i = 0; i < s->L * s->E; i++)
		s->where[i] = -1;
	for (int i = 0; i < s->n_slots; i++) {
		s->slots[i].key = -1;
		s->slots[i].buf = s->arena + (size_t)i * slot_bytes;
	}
	s->pfn = router_predict;
	s->puser = s;
	snprintf(s->pname, sizeof s->pname, "router");

	/* a descriptor of our own: readahead off for it only, and the pages
	 * a buffered read leaves behind are dropped (they are not budgeted) */
	s->fd = open(mcv_gguf_path(g), O_RDONLY | O_CLOEXEC);
	if (s->fd < 0) {
		int e = errno;
		mcv_les_free(s);
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", mcv_gguf_path(g), strerror(e));
	}
	posix_fadvise(s->fd, 0, 0, POSIX_FADV_RANDOM);
	if (p->direct != 0) {
		s->fd_direct = open(mcv_gguf_path(g), O_RDONLY | O_DIRECT | O_CLOEXEC);
		s->direct = s->fd_direct >= 0;
	}
	/* The mapping must not read experts around the non-expert weights (no
	 * readahead on faults), and those weights are paged in now and locked:
	 * they are budgeted, and under a memory cgroup at its limit the kernel
	 * would otherwise reclaim them first (the cache slots are anonymous,
	 * without swap they stay) and every token would fault them back. */
	if (te) {
		s->map_base = (char *)te->data - te->file_offset;
		madvise(s->map_base, mcv_gguf_file_size(g), MADV_RANDOM);
		s->st.locked = lock_nonexpert(s, tied, 1) == 0;
	}

	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->done, NULL);
	s->mu_init = 1;
	/* kernel AIO pays where a read is short next to a hand-off to a
	 * reader thread (the proving model's 72 KiB experts: on-demand 2.4x
	 * faster on 2 cores); for experts of megabytes, reader threads with
	 * pread measured ~10% more throughput on a virtio disk */
	if (s->direct && (s->p.aio > 0 || (s->p.aio < 0 && slot_bytes <= AIO_AUTO_MAX))) {
		/* every piece of every slot may be in flight at once (a prefill
		 * chunk); past the ring's size submissions wait in the queue */
		int cap = 3 * s->n_slots < 512 ? 3 * s->n_slots : 512;
		if (mcv_les_aio_open(&s->aio, s->fd_direct, cap) == 0) {
			*out = s;
			return 0;
		}
		s->aio = NULL;
	}
	if (!io_given)
		s->p.io_threads = 2;
	for (int i = 0; i < s->p.io_threads; i++) {
		if (pthread_create(&s->th[i], NULL, io_main, s) != 0)
			break;
		s->n_th++;
	}
	if (!s->n_th) {
		mcv_les_free(s);
		return mcv_error_set(err, MCV_ENOMEM, "cannot start an I/O thread");
	}
	*out = s;
	return 0;
}

void mcv_les_free(mcv_les *s)
{
	if (!s)
		return;
	if (s->n_th) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		pthread_cond_broadcast(&s->work);
		pthread_mutex_unlock(&s->mu);
		for (int i = 0; i < s->n_th; i++)
			pthread_join(s->th[i], NULL);
	}
	mcv_les_aio_close(s->aio); /* waits for reads into the arena */
	if (s->mu_init) {
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->work);
		pthread_cond_destroy(&s->done);
	}
	if (s->st.locked)
		lock_nonexpert(s, s->tied, 0);
	if (s->fd_direct >= 0)
		close(s->fd_direct);
	if (s->fd >= 0)
		close(s->fd);
	if (s->arena)
		munmap(s->arena, s->arena_bytes);
	free(s->slots);
	free(s->where);
	free(s->qd);
	free(s->qp);
	free(s->nid);
	free(s->nstate);
	free(s->nslot);
	free(s->nhow);
	free(s->tr_ids);
	free(s->tr_how);
	free(s->pred);
	free(s->pred_stamp);
	free(s->pscores);
	free(s->ph);
	free(s->prank);
	free(s->hot);
	free(s);
}

void mcv_les_set_predictor(mcv_les *s, mcv_les_predict_fn fn, void *user, const char *name)
{
	s->pfn = fn ? fn : router_predict;
	s->puser = fn ? user : s;
	snprintf(s->pname, sizeof s->pname, "%s", fn ? (name ? name : "custom") : "router");
}

void mcv_les_set_trace(mcv_les *s, mcv_les_trace_fn fn, void *user)
{
	s->tfn = fn;
	s->tuser = user;
}

void mcv_les_stats_get(const mcv_les *s, mcv_les_stats *st)
{
	pthread_mutex_lock((pthread_mutex_t *)&s->mu);
	*st = s->st;
	pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
	st->direct = s->direct;
	st->lookahead = s->p.lookahead;
	st->prefetch_width = s->p.prefetch_width;
	st->policy = s->p.policy;
	st->io_threads = s->aio ? s->p.io_threads : s->n_th;
	st->aio = s->aio != NULL;
	st->prefetch_min = s->p.prefetch_min;
	st->predictor = s->pname;
}

mcv_les *mcv_ctx_les(mcv_ctx *c)
{
	return c->les;
}

/* The layers of a prefill (many rows at once) in ONE parallel region.
 *
 * Why: the per-block forms (attention.c, deltanet.c, moe.c) open a
 * parallel region per product and per step, about twenty per layer.  With
 * OMP_WAIT_POLICY=passive (a shared machine) every region wakes the other
 * threads through the kernel, ~35 us on 2 cores here, which for a small
 * model is more than the work: a 69-token prompt of the proving model paid
 * ~15 ms of wake-ups.  Here the threads enter once per evaluation and meet
 * at a barrier between dependent steps (about a dozen per layer).
 *
 * Who computes what: products are split by weight rows (16-row units,
 * mcv_matmul_part), element-wise steps by rows, the DeltaNet scan by value
 * head, attention by (row, head), the routed experts one expert per thread.
 * Every element is computed by the same operations as in the per-block
 * forms (same kernels, same step functions), so the result is the same bits
 * whatever the thread count and the same as decode / the budget (LES) path.
 *
 * The products run on weights repacked once at load into the 16-row panels
 * of the VNNI GEMM (quant/gemm_q0.c; small models only: the copy is 1.9x
 * the Q8_0 bytes), or repack per call otherwise; the activation rows are
 * converted once per step for all the matrices that read them.
 *
 * Not handled here (the caller falls back): a memory budget (experts come
 * from the cache's I/O loop), a matmul observer (calibration), dense FFN
 * models, a layer whose matrices need more activation formats than NCONV. */
#include "gemm.h"
#include "model_impl.h"

#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Conversions of one source of activation rows for the matrices that read
 * it: one buffer per distinct vec_dot_type (F32 reads the floats). */
#define NCONV 4
typedef struct conv {
	const float *x;
	int64_t n;
	int k;
	int vdt[NCONV];
	unsigned char *buf[NCONV];
	size_t qb[NCONV];
} conv;

/* The region's barrier.  OpenMP's own, under OMP_WAIT_POLICY=passive, puts
 * a waiting thread to sleep at once, and waking it costs ~17 us; the steps
 * between barriers here are often shorter than that.  So a waiter spins a
 * little (~30 us) and only then sleeps on a futex: cheap when the threads
 * arrive close together, polite when one of them was descheduled. */
typedef struct pbar {
	_Atomic int count, gen, sleepers;
	int n;
} pbar;

#define SPIN_ROUNDS 2000

static void pbar_wait(pbar *b)
{
	if (b->n <= 1)
		return;
	const int g = atomic_load(&b->gen);
	if (atomic_fetch_add(&b->count, 1) == b->n - 1) {
		atomic_store(&b->count, 0);
		atomic_fetch_add(&b->gen, 1);
		if (atomic_load(&b->sleepers) > 0)
			syscall(SYS_futex, (int *)&b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
		return;
	}
	for (int i = 0; i < SPIN_ROUNDS; i++) {
		if (atomic_load(&b->gen) != g)
			return;
		CPU_RELAX();
	}
	atomic_fetch_add(&b->sleepers, 1);
	while (atomic_load(&b->gen) == g)
		syscall(SYS_futex, (int *)&b->gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
	atomic_fetch_sub(&b->sleepers, 1);
}

/* What one pbar_wait costs with n threads, measured once per process
 * (forward.c weighs it against the work when it picks a thread count). */
double mcv_prefill_barrier_us(int n)
{
	static double cost[2]; /* [0]: n, [1]: us */
	double u;
#pragma omp atomic read
	u = cost[1];
	if (u > 0 && cost[0] == n)
		return u;
	enum { REPS = 32 };
	pbar b = { .n = n };
	double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(n)
	{
		if (omp_get_num_threads() != n)
			b.n = 1; /* fewer threads than asked: nothing to measure */
		pbar_wait(&b);
#pragma omp master
		t0 = omp_get_wtime();
		for (int i = 0; i < REPS; i++)
			pbar_wait(&b);
#pragma omp master
		t1 = omp_get_wtime();
	}
	u = (t1 - t0) * 1e6 / REPS;
	if (u <= 0)
		u = 0.01;
#pragma omp critical(mcv_pbar_cost)
	{
		cost[0] = n;
		cost[1] = u;
	}
	return u;
}

struct mcv_prefill {
	int rows, nthr;
	int64_t width;              /* widest converted row */
	size_t cb_bytes;            /* one conversion buffer */
	unsigned char *cb[3][NCONV]; /* block input, inner activation, shared expert hidden */
	unsigned char *tscr;        /* per thread: expert rows and products */
	size_t tscr_per;
	int *grp;                   /* start[E+1], fill[E], ids[E] */
	int n_used;                 /* experts used by the layer (set by one thread) */
	pbar bar;
	_Atomic int next;           /* the next task of a shared-out loop */
};

#define SYNC(c) pbar_wait(&(c)->pf->bar)

static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* Bytes of a converted row of width n: at most 2 per value (F16/BF16) plus
 * block headers, rounded up for alignment. */
static size_t conv_row_bytes(int64_t n) { return (((size_t)n * 2 + 256) + 63) & ~(size_t)63; }

void mcv_prefill_free(struct mcv_prefill *p)
{
	if (!p)
		return;
	for (int s = 0; s < 3; s++)
		for (int i = 0; i < NCONV; i++)
			free(p->cb[s][i]);
	free(p->tscr);
	free(p->grp);
	free(p);
}

static struct mcv_prefill *pf_get(mcv_ctx *c, int nthr)
{
	if (c->pf && c->pf->nthr >= nthr)
		return c->pf;
	mcv_prefill_free(c->pf);
	c->pf = NULL;
	const mcv_hparams *hp = &c->m->hp;
	struct mcv_prefill *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->rows = c->n_batch;
	p->nthr = nthr;
	int64_t w = imax(hp->n_embd, hp->ssm_dval);
	w = imax(w, (int64_t)hp->head_dim * hp->n_head);
	w = imax(w, hp->n_ff_shexp);
	w = imax(w, hp->n_ff_exp);
	p->width = w;
	p->cb_bytes = (size_t)p->rows * conv_row_bytes(w);
	int ok = 1;
	for (int s = 0; s < 3; s++)
		for (int i = 0; i < NCONV; i++)
			ok &= (p->cb[s][i] = aligned_alloc(64, p->cb_bytes)) != NULL;
	/* gathered rows (two conversions), gate, up, hidden conversion, down */
	const size_t F = (size_t)hp->n_ff_exp, H = (size_t)hp->n_embd, R = (size_t)p->rows;
	p->tscr_per = (2 * R * conv_row_bytes(H) + R * conv_row_bytes(F) +
		       sizeof(float) * R * (2 * F + H) + 63) & ~(size_t)63;
	ok &= (p->tscr = aligned_alloc(64, p->tscr_per * (size_t)nthr)) != NULL;
	ok &= (p->grp = malloc(sizeof(int) * (3 * (size_t)hp->n_expert + 1))) != NULL;
	if (!ok) {
		mcv_prefill_free(p);
		return NULL;
	}
	c->pf = p;
	return p;
}

static int vdt_of(const mcv_wt *w)
{
	const mcv_type_traits *tt = mcv_type_get(w->type);
	return tt ? tt->vec_dot_type : -1;
}

/* ---- weights repacked at load ---- */

/* Above this many packed bytes the copy is not worth its memory (the
 * per-call repacking of mcv_matmul_part does the same work). */
#define PACK_MAX_BYTES ((size_t)512 << 20)

/* The matrices of layer L a prefill reads through a 16-row panel GEMM. */
static int layer_mats(mcv_layer *L, mcv_wt **w)
{
	mcv_wt *all[] = { &L->ssm_qkv, &L->ssm_gate, &L->ssm_out, &L->wq, &L->wk, &L->wv, &L->wqkv, &L->wo,
			  &L->gate_shexp, &L->up_shexp, &L->down_shexp, &L->gate_exps, &L->up_exps,
			  &L->gate_up_exps, &L->down_exps };
	int n = 0;
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		if (all[i]->data)
			w[n++] = all[i];
	return n;
}

static size_t wt_pack_size(const mcv_wt *w)
{
	return mcv_vgemm_packed_size(w->type, w->ne[1] * w->ne[2] * w->ne[3], w->ne[0]);
}

void mcv_prefill_pack(mcv_model *m)
{
	if (m->les.mem > 0 || !m->hp.moe)
		return;
	mcv_wt *w[16];
	size_t total = 0;
	int n = 0;
	for (int il = 0; il < m->hp.n_layer; il++) {
		const int k = layer_mats(&m->layers[il], w);
		for (int i = 0; i < k; i++) {
			const size_t b = wt_pack_size(w[i]);
			total += b;
			n += b > 0;
		}
	}
	if (n == 0 || total > PACK_MAX_BYTES)
		return;
	mcv_vgemm_w *pk = calloc((size_t)n, sizeof *pk);
	mcv_wt **of = malloc(sizeof *of * (size_t)n);
	if (!pk || !of) {
		free(pk);
		free(of);
		return;
	}
	n = 0;
	for (int il = 0; il < m->hp.n_layer; il++) {
		const int k = layer_mats(&m->layers[il], w);
		for (int i = 0; i < k; i++)
			if (wt_pack_size(w[i]) > 0)
				of[n++] = w[i];
	}
	int fail = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : fail)
	for (int i = 0; i < n; i++)
		fail |= mcv_vgemm_pack(&pk[i], of[i]->type, of[i]->data, of[i]->row_bytes,
				       of[i]->ne[1] * of[i]->ne[2] * of[i]->ne[3], of[i]->ne[0]) != 1;
	if (fail) {
		for (int i = 0; i < n; i++)
			mcv_vgemm_free(&pk[i]);
		free(pk);
		free(of);
		return;
	}
	for (int i = 0; i < n; i++)
		of[i]->pk = &pk[i];
	free(of);
	m->packs = pk;
	m->n_packs = n;
}

void mcv_prefill_unpack(mcv_model *m)
{
	for (int i = 0; i < m->n_packs; i++)
		mcv_vgemm_free(&m->packs[i]);
	free(m->packs);
	m->packs = NULL;
	m->n_packs = 0;
}

/* Rows [r0, r1) of w from row0 on: Y[i * ldy + r] (a product's piece),
 * on the packed panels when w has them and row0 + r0 starts a panel.
 * nrows: the matrix's rows, which decide an F32 product's summation order
 * as in llama.cpp (mcv_f32_tiled); 0 for a routed expert, which llama.cpp
 * multiplies row by row (its MUL_MAT_ID never takes the tiled GEMM). */
static void wt_part(const mcv_wt *w, int64_t nrows, int64_t row0, int64_t r0, int64_t r1, const void *xq,
		    size_t qb, int64_t m, float *Y, size_t ldy)
{
	if (r1 <= r0 || m <= 0)
		return;
	if (w->pk && (row0 + r0) % 16 == 0 && vdt_of(w) == MCV_Q8_0) {
		mcv_gemm_q0_packed(w->pk, row0 + r0, row0 + r1, xq, qb, m, Y + r0, ldy);
		return;
	}
	mcv_matmul_part(w->type, (const char *)w->data + (size_t)row0 * w->row_bytes, w->row_bytes, nrows, r0, r1,
			w->ne[0], xq, qb, m, Y, ldy);
}

void mcv_prefill_prepare(mcv_ctx *c, int nthr)
{
	if (c->les || !c->m->hp.moe)
		return;
	if (nthr > c->n_thr_scores)
		nthr = c->n_thr_scores;
	struct mcv_prefill *p = pf_get(c, nthr < 1 ? 1 : nthr);
	if (!p)
		return;
	/* touch the buffers now rather than page-fault in the first prompt */
	for (int s = 0; s < 3; s++)
		for (int i = 0; i < NCONV; i++)
			memset(p->cb[s][i], 0, p->cb_bytes);
	memset(p->tscr, 0, p->tscr_per * (size_t)p->nthr);
}

/* ---- work splitting ---- */

static void span(int64_t n, int tid, int nth, int64_t *a, int64_t *b)
{
	*a = n * tid / nth;
	*b = n * (tid + 1) / nth;
}

/* Plan (every thread the same, no shared writes) the conversions of x for
 * the matrices ws[0..nw) (NULL entries skipped); buf: NCONV buffers. */
static void conv_plan(conv *cv, const float *x, int64_t n, const mcv_wt *const *ws, int nw,
		      unsigned char *const *buf)
{
	cv->x = x;
	cv->n = n;
	cv->k = 0;
	for (int i = 0; i < nw; i++) {
		if (!ws[i] || !ws[i]->data)
			continue;
		const int v = vdt_of(ws[i]);
		int have = v == MCV_F32 || v < 0;
		for (int j = 0; j < cv->k; j++)
			have |= cv->vdt[j] == v;
		if (!have && cv->k < NCONV) {
			cv->vdt[cv->k] = v;
			cv->buf[cv->k] = buf[cv->k];
			cv->qb[cv->k] = mcv_row_bytes(v, n);
			cv->k++;
		}
	}
}

static void conv_rows(const conv *cv, int64_t t0, int64_t t1)
{
	for (int j = 0; j < cv->k; j++)
		for (int64_t t = t0; t < t1; t++)
			mcv_quantize_row(cv->vdt[j], cv->x + t * cv->n, cv->buf[j] + (size_t)t * cv->qb[j], cv->n);
}

/* The rows of x converted for w: NULL if the plan lacks that type. */
static const void *conv_find(const conv *cv, const mcv_wt *w, size_t *qb)
{
	const int v = vdt_of(w);
	if (v == MCV_F32) {
		*qb = sizeof(float) * (size_t)cv->n;
		return cv->x;
	}
	for (int j = 0; j < cv->k; j++)
		if (cv->vdt[j] == v) {
			*qb = cv->qb[j];
			return cv->buf[j];
		}
	return NULL;
}

/* One product of a group: Y[i * ldy + r] = row (row0 + r) of w . x_i for
 * r < nrows, i < m. */
typedef struct item {
	const mcv_wt *w;
	int64_t row0, nrows;
	const conv *src;
	float *Y;
	size_t ldy;
} item;

#define UNIT 16 /* weight rows per share: one VNNI panel */

/* This thread's share of the products it[0..n): the 16-row units of all of
 * them, cut into nth contiguous pieces. */
static void products(const item *it, int n, int64_t m, int tid, int nth)
{
	int64_t total = 0;
	for (int i = 0; i < n; i++)
		total += (it[i].nrows + UNIT - 1) / UNIT;
	int64_t u0, u1;
	span(total, tid, nth, &u0, &u1);
	int64_t base = 0;
	for (int i = 0; i < n && base < u1; i++) {
		const int64_t nu = (it[i].nrows + UNIT - 1) / UNIT;
		const int64_t a = u0 > base ? u0 - base : 0, b = u1 - base < nu ? u1 - base : nu;
		if (a < b) {
			const int64_t r0 = a * UNIT, r1 = b * UNIT < it[i].nrows ? b * UNIT : it[i].nrows;
			size_t qb = 0;
			const void *xq = conv_find(it[i].src, it[i].w, &qb);
			wt_part(it[i].w, it[i].nrows, it[i].row0, r0, r1, xq, qb, m, it[i].Y, it[i].ldy);
		}
		base += nu;
	}
}

/* ---- blocks ---- */

static void deltanet(mcv_ctx *c, const mcv_layer *L, int nt, const conv *cx, int tid, int nth,
		     int64_t T0, int64_t T1)
{
	struct mcv_prefill *pf = c->pf;
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, C = hp->ssm_conv_ch, nv = hp->ssm_nv, Dv = hp->ssm_dval;
	float *qkv = c->big[0], *z = c->big[1], *cv = c->big[2], *o = c->big[3];
	float *beta = c->small0, *alpha = c->small1;
	const item pr[4] = {
		{ &L->ssm_qkv, 0, C, cx, qkv, (size_t)C },
		{ &L->ssm_gate, 0, Dv, cx, z, (size_t)Dv },
		{ &L->ssm_beta, 0, nv, cx, beta, (size_t)nv },
		{ &L->ssm_alpha, 0, nv, cx, alpha, (size_t)nv },
	};
	products(pr, 4, nt, tid, nth);
	SYNC(c);
	int64_t a, b;
	span((C + 15) / 16, tid, nth, &a, &b);
	mcv_deltanet_conv(c, L, nt, qkv, cv, (int)(a * 16), (int)(b * 16 < C ? b * 16 : C));
	SYNC(c);
	mcv_deltanet_gates(c, L, cv, beta, alpha, (int)T0, (int)T1);
	SYNC(c);
	span(nv, tid, nth, &a, &b);
	mcv_deltanet_scan(c, L, nt, cv, beta, alpha, z, o, (int)a, (int)b);
	SYNC(c);
	conv co;
	const mcv_wt *wo = &L->ssm_out;
	conv_plan(&co, o, Dv, &wo, 1, pf->cb[1]);
	conv_rows(&co, T0, T1);
	SYNC(c);
	const item po = { wo, 0, H, &co, c->y, (size_t)H };
	products(&po, 1, nt, tid, nth);
}

static void attention(mcv_ctx *c, const mcv_layer *L, int nt, const conv *cx, int tid, int nth,
		      int64_t T0, int64_t T1)
{
	struct mcv_prefill *pf = c->pf;
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
	const int nq = 2 * hd * nh, nk = hd * nkv;
	float *Q = c->big[0], *K = c->big[1], *V = c->big[2], *O = c->big[3];
	const int slot0 = c->pos;
	if (L->wqkv.data) {
		const item pr[3] = {
			{ &L->wqkv, 0, nq, cx, Q, (size_t)nq },
			{ &L->wqkv, nq, nk, cx, K, (size_t)nk },
			{ &L->wqkv, nq + nk, nk, cx, V, (size_t)nk },
		};
		products(pr, 3, nt, tid, nth);
	} else {
		const item pr[3] = {
			{ &L->wq, 0, nq, cx, Q, (size_t)nq },
			{ &L->wk, 0, nk, cx, K, (size_t)nk },
			{ &L->wv, 0, nk, cx, V, (size_t)nk },
		};
		products(pr, 3, nt, tid, nth);
	}
	SYNC(c);
	mcv_attn_prep(c, L, slot0, Q, K, V, (int)T0, (int)T1);
	if (tid == 0)
		atomic_store(&pf->next, 0);
	SYNC(c);
	float *sc = c->scores + (size_t)tid * c->score_stride;
	for (int th; (th = atomic_fetch_add(&pf->next, 1)) < nt * nh;)
		mcv_attn_head(c, L, slot0, Q, O, th / nh, th % nh, nt, sc);
	SYNC(c);
	conv co;
	const mcv_wt *wo = &L->wo;
	conv_plan(&co, O, (int64_t)hd * nh, &wo, 1, pf->cb[1]);
	conv_rows(&co, T0, T1);
	SYNC(c);
	const item po = { wo, 0, H, &co, c->y, (size_t)H };
	products(&po, 1, nt, tid, nth);
}

/* Gather rows toks[0..cnt) of the block input converted for w (from the
 * plan, or converted here from the floats) into dst; returns the stride. */
static size_t gather(const conv *cx, const mcv_wt *w, const int32_t *toks, int cnt, unsigned char *dst)
{
	size_t qb;
	const unsigned char *src = conv_find(cx, w, &qb);
	if (src) {
		for (int i = 0; i < cnt; i++)
			memcpy(dst + (size_t)i * qb, src + (size_t)toks[i] * qb, qb);
		return qb;
	}
	const int v = vdt_of(w);
	qb = mcv_row_bytes(v, cx->n);
	for (int i = 0; i < cnt; i++)
		mcv_quantize_row(v, cx->x + (size_t)toks[i] * cx->n, dst + (size_t)i * qb, cx->n);
	return qb;
}

/* Routed expert e over its rows, on this thread: weighted outputs into
 * their (row, slot) rows of c->eo (the operations of moe.c's expert_apply). */
static void expert(mcv_ctx *c, const mcv_layer *L, int e, const int32_t *toks, const int32_t *slots,
		   int cnt, const conv *cx, unsigned char *scr)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, F = hp->n_ff_exp, K = hp->n_expert_used;
	const size_t R = (size_t)c->pf->rows;
	mcv_wt w[3];
	int64_t r0[3];
	mcv_moe_expert_weights(c->m, L, e, w, r0);
	unsigned char *xg0 = scr, *xg1 = xg0 + R * conv_row_bytes(H), *hq = xg1 + R * conv_row_bytes(H);
	float *g = (float *)(hq + R * conv_row_bytes(F)), *u = g + R * F, *d = u + R * F;
	const size_t q0 = gather(cx, &w[0], toks, cnt, xg0);
	const unsigned char *x1 = xg0;
	size_t q1 = q0;
	if (vdt_of(&w[1]) != vdt_of(&w[0]))
		q1 = gather(cx, &w[1], toks, cnt, xg1), x1 = xg1;
	wt_part(&w[0], 0, r0[0], 0, F, xg0, q0, cnt, g, (size_t)F);
	wt_part(&w[1], 0, r0[1], 0, F, x1, q1, cnt, u, (size_t)F);
	mcv_swiglu(g, u, (size_t)cnt * F);
	const int v2 = vdt_of(&w[2]);
	const void *h = g;
	size_t qh = sizeof(float) * (size_t)F;
	if (v2 != MCV_F32) {
		qh = mcv_row_bytes(v2, F);
		for (int i = 0; i < cnt; i++)
			mcv_quantize_row(v2, g + (size_t)i * F, hq + (size_t)i * qh, F);
		h = hq;
	}
	wt_part(&w[2], 0, r0[2], 0, H, h, qh, cnt, d, (size_t)H);
	for (int i = 0; i < cnt; i++) {
		const int t = toks[i], s = slots[i];
		const float wt = c->selw[t * K + s];
		float *dst = c->eo + ((size_t)t * K + s) * H;
		const float *src = d + (size_t)i * H;
#pragma omp simd
		for (int j = 0; j < H; j++)
			dst[j] = src[j] * wt;
	}
}

/* The routed experts and the shared expert; on return (after the last
 * barrier of the expert loop) c->y holds the block's output rows. */
static void moe(mcv_ctx *c, const mcv_layer *L, int nt, const conv *cx, int tid, int nth, int64_t T0,
		int64_t T1)
{
	struct mcv_prefill *pf = c->pf;
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used, SF = hp->n_ff_shexp;
	const int il = (int)(L - c->m->layers);
	float *logits = c->small0, *sg = c->small1, *g = c->big[0], *u = c->big[1], *d = c->big[2];
	const item pr[4] = {
		{ &L->gate_inp, 0, E, cx, logits, (size_t)E },
		{ &L->gate_shexp, 0, SF, cx, g, (size_t)SF },
		{ &L->up_shexp, 0, SF, cx, u, (size_t)SF },
		{ &L->gate_inp_shexp, 0, 1, cx, sg, 1 },
	};
	products(pr, 4, nt, tid, nth);
	SYNC(c);
	conv cg;
	const mcv_wt *wd = &L->down_shexp;
	conv_plan(&cg, g, SF, &wd, 1, pf->cb[2]);
	for (int64_t t = T0; t < T1; t++) {
		mcv_moe_route(hp, logits + (size_t)t * E, c->sel + (size_t)t * K, c->selw + (size_t)t * K);
		mcv_swiglu(g + (size_t)t * SF, u + (size_t)t * SF, (size_t)SF);
	}
	conv_rows(&cg, T0, T1);
	SYNC(c);
	int *start = pf->grp, *fill = start + E + 1, *ids = fill + E;
	if (tid == 0) {
		atomic_store(&pf->next, 0);
		if (c->route_override)
			for (int t = 0; t < nt; t++)
				c->route_override(c->route_override_user, il, c->pos + t, c->sel + (size_t)t * K,
						  c->selw + (size_t)t * K, K);
		if (c->route_hook)
			for (int t = 0; t < nt; t++)
				c->route_hook(c->route_hook_user, il, c->pos + t, c->sel + (size_t)t * K,
					      c->selw + (size_t)t * K, K);
		pf->n_used = mcv_moe_group_by_expert(c, nt, start, fill, ids);
	}
	SYNC(c);
	const int n = pf->n_used;
	/* the shared expert's down product as a few extra tasks (pf->next
	 * was reset before the barrier above) */
	const int64_t units = (H + UNIT - 1) / UNIT;
	const int nsh = (int)(units < 2 * nth ? units : 2 * nth);
	unsigned char *scr = pf->tscr + pf->tscr_per * (size_t)tid;
	for (int q; (q = atomic_fetch_add(&pf->next, 1)) < n + nsh;) {
		if (q < n) {
			const int e = ids[q];
			expert(c, L, e, c->tok_list + start[e], c->slot_list + start[e], start[e + 1] - start[e], cx,
			       scr);
		} else {
			int64_t a, b;
			span(units, q - n, nsh, &a, &b);
			size_t qb = 0;
			const void *xq = conv_find(&cg, wd, &qb);
			wt_part(wd, H, 0, a * UNIT, b * UNIT < H ? b * UNIT : H, xq, qb, nt, d, (size_t)H);
		}
	}
	SYNC(c);
	for (int64_t t = T0; t < T1; t++) {
		float *y = c->y + (size_t)t * H;
		const float *eo = c->eo + (size_t)t * K * H;
		memcpy(y, eo, sizeof(float) * H);
		for (int s = 1; s < K; s++) {
			const float *e = eo + (size_t)s * H;
#pragma omp simd
			for (int j = 0; j < H; j++)
				y[j] += e[j];
		}
		const float gate = mcv_sigmoid(sg[t]);
		const float *dd = d + (size_t)t * H;
#pragma omp simd
		for (int j = 0; j < H; j++)
			y[j] += dd[j] * gate;
	}
}

/* ---- the layer loop ---- */

/* Every conversion plan of every layer fits in NCONV buffers (a mixed
 * quantization could in principle ask for more). */
/* The residual: x += y over one row. */
static inline void add_row(float *x, const float *y, int H)
{
#pragma omp simd
	for (int j = 0; j < H; j++)
		x[j] += y[j];
}

static int formats_fit(const mcv_model *m)
{
	for (int il = 0; il < m->hp.n_layer; il++) {
		const mcv_layer *L = &m->layers[il];
		mcv_wt e0[3];
		int64_t r0[3];
		mcv_moe_expert_weights(m, L, 0, e0, r0);
		const mcv_wt *sets[3][6] = {
			{ &L->ssm_qkv, &L->ssm_gate, &L->ssm_beta, &L->ssm_alpha, NULL, NULL },
			{ &L->wqkv, &L->wq, &L->wk, &L->wv, NULL, NULL },
			{ &L->gate_inp, &L->gate_shexp, &L->up_shexp, &L->gate_inp_shexp, &e0[0], &e0[1] },
		};
		for (int k = 0; k < 3; k++) {
			int v[6], n = 0;
			for (int i = 0; i < 6; i++) {
				if (!sets[k][i] || !sets[k][i]->data)
					continue;
				const int d = vdt_of(sets[k][i]);
				int have = d == MCV_F32 || d < 0;
				for (int j = 0; j < n; j++)
					have |= v[j] == d;
				if (!have)
					v[n++] = d;
			}
			if (n > NCONV)
				return 0;
		}
	}
	return 1;
}

int mcv_prefill_layers(mcv_ctx *c, int nt)
{
	mcv_model *m = c->m;
	const mcv_hparams *hp = &m->hp;
	if (c->les || !hp->moe || nt > c->n_batch || !formats_fit(m))
		return -1;
	int nthr = omp_get_max_threads();
	if (nthr > c->n_thr_scores)
		nthr = c->n_thr_scores;
	if (!pf_get(c, nthr))
		return -1;
	const int H = hp->n_embd;
#pragma omp parallel num_threads(nthr)
	{
		const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#pragma omp single
		{
			atomic_store(&c->pf->bar.count, 0);
			c->pf->bar.n = nth;
		}
		int64_t T0, T1;
		span(nt, tid, nth, &T0, &T1);
		for (int il = 0; il < hp->n_layer; il++) {
			const mcv_layer *L = &m->layers[il];
			for (int64_t t = T0; t < T1; t++)
				mcv_rms_norm(c->xn + (size_t)t * H, c->x + (size_t)t * H, L->attn_norm.data, H, hp->eps);
			conv cx;
			if (L->recurrent) {
				const mcv_wt *ws[4] = { &L->ssm_qkv, &L->ssm_gate, &L->ssm_beta, &L->ssm_alpha };
				conv_plan(&cx, c->xn, H, ws, 4, c->pf->cb[0]);
			} else {
				const mcv_wt *ws[4] = { &L->wqkv, &L->wq, &L->wk, &L->wv };
				conv_plan(&cx, c->xn, H, ws, 4, c->pf->cb[0]);
			}
			conv_rows(&cx, T0, T1);
			SYNC(c);
			if (L->recurrent)
				deltanet(c, L, nt, &cx, tid, nth, T0, T1);
			else
				attention(c, L, nt, &cx, tid, nth, T0, T1);
			SYNC(c);
			for (int64_t t = T0; t < T1; t++) {
				add_row(c->x + (size_t)t * H, c->y + (size_t)t * H, H);
				mcv_rms_norm(c->xn + (size_t)t * H, c->x + (size_t)t * H, L->post_norm.data, H, hp->eps);
			}
			mcv_wt e0[3];
			int64_t r0[3];
			mcv_moe_expert_weights(m, L, 0, e0, r0);
			const mcv_wt *ws[6] = { &L->gate_inp, &L->gate_shexp, &L->up_shexp, &L->gate_inp_shexp,
						&e0[0], &e0[1] };
			conv_plan(&cx, c->xn, H, ws, 6, c->pf->cb[0]);
			conv_rows(&cx, T0, T1);
			SYNC(c);
			moe(c, L, nt, &cx, tid, nth, T0, T1);
			for (int64_t t = T0; t < T1; t++)
				add_row(c->x + (size_t)t * H, c->y + (size_t)t * H, H);
			if (c->layer_hook) {
				SYNC(c);
				if (tid == 0)
					for (int t = 0; t < nt; t++)
						c->layer_hook(c->layer_hook_user, il, c->pos + t, c->x + (size_t)t * H, H);
				SYNC(c);
			}
		}
	}
	return 0;
}

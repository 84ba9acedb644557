/* The evaluation context and the layer loop: embeddings in, pre-norm
 * residual blocks (attention or DeltaNet, then MoE or dense FFN), final
 * RMSNorm and the LM head for the last token.  All scratch is allocated
 * once per context from the model's dimensions. */
#include "model_impl.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

mcv_ctx_params mcv_ctx_default_params(void)
{
	return (mcv_ctx_params){ .n_ctx = 0, .n_batch = 0 };
}

/* ---- matrix products ---- */

static int act_slot(int vdt)
{
	switch (vdt) {
	case MCV_Q8_0: return 0;
	case MCV_Q8_K: return 1;
	case MCV_F16: return 2;
	case MCV_BF16: return 3;
	}
	return -1;
}

void mcv_act_set(mcv_act *a, const float *x, int64_t n)
{
	a->x = x;
	a->n = n;
	a->valid = 0;
}

/* Process-wide observer of weight products (calibration), see model.h. */
static mcv_matmul_hook_fn mm_hook;
static void *mm_hook_user;

void mcv_set_matmul_hook(mcv_matmul_hook_fn fn, void *user)
{
	mm_hook = fn;
	mm_hook_user = user;
}

void mcv_wt_mm(const mcv_wt *w, int64_t row0, int64_t nrows, const float *X,
	       int64_t m, float *Y, mcv_act *act)
{
	const char *base = (const char *)w->data + (size_t)row0 * w->row_bytes;
	const int64_t n = w->ne[0];
	if (mm_hook)
		mm_hook(mm_hook_user, w->data, row0, nrows, X, m, n);
	if (m == 1 && act) {
		/* The caller promises act describes X. */
		const int vdt = mcv_type_get(w->type)->vec_dot_type;
		const int s = act_slot(vdt);
		if (s < 0) {
			/* F32 dots read X as is; other types (Q8_1) convert it */
			if (vdt == MCV_F32)
				mcv_matvec_q(w->type, base, w->row_bytes, nrows, n, X, Y);
			else
				mcv_matvec(w->type, base, w->row_bytes, nrows, n, X, Y);
			return;
		}
		if (!(act->valid & (1u << s))) {
			mcv_quantize_row(vdt, X, act->buf[s], n);
			act->valid |= 1u << s;
		}
		mcv_matvec_q(w->type, base, w->row_bytes, nrows, n, act->buf[s], Y);
		return;
	}
	if (m == 1)
		mcv_matvec(w->type, base, w->row_bytes, nrows, n, X, Y);
	else
		mcv_matmul(w->type, base, w->row_bytes, nrows, n, X, m, Y);
}

/* A routed expert's product: llama.cpp's MUL_MAT_ID multiplies each token
 * row on its own, so F32 experts take the single-row dot's summation order
 * whatever the token count (for the other types every order is the same
 * bits: mcv_matmul == mcv_matvec). */
void mcv_wt_mm_expert(const mcv_wt *w, int64_t row0, int64_t nrows, const float *X, int64_t m, float *Y,
		      mcv_act *act)
{
	if (m < 2 || w->type != MCV_F32) {
		mcv_wt_mm(w, row0, nrows, X, m, Y, act);
		return;
	}
	for (int64_t i = 0; i < m; i++)
		mcv_wt_mm(w, row0, nrows, X + i * w->ne[0], 1, Y + i * nrows, NULL);
}

/* ---- context ---- */

static double barrier_us(int n);

static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

int mcv_ctx_init(mcv_ctx **out, mcv_model *m, const mcv_ctx_params *p, mcv_error *err)
{
	*out = NULL;
	mcv_ctx_params def = mcv_ctx_default_params();
	if (!p)
		p = &def;
	const mcv_hparams *hp = &m->hp;
	mcv_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	c->m = m;
	c->n_ctx = p->n_ctx > 0 ? p->n_ctx : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
	c->n_batch = p->n_batch > 0 ? p->n_batch : 256;
	if (c->n_batch > c->n_ctx)
		c->n_batch = c->n_ctx;
	if (c->n_ctx > (1 << 24) || p->n_ctx < 0 || p->n_batch < 0) {
		free(c);
		return mcv_error_set(err, MCV_EINVAL, "bad context size %d / batch %d", p->n_ctx, p->n_batch);
	}
	const int64_t nb = c->n_batch, H = hp->n_embd;
	const int64_t nkv = (int64_t)hp->head_dim * hp->n_head_kv;
	int64_t wide = imax(H, 2LL * hp->head_dim * hp->n_head);
	wide = imax(wide, nkv);
	wide = imax(wide, hp->ssm_conv_ch);
	wide = imax(wide, hp->ssm_dval);
	wide = imax(wide, hp->n_ff);
	wide = imax(wide, hp->n_ff_exp);
	wide = imax(wide, hp->n_ff_shexp);
	const int64_t narrow = imax(imax(hp->n_expert, hp->ssm_nv), 1);
	const int64_t K = imax(hp->n_expert_used, 1);
	/* one score row per thread that may run the attention loop */
	int nthr = omp_get_max_threads();
	if (m->n_threads > nthr)
		nthr = m->n_threads;
	if (nthr < 1)
		nthr = 1;

	int ok = 1;
	uint64_t bytes = 0; /* what the context holds, for a memory budget */
#define AL(ptr, count) do { (ptr) = calloc((size_t)(count), sizeof *(ptr)); if (!(ptr)) ok = 0; \
	bytes += (uint64_t)(count) * sizeof *(ptr); } while (0)
	AL(c->kcache, (size_t)hp->n_attn_layers * c->n_ctx * nkv + 1);
	AL(c->vcache, (size_t)hp->n_attn_layers * c->n_ctx * nkv + 1);
	AL(c->conv_state, (size_t)hp->n_rec_layers * (hp->ssm_k - 1) * hp->ssm_conv_ch + 1);
	AL(c->ssm_state, (size_t)hp->n_rec_layers * hp->ssm_nv * hp->ssm_dv * hp->ssm_dk + 1);
	AL(c->x, nb * H);
	AL(c->xn, nb * H);
	AL(c->y, nb * H);
	for (int i = 0; i < 4; i++)
		AL(c->big[i], nb * wide);
	AL(c->small0, nb * narrow);
	AL(c->small1, nb * narrow);
	c->score_stride = (size_t)c->n_ctx + 16 + 64 * (size_t)hp->head_dim;
	AL(c->scores, (size_t)nthr * c->score_stride);
	c->n_thr_scores = nthr;
	AL(c->eo, nb * K * H);
	AL(c->xg, nb * H);
	AL(c->sel, nb * K);
	AL(c->selw, nb * K);
	AL(c->tok_list, nb * K);
	AL(c->slot_list, nb * K);
	AL(c->pos4, nb * 4);
	AL(c->logits, hp->n_vocab);
	/* converted activations: at most 4 bytes per element for every type */
	for (int i = 0; i < 4; i++) {
		c->act.buf[i] = malloc((size_t)wide * 4 + 4096);
		c->act2.buf[i] = malloc((size_t)wide * 4 + 4096);
		if (!c->act.buf[i] || !c->act2.buf[i])
			ok = 0;
		bytes += 2 * ((uint64_t)wide * 4 + 4096);
	}
	AL(c->embd_row, m->tok_embd.row_bytes + 64);
#undef AL
	if (!ok) {
		mcv_ctx_free(c);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for a context of %d tokens", p->n_ctx);
	}
	if (m->les.mem == 0) {
		/* what the first evaluation would otherwise pay inside the
		 * caller's time to first token: the thread pool, the barrier
		 * prices (set_threads) and prefill.c's scratch */
		const int T = m->n_threads > 0 ? m->n_threads : omp_get_max_threads();
		if (T > 1) {
			barrier_us(T);
			mcv_prefill_barrier_us(T);
		}
		mcv_prefill_prepare(c, T);
	}
	if (m->les.mem > 0) {
		/* the expert prefill scratch: gathered rows, gate, up, down per thread */
		bytes += (uint64_t)nthr * nb * (2 * (uint64_t)H + 2 * (uint64_t)hp->n_ff_exp) * sizeof(float);
		int rc = mcv_les_init(&c->les, m, bytes, err);
		if (rc < 0) {
			mcv_ctx_free(c);
			return rc;
		}
	}
	*out = c;
	return 0;
}

void mcv_ctx_free(mcv_ctx *c)
{
	if (!c)
		return;
	mcv_les_free(c->les);
	mcv_prefill_free(c->pf);
	free(c->embd_row);
	free(c->kcache);
	free(c->vcache);
	free(c->conv_state);
	free(c->ssm_state);
	free(c->x);
	free(c->xn);
	free(c->y);
	for (int i = 0; i < 4; i++) {
		free(c->big[i]);
		free(c->act.buf[i]);
		free(c->act2.buf[i]);
	}
	free(c->small0);
	free(c->small1);
	free(c->scores);
	free(c->eo);
	free(c->xg);
	free(c->sel);
	free(c->selw);
	free(c->tok_list);
	free(c->slot_list);
	free(c->pos4);
	free(c->logits);
	free(c);
}

void mcv_ctx_reset(mcv_ctx *c)
{
	const mcv_hparams *hp = &c->m->hp;
	c->pos = 0;
	/* The KV cache needs no clearing (cells past pos are never read);
	 * the recurrent state starts from zero. */
	memset(c->conv_state, 0, sizeof(float) * ((size_t)hp->n_rec_layers * (hp->ssm_k - 1) * hp->ssm_conv_ch));
	memset(c->ssm_state, 0, sizeof(float) * ((size_t)hp->n_rec_layers * hp->ssm_nv * hp->ssm_dv * hp->ssm_dk));
}

int mcv_ctx_pos(const mcv_ctx *c) { return c->pos; }
const float *mcv_ctx_logits(const mcv_ctx *c) { return c->logits; }

void mcv_ctx_set_layer_hook(mcv_ctx *c, mcv_layer_hook_fn fn, void *user)
{
	c->layer_hook = fn;
	c->layer_hook_user = user;
}

/* ---- the layer loop ---- */

/* c->x[nt][H] and c->pos4 are filled; runs every layer and, if last,
 * the head on the final row. */
static void run_layers(mcv_ctx *c, int nt, int last)
{
	mcv_model *m = c->m;
	const mcv_hparams *hp = &m->hp;
	const int H = hp->n_embd;
	/* a prefill runs in one parallel region (prefill.c) when it can */
	const int done = nt > 1 && !mm_hook && mcv_prefill_layers(c, nt) == 0;
	for (int il = 0; il < hp->n_layer && !done; il++) {
		const mcv_layer *L = &m->layers[il];
		if (c->les)
			mcv_les_layer_start(c->les, il, c->x + (size_t)(nt - 1) * H, nt, c->pos);
		for (int t = 0; t < nt; t++)
			mcv_rms_norm(c->xn + (size_t)t * H, c->x + (size_t)t * H, L->attn_norm.data, H, hp->eps);
		mcv_act_set(&c->act, c->xn, H);
		if (L->recurrent)
			mcv_deltanet_forward(c, L, nt);
		else
			mcv_attn_forward(c, L, nt, c->pos);
		for (size_t i = 0; i < (size_t)nt * H; i++)
			c->x[i] += c->y[i];

		for (int t = 0; t < nt; t++)
			mcv_rms_norm(c->xn + (size_t)t * H, c->x + (size_t)t * H, L->post_norm.data, H, hp->eps);
		mcv_act_set(&c->act, c->xn, H);
		if (hp->moe)
			mcv_moe_forward(c, L, nt);
		else
			mcv_ffn_forward(c, L, nt);
		for (size_t i = 0; i < (size_t)nt * H; i++)
			c->x[i] += c->y[i];
		if (c->layer_hook)
			for (int t = 0; t < nt; t++)
				c->layer_hook(c->layer_hook_user, il, c->pos + t, c->x + (size_t)t * H, H);
	}
	c->pos += nt;
	if (last) {
		const float *xl = c->x + (size_t)(nt - 1) * H;
		mcv_rms_norm(c->xn, xl, m->output_norm.data, H, hp->eps);
		if (c->layer_hook)
			c->layer_hook(c->layer_hook_user, hp->n_layer, c->pos - 1, c->xn, H);
		mcv_act_set(&c->act, c->xn, H);
		mcv_wt_mm(&m->output, 0, hp->n_vocab, c->xn, 1, c->logits, &c->act);
	}
}

/* A failure inside a layer (an expert read) ends the evaluation: the
 * logits are not valid and the caller must not sample from them. */
static int les_failed(mcv_ctx *c, mcv_error *err)
{
	if (!c->les_rc)
		return 0;
	const int rc = c->les_rc;
	if (err)
		*err = c->les_err;
	c->les_rc = 0;
	return rc;
}

static int check_room(mcv_ctx *c, int n, mcv_error *err)
{
	if (n <= 0)
		return mcv_error_set(err, MCV_EINVAL, "nothing to evaluate (n = %d)", n);
	if (n > c->n_ctx - c->pos)
		return mcv_error_set(err, MCV_EBUDGET, "context full: %d + %d tokens exceed n_ctx %d",
				     c->pos, n, c->n_ctx);
	return 0;
}

/* ---- how many threads an evaluation gets ----
 *
 * Every step that is split between threads ends at a barrier (or a
 * fork/join).  With OMP_WAIT_POLICY=passive, the setting for a shared
 * machine, a sleeping thread is woken through the kernel: ~17 us per
 * barrier on 2 cores here, against ~0.5 us when threads spin.  A decode
 * step of a small model (the proving model reads ~8 MB of weights per
 * token: ~0.25 ms) pays more in wake-ups than a second thread saves, so an
 * evaluation whose work is below what its synchronisation costs runs on one
 * thread.  The result does not depend on the choice (every element is
 * computed by the same operations on any thread). */

/* Weight bytes a single thread streams per microsecond in these products
 * (measured: 53 prefill rows of the proving model, AVX-512 VNNI). */
#define BYTES_PER_US 30000.0

/* The price of one barrier of this process's OpenMP runtime with n
 * threads, measured once (the wait policy is fixed at start-up). */
static double barrier_us(int n)
{
	static double cost[2]; /* [0]: n, [1]: us */
	double u;
#pragma omp atomic read
	u = cost[1];
	if (u > 0 && cost[0] == n)
		return u;
	enum { REPS = 24 };
	double t0 = omp_get_wtime();
#pragma omp parallel num_threads(n)
	for (int i = 0; i < REPS; i++) {
#pragma omp barrier
	}
	u = (omp_get_wtime() - t0) * 1e6 / (REPS + 1);
	if (u <= 0)
		u = 0.01;
#pragma omp critical(mcv_barrier_cost)
	{
		cost[0] = n;
		cost[1] = u;
	}
	return u;
}

/* Weight bytes one row of an evaluation reads: every layer's projections,
 * the k routed experts and the shared expert (the LM head is counted once
 * per evaluation by the caller). */
static double row_bytes(const mcv_model *m)
{
	const mcv_hparams *hp = &m->hp;
	double b = 0;
	for (int il = 0; il < hp->n_layer; il++) {
		const mcv_layer *L = &m->layers[il];
		const mcv_wt *all[] = { &L->ssm_qkv, &L->ssm_gate, &L->ssm_beta, &L->ssm_alpha, &L->ssm_out,
					&L->wq, &L->wk, &L->wv, &L->wqkv, &L->wo, &L->gate_inp, &L->gate_shexp,
					&L->up_shexp, &L->down_shexp, &L->ffn_gate, &L->ffn_up, &L->ffn_down };
		for (size_t i = 0; i < sizeof all / sizeof *all; i++)
			if (all[i]->data)
				b += (double)all[i]->row_bytes * (double)(all[i]->ne[1] * all[i]->ne[2]);
		if (hp->moe) {
			const mcv_wt *e[] = { &L->gate_exps, &L->up_exps, &L->gate_up_exps, &L->down_exps };
			for (size_t i = 0; i < sizeof e / sizeof *e; i++)
				if (e[i]->data && e[i]->ne[2] > 0)
					b += (double)e[i]->row_bytes * (double)e[i]->ne[1] * hp->n_expert_used;
		}
	}
	return b;
}

/* Set the thread count for an evaluation of nt rows; returns the count to
 * restore afterwards. */
static int set_threads(mcv_ctx *c, int nt)
{
	const int prev = omp_get_max_threads();
	int T = c->m->n_threads > 0 ? c->m->n_threads : prev;
	/* MCV_SPLIT=always: every evaluation on all threads (tests of the
	 * thread-count independence on small models) */
	const char *split = getenv("MCV_SPLIT");
	if (T > 1 && !c->les && !(split && !strcmp(split, "always"))) {
		if (c->row_bytes <= 0)
			c->row_bytes = row_bytes(c->m);
		const mcv_wt *o = &c->m->output;
		const double work = (nt * c->row_bytes + (double)o->row_bytes * (double)o->ne[1]) / BYTES_PER_US;
		/* ~14 barriers per layer in prefill.c's region (its own barrier,
		 * which spins briefly), ~24 OpenMP fork/joins (each about two
		 * barriers) per layer in the per-block forms of a decode step */
		const double sync = nt > 1 ? 14 * c->m->hp.n_layer * mcv_prefill_barrier_us(T) + 2 * barrier_us(T)
				  : 48 * c->m->hp.n_layer * barrier_us(T);
		if (work * (1.0 - 1.0 / T) < sync)
			T = 1;
	}
	omp_set_num_threads(T);
	return prev;
}

int mcv_ctx_eval(mcv_ctx *c, const int32_t *tokens, int n, mcv_error *err)
{
	int rc = check_room(c, n, err);
	if (rc < 0)
		return rc;
	const mcv_hparams *hp = &c->m->hp;
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
			return mcv_error_set(err, MCV_EINVAL, "token %d at %d is outside the vocabulary (%d)",
					     tokens[i], i, hp->n_vocab);
	const int prev = set_threads(c, n < c->n_batch ? n : c->n_batch);
	const mcv_wt *te = &c->m->tok_embd;
	for (int i0 = 0; i0 < n; i0 += c->n_batch) {
		const int nt = n - i0 < c->n_batch ? n - i0 : c->n_batch;
		for (int t = 0; t < nt; t++) {
			/* only the rows used are dequantized; with a budget they
			 * are read from the file, the table is never mapped in */
			const void *row = (const char *)te->data + (size_t)tokens[i0 + t] * te->row_bytes;
			if (c->les && te->data != c->m->output.data) {
				rc = mcv_les_read_row(c->les, c->m->tok_embd_off + (uint64_t)tokens[i0 + t] * te->row_bytes,
						      te->row_bytes, c->embd_row, err);
				if (rc < 0)
					break;
				row = c->embd_row;
			}
			mcv_dequantize_row(te->type, row, c->x + (size_t)t * hp->n_embd, hp->n_embd);
			const int32_t p = c->pos + t;
			int32_t *p4 = c->pos4 + 4 * t;
			p4[0] = p4[1] = p4[2] = p;
			p4[3] = 0;
		}
		if (rc < 0)
			break;
		run_layers(c, nt, i0 + nt == n);
		if ((rc = les_failed(c, err)) < 0)
			break;
	}
	omp_set_num_threads(prev);
	return rc < 0 ? rc : 0;
}

int mcv_ctx_eval_embd(mcv_ctx *c, const float *embd, const int32_t *pos, int n,
		      mcv_error *err)
{
	int rc = check_room(c, n, err);
	if (rc < 0)
		return rc;
	const int H = c->m->hp.n_embd;
	const int prev = set_threads(c, n < c->n_batch ? n : c->n_batch);
	for (int i0 = 0; i0 < n; i0 += c->n_batch) {
		const int nt = n - i0 < c->n_batch ? n - i0 : c->n_batch;
		memcpy(c->x, embd + (size_t)i0 * H, sizeof(float) * (size_t)nt * H);
		memcpy(c->pos4, pos + (size_t)i0 * 4, sizeof(int32_t) * 4 * (size_t)nt);
		run_layers(c, nt, i0 + nt == n);
		if ((rc = les_failed(c, err)) < 0)
			break;
	}
	omp_set_num_threads(prev);
	return rc < 0 ? rc : 0;
}

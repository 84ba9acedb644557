/* mcv-genmodel: write a random-weight qwen35 / qwen35moe GGUF of any shape.
 *
 * Used by tests (tiny shapes, every block type) and benchmarks (the real
 * 35B-A3B shape, ~20 GB).  Weights come from a counter-based generator keyed
 * by (seed, tensor name, row), so rows are produced independently on every
 * thread and the file does not depend on the thread count.  Tensors are
 * streamed through the GGUF writer in bounded chunks: memory use is a few
 * tens of MB whatever the model size.  The writer renames into place only on
 * success, and SIGINT/SIGTERM abort it cleanly, so no partial file remains.
 *
 * The scales keep a pre-norm residual network in a sane range: matrices whose
 * input is RMS-normalised get std 1/sqrt(n_in), norm weights sit near 1, the
 * output head gives logits with a std of about 3 so greedy decoding has clear
 * margins, and rows of control / unused tokens are damped so that greedy
 * output stays on byte and merge tokens (readable text, no early EOS). */
#include "gguf.h"
#include "mcv.h"
#include "blocks.h"
#include "quant.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PROG "mcv-genmodel"

/* ---------------------------------------------------------------- shape -- */

typedef struct shape {
	int moe;             /* 1: qwen35moe, 0: qwen35 (dense) */
	int64_t L, H, nh, nkv, hd, rope, nk, nv, dk, E, k, F, SF, FF, V, ctx;
	int64_t conv, interval;
} shape;

static const shape shape_tiny = {
	.moe = 1, .L = 4, .H = 256, .nh = 4, .nkv = 2, .hd = 64, .rope = 16,
	.nk = 2, .nv = 4, .dk = 64, .E = 8, .k = 2, .F = 256, .SF = 256,
	.FF = 512, .V = 1024, .ctx = 4096, .conv = 4, .interval = 4,
};
static const shape shape_small = {
	.moe = 1, .L = 8, .H = 1024, .nh = 8, .nkv = 2, .hd = 128, .rope = 32,
	.nk = 8, .nv = 16, .dk = 128, .E = 16, .k = 4, .F = 512, .SF = 512,
	.FF = 2816, .V = 16384, .ctx = 32768, .conv = 4, .interval = 4,
};
/* Qwen3.5-35B-A3B text backbone (see shared/QWEN35MOE.md). */
static const shape shape_35b = {
	.moe = 1, .L = 40, .H = 2048, .nh = 16, .nkv = 2, .hd = 256, .rope = 64,
	.nk = 16, .nv = 32, .dk = 128, .E = 256, .k = 8, .F = 512, .SF = 512,
	.FF = 6144, .V = 248320, .ctx = 262144, .conv = 4, .interval = 4,
};
/* A 1B-class dense backbone in the style of Qwen3.5's small models
 * (approximate: the exact MiniCPM-V 4.7 1B config was not available). */
static const shape shape_1b = {
	.moe = 0, .L = 24, .H = 1024, .nh = 8, .nkv = 2, .hd = 256, .rope = 64,
	.nk = 16, .nv = 16, .dk = 128, .E = 0, .k = 0, .F = 0, .SF = 0,
	.FF = 3584, .V = 248320, .ctx = 262144, .conv = 4, .interval = 4,
};

/* -------------------------------------------------------------- tokenizer -- */

/* Common English pairs in GPT-2 byte-level form ("\xc4\xa0" is U+0120, the
 * stand-in for a space); each merge's parts exist before it. */
static const char *const merges[] = {
	"\xc4\xa0 t", "h e", "i n", "e r", "a n", "o n", "\xc4\xa0 a",
	"r e", "\xc4\xa0t he", "o u", "a t", "e n", "\xc4\xa0 s", "e d",
	"i s", "\xc4\xa0 w", "o r", "i t", "\xc4\xa0 o", "n d", "\xc4\xa0 b",
	"\xc4\xa0 c", "e s", "in g", "\xc4\xa0 f", "\xc4\xa0 m", "a l",
};
#define N_MERGES ((int)(sizeof merges / sizeof merges[0]))
static const char *const control_tokens[] = {
	"<|endoftext|>", "<|im_start|>", "<|im_end|>",
};
#define N_CONTROL 3
/* MiniCPM-V prompt markers, added as user-defined tokens as in the real vocab. */
static const char *const user_tokens[] = {
	"<think>", "</think>", "<image>", "</image>", "<slice>", "</slice>",
	"<image_id>", "</image_id>",
};
#define N_USER ((int)(sizeof user_tokens / sizeof user_tokens[0]))
#define N_TEXT_TOKENS (256 + N_MERGES) /* bytes + merge results */
#define MIN_VOCAB (N_TEXT_TOKENS + N_CONTROL + N_USER)

enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5 };

/* GPT-2's byte -> code point map: printable Latin-1 bytes map to themselves,
 * the rest to 256, 257, ... in byte order. */
static unsigned byte_to_cp(unsigned b)
{
	if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))
		return b;
	unsigned n = 0;
	for (unsigned c = 0; c < b; c++)
		if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff)))
			n++;
	return 256 + n;
}

static int utf8_put(char *s, unsigned cp)
{
	if (cp < 0x80) { s[0] = (char)cp; return 1; }
	s[0] = (char)(0xc0 | (cp >> 6));
	s[1] = (char)(0x80 | (cp & 0x3f));
	return 2; /* the map never exceeds U+07FF */
}

typedef struct vocab {
	char **tok;
	int32_t *type;
	int64_t n;
} vocab;

static void vocab_free(vocab *v)
{
	if (v->tok)
		for (int64_t i = 0; i < v->n; i++)
			free(v->tok[i]);
	free(v->tok);
	free(v->type);
	memset(v, 0, sizeof *v);
}

static int vocab_build(vocab *v, int64_t n)
{
	v->n = n;
	v->tok = calloc((size_t)n, sizeof *v->tok);
	v->type = calloc((size_t)n, sizeof *v->type);
	if (!v->tok || !v->type)
		return -1;
	int64_t id = 0;
	for (unsigned b = 0; b < 256; b++, id++) {
		char s[4] = {0};
		utf8_put(s, byte_to_cp(b));
		v->tok[id] = strdup(s);
		v->type[id] = TOK_NORMAL;
	}
	for (int i = 0; i < N_MERGES; i++, id++) {
		const char *sp = strchr(merges[i], ' ');
		size_t a = (size_t)(sp - merges[i]);
		char *s = malloc(strlen(merges[i]));
		if (!s)
			return -1;
		memcpy(s, merges[i], a);
		strcpy(s + a, sp + 1);
		v->tok[id] = s;
		v->type[id] = TOK_NORMAL;
	}
	for (int i = 0; i < N_CONTROL; i++, id++) {
		v->tok[id] = strdup(control_tokens[i]);
		v->type[id] = TOK_CONTROL;
	}
	for (int i = 0; i < N_USER; i++, id++) {
		v->tok[id] = strdup(user_tokens[i]);
		v->type[id] = TOK_USER;
	}
	for (; id < n; id++) {
		char s[32];
		snprintf(s, sizeof s, "[PAD%lld]", (long long)id);
		v->tok[id] = strdup(s);
		v->type[id] = TOK_UNUSED;
	}
	for (int64_t i = 0; i < n; i++)
		if (!v->tok[i])
			return -1;
	return 0;
}

/* ---------------------------------------------------------------- weights -- */

/* How a tensor's values are drawn. */
enum init {
	INIT_UNIFORM, /* std = scale */
	INIT_ONE,     /* 1 + uniform with std = scale (norm weights) */
	INIT_SSM_A,   /* -exp(U(0, ln 16)): decay rates in [-16, -1] */
	INIT_DT_BIAS, /* softplus^-1 of dt, log-uniform in [1e-3, 1e-1] */
	INIT_OUTPUT,  /* as UNIFORM, rows of non-text tokens damped */
};

typedef struct tdesc {
	char name[64];
	int type;
	int n_dims;
	int64_t ne[4];
	int init;
	float scale;
} tdesc;

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
	return mix64(h);
}

/* Row r of a tensor: a splitmix64 stream started from (seed, name, r); each
 * 64-bit draw gives two uniforms in [-1, 1). */
static void gen_row(const tdesc *t, uint64_t key, int64_t r, int64_t n, float *x)
{
	uint64_t s = mix64(key ^ mix64((uint64_t)r + 0x9e3779b97f4a7c15ULL));
	const float k = 1.0f / 2147483648.0f;
	for (int64_t j = 0; j < n; j += 2) {
		s += 0x9e3779b97f4a7c15ULL;
		uint64_t z = mix64(s);
		x[j] = (float)(int32_t)(uint32_t)z * k;
		if (j + 1 < n)
			x[j + 1] = (float)(int32_t)(uint32_t)(z >> 32) * k;
	}
	const float u2s = 1.7320508f; /* uniform [-1,1) has std 1/sqrt(3) */
	switch (t->init) {
	case INIT_UNIFORM:
		for (int64_t j = 0; j < n; j++)
			x[j] *= t->scale * u2s;
		break;
	case INIT_OUTPUT: {
		float sc = t->scale * u2s * (r < N_TEXT_TOKENS ? 1.0f : 0.25f);
		for (int64_t j = 0; j < n; j++)
			x[j] *= sc;
		break;
	}
	case INIT_ONE:
		for (int64_t j = 0; j < n; j++)
			x[j] = 1.0f + x[j] * t->scale * u2s;
		break;
	case INIT_SSM_A:
		for (int64_t j = 0; j < n; j++)
			x[j] = -expf((x[j] + 1.0f) * 0.5f * logf(16.0f));
		break;
	case INIT_DT_BIAS:
		for (int64_t j = 0; j < n; j++) {
			float lo = logf(1e-3f), hi = logf(1e-1f);
			float dt = expf(lo + (x[j] + 1.0f) * 0.5f * (hi - lo));
			x[j] = dt + logf(-expm1f(-dt)); /* log(exp(dt) - 1), stably */
		}
		break;
	}
}

/* --fast-quant: a one-pass Q4_K encoder (min/max per 32-element sub-block,
 * scales rounded once) instead of ggml's iterative search, which costs ~65 ns
 * per weight and would take hours for the 35B shape on two busy cores.  The
 * blocks are valid Q4_K (any reader decodes them the same way); only the
 * rounding error is a little larger, which random weights do not care about. */
static void q4_K_fast(const float *x, block_q4_K *y, int64_t n)
{
	for (int64_t b = 0; b < n / MCV_QK_K; b++, x += MCV_QK_K, y++) {
		float scale[8], mn[8], smax = 0, mmax = 0;
		for (int j = 0; j < 8; j++) {
			float lo = 0, hi = 0; /* the min is clamped at 0, as in ggml */
			for (int l = 0; l < 32; l++) {
				float v = x[32 * j + l];
				lo = v < lo ? v : lo;
				hi = v > hi ? v : hi;
			}
			scale[j] = (hi - lo) / 15.0f;
			mn[j] = -lo;
			smax = scale[j] > smax ? scale[j] : smax;
			mmax = mn[j] > mmax ? mn[j] : mmax;
		}
		float d = smax / 63.0f, dmin = mmax / 63.0f;
		y->d = mcv_fp32_to_fp16(d);
		y->dmin = mcv_fp32_to_fp16(dmin);
		d = mcv_fp16_to_fp32(y->d);
		dmin = mcv_fp16_to_fp32(y->dmin);
		uint8_t sc[8], m[8];
		for (int j = 0; j < 8; j++) {
			int a = d > 0 ? (int)lrintf(scale[j] / d) : 0;
			int c = dmin > 0 ? (int)lrintf(mn[j] / dmin) : 0;
			sc[j] = (uint8_t)(a < 0 ? 0 : a > 63 ? 63 : a);
			m[j] = (uint8_t)(c < 0 ? 0 : c > 63 ? 63 : c);
		}
		memset(y->scales, 0, sizeof y->scales);
		for (int j = 0; j < 4; j++) {
			y->scales[j] = sc[j];
			y->scales[j + 4] = m[j];
		}
		for (int j = 4; j < 8; j++) {
			y->scales[j + 4] = (uint8_t)((sc[j] & 15) | ((m[j] & 15) << 4));
			y->scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
			y->scales[j] |= (uint8_t)((m[j] >> 4) << 6);
		}
		for (int j = 0; j < 8; j++) {
			float ds = d * sc[j], dm = dmin * m[j];
			float inv = ds > 0 ? 1.0f / ds : 0;
			for (int l = 0; l < 32; l++) {
				int q = (int)lrintf((x[32 * j + l] + dm) * inv);
				q = q < 0 ? 0 : q > 15 ? 15 : q;
				uint8_t *p = &y->qs[32 * (j / 2) + l];
				*p = (uint8_t)(j % 2 ? (*p & 15) | (q << 4) : q);
			}
		}
	}
}

static bool fast_quant;

static void convert_row(int type, const float *x, void *y, int64_t n)
{
	if (fast_quant && type == MCV_Q4_K) {
		q4_K_fast(x, y, n);
		return;
	}
	switch (type) {
	case MCV_F32:
		memcpy(y, x, (size_t)n * sizeof(float));
		break;
	case MCV_F16:
		for (int64_t j = 0; j < n; j++)
			((uint16_t *)y)[j] = mcv_fp32_to_fp16(x[j]);
		break;
	case MCV_BF16:
		for (int64_t j = 0; j < n; j++)
			((uint16_t *)y)[j] = mcv_fp32_to_bf16(x[j]);
		break;
	default:
		mcv_quantize_row_ref(type, x, y, n);
	}
}

/* ------------------------------------------------------------ tensor list -- */

typedef struct tlist {
	tdesc *t;
	int n, cap;
} tlist;

static int types_ok[] = { MCV_F32, MCV_F16, MCV_BF16, MCV_Q8_0, MCV_Q4_0,
			  MCV_Q2_K, MCV_Q3_K, MCV_Q4_K, MCV_Q5_K, MCV_Q6_K };

static tdesc *tl_add(tlist *l, int type, int init, float scale, int n_dims,
		     int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, ...)
	__attribute__((format(printf, 9, 10)));

static tdesc *tl_add(tlist *l, int type, int init, float scale, int n_dims,
		     int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, ...)
{
	if (l->n == l->cap) {
		int cap = l->cap ? l->cap * 2 : 256;
		tdesc *p = realloc(l->t, (size_t)cap * sizeof *p);
		if (!p)
			return NULL;
		l->t = p;
		l->cap = cap;
	}
	tdesc *t = &l->t[l->n++];
	memset(t, 0, sizeof *t);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->name, sizeof t->name, fmt, ap);
	va_end(ap);
	t->type = type;
	t->init = init;
	t->scale = scale;
	t->n_dims = n_dims;
	t->ne[0] = ne0;
	t->ne[1] = n_dims > 1 ? ne1 : 1;
	t->ne[2] = n_dims > 2 ? ne2 : 1;
	t->ne[3] = 1;
	return t;
}

typedef struct types {
	int main, exp, embd, out;
} types;

static int is_recurrent(const shape *s, int64_t il)
{
	return (il + 1) % s->interval != 0;
}

/* The tensors llama.cpp's qwen35 / qwen35moe loader wants, in file order. */
static int build_tensors(tlist *l, const shape *s, const types *ty)
{
	const float H = (float)s->H;
	const int64_t Dk = s->dk * s->nk, Dv = s->dk * s->nv, C = 2 * Dk + Dv;
	const int T = ty->main, X = ty->exp;
	bool ok = true;
#define ADD(...) ok = ok && tl_add(l, __VA_ARGS__)
	ADD(ty->embd, INIT_UNIFORM, 1.0f, 2, s->H, s->V, 1, "token_embd.weight");
	for (int64_t il = 0; il < s->L; il++) {
		long long i = (long long)il;
		ADD(MCV_F32, INIT_ONE, 0.1f, 1, s->H, 1, 1, "blk.%lld.attn_norm.weight", i);
		if (is_recurrent(s, il)) {
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, C, 1, "blk.%lld.attn_qkv.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, Dv, 1, "blk.%lld.attn_gate.weight", i);
			ADD(MCV_F32, INIT_UNIFORM, 0.5f, 2, s->conv, C, 1, "blk.%lld.ssm_conv1d.weight", i);
			ADD(MCV_F32, INIT_DT_BIAS, 0, 1, s->nv, 1, 1, "blk.%lld.ssm_dt.bias", i);
			ADD(MCV_F32, INIT_SSM_A, 0, 1, s->nv, 1, 1, "blk.%lld.ssm_a", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, s->nv, 1, "blk.%lld.ssm_beta.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, s->nv, 1, "blk.%lld.ssm_alpha.weight", i);
			ADD(MCV_F32, INIT_ONE, 0.1f, 1, s->dk, 1, 1, "blk.%lld.ssm_norm.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf((float)Dv), 2, Dv, s->H, 1, "blk.%lld.ssm_out.weight", i);
		} else {
			int64_t q = s->hd * s->nh, kv = s->hd * s->nkv;
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, 2 * q, 1, "blk.%lld.attn_q.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, kv, 1, "blk.%lld.attn_k.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, kv, 1, "blk.%lld.attn_v.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf((float)q), 2, q, s->H, 1, "blk.%lld.attn_output.weight", i);
			ADD(MCV_F32, INIT_ONE, 0.1f, 1, s->hd, 1, 1, "blk.%lld.attn_q_norm.weight", i);
			ADD(MCV_F32, INIT_ONE, 0.1f, 1, s->hd, 1, 1, "blk.%lld.attn_k_norm.weight", i);
		}
		ADD(MCV_F32, INIT_ONE, 0.1f, 1, s->H, 1, 1, "blk.%lld.post_attention_norm.weight", i);
		if (s->moe) {
			/* router logits with std ~2: peaked enough that different
			 * tokens pick different experts */
			ADD(MCV_F32, INIT_UNIFORM, 2 / sqrtf(H), 2, s->H, s->E, 1, "blk.%lld.ffn_gate_inp.weight", i);
			ADD(X, INIT_UNIFORM, 1 / sqrtf(H), 3, s->H, s->F, s->E, "blk.%lld.ffn_gate_exps.weight", i);
			ADD(X, INIT_UNIFORM, 1 / sqrtf(H), 3, s->H, s->F, s->E, "blk.%lld.ffn_up_exps.weight", i);
			ADD(X, INIT_UNIFORM, 1 / sqrtf((float)s->F), 3, s->F, s->H, s->E, "blk.%lld.ffn_down_exps.weight", i);
			ADD(MCV_F32, INIT_UNIFORM, 1 / sqrtf(H), 1, s->H, 1, 1, "blk.%lld.ffn_gate_inp_shexp.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, s->SF, 1, "blk.%lld.ffn_gate_shexp.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, s->SF, 1, "blk.%lld.ffn_up_shexp.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf((float)s->SF), 2, s->SF, s->H, 1, "blk.%lld.ffn_down_shexp.weight", i);
		} else {
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, s->FF, 1, "blk.%lld.ffn_gate.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf(H), 2, s->H, s->FF, 1, "blk.%lld.ffn_up.weight", i);
			ADD(T, INIT_UNIFORM, 1 / sqrtf((float)s->FF), 2, s->FF, s->H, 1, "blk.%lld.ffn_down.weight", i);
		}
	}
	ADD(MCV_F32, INIT_ONE, 0.05f, 1, s->H, 1, 1, "output_norm.weight");
	/* logits = norm(h) . W: std ~3 with a unit-RMS input */
	ADD(ty->out, INIT_OUTPUT, 3 / sqrtf(H), 2, s->H, s->V, 1, "output.weight");
#undef ADD
	return ok ? 0 : -1;
}

static uint64_t tensor_bytes(const tdesc *t)
{
	return (uint64_t)mcv_row_bytes(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2]);
}

/* ---------------------------------------------------------------- output -- */

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { stop_signal = sig; }

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct progress {
	bool tty, quiet;
	uint64_t done, total;
	double t0, last;
} progress;

static void progress_show(progress *p, bool final)
{
	if (!p->tty || p->quiet)
		return;
	double t = now_s();
	if (!final && t - p->last < 0.25)
		return;
	p->last = t;
	double el = t - p->t0 > 1e-6 ? t - p->t0 : 1e-6;
	fprintf(stderr, "\r" PROG ": %.2f / %.2f GB (%5.1f%%) %.0f MB/s   ",
		p->done / 1e9, p->total / 1e9,
		p->total ? 100.0 * p->done / p->total : 100.0, p->done / el / 1e6);
	if (final)
		fputc('\n', stderr);
}

static int write_kv(mcv_gguf_writer *w, const shape *s, const vocab *v,
		    const char *shape_name)
{
	const char *a = s->moe ? "qwen35moe" : "qwen35";
	char k[128];
	int rc = 0;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", a, suffix), k)
	rc |= mcv_gguf_w_str(w, "general.architecture", a);
	char name[96];
	snprintf(name, sizeof name, "mcv random %s %s", a, shape_name);
	rc |= mcv_gguf_w_str(w, "general.name", name);
	rc |= mcv_gguf_w_u32(w, KEY("context_length"), (uint32_t)s->ctx);
	rc |= mcv_gguf_w_u32(w, KEY("embedding_length"), (uint32_t)s->H);
	rc |= mcv_gguf_w_u32(w, KEY("block_count"), (uint32_t)s->L);
	if (!s->moe)
		rc |= mcv_gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)s->FF);
	rc |= mcv_gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)s->nh);
	rc |= mcv_gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->nkv);
	rc |= mcv_gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)s->hd);
	rc |= mcv_gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)s->hd);
	rc |= mcv_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
	rc |= mcv_gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)s->rope);
	/* M-RoPE sections in Qwen3.5's 11:11:10 proportion, summing to rope/2 */
	int32_t half = (int32_t)(s->rope / 2), sec[4];
	sec[0] = sec[1] = (half * 11 + 16) / 32;
	sec[2] = half - 2 * sec[0];
	sec[3] = 0;
	rc |= mcv_gguf_w_arr(w, KEY("rope.dimension_sections"), GGUF_I32, sec, 4);
	rc |= mcv_gguf_w_f32(w, KEY("rope.freq_base"), 1e7f);
	rc |= mcv_gguf_w_u32(w, KEY("ssm.conv_kernel"), (uint32_t)s->conv);
	rc |= mcv_gguf_w_u32(w, KEY("ssm.inner_size"), (uint32_t)(s->dk * s->nv));
	rc |= mcv_gguf_w_u32(w, KEY("ssm.state_size"), (uint32_t)s->dk);
	rc |= mcv_gguf_w_u32(w, KEY("ssm.time_step_rank"), (uint32_t)s->nv);
	rc |= mcv_gguf_w_u32(w, KEY("ssm.group_count"), (uint32_t)s->nk);
	rc |= mcv_gguf_w_u32(w, KEY("full_attention_interval"), (uint32_t)s->interval);
	if (s->moe) {
		rc |= mcv_gguf_w_u32(w, KEY("expert_count"), (uint32_t)s->E);
		rc |= mcv_gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)s->k);
		rc |= mcv_gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)s->F);
		rc |= mcv_gguf_w_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)s->SF);
	}
#undef KEY
	rc |= mcv_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
	rc |= mcv_gguf_w_str(w, "tokenizer.ggml.pre", "qwen35");
	rc |= mcv_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, (uint64_t)v->n);
	rc |= mcv_gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_I32, v->type, (uint64_t)v->n);
	rc |= mcv_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, N_MERGES);
	const uint32_t eot = N_TEXT_TOKENS; /* <|endoftext|> */
	rc |= mcv_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", eot);
	rc |= mcv_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", eot);
	rc |= mcv_gguf_w_u32(w, "tokenizer.ggml.padding_token_id", eot);
	rc |= mcv_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
	return rc ? -1 : 0;
}

#define CHUNK_BYTES (8u << 20)

/* Generate rows [r0, r1) of t into buf (packed rows), in parallel. */
static void gen_rows(const tdesc *t, uint64_t key, int64_t r0, int64_t r1,
		     uint8_t *buf, size_t row_bytes, float **scratch)
{
	#pragma omp parallel for schedule(dynamic, 4)
	for (int64_t r = r0; r < r1; r++) {
		int tid = 0;
#ifdef _OPENMP
		tid = omp_get_thread_num();
#endif
		float *x = scratch[tid];
		gen_row(t, key, r, t->ne[0], x);
		convert_row(t->type, x, buf + (size_t)(r - r0) * row_bytes, t->ne[0]);
	}
}

/* Compare the written file with a fresh generation, through mcv's reader. */
static int check_file(const char *path, const tlist *tl, const shape *s, uint64_t seed,
		      float **scratch, int64_t max_row, mcv_error *err)
{
	mcv_gguf *g = NULL;
	int rc = mcv_gguf_open(&g, path, err);
	if (rc)
		return rc;
	const char *arch = NULL;
	char key[96];
	uint32_t nl = 0, ne = 0;
	int et;
	uint64_t ntok = 0, nmerge = 0;
	const void *arr;
	snprintf(key, sizeof key, "%s.block_count", s->moe ? "qwen35moe" : "qwen35");
	if ((rc = mcv_gguf_get_str(g, "general.architecture", &arch, err)) ||
	    (rc = mcv_gguf_get_u32(g, key, &nl, err)) ||
	    (rc = mcv_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &ntok, &arr, err)) ||
	    (rc = mcv_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &nmerge, &arr, err)))
		goto out;
	snprintf(key, sizeof key, "%s.embedding_length", arch);
	if ((rc = mcv_gguf_get_u32(g, key, &ne, err)))
		goto out;
	if (strcmp(arch, s->moe ? "qwen35moe" : "qwen35") || nl != s->L || ne != s->H ||
	    ntok != (uint64_t)s->V || nmerge != N_MERGES) {
		rc = mcv_error_set(err, MCV_EFORMAT, "%s: metadata differs from what was written", path);
		goto out;
	}
	size_t len = 0;
	const char *im = mcv_gguf_arr_str(g, "tokenizer.ggml.tokens", N_TEXT_TOKENS + 1, &len);
	if (!im || strcmp(im, "<|im_start|>")) {
		rc = mcv_error_set(err, MCV_EFORMAT, "%s: token %d is not <|im_start|>", path, N_TEXT_TOKENS + 1);
		goto out;
	}
	if (mcv_gguf_n_tensors(g) != tl->n) {
		rc = mcv_error_set(err, MCV_EFORMAT, "%s: %lld tensors, expected %d", path,
				   (long long)mcv_gguf_n_tensors(g), tl->n);
		goto out;
	}
	size_t rb_max = 0;
	for (int i = 0; i < tl->n; i++) {
		size_t rb = mcv_row_bytes(tl->t[i].type, tl->t[i].ne[0]);
		if (rb > rb_max)
			rb_max = rb;
	}
	uint8_t *row = malloc(rb_max);
	if (!row) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < tl->n && !rc; i++) {
		const tdesc *t = &tl->t[i];
		const mcv_gguf_tensor *gt = mcv_gguf_tensor_at(g, i);
		if (!gt || strcmp(gt->name, t->name) || gt->type != t->type ||
		    gt->n_dims != t->n_dims || gt->nbytes != tensor_bytes(t)) {
			rc = mcv_error_set(err, MCV_EFORMAT, "%s: tensor %d is not %s as written",
					   path, i, t->name);
			break;
		}
		for (int d = 0; d < t->n_dims; d++)
			if (gt->ne[d] != t->ne[d])
				rc = mcv_error_set(err, MCV_EFORMAT, "%s: %s: dimension %d differs", path, t->name, d);
		/* every row, or max_row rows spread over the tensor */
		int64_t rows = t->ne[1] * t->ne[2];
		size_t rb = mcv_row_bytes(t->type, t->ne[0]);
		int64_t step = rows > max_row ? rows / max_row : 1;
		uint64_t key = seed ^ hash_name(t->name);
		for (int64_t r = 0; r < rows && !rc; r += step) {
			gen_row(t, key, r, t->ne[0], scratch[0]);
			convert_row(t->type, scratch[0], row, t->ne[0]);
			if (memcmp(row, (const uint8_t *)gt->data + (size_t)r * rb, rb))
				rc = mcv_error_set(err, MCV_EFORMAT, "%s: %s: row %lld differs from the generator",
						   path, t->name, (long long)r);
		}
	}
	free(row);
out:
	mcv_gguf_close(g);
	return rc;
}

/* ----------------------------------------------------------------- main -- */

static void usage(FILE *f)
{
	fprintf(f,
"usage: " PROG " [options] OUTPUT.gguf\n"
"Write a random-weight qwen35 / qwen35moe model (OUTPUT '-' = stdout).\n"
"  --arch qwen35|qwen35moe   architecture (default: from the shape; tiny/small: qwen35moe)\n"
"  --shape tiny|small|35b-a3b|1b  preset (default tiny)\n"
"  --layers N --hidden N --heads N --kv-heads N --head-dim N --rope-dims N\n"
"  --ssm-groups N --ssm-heads N --ssm-state N --conv-kernel N --full-attn-interval N\n"
"  --experts N --experts-used N --expert-ffn N --shared-ffn N --ffn N\n"
"  --vocab N --ctx N         override one dimension of the preset\n"
"  --type T                  large matrices (default q8_0)\n"
"  --expert-type T --embd-type T --output-type T  (default: --type)\n"
"                            T: f32 f16 bf16 q8_0 q4_0 q2_k q3_k q4_k q5_k q6_k\n"
"  --seed N                  weights seed (default 1)\n"
"  --fast-quant              q4_k by a one-pass fit, ~15x faster than ggml's search\n"
"                            (valid blocks, slightly larger error; for huge files)\n"
"  --check                   reopen the result with mcv's reader and compare\n"
"  --verify                  write nothing: compare an existing OUTPUT with what\n"
"                            these options would generate (exit 1 if it differs)\n"
"  -t N                      threads (default: all cores)\n"
"  -q                        no progress or summary\n"
"  -h, --help                this text\n"
"The 35b-a3b shape with --expert-type q4_k is about 20 GB.\n");
}

static int parse_i64(const char *s, int64_t *v)
{
	char *end;
	errno = 0;
	long long x = strtoll(s, &end, 10);
	if (errno || end == s || *end || x < 0 || x > (1LL << 40))
		return -1;
	*v = x;
	return 0;
}

static int parse_type(const char *s)
{
	int t = mcv_type_from_name(s);
	for (size_t i = 0; i < sizeof types_ok / sizeof types_ok[0]; i++)
		if (t == types_ok[i])
			return t;
	return -1;
}

enum {
	O_ARCH = 256, O_SHAPE, O_LAYERS, O_HIDDEN, O_HEADS, O_KV, O_HD, O_ROPE,
	O_SG, O_SH, O_SS, O_CONV, O_INTERVAL, O_E, O_K, O_F, O_SF, O_FF, O_V, O_CTX,
	O_TYPE, O_ETYPE, O_EMBD, O_OUT, O_SEED, O_CHECK, O_FAST, O_VERIFY,
};

static int usage_err(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	fprintf(stderr, "usage: " PROG " [options] OUTPUT.gguf (see --help)\n");
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"arch", 1, 0, O_ARCH}, {"shape", 1, 0, O_SHAPE},
		{"layers", 1, 0, O_LAYERS}, {"hidden", 1, 0, O_HIDDEN},
		{"heads", 1, 0, O_HEADS}, {"kv-heads", 1, 0, O_KV},
		{"head-dim", 1, 0, O_HD}, {"rope-dims", 1, 0, O_ROPE},
		{"ssm-groups", 1, 0, O_SG}, {"ssm-heads", 1, 0, O_SH},
		{"ssm-state", 1, 0, O_SS}, {"conv-kernel", 1, 0, O_CONV},
		{"full-attn-interval", 1, 0, O_INTERVAL},
		{"experts", 1, 0, O_E}, {"experts-used", 1, 0, O_K},
		{"expert-ffn", 1, 0, O_F}, {"shared-ffn", 1, 0, O_SF},
		{"ffn", 1, 0, O_FF}, {"vocab", 1, 0, O_V}, {"ctx", 1, 0, O_CTX},
		{"type", 1, 0, O_TYPE}, {"expert-type", 1, 0, O_ETYPE},
		{"embd-type", 1, 0, O_EMBD}, {"output-type", 1, 0, O_OUT},
		{"seed", 1, 0, O_SEED}, {"check", 0, 0, O_CHECK},
		{"fast-quant", 0, 0, O_FAST}, {"verify", 0, 0, O_VERIFY},
		{"help", 0, 0, 'h'}, {0, 0, 0, 0},
	};
	const char *arch = NULL, *shape_name = "tiny";
	int64_t ov[O_CTX + 1];
	bool set[O_CTX + 1] = {0};
	types ty = { MCV_Q8_0, -1, -1, -1 };
	uint64_t seed = 1;
	bool quiet = false, check = false, verify = false;
	int64_t threads = 0;
	int c;
	while ((c = getopt_long(argc, argv, "hqt:", opts, NULL)) != -1) {
		int64_t x;
		switch (c) {
		case 'h': usage(stdout); return 0;
		case 'q': quiet = true; break;
		case 't':
			if (parse_i64(optarg, &threads) || threads < 1 || threads > 1024)
				return usage_err("bad thread count '%s'", optarg);
			break;
		case O_ARCH:
			if (strcmp(optarg, "qwen35") && strcmp(optarg, "qwen35moe"))
				return usage_err("unknown architecture '%s' (qwen35, qwen35moe)", optarg);
			arch = optarg;
			break;
		case O_SHAPE:
			if (strcmp(optarg, "tiny") && strcmp(optarg, "small") &&
			    strcmp(optarg, "35b-a3b") && strcmp(optarg, "1b"))
				return usage_err("unknown shape '%s' (tiny, small, 35b-a3b, 1b)", optarg);
			shape_name = optarg;
			break;
		case O_TYPE: case O_ETYPE: case O_EMBD: case O_OUT: {
			int t = parse_type(optarg);
			if (t < 0)
				return usage_err("unknown or unsupported type '%s'", optarg);
			if (c == O_TYPE) ty.main = t;
			else if (c == O_ETYPE) ty.exp = t;
			else if (c == O_EMBD) ty.embd = t;
			else ty.out = t;
			break;
		}
		case O_SEED:
			if (parse_i64(optarg, &x))
				return usage_err("bad seed '%s'", optarg);
			seed = (uint64_t)x;
			break;
		case O_CHECK: check = true; break;
		case O_FAST: fast_quant = true; break;
		case O_VERIFY: verify = true; break;
		default:
			if (c >= O_LAYERS && c <= O_CTX) {
				if (parse_i64(optarg, &x) || x < 1 || x > (1 << 24))
					return usage_err("bad value '%s' for --%s", optarg,
							 opts[c - O_ARCH].name);
				ov[c] = x;
				set[c] = true;
				break;
			}
			return usage_err("bad option");
		}
	}
	if (optind != argc - 1)
		return usage_err(optind < argc ? "exactly one OUTPUT expected" : "no OUTPUT given");
	const char *path = argv[optind];

	shape s = !strcmp(shape_name, "small") ? shape_small :
		  !strcmp(shape_name, "35b-a3b") ? shape_35b :
		  !strcmp(shape_name, "1b") ? shape_1b : shape_tiny;
	if (arch)
		s.moe = !strcmp(arch, "qwen35moe");
	if (s.moe && s.E == 0) { /* a dense preset made MoE: borrow the tiny experts */
		s.E = 8; s.k = 2; s.F = 512; s.SF = 512;
	}
	int64_t *dst[O_CTX + 1] = {0};
	dst[O_LAYERS] = &s.L; dst[O_HIDDEN] = &s.H; dst[O_HEADS] = &s.nh;
	dst[O_KV] = &s.nkv; dst[O_HD] = &s.hd; dst[O_ROPE] = &s.rope;
	dst[O_SG] = &s.nk; dst[O_SH] = &s.nv; dst[O_SS] = &s.dk; dst[O_CONV] = &s.conv;
	dst[O_INTERVAL] = &s.interval; dst[O_E] = &s.E; dst[O_K] = &s.k;
	dst[O_F] = &s.F; dst[O_SF] = &s.SF; dst[O_FF] = &s.FF; dst[O_V] = &s.V;
	dst[O_CTX] = &s.ctx;
	bool rope_set = set[O_ROPE];
	for (int i = O_LAYERS; i <= O_CTX; i++)
		if (set[i])
			*dst[i] = ov[i];
	if (set[O_HD] && !rope_set) /* keep Qwen3.5's partial rotary fraction */
		s.rope = s.hd / 4 >= 2 ? (s.hd / 4) & ~1LL : 2;
	if (ty.exp < 0) ty.exp = ty.main;
	if (ty.embd < 0) ty.embd = ty.main;
	if (ty.out < 0) ty.out = ty.main;

	/* consistency of the shape */
	if (s.hd % 2 || s.rope % 2 || s.rope > s.hd || s.rope < 2)
		return usage_err("rope dims (%lld) must be even and within head dim (%lld)",
				 (long long)s.rope, (long long)s.hd);
	if (s.nh % s.nkv)
		return usage_err("heads (%lld) must be a multiple of kv heads (%lld)",
				 (long long)s.nh, (long long)s.nkv);
	if (s.nv % s.nk)
		return usage_err("ssm heads (%lld) must be a multiple of ssm groups (%lld)",
				 (long long)s.nv, (long long)s.nk);
	if (s.moe && s.k > s.E)
		return usage_err("experts used (%lld) exceeds experts (%lld)",
				 (long long)s.k, (long long)s.E);
	if (s.V < MIN_VOCAB)
		return usage_err("vocab must be at least %d (bytes, merges, special tokens)", MIN_VOCAB);
	if (s.V > 0x7fffffff || s.ctx > 0xffffffffLL)
		return usage_err("vocab or ctx too large");

	if (s.interval > s.L && !quiet)
		fprintf(stderr, PROG ": note: no full-attention layer (interval %lld > %lld layers); "
			"node-llama-cpp aborts on such a model\n", (long long)s.interval, (long long)s.L);

	tlist tl = {0};
	if (build_tensors(&tl, &s, &ty)) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	uint64_t total = 0, params = 0;
	int64_t max_ne0 = 0;
	for (int i = 0; i < tl.n; i++) {
		const tdesc *t = &tl.t[i];
		const mcv_type_traits *tr = mcv_type_get(t->type);
		if (!tr || mcv_row_bytes(t->type, t->ne[0]) == 0) {
			fprintf(stderr, PROG ": %s: row length %lld is not a multiple of %d, as %s needs\n",
				t->name, (long long)t->ne[0], tr ? tr->blck : 0, tr ? tr->name : "?");
			free(tl.t);
			return 2;
		}
		total += (tensor_bytes(t) + 31) / 32 * 32;
		params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2]);
		if (t->ne[0] > max_ne0)
			max_ne0 = t->ne[0];
	}

	int rc = 1;
	vocab v = {0};
	mcv_gguf_writer *w = NULL;
	mcv_error err = {0};
	uint8_t *buf = NULL;
	progress pg = { .tty = isatty(2), .quiet = quiet, .total = total };
	int nthr = 1;
#ifdef _OPENMP
	if (threads)
		omp_set_num_threads((int)threads);
	nthr = omp_get_max_threads();
#endif
	float **scratch = calloc((size_t)nthr, sizeof *scratch);
	buf = malloc(CHUNK_BYTES + (size_t)max_ne0 * sizeof(float) * 2);
	if (!scratch || !buf || vocab_build(&v, s.V)) {
		fprintf(stderr, PROG ": out of memory\n");
		goto done;
	}
	for (int i = 0; i < nthr; i++)
		if (!(scratch[i] = malloc((size_t)(max_ne0 + 1) * sizeof(float)))) {
			fprintf(stderr, PROG ": out of memory\n");
			goto done;
		}

	/* every row of files up to 512 MB; 64 rows per tensor of larger ones */
	const int64_t check_rows = total <= (512u << 20) ? INT64_MAX : 64;
	if (verify) {
		if (check_file(path, &tl, &s, seed, scratch, check_rows, &err)) {
			fprintf(stderr, PROG ": %s\n", err.msg);
			goto done;
		}
		if (!quiet)
			fprintf(stderr, PROG ": %s matches the generator\n", path);
		rc = 0;
		goto done;
	}

	struct sigaction sa = {0};
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART; /* finish the current chunk, then stop cleanly */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN); /* a closed stdout is a write error, not a death */

	if (mcv_gguf_writer_open(&w, path, &err)) {
		fprintf(stderr, PROG ": %s\n", err.msg);
		goto done;
	}
	if (write_kv(w, &s, &v, shape_name))
		goto werr;
	for (int i = 0; i < tl.n; i++)
		if (mcv_gguf_w_add_tensor(w, tl.t[i].name, tl.t[i].type, tl.t[i].n_dims, tl.t[i].ne))
			goto werr;
	if (mcv_gguf_w_begin_data(w))
		goto werr;

	pg.t0 = now_s();
	for (int i = 0; i < tl.n; i++) {
		const tdesc *t = &tl.t[i];
		size_t rb = mcv_row_bytes(t->type, t->ne[0]);
		int64_t rows = t->ne[1] * t->ne[2];
		int64_t per = (int64_t)(CHUNK_BYTES / rb);
		if (per < 1)
			per = 1;
		uint64_t key = seed ^ hash_name(t->name);
		for (int64_t r0 = 0; r0 < rows; r0 += per) {
			if (stop_signal)
				goto killed;
			int64_t r1 = r0 + per < rows ? r0 + per : rows;
			gen_rows(t, key, r0, r1, buf, rb, scratch);
			if (mcv_gguf_w_write(w, buf, (size_t)(r1 - r0) * rb))
				goto werr;
			pg.done += (uint64_t)(r1 - r0) * rb;
			progress_show(&pg, false);
		}
		if (mcv_gguf_w_end_tensor(w))
			goto werr;
		pg.done = (pg.done + 31) / 32 * 32;
	}
	if (stop_signal)
		goto killed;
	if (mcv_gguf_writer_finish(w, &err)) {
		w = NULL;
		fprintf(stderr, PROG ": %s\n", err.msg);
		goto done;
	}
	w = NULL;
	progress_show(&pg, true);
	double el = now_s() - pg.t0;
	if (!quiet)
		fprintf(stderr, PROG ": wrote %s: %s, %lld layers, %d tensors, %.3f B params, "
			"%.1f MB in %.1f s\n", path, s.moe ? "qwen35moe" : "qwen35",
			(long long)s.L, tl.n, params / 1e9, total / 1e6, el);
	if (check && strcmp(path, "-")) {
		if (check_file(path, &tl, &s, seed, scratch, check_rows, &err)) {
			fprintf(stderr, PROG ": check failed: %s\n", err.msg);
			goto done;
		}
		if (!quiet)
			fprintf(stderr, PROG ": check: %s reads back as written\n", path);
	}
	rc = 0;
	goto done;

werr: {
		const mcv_error *we = mcv_gguf_writer_error(w);
		fprintf(stderr, PROG ": %s\n", we && we->msg[0] ? we->msg : "write failed");
		goto done;
	}
killed:
	if (pg.tty && !quiet)
		fputc('\n', stderr);
	fprintf(stderr, PROG ": interrupted by signal %d, nothing written\n", (int)stop_signal);
done:
	if (w)
		mcv_gguf_writer_abort(w);
	if (scratch)
		for (int i = 0; i < nthr; i++)
			free(scratch[i]);
	free(scratch);
	free(buf);
	vocab_free(&v);
	free(tl.t);
	return rc;
}

/* Block formats against ggml itself: the peer's libggml-base.so is dlopened
 * and its quantize_row_<t>_ref / dequantize_row_<t> / fp16 and bf16
 * conversions must give byte-identical blocks and bit-identical floats to
 * ours, on random rows of many shapes and scales and on adversarial rows.
 *
 * MCV_GGML_LIB overrides the library path; without the library the test is
 * skipped (exit 77). */
#include "blocks.h"
#include "quant.h"
#include "unit.h"

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEER_DIR "scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/"

typedef void (*row_from_f32)(const float *, void *, int64_t);
typedef void (*row_to_f32)(const void *, float *, int64_t);
typedef size_t (*quantize_chunk_fn)(const float *, void *, int64_t, int64_t, const float *);

static struct {
	int type;
	const char *qsym, *dqsym, *isym; /* ggml's reference, dequantizer, imatrix */
	row_from_f32 q;
	row_to_f32 dq;
	quantize_chunk_fn qi;
	long rows, blocks, dq_blocks, bad;
	long irows, iblocks, ibad; /* imatrix */
} T[] = {
	{ .type = MCV_F32 },
	{ .type = MCV_F16, .qsym = "ggml_fp32_to_fp16_row", .dqsym = "ggml_fp16_to_fp32_row" },
	{ .type = MCV_BF16, .qsym = "ggml_fp32_to_bf16_row_ref", .dqsym = "ggml_bf16_to_fp32_row" },
	{ .type = MCV_Q4_0, .qsym = "quantize_row_q4_0_ref", .dqsym = "dequantize_row_q4_0", .isym = "quantize_q4_0" },
	{ .type = MCV_Q8_0, .qsym = "quantize_row_q8_0_ref", .dqsym = "dequantize_row_q8_0", .isym = "quantize_q8_0" },
	{ .type = MCV_Q5_0, .qsym = "quantize_row_q5_0_ref", .dqsym = "dequantize_row_q5_0", .isym = "quantize_q5_0" },
	{ .type = MCV_Q5_1, .qsym = "quantize_row_q5_1_ref", .dqsym = "dequantize_row_q5_1", .isym = "quantize_q5_1" },
	{ .type = MCV_Q8_K, .qsym = "quantize_row_q8_K_ref", .dqsym = "dequantize_row_q8_K" },
	{ .type = MCV_Q2_K, .qsym = "quantize_row_q2_K_ref", .dqsym = "dequantize_row_q2_K", .isym = "quantize_q2_K" },
	{ .type = MCV_Q3_K, .qsym = "quantize_row_q3_K_ref", .dqsym = "dequantize_row_q3_K", .isym = "quantize_q3_K" },
	{ .type = MCV_Q4_K, .qsym = "quantize_row_q4_K_ref", .dqsym = "dequantize_row_q4_K", .isym = "quantize_q4_K" },
	{ .type = MCV_Q5_K, .qsym = "quantize_row_q5_K_ref", .dqsym = "dequantize_row_q5_K", .isym = "quantize_q5_K" },
	{ .type = MCV_Q6_K, .qsym = "quantize_row_q6_K_ref", .dqsym = "dequantize_row_q6_K", .isym = "quantize_q6_K" },
};
#define NT ((int)(sizeof T / sizeof T[0]))

/* ---- deterministic random numbers ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}
static double unif(void) { return (rnd64() >> 11) * (1.0 / 9007199254740992.0); }
static double gauss(void)
{
	double u = unif(), v = unif();
	return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- comparison of one row for one type ---- */

static void report_block_diff(const char *what, int ti, const char *desc,
			      const uint8_t *a, const uint8_t *b, size_t nbytes)
{
	const mcv_type_traits *tt = mcv_type_get(T[ti].type);
	for (size_t i = 0; i < nbytes; i++) {
		if (a[i] != b[i]) {
			fprintf(stderr, "%s %s [%s]: block %zu byte %zu: ggml %02x mcv %02x\n",
				what, tt->name, desc, i / tt->bytes, i % tt->bytes, a[i], b[i]);
			return;
		}
	}
}

static void report_float_diff(const char *what, int ti, const char *desc,
			      const float *a, const float *b, int64_t n)
{
	const mcv_type_traits *tt = mcv_type_get(T[ti].type);
	for (int64_t i = 0; i < n; i++) {
		if (fbits(a[i]) != fbits(b[i])) {
			fprintf(stderr, "%s %s [%s]: element %lld (block %lld): ggml %.9g (%08x) mcv %.9g (%08x)\n",
				what, tt->name, desc, (long long)i, (long long)(i / tt->blck),
				a[i], fbits(a[i]), b[i], fbits(b[i]));
			return;
		}
	}
}

static uint8_t *qa, *qb;
static float *fa, *fb;
#define MAXN 8192

/* Quantize x with ggml and with mcv, compare bytes; dequantize ggml's bytes
 * with both and compare float bits. */
static void check_row(int ti, const float *x, int64_t n, const char *desc)
{
	const int type = T[ti].type;
	const mcv_type_traits *tt = mcv_type_get(type);
	size_t nb = mcv_row_bytes(type, n);
	if (!nb || !T[ti].q)
		return;
	memset(qa, 0, nb);
	memset(qb, 0, nb);
	T[ti].q(x, qa, n);
	mcv_quantize_row_ref(type, x, qb, n);
	int same = !memcmp(qa, qb, nb);
	if (!same && !T[ti].bad)
		report_block_diff("quantize", ti, desc, qa, qb, nb);
	T[ti].dq(qa, fa, n);
	mcv_dequantize_row(type, qa, fb, n);
	int dsame = !memcmp(fa, fb, (size_t)n * sizeof(float));
	if (!dsame && !T[ti].bad)
		report_float_diff("dequantize", ti, desc, fa, fb, n);
	T[ti].rows++;
	T[ti].blocks += n / tt->blck;
	T[ti].dq_blocks += n / tt->blck;
	if (!same || !dsame)
		T[ti].bad++;
}

static void check_all(const float *x, int64_t n, const char *desc)
{
	for (int ti = 0; ti < NT; ti++)
		check_row(ti, x, n, desc);
}

/* Dequantizers alone on random bytes: every bit pattern of levels, scales
 * and (finite) fp16 super-scales, including ones no quantizer writes. */
static void check_random_blocks(int ti, int nblocks)
{
	const int type = T[ti].type;
	const mcv_type_traits *tt = mcv_type_get(type);
	if (!T[ti].dq || !tt->is_quant)
		return;
	if (nblocks > MAXN / tt->blck)
		nblocks = MAXN / tt->blck;
	int64_t n = (int64_t)nblocks * tt->blck;
	size_t nb = mcv_row_bytes(type, n);
	for (size_t i = 0; i < nb; i++)
		qa[i] = (uint8_t)rnd64();
	/* Keep the scale fields finite: NaN payload propagation is not what is
	 * being tested.  Clear the fp16 exponent's top bit where scales live. */
	for (int b = 0; b < nblocks; b++) {
		uint8_t *blk = qa + (size_t)b * tt->bytes;
		switch (type) {
		case MCV_Q4_0: case MCV_Q8_0: case MCV_Q5_0: blk[1] &= 0xBF; break;
		case MCV_Q5_1: case MCV_Q8_1: blk[1] &= 0xBF; blk[3] &= 0xBF; break;
		case MCV_Q2_K: blk[81] &= 0xBF; blk[83] &= 0xBF; break;
		case MCV_Q3_K: blk[109] &= 0xBF; break;
		case MCV_Q4_K: case MCV_Q5_K: blk[1] &= 0xBF; blk[3] &= 0xBF; break;
		case MCV_Q6_K: blk[209] &= 0xBF; break;
		case MCV_Q8_K: blk[3] &= 0xBF; break;
		}
	}
	T[ti].dq(qa, fa, n);
	mcv_dequantize_row(type, qa, fb, n);
	int dsame = !memcmp(fa, fb, (size_t)n * sizeof(float));
	if (!dsame && !T[ti].bad)
		report_float_diff("dequantize(random bytes)", ti, "random blocks", fa, fb, n);
	CHECK(dsame, "%s: dequantize of random blocks differs from ggml", tt->name);
	T[ti].dq_blocks += nblocks;
}

/* ---- row generators ---- */

static void gen_random(float *x, int64_t n, int kind, double scale)
{
	for (int64_t i = 0; i < n; i++) {
		double v;
		switch (kind) {
		case 0: v = gauss(); break;
		case 1: v = 2 * unif() - 1; break;
		case 2: v = gauss() / (0.05 + fabs(gauss())); break; /* heavy tails */
		case 3: v = fabs(gauss()); break;                    /* one-signed */
		case 4: v = gauss() + 3; break;                      /* offset */
		default: v = (unif() < 0.9 ? 0.01 : 1) * gauss(); break; /* sparse outliers */
		}
		x[i] = (float)(v * scale);
	}
}

static void adversarial_rows(float *x)
{
	const int64_t n = 512;
	char desc[96];

	memset(x, 0, n * sizeof *x);
	check_all(x, n, "all zeros");
	for (int i = 0; i < n; i++)
		x[i] = -0.0f;
	check_all(x, n, "all -0");

	static const float big[] = { 1e4f, -1e4f, 65504.f, -65504.f, 1.f, -1e-3f, 3e-8f };
	for (size_t k = 0; k < sizeof big / sizeof big[0]; k++) {
		for (int pos = 0; pos < n; pos += 37) {
			memset(x, 0, n * sizeof *x);
			x[pos] = big[k];
			snprintf(desc, sizeof desc, "one %g at %d among zeros", big[k], pos);
			check_all(x, n, desc);
		}
	}
	for (int i = 0; i < n; i++)
		x[i] = i & 1 ? 65504.f : -65504.f;
	check_all(x, n, "alternating +-65504");
	for (int i = 0; i < n; i++)
		x[i] = i % 3 ? 65504.f : 1e-3f;
	check_all(x, n, "65504 with small values");
	for (int i = 0; i < n; i++)
		x[i] = (float)(gauss() * 3e4);
	check_all(x, n, "gauss * 3e4 (near fp16 max)");

	static const float consts[] = { 1.f, -1.f, 0.5f, -7.25f, 1e-5f, -3e-7f, 65504.f, 123.456f };
	for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++) {
		for (int i = 0; i < n; i++)
			x[i] = consts[k];
		snprintf(desc, sizeof desc, "constant %g", consts[k]);
		check_all(x, n, desc);
		for (int i = 0; i < n; i++)
			x[i] = i & 1 ? consts[k] : -consts[k];
		snprintf(desc, sizeof desc, "alternating +-%g", consts[k]);
		check_all(x, n, desc);
	}

	/* Around fp16's subnormal range (smallest 6e-8, smallest normal 6.1e-5). */
	static const double tiny[] = { 6e-8, 1e-7, 1e-6, 3e-5, 6.1e-5, 1e-4 };
	for (size_t k = 0; k < sizeof tiny / sizeof tiny[0]; k++) {
		gen_random(x, n, 0, tiny[k]);
		snprintf(desc, sizeof desc, "gauss * %g (fp16 subnormal scales)", tiny[k]);
		check_all(x, n, desc);
		gen_random(x, n, 3, tiny[k]);
		snprintf(desc, sizeof desc, "|gauss| * %g", tiny[k]);
		check_all(x, n, desc);
	}

	/* Values on rounding boundaries: half-integers on the level grids of
	 * every type (the extreme fixes the scale at an exact power of two). */
	for (int rep = 0; rep < 8; rep++) {
		for (int i = 0; i < n; i++) {
			int k = (int)(rnd64() % 33) - 16;
			x[i] = (k + 0.5f) * (rep & 1 ? 1.f : 0.25f);
		}
		for (int i = 0; i < n; i += 16)
			x[i] = rep & 2 ? -16.f : 16.f;
		snprintf(desc, sizeof desc, "half-integer grid %d", rep);
		check_all(x, n, desc);
		for (int i = 0; i < n; i++)
			x[i] = (float)((int)(rnd64() % 256) - 128) / (rep + 1);
		snprintf(desc, sizeof desc, "integer/%d grid", rep + 1);
		check_all(x, n, desc);
	}
	for (int i = 0; i < n; i++)
		x[i] = (float)(i % 32) - 15.5f;
	check_all(x, n, "ramp -15.5..15.5");

	/* Exactly one nonzero per block of 16, 32 and 256. */
	static const int strides[] = { 16, 32, 256 };
	for (size_t s = 0; s < 3; s++) {
		memset(x, 0, n * sizeof *x);
		for (int i = 0; i < n; i += strides[s])
			x[i + (int)(rnd64() % strides[s])] = (float)gauss();
		snprintf(desc, sizeof desc, "one nonzero per %d", strides[s]);
		check_all(x, n, desc);
	}
	/* Blocks of very different magnitudes in one row. */
	for (int i = 0; i < n; i++)
		x[i] = (float)(gauss() * pow(10, (i / 32) % 9 - 4));
	check_all(x, n, "magnitudes 1e-4..1e4 per 32");
}

/* MCV_TEST_REPS=N multiplies the random rows (default 1) for a long soak. */
static void random_rows(float *x)
{
	int reps = getenv("MCV_TEST_REPS") ? atoi(getenv("MCV_TEST_REPS")) : 1;
	reps = reps < 1 ? 1 : reps;
	static const double scales[] = { 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10, 100, 1e3, 1e4 };
	static const int64_t lens[] = { 256, 512, 768, 1024, 2048, 4096 };
	char desc[96];
	for (int kind = 0; kind < 6; kind++)
		for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++)
			for (int rep = 0; rep < 8 * reps; rep++) {
				int64_t n = lens[(kind + s + rep) % 6];
				gen_random(x, n, kind, scales[s]);
				snprintf(desc, sizeof desc, "random kind %d scale %g len %lld rep %d",
					 kind, scales[s], (long long)n, rep);
				check_all(x, n, desc);
			}
}

/* ---- importance-weighted quantization ---- */

/* ggml's quantize_<t>(x, dst, 1, n, w) against mcv_quantize_row_imatrix. */
static void check_imatrix_row(int ti, const float *x, const float *w, int64_t n,
			      const char *desc)
{
	const int type = T[ti].type;
	const mcv_type_traits *tt = mcv_type_get(type);
	size_t nb = mcv_row_bytes(type, n);
	if (!nb || !T[ti].qi)
		return;
	memset(qa, 0, nb);
	memset(qb, 0, nb);
	size_t got = T[ti].qi(x, qa, 1, n, w);
	mcv_quantize_row_imatrix(type, x, qb, n, w);
	int same = got == nb && !memcmp(qa, qb, nb);
	if (!same && !T[ti].ibad)
		report_block_diff("imatrix quantize", ti, desc, qa, qb, nb);
	T[ti].irows++;
	T[ti].iblocks += n / tt->blck;
	if (!same)
		T[ti].ibad++;
}

static void imatrix_rows(float *x)
{
	static const double scales[] = { 1e-5, 1e-3, 0.02, 1, 100, 1e4 };
	static const int64_t lens[] = { 256, 512, 1024, 2048 };
	float *w = malloc(MAXN * sizeof *w);
	char desc[96];
	int reps = getenv("MCV_TEST_REPS") ? atoi(getenv("MCV_TEST_REPS")) : 1;
	reps = reps < 1 ? 1 : reps;
	if (!w)
		return;
	for (int wk = 0; wk < 5; wk++) {
		for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
			for (int rep = 0; rep < 12 * reps; rep++) {
				int64_t n = lens[(wk + s + rep) % 4];
				gen_random(x, n, (int)((s + rep) % 6), scales[s]);
				for (int64_t i = 0; i < n; i++) {
					double v;
					switch (wk) {
					case 0: v = unif(); break;                       /* uniform */
					case 1: v = exp(3 * gauss()); break;             /* log-normal: few channels dominate */
					case 2: v = unif() < 0.3 ? 0 : unif(); break;    /* dead channels */
					case 3: v = 1; break;                            /* flat */
					default: v = 1e-6 * (1 + (double)(i % 7)); break; /* tiny */
					}
					w[i] = (float)v;
				}
				snprintf(desc, sizeof desc, "weights %d, scale %g, len %lld, rep %d",
					 wk, scales[s], (long long)n, rep);
				for (int ti = 0; ti < NT; ti++)
					check_imatrix_row(ti, x, w, n, desc);
			}
		}
	}
	/* Adversarial rows with weights: zeros, a lone outlier, constant. */
	const int64_t n = 512;
	for (int64_t i = 0; i < n; i++)
		w[i] = (float)unif();
	memset(x, 0, n * sizeof *x);
	for (int ti = 0; ti < NT; ti++)
		check_imatrix_row(ti, x, w, n, "zeros");
	x[100] = 65504.f;
	for (int ti = 0; ti < NT; ti++)
		check_imatrix_row(ti, x, w, n, "one 65504 among zeros");
	for (int64_t i = 0; i < n; i++)
		x[i] = i & 1 ? 0.75f : -0.75f;
	for (int ti = 0; ti < NT; ti++)
		check_imatrix_row(ti, x, w, n, "alternating");
	memset(w, 0, n * sizeof *w);
	gen_random(x, n, 0, 1);
	for (int ti = 0; ti < NT; ti++)
		check_imatrix_row(ti, x, w, n, "all weights zero");
	free(w);
}

/* ---- half conversions ---- */

static void check_halves(void *lib)
{
	float (*h2f)(uint16_t) = (float (*)(uint16_t))dlsym(lib, "ggml_fp16_to_fp32");
	uint16_t (*f2h)(float) = (uint16_t (*)(float))dlsym(lib, "ggml_fp32_to_fp16");
	uint16_t (*f2b)(float) = (uint16_t (*)(float))dlsym(lib, "ggml_fp32_to_bf16");
	float (*b2f)(uint16_t) = (float (*)(uint16_t))dlsym(lib, "ggml_bf16_to_fp32");
	CHECK(h2f && f2h && f2b && b2f, "half conversion symbols missing: %s", dlerror());
	if (!(h2f && f2h && f2b && b2f))
		return;

	long bad_h2f = 0, bad_b2f = 0, bad_f2h = 0, bad_f2b = 0, nf = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float a = h2f((uint16_t)h), b = mcv_fp16_to_fp32((uint16_t)h);
		if (fbits(a) != fbits(b) && !bad_h2f++)
			fprintf(stderr, "fp16->fp32 %04x: ggml %08x mcv %08x\n", h, fbits(a), fbits(b));
		a = b2f((uint16_t)h);
		b = mcv_bf16_to_fp32((uint16_t)h);
		if (fbits(a) != fbits(b) && !bad_b2f++)
			fprintf(stderr, "bf16->fp32 %04x: ggml %08x mcv %08x\n", h, fbits(a), fbits(b));
	}
	CHECK(!bad_h2f, "%ld of 65536 fp16 patterns convert differently", bad_h2f);
	CHECK(!bad_b2f, "%ld of 65536 bf16 patterns convert differently", bad_b2f);

	/* fp32 -> fp16/bf16: every fp16 value, the midpoints between neighbours
	 * (exact ties) and one float either side, plus a stride through all
	 * 2^32 patterns (NaNs included). */
#define CMP_F(u) do { float f_ = bitsf(u); nf++; \
	uint16_t a_ = f2h(f_), b_ = mcv_fp32_to_fp16(f_); \
	if (a_ != b_ && !bad_f2h++) fprintf(stderr, "fp32->fp16 %08x: ggml %04x mcv %04x\n", (u), a_, b_); \
	a_ = f2b(f_); b_ = mcv_fp32_to_bf16(f_); \
	if (a_ != b_ && !bad_f2b++) fprintf(stderr, "fp32->bf16 %08x: ggml %04x mcv %04x\n", (u), a_, b_); \
	} while (0)
	for (uint32_t h = 0; h < 0x7c00; h++) {
		for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
			uint32_t lo = fbits(mcv_fp16_to_fp32((uint16_t)(h | sign)));
			float mid = (float)(((double)mcv_fp16_to_fp32((uint16_t)(h | sign)) +
					     (double)mcv_fp16_to_fp32((uint16_t)((h + 1) | sign))) / 2);
			uint32_t m = fbits(mid);
			for (int d = -2; d <= 2; d++) {
				CMP_F(lo + d);
				CMP_F(m + d);
			}
		}
	}
	for (uint64_t u = 0; u < (1ull << 32); u += 4099)
		CMP_F((uint32_t)u);
	static const float special[] = { 0.f, -0.f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX,
					 -FLT_MAX, FLT_MIN, 1e-45f, 65504.f, 65519.99f, 65520.f,
					 5.96046448e-8f, 2.98023224e-8f, 2.98023259e-8f };
	for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
		CMP_F(fbits(special[i]));
	for (uint32_t u = 0x7f800001; u < 0x7f800001 + 1000; u++) {
		CMP_F(u);
		CMP_F(u | 0x80000000u);
		CMP_F(u + 0x3ff000);
	}
#undef CMP_F
	CHECK(!bad_f2h, "%ld of %ld floats convert to fp16 differently", bad_f2h, nf);
	CHECK(!bad_f2b, "%ld of %ld floats convert to bf16 differently", bad_f2b, nf);
	fprintf(stderr, "halves: 65536 fp16 + 65536 bf16 patterns widened, %ld floats narrowed to both, "
		"%ld + %ld + %ld + %ld differ\n", nf, bad_h2f, bad_b2f, bad_f2h, bad_f2b);
}

/* ---- traits against ggml's own table ---- */

static void check_traits(void *lib)
{
	const char *(*tname)(int) = (const char *(*)(int))dlsym(lib, "ggml_type_name");
	int64_t (*blck)(int) = (int64_t (*)(int))dlsym(lib, "ggml_blck_size");
	size_t (*tsize)(int) = (size_t (*)(int))dlsym(lib, "ggml_type_size");
	size_t (*rsize)(int, int64_t) = (size_t (*)(int, int64_t))dlsym(lib, "ggml_row_size");
	CHECK(tname && blck && tsize && rsize, "ggml type symbols missing");
	if (!(tname && blck && tsize && rsize))
		return;
	for (int ti = 0; ti < NT; ti++) {
		int t = T[ti].type;
		const mcv_type_traits *tt = mcv_type_get(t);
		CHECK(tt, "type %d has no traits", t);
		if (!tt)
			continue;
		CHECK(!strcmp(tt->name, tname(t)), "type %d: name %s, ggml %s", t, tt->name, tname(t));
		CHECK(tt->blck == blck(t), "%s: blck %d, ggml %lld", tt->name, tt->blck, (long long)blck(t));
		CHECK(tt->bytes == tsize(t), "%s: bytes %zu, ggml %zu", tt->name, tt->bytes, tsize(t));
		CHECK(mcv_row_bytes(t, 4096) == rsize(t, 4096), "%s: row bytes", tt->name);
		CHECK(mcv_type_from_name(tname(t)) == t, "%s: from_name", tt->name);
	}
	/* vec_dot_type from ggml's x86 CPU backend, when it loads. */
	void *cpu = dlopen(getenv("MCV_GGML_CPU_LIB") ? getenv("MCV_GGML_CPU_LIB")
			   : PEER_DIR "libggml-cpu-x64.so", RTLD_NOW | RTLD_LOCAL);
	if (!cpu) {
		fprintf(stderr, "note: ggml CPU library not loadable, vec_dot_type not cross-checked\n");
		return;
	}
	struct cpu_traits { void *from_float, *vec_dot; int vec_dot_type; int64_t nrows; };
	const struct cpu_traits *(*get)(int) =
		(const struct cpu_traits *(*)(int))dlsym(cpu, "ggml_get_type_traits_cpu");
	CHECK(get, "ggml_get_type_traits_cpu missing");
	for (int ti = 0; get && ti < NT; ti++) {
		int t = T[ti].type;
		const mcv_type_traits *tt = mcv_type_get(t);
		if (!tt || t == MCV_Q8_K)
			continue; /* ggml gives Q8_K no vec_dot of its own */
		CHECK(tt->vec_dot_type == get(t)->vec_dot_type, "%s: vec_dot_type %d, ggml %d",
		      tt->name, tt->vec_dot_type, get(t)->vec_dot_type);
	}
	dlclose(cpu);
}

/* Q8_1 (Q5_1's activation type) has no ggml dequantizer to pair with, so
 * only its quantizer is compared, on the same kinds of rows. */
static void check_q8_1(void *lib, float *x)
{
	row_from_f32 q = (row_from_f32)dlsym(lib, "quantize_row_q8_1_ref");
	CHECK(q != NULL, "quantize_row_q8_1_ref missing");
	if (!q)
		return;
	long rows = 0, bad = 0;
	for (int kind = 0; kind < 6; kind++)
		for (int rep = 0; rep < 20; rep++) {
			const int64_t n = 32 * (1 + rep % 9);
			gen_random(x, n, kind, rep % 3 ? 1.0 : 1e-3);
			if (rep == 7)
				memset(x, 0, 32 * sizeof *x);
			size_t nb = mcv_row_bytes(MCV_Q8_1, n);
			memset(qa, 0, nb);
			memset(qb, 1, nb);
			q(x, qa, n);
			mcv_quantize_row_ref(MCV_Q8_1, x, qb, n);
			bad += memcmp(qa, qb, nb) != 0;
			rows++;
		}
	CHECK(!bad, "q8_1: %ld of %ld rows differ from ggml", bad, rows);
	fprintf(stderr, "q8_1  %4ld rows quantized: %ld rows differ\n", rows, bad);
}

static void check_names(void)
{
	CHECK(mcv_type_from_name("Q4_K") == MCV_Q4_K, "Q4_K");
	CHECK(mcv_type_from_name("q4_k") == MCV_Q4_K, "q4_k");
	CHECK(mcv_type_from_name("BF16") == MCV_BF16, "BF16");
	CHECK(mcv_type_from_name("q4_") == -1, "prefix must not match");
	CHECK(mcv_type_from_name("q4_K_M") == -1, "longer name must not match");
	CHECK(mcv_type_from_name("") == -1 && mcv_type_from_name(NULL) == -1, "empty");
	CHECK(mcv_type_get(3) == NULL && mcv_type_get(-1) == NULL && mcv_type_get(31) == NULL,
	      "unknown ids");
	CHECK(mcv_row_bytes(MCV_Q4_K, 100) == 0 && mcv_row_bytes(MCV_Q4_0, 64) == 36, "row bytes");
}

int main(void)
{
	const char *path = getenv("MCV_GGML_LIB");
	if (!path)
		path = PEER_DIR "libggml-base.so";
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		UNIT_SKIP("ggml library not loadable (%s); install the peer with scripts/setup.sh",
			  dlerror());
	for (int ti = 0; ti < NT; ti++) {
		if (!T[ti].qsym)
			continue;
		T[ti].q = (row_from_f32)dlsym(lib, T[ti].qsym);
		T[ti].dq = (row_to_f32)dlsym(lib, T[ti].dqsym);
		if (T[ti].isym)
			T[ti].qi = (quantize_chunk_fn)dlsym(lib, T[ti].isym);
		CHECK(T[ti].q && T[ti].dq, "symbols %s / %s missing from %s", T[ti].qsym,
		      T[ti].dqsym, path);
	}
	qa = malloc(MAXN * 4);
	qb = malloc(MAXN * 4);
	fa = malloc(MAXN * sizeof(float));
	fb = malloc(MAXN * sizeof(float));
	float *x = malloc(MAXN * sizeof(float));
	if (!qa || !qb || !fa || !fb || !x)
		return 1;

	check_names();
	check_traits(lib);
	check_halves(lib);
	adversarial_rows(x);
	random_rows(x);
	for (int ti = 0; ti < NT; ti++)
		for (int rep = 0; rep < 100; rep++)
			check_random_blocks(ti, 64);
	imatrix_rows(x);
	check_q8_1(lib, x);

	for (int ti = 0; ti < NT; ti++) {
		if (!T[ti].q)
			continue;
		const mcv_type_traits *tt = mcv_type_get(T[ti].type);
		CHECK(!T[ti].bad, "%s: %ld of %ld rows differ from ggml", tt->name, T[ti].bad, T[ti].rows);
		fprintf(stderr, "%-5s %4ld rows, %6ld blocks quantized, %6ld blocks dequantized: %ld rows differ\n",
			tt->name, T[ti].rows, T[ti].blocks, T[ti].dq_blocks, T[ti].bad);
		if (!T[ti].qi)
			continue;
		CHECK(!T[ti].ibad, "%s: %ld of %ld imatrix rows differ from ggml", tt->name,
		      T[ti].ibad, T[ti].irows);
		fprintf(stderr, "%-5s %4ld rows, %6ld blocks quantized with an imatrix: %ld rows differ\n",
			tt->name, T[ti].irows, T[ti].iblocks, T[ti].ibad);
	}
	free(qa); free(qb); free(fa); free(fb); free(x);
	dlclose(lib);
	return unit_done("test_quant_ggml");
}

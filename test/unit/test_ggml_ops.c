/* The element-wise and float kernels whose rounding decides whether mcv's
 * logits equal llama.cpp's bit for bit, against the peer's own functions
 * (libggml-cpu of node-llama-cpp, the variant llama.cpp loads on an AVX-512
 * machine): SiLU and SwiGLU, the softmax exponentials and their sum, the
 * F32 dot of a single row.  A Q8_0 product turns one ulp of its input into
 * a whole quantum now and then, and a trained model carried such ulps to
 * 3e-3 of the logits (session 17), so "close" is not enough here.
 *
 * Skipped where the build has no AVX-512F/DQ (mcv's other builds do not
 * reproduce ggml's vector exp) or the peer is absent. */
#include "ggml_peer.h"
#include "model_impl.h"
#include "unit.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef void (*silu_fn)(int n, float *y, const float *x);
typedef void (*swiglu_fn)(int n, float *y, const float *x, const float *g);
typedef double (*softmax_fn)(int n, float *y, const float *x, float max);
typedef void (*dot_fn)(int n, float *s, size_t bs, const float *x, size_t bx, const float *y, size_t by,
		       int nrc);

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float unif(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Values as activations meet them, and the edges of the vector exp: large
 * magnitudes (overflow and underflow of exp(-x)), zeros, tiny numbers. */
static void fill(float *x, int n, int kind)
{
	for (int i = 0; i < n; i++) {
		float f = unif();
		switch (kind) {
		case 0: f *= 6.0f; break;
		case 1: f *= 120.0f; break;
		case 2: f = i % 5 == 0 ? 0.0f : i % 7 == 0 ? ldexpf(f, -100) : f * 30.0f; break;
		default: f = (i % 2 ? 90.0f : -105.0f) + f; break;
		}
		x[i] = f;
	}
}

static int bits_equal(const float *a, const float *b, int n, int *first)
{
	for (int i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof a[i])) {
			*first = i;
			return 0;
		}
	return 1;
}

int main(void)
{
#if !(defined(__AVX512F__) && defined(__AVX512DQ__))
	UNIT_SKIP("this build has no AVX-512F/DQ kernels to compare");
#else
	void *h = ggml_peer_open("skylakex");
	if (!h)
		UNIT_SKIP("peer library absent (scripts/setup.sh installs it)");
	silu_fn g_silu = (silu_fn)dlsym(h, "ggml_vec_silu_f32");
	swiglu_fn g_swiglu = (swiglu_fn)dlsym(h, "ggml_vec_swiglu_f32");
	softmax_fn g_softmax = (softmax_fn)dlsym(h, "ggml_vec_soft_max_f32");
	dot_fn g_dot = (dot_fn)dlsym(h, "ggml_vec_dot_f32");
	if (!g_silu || !g_swiglu || !g_softmax || !g_dot)
		UNIT_SKIP("the peer library lacks one of the compared functions");

	enum { N = 4099 };
	static float x[N], u[N], a[N], b[N];
	const int lens[] = { 16, 32, 64, 100, 256, 1000, N };
	int first = 0;
	for (int kind = 0; kind < 4; kind++)
		for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
			const int n = lens[l];
			fill(x, n, kind);
			fill(u, n, 0);

			mcv_silu_vec(a, x, (size_t)n);
			g_silu(n, b, x);
			CHECK(bits_equal(a, b, n, &first), "silu kind %d n %d: element %d: %.9g vs ggml %.9g", kind, n,
			      first, a[first], b[first]);

			memcpy(a, x, sizeof(float) * (size_t)n);
			mcv_swiglu(a, u, (size_t)n);
			g_swiglu(n, b, x, u);
			CHECK(bits_equal(a, b, n, &first), "swiglu kind %d n %d: element %d: %.9g vs ggml %.9g", kind, n,
			      first, a[first], b[first]);

			float mx = -INFINITY;
			for (int i = 0; i < n; i++)
				mx = fmaxf(mx, x[i]);
			const double sa = mcv_exp_shifted(a, x, n, mx), sb = g_softmax(n, b, x, mx);
			CHECK(bits_equal(a, b, n, &first), "softmax exp kind %d n %d: element %d: %.9g vs ggml %.9g", kind,
			      n, first, a[first], b[first]);
			CHECK(sa == sb, "softmax sum kind %d n %d: %.17g vs ggml %.17g", kind, n, sa, sb);

			if (kind == 0) {
				float da = mcv_vec_dot(MCV_F32, n, x, u), db = 0;
				g_dot(n, &db, 0, x, 0, u, 0, 1);
				CHECK(memcmp(&da, &db, sizeof da) == 0, "F32 dot n %d: %.9g vs ggml %.9g", n, da, db);
			}
		}
	return unit_done("test_ggml_ops");
#endif
}

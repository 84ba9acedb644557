/* bench-kernels: mcv's block-format kernels against ggml's CPU kernels from
 * the peer library (node-llama-cpp's prebuilt llama.cpp), same shapes, same
 * bytes, same thread count.
 *
 *   bench-kernels [-t threads] [-T q4_K,q8_0,...] [-m decode|prefill|all]
 *                 [-s seconds per case] [-L peer-lib-dir]
 *
 * For each weight type and shape: matrix-vector (decode) and matrix-matrix
 * (prefill, m activation rows) time, weight GB/s and GFLOP/s for mcv and for
 * ggml's mul_mat, and the ratio ggml time / mcv time (> 1: mcv is faster).
 * Runs alternate between the two in up to 16 rounds so background load hits
 * both;
 * best and median over all runs are reported; the ratio uses the best
 * times (the least disturbed by other load on a shared machine).
 * ggml is driven through its public C API with a persistent thread pool (as
 * llama.cpp does), weights in a plain CPU context (no repacking). */
#include "quant.h"

#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the few ggml declarations we need (layouts from ggml.h / ggml-cpu.h) */
struct ggml_init_params {
	size_t mem_size;
	void *mem_buffer;
	bool no_alloc;
};
struct ggml_threadpool_params {
	bool cpumask[512];
	int n_threads;
	int prio;
	uint32_t poll;
	bool strict_cpu;
	bool paused;
};
struct ggml_cplan {
	size_t work_size;
	uint8_t *work_data;
	int n_threads;
	void *threadpool;
	void *abort_callback;
	void *abort_callback_data;
	bool use_ref;
};
static struct {
	void *(*init)(struct ggml_init_params);
	void (*free)(void *ctx);
	void *(*new_tensor_2d)(void *ctx, int type, int64_t ne0, int64_t ne1);
	void *(*mul_mat)(void *ctx, void *a, void *b);
	void *(*new_graph)(void *ctx);
	void (*build_forward_expand)(void *g, void *t);
	void *(*get_data)(const void *t);
	struct ggml_cplan (*graph_plan)(const void *g, int n_threads, void *tp);
	int (*graph_compute)(void *g, struct ggml_cplan *plan);
	struct ggml_threadpool_params (*tp_params_default)(int n_threads);
	void *(*tp_new)(struct ggml_threadpool_params *p);
	void (*tp_pause)(void *tp);
	void (*tp_resume)(void *tp);
	void (*cpu_init)(void);
	void *tp;
	const char *variant;
} gg;

static int load_ggml(const char *dir, int nth)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/libggml-base.so", dir);
	void *hb = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!hb) {
		fprintf(stderr, "bench-kernels: %s\n", dlerror());
		return -1;
	}
	gg.variant = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16") ? "zen4"
		     : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "haswell"
		     : "x64";
	snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", dir, gg.variant);
	void *hc = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!hc) {
		fprintf(stderr, "bench-kernels: %s\n", dlerror());
		return -1;
	}
#define SYM(h, field, name) \
	if (!(*(void **)&gg.field = dlsym(h, name))) { fprintf(stderr, "bench-kernels: no %s\n", name); return -1; }
	SYM(hb, init, "ggml_init");
	SYM(hb, free, "ggml_free");
	SYM(hb, new_tensor_2d, "ggml_new_tensor_2d");
	SYM(hb, mul_mat, "ggml_mul_mat");
	SYM(hb, new_graph, "ggml_new_graph");
	SYM(hb, build_forward_expand, "ggml_build_forward_expand");
	SYM(hb, get_data, "ggml_get_data");
	SYM(hb, tp_params_default, "ggml_threadpool_params_default");
	SYM(hc, graph_plan, "ggml_graph_plan");
	SYM(hc, graph_compute, "ggml_graph_compute");
	SYM(hc, tp_new, "ggml_threadpool_new");
	SYM(hc, tp_pause, "ggml_threadpool_pause");
	SYM(hc, tp_resume, "ggml_threadpool_resume");
	SYM(hc, cpu_init, "ggml_cpu_init");
#undef SYM
	gg.cpu_init();
	struct ggml_threadpool_params p = gg.tp_params_default(nth);
	gg.tp = gg.tp_new(&p);
	return gg.tp ? 0 : -1;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

typedef struct {
	double t[4096];
	int n;
} samples;

static double best(samples *s)
{
	qsort(s->t, s->n, sizeof s->t[0], cmp_d);
	return s->t[0];
}
static double median(samples *s)
{
	qsort(s->t, s->n, sizeof s->t[0], cmp_d);
	return s->t[s->n / 2];
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2 - 1;
}

struct opts {
	int nth;
	double secs;
	int have_ggml;
};

/* One case: W is rows x n of `type`; m == 1 is decode (mcv_matvec). */
static void run_case(const struct opts *o, int type, int64_t n, int64_t rows, int64_t m, const char *label)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	const size_t rb = mcv_row_bytes(type, n), wbytes = rb * rows;
	void *ctx = NULL, *graph = NULL, *gw = NULL, *gx = NULL, *gy = NULL;
	struct ggml_cplan plan;
	unsigned char *work = NULL, *W;
	float *X, *Y = malloc(rows * m * sizeof(float));

	if (o->have_ggml) {
		struct ggml_init_params ip = { wbytes + (size_t)(n + rows) * m * 4 + (1 << 20), NULL, false };
		ctx = gg.init(ip);
		gw = gg.new_tensor_2d(ctx, type, n, rows);
		gx = gg.new_tensor_2d(ctx, MCV_F32, n, m);
		gy = gg.mul_mat(ctx, gw, gx);
		graph = gg.new_graph(ctx);
		gg.build_forward_expand(graph, gy);
		plan = gg.graph_plan(graph, o->nth, gg.tp);
		work = malloc(plan.work_size + 64);
		plan.work_data = work;
		W = gg.get_data(gw);
		X = gg.get_data(gx);
	} else {
		W = aligned_alloc(64, (wbytes + 63) / 64 * 64);
		X = malloc(n * m * sizeof(float));
	}
	/* 16 distinct quantized rows repeated: realistic bytes without
	 * quantizing the whole matrix with the slow reference quantizer. */
	float *row = malloc(n * sizeof(float));
	for (int64_t r = 0; r < rows && r < 16; r++) {
		for (int64_t i = 0; i < n; i++)
			row[i] = frand();
		mcv_quantize_row_ref(type, row, W + r * rb, n);
	}
	for (int64_t r = 16; r < rows; r++)
		memcpy(W + r * rb, W + (r % 16) * rb, rb);
	for (int64_t i = 0; i < n * m; i++)
		X[i] = frand();
	free(row);

	samples *sm = calloc(1, sizeof *sm), *sg = calloc(1, sizeof *sg);
	/* 16 rounds, fewer when one run is long (prefill), so that the default
	 * run stays around two minutes. */
	double t1 = now();
	if (m == 1)
		mcv_matvec(type, W, rb, rows, n, X, Y);
	else
		mcv_matmul(type, W, rb, rows, n, X, m, Y);
	t1 = now() - t1;
	int rounds = (int)(o->secs / (2 * t1));
	rounds = rounds < 3 ? 3 : rounds > 16 ? 16 : rounds;
	for (int round = 0; round < rounds; round++) {
		for (int who = 0; who < 2; who++) {
			if (who == 1 && !o->have_ggml)
				break;
			samples *s = who ? sg : sm;
			if (who)
				gg.tp_resume(gg.tp);
			double t0 = now();
			int k = 0;
			do {
				double a = now();
				if (who)
					gg.graph_compute(graph, &plan);
				else if (m == 1)
					mcv_matvec(type, W, rb, rows, n, X, Y);
				else
					mcv_matmul(type, W, rb, rows, n, X, m, Y);
				double b = now();
				if (s->n < 4096 && (who == 0 || round > 0 || k > 0)) /* ggml warm-up */
					s->t[s->n++] = b - a;
				k++;
			} while (now() - t0 < o->secs / rounds && k < 2000);
			if (who)
				gg.tp_pause(gg.tp);
		}
	}
	double mb = best(sm), mm = median(sm);
	double flop = 2.0 * n * rows * m;
	printf("%-5s %-22s %4lld  %9.1f %9.1f  %6.1f %7.1f", tt->name, label, (long long)m, mb * 1e6, mm * 1e6,
	       wbytes / mb * 1e-9, flop / mb * 1e-9);
	if (o->have_ggml) {
		double gb = best(sg), gm = median(sg);
		/* agreement check: largest difference relative to the largest |y| */
		const float *gyd = gg.get_data(gy);
		double md = 0, my = 0;
		for (int64_t i = 0; i < rows * m; i++) {
			md = fmax(md, fabs((double)gyd[i] - Y[i]));
			my = fmax(my, fabs((double)gyd[i]));
		}
		printf("  %9.1f %9.1f  %6.1f %7.1f  %5.2fx  %.0e", gb * 1e6, gm * 1e6, wbytes / gb * 1e-9,
		       flop / gb * 1e-9, gb / mb, my ? md / my : md);
	}
	printf("\n");
	fflush(stdout);
	free(sm);
	free(sg);
	free(Y);
	free(work);
	if (ctx)
		gg.free(ctx);
	else {
		free(W);
		free(X);
	}
}

static void usage(void)
{
	fprintf(stderr, "usage: bench-kernels [-t threads] [-T types] [-m decode|prefill|all] [-s seconds] [-L peer-lib-dir]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct opts o = { 2, 0.3, 0 };
	const char *types = "q4_0,q8_0,q4_K,q5_K,q6_K,q3_K,q2_K,f16,bf16,f32";
	const char *mode = "all";
	const char *dir = "scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64";
	int c;
	while ((c = getopt(argc, argv, "t:T:m:s:L:h")) != -1) {
		switch (c) {
		case 't': o.nth = atoi(optarg); break;
		case 'T': types = optarg; break;
		case 'm': mode = optarg; break;
		case 's': o.secs = atof(optarg); break;
		case 'L': dir = optarg; break;
		default: usage();
		}
	}
	if (o.nth < 1 || o.secs <= 0)
		usage();
	omp_set_num_threads(o.nth);
	o.have_ggml = load_ggml(dir, o.nth) == 0;
	if (o.have_ggml)
		gg.tp_pause(gg.tp);
	else
		fprintf(stderr, "bench-kernels: peer library not loaded: mcv figures only\n");

	const int dec = strcmp(mode, "prefill") != 0, pre = strcmp(mode, "decode") != 0;
	printf("# threads %d, ggml %s; times in us (best, median); GB/s of weights and GFLOP/s at best;\n"
	       "# ratio = ggml best / mcv best (> 1: mcv faster); diff = max |y_mcv - y_ggml| / max |y|\n",
	       o.nth, o.have_ggml ? gg.variant : "absent");
	printf("%-5s %-22s %4s  %9s %9s  %6s %7s  %9s %9s  %6s %7s  %6s  %s\n", "type", "shape (n -> rows)", "m",
	       "mcv best", "median", "GB/s", "GFLOP/s", "ggml best", "median", "GB/s", "GFLOP/s", "ratio", "diff");

	static const struct { int64_t n, rows; const char *label; } dshapes[] = {
		{ 4096, 4096, "4096 -> 4096" },
		{ 2048, 512, "2048 -> 512 expert" },
		{ 2048, 8192, "2048 -> 8192 attn_qkv" },
		{ 512, 2048, "512 -> 2048 down" },
	};
	static const int64_t ms[] = { 64, 512 };
	char list[512];
	snprintf(list, sizeof list, "%s", types);
	for (char *save, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int type = mcv_type_from_name(t);
		if (type < 0 || type == MCV_Q8_K) {
			fprintf(stderr, "bench-kernels: unknown weight type '%s'\n", t);
			return 2;
		}
		if (dec)
			for (size_t i = 0; i < sizeof dshapes / sizeof dshapes[0]; i++)
				if (dshapes[i].n % mcv_type_get(type)->blck == 0)
					run_case(&o, type, dshapes[i].n, dshapes[i].rows, 1, dshapes[i].label);
		if (pre) {
			for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
				run_case(&o, type, 2048, 2048, ms[i], "2048 -> 2048 prefill");
			/* the vision tower: width 192, MLP 768, 256 tokens a crop */
			if (mcv_type_get(type)->blck <= 192) {
				run_case(&o, type, 192, 576, 256, "192 -> 576 vit qkv");
				run_case(&o, type, 192, 768, 256, "192 -> 768 vit up");
				run_case(&o, type, 768, 192, 256, "768 -> 192 vit down");
			}
		}
	}
	return 0;
}

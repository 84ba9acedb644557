/* LD_PRELOAD shim that gives node-llama-cpp the two settings llama.cpp's own
 * command-line tools use for CPU benchmarks, which node-llama-cpp 3.22.1 does
 * not expose:
 *
 *  1. no weight repacking: llama_model_default_params() returns
 *     use_extra_bufts = false (llama-cli --no-repack), so Q4_0 weights stay in
 *     the file mapping instead of being copied into an anonymous CPU_REPACK
 *     buffer (17 GiB of RSS for the 35B-A3B shape);
 *  2. a persistent thread pool: after llama_init_from_model() a ggml thread
 *     pool of the context's thread count is created and attached, as
 *     llama-cli does; without it ggml starts and joins fresh threads for every
 *     graph, i.e. for every decoded token.
 *
 * Environment: MCV_SHIM_REPACK=1 keeps repacking on; MCV_SHIM_POOL=0 skips the
 * pool; MCV_SHIM_VERBOSE=1 reports what was done on stderr.
 *
 * Build and use (run.mjs --shim does both):
 *   cc -O2 -shared -fPIC -o /tmp/mcv-peer-shim.so scripts/peer/shim.c -ldl
 *   LD_PRELOAD=/tmp/mcv-peer-shim.so node scripts/peer/run.mjs ...
 *
 * The struct layouts below are declared from llama.h / ggml.h of the llama.cpp
 * release node-llama-cpp 3.22.1 bundles (tag v0.5.0, commit de3ff815); the
 * shim checks the defaults it expects before changing anything. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shim_model_params {
	void *devices;
	const void *tensor_buft_overrides;
	int32_t n_gpu_layers;
	int split_mode, load_mode, lazy_mode;
	int32_t main_gpu;
	const float *tensor_split;
	void *progress_callback;
	void *progress_callback_user_data;
	const void *kv_overrides;
	bool vocab_only, check_tensors, use_extra_bufts, no_host, no_alloc, load_mtp;
};

#define SHIM_MAX_THREADS 512 /* GGML_MAX_N_THREADS */
struct shim_threadpool_params {
	bool cpumask[SHIM_MAX_THREADS];
	int n_threads;
	int prio;
	uint32_t poll;
	bool strict_cpu;
	bool paused;
};

static int verbose(void)
{
	const char *v = getenv("MCV_SHIM_VERBOSE");
	return v && *v && *v != '0';
}

/* A library the addon loaded privately (RTLD_LOCAL) is not in the global
 * scope, so look it up by path among the loaded objects. */
struct find { const char *stem; char path[4096]; };
static int find_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	struct find *f = data;
	const char *base = strrchr(info->dlpi_name, '/');
	base = base ? base + 1 : info->dlpi_name;
	if (!strncmp(base, f->stem, strlen(f->stem))) {
		snprintf(f->path, sizeof f->path, "%s", info->dlpi_name);
		return 1;
	}
	return 0;
}

static void *sym(const char *stem, const char *name)
{
	struct find f = { stem, "" };
	dl_iterate_phdr(find_cb, &f);
	if (f.path[0]) {
		void *h = dlopen(f.path, RTLD_LAZY | RTLD_NOLOAD);
		if (h) {
			void *p = dlsym(h, name);
			dlclose(h); /* NOLOAD took a reference; the library stays loaded */
			if (p)
				return p;
		}
	}
	return dlsym(RTLD_NEXT, name);
}

struct shim_model_params llama_model_default_params(void)
{
	struct shim_model_params (*real)(void) =
		(struct shim_model_params (*)(void))sym("libllama.", "llama_model_default_params");
	struct shim_model_params p;
	if (!real) {
		fprintf(stderr, "mcv-peer-shim: llama_model_default_params not found\n");
		abort();
	}
	p = real();
	const char *rp = getenv("MCV_SHIM_REPACK");
	bool keep = rp && *rp && *rp != '0';
	/* defaults of that release: vocab_only/check_tensors off, extra bufts on */
	if (!keep && p.use_extra_bufts && !p.vocab_only && !p.check_tensors) {
		p.use_extra_bufts = false;
		if (verbose())
			fprintf(stderr, "mcv-peer-shim: weight repacking off\n");
	} else if (!keep) {
		fprintf(stderr, "mcv-peer-shim: unexpected llama_model_params layout; repacking left as is\n");
	}
	return p;
}

/* Contexts and their pools, so llama_free can release them.  The pool is
 * attached at a context's first llama_decode (whose only by-value argument,
 * llama_batch, is a small stable struct), not in llama_init_from_model, whose
 * large parameter struct would have to be declared field by field. */
#define MAX_CTX 64
static struct { void *ctx, *pool; } pools[MAX_CTX];
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;

struct shim_batch {
	int32_t n_tokens;
	void *token, *embd, *pos, *n_seq_id, *seq_id, *logits;
};

static void *make_pool(void *ctx)
{
	int (*n_threads)(void *) = (int (*)(void *))sym("libllama.", "llama_n_threads");
	void (*attach)(void *, void *, void *) =
		(void (*)(void *, void *, void *))sym("libllama.", "llama_attach_threadpool");
	void (*params_init)(struct shim_threadpool_params *, int) =
		(void (*)(struct shim_threadpool_params *, int))sym("libggml-base", "ggml_threadpool_params_init");
	void *(*dev_by_type)(int) = (void *(*)(int))sym("libggml.", "ggml_backend_dev_by_type");
	void *(*dev_reg)(void *) = (void *(*)(void *))sym("libggml.", "ggml_backend_dev_backend_reg");
	void *(*proc)(void *, const char *) =
		(void *(*)(void *, const char *))sym("libggml.", "ggml_backend_reg_get_proc_address");
	if (!dev_reg)
		dev_reg = (void *(*)(void *))sym("libggml-base", "ggml_backend_dev_backend_reg");
	if (!proc)
		proc = (void *(*)(void *, const char *))sym("libggml-base", "ggml_backend_reg_get_proc_address");
	if (!n_threads || !attach || !params_init || !dev_by_type || !dev_reg || !proc) {
		fprintf(stderr, "mcv-peer-shim: llama.cpp symbols not found; no thread pool\n");
		return NULL;
	}
	void *dev = dev_by_type(0 /* GGML_BACKEND_DEVICE_TYPE_CPU */);
	void *reg = dev ? dev_reg(dev) : NULL;
	void *(*pool_new)(struct shim_threadpool_params *) =
		reg ? (void *(*)(struct shim_threadpool_params *))proc(reg, "ggml_threadpool_new") : NULL;
	if (!pool_new) {
		fprintf(stderr, "mcv-peer-shim: ggml_threadpool_new not found; no thread pool\n");
		return NULL;
	}
	int n = n_threads(ctx);
	struct shim_threadpool_params tp;
	params_init(&tp, n);
	void *pool = pool_new(&tp);
	if (!pool)
		return NULL;
	attach(ctx, pool, pool);
	if (verbose())
		fprintf(stderr, "mcv-peer-shim: thread pool of %d threads attached\n", n);
	return pool;
}

int32_t llama_decode(void *ctx, struct shim_batch batch)
{
	static int32_t (*real)(void *, struct shim_batch);
	if (!real)
		real = (int32_t (*)(void *, struct shim_batch))sym("libllama.", "llama_decode");
	const char *pe = getenv("MCV_SHIM_POOL");
	if (!(pe && *pe == '0')) {
		pthread_mutex_lock(&pools_mu);
		int i, freei = -1;
		for (i = 0; i < MAX_CTX && pools[i].ctx != ctx; i++)
			if (!pools[i].ctx && freei < 0)
				freei = i;
		if (i == MAX_CTX && freei >= 0) {
			pools[freei].ctx = ctx;
			pools[freei].pool = make_pool(ctx);
		}
		pthread_mutex_unlock(&pools_mu);
	}
	return real(ctx, batch);
}

void llama_free(void *ctx)
{
	void (*real)(void *) = (void (*)(void *))sym("libllama.", "llama_free");
	void *pool = NULL;
	pthread_mutex_lock(&pools_mu);
	for (int i = 0; i < MAX_CTX; i++)
		if (ctx && pools[i].ctx == ctx) {
			pool = pools[i].pool;
			pools[i].ctx = pools[i].pool = NULL;
		}
	pthread_mutex_unlock(&pools_mu);
	if (real)
		real(ctx); /* the context stops using the pool before it goes */
	if (pool) {
		void *(*dev_by_type)(int) = (void *(*)(int))sym("libggml.", "ggml_backend_dev_by_type");
		void *(*dev_reg)(void *) = (void *(*)(void *))sym("libggml.", "ggml_backend_dev_backend_reg");
		void *(*proc)(void *, const char *) =
			(void *(*)(void *, const char *))sym("libggml.", "ggml_backend_reg_get_proc_address");
		void *reg = dev_by_type && dev_reg ? dev_reg(dev_by_type(0)) : NULL;
		void (*pool_free)(void *) = reg && proc ? (void (*)(void *))proc(reg, "ggml_threadpool_free") : NULL;
		if (pool_free)
			pool_free(pool);
	}
}

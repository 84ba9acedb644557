/* llama-quantize-peer: runs llama.cpp's own quantizer (llama_model_quantize
 * from the peer's libllama, loaded with dlopen) so tests can compare its
 * output with mcv-quant's.
 *
 *   llama-quantize-peer [--lib DIR] [--type REGEX=TYPE]... [--pure]
 *                       [--allow-requantize] [--imatrix FILE]
 *                       INPUT.gguf OUTPUT.gguf FTYPE
 *
 * FTYPE is a llama_ftype number (15 = Q4_K_M) or a name (q4_k_m ...).  DIR
 * defaults to the node-llama-cpp binaries under scripts/peer.  Exit 77 when
 * the library is absent, 1 when quantization fails. */
#include "imatrix_file.h"
#include "recipe.h"
#include "quant.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Laid out as include/llama.h of the bundled llama.cpp (tag v0.5.0) declares
 * it; enums are ints. */
struct peer_tensor_override { const char *pattern; int type; };
struct peer_imatrix_data { const char *name; const float *data; size_t size; };
struct peer_quantize_params {
	int32_t nthread;
	int ftype;
	int output_tensor_type;
	int token_embedding_type;
	bool allow_requantize;
	bool quantize_output_tensor;
	bool only_copy;
	bool pure;
	bool keep_split;
	bool dry_run;
	const void *imatrix;
	const void *kv_overrides;
	const struct peer_tensor_override *tt_overrides;
	const int32_t *prune_layers;
	size_t max_buf_size;
};

#define DEFAULT_DIR "scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"

int main(int argc, char **argv)
{
	const char *dir = DEFAULT_DIR, *imatrix_path = NULL;
	struct peer_tensor_override ov[64];
	int n_ov = 0, pure = 0, nthread = 0, requant = 0;
	int i = 1;
	for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
		if (!strcmp(argv[i], "--lib") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--pure"))
			pure = 1;
		else if (!strcmp(argv[i], "--allow-requantize"))
			requant = 1;
		else if (!strcmp(argv[i], "--imatrix") && i + 1 < argc)
			imatrix_path = argv[++i];
		else if (!strcmp(argv[i], "-t") && i + 1 < argc)
			nthread = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--type") && i + 1 < argc && n_ov < 63) {
			char *s = argv[++i], *eq = strrchr(s, '=');
			if (!eq || mcv_type_from_name(eq + 1) < 0) {
				fprintf(stderr, "llama-quantize-peer: bad --type '%s'\n", s);
				return 2;
			}
			*eq = 0;
			ov[n_ov].pattern = s;
			ov[n_ov++].type = mcv_type_from_name(eq + 1);
		} else {
			fprintf(stderr, "llama-quantize-peer: unknown option '%s'\n", argv[i]);
			return 2;
		}
	}
	ov[n_ov].pattern = NULL;
	ov[n_ov].type = 0;
	if (argc - i != 3) {
		fprintf(stderr, "usage: llama-quantize-peer [--lib DIR] [-t N] [--type RE=TYPE]... [--pure] IN OUT FTYPE\n");
		return 2;
	}
	int ftype = mcv_recipe_from_name(argv[i + 2]);
	if (ftype < 0)
		ftype = atoi(argv[i + 2]);

	char path[4096];
	snprintf(path, sizeof path, "%s/libllama.v0.5.0.so", dir);
	void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		fprintf(stderr, "llama-quantize-peer: %s\n", dlerror());
		return 77;
	}
	void (*backend_load_all_from_path)(const char *) =
		(void (*)(const char *))dlsym(RTLD_DEFAULT, "ggml_backend_load_all_from_path");
	void (*backend_init)(void) = (void (*)(void))dlsym(h, "llama_backend_init");
	struct peer_quantize_params (*defaults)(void) =
		(struct peer_quantize_params (*)(void))dlsym(h, "llama_model_quantize_default_params");
	uint32_t (*quantize)(const char *, const char *, const struct peer_quantize_params *) =
		(uint32_t (*)(const char *, const char *, const struct peer_quantize_params *))dlsym(h, "llama_model_quantize");
	if (!defaults || !quantize) {
		fprintf(stderr, "llama-quantize-peer: libllama lacks llama_model_quantize\n");
		return 77;
	}
	if (backend_load_all_from_path)
		backend_load_all_from_path(dir);
	if (backend_init)
		backend_init();
	/* the same reader as mcv-quant's, so both see the same normalised values */
	mcv_imatrix *im = NULL;
	struct peer_imatrix_data *imd = NULL;
	if (imatrix_path) {
		mcv_error err;
		if (mcv_imatrix_load(&im, imatrix_path, &err)) {
			fprintf(stderr, "llama-quantize-peer: %s\n", err.msg);
			return 1;
		}
		int n = mcv_imatrix_count(im);
		imd = calloc(n + 1, sizeof *imd);
		for (int k = 0; k < n; k++) {
			int64_t nv;
			imd[k].name = mcv_imatrix_name(im, k);
			imd[k].data = mcv_imatrix_find(im, imd[k].name, &nv);
			imd[k].size = (size_t)nv;
		}
	}
	struct peer_quantize_params p = defaults();
	p.imatrix = imd;
	p.ftype = ftype;
	p.nthread = nthread;
	p.pure = pure;
	p.allow_requantize = requant;
	p.tt_overrides = n_ov ? ov : NULL;
	if (quantize(argv[i], argv[i + 1], &p)) {
		fprintf(stderr, "llama-quantize-peer: llama_model_quantize failed\n");
		return 1;
	}
	return 0;
}

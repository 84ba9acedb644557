/* mcv-quant: quantize a GGUF (F32/F16/BF16, or Q8_0 with a warning) to ggml
 * block types with one of llama.cpp's fixed recipes, --type overrides and an
 * optional importance matrix.  The output is written through the atomic
 * GGUF writer, one tensor at a time, in llama.cpp's tensor order, with its
 * metadata as llama-quantize writes it (input keys, then
 * general.quantization_version and general.file_type), so a file from
 * llama.cpp's own quantizer and one from mcv-quant can be compared byte for
 * byte. */
#include "cli.h"
#include "gguf.h"
#include "hfmodel.h"
#include "imatrix_file.h"
#include "mcv.h"
#include "quant.h"
#include "recipe.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "mcv-quant"
#define MAX_OVERRIDES 256
/* Rows converted to float at once: bounds RAM whatever the tensor size. */
#define CHUNK_FLOATS (16 << 20)

static void usage(FILE *f)
{
	fprintf(f,
"usage: " PROG " [options] INPUT OUTPUT\n"
"Quantize a model to ggml block types (OUTPUT '-' = stdout).  INPUT is a GGUF\n"
"(F32/F16/BF16, or Q8_0 re-quantized) or a Hugging Face checkpoint directory\n"
"(config.json, tokenizer.json, *.safetensors in F32/F16/BF16).\n"
"  --recipe R          q4_k_m q4_k_s q5_k_m q6_k q3_k_m q2_k q8_0 (default q4_k_m),\n"
"                      also q4_0 f16 bf16 f32; llama.cpp's per-tensor choices\n"
"  --type REGEX=TYPE   tensors whose name matches REGEX get TYPE (repeatable,\n"
"                      first match wins); TYPE: f32 f16 bf16 q8_0 q4_0 q2_k q3_k\n"
"                      q4_k q5_k q6_k\n"
"  --imatrix FILE      importance matrix (llama.cpp GGUF or legacy .dat)\n"
"  --report FILE       per-tensor TSV: tensor, shape, type, bits/weight, bytes\n"
"  -t N                threads (default: all cores)\n"
"  -v                  the report as a table on stderr\n"
"  -q                  no progress or summary\n"
"  -h, --help          this text\n"
"  --version           print the version\n");
}

enum { O_RECIPE = 1, O_TYPE, O_IMATRIX, O_REPORT, O_THREADS, O_VERBOSE, O_QUIET, O_HELP, O_VERSION };
static const cli_option opts[] = {
	{ "recipe", 0, CLI_ARG, O_RECIPE },
	{ "type", 0, CLI_ARG, O_TYPE },
	{ "imatrix", 0, CLI_ARG, O_IMATRIX },
	{ "report", 0, CLI_ARG, O_REPORT },
	{ "threads", 't', CLI_ARG, O_THREADS },
	{ "verbose", 'v', CLI_NO_ARG, O_VERBOSE },
	{ "quiet", 'q', CLI_NO_ARG, O_QUIET },
	{ "help", 'h', CLI_NO_ARG, O_HELP },
	{ "version", 0, CLI_NO_ARG, O_VERSION },
	{ NULL, 0, 0, 0 },
};

static int u32_key(const mcv_gguf *g, const char *arch, const char *suffix, int def)
{
	char key[256];
	uint32_t v;
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	if (!mcv_gguf_get_u32(g, key, &v, NULL))
		return (int)v;
	/* per-layer arrays: llama.cpp's n_gqa() looks at layer 0 */
	int et;
	uint64_t n;
	const void *d;
	if (!mcv_gguf_get_arr(g, key, &et, &n, &d, NULL) && n > 0) {
		if (et == GGUF_U32 || et == GGUF_I32)
			return ((const int32_t *)d)[0];
	}
	return def;
}

/* One input tensor, from a GGUF or from a Hugging Face checkpoint. */
typedef struct in_tensor {
	const char *name;
	int n_dims;
	int64_t ne[4];
	int type;          /* for the recipe: what "keep the input type" keeps */
	uint64_t nbytes;   /* input bytes, for progress */
	const mcv_gguf_tensor *g; /* GGUF input */
	int hf;            /* index in the HF model, or -1 */
} in_tensor;

static const mcv_hfmodel *hf_model;

static void shape_str(const in_tensor *t, char *s, size_t n)
{
	int o = 0;
	for (int d = 0; d < t->n_dims && o < (int)n; d++)
		o += snprintf(s + o, n - o, d ? "x%lld" : "%lld", (long long)t->ne[d]);
}

static int write_tensor(mcv_gguf_writer *w, const in_tensor *t, int type,
			const float *imat, float *fbuf, uint8_t *qbuf, uint64_t *done,
			uint64_t total, int quiet)
{
	const int64_t ne0 = t->ne[0];
	const int64_t rows_per_mat = t->ne[1];
	const int64_t n_mat = t->ne[2] * t->ne[3];
	if (t->g && type == t->g->type) {
		int rc = mcv_gguf_w_write(w, t->g->data, t->g->nbytes);
		*done += t->nbytes;
		return rc;
	}
	const size_t in_row = t->g ? mcv_row_bytes(t->g->type, ne0) : 0, out_row = mcv_row_bytes(type, ne0);
	const uint64_t in_row_bytes = t->nbytes / (uint64_t)(rows_per_mat * n_mat);
	int64_t chunk = CHUNK_FLOATS / ne0;
	if (chunk < 1)
		chunk = 1;
	for (int64_t m = 0; m < n_mat; m++) {
		const float *wm = imat ? imat + m * ne0 : NULL;
		for (int64_t r0 = 0; r0 < rows_per_mat; r0 += chunk) {
			int64_t nr = rows_per_mat - r0 < chunk ? rows_per_mat - r0 : chunk;
			const uint8_t *src = t->g ? (const uint8_t *)t->g->data + (m * rows_per_mat + r0) * in_row : NULL;
			/* each row is converted and quantized by one thread: the bytes
			 * do not depend on the thread count */
			#pragma omp parallel for schedule(dynamic, 1)
			for (int64_t r = 0; r < nr; r++) {
				float *x = fbuf + r * ne0;
				if (src)
					mcv_dequantize_row(t->g->type, src + r * in_row, x, ne0);
				else
					mcv_hfmodel_row(hf_model, t->hf, m * rows_per_mat + r0 + r, x);
				if (wm)
					mcv_quantize_row_imatrix(type, x, qbuf + r * out_row, ne0, wm);
				else
					mcv_quantize_row_ref(type, x, qbuf + r * out_row, ne0);
			}
			int rc = mcv_gguf_w_write(w, qbuf, nr * out_row);
			if (rc)
				return rc;
			*done += nr * in_row_bytes;
			if (!quiet)
				cli_progress("quantizing", *done, total);
		}
	}
	return 0;
}

static const in_tensor *sort_t;
static int layer_of(const char *name)
{
	int l = -1;
	if (sscanf(name, "blk.%d.", &l) != 1)
		l = -1;
	return l;
}
static int by_llama_order(const void *a, const void *b)
{
	const char *x = sort_t[*(const int64_t *)a].name;
	const char *y = sort_t[*(const int64_t *)b].name;
	int lx = layer_of(x), ly = layer_of(y);
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return strcmp(x, y);
}

int main(int argc, char **argv)
{
	cli_init(PROG);
	const char *recipe = "q4_k_m", *imatrix_path = NULL, *report_path = NULL;
	const char *pos[2];
	int n_pos = 0, verbose = 0, quiet = 0;
	mcv_recipe_override ov[MAX_OVERRIDES];
	int n_ov = 0;
	cli_parser p;
	cli_parser_init(&p, argc, argv);
	const char *arg;
	int id;
	while ((id = cli_next(&p, opts, &arg))) {
		switch (id) {
		case -1:
			if (n_pos == 2)
				cli_usage_error("too many arguments");
			pos[n_pos++] = arg;
			break;
		case O_RECIPE: recipe = arg; break;
		case O_TYPE: {
			const char *eq = strrchr(arg, '=');
			if (!eq || eq == arg)
				cli_usage_error("--type wants REGEX=TYPE, not '%s'", arg);
			int ty = mcv_type_from_name(eq + 1);
			const mcv_type_traits *tr = mcv_type_get(ty);
			if (ty < 0 || !tr || ty == MCV_Q8_K)
				cli_usage_error("--type: unknown type '%s'", eq + 1);
			if (n_ov == MAX_OVERRIDES)
				cli_usage_error("too many --type options");
			ov[n_ov].pattern = strndup(arg, eq - arg);
			ov[n_ov++].type = ty;
			break;
		}
		case O_IMATRIX: imatrix_path = arg; break;
		case O_REPORT: report_path = arg; break;
		case O_THREADS: omp_set_num_threads((int)cli_int("-t", arg, 1, 4096)); break;
		case O_VERBOSE: verbose = 1; break;
		case O_QUIET: quiet = 1; break;
		case O_HELP: usage(stdout); return 0;
		case O_VERSION: cli_print_version(); return 0;
		}
	}
	if (n_pos != 2)
		cli_usage_error("need INPUT and OUTPUT");
	int ftype = mcv_recipe_from_name(recipe);
	if (ftype < 0)
		cli_usage_error("unknown recipe '%s'", recipe);
	if (!strcmp(pos[1], "-") && isatty(1))
		cli_usage_error("refusing to write a model to a terminal");

	mcv_error err = { 0 };
	mcv_gguf *g = NULL;
	mcv_hfmodel *hf = NULL;
	struct stat sb;
	const char *arch = "";
	int64_t n;
	in_tensor *it;
	mcv_recipe_model rm;
	if (!stat(pos[0], &sb) && S_ISDIR(sb.st_mode)) {
		if (mcv_hfmodel_open(&hf, pos[0], &err))
			cli_die("%s", err.msg);
		hf_model = hf;
		arch = mcv_hfmodel_arch(hf);
		n = mcv_hfmodel_n_tensors(hf);
		it = calloc(n ? n : 1, sizeof *it);
		if (!it)
			cli_die("out of memory");
		for (int64_t i = 0; i < n; i++) {
			const mcv_hf_tensor *h = mcv_hfmodel_tensor(hf, (int)i);
			it[i].name = h->name;
			it[i].n_dims = h->n_dims;
			memcpy(it[i].ne, h->ne, sizeof it[i].ne);
			it[i].hf = (int)i;
			int64_t ne = h->ne[0] * h->ne[1] * h->ne[2] * h->ne[3];
			it[i].nbytes = (uint64_t)ne * (h->src_type == MCV_F32 ? 4 : 2);
			/* what llama.cpp's converter stores: matrices in the checkpoint's
			 * type, everything it never quantizes as F32 */
			it[i].type = MCV_F32;
			mcv_recipe_tensor probe = { .name = h->name, .n_dims = h->n_dims, .type = h->src_type };
			memcpy(probe.ne, h->ne, sizeof probe.ne);
			if (mcv_recipe_quantizable(&probe))
				it[i].type = h->src_type;
		}
		mcv_hfmodel_recipe_model(hf, &rm);
		if (!quiet && (mcv_hfmodel_n_vision(hf) || mcv_hfmodel_n_skipped(hf)))
			cli_error("note: left out %d vision-tower and %d MTP tensors (the language model only)",
				  mcv_hfmodel_n_vision(hf), mcv_hfmodel_n_skipped(hf));
	} else {
		if (mcv_gguf_open(&g, pos[0], &err))
			cli_die("%s", err.msg);
		if (mcv_gguf_get_str(g, "general.architecture", &arch, &err))
			cli_die("%s: %s", pos[0], err.msg);
		n = mcv_gguf_n_tensors(g);
		it = calloc(n ? n : 1, sizeof *it);
		if (!it)
			cli_die("out of memory");
		for (int64_t i = 0; i < n; i++) {
			const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
			it[i].name = t->name;
			it[i].n_dims = t->n_dims;
			memcpy(it[i].ne, t->ne, sizeof it[i].ne);
			it[i].type = t->type;
			it[i].nbytes = t->nbytes;
			it[i].g = t;
			it[i].hf = -1;
		}
		rm = (mcv_recipe_model){
			.n_layer = u32_key(g, arch, "block_count", 0),
			.n_expert = u32_key(g, arch, "expert_count", 0),
			.n_head = u32_key(g, arch, "attention.head_count", 0),
			.n_head_kv = u32_key(g, arch, "attention.head_count_kv", 0),
		};
	}

	mcv_imatrix *im = NULL;
	if (imatrix_path && mcv_imatrix_load(&im, imatrix_path, &err))
		cli_die("%s", err.msg);

	mcv_recipe_tensor *rt = calloc(n ? n : 1, sizeof *rt);
	int *types = calloc(n ? n : 1, sizeof *types);
	int64_t *order = calloc(n ? n : 1, sizeof *order);
	if (!rt || !types || !order)
		cli_die("out of memory");
	int n_requant = 0;
	for (int64_t i = 0; i < n; i++) {
		rt[i].name = it[i].name;
		rt[i].n_dims = it[i].n_dims;
		memcpy(rt[i].ne, it[i].ne, sizeof rt[i].ne);
		rt[i].type = it[i].type;
		order[i] = i;
	}
	if (mcv_recipe_assign(ftype, &rm, rt, (int)n, ov, n_ov, im != NULL, types, &err))
		cli_die("%s: %s", pos[0], err.msg);
	/* refuse what cannot be read before anything is written */
	for (int64_t i = 0; i < n; i++) {
		const in_tensor *t = &it[i];
		if (!t->g || types[i] == t->type)
			goto fits;
		if (t->type == MCV_Q8_0)
			n_requant++;
		else if (t->type != MCV_F32 && t->type != MCV_F16 && t->type != MCV_BF16)
			cli_die("%s: %s is %s: only F32, F16, BF16 and Q8_0 inputs can be quantized",
				pos[0], t->name, mcv_type_get(t->type) ? mcv_type_get(t->type)->name : "?");
	fits:
		if (!mcv_row_bytes(types[i], t->ne[0]))
			cli_die("%s: %s: rows of %lld do not fit type %s", pos[0], t->name,
				(long long)t->ne[0], mcv_type_get(types[i])->name);
		if (im) {
			int64_t in;
			const float *v = mcv_imatrix_find(im, t->name, &in);
			if (v && in != t->ne[0] * t->ne[2] && strcmp(t->name, "token_embd.weight"))
				cli_die("%s: importance data for %s has %lld values, the tensor needs %lld",
					imatrix_path, t->name, (long long)in, (long long)(t->ne[0] * t->ne[2]));
		}
	}
	if (n_requant && !quiet)
		cli_error("warning: re-quantizing %d Q8_0 tensor(s): quality is lower than from F16/BF16", n_requant);

	sort_t = it;
	qsort(order, n, sizeof *order, by_llama_order);

	mcv_gguf_writer *w;
	if (mcv_gguf_writer_open(&w, pos[1], &err))
		cli_die("%s", err.msg);
	if (hf && mcv_hfmodel_write_kv(hf, w)) {
		mcv_gguf_writer_abort(w);
		cli_die("%s: cannot convert the tokenizer or config", pos[0]);
	}
	int64_t nkv = g ? mcv_gguf_n_kv(g) : 0;
	for (int64_t i = 0; i < nkv; i++) {
		const char *k = mcv_gguf_key(g, i);
		if (!strcmp(k, "general.quantization_version") || !strcmp(k, "general.file_type") ||
		    !strncmp(k, "split.", 6))
			continue;
		mcv_gguf_w_copy_kv(w, g, i);
	}
	mcv_gguf_w_u32(w, "general.quantization_version", 2);
	mcv_gguf_w_u32(w, "general.file_type", (uint32_t)ftype);
	uint64_t total_in = 0, total_out = 0, n_elem = 0;
	int64_t max_ne0 = 1;
	for (int64_t k = 0; k < n; k++) {
		const in_tensor *t = &it[order[k]];
		mcv_gguf_w_add_tensor(w, t->name, types[order[k]], t->n_dims, t->ne);
		total_in += t->nbytes;
		if (t->ne[0] > max_ne0)
			max_ne0 = t->ne[0];
	}
	int64_t chunk_rows = CHUNK_FLOATS / max_ne0 > 0 ? CHUNK_FLOATS / max_ne0 : 1;
	float *fbuf = malloc((size_t)chunk_rows * max_ne0 * sizeof(float));
	uint8_t *qbuf = malloc((size_t)chunk_rows * max_ne0 * sizeof(float));
	if (!fbuf || !qbuf)
		cli_die("out of memory");
	mcv_gguf_w_begin_data(w);

	FILE *rep = NULL;
	if (report_path) {
		rep = !strcmp(report_path, "-") ? stdout : fopen(report_path, "w");
		if (!rep)
			cli_die("cannot open '%s'", report_path);
		fprintf(rep, "tensor\tshape\ttype\tbits_per_weight\tbytes\n");
	}
	if (verbose)
		fprintf(stderr, "%-40s %-18s %-6s %7s %12s\n", "tensor", "shape", "type", "bpw", "bytes");
	double t0 = cli_now();
	uint64_t done = 0;
	int rc = 0;
	for (int64_t k = 0; k < n && !rc; k++) {
		const in_tensor *t = &it[order[k]];
		int ty = types[order[k]];
		const float *imat = NULL;
		if (im && mcv_type_get(ty)->is_quant && (!t->g || ty != t->g->type)) {
			int64_t in;
			imat = mcv_imatrix_find(im, t->name, &in);
			if (imat && in != t->ne[0] * t->ne[2])
				imat = NULL; /* token_embd, as llama.cpp */
		}
		rc = write_tensor(w, t, ty, imat, fbuf, qbuf, &done, total_in, quiet);
		if (!rc)
			rc = mcv_gguf_w_end_tensor(w);
		uint64_t ne = (uint64_t)t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
		uint64_t bytes = (uint64_t)mcv_row_bytes(ty, t->ne[0]) * (ne / t->ne[0]);
		total_out += bytes;
		n_elem += ne;
		char shape[96];
		shape_str(t, shape, sizeof shape);
		double bpw = ne ? 8.0 * bytes / ne : 0;
		if (rep)
			fprintf(rep, "%s\t%s\t%s\t%.4f\t%llu\n", t->name, shape, mcv_type_get(ty)->name, bpw,
				(unsigned long long)bytes);
		if (verbose)
			fprintf(stderr, "%-40s %-18s %-6s %7.3f %12llu\n", t->name, shape, mcv_type_get(ty)->name,
				bpw, (unsigned long long)bytes);
	}
	if (!quiet)
		cli_progress_done();
	if (rc) {
		const mcv_error *we = mcv_gguf_writer_error(w);
		mcv_gguf_writer_abort(w);
		cli_die("%s: %s", pos[1], we ? we->msg : "write failed");
	}
	if (mcv_gguf_writer_finish(w, &err))
		cli_die("%s", err.msg);
	if (rep && rep != stdout && fclose(rep))
		cli_die("cannot write '%s'", report_path);
	if (!quiet)
		fprintf(stderr, PROG ": wrote %s: %s, %lld tensors, %.1f MB -> %.1f MB (%.2f bits/weight) in %.1f s\n",
			pos[1], mcv_recipe_name(ftype), (long long)n, total_in / 1e6, total_out / 1e6,
			n_elem ? 8.0 * total_out / n_elem : 0.0, cli_now() - t0);
	free(fbuf);
	free(qbuf);
	free(rt);
	free(types);
	free(order);
	free(it);
	for (int i = 0; i < n_ov; i++)
		free((char *)ov[i].pattern);
	mcv_imatrix_free(im);
	mcv_hfmodel_close(hf);
	if (g)
		mcv_gguf_close(g);
	return 0;
}

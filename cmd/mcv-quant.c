/* mcv-quant: quantize a GGUF (F32/F16/BF16, or a quantized one with a warning) to ggml
 * block types with one of llama.cpp's fixed recipes, --type overrides and an
 * optional importance matrix.  The output is written through the atomic
 * GGUF writer, one tensor at a time, in llama.cpp's tensor order, with its
 * metadata as llama-quantize writes it (input keys, then
 * general.quantization_version and general.file_type), so a file from
 * llama.cpp's own quantizer and one from mcv-quant can be compared byte for
 * byte.
 *
 * --calibrate measures an importance matrix by running the model
 * (quant/calib.h); --target-bpw / --target-size / --expert-bytes-per-token
 * replace the recipe's per-tensor choice by a measured allocation
 * (quant/alloc.h), optionally with single-tensor KL probes (quant/sens.h). */
#include "alloc.h"
#include "calib.h"
#include "cli.h"
#include "gguf.h"
#include "hfmodel.h"
#include "imatrix_file.h"
#include "mcv.h"
#include "model.h"
#include "quant.h"
#include "recipe.h"
#include "sens.h"

#include <math.h>
#include <omp.h>
#include <regex.h>
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
"       " PROG " --calibrate DATA.jsonl --imatrix-out FILE [options] INPUT [OUTPUT]\n"
"Quantize a model to ggml block types (OUTPUT '-' = stdout).  INPUT is a GGUF\n"
"(F32/F16/BF16; Q8_0, Q4_0, Q5_x or K-quants are decoded and re-quantized)\n"
"or a Hugging Face checkpoint directory\n"
"(config.json, tokenizer.json, *.safetensors in F32/F16/BF16).\n"
"  --recipe R          q4_k_m q4_k_s q5_k_m q6_k q3_k_m q2_k q8_0 (default q4_k_m),\n"
"                      also q4_0 f16 bf16 f32; llama.cpp's per-tensor choices\n"
"  --type REGEX=TYPE   tensors whose name matches REGEX get TYPE (repeatable,\n"
"                      first match wins); TYPE: f32 f16 bf16 q8_0 q4_0 q5_0 q5_1\n"
"                      q2_k q3_k q4_k q5_k q6_k\n"
"  --imatrix FILE      importance matrix (llama.cpp GGUF or legacy .dat)\n"
"  --calibrate DATA    run INPUT (a GGUF mcv-run loads) on the JSONL prompts\n"
"                      ({\"prompt\": TEXT} or {\"tokens\": [IDS]}) and measure the\n"
"                      importance matrix; needs --imatrix-out; used for OUTPUT\n"
"  --imatrix-out FILE  where --calibrate saves it (llama.cpp's GGUF imatrix)\n"
"  --calib-tokens N    at most N tokens of each prompt (default 512)\n"
"  --target-bpw B      choose per-tensor types by measured sensitivity so that\n"
"                      the whole file has B bits per weight (all tensors)\n"
"  --target-size SIZE  the same for a size in bytes (K, M, G suffixes)\n"
"  --expert-bytes-per-token SIZE\n"
"                      also bound the expert bytes one token reads (top-k\n"
"                      routed experts + shared expert, summed over layers)\n"
"  --sample-rows N     rows per tensor measured for sensitivity (default 4096)\n"
"  --sensitivity FILE  TSV of every candidate: tensor, type, bytes, estimated loss\n"
"  --probe DATA.jsonl  scale each tensor's estimate by the KL divergence measured\n"
"                      with that tensor alone at its lowest type, on the first\n"
"                      --probe-lines N lines of DATA (default 8); needs a GGUF\n"
"                      INPUT with F32/F16/BF16 matrices\n"
"  --probe-tensors N   probe at most N tensors, evenly spread; the others take\n"
"                      the median factor of their kind (default: all)\n"
"  --report FILE       per-tensor TSV: tensor, shape, type, bits/weight, bytes,\n"
"                      estimated loss (allocation) \n"
"  -t N                threads (default: all cores)\n"
"  -v                  the report as a table on stderr\n"
"  -q                  no progress or summary\n"
"  -h, --help          this text\n"
"  --version           print the version\n");
}

enum { O_RECIPE = 1, O_TYPE, O_IMATRIX, O_REPORT, O_THREADS, O_VERBOSE, O_QUIET, O_HELP, O_VERSION,
       O_CALIB, O_IMOUT, O_CALTOK, O_BPW, O_SIZE, O_EBPT, O_SAMPLE, O_SENS, O_PROBE, O_PLINES, O_PTENS };
static const cli_option opts[] = {
	{ "recipe", 0, CLI_ARG, O_RECIPE },
	{ "type", 0, CLI_ARG, O_TYPE },
	{ "imatrix", 0, CLI_ARG, O_IMATRIX },
	{ "report", 0, CLI_ARG, O_REPORT },
	{ "calibrate", 0, CLI_ARG, O_CALIB },
	{ "imatrix-out", 0, CLI_ARG, O_IMOUT },
	{ "calib-tokens", 0, CLI_ARG, O_CALTOK },
	{ "target-bpw", 0, CLI_ARG, O_BPW },
	{ "target-size", 0, CLI_ARG, O_SIZE },
	{ "expert-bytes-per-token", 0, CLI_ARG, O_EBPT },
	{ "sample-rows", 0, CLI_ARG, O_SAMPLE },
	{ "sensitivity", 0, CLI_ARG, O_SENS },
	{ "probe", 0, CLI_ARG, O_PROBE },
	{ "probe-lines", 0, CLI_ARG, O_PLINES },
	{ "probe-tensors", 0, CLI_ARG, O_PTENS },
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

/* Float rows of an input tensor, for the sensitivity measurement. */
static void in_row(void *user, int64_t r, float *out)
{
	const in_tensor *t = user;
	if (t->g) {
		size_t rb = mcv_row_bytes(t->g->type, t->ne[0]);
		mcv_dequantize_row(t->g->type, (const uint8_t *)t->g->data + (size_t)r * rb, out, t->ne[0]);
	} else {
		mcv_hfmodel_row(hf_model, t->hf, r, out);
	}
}

/* The kind of a tensor: its name without the "blk.N." prefix. */
static const char *kind_of(const char *name)
{
	int l, off = 0;
	if (sscanf(name, "blk.%d.%n", &l, &off) == 1 && off > 0)
		return name + off;
	return name;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Scale every allocated tensor's estimates by measured KL / estimate at its
 * lowest candidate: probed tensors by their own factor, the rest by the
 * median factor of probed tensors of the same kind (or of all). */
static int probe_scale(const char *path, int is_gguf, const char *data, int lines, int max_probe,
		       mcv_alloc_tensor *at, const in_tensor *it, int64_t n, int n_meas,
		       const mcv_imatrix *im, int max_tokens, int quiet, mcv_error *err)
{
	if (!is_gguf)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "--probe needs a GGUF input");
	mcv_model *m = NULL;
	mcv_sens *s = NULL;
	int rc = mcv_model_load(&m, path, NULL, err);
	if (!rc)
		rc = mcv_sens_init(&s, m, data, lines, max_tokens, err);
	double *f = calloc(n ? n : 1, sizeof *f), *tmp = calloc(n ? n : 1, sizeof *tmp);
	if (!rc && (!f || !tmp))
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
	double t0 = cli_now();
	int k = 0, probed = 0;
	for (int64_t i = 0; i < n && !rc; i++) {
		f[i] = -1;
		if (at[i].fixed_type >= 0)
			continue;
		/* evenly spread over the allocated tensors */
		int take = (int64_t)(k + 1) * max_probe / n_meas != (int64_t)k * max_probe / n_meas || max_probe >= n_meas;
		k++;
		if (!take)
			continue;
		const float *imp = NULL;
		if (im) {
			int64_t in;
			imp = mcv_imatrix_find(im, it[i].name, &in);
			if (imp && in != it[i].ne[0] * it[i].ne[2] * it[i].ne[3])
				imp = NULL;
		}
		double kl;
		if ((rc = mcv_sens_probe(s, it[i].name, at[i].cand[0], imp, &kl, err)))
			break;
		f[i] = at[i].loss[0] > 0 ? (kl > 1e-12 ? kl : 1e-12) / at[i].loss[0] : 0;
		probed++;
		if (!quiet)
			cli_progress("probing", (uint64_t)probed, (uint64_t)(max_probe < n_meas ? max_probe : n_meas));
	}
	if (!quiet && !rc) {
		cli_progress_done();
		fprintf(stderr, PROG ": probed %d tensors on %lld positions in %.1f s\n", probed,
			(long long)mcv_sens_positions(s), cli_now() - t0);
	}
	for (int64_t i = 0; i < n && !rc; i++) {
		if (at[i].fixed_type >= 0)
			continue;
		double fi = f[i];
		if (fi < 0) {
			int nt = 0, na = 0;
			for (int64_t j = 0; j < n; j++)
				if (f[j] >= 0 && !strcmp(kind_of(it[j].name), kind_of(it[i].name)))
					tmp[nt++] = f[j];
			if (!nt)
				for (int64_t j = 0; j < n; j++)
					if (f[j] >= 0)
						tmp[na++] = f[j];
			int c = nt ? nt : na;
			qsort(tmp, c, sizeof *tmp, cmp_double);
			fi = c ? tmp[c / 2] : 1;
		}
		for (int c = 0; c < at[i].n_cand; c++)
			at[i].loss[c] *= fi;
	}
	free(f);
	free(tmp);
	mcv_sens_free(s);
	mcv_model_free(m);
	return rc;
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
	int n_pos = 0, verbose = 0, quiet = 0, calib_tokens = 512;
	const char *calib_path = NULL, *imout_path = NULL, *sens_path = NULL, *probe_path = NULL;
	int probe_lines = 8, probe_tensors = 1 << 30;
	double target_bpw = 0, target_size = 0, target_ebpt = 0;
	int64_t sample_rows = 4096;
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
			if (ty < 0 || !tr || ty == MCV_Q8_K || ty == MCV_Q8_1)
				cli_usage_error("--type: unknown type '%s'", eq + 1);
			if (n_ov == MAX_OVERRIDES)
				cli_usage_error("too many --type options");
			ov[n_ov].pattern = strndup(arg, eq - arg);
			ov[n_ov++].type = ty;
			break;
		}
		case O_IMATRIX: imatrix_path = arg; break;
		case O_REPORT: report_path = arg; break;
		case O_CALIB: calib_path = arg; break;
		case O_IMOUT: imout_path = arg; break;
		case O_CALTOK: calib_tokens = (int)cli_int("--calib-tokens", arg, 1, 1 << 20); break;
		case O_BPW: target_bpw = cli_float("--target-bpw", arg, 1.0, 32.0); break;
		case O_SIZE: target_size = (double)cli_size("--target-size", arg); break;
		case O_EBPT: target_ebpt = (double)cli_size("--expert-bytes-per-token", arg); break;
		case O_SENS: sens_path = arg; break;
		case O_PROBE: probe_path = arg; break;
		case O_PLINES: probe_lines = (int)cli_int("--probe-lines", arg, 1, 1 << 20); break;
		case O_PTENS: probe_tensors = (int)cli_int("--probe-tensors", arg, 1, 1 << 30); break;
		case O_SAMPLE: sample_rows = cli_int("--sample-rows", arg, 1, 1L << 40); break;
		case O_THREADS: omp_set_num_threads((int)cli_int("-t", arg, 1, 4096)); break;
		case O_VERBOSE: verbose = 1; break;
		case O_QUIET: quiet = 1; break;
		case O_HELP: usage(stdout); return 0;
		case O_VERSION: cli_print_version(); return 0;
		}
	}
	if (n_pos != 2 && !(n_pos == 1 && calib_path))
		cli_usage_error("need INPUT and OUTPUT");
	if (calib_path && !imout_path)
		cli_usage_error("--calibrate needs --imatrix-out FILE");
	if (target_bpw > 0 && target_size > 0)
		cli_usage_error("--target-bpw and --target-size exclude each other");
	const int allocate = target_bpw > 0 || target_size > 0 || target_ebpt > 0;
	int ftype = mcv_recipe_from_name(recipe);
	if (ftype < 0)
		cli_usage_error("unknown recipe '%s'", recipe);
	if (n_pos == 2 && !strcmp(pos[1], "-") && isatty(1))
		cli_usage_error("refusing to write a model to a terminal");

	mcv_error err = { 0 };
	if (calib_path) {
		mcv_model *cm = NULL;
		mcv_calib *cal = NULL;
		int np;
		int64_t ntok;
		double tc = cli_now();
		if (mcv_model_load(&cm, pos[0], NULL, &err))
			cli_die("%s: %s (calibration needs a GGUF that mcv-run loads)", pos[0], err.msg);
		if (mcv_calib_init(&cal, mcv_model_gguf(cm), &err) ||
		    mcv_calib_run_jsonl(cal, cm, calib_path, calib_tokens, &np, &ntok, &err) ||
		    mcv_calib_save(cal, imout_path, calib_path, np, &err))
			cli_die("%s", err.msg);
		if (!quiet)
			fprintf(stderr, PROG ": calibrated on %d prompts, %lld tokens: %d matrices in %s (%.1f s)\n", np,
				(long long)ntok, mcv_calib_n_seen(cal), imout_path, cli_now() - tc);
		mcv_calib_free(cal);
		mcv_model_free(cm);
		if (n_pos == 1)
			return 0;
		imatrix_path = imout_path;
	}
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
	/* quantized inputs are decoded to float and quantized again, as
	 * llama-quantize --allow-requantize does; the warning counts them per
	 * input type once the allocation has settled every tensor's type */
	int n_requant = 0, n_requant_type[MCV_BF16 + 1] = { 0 };
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
		if (t->type != MCV_F32 && t->type != MCV_F16 && t->type != MCV_BF16) {
			const mcv_type_traits *tr = mcv_type_get(t->type);
			/* Q8_K and Q8_1 are activation formats, never stored weights */
			if (!tr || !tr->is_quant || t->type == MCV_Q8_K || t->type == MCV_Q8_1)
				cli_die("%s: %s is %s: inputs can be F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1 or "
					"Q2_K..Q6_K", pos[0], t->name, tr ? tr->name : "of an unknown type");
		}
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
	double *est_loss = calloc(n ? n : 1, sizeof *est_loss);
	if (!est_loss)
		cli_die("out of memory");
	for (int64_t i = 0; i < n; i++)
		est_loss[i] = NAN;
	if (allocate) {
		int n_exp = g ? u32_key(g, arch, "expert_count", 0) : rm.n_expert;
		int k_exp = g ? u32_key(g, arch, "expert_used_count", 0) : 0;
		if (target_ebpt > 0 && n_exp > 0 && k_exp <= 0)
			cli_die("%s: --expert-bytes-per-token needs expert_used_count (a GGUF input)", pos[0]);
		regex_t re[MAX_OVERRIDES];
		for (int j = 0; j < n_ov; j++)
			if (regcomp(&re[j], ov[j].pattern, REG_EXTENDED | REG_NOSUB))
				cli_die("bad regular expression '%s'", ov[j].pattern);
		mcv_alloc_tensor *at = calloc(n ? n : 1, sizeof *at);
		if (!at)
			cli_die("out of memory");
		uint64_t n_all = 0;
		int n_meas = 0;
		for (int64_t i = 0; i < n; i++) {
			const in_tensor *t = &it[i];
			at[i].name = t->name;
			memcpy(at[i].ne, t->ne, sizeof at[i].ne);
			at[i].fixed_type = types[i];
			n_all += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
			if (!mcv_recipe_quantizable(&rt[i]) || !mcv_type_get(types[i])->is_quant)
				continue;
			int manual = 0;
			for (int j = 0; j < n_ov && !manual; j++)
				manual = !regexec(&re[j], t->name, 0, NULL, 0);
			if (manual)
				continue;
			at[i].n_cand = mcv_alloc_candidates(t->ne[0], at[i].cand);
			if (!at[i].n_cand)
				continue;
			at[i].fixed_type = -1;
			at[i].expert_share = strstr(t->name, "_exps.") && n_exp > 0 ? (double)k_exp / n_exp
					     : strstr(t->name, "_shexp.") ? 1.0 : 0.0;
			n_meas++;
		}
		for (int j = 0; j < n_ov; j++)
			regfree(&re[j]);
		double tm = cli_now();
		int done_meas = 0;
		for (int64_t i = 0; i < n; i++) {
			if (at[i].fixed_type >= 0)
				continue;
			const float *imp = NULL;
			if (im) {
				int64_t in;
				imp = mcv_imatrix_find(im, it[i].name, &in);
				if (imp && in != it[i].ne[0] * it[i].ne[2] * it[i].ne[3])
					imp = NULL;
			}
			if (mcv_alloc_measure(&at[i], in_row, (void *)&it[i], imp, NULL, 1, sample_rows, &err))
				cli_die("%s: %s", it[i].name, err.msg);
			if (!quiet)
				cli_progress("measuring", (uint64_t)++done_meas, (uint64_t)n_meas);
		}
		if (!quiet)
			cli_progress_done();
		if (probe_path && probe_scale(pos[0], g != NULL, probe_path, probe_lines, probe_tensors, at, it, n,
					      n_meas, im, calib_tokens, quiet, &err))
			cli_die("%s", err.msg);
		mcv_alloc_budget bud = {
			.max_bytes = target_size > 0 ? target_size : target_bpw * (double)n_all / 8,
			.max_expert_bytes_token = target_ebpt,
		};
		if (sens_path) {
			FILE *sf = fopen(sens_path, "w");
			if (!sf)
				cli_die("cannot open '%s'", sens_path);
			fprintf(sf, "tensor\ttype\tbytes\test_loss\n");
			for (int64_t i = 0; i < n; i++)
				for (int c = 0; at[i].fixed_type < 0 && c < at[i].n_cand; c++)
					fprintf(sf, "%s\t%s\t%.0f\t%.6g\n", at[i].name, mcv_type_get(at[i].cand[c])->name,
						at[i].bytes[c], at[i].loss[c]);
			if (fclose(sf))
				cli_die("cannot write '%s'", sens_path);
		}
		if (mcv_alloc_solve(at, (int)n, &bud, &err))
			cli_die("%s: %s", pos[0], err.msg);
		for (int64_t i = 0; i < n; i++)
			if (at[i].fixed_type < 0) {
				types[i] = at[i].cand[at[i].choice];
				est_loss[i] = at[i].loss[at[i].choice];
			}
		if (!quiet) {
			double tot = 0, eb = 0, lsum = 0;
			for (int64_t i = 0; i < n; i++) {
				tot += mcv_alloc_bytes(&at[i]);
				if (at[i].fixed_type < 0) {
					eb += at[i].expert_share * at[i].bytes[at[i].choice];
					lsum += at[i].loss[at[i].choice];
				}
			}
			fprintf(stderr, PROG ": allocated %d tensors in %.1f s: %.0f bytes (%.3f bits/weight), "
				"%.0f expert bytes/token, total estimated loss %.6g\n", n_meas, cli_now() - tm, tot,
				8 * tot / (double)n_all, eb, lsum);
		}
		free(at);
		verbose |= !quiet;
	}
	for (int64_t i = 0; i < n; i++) {
		const in_tensor *t = &it[i];
		if (t->g && types[i] != t->type && t->type != MCV_F32 && t->type != MCV_F16 &&
		    t->type != MCV_BF16 && t->type >= 0 && t->type <= MCV_BF16) {
			n_requant++;
			n_requant_type[t->type]++;
		}
	}
	if (n_requant && !quiet) {
		char what[160] = "";
		int o = 0;
		for (int ty = 0; ty <= MCV_BF16 && o < (int)sizeof what; ty++)
			if (n_requant_type[ty])
				o += snprintf(what + o, sizeof what - o, "%s%d %s", o ? ", " : "", n_requant_type[ty],
					      mcv_type_get(ty)->name);
		cli_error("warning: re-quantizing %d tensor(s) (%s): quality is lower than from F16/BF16",
			  n_requant, what);
	}

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
		fprintf(rep, "tensor\tshape\ttype\tbits_per_weight\tbytes\test_loss\n");
	}
	if (verbose)
		fprintf(stderr, "%-40s %-18s %-6s %7s %12s %10s\n", "tensor", "shape", "type", "bpw", "bytes", "est_loss");
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
		char lossbuf[32] = "-";
		if (!isnan(est_loss[order[k]]))
			snprintf(lossbuf, sizeof lossbuf, "%.4g", est_loss[order[k]]);
		if (rep)
			fprintf(rep, "%s\t%s\t%s\t%.4f\t%llu\t%s\n", t->name, shape, mcv_type_get(ty)->name, bpw,
				(unsigned long long)bytes, lossbuf);
		if (verbose)
			fprintf(stderr, "%-40s %-18s %-6s %7.3f %12llu %10s\n", t->name, shape, mcv_type_get(ty)->name,
				bpw, (unsigned long long)bytes, lossbuf);
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
			pos[1], allocate ? "allocated" : mcv_recipe_name(ftype), (long long)n, total_in / 1e6, total_out / 1e6,
			n_elem ? 8.0 * total_out / n_elem : 0.0, cli_now() - t0);
	free(fbuf);
	free(qbuf);
	free(est_loss);
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

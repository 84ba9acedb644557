/* mcv-predict: train and evaluate expert predictors for Lookahead Expert
 * Scheduling from routing traces (mcv-run --trace-routing).
 *
 *   mcv-predict train [options] TRACE... -o PREDICTOR
 *   mcv-predict eval [options] PREDICTOR TRACE...
 *
 * Traces are read whole into memory (hidden states as floats): a few
 * thousand tokens of the proving model are a few tens of MB. */
#include "cli.h"
#include "mcv.h"
#include "model.h"
#include "predict.h"
#include "predict_train.h"
#include "trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum {
	O_MODEL = 1, O_OUT, O_LOOKAHEAD, O_RANK, O_HIDDEN, O_CONTEXT, O_EPOCHS, O_BATCH, O_LR, O_VAL, O_SEED,
	O_THREADS, O_JSON, O_QUIET, O_HELP, O_VERSION,
};

static const cli_option options[] = {
	{ "model", 'm', CLI_ARG, O_MODEL },
	{ "output", 'o', CLI_ARG, O_OUT },
	{ "lookahead", 0, CLI_ARG, O_LOOKAHEAD },
	{ "rank", 0, CLI_ARG, O_RANK },
	{ "hidden", 0, CLI_ARG, O_HIDDEN },
	{ "context", 0, CLI_ARG, O_CONTEXT },
	{ "epochs", 0, CLI_ARG, O_EPOCHS },
	{ "batch", 0, CLI_ARG, O_BATCH },
	{ "lr", 0, CLI_ARG, O_LR },
	{ "val", 0, CLI_ARG, O_VAL },
	{ "seed", 's', CLI_ARG, O_SEED },
	{ "threads", 't', CLI_ARG, O_THREADS },
	{ "json", 0, CLI_NO_ARG, O_JSON },
	{ "quiet", 'q', CLI_NO_ARG, O_QUIET },
	{ "help", 'h', CLI_NO_ARG, O_HELP },
	{ "version", 0, CLI_NO_ARG, O_VERSION },
	{ NULL, 0, 0, 0 },
};

static void usage(void)
{
	printf(
"usage: mcv-predict train [options] TRACE... -o PREDICTOR\n"
"       mcv-predict eval [options] PREDICTOR TRACE...\n"
"Train or evaluate an expert predictor: from the hidden state entering layer l,\n"
"score the experts layer l+d will route to (d = 1..lookahead).  Traces come from\n"
"mcv-run --trace-routing and must hold hidden states.\n"
"\n"
"train:\n"
"  -o, --output FILE      the predictor GGUF to write (required)\n"
"  -m, --model FILE       start from this model's router baseline (recommended)\n"
"      --lookahead D      layers ahead to predict, 1..n_layer-1 (default 2)\n"
"      --rank R           rank of each low-rank map (default 64)\n"
"      --hidden N         width of each map's ReLU branch, 0 = none (default 128)\n"
"      --context C        routing: also read the experts already chosen (the previous\n"
"                         token's, this token's lower layers); none: the hidden state\n"
"                         alone (default routing)\n"
"      --epochs N         passes over the training tokens (default 20)\n"
"      --batch N          minibatch size (default 32)\n"
"      --lr X             Adam step size (default 0.001)\n"
"      --val F            fraction of tokens held out to pick the best epoch (default 0.1)\n"
"  -s, --seed N           random seed (default 1)\n"
"eval:\n"
"  -m, --model FILE       also score the router baseline of this model\n"
"      --json             one JSON object instead of the table\n"
"common:\n"
"  -t, --threads N        threads (default: all cores); results do not depend on it\n"
"  -q, --quiet            no progress on standard error\n"
"  -h, --help             this help\n"
"      --version          print the version\n"
"\n"
"Exit status: 0 ok, 1 runtime or data error, 2 usage error.\n");
}

typedef struct opts {
	const char *model, *out;
	int lookahead, rank, hidden, context, epochs, batch, threads;
	double lr, val;
	uint64_t seed;
	int json, quiet;
	const char **args;
	int n_args;
} opts;

/* Every trace's tokens, hidden states as floats. */
typedef struct dataset {
	mcv_trace_model tm;
	int64_t n;
	float *hidden;    /* [n][L][H] */
	int32_t *experts; /* [n][L][k] */
	int64_t *prev;    /* [n]: the token before in the same trace, -1 for a trace's first */
} dataset;

static void load_traces(dataset *ds, const char *const *paths, int np, const mcv_trace_model *want,
			const char *want_what)
{
	mcv_error err;
	memset(ds, 0, sizeof *ds);
	int64_t cap = 0;
	for (int i = 0; i < np; i++) {
		mcv_trace *t;
		if (mcv_trace_open(&t, paths[i], &err))
			cli_die("%s: %s", paths[i], err.msg);
		const mcv_trace_model *tm = mcv_trace_model_of(t);
		if (i == 0 && !want)
			ds->tm = *tm;
		const mcv_trace_model *ref = want ? want : &ds->tm;
		if (mcv_trace_model_match(tm, ref, &err))
			cli_die("%s: %s%s", paths[i], err.msg, want ? want_what : " (the first trace's)");
		if (want)
			ds->tm = *want;
		if (mcv_trace_hidden_type(t) < 0)
			cli_die("%s: the trace has no hidden states (record it with mcv-run --trace-routing)",
				paths[i]);
		const int L = tm->n_layer, k = tm->n_expert_used;
		const int64_t H = tm->n_embd, n = mcv_trace_n_tokens(t);
		if (ds->n + n > cap) {
			cap = (ds->n + n) * 2;
			ds->hidden = realloc(ds->hidden, sizeof(float) * (size_t)(cap * L * H));
			ds->experts = realloc(ds->experts, sizeof(int32_t) * (size_t)(cap * L * k));
			ds->prev = realloc(ds->prev, sizeof(int64_t) * (size_t)cap);
			if (!ds->hidden || !ds->experts || !ds->prev)
				cli_die("out of memory for %" PRId64 " tokens of traces", cap);
		}
		for (int64_t tok = 0; tok < n; tok++)
			ds->prev[ds->n + tok] = tok > 0 ? ds->n + tok - 1 : -1;
		for (int64_t tok = 0; tok < n; tok++)
			for (int l = 0; l < L; l++) {
				const int64_t row = (ds->n + tok) * L + l;
				if (mcv_trace_hidden(t, tok, l, ds->hidden + row * H))
					cli_die("%s: token %" PRId64 " layer %d: no hidden state", paths[i], tok, l);
				const int32_t *ids = mcv_trace_experts(t, tok, l);
				if (!ids)
					cli_die("%s: token %" PRId64 " layer %d: no routing", paths[i], tok, l);
				memcpy(ds->experts + row * k, ids, sizeof(int32_t) * (size_t)k);
			}
		ds->n += n;
		mcv_trace_close(t);
	}
	if (ds->n == 0)
		cli_die("the traces hold no tokens");
}

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static mcv_model *load_model(const char *path, int threads)
{
	mcv_error err;
	mcv_model_params mp = mcv_model_default_params();
	mp.n_threads = threads;
	mcv_model *m;
	if (mcv_model_load(&m, path, &mp, &err))
		cli_die("%s: %s", path, err.msg);
	return m;
}

static int cmd_train(const opts *o)
{
	if (!o->out)
		cli_usage_error("train: -o PREDICTOR is required");
	if (o->n_args < 1)
		cli_usage_error("train: no TRACE given");
	mcv_error err;
	mcv_model *m = NULL;
	mcv_trace_model mtm;
	if (o->model) {
		m = load_model(o->model, o->threads);
		if (mcv_trace_model_from_gguf(&mtm, mcv_model_gguf(m), &err))
			cli_die("%s: %s", o->model, err.msg);
	}
	dataset ds;
	load_traces(&ds, o->args, o->n_args, m ? &mtm : NULL, " (-m model)");
	uint8_t *val = calloc((size_t)ds.n, 1);
	if (!val)
		cli_die("out of memory");
	/* held-out tokens in blocks of 16, so neighbours of a validation
	 * token are not trained on */
	int64_t nval = 0;
	for (int64_t t = 0; t < ds.n; t++) {
		val[t] = (double)(mix(o->seed * 0x100000001b3ull + (uint64_t)(t / 16)) >> 11) / 9007199254740992.0 < o->val;
		nval += val[t];
	}
	if (o->val > 0 && nval == 0 && ds.n > 1)
		val[ds.n - 1] = 1;
	mcv_pred_data d = { ds.n, ds.tm.n_layer, (int)ds.tm.n_embd, ds.tm.n_expert_used, ds.hidden,
			    ds.experts, val, ds.prev };
	mcv_pred_train_params tp = mcv_pred_train_default_params();
	tp.lookahead = o->lookahead;
	tp.rank = o->rank;
	tp.hidden = o->hidden;
	tp.context = o->context;
	tp.epochs = o->epochs;
	tp.batch = o->batch;
	tp.lr = (float)o->lr;
	tp.seed = o->seed;
	tp.verbose = !o->quiet;
	if (tp.lookahead >= ds.tm.n_layer)
		cli_usage_error("--lookahead %d: the model has %d layers (1..%d)", tp.lookahead,
				ds.tm.n_layer, ds.tm.n_layer - 1);
	mcv_predictor *p;
	double t0 = cli_now();
	if (mcv_predictor_train(&p, &ds.tm, m, &d, &tp, &err))
		cli_die("%s", err.msg);
	if (mcv_predictor_save(p, o->out, &err))
		cli_die("%s: %s", o->out, err.msg);
	if (!o->quiet)
		cli_error("wrote %s: lookahead %d, rank %d, %s, %" PRId64 " tokens, %.1f s", o->out,
			  tp.lookahead, tp.rank, tp.context ? "routing context" : "no context", ds.n,
			  cli_now() - t0);
	mcv_predictor_free(p);
	mcv_model_free(m);
	free(val);
	free(ds.hidden);
	free(ds.experts);
	free(ds.prev);
	return 0;
}

static void json_num(double v, int present)
{
	if (present)
		printf("%.6f", v);
	else
		printf("null");
}

static int cmd_eval(const opts *o)
{
	if (o->n_args < 2)
		cli_usage_error("eval: PREDICTOR and at least one TRACE are needed");
	mcv_error err;
	mcv_model *m = NULL;
	mcv_predictor *p, *base = NULL;
	const char *ppath = o->args[0];
	if (o->model) {
		m = load_model(o->model, o->threads);
		if (mcv_predictor_load(&p, ppath, m, &err))
			cli_die("%s", err.msg);
		if (mcv_predictor_router(&base, m, &err))
			cli_die("%s: %s", o->model, err.msg);
	} else if (mcv_predictor_open(&p, ppath, &err)) {
		cli_die("%s", err.msg);
	}
	const mcv_trace_model *tm = mcv_predictor_model(p);
	dataset ds;
	char what[600];
	snprintf(what, sizeof what, " (predictor %.500s)", ppath);
	load_traces(&ds, o->args + 1, o->n_args - 1, tm, what);
	const int L = tm->n_layer, D = mcv_predictor_max_lookahead(p), E = tm->n_expert,
		  k = tm->n_expert_used;
	const int64_t H = tm->n_embd;
	double *rt = calloc((size_t)L * D, sizeof *rt), *rb = calloc((size_t)L * D, sizeof *rb);
	if (!rt || !rb)
		cli_die("out of memory");
	int failed = 0;
	/* one (layer, distance) per iteration: each sum runs in token order */
#pragma omp parallel for schedule(dynamic, 1)
	for (int pi = 0; pi < L * D; pi++) {
		const int l = pi / D, d = pi % D + 1;
		if (l + d >= L)
			continue;
		float *s = malloc(sizeof(float) * (size_t)E);
		if (!s) {
			failed = 1;
			continue;
		}
		double st = 0, sb = 0;
		mcv_error e2;
		for (int64_t t = 0; t < ds.n; t++) {
			const float *h = ds.hidden + ((size_t)t * L + l) * H;
			const int32_t *ids = ds.experts + ((size_t)t * L + l + d) * k;
			/* what the runtime knows when layer l of token t starts */
			const mcv_pred_context c = {
				ds.prev[t] >= 0 ? ds.experts + (size_t)ds.prev[t] * L * k : NULL,
				ds.experts + (size_t)t * L * k,
			};
			if (mcv_predictor_scores_ctx(p, l, d, h, &c, s, &e2))
				failed = 1;
			st += mcv_pred_recall(s, E, ids, k);
			if (base) {
				if (mcv_predictor_scores(base, l, d, h, s, &e2))
					failed = 1;
				sb += mcv_pred_recall(s, E, ids, k);
			}
		}
		rt[pi] = st / ds.n;
		rb[pi] = sb / ds.n;
		free(s);
	}
	if (failed)
		cli_die("scoring failed");
	const int hb = base != NULL;
	if (o->json) {
		printf("{\"predictor\":");
		cli_json_str(stdout, ppath, strlen(ppath));
		printf(",\"kind\":\"%s\",\"rank\":%d,\"hidden\":%d,\"context\":\"%s\",\"lookahead\":%d,"
		       "\"k\":%d,\"tokens\":%" PRId64 ",\"rows\":[", mcv_predictor_kind(p), mcv_predictor_rank(p),
		       mcv_predictor_hidden(p), mcv_predictor_context(p) ? "routing" : "none", D, k, ds.n);
	} else {
		printf("predictor %s: %s, rank %d, ReLU width %d, %s, lookahead %d; %" PRId64
		       " tokens; recall@%d\n", ppath, mcv_predictor_kind(p), mcv_predictor_rank(p),
		       mcv_predictor_hidden(p), mcv_predictor_context(p) ? "routing context" : "no context", D,
		       ds.n, k);
		printf("layer\tahead\ttrained\trouter\n");
	}
	int first = 1;
	for (int l = 0; l < L; l++)
		for (int d = 1; d <= D && l + d < L; d++) {
			const int pi = l * D + d - 1;
			if (o->json) {
				printf("%s{\"layer\":%d,\"lookahead\":%d,\"trained\":", first ? "" : ",", l, d);
				json_num(rt[pi], 1);
				printf(",\"router\":");
				json_num(rb[pi], hb);
				printf("}");
				first = 0;
			} else if (hb) {
				printf("%d\t%d\t%.4f\t%.4f\n", l, d, rt[pi], rb[pi]);
			} else {
				printf("%d\t%d\t%.4f\t-\n", l, d, rt[pi]);
			}
		}
	if (o->json)
		printf("],\"mean\":[");
	double at = 0, ab = 0;
	int an = 0;
	for (int d = 1; d <= D; d++) {
		double mt = 0, mb = 0;
		int n = 0;
		for (int l = 0; l + d < L; l++) {
			mt += rt[l * D + d - 1];
			mb += rb[l * D + d - 1];
			n++;
		}
		at += mt, ab += mb, an += n;
		mt /= n, mb /= n;
		if (o->json) {
			printf("%s{\"lookahead\":%d,\"trained\":", d > 1 ? "," : "", d);
			json_num(mt, 1);
			printf(",\"router\":");
			json_num(mb, hb);
			printf("}");
		} else if (hb) {
			printf("mean\t%d\t%.4f\t%.4f\n", d, mt, mb);
		} else {
			printf("mean\t%d\t%.4f\t-\n", d, mt);
		}
	}
	if (o->json) {
		printf("],\"mean_all\":{\"trained\":");
		json_num(at / an, 1);
		printf(",\"router\":");
		json_num(ab / an, hb);
		printf("}}\n");
	} else if (hb) {
		printf("mean\tall\t%.4f\t%.4f\n", at / an, ab / an);
	} else {
		printf("mean\tall\t%.4f\t-\n", at / an);
	}
	if (fflush(stdout))
		cli_die("write error");
	free(rt), free(rb);
	free(ds.hidden), free(ds.experts), free(ds.prev);
	mcv_predictor_free(p);
	mcv_predictor_free(base);
	mcv_model_free(m);
	return 0;
}

int main(int argc, char **argv)
{
	cli_init("mcv-predict");
	opts o = { .lookahead = 2, .rank = 64, .hidden = 128, .context = 1, .epochs = 20, .batch = 32, .lr = 1e-3, .val = 0.1, .seed = 1 };
	o.args = calloc((size_t)argc + 1, sizeof *o.args);
	if (!o.args)
		cli_die("out of memory");
	const char *cmd = NULL;
	cli_parser ps;
	const char *arg;
	int id;
	cli_parser_init(&ps, argc, argv);
	while ((id = cli_next(&ps, options, &arg)) != 0) {
		switch (id) {
		case -1:
			if (!cmd)
				cmd = arg;
			else
				o.args[o.n_args++] = arg;
			break;
		case O_MODEL: o.model = arg; break;
		case O_OUT: o.out = arg; break;
		case O_LOOKAHEAD: o.lookahead = (int)cli_int("--lookahead", arg, 1, 1 << 16); break;
		case O_RANK: o.rank = (int)cli_int("--rank", arg, 1, 1 << 16); break;
		case O_HIDDEN: o.hidden = (int)cli_int("--hidden", arg, 0, 1 << 16); break;
		case O_CONTEXT:
			if (!strcmp(arg, "routing"))
				o.context = 1;
			else if (!strcmp(arg, "none"))
				o.context = 0;
			else
				cli_usage_error("--context: routing or none, not '%.64s'", arg);
			break;
		case O_EPOCHS: o.epochs = (int)cli_int("--epochs", arg, 0, 1 << 20); break;
		case O_BATCH: o.batch = (int)cli_int("--batch", arg, 1, 1 << 20); break;
		case O_LR: o.lr = cli_float("--lr", arg, 1e-9, 10); break;
		case O_VAL: o.val = cli_float("--val", arg, 0, 0.9); break;
		case O_SEED: o.seed = cli_u64("--seed", arg); break;
		case O_THREADS: o.threads = (int)cli_int("--threads", arg, 1, 1024); break;
		case O_JSON: o.json = 1; break;
		case O_QUIET: o.quiet = 1; break;
		case O_HELP: usage(); return 0;
		case O_VERSION: cli_print_version(); return 0;
		}
	}
#ifdef _OPENMP
	if (o.threads > 0)
		omp_set_num_threads(o.threads);
#endif
	if (!cmd)
		cli_usage_error("a command is needed: train or eval (see --help)");
	if (!strcmp(cmd, "train"))
		return cmd_train(&o);
	if (!strcmp(cmd, "eval"))
		return cmd_eval(&o);
	cli_usage_error("unknown command '%.64s' (train or eval)", cmd);
}

/* mcv-run: generate text from a qwen35 / qwen35moe model, with images.
 *
 * Flow: options -> prompt (-p, -f, stdin or --tokens) -> model -> tokenizer
 * -> chat template -> prefill -> sample/eval loop, streaming complete UTF-8
 * to stdout.  Options live in one table with a handler switch, so later
 * features (memory budget, LES, drafts) add rows and cases without touching
 * the rest.
 *
 * With images (run_media): -i/--video build one prompt whose image slots are
 * filled by lib/multimodal.h; FILE/DIR arguments, --archive and --batch make
 * a batch, driven by cmd/batch.c, which calls run_prompt once per image on a
 * context reset in between (the model and vision tower load once). */
#include "batch.h"
#include "chat.h"
#include "cli.h"
#include "les.h"
#include "les_replay.h"
#include "media.h"
#include "mcv.h"
#include "model.h"
#include "multimodal.h"
#include "predict.h"
#include "quant.h"
#include "sampler.h"
#include "tokenizer.h"
#include "trace_rec.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define DEFAULT_MODEL "proving-text.gguf"
#define DEFAULT_MMPROJ "proving-mmproj.gguf"

enum {
	O_MODEL = 1, O_PROMPT, O_FILE, O_N, O_TEMP, O_TOPK, O_TOPP, O_MINP,
	O_REPEAT, O_REPEAT_N, O_SEED, O_THREADS, O_CHAT, O_RAW, O_THINK, O_SYSTEM,
	O_STATS, O_JSON, O_TOKENS, O_VERBOSE, O_QUIET, O_HELP, O_VERSION, O_CTX,
	O_IMAGE, O_VIDEO, O_FRAMES, O_FPS, O_ARCHIVE, O_BATCH, O_NUL, O_COMPRESS,
	O_MAX_SLICES, O_UPSCALE, O_MAX_PIXELS, O_MAX_BYTES, O_MMPROJ, O_JSONL, O_TEXT,
	O_TRACE_ROUTING,
	O_MEM, O_LOOKAHEAD, O_PREFETCH_WIDTH, O_CACHE_POLICY, O_PREDICTOR, O_LES_TRACE, O_IO_THREADS, O_PREFETCH_MIN, O_DIRECT_IO,
	O_REPLAY, O_REPLAY_MODEL, O_IGNORE_EOS,
};

static const cli_option options[] = {
	{ "model", 'm', CLI_ARG, O_MODEL },
	{ "prompt", 'p', CLI_ARG, O_PROMPT },
	{ "file", 'f', CLI_ARG, O_FILE },
	{ "n-predict", 'n', CLI_ARG, O_N },
	{ "temp", 0, CLI_ARG, O_TEMP },
	{ "top-k", 0, CLI_ARG, O_TOPK },
	{ "top-p", 0, CLI_ARG, O_TOPP },
	{ "min-p", 0, CLI_ARG, O_MINP },
	{ "repeat-penalty", 0, CLI_ARG, O_REPEAT },
	{ "repeat-last-n", 0, CLI_ARG, O_REPEAT_N },
	{ "ignore-eos", 0, CLI_NO_ARG, O_IGNORE_EOS },
	{ "seed", 's', CLI_ARG, O_SEED },
	{ "threads", 't', CLI_ARG, O_THREADS },
	{ "ctx", 'c', CLI_ARG, O_CTX },
	{ "chat", 0, CLI_NO_ARG, O_CHAT },
	{ "raw", 0, CLI_NO_ARG, O_RAW },
	{ "think", 0, CLI_NO_ARG, O_THINK },
	{ "system", 0, CLI_ARG, O_SYSTEM },
	{ "stats", 0, CLI_NO_ARG, O_STATS },
	{ "json", 0, CLI_NO_ARG, O_JSON },
	{ "tokens", 0, CLI_ARG, O_TOKENS },
	{ "image", 'i', CLI_ARG, O_IMAGE },
	{ "video", 0, CLI_ARG, O_VIDEO },
	{ "frames", 0, CLI_ARG, O_FRAMES },
	{ "fps", 0, CLI_ARG, O_FPS },
	{ "archive", 0, CLI_ARG, O_ARCHIVE },
	{ "batch", 0, CLI_NO_ARG, O_BATCH },
	{ "null", '0', CLI_NO_ARG, O_NUL },
	{ "mmproj", 0, CLI_ARG, O_MMPROJ },
	{ "compress", 0, CLI_ARG, O_COMPRESS },
	{ "max-slices", 0, CLI_ARG, O_MAX_SLICES },
	{ "upscale", 0, CLI_ARG, O_UPSCALE },
	{ "max-pixels", 0, CLI_ARG, O_MAX_PIXELS },
	{ "max-bytes", 0, CLI_ARG, O_MAX_BYTES },
	{ "jsonl", 0, CLI_NO_ARG, O_JSONL },
	{ "text", 0, CLI_NO_ARG, O_TEXT },
	{ "trace-routing", 0, CLI_ARG, O_TRACE_ROUTING },
	{ "mem", 0, CLI_ARG, O_MEM },
	{ "lookahead", 0, CLI_ARG, O_LOOKAHEAD },
	{ "prefetch-width", 0, CLI_ARG, O_PREFETCH_WIDTH },
	{ "cache-policy", 0, CLI_ARG, O_CACHE_POLICY },
	{ "predictor", 0, CLI_ARG, O_PREDICTOR },
	{ "trace", 0, CLI_ARG, O_LES_TRACE },
	{ "io-threads", 0, CLI_ARG, O_IO_THREADS },
	{ "prefetch-min", 0, CLI_ARG, O_PREFETCH_MIN },
	{ "io", 0, CLI_ARG, O_DIRECT_IO },
	{ "replay", 0, CLI_ARG, O_REPLAY },
	{ "replay-model", 0, CLI_ARG, O_REPLAY_MODEL },
	{ "verbose", 'v', CLI_NO_ARG, O_VERBOSE },
	{ "quiet", 'q', CLI_NO_ARG, O_QUIET },
	{ "help", 'h', CLI_NO_ARG, O_HELP },
	{ "version", 0, CLI_NO_ARG, O_VERSION },
	{ NULL, 0, 0, 0 },
};

static void usage(void)
{
	printf(
"usage: mcv-run [options] [-m MODEL] [-p PROMPT | -f FILE | < PROMPT]\n"
"       mcv-run [options] -p PROMPT -i IMAGE [-i IMAGE...] [--video FILE]\n"
"       mcv-run [options] -p PROMPT {FILE|DIR|--archive A|--batch}...\n"
"Generate text with a MiniCPM-V 4.7-class model (qwen35, qwen35moe): from a\n"
"prompt, from one prompt with several images or a video, or in a batch (the\n"
"same prompt for every image; one record per image).\n"
"\n"
"input:\n"
"  -m, --model FILE       model GGUF (default: the embedded " DEFAULT_MODEL ")\n"
"  -p, --prompt TEXT      prompt text (default: read standard input)\n"
"  -f, --file FILE        read the prompt from FILE ('-' = standard input)\n"
"      --tokens LIST      prompt as token ids, e.g. \"1,2,3\" (no template)\n"
"      --chat             wrap the prompt in the chat template (default)\n"
"      --raw              use the prompt as it is, no template\n"
"      --system TEXT      system message for the chat template\n"
"      --think            let the model think (no empty <think> block)\n"
"images (one prompt):\n"
"  -i, --image FILE       a PNG or JPEG in the prompt; repeat for several (in order)\n"
"      --video FILE       video frames in the prompt, in time order\n"
"      --frames N         frames taken from the video, evenly spread (default 8)\n"
"      --fps F            instead: F frames per second of video\n"
"batch (one record per image; FILE and DIR arguments count too):\n"
"      --archive FILE     every image member of an archive ('-' = standard input)\n"
"      --batch            image paths on standard input, one per line\n"
"  -0, --null             paths on standard input end with NUL (implies --batch)\n"
"vision:\n"
"      --mmproj FILE      vision GGUF (default: next to the model, *-mmproj.gguf)\n"
"      --compress 4x|16x  visual token compression (default: the file's)\n"
"      --max-slices N     slices besides the overview (default: the file's)\n"
"      --upscale F        slice as if the image were F times larger: finer view of\n"
"                         small print (0.25-4, default 1)\n"
"      --max-pixels N     refuse larger images, K/M/G suffixes (default 64M)\n"
"      --max-bytes N      refuse larger image files or members (default 256M)\n"
"generation:\n"
"  -n, --n-predict N      tokens to generate, -1 until end or context (default 256)\n"
"  -c, --ctx N            context size in tokens (default: min(4096, trained))\n"
"      --temp T           temperature, 0 = greedy (default 0.8)\n"
"      --top-k K          keep the K most likely tokens, 0 = off (default 40)\n"
"      --top-p P          keep the smallest set with probability >= P, 1 = off (default 0.95)\n"
"      --min-p P          drop tokens below P times the best one, 0 = off (default 0.05)\n"
"      --repeat-penalty X penalise recent tokens, 1 = off (default 1)\n"
"      --repeat-last-n N  tokens the penalty looks back at, -1 = all (default 64)\n"
"      --ignore-eos       generate -n tokens even past an end token (benchmarks)\n"
"  -s, --seed N           random seed (default: from the clock)\n"
"  -t, --threads N        threads (default: all cores)\n"
"memory budget (mixture-of-experts models):\n"
"      --mem SIZE         hold everything in SIZE bytes (K/M/G = KiB/MiB/GiB): experts are\n"
"                         read into a bounded cache, predicted ones ahead of time\n"
"      --lookahead N      layers predicted ahead, 0 = read on demand only (default 1)\n"
"      --prefetch-width N experts read per predicted layer (default: the top-k)\n"
"      --cache-policy P   lfru (frequency/recency, protects predictions; default) or lru\n"
"      --predictor FILE   a trained predictor (mcv-predict); default: the next layer's router\n"
"      --prefetch-min P   prefetch only guesses at least P likely (0..1) to be routed,\n"
"                         never evicting an expert likelier to be used (default 0: all)\n"
"      --io MODE          aio (direct reads, kernel AIO), threads (direct reads on\n"
"                         I/O threads) or buffered (page cache, I/O threads); default\n"
"                         aio for experts up to 512 KiB, else threads\n"
"      --io-threads N     expert reads in flight (aio) or reader threads, 1..16\n"
"                         (default 4 with aio, else 2)\n"
"      --trace FILE       JSON lines per token and layer: experts chosen, resident,\n"
"                         prefetched, missed, stall\n"
"      --replay TRACE     run the routing of a trace recorded on a smaller model, mapped\n"
"                         onto this one (see mcv-run(1)), instead of a prompt\n"
"      --replay-model FILE  the model the trace was recorded on: predictions (its router,\n"
"                         or --predictor FILE of it) from the trace's hidden states\n"
"output:\n"
"      --json             one JSON object: text, token ids, stats\n"
"      --jsonl            one JSON line per input (default in a batch)\n"
"      --text             plain text; in a batch SOURCE<TAB>MEMBER<TAB>TEXT lines\n"
"      --stats            timing and memory on standard error\n"
"      --trace-routing FILE  write a routing trace (router choices, hidden states) for mcv-predict\n"
"  -v, --verbose          model and prompt details on standard error\n"
"  -q, --quiet            no warnings\n"
"  -h, --help             this help\n"
"      --version          print the version\n"
"\n"
"Exit status: 0 ok, 1 runtime or data error, 2 usage error.\n");
}

enum { MEDIA_IMAGE = 0, MEDIA_VIDEO = 1 };
typedef struct media_arg {
	int kind;
	const char *path;
} media_arg;

#define MAX_ARGS 1024

static trace_rec *trace_out; /* --trace-routing: NULL when off */

typedef struct run_opts {
	const char *model, *prompt, *file, *system, *tokens, *mmproj;
	const char *trace_routing; /* --trace-routing FILE */
	mcv_les_params les;        /* --mem and the LES options */
	const char *predictor, *les_trace;
	const char *replay, *replay_model; /* --replay, --replay-model */
	bool les_opt;              /* an LES option other than --mem was given */
	int n_predict, n_ctx, threads, verbose;
	bool raw, think, stats, json, seed_set, ignore_eos;
	mcv_sampler_params sp;
	/* images in one prompt, in command-line order */
	media_arg media[MAX_ARGS];
	int n_media;
	int frames;
	double fps;
	/* batch inputs, in command-line order (a shell glob may give many) */
	batch_src *src;
	int n_src, cap_src;
	bool nul_sep, jsonl, text;
	int compress, max_slices;
	double upscale; /* 0: none (--upscale) */
	mcv_media_limits lim;
} run_opts;

static void add_src(run_opts *o, batch_src_kind kind, const char *arg)
{
	if (o->n_src == o->cap_src) {
		o->cap_src = o->cap_src ? 2 * o->cap_src : 16;
		o->src = realloc(o->src, (size_t)o->cap_src * sizeof *o->src);
		if (!o->src)
			cli_die("out of memory");
	}
	o->src[o->n_src++] = (batch_src){ kind, arg };
}

static uint64_t parse_count(const char *opt, const char *s)
{
	uint64_t v;
	mcv_error err;
	if (mcv_media_parse_count(s, &v, &err) != 0)
		cli_usage_error("%s: '%.64s' is not a count (e.g. 64M)", opt, s);
	return v;
}

static void parse_args(run_opts *o, int argc, char **argv)
{
	cli_parser p;
	const char *arg;
	int id;
	cli_parser_init(&p, argc, argv);
	while ((id = cli_next(&p, options, &arg)) != 0) {
		switch (id) {
		case -1: {
			/* a name that is not there is most likely a typo or a
			 * misplaced option value: say so before loading anything */
			struct stat st;
			if (stat(arg, &st) != 0)
				cli_usage_error("'%.200s': %s", arg, strerror(errno));
		}
			/* fall through */
		case O_ARCHIVE:
			add_src(o, id == -1 ? BATCH_PATH : BATCH_ARCHIVE, arg);
			break;
		case O_NUL: o->nul_sep = true; /* fall through */
		case O_BATCH: {
			bool have = false;
			for (int i = 0; i < o->n_src; i++)
				have |= o->src[i].kind == BATCH_LIST;
			if (!have)
				add_src(o, BATCH_LIST, "-");
			break;
		}
		case O_IMAGE:
		case O_VIDEO:
			if (o->n_media == MAX_ARGS)
				cli_usage_error("more than %d images in one prompt", MAX_ARGS);
			o->media[o->n_media++] = (media_arg){ id == O_IMAGE ? MEDIA_IMAGE : MEDIA_VIDEO, arg };
			break;
		case O_FRAMES: o->frames = (int)cli_int("--frames", arg, 1, 1024); break;
		case O_FPS: o->fps = cli_float("--fps", arg, 1e-6, 1000); break;
		case O_MMPROJ: o->mmproj = arg; break;
		case O_COMPRESS:
			if (!strcmp(arg, "4x") || !strcmp(arg, "4"))
				o->compress = 4;
			else if (!strcmp(arg, "16x") || !strcmp(arg, "16"))
				o->compress = 16;
			else
				cli_usage_error("--compress: '%.64s' is not 4x or 16x", arg);
			break;
		case O_MAX_SLICES: o->max_slices = (int)cli_int("--max-slices", arg, 1, 63); break;
		case O_UPSCALE: o->upscale = cli_float("--upscale", arg, 0.25, 4); break;
		case O_MAX_PIXELS: o->lim.max_pixels = parse_count("--max-pixels", arg); break;
		case O_MAX_BYTES: o->lim.max_bytes = parse_count("--max-bytes", arg); break;
		case O_JSONL: o->jsonl = true; o->text = false; break;
		case O_TEXT: o->text = true; o->jsonl = false; break;
		case O_MODEL: o->model = arg; break;
		case O_PROMPT: o->prompt = arg; break;
		case O_FILE: o->file = arg; break;
		case O_TOKENS: o->tokens = arg; break;
		case O_SYSTEM: o->system = arg; break;
		case O_N: o->n_predict = (int)cli_int("-n", arg, -1, INT_MAX / 2); break;
		case O_CTX: o->n_ctx = (int)cli_int("--ctx", arg, 1, 1 << 24); break;
		case O_THREADS: o->threads = (int)cli_int("-t", arg, 1, 1024); break;
		case O_TEMP: o->sp.temp = (float)cli_float("--temp", arg, 0, 1e6); break;
		case O_TOPK: o->sp.top_k = (int)cli_int("--top-k", arg, 0, INT_MAX); break;
		case O_TOPP: o->sp.top_p = (float)cli_float("--top-p", arg, 0, 1); break;
		case O_MINP: o->sp.min_p = (float)cli_float("--min-p", arg, 0, 1); break;
		case O_REPEAT: o->sp.repeat_penalty = (float)cli_float("--repeat-penalty", arg, 1e-6, 1e6); break;
		case O_REPEAT_N: o->sp.repeat_last_n = (int)cli_int("--repeat-last-n", arg, -1, 1 << 20); break;
		case O_IGNORE_EOS: o->ignore_eos = true; break;
		case O_SEED: o->sp.seed = cli_u64("--seed", arg); o->seed_set = true; break;
		case O_CHAT: o->raw = false; break;
		case O_RAW: o->raw = true; break;
		case O_THINK: o->think = true; break;
		case O_STATS: o->stats = true; break;
		case O_TRACE_ROUTING: o->trace_routing = arg; break;
		case O_MEM: {
			mcv_error e;
			if (mcv_les_parse_size(arg, &o->les.mem, &e) != 0)
				cli_usage_error("--mem: %s", e.msg);
			break;
		}
		case O_LOOKAHEAD: o->les.lookahead = (int)cli_int("--lookahead", arg, 0, MCV_LES_MAX_LOOKAHEAD); o->les_opt = true; break;
		case O_PREFETCH_WIDTH: o->les.prefetch_width = (int)cli_int("--prefetch-width", arg, 1, 4096); o->les_opt = true; break;
		case O_IO_THREADS: o->les.io_threads = (int)cli_int("--io-threads", arg, 1, 16); o->les_opt = true; break;
		case O_PREFETCH_MIN: o->les.prefetch_min = cli_float("--prefetch-min", arg, 0.0, 1.0); o->les_opt = true; break;
		case O_DIRECT_IO:
			if (!strcmp(arg, "aio"))
				o->les.direct = -1, o->les.aio = 1;
			else if (!strcmp(arg, "threads"))
				o->les.direct = -1, o->les.aio = 0;
			else if (!strcmp(arg, "buffered"))
				o->les.direct = 0, o->les.aio = 0;
			else
				cli_usage_error("--io: '%.64s' is not aio, threads or buffered", arg);
			o->les_opt = true;
			break;
		case O_CACHE_POLICY:
			if (!strcmp(arg, "lfru"))
				o->les.policy = MCV_LES_LFRU;
			else if (!strcmp(arg, "lru"))
				o->les.policy = MCV_LES_LRU;
			else
				cli_usage_error("--cache-policy: '%.64s' is not lfru or lru", arg);
			o->les_opt = true;
			break;
		case O_PREDICTOR: o->predictor = arg; o->les_opt = true; break;
		case O_LES_TRACE: o->les_trace = arg; o->les_opt = true; break;
		case O_REPLAY: o->replay = arg; break;
		case O_REPLAY_MODEL: o->replay_model = arg; break;
		case O_JSON: o->json = true; break;
		case O_VERBOSE: o->verbose = 2; break;
		case O_QUIET: o->verbose = 0; break;
		case O_HELP: usage(); exit(0);
		case O_VERSION: cli_print_version(); exit(0);
		}
	}
	if (o->les_opt && !o->les.mem)
		cli_usage_error("--lookahead, --prefetch-width, --prefetch-min, --cache-policy, --predictor, "
				"--io-threads, --io and --trace work with a memory budget: give --mem SIZE");
	if (o->replay_model && !o->replay)
		cli_usage_error("--replay-model goes with --replay TRACE");
	if (o->replay && o->predictor && !o->replay_model)
		cli_usage_error("with --replay, --predictor is a predictor of --replay-model: give it");
	if (o->replay && !o->model)
		cli_usage_error("--replay needs the full-size model: give -m FILE");
	if (o->replay && (o->prompt || o->file || o->tokens || o->n_media || o->n_src))
		cli_usage_error("--replay replaces the prompt: no -p, -f, --tokens or images with it");
	if (o->prompt && o->file)
		cli_usage_error("give the prompt with -p or -f, not both");
	if (o->tokens && (o->prompt || o->file))
		cli_usage_error("--tokens replaces the prompt: no -p or -f with it");
	if ((o->n_media || o->n_src) && o->tokens)
		cli_usage_error("--tokens cannot be used with images");
	if (o->n_media && o->n_src)
		cli_usage_error("-i/--video build one prompt; batch inputs (FILE, DIR, --archive, "
				"--batch) take no -i or --video");
	if (o->frames && o->fps > 0)
		cli_usage_error("give --frames or --fps, not both");
	/* the prompt comes from stdin too when neither -p nor -f gives it */
	int n_stdin = o->file ? !strcmp(o->file, "-") : !o->prompt && !o->tokens;
	for (int i = 0; i < o->n_src; i++)
		n_stdin += o->src[i].kind == BATCH_LIST ||
			   (o->src[i].kind == BATCH_ARCHIVE && !strcmp(o->src[i].arg, "-"));
	for (int i = 0; i < o->n_media; i++)
		n_stdin += !strcmp(o->media[i].path, "-");
	if (n_stdin > 1)
		cli_usage_error("standard input can feed only one of: the prompt (without -p, or -f -), "
				"--batch/-0, --archive -, -i -");
	if (o->n_src && !o->prompt && !o->file)
		cli_usage_error("a batch needs its prompt from -p TEXT or -f FILE");
}

/* "1,2, 3" -> ids; a usage error when malformed. */
static int32_t *parse_tokens(const char *s, int *n)
{
	int32_t *ids;
	mcv_error e;
	int rc = mcv_token_ids_parse(s, &ids, n, &e);
	if (rc == MCV_ENOMEM)
		cli_die("out of memory");
	if (rc != 0)
		cli_usage_error("--tokens: %s", e.msg);
	return ids;
}

/* The embedded model: $MCV_DATADIR/models, the source tree next to the
 * binary (bin/../examples/models), then the installed data folder. */
static const char *default_file(const char *name, char *buf, size_t cap)
{
	const char *env = getenv("MCV_DATADIR");
	struct stat st;
	if (env && *env) {
		snprintf(buf, cap, "%s/models/%s", env, name);
		if (stat(buf, &st) == 0)
			return buf;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n > 0) {
		exe[n] = 0;
		char *slash = strrchr(exe, '/');
		if (slash) {
			*slash = 0;
			snprintf(buf, cap, "%s/../examples/models/%s", exe, name);
			if (stat(buf, &st) == 0)
				return buf;
		}
	}
	snprintf(buf, cap, "%s/models/%s", MCV_DATADIR, name);
	if (stat(buf, &st) == 0)
		return buf;
	return NULL;
}

/* Streams bytes to stdout but holds back an incomplete UTF-8 sequence at
 * the end, so a character split over two tokens is written whole. */
typedef struct stream {
	char hold[8];
	int n_hold;
} stream;

static size_t utf8_complete(const char *s, size_t n)
{
	/* find the start of the last sequence within the last 4 bytes */
	for (size_t back = 1; back <= 4 && back <= n; back++) {
		unsigned char c = (unsigned char)s[n - back];
		if ((c & 0xC0) == 0x80)
			continue;
		size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 :
			      (c & 0xF8) == 0xF0 ? 4 : 1;
		return need > back ? n - back : n;
	}
	return n;
}

static void stream_write(stream *st, const char *s, size_t n, bool final)
{
	char buf[512];
	size_t total = (size_t)st->n_hold + n;
	char *b = total <= sizeof buf ? buf : malloc(total);
	if (!b)
		cli_die("out of memory");
	memcpy(b, st->hold, (size_t)st->n_hold);
	memcpy(b + st->n_hold, s, n);
	size_t ok = final ? total : utf8_complete(b, total);
	if (ok && fwrite(b, 1, ok, stdout) != ok)
		cli_die("write error: %s", strerror(errno));
	st->n_hold = (int)(total - ok);
	memcpy(st->hold, b + ok, (size_t)st->n_hold);
	if (b != buf)
		free(b);
	if (fflush(stdout) != 0)
		cli_die("write error: %s", strerror(errno));
}

typedef struct out_buf {
	char *s;
	size_t n, cap;
} out_buf;

static void out_add(out_buf *o, const char *s, size_t n)
{
	if (o->n + n + 1 > o->cap) {
		size_t nc = 2 * (o->n + n + 1) + 256;
		char *ns = realloc(o->s, nc);
		if (!ns)
			cli_die("out of memory");
		o->s = ns;
		o->cap = nc;
	}
	memcpy(o->s + o->n, s, n);
	o->n += n;
	o->s[o->n] = 0;
}

/* ---- memory budget and Lookahead Expert Scheduling (--mem ...) ---- */

/* The memory limit of our cgroup (v1 memory controller or v2), 0 when none. */
static uint64_t cgroup_limit(void)
{
	FILE *f = fopen("/proc/self/cgroup", "r");
	if (!f)
		return 0;
	char line[1024], path[1200];
	uint64_t lim = 0;
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
		if (!b)
			continue;
		*b = 0;
		const char *ctrl = a + 1, *cg = b + 1;
		if (strstr(ctrl, "memory"))
			snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", cg);
		else if (!*ctrl)
			snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", cg);
		else
			continue;
		FILE *g = fopen(path, "r");
		unsigned long long v;
		if (g && fscanf(g, "%llu", &v) == 1 && v < (1ull << 60) && (!lim || v < lim))
			lim = v;
		if (g)
			fclose(g);
	}
	fclose(f);
	return lim;
}

static uint64_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

typedef struct les_run {
	mcv_predictor *pred;
	mcv_pred_session *sess; /* a predictor that reads the routing context */
	FILE *trace;
} les_run;

static les_run les_state;
static mcv_replay *replay_state; /* --replay: routing and predictions come from it */

static int les_predict(void *user, int l, int d, const float *h, float *scores)
{
	mcv_error e;
	return mcv_predictor_scores(user, l, d, h, scores, &e);
}

static void les_trace_ids(FILE *f, const char *key, const mcv_les_event *ev, char how)
{
	fprintf(f, ",\"%s\":[", key);
	int n = 0;
	for (int i = 0; i < ev->n_chosen; i++)
		if (!how || ev->how[i] == how)
			fprintf(f, "%s%d", n++ ? "," : "", ev->chosen[i]);
	fputc(']', f);
}

static void les_trace_event(void *user, const mcv_les_event *ev)
{
	FILE *f = user;
	fprintf(f, "{\"pos\":%d,\"n_tokens\":%d,\"layer\":%d", ev->pos, ev->n_tokens, ev->layer);
	les_trace_ids(f, "chosen", ev, 0);
	les_trace_ids(f, "resident", ev, 'r');
	les_trace_ids(f, "prefetched", ev, 'p');
	les_trace_ids(f, "missed", ev, 'm');
	fprintf(f, ",\"stall_us\":%llu}\n", (unsigned long long)ev->stall_us);
}

/* After mcv_ctx_init: the predictor and the trace of a budget run. */
static void les_attach(const run_opts *o, mcv_model *model, mcv_ctx *ctx)
{
	mcv_les *les = mcv_ctx_les(ctx);
	if (!les)
		return;
	mcv_error err;
	const char *name = "router";
	if (replay_state)
		name = mcv_replay_predictor_kind(replay_state);
	else if (o->predictor) {
		if (mcv_predictor_load(&les_state.pred, o->predictor, model, &err) != 0)
			cli_die("%s: %s", o->predictor, err.msg);
		name = o->predictor;
	} else if (mcv_predictor_router(&les_state.pred, model, &err) != 0) {
		cli_die("%s: %s", o->model, err.msg);
	}
	if (!replay_state && mcv_predictor_context(les_state.pred)) {
		/* it needs the routing seen so far: the session observes it */
		if (mcv_pred_session_init(&les_state.sess, les_state.pred, &err) != 0)
			cli_die("%s", err.msg);
		mcv_pred_session_attach(les_state.sess, ctx);
		mcv_les_set_predictor(les, mcv_pred_session_predict, les_state.sess, name);
	} else if (!replay_state) {
		mcv_les_set_predictor(les, les_predict, les_state.pred, name);
	}
	if (!o->les_trace)
		return;
	FILE *f = strcmp(o->les_trace, "-") ? fopen(o->les_trace, "w") : stderr;
	if (!f)
		cli_die("cannot open '%s': %s", o->les_trace, strerror(errno));
	les_state.trace = f;
	mcv_les_stats st;
	mcv_les_stats_get(les, &st);
	const mcv_gguf *g = mcv_model_gguf(model);
	uint32_t ftype = 0;
	mcv_gguf_get_u32(g, "general.file_type", &ftype, &err);
	const uint64_t fsz = file_size(o->model), lim = cgroup_limit();
	const bool pressure = (lim && lim < fsz) || o->les.mem < fsz;
	fprintf(f, "{\"type\":\"mcv.les.trace\",\"model\":");
	cli_json_str(f, o->model, strlen(o->model));
	const mcv_type_traits *xt = mcv_type_get(st.expert_type);
	fprintf(f, ",\"model_bytes\":%llu,\"file_type\":%u,\"expert_type\":\"%s\",\"packed\":%s,\"budget\":%llu,\"cache_slots\":%d,"
		"\"experts\":%d,\"predictor\":",
		(unsigned long long)fsz, ftype, xt ? xt->name : "?", st.packed ? "true" : "false",
		(unsigned long long)o->les.mem, st.n_slots, st.n_experts_total);
	cli_json_str(f, name, strlen(name));
	fprintf(f, ",\"lookahead\":%d,\"prefetch_width\":%d,\"policy\":\"%s\",\"direct\":%s,"
		"\"cgroup_limit\":%llu,\"memory_pressure\":%s}\n",
		st.lookahead, st.prefetch_width, st.policy == MCV_LES_LRU ? "lru" : "lfru",
		st.direct ? "true" : "false", (unsigned long long)lim, pressure ? "true" : "false");
	mcv_les_set_trace(les, les_trace_event, f);
}

static double mib(uint64_t v) { return (double)v / (1024.0 * 1024.0); }

/* The --stats block of a budget run (after the usual stats line). */
static void les_report(const run_opts *o, mcv_ctx *ctx, int decode_tokens)
{
	mcv_les *les = mcv_ctx_les(ctx);
	if (!les || !o->stats)
		return;
	mcv_les_stats s;
	mcv_les_stats_get(les, &s);
	cli_error("les: budget %.1f MiB = non-expert weights %.1f + header %.1f + KV/state/scratch %.1f + "
		  "expert cache %.1f (%d slots of %.2f MiB, %.1f%% of %d experts) + margin %.1f + free %.1f; "
		  "token embedding on disk %.1f MiB",
		  mib(s.budget), mib(s.nonexpert_bytes), mib(s.header_bytes), mib(s.ctx_bytes),
		  mib(s.cache_bytes), s.n_slots, mib(s.slot_bytes), 100.0 * s.n_slots / s.n_experts_total,
		  s.n_experts_total, mib(s.margin_bytes),
		  mib(s.budget - s.nonexpert_bytes - s.header_bytes - s.ctx_bytes - s.cache_bytes - s.margin_bytes),
		  mib(s.embd_bytes));
	cli_error("les: %s file, %s reads, %d %s, non-expert weights %s; policy %s; "
		  "predictor %s, lookahead %d, width %d, min confidence %.2f",
		  s.packed ? "packed" : "plain", s.direct ? "O_DIRECT" : "buffered", s.io_threads,
		  s.aio ? "in flight (kernel AIO)" : "I/O threads", s.locked ? "locked" : "not locked",
		  s.policy == MCV_LES_LRU ? "lru" : "lfru", s.predictor, s.lookahead, s.prefetch_width,
		  s.prefetch_min);
	const double lk = s.lookups ? (double)s.lookups : 1.0;
	cli_error("les: hit rate %.1f%% (%llu resident, %llu in flight, %llu missed of %llu); "
		  "prefetch reads %llu, used %llu, wasted %llu; reads %llu, %.1f MiB, retries %llu",
		  100.0 * (double)(s.hits + s.hits_inflight) / lk, (unsigned long long)s.hits,
		  (unsigned long long)s.hits_inflight, (unsigned long long)s.misses,
		  (unsigned long long)s.lookups, (unsigned long long)s.prefetch_reads,
		  (unsigned long long)s.prefetch_used, (unsigned long long)s.prefetch_wasted,
		  (unsigned long long)s.reads, mib(s.read_bytes), (unsigned long long)s.read_retries);
	if (s.lookahead > 0)
		cli_error("les: prefetch guesses dropped before their read %llu, below the minimum confidence "
			  "%llu, kept out by likelier residents %llu",
			  (unsigned long long)s.prefetch_dropped, (unsigned long long)s.prefetch_low_conf,
			  (unsigned long long)s.prefetch_pressure);
	for (int d = 1; d <= s.lookahead && d <= MCV_LES_MAX_LOOKAHEAD; d++)
		if (s.routed_n[d - 1])
			cli_error("les: prediction %d layer%s ahead: recall %.1f%%, precision %.1f%%", d,
				  d > 1 ? "s" : "", 100.0 * (double)s.pred_hit[d - 1] / (double)s.routed_n[d - 1],
				  s.pred_n[d - 1] ? 100.0 * (double)s.pred_hit[d - 1] / (double)s.pred_n[d - 1] : 0.0);
	const double nt = decode_tokens > 0 ? decode_tokens : 1;
	cli_error("les: decode: %.2f MiB read per token, stall %.1f ms per token; all: %.1f s stalled, "
		  "%llu embedding rows read",
		  mib(s.decode_read_bytes) / nt, 1000.0 * s.decode_stall_s / nt, s.stall_s,
		  (unsigned long long)s.embd_reads);
}

/* The LES counters inside --json's "stats" (budget runs only). */
static void les_json(mcv_ctx *ctx, int decode_tokens)
{
	mcv_les *les = mcv_ctx_les(ctx);
	if (!les)
		return;
	mcv_les_stats s;
	mcv_les_stats_get(les, &s);
	const double lk = s.lookups ? (double)s.lookups : 1.0, nt = decode_tokens > 0 ? decode_tokens : 1;
	printf(",\"les\":{\"budget\":%llu,\"cache_slots\":%d,\"experts\":%d,\"io\":\"%s\","
	       "\"reads_in_flight\":%d,\"lookahead\":%d,\"prefetch_width\":%d,\"prefetch_min\":%.3f,"
	       "\"predictor\":",
	       (unsigned long long)s.budget, s.n_slots, s.n_experts_total,
	       !s.direct ? "buffered" : s.aio ? "aio" : "threads", s.io_threads, s.lookahead,
	       s.prefetch_width, s.prefetch_min);
	cli_json_str(stdout, s.predictor, strlen(s.predictor));
	printf(",\"hit_rate\":%.4f,\"lookups\":%llu,\"misses\":%llu,\"reads\":%llu,\"read_bytes\":%llu,"
	       "\"prefetch_reads\":%llu,\"prefetch_used\":%llu,\"prefetch_wasted\":%llu,"
	       "\"decode_mib_per_token\":%.3f,\"decode_stall_ms_per_token\":%.3f,\"recall\":[",
	       (double)(s.hits + s.hits_inflight) / lk, (unsigned long long)s.lookups,
	       (unsigned long long)s.misses, (unsigned long long)s.reads, (unsigned long long)s.read_bytes,
	       (unsigned long long)s.prefetch_reads, (unsigned long long)s.prefetch_used,
	       (unsigned long long)s.prefetch_wasted, mib(s.decode_read_bytes) / nt,
	       1000.0 * s.decode_stall_s / nt);
	for (int d = 1; d <= s.lookahead && d <= MCV_LES_MAX_LOOKAHEAD; d++)
		printf("%s%.4f", d > 1 ? "," : "",
		       s.routed_n[d - 1] ? (double)s.pred_hit[d - 1] / (double)s.routed_n[d - 1] : 0.0);
	printf("]}");
}

static void les_detach(void)
{
	if (les_state.trace && les_state.trace != stderr && fclose(les_state.trace) != 0)
		cli_die("write error: %s", strerror(errno));
	les_state.trace = NULL;
	mcv_pred_session_free(les_state.sess);
	les_state.sess = NULL;
	mcv_predictor_free(les_state.pred);
	les_state.pred = NULL;
}

/* ---- images, video, batch ---- */

typedef struct runner {
	const run_opts *o;
	mcv_model *model;
	mcv_tokenizer *tok;
	mcv_ctx *ctx;
	mcv_sampler *smp;
	mcv_vision *vis;
	mcv_vision_params vp;
	int n_ctx;
	const char *prompt;
	stream *st;      /* stream the answer to stdout (one prompt, --text) */
	out_buf text;
	int32_t *ids;
	int cap_ids;
} runner;

/* One prompt with n images (frames[i]: image i is a video frame): reset the
 * context, evaluate the template's segments in order, generate.  The
 * answer is in r->text until the next call. */
static int run_prompt(runner *r, const mcv_image *imgs, const bool *frames, int n,
		      batch_result *res, mcv_error *err)
{
	const run_opts *o = r->o;
	mcv_ctx_reset(r->ctx);
	mcv_sampler_reset(r->smp);
	r->text.n = 0;
	mcv_chat chat;
	mcv_chat_init(&chat);
	mcv_chat_params cp = { .system = o->system, .user = r->prompt, .n_images = n,
			       .think = o->think, .raw = o->raw };
	int rc = mcv_chat_build(&chat, &cp, err);
	/* ids only for several still images (the numbering MiniCPM-V's processor
	 * uses and the proving model was trained on; llama.cpp's mtmd emits none,
	 * see lib/multimodal.h);
	 * a single image and video frames use the model's plain layout */
	int n_still = 0;
	for (int i = 0; i < n; i++)
		n_still += !frames[i];
	int pos = mcv_ctx_pos(r->ctx), n_prompt = 0;
	/* the whole prompt is gathered and evaluated in one prefill; a routing
	 * trace records segment by segment, so it evaluates them one by one */
	const bool gather = trace_out == NULL;
	mcv_mm_rows rows;
	mcv_mm_rows_init(&rows, r->ctx, pos);
	for (int s = 0; s < chat.n && !rc; s++) {
		const mcv_chat_segment *g = &chat.seg[s];
		if (g->kind == MCV_SEG_TEXT) {
			int n_ids = 0;
			if ((rc = mcv_tokenizer_encode(r->tok, g->text, g->len, true, &r->ids, &n_ids,
						       &r->cap_ids, err)))
				break;
			if (n_ids == 0)
				continue;
			if (mcv_ctx_pos(r->ctx) + rows.n + n_ids >= r->n_ctx) {
				rc = mcv_error_set(err, MCV_EBUDGET,
						   "the prompt needs more than the context of %d tokens (use --ctx)",
						   r->n_ctx);
				break;
			}
			for (int i = 0; i < n_ids; i++)
				mcv_sampler_accept(r->smp, r->ids[i]);
			trace_rec_tokens(trace_out, r->ids, n_ids);
			if (gather)
				rc = mcv_mm_rows_text(&rows, r->ctx, r->ids, n_ids, err);
			else
				rc = mcv_mm_eval_text(r->ctx, r->ids, n_ids, &pos, err);
			n_prompt += n_ids;
		} else {
			int k = g->image, id = -1, nt = 0;
			mcv_vision_params vp = r->vp;
			if (frames[k]) {
				vp.no_slices = 1; /* frames: overview only, as MiniCPM-V does for video */
			} else if (n_still > 1) {
				id = 0;
				for (int i = 0; i < k; i++)
					id += !frames[i];
			}
			if (gather) {
				mcv_mm_block b;
				rc = mcv_vision_check_text(r->vis, mcv_model_n_embd(r->model), err);
				if (!rc && !(rc = mcv_mm_build_image(&b, r->tok, r->vis, &imgs[k], &vp, id, rows.pos, err))) {
					rc = mcv_mm_rows_block(&rows, r->ctx, &b, err);
					nt = b.n;
					mcv_mm_block_free(&b);
				}
			} else {
				rc = trace_rec_eval_image(trace_out, r->ctx, r->tok, r->vis, &imgs[k], &vp, id, &pos, &nt,
							  err);
			}
			n_prompt += nt;
		}
	}
	if (!rc)
		rc = mcv_mm_rows_eval(r->ctx, &rows, &pos, err);
	mcv_mm_rows_free(&rows);
	mcv_chat_free(&chat);
	if (rc)
		return rc;

	int n_gen = 0;
	char piece[256];
	while (o->n_predict < 0 || n_gen < o->n_predict) {
		if (mcv_ctx_pos(r->ctx) >= r->n_ctx)
			break;
		int32_t t = mcv_sampler_sample(r->smp, mcv_ctx_logits(r->ctx));
		if (mcv_tokenizer_is_eog(r->tok, t) && !o->ignore_eos)
			break;
		n_gen++;
		mcv_sampler_accept(r->smp, t);
		int k = mcv_tokenizer_piece(r->tok, t, true, piece, sizeof piece);
		char *big = NULL;
		if (k > (int)sizeof piece) {
			if (!(big = malloc((size_t)k)))
				return mcv_error_set(err, MCV_ENOMEM, "out of memory");
			mcv_tokenizer_piece(r->tok, t, true, big, (size_t)k);
		}
		if (k > 0) {
			out_add(&r->text, big ? big : piece, (size_t)k);
			if (r->st)
				stream_write(r->st, big ? big : piece, (size_t)k, false);
		}
		free(big);
		if (o->n_predict >= 0 && n_gen >= o->n_predict)
			break;
		trace_rec_tokens(trace_out, &t, 1);
		if ((rc = mcv_mm_eval_text(r->ctx, &t, 1, &pos, err)))
			return rc;
	}
	res->text = r->text.s ? r->text.s : "";
	res->len = r->text.n;
	res->prompt_tokens = n_prompt;
	res->tokens = n_gen;
	return 0;
}

static int batch_image(void *ud, const mcv_image *im, batch_result *res, mcv_error *err)
{
	bool frame = false;
	return run_prompt(ud, im, &frame, 1, res, err);
}

/* The vision file: --mmproj, else the default next to the default model,
 * else X-mmproj.gguf next to a model named X-text.gguf. */
static const char *find_mmproj(const run_opts *o, bool model_given, char *buf, size_t cap)
{
	if (o->mmproj)
		return o->mmproj;
	if (!model_given) {
		const char *p = default_file(DEFAULT_MMPROJ, buf, cap);
		if (!p)
			cli_die("no --mmproj given and the default %s is not installed", DEFAULT_MMPROJ);
		return p;
	}
	size_t n = strlen(o->model);
	const char *suf = "-text.gguf";
	size_t ns = strlen(suf);
	if (n > ns && !strcmp(o->model + n - ns, suf) && n - ns + 12 < cap) {
		snprintf(buf, cap, "%.*s-mmproj.gguf", (int)(n - ns), o->model);
		struct stat st;
		if (stat(buf, &st) == 0)
			return buf;
		cli_die("no --mmproj given and '%s' does not exist", buf);
	}
	cli_usage_error("give the vision file with --mmproj FILE");
}

static int run_media(run_opts *o)
{
	bool batch = o->n_src > 0;
	bool jsonl = batch ? !o->text : (o->jsonl || o->json);
	char *prompt = NULL;
	size_t prompt_len = 0;
	if (o->prompt) {
		prompt = strdup(o->prompt);
		prompt_len = strlen(prompt);
	} else {
		prompt = cli_read_file(o->file ? o->file : "-", &prompt_len);
	}
	if (!prompt || prompt_len == 0)
		cli_usage_error("empty prompt: give -p TEXT or -f FILE");

	bool model_given = o->model != NULL;
	char defpath[PATH_MAX + 64], mmpath[PATH_MAX + 64];
	if (!o->model) {
		o->model = default_file(DEFAULT_MODEL, defpath, sizeof defpath);
		if (!o->model)
			cli_die("no model given (-m) and the default model %s is not installed "
				"(looked in $MCV_DATADIR/models, ../examples/models next to the binary, %s/models)",
				DEFAULT_MODEL, MCV_DATADIR);
	}
	const char *mmproj = find_mmproj(o, model_given, mmpath, sizeof mmpath);
#ifdef _OPENMP
	if (o->threads > 0)
		omp_set_num_threads(o->threads);
#endif
	double t_start = cli_now();
	mcv_error err = { 0 };
	runner r = { .o = o, .prompt = prompt };
	mcv_model_params mp = mcv_model_default_params();
	mp.n_threads = o->threads;
	mp.les = &o->les;
	if (mcv_model_load(&r.model, o->model, &mp, &err) != 0)
		cli_die("%s", err.msg);
	if (mcv_tokenizer_load(&r.tok, mcv_model_gguf(r.model), &err) != 0)
		cli_die("%s: %s", o->model, err.msg);
	int n_vocab = mcv_model_n_vocab(r.model);
	if (mcv_tokenizer_n_vocab(r.tok) > n_vocab)
		cli_die("%s: the tokenizer has %d tokens but the embedding only %d rows", o->model,
			mcv_tokenizer_n_vocab(r.tok), n_vocab);
	if (mcv_vision_load(&r.vis, mmproj, &err) != 0)
		cli_die("%s", err.msg);
	if (mcv_vision_check_text(r.vis, mcv_model_n_embd(r.model), &err) != 0)
		cli_die("%s: %s", mmproj, err.msg);
	r.vp = mcv_vision_default_params();
	r.vp.compress = o->compress;
	r.vp.max_slices = o->max_slices;
	r.vp.upscale = o->upscale;
	mcv_ctx_params xp = mcv_ctx_default_params();
	xp.n_ctx = o->n_ctx;
	if (mcv_ctx_init(&r.ctx, r.model, &xp, &err) != 0)
		cli_die("%s", err.msg);
	if (o->trace_routing && trace_rec_open(&trace_out, o->trace_routing, r.model, r.ctx, &err))
		cli_die("%s", err.msg);
	les_attach(o, r.model, r.ctx); /* after the trace: its route hook is chained */
	r.n_ctx = o->n_ctx;
	if (r.n_ctx == 0) {
		int tr = mcv_model_n_ctx_train(r.model);
		r.n_ctx = tr > 0 && tr < 4096 ? tr : 4096;
	}
	if (mcv_sampler_init(&r.smp, &o->sp, n_vocab, &err) != 0)
		cli_usage_error("%s", err.msg);
	double t_load = cli_now();
	if (o->verbose >= 2)
		cli_error("%s + %s: %s, %d layers, seed %llu", o->model, mmproj, mcv_model_arch(r.model),
			  mcv_model_n_layer(r.model), (unsigned long long)o->sp.seed);

	batch_cfg cfg = { .src = o->src, .n_src = o->n_src, .nul_sep = o->nul_sep,
			  .format = jsonl ? BATCH_JSONL : BATCH_TEXT, .prompt = prompt,
			  .lim = o->lim, .out = stdout, .progress = o->verbose >= 1 };
	int status = 0;
	if (batch) {
		batch_stats bs;
		if (batch_run(&cfg, batch_image, &r, &bs) != 0)
			cli_die("write error: %s", strerror(errno));
		if (o->stats)
			cli_error("stats: %d inputs, %d failed; load %.2f s; %.2f s, %.2f images/s; "
				  "%ld prompt tokens, %ld generated; peak RSS %.0f MiB",
				  bs.n_done, bs.n_failed, t_load - t_start, bs.seconds,
				  bs.seconds > 0 ? bs.n_done / bs.seconds : 0.0, bs.prompt_tokens,
				  bs.tokens, (double)cli_peak_rss() / (1024.0 * 1024.0));
		if (o->stats)
			les_report(o, r.ctx, (int)bs.tokens);
		else if (o->verbose >= 1 && !isatty(2))
			cli_error("%d inputs, %d failed, %.1f s", bs.n_done, bs.n_failed, bs.seconds);
		status = bs.n_failed ? CLI_EXIT_ERROR : CLI_EXIT_OK;
	} else {
		/* one prompt: decode every image and frame first, in order */
		int n = 0, cap = 0;
		mcv_image *imgs = NULL;
		bool *frames = NULL;
		const char *bad = NULL;
		for (int i = 0; i < o->n_media && !bad; i++) {
			const media_arg *a = &o->media[i];
			mcv_video v = { 0 };
			int add = 1;
			if (a->kind == MEDIA_VIDEO) {
				mcv_video_opts vo = { .n_frames = o->fps > 0 ? 0 : (o->frames ? o->frames : 8),
						      .fps = o->fps };
				if (mcv_video_decode(a->path, &vo, &o->lim, &v, &err) != 0) {
					bad = a->path;
					break;
				}
				add = v.n;
			}
			if (n + add > cap) {
				cap = 2 * (n + add);
				imgs = realloc(imgs, (size_t)cap * sizeof *imgs);
				frames = realloc(frames, (size_t)cap * sizeof *frames);
				if (!imgs || !frames)
					cli_die("out of memory");
			}
			if (a->kind == MEDIA_VIDEO) {
				for (int k = 0; k < v.n; k++) {
					imgs[n] = v.frames[k];
					v.frames[k] = (mcv_image){ 0 };
					frames[n++] = true;
				}
				mcv_video_free(&v);
			} else if (mcv_image_load(a->path, &o->lim, &imgs[n], &err) != 0) {
				bad = a->path;
			} else {
				frames[n++] = false;
			}
		}
		double t0 = cli_now();
		batch_result res = { 0 };
		stream st = { .n_hold = 0 };
		r.st = jsonl ? NULL : &st;
		if (!bad && run_prompt(&r, imgs, frames, n, &res, &err) != 0)
			bad = o->media[0].path;
		if (bad) {
			if (jsonl)
				batch_print_error(&cfg, bad, NULL, err.msg);
			else
				cli_error("%s: %s", bad, err.msg);
			status = CLI_EXIT_ERROR;
		} else if (jsonl) {
			batch_print_ok(&cfg, o->media[0].path, NULL, &res, 1000.0 * (cli_now() - t0));
		} else {
			stream_write(&st, "", 0, true);
			if (r.text.n && r.text.s[r.text.n - 1] != '\n' && isatty(1))
				putchar('\n');
		}
		if (fflush(stdout) != 0 || ferror(stdout))
			cli_die("write error: %s", strerror(errno));
		if (o->stats && !bad) {
			double s = cli_now() - t0;
			cli_error("stats: load %.2f s; %d images; prompt %d tokens; %d generated; %.2f s; "
				  "peak RSS %.0f MiB", t_load - t_start, n, res.prompt_tokens, res.tokens, s,
				  (double)cli_peak_rss() / (1024.0 * 1024.0));
			les_report(o, r.ctx, res.tokens);
		}
		for (int i = 0; i < n; i++)
			mcv_image_free(&imgs[i]);
		free(imgs);
		free(frames);
	}
	if (trace_rec_finish(trace_out, &err))
		cli_error("%s", err.msg), status = 1;
	free(r.text.s);
	free(r.ids);
	free(prompt);
	mcv_sampler_free(r.smp);
	les_detach();
	mcv_ctx_free(r.ctx);
	mcv_vision_free(r.vis);
	mcv_tokenizer_free(r.tok);
	mcv_model_free(r.model);
	free(o->src);
	return status;
}

/* --replay: token 0 as a one-token prompt, then one decode step per further
 * trace token; the route override replaces every routing decision. */
static int run_replay(const run_opts *o)
{
	double t_start = cli_now();
	mcv_error err = { 0 };
	mcv_model *model = NULL;
	mcv_model_params mp = mcv_model_default_params();
	mp.n_threads = o->threads;
	mp.les = &o->les;
	if (mcv_model_load(&model, o->model, &mp, &err) != 0)
		cli_die("%s", err.msg);
	if (mcv_replay_open(&replay_state, o->replay, model, 0, &err) != 0)
		cli_die("%s", err.msg);
	if (o->replay_model &&
	    mcv_replay_set_proving(replay_state, o->replay_model, o->predictor, &err) != 0)
		cli_die("%s", err.msg);
	int n = (int)mcv_replay_n_tokens(replay_state);
	if (o->n_predict >= 0 && n > o->n_predict + 1) /* -n N: N decode steps at most */
		n = o->n_predict + 1;
	mcv_ctx_params xp = mcv_ctx_default_params();
	xp.n_ctx = o->n_ctx > 0 ? o->n_ctx : n + 1;
	if (n > xp.n_ctx)
		n = xp.n_ctx;
	mcv_ctx *ctx = NULL;
	if (mcv_ctx_init(&ctx, model, &xp, &err) != 0)
		cli_die("%s", err.msg);
	mcv_replay_attach(replay_state, ctx);
	les_attach(o, model, ctx);
	if (o->trace_routing && trace_rec_open(&trace_out, o->trace_routing, model, ctx, &err))
		cli_die("%s", err.msg);
	if (o->verbose >= 2)
		cli_error("%s: replaying %d tokens of %s, predictor %s", o->model, n, o->replay,
			  mcv_replay_predictor_kind(replay_state));
	const int32_t tok = 0;
	double t_load = cli_now(), t_prompt = 0;
	for (int i = 0; i < n; i++) {
		mcv_replay_set_token(replay_state, i);
		trace_rec_tokens(trace_out, &tok, 1);
		if (mcv_ctx_eval(ctx, &tok, 1, &err) != 0)
			cli_die("%s", err.msg);
		if (mcv_replay_status(replay_state, &err))
			cli_die("%s", err.msg);
		if (i == 0)
			t_prompt = cli_now();
	}
	double t_end = cli_now();
	const int n_step = n - 1;
	double pp_s = t_prompt - t_load, tg_s = t_end - t_prompt;
	if (o->stats)
		cli_error("stats: load %.2f s; prompt %d tokens %.2f s %.1f tok/s; first token %.3f s; "
			  "decode %d tokens %.2f s %.1f tok/s; stop replay; peak RSS %.0f MiB",
			  t_load - t_start, 1, pp_s, pp_s > 0 ? 1 / pp_s : 0, pp_s, n_step, tg_s,
			  tg_s > 0 && n_step > 0 ? n_step / tg_s : 0,
			  (double)cli_peak_rss() / (1024.0 * 1024.0));
	les_report(o, ctx, n_step);
	les_detach();
	if (trace_rec_finish(trace_out, &err))
		cli_die("%s", err.msg);
	mcv_replay_free(replay_state);
	replay_state = NULL;
	mcv_ctx_free(ctx);
	mcv_model_free(model);
	return 0;
}

/* Under --mem the model thread waits for expert reads, and spinning OpenMP
 * workers then hold a core that the reader threads need: passive waiting
 * was faster in every paired benchmark and halved the CPU time (README,
 * "Why the plain LES runs sit below 85%").  libgomp reads OMP_WAIT_POLICY
 * once when it loads, so the policy is set by running this binary again
 * with it; a policy the user set is kept.  If the exec fails the run goes
 * on with the default policy. */
static void passive_omp_for_budget(const run_opts *o, char **argv)
{
	const char *set = getenv("OMP_WAIT_POLICY");
	if (!o->les.mem || set) {
		if (o->les.mem && o->verbose >= 2)
			cli_error("OpenMP wait policy: %s", set);
		return;
	}
	if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0)
		return;
	execv("/proc/self/exe", argv);
	if (o->verbose >= 2)
		cli_error("cannot run again with passive OpenMP waiting (%s); going on", strerror(errno));
}

int main(int argc, char **argv)
{
	cli_init("mcv-run");
	run_opts o = { .n_predict = 256, .verbose = 1, .sp = mcv_sampler_default_params(),
		       .les = mcv_les_default_params() };
	parse_args(&o, argc, argv);
	passive_omp_for_budget(&o, argv);
	if (!o.seed_set)
		o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	if (o.n_media || o.n_src)
		return run_media(&o);
	if (o.replay)
		return run_replay(&o);

	/* prompt first: usage problems are reported before a long load */
	char *prompt = NULL;
	size_t prompt_len = 0;
	int32_t *ids = NULL;
	int n_ids = 0, cap_ids = 0;
	if (o.tokens) {
		ids = parse_tokens(o.tokens, &n_ids);
		cap_ids = n_ids;
	} else if (o.prompt) {
		prompt = strdup(o.prompt);
		prompt_len = strlen(prompt);
	} else {
		prompt = cli_read_file(o.file ? o.file : "-", &prompt_len);
	}
	if (!o.tokens && prompt_len == 0)
		cli_usage_error("empty prompt: give -p TEXT, -f FILE or text on standard input");

	char defpath[PATH_MAX + 64];
	if (!o.model) {
		o.model = default_file(DEFAULT_MODEL, defpath, sizeof defpath);
		if (!o.model)
			cli_die("no model given (-m) and the default model %s is not installed "
				"(looked in $MCV_DATADIR/models, ../examples/models next to the binary, %s/models)",
				DEFAULT_MODEL, MCV_DATADIR);
	}
#ifdef _OPENMP
	if (o.threads > 0)
		omp_set_num_threads(o.threads);
#endif

	double t_start = cli_now();
	mcv_error err = { 0 };
	mcv_model *model = NULL;
	mcv_model_params mp = mcv_model_default_params();
	mp.n_threads = o.threads;
	mp.les = &o.les;
	if (mcv_model_load(&model, o.model, &mp, &err) != 0)
		cli_die("%s", err.msg);
	mcv_tokenizer *tok = NULL;
	if (mcv_tokenizer_load(&tok, mcv_model_gguf(model), &err) != 0)
		cli_die("%s: %s", o.model, err.msg);
	int n_vocab = mcv_model_n_vocab(model);
	if (mcv_tokenizer_n_vocab(tok) > n_vocab)
		cli_die("%s: the tokenizer has %d tokens but the embedding only %d rows", o.model,
			mcv_tokenizer_n_vocab(tok), n_vocab);

	if (!o.tokens) {
		mcv_chat chat;
		mcv_chat_init(&chat);
		mcv_chat_params cp = { .system = o.system, .user = prompt, .think = o.think, .raw = o.raw };
		if (mcv_chat_build(&chat, &cp, &err) || mcv_chat_tokenize(&chat, tok, &ids, &n_ids, &cap_ids, &err))
			cli_die("%s", err.msg);
		mcv_chat_free(&chat);
	} else {
		for (int i = 0; i < n_ids; i++)
			if (ids[i] >= n_vocab)
				cli_die("--tokens: id %d is not below the vocabulary size %d", ids[i], n_vocab);
	}
	if (n_ids == 0)
		cli_die("the prompt has no tokens");

	mcv_ctx_params xp = mcv_ctx_default_params();
	xp.n_ctx = o.n_ctx;
	mcv_ctx *ctx = NULL;
	if (mcv_ctx_init(&ctx, model, &xp, &err) != 0)
		cli_die("%s", err.msg);
	if (o.trace_routing && trace_rec_open(&trace_out, o.trace_routing, model, ctx, &err))
		cli_die("%s", err.msg);
	les_attach(&o, model, ctx); /* after the trace: its route hook is chained */
	int n_ctx = o.n_ctx > 0 ? o.n_ctx : 0;
	if (n_ctx == 0) {
		int tr = mcv_model_n_ctx_train(model);
		n_ctx = tr > 0 && tr < 4096 ? tr : 4096;
	}
	if (n_ids >= n_ctx)
		cli_die("the prompt has %d tokens, more than the context of %d (use --ctx)", n_ids, n_ctx);
	mcv_sampler *smp = NULL;
	if (mcv_sampler_init(&smp, &o.sp, n_vocab, &err) != 0)
		cli_usage_error("%s", err.msg);
	for (int i = 0; i < n_ids; i++)
		mcv_sampler_accept(smp, ids[i]);
	if (o.verbose >= 2)
		cli_error("%s: %s, %d layers, vocabulary %d, prompt %d tokens, seed %llu",
			  o.model, mcv_model_arch(model), mcv_model_n_layer(model), n_vocab, n_ids,
			  (unsigned long long)o.sp.seed);

	double t_load = cli_now();
	trace_rec_tokens(trace_out, ids, n_ids);
	if (mcv_ctx_eval(ctx, ids, n_ids, &err) != 0)
		cli_die("%s", err.msg);
	double t_prompt = cli_now(), t_first = 0;

	int n_gen = 0, n_step = 0, gcap = 64;
	int32_t *gen = malloc((size_t)gcap * sizeof *gen);
	out_buf text = { 0 };
	stream st = { .n_hold = 0 };
	const char *stop = "length";
	char piece[256];
	while (o.n_predict < 0 || n_gen < o.n_predict) {
		if (n_ids + n_gen >= n_ctx) {
			stop = "context";
			break;
		}
		int32_t t = mcv_sampler_sample(smp, mcv_ctx_logits(ctx));
		if (n_gen == 0)
			t_first = cli_now();
		if (mcv_tokenizer_is_eog(tok, t) && !o.ignore_eos) {
			stop = "eos";
			break;
		}
		if (n_gen == gcap && !(gen = realloc(gen, (size_t)(gcap *= 2) * sizeof *gen)))
			cli_die("out of memory");
		gen[n_gen++] = t;
		mcv_sampler_accept(smp, t);
		/* control tokens show as their text: end-of-turn ones never get
		 * here, and hiding the others would hide what the model did */
		int k = mcv_tokenizer_piece(tok, t, true, piece, sizeof piece);
		char *big = NULL;
		if (k > (int)sizeof piece) {
			big = malloc((size_t)k);
			if (!big)
				cli_die("out of memory");
			mcv_tokenizer_piece(tok, t, true, big, (size_t)k);
		}
		if (k > 0) {
			out_add(&text, big ? big : piece, (size_t)k);
			if (!o.json)
				stream_write(&st, big ? big : piece, (size_t)k, false);
		}
		free(big);
		if (o.n_predict >= 0 && n_gen >= o.n_predict)
			break;
		trace_rec_tokens(trace_out, &t, 1);
		if (mcv_ctx_eval(ctx, &t, 1, &err) != 0)
			cli_die("%s", err.msg);
		n_step++;
	}
	double t_end = cli_now();
	if (!o.json) {
		stream_write(&st, "", 0, true);
		if (text.n && text.s[text.n - 1] != '\n' && isatty(1))
			putchar('\n');
	}
	double pp_s = t_prompt - t_load, tg_s = t_end - (t_first ? t_first : t_end);
	double pp_tps = pp_s > 0 ? n_ids / pp_s : 0;
	/* decode speed: single-token evaluations between the first sample and the end */
	double tg_tps = tg_s > 0 && n_step > 0 ? n_step / tg_s : 0;
	double ttft = (t_first ? t_first : t_end) - t_load;
	double rss_mib = (double)cli_peak_rss() / (1024.0 * 1024.0);
	if (o.json) {
		printf("{\"model\":");
		cli_json_str(stdout, o.model, strlen(o.model));
		printf(",\"prompt\":");
		if (prompt)
			cli_json_str(stdout, prompt, prompt_len);
		else
			printf("null");
		printf(",\"text\":");
		cli_json_str(stdout, text.s ? text.s : "", text.n);
		printf(",\"tokens\":[");
		for (int i = 0; i < n_gen; i++)
			printf("%s%d", i ? "," : "", gen[i]);
		printf("],\"prompt_tokens\":[");
		for (int i = 0; i < n_ids; i++)
			printf("%s%d", i ? "," : "", ids[i]);
		printf("],\"stop\":\"%s\",\"seed\":%llu,\"stats\":{\"load_s\":%.3f,\"prompt_n\":%d,"
		       "\"prompt_s\":%.3f,\"prompt_tps\":%.2f,\"decode_n\":%d,\"decode_s\":%.3f,"
		       "\"decode_tps\":%.2f,\"ttft_s\":%.3f,\"peak_rss_mib\":%.1f",
		       stop, (unsigned long long)o.sp.seed, t_load - t_start, n_ids, pp_s, pp_tps,
		       n_gen, tg_s, tg_tps, ttft, rss_mib);
		les_json(ctx, n_step);
		printf("}}\n");
		if (fflush(stdout) != 0)
			cli_die("write error: %s", strerror(errno));
	}
	if (o.stats)
		cli_error("stats: load %.2f s; prompt %d tokens %.2f s %.1f tok/s; first token %.3f s; "
			  "decode %d tokens %.2f s %.1f tok/s; stop %s; peak RSS %.0f MiB",
			  t_load - t_start, n_ids, pp_s, pp_tps, ttft, n_gen, tg_s, tg_tps, stop, rss_mib);
	les_report(&o, ctx, n_step);
	les_detach();
	if (trace_rec_finish(trace_out, &err))
		cli_die("%s", err.msg);
	free(gen);
	free(text.s);
	free(ids);
	free(prompt);
	mcv_sampler_free(smp);
	mcv_ctx_free(ctx);
	mcv_tokenizer_free(tok);
	mcv_model_free(model);
	return 0;
}

/* mcv-pack: rewrite a qwen35moe GGUF so each (layer, expert) is one
 * contiguous 4 KiB-aligned extent, optionally ordered by co-selection from a
 * routing trace; or print a file's expert layout (--info). */
#include "cli.h"
#include "gguf.h"
#include "mcv.h"
#include "pack.h"
#include "quant.h"
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { O_ORDER = 1, O_INFO, O_CHECK, O_VERBOSE, O_QUIET, O_HELP, O_VERSION };

static const cli_option options[] = {
	{ "order", 0, CLI_ARG, O_ORDER },
	{ "info", 0, CLI_NO_ARG, O_INFO },
	{ "check", 0, CLI_NO_ARG, O_CHECK },
	{ "verbose", 'v', CLI_NO_ARG, O_VERBOSE },
	{ "quiet", 'q', CLI_NO_ARG, O_QUIET },
	{ "help", 'h', CLI_NO_ARG, O_HELP },
	{ "version", 0, CLI_NO_ARG, O_VERSION },
	{ NULL, 0, 0, 0 },
};

static void usage(void)
{
	printf("usage: mcv-pack [options] INPUT OUTPUT\n"
	       "       mcv-pack --info FILE\n"
	       "Rewrite a qwen35moe GGUF so that each expert's gate, up and down weights\n"
	       "are one contiguous extent on a 4 KiB boundary (one read per expert).\n"
	       "INPUT or OUTPUT '-' is standard input or output.\n"
	       "  --order TRACE  place often co-selected experts next to each other,\n"
	       "                 from a routing trace (mcv-run --trace-routing)\n"
	       "  --check        reread OUTPUT and compare every tensor with INPUT\n"
	       "  --info         print the expert layout of FILE (plain or packed)\n"
	       "  -v, --verbose  per-layer ordering figures\n"
	       "  -q, --quiet    no summary\n"
	       "  -h, --help     this text\n"
	       "      --version  print the version\n");
}

static const char *type_name(int t)
{
	const mcv_type_traits *tt = mcv_type_get(t);
	return tt ? tt->name : "?";
}

static void print_slice(const char *what, const mcv_expert_slice *s)
{
	printf(" %s=%s[%" PRId64 "x%" PRId64 "]@%" PRIu64 "+%" PRIu64, what, type_name(s->type),
	       s->cols, s->rows, s->offset, s->bytes);
}

static int info(const char *path)
{
	mcv_gguf *g;
	mcv_layout *l;
	mcv_error err = { 0 };
	if (mcv_gguf_open(&g, path, &err))
		cli_die("%s", err.msg);
	if (mcv_layout_open(&l, g, &err)) {
		mcv_gguf_close(g);
		cli_die("%s: %s", path, err.msg);
	}
	int L = mcv_layout_n_layer(l), E = mcv_layout_n_expert(l);
	printf("file: %s\n", path);
	printf("packed: %s\n", mcv_layout_packed(l) ? "yes" : "no");
	printf("alignment: %u\n", mcv_gguf_alignment(g));
	printf("architecture: %s\n", mcv_layout_arch(l));
	printf("layers: %d\nexperts: %d\nexperts_used: %d\nhidden: %" PRId64 "\nexpert_ffn: %" PRId64 "\n",
	       L, E, mcv_layout_n_expert_used(l), mcv_layout_n_embd(l), mcv_layout_n_ff(l));
	printf("gate_up_fused: %s\n", mcv_layout_fused(l) ? "yes" : "no");
	printf("fingerprint: %016" PRIx64 "\n", mcv_layout_fingerprint(l));
	uint64_t ro, rb;
	bool region = mcv_layout_nonexpert_region(l, &ro, &rb);
	printf("non_expert: %" PRId64 " tensors, %" PRIu64 " bytes, ", mcv_layout_n_nonexpert(l),
	       mcv_layout_nonexpert_bytes(l));
	if (region)
		printf("one region at %" PRIu64 "+%" PRIu64 "\n", ro, rb);
	else
		printf("interleaved with the experts\n");
	uint64_t all = 0;
	int n_cont = 0, n_al = 0;
	for (int il = 0; il < L; il++) {
		int c = 0, a = 0;
		for (int e = 0; e < E; e++) {
			const mcv_expert_extent *x = mcv_layout_expert(l, il, e);
			c += x->contiguous;
			a += x->aligned;
		}
		n_cont += c;
		n_al += a;
		all += mcv_layout_layer_bytes(l, il);
		printf("layer %d: %" PRIu64 " bytes, contiguous %d/%d, aligned %d/%d, order", il,
		       mcv_layout_layer_bytes(l, il), c, E, a, E);
		const int *o = mcv_layout_order(l, il);
		for (int p = 0; p < E; p++)
			printf(" %d", o[p]);
		printf("\n");
		for (int q = 0; q < E; q++) {
			int e = o[q];
			const mcv_expert_extent *x = mcv_layout_expert(l, il, e);
			printf("  expert %d.%d: ", il, e);
			if (x->contiguous)
				printf("extent %" PRIu64 "+%" PRIu64 " read %" PRIu64 "+%" PRIu64 " contiguous %s",
				       x->offset, x->bytes, x->read_offset, x->read_bytes,
				       x->aligned ? "aligned" : "unaligned");
			else
				printf("scattered");
			print_slice("gate", &x->s[0]);
			print_slice("up", &x->s[1]);
			print_slice("down", &x->s[2]);
			printf("\n");
		}
	}
	printf("total: %" PRIu64 " expert bytes, contiguous %d/%d, aligned %d/%d\n", all, n_cont,
	       L * E, n_al, L * E);
	mcv_layout_free(l);
	mcv_gguf_close(g);
	if (fflush(stdout) != 0 || ferror(stdout))
		cli_die("write error: %s", strerror(errno));
	return 0;
}

static volatile int stop;
static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* Standard input copied to an unlinked scratch file so it can be mapped;
 * unlinked at once, so an interrupted copy leaves nothing behind. */
static mcv_gguf *open_stdin(const char *out)
{
	char tmpl[PATH_MAX];
	const char *slash = strcmp(out, "-") ? strrchr(out, '/') : NULL;
	const char *td = getenv("TMPDIR");
	if (strcmp(out, "-") == 0)
		snprintf(tmpl, sizeof tmpl, "%s/mcv-pack-in.XXXXXX", td && *td ? td : "/tmp");
	else if (slash)
		snprintf(tmpl, sizeof tmpl, "%.*s/.mcv-pack-in.XXXXXX", (int)(slash - out), out);
	else
		snprintf(tmpl, sizeof tmpl, ".mcv-pack-in.XXXXXX");
	int fd = mkstemp(tmpl);
	if (fd < 0)
		cli_die("cannot create a scratch file for standard input: %s", strerror(errno));
	unlink(tmpl);
	static char buf[1 << 20];
	ssize_t n;
	while ((n = read(0, buf, sizeof buf)) != 0) {
		if (stop)
			cli_die("interrupted");
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			cli_die("reading standard input: %s", strerror(errno));
		for (ssize_t d = 0; d < n;) {
			ssize_t m = write(fd, buf + d, (size_t)(n - d));
			if (m < 0 && errno == EINTR)
				continue;
			if (m <= 0)
				cli_die("writing a scratch file beside %s: %s", out, strerror(errno));
			d += m;
		}
	}
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
	mcv_gguf *g;
	mcv_error err = { 0 };
	int rc = mcv_gguf_open(&g, proc, &err);
	close(fd); /* the reader holds its own descriptor and mapping */
	if (rc) {
		/* the message names /proc/self/fd/N: say "standard input" */
		const char *m = strncmp(err.msg, proc, strlen(proc)) == 0 ? err.msg + strlen(proc) : err.msg;
		cli_die("standard input%s%s", *m == ':' ? "" : ": ", m);
	}
	return g;
}

/* Builds the order from a trace; prints the mean distance before/after. */
static int *order_from_trace(const char *tpath, const mcv_layout *l, const mcv_gguf *g,
			     int verbose, int quiet)
{
	mcv_trace *t;
	mcv_error err = { 0 };
	if (mcv_trace_open(&t, tpath, &err))
		cli_die("%s", err.msg);
	if (mcv_trace_check_model(t, g, &err))
		cli_die("%s: %s", tpath, err.msg);
	int L = mcv_layout_n_layer(l), E = mcv_layout_n_expert(l);
	int k = mcv_trace_model_of(t)->n_expert_used;
	int *order = malloc((size_t)L * E * sizeof *order);
	if (!order)
		cli_die("out of memory");
	double sb = 0, sa = 0;
	int64_t N = mcv_trace_n_tokens(t);
	for (int il = 0; il < L; il++) {
		mcv_cosel c;
		if (mcv_cosel_init(&c, E))
			cli_die("out of memory");
		for (int64_t tok = 0; tok < N; tok++)
			mcv_cosel_add(&c, mcv_trace_experts(t, tok, il), k);
		int *o = order + (size_t)il * E;
		mcv_order_chain(&c, k, o);
		double b = mcv_order_mean_distance(&c, mcv_layout_order(l, il));
		double a = mcv_order_mean_distance(&c, o);
		sb += b;
		sa += a;
		if (verbose)
			fprintf(stderr, "mcv-pack: layer %d: mean distance between co-selected experts %.3f -> %.3f\n",
				il, b, a);
		mcv_cosel_free(&c);
	}
	if (!quiet)
		fprintf(stderr, "mcv-pack: --order: %" PRId64 " tokens; mean distance between co-selected "
			"experts %.3f -> %.3f\n", N, sb / L, sa / L);
	mcv_trace_close(t);
	return order;
}

static void progress(void *user, uint64_t done, uint64_t total)
{
	(void)user;
	cli_progress("packing", done, total);
}

int main(int argc, char **argv)
{
	cli_init("mcv-pack");
	const char *order_path = NULL, *pos[3] = { 0 };
	int n_pos = 0, do_info = 0, check = 0, verbose = 0, quiet = 0, id;
	const char *arg;
	cli_parser p;
	cli_parser_init(&p, argc, argv);
	while ((id = cli_next(&p, options, &arg)) != 0) {
		switch (id) {
		case -1:
			if (n_pos >= 2)
				cli_usage_error("unexpected argument '%.64s'", arg);
			pos[n_pos++] = arg;
			break;
		case O_ORDER: order_path = arg; break;
		case O_INFO: do_info = 1; break;
		case O_CHECK: check = 1; break;
		case O_VERBOSE: verbose = 1; break;
		case O_QUIET: quiet = 1; break;
		case O_HELP: usage(); return 0;
		case O_VERSION: cli_print_version(); return 0;
		}
	}
	if (do_info) {
		if (n_pos != 1)
			cli_usage_error("--info takes one FILE");
		if (order_path || check)
			cli_usage_error("--info does not go with --order or --check");
		return info(pos[0]);
	}
	if (n_pos != 2)
		cli_usage_error("expected INPUT and OUTPUT");
	const char *in = pos[0], *out = pos[1];
	if (strcmp(out, "-") == 0 && isatty(1))
		cli_usage_error("refusing to write a model to a terminal");
	if (strcmp(in, "-") == 0 && isatty(0))
		cli_usage_error("refusing to read a model from a terminal");
	if (check && strcmp(out, "-") == 0)
		cli_usage_error("--check needs an OUTPUT file, not '-'");

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	double t0 = cli_now();
	mcv_error err = { 0 };
	mcv_gguf *g;
	if (strcmp(in, "-") == 0)
		g = open_stdin(out);
	else if (mcv_gguf_open(&g, in, &err))
		cli_die("%s", err.msg);
	mcv_layout *l;
	int rc = mcv_layout_open(&l, g, &err);
	if (rc == MCV_EUNSUPPORTED && strncmp(err.msg, "no expert", 9) == 0) {
		const char *arch = "unknown";
		mcv_gguf_get_str(g, "general.architecture", &arch, NULL);
		cli_die("%s: no experts to pack (architecture '%s' has no expert tensors)", in, arch);
	}
	if (rc)
		cli_die("%s: %s", in, err.msg);
	int *order = order_path ? order_from_trace(order_path, l, g, verbose, quiet) : NULL;
	mcv_pack_params pp = mcv_pack_default_params();
	pp.order = order;
	pp.progress = quiet ? NULL : progress;
	pp.cancel = &stop;
	if (mcv_pack_write(l, out, &pp, &err))
		cli_die("%s: %s", out, err.msg);
	cli_progress_done();
	int L = mcv_layout_n_layer(l), E = mcv_layout_n_expert(l);
	uint64_t bytes = 0;
	for (int il = 0; il < L; il++)
		bytes += mcv_layout_layer_bytes(l, il);
	if (check) {
		mcv_gguf *g2;
		mcv_layout *l2;
		if (mcv_gguf_open(&g2, out, &err))
			cli_die("--check: %s", err.msg);
		if (mcv_layout_open(&l2, g2, &err) || mcv_layout_compare(l, l2, &err))
			cli_die("--check: %s: %s", out, err.msg);
		for (int il = 0; il < L; il++)
			for (int e = 0; e < E; e++)
				if (!mcv_layout_expert(l2, il, e)->aligned)
					cli_die("--check: %s: expert %d.%d is not one aligned extent", out, il, e);
		mcv_layout_free(l2);
		mcv_gguf_close(g2);
	}
	if (!quiet)
		fprintf(stderr, "mcv-pack: %s: %d layers x %d experts, %.1f MB of experts packed%s%s in %.1f s\n",
			strcmp(out, "-") ? out : "stdout", L, E, bytes / 1e6,
			order ? ", ordered" : "", check ? ", checked" : "", cli_now() - t0);
	free(order);
	mcv_layout_free(l);
	mcv_gguf_close(g);
	return 0;
}

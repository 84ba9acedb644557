/* Batch driver: inputs -> decoded images -> callback -> one record each.
 * See batch.h for the contract. */
#include "batch.h"
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct run_state {
	const batch_cfg *cfg;
	batch_fn fn;
	void *ud;
	batch_stats *st;
	double t0;
	int total; /* inputs, when known before starting (0: unknown) */
	int write_failed;
} run_state;

bool batch_is_image_name(const char *name)
{
	const char *dot = strrchr(name, '.');
	return dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") ||
		       !strcasecmp(dot, ".jpeg"));
}

/* Text form of a field: one line per record, so tabs, newlines and
 * backslashes are escaped and `cut -f3` / awk -F'\t' can split records. */
static void tsv_field(FILE *f, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		switch (c) {
		case '\\': fputs("\\\\", f); break;
		case '\t': fputs("\\t", f); break;
		case '\n': fputs("\\n", f); break;
		case '\r': fputs("\\r", f); break;
		case '\0': fputs("\\0", f); break;
		default: fputc(c, f);
		}
	}
}

static void json_head(FILE *f, const char *source, const char *member)
{
	fputs("{\"source\":", f);
	cli_json_str(f, source, strlen(source));
	fputs(",\"member\":", f);
	if (member)
		cli_json_str(f, member, strlen(member));
	else
		fputs("null", f);
}

void batch_print_ok(const batch_cfg *cfg, const char *source, const char *member,
		    const batch_result *res, double ms)
{
	FILE *f = cfg->out;
	if (cfg->format == BATCH_TEXT) {
		tsv_field(f, source, strlen(source));
		fputc('\t', f);
		if (member)
			tsv_field(f, member, strlen(member));
		fputc('\t', f);
		tsv_field(f, res->text ? res->text : "", res->len);
		fputc('\n', f);
	} else {
		json_head(f, source, member);
		fputs(",\"prompt\":", f);
		cli_json_str(f, cfg->prompt ? cfg->prompt : "", cfg->prompt ? strlen(cfg->prompt) : 0);
		fputs(",\"text\":", f);
		cli_json_str(f, res->text ? res->text : "", res->len);
		fprintf(f, ",\"prompt_tokens\":%d,\"tokens\":%d,\"ms\":%.0f}\n", res->prompt_tokens,
			res->tokens, ms);
	}
	fflush(f);
}

void batch_print_error(const batch_cfg *cfg, const char *source, const char *member,
		       const char *msg)
{
	if (cfg->format == BATCH_TEXT) {
		/* stdout stays one answer per line; the failure goes to stderr */
		cli_progress_done();
		if (member)
			cli_error("%s: %s: %s", source, member, msg);
		else
			cli_error("%s: %s", source, msg);
		return;
	}
	FILE *f = cfg->out;
	json_head(f, source, member);
	fputs(",\"error\":", f);
	cli_json_str(f, msg, strlen(msg));
	fputs("}\n", f);
	fflush(f);
}

static void progress(run_state *rs)
{
	if (!rs->cfg->progress || !isatty(2))
		return;
	double dt = cli_now() - rs->t0;
	char total[32] = "";
	if (rs->total > 0)
		snprintf(total, sizeof total, "/%d", rs->total);
	fprintf(stderr, "\r%s: %d%s done, %d failed, %.2f images/s\033[K", cli_prog(),
		rs->st->n_done, total, rs->st->n_failed, dt > 0 ? rs->st->n_done / dt : 0.0);
}

static void record_error(run_state *rs, const char *source, const char *member,
			 const char *msg)
{
	batch_print_error(rs->cfg, source, member, msg);
	rs->st->n_done++;
	rs->st->n_failed++;
	if (ferror(rs->cfg->out))
		rs->write_failed = 1;
	progress(rs);
}

/* The image is owned by the caller; time counts from t_start (decoding
 * included). */
static void run_one(run_state *rs, const char *source, const char *member,
		    const mcv_image *im, double t_start)
{
	batch_result res = { 0 };
	mcv_error err = { 0 };
	if (rs->fn(rs->ud, im, &res, &err) != 0) {
		record_error(rs, source, member, err.msg[0] ? err.msg : mcv_strerror(err.code));
		return;
	}
	batch_print_ok(rs->cfg, source, member, &res, 1000.0 * (cli_now() - t_start));
	rs->st->n_done++;
	rs->st->prompt_tokens += res.prompt_tokens;
	rs->st->tokens += res.tokens;
	if (ferror(rs->cfg->out))
		rs->write_failed = 1;
	progress(rs);
}

static void do_file(run_state *rs, const char *path)
{
	double t = cli_now();
	mcv_image im = { 0 };
	mcv_error err = { 0 };
	if (mcv_image_load(path, &rs->cfg->lim, &im, &err) != 0) {
		record_error(rs, path, NULL, err.msg);
		return;
	}
	run_one(rs, path, NULL, &im, t);
	mcv_image_free(&im);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void do_dir(run_state *rs, const char *path)
{
	DIR *d = opendir(path);
	if (!d) {
		char msg[300];
		snprintf(msg, sizeof msg, "cannot open directory: %s", strerror(errno));
		record_error(rs, path, NULL, msg);
		return;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.' || !batch_is_image_name(e->d_name))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			char **nn = realloc(names, cap * sizeof *names);
			if (!nn)
				cli_die("out of memory");
			names = nn;
		}
		if (!(names[n++] = strdup(e->d_name)))
			cli_die("out of memory");
	}
	closedir(d);
	/* sorted by bytes, so the order does not depend on the locale or the
	 * file system */
	qsort(names, n, sizeof *names, cmp_str);
	size_t plen = strlen(path);
	bool slash = plen > 0 && path[plen - 1] == '/';
	for (size_t i = 0; i < n; i++) {
		char *full = malloc(plen + strlen(names[i]) + 2);
		if (!full)
			cli_die("out of memory");
		sprintf(full, "%s%s%s", path, slash ? "" : "/", names[i]);
		struct stat st;
		if (stat(full, &st) == 0 && S_ISDIR(st.st_mode)) {
			free(full);
			free(names[i]);
			continue; /* not recursive: a directory named x.png is passed over */
		}
		do_file(rs, full);
		free(full);
		free(names[i]);
	}
	free(names);
}

/* Inputs a path stands for, counted the way do_dir picks them. */
static int count_path(const char *path)
{
	struct stat st;
	if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		return 1;
	DIR *d = opendir(path);
	if (!d)
		return 1; /* one error record */
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.' && batch_is_image_name(e->d_name) && e->d_type != DT_DIR)
			n++;
	closedir(d);
	return n;
}

static void do_path(run_state *rs, const char *path)
{
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		do_dir(rs, path);
	else
		do_file(rs, path);
}

static void do_archive(run_state *rs, const char *path)
{
	mcv_archive *a = NULL;
	mcv_error err = { 0 };
	if (mcv_archive_open(&a, path, &rs->cfg->lim, &err) != 0) {
		record_error(rs, path, NULL, err.msg);
		return;
	}
	const char *src = path;
	mcv_archive_member m;
	int rc;
	double t = cli_now();
	while ((rc = mcv_archive_next(a, &m, &err)) == 1) {
		if (m.status != MCV_MEMBER_IMAGE) {
			record_error(rs, src, m.name, m.err.msg);
		} else {
			mcv_image im = { 0 };
			mcv_error e2 = { 0 };
			if (mcv_archive_member_decode(a, &m, &im, &e2) != 0)
				record_error(rs, src, m.name, e2.msg);
			else
				run_one(rs, src, m.name, &im, t);
			mcv_image_free(&im);
		}
		t = cli_now();
	}
	if (rc < 0)
		record_error(rs, src, NULL, err.msg);
	mcv_archive_close(a);
}

static void do_list(run_state *rs)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	int delim = rs->cfg->nul_sep ? '\0' : '\n';
	while ((n = getdelim(&line, &cap, delim, stdin)) > 0) {
		if (line[n - 1] == delim)
			line[--n] = 0;
		if (!rs->cfg->nul_sep && n > 0 && line[n - 1] == '\r')
			line[--n] = 0;
		if (n == 0)
			continue;
		do_path(rs, line);
		if (rs->write_failed)
			break;
	}
	if (ferror(stdin))
		record_error(rs, "-", NULL, "cannot read the list of paths from standard input");
	free(line);
}

int batch_run(const batch_cfg *cfg, batch_fn fn, void *ud, batch_stats *stats)
{
	memset(stats, 0, sizeof *stats);
	run_state rs = { .cfg = cfg, .fn = fn, .ud = ud, .st = stats, .t0 = cli_now() };
	/* archives and path lists stream: their size is known only at the end */
	if (cfg->progress && isatty(2)) {
		for (int i = 0; i < cfg->n_src; i++) {
			if (cfg->src[i].kind != BATCH_PATH) {
				rs.total = 0;
				break;
			}
			rs.total += count_path(cfg->src[i].arg);
		}
	}
	for (int i = 0; i < cfg->n_src && !rs.write_failed; i++) {
		switch (cfg->src[i].kind) {
		case BATCH_PATH: do_path(&rs, cfg->src[i].arg); break;
		case BATCH_ARCHIVE: do_archive(&rs, cfg->src[i].arg); break;
		case BATCH_LIST: do_list(&rs); break;
		}
	}
	if (cfg->progress && isatty(2))
		fputs("\r\033[K", stderr);
	stats->seconds = cli_now() - rs.t0;
	return rs.write_failed ? -1 : 0;
}

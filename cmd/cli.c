/* Front-end helpers; see cli.h. */
#include "cli.h"
#include "mcv.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const char *prog = "mcv";
static bool progress_shown;

void cli_init(const char *p)
{
	prog = p;
}

const char *cli_prog(void)
{
	return prog;
}

static void vmsg(const char *fmt, va_list ap, const char *tail)
{
	char buf[1024];
	vsnprintf(buf, sizeof buf, fmt, ap);
	/* One line always: a message must not break a log parser. */
	for (char *c = buf; *c; c++)
		if (*c == '\n' || *c == '\r')
			*c = ' ';
	if (progress_shown)
		cli_progress_done();
	fprintf(stderr, "%s: %s%s\n", prog, buf, tail);
}

void cli_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmsg(fmt, ap, "");
	va_end(ap);
}

void cli_die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmsg(fmt, ap, "");
	va_end(ap);
	exit(CLI_EXIT_ERROR);
}

void cli_usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmsg(fmt, ap, " (see --help)");
	va_end(ap);
	exit(CLI_EXIT_USAGE);
}

void cli_print_version(void)
{
	printf("%s %s\n", prog, MCV_VERSION);
}

/* ---- options ---- */

void cli_parser_init(cli_parser *p, int argc, char **argv)
{
	memset(p, 0, sizeof *p);
	p->argc = argc;
	p->argv = argv;
	p->i = 1;
}

static const cli_option *find_short(const cli_option *o, char c)
{
	for (; o->id; o++)
		if (o->short_name == c)
			return o;
	return NULL;
}

int cli_next(cli_parser *p, const cli_option *opts, const char **arg)
{
	*arg = NULL;
	if (p->group && *p->group) {
		char c = *p->group++;
		const cli_option *o = find_short(opts, c);
		if (!o)
			cli_usage_error("unknown option '-%c'", c);
		if (o->has_arg) {
			if (*p->group) {
				*arg = p->group;
			} else {
				if (p->i >= p->argc)
					cli_usage_error("option '-%c' needs a value", c);
				*arg = p->argv[p->i++];
			}
			p->group = NULL;
		}
		return o->id;
	}
	p->group = NULL;
	if (p->i >= p->argc)
		return 0;
	const char *a = p->argv[p->i++];
	if (p->only_args || a[0] != '-' || a[1] == 0) {
		*arg = a;
		return -1;
	}
	if (a[1] == '-') {
		if (a[2] == 0) {
			p->only_args = true;
			return cli_next(p, opts, arg);
		}
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t n = eq ? (size_t)(eq - name) : strlen(name);
		for (const cli_option *o = opts; o->id; o++) {
			if (!o->name || strlen(o->name) != n || strncmp(o->name, name, n) != 0)
				continue;
			if (!o->has_arg) {
				if (eq)
					cli_usage_error("option '--%s' takes no value", o->name);
				return o->id;
			}
			if (eq) {
				*arg = eq + 1;
			} else {
				if (p->i >= p->argc)
					cli_usage_error("option '--%s' needs a value", o->name);
				*arg = p->argv[p->i++];
			}
			return o->id;
		}
		cli_usage_error("unknown option '--%.*s'", (int)(n > 64 ? 64 : n), name);
	}
	p->group = a + 1;
	return cli_next(p, opts, arg);
}

/* ---- values ---- */

long cli_int(const char *opt, const char *s, long min, long max)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (!*s || *end || errno)
		cli_usage_error("%s: '%.64s' is not an integer", opt, s);
	if (v < min || v > max)
		cli_usage_error("%s: %ld is out of range [%ld, %ld]", opt, v, min, max);
	return v;
}

double cli_float(const char *opt, const char *s, double min, double max)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (!*s || *end || errno || !isfinite(v))
		cli_usage_error("%s: '%.64s' is not a number", opt, s);
	if (v < min || v > max)
		cli_usage_error("%s: %g is out of range [%g, %g]", opt, v, min, max);
	return v;
}

uint64_t cli_u64(const char *opt, const char *s)
{
	char *end;
	errno = 0;
	if (*s == '-' || *s == '+' || !*s)
		cli_usage_error("%s: '%.64s' is not an unsigned integer", opt, s);
	unsigned long long v = strtoull(s, &end, 0);
	if (*end || errno)
		cli_usage_error("%s: '%.64s' is not an unsigned integer", opt, s);
	return v;
}

int cli_parse_size(const char *s, uint64_t *out)
{
	char *end;
	if (!s || !((*s >= '0' && *s <= '9') || *s == '.'))
		return -1;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !isfinite(v) || v < 0)
		return -1;
	double mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	}
	if (mul > 1 && *end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return -1;
	v *= mul;
	if (v >= 18446744073709551615.0)
		return -1;
	*out = (uint64_t)llround(v);
	return 0;
}

uint64_t cli_size(const char *opt, const char *s)
{
	uint64_t v;
	if (cli_parse_size(s, &v))
		cli_usage_error("%s: '%.64s' is not a size (e.g. 512M, 1.5G)", opt, s);
	return v;
}

char *cli_read_file(const char *path, size_t *len)
{
	bool std = strcmp(path, "-") == 0;
	FILE *f = std ? stdin : fopen(path, "rb");
	if (!f)
		cli_die("cannot open '%s': %s", path, strerror(errno));
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf)
			cli_die("'%s': out of memory", path);
		if (n + 1 >= cap) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb) {
				free(buf);
				cli_die("'%s': out of memory", path);
			}
			buf = nb;
		}
		size_t k = fread(buf + n, 1, cap - n - 1, f);
		n += k;
		if (k == 0)
			break;
	}
	if (ferror(f)) {
		int e = errno;
		free(buf);
		cli_die("cannot read '%s': %s", std ? "(stdin)" : path, strerror(e ? e : EIO));
	}
	if (!std)
		fclose(f);
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
}

/* ---- output ---- */

static size_t utf8_valid(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t k;
	uint32_t cp, min;
	if (c < 0x80) return 1;
	if ((c & 0xE0) == 0xC0) { k = 2; cp = c & 0x1F; min = 0x80; }
	else if ((c & 0xF0) == 0xE0) { k = 3; cp = c & 0x0F; min = 0x800; }
	else if ((c & 0xF8) == 0xF0) { k = 4; cp = c & 0x07; min = 0x10000; }
	else return 0;
	if (k > n) return 0;
	for (size_t i = 1; i < k; i++) {
		if ((s[i] & 0xC0) != 0x80) return 0;
		cp = cp << 6 | (s[i] & 0x3F);
	}
	if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
	return k;
}

void cli_json_str(FILE *f, const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	fputc('"', f);
	for (size_t i = 0; i < n;) {
		unsigned c = u[i];
		if (c == '"' || c == '\\') {
			fputc('\\', f);
			fputc((int)c, f);
			i++;
		} else if (c < 0x20 || c == 0x7F) {
			switch (c) {
			case '\n': fputs("\\n", f); break;
			case '\t': fputs("\\t", f); break;
			case '\r': fputs("\\r", f); break;
			default: fprintf(f, "\\u%04x", c);
			}
			i++;
		} else if (c < 0x80) {
			fputc((int)c, f);
			i++;
		} else {
			size_t k = utf8_valid(u + i, n - i);
			if (k) {
				fwrite(u + i, 1, k, f);
				i += k;
			} else {
				fputs("\\ufffd", f);
				i++;
			}
		}
	}
	fputc('"', f);
}

void cli_progress(const char *what, uint64_t done, uint64_t total)
{
	static int last = -1;
	if (!isatty(2))
		return;
	int pct = total ? (int)(100.0 * (double)done / (double)total) : 0;
	if (pct == last && progress_shown)
		return;
	last = pct;
	fprintf(stderr, "\r%s: %s %3d%%", prog, what, pct);
	progress_shown = true;
}

void cli_progress_done(void)
{
	if (progress_shown) {
		fputs("\r\033[K", stderr);
		progress_shown = false;
	}
}

double cli_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

uint64_t cli_peak_rss(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (uint64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

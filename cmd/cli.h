/* Front-end helpers shared by every mcv tool: option parsing, strict number
 * and size parsing, one-line messages "tool: ...", usage errors (exit 2),
 * progress on a terminal, JSON string output.
 *
 * Exit codes: 0 ok, 1 runtime or data error, 2 usage error. */
#ifndef MCV_CLI_H
#define MCV_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { CLI_EXIT_OK = 0, CLI_EXIT_ERROR = 1, CLI_EXIT_USAGE = 2 };

/* Set the tool name used in every message (call first in main). */
void cli_init(const char *prog);
const char *cli_prog(void);

/* "prog: message" on stderr, one line. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* cli_error, then exit 1. */
void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "prog: message (see --help)" and exit 2. */
void cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "prog VERSION" on stdout. */
void cli_print_version(void);

/* ---- options ----
 * A table of options ends with an entry whose id is 0.  Long options take
 * "--name value" or "--name=value"; short ones "-n value" or "-nvalue";
 * short flags without values may be grouped ("-vq").  "--" ends options;
 * "-" alone is a positional argument. */
enum { CLI_NO_ARG = 0, CLI_ARG = 1 };

typedef struct cli_option {
	const char *name; /* long name without "--", or NULL */
	char short_name;  /* or 0 */
	int has_arg;
	int id;           /* > 0, returned by cli_next */
} cli_option;

typedef struct cli_parser {
	int argc;
	char **argv;
	int i;             /* next argv index */
	const char *group; /* rest of a short-option group */
	bool only_args;    /* after "--" */
} cli_parser;

void cli_parser_init(cli_parser *p, int argc, char **argv);
/* Next option: returns its id and sets *arg (NULL for flags); returns -1 for
 * a positional argument (in *arg); 0 at the end.  Unknown options and
 * missing values are usage errors (exit 2). */
int cli_next(cli_parser *p, const cli_option *opts, const char **arg);

/* ---- values: each is a usage error (exit 2) naming the option when bad ---- */
long cli_int(const char *opt, const char *s, long min, long max);
double cli_float(const char *opt, const char *s, double min, double max);
uint64_t cli_u64(const char *opt, const char *s);
/* A byte size: digits with an optional fraction and a K, M, G or T suffix
 * (powers of 1024; "KB", "KiB", "k" are accepted too), e.g. "512M", "1.5G". */
uint64_t cli_size(const char *opt, const char *s);
/* The same without exiting: 0, or -1 for a malformed or overflowing size. */
int cli_parse_size(const char *s, uint64_t *out);

/* Read a whole file ("-" = stdin) into a NUL-terminated buffer; exits 1 with
 * "prog: 'path': reason" on failure. */
char *cli_read_file(const char *path, size_t *len);

/* ---- output ---- */
/* A JSON string literal, quotes included; invalid UTF-8 becomes U+FFFD. */
void cli_json_str(FILE *f, const char *s, size_t n);
/* Progress on stderr when it is a terminal ("prog: what 42%"), rewritten in
 * place; cli_progress_done() ends the line.  Silent otherwise. */
void cli_progress(const char *what, uint64_t done, uint64_t total);
void cli_progress_done(void);
/* Seconds since an arbitrary start (monotonic). */
double cli_now(void);
/* Peak resident set size of this process in bytes. */
uint64_t cli_peak_rss(void);

#endif

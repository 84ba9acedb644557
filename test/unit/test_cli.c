/* Front-end helpers (cmd/cli.c, compiled in here since tools, not the
 * library, link it): sizes, JSON strings, option parsing. */
#include "cli.c"
#include "unit.h"

static void check_size(const char *s, int ok, uint64_t want)
{
	uint64_t v = 0;
	int rc = cli_parse_size(s, &v);
	CHECK((rc == 0) == ok, "'%s': rc %d", s, rc);
	if (ok)
		CHECK(v == want, "'%s' = %llu, want %llu", s, (unsigned long long)v, (unsigned long long)want);
}

static void check_json(const char *in, size_t n, const char *want)
{
	char buf[256] = { 0 };
	FILE *f = fmemopen(buf, sizeof buf - 1, "w");
	cli_json_str(f, in, n);
	fclose(f);
	CHECK(strcmp(buf, want) == 0, "json of '%s': %s, want %s", in, buf, want);
}

int main(void)
{
	check_size("0", 1, 0);
	check_size("4096", 1, 4096);
	check_size("512M", 1, 512ull << 20);
	check_size("1.5G", 1, 3ull << 29);
	check_size("2GiB", 1, 2ull << 30);
	check_size("64kB", 1, 64 << 10);
	check_size("1T", 1, 1ull << 40);
	check_size("", 0, 0);
	check_size("-1G", 0, 0);
	check_size("12Q", 0, 0);
	check_size("G", 0, 0);
	check_size("1e30G", 0, 0);
	check_size("3 G", 0, 0);

	check_json("plain", 5, "\"plain\"");
	check_json("a\"b\\c\n\t\x01", 8, "\"a\\\"b\\\\c\\n\\t\\u0001\"");
	check_json("caf\xc3\xa9 \xe4\xbd\xa0 \xf0\x9f\x98\x80", 14, "\"caf\xc3\xa9 \xe4\xbd\xa0 \xf0\x9f\x98\x80\"");
	check_json("x\xff" "y\xe4\xbd", 5, "\"x\\ufffdy\\ufffd\\ufffd\"");
	check_json("a\0b", 3, "\"a\\u0000b\"");
	check_json("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\""); /* a surrogate is not UTF-8 */

	static const cli_option opts[] = {
		{ "model", 'm', CLI_ARG, 1 }, { "verbose", 'v', CLI_NO_ARG, 2 },
		{ "quiet", 'q', CLI_NO_ARG, 3 }, { "n", 'n', CLI_ARG, 4 }, { NULL, 0, 0, 0 },
	};
	char *argv[] = { "x", "-m", "a.gguf", "--model=b.gguf", "-vq", "-n5", "--n", "6", "pos", "-",
			 "--", "-v", NULL };
	int want_id[] = { 1, 1, 2, 3, 4, 4, -1, -1, -1, 0 };
	const char *want_arg[] = { "a.gguf", "b.gguf", NULL, NULL, "5", "6", "pos", "-", "-v", NULL };
	cli_parser p;
	cli_parser_init(&p, 12, argv);
	for (int i = 0; i < 10; i++) {
		const char *arg;
		int id = cli_next(&p, opts, &arg);
		CHECK(id == want_id[i], "option %d: id %d want %d", i, id, want_id[i]);
		CHECK((arg == NULL) == (want_arg[i] == NULL) && (!arg || strcmp(arg, want_arg[i]) == 0),
		      "option %d: arg '%s' want '%s'", i, arg ? arg : "(null)", want_arg[i] ? want_arg[i] : "(null)");
	}
	CHECK(cli_peak_rss() > 0, "peak RSS unknown");
	double t0 = cli_now(), t1 = cli_now();
	CHECK(t1 >= t0, "clock went back");
	return unit_done("cli");
}

/* Shared by the tokenizer tests: build the test vocabulary with
 * scripts/mk-test-vocab.py into a temporary folder and load its text dump
 * (no GGUF reader needed).  Skips (exit 77) when Python is unavailable. */
#ifndef MCV_TOK_VOCAB_H
#define MCV_TOK_VOCAB_H
#include "tokenizer.h"
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char tv_dir[64];

static char *tv_unhex(const char *h)
{
	size_t n = strlen(h) / 2;
	char *s = malloc(n + 1);
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		sscanf(h + 2 * i, "%2x", &v);
		s[i] = (char)v;
	}
	s[n] = 0;
	return s;
}

/* Returns the tokenizer; *gguf_path gets the GGUF written next to the dump. */
static mcv_tokenizer *tv_load(int n_merges, const char *pre_name, int pre, char *gguf_path, size_t cap)
{
	strcpy(tv_dir, "/tmp/mcv-tok-XXXXXX");
	if (!mkdtemp(tv_dir))
		UNIT_SKIP("cannot make a temporary folder");
	snprintf(gguf_path, cap, "%s/vocab.gguf", tv_dir);
	char cmd[512];
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/mk-test-vocab.py %s %d %s",
		 gguf_path, n_merges, pre_name);
	if (system(cmd) != 0)
		UNIT_SKIP("/usr/bin/python3 scripts/mk-test-vocab.py failed (run from the source tree)");
	char txt[600];
	snprintf(txt, sizeof txt, "%s.txt", gguf_path);
	FILE *f = fopen(txt, "r");
	if (!f)
		UNIT_SKIP("no vocabulary dump");
	char **tok = NULL, **mrg = NULL;
	int32_t *ty = NULL;
	int nt = 0, nm = 0;
	char line[4096], hex[4000];
	int t;
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, "T %d %3999s", &t, hex) == 2) {
			tok = realloc(tok, (nt + 1) * sizeof *tok);
			ty = realloc(ty, (nt + 1) * sizeof *ty);
			tok[nt] = tv_unhex(hex);
			ty[nt++] = t;
		} else if (sscanf(line, "M %3999s", hex) == 1) {
			mrg = realloc(mrg, (nm + 1) * sizeof *mrg);
			mrg[nm++] = tv_unhex(hex);
		}
	}
	fclose(f);
	mcv_tokenizer *tk = NULL;
	mcv_error err = { 0 };
	int rc = mcv_tokenizer_init(&tk, (const char *const *)tok, ty, nt,
				    (const char *const *)mrg, nm, pre, &err);
	CHECK(rc == 0, "init: %s", err.msg);
	for (int i = 0; i < nt; i++)
		free(tok[i]);
	for (int i = 0; i < nm; i++)
		free(mrg[i]);
	free(tok);
	free(mrg);
	free(ty);
	if (rc)
		exit(unit_done("tokenizer"));
	return tk;
}

static void tv_cleanup(void)
{
	char cmd[128];
	if (tv_dir[0]) {
		snprintf(cmd, sizeof cmd, "rm -rf %s", tv_dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", tv_dir);
	}
}

#endif

/* Hand-picked strings: each covers a rule of the pre-tokenizer or a script. */
static const char *const tv_strings[] = {
	"Hello world", "hello  world", "Hello   world   ", "   leading", "trailing   ",
	"It's I'm you're we've they'll he'd IT'S I'M YOU'RE DON'T 'tis ''s",
	"'", "'s", "x'", "don't'", "a'b'c",
	"1234567890", "3.14159 and 2,718", "x1y22z333", "١٢٣ ٤٥٦ ½ ² Ⅻ", "2026-11-29T12:00:00Z",
	"\n", "\n\n", "a\nb", "a\n\nb", "a \n b", "a\r\nb", "a \r\n\r\n  b", "\t\ttabs\tand\t",
	"line\n   indented\n\tmore", "x  \n", "  \n  ", "end with spaces  ", " ",
	"!!!", "?!?! hey...", " (parens) [brackets] {braces}", "a+b=c; d-e*f/g",
	"<html><body class=\"x\">a &amp; b</body></html>", "{\"key\": [1, 2, 3]}",
	"def f(x):\n    return x ** 2  # square\n",
	"Café crème naïve façade résumé über Ångström", "São Paulo, Dvořák, Łódź",
	"e\xcc\x81t\xc3\xa9 cafe\xcc\x81 na\xc3\xafve nai\xcc\x88ve", "\xcc\x81\xcc\x81 lone marks", "!\xcc\x81x",
	"你好，世界！今天是2026年11月29日。", "日本語のテキスト、カタカナ。", "한국어 문장 안녕하세요",
	"Привет, мир!", "Γειά σου κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีครับ ผมชื่อ",
	"😀 😂 👍🏽 🎉🎉 ❤️ 👨‍👩‍👧 🇫🇷🇯🇵", "emoji😀inside", "😀😀😀",
	"nbsp\xc2\xa0here", "ideographic\xe3\x80\x80space", "em\xe2\x80\x83space", "\xc2\x85nel",
	"<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
	"<think>\n\n</think>\n\nThe answer is 42.<|im_end|>", "<|im_start|><|im_end|><|endoftext|>",
	"x<|im_end|>y", "<|im_end|", "<think>inline</think>", "<image></image>",
	"Receipt #00123: 2 x coffee @ 3.50 = 7.00 EUR", "The quick brown fox jumps over the lazy dog.",
	"", "a", "  ", "\r", "\r\r\n\n",
};
#define TV_N_STRINGS ((int)(sizeof tv_strings / sizeof *tv_strings))

/* Random valid UTF-8 from a pool that mixes every class the rules see. */
static const char *const tv_pool[] = {
	"a", "b", "Z", "the", " ", " ", "  ", "\n", "\r\n", "\t", "0", "7", "42", "'", "'s", "'LL",
	".", ",", "!", "?", "-", "(", ")", "\"", "#", "é", "ß", "Ω", "\xcc\x81", "\xcc\x88", "中", "文",
	"に", "😀", "👍🏽", "\xc2\xa0", "\xe3\x80\x80", "½", "١", "€", "<|im_end|>", "<think>", "world",
};

static unsigned tv_rng = 12345;
static inline unsigned tv_rand(void)
{
	tv_rng = tv_rng * 1103515245u + 12345u;
	return (tv_rng >> 8) & 0xFFFFFF;
}

static inline void tv_random_string(char *out, size_t cap)
{
	size_t n = 0;
	int k = 1 + (int)(tv_rand() % 24);
	out[0] = 0;
	for (int i = 0; i < k; i++) {
		const char *p = tv_pool[tv_rand() % (sizeof tv_pool / sizeof *tv_pool)];
		size_t l = strlen(p);
		if (n + l + 1 > cap)
			break;
		memcpy(out + n, p, l);
		n += l;
		out[n] = 0;
	}
}

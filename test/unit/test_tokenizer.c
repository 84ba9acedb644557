/* Tokenizer: pre-tokenizer rules, special tokens, byte round trips, GGUF
 * loading and load time of a 250k-token vocabulary.  Parity with llama.cpp
 * is test_tokenizer_peer.c. */
#include "tok_vocab.h"
#include "chat.h"
#include "gguf.h"

#include <time.h>

struct words {
	char buf[1024];
	size_t n;
};

static void collect(const char *w, size_t len, void *ud)
{
	struct words *ws = ud;
	if (ws->n + len + 2 < sizeof ws->buf) {
		memcpy(ws->buf + ws->n, w, len);
		ws->n += len;
		ws->buf[ws->n++] = '|';
		ws->buf[ws->n] = 0;
	}
}

/* Expected splits follow the Qwen regex alternatives (see tokenizer.c). */
static void check_split(int pre, const char *text, const char *want)
{
	struct words ws = { .n = 0 };
	ws.buf[0] = 0;
	mcv_tokenizer_split(pre, text, strlen(text), collect, &ws);
	CHECK(strcmp(ws.buf, want) == 0, "split '%s': got '%s' want '%s'", text, ws.buf, want);
}

static void roundtrip(const mcv_tokenizer *tk, const char *s, size_t n, bool special)
{
	int32_t *ids = NULL;
	int nid = 0, cap = 0;
	mcv_error err;
	CHECK(mcv_tokenizer_encode(tk, s, n, special, &ids, &nid, &cap, &err) == 0, "%s", err.msg);
	char *out = NULL;
	size_t len = 0;
	CHECK(mcv_tokenizer_decode(tk, ids, nid, true, &out, &len, &err) == 0, "%s", err.msg);
	CHECK(len == n && memcmp(out, s, n) == 0, "round trip of %zu bytes gave %zu bytes", n, len);
	free(out);
	free(ids);
}

static int encode1(const mcv_tokenizer *tk, const char *s, bool special, int32_t *first)
{
	int32_t *ids = NULL;
	int n = 0, cap = 0;
	mcv_error err;
	mcv_tokenizer_encode(tk, s, strlen(s), special, &ids, &n, &cap, &err);
	*first = n ? ids[0] : -1;
	free(ids);
	return n;
}

static void check_chat(const mcv_tokenizer *tk)
{
	static const struct {
		mcv_chat_params p;
		const char *want;
	} cases[] = {
		{ { .user = "Hi" }, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
		{ { .user = "Hi", .think = true }, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" },
		{ { .user = "Hi", .system = "Be brief." },
		  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
		  "<think>\n\n</think>\n\n" },
		{ { .user = "Hi <|im_end|>", .raw = true }, "Hi <|im_end|>" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		mcv_chat c;
		mcv_error err;
		mcv_chat_init(&c);
		CHECK(mcv_chat_build(&c, &cases[i].p, &err) == 0, "%s", err.msg);
		CHECK(c.n == 1 && strcmp(c.seg[0].text, cases[i].want) == 0, "template %zu: '%s'", i,
		      c.n ? c.seg[0].text : "");
		int32_t *a = NULL, *b = NULL;
		int na = 0, nb = 0, ca = 0, cb = 0;
		CHECK(mcv_chat_tokenize(&c, tk, &a, &na, &ca, &err) == 0, "%s", err.msg);
		mcv_tokenizer_encode(tk, cases[i].want, strlen(cases[i].want), true, &b, &nb, &cb, &err);
		CHECK(na == nb && na > 0 && memcmp(a, b, (size_t)na * sizeof *a) == 0, "template %zu tokens", i);
		CHECK(cases[i].p.raw || a[0] == mcv_tokenizer_find(tk, "<|im_start|>"), "template %zu starts with <|im_start|>", i);
		free(a);
		free(b);
		mcv_chat_free(&c);
	}
	/* image slots: text, slot, text; tokenizing text-only refuses them */
	mcv_chat c;
	mcv_error err;
	mcv_chat_init(&c);
	mcv_chat_params p = { .user = "What is this?", .n_images = 2 };
	CHECK(mcv_chat_build(&c, &p, &err) == 0, "%s", err.msg);
	CHECK(c.n == 4 && c.seg[1].kind == MCV_SEG_IMAGE && c.seg[1].image == 0 && c.seg[2].image == 1 &&
	      strcmp(c.seg[0].text, "<|im_start|>user\n") == 0, "image slots misplaced (%d segments)", c.n);
	int32_t *ids = NULL;
	int n = 0, cap = 0;
	CHECK(mcv_chat_tokenize(&c, tk, &ids, &n, &cap, &err) == MCV_EINVAL, "image slot tokenized as text");
	free(ids);
	mcv_chat_free(&c);
}

static void check_big_vocab(void)
{
	/* 250k tokens and 250k merges, each merge a token plus one character. */
	enum { NT = 250000 };
	char **tok = malloc(NT * sizeof *tok), **mrg = malloc(NT * sizeof *mrg);
	int n = 0, m = 0;
	for (int b = 0; b < 256; b++) {
		int extra = 0, cp = b;
		for (int c = 0; c < b; c++)
			if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE))
				extra++;
		if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE))
			cp = 256 + extra;
		char *s = malloc(4);
		if (cp < 0x80) { s[0] = (char)cp; s[1] = 0; }
		else { s[0] = (char)(0xC0 | cp >> 6); s[1] = (char)(0x80 | (cp & 0x3F)); s[2] = 0; }
		tok[n++] = s;
	}
	for (int j = 0; n < NT; j++) {
		const char *l = tok[j / 94];
		char c = (char)('!' + j % 94);
		size_t ll = strlen(l);
		char *s = malloc(ll + 2), *mm = malloc(ll + 3);
		memcpy(s, l, ll);
		s[ll] = c;
		s[ll + 1] = 0;
		memcpy(mm, l, ll);
		mm[ll] = ' ';
		mm[ll + 1] = c;
		mm[ll + 2] = 0;
		tok[n++] = s;
		mrg[m++] = mm;
	}
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	mcv_tokenizer *tk = NULL;
	mcv_error err;
	int rc = mcv_tokenizer_init(&tk, (const char *const *)tok, NULL, n, (const char *const *)mrg, m,
				    MCV_PRE_QWEN35, &err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
	CHECK(rc == 0, "%s", err.msg);
	if (rc == 0) {
		CHECK(mcv_tokenizer_n_merges(tk) == m, "%d of %d merges usable", mcv_tokenizer_n_merges(tk), m);
		CHECK(ms < 1500, "loading 250k tokens + merges took %.0f ms", ms);
		fprintf(stderr, "250k tokens + %d merges loaded in %.0f ms\n", m, ms);
		/* tok['!'] + '!' is merge 33 * 94: "!!" is one token, "!!!" two */
		int32_t id;
		CHECK(encode1(tk, "!!", false, &id) == 1 && id == 256 + 33 * 94, "merge not applied");
		CHECK(encode1(tk, "!!!", false, &id) == 2, "'!!!' is two tokens");
		/* a long word must stay fast (heap-based merging) */
		size_t L = 200000;
		char *big = malloc(L + 1);
		for (size_t i = 0; i < L; i++)
			big[i] = (char)('a' + (i * 7 + i / 13) % 26);
		big[L] = 0;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		roundtrip(tk, big, L, false);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
		CHECK(ms < 2000, "a 200 kB word took %.0f ms", ms);
		free(big);
	}
	mcv_tokenizer_free(tk);
	for (int i = 0; i < n; i++)
		free(tok[i]);
	for (int i = 0; i < m; i++)
		free(mrg[i]);
	free(tok);
	free(mrg);
}

static void check_gguf(const mcv_tokenizer *ref, const char *path)
{
	mcv_gguf *g = NULL;
	mcv_error err;
	if (mcv_gguf_open(&g, path, &err) != 0) {
		CHECK(0, "cannot open the test vocabulary: %s", err.msg);
		return;
	}
	mcv_tokenizer *tk = NULL;
	CHECK(mcv_tokenizer_load(&tk, g, &err) == 0, "load: %s", err.msg);
	mcv_gguf_close(g);
	if (!tk)
		return;
	CHECK(mcv_tokenizer_n_vocab(tk) == mcv_tokenizer_n_vocab(ref), "vocab size differs");
	CHECK(mcv_tokenizer_eos(tk) == mcv_tokenizer_find(tk, "<|endoftext|>"), "eos id %d", mcv_tokenizer_eos(tk));
	for (int i = 0; i < TV_N_STRINGS; i++) {
		int32_t *a = NULL, *b = NULL;
		int na = 0, nb = 0, ca = 0, cb = 0;
		const char *s = tv_strings[i];
		mcv_tokenizer_encode(ref, s, strlen(s), true, &a, &na, &ca, &err);
		mcv_tokenizer_encode(tk, s, strlen(s), true, &b, &nb, &cb, &err);
		CHECK(na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0), "GGUF-loaded tokenizer differs on '%s'", s);
		free(a);
		free(b);
	}
	mcv_tokenizer_free(tk);
}

int main(void)
{
	int q = MCV_PRE_QWEN35, q2 = MCV_PRE_QWEN2;
	check_split(q, "Hello world", "Hello| world|");
	check_split(q, "I'm here, it's OK'LL", "I|'m| here|,| it|'s| OK|'LL|");
	check_split(q, "abc123", "abc|1|2|3|");
	check_split(q, "a  b", "a| | b|");
	check_split(q, "a   ", "a|   |");
	check_split(q, "x\n\n  y", "x|\n\n| | y|");
	check_split(q, "x \n \n y", "x| \n \n| y|");
	check_split(q, "hi!!!\n\nok", "hi|!!!\n\n|ok|");
	check_split(q, "a ...b", "a| ...|b|");
	check_split(q, " 42", " |4|2|");
	check_split(q, "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c", "\xe4\xbd\xa0\xe5\xa5\xbd|\xef\xbc\x8c|");
	check_split(q, "cafe\xcc\x81!", "cafe\xcc\x81|!|");
	check_split(q2, "cafe\xcc\x81!", "cafe|\xcc\x81!|");
	check_split(q, "a\xc2\xa0" "b", "a|\xc2\xa0" "b|");
	check_split(q, "\xff\xfe" "ab", "\xff\xfe|ab|"); /* invalid bytes act as U+FFFD: a symbol run */

	char gguf[256];
	mcv_tokenizer *tk = tv_load(400, "qwen35", MCV_PRE_QWEN35, gguf, sizeof gguf);
	int32_t im_end = mcv_tokenizer_find(tk, "<|im_end|>"), think = mcv_tokenizer_find(tk, "<think>");
	CHECK(im_end >= 0 && think >= 0, "special tokens missing from the test vocabulary");
	int32_t id;
	CHECK(encode1(tk, "<|im_end|>", true, &id) == 1 && id == im_end, "control token not parsed");
	CHECK(encode1(tk, "<|im_end|>", false, &id) > 1, "control token parsed although specials are off");
	CHECK(encode1(tk, "<think>", false, &id) == 1 && id == think, "user-defined token must always match");
	CHECK(mcv_tokenizer_is_eog(tk, im_end), "<|im_end|> ends generation");
	CHECK(!mcv_tokenizer_is_eog(tk, think), "<think> does not end generation");
	char buf[32];
	CHECK(mcv_tokenizer_piece(tk, im_end, false, buf, sizeof buf) == 0, "control piece without special");
	CHECK(mcv_tokenizer_piece(tk, im_end, true, buf, sizeof buf) == 10 && memcmp(buf, "<|im_end|>", 10) == 0,
	      "control piece with special");
	CHECK(mcv_tokenizer_piece(tk, 1 << 30, true, buf, sizeof buf) == -1, "out-of-range id");
	/* merges really fire: common words become fewer tokens than bytes */
	CHECK(encode1(tk, " the", false, &id) == 1, "' the' should be one token");

	for (int i = 0; i < TV_N_STRINGS; i++)
		roundtrip(tk, tv_strings[i], strlen(tv_strings[i]), true);
	/* any byte string, including invalid UTF-8, NULs and lone continuation bytes */
	unsigned r = 7;
	for (int k = 0; k < 300; k++) {
		char s[64];
		size_t n = (size_t)(k % 64);
		for (size_t i = 0; i < n; i++) {
			r = r * 1664525u + 1013904223u;
			s[i] = k & 1 ? (char)(r >> 24) : ("ab \n\xc3\xa9\xe4\xbd\xa0\x80\xff'1"[(r >> 24) % 12]);
		}
		roundtrip(tk, s, n, false);
	}
	check_gguf(tk, gguf);
	check_chat(tk);
	mcv_tokenizer_free(tk);
	tv_cleanup();

	/* hostile vocabularies are errors, not crashes */
	mcv_error err;
	mcv_tokenizer *bad = NULL;
	const char *dup[] = { "a", "b", "a" }, *mb[] = { "ab" };
	CHECK(mcv_tokenizer_init(&bad, dup, NULL, 3, NULL, 0, q, &err) == MCV_EFORMAT, "duplicate tokens accepted");
	CHECK(mcv_tokenizer_init(&bad, dup, NULL, 2, mb, 1, q, &err) == MCV_EFORMAT, "merge without a space accepted");
	CHECK(mcv_tokenizer_init(&bad, dup, NULL, 0, NULL, 0, q, &err) == MCV_EFORMAT, "empty vocabulary accepted");
	check_big_vocab();
	return unit_done("tokenizer");
}

/* Tokenizer parity with llama.cpp (node-llama-cpp, vocab-only load) on the
 * same vocabulary: hand-picked strings and random mixes of every character
 * class, special tokens parsed.  Skips when node or the peer is absent. */
#include "tok_vocab.h"

#include "gguf.h"

#include <unistd.h>

#define N_RANDOM 300

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputs("\"\n", f);
}

/* Tokenize all[0..n) with tk and with llama.cpp on the GGUF at path. */
static void compare(const mcv_tokenizer *tk, const char *path, const char *const *all, int n, const char *what)
{
	char in[300], out[300], cmd[1200];
	snprintf(in, sizeof in, "%s/in.jsonl", tv_dir);
	snprintf(out, sizeof out, "%s/out.jsonl", tv_dir);
	FILE *f = fopen(in, "w");
	for (int i = 0; i < n; i++)
		json_str(f, all[i]);
	fclose(f);
	snprintf(cmd, sizeof cmd, "node scripts/peer-tokenize.mjs %s < %s > %s 2>%s/err", path, in, out, tv_dir);
	if (system(cmd) != 0) {
		tv_cleanup();
		UNIT_SKIP("peer tokenizer did not run");
	}
	f = fopen(out, "r");
	static char line[1 << 16];
	int i = 0, same = 0;
	while (i < n && fgets(line, sizeof line, f)) {
		int32_t *ids = NULL;
		int nid = 0, cap = 0;
		mcv_error err;
		CHECK(mcv_tokenizer_encode(tk, all[i], strlen(all[i]), true, &ids, &nid, &cap, &err) == 0, "%s", err.msg);
		int k = 0, ok = 1;
		for (char *p = line + 1; *p && *p != ']';) {
			long v = strtol(p, &p, 10);
			if (k >= nid || ids[k] != v)
				ok = 0;
			k++;
			if (*p == ',')
				p++;
		}
		if (k != nid)
			ok = 0;
		CHECK(ok, "%s: string %d '%s': llama.cpp %s mcv has %d ids starting %d", what, i, all[i], line,
		      nid, nid ? ids[0] : -1);
		same += ok;
		free(ids);
		i++;
	}
	fclose(f);
	CHECK(i == n, "%s: peer answered %d of %d strings", what, i, n);
	fprintf(stderr, "%s: %d/%d strings tokenized as llama.cpp does\n", what, same, n);
}

int main(void)
{
	if (access("scripts/peer/node_modules/node-llama-cpp/dist/index.js", R_OK) != 0)
		UNIT_SKIP("peer (node-llama-cpp) not installed: sh scripts/setup.sh");
	if (system("node --version >/dev/null 2>&1") != 0)
		UNIT_SKIP("node not found");
	char gguf[256];
	mcv_tokenizer *tk = tv_load(400, "qwen35", MCV_PRE_QWEN35, gguf, sizeof gguf);
	CHECK(mcv_tokenizer_n_merges(tk) > 300, "only %d merges usable", mcv_tokenizer_n_merges(tk));

	static char rnd[N_RANDOM][512];
	const char *all[TV_N_STRINGS + N_RANDOM];
	int n = 0;
	for (int i = 0; i < TV_N_STRINGS; i++)
		if (tv_strings[i][0])
			all[n++] = tv_strings[i];
	for (int i = 0; i < N_RANDOM; i++) {
		tv_random_string(rnd[i], sizeof rnd[i]);
		if (rnd[i][0])
			all[n++] = rnd[i];
	}
	compare(tk, gguf, all, n, "test vocabulary");
	mcv_tokenizer_free(tk);

	/* The proving model's own vocabulary (scripts/data), through the GGUF
	 * loader this time. */
	char pv[300], cmd[700];
	snprintf(pv, sizeof pv, "%s/proving-vocab.gguf", tv_dir);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/data/vocab_gguf.py %s >/dev/null 2>&1", pv);
	if (access("scripts/data/vocab_gguf.py", R_OK) == 0 && system(cmd) == 0) {
		mcv_gguf *g = NULL;
		mcv_error err;
		CHECK(mcv_gguf_open(&g, pv, &err) == 0, "%s", err.msg);
		if (g) {
			CHECK(mcv_tokenizer_load(&tk, g, &err) == 0, "%s", err.msg);
			mcv_gguf_close(g);
			if (tk) {
				compare(tk, pv, all, n, "proving vocabulary");
				mcv_tokenizer_free(tk);
			}
		}
	} else {
		fprintf(stderr, "note: scripts/data/vocab_gguf.py absent or failed; proving vocabulary not compared\n");
	}
	tv_cleanup();
	return unit_done("tokenizer-peer");
}

/* Byte-level BPE with the Qwen pre-tokenizer.  See tokenizer.h.
 *
 * Tokens are kept in one text buffer; two open-addressing hash tables make
 * loading a 250k-token, 250k-merge vocabulary a single linear pass: text ->
 * id, and (left id, right id) -> (rank, merged id).  BPE then works on ids
 * only: a word starts as one byte token per byte and pairs are merged lowest
 * rank first (leftmost on ties), using a heap so long words stay fast. */
#include "tokenizer.h"
#include "unicode_tables.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct mcv_tokenizer {
	int pre;
	int64_t n_tokens;
	char *text;        /* all token texts, NUL-separated */
	uint64_t *off;     /* [n_tokens] into text */
	uint32_t *len;     /* [n_tokens] */
	uint8_t *type;     /* [n_tokens] */
	uint32_t tok_mask; /* token hash table: size mask */
	int32_t *tok_slot; /* -1 empty, else id */
	int64_t n_merges;
	uint32_t mrg_mask;
	uint64_t *mrg_key; /* (left << 32 | right), UINT64_MAX empty */
	int32_t *mrg_rank;
	int32_t *mrg_out;
	int32_t byte_tok[256]; /* token for each raw byte, -1 if absent */
	uint32_t byte_cp[256]; /* GPT-2 byte -> code point map */
	int16_t cp_byte[512];  /* its inverse (all mapped code points < 512) */
	int32_t *special;      /* ids matched in raw text, longest first */
	int n_special;
	int32_t eos, bos;
	int32_t *eog;
	int n_eog;
};

/* ---- small helpers ---- */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	return k ^ (k >> 33);
}

static uint32_t table_size(int64_t n)
{
	uint32_t s = 64;
	while (s < 2 * (uint64_t)n)
		s <<= 1;
	return s;
}

/* Strict UTF-8 decoding: one code point and its length, or U+FFFD with
 * length 1 for a byte that does not start a valid sequence. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *adv)
{
	unsigned c = s[0];
	*adv = 1;
	if (c < 0x80)
		return c;
	int k;
	uint32_t cp, min;
	if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; min = 0x80; }
	else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
	else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; min = 0x10000; }
	else return 0xFFFD;
	if ((size_t)k >= n)
		return 0xFFFD;
	for (int i = 1; i <= k; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0xFFFD;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return 0xFFFD;
	*adv = (size_t)k + 1;
	return cp;
}

static int utf8_put(uint32_t cp, char *o)
{
	if (cp < 0x80) { o[0] = (char)cp; return 1; }
	if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
	if (cp < 0x10000) {
		o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
	}
	o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* GPT-2's reversible byte -> printable code point map: printable Latin-1
 * bytes stand for themselves, the others take 256, 257, ... in byte order. */
static void byte_map_init(mcv_tokenizer *t)
{
	int extra = 0;
	for (int b = 0; b < 256; b++) {
		bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
		t->byte_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + extra++);
	}
	for (int i = 0; i < 512; i++)
		t->cp_byte[i] = -1;
	for (int b = 0; b < 256; b++)
		t->cp_byte[t->byte_cp[b]] = (int16_t)b;
}

static const char *tok_str(const mcv_tokenizer *t, int32_t id)
{
	return t->text + t->off[id];
}

static int32_t find_n(const mcv_tokenizer *t, const char *s, size_t n)
{
	if (!t->tok_slot)
		return -1;
	for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->tok_mask;; i = (i + 1) & t->tok_mask) {
		int32_t id = t->tok_slot[i];
		if (id < 0)
			return -1;
		if (t->len[id] == n && memcmp(tok_str(t, id), s, n) == 0)
			return id;
	}
}

static int64_t merge_find(const mcv_tokenizer *t, int32_t a, int32_t b)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (uint32_t i = (uint32_t)hash_pair(k) & t->mrg_mask;; i = (i + 1) & t->mrg_mask) {
		if (t->mrg_key[i] == UINT64_MAX)
			return -1;
		if (t->mrg_key[i] == k)
			return i;
	}
}

/* ---- construction ---- */

void mcv_tokenizer_free(mcv_tokenizer *t)
{
	if (!t)
		return;
	free(t->text);
	free(t->off);
	free(t->len);
	free(t->type);
	free(t->tok_slot);
	free(t->mrg_key);
	free(t->mrg_rank);
	free(t->mrg_out);
	free(t->special);
	free(t->eog);
	free(t);
}

typedef const char *(*str_at_fn)(const void *src, int64_t i, size_t *len);

static const char *arr_at(const void *src, int64_t i, size_t *len)
{
	const char *s = ((const char *const *)src)[i];
	*len = s ? strlen(s) : 0;
	return s ? s : "";
}

struct gguf_src {
	const mcv_gguf *g;
	const char *key;
};

static const char *gguf_at(const void *src, int64_t i, size_t *len)
{
	const struct gguf_src *gs = src;
	const char *s = mcv_gguf_arr_str(gs->g, gs->key, (uint64_t)i, len);
	if (!s) {
		*len = 0;
		return "";
	}
	return s;
}

static int cmp_special(const void *a, const void *b, void *ud)
{
	const mcv_tokenizer *t = ud;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	if (t->len[x] != t->len[y])
		return t->len[x] > t->len[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* qsort_r is a GNU extension; a tiny insertion of the context through a
 * static is avoided so two tokenizers can be built concurrently. */
static void sort_special(mcv_tokenizer *t)
{
	for (int i = 1; i < t->n_special; i++) {
		int32_t v = t->special[i];
		int j = i - 1;
		while (j >= 0 && cmp_special(&t->special[j], &v, t) > 0) {
			t->special[j + 1] = t->special[j];
			j--;
		}
		t->special[j + 1] = v;
	}
}

static int build(mcv_tokenizer **out, str_at_fn tok_at, const void *tsrc,
		 const int32_t *types, int64_t n_tokens, str_at_fn mrg_at,
		 const void *msrc, int64_t n_merges, int pre, int32_t eos,
		 int32_t bos, mcv_error *err)
{
	*out = NULL;
	if (pre != MCV_PRE_QWEN2 && pre != MCV_PRE_QWEN35)
		return mcv_error_set(err, MCV_EUNSUPPORTED, "unsupported pre-tokenizer %d", pre);
	if (n_tokens <= 0 || n_tokens > (1 << 24))
		return mcv_error_set(err, MCV_EFORMAT, "vocabulary size %lld out of range",
				     (long long)n_tokens);
	if (n_merges < 0 || n_merges > (1 << 24))
		return mcv_error_set(err, MCV_EFORMAT, "merge count %lld out of range",
				     (long long)n_merges);
	mcv_tokenizer *t = calloc(1, sizeof *t);
	if (!t)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for the tokenizer");
	t->pre = pre;
	t->n_tokens = n_tokens;
	byte_map_init(t);
	uint64_t total = 0;
	for (int64_t i = 0; i < n_tokens; i++) {
		size_t l;
		tok_at(tsrc, i, &l);
		total += l + 1;
	}
	t->text = malloc(total ? total : 1);
	t->off = malloc(n_tokens * sizeof *t->off);
	t->len = malloc(n_tokens * sizeof *t->len);
	t->type = malloc(n_tokens);
	t->tok_mask = table_size(n_tokens) - 1;
	t->tok_slot = malloc(((size_t)t->tok_mask + 1) * sizeof *t->tok_slot);
	t->mrg_mask = table_size(n_merges) - 1;
	t->mrg_key = malloc(((size_t)t->mrg_mask + 1) * sizeof *t->mrg_key);
	t->mrg_rank = malloc(((size_t)t->mrg_mask + 1) * sizeof *t->mrg_rank);
	t->mrg_out = malloc(((size_t)t->mrg_mask + 1) * sizeof *t->mrg_out);
	t->special = malloc(n_tokens * sizeof *t->special);
	t->eog = malloc(8 * sizeof *t->eog);
	if (!t->text || !t->off || !t->len || !t->type || !t->tok_slot || !t->mrg_key ||
	    !t->mrg_rank || !t->mrg_out || !t->special || !t->eog) {
		mcv_tokenizer_free(t);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for a %lld-token vocabulary",
				     (long long)n_tokens);
	}
	memset(t->tok_slot, 0xFF, ((size_t)t->tok_mask + 1) * sizeof *t->tok_slot);
	memset(t->mrg_key, 0xFF, ((size_t)t->mrg_mask + 1) * sizeof *t->mrg_key);
	uint64_t pos = 0;
	for (int64_t i = 0; i < n_tokens; i++) {
		size_t l;
		const char *s = tok_at(tsrc, i, &l);
		if (l > 0xFFFFFF) {
			mcv_tokenizer_free(t);
			return mcv_error_set(err, MCV_EFORMAT, "token %lld is too long", (long long)i);
		}
		memcpy(t->text + pos, s, l);
		t->text[pos + l] = 0;
		t->off[i] = pos;
		t->len[i] = (uint32_t)l;
		pos += l + 1;
		int ty = types ? types[i] : MCV_TOKEN_NORMAL;
		t->type[i] = (uint8_t)(ty >= 0 && ty <= 6 ? ty : MCV_TOKEN_UNDEFINED);
		uint32_t h = (uint32_t)hash_bytes(s, l) & t->tok_mask;
		for (;; h = (h + 1) & t->tok_mask) {
			int32_t o = t->tok_slot[h];
			if (o < 0)
				break;
			if (t->len[o] == l && memcmp(tok_str(t, o), s, l) == 0) {
				mcv_tokenizer_free(t);
				return mcv_error_set(err, MCV_EFORMAT, "tokens %d and %lld are both '%.40s'",
						     o, (long long)i, s);
			}
		}
		t->tok_slot[h] = (int32_t)i;
	}
	for (int b = 0; b < 256; b++) {
		char u[4];
		t->byte_tok[b] = find_n(t, u, (size_t)utf8_put(t->byte_cp[b], u));
	}
	/* Merges whose parts or result are not tokens can never fire on ids. */
	char *cat = NULL;
	size_t cat_cap = 0;
	for (int64_t r = 0; r < n_merges; r++) {
		size_t l;
		const char *s = mrg_at(msrc, r, &l);
		const char *sp = l > 1 ? memchr(s + 1, ' ', l - 1) : NULL;
		if (!sp) {
			free(cat);
			mcv_tokenizer_free(t);
			return mcv_error_set(err, MCV_EFORMAT, "merge %lld ('%.40s') is not 'left right'",
					     (long long)r, s);
		}
		size_t la = (size_t)(sp - s), lb = l - la - 1;
		int32_t a = find_n(t, s, la), b = find_n(t, sp + 1, lb);
		if (a < 0 || b < 0)
			continue;
		if (la + lb > cat_cap) {
			cat_cap = 2 * (la + lb);
			char *nc = realloc(cat, cat_cap);
			if (!nc) {
				free(cat);
				mcv_tokenizer_free(t);
				return mcv_error_set(err, MCV_ENOMEM, "out of memory");
			}
			cat = nc;
		}
		memcpy(cat, s, la);
		memcpy(cat + la, sp + 1, lb);
		int32_t o = find_n(t, cat, la + lb);
		if (o < 0)
			continue;
		uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
		uint32_t h = (uint32_t)hash_pair(k) & t->mrg_mask;
		while (t->mrg_key[h] != UINT64_MAX && t->mrg_key[h] != k)
			h = (h + 1) & t->mrg_mask;
		if (t->mrg_key[h] == k)
			continue; /* a repeated pair keeps its first (best) rank */
		t->mrg_key[h] = k;
		t->mrg_rank[h] = (int32_t)r;
		t->mrg_out[h] = o;
		t->n_merges++;
	}
	free(cat);
	for (int64_t i = 0; i < n_tokens; i++) {
		int ty = t->type[i];
		if ((ty == MCV_TOKEN_CONTROL || ty == MCV_TOKEN_USER_DEFINED ||
		     ty == MCV_TOKEN_UNKNOWN) && t->len[i] > 0)
			t->special[t->n_special++] = (int32_t)i;
	}
	sort_special(t);
	t->eos = eos >= 0 && eos < n_tokens ? eos : -1;
	t->bos = bos >= 0 && bos < n_tokens ? bos : -1;
	if (t->eos >= 0)
		t->eog[t->n_eog++] = t->eos;
	static const char *const eog_names[] = {
		"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>",
	};
	for (size_t i = 0; i < sizeof eog_names / sizeof *eog_names; i++) {
		int32_t id = mcv_tokenizer_find(t, eog_names[i]);
		if (id >= 0 && id != t->eos && t->type[id] == MCV_TOKEN_CONTROL)
			t->eog[t->n_eog++] = id;
	}
	*out = t;
	return 0;
}

int mcv_tokenizer_init(mcv_tokenizer **out, const char *const *tokens,
		       const int32_t *types, int64_t n_tokens,
		       const char *const *merges, int64_t n_merges, int pre,
		       mcv_error *err)
{
	int32_t eos = -1;
	int rc = build(out, arr_at, tokens, types, n_tokens, arr_at, merges, n_merges,
		       pre, -1, -1, err);
	if (rc == 0 && (eos = mcv_tokenizer_find(*out, "<|endoftext|>")) >= 0) {
		(*out)->eos = eos;
		(*out)->bos = eos;
	}
	return rc;
}

int mcv_tokenizer_load(mcv_tokenizer **out, const mcv_gguf *g, mcv_error *err)
{
	*out = NULL;
	const char *model = NULL, *pre_s = NULL;
	int rc = mcv_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
	if (rc)
		return rc;
	if (strcmp(model, "gpt2") != 0)
		return mcv_error_set(err, MCV_EUNSUPPORTED,
				     "tokenizer model '%.60s' is not supported (only 'gpt2')", model);
	rc = mcv_gguf_get_str(g, "tokenizer.ggml.pre", &pre_s, err);
	if (rc)
		return rc;
	int pre;
	if (strcmp(pre_s, "qwen35") == 0)
		pre = MCV_PRE_QWEN35;
	else if (strcmp(pre_s, "qwen2") == 0)
		pre = MCV_PRE_QWEN2;
	else
		return mcv_error_set(err, MCV_EUNSUPPORTED,
				     "pre-tokenizer '%.60s' is not supported (qwen35, qwen2)", pre_s);
	int et;
	uint64_t n_tok, n_mrg;
	const void *data;
	rc = mcv_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tok, &data, err);
	if (rc)
		return rc;
	if (et != GGUF_STRING)
		return mcv_error_set(err, MCV_EFORMAT, "tokenizer.ggml.tokens is not a string array");
	rc = mcv_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_mrg, &data, err);
	if (rc)
		return rc;
	if (et != GGUF_STRING)
		return mcv_error_set(err, MCV_EFORMAT, "tokenizer.ggml.merges is not a string array");
	const int32_t *types = NULL;
	uint64_t n_ty;
	if (mcv_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
		rc = mcv_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n_ty, &data, err);
		if (rc)
			return rc;
		if (et != GGUF_I32 || n_ty != n_tok)
			return mcv_error_set(err, MCV_EFORMAT,
					     "tokenizer.ggml.token_type is not %llu i32 values",
					     (unsigned long long)n_tok);
		types = data;
	}
	uint32_t eos = UINT32_MAX, bos = UINT32_MAX;
	if (mcv_gguf_find_key(g, "tokenizer.ggml.eos_token_id") >= 0 &&
	    (rc = mcv_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos, err)))
		return rc;
	if (mcv_gguf_find_key(g, "tokenizer.ggml.bos_token_id") >= 0 &&
	    (rc = mcv_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos, err)))
		return rc;
	if (eos != UINT32_MAX && eos >= n_tok)
		return mcv_error_set(err, MCV_EFORMAT, "eos_token_id %u is not below the vocabulary size %llu",
				     eos, (unsigned long long)n_tok);
	struct gguf_src ts = { g, "tokenizer.ggml.tokens" }, ms = { g, "tokenizer.ggml.merges" };
	return build(out, gguf_at, &ts, types, (int64_t)n_tok, gguf_at, &ms, (int64_t)n_mrg, pre,
		     eos == UINT32_MAX ? -1 : (int32_t)eos, bos == UINT32_MAX ? -1 : (int32_t)bos, err);
}

/* ---- queries ---- */

int mcv_tokenizer_n_vocab(const mcv_tokenizer *t) { return (int)t->n_tokens; }
int mcv_tokenizer_n_merges(const mcv_tokenizer *t) { return (int)t->n_merges; }
int32_t mcv_tokenizer_eos(const mcv_tokenizer *t) { return t->eos; }
int32_t mcv_tokenizer_bos(const mcv_tokenizer *t) { return t->bos; }

const char *mcv_tokenizer_text(const mcv_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_tokens ? tok_str(t, id) : NULL;
}

int mcv_tokenizer_type(const mcv_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_tokens ? t->type[id] : MCV_TOKEN_UNDEFINED;
}

int32_t mcv_tokenizer_find(const mcv_tokenizer *t, const char *s)
{
	return find_n(t, s, strlen(s));
}

bool mcv_tokenizer_is_eog(const mcv_tokenizer *t, int32_t id)
{
	for (int i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			return true;
	return false;
}

/* ---- pre-tokenizer ---- */

/* Classes of one code point, as the split rules see them. */
enum { C_SPACE = 1, C_LETTER = 2, C_MARK = 4, C_NUMBER = 8, C_CRLF = 16 };

static int cp_class(uint32_t cp)
{
	int c = 0;
	if (mcv_unicode_is_space(cp))
		c |= C_SPACE;
	if (cp == '\r' || cp == '\n')
		c |= C_CRLF;
	if (mcv_unicode_is_letter(cp))
		c |= C_LETTER;
	else if (mcv_unicode_is_number(cp))
		c |= C_NUMBER;
	else if (mcv_unicode_is_mark(cp))
		c |= C_MARK;
	return c;
}

static uint32_t ascii_lower(uint32_t c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* The rules, tried in order at each position (the regex alternatives):
 *   '(s|t|re|ve|m|ll|d), case-insensitive
 *   [^\r\n\p{L}\p{N}]? W+       W = \p{L} (qwen2) or [\p{L}\p{M}] (qwen35)
 *   \p{N}
 *   ' '? [^\s\p{L}\p{N} (\p{M})]+ [\r\n]*
 *   \s*[\r\n]+  |  \s+(?!\S)  |  \s+
 * Positions and the look-ahead stop at the end of the fragment. */
void mcv_tokenizer_split(int pre, const char *text, size_t len,
			 void (*fn)(const char *word, size_t len, void *ud), void *ud)
{
	const unsigned char *s = (const unsigned char *)text;
	int word = C_LETTER | (pre == MCV_PRE_QWEN35 ? C_MARK : 0);
	int not_other = C_SPACE | C_LETTER | C_NUMBER | (pre == MCV_PRE_QWEN35 ? C_MARK : 0);
	/* A small ring of decoded code points ahead of the cursor would do, but
	 * decoding on demand keeps this allocation-free. */
	size_t pos = 0;
	while (pos < len) {
		size_t a0, a1 = 0, a2 = 0;
		uint32_t c0 = utf8_next(s + pos, len - pos, &a0);
		int k0 = cp_class(c0);
		uint32_t c1 = 0, c2 = 0;
		int k1 = 0;
		bool has1 = pos + a0 < len, has2 = false;
		if (has1) {
			c1 = utf8_next(s + pos + a0, len - pos - a0, &a1);
			k1 = cp_class(c1);
			has2 = pos + a0 + a1 < len;
			if (has2)
				c2 = utf8_next(s + pos + a0 + a1, len - pos - a0 - a1, &a2);
		}
		size_t end = pos;
		if (c0 == '\'' && has1) {
			uint32_t l1 = ascii_lower(c1), l2 = has2 ? ascii_lower(c2) : 0;
			if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd') {
				end = pos + a0 + a1;
			} else if (has2 && ((l1 == 'r' && l2 == 'e') || (l1 == 'v' && l2 == 'e') ||
					    (l1 == 'l' && l2 == 'l'))) {
				end = pos + a0 + a1 + a2;
			}
			if (end > pos) {
				fn(text + pos, end - pos, ud);
				pos = end;
				continue;
			}
		}
		/* letters, with at most one leading non-letter */
		if ((k0 & word) || (!(k0 & (C_CRLF | C_NUMBER | C_LETTER)) && (k1 & word))) {
			end = pos + a0;
			size_t adv;
			while (end < len && (cp_class(utf8_next(s + end, len - end, &adv)) & word))
				end += adv;
			fn(text + pos, end - pos, ud);
			pos = end;
			continue;
		}
		if (k0 & C_NUMBER) {
			fn(text + pos, a0, ud);
			pos += a0;
			continue;
		}
		/* punctuation and symbols, optionally after one space */
		bool other0 = !(k0 & not_other);
		if (other0 || (c0 == ' ' && has1 && !(k1 & not_other))) {
			end = pos + a0;
			size_t adv;
			while (end < len && !(cp_class(utf8_next(s + end, len - end, &adv)) & not_other))
				end += adv;
			while (end < len && (s[end] == '\r' || s[end] == '\n'))
				end++;
			fn(text + pos, end - pos, ud);
			pos = end;
			continue;
		}
		/* whitespace: k0 is C_SPACE here */
		size_t run_end = pos, last_crlf = 0, last_start = pos, adv;
		int n_ws = 0;
		while (run_end < len) {
			uint32_t c = utf8_next(s + run_end, len - run_end, &adv);
			if (!mcv_unicode_is_space(c))
				break;
			last_start = run_end;
			run_end += adv;
			n_ws++;
			if (c == '\r' || c == '\n')
				last_crlf = run_end;
		}
		if (last_crlf)
			end = last_crlf;
		else if (n_ws > 1 && run_end < len)
			end = last_start; /* leave the last space to the next word */
		else
			end = run_end;
		if (end == pos)
			end = pos + a0; /* cannot happen; guarantees progress */
		fn(text + pos, end - pos, ud);
		pos = end;
	}
}

/* ---- BPE ---- */

struct heap_item {
	int32_t rank;
	int32_t left; /* symbol index */
};

struct enc {
	const mcv_tokenizer *t;
	int32_t **ids;
	int *n, *cap;
	int32_t *sym;  /* symbol token ids */
	int32_t *next, *prev;
	struct heap_item *heap;
	size_t sym_cap;
	int nheap;
	int failed;
};

static int push_id(struct enc *e, int32_t id)
{
	if (*e->n == *e->cap) {
		int nc = *e->cap ? 2 * *e->cap : 64;
		int32_t *p = realloc(*e->ids, (size_t)nc * sizeof *p);
		if (!p)
			return -1;
		*e->ids = p;
		*e->cap = nc;
	}
	(*e->ids)[(*e->n)++] = id;
	return 0;
}

static bool heap_less(struct heap_item a, struct heap_item b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.left < b.left);
}

static void heap_push(struct enc *e, struct heap_item it)
{
	int i = e->nheap++;
	while (i > 0) {
		int p = (i - 1) / 2;
		if (!heap_less(it, e->heap[p]))
			break;
		e->heap[i] = e->heap[p];
		i = p;
	}
	e->heap[i] = it;
}

static struct heap_item heap_pop(struct enc *e)
{
	struct heap_item top = e->heap[0], last = e->heap[--e->nheap];
	int i = 0;
	for (;;) {
		int c = 2 * i + 1;
		if (c >= e->nheap)
			break;
		if (c + 1 < e->nheap && heap_less(e->heap[c + 1], e->heap[c]))
			c++;
		if (!heap_less(e->heap[c], last))
			break;
		e->heap[i] = e->heap[c];
		i = c;
	}
	e->heap[i] = last;
	return top;
}

static void try_pair(struct enc *e, int left)
{
	int right = e->next[left];
	if (right < 0)
		return;
	int64_t slot = merge_find(e->t, e->sym[left], e->sym[right]);
	if (slot >= 0)
		heap_push(e, (struct heap_item){ e->t->mrg_rank[slot], left });
}

static void bpe_word(const char *w, size_t n, void *ud)
{
	struct enc *e = ud;
	if (e->failed)
		return;
	const mcv_tokenizer *t = e->t;
	if (n > e->sym_cap) {
		size_t c = 2 * n;
		int32_t *a = realloc(e->sym, c * sizeof *a);
		if (a) e->sym = a;
		int32_t *b = realloc(e->next, c * sizeof *b);
		if (b) e->next = b;
		int32_t *p = realloc(e->prev, c * sizeof *p);
		if (p) e->prev = p;
		struct heap_item *h = realloc(e->heap, 3 * c * sizeof *h); /* m-1 pairs + 2 per merge */
		if (h) e->heap = h;
		if (!a || !b || !p || !h) {
			e->failed = 1;
			return;
		}
		e->sym_cap = c;
	}
	/* A word that is itself one token (common for short words) skips BPE
	 * only when it is also what the merges would produce, which is not
	 * guaranteed, so every word goes through the merges. */
	int m = 0;
	for (size_t i = 0; i < n; i++) {
		int32_t id = t->byte_tok[(uint8_t)w[i]];
		if (id < 0)
			continue; /* a vocabulary without this byte cannot encode it */
		e->sym[m] = id;
		e->prev[m] = m - 1;
		e->next[m] = m + 1;
		m++;
	}
	if (m == 0)
		return;
	e->next[m - 1] = -1;
	e->nheap = 0;
	for (int i = 0; i + 1 < m; i++)
		try_pair(e, i);
	while (e->nheap > 0) {
		struct heap_item it = heap_pop(e);
		int l = it.left, r = e->next[l];
		if (e->sym[l] < 0 || r < 0)
			continue;
		int64_t slot = merge_find(t, e->sym[l], e->sym[r]);
		if (slot < 0 || t->mrg_rank[slot] != it.rank)
			continue; /* stale: a neighbour changed since this was queued */
		e->sym[l] = t->mrg_out[slot];
		e->sym[r] = -1;
		e->next[l] = e->next[r];
		if (e->next[r] >= 0)
			e->prev[e->next[r]] = l;
		if (e->prev[l] >= 0)
			try_pair(e, e->prev[l]);
		try_pair(e, l);
	}
	for (int i = 0; i >= 0; i = e->next[i])
		if (push_id(e, e->sym[i])) {
			e->failed = 1;
			return;
		}
}

struct frag {
	size_t off, len;
	int32_t id; /* special token, or -1 for raw text */
};

int mcv_tokenizer_encode(const mcv_tokenizer *t, const char *text, size_t len,
			 bool parse_special, int32_t **ids, int *n, int *cap,
			 mcv_error *err)
{
	size_t nf = 1, fcap = 16;
	struct frag *f = malloc(fcap * sizeof *f), *g = NULL;
	if (!f)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory while tokenizing");
	f[0] = (struct frag){ 0, len, -1 };
	/* Specials are cut out longest first, each over every raw fragment left
	 * by the longer ones, as llama.cpp partitions the text. */
	for (int si = 0; si < t->n_special && len > 0; si++) {
		int32_t sid = t->special[si];
		if (!parse_special && t->type[sid] != MCV_TOKEN_USER_DEFINED)
			continue;
		const char *st = tok_str(t, sid);
		size_t sl = t->len[sid];
		size_t gn = 0, gcap = nf + 8;
		g = malloc(gcap * sizeof *g);
		if (!g)
			goto oom;
		for (size_t i = 0; i < nf; i++) {
			struct frag fr = f[i];
			if (fr.id >= 0 || fr.len < sl) {
				if (gn == gcap) {
					struct frag *ng = realloc(g, (gcap *= 2) * sizeof *g);
					if (!ng)
						goto oom;
					g = ng;
				}
				g[gn++] = fr;
				continue;
			}
			size_t p = fr.off, end = fr.off + fr.len;
			for (;;) {
				const char *hit = memmem(text + p, end - p, st, sl);
				size_t hp = hit ? (size_t)(hit - text) : end;
				if (gn + 2 >= gcap) {
					struct frag *ng = realloc(g, (gcap *= 2) * sizeof *g);
					if (!ng)
						goto oom;
					g = ng;
				}
				if (hp > p)
					g[gn++] = (struct frag){ p, hp - p, -1 };
				if (!hit)
					break;
				g[gn++] = (struct frag){ hp, sl, sid };
				p = hp + sl;
			}
		}
		free(f);
		f = g;
		g = NULL;
		nf = gn;
	}
	struct enc e = { .t = t, .ids = ids, .n = n, .cap = cap };
	for (size_t i = 0; i < nf && !e.failed; i++) {
		if (f[i].id >= 0)
			e.failed = push_id(&e, f[i].id) != 0;
		else
			mcv_tokenizer_split(t->pre, text + f[i].off, f[i].len, bpe_word, &e);
	}
	free(e.sym);
	free(e.next);
	free(e.prev);
	free(e.heap);
	free(f);
	if (e.failed)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory while tokenizing");
	return 0;
oom:
	free(f);
	free(g);
	return mcv_error_set(err, MCV_ENOMEM, "out of memory while tokenizing");
}

/* ---- decoding ---- */

int mcv_tokenizer_piece(const mcv_tokenizer *t, int32_t id, bool special,
			char *buf, size_t cap)
{
	if (id < 0 || id >= t->n_tokens)
		return -1;
	const char *s = tok_str(t, id);
	size_t l = t->len[id];
	int ty = t->type[id];
	if (ty == MCV_TOKEN_USER_DEFINED ||
	    (special && (ty == MCV_TOKEN_CONTROL || ty == MCV_TOKEN_UNKNOWN))) {
		memcpy(buf, s, l < cap ? l : cap);
		return (int)l;
	}
	if (ty != MCV_TOKEN_NORMAL)
		return 0;
	size_t o = 0, i = 0;
	while (i < l) {
		size_t adv;
		uint32_t cp = utf8_next((const unsigned char *)s + i, l - i, &adv);
		int b = cp < 512 ? t->cp_byte[cp] : -1;
		if (b >= 0) {
			if (o < cap)
				buf[o] = (char)b;
			o++;
		} else {
			/* not a byte-level character: keep its bytes as they are */
			for (size_t k = 0; k < adv; k++, o++)
				if (o < cap)
					buf[o] = s[i + k];
		}
		i += adv;
	}
	return (int)o;
}

int mcv_tokenizer_decode(const mcv_tokenizer *t, const int32_t *ids, int n,
			 bool special, char **out, size_t *len, mcv_error *err)
{
	size_t cap = 64, o = 0;
	char *buf = malloc(cap);
	if (!buf)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory while decoding");
	for (int i = 0; i < n; i++) {
		for (;;) {
			int k = mcv_tokenizer_piece(t, ids[i], special, buf + o, cap - o - 1);
			if (k < 0)
				break;
			if ((size_t)k < cap - o - 1) {
				o += (size_t)k;
				break;
			}
			char *nb = realloc(buf, cap = 2 * cap + (size_t)k);
			if (!nb) {
				free(buf);
				return mcv_error_set(err, MCV_ENOMEM, "out of memory while decoding");
			}
			buf = nb;
		}
	}
	buf[o] = 0;
	*out = buf;
	if (len)
		*len = o;
	return 0;
}

int mcv_token_ids_parse(const char *s, int32_t **ids_out, int *n_out, mcv_error *err)
{
	int cap = 16, n = 0;
	int32_t *ids = malloc((size_t)cap * sizeof *ids);
	if (!ids)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	for (;;) {
		while (*s == ' ')
			s++;
		char *end;
		errno = 0;
		long v = strtol(s, &end, 10);
		if (end == s || errno || v < 0 || v > INT32_MAX) {
			free(ids);
			return mcv_error_set(err, MCV_EINVAL, "'%.64s' is not a list of token ids", s);
		}
		if (n == cap) {
			int32_t *ni = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
			if (!ni) {
				free(ids);
				return mcv_error_set(err, MCV_ENOMEM, "out of memory");
			}
			ids = ni;
		}
		ids[n++] = (int32_t)v;
		s = end;
		while (*s == ' ')
			s++;
		if (!*s)
			break;
		if (*s++ != ',') {
			free(ids);
			return mcv_error_set(err, MCV_EINVAL, "expected ',' at '%.64s'", s - 1);
		}
	}
	*ids_out = ids;
	*n_out = n;
	return 0;
}

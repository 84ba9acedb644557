/* Byte-level BPE tokenizer (GGUF `tokenizer.ggml.model = "gpt2"`) with the
 * Qwen2 / Qwen3.5 pre-tokenizer, as llama.cpp tokenizes these models.
 *
 * Encoding: control and user-defined token texts are cut out of the text
 * first (longest first; control tokens only when parse_special is set), each
 * remaining fragment is split into words by the pre-tokenizer rules, and each
 * word's bytes are merged by rank.  Invalid UTF-8 bytes are kept as single
 * byte tokens, so any byte string round-trips through encode and decode
 * (llama.cpp instead replaces them with U+FFFD before splitting). */
#ifndef MCV_TOKENIZER_H
#define MCV_TOKENIZER_H

#include "gguf.h"
#include "mcv.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* tokenizer.ggml.token_type values (as llama.cpp's llama_token_type). */
enum {
	MCV_TOKEN_UNDEFINED = 0,
	MCV_TOKEN_NORMAL = 1,
	MCV_TOKEN_UNKNOWN = 2,
	MCV_TOKEN_CONTROL = 3,
	MCV_TOKEN_USER_DEFINED = 4,
	MCV_TOKEN_UNUSED = 5,
	MCV_TOKEN_BYTE = 6,
};

/* Pre-tokenizer flavours (tokenizer.ggml.pre). */
enum {
	MCV_PRE_QWEN2 = 1,  /* "qwen2": letters \p{L}+ */
	MCV_PRE_QWEN35 = 2, /* "qwen35": letters and marks [\p{L}\p{M}]+ */
};

typedef struct mcv_tokenizer mcv_tokenizer;

/* From an open GGUF's tokenizer.ggml.* keys.  Strings are copied, so the GGUF
 * may be closed afterwards. */
int mcv_tokenizer_load(mcv_tokenizer **out, const mcv_gguf *g, mcv_error *err);
/* From arrays (tests, tools that build vocabularies).  types may be NULL (all
 * normal); merges are "left right" strings in rank order. */
int mcv_tokenizer_init(mcv_tokenizer **out, const char *const *tokens,
		       const int32_t *types, int64_t n_tokens,
		       const char *const *merges, int64_t n_merges, int pre,
		       mcv_error *err);
void mcv_tokenizer_free(mcv_tokenizer *t);
/* Parse a list of token ids such as "1,2, 3" (what --tokens and the test
 * helpers take).  On success *ids is malloc'd (caller frees) and *n >= 1;
 * a malformed list is MCV_EINVAL with the offending text in the message. */
int mcv_token_ids_parse(const char *s, int32_t **ids, int *n, mcv_error *err);

int mcv_tokenizer_n_vocab(const mcv_tokenizer *t);
int mcv_tokenizer_n_merges(const mcv_tokenizer *t);
/* Token text as stored in the vocabulary (byte-level form), NULL if out of range. */
const char *mcv_tokenizer_text(const mcv_tokenizer *t, int32_t id);
int mcv_tokenizer_type(const mcv_tokenizer *t, int32_t id);
/* Id of the token whose stored text is exactly s, or -1. */
int32_t mcv_tokenizer_find(const mcv_tokenizer *t, const char *s);
int32_t mcv_tokenizer_eos(const mcv_tokenizer *t); /* -1 if none */
int32_t mcv_tokenizer_bos(const mcv_tokenizer *t); /* -1 if none */
/* End of generation: the EOS token, and control tokens such as <|im_end|>
 * and <|endoftext|> that end a turn. */
bool mcv_tokenizer_is_eog(const mcv_tokenizer *t, int32_t id);

/* Append the tokens of text[0..len) to *ids (grown with realloc; *ids may be
 * NULL with *n == 0 and *cap == 0).  Returns 0 or MCV_ENOMEM. */
int mcv_tokenizer_encode(const mcv_tokenizer *t, const char *text, size_t len,
			 bool parse_special, int32_t **ids, int *n, int *cap,
			 mcv_error *err);

/* The bytes token id stands for, written to buf (at most cap bytes, not
 * NUL-terminated).  Returns the full length, which may exceed cap, or -1 for
 * an id out of range.  Control tokens give their text when special is set
 * and nothing otherwise; unused tokens give nothing. */
int mcv_tokenizer_piece(const mcv_tokenizer *t, int32_t id, bool special,
			char *buf, size_t cap);
/* Decode ids into a malloc'ed NUL-terminated string (*len bytes, which may
 * include NULs when the ids decode to them).  Returns 0 or MCV_ENOMEM. */
int mcv_tokenizer_decode(const mcv_tokenizer *t, const int32_t *ids, int n,
			 bool special, char **out, size_t *len, mcv_error *err);

/* Split text into pre-tokenizer words (no special-token handling): calls
 * fn(word, len, ud) for each word in order.  Exposed for tests. */
void mcv_tokenizer_split(int pre, const char *text, size_t len,
			 void (*fn)(const char *word, size_t len, void *ud), void *ud);

#endif

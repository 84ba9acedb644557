/* Prompt templates: the MiniCPM-V 4.7 / Qwen3.5 chat format.
 *
 *   [<|im_start|>system\n{system}<|im_end|>\n]
 *   <|im_start|>user\n{images}{content}<|im_end|>\n
 *   <|im_start|>assistant\n[<think>\n\n</think>\n\n]   (the block when thinking is off)
 *
 * A prompt is a list of segments, text or image slots, so the vision code can
 * put an image's embeddings where its slot is; text segments are tokenized
 * with special tokens parsed (as llama.cpp does for templated prompts). */
#ifndef MCV_CHAT_H
#define MCV_CHAT_H

#include "mcv.h"
#include "tokenizer.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { MCV_SEG_TEXT = 0, MCV_SEG_IMAGE = 1 };

typedef struct mcv_chat_segment {
	int kind;
	char *text;  /* MCV_SEG_TEXT: NUL-terminated (owned); NULL for images */
	size_t len;
	int image;   /* MCV_SEG_IMAGE: index into the caller's image list */
} mcv_chat_segment;

typedef struct mcv_chat {
	mcv_chat_segment *seg;
	int n, cap;
} mcv_chat;

typedef struct mcv_chat_params {
	const char *system; /* NULL or "": no system turn */
	const char *user;   /* the user's text */
	int n_images;       /* image slots placed before the user's text */
	bool think;         /* false: pre-filled empty thinking block */
	bool raw;           /* true: no template, the user text alone */
} mcv_chat_params;

void mcv_chat_init(mcv_chat *c);
void mcv_chat_free(mcv_chat *c);
/* Append text (merged into the previous text segment) or an image slot. */
int mcv_chat_add_text(mcv_chat *c, const char *s, size_t len, mcv_error *err);
int mcv_chat_add_image(mcv_chat *c, int image, mcv_error *err);
/* Build a whole single-turn prompt into an empty c. */
int mcv_chat_build(mcv_chat *c, const mcv_chat_params *p, mcv_error *err);
/* Text only: tokenize every text segment (specials parsed) into *ids;
 * MCV_EINVAL if the prompt has an image slot. */
int mcv_chat_tokenize(const mcv_chat *c, const mcv_tokenizer *t, int32_t **ids,
		      int *n, int *cap, mcv_error *err);

#endif

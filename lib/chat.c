/* Chat template; see chat.h. */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

void mcv_chat_init(mcv_chat *c)
{
	memset(c, 0, sizeof *c);
}

void mcv_chat_free(mcv_chat *c)
{
	for (int i = 0; i < c->n; i++)
		free(c->seg[i].text);
	free(c->seg);
	memset(c, 0, sizeof *c);
}

static mcv_chat_segment *grow(mcv_chat *c, mcv_error *err)
{
	if (c->n == c->cap) {
		int nc = c->cap ? 2 * c->cap : 8;
		mcv_chat_segment *s = realloc(c->seg, (size_t)nc * sizeof *s);
		if (!s) {
			mcv_error_set(err, MCV_ENOMEM, "out of memory for the prompt");
			return NULL;
		}
		c->seg = s;
		c->cap = nc;
	}
	mcv_chat_segment *s = &c->seg[c->n++];
	memset(s, 0, sizeof *s);
	return s;
}

int mcv_chat_add_text(mcv_chat *c, const char *s, size_t len, mcv_error *err)
{
	mcv_chat_segment *last = c->n ? &c->seg[c->n - 1] : NULL;
	if (!last || last->kind != MCV_SEG_TEXT) {
		last = grow(c, err);
		if (!last)
			return MCV_ENOMEM;
		last->kind = MCV_SEG_TEXT;
	}
	char *t = realloc(last->text, last->len + len + 1);
	if (!t)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for the prompt");
	memcpy(t + last->len, s, len);
	last->len += len;
	t[last->len] = 0;
	last->text = t;
	return 0;
}

int mcv_chat_add_image(mcv_chat *c, int image, mcv_error *err)
{
	mcv_chat_segment *s = grow(c, err);
	if (!s)
		return MCV_ENOMEM;
	s->kind = MCV_SEG_IMAGE;
	s->image = image;
	return 0;
}

static int add(mcv_chat *c, const char *s, mcv_error *err)
{
	return mcv_chat_add_text(c, s, strlen(s), err);
}

int mcv_chat_build(mcv_chat *c, const mcv_chat_params *p, mcv_error *err)
{
	const char *user = p->user ? p->user : "";
	int rc = 0;
	if (p->raw) {
		for (int i = 0; i < p->n_images && !rc; i++)
			rc = mcv_chat_add_image(c, i, err);
		return rc ? rc : add(c, user, err);
	}
	if (p->system && *p->system)
		if ((rc = add(c, "<|im_start|>system\n", err)) || (rc = add(c, p->system, err)) ||
		    (rc = add(c, "<|im_end|>\n", err)))
			return rc;
	if ((rc = add(c, "<|im_start|>user\n", err)))
		return rc;
	for (int i = 0; i < p->n_images; i++)
		if ((rc = mcv_chat_add_image(c, i, err)))
			return rc;
	if ((rc = add(c, user, err)) || (rc = add(c, "<|im_end|>\n<|im_start|>assistant\n", err)))
		return rc;
	if (!p->think)
		rc = add(c, "<think>\n\n</think>\n\n", err);
	return rc;
}

int mcv_chat_tokenize(const mcv_chat *c, const mcv_tokenizer *t, int32_t **ids,
		      int *n, int *cap, mcv_error *err)
{
	for (int i = 0; i < c->n; i++) {
		if (c->seg[i].kind != MCV_SEG_TEXT)
			return mcv_error_set(err, MCV_EINVAL, "the prompt has an image slot");
		int rc = mcv_tokenizer_encode(t, c->seg[i].text, c->seg[i].len, true, ids, n, cap, err);
		if (rc)
			return rc;
	}
	return 0;
}

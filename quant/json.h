/* A small bounds-checked JSON reader (DOM) for the configuration files of a
 * Hugging Face checkpoint (config.json, tokenizer.json).  Depth and size are
 * limited; malformed text is an MCV_EFORMAT error with the byte offset. */
#ifndef MCV_JSON_H
#define MCV_JSON_H

#include "mcv.h"
#include <stddef.h>
#include <stdint.h>

enum { MCV_JSON_NULL, MCV_JSON_BOOL, MCV_JSON_NUM, MCV_JSON_STR, MCV_JSON_ARR, MCV_JSON_OBJ };

typedef struct mcv_json {
	int type;
	double num;           /* NUM, BOOL (0/1) */
	char *str;            /* STR (NUL-terminated, unescaped; len bytes) */
	size_t len;
	struct mcv_json *kids; /* ARR / OBJ elements */
	char **keys;          /* OBJ keys, parallel to kids */
	size_t n;
} mcv_json;

int mcv_json_parse(mcv_json **out, const char *text, size_t len, mcv_error *err);
void mcv_json_free(mcv_json *j);
/* Member of an object, or NULL. */
const mcv_json *mcv_json_get(const mcv_json *obj, const char *key);
/* Integer member: 0 and *v set, or -1 when absent or not an integer. */
int mcv_json_int(const mcv_json *obj, const char *key, int64_t *v);
int mcv_json_num(const mcv_json *obj, const char *key, double *v);

#endif

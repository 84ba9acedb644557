/* A small JSON DOM reader (see json.h). */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct P { const char *s, *p, *e; mcv_error *err; } P;

static int bad(P *ps, const char *what)
{
	return mcv_error_set(ps->err, MCV_EFORMAT, "JSON: %s at byte %ld", what, (long)(ps->p - ps->s));
}

static void ws(P *ps)
{
	while (ps->p < ps->e && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int hex4(P *ps, unsigned *v)
{
	if (ps->e - ps->p < 4)
		return bad(ps, "truncated escape");
	*v = 0;
	for (int i = 0; i < 4; i++) {
		char c = *ps->p++;
		*v <<= 4;
		if (c >= '0' && c <= '9') *v |= c - '0';
		else if (c >= 'a' && c <= 'f') *v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F') *v |= c - 'A' + 10;
		else return bad(ps, "bad escape");
	}
	return 0;
}

static int str(P *ps, char **out, size_t *olen)
{
	ps->p++; /* opening quote */
	const char *q = ps->p;
	size_t cap = 0;
	while (q < ps->e && *q != '"') {
		if (*q == '\\')
			q++;
		q++;
		cap++;
	}
	char *o = malloc(cap * 4 + 1);
	if (!o)
		return mcv_error_set(ps->err, MCV_ENOMEM, "out of memory");
	size_t n = 0;
	for (;;) {
		if (ps->p >= ps->e) {
			free(o);
			return bad(ps, "unterminated string");
		}
		unsigned char c = (unsigned char)*ps->p++;
		if (c == '"')
			break;
		if (c < 0x20) {
			free(o);
			return bad(ps, "control character in a string");
		}
		if (c != '\\') {
			o[n++] = (char)c;
			continue;
		}
		if (ps->p >= ps->e) {
			free(o);
			return bad(ps, "unterminated string");
		}
		c = (unsigned char)*ps->p++;
		unsigned cp = c;
		switch (c) {
		case '"': case '\\': case '/': break;
		case 'b': cp = '\b'; break;
		case 'f': cp = '\f'; break;
		case 'n': cp = '\n'; break;
		case 'r': cp = '\r'; break;
		case 't': cp = '\t'; break;
		case 'u': {
			int rc = hex4(ps, &cp);
			if (!rc && cp >= 0xD800 && cp < 0xDC00) {
				unsigned lo = 0;
				if (ps->e - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
					ps->p += 2;
					rc = hex4(ps, &lo);
				}
				if (!rc && (lo < 0xDC00 || lo >= 0xE000))
					rc = bad(ps, "unpaired surrogate");
				cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			} else if (!rc && cp >= 0xDC00 && cp < 0xE000)
				rc = bad(ps, "unpaired surrogate");
			if (rc) {
				free(o);
				return rc;
			}
			break;
		}
		default:
			free(o);
			return bad(ps, "bad escape");
		}
		if (cp < 0x80) o[n++] = (char)cp;
		else if (cp < 0x800) { o[n++] = (char)(0xC0 | cp >> 6); o[n++] = (char)(0x80 | (cp & 63)); }
		else if (cp < 0x10000) { o[n++] = (char)(0xE0 | cp >> 12); o[n++] = (char)(0x80 | (cp >> 6 & 63)); o[n++] = (char)(0x80 | (cp & 63)); }
		else { o[n++] = (char)(0xF0 | cp >> 18); o[n++] = (char)(0x80 | (cp >> 12 & 63)); o[n++] = (char)(0x80 | (cp >> 6 & 63)); o[n++] = (char)(0x80 | (cp & 63)); }
	}
	o[n] = 0;
	*out = o;
	*olen = n;
	return 0;
}

static void clear(mcv_json *j)
{
	if (j->type == MCV_JSON_STR)
		free(j->str);
	for (size_t i = 0; i < j->n; i++) {
		clear(&j->kids[i]);
		if (j->keys)
			free(j->keys[i]);
	}
	free(j->kids);
	free(j->keys);
}

static int value(P *ps, mcv_json *j, int depth)
{
	memset(j, 0, sizeof *j);
	if (depth > MAX_DEPTH)
		return bad(ps, "nesting too deep");
	ws(ps);
	if (ps->p >= ps->e)
		return bad(ps, "unexpected end");
	char c = *ps->p;
	if (c == '"') {
		j->type = MCV_JSON_STR;
		return str(ps, &j->str, &j->len);
	}
	if (c == '{' || c == '[') {
		int obj = c == '{';
		char close = obj ? '}' : ']';
		j->type = obj ? MCV_JSON_OBJ : MCV_JSON_ARR;
		ps->p++;
		ws(ps);
		if (ps->p < ps->e && *ps->p == close) {
			ps->p++;
			return 0;
		}
		size_t cap = 0;
		for (;;) {
			if (j->n == cap) {
				cap = cap ? 2 * cap : 8;
				mcv_json *k = realloc(j->kids, cap * sizeof *k);
				char **ks = obj ? realloc(j->keys, cap * sizeof *ks) : NULL;
				if (k) j->kids = k;
				if (ks) j->keys = ks;
				if (!k || (obj && !ks))
					return mcv_error_set(ps->err, MCV_ENOMEM, "out of memory");
			}
			if (obj) {
				ws(ps);
				size_t kl;
				if (ps->p >= ps->e || *ps->p != '"')
					return bad(ps, "expected a key");
				int rc = str(ps, &j->keys[j->n], &kl);
				if (rc)
					return rc;
				ws(ps);
				if (ps->p >= ps->e || *ps->p != ':') {
					free(j->keys[j->n]);
					return bad(ps, "expected ':'");
				}
				ps->p++;
			}
			int rc = value(ps, &j->kids[j->n], depth + 1);
			j->n++;
			if (rc)
				return rc;
			ws(ps);
			if (ps->p >= ps->e)
				return bad(ps, "unexpected end");
			char d = *ps->p++;
			if (d == close)
				return 0;
			if (d != ',')
				return bad(ps, "expected ',' or a closing bracket");
		}
	}
	static const char *const lit[] = { "true", "false", "null" };
	for (int i = 0; i < 3; i++) {
		size_t l = strlen(lit[i]);
		if ((size_t)(ps->e - ps->p) >= l && !memcmp(ps->p, lit[i], l)) {
			ps->p += l;
			j->type = i < 2 ? MCV_JSON_BOOL : MCV_JSON_NULL;
			j->num = i == 0;
			return 0;
		}
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		char buf[64];
		size_t n = 0;
		while (ps->p < ps->e && strchr("+-0123456789.eE", *ps->p) && n < sizeof buf - 1)
			buf[n++] = *ps->p++;
		buf[n] = 0;
		char *end;
		j->type = MCV_JSON_NUM;
		j->num = strtod(buf, &end);
		if (*end || !isfinite(j->num))
			return bad(ps, "bad number");
		return 0;
	}
	return bad(ps, "unexpected character");
}

int mcv_json_parse(mcv_json **out, const char *text, size_t len, mcv_error *err)
{
	*out = NULL;
	mcv_json *j = calloc(1, sizeof *j);
	if (!j)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	P ps = { text, text, text + len, err };
	int rc = value(&ps, j, 0);
	if (!rc) {
		ws(&ps);
		if (ps.p != ps.e)
			rc = bad(&ps, "text after the value");
	}
	if (rc) {
		mcv_json_free(j);
		return rc;
	}
	*out = j;
	return 0;
}

void mcv_json_free(mcv_json *j)
{
	if (!j)
		return;
	clear(j);
	free(j);
}

const mcv_json *mcv_json_get(const mcv_json *o, const char *key)
{
	if (!o || o->type != MCV_JSON_OBJ)
		return NULL;
	for (size_t i = 0; i < o->n; i++)
		if (!strcmp(o->keys[i], key))
			return &o->kids[i];
	return NULL;
}

int mcv_json_num(const mcv_json *o, const char *key, double *v)
{
	const mcv_json *j = mcv_json_get(o, key);
	if (!j || j->type != MCV_JSON_NUM)
		return -1;
	*v = j->num;
	return 0;
}

int mcv_json_int(const mcv_json *o, const char *key, int64_t *v)
{
	double d;
	if (mcv_json_num(o, key, &d) || d != floor(d) || fabs(d) > 9e15)
		return -1;
	*v = (int64_t)d;
	return 0;
}

/* safetensors reader (see safetensors.h).  The JSON parser below accepts
 * exactly what the header needs: objects, arrays, strings, integers, and
 * (inside __metadata__ or unknown fields, skipped) any JSON value. */
#include "safetensors.h"
#include "quant.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 32
#define MAX_TENSORS (1 << 20)

typedef struct kv { char *key, *val; } kv;

struct mcv_st {
	const uint8_t *base;
	uint64_t size;
	int mapped;
	mcv_st_tensor *t;
	int64_t n, cap;
	kv *meta;
	int n_meta, cap_meta;
	char *strings; /* one arena for names and metadata */
	size_t str_len, str_cap;
};

typedef struct parser {
	const char *start, *p, *end;
	mcv_error *err;
	mcv_st *st;
} parser;

static int fail(parser *ps, const char *what)
{
	return mcv_error_set(ps->err, MCV_EFORMAT, "safetensors header: %s at byte %ld", what,
			     8L + (long)(ps->p - ps->start));
}

static void ws(parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int expect(parser *ps, char c)
{
	ws(ps);
	if (ps->p >= ps->end || *ps->p != c) {
		char m[48];
		snprintf(m, sizeof m, "expected '%c'", c);
		return fail(ps, m);
	}
	ps->p++;
	return 0;
}

static int peek(parser *ps)
{
	ws(ps);
	return ps->p < ps->end ? (unsigned char)*ps->p : -1;
}

static void put_utf8(char *o, size_t *n, unsigned cp)
{
	if (cp < 0x80) o[(*n)++] = (char)cp;
	else if (cp < 0x800) { o[(*n)++] = (char)(0xC0 | cp >> 6); o[(*n)++] = (char)(0x80 | (cp & 63)); }
	else if (cp < 0x10000) { o[(*n)++] = (char)(0xE0 | cp >> 12); o[(*n)++] = (char)(0x80 | (cp >> 6 & 63)); o[(*n)++] = (char)(0x80 | (cp & 63)); }
	else { o[(*n)++] = (char)(0xF0 | cp >> 18); o[(*n)++] = (char)(0x80 | (cp >> 12 & 63)); o[(*n)++] = (char)(0x80 | (cp >> 6 & 63)); o[(*n)++] = (char)(0x80 | (cp & 63)); }
}

static int hex4(parser *ps, unsigned *v)
{
	if (ps->end - ps->p < 4)
		return fail(ps, "truncated \\u escape");
	*v = 0;
	for (int i = 0; i < 4; i++) {
		char c = *ps->p++;
		*v <<= 4;
		if (c >= '0' && c <= '9') *v |= c - '0';
		else if (c >= 'a' && c <= 'f') *v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F') *v |= c - 'A' + 10;
		else return fail(ps, "bad \\u escape");
	}
	return 0;
}

/* A string, unescaped into the arena; *out is an arena offset (the arena may
 * move while parsing).  out NULL: only skip it. */
static int string(parser *ps, size_t *out)
{
	int rc;
	if ((rc = expect(ps, '"')))
		return rc;
	mcv_st *st = ps->st;
	/* unescaped text is never longer than the escaped text */
	size_t room = (size_t)(ps->end - ps->p) + 1;
	if (out && st->str_len + room > st->str_cap) {
		size_t cap = st->str_cap ? st->str_cap : 4096;
		while (cap < st->str_len + room)
			cap *= 2;
		char *s = realloc(st->strings, cap);
		if (!s)
			return mcv_error_set(ps->err, MCV_ENOMEM, "out of memory");
		st->strings = s;
		st->str_cap = cap;
	}
	char *o = out ? st->strings + st->str_len : NULL;
	size_t n = 0;
	for (;;) {
		if (ps->p >= ps->end)
			return fail(ps, "unterminated string");
		unsigned char c = (unsigned char)*ps->p++;
		if (c == '"')
			break;
		if (c < 0x20)
			return fail(ps, "control character in a string");
		if (c != '\\') {
			if (o) o[n++] = (char)c;
			continue;
		}
		if (ps->p >= ps->end)
			return fail(ps, "unterminated string");
		c = (unsigned char)*ps->p++;
		unsigned cp;
		switch (c) {
		case '"': case '\\': case '/': cp = c; break;
		case 'b': cp = '\b'; break;
		case 'f': cp = '\f'; break;
		case 'n': cp = '\n'; break;
		case 'r': cp = '\r'; break;
		case 't': cp = '\t'; break;
		case 'u':
			if ((rc = hex4(ps, &cp)))
				return rc;
			if (cp >= 0xD800 && cp < 0xDC00) {
				unsigned lo;
				if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u')
					return fail(ps, "unpaired surrogate");
				ps->p += 2;
				if ((rc = hex4(ps, &lo)))
					return rc;
				if (lo < 0xDC00 || lo >= 0xE000)
					return fail(ps, "unpaired surrogate");
				cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			} else if (cp >= 0xDC00 && cp < 0xE000)
				return fail(ps, "unpaired surrogate");
			if (cp == 0)
				return fail(ps, "NUL in a string");
			break;
		default:
			return fail(ps, "bad escape");
		}
		if (o) put_utf8(o, &n, cp);
	}
	if (out) {
		o[n++] = 0;
		*out = st->str_len;
		st->str_len += n;
	}
	return 0;
}

/* A non-negative integer that fits in 63 bits. */
static int uint_value(parser *ps, uint64_t *v)
{
	ws(ps);
	if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
		return fail(ps, "expected a non-negative integer");
	uint64_t x = 0;
	int digits = 0;
	while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
		if (x > (UINT64_C(1) << 62) / 10)
			return fail(ps, "integer too large");
		x = x * 10 + (uint64_t)(*ps->p++ - '0');
		digits++;
	}
	if (digits > 1 && ps->p[-digits] == '0')
		return fail(ps, "leading zero in an integer");
	if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
		return fail(ps, "expected an integer");
	*v = x;
	return 0;
}

static int skip_value(parser *ps, int depth)
{
	if (depth > MAX_DEPTH)
		return fail(ps, "nesting too deep");
	int c = peek(ps), rc;
	if (c == '"')
		return string(ps, NULL);
	if (c == '{' || c == '[') {
		int close = c == '{' ? '}' : ']';
		ps->p++;
		if (peek(ps) == close) {
			ps->p++;
			return 0;
		}
		for (;;) {
			if (c == '{') {
				if ((rc = string(ps, NULL)) || (rc = expect(ps, ':')))
					return rc;
			}
			if ((rc = skip_value(ps, depth + 1)))
				return rc;
			int d = peek(ps);
			ps->p++;
			if (d == close)
				return 0;
			if (d != ',')
				return fail(ps, "expected ',' or a closing bracket");
		}
	}
	static const char *const lit[] = { "true", "false", "null" };
	for (int i = 0; i < 3; i++) {
		size_t l = strlen(lit[i]);
		if ((size_t)(ps->end - ps->p) >= l && !memcmp(ps->p, lit[i], l)) {
			ps->p += l;
			return 0;
		}
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		const char *s = ps->p;
		while (ps->p < ps->end && strchr("+-0123456789.eE", *ps->p))
			ps->p++;
		if (ps->p == s + (c == '-'))
			return fail(ps, "bad number");
		return 0;
	}
	return fail(ps, "unexpected character");
}

static const struct { const char *name; int size; int type; } dtypes[] = {
	{ "F64", 8, -1 }, { "F32", 4, MCV_F32 }, { "F16", 2, MCV_F16 }, { "BF16", 2, MCV_BF16 },
	{ "I64", 8, -1 }, { "I32", 4, -1 }, { "I16", 2, -1 }, { "I8", 1, -1 },
	{ "U64", 8, -1 }, { "U32", 4, -1 }, { "U16", 2, -1 }, { "U8", 1, -1 },
	{ "BOOL", 1, -1 }, { "F8_E4M3", 1, -1 }, { "F8_E5M2", 1, -1 },
};

static int tensor_entry(parser *ps, size_t name_off)
{
	mcv_st *st = ps->st;
	int rc;
	if (st->n == st->cap) {
		if (st->n >= MAX_TENSORS)
			return fail(ps, "too many tensors");
		int64_t cap = st->cap ? 2 * st->cap : 256;
		mcv_st_tensor *t = realloc(st->t, cap * sizeof *t);
		if (!t)
			return mcv_error_set(ps->err, MCV_ENOMEM, "out of memory");
		st->t = t;
		st->cap = cap;
	}
	mcv_st_tensor *t = &st->t[st->n];
	memset(t, 0, sizeof *t);
	t->name = (const char *)(uintptr_t)name_off; /* fixed up at the end */
	int have_dtype = 0, have_shape = 0, have_off = 0;
	uint64_t begin = 0, end = 0;
	size_t dtype_off = 0;
	if ((rc = expect(ps, '{')))
		return rc;
	if (peek(ps) == '}')
		return fail(ps, "empty tensor entry");
	for (;;) {
		size_t k;
		if ((rc = string(ps, &k)) || (rc = expect(ps, ':')))
			return rc;
		const char *key = st->strings + k;
		if (!strcmp(key, "dtype")) {
			if ((rc = string(ps, &dtype_off)))
				return rc;
			have_dtype = 1;
		} else if (!strcmp(key, "shape")) {
			if ((rc = expect(ps, '[')))
				return rc;
			t->n_dims = 0;
			if (peek(ps) == ']')
				ps->p++;
			else
				for (;;) {
					uint64_t d;
					if (t->n_dims == MCV_ST_MAX_DIMS)
						return fail(ps, "too many dimensions");
					if ((rc = uint_value(ps, &d)))
						return rc;
					t->shape[t->n_dims++] = (int64_t)d;
					int c = peek(ps);
					ps->p++;
					if (c == ']')
						break;
					if (c != ',')
						return fail(ps, "bad shape");
				}
			have_shape = 1;
		} else if (!strcmp(key, "data_offsets")) {
			if ((rc = expect(ps, '[')) || (rc = uint_value(ps, &begin)) || (rc = expect(ps, ',')) ||
			    (rc = uint_value(ps, &end)) || (rc = expect(ps, ']')))
				return rc;
			have_off = 1;
		} else if ((rc = skip_value(ps, 2)))
			return rc;
		st->str_len = k; /* the key is not kept */
		if (have_dtype && dtype_off >= k) {
			/* keep the dtype string: move it down over the key */
			size_t l = strlen(st->strings + dtype_off) + 1;
			memmove(st->strings + k, st->strings + dtype_off, l);
			dtype_off = k;
			st->str_len = k + l;
		}
		int c = peek(ps);
		ps->p++;
		if (c == '}')
			break;
		if (c != ',')
			return fail(ps, "expected ',' or '}' in a tensor entry");
	}
	const char *nm = st->strings + name_off;
	if (!have_dtype || !have_shape || !have_off)
		return mcv_error_set(ps->err, MCV_EFORMAT, "safetensors: tensor '%s' lacks dtype, shape or data_offsets", nm);
	const char *dt = st->strings + dtype_off;
	int di = -1;
	for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
		if (!strcmp(dt, dtypes[i].name))
			di = (int)i;
	if (di < 0)
		return mcv_error_set(ps->err, MCV_EFORMAT, "safetensors: tensor '%s' has unknown dtype '%s'", nm, dt);
	t->type = dtypes[di].type;
	t->elem_size = dtypes[di].size;
	t->dtype = dtypes[di].name;
	uint64_t bytes = (uint64_t)t->elem_size;
	for (int d = 0; d < t->n_dims; d++) {
		if (t->shape[d] && bytes > (UINT64_C(1) << 62) / (uint64_t)t->shape[d])
			return mcv_error_set(ps->err, MCV_EFORMAT, "safetensors: tensor '%s': shape overflows", nm);
		bytes *= (uint64_t)t->shape[d];
	}
	if (end < begin || end - begin != bytes)
		return mcv_error_set(ps->err, MCV_EFORMAT,
				     "safetensors: tensor '%s': data_offsets [%llu, %llu] do not hold its %llu bytes",
				     nm, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)bytes);
	t->offset = begin;
	t->nbytes = bytes;
	st->n++;
	return 0;
}

static int meta_entry(parser *ps)
{
	mcv_st *st = ps->st;
	int rc;
	if ((rc = expect(ps, '{')))
		return rc;
	if (peek(ps) == '}') {
		ps->p++;
		return 0;
	}
	for (;;) {
		size_t k, v;
		if ((rc = string(ps, &k)) || (rc = expect(ps, ':')))
			return rc;
		if (peek(ps) != '"')
			return fail(ps, "__metadata__ values must be strings");
		if ((rc = string(ps, &v)))
			return rc;
		if (st->n_meta == st->cap_meta) {
			int cap = st->cap_meta ? 2 * st->cap_meta : 16;
			kv *m = realloc(st->meta, cap * sizeof *m);
			if (!m)
				return mcv_error_set(ps->err, MCV_ENOMEM, "out of memory");
			st->meta = m;
			st->cap_meta = cap;
		}
		st->meta[st->n_meta].key = (char *)(uintptr_t)k;
		st->meta[st->n_meta++].val = (char *)(uintptr_t)v;
		int c = peek(ps);
		ps->p++;
		if (c == '}')
			return 0;
		if (c != ',')
			return fail(ps, "expected ',' or '}' in __metadata__");
	}
}

static int by_offset(const void *a, const void *b)
{
	const mcv_st_tensor *x = a, *y = b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const mcv_st_tensor *)a)->name, ((const mcv_st_tensor *)b)->name);
}

static int parse(mcv_st *st, mcv_error *err)
{
	if (st->size < 8)
		return mcv_error_set(err, MCV_EFORMAT, "safetensors: file of %llu bytes is too short",
				     (unsigned long long)st->size);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | st->base[i];
	if (hl < 2 || hl > MCV_ST_MAX_HEADER || hl > st->size - 8)
		return mcv_error_set(err, MCV_EFORMAT, "safetensors: header length %llu does not fit the file of %llu bytes",
				     (unsigned long long)hl, (unsigned long long)st->size);
	const char *h = (const char *)st->base + 8;
	parser ps = { h, h, h + hl, err, st };
	int rc;
	if ((rc = expect(&ps, '{')))
		return rc;
	if (peek(&ps) != '}')
		for (;;) {
			size_t name;
			if ((rc = string(&ps, &name)) || (rc = expect(&ps, ':')))
				return rc;
			if (!strcmp(st->strings + name, "__metadata__"))
				rc = meta_entry(&ps);
			else
				rc = tensor_entry(&ps, name);
			if (rc)
				return rc;
			int c = peek(&ps);
			ps.p++;
			if (c == '}')
				break;
			if (c != ',')
				return fail(&ps, "expected ',' or '}'");
		}
	else
		ps.p++;
	ws(&ps);
	if (ps.p != ps.end)
		return fail(&ps, "text after the header object");
	/* the arena is final: turn offsets into pointers */
	for (int64_t i = 0; i < st->n; i++)
		st->t[i].name = st->strings + (uintptr_t)st->t[i].name;
	for (int i = 0; i < st->n_meta; i++) {
		st->meta[i].key = st->strings + (uintptr_t)st->meta[i].key;
		st->meta[i].val = st->strings + (uintptr_t)st->meta[i].val;
	}
	uint64_t data_size = st->size - 8 - hl;
	const uint8_t *data = st->base + 8 + hl;
	for (int64_t i = 0; i < st->n; i++) {
		mcv_st_tensor *t = &st->t[i];
		if (t->offset > data_size || t->nbytes > data_size - t->offset)
			return mcv_error_set(err, MCV_EFORMAT,
					     "safetensors: tensor '%s' ends at %llu, past the %llu bytes of data (truncated?)",
					     t->name, (unsigned long long)(t->offset + t->nbytes), (unsigned long long)data_size);
		t->data = data + t->offset;
	}
	qsort(st->t, st->n, sizeof *st->t, by_offset);
	for (int64_t i = 1; i < st->n; i++)
		if (st->t[i].nbytes && st->t[i - 1].offset + st->t[i - 1].nbytes > st->t[i].offset)
			return mcv_error_set(err, MCV_EFORMAT, "safetensors: tensors '%s' and '%s' overlap",
					     st->t[i - 1].name, st->t[i].name);
	/* lookups by name (bsearch); duplicates are refused */
	qsort(st->t, st->n, sizeof *st->t, by_name);
	for (int64_t i = 1; i < st->n; i++)
		if (!strcmp(st->t[i - 1].name, st->t[i].name))
			return mcv_error_set(err, MCV_EFORMAT, "safetensors: tensor '%s' appears twice", st->t[i].name);
	return 0;
}

static int open_common(mcv_st **out, mcv_st *st, mcv_error *err)
{
	int rc = parse(st, err);
	if (rc) {
		mcv_st_close(st);
		*out = NULL;
		return rc;
	}
	*out = st;
	return 0;
}

int mcv_st_open_buffer(mcv_st **out, const void *buf, uint64_t size, mcv_error *err)
{
	mcv_st *st = calloc(1, sizeof *st);
	*out = NULL;
	if (!st)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	st->base = buf;
	st->size = size;
	return open_common(out, st, err);
}

int mcv_st_open(mcv_st **out, const char *path, mcv_error *err)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		close(fd);
		return mcv_error_set(err, MCV_EIO, "'%s': not a regular file", path);
	}
	mcv_st *st = calloc(1, sizeof *st);
	if (!st) {
		close(fd);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	st->size = (uint64_t)sb.st_size;
	if (st->size) {
		void *m = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			close(fd);
			free(st);
			return mcv_error_set(err, MCV_EIO, "cannot map '%s': %s", path, strerror(errno));
		}
		st->base = m;
		st->mapped = 1;
	}
	close(fd);
	int rc = open_common(out, st, err);
	if (rc)
		mcv_error_prefix(err, "%s: ", path);
	return rc;
}

void mcv_st_close(mcv_st *st)
{
	if (!st)
		return;
	if (st->mapped)
		munmap((void *)st->base, st->size);
	free(st->t);
	free(st->meta);
	free(st->strings);
	free(st);
}

int64_t mcv_st_n_tensors(const mcv_st *st) { return st->n; }

const mcv_st_tensor *mcv_st_tensor_at(const mcv_st *st, int64_t i)
{
	return i >= 0 && i < st->n ? &st->t[i] : NULL;
}

const mcv_st_tensor *mcv_st_find(const mcv_st *st, const char *name)
{
	mcv_st_tensor key = { .name = name };
	return bsearch(&key, st->t, st->n, sizeof *st->t, by_name);
}

const char *mcv_st_meta(const mcv_st *st, const char *key)
{
	for (int i = 0; i < st->n_meta; i++)
		if (!strcmp(st->meta[i].key, key))
			return st->meta[i].val;
	return NULL;
}

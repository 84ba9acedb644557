/* GGUF reader: the file is mmapped read-only and parsed through a cursor that
 * checks every length against what is left of the file before it trusts it.
 * Keys, strings and numeric arrays are copied into one arena (located by
 * offsets while it grows, turned into pointers at the end); tensor data stays
 * in the mapping and is faulted in only when touched. */
#include "gguf.h"
#include "quant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ggml knows type ids below this; ids above are garbage, not just unsupported. */
#define GGML_TYPE_COUNT_KNOWN 43
#define MAX_STRING ((uint64_t)1 << 30)
#define MAX_ITEMS ((uint64_t)1 << 20) /* n_kv, n_tensors: far above any real model */

typedef struct kv {
	uint64_t key_off;   /* arena offset of the NUL-terminated key */
	uint32_t type;
	uint32_t elem_type; /* arrays */
	uint64_t n;         /* array count, string length */
	uint64_t val_off;   /* arena offset: string bytes, numeric array, string offset table */
	uint64_t raw_off, raw_len; /* the serialized entry in the file */
	union { uint64_t u; int64_t i; double f; float f32; uint8_t b; } v;
} kv;

struct mcv_gguf {
	char *path;
	int fd;
	const uint8_t *map;
	uint64_t size;
	uint32_t version, alignment;
	uint64_t data_offset;
	kv *kvs;
	int64_t n_kv;
	mcv_gguf_tensor *tensors;
	int64_t n_tensors;
	char *arena;
	size_t arena_len, arena_cap;
	int64_t *kv_hash, *t_hash; /* open addressing, index or -1 */
	uint64_t kv_mask, t_mask;
};

static const size_t scalar_size[] = {
	[GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2,
	[GGUF_U32] = 4, [GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1,
	[GGUF_STRING] = 0, [GGUF_ARRAY] = 0, [GGUF_U64] = 8, [GGUF_I64] = 8,
	[GGUF_F64] = 8,
};

const char *mcv_gguf_type_name(int t)
{
	static const char *const names[] = {
		"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
		"string", "array", "u64", "i64", "f64",
	};
	return t >= 0 && t <= GGUF_F64 ? names[t] : "?";
}

static int type_blocks(int type, int *blck, size_t *bytes)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	if (!tt || tt->blck <= 0 || tt->bytes == 0)
		return -1;
	*blck = tt->blck;
	*bytes = tt->bytes;
	return 0;
}

int mcv_gguf_tensor_size(int type, int n_dims, const int64_t *ne,
			 uint64_t *nbytes, mcv_error *err)
{
	if (n_dims < 1 || n_dims > MCV_GGUF_MAX_DIMS)
		return mcv_error_set(err, MCV_EFORMAT, "%d dimensions (must be 1..%d)",
				     n_dims, MCV_GGUF_MAX_DIMS);
	int blck;
	size_t bsz;
	if (type_blocks(type, &blck, &bsz) != 0) {
		if (type >= 0 && type < GGML_TYPE_COUNT_KNOWN)
			return mcv_error_set(err, MCV_EUNSUPPORTED,
					     "ggml type %d is not supported by mcv", type);
		return mcv_error_set(err, MCV_EFORMAT, "invalid ggml type %d", type);
	}
	int64_t nel = 1;
	for (int j = 0; j < n_dims; j++) {
		if (ne[j] < 0)
			return mcv_error_set(err, MCV_EFORMAT, "dimension %d is negative (%" PRId64 ")",
					     j, ne[j]);
		if (__builtin_mul_overflow(nel, ne[j], &nel))
			return mcv_error_set(err, MCV_EFORMAT, "element count overflows at dimension %d", j);
	}
	if (ne[0] % blck != 0)
		return mcv_error_set(err, MCV_EFORMAT,
				     "row of %" PRId64 " elements is not a multiple of the block size %d",
				     ne[0], blck);
	uint64_t n = (uint64_t)(nel / blck);
	if (__builtin_mul_overflow(n, (uint64_t)bsz, &n) || n > (uint64_t)INT64_MAX)
		return mcv_error_set(err, MCV_EFORMAT, "byte size overflows");
	*nbytes = n;
	return 0;
}

/* ---- parsing ---- */

/* Names from a hostile file may hold control bytes; messages must stay one
 * line, so those print as '?'.  Keeps at most 100 bytes. */
typedef struct { char s[104]; } shown;
static shown show(const char *name)
{
	shown r;
	size_t i = 0;
	for (; name[i] && i < 100; i++) {
		unsigned char c = (unsigned char)name[i];
		r.s[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
	}
	r.s[i] = 0;
	return r;
}

typedef struct parser {
	mcv_gguf *g;
	uint64_t pos;
	mcv_error *err;
	char what[160]; /* what is being read, for messages */
	int64_t elem;   /* string array element being read, or -1 */
	char where_buf[200];
} parser;

/* Formatted only when a message needs it: a vocabulary has 250k elements. */
static const char *where(parser *p)
{
	if (p->elem < 0)
		return p->what;
	snprintf(p->where_buf, sizeof p->where_buf, "%s element %" PRId64, p->what, p->elem);
	return p->where_buf;
}

static int truncated(parser *p, uint64_t need)
{
	return mcv_error_set(p->err, MCV_EFORMAT,
			     "%s: needs %" PRIu64 " bytes at offset %" PRIu64 " but the file ends at %" PRIu64
			     " (truncated?)", where(p), need, p->pos, p->g->size);
}

static int take(parser *p, void *dst, uint64_t n)
{
	if (n > p->g->size - p->pos)
		return truncated(p, n);
	memcpy(dst, p->g->map + p->pos, n);
	p->pos += n;
	return 0;
}

static int rd_u32(parser *p, uint32_t *v) { return take(p, v, 4); }
static int rd_u64(parser *p, uint64_t *v) { return take(p, v, 8); }

static uint64_t remaining(const parser *p) { return p->g->size - p->pos; }

/* Reserves n bytes at the end of the arena, aligned to al; returns the offset. */
static int arena_alloc(parser *p, uint64_t n, size_t al, uint64_t *off)
{
	mcv_gguf *g = p->g;
	size_t start = (g->arena_len + al - 1) & ~(al - 1);
	if (n > SIZE_MAX / 2 - start)
		return mcv_error_set(p->err, MCV_ENOMEM, "%s: metadata too large", where(p));
	size_t end = start + n;
	if (end > g->arena_cap) {
		size_t cap = g->arena_cap ? g->arena_cap : 4096;
		while (cap < end)
			cap *= 2;
		char *a = realloc(g->arena, cap);
		if (!a)
			return mcv_error_set(p->err, MCV_ENOMEM, "%s: out of memory (%zu bytes of metadata)",
					     where(p), cap);
		g->arena = a;
		g->arena_cap = cap;
	}
	memset(g->arena + g->arena_len, 0, start - g->arena_len);
	g->arena_len = end;
	*off = start;
	return 0;
}

/* A GGUF string: u64 length then bytes.  Copied with a NUL into the arena. */
static int rd_string(parser *p, uint64_t max, uint64_t *off, uint64_t *len)
{
	int rc = rd_u64(p, len);
	if (rc)
		return rc;
	if (*len >= max || *len >= MAX_STRING)
		return mcv_error_set(p->err, MCV_EFORMAT, "%s: string length %" PRIu64 " is over the limit of %" PRIu64,
				     where(p), *len, (max < MAX_STRING ? max : MAX_STRING) - 1);
	if (*len > remaining(p))
		return mcv_error_set(p->err, MCV_EFORMAT,
				     "%s: string length %" PRIu64 " at offset %" PRIu64 " runs past end of file (size %" PRIu64 ")",
				     where(p), *len, p->pos - 8, p->g->size);
	if ((rc = arena_alloc(p, *len + 1, 1, off)))
		return rc;
	memcpy(p->g->arena + *off, p->g->map + p->pos, *len);
	p->g->arena[*off + *len] = 0;
	p->pos += *len;
	return 0;
}

static uint64_t hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

static int hash_init(int64_t **tab, uint64_t *mask, int64_t n)
{
	uint64_t cap = 16;
	while (cap < (uint64_t)n * 2)
		cap *= 2;
	*tab = malloc(cap * sizeof **tab);
	if (!*tab)
		return -1;
	memset(*tab, 0xff, cap * sizeof **tab);
	*mask = cap - 1;
	return 0;
}

/* Index of the entry whose name (via name_at) equals s, else -1; with
 * insert >= 0 the empty slot found takes that index. */
static int64_t hash_find(int64_t *tab, uint64_t mask, const char *s,
			 const char *(*name_at)(const mcv_gguf *, int64_t),
			 const mcv_gguf *g, int64_t insert)
{
	for (uint64_t h = hash_str(s) & mask;; h = (h + 1) & mask) {
		if (tab[h] < 0) {
			if (insert >= 0)
				tab[h] = insert;
			return -1;
		}
		if (strcmp(name_at(g, tab[h]), s) == 0)
			return tab[h];
	}
}

static const char *kv_name(const mcv_gguf *g, int64_t i) { return g->arena + g->kvs[i].key_off; }
/* During parsing tensor names are still arena offsets, kept in .name as an integer. */
static const char *t_name_parse(const mcv_gguf *g, int64_t i)
{
	return g->arena + (uintptr_t)g->tensors[i].name;
}
static const char *t_name(const mcv_gguf *g, int64_t i) { return g->tensors[i].name; }

static int rd_kv(parser *p, int64_t i)
{
	mcv_gguf *g = p->g;
	kv *e = &g->kvs[i];
	memset(e, 0, sizeof *e);
	e->raw_off = p->pos;
	snprintf(p->what, sizeof p->what, "key %" PRId64, i);
	uint64_t klen;
	int rc = rd_string(p, MAX_STRING, &e->key_off, &klen);
	if (rc)
		return rc;
	const char *key = g->arena + e->key_off;
	if (klen == 0)
		return mcv_error_set(p->err, MCV_EFORMAT, "key %" PRId64 " is empty", i);
	if (strlen(key) != klen)
		return mcv_error_set(p->err, MCV_EFORMAT, "key %" PRId64 " contains a NUL byte", i);
	snprintf(p->what, sizeof p->what, "key '%s'", show(key).s);
	int64_t dup = hash_find(g->kv_hash, g->kv_mask, key, kv_name, g, i);
	if (dup >= 0)
		return mcv_error_set(p->err, MCV_EFORMAT, "duplicate key '%s' (entries %" PRId64 " and %" PRId64 ")",
				     show(key).s, dup, i);
	if ((rc = rd_u32(p, &e->type)))
		return rc;
	if (e->type > GGUF_F64)
		return mcv_error_set(p->err, MCV_EFORMAT, "%s: invalid value type %u", p->what, e->type);
	if (e->type == GGUF_STRING) {
		if ((rc = rd_string(p, MAX_STRING, &e->val_off, &e->n)))
			return rc;
	} else if (e->type == GGUF_ARRAY) {
		if ((rc = rd_u32(p, &e->elem_type)))
			return rc;
		if (e->elem_type == GGUF_ARRAY)
			return mcv_error_set(p->err, MCV_EFORMAT, "%s: nested arrays are not supported", p->what);
		if (e->elem_type > GGUF_F64)
			return mcv_error_set(p->err, MCV_EFORMAT, "%s: invalid array element type %u",
					     p->what, e->elem_type);
		if ((rc = rd_u64(p, &e->n)))
			return rc;
		/* Every element takes at least min_sz bytes of the file. */
		uint64_t min_sz = e->elem_type == GGUF_STRING ? 8 : scalar_size[e->elem_type];
		if (e->n > remaining(p) / min_sz)
			return mcv_error_set(p->err, MCV_EFORMAT,
					     "%s: array count %" PRIu64 " of %s cannot fit in the %" PRIu64 " bytes left",
					     p->what, e->n, mcv_gguf_type_name(e->elem_type), remaining(p));
		if (e->elem_type == GGUF_STRING) {
			/* n+1 arena offsets; string j is [off[j], off[j+1]-1) as the
			 * strings are appended back to back. */
			if ((rc = arena_alloc(p, (e->n + 1) * 8, 8, &e->val_off)))
				return rc;
			uint64_t soff = 0, slen = 0;
			for (uint64_t j = 0; j < e->n; j++) {
				p->elem = (int64_t)j;
				if ((rc = rd_string(p, MAX_STRING, &soff, &slen)))
					return rc;
				memcpy(g->arena + e->val_off + j * 8, &soff, 8);
			}
			p->elem = -1;
			uint64_t end = g->arena_len;
			memcpy(g->arena + e->val_off + e->n * 8, &end, 8);
		} else {
			uint64_t nb = e->n * min_sz;
			if ((rc = arena_alloc(p, nb, 8, &e->val_off)))
				return rc;
			memcpy(g->arena + e->val_off, g->map + p->pos, nb);
			p->pos += nb;
			if (e->elem_type == GGUF_BOOL)
				for (uint64_t j = 0; j < nb; j++)
					if ((uint8_t)g->arena[e->val_off + j] > 1)
						return mcv_error_set(p->err, MCV_EFORMAT,
								     "%s: element %" PRIu64 " is not a bool (%u)",
								     p->what, j, (uint8_t)g->arena[e->val_off + j]);
		}
	} else {
		if ((rc = take(p, &e->v, scalar_size[e->type])))
			return rc;
		if (e->type == GGUF_BOOL && e->v.b > 1)
			return mcv_error_set(p->err, MCV_EFORMAT, "%s: bool value %u", p->what, e->v.b);
	}
	e->raw_len = p->pos - e->raw_off;
	return 0;
}

static int rd_tensor(parser *p, int64_t i)
{
	mcv_gguf *g = p->g;
	mcv_gguf_tensor *t = &g->tensors[i];
	memset(t, 0, sizeof *t);
	snprintf(p->what, sizeof p->what, "tensor %" PRId64 " name", i);
	uint64_t noff, nlen;
	int rc = rd_string(p, MCV_GGUF_MAX_NAME, &noff, &nlen);
	if (rc)
		return rc;
	const char *name = g->arena + noff;
	if (nlen == 0)
		return mcv_error_set(p->err, MCV_EFORMAT, "tensor %" PRId64 " has an empty name", i);
	if (strlen(name) != nlen)
		return mcv_error_set(p->err, MCV_EFORMAT, "tensor %" PRId64 " name contains a NUL byte", i);
	t->name = (const char *)(uintptr_t)noff;
	snprintf(p->what, sizeof p->what, "tensor '%s'", show(name).s);
	int64_t dup = hash_find(g->t_hash, g->t_mask, name, t_name_parse, g, i);
	if (dup >= 0)
		return mcv_error_set(p->err, MCV_EFORMAT, "duplicate tensor name '%s' (tensors %" PRId64 " and %" PRId64 ")",
				     show(name).s, dup, i);
	uint32_t nd, type;
	if ((rc = rd_u32(p, &nd)))
		return rc;
	if (nd < 1 || nd > MCV_GGUF_MAX_DIMS)
		return mcv_error_set(p->err, MCV_EFORMAT, "%s: %u dimensions (must be 1..%d)",
				     p->what, nd, MCV_GGUF_MAX_DIMS);
	t->n_dims = (int)nd;
	for (int j = 0; j < MCV_GGUF_MAX_DIMS; j++)
		t->ne[j] = 1;
	for (uint32_t j = 0; j < nd; j++)
		if ((rc = rd_u64(p, (uint64_t *)&t->ne[j])))
			return rc;
	if ((rc = rd_u32(p, &type)))
		return rc;
	if (type > INT32_MAX)
		return mcv_error_set(p->err, MCV_EFORMAT, "%s: invalid ggml type %u", p->what, type);
	t->type = (int)type;
	if ((rc = mcv_gguf_tensor_size(t->type, t->n_dims, t->ne, &t->nbytes, p->err)))
		return mcv_error_prefix(p->err, "%s", p->what);
	if ((rc = rd_u64(p, &t->offset)))
		return rc;
	if (t->offset % g->alignment)
		return mcv_error_set(p->err, MCV_EFORMAT, "%s: offset %" PRIu64 " is not aligned to %u",
				     p->what, t->offset, g->alignment);
	return 0;
}

static int cmp_range(const void *a, const void *b)
{
	const mcv_gguf_tensor *x = *(mcv_gguf_tensor *const *)a, *y = *(mcv_gguf_tensor *const *)b;
	if (x->file_offset != y->file_offset)
		return x->file_offset < y->file_offset ? -1 : 1;
	return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int check_ranges(parser *p)
{
	mcv_gguf *g = p->g;
	for (int64_t i = 0; i < g->n_tensors; i++) {
		mcv_gguf_tensor *t = &g->tensors[i];
		if (t->offset > g->size - g->data_offset)
			return mcv_error_set(p->err, MCV_EFORMAT,
					     "tensor '%s': offset %" PRIu64 " is beyond end of file (data at %" PRIu64 ", size %" PRIu64 ")",
					     show(t->name).s, t->offset, g->data_offset, g->size);
		t->file_offset = g->data_offset + t->offset;
		if (t->nbytes > g->size - t->file_offset)
			return mcv_error_set(p->err, MCV_EFORMAT,
					     "tensor '%s': data [%" PRIu64 ", %" PRIu64 ") beyond end of file (size %" PRIu64 ")",
					     show(t->name).s, t->file_offset, t->file_offset + t->nbytes, g->size);
		t->data = g->map + t->file_offset;
	}
	if (g->n_tensors < 2)
		return 0;
	mcv_gguf_tensor **ord = malloc(g->n_tensors * sizeof *ord);
	if (!ord)
		return mcv_error_set(p->err, MCV_ENOMEM, "out of memory sorting %" PRId64 " tensors", g->n_tensors);
	for (int64_t i = 0; i < g->n_tensors; i++)
		ord[i] = &g->tensors[i];
	qsort(ord, g->n_tensors, sizeof *ord, cmp_range);
	int rc = 0;
	for (int64_t i = 1; i < g->n_tensors && !rc; i++) {
		const mcv_gguf_tensor *a = ord[i - 1], *b = ord[i];
		/* Empty tensors occupy nothing and cannot collide. */
		if (a->nbytes && b->nbytes && a->file_offset + a->nbytes > b->file_offset)
			rc = mcv_error_set(p->err, MCV_EFORMAT,
					   "tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
					   show(a->name).s, a->offset, a->offset + a->nbytes,
					   show(b->name).s, b->offset, b->offset + b->nbytes);
	}
	free(ord);
	return rc;
}

static int parse(parser *p)
{
	mcv_gguf *g = p->g;
	int rc;
	char magic[4];
	snprintf(p->what, sizeof p->what, "header");
	if (g->size < 24)
		return mcv_error_set(p->err, MCV_EFORMAT, "%s (%" PRIu64 " bytes): too small for a GGUF header",
				     g->size ? "file too short" : "empty file", g->size);
	if ((rc = take(p, magic, 4)))
		return rc;
	if (memcmp(magic, "GGUF", 4) != 0)
		return mcv_error_set(p->err, MCV_EFORMAT, "bad magic (not a GGUF file)");
	if ((rc = rd_u32(p, &g->version)))
		return rc;
	if (g->version != 2 && g->version != 3) {
		if ((g->version & 0xffff) == 0)
			return mcv_error_set(p->err, MCV_EUNSUPPORTED,
					     "GGUF version 0x%08x looks byte-swapped (big-endian file?)", g->version);
		if (g->version == 1)
			return mcv_error_set(p->err, MCV_EUNSUPPORTED, "GGUF version 1 is obsolete and not supported (need 2 or 3)");
		return mcv_error_set(p->err, MCV_EUNSUPPORTED, "GGUF version %u is not supported (need 2 or 3)",
				     g->version);
	}
	uint64_t nt, nkv;
	if ((rc = rd_u64(p, &nt)) || (rc = rd_u64(p, &nkv)))
		return rc;
	/* Smallest entries: a KV with a 1-byte key and a u8 value takes 14
	 * bytes, a tensor info with a 1-byte name and one dimension 33. */
	uint64_t left = remaining(p);
	if (nkv > left / 14)
		return mcv_error_set(p->err, MCV_EFORMAT, "n_kv %" PRIu64 " (key count) cannot fit in a file of %" PRIu64 " bytes",
				     nkv, g->size);
	if (nt > (left - nkv * 14) / 33)
		return mcv_error_set(p->err, MCV_EFORMAT,
				     "n_tensors %" PRIu64 " (tensor count) cannot fit in a file of %" PRIu64 " bytes",
				     nt, g->size);
	/* Both arrays are allocated up front, so a bound keeps a hostile
	 * header from claiming gigabytes. */
	if (nkv > MAX_ITEMS || nt > MAX_ITEMS)
		return mcv_error_set(p->err, MCV_EFORMAT, "%s %" PRIu64 " exceeds the limit %" PRIu64,
				     nkv > MAX_ITEMS ? "n_kv" : "n_tensors", nkv > MAX_ITEMS ? nkv : nt, MAX_ITEMS);
	g->kvs = calloc(nkv ? nkv : 1, sizeof *g->kvs);
	g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors);
	if (!g->kvs || !g->tensors || hash_init(&g->kv_hash, &g->kv_mask, nkv) ||
	    hash_init(&g->t_hash, &g->t_mask, nt))
		return mcv_error_set(p->err, MCV_ENOMEM, "out of memory for %" PRIu64 " keys and %" PRIu64 " tensors",
				     nkv, nt);
	for (uint64_t i = 0; i < nkv; i++) {
		if ((rc = rd_kv(p, (int64_t)i)))
			return rc;
		g->n_kv = (int64_t)i + 1;
	}

	g->alignment = MCV_GGUF_DEFAULT_ALIGNMENT;
	int64_t ai = hash_find(g->kv_hash, g->kv_mask, "general.alignment", kv_name, g, -1);
	if (ai >= 0) {
		const kv *e = &g->kvs[ai];
		if (e->type != GGUF_U32)
			return mcv_error_set(p->err, MCV_EFORMAT, "general.alignment has type %s (must be u32)",
					     mcv_gguf_type_name(e->type));
		uint32_t a = (uint32_t)e->v.u;
		if (a == 0 || (a & (a - 1)) || a > MCV_GGUF_MAX_ALIGNMENT)
			return mcv_error_set(p->err, MCV_EFORMAT,
					     "general.alignment %u is not a power of two in 1..%u", a,
					     MCV_GGUF_MAX_ALIGNMENT);
		g->alignment = a;
	}

	for (uint64_t i = 0; i < nt; i++) {
		if ((rc = rd_tensor(p, (int64_t)i)))
			return rc;
		g->n_tensors = (int64_t)i + 1;
	}
	g->data_offset = (p->pos + g->alignment - 1) & ~(uint64_t)(g->alignment - 1);
	if (nt && g->data_offset > g->size)
		return mcv_error_set(p->err, MCV_EFORMAT,
				     "data section at %" PRIu64 " starts beyond end of file (size %" PRIu64 ")",
				     g->data_offset, g->size);

	/* Offsets become pointers now that the arena has stopped moving. */
	for (int64_t i = 0; i < g->n_tensors; i++)
		g->tensors[i].name = g->arena + (uintptr_t)g->tensors[i].name;
	return check_ranges(p);
}

int mcv_gguf_open(mcv_gguf **out, const char *path, mcv_error *err)
{
	*out = NULL;
	if (!path)
		return mcv_error_set(err, MCV_EINVAL, "no path");
	mcv_gguf *g = calloc(1, sizeof *g);
	if (!g || !(g->path = strdup(path))) {
		free(g);
		return mcv_error_set(err, MCV_ENOMEM, "%s: out of memory", path);
	}
	g->fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	int rc = 0;
	if (g->fd < 0)
		rc = mcv_error_set(err, MCV_EIO, "%s", strerror(errno));
	else if (fstat(g->fd, &st) != 0)
		rc = mcv_error_set(err, MCV_EIO, "%s", strerror(errno));
	else if (S_ISDIR(st.st_mode))
		rc = mcv_error_set(err, MCV_EIO, "%s", strerror(EISDIR));
	else if (!S_ISREG(st.st_mode))
		rc = mcv_error_set(err, MCV_EIO, "not a regular file (cannot be mapped)");
	if (!rc) {
		g->size = (uint64_t)st.st_size;
		if (g->size > 0) {
			void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, g->fd, 0);
			if (m == MAP_FAILED)
				rc = mcv_error_set(err, MCV_EIO, "mmap: %s", strerror(errno));
			else
				g->map = m;
		}
	}
	if (!rc) {
		parser p = { .g = g, .err = err, .elem = -1 };
		rc = parse(&p);
	}
	if (rc) {
		mcv_error_prefix(err, "%s", path);
		mcv_gguf_close(g);
		return rc;
	}
	*out = g;
	return 0;
}

void mcv_gguf_close(mcv_gguf *g)
{
	if (!g)
		return;
	if (g->map)
		munmap((void *)g->map, g->size);
	if (g->fd >= 0)
		close(g->fd);
	free(g->kvs);
	free(g->tensors);
	free(g->kv_hash);
	free(g->t_hash);
	free(g->arena);
	free(g->path);
	free(g);
}

uint32_t mcv_gguf_version(const mcv_gguf *g) { return g->version; }
uint32_t mcv_gguf_alignment(const mcv_gguf *g) { return g->alignment; }
uint64_t mcv_gguf_data_offset(const mcv_gguf *g) { return g->data_offset; }
uint64_t mcv_gguf_file_size(const mcv_gguf *g) { return g->size; }
int mcv_gguf_fd(const mcv_gguf *g) { return g->fd; }
const char *mcv_gguf_path(const mcv_gguf *g) { return g->path; }

/* ---- metadata access ---- */

int64_t mcv_gguf_n_kv(const mcv_gguf *g) { return g->n_kv; }

int64_t mcv_gguf_find_key(const mcv_gguf *g, const char *key)
{
	if (!key)
		return -1;
	return hash_find(g->kv_hash, g->kv_mask, key, kv_name, g, -1);
}

const char *mcv_gguf_key(const mcv_gguf *g, int64_t i)
{
	return i >= 0 && i < g->n_kv ? kv_name(g, i) : NULL;
}

int mcv_gguf_kv_type(const mcv_gguf *g, int64_t i)
{
	return i >= 0 && i < g->n_kv ? (int)g->kvs[i].type : -1;
}

int mcv_gguf_kv_arr_info(const mcv_gguf *g, int64_t i, int *elem_type, uint64_t *n)
{
	*elem_type = 0;
	*n = 0;
	if (i < 0 || i >= g->n_kv)
		return MCV_EINVAL;
	if (g->kvs[i].type == GGUF_ARRAY) {
		*elem_type = (int)g->kvs[i].elem_type;
		*n = g->kvs[i].n;
	}
	return 0;
}

int mcv_gguf_kv_raw(const mcv_gguf *g, int64_t i, const void **p, size_t *n)
{
	if (i < 0 || i >= g->n_kv)
		return MCV_EINVAL;
	*p = g->map + g->kvs[i].raw_off;
	*n = g->kvs[i].raw_len;
	return 0;
}

static const kv *lookup(const mcv_gguf *g, const char *key, mcv_error *err)
{
	int64_t i = mcv_gguf_find_key(g, key);
	if (i < 0) {
		mcv_error_set(err, MCV_ENOTFOUND, "%s: key '%s' not found", g->path, key ? key : "(null)");
		return NULL;
	}
	return &g->kvs[i];
}

static int wrong_type(const mcv_gguf *g, const kv *e, const char *want, mcv_error *err)
{
	return mcv_error_set(err, MCV_EFORMAT, "%s: key '%s' has type %s, expected %s", g->path,
			     g->arena + e->key_off, mcv_gguf_type_name(e->type), want);
}

/* Integer value as (negative?, magnitude) so every source type compares
 * exactly against every target range. */
static int int_value(const kv *e, int *neg, uint64_t *mag)
{
	int64_t s;
	switch (e->type) {
	case GGUF_U8: *neg = 0; *mag = (uint8_t)e->v.u; return 0;
	case GGUF_U16: *neg = 0; *mag = (uint16_t)e->v.u; return 0;
	case GGUF_U32: *neg = 0; *mag = (uint32_t)e->v.u; return 0;
	case GGUF_U64: *neg = 0; *mag = e->v.u; return 0;
	case GGUF_I8: s = (int8_t)e->v.u; break;
	case GGUF_I16: s = (int16_t)e->v.u; break;
	case GGUF_I32: s = (int32_t)e->v.u; break;
	case GGUF_I64: s = e->v.i; break;
	default: return -1;
	}
	*neg = s < 0;
	*mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
	return 0;
}

int mcv_gguf_get_u32(const mcv_gguf *g, const char *key, uint32_t *v, mcv_error *err)
{
	const kv *e = lookup(g, key, err);
	if (!e)
		return MCV_ENOTFOUND;
	int neg;
	uint64_t mag;
	if (int_value(e, &neg, &mag))
		return wrong_type(g, e, "an integer", err);
	if (neg || mag > UINT32_MAX)
		return mcv_error_set(err, MCV_EFORMAT, "%s: key '%s' = %s%" PRIu64 " does not fit u32",
				     g->path, key, neg ? "-" : "", mag);
	*v = (uint32_t)mag;
	return 0;
}

int mcv_gguf_get_i64(const mcv_gguf *g, const char *key, int64_t *v, mcv_error *err)
{
	const kv *e = lookup(g, key, err);
	if (!e)
		return MCV_ENOTFOUND;
	int neg;
	uint64_t mag;
	if (int_value(e, &neg, &mag))
		return wrong_type(g, e, "an integer", err);
	if (!neg && mag > (uint64_t)INT64_MAX)
		return mcv_error_set(err, MCV_EFORMAT, "%s: key '%s' = %" PRIu64 " does not fit i64",
				     g->path, key, mag);
	*v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
	return 0;
}

int mcv_gguf_get_f32(const mcv_gguf *g, const char *key, float *v, mcv_error *err)
{
	const kv *e = lookup(g, key, err);
	if (!e)
		return MCV_ENOTFOUND;
	if (e->type == GGUF_F32)
		*v = e->v.f32;
	else if (e->type == GGUF_F64)
		*v = (float)e->v.f;
	else
		return wrong_type(g, e, "f32", err);
	return 0;
}

int mcv_gguf_get_bool(const mcv_gguf *g, const char *key, bool *v, mcv_error *err)
{
	const kv *e = lookup(g, key, err);
	if (!e)
		return MCV_ENOTFOUND;
	if (e->type != GGUF_BOOL)
		return wrong_type(g, e, "bool", err);
	*v = e->v.b != 0;
	return 0;
}

int mcv_gguf_get_str(const mcv_gguf *g, const char *key, const char **v, mcv_error *err)
{
	const kv *e = lookup(g, key, err);
	if (!e)
		return MCV_ENOTFOUND;
	if (e->type != GGUF_STRING)
		return wrong_type(g, e, "string", err);
	const char *s = g->arena + e->val_off;
	if (strlen(s) != e->n)
		return mcv_error_set(err, MCV_EFORMAT, "%s: key '%s': string contains a NUL byte", g->path, key);
	*v = s;
	return 0;
}

int mcv_gguf_get_arr(const mcv_gguf *g, const char *key, int *elem_type,
		     uint64_t *n, const void **data, mcv_error *err)
{
	const kv *e = lookup(g, key, err);
	if (!e)
		return MCV_ENOTFOUND;
	if (e->type != GGUF_ARRAY)
		return wrong_type(g, e, "array", err);
	*elem_type = (int)e->elem_type;
	*n = e->n;
	/* String arrays are read element by element with mcv_gguf_arr_str. */
	*data = e->elem_type == GGUF_STRING ? NULL : g->arena + e->val_off;
	return 0;
}

const char *mcv_gguf_arr_str(const mcv_gguf *g, const char *key, uint64_t i, size_t *len)
{
	int64_t k = mcv_gguf_find_key(g, key);
	if (k < 0)
		return NULL;
	const kv *e = &g->kvs[k];
	if (e->type != GGUF_ARRAY || e->elem_type != GGUF_STRING || i >= e->n)
		return NULL;
	uint64_t a, b;
	memcpy(&a, g->arena + e->val_off + i * 8, 8);
	memcpy(&b, g->arena + e->val_off + (i + 1) * 8, 8);
	if (len)
		*len = (size_t)(b - a - 1);
	return g->arena + a;
}

/* ---- tensors ---- */

int64_t mcv_gguf_n_tensors(const mcv_gguf *g) { return g->n_tensors; }

const mcv_gguf_tensor *mcv_gguf_tensor_at(const mcv_gguf *g, int64_t i)
{
	return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const mcv_gguf_tensor *mcv_gguf_find_tensor(const mcv_gguf *g, const char *name)
{
	if (!name)
		return NULL;
	int64_t i = hash_find(g->t_hash, g->t_mask, name, t_name, g, -1);
	return i >= 0 ? &g->tensors[i] : NULL;
}

/* GGUF writer: metadata and tensor infos are collected in memory (the header
 * needs their counts and the infos need every size), then the file is one
 * sequential stream through a 1 MiB buffer.  It goes to PATH.tmp.XXXXXX in
 * PATH's directory and is renamed onto PATH only after fsync, so PATH always
 * holds either the old file or the complete new one.  The first error sticks:
 * later calls do nothing and finish reports it and removes the temporary. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define OUT_BUF (1u << 20)

typedef struct wtensor {
	char *name;
	int type, n_dims;
	int64_t ne[MCV_GGUF_MAX_DIMS];
	uint64_t nbytes, offset;
} wtensor;

/* A set of strings with O(1) membership, for duplicate keys and names. */
typedef struct strset {
	char **slot;
	size_t cap, n;
} strset;

struct mcv_gguf_writer {
	char *path, *tmp; /* tmp NULL when streaming to stdout */
	int fd;
	mcv_error err;
	uint32_t alignment;
	int64_t align_pos; /* where general.alignment's value sits in kv, or -1 */
	uint8_t *kv;
	size_t kv_len, kv_cap;
	uint64_t n_kv;
	strset keys, names;
	wtensor *t;
	int64_t n_t, cap_t;
	int started;      /* header written */
	int64_t cur;      /* tensor whose data is being written */
	uint64_t cur_len; /* bytes of it so far */
	uint64_t pos;     /* bytes emitted so far */
	uint8_t *buf;
	size_t buf_len;
};

static uint64_t str_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

static char **set_slot(strset *s, const char *k)
{
	size_t m = s->cap - 1;
	for (size_t h = str_hash(k) & m;; h = (h + 1) & m)
		if (!s->slot[h] || strcmp(s->slot[h], k) == 0)
			return &s->slot[h];
}

/* 1: added (the set keeps k, which the caller allocated), 0: already present,
 * -1: out of memory. */
static int set_add(strset *s, char *k)
{
	if ((s->n + 1) * 2 > s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		strset t = { calloc(cap, sizeof(char *)), cap, s->n };
		if (!t.slot)
			return -1;
		for (size_t i = 0; i < s->cap; i++)
			if (s->slot[i])
				*set_slot(&t, s->slot[i]) = s->slot[i];
		free(s->slot);
		*s = t;
	}
	char **p = set_slot(s, k);
	if (*p)
		return 0;
	*p = k;
	s->n++;
	return 1;
}

static int set_has(const strset *s, const char *k)
{
	return s->cap && *set_slot((strset *)s, k) != NULL;
}

static void set_free(strset *s, int free_keys)
{
	if (free_keys)
		for (size_t i = 0; i < s->cap; i++)
			free(s->slot[i]);
	free(s->slot);
}

__attribute__((format(printf, 3, 4)))
static int fail(mcv_gguf_writer *w, int code, const char *fmt, ...)
{
	if (w->err.code)
		return w->err.code;
	char msg[sizeof w->err.msg];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return mcv_error_set(&w->err, code, "%s: %s", w->path, msg);
}

/* ---- output stream ---- */

static int out_flush(mcv_gguf_writer *w)
{
	size_t off = 0;
	while (off < w->buf_len) {
		ssize_t r = write(w->fd, w->buf + off, w->buf_len - off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			w->buf_len = 0;
			return fail(w, MCV_EIO, "write: %s", r < 0 ? strerror(errno) : "no progress");
		}
		off += (size_t)r;
	}
	w->buf_len = 0;
	return 0;
}

static int out_put(mcv_gguf_writer *w, const void *p, size_t n)
{
	const uint8_t *s = p;
	while (n) {
		if (w->buf_len == OUT_BUF && out_flush(w))
			return w->err.code;
		size_t k = OUT_BUF - w->buf_len;
		if (k > n)
			k = n;
		memcpy(w->buf + w->buf_len, s, k);
		w->buf_len += k;
		w->pos += k;
		s += k;
		n -= k;
	}
	return 0;
}

static int out_pad(mcv_gguf_writer *w)
{
	static const uint8_t zero[256];
	while (w->pos % w->alignment) {
		size_t k = w->alignment - w->pos % w->alignment;
		if (out_put(w, zero, k < sizeof zero ? k : sizeof zero))
			return w->err.code;
	}
	return 0;
}

/* ---- open ---- */

int mcv_gguf_writer_open(mcv_gguf_writer **out, const char *path, mcv_error *err)
{
	*out = NULL;
	if (!path || !*path)
		return mcv_error_set(err, MCV_EINVAL, "no output path");
	mcv_gguf_writer *w = calloc(1, sizeof *w);
	if (!w || !(w->path = strdup(path)) || !(w->buf = malloc(OUT_BUF))) {
		if (w)
			free(w->path);
		free(w);
		return mcv_error_set(err, MCV_ENOMEM, "%s: out of memory", path);
	}
	w->alignment = MCV_GGUF_DEFAULT_ALIGNMENT;
	w->align_pos = -1;
	w->fd = -1;
	if (strcmp(path, "-") == 0) {
		w->fd = STDOUT_FILENO;
		*out = w;
		return 0;
	}
	/* rename() would refuse at the very end, after all the work. */
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		mcv_gguf_writer_abort(w);
		return mcv_error_set(err, MCV_EIO, "%s: %s", path, strerror(EISDIR));
	}
	/* Like mkstemp, but created with 0666 so the umask decides the final
	 * mode exactly as for a plain open(). */
	size_t n = strlen(path) + 16;
	if (!(w->tmp = malloc(n))) {
		mcv_gguf_writer_abort(w);
		return mcv_error_set(err, MCV_ENOMEM, "%s: out of memory", path);
	}
	static const char az[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	for (int tries = 0; tries < 100 && w->fd < 0; tries++) {
		uint8_t r[6];
		if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
			uint64_t x = (uint64_t)getpid() * 2654435761u + (uint64_t)tries * 40503u + (uintptr_t)w;
			memcpy(r, &x, sizeof r);
		}
		char sfx[7];
		for (int i = 0; i < 6; i++)
			sfx[i] = az[r[i] % (sizeof az - 1)];
		sfx[6] = 0;
		snprintf(w->tmp, n, "%s.tmp.%s", path, sfx);
		w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (w->fd < 0 && errno != EEXIST)
			break;
	}
	if (w->fd < 0) {
		int e = errno;
		free(w->tmp);
		w->tmp = NULL;
		mcv_gguf_writer_abort(w);
		return mcv_error_set(err, MCV_EIO, "%s: cannot create temporary file: %s", path, strerror(e));
	}
	*out = w;
	return 0;
}

/* ---- metadata ---- */

static int kv_grow(mcv_gguf_writer *w, size_t n)
{
	if (n <= w->kv_cap - w->kv_len)
		return 0;
	if (n > SIZE_MAX / 4 - w->kv_len)
		return fail(w, MCV_ENOMEM, "metadata too large");
	size_t cap = w->kv_cap ? w->kv_cap : 4096;
	while (cap - w->kv_len < n)
		cap *= 2;
	uint8_t *p = realloc(w->kv, cap);
	if (!p)
		return fail(w, MCV_ENOMEM, "out of memory for %zu bytes of metadata", cap);
	w->kv = p;
	w->kv_cap = cap;
	return 0;
}

static int kv_put(mcv_gguf_writer *w, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (kv_grow(w, n))
		return w->err.code;
	memcpy(w->kv + w->kv_len, p, n);
	w->kv_len += n;
	return 0;
}

static int kv_put_str(mcv_gguf_writer *w, const char *s)
{
	uint64_t n = strlen(s);
	if (kv_put(w, &n, 8) || kv_put(w, s, n))
		return w->err.code;
	return 0;
}

/* Checks state and key, claims the key, writes key and type. */
static int kv_begin(mcv_gguf_writer *w, const char *key, uint32_t type)
{
	if (w->err.code)
		return w->err.code;
	if (!key || !*key)
		return fail(w, MCV_EINVAL, "empty key");
	if (w->started)
		return fail(w, MCV_EINVAL, "key '%s' added after the tensor data began", key);
	char *k = strdup(key);
	int r = k ? set_add(&w->keys, k) : -1;
	if (r <= 0) {
		free(k);
		return r < 0 ? fail(w, MCV_ENOMEM, "out of memory") : fail(w, MCV_EINVAL, "duplicate key '%s'", key);
	}
	w->n_kv++;
	if (kv_put_str(w, key) || kv_put(w, &type, 4))
		return w->err.code;
	return 0;
}

static const size_t elem_size[] = {
	[GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2,
	[GGUF_U32] = 4, [GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1,
	[GGUF_STRING] = 0, [GGUF_ARRAY] = 0, [GGUF_U64] = 8, [GGUF_I64] = 8,
	[GGUF_F64] = 8,
};

int mcv_gguf_w_scalar(mcv_gguf_writer *w, const char *key, int type, const void *v)
{
	if (!w)
		return MCV_EINVAL;
	if (type < 0 || type > GGUF_F64 || !elem_size[type])
		return fail(w, MCV_EINVAL, "key '%s': %s is not a scalar type", key ? key : "",
			    mcv_gguf_type_name(type));
	if (type == GGUF_BOOL && *(const uint8_t *)v > 1)
		return fail(w, MCV_EINVAL, "key '%s': bool value %u", key ? key : "", *(const uint8_t *)v);
	if (kv_begin(w, key, (uint32_t)type))
		return w->err.code;
	return kv_put(w, v, elem_size[type]);
}

int mcv_gguf_w_u32(mcv_gguf_writer *w, const char *key, uint32_t v)
{
	if (w && key && strcmp(key, "general.alignment") == 0) {
		mcv_gguf_writer_set_alignment(w, v);
		return w->err.code;
	}
	return mcv_gguf_w_scalar(w, key, GGUF_U32, &v);
}
int mcv_gguf_w_i32(mcv_gguf_writer *w, const char *key, int32_t v) { return mcv_gguf_w_scalar(w, key, GGUF_I32, &v); }
int mcv_gguf_w_u64(mcv_gguf_writer *w, const char *key, uint64_t v) { return mcv_gguf_w_scalar(w, key, GGUF_U64, &v); }
int mcv_gguf_w_f32(mcv_gguf_writer *w, const char *key, float v) { return mcv_gguf_w_scalar(w, key, GGUF_F32, &v); }

int mcv_gguf_w_bool(mcv_gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v;
	return mcv_gguf_w_scalar(w, key, GGUF_BOOL, &b);
}

int mcv_gguf_w_str(mcv_gguf_writer *w, const char *key, const char *v)
{
	if (!w)
		return MCV_EINVAL;
	if (!v)
		return fail(w, MCV_EINVAL, "key '%s': NULL string", key ? key : "");
	if (kv_begin(w, key, GGUF_STRING))
		return w->err.code;
	return kv_put_str(w, v);
}

int mcv_gguf_w_arr(mcv_gguf_writer *w, const char *key, int elem_type,
		   const void *data, uint64_t n)
{
	if (!w)
		return MCV_EINVAL;
	if (elem_type < 0 || elem_type > GGUF_F64 || !elem_size[elem_type])
		return fail(w, MCV_EINVAL, "key '%s': %s arrays need mcv_gguf_w_arr_str or are not allowed",
			    key ? key : "", mcv_gguf_type_name(elem_type));
	if (n && !data)
		return fail(w, MCV_EINVAL, "key '%s': NULL array data", key ? key : "");
	if (n > SIZE_MAX / 16)
		return fail(w, MCV_EINVAL, "key '%s': array of %" PRIu64 " elements", key ? key : "", n);
	if (elem_type == GGUF_BOOL)
		for (uint64_t i = 0; i < n; i++)
			if (((const uint8_t *)data)[i] > 1)
				return fail(w, MCV_EINVAL, "key '%s': element %" PRIu64 " is not a bool (%u)",
					    key ? key : "", i, ((const uint8_t *)data)[i]);
	uint32_t et = (uint32_t)elem_type;
	if (kv_begin(w, key, GGUF_ARRAY) || kv_put(w, &et, 4) || kv_put(w, &n, 8) ||
	    kv_put(w, data, n * elem_size[elem_type]))
		return w->err.code;
	return 0;
}

int mcv_gguf_w_arr_str(mcv_gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
	if (!w)
		return MCV_EINVAL;
	if (n && !v)
		return fail(w, MCV_EINVAL, "key '%s': NULL array", key ? key : "");
	for (uint64_t i = 0; i < n; i++)
		if (!v[i])
			return fail(w, MCV_EINVAL, "key '%s': element %" PRIu64 " is NULL", key ? key : "", i);
	uint32_t et = GGUF_STRING;
	if (kv_begin(w, key, GGUF_ARRAY) || kv_put(w, &et, 4) || kv_put(w, &n, 8))
		return w->err.code;
	for (uint64_t i = 0; i < n; i++)
		if (kv_put_str(w, v[i]))
			return w->err.code;
	return 0;
}

void mcv_gguf_writer_set_alignment(mcv_gguf_writer *w, uint32_t align)
{
	if (!w || w->err.code)
		return;
	if (align == 0 || (align & (align - 1)) || align > MCV_GGUF_MAX_ALIGNMENT) {
		fail(w, MCV_EINVAL, "alignment %u is not a power of two in 1..%u", align, MCV_GGUF_MAX_ALIGNMENT);
		return;
	}
	if (w->started) {
		fail(w, MCV_EINVAL, "alignment set after the tensor data began");
		return;
	}
	if (w->align_pos >= 0) {
		/* Set twice: the key keeps its first position, the value changes. */
		memcpy(w->kv + w->align_pos, &align, 4);
	} else {
		if (kv_begin(w, "general.alignment", GGUF_U32))
			return;
		w->align_pos = (int64_t)w->kv_len;
		if (kv_put(w, &align, 4))
			return;
	}
	w->alignment = align;
}

int mcv_gguf_w_copy_kv(mcv_gguf_writer *w, const mcv_gguf *src, int64_t i)
{
	if (!w)
		return MCV_EINVAL;
	const void *raw;
	size_t n;
	const char *key = src ? mcv_gguf_key(src, i) : NULL;
	if (!key || mcv_gguf_kv_raw(src, i, &raw, &n) != 0)
		return fail(w, MCV_EINVAL, "copy of key %" PRId64 ": no such key in the source", i);
	int type = mcv_gguf_kv_type(src, i);
	if (strcmp(key, "general.alignment") == 0 && type == GGUF_U32) {
		mcv_gguf_writer_set_alignment(w, mcv_gguf_alignment(src));
		return w->err.code;
	}
	/* The entry is copied whole, so the key and type written by kv_begin
	 * are dropped again. */
	size_t before = w->kv_len;
	if (kv_begin(w, key, (uint32_t)type))
		return w->err.code;
	w->kv_len = before;
	return kv_put(w, raw, n);
}

/* ---- tensors ---- */

int mcv_gguf_w_add_tensor(mcv_gguf_writer *w, const char *name, int type,
			  int n_dims, const int64_t *ne)
{
	if (!w)
		return MCV_EINVAL;
	if (w->err.code)
		return w->err.code;
	if (!name || !*name)
		return fail(w, MCV_EINVAL, "empty tensor name");
	if (strlen(name) >= MCV_GGUF_MAX_NAME)
		return fail(w, MCV_EINVAL, "tensor name '%s' is longer than %d bytes", name, MCV_GGUF_MAX_NAME - 1);
	if (w->started)
		return fail(w, MCV_EINVAL, "tensor '%s' declared after the tensor data began", name);
	if (!ne)
		return fail(w, MCV_EINVAL, "tensor '%s': no shape", name);
	if (set_has(&w->names, name))
		return fail(w, MCV_EINVAL, "duplicate tensor name '%s'", name);
	wtensor t = { .type = type, .n_dims = n_dims };
	mcv_error e = { 0 };
	if (n_dims >= 1 && n_dims <= MCV_GGUF_MAX_DIMS)
		memcpy(t.ne, ne, n_dims * sizeof *ne);
	for (int j = n_dims < 0 ? 0 : n_dims; j < MCV_GGUF_MAX_DIMS; j++)
		t.ne[j] = 1;
	if (mcv_gguf_tensor_size(type, n_dims, t.ne, &t.nbytes, &e))
		return fail(w, e.code == MCV_EUNSUPPORTED ? MCV_EUNSUPPORTED : MCV_EINVAL,
			    "tensor '%s': %s", name, e.msg);
	if (w->n_t == w->cap_t) {
		int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
		wtensor *p = realloc(w->t, (size_t)cap * sizeof *p);
		if (!p)
			return fail(w, MCV_ENOMEM, "out of memory");
		w->t = p;
		w->cap_t = cap;
	}
	if (!(t.name = strdup(name)) || set_add(&w->names, t.name) < 0) {
		free(t.name);
		return fail(w, MCV_ENOMEM, "out of memory");
	}
	w->t[w->n_t++] = t;
	return 0;
}

int mcv_gguf_w_begin_data(mcv_gguf_writer *w)
{
	if (!w)
		return MCV_EINVAL;
	if (w->err.code)
		return w->err.code;
	if (w->started)
		return fail(w, MCV_EINVAL, "begin_data called twice");
	/* llama.cpp wants each offset to be the running sum of the padded sizes. */
	uint64_t off = 0;
	for (int64_t i = 0; i < w->n_t; i++) {
		uint64_t padded = (w->t[i].nbytes + w->alignment - 1) & ~(uint64_t)(w->alignment - 1);
		w->t[i].offset = off;
		if (__builtin_add_overflow(off, padded, &off) || off > (uint64_t)INT64_MAX)
			return fail(w, MCV_EINVAL, "tensor data larger than 2^63 bytes");
	}
	w->started = 1;
	uint32_t version = 3;
	uint64_t nt = (uint64_t)w->n_t;
	if (out_put(w, "GGUF", 4) || out_put(w, &version, 4) || out_put(w, &nt, 8) ||
	    out_put(w, &w->n_kv, 8) || out_put(w, w->kv, w->kv_len))
		return w->err.code;
	for (int64_t i = 0; i < w->n_t; i++) {
		const wtensor *t = &w->t[i];
		uint64_t len = strlen(t->name);
		uint32_t nd = (uint32_t)t->n_dims, type = (uint32_t)t->type;
		if (out_put(w, &len, 8) || out_put(w, t->name, len) || out_put(w, &nd, 4) ||
		    out_put(w, t->ne, nd * 8) || out_put(w, &type, 4) || out_put(w, &t->offset, 8))
			return w->err.code;
	}
	/* The metadata is in the stream now. */
	free(w->kv);
	w->kv = NULL;
	w->kv_len = w->kv_cap = 0;
	w->cur = 0;
	w->cur_len = 0;
	return out_pad(w);
}

static int data_state(mcv_gguf_writer *w)
{
	if (w->err.code)
		return w->err.code;
	if (!w->started)
		return fail(w, MCV_EINVAL, "tensor data written before begin_data");
	if (w->cur >= w->n_t)
		return fail(w, MCV_EINVAL, "tensor data written after the last declared tensor");
	return 0;
}

int mcv_gguf_w_write(mcv_gguf_writer *w, const void *data, size_t n)
{
	if (!w)
		return MCV_EINVAL;
	if (data_state(w))
		return w->err.code;
	const wtensor *t = &w->t[w->cur];
	if (n > t->nbytes - w->cur_len)
		return fail(w, MCV_EINVAL, "tensor '%s': %" PRIu64 " bytes written, more than its size %" PRIu64,
			    t->name, w->cur_len + n, t->nbytes);
	if (n && !data)
		return fail(w, MCV_EINVAL, "tensor '%s': NULL data", t->name);
	w->cur_len += n;
	/* Large writes skip the buffer once it is drained. */
	if (n >= OUT_BUF) {
		if (out_flush(w))
			return w->err.code;
		const uint8_t *s = data;
		while (n) {
			ssize_t r = write(w->fd, s, n);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				return fail(w, MCV_EIO, "write: %s", r < 0 ? strerror(errno) : "no progress");
			s += r;
			n -= (size_t)r;
			w->pos += (uint64_t)r;
		}
		return 0;
	}
	return out_put(w, data, n);
}

int mcv_gguf_w_end_tensor(mcv_gguf_writer *w)
{
	if (!w)
		return MCV_EINVAL;
	if (data_state(w))
		return w->err.code;
	const wtensor *t = &w->t[w->cur];
	if (w->cur_len != t->nbytes)
		return fail(w, MCV_EINVAL, "tensor '%s': %" PRIu64 " bytes written, its size is %" PRIu64,
			    t->name, w->cur_len, t->nbytes);
	w->cur++;
	w->cur_len = 0;
	return out_pad(w);
}

/* ---- finish ---- */

static void writer_free(mcv_gguf_writer *w)
{
	if (w->tmp) {
		if (w->fd >= 0)
			close(w->fd);
		unlink(w->tmp);
	}
	for (int64_t i = 0; i < w->n_t; i++)
		free(w->t[i].name);
	free(w->t);
	set_free(&w->keys, 1);
	set_free(&w->names, 0);
	free(w->kv);
	free(w->buf);
	free(w->tmp);
	free(w->path);
	free(w);
}

static void sync_dir(const char *path)
{
	char *d = strdup(path);
	if (!d)
		return;
	int fd = open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	free(d);
}

int mcv_gguf_writer_finish(mcv_gguf_writer *w, mcv_error *err)
{
	if (!w)
		return mcv_error_set(err, MCV_EINVAL, "no writer");
	if (!w->err.code && !w->started)
		mcv_gguf_w_begin_data(w);
	if (!w->err.code && w->cur < w->n_t)
		fail(w, MCV_EINVAL, "only %" PRId64 " of %" PRId64 " tensors written%s", w->cur, w->n_t,
		     w->cur_len ? " (one partly)" : "");
	if (!w->err.code)
		out_flush(w);
	if (!w->err.code && w->tmp) {
		if (fsync(w->fd) != 0)
			fail(w, MCV_EIO, "fsync: %s", strerror(errno));
		else if (close(w->fd) != 0)
			fail(w, MCV_EIO, "close: %s", strerror(errno));
		w->fd = -1;
		if (!w->err.code && rename(w->tmp, w->path) != 0)
			fail(w, MCV_EIO, "rename from %s: %s", w->tmp, strerror(errno));
		if (!w->err.code) {
			sync_dir(w->path);
			free(w->tmp); /* renamed: nothing left to remove */
			w->tmp = NULL;
		}
	}
	int rc = w->err.code;
	if (rc && err)
		*err = w->err;
	writer_free(w);
	return rc;
}

void mcv_gguf_writer_abort(mcv_gguf_writer *w)
{
	if (w)
		writer_free(w);
}

const mcv_error *mcv_gguf_writer_error(const mcv_gguf_writer *w)
{
	return w && w->err.code ? &w->err : NULL;
}

/* Expert layout of a plain or packed qwen35moe GGUF; see pack.h. */
#include "pack.h"
#include "quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kinds of expert tensor, by name. */
enum { K_GATE = 0, K_UP = 1, K_DOWN = 2, K_GATE_UP = 3, K_N = 4 };
static const char *const kind_name[K_N] = {
	"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps",
};

struct mcv_layout {
	const mcv_gguf *g;
	bool packed, fused;
	char arch[64];
	int L, E, k;
	int64_t H, F;
	mcv_expert_extent *ex;      /* L*E */
	const uint8_t **src;        /* L*E*3 slice pointers into the mapping */
	int *order;                 /* L*E */
	uint64_t *layer_bytes;      /* L */
	uint8_t *is_exp;            /* per tensor */
	int64_t n_nonexp;
	uint64_t nonexp_bytes;
	bool region;
	uint64_t reg_off, reg_bytes;
	uint64_t fp;
};

/* "blk.N.<kind>.weight" (expert -1) or "blk.N.<kind>.E.weight".  Returns the
 * kind, or -1 when the name is not an expert tensor. */
static int parse_name(const char *name, long *layer, long *expert)
{
	if (strncmp(name, "blk.", 4) != 0)
		return -1;
	char *p;
	const char *s = name + 4;
	if (*s < '0' || *s > '9')
		return -1;
	long il = strtol(s, &p, 10);
	if (*p != '.' || il < 0 || il > 1000000)
		return -1;
	s = p + 1;
	for (int k = 0; k < K_N; k++) {
		size_t n = strlen(kind_name[k]);
		if (strncmp(s, kind_name[k], n) != 0 || s[n] != '.')
			continue;
		const char *r = s + n + 1;
		if (strcmp(r, "weight") == 0) {
			*layer = il;
			*expert = -1;
			return k;
		}
		if (*r < '0' || *r > '9')
			return -1;
		long e = strtol(r, &p, 10);
		if (strcmp(p, ".weight") != 0 || e < 0 || e > 1000000)
			return -1;
		*layer = il;
		*expert = e;
		return k;
	}
	return -1;
}

static int get_u32_key(const mcv_gguf *g, const char *arch, const char *suffix,
		       uint32_t *v, mcv_error *err)
{
	char key[160];
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	return mcv_gguf_get_u32(g, key, v, err);
}

static int shape_is(const mcv_gguf_tensor *t, int nd, int64_t a, int64_t b, int64_t c)
{
	return t->n_dims == nd && t->ne[0] == a && t->ne[1] == b && (nd < 3 || t->ne[2] == c);
}

static void slice_of(mcv_expert_slice *s, const mcv_gguf_tensor *t, int64_t row0,
		     int64_t rows, const uint8_t **src)
{
	uint64_t rb = mcv_row_bytes(t->type, t->ne[0]);
	s->type = t->type;
	s->cols = t->ne[0];
	s->rows = rows;
	s->row_bytes = rb;
	s->bytes = rb * (uint64_t)rows;
	s->offset = t->file_offset + rb * (uint64_t)row0;
	*src = (const uint8_t *)t->data + rb * (uint64_t)row0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Logical (plain) description of every tensor, sorted, hashed. */
static int fingerprint(mcv_layout *l, mcv_error *err)
{
	int64_t nt = mcv_gguf_n_tensors(l->g);
	int64_t n = l->n_nonexp + (int64_t)l->L * 3;
	char **v = calloc((size_t)n, sizeof *v);
	if (!v)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	int64_t m = 0;
	int rc = 0;
	for (int64_t i = 0; i < nt && !rc; i++) {
		if (l->is_exp[i])
			continue;
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(l->g, i);
		if (asprintf(&v[m++], "%s:%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64, t->name,
			     t->ne[0], t->ne[1], t->ne[2], t->ne[3]) < 0)
			v[--m] = NULL, rc = MCV_ENOMEM;
	}
	for (int il = 0; il < l->L && !rc; il++) {
		int64_t H = l->H, F = l->F, E = l->E;
		int r1 = l->fused ? asprintf(&v[m++], "blk.%d.ffn_gate_up_exps.weight:%" PRId64 ",%" PRId64 ",%" PRId64 ",1", il, H, 2 * F, E)
				  : asprintf(&v[m++], "blk.%d.ffn_gate_exps.weight:%" PRId64 ",%" PRId64 ",%" PRId64 ",1", il, H, F, E);
		if (r1 < 0) { v[--m] = NULL; rc = MCV_ENOMEM; break; }
		if (!l->fused && asprintf(&v[m++], "blk.%d.ffn_up_exps.weight:%" PRId64 ",%" PRId64 ",%" PRId64 ",1", il, H, F, E) < 0) {
			v[--m] = NULL; rc = MCV_ENOMEM; break;
		}
		if (asprintf(&v[m++], "blk.%d.ffn_down_exps.weight:%" PRId64 ",%" PRId64 ",%" PRId64 ",1", il, F, H, E) < 0) {
			v[--m] = NULL; rc = MCV_ENOMEM; break;
		}
	}
	if (!rc) {
		qsort(v, (size_t)m, sizeof *v, cmp_str);
		uint64_t h = 0xcbf29ce484222325ull;
		h = fnv(h, l->arch, strlen(l->arch) + 1);
		for (int64_t i = 0; i < m; i++)
			h = fnv(h, v[i], strlen(v[i]) + 1);
		l->fp = h;
	}
	for (int64_t i = 0; i < m; i++)
		free(v[i]);
	free(v);
	return rc ? mcv_error_set(err, rc, "out of memory") : 0;
}

static int check_contiguity(mcv_layout *l, mcv_expert_extent *x)
{
	uint64_t fsize = mcv_gguf_file_size(l->g);
	x->contiguous = true;
	for (int s = 1; s < 3; s++) {
		uint64_t end = x->s[s - 1].offset + x->s[s - 1].bytes;
		if (x->s[s].offset < end || x->s[s].offset - end >= MCV_PACK_ALIGN)
			x->contiguous = false;
	}
	if (!x->contiguous) {
		x->aligned = false;
		x->offset = x->bytes = x->read_offset = x->read_bytes = 0;
		return 0;
	}
	x->offset = x->s[0].offset;
	x->bytes = x->s[2].offset + x->s[2].bytes - x->offset;
	x->aligned = x->offset % MCV_PACK_ALIGN == 0;
	x->read_offset = x->offset & ~(uint64_t)(MCV_PACK_ALIGN - 1);
	uint64_t end = (x->offset + x->bytes + MCV_PACK_ALIGN - 1) & ~(uint64_t)(MCV_PACK_ALIGN - 1);
	if (end > fsize)
		end = fsize;
	x->read_bytes = end - x->read_offset;
	return 0;
}

static uint64_t ext_start(const mcv_expert_extent *x)
{
	uint64_t o = x->s[0].offset;
	for (int s = 1; s < 3; s++)
		if (x->s[s].offset < o)
			o = x->s[s].offset;
	return o;
}

typedef struct { uint64_t start; int id; } posrec;
static int cmp_pos(const void *a, const void *b)
{
	const posrec *x = a, *y = b;
	return x->start < y->start ? -1 : x->start > y->start ? 1 : x->id - y->id;
}

/* Storage order from the offsets; for a packed file the stored order key
 * must say the same. */
static int build_order(mcv_layout *l, mcv_error *err)
{
	posrec *pr = malloc((size_t)l->E * sizeof *pr);
	if (!pr)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	for (int il = 0; il < l->L; il++) {
		int *o = l->order + (size_t)il * l->E;
		for (int e = 0; e < l->E; e++)
			pr[e] = (posrec){ ext_start(&l->ex[(size_t)il * l->E + e]), e };
		qsort(pr, (size_t)l->E, sizeof *pr, cmp_pos);
		for (int p = 0; p < l->E; p++) {
			o[p] = pr[p].id;
			l->ex[(size_t)il * l->E + o[p]].position = p;
		}
	}
	free(pr);
	if (!l->packed)
		return 0;
	int et;
	uint64_t n;
	const void *d;
	int rc = mcv_gguf_get_arr(l->g, "mcv.pack.expert_order", &et, &n, &d, err);
	if (rc)
		return rc;
	if ((et != GGUF_I32 && et != GGUF_U32) || n != (uint64_t)l->L * l->E)
		return mcv_error_set(err, MCV_EFORMAT,
				     "mcv.pack.expert_order: expected %d x %d 32-bit integers",
				     l->L, l->E);
	const int32_t *v = d;
	for (int il = 0; il < l->L; il++)
		for (int p = 0; p < l->E; p++)
			if (v[(size_t)il * l->E + p] != l->order[(size_t)il * l->E + p])
				return mcv_error_set(err, MCV_EFORMAT,
						     "mcv.pack.expert_order disagrees with the tensor offsets in layer %d",
						     il);
	return 0;
}

static int build(mcv_layout *l, mcv_error *err)
{
	const mcv_gguf *g = l->g;
	int64_t nt = mcv_gguf_n_tensors(g);
	int rc;
	if (!(l->is_exp = calloc((size_t)nt + 1, 1)))
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");

	/* First pass: is there anything to lay out at all? */
	int64_t n_exp = 0, n_plain = 0;
	for (int64_t i = 0; i < nt; i++) {
		long il, e;
		int k = parse_name(mcv_gguf_tensor_at(g, i)->name, &il, &e);
		if (k < 0)
			continue;
		n_exp++;
		n_plain += e < 0;
	}
	const char *arch = NULL;
	mcv_error e2 = { 0 };
	if (mcv_gguf_get_str(g, "general.architecture", &arch, &e2) != 0)
		arch = NULL;
	snprintf(l->arch, sizeof l->arch, "%s", arch ? arch : "");
	if (n_exp == 0)
		return mcv_error_set(err, MCV_EUNSUPPORTED,
				     "no expert tensors (architecture '%s' is not a mixture of experts)",
				     arch ? arch : "unknown");
	if (!arch)
		return mcv_error_set(err, MCV_ENOTFOUND, "general.architecture is missing");
	l->packed = mcv_gguf_find_key(g, "mcv.pack.version") >= 0;
	if (l->packed) {
		uint32_t ver;
		if ((rc = mcv_gguf_get_u32(g, "mcv.pack.version", &ver, err)))
			return rc;
		if (ver != MCV_PACK_VERSION)
			return mcv_error_set(err, MCV_EUNSUPPORTED, "mcv.pack.version %u (this build reads %d)",
					     ver, MCV_PACK_VERSION);
		if (n_plain)
			return mcv_error_set(err, MCV_EFORMAT, "packed file holds 3-D expert tensors");
	} else if (n_plain != n_exp) {
		return mcv_error_set(err, MCV_EFORMAT, "per-expert tensors in a file without mcv.pack.version");
	}

	uint32_t L, E, H, k = 0;
	if ((rc = get_u32_key(g, arch, "block_count", &L, err)) ||
	    (rc = get_u32_key(g, arch, "expert_count", &E, err)) ||
	    (rc = get_u32_key(g, arch, "embedding_length", &H, err)))
		return rc;
	if (get_u32_key(g, arch, "expert_used_count", &k, &e2) != 0)
		k = 0;
	if (L < 1 || L > 4096 || E < 1 || E > 65536 || H < 1 || k > E)
		return mcv_error_set(err, MCV_EFORMAT, "implausible block_count %u / expert_count %u / "
				     "embedding_length %u / expert_used_count %u", L, E, H, k);
	l->L = (int)L, l->E = (int)E, l->H = H, l->k = (int)k;

	/* Second pass: sort the expert tensors into slots.  Every layer needs
	 * at least two expert tensors (per expert, when packed): this bounds
	 * the allocations below by the tensor count, which the reader has
	 * bounded by the file size. */
	if (n_exp < (l->packed ? 2 * (int64_t)L * E : 2 * (int64_t)L))
		return mcv_error_set(err, MCV_EFORMAT, "%" PRId64 " expert tensors for %u layers of %u experts",
				     n_exp, L, E);
	size_t per = l->packed ? (size_t)L * E * K_N : (size_t)L * K_N;
	const mcv_gguf_tensor **slot = calloc(per, sizeof *slot);
	if (!slot)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	rc = 0;
	for (int64_t i = 0; i < nt && !rc; i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		long il, e;
		int kd = parse_name(t->name, &il, &e);
		if (kd < 0) {
			l->n_nonexp++;
			l->nonexp_bytes += t->nbytes;
			continue;
		}
		l->is_exp[i] = 1;
		if (il >= (long)L || e >= (long)E)
			rc = mcv_error_set(err, MCV_EFORMAT, "tensor %s: layer or expert beyond %u x %u",
					   t->name, L, E);
		else if (slot[l->packed ? ((size_t)il * E + e) * K_N + kd : (size_t)il * K_N + kd])
			/* "blk.01..." and "blk.1..." name the same slot */
			rc = mcv_error_set(err, MCV_EFORMAT, "tensor %s: a second tensor for the same expert slot",
					   t->name);
		else
			slot[l->packed ? ((size_t)il * E + e) * K_N + kd : (size_t)il * K_N + kd] = t;
	}

	/* Shapes first, so that the sizes below are backed by the file. */
	int64_t F = -1;
	for (int il = 0; il < l->L && !rc; il++) {
		for (int e = 0; e < (l->packed ? l->E : 1) && !rc; e++) {
			const mcv_gguf_tensor **s = slot + (l->packed ? ((size_t)il * E + e) * K_N : (size_t)il * K_N);
			char what[96];
			if (l->packed)
				snprintf(what, sizeof what, "blk.%d expert %d", il, e);
			else
				snprintf(what, sizeof what, "blk.%d", il);
			bool fused = s[K_GATE_UP] != NULL;
			if (il == 0 && e == 0)
				l->fused = fused;
			if (fused != l->fused || (fused && (s[K_GATE] || s[K_UP])) ||
			    (!fused && (!s[K_GATE] || !s[K_UP])) || !s[K_DOWN]) {
				rc = mcv_error_set(err, MCV_EFORMAT, "%s: expected %s", what,
						   l->fused ? "ffn_gate_up_exps and ffn_down_exps"
							    : "ffn_gate_exps, ffn_up_exps and ffn_down_exps");
				break;
			}
			const mcv_gguf_tensor *gt = fused ? s[K_GATE_UP] : s[K_GATE];
			int64_t f = fused ? gt->ne[1] / 2 : gt->ne[1];
			if (F < 0)
				F = f;
			int nd = l->packed ? 2 : 3;
			bool ok = f == F && f > 0 &&
				  (fused ? shape_is(gt, nd, H, 2 * F, E)
					 : shape_is(gt, nd, H, F, E) && shape_is(s[K_UP], nd, H, F, E)) &&
				  shape_is(s[K_DOWN], nd, F, H, E);
			if (!ok) {
				rc = mcv_error_set(err, MCV_EFORMAT,
						   "%s: expert tensors are not [H, F%s] / [F, H%s] with H %u, E %u",
						   what, l->packed ? "" : ", E", l->packed ? "" : ", E", H, E);
				break;
			}
		}
	}
	if (!rc) {
		l->ex = calloc((size_t)L * E, sizeof *l->ex);
		l->src = calloc((size_t)L * E * 3, sizeof *l->src);
		l->order = calloc((size_t)L * E, sizeof *l->order);
		l->layer_bytes = calloc(L, sizeof *l->layer_bytes);
		if (!l->ex || !l->src || !l->order || !l->layer_bytes)
			rc = mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	/* The slices. */
	for (int il = 0; il < l->L && !rc; il++) {
		for (int e = 0; e < (l->packed ? l->E : 1); e++) {
			const mcv_gguf_tensor **s = slot + (l->packed ? ((size_t)il * E + e) * K_N : (size_t)il * K_N);
			bool fused = l->fused;
			const mcv_gguf_tensor *gt = fused ? s[K_GATE_UP] : s[K_GATE];
			for (int x = 0; x < (l->packed ? 1 : l->E); x++) {
				int ex = l->packed ? e : x;
				size_t j = (size_t)il * E + ex;
				mcv_expert_extent *xt = &l->ex[j];
				int64_t r0 = l->packed ? 0 : (int64_t)x;
				if (fused) {
					slice_of(&xt->s[0], gt, r0 * 2 * F, F, &l->src[j * 3]);
					slice_of(&xt->s[1], gt, r0 * 2 * F + F, F, &l->src[j * 3 + 1]);
				} else {
					slice_of(&xt->s[0], gt, r0 * F, F, &l->src[j * 3]);
					slice_of(&xt->s[1], s[K_UP], r0 * F, F, &l->src[j * 3 + 1]);
				}
				slice_of(&xt->s[2], s[K_DOWN], r0 * H, H, &l->src[j * 3 + 2]);
				check_contiguity(l, xt);
				l->layer_bytes[il] += xt->s[0].bytes + xt->s[1].bytes + xt->s[2].bytes;
			}
		}
	}
	free(slot);
	if (rc)
		return rc;
	l->F = F;
	if ((rc = build_order(l, err)))
		return rc;

	/* Non-expert region: one range before every expert, or none. */
	uint64_t max_end = mcv_gguf_data_offset(g), min_exp = UINT64_MAX;
	for (int64_t i = 0; i < nt; i++) {
		const mcv_gguf_tensor *t = mcv_gguf_tensor_at(g, i);
		if (l->is_exp[i]) {
			if (t->file_offset < min_exp)
				min_exp = t->file_offset;
		} else if (t->file_offset + t->nbytes > max_end) {
			max_end = t->file_offset + t->nbytes;
		}
	}
	if (max_end <= min_exp) {
		l->region = true;
		l->reg_off = mcv_gguf_data_offset(g) & ~(uint64_t)(MCV_PACK_ALIGN - 1);
		uint64_t end = (max_end + MCV_PACK_ALIGN - 1) & ~(uint64_t)(MCV_PACK_ALIGN - 1);
		if (end > mcv_gguf_file_size(g))
			end = mcv_gguf_file_size(g);
		l->reg_bytes = end - l->reg_off;
	}
	return fingerprint(l, err);
}

int mcv_layout_open(mcv_layout **out, const mcv_gguf *g, mcv_error *err)
{
	*out = NULL;
	if (!g)
		return mcv_error_set(err, MCV_EINVAL, "no file");
	mcv_layout *l = calloc(1, sizeof *l);
	if (!l)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	l->g = g;
	int rc = build(l, err);
	if (rc) {
		mcv_layout_free(l);
		return rc;
	}
	*out = l;
	return 0;
}

void mcv_layout_free(mcv_layout *l)
{
	if (!l)
		return;
	free(l->ex);
	free(l->src);
	free(l->order);
	free(l->layer_bytes);
	free(l->is_exp);
	free(l);
}

const mcv_gguf *mcv_layout_gguf(const mcv_layout *l) { return l->g; }
bool mcv_layout_packed(const mcv_layout *l) { return l->packed; }
bool mcv_layout_fused(const mcv_layout *l) { return l->fused; }
const char *mcv_layout_arch(const mcv_layout *l) { return l->arch; }
int mcv_layout_n_layer(const mcv_layout *l) { return l->L; }
int mcv_layout_n_expert(const mcv_layout *l) { return l->E; }
int mcv_layout_n_expert_used(const mcv_layout *l) { return l->k; }
int64_t mcv_layout_n_embd(const mcv_layout *l) { return l->H; }
int64_t mcv_layout_n_ff(const mcv_layout *l) { return l->F; }
uint64_t mcv_layout_fingerprint(const mcv_layout *l) { return l->fp; }
int64_t mcv_layout_n_nonexpert(const mcv_layout *l) { return l->n_nonexp; }
uint64_t mcv_layout_nonexpert_bytes(const mcv_layout *l) { return l->nonexp_bytes; }

const mcv_expert_extent *mcv_layout_expert(const mcv_layout *l, int il, int e)
{
	if (il < 0 || il >= l->L || e < 0 || e >= l->E)
		return NULL;
	return &l->ex[(size_t)il * l->E + e];
}

const void *mcv_layout_slice_data(const mcv_layout *l, int il, int e, int s)
{
	if (il < 0 || il >= l->L || e < 0 || e >= l->E || s < 0 || s > 2)
		return NULL;
	return l->src[((size_t)il * l->E + e) * 3 + s];
}

const int *mcv_layout_order(const mcv_layout *l, int il)
{
	if (il < 0 || il >= l->L)
		return NULL;
	return l->order + (size_t)il * l->E;
}

uint64_t mcv_layout_layer_bytes(const mcv_layout *l, int il)
{
	return il < 0 || il >= l->L ? 0 : l->layer_bytes[il];
}

bool mcv_layout_is_expert_tensor(const mcv_layout *l, int64_t i)
{
	return i >= 0 && i < mcv_gguf_n_tensors(l->g) && l->is_exp[i];
}

bool mcv_layout_nonexpert_region(const mcv_layout *l, uint64_t *off, uint64_t *bytes)
{
	*off = l->region ? l->reg_off : 0;
	*bytes = l->region ? l->reg_bytes : 0;
	return l->region;
}

int mcv_layout_compare(const mcv_layout *a, const mcv_layout *b, mcv_error *err)
{
	if (a->L != b->L || a->E != b->E || a->H != b->H || a->F != b->F)
		return mcv_error_set(err, MCV_EFORMAT, "different shapes: %d x %d experts vs %d x %d",
				     a->L, a->E, b->L, b->E);
	if (a->n_nonexp != b->n_nonexp)
		return mcv_error_set(err, MCV_EFORMAT, "%" PRId64 " vs %" PRId64 " non-expert tensors",
				     a->n_nonexp, b->n_nonexp);
	static const char *const sn[3] = { "gate", "up", "down" };
	for (int il = 0; il < a->L; il++)
		for (int e = 0; e < a->E; e++)
			for (int s = 0; s < 3; s++) {
				const mcv_expert_slice *x = &a->ex[(size_t)il * a->E + e].s[s];
				const mcv_expert_slice *y = &b->ex[(size_t)il * b->E + e].s[s];
				if (x->type != y->type || x->rows != y->rows || x->cols != y->cols ||
				    memcmp(mcv_layout_slice_data(a, il, e, s),
					   mcv_layout_slice_data(b, il, e, s), x->bytes) != 0)
					return mcv_error_set(err, MCV_EFORMAT,
							     "layer %d expert %d %s differs", il, e, sn[s]);
			}
	int64_t nt = mcv_gguf_n_tensors(a->g);
	for (int64_t i = 0; i < nt; i++) {
		if (a->is_exp[i])
			continue;
		const mcv_gguf_tensor *x = mcv_gguf_tensor_at(a->g, i);
		const mcv_gguf_tensor *y = mcv_gguf_find_tensor(b->g, x->name);
		if (!y)
			return mcv_error_set(err, MCV_EFORMAT, "tensor %s is missing", x->name);
		if (x->type != y->type || x->nbytes != y->nbytes ||
		    memcmp(x->ne, y->ne, sizeof x->ne) != 0 || memcmp(x->data, y->data, x->nbytes) != 0)
			return mcv_error_set(err, MCV_EFORMAT, "tensor %s differs", x->name);
	}
	return 0;
}

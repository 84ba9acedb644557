/* Archives via libarchive: every format and filter it knows, read as a
 * stream (so stdin works), one record per regular member.  Member bytes are
 * read only as far as max_bytes; non-images only as far as their magic. */
#include "media_impl.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { AR_READY, AR_ENDED };

struct mcv_archive {
	struct archive *ar;
	mcv_media_limits lim;
	int fd;           /* ours to close, or -1 */
	int state;
	int opened;       /* archive_read_open succeeded */
	mcv_error open_err; /* reported by the first mcv_archive_next */
	long n_seen;      /* regular members returned so far */
	uint8_t *buf;
	size_t cap;
	char *name;
};

static int ar_new(mcv_archive **out, const mcv_media_limits *lim, mcv_error *err)
{
	*out = NULL;
	mcv_archive *a = calloc(1, sizeof *a);
	if (!a || !(a->ar = archive_read_new())) {
		free(a);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory opening an archive");
	}
	a->fd = -1;
	a->lim = mcv_media_limits_resolve(lim);
	archive_read_support_format_all(a->ar);
	archive_read_support_filter_all(a->ar);
	*out = a;
	return 0;
}

/* libarchive checks the format while opening; we keep that verdict for the
 * first mcv_archive_next, as the header promises. */
static void ar_opened(mcv_archive *a, int r)
{
	if (r == ARCHIVE_OK || r == ARCHIVE_WARN) {
		a->opened = 1;
		return;
	}
	const char *s = archive_error_string(a->ar);
	mcv_error_set(&a->open_err, MCV_EFORMAT, "not a readable archive: %s",
		      s ? s : "unknown error");
	mcv__one_line(&a->open_err, MCV_EFORMAT);
}

int mcv_archive_open_fd(mcv_archive **out, int fd, const mcv_media_limits *lim,
			mcv_error *err)
{
	mcv_archive *a;
	int rc = ar_new(&a, lim, err);
	if (rc)
		return rc;
	ar_opened(a, archive_read_open_fd(a->ar, fd, 1 << 16));
	*out = a;
	return 0;
}

int mcv_archive_open(mcv_archive **out, const char *path, const mcv_media_limits *lim,
		     mcv_error *err)
{
	*out = NULL;
	if (!strcmp(path, "-"))
		return mcv_archive_open_fd(out, 0, lim, err);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return mcv_error_set(err, MCV_EIO, "cannot open '%s': %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
		close(fd);
		return mcv_error_set(err, MCV_EIO, "cannot read '%s': Is a directory", path);
	}
	int rc = mcv_archive_open_fd(out, fd, lim, err);
	if (rc) {
		close(fd);
		return rc;
	}
	(*out)->fd = fd;
	return 0;
}

int mcv_archive_open_memory(mcv_archive **out, const void *buf, size_t n,
			    const mcv_media_limits *lim, mcv_error *err)
{
	mcv_archive *a;
	int rc = ar_new(&a, lim, err);
	if (rc)
		return rc;
	/* libarchive wants a non-NULL pointer even for zero bytes. */
	static const char none[1];
	ar_opened(a, archive_read_open_memory(a->ar, n ? buf : none, n));
	*out = a;
	return 0;
}

void mcv_archive_close(mcv_archive *a)
{
	if (!a)
		return;
	archive_read_free(a->ar);
	if (a->fd >= 0)
		close(a->fd);
	free(a->buf);
	free(a->name);
	free(a);
}

static int grow(mcv_archive *a, size_t need)
{
	if (need <= a->cap)
		return 0;
	size_t nc = a->cap ? a->cap : 1 << 16;
	while (nc < need)
		nc *= 2;
	uint8_t *nb = realloc(a->buf, nc);
	if (!nb)
		return -1;
	a->buf = nb;
	a->cap = nc;
	return 0;
}

/* Read member data into a->buf until `want` bytes are there or the member
 * ends.  Returns bytes read, or a libarchive status < 0. */
static la_ssize_t fill(mcv_archive *a, size_t have, size_t want)
{
	while (have < want) {
		size_t chunk = want - have < (1 << 16) ? want - have : (1 << 16);
		if (grow(a, have + chunk))
			return ARCHIVE_FATAL - 1; /* out of memory: our own marker */
		la_ssize_t r = archive_read_data(a->ar, a->buf + have, chunk);
		if (r < 0)
			return r;
		if (r == 0)
			break;
		have += (size_t)r;
	}
	return (la_ssize_t)have;
}

static int member_error(mcv_archive *a, mcv_archive_member *m, int fatal, int code,
			const char *what)
{
	const char *s = archive_error_string(a->ar);
	if (code == MCV_ENOMEM)
		mcv_error_set(&m->err, code, "%s", what);
	else
		mcv_error_set(&m->err, code, "%s: %s", what, s ? s : "unknown error");
	mcv__one_line(&m->err, code);
	m->status = MCV_MEMBER_ERROR;
	if (fatal)
		a->state = AR_ENDED;
	return 1;
}

int mcv_archive_next(mcv_archive *a, mcv_archive_member *m, mcv_error *err)
{
	memset(m, 0, sizeof *m);
	m->name = "";
	m->declared_size = -1;
	if (a->state == AR_ENDED)
		return 0;
	if (!a->opened) {
		a->state = AR_ENDED;
		if (err)
			*err = a->open_err;
		return a->open_err.code;
	}
	struct archive_entry *ent;
	for (;;) {
		int r = archive_read_next_header(a->ar, &ent);
		if (r == ARCHIVE_EOF) {
			a->state = AR_ENDED;
			return 0;
		}
		if (r == ARCHIVE_FATAL) {
			if (a->n_seen == 0) {
				a->state = AR_ENDED;
				const char *s = archive_error_string(a->ar);
				mcv_error_set(err, MCV_EFORMAT, "not a readable archive: %s",
					      s ? s : "unknown error");
				return mcv__one_line(err, MCV_EFORMAT);
			}
			return member_error(a, m, 1, MCV_EFORMAT, "archive damaged after this point");
		}
		if (r < ARCHIVE_WARN) { /* this entry is unreadable, the next may be fine */
			const char *nm = archive_entry_pathname(ent);
			free(a->name);
			a->name = strdup(nm ? nm : "");
			m->name = a->name ? a->name : "";
			a->n_seen++;
			return member_error(a, m, 0, MCV_EFORMAT, "bad member header");
		}
		if (archive_entry_filetype(ent) == AE_IFREG)
			break;
	}
	a->n_seen++;
	const char *nm = archive_entry_pathname(ent);
	free(a->name);
	a->name = strdup(nm ? nm : "");
	m->name = a->name ? a->name : "";
	if (archive_entry_size_is_set(ent))
		m->declared_size = archive_entry_size(ent);
	char lb[32];
	mcv__fmt_count(lb, sizeof lb, a->lim.max_bytes);
	if (m->declared_size >= 0 && (uint64_t)m->declared_size > a->lim.max_bytes) {
		mcv_error_set(&m->err, MCV_ENOMEM, "member is %lld bytes, over --max-bytes %s",
			      (long long)m->declared_size, lb);
		m->status = MCV_MEMBER_ERROR;
		return 1;
	}

	/* The magic first: non-images are not read further. */
	la_ssize_t got = fill(a, 0, 16);
	if (got == ARCHIVE_FATAL - 1)
		return member_error(a, m, 0, MCV_ENOMEM, "out of memory reading member");
	if (got < 0)
		return member_error(a, m, got == ARCHIVE_FATAL, MCV_EFORMAT, "cannot read member");
	mcv_media_kind k = mcv_media_sniff(a->buf, (size_t)got);
	if (k != MCV_MEDIA_PNG && k != MCV_MEDIA_JPEG) {
		m->status = MCV_MEMBER_SKIPPED;
		m->kind = k;
		mcv_error_set(&m->err, MCV_EFORMAT, got == 0 ? "not an image (empty member)"
				     : k == MCV_MEDIA_VIDEO ? "not an image (a video)"
				     : "not an image");
		return 1;
	}
	/* One byte beyond the bound tells "too big" from "exactly the bound". */
	got = fill(a, (size_t)got, (size_t)a->lim.max_bytes + 1);
	if (got == ARCHIVE_FATAL - 1)
		return member_error(a, m, 0, MCV_ENOMEM, "out of memory reading member");
	if (got < 0)
		return member_error(a, m, got == ARCHIVE_FATAL, MCV_EFORMAT, "cannot read member");
	if ((uint64_t)got > a->lim.max_bytes) {
		mcv_error_set(&m->err, MCV_ENOMEM, "member is over --max-bytes %s", lb);
		m->status = MCV_MEMBER_ERROR;
		return 1;
	}
	m->status = MCV_MEMBER_IMAGE;
	m->kind = k;
	m->data = a->buf;
	m->size = (size_t)got;
	return 1;
}

int mcv_archive_member_decode(const mcv_archive *a, const mcv_archive_member *m,
			      mcv_image *out, mcv_error *err)
{
	out->w = out->h = 0;
	out->rgb = NULL;
	if (m->status != MCV_MEMBER_IMAGE) {
		if (err)
			*err = m->err;
		return m->err.code ? m->err.code : MCV_EINVAL;
	}
	return mcv_image_decode(m->data, m->size, &a->lim, out, err);
}

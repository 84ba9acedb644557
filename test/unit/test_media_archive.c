/* Archives (lib/media_archive.c): tar, tar.gz, tar.zst, zip, 7z, cpio made
 * here with libarchive's writer, holding images, a text file, an empty
 * file, path-traversal names and a member over the byte bound; hand-made
 * tars whose headers lie about sizes; truncated, bit-flipped, garbage and
 * zero-byte archives.  Also built with ASan+UBSan by `make check`. */
#include "media.h"
#include "test_media.h"
#include "unit.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIMIT 6000 /* max_bytes in these tests */

static mbuf png_small, jpeg_small, png_big;

static void make_images(void)
{
	const int w = 24, h = 16;
	uint8_t *rows[64], *rgb = malloc(64 * 64 * 3);
	for (int y = 0; y < h; y++) {
		rows[y] = malloc(w * 3);
		for (int x = 0; x < w * 3; x++)
			rows[y][x] = (uint8_t)(x * 7 + y * 3);
	}
	png_small = png_make(w, h, PNG_COLOR_TYPE_RGB, 8, 0, rows, NULL, 0, NULL, 0, NULL);
	for (int y = 0; y < h; y++)
		free(rows[y]);
	for (int i = 0; i < 64 * 64 * 3; i++)
		rgb[i] = (uint8_t)(i / 3 % 64 * 4);
	jpeg_small = jpeg_make(32, 16, JCS_RGB, rgb, 0, 0, NULL, 0, 80);
	/* noise does not compress: a PNG well over LIMIT bytes */
	for (int y = 0; y < 64; y++) {
		rows[y] = malloc(64 * 3);
		for (int x = 0; x < 64 * 3; x++)
			rows[y][x] = (uint8_t)rng();
	}
	png_big = png_make(64, 64, PNG_COLOR_TYPE_RGB, 8, 0, rows, NULL, 0, NULL, 0, NULL);
	for (int y = 0; y < 64; y++)
		free(rows[y]);
	free(rgb);
}

static la_ssize_t aw_write(struct archive *a, void *ctx, const void *d, size_t n)
{
	(void)a;
	mbuf_put(ctx, d, n);
	return (la_ssize_t)n;
}

enum { F_TAR, F_TGZ, F_TZST, F_ZIP, F_7Z, F_CPIO, F_N };
static const char *fname[F_N] = {"tar", "tar.gz", "tar.zst", "zip", "7z", "cpio"};

typedef struct want { const char *name; mcv_member_status st; mcv_media_kind kind; } want;

static const want expect[] = {
	{"a.png", MCV_MEMBER_IMAGE, MCV_MEDIA_PNG},
	{"dir/b.jpg", MCV_MEMBER_IMAGE, MCV_MEDIA_JPEG},
	{"notes.txt", MCV_MEMBER_SKIPPED, 0},
	{"../../evil.png", MCV_MEMBER_IMAGE, MCV_MEDIA_PNG},
	{"/abs/c.jpg", MCV_MEMBER_IMAGE, MCV_MEDIA_JPEG},
	{"empty", MCV_MEMBER_SKIPPED, 0},
	{"big.png", MCV_MEMBER_ERROR, 0},
	{"after.png", MCV_MEMBER_IMAGE, MCV_MEDIA_PNG},
};
#define NEXPECT (int)(sizeof expect / sizeof expect[0])

static void add(struct archive *a, const char *name, int type, const void *d, size_t n)
{
	struct archive_entry *e = archive_entry_new();
	archive_entry_set_pathname(e, name);
	archive_entry_set_filetype(e, type);
	archive_entry_set_perm(e, type == AE_IFDIR ? 0755 : 0644);
	archive_entry_set_mtime(e, 1700000000, 0);
	if (type == AE_IFLNK)
		archive_entry_set_symlink(e, "a.png");
	archive_entry_set_size(e, type == AE_IFREG ? (la_int64_t)n : 0);
	if (archive_write_header(a, e) != ARCHIVE_OK)
		fprintf(stderr, "write header %s: %s\n", name, archive_error_string(a));
	if (n && archive_write_data(a, d, n) != (la_ssize_t)n)
		fprintf(stderr, "write data %s: %s\n", name, archive_error_string(a));
	archive_entry_free(e);
}

static mbuf make_archive(int fmt)
{
	mbuf b = {0};
	struct archive *a = archive_write_new();
	switch (fmt) {
	case F_TAR: archive_write_set_format_pax_restricted(a); break;
	case F_TGZ: archive_write_set_format_pax_restricted(a); archive_write_add_filter_gzip(a); break;
	case F_TZST: archive_write_set_format_pax_restricted(a); archive_write_add_filter_zstd(a); break;
	case F_ZIP: archive_write_set_format_zip(a); break;
	case F_7Z: archive_write_set_format_7zip(a); break;
	case F_CPIO: archive_write_set_format_cpio_newc(a); break;
	}
	archive_write_set_bytes_in_last_block(a, 1);
	if (archive_write_open(a, &b, NULL, aw_write, NULL) != ARCHIVE_OK)
		fprintf(stderr, "%s: %s\n", fname[fmt], archive_error_string(a));
	static const char text[] = "just some notes, not an image\n";
	add(a, "a.png", AE_IFREG, png_small.p, png_small.n);
	add(a, "dir", AE_IFDIR, NULL, 0);
	add(a, "dir/b.jpg", AE_IFREG, jpeg_small.p, jpeg_small.n);
	if (fmt != F_7Z)
		add(a, "link.png", AE_IFLNK, NULL, 0);
	add(a, "notes.txt", AE_IFREG, text, sizeof text - 1);
	add(a, "../../evil.png", AE_IFREG, png_small.p, png_small.n);
	add(a, "/abs/c.jpg", AE_IFREG, jpeg_small.p, jpeg_small.n);
	add(a, "empty", AE_IFREG, NULL, 0);
	add(a, "big.png", AE_IFREG, png_big.p, png_big.n);
	add(a, "after.png", AE_IFREG, png_small.p, png_small.n);
	archive_write_close(a);
	archive_write_free(a);
	return b;
}

/* Walks an archive, checking records against expect[] (when check). */
static int walk(mcv_archive *ar, const char *what, int check, int *n_err)
{
	mcv_archive_member m;
	mcv_error err = {0};
	int n = 0, rc;
	unsigned seen = 0;
	*n_err = 0;
	while ((rc = mcv_archive_next(ar, &m, &err)) == 1) {
		CHECK(m.name != NULL, "%s: NULL name", what);
		if (m.status == MCV_MEMBER_IMAGE) {
			CHECK(m.data && m.size > 0 && m.size <= LIMIT, "%s: image without bytes", what);
			mcv_image im;
			mcv_error e2 = {0};
			int drc = mcv_archive_member_decode(ar, &m, &im, &e2);
			CHECK(!check || drc == 0, "%s: %s: %s", what, m.name, e2.msg);
			CHECK(drc == 0 || (e2.msg[0] && !im.rgb), "%s: decode state", what);
			mcv_image_free(&im);
		} else {
			CHECK(m.err.msg[0] && m.err.code < 0, "%s: %s: record without a reason", what, m.name);
			*n_err += m.status == MCV_MEMBER_ERROR;
		}
		if (check) { /* by name: 7z stores empty files after the others */
			int j = 0;
			while (j < NEXPECT && strcmp(m.name, expect[j].name))
				j++;
			CHECK(j < NEXPECT, "%s: unexpected member '%s'", what, m.name);
			CHECK(j == NEXPECT || !(seen >> j & 1), "%s: '%s' twice", what, m.name);
			if (j < NEXPECT) {
				seen |= 1u << j;
				CHECK(m.status == expect[j].st, "%s: %s status %d (%s)", what, m.name, m.status,
				      m.err.msg);
				if (m.status == MCV_MEMBER_IMAGE)
					CHECK(m.kind == expect[j].kind, "%s: %s kind %d", what, m.name, m.kind);
				if (!strcmp(m.name, "big.png"))
					CHECK(strstr(m.err.msg, "over --max-bytes 6K") && m.err.code == MCV_ENOMEM,
					      "%s: big: %s", what, m.err.msg);
				if (!strcmp(m.name, "notes.txt"))
					CHECK(strstr(m.err.msg, "not an image"), "%s: text: %s", what, m.err.msg);
			}
		}
		if (++n > 1000)
			break;
	}
	CHECK(n <= 1000, "%s: endless iteration", what);
	if (check)
		CHECK(seen == (1u << NEXPECT) - 1, "%s: members missing (seen %#x)", what, seen);
	if (rc < 0)
		CHECK(err.msg[0] && n == 0, "%s: error after members or without text: %s", what, err.msg);
	/* after the end, it stays ended */
	CHECK(mcv_archive_next(ar, &m, &err) == 0, "%s: not ended", what);
	return rc < 0 ? rc : n;
}

static void test_formats(void)
{
	mcv_media_limits lim = {.max_bytes = LIMIT};
	for (int f = 0; f < F_N; f++) {
		mbuf b = make_archive(f);
		CHECK(b.n > 0, "%s: writer produced nothing", fname[f]);
		mcv_archive *ar;
		mcv_error err = {0};
		CHECK(mcv_archive_open_memory(&ar, b.p, b.n, &lim, &err) == 0, "%s", err.msg);
		int nerr, n = walk(ar, fname[f], 1, &nerr);
		CHECK(n == NEXPECT, "%s: %d records", fname[f], n);
		mcv_archive_close(ar);

		/* truncated at every 1/16th, and bit flips: records then a clean end */
		for (int k = 0; k < 16; k++) {
			size_t cut = b.n * k / 16;
			uint8_t *c = malloc(cut ? cut : 1);
			memcpy(c, b.p, cut);
			CHECK(mcv_archive_open_memory(&ar, c, cut, &lim, &err) == 0, "open cut");
			char what[64];
			snprintf(what, sizeof what, "%s cut at %zu/%zu", fname[f], cut, b.n);
			walk(ar, what, 0, &nerr);
			mcv_archive_close(ar);
			free(c);
		}
		for (int k = 0; k < 48; k++) {
			uint8_t *c = malloc(b.n);
			memcpy(c, b.p, b.n);
			size_t at = (size_t)k * b.n / 48;
			c[at] ^= (uint8_t)(0x81u << (k % 2));
			CHECK(mcv_archive_open_memory(&ar, c, b.n, &lim, &err) == 0, "open flip");
			char what[64];
			snprintf(what, sizeof what, "%s flip at %zu", fname[f], at);
			walk(ar, what, 0, &nerr);
			mcv_archive_close(ar);
			free(c);
		}
		free(b.p);
	}
}

/* A ustar header by hand, so it can lie. */
static void tar_header(uint8_t *h, const char *name, uint64_t size)
{
	memset(h, 0, 512);
	snprintf((char *)h, 100, "%s", name);
	memcpy(h + 100, "0000644", 8);
	memcpy(h + 108, "0000000", 8);
	memcpy(h + 116, "0000000", 8);
	snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
	memcpy(h + 136, "14533751000", 12);
	h[156] = '0';
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	memset(h + 148, ' ', 8);
	unsigned sum = 0;
	for (int i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
}

static void tar_member(mbuf *b, const char *name, uint64_t declared, const void *d, size_t n)
{
	uint8_t h[512] = {0};
	tar_header(h, name, declared);
	mbuf_put(b, h, 512);
	mbuf_put(b, d, n);
	static const uint8_t zero[512];
	if (n % 512)
		mbuf_put(b, zero, 512 - n % 512);
}

static void test_liars(void)
{
	mcv_media_limits lim = {.max_bytes = LIMIT};
	mcv_archive *ar;
	mcv_archive_member m;
	mcv_error err = {0};
	static const uint8_t zero[1024];

	/* 1: a header declaring 8 GiB with a few hundred bytes behind it */
	mbuf b = {0};
	tar_member(&b, "ok.png", png_small.n, png_small.p, png_small.n);
	tar_member(&b, "liar.png", 077777777777ull, png_small.p, png_small.n);
	CHECK(mcv_archive_open_memory(&ar, b.p, b.n, &lim, &err) == 0, "open");
	CHECK(mcv_archive_next(ar, &m, &err) == 1 && m.status == MCV_MEMBER_IMAGE &&
	      !strcmp(m.name, "ok.png"), "first member: %d %s", m.status, m.err.msg);
	CHECK(mcv_archive_next(ar, &m, &err) == 1 && m.status == MCV_MEMBER_ERROR &&
	      !strcmp(m.name, "liar.png") && m.declared_size == 077777777777ll &&
	      strstr(m.err.msg, "member is 8589934591 bytes, over --max-bytes 6K"), "liar: %s", m.err.msg);
	int rc = mcv_archive_next(ar, &m, &err);
	CHECK(rc == 0 || (rc == 1 && m.status == MCV_MEMBER_ERROR), "after liar: %d", rc);
	if (rc == 1)
		CHECK(mcv_archive_next(ar, &m, &err) == 0, "ends after the damage record");
	mcv_archive_close(ar);
	free(b.p);

	/* 2: declares 3000 bytes (under the bound), 1024 are there, then EOF */
	b = (mbuf){0};
	tar_member(&b, "ok.png", png_small.n, png_small.p, png_small.n);
	uint8_t h[512];
	tar_header(h, "short.png", 3000);
	mbuf_put(&b, h, 512);
	mbuf_put(&b, png_small.p, 16);
	mbuf_put(&b, zero, 1024 - 16);
	CHECK(mcv_archive_open_memory(&ar, b.p, b.n, &lim, &err) == 0, "open");
	CHECK(mcv_archive_next(ar, &m, &err) == 1 && m.status == MCV_MEMBER_IMAGE, "first: %s", m.err.msg);
	CHECK(mcv_archive_next(ar, &m, &err) == 1 && m.status == MCV_MEMBER_ERROR &&
	      !strcmp(m.name, "short.png") && m.err.msg[0], "short: %d %s", m.status, m.err.msg);
	CHECK(mcv_archive_next(ar, &m, &err) == 0, "ends after a truncated member");
	mcv_archive_close(ar);
	free(b.p);

	/* 3: a member of exactly LIMIT bytes passes, LIMIT+1 does not */
	uint8_t *big = calloc(LIMIT + 1, 1);
	memcpy(big, png_small.p, png_small.n);
	b = (mbuf){0};
	tar_member(&b, "exact.png", LIMIT, big, LIMIT);
	tar_member(&b, "over.png", LIMIT + 1, big, LIMIT + 1);
	mbuf_put(&b, zero, 1024);
	CHECK(mcv_archive_open_memory(&ar, b.p, b.n, &lim, &err) == 0, "open");
	CHECK(mcv_archive_next(ar, &m, &err) == 1 && m.status == MCV_MEMBER_IMAGE && m.size == LIMIT,
	      "exact: %d %s", m.status, m.err.msg);
	CHECK(mcv_archive_next(ar, &m, &err) == 1 && m.status == MCV_MEMBER_ERROR, "over: %d", m.status);
	CHECK(mcv_archive_next(ar, &m, &err) == 0, "end");
	mcv_archive_close(ar);
	free(b.p);
	free(big);
}

static void test_inputs(void)
{
	mcv_media_limits lim = {.max_bytes = LIMIT};
	mcv_archive *ar;
	mcv_archive_member m;
	mcv_error err = {0};
	/* zero bytes: an empty archive */
	CHECK(mcv_archive_open_memory(&ar, NULL, 0, &lim, &err) == 0, "open empty");
	CHECK(mcv_archive_next(ar, &m, &err) == 0, "empty has no members");
	mcv_archive_close(ar);
	/* garbage: not an archive, an error at the first next */
	uint8_t junk[3000];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (uint8_t)rng();
	CHECK(mcv_archive_open_memory(&ar, junk, sizeof junk, &lim, &err) == 0, "open junk");
	memset(&err, 0, sizeof err);
	int rc = mcv_archive_next(ar, &m, &err);
	CHECK(rc == MCV_EFORMAT && strstr(err.msg, "not a readable archive"), "junk: %d %s", rc, err.msg);
	CHECK(mcv_archive_next(ar, &m, &err) == 0, "junk ends");
	mcv_archive_close(ar);
	/* a bare image is not an archive either */
	CHECK(mcv_archive_open_memory(&ar, png_small.p, png_small.n, &lim, &err) == 0, "open png");
	CHECK(mcv_archive_next(ar, &m, &err) < 0, "a PNG as archive");
	mcv_archive_close(ar);
	/* from a path and from a file descriptor */
	char dir[] = "/tmp/mcv-arch-XXXXXX", path[64];
	if (!mkdtemp(dir)) {
		CHECK(0, "mkdtemp");
		return;
	}
	snprintf(path, sizeof path, "%s/x.tgz", dir);
	mbuf b = make_archive(F_TGZ);
	FILE *f = fopen(path, "wb");
	fwrite(b.p, 1, b.n, f);
	fclose(f);
	int nerr;
	CHECK(mcv_archive_open(&ar, path, &lim, &err) == 0, "open path: %s", err.msg);
	CHECK(walk(ar, "path", 1, &nerr) == NEXPECT, "path");
	mcv_archive_close(ar);
	int fd = open(path, O_RDONLY);
	CHECK(mcv_archive_open_fd(&ar, fd, &lim, &err) == 0, "open fd: %s", err.msg);
	CHECK(walk(ar, "fd", 1, &nerr) == NEXPECT, "fd");
	mcv_archive_close(ar);
	CHECK(fcntl(fd, F_GETFD) != -1, "fd closed by us");
	close(fd);
	unlink(path);
	CHECK(mcv_archive_open(&ar, path, &lim, &err) == MCV_EIO && strstr(err.msg, "No such file"),
	      "missing: %s", err.msg);
	CHECK(mcv_archive_open(&ar, dir, &lim, &err) == MCV_EIO && strstr(err.msg, "Is a directory"),
	      "directory: %s", err.msg);
	rmdir(dir);
	free(b.p);
}

int main(void)
{
	make_images();
	test_formats();
	test_liars();
	test_inputs();
	free(png_small.p);
	free(jpeg_small.p);
	free(png_big.p);
	return unit_done("test_media_archive");
}

/* The safetensors reader: valid files read back exactly; truncated files,
 * headers that lie about lengths or sizes, unknown dtypes, overlapping or
 * duplicate tensors and malformed JSON are MCV_EFORMAT errors with a clear
 * message, never a crash or an over-read (this test also runs under
 * ASan/UBSan, with every input in a buffer of its exact size). */
#include "safetensors.h"
#include "quant.h"
#include "unit.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 8-byte LE length + header + data, in a malloc'd buffer of the exact size. */
static uint8_t *build(const char *hdr, const void *data, size_t ndata, size_t *len)
{
	size_t hl = strlen(hdr);
	*len = 8 + hl + ndata;
	uint8_t *b = malloc(*len);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, hdr, hl);
	if (ndata)
		memcpy(b + 8 + hl, data, ndata);
	return b;
}

static int open_hdr(const char *hdr, size_t ndata, mcv_error *err)
{
	uint8_t *data = calloc(ndata ? ndata : 1, 1);
	size_t len;
	uint8_t *b = build(hdr, data, ndata, &len);
	mcv_st *st = NULL;
	int rc = mcv_st_open_buffer(&st, b, len, err);
	mcv_st_close(st);
	free(b);
	free(data);
	return rc;
}

#define BAD(hdr, ndata, needle) do { mcv_error e_ = { 0 }; \
	int rc_ = open_hdr(hdr, ndata, &e_); \
	CHECK(rc_ == MCV_EFORMAT, "rc %d for %s", rc_, hdr); \
	CHECK(strstr(e_.msg, needle) != NULL, "message '%s' lacks '%s'", e_.msg, needle); } while (0)

static const char *good_hdr =
	"{\"__metadata__\":{\"format\":\"pt\",\"note\":\"a\\\"b\\u00e9\"},"
	" \"model.layers.0.mlp.down_proj.weight\": {\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
	" \"model.norm.weight\":{\"shape\":[4],\"dtype\":\"F32\",\"data_offsets\":[12,28]},"
	" \"lm_head.weight\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[28,36], \"extra\": [1, {\"x\": null}]},"
	" \"empty\":{\"dtype\":\"I32\",\"shape\":[0,5],\"data_offsets\":[36,36]}}";

int main(void)
{
	uint8_t data[36];
	for (int i = 0; i < 36; i++)
		data[i] = (uint8_t)(i * 7 + 1);
	size_t len;
	uint8_t *good = build(good_hdr, data, sizeof data, &len);
	mcv_error err = { 0 };
	mcv_st *st;

	/* a valid file, from a buffer and from disk */
	int rc = mcv_st_open_buffer(&st, good, len, &err);
	CHECK(rc == 0, "valid file: %s", err.msg);
	if (!rc) {
		CHECK(mcv_st_n_tensors(st) == 4, "n %lld", (long long)mcv_st_n_tensors(st));
		const mcv_st_tensor *t = mcv_st_find(st, "model.layers.0.mlp.down_proj.weight");
		CHECK(t && t->type == MCV_BF16 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
		      t->nbytes == 12 && t->data == good + len - 36, "bf16 tensor");
		t = mcv_st_find(st, "model.norm.weight");
		CHECK(t && t->type == MCV_F32 && t->n_dims == 1 && t->shape[0] == 4 && t->offset == 12 &&
		      !memcmp(t->data, data + 12, 16), "f32 tensor");
		t = mcv_st_find(st, "lm_head.weight");
		CHECK(t && t->type == MCV_F16 && !strcmp(t->dtype, "F16") && t->nbytes == 8, "f16 tensor");
		t = mcv_st_find(st, "empty");
		CHECK(t && t->type == -1 && t->elem_size == 4 && t->nbytes == 0, "i32 empty tensor");
		CHECK(!mcv_st_find(st, "nope"), "absent name");
		CHECK(mcv_st_meta(st, "format") && !strcmp(mcv_st_meta(st, "format"), "pt"), "meta");
		CHECK(mcv_st_meta(st, "note") && !strcmp(mcv_st_meta(st, "note"), "a\"b\xc3\xa9"), "escapes");
		mcv_st_close(st);
	}
	char path[] = "/tmp/mcv-st-XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0 && write(fd, good, len) == (ssize_t)len, "temp file");
	close(fd);
	rc = mcv_st_open(&st, path, &err);
	CHECK(rc == 0 && mcv_st_n_tensors(st) == 4, "from disk: %s", err.msg);
	if (!rc)
		mcv_st_close(st);
	/* truncated on disk: the error names the file */
	CHECK(truncate(path, (off_t)len - 1) == 0, "truncate");
	rc = mcv_st_open(&st, path, &err);
	CHECK(rc == MCV_EFORMAT && strstr(err.msg, path) && strstr(err.msg, "truncated"), "truncated file: %s", err.msg);
	unlink(path);
	rc = mcv_st_open(&st, path, &err);
	CHECK(rc == MCV_EIO, "missing file: %d", rc);

	/* every truncation of the valid file is an error (and no over-read) */
	int trunc_ok = 1;
	for (size_t n = 0; n < len; n++) {
		uint8_t *b = malloc(n ? n : 1);
		memcpy(b, good, n);
		if (mcv_st_open_buffer(&st, b, n, &err) != MCV_EFORMAT) {
			trunc_ok = 0;
			mcv_st_close(st);
		}
		free(b);
	}
	CHECK(trunc_ok, "a truncated file opened");

	/* header length that lies */
	uint8_t *b = malloc(len);
	memcpy(b, good, len);
	b[0] = 0xff, b[1] = 0xff;
	rc = mcv_st_open_buffer(&st, b, len, &err);
	CHECK(rc == MCV_EFORMAT && strstr(err.msg, "header length"), "lying header length: %s", err.msg);
	memset(b, 0xff, 8);
	rc = mcv_st_open_buffer(&st, b, len, &err);
	CHECK(rc == MCV_EFORMAT, "huge header length");
	free(b);

	/* sizes that lie, bad dtypes, overlaps, duplicates */
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16, "do not hold");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 8, "past the");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,0]}}", 16, "do not hold");
	BAD("{\"a\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'F12'");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
	    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "overlap");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "appears twice");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,16]}}", 16, "overflow");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,16]}}", 16, "too large");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16, "non-negative integer");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4.0],\"data_offsets\":[0,16]}}", 16, "integer");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "too many dimensions");
	BAD("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "lacks");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, "text after");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "expected");
	BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}",
	    4, "too deep");
	BAD("{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "NUL");
	BAD("{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "surrogate");
	BAD("{\"__metadata__\":{\"k\":1}}", 0, "must be strings");
	BAD("[]", 0, "expected '{'");

	/* random corruption of the header: an error or a valid read, never a crash */
	srand(7);
	int n_err = 0;
	for (int it = 0; it < 3000; it++) {
		b = malloc(len);
		memcpy(b, good, len);
		int nflip = 1 + rand() % 4;
		for (int k = 0; k < nflip; k++)
			b[8 + rand() % (len - 8 - 36)] = (uint8_t)rand();
		if (mcv_st_open_buffer(&st, b, len, &err) == 0) {
			for (int64_t i = 0; i < mcv_st_n_tensors(st); i++) {
				const mcv_st_tensor *t = mcv_st_tensor_at(st, i);
				volatile uint8_t sum = 0;
				for (uint64_t j = 0; j < t->nbytes; j++)
					sum += ((const uint8_t *)t->data)[j];
				(void)sum;
			}
			mcv_st_close(st);
		} else
			n_err++;
		free(b);
	}
	CHECK(n_err > 1000, "only %d of 3000 corrupted headers were refused", n_err);

	free(good);
	return unit_done("test_safetensors");
}

/* Minimal unit-test helpers: CHECK records a failure and goes on; the test's
 * main returns unit_done().  Exit 77 = skipped (print the reason first). */
#ifndef MCV_UNIT_H
#define MCV_UNIT_H
#include <stdio.h>
#include <stdlib.h>

static int unit_failures, unit_checks;
#define CHECK(cond, ...) do { unit_checks++; if (!(cond)) { unit_failures++; \
	fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
	fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define UNIT_SKIP(...) do { fprintf(stderr, "skipped: "); fprintf(stderr, __VA_ARGS__); \
	fputc('\n', stderr); exit(77); } while (0)
static inline int unit_done(const char *name)
{
	fprintf(stderr, "%s: %d checks, %d failed\n", name, unit_checks, unit_failures);
	return unit_failures ? 1 : 0;
}
#endif

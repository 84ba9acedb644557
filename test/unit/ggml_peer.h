/* Loading llama.cpp's prebuilt ggml CPU library (the peer that
 * scripts/setup.sh installs) into a unit test, to compare kernels with it
 * bit for bit.  MCV_PEER_LIBDIR overrides the folder. */
#ifndef MCV_GGML_PEER_H
#define MCV_GGML_PEER_H
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* dlopen libggml-base and libggml-cpu-VARIANT; NULL (with a note on stderr)
 * when absent.  Returns the CPU library's handle, initialised. */
static void *ggml_peer_open(const char *variant)
{
	const char *dir = getenv("MCV_PEER_LIBDIR");
	char path[1024];
	if (!dir)
		dir = "scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64";
	snprintf(path, sizeof path, "%s/libggml-base.so", dir);
	if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL)) {
		fprintf(stderr, "note: peer library not found (%s): ggml parity not checked\n", path);
		return NULL;
	}
	snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", dir, variant);
	void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		fprintf(stderr, "note: %s: %s: ggml parity not checked\n", path, dlerror());
		return NULL;
	}
	void (*cpu_init)(void) = (void (*)(void))dlsym(h, "ggml_cpu_init");
	if (cpu_init)
		cpu_init();
	fprintf(stderr, "ggml parity against %s\n", path);
	return h;
}
#endif

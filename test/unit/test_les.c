/* Lookahead Expert Scheduling must not change a single bit: the token ids
 * and the logits (bytes) of a prefill plus greedy decode steps are compared
 * between the fully resident run and runs under memory budgets that hold
 * about 10%, 30% and 70% of the experts, with lookahead 0/1/2, 1 and 2
 * threads, the LRU and default policies, direct reads through kernel AIO or
 * I/O threads and buffered reads, 1 to 16 reads in flight, prefetch
 * confidence gates on and off, on the plain file and its packed
 * form (mcv_pack_write), for random qwen35moe models from $B/mcv-genmodel
 * (tiny Q8_0 with more experts, small Q4_K).  Also: a budget below the
 * minimum is MCV_EBUDGET naming the minimum; a failing read is retried
 * (same output) or, when it keeps failing, a clean MCV_EIO, in both read
 * engines; a truncated
 * packed file is a load error; the size parser; a dense model refuses a
 * budget. */
#include "les.h"
#include "model.h"
#include "pack.h"
#include "unit.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_GEN 6

static char dir[256];

typedef struct run_out {
	int32_t tok[N_GEN];
	float *logits; /* [N_GEN][V] */
	int V;
	mcv_les_stats st;
} run_out;

static const int32_t prompt[] = { 5, 17, 300, 42, 9, 77, 123, 8, 61, 2 };
#define N_PROMPT ((int)(sizeof prompt / sizeof prompt[0]))

/* Prefill in chunks of 4 then greedy steps; 0 or the failing rc. */
static int run(const char *path, const mcv_les_params *lp, int threads, run_out *o, mcv_error *err)
{
	omp_set_num_threads(threads);
	mcv_model_params mp = mcv_model_default_params();
	mp.n_threads = threads;
	mp.les = lp;
	mcv_model *m;
	int rc = mcv_model_load(&m, path, &mp, err);
	if (rc < 0)
		return rc;
	mcv_ctx_params cp = mcv_ctx_default_params();
	cp.n_ctx = 64;
	cp.n_batch = 4;
	mcv_ctx *c;
	if ((rc = mcv_ctx_init(&c, m, &cp, err)) < 0) {
		mcv_model_free(m);
		return rc;
	}
	const int V = mcv_model_n_vocab(m);
	o->V = V;
	o->logits = malloc(sizeof(float) * (size_t)V * N_GEN);
	rc = mcv_ctx_eval(c, prompt, N_PROMPT, err);
	for (int i = 0; i < N_GEN && rc == 0; i++) {
		const float *l = mcv_ctx_logits(c);
		memcpy(o->logits + (size_t)i * V, l, sizeof(float) * V);
		int best = 0;
		for (int v = 1; v < V; v++)
			if (l[v] > l[best])
				best = v;
		o->tok[i] = best;
		if (i + 1 < N_GEN)
			rc = mcv_ctx_eval(c, &o->tok[i], 1, err);
	}
	memset(&o->st, 0, sizeof o->st);
	if (mcv_ctx_les(c))
		mcv_les_stats_get(mcv_ctx_les(c), &o->st);
	mcv_ctx_free(c);
	mcv_model_free(m);
	return rc;
}

static int same(const run_out *a, const run_out *b)
{
	return memcmp(a->tok, b->tok, sizeof a->tok) == 0 &&
	       memcmp(a->logits, b->logits, sizeof(float) * (size_t)a->V * N_GEN) == 0;
}

static int sh(const char *cmd)
{
	int rc = system(cmd);
	return rc == 0 ? 0 : -1;
}

static int pack(const char *in, const char *out)
{
	mcv_gguf *g;
	mcv_error e;
	if (mcv_gguf_open(&g, in, &e) < 0)
		return -1;
	mcv_layout *l;
	int rc = mcv_layout_open(&l, g, &e);
	if (rc == 0) {
		mcv_pack_params pp = mcv_pack_default_params();
		rc = mcv_pack_write(l, out, &pp, &e);
		mcv_layout_free(l);
	}
	mcv_gguf_close(g);
	if (rc)
		fprintf(stderr, "pack: %s\n", e.msg);
	return rc;
}

/* The budget that leaves room for about frac of all experts. */
static uint64_t budget_for(const mcv_les_stats *st, double frac)
{
	const uint64_t fixed = st->nonexpert_bytes + st->header_bytes + st->ctx_bytes + st->margin_bytes;
	uint64_t slots = (uint64_t)(frac * st->n_experts_total + 0.5);
	return fixed + slots * st->slot_bytes;
}

static void matrix(const char *path, const char *what, int stride)
{
	mcv_error err;
	const double t0 = omp_get_wtime();
	run_out ref = { 0 };
	int rc = run(path, NULL, 2, &ref, &err);
	CHECK(rc == 0, "%s resident: %s", what, err.msg);
	if (rc)
		return;
	/* learn the fixed part and the slot size from an unlimited budget */
	mcv_les_params lp = mcv_les_default_params();
	lp.mem = 1ull << 40;
	run_out big = { 0 };
	rc = run(path, &lp, 2, &big, &err);
	CHECK(rc == 0 && same(&ref, &big), "%s: every expert cached differs (%s)", what, rc ? err.msg : "");
	free(big.logits);
	if (rc)
		return;
	const double fr[3] = { 0.10, 0.30, 0.70 };
	int n_runs = 0, n_aio = 0;
	for (int b = 0; b < 3; b++)
		for (int la = 0; la <= 2; la++)
			for (int th = 1; th <= 2; th++)
				for (int pol = 0; pol < 2; pol++) {
					if ((th + pol + la + b) % stride)
						continue; /* a spread-out part of the grid */
					lp = mcv_les_default_params();
					lp.mem = budget_for(&big.st, fr[b]);
					lp.lookahead = la;
					lp.policy = pol ? MCV_LES_LRU : MCV_LES_LFRU;
					lp.prefetch_width = b == 1 ? 0 : 2 * big.st.prefetch_width;
					/* two thirds go direct, through kernel AIO or I/O threads,
					 * the rest through the page cache; with 1 to 16 reads in
					 * flight and prefetch confidence gates */
					lp.direct = (la + th + pol) % 3 != 1 ? -1 : 0;
					lp.aio = (b + th) % 3 == 0 ? 0 : (b + th) % 3 == 1 ? 1 : -1;
					lp.io_threads = b == 0 ? 1 : b == 1 ? 0 : 16;
					lp.prefetch_min = (la + b) % 3 == 0 ? 0.0 : (la + b) % 3 == 1 ? 0.3 : -1;
					run_out o = { 0 };
					rc = run(path, &lp, th, &o, &err);
					CHECK(rc == 0, "%s budget %.0f%% la %d t %d %s: %s", what, 100 * fr[b], la, th,
					      pol ? "lru" : "lfru", err.msg);
					if (!rc) {
						CHECK(same(&ref, &o), "%s budget %.0f%% la %d t %d %s: output differs",
						      what, 100 * fr[b], la, th, pol ? "lru" : "lfru");
						CHECK(o.st.n_slots < o.st.n_experts_total, "%s: %d slots of %d", what,
						      o.st.n_slots, o.st.n_experts_total);
						CHECK(o.st.lookups == o.st.hits + o.st.hits_inflight + o.st.misses,
						      "%s: counters do not add up", what);
						CHECK(o.st.misses > 0 && o.st.reads >= o.st.misses, "%s: no reads", what);
						if (la == 0)
							CHECK(o.st.prefetch_reads == 0, "%s: prefetch without lookahead", what);
						CHECK(o.st.prefetch_used + o.st.prefetch_wasted <= o.st.prefetch_reads,
						      "%s: %llu prefetches used + %llu wasted of %llu read", what,
						      (unsigned long long)o.st.prefetch_used,
						      (unsigned long long)o.st.prefetch_wasted,
						      (unsigned long long)o.st.prefetch_reads);
						if (lp.direct && lp.aio)
							n_aio += o.st.aio;
						n_runs++;
					}
					free(o.logits);
				}
	fprintf(stderr, "%s: %d budget runs identical to the resident run, %d through kernel AIO (%.1f s)\n",
		what, n_runs, n_aio, omp_get_wtime() - t0);

	/* below the minimum: MCV_EBUDGET with the minimum in the message */
	lp = mcv_les_default_params();
	lp.mem = big.st.min_budget - 1;
	run_out o = { 0 };
	rc = run(path, &lp, 2, &o, &err); /* the same threads: scratch is per thread */
	char want[64];
	snprintf(want, sizeof want, "minimum %llu", (unsigned long long)big.st.min_budget);
	CHECK(rc == MCV_EBUDGET && strstr(err.msg, want), "%s: small budget gave %d '%s'", what, rc, err.msg);
	free(o.logits);

	/* a read that fails twice is retried; one that keeps failing stops the
	 * run: both engines (kernel AIO where there is one, I/O threads) */
	for (int engine = 0; engine < 2; engine++) {
		lp = mcv_les_default_params();
		lp.mem = budget_for(&big.st, 0.3);
		lp.fail_reads = 2;
		lp.io_threads = 1;
		lp.aio = engine;
		o = (run_out){ 0 };
		rc = run(path, &lp, 2, &o, &err);
		CHECK(rc == 0 && same(&ref, &o) && o.st.read_retries >= 2,
		      "%s engine %d: retried reads: rc %d, %llu retries", what, engine, rc,
		      (unsigned long long)o.st.read_retries);
		free(o.logits);
		lp.fail_reads = 1000000;
		o = (run_out){ 0 };
		rc = run(path, &lp, 2, &o, &err);
		CHECK(rc == MCV_EIO && strstr(err.msg, "failed after"), "%s engine %d: failing reads gave %d '%s'",
		      what, engine, rc, err.msg);
		free(o.logits);
	}
	free(ref.logits);
}

int main(int argc, char **argv)
{
	(void)argc;
	/* many short runs with 2 threads on a busy machine: spinning OpenMP
	 * workers would burn the time the other thread needs (libgomp reads
	 * this before main, hence the re-exec) */
	if (!getenv("OMP_WAIT_POLICY")) {
		setenv("OMP_WAIT_POLICY", "passive", 1);
		execv("/proc/self/exe", argv);
	}
	const char *b = getenv("B");
	char gen[512];
	snprintf(gen, sizeof gen, "%s/mcv-genmodel", b && *b ? b : "build");
	if (access(gen, X_OK) != 0)
		UNIT_SKIP("no %s (build first)", gen);

	mcv_error err;
	uint64_t v;
	CHECK(mcv_les_parse_size("3G", &v, &err) == 0 && v == 3ull << 30, "3G");
	CHECK(mcv_les_parse_size("512M", &v, &err) == 0 && v == 512ull << 20, "512M");
	CHECK(mcv_les_parse_size("100KiB", &v, &err) == 0 && v == 100ull << 10, "100KiB");
	CHECK(mcv_les_parse_size("12345", &v, &err) == 0 && v == 12345, "bytes");
	CHECK(mcv_les_parse_size("3X", &v, &err) == MCV_EINVAL, "3X");
	CHECK(mcv_les_parse_size("", &v, &err) == MCV_EINVAL, "empty");
	CHECK(mcv_les_parse_size("-1G", &v, &err) == MCV_EINVAL, "negative");
	CHECK(mcv_les_parse_size("0", &v, &err) == MCV_EINVAL, "zero");

	snprintf(dir, sizeof dir, "/tmp/mcv-test-les-XXXXXX");
	if (!mkdtemp(dir))
		UNIT_SKIP("no temporary folder");
	char tiny[300], tinyp[300], small[300], smallp[300], dense[300], cmd[4096];
	snprintf(tiny, sizeof tiny, "%s/tiny.gguf", dir);
	snprintf(tinyp, sizeof tinyp, "%s/tiny-packed.gguf", dir);
	snprintf(small, sizeof small, "%s/small.gguf", dir);
	snprintf(smallp, sizeof smallp, "%s/small-packed.gguf", dir);
	snprintf(dense, sizeof dense, "%s/dense.gguf", dir);
	snprintf(cmd, sizeof cmd,
		 "%s -q --shape tiny --experts 32 --experts-used 4 --type q8_0 %s && "
		 "%s -q --shape small --layers 4 --vocab 4096 --type q4_k --fast-quant %s && "
		 "%s -q --arch qwen35 --shape tiny %s", gen, tiny, gen, small, gen, dense);
	if (sh(cmd) != 0)
		UNIT_SKIP("mcv-genmodel failed");
	CHECK(pack(tiny, tinyp) == 0, "pack tiny");
	CHECK(pack(small, smallp) == 0, "pack small");

	matrix(tiny, "tiny q8_0 plain", 1);
	matrix(tinyp, "tiny q8_0 packed", 3);
	matrix(small, "small q4_k plain", 6);
	matrix(smallp, "small q4_k packed", 6);

	/* the proving model, when it is there */
	if (access("examples/models/proving-text.gguf", R_OK) == 0)
		matrix("examples/models/proving-text.gguf", "proving-text", 4);

	/* the plain and packed files give the same resident output */
	run_out a = { 0 }, p = { 0 };
	CHECK(run(tiny, NULL, 1, &a, &err) == 0 && run(tinyp, NULL, 1, &p, &err) == 0 && same(&a, &p),
	      "plain and packed differ");
	free(a.logits);
	free(p.logits);

	/* a truncated packed file is a load error */
	snprintf(cmd, sizeof cmd, "head -c $(( $(stat -c %%s %s) - 5000 )) %s > %s/trunc.gguf", tinyp, tinyp, dir);
	CHECK(sh(cmd) == 0, "truncate");
	snprintf(cmd, sizeof cmd, "%s/trunc.gguf", dir);
	mcv_les_params lp = mcv_les_default_params();
	lp.mem = 1ull << 30;
	run_out o = { 0 };
	int rc = run(cmd, &lp, 1, &o, &err);
	CHECK(rc < 0 && rc != MCV_EBUDGET, "truncated packed file loaded (%d)", rc);
	fprintf(stderr, "truncated packed file: %s\n", err.msg);
	free(o.logits);

	/* a dense model has no experts to budget */
	rc = run(dense, &lp, 1, &o, &err);
	CHECK(rc == MCV_EUNSUPPORTED, "dense with a budget gave %d '%s'", rc, err.msg);
	free(o.logits);

	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	sh(cmd);
	return unit_done("test_les");
}

/* Allocation and single-tensor KL probes.
 *
 * mcv_alloc_solve on synthetic tensors: budgets are met, the result is never
 * worse than a uniform type at the same size, it matches exhaustive search
 * on small cases closely, and an impossible budget is MCV_EBUDGET.
 * mcv_sens_probe on a tiny random model (made by $B/mcv-genmodel; skipped
 * without it): a lossless probe gives KL 0, a Q2_K probe KL > 0, repeated
 * probes agree, and the mapping is restored after each probe. */
#include "alloc.h"
#include "model.h"
#include "quant.h"
#include "sens.h"
#include "unit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng = 12345;
static double unif(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (rng >> 11) * (1.0 / 9007199254740992.0);
}

/* n tensors with 4 candidates each: bytes grow, loss falls convexly. */
static void make(mcv_alloc_tensor *t, int n)
{
	memset(t, 0, n * sizeof *t);
	for (int i = 0; i < n; i++) {
		t[i].name = "t";
		t[i].ne[0] = 256;
		t[i].ne[1] = t[i].ne[2] = t[i].ne[3] = 1;
		t[i].fixed_type = -1;
		t[i].expert_share = i % 3 == 0 ? 0.25 : 0;
		t[i].n_cand = 4;
		double size = 1000 * (1 + 9 * unif()), sens = exp(4 * unif());
		for (int c = 0; c < 4; c++) {
			t[i].cand[c] = MCV_Q2_K + c;
			t[i].bytes[c] = size * (2.6 + c);
			t[i].loss[c] = sens * pow(0.25, c) * (0.8 + 0.4 * unif());
		}
	}
}

static double total(const mcv_alloc_tensor *t, int n, double *bytes, double *eb)
{
	double l = 0;
	*bytes = *eb = 0;
	for (int i = 0; i < n; i++) {
		l += t[i].loss[t[i].choice];
		*bytes += t[i].bytes[t[i].choice];
		*eb += t[i].expert_share * t[i].bytes[t[i].choice];
	}
	return l;
}

static void test_alloc(void)
{
	enum { N = 40 };
	mcv_alloc_tensor t[N];
	mcv_error err;
	for (int rep = 0; rep < 20; rep++) {
		make(t, N);
		/* the uniform choice c at its own size */
		for (int c = 0; c < 4; c++) {
			double ub = 0, ul = 0;
			for (int i = 0; i < N; i++) {
				ub += t[i].bytes[c];
				ul += t[i].loss[c];
			}
			mcv_alloc_budget b = { .max_bytes = ub };
			CHECK(mcv_alloc_solve(t, N, &b, &err) == 0, "solve: %s", err.msg);
			double by, eb, l = total(t, N, &by, &eb);
			CHECK(by <= ub, "rep %d c %d: %g bytes over %g", rep, c, by, ub);
			CHECK(l <= ul * (1 + 1e-12), "rep %d c %d: loss %g worse than uniform %g", rep, c, l, ul);
		}
		/* both budgets */
		double ub = 0, ue = 0;
		for (int i = 0; i < N; i++) {
			ub += t[i].bytes[2];
			ue += t[i].expert_share * t[i].bytes[1];
		}
		mcv_alloc_budget b = { .max_bytes = ub, .max_expert_bytes_token = ue };
		CHECK(mcv_alloc_solve(t, N, &b, &err) == 0, "solve 2: %s", err.msg);
		double by, eb;
		total(t, N, &by, &eb);
		CHECK(by <= ub && eb <= ue, "budgets: %g/%g %g/%g", by, ub, eb, ue);
	}
	/* exhaustive search on 6 tensors */
	enum { M = 6 };
	mcv_alloc_tensor s[M];
	double worst = 0;
	for (int rep = 0; rep < 30; rep++) {
		make(s, M);
		double ub = 0;
		for (int i = 0; i < M; i++)
			ub += s[i].bytes[1] + (s[i].bytes[2] - s[i].bytes[1]) * unif();
		double best = INFINITY;
		for (int code = 0; code < 4096; code++) {
			double by = 0, l = 0;
			for (int i = 0, k = code; i < M; i++, k >>= 2) {
				by += s[i].bytes[k & 3];
				l += s[i].loss[k & 3];
			}
			if (by <= ub && l < best)
				best = l;
		}
		mcv_alloc_budget b = { .max_bytes = ub };
		CHECK(mcv_alloc_solve(s, M, &b, &err) == 0, "solve: %s", err.msg);
		double by, eb, l = total(s, M, &by, &eb);
		CHECK(by <= ub, "exhaustive rep %d: over budget", rep);
		worst = l / best > worst ? l / best : worst;
	}
	CHECK(worst < 1.5, "allocation up to %.3fx the optimum on 6 tensors", worst);
	fprintf(stderr, "allocation: worst %.4fx the exhaustive optimum over 30 cases\n", worst);
	make(t, N);
	mcv_alloc_budget b = { .max_bytes = 10 };
	CHECK(mcv_alloc_solve(t, N, &b, &err) == MCV_EBUDGET, "impossible size accepted");
	mcv_alloc_budget e = { .max_expert_bytes_token = 1 };
	CHECK(mcv_alloc_solve(t, N, &e, &err) == MCV_EBUDGET, "impossible expert budget accepted");
	int ty[8];
	CHECK(mcv_alloc_candidates(256, ty) == 6 && ty[0] == MCV_Q2_K && ty[5] == MCV_Q8_0, "candidates 256");
	CHECK(mcv_alloc_candidates(64, ty) == 4 && ty[0] == MCV_Q4_0 && ty[1] == MCV_Q5_0 && ty[2] == MCV_Q5_1 &&
	      ty[3] == MCV_Q8_0, "candidates 64");
	CHECK(mcv_alloc_candidates(48, ty) == 0, "candidates 48");
}

static void test_probe(void)
{
	const char *b = getenv("B");
	char gen[1024], model[] = "/tmp/mcv-test-sens-XXXXXX", data[1100], cmd[4096];
	snprintf(gen, sizeof gen, "%s/mcv-genmodel", b ? b : "build");
	if (access(gen, X_OK)) {
		fprintf(stderr, "note: %s absent: probes not tested\n", gen);
		return;
	}
	int fd = mkstemp(model);
	if (fd < 0)
		return;
	close(fd);
	snprintf(cmd, sizeof cmd, "%s -q --arch qwen35moe --shape tiny --type f32 %s", gen, model);
	CHECK(system(cmd) == 0, "%s failed", cmd);
	snprintf(data, sizeof data, "%s.jsonl", model);
	FILE *f = fopen(data, "w");
	fprintf(f, "{\"tokens\": [1, 2, 3, 4, 5, 6, 7, 8]}\n{\"tokens\": [9, 10, 11, 12]}\n");
	fclose(f);
	mcv_error err;
	mcv_model *m = NULL;
	mcv_sens *s = NULL;
	CHECK(mcv_model_load(&m, model, NULL, &err) == 0, "load: %s", err.msg);
	if (m && mcv_sens_init(&s, m, data, 8, 0, &err) == 0) {
		CHECK(mcv_sens_positions(s) == 10, "positions %lld", (long long)mcv_sens_positions(s));
		double k0, k1, k2, k3, k4;
		const char *nm = "blk.1.ffn_up_exps.weight";
		CHECK(!mcv_sens_probe(s, nm, MCV_F32, NULL, &k0, &err), "probe: %s", err.msg);
		CHECK(!mcv_sens_probe(s, nm, MCV_Q2_K, NULL, &k1, &err), "probe: %s", err.msg);
		CHECK(!mcv_sens_probe(s, nm, MCV_F32, NULL, &k2, &err), "probe: %s", err.msg);
		CHECK(!mcv_sens_probe(s, nm, MCV_Q2_K, NULL, &k3, &err), "probe: %s", err.msg);
		CHECK(!mcv_sens_probe(s, "token_embd.weight", MCV_Q2_K, NULL, &k4, &err), "probe: %s", err.msg);
		CHECK(fabs(k0) < 1e-12 && fabs(k2) < 1e-12, "lossless probes: %g %g (mapping not restored?)", k0, k2);
		CHECK(k1 > 1e-7 && k1 == k3, "q2_K probes: %g %g", k1, k3);
		CHECK(k4 > 0, "embedding probe %g", k4);
		CHECK(mcv_sens_probe(s, "no.such.weight", MCV_Q2_K, NULL, &k4, &err) == MCV_ENOTFOUND, "missing tensor");
		fprintf(stderr, "probe KL: lossless %g, q2_K %g (again %g), embedding q2_K %g\n", k0, k1, k3, k4);
	} else {
		CHECK(0, "sens_init: %s", err.msg);
	}
	mcv_sens_free(s);
	mcv_model_free(m);
	unlink(model);
	unlink(data);
}

int main(void)
{
	test_alloc();
	test_probe();
	return unit_done("test_quant_sens");
}

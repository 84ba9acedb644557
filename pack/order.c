/* Expert ordering from co-selection counts; see pack.h. */
#include "pack.h"

#include <stdlib.h>
#include <string.h>

void mcv_order_chain(const mcv_cosel *c, int k, int *order)
{
	int E = c->n_expert;
	int w = k - 1 > 1 ? k - 1 : 1;
	char *placed = calloc((size_t)E, 1);
	double *score = calloc((size_t)E, sizeof *score);
	if (!placed || !score) {
		/* No memory for a better order: the identity is always valid. */
		for (int e = 0; e < E; e++)
			order[e] = e;
		free(placed);
		free(score);
		return;
	}
	for (int p = 0; p < E; p++) {
		/* Score against the last w placed experts, nearer ones weighing
		 * more: a co-selected pair at distance d costs d, so pulling a
		 * partner of the most recent expert closest matters most. */
		for (int j = 0; j < E; j++)
			score[j] = 0;
		for (int d = 1; d <= w && p - d >= 0; d++) {
			const uint64_t *row = c->cnt + (size_t)order[p - d] * E;
			for (int j = 0; j < E; j++)
				score[j] += (double)row[j] / d;
		}
		int best = -1;
		for (int j = 0; j < E; j++) {
			if (placed[j])
				continue;
			if (best < 0 || score[j] > score[best] ||
			    (score[j] == score[best] && c->freq[j] > c->freq[best]))
				best = j;
		}
		order[p] = best;
		placed[best] = 1;
	}
	free(placed);
	free(score);
}

double mcv_order_mean_distance(const mcv_cosel *c, const int *order)
{
	int E = c->n_expert;
	int *pos = malloc((size_t)E * sizeof *pos);
	if (!pos)
		return -1;
	for (int p = 0; p < E; p++)
		pos[order[p]] = p;
	double sum = 0, n = 0;
	for (int i = 0; i < E; i++)
		for (int j = i + 1; j < E; j++) {
			uint64_t x = c->cnt[(size_t)i * E + j];
			if (!x)
				continue;
			sum += (double)x * abs(pos[i] - pos[j]);
			n += (double)x;
		}
	free(pos);
	return n > 0 ? sum / n : 0;
}

int mcv_cosel_init(mcv_cosel *c, int n_expert)
{
	memset(c, 0, sizeof *c);
	if (n_expert < 1 || n_expert > 65536)
		return MCV_EINVAL;
	c->cnt = calloc((size_t)n_expert * n_expert, sizeof *c->cnt);
	c->freq = calloc((size_t)n_expert, sizeof *c->freq);
	if (!c->cnt || !c->freq) {
		mcv_cosel_free(c);
		return MCV_ENOMEM;
	}
	c->n_expert = n_expert;
	return 0;
}

void mcv_cosel_add(mcv_cosel *c, const int32_t *ids, int k)
{
	int E = c->n_expert;
	for (int a = 0; a < k; a++) {
		if (ids[a] < 0 || ids[a] >= E)
			continue;
		int dup = 0;
		for (int b = 0; b < a; b++)
			dup |= ids[b] == ids[a];
		if (dup)
			continue;
		c->freq[ids[a]]++;
		for (int b = 0; b < a; b++) {
			if (ids[b] < 0 || ids[b] >= E)
				continue;
			c->cnt[(size_t)ids[a] * E + ids[b]]++;
			c->cnt[(size_t)ids[b] * E + ids[a]]++;
		}
	}
	c->n_tokens++;
}

void mcv_cosel_free(mcv_cosel *c)
{
	free(c->cnt);
	free(c->freq);
	memset(c, 0, sizeof *c);
}

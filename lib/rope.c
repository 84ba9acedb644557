/* Interleaved multi-axis RoPE (Qwen3-VL / Qwen3.5 "IMRoPE").
 *
 * Rotated pair p (0 <= p < n_rot/2) couples dims p and p + n_rot/2 (NEOX
 * style) and turns by pos_axis * base^(-2p/n_rot).  The axis is chosen by
 * s = p mod (sum of sections), interleaved: s%3 == 0 -> t while s < 3*sec[0],
 * s%3 == 1 -> h while s < 3*sec[1], s%3 == 2 -> w while s < 3*sec[2],
 * otherwise the fourth axis.  Text tokens carry (p, p, p, 0), so for them
 * this is ordinary NEOX RoPE on the first n_rot dims.
 *
 * The angle is built by repeated float multiplication, as ggml does, so the
 * cos/sin we get are the ones llama.cpp gets. */
#include "model_impl.h"

#include <math.h>

void mcv_rope_cache(float *cs, int n_rot, const int32_t pos[4],
		    const int sections[4], float base)
{
	const float step = powf(base, -2.0f / (float)n_rot);
	const int total = sections[0] + sections[1] + sections[2] + sections[3];
	float th[4] = { (float)pos[0], (float)pos[1], (float)pos[2], (float)pos[3] };
	for (int p = 0; p < n_rot / 2; p++) {
		const int s = total > 0 ? p % total : 0;
		int axis;
		if (total <= 0)
			axis = 0; /* no sections: plain RoPE on axis t */
		else if (s % 3 == 1 && s < 3 * sections[1])
			axis = 1;
		else if (s % 3 == 2 && s < 3 * sections[2])
			axis = 2;
		else if (s % 3 == 0 && s < 3 * sections[0])
			axis = 0;
		else
			axis = 3;
		cs[2 * p] = cosf(th[axis]);
		cs[2 * p + 1] = sinf(th[axis]);
		for (int a = 0; a < 4; a++)
			th[a] *= step;
	}
}

void mcv_rope_apply(float *x, int n_rot, const float *cs)
{
	const int half = n_rot / 2;
	for (int p = 0; p < half; p++) {
		const float c = cs[2 * p], s = cs[2 * p + 1];
		const float x0 = x[p], x1 = x[p + half];
		x[p] = x0 * c - x1 * s;
		x[p + half] = x0 * s + x1 * c;
	}
}

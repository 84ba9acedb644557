/* Row normalisations and scalar activations, written to round like ggml's
 * CPU ops (double-precision sum of squares, float scale) so that our
 * logits track llama.cpp's closely. */
#include "model_impl.h"

#include <math.h>

void mcv_rms_norm(float *y, const float *x, const float *w, int n, float eps)
{
	double sum = 0.0;
	for (int i = 0; i < n; i++)
		sum += (double)(x[i] * x[i]);
	const float mean = (float)(sum / n);
	const float scale = 1.0f / sqrtf(mean + eps);
	if (w)
		for (int i = 0; i < n; i++)
			y[i] = x[i] * scale * w[i];
	else
		for (int i = 0; i < n; i++)
			y[i] = x[i] * scale;
}

/* llama.cpp builds the DeltaNet L2 norm as rms_norm(x, eps/n) / sqrt(n);
 * doing the same keeps eps where it puts it. */
void mcv_l2_norm(float *y, const float *x, int n, float eps)
{
	mcv_rms_norm(y, x, NULL, n, eps / (float)n);
	const float s = 1.0f / sqrtf((float)n);
	for (int i = 0; i < n; i++)
		y[i] *= s;
}

float mcv_silu(float x) { return x / (1.0f + expf(-x)); }
float mcv_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
float mcv_softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

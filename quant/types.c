/* Type traits of the ggml block formats mcv handles, and the half-precision
 * conversions every format uses for its scales. */
#include "blocks.h"
#include "quant.h"

#include <ctype.h>
#include <string.h>

/* Indexed by ggml type id; rows left zero are types mcv does not handle.
 * vec_dot_type is what ggml's CPU backend converts activations to on x86. */
static const mcv_type_traits type_table[] = {
	[MCV_F32] = { "f32", 1, sizeof(float), MCV_F32, 0 },
	[MCV_F16] = { "f16", 1, sizeof(uint16_t), MCV_F16, 0 },
	[MCV_Q4_0] = { "q4_0", MCV_QK, sizeof(block_q4_0), MCV_Q8_0, 1 },
	[MCV_Q5_0] = { "q5_0", MCV_QK, sizeof(block_q5_0), MCV_Q8_0, 1 },
	[MCV_Q5_1] = { "q5_1", MCV_QK, sizeof(block_q5_1), MCV_Q8_1, 1 },
	[MCV_Q8_0] = { "q8_0", MCV_QK, sizeof(block_q8_0), MCV_Q8_0, 1 },
	[MCV_Q8_1] = { "q8_1", MCV_QK, sizeof(block_q8_1), MCV_Q8_1, 1 },
	[MCV_Q2_K] = { "q2_K", MCV_QK_K, sizeof(block_q2_K), MCV_Q8_K, 1 },
	[MCV_Q3_K] = { "q3_K", MCV_QK_K, sizeof(block_q3_K), MCV_Q8_K, 1 },
	[MCV_Q4_K] = { "q4_K", MCV_QK_K, sizeof(block_q4_K), MCV_Q8_K, 1 },
	[MCV_Q5_K] = { "q5_K", MCV_QK_K, sizeof(block_q5_K), MCV_Q8_K, 1 },
	[MCV_Q6_K] = { "q6_K", MCV_QK_K, sizeof(block_q6_K), MCV_Q8_K, 1 },
	[MCV_Q8_K] = { "q8_K", MCV_QK_K, sizeof(block_q8_K), MCV_Q8_K, 1 },
	[MCV_BF16] = { "bf16", 1, sizeof(uint16_t), MCV_BF16, 0 },
};

#define N_TYPES ((int)(sizeof type_table / sizeof type_table[0]))

const mcv_type_traits *mcv_type_get(int type)
{
	if (type < 0 || type >= N_TYPES || !type_table[type].name)
		return NULL;
	return &type_table[type];
}

int mcv_type_from_name(const char *name)
{
	if (!name)
		return -1;
	for (int t = 0; t < N_TYPES; t++) {
		const char *a = type_table[t].name, *b = name;
		if (!a)
			continue;
		while (*a && *b && tolower((unsigned char)*a) == tolower((unsigned char)*b))
			a++, b++;
		if (!*a && !*b)
			return t;
	}
	return -1;
}

size_t mcv_row_bytes(int type, int64_t n)
{
	const mcv_type_traits *tt = mcv_type_get(type);
	if (!tt || n < 0 || n % tt->blck)
		return 0;
	return (size_t)(n / tt->blck) * tt->bytes;
}

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Round to nearest, ties to even, in integer arithmetic so the result does not
 * depend on the FPU mode or on F16C.  ggml's portable path gives the same bits
 * for every non-NaN input; a NaN becomes the canonical quiet 0x7E00 with the
 * sign kept (the payload is dropped), which is what ggml does too. */
uint16_t mcv_fp32_to_fp16(float f)
{
	uint32_t w = f32_bits(f);
	uint16_t sign = (uint16_t)((w >> 16) & 0x8000);
	uint32_t a = w & 0x7fffffff;

	if (a > 0x7f800000)
		return sign | 0x7e00;
	if (a >= 0x477ff000) /* rounds to >= 65536: overflow to infinity */
		return sign | 0x7c00;
	if (a >= 0x38800000) { /* normal half: exponent >= -14 */
		uint32_t r = a + 0x0fff + ((a >> 13) & 1);
		return sign | (uint16_t)((r >> 13) - ((127 - 15) << 10));
	}
	if (a < 0x33000000) /* below half the smallest subnormal (2^-25): zero */
		return sign;
	/* Subnormal half: value = m * 2^-24 with the implicit bit restored;
	 * shift the 24-bit significand right and round to even. */
	uint32_t e = a >> 23;           /* 102..112 */
	uint32_t m = (a & 0x7fffff) | 0x800000;
	uint32_t shift = 126 - e;       /* 14..24 */
	uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return sign | (uint16_t)q; /* q == 0x400 carries into the smallest normal */
}

/* Exact widening.  A NaN keeps its payload and comes out quiet, as ggml's
 * portable conversion (a multiply) and F16C both do. */
float mcv_fp16_to_fp32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;

	if (e == 0x1f)
		return f32_from_bits(sign | 0x7f800000 | (m ? 0x400000 : 0) | (m << 13));
	if (e == 0) {
		if (!m)
			return f32_from_bits(sign);
		/* Subnormal: normalise the significand. */
		int sh = 0;
		while (!(m & 0x400)) {
			m <<= 1;
			sh++;
		}
		return f32_from_bits(sign | ((uint32_t)(113 - sh) << 23) | ((m & 0x3ff) << 13));
	}
	return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

/* As ggml_compute_fp32_to_bf16: NaN keeps its top bits and is forced quiet
 * (bit 6 of the half); everything else rounds to nearest even, with
 * subnormals kept and overflow going to infinity. */
uint16_t mcv_fp32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 64);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

float mcv_bf16_to_fp32(uint16_t h)
{
	return f32_from_bits((uint32_t)h << 16);
}

#!/usr/bin/env bats
# Token-for-token parity of mcv's qwen35 / qwen35moe graph with llama.cpp
# (the peer: node-llama-cpp's prebuilt CPU library, scripts/peer/run.mjs) on
# tiny random models from mcv-genmodel.
#
# For each architecture and weight type the same 16-token prompt is run by
# both: the greedy continuations (mcv-run --temp 0 vs the peer) must agree
# on the first NEED tokens, and the first-step logits (mcv-logits vs the
# peer) must agree to TOL in max |log-softmax difference|.
#
# The peer runs with --shim (no weight repacking), the layout llama.cpp's own
# reference kernels compute: which CPU variant the prebuilt library picks
# decides which types it repacks, and repacked weights are summed in another
# order.  On an AVX-512 machine without AVX512-VNNI (session 13) it repacked
# Q8_0 too: first logits 0.049 apart from ours and from its own unrepacked
# run, which equals ours to 6e-9.
#
# Measured on this machine (AMD Zen 4, 2 threads): every case agrees on all
# 64 tokens except qwen35moe/q4_k (47); max |dlogsoftmax| is ~1e-5 for f32,
# ~6e-3 for f16 (llama.cpp's batched F16 GEMM rounds differently from its
# own single-token path), ~1e-8 for q8_0, ~3e-6 for q4_k.  The prompt length
# matters for Q4_K: llama.cpp repacks Q4_K weights and its GEMM on a
# remainder of 4-row groups past a multiple of 16 prompt rows departs from
# the exact Q4_K x Q8_K product by ~0.5%, which no faithful
# implementation matches; 16 rows stays on its exact path.
#
# Session 17 (Intel Xeon with AVX-512F/DQ/BW/VL, no VNNI: llama.cpp loads its
# skylakex variant): mcv rounds as that backend does (Q8_0 activations, the
# vector exp of SiLU and softmax, the F32 and attention products in the
# order of the kernel llama.cpp picks), and every f32, q8_0 and q4_k case
# agrees on all 64 tokens with max |dlogsoftmax| 5e-9 (the log-softmax's own
# rounding); f16 weights are not matched bit for bit (1e-6 and 6e-3).  On
# such a machine (AVX512F and AVX512DQ) those cases are held to 1e-6 and 64
# tokens; elsewhere to the looser figures of earlier machines.
#
# Skipped when node or the peer is absent (scripts/setup.sh installs it).

PROMPT=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
if grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx512dq /proc/cpuinfo; then
	EXACT_TOL=1e-6 EXACT_NEED=64
else
	EXACT_TOL=1e-3 EXACT_NEED=32
fi

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	local b=${B:-build}
	case $b in /*) ;; *) b=$PWD/$b ;; esac
	export GEN="$b/mcv-genmodel" LOGITS="$b/mcv-logits"
	local bin=${BIN:-bin}
	case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
	export MCVRUN="$bin/mcv-run"
	[ -x "$MCVRUN" ] || MCVRUN="$b/bin/mcv-run"
	export RUN="$PWD/scripts/peer/run.mjs"
	export MODELS="$BATS_FILE_TMPDIR/models"
	mkdir -p "$MODELS"
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	command -v node >/dev/null 2>&1 || skip "node is not installed"
	[ -d scripts/peer/node_modules/node-llama-cpp ] ||
		skip "llama.cpp peer absent (scripts/setup.sh installs it)"
	for x in "$GEN" "$LOGITS" "$MCVRUN"; do
		[ -x "$x" ] || { echo "not built: $x (run make)" >&2; return 1; }
	done
}

# parity ARCH TYPE NEED TOL
parity() {
	local arch=$1 t=$2 need=$3 tol=$4 m="$MODELS/$1-$2.gguf" peer ours logits
	[ -f "$m" ] || "$GEN" -q --arch "$arch" --type "$t" "$m" || return 1
	peer=$(node "$RUN" --model "$m" --tokens "$PROMPT" -n 64 --threads 2 --logits --shim) ||
		{ echo "$arch $t: llama.cpp failed"; return 1; }
	ours=$("$MCVRUN" -m "$m" --tokens "$PROMPT" -n 64 --temp 0 -t 2 --json) ||
		{ echo "$arch $t: mcv-run failed"; return 1; }
	logits=$("$LOGITS" "$m" "$PROMPT" 1) || { echo "$arch $t: mcv-logits failed"; return 1; }
	/usr/bin/python3 - "$arch/$t" "$need" "$tol" "$peer" "$ours" "$logits" <<'EOF'
import json, math, sys
what, need, tol = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
peer, ours, lg = (json.loads(a) for a in sys.argv[4:7])
a, b = ours["tokens"], peer["tokens"]
same = 0
for x, y in zip(a, b):
    if x != y:
        break
    same += 1
def lsm(v):
    mx = max(v)
    s = mx + math.log(sum(math.exp(x - mx) for x in v))
    return [x - s for x in v]
la, lb = lg["first_logits"], peer["first_logits"]
ok_len = len(la) == len(lb)
d = max(abs(x - y) for x, y in zip(lsm(la), lsm(lb))) if ok_len else float("inf")
ok = same >= need and d <= tol
print(f"{what}: {same}/{len(b)} greedy tokens equal (need {need}), "
      f"max |dlogsoftmax| {d:.3g} (tol {tol}) {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
}

@test "qwen35 f32: 64 greedy tokens and first logits equal llama.cpp's" {
	parity qwen35 f32 64 $EXACT_TOL
}

@test "qwen35moe f32: 64 greedy tokens and first logits equal llama.cpp's" {
	parity qwen35moe f32 64 $EXACT_TOL
}

@test "qwen35 f16: 64 greedy tokens, logits within 2e-2" {
	parity qwen35 f16 64 2e-2
}

@test "qwen35moe f16: 64 greedy tokens, logits within 2e-2" {
	parity qwen35moe f16 64 2e-2
}

@test "qwen35 q8_0: 64 greedy tokens and first logits equal llama.cpp's" {
	parity qwen35 q8_0 64 $EXACT_TOL
}

@test "qwen35moe q8_0: 64 greedy tokens and first logits equal llama.cpp's" {
	parity qwen35moe q8_0 64 $EXACT_TOL
}

@test "qwen35 q4_k: first 32 greedy tokens and first logits equal llama.cpp's" {
	parity qwen35 q4_k $EXACT_NEED $EXACT_TOL
}

@test "qwen35moe q4_k: first 32 greedy tokens and first logits equal llama.cpp's" {
	parity qwen35moe q4_k $EXACT_NEED $EXACT_TOL
}

#!/usr/bin/env bats
# The C runtime against the PyTorch reference (scripts/ref/, float64) on the
# proving model's text backbone: greedy tokens, the residual stream after
# every layer, the final norm and the first-step logits, over chat prompts of
# the data generator's text tasks and raw token sequences (7 and 70 tokens,
# prefilled by the C side in one batch, in 16-token batches and token by
# token).  scripts/ref/parity_c.py states the tolerances.  Proving-SHAPED
# random exports (F32 and Q8_0) always; the shipped
# examples/models/proving-text.gguf too when it exists (as shipped and
# dequantized to F32).
# Needs Debian's /usr/bin/python3 with torch and $B/mcv-hidden.

PY=/usr/bin/python3

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	export TMPM="$BATS_FILE_TMPDIR/models"
	mkdir -p "$TMPM"
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	$PY -c 'import torch' 2>/dev/null || skip "no torch in $PY (apt install python3-torch)"
	HID="${B:-build}/mcv-hidden"
	[ -x "$HID" ] || skip "$HID is not built (make)"
}

# The F32 export uses RoPE base 200 (the proving run's since step 5976), the
# Q8_0 one the default 1e6: the C side must take the base from the file.
# (Seed 13: with seed 11 at base 200 one chat prompt meets a near-tie in a
# later layer, 1e-4 everywhere up to it, where random weights amplify the
# float rounding past the F32 bound; seeds 13 and 14 do not.)
@test "reference vs C, proving-shaped F32: tokens equal, layers within 1e-5 (DeltaNet) / 2e-3 (after fp16 attention)" {
	$PY scripts/ref/export.py --random --seed 13 --type f32 --expert-type f32 --no-vision --rope-base 200 \
		--out-dir "$TMPM" --name f32 >/dev/null
	run $PY scripts/ref/parity_c.py --model "$TMPM/f32-text.gguf" --mcv-hidden "$HID" -n 16 -v
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"parity_c: ok"* ]]
}

@test "reference vs C, proving-shaped Q8_0: tokens equal up to a near-tie, layers within 5% rms" {
	$PY scripts/ref/export.py --random --seed 12 --no-vision --out-dir "$TMPM" --name q8 >/dev/null
	run $PY scripts/ref/parity_c.py --model "$TMPM/q8-text.gguf" --mcv-hidden "$HID" -n 16 -v
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"parity_c: ok"* ]]
}

# The shipped model as shipped (Q8_0) is compared with the float reference
# on chat prompts only: on raw byte-token sequences (1..7), far from
# anything it was trained on, the trained model amplifies the Q8_0 rounding
# of activations (which the C side does exactly as llama.cpp, and the float
# reference does not) to ~15% of the logits' RMS.  There the oracle for
# quantized numerics is llama.cpp, checked below; the dequantized-F32 run
# covers every prompt against the reference with the float criteria.
@test "reference vs C, the shipped proving model (as shipped, and dequantized to F32)" {
	[ -f examples/models/proving-text.gguf ] || skip "examples/models/proving-text.gguf not exported yet"
	run $PY scripts/ref/parity_c.py --model examples/models/proving-text.gguf --mcv-hidden "$HID" -n 24 -v --no-raw
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"parity_c: ok"* ]]
	# the trained weights under the float criteria (exact tokens), the reference rounding the
	# attention to fp16 as the C side does: without it the shipped weights of session 11 reach
	# 2.5e-3 at the last layer, with it 4e-5 (parity_c.py --help)
	$PY scripts/ref/parity_c.py --model examples/models/proving-text.gguf --write-f32 "$TMPM/proving-f32.gguf"
	run $PY scripts/ref/parity_c.py --model "$TMPM/proving-f32.gguf" --mcv-hidden "$HID" -n 24 -v --fp16-attention
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"parity_c: ok"* ]]
}

@test "the shipped proving model as shipped: first-step logits equal llama.cpp's on raw sequences" {
	[ -f examples/models/proving-text.gguf ] || skip "examples/models/proving-text.gguf not exported yet"
	command -v node >/dev/null 2>&1 || skip "node is not installed"
	[ -d scripts/peer/node_modules/node-llama-cpp ] || skip "peer not installed (scripts/setup.sh)"
	LOG="${B:-build}/mcv-logits"
	[ -x "$LOG" ] || skip "$LOG is not built"
	for toks in 1,2,3,4,5,6,7 2037,270,10,3,55,100,200,300,400,500; do
		"$LOG" examples/models/proving-text.gguf "$toks" > "$TMPM/c.json"
		node scripts/peer/run.mjs --shim --model examples/models/proving-text.gguf --tokens "$toks" -n 1 --logits \
			--threads 2 2>/dev/null > "$TMPM/l.json"
		run $PY -c '
import json, sys
import numpy as np
c = np.array(json.load(open(sys.argv[1]))["first_logits"])
l = np.array(json.load(open(sys.argv[2]))["first_logits"])
d = float(np.abs(c - l).max() / np.sqrt((l * l).mean()))
print(f"max |mcv - llama.cpp| / rms = {d:.3g}, argmax {c.argmax()} / {l.argmax()}")
sys.exit(0 if d < 1e-4 and c.argmax() == l.argmax() else 1)' "$TMPM/c.json" "$TMPM/l.json"
		echo "$toks: $output"
		[ "$status" -eq 0 ]
	done
}

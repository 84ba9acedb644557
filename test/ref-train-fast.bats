#!/usr/bin/env bats
# The training-only fast paths of the PyTorch reference (model.set_fast_training,
# train.py --fast on) give the reference forward's loss and gradients on a real
# training batch, and the check that says so fails when the fast path is broken.
# Needs Debian's /usr/bin/python3 with torch.

PY=/usr/bin/python3

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	$PY -c 'import torch' 2>/dev/null || skip "no torch in $PY (apt install python3-torch)"
	export OPENBLAS_NUM_THREADS=1
}

@test "fast training path: loss and gradients equal the reference (float64 1e-9, float32 as accurate)" {
	run $PY scripts/ref/check_train_fast.py --samples 4
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"float64 fast vs reference"* ]]
	[[ "$output" == *ok ]]
}

@test "fast training path check fails on a wrong expert, a lost DeltaNet state, a missing router gradient" {
	for m in expert deltanet router-grad; do
		run $PY scripts/ref/check_train_fast.py --dtype float64 --samples 2 --mutate $m
		echo "$m: $output"
		[ "$status" -eq 1 ]
		[[ "$output" == *FAIL* ]]
	done
}

@test "train.py --bench runs the fast path and the reference path" {
	for f in on off; do
		run $PY scripts/ref/train.py --bench --bench-steps 1 --out "$BATS_TEST_TMPDIR/run" --threads 1 --pool 8 \
			--tokens 512 --probe 0.3 --fast $f
		echo "$output"
		[ "$status" -eq 0 ]
		[[ "$output" == *"bench: 1 steps"* ]]
	done
}

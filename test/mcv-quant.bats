#!/usr/bin/env bats
# mcv-quant's contract: its fixed recipes give the same file as llama.cpp's
# own quantizer (llama_model_quantize from the peer's libllama, driven by
# $B/llama-quantize-peer) byte for byte, llama.cpp loads what it writes, and
# bad input is a one-line error with nothing written.  Models are tiny
# random-weight files from mcv-genmodel.

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	local b=${B:-build} bin=${BIN:-bin}
	case $b in /*) ;; *) b=$PWD/$b ;; esac
	case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
	export Q="$bin/mcv-quant" GEN="$b/mcv-genmodel" PEERQ="$b/llama-quantize-peer"
	export D="$BATS_FILE_TMPDIR"
	if [ -x "$GEN" ]; then
		"$GEN" -q --arch qwen35moe --shape tiny --type f32 "$D/moe-f32.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35moe --shape tiny --type f16 --experts 16 --heads 8 --layers 8 "$D/moe-f16.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35 --shape tiny --type f16 "$D/dense-f16.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35 --shape tiny --type bf16 "$D/dense-bf16.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35moe --shape tiny --type q8_0 "$D/moe-q8.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35moe --shape tiny --type q4_k "$D/moe-q4k.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35moe --shape tiny --type f32 --hidden 160 "$D/odd.gguf" >/dev/null 2>&1 || true
	fi
}

# hf DIR [mk-hf-checkpoint options]: a tiny HF checkpoint made from moe-f32.
hf() {
	local dir=$1
	shift
	/usr/bin/python3 scripts/mk-hf-checkpoint.py "$D/moe-f32.gguf" "$dir" "$@"
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$Q" ] || skip "no $Q (build first)"
	[ -s "$D/moe-f32.gguf" ] || skip "no tiny model ($GEN missing or failed)"
	T=$BATS_TEST_TMPDIR
}

need_peer() {
	[ -x "$PEERQ" ] || skip "no $PEERQ"
	[ -f scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so ] ||
		skip "peer libllama absent (scripts/setup.sh)"
}

load expect
EXPECT_TOOL=mcv-quant

# same MODEL RECIPE [mcv options]: mcv-quant and llama.cpp give identical files.
same() {
	local m=$1 r=$2
	shift 2
	"$PEERQ" --allow-requantize "$D/$m.gguf" "$T/peer.gguf" "$r" >"$T/peer.log" 2>&1 || { tail -5 "$T/peer.log"; return 1; }
	"$Q" -q --recipe "$r" "$@" "$D/$m.gguf" "$T/mcv.gguf"
	if ! cmp "$T/mcv.gguf" "$T/peer.gguf"; then
		echo "$m $r: files differ"; return 1
	fi
}

@test "q4_k_m: byte-identical to llama_model_quantize (moe f32, moe f16, dense f16, dense bf16)" {
	need_peer
	same moe-f32 q4_k_m
	same moe-f16 q4_k_m
	same dense-f16 q4_k_m
	same dense-bf16 q4_k_m
}

@test "every recipe: byte-identical to llama_model_quantize (moe f16, 8 layers, 16 experts, gqa 4)" {
	need_peer
	for r in q4_k_s q5_k_m q6_k q3_k_m q2_k q8_0; do same moe-f16 $r; done
}

@test "every recipe: byte-identical on the 8-expert moe and the dense model" {
	need_peer
	for r in q4_k_s q3_k_m q2_k; do same moe-f32 $r; done
	same dense-f16 q5_k_m
	same dense-f16 q3_k_m
}

@test "fallbacks for rows that are not a multiple of 256 match llama.cpp (q2_k, q6_k)" {
	need_peer
	[ -s "$D/odd.gguf" ] || skip "no odd-shaped model"
	same odd q2_k
	same odd q6_k
}

@test "--type overrides match llama.cpp's tensor-type overrides" {
	need_peer
	"$PEERQ" --type 'ffn_(gate|up)_exps=q2_k' --type 'attn_qkv=q8_0' "$D/moe-f32.gguf" "$T/peer.gguf" q4_k_m >/dev/null 2>&1
	"$Q" -q --type 'ffn_(gate|up)_exps=q2_k' --type 'attn_qkv=q8_0' "$D/moe-f32.gguf" "$T/mcv.gguf"
	cmp "$T/mcv.gguf" "$T/peer.gguf"
	"$Q" -q --type 'ffn_(gate|up)_exps=q2_k' --report "$T/r.tsv" "$D/moe-f32.gguf" "$T/mcv.gguf"
	grep -q $'^blk.0.ffn_up_exps.weight\t256x256x8\tq2_K\t' "$T/r.tsv"
}

@test "Q8_0 input is re-quantized with a warning, as llama.cpp with allow_requantize" {
	need_peer
	run "$Q" --recipe q4_k_m "$D/moe-q8.gguf" "$T/mcv.gguf"
	[ "$status" -eq 0 ]
	[[ "$output" == *"warning: re-quantizing"* ]]
	same moe-q8 q4_k_m
}

@test "llama.cpp loads and runs what mcv-quant writes" {
	command -v node >/dev/null || skip "no node"
	[ -f scripts/peer/node_modules/node-llama-cpp/package.json ] || skip "no peer (scripts/setup.sh)"
	for r in q4_k_m q2_k; do
		"$Q" -q --recipe $r "$D/moe-f32.gguf" "$T/$r.gguf"
		run node scripts/peer/run.mjs --model "$T/$r.gguf" --tokens 1,2,3 -n 4 --threads 2
		[ "$status" -eq 0 ] || { echo "$r: $output"; return 1; }
		[[ "$output" == *'"tokens":['* ]]
	done
	"$Q" -q --recipe q4_k_m "$D/dense-f16.gguf" "$T/dense.gguf"
	node scripts/peer/run.mjs --model "$T/dense.gguf" --tokens 1,2,3 -n 4 --threads 2 >/dev/null
}

@test "the proving model through mcv-quant (recipe and allocation): llama.cpp's greedy tokens equal mcv-run's" {
	command -v node >/dev/null || skip "no node"
	[ -f scripts/peer/node_modules/node-llama-cpp/package.json ] || skip "no peer (scripts/setup.sh)"
	local run=${BIN:-bin}/mcv-run model=examples/models/proving-text.gguf
	[ -x "$run" ] && [ -f "$model" ] || skip "no mcv-run or shipped model"
	# the shipped file is Q8_0: re-quantized (with its warning) like any input
	"$Q" -q --recipe q4_k_m "$model" "$T/recipe.gguf"
	"$Q" -q --target-bpw 4.5 "$model" "$T/alloc.gguf"
	local f p ids ours theirs
	for f in recipe alloc; do
		for p in "What is 2+3?" "Name three colours." "Write a short greeting to Anna."; do
			ids=$("$run" -m "$T/$f.gguf" -p "$p" -n 1 --temp 0 --json -q |
				sed -n 's/.*"prompt_tokens":\[\([0-9,]*\)\].*/\1/p')
			[ -n "$ids" ]
			ours=$("$run" -m "$T/$f.gguf" --tokens "$ids" -n 16 --temp 0 --ignore-eos --json -q |
				sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p')
			# with repacking (no --shim): on an AVX-512 machine without VNNI llama.cpp's unrepacked
			# Q4_K path rounds differently (first logits 0.01 apart) while its repacked one equals ours
			theirs=$(node scripts/peer/run.mjs --model "$T/$f.gguf" --tokens "$ids" -n 16 --threads 2 |
				sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p')
			[ "$(echo "$ours" | tr ',' '\n' | wc -l)" -eq 16 ] || { echo "$f '$p': mcv-run gave '$ours'"; return 1; }
			[ "$ours" = "$theirs" ] || near_tie "$T/$f.gguf" "$ids" "$ours" "$theirs" ||
				{ echo "$f '$p': mcv-run $ours, llama.cpp $theirs"; return 1; }
		done
	done
}

# near_tie MODEL PROMPT OURS THEIRS: the two greedy runs part at a step where our
# two candidates' logits are within 0.05 (a rounding difference decides it, as at
# step 9 of the session-14 files' greeting: 0.012), after at least 4 equal tokens
near_tie() {
	local logits=${GEN%/mcv-genmodel}/mcv-logits
	[ -x "$logits" ] || return 1
	/usr/bin/python3 - "$logits" "$@" <<'PYEOF'
import json, subprocess, sys
exe, model, prompt, ours, theirs = sys.argv[1:]
a, b = ours.split(','), theirs.split(',')
k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
if k is None or k < 4:
    sys.exit(f'parted at step {k}')
out = subprocess.run([exe, model, ','.join([prompt] + a[:k]), '1'], capture_output=True, text=True,
                     env={'OMP_NUM_THREADS': '2'}, check=True).stdout
lg = json.loads(out)['first_logits']
gap = lg[int(a[k])] - lg[int(b[k])]
print(f'near_tie: parted at step {k}: logit gap {gap:.4f}')
sys.exit(0 if 0 <= gap < 0.05 else 1)
PYEOF
}

@test "output does not depend on the thread count; '-' streams the same bytes" {
	"$Q" -q -t 1 --recipe q3_k_m "$D/moe-f16.gguf" "$T/a.gguf"
	"$Q" -q -t 3 --recipe q3_k_m "$D/moe-f16.gguf" "$T/b.gguf"
	cmp "$T/a.gguf" "$T/b.gguf"
	"$Q" -q --recipe q3_k_m "$D/moe-f16.gguf" - >"$T/c.gguf"
	cmp "$T/a.gguf" "$T/c.gguf"
}

@test "report: one TSV line per tensor, sizes add up to the data, -v table on stderr" {
	"$Q" -v --report "$T/r.tsv" "$D/moe-f32.gguf" "$T/o.gguf" 2>"$T/err"
	[ "$(head -1 "$T/r.tsv")" = $'tensor\tshape\ttype\tbits_per_weight\tbytes\test_loss' ]
	[ "$(($(wc -l <"$T/r.tsv") - 1))" -eq 76 ]
	grep -q $'^output.weight\t256x1024\tq6_K\t6.5625\t215040\t-$' "$T/r.tsv"
	grep -q '^blk.3.attn_v.weight ' "$T/err"
	sum=$(awk -F'\t' 'NR > 1 { s += $5 } END { print s }' "$T/r.tsv")
	size=$(stat -c %s "$T/o.gguf")
	[ "$sum" -lt "$size" ] && [ "$((size - sum))" -lt 65536 ]
}

@test "K-quant input: decoded and re-quantized with a one-line warning, byte-identical to llama_model_quantize --allow-requantize, llama.cpp loads it" {
	[ -s "$D/moe-q4k.gguf" ] || skip "no q4_k model"
	run "$Q" --recipe q4_k_m "$D/moe-q4k.gguf" "$T/o.gguf"
	[ "$status" -eq 0 ]
	[ "$(printf '%s\n' "$output" | grep -c 'warning: re-quantizing [0-9]* tensor(s) ([0-9]* q4_K)')" -eq 1 ]
	# a mix of every K-quant as input: the warning counts each type
	"$GEN" -q --arch qwen35moe --shape tiny --type q6_k --expert-type q3_k --embd-type q5_k \
		--output-type q2_k "$T/mixed.gguf"
	run "$Q" --recipe q4_k_m "$T/mixed.gguf" "$T/m.gguf"
	[ "$status" -eq 0 ]
	[[ "$output" == *"warning: re-quantizing"*"q2_K"*"q3_K"*"q5_K"*"q6_K"* ]]
	# an allocation reads K-quant input too; KL probes need float weights
	"$Q" -q --target-bpw 4.5 "$D/moe-q4k.gguf" "$T/a.gguf"
	echo '{"tokens": [1, 2, 3, 4]}' >"$T/p.jsonl"
	expect 1 "$Q" --target-bpw 4.5 --probe "$T/p.jsonl" "$D/moe-q4k.gguf" "$T/k.gguf"
	grep -q 'probing needs F32, F16 or BF16' "$T/err"
	[ ! -e "$T/k.gguf" ]
	need_peer
	for r in q4_k_m q2_k q6_k q8_0; do
		same moe-q4k $r
	done
	"$PEERQ" --allow-requantize "$T/mixed.gguf" "$T/peer.gguf" q3_k_m >"$T/peer.log" 2>&1
	"$Q" -q --recipe q3_k_m "$T/mixed.gguf" "$T/mcv.gguf"
	cmp "$T/mcv.gguf" "$T/peer.gguf"
	command -v node >/dev/null || skip "no node"
	for f in o m a; do
		run node scripts/peer/run.mjs --model "$T/$f.gguf" --tokens 1,2,3 -n 4 --threads 2
		[ "$status" -eq 0 ] && [[ "$output" == *'"tokens":['* ]] || { echo "$f: $output"; return 1; }
	done
}

@test "truncated input (header intact, tensor data cut): one-line error, nothing written" {
	for m in moe-f32 moe-q4k; do
		[ -s "$D/$m.gguf" ] || continue
		size=$(stat -c %s "$D/$m.gguf")
		for cut in $((size / 2)) $((size - 1)); do
			head -c "$cut" "$D/$m.gguf" >"$T/trunc.gguf"
			expect 1 "$Q" "$T/trunc.gguf" "$T/o.gguf"
			grep -q 'beyond end of file' "$T/err"
			expect 1 "$Q" --target-bpw 4 "$T/trunc.gguf" "$T/o.gguf"
			[ -z "$(ls "$T" | grep 'o.gguf')" ]
		done
	done
}

@test "rows not a multiple of 256: llama.cpp's Q5_0/Q5_1/Q8_0/Q4_0 fallbacks, byte-identical, and both runtimes agree" {
	[ -s "$D/odd.gguf" ] || skip "no odd-shaped model"
	need_peer
	for r in q4_k_m q5_k_m q6_k q3_k_m; do
		same odd $r
	done
	"$Q" -q --recipe q4_k_m --report "$T/r.tsv" "$D/odd.gguf" "$T/a.gguf"
	grep -q $'\tq5_0\t' "$T/r.tsv"
	"$Q" -q --recipe q5_k_m --report "$T/r.tsv" "$D/odd.gguf" "$T/b.gguf"
	grep -q $'\tq5_1\t' "$T/r.tsv"
	# greedy tokens of mcv-run on the Q5_0 / Q5_1 files equal llama.cpp's
	command -v node >/dev/null || skip "no node"
	local logits=${GEN%/mcv-genmodel}/mcv-logits
	[ -x "$logits" ] || skip "no $logits"
	for f in a b; do
		want=$(node scripts/peer/run.mjs --shim --model "$T/$f.gguf" --tokens 1,2,3,4,5 -n 4 --threads 2 | grep -o '"tokens":\[[0-9,]*\]')
		got=$(OMP_NUM_THREADS=2 "$logits" "$T/$f.gguf" 1,2,3,4,5 4 | grep -o '"tokens":\[[0-9,]*\]')
		[ -n "$want" ] && [ "$want" = "$got" ] || { echo "$f: llama $want mcv $got"; return 1; }
	done
}

@test "bad input and bad usage" {
	expect 2 "$Q" --recipe q9_k "$D/moe-f32.gguf" "$T/o.gguf"
	expect 2 "$Q" --type 'x=q7_k' "$D/moe-f32.gguf" "$T/o.gguf"
	expect 2 "$Q" --type 'noequals' "$D/moe-f32.gguf" "$T/o.gguf"
	expect 2 "$Q" "$D/moe-f32.gguf"
	expect 1 "$Q" --type '(=q4_k' "$D/moe-f32.gguf" "$T/o.gguf"
	expect 1 "$Q" "$T/missing.gguf" "$T/o.gguf"
	head -c 1000 "$D/moe-f32.gguf" >"$T/trunc.gguf"
	expect 1 "$Q" "$T/trunc.gguf" "$T/o.gguf"
	[ -z "$(ls "$T" | grep 'o.gguf')" ]
	run "$Q" --help
	[ "$status" -eq 0 ] && [[ "$output" == usage:* ]]
}

@test "--imatrix (legacy .dat and GGUF): byte-identical to llama_model_quantize with the same importance" {
	need_peer
	/usr/bin/python3 scripts/mk-imatrix.py "$D/moe-f32.gguf" "$T/im.dat"
	/usr/bin/python3 scripts/mk-imatrix.py "$D/moe-f32.gguf" "$T/im.gguf" --gguf
	for im in im.dat im.gguf; do
		for r in q4_k_m q2_k; do
			"$PEERQ" --imatrix "$T/$im" "$D/moe-f32.gguf" "$T/peer.gguf" $r >/dev/null 2>&1
			"$Q" -q --imatrix "$T/$im" --recipe $r "$D/moe-f32.gguf" "$T/mcv.gguf"
			cmp "$T/mcv.gguf" "$T/peer.gguf"
		done
	done
	# and the importance is really used
	"$Q" -q --recipe q2_k "$D/moe-f32.gguf" "$T/plain.gguf"
	! cmp -s "$T/plain.gguf" "$T/mcv.gguf"
}

@test "a truncated or mismatched importance matrix is an error with nothing written" {
	/usr/bin/python3 scripts/mk-imatrix.py "$D/moe-f32.gguf" "$T/im.dat"
	head -c 5000 "$T/im.dat" >"$T/short.dat"
	expect 1 "$Q" --imatrix "$T/short.dat" "$D/moe-f32.gguf" "$T/o.gguf"
	grep -q 'truncated' "$T/err"
	/usr/bin/python3 scripts/mk-imatrix.py "$D/moe-f16.gguf" "$T/other.dat"
	expect 1 "$Q" --imatrix "$T/other.dat" "$D/moe-f32.gguf" "$T/o.gguf"
	grep -q 'the tensor needs' "$T/err"
	[ -z "$(ls "$T" | grep 'o.gguf')" ]
}

@test "HF checkpoint (sharded, fused and per-expert experts; dense): converts to the GGUF it came from" {
	hf "$T/hf" --fused-experts --shards 2 --vision
	run "$Q" --recipe f32 "$T/hf" "$T/o.gguf"
	[ "$status" -eq 0 ]
	[[ "$output" == *"left out 2 vision-tower"* ]]
	/usr/bin/python3 scripts/mk-hf-checkpoint.py --compare "$D/moe-f32.gguf" "$T/o.gguf"
	"$GEN" -q --arch qwen35 --shape tiny --type f32 "$T/dense.gguf"
	/usr/bin/python3 scripts/mk-hf-checkpoint.py "$T/dense.gguf" "$T/hfd"
	"$Q" -q --recipe f32 "$T/hfd" "$T/od.gguf"
	/usr/bin/python3 scripts/mk-hf-checkpoint.py --compare "$T/dense.gguf" "$T/od.gguf"
}

@test "HF checkpoint -> q4_k_m: llama.cpp loads it and generates what the GGUF route generates" {
	command -v node >/dev/null || skip "no node"
	[ -f scripts/peer/node_modules/node-llama-cpp/package.json ] || skip "no peer (scripts/setup.sh)"
	hf "$T/hf" --fused-experts
	"$Q" -q "$T/hf" "$T/a.gguf"
	"$Q" -q "$D/moe-f32.gguf" "$T/b.gguf"
	a=$(node scripts/peer/run.mjs --model "$T/a.gguf" --tokens 1,2,3 -n 4 --threads 2 | grep -o '"tokens":\[[0-9,]*\]')
	b=$(node scripts/peer/run.mjs --model "$T/b.gguf" --tokens 1,2,3 -n 4 --threads 2 | grep -o '"tokens":\[[0-9,]*\]')
	[ -n "$a" ] && [ "$a" = "$b" ]
	hf "$T/hfb" --bf16
	"$Q" -q --recipe q8_0 "$T/hfb" "$T/c.gguf"
	node scripts/peer/run.mjs --model "$T/c.gguf" --tokens 1,2,3 -n 2 --threads 2 >/dev/null
}

@test "bad HF input: unmappable name, unknown or unsupported dtype, truncated or lying file; nothing written" {
	hf "$T/h1" --extra model.layers.0.mlp.bogus.weight
	expect 1 "$Q" "$T/h1" "$T/o.gguf"
	grep -q "model.layers.0.mlp.bogus.weight" "$T/err"
	hf "$T/h2" --dtype-of model.language_model.norm.weight=F12
	expect 1 "$Q" "$T/h2" "$T/o.gguf"
	grep -q "unknown dtype 'F12'" "$T/err"
	hf "$T/h3" --dtype-of model.language_model.norm.weight=I32
	expect 1 "$Q" "$T/h3" "$T/o.gguf"
	grep -q "only F32, F16 and BF16" "$T/err"
	hf "$T/h4"
	f=$(ls "$T"/h4/*.safetensors)
	truncate -s -100 "$f"
	expect 1 "$Q" "$T/h4" "$T/o.gguf"
	grep -q "truncated" "$T/err"
	# a header length that points past the end of the file
	printf '\377\377\377\377' | dd of="$f" bs=1 seek=0 conv=notrunc 2>/dev/null
	expect 1 "$Q" "$T/h4" "$T/o.gguf"
	grep -q "header length" "$T/err"
	hf "$T/h5"
	rm "$T/h5/config.json"
	expect 1 "$Q" "$T/h5" "$T/o.gguf"
	[ -z "$(ls "$T" | grep 'o.gguf')" ]
}

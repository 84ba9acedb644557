#!/usr/bin/env bats
# mcv-genmodel: random-weight qwen35 / qwen35moe models that mcv's reader and
# llama.cpp (the peer, node-llama-cpp) both load.  The llama.cpp parts are
# skipped when the peer is not installed (scripts/setup.sh installs it).

TYPES="f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k q3_k q2_k"

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	local b=${B:-build}
	case $b in /*) ;; *) b=$PWD/$b ;; esac
	export GEN="$b/mcv-genmodel"
	export RUN="$PWD/scripts/peer/run.mjs"
	export MODELS="$BATS_FILE_TMPDIR/models"
	mkdir -p "$MODELS"
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$GEN" ] || { echo "not built: $GEN (run make)" >&2; return 1; }
}

peer_or_skip() {
	command -v node >/dev/null 2>&1 || skip "node is not installed"
	[ -d scripts/peer/node_modules/node-llama-cpp ] ||
		skip "llama.cpp peer absent (scripts/setup.sh installs it)"
}

# model ARCH TYPE -> path of a tiny model, generated once per file run
model() {
	local m="$MODELS/$1-$2.gguf"
	[ -f "$m" ] || "$GEN" -q --arch "$1" --type "$2" "$m" || return 1
	echo "$m"
}

# Greedy 8 tokens from llama.cpp must be valid ids and not all the same.
peer_generates() {
	local arch=$1 t m out
	for t in $TYPES; do
		m=$(model "$arch" "$t") || { echo "$arch $t: generation failed"; return 1; }
		out=$(node "$RUN" --shim --model "$m" --tokens 9,33,72,101,108,108,111 -n 8 --threads 1) ||
			{ echo "$arch $t: llama.cpp failed"; return 1; }
		/usr/bin/python3 - "$arch $t" "$out" <<'EOF' || return 1
import json, sys
what, o = sys.argv[1], json.loads(sys.argv[2])
tok = o["tokens"]
ok = len(tok) == 8 and all(0 <= x < 1024 for x in tok) and len(set(tok)) > 1
print(what, tok, "ok" if ok else "BAD")
sys.exit(0 if ok else 1)
EOF
	done
}

@test "tiny models of every type read back through mcv's GGUF reader, byte for byte" {
	for arch in qwen35 qwen35moe; do
		for t in $TYPES; do
			run "$GEN" -q --check --arch "$arch" --type "$t" "$MODELS/$arch-$t.gguf"
			[ "$status" -eq 0 ] || { echo "$arch $t: $output"; return 1; }
		done
	done
}

@test "--verify accepts the generated file and rejects one flipped byte" {
	f="$BATS_TEST_TMPDIR/v.gguf"
	"$GEN" -q --type q5_k --seed 3 "$f"
	run "$GEN" -q --verify --type q5_k --seed 3 "$f"
	[ "$status" -eq 0 ]
	run "$GEN" -q --verify --type q5_k --seed 4 "$f"
	[ "$status" -eq 1 ] && [[ "$output" == *"differs from the generator"* ]]
	/usr/bin/python3 -c '
import os, sys
f = sys.argv[1]; n = os.path.getsize(f)
with open(f, "r+b") as h:
    h.seek(n * 2 // 3); b = h.read(1); h.seek(n * 2 // 3); h.write(bytes([b[0] ^ 0x10]))
' "$f"
	run "$GEN" -q --verify --type q5_k --seed 3 "$f"
	[ "$status" -eq 1 ] && [[ "$output" == *"differs from the generator"* ]]
}

@test "per-role types, overrides and the check reader agree" {
	run "$GEN" -q --check --arch qwen35moe --type q6_k --expert-type q2_k --embd-type f16 \
		--output-type q4_0 --layers 5 --experts 4 --experts-used 3 --vocab 512 \
		--full-attn-interval 2 "$BATS_TEST_TMPDIR/mix.gguf"
	[ "$status" -eq 0 ]
	run "$GEN" -q --check --arch qwen35 --shape 1b --layers 4 --hidden 256 --heads 4 --kv-heads 1 \
		--head-dim 64 --ssm-groups 2 --ssm-heads 4 --ssm-state 64 --ffn 512 --vocab 400 \
		--type q5_k "$BATS_TEST_TMPDIR/dense.gguf"
	[ "$status" -eq 0 ]
}

@test "llama.cpp loads tiny qwen35 of every type and generates greedily" {
	peer_or_skip
	peer_generates qwen35
}

@test "llama.cpp loads tiny qwen35moe of every type and generates greedily" {
	peer_or_skip
	peer_generates qwen35moe
}

@test "llama.cpp loads per-role types and overridden shapes" {
	peer_or_skip
	"$GEN" -q --arch qwen35moe --type q6_k --expert-type q2_k --embd-type f16 \
		--output-type q4_0 --layers 5 --experts 4 --experts-used 3 --vocab 512 \
		--full-attn-interval 2 "$BATS_TEST_TMPDIR/mix.gguf"
	"$GEN" -q --arch qwen35 --shape 1b --layers 4 --hidden 256 --heads 4 --kv-heads 1 \
		--head-dim 64 --ssm-groups 2 --ssm-heads 4 --ssm-state 64 --ffn 512 --vocab 400 \
		--type q5_k "$BATS_TEST_TMPDIR/dense.gguf"
	run node "$RUN" --shim --model "$BATS_TEST_TMPDIR/dense.gguf" --tokens 1,2,3 -n 4 --threads 1
	[ "$status" -eq 0 ] && [[ "$output" == *'"tokens":['* ]]
	run node "$RUN" --shim --model "$BATS_TEST_TMPDIR/mix.gguf" --tokens 1,2,3 -n 4 --threads 1 --logits
	[ "$status" -eq 0 ]
	/usr/bin/python3 -c '
import json, sys, math
o = json.loads(sys.argv[1])
assert len(o["tokens"]) == 4 and len(o["first_logprobs"]) == 512, o.keys()
lp = o["first_logprobs"]
assert abs(sum(math.exp(x) for x in lp) - 1) < 1e-3
assert max(range(512), key=lambda i: lp[i]) == o["tokens"][0]
' "$output"
}

@test "the vocabulary tokenizes in llama.cpp: bytes, merges, special tokens" {
	peer_or_skip
	m=$(model qwen35moe q8_0)
	run node "$RUN" --model "$m" --tokenize "Hi"
	[ "$status" -eq 0 ]
	[ "$output" = '{"tokens":[72,105]}' ]
	# " the" is one merge token; <|im_start|> is one control token
	run node "$RUN" --model "$m" --tokenize "<|im_start|> the"
	[ "$status" -eq 0 ]
	/usr/bin/python3 -c '
import json, sys
t = json.loads(sys.argv[1])["tokens"]
assert len(t) == 2 and t[0] >= 256 and t[1] >= 256 and t[0] != t[1], t
' "$output"
	run node "$RUN" --model "$m" --detokenize 72,105
	[ "$output" = '{"text":"Hi"}' ]
}

@test "peer --shim: repacking off, thread pool attached, same tokens on Q8_0" {
	peer_or_skip
	command -v cc >/dev/null 2>&1 || skip "no C compiler for the shim"
	m=$(model qwen35moe q8_0)
	a=$(node "$RUN" --model "$m" --tokens 5,6,7 -n 8 --threads 2)
	MCV_SHIM_VERBOSE=1 node "$RUN" --shim --model "$m" --tokens 5,6,7 -n 8 --threads 2 \
		>"$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err"
	grep -q "repacking off" "$BATS_TEST_TMPDIR/err"
	grep -q "thread pool of 2 threads attached" "$BATS_TEST_TMPDIR/err"
	/usr/bin/python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
assert b["shim"] and not a["shim"], (a["shim"], b["shim"])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
' "$a" "$BATS_TEST_TMPDIR/out"
	# llama.cpp's own log: Q4_0 weights go to a CPU_REPACK buffer only without the shim
	q=$(model qwen35moe q4_0)
	node "$RUN" --verbose --model "$q" --tokens 1,2 -n 1 --threads 1 2>&1 >/dev/null | grep -q "CPU_REPACK model buffer"
	! node "$RUN" --shim --verbose --model "$q" --tokens 1,2 -n 1 --threads 1 2>&1 >/dev/null | grep -q "CPU_REPACK"
}

@test "--fast-quant q4_k: valid blocks that read back and load in llama.cpp" {
	run "$GEN" -q --check --fast-quant --type q4_k "$BATS_TEST_TMPDIR/fq.gguf"
	[ "$status" -eq 0 ]
	"$GEN" -q --type q4_k "$BATS_TEST_TMPDIR/ref.gguf"
	! cmp -s "$BATS_TEST_TMPDIR/fq.gguf" "$BATS_TEST_TMPDIR/ref.gguf"
	peer_or_skip
	run node "$RUN" --model "$BATS_TEST_TMPDIR/fq.gguf" --tokens 1,2,3 -n 8 --threads 1
	[ "$status" -eq 0 ]
	[[ "$output" == *'"tokens":['* ]]
}

@test "same seed gives a byte-identical file at any thread count and on stdout; another seed differs" {
	"$GEN" -q --seed 7 -t 1 --type q4_k "$BATS_TEST_TMPDIR/a.gguf"
	"$GEN" -q --seed 7 -t 2 --type q4_k "$BATS_TEST_TMPDIR/b.gguf"
	"$GEN" -q --seed 8 -t 2 --type q4_k "$BATS_TEST_TMPDIR/c.gguf"
	"$GEN" -q --seed 7 --type q4_k - > "$BATS_TEST_TMPDIR/d.gguf"
	cmp "$BATS_TEST_TMPDIR/a.gguf" "$BATS_TEST_TMPDIR/b.gguf"
	cmp "$BATS_TEST_TMPDIR/a.gguf" "$BATS_TEST_TMPDIR/d.gguf"
	! cmp -s "$BATS_TEST_TMPDIR/a.gguf" "$BATS_TEST_TMPDIR/c.gguf"
}

# Start a large generation, wait until its temporary file has data.
start_big() {
	"$GEN" -q --shape small --type q4_k "$1" 2>"$BATS_TEST_TMPDIR/err" &
	pid=$!
	for _ in $(seq 200); do
		ls "$1".tmp.* >/dev/null 2>&1 && [ "$(cat "$1".tmp.* | head -c 100000 | wc -c)" -ge 100000 ] && return 0
		sleep 0.1
	done
	return 1
}

@test "SIGTERM during generation leaves neither the output nor a temporary file" {
	out="$BATS_TEST_TMPDIR/big.gguf"
	start_big "$out"
	kill -TERM "$pid"
	rc=0; wait "$pid" || rc=$?
	[ "$rc" -eq 1 ]
	grep -q "^mcv-genmodel: interrupted" "$BATS_TEST_TMPDIR/err"
	[ ! -e "$out" ]
	! ls "$out".tmp.* 2>/dev/null
}

@test "SIGKILL during generation leaves an existing output untouched" {
	out="$BATS_TEST_TMPDIR/keep.gguf"
	echo old > "$out"
	start_big "$out"
	kill -KILL "$pid"
	wait "$pid" || true
	[ "$(cat "$out")" = old ]
	rm -f "$out".tmp.* # a SIGKILLed process cannot remove its temporary file
}

@test "usage errors exit 2, runtime errors exit 1, with one line" {
	run "$GEN"
	[ "$status" -eq 2 ]
	run "$GEN" --type q9_9 x.gguf
	[ "$status" -eq 2 ] && [[ "$output" == "mcv-genmodel: "* ]]
	run "$GEN" --shape huge x.gguf
	[ "$status" -eq 2 ]
	run "$GEN" --layers 0 x.gguf
	[ "$status" -eq 2 ]
	run "$GEN" --vocab 100 x.gguf
	[ "$status" -eq 2 ]
	# a K-quant needs rows that are a multiple of 256
	run "$GEN" --hidden 96 --type q4_k "$BATS_TEST_TMPDIR/x.gguf"
	[ "$status" -eq 2 ] && [[ "$output" == *"multiple of 256"* ]]
	[ ! -e "$BATS_TEST_TMPDIR/x.gguf" ]
	run "$GEN" -q "$BATS_TEST_TMPDIR/no/such/dir/x.gguf"
	[ "$status" -eq 1 ] && [[ "$output" == "mcv-genmodel: "* ]]
	[ "${#lines[@]}" -eq 1 ]
}

@test "peer harness: bad model or options give one line on stderr" {
	peer_or_skip
	run node "$RUN" --model "$BATS_TEST_TMPDIR/missing.gguf" --tokens 1
	[ "$status" -eq 1 ] && [[ "$output" == "peer: "* ]] && [ "${#lines[@]}" -eq 1 ]
	head -c 5000 "$(model qwen35 q8_0)" > "$BATS_TEST_TMPDIR/trunc.gguf"
	run node "$RUN" --model "$BATS_TEST_TMPDIR/trunc.gguf" --tokens 1
	[ "$status" -eq 1 ] && [ "${#lines[@]}" -eq 1 ]
	run node "$RUN" --model x.gguf
	[ "$status" -eq 2 ]
}

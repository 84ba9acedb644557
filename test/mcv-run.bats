#!/usr/bin/env bats
# mcv-run's contract: options, exit codes, one-line errors on bad input
# (never a signal), JSON output, determinism.  Models are tiny random-weight
# files from mcv-genmodel, and broken copies of them made here.

PY=/usr/bin/python3

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	B=${B:-build}
	BIN=${BIN:-bin}
	export RUN="$BIN/mcv-run" GEN="$B/mcv-genmodel"
	export M="$BATS_FILE_TMPDIR/tiny.gguf"
	# one thread keeps the many short runs fast on a busy machine; the
	# determinism test sets -t itself
	export OMP_NUM_THREADS=1
	[ -x "$GEN" ] && "$GEN" -q --shape tiny "$M" >/dev/null 2>&1 || true
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$RUN" ] || skip "no $RUN (build first)"
	T=$BATS_TEST_TMPDIR
}

need_model() {
	[ -s "$M" ] || skip "no tiny model ($GEN missing or failed)"
}

load expect
EXPECT_TOOL=mcv-run

# patch IN OUT PYTHON-EXPR: OUT = IN with bytes transformed by an expression
# over `d` (a bytearray of the file).
patch() {
	$PY - "$1" "$2" "$3" <<'EOF'
import sys, struct
d = bytearray(open(sys.argv[1], "rb").read())
exec(sys.argv[3])
open(sys.argv[2], "wb").write(d)
EOF
}

@test "--help exits 0 and mentions every option" {
	run "$RUN" --help
	[ "$status" -eq 0 ]
	opts=$(sed -n 's/^\t{ "\([a-z-]*\)", .*/\1/p' cmd/mcv-run.c)
	[ -n "$opts" ]
	for o in $opts; do
		printf '%s\n' "$output" | grep -q -- "--$o" || { echo "--help lacks --$o"; return 1; }
	done
}

@test "man page documents every option" {
	for o in $(sed -n 's/^\t{ "\([a-z-]*\)", .*/\1/p' cmd/mcv-run.c); do
		grep -q -- "^\.It Fl \(. , \)\?-$o\|Fl -$o" man/mcv-run.1 || { echo "man page lacks --$o"; return 1; }
	done
}

@test "--version prints the library version" {
	v=$(sed -n 's/^#define MCV_VERSION "\(.*\)"/\1/p' lib/mcv.h)
	run "$RUN" --version
	[ "$status" -eq 0 ]
	[ "$output" = "mcv-run $v" ]
}

@test "usage errors exit 2 with one line" {
	expect 2 "$RUN" --bogus -p hi
	expect 2 "$RUN" -x
	expect 2 "$RUN" -p hi extra-argument
	expect 2 "$RUN" -p
	expect 2 "$RUN" -n abc -p hi
	expect 2 "$RUN" -n 12x -p hi
	expect 2 "$RUN" -t 0 -p hi
	expect 2 "$RUN" -t -3 -p hi
	expect 2 "$RUN" --temp -1 -p hi
	expect 2 "$RUN" --temp nan -p hi
	expect 2 "$RUN" --top-p 1.5 -p hi
	expect 2 "$RUN" --min-p=-0.1 -p hi
	expect 2 "$RUN" --seed -5 -p hi
	expect 2 "$RUN" --ctx 0 -p hi
	expect 2 "$RUN" --tokens 1,x,3
	expect 2 "$RUN" --tokens ""
	expect 2 "$RUN" --json=yes -p hi
	expect 2 "$RUN" -p hi -f /dev/null
}

@test "an empty prompt is a usage error" {
	expect 2 "$RUN" -m /nonexistent.gguf -p ""
	expect 2 "$RUN" -m /nonexistent.gguf </dev/null
	expect 2 "$RUN" -m /nonexistent.gguf -f /dev/null
}

@test "missing, directory and empty model files exit 1" {
	expect 1 "$RUN" -m "$T/nonexistent.gguf" -p hi
	grep -q 'nonexistent.gguf' "$T/err"
	expect 1 "$RUN" -m "$T" -p hi
	: >"$T/empty.gguf"
	expect 1 "$RUN" -m "$T/empty.gguf" -p hi
	printf 'not a gguf file at all\n' >"$T/text.gguf"
	expect 1 "$RUN" -m "$T/text.gguf" -p hi
	expect 1 "$RUN" -m /dev/null -p hi
}

@test "a missing prompt file exits 1" {
	expect 1 "$RUN" -m "$T/x.gguf" -f "$T/no-such-prompt.txt"
}

@test "the default model: found, or a clear error" {
	if [ -f examples/models/proving-text.gguf ]; then skip "the default model exists"; fi
	MCV_DATADIR=$T expect 1 "$RUN" -p hi
	grep -q 'proving-text.gguf' "$T/err"
}

@test "truncated models exit 1" {
	need_model
	size=$(stat -c %s "$M")
	for n in 4 16 24 100 1000 20000 $((size / 2)) $((size - 1)); do
		head -c "$n" "$M" >"$T/trunc.gguf"
		expect 1 "$RUN" -m "$T/trunc.gguf" --tokens 1 -n 1 || { echo "at $n bytes"; return 1; }
	done
}

@test "hostile headers exit 1" {
	need_model
	patch "$M" "$T/h1.gguf" 'd[0:4] = b"GGUG"'
	expect 1 "$RUN" -m "$T/h1.gguf" --tokens 1 -n 1
	patch "$M" "$T/h2.gguf" 'd[4:8] = struct.pack("<I", 99)'
	expect 1 "$RUN" -m "$T/h2.gguf" --tokens 1 -n 1
	patch "$M" "$T/h3.gguf" 'd[8:16] = struct.pack("<Q", 1 << 60)'
	expect 1 "$RUN" -m "$T/h3.gguf" --tokens 1 -n 1
	patch "$M" "$T/h4.gguf" 'd[16:24] = struct.pack("<Q", (1 << 64) - 1)'
	expect 1 "$RUN" -m "$T/h4.gguf" --tokens 1 -n 1
	patch "$M" "$T/h5.gguf" 'd[24:32] = struct.pack("<Q", 1 << 40)'
	expect 1 "$RUN" -m "$T/h5.gguf" --tokens 1 -n 1
}

@test "bit-flipped models never die by a signal" {
	need_model
	for i in $(seq 0 39); do
		patch "$M" "$T/f.gguf" "
import random
r = random.Random($i)
end = d.find(b'output_norm.weight') + 200
for _ in range(3):
    p = r.randrange(4, end)
    d[p] ^= 1 << r.randrange(8)"
		"$RUN" -m "$T/f.gguf" --tokens 1 -n 2 --temp 0 >"$T/out" 2>"$T/err" && rc=0 || rc=$?
		[ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || { echo "flip $i: exit $rc"; cat "$T/err"; return 1; }
		if [ "$rc" -eq 1 ]; then
			[ "$(wc -l <"$T/err")" -eq 1 ] && grep -q '^mcv-run: ' "$T/err" ||
				{ echo "flip $i:"; cat "$T/err"; return 1; }
		fi
	done
}

@test "an unknown architecture exits 1" {
	need_model
	patch "$M" "$T/arch.gguf" '
k = d.find(b"general.architecture") + len(b"general.architecture")
n = struct.unpack_from("<Q", d, k + 4)[0]
d[k + 12:k + 12 + n] = b"z" * n'
	expect 1 "$RUN" -m "$T/arch.gguf" -p hi
	grep -q 'architecture' "$T/err"
}

@test "a model missing a tensor exits 1" {
	need_model
	patch "$M" "$T/tensor.gguf" 'i = d.find(b"output_norm.weight"); d[i:i + 18] = b"output_norm.wfight"'
	expect 1 "$RUN" -m "$T/tensor.gguf" -p hi
	grep -q 'output_norm.weight' "$T/err"
}

@test "a model without merges or with an unknown pre-tokenizer exits 1" {
	need_model
	patch "$M" "$T/merges.gguf" 'i = d.find(b"tokenizer.ggml.merges"); d[i:i + 21] = b"tokenizer.ggml.merbes"'
	expect 1 "$RUN" -m "$T/merges.gguf" -p hi
	grep -q 'merges' "$T/err"
	patch "$M" "$T/pre.gguf" '
k = d.find(b"tokenizer.ggml.pre") + len(b"tokenizer.ggml.pre")
n = struct.unpack_from("<Q", d, k + 4)[0]
d[k + 12:k + 12 + n] = b"q" * n'
	expect 1 "$RUN" -m "$T/pre.gguf" -p hi
}

@test "token ids out of range exit 1" {
	need_model
	expect 1 "$RUN" -m "$M" --tokens 1,2,999999999
}

@test "greedy output is deterministic and JSON is well formed" {
	need_model
	"$RUN" -m "$M" -p "Hello there" -n 6 --temp 0 --json -t 2 >"$T/a.json"
	"$RUN" -m "$M" -p "Hello there" -n 6 --temp 0 --json -t 1 >"$T/b.json"
	$PY - "$T/a.json" "$T/b.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("model", "prompt", "text", "tokens", "prompt_tokens", "stats"):
    assert k in a, k
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
assert 0 < len(a["tokens"]) <= 6 or a["stop"] == "eos"
assert a["prompt"] == "Hello there"
assert a["stats"]["prompt_n"] == len(a["prompt_tokens"])
assert a["stats"]["decode_n"] == len(a["tokens"])
EOF
}

@test "the same seed gives the same tokens" {
	need_model
	"$RUN" -m "$M" -p "Once" -n 8 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 7 --json >"$T/a.json"
	"$RUN" -m "$M" -p "Once" -n 8 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 7 --json >"$T/b.json"
	$PY -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert a["tokens"]==b["tokens"] and a["seed"]==7' "$T/a.json" "$T/b.json"
}

@test "--tokens, --raw and --chat build the expected prompts" {
	need_model
	"$RUN" -m "$M" --tokens "1, 2,3" -n 1 --temp 0 --json >"$T/t.json"
	$PY -c 'import json,sys; a=json.load(open(sys.argv[1])); assert a["prompt_tokens"]==[1,2,3] and a["prompt"] is None' "$T/t.json"
	"$RUN" -m "$M" -p "hi" -n 1 --temp 0 --raw --json >"$T/r.json"
	"$RUN" -m "$M" -p "hi" -n 1 --temp 0 --json >"$T/c.json"
	"$RUN" -m "$M" -p "hi" -n 1 --temp 0 --think --system "Be brief." --json >"$T/s.json"
	$PY - "$T/r.json" "$T/c.json" "$T/s.json" <<'EOF'
import json, sys
r, c, s = (json.load(open(p))["prompt_tokens"] for p in sys.argv[1:4])
assert len(r) < len(c), (r, c)
# the chat prompt starts with the single <|im_start|> token and holds the raw one
assert c[0] not in r and c[0] == s[0]
n = len(r)
assert any(c[i:i + n] == r for i in range(len(c))), (r, c)
# --think drops the empty thinking block, --system adds a turn
assert len(s) != len(c)
EOF
}

@test "prompt from stdin and from a file; -n 0 generates nothing" {
	need_model
	echo "Hello" | "$RUN" -m "$M" -n 2 --temp 0 --json >"$T/a.json"
	printf 'Hello\n' >"$T/p.txt"
	"$RUN" -m "$M" -f "$T/p.txt" -n 2 --temp 0 --json >"$T/b.json"
	"$RUN" -m "$M" -p "Hello" -n 0 --json >"$T/c.json"
	$PY - "$T/a.json" "$T/b.json" "$T/c.json" <<'EOF'
import json, sys
a, b, c = (json.load(open(p)) for p in sys.argv[1:4])
assert a["prompt"] == "Hello\n" and a["tokens"] == b["tokens"]
assert c["tokens"] == [] and c["text"] == ""
EOF
}

@test "--stats prints one line on stderr; streamed text equals the JSON text" {
	need_model
	"$RUN" -m "$M" -p "Hello" -n 5 --temp 0 --stats >"$T/out" 2>"$T/err"
	[ "$(wc -l <"$T/err")" -eq 1 ]
	grep -Eq '^mcv-run: stats: .*prompt [0-9]+ tokens.*tok/s.*first token.*decode [0-9]+ tokens.*peak RSS [0-9]+ MiB' "$T/err"
	"$RUN" -m "$M" -p "Hello" -n 5 --temp 0 --json >"$T/j.json"
	$PY -c '
import json, sys
t = json.load(open(sys.argv[1]))["text"]
s = open(sys.argv[2], "rb").read().decode("utf-8", "surrogateescape")
s = "".join("\ufffd" if 0xDC80 <= ord(ch) <= 0xDCFF else ch for ch in s)
assert s == t, (s, t)' "$T/j.json" "$T/out"
}

@test "prompt tokens and greedy tokens match llama.cpp (peer) on the tiny model" {
	need_model
	[ -f scripts/peer/node_modules/node-llama-cpp/dist/index.js ] && command -v node >/dev/null ||
		skip "peer (node-llama-cpp) not installed"
	text='Hello, world! It'"'"'s 2026: café, 你好 😀
  next line'
	node scripts/peer/run.mjs --shim --model "$M" --prompt "$text" -n 12 --threads 1 >"$T/peer.json" 2>"$T/peer.err" ||
		skip "peer failed: $(head -n 1 "$T/peer.err")"
	"$RUN" -m "$M" --raw -p "$text" -n 12 --temp 0 --json >"$T/mcv.json"
	$PY - "$T/peer.json" "$T/mcv.json" <<'PYEOF'
import json, sys
p, m = (json.load(open(f)) for f in sys.argv[1:3])
assert p["prompt_tokens"] == m["prompt_tokens"], (p["prompt_tokens"], m["prompt_tokens"])
n = len(m["tokens"])  # mcv stops early at an end-of-turn token, the peer does not
assert n > 0 and p["tokens"][:n] == m["tokens"], (p["tokens"], m["tokens"])
PYEOF
}

#!/usr/bin/env bats
# mcv-predict's contract and mcv-run --trace-routing: traces recorded by
# mcv-run train a predictor, eval prints recall@k per layer and lookahead
# beside the router baseline (and the mean), JSON output parses, training
# is deterministic for a seed and thread count independent; bad input (a
# trace from another model, a predictor for another model, a truncated
# file, a trace without hidden states) is a one-line error, exit 1; bad
# usage exits 2.  A predictor with routing context (the default) is a
# version-2 file; mcv-run --predictor with it gives the resident run's
# tokens and leaves a routing trace recorded alongside unchanged.  Models
# are tiny random-weight files from mcv-genmodel.

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	local b=${B:-build} bin=${BIN:-bin}
	case $b in /*) ;; *) b=$PWD/$b ;; esac
	case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
	export PRED="$bin/mcv-predict" RUN="$bin/mcv-run" GEN="$b/mcv-genmodel" GENTRACE="$b/mcv-gentrace"
	export D="$BATS_FILE_TMPDIR"
	export M="$D/moe.gguf" O="$D/other.gguf"
	if [ -x "$GEN" ]; then
		"$GEN" -q --arch qwen35moe --shape tiny "$M" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35moe --shape tiny --experts 16 "$O" >/dev/null 2>&1 || true
	fi
	if [ -x "$RUN" ] && [ -s "$M" ]; then
		"$RUN" -m "$M" --tokens 1,2,3,4,5,6,7,8,9,10 -n 12 --temp 1 -s 1 -t 1 \
			--trace-routing "$D/a.trace" >/dev/null 2>&1 || true
		"$RUN" -m "$M" --tokens 11,12,13,14,15,16 -n 12 --temp 1 -s 2 -t 1 \
			--trace-routing "$D/b.trace" >/dev/null 2>&1 || true
	fi
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$PRED" ] || skip "no $PRED (build first)"
	[ -s "$M" ] || skip "no tiny model ($GEN missing or failed)"
	T=$BATS_TEST_TMPDIR
}

load expect
EXPECT_TOOL=mcv-predict

@test "mcv-run --trace-routing records every evaluated token" {
	[ -s "$D/a.trace" ] || { echo "no trace written"; return 1; }
	# evaluated rows: the prompt plus every generated token but the last
	run "$RUN" -m "$M" --tokens 1,2,3,4,5,6,7,8,9,10 -n 12 --temp 1 -s 1 -t 1 --json \
		--trace-routing "$T/c.trace"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	want=$(printf '%s\n' "$output" | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
print(len(j["prompt_tokens"]) + len(j["tokens"]) - (1 if j["stop"] in ("length", "context") else 0))')
	"$PRED" train -q --epochs 0 "$T/c.trace" -o "$T/p.gguf"
	run "$PRED" eval --json "$T/p.gguf" "$T/c.trace"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	got=$(printf '%s\n' "$output" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
	[ "$got" = "$want" ] || { echo "trace has $got tokens, expected $want"; return 1; }
}

@test "train then eval: a row per layer and lookahead, beside the router, and the means" {
	run "$PRED" train -m "$M" --epochs 3 --lookahead 2 --rank 8 -t 2 "$D/a.trace" -o "$T/p.gguf"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	echo "$output" | grep -q '^mcv-predict: layer 0 +1: held-out recall@2 '
	run "$PRED" eval -m "$M" "$T/p.gguf" "$D/b.trace"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	# tiny: 4 layers, lookahead 2 -> (0,1) (0,2) (1,1) (1,2) (2,1)
	[ "$(echo "$output" | grep -cE '^[0-9]+	[12]	[01]\.[0-9]{4}	[01]\.[0-9]{4}$')" -eq 5 ] || { echo "$output"; return 1; }
	echo "$output" | grep -qE '^mean	1	[01]\.[0-9]{4}	[01]\.[0-9]{4}$'
	echo "$output" | grep -qE '^mean	2	'
	echo "$output" | grep -qE '^mean	all	'
	# without the model: no baseline column
	run "$PRED" eval "$T/p.gguf" "$D/b.trace"
	[ "$status" -eq 0 ] && echo "$output" | grep -qE '^0	1	[01]\.[0-9]{4}	-$'
}

@test "eval --json parses and agrees with the table" {
	"$PRED" train -q -m "$M" --epochs 2 "$D/a.trace" -o "$T/p.gguf"
	run "$PRED" eval -m "$M" --json "$T/p.gguf" "$D/a.trace" "$D/b.trace"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	printf '%s\n' "$output" | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["kind"] == "trained" and j["lookahead"] == 2 and j["k"] == 2, j
assert len(j["rows"]) == 5, j["rows"]
for r in j["rows"]:
    assert 0 <= r["trained"] <= 1 and 0 <= r["router"] <= 1, r
m1 = [r["trained"] for r in j["rows"] if r["lookahead"] == 1]
assert abs(j["mean"][0]["trained"] - sum(m1) / len(m1)) < 1e-5, j["mean"]
'
}

@test "training is deterministic for a seed and does not depend on the thread count" {
	"$PRED" train -q -m "$M" --epochs 3 -s 7 -t 1 "$D/a.trace" "$D/b.trace" -o "$T/p1.gguf"
	"$PRED" train -q -m "$M" --epochs 3 -s 7 -t 1 --hidden 8 "$D/a.trace" "$D/b.trace" -o "$T/h1.gguf"
	"$PRED" train -q -m "$M" --epochs 3 -s 7 -t 2 --hidden 8 "$D/a.trace" "$D/b.trace" -o "$T/h2.gguf"
	cmp "$T/h1.gguf" "$T/h2.gguf"
	run "$PRED" eval --json "$T/h1.gguf" "$D/b.trace"
	[ "$status" -eq 0 ] && [[ "$output" == *\"hidden\":8,* ]]
	"$PRED" train -q -m "$M" --epochs 3 -s 7 -t 2 "$D/a.trace" "$D/b.trace" -o "$T/p2.gguf"
	cmp "$T/p1.gguf" "$T/p2.gguf"
}

@test "routing context: the default, version 2; --context none stays version 1" {
	"$PRED" train -q -m "$M" --epochs 2 --rank 4 --hidden 4 "$D/a.trace" -o "$T/c.gguf"
	"$PRED" train -q -m "$M" --epochs 2 --rank 4 --hidden 4 --context none "$D/a.trace" -o "$T/n.gguf"
	for f in c n; do
		run "$PRED" eval -m "$M" --json "$T/$f.gguf" "$D/b.trace"
		[ "$status" -eq 0 ] || { echo "$output"; return 1; }
		printf '%s\n' "$output" >"$T/$f.json"
	done
	/usr/bin/python3 - "$T" <<'PY'
import json, sys
sys.path.insert(0, "scripts/ref")
import gguf
t = sys.argv[1]
for f, ctx, ver in (("c", "routing", 2), ("n", "none", 1)):
    j = json.load(open(f"{t}/{f}.json"))
    assert j["context"] == ctx, j
    g = gguf.read(f"{t}/{f}.gguf", load=False)
    assert g.kv["mcv.predictor.version"] == ver, (f, g.kv["mcv.predictor.version"])
    assert ("mcv.predictor.context" in g.kv) == (ctx == "routing"), g.kv
    names = set(g.shapes)
    assert ("pred.0.1.cout" in names) == (ctx == "routing"), sorted(names)[:12]
PY
}

@test "mcv-run --predictor with context: the resident run's tokens; a routing trace beside it is unchanged" {
	[ -x "$RUN" ] || skip "no mcv-run"
	"$PRED" train -q -m "$M" --epochs 2 --rank 4 --hidden 4 "$D/a.trace" "$D/b.trace" -o "$T/c.gguf"
	min=$("$RUN" -m "$M" --tokens 1 -n 1 --ctx 64 --mem 1K 2>&1 >/dev/null | sed -n 's/.*below the minimum \([0-9]*\) .*/\1/p')
	[ -n "$min" ] || { echo "no minimum budget"; return 1; }
	want=$("$RUN" -m "$M" --tokens 3,14,15,92,65,35 -n 8 --temp 0 --ctx 64 --json -t 1 \
		--trace-routing "$T/r.trace" | sed 's/.*"tokens":\[\([0-9,]*\)\].*/\1/')
	[ -n "$want" ]
	for th in 1 2; do
		got=$("$RUN" -m "$M" --tokens 3,14,15,92,65,35 -n 8 --temp 0 --ctx 64 --json -t $th \
			--mem "$min" --lookahead 2 --predictor "$T/c.gguf" --trace-routing "$T/p$th.trace" |
			sed 's/.*"tokens":\[\([0-9,]*\)\].*/\1/')
		[ "$got" = "$want" ] || { echo "threads $th: $got, resident $want"; return 1; }
		cmp "$T/r.trace" "$T/p$th.trace"
	done
	run "$RUN" -m "$M" --tokens 3,14,15,92,65,35 -n 8 --temp 0 --ctx 64 --mem "$min" --stats \
		--predictor "$T/c.gguf"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	echo "$output" | grep -q "predictor $T/c.gguf"
	echo "$output" | grep -q '^mcv-run: les: prediction 1 layer ahead: recall [0-9.]*%'
}

@test "a trace from another model is refused" {
	[ -s "$O" ] && [ -x "$GENTRACE" ] || skip "no second model"
	"$GENTRACE" --tokens 20 "$O" "$T/o.trace"
	expect 1 "$PRED" train -m "$M" "$T/o.trace" -o "$T/p.gguf"
	grep -q 'another model' "$T/err"
	[ ! -e "$T/p.gguf" ]
	# mixed traces without -m
	expect 1 "$PRED" train "$D/a.trace" "$T/o.trace" -o "$T/p.gguf"
	grep -q 'another model' "$T/err"
	"$PRED" train -q "$D/a.trace" -o "$T/p.gguf"
	expect 1 "$PRED" eval "$T/p.gguf" "$T/o.trace"
	grep -q 'another model' "$T/err"
}

@test "a predictor for another model, a truncated predictor, a trace without hidden states" {
	"$PRED" train -q --epochs 1 "$D/a.trace" -o "$T/p.gguf"
	[ -s "$O" ] && { expect 1 "$PRED" eval -m "$O" "$T/p.gguf" "$D/b.trace"; grep -q 'another model' "$T/err"; }
	size=$(stat -c %s "$T/p.gguf")
	head -c $((size - 64)) "$T/p.gguf" >"$T/trunc.gguf"
	expect 1 "$PRED" eval "$T/trunc.gguf" "$D/b.trace"
	head -c 100 "$T/p.gguf" >"$T/trunc2.gguf"
	expect 1 "$PRED" eval -m "$M" "$T/trunc2.gguf" "$D/b.trace"
	expect 1 "$PRED" eval "$M" "$D/b.trace"
	grep -q 'not an expert predictor' "$T/err"
	[ -x "$GENTRACE" ] || skip "no mcv-gentrace"
	"$GENTRACE" --tokens 10 --hidden none "$M" "$T/nh.trace"
	expect 1 "$PRED" train "$T/nh.trace" -o "$T/q.gguf"
	grep -q 'no hidden states' "$T/err"
	head -c 300 "$D/a.trace" >"$T/tt.trace"
	expect 1 "$PRED" train "$T/tt.trace" -o "$T/q.gguf"
}

@test "usage errors exit 2" {
	expect 2 "$PRED"
	expect 2 "$PRED" frobnicate
	expect 2 "$PRED" train "$D/a.trace"
	expect 2 "$PRED" eval "$D/a.trace"
	expect 2 "$PRED" train --rank 0 "$D/a.trace" -o "$T/p.gguf"
	expect 2 "$PRED" train --lookahead 9 "$D/a.trace" -o "$T/p.gguf"
	expect 2 "$PRED" train --context maybe "$D/a.trace" -o "$T/p.gguf"
	run "$PRED" --help
	[ "$status" -eq 0 ] && [[ "$output" == usage:* ]]
}

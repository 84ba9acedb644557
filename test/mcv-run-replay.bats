#!/usr/bin/env bats
# mcv-run --replay: the routing of a trace recorded on a small model drives
# a larger one.  The experts the larger model ran (its --trace) must be the
# recorded ones mapped as mcv-run(1) documents (expert e -> e*R + r, layer
# L -> L mod n_layer of the trace); the recorded run's own --trace is the
# reference.  A trace the model cannot take and an unreadable one are exit 1.
# Models are random ones from mcv-genmodel.

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	B=${B:-build}
	BIN=${BIN:-bin}
	export RUN="$BIN/mcv-run" GEN="$B/mcv-genmodel" GT="$B/mcv-gentrace"
	local d=$BATS_FILE_TMPDIR
	export A="$d/a.gguf" F="$d/full.gguf" TA="$d/a.trace.gguf" JA="$d/a.jsonl" TF="$d/full.trace.gguf"
	export OMP_NUM_THREADS=1
	[ -x "$GEN" ] && [ -x "$RUN" ] || return 0
	# the "trained" model: 4 layers of 8 experts; the full one: 6 layers of 32
	"$GEN" -q --shape tiny --layers 4 --experts 8 --experts-used 4 --seed 2 --type q4_k "$A" >/dev/null 2>&1 || true
	"$GEN" -q --shape tiny --layers 6 --experts 32 --experts-used 4 --seed 3 --type q4_k "$F" >/dev/null 2>&1 || true
	# one prompt token, then decode steps: every --trace event is one token
	[ -s "$A" ] && "$RUN" -m "$A" --tokens 5 -n 7 --temp 0 --ctx 64 --mem 64M --lookahead 0 \
		--trace "$JA" --trace-routing "$TA" >/dev/null 2>&1 || true
	[ -s "$F" ] && [ -x "$GT" ] && "$GT" --tokens 3 "$F" "$TF" >/dev/null 2>&1 || true
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$RUN" ] || skip "no $RUN (build first)"
	[ -s "$A" ] && [ -s "$F" ] || skip "no models ($GEN missing or failed)"
	[ -s "$TA" ] && [ -s "$JA" ] || skip "recording the trace failed"
	T=$BATS_TEST_TMPDIR
}

# compare two --trace files: every (pos, layer) of $2 against $1's record of
# layer mod $3, ids divided by $4; prints the number of records checked
same_routing() {
	/usr/bin/python3 - "$@" <<'PY'
import json, sys
ref, got, nl, R = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(p):
    out = {}
    for line in open(p):
        ev = json.loads(line)
        if "layer" in ev:
            assert ev["n_tokens"] == 1, ev
            out[(ev["pos"], ev["layer"])] = ev["chosen"]
    return out
a, b = load(ref), load(got)
n = 0
for (pos, l), ids in sorted(b.items()):
    want = sorted(a[(pos, l % nl)])
    have = sorted(i // R for i in ids)
    if have != want or len(set(ids)) != len(ids):
        sys.exit("pos %d layer %d: ran %s, trace says %s (R=%d)" % (pos, l, ids, want, R))
    n += 1
print(n)
PY
}

@test "replay on the recording model runs exactly the recorded experts" {
	run "$RUN" -m "$A" --replay "$TA" --mem 64M --trace "$T/r.jsonl"
	[ "$status" -eq 0 ]
	run same_routing "$JA" "$T/r.jsonl" 4 1
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" -eq $((7 * 4)) ]
}

@test "replay at 6 layers x 32 experts: the mapped trace ids, the --stats block" {
	run "$RUN" -m "$F" --replay "$TA" --mem 64M --trace "$T/r.jsonl" --stats
	[ "$status" -eq 0 ]
	[[ "$output" == *"decode 6 tokens"*"stop replay"* ]]
	[[ "$output" == *"predictor none, lookahead"* ]]
	[[ "$output" == *"les: hit rate "* ]]
	run same_routing "$JA" "$T/r.jsonl" 4 4
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" -eq $((7 * 6)) ]
	# the mapping is fixed: a second run routes identically
	"$RUN" -m "$F" --replay "$TA" --mem 64M --trace "$T/r2.jsonl"
	cmp <(grep -o '"layer".*"resident"' "$T/r.jsonl") <(grep -o '"layer".*"resident"' "$T/r2.jsonl")
}

@test "replay with the recording model predicts the mapped experts" {
	run "$RUN" -m "$F" --replay "$TA" --replay-model "$A" --mem 64M --lookahead 1 \
		--trace "$T/r.jsonl" --stats
	[ "$status" -eq 0 ]
	[[ "$output" == *"predictor router, lookahead 1"* ]]
	# the router of the next layer on the recorded hidden state is far better
	# than chance (4 of 32)
	rec=$(sed -n 's/.*prediction 1 layer ahead: recall \([0-9]*\)\..*/\1/p' <<<"$output")
	[ -n "$rec" ] && [ "$rec" -ge 30 ]
	grep -q '"prefetched":\[[0-9]' "$T/r.jsonl"
	run same_routing "$JA" "$T/r.jsonl" 4 4
	[ "$status" -eq 0 ]
}

@test "a trace the model cannot take or cannot read: exit 1, one line" {
	[ -s "$TF" ] || skip "no $GT"
	run "$RUN" -m "$A" --replay "$TF"
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ "${lines[0]}" == "mcv-run: "*"32 experts"*"8"* ]]
	run "$RUN" -m "$F" --replay "$BATS_TEST_TMPDIR/none.gguf"
	[ "$status" -eq 1 ]
	[[ "${lines[0]}" == "mcv-run: "* ]]
	run "$RUN" -m "$F" --replay "$A"
	[ "$status" -eq 1 ]
	[[ "${lines[0]}" == *"not a routing trace"* ]]
	# --replay-model must be the model the trace was recorded on
	run "$RUN" -m "$F" --replay "$TA" --replay-model "$F"
	[ "$status" -eq 1 ]
	[[ "${lines[0]}" == *"another model"* ]]
}

@test "--replay usage errors (exit 2)" {
	run "$RUN" -m "$F" --replay "$TA" -p hello
	[ "$status" -eq 2 ]
	run "$RUN" -m "$F" --replay-model "$A"
	[ "$status" -eq 2 ]
	run "$RUN" -m "$F" --replay "$TA" --mem 64M --predictor "$A"
	[ "$status" -eq 2 ]
}

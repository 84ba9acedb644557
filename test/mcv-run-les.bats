#!/usr/bin/env bats
# mcv-run --mem and the LES options: the generated tokens under a memory
# budget equal the fully resident run's (plain and packed file, several
# budgets, lookaheads, policies, thread counts); --stats and --trace report
# what happened; a budget below the minimum is exit 1 naming the minimum;
# bad option values are exit 2.  The bit-identical logits are checked by
# test/unit/test_les.c; models here are random ones from mcv-genmodel.

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	B=${B:-build}
	BIN=${BIN:-bin}
	export RUN="$BIN/mcv-run" GEN="$B/mcv-genmodel" PACK="$BIN/mcv-pack"
	export M="$BATS_FILE_TMPDIR/moe.gguf" P="$BATS_FILE_TMPDIR/moe-packed.gguf"
	export OMP_NUM_THREADS=1
	if [ -x "$GEN" ]; then
		"$GEN" -q --shape tiny --experts 32 --experts-used 4 --type q4_k "$M" >/dev/null 2>&1 || true
		[ -x "$PACK" ] && [ -s "$M" ] && "$PACK" -q "$M" "$P" >/dev/null 2>&1 || true
	fi
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$RUN" ] || skip "no $RUN (build first)"
	[ -s "$M" ] || skip "no model ($GEN missing or failed)"
	T=$BATS_TEST_TMPDIR
}

# the generated token ids of a greedy run
toks() {
	"$RUN" --tokens 3,14,15,92,65,35 -n 8 --temp 0 --ctx 64 --json "$@" |
		sed 's/.*"tokens":\[\([0-9,]*\)\].*/\1/'
}

# the minimum budget of a file, from the error of a budget that is too small
minimum() {
	"$RUN" -m "$1" --tokens 1 -n 1 --ctx 64 --mem 1K 2>&1 >/dev/null |
		sed -n 's/.*below the minimum \([0-9]*\) .*/\1/p'
}

@test "a budget too small: exit 1, the minimum in one line" {
	run "$RUN" -m "$M" --tokens 1,2 -n 1 --ctx 64 --mem 1M
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ "${lines[0]}" == "mcv-run: "*"below the minimum "[0-9]*"non-expert weights"* ]]
	min=$(minimum "$M")
	[ -n "$min" ]
	run "$RUN" -m "$M" --tokens 1,2 -n 1 --ctx 64 --mem $((min - 1))
	[ "$status" -eq 1 ]
	run "$RUN" -m "$M" --tokens 1,2 -n 1 --ctx 64 --mem "$min"
	[ "$status" -eq 0 ]
}

@test "bad --mem and LES option values are usage errors (exit 2)" {
	for v in "" 0 3X -1G 1.5G G 99999999999999999999G; do
		run "$RUN" -m "$M" --tokens 1 -n 1 --mem "$v"
		[ "$status" -eq 2 ] || { echo "--mem '$v' gave $status"; return 1; }
		[[ "${lines[0]}" == "mcv-run: "* ]]
	done
	run "$RUN" -m "$M" --tokens 1 -n 1 --mem 1G --cache-policy fifo
	[ "$status" -eq 2 ]
	run "$RUN" -m "$M" --tokens 1 -n 1 --mem 1G --lookahead -1
	[ "$status" -eq 2 ]
	run "$RUN" -m "$M" --tokens 1 -n 1 --mem 1G --lookahead 99
	[ "$status" -eq 2 ]
	run "$RUN" -m "$M" --tokens 1 -n 1 --lookahead 2
	[ "$status" -eq 2 ]
	[[ "${lines[0]}" == *"--mem"* ]]
	for v in -0.1 1.5 x ""; do
		run "$RUN" -m "$M" --tokens 1 -n 1 --mem 1G --prefetch-min "$v"
		[ "$status" -eq 2 ] || { echo "--prefetch-min '$v' gave $status"; return 1; }
		[ "${#lines[@]}" -eq 1 ] && [[ "${lines[0]}" == "mcv-run: "*"--prefetch-min"* ]]
	done
	for v in 0 17 x; do
		run "$RUN" -m "$M" --tokens 1 -n 1 --mem 1G --io-threads "$v"
		[ "$status" -eq 2 ] || { echo "--io-threads '$v' gave $status"; return 1; }
		[ "${#lines[@]}" -eq 1 ] && [[ "${lines[0]}" == "mcv-run: "*"--io-threads"* ]]
	done
	for v in direct AIO ""; do
		run "$RUN" -m "$M" --tokens 1 -n 1 --mem 1G --io "$v"
		[ "$status" -eq 2 ] || { echo "--io '$v' gave $status"; return 1; }
		[ "${#lines[@]}" -eq 1 ] && [[ "${lines[0]}" == "mcv-run: "*"--io"* ]]
	done
	for o in "--prefetch-min 0.5" "--io threads" "--io-threads 8"; do
		run "$RUN" -m "$M" --tokens 1 -n 1 $o
		[ "$status" -eq 2 ] && [[ "${lines[0]}" == *"--mem"* ]] || { echo "$o without --mem: $status"; return 1; }
	done
}

@test "the read engines, reads in flight and prefetch confidence give the resident run's tokens" {
	[ -s "$P" ] || skip "no packed model ($PACK missing or failed)"
	ref=$(toks -m "$M")
	[ -n "$ref" ]
	min=$(minimum "$M")
	slot=$("$RUN" -m "$M" --tokens 1 -n 1 --ctx 64 --mem 1G --stats 2>&1 >/dev/null |
		sed -n 's/.*slots of \([0-9.]*\) MiB.*/\1/p')
	mem=$(awk -v m="$min" -v s="$slot" 'BEGIN { printf "%d", m + 20 * s * 1048576 }')
	for f in "$M" "$P"; do
		for io in aio threads buffered; do
			for opt in "--io-threads 1" "--io-threads 16 --prefetch-min 0.3" "--lookahead 2 --prefetch-min 1"; do
				got=$(toks -m "$f" --mem "$mem" --io $io $opt -t 2)
				[ "$got" = "$ref" ] || { echo "$f --io $io $opt: $got != $ref"; return 1; }
			done
		done
	done
	# the engine is what --stats says it is
	"$RUN" -m "$M" --tokens 3,14 -n 2 --ctx 64 --mem "$mem" --io threads --io-threads 3 --stats 2>"$T/e" >/dev/null
	grep -q 'O_DIRECT reads, 3 I/O threads\|buffered reads, 3 I/O threads' "$T/e"
	"$RUN" -m "$M" --tokens 3,14 -n 2 --ctx 64 --mem "$mem" --io buffered --stats 2>"$T/e" >/dev/null
	grep -q 'buffered reads, 2 I/O threads' "$T/e"
	# a higher minimum confidence reads fewer guesses and says how many it passed over
	pf() {
		"$RUN" -m "$M" --tokens 3,14,15,92 -n 12 --temp 0 --ctx 64 --mem "$mem" --lookahead 2 --stats "$@" 2>"$T/e" >/dev/null
		sed -n 's/.*prefetch reads \([0-9]*\),.*/\1/p' "$T/e"
	}
	all=$(pf --prefetch-min 0)
	few=$(pf --prefetch-min 0.9)
	grep -q 'below the minimum confidence [1-9]' "$T/e"
	echo "prefetch reads: $all at 0, $few at 0.9"
	[ "$all" -gt 0 ] && [ "$few" -lt "$all" ]
}

@test "same tokens as the resident run at every budget, lookahead, policy, thread count; plain and packed" {
	[ -s "$P" ] || skip "no packed model ($PACK missing or failed)"
	ref=$(toks -m "$M")
	[ -n "$ref" ]
	[ "$(toks -m "$P")" = "$ref" ]
	min=$(minimum "$M")
	slot=$("$RUN" -m "$M" --tokens 1 -n 1 --ctx 64 --mem 1G --stats 2>&1 >/dev/null |
		sed -n 's/.*slots of \([0-9.]*\) MiB.*/\1/p')
	[ -n "$slot" ]
	n=0
	# 128 experts: about 10%, 30% and 70% of them on top of the minimum (4 slots)
	for extra in 9 34 86; do
		mem=$(awk -v m="$min" -v s="$slot" -v x="$extra" 'BEGIN { printf "%d", m + x * s * 1048576 }')
		for f in "$M" "$P"; do
			for la in 0 1 2; do
				for t in 1 2; do
					pol=lfru; [ $(((la + t) % 2)) = 0 ] && pol=lru
					got=$(toks -m "$f" --mem "$mem" --lookahead $la --cache-policy $pol -t $t)
					[ "$got" = "$ref" ] || { echo "$f --mem $mem --lookahead $la -t $t $pol: $got != $ref"; return 1; }
					n=$((n + 1))
				done
			done
		done
	done
	[ $n -eq 36 ]
}

@test "a budget run waits passively in OpenMP unless the environment says otherwise" {
	# spinning workers hold the core the expert readers need (README, LES)
	run env -u OMP_WAIT_POLICY "$RUN" -m "$M" --tokens 1,2 -n 1 --ctx 64 --mem 1G -v
	[ "$status" -eq 0 ]
	[[ "$output" == *"OpenMP wait policy: passive"* ]]
	run env OMP_WAIT_POLICY=active "$RUN" -m "$M" --tokens 1,2 -n 1 --ctx 64 --mem 1G -v
	[ "$status" -eq 0 ]
	[[ "$output" == *"OpenMP wait policy: active"* ]]
	# and the same tokens as the resident run
	[ "$(toks -m "$M" --mem 1G)" = "$(toks -m "$M")" ]
	run env -u OMP_WAIT_POLICY "$RUN" -m "$M" --tokens 1,2 -n 1 --ctx 64 -v
	[[ "$output" != *"wait policy"* ]]
}

@test "--stats prints the budget split, hit rate, recall and bytes per token" {
	run "$RUN" -m "$M" --tokens 3,14,15 -n 4 --temp 0 --ctx 64 --mem 1G --stats --lookahead 2
	[ "$status" -eq 0 ]
	echo "$output" | grep -q '^mcv-run: les: budget 1024.0 MiB = non-expert weights'
	echo "$output" | grep -Eq '^mcv-run: les: .*reads, [0-9]+ (I/O threads|in flight \(kernel AIO\)), non-expert weights .*; policy lfru; predictor router, lookahead 2'
	echo "$output" | grep -q '^mcv-run: les: prefetch guesses dropped before their read [0-9]*, below the minimum confidence [0-9]*, kept out by likelier residents [0-9]*$'
	echo "$output" | grep -q '^mcv-run: les: hit rate [0-9.]*%'
	echo "$output" | grep -q '^mcv-run: les: prediction 1 layer ahead: recall [0-9.]*%, precision'
	echo "$output" | grep -q '^mcv-run: les: prediction 2 layers ahead: recall'
	echo "$output" | grep -q '^mcv-run: les: decode: [0-9.]* MiB read per token, stall [0-9.]* ms per token'
	echo "$output" | grep -q 'mcv-run: stats: .*peak RSS'
}

@test "--json carries the LES counters in stats.les (budget runs only)" {
	run "$RUN" -m "$M" --tokens 3,14,15 -n 4 --temp 0 --ctx 64 --mem 1G --lookahead 2 --io threads --json
	[ "$status" -eq 0 ]
	echo "$output" | /usr/bin/python3 -c '
import json, sys
l = json.loads(sys.stdin.read())["stats"]["les"]
assert l["budget"] == 1 << 30 and l["lookahead"] == 2 and l["predictor"] == "router", l
assert l["io"] in ("threads", "buffered") and len(l["recall"]) == 2, l
assert 0 <= l["hit_rate"] <= 1 and l["reads"] >= l["misses"] > 0, l
'
	run "$RUN" -m "$M" --tokens 3,14,15 -n 2 --temp 0 --ctx 64 --json
	[ "$status" -eq 0 ]
	echo "$output" | /usr/bin/python3 -c 'import json, sys; assert "les" not in json.loads(sys.stdin.read())["stats"]'
}

@test "--trace writes a header and one JSON line per token and layer" {
	run "$RUN" -m "$M" --tokens 3,14,15 -n 4 --temp 0 --ctx 64 --mem 1G --trace "$T/tr.jsonl"
	[ "$status" -eq 0 ]
	/usr/bin/python3 - "$T/tr.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
h = lines[0]
assert h["type"] == "mcv.les.trace", h
for k in ("model", "budget", "predictor", "memory_pressure", "lookahead", "file_type", "expert_type"):
    assert k in h, k
assert h["budget"] == 1 << 30 and h["predictor"] == "router" and h["expert_type"] == "q4_K", h
ev = lines[1:]
assert len(ev) == 4 * 4, len(ev)  # prefill + 3 decode steps, 4 layers
for e in ev:
    s = set(e["resident"]) | set(e["prefetched"]) | set(e["missed"])
    assert s == set(e["chosen"]), e
    assert e["stall_us"] >= 0
    assert len(e["chosen"]) == 4 or e["n_tokens"] > 1, e
assert [e["layer"] for e in ev[:4]] == [0, 1, 2, 3]
EOF
}

@test "les-optimum.py: the eviction optimum never reads more than LRU or the run" {
	mn=$(minimum "$M")
	# ~28 slots of 128 experts: room for the policies to differ
	run "$RUN" -m "$M" --tokens 3,14,15 -n 24 --temp 1 -s 3 --ctx 64 --mem $((mn + 3000000)) --lookahead 0 \
		--trace "$T/tr.jsonl"
	[ "$status" -eq 0 ]
	run /usr/bin/python3 scripts/bench/les-optimum.py "$T/tr.jsonl"
	[ "$status" -eq 0 ]
	line=$(printf '%s\n' "$output" | grep '^reads/token')
	set -- $(printf '%s\n' "$line" | sed 's/[^0-9. ]//g')
	# run, lru, optimum; the run here is on demand: every read is a miss
	awk -v r="$1" -v l="$2" -v o="$3" 'BEGIN { exit !(o > 0 && o < l && o < r) }'
	run /usr/bin/python3 scripts/bench/les-optimum.py "$M"
	[ "$status" -ne 0 ]
	[[ "$output" == les-optimum:* ]]
}

@test "a predictor file that does not exist is a one-line error" {
	run "$RUN" -m "$M" --tokens 1 -n 1 --ctx 64 --mem 1G --predictor "$T/none.gguf"
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ "${lines[0]}" == "mcv-run: "* ]]
}

@test "a truncated packed file is a clear error with --mem" {
	[ -s "$P" ] || skip "no packed model"
	head -c $(($(stat -c %s "$P") - 6000)) "$P" >"$T/trunc.gguf"
	run "$RUN" -m "$T/trunc.gguf" --tokens 1 -n 1 --ctx 64 --mem 1G
	[ "$status" -eq 1 ]
	[[ "${lines[0]}" == "mcv-run: "*"trunc.gguf"* ]]
}

# The shipped proving model (real routing) with an image in the prompt:
# the same text at budgets holding about 50% and 15% of its experts,
# lookahead 1 and 2, 1 and 2 threads, on the plain and the packed file.
# The budget for a share f is the minimum (which holds k experts) plus
# (f * all - k) slots; --stats reports the share really obtained.
@test "proving model with an image: the same output at 50% and 15% budgets" {
	PM=examples/models/proving-text.gguf MP=examples/models/proving-mmproj.gguf
	[ -f "$PM" ] && [ -f "$MP" ] || skip "no shipped proving model"
	img=examples/images/receipt-1.png
	run_pm() {
		"$RUN" -m "$1" --mmproj "$MP" -i "$img" -p "Read the receipt." -n 24 --temp 0 --ctx 512 \
			--json "${@:2}"
	}
	"$PACK" -q "$PM" "$T/pm-packed.gguf"
	ref=$(run_pm "$PM" | sed 's/"ms":[0-9]*//')
	[ -n "$ref" ]
	for file in "$PM" "$T/pm-packed.gguf"; do
		min=$("$RUN" -m "$file" -p hi -n 1 --ctx 512 --mem 1K 2>&1 >/dev/null |
			sed -n 's/.*below the minimum \([0-9]*\) .*/\1/p')
		[ -n "$min" ]
		# a slot's size (plain and packed files differ: 4 KiB read windows) from
		# what --stats says 8 MiB over the minimum buys
		"$RUN" -m "$file" -p hi -n 1 --ctx 512 --mem $((min + 8388608)) --stats 2>"$T/err" >/dev/null
		slot=$(sed -n 's/.*expert cache \([0-9.]*\) (\([0-9]*\) slots.*/\1 \2/p' "$T/err" |
			awk '{ printf "%d", $1 * 1048576 / $2 }')
		[ -n "$slot" ] && [ "$slot" -gt 0 ]
		for f in 50 15; do
			mem=$((min + (512 * f / 100 - 8) * slot))
			for la in 1 2; do
				for th in 1 2; do
					out=$(run_pm "$file" --mem "$mem" --lookahead $la -t $th --stats 2>"$T/err" |
						sed 's/"ms":[0-9]*//')
					share=$(sed -n 's/.*slots of [0-9.]* MiB, \([0-9.]*\)% of 512 experts.*/\1/p' "$T/err")
					echo "$f% $(basename "$file") la $la t $th: the cache holds $share% of the experts"
					[ -n "$share" ]
					awk -v s="$share" -v f="$f" 'BEGIN { exit !(s > f - 5 && s < f + 5) }'
					[ "$out" = "$(echo "$ref" | sed "s|$PM|$file|")" ]
				done
			done
		done
	done
}

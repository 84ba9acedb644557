#!/usr/bin/env bats
# mcv-pack's contract: packed files are valid GGUFs whose experts are one
# 4 KiB-aligned contiguous extent each and hold the plain file's bytes;
# --order follows a routing trace; bad input is a one-line error, bad usage
# exit 2.  Models are tiny random-weight files from mcv-genmodel, traces are
# synthetic ones from mcv-gentrace (planted co-selection groups).

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	local b=${B:-build} bin=${BIN:-bin}
	case $b in /*) ;; *) b=$PWD/$b ;; esac
	case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
	export PACK="$bin/mcv-pack" GEN="$b/mcv-genmodel" GENTRACE="$b/mcv-gentrace"
	export D="$BATS_FILE_TMPDIR"
	export M="$D/moe.gguf" P="$D/packed.gguf"
	if [ -x "$GEN" ]; then
		"$GEN" -q --arch qwen35moe --shape tiny "$M" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35 --shape tiny "$D/dense.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35moe --shape tiny --experts 16 "$D/other.gguf" >/dev/null 2>&1 || true
	fi
	[ -x "$PACK" ] && [ -s "$M" ] && "$PACK" -q "$M" "$P" >/dev/null 2>&1 || true
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$PACK" ] || skip "no $PACK (build first)"
	[ -s "$M" ] || skip "no tiny model ($GEN missing or failed)"
	T=$BATS_TEST_TMPDIR
}

load expect
EXPECT_TOOL=mcv-pack

@test "packed file: every expert one contiguous extent on a 4 KiB boundary" {
	[ -s "$P" ] || { echo "packing failed"; return 1; }
	run "$PACK" --info "$P"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	echo "$output" | grep -qx 'packed: yes'
	echo "$output" | grep -qx 'alignment: 4096'
	echo "$output" | grep -q '^non_expert: .* one region at '
	echo "$output" | grep -qx 'total: [0-9]* expert bytes, contiguous 32/32, aligned 32/32'
	# every extent offset and read window is a multiple of 4096, and the
	# read window covers the extent
	echo "$output" | awk '/^  expert /{
		n++; split($4, x, "+"); split($6, r, "+");
		if (x[1] % 4096 || r[1] % 4096 || r[2] % 4096 || r[2] < x[2] || $7 != "contiguous" || $8 != "aligned") bad++ }
		END { if (n != 32 || bad) { print n " experts, " bad " bad"; exit 1 } }'
}

@test "plain file: --info reports scattered experts and the same fingerprint" {
	run "$PACK" --info "$M"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	echo "$output" | grep -qx 'packed: no'
	echo "$output" | grep -qx 'total: [0-9]* expert bytes, contiguous 0/32, aligned 0/32'
	a=$(echo "$output" | grep '^fingerprint: ')
	b=$("$PACK" --info "$P" | grep '^fingerprint: ')
	[ -n "$a" ] && [ "$a" = "$b" ]
	# the expert bytes are the same, layer by layer
	diff <(echo "$output" | grep '^layer [0-9]' | cut -d, -f1) <("$PACK" --info "$P" | grep '^layer [0-9]' | cut -d, -f1)
}

@test "--check rereads the output and compares every tensor with the input" {
	run "$PACK" --check "$M" "$T/c.gguf"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	echo "$output" | grep -q 'checked'
	# repacking a packed file gives the same bytes
	"$PACK" -q "$P" "$T/again.gguf"
	cmp "$P" "$T/again.gguf"
}

@test "standard input and output stream the same bytes as files" {
	"$PACK" -q - - <"$M" >"$T/s.gguf"
	cmp "$P" "$T/s.gguf"
	"$PACK" -q - "$T/f.gguf" <"$M"
	cmp "$P" "$T/f.gguf"
}

@test "--order with a synthetic trace changes the order, shortens distances, round-trips" {
	[ -x "$GENTRACE" ] || skip "no $GENTRACE"
	"$GENTRACE" --tokens 400 "$M" "$T/trace.gguf"
	run "$PACK" -v --check --order "$T/trace.gguf" "$M" "$T/o.gguf"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	line=$(echo "$output" | grep -- '--order: 400 tokens; mean distance between co-selected experts')
	[ -n "$line" ] || { echo "$output"; return 1; }
	before=$(echo "$line" | awk '{print $(NF-2)}') after=$(echo "$line" | awk '{print $NF}')
	awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b) }' || { echo "$line"; return 1; }
	[ "$(echo "$output" | grep -c '^mcv-pack: layer [0-9]*: mean distance')" -eq 4 ]
	run "$PACK" --info "$T/o.gguf"
	[ "$status" -eq 0 ]
	echo "$output" | grep -qx 'total: [0-9]* expert bytes, contiguous 32/32, aligned 32/32'
	orders=$(echo "$output" | grep '^layer [0-9]' | sed 's/.*order //')
	[ "$(echo "$orders" | grep -cvx '0 1 2 3 4 5 6 7')" -ge 1 ] || { echo "$orders"; return 1; }
	# each layer's order is a permutation of 0..7
	echo "$orders" | while read -r o; do
		[ "$(echo "$o" | tr ' ' '\n' | sort -n | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 " ]
	done
	# same trace, same order: deterministic output
	"$PACK" -q --order "$T/trace.gguf" "$M" "$T/o2.gguf"
	cmp "$T/o.gguf" "$T/o2.gguf"
}

@test "a trace from another model is refused" {
	[ -x "$GENTRACE" ] || skip "no $GENTRACE"
	[ -s "$D/other.gguf" ] || skip "no 16-expert model"
	"$GENTRACE" --tokens 20 "$D/other.gguf" "$T/other-trace.gguf"
	expect 1 "$PACK" --order "$T/other-trace.gguf" "$M" "$T/x.gguf"
	grep -q 'another model' "$T/err"
	[ ! -e "$T/x.gguf" ]
	# and a model file is not a trace
	expect 1 "$PACK" --order "$M" "$M" "$T/x.gguf"
	grep -q 'not a routing trace' "$T/err"
}

@test "truncated packed file: a clear error, no crash" {
	for n in 100 5000 300000; do
		head -c -"$n" "$P" >"$T/cut.gguf"
		expect 1 "$PACK" --info "$T/cut.gguf"
		expect 1 "$PACK" "$T/cut.gguf" "$T/x.gguf"
		[ ! -e "$T/x.gguf" ]
	done
}

@test "a dense model has no experts to pack" {
	[ -s "$D/dense.gguf" ] || skip "no dense model"
	expect 1 "$PACK" "$D/dense.gguf" "$T/x.gguf"
	grep -q 'no experts to pack' "$T/err"
	[ ! -e "$T/x.gguf" ]
	expect 1 "$PACK" --info "$D/dense.gguf"
}

@test "bad usage exits 2 with one line" {
	expect 2 "$PACK"
	expect 2 "$PACK" "$M"
	expect 2 "$PACK" "$M" "$T/a" "$T/b"
	expect 2 "$PACK" --bogus "$M" "$T/x.gguf"
	expect 2 "$PACK" "$M" "$T/x.gguf" --order
	expect 2 "$PACK" --info
	expect 2 "$PACK" --info "$M" "$T/x.gguf"
	expect 2 "$PACK" --check "$M" -
	[ ! -e "$T/x.gguf" ]
}

@test "missing input or unwritable output: exit 1, one line" {
	expect 1 "$PACK" "$T/nope.gguf" "$T/x.gguf"
	expect 1 "$PACK" "$M" "$T/no/such/dir/x.gguf"
	expect 1 "$PACK" --info "$T/nope.gguf"
}

@test "-h and --version" {
	run "$PACK" -h
	[ "$status" -eq 0 ]
	echo "$output" | grep -q '^usage: mcv-pack'
	run "$PACK" --version
	[ "$status" -eq 0 ]
	echo "$output" | grep -q '^mcv-pack [0-9]'
}

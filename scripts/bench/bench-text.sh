#!/bin/sh
# Text inference speed: mcv-run against llama.cpp (the peer, scripts/peer/run.mjs
# --shim: no weight repacking, persistent thread pool) on the same GGUF file,
# the same prompt token ids, the same thread count, alternating in the same
# run. Prints prefill and decode tokens/s of both and their ratio (mcv / peer,
# > 1: mcv faster), best of R runs each.
#
#   scripts/bench/bench-text.sh                 # small model + full 35B-A3B shape
#   scripts/bench/bench-text.sh --no-full       # small model only (~1-2 min)
#   scripts/bench/bench-text.sh -t 1 -p 64 -n 32 --full-repeat 2
#
# The small model is generated (random weights) on first use; the full-shape
# file must exist (see scripts/bench/README.md, "Test models"). Each file is
# read once (cat > /dev/null) before timing so both sides see resident pages.
set -eu

here=$(cd "$(dirname "$0")/../.." && pwd)
threads=2 prompt=128 ngen=64 repeat=3 frepeat=1 full=1 only_full=0
bindir=${MCV_BIN:-$here/bin}
builddir=${MCV_BUILD:-$here/build}
small=${MCV_BENCH_SMALL:-/root/mcv-models/qwen35moe-small-q4_k.gguf}
fullm=${MCV_BENCH_FULL:-/root/mcv-models/qwen35moe-35b-a3b-q4_k.gguf}

usage() {
	echo "usage: bench-text.sh [-t THREADS] [-p PROMPT_TOKENS] [-n DECODE_TOKENS] [-r REPEAT]" >&2
	echo "       [--full-repeat R] [--no-full | --only-full] [--small FILE] [--full FILE]" >&2
	echo "       env: MCV_BIN (mcv-run's folder), MCV_BUILD (mcv-genmodel's folder)" >&2
	exit 2
}
num() { case $2 in ''|*[!0-9]*) echo "bench-text: $1 needs a number" >&2; exit 2;; esac; }
while [ $# -gt 0 ]; do
	case $1 in
	-t|--threads) num "$1" "${2-}"; threads=$2; shift 2;;
	-p|--prompt) num "$1" "${2-}"; prompt=$2; shift 2;;
	-n) num "$1" "${2-}"; ngen=$2; shift 2;;
	-r|--repeat) num "$1" "${2-}"; repeat=$2; shift 2;;
	--full-repeat) num "$1" "${2-}"; frepeat=$2; shift 2;;
	--no-full) full=0; shift;;
	--only-full) only_full=1; shift;;
	--small) small=${2:?}; shift 2;;
	--full) fullm=${2:?}; shift 2;;
	-h|--help) usage;;
	*) echo "bench-text: unknown option $1" >&2; usage;;
	esac
done
[ "$ngen" -ge 2 ] && [ "$prompt" -ge 1 ] && [ "$repeat" -ge 1 ] || { echo "bench-text: need -n >= 2, -p >= 1, -r >= 1" >&2; exit 2; }

py=/usr/bin/python3
run=$bindir/mcv-run
[ -x "$run" ] || { echo "bench-text: $run missing (make, or set MCV_BIN)" >&2; exit 1; }
[ -x "$py" ] || { echo "bench-text: $py missing" >&2; exit 1; }
[ -d "$here/scripts/peer/node_modules" ] || sh "$here/scripts/setup.sh"

# Prompt: token ids spread over the byte/merge range every generated model has
# (0..282), so the vocabulary size does not matter.
ids=$($py -c "print(','.join(str(1 + i * 7 % 281) for i in range($prompt)))")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# bench NAME FILE REPEAT: best-of-REPEAT for each side, alternating.
bench() {
	name=$1 file=$2 rep=$3
	cat "$file" > /dev/null
	: > "$tmp/mcv" ; : > "$tmp/peer"
	i=0
	while [ "$i" -lt "$rep" ]; do
		"$run" -m "$file" --tokens "$ids" --temp 0 -n "$ngen" -c $((prompt + ngen + 16)) \
			-t "$threads" --json > "$tmp/out" 2> "$tmp/err" || {
			echo "bench-text: mcv-run failed on $file: $(tail -n 1 "$tmp/err")" >&2; return 1; }
		$py -c 'import json,sys; s=json.load(open(sys.argv[1]))["stats"]; print(s["prompt_tps"], s["decode_tps"])' "$tmp/out" >> "$tmp/mcv"
		node "$here/scripts/peer/run.mjs" --model "$file" --tokens "$ids" -n "$ngen" \
			--threads "$threads" --ctx $((prompt + ngen + 16)) --shim > "$tmp/out" 2> "$tmp/err" || {
			echo "bench-text: peer failed on $file: $(tail -n 1 "$tmp/err")" >&2; return 1; }
		$py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(len(d["prompt_tokens"]) / d["prompt_ms"] * 1e3, d["decode_steps"] / d["decode_ms"] * 1e3)' "$tmp/out" >> "$tmp/peer"
		i=$((i + 1))
	done
	$py - "$name" "$tmp/mcv" "$tmp/peer" <<'EOF' >> "$tmp/table"
import sys
name, fm, fp = sys.argv[1:]
m = [tuple(map(float, l.split())) for l in open(fm)]
p = [tuple(map(float, l.split())) for l in open(fp)]
pm, pp = max(x[0] for x in m), max(x[0] for x in p)
dm, dp = max(x[1] for x in m), max(x[1] for x in p)
print(f"| {name} | {pm:.1f} | {pp:.1f} | {pm / pp:.2f}x | {dm:.2f} | {dp:.2f} | {dm / dp:.2f}x |")
EOF
	tail -n 1 "$tmp/table" >&2
}

echo "threads $threads, prompt $prompt tokens, decode $ngen tokens; best of $repeat (small), $frepeat (full); load $(cut -d' ' -f1-3 /proc/loadavg)" > "$tmp/head"
cat "$tmp/head" >&2
{
	echo "| model | prefill mcv tok/s | prefill llama.cpp | ratio | decode mcv tok/s | decode llama.cpp | ratio |"
	echo "|---|---|---|---|---|---|---|"
} > "$tmp/table"

if [ "$only_full" = 0 ]; then
	if [ ! -f "$small" ]; then
		gen=$builddir/mcv-genmodel
		[ -x "$gen" ] || { echo "bench-text: $gen missing (make, or set MCV_BUILD)" >&2; exit 1; }
		mkdir -p "$(dirname "$small")"
		"$gen" --shape small --expert-type q4_k "$small" >&2
	fi
	bench "small, Q8_0 + Q4_K experts ($(basename "$small"))" "$small" "$repeat"
fi
if [ "$full" = 1 ]; then
	if [ -f "$fullm" ]; then
		bench "35B-A3B, Q8_0 + Q4_K experts ($(basename "$fullm"))" "$fullm" "$frepeat"
	else
		echo "bench-text: $fullm missing, full shape skipped" >&2
	fi
fi
cat "$tmp/head" "$tmp/table"

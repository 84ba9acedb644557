#!/bin/sh
# Replay at full size (mcv-run --replay, mcv-run(1)): the routing of the
# trained proving model, recorded as a trace, drives the real expert cache
# and reads of the 35B-A3B-shape file (random weights, ~20 GB) inside a
# memory cgroup (v1) of 3 GiB, page cache dropped before every run:
#   - replay, no prediction (lookahead 0): on-demand reads only
#   - replay, the proving model's router baseline, lookahead 1
#   - replay, a predictor trained (mcv-predict train) on other traces
# and prints hit rate, MiB read per decode token, tokens/s, the physical
# bound (best bandwidth of expert-sized direct reads / MiB read per token) and
# tokens/s as % of the bound.  Needs root; heavy: keep -n small.
#
#   scripts/bench/bench-replay.sh                  # 24 generated tokens, 3G
#   scripts/bench/bench-replay.sh -n 16 --mem 3G --model FILE --proving P.gguf
#   env: MCV_BIN (the tools' folder), MCV_BENCH_FULL (the model),
#        MCV_PROVING (the proving text model; default examples/models/
#        proving-text.gguf, else an export of the newest checkpoint in
#        /root/mcv-runs/proving into a temporary folder)
set -eu

here=$(cd "$(dirname "$0")/../.." && pwd)
bindir=${MCV_BIN:-$here/bin}
model=${MCV_BENCH_FULL:-/root/mcv-models/qwen35moe-35b-a3b-q4_k.gguf}
proving=${MCV_PROVING:-}
mem=3G threads=2 ngen=24
cgname=mcv-bench-replay

usage() {
	echo "usage: bench-replay.sh [-n TOKENS] [-t THREADS] [--mem SIZE] [--model FILE] [--proving FILE]" >&2
	exit 2
}
num() { case $2 in ''|*[!0-9]*) echo "bench-replay: $1 needs a number" >&2; exit 2;; esac; }
while [ $# -gt 0 ]; do
	case $1 in
	-n) num "$1" "${2-}"; ngen=$2; shift 2;;
	-t|--threads) num "$1" "${2-}"; threads=$2; shift 2;;
	--mem) mem=${2:?}; shift 2;;
	--model) model=${2:?}; shift 2;;
	--proving) proving=${2:?}; shift 2;;
	-h|--help) usage;;
	*) echo "bench-replay: unknown option $1" >&2; usage;;
	esac
done

py=/usr/bin/python3
run=$bindir/mcv-run
pred=$bindir/mcv-predict
if [ ! -f "$model" ]; then
	echo "bench-replay: $model is absent (make it with mcv-genmodel --shape 35b-a3b --expert-type q4_k): skipped"
	exit 0
fi
[ -x "$run" ] && [ -x "$pred" ] || { echo "bench-replay: $run or $pred missing (make, or set MCV_BIN)" >&2; exit 1; }
. "$here/scripts/bench/cgroup.sh"
cg_open bench-replay "$cgname" "$mem"

# the proving model: never written into examples/models
if [ -z "$proving" ]; then
	if [ -f "$here/examples/models/proving-text.gguf" ]; then
		proving=$here/examples/models/proving-text.gguf
	else
		ckpt=$(ls /root/mcv-runs/proving/ckpt-*.pt 2>/dev/null | sort | tail -n 1)
		[ -n "$ckpt" ] || { echo "bench-replay: no proving model and no checkpoint: skipped"; exit 0; }
		echo "bench-replay: exporting $ckpt"
		nice -n 15 $py "$here/scripts/ref/export.py" --ckpt "$ckpt" --out-dir "$tmp" --no-vision >"$tmp/export.log" 2>&1 ||
			{ echo "bench-replay: export failed: $(tail -n 1 "$tmp/export.log")" >&2; exit 1; }
		proving=$tmp/proving-text.gguf
	fi
fi

# traces of the proving model: one to replay, three others to train on
trace() { # OUT PROMPT
	nice -n 15 "$run" -m "$proving" -p "$2" -n "$ngen" --temp 0 -t "$threads" -q \
		--trace-routing "$1" >/dev/null 2>"$tmp/trace.err" ||
		{ echo "bench-replay: recording a trace failed: $(tail -n 1 "$tmp/trace.err")" >&2; exit 1; }
}
trace "$tmp/replay.trace" "Describe a busy street market in the morning, with its sounds and colours."
trace "$tmp/t1.trace" "Write a short story about a lighthouse keeper who finds a message in a bottle."
trace "$tmp/t2.trace" "Explain how a refrigerator keeps food cold, step by step."
trace "$tmp/t3.trace" "List five things to check on a receipt before paying, and why."
nice -n 15 "$pred" train -q -t "$threads" -m "$proving" --lookahead 1 --epochs 10 \
	"$tmp/t1.trace" "$tmp/t2.trace" "$tmp/t3.trace" -o "$tmp/pred.gguf" 2>"$tmp/train.err" ||
	{ echo "bench-replay: mcv-predict train failed: $(tail -n 1 "$tmp/train.err")" >&2; exit 1; }

# the disk's best bandwidth for expert-sized direct reads (cgroup.sh)
read_bw "$model"
echo "bench-replay: $(basename "$model") ($(du -h "$model" | cut -f1)), proving $(basename "$proving"), cgroup $mem," \
	"$threads threads, read bandwidth ${bw_mib} MiB/s (best of expert-sized random direct reads: $bw_all)"

rp() { # NAME extra-options...
	name=$1
	shift
	run_cg "$tmp/$name.out" "$tmp/$name.err" "$run" -m "$model" --replay "$tmp/replay.trace" \
		-t "$threads" --mem "$mem" --stats "$@"
}
rp none --lookahead 0
rp router --replay-model "$proving" --lookahead 1
rp trained --replay-model "$proving" --predictor "$tmp/pred.gguf" --lookahead 1

$py - "$tmp" "$bw_mib" <<'PY'
import re, sys
tmp, bw = sys.argv[1], float(sys.argv[2])
for name in ("none", "router", "trained"):
    rc, peak, oom, _maj = open(f"{tmp}/{name}.out.cg").read().split()
    err = open(f"{tmp}/{name}.err").read()
    if rc != "0":
        print(f"{name:8s} failed (exit {rc}, oom kills {oom}): {err.strip().splitlines()[-2:]}")
        continue
    g = lambda p: re.search(p, err)
    dec = g(r"decode (\d+) tokens ([0-9.]+) s ([0-9.]+) tok/s")
    hit = g(r"hit rate ([0-9.]+)%")
    mibt = g(r"decode: ([0-9.]+) MiB read per token, stall ([0-9.]+) ms")
    rec = g(r"1 layer ahead: recall ([0-9.]+)%")
    rss = g(r"maxrss_kb (\d+)")
    tps = float(dec.group(3)) if dec else 0.0
    b = float(mibt.group(1)) if mibt else 0.0
    bound = bw / b if b > 0 else float("inf")
    print(f"{name:8s} decode {tps:6.2f} tok/s ({dec.group(1) if dec else '?'} steps)  {b:7.1f} MiB/token"
          f"  stall {float(mibt.group(2)) if mibt else 0:7.1f} ms/token  hit {float(hit.group(1)) if hit else 0:5.1f}%"
          f"  recall@1 {rec.group(1) + '%' if rec else '-':>6s}  bound {bound:6.2f} tok/s"
          f" ({100 * tps / bound if bound else 0:.0f}% of it)  peak RSS {int(rss.group(1)) / 1024 if rss else 0:.0f} MiB,"
          f" cgroup peak {int(peak) / 2**20:.0f} MiB, oom kills {oom}")
PY

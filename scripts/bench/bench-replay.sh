#!/bin/sh
# Replay at full size (mcv-run --replay, mcv-run(1)): the routing of the
# trained proving model, recorded as a trace, drives the real expert cache
# and reads of the 35B-A3B-shape file (random weights, ~20 GB) inside a
# memory cgroup (v1) of 3 GiB, page cache dropped before every run:
#   - replay, no prediction (lookahead 0): on-demand reads only
#   - replay, the proving model's router baseline, lookahead 1
#   - replay, a predictor trained (mcv-predict train) on other traces
# and prints hit rate, MiB read per decode token, tokens/s, the physical
# bound (read bandwidth / MiB read per token; the bandwidth is the mean of
# two 3 s probes in mcv's read pattern right before and right after each
# run, cgroup.sh probe_row) and tokens/s as % of the bound, with the disk's
# busy time during decode.  --predictor FILE replays with that trained
# predictor (e.g. bench-predict.sh's, trained on many traces) instead of
# one trained here on three short traces.  --trace FILE replays FILE (a
# routing trace of the proving model, e.g. a held-out one of
# bench-predict.sh) instead of recording one on a plain-text prompt, which
# is unlike the task prompts a predictor is trained on (the trained
# predictor's recall on that trace is 62.9% against the router's 68.2%,
# mcv-predict eval; 89.4% against 71.6% on a held-out task trace).  Needs
# root; heavy: keep -n small.
#
#   scripts/bench/bench-replay.sh                  # 24 generated tokens, 3G
#   scripts/bench/bench-replay.sh -n 16 --mem 3G --model FILE --proving P.gguf
#   scripts/bench/bench-replay.sh --predictor /tmp/bp20/pred.gguf
#   env: MCV_BIN (the tools' folder), MCV_BENCH_FULL (the model),
#        MCV_PROVING (the proving text model; default examples/models/
#        proving-text.gguf, else an export of the newest checkpoint in
#        /root/mcv-runs/proving into a temporary folder)
set -eu

here=$(cd "$(dirname "$0")/../.." && pwd)
bindir=${MCV_BIN:-$here/bin}
model=${MCV_BENCH_FULL:-/root/mcv-models/qwen35moe-35b-a3b-q4_k.gguf}
proving=${MCV_PROVING:-}
mem=3G threads=2 ngen=24 predictor= rtrace=
cgname=mcv-bench-replay

usage() {
	echo "usage: bench-replay.sh [-n TOKENS] [-t THREADS] [--mem SIZE] [--model FILE] [--proving FILE]" >&2
	echo "       [--predictor FILE] [--trace FILE]" >&2
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
	--predictor) predictor=${2:?}; shift 2;;
	--trace) rtrace=${2:?}; shift 2;;
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
if [ -n "$rtrace" ]; then
	[ -f "$rtrace" ] || { echo "bench-replay: no trace $rtrace" >&2; exit 1; }
	cp "$rtrace" "$tmp/replay.trace"
else
	trace "$tmp/replay.trace" "Describe a busy street market in the morning, with its sounds and colours."
fi
if [ -n "$predictor" ]; then
	[ -f "$predictor" ] || { echo "bench-replay: no predictor $predictor" >&2; exit 1; }
	cp "$predictor" "$tmp/pred.gguf"
else
	trace "$tmp/t1.trace" "Write a short story about a lighthouse keeper who finds a message in a bottle."
	trace "$tmp/t2.trace" "Explain how a refrigerator keeps food cold, step by step."
	trace "$tmp/t3.trace" "List five things to check on a receipt before paying, and why."
	nice -n 15 "$pred" train -q -t "$threads" -m "$proving" --lookahead 1 --epochs 10 \
		"$tmp/t1.trace" "$tmp/t2.trace" "$tmp/t3.trace" -o "$tmp/pred.gguf" 2>"$tmp/train.err" ||
		{ echo "bench-replay: mcv-predict train failed: $(tail -n 1 "$tmp/train.err")" >&2; exit 1; }
fi

# the disk's best bandwidth for expert-sized direct reads (cgroup.sh)
read_bw "$model"
echo "bench-replay: $(basename "$model") ($(du -h "$model" | cut -f1)), proving $(basename "$proving"), cgroup $mem," \
	"$threads threads, read bandwidth ${bw_mib} MiB/s (best of expert-sized random direct reads: $bw_all)"

rp() { # NAME extra-options...
	name=$1
	shift
	probe_row "$model" plain; echo "$probe_mib" >"$tmp/$name.bw"
	run_cg "$tmp/$name.out" "$tmp/$name.err" "$run" -m "$model" --replay "$tmp/replay.trace" \
		-t "$threads" --mem "$mem" --stats "$@"
	probe_row "$model" plain; echo "$probe_mib" >>"$tmp/$name.bw"
}
rp none --lookahead 0
rp router --replay-model "$proving" --lookahead 1
rp trained --replay-model "$proving" --predictor "$tmp/pred.gguf" --lookahead 1

$py - "$tmp" <<'PY'
import re, sys
tmp = sys.argv[1]
print("| replay | decode tok/s | MiB read / token | stall ms / token | hit rate | recall@k 1 ahead"
      " | disk in decode: busy, requests in flight | probe before / after MiB/s | bound tok/s | % of bound | peak RSS / cgroup MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name in ("none", "router", "trained"):
    rc, peak, oom, _maj, t0, t1 = open(f"{tmp}/{name}.out.cg").read().split()
    bws = [float(x) for x in open(f"{tmp}/{name}.bw").read().split()]
    bw = sum(bws) / len(bws)
    err = open(f"{tmp}/{name}.err").read()
    if rc != "0":
        print(f"| {name} | failed (exit {rc}, oom kills {oom}): {' / '.join(err.strip().splitlines()[-2:])} |")
        continue
    g = lambda p: re.search(p, err)
    dec = g(r"decode (\d+) tokens ([0-9.]+) s ([0-9.]+) tok/s")
    hit = g(r"hit rate ([0-9.]+)%")
    mibt = g(r"decode: ([0-9.]+) MiB read per token, stall ([0-9.]+) ms")
    rec = g(r"1 layer ahead: recall ([0-9.]+)%")
    rss = g(r"maxrss_kb (\d+)")
    # tokens / seconds: the printed rate has one decimal only
    tps = int(dec.group(1)) / float(dec.group(2)) if dec and float(dec.group(2)) > 0 else 0.0
    b = float(mibt.group(1)) if mibt else 0.0
    bound = bw / b if b > 0 else float("inf")
    dec_s = float(dec.group(2)) if dec else 0.0
    busy = fl = None
    io = [tuple(map(float, l.split())) for l in open(f"{tmp}/{name}.out.io") if len(l.split()) == 5]
    if len(io) >= 2 and dec_s > 1.0:
        tend = io[-1][0]
        def at(t, k):
            for a, c in zip(io, io[1:]):
                if a[0] <= t <= c[0]:
                    return a[k] + (c[k] - a[k]) * (t - a[0]) / (c[0] - a[0]) if c[0] > a[0] else c[k]
            return io[0][k] if t < io[0][0] else io[-1][k]
        busy = 100 * (at(tend, 4) - at(tend - dec_s, 4)) / 1000 / dec_s
        fl = (at(tend, 3) - at(tend - dec_s, 3)) / 1000 / dec_s
    label = {"none": "no prediction (lookahead 0)", "router": "router baseline, lookahead 1",
             "trained": "trained predictor, lookahead 1"}[name]
    print(f"| {label} | {tps:.2f} ({dec.group(1) if dec else '?'} steps) | {b:.0f}"
          f" | {float(mibt.group(2)) if mibt else 0:.0f} | {float(hit.group(1)) if hit else 0:.1f}%"
          f" | {rec.group(1) + '%' if rec else '-'} | {'-' if busy is None else f'{busy:.0f}%, {fl:.2f}'}"
          f" | {bws[0]:.0f} / {bws[-1]:.0f} | {bound:.2f} | {100 * tps / bound if bound else 0:.0f}%"
          f" | {int(rss.group(1)) / 1024 if rss else 0:.0f} / {int(peak) / 2**20:.0f} |")
PY

#!/bin/sh
# Lookahead Expert Scheduling at full size: decode tokens/s of the 35B-A3B
# shape (random weights, ~20 GB) inside a memory cgroup (v1) of 3 GiB, page
# cache dropped before every run, 2 threads:
#   - mcv-run --mem 3G            LES: router predictor, prefetch
#   - mcv-run --mem 3G --lookahead 0   on-demand reads only
#   - llama.cpp (scripts/peer/run.mjs --shim), the same cgroup: mmap paging
# and prints tokens/s, bytes read per token, hit rate, peak memory of the
# cgroup, the physical bound (read bandwidth / bytes per token) and the
# ratios against llama.cpp.  Needs root (cgroup, drop_caches); heavy: keep
# -n small.
#
#   scripts/bench/bench-les.sh                     # 16 tokens, 3G
#   scripts/bench/bench-les.sh -n 32 --mem 3G --peer-n 8 --model FILE
#   env: MCV_BIN (mcv-run's folder), MCV_BENCH_FULL (the model)
set -eu

here=$(cd "$(dirname "$0")/../.." && pwd)
bindir=${MCV_BIN:-$here/bin}
model=${MCV_BENCH_FULL:-/root/mcv-models/qwen35moe-35b-a3b-q4_k.gguf}
mem=3G threads=2 ngen=16 peer_n=8 lookahead=1 peer=1 ctx=256
cgname=mcv-bench-les

usage() {
	echo "usage: bench-les.sh [-n DECODE_TOKENS] [-t THREADS] [--mem SIZE] [--lookahead N]" >&2
	echo "       [--peer-n N] [--no-peer] [--model FILE]" >&2
	exit 2
}
num() { case $2 in ''|*[!0-9]*) echo "bench-les: $1 needs a number" >&2; exit 2;; esac; }
while [ $# -gt 0 ]; do
	case $1 in
	-n) num "$1" "${2-}"; ngen=$2; shift 2;;
	-t|--threads) num "$1" "${2-}"; threads=$2; shift 2;;
	--mem) mem=${2:?}; shift 2;;
	--lookahead) num "$1" "${2-}"; lookahead=$2; shift 2;;
	--peer-n) num "$1" "${2-}"; peer_n=$2; shift 2;;
	--no-peer) peer=0; shift;;
	--model) model=${2:?}; shift 2;;
	-h|--help) usage;;
	*) echo "bench-les: unknown option $1" >&2; usage;;
	esac
done

py=/usr/bin/python3
run=$bindir/mcv-run
if [ ! -f "$model" ]; then
	echo "bench-les: $model is absent (make it with mcv-genmodel --shape 35b-a3b --expert-type q4_k): skipped"
	exit 0
fi
[ -x "$run" ] || { echo "bench-les: $run missing (make, or set MCV_BIN)" >&2; exit 1; }
. "$here/scripts/bench/cgroup.sh"
cg_open bench-les "$cgname" "$mem"

# the prompt: ids every generated vocabulary has
ids=$($py -c "print(','.join(str(1 + i * 7 % 281) for i in range(8)))")

# the bound's numerator: read bandwidth of large direct reads from the model file
read_bw "$model"

echo "bench-les: $(basename "$model") ($(du -h "$model" | cut -f1)), cgroup $mem, $threads threads," \
	"$ngen decode tokens, read bandwidth ${bw_mib} MiB/s (2 MiB direct reads), readahead ${ra} KiB"

mcv() { # NAME extra-options...
	name=$1
	shift
	run_cg "$tmp/$name.out" "$tmp/$name.err" "$run" -m "$model" --tokens "$ids" -n "$ngen" --ctx "$ctx" \
		--temp 1 --seed 1 -t "$threads" --mem "$mem" --json --stats "$@"
}
mcv les --lookahead "$lookahead"
mcv ondemand --lookahead 0
if [ "$peer" = 1 ]; then
	[ -d "$here/scripts/peer/node_modules" ] || sh "$here/scripts/setup.sh"
	run_cg "$tmp/peer.out" "$tmp/peer.err" node "$here/scripts/peer/run.mjs" --shim --model "$model" \
		--tokens "$ids" -n "$peer_n" --threads "$threads" --ctx "$ctx"
fi

$py - "$tmp" "$bw_mib" "$peer" <<'EOF'
import json, re, sys
tmp, bw, peer = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
def cg(name):
    rc, peak, oom, maj = open(f"{tmp}/{name}.out.cg").read().split()
    return int(rc), int(peak), int(oom), int(maj)
def tail(name):
    return open(f"{tmp}/{name}.err").read().strip().splitlines()[-3:]
rows = {}
for name in ("les", "ondemand"):
    rc, peak, oom, maj = cg(name)
    err = open(f"{tmp}/{name}.err").read()
    if rc != 0:
        print(f"{name:9s} failed (exit {rc}, oom kills {oom}): {tail(name)}")
        continue
    j = json.loads(open(f"{tmp}/{name}.out").read().strip().splitlines()[-1])
    tps = j["stats"]["decode_tps"]
    hit = re.search(r"hit rate ([0-9.]+)%", err)
    mibt = re.search(r"decode: ([0-9.]+) MiB read per token, stall ([0-9.]+) ms", err)
    rec = re.search(r"1 layer ahead: recall ([0-9.]+)%", err)
    rss = re.search(r"maxrss_kb (\d+)", err)
    b = float(mibt.group(1)) if mibt else 0.0
    bound = bw / b if b > 0 else float("inf")
    rows[name] = tps
    print(f"{name:9s} decode {tps:6.2f} tok/s  {b:7.1f} MiB/token  stall {float(mibt.group(2)) if mibt else 0:7.1f} ms/token"
          f"  hit {float(hit.group(1)) if hit else 0:5.1f}%  recall@1 {rec.group(1) + '%' if rec else '-':>6s}"
          f"  bound {bound:6.2f} tok/s ({100 * tps / bound if bound else 0:.0f}%)"
          f"  peak RSS {int(rss.group(1)) / 1024 if rss else 0:.0f} MiB, cgroup peak {peak / 2**20:.0f} MiB,"
          f" major faults {maj}, oom kills {oom}")
if peer:
    rc, peak, oom, maj = cg("peer")
    if rc != 0:
        print(f"llama.cpp failed (exit {rc}, oom kills {oom}): {tail('peer')}")
    else:
        j = json.loads(open(f"{tmp}/peer.out").read())
        n = len(j["tokens"])
        tps = (n - 1) / (j["decode_ms"] / 1000.0) if j["decode_ms"] > 0 else 0.0
        rows["peer"] = tps
        print(f"llama.cpp decode {tps:6.2f} tok/s ({n - 1} steps)  cgroup peak {peak / 2**20:.0f} MiB,"
              f" major faults {maj}, oom kills {oom}")
        for name in ("les", "ondemand"):
            if name in rows and tps > 0:
                print(f"ratio {name} / llama.cpp: {rows[name] / tps:.2f}x")
if "les" in rows and "ondemand" in rows and rows["ondemand"] > 0:
    print(f"ratio les / on-demand: {rows['les'] / rows['ondemand']:.2f}x")
EOF

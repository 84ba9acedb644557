#!/bin/sh
# Lookahead Expert Scheduling at full size: decode tokens/s of the 35B-A3B
# shape (random weights, ~20 GB) inside a memory cgroup (v1) of 3 GiB, page
# cache dropped before every run, 2 threads.  Rows (--rows):
#   les              mcv-run --mem 3G: router predictor, prefetch
#   ondemand         mcv-run --mem 3G --lookahead 0: on-demand reads only
#   les-packed       the same two on the packed copy (mcv-pack, --packed)
#   ondemand-packed
#   peer             llama.cpp (scripts/peer/run.mjs --shim), the same
#                    cgroup: mmap paging, so the disk's readahead matters
# Every row runs once per readahead of --readahead (the original value is
# put back on exit, whatever happens).  Prints per row tokens/s, MiB read
# per decode token (mcv's own count, and the disk's during decode), hit
# rate, recall, peak memory of the cgroup and of the process, the physical
# bound (best direct-read bandwidth / MiB read per token) and the ratios.
# --results FILE keeps the rows of several calls (one JSON line each), so a
# benchmark split into short calls still prints one table; --report FILE
# prints that table without running anything.  Needs root; heavy: keep -n
# small.
#
#   scripts/bench/bench-les.sh                     # 16 tokens, 3G, every row
#   scripts/bench/bench-les.sh -n 32 --readahead 128K,8M --rows les,peer
#   scripts/bench/bench-les.sh --results R.jsonl --rows peer --readahead 128K
#   scripts/bench/bench-les.sh --report R.jsonl
#   env: MCV_BIN (mcv-run's folder), MCV_BENCH_FULL (the model),
#        MCV_BENCH_PACKED (its packed copy)
set -eu

here=$(cd "$(dirname "$0")/../.." && pwd)
bindir=${MCV_BIN:-$here/bin}
model=${MCV_BENCH_FULL:-/root/mcv-models/qwen35moe-35b-a3b-q4_k.gguf}
packed=${MCV_BENCH_PACKED:-/root/mcv-models/qwen35moe-35b-a3b-q4_k.packed.gguf}
mem=3G threads=2 ngen=16 peer_n=8 lookahead=1 ctx=256
rows=les,ondemand,les-packed,ondemand-packed,peer
ras=keep results='' report='' nopeer=0
cgname=mcv-bench-les

usage() {
	echo "usage: bench-les.sh [-n DECODE_TOKENS] [-t THREADS] [--mem SIZE] [--lookahead N]" >&2
	echo "       [--peer-n N] [--no-peer] [--model FILE] [--packed FILE] [--rows LIST]" >&2
	echo "       [--readahead LIST] [--results FILE] | --report FILE" >&2
	echo "  LIST of rows: les,ondemand,les-packed,ondemand-packed,peer (default all)" >&2
	echo "  LIST of readaheads: sizes in KiB or with K/M, or 'keep' (default keep)" >&2
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
	--no-peer) nopeer=1; shift;;
	--model) model=${2:?}; shift 2;;
	--packed) packed=${2:?}; shift 2;;
	--rows) rows=${2:?}; shift 2;;
	--readahead) ras=${2:?}; shift 2;;
	--results) results=${2:?}; shift 2;;
	--report) report=${2:?}; shift 2;;
	-h|--help) usage;;
	*) echo "bench-les: unknown option $1" >&2; usage;;
	esac
done
[ "$nopeer" = 0 ] || rows=$(echo "$rows" | tr , '\n' | grep -vx peer | paste -sd, -)
for r in $(echo "$rows" | tr , ' '); do
	case $r in les|ondemand|les-packed|ondemand-packed|peer) ;;
	*) echo "bench-les: unknown row '$r'" >&2; usage;; esac
done
# readaheads in KiB
ra_list=
for a in $(echo "$ras" | tr , ' '); do
	case $a in
	keep) k=keep;;
	*[0-9][kK]) k=${a%?};;
	*[0-9][mM]) k=$(( ${a%?} * 1024 ));;
	*[0-9]) k=$a;;
	*) echo "bench-les: bad readahead '$a'" >&2; usage;;
	esac
	case $k in keep) ;; ''|*[!0-9]*) echo "bench-les: bad readahead '$a'" >&2; usage;; esac
	ra_list="$ra_list $k"
done

py=/usr/bin/python3
table() { # RESULTS-FILE
	$py - "$1" <<'EOF_PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    print("bench-les: no rows"); sys.exit(0)
def ra(r): return "default" if r["ra_kb"] is None else (f"{r['ra_kb'] // 1024} MiB" if r["ra_kb"] >= 1024 and r["ra_kb"] % 1024 == 0 else f"{r['ra_kb']} KiB")
def f(x, fmt, dash="-"): return dash if x is None else format(x, fmt)
print("| row | readahead | decode tok/s | MiB read / token (mcv; disk) | stall ms / token | hit rate | recall@k 1 ahead"
      " | cgroup peak MiB | peak RSS MiB | disk MiB/s in decode | best read MiB/s | bound tok/s | % of bound |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    name = r["row"]
    if r["rc"] != 0:
        print(f"| {name} | {ra(r)} | failed (exit {r['rc']}, oom kills {r['oom']}): {r.get('error', '')} |")
        continue
    mib = r["mib_tok"] if r["mib_tok"] is not None else r["disk_mib_tok"]
    bound = r["bw"] / mib if mib else None
    r["bound"] = bound
    pct = 100 * r["tps"] / bound if bound else None
    mark = f" [file mapped by {r['mapped_by_others']} other processes]" if r.get("mapped_by_others") else ""
    print(f"| {name}{mark} | {ra(r)} | {r['tps']:.2f} ({r['steps']} steps) | {f(r['mib_tok'], '.0f')}; {f(r['disk_mib_tok'], '.0f')}"
          f" | {f(r['stall_ms'], '.0f')} | {f(r['hit'], '.1f')}{'%' if r['hit'] is not None else ''}"
          f" | {f(r['recall'], '.1f')}{'%' if r['recall'] is not None else ''} | {r['cg_peak'] / 2**20:.0f}"
          f" | {f(r['rss_mib'], '.0f')} | {f(r['disk_mib_tok'] * r['tps'] if r['disk_mib_tok'] else None, '.0f')}"
          f" | {r['bw']:.0f} | {f(bound, '.2f')} | {f(pct, '.0f')}{'%' if pct is not None else ''} |")
print()
ok = [r for r in rows if r["rc"] == 0]
def best_of(name, ra_kb=False):
    x = [r for r in ok if r["row"] == name and (ra_kb is False or r["ra_kb"] == ra_kb)]
    return max(x, key=lambda r: r["tps"]) if x else None
pbest = best_of("peer")
peers = {}
for r in ok:
    if r["row"] == "peer" and (r["ra_kb"] not in peers or r["tps"] > peers[r["ra_kb"]]["tps"]):
        peers[r["ra_kb"]] = r
print("best of the runs of each row (tok/s), and the ratios:")
for name in ("les", "les-packed", "ondemand", "ondemand-packed", "peer"):
    mine = [r for r in ok if r["row"] == name]
    if not mine:
        continue
    by = {}
    for r in mine:
        by.setdefault(r["ra_kb"], []).append(r)
    parts = []
    for k, rs in sorted(by.items(), key=lambda kv: kv[0] or 0):
        b = max(rs, key=lambda r: r["tps"])
        pc = f", {100 * b['tps'] / b['bound']:.0f}% of its bound" if b.get("bound") else ""
        parts.append(f"{b['tps']:.2f} at {ra(b)} ({len(rs)} run{'s' if len(rs) > 1 else ''}: "
                     + " ".join(f"{x['tps']:.2f}" for x in rs) + pc + ")")
    line = f"  {name}: " + "; ".join(parts)
    if name != "peer" and pbest and pbest["tps"] > 0:
        b = max(mine, key=lambda r: r["tps"])
        w = min((max(rs, key=lambda r: r["tps"]) for rs in by.values()), key=lambda r: r["tps"])
        line += f"\n    / llama.cpp at its best readahead ({ra(pbest)}, {pbest['tps']:.2f}): {b['tps'] / pbest['tps']:.2f}x"
        if w is not b:
            line += f" (at the worse readahead for {name}: {w['tps'] / pbest['tps']:.2f}x)"
        for k, p in sorted(peers.items(), key=lambda kv: kv[0] or 0):
            if p is not pbest and p["tps"] > 0:
                line += f"; / llama.cpp at {ra(p)} ({p['tps']:.2f}): {b['tps'] / p['tps']:.1f}x"
    print(line)
def pair(a, b, what):
    for k in sorted({r["ra_kb"] or 0 for r in ok}):
        x, y = best_of(a, k or None) or best_of(a, k), best_of(b, k or None) or best_of(b, k)
        if x and y and y["tps"] > 0:
            print(f"  {what} at {ra(x)}: {x['tps'] / y['tps']:.2f}x")
pair("les-packed", "les", "packed / plain, LES")
pair("ondemand-packed", "ondemand", "packed / plain, on demand")
pair("les", "ondemand", "LES / on demand, plain")
pair("les-packed", "ondemand-packed", "LES / on demand, packed")
EOF_PY
}
if [ -n "$report" ]; then
	[ -f "$report" ] || { echo "bench-les: $report: no such file" >&2; exit 1; }
	table "$report"
	exit 0
fi

run=$bindir/mcv-run
if [ ! -f "$model" ]; then
	echo "bench-les: $model is absent (make it with mcv-genmodel --shape 35b-a3b --expert-type q4_k): skipped"
	exit 0
fi
case ",$rows," in *,les-packed,*|*,ondemand-packed,*)
	if [ ! -f "$packed" ]; then
		echo "bench-les: no packed copy $packed (mcv-pack $model $packed): packed rows skipped"
		rows=$(echo "$rows" | sed 's/les-packed//; s/ondemand-packed//; s/,,*/,/g; s/^,//; s/,$//')
	fi;;
esac
[ -x "$run" ] || { echo "bench-les: $run missing (make, or set MCV_BIN)" >&2; exit 1; }
. "$here/scripts/bench/cgroup.sh"
cg_open bench-les "$cgname" "$mem"
[ -n "$results" ] || results=$tmp/results.jsonl
touch "$results"

# the prompt: ids every generated vocabulary has
ids=$($py -c "print(','.join(str(1 + i * 7 % 281) for i in range(8)))")

# the bound's numerator: the disk's best bandwidth for expert-sized direct
# reads, measured again right before every row (it drifts: see cgroup.sh)
read_bw "$model"
ra0=$ra

echo "bench-les: $(basename "$model") ($(du -h "$model" | cut -f1)), cgroup $mem, $threads threads," \
	"$ngen decode tokens (llama.cpp $peer_n); direct reads of one expert at random offsets, MiB/s at 1/2/4/8" \
	"in flight: $bw_all (in order, 2 MiB: $bw_seq); readahead ${ra0} KiB"

# NAME RA-KIB FILE: one row's files in $tmp -> one JSON line in $results
collect() {
	$py - "$tmp/$1" "$1" "$2" "$bw_mib" "$threads" "$ngen" "$3" "$bw_all" "$shared" >>"$results" <<'EOF_PY'
import json, re, sys, time
base, name, ra, bw, threads, ngen, path, bw_all, shared = sys.argv[1:10]
rc, peak, oom, maj, t0, t1 = open(base + ".out.cg").read().split()
err = open(base + ".err").read()
r = {"row": name, "ra_kb": None if ra == "keep" else int(ra), "bw": float(bw), "threads": int(threads),
     "rc": int(rc), "cg_peak": int(peak), "oom": int(oom), "major_faults": int(maj),
     "tps": 0.0, "steps": 0, "mib_tok": None, "disk_mib_tok": None, "stall_ms": None,
     "hit": None, "recall": None, "rss_mib": None, "wall_s": float(t1) - float(t0),
     "file": path, "bw_all": bw_all, "mapped_by_others": int(shared), "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(t0)))}
with open("/proc/loadavg") as fl:
    r["load"] = float(fl.read().split()[0])
g = lambda p: re.search(p, err)
m = g(r"maxrss_kb (\d+)")
if m: r["rss_mib"] = int(m.group(1)) / 1024
if r["rc"] != 0:
    r["error"] = " / ".join(l for l in err.strip().splitlines()[-3:] if not l.startswith("maxrss_kb"))[:200]
else:
    out = open(base + ".out").read().strip().splitlines()[-1]
    j = json.loads(out)
    if name == "peer":
        r["steps"] = j["decode_steps"]
        dec_s = j["decode_ms"] / 1000.0
        r["tps"] = r["steps"] / dec_s if dec_s > 0 else 0.0
    else:
        s = j["stats"]
        r["tps"], dec_s = s["decode_tps"], s["decode_s"]
        r["steps"] = s["decode_n"]
        m = g(r"decode: ([0-9.]+) MiB read per token, stall ([0-9.]+) ms")
        if m: r["mib_tok"], r["stall_ms"] = float(m.group(1)), float(m.group(2))
        m = g(r"hit rate ([0-9.]+)%")
        if m: r["hit"] = float(m.group(1))
        m = g(r"1 layer ahead: recall ([0-9.]+)%")
        if m: r["recall"] = float(m.group(1))
        r["les"] = [l for l in err.splitlines() if l.startswith("mcv-run: les:")]
    # the disk's sectors read during decode: decoding ends the run (the
    # process prints and exits right after), so the window is the last
    # dec_s seconds before the process ended
    io = [tuple(map(float, l.split())) for l in open(base + ".out.io") if len(l.split()) == 2]
    if len(io) >= 2 and dec_s > 1.0 and r["steps"] > 0:
        tend = io[-1][0]
        def at(t):  # sectors read at time t, linear between samples
            for (ta, sa), (tb, sb) in zip(io, io[1:]):
                if ta <= t <= tb:
                    return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else sb
            return io[0][1] if t < io[0][0] else io[-1][1]
        sect = at(tend) - at(tend - dec_s)
        r["disk_mib_tok"] = sect * 512 / 2**20 / r["steps"]
print(json.dumps(r))
EOF_PY
}

# processes that map FILE: their pages of it stay in the page cache whatever
# drop_caches does and are not charged to our cgroup, so a row then reads
# less from the disk than it should (the row records how many)
mappers() {
	n=0
	for m in /proc/[0-9]*/maps; do
		grep -qF " $1" "$m" 2>/dev/null && n=$((n + 1))
	done
	echo "$n"
}

mcv() { # NAME FILE RA extra-options...
	name=$1 file=$2 rak=$3
	shift 3
	read_bw "$file"
	shared=$(mappers "$file")
	run_cg "$tmp/$name.out" "$tmp/$name.err" "$run" -m "$file" --tokens "$ids" -n "$ngen" --ctx "$ctx" \
		--temp 1 --seed 1 -t "$threads" --mem "$mem" --json --stats "$@"
	collect "$name" "$rak" "$file"
}
peer() { # RA
	[ -d "$here/scripts/peer/node_modules" ] || sh "$here/scripts/setup.sh"
	read_bw "$model"
	shared=$(mappers "$model")
	run_cg "$tmp/peer.out" "$tmp/peer.err" node "$here/scripts/peer/run.mjs" --shim --model "$model" \
		--tokens "$ids" -n "$peer_n" --threads "$threads" --ctx "$ctx"
	collect peer "$1" "$model"
}

for rak in $ra_list; do
	[ "$rak" = keep ] || ra_set "$rak"
	now=$(cat "$ra_sys" 2>/dev/null || echo keep)
	echo "bench-les: readahead $now KiB"
	for r in $(echo "$rows" | tr , ' '); do
		case $r in
		les) mcv les "$model" "$now" --lookahead "$lookahead";;
		ondemand) mcv ondemand "$model" "$now" --lookahead 0;;
		les-packed) mcv les-packed "$packed" "$now" --lookahead "$lookahead";;
		ondemand-packed) mcv ondemand-packed "$packed" "$now" --lookahead 0;;
		peer) peer "$now";;
		esac
		tail -n 1 "$results" | $py -c "
import json, sys; r = json.loads(sys.stdin.read())
print(f\"bench-les: {r['row']}: exit {r['rc']}, {r['tps']:.2f} tok/s ({r['steps']} steps), {r['wall_s']:.0f} s\"
      + (f\" (warning: {r['mapped_by_others']} other processes mapped the file)\" if r['mapped_by_others'] else ''))"
	done
done
if [ -n "$ra_orig" ]; then
	echo "$ra_orig" > "$ra_sys"
	echo "bench-les: readahead back to $(cat "$ra_sys") KiB"
fi
table "$results"

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
# rate, recall, peak memory of the cgroup and of the process, the disk's
# throughput, busy time and reads in flight during decode, the physical
# bound and the ratios.  The bound is read bandwidth / MiB read per token,
# the bandwidth the mean of two probes of --probe-s seconds (3) right before
# and right after the run, in the row's own pattern (cgroup.sh probe_row:
# --probe-qd experts in flight, 2 as mcv's reader threads; a plain file's
# expert as three reads, a packed one's as one): this disk drifts by 2x and
# more within minutes, so a bandwidth measured at another time says little.
# Rows of one call share a call id, so packed/plain pairs can be compared
# within one call.  --seed S (1): the k-th mcv row of a call samples with
# seed S+k (--temp 1), so no two rows decode the same tokens: a row that
# repeated another's routing would re-read the same bytes, which the host's
# cache under this VM's disk serves up to ~2x faster (seen: 2040 MiB/s
# while busy against probes of ~1120); give every call its own S.
# --mcv-opts adds options to every mcv row (e.g. "--io-threads 4"); --tag T
# names the rows ROW+T in the results (an experiment beside the defaults).
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
mem=3G threads=2 ngen=16 peer_n=8 lookahead=1 ctx=256 seed=1 mcv_opts= tag=
rows=les,ondemand,les-packed,ondemand-packed,peer
ras=keep results='' report='' nopeer=0
cgname=mcv-bench-les

usage() {
	echo "usage: bench-les.sh [-n DECODE_TOKENS] [-t THREADS] [--mem SIZE] [--lookahead N]" >&2
	echo "       [--peer-n N] [--no-peer] [--model FILE] [--packed FILE] [--rows LIST]" >&2
	echo "       [--readahead LIST] [--seed N] [--probe-s SECONDS] [--probe-qd N]" >&2
	echo "       [--mcv-opts \"MCV-RUN OPTIONS\"] [--tag TAG] [--results FILE] | --report FILE" >&2
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
	--seed) num "$1" "${2-}"; seed=$2; shift 2;;
	--probe-s) num "$1" "${2-}"; probe_s=$2; shift 2;;
	--probe-qd) num "$1" "${2-}"; probe_qd=$2; shift 2;;
	--mcv-opts) mcv_opts=${2?}; shift 2;;
	--tag) tag=${2?}; shift 2;;
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
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    print("bench-les: no rows"); sys.exit(0)
def ra(r): return "default" if r["ra_kb"] is None else (f"{r['ra_kb'] // 1024} MiB" if r["ra_kb"] >= 1024 and r["ra_kb"] % 1024 == 0 else f"{r['ra_kb']} KiB")
def f(x, fmt, dash="-"): return dash if x is None else format(x, fmt)
med = statistics.median
print("| row | readahead | start (UTC) | decode tok/s | MiB read / token (mcv; disk) | stall ms / token | hit rate | recall@k 1 ahead"
      " | cgroup peak MiB | peak RSS MiB | disk in decode: MiB/s, busy, requests in flight | probe before / after MiB/s | bound tok/s | % of bound |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    name = r["row"]
    if r["rc"] != 0:
        print(f"| {name} | {ra(r)} | {r.get('when', '')} | failed (exit {r['rc']}, oom kills {r['oom']}): {r.get('error', '')} |")
        continue
    mib = r["mib_tok"] if r["mib_tok"] is not None else r["disk_mib_tok"]
    bound = r["bw"] / mib if mib else None
    r["bound"] = bound
    r["pct"] = 100 * r["tps"] / bound if bound else None
    mark = f" [file mapped by {r['mapped_by_others']} other processes]" if r.get("mapped_by_others") else ""
    probe = (f"{r['bw_before']:.0f} / {r['bw_after']:.0f}" if r.get("bw_before") is not None
             else f"{r['bw']:.0f} (best, before)")
    disk = (f"{r['disk_mib_s']:.0f}, {r['disk_busy']:.0f}%, {r['disk_inflight']:.2f}" if r.get("disk_busy") is not None
            else f(r['disk_mib_tok'] * r['tps'] if r['disk_mib_tok'] else None, '.0f'))
    print(f"| {name}{mark} | {ra(r)} | {r.get('when', '')[11:16]} | {r['tps']:.2f} ({r['steps']} steps) | {f(r['mib_tok'], '.0f')}; {f(r['disk_mib_tok'], '.0f')}"
          f" | {f(r['stall_ms'], '.0f')} | {f(r['hit'], '.1f')}{'%' if r['hit'] is not None else ''}"
          f" | {f(r['recall'], '.1f')}{'%' if r['recall'] is not None else ''} | {r['cg_peak'] / 2**20:.0f}"
          f" | {f(r['rss_mib'], '.0f')} | {disk} | {probe} | {f(bound, '.2f')} | {f(r['pct'], '.0f')}{'%' if r['pct'] is not None else ''} |")
print()
ok = [r for r in rows if r["rc"] == 0]
names = [n for n in ("les", "les-packed", "ondemand", "ondemand-packed", "peer") if any(r["row"] == n for r in ok)]
names += sorted({r["row"] for r in ok} - set(names))
kbs = sorted({r["ra_kb"] or 0 for r in ok})
def sel(name, kb=None):
    return [r for r in ok if r["row"] == name and (kb is None or (r["ra_kb"] or 0) == kb)]
def rng(xs, fmt):
    return f"{format(med(xs), fmt)} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"
print("Per row and readahead, over its runs: median (min-max)")
print()
print("| row | readahead | runs | decode tok/s | % of bound | disk busy in decode | requests in flight | probe spread (after-before)/mean |")
print("|---|---|---|---|---|---|---|---|")
for n in names:
    for kb in kbs:
        rs = sel(n, kb)
        if not rs:
            continue
        pc = [r["pct"] for r in rs if r.get("pct") is not None]
        busy = [r["disk_busy"] for r in rs if r.get("disk_busy") is not None]
        fl = [r["disk_inflight"] for r in rs if r.get("disk_inflight") is not None]
        sp = [100 * (r["bw_after"] - r["bw_before"]) / r["bw"] for r in rs if r.get("bw_before") is not None and r["bw"] > 0]
        print(f"| {n} | {ra(rs[0])} | {len(rs)} | {rng([r['tps'] for r in rs], '.2f')} | {rng(pc, '.0f') + '%' if pc else '-'}"
              f" | {rng(busy, '.0f') + '%' if busy else '-'} | {rng(fl, '.2f') if fl else '-'} | {rng(sp, '+.0f') + '%' if sp else '-'} |")
print()
les = [r for r in ok if r["row"] in ("les", "les-packed") and r.get("pct") is not None]
# the disk's busy time and requests in flight in decode say whether mcv
# kept the disk fed (they are no bound: with 4 reader threads a run kept it
# 88% busy at the same MiB/s as with 2 and 67%); busy time comes from
# io_ticks, counted in jiffies (4 ms here), so it is coarse.  "requests in
# flight" counts the block layer's requests: a read of more than 254 pages
# (a packed expert) is split in two
for kb in kbs:
    pc = [r["pct"] for r in les if (r["ra_kb"] or 0) == kb]
    if pc:
        m = med(pc)
        busy = [r["disk_busy"] for r in les if (r["ra_kb"] or 0) == kb and r.get("disk_busy") is not None]
        print(f"LES (plain and packed) at {ra(next(r for r in les if (r['ra_kb'] or 0) == kb))}: median {m:.0f}% of the bound"
              f" over {len(pc)} runs ({min(pc):.0f}-{max(pc):.0f}%): goal 85% {'met' if m >= 85 else 'not met'}"
              + (f"; disk busy in decode median {med(busy):.0f}% ({min(busy):.0f}-{max(busy):.0f}%)" if busy else ""))
print()
peers = {}
for r in sel("peer"):
    if r["ra_kb"] not in peers or r["tps"] > peers[r["ra_kb"]]["tps"]:
        peers[r["ra_kb"]] = r
pbest = max(peers.values(), key=lambda r: r["tps"]) if peers else None
if pbest and pbest["tps"] > 0:
    pm = med([r["tps"] for r in sel("peer", pbest["ra_kb"] or 0)])
    print(f"llama.cpp at its best readahead ({ra(pbest)}): best {pbest['tps']:.2f}, median {pm:.2f} tok/s")
    for n in names:
        if n == "peer":
            continue
        for kb in kbs:
            rs = sel(n, kb)
            if rs:
                print(f"  {n} at {ra(rs[0])} / llama.cpp: best {max(r['tps'] for r in rs) / pbest['tps']:.2f}x,"
                      f" median {med([r['tps'] for r in rs]) / pm:.2f}x")
# pairs within one call (same readahead): the disk's drift between calls
# falls out of their ratio
def pairs(a, b, what):
    for kb in kbs:
        xs = []
        for x in sel(a, kb):
            ys = [y for y in sel(b, kb) if y.get("call") is not None and y.get("call") == x.get("call")]
            xs += [x["tps"] / y["tps"] for y in ys if y["tps"] > 0]
        ma, mb = sel(a, kb), sel(b, kb)
        if ma and mb:
            line = f"  {what} at {ra(ma[0])}: medians {med([r['tps'] for r in ma]) / med([r['tps'] for r in mb]):.2f}x"
            if xs:
                line += f", paired within a call {rng(xs, '.2f')}x over {len(xs)} pairs"
            print(line)
print("ratios:")
pairs("les-packed", "les", "packed / plain, LES")
pairs("ondemand-packed", "ondemand", "packed / plain, on demand")
pairs("les", "ondemand", "LES / on demand, plain")
pairs("les-packed", "ondemand-packed", "LES / on demand, packed")
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
call=$(date -u +%Y%m%dT%H%M%S)-$$
BENCH_TAG=$tag
export BENCH_TAG
nrow=0
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
	$py - "$tmp/$1" "$1" "$2" "$bw_before" "$threads" "$ngen" "$3" "$bw_all" "$shared" "$bw_after" "$probe" "$call" >>"$results" <<'EOF_PY'
import json, os, re, sys, time
base, name, ra, bw, threads, ngen, path, bw_all, shared, bw_after, probe, call = sys.argv[1:13]
# the bound's bandwidth: the mean of the probes right before and right
# after the run, in the row's own read pattern (cgroup.sh probe_row)
bw_before, bw_after = float(bw), float(bw_after)
bw = (bw_before + bw_after) / 2
rc, peak, oom, maj, t0, t1 = open(base + ".out.cg").read().split()
err = open(base + ".err").read()
r = {"row": name + (("+" + os.environ["BENCH_TAG"]) if os.environ.get("BENCH_TAG") else ""), "ra_kb": None if ra == "keep" else int(ra), "bw": float(bw), "threads": int(threads),
     "rc": int(rc), "cg_peak": int(peak), "oom": int(oom), "major_faults": int(maj),
     "tps": 0.0, "steps": 0, "mib_tok": None, "disk_mib_tok": None, "stall_ms": None,
     "hit": None, "recall": None, "rss_mib": None, "wall_s": float(t1) - float(t0),
     "file": path, "bw_all": bw_all, "mapped_by_others": int(shared),
     "bw_before": bw_before, "bw_after": bw_after, "probe": probe, "call": call, "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(t0)))}
with open("/proc/loadavg") as fl:
    r["load"] = float(fl.read().split()[0])
g = lambda p: re.search(p, err)
m = g(r"maxrss_kb (\d+)")
if m: r["rss_mib"] = int(m.group(1)) / 1024
m = g(r"cpu_s ([0-9.]+) ([0-9.]+)")
if m: r["cpu_s"] = float(m.group(1)) + float(m.group(2))
if os.environ.get("ROWSEED"): r["seed"] = int(os.environ["ROWSEED"])
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
    # samples: time, sectors read, reads, ms spent reading (summed over
    # reads: its rate is the mean number in flight), ms busy
    io = [tuple(map(float, l.split())) for l in open(base + ".out.io") if len(l.split()) == 5]
    if len(io) >= 2 and dec_s > 1.0 and r["steps"] > 0:
        tend = io[-1][0]
        def at(t, k):  # field k at time t, linear between samples
            for a, b in zip(io, io[1:]):
                if a[0] <= t <= b[0]:
                    return a[k] + (b[k] - a[k]) * (t - a[0]) / (b[0] - a[0]) if b[0] > a[0] else b[k]
            return io[0][k] if t < io[0][0] else io[-1][k]
        d = lambda k: at(tend, k) - at(tend - dec_s, k)
        r["disk_mib_tok"] = d(1) * 512 / 2**20 / r["steps"]
        r["disk_mib_s"] = d(1) * 512 / 2**20 / dec_s
        r["disk_busy"] = 100 * d(4) / 1000 / dec_s
        r["disk_inflight"] = d(3) / 1000 / dec_s
        r["disk_read_ms"] = d(3) / d(2) if d(2) > 0 else None
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
	rowseed=$((seed + nrow))
	nrow=$((nrow + 1))
	ROWSEED=$rowseed
	export ROWSEED
	case $name in *packed) kind=packed;; *) kind=plain;; esac
	shared=$(mappers "$file")
	probe_row "$file" "$kind"; bw_before=$probe_mib
	run_cg "$tmp/$name.out" "$tmp/$name.err" "$run" -m "$file" --tokens "$ids" -n "$ngen" --ctx "$ctx" \
		--temp 1 --seed "$rowseed" -t "$threads" --mem "$mem" --json --stats $mcv_opts "$@"
	probe_row "$file" "$kind"; bw_after=$probe_mib
	probe="$kind reads, ${probe_qd:-2} experts in flight, ${probe_s:-3} s"
	collect "$name" "$rak" "$file"
}
peer() { # RA
	[ -d "$here/scripts/peer/node_modules" ] || sh "$here/scripts/setup.sh"
	shared=$(mappers "$model")
	ROWSEED=
	probe_row "$model" plain; bw_before=$probe_mib
	run_cg "$tmp/peer.out" "$tmp/peer.err" node "$here/scripts/peer/run.mjs" --shim --model "$model" \
		--tokens "$ids" -n "$peer_n" --threads "$threads" --ctx "$ctx"
	probe_row "$model" plain; bw_after=$probe_mib
	probe="plain reads, ${probe_qd:-2} experts in flight, ${probe_s:-3} s"
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

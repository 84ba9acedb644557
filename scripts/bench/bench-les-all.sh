#!/bin/sh
# The LES benchmark of issues 6 and 7 in one command, 2 threads, every table
# from one run (each step is one of the scripts beside this one):
#   device   the disk alone: direct reads of an expert as three reads of a
#            third (a plain file) against one read (a packed file), 1, 2 and
#            4 in flight, alternating (cgroup.sh probe_reads): what packing
#            can gain on this device
#   les      bench-les.sh in the 3 GiB cgroup, ROUNDS rounds, one call per
#            round and readahead, rows les, les-packed, ondemand,
#            ondemand-packed in an order that turns every round: plain versus
#            packed, and tokens/s against the bound measured around each run
#   peer     bench-les.sh --rows peer (llama.cpp) at the first readahead
#   predict  bench-predict.sh: recall@k of a trained predictor beside the
#            router baseline; bench-les-proving.sh: the proving model at a
#            15% budget with both
#   replay   bench-replay.sh: the proving model's routing on the full-size
#            store, with the same trained predictor; the trace replayed is
#            --replay-trace, else the predict folder's held-out ev202-0.trace,
#            else one bench-replay.sh records on a plain-text prompt
#   report   the tables, from the files of the folder
#
#   scripts/bench/bench-les-all.sh -o DIR [--steps LIST] [--rounds R]
#       [-n TOKENS] [--peer-n N] [--readahead "128K 8M"] [--wrap "CMD"]
#       [--predict-dir DIR] [--predictor FILE] [--seed S] [--replay-trace FILE]
#
# -o DIR keeps every result (bench-les.sh's rows in DIR/les.jsonl, one line
# per run, appended), so a run cut short is continued by naming the steps
# left (--steps les,report) and --steps report prints the tables again.
# --wrap CMD runs every heavy call under CMD (e.g. a lock that serialises
# benchmarks on a shared box); each call stays short (about 3 minutes for
# four full-size rows).  --predict-dir: bench-predict.sh's --keep folder,
# reused (its traces; with --predictor FILE no training, which takes ~20
# minutes); without --predictor one is trained there.  The c-th les call
# samples with seeds S+10c+k (S: --seed, 0), so a continued run should
# name another S.  Needs root.
# Environment: as the scripts it runs (MCV_BIN, BIN, MCV_BENCH_FULL, ...).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
bench=$here/scripts/bench
out= steps=device,les,peer,predict,replay,report rounds=3 ngen=32 peer_n=8
ras="128K 8M" wrap= pdir= predictor= seed0=0 rtrace=
usage() {
	sed -n '2,/^set -eu/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case $1 in
	-o) out=${2:?}; shift ;;
	--steps) steps=${2:?}; shift ;;
	--rounds) rounds=${2:?}; shift ;;
	-n) ngen=${2:?}; shift ;;
	--peer-n) peer_n=${2:?}; shift ;;
	--readahead) ras=${2:?}; shift ;;
	--wrap) wrap=${2?}; shift ;;
	--predict-dir) pdir=${2:?}; shift ;;
	--predictor) predictor=${2:?}; shift ;;
	--seed) seed0=${2:?}; shift ;;
	--replay-trace) rtrace=${2:?}; shift ;;
	-h|--help) usage ;;
	*) echo "bench-les-all: unknown option $1" >&2; usage ;;
	esac
	shift
done
[ -n "$out" ] || { echo "bench-les-all: -o DIR is required" >&2; usage; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
MCV_BIN=${MCV_BIN:-$here/bin}
BIN=${BIN:-$MCV_BIN}
export MCV_BIN BIN
log() { echo "bench-les-all: $(date -u +%H:%M:%S) $*" >&2; }
has() { case ",$steps," in *,"$1",*) return 0 ;; esac; return 1; }
# shellcheck disable=SC2086
w() { $wrap "$@"; }

if has device; then
	log "device: per-request cost"
	# shellcheck disable=SC2016
	w sh -c '. "$1/cgroup.sh"; f=$2; shift 2; probe_reads "$f" "$@"' sh "$bench" \
		"${MCV_BENCH_FULL:-/root/mcv-models/qwen35moe-35b-a3b-q4_k.gguf}" 2 4 \
		3x580K:593920:3:1 1x1.69M:1769472:1:1 3x580K:593920:3:2 1x1.69M:1769472:1:2 \
		3x580K:593920:3:4 1x1.69M:1769472:1:4 >"$out/device.txt"
fi

if has les; then
	set -- les les-packed ondemand ondemand-packed
	i=1 c=0
	while [ "$i" -le "$rounds" ]; do
		for ra in $ras; do
			log "les: round $i of $rounds, readahead $ra, rows $1,$2,$3,$4"
			# every call its own seeds (bench-les.sh: row k samples
			# with seed S+k), so no run repeats another's reads
			c=$((c + 1))
			w "$bench/bench-les.sh" -n "$ngen" --no-peer --rows "$1,$2,$3,$4" --readahead "$ra" \
				--seed $((seed0 + 10 * c)) --results "$out/les.jsonl" >>"$out/les.log" 2>&1 ||
				log "les: a call failed (see $out/les.log)"
			# the next call starts with the next row: no row always runs
			# first after the cache drop or last before the probe
			set -- "$2" "$3" "$4" "$1"
		done
		i=$((i + 1))
	done
fi

if has peer; then
	ra=${ras%% *}
	log "peer: llama.cpp at readahead $ra"
	w "$bench/bench-les.sh" --peer-n "$peer_n" --rows peer --readahead "$ra" \
		--results "$out/les.jsonl" >>"$out/les.log" 2>&1 || log "peer: the call failed (see $out/les.log)"
fi

if has predict; then
	keep=${pdir:-$out/predict}
	if [ -n "$predictor" ]; then
		log "predict: evaluating $predictor"
		(cd "$here" && "$bench/bench-predict.sh" --keep "$keep" --reuse --predictor "$predictor") \
			>"$out/predict.txt" 2>"$out/predict.log"
		pf=$predictor
	else
		log "predict: recording traces and training (~20 min or more)"
		(cd "$here" && "$bench/bench-predict.sh" -n 20 --keep "$keep" --reuse) \
			>"$out/predict.txt" 2>"$out/predict.log"
		pf=$keep/pred.gguf
	fi
	echo "$pf" >"$out/predictor.path"
	log "predict: the proving model at a 15% budget"
	(cd "$here" && w "$bench/bench-les-proving.sh" -t 2 -n 128 -r 3 --budgets 15 --predictor "$pf") \
		>"$out/proving.txt" 2>"$out/proving.log"
fi

if has replay; then
	pf=$predictor
	[ -n "$pf" ] || pf=$(cat "$out/predictor.path" 2>/dev/null || true)
	# a held-out task trace of bench-predict.sh (never trained on), so the
	# trained predictor sees prompts like the ones it learned from
	rt=${rtrace:-${pdir:-$out/predict}/ev202-0.trace}
	[ -f "$rt" ] || rt=
	log "replay: the proving model's routing on the full-size store${rt:+ ($rt)}"
	w "$bench/bench-replay.sh" -n 24 ${pf:+--predictor "$pf"} ${rt:+--trace "$rt"} \
		>"$out/replay.txt" 2>"$out/replay.log" || log "replay: failed (see $out/replay.log)"
fi

has report || exit 0
echo "## The disk alone: one expert (1.69 MiB) as three reads or one, direct, random offsets"
echo
if [ -s "$out/device.txt" ]; then
	/usr/bin/python3 - "$out/device.txt" <<'EOF'
import statistics, sys
runs, mibs = {}, {}
for l in open(sys.argv[1]):
    name, qd, piece, pieces, mib, eps, ms = l.split()
    runs.setdefault((int(qd), name), []).append(float(eps))
    mibs.setdefault((int(qd), name), []).append(float(mib))
med = statistics.median
print("| reads in flight | 3 x 580 KiB: experts/s (MiB/s) | 1 x 1.69 MiB: experts/s (MiB/s) | packed / plain, median of rounds (min-max) |")
print("|---|---|---|---|")
for qd in sorted({q for q, _ in runs}):
    a, b = runs.get((qd, "3x580K"), []), runs.get((qd, "1x1.69M"), [])
    if not a or not b:
        continue
    # rounds alternate the two patterns: a round's pair saw the same disk
    rs = [y / x for x, y in zip(a, b) if x > 0]
    ma, mb = med(mibs[(qd, "3x580K")]), med(mibs[(qd, "1x1.69M")])
    print(f"| {qd} | {med(a):.0f} ({ma:.0f}) | {med(b):.0f} ({mb:.0f}) | "
          f"{med(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f}) |")
a1, b1 = runs.get((1, "3x580K"), []), runs.get((1, "1x1.69M"), [])
if a1 and b1:
    # at one read in flight: t(3 reads) - t(1 read) = 2 request costs + the
    # cost of three seeks instead of one
    d = [(1000 / x - 1000 / y) / 2 for x, y in zip(a1, b1) if x > 0 and y > 0]
    print()
    print(f"Fixed cost per request at 1 in flight, (t(3 reads) - t(1 read)) / 2: median {med(d):.2f} ms"
          f" ({min(d):.2f} to {max(d):.2f}); an expert takes {1000 / med(b1):.2f} ms as one read.")
EOF
else
	echo "(no device step in $out)"
fi
echo
echo "## LES at full size, 3 GiB cgroup (bench-les.sh)"
echo
if [ -s "$out/les.jsonl" ]; then
	"$bench/bench-les.sh" --report "$out/les.jsonl"
else
	echo "(no les rows in $out)"
fi
echo
echo "## Trained predictor against the router baseline (proving model)"
echo
[ -s "$out/predict.txt" ] && { echo '```'; cat "$out/predict.txt"; echo '```'; } || echo "(no predict step in $out)"
echo
[ -s "$out/proving.txt" ] && { echo '```'; cat "$out/proving.txt"; echo '```'; }
echo
echo "## Replay of the proving model's routing on the full-size store (bench-replay.sh)"
echo
[ -s "$out/replay.txt" ] && cat "$out/replay.txt" || echo "(no replay step in $out)"

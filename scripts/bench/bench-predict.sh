#!/bin/sh
# Expert-predictor recall on the proving model: routing traces recorded by
# mcv-run --trace-routing over synthetic prompts (text and image tasks),
# a predictor trained by mcv-predict on some seeds and evaluated on a
# different seed beside the router baseline.
#
#   scripts/bench/bench-predict.sh [-n PER_TASK] [--eval-n PER_TASK] [--keep DIR]
#
# Train traces: gen.py --seed 101 and --seed 303 (PER_TASK samples of every
# task each, default 5); eval traces: --seed 202 (default 2 per task).  Each
# prompt is one mcv-run (64 new tokens, --temp 0.7, seed = its index, 1
# thread).  Prints mcv-predict eval's table (recall@k per layer, lookahead 1
# and 2, trained vs router).  Environment: B (build folder, default build),
# MODEL / MMPROJ (default examples/models/proving-*.gguf).
set -eu
cd "$(dirname "$0")/../.."
B=${B:-build}
BIN=${BIN:-bin}
PY=/usr/bin/python3
N=5 EN=2 KEEP=
while [ $# -gt 0 ]; do
	case $1 in
	-n) N=$2; shift ;;
	--eval-n) EN=$2; shift ;;
	--keep) KEEP=$2; shift ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-predict: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
MODEL=${MODEL:-examples/models/proving-text.gguf}
MMPROJ=${MMPROJ:-examples/models/proving-mmproj.gguf}
for x in "$BIN/mcv-run" "$BIN/mcv-predict"; do
	[ -x "$x" ] || { echo "bench-predict: $x not built (make)" >&2; exit 1; }
done
[ -f "$MODEL" ] || { echo "bench-predict: no model $MODEL" >&2; exit 1; }
if [ -n "$KEEP" ]; then W=$KEEP; mkdir -p "$W"; else W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# traces SEED PER_TASK PREFIX: one trace per prompt of the split
traces() {
	sd=$1 pre=$3
	$PY scripts/data/gen.py --seed "$sd" --n "$2" --task all --out "$W/s$sd" >/dev/null
	$PY -c '
import json, sys
for l in open(sys.argv[1] + "/data.jsonl"):
    d = json.loads(l)
    print((d["image"] or "-") + "\t" + d["prompt"].replace("\n", " "))
' "$W/s$sd" | {
		i=0
		while IFS="$(printf '\t')" read -r img prompt; do
			set -- -m "$MODEL" --mmproj "$MMPROJ" -p "$prompt" -n 64 --temp 0.7 -s $i -t 1 \
				--trace-routing "$W/$pre-$i.trace"
			[ "$img" = "-" ] || set -- "$@" -i "$W/s$sd/$img"
			"$BIN/mcv-run" -q "$@" >/dev/null
			i=$((i + 1))
		done
	}
}
t0=$(date +%s)
traces 101 "$N" tr
traces 303 "$N" tr3
traces 202 "$EN" ev
t1=$(date +%s)
echo "bench-predict: traces in $((t1 - t0)) s ($(ls "$W"/tr*.trace | wc -l) train, $(ls "$W"/ev-*.trace | wc -l) eval prompts)" >&2
"$BIN/mcv-predict" train -m "$MODEL" -t 2 "$W"/tr*.trace -o "$W/pred.gguf" >&2
t2=$(date +%s)
echo "bench-predict: trained in $((t2 - t1)) s" >&2
"$BIN/mcv-predict" eval -m "$MODEL" "$W/pred.gguf" "$W"/ev-*.trace

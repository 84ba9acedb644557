#!/bin/sh
# Expert-predictor recall on the proving model: routing traces recorded by
# mcv-run --trace-routing over synthetic prompts (text and image tasks),
# a predictor trained by mcv-predict on some seeds and evaluated on a
# different seed beside the router baseline.
#
#   scripts/bench/bench-predict.sh [-n PER_TASK] [--eval-n PER_TASK] [--keep DIR]
#       [--reuse] [--train-seeds "101 303"] [--train-opts "OPTIONS"]
#       [--predictor FILE]
#
# Train traces: gen.py --seed S for every S of --train-seeds (default 101
# and 303; PER_TASK samples of every task each, default 5); eval traces:
# --seed 202 (default 2 per task), never trained on.  Each prompt is one
# mcv-run (64 new tokens, --temp 0.7, seed = its index, 1 thread), its
# trace DIR/trS-I.trace or DIR/ev202-I.trace.  --reuse keeps the traces
# already in the --keep DIR (only missing ones are recorded).  --train-opts
# are passed to mcv-predict train (e.g. "--context none" for the hidden
# state alone).  --predictor FILE evaluates FILE instead of training one
# (training takes ~20 min on 2 shared cores; with --reuse only the missing
# eval traces are recorded).  Prints mcv-predict eval's table (recall@k per layer,
# lookahead 1 and 2, trained vs router).  Environment: B (build folder,
# default build), MODEL / MMPROJ (default examples/models/proving-*.gguf).
set -eu
cd "$(dirname "$0")/../.."
B=${B:-build}
BIN=${BIN:-bin}
PY=/usr/bin/python3
N=5 EN=2 KEEP= REUSE=0 SEEDS="101 303" TOPTS= PRED=
while [ $# -gt 0 ]; do
	case $1 in
	-n) N=$2; shift ;;
	--eval-n) EN=$2; shift ;;
	--keep) KEEP=$2; shift ;;
	--reuse) REUSE=1 ;;
	--train-seeds) SEEDS=$2; shift ;;
	--train-opts) TOPTS=$2; shift ;;
	--predictor) PRED=$2; shift ;;
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
[ "$REUSE" = 1 ] && [ -z "$KEEP" ] && { echo "bench-predict: --reuse needs --keep DIR" >&2; exit 2; }
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
			if [ "$REUSE" = 1 ] && [ -s "$W/$pre-$i.trace" ]; then
				i=$((i + 1))
				continue
			fi
			set -- -m "$MODEL" --mmproj "$MMPROJ" -p "$prompt" -n 64 --temp 0.7 -s $i -t 1 \
				--trace-routing "$W/$pre-$i.trace"
			[ "$img" = "-" ] || set -- "$@" -i "$W/s$sd/$img"
			"$BIN/mcv-run" -q "$@" >/dev/null
			i=$((i + 1))
		done
	}
}
t0=$(date +%s)
if [ -n "$PRED" ]; then
	[ -f "$PRED" ] || { echo "bench-predict: no predictor $PRED" >&2; exit 1; }
	traces 202 "$EN" ev202
	echo "bench-predict: eval traces in $(($(date +%s) - t0)) s ($(ls "$W"/ev202-*.trace | wc -l) prompts); predictor $PRED" >&2
	# not exec: the EXIT trap removes a temporary folder
	"$BIN/mcv-predict" eval -m "$MODEL" "$PRED" "$W"/ev202-*.trace
	exit
fi
TR=
for sd in $SEEDS; do
	[ "$sd" = 202 ] && { echo "bench-predict: seed 202 is the evaluation split" >&2; exit 2; }
	traces "$sd" "$N" "tr$sd"
	TR="$TR tr$sd"
done
traces 202 "$EN" ev202
t1=$(date +%s)
set --
for p in $TR; do
	set -- "$@" "$W/$p"-*.trace
done
echo "bench-predict: traces in $((t1 - t0)) s ($# train, $(ls "$W"/ev202-*.trace | wc -l) eval prompts)" >&2
# shellcheck disable=SC2086
"$BIN/mcv-predict" train -m "$MODEL" -t 2 $TOPTS "$@" -o "$W/pred.gguf" >&2
t2=$(date +%s)
echo "bench-predict: trained in $((t2 - t1)) s" >&2
"$BIN/mcv-predict" eval -m "$MODEL" "$W/pred.gguf" "$W"/ev202-*.trace

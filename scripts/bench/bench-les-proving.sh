#!/bin/sh
# LES on the proving model (real routing): decode tokens/s fully resident,
# and under budgets holding about 50% and 15% of the experts with on-demand
# reads (--lookahead 0), router prediction (lookahead 1) and, with
# --predictor FILE, a trained predictor; hit rate and recall from --stats.
#
#   scripts/bench/bench-les-proving.sh [-t THREADS] [-n TOKENS] [--predictor FILE] [-r ROUNDS]
#
# Prompt: 8 fixed token ids, then N greedy decode steps (--ignore-eos); the
# best of R rounds per configuration.  Environment: BIN (default bin), MODEL.
set -eu
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
MODEL=${MODEL:-examples/models/proving-text.gguf}
T=2 N=128 R=3 PRED=
while [ $# -gt 0 ]; do
	case $1 in
	-t) T=$2; shift ;;
	-n) N=$2; shift ;;
	-r) R=$2; shift ;;
	--predictor) PRED=$2; shift ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-les-proving: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
RUN=$BIN/mcv-run
[ -x "$RUN" ] || { echo "bench-les-proving: $RUN not built" >&2; exit 1; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
# a fixed prompt and a fixed number of decode steps (--ignore-eos)
PROMPT=2037,270,10,3,55,100,200,300
n_exp=$(( $("$RUN" -m "$MODEL" -p hi -n 1 --mem 1G --stats 2>&1 >/dev/null |
	sed -n 's/.*slots of [0-9.]* MiB, [0-9.]*% of \([0-9]*\) experts.*/\1/p') ))
min=$("$RUN" -m "$MODEL" -p hi -n 1 --mem 1K 2>&1 >/dev/null | sed -n 's/.*below the minimum \([0-9]*\) .*/\1/p')
"$RUN" -m "$MODEL" -p hi -n 1 --mem $((min + 8388608)) --stats 2>"$W/e" >/dev/null
slot=$(sed -n 's/.*expert cache \([0-9.]*\) (\([0-9]*\) slots.*/\1 \2/p' "$W/e" | awk '{ printf "%d", $1 * 1048576 / $2 }')
k=$("$RUN" -m "$MODEL" -p hi -n 1 --mem 1K 2>&1 | sed -n 's/.*top-\([0-9]*\) experts.*/\1/p')

# one CONFIG-NAME [mcv-run options]: best decode tok/s of R rounds + the les lines
one() {
	name=$1; shift
	best=0 i=0
	while [ $i -lt "$R" ]; do
		"$RUN" -m "$MODEL" --tokens "$PROMPT" -n "$N" --temp 0 --ignore-eos \
			-t "$T" --stats "$@" >/dev/null 2>"$W/s"
		tps=$(sed -n 's/.*decode[: ].* \([0-9.]*\) tok\/s.*/\1/p' "$W/s" | head -1)
		best=$(awk -v a="$best" -v b="${tps:-0}" 'BEGIN { print (b > a) ? b : a }')
		i=$((i + 1))
	done
	hit=$(sed -n 's/.*les: hit rate \([0-9.]*%\).*/\1/p' "$W/s")
	rec=$(sed -n 's/.*les: prediction 1 layer ahead: recall \([0-9.]*%\).*/\1/p' "$W/s")
	mib=$(sed -n 's/.*les: decode: \([0-9.]*\) MiB read per token.*/\1/p' "$W/s")
	printf '%-34s %8s %8s %8s %10s\n' "$name" "$best" "${hit:--}" "${rec:--}" "${mib:--}"
	eval "tps_$(echo "$name" | tr -c 'a-z0-9\n' '_')=$best"
}
printf '%-34s %8s %8s %8s %10s\n' config "tok/s" hit recall@k "MiB/token"
one resident
for f in 50 15; do
	mem=$((min + (n_exp * f / 100 - k) * slot))
	one "${f}% on-demand (lookahead 0)" --mem "$mem" --lookahead 0
	one "${f}% router, lookahead 1" --mem "$mem" --lookahead 1
	one "${f}% router, lookahead 2" --mem "$mem" --lookahead 2
	[ -z "$PRED" ] || one "${f}% trained, lookahead 1" --mem "$mem" --lookahead 1 --predictor "$PRED"
	[ -z "$PRED" ] || one "${f}% trained, lookahead 2" --mem "$mem" --lookahead 2 --predictor "$PRED"
done

#!/bin/sh
# Receipt totals into CSV with standard tools only (no jq): mcv-run --text
# writes one line per receipt, SOURCE<TAB>MEMBER<TAB>ANSWER, with tabs and
# newlines inside a field escaped, so awk can split it safely.
#   examples/pipelines/receipts-to-csv.sh [RECEIPTS_DIR] [OUT.csv]
# Defaults: the receipt-*.png of examples/images/, and totals.csv.
# Receipts that fail are reported on standard error and left out; the exit
# status is then 1.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ge 1 ]; then dir=$1 pattern='*.png'; else dir=$here/../images pattern='receipt-*.png'; fi
out=${2:-totals.csv}
run=${MCV_RUN:-mcv-run}
command -v "$run" >/dev/null 2>&1 || run=$here/../../bin/mcv-run

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
status=0
find "$dir" -type f -name "$pattern" ! -name '.*' | sort |
	"$run" ${MCV_RUN_OPTS:-} --batch --text --temp 0 -n 16 -p "What is the total?" >"$tmp" ||
	status=$?
awk -F '\t' 'BEGIN { print "file,total" }
{
	n = split($1, part, "/"); file = part[n]
	# the first number of the answer: "31.78" from "TOTAL 31.78"
	total = ""
	if (match($3, /[0-9]+([.,][0-9]+)?/))
		total = substr($3, RSTART, RLENGTH)
	sub(/,/, ".", total)
	gsub(/"/, "\"\"", file)
	printf "\"%s\",%s\n", file, total
}' "$tmp" >"$out"
echo "$(($(wc -l <"$out") - 1)) receipts in $out" >&2
exit $status

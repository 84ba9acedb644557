#!/bin/sh
# OCR every screenshot under a folder: find(1) names them, mcv-run reads the
# paths from standard input (-0: NUL-separated, so any file name works) and
# writes one JSON line per image; 4x compression keeps small text legible.
#   examples/pipelines/ocr-folder.sh [SHOTS_DIR] [OUT.jsonl]
# Defaults: the screenshot-*.png of examples/images/, and ocr.jsonl.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ge 1 ]; then dir=$1 pattern='*.png'; else dir=$here/../images pattern='screenshot-*.png'; fi
out=${2:-ocr.jsonl}
run=${MCV_RUN:-mcv-run}
command -v "$run" >/dev/null 2>&1 || run=$here/../../bin/mcv-run

status=0
find "$dir" -type f -name "$pattern" ! -name '.*' -print0 | sort -z |
	"$run" ${MCV_RUN_OPTS:-} -0 --temp 0 --compress 4x -p "Read all text." >"$out" || status=$?
echo "$(wc -l <"$out") pages in $out" >&2
exit $status

#!/bin/sh
# Caption every image of a folder (or of an existing archive) into JSON lines,
# one per image.  The folder is streamed through a pipe as a tar archive,
# which is how archives arrive from elsewhere (curl, ssh): nothing is unpacked.
#   examples/pipelines/caption-archive.sh [PHOTOS_DIR | ARCHIVE] [OUT.jsonl]
# Defaults: examples/images/ and captions.jsonl.  Extra mcv-run options (for
# example -m MODEL --mmproj FILE) go in $MCV_RUN_OPTS.  Exit status: mcv-run's
# (1 when any member gave an error record).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$here/../images}
out=${2:-captions.jsonl}
run=${MCV_RUN:-mcv-run}
command -v "$run" >/dev/null 2>&1 || run=$here/../../bin/mcv-run

status=0
if [ -d "$src" ]; then
	# only the pictures go in the archive: any other member would be an
	# error record ("not an image") and make the exit status 1
	(cd "$src" && find . -type f ! -name '.*' \( -iname '*.png' -o -iname '*.jpg' -o -iname '*.jpeg' \) |
		sed 's|^\./||' | sort | bsdtar -cf - -T -) |
		"$run" ${MCV_RUN_OPTS:-} --archive - -p "Describe the image." >"$out" || status=$?
else
	"$run" ${MCV_RUN_OPTS:-} --archive "$src" -p "Describe the image." >"$out" || status=$?
fi
echo "$(wc -l <"$out") captions in $out" >&2
exit $status

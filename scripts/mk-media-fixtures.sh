#!/bin/sh
# Remake the committed media fixtures (test/fixtures/media/).  Only the
# video is committed: the tests make every image and archive themselves,
# but bats has no ffmpeg CLI to make a video with, so this uses the unit
# test's own encoder (FFmpeg's libraries): 30 frames, 64x48, 10 fps,
# MPEG-4 with B-frames, frame i a flat grey of Y = 16 + 6i.
#   scripts/mk-media-fixtures.sh [BUILD_DIR]   (default build; needs `make`)
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
make --no-print-directory B="$B" "$B/test/test_media_video" >/dev/null
"$B/test/test_media_video" --write test/fixtures/media/tiny.mp4
ls -l test/fixtures/media/tiny.mp4

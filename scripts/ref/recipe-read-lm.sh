#!/bin/sh
# Reading, the language model's side (session 26): the shipped language model
# learns to read the place-free glyph code (glyph_code.tables bind 0: each
# glyph's own embedding x 8 at the token holding it, its place left to the
# M-RoPE positions; sessions 23-24 found it read best), while it keeps its
# scenes on the exact scene code (--keep-scenes).  The tower takes no part:
# recipe-read.sh teaches it to recognise glyphs, and a later stage teaches
# it to write this code.  Seven tasks in turn (an odd count, so each task
# alternates 16x and 4x), from one-word reads to whole receipts.
#
#   RUN=/root/mcv-runs/read sh scripts/ref/recipe-read-lm.sh     (about 1 h)
#
# Writes $RUN/lm-read1.pt (skipped if it exists) and logs to $RUN/read-lm.log.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
RUN=${RUN:-/root/mcv-runs/read}
START=${START:-$here/../../runs/nshape/ckpt-0004128.pt}
PY=${PY:-/usr/bin/python3}
mkdir -p "$RUN"
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out="$RUN/lm-read1.pt"
[ -e "$out" ] && { echo "recipe-read-lm: $out exists, skipped" >&2; exit 0; }
"$PY" "$here/oracle_read.py" --ckpt "$START" --feats glyphs --bind 0 --scale 8 \
	--tasks word_read,snippet_read,receipt_total,receipt_read,screenshot_read \
	--keep-scenes scene_caption,scene_count --extra rank+ncolour+nshape \
	--lr 1e-3 --batch 8 --samples 7200 --every 100 --n 6 --threads 1 --save "$out" \
	>> "$RUN/read-lm.log" 2>&1

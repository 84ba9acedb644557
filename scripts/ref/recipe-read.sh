#!/bin/sh
# Reading, stage 1 (session 26): glyph recognition in the shipped tower.
#
# The tower names the glyphs of each 14-px patch of dense text crops
# (tower_code.py --dense: a linear head on the unmerged patch rows), with no
# scene samples a step (--batch 0; the scene code is only reported, so what the
# stage costs the scenes shows in the log), matmuls under bf16 autocast (the
# same recall per crop as float32 at ~1.4x the crops a second).  Two legs:
# 3e-3 while recall climbs fast, then 1e-3 (session 24: the lower rate keeps
# rising).  Four crops a step: session 22 found optimiser steps, not crops,
# set the rate.  Each leg is a number of steps on one thread, so a replay
# draws the same crops in the same order; the second leg continues with the
# crops after the first's (dense_next in the checkpoint's state).
#
#   RUN=/root/mcv-runs/read sh scripts/ref/recipe-read.sh      (about 1.5 h)
#
# Writes $RUN/tower-read1.pt and $RUN/tower-read2.pt (compact checkpoints:
# the shipped language model, the trained tower, its dense head); a leg
# whose file exists is skipped, so a second run does nothing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
RUN=${RUN:-/root/mcv-runs/read}
START=${START:-$here/../../runs/nshape/ckpt-0004128.pt}
PY=${PY:-/usr/bin/python3}
mkdir -p "$RUN"
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

leg() {   # leg OUT FROM LR STEPS
	[ -e "$1" ] && { echo "recipe-read: $1 exists, skipped" >&2; return 0; }
	"$PY" "$here/tower_code.py" --ckpt "$2" --save "$1" --lr "$3" --steps "$4" \
		--tasks scene_caption,scene_count,scene_left --extra rank+ncolour+nshape \
		--batch 0 --dense 4 --bf16 --threads 1 --every 500 --n 8 --save-every 15 \
		>> "$RUN/read.log" 2>&1
}
leg "$RUN/tower-read1.pt" "$START" 3e-3 6000
leg "$RUN/tower-read2.pt" "$RUN/tower-read1.pt" 1e-3 8000

#!/bin/sh
# Session 16's stages, from session 15's shipped checkpoint (runs/count) to
# the step-3878 model shipped in examples/models (runs/tower9; see the model card), in the foreground (each stage is skipped
# when its output exists, so run it again to go on).
#
#     RUN=/root/mcv-runs/tower9 sh scripts/ref/recipe-tower9.sh
#
# Why (examples/models/README.md, session 16): most caption misses were a
# shape said twice or skipped, the language model finding the next shape by
# the rank the tower writes into its token; the count tower taught 64,000
# samples longer (the rate lowered to 4e-4, then 2e-4) and two joint stages
# with the tower frozen took val captions (400 samples) from 0.84 to 0.92.
# About 1.5 h on this box.
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/tower9}
START=runs/count/ckpt-0003478.pt
PY=/usr/bin/python3
R=scripts/ref
X=rank+ncolour+nshape
W=scene_caption=3,scene_count=3,scene_left=1.5,text=1.5,receipt_total=0.2,receipt_read=0.1,receipt_items=0.1,screenshot_read=0.1
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$RUN"

RECIPE=recipe-tower9
. $R/recipe-lib.sh

stage "$RUN/tower8.pt" $PY $R/tower_code.py --ckpt $START --extra $X --ce 1 --first 76069000 \
	--samples 40000 --lr 4e-4 --every 100 --save "$RUN/tower8.pt"
stage "$RUN/g8.pt" $PY $R/graft.py --text $START --tower "$RUN/tower8.pt" --out "$RUN/g8.pt"
stage "$RUN/tower9.pt" $PY $R/tower_code.py --ckpt "$RUN/g8.pt" --extra $X --ce 1 --first 76109000 \
	--samples 24000 --lr 2e-4 --every 100 --save "$RUN/tower9.pt"
# the joint stage on tower8 (two legs of 150 steps, as session 16 ran them:
# each leg starts with fresh Adam moments), then tower9 takes its place for
# 100 steps more (session 16 ran that last leg on 2 threads)
joint_start "$RUN/g8.pt" 3478
joint 3628
joint 3778
swap_in "$RUN/tower9.pt" "$RUN/swapped9"
joint 3878
cp "$(newest "$RUN/joint")" "$RUN/joint.pt"
echo "recipe-tower9: done; export with: $PY $R/export.py --ckpt $RUN/joint.pt --out-dir examples/models"

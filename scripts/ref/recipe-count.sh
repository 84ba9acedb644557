#!/bin/sh
# Session 15's stages, from session 14's shipped checkpoint (runs/rank-joint)
# to the count-coded model, in the foreground (each stage is skipped when its
# output exists, so run it again to go on).
#
#     RUN=/root/mcv-runs/count sh scripts/ref/recipe-count.sh
#
# Why (examples/models/README.md, session 15): from exact rows the rank
# language model never counted past 1 for a colour or a shape (two red
# shapes: 1, 0 of 14 test scenes); with each shape's token also naming how
# many shapes share its colour and its shape (scene_code extras 'ncolour',
# 'nshape') it counts 0.89 and captions 0.91 after 8,000 samples.  The tower
# learns those counts as it learned the rank, slowly; the joint stage (tower
# frozen) fits the language model to the rows the tower really writes, and
# the tower taught longer takes the old one's place at step $SWAP.  About
# 2.5 h on this box (the stages here run one after another; session 15 ran
# the language-model and tower stages side by side, one core each).
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/count}
START=runs/rank-joint/ckpt-0002683.pt
SWAP=${SWAP:-3185}
JOINT_END=${JOINT_END:-3478}
TOWER7=${TOWER7:-23744}        # samples of the second count-tower leg (session 15 stopped it there)
PY=/usr/bin/python3
R=scripts/ref
X=rank+ncolour+nshape
S=scene_count,scene_count,scene_caption,scene_left
W=scene_caption=3,scene_count=3,scene_left=1.5,text=1.5,receipt_total=0.2,receipt_read=0.1,receipt_items=0.1,screenshot_read=0.1
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$RUN"

RECIPE=recipe-count
. $R/recipe-lib.sh

# the language model learns the count code from exact rows (twice over the
# same 4,000 samples); the rank rows stay the shipped checkpoint's
stage "$RUN/lm-nc.pt" $PY $R/oracle_read.py --ckpt $START --feats words --extra $X --tasks $S \
	--lr 5e-4 --samples 4000 --every 50 --save "$RUN/lm-nc.pt"
stage "$RUN/lm-nc2.pt" $PY $R/oracle_read.py --ckpt "$RUN/lm-nc.pt" --feats words --extra $X --tasks $S \
	--lr 5e-4 --samples 4000 --every 50 --save "$RUN/lm-nc2.pt"
# the rank tower goes on alone, then learns the counts too (the count rows
# from lm-nc.pt, which lm-nc2.pt keeps)
stage "$RUN/tower5.pt" $PY $R/tower_code.py --ckpt $START --extra rank --ce 1 --first 76021000 \
	--samples 12000 --every 100 --save "$RUN/tower5.pt"
stage "$RUN/t6start.pt" $PY $R/graft.py --text "$RUN/lm-nc.pt" --tower "$RUN/tower5.pt" --out "$RUN/t6start.pt"
stage "$RUN/tower6.pt" $PY $R/tower_code.py --ckpt "$RUN/t6start.pt" --extra $X --ce 1 --first 76033000 \
	--samples 12000 --every 100 --save "$RUN/tower6.pt"
stage "$RUN/tower7.pt" $PY $R/tower_code.py --ckpt "$RUN/tower6.pt" --extra $X --ce 1 --first 76045000 \
	--samples "$TOWER7" --every 100 --save "$RUN/tower7.pt"
stage "$RUN/g6.pt" $PY $R/graft.py --text "$RUN/lm-nc2.pt" --tower "$RUN/tower6.pt" --out "$RUN/g6.pt"

joint_swap "$RUN/g6.pt" 2683 "$SWAP" "$RUN/tower7.pt" "$JOINT_END"
echo "recipe-count: done; export with: $PY $R/export.py --ckpt $RUN/joint.pt --out-dir examples/models"

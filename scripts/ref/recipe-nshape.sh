#!/bin/sh
# Session 20's stages, from session 18's shipped checkpoint (runs/tower9, step
# 3878) and session 19's grown tower (runs/grow, or recipe-grow.sh's output)
# to a model whose language model reads the shape counts the tower writes
# (runs/nshape), in the foreground (each stage is skipped when its output
# exists, so run it again to go on).
#
#     RUN=/root/mcv-runs/nshape sh scripts/ref/recipe-nshape.sh
#
# Why (examples/models/README.md, session 20): with the grown tower writing
# how many shapes share a shape (val line 0.94), the language model still
# answered "How many circles?" from other cues (0.76 of such val questions):
# its joint stages had taught it that the old tower's count rows were noise.
# So it first relearns them from exact rows, counts three times as often as
# captions (8,000 samples: val counts from exact rows 0.905 -> 0.94), then
# the grown tower is grafted on and joint stages (every task, the tower
# frozen) fit it to the rows the tower really writes: 150 steps with counts
# weighed 5, 50 at 2e-4 with captions weighed 5 too, 50 at 1e-4 with
# captions weighed 8 (step 4128, shipped in session 20: test counts 0.9275,
# captions 0.91 of 400).  About 1.3 h on this box.
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/nshape}
START=runs/tower9/ckpt-0003878.pt
TOWER=${TOWER:-runs/grow/tower-grown.pt}
PY=/usr/bin/python3
R=scripts/ref
X=rank+ncolour+nshape
REST=scene_left=1.5,text=1.5,receipt_total=0.2,receipt_read=0.1,receipt_items=0.1,screenshot_read=0.1
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$RUN"

RECIPE=recipe-nshape
. $R/recipe-lib.sh

stage "$RUN/lm-ns.pt" $PY $R/oracle_read.py --ckpt $START --feats words --extra $X \
	--tasks scene_count,scene_count,scene_count,scene_caption --lr 5e-4 --samples 8000 --every 100 \
	--save "$RUN/lm-ns.pt"
stage "$RUN/g.pt" $PY $R/graft.py --text "$RUN/lm-ns.pt" --tower "$TOWER" --out "$RUN/g.pt"
joint_start "$RUN/g.pt" 3878
W=scene_caption=3,scene_count=5,$REST joint 4028
W=scene_caption=5,scene_count=5,$REST JOINT_LR=2e-4 joint 4078
W=scene_caption=8,scene_count=5,$REST JOINT_LR=1e-4 joint 4128
cp "$(newest "$RUN/joint")" "$RUN/joint.pt"
echo "recipe-nshape: done; export with: $PY $R/export.py --ckpt $RUN/joint.pt --out-dir examples/models"

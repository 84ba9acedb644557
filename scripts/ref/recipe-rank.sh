#!/bin/sh
# Session 14's stages, from session 13's shipped checkpoint (runs/column) and
# its rank tower (runs/rank) to the rank-coded model, in the foreground (each
# stage is skipped when its output exists, so run it again to go on).
#
#     RUN=/root/mcv-runs/rank sh scripts/ref/recipe-rank.sh
#
# Why (examples/models/README.md, sessions 13 and 14): from exact rows the
# language model captions 0.95 of test scenes at 16x when a shape's token also
# names its rank from the left (scene_code extra 'rank'), against 0.76 with
# its patch column.  The column tower starts to write ranks; it goes on here,
# the language model learns the rank code from exact rows, and the two go
# together in a joint stage with the tower frozen, where --aux-floor brings
# back the experts the scene-only stages had starved (layer 1: six of 64
# below 0.2% of the slots).  About 3 h on 2 cores (two jobs at a time would
# halve it; the stages here run one after another).
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/rank}
SWAP=2502                       # the joint stage's step where tower-rank3 replaces tower-rank2
JOINT_END=${JOINT_END:-2683}
PY=/usr/bin/python3
R=scripts/ref
mkdir -p "$RUN"
S="scene_caption,scene_count,scene_caption,scene_left"
W=scene_caption=3,scene_count=2.5,scene_left=1.5,text=1.5,receipt_total=0.2,receipt_read=0.1,receipt_items=0.1,screenshot_read=0.1
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

RECIPE=recipe-rank
. $R/recipe-lib.sh

# the starts: the shipped checkpoint, and the shipped language model with the
# rank tower, both carrying the rank tower's rank rows (its digit embeddings
# of step 1964), so the two halves speak one code
if [ ! -e "$RUN/g0.pt" ]; then
	$PY $R/graft.py --text runs/column/ckpt-0002320.pt --tower runs/rank/tower-rank.pt --out "$RUN/g0.pt"
	$PY - "$RUN" <<'EOF'
import sys
sys.path.insert(0, 'scripts/ref')
import compact
run = sys.argv[1]
extra = compact.load('runs/rank/tower-rank.pt')['scene_extra']
for src, out in (('runs/column/ckpt-0002320.pt', 'lm-start.pt'), (run + '/g0.pt', 'g0.pt')):
    d = compact.load(src)
    d['scene_extra'] = extra
    compact.save(d, f'{run}/{out}')
EOF
fi
stage "$RUN/lm-rank.pt" $PY $R/oracle_read.py --ckpt "$RUN/lm-start.pt" --feats words --extra rank --tasks $S \
	--lr 5e-4 --samples 4000 --every 50 --save "$RUN/lm-rank.pt"
# the rank tower goes on in two legs (session 14 stopped the first one to try
# it; the second starts with fresh Adam moments, as it did)
stage "$RUN/tower-rank2.pt" $PY $R/tower_code.py --ckpt "$RUN/g0.pt" --extra rank --ce 1 --first 76000000 \
	--samples 5584 --every 100 --save "$RUN/tower-rank2.pt"
stage "$RUN/tower-rank3.pt" $PY $R/tower_code.py --ckpt "$RUN/tower-rank2.pt" --extra rank --ce 1 --first 76005584 \
	--samples 8704 --every 100 --save "$RUN/tower-rank3.pt"
stage "$RUN/g.pt" $PY $R/graft.py --text "$RUN/lm-rank.pt" --tower "$RUN/tower-rank2.pt" --out "$RUN/g.pt"

# the longer-taught tower replaces the first at $SWAP (captions on its rows at step 2502: 0.69 -> 0.77)
joint_swap "$RUN/g.pt" 2320 "$SWAP" "$RUN/tower-rank3.pt" "$JOINT_END"
echo "recipe-rank: done; export with: $PY $R/export.py --ckpt $RUN/joint.pt --out-dir examples/models"

#!/bin/sh
# Session 13's scene stages, from session 11's shipped checkpoint (runs/code) to
# the column-coded model, in the foreground (about 1.5 h on 2 cores; each stage
# is skipped when its output exists, so run it again to go on).
#
#     RUN=/root/mcv-runs/column sh scripts/ref/recipe-column.sh
#
# Why (examples/models/README.md, session 13): given session 11's exact scene
# code the language model captions no better than from the tower (0.48 of test
# captions at 16x): it skips and repeats shapes when it looks for the next one
# to the right by position.  A shape's token that also names its patch column
# (scene_code.extra_table 'column') lets it look the next one up by content;
# the tower learns to write the column alone (tower_code.py --extra column),
# then the two go together with the tower frozen.
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/column}
JOINT_END=${JOINT_END:-2320}
PY=/usr/bin/python3
R=scripts/ref
mkdir -p "$RUN"
S="scene_caption,scene_count,scene_caption,scene_left"
W=scene_caption=3,scene_count=2.5,scene_left=1.5,text=1.5,receipt_total=0.2,receipt_read=0.1,receipt_items=0.1,screenshot_read=0.1

RECIPE=recipe-column
. $R/recipe-lib.sh

# session 11's shipped checkpoint with the scene code its tower was taught (the
# step-1368 files' word embeddings x 8, as recipe-code.sh builds it)
if [ ! -e "$RUN/start.pt" ]; then
	git show f70cc33:examples/models/proving-text.gguf > "$RUN/base-text.gguf"
	git show f70cc33:examples/models/proving-mmproj.gguf > "$RUN/base-mmproj.gguf"
	$PY $R/from_gguf.py "$RUN/base-text.gguf" "$RUN/base-mmproj.gguf" "$RUN/base.pt" --step 1368 --sample 20800
	$PY - "$RUN" <<'EOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import bpe, compact, scene_code
from model import MiniCPMV
run = sys.argv[1]
b = compact.load(run + '/base.pt')
m = MiniCPMV.from_config(b['config'])
m.load_state_dict(b['model'])
d = compact.load('runs/code/ckpt-0001964.pt')
d['scene_code'] = scene_code.word_table(m, bpe.default(), 8.0)
compact.save(d, run + '/start.pt')
EOF
fi
stage "$RUN/lm-col.pt" $PY $R/oracle_read.py --ckpt "$RUN/start.pt" --feats words --extra column --tasks $S \
	--lr 5e-4 --samples 4000 --every 50 --save "$RUN/lm-col.pt"
stage "$RUN/tower-col.pt" $PY $R/tower_code.py --ckpt "$RUN/start.pt" --extra column --ce 1 --first 73000000 \
	--samples 31968 --save "$RUN/tower-col.pt"
stage "$RUN/g.pt" $PY $R/graft.py --text "$RUN/lm-col.pt" --tower "$RUN/tower-col.pt" --out "$RUN/g.pt"
# every task, the tower frozen, from step 1964 to JOINT_END
if [ ! -e "$RUN/joint.pt" ]; then
	mkdir -p "$RUN/joint"
	[ -n "$(ls "$RUN"/joint/ckpt-*.pt 2>/dev/null)" ] || cp "$RUN/g.pt" "$RUN/joint/ckpt-0001964.pt"
	now=$(newest_step "$RUN/joint")
	$PY $R/train.py --out "$RUN/joint" --lr 5e-4 --steps 30000 --vision-lr-mult 0 --threads 1 --ckpt-min 10 \
		--task-weights $W --val-every 100000 --max-steps-this-run $((JOINT_END - now))
	cp "$(newest "$RUN/joint")" "$RUN/joint.pt"
fi
echo "recipe-column: done; export with: $PY $R/export.py --ckpt $RUN/joint.pt --out-dir examples/models"

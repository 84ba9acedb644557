#!/bin/sh
# Session 11's scene stages, from the step-1368 files to the shipped ones, in
# the foreground (about 2.5 h on 2 cores; each stage is skipped when its
# output exists, so run it again to go on).
#
#     RUN=/root/mcv-runs/code sh scripts/ref/recipe-code.sh
#
# Why (examples/models/README.md, session 11): the language model reads a
# fixed code at each shape's token (scene_code.py: its own embeddings of the
# size, colour and shape words, times 8), and the tower learns to write it
# without the language model in the loop (tower_code.py), so neither half
# waits on the other; then the language model reads the tower's real rows
# (oracle_read.py --feats frozen), and a joint stage with every task (tower
# frozen) gives back the text turns the scene-only stages made it forget.
# Stages stop at the sample counts the session's runs reached.
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/code}
PY=/usr/bin/python3
R=scripts/ref
mkdir -p "$RUN"
S="scene_caption,scene_count,scene_left"
W=scene_caption=2,scene_count=1.5,scene_left=1,text=1.5,receipt_total=0.5,receipt_read=0.3,receipt_items=0.3,screenshot_read=0.3

RECIPE=recipe-code
. $R/recipe-lib.sh

# the shipped files of commit f70cc33 (step 1368 of scripts/ref/recipe.sh)
if [ ! -e "$RUN/base.pt" ]; then
	git show f70cc33:examples/models/proving-text.gguf > "$RUN/base-text.gguf"
	git show f70cc33:examples/models/proving-mmproj.gguf > "$RUN/base-mmproj.gguf"
	$PY $R/from_gguf.py "$RUN/base-text.gguf" "$RUN/base-mmproj.gguf" "$RUN/base.pt" --step 1368 --sample 20800
fi
stage "$RUN/lm1.pt" $PY $R/oracle_read.py --ckpt "$RUN/base.pt" --feats words --scale 8 --tasks $S \
	--lr 1e-3 --rope-base 200 --samples 6040 --every 50 --save "$RUN/lm1.pt"
stage "$RUN/lm2.pt" $PY $R/oracle_read.py --ckpt "$RUN/lm1.pt" --feats words \
	--tasks scene_count,scene_caption,scene_count,scene_left --lr 5e-4 --samples 5480 --every 50 --save "$RUN/lm2.pt"
stage "$RUN/tower1.pt" $PY $R/tower_code.py --ckpt "$RUN/base.pt" --reinit-vision 7 --ce 1 --ce-temp 1 \
	--samples 18608 --save "$RUN/tower1.pt"
stage "$RUN/tower2.pt" $PY $R/tower_code.py --ckpt "$RUN/tower1.pt" --ce 1 --first 71000000 \
	--samples 44528 --save "$RUN/tower2.pt"
stage "$RUN/g1.pt" $PY $R/graft.py --text "$RUN/lm2.pt" --tower "$RUN/tower1.pt" --scale 8 --out "$RUN/g1.pt"
stage "$RUN/lm3.pt" $PY $R/oracle_read.py --ckpt "$RUN/g1.pt" --feats frozen --tasks $S --lr 5e-4 \
	--samples 5744 --every 50 --save "$RUN/lm3.pt"
# every task, the tower frozen (its rate 0): from lm3 at step 1368 to 1649 with
# tower1, then tower2 grafted in (as the session did when tower2 was done)
joint() {    # joint DIR END_STEP
	$PY $R/train.py --out "$1" --lr 5e-4 --steps 30000 --vision-lr-mult 0 --threads 1 \
		--task-weights $W --val-every 100000 --max-steps-this-run $(($2 - $(newest_step "$1")))
}
if [ ! -e "$RUN/joint1.pt" ]; then
	mkdir -p "$RUN/joint1"
	[ -n "$(ls "$RUN"/joint1/ckpt-*.pt 2>/dev/null)" ] || cp "$RUN/lm3.pt" "$RUN/joint1/ckpt-0001368.pt"
	joint "$RUN/joint1" 1649
	cp "$(newest "$RUN/joint1")" "$RUN/joint1.pt"
fi
if [ ! -e "$RUN/joint2.pt" ]; then
	mkdir -p "$RUN/joint2"
	[ -n "$(ls "$RUN"/joint2/ckpt-*.pt 2>/dev/null)" ] ||
		$PY $R/graft.py --text "$RUN/joint1.pt" --tower "$RUN/tower2.pt" --scale 8 --out "$RUN/joint2/ckpt-$(printf %07d "$(newest_step "$RUN/joint1")").pt"
	joint "$RUN/joint2" 1964
	cp "$(newest "$RUN/joint2")" "$RUN/joint2.pt"
fi
echo "recipe-code: done; export with: $PY $R/export.py --ckpt $RUN/joint2.pt --out-dir examples/models"

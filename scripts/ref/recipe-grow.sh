#!/bin/sh
# Session 19's stages, from session 18's shipped checkpoint (runs/tower9, step
# 3878) to a tower grown by one layer that writes shape counts, in the
# foreground (each stage is skipped when its output exists, so run it again
# to go on).
#
#     RUN=/root/mcv-runs/grow sh scripts/ref/recipe-grow.sh
#
# Why (examples/models/README.md, session 19): the tower did not write how
# many shapes share a shape (nshape ~0.69, what "no other" scores) through
# 76,000 samples, though shape identity reads out linearly (0.94-0.99) from
# layer 2 on (layer_probe.py); one fresh attention layer on the last layer's
# rows learned it (0.85).  So the tower gets a seventh layer, the identity at
# first, and only it and the projector train (two legs of 16,000 samples,
# nshape's CE weighed 3): val line nshape 16x 0.71 -> 0.86 -> 0.94.
# The tower only: session 19's joint stage of 150 steps on the first leg's
# tower did not teach the language model to read the count (val counts
# 0.86-0.8925 against 0.8875), so the files shipped are still runs/tower9's.
# About 1.2 h on this box.
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/grow}
START=runs/tower9/ckpt-0003878.pt
PY=/usr/bin/python3
R=scripts/ref
X=rank+ncolour+nshape
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$RUN"

RECIPE=recipe-grow
. $R/recipe-lib.sh

# session 19 ran the first leg on 2 threads (GROW_THREADS=1 beside another job:
# two threads on a shared core run far slower than one)
stage "$RUN/grown.pt" $PY $R/tower_code.py --ckpt $START --extra $X --ce 1 --extra-weight nshape=3 \
	--grow 1 --freeze-below 6 --first 76133000 --samples 16000 --lr 1e-3 --every 50 --threads ${GROW_THREADS:-2} \
	--save "$RUN/grown.pt"
stage "$RUN/grown2.pt" $PY $R/tower_code.py --ckpt "$RUN/grown.pt" --extra $X --ce 1 --extra-weight nshape=3 \
	--freeze-below 6 --first 76149000 --samples 16000 --lr 7e-4 --every 50 --threads 1 \
	--save "$RUN/grown2.pt"
echo "recipe-grow: done; graft with: $PY $R/graft.py --text <LM checkpoint> --tower $RUN/grown2.pt --out G.pt"

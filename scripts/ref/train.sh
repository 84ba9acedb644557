#!/bin/sh
# Resume (or start) the proving-model training run in the background.
#
#     sh scripts/ref/train.sh            # resume the newest checkpoint in $RUN
#     RUN=/root/mcv-runs/x sh scripts/ref/train.sh
#
# Background jobs die with the session, so every working session starts this once;
# train.py picks the newest $RUN/ckpt-*.pt, checkpoints every 10 minutes (keeps 2)
# and logs to $RUN/train.log. Extra arguments go to train.py.
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/proving}
mkdir -p "$RUN"
if [ -f "$RUN/pid" ] && pid=$(cat "$RUN/pid") && [ -n "$pid" ] &&
	tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q 'train\.py'; then
	echo "already running: pid $pid ($RUN/train.log)"
	exit 0
fi
# PASSIVE: idle OpenMP threads sleep instead of spinning (spinning threads on a shared
# 2-core box were ~10x slower); train.py uses 1 thread while the load average says the
# cores are busy and 2 when they are free.
# jemalloc (Debian libjemalloc2, optional): glibc malloc handed torch's large
# temporaries back to the kernel and faulted them in again every step; on a
# busy box half of the trainer's CPU time was system time.
JE=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
[ -f "$JE" ] && export LD_PRELOAD="$JE"
# ...and jemalloc's own decay still handed freed pages back within seconds: every
# large temporary of a step (13 MB expert-slot copies, activations) was faulted in
# again, 7 ms per 13 MB instead of 0.5 ms.  Never purging keeps the heap at the
# step's peak (what it reaches each step anyway): ~1.25x the steps/s by itself.
export MALLOC_CONF=${MALLOC_CONF:-dirty_decay_ms:-1,muzzy_decay_ms:-1}
# OpenBLAS's own worker threads wait with sched_yield(): with other jobs on the
# box they burned the trainer's core in ~20k yields a second (0.02 steps/s
# instead of 0.22).  One BLAS thread; set OPENBLAS_NUM_THREADS=2 on a free box.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
set -- --out "$RUN" --lr 1.5e-3 --warmup 200 --steps 20000 --val-every 250 --log-every 10 \
	--pool 128 "$@"
export OMP_WAIT_POLICY=PASSIVE
if [ "${MCV_TRAIN_FG:-0}" = 1 ]; then
	# in the foreground, for scripts/ref/recipe.sh's stages
	echo $$ >"$RUN/pid"
	exec nice -n 5 /usr/bin/python3 scripts/ref/train.py "$@"
fi
nohup nice -n 5 /usr/bin/python3 scripts/ref/train.py "$@" >>"$RUN/nohup.out" 2>&1 &
echo $! >"$RUN/pid"
echo "started pid $! -> $RUN/train.log"

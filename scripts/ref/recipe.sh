#!/bin/sh
# The proving model's training from step 0, every stage of the run behind the
# shipped files, in the foreground (days on 2 cores; resumable: run it again
# and it skips the stages its checkpoints have passed).
#
#     RUN=/root/mcv-runs/again nohup sh scripts/ref/recipe.sh > again.log 2>&1 &
#     sh scripts/ref/recipe.sh --list        # the stages, without training
#
# The run was steered by hand (examples/models/README.md, "Training status"):
# each stage below is one stretch of it with the arguments it had, ending at
# the step where the next one began.  Steps are approximate stage ends: a
# stage stops at the first step >= its end and the next resumes at the next
# pool of samples, as the hand-steered run did.  Code changes between stages
# that kept the math (speed-ups, the fast path) are not replayed; data changes
# are (--snippet-large 0: the snippets of before large print).
set -eu
cd "$(dirname "$0")/../.."
RUN=${RUN:-/root/mcv-runs/recipe}
W1=scene_caption=3,scene_count=2,scene_left=2,text=2,receipt_total=1,receipt_read=0.5,receipt_items=0.25,screenshot_read=0.5
W2=scene_caption=2,scene_count=1,scene_left=1,text=1,receipt_total=2,receipt_read=1,receipt_items=1,screenshot_read=1
W3=scene_caption=2,scene_count=1.5,scene_left=1,receipt_total=1,receipt_read=1,receipt_items=0.5,screenshot_read=1,text=1
W4=snippet_read=3,scene_caption=2,scene_count=1.5,scene_left=1,receipt_total=1,receipt_read=1,receipt_items=0.5,screenshot_read=1,text=0.7
W5=snippet_read=6,scene_caption=2,scene_count=1.5,scene_left=1,receipt_total=0.7,receipt_read=0.5,receipt_items=0.4,screenshot_read=0.5,text=0.5
W6=word_read=4,snippet_read=4,scene_caption=2,scene_count=1.5,scene_left=1,receipt_total=0.7,receipt_read=0.5,receipt_items=0.4,screenshot_read=0.5,text=0.5
W7=word_read=3,snippet_read=3,scene_caption=4,scene_count=3,scene_left=2,receipt_total=0.7,receipt_read=0.5,receipt_items=0.4,screenshot_read=0.5,text=0.5
P="--probe 0.3 --val-every 200"
V="--vision-lr-mult 0.25 --steps 12000"
# end step | train.py arguments (after train.sh's defaults: --lr 1.5e-3 --warmup 200 --steps 20000 --pool 128);
# "vision" | train_vision.py arguments: a tower-only stage at the step the previous stage ended
STAGES="
220|--pool 48
372|
553|--steps 2200
1511|--steps 1650 --task-weights $W1
2442|--lr 8e-4 --steps 2700 --task-weights $W2
2648|--lr 1.3e-3 --steps 4000 $P --probe-lr 1 --task-weights $W3
3043|--lr 1.3e-3 --steps 4000 $P --task-weights $W3
3763|--lr 1.3e-3 --steps 4000 $P --reinit-vision 7 --task-weights $W3
3815|--lr 4e-4 --steps 12000 $P --task-weights $W3
4173|--lr 1.25e-3 $V $P --task-weights $W3
4427|--lr 1.25e-3 $V $P --snippet-large 0 --task-weights $W4
5395|--lr 1.25e-3 $V $P --probe-sub 0.3 --snippet-large 0 --task-weights $W4
5812|--lr 1.25e-3 $V $P --probe-sub 0.6 --task-weights $W5
5976|--lr 1.25e-3 --vision-lr-mult 0.5 --steps 12000 $P --probe-sub 0.6 --task-weights $W5
vision|--samples 8880 --lr 1e-3 --sub 1.0
7404|--lr 1.25e-3 --vision-lr-mult 0.5 --steps 12000 $P --probe-sub 0.6 --rope-base 200 --task-weights $W5
7601|--lr 1.25e-3 --vision-lr-mult 1.0 --steps 16000 $P --probe-sub 0.6 --dense 16 --task-weights $W5
7871|--lr 1.25e-3 --vision-lr-mult 1.0 --steps 16000 $P --probe-sub 0.6 --dense 16 --dense-weight 4 --task-weights $W5
vision|--samples 2228 --batch 4 --dense 16 --lr 1e-3 --sub 1.0 --mix scene_caption=2,scene_count=1,scene_left=1,snippet_read=2
8540|--lr 1.25e-3 --vision-lr-mult 1.0 --steps 16000 $P --probe-sub 0.6 --dense 16 --dense-weight 4 --task-weights $W5
9560|--lr 1.25e-3 --vision-lr-mult 1.0 --steps 16000 $P --probe-sub 0.6 --dense 16 --dense-weight 4 --task-weights $W6
9765|--lr 1.25e-3 --vision-lr-mult 1.0 --steps 16000 $P --probe-sub 0.6 --shape 1 --dense 16 --dense-weight 4 --task-weights $W6
16000|--lr 1.25e-3 --vision-lr-mult 1.0 --steps 16000 $P --probe-sub 0.6 --shape 1 --dense 16 --dense-weight 4 --task-weights $W7
"

step_now() {
	c=$(ls "$RUN"/ckpt-*.pt 2>/dev/null | sort | tail -1)
	if [ -z "$c" ]; then echo 0; else basename "$c" .pt | sed 's/^ckpt-0*//; s/^$/0/'; fi
}

vision_stages_at() {
	/usr/bin/python3 -c 'import glob, sys, torch
d = torch.load(sorted(glob.glob(sys.argv[1] + "/ckpt-*.pt"))[-1], map_location="cpu")
print(sum(s["at_step"] == int(sys.argv[2]) for s in d["state"].get("vision_stages", [])))' "$RUN" "$1"
}

echo "$STAGES" | while IFS='|' read -r end args; do
	[ -n "$end" ] || continue
	if [ "${1:-}" = --list ]; then
		if [ "$end" = vision ]; then echo "tower-only stage: $args"; else echo "to step $end: $args"; fi
		continue
	fi
	now=$(step_now)
	if [ "$end" = vision ]; then
		# done when the newest checkpoint records a tower-only stage at this step
		[ "$(vision_stages_at "$now")" -eq 0 ] || continue
		echo "recipe: tower-only stage at step $now: $args"
		# shellcheck disable=SC2086
		/usr/bin/python3 scripts/ref/train_vision.py --run "$RUN" $args
		continue
	fi
	[ "$now" -lt "$end" ] || continue
	echo "recipe: steps $now -> $end: $args"
	# shellcheck disable=SC2086  # the stage's arguments are words
	MCV_TRAIN_FG=1 RUN="$RUN" sh scripts/ref/train.sh --threads auto $args \
		--max-steps-this-run $((end - now)) </dev/null
	[ "$(step_now)" -ge "$end" ] || { echo "recipe: stage to step $end stopped at $(step_now)" >&2; exit 1; }
done

# Shared by the scripts/ref/recipe-*.sh stage scripts: sourced after they cd to
# the repository root, with RECIPE set to the script's name for its messages.

stage() {    # stage OUT COMMAND...: run COMMAND unless OUT exists
	out=$1; shift
	if [ -e "$out" ]; then echo "$RECIPE: $out exists, skipped"; return; fi
	echo "$RECIPE: $*"
	"$@"
}

newest() {    # newest DIR: its newest ckpt-NNNNNNN.pt
	ls "$1"/ckpt-*.pt | sort | tail -1
}

newest_step() {    # newest_step DIR: that checkpoint's step
	basename "$(newest "$1")" .pt | sed 's/^ckpt-0*//'
}

joint() {    # joint END [train.py options]: every task ($W), the tower frozen (unless the options
	# give --vision-lr-mult: train.py takes the last one given), the routing spread (--aux,
	# --aux-floor), up to step END (rate $JOINT_LR, 5e-4 unless set; in $JOINT_DIR, $RUN/joint unless set)
	dir=${JOINT_DIR:-$RUN/joint} end=$1
	shift
	now=$(newest_step "$dir")
	[ "$now" -lt "$end" ] || return 0
	$PY $R/train.py --out "$dir" --lr "${JOINT_LR:-5e-4}" --steps 30000 --vision-lr-mult 0 --threads 1 --ckpt-min 5 \
		--aux 0.05 --aux-floor 0.1 --log-every 10 --task-weights $W --val-every 100000 \
		--max-steps-this-run $((end - now)) "$@"
}

joint_start() {    # joint_start START.pt STEP: the joint stage's first checkpoint ($JOINT_DIR, as for joint), unless it has one
	dir=${JOINT_DIR:-$RUN/joint}
	mkdir -p "$dir"
	[ -n "$(ls "$dir"/ckpt-*.pt 2>/dev/null)" ] || cp "$1" "$dir/ckpt-$(printf %07d "$2").pt"
}

swap_in() {    # swap_in TOWER.pt MARK: TOWER.pt's tower takes the place of the newest joint
	# checkpoint's, once (MARK records that it did)
	[ ! -e "$2" ] || return 0
	c=$(newest "$RUN/joint")
	$PY $R/graft.py --text "$c" --tower "$1" --out "$RUN/swap.pt"
	mv "$RUN/swap.pt" "$c"
	touch "$2"
}

joint_swap() {    # joint_swap START.pt START_STEP SWAP TOWER.pt END: the joint stage from START (as step
	# START_STEP) to SWAP, where TOWER.pt's tower takes the old one's place, then on to END;
	# $RUN/joint.pt at the end
	[ ! -e "$RUN/joint.pt" ] || return 0
	joint_start "$1" "$2"
	joint "$3"
	swap_in "$4" "$RUN/swapped"
	joint "$5"
	cp "$(newest "$RUN/joint")" "$RUN/joint.pt"
}

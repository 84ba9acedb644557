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

# Shared by the tool contract tests (bats `load expect`).
#
# expect STATUS CMD...: CMD exits with STATUS and prints exactly one line on
# stderr, starting with "$EXPECT_TOOL: " (the tool's name, set by the .bats
# file).  stdout and stderr are left in $T/out and $T/err for further checks.
expect() {
	local want=$1 rc
	shift
	"$@" >"$T/out" 2>"$T/err" && rc=0 || rc=$?
	if [ "$rc" -ne "$want" ]; then
		echo "exit $rc, expected $want: $*"; cat "$T/err"; return 1
	fi
	if [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -q "^$EXPECT_TOOL: " "$T/err"; then
		echo "stderr is not one '$EXPECT_TOOL: ' line:"; cat "$T/err"; return 1
	fi
}

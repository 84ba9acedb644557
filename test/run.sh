#!/bin/sh
# Runs every test `make check` knows about and prints one closing line:
#   check: N passed, N failed, N skipped
# Unit tests exit 0 (pass), 77 (skip, with the reason on stderr) or other (fail).
# bats files are run in TAP mode and counted per test. Man pages are linted.
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}
pass=0 fail=0 skip=0 failed=""
note() { printf '%s\n' "$*"; }

for t in $B/test/test_*; do
	[ -x "$t" ] || continue
	out=$("$t" 2>&1); rc=$?
	n=$(basename "$t")
	if [ $rc = 0 ]; then pass=$((pass+1)); note "ok   unit $n"
	elif [ $rc = 77 ]; then skip=$((skip+1)); note "skip unit $n: $(printf '%s' "$out" | tail -n 1)"
	else fail=$((fail+1)); failed="$failed unit:$n"; note "FAIL unit $n"; printf '%s\n' "$out" | tail -n 30 | sed 's/^/    /'; fi
done

for n in $SAN_TESTS; do
	t=$B/test-san/$n
	[ -x "$t" ] || continue
	out=$(ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "$t" 2>&1); rc=$?
	if [ $rc = 0 ]; then pass=$((pass+1)); note "ok   asan+ubsan $n"
	elif [ $rc = 77 ]; then skip=$((skip+1)); note "skip asan+ubsan $n"
	else fail=$((fail+1)); failed="$failed asan:$n"; note "FAIL asan+ubsan $n"; printf '%s\n' "$out" | tail -n 30 | sed 's/^/    /'; fi
done

for m in man/*.[17]; do
	[ -f "$m" ] || continue
	out=$(groff -mdoc -ww -z "$m" 2>&1)
	if [ -z "$out" ]; then pass=$((pass+1)); note "ok   man $m"
	else fail=$((fail+1)); failed="$failed man:$m"; note "FAIL man $m"; printf '%s\n' "$out" | sed 's/^/    /'; fi
done

for b in test/*.bats; do
	[ -f "$b" ] || continue
	tap=$(bats --tap "$b" 2>&1)
	printf '%s\n' "$tap" | grep -E '^(not )?ok ' | sed "s|^|  $(basename "$b"): |"
	p=$(printf '%s\n' "$tap" | grep -E '^ok ' | grep -vc '# skip')
	s=$(printf '%s\n' "$tap" | grep -E '^ok ' | grep -c '# skip')
	f=$(printf '%s\n' "$tap" | grep -cE '^not ok ')
	if [ "$p$s$f" = "000" ]; then f=1; printf '%s\n' "$tap" | tail -n 20 | sed 's/^/    /'; fi
	pass=$((pass+p)) skip=$((skip+s)) fail=$((fail+f))
	[ "$f" -gt 0 ] && failed="$failed bats:$b"
	[ "$f" -gt 0 ] && printf '%s\n' "$tap" | grep -A15 -E '^not ok ' | head -n 60 | sed 's/^/    /'
done

[ -n "$failed" ] && note "failed:$failed"
note "check: $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]

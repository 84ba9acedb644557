# Shared by bench-les.sh and bench-replay.sh (sourced, not run): a memory
# cgroup (v1) that bounds a run the way a small device would, with the page
# cache dropped before each run, and the disk's direct-read bandwidth.
#
#   cg_open TOOL NAME SIZE   needs root; creates /sys/fs/cgroup/memory/NAME
#                            limited to SIZE (K/M/G suffixes) and a scratch
#                            folder $tmp, both removed on exit
#   run_cg OUT ERR CMD...    runs CMD in the cgroup (nice 15, /usr/bin/time);
#                            OUT.cg gets "rc peak_bytes oom_kills major_faults"
#   read_bw FILE             sets bw_mib (2 MiB O_DIRECT reads of FILE, cold)
#                            and ra (the device's readahead, KiB)

cg_open() {
	tool=$1
	[ "$(id -u)" = 0 ] || { echo "$tool: needs root (memory cgroup, drop_caches)" >&2; exit 1; }
	cg_root=/sys/fs/cgroup/memory
	[ -d "$cg_root" ] || { echo "$tool: no cgroup v1 memory controller at $cg_root" >&2; exit 1; }
	limit=$(/usr/bin/python3 -c "
import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))" "$3")
	cg=$cg_root/$2
	tmp=$(mktemp -d)
	trap cg_cleanup EXIT INT TERM
	mkdir -p "$cg"
	echo "$limit" > "$cg/memory.limit_in_bytes"
}

cg_cleanup() {
	rm -rf "$tmp"
	[ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
}

run_cg() {
	out=$1 err=$2
	shift 2
	sync
	echo 3 > /proc/sys/vm/drop_caches
	echo 0 > "$cg/memory.max_usage_in_bytes" 2>/dev/null || true
	oom0=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control" 2>/dev/null || echo 0)
	maj0=$(sed -n 's/^total_pgmajfault //p' "$cg/memory.stat" 2>/dev/null || echo 0)
	rc=0
	sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
		nice -n 15 /usr/bin/time -f "maxrss_kb %M" "$@" >"$out" 2>"$err" || rc=$?
	oom1=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control" 2>/dev/null || echo 0)
	maj1=$(sed -n 's/^total_pgmajfault //p' "$cg/memory.stat" 2>/dev/null || echo 0)
	peak=$(cat "$cg/memory.max_usage_in_bytes")
	echo "$rc $peak $((oom1 - oom0)) $((maj1 - maj0))" > "$out.cg"
}

read_bw() {
	sync; echo 3 > /proc/sys/vm/drop_caches
	bw=$(dd if="$1" of=/dev/null bs=2M count=128 skip=2000 iflag=direct 2>&1 |
		sed -n 's/.* copied, \([0-9.]*\) s, .*/\1/p')
	bw_mib=$(/usr/bin/python3 -c "print(f'{256 / float(\"$bw\"):.1f}')")
	ra=$(cat /sys/block/"$(basename "$(df --output=source "$1" | tail -n 1)")"/queue/read_ahead_kb 2>/dev/null || echo '?')
}

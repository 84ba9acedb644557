# Shared by bench-les.sh and bench-replay.sh (sourced, not run): a memory
# cgroup (v1) that bounds a run the way a small device would, with the page
# cache dropped before each run, the disk's direct-read bandwidth, and the
# disk's readahead (set for a run, always put back).
#
#   cg_open TOOL NAME SIZE   needs root; creates /sys/fs/cgroup/memory/NAME
#                            limited to SIZE (K/M/G suffixes) and a scratch
#                            folder $tmp, both removed on exit; the readahead
#                            is restored on exit too
#   run_cg OUT ERR CMD...    runs CMD in the cgroup (/usr/bin/time; at nice
#                            $MCV_BENCH_NICE, default 0; 15 lets a shared
#                            box's other jobs go first, at the figures' cost);
#                            OUT.cg gets "rc peak_bytes oom_kills major_faults
#                            t_start t_end"; OUT.io gets "time sectors_read
#                            reads ms_reading ms_busy" samples of the disk's
#                            stat every 0.2 s during the run (ms_reading: the
#                            summed time of all reads, so its rate is the
#                            mean number of reads in flight; ms_busy: time
#                            with any request in flight)
#   read_bw FILE             sets bw_mib (MiB/s: the best of 1.69 MiB O_DIRECT
#                            reads at random offsets of FILE, 1, 2, 4 or 8 in
#                            flight, $bw_reads (160) reads each, or of the
#                            4-in-flight offsets read again), bw_all
#                            (each), bw_warm (the 4-in-flight reads once more:
#                            the host's cache), bw_seq (one stream of 2 MiB
#                            direct reads in order) and ra (the disk's
#                            readahead, KiB)
#   ra_dev FILE              sets ra_sys (the disk's read_ahead_kb file) and
#                            io_stat (its stat file)
#   ra_set KIB               sets the readahead (remembers the first value
#                            seen, which cg_cleanup puts back)
#   probe_reads FILE S R SPEC...  direct-read throughput in given patterns
#                            (below)
#   probe_row FILE plain|packed  sets probe_mib: MiB/s of $probe_s (3) s of
#                            direct reads as mcv-run reads experts of that
#                            layout: $probe_qd (2, mcv's reader threads for
#                            experts above 512 KiB) experts in flight, each
#                            one read of $expert_bytes (1769472, the 35B
#                            shape's) when packed, three reads of a third
#                            (the 4 KiB-aligned window around each slice,
#                            one page more) when plain

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
	ra_orig=
	sampler=
	# a signal must end the script (the EXIT trap then cleans up), not
	# just run the cleanup and carry on with the next run
	trap cg_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	trap 'exit 129' HUP
	mkdir -p "$cg"
	echo "$limit" > "$cg/memory.limit_in_bytes"
}

cg_cleanup() {
	# runs under the caller's set -e: one failing step (the sampler may
	# already be gone) must not skip putting the readahead back
	set +e
	if [ -n "$sampler" ]; then
		kill "$sampler" 2>/dev/null
	fi
	if [ -n "$ra_orig" ]; then
		echo "$ra_orig" > "$ra_sys" 2>/dev/null ||
			echo "cgroup.sh: could not restore the readahead of $ra_sys to $ra_orig KiB" >&2
	fi
	rm -rf "$tmp"
	if [ -d "$cg" ]; then
		# a run that outlives us (the script was sent a signal that its
		# child did not get) is ours: only our runs enter this cgroup
		for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do
			kill "$p" 2>/dev/null
		done
		# a process killed with us may still be leaving the cgroup
		i=0
		while ! rmdir "$cg" 2>/dev/null && [ $i -lt 20 ]; do
			sleep 0.5
			i=$((i + 1))
		done
		[ -d "$cg" ] && echo "cgroup.sh: could not remove $cg" >&2
	fi
	return 0
}

# The readahead that page faults on a mapped file use is the disk's
# (read_ahead_kb, the same value `blockdev --setra` sets in 512-byte sectors;
# blockdev may not open the device in a container, sysfs works).
ra_dev() {
	dev=$(basename "$(df --output=source "$1" | tail -n 1)")
	d=$(readlink -f "/sys/class/block/$dev")
	[ -f "$d/queue/read_ahead_kb" ] || d=$(dirname "$d")
	ra_sys=$d/queue/read_ahead_kb
	io_stat=$d/stat
	[ -f "$ra_sys" ] || { ra_sys=; io_stat=; }
}

ra_set() {
	[ -n "$ra_sys" ] || { echo "cgroup.sh: no readahead setting for this disk" >&2; return 1; }
	[ -n "$ra_orig" ] || ra_orig=$(cat "$ra_sys")
	echo "$1" > "$ra_sys"
	[ "$(cat "$ra_sys")" = "$1" ] || { echo "cgroup.sh: readahead $1 KiB not taken" >&2; return 1; }
}

run_cg() {
	out=$1 err=$2
	shift 2
	sync
	echo 3 > /proc/sys/vm/drop_caches
	echo 0 > "$cg/memory.max_usage_in_bytes" 2>/dev/null || true
	oom0=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control" 2>/dev/null || echo 0)
	maj0=$(sed -n 's/^total_pgmajfault //p' "$cg/memory.stat" 2>/dev/null || echo 0)
	: > "$out.io"
	if [ -n "${io_stat-}" ]; then
		(while :; do echo "$(date +%s.%N) $(awk '{print $3, $1, $4, $10}' "$io_stat")"; sleep 0.2; done) >"$out.io" &
		sampler=$!
	fi
	t0=$(date +%s.%N)
	rc=0
	sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
		nice -n "${MCV_BENCH_NICE:-0}" /usr/bin/time -f "maxrss_kb %M cpu_s %U %S" "$@" >"$out" 2>"$err" || rc=$?
	t1=$(date +%s.%N)
	if [ -n "$sampler" ]; then
		kill "$sampler" 2>/dev/null
		wait "$sampler" 2>/dev/null || true
		sampler=
		echo "$t1 $(awk '{print $3, $1, $4, $10}' "$io_stat")" >>"$out.io"
	fi
	oom1=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control" 2>/dev/null || echo 0)
	maj1=$(sed -n 's/^total_pgmajfault //p' "$cg/memory.stat" 2>/dev/null || echo 0)
	peak=$(cat "$cg/memory.max_usage_in_bytes")
	echo "$rc $peak $((oom1 - oom0)) $((maj1 - maj0)) $t0 $t1" > "$out.cg"
}

read_bw() {
	ra_dev "$1"
	sync; echo 3 > /proc/sys/vm/drop_caches
	bw=$(dd if="$1" of=/dev/null bs=2M count=128 skip=4096 iflag=direct 2>&1 |
		sed -n 's/.* copied, \([0-9.]*\) s, .*/\1/p')
	bw_seq=$(/usr/bin/python3 -c "print(f'{256 / float(\"$bw\"):.0f}')")
	sync; echo 3 > /proc/sys/vm/drop_caches
	# what the cache reads: one expert (gate+up+down of the 35B shape, 1.69
	# MiB) at a random 4 KiB-aligned offset, at 1, 2, 4 and 8 in flight
	bw_all=$(/usr/bin/python3 - "$1" 1769472 "${bw_reads:-160}" <<'EOF_BW'
import mmap, os, random, sys, threading, time
path, size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
span = (os.fstat(fd).st_size - size) // 4096
res = []
# fresh offsets every time: the disk of this VM is a file on the host,
# whose page cache serves data read recently at ~3x the cold speed
rnd = random.Random()
for qd in (1, 2, 4, 8):
    offs = [rnd.randrange(span) * 4096 for _ in range(n)]
    if qd == 4:
        keep = list(offs)
    lock = threading.Lock()
    def work():
        buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
        while True:
            with lock:
                if not offs:
                    return
                o = offs.pop()
            got = 0
            while got < size:
                r = os.preadv(fd, [memoryview(buf)[got:]], o + got)
                if r <= 0:
                    raise SystemExit("short read")
                got += r
    t0 = time.time()
    th = [threading.Thread(target=work) for _ in range(qd)]
    for t in th: t.start()
    for t in th: t.join()
    res.append(f"{qd}: {n * size / 2**20 / (time.time() - t0):.0f}")
print(", ".join(res))
# the same offsets once more, 4 in flight: now from the host's page cache
offs = keep
t0 = time.time()
th = [threading.Thread(target=work) for _ in range(4)]
for t in th: t.start()
for t in th: t.join()
print(f"{n * size / 2**20 / (time.time() - t0):.0f}")
EOF_BW
)
	bw_warm=$(echo "$bw_all" | tail -n 1)
	bw_all=$(echo "$bw_all" | head -n 1)
	bw_mib=$( (echo "$bw_all" | tr , '\n' | sed 's/.*: //'; echo "$bw_warm") | sort -n | tail -n 1)
	bw_all="$bw_all, again at 4: $bw_warm"
	ra=$(cat "$ra_sys" 2>/dev/null || echo '?')
}

# probe_reads FILE SECONDS ROUNDS SPEC...: direct-read throughput of FILE in
# the access pattern of the expert cache.  A SPEC is NAME:PIECE:PIECES:QD:
# QD workers each read "experts" of PIECES reads of PIECE bytes at fresh
# random 4 KiB-aligned offsets, one after the other (mcv's reader threads
# read a plain file's gate, up and down slices of an expert in turn, a
# packed file's expert in one read), so QD reads are in flight at any time.
# Each SPEC runs SECONDS per round; the specs alternate within a round so
# the disk's drift hits them alike.  Prints one line per (round, spec):
# "NAME QD PIECE PIECES MIB_PER_S EXPERTS_PER_S MS_PER_EXPERT".  Fresh
# offsets every time: this VM's disk is a file on the host, whose page
# cache serves recently read data at up to ~3x the cold speed.
probe_reads() {
	/usr/bin/python3 - "$@" <<'EOF_PR'
import mmap, os, random, sys, threading, time
path, secs, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
specs = []
for s in sys.argv[4:]:
    name, piece, pieces, qd = s.split(":")
    specs.append((name, int(piece), int(pieces), int(qd)))
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
size = os.fstat(fd).st_size
rnd = random.Random()

def run(piece, pieces, qd):
    span = (size - piece) // 4096
    stop = time.monotonic() + secs
    done = [0] * qd
    def work(i):
        buf = mmap.mmap(-1, piece)  # page-aligned, as O_DIRECT wants
        mv = memoryview(buf)
        r = random.Random(rnd.random())
        while time.monotonic() < stop:
            for _ in range(pieces):
                o, got = r.randrange(span) * 4096, 0
                while got < piece:
                    n = os.preadv(fd, [mv[got:]], o + got)
                    if n <= 0:
                        raise SystemExit("probe_reads: short read")
                    got += n
            done[i] += 1
    t0 = time.monotonic()
    th = [threading.Thread(target=work, args=(i,)) for i in range(qd)]
    for t in th: t.start()
    for t in th: t.join()
    dt = time.monotonic() - t0
    n = sum(done)
    return n * pieces * piece / 2**20 / dt, n / dt

for _ in range(rounds):
    for name, piece, pieces, qd in specs:
        mib, eps = run(piece, pieces, qd)
        print(f"{name} {qd} {piece} {pieces} {mib:.1f} {eps:.1f} {1000 / eps if eps else 0:.2f}", flush=True)
EOF_PR
}

probe_row() {
	eb=${expert_bytes:-1769472}
	case $2 in
	packed) spec=packed:$(( (eb + 4095) / 4096 * 4096 )):1:${probe_qd:-2};;
	*) spec=plain:$(( (eb / 3 + 4095) / 4096 * 4096 + 4096 )):3:${probe_qd:-2};;
	esac
	probe_mib=$(probe_reads "$1" "${probe_s:-3}" 1 "$spec" | awk '{print $5}')
	[ -n "$probe_mib" ] || { echo "cgroup.sh: read probe of $1 failed" >&2; return 1; }
}

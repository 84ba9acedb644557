#!/bin/sh
# LES on the proving model (real routing): decode tokens/s fully resident,
# and under budgets holding about 50% and 15% of the experts with on-demand
# reads (--lookahead 0), router prediction (lookahead 1, 2) and, with
# --predictor FILE, a trained predictor; hit rate, recall and MiB read per
# token from --stats, the speed-up over on-demand at the same budget, and
# the bound the disk sets (measured read bandwidth / MiB read per token).
#
#   scripts/bench/bench-les-proving.sh [-t THREADS] [-n TOKENS] [-r ROUNDS]
#       [--predictor FILE] [--packed] [--device] [--budgets "50 15"]
#       [-- MORE mcv-run OPTIONS FOR THE PREDICTING ROWS]
#
# Prompt: 8 fixed token ids, then N greedy decode steps (--ignore-eos); the
# best of R rounds per configuration, the configurations of a round
# interleaved.  --packed: also the packed copy of the model (mcv-pack into a
# temporary file).  --device: first the disk alone, 72 KiB O_DIRECT preads at
# random offsets of the model file at queue depth 1, 2, 4, 8, 16 (threads
# reading concurrently), for 1 s each; the bound column uses its best
# throughput.  Environment: BIN (default bin), MODEL, CC (default cc).
set -eu
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
MODEL=${MODEL:-examples/models/proving-text.gguf}
T=2 N=128 R=3 PRED= PACKED= DEVICE= BUDGETS="50 15"
while [ $# -gt 0 ]; do
	case $1 in
	-t) T=$2; shift ;;
	-n) N=$2; shift ;;
	-r) R=$2; shift ;;
	--predictor) PRED=$2; shift ;;
	--packed) PACKED=1 ;;
	--device) DEVICE=1 ;;
	--budgets) BUDGETS=$2; shift ;;
	--) shift; break ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-les-proving: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
EXTRA="$*"
RUN=$BIN/mcv-run
[ -x "$RUN" ] || { echo "bench-les-proving: $RUN not built" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "bench-les-proving: no model $MODEL" >&2; exit 1; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PROMPT=2037,270,10,3,55,100,200,300

BW=
if [ -n "$DEVICE" ]; then
	cat >"$W/qd.c" <<'EOF'
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
static int fd;
static uint64_t nblk;
static size_t len = 72 * 1024;
static double secs(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
typedef struct { unsigned seed; long n; double busy, t_end; } worker;
static void *work(void *p)
{
	worker *w = p;
	void *buf;
	if (posix_memalign(&buf, 4096, len)) exit(1);
	while (secs() < w->t_end) {
		off_t off = (off_t)(rand_r(&w->seed) % nblk) * 4096;
		double t0 = secs();
		if (pread(fd, buf, len, off) != (ssize_t)len) { perror("pread"); exit(1); }
		w->busy += secs() - t0;
		w->n++;
	}
	free(buf);
	return NULL;
}
int main(int argc, char **argv)
{
	struct stat st;
	if (argc < 2 || (fd = open(argv[1], O_RDONLY | O_DIRECT)) < 0 || fstat(fd, &st)) { perror("open"); return 1; }
	nblk = ((uint64_t)st.st_size - len) / 4096;
	double best = 0;
	for (int q = 1; q <= 16; q *= 2) {
		pthread_t th[16];
		worker w[16];
		double t0 = secs();
		for (int i = 0; i < q; i++) {
			w[i] = (worker){ .seed = 7919u * (unsigned)i + (unsigned)q, .t_end = t0 + 1.0 };
			pthread_create(&th[i], NULL, work, &w[i]);
		}
		long n = 0;
		double busy = 0;
		for (int i = 0; i < q; i++) { pthread_join(th[i], NULL); n += w[i].n; busy += w[i].busy; }
		double t = secs() - t0, mib = n * (double)len / 1048576.0 / t;
		printf("device: queue depth %2d: %6.0f reads/s %7.1f MiB/s, latency %6.1f us\n", q, n / t, mib, 1e6 * busy / n);
		if (mib > best) best = mib;
	}
	printf("bandwidth %.1f\n", best);
	return 0;
}
EOF
	${CC:-cc} -O2 -pthread -o "$W/qd" "$W/qd.c"
	"$W/qd" "$MODEL" >"$W/dev"
	grep '^device' "$W/dev"
	BW=$(sed -n 's/^bandwidth //p' "$W/dev")
fi

# budget arithmetic of a file: minimum (holds k experts), slot size, k, experts
setup() {
	f=$1
	n_exp=$("$RUN" -m "$f" -p hi -n 1 --mem 1G --stats 2>&1 >/dev/null |
		sed -n 's/.*slots of [0-9.]* MiB, [0-9.]*% of \([0-9]*\) experts.*/\1/p')
	min=$("$RUN" -m "$f" -p hi -n 1 --mem 1K 2>&1 >/dev/null | sed -n 's/.*below the minimum \([0-9]*\) .*/\1/p')
	"$RUN" -m "$f" -p hi -n 1 --mem $((min + 8388608)) --stats 2>"$W/e" >/dev/null
	slot=$(sed -n 's/.*expert cache \([0-9.]*\) (\([0-9]*\) slots.*/\1 \2/p' "$W/e" |
		awk '{ printf "%d", $1 * 1048576 / $2 }')
	k=$("$RUN" -m "$f" -p hi -n 1 --mem 1K 2>&1 | sed -n 's/.*top-\([0-9]*\) experts.*/\1/p')
}

# rows: NAME<TAB>FILE<TAB>OPTIONS, run R interleaved rounds, keep the best
rows=$W/rows
: >"$rows"
row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$rows"; }
row resident "$MODEL" ""
files=$MODEL
if [ -n "$PACKED" ]; then
	"$BIN/mcv-pack" -q "$MODEL" "$W/packed.gguf"
	files="$MODEL $W/packed.gguf"
fi
for f in $files; do
	setup "$f"
	tag=; [ "$f" = "$MODEL" ] || tag="packed "
	for b in $BUDGETS; do
		mem=$((min + (n_exp * b / 100 - k) * slot))
		row "$tag$b% on-demand (lookahead 0)" "$f" "--mem $mem --lookahead 0"
		row "$tag$b% router, lookahead 1" "$f" "--mem $mem --lookahead 1 $EXTRA"
		row "$tag$b% router, lookahead 2" "$f" "--mem $mem --lookahead 2 $EXTRA"
		[ -z "$PRED" ] || row "$tag$b% trained, lookahead 1" "$f" "--mem $mem --lookahead 1 --predictor $PRED $EXTRA"
		[ -z "$PRED" ] || row "$tag$b% trained, lookahead 2" "$f" "--mem $mem --lookahead 2 --predictor $PRED $EXTRA"
	done
done
i=0
while [ $i -lt "$R" ]; do
	j=0
	while IFS="$(printf '\t')" read -r name f opts; do
		j=$((j + 1))
		# shellcheck disable=SC2086
		"$RUN" -m "$f" --tokens "$PROMPT" -n "$N" --temp 0 --ignore-eos -t "$T" --stats $opts \
			>/dev/null 2>"$W/s.$j.now"
		tps=$(sed -n 's/.*decode[: ].* \([0-9.]*\) tok\/s.*/\1/p' "$W/s.$j.now" | head -1)
		old=$(cat "$W/best.$j" 2>/dev/null || echo 0)
		if awk -v a="$old" -v b="${tps:-0}" 'BEGIN { exit !(b > a) }'; then
			echo "$tps" >"$W/best.$j"
			mv "$W/s.$j.now" "$W/s.$j"
		fi
	done <"$rows"
	i=$((i + 1))
done

printf '%-36s %8s %7s %8s %9s %7s %9s\n' config "tok/s" hit recall@k MiB/token "x od" "bound"
j=0 od=
while IFS="$(printf '\t')" read -r name f opts; do
	j=$((j + 1))
	best=$(cat "$W/best.$j" 2>/dev/null || echo 0)
	s=$W/s.$j
	hit=$(sed -n 's/.*les: hit rate \([0-9.]*%\).*/\1/p' "$s" 2>/dev/null)
	rec=$(sed -n 's/.*les: prediction 1 layer ahead: recall \([0-9.]*%\).*/\1/p' "$s" 2>/dev/null)
	mib=$(sed -n 's/.*les: decode: \([0-9.]*\) MiB read per token.*/\1/p' "$s" 2>/dev/null)
	case $name in *on-demand*) od=$best ;; esac
	x=-; bound=-
	case $name in *%*) x=$(awk -v a="$best" -v b="$od" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }') ;; esac
	[ -z "$BW" ] || [ -z "$mib" ] || bound=$(awk -v w="$BW" -v m="$mib" 'BEGIN { printf "%.0f", (m > 0) ? w / m : 0 }')
	printf '%-36s %8s %7s %8s %9s %7s %9s\n' "$name" "$best" "${hit:--}" "${rec:--}" "${mib:--}" "$x" "$bound"
done <"$rows"

#!/bin/sh
# Vision benchmark: mcv against the PyTorch reference (scripts/ref/) on the
# same model files, same images, same thread count, in the same run.
#
#   scripts/bench/bench-vision.sh [-t THREADS] [-n RECEIPTS] [--ref-n N]
#                                 [--reps R] [--tokens K] [--keep DIR]
#
# Measures, for the proving model (examples/models/proving-{text,mmproj}.gguf
# when present, else a random export with the same shapes -- the table says
# which):
#   encode 16x / 4x   vision-encode milliseconds per image (all crops of a
#                     test receipt, preprocessing included; best of R)
#   batch OCR         images per second over RECEIPTS receipts of
#                     `gen.py --split test --task receipt_read` (greedy, at
#                     most K new tokens each; mcv-run --batch, model load
#                     included; the reference's loop excludes its load)
#   TTFT              time to first token for one receipt (best of R;
#                     mcv-run's per-input "ms" with -n 1; the reference's
#                     answer() with max_new=0, which computes the first token)
# and prints mcv, reference and reference/mcv (>1: mcv faster).  Wall
# times on a shared machine swing with the load; the "CPU ms" rows (user +
# system time of all threads per image: for mcv the difference between
# 1 and 4R+1 encodes of one process, for the reference process_time around
# its loop) are the steadier comparison of the work each side does.  The
# reference is slow: --ref-n runs it on the first N receipts only (images
# per second are comparable; the table says how many each side ran).
# Environment: B (build folder, default build), OMP_WAIT_POLICY (default
# passive: the machine is shared).
set -eu
cd "$(dirname "$0")/../.."
B=${B:-build}
PY=/usr/bin/python3
T=2 N=100 REFN= REPS=3 K=16 KEEP=
while [ $# -gt 0 ]; do
	case $1 in
	-t) T=$2; shift ;;
	-n) N=$2; shift ;;
	--ref-n) REFN=$2; shift ;;
	--reps) REPS=$2; shift ;;
	--tokens) K=$2; shift ;;
	--keep) KEEP=$2; shift ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-vision: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
REFN=${REFN:-$N}
[ "$REFN" -le "$N" ] || REFN=$N
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
RUN=${BIN:-bin}/mcv-run
[ -x "$RUN" ] || RUN=$B/bin/mcv-run
[ -x "$RUN" ] || RUN=$B/mcv-run
DUMP=$B/mcv-vision-dump
for x in "$RUN" "$DUMP"; do
	[ -x "$x" ] || { echo "bench-vision: $x not built (make B=$B)" >&2; exit 1; }
done
$PY -c 'import torch' 2>/dev/null || { echo "bench-vision: no torch in $PY" >&2; exit 1; }

if [ -n "$KEEP" ]; then W=$KEEP; mkdir -p "$W"; else W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
if [ -f examples/models/proving-text.gguf ] && [ -f examples/models/proving-mmproj.gguf ]; then
	TEXT=examples/models/proving-text.gguf MMPROJ=examples/models/proving-mmproj.gguf
	WHICH="examples/models/proving-*.gguf"
else
	[ -f "$W/model/proving-mmproj.gguf" ] ||
		$PY scripts/ref/export.py --random --out-dir "$W/model" --merge 4 >/dev/null
	TEXT=$W/model/proving-text.gguf MMPROJ=$W/model/proving-mmproj.gguf
	WHICH="random export (scripts/ref/export.py --random --merge 4), proving shapes"
fi
[ -f "$W/rc/data.jsonl" ] && [ "$(wc -l < "$W/rc/data.jsonl")" -ge "$N" ] ||
	$PY scripts/data/gen.py --split test --task receipt_read --n "$N" --out "$W/rc" >/dev/null
ls "$W"/rc/images/*.png | head -n "$N" > "$W/list"
IMG=$(head -n 1 "$W/list")
PROMPT="Read the receipt."
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- mcv
enc() { # compress -> best ms per image
	"$DUMP" "$MMPROJ" "$IMG" --compress "$1" -t "$T" --time "$REPS" |
		sed 's/.*"encode_ms":\([0-9.]*\).*/\1/'
}
cpu() { # command... -> user+sys seconds of it
	/usr/bin/time -f '%U %S' -o "$W/cpu" "$@" > /dev/null
	awk '{print $1 + $2}' "$W/cpu"
}
enc_cpu() { # compress -> CPU ms per image: (E+1 encodes - 1 encode) / E
	a=$(cpu "$DUMP" "$MMPROJ" "$IMG" --compress "$1" -t "$T" --time 1)
	b=$(cpu "$DUMP" "$MMPROJ" "$IMG" --compress "$1" -t "$T" --time $((E + 1)))
	echo "scale=1; 1000 * ($b - $a) / $E" | bc
}
E=$((REPS * 4))
M16=$(enc 16)
M4=$(enc 4)
C16=$(enc_cpu 16)
C4=$(enc_cpu 4)
ttft_best=
i=0
while [ $i -lt "$REPS" ]; do
	ms=$("$RUN" -m "$TEXT" --mmproj "$MMPROJ" -t "$T" --temp 0 -n 1 --json -q -p "$PROMPT" -i "$IMG" |
		sed 's/.*"ms":\([0-9.]*\).*/\1/')
	if [ -z "$ttft_best" ] || [ "$(echo "$ms < $ttft_best" | bc)" = 1 ]; then ttft_best=$ms; fi
	i=$((i + 1))
done
MTTFT=$ttft_best
t0=$(date +%s.%N)
/usr/bin/time -f '%U %S' -o "$W/cpu" "$RUN" -m "$TEXT" --mmproj "$MMPROJ" -t "$T" --temp 0 -n "$K" -q -p "$PROMPT" --batch --jsonl < "$W/list" > "$W/mcv.jsonl"
t1=$(date +%s.%N)
MOK=$(grep -c '"text"' "$W/mcv.jsonl" || true)
MGEN=$(sed -n 's/.*"tokens":\([0-9]*\).*/\1/p' "$W/mcv.jsonl" | awk '{s+=$1} END {print s+0}')
MIPS=$(echo "scale=3; $MOK / ($t1 - $t0)" | bc)
MBCPU=$(awk -v n="$MOK" '{printf "%.1f", 1000 * ($1 + $2) / n}' "$W/cpu")

# ---- reference
cat > "$W/ref.py" <<'EOF'
import sys, time, os
import torch
sys.path.insert(0, 'scripts/ref')
import export, dump, model
from chat import answer
from PIL import Image
text, mmproj, lst, T, reps, K, refn, prompt = sys.argv[1:9]
torch.set_num_threads(int(T))
reps, K, refn = int(reps), int(K), int(refn)
m = export.load(text, mmproj)
m.eval()
tok = dump.tokenizer_from_gguf(text)
paths = [l.strip() for l in open(lst)][:refn]
img = Image.open(paths[0]).convert('RGB')
out = {}
with torch.no_grad():
    for comp, merge in ((16, 4), (4, 2)):
        best = 1e30
        for _ in range(reps):
            t = time.perf_counter()
            crops, _ = model.image_to_crops(img, m.vc, merge)
            for c in crops:
                m.vision(c[None], merge)
            best = min(best, time.perf_counter() - t)
        out['enc%d' % comp] = best * 1e3
        c = time.process_time()
        for _ in range(4 * reps):
            crops, _ = model.image_to_crops(img, m.vc, merge)
            for x in crops:
                m.vision(x[None], merge)
        out['cpu%d' % comp] = (time.process_time() - c) * 1e3 / (4 * reps)
    best = 1e30
    for _ in range(reps):
        t = time.perf_counter()
        answer(m, tok, dict(prompt=prompt, image=Image.open(paths[0])), None, max_new=0)
        best = min(best, time.perf_counter() - t)
    out['ttft'] = best * 1e3
    t = time.perf_counter()
    c = time.process_time()
    gen = 0
    for p in paths:
        gen += len(answer(m, tok, dict(prompt=prompt, image=Image.open(p)), None, max_new=K))
    out['ips'] = len(paths) / (time.perf_counter() - t)
    out['bcpu'] = (time.process_time() - c) * 1e3 / len(paths)
print(' '.join('%.3f' % out[k] for k in ('enc16', 'enc4', 'ttft', 'ips', 'cpu16', 'cpu4', 'bcpu')))
EOF
set -- $($PY "$W/ref.py" "$TEXT" "$MMPROJ" "$W/list" "$T" "$REPS" "$K" "$REFN" "$PROMPT")
R16=$1 R4=$2 RTTFT=$3 RIPS=$4 RC16=$5 RC4=$6 RBCPU=$7
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

ratio() { echo "scale=2; $1 / $2" | bc; }
echo "bench-vision: model $WHICH; $T threads; OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
echo "load average before: $LOAD0, after: $LOAD1"
printf '%-34s %12s %12s %10s\n' "" mcv reference "ref/mcv"
printf '%-34s %12.1f %12.1f %9sx\n' "vision encode 16x (ms/image)" "$M16" "$R16" "$(ratio "$R16" "$M16")"
printf '%-34s %12.1f %12.1f %9sx\n' "vision encode 4x (ms/image)" "$M4" "$R4" "$(ratio "$R4" "$M4")"
printf '%-34s %12.1f %12.1f %9sx\n' "  CPU ms per image, 16x" "$C16" "$RC16" "$(ratio "$RC16" "$C16")"
printf '%-34s %12.1f %12.1f %9sx\n' "  CPU ms per image, 4x" "$C4" "$RC4" "$(ratio "$RC4" "$C4")"
printf '%-34s %12.3f %12.3f %9sx\n' "batch OCR (images/s)" "$MIPS" "$RIPS" "$(ratio "$MIPS" "$RIPS")"
printf '%-34s %12.1f %12.1f %9sx\n' "  CPU ms per receipt" "$MBCPU" "$RBCPU" "$(ratio "$RBCPU" "$MBCPU")"
printf '%-34s %12.1f %12.1f %9sx\n' "time to first token (ms)" "$MTTFT" "$RTTFT" "$(ratio "$RTTFT" "$MTTFT")"
echo "(encode/TTFT on $(basename "$IMG"); batch: mcv $MOK of $N receipts ($MGEN tokens), reference $REFN; <= $K new tokens each)"

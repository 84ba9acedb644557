#!/bin/sh
# bench-quant.sh: mcv-quant's sensitivity-driven allocation against
# llama.cpp's fixed recipes (llama_model_quantize from the peer's libllama),
# on the proving model, by mean KL divergence of next-token distributions
# from the F32/F16 model and top-1 agreement, teacher-forced over validation
# prompts (text tasks of scripts/data/synth.py).
#
#   scripts/bench/bench-quant.sh [-m MODEL.gguf] [-o DIR] [-t N] [-n LINES]
#                                [--recipes "q2_k q3_k_m q4_k_m q5_k_m"] [--proxy]
#                                [--imatrix FILE]  (reuse instead of calibrating)
#
# For each recipe: llama.cpp's file without and with an importance matrix
# (calibrated by mcv-quant --calibrate on the train split), and mcv-quant
# --target-size at exactly the recipe's tensor bytes: "mcv" with the
# relative-error proxy and no importance matrix, "mcvi" with the same
# importance matrix, "mcvk" with it and --probe (each tensor's proxy scaled
# by the KL measured with that tensor alone at its lowest type, on 8 train
# prompts).  Prints one row per file, then per size
# KL_mcv / KL_llama at equal size and, by log-log interpolation of llama's
# KL-vs-size curve, size_mcv / size_llama at equal KL.  --proxy also checks
# the estimated loss against measured KL: single tensors at q2_K / q3_K on
# top of an all-q8_0 model, correlation of log(est) with log(KL - KL_q8_0).
# Needs: make (B=, BIN= as for make), the peer (scripts/setup.sh),
# /usr/bin/python3.  Without -m it uses examples/models/proving-text.gguf.
set -eu
cd "$(dirname "$0")/../.."
# OpenMP threads that spin while waiting waste a loaded machine's CPU.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
B=${B:-build}
BIN=${BIN:-bin}
M=examples/models/proving-text.gguf
O=${TMPDIR:-/tmp}/bench-quant
T=2
N=64
RECIPES="q2_k q3_k_m q4_k_m q5_k_m"
PROXY=0
IM=
while [ $# -gt 0 ]; do
	case $1 in
	-m) M=$2; shift ;;
	-o) O=$2; shift ;;
	-t) T=$2; shift ;;
	-n) N=$2; shift ;;
	--recipes) RECIPES=$2; shift ;;
	--proxy) PROXY=1 ;;
	--imatrix) IM=$2; shift ;;
	*) echo "bench-quant.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
[ -s "$M" ] || { echo "bench-quant.sh: no model $M (export one with scripts/ref/export.py --out-dir ...; -m)" >&2; exit 1; }
PEER=scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
for x in "$BIN/mcv-quant" "$B/mcv-kl" "$B/llama-quantize-peer"; do
	[ -x "$x" ] || { echo "bench-quant.sh: $x missing (make B=$B BIN=$BIN)" >&2; exit 1; }
done
mkdir -p "$O"

mk_data() { # split n out
	/usr/bin/python3 - "$@" <<'PY'
import json, sys
sys.path.insert(0, 'scripts/data')
import synth
split, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(out, 'w') as f:
    for i in range(n):
        s = synth.sample(split, i, task='text')
        t = ("<|im_start|>user\n" + s['prompt'] + "<|im_end|>\n<|im_start|>assistant\n"
             "<think>\n\n</think>\n\n" + s['answer'] + "<|im_end|>")
        f.write(json.dumps({"prompt": t}) + "\n")
PY
}
mk_data train 128 "$O/calib.jsonl"
mk_data val "$N" "$O/val.jsonl"
head -8 "$O/calib.jsonl" >"$O/probe.jsonl"

if [ -n "$IM" ]; then
	[ "$IM" = "$O/im.gguf" ] || cp "$IM" "$O/im.gguf"
else
	t0=$(date +%s)
	"$BIN/mcv-quant" -q -t "$T" --calibrate "$O/calib.jsonl" --imatrix-out "$O/im.gguf" "$M"
	echo "calibration: $(($(date +%s) - t0)) s (128 train prompts)" >&2
fi

tensor_bytes() { awk -F'\t' 'NR > 1 { s += $5 } END { printf "%d", s }' "$1"; }
FILES=""
for r in $RECIPES; do
	"$B/llama-quantize-peer" --lib "$PEER" -t "$T" "$M" "$O/llama-$r.gguf" "$r" >"$O/llama-$r.log" 2>&1
	"$B/llama-quantize-peer" --lib "$PEER" -t "$T" --imatrix "$O/im.gguf" "$M" "$O/llamai-$r.gguf" "$r" >"$O/llamai-$r.log" 2>&1
	# the same recipe through mcv-quant: its report gives the tensor bytes
	"$BIN/mcv-quant" -q -t "$T" --recipe "$r" --report "$O/rec-$r.tsv" "$M" "$O/rec-$r.gguf"
	cmp -s "$O/rec-$r.gguf" "$O/llama-$r.gguf" && same=identical || same=DIFFERENT
	S=$(tensor_bytes "$O/rec-$r.tsv")
	echo "$r: $S tensor bytes; mcv-quant --recipe $r vs llama_model_quantize: $same" >&2
	t1=$(date +%s)
	"$BIN/mcv-quant" -q -t "$T" --target-size "$S" --report "$O/mcv-$r.tsv" "$M" "$O/mcv-$r.gguf"
	t2=$(date +%s)
	"$BIN/mcv-quant" -q -t "$T" --target-size "$S" --imatrix "$O/im.gguf" --report "$O/mcvi-$r.tsv" \
		--sensitivity "$O/sens-$r.tsv" "$M" "$O/mcvi-$r.gguf"
	t3=$(date +%s)
	"$BIN/mcv-quant" -q -t "$T" --target-size "$S" --imatrix "$O/im.gguf" --probe "$O/probe.jsonl" \
		--report "$O/mcvk-$r.tsv" --sensitivity "$O/sensk-$r.tsv" "$M" "$O/mcvk-$r.gguf"
	echo "$r: mcv-quant allocation $((t2 - t1)) s, with imatrix $((t3 - t2)) s, with probes $(($(date +%s) - t3)) s" >&2
	FILES="$FILES $O/llama-$r.gguf $O/llamai-$r.gguf $O/mcv-$r.gguf $O/mcvi-$r.gguf $O/mcvk-$r.gguf"
done
# shellcheck disable=SC2086
"$B/mcv-kl" -t "$T" "$M" "$O/val.jsonl" $FILES >"$O/kl.tsv"

/usr/bin/python3 - "$O" "$RECIPES" <<'PY'
import math, sys
O, recipes = sys.argv[1], sys.argv[2].split()
def tbytes(p):
    return sum(int(l.split('\t')[4]) for l in list(open(p))[1:])
kl = {}
for l in open(O + '/kl.tsv'):
    f, k, top1, npos, size = l.rstrip('\n').split('\t')
    name = f.rsplit('/', 1)[1][:-5]
    kl[name] = (float(k), float(top1), int(npos))
nel = None
rows = []
for r in recipes:
    S = tbytes(O + '/rec-%s.tsv' % r)
    n_el = sum(int(eval(l.split('\t')[1].replace('x', '*'))) for l in list(open(O + '/rec-%s.tsv' % r))[1:])
    for kind in ('llama', 'llamai', 'mcv', 'mcvi', 'mcvk'):
        name = '%s-%s' % (kind, r)
        size = S if kind.startswith('llama') else tbytes(O + '/%s.tsv' % name)
        rows.append((kind, r, size, 8.0 * size / n_el) + kl[name])
print('%-8s %-7s %12s %6s %10s %7s' % ('quant', 'recipe', 'bytes', 'bpw', 'KL', 'top1'))
for kind, r, size, bpw, k, t, n in rows:
    print('%-8s %-7s %12d %6.3f %10.5f %7.4f' % (kind, r, size, bpw, k, t))
print('positions per model: %d' % rows[0][6])
def curve(kind):
    return sorted((s, k) for kd, r, s, b, k, t, n in rows if kd == kind)
def size_at(kind, target):
    c = curve(kind)
    for (s0, k0), (s1, k1) in zip(c, c[1:]):
        lo, hi = sorted((k0, k1))
        if lo <= target <= hi and k0 != k1:
            f = (math.log(target) - math.log(k0)) / (math.log(k1) - math.log(k0))
            return math.exp(math.log(s0) + f * (math.log(s1) - math.log(s0)))
    return None
print()
print('KL ratio at equal size; size ratio at equal KL (llama curve interpolated log-log; "-" = outside it)')
pairs = (('mcv', 'llama'), ('mcvi', 'llamai'), ('mcvk', 'llamai'), ('mcvk', 'llama'))
print('%-7s' % 'recipe' + ''.join(' %14s' % ('KL %s/%s' % p) for p in pairs) + ''.join(' %16s' % ('size %s/%s' % p) for p in pairs))
for r in recipes:
    g = {kd: (s, k) for kd, rr, s, b, k, t, n in rows if rr == r}
    out = '%-7s' % r
    for a, b in pairs:
        out += ' %14.3f' % (g[a][1] / g[b][1])
    for a, b in pairs:
        sz = size_at(b, g[a][1])
        out += ' %16s' % ('%.3f' % (g[a][0] / sz) if sz else '-')
    print(out)
PY

if [ "$PROXY" = 1 ]; then
	# Single tensors at q2_K / q3_K over an all-q8_0 model: measured KL
	# increase against the estimate of --sensitivity.
	r1=$(echo "$RECIPES" | awk '{ print $1 }')
	"$BIN/mcv-quant" -q -t "$T" --recipe q8_0 "$M" "$O/p-base.gguf"
	PF="$O/p-base.gguf"
	names=$(awk -F'\t' 'NR > 1 && $2 == "q2_K" { print $1 }' "$O/sens-$r1.tsv" | awk 'NR % 7 == 1' | head -12)
	: >"$O/proxy.list"
	for nm in $names; do
		for ty in q2_K q3_K; do
			f="$O/p-$(echo "$nm" | tr . _)-$ty.gguf"
			"$BIN/mcv-quant" -q -t "$T" --recipe q8_0 --imatrix "$O/im.gguf" --type "^$nm\$=$ty" "$M" "$f"
			echo "$f	$nm	$ty" >>"$O/proxy.list"
			PF="$PF $f"
		done
	done
	# shellcheck disable=SC2086
	"$B/mcv-kl" -t "$T" --max-lines 32 "$M" "$O/val.jsonl" $PF >"$O/proxy-kl.tsv"
	/usr/bin/python3 - "$O" "$r1" <<'PY'
import math, sys
import numpy as np
O, r1 = sys.argv[1], sys.argv[2]
def load(fn):
    d = {}
    for l in list(open(fn))[1:]:
        t, ty, b, e = l.rstrip('\n').split('\t')
        d[(t, ty)] = float(e)
    return d
est, estk = load(O + '/sens-%s.tsv' % r1), load(O + '/sensk-%s.tsv' % r1)
kl = {l.split('\t')[0]: float(l.split('\t')[1]) for l in open(O + '/proxy-kl.tsv')}
base = kl[O + '/p-base.gguf']
pts = []
print('\n%-36s %-5s %12s %12s %12s' % ('tensor (others q8_0)', 'type', 'proxy', 'probe-scaled', 'KL - KL_q8_0'))
for l in open(O + '/proxy.list'):
    f, t, ty = l.rstrip('\n').split('\t')
    d = kl[f] - base
    print('%-36s %-5s %12.4g %12.4g %12.4g' % (t, ty, est[(t, ty)], estk[(t, ty)], d))
    pts.append((est[(t, ty)], estk[(t, ty)], d))
for i, what in ((0, 'relative-error proxy'), (1, 'probe-scaled estimate')):
    xy = [(math.log(p[i]), math.log(p[2])) for p in pts if p[i] > 0 and p[2] > 0]
    if len(xy) > 2:
        xs, ys = zip(*xy)
        rx = np.argsort(np.argsort(xs)); ry = np.argsort(np.argsort(ys))
        print('%s vs measured KL over %d points: Pearson(log, log) %.3f, Spearman %.3f'
              % (what, len(xs), np.corrcoef(xs, ys)[0, 1], np.corrcoef(rx, ry)[0, 1]))
print('(probe-scaled q2_K points were probed on train prompts, so only the q3_K ones are out of sample)')
PY
fi

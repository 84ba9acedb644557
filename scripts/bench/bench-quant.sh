#!/bin/sh
# bench-quant.sh: mcv-quant's sensitivity-driven allocation against
# llama.cpp's fixed recipes (llama_model_quantize from the peer's libllama),
# on the proving model: mean KL divergence of next-token distributions from
# the F32/F16 model and top-1 agreement, teacher-forced over validation
# prompts (text tasks of scripts/data/synth.py), and task accuracy on the
# validation split (scripts/mcv-eval.py: mcv-run with the model's mmproj,
# greedy; scored by scripts/eval.py).
#
#   scripts/bench/bench-quant.sh [-m MODEL.gguf] [--mmproj FILE] [-o DIR] [-t N]
#        [-n LINES] [--acc-n N] [--recipes "q2_k q3_k_m q4_k_m q5_k_m"]
#        [--methods "llama llamai mcv mcvi mcvk"] [--stage S] [--proxy]
#        [--imatrix FILE]  (reuse instead of calibrating)
#
# Points: one per llama.cpp recipe (q2_k, q3_k_m, q4_k_m, q5_k_m: ~3.0, 3.5-3.9,
# 4.5-4.9, 5.5-5.7 bits per weight on large models; higher on the proving
# model, whose 64-wide expert down rows and F32 small tensors cannot take
# K-quants).  Methods per point: "llama" and "llamai" = llama.cpp's file
# without and with an importance matrix (calibrated by mcv-quant
# --calibrate on the train split); "mcv", "mcvi", "mcvk" = mcv-quant
# --target-size at exactly the recipe's tensor bytes, "mcv" with the
# relative-error proxy and no importance matrix, "mcvi" with the same
# importance matrix, "mcvk" with it and --probe (each tensor's proxy scaled
# by the KL measured with that tensor alone at its lowest type, on 8 train
# prompts).
#
# Stages (--stage; default all, in this order), so that each run stays short
# and can go through a lock that pauses other jobs:
#   prep    prompts and the importance matrix
#   quant   the files of --recipes x --methods (and --recipe through mcv-quant
#           for the sizes: "identical"/"DIFFERENT" against llama.cpp's file)
#   eval    KL/top-1 (mcv-kl) and accuracy (--acc-n samples per task of the
#           8 tasks, 0 = none) of those files, and of MODEL itself once
#   report  the tables, from whatever the folder holds
#   proxy   (also with --proxy) the estimate against measured single-tensor KL
# Report columns: KL, top1; "exact" and "cer" = mean over the 8 tasks of
# exact match and character error rate; "text", "count", "left" = exact match
# of the tasks the model half-solves; "same" = fraction of the answers
# identical to MODEL's own.  Then per point KL_mcv / KL_llama at equal size
# and, by log-log interpolation of llama's KL-vs-size curve, size_mcv /
# size_llama at equal KL.  --proxy also checks the estimated loss against
# measured KL: single tensors at q2_K / q3_K on top of an all-q8_0 model,
# correlation of log(est) with log(KL - KL_q8_0).
# Needs: make (B=, BIN= as for make), the peer (scripts/setup.sh),
# /usr/bin/python3.  Without -m it uses examples/models/proving-text.gguf
# (Q8_0: re-quantized with a warning; export an F32 one for real figures:
# scripts/ref/export.py --type f32 --expert-type f32 --out-dir DIR).
set -eu
cd "$(dirname "$0")/../.."
# OpenMP threads that spin while waiting waste a loaded machine's CPU.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
B=${B:-build}
BIN=${BIN:-bin}
M=examples/models/proving-text.gguf
MMPROJ=
O=${TMPDIR:-/tmp}/bench-quant
T=2
N=64
ACC_N=20
RECIPES="q2_k q3_k_m q4_k_m q5_k_m"
METHODS="llama llamai mcv mcvi mcvk"
STAGE=all
PROXY=0
IM=
while [ $# -gt 0 ]; do
	case $1 in
	-m) M=$2; shift ;;
	--mmproj) MMPROJ=$2; shift ;;
	-o) O=$2; shift ;;
	-t) T=$2; shift ;;
	-n) N=$2; shift ;;
	--acc-n) ACC_N=$2; shift ;;
	--recipes) RECIPES=$2; shift ;;
	--methods) METHODS=$2; shift ;;
	--stage) STAGE=$2; shift ;;
	--proxy) PROXY=1 ;;
	--imatrix) IM=$2; shift ;;
	*) echo "bench-quant.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
case $STAGE in all|prep|quant|eval|report|proxy) ;; *) echo "bench-quant.sh: unknown stage $STAGE" >&2; exit 2 ;; esac
for k in $METHODS; do
	case $k in llama|llamai|mcv|mcvi|mcvk) ;; *) echo "bench-quant.sh: unknown method $k" >&2; exit 2 ;; esac
done
[ -s "$M" ] || { echo "bench-quant.sh: no model $M (export one with scripts/ref/export.py --out-dir ...; -m)" >&2; exit 1; }
if [ -z "$MMPROJ" ]; then
	MMPROJ=${M%-text.gguf}-mmproj.gguf
	[ -s "$MMPROJ" ] || MMPROJ=examples/models/proving-mmproj.gguf
fi
PEER=scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
for x in "$BIN/mcv-quant" "$BIN/mcv-run" "$B/mcv-kl" "$B/llama-quantize-peer"; do
	[ -x "$x" ] || { echo "bench-quant.sh: $x missing (make B=$B BIN=$BIN)" >&2; exit 1; }
done
mkdir -p "$O"
on() { [ "$STAGE" = all ] || [ "$STAGE" = "$1" ]; }

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
if on prep; then
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
fi
[ "$STAGE" = report ] || [ -s "$O/im.gguf" ] || { echo "bench-quant.sh: no $O/im.gguf (run --stage prep first)" >&2; exit 1; }

tensor_bytes() { awk -F'\t' 'NR > 1 { s += $5 } END { printf "%d", s }' "$1"; }
has() { case " $METHODS " in *" $1 "*) return 0 ;; esac; return 1; }
if on quant; then
	for r in $RECIPES; do
		# the recipe through mcv-quant: its report gives the tensor bytes
		"$BIN/mcv-quant" -q -t "$T" --recipe "$r" --report "$O/rec-$r.tsv" "$M" "$O/rec-$r.gguf"
		S=$(tensor_bytes "$O/rec-$r.tsv")
		if has llama; then
			"$B/llama-quantize-peer" --lib "$PEER" -t "$T" "$M" "$O/llama-$r.gguf" "$r" >"$O/llama-$r.log" 2>&1
			cmp -s "$O/rec-$r.gguf" "$O/llama-$r.gguf" && same=identical || same=DIFFERENT
			echo "$r: $S tensor bytes; mcv-quant --recipe $r vs llama_model_quantize: $same" >&2
		fi
		if has llamai; then
			"$B/llama-quantize-peer" --lib "$PEER" -t "$T" --imatrix "$O/im.gguf" "$M" "$O/llamai-$r.gguf" "$r" >"$O/llamai-$r.log" 2>&1
		fi
		rm -f "$O/rec-$r.gguf"
		t1=$(date +%s)
		if has mcv; then
			"$BIN/mcv-quant" -q -t "$T" --target-size "$S" --report "$O/mcv-$r.tsv" "$M" "$O/mcv-$r.gguf"
		fi
		t2=$(date +%s)
		if has mcvi; then
			"$BIN/mcv-quant" -q -t "$T" --target-size "$S" --imatrix "$O/im.gguf" --report "$O/mcvi-$r.tsv" \
				--sensitivity "$O/sens-$r.tsv" "$M" "$O/mcvi-$r.gguf"
		fi
		t3=$(date +%s)
		if has mcvk; then
			"$BIN/mcv-quant" -q -t "$T" --target-size "$S" --imatrix "$O/im.gguf" --probe "$O/probe.jsonl" \
				--report "$O/mcvk-$r.tsv" --sensitivity "$O/sensk-$r.tsv" "$M" "$O/mcvk-$r.gguf"
		fi
		echo "$r: mcv-quant allocation $((t2 - t1)) s, with imatrix $((t3 - t2)) s, with probes $(($(date +%s) - t3)) s" >&2
	done
fi

# acc NAME MODEL: task accuracy of one text model with MMPROJ -> $O/acc-NAME.json
acc() {
	[ "$ACC_N" -gt 0 ] || return 0
	/usr/bin/python3 scripts/mcv-eval.py --split val --n "$ACC_N" --task all --mcv-run "$BIN/mcv-run" \
		-m "$2" --mmproj "$MMPROJ" -t "$T" --work "$O/evalset" -o "$O/acc-$1.jsonl" 2>"$O/acc-$1.log" ||
		echo "bench-quant.sh: $1: some answers failed (see $O/acc-$1.log)" >&2
	/usr/bin/python3 scripts/eval.py --split val --n "$ACC_N" --task all --json "$O/acc-$1.jsonl" >"$O/acc-$1.json"
}
if on eval; then
	FILES=""
	for r in $RECIPES; do
		for k in $METHODS; do
			[ -s "$O/$k-$r.gguf" ] || { echo "bench-quant.sh: no $O/$k-$r.gguf (run --stage quant)" >&2; exit 1; }
			FILES="$FILES $O/$k-$r.gguf"
		done
	done
	# shellcheck disable=SC2086
	"$B/mcv-kl" -t "$T" "$M" "$O/val.jsonl" $FILES >"$O/kl-new.tsv"
	while IFS='	' read -r f rest; do
		nm=$(basename "$f" .gguf)
		printf '%s\t%s\n' "$f" "$rest" >"$O/kl-$nm.tsv"
	done <"$O/kl-new.tsv"
	[ -s "$O/acc-ref.json" ] || [ "$ACC_N" -eq 0 ] || acc ref "$M"
	for r in $RECIPES; do
		for k in $METHODS; do
			acc "$k-$r" "$O/$k-$r.gguf"
		done
	done
fi

if on report; then
/usr/bin/python3 - "$O" "$RECIPES" <<'PY'
import json, math, os, sys
O, recipes = sys.argv[1], sys.argv[2].split()
KINDS = ('llama', 'llamai', 'mcv', 'mcvi', 'mcvk')
def tbytes(p):
    return sum(int(l.split('\t')[4]) for l in list(open(p))[1:])
def acc(name):
    p = '%s/acc-%s.json' % (O, name)
    if not os.path.exists(p):
        return None
    d = json.load(open(p))
    out = [json.loads(l)['output'] for l in open('%s/acc-%s.jsonl' % (O, name))]
    ref = [json.loads(l)['output'] for l in open('%s/acc-ref.jsonl' % O)] if os.path.exists('%s/acc-ref.jsonl' % O) else None
    same = sum(a == b for a, b in zip(out, ref)) / len(out) if ref and len(ref) == len(out) else float('nan')
    ex = sum(v['exact'] for v in d.values()) / len(d)
    cer = sum(v['cer'] for v in d.values()) / len(d)
    g = lambda t: d.get(t, {}).get('exact', float('nan'))
    return (ex, cer, g('text'), g('scene_count'), g('scene_left'), same, sum(v['n'] for v in d.values()))
rows = []
for r in recipes:
    if not os.path.exists(O + '/rec-%s.tsv' % r):
        continue
    S = tbytes(O + '/rec-%s.tsv' % r)
    n_el = sum(int(eval(l.split('\t')[1].replace('x', '*'))) for l in list(open(O + '/rec-%s.tsv' % r))[1:])
    for kind in KINDS:
        name = '%s-%s' % (kind, r)
        kp = '%s/kl-%s.tsv' % (O, name)
        if not os.path.exists(kp):
            continue
        f, k, top1, npos, fsize = open(kp).read().rstrip('\n').split('\t')
        size = S if kind.startswith('llama') else tbytes(O + '/%s.tsv' % name)
        rows.append((kind, r, size, 8.0 * size / n_el, float(k), float(top1), int(npos), acc(name)))
if not rows:
    sys.exit('bench-quant.sh: nothing to report in ' + O)
hdr = '%-7s %-7s %11s %6s %9s %7s' % ('quant', 'recipe', 'bytes', 'bpw', 'KL', 'top1')
if any(row[7] for row in rows):
    hdr += ' %6s %6s %5s %5s %5s %5s' % ('exact', 'cer', 'text', 'count', 'left', 'same')
print(hdr)
def accs(a):
    return ' %6.3f %6.3f %5.2f %5.2f %5.2f %5.2f' % a[:6] if a else ''
ra = acc('ref')
if ra:
    print('%-7s %-7s %11s %6s %9s %7s' % ('f32', '-', '-', '-', '0', '1') + accs(ra))
for kind, r, size, bpw, k, t, n, a in rows:
    print('%-7s %-7s %11d %6.3f %9.5f %7.4f' % (kind, r, size, bpw, k, t) + accs(a))
print('KL/top1 over %d positions per model' % rows[0][6] +
      ('; accuracy over %d validation samples (8 tasks)' % ra[6] if ra else ''))
def curve(kind):
    return sorted((s, k) for kd, r, s, b, k, t, n, a in rows if kd == kind)
def size_at(kind, target):
    c = curve(kind)
    for (s0, k0), (s1, k1) in zip(c, c[1:]):
        lo, hi = sorted((k0, k1))
        if lo <= target <= hi and k0 != k1:
            f = (math.log(target) - math.log(k0)) / (math.log(k1) - math.log(k0))
            return math.exp(math.log(s0) + f * (math.log(s1) - math.log(s0)))
    return None
have = {kd for kd, *_ in rows}
pairs = [p for p in (('mcv', 'llama'), ('mcvi', 'llamai'), ('mcvk', 'llamai'), ('mcvk', 'llama'))
         if p[0] in have and p[1] in have]
if pairs:
    print()
    print('KL ratio at equal size; size ratio at equal KL (llama curve interpolated log-log; "-" = outside it)')
    print('%-7s' % 'recipe' + ''.join(' %14s' % ('KL %s/%s' % p) for p in pairs) + ''.join(' %16s' % ('size %s/%s' % p) for p in pairs))
    for r in recipes:
        g = {kd: (s, k) for kd, rr, s, b, k, t, n, a in rows if rr == r}
        out = '%-7s' % r
        for a, b in pairs:
            out += ' %14s' % ('%.3f' % (g[a][1] / g[b][1]) if a in g and b in g else '-')
        for a, b in pairs:
            sz = size_at(b, g[a][1]) if a in g else None
            out += ' %16s' % ('%.3f' % (g[a][0] / sz) if sz else '-')
        print(out)
PY
fi

if [ "$PROXY" = 1 ] || [ "$STAGE" = proxy ]; then
	# Single tensors at q2_K / q3_K over an all-q8_0 model: measured KL
	# increase against the estimate of --sensitivity.
	r1=$(echo "$RECIPES" | awk '{ print $1 }')
	[ -s "$O/sens-$r1.tsv" ] && [ -s "$O/sensk-$r1.tsv" ] ||
		{ echo "bench-quant.sh: --proxy needs methods mcvi and mcvk at $r1 (--stage quant)" >&2; exit 1; }
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

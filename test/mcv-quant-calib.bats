#!/usr/bin/env bats
# mcv-quant's calibration and allocation: the importance matrix it measures
# equals sums computed independently from the residual stream (the layer
# hook, via mcv-hidden) and the router's choices, llama.cpp's imatrix loader
# reads it, and --target-bpw / --target-size / --expert-bytes-per-token
# allocations meet their budgets, beat a uniform type at equal size on the
# estimated loss, and load in llama.cpp; --probe rescales the estimates by
# measured KL.  Tiny random models from mcv-genmodel.

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	local b=${B:-build} bin=${BIN:-bin}
	case $b in /*) ;; *) b=$PWD/$b ;; esac
	case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
	export Q="$bin/mcv-quant" GEN="$b/mcv-genmodel" HID="$b/mcv-hidden"
	export D="$BATS_FILE_TMPDIR"
	if [ -x "$GEN" ]; then
		"$GEN" -q --arch qwen35moe --shape tiny --type f32 "$D/moe.gguf" >/dev/null 2>&1 || true
		"$GEN" -q --arch qwen35moe --shape tiny --type f32 --hidden 160 "$D/odd.gguf" >/dev/null 2>&1 || true
	fi
	printf '%s\n' '{"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]}' '' \
		'{"tokens": [20, 21, 22, 23, 24, 25, 26, 27]}' '{"prompt": "hello world"}' >"$D/cal.jsonl"
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$Q" ] || skip "no $Q (build first)"
	[ -s "$D/moe.gguf" ] || skip "no tiny model ($GEN missing or failed)"
	T=$BATS_TEST_TMPDIR
}

load expect
EXPECT_TOOL=mcv-quant

@test "calibration: in_sum2 of every layer's input projections equals sums over the layer hook's residuals; counts follow the router" {
	[ -x "$HID" ] || skip "no $HID"
	head -1 "$D/cal.jsonl" >"$T/one.jsonl"
	"$Q" -q --calibrate "$T/one.jsonl" --imatrix-out "$T/im.gguf" "$D/moe.gguf"
	[ ! -e "$T/o.gguf" ]
	"$HID" "$D/moe.gguf" 1,2,3,4,5,6,7,8,9,10,11,12,13,14 1 "$T/h" >/dev/null
	/usr/bin/python3 - "$D/moe.gguf" "$T/im.gguf" "$T/h/hidden.npy" <<'PY'
import sys
sys.path.insert(0, 'scripts/ref')
import numpy as np
import gguf
m, im = gguf.read(sys.argv[1]), gguf.read(sys.argv[2])
hid = np.load(sys.argv[3]).astype(np.float64)
toks = np.arange(1, 15)
arch = m.kv['general.architecture']
eps = float(m.kv[arch + '.attention.layer_norm_rms_epsilon'])
k = int(m.kv[arch + '.expert_used_count'])
T = len(toks)
assert im.kv['general.type'] == 'imatrix', im.kv
def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
emb = m.tensors['token_embd.weight'].astype(np.float64)
checked = 0
for L in range(int(m.kv[arch + '.block_count'])):
    h = emb[toks] if L == 0 else hid[L - 1]
    x = rms(h, m.tensors['blk.%d.attn_norm.weight' % L].astype(np.float64))
    want = (x * x).sum(0)
    for t in ('attn_qkv', 'attn_gate', 'ssm_alpha', 'ssm_beta', 'attn_q', 'attn_k', 'attn_v'):
        name = 'blk.%d.%s.weight' % (L, t)
        if name not in m.tensors:
            continue
        got = im.tensors[name + '.in_sum2'].reshape(-1)
        cnt = im.tensors[name + '.counts'].reshape(-1)
        assert cnt.tolist() == [T], (name, cnt)
        err = np.abs(got - want).max() / want.max()
        assert err < 1e-4, (name, err)
        checked += 1
    # the router sends each token to k experts; the shared expert sees all
    c = im.tensors['blk.%d.ffn_gate_exps.weight.counts' % L].reshape(-1)
    assert c.sum() == T * k and (c >= 0).all() and (c <= T).all(), (L, c)
    assert (im.tensors['blk.%d.ffn_up_exps.weight.counts' % L].reshape(-1) == c).all()
    assert im.tensors['blk.%d.ffn_down_exps.weight.counts' % L].reshape(-1).sum() == T * k
    assert im.tensors['blk.%d.ffn_gate_shexp.weight.counts' % L].reshape(-1).tolist() == [T]
    # an expert the router never chose has no sums
    s = im.tensors['blk.%d.ffn_gate_exps.weight.in_sum2' % L]
    assert ((s.sum(1) == 0) == (c == 0)).all()
assert checked >= 4, checked
print('checked', checked)
PY
}

@test "calibration output is a llama.cpp imatrix: llama_model_quantize-equivalent use and llama.cpp's own loader" {
	"$Q" -q --calibrate "$D/cal.jsonl" --imatrix-out "$T/im.gguf" "$D/moe.gguf"
	# reused with --imatrix, and the importance changes the low-bit output
	"$Q" -q --recipe q2_k --imatrix "$T/im.gguf" "$D/moe.gguf" "$T/a.gguf"
	"$Q" -q --recipe q2_k "$D/moe.gguf" "$T/b.gguf"
	! cmp -s "$T/a.gguf" "$T/b.gguf"
	# in one run: calibrate, then quantize with it
	"$Q" -q --recipe q2_k --calibrate "$D/cal.jsonl" --imatrix-out "$T/im2.gguf" "$D/moe.gguf" "$T/c.gguf"
	cmp "$T/a.gguf" "$T/c.gguf"
	# llama.cpp's common_imatrix_load (libllama-common) reads it
	local lib=scripts/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
	[ -f "$lib/libllama-common.so" ] || skip "peer absent"
	command -v g++ >/dev/null || skip "no g++ to call the C++ loader"
	cat >"$T/load.cpp" <<'CPP'
// The loader's declarations as llama.cpp's common/imatrix-loader.h has them.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>
struct common_imatrix_entry { std::vector<float> sums; std::vector<int64_t> counts; };
struct common_imatrix {
	std::map<std::string, common_imatrix_entry> entries;
	std::vector<std::string> datasets;
	int32_t chunk_count = 0, chunk_size = 0;
	bool is_legacy = false, has_metadata = false;
};
bool common_imatrix_load(const std::string &fname, common_imatrix &imatrix);
int main(int, char **argv)
{
	common_imatrix im;
	if (!common_imatrix_load(argv[1], im))
		return 1;
	for (auto &e : im.entries) {
		long long c = 0;
		double s = 0;
		for (auto v : e.second.counts) c += v;
		for (auto v : e.second.sums) s += v;
		std::printf("%s %zu %lld %.6g\n", e.first.c_str(), e.second.sums.size(), c, s);
	}
	return im.is_legacy ? 1 : 0;
}
CPP
	g++ -o "$T/load" "$T/load.cpp" -L"$lib" -l:libllama-common.so -Wl,-rpath,"$PWD/$lib" 2>"$T/cc.err" ||
		skip "cannot link the peer's libllama-common: $(head -1 "$T/cc.err")"
	"$T/load" "$T/im.gguf" >"$T/peer.txt"
	[ "$(wc -l <"$T/peer.txt")" -gt 20 ]
	/usr/bin/python3 - "$T/im.gguf" "$T/peer.txt" <<'PY'
import sys
sys.path.insert(0, 'scripts/ref')
import gguf
im = gguf.read(sys.argv[1])
seen = 0
for line in open(sys.argv[2]):
    name, n, c, s = line.split()
    a = im.tensors[name + '.in_sum2']
    assert int(n) == a.size, (name, n, a.size)
    assert int(c) == round(float(im.tensors[name + '.counts'].sum())), (name, c)
    assert abs(float(s) - float(a.astype('float64').sum())) <= 1e-4 * abs(float(s)) + 1e-6, (name, s)
    seen += 1
assert seen * 2 == len(im.tensors), (seen, len(im.tensors))
PY
}

@test "allocation: meets --target-bpw and --expert-bytes-per-token, beats uniform q4_K at equal size on estimated loss, llama.cpp loads it" {
	"$Q" -q --calibrate "$D/cal.jsonl" --imatrix-out "$T/im.gguf" "$D/moe.gguf"
	"$Q" --target-bpw 4.0 --imatrix "$T/im.gguf" --report "$T/r.tsv" --sensitivity "$T/s.tsv" \
		"$D/moe.gguf" "$T/a.gguf" 2>"$T/err"
	grep -q 'est_loss' "$T/err"              # the table on stderr
	grep -q '^mcv-quant: allocated' "$T/err"
	/usr/bin/python3 - "$T/r.tsv" "$T/s.tsv" "$T/a.gguf" <<'PY'
import os, sys
rows = [l.rstrip('\n').split('\t') for l in list(open(sys.argv[1]))[1:]]
n_el = sum(eval(r[1].replace('x', '*')) for r in rows)
tot = sum(int(r[4]) for r in rows)
assert 8 * tot / n_el <= 4.0, 8 * tot / n_el
assert tot < os.path.getsize(sys.argv[3])
types = {r[2] for r in rows if r[5] != '-'}
assert len(types) >= 2, types            # really mixed
# uniform q4_K (q5_0 where rows do not fit) at its own size, vs the
# allocation at that size: both from the same --sensitivity estimates
sens = {}
for l in list(open(sys.argv[2]))[1:]:
    t, ty, b, e = l.rstrip('\n').split('\t')
    sens.setdefault(t, {})[ty] = (float(b), float(e))
uni_b = sum(min((v for k, v in d.items() if k in ('q4_K', 'q5_0')), key=lambda x: x[0])[0] for d in sens.values())
uni_l = sum(min((v for k, v in d.items() if k in ('q4_K', 'q5_0')), key=lambda x: x[0])[1] for d in sens.values())
fixed = sum(int(r[4]) for r in rows if r[5] == '-')
open(sys.argv[1] + '.budget', 'w').write('%d %.9g\n' % (fixed + uni_b, uni_l))
PY
	read -r budget uni_loss <"$T/r.tsv.budget"
	"$Q" -q --target-size "$budget" --imatrix "$T/im.gguf" --report "$T/r2.tsv" "$D/moe.gguf" "$T/b.gguf"
	awk -F'\t' -v b="$budget" -v u="$uni_loss" 'NR > 1 { s += $5; if ($6 != "-") l += $6 }
		END { if (s > b) { print "size " s " > " b; exit 1 }
		      if (l >= u) { print "loss " l " not below uniform " u; exit 1 } }' "$T/r2.tsv"
	# a budget on the bytes each token reads from experts: what the 4-bpw
	# allocation reads, imposed on a 6-bpw one (which alone reads more)
	cat >"$T/eb.py" <<'PY'
import sys
sys.path.insert(0, 'scripts/ref')
import gguf
m = gguf.read(sys.argv[1], load=False)
a = m.kv['general.architecture']
k, E = m.kv[a + '.expert_used_count'], m.kv[a + '.expert_count']
eb = 0
for l in list(open(sys.argv[2]))[1:]:
    r = l.split('\t')
    if '_exps.' in r[0]:
        eb += int(r[4]) * k / E
    elif '_shexp.' in r[0]:
        eb += int(r[4])
print(int(eb))
PY
	eb4=$(/usr/bin/python3 "$T/eb.py" "$D/moe.gguf" "$T/r.tsv")
	"$Q" -q --target-bpw 6 --report "$T/r6.tsv" "$D/moe.gguf" "$T/d.gguf"
	eb6=$(/usr/bin/python3 "$T/eb.py" "$D/moe.gguf" "$T/r6.tsv")
	[ "$eb6" -gt "$eb4" ]
	"$Q" -q --target-bpw 6 --expert-bytes-per-token "$eb4" --report "$T/r3.tsv" "$D/moe.gguf" "$T/c.gguf"
	eb=$(/usr/bin/python3 "$T/eb.py" "$D/moe.gguf" "$T/r3.tsv")
	[ "$eb" -le "$eb4" ]
	command -v node >/dev/null || skip "no node"
	[ -f scripts/peer/node_modules/node-llama-cpp/package.json ] || skip "no peer"
	for f in a b c; do
		node scripts/peer/run.mjs --model "$T/$f.gguf" --tokens 1,2,3 -n 2 --threads 2 >/dev/null
	done
}

@test "allocation on rows that are not a multiple of 256 uses the 32-element fallbacks; llama.cpp loads it" {
	[ -s "$D/odd.gguf" ] || skip "no odd-shaped model"
	"$Q" -q --target-bpw 5 --report "$T/r.tsv" "$D/odd.gguf" "$T/a.gguf"
	! awk -F'\t' 'NR > 1 && $6 != "-" { print $3 }' "$T/r.tsv" | grep -q '_K'
	command -v node >/dev/null || skip "no node"
	[ -f scripts/peer/node_modules/node-llama-cpp/package.json ] || skip "no peer"
	node scripts/peer/run.mjs --model "$T/a.gguf" --tokens 1,2,3 -n 2 --threads 2 >/dev/null
}

@test "--probe: estimates rescaled per tensor by single-tensor KL; the written tensors come from the untouched input" {
	"$Q" -q --target-bpw 4.5 --sensitivity "$T/s0.tsv" "$D/moe.gguf" "$T/a.gguf"
	"$Q" -q --target-bpw 4.5 --probe "$D/cal.jsonl" --probe-lines 2 --probe-tensors 6 \
		--sensitivity "$T/s1.tsv" --report "$T/r.tsv" "$D/moe.gguf" "$T/b.gguf"
	# same candidates and bytes; losses rescaled per tensor (ratios differ)
	paste "$T/s0.tsv" "$T/s1.tsv" | awk -F'\t' 'NR > 1 {
		if ($1 != $5 || $2 != $6 || $3 != $7) { print "rows differ: " $0; exit 1 }
		if ($4 > 0) r[$8 / $4] = 1 }
		END { n = 0; for (k in r) n++; if (n < 3) { print "not rescaled per tensor"; exit 1 } }'
	# the written tensors are the input's, whatever the probes did to their
	# private copy: the same types forced by --type give the same file
	ov=$(awk -F'\t' 'NR > 1 && $6 != "-" { printf " --type ^%s$=%s", $1, $3 }' "$T/r.tsv")
	# shellcheck disable=SC2086
	"$Q" -q $ov "$D/moe.gguf" "$T/c.gguf"
	cmp "$T/b.gguf" "$T/c.gguf"
	"$GEN" -q --arch qwen35moe --shape tiny --type q8_0 "$T/q8.gguf"
	expect 1 "$Q" --target-bpw 6 --probe "$D/cal.jsonl" --probe-lines 1 "$T/q8.gguf" "$T/o.gguf"
	grep -q 'F32, F16 or BF16' "$T/err"
	[ ! -e "$T/o.gguf" ]
}

@test "targets that cannot be met, bad calibration data and bad usage: one line, nothing written" {
	expect 1 "$Q" --target-size 1K "$D/moe.gguf" "$T/o.gguf"
	grep -q 'cannot be met' "$T/err"
	expect 1 "$Q" --target-bpw 6 --expert-bytes-per-token 10 "$D/moe.gguf" "$T/o.gguf"
	grep -q 'cannot be met' "$T/err"
	printf '{"tokens": [1, 2]}\n{"prompt": 3}\n' >"$T/bad.jsonl"
	expect 1 "$Q" --calibrate "$T/bad.jsonl" --imatrix-out "$T/im.gguf" "$D/moe.gguf" "$T/o.gguf"
	grep -q 'bad.jsonl:2' "$T/err"
	printf '{"tokens": [1, 999999]}\n' >"$T/bad2.jsonl"
	expect 1 "$Q" --calibrate "$T/bad2.jsonl" --imatrix-out "$T/im.gguf" "$D/moe.gguf"
	grep -q 'not a valid id' "$T/err"
	printf '{"tokens": [1, 2' >"$T/bad3.jsonl"
	expect 1 "$Q" --calibrate "$T/bad3.jsonl" --imatrix-out "$T/im.gguf" "$D/moe.gguf"
	expect 1 "$Q" --calibrate "$T/missing.jsonl" --imatrix-out "$T/im.gguf" "$D/moe.gguf"
	expect 2 "$Q" --calibrate "$D/cal.jsonl" "$D/moe.gguf"
	expect 2 "$Q" --target-bpw 4 --target-size 1M "$D/moe.gguf" "$T/o.gguf"
	expect 2 "$Q" --target-bpw x "$D/moe.gguf" "$T/o.gguf"
	[ -z "$(ls "$T" | grep -e 'o.gguf' -e 'im.gguf')" ]
}

#!/usr/bin/env bats
# The training-only fast paths of the PyTorch reference (model.set_fast_training,
# train.py --fast on) give the reference forward's loss and gradients on a real
# training batch, and the check that says so fails when the fast path is broken.
# Needs Debian's /usr/bin/python3 with torch.

PY=/usr/bin/python3

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	$PY -c 'import torch' 2>/dev/null || skip "no torch in $PY (apt install python3-torch)"
	export OPENBLAS_NUM_THREADS=1
}

# term_when LOG PATTERN PID: once LOG has a line matching PATTERN (or after 90 s), SIGTERM
# the job PID and wait for it (a long training run stopped by a signal still saves)
term_when() {
	for _ in $(seq 900); do grep -q "$2" "$1" && break; sleep 0.1; done
	kill -TERM "$3"
	wait "$3"
}

teardown() {
	# training checkpoints of the full-size proving model are 435 MB each
	rm -rf "$BATS_TEST_TMPDIR/vrun" "$BATS_TEST_TMPDIR/rrun" "$BATS_TEST_TMPDIR/crun" "$BATS_TEST_TMPDIR/drun"
}

@test "fast training path: loss and gradients equal the reference (float64 1e-9, float32 as accurate)" {
	run $PY scripts/ref/check_train_fast.py --samples 4
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"float64 fast vs reference"* ]]
	[[ "$output" == *ok ]]
}

@test "fast training path check fails on a wrong expert, a lost DeltaNet state, a missing router gradient" {
	for m in expert deltanet router-grad; do
		run $PY scripts/ref/check_train_fast.py --dtype float64 --samples 2 --mutate $m
		echo "$m: $output"
		[ "$status" -eq 1 ]
		[[ "$output" == *FAIL* ]]
	done
}

@test "train.py --bench runs the fast path and the reference path" {
	for f in on off; do
		run $PY scripts/ref/train.py --bench --bench-steps 1 --out "$BATS_TEST_TMPDIR/run" --threads 1 --pool 8 \
			--tokens 512 --probe 0.3 --fast $f
		echo "$output"
		[ "$status" -eq 0 ]
		[[ "$output" == *"bench: 1 steps"* ]]
	done
}

@test "aux_load_floor: 0 when every expert has its share, it raises a starved expert's router logit; train.py --aux-floor logs it" {
	run $PY - <<'PYEOF'
import math, sys, torch
sys.path.insert(0, 'scripts/ref')
from model import aux_load_floor
E = 64
even = [dict(probs=torch.full((10, E), 1 / E))]
assert float(aux_load_floor(even, E)) == 0.0
logits = torch.zeros(10, E)
logits[:, 5] = -6.0                       # expert 5 starved: p ~ 4e-5, far below 0.5/64
logits.requires_grad_(True)
fl = aux_load_floor([dict(probs=logits.softmax(-1))], E)
p5 = float(logits.softmax(-1)[0, 5])
assert abs(float(fl) - (math.log(0.5 / E) - math.log(p5))) < 1e-4, (float(fl), p5)
fl.backward()
g = logits.grad
assert (g[:, 5] < 0).all() and (g[:, [i for i in range(E) if i != 5]] >= 0).all(), g[0]
# masked-out tokens do not count
st = [dict(probs=torch.cat([torch.full((4, E), 1 / E), logits.detach().softmax(-1)]))]
assert float(aux_load_floor(st, E, mask=torch.tensor([True] * 4 + [False] * 10))) == 0.0
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	T="$BATS_TEST_TMPDIR/frun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 2 --threads 1 --pool 4 --tokens 512 --task-weights text=1 \
		--aux-floor 1 --log-every 2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"step 2 loss "*" aux "*" floor "* ]]
	rm -rf "$T"
}

@test "train_vision.py: a tower-only stage changes the tower and heads, never the language model or the sample counter" {
	T="$BATS_TEST_TMPDIR/vrun"
	run $PY scripts/ref/train_vision.py --run "$T" --minutes 0.01
	[ "$status" -ne 0 ]
	[[ "$output" == *"no ckpt-"* ]]
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 8 --tokens 512 \
		--probe 0.3 --probe-sub 0.3 --task-weights snippet_read=1,scene_caption=1
	echo "$output"
	[ "$status" -eq 0 ]
	# a digest of the checkpoint, not a copy: the full-size checkpoint is 435 MB
	cat >"$BATS_TEST_TMPDIR/digest.py" <<'PYEOF'
import glob, hashlib, json, sys, torch
cks = glob.glob(sys.argv[1] + '/ckpt-*.pt')
assert len(cks) == 1, cks           # written back under the same step
d = torch.load(cks[0], map_location='cpu')
h = lambda t: hashlib.sha1(t.numpy().tobytes()).hexdigest()
print(json.dumps(dict(model={k: h(v) for k, v in d['model'].items()}, probe=h(d['probe']['weight']),
                      state={k: d['state'].get(k) for k in ('step', 'sample', 'vision_stages')})))
PYEOF
	$PY "$BATS_TEST_TMPDIR/digest.py" "$T" >"$BATS_TEST_TMPDIR/before.json"
	run $PY scripts/ref/train_vision.py --run "$T" --minutes 0.02 --batch 2 --threads 1
	echo "$output"
	[ "$status" -eq 0 ]
	$PY "$BATS_TEST_TMPDIR/digest.py" "$T" >"$BATS_TEST_TMPDIR/after.json"
	run $PY - "$BATS_TEST_TMPDIR/before.json" "$BATS_TEST_TMPDIR/after.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
text = [k for k in a['model'] if k.startswith('text.')]
vis = [k for k in a['model'] if k.startswith('vision.')]
assert text and vis
assert all(a['model'][k] == b['model'][k] for k in text), 'language model changed'
assert sum(a['model'][k] != b['model'][k] for k in vis) > len(vis) // 2, 'tower unchanged'
assert a['probe'] != b['probe'], 'probe head unchanged'
assert a['state']['sample'] == b['state']['sample'] and a['state']['step'] == b['state']['step']
st = b['state']['vision_stages']
assert a['state']['vision_stages'] is None and len(st) == 1 and st[0]['samples'] > 0, st
print('ok')
PYEOF
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *ok ]]
}

@test "train.py --rope-base on resume: the checkpoints' config carries the new base and the state records when" {
	T="$BATS_TEST_TMPDIR/rrun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1
	[ "$status" -eq 0 ]
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1 \
		--rope-base 200
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"RoPE base 1e+06 -> 200 at step 1"* ]]
	run $PY - "$T" <<'PYEOF'
import glob, sys, torch
d = torch.load(sorted(glob.glob(sys.argv[1] + '/ckpt-*.pt'))[-1], map_location='cpu')
assert d['config']['text']['rope_base'] == 200.0, d['config']['text']
assert d['state']['rope_base_changes'] == [(1, 1e6, 200.0)], d['state']
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
}

@test "train.py --dense: the patch-level glyph head trains the tower, is checkpointed and resumed" {
	T="$BATS_TEST_TMPDIR/drun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 \
		--task-weights text=1 --dense 2 --log-every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"dense glyph crops 2 a step"* ]]
	[[ "$output" == *" dense "[0-9]* ]]
	cat >"$BATS_TEST_TMPDIR/dense.py" <<'PYEOF'
import glob, hashlib, json, sys, torch
d = torch.load(sorted(glob.glob(sys.argv[1] + '/ckpt-*.pt'))[-1], map_location='cpu')
h = lambda t: hashlib.sha1(t.numpy().tobytes()).hexdigest()
print(json.dumps(dict(head=h(d['dense']['weight']), head_zero=bool((d['dense']['weight'] == 0).all()),
                      opt=int(d['dense_opt']['state'][0]['step']),
                      tower=h(d['model']['vision.layers.0.q.weight']), step=d['state']['step'])))
PYEOF
	$PY "$BATS_TEST_TMPDIR/dense.py" "$T" >"$BATS_TEST_TMPDIR/a.json"
	# text-only samples: without --dense the tower would get no gradient at all
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 \
		--task-weights text=1 --dense 2 --dense-tol 2
	[ "$status" -eq 0 ]
	[[ "$output" == *"edge tolerance 2.0 px"* ]]
	$PY "$BATS_TEST_TMPDIR/dense.py" "$T" >"$BATS_TEST_TMPDIR/b.json"
	run $PY - "$BATS_TEST_TMPDIR/a.json" "$BATS_TEST_TMPDIR/b.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert not a['head_zero'] and a['opt'] == 1, a      # the head left its zero start
assert b['step'] == a['step'] + 1 and b['opt'] == 2, b   # the resume went on with the saved head and Adam state
assert a['head'] != b['head'] and a['tower'] != b['tower'], (a, b)
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
}

@test "train_vision.py --dense: dense crops train the patch head and are recorded; --mix takes image tasks only" {
	T="$BATS_TEST_TMPDIR/vdrun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 \
		--probe 0.3 --probe-sub 0.3 --task-weights scene_caption=1
	[ "$status" -eq 0 ]
	run $PY scripts/ref/train_vision.py --run "$T" --minutes 0.01 --mix text=1
	[ "$status" -ne 0 ]
	[[ "$output" == *"--mix: not an image task: text"* ]]
	run $PY scripts/ref/train_vision.py --run "$T" --minutes 0.02 --batch 1 --dense 2 --threads 1 --mix scene_count=1
	echo "$output"
	[ "$status" -eq 0 ]
	run $PY - "$T" <<'PYEOF'
import glob, sys, torch
d = torch.load(glob.glob(sys.argv[1] + '/ckpt-*.pt')[0], map_location='cpu')
st = d['state']['vision_stages'][-1]
assert st['dense_crops'] == 2 * st['steps'] > 0 and st['mix'] == {'scene_count': 1.0}, st
assert not (d['dense']['weight'] == 0).all()     # the head moved off its zero start
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
}

@test "oracle_read.py: oracle rows hold exactly the tokens with glyphs; it trains and reports; bad tasks are one line" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, bpe, synth
from model import VisionConfig
from oracle_read import Oracle, encode, oracle_feats
vc, tok = VisionConfig(), bpe.default()
o = Oracle(256, 1.0)
for i in range(4):
    m = []
    s = synth.sample('val', i, task='word_read', marks=m)
    for mg in (4, 2):
        sq = encode(tok, vc, dict(s, marks=m), mg)
        f = oracle_feats(o, vc, [sq])[(0, 0)]
        assert f.shape[0] == (224 // (14 * mg)) ** 2
        want = sorted({ti for ti, _, _ in sq['cells'][0]})
        assert torch.nonzero(f.abs().sum(1)).flatten().tolist() == want, (s['answer'], want)
# oracle_spaced.py: one glyph per 4x token, in reading order
import random, probe, oracle_spaced
for i in range(20):
    m = []
    img, _, text = oracle_spaced.word_sample(random.Random(i), random.Random(-i), m)
    cells = probe.crop_cells(m, img.size, vc, 2)[0]
    assert ''.join(c for _, _, c in m) == text and len({ti for ti, _ in cells}) == len(text), (text, cells)
    assert [ti for ti, _ in cells] == sorted(ti for ti, _ in cells)
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	T="$BATS_TEST_TMPDIR/orun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1
	[ "$status" -eq 0 ]
	C=$(ls "$T"/ckpt-*.pt)
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats oracle --tasks word_read --minutes 0.01 --n 1 --batch 2 --every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"oracle step 0 (0 samples"*"word_read@16x "*"word_read@4x "* ]]
	[[ "$output" == *"oracle step 1 (2 samples"* ]]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats oracle --tasks scene_caption
	[ "$status" -ne 0 ]
	[ "$output" = "oracle_read: --feats oracle is for reading tasks" ]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats labels --tasks word_read,scene_caption
	[ "$status" -ne 0 ]
	[ "$output" = "oracle_read: scene_caption: want reading tasks or scene tasks, not both" ]
	# the label oracle: one row per token holding a shape's centre, the sum of its labels' vectors
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, bpe, synth
from model import VisionConfig
from oracle_read import LabelOracle, encode, oracle_feats
vc, tok = VisionConfig(), bpe.default()
o = LabelOracle(256, 1.0)
for i in range(4):
    m = []
    s = synth.sample('val', i, task='scene_caption', marks=m)
    for mg in (4, 2):
        f = oracle_feats(o, vc, [encode(tok, vc, dict(s, marks=m), mg)])[(0, 0)]
        cell = 14 * mg
        want = sorted({int(y // cell) * (224 // cell) + int(x // cell) for x, y, _ in m})
        assert torch.nonzero(f.abs().sum(1)).flatten().tolist() == want, (s['answer'], want)
        x, y, (_, colour, shape, size) = m[0]
        ids = synth.mark_labels(m[0][2])
        assert {f'colour:{colour}', f'shape:{shape}', f'size:{size}'} <= {synth.MARK_LABELS[k] for k in ids}
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats labels --tasks scene_caption --minutes 0.01 --n 1 --batch 2 --every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"labels step 1 (2 samples"*"scene_caption@4x "*"(answer CE / colour+shape word CE)" ]]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats tower --distill 1 --digits 2 --tasks word_read \
		--minutes 0.01 --n 1 --batch 2 --every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"distill loss "[0-9]* ]]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats oracle --distill 1
	[ "$status" -ne 0 ]
	[ "$output" = "oracle_read: --distill trains the tower: give --feats tower" ]
	rm -rf "$T"
}

@test "guide.py: targets are the image tokens of the glyph read and the glyph next; the loss is 0 on them" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, bpe, chatfmt, guide, probe, synth
from model import MiniCPMV, TextConfig, VisionConfig
vc, tok = VisionConfig(), bpe.default()
m = []
s = synth.sample('val', 3, task='word_read', marks=m)
ans = s['answer']
for mg in (4, 2):
    sq = chatfmt.encode_sample(tok, s, vc, mg)
    cur, nxt = guide.targets(tok, sq, m, vc, mg, s['image'].size)
    lab = [t for t, l in enumerate(sq['labels']) if l >= 0]
    # every answer token with a glyph has a target, in the image span, and nxt is cur one step earlier
    glyph_toks = [t for t in lab if tok.decode([sq['labels'][t]], special=False).strip()]
    assert [t for t, _ in cur] == glyph_toks, (ans, cur, glyph_toks)
    assert [(t - 1, p) for t, p in cur] == nxt
    start = sq['img_spans'][0][0]
    cells = probe.crop_cells(m, s['image'].size, vc, mg)[0]
    assert cur[0][1][0] == start + cells[0][0]      # the first glyph's overview token
# the loss: ~0 when the head looks only there, large when it looks elsewhere
model = MiniCPMV(TextConfig(vocab=len(tok.tokens)), vc)
layers = guide.attention_layers(model)
T = len(sq['ids'])
for where, want in (('on', lambda l: l < 1e-4), ('off', lambda l: l > 5)):
    for a in layers:
        a.last_att = torch.zeros(1, model.tc.n_head, T, T)
    for a, tg in ((layers[0], cur), (layers[-1], nxt)):
        for t, pos in tg:
            if where == 'on':
                a.last_att[0, 0, t, pos] = 1.0 / len(pos)
            else:
                a.last_att[0, 0, t, 0] = 1.0
    l = float(guide.loss(model, [(cur, nxt)]))
    assert want(l), (where, l)
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	T="$BATS_TEST_TMPDIR/grun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 2048 \
		--task-weights word_read=1 --guide 1 --log-every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"guided reading attention, weight 1.0"* ]]
	[[ "$output" == *"step 1 loss "*" guide "[0-9]* ]]
	rm -rf "$T"
}

@test "glyph_rate.py: reports the head's patch recall as crops go by; a missing checkpoint is one line" {
	run $PY scripts/ref/glyph_rate.py --mlp --minutes 0.02 --every 1 --batch 2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"mlp, dense crops, lr 0.001: recall 0."*" at 0 crops"* ]]
	[[ "$output" == *"mlp: recall 0."*" at 2 crops"* ]]
	run $PY scripts/ref/glyph_rate.py --ckpt "$BATS_TEST_TMPDIR/none.pt"
	[ "$status" -ne 0 ]
	[ "$output" = "glyph_rate: $BATS_TEST_TMPDIR/none.pt: no such file" ]
}

@test "glyph_rate.py --zoom: the enlarged crop's glyph targets sit on its ink; --zoom 1 is the dense crop; a bad factor is one line" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch
from model import VisionConfig
import glyph_rate, train
vc = VisionConfig()
px1, t1 = train.dense_crop(vc, 'val', 3)
pz1, tz1 = glyph_rate.zoomed_dense_crop(1)(vc, 'val', 3)
assert torch.equal(t1, tz1) and torch.allclose(px1, pz1), 'zoom 1 differs from the dense crop'
for i in range(4):
    px, t = glyph_rate.zoomed_dense_crop(2)(vc, 'val', i)
    # each patch's pixel spread: glyphs make ink, empty paper does not
    spread = px.unfold(1, 14, 14).unfold(2, 14, 14).reshape(3, 16 * 16, -1).std(-1).mean(0)
    held = t.sum(-1) > 0
    assert held.sum() >= 3, f'crop {i}: only {int(held.sum())} patches hold a glyph'
    inked, empty = float(spread[held].mean()), float(spread[~held].mean())
    print(i, int(held.sum()), round(inked, 3), round(empty, 3))
    assert inked > 1.5 * empty, f'crop {i}: targets off the ink ({inked:.3f} against {empty:.3f})'
print('ok')
PYEOF
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *ok ]]
	run $PY scripts/ref/glyph_rate.py --zoom 0.5
	[ "$status" -ne 0 ]
	[ "$output" = "glyph_rate: --zoom takes a factor >= 1, with --data dense" ]
}

@test "train.py --shape: a softmax over the shape labels at each shape's token; refused without --probe" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, synth, probe
from model import VisionConfig
vc = VisionConfig()
L = synth.MARK_LABELS
ids = torch.tensor([L.index(f'shape:{k}') for k in synth.SHAPES])
for i in range(10):
    m = []
    s = synth.sample('val', i, task='scene_caption', marks=m)
    for mg in (4, 2):
        tg = probe.shape_targets(m, s['image'].size, vc, mg, synth.SHAPES)
        # every shape of the overview once, with its class
        assert sorted(y for _, y in tg[0]) == sorted(synth.SHAPES.index(w[2]) for _, _, w in m if not isinstance(w, str))
        # --shape-extent: the centre tokens and more, each with the class of a shape there
        ext = probe.shape_targets(m, s['image'].size, vc, mg, synth.SHAPES, {k: lo for k, (lo, _) in synth.SIZES.items()})
        assert set(tg[0]) <= set(ext[0]) and {y for _, y in ext[0]} == {y for _, y in tg[0]}
        if mg == 2 and any(w[3] == 'large' for _, _, w in m if not isinstance(w, str)):
            assert len(ext[0]) > len(tg[0])      # a large shape spans several 28-px tokens
        n = (tg and max(ti for ti, _ in tg[0]) + 1) or 1
        # a head that reads the class from a one-hot row: near-zero loss; a constant one: ln 5
        feats = {(0, 0): torch.zeros(n, len(L))}
        for ti, y in tg[0]:
            feats[(0, 0)][ti, ids[y]] = 1.0
        head = torch.nn.Linear(len(L), len(L))
        with torch.no_grad():
            head.weight.copy_(torch.eye(len(L)) * 40.0); head.bias.zero_()
        seqs = [dict(shapes=tg[:1])]
        assert float(probe.shape_loss(head, feats, seqs, ids)) < 0.01
        with torch.no_grad():
            head.weight.zero_()
        assert abs(float(probe.shape_loss(head, feats, seqs, ids)) - torch.log(torch.tensor(5.0))) < 1e-4
assert probe.shape_loss(head, {}, [dict(shapes=None)], ids) is None
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	T="$BATS_TEST_TMPDIR/shrun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 1024 \
		--task-weights scene_caption=1 --probe 0.3 --shape 1 --shape-extent --log-every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"shape loss weight 1.0, every token a shape covers"* ]]
	[[ "$output" == *" shape "[0-9]* ]]
	rm -rf "$T"
	run $PY scripts/ref/train.py --out "$T" --shape 1
	[ "$status" -ne 0 ]
	[[ "$output" == *"--shape needs --probe"* ]]
}

@test "train.py --pos: the token position head trains on every image crop, is checkpointed and resumed" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, probe
# targets: (column, row) in [-1, 1], row-major; a head that cannot see them scores their variance
head = torch.nn.Linear(8, 2)
with torch.no_grad():
    head.weight.zero_(); head.bias.zero_()
crop = torch.zeros(3, 112, 168)               # 4x: 14*2 = 28 px a token -> 6 x 4 tokens
feats = {(0, 0): torch.randn(24, 8)}
l = probe.pos_loss(head, feats, [dict(crops=[crop], merge=2)])
cols = torch.linspace(-1, 1, 6).repeat(4)
rows = torch.linspace(-1, 1, 4).repeat_interleave(6)
assert abs(float(l) - float((cols ** 2 + rows ** 2).mean() / 2)) < 1e-6, float(l)
assert probe.pos_loss(head, {}, [dict(crops=[], merge=2)]) is None
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	T="$BATS_TEST_TMPDIR/posrun"
	for i in 1 2; do
		run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 1024 \
			--task-weights scene_count=1 --pos 1 --log-every 1
		echo "$output"
		[ "$status" -eq 0 ]
		[[ "$output" == *"token position head weight 1"* ]]
		[[ "$output" == *" pos "[0-9]* ]]
	done
	run $PY - "$T" <<'PYEOF'
import glob, sys, torch
d = torch.load(sorted(glob.glob(sys.argv[1] + '/ckpt-*.pt'))[-1], map_location='cpu')
assert d['state']['step'] == 2 and int(d['pos_opt']['state'][0]['step']) == 2, d['state']
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	rm -rf "$T"
}

@test "train.py is deterministic on one thread: two steps at once equal one step, a resume and one more, bit for bit" {
	# what makes a recipe replay reproduce its model: the samples, tasks and
	# batches are functions of the sample counter, the rest is seeded
	T="$BATS_TEST_TMPDIR/drun"
	opts="--threads 1 --pool 4 --tokens 512 --task-weights text=1,scene_count=1 --warmup 1 --log-every 1"
	run $PY scripts/ref/train.py --out "$T/a" --max-steps-this-run 2 $opts
	[ "$status" -eq 0 ]
	run $PY scripts/ref/train.py --out "$T/b" --max-steps-this-run 1 $opts
	[ "$status" -eq 0 ]
	cp "$T"/b/ckpt-0000001.pt "$T/b1.pt"
	run $PY scripts/ref/train.py --out "$T/b" --max-steps-this-run 1 $opts
	echo "$output"
	[ "$status" -eq 0 ]
	run $PY - "$T" <<'PYEOF'
import sys, torch
t = sys.argv[1]
a, b, b1 = (torch.load(f'{t}/{n}', map_location='cpu') for n in ('a/ckpt-0000002.pt', 'b/ckpt-0000002.pt', 'b1.pt'))
assert a['state']['sample'] == b['state']['sample'] > b1['state']['sample'], 'the sample counter'
for n, w in a['model'].items():
    assert torch.equal(w, b['model'][n]), f'{n} differs after a resume'
assert any(not torch.equal(w, b1['model'][n]) for n, w in a['model'].items()), 'the second step changed nothing'
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
}

@test "compact.py: a committable checkpoint (int8 rows, no Adam moments); train.py resumes from it with a rate ramp" {
	T="$BATS_TEST_TMPDIR/crun"
	run $PY scripts/ref/compact.py "$T/missing.pt" "$T/c.pt"
	[ "$status" -ne 0 ]
	[[ "$output" == "compact: $T/missing.pt: "* ]]
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 2 --threads 1 --pool 4 --tokens 512 \
		--task-weights text=1,scene_count=1 --probe 0.3 --warmup 1
	[ "$status" -eq 0 ]
	full=$(ls "$T"/ckpt-*.pt)
	run $PY scripts/ref/compact.py "$full" "$BATS_TEST_TMPDIR/c.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	# float32 weights and two moments: 12 bytes a parameter; int8 rows: 1 and a scale
	[ "$(stat -c %s "$BATS_TEST_TMPDIR/c.pt")" -lt $(($(stat -c %s "$full") / 10)) ]
	run $PY - "$full" "$BATS_TEST_TMPDIR/c.pt" <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref')
import torch, compact
f, c = torch.load(sys.argv[1], map_location='cpu'), compact.load(sys.argv[2])
for key in ('model', 'probe'):
    for n, t in f[key].items():
        u = c[key][n]
        assert u.dtype == torch.float32 and u.shape == t.shape, n
        # a row's error is at most half its step, absmax / 254, plus the float16 scale's rounding (2^-11)
        bound = t.abs().reshape(t.shape[0], -1).amax(1) / 200 if t.dim() > 1 else t.abs() / 1000
        err = (u - t).abs().reshape(t.shape[0], -1).amax(1) if t.dim() > 1 else (u - t).abs()
        assert (err <= bound + 1e-7).all(), n
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	mkdir "$T/c" && cp "$BATS_TEST_TMPDIR/c.pt" "$T/c/$(basename "$full")"
	run $PY scripts/ref/train.py --out "$T/c" --max-steps-this-run 2 --threads 1 --pool 4 --tokens 512 \
		--task-weights text=1,scene_count=1 --probe 0.3 --warmup 1 --rewarm 4 --log-every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"no optimizer state (compact checkpoint): fresh Adam moments, the rate ramps up over 4 steps"* ]]
	# the probe head resumed from its float16 weights and trained on
	run $PY - "$T/c" "$full" <<'PYEOF'
import glob, sys, torch
d = torch.load(sorted(glob.glob(sys.argv[1] + '/ckpt-*.pt'))[-1], map_location='cpu')
c = torch.load(sys.argv[2], map_location='cpu')
assert d['state']['step'] == 4 and d['state']['rewarm'] == 2, d['state']
assert d['opt']['state'], 'Adam moments are written again'
assert d['model']['text.embed'].dtype == torch.float32
assert not torch.equal(d['probe']['weight'], c['probe']['weight'].half().float()), 'probe head trained on'
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	# the schedule is 2e-3 after a 1-step warm-up: 1/4 of it at the first step back, 2/4 at the next
	grep -q "step 3 .* lr 5.00e-04 " "$T/c/train.log"
	grep -q "step 4 .* lr 1.00e-03 " "$T/c/train.log"
	run $PY scripts/ref/export.py --ckpt "$T/c/$(basename "$full")" --out-dir "$BATS_TEST_TMPDIR/x" --no-vision
	[ "$status" -eq 0 ]
	[ -s "$BATS_TEST_TMPDIR/x/proving-text.gguf" ]
	# chat.py answers from a compact file as from a full one (runs/ holds only compact files)
	run $PY scripts/ref/chat.py --ckpt "$BATS_TEST_TMPDIR/c.pt" --split val --n 2 --task scene_count \
		--out "$T/pc.jsonl"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$(wc -l < "$T/pc.jsonl")" -eq 2 ]
	run $PY scripts/ref/chat.py --ckpt "$full" --split val --n 2 --task scene_count --out "$T/pf.jsonl"
	[ "$status" -eq 0 ]
	[ "$(wc -l < "$T/pf.jsonl")" -eq 2 ]
}

@test "train.py --img-center: the share of the image embeddings common to every token is a loss that falls" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, probe
row = torch.randn(1, 8)
assert abs(float(probe.common_share({(0, 0): row.repeat(5, 1), (1, 0): row.repeat(3, 1)})) - 1) < 1e-6
x = torch.randn(6, 8)
assert float(probe.common_share({(0, 0): x - x.mean(0)})) < 1e-12
# half common, half not: |c|^2 / (|c|^2 + mean |x - c|^2)
c, y = torch.ones(8), torch.tensor([[1.0] * 8, [-1.0] * 8])
assert abs(float(probe.common_share({(0, 0): c + y})) - 0.5) < 1e-6
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	T="$BATS_TEST_TMPDIR/crun2"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 4 --threads 1 --pool 8 --tokens 1024 \
		--task-weights scene_count=1 --img-center 100 --log-every 1 --warmup 1 --lr 2e-3
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"image embeddings' common share, weight 100"* ]]
	first=$(grep -o " center [0-9.]*" "$T/train.log" | head -1 | cut -d' ' -f3)
	last=$(grep -o " center [0-9.]*" "$T/train.log" | tail -1 | cut -d' ' -f3)
	echo "center $first -> $last"
	awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0.8 && b < a - 0.1) }'
	rm -rf "$T"
}

@test "scene_code: exact code rows decode to every label, wrong rows do not; tower_code.py trains and writes; graft.py; from_gguf.py; oracle_read --feats words --save" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, bpe, synth, scene_code
from model import MiniCPMV, TextConfig, VisionConfig
from tower_code import encode
torch.manual_seed(0)
m = MiniCPMV(TextConfig(), VisionConfig())
tok = bpe.default()
table = scene_code.word_table(m, tok)
ids, code = scene_code.combos(table)
assert len(set(map(tuple, code.tolist()))) == 7 * 5 * 2      # every (colour, shape, size) its own row
seen = 0
for i in range(12):
    for mg in (4, 2):
        sq = encode(tok, m.vc, 'val', i, mg)
        t = sq['scene_t'][0]
        exact = scene_code.decode(scene_code.rows(t, table), t, table)
        for g, _ in scene_code.GROUPS:
            assert exact[g][0] == exact[g][1], (g, exact)
        seen += exact['colour'][1]
        assert exact['empty'][0] == 0
        # rows with colour and shape words swapped between shapes say the wrong thing
        perm = t.clone()
        perm[:, [synth.MARK_LABELS.index(f'colour:{c}') for c in synth.COLOURS]] = \
            t[:, [synth.MARK_LABELS.index(f'colour:{c}') for c in synth.COLOURS]].roll(1, 1)
        bad = scene_code.decode(scene_code.rows(perm, table), t, table)
        assert bad['colour'][0] == 0 and bad['shape'][0] == bad['shape'][1], bad
assert seen > 20, seen
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	T="$BATS_TEST_TMPDIR/crun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1
	[ "$status" -eq 0 ]
	C=$(ls "$T"/ckpt-*.pt)
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/tc.pt" --reinit-vision 3 --steps 1 --batch 2 --every 1 --n 2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_code step 1 (2 samples"*"loss "*"16x: colour "*" shape "*" size "*"empty rms "*"4x: colour "* ]]
	[[ "$output" == *"tower_code: wrote $T/tc.pt"* ]]
	# a long run stopped by SIGTERM finishes its step and still writes its tower
	$PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/tc-stop.pt" --minutes 30 --batch 2 --every 1 --n 2 \
		> "$T/stop.log" 2>&1 &
	term_when "$T/stop.log" "tower_code step 1 " $!
	cat "$T/stop.log"
	grep -q "tower_code: stopped by a signal after [0-9]* samples; saving" "$T/stop.log"
	grep -q "tower_code: wrote $T/tc-stop.pt" "$T/stop.log"
	[ -s "$T/tc-stop.pt" ]
	run $PY - "$C" "$T/tc.pt" <<'PYEOF'
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'] if k.startswith('text.'))
assert any(not torch.equal(a['model'][k], b['model'][k]) for k in a['model'] if k.startswith('vision.'))
assert b['scene_code'].shape[1] == 256 and b['state']['tower_code']['samples'] >= 2
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	# graft.py: the language model of one, the tower of the other, the tower's last layer scaled
	run $PY scripts/ref/graft.py --text "$C" --tower "$T/tc.pt" --out "$T/g.pt" --scale 2
	[ "$status" -eq 0 ]
	run $PY - "$C" "$T/tc.pt" "$T/g.pt" <<'PYEOF'
import sys, torch
a, b, g = (torch.load(f) for f in sys.argv[1:])
for k, v in g['model'].items():
    want = a['model'][k] if k.startswith('text.') else b['model'][k] * (2 if k.startswith('vision.mm_down') else 1)
    assert torch.equal(v, want), k
print('ok')
PYEOF
	[[ "$output" == *ok ]]
	run $PY scripts/ref/graft.py --text "$C" --tower "$T/none.pt" --out "$T/g2.pt"
	[ "$status" -ne 0 ]
	[ "$output" = "graft: $T/none.pt: no such file" ]
	rm -f "$T/tc.pt" "$T/g.pt"
	# from_gguf.py: exported files back to a checkpoint, weights within Q8_0 rounding of the original
	run $PY scripts/ref/export.py --ckpt "$C" --out-dir "$T/x"
	[ "$status" -eq 0 ]
	run $PY scripts/ref/from_gguf.py "$T/x/proving-text.gguf" "$T/x/proving-mmproj.gguf" "$T/back.pt" --step 7
	[ "$status" -eq 0 ]
	run $PY - "$C" "$T/back.pt" <<'PYEOF'
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert b['state']['step'] == 7 and b['opt'] is None
for part in ('text', 'vision'):     # eps comes back as its float32 value
    ca, cb = a['config'][part], b['config'][part]
    assert {k: v for k, v in ca.items() if k != 'eps'} == {k: v for k, v in cb.items() if k != 'eps'}, part
    assert abs(ca['eps'] - cb['eps']) < 1e-12
for k, v in a['model'].items():
    err = (b['model'][k] - v).abs().max()
    assert err <= v.abs().max() / 100 + 1e-6, (k, float(err))
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	run $PY scripts/ref/from_gguf.py "$T/x/proving-text.gguf" "$T/none.gguf" "$T/b2.pt"
	[ "$status" -ne 0 ]
	[ "$output" = "from_gguf: $T/none.gguf: no such file" ]
	rm -rf "$T/x" "$T/back.pt"
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats words --tasks scene_count --minutes 0.01 --n 1 --batch 2 \
		--every 1 --save "$T/lm.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"words step 1 (2 samples"* ]]
	run $PY -c "import torch, sys; d = torch.load('$T/lm.pt'); assert d['scene_code'].abs().sum() > 0; print(d['state']['oracle_read']['feats'])"
	[ "$output" = words ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --code "$T/nothing.pt"
	[ "$status" -ne 0 ]
	[ "$output" = "tower_code: $T/nothing.pt: no such file" ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --code "$C"
	[ "$status" -ne 0 ]
	[[ "$output" == "tower_code: $C has no scene_code"* ]]
	[ ! -e "$T/x.pt" ]
}

@test "glyph_code: exact rows read back every glyph at its place, shifted rows do not, less so as the binding weakens; tower_code.py --tasks with reading tasks trains and writes the glyph code, --dense a patch glyph head a later stage continues; oracle_read --feats glyphs reads it" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, bpe, glyph_code
from model import MiniCPMV, TextConfig, VisionConfig
from tower_code import encode
torch.manual_seed(0)
m = MiniCPMV(TextConfig(), VisionConfig())
tok = bpe.default()
E, P = glyph_code.tables(m, tok)
assert E.shape == (94, 256) and set(P.unique().tolist()) == {-1.0, 1.0}
R = T = W = 0
for i, task in enumerate(('receipt_read', 'screenshot_read', 'snippet_read', 'word_read') * 2):
    sq = encode(tok, m.vc, 'val', i, (4, 2)[i % 2], [task])
    assert len(sq['glyph_t']) == len(sq['crops'])
    assert (sq['glyph_t'][0] is None) == (len(sq['crops']) > 1)    # no target on an overview with tiles
    for tg, c in zip(sq['glyph_t'], sq['crops']):
        if tg is None:
            continue
        n = (c.shape[1] // (14 * sq['merge'])) * (c.shape[2] // (14 * sq['merge']))
        (r, t), (e, _) = glyph_code.decode(glyph_code.rows(tg, E, P, n), tg, E, P)
        R, T = R + r, T + t
        assert e == 0
        moved = (tg[0], tg[1], (tg[2] + 1) % (glyph_code.GX * glyph_code.GY))   # each glyph one place on
        W += glyph_code.decode(glyph_code.rows(moved, E, P, n), tg, E, P)[0][0]
assert T > 300 and R >= 0.98 * T and W < 0.1 * T, (R, W, T)
# a weaker binding: places are random 0/1 masks at 0.5, the bag of glyphs at 0 (no place to read back)
for bind, lo, hi in ((0.75, 0.95, 1.0), (0.5, 0.6, 0.95), (0.0, 0.0, 0.5)):
    E2, P2 = glyph_code.tables(m, tok, bind=bind)
    assert torch.equal(E2, E) and torch.equal(P2, (1 - bind) + bind * P)
    r2 = t2 = 0
    for i, task in enumerate(('receipt_read', 'snippet_read') * 2):
        sq = encode(tok, m.vc, 'val', i, (4, 2)[i % 2], [task])
        for tg, c in zip(sq['glyph_t'], sq['crops']):
            if tg is not None:
                n = (c.shape[1] // (14 * sq['merge'])) * (c.shape[2] // (14 * sq['merge']))
                (r, t), _ = glyph_code.decode(glyph_code.rows(tg, E2, P2, n), tg, E2, P2)
                r2, t2 = r2 + r, t2 + t
    assert lo * t2 <= r2 <= hi * t2, (bind, r2, t2)
print('ok', R, W, T)
PYEOF
	echo "$output"
	[[ "$output" == ok* ]]
	T="$BATS_TEST_TMPDIR/grun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1
	[ "$status" -eq 0 ]
	C=$(ls "$T"/ckpt-*.pt)
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/tc.pt" --tasks scene_count,snippet_read --ce 1 \
		--minutes 0.02 --batch 2 --every 1 --n 2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"glyph code = glyph embeddings x "* ]]
	[[ "$output" == *"tower_code step 1 (2 samples"*"16x text: glyph "*"16x: colour "*"4x text: glyph "* ]]
	run $PY -c "import torch; d = torch.load('$T/tc.pt'); g = d['glyph_code']; assert g['E'].shape == (94, 256) and g['P'].shape == (32, 256); print(d['state']['tower_code']['tasks'])"
	[ "$output" = "['scene_count', 'snippet_read']" ]
	# the language model reads the fixed glyph code (oracle_read.py --feats glyphs) and keeps it
	run $PY scripts/ref/oracle_read.py --ckpt "$T/tc.pt" --feats glyphs --tasks word_read --minutes 0.01 --n 1 \
		--batch 2 --every 1 --save "$T/lm.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"glyphs step 1 (2 samples"* ]]
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact, torch; a, b = compact.load('$T/tc.pt'), compact.load('$T/lm.pt'); assert torch.equal(a['glyph_code']['E'], b['glyph_code']['E']); print('same code')"
	[ "$output" = "same code" ]
	# a second tower stage keeps the code the first wrote; --dense trains a patch glyph head along,
	# and a third stage goes on with that head (its recall before a step is the second's after its last)
	run $PY scripts/ref/tower_code.py --ckpt "$T/tc.pt" --save "$T/tc2.pt" --tasks snippet_read --samples 1 \
		--batch 1 --every 1 --n 1 --glyph-bind 0.5 --dense 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"the glyph code of $T/tc.pt"* ]]
	r2=$(echo "$output" | grep '^tower_code step 1 ' | grep -o 'dense glyph recall [0-9.]*')
	[ -n "$r2" ]
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact, torch; a, b = compact.load('$T/tc.pt'), compact.load('$T/tc2.pt'); assert torch.equal(a['glyph_code']['P'], b['glyph_code']['P']) and 'dense_head' in b; print('same code')"
	[ "$output" = "same code" ]
	run $PY scripts/ref/tower_code.py --ckpt "$T/tc2.pt" --save "$T/tc3.pt" --tasks snippet_read --samples 1 \
		--batch 1 --every 1 --n 1 --dense 1 --dense-first 95000001
	[ "$status" -eq 0 ]
	[ "$(echo "$output" | grep '^tower_code step 0: ' | grep -o 'dense glyph recall [0-9.]*')" = "$r2" ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --tasks scene_count,text
	[ "$status" -ne 0 ]
	[ "$output" = "tower_code: text: not an image task" ]
	[ ! -e "$T/x.pt" ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --tasks snippet_read --glyph-bind 1.5
	[ "$status" -ne 0 ]
	[[ "${lines[-1]}" == *"argument --glyph-bind: '1.5': want a number from 0 to 1" ]]
	[ ! -e "$T/x.pt" ]
}

@test "scene_code extras: rank, column, ncolour, nshape rows follow the scene (order, colour and shape counts) and read back; compound kinds stack their parts; tower_code/oracle_read --extra write them; code_eval.py answers from the code; train.py keeps the codes" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, bpe, synth, scene_code, oracle_read
from model import MiniCPMV, TextConfig, VisionConfig
torch.manual_seed(0)
m = MiniCPMV(TextConfig(), VisionConfig())
tok = bpe.default()
table = scene_code.word_table(m, tok)
colour = [synth.MARK_LABELS.index(f'colour:{c}') for c in synth.COLOURS]
R = N = W = 0
for kind in scene_code.EXTRAS:
    et = scene_code.extra_table(kind, m, tok, table)
    assert et.shape == (scene_code.N_EXTRA[kind], 256)
    assert torch.allclose(et.norm(dim=1), table[table.abs().sum(1) > 0].norm(dim=1).mean().expand(len(et)))
    for i in range(16):
        marks = []
        s = synth.sample('val', i, task='scene_caption', marks=marks)
        objs = sorted([(x, w) for x, _, w in marks], key=lambda o: o[0])
        for mg in (4, 2):
            sq = oracle_read.encode(tok, m.vc, dict(s, marks=marks), mg)
            t, o = sq['scene_t'][0], sq['extra_t'][kind][0]
            one, _ = scene_code.single_shape(t)
            for ti in one.nonzero()[:, 0].tolist():     # the extra says where the token's shape stands
                k = int(o[ti].argmax())
                c = synth.MARK_LABELS[colour[int(t[ti, colour].argmax())]].split(':')[1]
                if kind == 'rank':
                    assert objs[k][1][1] == c, (i, k, objs, c)
                elif kind == 'ncolour':     # how many shapes share this token's colour, less one
                    assert sum(w[1] == c for _, w in objs) == k + 1, (i, k, objs, c)
                elif kind == 'nshape':
                    assert k + 1 in [sum(v[2] == w[2] for _, v in objs) for _, w in objs if w[1] == c], (i, k, objs)
                else:
                    assert any(int(x // 14) == k and w[1] == c for x, w in objs), (i, k, objs, c)
            x = scene_code.rows(t, table) + o @ et
            (r, n), = scene_code.extra_decode(x, t, o, et, kind).values()
            R, N = R + r, N + n
            W += scene_code.extra_decode(scene_code.rows(t, table) + o.roll(1, 1) @ et, t, o, et, kind)[kind][0]
assert N > 60 and R == N and W < 0.1 * N, (R, W, N)
# a compound kind: the parts' rows stacked, their targets side by side, each part read back alone
kind = 'rank+ncolour'
et = scene_code.extra_table(kind, m, tok, table)
assert torch.equal(et[:5], scene_code.extra_table('rank', m, tok, table))
assert torch.equal(et[5:], scene_code.extra_table('ncolour', m, tok, table))
marks = []
s = synth.sample('val', 5, task='scene_count', marks=marks)
sq = oracle_read.encode(tok, m.vc, dict(s, marks=marks), 4)
o = scene_code.pick(sq['extra_t'], kind, 0)
assert torch.equal(o, torch.cat([sq['extra_t']['rank'][0], sq['extra_t']['ncolour'][0]], 1))
t = sq['scene_t'][0]
got = scene_code.extra_decode(scene_code.rows(t, table) + o @ et, t, o, et, kind)
assert list(got) == ['rank', 'ncolour'] and all(a == b > 0 for a, b in got.values()), got
assert float(scene_code.extra_ce(scene_code.rows(t, table) + o @ et, t, o, et, kind)) < 0.5
# a checkpoint's own rows stay for the parts it has
old = dict(kind='rank', table=torch.randn(5, 256))
new = scene_code.extra_of(dict(scene_extra=old), 'rank+nshape', m, tok, table)
assert new['kind'] == 'rank+nshape' and torch.equal(new['table'][:5], old['table']) and new['table'].shape == (10, 256)
try:
    scene_code.parts('rank+bogus')
    raise SystemExit('no error')
except ValueError as e:
    assert 'bogus' in str(e)
print('ok', R, W, N)
PYEOF
	echo "$output"
	[[ "$output" == ok* ]]
	T="$BATS_TEST_TMPDIR/xrun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1
	[ "$status" -eq 0 ]
	C=$(ls "$T"/ckpt-*.pt)
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/tc.pt" --extra column+nshape --ce 1 --minutes 0.02 --batch 2 --every 1 --n 2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_code step 1 (2 samples"*"16x: colour "*" column "*" nshape "*"4x: colour "*" column "*" nshape "* ]]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats words --extra column+nshape --tasks scene_caption --minutes 0.01 \
		--n 1 --batch 2 --every 1 --save "$T/lm.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"words step 1 (2 samples"* ]]
	# both halves hold the same code, extra included
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact, torch; a, b = compact.load('$T/tc.pt'), compact.load('$T/lm.pt'); assert a['scene_extra']['kind'] == b['scene_extra']['kind'] == 'column+nshape'; assert torch.allclose(a['scene_extra']['table'], b['scene_extra']['table']) and torch.allclose(a['scene_code'], b['scene_code']); print('same code')"
	[ "$output" = "same code" ]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats tower --extra rank --tasks scene_caption
	[ "$status" -ne 0 ]
	[ "$output" = "oracle_read: --extra is for --feats words or --keep-scenes" ]
	# greedy answers from the code, scored by eval.py
	run $PY scripts/ref/code_eval.py --ckpt "$T/lm.pt" --extra --split test --n 2 --task scene_caption -o "$T/p.jsonl"
	[ "$status" -eq 0 ]
	[ "$(wc -l < "$T/p.jsonl")" -eq 2 ]
	run $PY scripts/eval.py --split test --n 2 --task scene_caption "$T/p.jsonl"
	[ "$status" -eq 0 ]
	[[ "$output" == *"scene_caption"*"exact"* ]]
	run $PY scripts/ref/code_eval.py --ckpt "$C" --split test --n 2 --task scene_caption -o "$T/q.jsonl"
	[ "$status" -ne 0 ]
	[ "$output" = "code_eval: $C has no scene_code" ]
	[ ! -e "$T/q.jsonl" ]
	run $PY scripts/ref/code_eval.py --ckpt "$T/lm.pt" --split test --n 1 --task text -o "$T/q.jsonl"
	[ "$status" -ne 0 ]
	[ "$output" = "code_eval: give --task: a scene or reading task" ]
	[ ! -e "$T/q.jsonl" ]
	# a joint stage resumed from it keeps the code for the next tower or reading stage
	mkdir "$T/j" && cp "$T/lm.pt" "$T/j/ckpt-0000001.pt"
	run $PY scripts/ref/train.py --out "$T/j" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1
	[ "$status" -eq 0 ]
	run $PY -c "import torch; d = torch.load('$T/j/ckpt-0000002.pt'); print(d['state']['step'], d['scene_extra']['kind'], d['scene_code'].shape[0])"
	[ "$output" = "2 column+nshape 109" ]
	rm -rf "$T"
}

@test "tower_code.py --grow: the grown tower writes the rows it wrote before; --freeze-below trains only the layers above; --extra-weight is checked; graft.py and export.py take the grown tower" {
	T="$BATS_TEST_TMPDIR/crun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1
	[ "$status" -eq 0 ]
	C=$(ls "$T"/ckpt-*.pt)
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, tower_code
from model import MiniCPMV, TextConfig, VisionConfig
torch.manual_seed(0)
m = MiniCPMV(TextConfig(), VisionConfig())
m.eval()
px = torch.randn(1, 3, 224, 224)
with torch.no_grad():
    before = {mg: m.vision(px, mg)[0] for mg in (4, 2)}
    tower_code.grow(m, 2)
    assert m.vc.n_layer == 8 and len(m.vision.layers) == 8
    for mg in (4, 2):
        assert torch.equal(m.vision(px, mg)[0], before[mg]), mg
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/grown.pt" --extra rank+nshape --ce 1 --extra-weight nshape=3 \
		--grow 1 --freeze-below 6 --samples 2 --batch 2 --every 1 --n 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_code: the tower grown to 7 layers"*"tower_code step 1 (2 samples"*"nshape "* ]]
	run $PY - "$C" "$T/grown.pt" <<'PYEOF'
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert b['config']['vision']['n_layer'] == a['config']['vision']['n_layer'] + 1 == 7
st = b['state']['tower_code']
assert st['grow'] == 1 and st['freeze_below'] == 6 and st['extra_weight'] == {'nshape': 3.0}
frozen = ('vision.patch.', 'vision.merger.') + tuple(f'vision.layers.{i}.' for i in range(6))
for k, v in a['model'].items():     # (a trained vector may keep its float16 value after one small step)
    if k.startswith('text.') or k.startswith(frozen) or k == 'vision.pos':
        assert torch.equal(v, b['model'][k]), k
assert not torch.equal(a['model']['vision.mm_up.weight'], b['model']['vision.mm_up.weight'])
assert any(not torch.equal(b['model'][k], torch.zeros_like(b['model'][k])) for k in b['model'] if k.startswith('vision.layers.6.o.'))
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	run $PY scripts/ref/graft.py --text "$C" --tower "$T/grown.pt" --out "$T/g.pt"
	[ "$status" -eq 0 ]
	run $PY scripts/ref/export.py --ckpt "$T/g.pt" --out-dir "$T/x"
	[ "$status" -eq 0 ]
	run $PY scripts/ref/from_gguf.py "$T/x/proving-text.gguf" "$T/x/proving-mmproj.gguf" "$T/back.pt"
	[ "$status" -eq 0 ]
	run $PY -c "import torch; d = torch.load('$T/back.pt'); print(d['config']['vision']['n_layer'], sum(k.startswith('vision.layers.6.') for k in d['model']))"
	[ "$output" = "7 16" ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --extra nshape --extra-weight shapes=2
	[ "$status" -ne 0 ]
	[[ "$output" == *"--extra-weight: 'shapes=2': want PART=WEIGHT, PART one of rank, column, ncolour, nshape" ]]
	[ ! -e "$T/x.pt" ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --extra rank --extra-weight nshape=2
	[ "$status" -ne 0 ]
	[ "$output" = "tower_code: --extra-weight nshape: not a part of --extra rank" ]
	[ ! -e "$T/x.pt" ]
	# layer_probe.py: a row per stage of the grown tower, the seventh layer's included
	run $PY scripts/ref/layer_probe.py --ckpt "$T/g.pt" --n 6
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"layer_probe: 6 val scenes at 16x"*"p-layer2 "*"m-merger "*"m-layer6 "*"output "* ]]
	run $PY scripts/ref/layer_probe.py --ckpt "$T/none.pt"
	[ "$status" -ne 0 ]
	[ "$output" = "layer_probe: $T/none.pt: no such file" ]
}

@test "recipes: every scripts/ref/recipe-*.sh parses, and every runs/ checkpoint it starts from is committed" {
	# a recipe is the documented way to retrain the shipped files; one whose
	# start was dropped from runs/ (one checkpoint kept per run) cannot replay
	n=0
	for r in scripts/ref/recipe*.sh; do
		sh -n "$r"
		for f in $(grep -o 'runs/[A-Za-z0-9_./-]*\.pt' "$r" | sort -u); do
			[ -f "$f" ] || { echo "$r names $f, which is not in the tree"; return 1; }
			n=$((n + 1))
		done
	done
	[ "$n" -ge 6 ]
}

@test "tower_code.py --batch 0 --dense: glyph recognition alone (bf16), by steps; the next leg goes on with the next crops; --save-every keeps a .part until the end; compact.py --tower-only + graft.py carry it on; bad usage is one line" {
	T="$BATS_TEST_TMPDIR/rd"
	mkdir -p "$T"
	C=runs/nshape/ckpt-0004128.pt
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/a.pt" --tasks scene_count --batch 0 --dense 1 --bf16 \
		--steps 2 --every 1 --n 1 --save-every 0.0001
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_code step 2 (0 samples"*"dense glyph recall "* ]]
	[[ "$output" == *"tower_code: wrote $T/a.pt.part (1 steps)"* ]]
	[ -e "$T/a.pt" ] && [ ! -e "$T/a.pt.part" ]
	r1=$(echo "$output" | grep '^tower_code step 2 ' | grep -o 'dense glyph recall [0-9.]*')
	run $PY - "$C" "$T/a.pt" <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref')
import compact, torch
a, b = compact.load(sys.argv[1]), compact.load(sys.argv[2])
st = b['state']['tower_code']
assert st['steps'] == 2 and st['dense_next'] == 95_000_002 and st['samples'] == 0, st
text = [k for k in a['model'] if k.startswith('text.')]
vis = [k for k in a['model'] if k.startswith('vision.layers.')]
assert all(torch.equal(a['model'][k], b['model'][k]) for k in text)
assert any(not torch.equal(a['model'][k], b['model'][k]) for k in vis)
assert 'dense_head' in b
print('ok')
PYEOF
	echo "$output"
	[ "$output" = ok ]
	# the next leg starts where the first stopped: its head and tower (recall before a step = the
	# first leg's last) and its crops (dense_next moves on by its own steps)
	run $PY scripts/ref/tower_code.py --ckpt "$T/a.pt" --save "$T/b.pt" --tasks scene_count --batch 0 --dense 1 \
		--steps 1 --every 1 --n 1 --bf16
	[ "$status" -eq 0 ]
	[ "$(echo "$output" | grep '^tower_code step 0: ' | grep -o 'dense glyph recall [0-9.]*')" = "$r1" ]
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact; print(compact.load('$T/b.pt')['state']['tower_code']['dense_next'])"
	[ "$output" = 95000003 ]
	# the tower alone (compact.py --tower-only) grafted back onto the language model goes on as b.pt would
	run $PY scripts/ref/compact.py --tower-only "$T/b.pt" "$T/tw.pt"
	[ "$status" -eq 0 ]
	[ "$(stat -c %s "$T/tw.pt")" -lt $(( $(stat -c %s "$T/b.pt") / 3 )) ]
	run $PY scripts/ref/graft.py --text "$C" --tower "$T/tw.pt" --out "$T/g.pt"
	[ "$status" -eq 0 ]
	run $PY - "$T/b.pt" "$T/g.pt" <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref')
import compact, torch
b, g = compact.load(sys.argv[1]), compact.load(sys.argv[2])
assert g['state']['tower_code']['dense_next'] == 95_000_003
# the head and the tower's weights as b.pt's, up to int8 rounding (half a step of a row's absmax / 127;
# the fresh head's rows are ~1e-6, below what a float16 row scale holds)
close = lambda x, y: float((x - y).abs().max()) <= float(x.abs().max()) / 250 + 1e-5
assert all(close(b['dense_head'][k], g['dense_head'][k]) for k in b['dense_head'])
assert all(close(b['model'][k], g['model'][k]) for k in b['model'] if k.startswith('vision.'))
print('ok')
PYEOF
	echo "$output"
	[ "$output" = ok ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --tasks scene_count --batch 0
	[ "$status" -eq 1 ]
	[ "$output" = "tower_code: --batch 0 needs --dense N (N > 0); neither may be negative" ]
	run $PY scripts/ref/tower_code.py --ckpt "$C" --save "$T/x.pt" --tasks scene_count --batch 0 --dense 1 --samples 4
	[ "$status" -eq 1 ]
	[ "$output" = "tower_code: --samples counts code samples; with --batch 0 give --steps or --minutes" ]
	[ ! -e "$T/x.pt" ]
}

@test "oracle_read.py --keep-scenes: the language model reads the glyph code and keeps its scenes on the exact scene code; both codes saved; bad usage is one line" {
	T="$BATS_TEST_TMPDIR/ks"
	mkdir -p "$T"
	C=runs/nshape/ckpt-0004128.pt
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats glyphs --bind 0 --scale 8 --tasks word_read \
		--keep-scenes scene_caption --extra rank+ncolour+nshape --batch 2 --samples 2 --every 1 --n 2 --save "$T/lm.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	# the shipped language model captions from the exact scene code: its colour and shape words
	# cost almost nothing (from the reading code's rows, or none, they would cost nats)
	line=$(echo "$output" | grep '^glyphs step 0 ')
	[[ "$line" == *"word_read@16x "*"scene_caption@16x "*"scene_caption@4x "* ]]
	ce=$(echo "$line" | grep -o 'scene_caption@16x [0-9.]*/[0-9.]*' | cut -d/ -f2)
	awk -v c="$ce" 'BEGIN { exit !(c < 0.3) }'
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact; d = compact.load('$T/lm.pt'); print(sorted(k for k in ('glyph_code', 'scene_code', 'scene_extra') if k in d), d['state']['oracle_read']['tasks'])"
	[ "$output" = "['glyph_code', 'scene_code', 'scene_extra'] ['word_read', 'scene_caption']" ]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats glyphs --tasks word_read --keep-scenes receipt_read
	[ "$status" -eq 1 ]
	[ "$output" = "oracle_read: --keep-scenes takes scene tasks, with --feats glyphs" ]
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats tower --tasks word_read --keep-scenes scene_caption
	[ "$status" -eq 1 ]
	[ "$output" = "oracle_read: --keep-scenes takes scene tasks, with --feats glyphs" ]
}

@test "glyph_code slots: a glyph's place is its rank in reading order in its token (upper half first, then left to right); slot rows keep an order a bag loses and read back; oracle_read --slots" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref')
import torch, glyph_code
cells = [(0, '3', (0.2, 0.3)), (0, '1', (0.6, 0.3)), (1, '7', (0.1, 0.8)), (1, '.', (0.5, 0.2)), (1, ' ', (0.3, 0.3))]
tk, gl, pl = glyph_code.targets(cells, 2, slots=True)
assert tk.tolist() == [0, 0, 1, 1] and pl.tolist() == [0, 1, 1, 0], pl
swapped = [(0, '1', (0.2, 0.3)), (0, '3', (0.6, 0.3))] + cells[2:]
g = torch.Generator().manual_seed(0)
E = torch.randn(glyph_code.N_GLYPH, 256, generator=g)
signs = torch.randint(0, 2, (glyph_code.GX * glyph_code.GY, 256), generator=g).float() * 2 - 1
for bind, differ in ((0.0, False), (1.0, True)):
    P = (1 - bind) + bind * signs
    a = glyph_code.rows(glyph_code.targets(cells, 2, slots=True), E, P, 2)
    b = glyph_code.rows(glyph_code.targets(swapped, 2, slots=True), E, P, 2)
    assert torch.allclose(a, b) != differ, bind
    tg = glyph_code.targets(cells, 2, slots=True)
    if differ:     # every glyph read back at its slot
        (right, n), _ = glyph_code.decode(a, tg, E, P)
        assert right == n == 4, (right, n)
print('ok')
PYEOF
	echo "$output"
	[ "$output" = ok ]
	run $PY scripts/ref/oracle_read.py --ckpt runs/nshape/ckpt-0004128.pt --feats glyphs --slots --tasks word_read \
		--samples 1 --batch 1 --every 1 --n 1 --save "$BATS_TEST_TMPDIR/s.pt"
	[ "$status" -eq 0 ]
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact; print(compact.load('$BATS_TEST_TMPDIR/s.pt')['state']['oracle_read']['slots'])"
	[ "$output" = True ]
	run $PY scripts/ref/oracle_read.py --ckpt runs/nshape/ckpt-0004128.pt --feats oracle --slots
	[ "$status" -eq 1 ]
	[ "$output" = "oracle_read: --slots and --recode are for --feats glyphs" ]
}

@test "glyph code carried on: a saved code keeps its slots for oracle_read and tower_code; --recode replaces a kept code; --first and first_next chain legs" {
	T="$BATS_TEST_TMPDIR/rc"
	mkdir -p "$T"
	C=runs/nshape/ckpt-0004128.pt
	code() {   # slots flag, P's distinct values, first_next of a checkpoint
		$PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact, glyph_code
d = compact.load('$1'); E, P, s = glyph_code.stored(d); o = d['state'].get('oracle_read', {})
print(s, sorted(set(P.flatten().tolist())), o.get('first_next'))"
	}
	# a bag (bind 0, cell grid), then a leg that keeps it and goes on with the next samples
	run $PY scripts/ref/oracle_read.py --ckpt "$C" --feats glyphs --bind 0 --scale 8 --tasks word_read \
		--samples 2 --batch 2 --every 1 --n 1 --first 5000 --save "$T/bag.pt"
	[ "$status" -eq 0 ]
	[ "$(code "$T/bag.pt")" = "False [1.0] 5002" ]
	run $PY scripts/ref/oracle_read.py --ckpt "$T/bag.pt" --feats glyphs --slots --bind 0.5 --tasks word_read \
		--samples 1 --batch 1 --every 1 --n 1 --first 5002 --save "$T/kept.pt"
	[ "$status" -eq 0 ]
	[[ "$output" == *"oracle_read: the glyph code of $T/bag.pt (cell grid; --recode builds one from the options)"* ]]
	[ "$(code "$T/kept.pt")" = "False [1.0] 5003" ]
	# --recode: the slot code at bind 0.5 replaces the bag, and is kept from then on
	run $PY scripts/ref/oracle_read.py --ckpt "$T/bag.pt" --feats glyphs --recode --slots --bind 0.5 --scale 8 \
		--tasks word_read --samples 1 --batch 1 --every 1 --n 1 --save "$T/slot.pt"
	[ "$status" -eq 0 ]
	[ "$(code "$T/slot.pt")" = "True [0.0, 1.0] 90000001" ]
	run $PY scripts/ref/oracle_read.py --ckpt "$T/slot.pt" --feats glyphs --tasks word_read --minutes 0 --n 1
	[ "$status" -eq 0 ]
	[[ "$output" == *"(slots; --recode"* ]]
	# greedy answers from the exact glyph code, scored by eval.py; no glyph code is one line
	run $PY scripts/ref/code_eval.py --ckpt "$T/slot.pt" --split val --n 2 --task receipt_total --merge 2 -o "$T/p.jsonl"
	[ "$status" -eq 0 ]
	[ "$(wc -l < "$T/p.jsonl")" -eq 2 ]
	run $PY scripts/eval.py --split val --n 2 --task receipt_total "$T/p.jsonl"
	[[ "$output" == *"receipt_total"*"exact"* ]]
	run $PY scripts/ref/code_eval.py --ckpt "$C" --split val --n 2 --task receipt_total -o "$T/q.jsonl"
	[ "$status" -eq 1 ]
	[ "$output" = "code_eval: $C has no glyph_code" ]
	[ ! -e "$T/q.jsonl" ]
	# the tower taught the code of a graft: slot targets, and the code saved with its flag
	run $PY scripts/ref/graft.py --text "$T/slot.pt" --tower "$C" --out "$T/g.pt"
	[ "$status" -eq 0 ]
	run $PY scripts/ref/tower_code.py --ckpt "$T/g.pt" --save "$T/t.pt" --tasks word_read --batch 1 --steps 1 \
		--every 1 --n 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_code: the glyph code of $T/g.pt (slots)"* ]]
	[ "$(code "$T/t.pt" | cut -d' ' -f1-3)" = "True [0.0, 1.0]" ]
	# a long leg stopped by SIGTERM saves, and records where its samples stopped
	$PY scripts/ref/oracle_read.py --ckpt "$T/slot.pt" --feats glyphs --tasks word_read --minutes 30 --batch 1 \
		--every 1 --n 1 --first 7000 --save "$T/stop.pt" > "$T/stop.log" 2>&1 &
	term_when "$T/stop.log" "^glyphs step 1 " $!
	cat "$T/stop.log"
	grep -q "oracle_read: stopped by a signal after [1-9][0-9]* samples" "$T/stop.log"
	n=$(grep -o "stopped by a signal after [0-9]*" "$T/stop.log" | grep -o "[0-9]*$")
	[ "$(code "$T/stop.pt")" = "True [0.0, 1.0] $((7000 + n))" ]
}

@test "VisionModel.patch_rows(bf16=True): float32 rows near the float32 path's, gradients reach the weights; the float32 path is unchanged" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref')
import torch
import compact
from model import VisionModel, VisionConfig, config_from_dict
d = compact.load('runs/nshape/ckpt-0004128.pt')
vm = VisionModel(config_from_dict(VisionConfig, d['config']['vision']), 256)
vm.load_state_dict({k[7:]: v for k, v in d['model'].items() if k.startswith('vision.')})
px = torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(0))
f = vm.patch_rows(px)
b = vm.patch_rows(px, bf16=True)
assert f.dtype == b.dtype == torch.float32, (f.dtype, b.dtype)
rel = float((f - b).norm() / f.norm())
assert 0 < rel < 0.05, rel
b.pow(2).mean().backward()
assert vm.patch.weight.grad is not None and vm.patch.weight.grad.abs().sum() > 0
with torch.no_grad():
    x = vm.patch(px)
    x = x.flatten(2).transpose(1, 2) + vm.pos[vm.pos_ids(4, 4)]
    for L in vm.layers:
        x = L(x)
    assert torch.equal(vm.post_ln(x), f)
print('bf16 rel', rel)
PYEOF
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == "bf16 rel 0."* ]]
}

@test "chatfmt spell: a reading task's answer is one token per character and decodes to the same text; other tasks and the prompt are unchanged; oracle_read --spell trains on it and records it" {
	run $PY - <<'PY'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import bpe, chatfmt, synth
from model import VisionConfig
tok, vc = bpe.default(), VisionConfig()
for task in ('receipt_read', 'screenshot_read', 'word_read', 'scene_caption', 'text'):
    s = synth.sample('val', 3, task=task)
    a, b = chatfmt.encode_sample(tok, s, vc, 2), chatfmt.encode_sample(tok, s, vc, 2, spell=True)
    ta = [t for t, l in zip(a['ids'], a['labels']) if l != -100]
    tb = [t for t, l in zip(b['ids'], b['labels']) if l != -100]
    n_prompt = a['labels'].index(ta[0])
    assert a['ids'][:n_prompt] == b['ids'][:n_prompt], task       # the prompt is the same
    assert tok.decode(ta) == tok.decode(tb) == s['answer'] + '<|im_end|>', task
    if task in synth.READ_TASKS:
        # printable ASCII and newline: one token per character, <|im_end|> still one token
        assert len(tb) == len(s['answer']) + 1 >= len(ta), (task, len(tb), len(ta))
        assert task == 'word_read' or len(tb) > len(ta), task    # a receipt's words are BPE tokens
        assert all(len(tok.decode([t])) == 1 for t in tb[:-1]), task
    else:
        assert tb == ta and b['ids'] == a['ids'], task
print('ok')
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" = ok ]
	T="$BATS_TEST_TMPDIR/sp"
	mkdir -p "$T"
	run $PY scripts/ref/oracle_read.py --ckpt runs/nshape/ckpt-0004128.pt --feats glyphs --slots --bind 0.5 --scale 8 \
		--tasks receipt_total --spell --batch 1 --samples 1 --every 1 --n 1 --save "$T/lm.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact; print(compact.load('$T/lm.pt')['state']['oracle_read']['spell'])"
	[ "$output" = True ]
}

@test "train.py --spell: reading answers are trained spelled (a different loss on the same samples), the checkpoint records it and a resume keeps it" {
	T="$BATS_TEST_TMPDIR/tsp"
	ce() { sed -n 's/.* ce \([0-9.]*\) .*/\1/p' "$1/train.log" | head -n 1; }
	for v in plain spell; do
		f=; [ $v = spell ] && f=--spell
		run $PY scripts/ref/train.py --out "$T/$v" --max-steps-this-run 1 --log-every 1 --val-every 1000 \
			--threads 1 --pool 2 --tokens 4096 --task-weights receipt_read=1 $f
		echo "$output"
		[ "$status" -eq 0 ]
	done
	grep -q 'reading answers spelled' "$T/spell/train.log"
	! grep -q 'reading answers spelled' "$T/plain/train.log"
	# same seed, same samples, same initial weights: only the answers' tokens differ
	[ -n "$(ce "$T/plain")" ] && [ "$(ce "$T/plain")" != "$(ce "$T/spell")" ]
	run $PY -c "import sys, glob; sys.path.insert(0, 'scripts/ref'); import compact; print(compact.load(sorted(glob.glob('$T/spell/ckpt-*.pt'))[-1])['state']['spell'])"
	[ "$output" = True ]
	run $PY scripts/ref/train.py --out "$T/spell" --max-steps-this-run 1 --log-every 1 --val-every 1000 \
		--threads 1 --pool 2 --tokens 4096 --task-weights receipt_read=1
	[ "$status" -eq 0 ]
	grep -q 'reading answers spelled one character per token (as the checkpoint was trained)' "$T/spell/train.log"
}

@test "train.py --read-upscale: text images are sliced as a larger picture (a different loss on the same samples), scenes are not; bad values are one line" {
	T="$BATS_TEST_TMPDIR/tup"
	ce() { sed -n 's/.* ce \([0-9.]*\) .*/\1/p' "$1/train.log" | head -n 1; }
	for task in receipt_total scene_count; do
		for v in plain up; do
			f=; [ $v = up ] && f="--read-upscale 1.5,1.5"
			run $PY scripts/ref/train.py --out "$T/$task-$v" --max-steps-this-run 1 --log-every 1 --val-every 1000 \
				--threads 1 --pool 2 --tokens 4096 --task-weights $task=1 --mode-by-task $f
			echo "$output"
			[ "$status" -eq 0 ]
		done
	done
	grep -q 'sliced as if scaled by 1.5-1.5 (--read-upscale)' "$T/receipt_total-up/train.log"
	! grep -q 'read-upscale' "$T/receipt_total-plain/train.log"
	[ -n "$(ce "$T/receipt_total-plain")" ] && [ "$(ce "$T/receipt_total-plain")" != "$(ce "$T/receipt_total-up")" ]
	[ -n "$(ce "$T/scene_count-plain")" ] && [ "$(ce "$T/scene_count-plain")" = "$(ce "$T/scene_count-up")" ]
	for bad in 2,1 0,1 1.5 x,y; do
		run $PY scripts/ref/train.py --out "$T/bad" --read-upscale $bad
		[ "$status" -eq 2 ]
		[[ "$output" == *"--read-upscale: want LO,HI"* ]]
	done
}

@test "tower_code --blank-overview: a text image's overview with tiles is pulled to zero (its rows alone add to the loss and get a gradient), tiles and scenes are unchanged; the report shows its RMS; the state records it" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, bpe, glyph_code
from model import MiniCPMV, TextConfig, VisionConfig
from tower_code import encode, code_loss
torch.manual_seed(0)
m = MiniCPMV(TextConfig(), VisionConfig())
tok = bpe.default()
E, P = glyph_code.tables(m, tok)
seqs = [encode(tok, m.vc, 'val', i, 2, ['receipt_read'], slots=True) for i in range(2)]
assert all(sq['overview'] == 0 and len(sq['crops']) > 1 for sq in seqs)
seqs.append(encode(tok, m.vc, 'val', 0, 2, ['word_read'], slots=True))
assert 'overview' not in seqs[-1] and len(seqs[-1]['crops']) == 1
feats = {(si, ci): torch.randn((c.shape[1] // 28) * (c.shape[2] // 28), E.shape[1], requires_grad=True)
         for si, sq in enumerate(seqs) for ci, c in enumerate(sq['crops'])}
plain = code_loss(feats, seqs, None, 1.0, glyphs=(E, P))
blank = code_loss(feats, seqs, None, 1.0, glyphs=(E, P), blank=True)
want = sum(glyph_code.rows(sq['glyph_t'][ci], E, P, feats[(si, ci)].shape[0]).pow(2).sum()
           for si, sq in enumerate(seqs) for ci in range(len(sq['crops'])) if sq['glyph_t'][ci] is not None)
extra = sum(feats[(si, 0)].pow(2).sum() for si in range(2)) / want
assert torch.allclose(blank - plain, extra, rtol=1e-4), (float(blank - plain), float(extra))
plain.backward(retain_graph=True)
assert feats[(0, 0)].grad is None or not feats[(0, 0)].grad.any()
blank.backward()
assert feats[(0, 0)].grad.abs().sum() > 0 and feats[(0, 1)].grad.abs().sum() > 0
print('ok')
PYEOF
	echo "$output"
	[ "$output" = ok ]
	T="$BATS_TEST_TMPDIR/blank"
	run $PY scripts/ref/oracle_read.py --ckpt runs/nshape/ckpt-0004128.pt --feats glyphs --slots --bind 0.5 --scale 8 \
		--tasks receipt_total --batch 1 --samples 1 --every 1 --n 1 --save "$T-lm.pt"
	[ "$status" -eq 0 ]
	run $PY scripts/ref/tower_code.py --ckpt "$T-lm.pt" --save "$T.pt" --tasks receipt_read --blank-overview \
		--samples 1 --batch 1 --every 1 --n 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_code step 1 (1 samples"*"text: glyph "*" overview rms "* ]]
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact; print(compact.load('$T.pt')['state']['tower_code']['blank_overview'])"
	[ "$output" = True ]
}

@test "tower_distill.py: scenes at 16x learn one tower's rows, text at 4x another's; a teacher equal to the student is error 0; the language model is kept; graft.py carries its state; bad usage is one line; train.py --mode-by-task" {
	T="$BATS_TEST_TMPDIR/drun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 512 --task-weights text=1 --mode-by-task
	[ "$status" -eq 0 ]
	grep -q 'scenes trained at 16x, every other image at 4x (--mode-by-task)' "$T/train.log"
	C=$(ls "$T"/ckpt-*.pt)
	run $PY - "$C" "$T/other.pt" <<'PYEOF'
import sys, torch
sys.path.insert(0, 'scripts/ref')
import compact
from model import MiniCPMV
from train import sample_merge
d = compact.load(sys.argv[1])
assert d['state']['mode_by_task'] is True
# --mode-by-task: scenes 16x (merge 4), every other image 4x (merge 2), whatever --p4x says
assert all(sample_merge('scene_' + t, i, 1.0, True) == 4 for t in ('count', 'caption', 'left') for i in range(20))
assert all(sample_merge(t, i, 0.0, True) == 2 for t in ('receipt_read', 'screenshot_read') for i in range(20))
assert {sample_merge('scene_count', i, 1.0) for i in range(20)} == {2} and {sample_merge('receipt_read', i, 0.0) for i in range(20)} == {4}
# a second tower: the same shape, other weights
torch.manual_seed(5)
m = MiniCPMV.from_config(d['config'])
d['model'] = {k: (m.state_dict()[k] if k.startswith('vision.') else v) for k, v in d['model'].items()}
compact.save(d, sys.argv[2])
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	run $PY scripts/ref/tower_distill.py --ckpt "$C" --scenes "$C" --text "$C" --save "$T/same.pt" --steps 1 --every 1 --n 2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_distill step 0: scene rel err 0.0000  text rel err 0.0000"* ]]
	run $PY scripts/ref/tower_distill.py --ckpt "$C" --scenes "$T/other.pt" --text "$C" --save "$T/td.pt" \
		--steps 8 --every 4 --n 3 --lr 3e-3 --first 1000
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"tower_distill: wrote $T/td.pt (8 steps, 32 samples)"* ]]
	# the scene rows move toward the other tower's
	e0=$(echo "$output" | sed -n 's/^tower_distill step 0: scene rel err \([0-9.]*\).*/\1/p')
	e8=$(echo "$output" | sed -n 's/^tower_distill step 8 .*scene rel err \([0-9.]*\).*/\1/p')
	echo "scene rel err $e0 -> $e8"
	awk -v a="$e0" -v b="$e8" 'BEGIN { exit !(a > 0.1 && b < 0.9 * a) }'
	run $PY - "$C" "$T/td.pt" <<'PYEOF'
import sys, torch
sys.path.insert(0, 'scripts/ref')
import compact
a, b = compact.load(sys.argv[1]), compact.load(sys.argv[2])
assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'] if k.startswith('text.'))
assert any(not torch.equal(a['model'][k], b['model'][k]) for k in a['model'] if k.startswith('vision.'))
assert b['state']['tower_distill']['first_next'] == 1032 and b['state']['step'] == a['state']['step']
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	# graft.py carries where the tower's stage stopped, so a next leg draws new samples
	run $PY scripts/ref/graft.py --text "$C" --tower "$T/td.pt" --out "$T/g.pt"
	[ "$status" -eq 0 ]
	run $PY -c "import sys; sys.path.insert(0, 'scripts/ref'); import compact; print(compact.load('$T/g.pt')['state']['tower_distill']['first_next'])"
	[ "$output" = 1032 ]
	run $PY scripts/ref/tower_distill.py --ckpt "$C" --scenes "$T/none.pt" --text "$C" --save "$T/x.pt"
	[ "$status" -ne 0 ]
	[ "$output" = "tower_distill: $T/none.pt: no such file" ]
	run $PY scripts/ref/tower_distill.py --ckpt "$C" --scenes "$C" --text "$C" --save "$T/x.pt" --tasks scene_count,text
	[ "$status" -ne 0 ]
	[ "$output" = "tower_distill: text: not an image task" ]
	run $PY scripts/ref/tower_distill.py --ckpt "$C" --scenes "$C" --text "$C" --save "$T/x.pt" --every 0
	[ "$status" -ne 0 ]
	[ "$output" = "tower_distill: --batch, --n and --every must be at least 1, --steps not negative" ]
	[ ! -e "$T/x.pt" ]
	rm -rf "$T"
}

@test "average.py: the mean of checkpoints' weights; codes alike in every file stay exact; no optimizer state; clear errors" {
	T="$BATS_TEST_TMPDIR"
	run $PY - "$T" <<'PYEOF'
import sys, torch
sys.path.insert(0, 'scripts/ref')
import compact
g = torch.Generator().manual_seed(1)
code = torch.randn(5, 3, generator=g)
for i in range(3):
    d = dict(model={'w': torch.randn(4, 6, generator=g), 'n': torch.tensor([i, 7])},
             probe={'h': torch.randn(3, generator=g)}, glyph_code={'E': code.clone()},
             opt={'m': torch.ones(2)}, state={'step': 100 + i}, config={'dim': 4})
    torch.save(d, f'{sys.argv[1]}/a{i}.pt')
# a compact file averages like a full one
d = torch.load(f'{sys.argv[1]}/a2.pt')
d['compact'] = ['model']
d['model'] = {n: compact.pack(t) for n, t in d['model'].items()}
torch.save(d, f'{sys.argv[1]}/a2c.pt')
PYEOF
	[ "$status" -eq 0 ]
	run $PY scripts/ref/average.py "$T/avg.pt" "$T/a0.pt" "$T/a1.pt" "$T/a2c.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	run $PY - "$T" <<'PYEOF'
import sys, torch
sys.path.insert(0, 'scripts/ref')
import compact
a = [compact.load(f'{sys.argv[1]}/a{i}.pt') for i in range(2)] + [compact.load(f'{sys.argv[1]}/a2c.pt')]
m = torch.load(f'{sys.argv[1]}/avg.pt')
assert torch.allclose(m['model']['w'], (a[0]['model']['w'] + a[1]['model']['w'] + a[2]['model']['w']) / 3, atol=1e-6)
assert not torch.allclose(m['model']['w'], a[0]['model']['w'])
assert torch.equal(m['model']['n'], a[0]['model']['n'])
assert torch.allclose(m['probe']['h'], sum(x['probe']['h'] for x in a) / 3)
assert torch.equal(m['glyph_code']['E'], a[0]['glyph_code']['E'])
assert m['opt'] is None and m['state']['step'] == 100 and m['state']['average'] == ['a0.pt', 'a1.pt', 'a2c.pt']
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
	run $PY scripts/ref/average.py "$T/bad.pt" "$T/a0.pt" "$T/missing.pt"
	[ "$status" -ne 0 ]
	[ "$output" = "average.py: $T/missing.pt: no such file" ]
	[ ! -e "$T/bad.pt" ]
	run $PY scripts/ref/average.py "$T/bad.pt" "$T/a0.pt"
	[ "$status" -ne 0 ]
	[[ "$output" == "usage: average.py OUT.pt CKPT CKPT"* ]]
}

#!/usr/bin/env bats
# fprobe.py, the factored token heads (training only): their targets say a
# token's glyphs in reading order or by place, and train.py --fprobe trains the
# head with the tower, checkpoints it and resumes it.
# Needs Debian's /usr/bin/python3 with torch.

PY=/usr/bin/python3

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	$PY -c 'import torch' 2>/dev/null || skip "no torch in $PY (apt install python3-torch)"
	export OPENBLAS_NUM_THREADS=1
}

teardown() {
	rm -rf "$BATS_TEST_TMPDIR/frun"
}

@test "fprobe targets: slots read each token's glyphs in reading order; places hold every glyph once" {
	run $PY - <<'PYEOF'
import sys
sys.path.insert(0, 'scripts/ref'); sys.path.insert(0, 'scripts/data')
import torch, synth, probe, fprobe
from model import VisionConfig
vc = VisionConfig()
for i in range(12):
    m = []
    s = synth.sample('val', i, task='word_read', marks=m)
    for mg in (4, 2):
        n = (224 // (14 * mg)) ** 2
        cells = probe.crop_cells(m, s['image'].size, vc, mg, fine=True)[0]
        slot = fprobe.targets(cells, n, 'slot')
        # one line of print: the tokens' slots, row-major, spell the answer
        assert ''.join(chr(33 + g) for row in slot.tolist() for g in row if 0 <= g < 94) == s['answer'].replace(' ', '')
        # tokens without glyphs are not asked; tokens with them end in "none"
        held = {ti for ti, _, _ in cells}
        assert all((slot[t, 0] >= 0) == (t in held) for t in range(n))
        place = fprobe.targets(cells, n, 'place')
        assert int(place.sum()) == len(cells)
# two lines in one token: the upper line first, each left to right
c = [(0, 'b', (0.7, 0.8)), (0, 'a', (0.2, 0.75)), (0, 'D', (0.9, 0.1)), (0, 'C', (0.1, 0.15))]
assert ''.join(chr(33 + g) for g in fprobe.targets(c, 1, 'slot')[0].tolist() if g < 94) == 'CDab'
# the head: logits per slot over the glyphs and "none"; the loss falls when trained
torch.manual_seed(0)
h = fprobe.FactoredHead(16, 'slot')
x = torch.randn(5, 16)
t = torch.randint(0, 95, (5, fprobe.SLOTS))
t[1] = -1
opt = torch.optim.Adam(h.parameters(), lr=0.05)
l0 = float(fprobe.loss(h, x, t))
for _ in range(100):
    opt.zero_grad(); fprobe.loss(h, x, t).backward(); opt.step()
assert float(fprobe.loss(h, x, t)) < l0 / 2, (l0, float(fprobe.loss(h, x, t)))
assert fprobe.loss(h, x, torch.full((5, fprobe.SLOTS), -1)) is None
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
}

@test "train.py --fprobe: the factored head trains, is checkpointed with its mode and resumed" {
	T="$BATS_TEST_TMPDIR/frun"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 1024 \
		--task-weights word_read=1 --probe 0.3 --fprobe 1 --fprobe-mode slot --log-every 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"factored token head (slot) weight 1"* ]]
	[[ "$output" == *" fprobe "[0-9]* ]]
	cat >"$BATS_TEST_TMPDIR/f.py" <<'PYEOF'
import glob, hashlib, json, sys, torch
d = torch.load(sorted(glob.glob(sys.argv[1] + '/ckpt-*.pt'))[-1], map_location='cpu')
h = lambda t: hashlib.sha1(t.numpy().tobytes()).hexdigest()
print(json.dumps(dict(mode=d['fprobe_mode'], head=h(d['fprobe']['glyph']), opt=int(d['fprobe_opt']['state'][0]['step']),
                      step=d['state']['step'])))
PYEOF
	$PY "$BATS_TEST_TMPDIR/f.py" "$T" >"$BATS_TEST_TMPDIR/a.json"
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 1024 \
		--task-weights word_read=1 --probe 0.3 --fprobe 1 --fprobe-mode slot
	[ "$status" -eq 0 ]
	$PY "$BATS_TEST_TMPDIR/f.py" "$T" >"$BATS_TEST_TMPDIR/b.json"
	# the other mode is a different head: it starts afresh
	run $PY scripts/ref/train.py --out "$T" --max-steps-this-run 1 --threads 1 --pool 4 --tokens 1024 \
		--task-weights word_read=1 --probe 0.3 --fprobe 1 --fprobe-mode place
	[ "$status" -eq 0 ]
	$PY "$BATS_TEST_TMPDIR/f.py" "$T" >"$BATS_TEST_TMPDIR/c.json"
	run $PY - "$BATS_TEST_TMPDIR"/[abc].json <<'PYEOF'
import json, sys
a, b, c = (json.load(open(f)) for f in sys.argv[1:4])
assert a['mode'] == b['mode'] == 'slot' and a['opt'] == 1 and b['opt'] == 2, (a, b)
assert a['head'] != b['head'] and b['step'] == a['step'] + 1, (a, b)
assert c['mode'] == 'place' and c['opt'] == 1, c
print('ok')
PYEOF
	echo "$output"
	[[ "$output" == *ok ]]
}

@test "oracle_read.py --fprobe trains the tower only" {
	run $PY scripts/ref/oracle_read.py --ckpt /nonexistent --feats oracle --fprobe 1
	[ "$status" -ne 0 ]
	[[ "$output" == *"--fprobe trains the tower"* ]]
	[ "${#lines[@]}" -eq 1 ]
}

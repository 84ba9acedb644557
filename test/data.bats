#!/usr/bin/env bats
# Synthetic data, tokenizer and metrics of the proving model (scripts/data/).

PY=/usr/bin/python3

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	$PY -c 'import PIL, numpy' 2>/dev/null || skip "no PIL/numpy for $PY"
	[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || [ -n "$MCV_FONT_DIR" ] ||
		skip "no DejaVu fonts (fonts-dejavu-core)"
	T=$(mktemp -d)
}

teardown() {
	[ -n "$T" ] && rm -rf "$T"
}

@test "gen.py: the same arguments write the same bytes" {
	PYTHONHASHSEED=1 $PY scripts/data/gen.py --split test --n 12 --out "$T/a"
	PYTHONHASHSEED=2 $PY scripts/data/gen.py --split test --n 12 --out "$T/b"
	cmp "$T/a/data.jsonl" "$T/b/data.jsonl"
	diff -r "$T/a/images" "$T/b/images"
	[ "$(wc -l < "$T/a/data.jsonl")" -eq 12 ]
	[ "$(ls "$T/a/images" | wc -l)" -gt 0 ]
}

@test "gen.py: splits and fresh seeds are different data" {
	$PY scripts/data/gen.py --split train --n 6 --task all --out "$T/train"
	$PY scripts/data/gen.py --split test --n 6 --task all --out "$T/test"
	$PY scripts/data/gen.py --seed 7 --n 6 --task all --out "$T/s7"
	$PY - "$T" <<'EOF'
import json, sys
d = {k: [json.loads(l) for l in open(f"{sys.argv[1]}/{k}/data.jsonl")] for k in ("train", "test", "s7")}
assert all(len(v) == 48 for v in d.values())
for a, b in (("train", "test"), ("train", "s7"), ("test", "s7")):
    # image tasks: (prompt, answer) pairs almost never repeat across splits
    x = {(r["prompt"], r["answer"]) for r in d[a] if r["task"] in ("receipt_read", "screenshot_read")}
    y = {(r["prompt"], r["answer"]) for r in d[b] if r["task"] in ("receipt_read", "screenshot_read")}
    assert not x & y, (a, b, x & y)
EOF
	run $PY scripts/data/gen.py --seed -1 --n 1 --out "$T/x"
	[ "$status" -eq 2 ]
}

@test "synth: every task answers with its ground truth" {
	$PY - <<'EOF'
import json, random, re, sys
sys.path.insert(0, "scripts/data")
import synth
from PIL import Image
for t in synth.TASKS + synth.TRAIN_TASKS:
    for i in range(5):
        s = synth.sample("val", i, task=t)
        assert s["task"] == t and s["prompt"] and s["answer"], s
        assert (s["image"] is None) == (t == "text"), t
        if s["image"] is not None:
            assert isinstance(s["image"], Image.Image) and s["image"].mode == "RGB"
a, b = synth.sample("val", 3), synth.sample("val", 3)
assert a["prompt"] == b["prompt"] and a["answer"] == b["answer"]
assert a["image"] is None or a["image"].tobytes() == b["image"].tobytes()
# curriculum tasks are trained on but never drawn for a split by sample()
assert not any(synth.sample("val", i)["task"] in synth.TRAIN_TASKS for i in range(300))
# snippets: 1-3 printed lines of a receipt or window (runs of words in large print), on one 224x224 crop
for i in range(50):
    s = synth.sample("train", i, task="snippet_read")
    assert s["image"].size == (224, 224) and 1 <= len(s["answer"].split("\n")) <= 3, s
    assert not synth.snippet_is_large("train", i) or len(s["answer"].split("\n")) <= 2, s
assert 10 < sum(synth.snippet_is_large("train", i) for i in range(50)) < 40
# words: one short string (a price, number, code or word) in large print on one 224x224 crop
for i in range(280, 330):    # 297 and 315 are two-word items
    s = synth.sample("train", i, task="word_read")
    assert s["image"].size == (224, 224) and len(s["answer"]) <= 12, s
    assert re.fullmatch(r"[A-Za-z0-9.]+( [A-Za-z0-9.]+)?", s["answer"]), s
# receipts: the printed total is the sum of the items plus the printed tax
for i in range(200):
    rng = random.Random(i)
    store, lines, items, total = synth.receipt_content(rng)
    tax = sum(int(r.replace(".", "")) for k, l, r in lines if l.upper().startswith("TAX"))
    shown = [int(r.replace(".", "")) for k, l, r in lines if k == "total"]
    assert shown == [total] and total == sum(c for _, c in items) + tax, (lines, total)
    # items JSON lists exactly the printed item rows
    printed = [(l, r) for k, l, r in lines if k == "row" and not l.upper().startswith(("SUBTOTAL", "TAX"))]
    assert printed == [(n, synth.money(c)) for n, c in items]
# sample() asks about the receipt receipt_content() describes
for i in range(20):
    s = synth.sample("val", i, task="receipt_total")
    assert synth.money(synth.receipt_content(synth.rngs_for("val", i, "receipt_total")[1])[3]) == s["answer"]
# scenes: caption in left-to-right order, count matches, left-of is unambiguous
for i in range(200):
    rng = random.Random(i)
    objs = synth.scene_objects(rng)
    xs = sorted(o["x"] for o in objs)
    assert all(b - a >= 12 for a, b in zip(xs, xs[1:]))
    parts = re.split(r", | and ", synth.caption(objs))
    assert parts == [synth.describe(o) for o in sorted(objs, key=lambda o: o["x"])]
for i in range(100):
    s = synth.sample("test", i, task="scene_left")
    assert re.fullmatch(r"a (small|large) [a-z]+ [a-z]+", s["answer"]), s
EOF
}

@test "synth marks: glyph centres sit on ink, shape centres on their colour, each in one token per crop" {
	$PY - <<'EOF'
import sys
sys.path.insert(0, "scripts/data"); sys.path.insert(0, "scripts/ref")
import numpy as np
import synth, probe
from model import VisionConfig, image_to_crops
vc = VisionConfig()
on_ink = total = 0
for t in ("receipt_read", "screenshot_read", "snippet_read", "word_read", "scene_caption", "scene_count"):
    for i in range(6):
        m = []
        s = synth.sample("val", i, task=t, marks=m)
        plain = synth.sample("val", i, task=t)
        assert s["image"].tobytes() == plain["image"].tobytes() and s["answer"] == plain["answer"]
        a = np.asarray(s["image"], dtype=np.float32)
        if t.startswith("scene"):
            assert 1 <= len(m) <= 5
            for x, y, (_, colour, shape, size) in m:
                want = np.array(synth.COLOURS[colour], np.float32)
                assert np.abs(a[int(y), int(x)] - want).max() < 40, (t, i, colour, a[int(y), int(x)])
        else:
            # the text's characters, in order, are the marks' (spaces carry none)
            assert "".join(c for _, _, c in m) == "".join(s["answer"].split()), (t, i)
            lum = a.mean(2)
            bg = np.median(lum)
            for x, y, c in m:
                box = lum[max(0, int(y) - 3):int(y) + 4, max(0, int(x) - 3):int(x) + 4]
                total += 1
                on_ink += abs(box - bg).max() > 60
        for mg in (4, 2):
            crops, grid = image_to_crops(s["image"], vc, mg)
            cells = probe.crop_cells(m, s["image"].size, vc, mg)
            assert len(cells) == len(crops)
            assert len(cells[0]) == len(m)   # the overview sees every mark
            if grid is not None:             # and every mark is in exactly one tile
                assert sum(len(c) for c in cells[1:]) == len(m)
            if not t.startswith("scene"):
                # the glyph-position targets: one bit per glyph in the patch its centre is in
                # (two equal glyphs in one patch share it), the patch as the overview scaled it
                tg = probe.sub_targets(m, s["image"].size, vc, mg, [c.shape for c in crops])
                ov = probe.slice_plan(*s["image"].size, vc, mg)[0]
                nx = ov[0] // (vc.patch * mg)
                bits = tg[0].nonzero().tolist()
                assert 0.9 * len(m) <= len(bits) <= len(m), (len(bits), len(m))
                want = {(int(y * ov[1] / s["image"].size[1] // vc.patch), int(x * ov[0] / s["image"].size[0] // vc.patch), c)
                        for x, y, c in m}
                got = set()
                for ti, j in bits:
                    si, g = divmod(j, probe.N_GLYPH)
                    got.add(((ti // nx) * mg + si // mg, (ti % nx) * mg + si % mg, chr(33 + g)))
                assert got == want, (t, i, mg, sorted(got ^ want)[:5])
assert on_ink > 0.97 * total, (on_ink, total)
EOF
}

@test "metrics: CER, exact match, JSON items" {
	$PY - <<'EOF'
import sys
sys.path.insert(0, "scripts/data")
import metrics as m
assert m.cer("abc", "abc") == 0.0
assert abs(m.cer("kitten", "sitting") - 3 / 6) < 1e-12
assert m.cer("ab", "") == 1.0 and m.cer("", "") == 0.0
assert m.cer("a\nb", "a  \nb ") == 0.0
assert m.levenshtein("flaw", "lawn") == 2
assert m.exact("receipt_total", "23.40", "$23.4") == 1
assert m.exact("receipt_total", "23.40", "23.41") == 0
assert m.exact("receipt_total", "23.40", "") == 0
assert m.exact("scene_caption", "a small red circle", "A small red circle.") == 1
assert m.exact("scene_caption", "a small red circle", "a large red circle") == 0
assert m.exact("scene_count", "3", "There are three shapes.") == 1
assert m.exact("text", "HELLO", "hello") == 0
ref = '[{"name":"MILK","price":"1.20"},{"name":"EGGS","price":"2.00"}]'
assert m.exact("receipt_items", ref, '[{"name": "milk", "price": 1.2}, {"name":"EGGS","price":"2"}]') == 1
assert m.exact("receipt_items", ref, '[{"name":"MILK","price":"1.20"}]') == 0
assert m.exact("receipt_items", ref, 'not json') == 0
assert abs(m.items_f1(ref, '[{"name":"MILK","price":"1.20"}]') - 2 / 3) < 1e-12
r = m.score([("receipt_read", "abcd", "abcd"), ("receipt_read", "abcdef", "abXdef")])
assert r["receipt_read"]["n"] == 2 and abs(r["receipt_read"]["cer"] - 1 / 10) < 1e-12
assert m.meets("receipt_read", r["receipt_read"]) is False
# where captions go wrong: the number of shapes, each attribute by position, the set in any order
ref = "a small red circle, a large blue star and a small green square"
c = m.score([("scene_caption", ref, "a small green square, a large blue star and a small red circle"),
             ("scene_caption", ref, "a small red circle and a large blue hexagon"),
             ("scene_caption", "a large black triangle", "A large black triangle.")])["scene_caption"]
assert c["exact"] == 1 / 3 and c["objects"] == 2 / 3 and c["set"] == 2 / 3, c
assert (c["size"], c["colour"], c["shape"]) == (6 / 6, 4 / 6, 3 / 6), c
EOF
}

@test "eval.py: perfect predictions meet the goals, empty ones do not" {
	$PY scripts/data/gen.py --split test --n 3 --task all --out "$T/g"
	$PY -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(json.dumps({"id": r["id"], "output": r["answer"]}))' "$T/g/data.jsonl" > "$T/p.jsonl"
	run $PY scripts/eval.py --split test --n 3 --task all --check "$T/p.jsonl"
	[ "$status" -eq 0 ]
	[[ "$output" == *"receipt_read"*"cer"*"0.0000"* ]]
	[[ "$output" == *"scene_count"*"1.0000"* ]]
	: > "$T/empty.jsonl"
	run $PY scripts/eval.py --split test --n 3 --task all --check "$T/empty.jsonl"
	[ "$status" -eq 1 ]
	[[ "$output" == *"MISSED"* ]]
	echo '{"id":"train-000001","output":"x"}' > "$T/wrong.jsonl"
	run $PY scripts/eval.py --split test --n 3 --task all "$T/wrong.jsonl"
	[ "$status" -eq 1 ]
}

@test "eval.py: scene_count is scored per question kind (all shapes, a shape, a colour)" {
	$PY scripts/data/gen.py --split val --n 60 --task scene_count --out "$T/g"
	# right answers except to "How many <shape>s are there?", which get "9"
	$PY -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); w = r["prompt"].split()
    shape = w[:2] == ["How", "many"] and w[2] != "shapes" and w[3] != "shapes"
    print(json.dumps({"id": r["id"], "output": "9" if shape else r["answer"]}))' "$T/g/data.jsonl" > "$T/p.jsonl"
	run $PY scripts/eval.py --split val --n 60 --task scene_count --json "$T/p.jsonl"
	[ "$status" -eq 0 ]
	$PY -c 'import json,sys
r = json.loads(sys.argv[1])["scene_count"]
assert r["exact_all"] == 1 and r["exact_colour"] == 1 and r["exact_shape"] == 0, r
assert r["n_all"] + r["n_colour"] + r["n_shape"] == 60 and min(r["n_all"], r["n_colour"], r["n_shape"]) > 5, r
assert abs(r["exact"] - 1 + r["n_shape"] / 60) < 1e-9, r' "$output"
	run $PY scripts/eval.py --split val --n 60 --task scene_count "$T/p.jsonl"
	[[ "$output" == *"shape    0.0000"* ]]
}

@test "bpe: tokenizer.json is well formed and round-trips text and bytes" {
	$PY - <<'EOF'
import sys
sys.path.insert(0, "scripts/data")
import bpe
tok = bpe.default()
n = len(tok.tokens)
assert 2048 <= n <= 4096 and len(tok.token_type) == n, n
assert [tok.tokens[b] for b in range(256)] == [bpe.B2U[b] for b in range(256)]
for r, mg in enumerate(tok.merges):  # merge r creates token 256 + r
    a, b = mg.split(" ")
    assert tok.tokens[256 + r] == a + b and a in tok.ids and b in tok.ids
assert len(set(tok.tokens)) == n
for t, ty in bpe.SPECIALS:
    assert tok.token_type[tok.ids[t]] == ty
assert bpe.selftest(tok, 300) == 0
chat = bpe.chat("Read all text.", "TOTAL 1.00", image=True)
ids = tok.encode(chat)
assert tok.decode(ids) == chat
assert ids.count(tok.ids["<image>"]) == 1 and ids.count(tok.ids["<|im_end|>"]) == 2
assert tok.ids["<image>"] not in tok.encode("<image>", special=False)
EOF
}

@test "bpe: hand-written pre-tokenizer agrees with the regex module" {
	rx=""
	for p in /usr/bin/python3 python3; do
		if command -v "$p" >/dev/null && "$p" -c 'import regex' 2>/dev/null; then rx=$p; break; fi
	done
	[ -n "$rx" ] || skip "no python with the regex module"
	"$rx" - <<'EOF'
import random, sys, unicodedata
import regex
sys.path.insert(0, "scripts/data")
import bpe
PAT = {
 "qwen35": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
 "qwen2": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}
rng = random.Random(3)
alpha = "abcXYZ 019'\n\r\t.,!?-$% éüñ中文字\u0301\u0308\u00a0\u2003🙂<>|_/sSlLdD\u00b2\u0660"
bad = 0
for pre, p in PAT.items():
    r = regex.compile(p)
    for k in range(3000):
        if k % 4 == 0:  # assigned code points only: Unicode versions differ on new ones
            s = "".join(c for c in (chr(rng.randint(1, 0x3000)) for _ in range(20))
                        if unicodedata.category(c) != "Cn")
        else:
            s = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 25)))
        if r.findall(s) != bpe.pretokenize(s, pre):
            bad += 1
            print(pre, repr(s), r.findall(s), bpe.pretokenize(s, pre))
assert bad == 0
EOF
}

@test "bpe: encodes chat turns and unicode exactly as llama.cpp does" {
	command -v node >/dev/null || skip "no node"
	[ -d scripts/peer/node_modules/node-llama-cpp ] || skip "peer absent (sh scripts/setup.sh)"
	$PY scripts/data/vocab_gguf.py "$T/vocab.gguf"
	# a second vocabulary whose merges cross accents, marks, CJK and spaces
	$PY - "$T/uni.gguf" <<'PYEOF'
import random, sys
sys.path.insert(0, "scripts/data")
import bpe, vocab_gguf
rng = random.Random(5)
alpha = "abcXYZ 019'\n\r\t.,!?-$% éüñ中文字\u0301\u00a0\u2003🙂<>|_/sSlLdD"
texts = ["".join(rng.choice(alpha) for _ in range(rng.randint(1, 30))) for _ in range(300)]
tok = bpe.train(texts, 700)
bpe.save(tok, sys.argv[1][:-5] + ".json")
vocab_gguf.write_vocab_gguf(sys.argv[1], tok)
PYEOF
	$PY - > "$T/lines.jsonl" <<'PYEOF'
import json, random, sys
sys.path.insert(0, "scripts/data")
import synth, bpe
for i in range(80):
    s = synth.sample("val", i)
    print(json.dumps(bpe.chat(s["prompt"], s["answer"], s["image"] is not None)))
rng = random.Random(11)
alpha = "abcXYZ 019'\n\r\t.,!?-$% éüñ中文字\u0301\u00a0\u2003🙂<>|_/sSlLdD"
for i in range(80):
    print(json.dumps("".join(rng.choice(alpha) for _ in range(rng.randint(1, 30)))))
print(json.dumps("x<think>y</think> <unk> <|endoftext|>hi <slice>a</slice>\n<image_id>1</image_id>"))
PYEOF
	for v in vocab uni; do
		node scripts/peer-tokenize.mjs "$T/$v.gguf" < "$T/lines.jsonl" > "$T/$v.peer" 2>"$T/peer.err"
		$PY - "$T" "$v" <<'PYEOF'
import json, sys
sys.path.insert(0, "scripts/data")
import bpe
d, v = sys.argv[1], sys.argv[2]
tok = bpe.default() if v == "vocab" else bpe.Tokenizer.load(f"{d}/{v}.json")
lines = [json.loads(l) for l in open(f"{d}/lines.jsonl")]
peer = [json.loads(l) for l in open(f"{d}/{v}.peer")]
assert len(peer) == len(lines) == 161, len(peer)
bad = [(t, p, tok.encode(t)) for t, p in zip(lines, peer) if p != tok.encode(t)]
for x in bad[:5]:
    print(v, x)
assert not bad, len(bad)
PYEOF
	done
}

@test "synth.dense_text: same crop for the same index, glyph centres on ink, one patch bit per glyph, edge tolerance" {
	$PY - <<'EOF2'
import sys
sys.path.insert(0, "scripts/data"); sys.path.insert(0, "scripts/ref")
import numpy as np, torch
import synth, probe
on_ink = total = 0
for i in range(12):
    img, m = synth.dense_text("val", i)
    img2, m2 = synth.dense_text("val", i)
    assert img.tobytes() == img2.tobytes() and m == m2
    assert img.tobytes() != synth.dense_text("train", i)[0].tobytes()
    assert img.size == (224, 224) and len(m) >= 40, (i, len(m))
    lum = np.asarray(img, dtype=np.float32).mean(2)
    bg = np.median(lum)
    for x, y, c in m:
        assert 0 <= x < 224 and 0 <= y < 224 and c != " "
        box = lum[max(0, int(y) - 3):int(y) + 4, max(0, int(x) - 3):int(x) + 4]
        total += 1
        on_ink += abs(box - bg).max() > 60
    t = probe.patch_targets(m)
    assert t.shape == (256, probe.N_GLYPH)
    # two equal glyphs in one patch share a bit; anything else is one bit per glyph
    assert 0.9 * len(m) <= t.sum() <= len(m), (t.sum(), len(m))
    for x, y, c in m:
        assert t[int(y // 14) * 16 + int(x // 14), ord(c) - 33] == 1
    # the recall metric: a head that reads the targets back is perfect, a constant one is not
    ident = torch.nn.Linear(probe.N_GLYPH, probe.N_GLYPH)
    with torch.no_grad():
        ident.weight.copy_(torch.eye(probe.N_GLYPH)); ident.bias.zero_()
    h, n = probe.patch_recall(ident, t, t)
    assert h == n == int(t.sum()), (h, n)
    with torch.no_grad():
        ident.weight.zero_(); ident.bias.copy_(torch.arange(probe.N_GLYPH, dtype=torch.float32))
    h, n = probe.patch_recall(ident, t, t)
    assert h < 0.5 * n, (h, n)
    # edge tolerance: the same glyphs, plus don't-care (-1) entries only in a neighbour of a
    # patch holding that glyph within 2 px of their shared edge; the loss does not see them
    t2 = probe.patch_targets(m, tol=2)
    assert torch.equal((t2 > 0).float(), t) and (t2 < 0).any()
    for p, g in torch.nonzero(t2 < 0).tolist():
        py, px = divmod(p, 16)
        assert any(ord(c) - 33 == g and abs(x - 14 * (px + 0.5)) < 7 + 2 and abs(y - 14 * (py + 0.5)) < 7 + 2
                   and int(y // 14) * 16 + int(x // 14) != p for x, y, c in m), (p, g)
    rows = torch.randn(256, probe.N_GLYPH)
    moved = rows.clone()
    p0, g0 = torch.nonzero(t2 < 0)[0].tolist()
    ident2 = torch.nn.Linear(probe.N_GLYPH, probe.N_GLYPH)
    with torch.no_grad():
        ident2.weight.copy_(torch.eye(probe.N_GLYPH)); ident2.bias.zero_()
    a = probe.patch_loss(ident2, rows, t2)
    moved[p0, g0] += 50.0          # the head now shouts the glyph in the don't-care patch
    assert torch.allclose(probe.patch_loss(ident2, moved, t2), a)
    assert probe.patch_loss(ident2, moved, t) > a     # the centre rule holds it against the head
assert on_ink > 0.95 * total, (on_ink, total)
print("ok")
EOF2
}

#!/usr/bin/env bats
# Several images in one mcv-run prompt (`-i a.png -i b.png`), on the shipped
# proving model, against the PyTorch reference (scripts/ref/dump_vision.py
# chat --image: the layout the model was trained with):
#
#   <|im_start|>user\n
#   <image_id>0</image_id><image>[ov]</image><slice>[s]</slice>...\n
#   <image_id>1</image_id><image>[ov]</image>...\n
#   {prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
#
# ids count stills from 0 and appear only when there are two or more; a
# single image has no id.  mcv-run's prompt length (text tokens + visual
# rows) must equal the reference's, and its greedy answer must be the
# reference's, token by token with the reference teacher-forced on mcv's
# answer, tokenized again as mcv-run generated it (each the reference's
# argmax or within 0.05 of its logit: with three unrelated images the first
# token is a near-tie).
#
# The answers are compared on F32 copies of the shipped files (the Q8_0
# weights dequantized, parity_c.write_f32), as ref-parity.bats compares the
# text model: the float reference is the oracle for float numerics, and a
# Q8_0 file on a prompt this far from training (three unrelated images)
# carries the Q8_0 rounding of activations, which the C side does as ggml
# and the reference does not, past any fixed logit bound (session 37: one
# token 0.093 under the argmax in Q8_0, in bounds in F32).  The Q8_0 files
# against the reference, one image at a time: vision-parity.bats.
#
# llama.cpp's mtmd (tools/mtmd, projector minicpmv4_6 and the minicpmv
# 2.6-style versions) differs on purpose, see lib/multimodal.h: it emits no
# <image_id> at all, no "\n" after an image block, and mtmd-cli appends the
# images after the prompt text unless the prompt holds <__media__> markers.
# The checks below pin our layout, so a change towards mtmd's shows up here.

PY=/usr/bin/python3
IMG=examples/images

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	export RUN="${BIN:-bin}/mcv-run"
	export M="$BATS_FILE_TMPDIR"
	export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
	# the F32 copies (setup skips every test when the files or torch are missing)
	if [ -f examples/models/proving-mmproj.gguf ] && $PY -c 'import torch' 2>/dev/null; then
		$PY -c 'import sys; sys.path.insert(0, "scripts/ref"); import parity_c
for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
    parity_c.write_f32(src, dst)' examples/models/proving-text.gguf "$M/text-f32.gguf" \
			examples/models/proving-mmproj.gguf "$M/mmproj-f32.gguf" || return 1
	fi
	cat > "$M/ref.py" <<'EOF'
import json, sys
sys.path.insert(0, 'scripts/ref')
sys.path.insert(0, 'scripts/data')
import chatfmt, dump, dump_vision, export
from PIL import Image
text, mmproj, prompt, mcv_json, forced, *imgs = sys.argv[1:]
tok = dump.tokenizer_from_gguf(text)
m = export.load(text, mmproj)
if len(imgs) == 1:
    sq = chatfmt.encode_sample(tok, dict(prompt=prompt, image=Image.open(imgs[0]), answer=None), m.vc)
else:
    sq = dump_vision.encode_multi(tok, [(Image.open(f).convert('RGB'), False) for f in imgs], prompt, m.vc)
got = json.load(open(mcv_json))
# mcv-run prints text, not ids: its answer tokenized again, as BPE or, for a model trained to
# read one character per token (train.py --spell), spelled; the one with mcv-run's token count
ids = tok.encode(got['text'])
if len(ids) != got['tokens']:
    ids = chatfmt.spelled(tok, got['text'])
assert len(ids) == got['tokens'], 'the answer tokenizes to neither BPE nor spelled tokens'
assert tok.decode(ids) == got['text'], 'the answer does not re-tokenize to itself'
# mcv-run does not print positions: the reference's own, so --check tests the tokens
json.dump(dict(ids=ids, next_pos=sq['next_pos'] + len(ids)), open(forced, 'w'))
print('prompt tokens: mcv-run %d, reference %d' % (got['prompt_tokens'], len(sq['ids'])))
sys.exit(0 if got['prompt_tokens'] == len(sq['ids']) else 1)
EOF
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -f examples/models/proving-mmproj.gguf ] || skip "examples/models/proving-*.gguf not exported yet"
	$PY -c 'import torch' 2>/dev/null || skip "no torch in $PY (apt install python3-torch)"
	[ -x "$RUN" ] || { echo "not built: $RUN (run make)" >&2; return 1; }
}

# same PROMPT N IMAGE...: mcv-run's prompt length and answer agree with the reference
same() {
	local pr=$1 n=$2; shift 2
	local args=() first=$1 more=()
	for f in "$@"; do args+=(-i "$f"); done
	shift
	for f in "$@"; do more+=(--image "$f"); done
	"$RUN" -m "$M/text-f32.gguf" --mmproj "$M/mmproj-f32.gguf" \
		-t 2 --temp 0 -n "$n" --json -q -p "$pr" "${args[@]}" > "$M/mcv.json" || return 1
	cat "$M/mcv.json"
	run $PY "$M/ref.py" "$M/text-f32.gguf" "$M/mmproj-f32.gguf" "$pr" \
		"$M/mcv.json" "$M/forced.json" "$first" "$@"
	echo "$output"
	[ "$status" -eq 0 ] || return 1
	run $PY scripts/ref/dump_vision.py chat "$M/text-f32.gguf" \
		"$M/mmproj-f32.gguf" "$first" "$pr" "$n" "${more[@]}" --check "$M/forced.json"
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "two receipts: <image_id>0 and 1, answer and prompt length as the reference" {
	same "Read the receipt." 24 $IMG/receipt-1.png $IMG/receipt-2.png
}

@test "the same two receipts the other way round" {
	same "Read the receipt." 24 $IMG/receipt-2.png $IMG/receipt-1.png
}

@test "three stills of different kinds (ids 0, 1, 2)" {
	same "Describe the image." 16 $IMG/scene-1.png $IMG/screenshot-1.png $IMG/receipt-3.png
}

@test "one still: no <image_id>" {
	same "Read the receipt." 24 $IMG/receipt-1.png
}

@test "the ids cost prompt tokens: two stills use more than their blocks alone" {
	# every <image_id>k</image_id> is text in the prompt: 2 stills take
	# more than the sum of each alone minus the shared template
	"$RUN" -m examples/models/proving-text.gguf --mmproj examples/models/proving-mmproj.gguf -t 2 \
		--temp 0 -n 1 --json -q -p "x" -i $IMG/receipt-1.png > "$M/a.json"
	"$RUN" -m examples/models/proving-text.gguf --mmproj examples/models/proving-mmproj.gguf -t 2 \
		--temp 0 -n 1 --json -q -p "x" -i $IMG/receipt-1.png -i $IMG/receipt-1.png > "$M/aa.json"
	one=$(sed 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$M/a.json")
	two=$(sed 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$M/aa.json")
	ids=$($PY -c "
import sys; sys.path.insert(0, 'scripts/ref'); import dump
t = dump.tokenizer_from_gguf('examples/models/proving-text.gguf')
print(len(t.encode('<image_id>0</image_id>')) + len(t.encode('<image_id>1</image_id>')))")
	tmpl=$($PY -c "
import sys; sys.path.insert(0, 'scripts/ref'); import dump
t = dump.tokenizer_from_gguf('examples/models/proving-text.gguf')
print(len(t.encode('<|im_start|>user\n')) + len(t.encode('x<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n')))")
	echo "one $one two $two ids $ids template $tmpl"
	[ "$two" -eq $((2 * one - tmpl + ids)) ]
}

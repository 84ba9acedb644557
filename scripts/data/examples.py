#!/usr/bin/python3
"""Writes the sample images of examples/images/ from the test split.

    examples.py [OUT_DIR]      (default: examples/images)

Three receipts, three screenshots and three scenes, plus truth.jsonl with
every question the data asks about each image and its ground-truth answer,
so `mcv-run` output on them can be checked by eye or by scripts/eval.py.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import synth  # noqa: E402

KINDS = [("receipt", "receipt_read"), ("screenshot", "screenshot_read"),
         ("scene", "scene_caption")]


def main(argv):
    out = argv[0] if argv else os.path.normpath(os.path.join(HERE, "..", "..", "examples", "images"))
    os.makedirs(out, exist_ok=True)
    truth = []
    for kind, task in KINDS:
        for i in range(3):
            s = synth.sample("test", i, task=task)
            name = f"{kind}-{i + 1}.png"
            s["image"].save(os.path.join(out, name))
            truth.append({"image": name, "id": s["id"], "task": task,
                          "prompt": s["prompt"], "answer": s["answer"]})
            if kind == "receipt":  # the same receipt, asked the other receipt questions
                store, lines, items, total = synth.receipt_content(
                    synth.rngs_for("test", i, task)[1])
                truth.append({"image": name, "task": "receipt_total",
                              "prompt": synth.RECEIPT_TOTAL_PROMPTS[0],
                              "answer": synth.money(total)})
                truth.append({"image": name, "task": "receipt_items",
                              "prompt": synth.RECEIPT_ITEMS_PROMPTS[0],
                              "answer": synth.items_json(items)})
    with open(os.path.join(out, "truth.jsonl"), "w", encoding="utf-8") as f:
        for t in truth:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    print(f"examples.py: {len(truth)} questions on 9 images -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/python3
"""Writes a split of the synthetic data to a folder.

    gen.py --split test|--seed N --n N --out DIR [--task T|all] [--start K]

DIR/data.jsonl holds one record per line: id, task, image (path relative to
DIR, or null), prompt, answer; DIR/images/<id>.png holds the images.  With
--task all, N samples of every task are written (a balanced evaluation set);
with one task, N samples of that task; without --task, the split's own mix.
Output depends only on the arguments: the same call writes the same bytes.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth  # noqa: E402


def records(split, seed, n, task=None, start=0):
    """(record, image) for the set the arguments name; shared with eval.py."""
    tasks = synth.TASKS if task == "all" else [task]
    for t in tasks:
        for i in range(start, start + n):
            s = synth.sample(split, i, task=t, seed=seed)
            rec = {"id": s["id"], "task": s["task"],
                   "image": f"images/{s['id']}.png" if s["image"] is not None else None,
                   "prompt": s["prompt"], "answer": s["answer"]}
            yield rec, s["image"]


def add_set_args(ap):
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--split", choices=synth.SPLITS)
    g.add_argument("--seed", type=int, help="a fresh split (seed >= 0)")
    ap.add_argument("--n", type=int, required=True, help="samples (per task with --task)")
    ap.add_argument("--task", choices=list(synth.TASKS) + ["all"])
    ap.add_argument("--start", type=int, default=0, help="first index")


def main(argv):
    ap = argparse.ArgumentParser(prog="gen.py", description=__doc__.split("\n\n")[0])
    add_set_args(ap)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.n < 0 or a.start < 0 or (a.seed is not None and a.seed < 0):
        ap.error("--n, --start and --seed must be >= 0")
    os.makedirs(os.path.join(a.out, "images"), exist_ok=True)
    path = os.path.join(a.out, "data.jsonl")
    tmp = path + ".tmp"
    count = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for rec, img in records(a.split, a.seed, a.n, a.task, a.start):
            if img is not None:
                img.save(os.path.join(a.out, rec["image"]), optimize=False)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            count += 1
    os.replace(tmp, path)
    print(f"gen.py: {count} samples -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/python3
"""Scores model predictions against a synthetic split and prints a table.

    eval.py --split test|--seed N --n N [--task T|all] [--start K] [--json] [--check] PRED.jsonl

PRED.jsonl: one {"id": ..., "output": ...} per line ("-" reads stdin; "text"
or "answer" are accepted in place of "output", and an "image"/"file"/"path"
named <id>.png in place of "id").  The reference set is the one
`scripts/data/gen.py` writes for the same arguments; a reference id with no
prediction is scored as an empty answer, and a prediction with an unknown id
is an error (it means the wrong split or --n).  --check exits 1 when a goal of
the proving-model plan is missed.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
import gen  # noqa: E402
import metrics  # noqa: E402


def read_predictions(path):
    f = sys.stdin if path == "-" else open(path, encoding="utf-8")
    preds = {}
    with f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out = next(d[k] for k in ("output", "text", "answer") if k in d)
                sid = d.get("id")
                if sid is None:  # e.g. mcv-run --jsonl names the image: images/<id>.png
                    f = next(d[k] for k in ("image", "file", "path") if k in d)
                    sid = os.path.splitext(os.path.basename(str(f)))[0]
                preds[str(sid)] = str(out)
            except (ValueError, KeyError, StopIteration, TypeError, AttributeError):
                raise SystemExit(f"eval.py: {path}:{ln}: want a JSON object with id "
                                 "(or image) and output")
    return preds


def main(argv):
    ap = argparse.ArgumentParser(prog="eval.py")
    gen.add_set_args(ap)
    ap.add_argument("--json", action="store_true", help="print the scores as JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("predictions")
    a = ap.parse_args(argv)
    try:
        preds = read_predictions(a.predictions)
    except OSError as e:
        print(f"eval.py: cannot read '{a.predictions}': {e.strerror}", file=sys.stderr)
        return 1
    pairs, seen, missing = [], set(), 0
    for rec, _ in gen.records(a.split, a.seed, a.n, a.task, a.start):
        seen.add(rec["id"])
        if rec["id"] not in preds:
            missing += 1
        kind = gen.synth.count_kind(rec["prompt"]) if rec["task"] == "scene_count" else None
        pairs.append((rec["task"], rec["answer"], preds.get(rec["id"], ""), kind))
    unknown = sorted(set(preds) - seen)
    if unknown:
        print(f"eval.py: {len(unknown)} predictions name ids outside the set "
              f"(first: {unknown[0]}); check --split/--seed/--n/--task", file=sys.stderr)
        return 1
    if missing:
        print(f"eval.py: {missing} of {len(pairs)} samples have no prediction "
              "(scored as empty)", file=sys.stderr)
    res = metrics.score(pairs)
    if a.json:
        print(json.dumps(res, sort_keys=True))
    else:
        print(f"{'task':<16} {'n':>5}  {'metric':<7} {'value':>7}  goal")
        for task in [t for t in gen.synth.TASKS if t in res]:
            r = res[task]
            m = metrics.HEADLINE[task]
            ok = metrics.meets(task, r)
            goal = "" if ok is None else \
                f"{metrics.GOALS[task][1]} {metrics.GOALS[task][2]:.2f} {'ok' if ok else 'MISSED'}"
            print(f"{task:<16} {r['n']:>5}  {m:<7} {r[m]:>7.4f}  {goal}".rstrip())
            for k in ("item_f1", "objects", "set", "size", "colour", "shape"):
                if k in r:
                    print(f"{'':<16} {'':>5}  {k:<7} {r[k]:>7.4f}")
            for k in sorted(k for k in r if k.startswith("exact_")):   # per question kind
                print(f"{'':<16} {r['n_' + k[6:]]:>5}  {k[6:]:<7} {r[k]:>7.4f}")
    missed = [t for t in res if metrics.meets(t, res[t]) is False]
    return 1 if a.check and missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

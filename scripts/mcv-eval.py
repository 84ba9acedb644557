#!/usr/bin/python3
"""Runs mcv-run over a synthetic split and writes predictions for eval.py.

    mcv-eval.py --split test|--seed N --n N [--task T|all] [--start K]
                [--mcv-run BIN] [-m MODEL] [--mmproj FILE] [--compress 4x|16x] [--upscale F]
                [-t THREADS] [--work DIR] -o PRED.jsonl
    then: scripts/eval.py (the same set arguments) PRED.jsonl

The split is written with scripts/data/gen.py into --work (a temporary
folder by default).  Records that share a prompt are run as one mcv-run
batch (image paths on standard input, one JSON line per image), so the model
loads once per prompt; text-only records run one mcv-run each.  Decoding is
greedy (--temp 0), thinking off, as in scripts/ref/chat.py, so the two can
be compared on the same set.  A failed input becomes an empty prediction
and is counted on stderr; the exit status is 1 when any input failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "data"))
import gen  # noqa: E402


def run(cmd, stdin_text):
    p = subprocess.run(cmd, input=stdin_text, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def main(argv):
    ap = argparse.ArgumentParser(prog="mcv-eval.py", description=__doc__.split("\n\n")[0])
    gen.add_set_args(ap)
    ap.add_argument("--mcv-run", default=os.path.join(HERE, "..", "bin", "mcv-run"))
    ap.add_argument("-m", "--model", help="text GGUF (default: mcv-run's default model)")
    ap.add_argument("--mmproj")
    ap.add_argument("--compress", choices=["4x", "16x"])
    ap.add_argument("--upscale", help="mcv-run --upscale F: slices planned as for the picture F times larger")
    ap.add_argument("-t", "--threads", type=int)
    ap.add_argument("-n", "--n-predict", type=int, default=320,
                    help="tokens at most per answer (one per character for a model that spells)")
    ap.add_argument("--work", help="folder for the generated split (default: a temporary one)")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args(argv)

    work = a.work or tempfile.mkdtemp(prefix="mcv-eval.")
    gargs = ["--n", str(a.n), "--start", str(a.start), "--out", work]
    gargs += ["--split", a.split] if a.split else ["--seed", str(a.seed)]
    if a.task:
        gargs += ["--task", a.task]
    gen.main(gargs)
    recs = [json.loads(l) for l in open(os.path.join(work, "data.jsonl"), encoding="utf-8")]

    base = [a.mcv_run, "--temp", "0", "-n", str(a.n_predict), "-q"]
    if a.model:
        base += ["-m", a.model]
    if a.mmproj:
        base += ["--mmproj", a.mmproj]
    if a.compress:
        base += ["--compress", a.compress]
    if a.upscale:
        base += ["--upscale", a.upscale]
    if a.threads:
        base += ["-t", str(a.threads)]

    preds, failed = {}, 0
    groups = {}
    for r in recs:
        if r["image"] is None:
            rc, out, err = run(base + ["--text", "-p", r["prompt"]], None)
            if rc != 0:
                failed += 1
                print(f"mcv-eval.py: {r['id']}: {err.strip()}", file=sys.stderr)
            preds[r["id"]] = out.rstrip("\n") if rc == 0 else ""
        else:
            groups.setdefault(r["prompt"], []).append(r)
    for prompt, rs in groups.items():
        paths = "".join(os.path.join(work, r["image"]) + "\n" for r in rs)
        rc, out, err = run(base + ["--jsonl", "--batch", "-p", prompt], paths)
        byid = {}
        for line in out.splitlines():
            d = json.loads(line)
            sid = os.path.splitext(os.path.basename(d.get("source", "")))[0]
            if "error" in d:
                print(f"mcv-eval.py: {sid}: {d['error']}", file=sys.stderr)
                continue
            byid[sid] = d.get("output", d.get("text", ""))
        for r in rs:
            if r["id"] not in byid:
                failed += 1
            preds[r["id"]] = byid.get(r["id"], "")
        if rc not in (0, 1):
            print(f"mcv-eval.py: mcv-run: {err.strip()}", file=sys.stderr)
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps({"id": r["id"], "output": preds.get(r["id"], "")}) + "\n")
    os.replace(tmp, a.out)
    print(f"mcv-eval.py: {len(recs)} records, {failed} failed -> {a.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

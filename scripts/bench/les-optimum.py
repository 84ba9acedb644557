#!/usr/bin/python3
"""How many expert reads per token could any eviction policy save?

    scripts/bench/les-optimum.py TRACE.jsonl [--slots N] [--prefill]

TRACE is an `mcv-run --mem ... --trace FILE` trace.  Its decode steps'
router choices are replayed through an expert cache of the trace's slot
count (or --slots), with the runtime's one constraint (the experts of the
layer being computed are never evicted), under:

  lru      evict the least recently used expert
  optimum  evict the expert whose next use lies furthest ahead (Belady's
           rule: knows the future, so no real policy can miss less)

and compared with what the traced run itself read for the experts it used
(`missed` + `prefetched` per layer line; prefetches that were never used are
not in the trace: --stats counts them).  With 72 KiB experts the proving model's decode is bound by
the disk, so the ratio run/optimum caps what smarter eviction can buy; the
disk's own parallelism caps the rest (bench-les-proving.sh --device).
"""
import argparse
import bisect
import json
import sys
from collections import defaultdict


def load(path, prefill):
    try:
        with open(path) as f:
            head = json.loads(f.readline())
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"les-optimum: {path}: {e}")
    if head.get("type") != "mcv.les.trace":
        sys.exit(f"les-optimum: {path}: not an mcv-run --trace file")
    steps = [r for r in rows if prefill or r["n_tokens"] == 1]
    if not steps:
        sys.exit(f"les-optimum: {path}: no decode steps (run with -n > 1)")
    return head, steps


def simulate(steps, slots, rule):
    uses = defaultdict(list)                 # (layer, expert) -> step indices
    for i, r in enumerate(steps):
        for e in r["chosen"]:
            uses[(r["layer"], e)].append(i)

    def next_use(key, i):
        a = uses[key]
        j = bisect.bisect_right(a, i)
        return a[j] if j < len(a) else len(steps)

    cache, clock, misses = {}, 0, 0
    for i, r in enumerate(steps):
        need = {(r["layer"], e) for e in r["chosen"]}
        for key in sorted(need):
            clock += 1
            if key in cache:
                cache[key] = clock
                continue
            misses += 1
            if len(cache) >= slots:
                cand = [k for k in cache if k not in need]
                if rule == "lru":
                    victim = min(cand, key=cache.get)
                else:
                    victim = max(cand, key=lambda k: next_use(k, i))
                del cache[victim]
            cache[key] = clock
    return misses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--slots", type=int, default=0, help="cache slots (default: the trace's)")
    ap.add_argument("--prefill", action="store_true", help="count prefill steps too")
    a = ap.parse_args()
    head, steps = load(a.trace, a.prefill)
    slots = a.slots or head["cache_slots"]
    layers = len({r["layer"] for r in steps})
    tokens = len(steps) / layers
    k = max(len(r["chosen"]) for r in steps)
    if slots < k:
        sys.exit(f"les-optimum: {slots} slots cannot hold one layer's {k} experts")
    run = sum(len(r["missed"]) + len(r["prefetched"]) for r in steps) / tokens
    lru = simulate(steps, slots, "lru") / tokens
    opt = simulate(steps, slots, "optimum") / tokens
    print(f"{head['model']}: {slots} slots of {head['experts']} experts, {tokens:.0f} tokens, "
          f"predictor {head['predictor']} lookahead {head['lookahead']} policy {head['policy']}")
    print(f"reads/token: run {run:.1f}  lru {lru:.1f}  optimum {opt:.1f}  "
          f"(run/optimum {run / opt:.2f}x)" if opt else f"reads/token: run {run:.1f}, optimum 0")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Scores for the proving model's tasks.

Each task has one headline metric (what the accuracy goals are stated in):

    receipt_read     cer    character error rate over the split (lower is better)
    receipt_total    exact  the amount, compared as cents ("$23.4" == "23.40")
    receipt_items    exact  the JSON item list, names case-folded, prices as cents
    screenshot_read  cer
    scene_caption    exact  case-folded, spaces collapsed, final period dropped
    scene_count      exact  the first integer (or number word) in the output
    scene_left       exact  like scene_caption
    text             exact  spaces collapsed, final period dropped, case kept

CER = total Levenshtein edits / total reference characters, summed over the
split (so long transcriptions weigh by their length), after trimming spaces at
the ends of lines and of the text.
"""
import json
import re

HEADLINE = {"receipt_read": "cer", "receipt_total": "exact", "receipt_items": "exact",
            "screenshot_read": "cer", "scene_caption": "exact", "scene_count": "exact",
            "scene_left": "exact", "text": "exact"}
# Goals from the proving-model plan: (metric, comparison, threshold).
GOALS = {"receipt_total": ("exact", ">=", 0.90), "receipt_read": ("cer", "<=", 0.05),
         "screenshot_read": ("cer", "<=", 0.05), "scene_caption": ("exact", ">=", 0.90),
         "scene_count": ("exact", ">=", 0.90)}


def levenshtein(a, b):
    """Edit distance (insert, delete, substitute all cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def norm_lines(s):
    return "\n".join(line.strip() for line in s.strip().split("\n"))


def cer(ref, hyp):
    """Per-pair CER (edits / reference length); 0 for two empty strings."""
    ref, hyp = norm_lines(ref), norm_lines(hyp)
    return levenshtein(ref, hyp) / max(1, len(ref))


def norm_phrase(s, fold=True):
    s = " ".join(s.strip().split())
    if s.endswith("."):
        s = s[:-1].rstrip()
    return s.casefold() if fold else s


def cents(s):
    """'$1,234.5' -> 123450; None when there is no amount."""
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+", s.strip())
    if not m:
        return None
    try:
        return round(float(m.group(0).replace(",", "")) * 100)
    except ValueError:
        return None


NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten".split())}


def count_value(s):
    m = re.search(r"\d+", s)
    if m:
        return int(m.group(0))
    for w in re.findall(r"[a-z]+", s.casefold()):
        if w in NUMBER_WORDS:
            return NUMBER_WORDS[w]
    return None


def items_value(s):
    """Parsed item list as ((name, cents), ...) or None if it is not valid JSON."""
    try:
        v = json.loads(s.strip())
    except (ValueError, TypeError):
        return None
    if not isinstance(v, list):
        return None
    out = []
    for it in v:
        if not isinstance(it, dict) or "name" not in it or "price" not in it:
            return None
        out.append((norm_phrase(str(it["name"])), cents(str(it["price"]))))
    return tuple(out)


def items_f1(ref, hyp):
    """Item-level F1 (multiset match of (name, price)); 0 for invalid JSON."""
    r, h = items_value(ref), items_value(hyp)
    if r is None or h is None:
        return 0.0
    if not r and not h:
        return 1.0
    left = list(r)
    tp = 0
    for it in h:
        if it in left:
            left.remove(it)
            tp += 1
    if tp == 0:
        return 0.0
    p, rc = tp / len(h), tp / len(r)
    return 2 * p * rc / (p + rc)


def exact(task, ref, hyp):
    """1 when hyp matches ref under the task's normalisation, else 0."""
    if task == "receipt_total":
        c = cents(hyp)
        return int(c is not None and c == cents(ref))
    if task == "receipt_items":
        h = items_value(hyp)
        return int(h is not None and h == items_value(ref))
    if task == "scene_count":
        v = count_value(hyp)
        return int(v is not None and v == count_value(ref))
    if task == "text":
        return int(norm_phrase(ref, False) == norm_phrase(hyp, False))
    if task in ("receipt_read", "screenshot_read"):
        return int(norm_lines(ref) == norm_lines(hyp))
    return int(norm_phrase(ref) == norm_phrase(hyp))


_OBJ = re.compile(r"\b(small|large) (\w+) (\w+?)s?\b")


def caption_objects(s):
    """'a small red circle, a large blue star and ...' -> [(size, colour, shape), ...]."""
    return _OBJ.findall(norm_phrase(s))


def caption_parts(ref, hyp):
    """Where a caption goes wrong: (objects counted right, [per attribute: right, compared]
    over the positions both captions have, all objects right in any order)."""
    r, h = caption_objects(ref), caption_objects(hyp)
    per = [[sum(a[k] == b[k] for a, b in zip(r, h)), min(len(r), len(h))] for k in range(3)]
    return int(len(r) == len(h)), per, int(sorted(r) == sorted(h))


def score(pairs):
    """pairs: iterable of (task, reference, hypothesis[, kind]).
    Returns {task: {"n", "exact", "cer", ["item_f1"]}} with CER summed over the
    split (total edits / total reference characters); a pair's kind (a
    question kind, e.g. scene_count's 'all', 'shape', 'colour') adds
    "exact_<kind>" and "n_<kind>" to its task."""
    acc = {}
    for task, ref, hyp, *kind in pairs:
        a = acc.setdefault(task, {"n": 0, "exact": 0, "edits": 0, "chars": 0, "f1": 0.0, "kinds": {}})
        a["n"] += 1
        ok = exact(task, ref, hyp)
        a["exact"] += ok
        if kind and kind[0]:
            k = a["kinds"].setdefault(kind[0], [0, 0])
            k[0] += ok
            k[1] += 1
        r, h = norm_lines(ref), norm_lines(hyp)
        a["edits"] += levenshtein(r, h)
        a["chars"] += len(r)
        if task == "receipt_items":
            a["f1"] += items_f1(ref, hyp)
        if task == "scene_caption":
            n_ok, per, bag = caption_parts(ref, hyp)
            a["n_ok"] = a.get("n_ok", 0) + n_ok
            a["bag"] = a.get("bag", 0) + bag
            a["per"] = [[x + y for x, y in zip(u, v)] for u, v in zip(a.get("per", [[0, 0]] * 3), per)]
    out = {}
    for task, a in acc.items():
        d = {"n": a["n"], "exact": a["exact"] / a["n"], "cer": a["edits"] / max(1, a["chars"])}
        if task == "receipt_items":
            d["item_f1"] = a["f1"] / a["n"]
        for k, (hit, tot) in sorted(a["kinds"].items()):
            d["exact_" + k], d["n_" + k] = hit / tot, tot
        if task == "scene_caption":
            d["objects"] = a["n_ok"] / a["n"]          # number of shapes right
            d["set"] = a["bag"] / a["n"]               # every shape right, order aside
            for k, (hit, tot) in zip(("size", "colour", "shape"), a["per"]):
                d[k] = hit / max(1, tot)               # per object, position by position
        out[task] = d
    return out


def meets(task, result):
    """True/False against the plan's goal for this task, None if it has none."""
    if task not in GOALS:
        return None
    metric, op, thr = GOALS[task]
    v = result[metric]
    return v >= thr if op == ">=" else v <= thr

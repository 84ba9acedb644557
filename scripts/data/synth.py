#!/usr/bin/python3
"""Synthetic tasks with ground truth for the mcv proving model.

    sample(split, index, task=None, seed=None) -> dict(id, task, image, prompt, answer)

Every sample is a pure function of (split or seed, index, task): each call
builds its own random.Random from a string key (str seeds are hashed with
SHA-512, so the stream does not depend on PYTHONHASHSEED or on call order).
Splits "train", "val", "test" use distinct keys; an explicit seed N uses the
key "seedN", so a fresh seed is a split no model has seen.

Tasks: receipt_read, receipt_total, receipt_items, screenshot_read,
scene_caption, scene_count, scene_left, text.  Images are PIL RGB images
(None for text).  Canonical answer forms are documented next to each task.
"""
import functools
import json
import math
import os
import random

import numpy as np
from PIL import Image, ImageDraw, ImageFont

TASKS = ("receipt_read", "receipt_total", "receipt_items", "screenshot_read",
         "scene_caption", "scene_count", "scene_left", "text")
# Share of each task when sample() picks the task itself.  OCR of long text
# is the hardest job for a small model, so it gets the largest shares.
TASK_WEIGHTS = (0.17, 0.09, 0.10, 0.17, 0.13, 0.10, 0.10, 0.14)
SPLITS = ("train", "val", "test")
# Curriculum tasks: trained on, never drawn by sample(task=None) and never in
# the evaluation table.  snippet_read is one to three lines of receipt or
# screen text at the receipts' glyph size (or, for half of them, a run of
# words in large print) on a single 224x224 crop: a short, cheap example of
# reading, where the answer sits in a few image tokens (the long receipts
# alone never taught the model to look at the image at all).
# word_read is the first step of all: one short string (a price, a code, a
# number) in large print, where reading is only "name the few glyphs there".
TRAIN_TASKS = ("snippet_read", "word_read")
# Tasks whose answer is text read off the image (chatfmt.encode_sample spell=
# may train their answers one character per token).
READ_TASKS = ("receipt_read", "receipt_total", "receipt_items", "screenshot_read",
              "snippet_read", "word_read")

FONT_DIR = os.environ.get("MCV_FONT_DIR", "/usr/share/fonts/truetype/dejavu")
FONT_FILES = {
    "sans": "DejaVuSans.ttf", "sans-bold": "DejaVuSans-Bold.ttf",
    "mono": "DejaVuSansMono.ttf", "mono-bold": "DejaVuSansMono-Bold.ttf",
    "serif": "DejaVuSerif.ttf", "serif-bold": "DejaVuSerif-Bold.ttf",
}


@functools.lru_cache(maxsize=None)
def font(family, size):
    """Loaded once per (family, size): opening a TrueType file costs ~1 ms."""
    path = os.path.join(FONT_DIR, FONT_FILES[family])
    try:
        return ImageFont.truetype(path, size)
    except OSError as e:
        raise RuntimeError(f"synth: cannot load font {path}: {e}; "
                           "install fonts-dejavu-core or set MCV_FONT_DIR") from e


def text_width(fnt, s):
    return fnt.getlength(s)


def text_marks(marks, x, y, s, fnt):
    """Appends (cx, cy, char) for every non-space character of s drawn at
    (x, y) with fnt (PIL's default left/ascender anchor): where each glyph sits,
    for the trainer's dense auxiliary targets (see mark_labels).  Uses no rng,
    so collecting marks never changes a sample."""
    if marks is None:
        return
    cy = y + fnt.size * 0.6
    for i, ch in enumerate(s):
        if ch != " ":
            x0 = fnt.getlength(s[:i])
            marks.append((x + x0 + fnt.getlength(ch) / 2, cy, ch))


def _key(split, seed):
    if seed is not None:
        if int(seed) < 0:
            raise ValueError("synth: seed must be >= 0")
        return f"seed{int(seed)}"
    if split not in SPLITS:
        raise ValueError(f"synth: unknown split {split!r} (want one of {SPLITS} or a seed)")
    return split


@functools.lru_cache(maxsize=1)
def _noise_field():
    # One fixed Gaussian field; samples take crops of it at random offsets,
    # which is several times cheaper than drawing fresh noise per image.
    return np.random.default_rng(20261129).standard_normal((1024, 1024)).astype(np.float32)


def _noise(img, rng, sigma):
    """Adds Gaussian pixel noise (same on all channels), placed by rng."""
    f = _noise_field()
    w, h = img.size
    assert w <= f.shape[1] and h <= f.shape[0]
    x, y = rng.randint(0, f.shape[1] - w), rng.randint(0, f.shape[0] - h)
    n = f[y:y + h, x:x + w, None] * sigma
    if rng.random() < 0.5:
        n = n[::-1]
    a = np.asarray(img, dtype=np.float32) + n
    return Image.fromarray(np.clip(a + 0.5, 0, 255).astype(np.uint8), "RGB")


def _jitter(rgb, rng, d):
    return tuple(max(0, min(255, c + rng.randint(-d, d))) for c in rgb)


# --------------------------------------------------------------------------
# Receipts

STORE_A = ["GREEN", "SUNNY", "BLUE", "GOLDEN", "RED", "HAPPY", "FRESH", "CORNER",
           "OLD", "LITTLE", "BIG", "SILVER", "NORTH", "SOUTH", "CITY", "RIVER",
           "MAPLE", "OAK", "PINE", "STAR", "MOON", "LUCKY", "URBAN", "DAILY"]
STORE_B = ["LEAF", "HILL", "BAY", "FIELD", "STREET", "GARDEN", "BRIDGE", "LAKE",
           "TOWN", "MILL", "FARM", "SIDE", "POINT", "VALLEY", "HARBOR", "GROVE"]
STORE_C = ["MARKET", "CAFE", "BAKERY", "DELI", "GROCERY", "PHARMACY", "STORE",
           "KITCHEN", "DINER", "SHOP", "FOODS", "BOOKS", "HARDWARE", "MART"]
STREETS = ["MAIN ST", "OAK AVE", "PARK RD", "HIGH ST", "ELM ST", "LAKE DR",
           "MILL RD", "KING ST", "RIVER RD", "CEDAR LN", "HILL ST", "PINE AVE"]
ITEMS = [
    ("MILK", 89, 349), ("BREAD", 149, 499), ("EGGS", 199, 599), ("BUTTER", 229, 549),
    ("CHEESE", 299, 899), ("APPLES", 149, 599), ("BANANAS", 59, 299),
    ("COFFEE", 199, 1299), ("TEA", 149, 699), ("SUGAR", 99, 349), ("RICE", 129, 899),
    ("PASTA", 99, 399), ("TOMATOES", 129, 499), ("ONIONS", 79, 299),
    ("CHICKEN", 499, 1599), ("BEEF", 699, 2499), ("FISH", 599, 1999),
    ("YOGURT", 69, 449), ("JUICE", 199, 599), ("WATER", 49, 249), ("SODA", 99, 399),
    ("CHIPS", 129, 449), ("COOKIES", 199, 549), ("CEREAL", 249, 699),
    ("SOAP", 99, 499), ("SHAMPOO", 299, 899), ("TOOTHPASTE", 199, 599),
    ("BATTERIES", 399, 1299), ("CANDLES", 299, 999), ("FLOWERS", 499, 2499),
    ("NOTEBOOK", 149, 599), ("PENS", 99, 499), ("TAPE", 129, 399),
    ("LATTE", 299, 599), ("ESPRESSO", 199, 399), ("MUFFIN", 199, 449),
    ("BAGEL", 129, 349), ("SANDWICH", 499, 999), ("SALAD", 549, 1199),
    ("SOUP", 399, 799), ("CROISSANT", 199, 449), ("COOKIE", 99, 299),
    ("PIZZA", 899, 1899), ("BURGER", 699, 1499), ("FRIES", 249, 499),
    ("ORANGES", 199, 599), ("GRAPES", 249, 699), ("LEMONS", 99, 399),
    ("CARROTS", 89, 299), ("POTATOES", 199, 599), ("HONEY", 399, 999),
    ("JAM", 249, 599), ("OLIVE OIL", 599, 1499), ("FLOUR", 149, 499),
    ("SALT", 49, 199), ("PEPPER", 149, 499), ("NAPKINS", 199, 499),
    ("PAPER TOWELS", 399, 1199), ("DISH SOAP", 199, 499), ("SPONGES", 149, 399),
    ("ICE CREAM", 299, 799), ("CHOCOLATE", 129, 499), ("NUTS", 299, 899),
    ("HAMMER", 999, 2499), ("NAILS", 199, 599), ("GLUE", 149, 499),
    ("LIGHT BULB", 299, 999), ("PAINT", 1299, 3999), ("BRUSH", 299, 899),
]
FOOTERS = ["THANK YOU", "THANK YOU!", "SEE YOU SOON", "HAVE A NICE DAY",
           "THANKS FOR SHOPPING", "PLEASE COME AGAIN"]
TOTAL_LABELS = ["TOTAL", "TOTAL", "TOTAL DUE", "AMOUNT DUE", "TOTAL:"]
RECEIPT_READ_PROMPTS = ["Read all text.", "Read the receipt.",
                        "Transcribe the receipt.", "What does the receipt say?"]
RECEIPT_TOTAL_PROMPTS = ["What is the total?", "What is the total amount?",
                         "How much is the total on this receipt?",
                         "Total amount due?"]
RECEIPT_ITEMS_PROMPTS = ["List the items and prices as JSON.",
                         "Extract the line items as JSON.",
                         "Give the items on this receipt as JSON."]


def money(cents):
    return f"{cents // 100}.{cents % 100:02d}"


def _casefn(style):
    return {"upper": str.upper, "title": str.title}[style]


def receipt_content(rng):
    """The receipt as data: returns (store, lines, items, total_cents).

    lines: list of (kind, left, right) where kind is 'title', 'center',
    'row' (left text + right-hand amount), 'rule' (a drawn separator, no text).
    """
    case = _casefn(rng.choice(["upper", "upper", "title"]))
    n = rng.choice([2, 3]) if rng.random() < 0.7 else 1
    parts = [rng.choice(STORE_A), rng.choice(STORE_B), rng.choice(STORE_C)]
    store = " ".join(parts[3 - n:] if n < 3 else parts)
    store = case(store)
    lines = [("title", store, "")]
    if rng.random() < 0.6:
        lines.append(("center", case(f"{rng.randint(1, 999)} {rng.choice(STREETS)}"), ""))
    y, mo, d = rng.randint(2019, 2026), rng.randint(1, 12), rng.randint(1, 28)
    dfmt = rng.randrange(3)
    date = (f"{y}-{mo:02d}-{d:02d}", f"{d:02d}/{mo:02d}/{y}", f"{mo:02d}/{d:02d}/{y}")[dfmt]
    if rng.random() < 0.5:
        date += f" {rng.randint(7, 22):02d}:{rng.randint(0, 59):02d}"
    if rng.random() < 0.4:
        date = case("DATE ") + date
    lines.append(("center", date, ""))
    rule = rng.random() < 0.8
    if rule:
        lines.append(("rule", "", ""))
    k = rng.randint(2, 8)
    chosen = rng.sample(ITEMS, k)
    items = []
    for name, lo, hi in chosen:
        cents = rng.randint(lo, hi)
        if rng.random() < 0.3:
            cents = cents - cents % 10 + rng.choice([0, 5, 9])
        name = case(name)
        items.append((name, cents))
        lines.append(("row", name, money(cents)))
    if rule:
        lines.append(("rule", "", ""))
    sub = sum(c for _, c in items)
    total = sub
    if rng.random() < 0.35:
        rate = rng.choice([5, 6, 7, 8, 10])
        tax = (sub * rate + 50) // 100
        total = sub + tax
        lines.append(("row", case("SUBTOTAL"), money(sub)))
        lines.append(("row", case(f"TAX {rate}%"), money(tax)))
    lines.append(("total", case(rng.choice(TOTAL_LABELS)), money(total)))
    if rng.random() < 0.6:
        lines.append(("center", case(rng.choice(FOOTERS)), ""))
    return store, lines, items, total


def items_json(items):
    """receipt_items answer: compact JSON, prices as strings with 2 decimals."""
    return json.dumps([{"name": n, "price": money(c)} for n, c in items],
                      separators=(",", ":"), ensure_ascii=False)


def receipt_text(lines):
    """Printed text in reading order: one line per printed line, a row's
    name and amount joined by one space; drawn rules carry no text."""
    out = []
    for kind, left, right in lines:
        if kind == "rule":
            continue
        out.append(f"{left} {right}" if right else left)
    return "\n".join(out)


def receipt_image(rng, lines, marks=None):
    fam = rng.choice(["mono", "mono", "sans", "serif"])
    size = rng.randint(12, 15)
    f = font(fam, size)
    fb = font(fam + "-bold", size + rng.choice([1, 2, 3]))
    ft = font(fam + "-bold", size) if rng.random() < 0.5 else f
    lh = size + rng.randint(4, 7)
    margin = rng.randint(8, 14)
    gap = 14
    need = 0
    for kind, left, right in lines:
        fn = fb if kind == "title" else ft if kind == "total" else f
        w = text_width(fn, left) + (gap + text_width(fn, right) if right else 0)
        need = max(need, w)
    pw = max(int(need) + 2 * margin + 2, rng.randint(200, 290))
    align_right = rng.random() < 0.7
    col_x = pw - margin - max(text_width(f, r) for k, _, r in lines if r) - 4
    ph = 2 * margin + sum(lh // 2 if k == "rule" else (lh + 3 if k == "title" else lh)
                          for k, _, _ in lines)
    paper = _jitter((248, 246, 240), rng, 8)
    ink = _jitter((30, 30, 30), rng, 20)
    img = Image.new("RGB", (pw, ph), paper)
    dr = ImageDraw.Draw(img)
    dashed = rng.random() < 0.5
    y = margin
    for kind, left, right in lines:
        if kind == "rule":
            yy = y + lh // 4
            if dashed:
                for x in range(margin, pw - margin, 6):
                    dr.line([(x, yy), (min(x + 3, pw - margin), yy)], fill=ink, width=1)
            else:
                dr.line([(margin, yy), (pw - margin, yy)], fill=ink, width=1)
            y += lh // 2
            continue
        fn = fb if kind == "title" else ft if kind == "total" else f
        if kind in ("title", "center"):
            w = text_width(fn, left)
            dr.text(((pw - w) / 2, y), left, font=fn, fill=ink)
            text_marks(marks, (pw - w) / 2, y, left, fn)
        else:
            dr.text((margin, y), left, font=fn, fill=ink)
            text_marks(marks, margin, y, left, fn)
            if align_right:
                rx = pw - margin - text_width(fn, right)
            else:
                rx = max(col_x, margin + text_width(fn, left) + gap)
            dr.text((rx, y), right, font=fn, fill=ink)
            text_marks(marks, rx, y, right, fn)
        y += lh + 3 if kind == "title" else lh
    # paper on a background, slightly rotated
    bg = _jitter(rng.choice([(90, 80, 70), (60, 70, 90), (120, 120, 120),
                             (150, 120, 90), (40, 40, 45), (100, 130, 100)]), rng, 25)
    ang = rng.uniform(-2.0, 2.0)
    w0, h0 = img.size
    img = img.rotate(ang, resample=Image.BILINEAR, expand=True, fillcolor=bg)
    px, py = rng.randint(6, 20), rng.randint(6, 20)
    if marks:
        # PIL rotates counter-clockwise about the centre and re-centres the expanded image
        c, sn = math.cos(math.radians(ang)), math.sin(math.radians(ang))
        for i, (x, y, ch) in enumerate(marks):
            dx, dy = x - w0 / 2, y - h0 / 2
            marks[i] = (c * dx + sn * dy + img.width / 2 + px, -sn * dx + c * dy + img.height / 2 + py, ch)
    canvas = Image.new("RGB", (img.width + 2 * px, img.height + 2 * py), bg)
    canvas.paste(img, (px, py))
    return _noise(canvas, rng, rng.uniform(2.0, 6.0))


def receipt_sample(rng, rrng, task, marks=None):
    store, lines, items, total = receipt_content(rng)
    if task == "receipt_read":
        prompt, answer = rng.choice(RECEIPT_READ_PROMPTS), receipt_text(lines)
    elif task == "receipt_total":
        prompt, answer = rng.choice(RECEIPT_TOTAL_PROMPTS), money(total)
    else:
        prompt = rng.choice(RECEIPT_ITEMS_PROMPTS)
        answer = items_json(items)
    return receipt_image(rrng, lines, marks), prompt, answer


# --------------------------------------------------------------------------
# Screenshots

APPS = ["Settings", "Preferences", "Mail", "Notes", "Calendar", "Music", "Photos",
        "Terminal", "Files", "Downloads", "Weather", "Clock", "Backup", "Updates",
        "Network", "Printer", "Accounts", "Editor", "Browser", "Chat"]
DOCS = ["notes.txt", "report.pdf", "todo.md", "photo.png", "main.c", "budget.csv",
        "letter.doc", "index.html", "data.json", "song.mp3"]
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
         "ivan", "judy", "mallory", "oscar", "peggy", "trent", "victor", "wendy"]
HOSTS = ["server1", "home.lan", "mail.example.com", "backup01", "files.local",
         "192.168.1.10", "10.0.0.2", "cloud.example.org"]
CHECKS = ["Enable notifications", "Dark mode", "Start at login", "Show hidden files",
          "Auto update", "Play sounds", "Remember me", "Sync over Wi-Fi",
          "Use proxy", "Send reports"]
BUTTONS = ["OK", "Cancel", "Save", "Apply", "Close", "Open", "Delete", "Retry",
           "Next", "Back", "Yes", "No", "Help", "Send", "Install", "Skip",
           "Sign in", "Done", "Edit", "Reset"]
SHOT_PROMPTS = ["Read all text.", "Read the screen.", "What text is on the screen?",
                "Transcribe the window."]


def ui_line(rng):
    r = rng.randrange(14)
    n = rng.randint(1, 99)
    if r == 0:
        return f"Username: {rng.choice(NAMES)}"
    if r == 1:
        return f"Connected to {rng.choice(HOSTS)}"
    if r == 2:
        return f"{n} new messages"
    if r == 3:
        return f"Battery {n}%"
    if r == 4:
        return f"Download {n}% complete"
    if r == 5:
        return f"Version {rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
    if r == 6:
        return f"Last sync: {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    if r == 7:
        return f"File {rng.choice(DOCS)} saved"
    if r == 8:
        return f"{n} files selected"
    if r == 9:
        return f"Free space: {n} GB"
    if r == 10:
        return rng.choice(["No updates available", "Update available",
                           "Are you sure?", "Changes saved", "Connection lost",
                           "Password incorrect", "Ready", "Please wait..."])
    if r == 11:
        return f"Welcome back, {rng.choice(NAMES).title()}"
    if r == 12:
        return f"Temperature: {rng.randint(-9, 35)} C"
    return f"Email: {rng.choice(NAMES)}@example.com"


def screenshot_content(rng):
    """What the window says, and the few layout choices the text depends on
    (size, font, margins decide which lines and buttons fit)."""
    c = dict(W=rng.choice(range(320, 449, 16)), H=rng.choice(range(224, 337, 16)),
             fam=rng.choice(["sans", "sans", "serif", "mono"]), size=rng.randint(12, 15),
             x0=rng.randint(12, 28), pad=rng.randint(10, 16), sp=rng.randint(8, 14))
    f = font(c["fam"], c["size"])
    c["title"] = rng.choice(APPS)
    if rng.random() < 0.4:
        c["title"] = f"{rng.choice(DOCS)} - {rng.choice(['Editor', 'Viewer', 'Notes'])}"
    lines = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.25:
            lines.append(("check", rng.choice(CHECKS)))
        else:
            s = ui_line(rng)
            while text_width(f, s) > c["W"] - 2 * c["x0"]:
                s = ui_line(rng)
            lines.append(("text", s))
    c["lines"] = lines
    labels = rng.sample(BUTTONS, rng.randint(1, 4))
    widths = [int(text_width(f, s)) + 2 * c["pad"] for s in labels]
    while sum(widths) + c["sp"] * (len(widths) - 1) > c["W"] - 32:  # all buttons on screen
        labels.pop()
        widths.pop()
    c["buttons"], c["widths"] = labels, widths
    return c


def screenshot_text(c):
    """Reading order: title, body lines top to bottom, buttons left to right."""
    return "\n".join([c["title"]] + [s for _, s in c["lines"]] + c["buttons"])


def screenshot_image(rng, c, marks=None):
    W, H, size = c["W"], c["H"], c["size"]
    f = font(c["fam"], c["size"])
    if rng.random() < 0.4:  # dark theme
        bg, fg = _jitter((38, 40, 46), rng, 10), _jitter((225, 228, 232), rng, 12)
        bar = _jitter(rng.choice([(25, 25, 30), (55, 60, 75), (30, 50, 90)]), rng, 10)
        btn = _jitter((70, 74, 84), rng, 10)
    else:
        bg, fg = _jitter((240, 241, 244), rng, 10), _jitter((25, 25, 30), rng, 15)
        bar = _jitter(rng.choice([(210, 212, 218), (50, 100, 190), (60, 60, 70),
                                  (40, 130, 110)]), rng, 10)
        btn = _jitter((215, 218, 224), rng, 10)
    barfg = (250, 250, 250) if sum(bar) < 380 else (20, 20, 20)
    btnfg = (245, 245, 245) if sum(btn) < 380 else (20, 20, 20)
    img = Image.new("RGB", (W, H), bg)
    dr = ImageDraw.Draw(img)
    # title bar with window controls (drawn, no text)
    bh = rng.randint(22, 28)
    dr.rectangle([0, 0, W, bh], fill=bar)
    ft = font(c["fam"] + "-bold", size) if rng.random() < 0.5 else f
    tw = text_width(ft, c["title"])
    ctrl_left = rng.random() < 0.5
    for i in range(3):
        cx = 12 + 16 * i if ctrl_left else W - 12 - 16 * i
        if ctrl_left:
            col = [(230, 80, 70), (235, 190, 60), (90, 190, 90)][i]
            dr.ellipse([cx - 5, bh / 2 - 5, cx + 5, bh / 2 + 5], fill=col)
        else:
            dr.rectangle([cx - 4, bh / 2 - 4, cx + 4, bh / 2 + 4], outline=barfg)
    tx = (W - tw) / 2 if rng.random() < 0.6 else (60 if ctrl_left else 10)
    dr.text((tx, (bh - size) / 2 - 1), c["title"], font=ft, fill=barfg)
    text_marks(marks, tx, (bh - size) / 2 - 1, c["title"], ft)
    # body lines, some as checkboxes
    x0 = c["x0"]
    y = bh + rng.randint(12, 24)
    lh = size + rng.randint(8, 14)
    for kind, s in c["lines"]:
        if kind == "check":
            dr.rectangle([x0, y + 2, x0 + size - 2, y + size], outline=fg)
            if rng.random() < 0.5:
                dr.line([(x0 + 2, y + size / 2 + 1), (x0 + size / 2 - 1, y + size - 2),
                         (x0 + size - 3, y + 3)], fill=fg, width=2)
            dr.text((x0 + size + 6, y), s, font=f, fill=fg)
            text_marks(marks, x0 + size + 6, y, s, f)
        else:
            dr.text((x0, y), s, font=f, fill=fg)
            text_marks(marks, x0, y, s, f)
        y += lh
    # a row of buttons below the text
    bth = size + 12
    pad, sp, widths = c["pad"], c["sp"], c["widths"]
    total = sum(widths) + sp * (len(widths) - 1)
    mode = rng.randrange(3)
    bx = W - 16 - total if mode == 0 else 16 if mode == 1 else (W - total) // 2
    by = max(y + 6, H - bth - rng.randint(12, 24))
    rounded = rng.random() < 0.6
    for s, w in zip(c["buttons"], widths):
        box = [bx, by, bx + w, by + bth]
        if rounded:
            dr.rounded_rectangle(box, radius=5, fill=btn,
                                 outline=fg if rng.random() < 0.3 else None)
        else:
            dr.rectangle(box, fill=btn)
        dr.text((bx + pad, by + 5), s, font=f, fill=btnfg)
        text_marks(marks, bx + pad, by + 5, s, f)
        bx += w + sp
    return _noise(img, rng, rng.uniform(0.5, 3.0))


SNIPPET_PROMPTS = ["Read all text.", "Read the text.", "What does it say?",
                   "Transcribe the text."]


def words_that_fit(rng, line, f, width):
    """A run of consecutive words of line, starting at a random word, as long
    as it fits width at font f (at least one word)."""
    words = line.split()
    i = rng.randrange(len(words))
    out = words[i]
    for w in words[i + 1:]:
        if text_width(f, out + " " + w) > width:
            break
        out += " " + w
    return out


SNIPPET_FONTS = ["mono", "mono", "sans", "serif"]
# Share of snippets in large print.  0 reproduces the snippets of before
# large print existed (steps 4173-5395 of the proving run): no draw at all.
SNIPPET_LARGE = 0.5


def _snippet_large(rng):
    return SNIPPET_LARGE > 0 and rng.random() < SNIPPET_LARGE


def snippet_is_large(split, index, seed=None):
    """Whether sample(split, index, 'snippet_read') is large print: the first
    draws of snippet_sample, replayed (image_use.py reports the two kinds
    apart)."""
    rng = rngs_for(split, index, "snippet_read", seed)[1]
    rng.choice(SNIPPET_FONTS)
    return _snippet_large(rng)


def print_colours(rrng):
    """(background, ink) of a snippet or word: light on dark three times in ten."""
    if rrng.random() < 0.3:
        return _jitter((38, 40, 46), rrng, 12), _jitter((225, 228, 232), rrng, 12)
    return _jitter((246, 244, 238), rrng, 10), _jitter((30, 30, 30), rrng, 20)


def snippet_sample(rng, rrng, marks=None):
    """1-3 consecutive printed lines of a receipt or a window, drawn at the
    sizes and in the fonts those use, somewhere on a 224x224 picture.  Half
    of the snippets are large print (18-32 px): one or two runs of words,
    where a glyph is about one 14-px patch wide, the first step of reading."""
    fam = rng.choice(SNIPPET_FONTS)
    large = _snippet_large(rng)
    size = rng.randint(18, 32) if large else rng.randint(12, 15)
    f = font(fam, size)
    if rng.random() < 0.7:
        _, lines, _, _ = receipt_content(rng)
        text = receipt_text(lines).split("\n")
    else:
        text = screenshot_text(screenshot_content(rng)).split("\n")
    if large:
        text = [t for t in text if t.strip()] or ["OK"]
        i = rng.randrange(len(text))
        text = [words_that_fit(rng, t, f, 212) for t in text[i:i + rng.randint(1, 2)]]
        text = [t for t in text if text_width(f, t) <= 212] or ["OK"]
    else:
        text = [t for t in text if text_width(f, t) <= 212] or ["OK"]
        n = rng.randint(1, min(3, len(text)))
        i = rng.randint(0, len(text) - n)
        text = text[i:i + n]
    n = len(text)
    lh = size + rrng.randint(4, 9)
    w = max(text_width(f, t) for t in text)
    bg, ink = print_colours(rrng)
    img = Image.new("RGB", (224, 224), bg)
    dr = ImageDraw.Draw(img)
    x = rrng.randint(2, max(2, int(222 - w)))
    y = rrng.randint(2, 222 - n * lh)
    centred = rrng.random() < 0.3
    for t in text:
        tx = x + (w - text_width(f, t)) / 2 if centred else x
        dr.text((tx, y), t, font=f, fill=ink)
        text_marks(marks, tx, y, t, f)
        y += lh
    return _noise(img, rrng, rrng.uniform(1.0, 5.0)), rng.choice(SNIPPET_PROMPTS), "\n".join(text)


def word_text(rng):
    """A short string of the kind receipts and windows are made of: digits, a
    price, a code of capitals and digits, or a word.  About half are one or
    two characters: from perfect glyph rows a single glyph is read after
    ~1,000 samples where five in a row take several times longer
    (scripts/ref/oracle_read.py), so the short ones are the way in."""
    n = rng.choice((1, 1, 2, 2, 3, 4, 5, 6))
    k = rng.random()
    if k < 0.1:
        return rng.choice([n for n, _, _ in ITEMS] + APPS + BUTTONS)
    if k < 0.3 and n >= 4:
        return f"{rng.randint(0, 10 ** (n - 3) - 1)}.{rng.randint(0, 99):02d}"
    if k < 0.7:
        return "".join(rng.choice("0123456789") for _ in range(n))
    return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ0123456789") for _ in range(n))


def word_sample(rng, rrng, marks=None):
    """word_text in large print (20-32 px) somewhere on a 224x224 picture."""
    fam = rng.choice(SNIPPET_FONTS)
    f = font(fam, rng.randint(20, 32))
    text = word_text(rng)
    w = text_width(f, text)
    bg, ink = print_colours(rrng)
    img = Image.new("RGB", (224, 224), bg)
    x, y = rrng.randint(2, max(2, int(222 - w))), rrng.randint(2, 222 - f.size - 8)
    ImageDraw.Draw(img).text((x, y), text, font=f, fill=ink)
    text_marks(marks, x, y, text, f)
    return _noise(img, rrng, rrng.uniform(1.0, 5.0)), rng.choice(SNIPPET_PROMPTS), text


def dense_text(split, index, seed=None):
    """A 224x224 crop packed with printed lines, and its glyph marks: training
    input for the tower's patch-level glyph head (train.py --dense), not a task.

    Receipts and screenshots leave most of a crop empty, and a glyph can sit
    anywhere inside a 14-px patch, so the tower has to see every glyph at
    every offset many times: on snippets a fresh tower named 0.14 of a
    patch's glyphs after 3,800 images, and the step-7404 tower went from
    0.30 to 0.51 in 5,400 of these crops (session 7).  Lines come from
    receipts (amounts at the right edge) and windows, in the fonts and the
    sizes those use (a quarter larger, up to 26 px), light or dark, then
    rotated by up to 2 degrees and resized by 0.8-1.5 like a slice is.
    Returns (image, marks) with marks [(x, y, char)] in crop pixels."""
    rng = random.Random(f"mcv-dense:{_key(split, seed)}:{index}")
    fam = rng.choice(SNIPPET_FONTS)
    if rng.random() < 0.2:
        fam += "-bold"
    size = rng.randint(12, 15) if rng.random() < 0.75 else rng.randint(16, 26)
    f = font(fam, size)
    scale = rng.uniform(0.8, 1.5)
    W = H = int(round(224 / scale))
    r = rng.random()
    if r < 0.6:
        bg, ink = _jitter((246, 244, 238), rng, 10), _jitter((30, 30, 30), rng, 20)
    elif r < 0.85:
        bg, ink = _jitter((38, 40, 46), rng, 12), _jitter((225, 228, 232), rng, 12)
    else:
        bg = tuple(rng.randint(60, 200) for _ in range(3))
        ink = (250, 250, 250) if sum(bg) < 390 else (15, 15, 15)
    img = Image.new("RGB", (W, H), bg)
    dr = ImageDraw.Draw(img)
    marks = []
    lh = size + rng.randint(3, 8)
    y = rng.randint(-size // 2, 6)
    x0 = rng.randint(0, 16)
    while y < H - size // 2:
        if rng.random() < 0.7:
            rows = [(l, r_) for k, l, r_ in receipt_content(rng)[1] if k != "rule"]
        else:
            c = screenshot_content(rng)
            rows = [(c["title"], "")] + [(t, "") for _, t in c["lines"]] + [("  ".join(c["buttons"]), "")]
        for left, right in rows:
            if y >= H - size // 2:
                break
            dr.text((x0, y), left, font=f, fill=ink)
            text_marks(marks, x0, y, left, f)
            if right:
                rx = max(W - x0 - text_width(f, right), x0 + text_width(f, left) + 12)
                dr.text((rx, y), right, font=f, fill=ink)
                text_marks(marks, rx, y, right, f)
            y += lh
    if rng.random() < 0.5:
        ang = rng.uniform(-2.0, 2.0)
        img = img.rotate(ang, resample=Image.BILINEAR, fillcolor=bg)
        c_, s_ = math.cos(math.radians(ang)), math.sin(math.radians(ang))
        marks = [(c_ * (x - W / 2) + s_ * (y_ - H / 2) + W / 2, -s_ * (x - W / 2) + c_ * (y_ - H / 2) + H / 2, ch)
                 for x, y_, ch in marks]
    img = img.resize((224, 224), Image.BICUBIC)
    k = 224 / W
    marks = [(x * k, y_ * k, ch) for x, y_, ch in marks if 0 <= x * k < 224 and 0 <= y_ * k < 224]
    return _noise(img, rng, rng.uniform(1.0, 5.0)), marks


def screenshot_sample(rng, rrng, marks=None):
    c = screenshot_content(rng)
    prompt = rng.choice(SHOT_PROMPTS)
    return screenshot_image(rrng, c, marks), prompt, screenshot_text(c)


# --------------------------------------------------------------------------
# Scenes

SHAPES = ["circle", "square", "triangle", "star", "hexagon"]
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles",
          "star": "stars", "hexagon": "hexagons"}
COLOURS = {"red": (215, 40, 40), "green": (40, 160, 60), "blue": (40, 80, 215),
           "yellow": (235, 200, 25), "purple": (135, 55, 175),
           "orange": (245, 135, 25), "black": (20, 20, 20)}
SIZES = {"small": (12, 17), "large": (28, 36)}
CAPTION_PROMPTS = ["Describe the image.", "What shapes are in the image?",
                   "Caption the image.", "Describe the shapes from left to right."]
COUNT_ALL_PROMPTS = ["How many shapes are there?", "Count the shapes.",
                     "How many shapes are in the image?"]
LEFT_PROMPTS = ["What is left of the {}?", "What is just left of the {}?",
                "Which shape is immediately to the left of the {}?"]


def describe(o):
    return f"a {o['size']} {o['colour']} {o['shape']}"


def caption(objs):
    """Canonical caption: every shape as 'a <size> <colour> <shape>' in
    left-to-right order (by centre x), joined by ', ' with ' and ' before the
    last one."""
    d = [describe(o) for o in sorted(objs, key=lambda o: o["x"])]
    return d[0] if len(d) == 1 else ", ".join(d[:-1]) + " and " + d[-1]


def _poly(shape, cx, cy, r, rot):
    if shape == "triangle":
        n, rr = 3, [r]
    elif shape == "hexagon":
        n, rr = 6, [r]
    elif shape == "star":
        n, rr = 10, [r, r * 0.45]
    else:
        n, rr = 4, [r * 0.85 * math.sqrt(2)]
    base = -math.pi / 2 + (math.pi / 4 if shape == "square" else 0) + rot
    if shape == "star" or shape == "triangle":
        cy += r * 0.1  # optical centring
    return [(cx + rr[i % len(rr)] * math.cos(base + 2 * math.pi * i / n),
             cy + rr[i % len(rr)] * math.sin(base + 2 * math.pi * i / n)) for i in range(n)]


def scene_objects(rng, nmin=1):
    n = rng.randint(nmin, 5)
    objs = []
    while len(objs) < n:
        for _ in range(200):
            size = rng.choice(["small", "large"])
            r = rng.randint(*SIZES[size])
            x, y = rng.randint(r + 6, 224 - r - 6), rng.randint(r + 6, 224 - r - 6)
            ok = all(math.hypot(x - o["x"], y - o["y"]) > r + o["r"] + 6 and
                     abs(x - o["x"]) >= 12 for o in objs)
            if ok:
                objs.append(dict(shape=rng.choice(SHAPES), colour=rng.choice(list(COLOURS)),
                                 size=size, r=r, x=x, y=y))
                break
        else:
            objs, n = [], rng.randint(nmin, 5)  # crowded: start over
    return objs


def scene_image(rng, objs):
    bg = _jitter(rng.choice([(250, 250, 250), (235, 235, 230), (225, 230, 240),
                             (240, 232, 220), (215, 215, 215)]), rng, 8)
    img = Image.new("RGB", (224, 224), bg)
    dr = ImageDraw.Draw(img)
    for o in objs:
        col = _jitter(COLOURS[o["colour"]], rng, 15)
        x, y, r = o["x"], o["y"], o["r"]
        if o["shape"] == "circle":
            dr.ellipse([x - r, y - r, x + r, y + r], fill=col)
        else:
            dr.polygon(_poly(o["shape"], x, y, r, math.radians(rng.uniform(-10, 10))), fill=col)
    return _noise(img, rng, rng.uniform(1.0, 4.0))


def scene_question(rng, task):
    """(objects, prompt, answer); the objects' placement is content too, since
    the left-to-right order decides the answers."""
    if task == "scene_left":
        # retry until some shape is unique by colour+shape and has a neighbour on its left
        while True:
            objs = sorted(scene_objects(rng, 2), key=lambda o: o["x"])
            keys = [(o["colour"], o["shape"]) for o in objs]
            cand = [i for i in range(1, len(objs)) if keys.count(keys[i]) == 1]
            if cand:
                break
        i = rng.choice(cand)
        ref = f"{objs[i]['colour']} {objs[i]['shape']}"
        return objs, rng.choice(LEFT_PROMPTS).format(ref), describe(objs[i - 1])
    objs = scene_objects(rng)
    if task == "scene_caption":
        return objs, rng.choice(CAPTION_PROMPTS), caption(objs)
    q = rng.randrange(3)
    if q == 0:
        return objs, rng.choice(COUNT_ALL_PROMPTS), str(len(objs))
    if q == 1:
        s = rng.choice([o["shape"] for o in objs] + SHAPES)  # sometimes absent -> 0
        return objs, f"How many {PLURAL[s]} are there?", str(sum(o["shape"] == s for o in objs))
    c = rng.choice([o["colour"] for o in objs] + list(COLOURS))
    return objs, f"How many {c} shapes are there?", str(sum(o["colour"] == c for o in objs))


def count_kind(prompt):
    """Which count question a scene_count prompt asks: 'all' (every shape),
    'shape' (how many circles...) or 'colour' (how many red shapes...);
    eval.py scores each kind apart, since they fail for different reasons."""
    if prompt in COUNT_ALL_PROMPTS:
        return "all"
    return "colour" if prompt.split()[3:4] == ["shapes"] else "shape"


def scene_sample(rng, rrng, task, marks=None):
    objs, prompt, answer = scene_question(rng, task)
    if marks is not None:
        marks.extend((o["x"], o["y"], ("shape", o["colour"], o["shape"], o["size"])) for o in objs)
    return scene_image(rrng, objs), prompt, answer


# --------------------------------------------------------------------------
# Plain text turns

WORDS = ["apple", "river", "garden", "window", "pencil", "orange", "planet", "silver",
         "rocket", "banana", "forest", "guitar", "castle", "dragon", "winter", "summer",
         "coffee", "bridge", "candle", "mirror", "yellow", "purple", "number", "letter",
         "market", "camera", "button", "screen", "paper", "table", "chair", "house",
         "cloud", "stone", "green", "water", "music", "light", "night", "tiger",
         "zebra", "lemon", "bread", "horse", "ocean", "train", "money", "total"]
CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
            "Japan": "Tokyo", "China": "Beijing", "Canada": "Ottawa", "Egypt": "Cairo",
            "Russia": "Moscow", "India": "New Delhi", "Brazil": "Brasilia",
            "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo", "Sweden": "Stockholm",
            "Greece": "Athens", "Portugal": "Lisbon", "Poland": "Warsaw",
            "Ireland": "Dublin", "Austria": "Vienna", "Mexico": "Mexico City",
            "Australia": "Canberra", "Turkey": "Ankara", "Chile": "Santiago"}
GREETINGS = [("Hello!", "Hello! How can I help you?"), ("Hi", "Hello! How can I help you?"),
             ("Who are you?", "I am a small vision-language assistant."),
             ("What can you do?", "I can read receipts and screens and describe shapes."),
             ("Thank you!", "You are welcome."), ("Say yes.", "yes"), ("Say no.", "no")]


def text_sample(rng):
    r = rng.randrange(10)
    if r == 0:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return rng.choice([f"What is {a} + {b}?", f"{a} + {b} =", f"Add {a} and {b}."]), str(a + b)
    if r == 1:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        a, b = max(a, b), min(a, b)
        return rng.choice([f"What is {a} - {b}?", f"{a} - {b} ="]), str(a - b)
    if r == 2:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        return rng.choice([f"What is {a} * {b}?", f"What is {a} times {b}?"]), str(a * b)
    if r == 3:
        w = rng.choice(WORDS)
        return rng.choice([f"Reverse the word {w}.", f"Spell {w} backwards."]), w[::-1]
    if r == 4:
        p = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
        return rng.choice([f"Uppercase: {p}", f"Write in capitals: {p}"]), p.upper()
    if r == 5:
        c = chr(ord("a") + rng.randrange(25))
        if rng.random() < 0.5:
            c = c.upper()
        return f"What letter comes after {c}?", chr(ord(c) + 1)
    if r == 6:
        w = rng.choice(WORDS)
        return f"How many letters are in the word {w}?", str(len(w))
    if r == 7:
        k = rng.choice(sorted(CAPITALS))
        return rng.choice([f"What is the capital of {k}?", f"Capital of {k}?"]), CAPITALS[k]
    if r == 8:
        w = rng.choice(WORDS)
        c = rng.choice(w)
        return f"How many times does the letter {c} appear in {w}?", str(w.count(c))
    return rng.choice(GREETINGS)


# --------------------------------------------------------------------------

def rngs_for(split, index, task=None, seed=None):
    """(task, content rng, render rng) behind sample(split, index, task, seed).
    Text, layout that decides the text, prompt and answer come from the
    content generator; colours, noise and other looks from the render one, so
    changing how things are drawn never changes a split's questions/answers.
    E.g. receipt_content(rngs_for(...)[1]) is the receipt of a receipt sample."""
    rng = random.Random(f"mcv-synth:{_key(split, seed)}:{index}:{task or '*'}")
    if task is None:
        task = rng.choices(TASKS, weights=TASK_WEIGHTS)[0]
    return task, random.Random(rng.getrandbits(64)), random.Random(rng.getrandbits(64))


def sample(split, index, task=None, seed=None, marks=None):
    """One sample, a pure function of (split or seed, index, task).
    marks: a list to receive what is where in the image, (x, y, what) in
    image pixels (see text_marks, scene_sample, mark_labels); the sample
    itself is the same with or without it."""
    key = _key(split, seed)
    if task is not None and task not in TASKS + TRAIN_TASKS:
        raise ValueError(f"synth: unknown task {task!r} (want one of {TASKS + TRAIN_TASKS})")
    sid = f"{key}-{index:06d}" if task is None else f"{key}-{task}-{index:06d}"
    task, rng, rrng = rngs_for(split, index, task, seed)
    img = None
    if task.startswith("receipt_"):
        img, prompt, answer = receipt_sample(rng, rrng, task, marks)
    elif task == "screenshot_read":
        img, prompt, answer = screenshot_sample(rng, rrng, marks)
    elif task == "snippet_read":
        img, prompt, answer = snippet_sample(rng, rrng, marks)
    elif task == "word_read":
        img, prompt, answer = word_sample(rng, rrng, marks)
    elif task.startswith("scene_"):
        img, prompt, answer = scene_sample(rng, rrng, task, marks)
    else:
        prompt, answer = text_sample(rng)
    return dict(id=sid, task=task, image=img, prompt=prompt, answer=answer)


# Dense auxiliary targets for training the vision tower: every mark becomes a
# few labels of one fixed label space (printable ASCII for glyphs; "a shape
# centre here" and its colour, shape and size for scenes).
MARK_LABELS = ([chr(c) for c in range(33, 127)] + ["shape"] + [f"colour:{c}" for c in COLOURS]
               + [f"shape:{s}" for s in SHAPES] + [f"size:{z}" for z in SIZES])
_MARK_INDEX = {k: i for i, k in enumerate(MARK_LABELS)}


def mark_labels(what):
    """Label ids (indices into MARK_LABELS) of one mark's `what`."""
    if isinstance(what, str):
        i = _MARK_INDEX.get(what)
        return [] if i is None else [i]
    _, colour, shape, size = what
    return [_MARK_INDEX["shape"], _MARK_INDEX[f"colour:{colour}"], _MARK_INDEX[f"shape:{shape}"],
            _MARK_INDEX[f"size:{size}"]]


def parse_id(sid):
    """Inverse of the id scheme: returns (split, seed, task, index)."""
    parts = sid.split("-")
    key, index = parts[0], int(parts[-1])
    task = parts[1] if len(parts) == 3 else None
    if key.startswith("seed"):
        return None, int(key[4:]), task, index
    return key, None, task, index


if __name__ == "__main__":
    import sys
    import time
    t = time.time()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    for i in range(n):
        s = sample("train", i)
    print(f"{(time.time() - t) / n * 1000:.2f} ms/sample")

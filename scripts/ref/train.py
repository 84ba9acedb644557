#!/usr/bin/python3
"""Train the proving model on scripts/data/synth.py samples.

    OMP_WAIT_POLICY=PASSIVE nohup nice -n 5 /usr/bin/python3 scripts/ref/train.py --out /root/mcv-runs/proving &

Resumes from the newest checkpoint in --out. Checkpoints every --ckpt-min
minutes (keeps the last 2), logs loss / aux / throughput every --log-every
steps and a small greedy validation every --val-every steps to --out/train.log.
Loss: cross-entropy on the answer tokens (and the closing <|im_end|>) plus
--aux times the load-balancing loss.
"""
import argparse
import glob
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

from model import (MiniCPMV, TextConfig, VisionConfig, aux_load_balance, aux_load_floor, image_to_crops,   # noqa: E402
                   set_fast_training, text_positions)
import chatfmt   # noqa: E402
import compact   # noqa: E402
import fprobe as fprobe_mod   # noqa: E402
import guide as guide_mod   # noqa: E402
import probe as probe_mod   # noqa: E402


def tower_feats(model, seqs, device='cpu', vision_bf16=False):
    """The vision tower's output rows per (sample, crop) of encoded samples, the crops of
    one shape and merge run as one batch.  vision_bf16: matmuls under CPU bf16 autocast."""
    by_shape = {}
    for si, sq in enumerate(seqs):
        for ci, c in enumerate(sq['crops']):
            by_shape.setdefault((tuple(c.shape), sq['merge']), []).append((si, ci))
    feats = {}
    for (_, mg), lst in by_shape.items():
        px = torch.stack([seqs[si]['crops'][ci] for si, ci in lst]).to(device)
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=vision_bf16):
            out, _ = model.vision(px, mg)
        for j, key in enumerate(lst):
            feats[key] = out[j].float() if out.dtype in (torch.bfloat16, torch.float16) else out[j]
    return feats


def sample_merge(task, index, p4x, by_task=False):
    """The vision mode sample index is trained in: 2 (4x) with probability p4x, else 4 (16x), a pure
    function of the index so a resume draws the same; by_task: scenes at 16x and every other image at
    4x, as the shipped model is used (mcv-eval's defaults)."""
    if by_task:
        return 4 if task.startswith('scene_') else 2
    return 2 if random.Random(f"mode:{index}").random() < p4x else 4


def dense_crop(vc, split, index, tol=0.0):
    """synth.dense_text -> (normalised crop (3, 224, 224), patch targets (n_patch, N_GLYPH));
    tol: probe.patch_targets' edge tolerance."""
    import synth
    img, marks = synth.dense_text(split, index)
    return image_to_crops(img, vc, 2)[0][0], probe_mod.patch_targets(marks, img.width, vc.patch, tol)


def dense_batch(vc, split, indices, crop=dense_crop):
    """crop(vc, split, i) for each index, stacked: (crops (n, 3, 224, 224), targets (n, n_patch, N_GLYPH))."""
    pairs = [crop(vc, split, i) for i in indices]
    return torch.stack([c for c, _ in pairs]), torch.stack([t for _, t in pairs])


def build_batch(model, seqs, device='cpu', vision_bf16=False, feats=None):
    """encoded samples (chatfmt.encode_sample) -> dict(emb (B,T,H), pos (B,T,4), labels (B,T), mask (B,T)).
    vision_bf16: run the vision tower's matmuls under CPU bf16 autocast (weights stay float32).
    feats: the image rows per (sample, crop) to use instead of the tower's (oracle_read.py)."""
    if feats is None:
        feats = tower_feats(model, seqs, device, vision_bf16)
    T = max(len(sq['ids']) for sq in seqs)
    H = model.tc.hidden
    emb_rows, pos_all, lab_all, msk_all = [], [], [], []
    for si, sq in enumerate(seqs):
        ids = torch.tensor(sq['ids'])
        e = model.text.embed[ids.clamp_min(0)]
        parts = []
        last = 0
        for (start, ci) in sq['img_spans']:
            f = feats[(si, ci)]
            parts.append(e[last:start])
            parts.append(f)
            last = start + f.shape[0]
        parts.append(e[last:])
        e = torch.cat(parts, 0)
        n = e.shape[0]
        if n < T:
            e = torch.cat([e, e.new_zeros(T - n, H)], 0)
        emb_rows.append(e)
        p = sq['pos']
        if n < T:
            p = torch.cat([p, text_positions(T - n, int(p[-1, 0]) + 1)], 0)
        pos_all.append(p)
        lab = torch.full((T,), -100, dtype=torch.long)
        lab[:n] = torch.tensor(sq['labels'])
        lab_all.append(lab)
        m = torch.zeros(T, dtype=torch.bool)
        m[:n] = True
        msk_all.append(m)
    return dict(emb=torch.stack(emb_rows), pos=torch.stack(pos_all), labels=torch.stack(lab_all),
                mask=torch.stack(msk_all), feats=feats)


def answer_logits(model, batch, h):
    """-> (logits, targets) of the labelled positions: position t predicts labels[t+1];
    the LM head runs only where there is a label."""
    tgt = batch['labels'][:, 1:].reshape(-1)
    sel = tgt != -100
    return model.text.logits(h[:, :-1].reshape(-1, h.shape[-1])[sel]).float(), tgt[sel]


def loss_fn(model, batch, aux_coef, floor_coef=0.0):
    """(loss, ce, Switch aux, aux_load_floor or None); floor_coef > 0 adds that times
    aux_load_floor to the loss."""
    stats = []
    h = model.text(batch['emb'], batch['pos'], stats=stats, mask=batch['mask'])
    ce = F.cross_entropy(*answer_logits(model, batch, h))
    mask = batch['mask'].reshape(-1)
    aux = aux_load_balance(stats, model.tc.n_expert, model.tc.n_expert_used, mask)
    loss = ce + aux_coef * aux
    fl = None
    if floor_coef > 0:
        fl = aux_load_floor(stats, model.tc.n_expert, mask=mask)
        loss = loss + floor_coef * fl
        fl = fl.detach()
    return loss, ce.detach(), aux.detach(), fl


@torch.no_grad()
def generate(model, tok, sample, merge=None, max_new=320):
    # 320: a spelled receipt takes a token per character
    vc = model.vc
    sq = chatfmt.encode_sample(tok, dict(sample, answer=None), vc, merge)
    ids = torch.tensor(sq['ids'])
    e = model.text.embed[ids.clamp_min(0)]
    parts, last = [], 0
    for (start, ci) in sq['img_spans']:
        f, _ = model.vision(sq['crops'][ci][None], sq['merge'])
        parts.append(e[last:start])
        parts.append(f[0])
        last = start + f.shape[1]
    parts.append(e[last:])
    e = torch.cat(parts, 0)[None]
    pos = sq['pos'][None]
    caches = model.text.new_caches()
    h = model.text(e, pos, caches, 'chunked')
    nxt = int(model.text.logits(h[:, -1]).argmax(-1))
    p = int(sq['next_pos'])
    out = []
    end = tok.id('<|im_end|>')
    for _ in range(max_new):
        if nxt == end:
            break
        out.append(nxt)
        e = model.text.embed[torch.tensor([[nxt]])]
        h = model.text(e, text_positions(1, p)[None], caches, 'recurrent')
        p += 1
        nxt = int(model.text.logits(h[:, -1]).argmax(-1))
    return tok.decode(out, special=False)


def cer(a, b):
    # Levenshtein distance / len(reference)
    if not b:
        return 0.0 if not a else 1.0
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] / len(b)


def validate(model, tok, synth, n_per_task=2, seed_split='val'):
    """Greedy answers on a few val samples per task; images alternate 16x / 4x mode.
    Returns {task: (exact match, CER)} and the same per vision mode under 'task@16x' / 'task@4x'."""
    model.eval()
    res, acc = {}, {}
    for task in synth.TASKS + synth.TRAIN_TASKS:
        for i in range(n_per_task):
            s = synth.sample(seed_split, i, task=task)
            mg = (4, 2)[i % 2]
            out = generate(model, tok, s, merge=mg)
            r = (float(out.strip() == s['answer'].strip()), cer(out, s['answer']))
            keys = [task] + ([f"{task}@{'16x' if mg == 4 else '4x'}"] if s['image'] is not None else [])
            for k in keys:
                acc.setdefault(k, []).append(r)
    for k, v in acc.items():
        res[k] = (sum(x[0] for x in v) / len(v), sum(x[1] for x in v) / len(v))
    model.train()
    return res


def lr_at(step, a, rewarm=None):
    """The schedule's rate at step; rewarm: the step a resume without Adam moments
    (a compact checkpoint) began at, from which the rate ramps up over a.rewarm steps."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))
    if rewarm is not None and step - rewarm < a.rewarm:
        lr *= (step - rewarm + 1) / a.rewarm
    return lr


CODE_KEYS = ('scene_code', 'scene_extra', 'glyph_code')


def save_ckpt(out, model, opt, state, extra=None):
    """-> the checkpoint's path, or a message saying why it was not written (a full
    disk must not end a run of hours: it goes on and tries again at the next one)."""
    path = os.path.join(out, f"ckpt-{state['step']:07d}.pt")
    tmp = path + '.tmp'
    try:
        torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), state=state,
                        config=model.config_dict(), **(extra or {})), tmp)
    except (OSError, RuntimeError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        return f'NOT written ({path}: {str(e).splitlines()[0][:120]}); training goes on'
    os.replace(tmp, path)
    ck = sorted(glob.glob(os.path.join(out, 'ckpt-*.pt')))
    for old in ck[:-2]:
        os.remove(old)
    return path


def decays(name, p):
    """Weight decay applies to matrices, not to norms, biases or position tables."""
    return p.dim() >= 2 and 'pos' not in name


def load_opt_state(opt, saved, model):
    """Adam moments from a checkpoint, whatever grouping it was saved with.

    Older checkpoints have two groups (decay, no decay) in named_parameters
    order; their per-parameter state is carried over by parameter identity so
    a resume into the four-group optimizer keeps every moment."""
    if len(saved['param_groups']) == len(opt.param_groups):
        opt.load_state_dict(saved)
        return
    idx = [i for g in saved['param_groups'] for i in g['params']]
    # the old optimizer numbered its parameters group by group: decay first, then no decay
    old_order = [p for n, p in sorted(model.named_parameters(), key=lambda np: not decays(*np))]
    if len(idx) != len(old_order):
        raise SystemExit(f'train.py: checkpoint optimizer has {len(idx)} parameters, model {len(old_order)}')
    for i, p in zip(idx, old_order):
        st = saved['state'].get(i)
        if st is not None:
            if st['exp_avg'].shape != p.shape:
                raise SystemExit('train.py: checkpoint optimizer state does not match the model')
            opt.state[p] = {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}


class HeapCap:
    """Bounds the resident heap when jemalloc runs without purging (train.sh sets
    MALLOC_CONF=dirty_decay_ms:-1,...): a step's large temporaries then reuse pages already
    mapped instead of faulting fresh ones in (~1.25x the steps/s), but the retained pages
    grow step after step; past cap_gb resident, every arena is purged once (the next step
    faults its pages in again, as with the default decay).  A no-op without jemalloc."""

    def __init__(self, cap_gb):
        import ctypes
        self.cap = int(cap_gb * 2**30)
        self.purges = 0
        self.page = os.sysconf('SC_PAGE_SIZE')
        try:
            self.mallctl = ctypes.CDLL(None).mallctl
        except (OSError, AttributeError):
            self.mallctl = None
        if self.cap <= 0 or 'dirty_decay_ms:-1' not in os.environ.get('MALLOC_CONF', ''):
            self.mallctl = None

    def rss(self):
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * self.page

    def check(self):
        if self.mallctl is not None and self.rss() > self.cap:
            # 4096 = MALLCTL_ARENAS_ALL
            if self.mallctl(b'arena.4096.purge', None, None, None, 0) == 0:
                self.purges += 1


def latest_ckpt(out):
    ck = sorted(glob.glob(os.path.join(out, 'ckpt-*.pt')))
    return ck[-1] if ck else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', default='/root/mcv-runs/proving')
    ap.add_argument('--steps', type=int, default=30000)
    ap.add_argument('--pool', type=int, default=128,
                    help='samples drawn at a time, sorted by length into batches (48: 21%% of the rows were '
                         'padding, 128: ~10%%)')
    ap.add_argument('--tokens', type=int, default=2048, help='batch budget: samples x padded length')
    ap.add_argument('--lr', type=float, default=2e-3)
    ap.add_argument('--min-lr-frac', type=float, default=0.05)
    ap.add_argument('--warmup', type=int, default=300)
    ap.add_argument('--rewarm', type=int, default=50,
                    help='after a resume from a compact checkpoint (no Adam moments, scripts/ref/compact.py), '
                         'ramp the rate up over this many steps')
    ap.add_argument('--wd', type=float, default=0.01)
    ap.add_argument('--aux', type=float, default=0.01)
    ap.add_argument('--aux-floor', type=float, default=0.0,
                    help="weight of model.aux_load_floor: pulls up experts whose mean router probability "
                         "is below half the fair share (the Switch --aux barely moves a starved expert)")
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--threads', default='auto',
                    help="N, or 'auto': 1 thread while the box is busy (OpenMP threads fighting other jobs "
                         "were 10x slower), 2 when the load average says the cores are free")
    ap.add_argument('--log-every', type=int, default=20)
    ap.add_argument('--val-every', type=int, default=500)
    ap.add_argument('--val-n', type=int, default=2, help='val samples per task (alternating 16x / 4x)')
    ap.add_argument('--ckpt-min', type=float, default=10)
    ap.add_argument('--max-steps-this-run', type=int, default=0, help='stop after this many steps (0: run to --steps)')
    ap.add_argument('--bench', action='store_true', help='time a few steps and exit')
    ap.add_argument('--bench-steps', type=int, default=6, help='steps --bench times')
    ap.add_argument('--bf16-vision', action='store_true',
                    help='vision tower matmuls under CPU bf16 autocast (~1.5-2x faster vision on AVX512_BF16; '
                         'off by default: its effect on the loss curve is not yet checked)')
    ap.add_argument('--merge', type=int, default=4, help='default vision mode written to the config')
    ap.add_argument('--p4x', type=float, default=0.5, help='share of samples trained in 4x (no vit_merger) mode')
    ap.add_argument('--mode-by-task', action='store_true',
                    help='scenes in 16x mode, every other image in 4x (as mcv-eval runs them), instead of --p4x')
    ap.add_argument('--tokenizer', default=None, help='tokenizer.json (default: scripts/data/tokenizer.json)')
    ap.add_argument('--probe', type=float, default=0.0,
                    help='weight of the dense auxiliary vision loss (probe.py: glyph and shape labels per '
                         'visual token from the generator; training only, not exported); 0: off')
    ap.add_argument('--probe-sub', type=float, default=0.0,
                    help='weight of the glyph-position probe (probe.sub_loss: which glyphs sit in each patch '
                         'of a token), trained with --probe-lr; needs --probe')
    ap.add_argument('--probe-lr', type=float, default=20.0,
                    help="the probe head's learning rate as a multiple of the model's: a linear head on "
                         "normalised rows needs weights of order 1, which Adam at the model's rate takes "
                         "thousands of steps to reach")
    ap.add_argument('--dense', type=int, default=0, metavar='N',
                    help='per step, N dense text crops (synth.dense_text) through the tower with a '
                         'patch-level glyph head (probe.patch_loss), trained with --probe-lr; 0: off')
    ap.add_argument('--dense-weight', type=float, default=1.0, help='weight of the --dense loss')
    ap.add_argument('--dense-tol', type=float, default=0.0, metavar='PX',
                    help="--dense targets: a glyph centred within PX pixels of a patch edge is not held "
                         "against the neighbour naming it (probe.patch_targets); val recall keeps the "
                         "centre rule")
    ap.add_argument('--guide', type=float, default=0.0,
                    help='weight of the guided reading attention loss (guide.py: one head of the first and '
                         'the last attention layer pulled onto the glyph read / to be written); 0 = off')
    ap.add_argument('--shape', type=float, default=0.0,
                    help="weight of a softmax over the shape labels of the probe head at each scene shape's "
                         "token (probe.shape_loss; the probe's BCE left shapes at ~0.63); needs --probe; 0 = off")
    ap.add_argument('--shape-extent', action='store_true',
                    help="--shape on every token a shape covers (probe.shape_targets radius), not only the "
                         "token of its centre")
    ap.add_argument('--img-center', type=float, default=0.0, metavar='W',
                    help="add W x the share of the image embeddings' energy that is common to every image "
                         "token of the batch (probe.common_share): a fresh tower's tokens are ~0.9 one "
                         "shared vector, which the language model must learn to see past")
    ap.add_argument('--pos', type=float, default=0.0,
                    help="weight of a linear head reading each image token's (column, row) in its crop from "
                         "the tower's output (probe.pos_loss: the language model orders image tokens by column "
                         "near chance), trained with --probe-lr; 0 = off")
    ap.add_argument('--fprobe', type=float, default=0.0,
                    help='weight of a factored token head (fprobe.py: glyph codes shared across the places '
                         'of a token, the code the language model reads fastest), trained with --probe-lr; '
                         'needs --probe; 0 = off')
    ap.add_argument('--fprobe-mode', choices=('place', 'slot'), default='slot',
                    help='--fprobe targets: glyphs per place on an 8x4 grid, or the k-th glyph in reading order')
    ap.add_argument('--reinit-vision', type=int, default=None, metavar='SEED',
                    help='on resume, replace the vision tower (and the probe head) by a fresh one '
                         '(PyTorch default init, this seed) with fresh optimizer state; the language '
                         'model keeps its weights. Used once: the step-2442 tower had lost the '
                         'visual information a random tower still carries (examples/models/README.md)')
    ap.add_argument('--vision-lr-mult', type=float, default=1.0,
                    help="the vision tower's learning rate as a multiple of the schedule's (e.g. 0.25)")
    ap.add_argument('--task-weights', default=None,
                    help="curriculum phase: TASK=W,... (e.g. scene_caption=3,text=1) draws each sample's task "
                         "with these weights instead of synth.TASK_WEIGHTS (tasks not named are not drawn)")
    ap.add_argument('--rope-base', type=float, default=None,
                    help="on resume, change the attention layers' RoPE base (the model's config; at base 1e6 "
                         "and 16 rotary dims an image column turned a query by 0.03 rad: the language model "
                         "could not tell the columns apart)")
    ap.add_argument('--snippet-large', type=float, default=None,
                    help='share of snippet_read samples in large print (default synth.SNIPPET_LARGE, 0.5; '
                         '0: the snippets of before step 5395, as scripts/ref/recipe.sh replays them)')
    ap.add_argument('--fast', default='on', choices=('on', 'off'),
                    help='training-only fast paths of model.py (set_fast_training; same loss and gradients, '
                         'scripts/ref/check_train_fast.py); off: the reference forward')
    ap.add_argument('--fast-chunk', type=int, default=32, help="the fast path's DeltaNet chunk")
    ap.add_argument('--spell', action='store_true',
                    help='reading answers one character per token (chatfmt.spelled), as oracle_read.py --spell '
                         'trains them; kept by every later resume of the run, and taken from a start '
                         'checkpoint that was trained so')
    ap.add_argument('--read-upscale', metavar='LO,HI',
                    help='plan the slices of each image that is not a scene as for the picture scaled by a '
                         'factor drawn uniformly from [LO, HI] (mcv-run --upscale): a finer view of print')
    ap.add_argument('--heap-cap-gb', type=float, default=3.5,
                    help='with jemalloc and MALLOC_CONF=dirty_decay_ms:-1 (train.sh): purge the retained '
                         'pages whenever the resident set passes this many GiB (0: never)')
    a = ap.parse_args()
    for flag, w in (('--probe-sub', a.probe_sub), ('--shape', a.shape), ('--fprobe', a.fprobe)):
        if w > 0 and a.probe <= 0:
            ap.error(f'{flag} needs --probe')

    nthreads = 1 if a.threads == 'auto' else int(a.threads)
    task_w = None
    if a.task_weights:
        import synth as _synth
        task_w = {}
        for kv in a.task_weights.split(','):
            k, _, v = kv.partition('=')
            if k not in _synth.TASKS + _synth.TRAIN_TASKS or not v:
                ap.error(f'--task-weights: want TASK=WEIGHT with TASK one of '
                         f'{_synth.TASKS + _synth.TRAIN_TASKS}, got {kv!r}')
            task_w[k] = float(v)
    read_scale = None
    if a.read_upscale:
        try:
            read_scale = tuple(float(x) for x in a.read_upscale.split(','))
        except ValueError:
            read_scale = ()
        if len(read_scale) != 2 or not 0 < read_scale[0] <= read_scale[1] <= 4:
            ap.error(f'--read-upscale: want LO,HI with 0 < LO <= HI <= 4, got {a.read_upscale!r}')
    torch.set_num_threads(nthreads)
    os.makedirs(a.out, exist_ok=True)
    import synth
    import bpe
    if a.snippet_large is not None:
        synth.SNIPPET_LARGE = a.snippet_large
    tok = bpe.Tokenizer.load(a.tokenizer) if a.tokenizer else bpe.default()
    logf = open(os.path.join(a.out, 'train.log'), 'a')

    def log(msg):
        line = time.strftime('%Y-%m-%d %H:%M:%S ') + msg
        print(line, flush=True)
        logf.write(line + '\n')
        logf.flush()

    ck = latest_ckpt(a.out)
    if ck and not a.bench:
        d = compact.load(ck)
        model = MiniCPMV.from_config(d['config'])
        model.load_state_dict(d['model'])
        state = d['state']
        log(f'resume from {ck} at step {state["step"]}')
    else:
        torch.manual_seed(a.seed)
        tc = TextConfig(vocab=len(tok.tokens), **({} if a.rope_base is None else {"rope_base": a.rope_base}))
        vc = VisionConfig(merge=a.merge)
        model = MiniCPMV(tc, vc)
        model.text.reset_parameters(a.seed)
        state = dict(step=0, sample=0, seed=a.seed, args=vars(a))
        d = None
    # a model that learnt to spell its reading answers goes on spelling them: switching back
    # to whole-word tokens would undo what it learnt (session 28)
    spell = bool(a.spell or state.get('spell') or state.get('oracle_read', {}).get('spell'))
    if spell:
        log('reading answers spelled one character per token' + ('' if a.spell else ' (as the checkpoint was trained)'))
    state['spell'] = spell
    if a.mode_by_task:
        log('scenes trained at 16x, every other image at 4x (--mode-by-task)')
    if read_scale:
        log(f'images other than scenes sliced as if scaled by {read_scale[0]}-{read_scale[1]} (--read-upscale)')
    state['mode_by_task'] = a.mode_by_task
    # the fixed codes the tower was taught to write (tower_code.py) stay with the run,
    # so a later tower_code.py or oracle_read.py stage uses the same code
    codes = {k: d[k] for k in CODE_KEYS if d is not None and k in d}
    # four groups: (text, vision) x (decay, no decay); the tower's groups run at
    # --vision-lr-mult x the schedule, because a rate the language model takes
    # (~1e-3) collapses the tower (model card, session 4)
    groups = {}
    for n, p in model.named_parameters():
        tower = n.startswith('vision.')
        groups.setdefault((tower, decays(n, p)), []).append(p)
    opt = torch.optim.AdamW([dict(params=groups[k], weight_decay=a.wd if k[1] else 0.0,
                                  lr_mult=a.vision_lr_mult if k[0] else 1.0)
                             for k in sorted(groups)],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    # the auxiliary heads and their optimizers live beside the model in the checkpoint
    # (under key and key + '_opt'), never in its state_dict
    saved = []

    def aux_head(key, module, resume=True):
        o = torch.optim.AdamW(module.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
        if d is not None and resume and key in d:
            module.load_state_dict(d[key])
            if d.get(key + '_opt') is not None:     # None in a compact checkpoint
                o.load_state_dict(d[key + '_opt'])
        saved.append((key, module, o))
        return module, o

    head = head_opt = None
    if a.probe > 0:
        head = torch.nn.Linear(model.tc.hidden, len(synth.MARK_LABELS))
        with torch.no_grad():
            head.bias.fill_(-4.0)   # labels are sparse: start near their prior, not at 0.5 each
        head, head_opt = aux_head('probe', head)
        log(f'probe loss weight {a.probe} over {len(synth.MARK_LABELS)} labels')
        if a.shape > 0:
            shape_ids = torch.tensor([synth.MARK_LABELS.index(f'shape:{k}') for k in synth.SHAPES])
            # the smallest radius of each size class: the covered tokens are surely on the shape
            shape_radius = {k: lo for k, (lo, _) in synth.SIZES.items()} if a.shape_extent else None
            log(f'shape loss weight {a.shape}' + (', every token a shape covers' if a.shape_extent else ''))
    sub = sub_opt = None
    if a.probe > 0 and a.probe_sub > 0:
        sub, sub_opt = aux_head('probe_sub', probe_mod.SubHeads(model.tc.hidden))
        log(f'glyph-position probe weight {a.probe_sub}')
    phead = phead_opt = None
    if a.pos > 0:
        phead, phead_opt = aux_head('pos', torch.nn.Linear(model.tc.hidden, 2))
        log(f'token position head weight {a.pos}')
    fhead = fhead_opt = None
    if a.probe > 0 and a.fprobe > 0:
        # a head of the other mode has other shapes: start afresh
        fhead, fhead_opt = aux_head('fprobe', fprobe_mod.FactoredHead(model.tc.hidden, a.fprobe_mode),
                                    resume=d is not None and d.get('fprobe_mode') == a.fprobe_mode)
        log(f'factored token head ({a.fprobe_mode}) weight {a.fprobe}')

    dense = dense_opt = None
    if a.dense > 0:
        dense, dense_opt = aux_head('dense', probe_mod.new_patch_head(model.vc.width))
        log(f'dense glyph crops {a.dense} a step, weight {a.dense_weight}'
            + (f', edge tolerance {a.dense_tol} px' if a.dense_tol > 0 else ''))
        dense_val = dense_batch(model.vc, 'val', range(16))
    if a.guide > 0:
        log(f'guided reading attention, weight {a.guide}')
    if a.img_center > 0:
        log(f"image embeddings' common share, weight {a.img_center}")

    def extra():
        e = {}
        for key, module, o in saved:
            e[key], e[key + '_opt'] = module.state_dict(), o.state_dict()
        if fhead is not None:
            e['fprobe_mode'] = a.fprobe_mode
        e.update(codes)
        return e or None
    if d is not None:
        if d['opt'] is not None:
            load_opt_state(opt, d['opt'], model)
        else:
            state['rewarm'] = state['step']
            log(f'no optimizer state (compact checkpoint): fresh Adam moments, the rate ramps up '
                f'over {a.rewarm} steps')
        if a.reinit_vision is not None and not state.get('reinit_vision_done'):
            torch.manual_seed(a.reinit_vision)
            fresh = MiniCPMV(model.tc, model.vc).vision
            model.vision.load_state_dict(fresh.state_dict())
            for p in model.vision.parameters():
                opt.state.pop(p, None)          # Adam moments start again for the new tower
            if head is not None:
                torch.nn.init.zeros_(head.weight)
                with torch.no_grad():
                    head.bias.fill_(-4.0)
                head_opt.state.clear()
            state['reinit_vision_done'] = state['step']
            log(f'vision tower re-initialised (seed {a.reinit_vision}) at step {state["step"]}')
        if a.rope_base is not None and a.rope_base != model.tc.rope_base:
            # every layer shares model.tc, so this is the base of every attention layer
            # from here on; the checkpoints' config (and so the export) carries it
            log(f'RoPE base {model.tc.rope_base:g} -> {a.rope_base:g} at step {state["step"]}')
            state.setdefault('rope_base_changes', []).append((state['step'], model.tc.rope_base, a.rope_base))
            model.tc.rope_base = a.rope_base
        del d
    if a.fast == 'on':
        set_fast_training(model, True, a.fast_chunk)
    if task_w:
        log(f'task weights {a.task_weights}')
    nparam = sum(p.numel() for p in model.parameters())
    log(f'params {nparam/1e6:.2f}M text {sum(p.numel() for p in model.text.parameters())/1e6:.2f}M '
        f'vision {sum(p.numel() for p in model.vision.parameters())/1e6:.2f}M vocab {model.tc.vocab}')

    model.train()
    heap = HeapCap(a.heap_cap_gb)
    t_ckpt = time.time()
    t0 = time.time()
    acc = dict(loss=0.0, ce=0.0, aux=0.0, n=0, tok=0)
    steps_this_run = 0
    done = False
    bad_steps = 0
    while state['step'] < a.steps and not done:
        # a pool of samples, sorted by length and cut into batches of about --tokens
        # (samples x padded length): little padding, similar cost per step
        p0 = state['sample']
        if task_w:
            # the task is a pure function of the sample index too, so a resume redraws the same pool
            tl = sorted(task_w)
            tasks = [random.Random(f"task:{p0 + i}").choices(tl, [task_w[t] for t in tl])[0]
                     for i in range(a.pool)]
        else:
            tasks = [None] * a.pool
        marks = [[] if head is not None or a.guide > 0 else None for _ in range(a.pool)]
        samples = [synth.sample('train', p0 + i, task=tasks[i], marks=marks[i]) for i in range(a.pool)]
        seqs = []
        for i, s in enumerate(samples):
            mg = sample_merge(s['task'], p0 + i, a.p4x, a.mode_by_task)
            if read_scale and s['image'] is not None and not s['task'].startswith('scene_'):
                # a finer view of print some of the time: slices planned as for the picture
                # scaled by a factor drawn from the index (mcv-run --upscale)
                s['scale'] = random.Random(f"upscale:{p0 + i}").uniform(*read_scale)
            sq = chatfmt.encode_sample(tok, s, model.vc, mg, spell=spell)
            if marks[i]:
                sq['probe'] = probe_mod.targets(marks[i], s['image'].size, model.vc, mg,
                                                [c.shape for c in sq['crops']], synth.mark_labels,
                                                len(synth.MARK_LABELS))
                if sub is not None:
                    sq['probe_sub'] = probe_mod.sub_targets(marks[i], s['image'].size, model.vc, mg,
                                                            [c.shape for c in sq['crops']])
                if a.shape > 0:
                    sq['shapes'] = probe_mod.shape_targets(marks[i], s['image'].size, model.vc, mg, synth.SHAPES,
                                                           shape_radius)
                if fhead is not None:
                    sq['fprobe'] = fprobe_mod.crop_targets(marks[i], s['image'].size, model.vc, mg,
                                                           [c.shape for c in sq['crops']], a.fprobe_mode)
            if a.guide > 0 and marks[i] and all(isinstance(w, str) for _, _, w in marks[i]):
                sq['guide'] = guide_mod.targets(tok, sq, marks[i], model.vc, mg, s['image'].size)
            seqs.append(sq)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]['ids']))
        batches, cur = [], []
        for i in order:
            if cur and (len(cur) + 1) * len(seqs[i]['ids']) > a.tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
        random.Random(f"order:{p0}").shuffle(batches)
        for bi in batches:
            if a.threads == 'auto':
                # our own process counts about nthreads in the load average
                load = os.getloadavg()[0]
                want = 2 if load < nthreads + 0.6 else 1
                if want != nthreads:
                    nthreads = want
                    torch.set_num_threads(nthreads)
                    log(f'threads {nthreads} (load {load:.2f})')
            step = state['step']
            lr = lr_at(step, a, state.get('rewarm'))
            for g in opt.param_groups:
                g['lr'] = lr * g['lr_mult']
            bseqs = [seqs[i] for i in bi]
            batch = build_batch(model, bseqs, vision_bf16=a.bf16_vision)
            guided = a.guide > 0 and any('guide' in sq for sq in bseqs)
            guide_mod.keep(model, guided)
            loss, ce, aux, fl = loss_fn(model, batch, a.aux, a.aux_floor)
            if fl is not None:
                acc['floor'] = acc.get('floor', 0.0) + float(fl)
                acc['n_floor'] = acc.get('n_floor', 0) + 1
            if guided:
                g_loss = guide_mod.loss(model, [sq.get('guide', ([], [])) for sq in bseqs])
                guide_mod.keep(model, False)
                loss = loss + a.guide * g_loss
                acc['guide'] = acc.get('guide', 0.0) + float(g_loss)
                acc['n_guide'] = acc.get('n_guide', 0) + 1
            # the auxiliary vision heads (probe.py): (log key, loss, weight, optimizer), each
            # with its own weight in the loss, all at --probe-lr x the schedule
            aux_heads = []
            if head is not None:
                aux_heads.append(('probe', probe_mod.loss(head, batch['feats'], bseqs), a.probe, head_opt))
            if sub is not None:
                aux_heads.append(('sub', probe_mod.sub_loss(sub, batch['feats'], bseqs), a.probe_sub, sub_opt))
            if a.shape > 0 and head is not None:
                # the probe head's own optimizer steps once, with the 'probe' entry
                aux_heads.append(('shape', probe_mod.shape_loss(head, batch['feats'], bseqs, shape_ids), a.shape,
                                  None))
            if a.img_center > 0 and batch['feats']:
                aux_heads.append(('center', probe_mod.common_share(batch['feats']), a.img_center, None))
            if phead is not None:
                aux_heads.append(('pos', probe_mod.pos_loss(phead, batch['feats'], bseqs), a.pos, phead_opt))
            if fhead is not None:
                aux_heads.append(('fprobe', fprobe_mod.batch_loss(fhead, batch['feats'], bseqs), a.fprobe,
                                  fhead_opt))
            if dense is not None:
                # indices follow the step, so a resume (which repeats the steps since the
                # checkpoint) draws the same crops again
                px, tg = dense_batch(model.vc, 'train', range(step * a.dense, (step + 1) * a.dense),
                                     lambda vc, sp, i: dense_crop(vc, sp, i, a.dense_tol))
                aux_heads.append(('dense', probe_mod.patch_loss(dense, model.vision.patch_rows(px), tg),
                                  a.dense_weight, dense_opt))
            aux_heads = [(k, l, w, o) for k, l, w, o in aux_heads if l is not None]
            for _, l, w, o in aux_heads:
                loss = loss + w * l
                if o is None:
                    continue
                o.zero_grad(set_to_none=True)
                for g in o.param_groups:
                    g['lr'] = lr * a.probe_lr
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not (torch.isfinite(loss) and torch.isfinite(gn)):
                # never let a bad batch poison the weights (or a checkpoint)
                bad_steps += 1
                log(f'step {step}: non-finite loss/grad, batch skipped ({bad_steps} so far)')
                if bad_steps > 20:
                    log('too many non-finite steps; stopping without a checkpoint')
                    sys.exit(1)
                continue
            opt.step()
            heap.check()
            for k, l, _, o in aux_heads:
                if o is not None:
                    o.step()
                acc[k] = acc.get(k, 0.0) + float(l)
                acc['n_' + k] = acc.get('n_' + k, 0) + 1
            state['step'] += 1
            steps_this_run += 1
            acc['loss'] += float(loss)
            acc['ce'] += float(ce)
            acc['aux'] += float(aux)
            acc['n'] += 1
            acc['tok'] += int(batch['mask'].sum())
            acc['smp'] = acc.get('smp', 0) + len(bi)
            if a.bench and steps_this_run >= a.bench_steps:
                dt = time.time() - t0
                print(f'bench: {steps_this_run} steps in {dt:.1f}s: {steps_this_run/dt:.3f} steps/s, '
                      f'{acc["tok"]/dt:.0f} tok/s, {acc["smp"]/dt:.2f} samples/s, ce {acc["ce"]/acc["n"]:.3f}'
                      f', heap purges {heap.purges}')
                return
            if state['step'] % a.log_every == 0:
                dt = time.time() - t0
                pr = ''.join(f' {k} {acc[k]/acc["n_" + k]:.3f}' for k in ('floor', 'probe', 'shape', 'center', 'sub', 'pos', 'fprobe', 'dense', 'guide')
                             if acc.get('n_' + k))
                log(f'step {state["step"]} loss {acc["loss"]/acc["n"]:.4f} ce {acc["ce"]/acc["n"]:.4f} '
                    f'aux {acc["aux"]/acc["n"]:.4f}{pr} lr {lr:.2e} {acc["n"]/dt:.3f} steps/s '
                    f'{acc["tok"]/dt:.0f} tok/s {acc["smp"]/dt:.2f} samples/s (seen {p0 + a.pool})')
                acc = dict(loss=0.0, ce=0.0, aux=0.0, n=0, tok=0)
                t0 = time.time()
            if state['step'] % a.val_every == 0:
                tv = time.time()
                res = validate(model, tok, synth, a.val_n)
                log('val ' + ' '.join(f'{k}:em={v[0]:.2f},cer={v[1]:.3f}' for k, v in res.items())
                    + f' ({time.time()-tv:.0f}s)')
                if dense is not None:
                    model.eval()
                    h, n = probe_mod.patch_recall_over(dense, model.vision.patch_rows, *dense_val, batch=16)
                    model.train()
                    log(f'val dense glyph recall {h / max(1, n):.3f} ({n} glyphs, 16 crops)')
                t0 += time.time() - tv
            if a.max_steps_this_run and steps_this_run >= a.max_steps_this_run:
                done = True
                break
        # checkpoints only between pools, so a resume restarts exactly at the next pool
        state['sample'] = p0 + a.pool
        if time.time() - t_ckpt > a.ckpt_min * 60:
            log(f'checkpoint {save_ckpt(a.out, model, opt, state, extra())}')
            t_ckpt = time.time()
    where = save_ckpt(a.out, model, opt, state, extra())
    log(f'checkpoint {where}')
    if where.startswith('NOT'):
        sys.exit(1)


if __name__ == '__main__':
    main()

#!/usr/bin/python3
"""PyTorch reference of the MiniCPM-V 4.7-class architecture, as llama.cpp computes it.

Text: llama.cpp `qwen35moe` (src/models/qwen35moe.cpp, delta-net-base.cpp,
build_moe_ffn, IMROPE). Vision: llama.cpp mtmd projector `minicpmv4_6`
(tools/mtmd/models/minicpmv.cpp) -- the newest MiniCPM-V projector in the
llama.cpp that node-llama-cpp 3.22.1 bundles; MiniCPM-V 4.7 uses the same
window-attention merger + downsample MLP layout.

Weights are kept in the orientation GGUF stores them after reversing ne
(PyTorch nn.Linear layout: [out, in]); norm weights are used as stored
(no 1+w), as llama.cpp does with a GGUF.

Two execution forms for the Gated DeltaNet: `chunked` (training / prefill,
WY form with a triangular solve) and `recurrent` (decode, one token at a
time with conv and SSM state); tests check they agree.
"""
import math
from dataclasses import dataclass, asdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- configs

@dataclass
class TextConfig:
    vocab: int = 2048
    hidden: int = 256
    n_layer: int = 8
    full_attn_interval: int = 4       # layer il is attention when (il+1) % interval == 0
    n_head: int = 4
    n_kv: int = 2
    head_dim: int = 64
    rope_dims: int = 16               # partial rotary: 0.25 * head_dim
    rope_sections: tuple = (3, 3, 2, 0)
    rope_base: float = 1e6
    ssm_nk: int = 4                   # DeltaNet key heads (ssm.group_count)
    ssm_nv: int = 8                   # DeltaNet value heads (ssm.time_step_rank)
    ssm_dk: int = 32                  # head dim (ssm.state_size)
    conv_k: int = 4
    n_expert: int = 64
    n_expert_used: int = 8
    expert_ff: int = 64
    shared_ff: int = 256
    eps: float = 1e-6
    ctx: int = 2048

    def is_recurrent(self, il):
        return (il + 1) % self.full_attn_interval != 0


@dataclass
class VisionConfig:
    image_size: int = 224             # scale / slice resolution
    patch: int = 14
    width: int = 192
    n_layer: int = 6
    n_head: int = 3
    ff: int = 768
    eps: float = 1e-6
    insert_layer: int = 2             # vit_merger after this layer (16x mode)
    merge: int = 4                    # default mode: 4 = 16x (vit_merger + final merger), 2 = 4x (final merger only)
    merger_ff: int = 768              # vit_merger ds_ffn hidden
    proj_ff: int = 1024               # final merger hidden
    pos_buckets: int = 70             # learned position table is buckets x buckets
    max_slices: int = 9
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)


# ---------------------------------------------------------------- helpers

def rms_norm(x, w, eps):
    x32 = x if x.dtype == torch.float64 else x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w).to(x.dtype)


def _f32(x):
    # training runs matmuls under CPU bf16 autocast; the numerically touchy parts (softmax,
    # DeltaNet decay / triangular solve) go back to float32. float32 / float64 pass unchanged.
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def l2_norm(x, eps):
    # ggml_l2_norm: x / max(||x||, eps); written with a clamp before the rsqrt so that
    # all-zero (padding) rows have a finite gradient
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True).clamp_min(eps * eps))


def imrope_angles(pos4, cfg: TextConfig):
    """pos4: (..., 4) int positions (t, h, w, e). Returns angles (..., rope_dims/2).

    Interleaved M-RoPE as ggml IMROPE: pair i uses sector = i % sum(sections);
    sector%3==0 -> t, 1 -> h, 2 -> w while inside 3*section, else e."""
    half = cfg.rope_dims // 2
    s = cfg.rope_sections
    nsec = sum(s)
    comp = []
    for i in range(half):
        sec = i % nsec
        if sec % 3 == 1 and sec < 3 * s[1]:
            comp.append(1)
        elif sec % 3 == 2 and sec < 3 * s[2]:
            comp.append(2)
        elif sec % 3 == 0 and sec < 3 * s[0]:
            comp.append(0)
        else:
            comp.append(3)
    comp = torch.tensor(comp, device=pos4.device)
    p = pos4.float().index_select(-1, comp)                       # (..., half)
    inv = cfg.rope_base ** (-2.0 * torch.arange(half, device=pos4.device, dtype=torch.float64) / cfg.rope_dims)
    return p * inv.float()


def apply_rope(x, ang, n_rot):
    """x: (B, T, H, D); ang: (B, T, n_rot/2). NEOX pairing (i, i + n_rot/2), rest untouched."""
    half = n_rot // 2
    c = torch.cos(ang)[:, :, None, :]
    s = torch.sin(ang)[:, :, None, :]
    x1, x2, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def text_positions(n, start=0):
    """(n, 4) positions for plain text tokens."""
    p = torch.arange(start, start + n)
    return torch.stack([p, p, p, torch.zeros_like(p)], dim=-1)


def image_positions(p0, nx, ny):
    """llama.cpp mtmd MROPE layout of one image chunk: t = p0, h = p0 + row, w = p0 + col.
    The chunk advances the position by max(nx, ny)."""
    r = torch.arange(ny).repeat_interleave(nx)
    c = torch.arange(nx).repeat(ny)
    t = torch.full_like(r, p0)
    return torch.stack([t, p0 + r, p0 + c, torch.zeros_like(r)], dim=-1), max(nx, ny)


# ---------------------------------------------------------------- text blocks

# parity_c.py --fp16-attention: round the attention's q, k, v and softmax weights to fp16, as
# the C runtime stores them, so that what is left between the two is summation order
FP16_ATTENTION = False


class Attention(nn.Module):
    keep_att = False     # True: keep the last attention probabilities in last_att (guide.py)

    def __init__(self, c: TextConfig):
        super().__init__()
        self.c = c
        self.wq = nn.Parameter(torch.empty(2 * c.n_head * c.head_dim, c.hidden))   # per head: q then gate
        self.wk = nn.Parameter(torch.empty(c.n_kv * c.head_dim, c.hidden))
        self.wv = nn.Parameter(torch.empty(c.n_kv * c.head_dim, c.hidden))
        self.wo = nn.Parameter(torch.empty(c.hidden, c.n_head * c.head_dim))
        self.q_norm = nn.Parameter(torch.ones(c.head_dim))
        self.k_norm = nn.Parameter(torch.ones(c.head_dim))

    def forward(self, x, ang, cache=None):
        c = self.c
        B, T, _ = x.shape
        qg = (x @ self.wq.t()).view(B, T, c.n_head, 2 * c.head_dim)
        q, gate = qg[..., :c.head_dim], qg[..., c.head_dim:]
        k = (x @ self.wk.t()).view(B, T, c.n_kv, c.head_dim)
        v = (x @ self.wv.t()).view(B, T, c.n_kv, c.head_dim)
        q = rms_norm(q, self.q_norm, c.eps)
        k = rms_norm(k, self.k_norm, c.eps)
        q = apply_rope(q, ang, c.rope_dims)
        k = apply_rope(k, ang, c.rope_dims)
        past = 0
        if cache is not None:
            if 'k' in cache:
                past = cache['k'].shape[1]
                k = torch.cat([cache['k'], k], 1)
                v = torch.cat([cache['v'], v], 1)
            cache['k'], cache['v'] = k, v
        if FP16_ATTENTION:      # what the C runtime (and llama.cpp) keep in fp16
            q, k, v = (t.to(torch.float16).to(t.dtype) for t in (q, k, v))
        rep = c.n_head // c.n_kv
        # ggml broadcasts kv head h // rep to query head h
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        S = k.shape[1]
        att = _f32(torch.einsum('bthd,bshd->bhts', q, k)) / math.sqrt(c.head_dim)
        mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(past)
        att = att.masked_fill(~mask, float('-inf')).softmax(-1).to(v.dtype)
        if FP16_ATTENTION:
            att = att.to(torch.float16).to(v.dtype)
        if self.keep_att:
            self.last_att = att     # training only: guide.py reads it (B, heads, T, S)
        o = torch.einsum('bhts,bshd->bthd', att, v)
        o = o * torch.sigmoid(gate)
        return o.reshape(B, T, -1) @ self.wo.t()


def delta_rule_recurrent(q, k, v, g, beta, S):
    """q,k: (B,T,H,dk) (already L2-normed, q scaled); v: (B,T,H,dv); g, beta: (B,T,H);
    S: (B,H,dk,dv). Returns o (B,T,H,dv) and the final state."""
    outs = []
    for t in range(q.shape[1]):
        S = S * torch.exp(g[:, t])[..., None, None]
        kv = torch.einsum('bhk,bhkv->bhv', k[:, t], S)
        d = (v[:, t] - kv) * beta[:, t][..., None]
        S = S + torch.einsum('bhk,bhv->bhkv', k[:, t], d)
        outs.append(torch.einsum('bhk,bhkv->bhv', q[:, t], S))
    return torch.stack(outs, 1), S


def _pad_to_chunks(chunk, q, k, v, g, beta):
    """Zero-pad the time axis (dim 1) of every input to a whole number of chunks."""
    pad = (chunk - q.shape[1] % chunk) % chunk
    if not pad:
        return q, k, v, g, beta
    zp = lambda t: F.pad(t, [0, 0] * (t.dim() - 2) + [0, pad])
    return zp(q), zp(k), zp(v), zp(g), zp(beta)


def delta_rule_chunked(q, k, v, g, beta, S, chunk=64):
    """Same result as delta_rule_recurrent, computed chunk by chunk (WY form)."""
    B, T, H, dk = q.shape
    q, k, v, g, beta = _pad_to_chunks(chunk, q, k, v, g, beta)
    n = q.shape[1] // chunk
    # (B, H, n, C, d)
    rs = lambda t: t.view(B, n, chunk, H, -1).permute(0, 3, 1, 2, 4)
    q, k, v = rs(q), rs(k), rs(v)
    g = g.view(B, n, chunk, H).permute(0, 3, 1, 2)
    beta = beta.view(B, n, chunk, H).permute(0, 3, 1, 2)
    gc = g.cumsum(-1)                                              # (B,H,n,C)
    diff = gc[..., :, None] - gc[..., None, :]                     # t - j
    low_incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    low_strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    decay = torch.exp(diff.masked_fill(~low_incl, float('-inf')))  # exp(gc_t - gc_j), j <= t
    kk = k @ k.transpose(-1, -2)
    A = (beta[..., None] * kk * decay).masked_fill(~low_strict, 0.0)
    eye = torch.eye(chunk, device=q.device, dtype=q.dtype)
    gamma = torch.exp(gc)[..., None]                               # (B,H,n,C,1)
    # one forward substitution for both right-hand sides; (I + A)^-1 must not be formed by
    # power series: with aligned keys and beta ~ 1 the powers of A overflow float32
    dv = v.shape[-1]
    rhs = torch.cat([beta[..., None] * v, beta[..., None] * gamma * k], -1)
    sol = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
    Uv, Wk = sol[..., :dv], sol[..., dv:]
    qk = (q @ k.transpose(-1, -2)) * decay                         # (B,H,n,C,C), j <= t
    outs = []
    for i in range(n):
        u = Uv[:, :, i] - Wk[:, :, i] @ S                          # (B,H,C,dv)
        o = (gamma[:, :, i] * q[:, :, i]) @ S + qk[:, :, i] @ u
        outs.append(o)
        glast = gc[:, :, i, -1]                                    # (B,H)
        kd = k[:, :, i] * torch.exp(glast[..., None] - gc[:, :, i])[..., None]
        S = S * torch.exp(glast)[..., None, None] + kd.transpose(-1, -2) @ u
    o = torch.stack(outs, 2)                                       # (B,H,n,C,dv)
    o = o.permute(0, 2, 3, 1, 4).reshape(B, n * chunk, H, -1)[:, :T]
    return o, S


def delta_rule_chunked_train(q, k, v, g, beta, S, chunk=64):
    """delta_rule_chunked for training: same chunks and the same WY algebra, arranged for
    autograd.  q, k: (B,T,nk,dk) key heads NOT yet tiled to the value heads (value head h
    reads key head h % nk); v: (B,T,H,dv); g, beta: (B,T,H); S: (B,H,dk,dv)."""
    B, T, nk, dk = q.shape
    H = v.shape[2]
    rep = H // nk
    q, k, v, g, beta = _pad_to_chunks(chunk, q, k, v, g, beta)
    n = q.shape[1] // chunk
    C = chunk
    # key tensors stay per key head: (B,1,nk,n,C,d); value-head tensors (B,rep,nk,n,C,...)
    rk = lambda t: t.view(B, n, C, nk, -1).permute(0, 3, 1, 2, 4).unsqueeze(1)
    rv = lambda t: t.view(B, n, C, rep, nk, -1).permute(0, 3, 4, 1, 2, 5)
    q, k, v = rk(q), rk(k), rv(v)
    g = rv(g[..., None])[..., 0]                                    # (B,rep,nk,n,C)
    beta = rv(beta[..., None])                                      # (B,rep,nk,n,C,1)
    gc = g.cumsum(-1)
    low_incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp((gc[..., :, None] - gc[..., None, :]).masked_fill(~low_incl, float('-inf')))
    kk = k @ k.transpose(-1, -2)                                    # per key head only
    # unitriangular solve reads only the strict lower triangle: decay already zeroes the upper
    # one and the diagonal is never read, so no mask and no identity are needed
    A = beta * kk * decay
    gamma = torch.exp(gc)[..., None]
    dv = v.shape[-1]
    rhs = torch.cat([beta * v, (beta * gamma) * k.expand(B, rep, nk, n, C, dk)], -1)
    sol = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    flat = lambda t: t.reshape(B, H, *t.shape[3:])                 # (B,H,n,...)
    Uv, Wk = flat(sol[..., :dv]).unbind(2), flat(sol[..., dv:]).unbind(2)
    glast = gc[..., -1:]                                            # (B,rep,nk,n,1)
    kd = flat((k * torch.exp(glast - gc)[..., None]).transpose(-1, -2)).unbind(2)   # (B,H,dk,C)
    eg = flat(torch.exp(glast)[..., None]).unbind(2)                # (B,H,1,1)
    Ss, us = [], []
    for i in range(n):
        Ss.append(S)
        u = Uv[i] - Wk[i] @ S
        us.append(u)
        S = S * eg[i] + kd[i] @ u
    # the chunk outputs need the state entering each chunk only: both products batched after the loop
    Sst = torch.stack(Ss, 2).view(B, rep, nk, n, dk, dv)
    U = torch.stack(us, 2).view(B, rep, nk, n, C, dv)
    qk = (q @ k.transpose(-1, -2)) * decay
    o = (gamma * q) @ Sst + qk @ U                                  # (B,rep,nk,n,C,dv)
    o = o.permute(0, 3, 4, 1, 2, 5).reshape(B, n * C, H, dv)[:, :T]
    return o, S


class DeltaNet(nn.Module):
    def __init__(self, c: TextConfig):
        super().__init__()
        self.c = c
        Dk, Dv = c.ssm_nk * c.ssm_dk, c.ssm_nv * c.ssm_dk
        self.Dk, self.Dv = Dk, Dv
        self.wqkv = nn.Parameter(torch.empty(2 * Dk + Dv, c.hidden))
        self.wgate = nn.Parameter(torch.empty(Dv, c.hidden))
        self.conv = nn.Parameter(torch.empty(2 * Dk + Dv, c.conv_k))
        self.dt_bias = nn.Parameter(torch.empty(c.ssm_nv))
        self.A_log = nn.Parameter(torch.empty(c.ssm_nv))           # stored in GGUF as ssm_a = -exp(A_log)
        self.wbeta = nn.Parameter(torch.empty(c.ssm_nv, c.hidden))
        self.walpha = nn.Parameter(torch.empty(c.ssm_nv, c.hidden))
        self.norm = nn.Parameter(torch.ones(c.ssm_dk))
        self.wout = nn.Parameter(torch.empty(c.hidden, Dv))

    fast_chunk = 0    # > 0: training batches take _forward_train with this chunk (set_fast_training)

    def forward(self, x, cache=None, mode='chunked'):
        if (self.fast_chunk and self.training and cache is None and mode == 'chunked'
                and getattr(self, 'ssm_a_override', None) is None):
            return self._forward_train(x)
        c = self.c
        B, T, _ = x.shape
        qkv = x @ self.wqkv.t()                                    # (B,T,C)
        z = x @ self.wgate.t()
        beta = torch.sigmoid(x @ self.wbeta.t())                   # (B,T,nv)
        # a model loaded from GGUF carries ssm_a = -exp(A_log) exactly as stored
        ssm_a = getattr(self, 'ssm_a_override', None)
        ssm_a = -torch.exp(self.A_log) if ssm_a is None else ssm_a.to(x.dtype)
        g = F.softplus(x @ self.walpha.t() + self.dt_bias) * ssm_a
        K = c.conv_k
        if cache is not None and 'conv' in cache:
            prev = cache['conv']
        else:
            prev = qkv.new_zeros(B, K - 1, qkv.shape[-1])
        xin = torch.cat([prev, qkv], 1)                            # (B, K-1+T, C)
        if cache is not None:
            cache['conv'] = xin[:, -(K - 1):]
        # depthwise causal conv: out[t] = sum_j w[:, j] * xin[t + j]
        y = F.conv1d(xin.transpose(1, 2), self.conv[:, None, :], groups=xin.shape[-1]).transpose(1, 2)
        y = F.silu(y)
        q = y[..., :self.Dk].reshape(B, T, c.ssm_nk, c.ssm_dk)
        k = y[..., self.Dk:2 * self.Dk].reshape(B, T, c.ssm_nk, c.ssm_dk)
        v = y[..., 2 * self.Dk:].reshape(B, T, c.ssm_nv, c.ssm_dk)
        q = l2_norm(q, c.eps)
        k = l2_norm(k, c.eps)
        rep = c.ssm_nv // c.ssm_nk
        # ggml_repeat tiles the key heads: value head h reads key head h % nk
        q = q.repeat(1, 1, rep, 1)
        k = k.repeat(1, 1, rep, 1)
        q = q / math.sqrt(c.ssm_dk)
        if cache is not None and 'ssm' in cache:
            S = cache['ssm']
        else:
            S = x.new_zeros(B, c.ssm_nv, c.ssm_dk, c.ssm_dk)
        with torch.autocast('cpu', enabled=False):
            q, k, v, g, beta, S = (_f32(t) for t in (q, k, v, g, beta, S))
            if mode == 'recurrent':
                o, S = delta_rule_recurrent(q, k, v, g, beta, S)
            else:
                o, S = delta_rule_chunked(q, k, v, g, beta, S)
        if cache is not None:
            cache['ssm'] = S
        o = rms_norm(o, self.norm, c.eps) * F.silu(z.view(B, T, c.ssm_nv, c.ssm_dk))
        return o.reshape(B, T, -1) @ self.wout.t()

    def _forward_train(self, x):
        """forward() of a training batch (no cache, chunked): the same computation with the four
        input projections as one product and delta_rule_chunked_train (key heads not tiled)."""
        c = self.c
        B, T, _ = x.shape
        Dk, Dv, nv = self.Dk, self.Dv, c.ssm_nv
        # the four input projections as one product
        p = x @ torch.cat([self.wqkv, self.wgate, self.wbeta, self.walpha], 0).t()
        qkv, z, bl, al = p.split([2 * Dk + Dv, Dv, nv, nv], -1)
        beta = torch.sigmoid(bl)
        g = F.softplus(al + self.dt_bias) * -torch.exp(self.A_log)
        K = c.conv_k
        xin = F.pad(qkv, [0, 0, K - 1, 0])
        y = F.conv1d(xin.transpose(1, 2), self.conv[:, None, :], groups=xin.shape[-1]).transpose(1, 2)
        y = F.silu(y)
        q = l2_norm(y[..., :Dk].reshape(B, T, c.ssm_nk, c.ssm_dk), c.eps) / math.sqrt(c.ssm_dk)
        k = l2_norm(y[..., Dk:2 * Dk].reshape(B, T, c.ssm_nk, c.ssm_dk), c.eps)
        v = y[..., 2 * Dk:].reshape(B, T, nv, c.ssm_dk)
        S = x.new_zeros(B, nv, c.ssm_dk, c.ssm_dk)
        with torch.autocast('cpu', enabled=False):
            q, k, v, g, beta, S = (_f32(t) for t in (q, k, v, g, beta, S))
            o, S = delta_rule_chunked_train(q, k, v, g, beta, S, self.fast_chunk)
        o = rms_norm(o, self.norm, c.eps) * F.silu(z.reshape(B, T, nv, c.ssm_dk))
        return o.reshape(B, T, -1) @ self.wout.t()


def _grouped_mm_backward(g, x, W, counts):
    """Backward of y[rows of e] = x[rows of e] @ W[e].T for consecutive row groups of sizes
    counts: (dW, dx) with dW[e] = g[rows]^T x[rows] and dx[rows] = g[rows] W[e]; experts with no
    rows get zero gradients (every other block is written by its product)."""
    dW = torch.empty_like(W)
    dx = x.new_empty(x.shape)
    row = 0
    for e, n in enumerate(counts):
        if n:
            torch.mm(g[row:row + n].t(), x[row:row + n], out=dW[e])
            torch.mm(g[row:row + n], W[e], out=dx[row:row + n])
        else:
            dW[e].zero_()
        row += n
    return dW, dx


class _RoutedExperts(torch.autograd.Function):
    """The routed experts of one MoE layer with a hand-written backward: per expert two
    products forward (gate and up as one) and four backward; everything else runs on all
    slots at once.  The routing weight scales the (M,F) hidden rows before the down
    product (the same sum as scaling its (M,H) output), so no (M,H) temporary besides the
    output is made or kept.  xs: (M,H) token rows gathered in expert order; w: (M,) routing
    weight of each slot; counts: slots per expert.  Returns the weighted outputs (M,H)."""

    @staticmethod
    def forward(ctx, xs, w, gate, up, down, counts):
        E, Fe, H = gate.shape
        Wgu = torch.cat([gate, up], 1)                              # (E, 2F, H)
        M = xs.shape[0]
        gu = xs.new_empty(M, 2 * Fe)
        row = 0
        for e, n in enumerate(counts):
            if n:
                torch.mm(xs[row:row + n], Wgu[e].t(), out=gu[row:row + n])
            row += n
        hw = F.silu(gu[:, :Fe]) * gu[:, Fe:] * w[:, None]
        y = xs.new_empty(M, H)
        row = 0
        for e, n in enumerate(counts):
            if n:
                torch.mm(hw[row:row + n], down[e].t(), out=y[row:row + n])
            row += n
        ctx.save_for_backward(xs, w, Wgu, down, gu)
        ctx.counts = counts
        return y

    @staticmethod
    def backward(ctx, dy):
        xs, w, Wgu, down, gu = ctx.saved_tensors
        counts = ctx.counts
        E, H, Fe = down.shape
        g, u = gu[:, :Fe], gu[:, Fe:]
        sg = torch.sigmoid(g)
        a = g * sg                                                  # silu(g)
        h = a * u
        hw = h * w[:, None]
        ddown, dhw = _grouped_mm_backward(dy.contiguous(), hw, down, counts)
        dw = (dhw * h).sum(-1)
        dh = dhw * w[:, None]
        dgu = torch.cat([dh * u * (sg * (1 + g * (1 - sg))), dh * a], 1)
        dWgu, dxs = _grouped_mm_backward(dgu, xs, Wgu, counts)
        return dxs, dw, dWgu[:, :Fe], dWgu[:, Fe:], ddown, None


class MoE(nn.Module):
    fast_train = False   # True: training batches take _forward_train (set_fast_training)

    def __init__(self, c: TextConfig):
        super().__init__()
        self.c = c
        E, H, Fe = c.n_expert, c.hidden, c.expert_ff
        self.router = nn.Parameter(torch.empty(E, H))
        self.gate_exps = nn.Parameter(torch.empty(E, Fe, H))
        self.up_exps = nn.Parameter(torch.empty(E, Fe, H))
        self.down_exps = nn.Parameter(torch.empty(E, H, Fe))
        self.gate_inp_shexp = nn.Parameter(torch.empty(H))
        self.gate_shexp = nn.Parameter(torch.empty(c.shared_ff, H))
        self.up_shexp = nn.Parameter(torch.empty(c.shared_ff, H))
        self.down_shexp = nn.Parameter(torch.empty(H, c.shared_ff))

    def forward(self, x, stats=None, mask=None):
        c = self.c
        shp = x.shape
        xf = x.reshape(-1, shp[-1])
        logits = xf @ self.router.t()
        probs = (logits if logits.dtype == torch.float64 else logits.float()).softmax(-1)
        topv, topi = probs.topk(c.n_expert_used, dim=-1)
        w = (topv / topv.sum(-1, keepdim=True)).to(x.dtype)
        if stats is not None:
            stats['probs'] = probs
            stats['topi'] = topi
        if self.fast_train and self.training:
            return self._forward_train(xf, topi, w, mask).view(shp)
        if mask is None:
            out = self._experts_loop(xf, topi, w)
        else:
            # padding rows (training batches, after the last real token) skip the routed experts:
            # they all route alike and pile onto a few experts (MoE forward of a 24-sample pool:
            # 2.5 s -> 2.0-2.3 s). A padded (expert, capacity) bmm form was tried and was 5x slower:
            # the busiest expert gets 4-6x the mean number of slots, so padding to capacity costs
            # more than the loop
            idx = mask.reshape(-1).nonzero().squeeze(1)
            out = xf.new_zeros(xf.shape).index_copy(0, idx, self._experts_loop(xf[idx], topi[idx], w[idx]))
        sh = (F.silu(xf @ self.gate_shexp.t()) * (xf @ self.up_shexp.t())) @ self.down_shexp.t()
        out = out + sh * torch.sigmoid(xf @ self.gate_inp_shexp)[:, None]
        return out.view(shp)

    def _forward_train(self, xf, topi, w, mask):
        """forward() of a training batch: the experts of every routed slot run through
        _RoutedExperts, and both the routed and the shared experts skip padding rows (their
        outputs are zero here, garbage in forward(); padding only trails the real tokens, so
        no real token, the loss or a gradient ever sees them)."""
        c = self.c
        N, H = xf.shape
        idx = None
        xr = xf
        if mask is not None:
            idx = mask.reshape(-1).nonzero().squeeze(1)
            xr, topi, w = xf[idx], topi[idx], w[idx]
        n = xr.shape[0]
        fe = topi.reshape(-1)
        order = torch.argsort(fe, stable=True)
        tok = torch.arange(n, device=xf.device).repeat_interleave(c.n_expert_used)[order]
        counts = torch.bincount(fe, minlength=c.n_expert).tolist()
        # index_select rather than xr[tok]: its backward is one index_add, not an accumulating index_put
        ys = _RoutedExperts.apply(xr.index_select(0, tok), w.reshape(-1)[order], self.gate_exps, self.up_exps,
                                  self.down_exps, counts)
        out = xr.new_zeros(n, H).index_add(0, tok, ys.to(xr.dtype))
        # the shared expert's gate, up and gate_inp as one product
        sf = c.shared_ff
        p = xr @ torch.cat([self.gate_shexp, self.up_shexp, self.gate_inp_shexp[None]], 0).t()
        sh = (F.silu(p[:, :sf]) * p[:, sf:2 * sf]) @ self.down_shexp.t()
        out = out + sh * torch.sigmoid(p[:, 2 * sf:])
        if idx is None:
            return out
        return xf.new_zeros(N, H).index_copy(0, idx, out)

    def _experts_loop(self, xf, topi, w):
        c = self.c
        N = xf.shape[0]
        # group the slots by expert and run each expert on its own tokens only
        k = c.n_expert_used
        fe = topi.reshape(-1)
        order = torch.argsort(fe, stable=True)
        tok = torch.arange(N, device=xf.device).repeat_interleave(k)[order]
        counts = torch.bincount(fe, minlength=c.n_expert).tolist()
        xs_all = xf[tok]
        ys = []
        # unbind once: indexing the stacked weights per expert would make autograd
        # materialise a full-size gradient for every expert
        Wg, Wu, Wd = self.gate_exps.unbind(0), self.up_exps.unbind(0), self.down_exps.unbind(0)
        for e, xs in enumerate(xs_all.split(counts)):
            if xs.shape[0] == 0:
                continue
            h = F.silu(xs @ Wg[e].t()) * (xs @ Wu[e].t())
            ys.append(h @ Wd[e].t())
        ys = torch.cat(ys, 0) * w.reshape(-1)[order][:, None]
        return xf.new_zeros(N, xf.shape[1]).index_add(0, tok, ys.to(xf.dtype))


class Block(nn.Module):
    def __init__(self, c: TextConfig, il):
        super().__init__()
        self.recurrent = c.is_recurrent(il)
        self.attn_norm = nn.Parameter(torch.ones(c.hidden))
        self.post_norm = nn.Parameter(torch.ones(c.hidden))
        self.mix = DeltaNet(c) if self.recurrent else Attention(c)
        self.moe = MoE(c)
        self.eps = c.eps

    def forward(self, x, ang, cache=None, mode='chunked', stats=None, mask=None):
        h = rms_norm(x, self.attn_norm, self.eps)
        if self.recurrent:
            h = self.mix(h, cache, mode)
        else:
            h = self.mix(h, ang, cache)
        x = x + h
        return x + self.moe(rms_norm(x, self.post_norm, self.eps), stats, mask)


class TextModel(nn.Module):
    def __init__(self, c: TextConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Parameter(torch.empty(c.vocab, c.hidden))
        self.blocks = nn.ModuleList([Block(c, i) for i in range(c.n_layer)])
        self.out_norm = nn.Parameter(torch.ones(c.hidden))
        self.output = nn.Parameter(torch.empty(c.vocab, c.hidden))
        self.reset_parameters()

    def reset_parameters(self, seed=None):
        gen = torch.Generator().manual_seed(seed if seed is not None else 1234)
        c = self.c
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith('norm') or name.endswith('_norm'):
                    p.fill_(1.0)
                elif name.endswith('dt_bias'):
                    # softplus(dt_bias) spread in [1e-3, 1e-1] as in Mamba-2 inits
                    dt = torch.exp(torch.rand(p.shape, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
                    p.copy_(dt + torch.log(-torch.expm1(-dt)))
                elif name.endswith('A_log'):
                    p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 15 + 1))
                elif name.endswith('conv'):
                    p.normal_(0, 1 / math.sqrt(c.conv_k), generator=gen)
                elif name.endswith('gate_inp_shexp'):
                    p.zero_()
                elif name == 'embed':
                    p.normal_(0, 1.0, generator=gen)
                else:
                    fan_in = p.shape[-1]
                    std = 1 / math.sqrt(fan_in)
                    if name.endswith(('wo', 'wout', 'down_exps', 'down_shexp')):
                        std /= math.sqrt(2 * c.n_layer)
                    p.normal_(0, std, generator=gen)

    def forward(self, emb, pos4, caches=None, mode='chunked', stats=None, hidden_out=None, mask=None):
        """emb: (B,T,H) input embeddings; pos4: (B,T,4). Returns final-normed hidden (B,T,H).
        mask (B,T) bool, training only: False marks trailing padding, whose outputs are garbage."""
        ang = imrope_angles(pos4, self.c)
        x = emb
        for il, b in enumerate(self.blocks):
            if hidden_out is not None:
                hidden_out.append(x)
            st = {} if stats is not None else None
            x = b(x, ang, None if caches is None else caches[il], mode, st, mask)
            if stats is not None:
                stats.append(st)
        if hidden_out is not None:
            hidden_out.append(x)
        return rms_norm(x, self.out_norm, self.c.eps)

    def logits(self, h):
        return h @ self.output.t()

    def new_caches(self):
        return [dict() for _ in range(self.c.n_layer)]


# ---------------------------------------------------------------- vision

def gelu_tanh(x):
    return F.gelu(x, approximate='tanh')


class VitLayer(nn.Module):
    def __init__(self, v: VisionConfig):
        super().__init__()
        w = v.width
        self.ln1 = nn.LayerNorm(w, eps=v.eps)
        self.q = nn.Linear(w, w)
        self.k = nn.Linear(w, w)
        self.v = nn.Linear(w, w)
        self.o = nn.Linear(w, w)
        self.ln2 = nn.LayerNorm(w, eps=v.eps)
        self.up = nn.Linear(w, v.ff)
        self.down = nn.Linear(v.ff, w)
        self.nh = v.n_head

    fast_train = False   # True: training batches take _sdpa_train (set_fast_training)

    def forward(self, x):
        B, N, W = x.shape
        h = self.ln1(x)
        sp = lambda t: t.view(B, N, self.nh, -1).transpose(1, 2)
        attn = _sdpa_train if self.fast_train and self.training else _sdpa
        a = attn(sp(self.q(h)), sp(self.k(h)), sp(self.v(h)))
        x = x + self.o(a.transpose(1, 2).reshape(B, N, W))
        return x + self.down(gelu_tanh(self.up(self.ln2(x))))


def _sdpa(q, k, v, mask=None):
    att = _f32(q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        att = att + mask
    return att.softmax(-1).to(v.dtype) @ v


def _sdpa_train(q, k, v):
    """_sdpa without a mask for training: the 1/sqrt(d) scale goes on q, (N, d) instead of the
    (N, N) scores, forward and backward; for d = 64 (a power of 4) the scale is a power of two
    and the scores are bit-identical."""
    att = _f32((q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2))
    return att.softmax(-1).to(v.dtype) @ v


def gather_2x2(x, gh, gw):
    """x: (B, gh*gw, W) row-major grid -> 4 tensors (B, gh/2*gw/2, W) in order (0,0),(0,1),(1,0),(1,1)."""
    B, N, W = x.shape
    g = x.view(B, gh // 2, 2, gw // 2, 2, W)
    return [g[:, :, r, :, c_].reshape(B, -1, W) for r in (0, 1) for c_ in (0, 1)]


class VitMerger(nn.Module):
    """Window attention over 2x2 windows, then 2x2 downsample MLP (+ mean residual)."""

    def __init__(self, v: VisionConfig):
        super().__init__()
        w = v.width
        self.ln1 = nn.LayerNorm(w, eps=v.eps)
        self.q = nn.Linear(w, w)
        self.k = nn.Linear(w, w)
        self.v = nn.Linear(w, w)
        self.o = nn.Linear(w, w)
        self.ds_ln = nn.LayerNorm(4 * w, eps=v.eps)
        self.ds_up = nn.Linear(4 * w, v.merger_ff)
        self.ds_down = nn.Linear(v.merger_ff, w)
        self.nh = v.n_head

    def forward(self, x, gh, gw):
        B, N, W = x.shape
        h = self.ln1(x)
        # window-major: each 2x2 window becomes a group of 4 tokens attending only to itself
        win = torch.stack(gather_2x2(h, gh, gw), 2)                # (B, nwin, 4, W)
        nwin = win.shape[1]
        sp = lambda t: t.view(B, nwin, 4, self.nh, -1).transpose(2, 3)   # (B,nwin,nh,4,hd)
        a = _sdpa(sp(self.q(win)), sp(self.k(win)), sp(self.v(win)))
        a = self.o(a.transpose(2, 3).reshape(B, nwin, 4, W))
        # back to row-major grid order
        a = a.view(B, gh // 2, gw // 2, 2, 2, W).permute(0, 1, 3, 2, 4, 5).reshape(B, N, W)
        x = x + a
        p = gather_2x2(x, gh, gw)
        mean = (p[0] + p[1] + p[2] + p[3]) * 0.25
        cat = torch.cat(p, -1)
        return mean + self.ds_down(gelu_tanh(self.ds_up(self.ds_ln(cat))))


class VisionModel(nn.Module):
    def __init__(self, v: VisionConfig, text_hidden: int):
        super().__init__()
        self.v = v
        self.patch = nn.Conv2d(3, v.width, v.patch, v.patch)
        self.pos = nn.Parameter(torch.randn(v.pos_buckets * v.pos_buckets, v.width) * 0.02)
        self.layers = nn.ModuleList([VitLayer(v) for _ in range(v.n_layer)])
        self.merger = VitMerger(v)                                 # used in 16x mode only
        self.post_ln = nn.LayerNorm(v.width, eps=v.eps)
        self.mm_norm = nn.LayerNorm(4 * v.width, eps=v.eps)
        self.mm_up = nn.Linear(4 * v.width, v.proj_ff)
        self.mm_down = nn.Linear(v.proj_ff, text_hidden)

    def pos_ids(self, gh, gw):
        nb = self.v.pos_buckets
        bh = torch.floor(nb * torch.arange(gh) / gh).long()
        bw = torch.floor(nb * torch.arange(gw) / gw).long()
        return (bh[:, None] * nb + bw[None, :]).reshape(-1)

    def patch_rows(self, px, bf16=False):
        """The tower's rows before any merging, one per 14-px patch (4x mode: every layer at
        patch level, then post_ln): what train.py's dense glyph head reads.
        bf16: the matmuls under CPU bf16 autocast, the rows returned as float32 (session 26:
        the same glyph recall per training crop at ~1.4x the crops a second)."""
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
            x = self.patch(px)
            B, W, gh, gw = x.shape
            x = x.flatten(2).transpose(1, 2) + self.pos[self.pos_ids(gh, gw).to(px.device)]
            for L in self.layers:
                x = L(x)
            return self.post_ln(x).float()

    def forward(self, px, merge=None, tap=None):
        """px: (B, 3, h, w) normalized, sides multiples of patch*merge -> (B, n_out, text_hidden), (nx, ny).
        merge 4: 16x compression (vit_merger after insert_layer, then the final 2x2 merger);
        merge 2: 4x (final merger only).
        tap: called as tap(stage, rows, gh, gw) after the embedding ('embed'), each ViT layer
        (its index) and the merger ('merger'), the rows' grid gh x gw (layer_probe.py)."""
        merge = merge or self.v.merge
        tap = tap or (lambda *_: None)
        x = self.patch(px)                                         # (B, W, gh, gw)
        B, W, gh, gw = x.shape
        x = x.flatten(2).transpose(1, 2)
        x = x + self.pos[self.pos_ids(gh, gw).to(x.device)]
        tap('embed', x, gh, gw)
        for i, L in enumerate(self.layers):
            x = L(x)
            tap(i, x, gh, gw)
            if merge == 4 and i == self.v.insert_layer:
                x = self.merger(x, gh, gw)
                gh, gw = gh // 2, gw // 2
                tap('merger', x, gh, gw)
        x = self.post_ln(x)
        p = gather_2x2(x, gh, gw)
        x = self.mm_down(F.gelu(self.mm_up(self.mm_norm(torch.cat(p, -1)))))
        return x, (gw // 2, gh // 2)


# ---------------------------------------------------------------- slicing (llama.cpp llava-uhd / minicpmv)

def _ensure_divide(length, m):
    # std::round: halves away from zero (Python's round() would go to even)
    return max(int(math.floor(length / m + 0.5)) * m, m)


def _best_resize(w, h, scale, m, allow_upscale):
    # float32 arithmetic as in mtmd-image.cpp, so boundary cases pick the same size
    if w * h > scale * scale or allow_upscale:
        r = np.float32(w) / np.float32(h)
        h = int(np.float32(scale) / np.sqrt(r))
        w = int(np.float32(h) * r)
    return _ensure_divide(w, m), _ensure_divide(h, m)


def _best_grid(max_slices, multiple, log_ratio):
    cands = []
    for i in (multiple - 1, multiple, multiple + 1):
        if i == 1 or i > max_slices:
            continue
        for m in range(1, i + 1):
            if i % m == 0:
                cands.append((m, i // m))
    best, err = (1, 1), float('inf')
    for gw, gh in cands:
        e = abs(log_ratio - math.log(gw / gh))
        if e < err:
            best, err = (gw, gh), e
    return best


def slice_plan(w, h, v: VisionConfig, merge=None):
    """Returns (overview (w,h), grid (cols,rows) or None, refined (w,h) or None), as
    mtmd_image_preprocessor_minicpmv / llava_uhd compute them."""
    merge = merge or v.merge
    m = v.patch * merge
    S = v.image_size
    if merge == 2 and w * h <= S * S:
        return _best_resize(w, h, S, m, True), None, None
    if not (w > S or h > S):
        return (S, S), None, None
    ov = _best_resize(w, h, S, m, False)
    log_ratio = float(np.log(np.float32(w) / np.float32(h)))
    ratio = np.float32(w) * np.float32(h) / np.float32(S * S)
    multiple = int(min(math.ceil(ratio), v.max_slices))
    gw, gh = _best_grid(v.max_slices, multiple, log_ratio)
    rw, rh = _ensure_divide(w, gw), _ensure_divide(h, gh)
    bw, bh = _best_resize(rw // gw, rh // gh, S, m, True)
    return ov, (gw, gh), (bw * gw, bh * gh)


def scaled_size(w, h, scale):
    """The size slice_plan plans for under --upscale: each side times scale, rounded to nearest."""
    return (w, h) if scale == 1.0 else (max(1, int(w * scale + 0.5)), max(1, int(h * scale + 0.5)))


def image_to_crops(img, v: VisionConfig, merge=None, scale=1.0):
    """PIL image -> list of normalized tensors (3,h,w): overview first, then slices row-major; and grid.
    scale: plan the slices as for the picture scaled by it (mcv-run --upscale), so small print gets
    more tiles and fewer glyphs a token; each crop is still one resize of the original picture."""
    from PIL import Image
    import numpy as np
    img = img.convert('RGB')
    ov, grid, refined = slice_plan(*scaled_size(img.width, img.height, scale), v, merge)
    mean = torch.tensor(v.mean)[:, None, None]
    std = torch.tensor(v.std)[:, None, None]

    def norm(im):
        a = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return (a - mean) / std

    crops = [norm(img.resize(ov, Image.BICUBIC))]
    if grid is not None:
        big = img.resize(refined, Image.BICUBIC)
        cw, ch = refined[0] // grid[0], refined[1] // grid[1]
        for r in range(grid[1]):
            for c_ in range(grid[0]):
                crops.append(norm(big.crop((c_ * cw, r * ch, (c_ + 1) * cw, (r + 1) * ch))))
    return crops, grid


# ---------------------------------------------------------------- the whole model

def config_from_dict(cls, d):
    """TextConfig or VisionConfig from a checkpoint's config dict (lists back to tuples)."""
    return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})


def tower_from_dict(d):
    """The vision tower alone, in its own shape, from a checkpoint dict ({'config', 'model'}, as
    compact.load gives; a tower-only file will do): a teacher or a probe needs no language model."""
    v = VisionModel(config_from_dict(VisionConfig, d['config']['vision']), d['config']['text']['hidden'])
    v.load_state_dict({k[len('vision.'):]: t for k, t in d['model'].items() if k.startswith('vision.')})
    return v


class MiniCPMV(nn.Module):
    def __init__(self, tc: TextConfig, vc: VisionConfig):
        super().__init__()
        self.tc, self.vc = tc, vc
        self.text = TextModel(tc)
        self.vision = VisionModel(vc, tc.hidden)

    def config_dict(self):
        return {'text': asdict(self.tc), 'vision': asdict(self.vc)}

    @staticmethod
    def from_config(d):
        return MiniCPMV(config_from_dict(TextConfig, d['text']), config_from_dict(VisionConfig, d['vision']))


def set_fast_training(model, on=True, chunk=32):
    """Training-only fast paths (DeltaNet._forward_train, MoE._forward_train, _sdpa_train in
    the ViT layers); they are taken only in train() mode without caches, so eval() and
    inference keep the reference forward.
    chunk: the DeltaNet chunk of the fast path (the reference uses 64; the algebra is exact
    for any chunk, 32 is faster on CPU because the per-chunk work grows with the chunk)."""
    for mod in model.modules():
        if isinstance(mod, DeltaNet):
            mod.fast_chunk = chunk if on else 0
        elif isinstance(mod, (MoE, VitLayer)):
            mod.fast_train = bool(on)
    return model


def aux_load_balance(stats, n_expert, k, mask=None):
    """Switch-style loss E * sum_e f_e * P_e, averaged over layers (1.0 when balanced)."""
    tot = 0.0
    for st in stats:
        p, ti = st['probs'], st['topi']
        if mask is not None:
            p, ti = p[mask], ti[mask]
        f = torch.bincount(ti.reshape(-1), minlength=n_expert).float() / max(1, ti.numel())
        tot = tot + n_expert * (f * p.mean(0)).sum()
    return tot / len(stats)


def aux_load_floor(stats, n_expert, frac=0.5, mask=None):
    """Sum over experts of how far (in log) an expert's mean router probability lies below
    frac / n_expert, averaged over layers (0 when none does).  The Switch loss pushes an expert
    up only through the softmax (its gradient on P_e is f_e, ~0 for a starved expert); this one
    pulls a starved expert's probability up by 1/P_e, so it is chosen again (session 14: six of
    layer 1's 64 experts below 0.2% of the slots after scene-only stages)."""
    tot = 0.0
    for st in stats:
        p = st['probs'] if mask is None else st['probs'][mask]
        tot = tot + F.relu(math.log(frac / n_expert) - p.mean(0).clamp_min(1e-12).log()).sum()
    return tot / len(stats)


def _selftest():
    """Chunked and recurrent forms agree; decode with caches equals the full pass."""
    torch.manual_seed(0)
    tc = TextConfig(vocab=300, n_layer=4)
    m = TextModel(tc).double()
    B, T = 2, 70
    ids = torch.randint(0, tc.vocab, (B, T))
    emb = m.embed[ids]
    pos = text_positions(T)[None].expand(B, T, 4)
    with torch.no_grad():
        h1 = m(emb, pos, mode='chunked')
        h2 = m(emb, pos, mode='recurrent')
        caches = m.new_caches()
        steps = [m(emb[:, :33], pos[:, :33], caches, 'chunked')]
        for t in range(33, T):
            steps.append(m(emb[:, t:t + 1], pos[:, t:t + 1], caches, 'recurrent'))
        h3 = torch.cat(steps, 1)
    e12 = (h1 - h2).abs().max().item()
    e13 = (h1 - h3).abs().max().item()
    print(f'chunked vs recurrent {e12:.3g}, prefill+decode vs full {e13:.3g}')
    assert e12 < 1e-9 and e13 < 1e-9
    # a padding mask changes nothing on the real tokens (padding only trails them)
    m.train()
    n_real = torch.tensor([T, 41])
    msk = torch.arange(T)[None] < n_real[:, None]
    ha = m(emb, pos, mask=msk)
    hb = m(emb[1:, :41], pos[1:, :41])
    e_mask = max((ha[0] - m(emb[:1], pos[:1])[0]).abs().max().item(), (ha[1, :41] - hb[0]).abs().max().item())
    print(f'padding mask vs unpadded {e_mask:.3g}')
    assert e_mask < 1e-9
    vc = VisionConfig()
    vm = VisionModel(vc, tc.hidden)
    out, (nx, ny) = vm(torch.randn(1, 3, 224, 336))
    assert out.shape == (1, nx * ny, tc.hidden) and (nx, ny) == (6, 4), (out.shape, nx, ny)
    print('ok')


if __name__ == '__main__':
    _selftest()

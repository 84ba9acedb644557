#!/usr/bin/python3
"""Checkpoint <-> GGUF for the proving model.

    export.py [--ckpt C.pt | --random] [--out-dir examples/models] [--name proving]
              [--type q8_0|f16|f32] [--expert-type q8_0|q4_0|...] [--merge 4|2]
        writes NAME-text.gguf (llama.cpp `qwen35moe`) and NAME-mmproj.gguf
        (llama.cpp mtmd `clip`, projector `minicpmv4_6`).

load(text_gguf, mmproj_gguf=None) builds the reference model from GGUF files
(any block type gguf.py reads, dequantized to float32), so parity tests run
the reference on exactly the weights the C code and llama.cpp see.
"""
import argparse
import glob
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import compact   # noqa: E402
import gguf as G   # noqa: E402
from model import MiniCPMV, TextConfig, VisionConfig   # noqa: E402

ARCH = 'qwen35moe'
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking %}{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
TYPES = {'f32': G.F32, 'f16': G.F16, 'bf16': G.BF16, 'q8_0': G.Q8_0, 'q4_0': G.Q4_0}


def _np(t):
    return t.detach().float().cpu().numpy()


def text_tensors(m):
    """(gguf name, torch parameter, kind) for the text model; kind 'mat', 'exp' or 'small'."""
    t = m.text
    out = [('token_embd.weight', t.embed, 'mat'), ('output_norm.weight', t.out_norm, 'small'),
           ('output.weight', t.output, 'mat')]
    for il, b in enumerate(t.blocks):
        p = f'blk.{il}.'
        out += [(p + 'attn_norm.weight', b.attn_norm, 'small'), (p + 'post_attention_norm.weight', b.post_norm, 'small')]
        x = b.mix
        if b.recurrent:
            out += [(p + 'attn_qkv.weight', x.wqkv, 'mat'), (p + 'attn_gate.weight', x.wgate, 'mat'),
                    (p + 'ssm_conv1d.weight', x.conv, 'small'), (p + 'ssm_dt.bias', x.dt_bias, 'small'),
                    (p + 'ssm_a', x.A_log, 'ssm_a'), (p + 'ssm_beta.weight', x.wbeta, 'mat'),
                    (p + 'ssm_alpha.weight', x.walpha, 'mat'), (p + 'ssm_norm.weight', x.norm, 'small'),
                    (p + 'ssm_out.weight', x.wout, 'mat')]
        else:
            out += [(p + 'attn_q.weight', x.wq, 'mat'), (p + 'attn_k.weight', x.wk, 'mat'),
                    (p + 'attn_v.weight', x.wv, 'mat'), (p + 'attn_output.weight', x.wo, 'mat'),
                    (p + 'attn_q_norm.weight', x.q_norm, 'small'), (p + 'attn_k_norm.weight', x.k_norm, 'small')]
        e = b.moe
        out += [(p + 'ffn_gate_inp.weight', e.router, 'small'),   # router kept F32: routing must not move
                (p + 'ffn_gate_exps.weight', e.gate_exps, 'exp'), (p + 'ffn_up_exps.weight', e.up_exps, 'exp'),
                (p + 'ffn_down_exps.weight', e.down_exps, 'exp'),
                (p + 'ffn_gate_inp_shexp.weight', e.gate_inp_shexp, 'small'),
                (p + 'ffn_gate_shexp.weight', e.gate_shexp, 'mat'), (p + 'ffn_up_shexp.weight', e.up_shexp, 'mat'),
                (p + 'ffn_down_shexp.weight', e.down_shexp, 'mat')]
    return out


def vision_tensors(m):
    v = m.vision
    out = [('v.patch_embd.weight', v.patch.weight, 'small'), ('v.patch_embd.bias', v.patch.bias, 'small'),
           ('v.position_embd.weight', v.pos, 'f16')]

    def lin(name, mod, kind='mat'):
        return [(name + '.weight', mod.weight, kind), (name + '.bias', mod.bias, 'small')]

    def ln(name, mod):
        return [(name + '.weight', mod.weight, 'small'), (name + '.bias', mod.bias, 'small')]

    for il, L in enumerate(v.layers):
        p = f'v.blk.{il}.'
        out += ln(p + 'ln1', L.ln1) + lin(p + 'attn_q', L.q) + lin(p + 'attn_k', L.k) + lin(p + 'attn_v', L.v)
        out += lin(p + 'attn_out', L.o) + ln(p + 'ln2', L.ln2) + lin(p + 'ffn_up', L.up) + lin(p + 'ffn_down', L.down)
    out += ln('v.post_ln', v.post_ln)
    g = v.merger
    out += ln('v.vit_merger.ln1', g.ln1) + lin('v.vit_merger.attn_q', g.q) + lin('v.vit_merger.attn_k', g.k)
    out += lin('v.vit_merger.attn_v', g.v) + lin('v.vit_merger.attn_out', g.o) + ln('v.vit_merger.ds_ln', g.ds_ln)
    out += lin('v.vit_merger.ds_ffn_up', g.ds_up) + lin('v.vit_merger.ds_ffn_down', g.ds_down)
    out += ln('mm.input_norm', v.mm_norm) + lin('mm.up', v.mm_up) + lin('mm.down', v.mm_down)
    return out


def write_text(m, tok, path, mat_type=G.Q8_0, exp_type=G.Q8_0, name='mcv proving model'):
    c = m.tc
    w = G.Writer(path)
    A = ARCH + '.'
    w.kv('general.architecture', G.STR, ARCH)
    w.kv('general.name', G.STR, name)
    w.kv('general.alignment', G.U32, 32)
    for k, typ, v in [
            ('context_length', G.U32, c.ctx), ('embedding_length', G.U32, c.hidden), ('block_count', G.U32, c.n_layer),
            ('attention.head_count', G.U32, c.n_head), ('attention.head_count_kv', G.U32, c.n_kv),
            ('attention.key_length', G.U32, c.head_dim), ('attention.value_length', G.U32, c.head_dim),
            ('attention.layer_norm_rms_epsilon', G.F32V, c.eps), ('rope.dimension_count', G.U32, c.rope_dims),
            ('rope.dimension_sections', (G.ARR, G.I32), list(c.rope_sections)), ('rope.freq_base', G.F32V, c.rope_base),
            ('ssm.conv_kernel', G.U32, c.conv_k), ('ssm.inner_size', G.U32, c.ssm_nv * c.ssm_dk),
            ('ssm.state_size', G.U32, c.ssm_dk), ('ssm.time_step_rank', G.U32, c.ssm_nv),
            ('ssm.group_count', G.U32, c.ssm_nk), ('full_attention_interval', G.U32, c.full_attn_interval),
            ('expert_count', G.U32, c.n_expert), ('expert_used_count', G.U32, c.n_expert_used),
            ('expert_feed_forward_length', G.U32, c.expert_ff),
            ('expert_shared_feed_forward_length', G.U32, c.shared_ff)]:
        w.kv(A + k, typ, v)
    import vocab_gguf
    for k, typ, v in vocab_gguf.tokenizer_kv(tok):
        if isinstance(typ, tuple):
            typ = (G.ARR, typ[1])
        w.kv(k, typ, v)
    w.kv('tokenizer.chat_template', G.STR, CHAT_TEMPLATE)
    for nm, p, kind in text_tensors(m):
        a = _np(p)
        if kind == 'ssm_a':
            a = -np.exp(a)
        t = {'mat': mat_type, 'exp': exp_type}.get(kind, G.F32)
        w.tensor(nm, a, t)
    w.close()


def write_mmproj(m, path, mat_type=G.Q8_0, merge=None, name='mcv proving model vision'):
    v = m.vc
    w = G.Writer(path)
    w.kv('general.architecture', G.STR, 'clip')
    w.kv('general.name', G.STR, name)
    w.kv('clip.has_vision_encoder', G.BOOL, True)
    w.kv('clip.projector_type', G.STR, 'minicpmv4_6')
    w.kv('clip.use_gelu', G.BOOL, True)
    for k, typ, val in [
            ('image_size', G.U32, v.image_size), ('patch_size', G.U32, v.patch), ('embedding_length', G.U32, v.width),
            ('feed_forward_length', G.U32, v.ff), ('block_count', G.U32, v.n_layer),
            ('attention.head_count', G.U32, v.n_head), ('attention.layer_norm_epsilon', G.F32V, v.eps),
            ('projection_dim', G.U32, m.tc.hidden), ('image_mean', (G.ARR, G.F32V), list(v.mean)),
            ('image_std', (G.ARR, G.F32V), list(v.std)), ('projector.scale_factor', G.U32, merge or v.merge),
            ('wa_layer_indexes', (G.ARR, G.I32), [v.insert_layer])]:
        w.kv('clip.vision.' + k, typ, val)
    for nm, p, kind in vision_tensors(m):
        t = {'mat': mat_type, 'f16': G.F16}.get(kind, G.F32)
        w.tensor(nm, _np(p), t)
    w.close()


def text_config_from_gguf(kv, vocab):
    A = kv['general.architecture'] + '.'
    return TextConfig(
        vocab=vocab, hidden=kv[A + 'embedding_length'], n_layer=kv[A + 'block_count'],
        full_attn_interval=kv.get(A + 'full_attention_interval', 4), n_head=kv[A + 'attention.head_count'],
        n_kv=kv[A + 'attention.head_count_kv'], head_dim=kv[A + 'attention.key_length'],
        rope_dims=kv[A + 'rope.dimension_count'], rope_sections=tuple(kv[A + 'rope.dimension_sections']),
        rope_base=kv[A + 'rope.freq_base'], ssm_nk=kv[A + 'ssm.group_count'], ssm_nv=kv[A + 'ssm.time_step_rank'],
        ssm_dk=kv[A + 'ssm.state_size'], conv_k=kv[A + 'ssm.conv_kernel'], n_expert=kv[A + 'expert_count'],
        n_expert_used=kv[A + 'expert_used_count'], expert_ff=kv[A + 'expert_feed_forward_length'],
        shared_ff=kv[A + 'expert_shared_feed_forward_length'], eps=kv[A + 'attention.layer_norm_rms_epsilon'],
        ctx=kv[A + 'context_length'])


def load(text_path, mmproj_path=None, dtype=torch.float32):
    """Reference model with the (dequantized) weights of GGUF files."""
    g = G.read(text_path)
    tc = text_config_from_gguf(g.kv, len(g.kv['tokenizer.ggml.tokens']))
    vc = VisionConfig()
    gv = None
    if mmproj_path:
        gv = G.read(mmproj_path)
        k = gv.kv
        vc = VisionConfig(image_size=k['clip.vision.image_size'], patch=k['clip.vision.patch_size'],
                          width=k['clip.vision.embedding_length'], n_layer=k['clip.vision.block_count'],
                          n_head=k['clip.vision.attention.head_count'], ff=k['clip.vision.feed_forward_length'],
                          eps=k['clip.vision.attention.layer_norm_epsilon'],
                          insert_layer=k.get('clip.vision.wa_layer_indexes', [2])[0],
                          merge=k.get('clip.vision.projector.scale_factor', 4),
                          merger_ff=gv.tensors['v.vit_merger.ds_ffn_up.weight'].shape[0],
                          proj_ff=gv.tensors['mm.up.weight'].shape[0],
                          pos_buckets=int(round(gv.tensors['v.position_embd.weight'].shape[0] ** 0.5)),
                          mean=tuple(k['clip.vision.image_mean']), std=tuple(k['clip.vision.image_std']))
    m = MiniCPMV(tc, vc)
    with torch.no_grad():
        for nm, p, kind in text_tensors(m):
            a = g.tensors[nm]
            if kind == 'ssm_a':
                a = np.log(-a)   # model keeps A_log; exp(log(-ssm_a)) round-trips to float precision
            p.copy_(torch.from_numpy(np.ascontiguousarray(a)).reshape(p.shape))
        if gv is not None:
            for nm, p, kind in vision_tensors(m):
                p.copy_(torch.from_numpy(np.ascontiguousarray(gv.tensors[nm])).reshape(p.shape))
    m.text.ssm_a_exact = {f'blk.{i}': torch.from_numpy(g.tensors[f'blk.{i}.ssm_a'].copy())
                          for i in range(tc.n_layer) if tc.is_recurrent(i)}
    for i, b in enumerate(m.text.blocks):
        if b.recurrent:
            b.mix.ssm_a_override = m.text.ssm_a_exact[f'blk.{i}']
    return m.to(dtype)


def latest(run='/root/mcv-runs/proving'):
    ck = sorted(glob.glob(os.path.join(run, 'ckpt-*.pt')))
    return ck[-1] if ck else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--ckpt', default=None)
    ap.add_argument('--random', action='store_true', help='export a randomly initialised model (tests)')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--out-dir', default=os.path.join(HERE, '..', '..', 'examples', 'models'))
    ap.add_argument('--name', default='proving')
    ap.add_argument('--type', default='q8_0')
    ap.add_argument('--expert-type', default='q8_0')
    ap.add_argument('--vision-type', default='q8_0')
    ap.add_argument('--merge', type=int, default=None, help='4 (16x, default of the checkpoint) or 2 (4x)')
    ap.add_argument('--tokenizer', default=None)
    ap.add_argument('--no-vision', action='store_true')
    ap.add_argument('--rope-base', type=float, default=None,
                    help="with --random: the text model's RoPE base (default TextConfig's, 1e6)")
    a = ap.parse_args()
    import bpe
    tok = bpe.Tokenizer.load(a.tokenizer) if a.tokenizer else bpe.default()
    if a.random:
        torch.manual_seed(a.seed)
        tc = TextConfig(vocab=len(tok.tokens))
        if a.rope_base is not None:
            tc.rope_base = a.rope_base
        m = MiniCPMV(tc, VisionConfig())
        m.text.reset_parameters(a.seed)
    else:
        ck = a.ckpt or latest()
        if not ck:
            sys.exit('export: no checkpoint (give --ckpt or --random)')
        d = compact.load(ck)
        m = MiniCPMV.from_config(d['config'])
        m.load_state_dict(d['model'])
        print(f'export: {ck} step {d["state"]["step"]}', file=sys.stderr)
    os.makedirs(a.out_dir, exist_ok=True)
    tp = os.path.join(a.out_dir, f'{a.name}-text.gguf')
    write_text(m, tok, tp, TYPES[a.type], TYPES[a.expert_type])
    print(f'export: {tp} {os.path.getsize(tp)/1e6:.1f} MB', file=sys.stderr)
    if not a.no_vision:
        vp = os.path.join(a.out_dir, f'{a.name}-mmproj.gguf')
        write_mmproj(m, vp, TYPES[a.vision_type], a.merge)
        print(f'export: {vp} {os.path.getsize(vp)/1e6:.1f} MB', file=sys.stderr)


if __name__ == '__main__':
    main()

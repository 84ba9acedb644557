#!/usr/bin/python3
"""Write a tiny Hugging Face style Qwen3.5(-MoE) checkpoint from a GGUF, for
tests of mcv-quant's HF input.

  mk-hf-checkpoint.py MODEL.gguf OUTDIR [--bf16] [--fused-experts] [--shards N]
                      [--extra NAME] [--dtype-of NAME=DTYPE] [--vision]
  mk-hf-checkpoint.py --compare MODEL.gguf CONVERTED.gguf

It undoes, in numpy, what llama.cpp's convert_hf_to_gguf.py does for
Qwen3.5 (Qwen3NextModel / _LinearAttentionVReorderBase): RMSNorm weights
1 + w -> w, ssm_a = -exp(A_log) -> A_log, value heads tiled -> grouped,
conv1d [C, K] -> [C, 1, K], stacked experts -> one tensor per expert (or the
fused gate_up_proj / down_proj form), and writes config.json,
tokenizer.json and *.safetensors.  MODEL must be F32 (mcv-genmodel --type
f32).  --extra adds a tensor with an unmappable name; --dtype-of stores one
tensor with another dtype string (e.g. an unknown one); --vision adds a few
vision-tower tensors that the text conversion leaves out."""
import json, os, struct, sys
import numpy as np

def read_gguf(path):
    f = open(path, 'rb')
    buf = f.read()
    pos = 0
    def u(fmt):
        nonlocal pos
        v = struct.unpack_from('<' + fmt, buf, pos)
        pos += struct.calcsize('<' + fmt)
        return v[0]
    def s():
        n = u('Q')
        nonlocal pos
        v = buf[pos:pos + n].decode()
        pos += n
        return v
    sizes = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    def val(t):
        if t == 8:
            return s()
        if t == 9:
            et, n = u('I'), u('Q')
            return [val(et) for _ in range(n)]
        return u(sizes[t])
    assert buf[:4] == b'GGUF'
    pos = 4
    u('I')
    nt, nkv = u('Q'), u('Q')
    kv = {}
    for _ in range(nkv):
        k = s()
        kv[k] = val(u('I'))
    infos = []
    for _ in range(nt):
        name = s()
        nd = u('I')
        ne = [u('Q') for _ in range(nd)]
        ty, off = u('I'), u('Q')
        infos.append((name, ne, ty, off))
    align = kv.get('general.alignment', 32)
    data0 = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, ty, off in infos:
        assert ty == 0, f'{name}: type {ty}, need F32 input'
        n = int(np.prod(ne))
        a = np.frombuffer(buf, dtype=np.float32, count=n, offset=data0 + off)
        tensors[name] = a.reshape(list(reversed(ne))).copy()
    return kv, tensors

def grouped_from_tiled(x, axis, nk, per, hd):
    """Inverse of the converter's V-head reorder along axis."""
    shape = list(x.shape)
    new = shape[:axis] + [per, nk, hd] + shape[axis + 1:]
    y = x.reshape(new)
    y = np.swapaxes(y, axis, axis + 1)
    return np.ascontiguousarray(y).reshape(shape)

def bf16_bytes(a):
    u = a.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r.tobytes()

def write_safetensors(path, items, bf16, dtype_of):
    hdr, blobs, off = {}, [], 0
    for name, a in items:
        if bf16 and a.ndim >= 2:
            b, dt = bf16_bytes(a), 'BF16'
        else:
            b, dt = a.astype(np.float32).tobytes(), 'F32'
        dt = dtype_of.get(name, dt)
        hdr[name] = {'dtype': dt, 'shape': list(a.shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hdr['__metadata__'] = {'format': 'pt'}
    h = json.dumps(hdr).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h)
        for b in blobs:
            f.write(b)

def compare(orig, conv):
    """Exit 1 unless CONV holds ORIG's tensors (same names, shapes, values to
    float rounding of log/exp and 1 + w) and its architecture keys."""
    ka, ta = read_gguf(orig)
    kb, tb = read_gguf(conv)
    bad = []
    if set(ta) != set(tb):
        bad.append(f'tensor names differ: {sorted(set(ta) ^ set(tb))[:6]}')
    for n in sorted(set(ta) & set(tb)):
        x, y = ta[n], tb[n]
        if x.shape != y.shape:
            bad.append(f'{n}: shape {y.shape} != {x.shape}')
        elif not np.allclose(x, y, rtol=2e-6, atol=2e-6):
            bad.append(f'{n}: max diff {np.abs(x - y).max()}')
    arch = ka['general.architecture']
    for k, v in ka.items():
        if (k.startswith(arch + '.') or k in ('tokenizer.ggml.tokens', 'tokenizer.ggml.merges',
                'tokenizer.ggml.token_type', 'general.architecture', 'tokenizer.ggml.eos_token_id')):
            w = kb.get(k)
            if isinstance(v, float) or (isinstance(v, list) and v and isinstance(v[0], float)):
                ok = w is not None and np.allclose(v, w, rtol=1e-6)
            else:
                ok = v == w
            if not ok:
                bad.append(f'key {k}: {str(w)[:60]} != {str(v)[:60]}')
    for b in bad:
        print(b)
    sys.exit(1 if bad else 0)

def main():
    a = sys.argv[1:]
    if a and a[0] == '--compare':
        return compare(a[1], a[2])
    opt = lambda k: k in a
    def arg(k, d=None):
        return a[a.index(k) + 1] if k in a else d
    pos = []
    skip = False
    for i, x in enumerate(a):
        if skip:
            skip = False
            continue
        if x in ('--shards', '--extra', '--dtype-of'):
            skip = True
            continue
        if not x.startswith('--'):
            pos.append(x)
    src, out = pos
    kv, T = read_gguf(src)
    arch = kv['general.architecture']
    g = lambda k, d=None: kv.get(f'{arch}.{k}', d)
    L, H = g('block_count'), g('embedding_length')
    nk, nv, dk = g('ssm.group_count'), g('ssm.time_step_rank'), g('ssm.state_size')
    dv = g('ssm.inner_size') // nv
    per = nv // nk
    E = g('expert_count', 0)
    fused = opt('--fused-experts')
    items = []
    def add(name, x):
        items.append((name, np.ascontiguousarray(x, dtype=np.float32)))
    P = 'model.language_model.'
    add(P + 'embed_tokens.weight', T['token_embd.weight'])
    add(P + 'norm.weight', T['output_norm.weight'] - 1)
    if 'output.weight' in T:
        add('lm_head.weight', T['output.weight'])
    for i in range(L):
        b = f'blk.{i}.'
        h = f'{P}layers.{i}.'
        t = lambda n: T[b + n]
        add(h + 'input_layernorm.weight', t('attn_norm.weight') - 1)
        add(h + 'post_attention_layernorm.weight', t('post_attention_norm.weight') - 1)
        if b + 'attn_q.weight' in T:
            for x, y in (('q_proj', 'attn_q'), ('k_proj', 'attn_k'), ('v_proj', 'attn_v'), ('o_proj', 'attn_output')):
                add(h + f'self_attn.{x}.weight', t(y + '.weight'))
            add(h + 'self_attn.q_norm.weight', t('attn_q_norm.weight') - 1)
            add(h + 'self_attn.k_norm.weight', t('attn_k_norm.weight') - 1)
        else:
            qkv = t('attn_qkv.weight')
            qk = 2 * nk * dk
            v = grouped_from_tiled(qkv[qk:], 0, nk, per, dv)
            add(h + 'linear_attn.in_proj_qkv.weight', np.concatenate([qkv[:qk], v], 0))
            add(h + 'linear_attn.in_proj_z.weight', grouped_from_tiled(t('attn_gate.weight'), 0, nk, per, dv))
            add(h + 'linear_attn.in_proj_b.weight', grouped_from_tiled(t('ssm_beta.weight'), 0, nk, per, 1))
            add(h + 'linear_attn.in_proj_a.weight', grouped_from_tiled(t('ssm_alpha.weight'), 0, nk, per, 1))
            conv = t('ssm_conv1d.weight')  # [C, K]
            cv = grouped_from_tiled(conv[qk:], 0, nk, per, dv)
            add(h + 'linear_attn.conv1d.weight', np.concatenate([conv[:qk], cv], 0)[:, None, :])
            add(h + 'linear_attn.A_log', grouped_from_tiled(np.log(-t('ssm_a').astype(np.float64)), 0, nk, per, 1))
            add(h + 'linear_attn.dt_bias', grouped_from_tiled(t('ssm_dt.bias'), 0, nk, per, 1))
            add(h + 'linear_attn.norm.weight', t('ssm_norm.weight'))
            add(h + 'linear_attn.out_proj.weight', grouped_from_tiled(t('ssm_out.weight'), 1, nk, per, dv))
        if E:
            add(h + 'mlp.gate.weight', t('ffn_gate_inp.weight'))
            add(h + 'mlp.shared_expert_gate.weight', t('ffn_gate_inp_shexp.weight').reshape(1, -1))
            for x in ('gate', 'up', 'down'):
                add(h + f'mlp.shared_expert.{x}_proj.weight', t(f'ffn_{x}_shexp.weight'))
            gate, up, down = t('ffn_gate_exps.weight'), t('ffn_up_exps.weight'), t('ffn_down_exps.weight')
            if fused and i % 2 == 0:
                add(h + 'mlp.experts.gate_up_proj', np.concatenate([gate, up], 1))
                add(h + 'mlp.experts.down_proj', down)
            else:
                for e in range(E):
                    add(h + f'mlp.experts.{e}.gate_proj.weight', gate[e])
                    add(h + f'mlp.experts.{e}.up_proj.weight', up[e])
                    add(h + f'mlp.experts.{e}.down_proj.weight', down[e])
        else:
            for x in ('gate', 'up', 'down'):
                add(h + f'mlp.{x}_proj.weight', t(f'ffn_{x}.weight'))
    if opt('--vision'):
        add('model.visual.patch_embed.proj.weight', np.ones((8, 3 * 14 * 14), np.float32))
        add('model.visual.blocks.0.attn.qkv.weight', np.ones((24, 8), np.float32))
    if arg('--extra'):
        add(arg('--extra'), np.ones((4, 4), np.float32))
    dtype_of = {}
    if arg('--dtype-of'):
        k, v = arg('--dtype-of').rsplit('=', 1)
        dtype_of[k] = v
    os.makedirs(out, exist_ok=True)
    n_sh = int(arg('--shards', '1'))
    per_sh = (len(items) + n_sh - 1) // n_sh
    for k in range(n_sh):
        write_safetensors(f'{out}/model-{k + 1:05d}-of-{n_sh:05d}.safetensors',
                          items[k * per_sh:(k + 1) * per_sh], opt('--bf16'), dtype_of)
    text = {
        'model_type': 'qwen3_5_moe_text' if E else 'qwen3_5_text',
        'vocab_size': len(kv['tokenizer.ggml.tokens']), 'hidden_size': H,
        'num_hidden_layers': L, 'num_attention_heads': g('attention.head_count'),
        'num_key_value_heads': g('attention.head_count_kv'), 'head_dim': g('attention.key_length'),
        'rms_norm_eps': g('attention.layer_norm_rms_epsilon'),
        'max_position_embeddings': g('context_length'),
        'linear_conv_kernel_dim': g('ssm.conv_kernel'), 'linear_key_head_dim': dk,
        'linear_value_head_dim': dv, 'linear_num_key_heads': nk, 'linear_num_value_heads': nv,
        'full_attention_interval': g('full_attention_interval', 4),
        'rope_parameters': {'rope_theta': g('rope.freq_base'),
                            'partial_rotary_factor': g('rope.dimension_count') / g('attention.key_length'),
                            'mrope_section': g('rope.dimension_sections')[:3]},
        'eos_token_id': kv.get('tokenizer.ggml.eos_token_id'),
    }
    if E:
        text.update(num_experts=E, num_experts_per_tok=g('expert_used_count'),
                    moe_intermediate_size=g('expert_feed_forward_length'),
                    shared_expert_intermediate_size=g('expert_shared_feed_forward_length'))
    else:
        text['intermediate_size'] = g('feed_forward_length')
    cfg = {'architectures': ['Qwen3_5MoeForConditionalGeneration' if E else 'Qwen3_5ForConditionalGeneration'],
           'text_config': text}
    json.dump(cfg, open(f'{out}/config.json', 'w'), indent=1)
    toks, types = kv['tokenizer.ggml.tokens'], kv['tokenizer.ggml.token_type']
    vocab = {tk: i for i, (tk, ty) in enumerate(zip(toks, types)) if ty == 1}
    added = [{'id': i, 'content': tk, 'special': ty == 3} for i, (tk, ty) in enumerate(zip(toks, types)) if ty in (3, 4)]
    tok = {'version': '1.0', 'added_tokens': added,
           'model': {'type': 'BPE', 'vocab': vocab,
                     'merges': [m.split(' ', 1) for m in kv['tokenizer.ggml.merges']]}}
    json.dump(tok, open(f'{out}/tokenizer.json', 'w'), ensure_ascii=False)

main()

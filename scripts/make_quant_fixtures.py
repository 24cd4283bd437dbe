#!/usr/bin/env python3
"""Writes the quantized golden fixtures (tests/fixtures/models/quant/<format>/).

One tiny random Llama (2 layers, hidden 64, vocab 128) per format, its linear layers quantized by
the format's published rule and stored as the hub stores that format, plus golden.json and
golden.bin from transformers on the DEQUANTIZED weights (an fp32 LlamaForCausalLM into which the
dequantized weights are loaded). The dequantization here is written from the stored tensors, the
way each reference unpacks them (compressed-tensors unpack_from_int32, AutoGPTQ/AutoAWQ unpacking,
DeepSeek weight_dequant), not from the integers before packing, so a packing mistake shows up.

  fp8_block    quant_method fp8, DeepSeek style: blocks [48, 48] (partial edge blocks),
               scale_fmt ue8m0 (power-of-two weight_scale_inv), one module in modules_to_not_convert
  fp8_hf       written by transformers' own FineGrainedFP8 quantizer (blocks [32, 32]); needs a GPU
  ct_int4      compressed-tensors pack-quantized int4, group 32, asymmetric, actorder (weight_g_idx)
  ct_int8      compressed-tensors pack-quantized int8, channel, symmetric, a regex in ignore
  ct_fp8       compressed-tensors float-quantized: channel (q/k/v, bf16 scales, dynamic input
               activations), tensor (o), block [32, 32] (mlp)
  gptq_int4    GPTQ v1, 4 bits, group 32, desc_act (permuted g_idx), asymmetric
  gptq_int8    GPTQ v1, 8 bits, group_size -1, symmetric
  awq_int4     AWQ GEMM, group 32, zero point, one module in modules_to_not_convert

Every fixture's golden.json also lists, per dequantized linear weight, its float64 sum and an
index-weighted sum (`dequantized_checksums`), which the loader test checks exactly.
Also writes tests/fixtures/quant/reference_vectors.safetensors: transformers' own Fp8Dequantize and
convert_moe_packed_tensors (MXFP4) on random inputs, for the format unit tests.

Usage: python3 scripts/make_quant_fixtures.py --out DIR [--no-torch]
  --vectors-only writes only tests/fixtures/quant/reference_vectors.safetensors (as quant_vectors/).
  --no-torch writes only the checkpoints and checksums (numpy only; for testing the loader without
  torch); the default (torch + transformers) adds the goldens, fp8_hf and the reference vectors.
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 128, 2, 4, 2, 16, 128
INIT_STD = 0.08
PROMPT_LENGTHS = [5, 12, 20]
GREEDY_STEPS = 8
MARGIN_REL = 2e-3
SEED_TIME_LIMIT_S = 6.0
PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def proj_shape(p):
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    return {"self_attn.q_proj": (q, HIDDEN), "self_attn.k_proj": (kv, HIDDEN),
            "self_attn.v_proj": (kv, HIDDEN), "self_attn.o_proj": (HIDDEN, q),
            "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN),
            "mlp.down_proj": (HIDDEN, INTER)}[p]


def base_config():
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": HEAD_DIM,
        "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02,
        "intermediate_size": INTER, "max_position_embeddings": 256, "mlp_bias": False,
        "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": VOCAB,
        "use_cache": True,
    }


# ---- number formats --------------------------------------------------------------------------

def bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_round(x):
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def e4m3_table():
    codes = np.arange(127, dtype=np.int64)  # 0x00..0x7e: every finite non-negative value
    e, m = codes >> 3, codes & 7
    return np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10)).astype(np.float64)


E4M3 = e4m3_table()


def e4m3_encode(x):
    """Round to nearest, ties to even (torch's float8_e4m3fn cast); |x| must be <= 448."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    a = np.abs(x)
    assert np.all(a <= 448.0), "value outside e4m3 range"
    hi = np.clip(np.searchsorted(E4M3, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    d_lo, d_hi = a - E4M3[lo], E4M3[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)


def e4m3_decode(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    v = E4M3[(codes & 0x7F).astype(np.int64).clip(0, 126)].astype(np.float32)
    return np.where(codes & 0x80, -v, v).astype(np.float32)


# ---- safetensors (written by hand: only numpy is needed) --------------------------------------

DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32",
          np.dtype(np.int64): "I64", np.dtype(np.int8): "I8"}


class Tensor:
    """An array with an explicit safetensors dtype (BF16 / F8_E4M3 / U8 have no numpy dtype)."""

    def __init__(self, array, dtype=None):
        self.array = np.ascontiguousarray(array)
        self.dtype = dtype or DTYPES[self.array.dtype]


def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        data = t.array.tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(t.array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    np_of = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "I8": np.int8,
             "BF16": np.uint16, "F8_E4M3": np.uint8, "U8": np.uint8}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        arr = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=np_of[e["dtype"]]).reshape(e["shape"])
        out[name] = Tensor(arr.copy(), e["dtype"])
    return out


def to_float(t):
    if t.dtype == "BF16":
        return (t.array.astype(np.uint32) << 16).view(np.float32)
    if t.dtype == "F8_E4M3":
        return e4m3_decode(t.array)
    return t.array.astype(np.float32)


# ---- weights ---------------------------------------------------------------------------------

def master_weights(seed):
    """fp32 weights, every value bf16-representable (so bf16 and fp32 loads agree)."""
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": INIT_STD * rng.standard_normal((VOCAB, HIDDEN)),
         "lm_head.weight": INIT_STD * rng.standard_normal((VOCAB, HIDDEN)),
         "model.norm.weight": 1.0 + 0.1 * rng.standard_normal(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1.0 + 0.1 * rng.standard_normal(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = 1.0 + 0.1 * rng.standard_normal(HIDDEN)
        for proj in PROJ:
            w[p + proj + ".weight"] = INIT_STD * rng.standard_normal(proj_shape(proj))
    return {k: bf16_round(v.astype(np.float32)) for k, v in w.items()}


def linear_names():
    return [f"model.layers.{i}.{p}" for i in range(LAYERS) for p in PROJ]


def bf16_tensor(x):
    return Tensor(bf16_bits(x), "BF16")


# ---- quantizers (each format's published rule) and dequantizers (its reference unpacking) ----

def quant_fp8_blocks(w, br, bc, ue8m0):
    """DeepSeek-V3 style: one scale per [br, bc] block (ceil-sized edges), amax / 448."""
    rows, cols = w.shape
    gr, gc = -(-rows // br), -(-cols // bc)
    s = np.zeros((gr, gc), np.float32)
    q = np.zeros(w.shape, np.uint8)
    for i in range(gr):
        for j in range(gc):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = max(float(np.abs(blk).max()), 1e-12)
            scale = np.float32(amax / 448.0)
            if ue8m0:
                scale = np.float32(2.0 ** np.ceil(np.log2(scale)))
            s[i, j] = scale
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = e4m3_encode(
                np.clip(blk / scale, -448, 448))
    return q, s


def dequant_fp8_blocks(q_codes, s, br, bc):
    """DeepSeek weight_dequant: y = x * s[block], blocks cropped at the edges."""
    rows, cols = q_codes.shape
    full = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:rows, :cols]
    return (e4m3_decode(q_codes) * full).astype(np.float32)


def pack_to_int32(v, bits, packed_dim=1):
    """compressed_tensors pack_to_int32."""
    v = (v.astype(np.int64) + (1 << (bits - 1))).astype(np.uint32)
    if packed_dim == 0:
        v = v.T
    rows, cols = v.shape
    pf = 32 // bits
    pad = (-cols) % pf
    v = np.pad(v, ((0, 0), (0, pad)))
    v = v.reshape(rows, -1, pf)
    packed = np.zeros(v.shape[:2], np.uint32)
    for i in range(pf):
        packed |= v[:, :, i] << np.uint32(bits * i)
    packed = packed.view(np.int32)
    return np.ascontiguousarray(packed.T if packed_dim == 0 else packed)


def unpack_from_int32(value, bits, shape, packed_dim=1):
    """compressed_tensors unpack_from_int32."""
    pf, mask = 32 // bits, (1 << bits) - 1
    value = value.view(np.uint32).astype(np.int64)
    if packed_dim == 1:
        out = np.zeros((value.shape[0], value.shape[1] * pf), np.int64)
        for i in range(pf):
            out[:, i::pf] = (value >> (bits * i)) & mask
        out = out[:, :shape[1]]
    else:
        out = np.zeros((value.shape[0] * pf, value.shape[1]), np.int64)
        for i in range(pf):
            out[i::pf, :] = (value >> (bits * i)) & mask
        out = out[:shape[0], :]
    return out - (1 << bits) // 2


def ct_int_quant(w, bits, symmetric, group, g_idx):
    """compressed-tensors calculate_qparams + quantize per (row, group); bf16 scales."""
    rows, cols = w.shape
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    groups = int(g_idx.max()) + 1
    scale = np.zeros((rows, groups), np.float32)
    zp = np.zeros((rows, groups), np.int64)
    for g in range(groups):
        cols_g = np.nonzero(g_idx == g)[0]
        blk = w[:, cols_g]
        mn, mx = np.minimum(blk.min(1), 0), np.maximum(blk.max(1), 0)
        if symmetric:
            s = np.maximum(np.abs(mn), np.abs(mx)) / ((qmax - qmin) / 2)
            z = np.zeros(rows, np.int64)
        else:
            s = (mx - mn) / (qmax - qmin)
            z = np.clip(np.round(qmin - mn / s), qmin, qmax).astype(np.int64)
        scale[:, g] = bf16_round(s.astype(np.float32))
        zp[:, g] = z
    q = np.clip(np.round(w / scale[:, g_idx] + zp[:, g_idx]), qmin, qmax).astype(np.int8)
    return q, scale, zp


def dequant_ct_int(q, scale, zp, g_idx):
    """compressed-tensors dequantize: (x_q - zp) * scale, columns grouped by g_idx."""
    return ((q - zp[:, g_idx]) * scale[:, g_idx]).astype(np.float32)


def gptq_quant(w, bits, group_size, sym, perm):
    """GPTQ's Quantizer per group (min/max through 0), over the desc_act order `perm`."""
    out, inp = w.shape
    maxq = (1 << bits) - 1
    gs = inp if group_size == -1 else group_size
    g_idx = np.zeros(inp, np.int32)
    g_idx[perm] = np.arange(inp) // gs
    groups = int(g_idx.max()) + 1
    scales = np.zeros((groups, out), np.float32)
    zeros = np.zeros((groups, out), np.int64)
    for g in range(groups):
        blk = w[:, g_idx == g]
        xmin, xmax = np.minimum(blk.min(1), 0), np.maximum(blk.max(1), 0)
        if sym:
            xmax = np.maximum(np.abs(xmin), xmax)
            xmin = -xmax
        s = (xmax - xmin) / maxq
        z = np.full(out, (maxq + 1) // 2) if sym else np.round(-xmin / s)
        scales[g] = s.astype(np.float16).astype(np.float32)
        zeros[g] = z
    q = np.clip(np.round(w / scales[g_idx].T) + zeros[g_idx].T, 0, maxq).astype(np.int64)
    return q, scales, zeros, g_idx


def gptq_pack(q, scales, zeros, g_idx, bits):
    """AutoGPTQ QuantLinear.pack (v1: zeros stored minus one)."""
    out, inp = q.shape
    pf = 32 // bits
    intw = q.T.astype(np.uint32)  # [in, out]
    qweight = np.zeros((inp // pf, out), np.uint32)
    for j in range(pf):
        qweight |= intw[j::pf] << np.uint32(bits * j)
    z = ((zeros - 1) & ((1 << bits) - 1)).astype(np.uint32)  # [G, out]
    qzeros = np.zeros((z.shape[0], out // pf), np.uint32)
    for j in range(pf):
        qzeros |= z[:, j::pf] << np.uint32(bits * j)
    return {"qweight": Tensor(qweight.view(np.int32)), "qzeros": Tensor(qzeros.view(np.int32)),
            "scales": Tensor(scales.astype(np.float16)), "g_idx": Tensor(g_idx.astype(np.int32))}


def gptq_dequant(t, bits):
    """AutoGPTQ's dequantization: unpack, zeros + 1, scales * (w - zeros) by g_idx."""
    shifts = np.arange(0, 32, bits, dtype=np.int64)
    mask = (1 << bits) - 1
    qw = t["qweight"].array.view(np.uint32).astype(np.int64)
    qz = t["qzeros"].array.view(np.uint32).astype(np.int64)
    weight = ((qw[:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, qw.shape[1])
    zeros = ((qz[:, :, None] >> shifts[None, None, :]) & mask).reshape(qz.shape[0], -1) + 1
    g = t["g_idx"].array.astype(np.int64)
    scales = t["scales"].array.astype(np.float32)
    return (scales[g] * (weight - zeros[g])).T.astype(np.float32)


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def awq_quant(w, group_size):
    """AutoAWQ pseudo_quantize_tensor (zero point), per group of input columns."""
    out, inp = w.shape
    wt = w.T.reshape(inp // group_size, group_size, out)  # [G, gs, out]
    mx, mn = wt.max(1), wt.min(1)
    scales = (np.maximum(mx - mn, 1e-5) / 15).astype(np.float16).astype(np.float32)
    zeros = np.clip(-np.round(mn / scales), 0, 15).astype(np.int64)
    q = np.clip(np.round(wt / scales[:, None, :]) + zeros[:, None, :], 0, 15).astype(np.int64)
    return q.reshape(inp, out), scales, zeros


def awq_pack(intw):
    """AutoAWQ WQLinear_GEMM pack: field i holds column col * 8 + order_map[i]."""
    rows, cols = intw.shape
    packed = np.zeros((rows, cols // 8), np.uint32)
    for col in range(cols // 8):
        for i in range(8):
            packed[:, col] |= intw[:, col * 8 + AWQ_ORDER[i]].astype(np.uint32) << np.uint32(4 * i)
    return packed.view(np.int32)


def awq_dequant(t, group_size):
    """AutoAWQ unpack_awq + reverse_awq_order + (w - z) * s."""
    shifts = np.arange(0, 32, 4, dtype=np.int64)

    def unpack(x):
        x = x.view(np.uint32).astype(np.int64)
        u = ((x[:, :, None] >> shifts[None, None, :]) & 0xF).reshape(x.shape[0], -1)
        order = np.arange(u.shape[1]).reshape(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
        return u[:, order]

    iw, iz = unpack(t["qweight"].array), unpack(t["qzeros"].array)
    s = t["scales"].array.astype(np.float32)
    iz = np.repeat(iz, group_size, axis=0)
    s = np.repeat(s, group_size, axis=0)
    return ((iw - iz) * s).T.astype(np.float32)


# ---- formats ---------------------------------------------------------------------------------

def fmt_fp8_block(w, rng):
    br = bc = 48
    keep = ["model.layers.1.self_attn.o_proj"]
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
          "scale_fmt": "ue8m0", "weight_block_size": [br, bc],
          "modules_to_not_convert": ["lm_head"] + keep}
    tensors, deq = {}, {}
    for m in linear_names():
        if m in keep:
            tensors[m + ".weight"] = bf16_tensor(w[m + ".weight"])
            deq[m] = w[m + ".weight"]
            continue
        q, s = quant_fp8_blocks(w[m + ".weight"], br, bc, ue8m0=True)
        tensors[m + ".weight"] = Tensor(q, "F8_E4M3")
        tensors[m + ".weight_scale_inv"] = Tensor(s)
        deq[m] = dequant_fp8_blocks(tensors[m + ".weight"].array, s, br, bc)
    return qc, tensors, deq


def fmt_fp8_hf_emulated(w, rng):
    """transformers Fp8Quantize (scale = 448 / amax, inv = 1 / scale), for the seed search only."""
    b = 32
    tensors, deq = {}, {}
    for m in linear_names():
        x = w[m + ".weight"]
        r, c = x.shape
        blk = x.reshape(r // b, b, c // b, b)
        amax = np.abs(blk).max(axis=(1, 3)).astype(np.float32)
        scale = np.float32(448.0) / np.where(amax > 0, amax, 1).astype(np.float32)
        q = e4m3_encode(np.clip(blk * scale[:, None, :, None], -448, 448)).reshape(r, c)
        inv = (np.float32(1.0) / scale).astype(np.float32)
        tensors[m + ".weight"] = Tensor(q, "F8_E4M3")
        tensors[m + ".weight_scale_inv"] = Tensor(inv)
        deq[m] = dequant_fp8_blocks(q, inv, b, b)
    return {"quant_method": "fp8", "weight_block_size": [b, b]}, tensors, deq


def ct_config(groups, ignore):
    return {"quant_method": "compressed-tensors", "format": "mixed-precision",
            "quantization_status": "compressed", "global_compression_ratio": None,
            "kv_cache_scheme": None, "sparsity_config": {}, "ignore": ignore,
            "config_groups": groups}


def ct_weights(bits, typ, strategy, symmetric, **kw):
    d = {"num_bits": bits, "type": typ, "symmetric": symmetric, "strategy": strategy,
         "group_size": None, "block_structure": None, "dynamic": False, "actorder": None,
         "observer": "minmax", "observer_kwargs": {}}
    d.update(kw)
    return d


def fmt_ct_int4(w, rng):
    bits, gs = 4, 32
    qc = ct_config({"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                "input_activations": None, "output_activations": None,
                                "weights": ct_weights(bits, "int", "group", False, group_size=gs,
                                                      actorder="group")}},
                   ["lm_head"])
    tensors, deq = {}, {}
    for m in linear_names():
        x = w[m + ".weight"]
        out, inp = x.shape
        perm = rng.permutation(inp)
        g_idx = np.zeros(inp, np.int64)
        g_idx[perm] = np.arange(inp) // gs
        q, scale, zp = ct_int_quant(x, bits, False, gs, g_idx)
        tensors[m + ".weight_packed"] = Tensor(pack_to_int32(q, bits))
        tensors[m + ".weight_scale"] = bf16_tensor(scale)
        tensors[m + ".weight_zero_point"] = Tensor(pack_to_int32(zp.astype(np.int8), bits, 0))
        tensors[m + ".weight_shape"] = Tensor(np.array([out, inp], np.int64))
        tensors[m + ".weight_g_idx"] = Tensor(g_idx.astype(np.int32))
        deq[m] = stored_ct_int(tensors, m, bits, True)
    return qc, tensors, deq


def stored_ct_int(tensors, m, bits, asymmetric):
    shape = tensors[m + ".weight_shape"].array
    q = unpack_from_int32(tensors[m + ".weight_packed"].array, bits, shape)
    scale = to_float(tensors[m + ".weight_scale"])
    groups = scale.shape[1]
    if asymmetric:
        zp = unpack_from_int32(tensors[m + ".weight_zero_point"].array, bits,
                               (shape[0], groups), 0)
    else:
        zp = np.zeros(scale.shape, np.int64)
    g_name = m + ".weight_g_idx"
    g_idx = (tensors[g_name].array.astype(np.int64) if g_name in tensors
             else np.arange(shape[1]) * groups // shape[1])
    return dequant_ct_int(q, scale, zp, g_idx)


def fmt_ct_int8(w, rng):
    bits = 8
    ignore = ["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"]
    qc = ct_config({"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                "input_activations": None, "output_activations": None,
                                "weights": ct_weights(bits, "int", "channel", True)}}, ignore)
    tensors, deq = {}, {}
    for m in linear_names():
        x = w[m + ".weight"]
        if m == "model.layers.1.mlp.down_proj":
            tensors[m + ".weight"] = bf16_tensor(x)
            deq[m] = x
            continue
        q, scale, _ = ct_int_quant(x, bits, True, None, np.zeros(x.shape[1], np.int64))
        tensors[m + ".weight_packed"] = Tensor(pack_to_int32(q, bits))
        tensors[m + ".weight_scale"] = bf16_tensor(scale)  # [out, 1]
        tensors[m + ".weight_shape"] = Tensor(np.array(x.shape, np.int64))
        deq[m] = stored_ct_int(tensors, m, bits, False)
    return qc, tensors, deq


def fmt_ct_fp8(w, rng):
    b = 32
    dyn = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
           "dynamic": True, "group_size": None, "block_structure": None, "actorder": None,
           "observer": None, "observer_kwargs": {}}
    groups = {
        "group_0": {"targets": ["re:.*self_attn\\.(q|k|v)_proj$"], "format": "float-quantized",
                    "input_activations": dyn, "output_activations": None,
                    "weights": ct_weights(8, "float", "channel", True)},
        "group_1": {"targets": ["re:.*o_proj$"], "format": "float-quantized",
                    "input_activations": None, "output_activations": None,
                    "weights": ct_weights(8, "float", "tensor", True)},
        "group_2": {"targets": ["re:.*mlp\\..*"], "format": "float-quantized",
                    "input_activations": None, "output_activations": None,
                    "weights": ct_weights(8, "float", "block", True, block_structure=[b, b])},
    }
    qc = ct_config(groups, ["lm_head"])
    tensors, deq = {}, {}
    for m in linear_names():
        x = w[m + ".weight"]
        r, c = x.shape
        if m.endswith(("q_proj", "k_proj", "v_proj")):
            br, bc, shape = 1, c, (r, 1)
        elif m.endswith("o_proj"):
            br, bc, shape = r, c, (1,)
        else:
            br, bc, shape = b, b, (r // b, c // b)
        gr, gc = r // br, c // bc
        amax = np.abs(x.reshape(gr, br, gc, bc)).max(axis=(1, 3))
        s = (amax / 448.0).astype(np.float32)
        if shape == (r, 1):
            s = bf16_round(s)
        full = np.repeat(np.repeat(s, br, 0), bc, 1)
        q = e4m3_encode(np.clip(x / full, -448, 448))
        tensors[m + ".weight"] = Tensor(q, "F8_E4M3")
        tensors[m + ".weight_scale"] = (bf16_tensor(s.reshape(shape)) if shape == (r, 1)
                                        else Tensor(s.reshape(shape)))
        if shape == (r, 1):
            tensors[m + ".input_scale"] = Tensor(np.ones((1,), np.float32))  # unused by weights
        deq[m] = (e4m3_decode(q) * full).astype(np.float32)
    return qc, tensors, deq


def fmt_gptq(bits, group_size, sym, desc_act):
    def make(w, rng):
        qc = {"quant_method": "gptq", "bits": bits, "group_size": group_size,
              "desc_act": desc_act, "sym": sym, "checkpoint_format": "gptq",
              "true_sequential": True, "damp_percent": 0.01, "static_groups": False,
              "lm_head": False}
        tensors, deq = {}, {}
        for m in linear_names():
            x = w[m + ".weight"]
            perm = rng.permutation(x.shape[1]) if desc_act else np.arange(x.shape[1])
            q, scales, zeros, g_idx = gptq_quant(x, bits, group_size, sym, perm)
            t = gptq_pack(q, scales, zeros, g_idx, bits)
            for k, v in t.items():
                tensors[m + "." + k] = v
            deq[m] = gptq_dequant(t, bits)
        return qc, tensors, deq
    return make


def fmt_awq(w, rng):
    gs = 32
    keep = "model.layers.0.self_attn.v_proj"
    qc = {"quant_method": "awq", "bits": 4, "group_size": gs, "zero_point": True,
          "version": "gemm", "modules_to_not_convert": ["layers.0.self_attn.v_proj"]}
    tensors, deq = {}, {}
    for m in linear_names():
        x = w[m + ".weight"]
        if m == keep:
            tensors[m + ".weight"] = Tensor(x.astype(np.float16))
            deq[m] = x.astype(np.float16).astype(np.float32)
            continue
        q, scales, zeros = awq_quant(x, gs)
        t = {"qweight": Tensor(awq_pack(q)), "qzeros": Tensor(awq_pack(zeros)),
             "scales": Tensor(scales.astype(np.float16))}
        for k, v in t.items():
            tensors[m + "." + k] = v
        deq[m] = awq_dequant(t, gs)
    return qc, tensors, deq


FORMATS = {
    "fp8_block": fmt_fp8_block,
    "fp8_hf": fmt_fp8_hf_emulated,
    "ct_int4": fmt_ct_int4,
    "ct_int8": fmt_ct_int8,
    "ct_fp8": fmt_ct_fp8,
    "gptq_int4": fmt_gptq(4, 32, False, True),
    "gptq_int8": fmt_gptq(8, -1, True, False),
    "awq_int4": fmt_awq,
}


def build(fmt, seed):
    """(quantization_config, stored tensors, dequantized weights by name) for one seed."""
    w = master_weights(seed)
    qc, tensors, deq = FORMATS[fmt](w, np.random.default_rng(1000 + seed))
    for name, x in w.items():
        if not any(name == m + ".weight" for m in linear_names()):
            tensors[name] = bf16_tensor(x)
    full = dict(w)
    for m, x in deq.items():
        full[m + ".weight"] = x
    return qc, tensors, full


def checksums(full):
    out = {}
    for m in linear_names():
        x = full[m + ".weight"].astype(np.float64).reshape(-1)
        k = (np.arange(x.size) % 97 - 48).astype(np.float64)
        out[m + ".weight"] = {"sum": float(x.sum()), "weighted": float((x * k).sum()),
                              "shape": list(full[m + ".weight"].shape)}
    return out


# ---- transformers ----------------------------------------------------------------------------

def torch_model(full):
    import torch
    import transformers
    cfg = dict(base_config())
    cfg.pop("architectures")
    cfg.pop("model_type")
    cfg.pop("torch_dtype")
    rope = cfg.pop("rope_parameters")
    config = transformers.LlamaConfig(rope_parameters=rope, **cfg)
    if not getattr(config, "rope_parameters", None):
        config.rope_theta = rope["rope_theta"]
    model = transformers.LlamaForCausalLM(config)
    try:
        model.set_attn_implementation("eager")
    except Exception:
        model.config._attn_implementation = "eager"
    model = model.float().eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in full.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model


def run_prompts(model, prompts, stop_early):
    import torch
    results, min_rel = [], float("inf")
    with torch.no_grad():
        for ids in prompts:
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            seq, toks, rows = list(ids), [], []
            for step in range(GREEDY_STEPS):
                row = logits[-1] if step == 0 else model(
                    input_ids=torch.tensor([seq])).logits[0, -1].float()
                top = torch.topk(row, 2).values
                rel = ((top[0] - top[1]) / row.abs().max()).item()
                min_rel = min(min_rel, rel)
                if rel < MARGIN_REL and stop_early:
                    return None, min_rel
                tok = int(torch.argmax(row))
                toks.append(tok)
                rows.append(row.clone())
                seq.append(tok)
            results.append((logits.clone(), toks, torch.stack(rows)))
    return results, min_rel


def write_golden(d, model, prompts, results, min_rel, seed, full, extra):
    import torch
    import transformers
    blob, entries = bytearray(), []
    for ids, (logits, toks, rows) in zip(prompts, results):
        off = len(blob) // 4
        blob += logits.numpy().astype("<f4").tobytes()
        goff = len(blob) // 4
        blob += rows.numpy().astype("<f4").tobytes()
        entries.append(dict(token_ids=ids, logits_offset=off, logits_rows=len(ids),
                            greedy_token_ids=toks, greedy_logits_offset=goff,
                            greedy_logits_rows=len(toks)))
    with open(os.path.join(d, "golden.bin"), "wb") as f:
        f.write(bytes(blob))
    golden = dict(
        format="ringserve-golden-1",
        description=("transformers logits (fp32, CPU, eager) of LlamaForCausalLM holding the "
                     "DEQUANTIZED weights of this checkpoint; layout as tests/fixtures/models."),
        architecture="LlamaForCausalLM", transformers_version=transformers.__version__,
        torch_version=torch.__version__, attn_implementation="eager", seed=seed,
        margin_threshold_rel=MARGIN_REL, min_relative_margin=min_rel,
        margin_ok=min_rel >= MARGIN_REL, vocab_size=VOCAB, logits_file="golden.bin",
        rope_inv_freq=model.model.rotary_emb.inv_freq.tolist(), safetensors_files=["model.safetensors"],
        dequantized_checksums=checksums(full), prompts=entries, **extra)
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)


def write_checkpoint(d, qc, tensors):
    os.makedirs(d, exist_ok=True)
    cfg = base_config()
    cfg["quantization_config"] = qc
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)


def transformers_fp8(d, seed):
    """Quantizes the master weights with transformers' FineGrainedFP8 and saves; returns the
    dequantized weights read back from its file (checked against transformers' Fp8Dequantize)."""
    import tempfile
    import torch
    import transformers
    src = tempfile.mkdtemp()
    w = master_weights(seed)
    write_checkpoint(src, None, {k: bf16_tensor(v) for k, v in w.items()})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config")
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f)
    qcfg = transformers.FineGrainedFP8Config(weight_block_size=[32, 32])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, quantization_config=qcfg, dtype=torch.bfloat16, device_map="cuda")
    model.save_pretrained(d)
    tensors = read_safetensors(os.path.join(d, "model.safetensors"))
    full = dict(w)
    for name, t in tensors.items():
        if t.dtype != "F8_E4M3":
            continue
        m = name[:-len(".weight")]
        s = tensors[m + ".weight_scale_inv"].array.astype(np.float32)
        full[name] = dequant_fp8_blocks(t.array, s, 32, 32)
        try:  # transformers' own inverse, where this version has it
            from transformers.integrations.finegrained_fp8 import Fp8Dequantize
            ref = Fp8Dequantize(block_size=(32, 32)).convert(
                [torch.from_numpy(t.array.copy()).view(torch.float8_e4m3fn), torch.from_numpy(s)],
                context={}).float().numpy()
        except Exception as e:
            print("Fp8Dequantize unavailable:", repr(e))
            ref = None
        if ref is not None and not np.array_equal(ref, full[name]):
            raise RuntimeError(f"{name}: our FP8 dequantization differs from Fp8Dequantize")
    return full, sorted(tensors)


def reference_vectors(path):
    """transformers' own dequantization functions on random inputs, for the C++ unit tests."""
    import torch
    import transformers
    rng = np.random.default_rng(7)
    out = {}
    from transformers.integrations import mxfp4
    blocks = rng.integers(0, 256, (2, 4, 2, 16), dtype=np.uint8)
    scales = rng.integers(118, 136, (2, 4, 2), dtype=np.uint8)
    convert = getattr(mxfp4, "convert_moe_packed_tensors", None) or getattr(
        mxfp4, "_convert_moe_packed_tensors")
    deq = convert(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    out["mxfp4.blocks"] = Tensor(blocks, "U8")
    out["mxfp4.scales"] = Tensor(scales, "U8")
    out["mxfp4.dequantized"] = Tensor(deq.float().cpu().numpy())  # [2, 64, 4]: transposed
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize
    x = torch.from_numpy(bf16_round(0.1 * rng.standard_normal((64, 96)).astype(np.float32)))
    for prefix, scale_fmt in (("fp8", "float"), ("fp8_ue8m0", "ue8m0")):
        try:
            class HfQuantizer:
                quantization_config = transformers.FineGrainedFP8Config(
                    weight_block_size=[32, 32], scale_fmt=scale_fmt)
            hq = HfQuantizer()
            qd = Fp8Quantize(hq).convert({"w.weight": x})
            q, s = qd["w.weight"], qd["w.weight_scale_inv"]
            deq = None
            for call in (lambda: Fp8Dequantize(hq).convert(
                             {"weight$": [q], "weight_scale_inv": [s]}, full_layer_name="w.weight"),
                         lambda: Fp8Dequantize(hq).convert(
                             {"w.weight": [q], "w.weight_scale_inv": [s]}, full_layer_name="w.weight")):
                try:
                    deq = call()
                    break
                except Exception as e:
                    print(prefix, "Fp8Dequantize call failed:", repr(e))
            if isinstance(deq, dict):
                deq = list(deq.values())[0]
            if isinstance(deq, list):
                deq = deq[0]
            out[prefix + ".weight"] = Tensor(q.view(torch.uint8).numpy(), "F8_E4M3")
            if s.dtype == torch.float32:
                out[prefix + ".weight_scale_inv"] = Tensor(s.numpy())
            else:  # float8_e8m0fnu: one exponent byte
                out[prefix + ".weight_scale_inv"] = Tensor(s.view(torch.uint8).numpy(), "F8_E8M0")
            if deq is not None:
                out[prefix + ".dequantized"] = Tensor(deq.float().numpy())
            print(prefix, "reference vectors:", q.shape, s.dtype, None if deq is None else deq.shape)
        except Exception as e:  # a transformers without these conversion ops
            print(prefix, "reference vectors skipped:", repr(e))
    write_safetensors(path, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--vectors-only", action="store_true")
    args = ap.parse_args()
    pgen = np.random.default_rng(1234)
    prompts = [pgen.integers(3, VOCAB, n).tolist() for n in PROMPT_LENGTHS]
    summary = {}
    if not args.no_torch:
        import torch
        torch.set_num_threads(4)
        os.makedirs(os.path.join(args.out, "quant_vectors"), exist_ok=True)
        try:
            reference_vectors(os.path.join(args.out, "quant_vectors",
                                           "reference_vectors.safetensors"))
        except Exception as e:
            print("reference vectors failed:", repr(e))
        if args.vectors_only:
            return 0
    for fmt in FORMATS:
        if args.only and fmt not in args.only.split(","):
            continue
        t0 = time.time()
        d = os.path.join(args.out, "quant", fmt)
        if args.no_torch:
            if fmt == "fp8_hf":
                continue
            qc, tensors, full = build(fmt, 0)
            write_checkpoint(d, qc, tensors)
            with open(os.path.join(d, "checksums.json"), "w") as f:
                json.dump(dict(seed=0, dequantized_checksums=checksums(full)), f, indent=1)
            print(f"{fmt}: {os.path.getsize(os.path.join(d, 'model.safetensors'))} bytes")
            continue
        best, chosen = (-1.0, 0), None
        for seed in range(10000):
            qc, tensors, full = build(fmt, seed)
            _, min_rel = run_prompts(torch_model(full), prompts, stop_early=True)
            if min_rel >= MARGIN_REL:
                chosen = seed
                break
            best = max(best, (min_rel, seed))
            if time.time() - t0 > SEED_TIME_LIMIT_S:
                break
        seed = chosen if chosen is not None else best[1]
        qc, tensors, full = build(fmt, seed)
        extra = {}
        try:
            if fmt == "fp8_hf":
                full, names = transformers_fp8(d, seed)
                extra["written_by"] = "transformers FineGrainedFP8Config(weight_block_size=[32, 32])"
            else:
                write_checkpoint(d, qc, tensors)
                extra["written_by"] = "scripts/make_quant_fixtures.py"
        except Exception as e:
            print(f"{fmt}: FAILED to write: {e!r}")
            summary[fmt] = dict(error=repr(e))
            continue
        model = torch_model(full)
        results, min_rel = run_prompts(model, prompts, stop_early=False)
        write_golden(d, model, prompts, results, min_rel, seed, full, extra)
        size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
        print(f"{fmt}: seed={seed} min_rel_margin={min_rel:.4f} bytes={size} "
              f"t={time.time() - t0:.1f}s greedy0={results[0][1]}")
        summary[fmt] = dict(seed=seed, min_rel_margin=min_rel, bytes=size)
    with open(os.path.join(args.out, "quant_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

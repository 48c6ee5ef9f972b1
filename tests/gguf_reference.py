"""What llama.cpp's converter makes of HF Qwen3.5 tensors, re-derived with plain numpy
(explicit head permutations) from config.json, independently of pyqwen.convert's tables."""
from __future__ import annotations

import numpy as np


def tiled_heads(nk: int, nv: int) -> list[int]:
    """Tiled position -> grouped V head: position j*nk + g holds head g*(nv/nk) + j."""
    r = nv // nk
    return [g * r + j for j in range(r) for g in range(nk)]


def take_heads(a: np.ndarray, order: list[int], size: int, axis: int = 0) -> np.ndarray:
    parts = [np.take(a, np.arange(h * size, (h + 1) * size), axis=axis) for h in order]
    return np.concatenate(parts, axis=axis)


def expected_values(src: dict[str, np.ndarray], cfg: dict, *, n_mtp: int) -> dict[str, np.ndarray]:
    """GGUF name -> F32 values (numpy order) from the HF tensors, by the llama.cpp rules."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    order = tiled_heads(nk, nv)
    src = {(k.replace("model.language_model.", "model.")): v for k, v in src.items()}
    out = {"token_embd.weight": src["model.embed_tokens.weight"], "output_norm.weight": src["model.norm.weight"] + 1}
    if "lm_head.weight" in src and not cfg.get("tie_word_embeddings"):
        out["output.weight"] = src["lm_head.weight"]
    n = len(cfg["layer_types"])

    def block(i, pre):
        g = lambda s: src[pre + s]  # noqa: E731
        out[f"blk.{i}.attn_norm.weight"] = g("input_layernorm.weight") + 1
        out[f"blk.{i}.post_attention_norm.weight"] = g("post_attention_layernorm.weight") + 1
        out[f"blk.{i}.ffn_gate.weight"] = g("mlp.gate_proj.weight")
        out[f"blk.{i}.ffn_up.weight"] = g("mlp.up_proj.weight")
        out[f"blk.{i}.ffn_down.weight"] = g("mlp.down_proj.weight")
        if pre + "self_attn.q_proj.weight" in src:
            out[f"blk.{i}.attn_q.weight"] = g("self_attn.q_proj.weight")  # interleaved q/gate, untouched
            out[f"blk.{i}.attn_k.weight"] = g("self_attn.k_proj.weight")
            out[f"blk.{i}.attn_v.weight"] = g("self_attn.v_proj.weight")
            out[f"blk.{i}.attn_output.weight"] = g("self_attn.o_proj.weight")
            out[f"blk.{i}.attn_q_norm.weight"] = g("self_attn.q_norm.weight") + 1
            out[f"blk.{i}.attn_k_norm.weight"] = g("self_attn.k_norm.weight") + 1
            return
        qk = 2 * nk * dk
        qkv = g("linear_attn.in_proj_qkv.weight")
        out[f"blk.{i}.attn_qkv.weight"] = np.concatenate([qkv[:qk], take_heads(qkv[qk:], order, dv)])
        out[f"blk.{i}.attn_gate.weight"] = take_heads(g("linear_attn.in_proj_z.weight"), order, dv)
        out[f"blk.{i}.ssm_alpha.weight"] = take_heads(g("linear_attn.in_proj_a.weight"), order, 1)
        out[f"blk.{i}.ssm_beta.weight"] = take_heads(g("linear_attn.in_proj_b.weight"), order, 1)
        out[f"blk.{i}.ssm_a"] = -np.exp(take_heads(g("linear_attn.A_log"), order, 1).astype(np.float64))
        out[f"blk.{i}.ssm_dt.bias"] = take_heads(g("linear_attn.dt_bias"), order, 1)
        c = g("linear_attn.conv1d.weight")[:, 0, :]
        out[f"blk.{i}.ssm_conv1d.weight"] = np.concatenate([c[:qk], take_heads(c[qk:], order, dv)])
        out[f"blk.{i}.ssm_norm.weight"] = g("linear_attn.norm.weight")  # plain w: no +1
        out[f"blk.{i}.ssm_out.weight"] = take_heads(g("linear_attn.out_proj.weight"), order, dv, axis=1)

    for i in range(n):
        block(i, f"model.layers.{i}.")
    for j in range(n_mtp):
        block(n + j, f"mtp.layers.{j}.")
    if n_mtp:
        out[f"blk.{n}.nextn.eh_proj.weight"] = src["mtp.fc.weight"]
        out[f"blk.{n}.nextn.enorm.weight"] = src["mtp.pre_fc_norm_embedding.weight"] + 1
        out[f"blk.{n}.nextn.hnorm.weight"] = src["mtp.pre_fc_norm_hidden.weight"] + 1
        out[f"blk.{n}.nextn.shared_head_norm.weight"] = src["mtp.norm.weight"] + 1
    return out

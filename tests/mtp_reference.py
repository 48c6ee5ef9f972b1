"""Torch reference of the Qwen3.5 MTP (multi-token prediction) head in Qwen's `mtp.*` layout,
on top of transformers' Qwen3_5ForCausalLM.

It trains the shipped default model (pyqwen/models/training/train.py copies this file next to
itself) and is the CPU reference for its drafts. Tensors (convert/qwen35.py maps them to GGUF
`blk.{n_layer}.nextn.*` and `blk.{n_layer}.*`):

    mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden   (1+w) RMSNorms
    mtp.fc                    Linear(2H -> H) over cat[norm_e(embed(x[t+1])), norm_h(h[t])]
    mtp.layers.0.*            one full-attention decoder layer, the main model's module type
    mtp.norm                  (1+w) RMSNorm; the shared lm_head turns it into logits for x[t+2]

h[t] is the main model's hidden state after its final norm (the row that feeds lm_head). Rotary
positions are the main model's: the row pairing h[t] with x[t+1] sits at position t+1.

Chained drafts (`chained_draft_logits`): draft k+1 pairs draft k's token with the head's own
output row, either after mtp.norm ("normed": llama.cpp's qwen35 MTP graph and vLLM) or before
it ("pre_norm": ComfyUI's MTPHead).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

FEEDS = ("normed", "pre_norm")


class MTPHead(nn.Module):
    def __init__(self, config):
        """`config`: the main model's Qwen3_5TextConfig."""
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        h, eps = config.hidden_size, config.rms_norm_eps
        layer_cfg = copy.deepcopy(config)
        layer_cfg.num_hidden_layers = 1
        layer_cfg.layer_types = ["full_attention"]
        # sdpa makes a missing mask causal; eager would attend to every row
        layer_cfg._attn_implementation = "sdpa"
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_cfg, 0)])
        self.norm = Qwen3_5RMSNorm(h, eps=eps)

    def block(self, embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The head's rows before mtp.norm. embeds[:, i] = embed(x[t+1]), hidden[:, i] = h[t];
        attention_mask: bool [T, T], True where row i may attend row j (default: causal)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        mask = None if attention_mask is None else attention_mask[None, None]
        return self.layers[0](x, position_embeddings=position_embeddings, attention_mask=mask)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        """The normed MTP hidden states of one causal sequence (logits = lm_head of them)."""
        return self.norm(self.block(embeds, hidden, position_embeddings))


def rope(model, x: torch.Tensor, positions: torch.Tensor):
    """The main model's (cos, sin) for `positions` [B, T] (text-only: all mrope sections equal)."""
    return model.model.rotary_emb(x, positions[None].expand(3, -1, -1))


def mtp_logits(model, mtp: MTPHead, hidden: torch.Tensor, next_ids: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
    """Logits for x[t+2] from h[t] (hidden) and x[t+1] (next_ids) at positions t+1."""
    embeds = model.model.embed_tokens(next_ids)
    out = mtp(embeds, hidden, rope(model, embeds, positions))
    return model.lm_head(out)


def chained_draft_logits(model, mtp: MTPHead, hidden: torch.Tensor, ids: torch.Tensor, points, first: torch.Tensor,
                         depth: int, feed: str = "normed") -> torch.Tensor:
    """Draft logits at depths 1..depth of MTP chains that start at positions `points` of a context.

    hidden [B, L, H]: the main model's h over the context ids [B, L]; first [B, P]: the token the
    main model emitted after ids[:, :t+1] for each point t. The head's KV holds the context rows
    (h[j], x[j+1]) at positions j+1 for j < t, as in decoding. Depth 1 adds the row (h[t], first)
    at position t+1; depth k+1 adds (draft k's row, draft k's top token) at position t+k+1, the
    row after mtp.norm or before it (`feed`). Returns [depth, B, P, n_vocab].
    """
    if feed not in FEEDS:
        raise ValueError(f"feed must be one of {FEEDS}, got {feed!r}")
    B, L, _ = hidden.shape
    pts = torch.as_tensor(points, dtype=torch.long)
    P, n_ctx = len(pts), L - 1
    ctx_pos = torch.arange(1, L)
    hs, toks, out = [hidden[:, pts]], [first], []
    for k in range(1, depth + 1):
        n = n_ctx + k * P
        allowed = torch.zeros(n, n, dtype=torch.bool)
        allowed[:n_ctx, :n_ctx] = torch.ones(n_ctx, n_ctx, dtype=torch.bool).tril()
        for d in range(k):  # chain rows: the context before their point, then their own chain
            rows = n_ctx + d * P + torch.arange(P)
            allowed[rows, :n_ctx] = torch.arange(n_ctx)[None, :] < pts[:, None]
            for e in range(d + 1):
                allowed[rows, n_ctx + e * P + torch.arange(P)] = True
        embeds = model.model.embed_tokens(torch.cat([ids[:, 1:]] + toks, dim=1))
        pos = torch.cat([ctx_pos] + [pts + d for d in range(1, k + 1)]).expand(B, -1)
        pre = mtp.block(embeds, torch.cat([hidden[:, :-1]] + hs, dim=1), rope(model, embeds, pos), allowed)[:, -P:]
        normed = mtp.norm(pre)
        logits = model.lm_head(normed)
        out.append(logits)
        hs.append(normed if feed == "normed" else pre)
        toks.append(logits.argmax(-1))
    return torch.stack(out)


def _load_mtp(model, state: dict[str, torch.Tensor], n_mtp: int, where) -> MTPHead:
    if n_mtp != 1:
        raise ValueError(f"{where}: {n_mtp} MTP layers, this reference runs exactly 1")
    mtp = MTPHead(model.config).to(model.dtype)
    mtp.load_state_dict({k: v.to(model.dtype) for k, v in state.items()}, strict=True)
    return mtp.eval()


def load_with_mtp(ckpt_dir, dtype=torch.float32, attn_implementation: str = "eager"):
    """(Qwen3_5ForCausalLM, MTPHead) from a checkpoint that holds mtp.* tensors, in eval mode."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForCausalLM

    d = Path(ckpt_dir)
    model = Qwen3_5ForCausalLM.from_pretrained(str(d), dtype=dtype, attn_implementation=attn_implementation)
    state = {}
    for f in sorted(d.glob("*.safetensors")):
        state.update({k[len("mtp."):]: v for k, v in load_file(str(f)).items() if k.startswith("mtp.")})
    n_mtp = json.loads((d / "config.json").read_text()).get("mtp_num_hidden_layers", 0)
    return model.eval(), _load_mtp(model, state, n_mtp, d)


def _from_gguf(p, role: str, a: np.ndarray, hf_shape) -> np.ndarray:
    """Undo convert/qwen35.py's `transform` for `role` (GGUF values -> HF tensor)."""
    from pyqwen.convert import qwen35 as q

    def untile(x, axis, head):  # tiled V-head order back to grouped: swap the two head counts
        return q._tile_v_heads(x, axis, p.n_v_heads // p.n_k_heads, p.n_k_heads, head) if p.reorder_v else x

    qk = 2 * p.n_k_heads * p.k_head_dim
    if role == q.NORM1:
        a = a - 1
    elif role == q.A_LOG:
        a = np.log(-untile(a, 0, 1))
    elif role in (q.DT_BIAS, q.AB):
        a = untile(a, 0, 1)
    elif role == q.Z:
        a = untile(a, 0, p.v_head_dim)
    elif role == q.OUT:
        a = untile(a, 1, p.v_head_dim)
    elif role in (q.QKV, q.CONV1D):
        a = np.concatenate([a[:qk], untile(a[qk:], 0, p.v_head_dim)], axis=0)
    return a.reshape(hf_shape)


def load_gguf_with_mtp(gguf_path, config: dict, dtype=torch.float32, attn_implementation: str = "eager"):
    """(Qwen3_5ForCausalLM, MTPHead) holding a pyqwen-convert GGUF's weights, dequantized.

    `config`: the model's Qwen3_5TextConfig keys (the HF side is built from them, not from the
    GGUF's metadata, so a wrong hparam in the file cannot hide in both sides)."""
    import gguf
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from pyqwen.convert.qwen35 import expected_tensors, params_from_config

    cfg = dict(config, mtp_num_hidden_layers=1)
    p = params_from_config(cfg, "Qwen3_5ForCausalLM")
    reader = gguf.GGUFReader(str(gguf_path))
    values = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
              for t in reader.tensors}
    plan = expected_tensors(p, n_mtp=1, with_output="output.weight" in values)
    if set(values) != {m.gguf_name for m in plan.values()}:
        raise ValueError(f"{gguf_path}: tensors do not match the config (expected one MTP layer)")
    state = {name: torch.from_numpy(_from_gguf(p, m.role, values[m.gguf_name], m.hf_shape)).to(dtype)
             for name, m in plan.items()}
    hf_cfg = Qwen3_5TextConfig(**cfg)
    hf_cfg.architectures = ["Qwen3_5ForCausalLM"]
    hf_cfg._attn_implementation = attn_implementation
    model = Qwen3_5ForCausalLM(hf_cfg).to(dtype)
    main = {k: v for k, v in state.items() if not k.startswith("mtp.")}
    if p.tie_word_embeddings:
        main["lm_head.weight"] = main["model.embed_tokens.weight"]
    model.load_state_dict(main, strict=True)
    mtp = {k[len("mtp."):]: v for k, v in state.items() if k.startswith("mtp.")}
    return model.eval(), _load_mtp(model, mtp, 1, gguf_path)

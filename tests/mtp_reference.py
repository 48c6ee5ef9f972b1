"""Torch reference of the Qwen3.5 MTP (multi-token prediction) head in Qwen's `mtp.*` layout,
on top of transformers' Qwen3_5ForCausalLM.

It trains the shipped default model (pyqwen/models/training/train.py copies this file next to
itself) and is the CPU reference for its drafts. Tensors (convert/qwen35.py maps them to GGUF
`blk.{n_layer}.nextn.*` and `blk.{n_layer}.*`):

    mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden   (1+w) RMSNorms
    mtp.fc                    Linear(2H -> H) over cat[norm_e(embed(x[t+1])), norm_h(h[t])]
    mtp.layers.0.*            one full-attention decoder layer, the main model's module type
    mtp.norm                  (1+w) RMSNorm; the shared lm_head turns it into logits for x[t+2]

h[t] is the main model's hidden state after its final norm (the row that feeds lm_head). A
chained draft feeds the head's own output (after mtp.norm) back as the next h, as llama.cpp's
qwen35 MTP graph does. Rotary positions are the main model's: the row pairing h[t] with x[t+1]
sits at position t+1.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn


class MTPHead(nn.Module):
    def __init__(self, config):
        """`config`: the main model's Qwen3_5TextConfig."""
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        h, eps = config.hidden_size, config.rms_norm_eps
        layer_cfg = copy.deepcopy(config)
        layer_cfg.num_hidden_layers = 1
        layer_cfg.layer_types = ["full_attention"]
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_cfg, 0)])
        self.norm = Qwen3_5RMSNorm(h, eps=eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        """embeds[:, i] = embed(x[t+1]), hidden[:, i] = h[t] for the rows i of one causal
        sequence; returns the normed MTP hidden states (logits = lm_head of them)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        x = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(x)


def rope(model, x: torch.Tensor, positions: torch.Tensor):
    """The main model's (cos, sin) for `positions` [B, T] (text-only: all mrope sections equal)."""
    return model.model.rotary_emb(x, positions[None].expand(3, -1, -1))


def mtp_logits(model, mtp: MTPHead, hidden: torch.Tensor, next_ids: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
    """Logits for x[t+2] from h[t] (hidden) and x[t+1] (next_ids) at positions t+1."""
    embeds = model.model.embed_tokens(next_ids)
    out = mtp(embeds, hidden, rope(model, embeds, positions))
    return model.lm_head(out)


def load_with_mtp(ckpt_dir, dtype=torch.float32, attn_implementation: str = "eager"):
    """(Qwen3_5ForCausalLM, MTPHead) from a checkpoint that holds mtp.* tensors, in eval mode."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForCausalLM

    d = Path(ckpt_dir)
    model = Qwen3_5ForCausalLM.from_pretrained(str(d), dtype=dtype, attn_implementation=attn_implementation)
    mtp = MTPHead(model.config).to(dtype)
    state = {}
    for f in sorted(d.glob("*.safetensors")):
        state.update({k[len("mtp."):]: v for k, v in load_file(str(f)).items() if k.startswith("mtp.")})
    mtp.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    n_mtp = json.loads((d / "config.json").read_text()).get("mtp_num_hidden_layers", 0)
    if n_mtp != 1:
        raise ValueError(f"{d}: mtp_num_hidden_layers is {n_mtp}, this reference runs exactly 1")
    return model.eval(), mtp.eval()

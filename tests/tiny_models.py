"""Tiny random Qwen3.5 checkpoints for tests.

`make_tiny_qwen35(dst_dir)` builds a `Qwen3_5ForCausalLM` from a tiny
`Qwen3_5TextConfig` (hidden 64, 4 layers = 3 linear + 1 full attention,
4 q / 2 kv heads of dim 16, 2 k / 4 v linear heads of dim 16, ffn 128,
vocab = the tiny tokenizer's), fills every parameter from a seeded numpy RNG
(norms, A_log and dt_bias included, so no tensor keeps its init constant),
and writes it with `save_pretrained` plus the tiny tokenizer.

Options: `with_mtp` adds random `mtp.*` tensors in Qwen's layout and
`mtp_num_hidden_layers: 1`; `max_shard_size` splits the weights into
`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`;
`layout="conditional_generation"` rewrites the checkpoint the way the
multimodal Qwen3.5 releases ship it (nested text_config,
`model.language_model.*` keys, a few `model.visual.*` tensors);
`dtype` picks the stored float type. Same arguments, same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tiny_vocab import write_tiny_tokenizer

TINY_VOCAB_SIZE = 1024

TINY_CONFIG: dict = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    # real Qwen3.5 style: partial rotary, interleaved mrope (sections sum to rot/2)
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
    "eos_token_id": TINY_VOCAB_SIZE - 33 + 2,  # <|im_end|>
    "pad_token_id": TINY_VOCAB_SIZE - 33,  # <|endoftext|>
}


def _rand_param(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    leaf = name.rsplit(".", 2)
    if name.endswith("A_log"):
        # HF init is log(U(0,16)); use a different, still sane range
        return np.log(rng.uniform(0.5, 12.0, shape)).astype(np.float32)
    if name.endswith("dt_bias"):
        return rng.normal(0.0, 0.5, shape).astype(np.float32)
    if name.endswith("linear_attn.norm.weight"):
        # plain w (no +1 in the model): keep it around 1
        return rng.uniform(0.6, 1.4, shape).astype(np.float32)
    if name.endswith("norm.weight") or "norm_" in leaf[-2]:
        # (1+w) norms: HF inits w = 0
        return rng.uniform(-0.4, 0.4, shape).astype(np.float32)
    if name.endswith("conv1d.weight"):
        return rng.normal(0.0, 0.5, shape).astype(np.float32)
    if "embed_tokens" in name:
        return rng.normal(0.0, 1.0, shape).astype(np.float32)
    fan_in = shape[-1]
    return rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape).astype(np.float32)


def tiny_config(**overrides) -> dict:
    """The tiny text config (plain dict) with `overrides` applied."""
    cfg = json.loads(json.dumps(TINY_CONFIG))
    for k, v in overrides.items():
        cfg[k] = v
    return cfg


def _mtp_tensors(rng: np.random.Generator, cfg: dict) -> dict[str, np.ndarray]:
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv, ff = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    shapes = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,),
        "mtp.layers.0.input_layernorm.weight": (h,),
        "mtp.layers.0.post_attention_layernorm.weight": (h,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * nh * hd, h),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.o_proj.weight": (h, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.mlp.gate_proj.weight": (ff, h),
        "mtp.layers.0.mlp.up_proj.weight": (ff, h),
        "mtp.layers.0.mlp.down_proj.weight": (h, ff),
    }
    return {k: _rand_param(rng, k, s) for k, s in sorted(shapes.items())}


def _visual_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {
        "model.visual.patch_embed.proj.weight": (32, 3, 2, 4, 4),
        "model.visual.blocks.0.attn.qkv.weight": (96, 32),
        "model.visual.blocks.0.attn.qkv.bias": (96,),
        "model.visual.merger.linear_fc2.weight": (64, 128),
    }
    return {k: rng.normal(0.0, 0.1, s).astype(np.float32) for k, s in shapes.items()}


def read_tensors(model_dir) -> dict[str, np.ndarray]:
    """All tensors of a (possibly sharded) checkpoint as float32 numpy arrays."""
    import torch
    from safetensors.torch import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            out[k] = v.to(torch.float32).numpy()
    return out


def _save(tensors: dict[str, np.ndarray], path: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)).to(tdt) for k, v in tensors.items()},
              str(path), metadata={"format": "pt"})


def shard_checkpoint(model_dir, max_shard_size: int) -> list[Path]:
    """Split `model_dir/model.safetensors` into shards of at most `max_shard_size`
    bytes (a tensor bigger than that gets a shard of its own), in sorted name
    order, and write `model.safetensors.index.json`. Returns the shard paths."""
    from safetensors.torch import load_file, save_file

    d = Path(model_dir)
    single = d / "model.safetensors"
    tensors = {k: v for k, v in sorted(load_file(str(single)).items())}
    groups: list[dict] = [{}]
    size = 0
    for k, v in tensors.items():
        nb = v.numel() * v.element_size()
        if groups[-1] and size + nb > max_shard_size:
            groups.append({})
            size = 0
        groups[-1][k] = v
        size += nb
    n = len(groups)
    weight_map: dict[str, str] = {}
    paths = []
    total = 0
    for i, g in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(g, str(d / fname), metadata={"format": "pt"})
        paths.append(d / fname)
        for k, v in g.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    single.unlink()
    return paths


def _to_conditional_generation(d: Path, rng: np.random.Generator, dtype: str) -> None:
    cfg = json.loads((d / "config.json").read_text())
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "dtype")}
    text["model_type"] = "qwen3_5_text"
    top = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": 1000,
        "video_token_id": 1001,
        "vision_start_token_id": 1002,
        "vision_end_token_id": 1003,
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
        "text_config": text,
        "vision_config": {
            "model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
            "num_heads": 2, "out_hidden_size": cfg["hidden_size"], "patch_size": 4,
            "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
        },
        "transformers_version": cfg.get("transformers_version"),
    }
    (d / "config.json").write_text(json.dumps(top, indent=2) + "\n")
    tensors = read_tensors(d)
    renamed = {}
    for k, v in tensors.items():
        if k.startswith("model."):
            k = "model.language_model." + k[len("model."):]
        renamed[k] = v
    renamed.update(_visual_tensors(rng))
    _save(dict(sorted(renamed.items())), d / "model.safetensors", dtype)


def _save_random(model_cls, config, seed: int, dst: Path) -> np.random.Generator:
    """Instantiate `model_cls(config)`, fill every parameter from a seeded RNG (see
    _rand_param), save it with the tiny tokenizer; returns the RNG for further tensors."""
    import torch

    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(torch.from_numpy(_rand_param(rng, name, tuple(p.shape))))
    model.save_pretrained(str(dst))
    write_tiny_tokenizer(dst, vocab_size=config.vocab_size)
    return rng


def make_tiny_qwen35(dst_dir, *, seed: int = 0, with_mtp: bool = False, max_shard_size: int | None = None,
                     layout: str = "causal_lm", dtype: str = "float32", **config_overrides) -> Path:
    """Write a tiny random Qwen3.5 checkpoint (+ tiny tokenizer) to `dst_dir`.

    `config_overrides` replace keys of the text config (see TINY_CONFIG), e.g.
    `tie_word_embeddings=True` or `intermediate_size=80`.
    """
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if layout not in ("causal_lm", "conditional_generation"):
        raise ValueError(f"unknown layout {layout!r}")
    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    cfg_dict = tiny_config(**config_overrides)
    if with_mtp:
        cfg_dict["mtp_num_hidden_layers"] = 1
    config = Qwen3_5TextConfig(**cfg_dict)
    config.architectures = ["Qwen3_5ForCausalLM"]
    rng = _save_random(Qwen3_5ForCausalLM, config, seed, dst)

    need_rewrite = with_mtp or dtype != "float32"
    if need_rewrite:
        tensors = read_tensors(dst)
        if with_mtp:
            tensors.update(_mtp_tensors(rng, cfg_dict))
        cfg = json.loads((dst / "config.json").read_text())
        cfg["dtype"] = dtype
        (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        _save(dict(sorted(tensors.items())), dst / "model.safetensors", dtype)
    if layout == "conditional_generation":
        _to_conditional_generation(dst, rng, dtype)
    if max_shard_size is not None:
        shard_checkpoint(dst, max_shard_size)
    return dst


MOE_CONFIG: dict = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "shared_expert_intermediate_size": 48}


def make_tiny_moe(dst_dir, *, variant: str, seed: int = 0, with_mtp: bool = False, fused_experts: bool = False,
                  **config_overrides) -> Path:
    """A tiny random Qwen3.5-MoE (`variant="qwen35moe"`) or Qwen3-Next (`"qwen3next"`) checkpoint:
    the tiny config plus 4 experts of width 32 (2 per token) and a shared expert of width 48.

    transformers saves the experts one by one (`mlp.experts.{e}.gate_proj.weight`, ...);
    `fused_experts` rewrites them the way Qwen3.5-MoE releases store them (`mlp.experts.gate_up_proj`
    [E, 2I, H], `mlp.experts.down_proj` [E, H, I]). `with_mtp` adds an MTP head whose layer is a copy
    of the model's full-attention layer layout (MoE MLP included) with its own random values."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3NextConfig, Qwen3NextForCausalLM

    config_cls, model_cls = {"qwen35moe": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM),
                             "qwen3next": (Qwen3NextConfig, Qwen3NextForCausalLM)}[variant]
    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    cfg_dict = {**tiny_config(**config_overrides), **MOE_CONFIG}
    if variant == "qwen3next":
        cfg_dict["intermediate_size"] = 96  # unused by the MoE layers, written as feed_forward_length
        cfg_dict["rope_parameters"] = {k: v for k, v in cfg_dict["rope_parameters"].items()
                                       if k in ("rope_type", "rope_theta", "partial_rotary_factor")}
    else:
        cfg_dict.pop("intermediate_size")
    if with_mtp and variant == "qwen35moe":
        cfg_dict["mtp_num_hidden_layers"] = 1
    config = config_cls(**cfg_dict)
    config.architectures = [model_cls.__name__]
    rng = _save_random(model_cls, config, seed, dst)

    tensors = read_tensors(dst)
    if with_mtp:
        full = config.layer_types.index("full_attention")
        pre = f"model.layers.{full}."
        h = cfg_dict["hidden_size"]
        mtp = {"mtp.layers.0." + k[len(pre):]: v.shape for k, v in tensors.items() if k.startswith(pre)}
        mtp.update({"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                    "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)})
        tensors.update({k: _rand_param(rng, k, tuple(s)) for k, s in sorted(mtp.items())})
    if fused_experts:
        n_exp = cfg_dict["num_experts"]
        blocks = sorted({k.split(".mlp.experts.")[0] for k in tensors if ".mlp.experts." in k})
        for b in blocks:
            e = [f"{b}.mlp.experts.{i}." for i in range(n_exp)]
            gate_up = [np.concatenate([tensors.pop(p + "gate_proj.weight"), tensors.pop(p + "up_proj.weight")]) for p in e]
            tensors[f"{b}.mlp.experts.gate_up_proj"] = np.stack(gate_up)
            tensors[f"{b}.mlp.experts.down_proj"] = np.stack([tensors.pop(p + "down_proj.weight") for p in e])
    _save(dict(sorted(tensors.items())), dst / "model.safetensors", "float32")
    return dst

"""The Qwen3.5 / Qwen3-Next family -> GGUF, as llama.cpp's converter writes it
(conversion/qwen.py: Qwen3_5TextModel, Qwen3_5MoeTextModel, Qwen3NextModel).

Three variants of one hybrid model (Gated DeltaNet linear attention in most
layers, gated full attention every `full_attention_interval`-th, MTP head):
- `qwen35`: dense MLP;
- `qwen35moe`: routed experts (fused `mlp.experts.gate_up_proj` [E, 2I, H] and
  `down_proj` [E, H, I], or per-expert `mlp.experts.{e}.*_proj`) plus a gated
  shared expert;
- `qwen3next`: the qwen35moe MLP, with the older fused linear-attention
  projections `in_proj_qkvz` (per K head: q, k, v, z) and `in_proj_ba`, no V
  head reordering and no MRoPE.

Name map, expected HF shapes, tensor transforms and hparams live here; the
generic plan/write machinery is in plan.py and core.py.

Transforms (llama.cpp):
- linear_attn.A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias
- conv1d [C, 1, K] squeezed to [C, K]
- (1+w) RMSNorm weights get +1 (every norm except linear_attn.norm)
- qwen35/qwen35moe: V heads reordered from grouped-by-K-head to tiled order
  (when the linear K and V head counts differ): the v rows of in_proj_qkv,
  the rows of in_proj_z/a/b, A_log, dt_bias, the v channels of conv1d and
  the columns of out_proj
- qwen3next: in_proj_qkvz split into attn_qkv (all q, all k, all v) and
  attn_gate (all z); in_proj_ba kept as ssm_ba
- experts stacked / split into ffn_{gate,up,down}_exps [E, ..]
- q_proj stays as is (per head: query rows, then gate rows)
- mtp.* -> blk.{n_layer + i}.* with nextn names
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from .errors import ConversionError
from .layouts import SourceTensor, select_source, stack_sources

# HF architecture -> variant (llama.cpp architecture name)
HF_ARCHITECTURES: dict[str, str] = {
    "Qwen3_5ForCausalLM": "qwen35",
    "Qwen3_5ForConditionalGeneration": "qwen35",
    "Qwen3_5MoeForCausalLM": "qwen35moe",
    "Qwen3_5MoeForConditionalGeneration": "qwen35moe",
    "Qwen3NextForCausalLM": "qwen3next",
}
MOE_VARIANTS = ("qwen35moe", "qwen3next")

# transformers config defaults (keys a saved config may omit), per variant
_COMMON_DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen35": {**_COMMON_DEFAULTS, "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
               "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4},
    "qwen35moe": {**_COMMON_DEFAULTS, "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
                  "num_attention_heads": 16, "num_key_value_heads": 2, "num_experts": 256,
                  "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
    "qwen3next": {**_COMMON_DEFAULTS, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                  "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                  "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                  "shared_expert_intermediate_size": 512},
}
DEFAULT_MROPE_SECTION = [11, 11, 10, 0]  # llama.cpp writes this for qwen35* when the config has none

# tensor roles: which transform a tensor gets
NONE, NORM1, A_LOG, DT_BIAS, CONV1D, QKV, Z, AB, OUT = (
    "none", "norm+1", "a_log", "dt_bias", "conv1d", "qkv", "z", "ab", "out")
# transforms that only move values (they apply to quantized codes and scales alike) ...
PERMUTATION_ROLES = frozenset({NONE, DT_BIAS, CONV1D, QKV, Z, AB, OUT})
# ... and those that keep every row to itself (so a tensor can be streamed by rows)
ROW_LOCAL_ROLES = frozenset({NONE, NORM1, OUT})


@dataclass(frozen=True)
class Params:
    """Resolved text hparams (config.json + transformers defaults)."""

    arch: str  # qwen35 | qwen35moe | qwen3next
    hparams: dict[str, Any]  # merged {**defaults, **top, **text_config}, as llama.cpp sees them
    n_vocab: int
    n_embd: int
    n_ff: int | None  # dense MLP width (qwen35moe has none)
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx: int
    rms_eps: float
    conv_kernel: int
    k_head_dim: int
    v_head_dim: int
    n_k_heads: int
    n_v_heads: int
    layer_types: tuple[str, ...]
    full_attention_interval: int
    rope: dict[str, Any]
    partial_rotary_factor: float
    tie_word_embeddings: bool
    n_mtp_config: int
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0

    @property
    def moe(self) -> bool:
        return self.arch in MOE_VARIANTS

    @property
    def qkv_dim(self) -> int:
        return 2 * self.n_k_heads * self.k_head_dim + self.n_v_heads * self.v_head_dim

    @property
    def v_dim(self) -> int:
        return self.n_v_heads * self.v_head_dim

    @property
    def reorder_v(self) -> bool:
        return self.arch != "qwen3next" and self.n_k_heads != self.n_v_heads


def _int(h: dict, key: str) -> int:
    v = h.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConversionError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def params_from_config(config: dict[str, Any], hf_arch: str) -> Params:
    arch = HF_ARCHITECTURES[hf_arch]
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConversionError("config.json: text_config must be an object")
    h = {**DEFAULTS[arch], **config, **(text or {})}

    n_layer = _int(h, "num_hidden_layers")
    interval = h.get("full_attention_interval", 4)
    layer_types = h.get("layer_types")
    if layer_types is None:
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layer)]
    if not isinstance(layer_types, list) or len(layer_types) != n_layer:
        raise ConversionError(f"config.json: layer_types has {len(layer_types) if isinstance(layer_types, list) else '?'} "
                              f"entries, expected num_hidden_layers ({n_layer})")
    for t in layer_types:
        if t not in ("linear_attention", "full_attention"):
            raise ConversionError(f"config.json: unknown layer type {t!r} in layer_types")
    if h.get("attn_output_gate", True) is not True:
        raise ConversionError(f"config.json: attn_output_gate=false is not supported (llama.cpp {arch} needs the "
                              "gated q_proj)")
    if arch in MOE_VARIANTS:
        if h.get("mlp_only_layers") or h.get("decoder_sparse_step", 1) != 1:
            raise ConversionError(f"config.json: dense layers in a MoE model (mlp_only_layers / decoder_sparse_step) "
                                  f"are not supported by llama.cpp {arch}")
    elif h.get("num_experts") or h.get("num_local_experts"):
        raise ConversionError(f"config.json: num_experts is set but architectures says {hf_arch} (dense); "
                              "MoE checkpoints are Qwen3_5MoeForCausalLM / Qwen3_5MoeForConditionalGeneration")

    # rope: same fallbacks as llama.cpp's TextModel (rope_parameters, then rope_scaling, then flat keys)
    rope = dict(h.get("rope_parameters") or h.get("rope_scaling") or {})
    if "rope_theta" not in rope:
        rope["rope_theta"] = h.get("rope_theta", 10000.0)
    if "partial_rotary_factor" not in rope and "partial_rotary_factor" in h:
        rope["partial_rotary_factor"] = h["partial_rotary_factor"]
    if "rope_type" not in rope and "type" in rope:
        rope["rope_type"] = rope["type"]

    moe = {}
    if arch in MOE_VARIANTS:
        moe = dict(n_expert=_int(h, "num_experts"), n_expert_used=_int(h, "num_experts_per_tok"),
                   n_ff_exp=_int(h, "moe_intermediate_size"), n_ff_shexp=_int(h, "shared_expert_intermediate_size"))
    p = Params(
        arch=arch,
        hparams=h,
        n_vocab=_int(h, "vocab_size"),
        n_embd=_int(h, "hidden_size"),
        n_ff=_int(h, "intermediate_size") if "intermediate_size" in h else None,
        n_layer=n_layer,
        n_head=_int(h, "num_attention_heads"),
        n_head_kv=_int(h, "num_key_value_heads"),
        head_dim=_int(h, "head_dim"),
        n_ctx=_int(h, "max_position_embeddings"),
        rms_eps=float(h["rms_norm_eps"]),
        conv_kernel=_int(h, "linear_conv_kernel_dim"),
        k_head_dim=_int(h, "linear_key_head_dim"),
        v_head_dim=_int(h, "linear_value_head_dim"),
        n_k_heads=_int(h, "linear_num_key_heads"),
        n_v_heads=_int(h, "linear_num_value_heads"),
        layer_types=tuple(layer_types),
        full_attention_interval=int(interval),
        rope=rope,
        partial_rotary_factor=float(rope.get("partial_rotary_factor", 0.25)),
        tie_word_embeddings=bool(h.get("tie_word_embeddings", False)),
        n_mtp_config=int(h.get("mtp_num_hidden_layers", 0) or 0),
        **moe,
    )
    if arch == "qwen35" and p.n_ff is None:
        raise ConversionError("config.json: intermediate_size must be a positive integer, got None")
    if p.n_v_heads % p.n_k_heads:
        raise ConversionError(f"config.json: linear_num_value_heads ({p.n_v_heads}) is not a multiple of "
                              f"linear_num_key_heads ({p.n_k_heads})")
    if p.k_head_dim != p.v_head_dim:
        raise ConversionError(f"config.json: linear_key_head_dim ({p.k_head_dim}) != linear_value_head_dim "
                              f"({p.v_head_dim}) is not supported by llama.cpp {arch}")
    if p.n_head % p.n_head_kv:
        raise ConversionError(f"config.json: num_attention_heads ({p.n_head}) is not a multiple of "
                              f"num_key_value_heads ({p.n_head_kv})")
    return p


# --- names -------------------------------------------------------------------

# per-layer HF suffix -> (gguf suffix, role)
_LAYER_MAP: dict[str, tuple[str, str]] = {
    "input_layernorm.weight":             ("attn_norm.weight",           NORM1),
    "post_attention_layernorm.weight":    ("post_attention_norm.weight", NORM1),
    "mlp.gate_proj.weight":               ("ffn_gate.weight",            NONE),
    "mlp.up_proj.weight":                 ("ffn_up.weight",              NONE),
    "mlp.down_proj.weight":               ("ffn_down.weight",            NONE),
    "mlp.gate.weight":                    ("ffn_gate_inp.weight",        NONE),
    "mlp.experts.gate_proj.weight":       ("ffn_gate_exps.weight",       NONE),
    "mlp.experts.up_proj.weight":         ("ffn_up_exps.weight",         NONE),
    "mlp.experts.down_proj.weight":       ("ffn_down_exps.weight",       NONE),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight",      NONE),
    "mlp.shared_expert.up_proj.weight":   ("ffn_up_shexp.weight",        NONE),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight",      NONE),
    "mlp.shared_expert_gate.weight":      ("ffn_gate_inp_shexp.weight",  NONE),
    "linear_attn.in_proj_qkv.weight":     ("attn_qkv.weight",            QKV),
    "linear_attn.in_proj_z.weight":       ("attn_gate.weight",           Z),
    "linear_attn.in_proj_a.weight":       ("ssm_alpha.weight",           AB),
    "linear_attn.in_proj_b.weight":       ("ssm_beta.weight",            AB),
    "linear_attn.in_proj_ba.weight":      ("ssm_ba.weight",              NONE),
    "linear_attn.A_log":                  ("ssm_a",                      A_LOG),
    "linear_attn.dt_bias":                ("ssm_dt.bias",                DT_BIAS),
    "linear_attn.conv1d.weight":          ("ssm_conv1d.weight",          CONV1D),
    "linear_attn.norm.weight":            ("ssm_norm.weight",            NONE),  # plain w, no +1
    "linear_attn.out_proj.weight":        ("ssm_out.weight",             OUT),
    "self_attn.q_proj.weight":            ("attn_q.weight",              NONE),
    "self_attn.k_proj.weight":            ("attn_k.weight",              NONE),
    "self_attn.v_proj.weight":            ("attn_v.weight",              NONE),
    "self_attn.o_proj.weight":            ("attn_output.weight",         NONE),
    "self_attn.q_norm.weight":            ("attn_q_norm.weight",         NORM1),
    "self_attn.k_norm.weight":            ("attn_k_norm.weight",         NORM1),
}
# mtp.<x> -> blk.{n_layer}.<gguf>
_MTP_MAP: dict[str, tuple[str, str]] = {
    "fc.weight":                    ("nextn.eh_proj.weight",          NONE),
    "pre_fc_norm_embedding.weight": ("nextn.enorm.weight",            NORM1),
    "pre_fc_norm_hidden.weight":    ("nextn.hnorm.weight",            NORM1),
    "norm.weight":                  ("nextn.shared_head_norm.weight", NORM1),
}

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MTP_LAYER_RE = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_BLOCK_RE = re.compile(r"^((?:model|mtp)\.layers\.\d+)\.(.+)$")
_EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def canonical_name(name: str) -> str | None:
    """Stored HF name -> the CausalLM-style name used below; None to skip
    (vision tower, rotary caches)."""
    if name.endswith((".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")):
        return None
    if "visual." in name or "vision." in name or name.startswith(("vision_tower.", "vision_model.")):
        return None
    if name.startswith("model.language_model."):
        name = "model." + name[len("model.language_model."):]
    if name.startswith("model.mtp."):
        name = name[len("model."):]
    return name


def is_mtp(canonical: str) -> bool:
    return canonical.startswith("mtp.")


def mtp_layer_count(canonicals) -> int:
    n = 0
    for c in canonicals:
        m = _MTP_LAYER_RE.match(c)
        if m:
            n = max(n, int(m.group(1)) + 1)
        elif is_mtp(c):
            n = max(n, 1)
    return n


def group_sources(p: Params, sources: dict[str, SourceTensor]) -> dict[str, SourceTensor]:
    """Stored tensors -> the tensors expected_tensors() names: per-expert weights
    stacked, fused experts split into gate and up, qwen3next's in_proj_qkvz split
    into in_proj_qkv and in_proj_z. Order: where the first stored part was."""
    out: dict[str, SourceTensor] = {}
    experts: dict[str, dict[int, SourceTensor]] = {}
    for name, src in sources.items():
        m = _BLOCK_RE.match(name)
        block, suf = (m.group(1), m.group(2)) if m else ("", name)
        e = _EXPERT_RE.match(suf) if p.moe else None
        if e:
            key = f"{block}.mlp.experts.{e.group(2)}.weight"
            if int(e.group(1)) >= p.n_expert:
                raise ConversionError(f"tensor {name!r} in {src.files}: expert {e.group(1)} >= num_experts "
                                      f"({p.n_expert})")
            experts.setdefault(key, {})[int(e.group(1))] = src
            out.setdefault(key, src)  # placeholder, keeps the position
        elif p.moe and suf in ("mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj.weight"):
            E, I, H = p.n_expert, p.n_ff_exp, p.n_embd
            if tuple(src.shape) != (E, 2 * I, H):
                raise ConversionError(f"tensor {name!r} in {src.files} has shape {list(src.shape)}, expected "
                                      f"{[E, 2 * I, H]} from config.json")
            for half, sl in (("gate_proj", slice(0, I)), ("up_proj", slice(I, 2 * I))):
                key = f"{block}.mlp.experts.{half}.weight"
                out[key] = select_source(src, key, (E, I, H), lambda a, sl=sl: a[:, sl], row_local=True)
        elif p.moe and suf == "mlp.experts.down_proj":
            out[f"{name}.weight"] = src
        elif p.arch == "qwen3next" and suf == "linear_attn.in_proj_qkvz.weight":
            qkv_rows, z_rows = _qkvz_rows(p)
            if tuple(src.shape) != (len(qkv_rows) + len(z_rows), p.n_embd):
                raise ConversionError(f"tensor {name!r} in {src.files} has shape {list(src.shape)}, expected "
                                      f"{[len(qkv_rows) + len(z_rows), p.n_embd]} from config.json")
            for part, rows in (("in_proj_qkv", qkv_rows), ("in_proj_z", z_rows)):
                key = f"{block}.linear_attn.{part}.weight"
                out[key] = select_source(src, key, (len(rows), p.n_embd), lambda a, rows=rows: a[rows],
                                         row_local=False)
        else:
            out[name] = src
    for key, parts in experts.items():
        missing = [e for e in range(p.n_expert) if e not in parts]
        if missing:
            proj = key.rsplit(".", 2)[-2]
            raise ConversionError(f"missing tensor '{key.rsplit('.mlp.', 1)[0]}.mlp.experts.{missing[0]}.{proj}.weight'"
                                  f"{f' (and {len(missing) - 1} more experts)' if len(missing) > 1 else ''}: "
                                  f"config.json has num_experts={p.n_expert}")
        out[key] = stack_sources(key, [parts[e] for e in range(p.n_expert)])
    return out


def _qkvz_rows(p: Params) -> tuple[np.ndarray, np.ndarray]:
    """Rows of qwen3next's in_proj_qkvz (per K head: q, k, v, z) that make up
    [all q; all k; all v] and [all z]."""
    dk, vr = p.k_head_dim, p.n_v_heads // p.n_k_heads * p.v_head_dim
    per = 2 * dk + 2 * vr
    heads = np.arange(p.n_k_heads)[:, None] * per

    def part(start, size):
        return (heads + start + np.arange(size)).reshape(-1)

    return np.concatenate([part(0, dk), part(dk, dk), part(2 * dk, vr)]), part(2 * dk + vr, vr)


def _layer_shapes(p: Params, kind: str) -> dict[str, tuple[int, ...]]:
    H = p.n_embd
    s: dict[str, tuple[int, ...]] = {
        "input_layernorm.weight": (H,),
        "post_attention_layernorm.weight": (H,),
    }
    if p.moe:
        E, I, S = p.n_expert, p.n_ff_exp, p.n_ff_shexp
        s.update({
            "mlp.gate.weight": (E, H),
            "mlp.experts.gate_proj.weight": (E, I, H),
            "mlp.experts.up_proj.weight": (E, I, H),
            "mlp.experts.down_proj.weight": (E, H, I),
            "mlp.shared_expert.gate_proj.weight": (S, H),
            "mlp.shared_expert.up_proj.weight": (S, H),
            "mlp.shared_expert.down_proj.weight": (H, S),
            "mlp.shared_expert_gate.weight": (1, H),
        })
    else:
        s.update({
            "mlp.gate_proj.weight": (p.n_ff, H),
            "mlp.up_proj.weight": (p.n_ff, H),
            "mlp.down_proj.weight": (H, p.n_ff),
        })
    if kind == "linear":
        s.update({
            "linear_attn.in_proj_qkv.weight": (p.qkv_dim, H),
            "linear_attn.in_proj_z.weight": (p.v_dim, H),
            "linear_attn.A_log": (p.n_v_heads,),
            "linear_attn.dt_bias": (p.n_v_heads,),
            "linear_attn.conv1d.weight": (p.qkv_dim, 1, p.conv_kernel),
            "linear_attn.norm.weight": (p.v_head_dim,),
            "linear_attn.out_proj.weight": (H, p.v_dim),
        })
        if p.arch == "qwen3next":
            s["linear_attn.in_proj_ba.weight"] = (2 * p.n_v_heads, H)
        else:
            s["linear_attn.in_proj_a.weight"] = (p.n_v_heads, H)
            s["linear_attn.in_proj_b.weight"] = (p.n_v_heads, H)
    else:
        q = p.n_head * p.head_dim
        kv = p.n_head_kv * p.head_dim
        s.update({
            "self_attn.q_proj.weight": (2 * q, H),  # query + gate rows, interleaved per head
            "self_attn.k_proj.weight": (kv, H),
            "self_attn.v_proj.weight": (kv, H),
            "self_attn.o_proj.weight": (H, q),
            "self_attn.q_norm.weight": (p.head_dim,),
            "self_attn.k_norm.weight": (p.head_dim,),
        })
    return s


@dataclass(frozen=True)
class Mapped:
    gguf_name: str
    role: str
    hf_shape: tuple[int, ...]


def expected_tensors(p: Params, *, n_mtp: int, with_output: bool) -> dict[str, Mapped]:
    """Every canonical HF tensor (after group_sources) the model needs -> GGUF
    name, role, HF shape. Order is irrelevant here (the writer keeps the
    checkpoint's order)."""
    H, V = p.n_embd, p.n_vocab
    out: dict[str, Mapped] = {
        "model.embed_tokens.weight": Mapped("token_embd.weight", NONE, (V, H)),
        "model.norm.weight": Mapped("output_norm.weight", NORM1, (H,)),
    }
    if with_output:
        out["lm_head.weight"] = Mapped("output.weight", NONE, (V, H))
    for i, t in enumerate(p.layer_types):
        kind = "linear" if t == "linear_attention" else "full"
        for suf, shape in _layer_shapes(p, kind).items():
            g, role = _LAYER_MAP[suf]
            out[f"model.layers.{i}.{suf}"] = Mapped(f"blk.{i}.{g}", role, shape)
    for j in range(n_mtp):
        bid = p.n_layer + j
        for suf, shape in _layer_shapes(p, "full").items():
            g, role = _LAYER_MAP[suf]
            out[f"mtp.layers.{j}.{suf}"] = Mapped(f"blk.{bid}.{g}", role, shape)
    if n_mtp:
        shapes = {"fc.weight": (H, 2 * H), "pre_fc_norm_embedding.weight": (H,),
                  "pre_fc_norm_hidden.weight": (H,), "norm.weight": (H,)}
        for suf, (g, role) in _MTP_MAP.items():
            out[f"mtp.{suf}"] = Mapped(f"blk.{p.n_layer}.{g}", role, shapes[suf])
    return out


def explain_unmapped(p: Params, canonical: str, n_mtp: int) -> str:
    """Why `canonical` has no place in the model (for the error message)."""
    m = _LAYER_RE.match(canonical)
    if m:
        i, suf = int(m.group(1)), m.group(2)
        if i >= p.n_layer:
            return f"layer {i} >= num_hidden_layers ({p.n_layer})"
        kind = "linear" if p.layer_types[i] == "linear_attention" else "full"
        other = "full" if kind == "linear" else "linear"
        if suf in _layer_shapes(p, other):
            return f"layer {i} is {p.layer_types[i]} (layer_types) but this is a {other}-attention tensor"
    m = _MTP_LAYER_RE.match(canonical)
    if m and int(m.group(1)) >= n_mtp:
        return f"MTP layer {m.group(1)} >= mtp_num_hidden_layers ({n_mtp})"
    return f"no llama.cpp {p.arch} tensor for it"


# --- transforms --------------------------------------------------------------

def _tile_v_heads(a: np.ndarray, axis: int, n_k: int, per_k: int, head: int) -> np.ndarray:
    """Grouped V-head order [k0v0 k0v1 .. k1v0 ..] -> tiled [k0v0 k1v0 .. k0v1 ..] along axis."""
    shape = a.shape
    b = a.reshape(shape[:axis] + (n_k, per_k, head) + shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(b, axis, axis + 1)).reshape(shape)


def _neg_exp(a: np.ndarray) -> np.ndarray:
    # llama.cpp computes -torch.exp(A_log); use the same kernel when torch is
    # importable so ssm_a is bit-identical, else a correctly rounded numpy exp
    try:
        import torch
    except ImportError:
        return (-np.exp(a.astype(np.float64))).astype(a.dtype)
    return (-torch.exp(torch.from_numpy(np.ascontiguousarray(a)))).numpy()


def transform(p: Params, role: str, a: np.ndarray) -> np.ndarray:
    """Apply llama.cpp's transform for `role` to one whole HF tensor (compute
    dtype: F32, or F16 for F16 checkpoints). The PERMUTATION_ROLES only move
    values, so they take integer codes and per-element scales too."""
    nk, nv, dv = p.n_k_heads, p.n_v_heads, p.v_head_dim
    r = nv // nk
    tile = p.reorder_v
    if role == NONE:
        return a
    if role == NORM1:
        return a + a.dtype.type(1)
    if role == QKV:
        if not tile:
            return a
        qk = 2 * nk * p.k_head_dim
        return np.concatenate([a[:qk], _tile_v_heads(a[qk:], 0, nk, r, dv)], axis=0)
    if role == Z:
        return _tile_v_heads(a, 0, nk, r, dv) if tile else a
    if role == AB:
        return _tile_v_heads(a, 0, nk, r, 1) if tile else a
    if role == OUT:
        return _tile_v_heads(a, 1, nk, r, dv) if tile else a
    if role == DT_BIAS:
        return _tile_v_heads(a, 0, nk, r, 1) if tile else a
    if role == A_LOG:
        return _neg_exp(_tile_v_heads(a, 0, nk, r, 1) if tile else a)
    if role == CONV1D:
        a = a.reshape(a.shape[0], a.shape[-1])  # [C, 1, K] -> [C, K]
        if not tile:
            return a
        qk = 2 * nk * p.k_head_dim
        return np.concatenate([a[:qk], _tile_v_heads(a[qk:], 0, nk, r, dv)], axis=0)
    raise AssertionError(role)


def output_shape(role: str, hf_shape: tuple[int, ...]) -> tuple[int, ...]:
    if role == CONV1D:
        return (hf_shape[0], hf_shape[-1])
    return hf_shape


# --- metadata ----------------------------------------------------------------

def gguf_hparams(p: Params, *, n_mtp: int, file_type: int) -> list[tuple[str, VT, Any]]:
    """The <arch>.* keys (and general.file_type), in llama.cpp's order."""
    a = p.arch
    h = p.hparams
    kv: list[tuple[str, VT, Any]] = [
        (f"{a}.block_count", VT.UINT32, p.n_layer + n_mtp),
        (f"{a}.context_length", VT.UINT32, p.n_ctx),
        (f"{a}.embedding_length", VT.UINT32, p.n_embd),
    ]
    if p.n_ff is not None:
        kv.append((f"{a}.feed_forward_length", VT.UINT32, p.n_ff))
    kv += [
        (f"{a}.attention.head_count", VT.UINT32, p.n_head),
        (f"{a}.attention.head_count_kv", VT.UINT32, p.n_head_kv),
    ]
    rope = p.rope
    rope_type, factor = rope.get("rope_type"), rope.get("factor")
    if rope_type == "linear" and factor is not None:
        kv += [(f"{a}.rope.scaling.type", VT.STRING, "linear"), (f"{a}.rope.scaling.factor", VT.FLOAT32, factor)]
    elif rope_type == "yarn" and factor is not None:
        kv += [(f"{a}.rope.scaling.type", VT.STRING, "yarn"), (f"{a}.rope.scaling.factor", VT.FLOAT32, factor),
               (f"{a}.rope.scaling.original_context_length", VT.UINT32, rope["original_max_position_embeddings"])]
        yarn = {
            "yarn_ext_factor": rope.get("extrapolation_factor"),
            "yarn_attn_factor": rope.get("attention_factor", rope.get("attn_factor")),
            "yarn_beta_fast": rope.get("beta_fast"),
            "yarn_beta_slow": rope.get("beta_slow"),
        }
        kv += [(f"{a}.rope.scaling.{k}", VT.FLOAT32, v) for k, v in yarn.items() if v is not None]
    elif rope_type in ("su", "longrope"):
        kv.append((f"{a}.rope.scaling.type", VT.STRING, "longrope"))
    if "mrope_section" in rope:
        sec = list(rope["mrope_section"]) + [0] * max(0, 4 - len(rope["mrope_section"]))
        kv.append((f"{a}.rope.dimension_sections", VT.INT32, sec[:4]))
    kv.append((f"{a}.rope.freq_base", VT.FLOAT32, rope["rope_theta"]))
    kv.append((f"{a}.attention.layer_norm_rms_epsilon", VT.FLOAT32, p.rms_eps))
    for k in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        if k in h:
            kv.append((f"{a}.attention.layer_norm_epsilon", VT.FLOAT32, h[k]))
            break
    if p.moe:
        kv += [(f"{a}.expert_count", VT.UINT32, p.n_expert), (f"{a}.expert_used_count", VT.UINT32, p.n_expert_used)]
    kv += [
        (f"{a}.attention.key_length", VT.UINT32, p.head_dim),
        (f"{a}.attention.value_length", VT.UINT32, p.head_dim),
        ("general.file_type", VT.UINT32, file_type),
    ]
    if p.moe:
        kv += [(f"{a}.expert_feed_forward_length", VT.UINT32, p.n_ff_exp),
               (f"{a}.expert_shared_feed_forward_length", VT.UINT32, p.n_ff_shexp)]
    if n_mtp:
        kv.append((f"{a}.nextn_predict_layers", VT.UINT32, n_mtp))
    kv += [
        (f"{a}.ssm.conv_kernel", VT.UINT32, p.conv_kernel),
        (f"{a}.ssm.state_size", VT.UINT32, p.k_head_dim),
        (f"{a}.ssm.group_count", VT.UINT32, p.n_k_heads),
        (f"{a}.ssm.time_step_rank", VT.UINT32, p.n_v_heads),
        (f"{a}.ssm.inner_size", VT.UINT32, p.v_dim),
        (f"{a}.attention.recurrent_layers", VT.BOOL,
         [t == "linear_attention" for t in p.layer_types] + [False] * n_mtp),
        (f"{a}.full_attention_interval", VT.UINT32, p.full_attention_interval),
        (f"{a}.rope.dimension_count", VT.UINT32, int(p.head_dim * p.partial_rotary_factor)),
    ]
    if a != "qwen3next" and "mrope_section" not in rope:
        kv.append((f"{a}.rope.dimension_sections", VT.INT32, list(DEFAULT_MROPE_SECTION)))
    return kv

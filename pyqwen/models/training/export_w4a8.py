#!/usr/bin/env python3
"""Export the trained bf16 checkpoint as a compressed-tensors W4A8 checkpoint.

    python3 pyqwen/models/training/export_w4a8.py CKPT_DIR OUT_DIR

The scheme is compressed-tensors' W4A8 preset, stored as llm-compressor stores it: int-quantized,
int4 weights in groups of 128, symmetric, bf16 scales; int8 per-token dynamic activations (no
stored activation parameters); `ignore: ["lm_head"]`. Only linear layers are targets, so the
embeddings, norms, convolution and DeltaNet parameters stay bf16. The quantizer (round to nearest,
scale = group absmax / 7) is the converter tests' own, tests/quant_checkpoints.py.

llm-compressor loads the model with transformers, whose Qwen3_5ForCausalLM drops `mtp.*` on load,
so its export has no MTP head. This one keeps the head and quantizes its linears (`mtp.fc` and the
block's projections) like the main model's, as the preset's `Linear` target would if they were
loaded as modules. The tokenizer files next to this script are copied in.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tests"))
from quant_checkpoints import Spec, quantize_checkpoint  # noqa: E402

W4A8 = Spec("ct-int", bits=4, group=128, sym=True)


def export_w4a8(ckpt_dir: Path, out_dir: Path, tokenizer_dir: Path = HERE) -> Path:
    """Write the W4A8 checkpoint of `ckpt_dir` (with the tokenizer of `tokenizer_dir`) to `out_dir`."""
    quantize_checkpoint(ckpt_dir, out_dir, W4A8)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer_dir) / name, Path(out_dir) / name)
    return Path(out_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", type=Path, help="the bf16 checkpoint folder (train.py's OUT/ckpt)")
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    print(export_w4a8(a.ckpt, a.out))


if __name__ == "__main__":
    main()

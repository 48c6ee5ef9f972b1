"""pyqwen-convert SRC_DIR -o OUT.gguf [--outtype f16] [--no-mtp] [--quiet]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .core import CONVERTER_VERSION, convert, run_command
from .errors import ConversionError
from .plan import OUTTYPES

PROG = "pyqwen-convert"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a Hugging Face Qwen3.5 checkpoint (safetensors) to GGUF "
                    "(llama.cpp architecture qwen35).",
    )
    ap.add_argument("src_dir", metavar="SRC_DIR", type=Path,
                    help="model directory: config.json, *.safetensors, tokenizer files")
    ap.add_argument("-o", "--outfile", metavar="OUT.gguf", type=Path, required=True,
                    help="output file (written to OUT.gguf.tmp-XXXX, renamed when complete)")
    ap.add_argument("--outtype", choices=list(OUTTYPES), default="f16",
                    help="type of the 2-D weights; norms and 1-D tensors stay f32 (default: f16)")
    ap.add_argument("--no-mtp", "--no-nextn", dest="mtp", action="store_false",
                    help="drop the multi-token-prediction (MTP/nextn) layer")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no notes")
    ap.add_argument("--version", action="version", version=f"{PROG} {CONVERTER_VERSION}")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def note(msg: str) -> None:
        print(f"{PROG}: note: {msg}", file=sys.stderr)

    rc, res = run_command(PROG, lambda: convert(args.src_dir, args.outfile, outtype=args.outtype, mtp=args.mtp,
                                                progress=not args.quiet, log=None if args.quiet else note),
                          (ConversionError,))
    if rc:
        return rc
    if not args.quiet:
        mib = res.nbytes / (1 << 20)
        mtp = f", MTP layers {res.n_mtp}" if res.n_mtp else ""
        print(f"{PROG}: wrote {res.path} ({res.n_tensors} tensors, {mib:.1f} MiB, {res.outtype}{mtp})",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

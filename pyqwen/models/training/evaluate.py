#!/usr/bin/env python3
"""Held-out figures of the trained default model, on the CPU.

    python3 pyqwen/models/training/evaluate.py DEVICE_DIR --model CKPT_DIR_OR_GGUF [--gguf MODEL.gguf]
        [--out results.json]

DEVICE_DIR is build_data.py's folder (token streams). The held-out windows are train.py's final
evaluation's: window i feeds val[1024 i : 1024 i + 1024] and predicts the next token at each of
its positions.

- unigram: the cross-entropy of those targets under the training stream's token frequencies
  (add-one smoothed over the 8192 ids).
- --model (the bf16 checkpoint, or a GGUF dequantized into the same transformers model; float32,
  transformers + tests/mtp_reference.py): held-out loss; the MTP head's teacher-forced agreement
  (draft for x[t+2] from h[t] and the text's x[t+1] == the main model's argmax at t+1, all
  positions: train.py's "agree"); and MTP chain acceptance (below).
- --gguf: held-out loss of a GGUF run by pyqwen, and greedy samples from it.

MTP acceptance. At each point t = 63, 127, ..., 959 of every window, the context is the held-out
text x[0..t]. The main model continues it greedily: g1 = its argmax after x[..t], g2 after
x[..t] g1, and so on. The MTP chain starts from (h[t], g1) and drafts d1, d2, d3 for the
positions of g2, g3, g4 (tests/mtp_reference.py's chained_draft_logits; each draft feeds its top
token and its own output row to the next). "Depth d" is draft d. Its rank is the rank of g(d+1)
in draft d's logits; rank 1 means a greedy verifier accepts draft d if it accepted all before it.
Reported per depth: the rank distribution (1, 2, 3, worse) over all points, the rank-1 fraction
among points whose earlier drafts were all accepted, and the fraction of chains accepted through
depth d; for both ways of feeding the chain (after mtp.norm, before it).
"""

from __future__ import annotations

import argparse
import copy
import json
import lzma
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tests"))
from mtp_reference import FEEDS, chained_draft_logits, load_gguf_with_mtp, load_with_mtp, mtp_logits  # noqa: E402

SEQ = 1024
POINTS = list(range(63, 960, 64))
DEPTH = 3
GROUP = 16  # windows per torch batch
SAMPLE_PROMPTS = [
    "The Python language",
    "PostgreSQL supports several kinds of indexes.",
    "In this tutorial, we will",
    "def fibonacci(n):",
    "import os\nimport sys\n\n\ndef main():",
    "class Stack:\n",
]


def load_stream(path: Path) -> np.ndarray:
    return np.frombuffer(lzma.decompress(path.read_bytes()), dtype="<u2").astype(np.int64)


def windows(val: np.ndarray) -> np.ndarray:
    """[n, SEQ + 1]: train.py's evaluation windows (inputs and their targets)."""
    starts = np.arange(0, val.size - SEQ - 2, SEQ)
    return val[starts[:, None] + np.arange(SEQ + 1)]


def unigram_loss(train: np.ndarray, targets: np.ndarray, n_vocab: int) -> dict:
    counts = np.bincount(train, minlength=n_vocab).astype(np.float64)
    logp = np.log((counts + 1) / (counts.sum() + n_vocab))
    return {"loss": float(-logp[targets].mean()), "train_entropy": float(-(counts / counts.sum() * logp).sum()),
            "unseen_target_fraction": float((counts[targets] == 0).mean())}


@torch.no_grad()
def torch_figures(model, mtp, wins: np.ndarray, log) -> dict:
    nll, agree, ranks = 0.0, 0.0, {f: [] for f in FEEDS}
    for g0 in range(0, len(wins), GROUP):
        w = torch.from_numpy(wins[g0:g0 + GROUP])
        x, B = w[:, :SEQ], w.shape[0]
        cache = None
        hs, greedy = [], []
        bounds = [0] + [t + 1 for t in POINTS] + [SEQ]
        for a, b in zip(bounds, bounds[1:]):
            out = model.model(input_ids=x[:, a:b], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            hs.append(out.last_hidden_state)
            if b - 1 not in POINTS:
                continue
            tok = model.lm_head(out.last_hidden_state[:, -1]).argmax(-1)
            branch, cont = copy.deepcopy(cache), [tok]
            for _ in range(DEPTH):
                tok = model(input_ids=tok[:, None], past_key_values=branch, use_cache=True).logits[:, -1].argmax(-1)
                cont.append(tok)
            greedy.append(torch.stack(cont, dim=1))
        h = torch.cat(hs, dim=1)
        greedy = torch.stack(greedy, dim=1)  # [B, P, DEPTH + 1]
        logits = model.lm_head(h)
        nll += torch.nn.functional.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        main_top = logits.argmax(-1)
        del logits
        pos = torch.arange(1, SEQ + 1).expand(B, -1)
        draft = mtp_logits(model, mtp, h, w[:, 1:], pos).argmax(-1)
        agree += (draft[:, :-1] == main_top[:, 1:]).float().sum().item()
        for feed in FEEDS:
            d = chained_draft_logits(model, mtp, h, x, POINTS, greedy[:, :, 0], DEPTH, feed)
            want = greedy[:, :, 1:].permute(2, 0, 1)  # [DEPTH, B, P]
            rank = 1 + (d > d.gather(-1, want[..., None])).sum(-1)
            ranks[feed].append(rank.flatten(1))
        log(f"windows {g0 + B}/{len(wins)}: loss so far {nll / ((g0 + B) * SEQ):.4f}")
    n = len(wins)
    res = {"windows": n, "loss": nll / (n * SEQ), "mtp_teacher_forced_agree": agree / (n * (SEQ - 1)),
           "mtp_points": n * len(POINTS), "mtp": {}}
    for feed in FEEDS:
        r = torch.cat(ranks[feed], dim=1)  # [DEPTH, points]
        accepted = torch.ones(r.shape[1], dtype=torch.bool)
        rows = []
        for d in range(DEPTH):
            top1 = r[d] == 1
            rows.append({"depth": d + 1, **{f"top{k}": (r[d] == k).float().mean().item() for k in (1, 2, 3)},
                         "none": (r[d] > 3).float().mean().item(),
                         "top1_given_accepted_before": top1[accepted].float().mean().item(),
                         "chain_accepted_through": (accepted & top1).float().mean().item()})
            accepted &= top1
        res["mtp"][feed] = rows
    return res


def gguf_figures(path: Path, wins: np.ndarray, threads: int, log) -> dict:
    from pyqwen import Llama

    nll = 0.0
    with Llama(path, n_ctx=SEQ, n_threads=threads, type_k="f32", type_v="f32") as llm:
        for i, w in enumerate(wins):
            lg = llm.logits(w[:SEQ].tolist()).astype(np.float64)
            lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
            nll += float((lse - lg[np.arange(SEQ), w[1:]]).sum())
            if (i + 1) % 32 == 0:
                log(f"{path.name}: windows {i + 1}/{len(wins)}, loss so far {nll / ((i + 1) * SEQ):.4f}")
        samples = {}
        for p in SAMPLE_PROMPTS:
            out = llm.create_completion(p, max_tokens=64, temperature=0.0)
            samples[p] = p + out["choices"][0]["text"]
    return {"windows": len(wins), "loss": nll / (len(wins) * SEQ), "greedy_samples": samples}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("device_dir", type=Path)
    ap.add_argument("--model", type=Path, help="checkpoint folder or GGUF for the torch figures")
    ap.add_argument("--gguf", type=Path, help="GGUF for pyqwen's loss and samples")
    ap.add_argument("--windows", type=int, help="only the first N windows (a quick look)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)

    torch.set_num_threads(args.threads)
    val = load_stream(args.device_dir / "val.u16.xz")
    wins = windows(val)[:args.windows]
    cfg = json.loads((HERE / "config.json").read_text())["model"]
    uni = unigram_loss(load_stream(args.device_dir / "train.u16.xz"), wins[:, 1:].ravel(), cfg["vocab_size"])
    res = {"targets": int(wins[:, 1:].size), "unigram": uni}
    log(f"unigram: loss {uni['loss']:.4f} (ppl {math.exp(uni['loss']):.1f}) over {res['targets']:,} targets")
    if args.gguf:
        res["gguf"] = {"file": args.gguf.name, **gguf_figures(args.gguf, wins, args.threads, log)}
        log(f"{args.gguf.name}: loss {res['gguf']['loss']:.4f} (ppl {math.exp(res['gguf']['loss']):.2f})")
    if args.model:
        if args.model.suffix == ".gguf":
            model, mtp = load_gguf_with_mtp(args.model, cfg)
        else:
            model, mtp = load_with_mtp(args.model, attn_implementation="sdpa")
        res["torch"] = {"model": args.model.name, **torch_figures(model, mtp, wins, log)}
        log(f"{args.model.name}: loss {res['torch']['loss']:.4f}, teacher-forced MTP agree "
            f"{res['torch']['mtp_teacher_forced_agree']:.3f}")
    text = json.dumps(res, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

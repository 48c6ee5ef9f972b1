#!/usr/bin/env python3
"""Train the shipped default model on one GPU within a wall-clock budget.

    python3 DIR/train.py --out OUT [--minutes 4.5 | --steps N] [--device cuda]

DIR is the device folder made by build_data.py (this script, config.json, the token streams,
the tokenizer and the test helpers it imports). The model is transformers' Qwen3_5ForCausalLM
built from config.json's "model" section, plus an MTP head (tests/mtp_reference.py); the loss
is the next-token cross-entropy plus mtp_loss_weight times the MTP head's next-next-token loss.
Batches are random windows of the training stream (seeded generator on the device); bf16
autocast, fp32 weights, AdamW, linear warm-up then cosine decay.

--minutes: the whole run, start-up included, ends within this budget. The step count is fixed
once, after timing steps calibrate_from_step..calibrate_to_step (all inside the warm-up, so the
schedule up to there does not depend on it), capped at max_epochs passes over the data, and
written to summary.json; `--steps N` replays a run with that count. Should the steps slow down
later, each evaluation shortens the schedule to what still fits (summary.json lists these
re-plans) instead of cutting off a half-decayed one.

OUT receives: ckpt/ (config.json, bf16 safetensors shards + index, with the mtp.* tensors),
loss.csv (the loss curve) and summary.json (counts, timings, final held-out figures).
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import lzma  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from mtp_reference import MTPHead, mtp_logits  # noqa: E402
from tiny_models import shard_checkpoint  # noqa: E402

SHARD_BYTES = 16_000_000  # each returned file stays under 16 MiB
FINAL_RESERVE_S = 25.0  # final evaluation + saving


def log(msg: str) -> None:
    print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)


def load_stream(path: Path, device) -> torch.Tensor:
    ids = np.frombuffer(lzma.decompress(path.read_bytes()), dtype="<u2")
    return torch.from_numpy(ids.astype(np.int32)).to(device)


def build(model_cfg: dict, seed: int, device):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**model_cfg, mtp_num_hidden_layers=1)
    config.architectures = ["Qwen3_5ForCausalLM"]
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config)
    mtp = MTPHead(config)
    mtp.apply(model._init_weights)
    return model.to(device), mtp.to(device)


def losses(model, mtp, batch: torch.Tensor, seq_len: int, agree: bool = False):
    """(main loss, MTP loss[, MTP argmax == main argmax fraction]) of windows [B, seq_len + 2]."""
    x, y1, y2 = batch[:, :seq_len], batch[:, 1:seq_len + 1], batch[:, 2:seq_len + 2]
    h = model.model(input_ids=x, use_cache=False).last_hidden_state
    logits = model.lm_head(h)
    main = F.cross_entropy(logits.float().flatten(0, 1), y1.flatten())
    pos = torch.arange(1, seq_len + 1, device=batch.device).expand(batch.shape[0], -1)
    mlogits = mtp_logits(model, mtp, h, y1, pos)
    extra = F.cross_entropy(mlogits.float().flatten(0, 1), y2.flatten())
    if not agree:
        return main, extra
    # depth-1 draft for x[t+2] vs the main model's greedy x[t+2] (its row t+1)
    same = (mlogits[:, :-1].argmax(-1) == logits[:, 1:].argmax(-1)).float().mean()
    return main, extra, same


@torch.no_grad()
def evaluate(model, mtp, val: torch.Tensor, seq_len: int, n_windows: int | None, autocast) -> dict:
    model.eval(), mtp.eval()
    starts = torch.arange(0, val.numel() - seq_len - 2, seq_len, device=val.device)[:n_windows]
    ar = torch.arange(seq_len + 2, device=val.device)
    sums = torch.zeros(3, device=val.device)
    for chunk in starts.split(32):
        with autocast:
            out = losses(model, mtp, val[chunk[:, None] + ar].long(), seq_len, agree=True)
        sums += torch.stack(out) * chunk.numel()
    model.train(), mtp.train()
    main, extra, same = (sums / starts.numel()).tolist()
    return {"val_loss": main, "val_mtp_loss": extra, "val_mtp_agree": same, "val_windows": int(starts.numel())}


def save_checkpoint(model, mtp, dst: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v for k, v in model.state_dict().items()
             if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    state.update({f"mtp.{k}": v for k, v in mtp.state_dict().items()})
    tensors = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in sorted(state.items())}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model.config.dtype = torch.bfloat16
        model.config.save_pretrained(str(d))
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        shard_checkpoint(d, SHARD_BYTES)
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(d.iterdir()):
            shutil.copy2(f, dst / f.name)


def lr_at(step: int, total: int, tc: dict) -> float:
    if step < tc["warmup_steps"]:
        return tc["lr"] * (step + 1) / tc["warmup_steps"]
    frac = min(1.0, (step - tc["warmup_steps"]) / max(1, total - tc["warmup_steps"]))
    return tc["lr"] * (tc["min_lr_ratio"] + (1 - tc["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * frac)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=4.5, help="wall-clock budget of the whole run")
    ap.add_argument("--steps", type=int, help="fixed step count (replay); skips the calibration")
    ap.add_argument("--config", type=Path, default=HERE / "config.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)

    cfg = json.loads(args.config.read_text())
    tc = cfg["train"]
    T, B = tc["seq_len"], tc["batch_size"]
    if not tc["calibrate_from_step"] < tc["calibrate_to_step"] < tc["warmup_steps"]:
        raise SystemExit("config.json: need calibrate_from_step < calibrate_to_step < warmup_steps")
    device = torch.device(args.device)
    deadline = T_START + 60.0 * args.minutes - FINAL_RESERVE_S
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device "
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    train = load_stream(HERE / "train.u16.xz", device)
    val = load_stream(HERE / "val.u16.xz", device)
    model, mtp = build(cfg["model"], tc["seed"], device)
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"data: {train.numel():,} train / {val.numel():,} held-out tokens; "
        f"params: {n_main:,} main + {n_mtp:,} MTP; batch {B} x {T}")

    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": tc["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tc["lr"], betas=tuple(tc["betas"]), fused=device.type == "cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(tc["seed"])
    ar = torch.arange(T + 2, device=device)
    max_steps = int(tc["max_epochs"] * train.numel() / (B * T))
    total = args.steps if args.steps is not None else max_steps
    calibrating = args.steps is None

    ev = evaluate(model, mtp, val, T, tc["eval_windows"], autocast)
    log(f"step 0: val loss {ev['val_loss']:.4f}, val MTP loss {ev['val_mtp_loss']:.4f}")
    args.out.mkdir(parents=True, exist_ok=True)
    fields = ["step", "tokens", "epochs", "lr", "train_loss", "train_mtp_loss",
              "val_loss", "val_mtp_loss", "val_mtp_agree", "elapsed_s"]
    csv_file = open(args.out / "loss.csv", "w", newline="")
    rows = csv.DictWriter(csv_file, fieldnames=fields)
    rows.writeheader()
    rows.writerow({"step": 0, "tokens": 0, "epochs": 0.0, "lr": 0.0, "train_loss": "", "train_mtp_loss": "",
                   **{k: round(ev[k], 5) for k in ("val_loss", "val_mtp_loss", "val_mtp_agree")},
                   "elapsed_s": round(time.time() - T_START, 1)})

    acc = torch.zeros(2, device=device)
    step, t_cal, stopped_early, replans = 0, 0.0, False, []
    while step < total:
        if time.time() > deadline:
            stopped_early = True
            log(f"time budget reached at step {step} of {total}")
            break
        lr = lr_at(step, total, tc)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train.numel() - T - 2, (B,), device=device, generator=gen)
        with autocast:
            main_loss, mtp_loss = losses(model, mtp, train[starts[:, None] + ar].long(), T)
            loss = main_loss + tc["mtp_loss_weight"] * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tc["grad_clip"])
        opt.step()
        acc += torch.stack([main_loss.detach(), mtp_loss.detach()])
        step += 1

        if calibrating and step in (tc["calibrate_from_step"], tc["calibrate_to_step"]):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step == tc["calibrate_from_step"]:
                t_cal = time.time()
            else:
                step_s = (time.time() - t_cal) / (tc["calibrate_to_step"] - tc["calibrate_from_step"])
                per_step = step_s * (1 + 1 / tc["eval_every"])  # an evaluation costs less than a step
                total = min(max_steps, step + int(0.97 * (deadline - time.time()) / per_step))
                calibrating = False
                log(f"calibrated: {step_s * 1000:.0f} ms/step ({B * T / step_s:,.0f} tokens/s), "
                    f"{total} steps = {total * B * T / train.numel():.2f} epochs")
        if step % tc["log_every"] == 0 or step == total:
            n = tc["log_every"] if step % tc["log_every"] == 0 else step % tc["log_every"]
            tl, tm = (acc / n).tolist()
            acc.zero_()
            row = {"step": step, "tokens": step * B * T, "epochs": round(step * B * T / train.numel(), 4),
                   "lr": f"{lr:.6g}", "train_loss": round(tl, 5), "train_mtp_loss": round(tm, 5),
                   "val_loss": "", "val_mtp_loss": "", "val_mtp_agree": ""}
            msg = f"step {step}/{total}: lr {lr:.2e}, loss {tl:.4f}, MTP loss {tm:.4f}"
            if step % tc["eval_every"] == 0 or step == total:
                ev = evaluate(model, mtp, val, T, tc["eval_windows"], autocast)
                row.update({k: round(ev[k], 5) for k in ("val_loss", "val_mtp_loss", "val_mtp_agree")})
                msg += f" | val loss {ev['val_loss']:.4f}, MTP {ev['val_mtp_loss']:.4f}, agree {ev['val_mtp_agree']:.3f}"
                if args.steps is None and not calibrating:
                    # steps got slower (a busy host): shorten the schedule rather than cut it off
                    per_step = (time.time() - t_cal) / (step - tc["calibrate_from_step"])
                    fits = step + int((deadline - time.time()) / per_step)
                    if fits < total:
                        total = max(step, fits)
                        replans.append([step, total])
                        msg += f" | re-planned to {total} steps"
            row["elapsed_s"] = round(time.time() - T_START, 1)
            rows.writerow(row)
            csv_file.flush()
            log(msg)
    csv_file.close()

    t_train_end = time.time()
    final = evaluate(model, mtp, val, T, None, autocast)
    log(f"final, all {final['val_windows']} held-out windows: loss {final['val_loss']:.4f} "
        f"(ppl {math.exp(final['val_loss']):.2f}), MTP loss {final['val_mtp_loss']:.4f}, "
        f"MTP agree {final['val_mtp_agree']:.3f}")
    save_checkpoint(model, mtp, args.out / "ckpt")
    summary = {
        "config": cfg, "steps": step, "planned_steps": total, "replans": replans, "stopped_early": stopped_early,
        "tokens_seen": step * B * T, "epochs": step * B * T / train.numel(),
        "train_tokens": int(train.numel()), "val_tokens": int(val.numel()),
        "params_main": n_main, "params_mtp": n_mtp,
        "train_seconds": round(t_train_end - T_START, 1), "total_seconds": round(time.time() - T_START, 1),
        "final": final, "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"done: {step} steps, checkpoint in {args.out / 'ckpt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

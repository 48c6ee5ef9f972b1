"""The shipped default model (pyqwen/models/default.gguf, Q8_0, trained with an MTP head).

- pyqwen against transformers' Qwen3_5ForCausalLM holding the file's weights dequantized
  (float64): the only difference left is ggml's 8-bit rounding of activations in Q8_0 dot
  products (measured: 1.2e-2 relative logit error at most on this prompt; a swapped V head,
  a flipped conv kernel or a wrong rotary base give 0.3-0.4, a doubled +1 on one q_norm 0.13).
- its MTP head: tests/mtp_reference.py (torch) against a float64 numpy implementation written
  from llama.cpp's qwen35 MTP graph that reads the GGUF tensors directly, on chained drafts
  (1e-6: transformers computes the rotary cos/sin in float32), and a check that it is trained.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from mtp_reference import FEEDS, chained_draft_logits, load_gguf_with_mtp, mtp_logits
from pyqwen import Llama
from pyqwen.cli import default_model_path
from pyqwen.llama import read_metadata
from pyqwen.tokenizer import Tokenizer
from test_parity import rel_err

ROOT = Path(__file__).resolve().parents[1]
CONFIG = json.loads((ROOT / "pyqwen" / "models" / "training" / "config.json").read_text())["model"]
LOGIT_BOUND = 3e-2
TEXT = '''The module defines the following functions. Each of them returns a new object; the
original is left unchanged.

def parse(path, *, strict=False):
    """Read the file at path and return its records."""
    with open(path, encoding="utf-8") as f:
        return [line.split(",") for line in f if line.strip()]
'''
POINTS = [9, 30, 52, 70]
DEPTH = 3


@pytest.fixture(scope="module")
def shipped():
    """transformers model + MTP head in float64 from the shipped file, TEXT's ids [1, T], and
    the main model's hidden states [1, T, H] and logits [1, T, V] on them."""
    path = default_model_path()
    x = torch.tensor([Tokenizer.from_gguf_fields(read_metadata(path)).encode(TEXT)])
    model, mtp = load_gguf_with_mtp(path, CONFIG, dtype=torch.float64)
    with torch.no_grad():
        h = model.model(input_ids=x).last_hidden_state
        return model, mtp, x, h, model.lm_head(h)


def test_logits_match_transformers(shipped):
    _, _, x, _, logits = shipped
    ref = logits[0].numpy()
    with Llama(default_model_path(), n_ctx=256, type_k="f32", type_v="f32") as llm:
        got = llm.logits(x[0].tolist())
    assert got.shape == ref.shape and np.isfinite(got).all()
    err = rel_err(got.astype(np.float64), ref)
    print(f"default model: max relative logit error over {x.shape[1]} positions = {err:.2e}")
    assert err <= LOGIT_BOUND


# --- float64 numpy MTP head, from the GGUF tensors (llama.cpp's names and +1-folded norms) ---

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate(x: np.ndarray, pos: np.ndarray, n_rot: int, theta: float) -> np.ndarray:
    """NEOX rotary on the first n_rot dims of x [T, heads, dim] (text positions: mrope = rope)."""
    half = n_rot // 2
    ang = pos[:, None] * theta ** (-np.arange(half) / half)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = x[..., :half], x[..., half:n_rot]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., n_rot:]], axis=-1)


class NumpyMTP:
    def __init__(self, path: Path):
        r = gguf.GGUFReader(str(path))
        self.w = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
                  for t in r.tensors}
        f = {k: r.fields[k].contents() for k in r.fields if k.startswith("qwen35.")}
        self.il = f["qwen35.block_count"] - f["qwen35.nextn_predict_layers"]
        self.eps = f["qwen35.attention.layer_norm_rms_epsilon"]
        self.n_head, self.n_kv = f["qwen35.attention.head_count"], f["qwen35.attention.head_count_kv"]
        self.hd, self.n_rot = f["qwen35.attention.key_length"], f["qwen35.rope.dimension_count"]
        self.theta = f["qwen35.rope.freq_base"]

    def t(self, name: str) -> np.ndarray:
        return self.w[f"blk.{self.il}.{name}"]

    def rows(self, tokens: np.ndarray, h: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One causal sequence of rows (token, hidden, position) -> (pre-norm out, normed out)."""
        T, nh, nkv, hd = len(tokens), self.n_head, self.n_kv, self.hd
        e = rms_norm(self.w["token_embd.weight"][tokens], self.t("nextn.enorm.weight"), self.eps)
        eh = np.concatenate([e, rms_norm(h, self.t("nextn.hnorm.weight"), self.eps)], -1)
        x = eh @ self.t("nextn.eh_proj.weight").T
        a = rms_norm(x, self.t("attn_norm.weight"), self.eps)
        qg = (a @ self.t("attn_q.weight").T).reshape(T, nh, 2 * hd)
        q = rotate(rms_norm(qg[..., :hd], self.t("attn_q_norm.weight"), self.eps), pos, self.n_rot, self.theta)
        k = (a @ self.t("attn_k.weight").T).reshape(T, nkv, hd)
        k = rotate(rms_norm(k, self.t("attn_k_norm.weight"), self.eps), pos, self.n_rot, self.theta)
        v = (a @ self.t("attn_v.weight").T).reshape(T, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        s = np.where(np.tri(T, dtype=bool), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v)
        o = (o * (1 / (1 + np.exp(-qg[..., hd:])))).reshape(T, nh * hd)
        x = x + o @ self.t("attn_output.weight").T
        m = rms_norm(x, self.t("post_attention_norm.weight"), self.eps)
        g = m @ self.t("ffn_gate.weight").T
        x = x + (g / (1 + np.exp(-g)) * (m @ self.t("ffn_up.weight").T)) @ self.t("ffn_down.weight").T
        return x, rms_norm(x, self.t("nextn.shared_head_norm.weight"), self.eps)

    def chain(self, ids: np.ndarray, h: np.ndarray, t: int, first: int, depth: int, feed: str) -> np.ndarray:
        """Draft logits [depth, n_vocab] of the chain at point t, one row appended per draft."""
        tokens, hid, pos = list(ids[1:t + 1]) + [first], list(h[:t + 1]), list(range(1, t + 2))
        out = []
        for _ in range(depth):
            pre, normed = self.rows(np.array(tokens), np.array(hid), np.array(pos, dtype=np.float64))
            logits = normed[-1] @ self.w["token_embd.weight"].T
            out.append(logits)
            tokens.append(int(logits.argmax()))
            hid.append(normed[-1] if feed == "normed" else pre[-1])
            pos.append(pos[-1] + 1)
        return np.stack(out)


@pytest.fixture(scope="module")
def numpy_mtp():
    return NumpyMTP(default_model_path())


@pytest.mark.parametrize("feed", FEEDS)
def test_mtp_chain_matches_numpy(shipped, numpy_mtp, feed):
    model, mtp, x, h, logits = shipped
    first = logits[:, POINTS].argmax(-1)
    with torch.no_grad():
        got = chained_draft_logits(model, mtp, h, x, POINTS, first, DEPTH, feed)[:, 0].numpy()
    for i, t in enumerate(POINTS):
        want = numpy_mtp.chain(x[0].numpy(), h[0].numpy(), t, int(first[0, i]), DEPTH, feed)
        assert np.isfinite(want).all()
        assert rel_err(got[:, i], want) < 1e-6, f"point {t}"
        assert (got[:, i].argmax(-1) == want.argmax(-1)).all()


def test_mtp_head_is_trained(shipped):
    """Teacher-forced drafts (h[t], x[t+1]) -> x[t+2] mostly agree with the main model's next
    greedy token (0.70 on the held-out text; a random head would almost never)."""
    model, mtp, x, h, logits = shipped
    with torch.no_grad():
        draft = mtp_logits(model, mtp, h[:, :-1], x[:, 1:], torch.arange(1, x.shape[1])[None]).argmax(-1)[0]
    main = logits.argmax(-1)[0]
    agree = (draft == main[1:]).double().mean().item()
    print(f"teacher-forced MTP agreement on the test text: {agree:.3f}")
    assert agree > 0.4

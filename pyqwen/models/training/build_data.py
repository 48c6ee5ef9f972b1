#!/usr/bin/env python3
"""Build the device folder for train.py: corpus -> tokenizer -> compressed token streams.

    python3 pyqwen/models/training/build_data.py OUT_DIR [--debs CACHE_DIR]

Needs a Debian system (apt-get download, dpkg-deb) and the test dependencies (tokenizers).
Every step is deterministic: the .deb files are pinned by version and sha256 (PACKAGES), the
documents are read in sorted path order, the held-out split is a hash of each document's path,
and the tokenizer is trained with tests/tiny_vocab.py's train_qwen35_tokenizer.

OUT_DIR receives (about 11 MB, all train.py needs):
  train.u16.xz, val.u16.xz   token ids as little-endian uint16, documents joined by
                             <|endoftext|>, xz-compressed
  data.json                  token counts, sha256 of the uncompressed streams, per-source sizes
  tokenizer.json, tokenizer_config.json
  config.json, train.py      copied from this folder
  mtp_reference.py, tiny_models.py, tiny_vocab.py   copied from tests/ (train.py imports them)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[2] / "tests"
sys.path.insert(0, str(TESTS))
from tiny_vocab import ADDED_TOKENS, train_qwen35_tokenizer, write_tokenizer  # noqa: E402

# (package, version, sha256 of the .deb, license of what we read)
PACKAGES = (
    ("python3.11-doc", "3.11.2-6+deb12u9", "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be", "PSF-2.0"),
    ("python-django-doc", "3:3.2.25-0+deb12u7", "87307f067916df72e17180d35b7cde5c7ea6080336cda518efd7f6e66988a7ca", "BSD-3-Clause"),
    ("postgresql-doc-15", "15.20-0+deb12u1", "4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7", "PostgreSQL"),
    ("libpython3.11-minimal", "3.11.2-6+deb12u9", "69f41cfa3f4ba17284e538f843069d7529c53c207d2ae17a5b02785944870e33", "PSF-2.0"),
    ("libpython3.11-stdlib", "3.11.2-6+deb12u9", "10f13e000ee757f5f2d2d3569f9e30546214a0c850acd78695feae373bfa3e53", "PSF-2.0"),
    ("libpython3.11-testsuite", "3.11.2-6+deb12u9", "5dd0f85e950b344a51374e0ef68089e808f73c6c594c80e5232936b5c7ea4a28", "PSF-2.0"),
    ("idle-python3.11", "3.11.2-6+deb12u9", "c066b167e4630e16d6aade9a4c1475a4063aec8da9d6f4a5ca9ac9d9645488fd", "PSF-2.0"),
    ("python3-lib2to3", "3.11.2-3", "4e7f5e01e49a0622d10db3d0995666a6ead6a369cd127a996e9a4f9e91696a51", "PSF-2.0"),
    ("python3-distutils", "3.11.2-3", "a620b555f301860a08e30534c7e6f7d79818e5e1977bfec39a612e7003074318", "PSF-2.0"),
    ("python3-django", "3:3.2.25-0+deb12u7", "9ad8ed29d9026207970777e194f658c39b3a7a96a932967f043503fc25bdc319", "BSD-3-Clause"),
    ("python3-numpy", "1:1.24.2-1+deb12u1", "64c6e18bd85f881328d70071154c2d8b93fd6de2e07855f81fad5e499694ac03", "BSD-3-Clause"),
    ("python3-setuptools", "66.1.1-1+deb12u2", "96f934b8dbe4367c4cf9e4c740aa5c85f9a9ac8875a16556c8677fb342c7838f", "MIT"),
)
VOCAB_SIZE = 8192
HELD_OUT_PER_MILLE = 20
# Python files that are data rather than code (generated tables, long literals) are left out
MAX_PY_BYTES = 200_000
MAX_PY_LINE = 500


class HtmlText(HTMLParser):
    """Visible text of the part of a Sphinx/DocBook page inside the elements matching `main`
    (tag, attribute, value; attribute None: any such tag), without elements whose class is in
    `skip_classes`:
    block elements end lines, <pre> keeps its whitespace, other whitespace runs collapse."""

    BLOCK = {"p", "div", "section", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd",
             "tr", "table", "ul", "ol", "dl", "blockquote"}
    VOID = {"br", "input", "img", "meta", "link", "hr", "col", "wbr"}
    HIDDEN = {"script", "style", "label", "title", "head"}

    def __init__(self, main: tuple[str, str | None, str], skip_classes: frozenset[str]):
        super().__init__(convert_charrefs=True)
        self.main, self.skip_classes = main, skip_classes
        self.out: list[str] = []
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, hides, opens main)
        self.in_main = self.hidden = self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            if tag == "br" and self.in_main:
                self.out.append("\n")
            return
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        hides = tag in self.HIDDEN or bool(classes & self.skip_classes)
        opens = tag == self.main[0] and (self.main[1] is None or a.get(self.main[1]) == self.main[2])
        self.stack.append((tag, hides, opens))
        self.hidden += hides
        self.in_main += opens
        self.pre += tag == "pre"
        if self.in_main and tag in self.BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if not any(t == tag for t, _, _ in self.stack):
            return
        while self.stack:
            t, hides, opens = self.stack.pop()
            if self.in_main and t in self.BLOCK:
                self.out.append("\n")
            self.hidden -= hides
            self.in_main -= opens
            self.pre -= t == "pre"
            if t == tag:
                break

    def handle_data(self, data):
        if self.in_main and not self.hidden:
            self.out.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        t = re.sub(r"[ \t]+\n", "\n", "".join(self.out))
        return re.sub(r"\n{3,}", "\n\n", t).strip() + "\n"


def html_text(path: Path, main: tuple[str, str | None, str], skip_classes: frozenset[str]) -> str:
    p = HtmlText(main, skip_classes)
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p.text()


def fetch(cache: Path) -> dict[str, Path]:
    """The pinned .deb files in `cache` (downloaded with apt-get when missing), by package."""
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, version, sha, _ in PACKAGES:
        deb = next((p for p in cache.glob(f"{name}_*.deb")
                    if hashlib.sha256(p.read_bytes()).hexdigest() == sha), None)
        if deb is None:
            subprocess.run(["apt-get", "download", f"{name}={version}"], cwd=cache, check=True)
            deb = next((p for p in cache.glob(f"{name}_*.deb")
                        if hashlib.sha256(p.read_bytes()).hexdigest() == sha), None)
            if deb is None:
                raise SystemExit(f"{name}={version}: downloaded, but no .deb in {cache} has sha256 {sha}")
        out[name] = deb
    return out


def documents(root: Path):
    """(source package, path inside the package, text) in a fixed order."""
    doc = root / "python3.11-doc/usr/share/doc/python3.11/html/_sources"
    for p in sorted(doc.rglob("*.rst.txt")):
        yield "python3.11-doc", str(p.relative_to(doc)), p.read_text(encoding="utf-8")
    dj = root / "python-django-doc/usr/share/doc/python-django-doc/html"
    for p in sorted(dj.rglob("*.html")):
        if p.relative_to(dj).parts[0] == "_modules":  # highlighted copies of python3-django's source
            continue
        yield "python-django-doc", str(p.relative_to(dj)), html_text(p, ("div", "class", "yui-g"), frozenset({"headerlink"}))
    pg = root / "postgresql-doc-15/usr/share/doc/postgresql-doc-15/html"
    for p in sorted(pg.glob("*.html")):
        yield "postgresql-doc-15", p.name, html_text(p, ("body", None, ""), frozenset({"navheader", "navfooter"}))
    for name, *_ in PACKAGES:
        if name.endswith("-doc") or name.startswith("postgresql"):
            continue
        base = root / name
        for p in sorted(base.rglob("*.py")):
            if p.is_symlink() or not p.is_file() or p.stat().st_size > MAX_PY_BYTES:
                continue
            try:
                text = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip() and max(len(line) for line in text.splitlines()) <= MAX_PY_LINE:
                yield name, str(p.relative_to(base)), text


def held_out(source: str, path: str) -> bool:
    return int(hashlib.sha256(f"{source}/{path}".encode()).hexdigest()[:8], 16) % 1000 < HELD_OUT_PER_MILLE


def encode_stream(tok, texts: list[str], eot: int) -> np.ndarray:
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype="<u2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--debs", type=Path, default=Path(tempfile.gettempdir()) / "pyqwen-corpus-debs")
    args = ap.parse_args(argv)

    debs = fetch(args.debs)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, deb in debs.items():
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root / name)], check=True)
        docs = list(documents(root))

    train = [(s, t) for s, p, t in docs if not held_out(s, p)]
    val = [(s, t) for s, p, t in docs if held_out(s, p)]
    tok = train_qwen35_tokenizer((t for _, t in train), VOCAB_SIZE, min_frequency=2)
    write_tokenizer(out, tok)
    eot = tok.token_to_id(ADDED_TOKENS[0][0])

    config = json.loads((HERE / "config.json").read_text())
    model = config["model"]
    if model["vocab_size"] != VOCAB_SIZE or model["pad_token_id"] != eot or \
            model["eos_token_id"] != tok.token_to_id("<|im_end|>"):
        raise SystemExit("config.json: vocab_size / pad_token_id / eos_token_id do not match the tokenizer")

    info: dict = {"vocab_size": VOCAB_SIZE, "eot_id": eot, "packages": [
        {"name": n, "version": v, "sha256": s, "license": lic} for n, v, s, lic in PACKAGES]}
    sources: dict[str, dict[str, int]] = {}
    for split, items in (("train", train), ("val", val)):
        stream = encode_stream(tok, [t for _, t in items], eot)
        raw = stream.tobytes()
        (out / f"{split}.u16.xz").write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
        info[split] = {"documents": len(items), "tokens": int(stream.size), "sha256": hashlib.sha256(raw).hexdigest()}
        for s, t in items:
            d = sources.setdefault(s, {"train_documents": 0, "val_documents": 0, "bytes": 0})
            d[f"{split}_documents"] += 1
            d["bytes"] += len(t.encode("utf-8"))
    info["sources"] = sources
    (out / "data.json").write_text(json.dumps(info, indent=2) + "\n")

    for f in (HERE / "train.py", HERE / "config.json", TESTS / "mtp_reference.py",
              TESTS / "tiny_models.py", TESTS / "tiny_vocab.py"):
        shutil.copy2(f, out / f.name)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"{out}: {info['train']['tokens']:,} train / {info['val']['tokens']:,} held-out tokens, "
          f"{size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

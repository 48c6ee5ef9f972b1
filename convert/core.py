"""Hugging Face Qwen3.5 / Qwen3-Next checkpoint -> GGUF, streamed tensor by tensor.

Steps: read config + shard headers (no tensor data), pick the input layout
and the architecture, plan every output tensor (name, shape, type) and
validate shapes against the config, build the GGUF header, then load,
transform, encode and append one tensor (or row chunk) at a time to
`OUT.tmp-XXXX`, measuring each against its source; write the per-tensor
errors into the header's REPORT_KEYS arrays (reserved, then filled in) and
rename to OUT only when everything succeeded.
"""

from __future__ import annotations

import os
import signal
import sys
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import gguf
import numpy as np
from gguf import GGUFValueType as VT

from . import qwen35
from .checkpoint import Checkpoint, load_config, open_checkpoint
from .encode import FieldsReader
from .errors import ConversionError
from .layouts import SourceTensor, quantization_config, select_layout
from .plan import OUTTYPES, Report, TensorPlan, decide_type, file_type

CONVERTER_VERSION = "0.2.0"
VERSION_KEY = "pyqwen.converter.version"
REQUIRES_KEY = "pyqwen.requires"  # the pyqwen features a file needs (metadata), and RequiresMarker
# per-tensor report, parallel arrays in file order: GGUF name, source format,
# max |written - source| and RMS of it (0 = bit-exact); the errors are the file's last two keys
REPORT_KEYS = ("pyqwen.converter.tensor_names", "pyqwen.converter.tensor_sources",
               "pyqwen.converter.tensor_max_error", "pyqwen.converter.tensor_rms_error")

# HF architecture name -> architecture module (params_from_config, expected_tensors, ...)
ARCHITECTURES: dict[str, ModuleType] = {name: qwen35 for name in qwen35.HF_ARCHITECTURES}


@dataclass
class ModelPlan:
    checkpoint: Checkpoint
    hf_arch: str
    arch: ModuleType
    params: Any
    n_mtp: int
    tensors: list[TensorPlan]
    notes: list[str] = field(default_factory=list)


@dataclass
class ConvertResult:
    path: Path
    outtype: str
    n_tensors: int
    nbytes: int  # tensor data bytes
    n_mtp: int
    notes: list[str]
    reports: list[Report]


def hf_architecture(config: dict[str, Any]) -> str:
    arches = config.get("architectures")
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("architectures"):
        arches = text["architectures"]
    if not arches or not isinstance(arches, list) or not isinstance(arches[0], str):
        raise ConversionError("config.json has no 'architectures' entry")
    return arches[0]


def _fmt_shape(s) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


def plan_model(src_dir: str | Path, outtype: str = "auto", *, mtp: bool = True) -> ModelPlan:
    """Everything about the output except tensor data; raises ConversionError
    for any problem found in config.json or the shard headers."""
    if outtype not in OUTTYPES:
        raise ConversionError(f"unknown outtype {outtype!r} (choose from {', '.join(OUTTYPES)})")
    # the architecture first: a foreign model's shards (or their absence) are not worth a word
    hf_arch = hf_architecture(load_config(Path(src_dir)))
    arch = ARCHITECTURES.get(hf_arch)
    if arch is None:
        raise ConversionError(f"unknown architecture {hf_arch!r} in config.json "
                              f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    ckpt = open_checkpoint(src_dir)
    p = arch.params_from_config(ckpt.config, hf_arch)
    notes: list[str] = []
    # vision tower etc. never reach the layout (their dtypes do not matter)
    stored = {n: r for n, r in ckpt.tensors.items() if arch.canonical_name(n) is not None}
    layout = select_layout(ckpt.config, stored, (ckpt.src_dir / "hf_quant_config.json").is_file())
    qcfg = quantization_config(ckpt.config)
    sources = layout.logical_tensors(stored, qcfg)
    if qcfg is not None and not any(s.native for s in sources.values()):
        raise ConversionError(f"config.json has a quantization_config (quant_method={qcfg.get('quant_method')!r}) "
                              f"but no tensor of the checkpoint is stored in its {layout.name} format")

    # canonical name -> source, checkpoint order
    canon: dict[str, SourceTensor] = {}
    for name, src in sources.items():
        c = arch.canonical_name(name)
        if c in canon:
            raise ConversionError(f"tensors {canon[c].name!r} and {name!r} both map to {c!r}")
        canon[c] = src

    mtp_names = [c for c in canon if arch.is_mtp(c)]
    if not mtp:
        n_mtp = 0
        if mtp_names:
            notes.append(f"--no-mtp: dropping {len(mtp_names)} mtp.* tensor(s)")
    elif not mtp_names:
        n_mtp = 0
        if p.n_mtp_config:
            notes.append(f"config.json declares mtp_num_hidden_layers={p.n_mtp_config} but the checkpoint has "
                         "no mtp.* tensors; writing no MTP layer")
    else:
        n_mtp = p.n_mtp_config or arch.mtp_layer_count(mtp_names)
    if not n_mtp:
        for c in mtp_names:
            del canon[c]
    canon = arch.group_sources(p, canon)

    has_head = "lm_head.weight" in canon
    if p.tie_word_embeddings and has_head:
        notes.append("tie_word_embeddings: skipping the stored lm_head.weight (the model uses token_embd)")
        del canon["lm_head.weight"]
    with_output = has_head and not p.tie_word_embeddings
    expected = arch.expected_tensors(p, n_mtp=n_mtp, with_output=with_output)
    if not p.tie_word_embeddings and not has_head:
        raise ConversionError("missing tensor 'lm_head.weight' (tie_word_embeddings is false) in "
                              + ", ".join(f.name for f in ckpt.files))

    plans: list[TensorPlan] = []
    for c, src in canon.items():
        m = expected.get(c)
        if m is None:
            raise ConversionError(f"cannot map tensor {src.name!r} in {src.files}: "
                                  f"{arch.explain_unmapped(p, c, n_mtp)}")
        ok = tuple(src.shape) == m.hf_shape
        if not ok and m.role == arch.CONV1D:  # already squeezed [C, K] is fine too
            ok = tuple(src.shape) == (m.hf_shape[0], m.hf_shape[-1])
        if not ok:
            raise ConversionError(f"tensor {src.name!r} in {src.files} has shape {_fmt_shape(src.shape)}, "
                                  f"expected {_fmt_shape(m.hf_shape)} from config.json")
        shape = arch.output_shape(m.role, m.hf_shape)
        qtype, note = decide_type(m.gguf_name, shape, outtype, src, head_is_token_embd=not with_output)
        if note:
            notes.append(note)
        plans.append(TensorPlan(m.gguf_name, src, m.role, shape, qtype,
                                transform=lambda role, a, p=p: arch.transform(p, role, a),
                                row_local=m.role in arch.ROW_LOCAL_ROLES, permutes=m.role in arch.PERMUTATION_ROLES))
    missing = [c for c in expected if c not in canon]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConversionError(f"missing tensor {missing[0]!r}{more}: config.json needs it but it is in none of "
                              + ", ".join(f.name for f in ckpt.files))
    return ModelPlan(ckpt, hf_arch, arch, p, n_mtp, plans, notes)


def add_hparams(w: gguf.GGUFWriter, kv: list[tuple[str, VT, Any]]) -> None:
    """Typed (key, value type, value) entries; a list value is an array of that type."""
    for key, vt, value in kv:
        if isinstance(value, list):
            w.add_key_value(key, value, VT.ARRAY, sub_type=vt)
        else:
            w.add_key_value(key, value, vt)


def add_tokenizer_fields(w: gguf.GGUFWriter, fields: dict[str, Any]) -> None:
    """Tokenizer fields (plain Python values) with llama.cpp's GGUF types."""
    for key, value in fields.items():
        _add_auto(w, key, value)


def _add_auto(w: gguf.GGUFWriter, key: str, value: Any) -> None:
    """A tokenizer field with llama.cpp's GGUF types (ids UINT32, token types INT32)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        value = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if not value:
            return
        first = value[0]
        sub = (VT.STRING if isinstance(first, str) else VT.BOOL if isinstance(first, bool)
               else VT.INT32 if isinstance(first, int) else VT.FLOAT32)
        w.add_key_value(key, value, VT.ARRAY, sub_type=sub)
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_key_value(key, value, VT.UINT32 if value >= 0 else VT.INT32)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)  # skips "" like llama.cpp
    else:
        raise ConversionError(f"tokenizer field {key!r} has unsupported value type {type(value).__name__}")


def _tokenizer_fields(src_dir: Path, vocab_size: int) -> dict[str, Any]:
    from .vocab import gguf_tokenizer_fields_from_hf

    try:
        return gguf_tokenizer_fields_from_hf(src_dir, vocab_size=vocab_size)
    except (ValueError, OSError, KeyError) as e:
        raise ConversionError(f"tokenizer: {e}") from None


def _general_metadata(w: gguf.GGUFWriter, src_dir: Path) -> None:
    # llama.cpp: gguf.Metadata from README model card, config.json and
    # generation_config.json, name falling back to the directory name
    total = w.get_total_parameter_count()
    md = gguf.Metadata.load(None, src_dir, None, total[0])
    gen = gguf.Metadata.load_generation_config(src_dir)
    if gen and "penalty_repeat" not in gen and gen.get("repetition_penalty") is not None:
        md.sampling_penalty_repeat = gen["repetition_penalty"]  # newer gguf-py reads this too
    if md.name is None:
        md.name = src_dir.name
    if md.size_label is None and total[0] > 0:
        md.size_label = gguf.size_label(*total)
    md.set_gguf_meta_model(w)


def build_writer(mp: ModelPlan, outtype: str, tokenizer: dict[str, Any]) -> tuple[gguf.GGUFWriter, list]:
    """The GGUF header of the plan, and the tensors to write in its order (mp.tensors, then
    RequiresMarker where the file needs pyqwen)."""
    w = gguf.GGUFWriter(path=None, arch=mp.params.arch)
    for t in mp.tensors:
        w.add_tensor_info(t.gguf_name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    w.add_type(gguf.GGUFType.MODEL)
    _general_metadata(w, mp.checkpoint.src_dir.resolve())
    add_hparams(w, mp.arch.gguf_hparams(mp.params, n_mtp=mp.n_mtp, file_type=file_type(outtype, mp.tensors)))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer_fields(w, tokenizer)
    w.add_string(VERSION_KEY, CONVERTER_VERSION)
    extra = _add_extensions(w, mp.tensors)
    names, sources, max_err, rms_err = REPORT_KEYS
    w.add_array(names, [t.gguf_name for t in mp.tensors])
    w.add_array(sources, [t.report.source for t in mp.tensors])
    # placeholders of the final size, filled in by _fill_report once every tensor is measured
    w.add_key_value(max_err, [0.0] * len(mp.tensors), VT.ARRAY, sub_type=VT.FLOAT32)
    w.add_key_value(rms_err, [0.0] * len(mp.tensors), VT.ARRAY, sub_type=VT.FLOAT32)
    return w, mp.tensors + extra


class RequiresMarker:
    """The tensor `pyqwen.requires` (one int8, value unused) of a file that needs pyqwen. No
    weight: upstream llama.cpp ignores pyqwen's keys and would run rotated Q8_0 weights as plain
    ones, but it counts a file's tensors against those it loads and refuses one with more
    ("wrong number of tensors"). pyqwen looks its tensors up by name and skips this one."""

    gguf_name = REQUIRES_KEY
    shape = (1,)
    nbytes = 1

    @staticmethod
    def chunks() -> Iterator[np.ndarray]:
        yield np.ones(1, np.int8)


def _add_extensions(w: gguf.GGUFWriter, tensors: list[TensorPlan]) -> list[RequiresMarker]:
    """Keys of natives whose output needs pyqwen (e.g. comfy.py's rotated weights), the list of
    those features in pyqwen.requires (pyqwen refuses features it does not know) and the tensor
    info of RequiresMarker; returns the extra tensors to write."""
    requires: set[str] = set()
    for t in tensors:
        extensions = getattr(t.src.native, "extensions", None) if t.permutes else None
        if extensions:
            needs, keys = extensions(t.gguf_name, t.qtype)
            requires.update(needs)
            for key, vt, value in keys:
                w.add_key_value(key, value, VT.ARRAY if isinstance(value, list) else vt,
                                sub_type=vt if isinstance(value, list) else None)
    if not requires:
        return []
    w.add_array(REQUIRES_KEY, sorted(requires))
    marker = RequiresMarker()
    w.add_tensor_info(marker.gguf_name, marker.shape, np.dtype(np.int8), marker.nbytes)
    return [marker]


def _pad(f, align: int) -> None:
    n = (-f.tell()) % align
    if n:
        f.write(b"\0" * n)


def _fill_report(path: Path, tensors: list[TensorPlan]) -> None:
    """Write the measured errors into the reserved metadata arrays, in place."""
    r = FieldsReader(path, mode="r+")
    for key, values in ((REPORT_KEYS[2], [t.report.max_error for t in tensors]),
                        (REPORT_KEYS[3], [t.report.rms_error for t in tensors])):
        f = r.fields[key]
        for i, v in zip(f.data, values):
            f.parts[i][...] = v
    r.data.flush()
    del r


def _write(w: gguf.GGUFWriter, tensors: list, tmp: Path, progress: bool, desc: str,
           on_written: Callable[[Any], None] | None) -> None:
    from tqdm import tqdm

    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    align = w.data_alignment
    total = sum(t.nbytes for t in tensors)
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
              file=sys.stderr, disable=not progress, dynamic_ncols=True, leave=True) as bar:
        _pad(f, align)
        for t in tensors:
            bar.set_postfix_str(t.gguf_name, refresh=False)
            start = f.tell()
            for chunk in t.chunks():
                f.write(memoryview(chunk).cast("B"))
                bar.update(chunk.nbytes)
                del chunk
            if f.tell() - start != t.nbytes:
                raise AssertionError(f"{t.gguf_name}: wrote {f.tell() - start} bytes, planned {t.nbytes}")
            _pad(f, align)
            if on_written:
                on_written(t)
    w.close()


def _reserve_tmp(out: Path) -> Path:
    # created like any new file (0666 & ~umask), so the renamed output gets normal permissions
    for _ in range(100):
        tmp = out.with_name(f"{out.name}.tmp-{secrets.token_hex(4)}")
        try:
            with open(tmp, "xb"):
                return tmp
        except FileExistsError:
            continue
        except OSError as e:
            raise ConversionError(f"cannot create {tmp}: {e.strerror or e}") from None
    raise ConversionError(f"cannot create a temporary file next to {out}")


def check_output_path(out: Path) -> None:
    """Fail early (before any slow work) on an output path that cannot be written."""
    if out.is_dir():
        raise ConversionError(f"output path is a directory: {out}")
    if not out.parent.is_dir():
        raise ConversionError(f"output directory does not exist: {out.parent}")


def write_gguf(w: gguf.GGUFWriter, tensors: list, out: Path, *, progress: bool, desc: str,
               on_written: Callable[[Any], None] | None = None,
               finish: Callable[[Path], None] | None = None) -> None:
    """Write the header, metadata and tensor infos of `w`, then each tensor's
    chunks() (a TensorPlan or anything with gguf_name, nbytes and chunks()),
    to a temporary file next to `out`; on_written(tensor) follows each tensor,
    finish(temporary path) the whole file, and only then is it renamed to `out`."""
    tmp = _reserve_tmp(out)
    try:
        _write(w, tensors, tmp, progress, desc, on_written)
        if finish:
            finish(tmp)
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


def convert(src_dir: str | Path, out_path: str | Path, *, outtype: str = "auto", mtp: bool = True,
            progress: bool = False, log: Callable[[str], None] | None = None,
            report: Callable[[Report], None] | None = None) -> ConvertResult:
    """Convert the HF checkpoint in `src_dir` to the GGUF file `out_path`.

    outtype: auto (each tensor's own precision: float tensors keep their type,
    quantized ones go to their lossless ggml type) | f32 | f16 | bf16 | q8_0 |
    q4_0 | q4_k | q6_k (2-D weights; norms and 1-D stay F32).
    mtp: keep the multi-token-prediction layer when the checkpoint has one.
    progress: tqdm bar (bytes) on stderr. log: receives notes (type fallbacks, ...).
    report: receives each tensor's Report (type, exact or max/RMS error) once written.
    Raises ConversionError for bad input; no partial output is ever left.
    """
    src = Path(src_dir)
    out = Path(out_path)
    mp = plan_model(src, outtype, mtp=mtp)
    if log:
        for n in mp.notes:
            log(n)
    check_output_path(out)
    tokenizer = _tokenizer_fields(src, mp.params.n_vocab)
    w, tensors = build_writer(mp, outtype, tokenizer)
    write_gguf(w, tensors, out, progress=progress, desc="pyqwen-convert",
               on_written=(lambda t: isinstance(t, TensorPlan) and report(t.report)) if report else None,
               finish=lambda tmp: _fill_report(tmp, mp.tensors))
    return ConvertResult(out, outtype, len(mp.tensors), sum(t.nbytes for t in mp.tensors), mp.n_mtp, mp.notes,
                         [t.report for t in mp.tensors])


class _Terminated(KeyboardInterrupt):
    pass


def _raise_terminated(signum, frame):  # SIGTERM -> same cleanup path as Ctrl-C
    raise _Terminated()


def install_sigterm_handler():
    """Make SIGTERM unwind like Ctrl-C (so the temp file is removed); returns
    the previous handler (None when not on the main thread)."""
    try:
        return signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:
        return None


def run_command(prog: str, write: Callable[[], Any], errors: tuple[type[BaseException], ...]) -> tuple[int, Any]:
    """Run a file-writing command line: (exit status, what write() returned or None). Bad input
    (one of `errors`) is one `prog: error: ...` line and status 1; Ctrl-C or SIGTERM leaves no
    output and gives 130."""
    prev = install_sigterm_handler()
    try:
        return 0, write()
    except errors as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1, None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted, no output written", file=sys.stderr)
        return 130, None
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)

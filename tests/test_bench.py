"""pyqwen-bench, the tool issue 6's targets are measured with: its tests, records and output formats on the
tiny model, and its refusals of bad input (an exit status and a message, never a traceback)."""
from __future__ import annotations

import csv
import io
import json
import math
import statistics

import pytest

from pyqwen.bench import main


def _run(capsys, *args: str) -> str:
    assert main([*args, "-t", "2"]) == 0
    return capsys.readouterr().out


def test_tests_records_and_order(tiny_gguf, capsys):
    out = _run(capsys, "-m", str(tiny_gguf), "-p", "8", "-n", "4", "-pg", "8,4", "-d", "0,16", "-r", "2", "-o", "jsonl")
    recs = [json.loads(line) for line in out.splitlines()]
    # llama-bench's order: for each depth, the prompts, then the generations, then the pairs
    assert [r["test"] for r in recs] == ["pp8", "tg4", "pp8+tg4", "pp8 @ d16", "tg4 @ d16", "pp8+tg4 @ d16"]
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in recs] == [
        (8, 0, 0), (0, 4, 0), (8, 4, 0), (8, 0, 16), (0, 4, 16), (8, 4, 16)]
    for r in recs:
        assert len(r["samples_ns"]) == 2 and all(ns > 0 for ns in r["samples_ns"])
        tokens = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"] == pytest.approx([tokens * 1e9 / ns for ns in r["samples_ns"]])
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]))
        assert r["stddev_ts"] == pytest.approx(statistics.stdev(r["samples_ts"]))
        assert math.isfinite(r["avg_ts"]) and r["avg_ts"] > 0 and r["host_us_per_token"] >= 0
        assert r["model_n_params"] > 0 and r["model_size"] > 0 and r["flash_attn"] == 1 and r["mtp"] == "off"


def test_output_formats_agree(tiny_gguf, capsys):
    common = ["-m", str(tiny_gguf), "-p", "4", "-n", "2", "-r", "1", "--seed", "3"]
    rows = list(csv.DictReader(io.StringIO(_run(capsys, *common, "-o", "csv"))))
    records = json.loads(_run(capsys, *common, "-o", "json"))
    assert [r["test"] for r in rows] == [r["test"] for r in records] == ["pp4", "tg2"]
    assert [int(r["n_prompt"]) for r in rows] == [r["n_prompt"] for r in records]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_markdown_shows_a_parameter_only_off_its_default(tiny_gguf, capsys):
    header, rule, row = _run(capsys, "-m", str(tiny_gguf), "-p", "4", "-n", "0", "-r", "1").splitlines()
    assert "n_batch" not in _cells(header) and len(_cells(rule)) == len(_cells(header))
    assert dict(zip(_cells(header), _cells(row)))["test"] == "pp4"
    header, _, row = _run(capsys, "-m", str(tiny_gguf), "-p", "4", "-n", "0", "-r", "1", "-b", "2").splitlines()
    assert dict(zip(_cells(header), _cells(row)))["n_batch"] == "2"


@pytest.mark.parametrize("args, message", [
    (["-fa", "0"], "flash attention"),
    (["-ctk", "q9_9"], "cache type"),
    (["-r", "0"], "-r must be at least 1"),
    (["-d", "-1"], "n_depth values must be >= 0"),
    (["-b", "0"], "-b values must be positive"),
    (["-pg", "8,4,2"], "pairs"),
    (["-n", "4,x"], "comma-separated integers"),
])
def test_bad_options_are_refused(tiny_gguf, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main(["-m", str(tiny_gguf), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bad_model_files_are_refused(tiny_gguf, tmp_path, capsys):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(SystemExit) as e:
        main(["-m", str(missing)])
    assert e.value.code == 2 and "model file not found" in capsys.readouterr().err
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(SystemExit) as e:
        main(["-m", str(foreign)])
    assert e.value.code == 2 and "not a GGUF file" in capsys.readouterr().err
    # a GGUF that passes the header check but is cut short fails when loaded: status 1, one line, no traceback
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    assert main(["-m", str(truncated), "-p", "4", "-n", "0", "-r", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyqwen-bench: ") and "Traceback" not in err

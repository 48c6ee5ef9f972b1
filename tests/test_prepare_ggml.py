"""vendor/prepare_ggml.py refuses a patch whose hunk headers miscount their lines: patch(1) would
apply the hunks up to such a header and silently skip the file's later ones (a hand-merged patch
once lost its supports_op hunk that way, and the op ran on the CPU)."""
from __future__ import annotations

import pytest

from upstream import load_prepare_ggml

prepare_ggml = load_prepare_ggml()

GOOD = """Header paragraph: what, why, effect.
--- a/src/x.c
+++ b/src/x.c
@@ -1,3 +1,4 @@
 int a;
+int b;
 int c;
 int d;
@@ -10,2 +11,3 @@
 int e;
+int f;
 int g;
"""


def test_shipped_patches_count_their_lines():
    for patch in prepare_ggml.patch_files():
        prepare_ggml.check_hunk_counts(patch)


def test_well_formed_patch_passes(tmp_path):
    patch = tmp_path / "good.patch"
    patch.write_text(GOOD)
    prepare_ggml.check_hunk_counts(patch)


@pytest.mark.parametrize("header, line", [("@@ -1,2 +1,3 @@", 4),    # undercounts: the last context line overruns
                                          ("@@ -1,4 +1,5 @@", 4),    # overcounts: the hunk ends before its count
                                          ("@@ -10,2 +11,4 @@", 9)])  # the last hunk overcounts at end of file
def test_miscounted_hunk_is_refused(tmp_path, header, line):
    bad = GOOD.splitlines(keepends=True)
    bad[line - 1] = header + "\n"
    patch = tmp_path / "bad.patch"
    patch.write_text("".join(bad))
    with pytest.raises(prepare_ggml.PrepareError, match=f"bad.patch: the hunk at line {line} "):
        prepare_ggml.check_hunk_counts(patch)

"""The device the suite runs on. PYQWEN_TEST_NGL=N runs every model with N layers on the GPU (-1: all),
so the same tests check a CUDA build; unset, everything runs on the CPU."""
from __future__ import annotations

import os

TEST_NGL = int(os.environ.get("PYQWEN_TEST_NGL") or 0)
ON_GPU = TEST_NGL != 0

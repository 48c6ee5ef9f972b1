"""Generate the cffi extension's C source from pyqwen.h (API mode).

The declarations between the PYQWEN_CDEF_BEGIN/END markers of pyqwen.h are the whole Python-visible
API; API mode compiles the generated source against the real header, so a wrong declaration fails
the build instead of crashing at run time.
"""
import sys
from pathlib import Path

import cffi

HEADER = Path(__file__).with_name("pyqwen.h")


def cdef_text() -> str:
    text = HEADER.read_text()
    begin = text.index("/* PYQWEN_CDEF_BEGIN */") + len("/* PYQWEN_CDEF_BEGIN */")
    end = text.index("/* PYQWEN_CDEF_END */")
    return text[begin:end].replace("PQ_API ", "")


def main(out: str) -> None:
    ffi = cffi.FFI()
    ffi.cdef(cdef_text())
    ffi.set_source("pyqwen._cffi", '#include "pyqwen.h"')
    ffi.emit_c_code(out)


if __name__ == "__main__":
    main(sys.argv[1])

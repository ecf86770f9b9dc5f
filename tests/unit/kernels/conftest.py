"""Every Triton kernel in these tests runs in Triton's interpreter, on the CPU.

triton.jit decides when a kernel is defined (its module imported) whether it
compiles for a GPU or runs interpreted, reading TRITON_INTERPRET then; pytest
imports this file before any test module beside it, so setting it here, at
import, comes first.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

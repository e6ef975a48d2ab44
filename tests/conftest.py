"""Test-session settings: one torch thread per pytest-xdist worker (no oversubscription), and,
without CUDA, Triton's CPU interpreter for the fused kernel's tests: TRITON_INTERPRET=1 must be
set before triton's first import in the process, whichever test imports it first."""

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

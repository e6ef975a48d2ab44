"""Test-session settings: one torch thread per pytest-xdist worker (no oversubscription); a
temporary cache folder (the loaders' decoded-image cache defaults to the user's cache folder,
which tests must not write); and, without CUDA, Triton's CPU interpreter for the fused kernel's
tests: TRITON_INTERPRET=1 must be set before triton's first import in the process, whichever
test imports it first."""

import atexit
import os
import shutil
import tempfile

import torch

_cache = tempfile.mkdtemp(prefix="hrope-test-cache-")
atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = _cache

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

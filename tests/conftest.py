"""Test-session settings: one torch thread per pytest-xdist worker (no oversubscription)."""

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

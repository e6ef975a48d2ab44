"""Test-session settings: one torch thread per pytest-xdist worker (no oversubscription); a
temporary cache folder (the loaders' decoded-image cache defaults to the user's cache folder,
which tests must not write); and, without CUDA, Triton's CPU interpreter for the fused kernel's
tests: TRITON_INTERPRET=1 must be set before triton's first import in the process, whichever
test imports it first. The order is shuffled by pytest-randomly, which reseeds ``random`` and numpy
per test; torch's global generator is seeded here per test and per fixture, so that what a test
draws without a generator of its own does not depend on the tests before it."""

import atexit
import os
import shutil
import tempfile
import zlib

import pytest
import torch

_cache = tempfile.mkdtemp(prefix="hrope-test-cache-")
atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = _cache

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _seed_torch(*names: object) -> None:
    torch.manual_seed(zlib.crc32("::".join(map(str, names)).encode()))


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> None:
    """A module-scoped fixture draws the same numbers whichever test sets it up first."""
    owner = request.node.nodeid if fixturedef.scope == "function" else fixturedef.baseid
    _seed_torch(owner, fixturedef.argname, getattr(request, "param", None))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _seed_torch(item.nodeid, "call")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The order's seed, also under -q and pytest-xdist (pytest-randomly prints it in the header only)."""
    seed = config.getoption("randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"random test order: --randomly-seed={seed} replays it")

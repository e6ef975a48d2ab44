"""What this installation of hrope is and what it can use (``hrope --version``, ``hrope info``).

:func:`package_version` reads the installed distribution's metadata (the version in
pyproject.toml); :func:`environment` collects the facts a bug report needs: hrope, Python and
torch versions, the torch build (CPU, CUDA or ROCm), whether CUDA and Triton are usable, the
registered encodings and the transform backends; :func:`report` prints them as text. Nothing
here imports triton or initialises CUDA beyond ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import importlib.util
import platform
import shutil
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from .encodings import ENCODINGS
from .encodings.base import BACKENDS

__all__ = ["package_version", "version_line", "torch_build", "environment", "report", "UNINSTALLED_VERSION"]

# the version of a source tree imported without an install (no distribution metadata)
UNINSTALLED_VERSION = "0+unknown"


def package_version(distribution: str = "hrope") -> str:
    """The installed version of ``distribution`` (its metadata), :data:`UNINSTALLED_VERSION` when
    it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return UNINSTALLED_VERSION


def torch_build() -> str:
    """``"CUDA 12.4"``, ``"ROCm 6.2"`` or ``"CPU"``: what the installed torch was built for."""
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    hip = getattr(torch.version, "hip", None)
    return f"ROCm {hip}" if hip else "CPU"


def version_line() -> str:
    """``hrope 0.1.0 (torch 2.13.0, CPU build)``: what ``hrope --version`` prints."""
    return f"hrope {package_version()} (torch {torch.__version__}, {torch_build()} build)"


def _cuda() -> dict[str, Any]:
    usable = torch.cuda.is_available()
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if usable else []
    return {"usable": usable, "devices": devices}


def _triton() -> dict[str, Any]:
    """Triton's version (None when not installed) and whether the fused kernel runs on CUDA here."""
    installed = importlib.util.find_spec("triton") is not None
    return {
        "version": package_version("triton") if installed else None,
        "fused_kernel_on_cuda": installed and torch.cuda.is_available(),
    }


def _encodings() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "kind": "query-frame" if cls.query_frame else "relative",
            "needs_planes": cls.needs_planes,
            "params": list(cls.param_names),
        }
        for name, cls in ENCODINGS.items()
    ]


def environment() -> dict[str, Any]:
    """Versions, the torch build, CUDA (usable, device names), Triton (version, fused kernel usable
    on CUDA), the encodings (name, kind, inputs), the transform backends (and what ``auto`` picks
    here) and whether a C++ compiler for ``torch.compile``'s CPU backend is on the PATH."""
    cuda, triton = _cuda(), _triton()
    return {
        "hrope": package_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_build": torch_build(),
        "cuda": cuda,
        "triton": triton,
        "backends": list(BACKENDS),
        "auto_backend": "triton on CUDA tensors" if triton["fused_kernel_on_cuda"] else "torch",
        "cpp_compiler": shutil.which("c++") or shutil.which("g++"),
        "encodings": _encodings(),
    }


def _encoding_line(entry: dict[str, Any]) -> str:
    inputs = (["planes"] if entry["needs_planes"] else []) + entry["params"]
    return f"  {entry['name']:<11} {entry['kind']:<11} {', '.join(inputs) or '-'}"


def report(facts: dict[str, Any] | None = None) -> str:
    """:func:`environment` (or ``facts``) as the text ``hrope info`` prints."""
    facts = environment() if facts is None else facts
    cuda, triton = facts["cuda"], facts["triton"]
    devices = f" ({', '.join(cuda['devices'])})" if cuda["devices"] else ""
    if triton["version"] is None:
        triton_line = "not installed (transform backend triton unavailable)"
    elif triton["fused_kernel_on_cuda"]:
        triton_line = f"{triton['version']} (fused kernel usable on CUDA)"
    else:
        interpreter = "no CUDA device: the fused kernel runs in the CPU interpreter only, TRITON_INTERPRET=1"
        triton_line = f"{triton['version']} ({interpreter})"
    lines = [
        f"hrope {facts['hrope']}",
        f"python {facts['python']} on {facts['platform']}",
        f"torch {facts['torch']} ({facts['torch_build']} build)",
        f"CUDA usable: {'yes' if cuda['usable'] else 'no'}{devices}",
        f"triton: {triton_line}",
        f"transform backends: {', '.join(facts['backends'])} (auto uses {facts['auto_backend']} here)",
        f"torch.compile CPU backend (inductor) C++ compiler: {facts['cpp_compiler'] or 'none found'}",
        f"encodings ({len(facts['encodings'])}): name, kind, per-token inputs",
        *(_encoding_line(entry) for entry in facts["encodings"]),
    ]
    return "\n".join(lines) + "\n"

"""``hrope.__version__``, ``hrope --version`` and ``hrope info``: what they report is what is installed."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

import hrope
import hrope.nvs
from hrope.about import UNINSTALLED_VERSION, environment, package_version, report, torch_build
from hrope.encodings.base import BACKENDS
from hrope.nvs.cli import run

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_the_installed_metadata_and_pyproject_s():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert hrope.__version__ == version("hrope") == declared
    assert package_version("hrope-no-such-distribution") == UNINSTALLED_VERSION


def test_version_option_prints_hrope_and_torch(capsys):
    with pytest.raises(SystemExit) as exit_:
        run(["--version"])
    assert exit_.value.code == 0
    expected = f"hrope {hrope.__version__} (torch {torch.__version__}, {torch_build()} build)"
    assert capsys.readouterr().out.strip() == expected


def test_torch_build_names_what_torch_was_built_for():
    expected = f"CUDA {torch.version.cuda}" if torch.version.cuda else ("ROCm" if torch.version.hip else "CPU")
    assert torch_build().startswith(expected)


def test_info_json_lists_what_this_installation_has(capsys):
    assert run(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["hrope"] == hrope.__version__ and facts["torch"] == torch.__version__
    assert [e["name"] for e in facts["encodings"]] == list(hrope.ENCODINGS)
    kinds = {e["name"]: e["kind"] for e in facts["encodings"]}
    assert kinds["rayrope"] == "query-frame" and kinds["hrope-lift"] == "relative"
    assert {e["name"]: e["needs_planes"] for e in facts["encodings"]}["hrope"] is True
    assert facts["backends"] == list(BACKENDS)
    assert facts["cuda"]["usable"] == torch.cuda.is_available()
    assert len(facts["cuda"]["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert (facts["triton"]["version"] is None) == (importlib.util.find_spec("triton") is None)


def test_info_text_has_one_line_per_fact_and_encoding(capsys):
    assert run(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"hrope {hrope.__version__}"
    assert f"torch {torch.__version__} ({torch_build()} build)" in lines
    assert f"CUDA usable: {'yes' if torch.cuda.is_available() else 'no'}" in "\n".join(lines)
    for name in hrope.ENCODINGS:
        assert any(line.split()[:1] == [name] for line in lines), name


def test_report_says_where_the_fused_kernel_runs():
    """The branches a GPU machine or a machine without triton takes, from given facts."""
    facts = environment()
    gpu = {**facts, "cuda": {"usable": True, "devices": ["GPU A", "GPU B"]}}
    gpu["triton"] = {"version": "3.4.0", "fused_kernel_on_cuda": True}
    gpu["auto_backend"] = "triton on CUDA tensors"
    text = report(gpu)
    assert "CUDA usable: yes (GPU A, GPU B)" in text
    assert "triton: 3.4.0 (fused kernel usable on CUDA)" in text
    assert "auto uses triton on CUDA tensors here" in text
    without = {**facts, "triton": {"version": None, "fused_kernel_on_cuda": False}}
    assert "triton: not installed" in report(without)


def test_info_refuses_extra_arguments(capsys):
    assert run(["info", "--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hrope info: error: unrecognized arguments: --bogus")


def test_version_and_info_work_without_the_toolkit(monkeypatch, capsys):
    monkeypatch.setattr(hrope.nvs, "missing_requirements", lambda: ["pyyaml"])
    with pytest.raises(SystemExit) as exit_:
        hrope.nvs.main(["info"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"hrope {hrope.__version__}\n") and out.rstrip().endswith("NVS toolkit: missing pyyaml")
    with pytest.raises(SystemExit) as exit_:
        hrope.nvs.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"hrope {hrope.__version__} (torch ")
    with pytest.raises(SystemExit) as exit_:
        hrope.nvs.main(["train", "configs/tiny.yaml"])
    assert exit_.value.code == 2 and "pip install 'hrope[nvs]'" in capsys.readouterr().err

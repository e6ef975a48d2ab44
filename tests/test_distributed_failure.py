"""torchrun on the CPU (gloo, 2 ranks): a rank that fails (a bad scene, SIGKILL) makes every rank
stop with that error, each as one line, and the last checkpoint stays loadable; a run folder held
by another process is refused on every rank alike."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _lvsm_helpers import small_config

from hrope.nvs.running.checkpoints import load_checkpoint, load_model
from hrope.nvs.config import save_config, update_config
from hrope.nvs.running.folder_lock import FolderLock

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import hrope.nvs.running.train as training
    from hrope.nvs.cli import run
    from hrope.nvs.data.scene import SceneError

    mode, config, out = sys.argv[1:]
    build_dataset = training.build_dataset

    class Failing:
        '''Rank 1's fifth scene fails: a SceneError, or the rank is killed.'''

        def __init__(self, scenes):
            self.scenes, self.calls = scenes, 0

        def __len__(self):
            return len(self.scenes)

        def __getitem__(self, index):
            self.calls += 1
            if os.environ["RANK"] == "1" and self.calls == 5:
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise SceneError("scene 'bad': cannot read frames[0]")
            return self.scenes[index]

    training.build_dataset = lambda config, split: Failing(build_dataset(config, split))
    sys.exit(run(["train", config, "--out", out]))
""")


def torchrun(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, Path]:
    config = small_config(encoding="prope")
    config = update_config(config, {"train": dict(steps=8, checkpoint_every=2, image_every=0, dist_timeout=60)})
    config_file = save_config(config, tmp_path / "config")
    script = tmp_path / "failing_rank.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    command = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    result = subprocess.run(
        [command, "--standalone", "--nproc_per_node", "2", str(script), mode, str(config_file), str(out)],
        env=env,
        timeout=240,
        capture_output=True,
        text=True,
    )
    return result, out


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    """The ranks' one-line errors (a line may follow rank 0's progress bar after a carriage return)."""
    return re.findall(r"hrope train: error: [^\r\n]*", result.stderr)


@pytest.mark.slow
def test_a_rank_with_a_bad_scene_stops_every_rank_with_its_error(tmp_path):
    result, out = torchrun(tmp_path, "raise")
    assert result.returncode != 0
    lines = error_lines(result)
    assert "hrope train: error: scene 'bad': cannot read frames[0]" in lines  # rank 1, its own error
    step = load_checkpoint(out)["step"]
    assert (
        f"hrope train: error: rank 1: SceneError: scene 'bad': cannot read frames[0]; rank 0 stopped too "
        f"(last checkpoint: step {step} in {out / 'checkpoint.safetensors'})"
    ) in lines, result.stderr[-3000:]
    assert step in (2, 4, 6) and not re.search(r"\[rank\d\]: Traceback", result.stderr)  # no rank's traceback
    load_model(out)  # loadable: checksum and weights verified


@pytest.mark.slow
def test_a_killed_rank_stops_the_others_and_leaves_a_loadable_checkpoint(tmp_path):
    result, out = torchrun(tmp_path, "kill")
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(
        "hrope train: error: rank 0 lost contact with the other ranks: one was killed (SIGKILL, out of memory) "
        "or did not answer within train.dist_timeout = 60 s ("
    ), result.stderr[-3000:]
    step = load_checkpoint(out)["step"]
    assert lines[0].endswith(f"; last checkpoint: step {step} in {out / 'checkpoint.safetensors'}")
    assert step in (2, 4, 6)
    load_model(out)


@pytest.mark.slow
def test_every_rank_refuses_a_run_folder_held_by_another_process(tmp_path):
    with FolderLock(tmp_path / "run", "train.out"):
        result, out = torchrun(tmp_path, "none")
    lines = error_lines(result)
    expected = f"hrope train: error: train.out {out} is in use by process {os.getpid()} "
    assert len(lines) == 2 and all(line.startswith(expected) for line in lines), result.stderr[-3000:]
    assert not (out / "checkpoint.safetensors").exists()

"""Bad inputs: every one ends in exit code 2 and one ``initlint: error: ...`` line, never a traceback.

The CLI cases run the installed ``initlint`` in a subprocess, the way a user or CI does.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest
import torch
import torch.nn as nn

import initlint
import initlint.api as api

LINEAR_MODEL = """
import torch.nn as nn

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)
"""


def run_cli(*args: str, cwd: Path, script: bool = False) -> subprocess.CompletedProcess:
    command = [os.path.join(os.path.dirname(sys.executable), "initlint")] if script else [sys.executable, "-m", "initlint"]
    env = dict(os.environ, INITLINT_NO_PROGRESS="1", NO_COLOR="1")
    return subprocess.run(command + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one stderr line of a failed run (asserting there is exactly one and no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout
    lines: List[str] = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("initlint: error: "), lines[0]
    assert result.returncode == 2, (result.returncode, result.stderr)
    return lines[0]


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


# ------------------------------------------------------------------ targets
def test_missing_path_via_console_script(tmp_path):
    line = error_line(run_cli("check", "missing.py", cwd=tmp_path, script=True))
    assert "missing.py" in line and "no such file" in line


def test_missing_path(tmp_path):
    line = error_line(run_cli("check", "nowhere/missing.py", cwd=tmp_path))
    assert "nowhere/missing.py" in line and "no such file" in line


def test_directory(tmp_path):
    (tmp_path / "models").mkdir()
    line = error_line(run_cli("check", "models", cwd=tmp_path))
    assert "models" in line and "is a directory" in line


def test_non_python_file(tmp_path):
    (tmp_path / "notes.txt").write_text("not python\n")
    line = error_line(run_cli("check", "notes.txt", cwd=tmp_path))
    assert "notes.txt" in line and "not a Python file" in line


def test_syntax_error_names_file_and_line(tmp_path):
    write(tmp_path, "broken.py", """
        import torch.nn as nn

        class M(nn.Module):
            def __init__(self)
                super().__init__()
        """)
    line = error_line(run_cli("check", "broken.py", cwd=tmp_path))
    assert "syntax error" in line and "broken.py:4" in line


def test_import_error_names_file_and_line(tmp_path):
    write(tmp_path, "needs_missing.py", """
        import torch.nn as nn
        import a_module_that_does_not_exist_anywhere

        class M(nn.Module):
            pass
        """)
    line = error_line(run_cli("check", "needs_missing.py", cwd=tmp_path))
    assert "needs_missing.py" in line and "line 2" in line
    assert "ModuleNotFoundError" in line and "a_module_that_does_not_exist_anywhere" in line


def test_file_without_models(tmp_path):
    write(tmp_path, "plain.py", """
        def add(a, b):
            return a + b
        """)
    line = error_line(run_cli("check", "plain.py", cwd=tmp_path))
    assert "plain.py" in line and "defines no nn.Module" in line


def test_file_without_models_is_skipped_when_asked(tmp_path):
    write(tmp_path, "plain.py", "X = 1\n")
    result = run_cli("check", "--skip-files-without-models", "plain.py", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == ""


def test_constructor_needing_arguments(tmp_path):
    write(tmp_path, "wide.py", """
        import torch.nn as nn

        class Wide(nn.Module):
            def __init__(self, width, depth=2):
                super().__init__()
                self.fc = nn.Linear(width, width)
        """)
    line = error_line(run_cli("check", "wide.py", cwd=tmp_path))
    assert "Wide" in line and "constructor arguments (width)" in line


def test_forward_raising_shows_the_probe_shape(tmp_path):
    write(tmp_path, "raises.py", """
        import torch.nn as nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x):
                raise ValueError("forward is not implemented yet")
        """)
    line = error_line(run_cli("check", "raises.py", cwd=tmp_path))
    assert "ValueError: forward is not implemented yet" in line
    assert "(16, 8)" in line  # the inferred probe batch that was tried


@pytest.mark.parametrize("shape", ["8,x", "a,b", "8,,4", "0,8", "-1,8", ""])
def test_malformed_input_shape(tmp_path, shape):
    write(tmp_path, "linear.py", LINEAR_MODEL)
    line = error_line(run_cli("check", "linear.py", "--input-shape", shape, cwd=tmp_path))
    assert f"--input-shape '{shape}'" in line and "positive integers" in line


def test_input_shape_not_matching_the_model(tmp_path):
    write(tmp_path, "linear.py", LINEAR_MODEL)
    line = error_line(run_cli("check", "linear.py", "--input-shape", "2,5", cwd=tmp_path))
    assert "(2, 5)" in line and "forward raised" in line and "--input-shape" in line


def test_unknown_rule_code_in_select(tmp_path):
    write(tmp_path, "linear.py", LINEAR_MODEL)
    line = error_line(run_cli("check", "linear.py", "--select", "IL001,XX123", cwd=tmp_path))
    assert "unknown rule code 'XX123'" in line


def test_unavailable_cuda_device(tmp_path):
    write(tmp_path, "linear.py", LINEAR_MODEL)
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last device: absent on every machine
    line = error_line(run_cli("check", "linear.py", "--device", missing, cwd=tmp_path))
    assert missing in line or "cuda" in line
    if not torch.cuda.is_available():
        assert "no usable CUDA device" in error_line(run_cli("check", "linear.py", "--device", "cuda", cwd=tmp_path))


# ------------------------------------------------------------------ models without parameters
NO_PARAMS = """
    import torch.nn as nn

    class OnlyRelu(nn.Sequential):
        def __init__(self):
            super().__init__(nn.ReLU())
    """


def test_model_without_parameters_needs_an_input_shape(tmp_path):
    write(tmp_path, "relu.py", NO_PARAMS)
    line = error_line(run_cli("check", "relu.py", cwd=tmp_path))
    assert "cannot infer a probe input" in line and "--input-shape" in line


def test_model_without_parameters_audits_with_an_input_shape(tmp_path):
    write(tmp_path, "relu.py", NO_PARAMS)
    result = run_cli("check", "relu.py", "--input-shape", "4,3", cwd=tmp_path)
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no findings" in result.stdout


def test_model_without_parameters_python_api():
    report = initlint.audit(nn.Sequential(nn.ReLU()), input_shapes=[(4, 3)])
    assert report.error is None and report.findings == []
    with pytest.raises(initlint.LoadError, match="--input-shape"):
        initlint.audit(nn.Sequential(nn.ReLU()))


# ------------------------------------------------------------------ inputs and devices (Python API)
def test_nan_in_user_inputs_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(initlint.LoadError, match="NaN or Inf"):
        initlint.audit(model, torch.full((2, 4), float("nan")))
    with pytest.raises(initlint.LoadError, match="NaN or Inf"):
        initlint.audit(model, {"input": torch.tensor([[0.0, float("inf"), 1.0, 2.0]])})


def test_meta_device_model_runs_static_rules_only_when_the_meta_device_is_asked_for():
    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    report = initlint.audit(model, device="meta")  # without device="meta" it is audited block by block
    assert report.device == "meta"
    assert any("meta device" in note and "only graph rules ran" for note in report.notes), report.notes
    assert {f.code for f in report.findings} == {"IL002"}  # the graph rule still sees the cancelled bias
    assert report.probe.forward_ran is False


def test_meta_device_model_from_the_cli(tmp_path):
    write(tmp_path, "meta.py", """
        import torch
        import torch.nn as nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                with torch.device("meta"):
                    self.fc = nn.Linear(8, 4)

            def forward(self, x):
                return self.fc(x)
        """)
    result = run_cli("check", "meta.py", cwd=tmp_path)
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert "note: the model is on the meta device: audited block by block" in result.stdout


# ------------------------------------------------------------------ out of memory
def test_out_of_memory_on_the_first_probe_retries_with_a_smaller_batch(monkeypatch):
    calls = []
    real = api.run_probe

    def flaky(cap, args, kwargs, **options):
        calls.append(args[0].shape[0])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(cap, args, kwargs, **options)

    monkeypatch.setattr(api, "run_probe", flaky)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    report = initlint.audit(model)
    assert calls == [16, 8]
    assert any("ran out of memory" in n and "batch of 8" in n for n in report.notes), report.notes
    assert report.probe.forward_ran and report.probe.backward_ran


class _NeedsSmallBatch(nn.Module):
    """Raises the CPU allocator's out-of-memory error for batches above ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                               "can't allocate memory: you tried to allocate 40000000000000 bytes.")
        return self.fc(x)


def test_cpu_out_of_memory_halves_until_it_fits():
    report = initlint.audit(_NeedsSmallBatch(limit=4))
    notes = [n for n in report.notes if "ran out of memory" in n]
    assert [n.rsplit(" ", 1)[-1] for n in notes] == ["8", "4"]
    assert report.probe.forward_ran


def test_out_of_memory_even_at_batch_one_is_a_load_error():
    with pytest.raises(initlint.LoadError, match="out of memory even with a batch of 1"):
        initlint.audit(_NeedsSmallBatch(limit=0))


def test_a_failure_inside_initlint_is_not_blamed_on_the_model(monkeypatch):
    import initlint.probe as probe

    original = probe._derive

    def broken(*args, **kwargs):
        original(None)  # raises inside initlint's own code

    monkeypatch.setattr(probe, "put_softmax", broken)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(initlint.LoadError, match="bug in initlint"):
        initlint.audit(model, torch.randn(2, 4), logits=True)
    with pytest.raises(initlint.LoadError, match="the model's forward raised"):
        initlint.audit(torch.nn.Sequential(torch.nn.Linear(5, 4)), torch.randn(2, 4))

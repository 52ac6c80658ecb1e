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
from cli_server import run_initlint
import torch
import torch.nn as nn

import initlint
import initlint.api as api
import initlint.attempts as attempts

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
    if not script:
        return run_initlint(list(args), cwd=cwd, env=env)
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
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "initlint")):
        pytest.skip("initlint's console script is not installed beside this Python (pip install -e .)")
    line = error_line(run_cli("check", "missing.py", cwd=tmp_path, script=True))
    assert "missing.py" in line and "no such file" in line


def test_missing_path(tmp_path):
    line = error_line(run_cli("check", "nowhere/missing.py", cwd=tmp_path))
    assert "nowhere/missing.py" in line and "no such file" in line


def test_directory_without_models(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "utils.py").write_text("def helper():\n    return 1\n")
    line = error_line(run_cli("check", "models", cwd=tmp_path))
    assert "models" in line and "no Python file below it defines a torch nn.Module subclass" in line


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
    real = attempts.run_probe

    def flaky(cap, args, kwargs, **options):
        calls.append(args[0].shape[0])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(cap, args, kwargs, **options)

    monkeypatch.setattr(attempts, "run_probe", flaky)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    report = initlint.audit(model)
    assert calls == [16, 8]
    assert any("ran out of memory" in n and "batch of 8" in n for n in report.notes), report.notes
    assert report.probe.forward_ran and report.probe.backward_ran


CPU_OUT_OF_MEMORY = "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: " \
    "you tried to allocate 40000000000000 bytes."


class _NeedsSmallBatch(nn.Module):
    """Raises a CPU out-of-memory error (the allocator's, by default) for batches above ``limit``."""

    def __init__(self, limit: int, error: Exception = RuntimeError(CPU_OUT_OF_MEMORY)) -> None:
        super().__init__()
        self.limit, self.error = limit, error
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise self.error
        return self.fc(x)


@pytest.mark.parametrize("error", [RuntimeError(CPU_OUT_OF_MEMORY), RuntimeError("std::bad_alloc"), MemoryError()],
                         ids=["allocator", "bad_alloc", "MemoryError"])
def test_cpu_out_of_memory_halves_until_it_fits(error):
    # SAM 3 at 1008 x 1008 under a 6 GiB limit raised "std::bad_alloc", which was reported as a bug in initlint
    report = initlint.audit(_NeedsSmallBatch(limit=4, error=error))
    notes = [n for n in report.notes if "ran out of memory" in n]
    assert [n.rsplit(" ", 1)[-1] for n in notes] == ["8", "4"]
    assert report.probe.forward_ran


def test_out_of_memory_even_at_batch_one_is_a_load_error():
    with pytest.raises(initlint.LoadError, match="out of memory even with a batch of 1"):
        initlint.audit(_NeedsSmallBatch(limit=0))


def test_a_failure_inside_initlint_is_not_blamed_on_the_model(monkeypatch):
    import initlint.probe.run as probe

    original = probe._derive

    def broken(*args, **kwargs):
        original(None)  # raises inside initlint's own code

    monkeypatch.setattr(probe, "put_softmax", broken)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(initlint.LoadError, match="bug in initlint"):
        initlint.audit(model, torch.randn(2, 4), logits=True)
    with pytest.raises(initlint.LoadError, match="the model's forward raised"):
        initlint.audit(torch.nn.Sequential(torch.nn.Linear(5, 4)), torch.randn(2, 4))


# ------------------------------------------------------------------ numeric settings: flags, file, API
def invoke(*args: str):
    """The CLI in this process (fast); stdout and stderr are kept apart."""
    from click.testing import CliRunner

    from initlint.cli import main

    return CliRunner().invoke(main, list(args))


def one_error(result) -> str:
    """The one ``initlint: error:`` line of an in-process run that exited 2."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("initlint: error: "), result.stderr
    assert "bug in initlint" not in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args, words", [
    (("--batch-size", "-3"), ["--batch-size must be an integer of at least 1", "-3"]),
    (("--batch-size", "0"), ["--batch-size must be an integer of at least 1"]),
    (("--batch-size", "2147483648"), ["--batch-size", "at most 2147483647"]),
    (("--batch-size", "1.5"), ["--batch-size", "not a valid integer"]),
    (("--seed", "1180591620717411303424"), ["--seed must be an integer from -2**63 to 2**64 - 1"]),
    (("--seed", "-9223372036854775809"), ["--seed must be an integer"]),
    (("--seed", "abc"), ["--seed", "'abc' is not a valid integer"]),
    (("--input-shape", "99999999999999999999,32"), ["--input-shape '99999999999999999999,32'", "more than a tensor"]),
    (("--input-shape", "100000,100000,100"), ["--input-shape '100000,100000,100'", "needs at least", "memory"]),
    (("--input-shape", "1" + "0" * 5000), ["more than a tensor"]),
    (("--import-timeout", "-1"), ["--import-timeout must be a number of seconds from 0"]),
    (("--import-timeout", "nan"), ["--import-timeout must be a number of seconds"]),
    (("--import-timeout", "inf"), ["--import-timeout must be a number of seconds"]),
    (("--no-such-option",), ["no such option '--no-such-option'"]),
    (("--input-shape", "8,\r,4"), ["--input-shape '8,\\r,4' is not"]),  # a control character stays on the line
    (("--seed", "1\n2"), ["--seed"]),
])
def test_out_of_range_flags_exit_2_with_one_sentence(tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "linear.py", LINEAR_MODEL)
    line = one_error(invoke("check", "linear.py", *args))
    for word in words:
        assert word in line, line


def test_batch_size_zero_is_refused_not_an_empty_probe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "linear.py", LINEAR_MODEL)
    result = invoke("check", "linear.py", "--batch-size", "0")
    assert "--batch-size" in one_error(result)
    assert "no findings" not in result.stdout


def test_impossible_input_shape_is_refused_before_allocating(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "shaped_inputs", None)  # nothing may be built: calling it would fail
    write(tmp_path, "linear.py", LINEAR_MODEL)
    line = one_error(invoke("check", "linear.py", "--input-shape", "100000,100000,100"))
    assert "needs at least" in line and "(2 bytes per element)" in line


@pytest.mark.parametrize("body, words", [
    ("[tool.initlint.rules.dead-relu]\nmax-dead-fraction = -5.0", ["rules.dead-relu.max-dead-fraction must be a number "
                                                                   "from 0 to 1", "-5.0"]),
    ("[tool.initlint.rules.dead-relu]\nmax-dead-fraction = nan", ["max-dead-fraction", "nan"]),
    ("[tool.initlint.rules.dead-relu]\nmax-dead-fraction = inf", ["max-dead-fraction", "inf"]),
    ("[tool.initlint.rules.dead-relu]\nmax-dead-fraction = 1.5", ["max-dead-fraction", "from 0 to 1"]),
    ("[tool.initlint.rules.dead-relu]\nmin-observations = -1", ["min-observations must be an integer of at least 0"]),
    ("[tool.initlint.rules.dead-relu]\nmin-observations = 1e3", ["min-observations must be an integer"]),
    ("[tool.initlint.rules.IL001]\nmax-variance-drift = 0.5", ["max-variance-drift must be a number of at least 1"]),
    ("[tool.initlint.rules.IL001]\nmax-variance-drift = -inf", ["max-variance-drift"]),
    ("[tool.initlint.rules.IL001]\ntolerance = 0", ["tolerance"]),
    ("[tool.initlint.rules.IL004]\nmin-entropy = 2", ["min-entropy must be a number from 0 to 1"]),
    ("[tool.initlint.rules.IL005]\nmin-units = 0", ["min-units must be an integer of at least 1"]),
    ("[tool.initlint.rules.IL006]\nmax-gradient-drift = 1e400", ["max-gradient-drift"]),
    ("[tool.initlint.rules.IL007]\nmax-saturated-fraction = -0.1", ["max-saturated-fraction"]),
    ("[tool.initlint]\nseed = 1180591620717411303424", ["seed must be an integer from -2**63 to 2**64 - 1"]),
    ("[tool.initlint]\nbatch-size = -3", ["batch-size must be an integer of at least 1"]),
    ("[tool.initlint]\nimport-timeout = -1", ["import-timeout must be a number of seconds"]),
    ("[tool.initlint]\nimport-timeout = nan", ["import-timeout"]),
    ("[tool.initlint]\ninput-shape = [100000, 100000, 100]", ["input-shape", "needs at least"]),
    ("[tool.initlint]\ninput-shape = \"99999999999999999999,32\"", ["input-shape", "more than a tensor"]),
])
def test_out_of_range_config_values_name_the_key_and_the_file(tmp_path, monkeypatch, body, words):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "linear.py", LINEAR_MODEL)
    (tmp_path / "pyproject.toml").write_text(body + "\n")
    line = one_error(invoke("check", "linear.py"))
    assert line.startswith("initlint: error: pyproject.toml: [tool.initlint] "), line
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("content", [
    b"[tool.initlint]\nselect = [\"IL001\"]  # caf\xe9\n",  # Latin-1, not UTF-8
    b"\xff\xfe[\x00t\x00o\x00o\x00l\x00]\x00",  # UTF-16
])
def test_pyproject_that_is_not_utf8(tmp_path, monkeypatch, content):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "linear.py", LINEAR_MODEL)
    (tmp_path / "pyproject.toml").write_bytes(content)
    line = one_error(invoke("check", "linear.py"))
    assert "pyproject.toml is not valid TOML" in line and "UTF-8" in line


@pytest.mark.parametrize("settings, words", [
    (dict(batch_size=-3), ["batch_size must be an integer of at least 1", "-3"]),
    (dict(batch_size=0), ["batch_size"]),
    (dict(batch_size=2.0), ["batch_size"]),
    (dict(seed=2 ** 70), ["seed must be an integer from -2**63 to 2**64 - 1"]),
    (dict(seed="abc"), ["seed must be an integer", "'abc'"]),
    (dict(seed=1.5), ["seed"]),
    (dict(seed=True), ["seed"]),
    (dict(rule_options={"dead-relu": {"max-dead-fraction": -5.0}}), ["rule_options.dead-relu.max-dead-fraction"]),
    (dict(rule_options={"IL004": {"min-entropy": float("nan")}}), ["rule_options.IL004.min-entropy", "nan"]),
    (dict(rule_options={"IL003": {"max_dead_fraction": 10 ** 400}}), ["max_dead_fraction"]),  # beyond any float
    (dict(input_shapes=[(100000, 100000, 100)]), ["input_shapes (100000, 100000, 100)", "needs at least"]),
    (dict(input_shapes=[(4, -8)]), ["input_shapes must be a list of shapes"]),
    (dict(input_shapes="abc"), ["input_shapes"]),
    (dict(fail_on="fatal"), ["fail_on must be one of"]),
])
def test_api_keywords_are_checked_the_same_way(settings, words):
    model = nn.Sequential(nn.Linear(8, 4))
    with pytest.raises(initlint.UsageError) as info:
        initlint.audit(model, torch.randn(2, 8), **settings)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_api_accepts_the_edges_of_each_range():
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    for seed in (-(2 ** 63), 2 ** 64 - 1):
        assert initlint.audit(model, seed=seed, batch_size=1).error is None
    report = initlint.audit(model, input_shapes=[8, 8], rule_options={"dead-relu": {"max-dead-fraction": 1}})
    assert report.error is None and report.probe.forward_ran


# ------------------------------------------------------------------ interrupts and exits in the user's code
def model_file(tmp_path: Path, at_import: str = "", in_init: str = "pass", in_forward: str = "pass") -> str:
    write(tmp_path, "user.py", f"""
        import os, sys
        import torch.nn as nn
        {at_import}

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)
                {in_init}

            def forward(self, x):
                {in_forward}
                return self.fc(x)
        """)
    return "user.py"


WHERE = ["at_import", "in_init", "in_forward"]


def test_keyboard_interrupt_exits_130_with_one_line(tmp_path):
    target = model_file(tmp_path, in_forward="raise KeyboardInterrupt")
    result = run_cli("check", target, cwd=tmp_path)
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert result.stderr.strip() == "initlint: interrupted" and "Aborted" not in result.stderr


@pytest.mark.parametrize("where", WHERE)
def test_keyboard_interrupt_anywhere_in_the_users_code(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    result = invoke("check", model_file(tmp_path, **{where: "raise KeyboardInterrupt"}))
    assert result.exit_code == 130 and result.stderr.strip() == "initlint: interrupted", result.stderr


VERBS = {"at_import": "importing user.py", "in_init": "constructing M", "in_forward": "running M"}


def test_os_exit_in_a_real_process(tmp_path):
    line = error_line(run_cli("check", model_file(tmp_path, in_forward="os._exit(7)"), cwd=tmp_path))
    assert "running M called os._exit(7)" in line


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("call, shown", [("sys.exit(5)", "sys.exit(5)"), ("sys.exit()", "sys.exit()"),
                                         ("sys.exit('bye')", "sys.exit('bye')"), ("os._exit(7)", "os._exit(7)")])
def test_exit_in_the_users_code_is_reported_as_such(tmp_path, monkeypatch, where, call, shown):
    monkeypatch.chdir(tmp_path)
    line = one_error(invoke("check", model_file(tmp_path, **{where: call})))
    assert f"{VERBS[where]} called {shown}" in line and "user.py:" in line, line


@pytest.mark.parametrize("loop", [
    "while True:\n    pass",
    "while True:\n    try:\n        sum(range(1000))\n    except Exception:\n        pass",  # cannot swallow the stop
])
def test_import_that_never_ends_is_stopped(tmp_path, monkeypatch, loop):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "slow.py", "import torch.nn as nn\n" + loop + "\nclass M(nn.Module):\n    pass\n")
    line = one_error(invoke("check", "slow.py", "--import-timeout", "1"))
    assert "importing slow.py did not finish within 1 s" in line and "--import-timeout" in line


def test_import_timeout_from_the_config(tmp_path):
    write(tmp_path, "slow.py", "import time\nimport torch.nn as nn\ntime.sleep(60)\nclass M(nn.Module):\n    pass\n")
    (tmp_path / "pyproject.toml").write_text("[tool.initlint]\nimport-timeout = 0.5\n")
    line = error_line(run_cli("check", "slow.py", cwd=tmp_path))  # a real process: the alarm of a real main thread
    assert "did not finish within 0.5 s" in line


def test_time_limit_without_sigalrm_uses_a_timer(monkeypatch):
    import signal

    from initlint.inputs.usercode import TimedOut, time_limit

    monkeypatch.delattr(signal, "setitimer")  # as on Windows
    with pytest.raises(TimedOut):
        with time_limit(0.3):
            while True:
                pass
    with time_limit(5):  # a quick body is untouched, and the timer does not fire later
        total = sum(range(100))
    assert total == 4950


@pytest.mark.parametrize("disposition", ["ignored", "default", "handled"])
def test_the_timer_interrupts_whatever_sigint_does(monkeypatch, disposition):
    """A process started in the background by a script inherits SIGINT ignored; the timer must still fire."""
    import signal

    from initlint.inputs.usercode import TimedOut, time_limit

    seen = []
    handler = {"ignored": signal.SIG_IGN, "default": signal.default_int_handler,
               "handled": lambda signum, frame: seen.append(signum)}[disposition]
    monkeypatch.delattr(signal, "setitimer")  # as on Windows
    previous = signal.signal(signal.SIGINT, handler)
    try:
        with pytest.raises(TimedOut):
            with time_limit(0.3):
                while True:
                    pass
        assert signal.getsignal(signal.SIGINT) is handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == []  # the timer's interrupt is not passed on as the user's Ctrl-C


# ------------------------------------------------------------------ the user's stdout
PRINTS = dict(at_import="print('import says hi'); os.system('echo shell says hi')",
              in_init="print('init says hi')", in_forward="print('forward says hi', flush=True)")


def test_prints_in_the_model_file_go_to_stderr(tmp_path):
    import json

    target = model_file(tmp_path, **PRINTS)
    result = run_cli("check", target, "--format", "sarif", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)  # the report alone
    for said in ("import says hi", "shell says hi", "init says hi", "forward says hi"):
        assert said in result.stderr and said not in result.stdout


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_prints_stay_off_stdout_in_process_too(tmp_path, monkeypatch, fmt):
    import json

    monkeypatch.chdir(tmp_path)
    target = model_file(tmp_path, **{k: v.split(";")[0] for k, v in PRINTS.items()})
    result = invoke("check", target, "--format", fmt)
    assert result.exit_code == 0, result.stderr
    json.loads(result.stdout)
    assert "import says hi" in result.stderr and "forward says hi" in result.stderr


# ------------------------------------------------------------------ targets in different folders
HELPER_USER = """
    import torch.nn as nn
    import helpers

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(helpers.WIDTH, 4)

        def forward(self, x):
            return self.fc(x)
    """


def test_each_target_gets_its_own_helpers_module(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    for folder, width in (("a", 8), ("b", 12)):
        (tmp_path / folder).mkdir()
        write(tmp_path / folder, "helpers.py", f"WIDTH = {width}\n")
        write(tmp_path / folder, "model.py", HELPER_USER)
    result = run_cli("check", "a/model.py", "b/model.py", "--select", "IL001", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [r["error"] for r in json.loads(result.stdout)["results"]] == [None, None]
    shapes = invoke("check", "b/model.py", "a/model.py", "--input-shape", "2,12")
    assert shapes.exit_code == 2  # b reads 12 features, a (built second, with its own helpers) reads 8
    assert "a/model.py" in shapes.stderr and "b/model.py" not in shapes.stderr


def test_helper_modules_are_forgotten_after_their_target(tmp_path):
    from initlint.inputs.load import resolve
    from initlint.inputs.usercode import own_folder

    widths = []
    for folder, width in (("a", 8), ("b", 12)):
        (tmp_path / folder).mkdir()
        write(tmp_path / folder, "helpers.py", f"WIDTH = {width}\n")
        path = str(write(tmp_path / folder, "model.py", HELPER_USER))
        with own_folder(path):
            [cand] = resolve(path)
            widths.append(cand.instantiate().fc.in_features)
            assert sys.path[0] == str(tmp_path / folder)
        assert "helpers" not in sys.modules and str(tmp_path / folder) not in sys.path
    assert widths == [8, 12]


# ------------------------------------------------------------------ the CLI's last line of defence
def test_probe_batch_beyond_memory_is_one_sentence(tmp_path, monkeypatch):
    def too_big(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 64000000000 bytes.\nframe #0: ...")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "infer_inputs", too_big)
    write(tmp_path, "linear.py", LINEAR_MODEL)
    line = one_error(invoke("check", "linear.py", "--batch-size", "2000000000"))
    assert "the probe does not fit in memory" in line and "lower --batch-size" in line


def test_an_error_inside_initlint_is_one_line_unless_asked(tmp_path, monkeypatch):
    import initlint.output.formats as formats

    def broken(reports, colour=False, notes=()):
        raise KeyError("internal")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(formats.FORMATS, "text", broken)
    write(tmp_path, "linear.py", LINEAR_MODEL)
    result = invoke("check", "linear.py")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "bug in initlint" in lines[0], result.stderr
    monkeypatch.setenv("INITLINT_TRACEBACK", "1")
    assert isinstance(invoke("check", "linear.py").exception, KeyError)


def test_folders_a_target_adds_to_sys_path_are_its_own_too(tmp_path):
    from initlint.inputs.load import resolve
    from initlint.inputs.usercode import own_folder

    source = """
        import os, sys
        sys.path.append(os.path.join(os.path.dirname(__file__), "lib"))
        import torch.nn as nn
        import shared

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(shared.WIDTH, 4)
        """
    before, widths = list(sys.path), []
    for folder, width in (("a", 8), ("b", 12)):
        (tmp_path / folder / "lib").mkdir(parents=True)
        write(tmp_path / folder / "lib", "shared.py", f"WIDTH = {width}\n")
        path = str(write(tmp_path / folder, "model.py", source))
        with own_folder(path):
            [cand] = resolve(path)
            widths.append(cand.instantiate().fc.in_features)
        assert sys.path == before and "shared" not in sys.modules
    assert widths == [8, 12]


def test_a_multi_line_exception_message_stays_on_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "user.py", "raise ValueError('first line\\nsecond line')\nimport torch.nn as nn\nclass M(nn.Module):\n    pass\n")
    line = one_error(invoke("check", "user.py:M"))
    assert "ValueError: first line second line" in line


def test_out_of_memory_in_the_backward_probe_retries_on_the_same_capture(monkeypatch):
    from initlint.probe import run as probe
    from transformer_models import CausalSelfAttention

    real, calls = probe._backward, []

    def flaky(cap, named, main, *rest, **options):
        calls.append(main.shape[0])
        if len(calls) == 1:  # the forward ran and the graph is complete (read-only) by now
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(cap, named, main, *rest, **options)

    monkeypatch.setattr(probe, "_backward", flaky)
    torch.manual_seed(0)
    report = initlint.audit(CausalSelfAttention(32, 4), torch.randn(8, 16, 32))
    assert calls == [8, 4] and report.capture == "fx"
    assert "the probe ran out of memory; retried with a batch of 4" in report.notes
    assert report.probe.backward_ran and report.graph.of_kind("attention")


def test_a_test_that_loops_forever_fails_the_suite_instead_of_hanging_it(tmp_path):
    """The suite's hard limit (tests/conftest.py) ends a looping test even with SIGINT ignored."""
    import shutil
    import signal
    import subprocess
    import sys
    from pathlib import Path

    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_loop.py").write_text("import pytest\n\n@pytest.mark.hard_limit(1)\n"
                                           "def test_loop():\n    while True:\n        pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_loop.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert result.returncode != 0
    assert "Timeout" in result.stderr and "test_loop.py" in result.stderr

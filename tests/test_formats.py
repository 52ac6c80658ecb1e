"""Output formats (text, concise, json, sarif, github), --output, colour and progress on stderr."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch.nn as nn
from click.testing import CliRunner

import initlint
from initlint.cli import main
from initlint.output.formats import FORMATS, format_github, github_data, github_property, to_sarif, use_colour
from initlint.report.findings import Finding, Report
from initlint.rules import all_rules

def _validate_sarif(doc: dict) -> None:
    """SARIF 2.1.0's own schema on ``doc`` (jsonschema is a dev dependency: without it the test skips here)."""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft4Validator(SCHEMA).validate(doc)


SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())

MODEL = '''
import torch.nn as nn


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()
'''
CONV_LINE = MODEL.splitlines().index("        self.conv = nn.Conv2d(3, 8, 3)") + 1


@pytest.fixture()
def model_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    path = tmp_path / "models" / "convbn.py"
    path.write_text(MODEL)
    return "models/convbn.py"


def check(*args):
    return CliRunner().invoke(main, ["check", *args])


@pytest.fixture(scope="module")
def reports():
    """A report with an IL002 warning and an IL010 note, plus one that could not be audited."""
    report = initlint.audit(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)), select=["IL002", "IL010"],
                            per_module_ignores={"decoder": ["IL002"]}, target="models/convbn.py:ConvBN")
    failed = Report(model="Broken", target="models/broken.py:Broken", error="importing models/broken.py raised "
                    "ImportError: no module named 'apex'")
    return [report, failed]


def test_every_format_is_registered():
    assert list(FORMATS) == ["text", "concise", "json", "sarif", "github"]


def test_text_format_groups_by_model_and_has_no_colour_unless_asked(reports):
    text = FORMATS["text"](reports)
    assert "IL002" in text and "error: importing models/broken.py" in text
    assert "\033[" not in text
    assert "\033[" in FORMATS["text"](reports, colour=True)


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


def test_colour_only_on_a_tty_and_never_with_no_color():
    assert use_colour(_Stream(True), {}) is True
    assert use_colour(_Stream(False), {}) is False
    assert use_colour(_Stream(True), {"NO_COLOR": "1"}) is False
    assert use_colour(_Stream(True), {"NO_COLOR": ""}) is True  # no-color.org: set and non-empty


def test_concise_format_one_line_per_finding(reports):
    lines = FORMATS["concise"](reports).splitlines()
    assert any(" IL002 [0] " in line for line in lines)
    assert any(" IL010 [<model>] " in line for line in lines)
    assert any(line.startswith("models/broken.py:Broken: error:") for line in lines)


def test_json_format_schema(reports):
    doc = json.loads(FORMATS["json"](reports))
    assert doc["initlint"] == initlint.__version__
    ok, failed = doc["results"]
    assert {"target", "model", "device", "capture", "findings", "error"} <= set(ok)
    finding = next(f for f in ok["findings"] if f["code"] == "IL002")
    assert {"code", "name", "severity", "module", "message", "fix", "value", "threshold", "location"} <= set(finding)
    assert (finding["module"], finding["value"], finding["threshold"]) == ("0", 1.0, 0.0)
    assert failed["error"].startswith("importing") and failed["findings"] == []


def test_json_writes_non_finite_measurements_as_strings():
    inf = Finding(code="IL009", name="non-finite", severity="error", module="fc", message="m", fix="f",
                  value=float("inf"), threshold=float("nan"))
    doc = json.loads(FORMATS["json"]([Report(model="M", findings=[inf])]))
    assert doc["results"][0]["findings"][0]["value"] == "inf"


def test_sarif_is_valid_sarif_2_1_0(reports):
    _validate_sarif(to_sarif(reports))


def test_sarif_rules_come_from_the_registry(reports):
    driver = to_sarif(reports)["runs"][0]["tool"]["driver"]
    assert driver["name"] == "initlint" and driver["version"] == initlint.__version__
    assert [r["id"] for r in driver["rules"]] == list(all_rules())
    il003 = next(r for r in driver["rules"] if r["id"] == "IL003")
    assert il003["name"] == "dead-relu"
    assert il003["shortDescription"]["text"] == all_rules()["IL003"].summary
    assert il003["fullDescription"]["text"].startswith("For every ReLU-family op")
    assert "## Why is this bad?" in il003["help"]["markdown"]


def test_sarif_results_levels_and_locations(reports):
    run = to_sarif(reports)["runs"][0]
    results = {r["ruleId"]: r for r in run["results"]}
    assert set(results) == {"IL002", "IL010"}
    assert (results["IL002"]["level"], results["IL010"]["level"]) == ("warning", "note")
    rules = run["tool"]["driver"]["rules"]
    assert rules[results["IL002"]["ruleIndex"]]["id"] == "IL002"
    (loc,) = results["IL002"]["locations"]
    assert loc["logicalLocations"][0]["name"] == "0"
    assert run["invocations"][0]["executionSuccessful"] is False  # one target could not be audited
    assert "apex" in run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]


def test_sarif_region_and_relative_uri_from_the_cli(model_file):
    result = check(model_file, "--format", "sarif")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    _validate_sarif(doc)
    (res,) = [r for r in doc["runs"][0]["results"] if r["ruleId"] == "IL002"]
    physical = res["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": "models/convbn.py", "uriBaseId": "%SRCROOT%"}
    assert physical["region"] == {"startLine": CONV_LINE}
    assert res["locations"][0]["logicalLocations"][0]["name"] == "conv"


def test_github_annotations_from_the_cli(model_file):
    result = check(model_file, "--format", "github")
    assert result.exit_code == 1
    line = next(l for l in result.stdout.splitlines() if "IL002" in l)
    assert line.startswith(f"::warning file=models/convbn.py,line={CONV_LINE},title=IL002 bias-before-norm::conv: ")
    assert "%0Ahelp: " in line and "\n" not in line


def test_github_escaping():
    assert github_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert github_property("a,b:c%") == "a%2Cb%3Ac%25"
    odd = Finding(code="IL003", name="dead-relu", severity="info", module="m", message="62% dead\nreally",
                  fix="x", location=("dir,with:comma/model.py", 7))
    (line,) = format_github([Report(model="M", findings=[odd])]).splitlines()
    assert line == "::notice file=dir%2Cwith%3Acomma/model.py,line=7,title=IL003 dead-relu::m: 62%25 dead%0Areally%0Ahelp: x"


def test_output_file_gets_the_format_and_stdout_stays_empty(model_file, tmp_path):
    out = tmp_path / "report.sarif"
    result = check(model_file, "--format", "sarif", "--output", str(out))
    assert result.exit_code == 1
    assert result.stdout == ""
    _validate_sarif(json.loads(out.read_text()))


def test_no_colour_and_no_progress_when_not_a_terminal(model_file):
    result = check(model_file)
    assert result.exit_code == 1
    assert "\033[" not in result.stdout and "IL002" in result.stdout
    assert "initlint: loading" not in result.stderr and "auditing" not in result.stderr


def test_progress_on_stderr_when_it_is_a_terminal(model_file, monkeypatch, capsys):
    import pty  # POSIX

    master, slave = pty.openpty()
    terminal = open(slave, "w", closefd=True)
    assert terminal.isatty()
    monkeypatch.delenv("INITLINT_NO_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", terminal)
    with pytest.raises(SystemExit) as exit_:
        main(["check", model_file])
    terminal.close()
    chunks = []
    while True:  # one read returns what the terminal holds at that moment, not everything
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other end is closed and everything has been read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    progress = b"".join(chunks).decode()
    assert exit_.value.code == 1
    for stage in ("loading models/convbn.py", "auditing ConvBN", "reporting"):
        assert f"initlint: {stage}" in progress
    out = capsys.readouterr().out
    assert "IL002" in out and "initlint:" not in out  # the report goes to stdout, progress never does


BLOCK = '''
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x)
'''


@pytest.fixture()
def folder_with_skipped_files(model_file, tmp_path):
    (tmp_path / "models" / "block.py").write_text(BLOCK)
    (tmp_path / "models" / "py2.py").write_text(MODEL + "\nprint 'python 2'\n")
    return "models"


def test_skipped_files_are_notes_in_json_sarif_and_github(folder_with_skipped_files):
    result = check(folder_with_skipped_files, "--format", "json")
    assert result.exit_code == 1, result.output
    notes = {n["path"]: n["message"] for n in json.loads(result.stdout)["notes"]}
    assert set(notes) == {"models/block.py", "models/py2.py"}
    assert "constructor arguments (dim)" in notes["models/block.py"]
    assert "initlint: note: " + notes["models/block.py"] in result.stderr  # still said on stderr

    doc = json.loads(check(folder_with_skipped_files, "--format", "sarif").stdout)
    _validate_sarif(doc)
    (invocation,) = doc["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is True  # passed over, not failed
    located = {n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]: n["level"]
               for n in invocation["toolExecutionNotifications"]}
    assert located == {"models/block.py": "note", "models/py2.py": "note"}

    github = check(folder_with_skipped_files, "--format", "github").stdout.splitlines()
    assert sum(line.startswith("::notice file=models/block.py,title=initlint note::") for line in github) == 1


def test_concise_says_all_checks_passed_for_a_clean_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clean.py").write_text(MODEL.replace("nn.Conv2d(3, 8, 3)", "nn.Conv2d(3, 8, 3, bias=False)"))
    result = check("clean.py", "--format", "concise")
    assert (result.exit_code, result.stdout) == (0, "All checks passed!\n")
    (tmp_path / "broken.py").write_text(MODEL.replace("return self.bn", "raise ValueError('no'); return self.bn"))
    result = check("clean.py", "broken.py", "--format", "concise")
    assert result.exit_code == 2 and result.stdout == ""  # not all passed: the error is on stderr
    assert "broken.py:ConvBN" in result.stderr


def test_a_library_location_is_no_physical_location_in_sarif_and_github():
    pytest.importorskip("transformers")
    import transformers.models.gpt2.modeling_gpt2 as gpt2

    inside = Finding(code="IL011", name="attention-collapse", severity="warning", module="h.0.attn", message="m",
                     fix="f", location=(gpt2.__file__, 233))
    doc = to_sarif([Report(model="GPT2Model", findings=[inside])])
    _validate_sarif(doc)
    (result,) = doc["runs"][0]["results"]
    (location,) = result["locations"]
    assert "physicalLocation" not in location and location["logicalLocations"][0]["name"] == "h.0.attn"
    assert result["properties"]["library_location"] == "transformers/models/gpt2/modeling_gpt2.py:233"
    (line,) = format_github([Report(model="GPT2Model", findings=[inside])]).splitlines()
    assert line.startswith("::warning title=IL011 attention-collapse::h.0.attn: m")
    assert "constructed in: transformers/models/gpt2/modeling_gpt2.py:233" in line.replace("%0A", "\n")
    assert "site-packages" not in json.dumps(doc) + line


def test_a_reports_own_notes_are_in_json_and_sarif():
    retried = Report(model="Big", target="models/big.py:Big",
                     notes=["the probe ran out of memory; retried with a batch of 8"])
    (result,) = json.loads(FORMATS["json"]([retried]))["results"]
    assert result["notes"] == ["the probe ran out of memory; retried with a batch of 8"]
    doc = to_sarif([retried])
    _validate_sarif(doc)
    (note,) = doc["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert note["level"] == "note" and note["message"]["text"].endswith("retried with a batch of 8")


def test_a_long_module_path_wraps_after_a_dot_never_inside_a_name():
    from initlint.report.table import wrap_path

    path = "backbone.transformer.h.{0..11}.attention.self.query_key_value"
    lines = wrap_path(path).splitlines()
    assert "".join(lines) == path and len(lines) > 1
    assert all(len(line) <= 32 and line.endswith(".") for line in lines[:-1])
    assert "h.{0..11}." in lines[0]  # a grouped run stays whole
    assert wrap_path("fc1") == "fc1"

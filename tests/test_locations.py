"""Every finding points at source: the construction line of a module, the call line of a functional op."""
import textwrap

import pytest
from cli_server import run_initlint

import initlint
from initlint.load import import_file

SOURCE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self, branch=False):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 64)
            nn.init.constant_(self.fc.bias, -10.0)
            self.head = nn.Linear(64, 2)
            self.branch = branch

        def forward(self, x):
            h = self.bn1(self.conv1(x)).mean(dim=(2, 3))
            if self.branch and h.sum() > 1e9:
                h = h * 2
            z = F.relu(self.fc(h))
            return self.head(z)
''')


def line_of(text):
    return next(i for i, line in enumerate(SOURCE.splitlines(), start=1) if text in line)


@pytest.mark.parametrize("branch,capture", [(False, "fx"), (True, "runtime")])
def test_module_and_functional_findings_point_at_their_lines(tmp_path, branch, capture):
    path = tmp_path / "net.py"
    path.write_text(SOURCE)
    module = import_file(str(path))
    report = initlint.audit(module.Net(branch))
    assert report.capture == capture
    where = {f.code: f.location for f in report.findings}
    assert where["IL002"] == (str(path), line_of("self.conv1 = nn.Conv2d"))
    assert where["IL003"] == (str(path), line_of("z = F.relu(self.fc(h))"))


def test_text_output_uses_path_line_col(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "net.py"
    path.write_text(SOURCE)
    out = run_initlint(["check", "net.py", "--format", "concise"], cwd=tmp_path)
    assert out.returncode == 1
    assert f"net.py:{line_of('self.conv1 = nn.Conv2d')}:1: IL002 [conv1]" in out.stdout

"""The static scan: which classes derive from torch's nn.Module, resolved from imports, without importing."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from initlint.inputs.scan import MAYBE, MODEL, NONE, UNPARSABLE, scan_file, scan_source

TORCH_MODELS = {
    "import torch.nn as nn": "import torch.nn as nn\nclass Net(nn.Module): pass\n",
    "from torch import nn": "from torch import nn\nclass Net(nn.Module): pass\n",
    "from torch.nn import Module": "from torch.nn import Module\nclass Net(Module): pass\n",
    "import torch + torch.nn.Module": "import torch\nclass Net(torch.nn.Module): pass\n",
    "import torch.nn + torch.nn.Module": "import torch.nn\nclass Net(torch.nn.Module): pass\n",
    "alias of nn.Module": "import torch.nn as nn\nBase = nn.Module\nclass Net(Base): pass\n",
    "alias of the torch.nn module": "import torch\nlayers = torch.nn\nclass Net(layers.Sequential): pass\n",
    "subclass of a subclass, defined later": "import torch.nn as nn\nclass Net(Base): pass\nclass Base(nn.Module): pass\n",
    "renamed import": "from torch.nn import Module as TorchModule\nclass Net(TorchModule): pass\n",
    "star import": "from torch.nn import *\nclass Net(Module): pass\n",
    "generic base beside it": "from typing import Generic, TypeVar\nimport torch.nn as nn\nT = TypeVar('T')\n"
                              "class Net(nn.Module, Generic[T]): pass\n",
    "import inside try": "try:\n    import torch.nn as nn\nexcept ImportError:\n    nn = None\nclass Net(nn.Module): pass\n",
    "transformers model": "from transformers import PreTrainedModel\nclass Net(PreTrainedModel): pass\n",
    "transformers layer": "from transformers.models.bert.modeling_bert import BertLayer\nclass Net(BertLayer): pass\n",
    "LightningModule": "import lightning as L\nclass Net(L.LightningModule): pass\n",
}

NOT_TORCH = {
    "flax": "import flax.linen as nn\nclass Net(nn.Module): pass\n",
    "tf.Module": "import tensorflow as tf\nclass Net(tf.Module): pass\n",
    "keras": "from tensorflow import keras\nclass Net(keras.Model): pass\n",
    "AnsibleModule": "from ansible.module_utils.basic import AnsibleModule\nclass Mod(AnsibleModule): pass\n",
    "equinox": "import equinox as eqx\nimport torch\nclass Net(eqx.Module): pass\n",
    "transformers TF model": "from transformers import TFPreTrainedModel\nclass Net(TFPreTrainedModel): pass\n",
    "Flax transformers model": "from transformers import FlaxBertModel\nclass Net(FlaxBertModel): pass\n",
    "data module": "import lightning as L\nclass Data(L.LightningDataModule): pass\n",
    "torch non-modules": "import torch\nimport torch.nn as nn\nclass P(nn.Parameter): pass\n"
                         "class D(torch.utils.data.Dataset): pass\nclass F(torch.autograd.Function): pass\n",
    "stdlib and builtins": "import enum\nimport torch\nclass Colour(enum.Enum): pass\nclass Oops(Exception): pass\n",
    "a name ending in Module": "class DataModule:\n    pass\nclass MyModule(object): pass\n",
    "only a private module": "import torch.nn as nn\nclass _Helper(nn.Module): pass\n",
    "unknown base, no torch import": "from keras_core import Layer\nclass Net(Layer): pass\n",
}


@pytest.mark.parametrize("source", TORCH_MODELS.values(), ids=TORCH_MODELS.keys())
def test_torch_modules_are_found(source):
    result = scan_source(source)
    assert result.verdict == MODEL
    assert result.models == [name for name in ("Net", "Base") if f"class {name}(" in source]


@pytest.mark.parametrize("source", NOT_TORCH.values(), ids=NOT_TORCH.keys())
def test_other_frameworks_and_plain_classes_are_not(source):
    assert scan_source(source).verdict == NONE


def test_an_unfollowable_base_in_a_file_that_imports_torch_is_a_candidate():
    result = scan_source("import torch\nfrom some_unknown_lib import Layer\nclass Net(Layer): pass\n")
    assert result.verdict == MAYBE and result.unresolved == ["Net (base Layer)"]
    assert scan_source("import torch\nclass Net(make_base()): pass\n").verdict == MAYBE


# a statement of a Python newer than the running one: a type alias (3.12), a template string (3.14), a lazy import
NEWER = (b"type Width = int" if sys.version_info < (3, 12) else
         b'greeting = t"hello {name}"' if sys.version_info < (3, 14) else b"lazy import json")


@pytest.mark.parametrize("data", [
    b'import torch.nn as nn\nprint "python 2"\nclass Net(nn.Module): pass\n',
    b"import torch.nn as nn\n" + NEWER + b"\nclass Net(nn.Module): pass\n",
    b"import torch.nn as nn\nclass Net(nn.Module):\n    def f(self, x):\n        " + NEWER + b"\n        return x\n",
    b"import torch.nn as nn\nclass Net(nn.Module): pass\nname = '\xe9t\xe9'\n",  # Latin-1, no coding cookie
    b"import torch.nn as nn\nclass Net(nn.Module): pass\nx = 1\x00\n",
], ids=["python 2", "newer statement", "newer syntax in a method", "bad encoding", "null byte"])
def test_model_files_that_do_not_parse_are_unparsable_with_the_reason(data):
    result = scan_source(data)
    assert result.verdict == UNPARSABLE
    assert result.reason.startswith(f"Python {sys.version_info[0]}.{sys.version_info[1]} cannot parse it")


def test_other_files_that_do_not_parse_hold_no_model():
    assert scan_source(b'print "python 2"\nclass Old(object): pass\n').verdict == NONE


def test_what_the_scan_reads_and_what_it_leaves_out():
    multi_line = ("from torch.nn import (\n    Linear,\n    Module,\n)\n\n\nclass Net(\n    Module,  # (the base)\n):\n"
                  "    pass\n")
    assert scan_source(multi_line).models == ["Net"]
    conversion = ("import flax.linen as nn\n\n\ndef to_torch(params):\n    import torch.nn as nn\n    return nn.Linear(2, 2)\n"
                  "\n\nclass Net(nn.Module):\n    pass\n")
    assert scan_source(conversion).verdict == NONE  # torch is imported inside a function only
    guarded = "if True:\n    from torch import nn\nelse:\n    nn = None\n\n\nclass Net(nn.Module):\n    pass\n"
    assert scan_source(guarded).models == ["Net"]
    crlf_bom = b"\xef\xbb\xbfimport torch.nn as nn\r\nBase = nn.Module\r\nclass Net(\r\n    Base):\r\n    pass\r\n"
    assert scan_source(crlf_bom).models == ["Net"]
    docstring = '"""Example::\n\n    import torch.nn as nn\n    from this import that\n"""\nclass Net(Base): pass\n'
    assert scan_source(docstring).verdict == NONE


def write_tree(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_project_base_classes_are_followed_into_sibling_modules(tmp_path):
    write_tree(tmp_path, {
        "pyproject.toml": "",
        "src/proj/__init__.py": "from .base import Base\n",
        "src/proj/base.py": "import torch.nn as nn\nclass Base(nn.Module): pass\n",
        "src/proj/flaxbase.py": "import flax.linen as nn\nclass FlaxBase(nn.Module): pass\n",
        "src/proj/models/__init__.py": "",
        "src/proj/models/relative.py": "from ..base import Base\nclass Net(Base): pass\n",
        "src/proj/models/absolute.py": "from proj.base import Base\nclass Net(Base): pass\n",
        "src/proj/models/package.py": "import proj\nclass Net(proj.Base): pass\n",
        "src/proj/models/module.py": "from proj import base\nclass Net(base.Base): pass\n",
        "src/proj/models/flax_child.py": "from ..flaxbase import FlaxBase\nclass Net(FlaxBase): pass\n",
        "scripts/train.py": "from helpers import Base\nclass Net(Base): pass\n",
        "scripts/helpers.py": "from torch import nn\nBase = nn.Module\n",
    })
    models = tmp_path / "src" / "proj" / "models"
    for name in ("relative", "absolute", "package", "module"):
        assert scan_file(str(models / f"{name}.py")).verdict == MODEL, name
    assert scan_file(str(models / "flax_child.py")).verdict == NONE
    assert scan_file(str(tmp_path / "scripts" / "train.py")).verdict == MODEL


def test_the_scan_imports_nothing(tmp_path):
    """Files that write a marker when imported: the scan (and the hook's skip) must leave no marker."""
    marker = tmp_path / "imported"
    files = {name: f"open({str(marker)!r}, 'a').write({name!r})\n" + body for name, body in {
        "flax_net.py": NOT_TORCH["flax"], "tf_net.py": NOT_TORCH["tf.Module"], "ansible_mod.py": NOT_TORCH["AnsibleModule"],
        "torch_net.py": TORCH_MODELS["alias of nn.Module"],
    }.items()}
    write_tree(tmp_path, files)
    script = textwrap.dedent(f"""
        import sys
        from initlint.inputs.scan import scan_file
        print([scan_file({str(tmp_path)!r} + '/' + name).verdict for name in {sorted(files)!r}])
        print('torch' in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[:2] == [str(["none", "none", "none", "model"]), "False"], out.stderr
    assert not marker.exists()

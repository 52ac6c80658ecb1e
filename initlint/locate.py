"""Where each module was constructed: the ``self.conv1 = nn.Conv2d(...)`` line in the user's source.

Found statically from the parent module's class source, so it works for models built
anywhere. A child of a container (``nn.Sequential``, ``nn.ModuleList``) takes the line
where the container was assigned.
"""
from __future__ import annotations

import inspect
import re
from functools import lru_cache
from typing import Dict, Optional, Tuple

import torch.nn as nn

Location = Tuple[str, int]


@lru_cache(maxsize=256)
def _class_source(cls: type) -> Optional[Tuple[str, int, Tuple[str, ...]]]:
    if cls.__module__.startswith("torch."):
        return None
    try:
        lines, start = inspect.getsourcelines(cls)
        path = inspect.getsourcefile(cls)
    except (OSError, TypeError):
        return None
    if not path:
        return None
    return path, start, tuple(lines)


def _assignment_line(cls: type, attr: str) -> Optional[Location]:
    for klass in cls.__mro__:
        if klass is nn.Module or klass is object:
            break
        src = _class_source(klass)
        if src is None:
            continue
        path, start, lines = src
        pattern = re.compile(rf"\bself\.{re.escape(attr)}\s*(:[^=]*)?=(?!=)|add_module\(\s*['\"]{re.escape(attr)}['\"]")
        for offset, line in enumerate(lines):
            if pattern.search(line):
                return (path, start + offset)
    return None


def module_locations(model: nn.Module) -> Dict[str, Location]:
    """Module path -> (file, line) for every module whose construction line can be found."""
    found: Dict[str, Location] = {}
    root = _class_source(type(model))
    if root is not None:
        found[""] = (root[0], root[1])
    modules = dict(model.named_modules())
    for path in modules:
        if not path:
            continue
        parent_path, _, attr = path.rpartition(".")
        parent = modules.get(parent_path, model)
        loc = _assignment_line(type(parent), attr)
        if loc is None:
            loc = found.get(parent_path)
        if loc is not None:
            found[path] = loc
    return found

"""Experiment specs as the API takes them: a dict as is, or a YAML/JSON file read as the CLI
reads it (YAML 1.2 scalars), refused when its aliases would expand past a bound."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, Union

import yaml

SpecLike = Union[Dict[str, Any], str, "os.PathLike[str]"]


class _SpecLoader(yaml.SafeLoader):
    """YAML 1.2 scalars, as the CLI reads specs: ``1e-4`` is a float, ``yes``/``no``/``on``
    stay strings (PyYAML's YAML 1.1 rules would differ from what ``headroom submit`` sends)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
# Integers stay integers: the int resolver comes first for plain digits.
for _first in "-+0123456789":
    _res = _SpecLoader.yaml_implicit_resolvers.get(_first, [])
    _res.sort(key=lambda r: r[0] != "tag:yaml.org,2002:int")


def load_spec(spec: SpecLike) -> Dict[str, Any]:
    """A spec as the API takes it: a dict as is, a path to a YAML or JSON file read."""
    if isinstance(spec, dict):
        return spec
    path = Path(spec)
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_SpecLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML/JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a spec is a mapping (name, command, ...)")
    _check_expanded_size(doc, path)
    return doc


#: Most values a spec may hold once its YAML aliases are expanded (each alias stands for a
#: copy of what it names): a 562-byte file of nested aliases is billions of values.
MAX_SPEC_VALUES = 1_000_000


def _check_expanded_size(doc: Any, path: Path) -> None:
    """Counts the values of ``doc`` as they would be sent (aliases as copies), stopping at
    the bound: it costs at most ``MAX_SPEC_VALUES`` steps, whatever the aliases."""
    seen = 0
    stack = [doc]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_SPEC_VALUES:
            raise ValueError(
                f"{path}: the spec holds more than {MAX_SPEC_VALUES:,} values once its YAML "
                "aliases are expanded (an alias is a copy of what it names): refused"
            )
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)

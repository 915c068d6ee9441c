"""Experiment specs as the API takes them: a dict as is, or a YAML/JSON file read as the CLI
reads it (YAML 1.2 scalars; ``rows: FILE.csv`` read beside it and sent inline, in a study's
variants too), refused when its aliases would expand past a bound."""

from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Union

import yaml

SpecLike = Union[Dict[str, Any], str, "os.PathLike[str]"]

#: The key that makes a spec a study: a list of variants over the top level's defaults.
VARIANTS_KEY = "experiments"


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
    """A spec as the API takes it: a dict as is, a path to a YAML or JSON file read. A
    ``rows: FILE.csv`` (relative to the file), at the top or in a study's variant
    (``experiments[i].rows``), is read and put inline; a refusal names that field."""
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
    _inline_rows(doc, path, "rows")
    variants = doc.get(VARIANTS_KEY)
    if isinstance(variants, list):
        for i, variant in enumerate(variants):
            # Anything but a mapping is the coordinator's to refuse, naming the field.
            if isinstance(variant, dict):
                _inline_rows(variant, path, f"{VARIANTS_KEY}[{i}].rows")
    return doc


def merged(defaults: Dict[str, Any], variant: Dict[str, Any]) -> Dict[str, Any]:
    """A study's variant as the coordinator merges it (``study::merged``): ``defaults`` (the
    top level less ``name`` and ``experiments``) with the variant's keys (less ``name`` and
    ``after``) over them. A key replaces the default of its name; where both are mappings,
    the variant's entries are added, each replacing the entry of its name whole, and an
    entry set to None removes the default's; a key set to None removes the default."""
    out = dict(defaults)
    for key, value in variant.items():
        base = out.get(key)
        if isinstance(base, dict) and isinstance(value, dict):
            entries = dict(base)
            for k, v in value.items():
                if v is None:
                    entries.pop(k, None)
                else:
                    entries[k] = v
            out[key] = entries
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _inline_rows(spec: Dict[str, Any], path: Path, field: str) -> None:
    """``rows: FILE.csv`` of ``spec`` (a spec or a study's variant, read from ``path``) read
    and put inline, as the CLI sends it; a refusal starts with ``field``."""
    if not isinstance(spec.get("rows"), str):
        return
    rows_file = path.parent / spec["rows"]
    try:
        # `utf-8-sig`: a file saved by a spreadsheet as "CSV UTF-8" starts with a BOM.
        text = rows_file.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ValueError(f"{field}: reading {rows_file}: {e}") from e
    spec["rows"] = rows_of_csv(text, rows_file, field=field)


def _cell(text: str) -> Any:
    """A rows file's cell as the CLI reads it: an integer, a number, ``true``/``false``, or
    else text."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and math.isfinite(number):
        return number
    return {"true": True, "false": False}.get(text, text)


def rows_of_csv(
    text: str, path: Union[str, Path] = "rows", *, field: str = "rows"
) -> List[Dict[str, Any]]:
    """A rows file: a header of parameter names, then one configuration a line; an empty
    cell or a short line is refused naming its line (the header is line 1), after ``field``
    (the spec's key it was read for: ``rows``, ``experiments[1].rows``)."""
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    if not any(header):
        raise ValueError(f"{field}: {path}: no header line of parameter names")
    rows: List[Dict[str, Any]] = []
    for line, record in enumerate(reader, start=2):
        if not record:
            continue
        cells = [c.strip() for c in record]
        if len(cells) != len(header):
            raise ValueError(
                f"{field}: {path}: line {line}: {len(cells)} cells for {len(header)} columns"
            )
        row: Dict[str, Any] = {}
        for name, cell in zip(header, cells):
            if not cell:
                raise ValueError(f"{field}: {path}: line {line}: `{name}` is empty")
            row[name] = _cell(cell)
        rows.append(row)
    if not rows:
        raise ValueError(f"{field}: {path}: no row under the header")
    return rows


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

"""A reader for the YAML subset of the ``.amdgpu_metadata`` block (code object v4+ notes).

The block LLVM prints is plain block-style YAML: mappings (``key: value``), sequences
(``- item``, including ``- key: value`` items that open a mapping), scalars (integers, booleans,
strings, possibly quoted) and sequences of scalars. Nothing else (anchors, flow collections,
multi-line strings) occurs, so this reader handles exactly that and raises ``ValueError`` on
anything it does not understand rather than guessing.
"""

from __future__ import annotations


def _scalar(text: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _lines(text: str) -> list[tuple[int, str]]:
    out = []
    for raw in text.splitlines():
        stripped = raw.split(" #", 1)[0].rstrip()
        if not stripped.strip() or stripped.strip() in ("---", "..."):
            continue
        out.append((len(stripped) - len(stripped.lstrip()), stripped.strip()))
    return out


def parse_yaml(text: str):
    """The value of a block-style YAML document (dicts, lists, scalars)."""
    lines = _lines(text)
    value, end = _block(lines, 0, lines[0][0] if lines else 0)
    if end != len(lines):
        raise ValueError(f"metadata: unexpected line {lines[end][1]!r}")
    return value


def _block(lines, i, indent):
    if i >= len(lines):
        return None, i
    if lines[i][1].startswith("- ") or lines[i][1] == "-":
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines, i, indent):
    items = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
        body = lines[i][1][1:].strip()
        if not body:
            value, i = _block(lines, i + 1, lines[i + 1][0])
            items.append(value)
            continue
        if ":" in body and not body.startswith(("'", '"')) and _is_key(body):
            # "- key: value" opens a mapping whose keys sit at indent + 2.
            inner = indent + 2
            lines[i] = (inner, body)
            value, i = _mapping(lines, i, inner)
            items.append(value)
            continue
        items.append(_scalar(body))
        i += 1
    return items, i


def _is_key(body: str) -> bool:
    key = body.split(":", 1)[0]
    return bool(key) and " " not in key.strip()


def _mapping(lines, i, indent):
    out = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
        key, sep, rest = lines[i][1].partition(":")
        if not sep:
            raise ValueError(f"metadata: expected 'key: value', got {lines[i][1]!r}")
        rest = rest.strip()
        if rest:
            out[key.strip()] = _scalar(rest)
            i += 1
            continue
        i += 1
        if i < len(lines) and lines[i][0] > indent:
            out[key.strip()], i = _block(lines, i, lines[i][0])
        elif i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
            out[key.strip()], i = _sequence(lines, i, indent)
        else:
            out[key.strip()] = None
    return out, i

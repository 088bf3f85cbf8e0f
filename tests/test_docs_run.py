"""Every code block of README.md and docs/*.md runs, so the documentation cannot rot.

``python`` blocks of one file run in order, as one script, in a process of their own with
four CPU devices (what the README's sharded snippet tells a user to set up), and must finish
without an error (each block ends in its own assertions or prints). ``bash`` blocks are
install and make commands: each ``make`` target must exist in the Makefile and each ``pip
install`` extra in pyproject.toml (``make demo`` and ``make test`` run them for real). Blocks
without a language are layouts and pseudo-code. The notebook and the documented code use only
the public API (``import jax_mxfp4 as jm`` and names in ``jm.__all__``).

Mutation checks: renaming ``jm.check_metadata`` in the README fails test_python_blocks_run
(NameError in the README's script) and test_only_public_names_are_used; ``make demo`` renamed
to ``make demo-cpu`` in the README fails test_bash_blocks_name_real_targets_and_extras.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import jax_mxfp4 as jm

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def test_readme_has_the_blocks_it_promises():
    python = "\n".join(blocks(ROOT / "README.md", "python"))
    for needed in ("jm.write_kv_cache", "jm.export", "jm.deserialize", "jm.check_metadata",
                   "Mesh(", "decode_step"):
        assert needed in python, needed


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "python")],
                         ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path):
    script = tmp_path / f"{path.stem}.py"
    script.write_text("\n\n".join(blocks(path, "python")))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    if path.name == "README.md":
        assert "(4, 16, 128) bfloat16" in done.stdout
        assert "block_table[3, 7] = -1" in done.stdout


def test_bash_blocks_name_real_targets_and_extras():
    makefile = (ROOT / "Makefile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    commands = [line.split("#")[0].strip() for path in DOCS for body in blocks(path, "bash")
                for line in body.splitlines() if line.split("#")[0].strip()]
    assert commands
    for command in commands:
        words = command.split()
        if words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), command
        elif words[:2] == ["pip", "install"]:
            for extra in re.findall(r"\[([\w,]+)\]", command):
                assert set(extra.split(",")) <= set(extras), command
        else:
            raise AssertionError(f"a bash block command this test does not know: {command}")


def _documented_code() -> dict[str, str]:
    code = {p.name: "\n".join(blocks(p, "python")) for p in DOCS}
    notebook = json.loads((ROOT / "examples" / "quickstart.ipynb").read_text())
    code["quickstart.ipynb"] = "\n".join("".join(c["source"]) for c in notebook["cells"]
                                         if c["cell_type"] == "code")
    return code


def test_only_public_names_are_used():
    for name, code in _documented_code().items():
        private = re.findall(r"^\s*(?:from|import) jax_mxfp4\.[\w.]+", code, re.M)
        assert not private, (name, private)
        used = set(re.findall(r"\bjm\.(\w+)", code))
        assert used <= set(jm.__all__) | {"reference"}, (name, used - set(jm.__all__))


def test_license_file_matches_pyproject():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert declared == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202


def spec_sections() -> set[str]:
    """Every citable id of docs/spec.md: "N" for "## N.", "N.M" for "### N.M" and for the
    numbered items ("M. ...") of section N (the open questions of §13)."""
    ids, top = set(), None
    for line in (ROOT / "docs" / "spec.md").read_text().splitlines():
        if match := re.match(r"## (\d+)\. ", line):
            top = match.group(1)
            ids.add(top)
        elif match := re.match(r"### (\d+\.\d+) ", line):
            ids.add(match.group(1))
        elif top is not None and (match := re.match(r"(\d+)\. ", line)):
            ids.add(f"{top}.{match.group(1)}")
    return ids


CITED_IN = ("jax_mxfp4", "cdna_emulator", "ffi", "tests", "bench", "examples", "docs")
SUFFIXES = {".py", ".cc", ".h", ".md", ".ipynb"}


def citations() -> list[tuple[str, str]]:
    """``(file, section id)`` of every "SPEC §n" in the code and docs (lists such as "SPEC §7,
    §8" and "§1.5/§5.1" included) and of every "§n" inside docs/spec.md and README.md."""
    files = [ROOT / "README.md"] + [p for folder in CITED_IN for p in (ROOT / folder).rglob("*")
                                    if p.suffix in SUFFIXES]
    found = []
    for path in files:
        text = path.read_text(errors="replace")
        spans = re.findall(r"SPEC\s*((?:§\s?\d+(?:\.\d+)?(?:\s*(?:[,/]|and|or)\s*)?)+)", text)
        if path in (ROOT / "README.md", ROOT / "docs" / "spec.md"):
            spans += re.findall(r"§\s?\d+(?:\.\d+)?", text)
        for span in spans:
            found += [(str(path.relative_to(ROOT)), n)
                      for n in re.findall(r"\d+(?:\.\d+)?", span)]
    return found


def test_every_spec_citation_resolves():
    sections, cited = spec_sections(), citations()
    assert len(cited) > 100 and {"1.9", "1.6", "7"} <= sections
    missing = sorted({(where, n) for where, n in cited if n not in sections})
    assert not missing, missing


def test_no_pointer_to_a_spec_outside_the_repository():
    for folder in ("jax_mxfp4", "cdna_emulator", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__):
                continue
            text = path.read_text()
            assert "SPEC.md" not in text and "shared with the team" not in text, path
    readme = (ROOT / "README.md").read_text()
    assert "docs/spec.md" in readme and "shared with the team" not in readme

"""The README's Quickstart, run as written (issue 35): the blocks marked `<!-- quickstart -->` run in order in one
temporary directory, each in a fresh process (they call bnb.register(), process-wide, and later blocks load what
earlier ones saved): transformers' path quantizes the embedded model to NF4 and generates, the CLI quantizes and
saves it, and `from_pretrained` loads the CLI's checkpoint back. The Quickstart's fine-tune block is
tests/test_qlora_recipe.py's.

A `print(...)  # X` line of a block promises the output line X; the test holds the README to it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from test_first_minutes import ROOT, _run

README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- quickstart -->\n```(python|bash)\n(.*?)```", re.S)
PROMISE = re.compile(r"^print\(.*\)\s+#\s*(\S+)\s*$", re.M)


def _quickstart() -> str:
    text = README.read_text()
    m = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README.md lost its `## Quickstart` section"
    return m.group(1)


def _blocks():
    return BLOCK.findall(_quickstart())


def _run_bash(code: str, cwd: Path) -> subprocess.CompletedProcess:
    # the README's `bnb-ms` is the venv's console script (.venv/bin/bnb-ms, next to this interpreter)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-euc", code], capture_output=True, text=True, env=env, cwd=str(cwd), timeout=240)


def test_quickstart_blocks_are_marked():
    langs = [lang for lang, _ in _blocks()]
    assert langs == ["python", "bash", "python"], langs
    # the fine-tune is in the Quickstart too, under the marker tests/test_qlora_recipe.py reads
    assert "<!-- qlora-recipe -->\n```python\n" in _quickstart()
    marks = [ln for ln in README.read_text().splitlines() if ln.strip() == "<!-- quickstart -->"]
    assert len(marks) == len(langs)  # none outside the section


def _continuation(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("The list type")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_quickstart_runs_as_written(tmp_path):
    outs = []
    for lang, code in _blocks():
        proc = _run(code, tmp_path) if lang == "python" else _run_bash(code, tmp_path)
        assert proc.returncode == 0, f"{lang} block:\n{code}\n" + proc.stdout[-2000:] + proc.stderr[-4000:]
        for promised in PROMISE.findall(code):
            assert promised in proc.stdout.splitlines(), (promised, proc.stdout[-2000:])
        outs.append(proc.stdout)

    # 1. transformers' path: greedy text that continues the prompt, and upstream's keys on disk
    gen1 = _continuation(outs[0])
    assert len(gen1) > len("The list type") + 8, gen1
    cfg = json.loads((tmp_path / "nf4-model" / "config.json").read_text())
    assert cfg["quantization_config"]["bnb_4bit_quant_type"] == "nf4"
    assert (tmp_path / "nf4-model" / "tokenizer.json").exists()

    # 2. the CLI: an NF4 report and a checkpoint with the double-quant config
    assert re.search(r"^mode\s+nf4", outs[1], re.M), outs[1]
    assert re.search(r"^layers converted\s+28:", outs[1], re.M), outs[1]
    cfg = json.loads((tmp_path / "nf4-cli" / "config.json").read_text())["quantization_config"]
    assert cfg["load_in_4bit"] and cfg["bnb_4bit_use_double_quant"], cfg

    # 3. loaded back, the CLI's model continues the prompt as the CLI's own greedy run did (same bytes, same path)
    cli_cont = re.search(r"^continuation\s+(.*)$", outs[1], re.M).group(1)
    gen3 = _continuation(outs[2])
    assert len(gen3) > len("The list type") + 8, gen3
    assert cli_cont.startswith(repr(gen3[len("The list type"):])[:-1]), (cli_cont, gen3)


# ---- the README's source map and the docs pages it links stay true ----

def test_source_map_paths_exist():
    """Every folder of the README's source map exists, and every file it names is in that folder (or below it)."""
    text = README.read_text()
    rows = [r for r in text[text.index("## Source map"):].splitlines() if r.startswith("| `")]
    assert len(rows) >= 8, rows
    for row in rows:
        _, where, what, _ = row.split("|")
        folders = [ROOT / f for f in re.findall(r"`([^`]+)`", where)]
        assert folders and all(f.is_dir() for f in folders), row
        for name in re.findall(r"`([\w./-]+\.(?:py|h|sh))`", what):
            assert any(next(f.rglob(name), None) or (ROOT / name).exists() for f in folders), (name, row)


def test_readme_and_docs_links_resolve():
    """Relative links of README.md and docs/*.md point at files that exist; docs/README.md lists every page, and each
    page starts with a title and a one-line summary."""
    docs = sorted((ROOT / "docs").glob("*.md"))
    for page in [README] + docs:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if not target.startswith(("http://", "https://", "#")):
                assert (page.parent / target.split("#")[0]).exists(), (page.name, target)
    index = (ROOT / "docs" / "README.md").read_text()
    for page in docs:
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2].strip(), page.name
        if page.name != "README.md":
            assert f"]({page.name})" in index, page.name

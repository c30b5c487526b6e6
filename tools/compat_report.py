#!/usr/bin/env python3
"""Measure how much of upstream bitsandbytes' CPU test suite passes in our port (compat_tests/).

    python tools/compat_report.py                    # run compat_tests (incl. slow), write compat_tests/REPORT.md
    python tools/compat_report.py --ours-junit F     # re-render from an existing junit file of our run
    python tools/compat_report.py --refresh-upstream # re-measure upstream on this CPU (slow), then report

Run it with the project interpreter (``.venv/bin/python`` or ``/tmp/venv0/bin/python`` with
``PYTHONPATH=.``); it runs our suite with that interpreter.

Upstream side: ``--refresh-upstream`` takes upstream's own ``tests/`` from a git checkout of
bitsandbytes (the 0.50.2 tag when the repository has it, else the ref given), runs each upstream test
file with pytest in the throwaway upstream env (``~/.cache/bitsandbytes_ms/upstream-env``: torch 2.13 CPU
+ bitsandbytes 0.50.2, plus upstream's test extras installed here) on this CPU, one file at a time
with ``--junitxml``, and stores every case's outcome in ``compat_tests/upstream_cpu_results.json``
(checked in, with the versions, date and CPU), because CI has no upstream env and the run is slow.
Per-file junit files are kept under ``~/.cache/bitsandbytes_ms/upstream-tests/<commit>/junit/``;
``--reuse-junit`` builds the JSON from those that exist instead of re-running them.

Both runs deselect tests marked ``benchmark`` or ``deprecated`` (upstream's own default ``addopts`` does
too; they time things and assert nothing). Upstream's ``slow`` tests are run.

Matching: a case is identified by (upstream file, ``Class::test[params]``). Our files keep upstream's
names and parametrizations; a file ``compat_tests/test_<upstream>_<part>.py`` (e.g. ``test_ops_int8.py``)
holds part of upstream's ``test_<upstream>.py``. In ids, ``bitsandbytes_ms`` reads as ``bitsandbytes``
and ``mindspore.`` as ``torch.`` (reprs of classes and dtypes in parametrize ids).

CPU-applicable cases: those upstream *passes* on this CPU. Cases upstream skips on CPU (CUDA-only,
empty device lists) are not applicable. Cases upstream itself fails or xfails on CPU are not counted in
the share either (they have no passing behaviour to reproduce); the report lists them, with our outcome.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "compat_tests"
REPORT_MD = COMPAT / "REPORT.md"
UPSTREAM_JSON = COMPAT / "upstream_cpu_results.json"
OUR_JUNIT = ROOT / "build" / "compat_report" / "ours.xml"

UPSTREAM_FILES = [
    "test_functional.py",
    "test_ops.py",
    "test_linear8bitlt.py",
    "test_linear4bit.py",
    "test_modules.py",
    "test_autograd.py",
    "test_optim.py",
    "test_parametrize.py",
    "test_generation.py",
]
# Our files whose name does not tell which upstream file they port (none today; the prefix rule in
# upstream_file_for() covers test_ops_int8.py, test_autograd_4bit.py, ...).
FILE_MAP: Dict[str, str] = {}

MARKER_EXPR = "not benchmark and not deprecated"
GOAL = 0.90

CACHE = Path.home() / ".cache" / "bitsandbytes_ms"
UPSTREAM_ENV_PY = CACHE / "upstream-env" / "bin" / "python"
UPSTREAM_REPO = Path("/work/.mirror/bitsandbytes-foundation+bitsandbytes/repo")
UPSTREAM_TAG = "0.50.2"
# upstream's [test] extras (pyproject.toml of 0.50.x), pinned to what the cached results were made with
UPSTREAM_TEST_PINS = ["pytest==8.4.2", "pytest-timeout==2.4.0", "lion-pytorch==0.2.3", "einops==0.8.2",
                      "transformers==4.57.1"]

PASSED, FAILED, SKIPPED, XFAILED = "passed", "failed", "skipped", "xfailed"


# ----------------------------------------------------------------------------------------------
# junit parsing and id matching (pure functions; tests/test_compat_report.py checks them)
# ----------------------------------------------------------------------------------------------


def upstream_file_for(our_file: str) -> Optional[str]:
    """The upstream test file that our ``compat_tests`` file ``our_file`` ports, or None.

    ``test_ops.py`` -> ``test_ops.py``; ``test_ops_int8.py`` -> ``test_ops.py`` (longest upstream stem
    followed by ``_``); files named in FILE_MAP go where it says."""
    name = os.path.basename(our_file)
    if not name.endswith(".py"):
        name += ".py"
    if name in FILE_MAP:
        return FILE_MAP[name]
    stem = name[:-3]
    best = None
    for up in UPSTREAM_FILES:
        ustem = up[:-3]
        if stem == ustem or stem.startswith(ustem + "_"):
            if best is None or len(ustem) > len(best[:-3]):
                best = up
    return best


def normalize_case(case: str) -> str:
    """Our spelling of a ``Class::test[params]`` id -> upstream's (reprs of our classes and dtypes)."""
    case = case.replace("bitsandbytes_ms", "bitsandbytes")
    return re.sub(r"\bmindspore\.", "torch.", case)


def split_junit_classname(classname: str, name: str) -> Tuple[Optional[str], str]:
    """pytest junit (classname, name) -> (module file name, ``Class::test[params]``).

    pytest writes ``compat_tests/test_x.py::TestA::test_b[p]`` as classname ``compat_tests.test_x.TestA``
    and name ``test_b[p]``. The module is the last dotted component starting with ``test_`` (pytest's
    default ``python_files = test_*.py``; directories like ``tests`` and classes ``Test*`` do not match). Returns (None, name) when there is no
    such component (e.g. a collection error reported against a directory)."""
    parts = [p for p in classname.split(".") if p] if classname else []
    for i in range(len(parts) - 1, -1, -1):  # the last one: directories may be called test_*, classes are Test*
        if parts[i].startswith("test_"):
            return parts[i] + ".py", "::".join(parts[i + 1:] + [name])
    return None, name


def _outcome(tc: ET.Element) -> Tuple[str, str]:
    """(outcome, message) of one junit <testcase>."""
    for child in tc:
        if child.tag in ("failure", "error"):
            text = (child.text or "").strip().splitlines()
            return FAILED, child.get("message") or (text[-1] if text else child.tag)
    for child in tc:
        if child.tag == "skipped":
            kind = child.get("type", "")
            msg = child.get("message") or ""
            if kind == "pytest.xfail":
                return XFAILED, msg
            return SKIPPED, msg
    return PASSED, ""


def parse_junit(xml_text: str) -> List[dict]:
    """Every <testcase> of a pytest junit file: dicts with file, case, outcome, message, time.

    failure/error -> "failed" (a setup or teardown error fails the case too), skipped of type
    ``pytest.xfail`` -> "xfailed", other skipped -> "skipped" with pytest's reason (the ``message``
    attribute), none -> "passed" (an xpass is a pass)."""
    root = ET.fromstring(xml_text)
    out = []
    for tc in root.iter("testcase"):
        file, case = split_junit_classname(tc.get("classname", ""), tc.get("name", ""))
        outcome, msg = _outcome(tc)
        out.append({"file": file, "case": case, "outcome": outcome, "message": clean_reason(msg),
                    "time": float(tc.get("time") or 0.0)})
    return out


def clean_reason(msg: str) -> str:
    """A skip/xfail/failure message as one short line (pytest prefixes 'Skipped: ' to pytest.skip's)."""
    msg = (msg or "").strip().splitlines()[0] if (msg or "").strip() else ""
    if msg.startswith("Skipped: "):
        msg = msg[len("Skipped: "):]
    return msg[:300]


def merge_outcomes(records: Iterable[dict]) -> Dict[Tuple[str, str], dict]:
    """(upstream file, case) -> record, for records of our files; a case seen twice (a test that fails in
    teardown after passing is reported twice by some pytest versions) keeps the worst outcome."""
    rank = {FAILED: 3, XFAILED: 2, SKIPPED: 1, PASSED: 0}
    res: Dict[Tuple[str, str], dict] = {}
    for r in records:
        if r["file"] is None:
            continue
        up = upstream_file_for(r["file"])
        if up is None:
            continue
        key = (up, normalize_case(r["case"]))
        if key not in res or rank[r["outcome"]] > rank[res[key]["outcome"]]:
            res[key] = dict(r, upstream_file=up)
    return res


def function_of(case: str) -> str:
    """``Class::test_x[params]`` -> ``Class::test_x``."""
    return case.split("[", 1)[0]


def compare(upstream: dict, ours: Dict[Tuple[str, str], dict]) -> Dict[str, dict]:
    """Per upstream file: counts and the grouped gaps. ``upstream`` is the cached JSON's ``files``."""
    result = {}
    for up in UPSTREAM_FILES:
        ucases = upstream.get(up, {}).get("cases", {})
        mine = {case: r for (f, case), r in ours.items() if f == up}
        counts = collections.Counter(r["outcome"] for r in mine.values())
        skip_reasons = collections.Counter(r["message"] or "(no reason)" for r in mine.values()
                                           if r["outcome"] == SKIPPED)
        ustat = collections.Counter(v["outcome"] for v in ucases.values())
        applicable = sorted(c for c, v in ucases.items() if v["outcome"] == PASSED)
        passing = [c for c in applicable if c in mine and mine[c]["outcome"] == PASSED]
        missing = collections.Counter(function_of(c) for c in applicable if c not in mine)
        not_passing = collections.defaultdict(list)  # (function, outcome) -> [(case, message)]
        for c in applicable:
            if c in mine and mine[c]["outcome"] != PASSED:
                not_passing[(function_of(c), mine[c]["outcome"])].append((c, mine[c]["message"]))
        upstream_bad = {c: (v, mine.get(c)) for c, v in ucases.items() if v["outcome"] in (FAILED, XFAILED)}
        unmeasured = set(upstream.get(up, {}).get("not_measured", []))
        extra = collections.Counter(function_of(c) for c in mine if c not in ucases and c not in unmeasured)
        unmeasured_ours = sum(1 for c in mine if c in unmeasured)
        result[up] = {
            "present": up in upstream,
            "our_files": sorted({r["file"] for r in mine.values()}),
            "not_measured": len(upstream.get(up, {}).get("not_measured", [])),
            "upstream": {"collected": len(ucases), "deselected": len(upstream.get(up, {}).get("deselected", [])),
                         **{k: ustat.get(k, 0) for k in (PASSED, FAILED, SKIPPED, XFAILED)}},
            "upstream_skip_reasons": collections.Counter(v.get("reason") or "(no reason)" for v in ucases.values()
                                                         if v["outcome"] == SKIPPED),
            "ours": {"collected": len(mine), **{k: counts.get(k, 0) for k in (PASSED, FAILED, SKIPPED, XFAILED)}},
            "skip_reasons": skip_reasons,
            "applicable": len(applicable),
            "applicable_passed": len(passing),
            "missing": missing,
            "not_passing": not_passing,
            "upstream_bad": upstream_bad,
            "extra": extra,
            "ours_in_unmeasured": unmeasured_ours,
        }
    return result


# ----------------------------------------------------------------------------------------------
# running
# ----------------------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def run_ours(junit: Path, extra: List[str]) -> float:
    """Run all of compat_tests (slow ones too) with this interpreter; return the seconds taken."""
    junit.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "-m", MARKER_EXPR, f"--junitxml={junit}", "-o", "junit_family=xunit2", *extra, "compat_tests"]
    print("[compat_report] " + " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, env=env)  # failures are data here, not an error
    return time.time() - t0


def ensure_upstream_test_env() -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    import make_reference_vectors as mrv  # the upstream env (torch 2.13 CPU + bitsandbytes 0.50.2)

    mrv.ensure_env()
    py = mrv.env_python()
    have = subprocess.run([py, "-m", "pip", "freeze"], capture_output=True, text=True).stdout.lower()
    need = [p for p in UPSTREAM_TEST_PINS if p.lower().replace("_", "-") not in have.replace("_", "-")]
    if need:
        subprocess.check_call([py, "-m", "pip", "install", "-q", *need])
    return py


def upstream_versions(py: str) -> dict:
    code = ("import json, importlib.metadata as m, platform; "
            "print(json.dumps({k: m.version(k) for k in ('bitsandbytes', 'torch', 'pytest', 'transformers')} | "
            "{'python': platform.python_version()}))")
    return json.loads(subprocess.run([py, "-c", code], check=True, capture_output=True, text=True).stdout)


def checkout_upstream_tests(repo: Path, ref: Optional[str]) -> Tuple[Path, dict]:
    """Extract upstream's tests/ (and pyproject.toml, for its markers) at the chosen ref into the cache."""
    tags = git(repo, "tag").split()
    if ref is None:
        ref = UPSTREAM_TAG if UPSTREAM_TAG in tags else "HEAD"
    commit = git(repo, "rev-parse", ref + "^{commit}")
    version = re.search(r'__version__\s*=\s*"([^"]+)"', git(repo, "show", f"{commit}:bitsandbytes/__init__.py"))
    info = {"repository": "github.com/bitsandbytes-foundation/bitsandbytes", "ref": ref, "commit": commit,
            "version_in_tree": version.group(1) if version else None,
            "tag_0.50.2_present": UPSTREAM_TAG in tags,
            "commit_date": git(repo, "log", "-1", "--format=%cI", commit)}
    if UPSTREAM_TAG not in tags:
        # say how the tests we ran relate to the last release tag before the ref
        last = git(repo, "describe", "--tags", "--abbrev=0", "--match", "[0-9]*.[0-9]*", commit)
        same = git(repo, "diff", "--stat", last, commit, "--", "tests") == ""
        info["nearest_tag"] = last
        info["tests_identical_to_nearest_tag"] = same
    dest = CACHE / "upstream-tests" / commit
    if not (dest / "tests" / "conftest.py").exists():
        dest.mkdir(parents=True, exist_ok=True)
        tar = subprocess.run(["git", "-C", str(repo), "archive", commit, "tests", "pyproject.toml"],
                             check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest, info


def collect_ids(py: str, dest: Path, files: List[str], marker: Optional[str]) -> Dict[str, List[str]]:
    """file -> ids pytest collects there (one pytest call for all files: importing torch is slow)."""
    cmd = [py, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "-o", "addopts=", *(["-m", marker] if marker else []), *(f"tests/{f}" for f in files)]
    out = subprocess.run(cmd, cwd=dest, capture_output=True, text=True).stdout
    res: Dict[str, List[str]] = {f: [] for f in files}
    for line in out.splitlines():
        if line.startswith("tests/") and "::" in line:
            path, case = line.split("::", 1)
            if path[len("tests/"):] in res:
                res[path[len("tests/"):]].append(case)
    return res


CHUNK_CASES = 50  # upstream cases per pytest call: a killed or unfinished run keeps the chunks it finished


def chunk_nodes(case_ids: List[str]) -> List[List[str]]:
    """Consecutive slices of CHUNK_CASES case ids (collection order), each run as one pytest call with explicit
    node ids. Deterministic for one upstream commit, so per-chunk junit files can be reused by a later run."""
    return [case_ids[i:i + CHUNK_CASES] for i in range(0, len(case_ids), CHUNK_CASES)]


def _claim(lock: Path) -> bool:
    """Claim a chunk for this process (another refresh may run in parallel); stale claims are taken over."""
    try:
        lock.mkdir()
    except FileExistsError:
        try:
            os.kill(int((lock / "pid").read_text()), 0)
            return False
        except (OSError, ValueError):
            pass
    (lock / "pid").write_text(str(os.getpid()))
    return True


def _load_collect(py: str, dest: Path) -> Tuple[Dict[str, List[str]], Dict[str, List[str]]]:
    cache = dest / "junit" / "collect.json"
    if cache.exists():
        d = json.loads(cache.read_text())
        return d["all"], d["marked"]
    all_ids = collect_ids(py, dest, UPSTREAM_FILES, None)
    marked_ids = collect_ids(py, dest, UPSTREAM_FILES, "benchmark or deprecated")
    cache.write_text(json.dumps({"all": all_ids, "marked": marked_ids}))
    return all_ids, marked_ids


def refresh_upstream(repo: Path, ref: Optional[str], reuse: bool, timeout: int, partial: bool = False,
                     only: Optional[List[str]] = None, write: bool = True) -> None:
    """Run upstream's files chunk by chunk (junit per chunk, kept in the cache), then write the JSON.

    partial: run nothing, store what the cache has (cases of unfinished chunks: "not_measured")."""
    py = ensure_upstream_test_env()
    dest, source = checkout_upstream_tests(repo, ref)
    jdir = dest / "junit"
    jdir.mkdir(exist_ok=True)
    times_file = jdir / "times.txt"
    all_ids, marked_ids = _load_collect(py, dest)
    files, durations = {}, {}
    for file in UPSTREAM_FILES:
        stem = file[:-3]
        marked = set(marked_ids[file])
        run_ids = [i for i in all_ids[file] if i not in marked]
        whole = jdir / f"{stem}.xml"  # a whole-file run (older layout) counts as every chunk
        junits = [whole] if whole.exists() and whole.stat().st_size > 0 else []
        if not junits:
            (jdir / stem).mkdir(exist_ok=True)
            for idx, nodes in enumerate(chunk_nodes(run_ids)):
                junit = jdir / stem / f"{idx:03d}.xml"
                done = junit.exists() and junit.stat().st_size > 0
                if not partial and (only is None or file in only) and not (reuse and done):
                    if not _claim(jdir / stem / f"{idx:03d}.lock"):
                        continue
                    cmd = ["nice", "-n", "10", py, "-m", "pytest", "-q", "-rN", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-o", "addopts=", "-o", "log_cli=false", "-m", MARKER_EXPR,
                           f"--timeout={timeout}", f"--junitxml={junit}.part", *(f"tests/{file}::{n}" for n in nodes)]
                    print(f"[compat_report] upstream: {file} chunk {idx}: {nodes[0]} ... ({len(nodes)} cases)", flush=True)
                    t0 = time.time()
                    with open(jdir / stem / f"{idx:03d}.log", "w") as log:
                        rc = subprocess.run(cmd, cwd=dest, stdout=log, stderr=subprocess.STDOUT).returncode
                    with open(times_file, "a") as tf:
                        tf.write(f"{stem}/{idx:03d} rc={rc} secs={int(time.time() - t0)}\n")
                    os.replace(f"{junit}.part", junit)
                    done = True
                if done:
                    junits.append(junit)
        secs = 0
        for line in (times_file.read_text().splitlines() if times_file.exists() else []):
            m = re.match(r"(\S+) rc=\S+ secs=(\d+)", line)
            if m and (m.group(1) == stem or m.group(1).startswith(stem + "/")):
                secs += int(m.group(2))
        durations[file] = secs or None
        cases = {}
        for junit in junits:
            for r in parse_junit(junit.read_text()):
                if r["file"] != file:
                    raise SystemExit(f"compat_report: unexpected junit entry {r} in {junit}")
                cases[r["case"]] = {"outcome": r["outcome"], **({"reason": r["message"]} if r["message"] else {})}
        stray = [c for c in cases if c not in run_ids]
        if stray:
            raise SystemExit(f"compat_report: {file}: junit cases not in upstream's collection: {stray[:5]}")
        files[file] = {"collected": len(all_ids[file]), "deselected": sorted(marked & set(all_ids[file])),
                       "not_measured": [i for i in run_ids if i not in cases],
                       "cases": dict(sorted(cases.items()))}
    if not write:
        return
    data = {
        "about": "upstream bitsandbytes' own tests run on this CPU; made by tools/compat_report.py --refresh-upstream",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "versions": upstream_versions(py),
        "tests_source": source,
        "pytest_args": f'-p no:randomly -o addopts= -m "{MARKER_EXPR}" --timeout={timeout} --junitxml=...  '
                       f'(per file or per chunk of ~{CHUNK_CASES} cases, nice -n 10)',
        "durations_s": durations,
        "partial": any(f["not_measured"] for f in files.values()),
        "files": files,
    }
    write_upstream_json(data)


def write_upstream_json(data: dict) -> None:
    """One case per line, so a re-measurement's diff shows which cases changed."""
    lines = ["{"]
    head = {k: v for k, v in data.items() if k != "files"}
    for k, v in head.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)},")
    lines.append('  "files": {')
    for fi, (file, fd) in enumerate(data["files"].items()):
        lines.append(f"    {json.dumps(file)}: {{")
        lines.append(f'      "collected": {fd["collected"]},')
        lines.append(f'      "deselected": {json.dumps(fd["deselected"])},')
        lines.append(f'      "not_measured": {json.dumps(fd.get("not_measured", []))},')
        lines.append('      "cases": {')
        items = list(fd["cases"].items())
        for ci, (case, v) in enumerate(items):
            lines.append(f"        {json.dumps(case)}: {json.dumps(v, sort_keys=True)}" + ("," if ci < len(items) - 1 else ""))
        lines.append("      }")
        lines.append("    }" + ("," if fi < len(data["files"]) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    UPSTREAM_JSON.write_text("\n".join(lines) + "\n")
    json.loads(UPSTREAM_JSON.read_text())  # well-formed
    print(f"[compat_report] wrote {UPSTREAM_JSON.relative_to(ROOT)}", flush=True)


# ----------------------------------------------------------------------------------------------
# the report
# ----------------------------------------------------------------------------------------------


def pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def fmt_secs(s: Optional[float]) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def render(upstream: dict, cmp: Dict[str, dict], ours_meta: dict) -> str:
    src = upstream["tests_source"]
    v = upstream["versions"]
    tot = collections.Counter()
    for r in cmp.values():
        tot["applicable"] += r["applicable"]
        tot["applicable_passed"] += r["applicable_passed"]
        for k, n in r["ours"].items():
            tot["ours_" + k] += n
        for k, n in r["upstream"].items():
            tot["up_" + k] += n
    share = tot["applicable_passed"] / tot["applicable"] if tot["applicable"] else 0.0
    L = []
    L.append("# Ported upstream tests: what passes on CPU")
    L.append("")
    L.append("Generated by `python tools/compat_report.py` (see its docstring); regenerate it after merging test or "
             "library changes. Do not edit by hand.")
    L.append("")
    L.append(f"**Goal: >= {GOAL:.0%} of upstream's CPU-applicable cases pass in ours. Now: "
             f"{tot['applicable_passed']} / {tot['applicable']} = {pct(tot['applicable_passed'], tot['applicable'])} "
             f"-- {'met' if share >= GOAL else 'NOT met'}.**")
    unported = [f for f, r in cmp.items() if not r["our_files"] and r["applicable"]]
    if unported:
        n_app = tot["applicable"] - sum(cmp[f]["applicable"] for f in unported)
        L.append("")
        L.append(f"Files with no port in this tree yet ({', '.join(f'`{f}`' for f in unported)}) count as 0 passing; "
                 f"over the ported files alone: {tot['applicable_passed']} / {n_app} = {pct(tot['applicable_passed'], n_app)}.")
    L.append("")
    L.append(f"- Ours: bitsandbytes_ms at `{ours_meta['commit']}`{' (+ uncommitted changes)' if ours_meta['dirty'] else ''}, "
             f"run {ours_meta['date']} on {ours_meta['cpu']} ({ours_meta['cpu_count']} cores, shared), "
             f"`pytest -m \"{MARKER_EXPR}\" compat_tests` (slow tests included) took {fmt_secs(ours_meta['seconds'])}.")
    durs = upstream.get("durations_s", {})
    total_up = sum(x for x in durs.values() if x) if durs else None
    L.append(f"- Upstream: bitsandbytes {v.get('bitsandbytes')} with torch {v.get('torch')} (Python {v.get('python')}), "
             f"its own test files from {src['repository']} at `{src['commit'][:10]}` ({src['ref']}, "
             f"version in tree {src.get('version_in_tree')}"
             + ("" if src.get("tag_0.50.2_present") else
                f"; the mirror has no 0.50.2 tag, tests/ there is "
                f"{'identical to' if src.get('tests_identical_to_nearest_tag') else 'different from'} tag "
                f"{src.get('nearest_tag')}") +
             f"), run {upstream['date']} on {upstream['cpu']} ({upstream['cpu_count']} cores, shared) one file at a time, "
             f"`{upstream['pytest_args']}`; {fmt_secs(total_up)} in all. Cached in "
             f"`compat_tests/upstream_cpu_results.json` (`--refresh-upstream` re-measures).")
    if upstream.get("partial") or any(f not in upstream["files"] for f in UPSTREAM_FILES):
        nm = [f"`{f}` {r['not_measured']} of {r['not_measured'] + r['upstream']['collected']}" if r["present"]
              else f"`{f}` (all)" for f, r in cmp.items() if r["not_measured"] or not r["present"]]
        L.append(f"- **PARTIAL: upstream's CPU run had not finished every case when this was made; not measured: "
                 f"{', '.join(nm)}. Those cases count as neither applicable nor not, so the share covers only the "
                 f"measured ones.** `tools/compat_report.py --refresh-upstream --reuse-junit` completes it (finished "
                 f"chunks are kept in `~/.cache/bitsandbytes_ms/upstream-tests/`).")
    L.append(f"- Both runs deselect `benchmark`/`deprecated` tests (upstream's default `addopts` does too; they time "
             f"things and assert nothing): {tot['up_deselected']} upstream cases.")
    L.append("- **CPU-applicable** = cases upstream *passes* on this CPU. Cases upstream skips on CPU are not "
             "applicable; the few upstream itself fails or xfails on CPU are left out of the share and listed below "
             "with our outcome.")
    L.append("- Cases match by (upstream file, `Class::test[params]`); our files `test_<name>_<part>.py` hold parts of "
             "upstream's `test_<name>.py`; `bitsandbytes_ms`/`mindspore.` in ids read as `bitsandbytes`/`torch.`.")
    L.append("")
    L.append("| upstream file | our files | upstream cases (CPU: pass / fail / skip / xfail) | CPU-applicable | "
             "ours collected | passed | failed | skipped | xfailed | applicable passing in ours |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for up, r in cmp.items():
        u, o = r["upstream"], r["ours"]
        ours_files = ", ".join(f"`{f}`" for f in r["our_files"]) or "(none)"
        ucell = f"{u['collected']} ({u[PASSED]} / {u[FAILED]} / {u[SKIPPED]} / {u[XFAILED]})" if r["present"] else "not measured"
        if r["present"] and r["not_measured"]:
            ucell += f" + {r['not_measured']} not measured"
        L.append(f"| `{up}` | {ours_files} | {ucell} | {r['applicable']} | {o['collected']} | {o[PASSED]} | "
                 f"{o[FAILED]} | {o[SKIPPED]} | {o[XFAILED]} | {r['applicable_passed']} ({pct(r['applicable_passed'], r['applicable'])}) |")
    L.append(f"| **total** | | {tot['up_collected']} ({tot['up_' + PASSED]} / {tot['up_' + FAILED]} / "
             f"{tot['up_' + SKIPPED]} / {tot['up_' + XFAILED]}) | {tot['applicable']} | {tot['ours_collected']} | "
             f"{tot['ours_' + PASSED]} | {tot['ours_' + FAILED]} | {tot['ours_' + SKIPPED]} | {tot['ours_' + XFAILED]} | "
             f"{tot['applicable_passed']} ({pct(tot['applicable_passed'], tot['applicable'])}) |")
    L.append("")
    if ours_meta.get("unmatched"):
        L.append("Entries of our junit file that map to no upstream file (collection errors, other files): "
                 + "; ".join(f"`{x}`" for x in ours_meta["unmatched"][:10]))
        L.append("")
    L.append("## Gaps: upstream CPU-applicable cases that do not pass in ours")
    L.append("")
    any_gap = False
    for up, r in cmp.items():
        if not r["missing"] and not r["not_passing"]:
            continue
        any_gap = True
        L.append(f"### `{up}`")
        L.append("")
        if r["missing"]:
            L.append(f"Not collected in ours ({sum(r['missing'].values())}):")
            L.append("")
            for fn, n in sorted(r["missing"].items()):
                L.append(f"- `{fn}`: {n}")
            L.append("")
        if r["not_passing"]:
            L.append(f"Collected but not passing ({sum(len(x) for x in r['not_passing'].values())}):")
            L.append("")
            for (fn, outcome), cases in sorted(r["not_passing"].items()):
                msgs = collections.Counter(m for _, m in cases)
                msg = "; ".join(f"{(m or '(no message)')[:160]}" + (f" (x{n})" if n > 1 else "")
                                for m, n in msgs.most_common(2)) + ("; ..." if len(msgs) > 2 else "")
                L.append(f"- `{fn}`: {len(cases)} {outcome} -- {msg}")
            L.append("")
    if not any_gap:
        L.append("None.")
        L.append("")
    L.append("## Our skips, by reason")
    L.append("")
    for up, r in cmp.items():
        if not r["skip_reasons"]:
            continue
        L.append(f"- `{up}`:")
        for reason, n in r["skip_reasons"].most_common():
            L.append(f"  - {n} x {reason}")
    L.append("")
    L.append("## Upstream's own CPU failures and xfails (not in the share)")
    L.append("")
    rows = []
    for up, r in cmp.items():
        groups = collections.defaultdict(list)
        for c, (uv, mine) in r["upstream_bad"].items():
            groups[(function_of(c), uv["outcome"], (uv.get("reason") or "")[:120])].append(mine["outcome"] if mine else "not collected")
        for (fn, uo, reason), ours_out in sorted(groups.items()):
            oc = ", ".join(f"{n} {k}" for k, n in collections.Counter(ours_out).most_common())
            rows.append(f"| `{up}::{fn}` | {len(ours_out)} {uo} | {reason} | {oc} |")
    if rows:
        L.append("| case | upstream | upstream's message | ours |")
        L.append("|---|---|---|---|")
        L.extend(rows)
    else:
        L.append("None.")
    L.append("")
    L.append("## Upstream's CPU skips, by reason (not applicable)")
    L.append("")
    for up, r in cmp.items():
        if not r["upstream_skip_reasons"]:
            continue
        L.append(f"- `{up}`:")
        for reason, n in r["upstream_skip_reasons"].most_common():
            L.append(f"  - {n} x {reason}")
    L.append("")
    L.append("## Cases only in ours (no upstream case of that id on CPU)")
    L.append("")
    L.append("Extra tests of our ports (e.g. upstream's CUDA-only device lists run on `cpu` here; cases upstream has but "
             "did not get measured are not listed), by function:")
    L.append("")
    for up, r in cmp.items():
        if r["extra"]:
            L.append(f"- `{up}`: " + ", ".join(f"`{fn}` {n}" for fn, n in sorted(r["extra"].items())))
    L.append("")
    return "\n".join(L)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refresh-upstream", action="store_true", help="re-run upstream's tests in the upstream env")
    ap.add_argument("--reuse-junit", action="store_true",
                    help="with --refresh-upstream: keep per-file upstream junit files already in the cache")
    ap.add_argument("--upstream-repo", type=Path, default=UPSTREAM_REPO, help="git repository of bitsandbytes")
    ap.add_argument("--upstream-ref", default=None, help=f"ref to take tests/ from (default: tag {UPSTREAM_TAG}, else HEAD)")
    ap.add_argument("--partial", action="store_true",
                    help="with --refresh-upstream: run nothing, store what the junit cache has (the rest: not measured)")
    ap.add_argument("--files", default=None, help="with --refresh-upstream: run only these upstream files (comma list)")
    ap.add_argument("--no-write", action="store_true", help="with --refresh-upstream: run chunks, write no JSON")
    ap.add_argument("--upstream-only", action="store_true", help="with --refresh-upstream: stop after the cache")
    ap.add_argument("--timeout", type=int, default=900, help="per-test timeout (s) for the upstream run")
    ap.add_argument("--ours-junit", type=Path, action="append", default=None,
                    help="use this junit file of a compat_tests run instead of running our suite (repeatable: "
                         "the files are combined, e.g. an interrupted run and a run of the rest)")
    ap.add_argument("--output", type=Path, default=REPORT_MD)
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for our pytest run (after --)")
    a = ap.parse_args(argv)

    if a.refresh_upstream:
        refresh_upstream(a.upstream_repo, a.upstream_ref, a.reuse_junit or a.partial, a.timeout, a.partial,
                         a.files.split(",") if a.files else None, write=not a.no_write)
        if a.upstream_only or a.no_write:
            return 0
    if not UPSTREAM_JSON.exists():
        raise SystemExit(f"compat_report: {UPSTREAM_JSON} is missing: run with --refresh-upstream first")
    upstream = json.loads(UPSTREAM_JSON.read_text())

    if a.ours_junit is None:
        seconds = run_ours(OUR_JUNIT, a.pytest_args)
        junits = [OUR_JUNIT]
    else:
        junits, seconds = a.ours_junit, 0.0
        for j in junits:
            m = re.search(r'<testsuite [^>]*time="([0-9.]+)"', j.read_text()[:4000])
            seconds = seconds + float(m.group(1)) if (m and seconds is not None) else None
    records = [r for j in junits for r in parse_junit(j.read_text())]
    started = re.search(r'<testsuite [^>]*timestamp="([0-9T:-]+)', junits[0].read_text()[:4000])
    ours = merge_outcomes(records)
    unmatched = sorted({f"{r['file']}::{r['case']}" if r["file"] else r["case"]
                        for r in records if r["file"] is None or upstream_file_for(r["file"]) is None})
    own = {str(p.relative_to(ROOT)) for p in (REPORT_MD, UPSTREAM_JSON)}
    status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True).stdout.splitlines()
    dirty = any(line[3:] not in own for line in status if line.strip())
    meta = {"commit": git(ROOT, "rev-parse", "--short", "HEAD"), "dirty": dirty,
            "date": (started.group(1).replace("T", " ")[:16] + " UTC (start)") if started else
                    datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu_name(), "cpu_count": os.cpu_count(), "seconds": seconds, "unmatched": unmatched}
    cmp = compare(upstream["files"], ours)
    text = render(upstream, cmp, meta)
    a.output.write_text(text)
    head = [line for line in text.splitlines() if line.startswith("**Goal")]
    print(f"[compat_report] wrote {a.output}: {head[0] if head else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

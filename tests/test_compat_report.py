"""tools/compat_report.py: junit parsing, id matching and the counts of the report, on a tiny synthetic
junit file and a synthetic upstream cache (plus consistency checks of the checked-in cache)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compat_report", ROOT / "tools" / "compat_report.py")
cr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cr)

# What pytest 8/9 writes for: a pass, a failure, a setup error, a skip with a reason, an xfail, a class
# test, a test in a split file (test_ops_int8.py), a repr of our classes/dtypes in a parametrize id, and a
# collection error of a module.
OURS_XML = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
 errors="1" failures="1" skipped="2" tests="9" time="12.5">
<testcase classname="compat_tests.test_ops.TestInt8" name="test_vq[dtype=fp16-cpu]" time="0.1"/>
<testcase classname="compat_tests.test_ops.TestInt8" name="test_vq[dtype=fp32-cpu]" time="0.1">
  <failure message="AssertionError: 3 != 4">x = 3
E  AssertionError: 3 != 4</failure></testcase>
<testcase classname="compat_tests.test_ops_int8.TestLLMInt8Ops" name="test_int8_linear_matmul[cpu]" time="0.2">
  <error message="failed on setup with &quot;RuntimeError: boom&quot;">RuntimeError: boom</error></testcase>
<testcase classname="compat_tests.test_ops" name="test_gemv[cpu]" time="0.0">
  <skipped type="pytest.skip" message="CUDA-only: cuda graphs">compat_tests/test_ops.py:10: CUDA-only: cuda graphs</skipped></testcase>
<testcase classname="compat_tests.test_ops" name="test_gemv[meta]" time="0.0">
  <skipped type="pytest.skip" message="Skipped: CUDA-only: cuda graphs">compat_tests/test_ops.py:10: Skipped: CUDA-only: cuda graphs</skipped></testcase>
<testcase classname="compat_tests.test_ops" name="test_blocks[cpu]" time="0.0">
  <skipped type="pytest.xfail" message="known CPU gap" /></testcase>
<testcase classname="compat_tests.test_optim" name="test_lamb[opt=&lt;class 'bitsandbytes_ms.optim.lamb.LAMB'&gt;-mindspore.float32]" time="1"/>
<testcase classname="compat_tests.test_ops" name="test_only_ours[cpu]" time="0.0"/>
<testcase classname="compat_tests" name="test_broken" time="0.0"><error message="collection failure">ImportError</error></testcase>
</testsuite></testsuites>"""

UPSTREAM = {
    "test_ops.py": {"collected": 9, "deselected": ["test_bench[cpu]"], "cases": {
        "TestInt8::test_vq[dtype=fp16-cpu]": {"outcome": "passed"},
        "TestInt8::test_vq[dtype=fp32-cpu]": {"outcome": "passed"},
        "TestInt8::test_vq[dtype=bf16-cpu]": {"outcome": "passed"},   # not collected in ours
        "TestLLMInt8Ops::test_int8_linear_matmul[cpu]": {"outcome": "passed"},
        "test_gemv[cpu]": {"outcome": "passed"},
        "test_gemv[meta]": {"outcome": "skipped", "reason": "meta device"},
        "test_blocks[cpu]": {"outcome": "failed"},
        "test_cuda_only[cpu]": {"outcome": "skipped", "reason": "CUDA is required"},
    }},
    "test_optim.py": {"collected": 1, "deselected": [], "cases": {
        "test_lamb[opt=<class 'bitsandbytes.optim.lamb.LAMB'>-torch.float32]": {"outcome": "passed"},
    }},
}


def test_upstream_file_for_splits_and_unknowns():
    assert cr.upstream_file_for("test_ops.py") == "test_ops.py"
    assert cr.upstream_file_for("compat_tests/test_ops_int8.py") == "test_ops.py"
    assert cr.upstream_file_for("test_autograd_4bit.py") == "test_autograd.py"
    assert cr.upstream_file_for("test_linear4bit.py") == "test_linear4bit.py"
    assert cr.upstream_file_for("test_linear8bitlt.py") == "test_linear8bitlt.py"
    assert cr.upstream_file_for("test_functional_nf4") == "test_functional.py"
    assert cr.upstream_file_for("test_opsx.py") is None  # a prefix must end at "_"
    assert cr.upstream_file_for("test_blockwise.py") is None


def test_normalize_case():
    assert cr.normalize_case("test_lamb[opt=<class 'bitsandbytes_ms.optim.lamb.LAMB'>-mindspore.float32]") == \
        "test_lamb[opt=<class 'bitsandbytes.optim.lamb.LAMB'>-torch.float32]"
    assert cr.normalize_case("test_x[notmindspore.y]") == "test_x[notmindspore.y]"


def test_split_junit_classname():
    assert cr.split_junit_classname("compat_tests.test_ops.TestInt8", "test_vq[a.b-cpu]") == \
        ("test_ops.py", "TestInt8::test_vq[a.b-cpu]")
    assert cr.split_junit_classname("tests.test_functional", "test_x") == ("test_functional.py", "test_x")
    assert cr.split_junit_classname("compat_tests", "test_broken") == (None, "test_broken")


def test_parse_junit_outcomes_and_reasons():
    recs = cr.parse_junit(OURS_XML)
    assert len(recs) == 9
    by = {(r["file"], r["case"]): r for r in recs}
    assert by[("test_ops.py", "TestInt8::test_vq[dtype=fp16-cpu]")]["outcome"] == "passed"
    fail = by[("test_ops.py", "TestInt8::test_vq[dtype=fp32-cpu]")]
    assert (fail["outcome"], fail["message"]) == ("failed", "AssertionError: 3 != 4")
    assert by[("test_ops_int8.py", "TestLLMInt8Ops::test_int8_linear_matmul[cpu]")]["outcome"] == "failed"
    skip = by[("test_ops.py", "test_gemv[cpu]")]
    assert (skip["outcome"], skip["message"]) == ("skipped", "CUDA-only: cuda graphs")
    assert by[("test_ops.py", "test_gemv[meta]")]["message"] == "CUDA-only: cuda graphs"  # "Skipped: " dropped
    xf = by[("test_ops.py", "test_blocks[cpu]")]
    assert (xf["outcome"], xf["message"]) == ("xfailed", "known CPU gap")
    assert by[(None, "test_broken")]["outcome"] == "failed"
    assert by[("test_optim.py", "test_lamb[opt=<class 'bitsandbytes_ms.optim.lamb.LAMB'>-mindspore.float32]")]["time"] == 1.0


def test_merge_keeps_the_worst_outcome():
    recs = [{"file": "test_ops.py", "case": "t[cpu]", "outcome": "passed", "message": "", "time": 0},
            {"file": "test_ops.py", "case": "t[cpu]", "outcome": "failed", "message": "teardown", "time": 0},
            {"file": "test_ops_int8.py", "case": "u[cpu]", "outcome": "skipped", "message": "r", "time": 0},
            {"file": "test_blockwise.py", "case": "v", "outcome": "passed", "message": "", "time": 0}]
    m = cr.merge_outcomes(recs)
    assert set(m) == {("test_ops.py", "t[cpu]"), ("test_ops.py", "u[cpu]")}
    assert m[("test_ops.py", "t[cpu]")]["message"] == "teardown"


def test_compare_counts_and_gaps():
    ours = cr.merge_outcomes(cr.parse_junit(OURS_XML))
    res = cr.compare(UPSTREAM, ours)
    ops = res["test_ops.py"]
    assert ops["upstream"] == {"collected": 8, "deselected": 1, "passed": 5, "failed": 1, "skipped": 2, "xfailed": 0}
    assert ops["ours"] == {"collected": 7, "passed": 2, "failed": 2, "skipped": 2, "xfailed": 1}
    assert ops["our_files"] == ["test_ops.py", "test_ops_int8.py"]
    assert ops["applicable"] == 5          # upstream's CPU passes only
    assert ops["applicable_passed"] == 1   # test_vq fp16; fp32 fails, bf16 missing, matmul errors, gemv skipped
    assert dict(ops["missing"]) == {"TestInt8::test_vq": 1}
    assert {k: len(v) for k, v in ops["not_passing"].items()} == {
        ("TestInt8::test_vq", "failed"): 1, ("TestLLMInt8Ops::test_int8_linear_matmul", "failed"): 1,
        ("test_gemv", "skipped"): 1}
    assert dict(ops["skip_reasons"]) == {"CUDA-only: cuda graphs": 2}
    assert dict(ops["upstream_skip_reasons"]) == {"meta device": 1, "CUDA is required": 1}
    assert dict(ops["extra"]) == {"test_only_ours": 1}
    uo, mine = ops["upstream_bad"]["test_blocks[cpu]"]
    assert uo["outcome"] == "failed" and mine["outcome"] == "xfailed"
    opt = res["test_optim.py"]
    assert (opt["applicable"], opt["applicable_passed"]) == (1, 1)  # matched through the id normalization
    assert res["test_generation.py"]["present"] is False and res["test_generation.py"]["ours"]["collected"] == 0


def test_render_goal_line_and_gap_listing():
    ours = cr.merge_outcomes(cr.parse_junit(OURS_XML))
    up = {"tests_source": {"repository": "r", "commit": "0123456789abcdef", "ref": "HEAD", "version_in_tree": "x",
                           "tag_0.50.2_present": False, "nearest_tag": "0.50.1", "tests_identical_to_nearest_tag": True},
          "versions": {"bitsandbytes": "0.50.2", "torch": "2.13.0+cpu", "python": "3.11"}, "date": "d", "cpu": "c",
          "cpu_count": 2, "pytest_args": "a", "durations_s": {"test_ops.py": 61}, "files": UPSTREAM}
    meta = {"commit": "abc", "dirty": False, "date": "d", "cpu": "c", "cpu_count": 2, "seconds": 125.0,
            "unmatched": ["test_broken"]}
    text = cr.render(up, cr.compare(UPSTREAM, ours), meta)
    assert "Now: 2 / 6 = 33.3% -- NOT met." in text
    assert "- `TestInt8::test_vq`: 1" in text                       # not collected, grouped with a count
    assert "- `test_gemv`: 1 skipped -- CUDA-only: cuda graphs" in text
    assert "  - 2 x CUDA-only: cuda graphs" in text
    assert "2 min 05 s" in text and "1 min 01 s" in text
    assert "identical to tag 0.50.1" in text


def test_chunk_nodes_slices_in_collection_order(monkeypatch):
    monkeypatch.setattr(cr, "CHUNK_CASES", 4)
    ids = ["A::t1[a]", "A::t1[b]", "A::t2[a]", "f[x]", "f[y]", "big[1]", "big[2]", "big[3]", "big[4]"]
    assert cr.chunk_nodes(ids) == [ids[0:4], ids[4:8], ids[8:9]]
    assert cr.chunk_nodes([]) == []


def test_checked_in_upstream_cache_is_consistent():
    path = ROOT / "compat_tests" / "upstream_cpu_results.json"
    data = json.loads(path.read_text())
    assert data["versions"]["bitsandbytes"] == "0.50.2"
    assert set(data["files"]) == set(cr.UPSTREAM_FILES)
    for name, f in data["files"].items():
        assert f["collected"] == len(f["cases"]) + len(f["deselected"]) + len(f["not_measured"]), name
        assert not set(f["cases"]) & set(f["deselected"]), name
        assert not set(f["cases"]) & set(f["not_measured"]), name
        assert bool(data["partial"]) == any(g["not_measured"] for g in data["files"].values())
        assert {c["outcome"] for c in f["cases"].values()} <= {"passed", "failed", "skipped", "xfailed"}, name


def test_every_compat_test_file_maps_to_an_upstream_file():
    files = sorted(p.name for p in (ROOT / "compat_tests").glob("test_*.py"))
    assert files, "no compat_tests files"
    unmapped = [f for f in files if cr.upstream_file_for(f) is None]
    assert unmapped == [], f"add these to FILE_MAP in tools/compat_report.py: {unmapped}"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))

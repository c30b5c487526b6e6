"""The `bnb-ms quantize` main job: a smoke run on the embedded model and its bad-input errors."""

import re
import subprocess
import sys

import pytest

FIELDS = ["layers converted  28", "layers skipped    1: lm_head (full precision, fast native GEMV)", "weight memory", "quantized layers", "perplexity", "top-1 agreement",
          "logit error", "fused decoder", "prefill tok/s", "decode tok/s", "tokens/s", "continuation"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "bitsandbytes_ms", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("mode", ["nf4", "int8"])
def test_quantize_job_reports_every_field(mode, tmp_path):
    r = run("quantize", "--mode", mode, "--max-new-tokens", "4", "--eval-windows", "2", "--save", str(tmp_path / "q"))
    assert r.returncode == 0, r.stderr[-2000:]
    for f in FIELDS:
        assert f in r.stdout, (f, r.stdout)
    fused_line = next(line for line in r.stdout.splitlines() if line.startswith("fused decoder"))
    # nf4 and int8 (Linear8bitLt) layers both take the fused decoder
    assert "on: 2 native calls" in fused_line, fused_line
    assert (tmp_path / "q" / "model.safetensors").exists() and (tmp_path / "q" / "config.json").exists()
    # a quantized checkpoint is not something to quantize again: one line, no traceback
    line = _one_line_error(run("quantize", "--model", str(tmp_path / "q")))
    assert "already quantized" in line


def test_quantize_lm_head_flag(tmp_path):
    """--quantize-lm-head: the output layer is quantized too (the report says so), and the saved checkpoint
    loads back with a quantized lm_head (llm_int8_skip_modules=[] in its quantization config)."""
    r = run("quantize", "--mode", "nf4", "--quantize-lm-head", "--max-new-tokens", "2", "--eval-windows", "1",
            "--save", str(tmp_path / "q"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "layers converted  29" in r.stdout and "layers skipped    0: -" in r.stdout, r.stdout
    assert "lm_head           quantized (nf4)" in r.stdout, r.stdout
    assert "embeddings, norms stay in full precision" in r.stdout
    from safetensors.numpy import load_file

    keys = set(load_file(str(tmp_path / "q" / "model.safetensors")))
    assert {"lm_head.weight", "lm_head.weight.absmax", "lm_head.weight.quant_state.bitsandbytes__nf4"} <= keys
    import json

    assert json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["llm_int8_skip_modules"] == []


def _one_line_error(r):
    assert r.returncode == 2
    # progress bars (cleared with \r) and MindSpore's own log lines are not part of the message
    lines = [ln for ln in re.split(r"[\r\n]+", r.stderr) if ln.strip() and "WARNING" not in ln and "%|" not in ln]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_missing_model_path(tmp_path):
    line = _one_line_error(run("quantize", "--model", str(tmp_path / "nope")))
    assert "no such directory" in line


def test_not_a_causal_lm(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "vocab_size": 10, "hidden_size": 8, '
                                          '"num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8}')
    line = _one_line_error(run("quantize", "--model", str(tmp_path)))
    assert "not a causal language model" in line or "cannot load" in line


def test_unknown_mode():
    line = _one_line_error(run("quantize", "--mode", "int3"))
    assert "--mode" in line and "int8" in line


@pytest.mark.parametrize("args, message", [
    (["--threshold", "-1"], "--threshold must be a finite number"),
    (["--threshold", "nan"], "--threshold must be a finite number"),
    (["--eval-window", "0"], "--eval-window must be at least 2"),
    (["--eval-windows", "0"], "--eval-windows must be at least 1"),
    (["--eval-file", "/nonexistent/eval.txt"], "no such file"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
])
def test_bad_options_fail_in_one_line_before_any_work(args, message):
    line = _one_line_error(run("quantize", *args))
    assert message in line


def test_save_onto_the_model_directory_is_refused():
    from pathlib import Path

    import bitsandbytes_ms

    model_dir = Path(bitsandbytes_ms.__file__).resolve().parent / "default_model"
    line = _one_line_error(run("quantize", "--save", str(model_dir)))
    assert "is the --model directory" in line


def test_save_into_an_existing_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    line = _one_line_error(run("quantize", "--save", str(f)))
    assert "not a directory" in line


def test_diagnostics_report_and_sanity_check():
    r = run()
    assert r.returncode == 0, r.stderr
    for field in ("bitsandbytes_ms   ", "platform          ", "libc ", "related packages  ", "transformers ",
                  "peft ", "accelerate ", "safetensors ", "native library    ", "CPU kernel path   "):
        assert field in r.stdout, field
    assert r.stdout.rstrip().endswith("SUCCESS!")
    # the sanity step's 8-bit Adam on a tensor made from numpy asked MindSpore for a device address it did not have
    # yet, which logs "[ERROR] ANALYZER ... Tensor device address is null" before SUCCESS
    assert "ERROR" not in r.stderr, r.stderr


def test_diagnostics_sanity_failure_exits_1(monkeypatch):
    from bitsandbytes_ms import __main__ as cli

    def broken():
        raise AssertionError("blockwise 8-bit round trip: max error 0.5")

    monkeypatch.setattr(cli, "sanity_check", broken)
    assert cli.diagnostics() == 1


# ---- checkpoints and paths that used to run on random weights or end in a traceback (issue 15 item 10) ----------
@pytest.fixture(scope="module")
def broken_checkpoints(tmp_path_factory):
    import json
    import shutil
    from pathlib import Path

    import numpy as np
    from safetensors.numpy import load_file, save_file

    import bitsandbytes_ms

    src = Path(bitsandbytes_ms.__file__).resolve().parent / "default_model"
    base = tmp_path_factory.mktemp("ckpt")
    tensors = load_file(str(src / "model.safetensors"))
    out = {}

    def clone(name, new_tensors=None):
        d = base / name
        shutil.copytree(src, d)
        if new_tensors is not None:
            save_file(new_tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        out[name] = d
        return d

    t = dict(tensors)
    del t["model.layers.1.mlp.down_proj.weight"]
    clone("missing", t)
    d = clone("more_layers")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] += 1
    (d / "config.json").write_text(json.dumps(cfg))
    clone("int32", {k: v.astype(np.int32) for k, v in tensors.items()})
    t = dict(tensors)
    t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"][:, :-1].copy()
    clone("shape", t)
    d = clone("fewer_layers")  # the last layer's tensors unused: a truncated model ran with exit 0
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] -= 1
    (d / "config.json").write_text(json.dumps(cfg))
    clone("extra", {**tensors, "model.layers.0.mlp.bogus.weight": np.ones((2, 2), np.float32)})
    return out


@pytest.mark.parametrize("name, message", [
    ("missing", "lacks 1 tensor(s) the config needs (model.layers.1.mlp.down_proj.weight)"),
    ("more_layers", "lacks 9 tensor(s) the config needs (model.layers.4."),
    ("int32", "weights of dtype int32; a full-precision"),
    ("shape", "size mismatch for weight: copying a param with shape"),
    ("fewer_layers", "the checkpoint holds 9 tensor(s) the config has no place for (model.layers.3."),
    ("extra", "the checkpoint holds 1 tensor(s) the config has no place for (model.layers.0.mlp.bogus.weight)"),
])
def test_broken_checkpoints_fail_in_one_line(broken_checkpoints, name, message):
    r = run("quantize", "--model", str(broken_checkpoints[name]), "--max-new-tokens", "2", "--eval-windows", "1")
    assert r.returncode == 2
    assert message in _one_line_error(r)


def test_non_utf8_eval_file_and_unwritable_save_fail_before_any_work(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe caf\xe9 " * 100)
    assert "not UTF-8 text" in _one_line_error(run("quantize", "--eval-file", str(bad)))
    assert "cannot write in /sys/kernel" in _one_line_error(run("quantize", "--save", "/sys/kernel/q"))
    assert "no such parent directory" in _one_line_error(run("quantize", "--save", str(tmp_path / "a" / "b")))


def test_failed_save_leaves_the_directory_as_it_was(tmp_path):
    from bitsandbytes_ms.__main__ import _save_atomically

    target = tmp_path / "q"
    target.mkdir()
    (target / "model.safetensors").write_text("old weights")

    def half_write(d):
        (d / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        _save_atomically(target, half_write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]  # no temporary directory left
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors"]
    assert (target / "model.safetensors").read_text() == "old weights"
    def full_write(d):
        from safetensors.numpy import save_file
        import numpy as np

        (d / "config.json").write_text('{"new": 1}')
        save_file({"w": np.zeros(3, np.float32)}, str(d / "model.safetensors"))

    _save_atomically(target, full_write)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]


# ---- non-finite logits (issue 15 item 2: a NaN perplexity was reported with exit 0) ------------------------------
def test_checkpoint_with_nan_weights_fails_in_one_line(tmp_path):
    """A checkpoint whose unquantized forward gives NaN logits has no perplexity to compare: one line, exit 2,
    before quantizing (it used to report `perplexity nan -> 774` and exit 0, LLM.int8() hiding the NaN)."""
    import shutil
    from pathlib import Path

    import numpy as np
    from safetensors.numpy import load_file, save_file

    import bitsandbytes_ms

    src = Path(bitsandbytes_ms.__file__).resolve().parent / "default_model"
    d = tmp_path / "nan"
    shutil.copytree(src, d)
    t = load_file(str(d / "model.safetensors"))
    t["model.layers.1.mlp.down_proj.weight"][3, 5] = np.nan
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    r = run("quantize", "--model", str(d), "--max-new-tokens", "2", "--eval-windows", "1")
    line = _one_line_error(r)
    assert "the unquantized model computes NaN/inf logits at 127 of 127 held-out positions" in line, line
    assert "perplexity" not in r.stdout


def test_nan_logits_of_the_quantized_model_exit_1_without_saving(tmp_path, monkeypatch, capsys):
    """When only the quantized model's logits are not finite, the report says so on the perplexity line, the
    job ends with exit 1 and one error line, and --save writes nothing."""
    import numpy as np

    from bitsandbytes_ms import __main__ as cli
    from bitsandbytes_ms.integrations import evaluate as ev

    real = ev.run_windows
    calls = []

    def second_call_nan(model, windows, **kw):
        stats = real(model, windows, **kw)
        calls.append(1)
        if len(calls) == 2:  # the quantized model's evaluation: two positions' logits NaN
            stats.logits[0][[0, 4], 1] = np.nan
            stats.nonfinite_positions, stats.nll_sum = 2, float("nan")
        return stats

    monkeypatch.setattr(ev, "run_windows", second_call_nan)
    rc = cli.main(["quantize", "--mode", "nf4", "--max-new-tokens", "2", "--eval-windows", "1",
                   "--save", str(tmp_path / "q")])
    out, err = capsys.readouterr()
    assert rc == 1 and len(calls) == 2
    line = next(ln for ln in out.splitlines() if ln.startswith("perplexity"))
    assert " -> nan (NaN/inf logits at 2 of 127 held-out positions of the quantized model)" in line, line
    assert "error: the quantized model computes NaN/inf logits at 2 of 127 held-out positions" in err
    assert "--save skipped" in err and not (tmp_path / "q").exists()


def test_perplexity_of_nonfinite_and_overflowing_nll():
    import math

    from bitsandbytes_ms.integrations.evaluate import LogitStats

    assert math.isnan(LogitStats(nll_sum=float("nan"), n_tokens=3).perplexity)
    assert LogitStats(nll_sum=3 * 800.0, n_tokens=3).perplexity == float("inf")  # exp(800): no OverflowError
    assert abs(LogitStats(nll_sum=3 * 2.0, n_tokens=3).perplexity - 7.38905609893065) < 1e-12


def test_no_fuse_keeps_the_unfused_forward(monkeypatch, capsys):
    """--no-fuse: a model that would fuse by itself on its first forward (transformers' path) stays unfused."""
    from bitsandbytes_ms import __main__ as cli
    from bitsandbytes_ms.integrations import fused as FU

    n0 = FU.stats["fused_forwards"]
    rc = cli.main(["quantize", "--mode", "nf4", "--max-new-tokens", "2", "--eval-windows", "1", "--no-fuse"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "fused decoder     off (--no-fuse)" in out
    assert FU.stats["fused_forwards"] == n0
    n0 = FU.stats["fused_forwards"]
    assert cli.main(["quantize", "--mode", "nf4", "--max-new-tokens", "2", "--eval-windows", "1"]) == 0
    assert FU.stats["fused_forwards"] > n0  # the control: without the flag the forwards are fused

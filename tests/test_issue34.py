"""Issue 34: no silent wrong result across calls, no success reported for a failed save, NaN gradients not
swallowed, out-buffers filled with what their name says. Each test failed before its fix."""

import os
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms import _hostcall as H
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import functional as F

DT = {"fp16": ms.float16, "bf16": ms.bfloat16, "fp32": ms.float32}
TOL = {"fp16": 2e-2, "bf16": 6e-2, "fp32": 1e-4}  # of the output's scale (|x| |W| summed, + |bias|)


# ---- a. stale state across calls ------------------------------------------------------------------
def _nf4_layer(rng, K, N, compute_dtype=None, bias_dtype=ms.float32):
    m = bnb.nn.LinearNF4(K, N, bias=True, compute_dtype=compute_dtype)
    m.weight = bnb.nn.Params4bit(torch.tensor(rng.randn(N, K).astype(np.float32) * 0.1), requires_grad=False,
                                 quant_type="nf4")
    m.bias = torch.nn.Parameter(torch.tensor(rng.randn(N).astype(np.float32)).to(bias_dtype), requires_grad=False)
    m = m.to("cpu").eval()
    return m


def _check_call(m, x, name):
    """m(x) against x (as given) @ dequantize_4bit(W).T + the bias the layer holds after the call (upstream
    casts the bias parameter itself to the activations' dtype), in float64."""
    y = m(x)
    assert y.dtype == x.dtype, name
    W = F.dequantize_4bit(m.weight, m.weight.quant_state).asnumpy().astype(np.float64)
    xr = x.astype(ms.float32).asnumpy().astype(np.float64)
    b = m.bias.astype(ms.float32).asnumpy().astype(np.float64)
    ref = xr @ W.T + b
    scale = np.abs(xr) @ np.abs(W).T + np.abs(b)
    err = np.abs(y.astype(ms.float32).asnumpy() - ref) / scale
    dt = {ms.float16: "fp16", ms.bfloat16: "bf16", ms.float32: "fp32"}[x.dtype]
    assert err.max() < TOL[dt], f"{name}: relative error {err.max():.3g}"


def test_linear_nf4_dtype_sequence_issue_case():
    # the reported case: default compute dtype, fp32 bias, inputs fp16, fp16, bf16, fp32, fp16
    rng = np.random.RandomState(0)
    m = _nf4_layer(rng, 64, 48)
    for i, name in enumerate(["fp16", "fp16", "bf16", "fp32", "fp16", "bf16", "fp32", "fp16"]):
        x = ms.Tensor(rng.randn(3, 64).astype(np.float32)).astype(DT[name])
        _check_call(m, x, f"call {i} ({name})")


@pytest.mark.parametrize("seed", range(6))
def test_linear4bit_random_dtype_sequences(seed):
    # any order of input dtypes, rows 1 (gemv) or several, default or set compute dtype
    rng = np.random.RandomState(100 + seed)
    cd = [None, ms.float32, ms.bfloat16, ms.float16][seed % 4]
    m = _nf4_layer(rng, 128, 40, compute_dtype=cd, bias_dtype=[ms.float32, ms.float16, ms.bfloat16][seed % 3])
    for i in range(10):
        name = ["fp16", "bf16", "fp32"][rng.randint(3)]
        x = ms.Tensor(rng.randn(rng.choice([1, 4]), 128).astype(np.float32)).astype(DT[name])
        y = m(x)
        # reference: the unfused formula in the compute dtype the layer uses for this input
        cdt = m.compute_dtype or x.dtype
        W = F.dequantize_4bit(m.weight, m.weight.quant_state).asnumpy().astype(np.float64)
        xr = x.astype(cdt).astype(ms.float32).asnumpy().astype(np.float64)
        b = m.bias.astype(ms.float32).asnumpy().astype(np.float64)
        ref = xr @ W.T + b
        scale = np.abs(xr) @ np.abs(W).T + np.abs(b)
        worst = "bf16" if ms.bfloat16 in (cdt, x.dtype) else ("fp16" if ms.float16 in (cdt, x.dtype) else "fp32")
        err = np.abs(y.astype(ms.float32).asnumpy() - ref) / scale
        assert y.dtype == x.dtype
        assert err.max() < TOL[worst], f"call {i}: {name} input, compute {cdt}: relative error {err.max():.3g}"


def test_device_view_follows_dtype_at_the_same_address():
    # a parameter cast in place can land in the buffer its old data had: the host view must follow the dtype
    v = H.DeviceView()
    p = torch.nn.Parameter(torch.tensor(np.arange(8, dtype=np.float32)), requires_grad=False)
    a = v.get(p)
    assert a.dtype == np.float32
    for dt, npdt in ((torch.float16, np.float16), (torch.float32, np.float32), (torch.float16, np.float16)):
        p.data = p.data.to(dt)
        a = v.get(p)
        if a is None:
            continue
        assert a.dtype == npdt and a.shape == (8,)
        np.testing.assert_array_equal(a.astype(np.float32), np.arange(8, dtype=np.float32))


def test_linear_4bit_functional_bias_recast_between_calls():
    # linear_4bit's lean call with the same bias object whose dtype changed (same address or not)
    rng = np.random.RandomState(1)
    W = torch.tensor(rng.randn(32, 64).astype(np.float32) * 0.1)
    packed, qs = F.quantize_4bit(W, quant_type="nf4")
    Wd = F.dequantize_4bit(packed, qs).asnumpy().astype(np.float64)
    bias = torch.nn.Parameter(torch.tensor(rng.randn(32).astype(np.float32)), requires_grad=False)
    # the bias as Linear4bit leaves it after inputs fp16, bf16, fp32 (the call in between: A in its dtype)
    for i, dt in enumerate([torch.float16, torch.float16, torch.bfloat16, torch.float32, torch.float32] * 2):
        x = torch.tensor(rng.randn(2, 64).astype(np.float32)).to(torch.float16)
        F.linear_4bit(x.to(bias.dtype), packed, qs, bias)
        bias.data = bias.data.to(dt)
        y = F.linear_4bit(x, packed, qs, bias).astype(ms.float32).asnumpy()
        ref = x.astype(ms.float32).asnumpy() @ Wd.T + bias.astype(ms.float32).asnumpy()
        np.testing.assert_allclose(y, ref, rtol=2e-2, atol=2e-2, err_msg=f"call {i}, bias {dt}")


# ---- b. a save that reports success without the weights ------------------------------------------------------
def _old_target(tmp_path):
    target = tmp_path / "q"
    target.mkdir()
    (target / "config.json").write_text('{"old": 1}')
    (target / "model.safetensors").write_bytes(b"old weights")
    return target


def _unchanged(tmp_path, target):
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]  # no temporary directory left behind
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == b"old weights"
    assert (target / "config.json").read_text() == '{"old": 1}'


def _truncated_write(model, save_dir, **kw):  # a writer that fails without raising (disk full, ...)
    _REAL_SAVE(model, save_dir, **kw)
    w = Path(save_dir) / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])


def _no_write(model, save_dir, **kw):  # the config but no weights
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(save_dir))


def _raising_write(model, save_dir, **kw):  # safetensors' own error type is not an OSError
    raise RuntimeError("Error while serializing: IoError(No space left on device)")


from bitsandbytes_ms.integrations.loading import save_quantized as _REAL_SAVE  # noqa: E402


@pytest.mark.parametrize("writer", [_truncated_write, _no_write, _raising_write])
def test_cli_save_whose_weights_write_fails_exits_nonzero_and_keeps_target(writer, tmp_path, monkeypatch, capsys):
    from bitsandbytes_ms import __main__ as cli
    from bitsandbytes_ms.integrations import loading

    target = _old_target(tmp_path)
    monkeypatch.setattr(loading, "save_quantized", writer)  # the CLI's streamed writer
    rc = cli.main(["quantize", "--mode", "nf4", "--max-new-tokens", "1", "--eval-windows", "1", "--save", str(target)])
    out, err = capsys.readouterr()
    assert rc == 2, (out[-500:], err[-500:])
    assert "saved" not in out
    lines = [ln for ln in err.splitlines() if "bnb-ms" in ln or "Traceback" in ln]  # (stderr also has tqdm bars)
    assert len(lines) == 1 and lines[0].startswith("bnb-ms quantize: error: --save ") and "saving failed" in lines[0]
    _unchanged(tmp_path, target)


@pytest.mark.parametrize("damage", ["missing", "truncated", "no_config", "missing_shard"])
def test_save_atomically_checks_what_was_written(damage, tmp_path):
    import json

    from safetensors.numpy import save_file

    from bitsandbytes_ms.__main__ import _save_atomically

    target = _old_target(tmp_path)

    def write(d):
        if damage != "no_config":
            (d / "config.json").write_text("{}")
        if damage == "missing_shard":
            save_file({"a": np.ones(4, np.float32)}, str(d / "model-00001-of-00002.safetensors"))
            (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
                "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
            return
        if damage == "missing":
            return
        save_file({"a": np.ones(64, np.float32)}, str(d / "model.safetensors"))
        if damage == "truncated":
            raw = (d / "model.safetensors").read_bytes()
            (d / "model.safetensors").write_bytes(raw[:-10])

    with pytest.raises(OSError):
        _save_atomically(target, write)
    _unchanged(tmp_path, target)


# ---- c. NaN gradients are not swallowed ---------------------------------------------------------------------
OPT8 = [("AdamW8bit", {}), ("Adam8bit", {}), ("Lion8bit", {}), ("SGD8bit", {"momentum": 0.9}),
        ("RMSprop8bit", {}), ("Adagrad8bit", {}), ("AdEMAMix8bit", {})]


@pytest.mark.parametrize("name,kw", OPT8)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_8bit_nan_gradient_reaches_its_parameter(name, kw, dtype):
    # upstream 0.50.2's CPU rule computes p from the NaN gradient: p is NaN there; every other element as the
    # reference, over several steps (the NaN element's states are reset so its block's absmax stays finite)
    rng = np.random.RandomState(3)
    dt = getattr(ms, dtype)
    p = torch.nn.Parameter(torch.tensor(rng.randn(3, 300).astype(np.float32)).to(dt))  # 4 blocks, a partial one
    opt = getattr(bnb.optim, name)([p], lr=1e-2, min_8bit_size=0, **kw)
    bad = [5, 256 + 17, 899]
    gs = [rng.randn(3, 300).astype(np.float32) for _ in range(3)]
    for g in gs:
        g.reshape(-1)[bad] = np.nan
        bad = bad[:1]  # later steps: one NaN
    rp = p.astype(ms.float32).asnumpy().reshape(-1).copy()
    for step, g in enumerate(gs, 1):
        gt = torch.tensor(g).to(dt)
        opt.step(grads=[gt])
        st, grp = opt.state[p], opt.param_groups[0]
        b = grp["betas"] if "betas" in grp else (grp.get("momentum", 0.0), 0.0)
        two = "state2" in st
        if step == 1:
            s1 = np.zeros(st["state1"].shape, np.uint8)
            a1 = np.zeros(st["absmax1"].shape, np.float32)
            s2 = np.zeros(st["state2"].shape, np.uint8) if two else None
            a2 = np.zeros(st["absmax2"].shape, np.float32) if two else None
        beta1 = b[0]
        with np.errstate(invalid="ignore", over="ignore"):
            rp, s1, s2, a1, a2 = R.optimizer_update_8bit_blockwise(
                opt.optimizer_name, gt.astype(ms.float32).asnumpy().reshape(-1), rp, s1, s2, beta1,
                b[1] if len(b) > 1 else 0.0, b[2] if len(b) > 2 else 0.0, grp.get("alpha", 0.0) if name ==
                "AdEMAMix8bit" else 0.0, grp["eps"], step, grp["lr"], st["qmap1"].asnumpy(),
                st["qmap2"].asnumpy() if two else None, a1, a2, grp["weight_decay"], p_dtype=dtype)
            rp = rp.astype(np.float32)
        got = p.astype(ms.float32).asnumpy().reshape(-1)
        assert np.isnan(got[5]), f"step {step}: a NaN gradient left parameter 5 finite ({got[5]})"
        if step == 1:
            assert np.isnan(got[[256 + 17, 899]]).all()
        np.testing.assert_array_equal(got, rp, err_msg=f"step {step}")
        assert np.isfinite(st["absmax1"].asnumpy()).all()
        assert np.isfinite(np.delete(got, [5, 256 + 17, 899])).all()


# ---- d. out-buffers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocksize", [64, 256])
def test_quantize_blockwise_nested_absmax_buffer_gets_the_block_absmax(blocksize):
    rng = np.random.RandomState(4)
    x = rng.randn(7, 100).astype(np.float32) * 3
    nb = -(-x.size // blocksize)
    buf = F.empty((nb,), ms.float32)
    q, st = F.quantize_blockwise(ms.Tensor(x), absmax=buf, blocksize=blocksize, nested=True)
    _, want = R.quantize_blockwise(x.reshape(-1), R.dynamic_map() if hasattr(R, "dynamic_map") else
                                   F.create_dynamic_map().asnumpy(), blocksize)
    np.testing.assert_array_equal(buf.asnumpy(), want)  # the block absmax, not the nested codes
    assert st.nested and st.absmax.dtype == ms.uint8  # the state stays a valid nested state
    back = F.dequantize_blockwise(q, st).asnumpy()
    plain = F.dequantize_blockwise(*F.quantize_blockwise(ms.Tensor(x), blocksize=blocksize, nested=True)).asnumpy()
    np.testing.assert_array_equal(back, plain)


@pytest.mark.parametrize("out_dtype", [ms.float16, ms.int32, ms.float64])
def test_bnb_style_call_rejects_output_buffer_of_wrong_dtype(out_dtype):
    from bitsandbytes_ms.cextension import get_ptr, lib
    import ctypes as ct

    A = ms.Tensor(np.random.RandomState(5).randn(512).astype(np.float32))
    code = F.create_dynamic_map()
    absmax = F.empty((2,), ms.float32)
    out = ms.Tensor(np.zeros(512, np.uint8))
    bad_absmax = ms.Tensor(np.zeros(2, np.float32)).astype(out_dtype)
    with pytest.raises(TypeError, match=r"output `absmax` must have dtype mindspore.float32; got " + str(out_dtype)):
        lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(A), get_ptr(bad_absmax), get_ptr(out), ct.c_int32(256),
                                     ct.c_int(512))
    assert not out.asnumpy().any()  # nothing written
    with pytest.raises(ValueError, match=r"output `out` must have 512 elements"):
        lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(A), get_ptr(absmax), get_ptr(ms.Tensor(
            np.zeros(300, np.uint8))), ct.c_int32(256), ct.c_int(512))

"""4-bit (NF4/FP4): native kernels vs numpy reference and upstream bitsandbytes 0.50.2 fixtures,
gemv_4bit, matmul_4bit (forward + gradients), Params4bit/Linear4bit, bad inputs."""

import copy
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import mindspore as ms

import bitsandbytes_ms as bnb
import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms._ops import tag as tag_device
from upstream_vectors import bits, load, to_ms

DTYPES = [ms.float32, ms.float16, ms.bfloat16]
DNAME = {ms.float32: "float32", ms.float16: "float16", ms.bfloat16: "bfloat16"}
CASES = load("fourbit")


def f32(t):
    tag_device(t)  # ms.grad outputs carry no mindtorch device tag once mindnlp is imported
    return (t.astype(ms.float32) if t.dtype == ms.bfloat16 else t).asnumpy().astype(np.float32)


def rnd(shape, dtype, seed=0, scale=1.0):
    x = (np.random.RandomState(seed).randn(*shape) * scale).astype(np.float32)
    return ms.Tensor(x).astype(dtype)


# ---- upstream fixtures (bit-exact) ------------------------------------------------------------
Q_CASES = sorted(k for k, (c, a) in CASES.items() if c.get("kind") == "quantize_4bit" and "dequant" in a)


@pytest.mark.parametrize("name", Q_CASES)
def test_quantize_4bit_matches_upstream(name):
    case, arr = CASES[name]
    A = to_ms(CASES[case["input"]][1]["A"])
    q, state = F.quantize_4bit(A, blocksize=case["blocksize"], quant_type=case["quant_type"],
                               compress_statistics=case["compress_statistics"])
    assert q.shape == tuple(case["packed_shape"])
    np.testing.assert_array_equal(q.asnumpy(), arr["packed"])
    np.testing.assert_array_equal(bits(state.absmax.asnumpy()), bits(arr["absmax"]))
    assert state.nested == case["compress_statistics"]
    if state.nested:
        np.testing.assert_array_equal(bits(state.state2.absmax.asnumpy()), bits(arr["nested_absmax"]))
        np.testing.assert_array_equal(state.state2.code.asnumpy(), arr["nested_code"])
        assert bits(state.offset.asnumpy()) == bits(arr["offset"])
        assert state.state2.blocksize == 256
    dq = F.dequantize_4bit(q, state)
    assert dq.dtype == A.dtype and tuple(dq.shape) == tuple(case["shape"])
    ref = arr["dequant"].astype(np.float32).reshape(dq.shape)  # upstream CPU gives (1, n) for 1-D shapes
    if case["shape"][-1] % 2:  # upstream's torch fallback: FP4 code 8 -> +0.0 (native kernel: -0.0)
        np.testing.assert_array_equal(f32(dq), ref)
    else:
        np.testing.assert_array_equal(bits(f32(dq)), bits(ref))


@pytest.mark.parametrize("name", ["asdict_q4_nf4_f16_bs64_64x64_cs", "asdict_q4_fp4_bf16_bs64_64x64"])
def test_quant_state_as_dict_matches_upstream(name):
    case, arr = CASES[name]
    src, _ = CASES[case["source"]]
    A = to_ms(CASES[src["input"]][1]["A"])
    _, state = F.quantize_4bit(A, blocksize=src["blocksize"], quant_type=src["quant_type"],
                               compress_statistics=src["compress_statistics"])
    d = state.as_dict(packed=True)
    assert list(d.keys()) == case["keys"]
    for k, field in case["key_to_field"].items():
        np.testing.assert_array_equal(d[k].asnumpy(), arr[field], err_msg=k)
    back = F.QuantState.from_dict({"weight." + k: v for k, v in d.items()})
    assert back == state
    q, _ = F.quantize_4bit(A, blocksize=src["blocksize"], quant_type=src["quant_type"],
                           compress_statistics=src["compress_statistics"])
    np.testing.assert_array_equal(bits(f32(F.dequantize_4bit(q, back))), bits(f32(F.dequantize_4bit(q, state))))


GEMV_CASES = sorted(k for k, (c, a) in CASES.items() if c.get("kind") == "gemv_4bit")


@pytest.mark.parametrize("name", GEMV_CASES)
def test_gemv_and_matmul_4bit_match_upstream(name):
    case, arr = CASES[name]
    qc, qa = CASES[case["quant"]]
    B = CASES[qc["input"]][1]["B"].astype(np.float32)
    q, state = F.quantize_4bit(ms.Tensor(B), blocksize=64, quant_type=qc["quant_type"],
                               compress_statistics=qc["compress_statistics"])
    np.testing.assert_array_equal(q.asnumpy(), qa["packed"])
    A = to_ms(arr["A"])
    tol = {"f32": 1e-5, "f16": 2e-2, "bf16": 1e-1}[case["dtype"]]
    scale = np.abs(arr["gemv"].astype(np.float32)).max()
    g = F.gemv_4bit(A, q, state=state)
    assert g.dtype == A.dtype and g.shape == arr["gemv"].shape
    np.testing.assert_allclose(f32(g), arr["gemv"].astype(np.float32), atol=tol * scale, rtol=0)
    m = bnb.matmul_4bit(A, q.t(), quant_state=state)
    np.testing.assert_allclose(f32(m), arr["matmul"].astype(np.float32), atol=tol * scale, rtol=0)


# ---- numpy reference on random shapes ---------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3000), bs=st.sampled_from(F.FOURBIT_BLOCKSIZES), qt=st.sampled_from(["nf4", "fp4"]),
       dt=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_quantize_dequantize_vs_reference(n, bs, qt, dt, seed):
    A = rnd((n,), dt, seed, scale=3.0)
    q, state = F.quantize_4bit(A, blocksize=bs, quant_type=qt)
    rq, ra = R.quantize_4bit(f32(A), F.get_4bit_type(qt).asnumpy(), bs)
    np.testing.assert_array_equal(q.asnumpy(), rq)
    np.testing.assert_array_equal(bits(state.absmax.asnumpy()), bits(ra))
    dq = F.dequantize_4bit(q, state)
    ref = R.dequantize_4bit(rq, ra, F.get_4bit_type(qt).asnumpy(), bs, n, DNAME[dt], fp4=qt == "fp4")
    np.testing.assert_array_equal(bits(np.asarray(dq.asnumpy() if dt != ms.bfloat16 else f32(dq))),
                                  bits(ref if dt != ms.bfloat16 else ref.astype(np.float32)))


@settings(max_examples=20, deadline=None)
@given(N=st.integers(1, 70), K=st.integers(1, 300), bs=st.sampled_from([32, 64, 128, 256]),
       qt=st.sampled_from(["nf4", "fp4"]), dt=st.sampled_from(DTYPES), nested=st.booleans(), seed=st.integers(0, 999))
def test_gemv_vs_reference_any_k(N, K, bs, qt, dt, nested, seed):
    W = rnd((N, K), ms.float32, seed)
    q, state = F.quantize_4bit(W, blocksize=bs, quant_type=qt, compress_statistics=nested)
    A = rnd((1, K), dt, seed + 1)
    out = F.gemv_4bit(A, q, state=state)
    ref = R.gemv_4bit(f32(A), q.asnumpy(), F._absmax_4bit(state).asnumpy(), state.code.asnumpy(), bs, N)
    tol = {ms.float32: 1e-5, ms.float16: 1e-3, ms.bfloat16: 8e-3}[dt]
    np.testing.assert_allclose(f32(out), ref, atol=tol * (np.abs(ref).max() + 1), rtol=tol)


@pytest.mark.parametrize("bs", F.FOURBIT_BLOCKSIZES)
@pytest.mark.parametrize("qt", ["nf4", "fp4"])
def test_shape_7_by_blocksize_minus_1(bs, qt):
    A = rnd((7, bs - 1), ms.float16, bs)
    q, state = F.quantize_4bit(A, blocksize=bs, quant_type=qt, compress_statistics=True)
    assert q.shape == ((7 * (bs - 1) + 1) // 2, 1)
    dq = F.dequantize_4bit(q, state)
    assert dq.shape == (7, bs - 1) and dq.dtype == ms.float16
    err = np.abs(f32(dq) - f32(A)).mean() / np.abs(f32(A)).mean()
    assert err < (0.14 if qt == "nf4" else 0.20)


def test_errors_match_upstream_table():
    """Mean abs / rel error of a 1024x1024 randn round trip, as upstream's test_4bit_quant (bs 64)."""
    A = rnd((1024, 1024), ms.float32, 3)
    for qt, abs_max, rel_max in (("nf4", 0.0759 + 0.0015, 0.2033 + 0.003), ("fp4", 0.0961 + 0.0015, 0.260125 + 0.003)):
        q, state = F.quantize_4bit(A, blocksize=64, quant_type=qt)
        d = np.abs(f32(F.dequantize_4bit(q, state)) - f32(A))
        assert d.mean() < abs_max
        assert (d / (np.abs(f32(A)) + 1e-8)).mean() < rel_max * 1.01


def test_3d_noncontiguous_out_and_storage():
    A = rnd((3, 5, 66), ms.float32, 1)
    q, state = F.quantize_nf4(A, blocksize=32)
    dq = F.dequantize_nf4(q, state)
    assert dq.shape == (3, 5, 66)
    At = rnd((40, 30), ms.float32, 2).T  # non-contiguous
    q1, s1 = F.quantize_4bit(At, quant_type="nf4")
    q2, s2 = F.quantize_4bit(ms.Tensor(np.ascontiguousarray(f32(At))), quant_type="nf4")
    np.testing.assert_array_equal(q1.asnumpy(), q2.asnumpy())
    out = ms.Tensor(np.zeros(q2.shape, np.uint8))
    absmax = ms.Tensor(np.zeros(s2.absmax.shape, np.float32))
    r, s3 = F.quantize_4bit(At, absmax=absmax, out=out, quant_type="nf4")
    assert r is out and s3.absmax is absmax
    np.testing.assert_array_equal(out.asnumpy(), q2.asnumpy())
    np.testing.assert_array_equal(absmax.asnumpy(), s2.absmax.asnumpy())
    o = ms.Tensor(np.zeros((30, 40), np.float32))
    assert F.dequantize_4bit(q2, s2, out=o) is o
    np.testing.assert_array_equal(o.asnumpy(), F.dequantize_4bit(q2, s2).asnumpy())
    # without a quant_state: absmax + out
    o2 = ms.Tensor(np.zeros((30, 40), np.float32))
    F.dequantize_4bit(q2, absmax=s2.absmax, out=o2, quant_type="nf4")
    np.testing.assert_array_equal(o2.asnumpy(), o.asnumpy())
    # quant_storage reinterprets the same bytes
    qs, ss = F.quantize_4bit(At, quant_type="nf4", quant_storage=ms.float32)
    assert qs.dtype == ms.float32 and qs.shape == (150, 1)
    np.testing.assert_array_equal(F.dequantize_4bit(qs, ss).asnumpy(), o.asnumpy())


def test_sliced_weight_gemv():
    W = rnd((64, 128), ms.float32, 5)
    Ws = ms.Tensor(f32(W)[::2])  # every other row
    q, state = F.quantize_4bit(Ws, quant_type="fp4", compress_statistics=True)
    A = rnd((1, 1, 128), ms.float32, 6)
    out = F.gemv_4bit(A, q, state=state)
    assert out.shape == (1, 1, 32)
    ref = f32(A).reshape(1, 128) @ f32(F.dequantize_4bit(q, state)).T
    np.testing.assert_allclose(f32(out).reshape(1, 32), ref, rtol=1e-5, atol=1e-5)
    o = ms.Tensor(np.zeros((1, 1, 32), np.float32))
    assert F.gemv_4bit(A, q, out=o, state=state) is o


def test_zero_size_and_zero_blocks():
    q, s = F.quantize_4bit(ms.Tensor(np.zeros((0, 4), np.float32)))
    assert q.shape == (0, 1) and F.dequantize_4bit(q, s).shape == (0, 4)
    z = ms.Tensor(np.zeros(100, np.float32))
    q, s = F.quantize_4bit(z, blocksize=64, quant_type="nf4")
    assert s.absmax.asnumpy()[0] == 0 and s.absmax.asnumpy()[1] == np.float32(1e-38)  # upstream's partial-block clamp
    assert np.all(F.dequantize_4bit(q, s).asnumpy() == 0)


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_simd_levels_agree_4bit(level):
    code = (
        "import mindspore as ms, numpy as np; ms.set_device('CPU');"
        "import bitsandbytes_ms.functional as F, bitsandbytes_ms.cextension as c;"
        "r=np.random.RandomState(3); outs=[];"
        "W=ms.Tensor(r.randn(37, 518).astype(np.float32));"
        "q,s=F.quantize_4bit(W, blocksize=64, quant_type='nf4', compress_statistics=True); outs.append(q.asnumpy().tobytes());"
        "[outs.append(F.dequantize_4bit(q, F.QuantState(s.absmax, shape=s.shape, code=s.code, blocksize=64, quant_type='nf4', dtype=dt, offset=s.offset, state2=s.state2)).astype(ms.float32).asnumpy().tobytes()) for dt in (ms.float32, ms.float16, ms.bfloat16)];"
        "[outs.append(F.gemv_4bit(ms.Tensor(r.randn(1, 518).astype(np.float32)).astype(dt), q, state=s).astype(ms.float32).asnumpy().tobytes()) for dt in (ms.float32, ms.float16, ms.bfloat16)];"
        "W2=ms.Tensor(r.randn(9, 77).astype(np.float32)); q2,s2=F.quantize_4bit(W2, blocksize=32);"
        "outs.append(F.gemv_4bit(ms.Tensor(r.randn(1, 77).astype(np.float32)), q2, state=s2).asnumpy().tobytes());"
        "import hashlib,sys; sys.stdout.write(c.simd_level()+' '+hashlib.sha256(b''.join(outs)).hexdigest())"
    )

    def run(env_level):
        env = dict(os.environ)
        env.pop("BNB_MS_SIMD", None)
        if env_level:
            env["BNB_MS_SIMD"] = env_level
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return r.stdout.split()

    lvl, digest = run(level)
    assert lvl == level or (level == "avx2" and lvl == "scalar")
    assert digest == run(None)[1]


# ---- matmul_4bit and gradients ----------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("dt", DTYPES)
def test_matmul_4bit_forward_and_grad(rows, dt):
    W = rnd((24, 40), ms.float32, 7)
    q, state = F.quantize_4bit(W, quant_type="nf4", compress_statistics=True)
    Wd = f32(F.dequantize_4bit(q, state))
    A = rnd((rows, 40), dt, 8)
    b = rnd((24,), dt, 9)
    out = bnb.matmul_4bit(A, q.t(), state, bias=b)
    assert out.dtype == dt and out.shape == (rows, 24)
    ref = f32(A) @ Wd.T + f32(b)
    tol = {ms.float32: 1e-5, ms.float16: 5e-3, ms.bfloat16: 3e-2}[dt]
    np.testing.assert_allclose(f32(out), ref, atol=tol * np.abs(ref).max(), rtol=0)
    gA, gb = ms.grad(lambda A, b: bnb.matmul_4bit(A, q.t(), state, bias=b).astype(ms.float32).sum(),
                     grad_position=(0, 1))(A, b)
    assert gA.dtype == dt and gb.dtype == dt
    np.testing.assert_allclose(f32(gA), np.ones((rows, 24)) @ Wd, atol=tol * 10, rtol=tol)
    np.testing.assert_allclose(f32(gb), np.full(24, rows), rtol=tol)


def test_matmul_4bit_errors():
    W = rnd((8, 16), ms.float32)
    q, state = F.quantize_4bit(W)
    with pytest.raises(ValueError, match="quant_state is required"):
        bnb.matmul_4bit(rnd((1, 16), ms.float32), q, None)
    with pytest.raises(ValueError, match="last dimension 16"):
        bnb.matmul_4bit(rnd((1, 12), ms.float32), q, state)


# ---- bad inputs ---------------------------------------------------------------------------------
def test_bad_inputs():
    A = rnd((4, 64), ms.float32)
    with pytest.raises(ValueError, match="quantize_4bit: `blocksize`"):
        F.quantize_4bit(A, blocksize=16)
    with pytest.raises(ValueError, match="quant_type"):
        F.quantize_4bit(A, quant_type="int4")
    with pytest.raises(ValueError, match="`A` must have dtype"):
        F.quantize_4bit(ms.Tensor(np.zeros(4, np.int32)))
    with pytest.raises(TypeError, match="`A` must be a mindspore.Tensor"):
        F.quantize_4bit(np.zeros(4, np.float32))
    q, s = F.quantize_4bit(A)
    with pytest.raises(ValueError, match="requires both absmax and out"):
        F.dequantize_4bit(q)
    with pytest.raises(ValueError, match="`out` must have shape"):
        F.dequantize_4bit(q, s, out=ms.Tensor(np.zeros((3, 3), np.float32)))
    with pytest.raises(ValueError, match="`out` must have shape"):
        F.quantize_4bit(A, out=ms.Tensor(np.zeros((3, 1), np.uint8)))
    with pytest.raises(ValueError, match="state cannot be None"):
        F.gemv_4bit(rnd((1, 64), ms.float32), q)
    with pytest.raises(ValueError, match="last dimension 64"):
        F.gemv_4bit(rnd((1, 60), ms.float32), q, state=s)
    with pytest.raises(ValueError, match="holds"):
        F.dequantize_4bit(q[:10], s)


# ---- nn ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch():
    import mindnlp  # noqa: F401
    import torch as t
    return t


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("compress_statistics", [True, False])
def test_linear4bit_roundtrip(torch, quant_type, compress_statistics):
    import bitsandbytes_ms.nn as bnn

    layer = bnn.Linear4bit(64, 32, bias=True, compress_statistics=compress_statistics, quant_type=quant_type)
    w_fp = f32(layer.weight)
    layer = layer.to("cpu")
    assert isinstance(layer.weight, bnn.Params4bit) and layer.weight.bnb_quantized
    assert layer.weight.shape == (1024, 1) and layer.weight.dtype == ms.uint8
    packed = layer.weight.asnumpy().copy()
    layer.to("cpu")  # second .to keeps the packed data
    layer.weight.quantize()
    np.testing.assert_array_equal(layer.weight.asnumpy(), packed)
    x = torch.tensor(np.random.RandomState(1).randn(3, 64).astype(np.float32))
    y = layer(x)
    wd = f32(F.dequantize_4bit(layer.weight, layer.weight.quant_state))
    assert np.abs(wd - w_fp).max() < 0.6 * np.abs(w_fp).max()
    np.testing.assert_allclose(y.asnumpy(), x.asnumpy() @ wd.T + layer.bias.asnumpy(), rtol=1e-5, atol=1e-5)
    sd = layer.state_dict()
    keys = {"weight", "bias", "weight.absmax", "weight.quant_map", f"weight.quant_state.bitsandbytes__{quant_type}"}
    if compress_statistics:
        keys |= {"weight.nested_absmax", "weight.nested_quant_map"}
    assert set(sd) == keys
    fresh = bnn.Linear4bit(64, 32, bias=True, compress_statistics=compress_statistics, quant_type=quant_type)
    fresh.load_state_dict(sd, strict=True)
    np.testing.assert_array_equal(fresh(x).asnumpy(), y.asnumpy())
    np.testing.assert_array_equal(fresh(x[:1]).asnumpy(), layer(x[:1]).asnumpy())
    # copies keep the packed data and state
    for w in (copy.copy(layer.weight), copy.deepcopy(layer.weight)):
        assert isinstance(w, bnn.Params4bit) and w.bnb_quantized
        np.testing.assert_array_equal(w.asnumpy(), packed)
        assert w.quant_state == layer.weight.quant_state


def test_params4bit_accepts_hf_kwargs_and_prequantized(torch):
    import bitsandbytes_ms.nn as bnn

    old = torch.nn.Parameter(torch.tensor(np.random.RandomState(2).randn(16, 32).astype(np.float32)))
    p = bnn.Params4bit(old.data, requires_grad=False, quant_type="nf4", **old.__dict__).to("cpu")
    assert p.bnb_quantized and p.shape == (256, 1)
    sd = {k: v for k, v in p.quant_state.as_dict(packed=True).items()}
    p2 = bnn.Params4bit.from_prequantized(p.data, sd)
    assert p2.bnb_quantized and p2.quant_state == p.quant_state
    np.testing.assert_array_equal(F.dequantize_4bit(p2, p2.quant_state).asnumpy(),
                                  F.dequantize_4bit(p, p.quant_state).asnumpy())


def test_linear4bit_size_on_disk_and_fp16_input(torch):
    import io

    import bitsandbytes_ms.nn as bnn

    layer = bnn.LinearNF4(256, 256, bias=False).to("cpu")
    fp16_bytes = 256 * 256 * 2
    packed_bytes = sum(v.asnumpy().nbytes for v in layer.state_dict().values())
    assert packed_bytes < 0.29 * fp16_bytes
    x = torch.tensor(np.random.RandomState(3).randn(2, 256).astype(np.float16))
    y = layer(x)
    assert y.dtype == ms.float16 and y.shape == (2, 256)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    assert buf.tell() < 0.29 * fp16_bytes + 4096

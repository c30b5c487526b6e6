"""Issue 34 round 3: what an independent bad-input harness (/work/scratch/harness34/harness.py) found, one test per
class of fix. Each bad call raises one line naming the argument; each good call of the same form is checked against
numpy (or upstream's constants)."""

import ctypes as ct
import subprocess
import sys

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401  (before `import torch`: torch becomes mindtorch)
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import functional as F
from bitsandbytes_ms.cextension import get_ptr, lib

NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)  # upstream's NF4 table


def _randn(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


# ---- optimizers: string hyper-parameters (torch: `0.0 <= "0.1"` is a TypeError) ----

_OPT_CASES = [(cls, kw, arg) for cls, kw, args in [
    ("Adam8bit", {}, ("lr", "weight_decay", "eps")), ("AdamW", {}, ("lr", "weight_decay", "eps")),
    ("Lion8bit", {}, ("lr", "weight_decay")), ("RMSprop32bit", {}, ("lr", "weight_decay", "eps")),
    ("Adagrad8bit", {}, ("lr", "weight_decay", "eps")), ("LAMB", {}, ("lr", "weight_decay", "eps")),
    ("AdEMAMix8bit", {}, ("lr", "weight_decay", "eps")),
    ("SGD8bit", {"lr": 0.1, "momentum": 0.9}, ("lr", "weight_decay")),
    ("LARS", {"lr": 0.1, "momentum": 0.9}, ("lr", "weight_decay"))] for arg in args]


@pytest.mark.parametrize("cls,kw,arg", _OPT_CASES)
def test_optimizer_string_hyperparameter_is_a_type_error(cls, kw, arg):
    p = torch.nn.Parameter(torch.ones(64))
    with pytest.raises(TypeError, match=rf"^{cls}: `{arg}` must be a number; got str '0\.1'$"):
        getattr(bnb.optim, cls)([p], **{**kw, arg: "0.1"})


def test_optimizer_numeric_lr_still_steps_exactly():
    p0, g = _randn(4096), _randn(4096, seed=1)
    p = torch.nn.Parameter(torch.tensor(p0))
    opt = bnb.optim.SGD([p], lr=np.float32(0.1), momentum=0.9)  # numpy scalars stay accepted
    p.grad = torch.tensor(g)
    opt.step()
    np.testing.assert_allclose(p.asnumpy(), p0 - np.float32(0.1) * g, rtol=1e-6, atol=1e-7)


def test_param_group_string_lr_is_refused():
    p, q = torch.nn.Parameter(torch.ones(64)), torch.nn.Parameter(torch.ones(64))
    opt = bnb.optim.Adam8bit([p], lr=1e-3)
    with pytest.raises(TypeError, match=r"`lr` must be a number; got str '1e-3'"):
        opt.add_param_group({"params": [q], "lr": "1e-3"})


# ---- functional optimizer updates: scalars as upstream's ctypes call takes them ----

def _adam32_args(**over):
    n = 300
    a = dict(optimizer_name="adam", g=ms.Tensor(_randn(n, seed=1)), p=ms.Tensor(_randn(n)),
             state1=ms.Tensor(np.zeros(n, np.float32)), beta1=0.9, eps=1e-8, step=1, lr=1e-2,
             state2=ms.Tensor(np.zeros(n, np.float32)), beta2=0.999)
    a.update(over)
    return a


@pytest.mark.parametrize("arg,value,msg", [("lr", "0.1", r"`lr` must be a number; got str '0\.1'"),
                                           ("beta1", None, r"`beta1` must be a number; got NoneType"),
                                           ("step", 1.5, r"`step` must be an int; got float 1\.5"),
                                           ("step", "1", r"`step` must be an int; got str '1'")])
def test_optimizer_update_32bit_scalar_types(arg, value, msg):
    a = _adam32_args(**{arg: value})
    before = a["p"].asnumpy().copy()
    with pytest.raises(TypeError, match=rf"optimizer_update_32bit: {msg}"):
        F.optimizer_update_32bit(**a)
    np.testing.assert_array_equal(a["p"].asnumpy(), before)  # nothing ran


def test_optimizer_update_32bit_adam_matches_numpy():
    a = _adam32_args()
    p0, g = a["p"].asnumpy().copy(), a["g"].asnumpy()
    F.optimizer_update_32bit(**a)
    m, v = 0.1 * g.astype(np.float64), 0.001 * g.astype(np.float64) ** 2
    ref = p0 - 1e-2 * np.sqrt(0.001) / 0.1 * m / (np.sqrt(v) + 1e-8 * np.sqrt(0.001))
    np.testing.assert_allclose(a["p"].asnumpy(), ref, rtol=1e-5, atol=1e-6)


def test_optimizer_update_8bit_blockwise_string_lr():
    n = 300
    with pytest.raises(TypeError, match=r"optimizer_update_8bit_blockwise: `lr` must be a number; got str"):
        F.optimizer_update_8bit_blockwise(
            "adam", ms.Tensor(np.ones(n, np.float32)), ms.Tensor(np.ones(n, np.float32)),
            ms.Tensor(np.zeros(n, np.uint8)), ms.Tensor(np.zeros(n, np.uint8)), 0.9, 0.999, 0.0, 0.0, 1e-8, 1, "0.1",
            F.create_dynamic_map(True), F.create_dynamic_map(False), ms.Tensor(np.zeros(2, np.float32)),
            ms.Tensor(np.zeros(2, np.float32)))


# ---- upstream-style raw calls: size scalars checked against the tensors ----

def test_quantize_blockwise_raw_call_n_must_match_A():
    x = _randn(100)
    code = F.create_dynamic_map()
    absmax, out = ms.Tensor(np.zeros(2, np.float32)), ms.Tensor(np.zeros(100, np.uint8))
    for n in (-1, 10 ** 6, 99):
        with pytest.raises(ValueError, match=rf"lib\.cquantize_blockwise_fp32: `n` must be 100 \(the size of the "
                                             rf"tensors passed\); got {n}"):
            lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(ms.Tensor(x)), get_ptr(absmax), get_ptr(out),
                                         ct.c_int32(64), ct.c_int(n))
    lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(ms.Tensor(x)), get_ptr(absmax), get_ptr(out), ct.c_int32(64),
                                 ct.c_int(100))
    q_ref, a_ref = R.quantize_blockwise(x, code.asnumpy(), 64)
    np.testing.assert_array_equal(out.asnumpy(), q_ref)
    np.testing.assert_array_equal(absmax.asnumpy(), a_ref)


def test_int8_vector_quant_raw_call_rows_cols():
    x = _randn(4, 9)
    out, rs = ms.Tensor(np.zeros((4, 9), np.int8)), ms.Tensor(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"lib\.cint8_vector_quant: `rows` must be 4 .*; got 40"):
        lib.cint8_vector_quant(get_ptr(ms.Tensor(x)), get_ptr(out), get_ptr(rs), ct.c_float(0.0), ct.c_int32(40),
                               ct.c_int32(9))
    lib.cint8_vector_quant(get_ptr(ms.Tensor(x)), get_ptr(out), get_ptr(rs), ct.c_float(0.0), ct.c_int32(4),
                           ct.c_int32(9), None)  # upstream passes its stream last
    amax = np.abs(x).max(1)
    np.testing.assert_array_equal(rs.asnumpy(), amax)
    assert np.abs(out.asnumpy().astype(np.int64) - np.round(x * (127 / amax[:, None]))).max() <= 1


def test_dequant_mm_raw_call_num_cols():
    A = np.arange(12, dtype=np.int32).reshape(3, 4) * 100
    rs, cs = np.array([1, 2, 3], np.float32), np.array([4, 5, 6, 7], np.float32)
    out = ms.Tensor(np.zeros((3, 4), np.float16))
    args = lambda cols: (get_ptr(ms.Tensor(A)), get_ptr(ms.Tensor(rs)), get_ptr(ms.Tensor(cs)), get_ptr(out),  # noqa
                         None, ct.c_int32(3), ct.c_int32(cols), None)
    with pytest.raises(ValueError, match=r"`numCols` must be 4 .*; got 40"):
        lib.cdequant_mm_int32_fp16(*args(40))
    lib.cdequant_mm_int32_fp16(*args(4))
    np.testing.assert_allclose(out.asnumpy(), A * rs[:, None] * cs[None, :] / (127 * 127), rtol=1e-3)


# ---- upstream's own 4-bit call forms (backends/cuda/ops.py): code None, a trailing stream, gemv (m=N, n=1, k) ----

@pytest.mark.parametrize("qt", ["nf4", "fp4"])
def test_4bit_raw_calls_with_code_none_and_stream(qt):
    x = _randn(256, seed=3)
    absmax, out = ms.Tensor(np.zeros(4, np.float32)), ms.Tensor(np.zeros((128, 1), np.uint8))
    lib.__getattr__(f"cquantize_blockwise_fp32_{qt}")(None, get_ptr(ms.Tensor(x)), get_ptr(absmax), get_ptr(out),
                                                      ct.c_int32(64), ct.c_int32(256))
    q, st = F.quantize_4bit(ms.Tensor(x), blocksize=64, quant_type=qt, compress_statistics=False)
    np.testing.assert_array_equal(out.asnumpy().reshape(-1), q.asnumpy().reshape(-1))
    np.testing.assert_array_equal(absmax.asnumpy(), np.abs(x).reshape(4, 64).max(1))
    back = ms.Tensor(np.zeros(256, np.float32))
    lib.__getattr__(f"cdequantize_blockwise_fp32_{qt}")(None, get_ptr(out), get_ptr(absmax), get_ptr(back),
                                                        ct.c_int(64), ct.c_int32(256), None)
    codes = np.stack([out.asnumpy().reshape(-1) >> 4, out.asnumpy().reshape(-1) & 15], 1).reshape(-1)
    table = NF4 if qt == "nf4" else F.get_4bit_type("fp4").asnumpy()
    np.testing.assert_allclose(back.asnumpy(), table[codes] * np.repeat(absmax.asnumpy(), 64), rtol=1e-6)


def test_dequantize_blockwise_raw_call_with_stream():
    x = _randn(300, seed=4)
    q, st = F.quantize_blockwise(ms.Tensor(x), blocksize=64)
    out = ms.Tensor(np.zeros(300, np.float32))
    lib.cdequantize_blockwise_fp32(get_ptr(st.code), get_ptr(q), get_ptr(st.absmax), get_ptr(out), ct.c_int(64),
                                   ct.c_int(300), None)
    ref = R.dequantize_blockwise(q.asnumpy(), st.absmax.asnumpy(), st.code.asnumpy(), 64)
    np.testing.assert_array_equal(out.asnumpy(), ref)


@pytest.mark.parametrize("order", ["upstream", "table"])
def test_gemv_4bit_raw_call_both_orders(order):
    N, K = 8, 128
    q, st = F.quantize_4bit(ms.Tensor(_randn(N, K, seed=7)), blocksize=64, quant_type="nf4",
                            compress_statistics=False)
    A = ms.Tensor(_randn(1, K, seed=8))
    out = ms.Tensor(np.zeros((1, N), np.float32))
    m, n = (N, 1) if order == "upstream" else (1, N)  # upstream: m = output features, n = 1
    lib.cgemm_4bit_inference_naive_fp32(ct.c_int32(m), ct.c_int32(n), ct.c_int32(K), get_ptr(A), get_ptr(q),
                                        get_ptr(st.absmax), get_ptr(st.code), get_ptr(out), ct.c_int32(N),
                                        ct.c_int32(K // 2), ct.c_int32(N), ct.c_int32(64), None)
    ref = A.asnumpy().astype(np.float64) @ F.dequantize_4bit(q, st).asnumpy().astype(np.float64).T
    np.testing.assert_allclose(out.asnumpy(), ref, rtol=1e-5, atol=1e-5)


def test_gemv_4bit_raw_call_B_must_match_A():
    code = ms.Tensor(NF4)
    B, absmax = ms.Tensor(np.full((64, 1), 0x77, np.uint8)), ms.Tensor(np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"`B` must hold n_out \* K = 2 \* 60 4-bit values in 60 bytes .*; got 64 "):
        lib.cgemm_4bit_inference_naive_fp32(ms.Tensor(np.ones((1, 60), np.float32)), B, absmax, code, 64, 2)
    out = lib.cgemm_4bit_inference_naive_fp32(ms.Tensor(np.ones((1, 64), np.float32)), B, absmax, code, 64, 2)
    np.testing.assert_allclose(out.asnumpy(), np.full((1, 2), 64 * NF4[7]), atol=1e-6)  # nibble 7 -> 0.0


# ---- functional / nn argument checks ----

@pytest.mark.parametrize("state", [{"absmax": 1}, "x", 3])
def test_dequantize_blockwise_quant_state_type(state):
    with pytest.raises(TypeError, match=r"dequantize_blockwise: `quant_state` must be a QuantState"):
        F.dequantize_blockwise(ms.Tensor(np.zeros(100, np.uint8)), state)


@pytest.mark.parametrize("bias_dtype", [torch.float16, torch.bfloat16])
def test_linear_fp_bias_of_another_dtype_is_refused(bias_dtype):
    layer = bnb.nn.LinearFP(4, 3)
    layer.bias = torch.nn.Parameter(torch.tensor(np.array([1, 2, 3], np.float32)).to(bias_dtype), requires_grad=False)
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"LinearFP: `bias` must have the weight's dtype "
                                                            r"float32; got b?float16"):
        layer(torch.ones(2, 4))


def test_linear_fp_same_dtype_bias_matches_numpy():
    W, b, x = _randn(3, 4, seed=1), _randn(3, seed=2), _randn(2, 4, seed=3)
    layer = bnb.nn.LinearFP(4, 3)
    layer.weight = torch.nn.Parameter(torch.tensor(W), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.tensor(b), requires_grad=False)
    with torch.no_grad():
        y = layer(torch.tensor(x))
    np.testing.assert_allclose(y.asnumpy(), x @ W.T + b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", ["Linear4bit", "LinearNF4", "Linear8bitLt"])
def test_negative_features_name_the_argument(cls):
    with pytest.raises(RuntimeError, match=rf"{cls}: `input_features` must be a non-negative int; got int -3"):
        getattr(bnb.nn, cls)(-3, 4)


def test_linear4bit_compute_dtype_checked_at_construction():
    with pytest.raises(TypeError, match=r"`compute_dtype` must be None, float32, float16 or bfloat16; got 'float99'"):
        bnb.nn.Linear4bit(64, 4, compute_dtype="float99")
    assert bnb.nn.Linear4bit(64, 4, compute_dtype="float16").compute_dtype == ms.float16


# ---- CLI: --save that would save nothing or delete other files ----

def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "bitsandbytes_ms", "quantize", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def test_cli_empty_save_path_fails(tmp_path):
    r = _cli("--save", "", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--save: empty path" in r.stderr.strip().splitlines()[-1]


def test_cli_save_into_unrelated_nonempty_dir_keeps_its_files(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    r = _cli("--mode", "nf4", "--save", str(target), cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "holds no checkpoint" in r.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "keep"


def test_optimizer_raw_call_n_must_match_p():
    g, p0 = _randn(300, seed=1), _randn(300, seed=2)
    p, s1 = ms.Tensor(p0.copy()), ms.Tensor(np.zeros(300, np.float32))

    def call(n):
        f = ct.c_float
        lib.cmomentum32bit_grad_32(get_ptr(ms.Tensor(g)), get_ptr(p), get_ptr(s1), None, None, f(0.0), f(0.0), f(0.9),
                                   f(0.0), f(0.0), f(0.0), f(1e-8), f(0.0), ct.c_int32(1), f(0.01), f(1.0),
                                   ct.c_bool(False), ct.c_int32(n))

    with pytest.raises(ValueError, match=r"lib\.cmomentum32bit_grad_32: `n` must be 300 .*; got 3000"):
        call(3000)
    np.testing.assert_array_equal(p.asnumpy(), p0)  # nothing ran
    call(300)  # momentum, step 1: state = g, p -= lr * g
    np.testing.assert_allclose(p.asnumpy(), p0 - np.float32(0.01) * g, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(s1.asnumpy(), g)

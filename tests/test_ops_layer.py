"""The op layer (bitsandbytes_ms._ops, issue 14): every op has a native and a reference kernel, the two give the same
bytes on small inputs (the float64-accumulating GEMV/GEMM twins agree to rounding), an op call tags its results for
mindtorch, functional names no C symbol, and after register() torch.ops.bitsandbytes.<op> gives functional's result.
(The package without its native library, on the reference backend: tests/test_cextension.py.)"""

import inspect
import re

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

import bitsandbytes_ms as bnb
from bitsandbytes_ms import _ops, functional as F
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms.backends import native as N

BACKENDS = ("cpu", "reference")
FLOATS = (ms.float32, ms.float16, ms.bfloat16)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _t(a, dtype=None):
    """A tensor as a user has it (with mindtorch's device tag once mindtorch is imported by another test)."""
    t = Tensor(a)
    return _ops.tag(t if dtype is None or dtype == t.dtype else ms.ops.cast(t, dtype))


def _f32(t):
    return ms.ops.cast(t, ms.float32).asnumpy()


def _np(res):
    if res is None:
        return None
    if isinstance(res, (tuple, list)):
        return [_np(r) for r in res]
    a = res.asnumpy()
    return a.view(np.uint16) if res.dtype == ms.bfloat16 else a  # compare bf16 by its bits


def _both(op, *args, **kwargs):
    return [_np(op.kernel(b)(*args, **kwargs)) for b in BACKENDS]


def _same(a, b):
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def test_every_op_has_a_native_and_a_reference_kernel():
    assert len(_ops.OPS) >= 17
    for name, op in _ops.OPS.items():
        assert set(op.kernels) == {"cpu", "cuda", "reference"}, name
        assert op.signature.startswith("(") and "->" in op.signature and op.returns, name
    assert _ops.backend() == "cpu"  # the library is built in the test environment


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: F.dtype_name(d))
def test_blockwise_native_equals_reference(dtype):
    x = _t((_rng(1).standard_normal(1000) * 3).astype(np.float32), dtype)
    code = F.create_dynamic_map()
    q, amax = _both(_ops.quantize_blockwise, x, code, 64)
    _same(q, amax)
    deq = _both(_ops.dequantize_blockwise, _t(q[0]), _t(q[1]), code, 64, dtype)
    _same(*deq)
    assert deq[0].dtype == (np.uint16 if dtype == ms.bfloat16 else np.dtype(F.dtype_name(dtype)))


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("storage", [ms.uint8, ms.bfloat16], ids=["u8", "bf16"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: F.dtype_name(d))
def test_4bit_native_equals_reference(dtype, quant_type, storage):
    W = _t((_rng(2).standard_normal((24, 64)) * 0.1).astype(np.float32), dtype)
    native, ref = _both(_ops.quantize_4bit, W, 64, quant_type, storage)
    _same(native, ref)
    packed = _ops.quantize_4bit(W, 64, quant_type, storage)[0]
    assert packed.dtype == storage and tuple(packed.shape) == (24 * 64 // 2 // (2 if storage == ms.bfloat16 else 1), 1)
    absmax = _t(native[1])
    _same(*_both(_ops.dequantize_4bit, packed, absmax, 64, quant_type, (24, 64), dtype))
    x = _t(_rng(3).standard_normal((1, 64)).astype(np.float32), dtype)
    code = F.get_4bit_type(quant_type)
    g_native, g_ref = (_ops.gemv_4bit.kernel(b)(x, packed, (24, 64), absmax, code, 64) for b in BACKENDS)
    np.testing.assert_allclose(_f32(g_native), _f32(g_ref),
                               rtol=1e-2 if dtype != ms.float32 else 1e-5, atol=1e-2 if dtype != ms.float32 else 1e-5)
    bias = _t(_rng(4).standard_normal(24).astype(np.float32), dtype)
    l_native, l_ref = (_ops.linear_4bit.kernel(b)(x, packed, (24, 64), absmax, code, 64, bias) for b in BACKENDS)
    np.testing.assert_allclose(_f32(l_native), _f32(l_ref),
                               rtol=1e-2 if dtype != ms.float32 else 1e-5, atol=1e-2 if dtype != ms.float32 else 1e-5)


def test_linear_4bit_bf16_dot_native_equals_reference():
    """The bf16 dot-product kernel is bit-exact with its numpy model (portable kernel on this CPU)."""
    W = _t((_rng(5).standard_normal((32, 64)) * 0.1).astype(np.float32))
    packed, absmax = _ops.quantize_4bit(W, 64, "nf4", ms.uint8)
    x = _t(_rng(6).standard_normal((3, 64)).astype(np.float32), ms.bfloat16)
    _same(*_both(_ops.linear_4bit, x, packed, (32, 64), absmax, F.get_4bit_type("nf4"), 64, None, None, None, None,
                 256, True))


@pytest.mark.parametrize("threshold", [0.0, 2.5])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: F.dtype_name(d))
def test_int8_native_equals_reference(dtype, threshold):
    A = _rng(7).standard_normal((5, 48)).astype(np.float32)
    A[:, 3] *= 4
    At = _t(A, dtype)
    quant = _both(_ops.int8_vectorwise_quant, At, threshold)
    _same(*quant)
    W = _t((_rng(8).standard_normal((16, 48)) * 0.2).astype(np.float32))
    CB, SCB, _ = _ops.int8_vectorwise_quant(W, 0.0)
    CA = _t(quant[0][0])
    C = _both(_ops.int8_linear_matmul, CA, CB)
    _same(*C)
    bias = _t(_rng(9).standard_normal(16).astype(np.float32), dtype)
    _same(*_both(_ops.int8_mm_dequant, _t(C[0]), _t(quant[0][1]), SCB, dtype, bias))
    _same(*_both(_ops.int8_mixed_mm_dequant, _t(C[0]), _t(quant[0][1]), SCB, bias, At, CB, _t(quant[0][2]), dtype))
    _same(*_both(_ops.int8_linear, At, CB, SCB, bias, threshold))


@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_and_gemm_fp_native_equal_reference(bits):
    W = _t((_rng(10).standard_normal((12, 33)) * 0.3).astype(np.float32))
    q, scale = _both(_ops.quantize_weight_only, W, bits)
    _same(q, scale)
    _same(*_both(_ops.dequantize_weight_only, _t(q[0]), _t(q[1]), 33, bits, ms.bfloat16))
    x = _t(_rng(11).standard_normal((2, 33)).astype(np.float32))
    g = _both(_ops.gemm_weight_only, x, _t(q[0]), _t(q[1]), bits)
    np.testing.assert_allclose(g[0], g[1], rtol=1e-5, atol=1e-5)
    _same(*_both(_ops.gemm_fp, x, W, _t(_rng(12).standard_normal(12).astype(np.float32))))


@pytest.mark.parametrize("name", ["adam", "lion", "momentum"])
def test_optimizer_updates_native_equal_reference(name):
    """In place on both backends: the parameter and the states come out with the same bytes."""
    rng = _rng(13)
    p0, g0 = rng.standard_normal(600).astype(np.float32), (rng.standard_normal(600) * 0.1).astype(np.float32)
    s10, s20 = np.abs(rng.standard_normal(600)).astype(np.float32) * 0.01, np.abs(rng.standard_normal(600)).astype(np.float32) * 1e-4
    res = []
    for b in BACKENDS:
        p, g, s1 = _t(p0.copy()), _t(g0.copy()), _t(s10.copy())
        s2 = _t(s20.copy()) if name == "adam" else None
        _ops.optimizer_update_32bit.kernel(b)(name, g, p, s1, s2, None, 0.0, 0.0, 0.9, 0.999, 0.0, 0.0, 1e-8, 0.01,
                                              3, 1e-3, 1.0, False)
        res.append([p.asnumpy(), s1.asnumpy()] + ([s2.asnumpy()] if s2 is not None else []))
    _same(*res)
    assert not np.array_equal(res[0][0], p0)
    qmap1, qmap2 = F.create_dynamic_map(signed=True), F.create_dynamic_map(signed=False)
    res = []
    for b in BACKENDS:
        p, g = _t(p0.copy()), _t(g0.copy())
        st1, a1 = _ops.quantize_blockwise(_t(s10 * (1 if name == "adam" else -1)), qmap1, 256)
        st2, a2 = _ops.quantize_blockwise(_t(s20), qmap2, 256) if name == "adam" else (None, None)
        _ops.optimizer_update_8bit_blockwise.kernel(b)(name, g, p, st1, st2, 0.9, 0.999, 0.0, 0.0, 1e-8, 3, 1e-3,
                                                       qmap1, qmap2 if name == "adam" else None, a1, a2, 0.01, 1.0)
        res.append([t.asnumpy() for t in (p, st1, a1) + ((st2, a2) if st2 is not None else ())])
    _same(*res)


def test_functional_names_no_c_symbol():
    """functional calls ops: no C entry-point name is built or looked up there (backends/native.py spells them)."""
    src = inspect.getsource(F)
    assert "getattr(lib" not in src and "lib.c" not in src
    assert not re.search(r"""["']c(quantize|dequantize|gemm|gemv|int8|igemm|dequant|linear|adam|lion)""", src)


def test_op_call_tags_results_for_mindtorch():
    import mindnlp  # noqa: F401
    import torch

    A = torch.tensor(_rng(14).standard_normal(256).astype(np.float32))
    q, absmax = _ops.quantize_blockwise(A, F.create_dynamic_map(), 64)
    assert q.device == A.device and absmax.device == A.device
    assert tuple((q.reshape(-1, 64) * 1).shape) == (4, 64)  # mindtorch's Tensor methods work on the results


def test_torch_ops_bitsandbytes_after_register():
    import mindnlp  # noqa: F401
    import torch

    from bitsandbytes_ms import torch_ops

    bnb.register()
    ns = torch.ops.bitsandbytes
    assert ns is torch_ops.bitsandbytes
    for name in torch_ops.UPSTREAM_OPS + ("gemm_4bit", "int8_scaled_mm", "int8_mixed_scaled_mm", "int8_double_quant",
                                          "int8_vectorwise_dequant"):
        assert callable(getattr(ns, name).default), name
    for name in ("dequantize_blockwise", "dequantize_4bit", "gemv_4bit", "int8_linear_matmul"):
        assert callable(getattr(ns, name).out), name
    W = torch.tensor((_rng(15).standard_normal((16, 64)) * 0.1).astype(np.float32))
    packed, absmax = ns.quantize_4bit(W, 64, "nf4", torch.uint8)
    ref_packed, qs = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    np.testing.assert_array_equal(packed.asnumpy(), ref_packed.asnumpy())
    np.testing.assert_array_equal(absmax.asnumpy(), qs.absmax.asnumpy())
    deq = ns.dequantize_4bit.default(packed, absmax, 64, "nf4", (16, 64), torch.float32)
    np.testing.assert_array_equal(deq.asnumpy(), F.dequantize_4bit(ref_packed, qs).asnumpy())
    out = torch.zeros((16, 64), dtype=torch.float32)
    assert ns.dequantize_4bit.out(packed, absmax, 64, "nf4", (16, 64), torch.float32, out) is None
    np.testing.assert_array_equal(out.asnumpy(), deq.asnumpy())
    A = torch.tensor(_rng(16).standard_normal((3, 64)).astype(np.float32))
    CA, SCA, cols = ns.int8_vectorwise_quant(A, 0.0)
    fCA, fSCA, _ = F.int8_vectorwise_quant(A, 0.0)
    np.testing.assert_array_equal(CA.asnumpy(), fCA.asnumpy())
    np.testing.assert_array_equal(SCA.asnumpy(), fSCA.asnumpy())
    assert cols is None

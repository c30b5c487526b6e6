"""Upstream 0.50.2's remaining public names in bitsandbytes.utils / nn / autograd._functions (issue 15):
find_outlier_dims, OutlierTracer + outlier_hook, replace_linear, execute_and_return, the int8 weight-format maps,
GlobalOutlierPooler, nn.OutlierAwareLinear."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms import utils as U  # noqa: E402
from bitsandbytes_ms.autograd._functions import GlobalOutlierPooler  # noqa: E402


def _weight_with_outlier_columns(cols=(5, 17)):
    w = np.random.RandomState(0).randn(64, 32).astype(np.float32)
    for c in cols:
        w[:, c] *= 12.0
    return w


def test_find_outlier_dims_zscore_topk_and_rdm():
    w = _weight_with_outlier_columns((5,))
    std = w.astype(np.float64).std(0, ddof=1)
    z = (std - std.mean()) / std.std(ddof=1)
    assert z[5] > 4 and (np.delete(z, 5) < 4).all()  # the planted column, and only it
    np.testing.assert_array_equal(U.find_outlier_dims(torch.tensor(w)).asnumpy(), [5])
    w2 = _weight_with_outlier_columns((5, 17))
    np.testing.assert_array_equal(np.sort(U.find_outlier_dims(w2, topk=2).asnumpy()), [5, 17])
    r = U.find_outlier_dims(w2, topk=7, rdm=True).asnumpy()
    assert r.shape == (7,) and r.dtype == np.int64 and ((0 <= r) & (r < 32)).all()
    with pytest.raises(ValueError, match="topk"):
        U.find_outlier_dims(w2, rdm=True)


def test_outlier_tracer_records_each_linear():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False), torch.nn.Linear(32, 8, bias=False))
    w1 = _weight_with_outlier_columns((3,))[:32]
    w2 = np.random.RandomState(1).randn(8, 32).astype(np.float32)
    w2[:, 9] *= 30.0
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor(w1))
        m[1].weight.copy_(torch.tensor(w2))
    tracer = U.OutlierTracer.get_instance()
    tracer.initialize(m)
    x = np.random.RandomState(2).randn(4, 32).astype(np.float32)
    x[:, 11] = 8.0  # |x| > 6 in feature 11: an outlier of the first layer's input
    with torch.no_grad():
        m(torch.tensor(x))
    first = tracer.get_outliers(m[0].weight).asnumpy()
    assert 11 in first  # the magnitude test on the first layer's input
    # a later layer: the dims found in the weight seen at that hook (upstream's outliers[-1])
    np.testing.assert_array_equal(tracer.get_outliers(m[1].weight).asnumpy(), U.find_outlier_dims(w2).asnumpy())
    assert 9 in tracer.get_outliers(m[1].weight).asnumpy()
    with pytest.raises(RuntimeError, match="get_instance"):
        U.OutlierTracer()


def test_replace_linear_skips_lm_head_and_copies_weights():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8, bias=False))
            self.lm_head = torch.nn.Linear(8, 4)

    m = M()
    w0 = m.block[0].weight
    out = U.replace_linear(m, lambda i, o, b: bnb.nn.LinearFP(i, o, bias=b), copy_weights=True)
    assert out is m
    assert type(m.block[0]) is bnb.nn.LinearFP and type(m.block[2]) is bnb.nn.LinearFP
    assert m.block[2].bias is None and m.block[0].weight is w0
    assert type(m.lm_head) is torch.nn.Linear


def test_execute_and_return_and_format_maps():
    assert U.execute_and_return("echo hello") == ("hello", "")
    assert U.execute_and_return("sh -c 'echo oops >&2'") == ("", "oops")
    assert U.LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING == {"row": 0, "col32": 1, "col_turing": 2, "col_ampere": 3}
    assert all(U.INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING[v] == k for k, v in U.LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING.items())


def test_global_outlier_pooler_keeps_the_first_dimension():
    p = GlobalOutlierPooler.get_instance()
    p.initialize()
    p.add_outliers(torch.tensor(np.array([3, 1], np.int64)), 64)
    p.add_outliers(np.array([7, 3]), 64)
    p.add_outliers(np.array([40]), 256)  # another feature dim: ignored
    np.testing.assert_array_equal(p.get_current_outlier_idx().asnumpy(), [1, 3, 7])
    assert GlobalOutlierPooler.get_instance() is p


def test_outlier_aware_linear_quantizes_once_with_the_traced_outliers():
    class Rounded(bnb.nn.OutlierAwareLinear):
        calls = 0

        def quantize_weight(self, w, outlier_idx):
            Rounded.calls += 1
            return torch.tensor(np.round(w.asnumpy() * 4) / 4)

        def forward_with_outliers(self, x, outlier_idx):
            return torch.nn.functional.linear(x, self.weight, self.bias)

    layer = Rounded(8, 4)
    wq = np.round(layer.weight.asnumpy() * 4) / 4
    x = np.random.RandomState(3).randn(2, 8).astype(np.float32)
    with torch.no_grad():
        y1 = layer(torch.tensor(x)).asnumpy()
        y2 = layer(torch.tensor(x)).asnumpy()
    assert Rounded.calls == 1 and layer.is_quantized
    np.testing.assert_allclose(y1, x @ wq.T + layer.bias.asnumpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y1, y2)
    with pytest.raises(NotImplementedError):
        bnb.nn.OutlierAwareLinear(4, 4)(torch.ones(1, 4))


def test_version_is_upstreams_and_own_release_is_ms_version():
    import importlib.metadata

    assert bnb.__version__ == bnb.__upstream_version__ == "0.50.2"
    assert bnb.__ms_version__ == importlib.metadata.version("bitsandbytes_ms")
    from bitsandbytes_ms.integrations import hf

    was_registered = hf._finder is not None
    bnb.register(patches=False)
    try:
        import bitsandbytes

        assert bitsandbytes.__version__ == importlib.metadata.version("bitsandbytes") == "0.50.2"
    finally:
        if not was_registered:
            hf.unregister()


# ---- functional: paging, contexts, deprecated int8 matmul helpers ------------------------------------------------
from bitsandbytes_ms import functional as F  # noqa: E402


@pytest.mark.parametrize("tA, tB", [(False, False), (True, False), (False, True), (True, True)])
def test_igemm_and_batched_igemm_exact(tA, tB):
    r = np.random.RandomState(4)
    a = r.randint(-128, 128, size=(5, 7)).astype(np.int8)
    b = r.randint(-128, 128, size=(7, 3)).astype(np.int8)
    A = a.T.copy() if tA else a
    B = b.T.copy() if tB else b
    ref = a.astype(np.int64) @ b.astype(np.int64)
    out = F.igemm(ms.Tensor(A), ms.Tensor(B), transposed_A=tA, transposed_B=tB)
    assert out.dtype == ms.int32
    np.testing.assert_array_equal(out.asnumpy(), ref)
    a3 = r.randint(-128, 128, size=(2, 5, 7)).astype(np.int8)
    b3 = r.randint(-128, 128, size=(2, 7, 3)).astype(np.int8)
    A3 = np.swapaxes(a3, 1, 2).copy() if tA else a3
    B3 = np.swapaxes(b3, 1, 2).copy() if tB else b3
    np.testing.assert_array_equal(F.batched_igemm(ms.Tensor(A3), ms.Tensor(B3), transposed_A=tA, transposed_B=tB).asnumpy(),
                                  np.einsum("bij,bjk->bik", a3.astype(np.int64), b3.astype(np.int64)))


def test_check_matmul_shapes_and_errors():
    i8 = lambda *s: ms.Tensor(np.zeros(s, np.int8))  # noqa: E731
    assert F.check_matmul(i8(4, 5), i8(5, 6), None, False, False) == (4, 6)
    assert F.check_matmul(i8(5, 4), i8(6, 5), None, True, True) == (4, 6)
    assert F.check_matmul(i8(2, 4, 5), i8(5, 6), None, False, False) == (2, 4, 6)
    assert F.check_matmul(i8(2, 4, 5), i8(2, 6, 5), None, False, True) == (2, 4, 6)
    with pytest.raises(ValueError, match="incorrect"):
        F.check_matmul(i8(4, 5), i8(4, 6), None, False, False)
    with pytest.raises(TypeError, match="int8"):
        F.check_matmul(ms.Tensor(np.zeros((4, 5), np.float32)), i8(5, 6), None, False, False)


def test_paged_tensors_fill_mul_and_device_checks():
    p = F.get_paged(3, 4, dtype=ms.float32)
    assert p.is_paged and tuple(p.shape) == (3, 4) and not p.asnumpy().any()
    F.fill(p, 2.5)
    np.testing.assert_array_equal(p.asnumpy(), np.full((3, 4), 2.5, np.float32))
    F._mul(p, ms.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)))
    np.testing.assert_array_equal(p.asnumpy(), 2.5 * np.arange(12, dtype=np.float32).reshape(3, 4))
    u = ms.Tensor(np.zeros(5, np.uint8))
    F.fill(u, 7)
    np.testing.assert_array_equal(u.asnumpy(), np.full(5, 7, np.uint8))
    with pytest.raises(NotImplementedError):
        F.fill(ms.Tensor(np.zeros(2, np.float16)), 1.0)
    m = F.GlobalPageManager.get_instance()
    m.paged_tensors.append(p)
    m.prefetch_all()
    F.prefetch_tensor(p)
    with pytest.raises(ValueError, match="paged"):
        F.prefetch_tensor(ms.Tensor(np.zeros(2, np.float32)))
    assert F.is_on_gpu([p, None, ms.Tensor(np.zeros(2, np.float32))])
    assert F.has_avx512bf16() == ("avx512_bf16" in bnb.cextension.cpu_features())
    with pytest.raises(RuntimeError, match="cuBLAS"):
        F.CUBLAS_Context.get_instance().get_context()

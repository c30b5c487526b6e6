"""The mindtorch patches added for the 4-bit compat ports (bitsandbytes_ms/integrations/mindtorch_patches.py,
section `fourbit3`): each test checks the patched behaviour against numpy / torch semantics and, with the patch
removed, the mindtorch 0.5.1 behaviour it exists for (so a mindtorch that fixes the gap shows up here)."""

import contextlib

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")

import mindnlp  # noqa: F401,E402  (torch -> mindtorch)
import torch  # noqa: E402

import bitsandbytes_ms.nn  # noqa: E402,F401
from bitsandbytes_ms._reference import np_bfloat16  # noqa: E402
from bitsandbytes_ms.integrations import mindtorch_patches  # noqa: E402,F401  (registers the patches)
from bitsandbytes_ms.integrations.patches import registry  # noqa: E402
from bitsandbytes_ms.nn import Params4bit  # noqa: E402

NAMES = ["mindtorch-cpu-isfinite", "mindtorch-cpu-equal-bf16", "mindtorch-cpu-isclose-bf16",
         "mindtorch-cpu-randint-dtype", "mindtorch-view-dtype", "mindtorch-isreal-device",
         "mindtorch-torch-function-chunk", "mindtorch-torch-function-split", "mindtorch-isin",
         "mindtorch-vector-norm-dim-none", "mindtorch-linalg-vector-norm-dim-none",
         "mindtorch-meta-getitem-no-data", "mindtorch-meta-index-select-no-data"]


@pytest.fixture(scope="module", autouse=True)
def patched():
    applied = registry.apply(NAMES)
    yield
    registry.remove(applied)


@contextlib.contextmanager
def without(name):
    registry.remove([name])
    try:
        yield
    finally:
        registry.apply([name])


def bf16(values):
    return torch.tensor(np.asarray(values, np.float32)).to(torch.bfloat16)


def test_patches_are_registered_and_documented():
    names = {p.name: p for p in registry.patches()}
    for n in NAMES:
        assert n in names and len(names[n].why) > 80 and registry.is_applied(n)


@pytest.mark.parametrize("shape", [(), (1, 1), (49152,), (3, 5)])
@pytest.mark.parametrize("test", [2, [7], [2, 7, 11], [], [[3], [4]]], ids=["int", "one", "three", "empty", "2d"])
@pytest.mark.parametrize("invert", [False, True])
def test_isin(shape, test, invert):
    """torch.isin (generate's EOS check) gives np.isin's values in the elements' shape, bool, with or without the
    patch (the patch is for speed: tests/test_fused_decoder.py's models run generate through it)."""
    rng = np.random.RandomState(0)
    el = rng.randint(0, 12, shape).astype(np.int64) if shape != (49152,) else np.arange(49152, dtype=np.int64)
    t = test if isinstance(test, int) else torch.tensor(np.asarray(test, np.int64))
    want = np.isin(el, np.asarray(test), invert=invert)
    got = torch.isin(torch.tensor(el), t, invert=invert)
    assert got.dtype == torch.bool and tuple(got.shape) == shape
    np.testing.assert_array_equal(got.numpy(), want)
    if test == []:
        return  # (mindtorch's own isin fails on an empty test set)
    with without("mindtorch-isin"):
        np.testing.assert_array_equal(torch.isin(torch.tensor(el), t, invert=invert).numpy().reshape(shape), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_isfinite(dtype):
    x = np.array([1.5, np.inf, -np.inf, np.nan, -0.0, 65504.0], np.float32)
    got = torch.isfinite(torch.tensor(x).to(dtype))
    assert got.dtype == torch.bool and got.device.type == "cpu"
    np.testing.assert_array_equal(got.numpy(), np.isfinite(x))
    with without("mindtorch-cpu-isfinite"):
        with pytest.raises(RuntimeError, match="isfinite"):
            torch.isfinite(torch.tensor(x))


def test_remove_deletes_an_added_attribute():
    import mindtorch._apis.cpu as cpu

    with without("mindtorch-cpu-isfinite"):
        assert not hasattr(cpu, "isfinite")
    assert hasattr(cpu, "isfinite")


def test_equal_bf16():
    a = bf16([1.0, 2.5, -3.0])
    assert torch.equal(a, bf16([1.0, 2.5, -3.0])) is True or bool(torch.equal(a, bf16([1.0, 2.5, -3.0])))
    assert not bool(torch.equal(a, bf16([1.0, 2.5, -3.015625])))  # differs in the last bf16 bit
    with without("mindtorch-cpu-equal-bf16"):
        with pytest.raises(TypeError, match="Equal"):
            torch.equal(a, a)


def test_isclose_bf16():
    a, b = bf16([1.0, 2.0, 100.0]), bf16([1.0078125, 2.5, 100.5])
    got = torch.isclose(a, b, rtol=0.01, atol=0.0)
    np.testing.assert_array_equal(got.numpy(), [True, False, True])
    torch.testing.assert_close(a, a)
    # a mismatch is still reported, but not as AssertionError: the report subtracts the bf16 tensors, and
    # MindSpore's CPU Sub has no bf16 kernel either (not patched; only failing comparisons reach it)
    with pytest.raises((AssertionError, RuntimeError), match="Comparing|not close"):
        torch.testing.assert_close(a, b)
    with without("mindtorch-cpu-isclose-bf16"):
        with pytest.raises(TypeError, match="IsClose"):
            torch.isclose(a, b)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.int16])
def test_randint_dtype(dtype):
    t = torch.randint(0, 255, (64,), dtype=dtype)
    assert t.dtype == dtype
    v = t.numpy()
    assert v.min() >= 0 and v.max() < 255
    with without("mindtorch-cpu-randint-dtype"):
        assert torch.randint(0, 255, (8,), dtype=torch.uint8).dtype == torch.int32


def test_view_dtype_reinterprets_bytes():
    raw = np.arange(24, dtype=np.uint8).reshape(2, 12)
    t = torch.tensor(raw)
    for dtype, np_dtype in [(torch.bfloat16, np_bfloat16), (torch.float16, np.float16), (torch.float32, np.float32),
                            (torch.int32, np.int32)]:
        v = t.view(dtype)
        assert v.dtype == dtype and tuple(v.shape) == raw.view(np_dtype).shape and v.device.type == "cpu"
        np.testing.assert_array_equal(v.view(torch.uint8).numpy(), raw)  # bytes kept, NaN patterns included
    assert tuple(t.view(4, 6).shape) == (4, 6) and tuple(t.view(-1).shape) == (24,)  # shape overload unchanged
    with pytest.raises(ValueError):
        torch.tensor(np.arange(3, dtype=np.uint8)).view(torch.float16)  # 3 bytes are not whole fp16 values
    with without("mindtorch-view-dtype"):
        with pytest.raises(AttributeError):
            t.view(torch.bfloat16)


def test_isreal_keeps_device():
    x = torch.tensor(np.array([1.0, -2.0], np.float32))
    r = x.isreal()
    assert r.device.type == "cpu" and bool(r.all())
    with without("mindtorch-isreal-device"):
        with pytest.raises(ValueError, match="device"):
            x.isreal().all()


def test_chunk_split_dispatch_to_torch_function():
    p = Params4bit(torch.tensor(np.random.RandomState(0).randn(8, 4).astype(np.float32)), quant_type="nf4",
                   blocksize=32).to("cpu")
    for pieces in (torch.chunk(p, 2, dim=0), torch.split(p, 8, dim=0)):
        assert isinstance(pieces, tuple) and len(pieces) == 2
        for piece in pieces:
            assert isinstance(piece, Params4bit) and piece.quant_state is p.quant_state and piece.quant_type == "nf4"
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x in pieces]), p.numpy())
    plain = torch.tensor(np.arange(6, dtype=np.float32))
    assert [type(x) for x in torch.chunk(plain, 3)] == [type(plain)] * 3  # plain tensors: unchanged
    with without("mindtorch-torch-function-chunk"):
        assert not isinstance(torch.chunk(p, 2, dim=0)[0], Params4bit)
    with without("mindtorch-torch-function-split"):
        assert not isinstance(torch.split(p, 4, dim=0)[0], Params4bit)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])  # (other p: mindtorch has no CPU lp_norm_v2 at all)
@pytest.mark.parametrize("keepdim", [False, True])
def test_vector_norm_over_all_elements(p, keepdim):
    """dim=None: the norm of every element (numpy), through torch.norm, torch.linalg.vector_norm and
    torch.linalg.norm's vector path; keepdim gives the input's rank of ones."""
    x = np.random.RandomState(int(p * 10)).randn(3, 4, 5).astype(np.float32)
    want = (np.abs(x.astype(np.float64)) ** p).sum() ** (1 / p)
    for got in (torch.norm(torch.tensor(x), p, keepdim=keepdim),
                torch.linalg.vector_norm(torch.tensor(x), p, keepdim=keepdim)):
        assert tuple(got.shape) == ((1, 1, 1) if keepdim else ())
        np.testing.assert_allclose(float(got.reshape(-1)[0]), want, rtol=2e-6)
    np.testing.assert_allclose(float(torch.linalg.vector_norm(torch.tensor(x), 2.0, dim=1)[0, 0]),
                               np.linalg.norm(x[0, :, 0]), rtol=2e-6)  # a given dim is left alone
    with without("mindtorch-vector-norm-dim-none"), pytest.raises(TypeError, match="LpNorm"):
        torch.norm(torch.tensor(x), p)


def test_clip_grad_norm_scales_every_gradient():
    """torch.nn.utils.clip_grad_norm_ (HF Trainer's max_grad_norm): the total 2-norm of all gradients, and each
    gradient scaled by max_norm / (total + 1e-6) when the total is above max_norm."""
    rng = np.random.RandomState(3)
    gs = [rng.randn(3, 4).astype(np.float32) * 5, rng.randn(7).astype(np.float32) * 5]
    ps = []
    for g in gs:
        p = torch.nn.Parameter(torch.tensor(np.zeros_like(g)))
        p.grad = torch.tensor(g)
        ps.append(p)
    total = float(torch.nn.utils.clip_grad_norm_(ps, 1.0))
    want = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in gs))
    np.testing.assert_allclose(total, want, rtol=2e-6)
    for p, g in zip(ps, gs):
        np.testing.assert_allclose(p.grad.asnumpy(), g * (1.0 / (want + 1e-6)), rtol=2e-5, atol=1e-7)


def test_norm_keeps_the_callers_subnormals():
    """MindSpore's LpNorm kernel turns flush-to-zero on in its thread; the patched norm restores the caller's
    floating-point environment, so a subnormal product stays subnormal afterwards (numpy, and this library's
    kernels, which run with the caller's MXCSR)."""
    def product():
        return float(np.array([1e-41], np.float32)[0] * np.float32(2.0))

    assert product() > 0
    torch.norm(torch.tensor(np.ones((3, 4), np.float32)), 2.0)
    torch.linalg.vector_norm(torch.tensor(np.ones(5, np.float32)), 2.0, dim=0)
    assert product() > 0


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024


META_INDEXES = [3, -1, (slice(3, 7), slice(None, None, 2)), [1, 5, 7], (Ellipsis, 1), (None, slice(2, None)),
                (-1, slice(-3, None))]


@pytest.mark.parametrize("index", META_INDEXES, ids=[str(i) for i in range(len(META_INDEXES))])
def test_meta_getitem_shape_as_numpy(index):
    t = torch.empty(10, 20, device="meta")
    r = t[index]
    assert tuple(r.shape) == np.empty((10, 20))[index].shape and r.device.type == "meta" and r.dtype == t.dtype


def test_meta_index_select_shape():
    t = torch.empty(10, 20, device="meta", dtype=torch.float16)
    r = torch.index_select(t, 1, torch.tensor([1, 2, 2], device="meta"))
    assert tuple(r.shape) == (10, 3) and r.device.type == "meta" and r.dtype == torch.float16


def test_meta_embedding_with_padding_idx_allocates_nothing():
    """transformers builds models on the meta device; nn.Embedding zeroes its padding row there. Unpatched, the
    meta getitem allocated the whole table (kept on the meta tensor): 256 MiB here."""
    def grow():
        before = _rss_mib()
        e = torch.nn.Embedding(65536, 1024, padding_idx=2, device="meta")
        grown = _rss_mib() - before
        assert e.weight.device.type == "meta" and tuple(e.weight.shape) == (65536, 1024)
        del e
        return grown

    with without("mindtorch-meta-getitem-no-data"):
        assert grow() > 200  # the bug this patch is for: the table's 256 MiB (if this fails, mindtorch fixed it)
    assert grow() < 32

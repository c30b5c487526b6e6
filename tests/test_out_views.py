"""``out=`` that is a view of a preallocated buffer (a row, a slice of rows, a transpose): the result lands in the
buffer too, as torch's ``out=`` does. mindtorch's ``copy_`` into a view leaves its base as it was, so the result
used to reach the view object only (issue 15 item 1's class: in-place writes lost on views)."""

import numpy as np
import pytest

import mindnlp  # noqa: F401  (before `import torch`: torch becomes mindtorch)

import bitsandbytes_ms.functional as F

import torch  # noqa: E402  (mindtorch)

VIEWS = {
    "rows": (lambda shape: (shape[0] + 3,) + tuple(shape[1:]), lambda b, shape: b[2:2 + shape[0]]),
    "row": (lambda shape: (3,) + tuple(shape), lambda b, shape: b[1]),
    "transposed": (lambda shape: tuple(reversed(shape)), lambda b, shape: b.t()),
}


def _rand(shape, seed):
    return torch.tensor(np.random.RandomState(seed).randn(*shape).astype(np.float32))


def _cases():
    x = _rand((4, 256), 0)
    q, st = F.quantize_blockwise(x)
    W = _rand((32, 64), 1)
    q4, s4 = F.quantize_4bit(W, quant_type="nf4")
    A = _rand((1, 64), 2)
    rng = np.random.RandomState(3)
    Ai = torch.tensor(rng.randint(-100, 100, (4, 64)).astype(np.int8))
    Bi = torch.tensor(rng.randint(-100, 100, (8, 64)).astype(np.int8))
    qw, sw = F.quantize_weight_only(W, 8)
    return {
        "dequantize_blockwise": (lambda out: F.dequantize_blockwise(q, st, out=out), (4, 256), torch.float32,
                                 np.asarray(F.dequantize_blockwise(q, st).numpy())),
        "dequantize_4bit": (lambda out: F.dequantize_4bit(q4, s4, out=out), (32, 64), torch.float32,
                            F.dequantize_4bit(q4, s4).numpy()),
        "gemv_4bit": (lambda out: F.gemv_4bit(A, q4.t(), out=out, state=s4), (1, 32), torch.float32,
                      A.numpy() @ F.dequantize_4bit(q4, s4).numpy().T),
        "int8_linear_matmul": (lambda out: F.int8_linear_matmul(Ai, Bi, out=out), (4, 8), torch.int32,
                               Ai.numpy().astype(np.int32) @ Bi.numpy().astype(np.int32).T),
        "dequantize_weight_only": (lambda out: F.dequantize_weight_only(qw, sw, out=out), (32, 64), torch.float32,
                                   qw.numpy().astype(np.float32) * sw.numpy()[:, None]),
        "quantize_blockwise": (lambda out: F.quantize_blockwise(x, out=out)[0], (4, 256), torch.uint8, q.numpy()),
    }


CASES = _cases()


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_out_view_lands_in_its_base(name, view):
    call, shape, dtype, want = CASES[name]
    make_base, take = VIEWS[view]
    base = torch.zeros(*make_base(shape), dtype=dtype)
    out = take(base, shape)
    assert tuple(out.shape) == tuple(shape)
    assert call(out) is out
    if name == "gemv_4bit":  # the kernel's summation order: within fp32 rounding of the numpy product
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
        want = out.numpy()
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(take(base, shape).numpy(), want)  # the base holds the result too
    # and nothing else of the buffer was written
    idx = torch.tensor(np.arange(int(np.prod(base.shape))).reshape(tuple(base.shape)))
    rest = np.ones(tuple(base.shape), bool)
    rest.reshape(-1)[take(idx, shape).numpy().reshape(-1)] = False
    assert not base.numpy()[rest].any()

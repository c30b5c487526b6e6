"""One `.to()` parser for the layers and parameters of bnb.nn (issue 14 item 3): nn.modules._parse_to, and the
`.to()` calls of Params4bit, Int8Params, Linear8bitLt, Embedding8bit's weight and LinearWeightOnly through it
(upstream parses them all with torch._C._nn._parse_to)."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms.nn import modules  # noqa: E402


@pytest.mark.parametrize("args,kwargs,want", [
    (("cpu",), {}, ("cpu", None)),
    (("cuda:1",), {}, ("cuda", None)),
    ((torch.device("cpu"),), {}, ("cpu", None)),
    ((0,), {}, ("cuda", None)),  # an int is a CUDA device index, as torch has it
    (("meta",), {}, ("meta", None)),
    ((torch.float16,), {}, (None, ms.float16)),
    ((torch.bfloat16,), {}, (None, ms.bfloat16)),
    ((torch.int8,), {}, (None, ms.int8)),
    (("cpu", torch.float16), {}, ("cpu", ms.float16)),
    (("cpu", True), {}, ("cpu", None)),  # non_blocking by position
    ((), {"device": "cuda", "dtype": torch.bfloat16, "non_blocking": True}, ("cuda", ms.bfloat16)),
    ((), {}, (None, None)),
])
def test_parse_to(args, kwargs, want):
    assert modules._parse_to(args, kwargs) == want


def test_parse_to_tensor_gives_its_device_and_dtype():
    t = torch.ones(2, dtype=torch.float16)
    assert modules._parse_to((t,), {}) == ("cpu", ms.float16)


def _w(shape=(8, 64), seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def test_int8params_to_dtype_casts_every_float_dtype():
    # before the shared parser, .to(torch.bfloat16) returned the float32 weight unchanged
    W = _w()
    for dt, ref in ((torch.bfloat16, ms.Tensor(W).astype(ms.bfloat16)), (torch.float16, ms.Tensor(W.astype(np.float16)))):
        p = bnb.nn.Int8Params(torch.tensor(W), has_fp16_weights=True, requires_grad=False).to(dt)
        assert isinstance(p, bnb.nn.Int8Params) and p.dtype == dt and p.has_fp16_weights
        np.testing.assert_array_equal(p.float().asnumpy(), ref.astype(ms.float32).asnumpy())


@pytest.mark.parametrize("how", ["cpu", "int", "device_kw", "torch_device", "tensor"])
def test_params4bit_to_device_quantizes(how):
    W = _w()
    arg = {"cpu": (("cpu",), {}), "int": ((0,), {}), "device_kw": ((), {"device": "cpu"}),  # "cuda": an error without a GPU (test_first_minutes)
           "torch_device": ((torch.device("cpu"),), {}), "tensor": ((torch.ones(1),), {})}[how]
    p = bnb.nn.Params4bit(torch.tensor(W), quant_type="nf4", compress_statistics=False).to(*arg[0], **arg[1])
    assert p.bnb_quantized and p.dtype == ms.uint8 and tuple(p.shape) == (W.size // 2, 1)
    ref = bnb.functional.dequantize_4bit(*bnb.functional.quantize_4bit(torch.tensor(W), quant_type="nf4",
                                                                       compress_statistics=False))
    np.testing.assert_array_equal(bnb.functional.dequantize_4bit(p, p.quant_state).asnumpy(), ref.asnumpy())


def test_params4bit_to_meta_or_dtype_does_not_quantize():
    W = _w()
    p = bnb.nn.Params4bit(torch.tensor(W), quant_type="nf4")
    m = p.to("meta")  # moved to the meta device by mindtorch, never quantized
    assert isinstance(m, bnb.nn.Params4bit) and not m.bnb_quantized and not p.bnb_quantized and m.dtype == ms.float32
    h = p.to(torch.float16)
    assert isinstance(h, bnb.nn.Params4bit) and not h.bnb_quantized and h.dtype == ms.float16
    np.testing.assert_array_equal(h.asnumpy(), W.astype(np.float16))
    q = p.to("cpu")
    assert q.to(torch.bfloat16) is q and q.quant_state.dtype == ms.bfloat16  # dequantizes to bf16, as upstream


def test_linear8bitlt_to_device_quantizes_row_wise():
    W = _w((16, 32), 1)
    lin = bnb.nn.Linear8bitLt(32, 16, bias=False, has_fp16_weights=False)
    lin.weight = bnb.nn.Int8Params(torch.tensor(W), has_fp16_weights=False, requires_grad=False)
    lin.to(torch.float32)  # a dtype only: no device, no quantization
    assert lin.weight.dtype == ms.float32
    lin.to(torch.device("cpu"))
    w16 = W.astype(np.float16).astype(np.float32)  # upstream quantizes float32 weights through float16
    absmax = np.abs(w16).max(axis=1)
    np.testing.assert_array_equal(lin.weight.SCB.asnumpy(), absmax.astype(np.float32))
    np.testing.assert_array_equal(lin.weight.asnumpy(), np.rint(w16 * (127.0 / absmax[:, None])).astype(np.int8))


def test_embedding8bit_and_weight_only_to():
    emb = bnb.nn.Embedding8bit(10, 8)
    assert emb.weight.to("meta") is emb.weight and emb.weight.SCB is None
    emb.weight.to(device="cpu")
    assert emb.weight.dtype == ms.int8 and emb.weight.SCB is not None
    lin = bnb.nn.LinearWeightOnly(32, 8, bits=8)
    lin.to(torch.float32)
    assert not lin.is_quantized
    lin.to(torch.device("cpu"))
    assert lin.is_quantized and lin.weight.dtype == ms.int8

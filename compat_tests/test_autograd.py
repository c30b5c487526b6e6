"""Port of upstream bitsandbytes tests/test_autograd.py::test_matmullt (MIT license, bitsandbytes-foundation).
Forced changes are marked `# PORT:`. `torch` is mindtorch (compat_tests/conftest.py imports mindnlp first)."""

import numpy as np  # PORT: reference math for bf16 (MindSpore CPU matmul has no bf16)
import pytest
import torch

import mindspore as ms  # PORT: gradients come from mindspore.value_and_grad (loss.backward() is a no-op)

import bitsandbytes_ms as bnb  # PORT: was `import bitsandbytes as bnb`
from bitsandbytes_ms._ops import tag as tag_device  # PORT: see the gradient comparison
from helpers import (  # PORT: was `from tests.helpers import`
    BOOLEAN_TRIPLES,
    TRUE_FALSE,
    describe_dtype,
    get_available_devices,
    id_formatter,
)

TRANSPOSE_VALS = [(False, True), (False, False)]
REQ_GRAD_NO_B_WEIGHT = [flags for flags in BOOLEAN_TRIPLES if not flags[1]]


def _ref_matmul(a, b):
    # PORT: torch.matmul on CPU rejects bf16 under MindSpore; compute in fp32 and round to the input dtype
    return torch.matmul(a.float(), b.float()).to(a.dtype)


@pytest.mark.parametrize("device", get_available_devices())
@pytest.mark.parametrize("dim1", [40], ids=id_formatter("dim1"))
@pytest.mark.parametrize("dim2", [64, 0], ids=id_formatter("dim2"))
@pytest.mark.parametrize("dim3", [32], ids=id_formatter("dim3"))
@pytest.mark.parametrize("dim4", [48], ids=id_formatter("dim4"))
@pytest.mark.parametrize("decomp", [0.0, 6.0], ids=id_formatter("decomp"))
@pytest.mark.parametrize("funcs", [(_ref_matmul, bnb.matmul)], ids=["func=matmul"])  # PORT: see _ref_matmul
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=describe_dtype)
@pytest.mark.parametrize("req_grad", REQ_GRAD_NO_B_WEIGHT, ids=id_formatter("req_grad"))
@pytest.mark.parametrize("transpose", TRANSPOSE_VALS, ids=id_formatter("transpose"))
@pytest.mark.parametrize("has_fp16_weights", TRUE_FALSE, ids=id_formatter("has_fp16_weights"))
@pytest.mark.parametrize("has_bias", TRUE_FALSE, ids=id_formatter("has_bias"))
def test_matmullt(
    device, dim1, dim2, dim3, dim4, funcs, dtype, req_grad, transpose, decomp, has_fp16_weights, has_bias
):
    dimA = (dim2, dim3) if not transpose[0] else (dim3, dim2)
    dimB = (dim3, dim4) if not transpose[1] else (dim4, dim3)
    # PORT: torch.randint(..., device=) -> seeded numpy (mindtorch's randint ignores the seed)
    outlier_dim = np.random.randint(0, dimA[1], size=(dimA[1] // 8,))
    if has_bias == False:
        req_grad = list(req_grad)
        req_grad[2] = False

    # PORT: torch.randn(size=...) -> torch.randn(*shape) (the seeded randn of conftest takes positional sizes)
    for i in range(3):
        A = torch.randn(*dimA, device=device, requires_grad=req_grad[0], dtype=dtype)
        if decomp == 6.0:
            # PORT: in-place column assignment through numpy (writes into views are copies in mindtorch)
            a = A.float().numpy().copy()
            a[:, outlier_dim] = 6.0
            A = torch.tensor(a).to(dtype)
        B = torch.randn(*dimB, device=device, requires_grad=req_grad[1], dtype=dtype)
        target = torch.randn(dim2, dim4, device=device, requires_grad=req_grad[1], dtype=dtype)
        bias = None
        bias2 = None
        if has_bias:
            bias = torch.randn(dim4, device=device, dtype=dtype, requires_grad=req_grad[2])
            bias2 = torch.tensor(bias.float().numpy()).to(dtype)  # PORT: clone() of bf16 fails on CPU
        # PORT: torch.nn.init.xavier_uniform_(B) on bf16 is not available on CPU; same distribution via numpy
        bound = float(np.sqrt(6.0 / (dimB[0] + dimB[1])))
        B = torch.tensor(np.random.uniform(-bound, bound, dimB).astype(np.float32)).to(dtype)
        B2 = torch.tensor(B.float().numpy()).to(dtype)  # PORT: clone() of bf16 fails on CPU

        state = bnb.MatmulLtState()
        state.threshold = decomp
        state.has_fp16_weights = has_fp16_weights
        if not has_fp16_weights:
            if not transpose[0] and not transpose[1]:
                B2 = B2.t().contiguous()
            state.CB, state.SCB, _ = bnb.functional.int8_vectorwise_quant(B2.to(torch.float16))
            B2 = state.CB

        if not transpose[0] and transpose[1]:
            out_torch = funcs[0](A, B.t())
            out_bnb = funcs[1](A, B2, state=state, bias=bias2)
            B2_arg = B2
        elif not transpose[0] and not transpose[1]:
            out_torch = funcs[0](A, B)
            out_bnb = funcs[1](A, B2.t(), state=state, bias=bias2)
            B2_arg = B2.t()
        if has_bias:
            # PORT: bf16 add fails on CPU: matmul + bias in fp32, rounded once to `dtype` (as loss_torch below)
            Bm = B.t() if transpose[1] else B
            out_torch = (torch.matmul(A.float(), Bm.float()) + bias.float()).to(dtype)

        assert out_bnb.dtype == A.dtype, f"bnb matmullt received {A.dtype} but returned {out_bnb.dtype}"

        n = out_bnb.numel()
        idx = torch.isclose(out_bnb.float(), out_torch.float(), atol=0.01, rtol=0.1)  # PORT: .float() (bf16 compare)
        assert (idx == 0).sum().item() <= n * (0.0175 if dtype == torch.float16 else 0.021)
        idx = torch.isclose(out_bnb.float(), out_torch.float(), atol=0.035, rtol=0.2)
        assert (idx == 0).sum().item() <= n * 0.001

        if has_fp16_weights:
            if any(req_grad) and n:
                # PORT: upstream copies out_torch into out_bnb.data and calls loss.backward(). Here the same
                # loss is differentiated with mindspore.value_and_grad: bnb's output with its value replaced
                # by out_torch (stop_gradient trick), so both losses see the same upstream gradient.
                # (plain mindspore.ops inside the differentiated functions: mindtorch's Tensor methods
                # need a `_device` that MindSpore's autograd does not attach to intermediate results)
                P = ms.ops
                ot = P.stop_gradient(P.cast(out_torch, ms.float32))
                tgt = P.cast(target, ms.float32)
                Bref = P.cast(B.t() if transpose[1] else B, ms.float32)

                def loss_bnb(A_, bias_):
                    o = P.cast(bnb.matmul(A_, B2_arg, state=state, bias=bias_), ms.float32)
                    o = P.add(P.sub(o, P.stop_gradient(o)), ot)
                    return P.mean(P.square(P.sub(o, tgt)))

                def loss_torch(A_, bias_):
                    o = P.matmul(P.cast(A_, ms.float32), Bref)
                    if bias_ is not None:
                        o = P.add(o, P.cast(bias_, ms.float32))
                    o = P.cast(P.cast(o, dtype), ms.float32)  # upstream's out_torch is in `dtype` (grads pass through it)
                    return P.mean(P.square(P.sub(o, tgt)))

                pos = (0, 1) if has_bias else (0,)
                g1 = ms.value_and_grad(loss_bnb, grad_position=pos)(A, bias2 if has_bias else None)[1]
                g2 = ms.value_and_grad(loss_torch, grad_position=pos)(A, bias if has_bias else None)[1]
                if not has_bias:
                    g1, g2 = (g1,), (g2,)
                # PORT: results of MindSpore autograd carry no mindtorch device; compare as tagged fp32 (the
                # torch gradients rounded to the input dtype first, as upstream's are computed in it)
                def f32(t, round_to=None):
                    t = P.cast(P.cast(t, round_to), ms.float32) if round_to is not None else P.cast(t, ms.float32)
                    tag_device(t)
                    return t

                if req_grad[0]:
                    torch.testing.assert_close(f32(g1[0]), f32(g2[0], dtype), atol=0.015, rtol=0.1)
                if req_grad[2] and req_grad[0]:
                    # PORT: IsClose has no bf16 CPU kernel: compare the dtype-rounded values in fp32 with
                    # assert_close's default tolerances for `dtype`
                    tol = {torch.float16: (1e-5, 1e-3), torch.bfloat16: (1e-5, 1.6e-2), torch.float32: (1e-5, 1.3e-6)}[dtype]
                    torch.testing.assert_close(f32(g1[1], dtype), f32(g2[1], dtype), atol=tol[0], rtol=tol[1])

"""Port of upstream bitsandbytes' tests/test_optim.py (MIT license, bitsandbytes-foundation).

Only what the port forces is changed; each change is marked `# PORT:`. `torch` is MindSpore NLP's
torch API (mindtorch; compat_tests/conftest.py imports mindnlp first and seeds torch.randn/rand).
The main forced change: torch.optim (and lion_pytorch) cannot step on mindtorch's CPU, so the
comparison optimizers are `_RefOptim`, a small numpy implementation of the same update rules
(torch.optim.Adam/AdamW/SGD/RMSprop, lion_pytorch.Lion, upstream's _ReferenceAdEMAMix and
PytorchLARS), written in float32 with torch's operation order. Large shapes are marked slow so the
CI set of this file stays short on 2 CPU cores.
"""

import io
import math
import sys
import time

import numpy as np  # PORT: for the numpy reference optimizers
import pytest
import torch

import bitsandbytes_ms as bnb  # PORT: was `import bitsandbytes as bnb`
import bitsandbytes_ms.functional as F  # PORT: was `import bitsandbytes.functional as F`
from helpers import describe_dtype, get_available_devices, id_formatter  # PORT: was `from tests.helpers import`

# import apex

k = 20


# PORT: upstream imports `sync_gpu` from bitsandbytes.utils; on CPU there is nothing to synchronize.
def sync_gpu(t):
    pass


# PORT: torch.optim.{Adam,AdamW,SGD,RMSprop} have no CPU kernels on mindtorch and lion_pytorch is a
# real-torch package; this numpy class implements the same per-element rules (float32 arithmetic in
# torch's order) and exposes torch-style `state[p][name]` tensors and `step()` reading `p.grad`.
def _np(t):
    t = t.float() if t.dtype != torch.float32 else t
    return np.array(t.asnumpy(), dtype=np.float32)


def _clone(t):  # PORT: clone through a float32 cast (mindtorch's CPU clone fails for bf16)
    return t.float().to(t.dtype) if t.dtype == torch.bfloat16 else t.clone()


def _to_torch(a):
    return torch.tensor(np.ascontiguousarray(a, dtype=np.float32))


class _RefOptim:
    def __init__(self, params, rule, lr, betas=(), eps=1e-8, weight_decay=0.0, alpha=0.0, t_alpha=None,
                 t_beta3=None, momentum=0.0, max_unorm=0.0):
        self.params = list(params)
        self.rule, self.lr, self.betas, self.eps, self.wd = rule, lr, betas, eps, weight_decay
        self.alpha, self.t_alpha, self.t_beta3 = alpha, t_alpha, t_beta3
        self.momentum, self.max_unorm = momentum, max_unorm
        self.state = {}
        self.step_count = 0

    def step(self):
        self.step_count += 1
        t = self.step_count
        f = np.float32
        for p in self.params:
            if getattr(p, "grad", None) is None:
                continue
            g, x = _np(p.grad), _np(p)
            st = self.state.setdefault(p, {})
            lr = self.lr
            if self.rule in ("adam", "adamw"):
                b1, b2 = self.betas
                if not st:
                    st["exp_avg"], st["exp_avg_sq"] = _to_torch(np.zeros_like(x)), _to_torch(np.zeros_like(x))
                m, v = _np(st["exp_avg"]), _np(st["exp_avg_sq"])
                if self.rule == "adamw":
                    x = x * f(1 - lr * self.wd)
                m = m + (g - m) * f(1 - b1)  # lerp_
                v = v * f(b2) + g * g * f(1 - b2)
                bc1, bc2 = 1 - b1**t, 1 - b2**t
                denom = np.sqrt(v) / f(math.sqrt(bc2)) + f(self.eps)
                x = x + f(-lr / bc1) * (m / denom)
                st["exp_avg"], st["exp_avg_sq"] = _to_torch(m), _to_torch(v)
            elif self.rule == "lion":
                b1, b2 = self.betas
                if not st:
                    st["exp_avg"] = _to_torch(np.zeros_like(x))
                m = _np(st["exp_avg"])
                x = x * f(1 - lr * self.wd)
                u = np.sign(m * f(b1) + g * f(1 - b1)).astype(np.float32)
                x = x + u * f(-lr)
                m = m * f(b2) + g * f(1 - b2)
                st["exp_avg"] = _to_torch(m)
            elif self.rule in ("momentum", "lars"):
                d = g + x * f(self.wd) if self.wd else g
                if "momentum_buffer" not in st:
                    buf = d.copy()
                else:
                    buf = _np(st["momentum_buffer"]) * f(self.momentum) + d
                scale = 1.0
                if self.max_unorm > 0.0:
                    pnorm, unorm = np.linalg.norm(x), np.linalg.norm(buf)
                    if unorm > self.max_unorm * pnorm:
                        scale = self.max_unorm * pnorm / unorm
                x = x + buf * f(-lr * scale)
                st["momentum_buffer"] = _to_torch(buf)
            elif self.rule == "rmsprop":
                a = self.alpha
                if not st:
                    st["square_avg"] = _to_torch(np.zeros_like(x))
                s = _np(st["square_avg"]) * f(a) + g * g * f(1 - a)
                x = x + f(-lr) * (g / (np.sqrt(s) + f(self.eps)))
                st["square_avg"] = _to_torch(s)
            elif self.rule == "ademamix":
                b1, b2, b3 = self.betas
                alpha = self.alpha
                if not st:
                    st["m1_m2"], st["nu"] = _to_torch(np.zeros((2,) + x.shape, np.float32)), _to_torch(np.zeros_like(x))
                mm, nu = _np(st["m1_m2"]), _np(st["nu"])
                m1, m2 = mm[0], mm[1]
                if self.t_alpha is not None:
                    alpha = min(t * alpha / self.t_alpha, alpha)
                if self.t_beta3 is not None:
                    ln1, ln3 = math.log(b1), math.log(b3)
                    sc = t / self.t_beta3
                    b3 = min(math.exp((ln1 * ln3) / (((1 - sc) * ln3) + (sc * ln1))), b3)
                m1 = m1 * f(b1) + g * f(1 - b1)
                m2 = m2 * f(b3) + g * f(1 - b3)
                nu = nu * f(b2) + g * g * f(1 - b2)
                denom = np.sqrt(nu) / f((1 - b2**t) ** 0.5) + f(self.eps)
                update = (m1 / f(1 - b1**t) + f(alpha) * m2) / denom
                update = update + x * f(self.wd)
                x = x + f(-lr) * update
                st["m1_m2"], st["nu"] = _to_torch(np.stack((m1, m2))), _to_torch(nu)
            else:
                raise ValueError(self.rule)
            p.assign_value(_to_torch(x).to(p.dtype))


def _torch_adam(pxx):  # PORT: torch.optim.Adam defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8)
    return _RefOptim(pxx, "adam", 1e-3, (0.9, 0.999))


def _torch_adamw(pxx):  # PORT: torch.optim.AdamW defaults (weight_decay 1e-2)
    return _RefOptim(pxx, "adamw", 1e-3, (0.9, 0.999), weight_decay=1e-2)


def Lion(pxx, weight_decay=0.0):  # PORT: lion_pytorch.Lion defaults (lr 1e-4, betas (0.9, 0.99))
    return _RefOptim(pxx, "lion", 1e-4, (0.9, 0.99), weight_decay=weight_decay)


def _torch_sgd(pxx, lr, momentum):  # PORT: torch.optim.SGD(pxx, lr, momentum)
    return _RefOptim(pxx, "momentum", lr, momentum=momentum)


def _torch_rmsprop(pxx, lr, alpha):  # PORT: torch.optim.RMSprop(pxx, lr, alpha), eps 1e-8
    return _RefOptim(pxx, "rmsprop", lr, alpha=alpha, eps=1e-8)


def _ReferenceAdEMAMix(pxx, t_alpha=None, t_beta3=None):  # PORT: upstream's _ReferenceAdEMAMix defaults
    return _RefOptim(pxx, "ademamix", 1e-3, (0.9, 0.999, 0.9999), alpha=5.0, weight_decay=1e-2, t_alpha=t_alpha,
                     t_beta3=t_beta3)


def _PytorchLARS(pxx, lr, momentum):  # PORT: upstream's PytorchLARS (max_unorm 0.02 default)
    return _RefOptim(pxx, "lars", lr, momentum=momentum, max_unorm=0.02)


def assert_most_approx_close(a, b, rtol=1e-3, atol=1e-3, max_error_count=0):
    idx = torch.isclose(a, b, rtol=rtol, atol=atol)
    error_count = (idx == 0).sum().item()
    if error_count > max_error_count:
        print(f"Too many values not close: assert {error_count} < {max_error_count}")
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


str2optimizers = {}

## TODO: maybe remove these three.
str2optimizers["adam_pytorch"] = (None, _torch_adam, bnb.optim.Adam)  # PORT: numpy reference
str2optimizers["lion_pytorch"] = (None, Lion, bnb.optim.Lion)
str2optimizers["momentum_pytorch"] = (
    None,
    lambda pxx: _torch_sgd(pxx, 0.01, 0.9),  # PORT: numpy reference
    bnb.optim.Adam,
)

str2optimizers["adam"] = (_torch_adam,  # PORT: numpy reference
    bnb.optim.Adam)
str2optimizers["adam8bit_blockwise"] = (_torch_adam,  # PORT: numpy reference
    lambda pxx: bnb.optim.Adam8bit(pxx))
str2optimizers["paged_adam"] = (_torch_adam,  # PORT: numpy reference
    bnb.optim.PagedAdam)
str2optimizers["paged_adamw"] = (_torch_adamw,  # PORT: numpy reference
    bnb.optim.PagedAdamW)
str2optimizers["paged_adam8bit_blockwise"] = (
    _torch_adam,  # PORT: numpy reference
    lambda pxx: bnb.optim.PagedAdam8bit(pxx),
)
str2optimizers["paged_adamw8bit_blockwise"] = (
    _torch_adamw,  # PORT: numpy reference
    lambda pxx: bnb.optim.PagedAdamW8bit(pxx),
)

str2optimizers["ademamix"] = (_ReferenceAdEMAMix, bnb.optim.AdEMAMix)
str2optimizers["ademamix8bit_blockwise"] = (
    _ReferenceAdEMAMix,
    lambda pxx: bnb.optim.AdEMAMix8bit(pxx),
)
str2optimizers["paged_ademamix"] = (_ReferenceAdEMAMix, bnb.optim.PagedAdEMAMix)
str2optimizers["paged_ademamix8bit_blockwise"] = (
    _ReferenceAdEMAMix,
    lambda pxx: bnb.optim.PagedAdEMAMix8bit(pxx),
)
str2optimizers["ademamix_scheduled"] = (
    lambda pxx: _ReferenceAdEMAMix(pxx, t_alpha=k, t_beta3=k),
    lambda pxx: bnb.optim.AdEMAMix(pxx, t_alpha=k, t_beta3=k),
)
str2optimizers["paged_ademamix_scheduled"] = (
    lambda pxx: _ReferenceAdEMAMix(pxx, t_alpha=k, t_beta3=k),
    lambda pxx: bnb.optim.PagedAdEMAMix(pxx, t_alpha=k, t_beta3=k),
)
str2optimizers["ademamix8bit_blockwise_scheduled"] = (
    lambda pxx: _ReferenceAdEMAMix(pxx, t_alpha=100, t_beta3=100),
    lambda pxx: bnb.optim.AdEMAMix8bit(pxx, t_alpha=100, t_beta3=100),
)
str2optimizers["paged_ademamix8bit_blockwise_scheduled"] = (
    lambda pxx: _ReferenceAdEMAMix(pxx, t_alpha=100, t_beta3=100),
    lambda pxx: bnb.optim.PagedAdEMAMix8bit(pxx, t_alpha=100, t_beta3=100),
)

str2optimizers["lion"] = (Lion, bnb.optim.Lion)
str2optimizers["paged_lion"] = (Lion, bnb.optim.PagedLion)
str2optimizers["lion8bit_blockwise"] = (Lion, lambda pxx: bnb.optim.Lion8bit(pxx))
str2optimizers["paged_lion8bit_blockwise"] = (Lion, lambda pxx: bnb.optim.PagedLion8bit(pxx))

str2optimizers["momentum"] = (
    lambda pxx: _torch_sgd(pxx, 0.01, 0.9),  # PORT: numpy reference
    lambda pxx: bnb.optim.SGD(pxx, 0.01, 0.9),
)
str2optimizers["momentum8bit_blockwise"] = (
    lambda pxx: _torch_sgd(pxx, 0.01, 0.9),  # PORT: numpy reference
    lambda pxx: bnb.optim.SGD8bit(pxx, 0.01, 0.9),
)

str2optimizers["lars"] = (
    lambda pxx: _PytorchLARS(pxx, 0.01, 0.9),  # PORT: numpy reference
    lambda pxx: bnb.optim.LARS(pxx, 0.01, 0.9),
)

str2optimizers["rmsprop"] = (
    lambda pxx: _torch_rmsprop(pxx, 0.01, 0.9),  # PORT: numpy reference
    lambda pxx: bnb.optim.RMSprop(pxx, 0.01, 0.9),
)
str2optimizers["rmsprop8bit_blockwise"] = (
    lambda pxx: _torch_rmsprop(pxx, 0.01, 0.9),  # PORT: numpy reference
    lambda pxx: bnb.optim.RMSprop8bit(pxx, 0.01, 0.9),
)

str2statenames = {}
str2statenames["adam"] = [("exp_avg", "state1"), ("exp_avg_sq", "state2")]
str2statenames["paged_adamw"] = [("exp_avg", "state1"), ("exp_avg_sq", "state2")]
str2statenames["paged_adam"] = [("exp_avg", "state1"), ("exp_avg_sq", "state2")]
str2statenames["lion"] = [("exp_avg", "state1")]
str2statenames["paged_lion"] = [("exp_avg", "state1")]
str2statenames["momentum"] = [("momentum_buffer", "state1")]
str2statenames["lars"] = [("momentum_buffer", "state1")]
str2statenames["lamb"] = [("exp_avg", "state1"), ("exp_avg_sq", "state2")]
str2statenames["rmsprop"] = [("square_avg", "state1")]

str2statenames["adam8bit_blockwise"] = [
    ("exp_avg", "state1", "qmap1", "absmax1"),
    ("exp_avg_sq", "state2", "qmap2", "absmax2"),
]
str2statenames["paged_adam8bit_blockwise"] = [
    ("exp_avg", "state1", "qmap1", "absmax1"),
    ("exp_avg_sq", "state2", "qmap2", "absmax2"),
]
str2statenames["paged_adamw8bit_blockwise"] = [
    ("exp_avg", "state1", "qmap1", "absmax1"),
    ("exp_avg_sq", "state2", "qmap2", "absmax2"),
]

str2statenames["momentum8bit_blockwise"] = [("momentum_buffer", "state1", "qmap1", "absmax1")]
str2statenames["rmsprop8bit_blockwise"] = [("square_avg", "state1", "qmap1", "absmax1")]
str2statenames["lion8bit_blockwise"] = [("exp_avg", "state1", "qmap1", "absmax1")]
str2statenames["paged_lion8bit_blockwise"] = [("exp_avg", "state1", "qmap1", "absmax1")]

str2statenames["ademamix"] = str2statenames["ademamix_scheduled"] = [("m1_m2", "state1"), ("nu", "state2")]
str2statenames["paged_ademamix"] = str2statenames["paged_ademamix_scheduled"] = [("m1_m2", "state1"), ("nu", "state2")]
str2statenames["ademamix8bit_blockwise"] = str2statenames["ademamix8bit_blockwise_scheduled"] = [
    ("m1_m2", "state1", "qmap1", "absmax1"),
    ("nu", "state2", "qmap2", "absmax2"),
]
str2statenames["paged_ademamix8bit_blockwise"] = [
    ("m1_m2", "state1", "qmap1", "absmax1"),
    ("nu", "state2", "qmap2", "absmax2"),
]

optimizer_names_32bit = [
    "adam",
    "paged_adamw",
    "paged_adam",
    "momentum",
    "lars",
    "rmsprop",
    "lion",
    "paged_lion",
    "ademamix",
    "ademamix_scheduled",
    "paged_ademamix",
    "paged_ademamix_scheduled",
]


@pytest.mark.parametrize("optim_name", optimizer_names_32bit, ids=id_formatter("opt"))
@pytest.mark.parametrize("gtype", [torch.float32, torch.float16, torch.bfloat16], ids=describe_dtype)
@pytest.mark.parametrize("dim1", [1024], ids=id_formatter("dim1"))
# PORT: 1024x1024 and 1024x4097 marked slow (numpy reference on 2 CPU cores)
@pytest.mark.parametrize("dim2", [32, pytest.param(1024, marks=pytest.mark.slow), pytest.param(4097, marks=pytest.mark.slow), 1], ids=id_formatter("dim2"))
@pytest.mark.parametrize("device", get_available_devices(), ids=id_formatter("device"))
def test_optimizer32bit(dim1, dim2, gtype, optim_name, device):
    # PORT: the paged optimizers run on CPU too (no unified memory: their state is host memory, as the unpaged ones'),
    # so they are checked against the same references rather than skipped

    if optim_name.startswith("paged_") and sys.platform == "win32":
        pytest.skip("Paged optimizers can have issues on Windows.")

    if gtype == torch.bfloat16 and optim_name in ["momentum", "lars", "rmsprop"]:
        # PORT: upstream skips these without a reason (it has no bf16 32-bit kernels for them); kept, reason added
        pytest.skip("upstream has no bf16 32-bit momentum/lars/rmsprop kernels to compare against")
    if dim1 == 1 and dim2 == 1:
        return
    p1 = (torch.randn(dim1, dim2, device=device) * 0.1).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
    p2 = _clone(p1)  # PORT: mindtorch's clone of a bf16 tensor fails on CPU (no bf16 Mul)
    p1 = p1.float()

    torch_optimizer = str2optimizers[optim_name][0]([p1])
    bnb_optimizer = str2optimizers[optim_name][1]([p2])

    if gtype == torch.float32:
        atol, rtol = 1e-6, 1e-5
    elif gtype == torch.bfloat16:
        atol, rtol = 1e-3, 1e-2
    else:
        atol, rtol = 1e-4, 1e-3

    for i in range(k):
        g = (torch.randn(dim1, dim2, device=device) * 0.01).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
        p1.grad = g.float()  # PORT: bf16 clone
        p2.grad = _clone(g)  # PORT: bf16 clone

        bnb_optimizer.step()
        torch_optimizer.step()

        for name1, name2 in str2statenames[optim_name]:
            torch.testing.assert_close(
                torch_optimizer.state[p1][name1],
                bnb_optimizer.state[p2][name2].to(device),
                atol=atol,
                rtol=rtol,
            )

        # since Lion can have pretty noisy updates where things lie at the boundary
        # allow up to 15 errors for Lion
        assert_most_approx_close(p1, p2.float(), atol=atol, rtol=rtol, max_error_count=15)

        if i % (k // 5) == 0 and i > 0:
            buf = io.BytesIO()
            torch.save(bnb_optimizer.state_dict(), buf)
            del bnb_optimizer
            bnb_optimizer = None
            bnb_optimizer = str2optimizers[optim_name][1]([p2])
            buf.seek(0)
            bnb_optimizer.load_state_dict(torch.load(buf))
            # since Lion can have pretty noisy updates where things lie at the boundary
            # allow up to 10 errors for Lion
            assert_most_approx_close(p1, p2.float(), atol=atol, rtol=rtol, max_error_count=10)
            for name1, name2 in str2statenames[optim_name]:
                # since Lion can have pretty noisy updates where things lie at the boundary
                # allow up to 10 errors for Lion
                assert_most_approx_close(
                    torch_optimizer.state[p1][name1],
                    bnb_optimizer.state[p2][name2],
                    atol=atol,
                    rtol=rtol,
                    max_error_count=10,
                )

        if gtype != torch.float32:
            # the adam buffers should also be close because they are 32-bit
            # but the parameters can diverge because they are 16-bit
            # the difference grow larger and larger with each update
            # --> copy the state to keep weights close
            p1.data = p1.data.to(p2.dtype).float()
            p2.copy_(p1.data)
            torch.testing.assert_close(p1.to(p2.dtype).float(), p2.float())  # PORT: no bf16 IsClose on CPU; same values
        if optim_name in ["lars", "lamb"]:
            assert bnb_optimizer.state[p2]["unorm_vec"] > 0.0


@pytest.mark.parametrize("gtype", [torch.float32, torch.float16, torch.bfloat16], ids=describe_dtype)
@pytest.mark.parametrize("dim1", [1024], ids=id_formatter("dim1"))
# PORT: 1024x1024 marked slow
@pytest.mark.parametrize("dim2", [32, pytest.param(1024, marks=pytest.mark.slow)], ids=id_formatter("dim2"))
@pytest.mark.parametrize("device", get_available_devices(), ids=id_formatter("device"))
def test_lion32bit_weight_decay(dim1, dim2, gtype, device):
    """Lion must use *decoupled* weight decay (p *= 1 - lr*wd), matching the Lion paper
    and the lion_pytorch reference.

    Regression test for a coupled-vs-decoupled weight-decay bug: the shared 32-bit
    optimizer path (used by the `default` backend, i.e. MPS and any device without a
    dedicated kernel) folded weight decay into the gradient (coupled L2) for Lion, which
    corrupts the sign update. The existing test_optimizer32bit never caught it because it
    constructs optimizers with the default weight_decay=0, where the two forms coincide.
    """
    weight_decay = 0.1

    p1 = (torch.randn(dim1, dim2, device=device) * 0.1).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
    p2 = _clone(p1)  # PORT: mindtorch's clone of a bf16 tensor fails on CPU (no bf16 Mul)
    p1 = p1.float()

    torch_optimizer = Lion([p1], weight_decay=weight_decay)
    bnb_optimizer = bnb.optim.Lion([p2], weight_decay=weight_decay)

    if gtype == torch.float32:
        atol, rtol = 1e-6, 1e-5
    elif gtype == torch.bfloat16:
        atol, rtol = 1e-3, 1e-2
    else:
        atol, rtol = 1e-4, 1e-3

    for i in range(k):
        g = (torch.randn(dim1, dim2, device=device) * 0.01).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
        p1.grad = g.float()  # PORT: bf16 clone
        p2.grad = _clone(g)  # PORT: bf16 clone

        bnb_optimizer.step()
        torch_optimizer.step()

        # Lion's sign update is noisy at boundaries, so allow a few mismatches (matches
        # the tolerance policy in test_optimizer32bit). Under the coupled-decay bug this
        # diverges far beyond the error budget; under the correct decoupled decay it holds.
        assert_most_approx_close(p1, p2.float(), atol=atol, rtol=rtol, max_error_count=15)

        if gtype != torch.float32:
            # keep 16-bit params from drifting apart across steps (see test_optimizer32bit)
            p1.data = p1.data.to(p2.dtype).float()
            p2.copy_(p1.data)


@pytest.mark.parametrize("dim1", [1024], ids=id_formatter("dim1"))
@pytest.mark.parametrize("dim2", [32, 1024, 4097], ids=id_formatter("dim2"))
@pytest.mark.parametrize("gtype", [torch.float32, torch.float16], ids=describe_dtype)
@pytest.mark.parametrize("device", get_available_devices())
@pytest.mark.skipif(not get_available_devices(), reason="No device")
def test_global_config(dim1, dim2, gtype, device):
    if dim1 == 1 and dim2 == 1:
        return
    p1 = (torch.randn(dim1, dim2, device="cpu") * 0.1).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
    p2 = (torch.randn(dim1, dim2, device="cpu") * 0.1).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
    p3 = (torch.randn(dim1, dim2, device="cpu") * 0.1).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
    mask = torch.rand_like(p2) < 0.1
    beta1 = 0.9
    beta2 = 0.999
    lr = 0.001
    eps = 1e-8

    bnb.optim.GlobalOptimManager.get_instance().initialize()
    bnb.optim.GlobalOptimManager.get_instance().override_config(p3, "optim_bits", 8)

    bnb.optim.GlobalOptimManager.get_instance().register_parameters([p1, p2, p3])
    p1 = p1.to(device)
    p2 = p2.to(device)
    p3 = p3.to(device)

    adam2 = bnb.optim.Adam([p1, p2, p3], lr, (beta1, beta2), eps)

    if gtype == torch.float32:
        atol, rtol = 1e-6, 1e-5
    else:
        atol, rtol = 1e-4, 1e-3

    for i in range(50):
        g1 = (torch.randn(dim1, dim2, device=device) * 0.1 + 0.001).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
        g2 = (torch.randn(dim1, dim2, device=device) * 0.1 + 0.001).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
        g3 = (torch.randn(dim1, dim2, device=device) * 0.1 + 0.001).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
        p1.grad = g1
        p2.grad = g2
        p3.grad = g3

        adam2.step()

        assert adam2.state[p3]["state1"].dtype == torch.uint8
        assert adam2.state[p3]["state2"].dtype == torch.uint8


@pytest.mark.parametrize("device", get_available_devices())
@pytest.mark.skipif(not get_available_devices(), reason="No device")
def test_override_config_after_register(device):
    """Test that override_config works when called after register_parameters (issue #1269)."""

    mng = bnb.optim.GlobalOptimManager.get_instance()
    mng.initialize()

    p1 = torch.randn(64, 64, device="cpu") * 0.1
    p2 = torch.randn(64, 64, device="cpu") * 0.1

    # Register first, override second (the documented order)
    mng.register_parameters([p1, p2])
    p1 = p1.to(device)
    p2 = p2.to(device)

    # Override p2 to use 8-bit after register_parameters
    mng.override_config(p2, "optim_bits", 8)

    adam = bnb.optim.Adam([p1, p2], lr=0.001, optim_bits=32)

    # Run a step to trigger init_state
    p1.grad = torch.randn_like(p1) * 0.1
    p2.grad = torch.randn_like(p2) * 0.1
    adam.step()

    # p1 should be 32-bit, p2 should be 8-bit
    assert adam.state[p1]["state1"].dtype == torch.float32
    assert adam.state[p2]["state1"].dtype == torch.uint8


optimizer_names_8bit = [
    "adam8bit_blockwise",
    "lion8bit_blockwise",
    "momentum8bit_blockwise",
    "rmsprop8bit_blockwise",
    "ademamix8bit_blockwise",
    "ademamix8bit_blockwise_scheduled",
]


@pytest.mark.parametrize("optim_name", optimizer_names_8bit, ids=id_formatter("opt"))
@pytest.mark.parametrize("gtype", [torch.float32, torch.float16, torch.bfloat16], ids=describe_dtype)
# PORT: 1024x1024 and 1024x4097 marked slow (numpy reference on 2 CPU cores)
@pytest.mark.parametrize("dim2", [32, pytest.param(1024, marks=pytest.mark.slow), pytest.param(4097, marks=pytest.mark.slow)], ids=id_formatter("dim2"))
@pytest.mark.parametrize("dim1", [1024], ids=id_formatter("dim1"))
@pytest.mark.parametrize("device", get_available_devices())
def test_optimizer8bit(dim1, dim2, gtype, optim_name, device):
    # PORT: torch.set_printoptions(precision=6) removed (missing in mindtorch; printing only)

    if dim1 == 1 and dim2 == 1:
        return

    p1 = (torch.randn(dim1, dim2, device=device) * 0.1).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
    p2 = _clone(p1)  # PORT: mindtorch's clone of a bf16 tensor fails on CPU (no bf16 Mul)
    p1 = p1.float()
    blocksize = 256

    torch_optimizer = str2optimizers[optim_name][0]([p1])
    bnb_optimizer = str2optimizers[optim_name][1]([p2])

    if gtype == torch.float32:
        atol, rtol = 3e-3, 1e-3
        patol, prtol = 1e-5, 1e-3
    elif gtype == torch.bfloat16:
        atol, rtol = 3e-3, 1e-3
        patol, prtol = 1e-4, 1e-2
    else:
        atol, rtol = 3e-3, 1e-3
        patol, prtol = 1e-5, 1e-3

    errors = []
    relerrors = []

    for i in range(50):
        g = (torch.randn(dim1, dim2, device=device) * 0.01).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
        p1.grad = g.float()  # PORT: bf16 clone
        p2.grad = _clone(g)  # PORT: bf16 clone

        torch_optimizer.step()
        bnb_optimizer.step()

        # since Lion can have pretty noisy updates where things lie at the boundary
        # assert_most_approx_close(p1, p2.float(), patol, prtol, max_error_count=0)

        dequant_states = []
        for name1, name2, qmap, max_val in str2statenames[optim_name]:
            ## For AdEMAMix, we need to dequantize [p2][name2][0] and [p2][name2][1]
            ## separately and then stack them. The qmap is shared, but absmax is also stacked.
            if optim_name == "ademamix8bit_blockwise" and name1 == "m1_m2":
                m1 = F.dequantize_blockwise(
                    code=bnb_optimizer.state[p2][qmap],
                    absmax=bnb_optimizer.state[p2][max_val][0],
                    A=bnb_optimizer.state[p2][name2][0],
                    blocksize=blocksize,
                )
                m2 = F.dequantize_blockwise(
                    code=bnb_optimizer.state[p2][qmap],
                    absmax=bnb_optimizer.state[p2][max_val][1],
                    A=bnb_optimizer.state[p2][name2][1],
                    blocksize=blocksize,
                )

                s1 = torch.stack((m1, m2))
            else:
                s1 = F.dequantize_blockwise(
                    code=bnb_optimizer.state[p2][qmap],
                    absmax=bnb_optimizer.state[p2][max_val],
                    A=bnb_optimizer.state[p2][name2],
                    blocksize=blocksize,
                )

            num_not_close = torch.isclose(torch_optimizer.state[p1][name1], s1, atol=atol, rtol=rtol) == 0
            assert num_not_close.sum().item() < 20
            dequant_states.append(s1.clone())

        err = torch.abs(p1 - p2.float())  # PORT: explicit fp32 promotion (mindtorch CPU has no bf16 arithmetic)
        relerr = err / (torch.abs(p1) + 1e-9)
        if g.dtype == torch.bfloat16:
            assert err.mean() <= 0.00017
            assert relerr.mean() <= 0.0016
        else:
            assert err.mean() < 0.00006
            # Lion on CPU fp16 has slightly higher relative error due to sign-based updates at boundary
            relerr_the = (
                0.00062
                if (device == "cpu" and optim_name == "lion8bit_blockwise" and gtype == torch.float16)
                else 0.0006
            )
            assert relerr.mean() < relerr_the

        errors.append(err.mean().item())
        relerrors.append(relerr.mean().item())

        if i % 10 == 0 and i > 0:
            for (name1, name2, qmap, max_val), s in zip(str2statenames[optim_name], dequant_states):
                s1cpy = s.clone()
                raws1cpy = bnb_optimizer.state[p2][name2].clone()
                qmap1 = bnb_optimizer.state[p2][qmap].clone()

                buf = io.BytesIO()
                torch.save(bnb_optimizer.state_dict(), buf)
                del bnb_optimizer
                bnb_optimizer = None
                bnb_optimizer = str2optimizers[optim_name][1]([p2])
                buf.seek(0)
                bnb_optimizer.load_state_dict(torch.load(buf))
                torch.testing.assert_close(raws1cpy, bnb_optimizer.state[p2][name2])
                torch.testing.assert_close(qmap1, bnb_optimizer.state[p2][qmap])

                ## For AdEMAMix, we need to dequantize [p2][name2][0] and [p2][name2][1]
                ## separately and then stack them. The qmap is shared, but absmax is also stacked.
                if optim_name == "ademamix8bit_blockwise" and name1 == "m1_m2":
                    s1 = torch.stack(
                        (
                            F.dequantize_blockwise(
                                code=bnb_optimizer.state[p2][qmap],
                                absmax=bnb_optimizer.state[p2][max_val][0],
                                A=bnb_optimizer.state[p2][name2][0],
                                blocksize=blocksize,
                            ),
                            F.dequantize_blockwise(
                                code=bnb_optimizer.state[p2][qmap],
                                absmax=bnb_optimizer.state[p2][max_val][1],
                                A=bnb_optimizer.state[p2][name2][1],
                                blocksize=blocksize,
                            ),
                        )
                    )
                else:
                    s1 = F.dequantize_blockwise(
                        code=bnb_optimizer.state[p2][qmap],
                        absmax=bnb_optimizer.state[p2][max_val],
                        A=bnb_optimizer.state[p2][name2],
                        blocksize=blocksize,
                    )

                torch.testing.assert_close(s1cpy, s1)

                num_not_close = torch.isclose(torch_optimizer.state[p1][name1], s1, atol=atol, rtol=rtol) == 0
                assert num_not_close.sum().item() < 20

            # Lion can have pretty noisy updates where things lie at the boundary
            assert_most_approx_close(p1, p2.float(), patol, prtol, max_error_count=0)

        # the parameters diverge quickly. Here we keep them close
        # together so we can test against the Adam error
        p1.data = p1.data.to(gtype).float()
        p2.copy_(p1.data)
        torch.testing.assert_close(p1.to(gtype).float(), p2.float())  # PORT: no bf16 IsClose on CPU; same values
        for (name1, name2, qmap, max_val), s in zip(str2statenames[optim_name], dequant_states):
            torch_optimizer.state[p1][name1].copy_(s.data)


optimizer_names_benchmark = [
    "adam8bit_blockwise",
    "paged_adam8bit_blockwise",
    "ademamix8bit_blockwise",
    "paged_ademamix8bit_blockwise",
    "ademamix8bit_blockwise_scheduled",
    "paged_ademamix8bit_blockwise_scheduled",
    "lion8bit_blockwise",
    "paged_lion8bit_blockwise",
    "paged_ademamix8bit_blockwise",
]


@pytest.mark.parametrize("dim1", [4096], ids=id_formatter("dim1"))
@pytest.mark.parametrize("dim2", [4096], ids=id_formatter("dim2"))
@pytest.mark.parametrize("gtype", [torch.float32, torch.bfloat16, torch.float16], ids=describe_dtype)
@pytest.mark.parametrize("optim_name", optimizer_names_benchmark, ids=id_formatter("opt"))
@pytest.mark.benchmark
@pytest.mark.slow  # PORT: a benchmark (prints timings, asserts nothing); excluded from the CI set
@pytest.mark.parametrize("device", get_available_devices())  # PORT: upstream gets `device` from its conftest
def test_benchmark_blockwise(dim1, dim2, gtype, optim_name, device):
    if dim1 == 1 and dim2 == 1:
        return
    p1 = (torch.randn(dim1, dim2, device=device) * 0.1).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32

    bnb_optimizer = str2optimizers[optim_name][1]([p1])

    g = (torch.randn(dim1, dim2, device=device) * 0.01).to(gtype)  # PORT: mindtorch CPU has no bf16 Mul; scale in fp32
    p1.grad = g
    total_steps = 50  # PORT: was 500 (2 CPU cores)
    for i in range(total_steps):
        if i == total_steps // 5:
            # 100 iterations for burn-in
            sync_gpu(p1)
            t0 = time.time()

        bnb_optimizer.step()

    sync_gpu(p1)
    s = time.time() - t0
    print("")
    params = (total_steps - total_steps // 5) * dim1 * dim2
    print(optim_name, gtype, s, params, s / params)
    # assert s < 3.9


ademamix_state_dict_opts = [
    ("AdEMAMix8bit", lambda p: bnb.optim.AdEMAMix8bit(p, lr=1e-3)),
    ("AdEMAMix32bit", lambda p: bnb.optim.AdEMAMix(p, lr=1e-3)),
    ("AdEMAMix8bit_scheduled", lambda p: bnb.optim.AdEMAMix8bit(p, lr=1e-3, t_alpha=100, t_beta3=100)),
    ("AdEMAMix32bit_scheduled", lambda p: bnb.optim.AdEMAMix(p, lr=1e-3, t_alpha=100, t_beta3=100)),
]


@pytest.mark.parametrize(
    "optim_name,optim_factory",
    ademamix_state_dict_opts,
    ids=[x[0] for x in ademamix_state_dict_opts],
)
@pytest.mark.parametrize("device", get_available_devices())
@pytest.mark.skipif(not get_available_devices(), reason="No device")
def test_ademamix_state_dict_no_nan(optim_name, optim_factory, device):
    """Test that AdEMAMix can save/load state_dict and continue training without NaN.

    Regression test for https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1382
    """

    import torch.nn as nn

    # PORT: mindtorch's loss.backward() is a no-op; gradients come from torch.autograd.value_and_grad
    # and are attached as p.grad (the bnb optimizer then reads p.grad as upstream's does).
    def backward(model, x):
        params = list(model.parameters())
        loss, grads = torch.autograd.value_and_grad(lambda inp: model(inp).sum(), params, attach_grads=False)(x)
        for p_, g_ in zip(params, grads):
            p_.grad = g_
        return loss

    torch.manual_seed(42)
    model = nn.Linear(256, 64).to(device)
    opt = optim_factory(model.parameters())

    # Train a few steps to populate optimizer state
    for _ in range(10):
        x = torch.randn(8, 256, device=device)
        loss = backward(model, x)  # PORT: was model(x).sum(); loss.backward()
        opt.step()
        opt.zero_grad()

    # Save state
    model_sd = {k: v.clone() for k, v in model.state_dict().items()}
    opt_sd = opt.state_dict()
    opt_buf = io.BytesIO()
    model_buf = io.BytesIO()
    torch.save(opt_sd, opt_buf)
    torch.save(model_sd, model_buf)

    # Create fresh model and optimizer, load state
    model2 = nn.Linear(256, 64).to(device)
    model_buf.seek(0)
    model2.load_state_dict(torch.load(model_buf))
    opt2 = optim_factory(model2.parameters())
    opt_buf.seek(0)
    opt2.load_state_dict(torch.load(opt_buf))

    # Verify loaded state matches original byte-for-byte
    orig_params = list(model.parameters())
    loaded_params = list(model2.parameters())
    for p_idx in range(len(orig_params)):
        s1 = opt.state[orig_params[p_idx]]
        s2 = opt2.state[loaded_params[p_idx]]
        for k in s1:
            if isinstance(s1[k], torch.Tensor):
                assert s1[k].shape == s2[k].shape, f"Shape mismatch for param {p_idx} {k}"
                assert s1[k].dtype == s2[k].dtype, f"Dtype mismatch for param {p_idx} {k}"
                torch.testing.assert_close(s1[k], s2[k])

    # Resume training and verify no NaN
    for i in range(10):
        x = torch.randn(8, 256, device=device)
        loss = backward(model2, x)  # PORT: was model2(x).sum() ... loss.backward()
        # PORT: torch.isnan/isinf have no mindtorch CPU kernel; checked through numpy
        assert not np.isnan(loss.asnumpy()), f"NaN loss at step {i} after loading state_dict"
        assert not np.isinf(loss.asnumpy()), f"Inf loss at step {i} after loading state_dict"
        opt2.step()
        opt2.zero_grad()

        # Check parameters for NaN/Inf after each step
        for p in model2.parameters():
            assert not np.isnan(p.asnumpy()).any(), f"NaN in parameters at step {i} after loading state_dict"  # PORT
            assert not np.isinf(p.asnumpy()).any(), f"Inf in parameters at step {i} after loading state_dict"  # PORT

    # Verify the original and loaded optimizers produce identical updates
    # from the same starting point (immediately after loading, before any divergence)
    torch.manual_seed(999)
    x_orig = torch.randn(8, 256, device=device)
    x_loaded = x_orig.clone()

    # Reset models to the saved checkpoint weights
    model.load_state_dict(model_sd)
    model2.load_state_dict(model_sd)

    # Reload optimizer states from the same checkpoint into two fresh optimizers
    opt_fresh = optim_factory(model.parameters())
    opt_fresh.load_state_dict(opt_sd)
    opt_fresh2 = optim_factory(model2.parameters())
    opt_fresh2.load_state_dict(opt_sd)

    loss_a = backward(model, x_orig)  # PORT: was model(x_orig).sum(); loss_a.backward()
    opt_fresh.step()
    opt_fresh.zero_grad()

    loss_b = backward(model2, x_loaded)  # PORT: was model2(x_loaded).sum(); loss_b.backward()
    opt_fresh2.step()
    opt_fresh2.zero_grad()

    for p_a, p_b in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(p_a, p_b)


@pytest.mark.parametrize("optim_cls", [bnb.optim.LAMB, bnb.optim.LAMB32bit], ids=id_formatter("opt"))
@pytest.mark.parametrize("max_unorm", [0.0, 0.5, 2.0], ids=id_formatter("max_unorm"))
def test_lamb_max_unorm_threaded_to_config(optim_cls, max_unorm):
    # The LAMB constructors accepted a `max_unorm` argument but passed a hardcoded 1.0
    # to the base optimizer, so the user value never reached the optimizer config.
    # (LAMB8bit rejects non-default values instead, since the 8-bit blockwise kernel
    # does not apply update-norm clipping; see test_lamb8bit_rejects_non_default_max_unorm.)
    p = [torch.nn.Parameter(torch.randn(8, 8))]
    opt = optim_cls(p, max_unorm=max_unorm)
    assert opt.args.max_unorm == max_unorm


def test_lamb_max_unorm_changes_update():
    # Behavioral regression: on the 32-bit LAMB path, `max_unorm` drives trust-ratio
    # clipping of the update. Before the fix the argument was ignored (always 1.0), so a
    # tight and a loose value produced identical updates. Runs on CPU, which implements
    # the 32-bit LAMB kernel.
    def one_step(max_unorm):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(128, 128))
        opt = bnb.optim.LAMB([p], lr=1e-1, max_unorm=max_unorm)
        p.grad = torch.randn(128, 128) * 5.0
        opt.step()
        return p.detach().clone()

    tight = one_step(1e-4)  # aggressive clipping
    loose = one_step(10.0)  # effectively no clipping
    assert not torch.allclose(tight, loose)


def test_lamb8bit_rejects_amsgrad():
    # amsgrad is unused by the base optimizer; mirror the Adam8bit/AdamW8bit guard (relates to #1261).
    p = [torch.nn.Parameter(torch.randn(8, 8))]
    with pytest.raises(ValueError):
        bnb.optim.LAMB8bit(p, amsgrad=True)
    # default (amsgrad=False) still constructs
    bnb.optim.LAMB8bit(p)


def test_lamb8bit_rejects_non_default_max_unorm():
    # The 8-bit blockwise update does not implement update-norm clipping, so a
    # non-default max_unorm would be silently ignored; reject it instead.
    p = [torch.nn.Parameter(torch.randn(8, 8))]
    with pytest.raises(ValueError):
        bnb.optim.LAMB8bit(p, max_unorm=0.5)
    with pytest.raises(ValueError):
        bnb.optim.LAMB8bit(p, max_unorm=0.0)
    # default (max_unorm=1.0) still constructs
    bnb.optim.LAMB8bit(p, max_unorm=1.0)


def test_adagrad8bit_rejects_non_8_optim_bits():
    # optim_bits is ignored (Adagrad8bit always uses 8-bit); guard invalid values (relates to #1261).
    p = [torch.nn.Parameter(torch.randn(8, 8))]
    with pytest.raises(ValueError):
        bnb.optim.Adagrad8bit(p, optim_bits=32)
    # default (optim_bits=8) still constructs
    bnb.optim.Adagrad8bit(p)

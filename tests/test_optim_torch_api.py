"""Issue 33: our optimizers are mindtorch `torch.optim.Optimizer`s (LR schedulers, transformers' schedules, state
dicts), and `loss.backward(); opt.step()` trains on mindtorch (registered patch `mindtorch-tensor-backward`) or
raises -- never a silent no-op."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()
import mindnlp  # noqa: E402,F401  (torch is mindtorch from here on)
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms.integrations.patches import registry  # noqa: E402

BACKWARD_PATCHES = ["mindtorch-module-call-tape", "mindtorch-tensor-backward"]


def _param(seed, shape=(64, 80)):
    rng = np.random.RandomState(seed)
    return torch.nn.Parameter(torch.tensor(rng.randn(*shape).astype(np.float32)))


def _grad(seed, shape=(64, 80)):
    return torch.tensor(np.random.RandomState(seed).randn(*shape).astype(np.float32) * 0.1)


@pytest.mark.parametrize("cls", [bnb.optim.AdamW8bit, bnb.optim.Adam, bnb.optim.PagedAdamW8bit, bnb.optim.Lion8bit,
                                 bnb.optim.SGD8bit, bnb.optim.AdEMAMix8bit, bnb.optim.LARS8bit, bnb.optim.PytorchLARS])
def test_is_torch_optimizer(cls):
    kw = {"momentum": 0.9} if cls in (bnb.optim.SGD8bit, bnb.optim.LARS8bit) else {}
    opt = cls([_param(0)], lr=1e-3, **kw)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups[0]["lr"] == 1e-3


def test_lambda_lr_drives_the_step_lr():
    p, q = _param(1), _param(1)
    opt = bnb.optim.AdamW8bit([p], lr=1e-2, min_8bit_size=0)
    ref = bnb.optim.AdamW8bit([q], lr=1e-2, min_8bit_size=0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: [0.5, 0.25, 0.0][min(s, 2)])
    lrs = []
    for step in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        ref.param_groups[0]["lr"] = lrs[-1]  # the same update with the lr set by hand
        opt.step(grads=[_grad(10 + step)])
        ref.step(grads=[_grad(10 + step)])
        sched.step()
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())
    assert lrs == [5e-3, 2.5e-3, 0.0]
    before = p.asnumpy().copy()
    opt.step(grads=[_grad(20)])  # lr 0 (weight decay scaled by lr too): the parameter does not move
    np.testing.assert_array_equal(p.asnumpy(), before)


def test_transformers_linear_schedule_with_warmup():
    from transformers import get_linear_schedule_with_warmup

    opt = bnb.optim.AdamW8bit([_param(2)], lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=6)
    lrs = []
    for step in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step(grads=[_grad(step)])
        sched.step()
    np.testing.assert_allclose(lrs, [0.0, 5e-4, 1e-3, 7.5e-4, 5e-4, 2.5e-4], rtol=1e-12)


def test_state_dict_round_trip_with_scheduler_and_groups():
    ps, qs = [_param(3), _param(4, (8,))], [_param(3), _param(4, (8,))]

    def make(params):
        opt = bnb.optim.AdamW8bit([{"params": [params[0]]}, {"params": [params[1]], "lr": 5e-3}], lr=1e-2)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))

    a, sa = make(ps)
    for step in range(2):
        a.step(grads=[_grad(30 + step), _grad(40 + step, (8,))])
        sa.step()
    b, sb = make(qs)
    for p, q in zip(ps, qs):
        q.assign_value(ms.Tensor(p.asnumpy().copy()))
    b.load_state_dict(a.state_dict())
    sb.load_state_dict(sa.state_dict())
    assert [g["lr"] for g in b.param_groups] == [g["lr"] for g in a.param_groups] == [1e-2 * (1.0 / 3), 5e-3 * (1.0 / 3)]
    for step in range(2):
        for opt, sch in ((a, sa), (b, sb)):
            opt.step(grads=[_grad(50 + step), _grad(60 + step, (8,))])
            sch.step()
    for p, q in zip(ps, qs):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())
    assert a.state[ps[0]]["state1"].dtype == ms.uint8  # 8-bit state survived the round trip


@pytest.fixture
def backward_patches():
    bnb.register()
    assert all(registry.is_applied(n) for n in BACKWARD_PATCHES)
    yield
    registry.apply(BACKWARD_PATCHES)  # a test may have removed them


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    m.train()
    return m


def _loss(m, x, y):
    return ((m(x) - y) ** 2).mean()


def test_backward_fills_grad_equal_to_value_and_grad(backward_patches):
    m = _model()
    params = list(m.parameters())
    opt = bnb.optim.AdamW(params, lr=1e-2)
    rng = np.random.RandomState(5)
    x, y = torch.tensor(rng.randn(32, 8).astype(np.float32)), torch.tensor(rng.randn(32, 1).astype(np.float32))
    losses = []
    for step in range(4):
        _, ref = torch.autograd.value_and_grad(lambda x, y: _loss(m, x, y), params, attach_grads=False)(x, y)
        loss = _loss(m, x, y)
        loss.backward()
        for p, g in zip(params, ref):
            np.testing.assert_array_equal(p.grad.asnumpy(), g.asnumpy())  # the very same gradients
        if step == 0:  # a second backward of the same forward: torch's "backward through the graph a second time"
            with pytest.raises(RuntimeError, match="already differentiated by an earlier backward"):
                loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_backward_accumulates_like_torch(backward_patches):
    m = _model()
    params = list(m.parameters())
    opt = bnb.optim.AdamW(params, lr=1e-2)  # held by a live optimizer of ours: its forwards are recorded
    x = torch.tensor(np.random.RandomState(6).randn(4, 8).astype(np.float32))
    y = torch.zeros(4, 1)
    _loss(m, x, y).backward()
    once = [p.grad.asnumpy().copy() for p in params]
    _loss(m, x, y).backward()
    for p, g in zip(params, once):
        np.testing.assert_allclose(p.grad.asnumpy(), 2 * g, rtol=1e-6, atol=1e-7)
    assert all(a is b for a, b in zip(opt.param_groups[0]["params"], params))


def test_two_forwards_then_two_backwards_says_so(backward_patches):
    # torch accumulates both losses' gradients; one recording per backward() here: the first backward() takes it
    # (its own loss's gradients, the very value_and_grad ones), the second raises naming the case (new-user trial)
    m = _model()
    params = list(m.parameters())
    opt = bnb.optim.AdamW(params, lr=1e-2)  # noqa: F841  (held: a live optimizer of ours makes forwards record)
    x, y = torch.ones(4, 8), torch.zeros(4, 1)
    _, ref = torch.autograd.value_and_grad(lambda x, y: _loss(m, x, y), params, attach_grads=False)(x, y)
    l1, l2 = _loss(m, x, y), _loss(m, x * 2, y)
    l1.backward()
    for p, g in zip(params, ref):
        np.testing.assert_array_equal(p.grad.asnumpy(), g.asnumpy())
    with pytest.raises(RuntimeError, match=r"already differentiated.*sum of the losses"):
        l2.backward()


def test_a_failed_forward_leaves_no_gradient_behind(backward_patches):
    # a training-mode forward that raised (a notebook cell with a wrong input shape) kept recording, so the next
    # backward() of another model gave the failed model's parameters zero gradients (an AdamW step then decayed
    # them) -- found by a fresh-user trial; now the failed forward's recording is dropped
    a, b = _model(), _model()
    opt_a = bnb.optim.AdamW(list(a.parameters()), lr=1e-2)  # noqa: F841  (held: makes a's forwards record)
    opt_b = bnb.optim.AdamW(list(b.parameters()), lr=1e-2)  # noqa: F841
    x, y = torch.tensor(np.random.RandomState(7).randn(4, 8).astype(np.float32)), torch.zeros(4, 1)
    params_b = list(b.parameters())
    _, ref = torch.autograd.value_and_grad(lambda x, y: _loss(b, x, y), params_b, attach_grads=False)(x, y)
    with pytest.raises(Exception):
        a(torch.ones(4, 7))  # wrong input width
    _loss(b, x, y).backward()
    assert all(p.grad is None for p in a.parameters())
    for p, g in zip(params_b, ref):
        np.testing.assert_array_equal(p.grad.asnumpy(), g.asnumpy())
    # and the failed model trains afterwards as usual
    _loss(a, x, y).backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in a.parameters())


@pytest.mark.parametrize("case", ["eval", "no_grad", "no_optimizer", "unpatched"])
def test_backward_without_a_recorded_forward(backward_patches, case):
    m = _model()
    opt = None if case == "no_optimizer" else bnb.optim.AdamW8bit(list(m.parameters()), lr=1e-2)
    x, y = torch.ones(2, 8), torch.zeros(2, 1)
    if case == "eval":
        m.eval()
    if case == "unpatched":
        registry.remove(BACKWARD_PATCHES)
    if case == "no_grad":
        with torch.no_grad():
            loss = _loss(m, x, y)
    else:
        loss = _loss(m, x, y)
    before = [p.asnumpy().copy() for p in m.parameters()]
    if case == "unpatched":
        loss.backward()  # mindtorch's own: returns, fills nothing
    else:
        with pytest.raises(RuntimeError, match=r"loss\.backward\(\): no forward .*model\.train\(\).*value_and_grad"):
            loss.backward()
    assert all(p.grad is None for p in m.parameters())
    if opt is not None:  # and the step says so instead of returning without an update
        with pytest.raises(RuntimeError, match=r"AdamW8bit\.step\(\): no parameter has a gradient"):
            opt.step()
    for p, b in zip(m.parameters(), before):
        np.testing.assert_array_equal(p.asnumpy(), b)


def test_backward_patch_is_registered_with_reason():
    names = {p.name: p for p in registry.patches()}
    for n in BACKWARD_PATCHES:
        assert n in names and len(names[n].why) > 80


# ---- torch's parameter handling (a fresh-user trial: named_parameters() was accepted and never trained) ----

def test_named_parameters_train_and_keep_their_names():
    """``Opt(model.named_parameters())`` as torch's: tensors in ``params``, names in ``param_names``, and the step
    updates exactly as the same optimizer over ``model.parameters()`` does."""
    models = [torch.nn.Linear(80, 64), torch.nn.Linear(80, 64)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [bnb.optim.AdamW8bit(models[0].named_parameters(), lr=1e-2),
            bnb.optim.AdamW8bit(models[1].parameters(), lr=1e-2)]
    assert opts[0].param_groups[0]["param_names"] == ["weight", "bias"]
    assert all(isinstance(p, torch.nn.Parameter) for p in opts[0].param_groups[0]["params"])
    before = models[0].weight.asnumpy().copy()
    for m, o in zip(models, opts):
        m.weight.grad, m.bias.grad = _grad(3), _grad(4, (64,))
        o.step()
    assert not np.array_equal(models[0].weight.asnumpy(), before)
    np.testing.assert_array_equal(models[0].weight.asnumpy(), models[1].weight.asnumpy())
    np.testing.assert_array_equal(models[0].bias.asnumpy(), models[1].bias.asnumpy())
    with pytest.raises(ValueError, match="with/without names"):
        opts[0].add_param_group({"params": [_param(5)]})
    with pytest.raises(ValueError, match="Some param names are missing"):
        bnb.optim.AdamW8bit([("w", _param(6)), _param(7)])


@pytest.mark.parametrize("params, match", [
    ([_param(8), 5], "optimizer can only optimize Tensors, but one of the params is int"),
    ([np.zeros(3, np.float32)], "one of the params is ndarray"),
    (_param(9), "should be an iterable of Tensors or dicts, but got a Parameter of shape \\(64, 80\\)"),
])
def test_non_tensor_params_raise_torchs_type_error(params, match):
    with pytest.raises(TypeError, match=match):
        bnb.optim.Adam8bit(params)
    with pytest.raises(TypeError, match="organized in ordered collections"):
        bnb.optim.Adam8bit([_param(10)]).add_param_group({"params": {_param(11)}})


def test_zero_grad_set_to_none_false_zeroes_in_shape_and_dtype():
    p, q = _param(12), _param(13, (4,))
    opt = bnb.optim.Adam8bit([p, q])
    p.grad, q.grad = _grad(14), torch.tensor(np.ones(4, np.float16))
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(p.grad.asnumpy(), np.zeros((64, 80), np.float32))
    assert q.grad.dtype == torch.float16 and tuple(q.grad.shape) == (4,) and not q.grad.asnumpy().any()
    opt.zero_grad()
    assert p.grad is None and q.grad is None

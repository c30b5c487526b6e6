"""``loss.backward()`` on mindtorch: an implicit gradient tape (patches ``mindtorch-module-call-tape`` and
``mindtorch-tensor-backward``, applied by :func:`bitsandbytes_ms.register`).

mindtorch 0.5.1's ``Tensor.backward`` is ``return self``: nothing is recorded in the forward and no ``.grad`` is
filled, so ``loss.backward(); opt.step()`` trained nothing. MindSpore's PyNative executor can differentiate a
forward only if recording started before it (``new_graph``) -- what mindtorch's own ``GradientTape`` does, and it
gives the very gradients of ``torch.autograd.value_and_grad`` (measured: max difference 0.0 on a PEFT LoRA over an
NF4 model). So the outermost ``nn.Module`` call of a module in training mode (``model.train()``) with gradients
enabled, some of whose trainable parameters one of our optimizers (``bnb.optim.*``) holds, starts recording, and
``loss.backward()`` ends it, differentiates the loss with respect to the module's trainable parameters and adds the
result to their ``.grad`` (torch's accumulation).

Limits (documented in the README): one ``backward()`` per recorded forward (``retain_graph``/``create_graph`` and
``inputs=`` are refused); a forward in training mode that is never followed by ``backward()`` keeps recording until
the next ``backward()`` (run evaluation under ``torch.no_grad()`` or in ``model.eval()``, as in PyTorch); a trainable
parameter the loss does not depend on gets a zero gradient (PyTorch leaves it None). Inside
``mindspore.value_and_grad`` / ``torch.autograd.value_and_grad`` nothing changes: their own recording is used.
"""

from __future__ import annotations

from mindspore.common.api import _pynative_executor as _executor
from mindspore.ops import GradOperation

from .patches import registry

# the gradient of the recorded graph with respect to a list of weights, with an explicit output gradient
_GRAD = GradOperation(get_all=False, get_by_list=True, sens_param=True)


def _tape_key():
    """The function MindSpore's executor keys the recorded top graph by (never called)."""


class _Tape:
    def __init__(self):
        self.depth = 0           # nesting of nn.Module calls: only the outermost one starts recording
        self.recording = False
        self.params = {}         # id -> trainable parameter of the modules called while recording, in order
        self.used = False        # a backward() ended the recording and no module was called since


_tape = _Tape()


def is_recording() -> bool:
    """Whether a forward is being recorded for ``loss.backward()``."""
    return _tape.recording


def _trainable(module):
    """The module's trainable parameters, or [] when no optimizer of ours holds any of them (then nothing is
    recorded: inference in training mode, other code, stays as fast as without the patch)."""
    from ..optim.optimizer import LIVE_OPTIMIZERS

    owned = {id(p) for opt in list(LIVE_OPTIMIZERS) for g in opt.param_groups for p in g["params"]}
    if not owned:
        return []
    params = [p for p in module.parameters() if getattr(p, "requires_grad", False)]
    return params if any(id(p) in owned for p in params) else []


def _maybe_start(module) -> None:
    if not getattr(module, "training", False) or not _executor.enable_grad():
        return
    if not _tape.recording and _executor.grad_flag():
        return  # inside mindspore.value_and_grad / torch.autograd.value_and_grad: theirs records
    params = _trainable(module)
    if not params:
        return
    if not _tape.recording:
        # check_run first, as mindspore.value_and_grad does: without it every backward() after the first failed
        # ("Can not find top cell for backward")
        _executor.check_run(_GRAD, _tape_key, params, None, create_graph=True)
        _executor.set_grad_flag(True)
        _executor.new_graph(_tape_key)
        _tape.recording = True
        _tape.params = {}
    for p in params:
        _tape.params.setdefault(id(p), p)


@registry.register(
    "mindtorch-module-call-tape", "mindtorch.nn.modules.module", "Module.__call__",
    why="mindtorch records nothing in a forward, so `loss.backward()` cannot differentiate it: the outermost call of "
        "a module in training mode whose trainable parameters a bitsandbytes_ms optimizer holds, with gradients "
        "enabled, starts MindSpore's "
        "PyNative recording (as mindtorch's GradientTape does) for `loss.backward()` to end.")
def _module_call(wrapped, instance, args, kwargs):
    if _tape.depth == 0:
        _tape.used = False
        _maybe_start(instance)
    _tape.depth += 1
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        if _tape.depth == 1 and _tape.recording:
            _abort()
        raise
    finally:
        _tape.depth -= 1


def _abort() -> None:
    """An outermost training-mode forward raised: the recording is dropped (MindSpore's ``clear_res``, as its own
    recompute does on an error), so the failed forward's parameters do not get a gradient from the next
    ``backward()`` (they got zeros, and a bf16 one made that backward fail) -- that ``backward()`` differentiates
    forwards run after the failure; one that needs the dropped recording raises (nothing recorded)."""
    _tape.recording, _tape.params = False, {}
    try:
        _executor.clear_res()
    finally:
        _executor.set_grad_flag(False)


_NO_FORWARD = ("loss.backward(): no forward of a trainable model was recorded, so there is nothing to differentiate "
               "and no .grad would be filled. On mindtorch (MindSpore) the forward must run after "
               "bitsandbytes_ms.register(), with the model in training mode (model.train()), gradients enabled "
               "(not under torch.no_grad()) and a bitsandbytes_ms optimizer (bnb.optim.*) already created on its "
               "trainable parameters; one backward() per forward. "
               "Or compute gradients with torch.autograd.value_and_grad(loss_fn, params, attach_grads=False) and "
               "call opt.step(grads=grads).")


_USED = ("loss.backward(): the recorded forward was already differentiated by an earlier backward(). On mindtorch "
         "(MindSpore) one backward() per recorded forward: the recording runs from the first training-mode forward "
         "after a backward() to the next backward(), so after two forwards the first backward() took the recording "
         "(and differentiated only its own loss). Call backward() once on the sum of the losses, or run each forward "
         "right before its backward().")


@registry.register(
    "mindtorch-tensor-backward", "mindtorch._tensor", "Tensor.backward",
    why="mindtorch 0.5.1's Tensor.backward is `return self`: every .grad stays None and `loss.backward(); "
        "opt.step()` silently trains nothing. backward() now differentiates the forward recorded since the "
        "outermost training-mode module call (mindtorch-module-call-tape) and accumulates into .grad, or raises "
        "when nothing was recorded.")
def _tensor_backward(wrapped, instance, args, kwargs):
    gradient = args[0] if args else kwargs.pop("gradient", None)
    if any(kwargs.get(k) for k in ("retain_graph", "create_graph", "inputs")) or len(args) > 1:
        raise NotImplementedError("loss.backward(): retain_graph, create_graph and inputs are not supported on "
                                  "mindtorch (one backward per recorded forward); use torch.autograd.value_and_grad")
    if not _tape.recording and _executor.grad_flag():
        # inside mindspore.value_and_grad / torch.autograd.value_and_grad (mindnlp's Trainer calls backward() in
        # the function it differentiates): that recording fills the gradients, so mindtorch's no-op is right
        return wrapped(*args, **kwargs)
    if not _tape.recording:
        raise RuntimeError(_USED if _tape.used else _NO_FORWARD)
    import mindtorch

    if gradient is None:
        if int(instance.numel()) != 1:
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs (loss.backward() on a tensor "
                               f"of shape {tuple(instance.shape)}: pass `gradient`)")
        gradient = mindtorch.ones_like(instance)
    params = list(_tape.params.values())
    _tape.recording, _tape.params, _tape.used = False, {}, True
    try:
        _executor.end_graph(_tape_key, instance.data)
        grads = _executor.grad(_tape_key, _GRAD, params, None, gradient)
    finally:
        _executor.set_grad_flag(False)  # inference fast paths (host calls, fused decoder) check this flag
    for p, g in zip(params, grads):
        g = mindtorch.tensor(g, device=p.device)
        p.grad = g if p.grad is None else p.grad + g
    return None

"""4-bit quantization of any module parameter through ``torch.nn.utils.parametrize`` (upstream
``bitsandbytes.nn.parametrize``, bitsandbytes >= 0.48; experimental there too).

:func:`replace_parameter_4bit` quantizes one parameter of a mindtorch module (e.g. the stacked expert
weights of an MoE layer, which are no ``nn.Linear``) with :func:`bitsandbytes_ms.functional.quantize_4bit`,
stores the packed bytes in its place and registers a :class:`Bnb4bitParametrization`, so reading
``module.<name>`` gives the dequantized tensor (shape and dtype of the original). The module's
architecture does not change. The state dict then holds ``<name>`` (the packed bytes) and the
quantization state under ``<name>.absmax``, ``<name>.quant_map``, ``<name>.quant_state.bitsandbytes__<type>``
(plus ``nested_*`` with ``compress_statistics``), the keys :meth:`QuantState.from_dict` reads back
(:func:`replace_parameter_4bit_prequantized` restores such a parameter).

mindtorch 0.5.1 (``torch`` after ``import mindnlp``) ships ``torch.nn.utils.parametrize``; three of its
differences from PyTorch are handled here, without patching mindtorch:

* Reading a parametrized attribute gives ``Parameter(value)`` in mindtorch: a new leaf tensor that
  requires grad. PyTorch gives the value itself (here: dequantized under ``no_grad``, so
  ``requires_grad`` is False). For the parameters this module parametrizes, the attribute is
  re-installed with PyTorch's behaviour, using mindtorch's own parametrization cache
  (``_cache_enabled``/``_cache`` of ``mindtorch.nn.utils.parametrize``, so ``P.cached()`` works).
* ``nn.Module.register_state_dict_post_hook`` (PyTorch >= 2.5) does not exist; mindtorch's
  ``Module._register_state_dict_hook`` calls hooks with the same arguments, and is used instead.
* ``register_forward_hook`` has no ``always_call``; mindtorch's module call does honour the
  ``_forward_hooks_always_called`` table, so the hook is entered there (and removed with its handle).

The cache counter lives in mindtorch's module (``mindtorch.nn.utils.parametrize``). Code that writes it
through the ``torch.nn.utils.parametrize`` alias (as upstream's tests do) needs the registered patch
``mindtorch-proxy-module-setattr`` (applied by :func:`bitsandbytes_ms.register`): without it mindtorch's
``torch.*`` alias modules keep such assignments to themselves.
"""

from functools import partial as _partial
import inspect as _inspect
import weakref as _weakref
from typing import Any, Dict, Literal, Optional

import mindnlp  # noqa: F401  (must precede any `import torch`; our modules are mindtorch modules)
import mindtorch as torch  # noqa: E402
import mindtorch.nn as nn  # noqa: E402
import mindtorch.nn.utils.parametrize as P  # noqa: E402  (the module itself, not the `torch.` alias)

from .. import functional as F  # noqa: E402

__all__ = ["Bnb4bitParametrization", "replace_parameter_4bit", "replace_parameter_4bit_prequantized"]


class Bnb4bitParametrization(nn.Module):
    """Dequantizes a 4-bit parameter when it is read (upstream ``Bnb4bitParametrization``).

    Registered (``unsafe=True``: shape and dtype change) on a parameter that already holds the packed
    bytes ``[(n+1)//2, 1]`` of :func:`~bitsandbytes_ms.functional.quantize_4bit`.

    Args:
        quant_state: the :class:`~bitsandbytes_ms.functional.QuantState` of those bytes.
    """

    def __init__(self, quant_state: F.QuantState):
        super().__init__()
        self.quant_state = quant_state

    @torch.no_grad()
    def forward(self, quantized_param):
        """``dequantize_4bit(quantized_param, self.quant_state)``: the tensor of ``quant_state.shape`` and
        ``quant_state.dtype``; no gradient flows to the packed bytes."""
        return F.dequantize_4bit(quantized_param, self.quant_state)


def _check_parameter(module, param_name: str):
    if not hasattr(module, param_name):
        raise AttributeError(f"Module does not have parameter '{param_name}'")
    param = getattr(module, param_name)
    if not isinstance(param, nn.Parameter):
        raise TypeError(f"Parameter '{param_name}' is not an instance of nn.Parameter")
    return param


def replace_parameter_4bit_prequantized(module, param_name: str, qs_dict: Dict[str, Any], device):
    """Registers 4-bit dequantization on a parameter that already holds packed 4-bit bytes (e.g. loaded
    from a state dict written by a module quantized with :func:`replace_parameter_4bit`).

    Args:
        module: the mindtorch module.
        param_name: name of the ``nn.Parameter`` holding the packed bytes.
        qs_dict: the quantization state as :meth:`QuantState.as_dict` gives it (packed or not; key
            prefixes such as ``weight.`` are allowed).
        device: accepted for upstream compatibility (MindSpore places tensors by context).

    Raises:
        AttributeError: ``module`` has no attribute ``param_name``.
        TypeError: the attribute is not an ``nn.Parameter``.
        ValueError: ``qs_dict`` is not a valid quantization state.
    """
    _check_parameter(module, param_name)
    quant_state = F.QuantState.from_dict(qs_dict, device=device)
    _parametrize(module, param_name, quant_state)


def replace_parameter_4bit(
    module,
    param_name: str,
    compress_statistics: bool = False,
    quant_type: Literal["nf4", "fp4"] = "nf4",
    blocksize: Optional[int] = None,
):
    """Quantizes ``module.<param_name>`` to 4 bits in place and makes reading it dequantize (upstream
    ``replace_parameter_4bit``). Meant for parameters outside ``nn.Linear`` (MoE expert weights).

    The parameter is replaced by ``nn.Parameter(packed, requires_grad=False)`` and a
    :class:`Bnb4bitParametrization` is registered on it; forward hooks enable the parametrization
    cache during the module's forward (one dequantization per forward however often the parameter
    is read), and a state-dict hook stores the packed data under ``<param_name>`` and the quantization
    state next to it (see the module docstring).

    Args:
        module: the mindtorch module.
        param_name: name of an ``nn.Parameter`` of ``module`` (float32/float16/bfloat16, any shape).
        compress_statistics: double quantization of the absmax (as ``quantize_4bit``).
        quant_type: ``"nf4"`` (default) or ``"fp4"``.
        blocksize: 4-bit block size (default 64).

    Raises:
        AttributeError: ``module`` has no attribute ``param_name``.
        TypeError: the attribute is not an ``nn.Parameter`` (also when it is already parametrized).
        ValueError: from :func:`~bitsandbytes_ms.functional.quantize_4bit` (dtype, blocksize, quant_type).
    """
    original = _check_parameter(module, param_name)
    packed, quant_state = F.quantize_4bit(original.data, blocksize=blocksize,
                                          compress_statistics=compress_statistics, quant_type=quant_type)
    setattr(module, param_name, nn.Parameter(packed, requires_grad=False))
    del original
    _parametrize(module, param_name, quant_state)


def _parametrize(module, param_name: str, quant_state) -> None:
    P.register_parametrization(module, param_name, Bnb4bitParametrization(quant_state), unsafe=True)
    _install_torch_getter(module, param_name)
    _register_parametrization_hooks(module, param_name)


def _install_torch_getter(module, param_name: str) -> None:
    """Replaces mindtorch's property for ``param_name`` (which wraps every value in a new
    ``Parameter``) by PyTorch's behaviour: the parametrization's output itself, cached while the
    parametrization cache is enabled. The class is the per-instance ``Parametrized<Class>`` that
    register_parametrization created, so no other module is affected; remove_parametrizations
    deletes the property as usual."""
    cls = type(module)
    prop = cls.__dict__.get(param_name)
    if not isinstance(prop, property):  # pragma: no cover - mindtorch's layout changed
        return

    def get_parametrized(self):
        parametrization = self.parametrizations[param_name]
        if not P._cache_enabled:
            return parametrization()
        key = (id(self), param_name)
        value = P._cache.get(key)
        if value is None:
            value = parametrization()
            P._cache[key] = value
        return value

    setattr(cls, param_name, property(get_parametrized, prop.fset))


def _enable_parametrization_cache(module, inputs):
    """Forward pre-hook: one more forward in flight that may reuse dequantized parameters."""
    P._cache_enabled += 1


def _disable_parametrization_cache(module, inputs, output):
    """Forward hook (always called, even when the forward raised): one forward less; the cache is
    emptied when none is left. The counter never goes below zero (a negative count would keep the
    cache alive forever)."""
    P._cache_enabled = max(0, P._cache_enabled - 1)
    if not P._cache_enabled:
        P._cache = {}


def _register_forward_hook_always_called(module, hook):
    if "always_call" in _inspect.signature(module.register_forward_hook).parameters:
        return module.register_forward_hook(hook, always_call=True)
    # mindtorch 0.5.1: no `always_call` argument, but Module._call_impl runs the hooks listed in
    # `_forward_hooks_always_called` when the forward raises; removing the handle removes the entry too.
    handle = module.register_forward_hook(hook)
    table = module._forward_hooks_always_called
    table[handle.id] = True
    handle.extra_dict_ref = tuple(handle.extra_dict_ref) + (_weakref.ref(table),)
    return handle


def _register_parametrization_hooks(module, param_name: str) -> None:
    """State-dict post-hook (quantization state under ``<param_name>.*``) and the pair of forward hooks
    that enable the parametrization cache for the duration of ``module``'s forward."""
    hook = _partial(_parametrized_state_dict_post_hook, param_name=param_name)
    if hasattr(module, "register_state_dict_post_hook"):
        module.register_state_dict_post_hook(hook)
    else:  # mindtorch 0.5.1: same hook signature (module, state_dict, prefix, local_metadata)
        module._register_state_dict_hook(hook)
    module.register_forward_pre_hook(_enable_parametrization_cache)
    _register_forward_hook_always_called(module, _disable_parametrization_cache)


def _parametrized_state_dict_post_hook(module, state_dict, prefix, local_metadata, *, param_name: str = "weight",
                                       **kwargs) -> None:
    """Rewrites ``<prefix>parametrizations.<name>.original`` as ``<prefix><name>`` and adds the
    quantization state (``QuantState.as_dict(packed=True)``) as ``<prefix><name>.<key>``."""
    original_key = f"{prefix}parametrizations.{param_name}.original"
    if original_key not in state_dict:
        return
    state_dict[f"{prefix}{param_name}"] = state_dict.pop(original_key)
    if not P.is_parametrized(module, param_name):
        raise RuntimeError(f"state dict hook: '{param_name}' of {type(module).__name__} is not parametrized")
    parametrization = next((p for p in module.parametrizations[param_name] if isinstance(p, Bnb4bitParametrization)),
                           None)
    if parametrization is None:
        raise RuntimeError(f"state dict hook: no Bnb4bitParametrization on '{param_name}'")
    if parametrization.quant_state is not None:
        for key, value in parametrization.quant_state.as_dict(packed=True).items():
            state_dict[f"{prefix}{param_name}.{key}"] = value

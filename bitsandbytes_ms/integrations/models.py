"""Model surgery for mindnlp (mindtorch) models: swap ``nn.Linear``/``Conv1D`` layers for bitsandbytes
layers, quantize a loaded model in place (post-training quantization), and undo it.

``replace_with_bnb_linear`` has transformers' signature and builds *empty* quantized layers (weights
come later, as in ``from_pretrained(quantization_config=...)``); ``quant_8bit``/``quant_4bit`` convert a
model that already holds its weights, one layer at a time: the layer's full-precision weight is
quantized, the quantized layer takes its place in the parent, and the original is released before the
next layer is touched, so peak memory stays at the model plus one layer.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, List, Optional, Sequence, Tuple

import mindspore as ms

from ..utils import FLOAT_DTYPE_OF_NAME as _COMPUTE_DTYPES  # "fp16"/"float16" -> ms.float16, ...


def _torch():
    import mindnlp  # noqa: F401  (torch -> mindtorch)
    import torch

    return torch


def _conv1d_class():
    try:
        from transformers.pytorch_utils import Conv1D

        return Conv1D
    except Exception:  # pragma: no cover
        return None


def _is_skipped(name: str, modules_to_not_convert: Sequence[str]) -> bool:
    """transformers' rule: a module is kept in full precision if a listed key equals its name, is a
    dotted prefix/suffix of it, or equals its last component."""
    for key in modules_to_not_convert:
        if name == key or name.endswith("." + key) or name.startswith(key + ".") or ("." + key + ".") in name \
                or name.split(".")[-1] == key:
            return True
    return False


def default_modules_to_not_convert(model) -> List[str]:
    """``lm_head`` (the output projection) plus any module whose weight is tied to another parameter
    (e.g. an output layer sharing the input embedding), as transformers' ``get_keys_to_not_convert``."""
    keys = ["lm_head"]
    try:
        out = model.get_output_embeddings()
        if out is not None:
            for name, module in model.named_modules():
                if module is out and name:
                    keys.append(name)
    except Exception:
        pass
    seen = {}
    for name, module in model.named_modules():
        w = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if w is None:
            continue
        if id(w) in seen:
            keys.append(name)
            keys.append(seen[id(w)])
        seen.setdefault(id(w), name)
    return sorted(set(keys))


def find_linear_layers(model, modules_to_not_convert: Optional[Sequence[str]] = None
                       ) -> Tuple[List[str], List[str]]:
    """Names of the ``nn.Linear``/``Conv1D`` layers that would be converted, and of those kept."""
    torch = _torch()
    Conv1D = _conv1d_class()
    kinds = (torch.nn.Linear,) + ((Conv1D,) if Conv1D is not None else ())
    skip = list(modules_to_not_convert) if modules_to_not_convert is not None else default_modules_to_not_convert(model)
    from ..nn import Linear4bit, Linear8bitLt

    convert, keep = [], []
    for name, module in model.named_modules():
        if isinstance(module, (Linear8bitLt, Linear4bit)) or not isinstance(module, kinds):
            continue
        (keep if _is_skipped(name, skip) else convert).append(name)
    return convert, keep


def _set_submodule(model, name: str, new) -> None:
    """mindtorch's Module has no ``set_submodule``: replace through the parent."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _float_weight(module):
    """(weight [out, in] as a float tensor, in_features, out_features) for Linear or Conv1D."""
    Conv1D = _conv1d_class()
    w = module.weight.data
    if Conv1D is not None and isinstance(module, Conv1D):
        w = w.T.contiguous()  # Conv1D stores [in, out]
    out_f, in_f = w.shape
    return w, in_f, out_f


@contextlib.contextmanager
def _empty_weights():
    """Build layers without allocating/initialising their full-precision weights (accelerate)."""
    try:
        from accelerate import init_empty_weights
    except Exception:  # pragma: no cover
        yield
        return
    with init_empty_weights(include_buffers=False):
        yield


def _progress(items, enabled: bool, desc: str):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="layer", leave=False)


def _output_layer_name(model) -> Optional[str]:
    """Name of the model's output projection (``get_output_embeddings()``), if it has one."""
    try:
        out = model.get_output_embeddings()
    except Exception:
        return None
    if out is None:
        return None
    return next((name for name, module in model.named_modules() if module is out and name), None)


def _untie_converted_output(model, converted_names) -> None:
    """After the output layer was quantized although its weight was tied to the input embedding (which keeps
    its own full-precision weight), the two are no longer tied: say so in the config, so that transformers
    does not tie them again (``tie_weights``) and a saved checkpoint stores both."""
    cfg = getattr(model, "config", None)
    out = _output_layer_name(model)
    if cfg is None or out is None or out not in converted_names:
        return
    cfgs = [cfg]
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if text is not cfg:
        cfgs.append(text)
    for c in cfgs:
        if getattr(c, "tie_word_embeddings", False):
            c.tie_word_embeddings = False


def _convert(model, make_layer, modules_to_not_convert, converted, skipped, progress, desc, fast_fp_layers=True):
    names, keep = find_linear_layers(model, modules_to_not_convert)
    if skipped is not None:
        skipped.extend(keep)
    for name in _progress(names, progress, desc):
        old = model.get_submodule(name)
        new = make_layer(old)
        new.train(old.training)  # a layer built now is in training mode; keep the model's mode
        _set_submodule(model, name, new)
        del old
        if converted is not None:
            converted.append(name)
    _untie_converted_output(model, names)
    if fast_fp_layers and keep:
        from ..nn.linear_fp import use_fast_fp_layers

        use_fast_fp_layers(model, keep)
    from .fused import auto_fuse

    auto_fuse(model)  # the fused decoder on the first inference forward (fuse(model, False) keeps it off)
    return model


def quant_8bit(model, threshold: float = 6.0, modules_to_not_convert: Optional[Sequence[str]] = None, *,
               converted: Optional[list] = None, skipped: Optional[list] = None, progress: bool = True,
               fast_fp_layers: bool = True):
    """Quantizes every linear layer of a loaded mindnlp model to LLM.int8() in place
    (``Linear8bitLt`` with ``has_fp16_weights=False``; int8 weight rows + fp32 ``SCB`` scales).

    Args:
        model: a mindnlp/transformers model holding its weights.
        threshold: outlier threshold (6.0 as in the LLM.int8() paper and transformers' default).
        modules_to_not_convert: names kept in full precision, with transformers' matching rule (upstream's
            ``llm_int8_skip_modules``). ``None`` (default): ``lm_head`` and layers whose weight is tied to
            another parameter; ``[]`` quantizes every linear layer, ``lm_head`` included (a tied input
            embedding keeps its own full-precision weight; ``config.tie_word_embeddings`` is then set to False).
        converted/skipped: optional lists that receive the converted/kept layer names.
        progress: show a tqdm bar over layers.
        fast_fp_layers: the kept plain ``nn.Linear`` layers (``lm_head``) are turned into
            :class:`bitsandbytes_ms.nn.LinearFP` in place (same parameters; native GEMV/GEMM forward at
            inference). ``False`` leaves them as they are.
    Returns: the model.
    """
    torch = _torch()
    from ..nn import Int8Params, Linear8bitLt

    def make(old):
        w, in_f, out_f = _float_weight(old)
        with _empty_weights():
            new = Linear8bitLt(in_f, out_f, bias=old.bias is not None, has_fp16_weights=False, threshold=threshold)
        new.weight = Int8Params(w.float() if w.dtype == ms.bfloat16 else w, requires_grad=False,
                                has_fp16_weights=False)
        new.weight.quantize()
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)
        return new

    return _convert(model, make, modules_to_not_convert, converted, skipped, progress, "quantizing (int8)",
                    fast_fp_layers)


def quant_4bit(model, quant_type: str = "nf4", compute_dtype=None, compress_statistics: bool = True,
               blocksize: int = 64, modules_to_not_convert: Optional[Sequence[str]] = None, quant_storage=ms.uint8,
               *, converted: Optional[list] = None, skipped: Optional[list] = None, progress: bool = True,
               fast_fp_layers: bool = True):
    """Quantizes every linear layer of a loaded mindnlp model to 4-bit in place (``Linear4bit``: packed
    NF4/FP4 codes with an absmax per ``blocksize`` block, double-quantized when
    ``compress_statistics``; QLoRA, arXiv 2305.14314).

    Args:
        quant_type: ``"nf4"`` or ``"fp4"``.
        compute_dtype: dtype (or ``"fp32"|"fp16"|"bf16"``) the matmul runs in; default the input's.
        compress_statistics: double quantization of absmax (8-bit, blocksize 256).
        blocksize: 4-bit block size (32..4096).
        modules_to_not_convert, converted, skipped, progress, fast_fp_layers: as :func:`quant_8bit`.
    Raises: ValueError for an unknown quant_type / compute_dtype.
    """
    torch = _torch()
    from ..nn import Linear4bit, Params4bit

    if quant_type not in ("nf4", "fp4"):
        raise ValueError(f"quant_4bit: `quant_type` must be 'nf4' or 'fp4'; got {quant_type!r}")
    if isinstance(compute_dtype, str):
        if compute_dtype not in _COMPUTE_DTYPES:
            raise ValueError(f"quant_4bit: `compute_dtype` must be one of {sorted(_COMPUTE_DTYPES)}; got {compute_dtype!r}")
        compute_dtype = _COMPUTE_DTYPES[compute_dtype]

    def make(old):
        w, in_f, out_f = _float_weight(old)
        with _empty_weights():
            new = Linear4bit(in_f, out_f, bias=old.bias is not None, compute_dtype=compute_dtype,
                             compress_statistics=compress_statistics, quant_type=quant_type, quant_storage=quant_storage)
        new.weight = Params4bit(w, requires_grad=False, blocksize=blocksize, compress_statistics=compress_statistics,
                                quant_type=quant_type, quant_storage=quant_storage)
        new.weight.quantize()
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)
        return new

    return _convert(model, make, modules_to_not_convert, converted, skipped, progress, f"quantizing ({quant_type})",
                    fast_fp_layers)


def dequantize(model, dtype=None, progress: bool = True):
    """Replaces every ``Linear8bitLt``/``Linear4bit`` by an ``nn.Linear`` holding the dequantized
    weight (in ``dtype``, default float32). Returns the model."""
    torch = _torch()
    from .. import functional as F
    from ..nn import Linear4bit, Linear8bitLt

    dtype = dtype or ms.float32
    names = [n for n, m in model.named_modules() if isinstance(m, (Linear8bitLt, Linear4bit))]
    for name in _progress(names, progress, "dequantizing"):
        old = model.get_submodule(name)
        if isinstance(old, Linear8bitLt):
            scb = old.weight.SCB if getattr(old.weight, "SCB", None) is not None else old.state.SCB
            w = F.int8_vectorwise_dequant(old.weight.data, scb) if old.weight.dtype == ms.int8 else old.weight.data
        else:
            w = F.dequantize_4bit(old.weight.data, old.weight.quant_state)
        with _empty_weights():
            new = torch.nn.Linear(old.in_features, old.out_features, bias=old.bias is not None)
        new.weight = torch.nn.Parameter(w.astype(dtype), requires_grad=False)
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)
        new.train(old.training)
        _set_submodule(model, name, new)
    return model


def replace_with_bnb_linear(model, modules_to_not_convert: Optional[List[str]] = None, current_key_name=None,
                            quantization_config=None, fast_fp_layers: bool = True):
    """transformers' ``replace_with_bnb_linear``: replaces ``nn.Linear``/``Conv1D`` layers by empty
    ``Linear8bitLt`` (``load_in_8bit``) or ``Linear4bit`` (``load_in_4bit``) layers configured from a
    ``BitsAndBytesConfig``; their weights are loaded afterwards. ``lm_head`` and
    ``modules_to_not_convert`` stay in full precision (as :class:`bitsandbytes_ms.nn.LinearFP` with
    ``fast_fp_layers``, the default; same parameters). Returns the model.

    Raises: ValueError if ``quantization_config`` asks for neither 8-bit nor 4-bit.
    """
    from ..nn import Linear4bit, Linear8bitLt

    cfg = quantization_config
    if cfg is None or not (getattr(cfg, "load_in_8bit", False) or getattr(cfg, "load_in_4bit", False)):
        raise ValueError("replace_with_bnb_linear: `quantization_config` must set load_in_8bit or load_in_4bit")
    skip = modules_to_not_convert if modules_to_not_convert is not None else ["lm_head"]
    Conv1D = _conv1d_class()

    def make(old):
        if Conv1D is not None and isinstance(old, Conv1D):
            in_f, out_f = old.weight.shape
        else:
            in_f, out_f = old.in_features, old.out_features
        with _empty_weights():
            if cfg.load_in_8bit:
                new = Linear8bitLt(in_f, out_f, old.bias is not None, has_fp16_weights=cfg.llm_int8_has_fp16_weight,
                                   threshold=cfg.llm_int8_threshold)
            else:
                new = Linear4bit(in_f, out_f, old.bias is not None, cfg.bnb_4bit_compute_dtype,
                                 compress_statistics=cfg.bnb_4bit_use_double_quant, quant_type=cfg.bnb_4bit_quant_type,
                                 quant_storage=getattr(cfg, "bnb_4bit_quant_storage", ms.uint8))
        new.source_cls = type(old)
        new.requires_grad_(False)
        return new

    return _convert(model, make, skip, None, None, False, "", fast_fp_layers)

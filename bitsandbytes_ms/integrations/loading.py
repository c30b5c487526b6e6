"""Quantize while loading: what ``bnb-ms quantize`` uses so that it never holds a full-precision model.

The checkpoint is read shard by shard (safetensors, one tensor at a time) by transformers' own bitsandbytes
path (``from_pretrained(quantization_config=BitsAndBytesConfig(...))`` after ``bitsandbytes_ms.register()``):
the model skeleton is built on the meta device, and each linear weight is quantized as it arrives
(``Params4bit``/``Int8Params``, the same bytes as :func:`quant_4bit`/:func:`quant_8bit` on the same weights),
so peak memory is the quantized model plus one tensor. Non-quantized tensors (embeddings, norms, ``lm_head``)
keep the checkpoint's dtype. A 7B-shaped bf16 checkpoint (13.8 GB, 27.5 GB in fp32): 5.3 GiB peak RSS for its
4.1 GiB NF4 model, ``--save`` included (README, ``bnb-ms quantize``).

Also here: the facts the job needs before loading anything (parameter count and fp32 size from a meta-device
skeleton, the checkpoint's dtype from the safetensors headers) and whether the fp32 reference model fits.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: the fp32 reference model is loaded only when 1 + REFERENCE_MARGIN times its weights fit in the available
#: memory (activations, the evaluation's logits and the loader's transient copies need room too)
REFERENCE_MARGIN = 0.2

_SAFETENSORS_FLOAT = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


@dataclass
class CheckpointFacts:
    n_params: int            # parameters of the model (tied weights once), as the loaded model counts them
    fp32_bytes: int          # weight memory of the model loaded in fp32 (parameters + buffers)
    dtype: str               # "float32" | "float16" | "bfloat16": the checkpoint's floating-point dtype
    shards: int              # safetensors files read (0: another format, loaded by transformers as it is)


def safetensors_files(model_dir) -> list:
    """The checkpoint's safetensors files: those of ``model.safetensors.index.json`` if there is one, else
    every ``*.safetensors`` file in the directory."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    return sorted(model_dir.glob("*.safetensors"))


def _header(path) -> dict:
    """A safetensors file's JSON header (tensor names, dtypes, shapes), read without touching the data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def checkpoint_dtype(model_dir, config=None) -> str:
    """The floating-point dtype holding most of the checkpoint's bytes (safetensors headers), else the
    config's ``dtype``, else ``"float32"``."""
    by_dtype: dict = {}
    for f in safetensors_files(model_dir):
        for name, meta in _header(f).items():
            if name != "__metadata__" and meta.get("dtype") in _SAFETENSORS_FLOAT:
                start, end = meta["data_offsets"]
                key = _SAFETENSORS_FLOAT[meta["dtype"]]
                by_dtype[key] = by_dtype.get(key, 0) + end - start
    if by_dtype:
        return max(by_dtype, key=by_dtype.get)
    name = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    name = name.replace("torch.", "").replace("mindspore.", "")
    return name if name in _SAFETENSORS_FLOAT.values() else "float32"


def checkpoint_facts(model_dir, config) -> CheckpointFacts:
    """Parameter count and fp32 weight memory from a meta-device skeleton of ``config`` (no weights allocated),
    and the checkpoint's dtype."""
    import mindnlp  # noqa: F401  (torch -> mindtorch)
    import torch
    from transformers import AutoModelForCausalLM

    from . import evaluate as ev
    from .models import _empty_weights

    with _empty_weights():
        skeleton = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    n, fp32 = ev.parameter_count(skeleton), ev.weight_memory(skeleton)
    del skeleton
    return CheckpointFacts(n, fp32, checkpoint_dtype(model_dir, config), len(safetensors_files(model_dir)))


def available_memory() -> int:
    """Bytes the system can give this process now without swapping (psutil's ``available``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def reference_fits(fp32_bytes: int, available: Optional[int] = None):
    """(fits, bytes needed, bytes available) for loading and evaluating the fp32 reference model."""
    available = available_memory() if available is None else available
    need = int(fp32_bytes * (1 + REFERENCE_MARGIN))
    return need <= available, need, available


def bnb_config(mode: str, threshold: float = 6.0, compute_dtype: str = "fp32", double_quant: bool = False):
    """The ``BitsAndBytesConfig`` of a ``bnb-ms quantize`` mode (``lm_head`` and tied layers kept, as upstream)."""
    from transformers import BitsAndBytesConfig

    from ..utils import DTYPE_OF_SUFFIX
    from .hf import register

    register()  # BitsAndBytesConfig asks importlib.metadata for bitsandbytes' version
    if mode == "int8":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=threshold)
    if mode not in ("nf4", "fp4"):
        raise ValueError(f"bnb_config: `mode` must be 'int8', 'nf4' or 'fp4'; got {mode!r}")
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode, bnb_4bit_use_double_quant=double_quant,
                              bnb_4bit_compute_dtype=DTYPE_OF_SUFFIX[compute_dtype])


def load_quantized(model_dir, quantization_config, dtype: str):
    """Loads ``model_dir`` quantized while loading (shard by shard, each linear weight quantized as it arrives).

    Args:
        quantization_config: a ``BitsAndBytesConfig`` (see :func:`bnb_config`).
        dtype: ``"float32"|"float16"|"bfloat16"``: the dtype of the tensors that stay in full precision (the
            quantized ones are quantized from the checkpoint's values, the same bytes in any of these).
    Returns: (model in eval mode, transformers' loading info dict).
    """
    import mindnlp  # noqa: F401
    import torch
    from transformers import AutoModelForCausalLM

    from .hf import register

    register()  # transformers' bitsandbytes quantizer imports `bitsandbytes`
    model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype),
                                                       quantization_config=quantization_config,
                                                       output_loading_info=True)
    model.eval()
    return model, info


_SAFETENSORS_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "uint8": "U8",
                      "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "bool": "BOOL"}


def _state_tensors(model):
    """``model.state_dict()``'s (key, tensor) pairs, made one module at a time (quantization states included,
    tied tensors once, under their first name), without the copies ``state_dict()`` makes."""
    seen = set()
    for name, module in model.named_modules():
        entries: dict = {}
        module._save_to_state_dict(entries, f"{name}." if name else "", True)
        # only a module's own parameters/buffers can be tied (made-up tensors die, and their ids are reused)
        own = {id(t) for t in list(module._parameters.values()) + list(module._buffers.values()) if t is not None}
        for key, tensor in entries.items():
            if tensor is None or id(tensor) in seen:
                continue
            if id(tensor) in own:
                seen.add(id(tensor))
            yield key, tensor


def _safetensors_entry(tensor):
    dtype = str(tensor.dtype).replace("mindspore.", "").replace("torch.", "")
    if dtype not in _SAFETENSORS_DTYPE:
        raise ValueError(f"save_quantized: no safetensors dtype for a {dtype} tensor")
    from ..utils import ITEMSIZES

    n = 1
    for s in tensor.shape:
        n *= int(s)
    return {"dtype": _SAFETENSORS_DTYPE[dtype], "shape": [int(s) for s in tensor.shape]}, n * ITEMSIZES[tensor.dtype]


def save_quantized(model, save_dir, max_shard_bytes: int = 2 * 10**9) -> None:
    """Writes ``model`` (config with its ``quantization_config``, generation config, safetensors weights with
    upstream's keys, sharded with an index above ``max_shard_bytes``) so that ``from_pretrained`` loads it back.

    The weights are streamed: each shard's header is made from the tensors' shapes first, then each tensor's
    bytes are written as it is made, so memory grows by one tensor, not by the model (``save_pretrained`` here
    keeps about one more copy of the model: 9.6 GiB peak RSS for a 7B NF4 model of 4.1 GiB).
    """
    import struct as _struct

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    shards, current, size = [], [], 0
    for key, tensor in _state_tensors(model):
        meta, nbytes = _safetensors_entry(tensor)
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((key, meta, nbytes))
        size += nbytes
    shards.append(current)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    where = {key: names[i] for i, shard in enumerate(shards) for key, _, _ in shard}
    files = {}
    try:
        for i, shard in enumerate(shards):
            header, offset = {"__metadata__": {"format": "pt"}}, 0
            for key, meta, nbytes in shard:
                header[key] = {**meta, "data_offsets": [offset, offset + nbytes]}
                offset += nbytes
            raw = json.dumps(header, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)
            f = files[names[i]] = open(save_dir / names[i], "wb")
            f.write(_struct.pack("<Q", len(raw)) + raw)
        from .._hostcall import act_array

        for key, tensor in _state_tensors(model):  # the same tensors, in the same order
            # read in place: asnumpy() of a tensor in MindSpore's CPU device memory makes a host copy that
            # stays with the tensor (a second copy of the model by the end)
            data = act_array(tensor)
            files[where[key]].write(data.tobytes() if data.ndim == 0 else memoryview(data.reshape(-1).view("u1")))
            del data
    finally:
        for f in files.values():
            f.close()
    if len(shards) > 1:
        total = sum(n for shard in shards for _, _, n in shard)
        (save_dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": where}, indent=2))
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(str(save_dir))
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(str(save_dir))

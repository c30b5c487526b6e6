"""``python -m bitsandbytes_ms`` / ``bnb-ms``: diagnostics and the command-line jobs.

    bnb-ms                 diagnostics (versions, backend, library, CPU features, kernel path)
    bnb-ms diagnostics     the same
    bnb-ms demo            diagnostics + a blockwise 8-bit quantize/dequantize round trip
    bnb-ms quantize        quantize a causal LM (default: the embedded model) and report what it costs
                           and keeps: memory, perplexity, logit agreement, prefill and decode speed, a
                           generated continuation (--model: an HF checkpoint directory or a .gguf file)
"""

from __future__ import annotations

import argparse
import gc
import os
import importlib.metadata
import math
import platform
import sys
import time


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


RELATED_PACKAGES = ("mindspore", "mindnlp", "numpy", "transformers", "peft", "accelerate", "safetensors",
                    "tokenizers", "gguf", "pip")


def sanity_check() -> None:
    """A blockwise 8-bit round trip, an NF4 Linear4bit forward and an 8-bit Adam step, checked against numpy;
    raises AssertionError with what differed."""
    import numpy as np
    from mindspore import Parameter, Tensor

    from bitsandbytes_ms import functional as F
    from bitsandbytes_ms import optim

    rng = np.random.RandomState(0)
    x = rng.randn(4096).astype(np.float32)
    q, st = F.quantize_blockwise(Tensor(x), blocksize=256)
    back = F.dequantize_blockwise(q, st).asnumpy()
    err = float(np.abs(back - x).max() / np.abs(x).max())
    assert err < 0.02, f"blockwise 8-bit round trip: max error {err:.4f} of absmax (expected < 0.02)"
    w = (rng.randn(64, 128) * 0.05).astype(np.float32)
    packed, qs = F.quantize_4bit(Tensor(w), quant_type="nf4")
    a = rng.randn(3, 128).astype(np.float32)
    ref = a @ F.dequantize_4bit(packed, qs).asnumpy().T
    out = F.linear_4bit(Tensor(a), packed, qs).asnumpy()
    assert np.allclose(out, ref, rtol=1e-4, atol=1e-4), "NF4 linear forward differs from the dequantized matmul"
    p = Parameter(Tensor(rng.rand(64, 80).astype(np.float32)), name="p")
    before = p.asnumpy().copy()
    opt = optim.Adam8bit([p], lr=1e-2, min_8bit_size=1)
    opt.step(grads=[Tensor(rng.randn(64, 80).astype(np.float32))])
    assert np.abs(p.asnumpy() - before).max() > 1e-4, "Adam8bit.step() did not update the parameter"


def diagnostics() -> int:
    """Versions, platform, backend, library, CPU kernel path, then a sanity check: 0 on SUCCESS, 1 otherwise."""
    import mindspore as ms

    import bitsandbytes_ms as bnb
    from bitsandbytes_ms import _ops, cextension

    print("bitsandbytes_ms diagnostics")
    print(f"  bitsandbytes_ms   {bnb.__ms_version__} (follows bitsandbytes {bnb.__upstream_version__})")
    print(f"  platform          {platform.platform()}"
          + (f" (libc {'-'.join(platform.libc_ver())})" if platform.system() == "Linux" else ""))
    print(f"  python            {platform.python_version()} ({sys.executable})")
    print("  related packages  " + ", ".join(f"{d} {_version(d)}" for d in RELATED_PACKAGES))
    print(f"  device target     {ms.get_context('device_target')}")
    print(f"  backend           {cextension.BNB_BACKEND}")
    print(f"  op backend        {_ops.backend()}  ({len(_ops.OPS)} ops; bitsandbytes_ms._ops)")
    if cextension.LIBRARY_ERROR is not None:
        print(f"  native library    NOT LOADED: {cextension.LIBRARY_ERROR}")
        print("  the ops run on the numpy reference backend: the same results, much slower (no fused decoder)")
    else:
        print(f"  native library    {cextension.LIBRARY_PATH}")
        _native_lines()
    print("sanity check: blockwise 8-bit round trip, NF4 linear forward, Adam8bit step ...")
    try:
        sanity_check()
    except Exception as e:  # noqa: BLE001  (any failure is reported in one line, exit 1)
        print(f"FAILED: {type(e).__name__}: {_first_line(e)}")
        return 1
    print("SUCCESS!" if cextension.LIBRARY_ERROR is None else "SUCCESS! (on the numpy reference backend)")
    return 0


def _native_lines() -> None:
    from bitsandbytes_ms import cextension

    feats = cextension.cpu_features()
    print(f"  CPU features      {' '.join(feats) if feats else '(none beyond baseline x86-64)'}")
    print(f"  CPU kernel path   {cextension.simd_level()}  (BNB_MS_SIMD=scalar|avx2|avx512 lowers it)")
    if cextension.BNB_BACKEND == "CPU":
        print(f"  CPU threads       {cextension.get_num_threads()}  (own pool, sleeps between calls; "
              "BNB_MS_NUM_THREADS=<n> overrides)")
        big, small = cextension.int8_gemm_path(), cextension.int8_gemm_path(1)
        print(f"  int8 GEMM path    {big}" + (f" ({small} below 8 rows)" if small != big else "")
              + "  (BNB_MS_INT8_GEMM=scalar|avx2|avx512|avxvnni|avx512vnni|amx forces one)")
        big, small = cextension.linear4_bf16_path(16), cextension.linear4_bf16_path(1)
        print(f"  4-bit bf16 path   {big}" + (f" ({small} below 16 rows)" if small != big else "")
              + ("  (BNB_MS_4BIT_AMX=0 keeps avx512bf16)" if big == "amx" else ""))
    print(f"  native ops        {len(cextension._native_table.OPS)} entry points in the C ABI table")


def demo() -> int:
    """Diagnostics, then a blockwise 8-bit round trip on a real weight matrix."""
    import numpy as np
    import mindspore as ms

    from bitsandbytes_ms import functional as F

    diagnostics()
    print()
    weight, source = _demo_tensor()
    A = ms.Tensor(weight)
    print(f"round trip: quantize_blockwise / dequantize_blockwise on {source} {tuple(weight.shape)} float32")
    for bs in (64, 256, 4096):
        t0 = time.perf_counter()
        q, state = F.quantize_blockwise(A, blocksize=bs)
        t1 = time.perf_counter()
        back = F.dequantize_blockwise(q, state)
        t2 = time.perf_counter()
        err = np.abs(back.asnumpy() - weight)
        rel = err.mean() / np.abs(weight).mean()
        stored = q.nbytes + state.absmax.nbytes
        print(f"  blocksize {bs:>5}: mean abs err {err.mean():.3e}, max {err.max():.3e}, rel {rel:.4f}; "
              f"{weight.nbytes / 2**20:.1f} MiB -> {stored / 2**20:.2f} MiB; "
              f"quantize {1e3 * (t1 - t0):.1f} ms, dequantize {1e3 * (t2 - t1):.1f} ms")
    return 0


def _demo_tensor():
    """The largest weight of the embedded model if it is there, else a seeded N(0, 0.02) matrix."""
    import numpy as np
    from pathlib import Path

    path = Path(__file__).resolve().parent / "default_model" / "model.safetensors"
    if path.exists():
        from safetensors.numpy import load_file

        tensors = load_file(str(path))
        name = max((k for k, v in tensors.items() if v.ndim == 2), key=lambda k: tensors[k].size)
        return tensors[name].astype(np.float32), f"embedded model weight '{name}'"
    rng = np.random.RandomState(0)
    return (rng.randn(1024, 1024) * 0.02).astype(np.float32), "seeded N(0, 0.02) matrix"


class CliError(Exception):
    """A user error: printed as one line (no traceback), exit code 2."""


DEFAULT_PROMPT = "The list type"


def quantize_job(args) -> int:
    """The main job: load, measure, quantize in place, measure again, generate, optionally save."""
    from pathlib import Path

    from tqdm import tqdm

    model_dir = Path(args.model) if args.model else Path(__file__).resolve().parent / "default_model"
    gguf_file = model_dir if model_dir.suffix.lower() == ".gguf" else None
    if gguf_file is not None and not gguf_file.is_file():
        raise CliError(f"--model {gguf_file}: no such file; pass a .gguf file or a local Hugging Face-format "
                       f"checkpoint directory")
    if gguf_file is None and not model_dir.exists():
        raise CliError(f"--model {model_dir}: no such directory; pass a local Hugging Face-format checkpoint "
                       f"directory (config.json + weights + tokenizer) or a .gguf file")
    if gguf_file is None and not (model_dir / "config.json").exists():
        raise CliError(f"--model {model_dir}: no config.json there; it is not a Hugging Face-format checkpoint")
    if args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be at least 1")
    if not math.isfinite(args.threshold) or args.threshold < 0:
        raise CliError(f"--threshold must be a finite number >= 0 (0 disables the outlier split); got {args.threshold}")
    if args.eval_window < 2:
        raise CliError(f"--eval-window must be at least 2 tokens; got {args.eval_window}")
    if args.eval_windows < 1:
        raise CliError(f"--eval-windows must be at least 1; got {args.eval_windows}")
    if args.eval_file is not None and not Path(args.eval_file).is_file():
        raise CliError(f"--eval-file {args.eval_file}: no such file")
    if args.eval_file is not None:
        try:
            Path(args.eval_file).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise CliError(f"--eval-file {args.eval_file}: not UTF-8 text (byte {e.start}: {e.reason}); pass a "
                           f"UTF-8 text file") from e
    if args.save is not None and not args.save.strip():  # "" was falsy: the job ran and saved nothing, exit 0
        raise CliError("--save: empty path; pass the directory to write the checkpoint to")
    if args.save:
        save_dir = Path(args.save)
        if save_dir.exists() and not save_dir.is_dir():
            raise CliError(f"--save {save_dir}: exists and is not a directory")
        if save_dir.is_dir() and any(save_dir.iterdir()) and not (save_dir / "config.json").exists():
            # the save swaps a new directory in: the files already there (not a checkpoint) would be deleted
            raise CliError(f"--save {save_dir}: a non-empty directory that holds no checkpoint (no config.json); its "
                           f"files would be replaced: pick a new or empty directory")
        if save_dir.resolve() == model_dir.resolve() and gguf_file is None:
            raise CliError(f"--save {save_dir}: is the --model directory; pick another directory")
        _check_writable(save_dir)

    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")  # mindnlp imports diffusers, which logs a banner
    gguf_note = ""
    if gguf_file is not None:
        # mindnlp before transformers (the conversion builds the tokenizer with transformers)
        import mindnlp  # noqa: F401

        from bitsandbytes_ms.integrations.gguf import GGUFConversionError, cached_hf_checkpoint

        try:
            t0 = time.perf_counter()
            model_dir, converted_now = cached_hf_checkpoint(gguf_file)
        except GGUFConversionError as e:
            raise CliError(f"--model {gguf_file}: {e}") from e
        gguf_note = (f" (converted from {gguf_file.name} in {time.perf_counter() - t0:.1f} s)" if converted_now
                     else f" (converted from {gguf_file.name} earlier; cached)")
        if args.save and Path(args.save).resolve() == model_dir.resolve():
            raise CliError(f"--save {args.save}: is the cached conversion of --model; pick another directory")

    # step 1 is the imports (most of a small model's start-up), step 2 the checkpoint
    with tqdm(total=2, desc="importing mindnlp, transformers", unit="step", leave=False) as bar:
        import mindnlp  # noqa: F401  (torch -> mindtorch, transformers on MindSpore)
        import transformers

        import bitsandbytes_ms

        bitsandbytes_ms.register()  # transformers' bitsandbytes code (save/load of the result) runs on us
        from transformers import AutoModelForCausalLM, AutoTokenizer

        transformers.logging.set_verbosity_error()
        bar.update(1)
        bar.set_description("loading")
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        try:
            config = AutoConfig.from_pretrained(str(model_dir))
        except Exception as e:  # noqa: BLE001  (any failure here is a bad checkpoint, said in one line)
            raise CliError(f"--model {model_dir}: cannot read its config.json ({_first_line(e)})") from e
        if getattr(config, "quantization_config", None):
            raise CliError(f"--model {model_dir}: the checkpoint is already quantized; pass a full-precision one "
                           f"(or load it with from_pretrained after bitsandbytes_ms.register())")
        if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise CliError(f"--model {model_dir}: not a causal language model checkpoint (model_type "
                           f"{config.model_type!r}); pass a Llama/Qwen2/GPT-2-style causal LM")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        except Exception as e:  # noqa: BLE001
            raise CliError(f"--model {model_dir}: cannot load its tokenizer ({_first_line(e)})") from e
        from bitsandbytes_ms.integrations import loading

        try:
            facts = loading.checkpoint_facts(model_dir, config)
        except Exception as e:  # noqa: BLE001
            raise CliError(f"--model {model_dir}: cannot build the model from its config.json "
                           f"({_first_line(e)})") from e
        # the fp32 reference ("before" columns) only where it fits: never an OOM kill on a big checkpoint
        fits, need, avail = loading.reference_fits(facts.fp32_bytes)
        model = None
        if args.reference == "always" or (args.reference == "auto" and fits):
            try:
                model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), output_loading_info=True)
            except Exception as e:  # noqa: BLE001
                raise CliError(f"--model {model_dir}: cannot load the model weights ({_error_summary(e)})") from e
            _check_loaded(model, info, model_dir)
            model.eval()
        bar.update(1)
    reference_note = (f"fp32 model evaluated (needs {_gb(need)}, {_gb(avail)} free)" if model is not None
                      else "skipped (--reference never)" if args.reference == "never"
                      else f"skipped: needs {_gb(need)}, {_gb(avail)} free (--reference always forces it)")

    from bitsandbytes_ms.integrations import evaluate as ev
    from bitsandbytes_ms.integrations import quant_4bit, quant_8bit

    eval_text = (Path(__file__).resolve().parent / "default_model" / "heldout.txt").read_text() \
        if args.eval_file is None else Path(args.eval_file).read_text(encoding="utf-8")
    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if max_pos and args.eval_window > max_pos:
        raise CliError(f"--eval-window {args.eval_window}: longer than the model's context ({max_pos} tokens)")
    windows = ev.eval_windows(tokenizer, eval_text, args.eval_window, args.eval_windows)
    if not windows or sum(len(w) - 1 for w in windows) < 16:
        raise CliError("the evaluation text is too short: it needs at least 17 tokens (--eval-file)")
    n_params = facts.n_params
    mem_before = ev.weight_memory(model) if model is not None else facts.fp32_bytes
    fp16_bytes = 2 * n_params

    ref = gen_before = None
    if model is not None:
        ref = ev.run_windows(model, windows, progress=lambda w: tqdm(w, desc="evaluating (original)", leave=False))
        if ref.nonfinite_positions:
            raise CliError(f"--model {model_dir}: the unquantized model computes NaN/inf logits at "
                           f"{_nonfinite(ref)}: its weights hold NaN/inf or its activations overflow, so there is no "
                           f"perplexity to compare with")
        gen_before = ev.generate_timed(model, tokenizer, args.prompt, args.max_new_tokens)
        del model  # the reference is done: free it before the quantized model is loaded
        gc.collect()

    model, load_seconds = _load_quantized(args, model_dir, facts)
    skip = [] if args.quantize_lm_head else None  # None: lm_head (and tied layers) stay in full precision
    if args.quantize_lm_head:  # the output layer (possibly tied to the input embedding) after loading
        if args.mode == "int8":
            quant_8bit(model, threshold=args.threshold, modules_to_not_convert=[], progress=False)
        else:
            quant_4bit(model, quant_type=args.mode, compute_dtype=args.compute_dtype,
                       compress_statistics=args.double_quant, modules_to_not_convert=[], progress=False)
    from bitsandbytes_ms.integrations.models import find_linear_layers
    from bitsandbytes_ms.nn import Linear4bit, Linear8bitLt
    from bitsandbytes_ms.nn.linear_fp import use_fast_fp_layers

    converted = [n for n, m in model.named_modules() if isinstance(m, (Linear4bit, Linear8bitLt))]
    skipped = find_linear_layers(model, [])[0]  # the linear layers left in full precision
    use_fast_fp_layers(model, skipped)
    if not converted:
        raise CliError(f"--model {model_dir}: no linear layers to quantize (all {len(skipped)} kept in full precision)")

    fused_note = "off (--no-fuse)"
    if args.no_fuse:
        from bitsandbytes_ms.integrations import fuse

        fuse(model, False)  # a quantized model fuses by itself on its first forward otherwise
    else:
        import warnings

        from bitsandbytes_ms.integrations import fuse

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fused = fuse(model)
        reason = next((str(w.message).split(": ", 2)[-1] for w in caught), "unsupported")
        fused_note = ("on: 2 native calls per decoder layer (bitsandbytes_ms.integrations.fuse)" if fused
                      else f"off: {reason}")
    mem_after = ev.weight_memory(model)
    lin_params = sum(_layer_params(model.get_submodule(n)) for n in converted)
    lin_after = sum(ev.weight_memory(model.get_submodule(n)) for n in converted)
    new = ev.run_windows(model, windows, progress=lambda w: tqdm(w, desc="evaluating (quantized)", leave=False))
    cmp = ev.compare_logits(ref, new) if ref is not None else None
    gen_after = ev.generate_timed(model, tokenizer, args.prompt, args.max_new_tokens)
    text = gen_after.text

    mib = 2**20
    print(f"model             {model_dir}{gguf_note} ({type(model).__name__}, {n_params / 1e6:.2f} M parameters)")
    print(f"mode              {args.mode}" + (f" (threshold {args.threshold})" if args.mode == "int8" else
                                              f" (compute_dtype {args.compute_dtype}, double quant {args.double_quant})"))
    print(f"reference         {reference_note}")
    print(f"loading           quantized while loading in {load_seconds:.1f} s ({_shards(facts)}, {facts.dtype}; "
          f"each linear weight quantized as it arrives)")
    print(f"layers converted  {len(converted)}: {_abbrev(converted)}")
    print(f"layers skipped    {len(skipped)}: {_abbrev([_kept(model, n) for n in skipped])}")
    out_name = _output_layer(model)
    if out_name is not None and out_name in converted:
        print(f"{out_name:<17} quantized ({args.mode})")
    print(f"fused decoder     {fused_note}")
    print(f"weight memory     {mem_before / mib:.2f} MiB -> {mem_after / mib:.2f} MiB "
          f"(x{mem_after / mem_before:.3f}; x{mem_after / fp16_bytes:.3f} of the fp16 model, {fp16_bytes / mib:.2f} MiB)")
    print(f"quantized layers  {2 * lin_params / mib:.2f} MiB as fp16 -> {lin_after / mib:.2f} MiB "
          f"(x{lin_after / (2 * lin_params):.3f}); embeddings, norms"
          f"{'' if out_name in converted else ' and ' + (out_name or 'lm_head')} stay in full precision")
    ppl_before = "-" if ref is None else f"{ref.perplexity:.3f}"
    if new.nonfinite_positions:
        print(f"perplexity        {ppl_before} -> {new.perplexity:.3f} (NaN/inf logits at "
              f"{_nonfinite(new)} of the quantized model)")
    elif ref is None:
        print(f"perplexity        - -> {new.perplexity:.3f} on {new.n_tokens} held-out tokens (no fp32 reference)")
    else:
        print(f"perplexity        {ref.perplexity:.3f} -> {new.perplexity:.3f} "
              f"({100 * (new.perplexity / ref.perplexity - 1):+.2f}%) on {ref.n_tokens} held-out tokens")
    if cmp is None:
        print("top-1 agreement   - (no fp32 reference)")
        print("logit error       - (no fp32 reference)")
    else:
        print(f"top-1 agreement   {100 * cmp['top1_agreement']:.2f}% with the unquantized model")
        print(f"logit error       max {cmp['max_abs_logit_err']:.4f}, mean {cmp['mean_abs_logit_err']:.4f}")
    print(f"prefill tok/s     {_rate(ref and ref.prefill_tokens_per_second)} -> {_rate(new.prefill_tokens_per_second)} "
          f"(forward over {len(windows[-1])}-token held-out windows, median of {max(len(windows) - 1, 1)})")
    new_before = "-" if gen_before is None else max(gen_before.new_tokens - 1, 0)
    print(f"decode tok/s      {_rate(gen_before and gen_before.decode_tokens_per_second)} -> "
          f"{_rate(gen_after.decode_tokens_per_second)} "
          f"(greedy, the fp32 model unfused -> the quantized one{' fused' if fused_note.startswith('on') else ''}; "
          f"new tokens after the first: {new_before} -> {max(gen_after.new_tokens - 1, 0)})")
    print(f"tokens/s          {_rate(gen_before and gen_before.new_tokens / gen_before.seconds)} -> "
          f"{gen_after.new_tokens / gen_after.seconds:.1f} "
          f"(greedy, {args.max_new_tokens} new tokens, end to end incl. the prompt)")
    print(f"prompt            {args.prompt!r}")
    print(f"continuation      {text!r}")
    if new.nonfinite_positions:
        print(f"bnb-ms quantize: error: the quantized model computes NaN/inf logits at {_nonfinite(new)} (the "
              f"unquantized model's are finite)" + ("; --save skipped" if args.save else ""), file=sys.stderr)
        return 1
    if args.save:
        from transformers import BitsAndBytesConfig

        from .utils import DTYPE_OF_SUFFIX

        save_dir = Path(args.save)
        if args.mode == "int8":
            model.config.quantization_config = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=args.threshold,
                                                                  llm_int8_skip_modules=skip)
        else:
            model.config.quantization_config = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type=args.mode, bnb_4bit_use_double_quant=args.double_quant,
                bnb_4bit_compute_dtype=DTYPE_OF_SUFFIX[args.compute_dtype],
                llm_int8_skip_modules=skip)
        try:
            from bitsandbytes_ms.integrations.loading import save_quantized

            # streamed, one tensor at a time (save_pretrained holds another copy of the model)
            _save_atomically(save_dir, lambda d: (save_quantized(model, d),
                                                  tokenizer.save_pretrained(str(d))))
        except Exception as e:  # noqa: BLE001  (safetensors raises its own error types; any failure is one line)
            raise CliError(f"--save {save_dir}: saving failed ({_first_line(e)}); {save_dir} was left as it was") from e
        print(f"saved             {save_dir}")
    return 0


def _load_quantized(args, model_dir, facts):
    """The quantized model, read shard by shard with each linear weight quantized as it arrives
    (bitsandbytes_ms.integrations.loading); (model, seconds)."""
    from bitsandbytes_ms.integrations import loading

    t0 = time.perf_counter()
    try:
        model, info = loading.load_quantized(model_dir, loading.bnb_config(args.mode, args.threshold,
                                             args.compute_dtype, args.double_quant), facts.dtype)
    except Exception as e:  # noqa: BLE001
        raise CliError(f"--model {model_dir}: cannot load the model weights ({_error_summary(e)})") from e
    _check_loaded(model, info, model_dir)
    return model, time.perf_counter() - t0


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _shards(facts) -> str:
    if facts.shards == 0:
        return "not safetensors: read whole"
    return f"{facts.shards} safetensors shard{'s' if facts.shards > 1 else ''}"


def _nonfinite(stats) -> str:
    return f"{stats.nonfinite_positions} of {stats.n_tokens} held-out positions"


def _rate(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _check_writable(save_dir) -> None:
    """--save must name a place a directory can be written to: tried now (a temporary directory beside it),
    before any work, so a save that cannot happen fails in one line at the start (permissions are checked by
    writing: root ignores mode bits, a read-only file system does not)."""
    import tempfile
    from pathlib import Path

    save_dir = Path(save_dir)
    parent = save_dir.parent
    if not parent.is_dir():
        raise CliError(f"--save {save_dir}: no such parent directory {parent}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{save_dir.name}.check-", dir=str(parent)))
    except OSError as e:
        raise CliError(f"--save {save_dir}: cannot write in {parent} ({e.strerror or _first_line(e)})") from e


def _save_atomically(save_dir, write) -> None:
    """``write(tmp)`` into a temporary directory beside ``save_dir``, then swap it into place: a failure leaves
    ``save_dir`` as it was (no new config.json beside stale weights) and no temporary directory behind."""
    import shutil
    import tempfile
    from pathlib import Path

    save_dir = Path(save_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{save_dir.name}.saving-", dir=str(save_dir.parent)))
    old = None
    try:
        write(tmp)
        _check_saved(tmp)  # a writer that failed without raising must not be reported as a save
        if save_dir.exists():
            old = save_dir.with_name(f".{save_dir.name}.old-{os.getpid()}")
            save_dir.rename(old)
        tmp.rename(save_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not save_dir.exists():
            old.rename(save_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _check_saved(d) -> None:
    """Raises OSError unless ``d`` holds a complete checkpoint: config.json and the weights (model.safetensors,
    or an index and every shard it names), each safetensors file as long as its header says."""
    import json
    from pathlib import Path

    d = Path(d)
    if not (d / "config.json").is_file():
        raise OSError("config.json was not written")
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        _check_safetensors(d / name)


def _check_safetensors(path) -> None:
    import json
    import struct

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n)) if 0 < n <= size - 8 else None
    except (OSError, ValueError, struct.error) as e:
        raise OSError(f"the weights file {path.name} was not written ({_first_line(e)})") from e
    if not isinstance(header, dict):
        raise OSError(f"the weights file {path.name} is incomplete (no valid header)")
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        raise OSError(f"the weights file {path.name} is incomplete ({size} bytes; its header needs {8 + n + end})")


def _check_loaded(model, info, model_dir) -> None:
    """The loaded model must hold the checkpoint's weights: nothing left randomly initialised (a missing tensor,
    a config declaring more layers), nothing of the checkpoint left unused (a config declaring fewer layers would
    silently run a truncated model), nothing resized, every weight floating point."""
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise CliError(f"--model {model_dir}: the checkpoint lacks {len(missing)} tensor(s) the config needs "
                       f"({_abbrev(sorted(missing), 3)}); it would run on randomly initialised weights")
    unused = list(info.get("unexpected_keys") or [])  # transformers already leaves out the keys it may ignore
    if unused:
        raise CliError(f"--model {model_dir}: the checkpoint holds {len(unused)} tensor(s) the config has no place "
                       f"for ({_abbrev(sorted(unused), 3)}); the config and the checkpoint do not match")
    mismatched = list(info.get("mismatched_keys") or [])
    if mismatched:
        raise CliError(f"--model {model_dir}: tensors of the wrong shape: {_abbrev([str(m) for m in mismatched], 3)}")
    from bitsandbytes_ms.nn import Linear4bit, Linear8bitLt

    bad = sorted({str(p.dtype).replace("mindspore.", "") for m in model.modules()
                  if not isinstance(m, (Linear4bit, Linear8bitLt))  # quantized while loading: int codes
                  for p in m.parameters(recurse=False) if not p.dtype.is_floating_point})
    if bad:
        raise CliError(f"--model {model_dir}: weights of dtype {', '.join(bad)}; a full-precision (float32/float16/"
                       f"bfloat16) checkpoint is expected")


def _error_summary(e: Exception) -> str:
    """The first line of an error and the lines that say what mismatched (size mismatch ..., up to 3)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    detail = [ln for ln in lines[1:] if "size mismatch" in ln or "shape" in ln][:3]
    return "; ".join([lines[0].rstrip(":")] + detail)[:600]


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:160]


def _layer_params(module) -> int:
    """Weight + bias elements of a quantized linear layer (its logical, unpacked size)."""
    n = module.in_features * module.out_features
    return n + (module.bias.shape[0] if module.bias is not None else 0)


def _kept(model, name: str) -> str:
    """A kept layer's name, and how it runs."""
    from bitsandbytes_ms.nn import LinearFP

    if isinstance(model.get_submodule(name), LinearFP):
        return f"{name} (full precision, fast native GEMV)"
    return f"{name} (full precision)"


def _output_layer(model):
    from bitsandbytes_ms.integrations.models import _output_layer_name

    return _output_layer_name(model)


def _abbrev(names, k: int = 4) -> str:
    if not names:
        return "-"
    return ", ".join(names[:k]) + (f", ... (+{len(names) - k})" if len(names) > k else "")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (what is wrong and where to look), not a usage dump."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def main(argv=None) -> int:
    parser = _Parser(prog="bnb-ms", description="bitsandbytes_ms command line")
    sub = parser.add_subparsers(dest="cmd", parser_class=_Parser)
    sub.add_parser("diagnostics", help="print versions, backend, library and CPU kernel path")
    sub.add_parser("demo", help="diagnostics + a blockwise 8-bit quantize/dequantize round trip")
    q = sub.add_parser("quantize", help="quantize a causal LM and report memory, quality, speed, a generation")
    q.add_argument("--model", help="local Hugging Face-format checkpoint directory, or a .gguf file (converted to "
                                  "fp32 once, cached in ~/.cache/bitsandbytes_ms/models/gguf; default: the embedded model)")
    q.add_argument("--mode", choices=("int8", "nf4", "fp4"), default="int8")
    q.add_argument("--threshold", type=float, default=6.0, help="LLM.int8() outlier threshold (int8 mode)")
    q.add_argument("--double-quant", action="store_true", help="quantize the 4-bit absmax again (compress_statistics)")
    q.add_argument("--compute-dtype", choices=("fp32", "fp16", "bf16"), default="fp32", help="4-bit compute dtype")
    q.add_argument("--save", help="save the quantized model (safetensors + quantization config) to this directory")
    q.add_argument("--prompt", default=DEFAULT_PROMPT)
    q.add_argument("--max-new-tokens", type=int, default=24)
    q.add_argument("--quantize-lm-head", action="store_true",
                   help="quantize the output layer (lm_head) too; by default it stays in full precision (upstream's "
                        "llm_int8_skip_modules) and runs a native GEMV. A tied input embedding keeps its weight")
    q.add_argument("--no-fuse", action="store_true",
                   help="keep mindnlp's own decoder forward (default: fuse each quantized decoder layer into 2 native "
                        "calls where the architecture is supported: Llama/Qwen2/Qwen3/Mistral with int8, 4-bit or fp32 layers)")
    q.add_argument("--reference", choices=("auto", "always", "never"), default="auto",
                   help="evaluate the full-precision (fp32) model first, for the 'before' columns: auto (default) only "
                        "where its weights + 20%% fit in the available memory; the quantized model is always "
                        "quantized while loading, shard by shard, and never needs it")
    q.add_argument("--eval-file", help="text for the perplexity evaluation (default: the embedded held-out text)")
    q.add_argument("--eval-window", type=int, default=128, help="tokens per evaluation window")
    q.add_argument("--eval-windows", type=int, default=8, help="number of evaluation windows")
    args = parser.parse_args(argv)

    import mindspore as ms

    ms.set_device("CPU") if ms.get_context("device_target") != "GPU" else None
    ms.runtime.launch_blocking()
    if args.cmd in (None, "diagnostics"):
        return diagnostics()
    from bitsandbytes_ms import cextension

    if cextension.LIBRARY_ERROR is not None:
        print(f"bnb-ms {args.cmd}: error: {cextension.LIBRARY_ERROR}", file=sys.stderr)
        return 1
    if args.cmd == "demo":
        return demo()
    if args.cmd == "quantize":
        try:
            return quantize_job(args)
        except CliError as e:
            print(f"bnb-ms quantize: error: {e}", file=sys.stderr)
            return 2
    parser.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

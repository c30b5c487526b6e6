"""Decode (and prefill) speed of the fused decode path vs the unfused quantized model, same run.

    .venv/bin/python tools/bench_fused.py [--model DIR] [--mode nf4|fp4] [--no-dq] [--prompt 16] [--new 32]

Without --model: a random Llama of SmolLM2-135M's shape (hidden 576, 30 layers, 9/3 heads, intermediate 1536,
vocab 49152, tied embeddings). Decode ms/token = (t(generate n2 tokens) - t(generate n1 tokens)) / (n2 - n1),
greedy, EOS off; fused and unfused alternate, best of --rounds. MindSpore runs with launch_blocking().
"""
import argparse
import time

import numpy as np
import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from bitsandbytes_ms.integrations import fuse, quant_4bit, unfuse  # noqa: E402
from bitsandbytes_ms.integrations import fused as FU  # noqa: E402

transformers.logging.set_verbosity_error()


def smollm2_config(layers=30):
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2, pad_token_id=2)


def gen_time(model, ids, n):
    with torch.no_grad():
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - t, out.asnumpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--mode", default="nf4")
    ap.add_argument("--no-dq", action="store_true")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if a.model:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        name = a.model
    else:
        model = AutoModelForCausalLM.from_config(smollm2_config(a.layers))
        rng = np.random.RandomState(0)
        for _, p in model.named_parameters():
            p.data.copy_(torch.tensor((rng.randn(*p.shape) * 0.05).astype(np.float32)))
        name = f"random SmolLM2-135M-shaped Llama ({a.layers} layers)"
    model.eval()
    quant_4bit(model, quant_type=a.mode, compute_dtype="fp32", compress_statistics=not a.no_dq, progress=False)
    ids = torch.tensor(np.random.RandomState(1).randint(3, model.config.vocab_size, (1, a.prompt)).astype(np.int64))
    assert fuse(model)
    n1, n2 = 2, 2 + a.new
    res = {"fused": [], "unfused": []}
    pre = {"fused": [], "unfused": []}
    toks = {}
    for r in range(a.rounds):
        for mode in ("fused", "unfused"):
            FU.set_enabled(mode == "fused")
            gen_time(model, ids, 1)  # warm-up
            t1, _ = gen_time(model, ids, n1)
            t2, out = gen_time(model, ids, n2)
            t0, _ = gen_time(model, ids, 1)
            res[mode].append((t2 - t1) / (n2 - n1) * 1e3)
            pre[mode].append(t0 * 1e3)
            toks[mode] = out
    FU.set_enabled(True)
    f, u = min(res["fused"]), min(res["unfused"])
    print(f"model      {name}, {a.mode}{'' if a.no_dq else '+DQ'}, prompt {a.prompt}, {a.new} new tokens")
    print(f"decode     fused {f:.2f} ms/token ({1e3 / f:.1f} tok/s)   unfused {u:.2f} ms/token ({1e3 / u:.1f} tok/s)"
          f"   x{u / f:.1f}")
    print(f"prefill+1  fused {min(pre['fused']):.1f} ms   unfused {min(pre['unfused']):.1f} ms  ({a.prompt} tokens)")
    print(f"rounds     fused {['%.2f' % x for x in res['fused']]}  unfused {['%.2f' % x for x in res['unfused']]}")
    print(f"same greedy tokens: {bool((toks['fused'] == toks['unfused']).all())}")


if __name__ == "__main__":
    main()

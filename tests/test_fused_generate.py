"""generate's sampling loop in numpy for a fused model (integrations/fused_generate.py, patch fused-sample): the
same sequences, scores and logits as transformers' own loop over the same fused forward, for greedy and seeded
sampling, EOS with pad filling, batches with left padding, the min-length processors, processors and stopping
criteria it leaves to transformers, streamers and return_dict_in_generate; generations it does not take run
transformers' loop."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")

import mindnlp  # noqa: E402,F401
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, StoppingCriteria, StoppingCriteriaList  # noqa: E402
from transformers.generation.streamers import BaseStreamer  # noqa: E402

from bitsandbytes_ms.integrations import fuse, quant_4bit, unfuse  # noqa: E402
from bitsandbytes_ms.integrations import fused as FU  # noqa: E402
from bitsandbytes_ms.integrations import fused_generate as G  # noqa: E402
from bitsandbytes_ms.integrations.patches import registry  # noqa: E402

IDS = np.array([[0, 0, 5, 77, 301, 9], [12, 40, 7, 3, 88, 150]], np.int64)
MASK = (IDS != 0).astype(np.int64)


@pytest.fixture(scope="module")
def model():
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    m = AutoModelForCausalLM.from_config(cfg).eval()
    rng = np.random.RandomState(0)
    for _, p in m.named_parameters():  # mindtorch's random init ignores torch.manual_seed: the same model every run
        p.data.copy_(torch.tensor((rng.randn(*p.shape) * 0.1).astype(np.float32)))
    quant_4bit(m, quant_type="nf4", compute_dtype="fp32", progress=False)
    assert fuse(m)
    yield m
    unfuse(m)


class _Collect(BaseStreamer):
    def __init__(self):
        self.got, self.ended = [], False

    def put(self, value):
        self.got.append(np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value).reshape(-1).tolist())

    def end(self):
        self.ended = True


class _StopAfterToken(StoppingCriteria):  # a criterion the loop does not know: run on tensors
    def __init__(self, tok):
        self.tok = tok

    def __call__(self, input_ids, scores, **kw):
        return (input_ids[:, -1] == self.tok)


def _gen(m, seed=None, **kw):
    args = dict(attention_mask=torch.tensor(MASK), max_new_tokens=8, pad_token_id=0)
    args.update(kw)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        return m.generate(torch.tensor(IDS), **args)


def _both(m, **kw):
    """(numpy loop's output, transformers' loop's output) of the same generate call, and whether the loop ran."""
    n0 = FU.stats["numpy_loops"]
    ours = _gen(m, **kw)
    ran = FU.stats["numpy_loops"] == n0 + 1
    registry.remove(["fused-sample"])
    try:
        ref = _gen(m, **kw)
    finally:
        registry.apply(["fused-sample"])
    return ours, ref, ran


def _arr(t):
    return t.asnumpy()


def _same(a, b):
    if hasattr(a, "sequences"):
        np.testing.assert_array_equal(_arr(a.sequences), _arr(b.sequences))
        for k in ("scores", "logits"):
            x, y = getattr(a, k), getattr(b, k)
            assert (x is None) == (y is None), k
            if x is not None:
                assert len(x) == len(y)
                for s, t in zip(x, y):
                    np.testing.assert_array_equal(_arr(s), _arr(t), err_msg=k)
    else:
        np.testing.assert_array_equal(_arr(a), _arr(b))


def _first_token(m, row=1, step=2):
    return int(_arr(_gen(m, do_sample=False))[row, IDS.shape[1] + step])


CASES = {
    "greedy": dict(do_sample=False),
    "greedy-dict-scores-logits": dict(do_sample=False, return_dict_in_generate=True, output_scores=True,
                                      output_logits=True),
    "min-new-tokens": dict(do_sample=False, min_new_tokens=8, eos_token_id=3),
    "repetition-penalty": dict(do_sample=False, repetition_penalty=1.3),
    "sampling-top-k-1": dict(do_sample=True, top_k=1, temperature=0.7),  # a draw from one token: greedy's
}


@pytest.mark.parametrize("case", list(CASES))
def test_numpy_loop_gives_transformers_loop_output(model, case):
    ours, ref, ran = _both(model, **CASES[case])
    assert ran
    _same(ours, ref)


@pytest.mark.parametrize("kw", [dict(), dict(top_k=5, top_p=0.9, temperature=0.7)], ids=["default", "top-k-p-t"])
def test_sampling_draws_only_tokens_the_processed_scores_allow(model, kw):
    """mindtorch's sampling is not reproducible by torch.manual_seed (two seeded runs of transformers' own loop
    differ), so draws cannot be compared one to one: every drawn token must have a finite processed score (top-k /
    top-p leave -inf elsewhere), and the scores must be transformers' processors' output for the sequence drawn."""
    n0 = FU.stats["numpy_loops"]
    out = _gen(model, do_sample=True, return_dict_in_generate=True, output_scores=True, output_logits=True, **kw)
    assert FU.stats["numpy_loops"] == n0 + 1
    seq = _arr(out.sequences)
    eos = model.generation_config.eos_token_id
    live = np.ones(2, bool)  # rows not finished (a finished row takes the pad token)
    for t, (sc, lg) in enumerate(zip(out.scores, out.logits)):
        sc, lg = _arr(sc), _arr(lg)
        tok = seq[:, IDS.shape[1] + t]
        kept = sc > -1e30  # top-k / top-p fill the others with -inf (mindtorch: float32's lowest)
        assert np.all(kept[np.arange(2), tok][live]), t
        assert np.all(tok[~live] == 0)
        live &= tok != eos
        if kw:
            assert np.all(kept.sum(-1) <= 5) and np.all(kept.sum(-1) >= 1)  # top_k 5 applied
        # the processors on tensors, as transformers' loop calls them, give these scores
        from transformers import GenerationConfig
        lp = model._get_logits_processor(GenerationConfig(do_sample=True, **kw), IDS.shape[1], None, None, None)
        want = _arr(lp(torch.tensor(seq[:, :IDS.shape[1] + t]), torch.tensor(lg)))
        np.testing.assert_array_equal(sc, want)


def test_draw_is_the_inverse_cdf_and_never_a_filtered_token():
    s = np.array([[0.0, np.log(3.0), -np.inf, -3.4e38], [-np.inf, 0.0, -np.inf, 0.0]], np.float32)
    # row 0: p = (1/4, 3/4, 0, 0): u < 1/4 -> 0, else 1; row 1: p = (0, 1/2, 0, 1/2)
    for u, want in [((0.0, 0.0), (0, 1)), ((0.2499, 0.4999), (0, 1)), ((0.2501, 0.5001), (1, 3)),
                    ((0.9999, 0.9999), (1, 3))]:
        np.testing.assert_array_equal(G.draw(s, np.array(u)), want)
    with pytest.raises(RuntimeError, match="probability"):
        G.draw(np.array([[np.nan, 0.0]], np.float32), np.array([0.5]))


def test_eos_fills_finished_rows_with_pad_and_stops_when_all_finished(model):
    eos = _first_token(model)  # row 1 generates it at step 3
    ours, ref, ran = _both(model, do_sample=False, eos_token_id=eos, max_new_tokens=30)
    assert ran
    _same(ours, ref)
    seq = _arr(ours)
    row = seq[1, IDS.shape[1]:]
    k = int(np.argmax(row == eos))
    assert row[k] == eos and np.all(row[k + 1:] == 0)  # pad after EOS


def test_custom_stopping_criterion_and_streamer(model):
    tok = _first_token(model, row=0, step=4)
    s1, s2 = _Collect(), _Collect()
    ours, ref, ran = _both(model, do_sample=False, stopping_criteria=StoppingCriteriaList([_StopAfterToken(tok)]),
                         streamer=None)
    assert ran
    one = torch.tensor(IDS[1:])
    with torch.no_grad():
        a = model.generate(one, attention_mask=torch.ones_like(one), max_new_tokens=6, pad_token_id=0, streamer=s1,
                           do_sample=False)
        registry.remove(["fused-sample"])
        try:
            b = model.generate(one, attention_mask=torch.ones_like(one), max_new_tokens=6, pad_token_id=0,
                               streamer=s2, do_sample=False)
        finally:
            registry.apply(["fused-sample"])
    np.testing.assert_array_equal(_arr(a), _arr(b))
    assert s1.got == s2.got and s1.ended and s2.ended and len(s1.got) == 7  # the prompt, then 6 tokens
    _same(ours, ref)
    assert _arr(ours)[0, IDS.shape[1] + 4] == tok  # the criterion saw row 0's token at step 5


@pytest.mark.parametrize("kw, reason", [(dict(output_hidden_states=True, return_dict_in_generate=True),
                                         "attention / hidden-state outputs"),
                                        (dict(use_cache=False), "no cache")])
def test_generations_the_loop_does_not_take_run_transformers_loop(model, kw, reason):
    n0 = FU.stats["numpy_loops"]
    out = _gen(model, do_sample=False, **kw)
    assert FU.stats["numpy_loops"] == n0
    seq = out.sequences if hasattr(out, "sequences") else out
    assert _arr(seq).shape == (2, IDS.shape[1] + 8)


def test_loop_reason_names_each_case():
    from transformers import GenerationConfig

    gc = GenerationConfig()
    base = {"past_key_values": object(), "cache_position": torch.arange(3), "attention_mask": torch.ones(1, 3)}
    assert G.loop_reason(gc, False, base, False) is None
    assert G.loop_reason(gc, True, base, False) == "synced_gpus"
    assert G.loop_reason(gc, False, base, True) == "encoder-decoder"
    assert G.loop_reason(gc, False, {**base, "token_type_ids": 1}, False) == "model inputs ['token_type_ids']"
    assert G.loop_reason(gc, False, {**base, "attention_mask": torch.ones(1, 1, 3, 3)}, False) == \
        "a non-2-D attention mask"
    assert G.loop_reason(GenerationConfig(prefill_chunk_size=4), False, base, False) == "prefill chunking"


def test_positions_match_transformers_rule():
    m = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(G.positions(m, 5), [[1, 1, 0, 1, 2], [0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(G.positions(m, 1), [[2], [4]])


def test_unfused_model_runs_transformers_loop():
    cfg = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64)
    m = AutoModelForCausalLM.from_config(cfg).eval()
    n0 = FU.stats["numpy_loops"]
    with torch.no_grad():
        out = m.generate(torch.tensor(IDS[:1]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert FU.stats["numpy_loops"] == n0 and _arr(out).shape == (1, IDS.shape[1] + 3)

"""train.shrink_batch (train/sampler.py) on the embedded model: greedy output equal to
transformers' generate while the batch shrinks, the same logits processors as generate's, and
what it leaves to generate."""

import pytest
import torch
from transformers import GenerationConfig

from evotrainer.train.sampler import draw, handles, processors, shrinking, shrinking_generate

# Short answers and long ones, so rows end at different steps; prompts of different lengths, so
# the batch is left-padded.
QUESTIONS = ["What is 2 + 3? Reply with the number only.",
             "Explain, step by step and at length, how long division works, with an example.",
             "Say yes.",
             "Write a short poem about the sea, then explain each line of it in detail."]


@pytest.fixture(scope="module")
def policy(embedded_model_dir):
    from evotrainer.policy import load_policy

    model, tokenizer = load_policy(str(embedded_model_dir))
    return model.eval(), tokenizer


def _batch(tokenizer):
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in QUESTIONS]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side


def _config(tokenizer, **kw) -> GenerationConfig:
    base = dict(max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=[tokenizer.eos_token_id], disable_compile=True)
    return GenerationConfig(**{**base, **kw})


def test_greedy_output_equals_generate_while_the_batch_shrinks(policy):
    model, tokenizer = policy
    enc, config = _batch(tokenizer), _config(tokenizer)
    assert enc["attention_mask"].min() == 0, "the prompts should differ in length"
    with torch.no_grad():
        reference = model.generate(**enc, generation_config=config)
    sizes: list[int] = []
    ours = shrinking_generate(model, enc["input_ids"], enc["attention_mask"], config, sizes)
    assert torch.equal(ours, reference)
    assert sizes[0] == len(QUESTIONS) and min(sizes) < len(QUESTIONS), sizes  # rows left as they ended
    assert sizes == sorted(sizes, reverse=True)
    assert len(sizes) == reference.shape[1] - enc["input_ids"].shape[1]  # one pass per decoded column


def test_sampling_goes_through_the_processors(policy):
    """top_k=1 leaves one token to draw: sampling then is the greedy output, which it would not be
    without the processors (temperature 2 over the whole vocabulary)."""
    model, tokenizer = policy
    enc = _batch(tokenizer)
    with torch.no_grad():
        greedy = model.generate(**enc, generation_config=_config(tokenizer))
    torch.manual_seed(0)
    sampled = shrinking_generate(model, enc["input_ids"], enc["attention_mask"],
                                 _config(tokenizer, do_sample=True, temperature=2.0, top_k=1))
    assert torch.equal(sampled, greedy)
    torch.manual_seed(0)
    free = shrinking_generate(model, enc["input_ids"], enc["attention_mask"],
                              _config(tokenizer, do_sample=True, temperature=2.0))
    assert not torch.equal(free, greedy)


def test_the_processors_are_generates(policy):
    """Every knob the harness exposes (harness/spec.py: temperature, top_k, top_p, min_p,
    repetition_penalty), compared with transformers' own list on the same scores."""
    from transformers.generation import LogitsProcessorList

    model, tokenizer = policy
    config = _config(tokenizer, do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05,
                     repetition_penalty=1.3)
    assert handles(config)
    ids = _batch(tokenizer)["input_ids"]
    scores = torch.randn(ids.shape[0], model.config.vocab_size, generator=torch.Generator().manual_seed(1)) * 4
    ours = scores.clone()
    for p in processors(config):
        ours = p(ids, ours)
    # transformers' private builder, used here only to check ours against it
    theirs = model._get_logits_processor(generation_config=config, input_ids_seq_length=ids.shape[1],
                                         encoder_input_ids=ids, prefix_allowed_tokens_fn=None,
                                         logits_processor=LogitsProcessorList(), device="cpu", model_kwargs={})
    assert torch.equal(ours, theirs(ids, scores.clone()))
    assert torch.isinf(ours).any() and not torch.isinf(ours).all(dim=-1).any()  # the warpers cut, keep some


def test_what_it_does_not_reproduce_goes_to_generate(policy):
    model, tokenizer = policy
    for unhandled in ({"min_new_tokens": 5}, {"no_repeat_ngram_size": 2}, {"num_beams": 2},
                      {"cache_implementation": "static"}, {"suppress_tokens": [5]}):
        assert not handles(_config(tokenizer, **unhandled)), unhandled
    enc = _batch(tokenizer)
    sizes: list[int] = []
    with shrinking(model, sizes):
        assert "generate" in vars(model)
        with torch.no_grad():
            model.generate(**enc, generation_config=_config(tokenizer, max_new_tokens=3))
        assert sizes, "the handled call should run the shrinking sampler"
        sizes.clear()
        with torch.no_grad():
            out = model.generate(**enc, generation_config=_config(tokenizer, max_new_tokens=3, min_new_tokens=3))
        assert not sizes and out.shape[1] == enc["input_ids"].shape[1] + 3  # transformers' generate ran it
    assert "generate" not in vars(model)  # the class's method again


def test_held_out_greedy_decoding_answers_as_generate_did(policy):
    """The held-out evaluation's greedy decoding (policy/hf_backend.py) now shrinks its batch:
    the same texts, truncation flags and token counts as `generate` with the old call."""
    from evotrainer.policy.hf_backend import Generation, chat_prompt, generate_greedy

    model, tokenizer = policy
    prompts = [chat_prompt(tokenizer, q) for q in QUESTIONS]
    ours = generate_greedy(model, tokenizer, prompts, 40, batch_size=3)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    reference = []
    try:
        for start in (0, 3):
            enc = tokenizer(prompts[start:start + 3], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=40, do_sample=False, use_cache=True,
                                     pad_token_id=tokenizer.pad_token_id)
            for row in ids[:, enc["input_ids"].shape[1]:].tolist():
                end = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else None
                body = row if end is None else row[:end]
                reference.append(Generation(tokenizer.decode(body, skip_special_tokens=True), end is None,
                                            len(body) + (end is not None)))
    finally:
        tokenizer.padding_side = side
    assert ours == reference
    assert {g.truncated for g in ours} == {True, False}, "some answers should end and some run out"


def test_a_config_without_an_end_token_goes_to_generate(policy):
    _, tokenizer = policy
    assert not handles(_config(tokenizer, eos_token_id=None))


def test_draw_samples_each_row_from_its_own_weights():
    """Inverse-CDF draws (sampler.draw): each row's frequencies match its weights (four standard
    errors), unnormalised rows included, and a zero weight is never drawn."""
    weights = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0],
                            [2.0, 0.0, 0.0, 0.0, 0.0, 6.0],
                            [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    n = 40_000
    torch.manual_seed(0)
    drawn = draw(weights.repeat_interleave(n, dim=0)).view(3, n)
    for row, w in zip(drawn, weights):
        p = w / w.sum()
        freq = torch.bincount(row, minlength=len(w)).double() / n
        assert torch.all(freq[p == 0] == 0), freq
        se = (p * (1 - p) / n).sqrt().double()
        assert torch.all((freq - p.double()).abs() <= 4 * se + 1e-12), (freq, p)


def test_draw_never_picks_a_zero_weight_at_either_end_of_the_uniform(monkeypatch):
    weights = torch.tensor([[0.0, 0.25, 0.75, 0.0], [0.0, 0.0, 1e-30, 0.0]])
    for u in (0.0, 1.0 - 2**-24, 1.0):  # the smallest and largest numbers, and one rounding can reach
        monkeypatch.setattr(torch, "rand", lambda shape, u=u, **kw: torch.full(shape, u, **kw))
        picked = draw(weights)
        assert torch.all(weights[torch.arange(2), picked] > 0), (u, picked)

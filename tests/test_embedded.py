"""The embedded model's tokenizer must stop generation at the chat template's end of turn."""

import pytest
from transformers import AutoTokenizer

from evotrainer.policy.embedded import EXPECTED_EOS, PolicyError, fix_eos


def test_fix_eos_repairs_the_eos_some_transformers_releases_read_from_the_gguf(embedded_model_dir):
    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    tok.eos_token = "<|im_start|>"  # what transformers 5.17 reads from this GGUF
    fix_eos(tok)
    assert tok.eos_token == EXPECTED_EOS
    assert tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id != tok.convert_tokens_to_ids("<|im_start|>")


def test_fix_eos_refuses_a_vocab_without_the_end_of_turn_token(embedded_model_dir):
    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    tok.eos_token = "<|im_start|>"
    vocab_lookup = tok.convert_tokens_to_ids
    tok.convert_tokens_to_ids = lambda t: tok.unk_token_id if t == EXPECTED_EOS else vocab_lookup(t)
    with pytest.raises(PolicyError, match="no '<\\|im_end\\|>' token"):
        fix_eos(tok)


def test_first_conversion_happens_once_when_processes_race(tmp_path, monkeypatch):
    """Parallel test workers (and two runs started together) find an empty cache at the same time:
    one converts, the others wait for it, and nobody deletes a folder another is loading."""
    import threading
    import time

    from evotrainer.policy import embedded

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path))
    monkeypatch.setattr(embedded, "gguf_path", lambda: tmp_path / "model.gguf")
    calls, inside, most = [], [0], [0]
    guard = threading.Lock()

    def slow_convert(source, target):
        with guard:
            calls.append(target)
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.3)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"w")
        with guard:
            inside[0] -= 1

    monkeypatch.setattr(embedded, "_convert", slow_convert)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(embedded.embedded_model_dir())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and most[0] == 1
    assert results == [tmp_path / "models" / "smollm2-135m-instruct"] * 4

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

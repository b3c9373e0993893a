"""The scale path's generation backends: config and GRPOConfig mapping for policy.backend=vllm,
the clear error without CUDA, held-out eval against a real OpenAI-compatible server on loopback
(runtime LoRA loading included), and the real vLLM path, which runs only where a CUDA GPU and
vLLM are present (it is skipped, never imitated, elsewhere)."""

import importlib.util
import inspect
import subprocess
import sys

import pytest
import torch
from llm_server import ChatServer

from evotrainer.config import ConfigError, load_config
from evotrainer.policy.backends import BackendUnavailable, get_backend, vllm_lora_rank
from evotrainer.policy.load import adapter_version

HAS_VLLM_GPU = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None
needs_gpu = pytest.mark.skipif(not HAS_VLLM_GPU, reason="needs a CUDA GPU and vllm (pip install '.[gpu]')")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")

SMALL = ["domain.train_size=8", "domain.heldout_size=6", "train.prompts_per_step=1"]


def _session(tmp_path, *overrides):
    from evotrainer.train.loop import open_session

    return open_session(load_config(None, [*SMALL, *overrides], domain="math"), tmp_path / "work")


def _tiny_adapter(path, rank=4):
    """A real PEFT LoRA adapter folder, on a tiny random Llama (the server only needs the files)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    peft = get_peft_model(model, LoraConfig(r=rank, target_modules="all-linear", task_type="CAUSAL_LM"))
    peft.save_pretrained(str(path))
    return path


# -------------------------------------------------------------------- config and TRL mapping


def test_config_takes_vllm_backend_and_rejects_bad_values():
    cfg = load_config(None, ["policy.backend=vllm", "policy.vllm.mode=server",
                             "policy.vllm.server_port=8123", "eval.backend=openai"], domain="math")
    assert (cfg.policy.backend, cfg.policy.vllm.mode, cfg.policy.vllm.server_port) == ("vllm", "server", 8123)
    with pytest.raises(ConfigError, match="policy.backend"):
        load_config(None, ["policy.backend=tgi"], domain="math")
    with pytest.raises(ConfigError, match="policy.vllm.mode"):
        load_config(None, ["policy.vllm.mode=remote"], domain="math")
    with pytest.raises(ConfigError, match="policy.vllm.gpu_memory_utilization"):
        load_config(None, ["policy.vllm.gpu_memory_utilization=1.5"], domain="math")


@no_gpu
def test_vllm_backend_without_cuda_is_a_clear_error(tmp_path):
    with pytest.raises(BackendUnavailable, match="CUDA GPU"):
        _session(tmp_path, "policy.backend=vllm")
    with pytest.raises(BackendUnavailable, match="eval.backend=vllm needs a CUDA GPU"):
        _session(tmp_path, "eval.backend=vllm")
    assert not (tmp_path / "work" / "store.db").exists()  # failed before any work


@no_gpu
@pytest.mark.slow
def test_cli_exits_2_on_vllm_without_cuda(tmp_path):
    r = subprocess.run([sys.executable, "-m", "evotrainer", "train", "--workdir", str(tmp_path),
                        "policy.backend=vllm"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "needs a CUDA GPU" in r.stderr


def test_grpo_args_map_colocate_and_server_modes(tmp_path):
    from evotrainer.train.loop import grpo_args

    session = _session(tmp_path)
    plain = grpo_args(session, 2, 0, tmp_path / "out")
    assert plain.use_vllm is False
    session.config = load_config(None, [*SMALL, "policy.backend=vllm",
                                        "policy.vllm.gpu_memory_utilization=0.25",
                                        "policy.vllm.enable_sleep_mode=true"], domain="math")
    colo = grpo_args(session, 2, 0, tmp_path / "out")
    assert (colo.use_vllm, colo.vllm_mode, colo.vllm_gpu_memory_utilization) == (True, "colocate", 0.25)
    assert colo.vllm_enable_sleep_mode is True and colo.vllm_tensor_parallel_size == 1
    session.config = load_config(None, [*SMALL, "policy.backend=vllm", "policy.vllm.mode=server",
                                        "policy.vllm.server_host=10.1.2.3", "policy.vllm.server_port=8001"],
                                 domain="math")
    srv = grpo_args(session, 2, 0, tmp_path / "out")
    assert (srv.use_vllm, srv.vllm_mode, srv.vllm_server_host, srv.vllm_server_port) == (
        True, "server", "10.1.2.3", 8001)
    assert srv.vllm_server_base_url is None
    # Everything else is the same run: only generation moves.
    assert (srv.num_generations, srv.max_completion_length, srv.beta) == (
        plain.num_generations, plain.max_completion_length, plain.beta)


def test_harness_hook_sits_above_both_generation_paths():
    """Our filters override `_generate_and_score_completions`; in the pinned TRL both the
    transformers and the vLLM generation run inside it (via `_generate`), so filters, stored
    rollouts and advantages are the same whichever backend generated."""
    from trl import GRPOTrainer

    from evotrainer.train.grpo import HarnessGRPOTrainer

    outer = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    inner = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert "self._generate(" in outer
    assert "self.vllm_generation.generate(" in inner and "self.use_vllm" in inner
    assert "_generate_and_score_completions" in HarnessGRPOTrainer.__dict__
    assert "_generate" not in HarnessGRPOTrainer.__dict__  # we do not fork a generation path


def test_vllm_lora_rank_rounds_up_to_a_supported_slot():
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 16, 17, 64, 300)] == [1, 8, 8, 16, 32, 64, 320]
    with pytest.raises(BackendUnavailable):
        vllm_lora_rank(1024)
    with pytest.raises(BackendUnavailable, match="unknown generation backend"):
        get_backend("tgi")


# -------------------------------------------------------------------- OpenAI-compatible server


def _answers_by_prompt(session, right: set[int]):
    """prompt text -> reply: the right answer for task indices in `right`, a wrong one otherwise."""
    tasks = next(iter(session.heldout.values()))
    table = {}
    for i, t in enumerate(tasks):
        prompt = session.harness.render_prompt(question=t.prompt)
        table[prompt] = f"Answer: {t.answer}" if i in right else f"Answer: {t.answer}1"
    return tasks, table


def test_openai_eval_backend_loads_the_adapter_and_scores_with_the_trusted_check(tmp_path):
    from evotrainer.train.loop import evaluate_heldout

    adapter = _tiny_adapter(tmp_path / "round-0")
    with ChatServer(model="smollm2-base") as server:
        session = _session(tmp_path, "eval.backend=openai", f"eval.server.base_url={server.url}",
                           "eval.server.concurrency=4", "eval.max_new_tokens=40")
        tasks, table = _answers_by_prompt(session, right={0, 2, 3})
        # The last task's reply is cut at the token limit before any marker: the check says so.
        last = session.harness.render_prompt(question=tasks[-1].prompt)
        table[last] = {"content": f"I think it is {tasks[-1].answer}", "finish_reason": "length"}
        server.responder = lambda body: table[body["messages"][0]["content"]]

        results = evaluate_heldout(session, None, None, None, str(adapter))

        name = adapter_version(adapter)
        loads = [r["body"] for r in server.requests if r["path"] == "/v1/load_lora_adapter"]
        assert loads == [{"lora_name": name, "lora_path": str(adapter.resolve())}]
        chats = server.completions()
        assert len(chats) == len(tasks)
        assert {c["model"] for c in chats} == {name}
        assert all(c["temperature"] == 0.0 and c["max_tokens"] == 40 for c in chats)
        (r,) = results
        assert (r.n, r.successes) == (6, 3)
        assert r.kinds == {"ok": 3, "wrong": 2, "truncated": 1}
        stored = session.store.evals(session.run_id)
        assert [(e["adapter"], e["n"], e["successes"]) for e in stored] == [(str(adapter), 6, 3)]

        # The same adapter again: the session's backend does not reload it.
        evaluate_heldout(session, None, None, None, str(adapter))
        assert sum(r["path"] == "/v1/load_lora_adapter" for r in server.requests) == 1
        # The base model (no adapter) is asked for by the server's own model name.
        evaluate_heldout(session, None, None, None, None)
        assert server.completions()[-1]["model"] == "smollm2-base"


def test_openai_backend_tolerates_an_adapter_the_server_already_holds_and_reports_refusals(tmp_path):
    adapter = _tiny_adapter(tmp_path / "a")
    with ChatServer(model="base", responder=lambda body: "Answer: 1") as server:
        first = get_backend("openai", base_url=server.url)
        first.use_adapter(adapter)
        second = get_backend("openai", base_url=server.url)  # a new process, same server
        second.use_adapter(adapter)  # the server answers 400 "already loaded": same weights, fine
        assert second.model == adapter_version(adapter) and list(server.adapters) == [second.model]
        (gen,) = second.generate(["What is 0 + 1?"], 8)
        assert gen.text == "Answer: 1" and not gen.truncated
        empty = tmp_path / "not-an-adapter"
        empty.mkdir()
        (empty / "adapter_model.safetensors").write_bytes(b"x")
        with pytest.raises(BackendUnavailable, match="HTTP 400"):
            second.use_adapter(empty)
    with pytest.raises(BackendUnavailable, match="base_url"):
        get_backend("openai", base_url=None)


# -------------------------------------------------------------------- the real vLLM path (GPU)


@needs_gpu
@pytest.mark.slow
def test_vllm_eval_with_lora_request_matches_the_hf_backend(tmp_path, embedded_model_dir):
    from evotrainer.policy import load_policy
    from evotrainer.train.loop import build_peft, evaluate_heldout

    session = _session(tmp_path, "eval.backend=vllm", "domain.heldout_size=32", "eval.max_new_tokens=64")
    model, tokenizer = load_policy("embedded")
    model = build_peft(model, session.grpo)
    adapter = tmp_path / "round-0"
    model.save_pretrained(str(adapter))
    (vllm_result,) = evaluate_heldout(session, None, None, None, str(adapter))
    backend = session.eval_backend
    assert backend.name == "vllm" and backend._lora.lora_path == str(adapter.resolve())
    hf = get_backend("hf", model=model.to("cuda"), tokenizer=tokenizer, batch_size=32)
    from evotrainer.train.evaluate import evaluate

    tasks = session.heldout[0]
    hf_result = evaluate(None, None, session.domain, session.harness, tasks, seed=0,
                         max_new_tokens=64, batch_size=32, backend=hf)
    # A fresh LoRA is the identity (B=0): both engines decode the base model greedily, and
    # fp32 vs vLLM's kernels may flip a few near-tied tokens, not the whole split.
    assert abs(vllm_result.successes - hf_result.successes) <= 3


@needs_gpu
@pytest.mark.slow
def test_one_grpo_step_with_vllm_colocate(tmp_path, embedded_model_dir):
    from evotrainer.train.loop import run_training

    session = _session(tmp_path, "policy.backend=vllm", "policy.vllm.gpu_memory_utilization=0.2",
                       "eval.backend=hf", "domain.heldout_size=4")
    result = run_training(session, rounds=1, steps=1)
    (summary,) = result["rounds"]
    rows = list(session.store.iter_rollouts(run_id=session.run_id, round_index=0))
    assert len(rows) == int(session.grpo["num_generations"])  # one prompt x its group, all stored
    assert (tmp_path / "work" / "adapters" / "default" / "round-0" / "adapter_config.json").is_file()
    assert summary.step_time > 0


def test_eval_cli_with_a_server_backend_never_loads_the_model(tmp_path, monkeypatch):
    """`evotrainer eval` with eval.backend=openai: the server generates, so the policy weights are
    never loaded here (for a large model that would cost minutes and memory for nothing)."""
    import json

    from typer.testing import CliRunner

    import evotrainer.policy as policy
    from evotrainer.cli.main import app

    def no_load(*_a, **_k):
        raise AssertionError("eval loaded the policy although the server generates")

    monkeypatch.setattr(policy, "load_policy", no_load)
    with ChatServer(model="base", responder=lambda body: "Answer: 1") as server:
        result = CliRunner().invoke(app, ["eval", "--domain", "math", "--workdir", str(tmp_path), "--json",
                                          "eval.backend=openai", f"eval.server.base_url={server.url}",
                                          "domain.heldout_size=4", "eval.seeds=[0]"])
        asked = len(server.completions())
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert asked == 4 and [r["n"] for r in data["results"]] == [4]

"""One typed config: pydantic models loaded from YAML, with `key.sub=value` CLI overrides."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evotrainer.errors import UserError
from evotrainer.paths import CONFIGS_DIR


class ConfigError(UserError, ValueError):
    """A config that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class VLLMConfig(_Strict):
    """How TRL's `use_vllm` generates (policy.backend=vllm); names follow GRPOConfig's vllm_*."""

    mode: Literal["colocate", "server"] = "colocate"  # colocate: one GPU; server: `trl vllm-serve`
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)  # colocate: vLLM's share of the GPU
    tensor_parallel_size: int = Field(1, ge=1)  # colocate only; a server takes its own flag
    max_model_length: int | None = Field(None, ge=1)
    enable_sleep_mode: bool = False  # colocate: free vLLM's memory while the trainer steps
    server_base_url: str | None = None  # server: e.g. http://10.0.0.2:8000 (wins over host/port)
    server_host: str = "127.0.0.1"
    server_port: int = Field(8000, ge=1, le=65535)
    server_timeout: float = Field(240.0, gt=0)  # seconds to wait for the server to come up
    group_port: int = Field(51216, ge=1, le=65535)  # weight-sync process group (server mode)


class PolicyConfig(_Strict):
    model: str = "embedded"  # "embedded" (SmolLM2-135M-Instruct), a local path or a HF model id
    backend: Literal["hf", "vllm"] = "hf"  # vllm: TRL use_vllm (needs CUDA and the gpu extra)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)


class AgentScaffoldConfig(_Strict):
    """Limits of one `agent` scaffold episode (swe, domain.scaffold=agent): evotrainer/scaffold/agent.py."""

    max_turns: int = Field(8, ge=1)  # policy replies; then the episode ends as step_limit
    max_new_tokens: int = Field(128, ge=1)  # per reply
    time_limit_s: float = Field(300.0, gt=0)  # per episode; then it ends as timeout
    max_format_errors: int = Field(3, ge=1)  # replies in a row without a valid action: format_error
    max_context_tokens: int = Field(4096, ge=256)  # prompt + all turns; beyond it: context_limit
    max_observation_chars: int = Field(2000, ge=200)  # a tool's output is cut in the middle beyond it
    test_timeout_s: float = Field(60.0, gt=0)  # one run_tests call
    # a step's episodes advance together (one batched generate per turn, train/batcher.py); false:
    # one after another, batch-1 with each episode's KV cache kept across turns
    batched: bool = True


class FrontierConfig(_Strict):
    """Self-questioning (math, code): before each round, add up to `per_round` validated variants
    of train tasks whose pass rate sits in `band` (evotrainer/frontier). 0 turns it off."""

    per_round: int = Field(0, ge=0)
    band: tuple[float, float] = (0.2, 0.8)
    min_attempts: int = Field(4, ge=1)  # a pass rate from fewer attempts is too noisy to place


class DomainConfig(_Strict):
    # math, code, swe, any other registered or entry-point name (`evotrainer domains`), or a
    # package.module:factory path (docs/domains.md)
    name: str = "math"
    levels: list[int] | None = None  # None: the domain's own default
    # or a path: math GSM8K-style JSONL; code MBPP/HumanEval JSONL; tasks your JSONL (docs/domains.md);
    # swe "pack" or SWE-bench JSONL
    source: str = "procedural"
    heldout_source: str | None = None  # a second file whose tasks are the held-out split
    options: dict[str, Any] = Field(default_factory=dict)  # the domain's own keyword options
    train_size: int = Field(256, ge=1)
    heldout_size: int = Field(64, ge=1)
    # Tasks carved from the train pool (never trained on) that decide: coevolve verifies
    # promotions, compares the control arm and scores reward hacking on them, so the held-out
    # split decides nothing and stays an honest final measure. 0: the held-out split decides.
    validation_size: int = Field(32, ge=0)
    seed: int = 0
    # swe only: edit (one turn, SEARCH/REPLACE), line (one turn, the named buggy line rewritten; for
    # small policies) or agent (multi-turn tools, trained via TRL rollout_func)
    scaffold: Literal["edit", "line", "agent"] = "edit"
    agent: AgentScaffoldConfig = Field(default_factory=AgentScaffoldConfig)
    frontier: FrontierConfig = Field(default_factory=FrontierConfig)

    @model_validator(mode="after")
    def _scaffold_domain(self) -> DomainConfig:
        if self.scaffold == "agent" and self.name != "swe":
            raise ValueError(f"scaffold 'agent' is for the swe domain, not {self.name!r}")
        if self.frontier.per_round and self.name == "swe":
            raise ValueError("frontier.per_round is for math and code; SWE draws new bugs with "
                             "`evotrainer tasks frontier`")
        lo, hi = self.frontier.band
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"frontier.band must satisfy 0 <= lo <= hi <= 1, got {[lo, hi]}")
        return self


class TrainConfig(_Strict):
    rounds: int = Field(3, ge=1)
    steps_per_round: int = Field(15, ge=1)
    prompts_per_step: int = Field(2, ge=1)  # batch = prompts_per_step * num_generations
    seed: int = 0
    report_to: list[str] = Field(default_factory=list)  # e.g. ["tensorboard"]
    logging_steps: int = Field(1, ge=1)
    # TRL turns it on by default; on a CPU with a small model it only costs time.
    gradient_checkpointing: bool = False
    # the loss's forward pass: bf16 autocast, fp32, or auto (bf16 where the hardware multiplies
    # bf16 natively); generation and evaluation stay fp32 (train/precision.py)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # sample training rollouts with a batch that drops each row once it ends (train/sampler.py);
    # false: transformers' generate, which runs every row until the last one ends
    shrink_batch: bool = True
    # sample and evaluate with the LoRA adapter merged into the base weights and, on a CPU, each
    # linear weight laid out (in, out), which MKL multiplies a few rows by several times faster
    # (train/decode_weights.py); false: peft's forward on the weights as they train
    decode_weights: bool = True
    # the loss's log-prob pass runs each distinct prompt once and scores only the completions
    # (train/shared_prefix.py); false: TRL's pass over every row's whole sequence
    shared_prefix: bool = True
    # groups of every training step replayed in a fresh sandbox worker and compared with the
    # values training used (train/audit.py); any difference stops the round. 0: no audit.
    audit_groups: int = Field(2, ge=0)


class EvalServerConfig(_Strict):
    """An OpenAI-compatible server for eval.backend=openai (e.g. `vllm serve --enable-lora`)."""

    base_url: str | None = None  # e.g. http://127.0.0.1:8000/v1
    model: str | None = None  # the served base model's name; None: the first /v1/models lists
    api_key_env: str = "EVOTRAINER_EVAL_API_KEY"  # the env var that holds the key, never the key
    load_adapter: bool = True  # POST /v1/load_lora_adapter (vLLM runtime LoRA) for the adapter
    concurrency: int = Field(8, ge=1)
    timeout_s: float = Field(120.0, gt=0)


class EvalConfig(_Strict):
    seeds: list[int] = Field(default_factory=lambda: [0])
    batch_size: int = Field(32, ge=1)
    max_new_tokens: int | None = None  # None: the harness's max_completion_length
    # auto: vllm when policy.backend is vllm, else hf; openai: any OpenAI-compatible server
    backend: Literal["auto", "hf", "vllm", "openai"] = "auto"
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)  # eval's own vLLM engine
    server: EvalServerConfig = Field(default_factory=EvalServerConfig)
    # Reuse a greedy generation for the same (model, adapter hash, prompt, length) from
    # <workdir>/cache: `evotrainer eval` of an adapter training already evaluated generates nothing.
    cache: bool = True


class StoreConfig(_Strict):
    url: str | None = None  # None: sqlite:///<workdir>/store.db


class ExecutorConfig(_Strict):
    """Where sandboxed jobs (grading, backtest chunks) run. YAML `executor: ray` is short for
    `executor: {kind: ray}`."""

    kind: Literal["local", "ray"] = "local"  # local: a process pool here; ray: Ray tasks/actors
    workers: int | None = Field(None, ge=1)  # None: every core (local) or the cluster's CPUs (ray)
    address: str | None = None  # ray: a running cluster ("auto", "ray://head:10001"); None: start one here

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"kind": data} if isinstance(data, str) else data


class GateConfig(_Strict):
    """The promotion gate: trusted config, never harness code (docs/design.md, "The gate")."""

    margin: float = Field(0.02, ge=0)  # absolute improvement a targeted ratio metric needs
    # mean_tokens is a count, not a ratio: an absolute 0.02 tokens would pass any change, so as a
    # target it needs this relative cut (a share of the base's mean).
    token_margin: float = Field(0.05, ge=0)
    tolerance: float = Field(0.005, ge=0)  # how much worse a safety metric may get
    time_budget_s: float = Field(600.0, gt=0)  # total time in the candidate's code, all workers
    call_timeout_s: float = Field(5.0, gt=0)  # any single call into harness code
    load_timeout_s: float = Field(60.0, gt=0)  # executing the harness files in a worker
    determinism_sample: float = Field(0.02, ge=0, le=1)  # share of groups scored twice


class LLMAgentConfig(_Strict):
    base_url: str | None = None  # else $EVOTRAINER_LLM_BASE_URL / $OPENAI_BASE_URL
    model: str | None = None  # else $EVOTRAINER_LLM_MODEL
    api_key_env: str = "EVOTRAINER_LLM_API_KEY"  # the env var that holds the key, never the key
    temperature: float = 0.2
    max_retries: int = Field(2, ge=0)  # oneshot: malformed replies sent back before they are skipped
    # tools: the model works the round through the tool surface (propose/llm_tools.py) and submits
    # candidates; oneshot: one prompt, JSON proposals back (propose/llm.py), for an endpoint
    # without tool calling.
    mode: Literal["tools", "oneshot"] = "tools"
    max_tool_calls: int = Field(40, ge=1)  # tools: the round's tool-call budget
    max_total_tokens: int = Field(400_000, ge=1)  # tools: usage.total_tokens summed over the responses
    max_seconds: float = Field(1800.0, gt=0)  # tools: wall time for the round
    max_submissions: int = Field(2, ge=1)  # tools: candidates the model may submit


class ExternalAgentConfig(_Strict):
    """`coevolve.agent: external`: any MCP client (`evotrainer mcp`) is the outer agent; the loop
    waits for it (propose/external.py)."""

    timeout_s: float = Field(3600.0, gt=0)  # past it, the round goes on with what was submitted
    poll_s: float = Field(2.0, gt=0)  # how often the loop looks for the agent's finish marker
    max_calls: int = Field(200, ge=1)  # tool calls the agent may make in a round
    max_submissions: int = Field(1, ge=1)  # candidates it may submit to the gate in a round


class CoevolveConfig(_Strict):
    """The outer loop (trusted config): agent choice and the verification rule."""

    agent: Literal["rules", "llm", "external"] = "rules"
    max_proposals: int = Field(8, ge=1)  # backtested per round; at most one is promoted
    enable_skills: list[str] = Field(default_factory=list)  # off-by-default skills to allow
    verify_z: float = Field(2.0, ge=0)  # a regression beyond z standard errors reverts
    # control: the verified round is trained again without the change (coevolve/control.py) and
    # compared task by task; previous: compared with the round before (cheaper, counts drift too)
    verify_against: Literal["control", "previous"] = "control"
    # A change to the training dynamics (harness.yaml grpo knobs) that replay cannot judge trains
    # this many steps under base and candidate from the round's adapter (coevolve/pilot.py);
    # 0: such changes are rejected.
    pilot_steps: int = Field(4, ge=0)
    # Train the control arm beside the main round, and a pilot's two arms side by side, in two
    # processes with half the cores each (coevolve/beside.py); auto: on a single process with
    # no CUDA device and at least 2 cores; true/false: on/off.
    parallel_arms: Literal["auto"] | bool = "auto"
    llm: LLMAgentConfig = Field(default_factory=LLMAgentConfig)
    external: ExternalAgentConfig = Field(default_factory=ExternalAgentConfig)


class JudgeRoleConfig(_Strict):
    """One voting judge role: its instructions (templates/role_<name>.md.j2 in evotrainer/judge,
    or `template`) and its sampling temperature."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    temperature: float = Field(0.0, ge=0)
    template: str | None = None


def _default_roles() -> list[JudgeRoleConfig]:
    return [JudgeRoleConfig(name="strict", temperature=0.2), JudgeRoleConfig(name="lenient", temperature=0.8)]


class JudgeConfig(_Strict):
    """LLM judges (trusted config): proxy verdicts stored beside rollouts, never verified outcomes."""

    backend: Literal["openai", "hf"] = "openai"
    base_url: str | None = None  # openai: else $EVOTRAINER_JUDGE_BASE_URL / $EVOTRAINER_LLM_BASE_URL
    model: str | None = None  # openai: else $EVOTRAINER_JUDGE_MODEL; hf: "embedded", a path or an id
    api_key_env: str = "EVOTRAINER_JUDGE_API_KEY"  # the env var that holds the key, never the key
    timeout_s: float = Field(60.0, gt=0)
    max_tokens: int = Field(256, ge=1)
    max_retries: int = Field(2, ge=0)  # malformed replies asked again before the verdict is MISSING
    roles: list[JudgeRoleConfig] = Field(default_factory=_default_roles, min_length=1)
    max_chars: int = Field(6000, ge=200)  # rollout text shown to the judge, cut in the middle


class Config(_Strict):
    domain: DomainConfig = Field(default_factory=DomainConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    harness: str | None = None  # seed harness folder; None: the package's harnesses/<domain>
    harness_rev: str = "main"  # the harness repo commit to train and evaluate under
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    coevolve: CoevolveConfig = Field(default_factory=CoevolveConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    run_name: str = "default"

    @field_validator("policy")
    @classmethod
    def _model_exists(cls, policy: PolicyConfig) -> PolicyConfig:
        check_model_ref(policy.model)
        return policy

    def harness_dir(self) -> Path:
        """The seed harness folder: `harness`, else the one the domain names (evotrainer/domains)."""
        if self.harness:
            return Path(self.harness)
        from evotrainer.domains import resolve

        return resolve(self.domain.name).seed_harness()


_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_ref(ref: str) -> None:
    """Fail early on a model path that does not exist; a bare HF id is checked when loaded."""
    if ref == "embedded":
        return
    looks_like_path = ref.startswith(("/", "./", "../", "~")) or Path(ref).exists()
    if looks_like_path:
        if not Path(ref).expanduser().exists():
            raise ValueError(f"model path does not exist: {ref}")
    elif not _HF_ID.match(ref):
        raise ValueError(f"not a model path or Hugging Face id: {ref!r}")


def default_config_path(domain: str) -> Path:
    """The shipped config of a built-in domain; for any other domain the generic default."""
    own = CONFIGS_DIR / f"{domain}.yaml"
    if re.fullmatch(r"[A-Za-z0-9_-]+", domain) and own.is_file():
        return own
    return CONFIGS_DIR / "default.yaml"


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.sub=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r}: empty key segment")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def _apply_override(data: dict, parts: list[str], value: Any, text: str) -> None:
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{source}: {field}: {msg}")
    return "\n".join(lines)


def load_config(path: Path | str | None = None, overrides: list[str] | None = None,
                domain: str | None = None) -> Config:
    """Load, override and validate; raise ConfigError naming the file and the field."""
    if path is None:
        path = default_config_path(domain or "math")
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    source = str(path)
    if overrides:
        source = f"{path} (with overrides {' '.join(overrides)})"
        for text in overrides:
            parts, value = parse_override(text)
            _apply_override(data, parts, value, text)
    if domain is not None:
        data.setdefault("domain", {})
        if isinstance(data["domain"], dict):
            data["domain"].setdefault("name", domain)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from None
    if domain is not None and config.domain.name != domain:
        raise ConfigError(f"{source}: domain.name: is {config.domain.name!r} but --domain is {domain!r}")
    harness = config.harness_dir()
    if not harness.is_dir():
        raise ConfigError(f"{source}: harness: folder does not exist: {harness}")
    return config

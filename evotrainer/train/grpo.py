"""TRL's GRPOTrainer with harness filters applied at the narrowest hook.

TRL has no dynamic sampling. We override `_generate_and_score_completions` (TRL 1.16; the
pinned range in pyproject.toml): after TRL has generated, scored and computed group advantages,
the harness filters decide which rollouts train. Filtered rollouts get their loss mask zeroed
and the token normaliser is recomputed. Simplification: a filtered group is not replaced by a
fresh one (true dynamic sampling would resample to refill the batch), so the batch shrinks.

Selective boosting (harness experience.clip_high): rows whose prompt carried lessons get their
own upper clip. The batch carries it as a (B,) column `clip_high`, which TRL shuffles and splits
with the other rows; `_compute_loss` hands it to TRL's loss as epsilon_high, shaped (B, 1) (and
epsilon_low as a column of its one value), which broadcasts over the tokens wherever TRL clamps
or counts clipped ratios.

Model state (train/sample_stats.py): the loss's own forward pass measures each rollout's mean
log-probability, entropy and (beta > 0) KL, and they go into its stored meta, where the
model_state probes read them. So the recorder holds each batch until that pass has seen every
row (a `rollout_index` column follows the rows through TRL's shuffle and split) and stores it
then, before the backward pass.

Sampling (train/sampler.py): with `shrink_batch`, TRL's transformers generation samples with a
batch that drops each row once it ends, from the same distribution as `generate`.

Decoding weights (train/decode_weights.py): with `decode_weights`, rollouts are sampled with the
adapter merged into the base weights and each linear weight laid out for decoding; the weights get
their own tensors back before the loss.

Shared prefix (train/shared_prefix.py): with `shared_prefix`, every log-prob pass runs each distinct
prompt once, hands its key/value cache to the prompt's rows and scores only the completion tokens;
TRL's own pass runs where it declines (images, scaled logit heads, MoE auxiliary loss).

Precision (train/precision.py): with `loss_dtype` set, every log-prob pass runs under that autocast
and hands back float32 log-probs and entropies; generation is left in float32.
"""

from __future__ import annotations

import contextlib

import torch
from trl import GRPOTrainer

from evotrainer.experience.inject import ExperienceInjector
from evotrainer.train.credit import Labeller, StepCredit
from evotrainer.train.decode_weights import decoding_weights
from evotrainer.train.recorder import RolloutRecorder
from evotrainer.train.sample_stats import row_means
from evotrainer.train.sampler import shrinking
from evotrainer.train.shared_prefix import shared_prefix_logps


class HarnessGRPOTrainer(GRPOTrainer):
    _measuring = False  # True while the loss's forward pass runs on rows not yet measured
    _measured: tuple | None = None  # that pass's (per-token logps, entropies)

    def __init__(self, *args, recorder: RolloutRecorder, step_labeller: Labeller | None = None,
                 experience: ExperienceInjector | None = None, loss_dtype: torch.dtype | None = None,
                 shrink_batch: bool = False, decode_weights: bool = False, shared_prefix: bool = False, **kwargs):
        super().__init__(*args, reward_funcs=[recorder], **kwargs)
        self.recorder = recorder
        recorder.group_size = self.num_generations  # TRL lays each prompt's completions out together
        # train.precision: the autocast dtype of every log-prob pass, None for fp32 (train/precision.py)
        self.loss_dtype = loss_dtype
        # train.shrink_batch: sample rollouts with a batch that drops the rows that ended (train/sampler.py)
        self.shrink_batch = shrink_batch
        self.decode_sizes: list[int] = []  # the rows of each decode pass the shrinking sampler ran
        # train.decode_weights: sample with generation's own view of the weights (train/decode_weights.py)
        self.decode_weights = decode_weights
        self._weights_cache: dict = {}  # the frozen base weights' decoding copies, for this round
        # train.shared_prefix: log-prob passes that run each distinct prompt once (train/shared_prefix.py)
        self.shared_prefix = shared_prefix
        # harness.yaml `step_credit`: judge step labels -> per-token advantages (train/credit.py)
        self.step_credit = StepCredit.from_harness(recorder.harness, step_labeller)
        # harness.yaml `experience`: lessons in a share of prompts, stripped before the loss
        self.experience = experience
        self._model_state: dict[int, dict[str, float]] = {}  # rollout index -> its means, this batch
        self._seen: set[int] = set()  # rollout indexes the loss has seen, this batch

    def _generate_single_turn(self, *args, **kwargs):
        if self.use_vllm:
            return super()._generate_single_turn(*args, **kwargs)
        model = self.accelerator.unwrap_model(self.model_wrapped)
        with decoding_weights(model, self.decode_weights, self._weights_cache), \
                (shrinking(model, self.decode_sizes) if self.shrink_batch else contextlib.nullcontext()):
            return super()._generate_single_turn(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        if self.experience is not None and self.model.training:
            inputs = self.experience.inject(inputs)
        self.batch_inputs = inputs  # a rollout_func sees only prompts; train/rollout.py reads the task ids here
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return output
        if self.experience is not None:  # the loss sees clean prompts (experience/inject.py)
            output = self.experience.strip(self, output)
            if self.experience.clip_high is not None:
                output["clip_high"] = clip_column(self.experience.last_lessons, self.experience.clip_high,
                                                  self.epsilon_high, output["advantages"].device)
        advantages = output["advantages"]
        kept = self.recorder.finalize(advantages.tolist(), self.num_generations)  # stored in _compute_loss
        keep = torch.tensor(kept, dtype=torch.bool, device=advantages.device)
        output["completion_mask"] = output["completion_mask"] * keep.unsqueeze(1).int()
        output["advantages"] = advantages * keep
        if self.step_credit.enabled:  # (B,) -> (B, T); TRL's loss takes either shape
            rollouts = [row.rollout for row in self.recorder.last_batch]
            output["advantages"] = self.step_credit.advantages(
                output, rollouts, self.num_generations, self.processing_class.decode) * keep.unsqueeze(1)
            # The batch is stored later (recorder.commit), so the labels go into its rows here:
            # a labeller's own write to the store finds no row yet.
            self.recorder.annotate({i: {"step_labels": raw} for i, raw in self.step_credit.last_labels.items()})
            stats = self.step_credit.last_stats
            self._metrics["train"]["step_credit/labelled"].append(stats["labelled"] / max(stats["rollouts"], 1))
        loss_mask = output["completion_mask"]
        if output.get("tool_mask") is not None:
            loss_mask = loss_mask * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        self._log_batch_metrics(kept)
        output["rollout_index"] = torch.arange(len(kept), device=advantages.device)
        self._model_state, self._seen = {}, set()
        return output

    def _compute_loss(self, model, inputs):
        index = inputs.get("rollout_index")
        rows = [] if index is None or not self.model.training else index.tolist()
        fresh = bool(rows) and self.recorder.unstored is not None and not self._seen.intersection(rows)
        self._measuring, self._measured = fresh, None
        try:
            loss = self._clipped_loss(model, inputs)
        finally:
            self._measuring = False
        if fresh:
            if self._measured is not None:
                self._model_state.update(zip(rows, row_means(*self._measured, inputs)))
            self._seen.update(rows)
            if len(self._seen) == len(self.recorder.unstored):
                self.recorder.commit(self._model_state)
        return loss

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        if self.loss_dtype is None:
            out = self._logps_pass(*args, **kwargs)
        else:  # every log-prob pass alike, so a ratio of two passes compares like with like
            with torch.autocast(self.accelerator.device.type, dtype=self.loss_dtype):
                logps, entropies, aux = self._logps_pass(*args, **kwargs)
            out = (logps.float(), None if entropies is None else entropies.float(),
                   None if aux is None else aux.float())
        if self._measuring and kwargs.get("compute_entropy"):  # the loss's own pass (GRPOTrainer._compute_loss)
            self._measured = out[0].detach(), out[1].detach()
        return out

    def _logps_pass(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                    compute_entropy=False, compute_aux_loss=False, **extra):
        """The shared-prefix pass in chunks of `batch_size` rows where it applies, else TRL's."""
        plain = not self.shared_prefix or compute_aux_loss or self.args.cast_lm_head_to_fp32 or any(
            value is not None for value in extra.values())
        if not plain:
            size, parts = batch_size or input_ids.size(0), []
            for start in range(0, input_ids.size(0), size):
                with self.accelerator.autocast():
                    part = shared_prefix_logps(model, input_ids[start:start + size], attention_mask[start:start + size],
                                               logits_to_keep, self.temperature, compute_entropy)
                if part is None:  # the model is not one it can split (train/shared_prefix.py)
                    break
                parts.append(part)
            else:
                return (torch.cat([p[0] for p in parts]),
                        torch.cat([p[1] for p in parts]) if compute_entropy else None, None)
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)

    def _clipped_loss(self, model, inputs):
        """TRL's loss, with each row's own upper clip where the batch carries `clip_high`."""
        clip = inputs.get("clip_high")
        if clip is None:
            return super()._compute_loss(model, inputs)
        shared = self.epsilon_low, self.epsilon_high
        # torch.clamp takes two numbers or two tensors, so the lower bound becomes a column too
        self.epsilon_high = clip.unsqueeze(1)
        self.epsilon_low = torch.full_like(self.epsilon_high, float(self.epsilon_low))
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.epsilon_low, self.epsilon_high = shared

    def _log_batch_metrics(self, kept: list[bool]) -> None:
        rows = self.recorder.last_batch
        metrics = self._metrics["train"]
        metrics["harness/kept_ratio"].append(sum(kept) / max(len(kept), 1))
        metrics["verified/success"].append(sum(r.rollout.outcome.success for r in rows) / len(rows))
        names = sorted({k for r in rows for k in r.reward_components})
        for name in names:
            values = [r.reward_components.get(name, 0.0) for r in rows]
            metrics[f"harness/{name}"].append(sum(values) / len(values))


def clip_column(lessons: list[tuple[str, ...]], guided: float, default: float, device) -> torch.Tensor:
    """Each row's upper clip: `guided` where its prompt carried lessons, else `default`."""
    return torch.tensor([guided if ids else default for ids in lessons], dtype=torch.float32, device=device)

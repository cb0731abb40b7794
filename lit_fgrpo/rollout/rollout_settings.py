"""``RolloutSettings``: every setting of the rollout path, typed, documented and validated in one place.

The :class:`~lit_fgrpo.callbacks.RolloutCallback` takes these as keyword arguments (from Python, or from a config's
``rollout:`` group); :class:`~lit_fgrpo.rollout.source.RolloutSource` reads them. A wrong value is one
:class:`~lit_fgrpo.errors.ConfigError` line naming the setting, raised when the settings are built.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.prepared_weights import DECODE_DTYPES, DecodeDtype
from lit_fgrpo.environments.base import EnvironmentSet, load_environments
from lit_fgrpo.environments.call_formats import ToolCallFormat, call_format
from lit_fgrpo.environments.chat_template import load_chat_template, template_kwargs
from lit_fgrpo.environments.episode import EpisodeLimits
from lit_fgrpo.environments.workers import Isolation as EnvironmentIsolation
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives.group_weights import GroupWeight, weighted_rates
from lit_fgrpo.rewards import resolve_reward
from lit_fgrpo.rewards.guarded_call import Isolation
from lit_fgrpo.rollout.engine_select import ENGINE_KINDS, EngineKind
from lit_fgrpo.rollout.group_filter import DynamicSampling
from lit_fgrpo.tasks.registry import default_reward

if TYPE_CHECKING:
    from lit_fgrpo.rollout.consumer import RolloutConsumer

log = logging.getLogger(__name__)

EpisodeSchedule = Literal["async", "lockstep"]
"""How multi-turn episodes share the engine (``--rollout.episode_schedule``)."""

TRAIN_STREAM, VAL_STREAM, TEST_STREAM = 0, 1, 2
"""The ``stream`` argument of :func:`lit_fgrpo.distributed.prompt_seed` per split (their positions overlap)."""

ENVIRONMENT_REWARD = "environment"
"""The reward name that stands for the environment's own ``get_reward()`` (``--rollout.reward_funcs [environment]``)."""


@dataclass
class RolloutSettings:
    """How rollouts are generated, scored, synced and scheduled (``--rollout.*`` on the command line)."""

    engine: EngineKind = "hf"
    """"hf" (the HF engine on the policy itself), "hf_copy" (the same on the engine's own copy of the policy, for
    ``max_staleness > 0``), "vllm" (colocated vLLM), "vllm_server" (stock ``vllm serve`` processes, launched or given
    by URL, options in ``engine_kwargs``: :class:`~lit_fgrpo.servers.server_settings.ServerSettings`), or "auto" (vLLM when installed and it pays off: on a GPU; on a
    CPU only from 10M parameters; see :func:`lit_fgrpo.rollout.engine_select.auto_engine_kind`)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling of training rollouts; ``sampling.n`` is the group size G (>= 2)."""
    val_samples: int = 16
    """Completions per held-out prompt in validation/test (>= the largest pass@k k)."""
    val_temperature: float | None = None
    """Sampling temperature for validation (default: the training temperature)."""
    reward_funcs: list[str] | None = None
    """Reward functions by built-in name (math_answer, maze, reasoning_gym, reasoning_gym_correct) or dotted path
    ``pkg.module:function``; default: the default task's reward (``["maze"]``)."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default all 1)."""
    correctness: str | None = None
    """The function whose score >= ``correct_threshold`` defines "correct" (mu_hat); default the first reward."""
    correct_threshold: float = 0.5
    """Score at or above which a completion is correct."""
    sync_every: int = 1
    """Push weights into the engine every k optimizer steps (and before validation)."""
    sync_tolerance: float | None = None
    """Largest allowed |logp_engine - logp_trainer| on the probe after a push (both at temperature 1); default by the
    policy's parameter dtype: 1e-3 in float32, 0.25 in bfloat16/float16 (a bf16 vLLM engine on GPU needs about that;
    a bf16 HF copy differs by about 0.01 on the CPU)."""
    sync_probe_rows: int = 2
    """Rows of the last rollout used as the sync probe (0 disables the check)."""
    mask_truncated_completions: bool = False
    """No loss on completions cut at ``max_tokens`` (DAPO overlong filtering)."""
    validate_at_start: bool = True
    """Sample the validation prompts once before the first RL step (logged at step 0 as ``val/pass_at_k``)."""
    log_samples_every: int = 0
    """Deprecated: use :class:`~lit_fgrpo.callbacks.SampleTable`. Accepted so that old configs parse."""
    engine_kwargs: dict[str, Any] | None = None
    """Extra keyword arguments for the vLLM engine (gpu_memory_utilization, dtype, max_model_len, ...)."""
    hf_chunk_size: int = 512
    """Most rows per HF ``generate`` call."""
    decode_dtype: DecodeDtype = "float32"
    """The HF engine's decoding matmuls: ``float32`` (the model's own dtype), ``bfloat16`` (weights and matmul inputs
    in bfloat16, activations, attention and LoRA in float32; the sampling log-probs are the bfloat16 policy's, the
    gap to the trainer's logged as ``rollout/logprob_mismatch``), or ``auto`` (bfloat16 where the device multiplies
    it natively: AVX512-BF16 or AMX on a CPU). For the vLLM engines set ``engine_kwargs.dtype`` instead."""
    pack_weights: bool = True
    """On a CPU, the HF engine multiplies frozen weights (LoRA's base) by oneDNN-packed copies made once per run: the
    same numbers up to float rounding, faster decoding (SmolLM2-135M: docs/generation-profile.md), at the memory of
    the copies (the frozen weights' bytes again in float32, half that in bfloat16). false: no copies."""
    seed: int = 0
    """Base sampling seed: prompt p at step s samples with ``prompt_seed(seed, p.position, s, stream)``."""
    reward_timeout: float | None = None
    """Seconds one reward call may take; a call past it makes its rows unscorable (counted). None = no limit."""
    reward_isolation: Isolation = "thread"
    """Run timed reward calls in a ``thread`` or a worker ``process`` (for functions that are not thread-safe)."""
    dynamic_sampling: DynamicSampling | None = None
    """DAPO's dynamic sampling: rounds drawn from the data module until the step has P informative groups."""
    max_staleness: int = 0
    """k; 0 = synchronous. k >= 1 generates up to k batches ahead of the trainer on the engine's own weight copy
    (vLLM or "hf_copy"), corrected with the module's importance weights (``--model.objective.importance_correction``)."""
    environment: str | dict[str, str] | None = None
    """Multi-turn episodes (docs/environments.md): the environment class as a built-in name (``retry``,
    ``calculator``) or ``package.module:Class`` (or a zero-argument factory), or a mapping of names to such, routed by
    each row's ``environment`` column (TRL's rule); null = one reply per prompt (unless ``tools`` are given). An
    environment's ``get_reward()``, when it has one, is the reward function named ``environment``, summed with
    ``reward_funcs`` at weight 1 as TRL sums it (list ``environment`` in ``reward_funcs`` to weight it yourself)."""
    environment_args: dict[str, Any] | None = None
    """Keyword arguments of the environment's constructor (with a mapping of environments: name -> arguments)."""
    tools: list[str] | None = None
    """Standalone tool functions (``package.module:function``) every episode may call, with or without an
    environment (TRL's ``tools``)."""
    max_turns: int = 4
    """Model turns per episode (with ``environment``); an episode still going after them ends truncated."""
    max_turn_tokens: int | None = None
    """Tokens one model turn may sample (with ``environment``); null = ``sampling.max_tokens``."""
    max_episode_tokens: int | None = None
    """Tokens after the prompt per episode, model and environment together: the training row's width (with
    ``environment``); null = ``max_turns`` times the turn's tokens."""
    environment_timeout: float | None = 60.0
    """Seconds one constructor, ``reset``, ``step``, tool or ``get_reward`` call may take; past it the call is cut
    and the episode is unscorable (counted, left out of mu_hat and the loss). null = no limit."""
    end_of_turn: str | None = None
    """The token text that ends a model turn (its stop token). null: the EOS token when the chat template ends an
    assistant turn with it, else the special token right after the turn's text (Gemma's ``<end_of_turn>``)."""
    chat_template: str | None = None
    """A chat template replacing the tokenizer's for the episodes: a jinja file or the template text (e.g. TRL's
    prefix-preserving ``trl/chat_templates/qwen3_training.jinja`` for Qwen3, whose own template drops earlier
    thinking). null: the tokenizer's."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Keyword arguments for every chat-template rendering of the episodes (e.g. ``{enable_thinking: false}``)."""
    tool_call_format: ToolCallFormat = "hermes"
    """How the model writes a tool call: ``hermes`` (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``) or
    ``llama3_json`` (the reply is ``{"name": ..., "parameters": ...}``, Llama 3.1's)."""
    episode_schedule: EpisodeSchedule = "async"
    """``async``: each episode's next turn is sampled as soon as its environment has answered (a slow tool holds up
    its own episode only); ``lockstep``: every turn waits for every environment. Each episode samples with its own
    seeds either way, so the tokens are the same; the engine's log-probs can differ in the last float bits with the
    rows that share a batch, so only ``lockstep`` resumes to bit-identical weights (an engine the ranks share always
    runs in lockstep)."""
    environment_isolation: EnvironmentIsolation = "process"
    """Where environment calls run: one forked worker ``process`` per concurrent episode (a call past the timeout is
    cut, nothing left running), or a ``thread`` in the trainer (for environments that cannot be forked; a call past
    the timeout cannot be stopped there)."""

    def __post_init__(self) -> None:
        if isinstance(self.sampling, dict):  # a config's plain mapping
            self.sampling = SamplingConfig(**self.sampling)
        if isinstance(self.dynamic_sampling, dict):
            self.dynamic_sampling = DynamicSampling(**self.dynamic_sampling)
        where = "RolloutCallback"
        if self.engine not in ENGINE_KINDS:
            raise ConfigError(f"{where}.engine must be one of {', '.join(ENGINE_KINDS)}; got {self.engine!r}")
        if self.engine_kwargs and self.engine in ("hf", "hf_copy"):
            raise ConfigError(
                f"{where}.engine_kwargs {sorted(self.engine_kwargs)} are vLLM options; engine {self.engine!r} does not "
                "use them (drop engine_kwargs, or choose engine: vllm)"
            )
        if self.decode_dtype not in DECODE_DTYPES:
            raise ConfigError(
                f"{where}.decode_dtype must be one of {', '.join(DECODE_DTYPES)}; got {self.decode_dtype!r}"
            )
        if self.decode_dtype != "float32" and self.engine in ("vllm", "vllm_server"):
            raise ConfigError(
                f"{where}.decode_dtype {self.decode_dtype!r} is for the HF engines; engine {self.engine!r} takes "
                "engine_kwargs.dtype"
            )
        if self.sampling.n < 2:
            raise ConfigError(
                f"{where}.sampling.n (the group size G) must be >= 2 for group-relative advantages, "
                f"got {self.sampling.n}"
            )
        if self.val_samples < 1:
            raise ConfigError(f"{where}.val_samples must be >= 1, got {self.val_samples}")
        if self.sync_every < 1:
            raise ConfigError(f"{where}.sync_every must be >= 1, got {self.sync_every}")
        if self.reward_timeout is not None and not (0 < self.reward_timeout < float("inf")):
            raise ConfigError(f"{where}.reward_timeout must be a finite number > 0 or null, got {self.reward_timeout}")
        if self.reward_isolation not in get_args(Isolation):
            raise ConfigError(f"{where}.reward_isolation must be 'thread' or 'process', got {self.reward_isolation!r}")
        self.environments: EnvironmentSet | None = self._load_environment()
        """The checked environments and tools (``None``: single-turn rollouts)."""
        names = self.reward_names
        for key, name in [("reward_funcs", n) for n in names] + [("correctness", self.correctness)]:
            if name is None:
                continue
            if name == ENVIRONMENT_REWARD:
                environments = self.environments
                if environments is None or not environments.has_reward:
                    has = (
                        "no --rollout.environment"
                        if environments is None
                        else f"{environments.names} has no get_reward()"
                    )
                    raise ConfigError(
                        f"--rollout.{key} {ENVIRONMENT_REWARD!r} is the environment's get_reward(), but {has}"
                    )
                continue
            try:  # an unknown name or a path that does not import: one line, now
                resolve_reward(name)
            except (ValueError, ImportError, AttributeError) as err:
                raise ConfigError(f"{where}.{key}: {err}") from err
        if self.reward_weights is not None and len(self.reward_weights) not in (
            len(names),
            len(self.reward_funcs or []),
        ):
            raise ConfigError(
                f"{where}.reward_weights has {len(self.reward_weights)} values for {len(names)} reward_funcs"
            )
        if self.log_samples_every > 0:
            log.warning(f"{where}.log_samples_every is ignored: add lit_fgrpo.callbacks.SampleTable instead")
        check_async_settings(self.max_staleness, self.sync_every, None)
        if self.max_staleness > 0 and self.dynamic_sampling is not None:
            raise ConfigError(
                f"{where}.dynamic_sampling with max_staleness={self.max_staleness}: dynamic sampling draws its "
                "prompts in rounds that depend on the rewards, which the generator cannot sample ahead; drop one"
            )

    def _load_environment(self) -> EnvironmentSet | None:
        """The environments and tools, imported and checked now (one line naming the flag), and the episode limits."""
        if self.environment is None and not self.tools:
            if self.environment_args:
                raise ConfigError("--rollout.environment_args is given without --rollout.environment")
            return None
        if self.episode_schedule not in get_args(EpisodeSchedule):
            raise ConfigError(
                f"--rollout.episode_schedule must be 'async' or 'lockstep', got {self.episode_schedule!r}"
            )
        if self.environment_isolation not in get_args(EnvironmentIsolation):
            raise ConfigError(
                f"--rollout.environment_isolation must be 'process' or 'thread', got {self.environment_isolation!r}"
            )
        if self.environment_timeout is not None and not (0 < self.environment_timeout < float("inf")):
            raise ConfigError(
                f"--rollout.environment_timeout must be a finite number > 0 or null, got {self.environment_timeout}"
            )
        call_format(self.tool_call_format)  # the chat settings, each wrong value one line naming its flag
        load_chat_template(self.chat_template)
        template_kwargs(self.chat_template_kwargs)
        self.episode_limits()  # each limit >= 1
        if self.max_episode_tokens is not None and self.max_episode_tokens < self.turn_tokens:
            raise ConfigError(
                f"--rollout.max_episode_tokens={self.max_episode_tokens} is less than one turn's tokens "
                f"({self.turn_tokens}: --rollout.max_turn_tokens, else --rollout.sampling.max_tokens)"
            )
        return load_environments(self.environment, self.environment_args, self.tools or ())

    @property
    def turn_tokens(self) -> int:
        """Tokens one model turn may sample: ``max_turn_tokens``, else ``sampling.max_tokens``."""
        return self.max_turn_tokens if self.max_turn_tokens is not None else self.sampling.max_tokens

    def episode_limits(self, max_context: int | None = None) -> EpisodeLimits:
        """The episodes' limits; ``max_context``: the tokens of context an episode may fill (the collector's)."""
        tokens = self.max_episode_tokens if self.max_episode_tokens is not None else self.max_turns * self.turn_tokens
        return EpisodeLimits(self.max_turns, tokens, self.turn_tokens, max_context)

    def check_consumer(self, consumer: RolloutConsumer) -> None:
        """Refuse settings that do not fit the module that trains on the rollouts (one ConfigError naming both)."""
        check_async_settings(self.max_staleness, self.sync_every, consumer.importance_correction)
        self.check_reachable_groups(consumer.group_weight)
        ks = consumer.pass_at_k_ks
        if self.val_samples < max(ks):
            raise ConfigError(
                f"RolloutCallback.val_samples={self.val_samples} is fewer than the largest pass@k k={max(ks)} "
                "(--model.val_pass_at_k); unbiased pass@k needs n >= k"
            )
        if float(consumer.temperature) != self.sampling.temperature:
            # The engine samples (and reports log_softmax(z / T)) at sampling.temperature; the module divides its
            # training logits by its own temperature. Two values would train on samples of another distribution than
            # the one the loss assumes, and make the importance weights and logprob_mismatch meaningless.
            raise ConfigError(
                f"--rollout.sampling.temperature={self.sampling.temperature} differs from "
                f"--model.objective.temperature={float(consumer.temperature)}: the engine would sample at one and the "
                "trainer compute its log-probs at the other; give both the same value "
                "(the configs set temperature: ${model.objective.temperature})"
            )

    def check_prompt_room(self, longest: dict[str, int]) -> None:
        """Refuse prompts that leave the engine no room to reply, before the engine starts: ``longest`` maps each data
        split to its longest prompt in tokens; a prompt of ``engine_kwargs.max_model_len`` tokens or more would be
        refused by vLLM at its first batch, minutes into the run (a launched server's the same).

        Raises:
            ConfigError: naming ``--rollout.engine_kwargs.max_model_len``, the split and its longest prompt.
        """
        limit = (self.engine_kwargs or {}).get("max_model_len")
        if not isinstance(limit, int) or isinstance(limit, bool):
            return  # unset (the model's own context) or already refused by the engine's own check
        over = {split: n for split, n in longest.items() if n >= limit}
        if over:
            split, tokens = max(over.items(), key=lambda item: item[1])
            raise ConfigError(
                f"--rollout.engine_kwargs.max_model_len {limit} leaves no room to reply: the longest {split} prompt "
                f"has {tokens} tokens; raise it to at least {tokens + self.sampling.max_tokens} (prompt + "
                "--rollout.sampling.max_tokens), or cut prompts with --data.max_prompt_length"
            )

    def check_reachable_groups(self, weight: GroupWeight) -> None:
        """Refuse a group weight (a ``band``, a user function) that is 0 at every success rate ``k / G`` a group of
        ``sampling.n`` can have: no group would ever contribute, and dynamic sampling would drop every round."""
        n = self.sampling.n
        if weight.is_identity or weighted_rates(weight, n):
            return
        shown = weight.kind if weight.kind != "band" else f"band (low={weight.low}, high={weight.high})"
        rates = ", ".join(f"{k}/{n}" for k in range(1, n)) if n <= 6 else f"1/{n}, 2/{n}, ..., {n - 1}/{n}"
        then = (
            "dynamic_sampling would drop every group of every round"
            if self.dynamic_sampling is not None
            else "every advantage would be 0"
        )
        raise ConfigError(
            f"--model.objective.group_weight {shown} is 0 for every success rate a group of --rollout.sampling.n={n} can have "
            f"({rates}): {then}",
            hint="widen the band (low < k/G < high for some k), or change --rollout.sampling.n",
        )

    def check_resumed_group_size(self, saved_n: Any) -> None:
        """Warn when a checkpoint was trained with another group size (the config's value wins)."""
        if saved_n is not None and int(saved_n) != self.sampling.n:
            log.warning(
                "resuming with RolloutCallback.sampling.n=%d (group size G) but the checkpoint was trained with %d: "
                "the config's value %d wins from here on",
                self.sampling.n,
                int(saved_n),
                self.sampling.n,
            )

    @property
    def reward_names(self) -> list[str]:
        """The reward functions' names: ``reward_funcs`` (by default the default task's reward, the maze's ``["maze"]``),
        and the environment's ``get_reward`` (``environment``) when it has one and is not listed: TRL sums it with the
        reward functions at weight 1."""
        owned = self.environments is not None and self.environments.has_reward
        if self.reward_funcs:
            names = list(self.reward_funcs)
            return names + [ENVIRONMENT_REWARD] if owned and ENVIRONMENT_REWARD not in names else names
        return [ENVIRONMENT_REWARD] if owned else [default_reward()]

    @property
    def weights(self) -> list[float] | None:
        """One weight per :attr:`reward_names` (``reward_weights``, and 1.0 for an environment reward added to them)."""
        if self.reward_weights is None:
            return None
        return list(self.reward_weights) + [1.0] * (len(self.reward_names) - len(self.reward_weights))

    def train_sampling(self) -> SamplingConfig:
        """Sampling of training rollouts, with the base seed (each prompt's seed adds its position and the step)."""
        return replace(self.sampling, seed=self.seed)

    def eval_sampling(self) -> SamplingConfig:
        """Sampling of evaluation batches: ``val_samples`` per prompt, the validation temperature, the base seed."""
        temperature = self.val_temperature or self.sampling.temperature
        return replace(self.sampling, n=self.val_samples, temperature=temperature, seed=self.seed)

    @classmethod
    def names(cls) -> list[str]:
        """Every setting's name."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def with_overrides(cls, settings: RolloutSettings | None, overrides: dict[str, Any]) -> RolloutSettings:
        """``settings`` (or the defaults) with single settings replaced; an unknown name is one line listing all."""
        unknown = sorted(set(overrides) - set(cls.names()))
        if unknown:
            raise ConfigError(f"RolloutCallback has no setting {', '.join(unknown)}; known: {', '.join(cls.names())}")
        if settings is None:
            return cls(**overrides)
        return cls(**({name: getattr(settings, name) for name in cls.names()} | overrides))


def check_async_settings(max_staleness: int, sync_every: int, importance_correction: str | None) -> None:
    """Refuse settings that asynchronous rollouts cannot honour, naming the flag.

    Args:
        max_staleness: k (``RolloutCallback.max_staleness``).
        sync_every: ``RolloutCallback.sync_every``; must be 1 (the version is the RL step count).
        importance_correction: the module's ``importance_correction`` (None: not known yet, not checked).

    Raises:
        ConfigError: one line naming the flag (a ``ValueError``).
    """
    if max_staleness < 0:
        raise ConfigError(f"--rollout.max_staleness must be >= 0, got {max_staleness}")
    if max_staleness == 0:
        return
    if sync_every != 1:
        raise ConfigError(
            f"--rollout.sync_every={sync_every} with --rollout.max_staleness={max_staleness}: asynchronous rollouts "
            "push the weights after every RL step (the policy version); set sync_every=1"
        )
    if importance_correction == "none":
        raise ConfigError(
            f"--model.objective.importance_correction=none with --rollout.max_staleness={max_staleness}: stale rollouts "
            "need the decoupled objective's importance weights; use --model.objective.importance_correction=token (or sequence)"
        )


__all__ = [
    "ENVIRONMENT_REWARD",
    "TEST_STREAM",
    "TRAIN_STREAM",
    "VAL_STREAM",
    "RolloutSettings",
    "check_async_settings",
]

"""``ServerEngine``: the ``vllm_server`` rollout engine, sampling through stock ``vllm serve`` processes.

Sampling: one ``/v1/completions`` request per prompt (token ids in, ``n`` completions with token ids and
``processed_logprobs`` out) with the prompt's own seed, the colocated engine's contract: prompt ``i`` gets
``seeds[i]`` (default ``sampling.seed + i * n``) and vLLM gives its completion ``j`` the seed ``seeds[i] + j``. So the
samples do not depend on which server answers, nor on how the prompts are split over servers, nor on a retry.

Pushes: the policy is written as a new versioned model directory and every up server reloads it through our worker
extension (``/collective_rpc load_weights_dir``), or (``push: collective``) it goes over one gloo/NCCL group per
server (:mod:`~lit_fgrpo.servers.collective`); then each drops its prefix cache. The callback's check runs on
**every** server (:mod:`~lit_fgrpo.servers.probe`). A restarted server gets the current weights (over a new
group) and the same check before it takes requests.

LoRA (a PEFT policy, ``lora: adapter``): the first push of an engine sends the frozen base once, every push the
adapter alone (:mod:`~lit_fgrpo.servers.adapters`), and requests name the newest adapter.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.engines.sync_check import WeightSyncError, check_logprob_gap
from lit_fgrpo.engines.vllm_worker import merged_lora, policy_state_dict
from lit_fgrpo.servers import completions_api
from lit_fgrpo.servers.adapters import adapter_name, adapter_rank, write_adapter
from lit_fgrpo.servers.client import ServerRequestError
from lit_fgrpo.servers.collective import PushGroups, resolve_backend
from lit_fgrpo.servers.dispatch import run_requests
from lit_fgrpo.servers.errors import ServerError
from lit_fgrpo.servers.fleet import Fleet, Server
from lit_fgrpo.servers.launcher import open_fleet
from lit_fgrpo.servers.probe import COMPLETIONS, server_logprobs
from lit_fgrpo.servers.server_settings import ServerSettings
from lit_fgrpo.servers.url_checks import check_url_server
from lit_fgrpo.servers.weights import (
    cpu_state_dict,
    drop_versions,
    next_version_dir,
    write_model_dir,
    write_state_dict,
)

Reference = tuple[list[list[int]], list[list[int]], list[torch.Tensor], float]
"""(probe prompts, completions, trainer log-probs, tolerance) of the last check, reused for restarted servers."""


class ServerEngine(RolloutEngine):
    """Rollouts on ``vllm serve`` processes (launched by us or given by URL).

    Args:
        settings: the engine's options.
        fleet: the servers (up).
        model_dir: the model directory of version 0 (what launched servers started on).
        eos_token_id: always a stop token.
        model_name: the served (base) model name.
        lora: push a PEFT policy's adapter alone (True) rather than the merged model.
    """

    has_own_weights = True  # the servers hold their own copies, changed only by sync_weights

    def __init__(
        self,
        settings: ServerSettings,
        fleet: Fleet,
        model_dir: Path,
        eos_token_id: int | None,
        model_name: str,
        lora: bool = False,
    ) -> None:
        self.settings, self.fleet, self.eos_token_id, self.model_name = settings, fleet, eos_token_id, model_name
        self.model_dir, self.version = model_dir, 0
        self.fleet.model_dir = str(model_dir)
        self.fleet.on_ready = self._bring_up
        self.lora = lora
        self.adapter: tuple[str, Path] | None = None
        """(name, directory) of the adapter the servers serve now (LoRA pushes; None before the first)."""
        self.adapter_version = 0
        self._base_pushed = False
        self.reference: Reference | None = None
        self._reference_weights = (0, 0)  # (version, adapter_version) the reference's trainer log-probs belong to
        self._push_metrics: dict[str, float] = {}
        self._restart_gaps: list[float] = []  # gaps of servers checked by _bring_up during the current check_sync
        self.groups = PushGroups(settings.push_timeout_s, settings.push_host) if settings.push == "collective" else None
        """The push groups (``push: collective``; None for directory pushes)."""
        self._lock = threading.RLock()  # asynchronous rollouts generate from another thread than the pushes

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        tokenizer: Any,
        workdir: str | os.PathLike[str],
        eos_token_id: int | None = None,
        **kwargs: Any,
    ) -> ServerEngine:
        """Write the policy as version 0, then launch servers on it (``launch``) or connect to ``urls``.

        Raises:
            ConfigError: bad ``engine_kwargs``.
            ServerError: a server never became healthy (names its URL and log file), or a server given by URL does
                not answer, cannot take weight pushes, serves another model or a shorter context
                (:mod:`~lit_fgrpo.servers.url_checks`).
        """
        settings = ServerSettings.from_kwargs(kwargs)
        root = Path(settings.weights_dir) if settings.weights_dir else Path(workdir) / "weights"
        model_dir = root / "v0"
        rank = adapter_rank(model) if settings.lora_push == "adapter" else None
        write_model_dir(model, tokenizer, model_dir, merge=rank is None)
        fleet = open_fleet(
            settings, model_dir, Path(settings.log_dir or workdir), settings.max_lora_rank or (rank or 0)
        )
        if settings.urls:  # someone else started them: check each can serve this run before its first step
            try:
                for server in fleet.servers:
                    check_url_server(server.client, model, settings.max_model_len)
            except ServerError:
                fleet.close()
                raise
        name = settings.served_name or fleet.servers[0].client.first_model()
        return cls(settings, fleet, model_dir, eos_token_id, name, lora=rank is not None)

    @property
    def request_model(self) -> str:
        """The model requests name: the newest adapter after a LoRA push, else the served model."""
        return self.adapter[0] if self.adapter is not None else self.model_name

    # ------------------------------------------------------------------ sampling
    def _stop_ids(self, sampling: SamplingConfig) -> list[int]:
        stops = [] if self.eos_token_id is None else [int(self.eos_token_id)]
        return stops + [int(s) for s in sampling.stop_token_ids if int(s) not in stops]

    def _run(self, bodies: list[completions_api.Json], parse: Any, what: str) -> list[Any]:
        return run_requests(
            self.fleet,
            COMPLETIONS,
            bodies,
            parse,
            max_attempts=self.settings.max_attempts,
            max_inflight=self.settings.max_inflight,
            what=what,
        )

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        """Sample ``sampling.n`` completions per prompt over the servers; rows prompt-major, in prompt order."""
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompt_ids)} prompts")
        if seeds is None:
            per_prompt: list[int | None] = [
                None if sampling.seed is None else sampling.seed + i * sampling.n for i in range(len(prompt_ids))
            ]
        else:
            per_prompt = [int(s) for s in seeds]
        stops = self._stop_ids(sampling)
        with self._lock:
            model = self.request_model
            bodies = [completions_api.sample_body(model, p, sampling, stops, s) for p, s in zip(prompt_ids, per_prompt)]
            answers = self._run(bodies, lambda r: completions_api.parse_samples(r, sampling.n), "the rollout")
        rows = [row for answer in answers for row in answer]
        return Generation(
            completion_ids=[ids for ids, _, _ in rows],
            sampling_logprobs=[lps for _, lps, _ in rows],
            finished=[done for _, _, done in rows],
        )

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """Teacher-forced ``log_softmax(z)`` of the completions on some up server (temperature 1 only)."""
        if temperature != 1.0:
            raise ValueError(f"ServerEngine.score supports temperature=1.0 only, got {temperature}")
        with self._lock:
            bodies = [completions_api.score_body(self.request_model, p, c) for p, c in zip(prompt_ids, completion_ids)]
            answers = self._run(bodies, lambda r: r, "the weight-sync probe")
        rows = zip(answers, prompt_ids, completion_ids)
        return [torch.tensor(completions_api.parse_scores(a, len(p), c)) for a, p, c in rows]

    # ------------------------------------------------------------------ checks
    def server_logprobs(
        self, server: Server, prompt_ids: list[list[int]], completion_ids: list[list[int]]
    ) -> list[torch.Tensor]:
        """Log-probs of the completions on one server (:func:`~lit_fgrpo.servers.probe.server_logprobs`)."""
        return server_logprobs(server.client, self.request_model, prompt_ids, completion_ids)

    def check_server(self, server: Server, reference: Reference, where: str) -> float:
        """One server against the trainer's log-probs; raises :class:`WeightSyncError` naming the server."""
        prompts, completions, trainer_lp, tolerance = reference
        engine_lp = self.server_logprobs(server, prompts, completions)
        return check_logprob_gap(engine_lp, trainer_lp, tolerance, f"{where} on vllm server {server.url}")

    def check_sync(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        trainer_logprobs: list[torch.Tensor],
        tolerance: float,
        where: str,
    ) -> float:
        """The largest gap over **every** up server (see :meth:`server_logprobs`); the first server over
        ``tolerance`` raises :class:`WeightSyncError` with its URL.

        A server that dies during its check is taken out as one that dies mid-rollout: a launched one is restarted,
        given the current weights and this same check before it takes requests (:meth:`_bring_up`); the others'
        checks go on. With no server checked, it waits for a restarted one.

        Raises:
            WeightSyncError: a server's gap is over ``tolerance``.
            ServerError: no server is left (one line naming each, what was done and its log), or a server that still
                answers ``/health`` failed its check request.
        """
        reference: Reference = (list(prompt_ids), list(completion_ids), list(trainer_logprobs), tolerance)
        with self._lock:
            # Set first: a server restarted from now on is checked against this probe (it has these weights).
            self.reference, self._reference_weights = reference, (self.version, self.adapter_version)
            self._restart_gaps = []
            gaps = []
            for server in self.fleet.wait_for_any(f"the weight-sync check ({where})"):
                try:
                    gaps.append(self.check_server(server, reference, where))
                except ServerRequestError as exc:
                    self.fleet.failed(server, f"during the weight-sync check: {exc}")
                    if server.state == "up":  # it still answers /health: not a death, a failed check
                        raise
            if not gaps:  # each was restarted: the first back is loaded and checked (_bring_up) before it is up
                self.fleet.wait_for_any(f"the weight-sync check ({where})")
        return max(gaps + self._restart_gaps, default=0.0)

    # ------------------------------------------------------------------ weights
    def _load_on(self, server: Server, full: bool, reset_cache: bool = True) -> None:
        """Load the current full weights (``full``: the current directory, or the last push over the server's group),
        then the current adapter (LoRA), then drop the cache."""
        if full and self.groups is not None and self.groups.staged:
            self.groups.send(server.client)
        elif full and self.groups is None:
            server.client.collective_rpc("load_weights_dir", str(self.model_dir))
        if self.adapter is not None:
            server.client.load_adapter(self.adapter[0], str(self.adapter[1]))
        if reset_cache:
            server.client.reset_prefix_cache()

    def push_state_dict(self, state_dict: dict[str, torch.Tensor], reset_cache: bool = True) -> int:
        """Load ``state_dict`` on every up server as the next version (a new directory, or over the push groups);
        returns the bytes written (the tensors' bytes for collective pushes). Prefer :meth:`sync_weights`; this sends
        exactly what it is given (tests break pushes with it).

        Raises:
            ServerError: no server is left, or a collective push failed on a server still up (one line naming it).
        """
        with self._lock:
            start = time.perf_counter()
            self.version += 1
            if self.groups is None:
                previous = self.model_dir
                self.model_dir = next_version_dir(previous, self.model_dir.parent, self.version)
                size = write_state_dict(state_dict, self.model_dir)
                self.fleet.model_dir = str(self.model_dir)  # what a server restarted from now on starts with
            else:
                size = self.groups.stage(state_dict)  # kept: a restarted server gets it too
            for server in self.fleet.wait_for_any("the weight push"):
                try:
                    self._load_on(server, True, reset_cache)
                except ServerError as exc:
                    self.fleet.failed(server, str(exc))  # a restarted server gets these weights in _bring_up
                    if self.groups is not None and server.state == "up":
                        raise
            if self.groups is None:
                self._drop_old_versions()
            self._push_metrics = {"rollout/push_seconds": time.perf_counter() - start, "rollout/push_bytes": size}
            return size

    def sync_weights(self, model: nn.Module) -> None:
        """Push the policy to every server: its full state dict (``lm_head.weight`` included, PEFT LoRA merged), or
        for a LoRA engine the adapter alone (the frozen base too on the engine's first push)."""
        if self.groups is not None:
            self.groups.use(*resolve_backend(self.settings.push_backend, next(model.parameters()).device))
        if self.groups is not None and not self.lora:
            with merged_lora(model):  # staged straight from the live parameters, in their dtype (no CPU clone)
                self.push_state_dict(policy_state_dict(model))
            return
        if not self.lora:
            self.push_state_dict(cpu_state_dict(model))
            return
        with self._lock:
            start, size = time.perf_counter(), 0
            if not self._base_pushed:  # servers given by URL (or a resumed run's) may serve other base weights
                size += self.push_state_dict(cpu_state_dict(model, merge=False))
                self._base_pushed = True
            size += self.push_adapter(model)
            self._push_metrics = {"rollout/push_seconds": time.perf_counter() - start, "rollout/push_bytes": size}

    def push_adapter(self, model: nn.Module) -> int:
        """Write the PEFT adapter as the next version, load it on every up server under a new name (the old one is
        unloaded), drop their prefix caches; requests name it from now on. Returns the adapter's bytes.

        Raises:
            ServerError: no server is left to receive it.
        """
        with self._lock:
            previous, self.adapter_version = self.adapter, self.adapter_version + 1
            directory = self.model_dir.parent / "lora" / f"v{self.adapter_version}"
            size = write_adapter(model, directory)
            self.adapter = (adapter_name(self.model_name, self.adapter_version), directory)
            for server in self.fleet.wait_for_any("the adapter push"):
                try:
                    self._load_on(server, False)
                    if previous is not None:
                        server.client.unload_adapter(previous[0])
                except ServerError as exc:
                    self.fleet.failed(server, str(exc))  # a restarted server gets this adapter in _bring_up
            if previous is not None:
                shutil.rmtree(previous[1], ignore_errors=True)
            return size

    def last_push_metrics(self) -> dict[str, float]:
        """``rollout/push_seconds`` and ``rollout/push_bytes`` of the last push."""
        return dict(self._push_metrics)

    def _drop_old_versions(self) -> None:
        """Remove version directories nobody serves from (the current one and those of starting servers stay)."""
        starting = {Path(s.process.spec.model_path).name for s in self.fleet.servers if s.process is not None}
        drop_versions(self.model_dir.parent, {self.model_dir.name, "v0", *starting})

    def _bring_up(self, server: Server) -> None:
        """A restarted server: load the current weights (over a new push group for collective pushes) and adapter,
        then check it on the last probe (Fleet's ``on_ready``). A server that comes up during a push is not checked
        against the probe of the weights before it (it would fail): the push's own check, which covers every up server,
        follows."""
        if self.groups is not None:
            self.groups.drop(server.url)
        self._load_on(server, True)
        if self.reference is not None and self._reference_weights == (self.version, self.adapter_version):
            try:
                gap = self.check_server(server, self.reference, f"restart at weight version {self.version}")
                self._restart_gaps.append(gap)
            except WeightSyncError as exc:
                raise ServerError(str(exc)) from exc

    def close(self) -> None:
        """Stop launched servers (their whole process groups) and close the connections."""
        if self.groups is not None:
            self.groups.close()
        self.fleet.close()

"""Rollout engines: what turns token-id prompts into sampled completions and receives new policy weights.

``base.py`` is the interface (``RolloutEngine``, ``SamplingConfig``, ``Generation``, ``pad_rollouts``). ``hf.py``
generates with the training model itself (its own sampling loop in ``decode.py``, seeded per row by
``row_sampling.py``), ``hf_copy.py`` and ``hf_gathered.py`` with a private or gathered copy; ``vllm_engine.py`` with
vLLM in the trainer's process (``cpu_split.py`` shares the CPU cores). ``vllm_worker.py`` is the weight payload and
the one vLLM worker extension both vLLM engines load it with (this colocated one and the launched servers of
:mod:`lit_fgrpo.servers`); ``weight_wire.py`` is the layout a collective push puts on the wire. The weight-sync check
every engine shares is ``trainer_logprobs.check_policy_sync`` (the trainer's side) over ``sync_check.py`` (the
comparison and its one tolerance rule). The engine a run asks for is built above them and the server engine, by
:mod:`lit_fgrpo.rollout.engine_select`. Engines know nothing of rollout modes, rewards or the Trainer.
"""

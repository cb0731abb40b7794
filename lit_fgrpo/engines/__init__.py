"""Rollout engines: what turns token-id prompts into sampled completions and receives new policy weights.

``base.py`` is the interface (``RolloutEngine``, ``SamplingConfig``, ``Generation``); ``hf*.py`` generate with the
training model or a copy, ``vllm_engine.py`` with vLLM in the trainer's process; ``select.py`` builds the engine a
run asks for (the server engine lives in :mod:`lit_fgrpo.servers`). ``trainer_logprobs.py`` holds the weight-sync
check every engine shares. Engines know nothing of rollout modes, rewards or the Trainer.
"""

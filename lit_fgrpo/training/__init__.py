"""The training side: the LightningModule and everything one optimizer step runs.

``module.py`` (``FGRPOModule``: policy, reference, optimizers, ``training_step``) and its settings groups
(``module_settings.py``); ``update.py`` (one batch's advantages, passes, mini-batches and optimizer steps, without a
Trainer) with what it steps through (``update_handles.py``: the optimizer step, the non-finite guard, the process
group), its plan of mini- and micro-batches (``micro_batches.py``) and its logged statistics over all ranks
(``step_stats.py``); the AdamW kernels (``optimizer.py``), checkpoints that survive a kill and resume into a config
that agrees (``checkpointing.py``), the validation/test steps (``pass_at_k_steps.py``) and the supervised warm start
(``sft.py``). The policy model itself (loading, LoRA, log-probs, prompt sharing) lives in :mod:`lit_fgrpo.models`;
the loss in :mod:`lit_fgrpo.objectives`.
"""

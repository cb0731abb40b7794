"""The training side: the LightningModule and everything one optimizer step runs.

``module.py`` (``FGRPOModule``: policy, reference, optimizers, ``training_step``) and its settings groups,
``update.py`` (advantages, mini-batches, micro-batch sums and optimizer steps of one batch, without a Trainer) with
its handles, micro-batching, prompt sharing, the logged rollout statistics of a step, checkpoint migration and
policy-from-checkpoint loading, the validation/test steps, and the supervised warm start. The policy model itself
(loading, LoRA, log-probs) lives in :mod:`lit_fgrpo.models`; the loss in :mod:`lit_fgrpo.objectives`.
"""

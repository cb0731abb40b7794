"""AdamW's kernel: fused where torch has it, the same update as a loop over the formula, the config wins on resume."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.training.module_settings import OptimizerSettings
from lit_fgrpo.training.optimizer import build_adamw, kernel_flags, use_configured_kernel
from tests.training.tiny_setup import maze_data, quiet_trainer, tiny_module, word_count_rollouts


def adamw_loop(
    weights: list[torch.Tensor], grads: list[list[torch.Tensor]], lr: float, wd: float, betas: tuple[float, float]
) -> list[torch.Tensor]:
    """AdamW by its formula, entry by entry in float64 (Loshchilov and Hutter; torch's bias correction)."""
    b1, b2 = betas
    out = []
    for i, w0 in enumerate(weights):
        w = w0.double().clone()
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        for t, step_grads in enumerate(grads, start=1):
            g = step_grads[i].double()
            w = w * (1 - lr * wd)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            denom = (v / (1 - b2**t)).sqrt() + 1e-8
            w = w - lr / (1 - b1**t) * m / denom
        out.append(w)
    return out


@pytest.mark.parametrize("kernel", ["auto", "fused", "foreach", "for_loop"])
def test_every_kernel_is_adamw(kernel: str) -> None:
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(6, 5, generator=g), torch.randn(7, generator=g)]
    grads = [[torch.randn(w.shape, generator=g) for w in weights] for _ in range(4)]
    params = [nn.Parameter(w.clone()) for w in weights]
    optimizer = build_adamw(params, lr=0.01, weight_decay=0.1, betas=(0.9, 0.99), kernel=kernel)  # type: ignore[arg-type]
    for step_grads in grads:
        for p, grad in zip(params, step_grads):
            p.grad = grad.clone()
        optimizer.step()
    for p, want in zip(params, adamw_loop(weights, grads, 0.01, 0.1, (0.9, 0.99))):
        torch.testing.assert_close(p.detach().double(), want, rtol=0, atol=1e-6)
    assert optimizer.param_groups[0]["fused"] == (True if kernel in ("auto", "fused") else None)


def test_auto_keeps_torchs_choice_where_there_is_no_fused_kernel() -> None:
    meta = [nn.Parameter(torch.zeros(3, device="meta"))]  # no fused AdamW on the meta device (nor for DTensors)
    assert kernel_flags(meta, "auto") == {"fused": None, "foreach": None}
    with pytest.raises(ConfigError, match=r"^--model.optimizer.kernel fused: torch has no fused AdamW"):
        kernel_flags(meta, "fused")


def test_an_unknown_kernel_names_its_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--model.optimizer.kernel must be one of auto, fused, foreach, for_loop"):
        OptimizerSettings(kernel="adam8bit")  # type: ignore[arg-type]


def test_the_module_trains_with_the_fused_kernel_and_keeps_it_on_resume() -> None:
    module = tiny_module()
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.param_groups[0]["fused"] is True
    # a checkpoint written with torch's default kernel: load_state_dict brings its flags back ...
    params = [p for group in optimizer.param_groups for p in group["params"]]
    old = torch.optim.AdamW(params, lr=1e-3)
    optimizer.load_state_dict(old.state_dict())
    assert optimizer.param_groups[0]["fused"] is None
    # ... and the hook the module runs at on_train_start puts the configured one back
    use_configured_kernel(optimizer, kernel_flags(params, "auto"))
    assert optimizer.param_groups[0]["fused"] is True and not math.isnan(optimizer.param_groups[0]["lr"])


class KernelSeen(L.Callback):
    """The optimizer's kernel flags at every training batch (after any checkpoint was restored)."""

    def __init__(self) -> None:
        self.fused: list[bool | None] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.fused.append(trainer.optimizers[0].param_groups[0]["fused"])


def test_a_resumed_run_keeps_the_configured_kernel(tmp_path: Path) -> None:
    """A checkpoint written with the foreach kernel, resumed with ``auto``: the run goes on fused (Lightning's
    ``load_state_dict`` brings the saved flags back; the module's ``on_train_start`` puts the configured ones)."""

    def fit(max_steps: int, kernel: str, ckpt_path: str | None = None) -> KernelSeen:
        seen = KernelSeen()
        checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
        trainer = quiet_trainer(max_steps, [word_count_rollouts(), checkpoint, seen])
        trainer.fit(tiny_module(kernel=kernel), maze_data(), ckpt_path=ckpt_path)
        return seen

    assert fit(1, "foreach").fused == [None]
    assert fit(2, "auto", ckpt_path=str(tmp_path / "ckpt" / "last.ckpt")).fused == [True]

"""Lesson 9: what GPT-2's factor c does to each optimizer step, under SGD and under AdamW.

The Trainer divides GPT-2's summed token loss by N + S labels counted before the shift, so each
step's gradient is c g* with c = N/(N+S). What reaches the parameters depends on the optimizer:

    SGD:    Δθ = -lr G                        ->  ||Δθ_bug|| / ||Δθ_fixed||  =  c
    AdamW:  Δθ = -lr m̂ / (sqrt(v̂) + eps)     ->  a constant c cancels between m̂ and sqrt(v̂): ~ 1

(m̂: running mean of the gradient, sqrt(v̂): its running root mean square; only eps and a c that
changes from step to step leave a trace.) ``update_ratios`` measures it: the lesson's Trainer
(``make_trainer``: 22 sequences, micro-batches of 2, k = 4, no clipping) on the tiny GPT-2, as
configured and with ``loss_type = "ForCausalLM"``, once with ``optim="sgd"`` and once with the
Trainer's default AdamW, every other setting (learning rate 5e-5, linear decay, seed) the Trainer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accumlib.text import Table

from ._common import long_lived_objects_frozen

# The Trainer's settings per optimizer: everything else is make_trainer's (the Trainer's defaults).
OPTIMIZERS: dict[str, dict[str, Any]] = {
    "SGD": {"optim": "sgd"},  # torch.optim.SGD, no momentum
    "AdamW": {},  # the Trainer's default optim (adamw_torch_fused, eps 1e-8)
}

# How close to 1 AdamW's ratio stays. Its update m̂ / (sqrt(v̂) + eps) does not change when every
# gradient is scaled by one constant; what is left is eps (1e-8 against the gradient's entries) and
# c moving between steps (0.877 to 0.911 here), which m and v weigh differently. Measured: 3.4e-5,
# 9.1e-4, 1.8e-4 at steps 0, 1, 2 (step 1 is where c moves most). 1e-2 keeps a 10x margin and stays
# 8x below the smallest deviation SGD shows here (1 - c = 0.089).
ADAMW_RTOL = 1e-2


@dataclass(frozen=True)
class UpdateRatios:
    """Per optimizer step: c (verify's fit) and, per optimizer, ||Δθ_bug|| / ||Δθ_fixed||."""

    c: tuple[float, ...]
    ratios: dict[str, tuple[float, ...]]

    def table(self) -> Table:
        """One row per optimizer step: c, then each optimizer's update ratio."""
        rows = [
            (str(s), f"{c:.4f}", *(f"{r[s]:.4f}" for r in self.ratios.values())) for s, c in enumerate(self.c)
        ]
        return Table(
            ("step", "c = N/(N+S)", *(f"{name}: |Δθ bug| / |Δθ fixed|" for name in self.ratios)),
            rows,
            caption="the size of each parameter update with GPT-2's count, over the fixed run's",
        )


def _updates(loss_type: str | None, overrides: dict[str, Any]) -> list[Any]:
    """Δθ of every optimizer step of one Trainer run (all parameters, flattened)."""
    import torch
    import transformers

    from accumlib_course.survey import tiny_model

    from ._real_bugs_runs import make_trainer

    class Snapshots(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.thetas: list[torch.Tensor] = []

        def _keep(self, model: torch.nn.Module) -> None:
            self.thetas.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._keep(model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self._keep(model)  # after optimizer.step(): the step's parameters

    # float64 so that θ + Δθ keeps every update: in float32, lr 5e-5 updates of LayerNorm's weights of 1
    # round away, which blurs the ratio by ~4e-5 (the loss itself still runs its logits in float32)
    model = tiny_model("gpt2").double()
    if loss_type is not None:
        model.loss_type = loss_type
    trainer = make_trainer(model, **overrides)
    trainer.remove_callback(transformers.PrinterCallback)  # its end-of-training metrics line is no result
    snapshots = Snapshots()
    trainer.add_callback(snapshots)
    with long_lived_objects_frozen():
        trainer.train()
    thetas = snapshots.thetas
    return [after - before for before, after in zip(thetas, thetas[1:])]


def update_ratios(report: Any = None) -> UpdateRatios:
    """Each step's ||Δθ_bug|| / ||Δθ_fixed|| under SGD and under AdamW, beside c from ``report`` (verify's
    report of the Trainer on GPT-2 as configured: run ``"trainer-gpt2"``, made here if not given)."""
    from ._real_bugs_runs import run

    if report is None:
        report = run("trainer-gpt2")
    if not hasattr(report, "steps") or not hasattr(report, "codes"):
        raise TypeError(f"report must be an accumlib.Report (got {type(report).__name__})")
    from accumlib_course.survey.run import quiet

    ratios: dict[str, tuple[float, ...]] = {}
    with quiet():
        for name, overrides in OPTIMIZERS.items():
            bug, fixed = _updates(None, overrides), _updates("ForCausalLM", overrides)
            ratios[name] = tuple(float(b.norm() / f.norm()) for b, f in zip(bug, fixed, strict=True))
    c = tuple(r.factor for r in report.steps)
    if any(len(r) != len(c) for r in ratios.values()):
        raise ValueError(
            f"report must hold one step per optimizer step of the lesson's Trainer "
            f"({len(next(iter(ratios.values())))}) (got {len(c)})"
        )
    return UpdateRatios(c, ratios)

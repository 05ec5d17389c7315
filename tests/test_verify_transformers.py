"""verify on Hugging Face Transformers' own training loop: ``Trainer.train()`` on a tiny GPT-2 and a
tiny Llama, both built from configs (nothing is downloaded).

The Trainer divides each window by ``num_items_in_batch``, the labels it counts before any
forward. For a model whose ``loss_type`` maps to ``ForCausalLMLoss`` (``LlamaForCausalLM``) it
counts ``labels[..., 1:]``, the tokens the loss predicts, and is exact. ``GPT2LMHeadModel``
matches no ``LOSS_MAPPING`` key, so the Trainer counts every label, one per sequence too many:
each step's gradient is N / (N + S) of the true one, N the window's predicted tokens and S its
sequences (docs/transformers-label-count.md traces it, for transformers 5.23.0).

Data: 22 sequences of 3 to 20 tokens, micro-batches of 2, k = 4, so windows of 4, 4 and 3
micro-batches: the last is ragged, and token counts differ between micro-batches.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

# before transformers is imported: a tiny model built from a config needs no hub, and a test
# that reached for one should fail, not download
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

import accumlib
from accumlib.tolerances import FIT_RTOL, FLOAT32_RTOL

transformers = pytest.importorskip(
    "transformers", reason="transformers is in the test extra (pip install -e .[test])"
)
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)  # noqa: E402

V = 64  # vocabulary: a one-layer model over it trains an epoch in well under a second
K, B = 4, 2  # 22 sequences / B = 11 micro-batches: windows of 4, 4, 3
LR = 0.05
# The fitted scale of a float32 gradient lands within ~1e-6 of the one the Trainer applied (measured:
# 2e-7 residual); FIT_RTOL (1e-3) still tells N/(N+S) from any neighbour (S >= 6 in N + S <= 90).


def sequences(n: int = 22, seed: int = 0) -> list[torch.Tensor]:
    """n token sequences of 3..20 tokens (ids 1..V-1; 0 is padding)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 21, (n,), generator=g).tolist()
    return [torch.randint(1, V, (length,), generator=g) for length in lengths]


DATA = sequences()


def collate(seqs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence; padding is masked out and labelled -100 (never a target)."""
    ids = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def causal_lm_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every predicted token: position t predicts label t + 1, so a sequence of
    L labelled tokens has L - 1 items (the causal shift), and padding (-100) none."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), reduction="none")
    return ce[targets.flatten() != -100]


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=V, n_positions=64))


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )


MODELS = {"gpt2": gpt2, "llama": llama}


class Windows:
    """What each optimizer step was fed, seen from inside the Trainer, independently of verify: the
    labels of every forward, cut at every optimizer step. (Collate calls would not do: the Trainer
    fetches a whole window, and Accelerate one batch more, before the window's first forward.)"""

    def __init__(self) -> None:
        self.windows: list[list[torch.Tensor]] = []
        self.open: list[torch.Tensor] = []

    def attach(self, model: torch.nn.Module) -> list:
        return [
            model.register_forward_pre_hook(self._forward, with_kwargs=True),
            register_optimizer_step_pre_hook(self._step),
        ]

    def _forward(self, module, args, kwargs) -> None:
        if "labels" in kwargs:  # the Trainer's forwards; an item_losses forward passes none
            self.open.append(kwargs["labels"])

    def _step(self, optimizer, args, kwargs) -> None:
        self.windows.append(self.open)
        self.open = []

    def counts(self) -> list[tuple[int, int]]:
        """(N, S) per step: predicted tokens (labels after the shift) and sequences."""
        return [
            (sum(int((y[:, 1:] != -100).sum()) for y in w), sum(y.shape[0] for y in w)) for w in self.windows
        ]


def reset_accelerate() -> None:
    """The Trainer builds an Accelerator, whose state is process-wide: leave none behind."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def training_args(output_dir, **overrides) -> TrainingArguments:
    """The tests' Trainer settings: k = K micro-batches of B, one epoch, a constant learning rate, CPU, no
    logging or saving; ``overrides`` win."""
    kw = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=K,
        num_train_epochs=1,
        lr_scheduler_type="constant",
        learning_rate=LR,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    return TrainingArguments(**(kw | overrides))


def trainer_loop(output_dir, windows: Windows | None = None, **overrides):
    """``train_fn(model, optimizer, loader)`` that hands everything to the Trainer's own loop.
    ``max_grad_norm=0.0`` turns the Trainer's default clipping (1.0) off, so each step's gradient is
    the accumulated one as is; the tests with the default clipping leave it on."""

    def train_fn(model, optimizer, loader):
        args = training_args(output_dir, per_device_train_batch_size=loader.batch_size, **overrides)
        # the loader's dataset and collate_fn are verify's recording wrappers: the Trainer's own
        # DataLoader (shuffled, prepared by Accelerate) goes through them
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=loader.dataset,
            data_collator=loader.collate_fn,
            optimizers=(optimizer, None),
        )
        hooks = windows.attach(model) if windows is not None else []
        try:
            trainer.train()
        finally:
            for h in hooks:
                h.remove()

    return train_fn


def run(
    model: torch.nn.Module,
    output_dir,
    windows: Windows | None = None,
    verify_kw: dict | None = None,
    **overrides,
):
    reset_accelerate()
    try:
        return accumlib.verify(
            trainer_loop(output_dir, windows, **overrides),
            model=model,
            dataset=DATA,
            item_losses=causal_lm_losses,
            accum_steps=K,
            batch_size=B,
            collate_fn=collate,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
            **(verify_kw or {}),
        )
    finally:
        reset_accelerate()


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """One verify run per (model, clipping), shared by the tests that read it: (report, windows)."""
    cache: dict = {}

    def get(name: str, max_grad_norm: float = 0.0):
        if (name, max_grad_norm) not in cache:
            windows = Windows()
            out = tmp_path_factory.mktemp(f"{name}-clip{max_grad_norm}")
            cache[name, max_grad_norm] = (
                run(MODELS[name](), out, windows, max_grad_norm=max_grad_norm),
                windows,
            )
        return cache[name, max_grad_norm]

    return get


# --- the Trainer itself, without verify: the oracle for everything below ------------------------


@pytest.mark.parametrize("name, scaled", [("gpt2", True), ("llama", False)])
def test_trainer_gradient_against_the_token_mean_without_verify(tmp_path, name, scaled):
    """Run the Trainer directly; at each step compare the gradient its optimizer sees with the true
    token-mean gradient of the window's forwards, taken with autograd on a fresh copy at the same
    parameters. GPT-2's is exactly N/(N+S) of it (to float32 rounding), Llama's is it."""
    model = MODELS[name]()
    for m in model.modules():  # the Trainer trains in train mode; dropout would make masks differ
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    seen, captured = [], []

    def on_forward(module, args, kwargs):
        seen.append({k: kwargs[k] for k in ("input_ids", "attention_mask", "labels")})

    def on_step(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        captured.append(
            ([p.grad.detach().clone() for p in params], [p.detach().clone() for p in params], list(seen))
        )
        seen.clear()

    loader = torch.utils.data.DataLoader(DATA, batch_size=B, collate_fn=collate)
    hooks = [
        model.register_forward_pre_hook(on_forward, with_kwargs=True),
        register_optimizer_step_pre_hook(on_step),
    ]
    reset_accelerate()
    try:
        trainer_loop(tmp_path, max_grad_norm=0.0)(model, optimizer, loader)
    finally:
        for h in hooks:
            h.remove()
        reset_accelerate()

    assert [len(w) for _, _, w in captured] == [4, 4, 3]
    fresh = copy.deepcopy(model)
    for grads, params, window in captured:
        with torch.no_grad():
            for p, q in zip(fresh.parameters(), params):
                p.copy_(q)
        losses = torch.cat([causal_lm_losses(fresh, b) for b in window])
        true = torch.cat(
            [g.flatten() for g in torch.autograd.grad(losses.mean(), list(fresh.parameters()))]
        ).double()
        got = torch.cat([g.flatten() for g in grads]).double()
        n, s = losses.numel(), sum(b["input_ids"].shape[0] for b in window)
        ratio = float(got @ true / (true @ true))  # least-squares scale of the true gradient
        expected = n / (n + s) if scaled else 1.0
        assert abs(ratio - expected) <= FLOAT32_RTOL, (name, n, s, ratio)
        assert (
            float((got - ratio * true).norm() / true.norm()) <= FLOAT32_RTOL
        )  # a pure rescale, nothing else
        if scaled:
            assert float((got - true).norm() / true.norm()) >= 0.05  # and so not the true gradient


def test_why_gpt2_and_not_llama():
    """The root cause, pinned: the Trainer counts shifted labels only when LOSS_MAPPING maps the
    model's loss_type to ForCausalLMLoss. GPT2LMHeadModel's class name matches no key (loss_type
    None); its loss_function falls back to ForCausalLMLoss all the same, which shifts."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    g, ll = gpt2(), llama()
    assert g.loss_type is None and g.loss_function is ForCausalLMLoss
    assert LOSS_MAPPING[ll.loss_type] is ForCausalLMLoss


# --- verify on the Trainer ----------------------------------------------------------------------


def test_gpt2_rows_measure_n_over_n_plus_s(judged):
    """What today's verify can already show: every step's items are the window's predicted tokens,
    and the captured gradient is the true one times N/(N+S), so its norm ratio is that and its
    relative error S/(N+S)."""
    report, windows = judged("gpt2")
    counts = windows.counts()
    assert [r.micro_batches for r in report.steps] == [4, 4, 3]
    assert len(counts) == len(report.steps) == 3
    assert report.items_stepped == report.items_total == sum(n for n, _ in counts)
    for row, (n, s) in zip(report.steps, counts):
        assert row.items == n
        assert row.norm_ratio == pytest.approx(n / (n + s), rel=FIT_RTOL)
        assert row.rel_error == pytest.approx(s / (n + s), rel=FIT_RTOL)


def test_gpt2_is_misscaled_by_the_label_count(judged):
    """verify v2: the step is named ``misscaled``, each row carries the fitted scale N/(N+S), and the
    message says why (labels counted before the causal shift). The ragged tail is scaled by its own
    count, so it is no tail bug, and no micro-batch is weighted by its mean."""
    report, windows = judged("gpt2")
    assert "misscaled" in report.codes, str(report)
    assert not report.ok
    assert not report.codes & {"tail-misscaled", "mean-of-means", "unexplained", "tail-dropped"}, str(report)
    (finding,) = [f for f in report.findings if f.code == "misscaled"]
    assert finding.steps == (0, 1, 2)
    assert "shift" in finding.message.lower(), finding.message
    for row, (n, s) in zip(report.steps, windows.counts(), strict=True):
        assert row.items == n
        assert row.factor == pytest.approx(n / (n + s), rel=FIT_RTOL), (row, n, s)


def test_gpt2_misscale_is_not_excused_by_the_trainers_default_clipping(judged):
    """The Trainer clips to max_grad_norm=1.0 by default, and these gradients exceed it. verify
    intercepts that clip and undoes it, so the misscale it finds underneath is the Trainer's
    label count, not clipping. (Today's verify reports OK here: it also excuses the leftover
    uniform scale as a clip it did not see, from the clipped norms, which all equal max_norm.)"""
    report, _ = judged("gpt2", 1.0)
    assert "misscaled" in report.codes, str(report)
    assert not report.ok


def test_gpt2_told_its_loss_shifts_is_exact(tmp_path):
    """The negative control: the same GPT-2 with ``loss_type = "ForCausalLM"`` (the one-line
    workaround) makes the Trainer count labels[..., 1:], and verify finds nothing."""
    model = gpt2()
    model.loss_type = "ForCausalLM"
    report = run(model, tmp_path, max_grad_norm=0.0)
    assert report.ok and report.codes <= {"dropout"}, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)
    assert {r.cause for r in report.steps} == {""}  # no misscale, so no cause


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_llama_is_exact(judged, max_grad_norm):
    report, windows = judged("llama", max_grad_norm)
    assert report.ok, str(report)
    assert not [f for f in report.findings if f.severity == "bug"], str(report)
    assert [r.items for r in report.steps] == [n for n, _ in windows.counts()]
    if max_grad_norm == 0.0:  # without clipping, each step's gradient is the true one to float32 rounding
        assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)


def test_llama_rows_carry_scale_one(judged):
    """verify v2: an exact step's fitted scale is 1."""
    report, _ = judged("llama")
    for row in report.steps:
        assert row.factor == pytest.approx(1.0, rel=FLOAT32_RTOL), row


def test_max_steps_judges_the_first_steps_and_ends_the_loop(tmp_path):
    """verify v2: ``max_steps=2`` judges the first two optimizer steps, then ends the Trainer's loop
    cleanly: two rows, no step after them, and the items never reached are not a dropped tail."""
    windows = Windows()
    report = run(llama(), tmp_path, windows, verify_kw={"max_steps": 2}, max_grad_norm=0.0)
    assert len(report.steps) == 2
    # the loop really stopped: no forward past the second window (whichever step hook ran first)
    assert sum(map(len, windows.windows)) + len(windows.open) == 2 * K
    assert "tail-dropped" not in report.codes, str(report)
    assert report.ok, str(report)


def test_the_users_model_is_untouched_and_the_trainer_writes_only_under_tmp(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    def tree(root):
        return {p: p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else {}

    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # anything the Trainer writes relative to the working directory lands here
    hub_home = tree(Path(hub.HF_HOME))
    model = gpt2()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = model.config.to_dict()
    dropout = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]

    report = run(model, out, max_grad_norm=0.0)

    assert report.steps  # the Trainer ran
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), "the user's parameters changed"
    assert model.config.to_dict() == config
    assert model.training  # built in train mode, left so (the Trainer switched verify's copy only)
    assert [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)] == dropout == [0.1] * 4
    assert not model._forward_pre_hooks and all(p.grad is None for p in model.parameters())
    assert list(cwd.iterdir()) == []
    assert {p for p in tmp_path.rglob("*") if p not in (cwd, out) and out not in p.parents} == set()
    assert tree(Path(hub.HF_HOME)) == hub_home  # no hub cache written (or read into)

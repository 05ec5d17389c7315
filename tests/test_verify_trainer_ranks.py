"""accumlib.hf.verify_trainer under a multi-process run: a real ``transformers.Trainer`` (DDP through
Accelerate) on 2 gloo ranks started by ``accumlib.distributed.launch``, as torchrun or ``accelerate
launch`` would, on a tiny Llama built from its config (nothing downloaded). Every rank calls
verify_trainer; verify runs with ranks="all" and every rank gets the same report.

What transformers 5.23.0 does (site-packages/transformers/trainer.py): ``_get_num_items_in_batch``,
lines 2340-2342: ``if self.args.average_tokens_across_devices: if self.args.world_size > 1:
num_items_in_batch = self.accelerator.gather(num_items_in_batch.to(device)).sum()`` (the window's
tokens over every rank); ``compute_loss``, lines 2200-2207: with the flag set, ``loss_scale =
self.accelerator.num_processes // self.get_tp_size(); loss *= loss_scale``, which DDP's mean over ranks
undoes: each step is exact. With the flag False the count stays the rank's own (line 2343 only handles
``n_gpu > 1``) and nothing is multiplied, so DDP averages per-rank means: ``per-rank-mean``.

Every case is judged twice: by verify, and by this file's own arithmetic. A Trainer subclass records
each micro-batch ``training_step`` receives and the ``num_items_in_batch`` it divides by; a step hook
records the gradient the optimizer saw and the parameters; the test then computes, in float64 on a
fresh Llama, the job's true gradient g* = sum_r O_r / N and the per-rank-mean prediction
H = (1/R) sum_r O_r / N_r from those micro-batches (O_r: the summed token-loss gradients of rank r's
window, N_r its predicted tokens). The ranks' token counts differ in every window, so g* != H and the
flag matters.

Data sharding (Accelerate's ``BatchSamplerShard``, ``even_batches=True`` by default): with 23
sequences, micro-batches of 2 and 2 ranks the sampler makes 12 batches, the last holding one sequence;
Accelerate completes it with ``initial_data[cycle_index:end_index]``, the epoch's first indices
(accelerate 1.15.0, data_loader.py lines 235-266), so one sequence is drawn twice in the pass. Measured:
the job is exact and verify adds a ``duplicate-items`` note (1 draw), nothing else.

All cases run in one launch (two fresh interpreters with transformers cost seconds on 2 cores).
"""

from __future__ import annotations

import json
import multiprocessing
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: tiny models need no hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402

pytest.importorskip("transformers", reason="transformers is in the hf and test extras")
from transformers import Trainer, TrainingArguments  # noqa: E402

from accumlib.distributed import launch  # noqa: E402
from accumlib.hf import causal_lm_losses, verify_trainer  # noqa: E402
from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402
from accumlib_course.examples.data import collate, token_sequences  # noqa: E402
from accumlib_course.examples.hf_tiny import tiny_llama  # noqa: E402

LAUNCH_TIMEOUT_S = 240  # 3 verify_trainer runs per rank; each takes a few seconds on 2 loaded cores
# float32 gradients of ~100 token losses against a float64 oracle: the rounding floor is ~1e-7 (FLOAT32_RTOL)
K, B = 2, 2  # 24 sequences over 2 ranks: 6 micro-batches of 2 per rank, 3 windows of 2
CASES = {"average-tokens": (24, True), "per-rank-tokens": (24, False), "uneven": (23, True)}


class Recording(Trainer):
    """Keeps the Trainer's loop; notes each micro-batch and the num_items_in_batch it is divided by.
    On the class, so verify_trainer's copy (built as type(trainer)) writes here too."""

    windows: list[list[tuple[dict, float]]] = []
    model_seen: torch.nn.Module | None = None  # the model trained (verify's copy), unwrapped

    def training_step(self, model, inputs, num_items_in_batch=None):
        Recording.model_seen = self.model
        Recording.windows[-1].append(
            ({k: v.detach().clone() for k, v in inputs.items()}, float(num_items_in_batch))
        )
        return super().training_step(model, inputs, num_items_in_batch)


def make_trainer(out, data, average, cls=Recording, **kw):
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=K,
        num_train_epochs=1,
        max_grad_norm=0.0,
        learning_rate=0.05,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
        ddp_find_unused_parameters=False,
        average_tokens_across_devices=average,
        **kw,
    )
    return cls(model=tiny_llama(), args=args, train_dataset=data, data_collator=collate)


def _sum_of_grads(params, window):
    """(sum over the window's predicted tokens of grad l_i, flat float64; their count; their loss sum) at
    ``params``."""
    model = tiny_llama().double()
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
    losses = torch.cat([causal_lm_losses(model, b) for b, _ in window])
    grads = torch.autograd.grad(losses.sum(), list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]), losses.numel(), float(losses.detach().sum())


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _ids(batch, data):
    """Dataset indices of a micro-batch's rows, by content (the 24 sequences are distinct)."""
    index = {tuple(s.tolist()): i for i, s in enumerate(data)}
    return [index[tuple(row[m == 1].tolist())] for row, m in zip(batch["input_ids"], batch["attention_mask"])]


def _run_cases(rank, world, out):
    import torch.distributed as dist

    results = {}
    for name, (n, average) in CASES.items():
        data = token_sequences(n=n)
        seen = []  # per step on this rank: (parameters, gradient)

        def record(opt, args, kwargs, seen=seen):  # bound now: this case's record
            # the model's order (the Trainer groups by weight decay)
            ps = list(Recording.model_seen.parameters())
            seen.append(
                (
                    [p.detach().double().clone() for p in ps],
                    torch.cat([p.grad.detach().double().reshape(-1) for p in ps]),
                )
            )
            Recording.windows.append([])

        Recording.windows = [[]]
        hook = register_optimizer_step_pre_hook(record)
        user = make_trainer(f"{out}/{name}-{rank}", data, average)
        before = [p.detach().clone() for p in user.model.parameters()]
        try:
            report = verify_trainer(user)
        finally:
            hook.remove()
        untouched = (
            all(torch.equal(a, b) for a, b in zip(before, user.model.parameters(), strict=True))
            and user.state.global_step == 0
            and all(p.grad is None for p in user.model.parameters())
        )
        windows = [w for w in Recording.windows if w][: len(seen)]
        mine = [([b for b, _ in w], [nib for _, nib in w], p, g) for w, (p, g) in zip(windows, seen)]
        every = [None] * world
        dist.all_gather_object(every, mine)
        steps = []
        for t in range(min(len(e) for e in every)):
            params = every[0][t][2]
            per_rank = [_sum_of_grads(params, [(b, None) for b in e[t][0]]) for e in every]
            truth = sum(o for o, _, _ in per_rank) / sum(c for _, c, _ in per_rank)
            h = sum(o / c for o, c, _ in per_rank) / world  # each rank's own mean, averaged by DDP
            g = every[rank][t][3]
            steps.append(
                dict(
                    rel=_rel(g, truth),
                    rel_h=_rel(g, h),
                    counts=[c for _, c, _ in per_rank],
                    loss_sums=[x for _, _, x in per_rank],
                    divided_by=[sorted(set(e[t][1])) for e in every],
                    ids=[[i for b in e[t][0] for i in _ids(b, data)] for e in every],
                )
            )
        results[name] = dict(report=report.to_dict(), text=str(report), steps=steps, untouched=untouched)
    results["fsdp"] = _refused(rank, out)
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(results, fh)


def _refused(rank, out):
    """FSDP through the Trainer's own arguments, built for real on the 2 ranks: refused before any work.
    Last in the launch: it leaves an FSDP-flavoured Accelerator state behind."""
    user = make_trainer(f"{out}/fsdp-{rank}", token_sequences(n=24), True, fsdp=True)
    before = [p.detach().clone() for p in user.model.parameters()]
    Recording.windows = [[]]
    try:
        verify_trainer(user)
    except ValueError as err:
        error = str(err)
    else:
        error = None
    untouched = (
        all(torch.equal(a, b) for a, b in zip(before, user.model.parameters(), strict=True))
        and user.state.global_step == 0
        and user.args.fsdp is True
        and all(p.grad is None for p in user.model.parameters())
    )
    return dict(error=error, trained=Recording.windows != [[]], untouched=untouched)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer-ranks")
    launch(_run_cases, (str(out),), world_size=2, timeout=LAUNCH_TIMEOUT_S)
    assert not multiprocessing.active_children()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _codes(case):
    return {f["code"] for f in case["report"]["findings"]}


def test_every_rank_gets_the_same_report(job):
    for name in CASES:
        assert job[0][name]["text"] == job[1][name]["text"], name
        # the user's model, on both ranks
        assert job[0][name]["untouched"] and job[1][name]["untouched"], name


def test_average_tokens_across_devices_is_exact(job):
    """True (the default): every rank divides by the window's tokens over both ranks and multiplies by 2."""
    c = job[0]["average-tokens"]
    steps = c["steps"]
    # unequal: True vs False matters
    assert len(steps) == 3 and all(s["counts"][0] != s["counts"][1] for s in steps)
    # the all-gathered count, on each rank
    assert all(s["divided_by"] == [[sum(s["counts"])]] * 2 for s in steps)
    assert all(
        s["rel"] < FLOAT32_RTOL and s["rel_h"] > 0.1 for s in steps
    )  # the test's oracle: G = g*, far from H
    assert c["report"]["ok"] and c["report"]["status"] == "ok" and not c["report"]["findings"], c["text"]
    assert [s["codes"] for s in c["report"]["steps"]] == [[]] * 3
    assert all(s["rel_error"] < FLOAT32_RTOL for s in c["report"]["steps"])
    assert [s["items"] for s in c["report"]["steps"]] == [sum(s["counts"]) for s in steps]
    assert c["report"]["items_stepped"] == c["report"]["items_total"] == sum(sum(s["counts"]) for s in steps)


def test_the_reported_training_loss_is_rank_zeros_own_share(job):
    """Not a gradient bug, but what the report prints: with no logging step, the Trainer's training_loss
    is rank 0's un-gathered sum of 2 x (its token-loss sum / the window's tokens), averaged over steps
    (measured 3.21 against a true mean token loss of 4.23). verify reports rank 0's number on every rank."""
    c = job[0]["average-tokens"]
    rank0 = sum(2 * s["loss_sums"][0] / sum(s["counts"]) for s in c["steps"]) / len(c["steps"])
    assert abs(c["report"]["logged_loss"] - rank0) < FLOAT32_RTOL * rank0
    assert abs(c["report"]["logged_loss"] - c["report"]["true_loss"]) > 0.1 * c["report"]["true_loss"]
    assert job[1]["average-tokens"]["report"]["logged_loss"] == c["report"]["logged_loss"]


def test_per_rank_token_counts_are_per_rank_mean(job):
    """False: each rank divides by its own window's tokens, and DDP averages the two means."""
    c = job[0]["per-rank-tokens"]
    steps = c["steps"]
    # each rank its own count
    assert all(s["divided_by"] == [[s["counts"][0]], [s["counts"][1]]] for s in steps)
    assert all(
        s["rel_h"] < FLOAT32_RTOL and s["rel"] > 0.1 for s in steps
    )  # the test's oracle: G = H, not g*
    assert not c["report"]["ok"] and _codes(c) == {"per-rank-mean"}, c["text"]
    assert [s["codes"] for s in c["report"]["steps"]] == [["per-rank-mean"]] * 3
    f = c["report"]["findings"][0]
    assert f["steps"] == [0, 1, 2] and "average_tokens_across_devices=True" in f["fix"]
    assert str(steps[0]["counts"]) in f["message"], f["message"]


def test_a_length_not_divisible_by_the_ranks_repeats_one_item(job):
    """23 sequences, micro-batches of 2, 2 ranks: Accelerate's even_batches completes the 12th batch
    from the start of the epoch's order; the job is exact and verify notes the one repeated draw."""
    c = job[0]["uneven"]
    draws = [i for s in c["steps"] for rank in s["ids"] for i in rank]
    assert set(draws) == set(range(23)) and len(draws) == 24  # every sequence drawn, one of them twice
    (twice,) = [i for i in set(draws) if draws.count(i) == 2]
    assert twice == c["steps"][0]["ids"][0][0]  # the epoch's first draw, repeated in the last batch
    assert all(s["rel"] < FLOAT32_RTOL and s["divided_by"] == [[sum(s["counts"])]] * 2 for s in c["steps"])
    assert c["report"]["ok"] and _codes(c) == {"duplicate-items"}, c["text"]
    f = c["report"]["findings"][0]
    assert "1 draw(s)" in f["message"] and "every rank" in f["message"] and f["severity"] != "bug", f
    # the repeated sequence's tokens count twice, in the Trainer's N and in verify's: nothing reads as left
    # out
    assert (
        c["report"]["items_stepped"]
        == c["report"]["items_total"]
        == sum(sum(s["counts"]) for s in c["steps"])
    )


def test_fsdp_through_the_trainers_args_is_refused_before_any_work(job):
    for rank in job:
        r = rank["fsdp"]
        assert (
            r["error"]
            and r["error"].startswith("trainer.args.fsdp must be unset")
            and "(got trainer.args.fsdp=True)" in r["error"]
        )
        assert not r["trained"] and r["untouched"]


# --- refusals in one process: before any work, the user's trainer untouched -----------------------


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user's Trainer; building a Trainer or calling verify after it fails the test."""
    trainer = make_trainer(tmp_path, token_sequences(n=24), True)
    before = [p.detach().clone() for p in trainer.model.parameters()]

    def refused(*a, **k):
        raise AssertionError("verify ran: the refusal came too late")

    monkeypatch.setattr("accumlib.hf.trainer.verify", refused)
    monkeypatch.setattr(Recording, "__init__", refused)
    yield trainer
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert trainer.state.global_step == 0 and all(p.grad is None for p in trainer.model.parameters())


def test_deepspeed_is_refused_by_name(user):
    user.args.deepspeed = {"zero_optimization": {"stage": 2}}  # as built under deepspeed (not installed here)
    with pytest.raises(
        ValueError,
        match=r"trainer.args.deepspeed must be unset: .*DeepSpeed.*\(got trainer.args.deepspeed="
        r"\{'zero_optimization': \{'stage': 2\}\}\)",
    ):
        verify_trainer(user)


def test_fsdp_from_an_accelerate_config_is_refused_by_name(user):
    user.is_fsdp_enabled = True  # what `accelerate launch` with an FSDP config sets on the Trainer
    with pytest.raises(
        ValueError, match=r"trainer.is_fsdp_enabled must be False: .*\(got trainer.is_fsdp_enabled=True\)"
    ):
        verify_trainer(user)


def test_data_parallel_is_refused_by_name(user, monkeypatch):
    monkeypatch.setattr(TrainingArguments, "n_gpu", property(lambda self: 2))  # 2 GPUs visible to one process
    with pytest.raises(ValueError, match=r"trainer.args.n_gpu must be 1: .*DataParallel.*\(got n_gpu=2\)"):
        verify_trainer(user)


def test_a_world_size_without_its_process_group_is_refused(user, monkeypatch):
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 2))
    with pytest.raises(
        ValueError,
        match=r"trainer.args.world_size must be the size of the process group .*"
        r"\(got world_size=2, process group of 1\)",
    ):
        verify_trainer(user)


def test_the_users_trainer_across_ranks_is_judged_in_place(job):
    """The Trainer's own backward on each rank is the oracle: no second forward on either rank."""
    for name in CASES:
        assert [job[r][name]["report"]["oracle"] for r in range(2)] == ["in-place"] * 2, name

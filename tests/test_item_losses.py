"""``item_losses`` for the in-place engine (``accumlib.watch(item_losses=...)``, ``accumlib run
--item-losses MODULE:FUNCTION``): a loop whose loss is its own, or adds several terms per micro-batch,
is judged once the user names the function returning each item's combined loss, and refused by name
(never guessed) when the user has not. Every verdict against the test's own oracle (``_watch_loops.run``:
``accumlib.true_gradient`` over the window's micro-batches with the same per-item loss), the wrong loops
first; the command line's exits at the end.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from _watch_loops import PAD, TinyLM, assert_figures, micro_batches, run
from test_run_cli import SCRIPT, accumlib_run

from accumlib._verify.watch import watch
from accumlib.cli import main
from accumlib.tolerances import FLOAT32_RTOL

AUX = 0.1  # the auxiliary term's weight: large enough that leaving it out moves every step (asserted)


def terms(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each unmasked token's cross-entropy plus an auxiliary penalty on its logits (two terms)."""
    keep = y != PAD
    kept = logits[keep]
    return F.cross_entropy(kept, y[keep], reduction="none") + AUX * kept.square().mean(-1)


def item_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loop's own loss, called by this name (what ``item_losses`` names): one loss per token."""
    return terms(logits, y)


def oracle_losses(model, batch):  # the truth's per-item loss: the same terms, not through the wrapped name
    x, y = batch
    return terms(model(x), y)


def ce_only(model, batch):  # the truth a loop without the auxiliary term would have
    x, y = batch
    keep = y != PAD
    return F.cross_entropy(model(x)[keep], y[keep], reduction="none")


def summed_over_window(model, opt, batches, k):
    """Correct: each token's combined loss weighed 1/N, N the window's token count."""
    for s in range(0, len(batches), k):
        window = batches[s : s + k]
        n = sum(int((y != PAD).sum()) for _, y in window)
        for x, y in window:
            (item_loss(model(x), y).sum() / n).backward()
        opt.step()
        opt.zero_grad()


def mean_over_k(model, opt, batches, k):
    """The textbook mistake on ragged token counts: each micro-batch's mean, divided by k."""
    for i, (x, y) in enumerate(batches):
        (item_loss(model(x), y).mean() / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()


def test_without_item_losses_two_terms_are_refused_never_guessed():
    report, _ = run(summed_over_window, n=8, truth_losses=oracle_losses)
    assert report.status == "cannot-judge" and report.codes == {"several-losses"}, report
    assert all(r.codes[0].startswith("not judged") for r in report.steps)


def test_a_wrong_loop_with_its_item_losses_named_is_named_against_the_truth():
    report, truth = run(mean_over_k, n=8, truth_losses=oracle_losses, item_losses=item_loss)
    assert not report.ok and "mean-of-means" in report.codes, report
    assert min(truth) > 1e-3  # the test's own truth: every step is off
    assert_figures(report, truth)


def test_the_correct_loop_with_its_item_losses_named_is_ok_against_the_truth():
    for named in (item_loss, f"{__name__}:item_loss"):  # the function, or MODULE:FUNCTION
        report, truth = run(summed_over_window, n=8, truth_losses=oracle_losses, item_losses=named)
        assert report.ok and report.codes == set(), report
        assert max(truth) < FLOAT32_RTOL
        assert_figures(report, truth)
    # the auxiliary term matters: the truth without it is far from what the loop stepped
    _, without = run(summed_over_window, n=8, truth_losses=ce_only, item_losses=item_loss)
    assert min(without) > 1e-3
    assert sys.modules[__name__].item_loss is item_loss  # the module's own function is back


def penalised(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    keep = y != PAD
    return F.cross_entropy(logits[keep], y[keep], reduction="none") + 1e-2 * w.square().sum()


def reg_loss(logits, y, w):  # what the loop calls: each token's loss with the weight penalty in it
    return penalised(logits, y, w)


def test_a_regulariser_inside_each_items_loss_is_judged():
    """A weight penalty added once per micro-batch, over k micro-batches of ragged sizes: only a loop
    that weighs it as each item's share (l_i + R, summed over the window / N) matches the large batch."""

    def oracle(model, batch):
        return penalised(model(batch[0]), batch[1], model.out.weight)

    def loop(per_batch_mean):
        def train(model, opt, batches, k):
            for s in range(0, len(batches), k):
                window = batches[s : s + k]
                n = sum(int((y != PAD).sum()) for _, y in window)
                for x, y in window:
                    losses = reg_loss(model(x), y, model.out.weight)
                    (losses.mean() / k if per_batch_mean else losses.sum() / n).backward()
                opt.step()
                opt.zero_grad()

        return train

    report, truth = run(loop(False), n=8, truth_losses=oracle, item_losses=reg_loss)
    assert report.ok, report
    assert_figures(report, truth)
    report, truth = run(loop(True), n=8, truth_losses=oracle, item_losses=reg_loss)
    assert not report.ok and min(truth) > 1e-4, report
    assert_figures(report, truth)


def test_a_named_function_never_called_by_that_name_is_said():
    """The loop calls a binding accumlib did not replace: its steps are judged from the standard calls
    they make (here one cross-entropy), and the report says the function was never seen."""
    alias = ce_only

    def loop(model, opt, batches, k):
        for s in range(0, len(batches), k):
            window = batches[s : s + k]
            n = sum(int((y != PAD).sum()) for _, y in window)
            for batch in window:
                (alias(model, batch).sum() / n).backward()
            opt.step()
            opt.zero_grad()

    report, truth = run(loop, n=8, item_losses=f"{__name__}:item_loss")
    assert report.ok and report.codes == {"item-losses-unused"}, report
    assert f"{__name__}:item_loss" in report.findings[0].message
    assert max(truth) < FLOAT32_RTOL


def one_loss_per_batch(logits, y):  # breaks the contract: a 0-dim mean, not one loss per item
    return F.cross_entropy(logits.transpose(1, 2), y, ignore_index=PAD)


def test_a_function_that_returns_no_loss_per_item_is_refused_by_name():
    model, (x, y) = TinyLM(), micro_batches(1)[0]
    with pytest.raises(ValueError, match=r"one loss per item, a 1-D tensor \(got shape \(\)"):
        with watch(item_losses=one_loss_per_batch):
            one_loss_per_batch(model(x), y).backward()


def nested():
    def inner(logits, y):
        return logits

    return inner


@pytest.mark.parametrize(
    "spec, says",
    [
        ("item_loss", "must be MODULE:FUNCTION"),
        ("no_such_module_here:f", "must name an importable module"),
        (f"{__name__}:no_such_function", "no such attribute"),
        (f"{__name__}:AUX", "must name a function"),
        (lambda logits, y: logits, "must be a module-level function"),
        (nested(), "must be a module-level function"),
        (3, "must be MODULE:FUNCTION or a function"),
    ],
)
def test_bad_item_losses_are_refused_before_anything_runs(spec, says):
    with pytest.raises(ValueError, match=says):
        with watch(item_losses=spec):
            pytest.fail("the block must not run")


# -- accumlib run --item-losses --------------------------------------------------------------------
ITEM_LOSS = '''
def item_loss(logits, targets):
    """each token's cross-entropy plus a penalty on its logits' size (an auxiliary term)"""
    flat = logits.view(-1, logits.size(-1))
    return F.cross_entropy(flat, targets.view(-1), reduction="none") + 0.01 * flat.square().mean(-1)


'''
FORWARD = "        logits, loss = model(X, Y)\n"
OWN = "        logits, _ = model(X)\n        loss = item_loss(logits, Y).mean()\n"
SCALE = "        loss = loss / accum  # scale the loss for accumulation\n"


@pytest.fixture
def own(tmp_path):
    """The README's script with a loss of its own (two terms per token), correct and broken."""
    assert SCRIPT.count(FORWARD) == 1 and SCRIPT.count(SCALE) == 1
    script = SCRIPT.replace("def get_batch():", ITEM_LOSS.lstrip() + "def get_batch():").replace(FORWARD, OWN)
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "broken.py").write_text(script.replace(SCALE, ""))
    module = script.replace("\ndef item_loss", "\nfrom losses import item_loss\n\n\ndef _unused")
    (tmp_path / "uses_module.py").write_text(module)
    (tmp_path / "losses.py").write_text("import torch.nn.functional as F\n" + ITEM_LOSS)
    inside = script.replace("\ndef item_loss", "\ndef main():\n    pass\n\n\ndef _item_loss")
    (tmp_path / "inside.py").write_text(inside.replace("loss = item_loss(", "loss = _item_loss("))
    return tmp_path


def test_run_refuses_two_terms_without_item_losses_exit_2_naming_both(own):
    done = accumlib_run(own, "--", "train.py")
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stderr.splitlines()[-1]
    assert said.startswith("accumlib run: error: this run adds 2 loss terms per micro-batch:"), said
    assert re.search(r"cross_entropy at train\.py:\d+ and a term of the script's own", said)
    assert said.endswith("pass --item-losses MODULE:FUNCTION")


def test_run_judges_the_scripts_own_function_named(own):
    done = accumlib_run(own, "--item-losses", "train:item_loss", "--json", "r.json", "--", "train.py")
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads((own / "r.json").read_text())
    assert got["ok"] and got["accum_steps"] == 4 and len(got["steps"]) == 5
    assert all(s["rel_error"] < FLOAT32_RTOL for s in got["steps"])
    assert "iter 4: loss" in done.stdout


def test_run_names_the_broken_twin_and_reads_a_module_the_script_imports(own):
    done = accumlib_run(own, "--item-losses", "broken:item_loss", "--", "broken.py")
    assert done.returncode == 1 and "[unscaled-sum]" in done.stdout, done.stdout + done.stderr
    assert "at: broken.py:45" in done.stdout  # the line that lost its / accum
    done = accumlib_run(own, "--item-losses", "losses:item_loss", "--", "uses_module.py")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (["--item-losses", "item_loss", "--", "train.py"], "must be MODULE:FUNCTION"),
        (["--item-losses", "inside:_item_los", "--", "inside.py"], "defines no top-level '_item_los'"),
        (["--item-losses", "nowhere:item_loss", "--", "train.py"], "must name an importable module"),
    ],
)
def test_run_item_losses_usage_errors_exit_2_before_the_script_runs(own, args, says, monkeypatch, capsys):
    monkeypatch.chdir(own)  # in this process: the command's own entry point, as `accumlib run` calls it
    assert main(["run", *args]) == 2
    out, err = capsys.readouterr()
    assert says in err and "iter 0" not in out, err


def test_run_reads_the_script_named_as_main_in_this_process(own, monkeypatch, capsys):
    monkeypatch.chdir(own)
    assert main(["run", "--item-losses", "__main__:item_loss", "--", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "iter 4: loss" in out and "verdict: OK" in out
    assert sys.modules["__main__"].__name__ == "__main__"  # the process's own __main__ is back

"""What the caller reads from a verify report: the status a CI acts on (a bug outranks a limit), the
verdict line, each finding's steps, the item count when it is unknown, the loss the loop reported, and
HTML that shows a message as text. Each from a real run of verify."""

from __future__ import annotations

import json

import torch.nn.functional as F

import accumlib
from accumlib import get_task
from accumlib.tolerances import FLOAT32_RTOL

K = 4
DIGITS, CNN = get_task("mlp-digits"), get_task("cnn-batchnorm")


def windows(model, opt, loader, divide=True, returns=False):
    batches, total, n_all = list(loader), 0.0, 0
    for s in range(0, len(batches), K):
        window = batches[s : s + K]
        n = sum(len(y) for _, y in window)
        for x, y in window:
            loss = F.cross_entropy(model(x), y, reduction="sum")
            total, n_all = total + loss.item(), n_all + len(y)
            (loss / n if divide else loss / len(y)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return total / n_all if returns else None


def run(fn, task=DIGITS, **kw):
    data = task.make_dataset() if task is CNN else accumlib.data.digits(110)
    return accumlib.verify(
        fn,
        model=task.make_model(0),
        dataset=data,
        item_losses=task.item_losses,
        accum_steps=K,
        batch_size=8,
        **kw,
    )


def test_a_bug_beside_a_limit_is_a_bug_and_the_limit_alone_cannot_judge():
    both = run(lambda m, o, dl: windows(m, o, dl, divide=False), task=CNN)
    assert both.codes == {"unscaled-sum", "batchnorm"}, str(both)
    assert (both.status, both.exit_status) == ("bug", 1)
    assert "verdict: NOT OK" in str(both)
    limit = run(windows, task=CNN)
    assert limit.codes == {"batchnorm"}, str(limit)
    assert (limit.status, limit.exit_status) == ("cannot-judge", 4)
    assert "verdict: CANNOT JUDGE (batchnorm)" in str(limit)


def test_the_text_names_each_findings_steps_and_the_verdict():
    naive = run(lambda m, o, dl: windows(m, o, dl, divide=False))
    assert "[unscaled-sum] (steps 0, 1, 2, 3)" in str(naive), str(naive)
    data = json.loads(naive.to_json())
    assert (data["status"], data["findings"][0]["code"], data["findings"][0]["severity"]) == (
        "bug",
        "unscaled-sum",
        "bug",
    )
    assert data["findings"][0]["steps"] == [0, 1, 2, 3]
    ok = run(windows)
    assert (ok.status, ok.exit_status) == ("ok", 0)
    assert "verdict: OK, every judged step saw the true large-batch gradient" in str(ok)


def test_an_unknown_item_count_reads_as_unknown_not_zero():
    report = run(windows, max_steps=2)
    assert report.items_total is None
    assert f"items that reached an optimizer step: {report.items_stepped}/?" in str(report), str(report)


def test_the_loss_the_loop_reported_is_printed_beside_the_true_one():
    report = run(lambda m, o, dl: windows(m, o, dl, returns=True))
    assert abs(report.logged_loss - report.true_loss) <= FLOAT32_RTOL * report.true_loss
    assert (
        f"loss the loop reported: {report.logged_loss:.4f}   true mean item loss: {report.true_loss:.4f}"
        in str(report)
    )


def test_html_shows_a_message_as_text():
    report = run(windows, max_steps=1)  # the partial-run note: a message of verify's own
    html = report._repr_html_()
    assert "<code>partial-run</code>" in html
    unsafe = accumlib.Report(
        steps=[],
        findings=[accumlib.Finding("dropout", "p <0.5> & more", "fix <it>")],
        accum_steps=K,
        items_stepped=0,
        items_total=0,
    )
    shown = unsafe._repr_html_()
    assert "p &lt;0.5&gt; &amp; more" in shown and "fix &lt;it&gt;" in shown and "<0.5>" not in shown

"""compare(), activation_bytes(), and the oracle's promise not to touch the model."""

import json
import math

import pytest
import torch

from accumlib import TASKS, compare, get_task, grads_of, true_gradient
from accumlib.cli import main
from accumlib.reference import check_reference_loops
from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL, OFF_BY_K_TOL
from accumlib_course.memory import activation_bytes


def test_compare_by_hand():
    a = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0])}
    c = compare(a, b)
    assert c.rel_error == pytest.approx(4 / 3)  # ||(0,4)|| / ||(3,0)||
    assert c.norm_ratio == pytest.approx(5 / 3)
    assert c.cosine == pytest.approx(3 / 5)
    assert c.max_abs_diff == pytest.approx(4.0)
    assert c.per_param == {"w": pytest.approx(4 / 3), "b": 0.0}
    assert c.worst(1) == [("w", pytest.approx(4 / 3))]


def test_compare_identical_and_zero_reference():
    g = {"w": torch.randn(5)}
    c = compare(g, g)
    assert c.rel_error == 0 and c.cosine == pytest.approx(1.0) and c.norm_ratio == pytest.approx(1.0)
    z = {"w": torch.zeros(3)}
    assert compare(z, z).rel_error == 0.0
    assert math.isinf(compare({"w": torch.ones(3)}, z).rel_error)  # anything but zero is infinitely off


def test_compare_reads_modules_and_renders():
    model = get_task("mlp-digits").make_model(0)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    c = compare(model, {k: torch.ones_like(v) * 2 for k, v in grads_of(model).items()})
    assert c.norm_ratio == pytest.approx(0.5) and c.cosine == pytest.approx(1.0)
    text, html = str(c), c._repr_html_()
    assert "relative error  5.000e-01" in text and "net.0.weight" in text
    assert "<table>" in html and "net.0.weight" in html


def test_activation_bytes_scale_with_the_micro_batch():
    task = get_task("mlp-digits")
    model = task.make_model(0)
    x, y = next(iter(task.loader(batch_size=32)))
    full = activation_bytes(model, (x, y), task.item_losses)
    quarter = activation_bytes(model, (x[:8], y[:8]), task.item_losses)
    assert full > 0
    one = activation_bytes(model, (x[:1], y[:1]), task.item_losses)
    # activations are linear in the batch; what is constant is a few saved scalars
    # (nll_loss keeps a 4-byte total_weight). Parameters would add ~17 KB and fail this.
    assert abs(full - 4 * quarter) <= 64 and abs(full - 32 * one) <= 256
    assert full / quarter == pytest.approx(4, rel=0.01)


def test_activation_bytes_does_not_run_backward_or_keep_grads():
    task = get_task("cnn-groupnorm")
    model = task.make_model(0)
    batch = next(iter(task.loader()))
    assert activation_bytes(model, batch, task.item_losses) > 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name", ["mlp-digits", "lm-tokens"])
def test_activation_bytes_keeps_no_activation_alive(name):
    """Each call's saved activations die with it: a saved-tensor hook that handed the tensor back to the graph
    closed a cycle gc could not free (lesson 10's cost cell held 409 MiB after Run All). Counted as the live
    tensors gc sees after 10 calls, against after one; the figure stays the same call after call."""
    import gc

    task = get_task(name)
    model = task.make_model(0)
    batch = next(iter(task.loader()))
    first = activation_bytes(model, batch, task.item_losses)
    gc.collect()
    before = sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
    assert all(activation_bytes(model, batch, task.item_losses) == first for _ in range(10))
    gc.collect()
    assert sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor)) == before


@pytest.mark.parametrize("name", sorted(TASKS))
def test_oracle_leaves_model_and_grads_alone(name):
    task = TASKS[name]
    model = task.make_model(0)
    window = list(task.loader())[:3]
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = true_gradient(model, window, task.item_losses, merge=task.merge)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # BatchNorm buffers too
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in model.parameters())
    assert set(g) == {k for k, p in model.named_parameters() if p.requires_grad}


def test_oracle_float64_agrees_with_float32_to_float32_rounding():
    task = get_task("lm-tokens")
    model = task.make_model(0)
    window = list(task.loader())[:4]
    g32 = true_gradient(model, window, task.item_losses, merge=task.merge)
    g64 = true_gradient(model, window, task.item_losses, merge=task.merge, dtype=torch.float64)
    assert all(v.dtype == torch.float64 for v in g64.values())
    assert compare(g32, g64).rel_error < FLOAT32_RTOL
    assert next(model.parameters()).dtype == torch.float32  # the float64 copy is a copy


def test_tolerances_are_ordered():
    # float32 rounding < bf16 rounding < the smallest bug (a 2-of-4 tail is 0.5 off)
    assert FLOAT32_RTOL < BF16_RTOL < 0.5 and OFF_BY_K_TOL < 0.5


def test_reference_table_verdicts_hold_and_cli_exits_zero(capsys):
    table = check_reference_loops(
        tasks=["mlp-digits", "cnn-batchnorm"], loops=["naive", "normalized", "ragged"]
    )
    assert table.ok, str(table)
    verdicts = {(r.loop, r.task): r for r in table.rows}
    assert verdicts["naive", "mlp-digits"].verdict == ("unscaled-sum",)
    assert verdicts["normalized", "mlp-digits"].verdict == ("mean-of-means", "tail-misscaled")
    assert verdicts["ragged", "mlp-digits"].verdict == ()
    assert verdicts["ragged", "cnn-batchnorm"].verdict == ("batchnorm",)  # BatchNorm cannot be exact
    assert verdicts["naive", "cnn-batchnorm"].verdict == ("batchnorm", "unscaled-sum")  # both said
    assert (
        verdicts["ragged", "mlp-digits"].items_used == verdicts["ragged", "mlp-digits"].items_available == 110
    )
    assert all(r.steps == r.expected_steps for r in table.rows)
    assert (
        main(["selfcheck", "--task", "cnn-groupnorm", "--loop", "ragged", "--loop", "naive", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and {r["loop"] for r in out["rows"]} == {"ragged", "naive"}


def test_cli_bad_usage_exits_2(capsys):
    assert main(["selfcheck", "--task", "nope"]) == 2
    assert "task must be one of" in capsys.readouterr().err
    assert main(["selfcheck", "--loop", "nope"]) == 2
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


# --- compare and the oracle at their edges -------------------------------------------------------


def test_compare_refuses_empty_gradients():
    from accumlib import compare

    with pytest.raises(ValueError, match="a and b must hold at least one gradient tensor"):
        compare({}, {})


def test_compare_lets_nan_through_every_figure():
    import math

    from accumlib import compare

    c = compare(
        {"w": torch.tensor([float("nan"), 1.0]), "v": torch.tensor([5.0])},
        {"w": torch.tensor([1.0, 1.0]), "v": torch.tensor([1.0])},
    )
    assert math.isnan(c.max_abs_diff) and math.isnan(c.rel_error) and math.isnan(c.cosine)
    assert math.isnan(c.per_param["w"]) and c.per_param["v"] == 4.0


def test_compare_zero_against_nonzero_is_not_aligned():
    from accumlib import compare

    c = compare({"w": torch.zeros(3)}, {"w": torch.tensor([1.0, 2.0, 2.0])})
    assert c.cosine == 0.0 and c.rel_error == 1.0 and c.norm_ratio == 0.0
    both_zero = compare({"w": torch.zeros(3)}, {"w": torch.zeros(3)})
    assert both_zero.rel_error == 0.0 and both_zero.cosine == 1.0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_max_abs_diff_is_the_largest_difference_of_either_sign(sign):
    from accumlib import compare

    c = compare({"w": torch.tensor([1.0, sign * -3.0, 0.5])}, {"w": torch.zeros(3)})
    assert c.max_abs_diff == 3.0


def test_true_gradient_of_an_unused_parameter_is_zero():
    # the large-batch loss does not depend on it, so its gradient is exactly 0 (not None, not skipped)
    from accumlib import get_task, true_gradient

    task = get_task("mlp-digits")
    model = task.make_model(0)
    model.unused = torch.nn.Parameter(torch.ones(4))
    g = true_gradient(model, list(task.loader())[:2], task.item_losses)
    assert torch.equal(g["unused"], torch.zeros(4))
    assert any(float(v.abs().sum()) > 0 for k, v in g.items() if k != "unused")

"""Bad input is refused loudly, naming the argument, the rule and the value."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accumlib import compare, get_task, resolve_device, true_gradient
from accumlib.data import TokenSequences, digits, synthetic_classification
from accumlib.loops import ALL, CONTRACTS
from accumlib.models import MLP

# Every registered loop is validated, the table's variants included (ALL, not LOOPS): the checks below
# are the common ones, read from a loop's signature and its CONTRACT.takes, so a new loop file needs no
# line here. A task field no case below knows fails test_every_task_field_a_loop_takes_is_validated.
LOOP_NAMES = sorted(ALL)


def setup():
    ds = synthetic_classification(16, n_features=6, n_classes=3)
    model = MLP(6, 8, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=4)


def ce(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


@pytest.mark.parametrize("loop", LOOP_NAMES)
@pytest.mark.parametrize("bad", [0, -1, 2.0, 2.5, "4", True, None])
def test_accum_steps_must_be_a_positive_integer(loop, bad):
    model, opt, loader = setup()
    with pytest.raises(
        ValueError, match=r"accum_steps must be .*" + (r"\(got " if not isinstance(bad, str) else "")
    ):
        ALL[loop](model, opt, loader, ce, accum_steps=bad)


def test_accum_steps_message_names_the_value():
    model, opt, loader = setup()
    with pytest.raises(ValueError, match=r"accum_steps must be an integer >= 1 \(got 0\)"):
        ALL["ragged"](model, opt, loader, ce, accum_steps=0)
    with pytest.raises(ValueError, match=r"accum_steps must be an integer >= 1 \(got 2.5 of type float\)"):
        ALL["ragged"](model, opt, loader, ce, accum_steps=2.5)


@pytest.mark.parametrize("loop", LOOP_NAMES)
def test_empty_loader_is_an_error(loop):
    model, opt, _ = setup()
    empty = DataLoader(TensorDataset(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long)), batch_size=4)
    with pytest.raises(ValueError, match="loader must yield at least one micro-batch"):
        ALL[loop](model, opt, empty, ce, accum_steps=2)


@pytest.mark.parametrize("loop", LOOP_NAMES)
@pytest.mark.parametrize(
    "bad_fn, message",
    [
        (lambda m, b: ce(m, b).mean(), r"must return a 1-D tensor .*got shape \(\)"),
        (lambda m, b: ce(m, b).view(2, -1), r"must return a 1-D tensor .*got shape \(2, \d+\)"),
        (lambda m, b: ce(m, b) * float("nan"), r"must return finite values \(got .*nan\)"),
        (lambda m, b: ce(m, b) + float("inf"), r"must return finite values \(got .*inf\)"),
        (lambda m, b: ce(m, b).tolist(), r"must return a 1-D torch.Tensor .*\(got list\)"),
    ],
)
def test_item_losses_contract_is_enforced(loop, bad_fn, message):
    model, opt, loader = setup()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="item_losses " + message):
        ALL[loop](model, opt, loader, bad_fn, accum_steps=2)
    # refused before any step: the model is untouched
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


# The bad values of each task field a loop may take (Contract.takes), with the error each must raise.
BAD_TAKES = {
    "count_items": [
        (lambda b: 5, ValueError, "count_items said 5 items, item_losses returned 4"),
        (lambda b: 0, ValueError, "at least one item .*got 0 items in 2 micro-batches"),
        (4, TypeError, r"count_items must be callable as count_items\(batch\) -> int \(got 4 of type int\)"),
    ],
    "merge": [
        (
            "cat",
            TypeError,
            r"merge must be callable as merge\(micro_batches\) -> batch \(got 'cat' of type str\)",
        )
    ],
}
TAKES_CASES = [
    pytest.param(loop, field, bad, error, message, id=f"{loop}-{field}-{i}")
    for loop in LOOP_NAMES
    for field in CONTRACTS[loop].takes
    for i, (bad, error, message) in enumerate(BAD_TAKES.get(field, []))
]


def test_every_task_field_a_loop_takes_is_validated():
    unknown = {loop: f for loop in LOOP_NAMES for f in CONTRACTS[loop].takes if f not in BAD_TAKES}
    assert not unknown, f"no bad cases in BAD_TAKES for the task fields these loops take: {unknown}"
    assert TAKES_CASES  # the negative: the loops that take a field are really exercised


@pytest.mark.parametrize("loop,field,bad,error,message", TAKES_CASES)
def test_a_bad_task_field_is_refused_before_any_step(loop, field, bad, error, message):
    model, opt, loader = setup()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(error, match=message):
        ALL[loop](model, opt, loader, ce, accum_steps=2, **{field: bad})
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_amp_max_norm_must_be_positive():
    model, opt, loader = setup()
    with pytest.raises(ValueError, match=r"max_norm must be None or a number > 0 \(got -1\)"):
        ALL["amp"](model, opt, loader, ce, accum_steps=2, max_norm=-1)
    with pytest.raises(ValueError, match=r"max_norm must be None or a number > 0 \(got nan\)"):
        ALL["amp"](model, opt, loader, ce, accum_steps=2, max_norm=float("nan"))


def test_progress_must_be_a_bar_or_bool():
    model, opt, loader = setup()
    with pytest.raises(ValueError, match="progress must be True, False or a tqdm bar"):
        ALL["ragged"](model, opt, loader, ce, accum_steps=2, progress="yes")


def test_unknown_task_lists_the_names():
    with pytest.raises(ValueError, match=r"task must be one of .*'mlp-digits'.* \(got 'nope'\)"):
        get_task("nope")


def test_bad_device_and_data_arguments():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' needs a GPU"):
            resolve_device("cuda")
    assert resolve_device("auto").type in {"cpu", "cuda"}
    with pytest.raises(
        ValueError,
        match=r"n must be an integer between 1 and 1797; digits holds that many images \(got 5000\)",
    ):
        digits(5000)
    with pytest.raises(
        ValueError, match=r"min_len must be an integer between 2 and 3; at most max_len \(got 9\)"
    ):
        TokenSequences(4, min_len=9, max_len=3)
    with pytest.raises(
        ValueError, match=r"norm must be one of 'batch', 'group', 'none', None \(got 'layer'\)"
    ):
        get_task("cnn-groupnorm").make_model(0).__class__(norm="layer")


def test_compare_refuses_mismatched_gradients():
    with pytest.raises(ValueError, match=r"a and b must name the same parameters \(only in a: \['x'\]"):
        compare({"x": torch.ones(1), "w": torch.ones(1)}, {"w": torch.ones(1)})
    with pytest.raises(ValueError, match=r"same shape for 'w' \(got \(2,\) and \(3,\)\)"):
        compare({"w": torch.ones(2)}, {"w": torch.ones(3)})
    with pytest.raises(TypeError, match="a must be a dict of tensors"):
        compare(3, {"w": torch.ones(1)})


def test_oracle_refuses_empty_window_and_padding_without_pad_values():
    task = get_task("lm-tokens")
    model = task.make_model(0)
    with pytest.raises(ValueError, match="batches must hold at least one micro-batch"):
        true_gradient(model, [], task.item_losses)
    batches = list(task.loader())[:2]
    with pytest.raises(ValueError, match="different trailing shapes .* pass pad_values="):
        true_gradient(model, batches, task.item_losses)  # default merge cannot re-pad


@pytest.mark.parametrize("loop", LOOP_NAMES)
def test_loops_do_not_touch_the_data(loop):
    model, opt, loader = setup()
    x0 = loader.dataset.tensors[0].clone()
    ALL[loop](model, opt, loader, ce, accum_steps=3)
    assert torch.equal(loader.dataset.tensors[0], x0)


def test_oracle_refuses_a_ddp_wrapper():
    # a real DDP needs a process group; an uninitialised instance is enough for the type check
    wrapper = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    with pytest.raises(TypeError, match="not DistributedDataParallel .*pass model.module"):
        true_gradient(wrapper, [(torch.zeros(1, 6), torch.zeros(1, dtype=torch.long))], ce)


# --- the loops refuse what torch would only answer with its own error ----------------------------


@pytest.mark.parametrize("loop", LOOP_NAMES)
def test_loops_name_the_argument_for_models_devices_and_detached_losses(loop):
    fn = ALL[loop]
    task = get_task("mlp-digits")
    model = task.make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        ValueError, match="model must hold real parameters, not parameters on the meta device"
    ):
        fn(task.make_model(0).to("meta"), opt, task.loader(), task.item_losses, accum_steps=2)
    with pytest.raises(
        ValueError, match=r"model must have at least one parameter with requires_grad=True \(got Identity"
    ):
        fn(torch.nn.Identity(), opt, task.loader(), task.item_losses, accum_steps=2)
    with pytest.raises(
        ValueError, match=r"device must be 'cpu', 'cuda', 'auto' or a torch.device \(got 'tpu'\)"
    ):
        fn(model, opt, task.loader(), task.item_losses, accum_steps=2, device="tpu")
    with pytest.raises(ValueError, match="item_losses must return losses attached to the autograd graph"):
        fn(model, opt, task.loader(), lambda m, b: task.item_losses(m, b).detach(), accum_steps=2)


def test_loops_accept_device_auto():
    import accumlib
    from accumlib import get_task

    task = get_task("mlp-digits")
    runs = []
    for device in (None, "auto"):  # "auto" is the CPU here (CUDA when present)
        model = task.make_model(0)
        runs.append(
            accumlib.normalized(
                model,
                torch.optim.SGD(model.parameters(), lr=0.1),
                task.loader(),
                task.item_losses,
                accum_steps=2,
                device=device,
            )
        )
    assert runs[0] == runs[1] and len(runs[0]) == 7  # 14 micro-batches of 8 (the last 6), windows of 2

"""Lesson 10's plain loops (accumlib_course/examples/plain/): copyable PyTorch, graded by accumlib.verify.

Each loop must get OK with no finding on its built-in task, and a twin made by one edit of its source
(the mistake a user makes when copying it) must get the finding that names that edit: a test that
cannot fail proves nothing. The DDP loop runs on 2 real gloo ranks under ``verify(..., ranks="all")``.
No file may import anything but torch: they are meant to be pasted into a project without accumlib.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import multiprocessing
import types
from pathlib import Path

import _docs
import pytest
import torch

import accumlib
from accumlib.distributed import launch
from accumlib_course.examples.plain import amp, ddp, fixed_size, tokens

PLAIN = Path(fixed_size.__file__).parent  # accumlib_course/examples/plain/
LAUNCH_TIMEOUT_S = 240  # 2 verify runs per rank on a loaded 2-core machine; one run takes 5-20 s
MAX_NORM = 0.1  # small enough that clipping acts on the digits MLP's window gradients (|g| ~ 0.3-1)

# (module, task, extra arguments, the one edit (old, new), the codes verify must give the twin)
CASES = {
    # divided by k instead of N: each micro-batch's summed loss counts 8 samples as 1
    "fixed_size": (
        fixed_size,
        "mlp-digits",
        {},
        ("(loss_sum / n).backward()", "(loss_sum / len(window)).backward()"),
        {"misscaled"},
    ),
    # each micro-batch's mean divided by k: tokens weigh by the length of their micro-batch
    "tokens": (
        tokens,
        "lm-tokens",
        {},
        (
            "(loss_sum / n).backward()",
            "(loss_sum / int((labels != IGNORE_INDEX).sum()) / len(window)).backward()",
        ),
        {"mean-of-means"},
    ),
    # no unscale_: the clip compares S * |g| with max_norm and clips nearly everything
    "amp": (
        amp,
        "mlp-digits",
        {"max_norm": MAX_NORM},
        ("    scaler.unscale_(optimizer)", "    pass  # scaler.unscale_(optimizer)"),
        {"clip-before-unscale"},
    ),
}


def _twin(module: types.ModuleType, old: str, new: str) -> types.ModuleType:
    """The module with one edit of its source (the edit must occur exactly once)."""
    src = inspect.getsource(module)
    assert src.count(old) == 1, f"{module.__name__}: the edit {old!r} must match one place"
    twin = types.ModuleType(module.__name__ + "_twin")
    exec(compile(src.replace(old, new), module.__file__, "exec"), twin.__dict__)
    return twin


def _verify(module: types.ModuleType, task_name: str, **extra):
    task = accumlib.get_task(task_name)
    train = functools.partial(module.train, accum_steps=task.accum_steps, **extra)
    return accumlib.verify(
        train,
        model=task.make_model(0),
        dataset=task.make_dataset(),
        item_losses=task.item_losses,
        accum_steps=task.accum_steps,
        batch_size=task.batch_size,
        collate_fn=task.collate_fn,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plain_loop_is_ok_under_verify(name):
    module, task, extra, _, _ = CASES[name]
    report = _verify(module, task, **extra)
    assert report.ok and not report.codes, str(report)
    assert report.steps and len(report.steps) == 4  # three full windows and the tail (mlp) / four (lm)


@pytest.mark.parametrize("name", sorted(CASES))
def test_its_twin_with_one_edit_is_named(name):
    module, task, extra, (old, new), codes = CASES[name]
    report = _verify(_twin(module, old, new), task, **extra)
    assert not report.ok and report.codes == codes, str(report)


def test_the_amp_loop_really_clips_and_is_still_ok():
    report = _verify(amp, "mlp-digits", max_norm=MAX_NORM)
    assert report.ok, str(report)
    assert all(s.clip < 1 for s in report.steps), str(report)  # clip: the factor the clip applied
    assert all(s.clip == 1 for s in _verify(amp, "mlp-digits").steps)  # the negative: max_norm 1 is idle


def test_every_plain_loop_imports_torch_alone():
    files = sorted(PLAIN.glob("*.py"))
    assert {f.stem for f in files} == {"__init__", "fixed_size", "tokens", "amp", "ddp"}
    for f in files:
        text = f.read_text()
        assert f.stem == "__init__" or "accumlib" not in text, f"{f.name} names accumlib: not copyable"
        roots = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{f.name}: a relative import"
                roots.add(node.module.split(".")[0])
        assert roots <= {"torch"}, f"{f.name} imports {sorted(roots - {'torch'})}"
        assert f.stem == "__init__" or "torch" in roots, f


def test_the_import_scan_sees_an_accumlib_import():
    tree = ast.parse("import torch\nfrom accumlib import verify\n")
    roots = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert roots == {"accumlib"}  # the negative: the scan above would see this one


# -- DDP on 2 gloo ranks ------------------------------------------------------------------------------

DDP_TWIN = (
    "    dist.all_reduce(n)  #",
    "    pass  # dist.all_reduce(n)  #",
)  # each rank divides by its own N


def _ddp_train(module):
    """verify's protocol under torchrun: the loop wraps verify's copy in DDP and shards the data itself."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def train(model, optimizer, loader):
        sampler = DistributedSampler(loader.dataset, shuffle=False)
        shard = DataLoader(
            loader.dataset, batch_size=loader.batch_size, sampler=sampler, collate_fn=loader.collate_fn
        )
        return module.train(DistributedDataParallel(model), optimizer, shard, accum_steps=4)

    return train


def _ranks(rank, world, out):
    task = accumlib.get_task("lm-tokens")
    results = {}
    for name, module in (("correct", ddp), ("twin", _twin(ddp, *DDP_TWIN))):
        report = accumlib.verify(
            _ddp_train(module),
            model=task.make_model(0),
            dataset=task.make_dataset(),
            item_losses=task.item_losses,
            accum_steps=task.accum_steps,
            batch_size=task.batch_size,
            collate_fn=task.collate_fn,
            ranks="all",
        )
        results[name] = dict(ok=report.ok, codes=sorted(report.codes), text=str(report))
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(results, fh)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain_ddp")
    torch.set_num_threads(1)
    launch(_ranks, (str(out),), world_size=2, timeout=LAUNCH_TIMEOUT_S)
    assert not multiprocessing.active_children()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_the_plain_ddp_loop_is_ok_on_two_ranks(ranks):
    for r in ranks:
        assert r["correct"]["ok"] and r["correct"]["codes"] == [], r["correct"]["text"]
    assert ranks[0]["correct"]["text"] == ranks[1]["correct"]["text"]


def test_the_plain_ddp_loop_without_the_global_count_is_named(ranks):
    for r in ranks:
        assert not r["twin"]["ok"] and r["twin"]["codes"] == ["per-rank-mean"], r["twin"]["text"]


def test_the_readme_shows_each_plain_loop_as_its_file_verbatim():
    """The README's copyable loops are the files the tests above grade, byte for byte."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = _docs.text()
    section = readme[readme.index("## Loops to copy: plain PyTorch") :]
    section = section[: section.index("\n## ")]  # up to the next section (now `accumlib run`'s)
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    files = [
        root / "accumlib_course/examples/plain" / f"{n}.py" for n in ("fixed_size", "tokens", "amp", "ddp")
    ]
    assert blocks == [f.read_text() for f in files]

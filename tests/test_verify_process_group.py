"""verify inside a process group of world size > 1 is refused by name, before anything runs.

Measured before (2 gloo ranks): every rank's oracle saw only its own items, so a correct DDP loop got
NOT OK and a loop whose ranks never synchronize got OK. Until the whole job can be judged, no rank
may get a verdict. Real torch.distributed processes: 2 gloo ranks on 127.0.0.1, bounded in time.
"""

from __future__ import annotations

import multiprocessing

import accumlib
from accumlib.distributed import launch

SPAWN_TIMEOUT_S = 120  # two fresh interpreters importing torch on a loaded 2-core machine


def _verify_on_each_rank(rank, world_size):
    task = accumlib.get_task("mlp-digits")
    ran = []
    try:
        accumlib.verify(
            lambda *a: ran.append(1),
            model=task.make_model(0),
            dataset=task.make_dataset(),
            item_losses=task.item_losses,
            accum_steps=4,
            batch_size=8,
        )
    except ValueError as err:
        assert "judges one process's run" in str(err) and f"world size {world_size} (rank {rank})" in str(
            err
        ), str(err)
        assert not ran  # refused before the loop ran
        return
    raise AssertionError(f"rank {rank}: verify ran inside a process group of world size {world_size}")


def test_verify_in_a_process_group_is_refused_on_every_rank():
    launch(_verify_on_each_rank, world_size=2, timeout=SPAWN_TIMEOUT_S)
    assert not multiprocessing.active_children()


def test_a_single_process_is_not_refused():
    task = accumlib.get_task("mlp-digits")
    report = accumlib.verify(
        lambda m, o, dl: None,
        model=task.make_model(0),
        dataset=task.make_dataset(),
        item_losses=task.item_losses,
        accum_steps=4,
        batch_size=8,
    )
    assert report.codes == {"tail-dropped"}  # judged: nothing stepped, every item left out

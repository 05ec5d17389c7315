"""nanoGPT's train.py, vendored unmodified (tests/scripts/nanogpt/), runs tiny on the CPU from flags alone.

The vendored files are upstream's bytes below a header that records them (sha256 and git blob id); the
tiny config trains 7 iterations in one process and on 2 gloo ranks under torchrun (a copy with only the
DDP branch's CUDA lines changed), and the copies change exactly the lines they claim.
"""

from __future__ import annotations

import difflib
import hashlib
import re

import pytest
from _nanogpt import (
    DDP_CPU_EDITS,
    ITER_LINE,
    SCALE_LINE,
    SCRIPT_DIR,
    VENDORED,
    broken_copy,
    command,
    ddp_copy,
    make_workdir,
    run,
    split_vendored,
    torchrun_command,
)

ITERS = list(range(7))  # iterations 0..max_iters: train.py breaks once iter_num > max_iters (6)


def _recorded(header: str, field: str) -> str:
    return re.search(rf"^# {field}: ([0-9a-f]+)$", header, re.M).group(1)


@pytest.mark.parametrize("name", VENDORED)
def test_a_vendored_file_is_upstreams_bytes_below_its_header(name):
    header, body = split_vendored(SCRIPT_DIR / name)
    assert hashlib.sha256(body).hexdigest() == _recorded(header, r"sha256 of the upstream file \(.*?\)")
    # git's id of the same bytes, as upstream's tree lists it: the body is the file at that commit
    assert hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest() == _recorded(header, "Upstream git blob")
    assert _recorded(header, "Upstream commit") == "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"
    assert all(line.startswith("#") for line in header.splitlines())  # a comment: the code is upstream's
    assert "MIT License, Copyright (c) 2022 Andrej Karpathy" in header
    license_text = "\n".join(
        ("# " + line).rstrip() for line in (SCRIPT_DIR / "LICENSE").read_text().splitlines()
    )
    assert license_text in header
    # the negative: one changed byte below the header no longer matches
    assert hashlib.sha256(bytes([body[0] ^ 1]) + body[1:]).hexdigest() not in header


def _losses(stdout: str) -> dict[int, float]:
    return {int(i): float(loss) for i, loss in ITER_LINE.findall(stdout)}


def test_the_tiny_run_trains_seven_iterations_on_the_cpu_and_writes_no_checkpoint(tmp_path):
    work = make_workdir(tmp_path)
    p = run(command(), cwd=work, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "found vocab_size = 65" in p.stdout and "step 0: train loss" in p.stdout
    losses = _losses(p.stdout)
    assert sorted(losses) == ITERS
    assert all(3.5 < v < 5.0 for v in losses.values()), losses  # about ln 65 = 4.17 on random tokens
    assert sorted(q.name for q in (work / "out-tiny").iterdir()) == []  # no ckpt.pt


def test_the_loss_left_undivided_shows_as_a_loss_times_the_accumulation_steps(tmp_path):
    train = broken_copy(tmp_path, SCALE_LINE, "")
    p = run(command(train=train), cwd=make_workdir(tmp_path / "work"), timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    losses = _losses(p.stdout)
    # train.py prints loss.item() * gradient_accumulation_steps: the undivided loss comes out 4 times too big
    assert sorted(losses) == ITERS and all(4 * 3.5 < v < 4 * 5.0 for v in losses.values()), losses


def test_two_gloo_ranks_under_torchrun_train_the_same_seven_iterations(tmp_path):
    work = make_workdir(tmp_path / "work")
    p = run(torchrun_command(train=ddp_copy(tmp_path)), cwd=work, timeout=120)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    assert p.stdout.count("Overriding: backend = gloo") == 2  # both ranks read the flag
    assert p.stdout.count("tokens per iteration will be: 256") == 2  # 4 // 2 micro-batches per rank
    losses = _losses(p.stdout)  # printed by rank 0 only
    assert sorted(losses) == ITERS and all(3.5 < v < 5.0 for v in losses.values()), losses


def _changes(train) -> list[tuple[str, str]]:
    """(removed, added) line pairs between the vendored train.py and ``train``."""
    old = (SCRIPT_DIR / "train.py").read_text().splitlines()
    new = train.read_text().splitlines()
    assert len(new) == len(old)  # line for line: line numbers stay upstream's
    diff = list(difflib.ndiff(old, new))
    removed, added = ([d for d in diff if d.startswith(sign)] for sign in ("- ", "+ "))
    assert len(removed) == len(added)
    return list(zip(removed, added))


def test_the_copies_change_exactly_the_lines_they_claim(tmp_path):
    broken = _changes(broken_copy(tmp_path, SCALE_LINE, ""))
    assert broken == [("-             " + SCALE_LINE, "+ ")]
    ddp = _changes(ddp_copy(tmp_path))
    assert [(a[2:].strip(), b[2:].strip()) for a, b in ddp] == list(DDP_CPU_EDITS.items())
    assert all(a[:2] == "- " and b[:2] == "+ " for a, b in ddp)
    assert all(a[2:6] == b[2:6] == "    " for a, b in ddp)  # the DDP branch's indentation kept
    for name in ("model.py", "configurator.py", "config_tiny.py", "LICENSE"):
        assert (tmp_path / "nanogpt_ddp_cpu" / name).read_bytes() == (SCRIPT_DIR / name).read_bytes()
    with pytest.raises(AssertionError, match="occurs 0 times"):
        broken_copy(tmp_path, "no such line", "", name="none")
    with pytest.raises(AssertionError, match="occurs 2 times"):  # init from a checkpoint or from GPT-2
        line = "for k in ['n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'vocab_size']:"
        broken_copy(tmp_path, line, "", name="twice")

"""Andrej Karpathy's nanoGPT training script, run unmodified and tiny on the CPU, read from a clone.

nanoGPT's files are not in this repository: ``train.py``, ``model.py`` and ``configurator.py`` are pinned here
by upstream repository, path, commit and the sha256 of their bytes (``UPSTREAM``), and read at test time from
a clone you point at (``ACCUMLIB_NANOGPT_SRC``: a clone of https://github.com/karpathy/nanoGPT, work tree or
bare git directory), as tests/_hf_scripts.py does for Accelerate's examples. ``script_dir(tmp_path)`` copies
the pinned bytes out of it (no header, nothing changed), checks each sha256, puts our ``config_tiny.py``
beside them and returns the folder; where the variable is unset it skips the calling test (``SKIP_REASON``).

nanoGPT's ``train.py`` reads everything relative to the current directory: ``exec(open('configurator.py')
.read())``, its data in ``data/<dataset>/`` and its ``out_dir``. So a run starts with ``cwd=make_workdir(
tmp_path, scripts)``: a folder with ``configurator.py`` (copied from ``scripts``) and ``data/tiny/``
(``train.bin`` and ``val.bin``, np.uint16 token ids below 65, and ``meta.pkl`` with ``vocab_size`` 65,
which train.py reads to size the model). ``model.py`` is imported from the script's own folder
(``sys.path[0]``).

The configuration is flags only: ``config_tiny.py`` (a config file train.py's configurator exec()s) and
``--key=value`` arguments. Two copies change lines, each starting from the pinned upstream copy:
``broken_copy`` one line (a known bug put back, e.g. the loss not divided by the accumulation steps) and
``ddp_copy`` the three lines of the DDP branch that hard-code CUDA, so that torchrun can run it on the CPU
with gloo. ``run_under_accumlib`` runs a train.py under ``python -m accumlib run``.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import _upstream
import numpy as np
import pytest
from _procs import free_port, run_bounded
from _upstream import sha256

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "scripts" / "nanogpt" / "config_tiny.py"  # accumlib's own file, committed

NANOGPT_URL = "https://github.com/karpathy/nanoGPT"
NANOGPT_COMMIT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"  # master of 2025-11-12
UPSTREAM = {
    "train.py": {
        "repo": NANOGPT_URL,
        "path": "train.py",
        "commit": NANOGPT_COMMIT,
        "sha256": "413bd97b40bb400a2a0d01230e2946f056c263ebac1b7281c2367d964a123085",
    },
    "model.py": {
        "repo": NANOGPT_URL,
        "path": "model.py",
        "commit": NANOGPT_COMMIT,
        "sha256": "7c01703240dbec5d554527dc666e35b3df8391d0b117fddc07afcf325a21d11c",
    },
    "configurator.py": {
        "repo": NANOGPT_URL,
        "path": "configurator.py",
        "commit": NANOGPT_COMMIT,
        "sha256": "5cc23aca26b4ab3c0d9e5f82740f4781f9444f42718c15abcee70d93c5aabe8f",
    },
}
SOURCE_ENV = "ACCUMLIB_NANOGPT_SRC"
SKIP_REASON = (
    f"set {SOURCE_ENV} to a clone of karpathy/nanoGPT at {NANOGPT_COMMIT[:7]} to run nanoGPT's own train.py"
)

VOCAB = 65
TRAIN_TOKENS = 4096
VAL_TOKENS = 512
SEED = 0

# train.py's loss scaling in its micro-step loop, as upstream writes it (after 12 spaces of indentation)
SCALE_LINE = "loss = loss / gradient_accumulation_steps # scale the loss to account for gradient accumulation"
# train.py's reset of the gradients after each optimizer step (after 4 spaces)
ZERO_GRAD_LINE = "optimizer.zero_grad(set_to_none=True)"
# the DDP branch's lines that hard-code CUDA, and what ddp_copy writes instead (indentation kept)
DDP_CPU_EDITS = {
    "device = f'cuda:{ddp_local_rank}'": "device = 'cpu'",
    "torch.cuda.set_device(device)": "# torch.cuda.set_device(device): no CUDA device (accumlib's ddp_copy)",
    "model = DDP(model, device_ids=[ddp_local_rank])": "model = DDP(model)",
}
# where each line the copies change stands in the pinned train.py: (line number, indentation in spaces)
UPSTREAM_LINES = {
    "device = f'cuda:{ddp_local_rank}'": (88, 4),
    "torch.cuda.set_device(device)": (89, 4),
    "model = DDP(model, device_ids=[ddp_local_rank])": (212, 4),
    SCALE_LINE: (301, 12),
    ZERO_GRAD_LINE: (314, 4),
}
# what train.py prints once per iteration on the master process (log_interval = 1)
ITER_LINE = re.compile(r"^iter (\d+): loss (\d+\.\d+), time ", re.M)


# ---------------------------------------------------------------- the pinned files


def source() -> Path | None:
    """The nanoGPT clone named by ``ACCUMLIB_NANOGPT_SRC``; None where the variable is unset or empty.
    A value naming nothing is an error (FileNotFoundError), not a skip: a mistyped path should not pass."""
    return _upstream.source(SOURCE_ENV, clone_of=NANOGPT_URL)


def upstream_bytes(name: str, src: Path) -> bytes:
    """The pinned file ``name`` at its commit, read from the clone ``src`` (work tree or git directory)."""
    return _upstream.upstream_bytes(UPSTREAM, name, src)


def script_dir(tmp_path: Path, src: Path | None = None, *, name: str = "nanogpt") -> Path:
    """Copy the pinned train.py, model.py and configurator.py (upstream's exact bytes) out of the clone
    ``src`` (default: ``ACCUMLIB_NANOGPT_SRC``'s) into ``tmp_path/name``, with our ``config_tiny.py`` beside
    them, and return the folder. Skips the calling test with ``SKIP_REASON`` where no clone is named; a file
    whose sha256 is not the pinned one is a ValueError naming the file, the pinned sha256 and the one read."""
    src = src or source()
    if src is None:
        pytest.skip(SKIP_REASON)
    folder = Path(tmp_path) / name
    folder.mkdir(parents=True, exist_ok=True)
    for file, pin in UPSTREAM.items():
        data = upstream_bytes(file, src)
        if sha256(data) != pin["sha256"]:
            raise ValueError(
                f"{file}: sha256 of {pin['path']} at {pin['commit'][:7]} in {src} is {sha256(data)}, "
                f"expected the pinned {pin['sha256']}"
            )
        (folder / file).write_bytes(data)
    shutil.copyfile(CONFIG, folder / CONFIG.name)
    return folder


def config_for(train: Path) -> Path:
    """The tiny config a run of ``train`` reads: the ``config_tiny.py`` beside it (``script_dir`` and the
    copies put one there), else the committed one."""
    beside = Path(train).parent / CONFIG.name
    return beside if beside.is_file() else CONFIG


# ---------------------------------------------------------------- the work folder and command lines


def make_workdir(tmp_path: Path, scripts: Path) -> Path:
    """Write ``configurator.py`` (from the folder ``scripts``, a ``script_dir``) and ``data/tiny/`` (random
    token ids from a fixed seed) in ``tmp_path``, and return it: the folder to run train.py in."""
    tmp_path = Path(tmp_path)
    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    rng.integers(0, VOCAB, TRAIN_TOKENS, dtype=np.uint16).tofile(data / "train.bin")
    rng.integers(0, VOCAB, VAL_TOKENS, dtype=np.uint16).tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": VOCAB}, f)
    shutil.copyfile(Path(scripts) / "configurator.py", tmp_path / "configurator.py")
    return tmp_path


def command(train: Path, extra_args: Sequence[str] = ()) -> list[str]:
    """The argv after the interpreter: ``train`` (a train.py: ``script_dir(...) / "train.py"`` or a copy's),
    its tiny config (``config_for``), then ``extra_args`` (``--key=value`` overrides)."""
    return [str(train), str(config_for(train)), *extra_args]


def torchrun_command(
    extra_args: Sequence[str] = (), *, train: Path, nproc: int = 2, port: int | None = None
) -> list[str]:
    """The argv after the interpreter for ``nproc`` ranks under torchrun on 127.0.0.1 with gloo."""
    return [*_torchrun_head(nproc, port), *command(train, ["--backend=gloo", *extra_args])]


def torchrun_under_accumlib_command(
    extra_args: Sequence[str] = (),
    *,
    train: Path,
    accumlib_args: Sequence[str] = (),
    nproc: int = 2,
    port: int | None = None,
) -> list[str]:
    """The argv after the interpreter for ``nproc`` gloo ranks under torchrun, each running
    ``python -m accumlib run *accumlib_args -- train config --backend=gloo *extra_args``."""
    head = [*_torchrun_head(nproc, port), "-m", "accumlib", "run", *accumlib_args, "--"]
    return [*head, *command(train, ["--backend=gloo", *extra_args])]


def _torchrun_head(nproc: int, port: int | None) -> list[str]:
    rdzv = ["--master-addr", "127.0.0.1", "--master-port", str(port or free_port())]
    return ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *rdzv]


def run(
    args: Sequence[str], *, cwd: Path, timeout: float = 60, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python *args`` in ``cwd``, one intra-op thread, in its own process group: on ``timeout`` the whole
    group (torchrun's ranks too) is killed and ``subprocess.TimeoutExpired`` raised. Where the environment
    turns bytecode caching off, the Makefile's cache (.venv/pycache) is read, as tools/mutate.py does: else
    every run compiles torch's sources again (about 8 s a process on 2 cores)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    if (ROOT / ".venv" / "pycache").is_dir():
        env.setdefault("PYTHONPYCACHEPREFIX", str(ROOT / ".venv" / "pycache"))
    return run_bounded([sys.executable, *args], timeout=timeout, cwd=cwd, env=env)


def run_under_accumlib(
    workdir: Path,
    train_py: Path,
    extra_args: Sequence[str] = (),
    accumlib_args: Sequence[str] = (),
    *,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m accumlib run *accumlib_args -- train_py config_tiny *extra_args`` in ``workdir``, bounded
    and killed with its process group past ``timeout`` as ``run`` does. accumlib run's exit status: 0 ok,
    1 a bug, 2 usage, 3 the script raised, 4 cannot judge; ``--json FILE`` (relative to ``workdir``) writes
    the report as JSON."""
    args = ["-m", "accumlib", "run", *accumlib_args, "--", *command(train_py, extra_args)]
    return run(args, cwd=workdir, timeout=timeout, env=env)


# ---------------------------------------------------------------- copies with lines changed


def _copy_with(scripts: Path, tmp_path: Path, name: str, edits: Mapping[str, str]) -> Path:
    """Copy the folder ``scripts`` (a ``script_dir``: its train.py must be the pinned upstream bytes) to
    ``tmp_path/name`` with train.py's lines whose text (indentation aside) is a key of ``edits`` replaced,
    each found exactly once and keeping its indentation; an empty replacement leaves an empty line (line
    numbers stay upstream's). Returns the copy's train.py."""
    scripts = Path(scripts)
    got = sha256((scripts / "train.py").read_bytes())
    if got != UPSTREAM["train.py"]["sha256"]:
        raise ValueError(f"{scripts / 'train.py'} is not the pinned train.py: sha256 {got}")
    folder = Path(tmp_path) / name
    shutil.copytree(scripts, folder, ignore=shutil.ignore_patterns("__pycache__"))
    train = folder / "train.py"
    lines = train.read_text().splitlines(keepends=True)
    for old, new in edits.items():
        at = [i for i, line in enumerate(lines) if line.strip() == old.strip()]
        assert len(at) == 1, f"{old!r} occurs {len(at)} times in train.py, not once"
        line = lines[at[0]]
        indent = line[: len(line) - len(line.lstrip())]
        lines[at[0]] = f"{indent}{new.strip()}\n" if new.strip() else "\n"
    train.write_text("".join(lines))
    return train


def broken_copy(
    scripts: Path, tmp_path: Path, old_line: str, new_line: str, *, name: str = "nanogpt_broken"
) -> Path:
    """Copy the pinned folder ``scripts`` to ``tmp_path/name`` with the one train.py line ``old_line``
    (indentation aside; it must occur exactly once) replaced by ``new_line``; return the copy's train.py."""
    return _copy_with(scripts, tmp_path, name, {old_line: new_line})


def ddp_copy(scripts: Path, tmp_path: Path) -> Path:
    """Copy the pinned folder ``scripts`` to ``tmp_path/nanogpt_ddp_cpu`` with only the DDP branch's CUDA
    lines changed (``DDP_CPU_EDITS``: device 'cpu', no set_device, DDP without device_ids); run it under
    torchrun with ``--backend=gloo`` (``torchrun_command``). Returns the copy's train.py."""
    return _copy_with(scripts, tmp_path, "nanogpt_ddp_cpu", DDP_CPU_EDITS)

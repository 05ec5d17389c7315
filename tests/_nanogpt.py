"""Andrej Karpathy's nanoGPT training script, vendored unmodified in ``tests/scripts/nanogpt/``, run tiny.

nanoGPT's ``train.py`` reads everything relative to the current directory: ``exec(open('configurator.py')
.read())``, its data in ``data/<dataset>/`` and its ``out_dir``. So a run starts with ``cwd=make_workdir(
tmp_path)``: a folder with ``configurator.py`` (copied from the vendored folder) and ``data/tiny/``
(``train.bin`` and ``val.bin``, np.uint16 token ids below 65, and ``meta.pkl`` with ``vocab_size`` 65,
which train.py reads to size the model). ``model.py`` is imported from the script's own folder
(``sys.path[0]``).

The configuration is flags only: ``config_tiny.py`` (a config file train.py's configurator exec()s) and
``--key=value`` arguments. Two copies change lines, never the vendored files: ``broken_copy`` one line (a
known bug put back, e.g. the loss not divided by the accumulation steps) and ``ddp_copy`` the three lines
of the DDP branch that hard-code CUDA, so that torchrun can run it on the CPU with gloo.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_DIR = ROOT / "tests" / "scripts" / "nanogpt"
CONFIG = SCRIPT_DIR / "config_tiny.py"
VENDORED = ("train.py", "model.py", "configurator.py")  # upstream's files, each below a header
HEADER_END = "# Vendored unmodified below this header for accumlib's tests\n"

VOCAB = 65
TRAIN_TOKENS = 4096
VAL_TOKENS = 512
SEED = 0

# train.py's loss scaling in its micro-step loop, as upstream writes it (after 12 spaces of indentation)
SCALE_LINE = "loss = loss / gradient_accumulation_steps # scale the loss to account for gradient accumulation"
# the DDP branch's lines that hard-code CUDA, and what ddp_copy writes instead (indentation kept)
DDP_CPU_EDITS = {
    "device = f'cuda:{ddp_local_rank}'": "device = 'cpu'",
    "torch.cuda.set_device(device)": "# torch.cuda.set_device(device): no CUDA device (accumlib's ddp_copy)",
    "model = DDP(model, device_ids=[ddp_local_rank])": "model = DDP(model)",
}
# what train.py prints once per iteration on the master process (log_interval = 1)
ITER_LINE = re.compile(r"^iter (\d+): loss (\d+\.\d+), time ", re.M)


def make_workdir(tmp_path: Path) -> Path:
    """Write ``configurator.py`` and ``data/tiny/`` (random token ids from a fixed seed) in ``tmp_path``,
    and return it: the folder to run train.py in."""
    tmp_path = Path(tmp_path)
    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    rng.integers(0, VOCAB, TRAIN_TOKENS, dtype=np.uint16).tofile(data / "train.bin")
    rng.integers(0, VOCAB, VAL_TOKENS, dtype=np.uint16).tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": VOCAB}, f)
    shutil.copyfile(SCRIPT_DIR / "configurator.py", tmp_path / "configurator.py")
    return tmp_path


def command(extra_args: Sequence[str] = (), *, train: Path | None = None) -> list[str]:
    """The argv after the interpreter: train.py (the vendored one unless ``train``), the tiny config, then
    ``extra_args`` (``--key=value`` overrides)."""
    return [str(train or SCRIPT_DIR / "train.py"), str(CONFIG), *extra_args]


def torchrun_command(
    extra_args: Sequence[str] = (), *, train: Path, nproc: int = 2, port: int | None = None
) -> list[str]:
    """The argv after the interpreter for ``nproc`` ranks under torchrun on 127.0.0.1 with gloo."""
    rdzv = ["--master-addr", "127.0.0.1", "--master-port", str(port or free_port())]
    head = ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *rdzv]
    return [*head, *command(["--backend=gloo", *extra_args], train=train)]


def free_port() -> int:
    """A TCP port nothing listens on now on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        if proc.poll() is None:  # interrupted some other way: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def split_vendored(path: Path) -> tuple[str, bytes]:
    """A vendored file's header (text, up to and with its last line) and the upstream bytes below it."""
    data = Path(path).read_bytes()
    end = data.index(HEADER_END.encode()) + len(HEADER_END)
    return data[:end].decode(), data[end:]


def _copy_with(tmp_path: Path, name: str, edits: Mapping[str, str]) -> Path:
    """Copy the vendored folder to ``tmp_path/name`` with train.py's lines whose text (indentation aside)
    is a key of ``edits`` replaced, each found exactly once and keeping its indentation; an empty
    replacement leaves an empty line (line numbers stay upstream's). Returns the copy's train.py."""
    folder = Path(tmp_path) / name
    shutil.copytree(SCRIPT_DIR, folder, ignore=shutil.ignore_patterns("__pycache__"))
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


def broken_copy(tmp_path: Path, old_line: str, new_line: str, *, name: str = "nanogpt_broken") -> Path:
    """Copy the vendored folder to ``tmp_path/name`` with the one train.py line ``old_line`` (indentation
    aside; it must occur exactly once) replaced by ``new_line``; return the copy's train.py."""
    return _copy_with(tmp_path, name, {old_line: new_line})


def ddp_copy(tmp_path: Path) -> Path:
    """Copy the vendored folder to ``tmp_path/nanogpt_ddp_cpu`` with only the DDP branch's CUDA lines
    changed (``DDP_CPU_EDITS``: device 'cpu', no set_device, DDP without device_ids); run it under torchrun
    with ``--backend=gloo`` (``torchrun_command``). Returns the copy's train.py."""
    return _copy_with(tmp_path, "nanogpt_ddp_cpu", DDP_CPU_EDITS)

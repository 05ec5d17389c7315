"""nanoGPT's own train.py, pinned by commit and sha256 and read from a clone, runs tiny on the CPU from flags.

tests/_nanogpt.py pins train.py, model.py and configurator.py of karpathy/nanoGPT and copies them, checked,
out of the clone named by ``ACCUMLIB_NANOGPT_SRC`` (work tree or bare git directory); the tests that run them
skip without it. Those tests: the copied files are upstream's bytes, the tiny config trains 7 iterations in
one process and on 2 gloo ranks under torchrun (a copy with only the DDP branch's CUDA lines changed), and
the copies change exactly the lines they claim. The tests that need no clone check the machinery on a
stand-in upstream (a git repository made here, its files placed as the pins say upstream's are): the copy
is byte for byte, a hash or commit that does not match is an error, no clone is a skip that says why.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import subprocess

import _nanogpt as ng
import pytest
from _nanogpt import (
    CONFIG,
    DDP_CPU_EDITS,
    ITER_LINE,
    NANOGPT_COMMIT,
    SCALE_LINE,
    SKIP_REASON,
    SOURCE_ENV,
    UPSTREAM,
    UPSTREAM_LINES,
    ZERO_GRAD_LINE,
    broken_copy,
    command,
    ddp_copy,
    make_workdir,
    run,
    script_dir,
    torchrun_command,
)

ITERS = list(range(7))  # iterations 0..max_iters: train.py breaks once iter_num > max_iters (6)
TWICE = "for k in ['n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'vocab_size']:"  # resume, GPT-2
needs_source = pytest.mark.skipif(ng.source() is None, reason=SKIP_REASON)


def _git(*args: str, cwd=None) -> str:
    config = [
        "-c",
        "user.name=accumlib",
        "-c",
        "user.email=accumlib@example.invalid",
        "-c",
        "init.defaultBranch=x",
    ]
    return subprocess.run(["git", *config, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


# ---------------------------------------------------------------- no clone needed


def test_the_pins_name_one_commit_and_the_lines_the_copies_change_once_each():
    assert sorted(UPSTREAM) == ["configurator.py", "model.py", "train.py"]
    for name, pin in UPSTREAM.items():
        assert pin["repo"] == "https://github.com/karpathy/nanoGPT" and pin["path"] == name
        assert pin["commit"] == NANOGPT_COMMIT and re.fullmatch("[0-9a-f]{40}", pin["commit"])
        assert re.fullmatch("[0-9a-f]{64}", pin["sha256"])
    assert len({pin["sha256"] for pin in UPSTREAM.values()}) == 3
    # every line a copy changes has its stated place in the pinned train.py, and no two share one
    assert set(UPSTREAM_LINES) == {SCALE_LINE, ZERO_GRAD_LINE, *DDP_CPU_EDITS}
    assert len({at for at, _ in UPSTREAM_LINES.values()}) == len(UPSTREAM_LINES)
    assert all(line == line.strip() for line in UPSTREAM_LINES)  # stated without indentation
    assert SKIP_REASON == (
        "set ACCUMLIB_NANOGPT_SRC to a clone of karpathy/nanoGPT at 3adf61e to run nanoGPT's own train.py"
    )


def test_without_a_clone_script_dir_skips_saying_why_and_a_wrong_path_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    assert ng.source() is None
    with pytest.raises(pytest.skip.Exception) as skipped:
        script_dir(tmp_path)
    assert skipped.value.msg == SKIP_REASON
    assert list(tmp_path.iterdir()) == []  # nothing copied
    monkeypatch.setenv(SOURCE_ENV, str(tmp_path / "no-such-clone"))
    with pytest.raises(FileNotFoundError, match="ACCUMLIB_NANOGPT_SRC=.*no-such-clone names nothing"):
        script_dir(tmp_path)


def _stand_in_train_py() -> str:
    """A train.py with each line the copies change at its stated place (``UPSTREAM_LINES``), the line the
    checkpoint and GPT-2 branches both hold twice, and filler elsewhere."""
    at = {n: " " * indent + line for line, (n, indent) in UPSTREAM_LINES.items()}
    at |= {166: "    " + TWICE, 187: "    " + TWICE}
    return "".join(at.get(n, f"x_{n} = {n}") + "\n" for n in range(1, max(at) + 20))


@pytest.fixture(params=["work tree", "bare git directory"])
def stand_in(request, tmp_path, monkeypatch):
    """A git repository holding stand-in train.py, model.py, configurator.py; ``UPSTREAM`` pinned to its
    commit and their sha256, ``ACCUMLIB_NANOGPT_SRC`` naming it (a work tree or a bare clone of it)."""
    repo = tmp_path / "stand_in"
    repo.mkdir()
    files = {
        "train.py": _stand_in_train_py().encode(),
        "model.py": b"# stand-in model.py\n",
        "configurator.py": b"# stand-in configurator.py\r\n\xff no text decoding: bytes\n",
    }
    for name, data in files.items():
        (repo / name).write_bytes(data)
    _git("init", "-q", cwd=repo)
    _git("add", *files, cwd=repo)
    _git("commit", "-q", "-m", "stand-in", cwd=repo)
    commit = _git("rev-parse", "HEAD", cwd=repo).strip()
    (repo / "train.py").write_text("# a later edit in the work tree: not the pinned commit's bytes\n")
    src = repo
    if request.param == "bare git directory":
        src = tmp_path / "stand_in.git"
        _git("clone", "-q", "--bare", str(repo), str(src))
    for name, data in files.items():
        pin = {**UPSTREAM[name], "commit": commit, "sha256": hashlib.sha256(data).hexdigest()}
        monkeypatch.setitem(UPSTREAM, name, pin)
    monkeypatch.setenv(SOURCE_ENV, str(src))
    return files


def test_script_dir_copies_the_pinned_commits_bytes_and_the_tiny_config(stand_in, tmp_path):
    folder = script_dir(tmp_path / "out")
    assert folder == tmp_path / "out" / "nanogpt"
    assert sorted(p.name for p in folder.iterdir()) == sorted([*stand_in, "config_tiny.py"])
    for name, data in stand_in.items():
        assert (folder / name).read_bytes() == data  # the commit's, not the work tree's later edit
    assert (folder / "config_tiny.py").read_bytes() == CONFIG.read_bytes()


def test_a_file_not_matching_its_pin_is_an_error_naming_it_the_pinned_and_the_read_sha256(
    stand_in, tmp_path, monkeypatch
):
    got = UPSTREAM["model.py"]["sha256"]
    monkeypatch.setitem(UPSTREAM, "model.py", {**UPSTREAM["model.py"], "sha256": "0" * 64})
    with pytest.raises(ValueError, match=rf"^model\.py: sha256 .* is {got}, expected the pinned {'0' * 64}$"):
        script_dir(tmp_path / "out")
    monkeypatch.setitem(UPSTREAM, "model.py", {**UPSTREAM["model.py"], "commit": "f" * 40})
    with pytest.raises(FileNotFoundError, match=f"model.py at {'f' * 40} is not in"):
        script_dir(tmp_path / "out2")


def test_the_copies_start_only_from_the_pinned_train_py(stand_in, tmp_path):
    folder = script_dir(tmp_path)
    (folder / "train.py").write_text((folder / "train.py").read_text().replace("x_1 = 1", "x_1 = 2"))
    with pytest.raises(ValueError, match="is not the pinned train.py"):
        broken_copy(folder, tmp_path, SCALE_LINE, "")
    with pytest.raises(ValueError, match="is not the pinned train.py"):
        ddp_copy(folder, tmp_path)


def _changes(scripts, train) -> list[tuple[str, str]]:
    """(removed, added) line pairs between the pinned train.py in ``scripts`` and ``train``."""
    old = (scripts / "train.py").read_text().splitlines()
    new = train.read_text().splitlines()
    assert len(new) == len(old)  # line for line: line numbers stay upstream's
    diff = list(difflib.ndiff(old, new))
    removed, added = ([d for d in diff if d.startswith(sign)] for sign in ("- ", "+ "))
    assert len(removed) == len(added)
    return list(zip(removed, added))


def check_the_copies(scripts, tmp_path) -> None:
    """broken_copy and ddp_copy of ``scripts`` change exactly the lines they claim, where they stand."""
    train = (scripts / "train.py").read_text().splitlines()
    for line, (n, indent) in UPSTREAM_LINES.items():  # each changed line stands where the pins say
        assert train[n - 1] == " " * indent + line, (n, train[n - 1])
    for old in (SCALE_LINE, ZERO_GRAD_LINE):
        n = UPSTREAM_LINES[old][0]
        copy = broken_copy(scripts, tmp_path, old, "", name=f"without_{n}")
        assert _changes(scripts, copy) == [("- " + " " * UPSTREAM_LINES[old][1] + old, "+ ")]
        assert copy.read_text().splitlines()[n - 1] == ""
    ddp = _changes(scripts, ddp_copy(scripts, tmp_path))
    assert [(a[2:].strip(), b[2:].strip()) for a, b in ddp] == list(DDP_CPU_EDITS.items())
    assert all(a[:2] == "- " and b[:2] == "+ " for a, b in ddp)
    assert all(a[2:6] == b[2:6] == "    " and a[6] != " " for a, b in ddp)  # the DDP branch's indentation
    for name in ("model.py", "configurator.py", "config_tiny.py"):
        assert (tmp_path / "nanogpt_ddp_cpu" / name).read_bytes() == (scripts / name).read_bytes()
    with pytest.raises(AssertionError, match="occurs 0 times"):
        broken_copy(scripts, tmp_path, "no such line", "", name="none")
    with pytest.raises(AssertionError, match="occurs 2 times"):  # init from a checkpoint or from GPT-2
        broken_copy(scripts, tmp_path, TWICE, "", name="twice")


def test_the_copies_of_a_stand_in_change_exactly_the_lines_they_claim(stand_in, tmp_path):
    check_the_copies(script_dir(tmp_path), tmp_path)


# ---------------------------------------------------------------- nanoGPT's own files


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """The pinned nanoGPT files and config_tiny.py, copied out of the clone once for the module."""
    return script_dir(tmp_path_factory.mktemp("nanogpt_pinned"))


@needs_source
def test_the_copied_files_are_upstreams_bytes_at_the_pinned_commit(scripts):
    src = ng.source()
    git_dir = src / ".git" if (src / ".git").exists() else src
    for name, pin in UPSTREAM.items():
        body = (scripts / name).read_bytes()
        assert hashlib.sha256(body).hexdigest() == pin["sha256"]
        # git's id of the same bytes is the blob the commit's tree lists: no header, nothing changed
        blob = subprocess.run(
            ["git", f"--git-dir={git_dir}", "rev-parse", f"{pin['commit']}:{pin['path']}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest() == blob
        assert not body.startswith(b"# Vendored")


@needs_source
def test_the_copies_of_upstreams_train_py_change_exactly_the_lines_they_claim(scripts, tmp_path):
    check_the_copies(scripts, tmp_path)


def _losses(stdout: str) -> dict[int, float]:
    return {int(i): float(loss) for i, loss in ITER_LINE.findall(stdout)}


@needs_source
def test_the_tiny_run_trains_seven_iterations_on_the_cpu_and_writes_no_checkpoint(scripts, tmp_path):
    work = make_workdir(tmp_path, scripts)
    p = run(command(scripts / "train.py"), cwd=work, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "found vocab_size = 65" in p.stdout and "step 0: train loss" in p.stdout
    losses = _losses(p.stdout)
    assert sorted(losses) == ITERS
    assert all(3.5 < v < 5.0 for v in losses.values()), losses  # about ln 65 = 4.17 on random tokens
    assert sorted(q.name for q in (work / "out-tiny").iterdir()) == []  # no ckpt.pt


@needs_source
def test_the_loss_left_undivided_shows_as_a_loss_times_the_accumulation_steps(scripts, tmp_path):
    train = broken_copy(scripts, tmp_path, SCALE_LINE, "")
    p = run(command(train), cwd=make_workdir(tmp_path / "work", scripts), timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    losses = _losses(p.stdout)
    # train.py prints loss.item() * gradient_accumulation_steps: the undivided loss comes out 4 times too big
    assert sorted(losses) == ITERS and all(4 * 3.5 < v < 4 * 5.0 for v in losses.values()), losses


@needs_source
def test_two_gloo_ranks_under_torchrun_train_the_same_seven_iterations(scripts, tmp_path):
    work = make_workdir(tmp_path / "work", scripts)
    p = run(torchrun_command(train=ddp_copy(scripts, tmp_path)), cwd=work, timeout=120)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    assert p.stdout.count("Overriding: backend = gloo") == 2  # both ranks read the flag
    assert p.stdout.count("tokens per iteration will be: 256") == 2  # 4 // 2 micro-batches per rank
    losses = _losses(p.stdout)  # printed by rank 0 only
    assert sorted(losses) == ITERS and all(3.5 < v < 5.0 for v in losses.values()), losses

"""`accumlib verify FILE.py:FUNCTION`: built-in and file-defined tasks, exit codes, JSON; the table mode
stays."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from accumlib.cli import main

LOOPS = textwrap.dedent("""
    import torch
    import torch.nn.functional as F

    from accumlib.data import synthetic_classification
    from accumlib.models import MLP

    def item_losses(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="none")

    def make_model():
        torch.manual_seed(0)
        return MLP(in_features=20, n_classes=4)

    dataset = synthetic_classification(40)  # 8 micro-batches of 5: two full windows of 4
    ACCUM_STEPS = 4

    def naive(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            F.cross_entropy(model(x), y).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()

    def divided(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()

    def broken(model, opt, loader):
        raise RuntimeError("user bug")

    def own_data(model, opt, loader):  # ignores the loader: verify cannot follow what it trains on
        x, y = torch.randn(20, 20), torch.randint(0, 4, (20,))
        for s in range(0, 20, 5):
            (F.cross_entropy(model(x[s:s + 5]), y[s:s + 5], reduction="sum") / 20).backward()
        opt.step()
        opt.zero_grad()
""")


@pytest.fixture
def loops(tmp_path):
    path = tmp_path / "my_loops.py"
    path.write_text(LOOPS)
    return path


def test_file_defined_task(loops, capsys):
    assert main(["verify", f"{loops}:divided", "--batch-size", "5"]) == 0
    assert main(["verify", f"{loops}:naive", "--batch-size", "5"]) == 1
    assert "unscaled-sum" in capsys.readouterr().out


def test_builtin_task_and_json(loops, capsys):
    assert (
        main(
            [
                "verify",
                f"{loops}:divided",
                "--task",
                "mlp-digits",
                "--accum-steps",
                "4",
                "--batch-size",
                "8",
                "--json",
            ]
        )
        == 1
    )
    data = json.loads(capsys.readouterr().out)
    # 110 items: the 2-batch tail is never stepped
    assert {f["code"] for f in data["findings"]} == {"tail-dropped"}


def test_loop_that_raises_exits_3_with_its_traceback(loops, capsys):
    assert main(["verify", f"{loops}:broken", "--batch-size", "5"]) == 3
    err = capsys.readouterr().err
    assert "user bug" in err and "accumlib.verify: train_fn raised after 0 micro-batch forwards" in err


@pytest.mark.parametrize(
    "args, words",
    [
        (["{f}:missing", "--batch-size", "5"], "target function must be defined"),
        (["nofile.py:naive", "--batch-size", "5"], "target file must exist"),
        (["{f}", "--batch-size", "5"], "target must be FILE.py:FUNCTION"),
        (["{f}:naive"], "--batch-size is required"),
        (["{f}:naive", "--batch-size", "0"], "batch_size must be an integer >= 1 (got 0)"),
        (
            ["{f}:naive", "--batch-size", "5", "--accum-steps", "0"],
            "accum_steps must be an integer >= 1 (got 0)",
        ),
        (["{f}:naive", "--task", "mlp-digits", "--task", "lm-tokens"], "--task must be given once"),
        (["{f}:naive", "--task", "nope"], "task must be one of"),
        (["--accum-steps", "4"], "a target FILE.py:FUNCTION is required"),
        ([], "the library's own check of its reference loops is `accumlib selfcheck`"),
    ],
)
def test_bad_usage_exits_2(loops, capsys, args, words):
    assert main(["verify", *[a.format(f=loops) for a in args]]) == 2
    assert words in capsys.readouterr().err


def test_file_without_a_task_needs_task(tmp_path, capsys):
    path = tmp_path / "bare.py"
    path.write_text("def train(model, opt, loader):\n    pass\n")
    assert main(["verify", f"{path}:train", "--batch-size", "5", "--accum-steps", "4"]) == 2
    assert "item_losses, make_model, make_dataset or dataset" in capsys.readouterr().err


def test_the_self_check_is_its_own_command(capsys):
    """One name, one meaning: ``verify`` judges a user's loop, ``selfcheck`` the library's reference loops."""
    assert main(["selfcheck", "--task", "mlp-digits", "--loop", "ragged"]) == 0
    assert "1/1 verdicts hold" in capsys.readouterr().out
    for flag in (["--loop", "naive"], ["--device", "cuda"]):  # the self-check's options are not verify's
        with pytest.raises(SystemExit) as exit_:
            main(["verify", "loop.py:train", "--batch-size", "5", *flag])
        assert (
            exit_.value.code == 2 and f"unrecognized arguments: {' '.join(flag)}" in capsys.readouterr().err
        )


@pytest.mark.parametrize(
    "source, words",
    [
        ("def train(:\n", "target file must import cleanly (importing {f} raised SyntaxError"),
        (
            "import accumlib_no_such_module\n",
            "target file must import cleanly (importing {f} raised ModuleNotFoundError",
        ),
        (
            LOOPS.replace("torch.manual_seed(0)\n", "raise RuntimeError('no weights')\n"),
            "make_model() in the target file must build its object (it raised RuntimeError: no weights)",
        ),
    ],
    ids=["syntax-error", "import-error", "make_model-raises"],
)
def test_a_target_file_that_cannot_be_used_is_a_usage_error(tmp_path, capsys, source, words):
    # exit 1 means "your loop is wrong"; these loops never ran
    path = tmp_path / "target.py"
    path.write_text(source)
    assert main(["verify", f"{path}:divided", "--batch-size", "5"]) == 2
    assert words.format(f=path) in capsys.readouterr().err


def test_an_unknown_device_is_a_usage_error(capsys):
    assert main(["selfcheck", "--device", "gpu"]) == 2
    assert "device must be 'cpu', 'cuda', 'auto' or a torch.device (got 'gpu')" in capsys.readouterr().err


def test_a_command_that_moved_to_the_course_says_where_it_went(capsys):
    """`accumlib survey` and `accumlib ddp` live in the course now: a usage error naming the new command,
    before any work; a command that never existed is argparse's own error."""
    assert main(["survey", "transformers"]) == 2
    assert "python -m accumlib_course.survey" in capsys.readouterr().err
    assert main(["ddp", "--world-size", "2"]) == 2
    assert "python -m accumlib_course.distributed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["nosuch"])
    assert exit_.value.code == 2 and "invalid choice: 'nosuch'" in capsys.readouterr().err


def test_ddp_world_size_beyond_the_machine_is_a_usage_error(capsys):
    from accumlib.distributed.launch import max_world_size
    from accumlib_course.distributed.cli import main as ddp_main  # python -m accumlib_course.distributed

    assert ddp_main(["--world-size", str(max_world_size() + 1)]) == 2
    assert "world_size must be <=" in capsys.readouterr().err


EXIT_CASES = [
    ("divided", [], 0, "verdict: OK"),
    ("naive", [], 1, "unscaled-sum"),
    ("divided", ["--batch-size", "0"], 2, "batch_size must be an integer >= 1 (got 0)"),
    ("broken", [], 3, "the loop raised (exit 3)"),
    ("own_data", [], 4, "CANNOT JUDGE (untracked-data)"),
]


@pytest.fixture(scope="module")
def command_line_runs(tmp_path_factory):
    """Each case from the installed `accumlib` command in its own process, the five started together
    (most of each run is importing torch: side by side they take the time of about two)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("accumlib", path=str(Path(sys.executable).parent))
    assert exe, "the accumlib console script is installed beside this Python"
    path = tmp_path_factory.mktemp("cli") / "my_loops.py"
    path.write_text(LOOPS)
    started = [
        subprocess.Popen(
            [exe, "verify", f"{path}:{target}", "--batch-size", "5", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for target, extra, _, _ in EXIT_CASES
    ]
    done = []
    try:
        for process in started:
            out, err = process.communicate(timeout=180)
            done.append((process.returncode, out + err))
    finally:
        for process in started:
            process.kill()
    return done


@pytest.mark.parametrize("case", range(len(EXIT_CASES)), ids=[f"{t}-{s}" for t, _, s, _ in EXIT_CASES])
def test_each_exit_status_from_a_real_command_line_run(command_line_runs, case):
    """0 correct, 1 bug, 2 usage, 3 the loop raised, 4 verify could not judge: what a CI job acts on,
    from the installed `accumlib` command in its own process."""
    _, _, status, said = EXIT_CASES[case]
    returncode, printed = command_line_runs[case]
    assert returncode == status, printed
    assert said in printed, printed


@pytest.mark.parametrize(
    "module, name, oracle",
    [("window_oracle", "leading_rows", "recompute"), ("inplace_verify", "gram", "auto")],
    ids=["recompute", "in-place"],
)
def test_a_failure_inside_verify_is_cannot_judge_not_the_loops_fault(
    loops, capsys, monkeypatch, module, name, oracle
):
    """A case verify does not handle fails in its own stages: exit 4 and VerifyError, never 'your code
    raised'; on either oracle."""
    import importlib

    import accumlib

    # the oracle's own line fails (calling None raises TypeError in its module's frame), as a case it does
    # not handle would; a function defined here would put the raising frame in this file instead
    monkeypatch.setattr(importlib.import_module(f"accumlib._verify.{module}"), name, None)
    assert main(["verify", f"{loops}:divided", "--batch-size", "5", "--oracle", oracle]) == 4
    err = capsys.readouterr().err
    assert "cannot judge" in err and "not a bug found in the loop" in err, err
    with pytest.raises(accumlib.VerifyError, match="could not judge this run"):
        accumlib.verify(
            lambda m, o, loader: [torch.nn.functional.cross_entropy(m(x), y).backward() for x, y in loader],
            model=accumlib.get_task("mlp-digits").make_model(0),
            dataset=accumlib.data.digits(16),
            item_losses=accumlib.get_task("mlp-digits").item_losses,
            accum_steps=2,
            batch_size=4,
            oracle=oracle,
        )


def test_a_reader_that_closes_the_pipe_gets_no_traceback():
    """`accumlib selfcheck | head -1`: once the reader has closed the pipe, the command ends quietly with
    128 + SIGPIPE, as a shell reports such a command, not a BrokenPipeError traceback. The reader here
    closes before anything is written, so the write fails every time, whatever the buffering."""
    import os
    import subprocess
    import sys

    code = "import sys; from accumlib.cli import main; sys.exit(main(['selfcheck', '--task', 'mlp-digits']))"
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr
    assert run.returncode == 141

"""``python -m accumlib_course.survey transformers``: the survey from a shell (``make survey`` runs it).

Every causal-LM class (or, with ``--task sequence-classification``, every sequence classifier) of the
installed transformers, built tiny from its config (offline), one Trainer epoch each under
``accumlib.hf.verify_trainer``. It prints a markdown table (or JSON) on stdout and one line per class on
stderr; ``--out DIR`` also writes DIR/transformers-VERSION[-TASK].md and .json. Exit 0 when the survey
ran, 2 on bad usage. It was ``accumlib survey`` while the survey lived in the core: the core's command
line now holds only what judges a user's own loop or run.
"""

from __future__ import annotations

import argparse
import sys

PROG = "python -m accumlib_course.survey"


def build_parser() -> argparse.ArgumentParser:
    s = argparse.ArgumentParser(
        prog=PROG,
        description="Build every causal-LM class (or, with --task sequence-classification, every sequence "
        "classifier) of the installed transformers tiny from its config (offline), train one "
        "Trainer epoch with gradient_accumulation_steps=4 on variable-length data ending in a ragged window, "
        "and judge every optimizer step with accumlib.hf.verify_trainer. Prints a markdown table (or JSON); "
        "--out DIR also writes DIR/transformers-VERSION[-TASK].md and .json. Exit 0 when the survey ran, "
        "2 on bad usage.",
    )
    s.add_argument("library", choices=["transformers"], help="the library to survey")
    s.add_argument(
        "--task",
        choices=["causal-lm", "sequence-classification"],
        default="causal-lm",
        help="which classes: causal LMs (default; surveys/transformers-VERSION.md) or sequence classifiers "
        "(surveys/transformers-VERSION-sequence-classification.md)",
    )
    s.add_argument(
        "--models", metavar="A,B", help="only these model types or classes, comma-separated (e.g. gpt2,llama)"
    )
    s.add_argument("--out", metavar="DIR", help="also write DIR/transformers-VERSION[-TASK].md and .json")
    s.add_argument("--json", action="store_true", help="print the results as JSON")
    return s


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from accumlib_course import survey

        types = survey.resolve(args.models.split(",") if args.models else None, args.task)
    except ImportError as err:
        print(f"{PROG}: error: {err}; pip install accumlib[hf]", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"{PROG}: error: --{err}", file=sys.stderr)
        return 2

    def progress(row: survey.Row) -> None:  # one line per class on stderr, so stdout stays the table
        said = ", ".join(row.codes) or "ok" if row.status == "judged" else row.reason
        print(
            f"{row.model_type:<28} {row.status:<8} {row.seconds:6.2f} s  {said}", file=sys.stderr, flush=True
        )

    result = survey.run(types, args.task, progress=progress)
    if args.out:
        for path in survey.write(result, args.out):
            print(f"wrote {path}", file=sys.stderr)
    print(result.to_json() if args.json else result.to_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())

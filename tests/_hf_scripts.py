"""Run public Hugging Face training scripts unmodified, tiny, offline, on CPU.

The scripts themselves are not in this repository: each is pinned here by its upstream repository, path,
commit and the sha256 of its bytes (``UPSTREAM``), and read at test time from a clone you point at
(``ACCUMLIB_ACCELERATE_SRC``: a clone of https://github.com/huggingface/accelerate, work tree or bare git
directory). ``script(name, dest)`` copies the pinned version out of it and checks its sha256.

What the scripts load by hard-coded name resolves offline from caches this module builds under one
``HF_HOME`` (``workdir``), never from a hub:

- models: ``models--ORG--NAME/snapshots/<hash>/`` with ``refs/main``, holding a 2-layer, hidden-32 model
  of the named architecture built from its config, and a word-level tokenizer trained on the generated text
  (``tokenizers``), saved with ``save_pretrained``;
- datasets: ``<namespace>___<name>/<config>/0.0.0/<hash>/`` with ``dataset_info.json`` and one Arrow stream
  file per split, which ``datasets`` (5.x) reloads under ``HF_HUB_OFFLINE=1`` through its
  ``CachedDatasetModuleFactory`` and its ``cache`` builder;
- the ``glue`` metric of ``evaluate`` (``evaluate.load("glue", "mrpc")``): a stand-in module computing
  accuracy and F1, in ``modules/evaluate_modules/metrics/evaluate-metric--glue/<hash>/glue.py``, which
  ``evaluate`` loads from its module cache when the hub is out of reach. ``evaluate`` itself is not a
  dependency of this project: ``gradient_accumulation.py`` imports it, so that script runs only where it is
  importable (``has_evaluate``).

``command(name, path)`` is the argv that runs a script tiny (CPU, no mixed precision, gradient accumulation
over 2 micro-batches), ``launch(argv, ranks)`` the same on ``ranks`` gloo processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import _upstream
from _upstream import sha256  # hs.sha256: the tests hash what they read with the same function

ACCELERATE_URL = "https://github.com/huggingface/accelerate"
# accelerate's main at this commit says version 1.15.0.dev0; the clone has no v1.15.0 tag (the installed
# package is 1.15.0), so the scripts are pinned at main's HEAD of 2026-07-24.
ACCELERATE_COMMIT = "16cb6eb80dd9aa8b4df1a63ef57863e455d53b83"
UPSTREAM = {
    "gradient_accumulation": {
        "repo": ACCELERATE_URL,
        "path": "examples/by_feature/gradient_accumulation.py",
        "commit": ACCELERATE_COMMIT,
        "sha256": "b7fb15066d3953d1583e82abff1c14103810658aad5b1412422322d88c0c69d6",
    },
    "gradient_accumulation_for_autoregressive_models": {
        "repo": ACCELERATE_URL,
        "path": "examples/by_feature/gradient_accumulation_for_autoregressive_models.py",
        "commit": ACCELERATE_COMMIT,
        "sha256": "61a8680c477a1f015ffb69c4d4169b50208449aea159eb97bddf1ea97ed08133",
    },
}
SOURCE_ENV = "ACCUMLIB_ACCELERATE_SRC"

# what the scripts load by name (read from the pinned files)
SMOLLM = "HuggingFaceTB/SmolLM-360M"  # gradient_accumulation_for_autoregressive_models.py:60,186
BERT = "bert-base-cased"  # gradient_accumulation.py:60,143
WIKITEXT = ("Salesforce/wikitext", "wikitext-2-v1")  # ..._for_autoregressive_models.py:63
GLUE = ("nyu-mll/glue", "mrpc")  # gradient_accumulation.py:61
EOS = "<|endoftext|>"
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MAX_TRAINING_SAMPLES = 500  # ..._for_autoregressive_models.py:49: train is .select(range(500))
GLUE_METRIC = '''"""Offline stand-in for the evaluate-metric/glue module (mrpc: accuracy and F1)."""

import datasets
import evaluate


class Glue(evaluate.Metric):
    def _info(self):
        ints = datasets.Value("int64")
        features = datasets.Features({"predictions": ints, "references": ints})
        text = {"description": "stand-in", "citation": "", "inputs_description": ""}
        return evaluate.MetricInfo(features=features, **text)

    def _compute(self, predictions, references):
        pairs = list(zip(predictions, references))
        tp = sum(p == r == 1 for p, r in pairs)
        fp = sum(p == 1 and r == 0 for p, r in pairs)
        fn = sum(p == 0 and r == 1 for p, r in pairs)
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        return {"accuracy": sum(p == r for p, r in pairs) / max(len(pairs), 1), "f1": f1}
'''


def source() -> Path | None:
    """The accelerate clone named by ``ACCUMLIB_ACCELERATE_SRC``, or None where it is unset or missing."""
    return _upstream.source(SOURCE_ENV)


def upstream_bytes(name: str, src: Path) -> bytes:
    """The pinned script ``name`` at its commit, read from the clone ``src`` (work tree or git directory)."""
    return _upstream.upstream_bytes(UPSTREAM, name, src)


def script(name: str, dest: Path, src: Path | None = None) -> Path:
    """Copy the pinned script ``name`` into ``dest`` and return its path; ValueError if its sha256 differs."""
    data = upstream_bytes(name, src or source())
    if sha256(data) != UPSTREAM[name]["sha256"]:
        raise ValueError(f"{name}: sha256 {sha256(data)} is not the pinned {UPSTREAM[name]['sha256']}")
    path = Path(dest) / Path(UPSTREAM[name]["path"]).name
    path.write_bytes(data)
    return path


def has_evaluate(env: dict | None = None) -> bool:
    """Whether ``evaluate`` imports in a Python started with ``env`` (gradient_accumulation.py needs it)."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('evaluate') is None)"
    return subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


# ---------------------------------------------------------------- generated text


def words(n: int = 120) -> list[str]:
    """``n`` made-up lower-case words, the same on every machine."""
    rng = random.Random(0)
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(1, 3)))
        if w not in out:
            out.append(w)
    return out


def sentences(n: int, lo: int, hi: int, seed: int) -> list[str]:
    """``n`` lines of ``lo``..``hi`` words drawn from ``words()``, seeded."""
    rng = random.Random(seed)
    vocab = words()
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def wikitext_rows(n_text: int = 12, seed: int = 1) -> dict[str, list[str]]:
    """Train/validation/test ``text`` columns shaped as wikitext's: many empty lines, a few of text.

    The train split has ``MAX_TRAINING_SAMPLES`` rows (the script selects that many) of which ``n_text`` are
    text, 2 to 14 words; the script filters the empty ones out.
    """
    train = [""] * MAX_TRAINING_SAMPLES
    text = sentences(n_text, 2, 14, seed)
    for i, line in enumerate(text):
        train[i * (MAX_TRAINING_SAMPLES // n_text)] = line
    valid = ["", *sentences(4, 2, 14, seed + 1), ""]
    return {"train": train, "validation": valid, "test": list(valid)}


def mrpc_rows(n_train: int = 64, n_valid: int = 8, seed: int = 2) -> dict[str, dict[str, list]]:
    """GLUE MRPC-shaped splits (sentence1, sentence2, label, idx) of generated sentences."""
    rng = random.Random(seed)
    out = {}
    for split, n in (("train", n_train), ("validation", n_valid), ("test", n_valid)):
        s1 = sentences(n, 3, 10, rng.randint(0, 10**6))
        s2 = sentences(n, 3, 10, rng.randint(0, 10**6))
        labels = [rng.randint(0, 1) for _ in range(n)]
        out[split] = {"sentence1": s1, "sentence2": s2, "label": labels, "idx": list(range(n))}
    return out


# ---------------------------------------------------------------- hub cache


def _snapshot(hub: Path, repo_id: str) -> Path:
    """Create ``models--ORG--NAME`` with ``refs/main`` and return its (empty) snapshot folder."""
    root = hub / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def _word_level(specials: list[str], unk: str):
    """A ``tokenizers`` word-level tokenizer over ``words()`` with ``specials`` first."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate([*specials, *words()])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def tiny_smollm(hub: Path) -> Path:
    """A 2-layer Llama (SmolLM's architecture) and an EOS-only word tokenizer under ``SMOLLM``'s name."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    snap = _snapshot(hub, SMOLLM)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_word_level([EOS], EOS),
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        model_max_length=64,
    )
    tok.save_pretrained(snap)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(snap)
    return snap


def tiny_bert(hub: Path) -> Path:
    """A 2-layer BERT and a word-level ``[CLS] a [SEP] b [SEP]`` tokenizer under ``BERT``'s name."""
    import torch
    from tokenizers import processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    snap = _snapshot(hub, BERT)
    raw = _word_level(BERT_SPECIALS, "[UNK]")
    cls, sep = raw.token_to_id("[CLS]"), raw.token_to_id("[SEP]")
    raw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=64,
    )
    tok.save_pretrained(snap)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        num_labels=2,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(snap)
    return snap


# ---------------------------------------------------------------- datasets and evaluate caches


def cache_dataset(cache: Path, repo_id: str, config_name: str, splits: dict, features) -> Path:
    """Write ``splits`` ({split: {column: values}}) where ``load_dataset(repo_id, config_name)`` finds them.

    The layout is the one ``datasets`` writes when it prepares a hub dataset:
    ``<namespace>___<name>/<config>/0.0.0/<hash>/`` holding ``dataset_info.json`` (features, config name,
    split sizes) and ``<name>-<split>.arrow`` (an Arrow IPC stream).
    """
    import pyarrow as pa
    from datasets import Dataset, DatasetInfo, SplitDict, SplitInfo

    name = repo_id.split("/")[-1]
    folder = (
        cache
        / repo_id.replace("/", "___")
        / config_name
        / "0.0.0"
        / hashlib.sha1(repo_id.encode()).hexdigest()
    )
    folder.mkdir(parents=True, exist_ok=True)
    split_dict = SplitDict(dataset_name=name)
    for split, columns in splits.items():
        table = Dataset.from_dict(columns, features=features).data.table
        path = folder / f"{name}-{split}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        split_dict.add(
            SplitInfo(
                name=split, num_bytes=path.stat().st_size, num_examples=table.num_rows, dataset_name=name
            )
        )
    info = DatasetInfo(features=features, config_name=config_name, dataset_name=name, splits=split_dict)
    info.write_to_directory(str(folder))
    return folder


def cache_glue_metric(modules: Path) -> Path:
    """Put ``GLUE_METRIC`` where ``evaluate.load("glue", ...)`` reloads a cached canonical metric."""
    code = GLUE_METRIC.encode()
    folder = modules / "evaluate_modules" / "metrics" / "evaluate-metric--glue" / sha256(code)
    folder.mkdir(parents=True, exist_ok=True)
    for level in (
        modules / "evaluate_modules",
        modules / "evaluate_modules" / "metrics",
        folder.parent,
        folder,
    ):
        (level / "__init__.py").touch()
    (folder / "glue.py").write_bytes(code)
    return folder


def workdir(tmp: Path) -> dict:
    """Build every offline cache the pinned scripts need under ``tmp`` and return their environment.

    Returns ``{"env": os.environ plus the offline variables, "home": HF_HOME, "hub": the hub cache}``.
    The environment has ``HF_HOME`` (the hub, datasets and modules caches under it), ``HF_HUB_OFFLINE``,
    ``HF_DATASETS_OFFLINE``, ``HF_EVALUATE_OFFLINE``, ``TRANSFORMERS_OFFLINE`` = 1, no telemetry, one
    thread per process, and no ``TESTING_MOCKED_DATALOADERS`` (the scripts' own data path runs).
    """
    from datasets import ClassLabel, Features, Value

    home = Path(tmp) / "hf_home"
    hub = home / "hub"
    tiny_smollm(hub)
    tiny_bert(hub)
    rows = wikitext_rows()
    cache_dataset(
        home / "datasets",
        *WIKITEXT,
        {split: {"text": text} for split, text in rows.items()},
        Features({"text": Value("string")}),
    )
    glue = Features(
        {
            "sentence1": Value("string"),
            "sentence2": Value("string"),
            "label": ClassLabel(names=["not_equivalent", "equivalent"]),
            "idx": Value("int32"),
        }
    )
    cache_dataset(home / "datasets", *GLUE, mrpc_rows(), glue)
    cache_glue_metric(home / "modules")
    env = {k: v for k, v in os.environ.items() if k != "TESTING_MOCKED_DATALOADERS"}
    env.update(
        HF_HOME=str(home),
        HF_HUB_CACHE=str(hub),
        HF_DATASETS_CACHE=str(home / "datasets"),
        HF_MODULES_CACHE=str(home / "modules"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_EVALUATE_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_UPDATE_DOWNLOAD_COUNTS="0",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_DISABLED="true",
    )
    return {"env": env, "home": home, "hub": hub}


# ---------------------------------------------------------------- command lines


def command(name: str, path: Path, accumulation: int = 2) -> list[str]:
    """The argv that runs the pinned script ``name`` (at ``path``) tiny on one CPU process.

    Both scripts take ``--cpu``, ``--mixed_precision`` and ``--gradient_accumulation_steps``; the
    autoregressive one also ``--per_device_batch_size`` (2 here: 12 texts, 3 optimizer steps in each of its
    3 epochs). gradient_accumulation.py's batch size (16) and epochs (3) are fixed in the script: 64 MRPC rows
    give 4 micro-batches an epoch, 2 optimizer steps.
    """
    argv = [sys.executable, str(path), "--cpu", "--mixed_precision", "no"]
    argv += ["--gradient_accumulation_steps", str(accumulation)]
    if name == "gradient_accumulation_for_autoregressive_models":
        argv += ["--per_device_batch_size", "2"]
    return argv


def launch(argv: list[str], ranks: int = 2, port: int = 29561) -> list[str]:
    """``argv`` (a ``command``) on ``ranks`` CPU processes through torch's launcher (gloo)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={ranks}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        *argv[1:],
    ]


def main() -> None:
    """``python tests/_hf_scripts.py DIR``: build the caches in DIR and print the environment to export."""
    built = workdir(Path(sys.argv[1]))
    keys = [k for k in built["env"] if k.startswith(("HF_", "TRANSFORMERS_")) or k == "OMP_NUM_THREADS"]
    print(json.dumps({k: built["env"][k] for k in keys}, indent=1))


if __name__ == "__main__":
    main()

"""The shipped fine-tuning configs for public data sets read them from the Hub, so they run for anyone with the
repository alone; local copies (../shared/data beside the repository, used by the experiments and benchmarks)
sit behind the overlays in configs/finetune/offline/.

The Hub path runs the real scripts against the test Hub (tests/hub_server.py), which serves small data set repos
laid out as the real ones are (nyu-mll/glue's sst2 parquet files, eriktks/conll2003's ClassLabel NER tags,
bentrevett/multi30k's jsonl files with `en` and `de` columns), through `datasets.load_dataset` and HF_ENDPOINT."""

import json
from pathlib import Path

import pytest
from kiln_testing import REPO, one_torch_thread, run_main

FINETUNE = REPO / "configs" / "finetune"
HUB_CONFIGS = {
    "classify-sst2.yaml": ("nyu-mll/glue", "sst2"),
    "tag-conll2003.yaml": ("eriktks/conll2003", None),
    "seq2seq-multi30k.yaml": ("bentrevett/multi30k", None),
}
SHORT = [
    "--training.max_steps",
    "2",
    "--training.per_device_train_batch_size",
    "4",
    "--logging.logging_steps",
    "1",
]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def resolved(path: Path) -> dict:
    from kiln.config import flatten, load_yaml

    return flatten(load_yaml(path))


def script_and_config(path: Path):
    script = path.name.split("-")[0]
    module = __import__(f"finetune.{script}", fromlist=["main"])
    name = {"classify": "ClassifyConfig", "tag": "TagConfig", "seq2seq": "Seq2SeqConfig"}[script]
    return module, getattr(module, name)


# ----------------------------------------------------------------------------------------------------------
# what the configs read


@pytest.mark.parametrize(
    "path",
    sorted(
        [
            *FINETUNE.glob("*.yaml"),
            *(REPO / "configs" / "pretrain").glob("*.yaml"),
            *(REPO / "configs" / "model").glob("*.yaml"),
        ]
    ),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_no_shipped_config_reads_a_folder_beside_the_repository(path):
    """Every value of a shipped config, its `_base_` files merged in: nothing outside the repository."""
    for key, value in resolved(path).items():
        for item in value if isinstance(value, list) else [value]:
            assert not (isinstance(item, str) and item.startswith("..")), f"{path.name}: {key} = {item}"


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_public_data_set_configs_name_the_hub_and_the_offline_overlay_names_local_files(name):
    from kiln.config import build_config

    module, config_class = script_and_config(FINETUNE / name)
    config = build_config(config_class, ["--config", str(FINETUNE / name)])
    assert (config.data.dataset_name, config.data.dataset_config) == HUB_CONFIGS[name]

    offline = build_config(config_class, ["--config", str(FINETUNE / "offline" / name)])
    assert offline.data.dataset_name is None and offline.data.dataset_config is None
    files = [offline.data.train_file, offline.data.validation_file, offline.data.test_file]
    assert all(path.startswith("../shared/data/") for path in files), files
    # the overlay changes where the data comes from, nothing else
    hub_values = resolved(FINETUNE / name)
    for key, value in resolved(FINETUNE / "offline" / name).items():
        if not key.startswith("data."):
            assert hub_values[key] == value, key


@pytest.mark.parametrize("task", ["sst2", "conll2003", "multi30k"])
def test_experiments_keep_reading_the_offline_copies(task):
    from kiln.config import load_yaml

    data = load_yaml(REPO / "configs" / "experiments" / f"{task}.yaml")["data"]
    assert data.get("dataset_name") is None and data["train_file"].startswith("../shared/data/")


# ----------------------------------------------------------------------------------------------------------
# the Hub path, through the scripts


def upload(hub, repo_id: str, files: dict[str, bytes]) -> None:
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset")
    api.create_commit(
        repo_id,
        repo_type="dataset",
        commit_message="data",
        operations=[CommitOperationAdd(path, data) for path, data in files.items()],
    )


def parquet(dataset) -> bytes:
    import io

    buffer = io.BytesIO()
    dataset.to_parquet(buffer)
    return buffer.getvalue()


def serve_glue_sst2(hub) -> None:
    """nyu-mll/glue as the Hub holds it: a folder per config, declared in the card; the test split unlabelled."""
    from datasets import ClassLabel, Dataset, Features, Value

    features = Features(
        {
            "sentence": Value("string"),
            "label": ClassLabel(names=["negative", "positive"]),
            "idx": Value("int32"),
        }
    )
    words = {0: ["dull", "bad", "awful"], 1: ["fine", "good", "great"]}

    def split(name, n):
        labels = [-1] * n if name == "test" else [i % 2 for i in range(n)]
        sentences = [f"a {words[max(label, 0)][i % 3]} film {i}" for i, label in enumerate(labels)]
        return parquet(
            Dataset.from_dict(
                {"sentence": sentences, "label": labels, "idx": list(range(n))}, features=features
            )
        )

    card = (
        "---\nconfigs:\n- config_name: sst2\n  data_files:\n"
        + "".join(f"  - split: {name}\n    path: sst2/{name}-*\n" for name in ("train", "validation", "test"))
        + "---\n"
    )
    upload(
        hub,
        "nyu-mll/glue",
        {
            "README.md": card.encode(),
            **{
                f"sst2/{name}-00000-of-00001.parquet": split(name, n)
                for name, n in (("train", 24), ("validation", 8), ("test", 6))
            },
        },
    )


def serve_conll2003(hub) -> None:
    """eriktks/conll2003 as the Hub holds it: a loading script (with its card) on main, which datasets no longer
    runs, and the Hub's Parquet export of it in refs/convert/parquet, a folder per config and split, the ClassLabel
    names in the Parquet schema."""
    from datasets import ClassLabel, Dataset, Features, List, Value

    tags = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    features = Features(
        {"id": Value("string"), "tokens": List(Value("string")), "ner_tags": List(ClassLabel(names=tags))}
    )

    def split(n):
        tokens = [["John", "Smith", "visited", "Paris", "."] for _ in range(n)]
        return parquet(
            Dataset.from_dict(
                {"id": [str(i) for i in range(n)], "tokens": tokens, "ner_tags": [[1, 2, 0, 5, 0]] * n},
                features=features,
            )
        )

    script = b"import datasets\n\n\nclass Conll2003(datasets.GeneratorBasedBuilder):\n    pass\n"
    upload(hub, "eriktks/conll2003", {"conll2003.py": script, "README.md": b"# CoNLL-2003\n"})
    hub.add_convert_ref(
        "eriktks/conll2003",
        {
            f"conll2003/{name}/0000.parquet": split(n)
            for name, n in (("train", 16), ("validation", 4), ("test", 4))
        },
    )


def serve_multi30k(hub) -> None:
    pairs = [("a dog runs .", "ein hund rennt ."), ("two men sit .", "zwei männer sitzen .")]

    def lines(n):
        rows = [{"en": pairs[i % 2][0], "de": pairs[i % 2][1]} for i in range(n)]
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()

    upload(
        hub, "bentrevett/multi30k", {"train.jsonl": lines(12), "val.jsonl": lines(4), "test.jsonl": lines(4)}
    )


def test_classify_sst2_config_reads_glue_from_the_hub(hub, kiln_checkpoints, tmp_path):
    from finetune.classify import main

    serve_glue_sst2(hub)
    out = tmp_path / "run"
    result = run_main(
        main,
        "--config",
        FINETUNE / "classify-sst2.yaml",
        "--model.checkpoint",
        kiln_checkpoints[0],
        "--training.output_dir",
        out,
        *SHORT,
    )
    assert result.state.global_step == 2
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}  # the ClassLabel's names
    rows = [json.loads(line) for line in (out / "predictions_test.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and "reference" not in rows[0]  # the unlabelled test split: predicted, not scored
    assert any(r.kind == "resolve" and "nyu-mll/glue" in r.path for r in hub.requests())


def test_tag_conll2003_config_reads_the_ner_tags_from_the_hub(hub, kiln_checkpoints, tmp_path):
    from finetune.tag import main

    serve_conll2003(hub)
    out = tmp_path / "run"
    result = run_main(
        main,
        "--config",
        FINETUNE / "tag-conll2003.yaml",
        "--model.checkpoint",
        kiln_checkpoints[0],
        "--training.output_dir",
        out,
        *SHORT,
    )
    assert result.state.global_step == 2
    labels = set(json.loads((out / "final" / "config.json").read_text())["id2label"].values())
    assert labels == {"O", "B-PER", "I-PER", "B-LOC"}  # tag names, from the ClassLabel ids
    assert "f1" in result.eval_metrics["validation"]


def test_a_hub_dataset_with_only_a_loading_script_names_its_parquet_export(
    hub, kiln_checkpoints, tmp_path, monkeypatch
):
    """Without the config's revision, eriktks/conll2003's main branch offers datasets only its loading script: the
    run stops with a data error (one line on the command line) naming --data.dataset_revision refs/convert/parquet,
    not the library's RuntimeError. (An empty datasets cache: with a copy loaded before, datasets falls back to it.)"""
    import datasets

    from finetune.data import FinetuneDataError
    from finetune.tag import main

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    serve_conll2003(hub)
    with pytest.raises(
        FinetuneDataError,
        match=r"eriktks/conll2003 has only a loading script.*--data\.dataset_revision "
        r"refs/convert/parquet",
    ):
        run_main(
            main,
            "--config",
            FINETUNE / "tag-conll2003.yaml",
            "--data.dataset_revision",
            "none",
            "--model.checkpoint",
            kiln_checkpoints[0],
            "--training.output_dir",
            tmp_path / "run",
            *SHORT,
        )


def test_seq2seq_multi30k_config_reads_the_language_columns_from_the_hub(hub, kiln_checkpoints, tmp_path):
    from finetune.seq2seq import main

    serve_multi30k(hub)
    out = tmp_path / "run"
    encoder, decoder = kiln_checkpoints
    result = run_main(
        main,
        "--config",
        FINETUNE / "seq2seq-multi30k.yaml",
        "--model.encoder_checkpoint",
        encoder,
        "--model.decoder_checkpoint",
        decoder,
        "--training.output_dir",
        out,
        "--generation.num_beams",
        "1",
        "--generation.max_new_tokens",
        "4",
        *SHORT,
    )
    assert result.state.global_step == 2
    rows = [json.loads(line) for line in (out / "predictions_test.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and rows[0]["reference"] in ("ein hund rennt .", "zwei männer sitzen .")

"""Nothing Kiln publishes names the user's disk: every file of `final/`, `checkpoints/`, `hub-export/` and every
commit pushed to the Hub names data by what it is (file name, size, sha256), never by where it lies; a prepared
run's card names the prepared data; the card shows user-controlled names as text, never as markup.

Every case runs as a user runs it (`accelerate launch`, `python -m pretrain.data prepare`) in a fresh process,
with the data in two separate trees (one inside a home folder whose name is the user's) and HOME pointing there;
beside them, a consistent and a conflicting command line of the prepared case run in this process (the conflict's
one-line refusal is checked in a fresh process too)."""

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testing import DEBUG, REPO, cli_in_process, one_torch_thread, run_main
from test_finetune_scripts import write_sentiment
from test_trust import ONE_STEP, error_line, finish, launch, pushed_files

USER = "alice-xyz"


def corpus_in_two_trees(tmp_path: Path) -> tuple[Path, list[Path], Path]:
    """(home, training files, validation file): the shipped books copied into the user's home, all but one
    training, that one validating from a tree outside it (a shared disk)."""
    home = tmp_path / "home" / USER
    books = sorted((REPO / "data/pretrain").glob("*.txt"))
    train = home / "corpora" / "books"
    train.mkdir(parents=True)
    for book in books[:-1]:
        shutil.copy(book, train / book.name)
    held_out = tmp_path / "mnt" / "shared" / USER / "held-out"
    held_out.mkdir(parents=True)
    shutil.copy(books[-1], held_out / books[-1].name)
    return home, sorted(train.iterdir()), held_out / books[-1].name


def published_leaks(tmp_path: Path, home: Path, files: dict[str, bytes]) -> dict[str, list[str]]:
    """{published file: the private strings it holds} (none should)."""
    private = [str(tmp_path), str(home), str(Path.home()), USER, "/home/", "/mnt/"]
    leaks = {name: [p for p in private if p.encode() in data] for name, data in files.items()}
    return {name: found for name, found in leaks.items() if found}


def folder_files(folder: Path, label: str) -> dict[str, bytes]:
    return {
        f"{label}/{p.relative_to(folder)}": p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.slow
def test_nothing_published_names_the_users_disk(tmp_path, hub):
    """A launched pretraining run pushing its checkpoints (data in the user's home and on a shared disk, HOME
    pointing there), a fine-tuning run pushing from it and one from scratch: no file pushed or written for
    publishing (final/, checkpoints/, best/, hub-export/, every commit) names the user's paths, name or home;
    the data fingerprint and the cards name the data files by name (and sha256); the run folder's own config
    keeps the paths as given."""
    home, train, validation = corpus_in_two_trees(tmp_path)
    env = {"HOME": str(home), "USER": USER, "LOGNAME": USER}
    pretrained = home / "runs" / "enc"
    proc = launch(
        "pretrain/run.py",
        "--config",
        DEBUG,
        "--training.output_dir",
        pretrained,
        "--data.data_files",
        f"{train[0].parent}/*.txt",
        "--data.validation_files",
        validation,
        "--training.max_steps",
        2,
        "--training.save_steps",
        2,
        "--training.eval_steps",
        2,
        "--hub.push_to_hub",
        "--hub.model_id",
        "kiln-test/enc",
        "--hub.strategy",
        "checkpoint",
        env_extra=env,
    )
    ((code, output),) = finish(proc)
    assert code == 0, output[-3000:]

    sentiment = write_sentiment(tmp_path, sizes=(16, 8, 8))
    (home / "tasks").mkdir()
    (tmp_path / "mnt" / "dev").mkdir()
    train_csv = shutil.copy(sentiment["train"], home / "tasks" / "train.csv")
    validation_csv = shutil.copy(sentiment["validation"], tmp_path / "mnt" / "dev" / "validation.csv")
    test_csv = shutil.copy(sentiment["test"], home / "tasks" / "test.csv")
    finetuned = home / "runs" / "cls"
    procs = [
        launch(
            "finetune/classify.py",
            "--model.checkpoint",
            pretrained / "final",
            "--training.output_dir",
            finetuned,
            "--data.train_file",
            train_csv,
            "--data.validation_file",
            validation_csv,
            "--data.test_file",
            test_csv,
            "--training.max_steps",
            2,
            "--training.save_steps",
            2,
            "--training.eval_steps",
            2,
            "--training.per_device_train_batch_size",
            8,
            "--hub.push_to_hub",
            "--hub.model_id",
            "kiln-test/cls",
            env_extra=env,
        ),
        launch(
            "finetune/classify.py",
            "--model.checkpoint",
            pretrained / "final",
            "--model.from_scratch",
            "--training.output_dir",
            home / "runs" / "scratch",
            *ONE_STEP,
            "--data.train_file",
            train_csv,
            "--data.validation_file",
            validation_csv,
            "--data.test_file",
            test_csv,
            "--training.per_device_train_batch_size",
            8,
            env_extra=env,
        ),
    ]
    for code, output in finish(*procs):
        assert code == 0, output[-3000:]

    pushed = pushed_files(hub, "kiln-test/enc")
    # the checkpoint strategy pushed the step's whole state, its config among it
    assert {"last-checkpoint/data_fingerprint.json", "last-checkpoint/kiln_config.yaml"} <= {
        name.split("/", 1)[1] for name in pushed
    }
    published = pushed | pushed_files(hub, "kiln-test/cls")
    for run in (pretrained, finetuned, home / "runs" / "scratch"):
        for part in ("final", "checkpoints", "best", "hub-export"):
            if (run / part).is_dir():
                published |= folder_files(run / part, f"{run.name}/{part}")
    fingerprint_name = f"{pretrained.name}/checkpoints/step-00000002/data_fingerprint.json"
    assert fingerprint_name in published, sorted(published)
    assert f"{finetuned.name}/final/README.md" in published
    assert published_leaks(tmp_path, home, published) == {}

    # the data is named by what it is: every file by its name and content hash
    fingerprint = published[fingerprint_name].decode()
    card = published[f"{pretrained.name}/final/README.md"].decode()
    for path in [*train, validation]:
        assert path.name in fingerprint
        assert path.name in card
    assert "sha256" in card
    cls_card = published[f"{finetuned.name}/final/README.md"].decode()
    assert "train.csv" in cls_card and "validation.csv" in cls_card and "sha256" in cls_card
    assert "| initialisation | pretrained (final) |" in cls_card, cls_card
    assert (
        "An encoder fine-tuned from a local checkpoint with Kiln on train.csv, validation.csv, test.csv."
        in cls_card
    )
    scratch_card = published["scratch/final/README.md"].decode()
    assert "| initialisation | random (from scratch, shape and tokenizer of final) |" in scratch_card
    # the run folder's own config (never published) keeps the full paths, as given
    saved = (pretrained / "config.yaml").read_text()
    assert str(validation) in saved and f"{train[0].parent}/*.txt" in saved


EVIL = "a`<img src=x onerror=alert(1)>`.txt"
"""A corpus file name that, pasted into a code span, closes it and leaves a live tag."""


def small_corpus_in_two_trees(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(home, training folder, validation file): a few hundred paragraphs of the shipped books in files of names
    the books do not have (one of them `EVIL`), validation outside the home folder."""
    home = tmp_path / "home" / USER
    paragraphs = []
    for book in sorted((REPO / "data/pretrain").glob("*.txt")):
        paragraphs += [p.strip() for p in book.read_text(encoding="utf-8").split("\n\n") if p.strip()][40:140]
    train = home / "corpora" / "notes"
    train.mkdir(parents=True)
    for i, name in enumerate(["notes-1.txt", "notes-2.txt", EVIL]):
        (train / name).write_text("\n\n".join(paragraphs[i * 150 : (i + 1) * 150]) + "\n", encoding="utf-8")
    held_out = tmp_path / "mnt" / "shared" / USER / "held-out"
    held_out.mkdir(parents=True)
    (held_out / "notes-dev.txt").write_text("\n\n".join(paragraphs[450:520]) + "\n", encoding="utf-8")
    return home, train, held_out / "notes-dev.txt"


def rendered(card: str) -> str:
    """The card's markdown as HTML, by a CommonMark renderer that passes raw HTML through (as a page would)."""
    from markdown_it import MarkdownIt

    body = card.split("\n---\n", 1)[1]  # after the YAML header
    return MarkdownIt("commonmark").enable("table").render(body)


@pytest.mark.slow
def test_a_prepared_runs_card_names_the_prepared_sources_as_text_and_conflicting_data_is_one_line(
    tmp_path, capsys
):
    from pretrain.run import main as pretrain

    home, train, validation = small_corpus_in_two_trees(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home), "USER": USER}
    prepared = home / "prepared"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.data",
            "prepare",
            "--config",
            str(DEBUG),
            "--output",
            str(prepared),
            "--data.data_files",
            f"{train}/*.txt",
            "--data.validation_files",
            str(validation),
            "--tokenizer.input_sentence_size",
            "2000",
        ],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    other = tmp_path / "other.txt"
    other.write_text("Another corpus altogether.\n", encoding="utf-8")
    out = home / "runs" / "prep"
    procs = [
        launch(
            "pretrain/run.py",
            "--config",
            DEBUG,
            "--training.output_dir",
            out,
            "--data.prepared",
            prepared,
            "--training.max_steps",
            1,
            "--training.save_steps",
            1,
            "--training.eval_steps",
            1,
            env_extra={"HOME": str(home), "USER": USER},
        ),
        launch(
            "pretrain/run.py",
            "--config",
            DEBUG,
            "--training.output_dir",
            tmp_path / "x",
            "--data.prepared",
            prepared,
            "--data.data_files",
            other,
        ),
    ]
    # while those two run in fresh processes: the same command line's checks in this process (the refusal's one
    # line in a fresh process is the --data.data_files case above; both flags go through the same check)
    with one_torch_thread():  # flags that name the prepared sources are consistent: the run trains
        run_main(
            pretrain,
            "--config",
            DEBUG,
            "--training.output_dir",
            home / "runs" / "same",
            "--data.prepared",
            prepared,
            "--data.data_files",
            f"{train}/*.txt",
            "--data.validation_files",
            validation,
            *ONE_STEP,
        )
    assert (home / "runs" / "same" / "final" / "model.safetensors").is_file()
    validation_code, validation_err = cli_in_process(
        capsys,
        "--training.output_dir",
        tmp_path / "y",
        "--data.prepared",
        prepared,
        "--data.validation_files",
        other,
    )
    (code, output), (conflict_code, conflict_output) = finish(*procs)
    assert code == 0, output[-3000:]
    conflicts = [
        (conflict_code, error_line(conflict_output)),
        (validation_code, error_line("\n".join(validation_err))),
    ]
    for (conflict_code, line), option, split in zip(
        conflicts, ("data.data_files", "data.validation_files"), ("train", "validation")
    ):
        assert conflict_code != 0
        assert line == (
            f"error: --{option} names other files than --data.prepared prepared was prepared from (other.txt "
            f"(27 bytes) is not among its {split} sources); drop --{option} (the run trains on the prepared "
            "sources) or prepare the corpus again from these files"
        )
        assert not (tmp_path / ("x" if split == "train" else "y")).exists()

    # the card lists the sources the manifest records (name, size, sha256), not the default data_files
    card = (out / "final" / "README.md").read_text(encoding="utf-8")
    for name in ("notes-1.txt", "notes-2.txt", "notes-dev.txt"):
        size = (validation if name == "notes-dev.txt" else train / name).stat().st_size
        assert re.search(rf"{re.escape(name)} \({size:,} bytes, sha256 [0-9a-f]{{16}}\)", card), card
    assert "frankenstein" not in card and "pretrain/\\*.txt" not in card
    # the file name with backticks and a tag is shown as text: no live tag, the name itself in the page's text
    page = rendered(card)
    assert "<img src=x" not in card and not re.search(r"<[^>]*onerror", page), page
    assert page.count("<img") == 1  # the loss curve
    assert EVIL in html.unescape(re.sub(r"<[^>]+>", "", page)), page

    published = folder_files(out / "final", "final") | folder_files(out / "checkpoints", "checkpoints")
    assert "checkpoints/step-00000001/data_fingerprint.json" in published, sorted(published)
    published |= {name: (prepared / name).read_bytes() for name in ("manifest.json", "plan.json")}
    assert published_leaks(tmp_path, home, published) == {}


def test_paths_inside_values_are_reduced_and_markup_and_old_fingerprints_are_kept():
    from kiln.fingerprint import data_changes
    from kiln.public import card_text, public_file_names, public_name

    home = "/" + "home/alice-xyz"
    assert public_name(f"pretrained ({home}/runs/enc/final)") == "pretrained (final)"
    assert public_name(f"--data={home}/a.txt and ~/b.txt.") == "--data=a.txt and b.txt."
    for kept in (
        "</s>",
        "<|endoftext|>",
        "eval/loss",
        "https://huggingface.co/kiln-test/enc",
        "hub:kiln-test/enc",
    ):
        assert public_name(kept) == kept
    assert public_file_names(["/a/x.txt", "/b/x.txt", "/c/y.txt"]) == ["x.txt", "x.txt (2)", "y.txt"]
    assert card_text(EVIL) == "a\\`&lt;img src=x onerror=alert(1)&gt;\\`.txt"
    assert card_text("a_christmas_carol.txt | *b*") == "a_christmas_carol.txt \\| \\*b\\*"
    # a checkpoint that named files relative to their common folder compares by file name
    old = {"home/alice-xyz/x.txt": "1 bytes, sha256 a", "mnt/x.txt": "2 bytes, sha256 b", "hub revision": "r"}
    assert (
        data_changes(
            old, {"x.txt": "1 bytes, sha256 a", "x.txt (2)": "2 bytes, sha256 b", "hub revision": "r"}
        )
        == []
    )
    assert data_changes(
        old, {"x.txt": "1 bytes, sha256 a", "x.txt (2)": "3 bytes, sha256 c", "hub revision": "r"}
    ) == ["x.txt (2) 2 -> 3 bytes"]


def test_only_data_flags_of_the_command_line_are_compared_with_a_prepared_folder(tmp_path):
    """A config file's data_files may name what other files were prepared instead of (`prepare --config X
    --data.data_files ...`, then `--config X --data.prepared DIR`): only the command line's flags conflict."""
    import json
    from types import SimpleNamespace

    import pytest

    from kiln.errors import ConfigError
    from pretrain.run import check_prepared_sources

    (tmp_path / "prep").mkdir()
    source = {"name": "a.txt", "bytes": 3, "sha256": "0" * 64}
    (tmp_path / "prep" / "manifest.json").write_text(json.dumps({"sources": {"train": [source]}}))
    (tmp_path / "a.txt").write_text("abc")
    (tmp_path / "b.txt").write_text("other")
    data = SimpleNamespace(
        prepared=str(tmp_path / "prep"),
        dataset_name=None,
        validation_files=None,
        data_files=[str(tmp_path / "b.txt")],
    )
    check_prepared_sources(data, given={"data.prepared"})
    with pytest.raises(
        ConfigError, match=r"^--data.data_files names other files than --data.prepared prep was"
    ):
        check_prepared_sources(data, given={"data.prepared", "data.data_files"})
    data.data_files = [str(tmp_path / "a.txt")]
    check_prepared_sources(data, given={"data.prepared", "data.data_files"})

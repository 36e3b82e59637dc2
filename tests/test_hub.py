"""kiln/hub.py against the offline test Hub (tests/hub_server.py).

Uploads over both wire paths (regular files with Xet on; LFS batch + PUT with Xet off), background pushes,
coalescing, outages, model cards, redaction, resuming from the Hub, and `from_pretrained` in a fresh process.
"""

import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml
from conftest import TEST_TOKEN, TEST_USER
from huggingface_hub import HfApi, ModelCard, constants, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils._runtime import is_xet_available

from kiln.hub import HubPusher, download_checkpoint, plot_loss_curve, write_model_card
from kiln.redaction import redact

REPO = f"{TEST_USER}/tiny"
BINARY = bytes(range(256)) * 40  # has NUL bytes: the `auto` upload mode sends it through LFS


def make_folder(root: Path, version: int) -> Path:
    """A small checkpoint-like folder whose contents depend on `version`."""
    (root / "nested").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(f'{{"version": {version}}}\n')
    (root / "model.safetensors").write_bytes(BINARY + bytes([version]))
    (root / "nested" / "notes.txt").write_text(f"notes v{version}\n")
    return root


def local_files(root: Path) -> dict[str, bytes]:
    """Files under `root`, but not the download bookkeeping huggingface_hub keeps in a local_dir's .cache/."""
    files = {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}
    return {name: path.read_bytes() for name, path in files.items() if not name.startswith(".cache/")}


def eventually(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def without_gitattributes(files: dict[str, bytes]) -> dict[str, bytes]:
    return {path: data for path, data in files.items() if path != ".gitattributes"}


# ------------------------------------------------------------------------------------------ wire paths
def test_regular_mode_roundtrip_with_xet_on(hub, tmp_path):
    assert is_xet_available(), "the session runs with Xet on; `regular` uploads must not need it"
    folder = make_folder(tmp_path / "out", version=1)
    pusher = HubPusher(REPO)
    pusher.push(folder, commit_message="first push")
    assert pusher.wait(timeout=60)

    assert without_gitattributes(hub.files(REPO)) == local_files(folder)
    assert not any(blob.lfs for blob in hub.blobs(REPO).values())
    assert hub.requests(kind="preupload") and not hub.requests(kind="lfs_batch")
    assert all(r.authorized for r in hub.requests(kind="commit"))

    downloaded = snapshot_download(REPO, local_dir=tmp_path / "download")
    assert without_gitattributes(local_files(Path(downloaded))) == local_files(folder)


def test_lfs_mode_roundtrip_with_xet_off(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # what HF_HUB_DISABLE_XET=1 sets at import
    hub.upload_mode = "auto"
    folder = make_folder(tmp_path / "out", version=1)
    pusher = HubPusher(REPO)
    pusher.push(folder, commit_message="first push")
    assert pusher.wait(timeout=60)

    blobs = hub.blobs(REPO)
    assert blobs["model.safetensors"].lfs and not blobs["config.json"].lfs
    (upload,) = hub.requests(kind="lfs_upload")
    assert upload.method == "PUT" and not upload.authorized  # the token never goes to the storage URL
    assert hub.requests(kind="lfs_batch") and hub.requests(kind="lfs_verify")

    downloaded = snapshot_download(REPO, cache_dir=tmp_path / "cache")
    assert without_gitattributes(local_files(Path(downloaded))) == local_files(folder)
    (cdn_get,) = hub.requests(kind="cdn")  # /resolve answered 302 to another origin, like the Hub's CDN
    assert not cdn_get.authorized


def test_xet_switch_is_read_at_import(hub, tmp_path, fresh_process):
    hub.upload_mode = "lfs"
    hub.create_repo(REPO)
    folder = make_folder(tmp_path / "out", version=1)
    upload = f"""
        from huggingface_hub import HfApi, constants
        HfApi().upload_folder(repo_id="{REPO}", folder_path="{folder}", commit_message="lfs")
        print(constants.HF_HUB_DISABLE_XET)
        """
    assert fresh_process(upload, env={"HF_HUB_DISABLE_XET": "1"}).strip() == "True"
    assert all(blob.lfs for path, blob in hub.blobs(REPO).items() if path != ".gitattributes")
    assert len(hub.requests(kind="lfs_upload", method="PUT")) == len(local_files(folder))  # one per file

    # With Xet on, an `lfs` answer sends the bytes to Xet storage (which the test Hub does not have).
    with pytest.raises(Exception, match="xet"):
        HfApi().upload_folder(repo_id=REPO, folder_path=folder, commit_message="via xet")
    assert hub.requests(kind="xet_token")


def test_test_hub_checks_the_token(hub):
    assert HfApi().whoami()["name"] == TEST_USER
    with pytest.raises(HfHubHTTPError, match="Invalid user token"):
        HfApi(token="hf_wrongTOKEN0123456789abcdef").whoami()
    with pytest.raises(HfHubHTTPError, match="401"):
        HfApi(token=False).create_repo(
            REPO
        )  # anonymous writes are refused: other tests prove the token is sent
    assert hub.requests(kind="create_repo")[0].status == 401


# ----------------------------------------------------------------------------------- background pushes
def test_push_returns_at_once_and_coalesces_pending_pushes(hub, tmp_path):
    pusher = HubPusher(REPO)
    folder = tmp_path / "out"
    with hub.hold("commit") as gate:
        pusher.push(make_folder(folder, 1), commit_message="push 1")
        assert gate.entered.wait(30)  # the worker is inside push 1's commit, which the Hub holds
        for version in (2, 3, 4):
            pusher.push(make_folder(folder, version), commit_message=f"push {version}")
        expected = local_files(folder)
        # push() returned three times while the first upload was still parked: none of them waited on it
        assert len(hub.commits(REPO)) == 1
        for path in folder.rglob("*"):  # the pushes took snapshots: the folder may go away (rotation)
            if path.is_file():
                path.unlink()
    assert pusher.wait(timeout=60)

    assert [c.title for c in hub.commits(REPO)] == ["push 4", "push 1", "initial commit"]
    assert without_gitattributes(hub.files(REPO)) == expected


def test_immutable_push_links_instead_of_copying(hub, tmp_path):
    """A checkpoint (written once, then only deleted) is hard-linked into the snapshot: no second copy on disk,
    and the upload still lands after rotation removed the checkpoint."""
    pusher = HubPusher(REPO, staging_dir=str(tmp_path))  # the staging folder on the checkpoints' filesystem
    checkpoints = [make_folder(tmp_path / f"step-{version}", version) for version in (1, 2)]
    with hub.hold("commit") as gate:
        pusher.push(checkpoints[0], path_in_repo="last-checkpoint", commit_message="1", immutable=True)
        assert gate.entered.wait(30)
        pusher.push(checkpoints[1], path_in_repo="last-checkpoint", commit_message="2", immutable=True)
        weights = checkpoints[1] / "model.safetensors"
        assert weights.stat().st_nlink == 2  # the file itself, and its link in the pending snapshot
        expected = local_files(checkpoints[1])
        for folder in checkpoints:  # rotation
            shutil.rmtree(folder)
    assert pusher.wait(timeout=60)
    files = without_gitattributes(hub.files(REPO))
    assert {name.removeprefix("last-checkpoint/"): data for name, data in files.items()} == expected


def test_pushes_to_different_paths_are_all_kept(hub, tmp_path):
    pusher = HubPusher(REPO)
    with hub.hold("commit") as gate:
        pusher.push(make_folder(tmp_path / "a", 1), path_in_repo="a", commit_message="a")
        assert gate.entered.wait(30)
        pusher.push(make_folder(tmp_path / "b", 2), path_in_repo="b", commit_message="b")
        pusher.push(make_folder(tmp_path / "c", 3), path_in_repo="c", commit_message="c")
    assert pusher.wait(timeout=60)
    assert [c.title for c in hub.commits(REPO)][:3] == ["c", "b", "a"]
    assert hub.files(REPO)["c/config.json"] == b'{"version": 3}\n'


def test_push_to_a_branch_with_deletions(hub, tmp_path):
    pusher = HubPusher(REPO, revision="run-1")
    folder = make_folder(tmp_path / "out", 1)
    pusher.push(folder, path_in_repo="last-checkpoint", commit_message="one")
    (folder / "nested" / "notes.txt").unlink()
    pusher.push(folder, path_in_repo="last-checkpoint", commit_message="two", delete_patterns="*")
    assert pusher.wait(timeout=60)
    assert set(hub.files(REPO, "run-1")) == {
        ".gitattributes",
        "last-checkpoint/config.json",
        "last-checkpoint/model.safetensors",
    }
    assert set(hub.files(REPO, "main")) == {".gitattributes"}


def test_outage_never_raises_and_wait_recovers(hub, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    hub.fail()  # every request answers HTTP 500
    pusher = HubPusher(REPO)
    pusher.retry_backoff_s, pusher.wait_retries = 0.05, 2
    folder = tmp_path / "out"
    pusher.push(make_folder(folder, 1), commit_message="during outage 1")
    eventually(lambda: pusher.last_error is not None)
    pusher.push(make_folder(folder, 2), commit_message="during outage 2")  # also retries, and replaces push 1
    eventually(lambda: len(hub.requests(kind="create_repo")) >= 2 and pusher.last_error is not None)
    assert not pusher.wait(timeout=30)  # the Hub stays down: wait gives up after its retries, without raising
    assert "500" in pusher.last_error

    hub.recover()
    assert pusher.wait(timeout=60)
    assert [c.title for c in hub.commits(REPO)] == ["during outage 2", "initial commit"]
    assert without_gitattributes(hub.files(REPO)) == local_files(folder)
    assert pusher.last_error is None
    assert "will retry" in caplog.text
    assert TEST_TOKEN not in caplog.text


def test_failed_commit_is_retried_with_xet_off(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(
        constants, "HF_HUB_DISABLE_XET", True
    )  # commits are then not retried by huggingface_hub
    hub.upload_mode = "auto"
    hub.fail(only="commit")
    pusher = HubPusher(REPO)
    pusher.retry_backoff_s = 0.05
    pusher.push(make_folder(tmp_path / "out", 1), commit_message="retried")
    eventually(lambda: pusher.last_error is not None)
    assert hub.requests(kind="commit")[0].status == 500
    hub.recover()
    assert pusher.wait(timeout=60)
    assert hub.commits(REPO)[0].title == "retried"
    assert hub.blobs(REPO)["model.safetensors"].lfs
    assert (
        len(hub.requests(kind="lfs_upload")) == 1
    )  # the retry reused the bytes uploaded before the failed commit


def test_disabled_pusher_does_nothing(hub, tmp_path):
    pusher = HubPusher("not a repo id", enabled=False)
    pusher.push(make_folder(tmp_path / "out", 1), commit_message="ignored")
    assert pusher.wait()
    assert hub.requests() == []


def test_bad_model_id_or_missing_token_fail_fast(monkeypatch):
    with pytest.raises(ValueError, match="user/name"):
        HubPusher("tiny")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ValueError, match="HF_TOKEN"):
        HubPusher(REPO)


# ----------------------------------------------------------------------------------- card, plot, redaction
def test_model_card_metadata_plot_and_no_token(hub, tmp_path):
    history = [{"step": s, "train/loss": 5.0 / s} for s in range(1, 40)] + [{"step": 20, "eval/loss": 0.4}]
    plot = plot_loss_curve(history, tmp_path / "plots" / "loss.png", title="tiny-bert")
    assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    save_dir = tmp_path / "model"
    summary = {
        "steps": 1200,
        "tokens": 2_500_000,
        "time_s": 3725.0,
        "hardware": "2 CPU cores",
        "optim": {"lr": 3e-4},
        "hub": {"token": TEST_TOKEN},
        "note": f"token was {TEST_TOKEN}",
    }
    readme = write_model_card(
        save_dir,
        model_id=f"{TEST_USER}/tiny-bert",
        model_kind="BERT-style encoder",
        summary=summary,
        metrics={"eval/loss": 2.5, "eval/perplexity": 12.18},
        datasets=["wikitext", str(tmp_path / "local.txt")],
        license="apache-2.0",
        tags=["masked-lm"],
        loss_plot=plot,
    )
    text = Path(readme).read_text()
    assert TEST_TOKEN not in text and "hub.token" not in text

    card = ModelCard.load(readme)
    assert (card.data.license, card.data.library_name, card.data.pipeline_tag) == (
        "apache-2.0",
        "transformers",
        "fill-mask",
    )
    assert card.data.datasets == ["wikitext"] and {"kiln", "masked-lm"} <= set(card.data.tags)
    metadata = yaml.safe_load(text.split("---")[1])
    results = metadata["model-index"][0]["results"][0]
    assert metadata["model-index"][0]["name"] == "tiny-bert"
    assert {m["type"]: m["value"] for m in results["metrics"]} == {"loss": 2.5, "perplexity": 12.18}
    assert results["dataset"]["type"] == "wikitext" and results["task"]["type"] == "fill-mask"

    assert "![Training loss](loss.png)" in text and (save_dir / "loss.png").is_file()
    assert "Training time: 1h 02m 05s" in text and "| optim.lr | 0.0003 |" in text
    assert f'AutoModelForMaskedLM.from_pretrained("{TEST_USER}/tiny-bert", trust_remote_code=True)' in text

    pusher = HubPusher(f"{TEST_USER}/tiny-bert")
    pusher.push(save_dir, commit_message="card")
    assert pusher.wait(timeout=60)
    assert hub.requests(kind="validate_yaml")[0].status == 200
    assert not any(TEST_TOKEN.encode() in data for data in hub.files(f"{TEST_USER}/tiny-bert").values())


def test_card_names_the_corpus_without_paths_and_claims_a_license_only_when_given(tmp_path):
    from kiln.hub import corpus_name

    glob = str(tmp_path / "my data" / "stories" / "*.txt")
    assert corpus_name(glob) == "stories/*.txt" and corpus_name(str(tmp_path / "books.txt")) == "books.txt"
    common = dict(
        model_id=None, model_kind="encoder", summary={}, metrics={}, tags=["pretraining"], loss_plot=None
    )
    unlicensed = Path(write_model_card(tmp_path / "a", datasets=[glob], license=None, **common)).read_text()
    assert (
        "with Kiln on stories/\\*.txt." in unlicensed and str(tmp_path) not in unlicensed
    )  # Markdown-escaped
    assert "license" not in yaml.safe_load(unlicensed.split("---")[1])
    assert "## License\n\nNo license was chosen for this model" in unlicensed
    licensed = Path(write_model_card(tmp_path / "b", datasets=[glob], license="mit", **common)).read_text()
    assert (
        yaml.safe_load(licensed.split("---")[1])["license"] == "mit"
        and "No license was chosen" not in licensed
    )


def test_model_card_for_a_fine_tuned_decoder(tmp_path):
    readme = write_model_card(
        tmp_path,
        model_id=None,
        model_kind="GPT-style decoder",
        summary={},
        metrics={},
        datasets=[],
        license="mit",
        tags=[],
        loss_plot=None,
        base_model=f"{TEST_USER}/tiny-gpt",
        task="text-generation",
    )
    card = ModelCard.load(readme)
    assert card.data.base_model == f"{TEST_USER}/tiny-gpt" and card.data.eval_results is None
    assert "AutoModelForCausalLM.from_pretrained(" in card.text and "fine-tuned from" in card.text


def test_plot_needs_losses(tmp_path):
    with pytest.raises(ValueError, match="train/loss"):
        plot_loss_curve([{"step": 1, "lr": 0.1}], tmp_path / "loss.png", title="empty")


def test_redact_masks_every_known_token(monkeypatch, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("hf_fromLOGINfileABCDEFGHIJ123\n")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    HubPusher(REPO, token="plain-secret-value-42")  # tokens handed to a pusher are masked too

    login, other = "hf_fromLOGINfileABCDEFGHIJ123", "hf_" + "x" * 30
    text = f"env {TEST_TOKEN}, login {login}, arg plain-secret-value-42, other {other}"
    assert redact(text) == "env ***, login ***, arg ***, other ***"
    assert redact("hf_hub_download and 12 tokens") == "hf_hub_download and 12 tokens"


# ------------------------------------------------------------------------------------------- resume, loading
def test_download_checkpoint_roundtrip(hub, tmp_path):
    state = tmp_path / "checkpoint-20"
    (state / "pytorch_model_fsdp_0").mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (state / name).write_bytes(os.urandom(64) + name.encode())
    (state / "pytorch_model_fsdp_0" / "shard.distcp").write_bytes(b"shard")
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    pusher = HubPusher(REPO)
    pusher.push(state, path_in_repo="last-checkpoint", commit_message="checkpoint 20")
    pusher.push(tmp_path / "final", commit_message="model")
    assert pusher.wait(timeout=60)

    path = download_checkpoint(f"hub:{REPO}", tmp_path / "resume")
    assert Path(path) == tmp_path / "resume" / "last-checkpoint"
    assert local_files(Path(path)) == local_files(state)
    assert not (tmp_path / "resume" / "config.json").exists()  # only the checkpoint folder is fetched

    hub.create_repo(f"{TEST_USER}/no-state")
    with pytest.raises(FileNotFoundError, match="--hub.strategy checkpoint"):
        download_checkpoint(f"hub:{TEST_USER}/no-state", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="not found"):
        download_checkpoint(f"hub:{TEST_USER}/missing", tmp_path / "x")
    with pytest.raises(ValueError, match="hub:user/name"):
        download_checkpoint(REPO, tmp_path / "x")


@pytest.mark.slow
def test_from_pretrained_in_a_fresh_process(hub, tmp_path, monkeypatch, fresh_process):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    model = BertModel(config)
    model.save_pretrained(tmp_path / "tiny-bert")
    checksum = sum(p.double().sum().item() for p in model.state_dict().values())

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    hub.upload_mode = "auto"  # the weights go through LFS, and download through the CDN redirect
    pusher = HubPusher(f"{TEST_USER}/tiny-bert")
    pusher.push(tmp_path / "tiny-bert", commit_message="tiny bert")
    assert pusher.wait(timeout=60)
    assert hub.blobs(f"{TEST_USER}/tiny-bert")["model.safetensors"].lfs

    load = f"""
        from transformers import AutoModel
        model = AutoModel.from_pretrained("{TEST_USER}/tiny-bert")
        print(type(model).__name__, sum(p.double().sum().item() for p in model.state_dict().values()))
        """
    name, loaded_checksum = fresh_process(load).split()
    assert name == "BertModel" and float(loaded_checksum) == pytest.approx(checksum, rel=1e-9)
    assert any(r.method == "HEAD" and r.path.endswith("/config.json") for r in hub.requests(kind="resolve"))
    assert hub.requests(kind="cdn")


def test_model_card_names_every_hub_base_and_skips_local_folders(tmp_path):
    from types import SimpleNamespace

    from finetune.common import hub_base_models

    local = tmp_path / "encoder"
    local.mkdir()
    started_from = SimpleNamespace(
        encoder_checkpoint=f"{TEST_USER}/tiny-bert", decoder_checkpoint=str(local), from_scratch=False
    )
    assert hub_base_models(started_from) == [f"{TEST_USER}/tiny-bert"]
    assert hub_base_models(SimpleNamespace(checkpoint=str(local))) is None
    assert hub_base_models(SimpleNamespace(checkpoint=f"{TEST_USER}/x", from_scratch=True)) is None

    bases = [f"{TEST_USER}/tiny-bert", f"{TEST_USER}/tiny-gpt"]
    readme = write_model_card(
        tmp_path / "card",
        model_id=None,
        model_kind="encoder-decoder",
        summary={},
        metrics={},
        datasets=[],
        license="mit",
        tags=[],
        loss_plot=None,
        base_model=bases,
        task="text2text-generation",
    )
    card = ModelCard.load(readme)
    assert card.data.base_model == bases
    assert f"fine-tuned from [{bases[0]}](https://huggingface.co/{bases[0]}) and [{bases[1]}]" in card.text

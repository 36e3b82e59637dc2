"""The folders Kiln writes outside the training loop, each through the link-safe writers (issue 52, item 2): the
`hub:` checkpoint download (a fresh staging folder renamed into place), `python -m pretrain.export_onnx`'s OUT
(likewise, refused when it holds anything an export does not write) and GLUE's results and cards (file by file,
never through a link). In each case a user's file is kept and a link's target stays byte for byte as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TEST_USER
from kiln_testing import tiny_encoder_config

from kiln.config import HubConfig, TrainingConfig
from kiln.errors import ConfigError
from kiln.hub import CHECKPOINT_FOLDER
from kiln.safe_write import link_refusal

ONE_PROCESS = SimpleNamespace(
    is_main_process=True,
    is_local_main_process=True,
    num_processes=1,
    process_index=0,
    wait_for_everyone=lambda: None,
)
"""What HubSync.fetch asks of the accelerator, for one process."""


def _outside(where: Path) -> Path:
    """A user's file outside every folder Kiln writes."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("mine, not Kiln's\n")
    return where


def test_a_hub_checkpoint_download_keeps_a_users_file_and_never_writes_through_a_link(hub, tmp_path):
    from huggingface_hub import HfApi

    from kiln.callbacks import HubSync

    repo = f"{TEST_USER}/state"
    hub.create_repo(repo)
    pushed = tmp_path / "pushed" / CHECKPOINT_FOLDER
    pushed.mkdir(parents=True)
    (pushed / "trainer_state.json").write_text('{"global_step": 3}')
    HfApi().upload_folder(repo_id=repo, folder_path=str(pushed.parent), commit_message="state")

    # an earlier download's folder, holding a user's notes and a link planted where the new download writes
    local = tmp_path / "run" / "hub-checkpoint"
    (local / CHECKPOINT_FOLDER).mkdir(parents=True)
    (local / "notes.txt").write_text("my notes\n")
    target = _outside(tmp_path / "outside" / "state.json")
    os.symlink(target, local / CHECKPOINT_FOLDER / "trainer_state.json")

    sync = HubSync(HubConfig(), tokenizer=None)
    path = sync.fetch(ONE_PROCESS, TrainingConfig(output_dir=str(local.parent)), f"hub:{repo}", str(local))
    assert Path(path) == local / CHECKPOINT_FOLDER
    assert json.loads((local / CHECKPOINT_FOLDER / "trainer_state.json").read_text()) == {"global_step": 3}
    assert not (local / CHECKPOINT_FOLDER / "trainer_state.json").is_symlink()
    assert target.read_text() == "mine, not Kiln's\n"  # the link was never written through
    kept = local.with_name("hub-checkpoint.kept")  # the user's file was not deleted with the old download
    assert (kept / "notes.txt").read_text() == "my notes\n"
    assert os.path.islink(kept / CHECKPOINT_FOLDER / "trainer_state.json")

    # a link at the folder itself is one line, on every process, and nothing is downloaded through it
    linked = tmp_path / "linked" / "hub-checkpoint"
    linked.parent.mkdir()
    os.symlink(target.parent, linked)
    with pytest.raises(ConfigError) as refused:
        HubSync(HubConfig(), None).fetch(ONE_PROCESS, TrainingConfig(), f"hub:{repo}", str(linked))
    assert str(refused.value) == link_refusal(linked)
    assert sorted(os.listdir(target.parent)) == ["state.json"]


def _saved_encoder(where: Path) -> Path:
    import pretrain.modeling as modeling

    torch.manual_seed(0)
    modeling.KilnEncoderModel(tiny_encoder_config()).eval().save_pretrained(where)
    return where


def test_onnx_export_replaces_an_earlier_export_whole_and_refuses_a_folder_holding_a_users_files(
    tmp_path, capsys
):
    pytest.importorskip("onnxruntime", reason="pip install onnx onnxruntime (dev extras)")
    from pretrain.export_onnx import main

    model = _saved_encoder(tmp_path / "model")
    out = tmp_path / "onnx"
    main([str(model), str(out)])
    capsys.readouterr()
    # an earlier export in which config.json has become a link to a user's file: the new export replaces the
    # folder whole, the link is removed as a link and its target never written
    target = _outside(tmp_path / "outside" / "config.json")
    (out / "config.json").unlink()
    os.symlink(target, out / "config.json")
    main([str(model), str(out)])
    assert target.read_text() == "mine, not Kiln's\n"
    assert (
        not (out / "config.json").is_symlink()
        and json.loads((out / "config.json").read_text())["hidden_size"]
    )
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".staging")]  # no staging folder left

    for name, folder, message in (
        ("a user's file", out, f"OUT {out} holds notes.txt, which an export does not write"),
        ("the model folder", model, f"OUT {model} is the model folder {model} or holds it"),
    ):
        if name == "a user's file":
            (out / "notes.txt").write_text("my notes\n")
        before = sorted(os.listdir(folder))
        with pytest.raises(SystemExit) as status:
            main([str(model), str(folder)])
        assert status.value.code == 2, name
        assert capsys.readouterr().err.strip().startswith(f"error: {message}"), name
        assert sorted(os.listdir(folder)) == before, name
    assert (out / "notes.txt").read_text() == "my notes\n"


def test_glue_results_and_cards_are_never_written_through_a_link(tmp_path, monkeypatch):
    """The suite's own files, with its classify runs stood in for: the results beside the task folders and the
    table in each final model's card."""
    import finetune.common
    import finetune.glue as glue

    final = tmp_path / "glue" / "rte" / "final"
    final.mkdir(parents=True)
    (final / "README.md").write_text("# model\n\n## Usage\n")
    monkeypatch.setattr(finetune.common, "resolve_start_model", lambda *args, **kwargs: None)
    result = SimpleNamespace(final_dir=final, eval_metrics={"validation": {"accuracy": 0.5}})
    monkeypatch.setattr(glue, "run_classify", lambda args: result)
    argv = ["--checkpoint", str(tmp_path / "ckpt"), "--tasks", "rte", "--output-dir", str(tmp_path / "glue")]

    assert glue.main(argv)["glue_score"] == 50.0
    assert "## GLUE" in (final / "README.md").read_text()
    for planted in (tmp_path / "glue" / "glue_results.md", final / "README.md"):
        target = _outside(tmp_path / "outside" / planted.name)
        planted.unlink()
        os.symlink(target, planted)
        with pytest.raises(ConfigError) as refused:
            glue.main(argv)
        assert str(refused.value) == link_refusal(planted)
        assert target.read_text() == "mine, not Kiln's\n"
        planted.unlink()
        planted.write_text("# model\n")

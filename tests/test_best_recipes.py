"""The shipped best recipes (configs/pretrain/best-30min-*.yaml) are the runs their records measured: resolved, each
config equals the config its BLiMP record's pretraining run saved (docs/results/runs.jsonl), the output folder
aside, and that record's BLiMP score is the one the config's comment quotes."""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BEST = {"best-30min-encoder.yaml": "grid-encoder-mask30", "best-30min-decoder.yaml": "grid-decoder-wsd"}
RESOLVED_AT_START = {"training.save_on_each_node"}
CONTINUING = {"training.output_dir", "training.resume_from_checkpoint"}
"""Where a run writes and whether it continued from its checkpoint (a run stopped and resumed, bit-identically):
not part of the recipe."""
"""Options a config leaves None and the run's start resolves (the saved config holds the value it took)."""


def records(name: str) -> dict[str, dict]:
    rows = [
        json.loads(line) for line in (REPO / "docs/results" / name).read_text().splitlines() if line.strip()
    ]
    return {row.get("tag", row.get("name")): row for row in rows}


def flat(value, prefix=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flat(item, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), value


@pytest.mark.parametrize("config, tag", sorted(BEST.items()))
def test_a_best_recipe_is_the_run_its_record_measured(config, tag):
    import dataclasses

    from kiln.config import build_config
    from pretrain.config import RunConfig

    shipped = dict(
        flat(
            dataclasses.asdict(build_config(RunConfig, ["--config", str(REPO / "configs/pretrain" / config)]))
        )
    )
    ran = dict(flat(records("runs.jsonl")[tag]["config"]))
    compared = [key for key in ran if key.split(".")[0] in ("model", "tokenizer", "data", "training")]
    different = {
        key: (ran[key], shipped.get(key))
        for key in compared
        if key not in CONTINUING
        and ran[key] != shipped.get(key)
        and not (key in RESOLVED_AT_START and shipped.get(key) is None)
    }
    assert not different, different
    blimp = records("blimp.jsonl")[tag]
    assert blimp["pairs"] == 67_000 and blimp["pretraining"] == tag
    comment = (REPO / "configs/pretrain" / config).read_text()
    assert f"BLiMP\n# {100 * blimp['mean']:.1f}" in comment or f"BLiMP {100 * blimp['mean']:.1f}" in re.sub(
        r"\s*\n#\s*", " ", comment
    )

"""The API reference (docs/api/*.md, rendered by mkdocstrings from the docstrings): every public model and config
class, the converters, the ONNX exporter and the engine's entrance (`run_job`, `TrainingJob`, `RunParts`, the
callbacks) has an entry, every entry names something that exists and has a docstring, and the built site shows
those docstrings."""

import ast
import html
import importlib
import re
import subprocess
import sys

import pytest
from kiln_testing import REPO

API = REPO / "docs" / "api"
REQUIRED = {
    "pretrain.modeling": None,  # None: every name in the module's __all__ that is a class
    "kiln.job": ["run_job", "TrainingJob", "RunParts"],
    "kiln.callbacks": ["TrainerCallback", "RunEnd", "BestModel", "FinalExport", "HubSync", "Trackers"],
    "kiln.config": ["TrainingConfig", "LoggingConfig", "HubConfig", "build_config"],
    "pretrain.config": ["RunConfig", "ModelConfig", "TokenizerConfig", "DataConfig", "PretrainEvalConfig"],
    "pretrain.zero_shot": [
        "score_sentences",
        "SentenceScorer",
        "read_blimp",
        "BlimpEvaluation",
        "blimp_accuracies",
    ],
    "pretrain.convert": ["from_transformers", "to_transformers", "convert_checkpoint"],
    "pretrain.export_onnx": ["export"],
}


def entries() -> dict[str, str]:
    """`module.Name` -> the API page that documents it (`::: module.Name` lines)."""
    found = {}
    for page in sorted(API.glob("*.md")):
        for name in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), flags=re.M):
            found[name] = page.name
    return found


def test_every_public_model_class_and_the_engines_entrance_have_an_entry():
    documented = entries()
    for module_name, names in REQUIRED.items():
        module = importlib.import_module(module_name)
        if names is None:
            names = [name for name in module.__all__ if isinstance(getattr(module, name), type)]
        missing = [f"{module_name}.{name}" for name in names if f"{module_name}.{name}" not in documented]
        assert not missing, f"not in docs/api/: {missing}"


def test_every_entry_exists_and_has_a_docstring():
    for dotted, page in entries().items():
        module_name, _, name = dotted.rpartition(".")
        target = getattr(importlib.import_module(module_name), name)
        assert (target.__doc__ or "").strip(), f"{dotted} ({page}) has no docstring"


def test_the_api_pages_are_in_the_navigation_and_the_plugin_in_the_dev_extra():
    text = (REPO / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    for page in API.glob("*.md"):
        assert f"api/{page.name}" in nav, page.name
    assert "- mkdocstrings:" in text
    dev = ast.literal_eval(
        re.search(r"^dev = (\[.*\])$", (REPO / "pyproject.toml").read_text(), flags=re.M)[1]
    )
    assert any(requirement.startswith("mkdocstrings[python]") for requirement in dev)


def plain(text: str) -> str:
    """Text without code marks and brackets (transformers' `[`Name`]` links), spaces collapsed."""
    return " ".join(re.sub(r"[`\[\]]", " ", text).split())


def test_the_built_site_shows_the_docstrings(tmp_path):
    pytest.importorskip("mkdocstrings")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(REPO / "mkdocs.yml"),
            "-d",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def shown(page: str) -> str:
        markup = (tmp_path / "api" / page / "index.html").read_text()
        return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())

    from kiln.job import RunParts, TrainingJob, run_job
    from pretrain.convert import from_transformers
    from pretrain.export_onnx import export
    from pretrain.modeling import KilnDecoderForCausalLM, KilnEncoderConfig

    for page, targets in {
        "engine": [run_job, TrainingJob, RunParts],
        "convert": [from_transformers, export],
        "models": [KilnEncoderConfig, KilnDecoderForCausalLM],
    }.items():
        text = plain(shown(page))
        for target in targets:
            first_words = " ".join(plain(target.__doc__).split()[:6])
            assert first_words in text, (page, target.__name__, first_words)
    # dataclass fields carry their docstrings too
    assert "Peak learning rate." in shown("configs")

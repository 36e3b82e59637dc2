"""One meaning per name: a top-level function or class name is defined in one module of the project.

Two `resolve_checkpoint`s (one picking the checkpoint to resume, one the model to start from) and two
`write_manifest`s (a checkpoint's checksums, a prepared corpus's manifest.json) made a reader guess which one a
call meant. Read from the source with `ast` (nothing is imported). Names that several modules define on purpose,
as one interface, are listed in `SHARED_ON_PURPOSE` with the reason; the hooks a fine-tuning script hands to
`FinetuneTask` under their own names (`read=read`, `head=head`, ...) are that interface by construction, among
themselves (a `read` elsewhere is another name).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("kiln", "pretrain", "finetune", "bench", "experiments", "data")
"""Every folder of project code (the packages and the scripts); tests/ is not the project."""

TASK_SCRIPTS = ("finetune/classify.py", "finetune/seq2seq.py", "finetune/tag.py")

SHARED_ON_PURPOSE: dict[str, tuple[str, ...] | None] = {
    # every script's and `python -m` module's entry point, `main(argv)`: anywhere
    "main": None,
    # experiments/pretrain_transformers.py swaps these two for its own by assignment (`pretrain.run.build_model =
    # build_model`): one contract, the transformers BERT in place of Kiln's model
    "build_model": ("experiments/pretrain_transformers.py", "pretrain/run.py"),
    "export_model": ("experiments/pretrain_transformers.py", "kiln/export.py"),
    # each fine-tuning script's own step behind its `tokenize` / `scoring` hook, called only by that hook
    "tokenize_splits": TASK_SCRIPTS,
    "make_infer": ("finetune/classify.py", "finetune/seq2seq.py"),
    "make_scoring": TASK_SCRIPTS,
    # each benchmark script's steps, as `main` is: `run(args)` -> its report, `print_table(report)`
    "run": ("bench/finetune.py", "bench/inference.py"),
    "print_table": ("bench/inference.py", "bench/throughput.py"),
}


def project_files() -> dict[str, str]:
    """Repository-relative path -> source, for every Python file of the project."""
    return {
        path.relative_to(REPO_ROOT).as_posix(): path.read_text(encoding="utf-8")
        for folder in FOLDERS
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
    }


def task_hooks(tree: ast.Module) -> set[str]:
    """The functions a module hands to `FinetuneTask(...)` as the field of the same name (`read=read`)."""
    return {
        keyword.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "FinetuneTask"
        for keyword in node.keywords
        if isinstance(keyword.value, ast.Name) and keyword.value.id == keyword.arg
    }


def definitions(files: dict[str, str]) -> dict[str, list[str]]:
    """Top-level function or class name -> the files that define it (a re-export is an import, not a def)."""
    defined: dict[str, list[str]] = defaultdict(list)
    for path, source in files.items():
        for node in ast.parse(source, filename=path).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined[node.name].append(path)
    return defined


def defined_twice(files: dict[str, str]) -> dict[str, list[str]]:
    """Names defined in more than one file, less those shared on purpose: where every definition is a
    FinetuneTask hook or in a file SHARED_ON_PURPOSE lists for the name."""
    hooks = {(name, path) for path, source in files.items() for name in task_hooks(ast.parse(source))}
    found = {}
    for name, paths in definitions(files).items():
        allowed = SHARED_ON_PURPOSE.get(name, ())
        if allowed is None or len(paths) < 2:
            continue
        if any(path not in allowed and (name, path) not in hooks for path in paths):
            found[name] = paths
    return found


def test_a_top_level_name_is_defined_in_one_module():
    twice = defined_twice(project_files())
    assert not twice, (
        "names defined in several modules (rename one to say what it holds, or merge them):\n"
        + ("\n".join(f"{name}: {', '.join(paths)}" for name, paths in sorted(twice.items())))
    )


def test_every_name_shared_on_purpose_is_still_shared_where_listed():
    """The allow-list does not outlive its reason: each name is defined in every file listed for it."""
    defined = definitions(project_files())
    for name, paths in SHARED_ON_PURPOSE.items():
        expected = sorted(paths) if paths is not None else None
        assert len(defined.get(name, [])) > 1, f"{name} is no longer shared; take it off SHARED_ON_PURPOSE"
        if expected is not None:
            assert sorted(defined[name]) == expected, (name, defined[name])


def test_the_checker_finds_a_name_defined_twice():
    """The checker itself: a second definition anywhere is reported; `main`, FinetuneTask hooks among themselves
    and a name in the files listed for it are not."""
    one = "def write_manifest(folder):\n    pass\n\n\ndef main():\n    pass\n"
    task = "def read(config):\n    pass\n\n\nTASK = FinetuneTask(read=read)\n"
    files = {
        "kiln/a.py": one,
        "pretrain/b.py": one,
        "finetune/c.py": task,
        "finetune/d.py": task,
        "finetune/classify.py": "def tokenize_splits():\n    pass\n",
        "finetune/tag.py": "class tokenize_splits:\n    pass\n",
    }
    assert defined_twice(files) == {"write_manifest": ["kiln/a.py", "pretrain/b.py"]}
    files.update(
        {"experiments/e.py": "def read():\n    pass\n", "bench/f.py": "def tokenize_splits():\n    pass\n"}
    )
    assert defined_twice(files) == {
        "write_manifest": ["kiln/a.py", "pretrain/b.py"],
        "read": ["finetune/c.py", "finetune/d.py", "experiments/e.py"],
        "tokenize_splits": ["finetune/classify.py", "finetune/tag.py", "bench/f.py"],
    }

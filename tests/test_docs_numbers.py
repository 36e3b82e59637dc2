"""One number, one source: the numbers the README and docs quote from a measurement are those its record gives.

The tables are generated (`bench/report.py` from bench/results/*.json, `experiments/run.py` from
docs/results/runs.jsonl) and compared here with what the pages hold; the numbers the prose quotes are computed
from the same records and looked for, formatted as the page writes them. Change a record and not the page (or
the page and not the record), and this fails.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import statistics
import subprocess
import sys

import pytest
from kiln_testing import REPO

from bench.pages import page_blocks, page_commands


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


report = _load("kiln_bench_report", "bench/report.py")
experiments = _load("kiln_experiments_run", "experiments/run.py")


def bench(name: str):
    return json.loads((REPO / "bench/results" / f"{name}.json").read_text())


def page(path: str) -> str:
    """The page's text with line breaks as spaces (prose wraps anywhere)."""
    return " ".join((REPO / path).read_text().split())


GENERATED = {
    "docs/performance.md": {
        "throughput",
        "mfu",
        "llama",
        "finetune-sst2",
        "finetune-conll2003",
        "padding",
        "inference",
        "modernbert",
        "precision",
        "precision:intel-xeon-amx",
        "precision-step",
        "precision-step:intel-xeon-amx",
    },
    "README.md": {"data-scale", "num-proc", "default-run", "default-run-time"},
    "docs/getting-started.md": {"default-run", "default-run-time", "quick-tier"},
    "docs/data-and-scale.md": {"data-scale"},
    "docs/finetuning.md": {"shipped-commands", "default-run-time"},
    "docs/launching.md": {"threads", "default-run-time"},
    "docs/recipes.md": {"recipe-times"},
    "docs/index.md": {"default-run-time"},
    "docs/pretraining.md": {"page-times:pretraining", "page-times:pretraining:decoder-tiny"},
    "docs/zero-shot.md": {"page-times:zero-shot"},
    "docs/electra.md": {"page-times:electra"},
    "docs/models.md": {"page-times:models"},
    "docs/installation.md": {"page-times:installation"},
    "docs/multi-node.md": {"page-times:multi-node"},
}
AWAITING: dict[str, tuple[str, ...]] = {
    "threads": ("threads-quiet", "threads-busy"),
    "recipe-times": ("recipe-times",),
    **{name: ("page-times",) for name in report.TABLES if name.startswith("page-times:")},
}
"""Tables whose records bench/results/NAME.json are still to be measured (report.MEASURED_BY names the command):
until every one exists, the page's block says what is not measured yet and claims no time; from then on it must be
the generated one."""
DURATION = re.compile(
    r"\b\d+(?:[.,]\d+)?\s*(?:s|sec|seconds?|min|minutes?|h|hours?)\b|\b\d+h\d+m|\b\d+m\d+s|\b\d+:\d\d\b"
)
"""A time as the pages write one: `40 s`, `7 minutes`, `2h10m`, `2m07s`, `1:32`."""


def awaiting(name: str) -> bool:
    return name in AWAITING and not all(
        (REPO / "bench/results" / f"{record}.json").is_file() for record in AWAITING[name]
    )


@pytest.mark.parametrize("where", sorted(GENERATED))
def test_the_benchmark_tables_are_the_ones_the_records_give(where):
    blocks = report.generated_blocks(REPO / where)
    assert set(blocks) == GENERATED[where], sorted(blocks)
    for name, text in blocks.items():
        if awaiting(name):  # not measured yet: the block says so, and claims no time
            assert "Not measured yet" in text and name in report.MEASURED_BY, (where, name)
            assert not DURATION.search(text), (
                f"{where}'s {name} block claims a time ({DURATION.search(text).group()!r}) without its record"
            )
            try:
                report.TABLES[name]()
            except FileNotFoundError:  # a table that is not written until its record exists
                continue
        assert text == report.TABLES[name](), (
            f"{where}'s {name} table: run `python bench/report.py --update {where}`"
        )


def test_the_report_command_rewrites_a_stale_table(tmp_path):
    stale = tmp_path / "page.md"
    stale.write_text(f"Intro.\n\n{report.BEGIN}padding -->\n| old |\n{report.END}\n\nAfter.\n")
    done = subprocess.run(
        [sys.executable, "bench/report.py", "--update", str(stale)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert report.generated_blocks(stale) == {"padding": report.padding_table()}
    assert stale.read_text().startswith("Intro.\n\n") and stale.read_text().endswith("\n\nAfter.\n")


def test_the_report_command_names_the_measurement_a_missing_record_needs(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(f"{report.BEGIN}threads -->\n| old |\n{report.END}\n")
    monkeypatch.setattr(report, "RESULTS", tmp_path / "no-records")
    with pytest.raises(
        SystemExit,
        match=r"threads table needs .*threads-quiet\.json, which is not there: run "
        r"`python bench/threads\.py` and `python bench/threads\.py --busy` first",
    ):
        report.update(page)
    assert page.read_text() == f"{report.BEGIN}threads -->\n| old |\n{report.END}\n"


def test_the_default_run_record_is_the_documented_command_at_the_table_s_steps():
    """bench/results/default-run.json is `accelerate launch pretrain/run.py` with nothing but where to write (one CPU
    process, as on a machine without a GPU), and holds a training row at every step of the table and an evaluation
    at every step but the first."""
    record = bench("default-run")
    assert record["command"].startswith("accelerate launch") and record["command"].endswith(
        " pretrain/run.py"
    )
    assert "--config" not in record["command"] and "--training." not in record["command"]
    for step in record["steps"]:
        logged = [row for row in record["rows"] if row["step"] == step]
        assert any("train/loss" in row for row in logged), step
        assert any("eval/mlm_loss" in row for row in logged) == (step != record["steps"][0]), step
    assert record["wall_s"] > 0 and record["torch"] and record["date_utc"] and record["machine"]["cores"]
    assert (
        0 < record["cpu_s"] and len(record["load_average_before"]) == len(record["load_average_after"]) == 3
    )


def test_the_default_run_has_one_time_on_every_page():
    """The pages that say how long the default run takes say it with the one generated sentence (wall clock,
    CPU-seconds, load), and no other duration for it: no "2-4 minutes", no time in the shipped-commands table."""
    sentence = report.default_run_time()
    record = bench("default-run")
    assert (
        f"**{record['cpu_s']:,.0f} CPU-seconds**" in sentence
        and f"{record['load_average_before'][0]:.1f}" in sentence
    )
    pages = [where for where, names in GENERATED.items() if "default-run-time" in names]
    assert len(pages) == 5
    for where in pages:
        assert report.generated_blocks(REPO / where)["default-run-time"] == sentence, where
        text = page(where)
        assert not re.search(r"\b\d[–-]\d minutes\b", text), where  # a hand-written range
    shipped = report.shipped_commands_table()
    assert "made in" not in shipped and "made first" in shipped


def speed_quotes() -> list[tuple[str, str]]:
    """(page, text) for every speed-up, MFU and padding number the prose quotes from bench/results/."""
    l4 = {p["preset"]: p for p in bench("l4")}
    base, mfu = bench("encoder-l12"), bench("encoder-l12-mfu-b32")
    kiln_mfu, ref_mfu = mfu["models"]["kiln"]["mfu"], mfu["models"]["reference"]["mfu"]
    sst2_mini, sst2_tiny = bench("finetune-sst2-mini"), bench("finetune-sst2")
    conll_mini, conll_tiny = bench("finetune-conll2003-mini"), bench("finetune-conll2003")
    tiny_rate = statistics.median(r["examples_per_s"] for r in sst2_tiny["kiln"])
    padded_rate = statistics.median(r["examples_per_s"] for r in sst2_tiny["variants"]["padded"]["runs"])
    unpad = tiny_rate / padded_rate
    padding = bench("padding-encoder-tiny")
    base_range = (
        f"**{base['models']['kiln']['speedup']:.2f}–{mfu['models']['kiln']['speedup']:.2f}×** at BERT-base"
    )
    mfu_pair = f"≈ {100 * kiln_mfu:.0f}% of the CPU's matmul peak against ≈ {100 * ref_mfu:.0f}%"
    return [
        (
            "README.md",
            f"**{l4['encoder-l4']['models']['kiln']['speedup']:.2f}×** transformers' `BertForPreTraining` at BERT-mini",
        ),
        ("README.md", base_range),
        ("README.md", mfu_pair),
        ("README.md", f"**{sst2_mini['speedup']:.2f}×** transformers' `Trainer` when fine-tuning on SST-2"),
        (
            "docs/performance.md",
            f"Kiln runs at ≈ {100 * kiln_mfu:.0f}% of this CPU's best matmul rate, and transformers at "
            f"≈ {100 * ref_mfu:.0f}%",
        ),
        (
            "docs/performance.md",
            f"The speed-up in this run ({mfu['models']['kiln']['speedup']:.2f}×) is higher than in the "
            f"first table's BERT-base row ({base['models']['kiln']['speedup']:.2f}×)",
        ),
        (
            "docs/performance.md",
            f"Kiln fine-tunes {sst2_mini['speedup']:.2f}× faster at BERT-mini shape and "
            f"{sst2_tiny['speedup']:.2f}× at BERT-tiny",
        ),
        (
            "docs/performance.md",
            f"{padded_rate:,.0f} → {tiny_rate:,.0f} examples/s ({unpad:.2f}×) on SST-2 at BERT-tiny",
        ),
        ("docs/performance.md", f"SST-2's 67% gave {unpad:.2f}×"),
        (
            "docs/performance.md",
            f"{conll_mini['speedup']:.2f}× (rounds {conll_mini['speedup_rounds'][0]:.2f}× and "
            f"{conll_mini['speedup_rounds'][1]:.2f}×); at BERT-tiny it is {conll_tiny['speedup']:.2f}×",
        ),
        (
            "docs/performance.md",
            f"**The default run's batches are {100 * padding['padding_fraction']:.1f}% padding**",
        ),
        ("docs/performance.md", f"at most {padding['unpadding_upper_bound']:.3f}× faster"),
    ]


def results_quotes() -> list[tuple[str, str]]:
    """(page, text) for the recipe's gains the README and docs/results.md quote from docs/results/runs.jsonl."""
    entries = experiments.summary()
    declarations = [
        experiments.load_declaration(REPO / f"experiments/{name}.yaml") for name in ("recipe", "multi30k-de")
    ]
    rows = {}
    for declaration in declarations:
        for row in declaration["table"]:
            pre = experiments._one_group(entries, row["task"], {**row["pretrained"]}, "table")
            scr = experiments._one_group(entries, row["task"], {**row["scratch"]}, "table")
            k = experiments.PERCENT[row["task"]]
            rows[row["task"]] = {
                "delta": k * (pre["dev_mean"] - scr["dev_mean"]),
                "pre": k * pre["dev_mean"],
                "test_delta": k * (pre["test_mean"] - scr["test_mean"]),
            }
    conll, ud, mt = rows["conll2003"], rows["ud-pos"], rows["multi30k"]
    return [
        ("README.md", f"**{conll['delta']:+.2f} entity F1 on CoNLL-2003**"),
        ("README.md", f"**{ud['delta']:+.2f} points on UD POS** ({ud['pre']:.2f}%)"),
        ("README.md", f"**{mt['delta']:+.2f} BLEU on Multi30k**"),
        (
            "docs/results.md",
            f"**{conll['delta']:+.2f} entity F1 on CoNLL-2003** (75.45 vs 62.50 on dev, "
            f"{conll['test_delta']:+.2f} on test) and **{ud['delta']:+.2f} points on UD POS**",
        ),
        ("docs/results.md", f"*CoNLL-2003 against scratch*: {conll['delta']:+.2f} entity F1 on dev"),
        ("docs/results.md", f"and {conll['test_delta']:+.2f} on test"),
        ("docs/results.md", f"**{mt['delta']:+.2f} BLEU** on dev"),
        ("docs/results.md", f"**{mt['test_delta']:+.2f} on `test_2016_flickr`**"),
    ]


@pytest.mark.parametrize("where, text", speed_quotes() + results_quotes())
def test_the_prose_quotes_the_records(where, text):
    assert " ".join(text.split()) in page(where), f"{where} should say {text!r}, which its record gives"


def test_each_gain_is_rounded_one_way_everywhere():
    """The CoNLL gain is +12.96 on every page (the table's delta of the means), never rounded to 12.9, 12.95 or 13.0."""
    for where in ("README.md", "docs/results.md", "docs/index.md"):
        text = page(where)
        for other in ("+12.9 ", "+12.95", "+13.0 ", "+11.99"):
            assert other not in text, (where, other)


def test_model_shapes_are_named_as_they_are():
    """BERT-Tiny is L2/H128 and BERT-mini L4/H256 wherever a page names one with its shape."""
    for where in ["README.md", *[str(p.relative_to(REPO)) for p in sorted((REPO / "docs").rglob("*.md"))]]:
        text = page(where).lower()
        assert "bert-tiny (l4" not in text and "bert-tiny l4" not in text, where
        assert "bert-mini (l2" not in text and "bert-mini l2" not in text, where


@pytest.mark.slow
def test_the_stated_test_count_is_the_collected_one():
    """getting-started.md says how many tests CI runs; `pytest --collect-only` counts them (within 10%): this
    session's own collection when it collected the whole suite (as CI's `pytest -n 2` does in every worker), else a
    fresh `pytest --collect-only`."""
    from conftest import WHOLE_SUITE

    text = page("docs/getting-started.md")
    stated = int(re.search(r"about ([\d,]+) tests", text).group(1).replace(",", ""))
    collected = WHOLE_SUITE.get("collected") or collect_only()
    assert abs(collected - stated) <= 0.1 * collected, (
        f"getting-started.md says about {stated} tests; {collected} collected"
    )


def collect_only() -> int:
    """How many tests `pytest --collect-only` collects, in a fresh process."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = done.stdout.strip().splitlines()[-1]
    assert " tests collected" in last or " test collected" in last, done.stdout[-2000:]
    return int(last.split()[0])


def table_rows(where: str) -> dict[str, list[str]]:
    """A page's table rows by their first cell, cells stripped, the typographic minus read as '-'."""
    rows = {}
    for line in (REPO / where).read_text().replace("−", "-").splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def pretraining_record(tag: str) -> dict:
    rows = [
        json.loads(line)
        for line in (REPO / "docs/results/runs.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return next(
        row for row in rows if row["tag"] == tag
    )  # the first record of that run (a rebuild comes later)


def test_the_compute_curve_table_of_results_md_is_the_records():
    declaration = experiments.load_declaration(REPO / "experiments/compute-curve.yaml")
    (curve,) = declaration["curves"]
    points = experiments.curve_points(curve, experiments.summary())
    rows = table_rows("docs/results.md")
    labels = {7.5: "7.5 min", 15: "15 min", 30: "30 min (the recipe)", 60: "60 min"}
    for init, minutes in curve["minutes"].items():
        cells = rows[labels[minutes]]
        record = pretraining_record(init)
        assert (
            cells[0] == f"{record['steps']:,}" and cells[2] == f"{record['eval_last']['eval/mlm_loss']:.2f}"
        ), cells
        assert cells[1] == f"{record['steps'] * 32 * 64 / 1e6:.1f}M", cells  # batch 32 x 64 tokens
        for cell, point in zip(cells[3:], [p for p in points if p["x"] == minutes]):
            spread = f" ± {100 * point['std']:.2f}" if point["n"] > 1 else ""
            assert cell.replace(" seeds)", ")") == f"{100 * point['mean']:+.2f}{spread} ({point['n']})", (
                minutes,
                cell,
            )


def test_the_label_curve_table_of_results_md_is_the_records():
    declaration = experiments.load_declaration(REPO / "experiments/sst2-labels.yaml")
    (curve,) = declaration["curves"]
    points = experiments.curve_points(curve, experiments.summary())
    rows = table_rows("docs/results.md")
    for size in curve["sizes"]:
        at = {p["line"]: p for p in points if p["x"] == size}
        full_pre, full_scr, pre, scr = (at[line["label"]] for line in curve["lines"])
        cells = rows[f"{size:,}" if size != curve["full"] else f"{size:,} (all)"]
        assert cells[0] == f"{100 * pre['mean']:.2f} ± {100 * pre['std']:.2f}", (size, cells)
        assert cells[1] == f"{100 * scr['mean']:.2f} ± {100 * scr['std']:.2f}", (size, cells)
        assert cells[2] == f"{100 * (pre['mean'] - scr['mean']):+.2f}", (size, cells)
        if size != curve["full"]:
            assert cells[3] == f"{100 * full_pre['mean']:.2f} vs {100 * full_scr['mean']:.2f}", (size, cells)


def test_the_sst2_levers_table_of_results_md_is_the_records():
    """docs/results.md's levers block is `experiments/run.py levers experiments/sst2-levers.yaml` of the records, and
    the recipe table's block beside it is still the recipe's."""
    where = REPO / "docs/results.md"
    assert f"{experiments.LEVERS_BEGIN} experiments/sst2-levers.yaml -->\n" in where.read_text()
    declaration = experiments.load_declaration(REPO / "experiments/sst2-levers.yaml")
    wanted = experiments.levers_table(declaration, where="experiments/sst2-levers.yaml")
    assert experiments.generated_block(where, experiments.LEVERS_BEGIN) == wanted, (
        "run `python experiments/run.py levers experiments/sst2-levers.yaml --update docs/results.md`"
    )
    assert experiments.generated_block(where).startswith("| task (metric) | pretrained | scratch |")
    rows = table_rows("docs/results.md")
    assert rows["the recipe: BERT-Tiny MLM+SOP, 30 min"][3] == f"{page_delta('sst2'):+.2f}"


def page_delta(task: str) -> float:
    """The recipe table's dev difference for `task` (recipe.yaml), from the records."""
    entries = experiments.summary()
    (row,) = [
        row
        for row in experiments.load_declaration(REPO / "experiments/recipe.yaml")["table"]
        if row["task"] == task
    ]
    pre = experiments._one_group(entries, task, row["pretrained"], "table")
    scr = experiments._one_group(entries, task, row["scratch"], "table")
    return experiments.PERCENT[task] * (pre["dev_mean"] - scr["dev_mean"])


def test_the_recipe_s_wall_clock_is_its_record():
    minutes = round(pretraining_record("encoder-30min-sop13k")["wall_s"] / 60)
    assert f"a {minutes}-minute CPU pretraining run" in page("README.md")
    assert f"**{minutes} minutes end to end**" in page("docs/results.md")


def test_every_levers_block_of_the_docs_is_its_declaration_s_records():
    """Every `<!-- generated by experiments/run.py levers X.yaml -->` block on a docs page (ELECTRA's own settings,
    task-adaptive pretraining, larger shapes, the SST-2 levers) is `experiments/run.py levers X.yaml` of the records."""
    import re

    blocks = 0
    for page in sorted((REPO / "docs").rglob("*.md")):
        for name in re.findall(re.escape(experiments.LEVERS_BEGIN) + r" (\S+) -->", page.read_text()):
            declaration = experiments.load_declaration(REPO / name)
            wanted = experiments.levers_table(declaration, where=name)
            found = experiments.generated_block(page, f"{experiments.LEVERS_BEGIN} {name} ")
            assert found == wanted, (
                f"run `python experiments/run.py levers {name} --update {page.relative_to(REPO)}`"
            )
            blocks += 1
    assert blocks >= 2


def test_the_precision_prose_quotes_its_record():
    record = bench("precision-end-to-end")
    text = page("docs/performance.md")
    fp32, bf16 = (record["matmul_gflops_one_thread"][dtype][-1] for dtype in ("fp32", "bf16"))
    assert f"{fp32} GFLOP/s in fp32 and {bf16} GFLOP/s in bf16" in text
    assert f"load {record['loadavg_at_start'][0]} at the start" in text
    assert record["cpu"] in text and "avx512_bf16" in record["bf16_units"]


def test_the_step_precision_prose_quotes_its_record():
    """The prose under the step-level table: its load, and the gains it sets against the end-to-end ones and
    against autocast, as the records give them."""
    step, run = bench("precision-amd-epyc-bf16"), bench("precision-end-to-end")
    text = page("docs/performance.md")
    assert (
        f"load {step['loadavg_at_start'][0]} at the start and {step['loadavg_at_end'][0]} at the end" in text
    )
    presets = step["presets"]
    llama = presets["llama-tiny"]["bf16-autocast"]["speedup_over_fp32"]
    modern = presets["modernbert-tiny"]["bf16-autocast"]["speedup_over_fp32"]
    whole = {
        name: run["runs"][f"{name}/bf16"]["tokens_per_s_median"]
        / run["runs"][f"{name}/fp32"]["tokens_per_s_median"]
        for name in ("decoder-30min-llama", "encoder-30min-modern")
    }
    assert f"{llama:.2f}× against {whole['decoder-30min-llama']:.2f}× for the llama decoder" in text
    assert f"{modern:.2f}× against {whole['encoder-30min-modern']:.2f}× for" in text
    beyond = {
        name: row["bf16-weights"]["speedup_over_fp32"] / row["bf16-autocast"]["speedup_over_fp32"] - 1
        for name, row in presets.items()
    }
    base = max(value for name, value in beyond.items() if name.endswith("-base"))
    tiny = [value for name, value in beyond.items() if name.endswith("-tiny")]
    assert f"at most {base:.0%} over autocast at base shapes" in text
    assert f"and {max(0.0, min(tiny)) * 100:.0f}–{max(tiny):.0%} at the" in text


def test_the_amx_precision_prose_quotes_its_records():
    """The Xeon paragraph: its load, matmul peaks, the step's best share of the bf16 peak and that peak's range, the
    end-to-end gains set against the EPYC's, and what the whole model in bf16 adds, as its records give them."""
    run, step, epyc = (
        bench("precision-end-to-end-intel-xeon-amx"),
        bench("precision-intel-xeon-amx"),
        bench("precision-end-to-end"),
    )
    text = page("docs/performance.md")
    assert "amx_bf16" in run["bf16_units"] and "Xeon" in run["cpu"]
    assert f"load {run['loadavg_at_start'][0]} at the start; records" in text
    fp32, bf16 = (run["matmul_gflops_one_thread"][dtype][-1] for dtype in ("fp32", "bf16"))
    assert f"at {bf16} GFLOP/s on one thread, {bf16 / fp32:.1f}× its {fp32} GFLOP/s in" in text.replace(
        "\n", " "
    )
    presets = step["presets"]
    best_share = max(row["bf16-autocast"]["share_of_own_peak"] for row in presets.values())
    peaks = [row["matmul_gflops"]["bf16"] for row in presets.values()]
    flat = " ".join(text.split())
    assert f"no step reaches more than {best_share:.0%} of the bf16 peak" in flat
    assert f"ranged from {min(peaks):.0f} to {max(peaks):.0f} GFLOP/s" in flat

    def gain(record, name):
        return (
            record["runs"][f"{name}/bf16"]["tokens_per_s_median"]
            / record["runs"][f"{name}/fp32"]["tokens_per_s_median"]
        )

    decoder, encoder = "decoder-30min-llama", "encoder-30min-modern"
    assert (
        f"width 256 gains {gain(run, decoder):.2f}×, close to the EPYC's {gain(epyc, decoder):.2f}×" in flat
    )
    assert f"({gain(run, encoder):.2f}×, against the EPYC's {gain(epyc, encoder):.2f}×)" in flat
    assert f"{presets['bert-base']['bf16-autocast']['speedup_over_fp32']:.2f}× for BERT-base's step" in flat
    beyond = {
        name: row["bf16-weights"]["speedup_over_fp32"] / row["bf16-autocast"]["speedup_over_fp32"] - 1
        for name, row in presets.items()
    }
    top = max(beyond, key=beyond.get)
    assert top == "gpt2-base" and f"up to {beyond[top]:.0%} over autocast here (GPT-2-base)" in flat
    assert f"the recipe ships ({beyond['llama-tiny']:.1%})" in flat


page_times = _load("kiln_bench_page_times_for_docs", "bench/page_times.py")
shipped = _load("kiln_bench_shipped_commands_for_docs", "bench/shipped_commands.py")
recipe_times = _load("kiln_bench_recipe_times_for_docs", "bench/recipe_times.py")
default_run = _load("kiln_bench_default_run_for_docs", "bench/default_run.py")

PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
NEAR = 700
"""How close to its bash block (characters before its start or after its end) a page says why a command is not
timed."""


def the_run(command: str) -> str:
    """A command as the run it makes: `kiln-launch` is `accelerate launch` with the same arguments, and the
    launcher's one-CPU-process flags (`--num_processes 1 --cpu`, a thread count) change its speed, not the run."""
    words = shlex.split(command)
    if words[0] == "kiln-launch":
        words = ["accelerate", "launch", *words[1:]]
    kept, skip = [], 0
    for i, word in enumerate(words):
        if skip:
            skip -= 1
        elif word == "--cpu":
            continue
        elif word in ("--num_processes", "--num_cpu_threads_per_process") and words[i + 1] == "1":
            skip = 1
        else:
            kept.append(word)
    return " ".join(kept)


def timed_on(where: str) -> dict[str, str]:
    """The runs the generated blocks of page `where` give the time of (the run -> the block): each block's
    measurement script names the commands it runs, read from the same page or declared in the script."""
    blocks = report.generated_blocks(REPO / where)
    timed = {}
    if "default-run-time" in blocks:
        timed[the_run(" ".join(default_run.COMMAND))] = "default-run-time"
    if "shipped-commands" in blocks:
        for row in shipped.ROWS:
            timed[the_run(shipped.documented(row.script, row.args))] = "shipped-commands"
    if "recipe-times" in blocks:
        for pair in recipe_times.recipes():
            timed[the_run(pair["first_try"])] = timed[the_run(pair["full"])] = "recipe-times"
    for name in blocks:
        if name.startswith("page-times:") and name.count(":") == 1:  # a page's table (not its paragraphs)
            key = name.split(":")[1]
            assert page_times.PAGES[key] == where, (name, where)
            for command in page_times.page_plan(key):
                timed[the_run(command)] = name
    return timed


def why_not_timed(where: str, command: str) -> str | None:
    """Why a documented command of `where` states no time of its own, or None (it must then be timed)."""
    command = page_times.collapsed(command)
    if command in page_times.NOT_HERE:
        needs, said = page_times.NOT_HERE[command]
        assert where in said, f"{where}: `{command}` is in NOT_HERE without the words {where} says it with"
        return f"needs {needs}"
    quick = page_times.under_10_s(command)
    if quick:
        return f"under 10 s: {quick}"
    if page_times.MEASUREMENT.match(command):
        return "a benchmark: the page's table is its record"
    return None


@pytest.mark.parametrize("where", PAGES)
def test_every_documented_command_is_timed_quick_or_says_why_it_cannot_be_timed(where):
    """Every command of the page's bash blocks is one of: timed by a record that a generated block of this page
    renders; a command of seconds (page_times.UNDER_10_S: it trains, evaluates and downloads nothing); a
    benchmark script whose record the page's tables are; or in page_times.NOT_HERE (the Hub, GPUs, files the user
    brings, hours), its page saying so next to the command."""
    timed = timed_on(where)
    untimed = []
    for command in page_commands(REPO / where):
        if the_run(command) in timed:
            assert page_times.collapsed(command) not in page_times.NOT_HERE, (where, command)
            continue
        if why_not_timed(where, command) is None:
            untimed.append(command)
    assert not untimed, (
        f"{where}: these commands state no time: time them (bench/page_times.py) or say why not "
        f"(page_times.NOT_HERE, with the words on the page):\n" + "\n".join(untimed)
    )


@pytest.mark.parametrize("where", PAGES)
def test_the_page_says_why_a_command_is_not_timed_next_to_it(where):
    """A command of NOT_HERE has its reason in the page's words within NEAR characters of its bash block."""
    text = (REPO / where).read_text()
    for start, end, commands in page_blocks(REPO / where):
        around = " ".join(text[max(0, start - NEAR) : end + NEAR].split())
        for command in commands:
            entry = page_times.NOT_HERE.get(page_times.collapsed(command))
            if entry:
                said = " ".join(entry[1][where].split())
                assert said in around, f"{where}: `{command}` needs {entry[0]}; say so next to it ({said!r})"


def test_every_command_not_timed_is_a_command_of_the_pages_that_name_it():
    everywhere = {where: {page_times.collapsed(c) for c in page_commands(REPO / where)} for where in PAGES}
    for command, (needs, said) in page_times.NOT_HERE.items():
        assert needs and said, command
        for where in said:
            assert command in everywhere[where], f"NOT_HERE: {where} has no command `{command}`"
    for name, where in page_times.PAGES.items():
        assert page_times.page_plan(name), f"{where} has nothing to time"
        assert f"page-times:{name}" in report.generated_blocks(REPO / where), where


def test_the_page_times_record_holds_each_page_s_commands_as_the_page_gives_them():
    """Once measured, a page's entry in bench/results/page-times.json is the page's timed commands in page order:
    a command changed on the page and not measured again fails here."""
    path = REPO / "bench/results/page-times.json"
    if not path.is_file():
        pytest.skip("bench/results/page-times.json is not measured yet (`python bench/page_times.py`)")
    record = json.loads(path.read_text())
    assert not record["quick"]
    for name, entry in record["pages"].items():
        assert entry["page"] == page_times.PAGES[name]
        assert [row["command"] for row in entry["commands"]] == page_times.page_plan(name), name
        decoder = [row for row in entry["commands"] if row["command"] in page_times.SAMPLES]
        assert all(row["printed"]["sample"]["text"] for row in decoder), name

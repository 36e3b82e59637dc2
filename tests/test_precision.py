"""The precision a run trains in when the user names none (kiln.precision): bf16 on a CPU with bf16 units for a model
wide enough, fp32 everywhere else, an explicit choice always winning, a resume keeping its run's precision, and a
warning where bf16 is asked for on a CPU that would emulate it."""

import pytest
import yaml

from kiln.precision import MIN_BF16_WIDTH, choose_precision, cpu_bf16_units
from tests.kiln_testing import run

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512bw {extra}

"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 {extra}
"""


@pytest.mark.parametrize(
    "text, units",
    [
        (X86_CPUINFO.format(extra="avx512_bf16 avx512_vnni"), ("avx512_bf16",)),
        (X86_CPUINFO.format(extra="amx_bf16 amx_tile avx512_bf16"), ("amx_bf16", "avx512_bf16")),
        (X86_CPUINFO.format(extra="avx512_vnni"), ()),  # AVX-512 without its BF16 extension emulates bf16
        (ARM_CPUINFO.format(extra="bf16 i8mm"), ("bf16",)),
        (ARM_CPUINFO.format(extra="i8mm"), ()),
    ],
)
def test_bf16_units_are_read_from_the_cpu_flags(tmp_path, text, units):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    assert cpu_bf16_units(str(cpuinfo)) == units


def test_an_unreadable_cpuinfo_means_no_units(tmp_path):
    assert cpu_bf16_units(str(tmp_path / "missing")) == ()


WIDE, NARROW = MIN_BF16_WIDTH, MIN_BF16_WIDTH // 2
UNITS = ("avx512_bf16",)


@pytest.fixture(autouse=True)
def launched_without_precision(monkeypatch):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)


def test_bf16_is_the_default_only_on_a_cpu_with_units_for_a_wide_model():
    precision, line, warn = choose_precision(None, WIDE, None, on_cpu=True, units=UNITS)
    assert precision == "bf16" and line.startswith("precision: bf16") and "avx512_bf16" in line and not warn
    assert "--training.mixed_precision no" in line  # the way back to fp32 is named
    assert choose_precision(None, NARROW, None, on_cpu=True, units=UNITS) == (None, None, False)
    assert choose_precision(None, WIDE, None, on_cpu=True, units=()) == (None, None, False)
    assert choose_precision(None, WIDE, None, on_cpu=False, units=UNITS) == (None, None, False)  # a GPU's own
    assert choose_precision(None, None, None, on_cpu=True, units=UNITS) == (
        None,
        None,
        False,
    )  # width unknown


def test_an_explicit_precision_wins_and_bf16_without_units_is_warned():
    assert choose_precision("no", WIDE, None, on_cpu=True, units=UNITS) == ("no", None, False)
    precision, line, warn = choose_precision("bf16", NARROW, None, on_cpu=True, units=())
    assert precision == "bf16" and warn and "24x slower" in line and "--training.mixed_precision no" in line
    assert choose_precision("bf16", NARROW, None, on_cpu=True, units=UNITS) == ("bf16", None, False)


def test_a_precision_accelerate_was_launched_with_counts_as_given(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    precision, line, warn = choose_precision(None, NARROW, None, on_cpu=True, units=())
    assert precision == "bf16" and warn and "24x slower" in line
    # accelerate's own default ("no", also what `accelerate config default` writes) leaves the choice to Kiln
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert choose_precision(None, WIDE, None, on_cpu=True, units=UNITS)[0] == "bf16"


def test_a_resume_keeps_the_precision_its_run_started_with():
    fp32_run = {"training": {"mixed_precision": "no"}}
    bf16_run = {"training": {"mixed_precision": "bf16"}}
    assert choose_precision(None, WIDE, fp32_run, on_cpu=True, units=UNITS) == ("no", None, False)
    precision, line, warn = choose_precision(None, NARROW, bf16_run, on_cpu=True, units=UNITS)
    assert precision == "bf16" and "as the resumed run started" in line and not warn
    precision, line, warn = choose_precision(None, WIDE, bf16_run, on_cpu=True, units=())
    assert precision == "bf16" and warn and "24x slower" in line
    assert choose_precision("no", WIDE, bf16_run, on_cpu=True, units=()) == ("no", None, False)


WIDE_DEBUG = ["--model.hidden_size", str(WIDE), "--model.num_attention_heads", "2"]
WIDE_DEBUG += ["--model.intermediate_size", "64", "--training.max_steps", "2", "--training.save_steps", "2"]


def saved_precision(folder) -> str:
    return yaml.safe_load((folder / "config.yaml").read_text())["training"]["mixed_precision"]


def test_a_pretraining_run_trains_in_the_chosen_precision_and_resumes_in_it(tmp_path, monkeypatch, caplog):
    """Through the entry point: the debug run at width 256 on a CPU announcing bf16 units trains in bf16 (the
    accelerator's own setting, recorded in config.yaml) and says so once; resumed on a CPU without them, it
    continues in bf16 with a warning; the same run at the debug width stays fp32 and says nothing."""
    import kiln.precision

    monkeypatch.setattr(kiln.precision, "cpu_bf16_units", lambda: UNITS)
    monkeypatch.setattr(kiln.precision, "trains_on_cpu", lambda: True)
    caplog.set_level("INFO", logger="kiln")
    wide = tmp_path / "wide"
    run(wide, *WIDE_DEBUG)
    assert saved_precision(wide) == "bf16"
    assert sum(r.getMessage().startswith("precision: bf16 (") for r in caplog.records) == 1

    caplog.clear()
    monkeypatch.setattr(kiln.precision, "cpu_bf16_units", lambda: ())
    resume = ["--training.resume_from_checkpoint", "latest", "--training.allow_config_change"]
    run(wide, *WIDE_DEBUG, "--training.max_steps", "4", *resume)
    warnings = [r for r in caplog.records if "as the resumed run started" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert saved_precision(wide) == "bf16"

    caplog.clear()
    monkeypatch.setattr(kiln.precision, "cpu_bf16_units", lambda: UNITS)
    narrow = tmp_path / "narrow"
    run(narrow, "--training.max_steps", "2")
    assert saved_precision(narrow) == "no"
    assert not [r for r in caplog.records if r.getMessage().startswith("precision:")]

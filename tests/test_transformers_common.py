"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) run on every Kiln class.

The mixins are not in the transformers wheel; they ship in its source distribution on PyPI. This module fetches
that sdist for the installed version at test time (`pip download --no-deps --no-binary :all:`), unpacks the two
common-test files into a cache (`$KILN_HF_TESTS_CACHE`, default `~/.cache/kiln/transformers-tests/<version>`) and
imports them from there; no transformers code is committed here. Without network (or PyPI) the module is skipped
with the reason on a local run, and fails under CI (`CI=true`), where a skip would hide 316 tests.

The sdist's `tests/test_modeling_common.py` imports three sibling modules the sdist does not contain
(`generation/test_utils.py`, `exporters/test_export.py`, `utils/test_configuration_utils.py`); the adapter puts
small stand-ins of its own in their place (`_STANDINS`). So `GenerationTesterMixin` and `ExportTesterMixin` do not
run here (their code is not published for 5.23.0); Kiln's generation is tested in `test_modeling_decoder.py`,
`test_ecosystem.py` and `test_dropin.py` instead.

Kiln's classes are made to look like their BERT / GPT-2 twins to the mixin: for this module only, their names are
added to transformers' `MODEL_FOR_*_MAPPING_NAMES` tables (under the Kiln model types), which the mixin reads to
decide which labels a class takes and which tests apply (e.g. the bare models are not trained). The tables are
restored afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
from pathlib import Path

import pytest
import torch
import transformers

import pretrain.modeling  # noqa: F401  (registers the Auto classes)
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnDecoderForSequenceClassification,
    KilnDecoderForTokenClassification,
    KilnDecoderModel,
    KilnEncoderConfig,
    KilnEncoderForMaskedLM,
    KilnEncoderForMultipleChoice,
    KilnEncoderForNextSentencePrediction,
    KilnEncoderForPreTraining,
    KilnEncoderForQuestionAnswering,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
    KilnEncoderModel,
)

VERSION = transformers.__version__
PACKAGE = "kiln_hf_common_tests"  # the unpacked files' package name (they use relative imports)
CACHE = (
    Path(os.environ.get("KILN_HF_TESTS_CACHE", Path.home() / ".cache" / "kiln" / "transformers-tests"))
    / VERSION
)
FILES = ("tests/test_modeling_common.py", "tests/test_configuration_common.py")
_STANDINS = {
    "__init__.py": "",
    # not in the sdist: `ModelTesterMixin` subclasses this one, whose tests (torch.export/ONNX) are unpublished
    "exporters/__init__.py": "",
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    # not in the sdist: the generate tests themselves are unpublished; the mixin only checks the inheritance
    "generation/__init__.py": "",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    # not in the sdist: `ConfigTester.check_config_arguments_init` sets these base-config fields to non-defaults
    "utils/__init__.py": "",
    "utils/test_configuration_utils.py": (
        "config_common_kwargs = {\n"
        "    'output_hidden_states': True,\n"
        "    'return_dict': False,\n"
        "    'dtype': 'float16',\n"
        "    'chunk_size_feed_forward': 4,\n"
        "    'architectures': ['KilnCommonTest'],\n"
        "    'problem_type': 'regression',\n"
        "}\n"
    ),
}


def _fetch() -> Path:
    """The cache folder holding `PACKAGE`, downloading and unpacking the sdist on first use."""
    package = CACHE / PACKAGE
    if all((package / Path(name).name).is_file() for name in FILES):
        return CACHE
    from filelock import FileLock

    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / ".lock"), timeout=600):  # pytest-xdist workers collect this module together
        if all((package / Path(name).name).is_file() for name in FILES):
            return CACHE
        with tempfile.TemporaryDirectory() as download:
            command = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                "--disable-pip-version-check",
                "--quiet",
                f"transformers=={VERSION}",
                "-d",
                download,
            ]
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
            (sdist,) = Path(download).glob("transformers-*.tar.gz")
            staging = Path(tempfile.mkdtemp(dir=CACHE))
            with tarfile.open(sdist) as archive:
                for name in FILES:
                    member = archive.extractfile(f"transformers-{VERSION}/{name}")
                    (staging / Path(name).name).write_bytes(member.read())
            for name, text in _STANDINS.items():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_text(text)
            if package.exists():
                import shutil

                shutil.rmtree(package)
            staging.rename(package)  # complete or absent: a half-unpacked cache is never seen
    return CACHE


try:
    sys.path.insert(0, str(_fetch()))
    from kiln_hf_common_tests.test_configuration_common import ConfigTester
    from kiln_hf_common_tests.test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor
except Exception as error:  # no network / no PyPI / an sdist without the files
    detail = getattr(error, "stderr", None) or error
    reason = (
        f"transformers {VERSION}'s common model tests could not be fetched from its PyPI sdist "
        f"(pip download --no-deps --no-binary :all: transformers=={VERSION}): {str(detail).strip()[:300]}"
    )
    if os.environ.get("CI", "").strip().lower() in (
        "1",
        "true",
        "yes",
    ):  # CI must run them: a red build, not a skip
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # a local offline run: say why, do not fail
from kiln_hf_common_tests.generation.test_utils import GenerationTesterMixin  # noqa: E402

# ---------------------------------------------------------------------------------- Kiln as BERT / GPT-2 twins
from transformers.models.auto import modeling_auto  # noqa: E402

# transformers' table -> the Kiln class of each model type that belongs in it
_TWIN_TABLES = {
    "MODEL_MAPPING_NAMES": (KilnEncoderModel, KilnDecoderModel),
    "MODEL_FOR_PRETRAINING_MAPPING_NAMES": (KilnEncoderForPreTraining, KilnDecoderForCausalLM),
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": (KilnEncoderForMaskedLM, None),
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": (None, KilnDecoderForCausalLM),
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": (
        KilnEncoderForSequenceClassification,
        KilnDecoderForSequenceClassification,
    ),
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": (
        KilnEncoderForTokenClassification,
        KilnDecoderForTokenClassification,
    ),
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": (KilnEncoderForMultipleChoice, None),
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": (KilnEncoderForQuestionAnswering, None),
    "MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES": (KilnEncoderForNextSentencePrediction, None),
}


_VERBOSITY = []


def setup_module(module):
    # some mixin tests read transformers' warnings (e.g. "Reinit due to size mismatch"): whatever verbosity an
    # earlier test module left behind in this process, run at transformers' default, and restore it afterwards
    _VERBOSITY.append(transformers.logging.get_verbosity())
    transformers.logging.set_verbosity_warning()
    for table_name, (encoder_class, decoder_class) in _TWIN_TABLES.items():
        table = getattr(modeling_auto, table_name)
        for model_type, model_class in (("kiln_encoder", encoder_class), ("kiln_decoder", decoder_class)):
            if model_class is not None:
                table[model_type] = model_class.__name__


def teardown_module(module):
    if _VERBOSITY:
        transformers.logging.set_verbosity(_VERBOSITY.pop())
    for table_name in _TWIN_TABLES:
        table = getattr(modeling_auto, table_name)
        for model_type in ("kiln_encoder", "kiln_decoder"):
            table.pop(model_type, None)


# ------------------------------------------------------------------------------------------------ model testers
class KilnEncoderTester:
    """BERT-shaped tiny inputs (as transformers' BertModelTester builds them)."""

    def __init__(self, parent, batch_size=13, seq_length=7):
        self.parent = parent
        self.batch_size, self.seq_length = batch_size, seq_length
        self.is_training = True
        self.vocab_size, self.hidden_size = 99, 32
        self.num_hidden_layers, self.num_attention_heads, self.intermediate_size = 2, 4, 37
        self.type_vocab_size, self.num_labels, self.num_choices = 16, 3, 4

    def get_config(self):
        return KilnEncoderConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            max_position_embeddings=512,
            type_vocab_size=self.type_vocab_size,
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.tril(torch.ones_like(input_ids))  # every row has its own length
        token_type_ids = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        inputs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        return self.get_config(), inputs


class KilnDecoderTester(KilnEncoderTester):
    """GPT-2-shaped tiny inputs (as transformers' GPT2ModelTester builds them)."""

    def get_config(self):
        return KilnDecoderConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            activation_function="gelu",
            resid_pdrop=0.1,
            embd_pdrop=0.1,
            attn_pdrop=0.1,
            max_position_embeddings=512,
            bos_token_id=self.vocab_size - 1,
            eos_token_id=self.vocab_size - 1,
            pad_token_id=self.vocab_size - 1,
        )

    def prepare_config_and_inputs_for_common(self):
        config = self.get_config()
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 1)  # no pad token inside
        attention_mask = torch.tril(torch.ones_like(input_ids)).flip(-1)  # left padding, as for generation
        token_type_ids = ids_tensor(
            [self.batch_size, self.seq_length], self.type_vocab_size
        )  # as GPT-2's tester
        inputs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        return config, inputs


class KilnLlamaDecoderTester(KilnDecoderTester):
    """The decoder's `llama` preset (rotary positions, SwiGLU, RMSNorm, no biases, 2 key/value heads), with the
    GPT-2 tester's inputs (left padding, token type ids)."""

    def get_config(self):
        config = KilnDecoderConfig(
            preset="llama",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=2,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=512,
            bos_token_id=self.vocab_size - 1,
            eos_token_id=self.vocab_size - 1,
            pad_token_id=self.vocab_size - 1,
        )
        assert (
            config.num_attention_heads % 2 == 0 and config.num_attention_heads > 2
        )  # grouped, not multi-query
        return config


def _labels_for(model_class, inputs, tester):
    """The labels each Kiln head takes (BertModelTest/GPT2ModelTest's `_prepare_for_class`, return_labels=True)."""
    batch_size, device = tester.batch_size, torch_device()
    seq_length = inputs["input_ids"].shape[-1]
    zeros = dict(dtype=torch.long, device=device)
    if model_class in (KilnEncoderForPreTraining,):
        return {
            "labels": torch.zeros((batch_size, seq_length), **zeros),
            "next_sentence_label": torch.zeros(batch_size, **zeros),
        }
    if model_class in (
        KilnEncoderForMaskedLM,
        KilnDecoderForCausalLM,
        KilnEncoderForTokenClassification,
        KilnDecoderForTokenClassification,
    ):
        return {"labels": torch.zeros((batch_size, seq_length), **zeros)}
    if model_class in (
        KilnEncoderForSequenceClassification,
        KilnDecoderForSequenceClassification,
        KilnEncoderForNextSentencePrediction,
        KilnEncoderForMultipleChoice,
    ):
        return {"labels": torch.zeros(batch_size, **zeros)}
    if model_class is KilnEncoderForQuestionAnswering:
        return {
            "start_positions": torch.zeros(batch_size, **zeros),
            "end_positions": torch.zeros(batch_size, **zeros),
        }
    return {}


def torch_device():
    from transformers.testing_utils import torch_device as device

    return device


class _KilnCommon(ModelTesterMixin):
    # Skips. Everything else in ModelTesterMixin / ConfigTester runs (213 tests + 4,273 subtests, zero failures on
    # 5.23.0). The mixin itself skips, with its own message, what cannot apply on this machine or to this design:
    # - needs hardware or packages CI does not have: "requires accelerator / multiple accelerators / MPS / Flash
    #   Attention 2-4 / deepspeed / the kernels library"; "test is slow" (RUN_SLOW is not set in CI);
    # - features BERT and GPT-2 do not have either: RoPE (scaling, axial, partial rotation), sliding-window masks,
    #   mixture-of-experts (sparse experts, router logits, grouped_mm), tensor-parallel plans, `_keep_in_fp32_modules`,
    #   position-embedding resizing, sub-configs / composite models (vision, audio, video features), the
    #   `capture_outputs` decorator, checkpoint key conversion mappings ("No conversion found": Kiln's checkpoints
    #   need none), a seq2seq LM head (the encoder-decoder is transformers' EncoderDecoderModel, tested elsewhere);
    # - "No decoder-only language modeling head" (shift_labels): the encoder family has none; it runs on the decoder.
    # And two set here:
    test_resize_position_embeddings = False  # Kiln, like BERT/GPT-2, has no `resize_position_embeddings`
    test_torch_exportable = False  # ExportTesterMixin's tests are not in the sdist (see the module docstring)
    # transformers runs `test_can_init_all_missing_weights` only for models whose file says "Copyright 2023" or
    # later; Kiln's files carry no such line, so opt in: every weight must be set by `_init_weights`
    test_can_init_all_missing_weights_before_2023 = True

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels=False)
        if return_labels:
            inputs.update(_labels_for(model_class, inputs, self.model_tester))
            if model_class is KilnEncoderForMultipleChoice:  # labels are per question, not per choice
                inputs["labels"] = torch.zeros(self.model_tester.batch_size, dtype=torch.long)
        return inputs


class KilnEncoderCommonTest(_KilnCommon, unittest.TestCase):
    all_model_classes = (
        KilnEncoderModel,
        KilnEncoderForPreTraining,
        KilnEncoderForMaskedLM,
        KilnEncoderForNextSentencePrediction,
        KilnEncoderForSequenceClassification,
        KilnEncoderForMultipleChoice,
        KilnEncoderForTokenClassification,
        KilnEncoderForQuestionAnswering,
    )

    def setUp(self):
        self.model_tester = KilnEncoderTester(self)
        self.config_tester = ConfigTester(self, config_class=KilnEncoderConfig, hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()


class KilnModernEncoderTester(KilnEncoderTester):
    """The same inputs for the encoder with the modernbert preset; a local window shorter than the sequence, so the
    mixin's tests run local and global blocks alike."""

    def get_config(self):
        config = super().get_config()
        return KilnEncoderConfig(**{**config.to_dict(), "preset": "modernbert", **MODERN_PIECES})


# the preset's pieces, given explicitly: a saved config carries them all (the fields BERT's block defaults differ)
MODERN_PIECES = dict(
    position_embedding_type="rotary",
    norm_position="pre",
    mlp_type="glu",
    attention_bias=False,
    mlp_bias=False,
    norm_bias=False,
    classifier_bias=False,
    classifier_head="transform",
    global_attn_every_n_layers=2,
    local_attention=4,
)


class KilnModernEncoderCommonTest(_KilnCommon, unittest.TestCase):
    all_model_classes = KilnEncoderCommonTest.all_model_classes

    def setUp(self):
        self.model_tester = KilnModernEncoderTester(self)
        self.config_tester = ConfigTester(
            self, config_class=KilnEncoderConfig, hidden_size=37, preset="modernbert"
        )

    def test_config(self):
        self.config_tester.run_common_tests()


class KilnDecoderCommonTest(_KilnCommon, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (
        KilnDecoderModel,
        KilnDecoderForCausalLM,
        KilnDecoderForSequenceClassification,
        KilnDecoderForTokenClassification,
    )

    def setUp(self):
        self.model_tester = KilnDecoderTester(self)
        # GPT-2's tester passes n_embd=37: an alias here (attribute_map), saved under its canonical name hidden_size
        self.config_tester = ConfigTester(self, config_class=KilnDecoderConfig, hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_left_padding_compatibility(self):
        """transformers' generation test of this name (its GenerationTesterMixin, not in the sdist), step by step:
        a mask with holes as GPT-2's tester draws it (`random_attention_mask`), position ids derived from the mask
        as `generate` derives them (`[0 1 1 2 3]` repeats a position at a hole), then 32 tokens of left padding:
        the last token's logits stay the same. Rows with holes are one sequence, not packed documents."""
        torch.manual_seed(0)
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        input_ids = inputs["input_ids"]
        attention_mask = ids_tensor(list(input_ids.shape), 2)
        attention_mask[:, -1] = 1
        assert bool((attention_mask[:, :-1] == 0).any())  # holes, not only padding

        def last_logits(model, input_ids, attention_mask):
            position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
            logits = model(
                input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).logits
            return logits[:, -1, :]

        model = KilnDecoderForCausalLM(config).eval()
        with torch.no_grad():
            unpadded = last_logits(model, input_ids, attention_mask)
            padding = torch.full((input_ids.shape[0], 32), config.pad_token_id, dtype=input_ids.dtype)
            padded = last_logits(
                model,
                torch.cat([padding, input_ids], 1),
                torch.cat([torch.zeros_like(padding), attention_mask], 1),
            )
        torch.testing.assert_close(unpadded, padded, rtol=1e-5, atol=1e-5)


class KilnLlamaDecoderCommonTest(KilnDecoderCommonTest):
    """The same mixin tests on the decoder's `llama` preset."""

    def setUp(self):
        self.model_tester = KilnLlamaDecoderTester(self)
        self.config_tester = ConfigTester(
            self, config_class=KilnDecoderConfig, hidden_size=37, preset="llama"
        )


del floats_tensor

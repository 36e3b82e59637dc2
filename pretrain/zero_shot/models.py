"""A model to score sentences with: a Kiln or transformers checkpoint (local folder or Hub id) and its tokenizer.

Its config.json is read as data first (kiln.model_files): a Kiln checkpoint loads with Kiln's own classes, a
transformers one (BERT, GPT-2, ...) with its registered class, and code a checkpoint names (`auto_map`) is never
run.
"""

from __future__ import annotations

import os

from kiln.export import quiet_transformers
from kiln.model_files import read_model_config

from .scoring import ZeroShotError

CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")
MASKED_HEADS = ("ForMaskedLM", "ForPreTraining")


def model_kind(config: dict) -> str | None:
    """`encoder` (a masked LM), `decoder` (a causal LM) or None (cannot tell) from a config.json."""
    model_type = config.get("model_type")
    if model_type in ("kiln_encoder", "kiln_decoder"):
        return model_type.removeprefix("kiln_")
    architectures = config.get("architectures") or []
    if any(name.endswith(CAUSAL_HEADS) for name in architectures):
        return "decoder"
    if any(name.endswith(MASKED_HEADS) for name in architectures):
        return "encoder"
    return None


def load_model(spec: str, kind: str | None = None, revision: str | None = None, from_scratch: bool = False,
               seed: int = 0):  # fmt: skip
    """(model in eval mode, tokenizer, kind) for the folder or Hub id `spec`; `from_scratch`: its shape and
    tokenizer with weights drawn from `seed` (the baseline that shows what pretraining taught)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    from pretrain.modeling import KilnDecoderForCausalLM, KilnEncoderForMaskedLM  # registers the Kiln types

    if os.path.isdir(spec) and not os.path.isfile(os.path.join(spec, "config.json")):
        hint = f"; point --model at the model inside: {spec.rstrip('/')}/final" if os.path.isdir(os.path.join(spec, "final")) else ""
        raise ZeroShotError(f"--model {spec} holds no config.json, so it is not a saved model{hint}")
    try:
        config = read_model_config(spec, revision)
    except OSError as err:
        raise ZeroShotError(f"--model {spec}: cannot load a model from it ({err}); point it at a saved model folder "
                         "or a Hub id") from None  # fmt: skip
    found = model_kind(config)
    kind = kind or found
    if kind is None:
        raise ZeroShotError(f"--model {spec} is a {config.get('model_type')} model with no masked-LM or causal-LM head "
                         "that Kiln can tell; pass --kind encoder or --kind decoder")  # fmt: skip
    if "KilnEncoderForReplacedTokenDetection" in (config.get("architectures") or []):
        raise ZeroShotError(f"--model {spec} is an ELECTRA discriminator, which has no masked-LM head to score "
                         f"sentences with; score its generator ({spec.rstrip('/')}/generator) or another model")  # fmt: skip
    kiln_class = {"kiln_encoder": KilnEncoderForMaskedLM, "kiln_decoder": KilnDecoderForCausalLM}.get(config.get("model_type"))
    auto_class = AutoModelForMaskedLM if kind == "encoder" else AutoModelForCausalLM
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(spec, revision=revision, trust_remote_code=False)
            if from_scratch:
                model_config = AutoConfig.from_pretrained(spec, revision=revision, trust_remote_code=False)
                torch.manual_seed(seed)
                model = kiln_class(model_config) if kiln_class else auto_class.from_config(model_config)
            elif kiln_class is not None:
                model = kiln_class.from_pretrained(spec, revision=revision)
            else:
                model = auto_class.from_pretrained(spec, revision=revision, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as err:
        message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ZeroShotError(f"--model {spec}: cannot load it as a {kind} ({message})") from None
    return model.eval(), tokenizer, kind


__all__ = ["load_model", "model_kind"]

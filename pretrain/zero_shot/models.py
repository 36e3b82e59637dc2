"""A model to score sentences with: a Kiln or transformers checkpoint (local folder or Hub id) and its tokenizer.

Its config.json is read as data first (kiln.model_files): a Kiln checkpoint loads with Kiln's own classes, a
transformers one (BERT, GPT-2, ...) with its registered class, and code a checkpoint names (`auto_map`) is never
run. A folder whose weights hold no masked-LM or causal-LM head (a fine-tuned classifier or tagger, an ELECTRA
discriminator) is refused: scored through a randomly initialised head, it would give a number that means nothing.
"""

from __future__ import annotations

import os

from kiln.export import quiet_transformers
from kiln.model_files import model_source_problem, read_model_config

from .scoring import ZeroShotError

CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")
MASKED_HEADS = ("ForMaskedLM", "ForPreTraining")
# ELECTRA's discriminators: named ...ForPreTraining (transformers) or ...ForReplacedTokenDetection (Kiln), with a
# replaced-token head and no masked-LM one
ELECTRA_DISCRIMINATORS = ("ElectraForPreTraining", "KilnEncoderForReplacedTokenDetection")
# the heads a fine-tuned folder holds instead of a masked-LM or causal-LM head, by class name ending
OTHER_HEADS = {
    "ForSequenceClassification": "a sequence classification head",
    "ForTokenClassification": "a token classification head",
    "ForQuestionAnswering": "a question-answering head",
    "ForMultipleChoice": "a multiple-choice head",
    "ForNextSentencePrediction": "a next-sentence head",
    "ForReplacedTokenDetection": "a replaced-token detection head",
    "Model": "no head",
}


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


def check_scoring_head(spec: str, config: dict) -> None:
    """A folder whose config.json names only classes without a masked-LM or causal-LM head (a fine-tuned
    classifier, tagger, ..., an ELECTRA discriminator, a bare encoder) is refused in one line naming them."""
    architectures = [name for name in config.get("architectures") or [] if isinstance(name, str)]
    if any(name in ELECTRA_DISCRIMINATORS for name in architectures):
        names, generator = ", ".join(architectures), f"{spec.rstrip('/')}/generator"
        raise ZeroShotError(
            f"--model {spec} is an ELECTRA discriminator ({names}), which has no masked-LM head to score sentences "
            f"with; score its generator ({generator}) or another model"
        )
    if not architectures or any(name.endswith(CAUSAL_HEADS + MASKED_HEADS) for name in architectures):
        return
    heads = [head for ending, head in OTHER_HEADS.items() for name in architectures if name.endswith(ending)]
    holds = f"{', '.join(architectures)} ({heads[0] if heads else 'another head'})"
    raise ZeroShotError(
        f"--model {spec} holds {holds}, not a masked-LM or causal-LM head to score sentences with; score the "
        "pretrained model it was fine-tuned from (a pretraining run's final/) or another model"
    )


def check_model_source(spec: str, revision: str | None = None, hub: bool = True) -> None:
    """`--model` names a folder that exists or a Hub id (with `hub`: one that can be read, offline from the
    cache): ZeroShotError (one line) when not, said without waiting for the network."""
    problem = model_source_problem(spec, "--model", revision, hub=hub)
    if problem:
        raise ZeroShotError(problem)


def load_model(
    spec: str, kind: str | None = None, revision: str | None = None, from_scratch: bool = False, seed: int = 0
):
    """(model in eval mode, tokenizer, kind) for the folder or Hub id `spec`; `from_scratch`: its shape and
    tokenizer with weights drawn from `seed` (the baseline that shows what pretraining taught). Without
    `from_scratch`, a folder whose weights lack the scoring head (or any weight the model needs) is refused."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    from pretrain.modeling import KilnDecoderForCausalLM, KilnEncoderForMaskedLM  # registers the Kiln types

    check_model_source(spec, revision)
    if os.path.isdir(spec) and not os.path.isfile(os.path.join(spec, "config.json")):
        hint = (
            f"; point --model at the model inside: {spec.rstrip('/')}/final"
            if os.path.isdir(os.path.join(spec, "final"))
            else ""
        )
        raise ZeroShotError(f"--model {spec} holds no config.json, so it is not a saved model{hint}")
    try:
        config = read_model_config(spec, revision)
    except OSError as err:
        raise ZeroShotError(
            f"--model {spec}: cannot load a model from it ({err}); point it at a saved model folder "
            "or a Hub id"
        ) from None
    if not from_scratch:
        check_scoring_head(spec, config)
    from pretrain.model_gate import check_model_folder

    # the model gate (ConfigError: said by the command as a user error): files, depth, every tensor's shape
    check_model_folder(spec, "--model", config, revision=revision)
    found = model_kind(config)
    kind = kind or found
    if kind is None:
        raise ZeroShotError(
            f"--model {spec} is a {config.get('model_type')} model with no masked-LM or causal-LM head "
            "that Kiln can tell; pass --kind encoder or --kind decoder"
        )
    kiln_class = {"kiln_encoder": KilnEncoderForMaskedLM, "kiln_decoder": KilnDecoderForCausalLM}.get(
        config.get("model_type")
    )
    auto_class = AutoModelForMaskedLM if kind == "encoder" else AutoModelForCausalLM
    info = {}
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(spec, revision=revision, trust_remote_code=False)
            if from_scratch:
                model_config = AutoConfig.from_pretrained(spec, revision=revision, trust_remote_code=False)
                torch.manual_seed(seed)
                model = kiln_class(model_config) if kiln_class else auto_class.from_config(model_config)
            elif kiln_class is not None:
                model, info = kiln_class.from_pretrained(spec, revision=revision, output_loading_info=True)
            else:
                model, info = auto_class.from_pretrained(
                    spec, revision=revision, trust_remote_code=False, output_loading_info=True
                )
    except (OSError, ValueError, KeyError) as err:
        message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ZeroShotError(f"--model {spec}: cannot load it as a {kind} ({message})") from None
    missing = sorted(map(str, [*info.get("missing_keys", []), *info.get("mismatched_keys", [])]))
    if missing:
        head = "masked-LM" if kind == "encoder" else "causal-LM"
        holds = ", ".join(config.get("architectures") or []) or str(config.get("model_type"))
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ZeroShotError(
            f"--model {spec} ({holds}) lacks weights its {head} model needs ({shown}), which would score "
            f"sentences through random ones; point it at a pretrained model with its {head} head (a pretraining "
            "run's final/)"
        )
    return model.eval(), tokenizer, kind


__all__ = ["check_model_source", "check_scoring_head", "load_model", "model_kind"]

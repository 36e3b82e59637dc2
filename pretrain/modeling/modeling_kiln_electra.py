"""ELECTRA on the Kiln encoder: the replaced-token-detection discriminator and the joint generator + discriminator
model that pretrains it (Clark et al., 2020).

`KilnEncoderForReplacedTokenDetection` is what an ELECTRA run leaves in `final/` (transformers'
`ElectraForPreTraining`); `KilnEncoderForElectraPreTraining` trains a small `KilnEncoderForMaskedLM` generator and
the discriminator together, sharing one embeddings module, and is saved as those two ordinary folders. Both are
built from the encoder's own pieces (`modeling_kiln_encoder.py`), so their weights load into every encoder head.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch, transformers and
its sibling files (relative imports).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .configuration_kiln import KilnEncoderConfig
from .kiln_layers import activation_module, check_kwargs
from .modeling_kiln_encoder import (
    KilnEncoderForMaskedLM,
    KilnEncoderModel,
    KilnEncoderPreTrainedModel,
    embedding_width,
)


class KilnDiscriminatorHead(nn.Module):
    """ELECTRA's discriminator head (transformers' `ElectraDiscriminatorPredictions`): dense + activation, then
    one logit per token that it was replaced."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation_module(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states):
        return self.dense_prediction(self.act(self.dense(hidden_states))).squeeze(-1)  # (B, T)


@dataclass
class KilnReplacedTokenDetectionOutput(ModelOutput):
    """Output of [`KilnEncoderForReplacedTokenDetection`] (transformers' `ElectraForPreTrainingOutput`).

    loss: binary cross-entropy of the replaced-token logits, a mean over the non-padding tokens.
    logits: (B, T), > 0 where the token is judged replaced.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class KilnEncoderForReplacedTokenDetection(KilnEncoderPreTrainedModel):
    """Encoder + ELECTRA's discriminator head (transformers' `ElectraForPreTraining`): which tokens did a
    generator replace? What ELECTRA pretraining leaves in `final/`; its encoder weights load into every head."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.model = KilnEncoderModel(config, add_pooling_layer=False)
        self.discriminator_head = KilnDiscriminatorHead(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> KilnReplacedTokenDetectionOutput | tuple:
        r"""labels: (B, T) 1 where the token was replaced, 0 where it is the original; the loss averages over
        the tokens under `attention_mask` (all tokens without one), as ElectraForPreTraining does."""
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            unpad=True,  # the loss reads real tokens only
        )
        logits = self.discriminator_head(outputs.last_hidden_state)  # (B, T)
        loss = None
        if labels is not None:
            active = (
                attention_mask.bool()
                if attention_mask is not None
                else torch.ones_like(labels, dtype=torch.bool)
            )
            loss = F.binary_cross_entropy_with_logits(logits[active], labels[active].to(logits.dtype))
        output = KilnReplacedTokenDetectionOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


# ELECTRA settings a KilnEncoderForElectraPreTraining config carries beside the discriminator's own fields
ELECTRA_DEFAULTS = {"generator_size": 0.25, "discriminator_weight": 50.0}


def electra_generator_shape(hidden_size: int, num_attention_heads: int, intermediate_size: int, size: float):
    """(hidden, heads, intermediate) of an ELECTRA generator `size` times the discriminator (the paper's 1/4
    for Base: hidden size, heads and feed-forward width scale alike; the depth stays)."""
    return (
        max(1, round(hidden_size * size)),
        max(1, round(num_attention_heads * size)),
        max(1, round(intermediate_size * size)),
    )


def _sub_config(config: KilnEncoderConfig, **changes) -> KilnEncoderConfig:
    fields = {k: v for k, v in config.to_dict().items() if k not in ELECTRA_DEFAULTS}
    fields.pop("architectures", None)
    fields.pop("auto_map", None)
    sub = KilnEncoderConfig.from_dict({**fields, **changes})
    sub._attn_implementation = config._attn_implementation
    return sub


def sample_from_logits(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One id per row of `logits` (M, V), drawn from softmax(logits) by inverting its CDF at `uniforms` (M,)
    in [0, 1): the same draw as a multinomial, but a function of the uniforms, so the masking collator can draw
    them per example (identical samples on any number of processes and after a resume)."""
    cdf = torch.softmax(logits.float(), dim=-1).cumsum(dim=-1)  # (M, V)
    targets = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]  # scaled by the total: the cumsum's rounding
    return torch.searchsorted(cdf, targets, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)


@dataclass
class KilnElectraPreTrainingOutput(ModelOutput):
    """Output of [`KilnEncoderForElectraPreTraining`].

    loss: mlm_loss + discriminator_weight * rtd_loss (ELECTRA's objective; lambda = 50 in the paper).
    mlm_loss: the generator's masked-LM loss, a mean over the masked tokens.
    rtd_loss: the discriminator's replaced-token loss, a mean over the non-padding tokens.
    rtd_accuracy: the share of non-padding tokens the discriminator labels right (no gradient).
    prediction_logits: the generator's logits, as in [`KilnEncoderForMaskedLM`]: (M, V) at the masked
        positions with `config.sparse_prediction`, else (B, T, V).
    discriminator_logits: (B, T) replaced-token logits on `discriminator_input_ids`.
    replaced: (B, T) the discriminator's labels: 1 where its input differs from the original token.
    discriminator_input_ids: (B, T) the original tokens with the generator's samples at the masked positions.
    """

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    rtd_loss: torch.Tensor | None = None
    rtd_accuracy: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    discriminator_logits: torch.Tensor | None = None
    replaced: torch.Tensor | None = None
    discriminator_input_ids: torch.Tensor | None = None


class KilnEncoderForElectraPreTraining(KilnEncoderPreTrainedModel):
    """ELECTRA (Clark et al., 2020): a small MLM generator fills the masked positions with samples from its
    softmax, and the discriminator learns which tokens of the result were replaced, at every position.

    `config` is the discriminator's, plus `generator_size` (the generator's hidden size, heads and feed-forward
    width as a fraction of the discriminator's; default 0.25) and `discriminator_weight` (lambda, default 50).
    Both models share one embeddings module (token, position and segment tables and their LayerNorm) as in the
    paper; the generator projects it to its own width (`embedding_size`). Saved as two ordinary folders: the
    discriminator ([`KilnEncoderForReplacedTokenDetection`]) and the generator ([`KilnEncoderForMaskedLM`]), see
    `saved_parts`.
    """

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        settings = {name: getattr(config, name, default) for name, default in ELECTRA_DEFAULTS.items()}
        self.discriminator_weight = float(settings["discriminator_weight"])
        discriminator_config = _sub_config(config)
        hidden, heads, intermediate = electra_generator_shape(
            config.hidden_size,
            config.num_attention_heads,
            config.intermediate_size,
            settings["generator_size"],
        )
        generator_config = _sub_config(
            config,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            embedding_size=embedding_width(config),
            chunked_mlm_loss=False,  # the logits at the masked positions are sampled from
        )
        self.discriminator = KilnEncoderForReplacedTokenDetection(discriminator_config)
        self.generator = KilnEncoderForMaskedLM(generator_config)
        # one embeddings module for both (the paper's tied embeddings); the generator's MLM decoder stays tied to
        # its word table, now the shared one
        self.generator.model.embeddings = self.discriminator.model.embeddings
        self.generator.mlm_head.decoder.weight = self.discriminator.model.embeddings.word_embeddings.weight
        self.post_init()

    def get_input_embeddings(self):
        return self.discriminator.model.embeddings.word_embeddings

    def saved_parts(self) -> dict[str, tuple[str, KilnEncoderPreTrainedModel]]:
        """Folder (relative to the save directory) -> (state-dict prefix, model): what Kiln's export writes
        instead of this joint model, the discriminator as the folder's model and the generator beside it."""
        return {"": ("discriminator.", self.discriminator), "generator": ("generator.", self.generator)}

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        sampling_uniforms: torch.Tensor | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> KilnElectraPreTrainingOutput | tuple:
        r"""
        input_ids: (B, T) the masked tokens (the generator's input), as the MLM collator makes them.
        labels: (B, T) the original ids at the masked positions, -100 elsewhere. Without labels, only the
            discriminator runs, on `input_ids` as they are.
        sampling_uniforms: (B, T) uniforms in [0, 1) that pick the generator's samples (see
            `sample_from_logits`); drawn from the global torch RNG when not given.
        """
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        inputs = dict(attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=position_ids)
        if labels is None:
            scored = self.discriminator(input_ids, **inputs, return_dict=True)
            output = KilnElectraPreTrainingOutput(discriminator_logits=scored.logits)
            return output if return_dict else output.to_tuple()
        generated = self.generator(input_ids, **inputs, labels=labels, return_dict=True)
        selected = labels != -100
        logits = generated.logits if generated.logits.dim() == 2 else generated.logits[selected]  # (M, V)
        with torch.no_grad():  # no gradient through sampling: the generator learns from its MLM loss only
            if sampling_uniforms is not None:
                uniforms = sampling_uniforms[selected]
            else:
                uniforms = torch.rand(logits.shape[0], device=logits.device)
            original = torch.where(selected, labels, input_ids)
            corrupted = original.masked_scatter(selected, sample_from_logits(logits, uniforms))
            replaced = (corrupted != original).long()  # a sample equal to the original counts as original
        scored = self.discriminator(corrupted, **inputs, labels=replaced, return_dict=True)
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(selected)
        rtd_accuracy = ((scored.logits.detach() > 0).long() == replaced)[real].float().mean()
        mlm_loss = generated.loss if logits.shape[0] else None  # no masked token: no MLM term (not NaN)
        loss = self.discriminator_weight * scored.loss
        output = KilnElectraPreTrainingOutput(
            loss=loss if mlm_loss is None else mlm_loss + loss,
            mlm_loss=mlm_loss,
            rtd_loss=scored.loss,
            rtd_accuracy=rtd_accuracy,
            prediction_logits=generated.logits,
            discriminator_logits=scored.logits,
            replaced=replaced,
            discriminator_input_ids=corrupted,
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "ELECTRA_DEFAULTS",
    "KilnElectraPreTrainingOutput",
    "KilnEncoderForElectraPreTraining",
    "KilnEncoderForReplacedTokenDetection",
    "KilnReplacedTokenDetectionOutput",
    "electra_generator_shape",
    "sample_from_logits",
]

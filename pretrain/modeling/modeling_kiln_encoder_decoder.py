"""Kiln encoder + Kiln decoder as one seq2seq model: transformers' `EncoderDecoderModel` with its own config class.

transformers' `EncoderDecoderModel` finds its two halves by model type through the Auto classes, which know Kiln
only after `import pretrain.modeling`. This subclass builds them from Kiln's classes directly, so a saved folder
carries its code (auto_map: AutoConfig, AutoModelForSeq2SeqLM) and loads with `trust_remote_code=True` anywhere.
Same weights layout (`encoder.*`, `decoder.*`), forward, loss and `generate` as `EncoderDecoderModel`.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch, transformers and
its sibling files (relative imports).
"""

from transformers.models.encoder_decoder.modeling_encoder_decoder import EncoderDecoderModel

from .configuration_kiln import KilnEncoderDecoderConfig
from .modeling_kiln_decoder import KilnDecoderForCausalLM
from .modeling_kiln_encoder import KilnEncoderModel


class KilnEncoderDecoderModel(EncoderDecoderModel):
    """`EncoderDecoderModel(encoder=KilnEncoderModel, decoder=KilnDecoderForCausalLM)` with a Kiln config class."""

    config_class = KilnEncoderDecoderConfig
    config: KilnEncoderDecoderConfig

    def __init__(self, config=None, encoder=None, decoder=None):
        if config is not None and not isinstance(config, KilnEncoderDecoderConfig):
            # Under trust_remote_code, AutoConfig may load this config class from another copy of these files
            # (transformers caches each entry file's code under its own hash): rebuild it from its values
            config = KilnEncoderDecoderConfig.from_dict(config.to_dict())
        if config is None and encoder is not None and decoder is not None:
            config = KilnEncoderDecoderConfig.from_encoder_decoder_configs(encoder.config, decoder.config)
        if config is not None:
            if encoder is None:
                encoder = KilnEncoderModel(config.encoder)
            if decoder is None:
                decoder = KilnDecoderForCausalLM(config.decoder)
        super().__init__(config=config, encoder=encoder, decoder=decoder)


# Auto class -> Kiln class: registered by `pretrain.modeling`, written into each saved checkpoint's auto_map
ENCODER_DECODER_AUTO_CLASSES = {"AutoModelForSeq2SeqLM": KilnEncoderDecoderModel}

__all__ = ["ENCODER_DECODER_AUTO_CLASSES", "KilnEncoderDecoderModel"]

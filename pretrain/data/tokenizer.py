"""Tokenizers: train WordPiece (encoder) or byte-level BPE (decoder) with `tokenizers`, or reuse an existing one.

Trained tokenizers are wrapped as `PreTrainedTokenizerFast` and saved with `save_pretrained`, so
`AutoTokenizer.from_pretrained(folder)` gives them back with their special tokens, `model_max_length` and (WordPiece)
the `[CLS] A [SEP] B [SEP]` post-processor that also writes token_type_ids.
"""

from __future__ import annotations

import json
import logging
import re
import string
import sys
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from kiln.config import resolve_path

from .common import DataError, main_process_first, share_files
from .corpus import iter_texts, load_documents

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..config import DataConfig, TokenizerConfig

logger = logging.getLogger(__name__)

WORDPIECE_SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
EOS = "<|endoftext|>"
MASK = "<|mask|>"  # a decoder's mask token, for the clm+mntp objective
KIND_FOR_MODEL = {"encoder": "wordpiece", "decoder": "bpe"}
# Always in the WordPiece alphabet (letters and digits also as ## pieces), so ASCII text never needs [UNK].
ASCII_ALPHABET = sorted(set(string.ascii_letters + string.digits + string.punctuation))


def train_tokenizer(
    texts: Iterable[str] | Iterable[list[str]],
    kind: str = "wordpiece",
    vocab_size: int = 2048,
    lowercase: bool = True,
    min_frequency: int = 2,
    model_max_length: int = 512,
    mask_token: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a tokenizer on `texts` (strings or batches of strings).

    kind="wordpiece": BERT normalizer and pre-tokenizer, `[PAD] [UNK] [CLS] [SEP] [MASK]` (ids 0-4), `##` pieces,
    post-processor `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` with token_type_ids 0/1.
    kind="bpe": GPT-2 style byte-level BPE with `<|endoftext|>` as bos/eos/unk/pad; no special tokens added.
    `mask_token` (bpe): also `<|mask|>` as its mask token (id 1), for a decoder trained with `clm+mntp`.
    `lowercase` only applies to WordPiece.
    """
    if kind == "wordpiece":
        specials = list(WORDPIECE_SPECIAL_TOKENS.values())
        if vocab_size <= len(specials) + len(ASCII_ALPHABET):
            raise DataError(
                f"--tokenizer.vocab_size={vocab_size} is too small for WordPiece; use at least 256"
            )
        backend = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        alphabet = sorted({c.lower() for c in ASCII_ALPHABET}) if lowercase else ASCII_ALPHABET
        texts = list(_flatten(texts))  # read twice: the continuation alphabet first, then the training
        # Every `##c` piece registered up front, in sorted order. Left to the trainer, they are numbered in the
        # order of a Rust hash map (seeded per process), and merges of equal count are then ordered by those ids:
        # two trainings on the same text gave different vocabularies (huggingface/tokenizers#1794). With these
        # ids fixed, every tie is broken the same way. ASCII letters and digits are always included, so no
        # ASCII word ever becomes [UNK].
        continuing = sorted(
            _continuation_chars(texts, backend.normalizer) | {c for c in alphabet if c.isalnum()}
        )
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=specials + ["##" + c for c in continuing],
            initial_alphabet=alphabet,
            continuing_subword_prefix="##",
            show_progress=_terminal(),
        )
    elif kind == "bpe":
        if vocab_size <= 257:
            raise DataError(
                f"--tokenizer.vocab_size={vocab_size} is too small for byte-level BPE; use at least 512"
            )
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[EOS, MASK] if mask_token else [EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=_terminal(),
        )
    else:
        raise DataError(f"tokenizer kind {kind!r} is unknown; use 'wordpiece' (encoder) or 'bpe' (decoder)")

    backend.train_from_iterator(_flatten(texts), trainer=trainer)
    if backend.get_vocab_size() < vocab_size:
        logger.warning(
            "the corpus supports only %d tokens (asked for %d); the vocabulary is smaller",
            backend.get_vocab_size(),
            vocab_size,
        )
    if kind == "wordpiece":
        backend = _sort_wordpiece_vocab(backend)
        cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            model_max_length=model_max_length,
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
            **WORDPIECE_SPECIAL_TOKENS,
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=model_max_length,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        **({"mask_token": MASK} if mask_token else {}),
        model_input_names=["input_ids", "attention_mask"],
    )


def _continuation_chars(texts: list[str], normalizer) -> set[str]:
    """Characters that can continue a word after normalisation: any non-space character that follows another
    one, except punctuation (BertPreTokenizer makes every punctuation mark a word of its own)."""
    # Normalisation works character by character and a space stays a space, so the continuations of a text are
    # those of its space-separated pieces; ASCII pieces can only contribute ASCII letters and digits, which are
    # always added. So only the distinct non-ASCII pieces are normalised (much faster than every text).
    pieces = {
        piece for text in texts if not text.isascii() for piece in text.split(" ") if not piece.isascii()
    }
    found: set[str] = set()
    for piece in pieces:
        found.update(_AFTER_NON_SPACE.findall(normalizer.normalize_str(piece)))
    return {c for c in found if not _is_punctuation(c)}


_AFTER_NON_SPACE = re.compile(r"(?<=\S)\S")


def _is_punctuation(char: str) -> bool:
    """BERT's definition: ASCII symbols and every Unicode punctuation category."""
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _sort_wordpiece_vocab(backend: Tokenizer) -> Tokenizer:
    """The trained WordPiece with a canonical id order (special tokens, words, then ## pieces, each sorted) and
    only the five real special tokens as added tokens (the ## pieces registered for training are ordinary
    vocabulary). WordPiece matching depends on the set of tokens only, not on their ids."""
    vocab = backend.get_vocab(with_added_tokens=False)
    specials = list(WORDPIECE_SPECIAL_TOKENS.values())
    rest = sorted((token for token in vocab if token not in specials), key=lambda t: (t.startswith("##"), t))
    state = json.loads(backend.to_str())
    state["added_tokens"] = [
        {**added, "id": specials.index(added["content"])}
        for added in state["added_tokens"]
        if added["content"] in specials
    ]
    state["model"]["vocab"] = {token: i for i, token in enumerate(specials + rest)}
    return Tokenizer.from_str(json.dumps(state))


def _terminal() -> bool:
    """Whether the tokenizer trainer's progress bars can draw: on a terminal. Elsewhere (a pipe, a log file) they
    are hidden but still print a blank line each, three in a run's output."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def _flatten(texts):
    for item in texts:
        if isinstance(item, str):
            yield item
        else:
            yield from item


def padded_vocab_size(tokenizer, multiple: int) -> int:
    """len(tokenizer) rounded up to a multiple of `multiple` (0 or less: unchanged)."""
    size = len(tokenizer)
    return size if multiple <= 0 else -(-size // multiple) * multiple


def check_tokenizer_fits(tokenizer, vocab_size: int) -> None:
    """DataError when the tokenizer produces ids the model has no embedding for."""
    if len(tokenizer) > vocab_size:
        raise DataError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}: use the "
            f"tokenizer saved with the model (--tokenizer.name_or_path=<model folder>) or a model with a larger vocabulary"
        )


def load_tokenizer(name_or_path: str, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """Load a saved tokenizer (folder or Hub id) as a fast tokenizer."""
    from transformers import (
        AutoTokenizer,
    )  # imports torch: here, not when `prepare` (which needs no torch) starts

    location = resolve_path(name_or_path)
    try:
        # never the folder's own tokenizer code (auto_map), and never a prompt asking whether to run it
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=False)
    except Exception as err:  # OSError, ValueError, HTTP errors: all mean "not loadable here"
        reason = str(err).strip().split("\n")[0]
        raise DataError(
            f"could not load tokenizer {name_or_path!r}: {reason}. Give a folder with tokenizer.json or a Hub id, "
            f"or unset --tokenizer.name_or_path to train one"
        ) from None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise DataError(
            f"tokenizer {name_or_path!r} is not a fast (tokenizers-backed) tokenizer; convert it or train one"
        )
    tokenizer.init_kwargs.pop("auto_map", None)  # saved again by this run: name no code it did not run
    if model_max_length is not None:
        tokenizer.model_max_length = model_max_length
    return tokenizer


def check_special_tokens(tokenizer, model_kind: str, objective: str = "clm") -> None:
    """The encoder needs [CLS]/[SEP]/[MASK]/[PAD]; the decoder needs an EOS token (pad falls back to it), and a
    mask token for `clm+mntp`."""
    if model_kind == "encoder":
        missing = [
            name
            for name in ("cls_token", "sep_token", "mask_token", "pad_token")
            if getattr(tokenizer, name) is None
        ]
        if missing:
            raise DataError(
                f"the tokenizer has no {', '.join(missing)}, which the encoder needs; use a BERT-style tokenizer or "
                f"unset --tokenizer.name_or_path to train one"
            )
    elif tokenizer.eos_token is None:
        raise DataError(
            "the tokenizer has no eos_token, which separates documents for the decoder; set one or train one"
        )
    elif objective == "clm+mntp" and tokenizer.mask_token is None:
        raise DataError(
            "the tokenizer has no mask_token, which --model.objective clm+mntp needs; unset --tokenizer.name_or_path "
            f"to train one (with {MASK}) or use a tokenizer that has one"
        )
    if model_kind != "encoder" and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def prepare_tokenizer(
    tok_cfg: TokenizerConfig,
    data_cfg: DataConfig,
    model_kind: str,
    save_dir: str,
    accelerator=None,
    staged=None,
    objective: str = "clm",
) -> PreTrainedTokenizerFast:
    """Reuse `tok_cfg.name_or_path`, or train on the training documents and save to `save_dir`.

    With an accelerator, the main process trains and saves while the others wait, then load the saved files. A
    tokenizer already saved in `save_dir` (a resumed run) is loaded instead of retrained, so save_dir must belong
    to this run. kind: WordPiece for the encoder, byte-level BPE for the decoder; model_max_length is
    data_cfg.max_seq_length; a decoder's for `objective` clm+mntp also has a mask token.

    A trained tokenizer is saved into a fresh folder renamed to `save_dir` (`staged(save_dir)`, a context manager
    yielding that folder: `kiln.safe_write.staged_folder` unless the caller keeps a record,
    `kiln.run_folder.staged_run_folder`), never into `save_dir` itself: a link left in it is never written through.
    """
    if model_kind not in KIND_FOR_MODEL:
        raise DataError(f"--model.kind={model_kind!r}: choose 'encoder' or 'decoder'")
    if tok_cfg.name_or_path:
        tokenizer = load_tokenizer(tok_cfg.name_or_path, data_cfg.max_seq_length)
        check_special_tokens(tokenizer, model_kind, objective)
        return tokenizer
    save_dir = Path(save_dir)
    is_main = accelerator is None or accelerator.is_main_process
    with main_process_first(accelerator):
        if is_main and not (save_dir / "tokenizer.json").is_file():
            documents = load_documents(data_cfg).train
            logger.info(
                "training a %s tokenizer (vocab %d) on %s",
                KIND_FOR_MODEL[model_kind],
                tok_cfg.vocab_size,
                save_dir,
            )
            tokenizer = train_tokenizer(
                iter_texts(documents, tok_cfg.max_training_texts),
                kind=KIND_FOR_MODEL[model_kind],
                vocab_size=tok_cfg.vocab_size,
                lowercase=tok_cfg.lowercase,
                min_frequency=tok_cfg.min_frequency,
                model_max_length=data_cfg.max_seq_length,
                mask_token=model_kind == "decoder" and objective == "clm+mntp",
            )
            if staged is None:
                from kiln.safe_write import staged_folder as staged
            with staged(save_dir) as staging:
                tokenizer.save_pretrained(staging)
    # trained once, on rank 0, and broadcast: every node loads the same files, whether it shares save_dir or not
    share_files(save_dir, accelerator)
    tokenizer = load_tokenizer(str(save_dir), data_cfg.max_seq_length)
    check_special_tokens(tokenizer, model_kind, objective)
    return tokenizer


__all__ = [
    "check_special_tokens",
    "check_tokenizer_fits",
    "load_tokenizer",
    "padded_vocab_size",
    "prepare_tokenizer",
    "train_tokenizer",
]

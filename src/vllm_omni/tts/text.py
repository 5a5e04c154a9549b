"""The checkpoint's own text tokenizer (a Qwen2 byte-level BPE) and the chat template around a text.

Why not ``transformers.AutoTokenizer``: importing transformers costs about a second of start-up
and the tokenizer is four stages of the ``tokenizers`` library. We build the same stages the
official loader ends up with, from ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json``
(or ``tokenizer.json`` where a checkpoint has one), and a test compares the ids with the
official processor's on the same files.

One detail decides ids: the official code loads the tokenizer with ``fix_mistral_regex=True``.
With transformers 4.57.3 (which ``qwen-tts`` pins) that flag replaces the first pre-tokenizer
split with a case-aware pattern whenever a local checkpoint's ``config.json`` records a
transformers version after 4.57.2 and before 5.0.0, or none -- the published checkpoints record
4.57.3. The rule and the pattern are reproduced here, so that our ids are the official ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.tts.config import CheckpointConfig, CheckpointError, read_json

# transformers' Qwen2 pre-tokenizer split, and the pattern fix_mistral_regex puts in its place.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
FIXED_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
               r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def assistant_text(text: str) -> str:
    """The official chat template around the text to speak."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def reference_text(text: str) -> str:
    """What was said in a reference recording, as the official ``_build_ref_text`` wraps it (no next turn)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_text(instruct: str) -> str:
    """The official template around a speaking instruction (1.7B CustomVoice, VoiceDesign)."""
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def _version(text: str) -> tuple[int, ...] | None:
    parts = []
    for p in text.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts)


def uses_fixed_split(config: dict[str, Any]) -> bool:
    """Whether the official loader swaps in ``FIXED_SPLIT`` for this checkpoint (see the module doc)."""
    raw = config.get("transformers_version")
    v = _version(raw) if isinstance(raw, str) else None
    if v is None:
        return True
    return not (v <= (4, 57, 2) or v >= (5, 0, 0))


@dataclass
class TextTokenizer:
    """Text -> token ids, as the official processor gives them for this checkpoint."""

    backend: Any  # tokenizers.Tokenizer
    fixed_split: bool

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=False)


def _added_tokens(path: Path) -> list[tuple[int, dict[str, Any]]]:
    cfg = read_json(path)
    table = cfg.get("added_tokens_decoder") or {}
    if not isinstance(table, dict):
        raise CheckpointError(f"{path}: field 'added_tokens_decoder' must be an object of id -> token")
    rows = []
    for key, tok in table.items():
        if not (isinstance(key, str) and key.isdigit()) or not isinstance(tok, dict) or not isinstance(tok.get("content"), str):
            raise CheckpointError(f"{path}: field 'added_tokens_decoder.{key}' must map a numeric id to a token with a 'content'")
        rows.append((int(key), tok))
    return sorted(rows, key=lambda r: r[0])


def load_tokenizer(config: CheckpointConfig) -> TextTokenizer:
    """The checkpoint's tokenizer; CheckpointError naming the file when one is missing or wrong."""
    import tokenizers
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

    root = config.path
    fixed = uses_fixed_split(config.raw)
    split = FIXED_SPLIT if fixed else QWEN2_SPLIT
    if (root / "tokenizer.json").is_file():
        try:
            tok = tokenizers.Tokenizer.from_file(str(root / "tokenizer.json"))
        except Exception as exc:  # noqa: BLE001 - the library's own parse error, with the file named
            raise CheckpointError(f"{root / 'tokenizer.json'}: not a tokenizers file ({exc})") from None
        if fixed:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
    else:
        for name in TOKENIZER_FILES:
            if not (root / name).is_file():
                raise CheckpointError(f"{root / name}: missing (the text tokenizer of the checkpoint)")
        try:
            bpe = models.BPE.from_file(str(root / "vocab.json"), str(root / "merges.txt"), dropout=None, unk_token=None,
                                       continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                                       byte_fallback=False)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{root / 'vocab.json'} / merges.txt: not a byte-level BPE ({exc})") from None
        tok = tokenizers.Tokenizer(bpe)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        path = root / "tokenizer_config.json"
        for tid, row in _added_tokens(path):
            added = AddedToken(row["content"], single_word=bool(row.get("single_word", False)),
                               lstrip=bool(row.get("lstrip", False)), rstrip=bool(row.get("rstrip", False)),
                               normalized=bool(row.get("normalized", False)), special=bool(row.get("special", True)))
            if row.get("special", True):
                tok.add_special_tokens([added])
            else:
                tok.add_tokens([added])
            got = tok.token_to_id(row["content"])
            if got != tid:
                raise CheckpointError(f"{path}: field 'added_tokens_decoder.{tid}' ({row['content']!r}) lands on id {got}: "
                                      "the vocabulary and the added tokens disagree")
    for name in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos"):
        tid = getattr(config.text, name)
        if tok.id_to_token(tid) is None:
            raise CheckpointError(f"{root / 'config.json'}: field '{name}_token_id' ({tid}) is not a token of the text tokenizer")
    return TextTokenizer(tok, fixed)

"""A GGUF file's tokenizer, built from the file's own metadata with ``tokenizers`` alone.

transformers builds a GGUF file's tokenizer from the file's vocabulary, scores, merges and
token types (``transformers.integrations.gguf.gguf_tokenizer_mapping``), importing torch on
the way and spending seconds. This module builds the same ``tokenizers.Tokenizer`` with
neither: the same model, normalizer, pre-tokenizer, decoder and post-processor, and the
same added tokens added in the same order with the same flags, so the ids are the ones
transformers gives (the tests hold it to that, transformers being the oracle). Where
transformers' result differs from llama.cpp's (it ignores ``add_space_prefix``, and splits
``smollm`` digits as GPT-2 does) this follows transformers: the torch path is what the
engine's answers are compared with.

Tokenizer models built: ``llama`` (SentencePiece-style BPE with byte fallback; Gemma's and
Phi-3's variants picked by architecture, as transformers does) and ``gpt2`` (byte-level BPE)
with the pre-tokenizers in ``PRE_TOKENIZER_SPLITS`` or GPT-2's own. Anything else raises
ModelLoadError naming what is missing and that the torch path runs it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE

from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model.gguf_metadata import MetadataReader, Unreadable
from paged_llm.engine.tokenizer.chat_template import gguf_templates
from paged_llm.engine.tokenizer.merges_cache import Merges, cached_merges, merges_key
from paged_llm.extras import ENGINE_EXTRA

# llama.cpp's token types (gguf.TokenType): control tokens become special added tokens,
# user-defined ones plain added tokens (both always matched whole in the text).
CONTROL, USER_DEFINED = 3, 4
SPIECE = "\u2581"  # SentencePiece's visible space

# Tokens a turn ends at, by their text: the engine's loader's END_OF_TURN (its module
# imports torch, so the list is repeated here; a test keeps the two equal).
END_OF_TURN = (
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",
)  # fmt: skip

# The text-splitting regexes of the pre-tokenizers transformers knows by name
# (tokenizer.ggml.pre), copied from its GGUF tokenizer mapping and Qwen tokenizers.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_NAMES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0")
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys((*_LLAMA3_NAMES, "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}
# Byte-level pre-tokenizers that split as GPT-2 itself does (what transformers gives every
# name it does not know; only these are known to be meant so).
GPT2_SPLIT_NAMES = frozenset({"default", "gpt2", "smollm"})

# Architectures whose transformers tokenizer class adds tokens of its own after loading.
_QWEN2_CLASS = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
_GEMMA = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})

_TOKENS, _MERGES = "tokenizer.ggml.tokens", "tokenizer.ggml.merges"


def _unsupported(path: Path, what: str) -> ModelLoadError:
    """The error for a file whose tokenizer this module cannot build."""
    return ModelLoadError(
        f"{path.name}: the tokenizer needs {what}, which the torch-free CPU path does not "
        f"build; the torch path runs it (pip install '{ENGINE_EXTRA}')"
    )


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte, the alphabet of a byte-level vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    spelling = {byte: chr(byte) for byte in printable}
    shift = 0
    for byte in range(256):
        if byte not in spelling:
            spelling[byte] = chr(256 + shift)
            shift += 1
    return spelling


@dataclass(slots=True)
class Vocabulary:
    """What a GGUF file says of its tokenizer, as plain values."""

    architecture: str
    model: str | None
    pre: str | None
    tokens: list[str]
    scores: list[float] | None
    token_types: list[int]
    merges: list[str] | None
    special_ids: dict[str, int]  # bos/eos/unk/pad token name -> id, those the file names
    add_bos_token: bool | None
    add_eos_token: bool | None
    chat_template: str | dict[str, str] | None  # several: by name, as transformers holds them


def read_vocabulary(path: str | Path, reader: MetadataReader | None = None) -> Vocabulary:
    """The tokenizer fields of a GGUF file, from ``reader`` where its header was read already."""
    path = Path(path)
    try:
        reader = reader or MetadataReader(path)
        values = reader.values(keep_strings=(_TOKENS, _MERGES))
    except Unreadable as err:
        raise _unsupported(path, f"a metadata layout this reader does not read ({err})") from err
    if not isinstance(values.get(_TOKENS), list):
        raise ModelLoadError(f"{path.name}: the file has no tokenizer vocabulary ({_TOKENS})")

    def flag(name: str) -> bool | None:
        """A boolean field, None when the file does not set it."""
        value = values.get(name)
        return None if value is None else bool(value)

    special_ids = {
        name: int(values[f"tokenizer.ggml.{key}"])
        for name, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        )
        if f"tokenizer.ggml.{key}" in values
    }
    return Vocabulary(
        architecture=str(values.get("general.architecture", "")),
        model=values.get("tokenizer.ggml.model"),
        pre=values.get("tokenizer.ggml.pre"),
        tokens=values[_TOKENS],
        scores=values.get("tokenizer.ggml.scores"),
        token_types=values.get("tokenizer.ggml.token_type") or [],
        merges=values.get(_MERGES),
        special_ids=special_ids,
        add_bos_token=flag("tokenizer.ggml.add_bos_token"),
        add_eos_token=flag("tokenizer.ggml.add_eos_token"),
        chat_template=gguf_templates(values),
    )


def generate_merges(
    vocab: dict[str, int], scores: dict[str, float] | None
) -> list[tuple[str, str]]:
    """The merges a vocabulary implies, best first: transformers' ``generate_merges``.

    Every split of every token into two tokens of the vocabulary is a merge, ranked by the
    token's score (higher first), else by its id (lower first); ties keep the order
    transformers gives them (its sorts are stable), which decides real encodings.
    """
    ranked = scores if scores is not None else vocab
    merges: list[tuple[str, str, float]] = []
    for token, rank in ranked.items():
        local = [
            (token[:at], token[at:], rank)
            for at in range(1, len(token))
            if token[:at] in vocab and token[at:] in vocab
        ]
        local.sort(key=lambda merge: (vocab[merge[0]], vocab[merge[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=scores is not None)
    return [(left, right) for left, right, _ in merges]


def _derived_merges(
    folder: Path | None, tokens: list[str], ids: dict[str, int], ranks: list[float], ranking: str
) -> Merges:
    """``generate_merges`` of ``tokens`` ranked by ``ranks``, kept in ``folder`` once derived."""
    key = merges_key(tokens, ranks, ranking)
    return cached_merges(
        folder, key, ids, lambda: generate_merges(ids, dict(zip(tokens, ranks, strict=False)))
    )


def _file_merges(path: Path, merges: list[str]) -> list[tuple[str, str]]:
    """The file's merges as pairs (each is "left right")."""
    pairs = [tuple(merge.split(" ")) for merge in merges]
    odd = next((pair for pair in pairs if len(pair) != 2), None)
    if odd is not None:
        raise _unsupported(path, f"a merge of {len(odd)} parts ({' '.join(odd)!r})")
    return pairs  # type: ignore[return-value]  # each checked to be a pair above


def _bpe(
    path: Path, vocab: dict[str, int], merges: list[tuple[str, str]], **options: Any
) -> Tokenizer:
    """A BPE tokenizer; a merge of tokens the vocabulary lacks is the file's fault, said so."""
    try:
        return Tokenizer(BPE(vocab, merges, **options))
    except Exception as err:  # tokenizers raises a bare Exception for a bad vocabulary
        raise ModelLoadError(f"{path.name}: its tokenizer cannot be built: {err}") from err


def _sentencepiece(
    path: Path, vocab: Vocabulary, merges_folder: Path | None = None
) -> tuple[Tokenizer, list[str]]:
    """The ``llama`` model: BPE over SentencePiece pieces with byte fallback.

    Merges the file lacks are derived, or read from ``merges_folder`` (None: no cache).
    Returns the tokenizer and the special tokens transformers' builder class adds by default
    (LlamaTokenizer's or GemmaTokenizer's), in its order.
    """
    tokens = vocab.tokens
    gemma = vocab.architecture in _GEMMA
    if gemma:
        # Gemma files store a token of only spaces as spaces, where the model looks up "▁"s
        tokens = [SPIECE * len(t) if " " in t and not t.strip() else t for t in tokens]
    ids = dict(zip(tokens, range(len(tokens)), strict=True))  # a repeated token: its last id
    if vocab.merges is not None:
        merges = _file_merges(path, vocab.merges)
    elif gemma:
        # Gemma's scores do not follow its merge order; the order of the tokens does
        order = [-float(index) for index in range(len(tokens))]
        merges = _derived_merges(merges_folder, tokens, ids, order, "gemma-order")
    elif vocab.scores is not None:
        merges = _derived_merges(merges_folder, tokens, ids, vocab.scores, "scores")
    else:
        raise _unsupported(path, "a SentencePiece vocabulary with neither scores nor merges")
    tokenizer: Tokenizer
    if gemma:
        tokenizer = _bpe(
            path, ids, merges, fuse_unk=True, unk_token="<unk>", dropout=None, byte_fallback=True
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous", invert=False)
        tokenizer.normalizer = normalizers.Replace(" ", SPIECE)
        tokenizer.decoder = decoders.Sequence(
            [decoders.Replace(SPIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        return tokenizer, ["<bos>", "<eos>", "<unk>", "<pad>", "<mask>"]
    tokenizer = _bpe(path, ids, merges, fuse_unk=True, byte_fallback=True, dropout=None)
    if vocab.architecture == "phi3":
        # Phi-3 prefixes the space in a normalizer, so "  hi" keeps all its spaces
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend(SPIECE), normalizers.Replace(" ", SPIECE)]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPIECE, prepend_scheme="first", split=False
        )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(SPIECE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1),  # the space the pre-tokenizer prepended
        ]
    )
    return tokenizer, ["<s>", "</s>", "<unk>"]


def _outside_alphabet() -> re.Pattern[str]:
    """A character outside the byte-level alphabet (one search scans a whole vocabulary)."""
    alphabet = "".join(bytes_to_unicode().values())
    return re.compile(f"[^{re.escape(alphabet)}]")


def _byte_level(path: Path, vocab: Vocabulary) -> tuple[Tokenizer, list[str]]:
    """The ``gpt2`` model: byte-level BPE with the file's merges (GPT2Tokenizer's shape)."""
    spelling, outside = bytes_to_unicode(), _outside_alphabet().search
    tokens = vocab.tokens
    # A token written outside the byte alphabet (a special token with a space, say) is
    # respelled byte by byte, as transformers does, so its id stays where the file has it.
    # One search over the joined vocabulary spares the usual file a test per token.
    if outside("".join(tokens)):
        tokens = [
            t if outside(t) is None else "".join(spelling[b] for b in t.encode()) for t in tokens
        ]
    if vocab.merges is None:
        raise _unsupported(path, "a byte-level vocabulary without merges")
    tokenizer = _bpe(
        path,
        dict(zip(tokens, range(len(tokens)), strict=True)),
        _file_merges(path, vocab.merges),
        dropout=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
    )
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, ["<|endoftext|>"]


def _added(tokens: Iterable[str], *, special: bool, normalized: bool | None = None) -> list[Any]:
    """AddedTokens, flagged as transformers flags them at each step."""
    if normalized is None:  # tokenizers' own default, as where transformers leaves it unset
        return [AddedToken(token, special=special) for token in tokens]
    return [AddedToken(token, special=special, normalized=normalized) for token in tokens]


def _new_added(tokenizer: Tokenizer, tokens: Iterable[str | None]) -> list[str]:
    """The tokens, once each, that are not yet added tokens (None skipped)."""
    known = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    fresh: list[str] = []
    for token in tokens:
        if token is not None and token not in known and token not in fresh:
            fresh.append(token)
    return fresh


def build_tokenizer(
    path: Path, vocab: Vocabulary, merges_folder: Path | None = None
) -> tuple[Tokenizer, dict[str, str | None]]:
    """The tokenizer transformers builds from this vocabulary, and its named special tokens.

    ``merges_folder`` keeps merges derived from a SentencePiece vocabulary (None: no cache).

    The steps and their order are transformers' (``AutoTokenizer.from_pretrained`` with
    ``gguf_file``): its builder class adds its default special tokens, the file's control
    and user-defined tokens are added, the pre-tokenizer is set by name, then the loading
    class adds the file's named special tokens (and Qwen2's class all of them again).
    Re-adding a token replaces its flags, so the order decides the result.
    """
    if vocab.model == "llama":
        tokenizer, defaults = _sentencepiece(path, vocab, merges_folder)
    elif vocab.model == "gpt2":
        split_known = vocab.pre is None or vocab.pre in PRE_TOKENIZER_SPLITS
        if not split_known and vocab.pre not in GPT2_SPLIT_NAMES:
            # transformers splits any other name as GPT-2 does; llama.cpp does not
            raise _unsupported(path, f"the pre-tokenizer {vocab.pre!r}")
        tokenizer, defaults = _byte_level(path, vocab)
    else:
        raise _unsupported(path, f"the tokenizer model {vocab.model!r}")
    tokenizer.add_tokens(_added(defaults, special=True))

    typed = list(zip(vocab.tokens, vocab.token_types, strict=False))
    outside = _outside_alphabet().search if vocab.model == "gpt2" else None
    # A control token outside a byte-level alphabet is a llama.cpp mislabel transformers skips
    control = [
        token
        for token, kind in typed
        if kind == CONTROL and (outside is None or outside(token) is None)
    ]
    if control:
        tokenizer.add_special_tokens(_added(control, special=True, normalized=False))
    user = [token for token, kind in typed if kind == USER_DEFINED]
    if user:
        # only those the vocabulary (as the model spells it) or the added tokens have
        known = tokenizer.get_vocab(with_added_tokens=True)
        user = [token for token in user if token in known]
        tokenizer.add_tokens(_added(user, special=False, normalized=False))

    split = PRE_TOKENIZER_SPLITS.get(vocab.pre or "")
    if split is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    named: dict[str, str | None] = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        token_id = vocab.special_ids.get(name)
        if token_id is not None and not 0 <= token_id < len(vocab.tokens):
            raise ModelLoadError(f"{path.name}: {name} id {token_id} is outside the vocabulary")
        named[name] = None if token_id is None else vocab.tokens[token_id]
    if vocab.architecture in _GEMMA:
        named["mask_token"] = "<mask>"  # GemmaTokenizer's own default, which the file never sets
    tokenizer.add_tokens(_added(_new_added(tokenizer, named.values()), special=True))
    if vocab.architecture in _QWEN2_CLASS:
        unique = list(dict.fromkeys(t for t in named.values() if t is not None))
        tokenizer.add_tokens(_added(unique, special=True))
    return tokenizer, named


def _post_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> Any:
    """The template transformers sets: BOS and/or EOS (token, id) around each sequence."""
    before = [f"{bos[0]}:0"] if bos else []
    single = " ".join([*before, "$A:0", *([f"{eos[0]}:0"] if eos else [])])
    pair = " ".join([single, *([f"{bos[0]}:1"] if bos else []), "$B:1"])
    pair += f" {eos[0]}:1" if eos else ""
    specials = [token for token in (bos, eos) if token is not None]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


class GGUFTokenizer:
    """A GGUF file's tokenizer with the parts of a transformers tokenizer the engine uses."""

    __slots__ = (
        "_backend",
        "_special",
        "add_bos_token",
        "add_eos_token",
        "bos_token",
        "chat_template",
        "eos_token",
        "mask_token",
        "pad_token",
        "unk_token",
    )

    def __init__(
        self, vocab: Vocabulary, path: str | Path = "model.gguf", merges_folder: Path | None = None
    ) -> None:
        """Build the tokenizer from a file's vocabulary (see ``from_gguf``).

        ``merges_folder`` keeps merges derived from a SentencePiece vocabulary (None: none).
        """
        path = Path(path)
        self._backend, named = build_tokenizer(path, vocab, merges_folder)
        self.bos_token = named["bos_token"]
        self.eos_token = named["eos_token"]
        self.unk_token = named["unk_token"]
        self.pad_token = named["pad_token"]
        self.mask_token = named.get("mask_token")
        self.chat_template = vocab.chat_template
        # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
        add_bos = vocab.add_bos_token
        if add_bos is None and vocab.model == "llama":
            add_bos = True
        # A flag naming a token the file does not have is dropped, as transformers drops it
        self.add_bos_token = bool(add_bos) and self.bos_token is not None
        self.add_eos_token = bool(vocab.add_eos_token) and self.eos_token is not None
        bos_id, eos_id = self.bos_token_id, self.eos_token_id
        self._backend.post_processor = _post_processor(
            (str(self.bos_token), bos_id) if self.add_bos_token and bos_id is not None else None,
            (str(self.eos_token), eos_id) if self.add_eos_token and eos_id is not None else None,
        )
        self._special = frozenset(self.all_special_ids)

    @classmethod
    def from_gguf(cls, path: str | Path, merges_folder: Path | None = None) -> GGUFTokenizer:
        """The tokenizer of a GGUF file; ModelLoadError when this module cannot build it."""
        return cls(read_vocabulary(path), path, merges_folder)

    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The ``tokenizers.Tokenizer`` doing the work."""
        return self._backend

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of a text; BOS/EOS as the file says when ``add_special_tokens``."""
        ids: list[int] = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """The call form of transformers' tokenizers: ``{"input_ids": ...}`` for one text."""
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of some ids; special tokens left out when ``skip_special_tokens``."""
        token_ids = [ids] if isinstance(ids, int) else list(ids)
        text: str = self._backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
        return text

    @overload
    def convert_ids_to_tokens(self, ids: int, skip_special_tokens: bool = False) -> str | None: ...

    @overload
    def convert_ids_to_tokens(
        self, ids: Sequence[int], skip_special_tokens: bool = False
    ) -> list[str | None]: ...

    def convert_ids_to_tokens(
        self, ids: int | Sequence[int], skip_special_tokens: bool = False
    ) -> str | list[str | None] | None:
        """Each id's token as the vocabulary spells it (None past the vocabulary)."""
        to_token = self._backend.id_to_token
        if isinstance(ids, int):
            token: str | None = to_token(ids)
            return token
        skip = self._special if skip_special_tokens else frozenset()
        return [to_token(int(i)) for i in ids if int(i) not in skip]

    @overload
    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...

    @overload
    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int | None]: ...

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int | None] | None:
        """Each token's id; the unknown token's id (or None) for a token not in the vocabulary."""
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(token) for token in tokens]

    def _token_id(self, token: str) -> int | None:
        """One token's id, or the unknown token's."""
        token_id: int | None = self._backend.token_to_id(token)
        if token_id is None and self.unk_token is not None:
            token_id = self._backend.token_to_id(self.unk_token)
        return token_id

    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence token's id, None when the file names none."""
        return None if self.bos_token is None else self._token_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token's id, None when the file names none."""
        return None if self.eos_token is None else self._token_id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        """The unknown token's id, None when the file names none."""
        return None if self.unk_token is None else self._token_id(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        """The padding token's id, None when the file names none."""
        return None if self.pad_token is None else self._token_id(self.pad_token)

    @property
    def vocab_size(self) -> int:
        """The size of the base vocabulary, without added tokens (transformers' meaning)."""
        size: int = self._backend.get_vocab_size(with_added_tokens=False)
        return size

    def __len__(self) -> int:
        """The size of the whole vocabulary, added tokens included."""
        size: int = self._backend.get_vocab_size(with_added_tokens=True)
        return size

    def get_vocab(self) -> dict[str, int]:
        """Every token's id, added tokens included."""
        vocab: dict[str, int] = self._backend.get_vocab(with_added_tokens=True)
        return vocab

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens (bos, eos, unk, pad, mask), once each: transformers' list."""
        named = (self.bos_token, self.eos_token, self.unk_token, self.pad_token, self.mask_token)
        return list(dict.fromkeys(token for token in named if token is not None))

    @property
    def all_special_ids(self) -> list[int]:
        """The named special tokens' ids, as transformers' ``all_special_ids``."""
        ids = (self._token_id(token) for token in self.all_special_tokens)
        return [token_id for token_id in ids if token_id is not None]

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """The added tokens (control, user-defined, named special) by id."""
        added: dict[int, Any] = self._backend.get_added_tokens_decoder()
        return added

    @property
    def special_ids(self) -> frozenset[int]:
        """Every id ``decode(skip_special_tokens=True)`` leaves out: the special added tokens."""
        return frozenset(i for i, t in self.added_tokens_decoder.items() if t.special)

    @property
    def end_of_turn_ids(self) -> set[int]:
        """The ids of END_OF_TURN's tokens that are tokens of their own (the loader's rule)."""
        ids = set()
        for text in END_OF_TURN:
            token_id = self._token_id(text)
            if token_id is not None and self._backend.id_to_token(token_id) == text:
                ids.add(token_id)
        return ids

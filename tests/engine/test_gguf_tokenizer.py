"""The tokenizer built from a GGUF file's metadata gives transformers' ids, without torch.

transformers (``AutoTokenizer.from_pretrained(folder, gguf_file=name)``) is the oracle: for
the bundled SmolLM2 file and for files written here with small vocabularies of each kind
(SentencePiece ``llama`` with scores and byte tokens, byte-level ``gpt2`` with merges under
each pre-tokenizer name, Gemma's variant), both tokenizers must agree on the whole backend,
on ids and on decoded text.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import pytest
from transformers import AutoTokenizer

from paged_llm.engine.detokenizer import Detokenizer
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model import loader
from paged_llm.engine.model.loader import bundled_gguf_path
from paged_llm.engine.tokenizer import gguf_tokenizer, merges_cache
from paged_llm.engine.tokenizer.gguf_tokenizer import GGUFTokenizer, bytes_to_unicode
from tests.helpers.without_torch import run_without_torch

ROOT = Path(__file__).resolve().parents[2]
SPIECE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

# What the vocabularies are learned from: enough German, code and numbers that merges fire
CORPUS = """
The quick brown fox jumps over the lazy dog. Turn on the kitchen light and the living room
lamp at sunset. It's warm; we'll open the windows, they've said. I'm home!
Schöne Grüße aus der Küche: die Äpfel, das Öl und die Übermaßen Größen. Straße, Fußgänger.
Das Licht im Wohnzimmer ist an. Die Temperatur beträgt 21 Grad.
def turn_on(entity_id: str) -> None:
    return hass.services.call("light", "turn_on", {"entity_id": entity_id})
for i in range(10):
    print(i * 2)  # double
1234567890 2024-05-17 3.14159 100 1000 10000
中文 东京 天气 你好 世界
"""

TEXTS = [
    "Hello world",
    "Turn on the kitchen light.",
    " leading space",
    "  two leading spaces",
    "trailing spaces  ",
    "Schöne Grüße aus der Küche: Äpfel, Öl und Übermaß! ß ẞ",
    "東京の天気は晴れです。中文测试，你好世界！ 한국어 텍스트",
    "Emoji 🤖🏠💡 flags 🇩🇪🇯🇵 family 👩‍👩‍👧 skin 👍🏽 and ✨",
    "tabs\tand\t\tmore\t\t\ttabs",
    "lines\n\nand\r\nwindows\r\n\nlast\n",
    "mixed \t \n  \n\t\t x \u00a0nbsp\u3000ideographic",
    "     ",
    "\n\n\n",
    "\t",
    "",
    "1234567890 3.14159 1,000,000 -42 0x1F 12345678901234567890123 ٣٤٥ ½",
    'def f(x):\n    return x ** 2  # square\n\nprint(f(12), {"a": [1, 2]})',
    "<|im_start|>user\nTurn on the light<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system<|im_end|><|im_end|>text<|endoftext|>",
    "<s>[INST] hi [/INST]</s><unk>",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n<eos>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<think>hmm</think> <think> spaced </think>",
    "it's I'm we'll they've DON'T You'RE",
    "a" * 300,
    "Ünïcödé\u0301 combining e\u0301 and NFC é",
    "\x00\x01 control \x7f chars \ufeff bom",
]


def write_tokenizer_gguf(
    path: Path,
    arch: str,
    model: str,
    tokens: list[str],
    types: list[int],
    *,
    scores: list[float] | None = None,
    merges: list[str] | None = None,
    pre: str | None = None,
    special: dict[str, int] | None = None,
    flags: dict[str, bool] | None = None,
    template: str | list[dict[str, str]] | None = None,
) -> Path:
    """A GGUF file of a tokenizer and the few config fields transformers needs to load it."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(256)
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_key_length(16)
    writer.add_value_length(16)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
    if merges is not None:
        writer.add_token_merges(merges)
    for name, token_id in (special or {}).items():
        writer.add_uint32(f"tokenizer.ggml.{name}_token_id", token_id)
    for name, value in (flags or {}).items():
        writer.add_bool(f"tokenizer.ggml.{name}", value)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def learn_merges(words: Counter[tuple[str, ...]], count: int) -> list[tuple[str, str]]:
    """A deterministic BPE learner: the most frequent pair first, ties by the pair's text."""
    merges: list[tuple[str, str]] = []
    words = Counter(words)
    for _ in range(count):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, n in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


@dataclass(frozen=True)
class Vocab:
    """A vocabulary as a GGUF file holds it."""

    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None


def sentencepiece_vocab(*, gemma: bool = False) -> Vocab:
    """A SentencePiece-style vocabulary: special tokens, <0x00>..<0xFF>, pieces with scores.

    Gemma's shape: its own special tokens first, tokens of only spaces stored as spaces, and
    scores that do not follow the merge order (transformers ranks Gemma's merges by position).
    """
    words = Counter(tuple(SPIECE + word) for word in CORPUS.split())
    merges = learn_merges(words, 400)
    chars = sorted({c for word in words for c in word} - set("东京天气"))  # some CJK falls back
    if gemma:
        head = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN)]
        head += [("<mask>", USER_DEFINED), ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL)]
        head += [("<think>", USER_DEFINED), ("</think>", USER_DEFINED)]
    else:
        head = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
        head += [("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("<think>", USER_DEFINED)]
    pieces = [a + b for a, b in merges]
    extra = ["  ", "    ", "\n", "\n\n", "\t"] if gemma else [SPIECE * 2, SPIECE * 4]
    body = [*chars, *extra, *pieces]
    tokens = [t for t, _ in head] + [f"<0x{b:02X}>" for b in range(256)]
    types = [k for _, k in head] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    rng = random.Random(7)
    for rank, token in enumerate(dict.fromkeys(body)):
        tokens.append(token)
        types.append(NORMAL)
        # pieces learned earlier score higher, unless Gemma's scores are to mislead
        scores.append(rng.uniform(-500, 0) if gemma else -float(rank))
    have = set(tokens)
    usable = [f"{a} {b}" for a, b in merges if a in have and b in have]  # not the CJK left out
    return Vocab(tokens, types, scores=scores, merges=usable)


_GPT2_SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


def byte_level_vocab() -> Vocab:
    """A byte-level vocabulary: control and user-defined tokens, the 256 byte spellings, merges."""
    spell = bytes_to_unicode()
    words = Counter(
        tuple(spell[b] for b in chunk.encode()) for chunk in _GPT2_SPLIT.findall(CORPUS * 2)
    )
    merges = learn_merges(words, 500)
    head = [
        ("<|endoftext|>", CONTROL),
        ("<|im_start|>", CONTROL),
        ("<|im_end|>", CONTROL),
        ("<|begin_of_text|>", CONTROL),
        ("<|eot_id|>", CONTROL),
        ("<|start_header_id|>", CONTROL),
        ("<|end_header_id|>", CONTROL),
        ("<|fim pad|>", CONTROL),  # a space: outside the byte alphabet, which transformers skips
        ("<think>", USER_DEFINED),
        ("</think>", USER_DEFINED),
    ]
    tokens = [t for t, _ in head] + [spell[b] for b in range(256)]
    tokens += [a + b for a, b in merges]
    types = [k for _, k in head] + [NORMAL] * (len(tokens) - len(head))
    return Vocab(tokens, types, merges=[f"{a} {b}" for a, b in merges])


def big_byte_level_vocab(size: int = 151_936) -> Vocab:
    """A Qwen2-sized byte-level vocabulary: random merges of tokens already there."""
    spell = bytes_to_unicode()
    rng = random.Random(11)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [spell[b] for b in range(256)]
    # mostly ASCII letters and spaces, so real text meets the merges
    common = [spell[b] for b in b" etaoinshrdlucmfwypvbgkqjxz" + bytes(range(65, 91))]
    merges = [f"{left} {right}" for left, right in grow_pieces(rng, tokens, common, size, 3)]
    types = [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3)
    return Vocab(tokens, types, merges=merges)


def grow_pieces(
    rng: random.Random, pool: list[str], letters: list[str], size: int, first: int
) -> list[tuple[str, str]]:
    """Grow ``pool`` to ``size`` tokens, each new one two already there joined; the joins.

    Mostly a short piece and one of ``letters``, so real text meets them; a left side may be
    any token from ``pool[first]`` on (not the special tokens before it).
    """
    known, short, joins = set(pool), list(letters), []
    while len(pool) < size:
        left = rng.choice(short) if rng.random() < 0.7 else pool[rng.randrange(first, len(pool))]
        right = rng.choice(letters) if rng.random() < 0.8 else rng.choice(short)
        token = left + right
        if token in known or len(token) > 16:
            continue
        known.add(token)
        pool.append(token)
        joins.append((left, right))
        if len(token) < 6:
            short.append(token)
    return joins


TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)


def _ids(vocab: Vocab, *names: str) -> dict[str, int]:
    """Each name's token's id (bos=<s> etc. given as name=token)."""
    ids = {}
    for name in names:
        key, token = name.split("=", 1)
        ids[key] = vocab.tokens.index(token)
    return ids


def write_cases(folder: Path) -> dict[str, Path]:
    """Every synthetic tokenizer file, by case name."""
    spm, gemma, bpe = sentencepiece_vocab(), sentencepiece_vocab(gemma=True), byte_level_vocab()
    spm_merges = spm  # the learned merges kept: a file that lists them
    # llama.cpp writes no merges for SentencePiece files: transformers derives them from scores
    spm, gemma = (
        Vocab(spm.tokens, spm.types, spm.scores),
        Vocab(gemma.tokens, gemma.types, gemma.scores),
    )
    spm_ids = _ids(spm, "bos=<s>", "eos=</s>", "unknown=<unk>")
    files = {
        # Llama 2 / Mistral: no add_bos flag (BOS by default), no pre-tokenizer
        "llama-spm": ("llama", "llama", spm, None, spm_ids, {}),
        "llama-spm-flags": (
            "llama",
            "llama",
            spm,
            "default",
            {**spm_ids, "padding": 0},
            {"add_bos_token": False, "add_eos_token": True, "add_space_prefix": False},
        ),
        "mistral-spm-chatml-eos": (
            "mistral",
            "llama",
            spm,
            None,
            {"bos": 1, "eos": spm.tokens.index("<|im_end|>"), "unknown": 0},
            {"add_bos_token": True},
        ),
        "llama-spm-merges": ("llama", "llama", spm_merges, None, spm_ids, {}),
        "phi3-spm": ("phi3", "llama", spm, None, {**spm_ids, "padding": 2}, {}),
        "gemma3": (
            "gemma3",
            "llama",
            gemma,
            "default",
            _ids(gemma, "bos=<bos>", "eos=<eos>", "unknown=<unk>", "padding=<pad>"),
            {"add_bos_token": True, "add_eos_token": False},
        ),
        "gemma2": (
            "gemma2",
            "llama",
            gemma,
            None,
            _ids(gemma, "bos=<bos>", "eos=<eos>", "unknown=<unk>", "padding=<pad>"),
            {},
        ),
        "llama3-llama-bpe": (
            "llama",
            "gpt2",
            bpe,
            "llama-bpe",
            _ids(bpe, "bos=<|begin_of_text|>", "eos=<|eot_id|>"),
            {"add_bos_token": True},
        ),
        "qwen2": (
            "qwen2",
            "gpt2",
            bpe,
            "qwen2",
            _ids(bpe, "bos=<|endoftext|>", "eos=<|im_end|>", "padding=<|endoftext|>"),
            {"add_bos_token": False},
        ),
        "qwen3-no-bos": ("qwen3", "gpt2", bpe, "qwen2", _ids(bpe, "eos=<|im_end|>"), {}),
        "smollm": (
            "llama",
            "gpt2",
            bpe,
            "smollm",
            _ids(bpe, "bos=<|im_start|>", "eos=<|im_end|>", "unknown=<|endoftext|>"),
            {"add_bos_token": False},
        ),
        "gpt2-default": ("llama", "gpt2", bpe, "default", _ids(bpe, "eos=<|endoftext|>"), {}),
        "gpt2-no-pre": (
            "llama",
            "gpt2",
            bpe,
            None,
            _ids(bpe, "bos=<|endoftext|>", "eos=<|endoftext|>"),
            {"add_bos_token": True, "add_eos_token": True},
        ),
    }
    paths = {}
    for name, (arch, model, vocab, pre, special, flags) in files.items():
        case = folder / name
        case.mkdir()
        paths[name] = write_tokenizer_gguf(
            case / "tokenizer.gguf",
            arch,
            model,
            vocab.tokens,
            vocab.types,
            scores=vocab.scores,
            merges=vocab.merges,
            pre=pre,
            special=special,
            flags=flags,
            template=TEMPLATE,
        )
    return paths


CASES = [
    "bundled-smollm2",
    "llama-spm",
    "llama-spm-flags",
    "llama-spm-merges",
    "mistral-spm-chatml-eos",
    "phi3-spm",
    "gemma3",
    "gemma2",
    "llama3-llama-bpe",
    "qwen2",
    "qwen3-no-bos",
    "smollm",
    "gpt2-default",
    "gpt2-no-pre",
]


@dataclass(frozen=True)
class Pair:
    """Ours and transformers' tokenizer of one file."""

    path: Path
    ours: GGUFTokenizer
    theirs: Any


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The synthetic files and the bundled one."""
    paths = write_cases(tmp_path_factory.mktemp("gguf-tokenizers"))
    paths["bundled-smollm2"] = bundled_gguf_path("SmolLM2-135M-Instruct")
    return paths


def transformers_tokenizer(path: Path) -> Any:
    """The oracle: transformers' tokenizer for the same file."""
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


_PAIRS: dict[str, Pair] = {}


@pytest.fixture(params=CASES)
def pair(request: pytest.FixtureRequest, files: dict[str, Path]) -> Pair:
    """Both tokenizers of a case, built once per module."""
    name = request.param
    if name not in _PAIRS:
        path = files[name]
        _PAIRS[name] = Pair(path, GGUFTokenizer.from_gguf(path), transformers_tokenizer(path))
    return _PAIRS[name]


def test_backend_is_transformers_own(pair: Pair) -> None:
    """Model, vocabulary, merges, added tokens, normalizer, pre-tokenizer, decoder, template."""
    ours = json.loads(pair.ours.backend_tokenizer.to_str())
    theirs = json.loads(pair.theirs.backend_tokenizer.to_str())
    for key in theirs:
        assert ours[key] == theirs[key], key
    assert ours == theirs


def test_ids_identical(pair: Pair) -> None:
    """Every text's ids, with and without BOS/EOS, and the decoded text of each."""
    for text in TEXTS:
        for add in (True, False):
            ids = pair.ours.encode(text, add_special_tokens=add)
            assert ids == pair.theirs.encode(text, add_special_tokens=add), (text, add)
            assert pair.ours(text, add_special_tokens=add)["input_ids"] == ids
            for skip in (False, True):
                want = pair.theirs.decode(ids, skip_special_tokens=skip)
                assert pair.ours.decode(ids, skip_special_tokens=skip) == want, (text, skip)


def test_round_trip(pair: Pair) -> None:
    """Text without special tokens decodes back to itself where transformers' does."""
    for text in TEXTS:
        ids = pair.ours.encode(text, add_special_tokens=False)
        if pair.theirs.decode(ids) == text:
            assert pair.ours.decode(ids) == text


def test_special_tokens_and_vocabulary(pair: Pair) -> None:
    """Named special tokens, flags, sizes, token<->id maps and the chat template."""
    ours, theirs = pair.ours, pair.theirs
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(ours, name) == getattr(theirs, name), name
        assert getattr(ours, f"{name}_id") == getattr(theirs, f"{name}_id"), name
    assert ours.add_bos_token == theirs.add_bos_token
    assert ours.add_eos_token == theirs.add_eos_token
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert ours.all_special_ids == theirs.all_special_ids
    assert ours.vocab_size == theirs.vocab_size
    assert len(ours) == len(theirs)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.chat_template == theirs.chat_template
    assert ours.added_tokens_decoder == theirs.added_tokens_decoder
    every = list(range(len(theirs) + 2))  # two ids past the end: None from both
    assert ours.convert_ids_to_tokens(every) == theirs.convert_ids_to_tokens(every)
    for skip in (False, True):
        want = theirs.convert_ids_to_tokens(every[:300], skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(every[:300], skip_special_tokens=skip) == want
    assert ours.convert_ids_to_tokens(5) == theirs.convert_ids_to_tokens(5)
    probes = ["<|im_end|>", "<end_of_turn>", "no such token", "a", SPIECE + "the", "<0x0A>"]
    assert ours.convert_tokens_to_ids(probes) == theirs.convert_tokens_to_ids(probes)
    for probe in probes:
        assert ours.convert_tokens_to_ids(probe) == theirs.convert_tokens_to_ids(probe)
    assert ours.end_of_turn_ids == loader.end_of_turn_ids(theirs)
    assert ours.special_ids == {
        i for i, token in theirs.added_tokens_decoder.items() if token.special
    }


def test_end_of_turn_list_is_the_loaders() -> None:
    """The module's copy of the loader's end-of-turn tokens (the loader imports torch)."""
    assert gguf_tokenizer.END_OF_TURN == loader.END_OF_TURN


def test_bundled_file_ends_turns_at_im_end(files: dict[str, Path]) -> None:
    """SmolLM2's ChatML: BOS <|im_start|>, EOS and end of turn <|im_end|>, no BOS added."""
    tokenizer = GGUFTokenizer.from_gguf(files["bundled-smollm2"])
    assert tokenizer.bos_token == "<|im_start|>"
    assert tokenizer.eos_token == "<|im_end|>"
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tokenizer.end_of_turn_ids
    assert tokenizer.encode("hi") == tokenizer.encode("hi", add_special_tokens=False)
    assert tokenizer.chat_template is not None
    assert "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.encode("<|im_start|>user")[0] == tokenizer.bos_token_id


def stream(tokenizer: Any, ids: list[int]) -> list[str]:
    """The engine's detokenizer fed one id at a time: the deltas it yields."""
    detokenizer = Detokenizer(tokenizer, ())
    deltas = []
    for n in range(1, len(ids) + 1):
        delta, _ = detokenizer.add(ids[:n], 0)
        deltas.append(delta)
    deltas.append(detokenizer.flush())
    return deltas


def test_streaming_never_splits_a_character(pair: Pair) -> None:
    """Streamed deltas are whole characters, join to decode(all) and match transformers'."""
    for text in TEXTS:
        ids = pair.ours.encode(text, add_special_tokens=False)
        deltas = stream(pair.ours, ids)
        whole = pair.ours.decode(ids, skip_special_tokens=True)
        assert "".join(deltas) == stream_text(pair.theirs, ids), text
        if "\ufffd" not in whole:
            assert not any("\ufffd" in delta for delta in deltas), (text, deltas)
            assert "".join(deltas) == whole, text


def stream_text(tokenizer: Any, ids: list[int]) -> str:
    """What transformers' tokenizer streams through the same detokenizer."""
    return "".join(stream(tokenizer, ids))


def test_streaming_emoji_byte_by_byte() -> None:
    """Byte tokens of a 4-byte emoji yield nothing until the character is whole."""
    vocab = sentencepiece_vocab()
    tokenizer = GGUFTokenizer(
        gguf_tokenizer.Vocabulary(
            architecture="llama",
            model="llama",
            pre=None,
            tokens=vocab.tokens,
            scores=vocab.scores,
            token_types=vocab.types,
            merges=None,
            special_ids={"bos_token": 1, "eos_token": 2, "unk_token": 0},
            add_bos_token=False,
            add_eos_token=None,
            chat_template=None,
        )
    )
    ids = tokenizer.encode("a🤖b", add_special_tokens=False)
    assert [tokenizer.convert_ids_to_tokens(i) for i in ids][-5:-1] == [
        "<0xF0>",
        "<0x9F>",
        "<0xA4>",
        "<0x96>",
    ]
    # nothing while the character's bytes arrive, then the whole character at once
    assert stream(tokenizer, ids) == ["a", "", "", "", "🤖", "b", ""]


def _vocabulary(**changes: Any) -> gguf_tokenizer.Vocabulary:
    """A small byte-level vocabulary, changed as asked."""
    vocab = byte_level_vocab()
    fields: dict[str, Any] = {
        "architecture": "llama",
        "model": "gpt2",
        "pre": "default",
        "tokens": vocab.tokens,
        "scores": None,
        "token_types": vocab.types,
        "merges": vocab.merges,
        "special_ids": {"eos_token": 0},
        "add_bos_token": None,
        "add_eos_token": None,
        "chat_template": None,
    }
    fields.update(changes)
    return gguf_tokenizer.Vocabulary(**fields)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"model": "t5"}, "the tokenizer model 't5'"),
        ({"model": "rwkv"}, "the tokenizer model 'rwkv'"),
        ({"model": None}, "the tokenizer model None"),
        ({"pre": "deepseek-llm"}, "the pre-tokenizer 'deepseek-llm'"),
        ({"pre": "starcoder"}, "the pre-tokenizer 'starcoder'"),
        ({"merges": None}, "a byte-level vocabulary without merges"),
        (
            {"model": "llama", "pre": None, "scores": None, "merges": None},
            "neither scores nor merges",
        ),
    ],
)
def test_what_it_cannot_build_is_named(changes: dict[str, Any], named: str) -> None:
    """An unknown tokenizer model or pre-tokenizer: ModelLoadError naming it and the torch path."""
    with pytest.raises(ModelLoadError) as caught:
        GGUFTokenizer(_vocabulary(**changes), "odd.gguf")
    message = str(caught.value)
    assert named in message
    assert "odd.gguf" in message
    assert "paged-llm[engine]" in message


@pytest.mark.parametrize(
    ("merges", "named"),
    [(["zz qq"], "cannot be built"), (["a b c"], "a merge of 3 parts")],
)
def test_broken_merges_are_a_load_error(merges: list[str], named: str) -> None:
    """Merges of tokens the vocabulary lacks, or not of two parts: ModelLoadError, not a crash."""
    with pytest.raises(ModelLoadError, match=named):
        GGUFTokenizer(_vocabulary(merges=merges), "odd.gguf")


def test_unknown_tokenizer_model_in_a_file(tmp_path: Path) -> None:
    """The same error from a file on disk, before anything else is built."""
    vocab = byte_level_vocab()
    path = write_tokenizer_gguf(
        tmp_path / "bert.gguf", "llama", "bert", vocab.tokens, vocab.types, merges=vocab.merges
    )
    with pytest.raises(ModelLoadError, match=r"tokenizer model 'bert'.*paged-llm\[engine\]"):
        GGUFTokenizer.from_gguf(path)


def test_file_without_vocabulary(tmp_path: Path) -> None:
    """A GGUF with no tokenizer at all is a load error, not a crash."""
    writer = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="no tokenizer vocabulary"):
        GGUFTokenizer.from_gguf(tmp_path / "bare.gguf")


# Builds and uses the tokenizer where torch and transformers cannot be imported.
NO_TORCH = """
from paged_llm.engine.tokenizer.gguf_tokenizer import GGUFTokenizer
tokenizer = GGUFTokenizer.from_gguf({path!r})
ids = tokenizer.encode("<|im_start|>user\\nSchöne Grüße 🤖<|im_end|>")
assert tokenizer.decode(ids, skip_special_tokens=True) == "user\\nSchöne Grüße 🤖", ids
print(len(ids))
"""


def test_imports_neither_torch_nor_transformers(files: dict[str, Path]) -> None:
    """Building and using the tokenizer works where torch and transformers cannot be imported."""
    result = run_without_torch(NO_TORCH.format(path=str(files["bundled-smollm2"])))
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip()) > 5


def _big_files(folder: Path) -> Iterable[Path]:
    """A Qwen2-sized byte-level file (151,936 tokens)."""
    vocab = big_byte_level_vocab()
    yield write_tokenizer_gguf(
        folder / "big.gguf",
        "qwen2",
        "gpt2",
        vocab.tokens,
        vocab.types,
        merges=vocab.merges,
        pre="qwen2",
        special={"eos": 2, "padding": 0, "bos": 0},
        flags={"add_bos_token": False},
    )


def test_qwen2_sized_vocabulary(tmp_path: Path) -> None:
    """151,936 tokens: the same ids as transformers on every text."""
    (path,) = _big_files(tmp_path)
    ours, theirs = GGUFTokenizer.from_gguf(path), transformers_tokenizer(path)
    assert len(ours) == len(theirs) == 151_936
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text


def big_sentencepiece_vocab(size: int = 262_144, seed: int = 5) -> Vocab:
    """A Gemma-sized SentencePiece vocabulary with scores and no merges, as llama.cpp writes one.

    Each piece joins two pieces already there, so ``generate_merges`` finds splits for it as
    in a real vocabulary; scores fall with the rank in steps of two, so ties are there too.
    """
    rng = random.Random(seed)
    head = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
    tokens = [t for t, _ in head] + [f"<0x{b:02X}>" for b in range(256)]
    types = [k for _, k in head] + [BYTE] * 256
    letters = list(dict.fromkeys(SPIECE + "etaoinshrdlucmfwypvbgkqjxzäöüßETAOIN0123456789.,"))
    pool = tokens + letters
    grow_pieces(rng, pool, letters, size, len(tokens))
    body = pool[len(tokens) :]
    scores = [0.0] * len(tokens) + [-float(rank // 2) for rank in range(len(body))]
    return Vocab(tokens + body, types + [NORMAL] * len(body), scores=scores)


def write_big_sentencepiece(path: Path, size: int) -> Path:
    """A file of ``big_sentencepiece_vocab(size)``: BOS added, no merges, a template."""
    vocab = big_sentencepiece_vocab(size)
    return write_tokenizer_gguf(
        path, "llama", "llama", vocab.tokens, vocab.types, scores=vocab.scores,
        special={"bos": 1, "eos": 2, "unknown": 0}, template=TEMPLATE,
    )  # fmt: skip


# Files without merges (llama.cpp writes none for SentencePiece): theirs are derived.
DERIVED = ["llama-spm", "phi3-spm", "gemma3", "gemma2"]


def _derivations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count generate_merges' calls from now on (one item per call)."""
    calls: list[int] = []
    derive = gguf_tokenizer.generate_merges

    def counted(*args: Any) -> Any:
        calls.append(1)
        return derive(*args)

    monkeypatch.setattr(gguf_tokenizer, "generate_merges", counted)
    return calls


def _same_tokenizer(got: GGUFTokenizer, fresh: GGUFTokenizer, texts: Iterable[str]) -> None:
    """The whole backend (merges in order included) and every text's ids are the fresh one's."""
    assert got.backend_tokenizer.to_str() == fresh.backend_tokenizer.to_str()
    for text in texts:
        for add in (True, False):
            assert got.encode(text, add) == fresh.encode(text, add), text


def _entries(folder: Path) -> list[Path]:
    """The files in a cache folder (a temporary file left behind would show here too)."""
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("name", DERIVED)
def test_derived_merges_are_kept_and_read_back(
    files: dict[str, Path], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load derives and keeps the merges; the next reads them: the same tokenizer."""
    fresh = GGUFTokenizer.from_gguf(files[name])
    calls = _derivations(monkeypatch)
    folder = tmp_path / "tokenizers"
    first = GGUFTokenizer.from_gguf(files[name], folder)
    assert calls == [1]
    (entry,) = _entries(folder)
    assert entry.suffix == ".json"
    again = GGUFTokenizer.from_gguf(files[name], folder)
    assert calls == [1]  # read back, not derived
    assert _entries(folder) == [entry]
    for got in (first, again):
        _same_tokenizer(got, fresh, TEXTS)


@pytest.mark.parametrize("name", ["llama-spm-merges", "qwen2", "bundled-smollm2"])
def test_merges_from_the_file_are_not_kept(
    files: dict[str, Path], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that lists its merges is read as it is: nothing derived, nothing kept."""
    calls = _derivations(monkeypatch)
    GGUFTokenizer.from_gguf(files[name], tmp_path / "tokenizers")
    assert calls == []
    assert _entries(tmp_path / "tokenizers") == []


def test_a_large_vocabulary_reads_its_merges_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """65,536 pieces with scores: the kept merges tokenize every text as derived ones do."""
    path = write_big_sentencepiece(tmp_path / "big.gguf", 65_536)
    fresh = GGUFTokenizer.from_gguf(path)
    folder = tmp_path / "tokenizers"
    GGUFTokenizer.from_gguf(path, folder)

    def refuse(*args: Any) -> Any:
        raise AssertionError("derived again instead of read back")

    monkeypatch.setattr(gguf_tokenizer, "generate_merges", refuse)
    rng = random.Random(3)
    words = ["".join(rng.choices("etaoinshrdlucmfwypäöü0123456789", k=9)) for _ in range(300)]
    _same_tokenizer(GGUFTokenizer.from_gguf(path, folder), fresh, [*TEXTS, " ".join(words)])


DAMAGE = {
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "not utf-8": lambda good: b"\xff\xfe" + good,
    "not a list": lambda good: b'{"merges": []}',
    "odd length": lambda good: good[:-1] + b', "a"]',
    "foreign token": lambda good: good.replace(b'"', b'"\xc3\xa9', 1),
    "not strings": lambda good: b"[1, 2]",
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_derived_again(
    files: dict[str, Path],
    damage: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An entry that does not read back as this vocabulary's merges: derived and written again."""
    path, folder = files["llama-spm"], tmp_path / "tokenizers"
    fresh = GGUFTokenizer.from_gguf(path, folder)
    (entry,) = _entries(folder)
    good = entry.read_bytes()
    entry.write_bytes(DAMAGE[damage](good))
    calls = _derivations(monkeypatch)
    with caplog.at_level(logging.DEBUG, "paged_llm.engine.tokenizer.merges_cache"):
        rebuilt = GGUFTokenizer.from_gguf(path, folder)
    assert calls == [1]
    assert "rebuilding" in caplog.text
    _same_tokenizer(rebuilt, fresh, TEXTS)
    assert entry.read_bytes() == good
    assert _entries(folder) == [entry]


def test_a_folder_that_cannot_be_written_is_no_error(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where nothing can be kept the merges are derived every time, and the load goes on."""
    fresh = GGUFTokenizer.from_gguf(files["gemma3"])
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    calls = _derivations(monkeypatch)
    for folder in (blocker, blocker / "tokenizers"):
        _same_tokenizer(GGUFTokenizer.from_gguf(files["gemma3"], folder), fresh, TEXTS)
    assert calls == [1, 1]
    assert blocker.read_text() == "not a folder"


def test_the_key_covers_what_the_derivation_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other tokens, order, ranks, ranking or algorithm version: another entry."""
    tokens, ranks = ["a", "b", "ab"], [0.0, -1.0, -2.0]
    key = merges_cache.merges_key(tokens, ranks, "scores")
    assert key == merges_cache.merges_key(list(tokens), list(ranks), "scores")
    others = [
        merges_cache.merges_key(["b", "a", "ab"], ranks, "scores"),
        merges_cache.merges_key(["a", "b", "aB"], ranks, "scores"),
        merges_cache.merges_key(["a\x00b", "ab"], ranks, "scores"),
        merges_cache.merges_key(tokens, [0.0, -1.0, -2.5], "scores"),
        merges_cache.merges_key(tokens, ranks, "gemma-order"),
    ]
    monkeypatch.setattr(merges_cache, "ALGORITHM_VERSION", merges_cache.ALGORITHM_VERSION + 1)
    others.append(merges_cache.merges_key(tokens, ranks, "scores"))
    assert len({key, *others}) == len(others) + 1


def test_named_chat_templates_are_read(tmp_path: Path) -> None:
    """tokenizer.chat_template.<name> as llama.cpp's converter writes it: a dict by name."""
    vocab, tool_use = byte_level_vocab(), TEMPLATE + "{{ tools | length }}"
    path = write_tokenizer_gguf(
        tmp_path / "named.gguf", "qwen2", "gpt2", vocab.tokens, vocab.types,
        merges=vocab.merges, pre="qwen2", special={"eos": 2},
        template=[
            {"name": "tool_use", "template": tool_use}, {"name": "default", "template": TEMPLATE}
        ],
    )  # fmt: skip
    want = {"default": TEMPLATE, "tool_use": tool_use}
    assert gguf_tokenizer.read_vocabulary(path).chat_template == want
    assert GGUFTokenizer.from_gguf(path).chat_template == want
    # transformers' GGUF loader reads tokenizer.chat_template alone: the torch path's
    # tokenizer has only the default (why the numpy path does not compare with it here)
    assert transformers_tokenizer(path).chat_template == TEMPLATE

"""Tokenizer: text <-> token ids through a `tokenizers` object, built from tokenizer.json, a
sentencepiece tokenizer.model or GGUF metadata; special tokens; the model's chat template
rendered in jinja2's sandbox."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

from corellm.chat_template import DEFAULT_MAX_SECONDS, ChatTemplateError, render_chat_template  # noqa: F401


# The names Tokenizer.apply_chat_template and render_chat_template take for their own parameters:
# a template variable (chat_template_kwargs) named so would reach the call as a second value for
# that parameter, or replace it. Callers that pass a user's variables refuse these names.
CHAT_TEMPLATE_PARAMETERS = frozenset({"self", "messages", "template", "chat_template", "add_generation_prompt",
                                      "continue_final_message", "max_render_seconds", "max_seconds",
                                      "max_output_chars"})


@dataclass
class Tokenizer:
    backend: tokenizers.Tokenizer
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)  # every token that ends generation
    pad_token_id: int | None = None
    chat_template: str | None = None
    source: str = ""

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text to encode must be a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_pair(self, first: str, second: str, add_special_tokens: bool = True) -> tuple[list[int], list[int]]:
        """Two texts encoded as one input (a cross-encoder's query and document): (the ids, each
        one's token type). The tokenizer's pair template puts its special tokens around and between
        them and gives each its type (BERT's: 1 over the second text) as transformers'
        tokenizer(first, second) does; a tokenizer without one joins them as they are, all type 0."""
        for name, text in (("first", first), ("second", second)):
            if not isinstance(text, str):
                raise ValueError(f"the {name} text of a pair must be a str, got {type(text).__name__}")
        encoding = self.backend.encode(first, second, add_special_tokens=add_special_tokens)
        return encoding.ids, encoding.type_ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def is_special(self, token_id: int) -> bool:
        """Whether the token is a special added token (skipped by skip_special_tokens)."""
        added = self.backend.get_added_tokens_decoder().get(token_id)
        return added is not None and added.special

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    # ------------------------------------------------------------------ chat
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        max_render_seconds: float = DEFAULT_MAX_SECONDS,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> str:
        """The conversation as prompt text; extra variables (tools, chat_template_kwargs) reach the
        template. continue_final_message: the text ends right after the last message's content,
        left open for the model to continue (as transformers does it)."""
        template = chat_template or self.chat_template
        if not template:
            raise ChatTemplateError(f"{self.source}: the model has no chat template; pass a prompt instead")
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message needs add_generation_prompt false")
        variables = {"bos_token": self._token_text(self.bos_token_id), "eos_token": self._token_text(self.eos_token_id),
                     **extra}
        text = render_chat_template(template, messages, max_seconds=max_render_seconds,
                                    add_generation_prompt=add_generation_prompt, **variables)
        if continue_final_message:
            final = messages[-1].get("content") or "" if messages else ""
            at = text.rfind(final) if final else -1
            if at < 0:
                raise ChatTemplateError("continue_final_message: the template does not show the final message's content")
            text = text[:at + len(final)]
        return text

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf_dir(cls, path: Path) -> "Tokenizer":
        path = Path(path)
        config = _read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").exists() else {}
        if (path / "tokenizer.json").exists():
            backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
            # A file saved from a tokenizer that padded or truncated (all-MiniLM-L6-v2's: to 128) would
            # do it on every encode; as in transformers, a prompt is encoded whole and unpadded (its
            # cut is the request's truncate_prompt_tokens, never silent).
            backend.no_padding()
            backend.no_truncation()
            source = str(path / "tokenizer.json")
        elif (path / "tokenizer.model").exists():
            backend = _from_sentencepiece_file(path / "tokenizer.model", config.get("add_bos_token", True))
            source = str(path / "tokenizer.model")
        else:
            raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer.model")
        # Tokens the config declares as added/special are matched whole.
        added = config.get("added_tokens_decoder") or {}
        specials = [AddedToken(t["content"], special=bool(t.get("special", True)), normalized=False)
                    for t in added.values() if backend.token_to_id(t["content"]) is None]
        if specials:
            backend.add_special_tokens(specials)

        def token_id(name: str) -> int | None:
            tok = config.get(name)
            if isinstance(tok, dict):
                tok = tok.get("content")
            return backend.token_to_id(tok) if isinstance(tok, str) else None

        template = config.get("chat_template")
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        if template is None and (path / "chat_template.json").exists():  # a processor's (LLaVA models)
            template = _read_json(path / "chat_template.json").get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        eos = token_id("eos_token")
        return cls(backend, bos_token_id=token_id("bos_token"), eos_token_ids=[] if eos is None else [eos],
                   pad_token_id=token_id("pad_token"), chat_template=template, source=source)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


# ---------------------------------------------------------------------- builders

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-4o's (o200k's) split, gpt-oss's tokenizer: words with their leading capitals and a contraction
GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """How llama.cpp's pre-tokenizer types split text before byte-level BPE."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    split = {"llama3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT,
             "smaug-bpe": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT,
             "glm4": LLAMA3_SPLIT, "chatglm-bpe": LLAMA3_SPLIT,  # (llama.cpp's CHATGLM4: the same)
             "gpt-4o": GPT4O_SPLIT}.get(pre or "")
    if split is not None:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"), byte_level])
    steps = []
    if pre == "smollm":  # each digit on its own, then the GPT-2 split
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    return pre_tokenizers.Sequence(steps)


# llama.cpp's pre-tokenizer types whose BPE takes a whole pre-token that is in the vocabulary as it is,
# before any merge (its ignore_merges; Llama 3's tokenizer.json says "ignore_merges": true)
IGNORE_MERGES_PRE = ("llama3", "llama-v3", "llama-bpe", "glm4", "glm5")


def byte_level_bpe(tokens: list[str], merges: list[str], token_types: list[int] | None, pre: str | None,
                   bos_token_id: int | None, add_bos: bool) -> tokenizers.Tokenizer:
    """GPT-2 style byte-level BPE from a GGUF vocabulary (tokenizer.ggml.model == "gpt2")."""
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                                              ignore_merges=pre in IGNORE_MERGES_PRE))
    backend.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    _add_control_tokens(backend, tokens, token_types)
    _set_bos(backend, tokens, bos_token_id, add_bos)
    return backend


def sentencepiece_bpe(tokens: list[str], scores: list[float], token_types: list[int] | None,
                      bos_token_id: int | None, add_bos: bool, add_space_prefix: bool = True) -> tokenizers.Tokenizer:
    """Sentencepiece-style BPE (llama vocabularies): merges recovered from the scores, '▁' for
    spaces, unknown characters as <0xXX> byte tokens."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = _merges_from_scores(tokens, scores, token_types)
    unk = next((t for t, ty in zip(tokens, token_types or []) if ty == 2), None)
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                                              byte_fallback=True))
    steps = [normalizers.Replace(" ", "\u2581")]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    backend.normalizer = normalizers.Sequence(steps)
    decode_steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        decode_steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(decode_steps)
    _add_control_tokens(backend, tokens, token_types)
    _set_bos(backend, tokens, bos_token_id, add_bos)
    return backend


def wordpiece_from_phantom(tokens: list[str], token_types: list[int] | None, unk_token_id: int, cls_token_id: int,
                           sep_token_id: int, lowercase: bool = True) -> tokenizers.Tokenizer:
    """BERT's WordPiece from a GGUF vocabulary (tokenizer.ggml.model == "bert"). llama.cpp's converter
    wrote it in "phantom space" form: a word's first piece as "▁" + piece, a continuation without
    WordPiece's "##", a control token ([CLS], [SEP], [PAD], ...) as it is; this turns it back. Then
    BERT's text steps (clean-up, Chinese characters apart, accents stripped and lower case where the
    file says so, a split at whitespace and punctuation) and its template: [CLS] A [SEP], and for a
    pair [CLS] A [SEP] B [SEP] with B's part token type 1."""
    control = [bool(token_types) and token_types[i] == 3 for i in range(len(tokens))]
    pieces = [t if control[i] else t[1:] if t.startswith("\u2581") else "##" + t for i, t in enumerate(tokens)]
    vocab = {}
    for i, piece in enumerate(pieces):
        vocab.setdefault(piece, i)
    backend = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token=pieces[unk_token_id],
                                                    max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                    lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens([AddedToken(p, special=True, normalized=False)
                                for p, is_control in zip(pieces, control) if is_control])
    cls, sep = pieces[cls_token_id], pieces[sep_token_id]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, cls_token_id), (sep, sep_token_id)])
    return backend


def unigram_from_gguf(tokens: list[str], scores: list[float], token_types: list[int] | None, unk_token_id: int,
                      bos_token_id: int, eos_token_id: int, add_space_prefix: bool = True,
                      remove_extra_whitespaces: bool = True, precompiled_charsmap: bytes | None = None
                      ) -> tokenizers.Tokenizer:
    """An XLM-RoBERTa's sentencepiece Unigram vocabulary from a GGUF file (tokenizer.ggml.model ==
    "t5", as llama.cpp's converter writes an XLMRobertaModel: <s> <pad> </s> <unk>, then the pieces
    with their scores), segmenting as the sentencepiece model it came from does: the model's own
    normalization (its precompiled charsmap: NFKC and more), the spaces around the text dropped and
    runs of them made one (remove_extra_whitespaces, as sentencepiece does), "▁" for each space and
    before the text (add_space_prefix), the Viterbi segmentation by the scores; and RoBERTa's
    template: <s> A </s>, a pair <s> A </s> </s> B </s>, every token of type 0."""
    backend = tokenizers.Tokenizer(models.Unigram([(t, float(sc)) for t, sc in zip(tokens, scores)],
                                                  unk_id=unk_token_id, byte_fallback=False))
    steps = [normalizers.Precompiled(precompiled_charsmap)] if precompiled_charsmap else []
    if remove_extra_whitespaces:  # as sentencepiece: none before or after the text, runs made one
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(tokenizers.Regex(" {2,}"), " ")]
    backend.normalizer = normalizers.Sequence(steps)
    scheme = "always" if add_space_prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    _add_control_tokens(backend, tokens, token_types)
    bos, eos = tokens[bos_token_id], tokens[eos_token_id]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0", pair=f"{bos}:0 $A:0 {eos}:0 {eos}:0 $B:0 {eos}:0",
        special_tokens=[(bos, bos_token_id), (eos, eos_token_id)])
    return backend


def _merges_from_scores(tokens, scores, token_types) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a normal token, best merged token first."""
    normal = {t: i for i, t in enumerate(tokens) if not token_types or token_types[i] == 1}
    found = []
    for merged, idx in normal.items():
        for cut in range(1, len(merged)):
            left, right = merged[:cut], merged[cut:]
            if left in normal and right in normal:
                found.append((-scores[idx], normal[left], normal[right], left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def _add_control_tokens(backend: tokenizers.Tokenizer, tokens, token_types) -> None:
    if not token_types:
        return
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, token_types) if ty == 3]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, token_types) if ty == 4]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


def _set_bos(backend: tokenizers.Tokenizer, tokens, bos_token_id, add_bos) -> None:
    if add_bos and bos_token_id is not None:
        bos = tokens[bos_token_id]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1", special_tokens=[(bos, bos_token_id)])


def _from_sentencepiece_file(path: Path, add_bos: bool) -> tokenizers.Tokenizer:
    import sentencepiece  # a test/optional dependency for tokenizer.model directories

    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [sp.get_score(i) for i in range(n)]
    # sentencepiece types -> GGUF token types (1 normal, 2 unknown, 3 control, 4 user, 6 byte)
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)]
    bos = sp.bos_id() if sp.bos_id() >= 0 else None
    return sentencepiece_bpe(tokens, scores, types, bos, add_bos)

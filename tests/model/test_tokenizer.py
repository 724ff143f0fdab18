"""Tokenizers built by corellm encode and decode exactly as the references: transformers'
tokenizer for the SmolLM2 GGUF, and sentencepiece itself for sentencepiece vocabularies (from a
tokenizer.model and from a GGUF "llama" vocabulary). Chat templates render in a sandbox."""

from __future__ import annotations

import pytest

from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path
from corellm.tokenizer import ChatTemplateError, Tokenizer, render_chat_template

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Numbers: 0 1 12 123 1234567890 3.14159 -42 1e-9 $1,000,000",
    "日本語のテキストです。東京は日本の首都です。",
    "中文测试：你好，世界！",
    "한국어 문장입니다.",
    "Русский текст с ёжиками и Ъ.",
    "العربية نص تجريبي",
    "Emoji: 🎉🔥👍🏽 👨‍👩‍👧‍👦 ❤️ 🇯🇵",
    "Ünïcödé naïve café façade — “quotes” ‘single’ …",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // C++\n\ttab\r\nwindows",
    "   leading and trailing spaces   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "",
    "a" * 300,
    "\u200b zero width \ufeff bom \u00a0 nbsp",
]


@pytest.fixture(scope="module")
def smollm2():
    transformers = pytest.importorskip("transformers")
    path = default_model_path()
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return GGUFModelFile(path).tokenizer(), hf


@pytest.mark.parametrize("text", CORPUS)
def test_smollm2_encode_decode_equal_transformers(smollm2, text):
    ours, hf = smollm2
    ids = ours.encode(text)
    assert ids == hf.encode(text, add_special_tokens=True)
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_smollm2_special_tokens_and_chat_template(smollm2):
    ours, hf = smollm2
    assert ours.eos_token_ids == [2] and ours.bos_token_id == 1
    assert ours.id_to_token(2) == "<|im_end|>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 👋"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    for gen in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=gen) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen)


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    text = d / "corpus.txt"
    lines = [line for line in CORPUS if line.strip()] * 20 + [f"sentence number {i} about topic {i % 7}" for i in range(400)]
    text.write_text("\n".join(lines))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(d / "tokenizer"), vocab_size=700,
                                   model_type="bpe", byte_fallback=True, character_coverage=0.98,
                                   remove_extra_whitespaces=False, normalization_rule_name="identity",
                                   split_digits=True, allow_whitespace_only_pieces=True, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model")), d


def _gguf_from_spm(sp, path):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    n = sp.get_piece_size()
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
                       for i in range(n)])
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("text", CORPUS)
def test_sentencepiece_vocabularies_encode_like_sentencepiece(spm_model, tmp_path, text):
    sp, d = spm_model
    from_model = Tokenizer.from_hf_dir(d)
    _gguf_from_spm(sp, tmp_path / "spm.gguf")
    from_gguf = GGUFModelFile(tmp_path / "spm.gguf").tokenizer()
    want = [sp.bos_id()] + sp.encode(text)
    for ours in (from_model, from_gguf):
        assert ours.encode(text) == want
        assert ours.decode(want) == sp.decode(want)


def test_chat_template_runs_in_a_sandbox():
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])
    with pytest.raises(ChatTemplateError, match="no system role"):
        render_chat_template("{{ raise_exception('no system role') }}", [])
    out = render_chat_template("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | tojson }}{% endfor %}",
                               [{"role": "user", "content": "é"}])
    assert out == '[user]"é"'


def test_a_tokenizer_json_that_pads_and_truncates_encodes_whole_and_unpadded(tmp_path):
    """A tokenizer.json saved with padding and truncation on (all-MiniLM-L6-v2's: 128) encodes a
    prompt whole and unpadded, as transformers does unless asked: a prompt is never cut silently."""
    from tokenizers import Tokenizer as Backend, models, pre_tokenizers

    backend = Backend(models.WordLevel({"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(20)}},
                                       unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.enable_padding(length=16, pad_id=0, pad_token="[PAD]")
    backend.enable_truncation(max_length=4)
    backend.save(str(tmp_path / "tokenizer.json"))
    ids = Tokenizer.from_hf_dir(tmp_path).encode("w1 w2 w3 w4 w5 w6")
    assert ids == [3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("pre, whole", [("llama-bpe", True), ("glm4", True), ("qwen2", False), ("smollm", False)])
def test_llama3_style_vocabularies_take_a_known_word_whole(pre, whole):
    """llama.cpp's ignore_merges (Llama 3's and GLM-4's pre-tokenizers; the "ignore_merges": true of
    Llama 3's tokenizer.json): a pre-token that is itself in the vocabulary is that token, even where
    the merges would not build it; other vocabularies merge as BPE does."""
    import tokenizers
    from tokenizers import models

    from corellm.tokenizer import byte_level_bpe

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = letters + ["Ġ", "ab", "Ġab", "abc", "Ġabc"]  # "Ġabc" in the vocabulary, but no merge builds it
    merges = ["a b", "Ġ ab"]
    ours = byte_level_bpe(tokens, merges, [1] * len(tokens), pre, None, False)
    reference = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                                merges=[tuple(m.split()) for m in merges], ignore_merges=whole))
    reference.pre_tokenizer = ours.pre_tokenizer
    for text in (" abc", "abc abc", " ab c"):
        assert ours.encode(text).ids == reference.encode(text).ids
    assert (ours.encode(" abc").ids == [tokens.index("Ġabc")]) == whole

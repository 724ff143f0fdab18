"""An XLM-RoBERTa embedding model from a GGUF file as llama.cpp's converter writes it (architecture
"bert", the position table's first padding_idx + 1 rows dropped, and a sentencepiece Unigram
vocabulary as tokenizer model "t5": <s> <pad> </s> <unk>, then the pieces one id up, with their
scores and the model's precompiled normalization charsmap) — bge-m3's, multilingual-e5's form.

The vocabulary is a real sentencepiece Unigram model trained here (its NFKC charsmap included); the
token ids of text with accents, capitals, full-width characters, runs of spaces and words it never
saw are sentencepiece's own (plus XLM-R's one-id offset and its <s> ... </s> frame, a pair's
</s> </s> between), and the vectors transformers' XLMRobertaModel's on those ids (F32 within 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

from corellm import LLM, PoolingParams  # noqa: E402
from tests.model.test_bert_gguf import write_bert_gguf  # noqa: E402

CORPUS = ["The cat sat on the mat and the dog ran in the park.", "Le chat est sur le tapis, et le chien court.",
          "Der Hund läuft im Park; die Katze schläft.", "Café naïve résumé über straße.",
          "Numbers like 12345 and 2026 appear too.", "Tokyo 東京 and Beijing 北京 are cities.",
          "A quick brown fox jumps over the lazy dog!"] * 20 + [
          f"word{i} number {i * 37} item {chr(97 + i % 26)}{chr(97 + i * 7 % 26)}" for i in range(200)]
TEXTS = ["The cat sat on the mat", "Le  chien   court, très vite!", "ＦＵＬＬ ｗｉｄｔｈ ＡＢＣ and １２３",
         "Zebras xylophone quokka", "  leading and trailing spaces  ", "東京 café", "ﬁne ligature",
         "tab\there\nnew line", "x"]


def charsmap_of(model_file) -> bytes:
    """ModelProto.normalizer_spec (field 3).precompiled_charsmap (field 2), read off the wire format."""
    def fields(data: bytes):
        i = 0
        while i < len(data):
            key, i = varint(data, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, i = varint(data, i)
            elif wire == 1:
                value, i = data[i:i + 8], i + 8
            elif wire == 5:
                value, i = data[i:i + 4], i + 4
            else:
                length, i = varint(data, i)
                value, i = data[i:i + length], i + length
            yield number, value

    def varint(data: bytes, i: int):
        shift = value = 0
        while True:
            b = data[i]
            value |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if not b & 0x80:
                return value, i

    normalizer = next(v for n, v in fields(open(model_file, "rb").read()) if n == 3)
    return next(v for n, v in fields(normalizer) if n == 2)


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("spm")
    (directory / "corpus.txt").write_text("\n".join(CORPUS))
    sentencepiece.SentencePieceTrainer.train(input=str(directory / "corpus.txt"), model_prefix=str(directory / "m"),
                                             vocab_size=120, model_type="unigram", character_coverage=1.0,
                                             minloglevel=2)
    return directory / "m.model"


def xlmr_ids(sp, text: str) -> list[int]:
    """XLM-R's ids: sentencepiece's one up (its <unk> 0 is XLM-R's 3), in <s> ... </s>."""
    return [0] + [3 if i == 0 else i + 1 for i in sp.encode(text)] + [2]


def write_xlmr_gguf(hf, sp, model_file, path) -> None:
    n = sp.get_piece_size()
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + [sp.id_to_piece(i) for i in range(3, n)] + ["<mask>"]
    scores = [0.0] * 4 + [sp.get_score(i) for i in range(3, n)] + [0.0]
    types = [3, 3, 3, 2] + [1] * (n - 3) + [3]

    def tokenizer(w):
        w.add_tokenizer_model("t5")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_add_space_prefix(True)
        w.add_token_type_count(1)
        w.add_remove_extra_whitespaces(True)
        w.add_precompiled_charsmap(charsmap_of(model_file))
        for key, value in (("bos", 0), ("eos", 2), ("unk", 3), ("sep", 2), ("pad", 1), ("mask", n + 1)):
            getattr(w, f"add_{key}_token_id")(value)

    write_bert_gguf(hf, [], path, tokenizer=tokenizer, position_offset=2)


@pytest.fixture(scope="module")
def tiny_xlmr(spm_model, tmp_path_factory):
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    config = transformers.XLMRobertaConfig(vocab_size=sp.get_piece_size() + 2, hidden_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=128, max_position_embeddings=130,
                                           type_vocab_size=1, pad_token_id=1)
    torch.manual_seed(0)
    hf = transformers.XLMRobertaModel(config, add_pooling_layer=False).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.normal_(1.0 if "LayerNorm.weight" in name else 0.0, 0.2)
    path = tmp_path_factory.mktemp("xlmr") / "xlmr.gguf"
    write_xlmr_gguf(hf, sp, spm_model, path)
    return hf, sp, path


def test_the_token_ids_are_sentencepieces(tiny_xlmr):
    _, sp, path = tiny_xlmr
    tokenizer = LLM(str(path), dtype="float32", max_num_seqs=8).get_tokenizer()
    for text in TEXTS:
        assert tokenizer.encode(text) == xlmr_ids(sp, text), text
    ids, types = tokenizer.encode_pair(TEXTS[0], TEXTS[1])
    assert ids == xlmr_ids(sp, TEXTS[0]) + [2] + xlmr_ids(sp, TEXTS[1])[1:]  # <s> A </s> </s> B </s>
    assert set(types) == {0}


def test_an_xlm_roberta_gguf_embeds_as_transformers(tiny_xlmr):
    hf, sp, path = tiny_xlmr
    llm = LLM(str(path), dtype="float32", max_num_seqs=8)
    assert llm.engine_core.model_runner.pooler.pooling_type == "MEAN"
    for text, out in zip(TEXTS, llm.embed(TEXTS, PoolingParams(normalize=False), use_tqdm=False)):
        ids = xlmr_ids(sp, text)
        assert out.prompt_token_ids == ids
        with torch.no_grad():
            want = hf(torch.tensor([ids])).last_hidden_state[0].double().mean(0)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding, dtype=torch.float64), want, atol=1e-5,
                                   rtol=1e-5)
    assert np.isclose(np.linalg.norm(llm.embed(TEXTS[:1], use_tqdm=False)[0].outputs.embedding), 1.0)

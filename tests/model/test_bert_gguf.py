"""A BERT embedding model from a GGUF file as llama.cpp's converter writes it (architecture "bert":
its own tensor names, the WordPiece vocabulary in "phantom space" form, the pooling type in the
metadata), against transformers in fp32 on the HF directory it was written from: the token ids of
text with accents, capitals, punctuation and Chinese characters are the HF tokenizer's (BERT's
normalizer and pre-tokenizer), the mean-pooled vectors transformers' (F32 within 1e-5; Q8_0 computed
as it is, a cosine above 0.999), a pair's token types likewise."""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors  # noqa: E402

from corellm import LLM, PoolingParams, TokensPrompt  # noqa: E402
from tests import quant_blocks  # noqa: E402

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cat", "play", "dog", "run", "cafe", "naive", "hello", "world", ",", ".", "!", "'", "t", "don",
         "東", "京", "a", "b"]
PIECES = ["##ing", "##s", "##ner", "##e", "##b", "##a"]
TEXTS = ["The cat plays", "Héllo, WORLD! naïve café", "don't run 東京", "dogs runner aab"]


def vocabulary(size: int) -> list[str]:
    filler = [f"w{i}" if i % 2 else f"##x{i}" for i in range(size)]
    return (SPECIAL + WORDS + PIECES + filler)[:size]


def write_hf_tokenizer(directory, vocab: list[str]):
    """BERT's uncased WordPiece tokenizer over `vocab`, as transformers' BertTokenizerFast saves it."""
    t = Tokenizer(models.WordPiece({p: i for i, p in enumerate(vocab)}, unk_token="[UNK]",
                                   max_input_chars_per_word=100))
    t.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                              lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.decoder = decoders.WordPiece()
    t.post_processor = processors.TemplateProcessing(single="[CLS]:0 $A:0 [SEP]:0",
                                                     pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
                                                     special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    t.save(str(directory / "tokenizer.json"))
    return t


BERT_TENSORS = {"attention.self.qkv": "attn_qkv", "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
                "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
                "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
BERT_GLOBALS = {"embeddings.word_embeddings": "token_embd", "embeddings.position_embeddings": "position_embd",
                "embeddings.token_type_embeddings": "token_types", "embeddings.LayerNorm": "token_embd_norm"}


def add_wordpiece_vocabulary(w, vocab: list[str], type_vocab_size: int) -> None:
    """The phantom-space vocabulary llama.cpp writes for a WordPiece one (a word's first piece
    "\u2581" + piece, a continuation without "##", control tokens as they are) and BERT's token ids."""
    w.add_tokenizer_model("bert")
    w.add_token_list([p if p in SPECIAL else p[2:] if p.startswith("##") else "\u2581" + p for p in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if p in SPECIAL else gguf.TokenType.NORMAL for p in vocab])
    w.add_uint32("tokenizer.ggml.token_type_count", type_vocab_size)
    for key, value in (("bos", 2), ("eos", 3), ("unk", 1), ("sep", 3), ("pad", 0)):
        getattr(w, f"add_{key}_token_id")(value)


def add_encoder_tensors(w, arrays: dict, layer_prefix: str, layer_names: dict, global_names: dict,
                        tensor_type: str) -> None:
    """Each HF tensor (name -> float32 array) under llama.cpp's name (a layer's part by layer_names,
    the rest by global_names), its 2-D layer weights in `tensor_type`."""
    for name, a in arrays.items():
        stem, kind = name.rsplit(".", 1)
        if stem.startswith(layer_prefix):
            i, rest = stem[len(layer_prefix):].split(".", 1)
            gname = f"blk.{i}.{layer_names[rest]}.{kind}"
        else:
            gname = f"{global_names[stem]}.{kind}"
        if tensor_type != "F32" and a.ndim == 2 and gname.startswith("blk."):
            w.add_tensor(gname, quant_blocks.quantize(a, tensor_type),
                         raw_dtype=getattr(gguf.GGMLQuantizationType, tensor_type))
        else:
            w.add_tensor(gname, a)


def write_bert_gguf(hf, vocab: list[str], path, tensor_type: str = "F32", pooling_type: int = 1,
                    extra: dict | None = None, fused_qkv: bool = False, tokenizer=None, position_offset: int = 0) -> None:
    """llama.cpp's layout of a BertModel: its keys, the phantom-space vocabulary (a word's first piece
    "\u2581" + piece, a continuation without "##", control tokens as they are), its tensor names
    (the pooler dropped), 2-D projection weights in `tensor_type`; `extra` tensors besides; with
    fused_qkv, each layer's q, k and v as one attn_qkv tensor (rows q, k, v), as some files have them.
    tokenizer: a function writing another vocabulary's keys instead (an XLM-R's); position_offset:
    the position table's first rows dropped (an XLM-R's padding_idx + 1, as the converter does)."""
    c = hf.config
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings - position_offset)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_layer_norm_eps(c.layer_norm_eps)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling_type))
    if tokenizer is not None:
        tokenizer(w)
    else:
        add_wordpiece_vocabulary(w, vocab, c.type_vocab_size)
    state = dict(hf.state_dict())
    if fused_qkv:
        for i in range(c.num_hidden_layers):
            for kind in ("weight", "bias"):
                parts = [state.pop(f"encoder.layer.{i}.attention.self.{p}.{kind}") for p in ("query", "key", "value")]
                state[f"encoder.layer.{i}.attention.self.qkv.{kind}"] = torch.cat(parts)
    arrays = {name: t.float().numpy() for name, t in state.items()
              if not name.startswith("pooler.") and name != "embeddings.position_ids"}
    arrays["embeddings.position_embeddings.weight"] = arrays["embeddings.position_embeddings.weight"][position_offset:]
    add_encoder_tensors(w, arrays, "encoder.layer.", BERT_TENSORS, BERT_GLOBALS, tensor_type)
    for gname, a in (extra or {}).items():
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """(transformers' BertModel, its HF tokenizer, its vocabulary, the directory)."""
    directory = tmp_path_factory.mktemp("bert")
    config = transformers.BertConfig(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=128, type_vocab_size=2)
    torch.manual_seed(0)
    hf = transformers.BertModel(config).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.normal_(1.0 if "LayerNorm.weight" in name else 0.0, 0.2)
    hf.save_pretrained(directory, safe_serialization=True)
    vocab = vocabulary(384)
    return hf, write_hf_tokenizer(directory, vocab), vocab, directory


def hf_mean(hf, encoding) -> torch.Tensor:
    with torch.no_grad():
        rows = hf(torch.tensor([encoding.ids]), token_type_ids=torch.tensor([encoding.type_ids])).last_hidden_state[0]
    return rows.double().mean(0)


@pytest.mark.parametrize("tensor_type,fused_qkv", [("F32", False), ("Q8_0", False), ("F32", True)])
def test_a_bert_gguf_embeds_as_transformers(tiny_bert, tmp_path, tensor_type, fused_qkv):
    hf, tokenizer, vocab, _ = tiny_bert
    path = tmp_path / "bert.gguf"
    write_bert_gguf(hf, vocab, path, tensor_type, fused_qkv=fused_qkv)
    llm = LLM(str(path), dtype="float32", max_num_seqs=8)
    assert llm.engine_core.model_runner.pooler.pooling_type == "MEAN"  # the file's bert.pooling_type
    for text, out in zip(TEXTS, llm.embed(TEXTS, PoolingParams(normalize=False), use_tqdm=False)):
        encoding = tokenizer.encode(text)
        assert out.prompt_token_ids == encoding.ids and 1 not in encoding.ids[1:-1]  # every word known
        got, want = torch.tensor(out.outputs.embedding, dtype=torch.float64), hf_mean(hf, encoding)
        if tensor_type == "F32":
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        else:
            assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) > 0.999
    again = LLM(str(path), dtype="float32", max_num_seqs=8)  # from the weight cache this time
    assert again.embed(TEXTS[:1], use_tqdm=False)[0].outputs.embedding == llm.embed(TEXTS[:1], use_tqdm=False)[0] \
        .outputs.embedding
    ids, types = llm.get_tokenizer().encode_pair("the cat", "a dog")
    pair = tokenizer.encode("the cat", "a dog")
    assert (ids, types) == (pair.ids, pair.type_ids)
    if tensor_type == "F32":
        out = llm.embed([TokensPrompt(prompt_token_ids=ids, token_type_ids=types)], PoolingParams(normalize=False),
                        use_tqdm=False)[0]
        torch.testing.assert_close(torch.tensor(out.outputs.embedding, dtype=torch.float64), hf_mean(hf, pair),
                                   atol=1e-5, rtol=1e-5)


def test_a_bert_gguf_without_a_pooling_type_pools_cls_and_a_classifier_is_refused(tiny_bert, tmp_path):
    hf, tokenizer, vocab, _ = tiny_bert
    path = tmp_path / "bert.gguf"
    write_bert_gguf(hf, vocab, path, pooling_type=0)
    llm = LLM(str(path), dtype="float32", max_num_seqs=8)
    out = llm.embed([TEXTS[0]], PoolingParams(normalize=False), use_tqdm=False)[0]
    with torch.no_grad():
        encoding = tokenizer.encode(TEXTS[0])
        want = hf(torch.tensor([encoding.ids])).last_hidden_state[0, 0].double()
    torch.testing.assert_close(torch.tensor(out.outputs.embedding, dtype=torch.float64), want, atol=1e-5, rtol=1e-5)
    import numpy as np

    write_bert_gguf(hf, vocab, path, extra={"cls.output.weight": np.zeros((1, 64), dtype=np.float32)})
    with pytest.raises(ValueError, match="a BERT classifier .* is not supported in a GGUF file"):
        LLM(str(path), dtype="float32")

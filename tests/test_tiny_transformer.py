"""shared.tiny_transformer (notebook 06) against independent references: plain loops for the task,
the masks and the scores, a NumPy forward pass for the model and for ablation, closed forms where
they exist."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shared.tiny_transformer import (
    BOS,
    TinyTransformer,
    ablate_heads,
    adam_step,
    attention_score,
    evaluate,
    induction_mask,
    induction_score,
    next_token_losses,
    phase_change_step,
    previous_token_mask,
    previous_token_score,
    repeated_tokens,
    run_layers,
    seen_before,
    token_labels,
    train,
)


def random_causal_weights(shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    T = shape[-1]
    scores = torch.randn(*shape, generator=g, dtype=torch.float64)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)


# ------------------------------------------------------------------ the task
def test_repeated_tokens_repeat_a_segment_of_distinct_tokens():
    V, T, lo, hi = 27, 21, 4, 12
    x = repeated_tokens(500, T, V, lo, hi, generator=torch.Generator().manual_seed(0))
    assert x.shape == (500, T) and x.dtype == torch.long
    periods = []
    for row in x.tolist():
        assert row[0] == BOS
        body = row[1:]
        p = body.index(body[0], 1)  # the segment's first token comes back after one period
        periods.append(p)
        assert len(set(body[:p])) == p, "a segment's tokens are distinct"
        assert all(1 <= t <= V - 1 for t in body)
        assert all(body[t] == body[t - p] for t in range(p, len(body)))
    assert min(periods) == lo and max(periods) == hi  # 500 draws cover the whole range


def test_repeated_tokens_fixed_period_gives_two_halves_and_is_seeded():
    x = repeated_tokens(8, 21, 27, 10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(x[:, 1:11], x[:, 11:])
    y = repeated_tokens(8, 21, 27, 10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(x, y)
    z = repeated_tokens(8, 21, 27, 10, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(x, z)


@pytest.mark.parametrize("args, match", [
    ((0, 21, 27, 4), "batch_size must be an integer >= 1; got 0"),
    ((4, 21, 27, 1), "min_period must be an integer >= 2; got 1"),
    ((4, 21, 27, 6, 5), "max_period must be >= min_period; got min_period = 6, max_period = 5"),
    ((4, 21, 8, 4, 8), r"needs vocab_size >= 9 \(token 0 is BOS\); got vocab_size = 8"),
    ((4, 11, 27, 4, 10), r"max_period = 10 leaves no repeated token in T = 11 .* max_period <= T - 2 = 9"),
    ((4, 21.0, 27, 4), "T must be an integer >= 3; got 21.0"),
])
def test_repeated_tokens_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        repeated_tokens(*args)


def test_seen_before_matches_a_loop():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5, (6, 9), generator=g)  # drawn with replacement: many repeats
    expected = [[row[t] in row[:t] for t in range(len(row))] for row in x.tolist()]
    assert seen_before(x).tolist() == expected
    assert seen_before(x[0]).tolist() == expected[0]


def test_token_labels():
    assert token_labels(torch.tensor([0, 1, 2, 26, 30])) == ["BOS", "a", "b", "z", "30"]
    with pytest.raises(ValueError, match=r"one sequence \(T,\); got a batch of 2"):
        token_labels(torch.zeros(2, 3, dtype=torch.long))


# ------------------------------------------------------------------ masks and scores
def test_previous_token_mask_matches_a_loop():
    T = 7
    expected = [[k == i - 1 for k in range(T)] for i in range(T)]
    assert previous_token_mask(T).tolist() == expected
    assert previous_token_mask(1).tolist() == [[False]]


def test_induction_mask_matches_a_loop():
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 4, (5, 10), generator=g)  # includes consecutive repeats like "a a"
    mask = induction_mask(x)
    assert mask.shape == (5, 10, 10) and mask.dtype == torch.bool
    for b, row in enumerate(x.tolist()):
        expected = [[1 <= k <= i and row[k - 1] == row[i] for k in range(10)] for i in range(10)]
        assert mask[b].tolist() == expected


def loop_score(A, targets):
    """Mean over the rows with a target of the weight on the targets: plain Python."""
    A, targets = A.tolist(), targets.tolist()
    rows = [i for i in range(len(A)) if any(targets[i])]
    return sum(sum(a for a, t in zip(A[i], targets[i], strict=True) if t) for i in rows) / len(rows)


def test_attention_score_matches_a_loop_for_every_leading_index():
    w = random_causal_weights((2, 3, 6, 6), seed=3)
    g = torch.Generator().manual_seed(4)
    target = (torch.rand(6, 6, generator=g) < 0.3).tril()
    target[2, 0] = True  # at least one row with a target
    got = attention_score(w, target)
    assert got.shape == (2, 3)
    for b in range(2):
        for h in range(3):
            assert got[b, h].item() == pytest.approx(loop_score(w[b, h], target), abs=1e-12)


def test_previous_token_score_closed_forms():
    T = 8
    perfect = torch.zeros(T, T, dtype=torch.float64)
    perfect[0, 0] = 1.0
    perfect[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    even = torch.ones(T, T, dtype=torch.float64).tril()
    even = even / even.sum(dim=-1, keepdim=True)
    scores = previous_token_score(torch.stack([perfect, torch.eye(T, dtype=torch.float64), even]))
    expected = [1.0, 0.0, sum(1 / (i + 1) for i in range(1, T)) / (T - 1)]
    assert scores.tolist() == pytest.approx(expected, abs=1e-12)
    w = random_causal_weights((4, T, T), seed=5)
    by_loop = [sum(w[h, i, i - 1].item() for i in range(1, T)) / (T - 1) for h in range(4)]
    assert previous_token_score(w).tolist() == pytest.approx(by_loop, abs=1e-12)


def test_induction_score_aligns_tokens_with_the_batch_and_a_perfect_head_scores_one():
    B, L, H, T = 3, 2, 2, 13
    x = repeated_tokens(B, T, 27, 6, generator=torch.Generator().manual_seed(6))
    w = random_causal_weights((B, L, H, T, T), seed=7)
    got = induction_score(w, x)
    assert got.shape == (B, L, H)
    for b in range(B):
        target = induction_mask(x[b])
        for lay in range(L):
            for h in range(H):
                assert got[b, lay, h].item() == pytest.approx(loop_score(w[b, lay, h], target),
                                                              abs=1e-12)
    assert torch.allclose(induction_score(w[0], x[0]), got[0], atol=1e-12)
    # the ideal induction head: each repeated token's query on the key after its first occurrence
    perfect = torch.zeros(T, T, dtype=torch.float64)
    perfect[:, 0] = 1.0
    for i in range(7, T):
        perfect[i] = 0.0
        perfect[i, i - 5] = 1.0  # period 6: x[i - 6] = x[i], so the key after it is i - 5
    assert induction_score(perfect, x[0]).item() == pytest.approx(1.0)


def test_induction_score_predicting_only_leaves_out_the_last_query():
    B, T = 4, 12
    x = repeated_tokens(B, T, 27, 5, generator=torch.Generator().manual_seed(8))
    w = random_causal_weights((B, 2, T, T), seed=9)
    got = induction_score(w, x, predicting_only=True)
    assert got.shape == (B, 2)
    for b in range(B):
        target = induction_mask(x[b]).clone()
        target[T - 1] = False  # the last query predicts nothing
        for h in range(2):
            assert got[b, h].item() == pytest.approx(loop_score(w[b, h], target), abs=1e-12)
    # a head perfect on every query but the last: 1.0 only when the last query is left out
    perfect = torch.zeros(T, T, dtype=torch.float64)
    perfect[:, 0] = 1.0
    for i in range(6, T - 1):
        perfect[i] = 0.0
        perfect[i, i - 4] = 1.0  # period 5: the key after the earlier occurrence is i - 4
    assert induction_score(perfect, x[0], predicting_only=True).item() == pytest.approx(1.0)
    assert induction_score(perfect, x[0]).item() == pytest.approx(5 / 6)  # queries 6-11, the last on BOS


@pytest.mark.parametrize("call, error, match", [
    (lambda: attention_score(torch.eye(3), torch.eye(3)), TypeError, "target must be a boolean"),
    (lambda: attention_score(torch.eye(3), torch.ones(2, 2, dtype=torch.bool)), ValueError,
     r"target of shape \(2, 2\) does not broadcast to the weights' shape \(3, 3\)"),
    (lambda: attention_score(torch.eye(3), torch.zeros(3, 3, dtype=torch.bool)), ValueError,
     "no query with a target key"),
    (lambda: previous_token_score(torch.ones(3, 4)), ValueError,
     r"weights must be \(\.\.\., T, T\) \(queries x keys\); got shape \(3, 4\)"),
    (lambda: previous_token_score(torch.ones(3, 3, dtype=torch.long)), TypeError,
     "weights must be a floating-point tensor; got dtype torch.int64"),
    (lambda: previous_token_score([[1.0]]), TypeError, "weights must be a torch.Tensor; got list"),
    (lambda: induction_score(torch.eye(4), torch.tensor([0.0, 1.0, 0.0, 1.0])), TypeError,
     "tokens must hold integer token ids"),
    (lambda: induction_score(torch.ones(2, 4, 4), torch.zeros(3, 4, dtype=torch.long)), ValueError,
     r"tokens \(3, 4\) do not match weights \(2, 4, 4\)"),
    (lambda: induction_score(torch.eye(4), torch.arange(4)), ValueError,
     "no query with a target key"),
])
def test_score_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------------------------ the model
def numpy_forward(model: TinyTransformer, tokens: torch.Tensor, silenced=()):
    """The model's forward pass from its parameters, in NumPy float64: (logits, weights)."""
    P = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    x = tokens.numpy()
    B, T = x.shape
    H, hd = model.num_heads, model.head_dim
    h = P["tok_emb.weight"][x] + P["pos_emb.weight"][:T]
    all_w = []
    causal = np.tril(np.ones((T, T), dtype=bool))
    for lay in range(model.num_layers):
        def proj(name, h=h, lay=lay):
            return (h @ P[f"layers.{lay}.{name}.weight"].T).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        Q, K, V = proj("W_query"), proj("W_key"), proj("W_value")
        s = np.where(causal, Q @ K.transpose(0, 1, 3, 2) / math.sqrt(hd), -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w = w / w.sum(axis=-1, keepdims=True)
        ctx = w @ V
        for sl, sh in silenced:
            if sl == lay:
                ctx[:, sh] = 0.0
        merged = ctx.transpose(0, 2, 1, 3).reshape(B, T, H * hd)
        h = h + merged @ P[f"layers.{lay}.out_proj.weight"].T + P[f"layers.{lay}.out_proj.bias"]
        all_w.append(w)
    logits = h @ P["unembed.weight"].T + P["unembed.bias"]
    return logits, np.stack(all_w, axis=1)


def small_model(seed=0, **kw) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(**{"vocab_size": 11, "context_length": 9, "d_model": 12,
                              "num_heads": 3, "num_layers": 2, **kw}).double()


def test_model_matches_a_numpy_forward_pass():
    model = small_model()
    x = repeated_tokens(4, 9, 11, 3, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, weights = model(x, return_weights=True)
    ref_logits, ref_w = numpy_forward(model, x)
    assert logits.shape == (4, 9, 11) and weights.shape == (4, 2, 3, 9, 9)
    np.testing.assert_allclose(logits.numpy(), ref_logits, atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), ref_w, atol=1e-12)
    with torch.no_grad():
        assert torch.equal(model(x), logits)
        assert torch.equal(model(x[:, :5]), model(x)[:, :5])  # causal: a prefix sees only itself


def test_model_input_errors():
    model = small_model()
    with pytest.raises(ValueError, match=r"tokens must be 2-D \(B, T\); got shape \(9,\)"):
        model(torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="T = 10 positions but context_length = 9"):
        model(torch.zeros(1, 10, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in 0 \.\. 10; got 0 \.\. 11"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(TypeError, match="integer token ids .* got dtype torch.float32"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1; got 0"):
        TinyTransformer(11, 9, num_heads=0)


def test_next_token_losses_match_log_softmax():
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 6, 5, generator=g, dtype=torch.float64)
    x = torch.randint(0, 5, (3, 6), generator=g)
    got = next_token_losses(logits, x)
    logp = torch.log_softmax(logits, dim=-1)
    expected = torch.tensor([[-logp[b, t, x[b, t + 1]].item() for t in range(5)] for b in range(3)],
                            dtype=torch.float64)
    assert got.shape == (3, 5)
    assert torch.allclose(got, expected, atol=1e-12)
    with pytest.raises(ValueError, match=r"logits \(3, 6, 5\) and tokens \(3, 5\) do not match"):
        next_token_losses(logits, x[:, :5])


def test_evaluate_splits_by_whether_the_current_token_was_seen():
    model = small_model()
    x = repeated_tokens(5, 9, 11, 3, 4, generator=torch.Generator().manual_seed(9))
    r = evaluate(model, x)
    ref_logits, _ = numpy_forward(model, x)
    logp = ref_logits - np.log(np.exp(ref_logits).sum(axis=-1, keepdims=True))
    xs = x.tolist()
    rep, first, hits = [], [], []
    for b, row in enumerate(xs):
        for t in range(len(row) - 1):
            loss = -logp[b, t, row[t + 1]]
            if row[t] in row[:t]:
                rep.append(loss)
                hits.append(int(np.argmax(ref_logits[b, t])) == row[t + 1])
            else:
                first.append(loss)
    assert r["repeat_loss"] == pytest.approx(np.mean(rep), abs=1e-9)
    assert r["first_loss"] == pytest.approx(np.mean(first), abs=1e-9)
    assert r["repeat_accuracy"] == pytest.approx(np.mean(hits))
    assert r["per_position"].shape == (8,) and r["weights"].shape == (5, 2, 3, 9, 9)
    assert model.training  # evaluate puts the model back in the mode it found


# ------------------------------------------------------------------ ablation
@pytest.mark.parametrize("heads", [[(0, 0)], [(1, 2)], [(0, 1), (1, 0)], [(1, 0), (1, 1), (1, 2)]])
def test_ablate_heads_equals_silencing_the_heads_context(heads):
    model = small_model(seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = repeated_tokens(3, 9, 11, 3, 4, generator=torch.Generator().manual_seed(10))
    ablated = ablate_heads(model, heads)
    with torch.no_grad():
        logits, weights = ablated(x, return_weights=True)
    ref_logits, ref_w = numpy_forward(model, x, silenced=heads)
    np.testing.assert_allclose(logits.numpy(), ref_logits, atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), ref_w, atol=1e-12)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


def test_ablating_every_head_leaves_embeddings_and_output_biases():
    model = small_model(seed=2)
    x = repeated_tokens(2, 9, 11, 3, generator=torch.Generator().manual_seed(11))
    ablated = ablate_heads(model, [(lay, h) for lay in range(2) for h in range(3)])
    with torch.no_grad():
        stream = (model.tok_emb(x) + model.pos_emb.weight[:9]
                  + model.layers[0].out_proj.bias + model.layers[1].out_proj.bias)
        assert torch.allclose(ablated(x), model.unembed(stream), atol=1e-12)


@pytest.mark.parametrize("heads, error, match", [
    ([(2, 0)], ValueError, r"no head \(2, 0\): layers are 0 \.\. 1, heads 0 \.\. 2"),
    ([(0, 3)], ValueError, r"no head \(0, 3\)"),
    ([0], TypeError, r"heads must be \(layer, head\) pairs of integers; got 0"),
    ([(0, 1.0)], TypeError, r"pairs of integers; got \(0, 1\.0\)"),
])
def test_ablate_heads_bad_heads(heads, error, match):
    with pytest.raises(error, match=match):
        ablate_heads(small_model(), heads)


def test_ablate_heads_needs_a_tiny_transformer():
    with pytest.raises(TypeError, match="model must be a TinyTransformer; got Linear"):
        ablate_heads(torch.nn.Linear(2, 2), [(0, 0)])


# ------------------------------------------------------------------ training
def test_adam_step_matches_torch_optim_adam():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    theirs.load_state_dict(ours.state_dict())
    frozen = torch.zeros(2, requires_grad=True)  # no gradient: left alone
    optimizer = torch.optim.Adam(theirs.parameters(), lr=0.01)
    state = {}
    for _ in range(6):
        x = torch.randn(8, 4)
        for model in (ours, theirs):
            model.zero_grad()
            model(x).pow(2).sum().backward()
        adam_step([*ours.parameters(), frozen], state, lr=0.01)
        optimizer.step()
        for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-7)
    assert state["step"] == 6 and torch.equal(frozen, torch.zeros(2))


def test_train_is_deterministic_restores_threads_and_records_history():
    x_eval = repeated_tokens(8, 9, 11, 3, generator=torch.Generator().manual_seed(12))
    runs = []
    threads = torch.get_num_threads()
    for outer_threads in (1, 2):
        torch.set_num_threads(outer_threads)
        model = small_model(seed=3)
        history = train(model, 5, min_period=2, max_period=4, batch_size=4, seed=0,
                        eval_tokens=x_eval, eval_every=2)
        assert torch.get_num_threads() == outer_threads
        runs.append((history, model.state_dict()))
    torch.set_num_threads(threads)
    (h1, s1), (h2, s2) = runs
    assert h1["loss"] == h2["loss"] and len(h1["loss"]) == 5
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert h1["eval_step"] == [0, 2, 4, 5]
    assert h1["previous_token_scores"].shape == (4, 2, 3) == h1["induction_scores"].shape
    only = train(small_model(seed=3), 5, min_period=2, max_period=4, batch_size=4, seed=0,
                 eval_tokens=x_eval, eval_every=2, predicting_only=True, keep_states=True)
    for k, state in enumerate(only["states"]):  # the scores of the weights saved at each evaluation
        net = small_model(seed=3)
        net.load_state_dict(state)
        with torch.no_grad():
            w = net(x_eval, return_weights=True)[1]
        assert torch.allclose(only["induction_scores"][k],
                              induction_score(w, x_eval, predicting_only=True).mean(dim=0), atol=1e-6)
    assert len(h1["repeat_loss"]) == len(h1["first_loss"]) == len(h1["repeat_accuracy"]) == 4
    assert h1["per_position"].shape == (4, 8)  # (evals, T - 1)
    with torch.no_grad():  # model: the last run's, after its 5 steps; its loss per position by hand
        by_hand = F.cross_entropy(model(x_eval)[:, :-1].transpose(1, 2), x_eval[:, 1:], reduction="none")
    assert torch.allclose(h2["per_position"][-1], by_hand.mean(dim=0), atol=1e-6)
    # evaluating during training changes nothing about the training run itself
    quiet = small_model(seed=3)
    h3 = train(quiet, 5, min_period=2, max_period=4, batch_size=4, seed=0)
    assert h3["loss"] == h1["loss"] and all(torch.equal(s1[k], v) for k, v in quiet.state_dict().items())


def test_train_scores_the_previous_token_on_the_first_queries_only_when_asked():
    x_eval = repeated_tokens(8, 9, 11, 3, generator=torch.Generator().manual_seed(12))
    model = small_model(seed=3)
    history = train(model, 3, min_period=2, max_period=4, batch_size=4, seed=0,
                    eval_tokens=x_eval, eval_every=2, prev_up_to=4)
    with torch.no_grad():  # the last evaluation, by a loop: mean weight of queries 1-4 on key i - 1
        w = model(x_eval, return_weights=True)[1]  # (B, layers, heads, T, T)
    by_loop = sum(w[..., i, i - 1] for i in range(1, 5)).mean(dim=0) / 4
    assert torch.allclose(history["previous_token_scores"][-1], by_loop, atol=1e-6)
    plain = train(small_model(seed=3), 3, min_period=2, max_period=4, batch_size=4, seed=0,
                  eval_tokens=x_eval, eval_every=2)  # the default scores every query
    assert plain["loss"] == history["loss"]
    assert not torch.allclose(plain["previous_token_scores"][-1], by_loop, atol=1e-3)
    with pytest.raises(ValueError, match="prev_up_to must be an integer >= 1; got 0"):
        train(small_model(), 1, min_period=2, max_period=3, prev_up_to=0)


def test_train_keeps_a_copy_of_the_state_at_every_evaluation_only_when_asked():
    x_eval = repeated_tokens(8, 9, 11, 3, generator=torch.Generator().manual_seed(12))
    model = small_model(seed=3)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    history = train(model, 5, min_period=2, max_period=4, batch_size=4, seed=0,
                    eval_tokens=x_eval, eval_every=2, keep_states=True)
    assert len(history["states"]) == len(history["eval_step"]) == 4  # steps 0, 2, 4 and 5
    assert all(torch.equal(history["states"][0][k], v) for k, v in start.items())  # before any step
    assert all(torch.equal(history["states"][-1][k], v) for k, v in model.state_dict().items())
    assert not torch.equal(history["states"][1]["tok_emb.weight"], start["tok_emb.weight"])
    copy = small_model(seed=0)
    copy.load_state_dict(history["states"][1])  # a kept state is a snapshot: the model's evaluation then
    assert abs(evaluate(copy, x_eval)["repeat_loss"] - history["repeat_loss"][1]) < 1e-6
    plain = train(small_model(seed=3), 5, min_period=2, max_period=4, batch_size=4, seed=0,
                  eval_tokens=x_eval, eval_every=2)
    assert "states" not in plain and plain["loss"] == history["loss"]


def test_train_lowers_the_loss():
    model = small_model(seed=4).float()
    history = train(model, 40, min_period=2, max_period=4, batch_size=32, lr=1e-2, seed=1)
    assert np.mean(history["loss"][-5:]) < np.mean(history["loss"][:5]) - 0.2
    assert "eval_step" in history and history["eval_step"] == []


def test_train_bad_arguments():
    with pytest.raises(ValueError, match="steps must be an integer >= 1; got 0"):
        train(small_model(), 0, min_period=2, max_period=3)
    with pytest.raises(TypeError, match="model must be a TinyTransformer"):
        train(torch.nn.Linear(2, 2), 1, min_period=2, max_period=3)


def test_phase_change_step():
    assert phase_change_step([0, 10, 20, 30], [3.0, 2.9, 1.0, 0.0]) == 20  # halfway = 1.5
    assert phase_change_step([0, 10, 20], [3.0, 1.5, 0.0]) == 10  # reaching halfway counts
    with pytest.raises(ValueError, match="same length >= 2; got 2 steps and 3 losses"):
        phase_change_step([0, 1], [1.0, 0.5, 0.2])


def test_model_agrees_with_sdpa_in_float32():
    torch.manual_seed(5)
    model = TinyTransformer(27, 21)
    x = repeated_tokens(2, 21, 27, 10, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        h = model.tok_emb(x) + model.pos_emb.weight
        for layer in model.layers:
            Q, K, V = (lin(h).view(2, 21, 2, 16).transpose(1, 2)
                       for lin in (layer.W_query, layer.W_key, layer.W_value))
            ctx = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
            h = h + layer.out_proj(ctx.transpose(1, 2).reshape(2, 21, 32))
        assert torch.allclose(model(x), model.unembed(h), atol=1e-5)


# ------------------------------------------------------------------ third edition: new tools
def test_steepest_drop_step_finds_the_fastest_fall():
    from shared.tiny_transformer import steepest_drop_step

    # the fall per step: 0.1, 0.05, 0.3 (steepest, between 20 and 30), 0.01
    assert steepest_drop_step([0, 10, 20, 30, 40], [3.0, 2.0, 1.5, -1.5, -1.6]) == 25
    # a curve that falls fastest at the start: no late "phase change"
    assert steepest_drop_step([0, 10, 20], [3.0, 1.0, 0.5]) == 5
    with pytest.raises(ValueError, match="strictly increasing"):
        steepest_drop_step([0, 0], [1.0, 0.0])


def test_best_possible_losses_hand_derived():
    """Bayes-optimal loss for periods 4..12 and 26 letters, derived by hand (notebook 06)."""
    from shared.tiny_transformer import best_possible_losses

    x = repeated_tokens(3, 21, 27, 10, generator=torch.Generator().manual_seed(0))
    best = best_possible_losses(x, 27, 4, 12)
    assert best.shape == (3, 20)
    # n letters seen, no repeat: periods max(n, 4) .. 12 equally likely; p = n means "restart"
    expected = []
    for n in range(10):
        q = 1 / (13 - max(n, 4)) if n >= 4 else 0.0
        expected.append(math.log(26 - n) - math.log(1 - q))
    expected += [math.log(3)] + [0.0] * 9
    np.testing.assert_allclose(best.numpy(), np.tile(expected, (3, 1)), atol=1e-12)
    # a fixed period of 2 over 4 letters: the 1st letter costs ln 3, the 2nd ln 2, then 0
    y = torch.tensor([[0, 1, 2, 1, 2, 1]])
    np.testing.assert_allclose(best_possible_losses(y, 4, 2, 2).numpy(),
                               [[math.log(3), math.log(2), 0, 0, 0]], atol=1e-12)
    # a sequence the periods cannot make is impossible: infinite loss
    z = torch.tensor([[0, 1, 2, 3, 1]])  # period 3 is the only fit; with period 2 it is impossible
    assert math.isinf(float(best_possible_losses(z, 5, 2, 2)[0, 2]))


def test_ov_circuit_and_copying_score():
    from shared.tiny_transformer import copying_score, ov_circuit

    model = small_model(seed=3)
    hd = model.head_dim
    P = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    cols = slice(2 * hd, 3 * hd)
    ref = (P["tok_emb.weight"] @ P["layers.1.W_value.weight"][cols].T
           @ P["layers.1.out_proj.weight"][:, cols].T @ P["unembed.weight"].T)
    np.testing.assert_allclose(ov_circuit(model, 1, 2).numpy(), ref, atol=1e-12)
    assert copying_score(torch.eye(4)) == pytest.approx(1.0)
    assert copying_score(-2 * torch.eye(4)) == pytest.approx(-1.0)
    rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues +-i: neither copies nor inverts
    assert copying_score(rot) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="no head"):
        ov_circuit(model, 2, 0)


def test_mean_ablation_writes_the_heads_mean_output():
    model = small_model(seed=4)
    x = repeated_tokens(5, 9, 11, 3, 4, generator=torch.Generator().manual_seed(12))
    _, ref_w = numpy_forward(model, x)
    # the head's mean context from the NumPy forward pass: weights @ values, averaged over B and T
    P = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    h0 = P["tok_emb.weight"][x.numpy()] + P["pos_emb.weight"][:9]
    hd = model.head_dim
    V = (h0 @ P["layers.0.W_value.weight"].T).reshape(5, 9, 3, hd).transpose(0, 2, 1, 3)
    mean_ctx = (ref_w[:, 0] @ V)[:, 1].mean(axis=(0, 1))  # head (0, 1)
    ablated = ablate_heads(model, [(0, 1)], mean_over=x)
    zeroed = ablate_heads(model, [(0, 1)])
    shift = P["layers.0.out_proj.weight"][:, hd:2 * hd] @ mean_ctx
    np.testing.assert_allclose(ablated.layers[0].out_proj.bias.detach().numpy(),
                               P["layers.0.out_proj.bias"] + shift, atol=1e-12)
    assert torch.equal(ablated.layers[0].out_proj.weight, zeroed.layers[0].out_proj.weight)


@pytest.mark.parametrize("positional", ["rope", "alibi", "none"])
def test_positional_options_match_a_reference(positional):
    from shared.positional import alibi_bias, apply_rope

    torch.manual_seed(5)
    model = TinyTransformer(11, 9, d_model=12, num_heads=2, num_layers=2,
                            positional=positional).double()
    assert model.pos_emb is None
    x = repeated_tokens(3, 20, 11, 3, 4, generator=torch.Generator().manual_seed(13))  # T > 9
    logits, weights = model(x, return_weights=True)
    assert logits.shape == (3, 20, 11) and weights.shape == (3, 2, 2, 20, 20)
    h = model.tok_emb(x)
    for layer in model.layers:  # each layer as SDPA with the method's mask / rotation
        split = [lin(h).view(3, 20, 2, 6).transpose(1, 2)
                 for lin in (layer.W_query, layer.W_key, layer.W_value)]
        Q, K, V = split
        if positional == "rope":
            Q, K = apply_rope(Q, torch.arange(20)), apply_rope(K, torch.arange(20))
        if positional == "alibi":
            ctx = F.scaled_dot_product_attention(Q, K, V, attn_mask=alibi_bias(2, 20, Q.dtype))
        else:
            ctx = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
        h = h + layer.out_proj(ctx.transpose(1, 2).reshape(3, 20, 12))
    torch.testing.assert_close(logits, model.unembed(h), atol=1e-10, rtol=0)


def test_rope_scale_is_position_interpolation_and_learned_keeps_its_limit():
    torch.manual_seed(6)
    model = TinyTransformer(11, 9, d_model=12, num_heads=2, positional="rope").double()
    x = torch.tensor([[0, 1, 2, 3, 1, 2, 3, 1]])
    with torch.no_grad():
        plain = model(x)
        model.rope_scale = 2.0  # every angle halved
        scaled = model(x)
    assert not torch.allclose(plain, scaled)
    with pytest.raises(ValueError, match="positional must be one of"):
        TinyTransformer(11, 9, positional="sinusoidal")
    with pytest.raises(ValueError, match="context_length"):
        small_model()(torch.zeros(1, 10, dtype=torch.long))


def test_train_with_a_shorter_sequence_length():
    torch.manual_seed(7)
    model = TinyTransformer(11, 30, d_model=12, num_heads=2, positional="learned")
    before = model.pos_emb.weight.detach().clone()
    train(model, 3, min_period=3, max_period=4, batch_size=4, seq_len=12)
    after = model.pos_emb.weight.detach()
    assert torch.equal(after[12:], before[12:])  # positions 12 .. 29 never trained
    assert not torch.equal(after[:12], before[:12])


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "none"])
def test_run_layers_without_a_patch_is_the_forward_pass(positional):
    model = small_model(seed=5, positional=positional)
    x = repeated_tokens(4, 9, 11, 3, 4, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(run_layers(model, x), expected, atol=1e-12)
    assert torch.allclose(run_layers(model, x, lambda l, name, t: None), expected, atol=1e-12)


def test_run_layers_patches():
    model = small_model(seed=6)
    x = repeated_tokens(4, 9, 11, 3, 4, generator=torch.Generator().manual_seed(6))
    seen = []

    def zero_head(l, name, t):  # a context patch that silences head 2 of layer 1
        seen.append((l, name, tuple(t.shape)))
        if (l, name) == (1, "context"):
            t[:, 2] = 0.0
            return t
        return None

    with torch.no_grad():  # independent: ablate_heads zeroes the head's block of W_o
        assert torch.allclose(run_layers(model, x, zero_head), ablate_heads(model, [(1, 2)])(x), atol=1e-12)
    assert seen[:4] == [(0, "query", (4, 9, 12)), (0, "key", (4, 9, 12)), (0, "value", (4, 9, 12)),
                        (0, "context", (4, 3, 9, 4))]
    # every value zero: each layer adds only its output bias (derived by hand)
    zero_values = run_layers(model, x, lambda l, name, t: torch.zeros_like(t) if name == "value" else None)
    with torch.no_grad():
        stream = model.tok_emb(x) + model.pos_emb.weight + sum(layer.out_proj.bias for layer in model.layers)
        assert torch.allclose(zero_values, model.unembed(stream), atol=1e-12)


def test_run_layers_bad_patches():
    model = small_model(seed=7)
    x = repeated_tokens(2, 9, 11, 3, generator=torch.Generator().manual_seed(7))

    def in_place_only(l, name, t):
        t += 1.0

    with pytest.raises(ValueError, match="changed the 'query' tensor of layer 0 in place but returned None"):
        run_layers(model, x, in_place_only)
    with pytest.raises(ValueError, match=r"shape \(2, 9, 12\) for 'query' of layer 0; got \(9, 12\)"):
        run_layers(model, x, lambda l, name, t: t[0])
    with pytest.raises(TypeError, match="patch must be a function"):
        run_layers(model, x, "key")

"""The course's own helper package: small modules by concept, imported by the notebooks.

- ``shared.attention``: the NumPy reference implementation of attention (01-04).
- ``shared.modules``: PyTorch attention modules, single-head to fused multi-head (02-04).
- ``shared.heads``: ``split_heads``/``merge_heads``, the head layout (04).
- ``shared.positional``: sinusoidal encodings (02), RoPE and ALiBi (07).
- ``shared.explorer``: an interactive temperature/query explorer with a static default (02).
- ``shared.flash`` and ``shared.benchmark``: tiled attention (with its logsumexp for the backward
  pass), devices, timing, memory (05).
- ``shared.tiny_transformer``: a tiny attention-only transformer, head scores, ablation (06).
- ``shared.rope_attention``: multi-head attention with rotary positions (07).
- ``shared.generation``: KV cache, bottom-right masks, grouped-query attention (08).
- ``shared.llama``: a LLaMA/Mistral-style attention layer (RoPE + GQA + KV cache, bias-free
  projections), equal to ``transformers``' ``LlamaAttention`` (08).
- ``shared.pretrained``: all-MiniLM-L6-v2 from scratch on the course's attention (09).
- ``shared.flex``: FlexAttention mask_mods/score_mods, dense masks and tile maps (11).
- ``shared.flash_backward``: FlashAttention's backward pass as an autograd function (recompute P
  from Q, K and the logsumexp), and the bytes autograd keeps (10).
- ``shared.plotting``, ``shared.checks``, ``shared.data``, ``shared.exercises``: pictures, checks,
  reference inputs and the exercise checkers.
"""

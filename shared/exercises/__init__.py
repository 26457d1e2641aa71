"""Checkers for the exercises at the end of each notebook: one module per notebook
(``nb01`` ... ), the shared machinery in ``_core``. Import checkers from here.

Every checker takes the learner's function (or value), runs it on hidden, seeded random cases,
compares with a reference, and prints exactly **one** friendly line:

* ``not attempted yet: ...`` - the stub still returns ``None`` (or raises ``NotImplementedError``);
* ``correct! ...`` - every hidden case matches;
* ``not quite: ...`` - a specific hint for the mistake it recognised (forgot the scaling, softmax
  over the wrong axis, mask applied after softmax without renormalising, future leaked, wrong shape
  with the expected shape named, ...).

It also *returns* a ``CheckResult`` whose ``passed`` is ``True`` (correct), ``False`` (not quite)
or ``None`` (not attempted), so tests and graders can use it (it compares equal to that value and
shows nothing as the last expression of a notebook cell). A checker never raises: an exception in
the learner's code becomes a message. NumPy warnings from the learner's code (overflow, ...) are
silenced while it runs; the checker diagnoses their effect instead.

The exercises, by notebook (the checker names say what they check):

* 01: ``check_invariance_prediction``, ``check_log_softmax``, ``check_cosine_attention``,
  ``check_design_embeddings``, ``check_spot_the_bug``.
* 02: ``check_attend_to_one``, ``check_score_scale``, ``check_init_variance``,
  ``check_shift_matrix``, ``check_recover_permutation``, ``check_attention_bug_fix``.
* 03: ``check_sliding_window_attention``, ``check_window_pairs``, ``check_stacked_reach``,
  ``check_expected_empty_rows``, ``check_causal_bug_fix``, ``check_padded_causal_mask``.
* 04: ``check_bug_prediction``, ``check_fixed_multi_head``, ``check_duplicate_token_head``,
  ``check_attention_parameters``, ``check_gqa_prediction``, ``check_padding_changes``.
* 05: ``check_buggy_timing_prediction``, ``check_timing_plan``, ``check_merge_partials``,
  ``check_training_peak``, ``check_rows_right``, ``check_catching_test``,
  ``check_key_block_fix``, ``check_compute_bound_head_dim``.
* 06: ``check_previous_token_head``, ``check_position_mean_ablation``, ``check_k_composition``,
  ``check_fixed_period_shortcut``, ``check_duplicate_token_bug``.
* 07: ``check_ntk_prediction``, ``check_ntk_base``, ``check_ntk_outcome``,
  ``check_rope_bug_prediction``, ``check_slowed_pair_prediction``, ``check_ranking_prediction``,
  ``check_alibi_factor_prediction``, ``check_catches_bug``, ``check_layout_prediction``,
  ``check_to_half_split``, ``check_alibi_mass_beyond``.
* 08: ``check_llama_step_prediction``, ``check_llama_step_fix``, ``check_ceiling_prediction``,
  ``check_decode_flop_per_byte``, ``check_sink_ring_cache``, ``check_padding_prediction``,
  ``check_left_padding``.
* 09: ``grade_switch_prediction``, ``check_replace_prediction``, ``check_split_qkv``,
  ``check_punctuation_score``, ``check_punctuation_guess``, ``check_punctuation_head``,
  ``check_silenced_heads``, ``check_silencing_prediction``, ``check_random_sets``,
  ``check_carrier_prediction``, ``check_weights_values_split``.
* 10: ``check_temperature_grad``, ``check_bias_grads``, ``check_fixed_backward``,
  ``check_attention_saved_bytes``, ``check_memory_crossover``.
* 11: ``check_chunked_causal``, ``check_window_bug``, ``check_tile_counts``,
  ``check_relative_bias``, ``check_stale_prediction``.

Notebooks 01-03 pass NumPy arrays to the learner's functions (03's module exercise passes a
tensor); the others pass PyTorch tensors. Answers may be either (they are converted for comparison).
Some exercises take values the learner worked out (1.4, 2.1), a prediction (1.1), or a prediction
or a designed input beside the function (1.3, 1.5).
"""

from __future__ import annotations

from ._core import CORRECT, NOT_ATTEMPTED, NOT_QUITE, CheckResult
from .nb01 import *  # noqa: F403
from .nb01 import __all__ as _nb01
from .nb02 import *  # noqa: F403
from .nb02 import __all__ as _nb02
from .nb03 import *  # noqa: F403
from .nb03 import __all__ as _nb03
from .nb04 import *  # noqa: F403
from .nb04 import __all__ as _nb04
from .nb05 import *  # noqa: F403
from .nb05 import __all__ as _nb05
from .nb06 import *  # noqa: F403
from .nb06 import __all__ as _nb06
from .nb07 import *  # noqa: F403
from .nb07 import __all__ as _nb07
from .nb08 import *  # noqa: F403
from .nb08 import __all__ as _nb08
from .nb09 import *  # noqa: F403
from .nb09 import __all__ as _nb09
from .nb10 import *  # noqa: F403
from .nb10 import __all__ as _nb10
from .nb11 import *  # noqa: F403
from .nb11 import __all__ as _nb11

__all__ = ["CheckResult", "CORRECT", "NOT_ATTEMPTED", "NOT_QUITE",
           *_nb01, *_nb02, *_nb03, *_nb04, *_nb05, *_nb06, *_nb07, *_nb08, *_nb09, *_nb10, *_nb11]

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

* 01: ``check_attention_weights_for_query``, ``check_stable_softmax``, ``check_context_vectors``,
  ``check_spot_the_bug``.
* 02: ``check_weight_transfer``, ``check_attention_entropy``, ``check_permutation_equivariance``.
* 03: ``check_causal_mask``, ``check_attention_dropout``, ``check_causal_bug_fix``.
* 04: ``check_cross_attention``, ``check_split_merge_heads``, ``check_parameter_count``,
  ``check_row_entropy``, ``check_attention_patterns``.
* 05: ``check_time_call``, ``check_online_softmax_step``, ``check_score_memory``,
  ``check_block_size``.
* 06: ``check_previous_token_score``, ``check_ablate_head``, ``check_find_induction_head``.

Notebooks 01 and 03 pass NumPy arrays to the learner's functions; 02, 04, 05 and 06 pass PyTorch
tensors. Answers may be either (they are converted for comparison).
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

__all__ = ["CheckResult", "CORRECT", "NOT_ATTEMPTED", "NOT_QUITE",
           *_nb01, *_nb02, *_nb03, *_nb04, *_nb05, *_nb06]

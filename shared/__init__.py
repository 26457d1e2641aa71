"""The course's own helper package: small modules by concept, imported by the notebooks.

- ``shared.attention``: the NumPy reference implementation of attention.
- ``shared.data``: loaders for the reference inputs in ``data/``.
"""

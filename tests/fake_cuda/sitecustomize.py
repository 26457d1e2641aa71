"""Loaded by Python at start-up when this folder is on PYTHONPATH (tests/test_machine_independence.py).

It makes the CPU build of torch look like a CUDA build on a machine without a GPU, as on a laptop
or workstation with a pip-installed (CUDA) torch and the CUDA toolkit, for exactly one thing: while
``torch.utils.cpp_extension`` is first imported (``torch.utils.benchmark`` imports it), torch looks
for the toolkit (``CUDA_HOME``, ``nvcc`` on PATH) and, finding one, logs "No CUDA runtime is found,
using CUDA_HOME=...". Afterwards torch is restored to what it was.

With ``FAKE_MPS=1`` it also makes Apple's MPS backend report itself available, as torch does on a
Mac, so that ``shared.benchmark.pick_device`` would choose it unless ``COURSE_DEVICE`` says otherwise.
"""

import importlib.abc
import importlib.util
import os
import sys

TARGET = "torch.utils.cpp_extension"


class _AsIfCudaBuild(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        import torch

        saved = torch.version.cuda, torch.cuda._is_compiled
        torch.version.cuda = "12.8"
        torch.cuda._is_compiled = lambda: True
        torch._C._cuda_getDeviceCount = lambda: 0  # compiled for CUDA, but no GPU
        try:
            self.inner.exec_module(module)
        finally:
            torch.version.cuda, torch.cuda._is_compiled = saved
            del torch._C._cuda_getDeviceCount


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once, and let the normal finders locate it
        spec = importlib.util.find_spec(name)
        spec.loader = _AsIfCudaBuild(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())


class _MpsFinder(importlib.abc.MetaPathFinder):
    """After ``torch.backends.mps`` is imported, its ``is_available()`` says True."""

    def find_spec(self, name, path, target=None):
        if name != "torch.backends.mps":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        inner = spec.loader

        class _AsIfMac(importlib.abc.Loader):
            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                module.is_available = lambda: True

        spec.loader = _AsIfMac()
        return spec


if os.environ.get("FAKE_MPS") == "1":
    sys.meta_path.insert(0, _MpsFinder())

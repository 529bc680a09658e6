"""Test-only CPU workaround: a stand-in for ``torchvision`` in the SGLang contract environment.

SGLang's config layer imports ``torchvision`` (multimodal processors) but never calls it while
parsing and resolving arguments. The PyPI ``torchvision`` wheel links ``libtorch_cuda`` and fails
on the CPU torch ("operator torchvision::nms does not exist"), so any ``torchvision`` /
``torchvision.*`` import gets an empty module here whose attributes are inert placeholders.
It is on ``PYTHONPATH`` only for the contract tests (tests/contract_sglang/conftest.py) and their
subprocesses; nothing of it ships with precision_plugin.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Placeholder()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __mro_entries__(self, bases):
        return (object,)


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder()


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.28.0"
        module.__getattr__ = _module_getattr
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _TorchvisionStub) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionStub())

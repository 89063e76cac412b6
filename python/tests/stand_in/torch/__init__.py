"""A stand-in for PyTorch in kace's Python tests (no framework installed): only what kace's hook
touches, written as torch 2.15.0 has it (torch/optim/__init__.py deletes its `optimizer`
submodule; the global optimizer and module hooks of torch/optim/optimizer.py and
torch/nn/modules/module.py). test_real_libraries.py checks the same behaviour on the real one."""
__version__ = '2.5.0+fake'
from . import optim, cuda, nn

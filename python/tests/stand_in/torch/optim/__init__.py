from . import optimizer
from .optimizer import Optimizer
del optimizer

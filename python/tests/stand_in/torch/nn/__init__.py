from .modules.module import Module

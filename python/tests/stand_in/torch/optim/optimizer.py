_global_post_hooks = []

def register_optimizer_step_post_hook(hook):
    _global_post_hooks.append(hook)

class Optimizer:
    def step(self):
        for hook in _global_post_hooks:
            hook(self, (), {})

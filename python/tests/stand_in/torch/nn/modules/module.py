_pre, _post = [], []

def register_module_forward_pre_hook(hook):
    _pre.append(hook)

def register_module_forward_hook(hook, *, with_kwargs=False, always_call=False):
    _post.append((hook, always_call))

class Module:
    def __init__(self, *children):
        self.children = children

    def forward(self, x):
        for c in self.children:
            x = c(x)
        return x

    def __call__(self, x):
        for h in _pre:
            h(self, (x,))
        try:
            out = self.forward(x)
        except BaseException:
            for h, always in _post:
                if always:
                    h(self, (x,), None)
            raise
        for h, _ in _post:
            h(self, (x,), out)
        return out

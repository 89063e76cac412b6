class OutOfMemoryError(RuntimeError):
    pass

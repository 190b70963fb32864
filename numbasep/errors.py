"""Exception types raised by numbasep."""


class InvalidArgumentError(ValueError):
    """An argument has a value the operator cannot accept.

    Raised before any kernel runs, with a message that names the argument and
    the offending values. It subclasses :class:`ValueError` so that code written
    against generic Python conventions catches it too.
    """

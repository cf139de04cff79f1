"""User-facing errors. The CLI turns any of these into one line on stderr and exit status 2;
anything else is an internal bug and exits with another status."""


class TightfitError(Exception):
    """A problem with what the user gave us (model, shape, plan, option)."""


class ModelLoadError(TightfitError):
    """The model file is missing, unreadable, not ONNX, or inconsistent."""


class UnsupportedOpsError(TightfitError):
    """The model uses op types tightfit cannot run; lists every one with a node name."""

    def __init__(self, unsupported: dict[str, str], supported: list[str]):
        self.unsupported = dict(unsupported)
        listed = ", ".join(f"{op} (node {node!r})" for op, node in sorted(unsupported.items()))
        super().__init__(
            f"unsupported op types: {listed}; supported: {', '.join(sorted(supported))}"
        )


class InputShapeError(TightfitError):
    """The input shape is dynamic and not given, or the given one does not fit the model."""


class InputDataError(TightfitError):
    """An input's values do not fit the model's input type (floats for an int8 input)."""


class OptionError(TightfitError):
    """A command-line option or API argument is malformed."""


class BudgetError(TightfitError):
    """No plan of the requested kind fits the memory budget; names the smallest reachable.
    `smallest` is that plan where the search found one (searches under a time limit do not
    find the same smallest twice, so a caller that can use it takes it from here)."""

    def __init__(self, message: str, smallest=None):
        super().__init__(message)
        self.smallest = smallest


class TorchMissingError(TightfitError):
    """What the user asked for needs PyTorch (an nn.Module, a torchvision model, the corpus),
    and the install has none: names the extra that adds it."""


class KernelError(TightfitError):
    """A step the kernel library cannot run (an op, activation, rank or dtype it has no kernel
    for, or a layer whose shapes and weights do not agree); the message names the layer."""


class VerificationFailed(Exception):
    """A chosen plan failed the checker or gave other outputs than the reference: an internal
    bug (never a user error, so not a TightfitError); nothing is reported or written."""


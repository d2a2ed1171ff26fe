"""The one exception type that means "the user gave us bad input".

The CLI turns it into a one-line message on stderr and exit code 2, before anything is
written, so every check of user input raises it and nothing else.
"""


class UserInputError(ValueError):
    """Bad configuration, bad command-line value or missing data; the message is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class OutputError(Exception):
    """A file of the output could not be written (a full disk, a read-only file system, an entry of
    the wrong kind in its place): the CLI prints one line naming the file and the error, exit code
    2. Not a :class:`UserInputError`, so that nothing that tolerates bad input swallows it."""

    def __init__(self, path: object, reason: str):
        self.path = path
        super().__init__(" ".join(f"cannot write '{path}': {reason}".split()))

    @classmethod
    def from_os_error(cls, path: object, exc: OSError) -> "OutputError":
        return cls(path, os_error_text(exc))


def os_error_text(exc: OSError) -> str:
    """An OS error in a few words: the system's and the errno's name (``No space left on device
    (ENOSPC)``)."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{exc.strerror or exc}{f' ({name})' if name else ''}"


def check_choice(field: str, value: object, allowed: tuple[str, ...] | list[str]) -> None:
    """Refuse ``value`` unless it is one of ``allowed``: "<field>: 'v' is not allowed; allowed: a, b"."""
    if value not in allowed:
        raise UserInputError(f"{field}: '{value}' is not allowed; allowed: {', '.join(allowed)}")

"""The one exception type that means "the user gave us bad input".

The CLI turns it into a one-line message on stderr and exit code 2, before anything is
written, so every check of user input raises it and nothing else.
"""


class UserInputError(ValueError):
    """Bad configuration, bad command-line value or missing data; the message is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def check_choice(field: str, value: object, allowed: tuple[str, ...] | list[str]) -> None:
    """Refuse ``value`` unless it is one of ``allowed``: "<field>: 'v' is not allowed; allowed: a, b"."""
    if value not in allowed:
        raise UserInputError(f"{field}: '{value}' is not allowed; allowed: {', '.join(allowed)}")

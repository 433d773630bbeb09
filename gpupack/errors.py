"""The one error type for bad contract values: it names the key, the value and the accepted form."""


class ContractError(ValueError):
    """A label, annotation or quantity that does not parse.

    The message is meant for a person reading `kubectl` output: it names what was
    wrong and what would have been accepted.
    """

    def __init__(self, key: str, value: object, accepted: str, why: str = "") -> None:
        self.key = key
        self.value = value
        self.accepted = accepted
        self.why = why
        detail = f" ({why})" if why else ""
        super().__init__(f"{key}: invalid value {value!r}{detail}; accepted: {accepted}")

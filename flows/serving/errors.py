"""What opening and asking an index can refuse, each with a message that says what to do (no imports: the checks
of every command can name them)."""


class IndexNotBuilt(LookupError):
    """The index these settings name is not in the store; the message is the command that builds it."""


class NoLLM(RuntimeError):
    """``answer`` was asked of an index opened without an LLM."""

"""C++ CPU kernel providers for the built-in cpu platform."""


def default_priority() -> dict[str, list[str]]:
    return {}

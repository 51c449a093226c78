"""Deliberately broken platform plugins, one entry point per fault the harness claims to catch.

Each fixture is a module `conformance_broken.<fixture>` defining `Platform` (an OOT platform whose
`import_ir_kernels()` imports the module's faulty kernels) and its record `EXPECTED` (`records.py`). The
entry point `broken_<fixture>` names `register_<fixture>`, made here on first access for every module that
has a record, and returning its platform's qualified name. tests/plugins/README.md lists the fixtures and
how to add one.
"""

from conformance_broken.records import fixtures as _fixtures


def _register(fixture: str):
    def register() -> str:
        return f"conformance_broken.{fixture}.Platform"

    register.__name__ = register.__qualname__ = f"register_{fixture}"
    return register


def __getattr__(name: str):
    fixture = name.removeprefix("register_")
    if fixture != name and fixture in _fixtures():
        globals()[name] = register = _register(fixture)
        return register
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_absent():
    """A plugin whose device is absent: register() returns None."""
    return None

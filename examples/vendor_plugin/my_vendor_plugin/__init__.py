"""Entry points of the plugin: `register()` names the platform class, `register_layers()` adds layers."""


def register() -> str | None:
    """Return the platform class's qualified name, or None when your device is absent."""
    return "my_vendor_plugin.platform.MyVendorPlatform"


def register_layers() -> None:
    """Register CustomOp replacements (runs when the platform is activated)."""
    import my_vendor_plugin.layers  # noqa: F401

"""Built-in themes, as data (see the .toml files beside this module)."""

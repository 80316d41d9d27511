"""draftlight: the application (CLI, config, storage, the Textual UI)."""

__version__ = "0.1.0"

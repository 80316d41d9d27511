"""Where draftlight keeps things (platformdirs; XDG variables honoured on Linux)."""

from __future__ import annotations

from pathlib import Path

import platformdirs

APP = "draftlight"


def data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP, appauthor=False))


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP, appauthor=False))


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP, appauthor=False))


def models_dir() -> Path:
    return data_dir() / "models"


def config_file() -> Path:
    return config_dir() / "config.toml"


def history_db() -> Path:
    return data_dir() / "history.sqlite3"


def lookup_dir() -> Path:
    return data_dir() / "lookup"


def user_themes_dir() -> Path:
    return config_dir() / "themes"

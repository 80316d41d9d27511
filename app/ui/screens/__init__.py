"""The screens, one per module: the small dialogs (:mod:`.confirm`, :mod:`.text_prompt`), the keys
(:mod:`.help`), the saved chats (:mod:`.chats`), the settings pane (:mod:`.settings`, its rows
in :mod:`.field_row`) and the served requests (:mod:`.server`).

A screen shows what it is given and answers by dismissing or posting a message; none of them
touches the session, the store or the engine. What the settings pane computes (its fields, how
values are read and checked, which types are usable) lives outside Textual, in
:mod:`app.settings_form` and :mod:`app.model_files`.
"""

from __future__ import annotations

from ...settings_form import SettingsResult
from .chats import ChatsResult, ChatsScreen, chat_labels
from .confirm import ConfirmScreen
from .field_row import FieldRow
from .help import HelpScreen
from .server import ServerScreen
from .settings import SettingsScreen
from .text_prompt import TextPromptScreen

__all__ = ["ChatsResult", "ChatsScreen", "ConfirmScreen", "FieldRow", "HelpScreen", "SettingsResult",
           "ServerScreen", "SettingsScreen", "TextPromptScreen", "chat_labels"]

"""What the person can do: every action's key, label and help line, and the starter requests.

No Textual: the app derives its key bindings, its key bar, its help screen and its command
palette from :data:`ACTIONS` (see :mod:`app.ui.commands`); the welcome screen lists
:data:`STARTERS`. May touch: nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActionSpec:
    """One user action: its binding, its footer label, its help line; also a palette command."""

    action: str
    keys: str
    label: str
    help: str
    group: str
    show: bool = False
    priority: bool = False
    #: how the keyboard reaches an action without a key of its own (no binding then)
    reach: str = ""
    #: the key bar's label, where ``label`` is too long for it (the bar shows Esc's Stop at all
    #: times, dimmed between replies, and must fit 80 columns)
    bar: str = ""

    @property
    def key_display(self) -> str:
        """The first key as the help shows it (or how the keyboard reaches the action)."""
        if not self.keys:
            return self.reach
        first = self.keys.split(",")[0]
        return "+".join(p.capitalize() if len(p) > 1 else p.upper() for p in first.split("+")) \
            .replace("Ctrl+", "Ctrl+").replace("Escape", "Esc")


@dataclass(frozen=True)
class Starter:
    """A request on the welcome screen that shows speculation at work: the reply copies text from
    the request, so the drafters (which draft from what the context already holds) are right."""

    text: str      # sent as the person's message
    copied: str    # the part of it the reply repeats (tests/test_starters.py checks it does)


#: chosen by measuring them on the default model at the chat's default settings (each through
#: the real session, several seeds: tests/test_starters.py, where the rates are)
STARTERS: tuple[Starter, ...] = (
    Starter("Copy this shopping list exactly: milk, eggs, bread, butter, cheese, apples, rice, tea.",
            "milk, eggs, bread, butter, cheese, apples, rice, tea."),
    Starter("Repeat this exactly: one, two, three, four, five, six, seven, eight, nine, ten.",
            "one, two, three, four, five, six, seven, eight, nine, ten."),
    Starter("Repeat this address: 14 Harbour Street, Flat 3, Leith, Edinburgh EH6 6JJ.",
            "14 Harbour Street, Flat 3, Leith, Edinburgh EH6 6JJ."),
    Starter("Repeat this list exactly: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.",
            "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday."),
)

ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("help", "f1", "Help", "Show every key and what it does", "App", show=True),
    ActionSpec("chats", "f2", "Chats", "Saved chats: resume, rename, delete, export", "Chats", show=True),
    ActionSpec("settings", "f3", "Settings", "Speculation, sampling and model settings", "Settings", show=True),
    ActionSpec("toggle_stats", "f4", "Stats", "Show or hide the statistics panel", "View", show=True),
    ActionSpec("toggle_colour", "f5", "Colour", "Colour drafted tokens on or off", "View", show=True),
    ActionSpec("toggle_off_view", "f6", "Markdown/plain",
               "Show replies as Markdown or as plain text (colouring stays as F5 sets it)", "View"),
    ActionSpec("system_prompt", "f7", "System prompt",
               "Edit the system prompt: this chat's, and the default for new chats", "Chat"),
    ActionSpec("lab", "f8", "Lab", "Which speculation pays on this prompt: configurations side by side, "
               "on the loaded model", "View"),
    ActionSpec("server", "f9", "Server",
               "Serve the model over HTTP (OpenAI's API, 127.0.0.1) and watch the requests as they come: "
               "Ctrl+T there starts or stops serving (never at launch by itself), Ctrl+L takes one to the Lab",
               "View"),
    ActionSpec("stop", "escape", "Stop", "Stop the reply at once (keeps what was written)", "Chat", show=True),
    ActionSpec("regenerate", "ctrl+r", "Regenerate", "Write the last reply again", "Chat", show=True,
               bar="Retry"),
    ActionSpec("edit_last", "ctrl+g", "Edit last", "Edit your last message and send it again", "Chat"),
    ActionSpec("copy_reply", "ctrl+o", "Copy reply", "Copy the last reply to the clipboard",
               "Chat"),
    ActionSpec("new_chat", "ctrl+n", "New chat", "Start a new chat", "Chats"),
    ActionSpec("export", "ctrl+s", "Export", "Export this chat to a Markdown file", "Chats"),
    ActionSpec("quit", "ctrl+q", "Quit", "Quit draftlight", "App", priority=True),
) + tuple(ActionSpec(f"starter({i})", "", f"Starter {i}",
                     f"Send “{st.text}” (while the chat is empty)", "Chat",
                     reach="Down, Enter" if i == 1 else f"Down ×{i}, Enter")
          for i, st in enumerate(STARTERS, 1))
# (the starters have no key of their own: Down from the empty prompt of an empty chat moves into
# the welcome screen's list of them, in any terminal; Alt+digit, their keys before, is no key in a
# terminal: xterm and tmux send ESC and the digit, which Textual reads as a typed "™")

#: keys that are not app actions, for the help screen
EXTRA_KEYS: tuple[tuple[str, str, str], ...] = (
    ("Prompt", "Enter", "Send the message"),
    ("Prompt", "Shift+Enter, Ctrl+J", "New line (Ctrl+J works in any terminal)"),
    ("Prompt", "Up / Down", "Previous messages (when the prompt is empty)"),
    ("Prompt", "Down", "In an empty chat, past the previous messages: into the starter requests "
     "(Enter sends one; Esc, Up past the first, or typing goes back to the prompt)"),
    ("Messages", "Tab / Shift+Tab", "Move between the prompt and the messages"),
    ("Messages", "c", "Copy the focused message"),
    ("Messages", "Left/Right, [ / ]", "Select drafted runs: who drafted them"),
    ("App", "Ctrl+P", "Command palette (every action, and themes)"),
)

#: actions that work only on the chat screen itself (not over dialogs)
MAIN_ONLY = {a.action.partition("(")[0] for a in ACTIONS} - {"quit", "help"}

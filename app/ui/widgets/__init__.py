"""The chat app's widgets, one per module: messages with coloured draft runs, the prompt, bars, panels.

Each widget is given its data and posts messages; none names the app or the session. The text
helpers they use without Textual are :mod:`app.ui.wrapping` and :mod:`app.ui.alignment`.

==================  ===========================================================================
module              holds
==================  ===========================================================================
``reply_body``      :class:`ReplyBody` (a message's text, drafted tokens coloured), :class:`Run`,
                    :class:`ProvenanceHover`
``message_view``    :class:`MessageView`: who wrote a message, its text, its figures
``markdown_colour`` :func:`colour_markdown`: the colours kept in the Markdown view
``prompt_input``    :class:`PromptInput`: the prompt
``starter_list``    :class:`StarterList`: the welcome screen's starter requests
``keyboard``        handing the keyboard between widgets without losing keys typed ahead
``key_bar``         :class:`KeyBar`: the footer of keys
``one_line``        :class:`OneLine`: a bar that repaints only on change
``top_bar``         :class:`TopBar`: model, speculation and state
``legend``          :class:`Legend`: the speculators' colours
``stats_panel``     :class:`StatsPanel`: F4's statistics
``load_panel``      :class:`LoadPanel`: loading the model, or picking another
==================  ===========================================================================
"""

from __future__ import annotations

from ..alignment import align_offsets
from ..wrapping import wrap_lines
from .key_bar import KeyBar
from .keyboard import forward_key, hand_keys_to, typed_ahead
from .legend import Legend, short_name
from .load_panel import LoadPanel
from .markdown_colour import colour_markdown
from .message_view import MessageView
from .one_line import OneLine
from .prompt_input import PromptInput
from .reply_body import ProvenanceHover, ReplyBody, Run
from .starter_list import StarterList
from .stats_panel import STATS_TERMS, StatsPanel
from .top_bar import TopBar

__all__ = [
    "KeyBar", "Legend", "LoadPanel", "MessageView", "OneLine", "PromptInput", "ProvenanceHover", "ReplyBody",
    "Run", "STATS_TERMS", "StarterList", "StatsPanel", "TopBar", "align_offsets", "colour_markdown",
    "forward_key", "hand_keys_to", "short_name", "typed_ahead", "wrap_lines",
]

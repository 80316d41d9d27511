"""The Textual chat app. The only place (with app/cmd_chat.py) that imports Textual.

Data flows one way::

    UI (DraftlightApp) --GenerationRequest--> worker thread (worker.py)
        --> Engine.generate --> StepEvent/StatsEvent/FinishEvent
        --> messages (messages.py), coalesced --> UI widgets (widgets.py)
"""

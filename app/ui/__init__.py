"""The Textual chat app. The only place (with app/cmd_chat.py) that imports Textual.

Data flows one way::

    UI (DraftlightApp) --send--> ChatSession (app/session/) --thread--> Engine.generate
        --> TokenEvents appended to the reply's Turn, ReplyProgress/ReplyDone events
        --> SessionMessage (post_message) --> session.apply(event) --> widgets (app/ui/widgets/)
"""

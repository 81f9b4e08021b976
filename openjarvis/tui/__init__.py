"""The terminal UI (issue 6): a Textual app that is a client of the daemon, nothing more.

``make_app(config)`` in ``openjarvis.tui.app`` builds it; ``jarvis`` (or ``jarvis tui``) runs it.
Textual is imported only when the TUI starts, so the rest of the CLI stays quick.
"""

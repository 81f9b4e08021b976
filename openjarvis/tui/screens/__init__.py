"""The TUI's screens besides the main one: diff review, conversation history."""

"""The assistant: conversations, budgeted prompt assembly, and edits applied as reviewed diffs."""

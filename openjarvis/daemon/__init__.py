"""The long-lived daemon: one per user, serving every client over one local Unix socket."""

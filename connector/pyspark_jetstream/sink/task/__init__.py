"""One task's write: its stages run in order, what the server refused settled, the commit message made."""

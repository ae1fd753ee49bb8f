"""What the app keeps on disk: the chat history (SQLite, versioned), its background saver, and small state."""

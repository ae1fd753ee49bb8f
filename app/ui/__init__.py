"""The Textual chat: the app, its widgets and screens, and the reply and chat bookkeeping."""

"""Modal screens: help, profile picker, chat history, text prompts."""

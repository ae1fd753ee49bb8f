"""From chat messages to token ids and back: the chat template, detokenizing, stop strings, and the ChatEngine that owns a conversation's decoder. Depends on decode."""

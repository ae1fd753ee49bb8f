"""The bench: ``specchat bench`` runs every method on the same prompts, side by side."""

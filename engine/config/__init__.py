"""Profiles: what `models.toml` (shipped and the user's) says, checked and typed. Depends on nothing but the engine's boundary modules."""

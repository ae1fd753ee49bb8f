"""Loading a profile: from a ModelProfile to a running ChatEngine (or a server backend), and whether a profile can run here at all. Depends on chat, fetch, model, remote."""

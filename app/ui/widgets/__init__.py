"""The app's widgets: prompt box, chat transcript, HUD."""
